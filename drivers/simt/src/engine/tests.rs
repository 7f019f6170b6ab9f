//! The engine's fast paths are exact: [`run`] and [`run_stepwise`] (every step back
//! through the search for the earliest unit, every wait through the wake calendar)
//! agree on every counter, cycle and stored word; so do the engine compiled for the
//! default scheduler and the one that calls schedulers through their trait object.

use super::{run, run_stepwise, Device, Launch, RunStats, SimtError, SpareWakes};
use crate::dispatch::{
    Affinity, Dispatch, Greedy, Gto, LooseRoundRobin, RoundRobin, WarpScheduler,
};
use crate::kernel::{Kernel, Op, WarpIo, WarpProgram, LOAD_REGS};
use crate::machine::{mesc_tlbs, GpuKind, SimtMachine};
use crate::occupancy::{KernelResources, OccupancyModel, SmConfig};
use gmem_sim::MmuStats;

/// A xorshift step.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Warps of random programs over `words` 32-bit words at `base`: compute, blocking
/// loads, stores (of the thread's number) and non-blocking loads with their waits,
/// coalesced or a page per lane, some lanes masked off.
struct Random {
    seed: u64,
    blocks: u64,
    tpb: u32,
    base: u64,
    words: u64,
    /// Instructions per warp at most.
    len: u32,
}

struct RandomWarp {
    x: u64,
    first: u64,
    base: u64,
    words: u64,
    left: u32,
    /// Registers loaded since the last wait.
    loaded: u8,
}

impl Kernel for Random {
    type Warp = RandomWarp;
    fn blocks(&self) -> u64 {
        self.blocks
    }
    fn resources(&self) -> KernelResources {
        KernelResources {
            threads_per_block: self.tpb,
            registers_per_thread: 32,
            shared_bytes_per_block: 0,
        }
    }
    fn warp(&self, block: u64, warp: u32) -> RandomWarp {
        let mut x = self.seed ^ (block << 20) ^ u64::from(warp) ^ 0x9E37_79B9_7F4A_7C15;
        next(&mut x);
        RandomWarp {
            left: 1 + (next(&mut x) % u64::from(self.len)) as u32,
            x,
            first: block * u64::from(self.tpb) + u64::from(warp) * 32,
            base: self.base,
            words: self.words,
            loaded: 0,
        }
    }
}

impl WarpProgram for RandomWarp {
    fn next(&mut self, io: &mut WarpIo) -> Op {
        if self.left == 0 {
            if self.loaded > 0 {
                self.loaded = 0;
                return Op::Wait;
            }
            return Op::Exit;
        }
        self.left -= 1;
        let r = next(&mut self.x);
        let kind = r % 8;
        if kind < 2 {
            return Op::Compute((r >> 8) as u32 % 40);
        }
        if kind == 2 && self.loaded > 0 {
            self.loaded = 0;
            return Op::Wait;
        }
        // A start word, and a stride of 1 word (coalesced) or of a page (a page per
        // lane); lanes above a random count sit out.
        let (start, stride) = (r >> 16, if (r >> 8) % 4 == 0 { 1024 } else { 1 });
        let active = 1 + (r >> 40) % 32;
        let (base, words) = (self.base, self.words);
        io.lanes(|l| {
            ((l as u64) < active).then_some(base + 4 * ((start + l as u64 * stride) % words))
        });
        match kind {
            3 | 4 => {
                for l in 0..32 {
                    io.value[l] = (self.first + l as u64) as u32;
                }
                Op::Store
            }
            5 if usize::from(self.loaded) < LOAD_REGS => {
                self.loaded += 1;
                Op::LoadTo(self.loaded - 1)
            }
            _ => Op::Load,
        }
    }
}

/// A loose round-robin scheduler that does not say it is one: the engine runs it
/// through its trait object, as any other scheduler.
struct Hidden(LooseRoundRobin);

impl WarpScheduler for Hidden {
    fn pick(&mut self, ready_at: &[u64], age: &[u64], now: u64) -> Option<usize> {
        self.0.pick(ready_at, age, now)
    }
    fn pick_ready(&mut self, ready: u64, ready_at: &[u64], age: &[u64], now: u64) -> Option<usize> {
        self.0.pick_ready(ready, ready_at, age, now)
    }
}

/// How [`launches`] runs the engine.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// [`run`].
    Fast,
    /// [`run_stepwise`].
    Stepwise,
    /// [`run`], with a loose round-robin scheduler hidden behind [`Hidden`].
    Hidden,
}

/// One configuration's launches on a fresh machine, run as `mode` says: each launch's
/// statistics, the MMU's counters and the data words at the end.
#[allow(clippy::type_complexity)]
fn launches(case: u64, mode: Mode) -> (Vec<Result<RunStats, SimtError>>, MmuStats, Vec<u32>) {
    let mut x = 0x2545_F491_4F6C_DD1D ^ case.wrapping_mul(0x9E37_79B9);
    next(&mut x);
    let units = [1usize, 3, 4, 16][(next(&mut x) % 4) as usize];
    let gpu = if next(&mut x) % 3 == 0 {
        GpuKind::Discrete { pages: 1024 }
    } else {
        GpuKind::Integrated
    };
    let mut m = SimtMachine::new(4096, gpu, mesc_tlbs(units)).expect("machine");
    m.cost.timed_walks = next(&mut x) % 2 == 0;
    m.cost.walkers = 1 + next(&mut x) % 8;
    let words = 64 * 1024;
    let data = m.upload(&vec![7; words as usize]).expect("upload");
    let kernel = Random {
        seed: next(&mut x),
        blocks: 1 + next(&mut x) % 40,
        tpb: [32, 64, 96, 256, 1024][(next(&mut x) % 5) as usize],
        base: data.start.as_u64(),
        words,
        len: 1 + (next(&mut x) % 60) as u32,
    };
    let gto = next(&mut x) % 3 == 0;
    let scheduler = move || -> Box<dyn WarpScheduler> {
        if gto {
            Box::new(Gto::default())
        } else if mode == Mode::Hidden {
            Box::new(Hidden(LooseRoundRobin::default()))
        } else {
            Box::new(LooseRoundRobin::default())
        }
    };
    let pick = next(&mut x) % 3;
    // Some units with four times the threads and registers: up to 128 warp slots, more
    // than the ready mask's 64 (the engine's unmasked version).
    let big = SmConfig {
        max_threads: 4 * 2048,
        registers: 4 * 65_536,
        ..SmConfig::maxwell()
    };
    let occupancy: &dyn OccupancyModel = if next(&mut x) % 3 == 0 {
        &big
    } else {
        &*m.occupancy
    };
    let (mut spare_io, mut spare_wakes) = (Vec::new(), SpareWakes::default());
    let mut stats = Vec::new();
    for _ in 0..2 {
        let mut greedy = Greedy;
        let mut rr = RoundRobin::default();
        let mut aff = Affinity::new(|b| (b % 3 == 0).then_some(b as usize * 7));
        let dispatch: &mut dyn Dispatch = match pick {
            0 => &mut greedy,
            1 => &mut rr,
            _ => &mut aff,
        };
        let dev = Device {
            gm: m.gm(),
            port: m.port(),
        };
        let launch = Launch {
            occupancy,
            dispatch,
            scheduler: &scheduler,
            cost: &m.cost,
            page_shift: 12,
            observer: None,
            spare_io: &mut spare_io,
            spare_wakes: &mut spare_wakes,
        };
        stats.push(if mode == Mode::Stepwise {
            run_stepwise(dev, &kernel, launch)
        } else {
            run(dev, &kernel, launch)
        });
    }
    let words = m.download(data, words as usize).expect("download");
    (stats, m.gpu_mmu(), words)
}

/// Twelve random kernels on random machines (1 to 16 units, integrated or discrete,
/// timed walks or not, both warp schedulers, three dispatch policies, up to 64 or up
/// to 128 warp slots per unit), each launched
/// twice: the fast paths (burst runs, warps due by the next clock kept in the ready
/// mask) give the stepwise statistics (every counter and the cycles), MMU
/// counters and memory; and the engine compiled for loose round-robin gives what it
/// gives with that scheduler behind a trait object.
#[test]
fn burst_runs_equal_stepwise_runs() {
    let (mut instructions, mut unmasked) = (0, 0);
    for case in 0..12 {
        let burst = launches(case, Mode::Fast);
        let stepwise = launches(case, Mode::Stepwise);
        let hidden = launches(case, Mode::Hidden);
        assert_eq!(
            burst.0, hidden.0,
            "case {case}: statistics, scheduler by value"
        );
        assert_eq!(
            burst.1, hidden.1,
            "case {case}: MMU counters, scheduler by value"
        );
        assert!(
            burst.2 == hidden.2,
            "case {case}: memory, scheduler by value"
        );
        assert_eq!(burst.0, stepwise.0, "case {case}: statistics");
        assert_eq!(burst.1, stepwise.1, "case {case}: MMU counters");
        assert!(burst.2 == stepwise.2, "case {case}: memory");
        for s in burst.0.iter().flatten() {
            instructions += s.memory_instructions;
            unmasked += u32::from(s.warps_per_unit > 64);
        }
    }
    // The kernels ran (a test of nothing would pass too).
    assert!(instructions > 10_000, "{instructions} memory instructions");
    assert!(
        unmasked > 0,
        "no launch had more than 64 warp slots per unit"
    );
}
