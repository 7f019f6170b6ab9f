//! Page-table edits outside the space lock (`Mmu::concurrent_edits`): `region_map`'s
//! eager mappings and a strict `region_dealloc`'s unmapping, for devices whose tables
//! take concurrent edits of disjoint ranges. The same outcomes and event order as the
//! locked path, failure atomicity, and threads editing disjoint regions of one space
//! while a third attaches and detaches a device (its tables must never be edited after
//! they are destroyed, nor leak).

use gmem_core::testing::{AccessError, MmuEvent, TestSystem};
use gmem_core::*;
use std::sync::Arc;

const IO: u32 = 9; // a page-table format of its own

fn va(x: u64) -> VirtAddr {
    VirtAddr::new(x)
}

/// A host with 256 pages, a space [1 GiB, 2 GiB) with the CPU attached, and `n` I/O
/// devices (they cannot fault) whose tables take concurrent edits, attached too.
fn system(n: usize) -> (TestSystem, SpaceId, Vec<usize>) {
    let mut s = TestSystem::new(256);
    let space = s.space();
    s.concurrent_edits = true;
    let io = (0..n)
        .map(|_| {
            let d = s.add_device(IO, DevCaps::empty(), 0, 0);
            s.attach(space, d);
            d
        })
        .collect();
    (s, space, io)
}

fn frame(k: u64) -> PhysAddr {
    PhysAddr::new(0x7000_0000 + k * PAGE_SIZE)
}

#[test]
fn unlocked_map_and_strict_dealloc_keep_the_locked_paths_outcome_and_order() {
    let (s, space, io) = system(1);
    let io = io[0];
    let host = s.host().id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(3 * PAGE_SIZE))
            .unwrap();
    s.take_events();
    // Frames 0, 1 contiguous, then 5: two runs.
    let frames = [frame(0), frame(1), frame(5)];
    s.gm.region_map(r, MapRequest::new(&frames, host)).unwrap();
    let ev = s.take_events();
    let maps: Vec<(u64, u64)> = ev
        .iter()
        .filter_map(|e| match e {
            MmuEvent::Map { mmu, run, .. } if *mmu == io as u32 => Some((run.va.as_u64(), run.len)),
            _ => None,
        })
        .collect();
    assert_eq!(
        maps,
        vec![
            (r.start.as_u64(), 2 * PAGE_SIZE),
            (r.start.as_u64() + 2 * PAGE_SIZE, PAGE_SIZE)
        ]
    );
    assert!(s.gm.region_info(r).unwrap().mapped);
    for (k, f) in frames.iter().enumerate() {
        let pte = s
            .translate(io, va(r.start.as_u64() + k as u64 * PAGE_SIZE), Prot::WRITE)
            .unwrap();
        assert_eq!(pte.pfn, f.pfn().0);
    }
    s.gm.check_invariants(space).unwrap();
    assert_eq!(
        s.gm.region_map(r, MapRequest::new(&frames, host)),
        Err(MapError::AlreadyMapped)
    );

    s.take_events();
    s.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
    let ev = s.take_events();
    let unmap = ev
        .iter()
        .position(|e| matches!(e, MmuEvent::Unmap { mmu, .. } if *mmu == io as u32))
        .expect("the I/O table is unmapped");
    let inval = ev
        .iter()
        .position(|e| matches!(e, MmuEvent::Invalidate { mmu, .. } if *mmu == io as u32))
        .expect("the I/O TLB is invalidated");
    assert!(unmap < inval, "unmap before its invalidation: {ev:?}");
    assert_eq!(
        s.translate(io, r.start, Prot::READ),
        Err(AccessError::Unmapped(r.start))
    );
    assert!(s.devices[io]
        .mmu
        .store()
        .entries(s.devices[io].mmu.active_root().unwrap())
        .is_empty());
    s.gm.check_invariants(space).unwrap();
    assert_eq!(s.devices[io].mmu.store().edits_of_destroyed(), 0);
}

#[test]
fn a_failed_unlocked_map_leaves_every_table_and_the_region_as_before() {
    let (s, space, io) = system(2);
    let host = s.host().id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    let before = s.gm.region_info(r).unwrap();
    // The second device's table fails: the first one's runs are mapped already and
    // must be taken back (and invalidated: a DMA may have used them).
    s.devices[io[1]].mmu.fail_next_maps(1);
    s.take_events();
    let frames = [frame(0), frame(1)];
    assert_eq!(
        s.gm.region_map(r, MapRequest::new(&frames, host)),
        Err(MapError::Mmu(MmuError::OutOfTableMemory))
    );
    let ev = s.take_events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, MmuEvent::Invalidate { mmu, .. } if *mmu == io[0] as u32)),
        "the first device's TLB is invalidated after the undo: {ev:?}"
    );
    for &d in &io {
        let root = s.devices[d].mmu.active_root().unwrap();
        assert!(s.devices[d].mmu.store().entries(root).is_empty());
    }
    assert_eq!(s.gm.region_info(r).unwrap(), before);
    s.gm.check_invariants(space).unwrap();
    // And the same call succeeds afterwards.
    s.gm.region_map(r, MapRequest::new(&frames, host)).unwrap();
    s.write(io[1], r.start, b"ok").unwrap();
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn threads_edit_disjoint_regions_while_a_device_comes_and_goes() {
    let (mut s, space, io) = system(1);
    let io = io[0];
    s.concurrent_edits = true;
    let extra = s.add_device(IO, DevCaps::empty(), 0, 0);
    let host = s.host().id;
    let s = Arc::new(s);
    const ROUNDS: u64 = 400;
    let workers: Vec<_> = (0..2u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..ROUNDS {
                    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
                    let f = frame(t * ROUNDS + i);
                    s.gm.region_map(r, MapRequest::new(&[f], host)).unwrap();
                    let pte = s.translate(io, r.start, Prot::WRITE).unwrap();
                    assert_eq!(pte.pfn, f.pfn().0, "thread {t} round {i}");
                    s.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
                    // The other thread may already have allocated and mapped the same
                    // addresses (to its own frames); what must never come back is
                    // this round's frame, from the table or a stale TLB entry.
                    match s.translate(io, r.start, Prot::READ) {
                        Err(AccessError::Unmapped(_)) => {}
                        Ok(pte) => assert_ne!(pte.pfn, f.pfn().0, "thread {t} round {i}"),
                        Err(e) => panic!("thread {t} round {i}: {e:?}"),
                    }
                }
            })
        })
        .collect();
    let churn = {
        let s = s.clone();
        std::thread::spawn(move || {
            let id = s.devices[extra].id;
            for _ in 0..ROUNDS / 4 {
                s.gm.as_attach(space, id, MmuMode::Coherent, Activation::Leave)
                    .unwrap();
                s.gm.dev_detach(id, space).unwrap();
            }
        })
    };
    for w in workers {
        w.join().unwrap();
    }
    churn.join().unwrap();
    s.gm.check_invariants(space).unwrap();
    let extra_store = s.devices[extra].mmu.store();
    assert_eq!(
        extra_store.edits_of_destroyed(),
        0,
        "an edit hit a destroyed table"
    );
    assert_eq!(extra_store.tables(), 0, "a detached table leaked");
    let io_root = s.devices[io].mmu.active_root().unwrap();
    assert!(s.devices[io].mmu.store().entries(io_root).is_empty());
    assert_eq!(s.devices[io].mmu.store().edits_of_destroyed(), 0);
}
