//! What the models share: the loom builder with a stated preemption bound, the small
//! address space their setups make, and a checker of the recorded MMU event log for
//! DESIGN invariant 3.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};

use std::sync::atomic::{AtomicUsize, Ordering};

use gmem_core::testing::{MmuEvent, TestMmu, TestSystem};
use gmem_core::{Activation, AllocPolicy, MmuMode, PageTableRoot, SpaceId, VirtAddr, PAGE_SIZE};

/// A loom builder exploring every interleaving with at most `preemptions` preemptions
/// (`LOOM_MAX_PREEMPTIONS` in the environment overrides it).
pub fn builder(preemptions: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        b.preemption_bound = Some(preemptions);
    }
    // The setups run hundreds of lock operations on one thread before the threads
    // start; each is a point loom records.
    b.max_branches = 100_000;
    b
}

/// Explore `f` with [`builder`] and print how many executions it took and how long.
pub fn model<F: Fn() + Sync + Send + 'static>(name: &str, preemptions: usize, f: F) {
    // Per call, not a static: models of one test binary run in parallel.
    let executions = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = executions.clone();
    let start = std::time::Instant::now();
    let b = builder(preemptions);
    let bound = b.preemption_bound;
    b.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        f();
    });
    eprintln!(
        "loom model {name}: {} executions, preemption bound {}, {:.1} s",
        executions.load(Ordering::Relaxed),
        bound.map_or("none".to_string(), |b| b.to_string()),
        start.elapsed().as_secs_f64()
    );
}

/// If the TLB holds `va` under `root`, it holds what the page table maps there now
/// (no stale translation).
pub fn assert_tlb_current(mmu: &TestMmu, root: PageTableRoot, va: VirtAddr, what: &str) {
    if mmu.tlb_holds(root, va) {
        assert_eq!(
            mmu.translate(va),
            mmu.store().lookup(root, va.vpn().0),
            "{what}: stale TLB entry for {va:?}"
        );
    }
}

/// Check, in the order an event log recorded them, that no virtual page and no frame
/// was mapped again while an unmapping of it still waited for its TLB invalidation
/// (DESIGN invariant 3: nothing is reused before its invalidation). Tables are keyed
/// by (MMU, root): the models use no shared tables, so each table has one TLB.
pub fn check_reuse_after_invalidation(events: &[MmuEvent]) {
    let mut mapped: HashMap<(u32, u64, u64), u64> = HashMap::new();
    // Unmapped and not yet invalidated: (mmu, root, vpn) → frame.
    let mut stale: HashMap<(u32, u64, u64), u64> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        match e {
            MmuEvent::Map { mmu, root, run } => {
                let stale_frames: HashSet<u64> = stale.values().copied().collect();
                for k in 0..run.len / PAGE_SIZE {
                    let vpn = run.va.vpn().0 + k;
                    let pfn = run.pa.pfn().0 + k;
                    assert!(
                        !stale_frames.contains(&pfn),
                        "event {i}: frame {pfn:#x} reused before the invalidation of its \
                         old mapping: {e:?}"
                    );
                    assert!(
                        !stale.contains_key(&(*mmu, root.0, vpn)),
                        "event {i}: virtual page {vpn:#x} mapped again before its \
                         invalidation: {e:?}"
                    );
                    mapped.insert((*mmu, root.0, vpn), pfn);
                }
            }
            MmuEvent::Unmap { mmu, root, range } => {
                for k in 0..range.pages() {
                    let key = (*mmu, root.0, range.first_vpn().0 + k);
                    if let Some(pfn) = mapped.remove(&key) {
                        stale.insert(key, pfn);
                    }
                }
            }
            MmuEvent::Invalidate { mmu, root, ranges } => {
                for r in ranges {
                    for k in 0..r.pages() {
                        stale.remove(&(*mmu, root.0, r.first_vpn().0 + k));
                    }
                }
            }
            MmuEvent::InvalidateAll { mmu, root } => {
                stale.retain(|(m, r, _), _| !(*m == *mmu && *r == root.0));
            }
            MmuEvent::Destroy { mmu, root } => {
                mapped.retain(|(m, r, _), _| !(*m == *mmu && *r == root.0));
            }
            _ => {}
        }
    }
}

/// A first-fit address space of `bytes` at 1 GiB, attached coherently (and switched to)
/// on each of `s`'s devices `devices` (indexes into `s.devices`; 0 is the host).
pub fn space(s: &TestSystem, bytes: u64, devices: &[usize]) -> SpaceId {
    let begin = 1 << 30;
    let space =
        s.gm.as_create(
            VirtAddr::new(begin),
            VirtAddr::new(begin + bytes),
            AllocPolicy::FIRST_FIT,
        )
        .unwrap();
    for &d in devices {
        s.gm.as_attach(
            space,
            s.devices[d].id,
            MmuMode::Coherent,
            Activation::Switch,
        )
        .unwrap();
    }
    space
}

/// The end check of the magazine models: no object of `held` is held twice (nothing
/// was handed out twice); after freeing them all (each `quantum` bytes) and reaping,
/// the arena is one free segment again (nothing lost), with as many allocations as
/// frees counted.
pub fn assert_each_once_then_all_back(
    arena: &gmem_core::vmem::Arena,
    held: Vec<u64>,
    quantum: u64,
) {
    let mut seen = HashSet::new();
    for &a in &held {
        assert!(seen.insert(a), "object {a:#x} handed out twice");
    }
    for a in held {
        arena.free(a, quantum).unwrap();
    }
    arena.reap();
    let s = arena.stats();
    assert_eq!(
        (s.allocated, s.cached, s.segments, s.free_segments),
        (0, 0, 1, 1),
        "every object came back and coalesced: {s:?}"
    );
    assert_eq!(s.allocs, s.frees);
}

/// The magazine models' racing step: a loom thread per object of `give`, which calls
/// `start(its index)` (say, which CPU it runs on), allocates `quantum` bytes, frees
/// its given object and allocates again; returns `held` with what every thread holds
/// at the end appended.
pub fn alloc_free_alloc_threads(
    arena: &std::sync::Arc<gmem_core::vmem::Arena>,
    give: Vec<u64>,
    quantum: u64,
    start: fn(usize),
    mut held: Vec<u64>,
) -> Vec<u64> {
    let threads: Vec<_> = give
        .into_iter()
        .enumerate()
        .map(|(i, given)| {
            let arena = arena.clone();
            loom::thread::spawn(move || {
                start(i);
                let x = arena.alloc(quantum).unwrap();
                arena.free(given, quantum).unwrap();
                let y = arena.alloc(quantum).unwrap();
                vec![x, y]
            })
        })
        .collect();
    for t in threads {
        held.extend(t.join().unwrap());
    }
    held
}
