//! Scoreboarding: a warp issues past its non-blocking loads and stalls at their first
//! use; values stay exact untimed and timed; misuse of the registers is a typed error.

use gmem_simt::engine::{RunStats, SimtError};
use gmem_simt::kernel::{Kernel, Op, WarpIo, WarpProgram, LOAD_REGS};
use gmem_simt::machine::{mesc_tlbs, GpuKind, SimtMachine};
use gmem_simt::occupancy::KernelResources;

/// How a [`Sum`] warp loads its `loads` words.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Style {
    /// One [`Op::Load`] after another, each waited for.
    Blocking,
    /// All as [`Op::LoadTo`], then one [`Op::Wait`].
    Scoreboard,
    /// [`Op::LoadTo`] twice into register 0 (an error).
    Reuse,
    /// [`Op::LoadTo`] and exit without waiting (an error).
    NoWait,
    /// [`Op::LoadTo`] into a register past [`LOAD_REGS`] (an error).
    OutOfRange,
}

/// Thread `t` sums `src[j·stride + t]` for `j < loads` (each load a different page when
/// `stride` is a page's words) and stores the sum at `dst + 4t`.
#[derive(Clone, Copy)]
struct Sum {
    n: u64,
    src: u64,
    dst: u64,
    stride: u64,
    loads: usize,
    style: Style,
}

struct SumWarp {
    first: u64,
    k: Sum,
    step: usize,
    acc: [u32; 32],
}

impl Kernel for Sum {
    type Warp = SumWarp;
    fn blocks(&self) -> u64 {
        self.n.div_ceil(64)
    }
    fn resources(&self) -> KernelResources {
        KernelResources {
            threads_per_block: 64,
            registers_per_thread: 32,
            shared_bytes_per_block: 0,
        }
    }
    fn warp(&self, block: u64, warp: u32) -> SumWarp {
        SumWarp {
            first: block * 64 + u64::from(warp) * 32,
            k: *self,
            step: 0,
            acc: [0; 32],
        }
    }
}

impl SumWarp {
    fn lanes(&self, io: &mut WarpIo, j: usize) -> bool {
        let (first, n, src, stride) = (self.first, self.k.n, self.k.src, self.k.stride);
        io.lanes(|l| {
            let t = first + l as u64;
            (t < n).then_some(src + 4 * (j as u64 * stride + t))
        })
    }
}

impl WarpProgram for SumWarp {
    fn next(&mut self, io: &mut WarpIo) -> Op {
        let s = self.step;
        self.step += 1;
        let loads = self.k.loads;
        match self.k.style {
            Style::Blocking => {
                if s > 0 && s <= loads {
                    for l in 0..32 {
                        if io.active(l) {
                            self.acc[l] = self.acc[l].wrapping_add(io.value[l]);
                        }
                    }
                }
                if s < loads {
                    if !self.lanes(io, s) {
                        return Op::Exit;
                    }
                    return Op::Load;
                }
            }
            Style::Scoreboard => {
                if s < loads {
                    if !self.lanes(io, s) {
                        return Op::Exit;
                    }
                    return Op::LoadTo(s as u8);
                }
                if s == loads {
                    return Op::Wait;
                }
                if s == loads + 1 {
                    for l in 0..32 {
                        for r in 0..loads {
                            self.acc[l] = self.acc[l].wrapping_add(io.regs[r][l]);
                        }
                    }
                }
            }
            Style::Reuse | Style::NoWait | Style::OutOfRange => {
                if s == 0 || (s == 1 && self.k.style == Style::Reuse) {
                    self.lanes(io, 0);
                    let r = if self.k.style == Style::OutOfRange {
                        LOAD_REGS as u8
                    } else {
                        0
                    };
                    return Op::LoadTo(r);
                }
                return Op::Exit;
            }
        }
        let store_at = if self.k.style == Style::Blocking {
            loads
        } else {
            loads + 1
        };
        if s == store_at {
            let (first, n, dst) = (self.first, self.k.n, self.k.dst);
            io.lanes(|l| {
                let t = first + l as u64;
                (t < n).then_some(dst + 4 * t)
            });
            io.value = self.acc;
            return Op::Store;
        }
        Op::Exit
    }
}

const N: u64 = 256;
const STRIDE: u64 = 1024;
const LOADS: usize = 8;

fn run(style: Style, timed: bool) -> Result<(RunStats, Vec<u32>, Vec<u32>), SimtError> {
    let mut m = SimtMachine::new(4096, GpuKind::Integrated, mesc_tlbs(4)).unwrap();
    m.cost.timed_walks = timed;
    let words = (LOADS as u64 - 1) * STRIDE + N;
    let data: Vec<u32> = (0..words as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let src = m.upload(&data).unwrap();
    let dst = m.upload(&vec![0; N as usize]).unwrap();
    let s = m.launch(&Sum {
        n: N,
        src: src.start.as_u64(),
        dst: dst.start.as_u64(),
        stride: STRIDE,
        loads: LOADS,
        style,
    })?;
    let want = (0..N)
        .map(|t| {
            (0..LOADS as u64).fold(0u32, |a, j| a.wrapping_add(data[(j * STRIDE + t) as usize]))
        })
        .collect();
    Ok((s, m.download(dst, N as usize).unwrap(), want))
}

#[test]
fn independent_loads_overlap_and_values_stay_exact() {
    for timed in [false, true] {
        let (b, got_b, want) = run(Style::Blocking, timed).unwrap();
        let (s, got_s, _) = run(Style::Scoreboard, timed).unwrap();
        assert_eq!(got_b, want, "blocking, timed {timed}");
        assert_eq!(got_s, want, "scoreboard, timed {timed}");
        // The same memory instructions and translations...
        assert_eq!(b.memory_instructions, s.memory_instructions);
        assert_eq!(b.translations, s.translations);
        // ...but a warp's 8 loads wait together instead of one after another.
        assert!(
            s.cycles * 2 < b.cycles,
            "timed {timed}: scoreboard {} vs blocking {} cycles",
            s.cycles,
            b.cycles
        );
    }
}

#[test]
fn scoreboarded_runs_are_deterministic() {
    let a = run(Style::Scoreboard, true).unwrap().0;
    let b = run(Style::Scoreboard, true).unwrap().0;
    assert_eq!(a, b);
}

#[test]
fn register_misuse_is_a_typed_error() {
    assert!(matches!(
        run(Style::Reuse, false),
        Err(SimtError::Register { reg: Some(0), .. })
    ));
    assert!(matches!(
        run(Style::NoWait, true),
        Err(SimtError::Register { reg: None, .. })
    ));
    assert!(matches!(
        run(Style::OutOfRange, false),
        Err(SimtError::Register { reg: Some(r), .. }) if usize::from(r) == LOAD_REGS
    ));
}
