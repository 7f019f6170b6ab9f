//! The policy engines wired into the fault path (issue 35, items 1 and 2):
//! `dev_fault_batch` (deduplication, one lock hold per block, per-record outcomes,
//! typed errors that change nothing, counters) and tree prefetch (`dev_set_prefetch`),
//! with the bytes checked after every migration.

use gmem_core::policy::batch::BatchError;
use gmem_core::policy::prefetch::PrefetchConfig;
use gmem_core::testing::TestSystem;
use gmem_core::*;

const GPU_BASE: u64 = 0x8000_0000;
const GPU: u32 = 7;

fn va(x: u64) -> VirtAddr {
    VirtAddr::new(x)
}

/// A host of `host_pages` pages and a GPU of `gpu_pages` pages, both attached and
/// active in one space [1 GiB, 2 GiB).
fn system(host_pages: u64, gpu_pages: u64) -> (TestSystem, SpaceId, usize) {
    let mut s = TestSystem::new(host_pages);
    let space = s.space();
    let d = s.add_device(GPU, DevCaps::FAULTABLE, GPU_BASE, gpu_pages);
    s.attach(space, d);
    (s, space, d)
}

/// A region of `pages` pages written by the host, page `k` filled with a pattern of `k`.
fn host_written(s: &TestSystem, space: SpaceId, pages: u64) -> Region {
    let r =
        s.gm.as_alloc(space, AllocRequest::new(pages * PAGE_SIZE))
            .unwrap();
    for k in 0..pages {
        s.write(0, page(r, k), &pattern(k)).unwrap();
    }
    r
}

fn page(r: Region, k: u64) -> VirtAddr {
    va(r.start.as_u64() + k * PAGE_SIZE)
}

fn pattern(k: u64) -> Vec<u8> {
    (0..PAGE_SIZE).map(|i| (k * 31 + i * 7) as u8).collect()
}

fn rec(v: VirtAddr, access: Prot) -> BatchFault {
    BatchFault { va: v, access }
}

/// Whether device `d` translates `v` now (its table maps the page).
fn mapped(s: &TestSystem, d: usize, v: VirtAddr) -> bool {
    s.devices[d].mmu.translate(v).is_some()
}

#[test]
fn a_batch_dedups_by_page_serves_each_page_once_and_keeps_the_bytes() {
    let (s, space, d) = system(256, 64);
    let gpu = s.devices[d].id;
    let r = host_written(&s, space, 8);
    let before = s.gm.stats();
    let batch = [
        rec(va(page(r, 3).as_u64() + 8), Prot::READ),
        rec(page(r, 1), Prot::READ),
        rec(va(page(r, 3).as_u64() + 100), Prot::WRITE), // duplicate of page 3
        rec(page(r, 5), Prot::WRITE),
        rec(page(r, 1), Prot::READ), // duplicate of page 1
    ];
    let rep = s.gm.dev_fault_batch(gpu, &batch).unwrap();
    assert_eq!(
        (rep.pages, rep.duplicates, rep.blocks, rep.failed()),
        (3, 2, 1, 0)
    );
    assert_eq!(rep.outcomes.len(), 5);
    assert_eq!(
        rep.outcomes[0], rep.outcomes[2],
        "a duplicate shares its page's outcome"
    );
    for o in &rep.outcomes {
        assert_eq!(o.unwrap().kind, FaultKind::Migrated);
    }
    let after = s.gm.stats();
    assert_eq!(after.faults_migrate - before.faults_migrate, 3);
    assert_eq!(after.fault_batches - before.fault_batches, 1);
    assert_eq!(after.fault_batch_records - before.fault_batch_records, 5);
    assert_eq!(
        after.fault_batch_duplicates - before.fault_batch_duplicates,
        2
    );
    assert_eq!(
        after.bytes_host_to_dev - before.bytes_host_to_dev,
        3 * PAGE_SIZE
    );
    for k in [1, 3, 5] {
        assert!(mapped(&s, d, page(r, k)), "page {k} mapped for the GPU");
        let (mem, _) = s.gm.as_page_frame(space, page(r, k)).unwrap().unwrap();
        assert_eq!(mem, gpu, "page {k} in GPU memory");
    }
    assert!(!mapped(&s, d, page(r, 2)), "no prefetch by default");
    // Every page reads back its pattern, from the GPU and from the host.
    for k in 0..8 {
        assert_eq!(
            s.read(d, page(r, k), PAGE_SIZE as usize).unwrap(),
            pattern(k)
        );
        assert_eq!(
            s.read(0, page(r, k), PAGE_SIZE as usize).unwrap(),
            pattern(k)
        );
    }
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn a_failing_record_is_an_outcome_and_the_rest_of_the_batch_is_served() {
    let (s, space, d) = system(256, 64);
    let gpu = s.devices[d].id;
    let r = host_written(&s, space, 4);
    s.gm.region_protect(
        Pages::range(
            space,
            VaRange {
                start: page(r, 2),
                len: PAGE_SIZE,
            },
        ),
        Prot::empty(),
    )
    .unwrap();
    let far = va((2 << 30) - PAGE_SIZE); // the space's last page: no region there
    let rep =
        s.gm.dev_fault_batch(
            gpu,
            &[
                rec(page(r, 0), Prot::READ),
                rec(page(r, 2), Prot::READ),
                rec(page(r, 3), Prot::WRITE),
            ],
        )
        .unwrap();
    assert!(rep.outcomes[0].is_ok() && rep.outcomes[2].is_ok());
    assert!(matches!(
        rep.outcomes[1],
        Err(FaultError::ProtectionViolation { .. })
    ));
    assert_eq!(rep.failed(), 1);
    assert!(!mapped(&s, d, page(r, 2)));
    assert_eq!(
        s.read(d, page(r, 3), PAGE_SIZE as usize).unwrap(),
        pattern(3)
    );
    let rep = s.gm.dev_fault_batch(gpu, &[rec(far, Prot::READ)]).unwrap();
    assert_eq!(rep.outcomes[0], Err(FaultError::NotAllocated(far)));
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn bad_batches_and_bad_devices_are_typed_errors_that_change_nothing() {
    let (mut s, space, d) = system(256, 64);
    let gpu = s.devices[d].id;
    let r = host_written(&s, space, 4);
    let before = s.gm.stats();
    let one = [rec(page(r, 0), Prot::READ)];
    assert_eq!(
        s.gm.dev_fault_batch(gpu, &[]),
        Err(FaultError::Batch(BatchError::Empty))
    );
    assert_eq!(
        s.gm.dev_fault_batch(gpu, &[rec(page(r, 0), Prot::empty())]),
        Err(FaultError::Batch(BatchError::NoAccess { index: 0 }))
    );
    let big = vec![rec(page(r, 0), Prot::READ); 257];
    assert_eq!(
        s.gm.dev_fault_batch(gpu, &big),
        Err(FaultError::Batch(BatchError::TooLarge {
            records: 257,
            max: 256
        }))
    );
    // A device active nowhere, a destroyed one, one that cannot fault.
    let idle = s.add_device(GPU + 1, DevCaps::FAULTABLE, 0x9000_0000, 16);
    let idle = s.devices[idle].id;
    assert_eq!(
        s.gm.dev_fault_batch(idle, &one),
        Err(FaultError::NotActive(idle))
    );
    let wired = s.add_device(GPU + 2, DevCaps::empty(), 0xa000_0000, 16);
    let wired = s.devices[wired].id;
    assert_eq!(
        s.gm.dev_fault_batch(wired, &one),
        Err(FaultError::NotFaultable(wired))
    );
    s.gm.dev_destroy(idle).unwrap();
    assert_eq!(
        s.gm.dev_fault_batch(idle, &one),
        Err(FaultError::UnknownDevice(idle))
    );
    assert_eq!(
        s.gm.dev_set_prefetch(idle, None),
        Err(DeviceError::UnknownDevice(idle))
    );
    let after = s.gm.stats();
    assert_eq!(after, before, "no counter moved");
    assert!(!mapped(&s, d, page(r, 0)));
    assert_eq!(
        s.gm.as_page_frame(space, page(r, 0)).unwrap().unwrap().0,
        s.host().id
    );
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn spurious_faults_of_one_block_cost_one_invalidation_call() {
    let (s, space, d) = system(256, 64);
    let gpu = s.devices[d].id;
    let r = host_written(&s, space, 8);
    let recs: Vec<BatchFault> = (0..8).map(|k| rec(page(r, k), Prot::READ)).collect();
    let _ = s.gm.dev_fault_batch(gpu, &recs).unwrap();
    // Every page is mapped for the GPU now: the same faults again are all spurious.
    let before = s.gm.stats();
    let rep = s.gm.dev_fault_batch(gpu, &recs).unwrap();
    let after = s.gm.stats();
    assert!(rep
        .outcomes
        .iter()
        .all(|o| o.unwrap().kind == FaultKind::Spurious));
    assert_eq!(after.faults_spurious - before.faults_spurious, 8);
    let batched = after.invalidations - before.invalidations;
    // The single-fault path: one invalidation per spurious fault.
    let before = s.gm.stats();
    for k in 0..8 {
        let _ = s.gm.dev_fault(gpu, page(r, k), Prot::READ).unwrap();
    }
    let single = s.gm.stats().invalidations - before.invalidations;
    assert_eq!((batched, single), (1, 8));
    s.gm.check_invariants(space).unwrap();
}

/// Scans `pages` pages of `r` in order on the GPU as a streaming kernel does, one
/// batch per page the GPU cannot translate; returns the faults reported.
fn stream(s: &TestSystem, d: usize, r: Region, pages: u64) -> u64 {
    let gpu = s.devices[d].id;
    let mut faults = 0;
    for k in 0..pages {
        if !mapped(s, d, page(r, k)) {
            faults += 1;
            let rep =
                s.gm.dev_fault_batch(gpu, &[rec(page(r, k), Prot::READ)])
                    .unwrap();
            assert_eq!(rep.failed(), 0);
        }
        assert!(mapped(s, d, page(r, k)), "page {k} mapped after its fault");
    }
    faults
}

#[test]
fn tree_prefetch_cuts_a_streaming_scan_faults_at_least_4x_with_the_bytes_intact() {
    const PAGES: u64 = 1024; // two 2 MiB blocks (the region may straddle three)
    let (s, space, d) = system(2 * PAGES + 64, 2 * PAGES);
    let r = host_written(&s, space, PAGES);
    let none = stream(&s, d, r, PAGES);
    let (s2, space2, d2) = system(2 * PAGES + 64, 2 * PAGES);
    let r2 = host_written(&s2, space2, PAGES);
    s2.gm
        .dev_set_prefetch(s2.devices[d2].id, Some(PrefetchConfig::default()))
        .unwrap();
    let before = s2.gm.stats();
    let with = stream(&s2, d2, r2, PAGES);
    let after = s2.gm.stats();
    println!("streaming scan of {PAGES} pages: {none} faults without prefetch, {with} with");
    assert_eq!(none, PAGES, "page by page without prefetch");
    assert!(with * 4 <= none, "prefetch: {with} faults against {none}");
    assert_eq!(
        after.pages_prefetched - before.pages_prefetched,
        PAGES - with
    );
    assert_eq!(
        after.bytes_host_to_dev - before.bytes_host_to_dev,
        PAGES * PAGE_SIZE
    );
    for k in 0..PAGES {
        assert_eq!(
            s2.read(d2, page(r2, k), PAGE_SIZE as usize).unwrap(),
            pattern(k)
        );
        let (mem, _) = s2.gm.as_page_frame(space2, page(r2, k)).unwrap().unwrap();
        assert_eq!(mem, s2.devices[d2].id);
    }
    for k in (0..PAGES).step_by(97) {
        assert_eq!(
            s2.read(0, page(r2, k), PAGE_SIZE as usize).unwrap(),
            pattern(k)
        );
    }
    s.gm.check_invariants(space).unwrap();
    s2.gm.check_invariants(space2).unwrap();
}

#[test]
fn prefetch_zero_fills_fresh_pages_never_evicts_and_never_leaves_its_region() {
    // 64 GPU pages for a 96-page region: prefetch stops when the GPU is full.
    let (s, space, d) = system(512, 64);
    let gpu = s.devices[d].id;
    s.gm.dev_set_prefetch(gpu, Some(PrefetchConfig::new(51, 16).unwrap()))
        .unwrap();
    let fresh =
        s.gm.as_alloc(space, AllocRequest::new(96 * PAGE_SIZE))
            .unwrap();
    let other = host_written(&s, space, 4);
    let before = s.gm.stats();
    let rep =
        s.gm.dev_fault_batch(gpu, &[rec(page(fresh, 0), Prot::WRITE)])
            .unwrap();
    assert_eq!(rep.failed(), 0);
    assert!(
        rep.prefetched >= 15,
        "big-page growth fills the 64 KiB around the fault"
    );
    let after = s.gm.stats();
    assert_eq!(after.evictions, before.evictions, "prefetch never evicts");
    for k in 0..16 {
        assert!(mapped(&s, d, page(fresh, k)));
        assert_eq!(s.read(d, page(fresh, k), 16).unwrap(), vec![0; 16]);
    }
    for k in 0..4 {
        assert!(
            !mapped(&s, d, page(other, k)),
            "another region is not prefetched"
        );
    }
    // Fill the GPU: one fault per 16 pages at most, never an eviction by prefetch.
    for k in (16..96).step_by(16) {
        let _ =
            s.gm.dev_fault_batch(gpu, &[rec(page(fresh, k), Prot::WRITE)])
                .unwrap();
    }
    let st = s.gm.stats();
    assert!(
        st.evictions - before.evictions <= 32,
        "evictions only by the faults themselves"
    );
    for k in 0..96 {
        assert_eq!(s.read(d, page(fresh, k), 16).unwrap(), vec![0; 16]);
    }
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn advice_is_stored_per_page_across_regions_and_goes_with_its_region() {
    use gmem_core::policy::advice::AdviceOp;
    let (mut s, space, d) = system(64, 16);
    let gpu = s.devices[d].id;
    let ghost = s.add_device(9, DevCaps::FAULTABLE, 0xa000_0000, 4);
    let ghost = s.devices[ghost].id;
    s.gm.dev_destroy(ghost).unwrap();
    let a =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    let b =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    assert_eq!(page(a, 4), b.start, "two adjacent regions");
    // A range across both regions: the last two pages of a, the first of b.
    let across = Pages::range(space, VaRange::new(page(a, 2), 3 * PAGE_SIZE).unwrap());
    s.gm.region_advise(across, AdviceOp::SetAccessedBy(gpu))
        .unwrap();
    s.gm.region_advise(b, AdviceOp::SetPreferred(gpu)).unwrap();
    s.gm.region_advise(a, AdviceOp::SetReadMostly).unwrap();
    let at = |r: Region, k: u64| s.gm.region_advice(space, page(r, k)).unwrap();
    assert!(!at(a, 1).accessed_by.contains(gpu) && at(a, 1).read_mostly);
    assert!(at(a, 2).accessed_by.contains(gpu) && at(a, 3).accessed_by.contains(gpu));
    assert!(at(b, 0).accessed_by.contains(gpu) && !at(b, 1).accessed_by.contains(gpu));
    assert_eq!(
        (at(b, 3).preferred, at(b, 3).read_mostly),
        (Some(gpu), false)
    );
    assert_eq!(at(a, 0).preferred, None);
    // Misuse: typed errors, nothing changes.
    let before: Vec<_> = (0..4).flat_map(|k| [at(a, k), at(b, k)]).collect();
    assert_eq!(
        s.gm.region_advise(a, AdviceOp::SetPreferred(ghost)),
        Err(AdviseError::UnknownDevice(ghost))
    );
    let unaligned = VaRange {
        start: va(page(a, 0).as_u64() + 8),
        len: PAGE_SIZE,
    };
    assert_eq!(
        s.gm.region_advise(Pages::range(space, unaligned), AdviceOp::Clear),
        Err(AdviseError::Region(RegionError::BadRange(unaligned)))
    );
    // Past b's end no region holds the pages: refused whole, a's and b's pages untouched.
    let past = Pages::range(space, VaRange::new(page(b, 2), 4 * PAGE_SIZE).unwrap());
    assert_eq!(
        s.gm.region_advise(past, AdviceOp::Clear),
        Err(AdviseError::Region(RegionError::Unallocated(page(b, 4))))
    );
    let after: Vec<_> = (0..4).flat_map(|k| [at(a, k), at(b, k)]).collect();
    assert_eq!(before, after);
    // Deallocating b forgets its advice: a region allocated there again has none.
    s.gm.region_dealloc(b, MapFlags::empty(), None).unwrap();
    assert!(matches!(
        s.gm.region_advice(space, page(b, 0)),
        Err(AdviseError::Region(RegionError::Unallocated(_)))
    ));
    let mut req = AllocRequest::new(4 * PAGE_SIZE);
    req.hint = b.start;
    let c = s.gm.as_alloc(space, req).unwrap();
    assert_eq!(c.start, b.start);
    for k in 0..4 {
        assert!(
            at(c, k).is_none(),
            "page {k} of the new region has no advice"
        );
    }
    assert!(at(a, 3).accessed_by.contains(gpu), "a keeps its advice");
    s.gm.check_invariants(space).unwrap();
}
