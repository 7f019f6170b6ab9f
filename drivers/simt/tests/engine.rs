//! Engine behaviour: dispatch policies place blocks where they say, occupancy bounds the
//! resident warps, divergence masks lanes, errors are typed.

use gmem_sim::Served;
use gmem_simt::dispatch::{Affinity, Greedy, LooseRoundRobin, WarpScheduler};
use gmem_simt::engine::{AccessObserver, SimtError};
use gmem_simt::kernel::{Kernel, Op, WarpIo, WarpProgram};
use gmem_simt::machine::{mesc_tlbs, GpuKind, SimtMachine};
use gmem_simt::occupancy::KernelResources;

/// Each thread `t < n` stores `t` at `base + 4t` when `t` is even (odd lanes diverge
/// away), then exits.
struct Evens {
    n: u64,
    base: u64,
    tpb: u32,
    regs: u32,
}

struct EvensWarp {
    first: u64,
    n: u64,
    base: u64,
    done: bool,
}

impl Kernel for Evens {
    type Warp = EvensWarp;
    fn blocks(&self) -> u64 {
        self.n.div_ceil(u64::from(self.tpb))
    }
    fn resources(&self) -> KernelResources {
        KernelResources {
            threads_per_block: self.tpb,
            registers_per_thread: self.regs,
            shared_bytes_per_block: 0,
        }
    }
    fn warp(&self, block: u64, warp: u32) -> EvensWarp {
        EvensWarp {
            first: block * u64::from(self.tpb) + u64::from(warp) * 32,
            n: self.n,
            base: self.base,
            done: false,
        }
    }
}

impl WarpProgram for EvensWarp {
    fn next(&mut self, io: &mut WarpIo) -> Op {
        if self.done {
            return Op::Exit;
        }
        self.done = true;
        let (first, n, base) = (self.first, self.n, self.base);
        if !io.lanes(|l| {
            let t = first + l as u64;
            (t < n && t % 2 == 0).then_some(base + 4 * t)
        }) {
            return Op::Exit;
        }
        for l in 0..32 {
            io.value[l] = (first + l as u64) as u32;
        }
        Op::Store
    }
}

fn machine() -> SimtMachine {
    SimtMachine::new(4096, GpuKind::Integrated, mesc_tlbs(4)).unwrap()
}

fn lrr() -> Box<dyn WarpScheduler> {
    Box::new(LooseRoundRobin::default())
}

#[test]
fn divergent_lanes_sit_out_and_every_thread_runs_once() {
    let m = machine();
    let n = 5000u64;
    let r = m.upload(&vec![u32::MAX; n as usize]).unwrap();
    let k = Evens {
        n,
        base: r.start.as_u64(),
        tpb: 128,
        regs: 32,
    };
    let s = m.launch(&k).unwrap();
    assert_eq!(s.blocks, n.div_ceil(128));
    assert_eq!(s.warps, s.blocks * 4);
    // Even threads wrote their index; odd lanes were masked off.
    let got = m.download(r, n as usize).unwrap();
    for (t, &v) in got.iter().enumerate() {
        assert_eq!(
            v,
            if t % 2 == 0 { t as u32 } else { u32::MAX },
            "thread {t}"
        );
    }
    // 32 lanes of 4 bytes = 128 bytes = one transaction per store, half the lanes used.
    assert_eq!(s.transactions, s.memory_instructions);
    // Occupancy: 128 threads, 32 registers: 16 blocks of 4 warps (Maxwell).
    assert_eq!(s.warps_per_unit, 64);
    let fewer = m
        .launch(&Evens {
            n,
            base: r.start.as_u64(),
            tpb: 128,
            regs: 128,
        })
        .unwrap();
    assert_eq!(fewer.warps_per_unit, 16);
}

#[test]
fn affinity_pins_blocks_and_greedy_fills_the_first_unit() {
    let m = machine();
    let n = 4096u64;
    let r = m.upload(&vec![0; n as usize]).unwrap();
    let k = Evens {
        n,
        base: r.start.as_u64(),
        tpb: 256,
        regs: 32,
    };
    let before: Vec<u64> = (0..4)
        .map(|u| m.l1_stats(u).unwrap().misses + m.l1_stats(u).unwrap().hits)
        .collect();
    // Every block on unit 2.
    m.launch_with(&k, &mut Affinity::new(|_| Some(2)), &lrr)
        .unwrap();
    let after: Vec<u64> = (0..4)
        .map(|u| m.l1_stats(u).unwrap().misses + m.l1_stats(u).unwrap().hits)
        .collect();
    let used: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(
        used[2] > 0 && used[0] == 0 && used[1] == 0 && used[3] == 0,
        "{used:?}"
    );
    // Greedy: 16 blocks of 8 warps fit 8 per unit, so units 0 and 1 take them all.
    let s = m.launch_with(&k, &mut Greedy, &lrr).unwrap();
    assert_eq!(s.blocks, 16);
    let last: Vec<u64> = (0..4)
        .map(|u| m.l1_stats(u).unwrap().misses + m.l1_stats(u).unwrap().hits)
        .collect();
    let used: Vec<u64> = last.iter().zip(&after).map(|(a, b)| a - b).collect();
    assert!(
        used[0] > 0 && used[1] > 0 && used[2] == 0 && used[3] == 0,
        "{used:?}"
    );
}

#[test]
fn impossible_kernels_and_bad_addresses_are_typed_errors() {
    let m = machine();
    let k = Evens {
        n: 64,
        base: 1 << 32,
        tpb: 2048,
        regs: 32,
    };
    assert!(matches!(m.launch(&k), Err(SimtError::Occupancy(_))));
    // Not allocated: the core refuses the fault.
    let k = Evens {
        n: 64,
        base: 1 << 38,
        tpb: 64,
        regs: 32,
    };
    assert!(matches!(m.launch(&k), Err(SimtError::Access { .. })));
    // Unaligned lanes.
    let r = m.upload(&[0; 64]).unwrap();
    let k = Evens {
        n: 64,
        base: r.start.as_u64() + 1,
        tpb: 64,
        regs: 32,
    };
    assert!(matches!(m.launch(&k), Err(SimtError::Coalesce { .. })));
}

#[test]
fn an_observer_sees_every_transaction_with_its_unit() {
    struct Count(Vec<u64>, u64);
    impl AccessObserver for Count {
        fn transaction(&mut self, unit: usize, _pa: u64, store: bool, _s: Served) {
            self.0[unit] += 1;
            self.1 += u64::from(store);
        }
    }
    let m = machine();
    let n = 4096u64;
    let r = m.upload(&vec![0; n as usize]).unwrap();
    let k = Evens {
        n,
        base: r.start.as_u64(),
        tpb: 256,
        regs: 32,
    };
    let mut c = Count(vec![0; 4], 0);
    let s = m
        .launch_observed(
            &k,
            &mut Affinity::new(|b| Some(b as usize % 2)),
            &lrr,
            Some(&mut c),
        )
        .unwrap();
    assert_eq!(c.0.iter().sum::<u64>(), s.transactions);
    assert_eq!(c.1, s.transactions, "the kernel only stores");
    assert!(
        c.0[0] > 0 && c.0[1] > 0 && c.0[2] == 0 && c.0[3] == 0,
        "{:?}",
        c.0
    );
}

#[test]
fn an_observer_sees_each_transaction_at_its_virtual_line() {
    // Counts per virtual page, as a GPU's access counters count per region.
    struct Lines {
        seen: std::collections::BTreeMap<u64, u64>,
        plain: u64,
    }
    impl AccessObserver for Lines {
        fn transaction(&mut self, _unit: usize, _pa: u64, _store: bool, _s: Served) {
            self.plain += 1;
        }
        fn transaction_at(&mut self, _u: usize, va: u64, _pa: u64, _store: bool, _s: Served) {
            assert_eq!(va % 128, 0, "a line address");
            *self.seen.entry(va >> 12).or_default() += 1;
        }
    }
    let m = machine();
    let n = 4096u64;
    let r = m.upload(&vec![0; n as usize]).unwrap();
    let k = Evens {
        n,
        base: r.start.as_u64(),
        tpb: 256,
        regs: 32,
    };
    let mut c = Lines {
        seen: Default::default(),
        plain: 0,
    };
    let s = m
        .launch_observed(
            &k,
            &mut Affinity::new(|b| Some(b as usize % 2)),
            &lrr,
            Some(&mut c),
        )
        .unwrap();
    assert_eq!(c.plain, 0, "the engine calls transaction_at, not both");
    assert_eq!(c.seen.values().sum::<u64>(), s.transactions);
    let first = r.start.as_u64() >> 12;
    let pages = (n * 4).div_ceil(4096);
    assert!(
        c.seen.keys().all(|p| (first..first + pages).contains(p)),
        "{:?}",
        c.seen.keys()
    );
    assert_eq!(
        c.seen.len() as u64,
        pages,
        "every page of the array is touched"
    );
}

#[test]
fn requests_for_a_page_being_walked_merge_and_walkers_are_shared() {
    let run = |walkers: u64, timed: bool| {
        let mut m = machine();
        m.cost.walkers = walkers;
        m.cost.timed_walks = timed;
        // 32 Ki threads of 4-byte words: 32 pages, each stored to by 32 warps in a row.
        let n = 32 * 1024u64;
        let r = m.upload(&vec![u32::MAX; n as usize]).unwrap();
        let k = Evens {
            n,
            base: r.start.as_u64(),
            tpb: 128,
            regs: 32,
        };
        let s = m.launch(&k).unwrap();
        let got = m.download(r, n as usize).unwrap();
        for (t, &v) in got.iter().enumerate() {
            assert_eq!(v, if t % 2 == 0 { t as u32 } else { u32::MAX });
        }
        let first = r.start.as_u64() / 4096;
        let pages = (r.start.as_u64() + 4 * n - 1) / 4096 - first + 1;
        (s, pages)
    };
    let (s, pages) = run(16, true);
    // Every request is exactly one of: L1 hit, shared hit, merged miss, walk.
    assert_eq!(
        s.translations,
        s.served_l1 + s.served_l2 + s.merged + s.walks
    );
    // The warps after a page's first wait for its walk instead of walking again: one
    // walk per page (the 512-entry shared TLB keeps all 32).
    assert_eq!(s.walks, pages);
    assert!(s.merged > 0, "{s:?}");
    // One walker for everyone: the walks queue, the run takes longer.
    let (one, _) = run(1, true);
    assert_eq!(one.walks, pages);
    assert!(one.cycles > s.cycles, "{} vs {}", one.cycles, s.cycles);
    // Untimed: a walk's fill lands at issue, so the warps after the first hit, and each
    // instruction has the walkers to itself (one page each: the count does not matter).
    let (u16, _) = run(16, false);
    let (u1, _) = run(1, false);
    assert_eq!((u16.merged, u16.walks), (0, pages));
    assert_eq!(u16.served_l1 + u16.served_l2 + u16.walks, u16.translations);
    assert_eq!(u1.cycles, u16.cycles);
}
