//! Range operations inside a region (`region_*_range`: protect — no access included —,
//! unmap, migrate, wire, unwire) and `dev_evacuate`, on the test MMU: bytes, table
//! contents, typed errors that change nothing, and the invariants after each step.

use gmem_core::testing::{AccessError, TestSystem};
use gmem_core::*;

const GPU_BASE: u64 = 0x8000_0000;
const GPU: u32 = 7;

fn va(x: u64) -> VirtAddr {
    VirtAddr::new(x)
}

/// A host with 256 pages and a space [1 GiB, 2 GiB) with the CPU attached.
fn system() -> (TestSystem, SpaceId) {
    let s = TestSystem::new(256);
    let space = s.space();
    (s, space)
}

fn attach(s: &mut TestSystem, space: SpaceId, caps: DevCaps, mem_pages: u64) -> usize {
    let d = s.add_device(GPU, caps, GPU_BASE, mem_pages);
    s.attach(space, d);
    d
}

fn page(r: Region, k: u64) -> VirtAddr {
    va(r.start.as_u64() + k * PAGE_SIZE)
}

fn pages(r: Region, k: u64, n: u64) -> VaRange {
    VaRange {
        start: page(r, k),
        len: n * PAGE_SIZE,
    }
}

fn violation(e: Result<(), AccessError>) -> bool {
    matches!(
        e,
        Err(AccessError::Fault(FaultError::ProtectionViolation { .. }))
    )
}

/// A four-page region, each page written with its number.
fn written(s: &TestSystem, space: SpaceId) -> Region {
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    for k in 0..4 {
        s.write(0, page(r, k), &[k as u8 + 1]).unwrap();
    }
    r
}

#[test]
fn a_range_protect_splits_the_region_and_merges_back() {
    let (s, space) = system();
    let r = written(&s, space);
    s.gm.region_protect(gmem_core::Pages::range(r.space, pages(r, 1, 2)), Prot::READ)
        .unwrap();
    s.gm.check_invariants(space).unwrap();
    assert!(violation(s.write(0, page(r, 1), b"x")));
    assert!(violation(s.write(0, page(r, 2), b"x")));
    s.write(0, page(r, 0), b"a").unwrap();
    s.write(0, page(r, 3), b"d").unwrap();
    assert_eq!(s.read(0, page(r, 2), 1).unwrap(), [3]);
    let root = s.host().mmu.active_root().unwrap();
    let pte = |k: u64| s.host_store.lookup(root, page(r, k).vpn().0).unwrap();
    assert_eq!(pte(1).prot, Prot::READ);
    assert_eq!(pte(3).prot, Prot::RW);
    assert_eq!(
        s.gm.region_info(r).unwrap().prot,
        Prot::RW,
        "the region keeps its own"
    );
    // Page 2 back to the region's protection: the piece shrinks to page 1.
    s.gm.region_protect(gmem_core::Pages::range(r.space, pages(r, 2, 1)), Prot::RW)
        .unwrap();
    s.write(0, page(r, 2), b"c").unwrap();
    assert!(violation(s.write(0, page(r, 1), b"x")));
    // Protecting the whole region merges every piece back.
    s.gm.region_protect(r, Prot::RW).unwrap();
    s.write(0, page(r, 1), b"b").unwrap();
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn no_access_removes_every_mapping_keeps_the_data_and_comes_back() {
    let (mut s, space) = system();
    let io = attach(&mut s, space, DevCaps::empty(), 0);
    let r = written(&s, space);
    assert_eq!(s.gm.region_wire(r).unwrap(), 4);
    assert_eq!(s.read(io, page(r, 1), 1).unwrap(), [2]);
    s.gm.region_protect(
        gmem_core::Pages::range(r.space, pages(r, 1, 1)),
        Prot::empty(),
    )
    .unwrap();
    s.gm.check_invariants(space).unwrap();
    assert_eq!(
        s.read(io, page(r, 1), 1),
        Err(AccessError::Unmapped(page(r, 1))),
        "the device that cannot fault lost the page"
    );
    assert!(matches!(
        s.read(0, page(r, 1), 1),
        Err(AccessError::Fault(FaultError::ProtectionViolation { .. }))
    ));
    assert_eq!(
        s.read(io, page(r, 0), 1).unwrap(),
        [1],
        "its neighbours stay"
    );
    s.gm.region_protect(gmem_core::Pages::range(r.space, pages(r, 1, 1)), Prot::READ)
        .unwrap();
    assert_eq!(
        s.read(io, page(r, 1), 1).unwrap(),
        [2],
        "mirrored again to the device that cannot fault"
    );
    assert_eq!(s.read(0, page(r, 1), 1).unwrap(), [2]);
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn a_failed_range_protect_leaves_every_protection_as_before() {
    let (s, space) = system();
    let r = written(&s, space);
    s.host().mmu.fail_next_protects(1);
    assert!(matches!(
        s.gm.region_protect(gmem_core::Pages::range(r.space, pages(r, 0, 3)), Prot::READ),
        Err(ProtectError::Mmu(_))
    ));
    let root = s.host().mmu.active_root().unwrap();
    for k in 0..4 {
        let pte = s.host_store.lookup(root, page(r, k).vpn().0);
        assert!(pte.is_none_or(|p| p.prot == Prot::RW), "page {k}: {pte:?}");
        s.write(0, page(r, k), b"w").unwrap();
    }
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn bad_ranges_are_typed_errors_that_change_nothing() {
    let (s, space) = system();
    let r = written(&s, space);
    let bad = [
        VaRange {
            start: va(r.start.as_u64() + 1),
            len: PAGE_SIZE,
        },
        VaRange {
            start: r.start,
            len: 0,
        },
        pages(r, 3, 2),
        VaRange {
            start: va(r.start.as_u64() - PAGE_SIZE),
            len: 2 * PAGE_SIZE,
        },
    ];
    for (i, range) in bad.into_iter().enumerate() {
        // Empty or unaligned ranges are bad ranges; the others reach into no region.
        let e = match i {
            0 | 1 => RegionError::BadRange(range),
            2 => RegionError::Unallocated(page(r, 4)),
            _ => RegionError::Unallocated(va(r.start.as_u64() - PAGE_SIZE)),
        };
        assert_eq!(
            s.gm.region_protect(gmem_core::Pages::range(r.space, range), Prot::READ),
            Err(ProtectError::Region(e))
        );
        assert_eq!(
            s.gm.region_unmap(
                gmem_core::Pages::range(r.space, range),
                MapFlags::empty(),
                None
            ),
            Err(e)
        );
        assert_eq!(
            s.gm.region_migrate(
                gmem_core::Pages::range(r.space, range),
                s.host().id,
                MigrateScope::Populated
            ),
            Err(PopulateError::Region(e))
        );
        assert_eq!(
            s.gm.region_wire(gmem_core::Pages::range(r.space, range)),
            Err(PopulateError::Region(e))
        );
        assert_eq!(
            s.gm.region_unwire(gmem_core::Pages::range(r.space, range)),
            Err(e)
        );
    }
    for k in 0..4 {
        assert_eq!(s.read(0, page(r, k), 1).unwrap(), [k as u8 + 1]);
        s.write(0, page(r, k), b"w").unwrap();
    }
    assert_eq!(s.gm.dev_frames(s.host().id).unwrap().wired, 0);
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn a_range_unmap_drops_only_its_pages() {
    let (s, space) = system();
    let host = s.host().id;
    let r = written(&s, space);
    s.gm.region_unmap(
        gmem_core::Pages::range(r.space, pages(r, 2, 1)),
        MapFlags::empty(),
        None,
    )
    .unwrap();
    assert_eq!(s.read(0, page(r, 2), 1).unwrap(), [0], "zero-filled again");
    assert_eq!(s.read(0, page(r, 1), 1).unwrap(), [2]);
    s.gm.region_unmap(
        gmem_core::Pages::range(r.space, pages(r, 0, 2)),
        MapFlags::ASYNC,
        None,
    )
    .unwrap();
    s.gm.as_synchronize(space).unwrap();
    assert_eq!(s.read(0, page(r, 0), 1).unwrap(), [0]);
    assert_eq!(s.read(0, page(r, 3), 1).unwrap(), [4]);
    s.gm.check_invariants(space).unwrap();
    // A region of caller-given frames holds nothing in the range afterwards.
    let m =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    let frames = [PhysAddr::new(0x7000_0000), PhysAddr::new(0x7000_1000)];
    s.gm.region_map(m, MapRequest::new(&frames, host)).unwrap();
    s.gm.region_unmap(
        gmem_core::Pages::range(m.space, pages(m, 0, 1)),
        MapFlags::empty(),
        None,
    )
    .unwrap();
    assert_eq!(
        s.gm.dev_fault(host, m.start, Prot::READ),
        Err(FaultError::NotMapped(m.start))
    );
    assert!(s.translate(0, page(m, 1), Prot::READ).is_ok());
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn a_range_migrates_wires_and_unwires_alone() {
    let (mut s, space) = system();
    let io = attach(&mut s, space, DevCaps::empty(), 0);
    let g = attach(&mut s, space, DevCaps::FAULTABLE, 8);
    let gid = s.devices[g].id;
    let r = written(&s, space);
    assert_eq!(
        s.gm.region_migrate(
            gmem_core::Pages::range(r.space, pages(r, 1, 2)),
            gid,
            MigrateScope::Populated
        )
        .unwrap(),
        2
    );
    assert_eq!(s.gm.dev_frames(gid).unwrap().active, 2);
    for k in 0..4 {
        assert_eq!(s.read(0, page(r, k), 1).unwrap(), [k as u8 + 1]);
    }
    assert_eq!(
        s.gm.region_wire(gmem_core::Pages::range(r.space, pages(r, 0, 2)))
            .unwrap(),
        2
    );
    assert_eq!(s.read(io, page(r, 1), 1).unwrap(), [2]);
    assert_eq!(
        s.read(io, page(r, 2), 1),
        Err(AccessError::Unmapped(page(r, 2)))
    );
    s.gm.check_invariants(space).unwrap();
    s.gm.region_unwire(gmem_core::Pages::range(r.space, pages(r, 1, 1)))
        .unwrap();
    assert_eq!(
        s.read(io, page(r, 1), 1),
        Err(AccessError::Unmapped(page(r, 1)))
    );
    assert_eq!(s.read(io, page(r, 0), 1).unwrap(), [1]);
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn evacuation_empties_a_device_wired_pages_included_so_it_can_be_destroyed() {
    let (mut s, space) = system();
    let host = s.host().id;
    let io = attach(&mut s, space, DevCaps::empty(), 0);
    let g = attach(&mut s, space, DevCaps::FAULTABLE, 8);
    let gid = s.devices[g].id;
    let r = written(&s, space);
    s.gm.region_migrate(r, gid, MigrateScope::Populated)
        .unwrap();
    s.gm.region_wire(gmem_core::Pages::range(r.space, pages(r, 3, 1)))
        .unwrap();
    assert_eq!(s.gm.dev_frames(gid).unwrap().wired, 1);
    assert_eq!(s.gm.dev_evacuate(host), Err(PopulateError::IsHost));
    assert_eq!(s.gm.dev_evacuate(gid).unwrap(), 4);
    let c = s.gm.dev_frames(gid).unwrap();
    assert_eq!((c.active, c.inactive, c.wired), (0, 0, 0));
    assert_eq!(
        s.gm.dev_frames(host).unwrap().wired,
        1,
        "still wired, on the host"
    );
    assert_eq!(
        s.read(io, page(r, 3), 1).unwrap(),
        [4],
        "and still mapped for DMA"
    );
    for k in 0..4 {
        assert_eq!(s.read(0, page(r, k), 1).unwrap(), [k as u8 + 1]);
    }
    s.gm.check_invariants(space).unwrap();
    s.gm.dev_detach(gid, space).unwrap();
    s.gm.dev_destroy(gid).unwrap();
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn attributes_reach_every_map_run_and_frame_request() {
    let (mut s, space) = system();
    let g = attach(&mut s, space, DevCaps::FAULTABLE, 8);
    let gid = s.devices[g].id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    s.gm.region_set_attrs(r, Attrs(1)).unwrap();
    s.gm.region_set_attrs(gmem_core::Pages::range(r.space, pages(r, 2, 1)), Attrs(5))
        .unwrap();
    assert_eq!(s.gm.region_info(r).unwrap().attrs, Attrs(1));
    assert_eq!(
        s.gm.region_set_attrs(gmem_core::Pages::range(r.space, pages(r, 3, 2)), Attrs(9)),
        Err(ProtectError::Region(RegionError::Unallocated(page(r, 4))))
    );
    let memory = s.devices[g].memory.clone().unwrap();
    memory.take_frame_requests();
    s.take_events();
    for k in 0..4 {
        s.write(g, page(r, k), &[k as u8]).unwrap();
    }
    let want = |k: u64| if k == 2 { Attrs(5) } else { Attrs(1) };
    let requests = memory.take_frame_requests();
    assert_eq!(requests.len(), 4, "{requests:?}");
    for (k, q) in requests.iter().enumerate() {
        assert_eq!(q.va, page(r, k as u64));
        assert_eq!(q.attrs, want(k as u64));
        assert_eq!(q.device, Some(gid));
        assert_eq!(q.space, space);
    }
    let maps: Vec<(VirtAddr, Attrs)> = s
        .take_events()
        .iter()
        .filter_map(|e| match e {
            testing::MmuEvent::Map { run, .. } => Some((run.va, run.attrs)),
            _ => None,
        })
        .collect();
    assert_eq!(
        maps,
        (0..4).map(|k| (page(r, k), want(k))).collect::<Vec<_>>()
    );
    // A new value for the whole region (its pieces too) while its pages are mapped:
    // their mappings are made again with it.
    s.gm.region_set_attrs(r, Attrs(7)).unwrap();
    s.take_events();
    assert_eq!(s.read(g, page(r, 0), 1).unwrap(), [0]);
    assert_eq!(s.read(g, page(r, 2), 1).unwrap(), [2]);
    let maps: Vec<Attrs> = s
        .take_events()
        .iter()
        .filter_map(|e| match e {
            testing::MmuEvent::Map { run, .. } => Some(run.attrs),
            _ => None,
        })
        .collect();
    assert_eq!(
        maps,
        [Attrs(7), Attrs(7)],
        "the whole region, pieces included"
    );
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn a_preferred_placement_is_tried_first_then_any_frame_without_eviction() {
    let (mut s, space) = system();
    let g = attach(&mut s, space, DevCaps::FAULTABLE, 8);
    let gid = s.devices[g].id;
    let window = FrameConstraint {
        align: 0,
        phase: 0,
        nocross: 0,
        min: PhysAddr::new(GPU_BASE + 6 * PAGE_SIZE),
        max: PhysAddr::new(GPU_BASE + 7 * PAGE_SIZE - 1),
    };
    let memory = s.devices[g].memory.clone().unwrap();
    memory.set_frame_placement(FramePlacement::Prefer(window));
    let r =
        s.gm.as_alloc(space, AllocRequest::new(3 * PAGE_SIZE))
            .unwrap();
    for k in 0..3 {
        s.write(g, page(r, k), &[k as u8 + 1]).unwrap();
    }
    let frames: Vec<u64> = (0..3)
        .map(|k| s.devices[g].mmu.translate(page(r, k)).unwrap().pfn * PAGE_SIZE)
        .collect();
    assert_eq!(
        frames[0],
        GPU_BASE + 6 * PAGE_SIZE,
        "the preferred frame first"
    );
    assert!(frames[1..]
        .iter()
        .all(|&pa| (GPU_BASE..GPU_BASE + 8 * PAGE_SIZE).contains(&pa)));
    assert_eq!(s.gm.stats().evictions, 0, "a preference never evicts");
    assert_eq!(s.gm.dev_frames(gid).unwrap().active, 3);
    s.gm.check_invariants(space).unwrap();
}

/// Two adjacent regions and a hole after them: a range over both is split at the
/// boundary and acts on each; a range reaching the hole changes nothing.
#[test]
fn a_range_over_two_regions_acts_on_both_and_one_over_a_hole_on_neither() {
    let (mut s, space) = system();
    let g = attach(&mut s, space, DevCaps::FAULTABLE, 8);
    let gid = s.devices[g].id;
    let a = written(&s, space);
    let b = written(&s, space);
    assert_eq!(
        b.start.as_u64(),
        a.start.as_u64() + 4 * PAGE_SIZE,
        "adjacent"
    );
    // Pages 2..4 of `a` and 0..2 of `b`.
    let across = Pages::range(space, pages(a, 2, 4));
    // A range reaching past `b` into no region: refused whole, nothing changes.
    let over_hole = Pages::range(space, pages(b, 2, 4));
    let stats = s.gm.stats();
    assert_eq!(
        s.gm.region_protect(over_hole, Prot::READ),
        Err(ProtectError::Region(RegionError::Unallocated(page(b, 4))))
    );
    assert_eq!(
        s.gm.region_unmap(over_hole, MapFlags::empty(), None),
        Err(RegionError::Unallocated(page(b, 4)))
    );
    assert_eq!(s.gm.stats(), stats, "a refused range call changed nothing");
    assert!(!violation(s.write(0, page(b, 3), b"w")));
    // Protect across the boundary: both regions split; the rest stays writable.
    s.gm.region_protect(across, Prot::READ).unwrap();
    for (r, k, read_only) in [
        (a, 1, false),
        (a, 2, true),
        (a, 3, true),
        (b, 0, true),
        (b, 1, true),
        (b, 2, false),
    ] {
        assert_eq!(
            violation(s.write(0, page(r, k), b"w")),
            read_only,
            "{r:?} page {k}"
        );
    }
    s.gm.region_protect(across, Prot::RW).unwrap();
    s.gm.check_invariants(space).unwrap();
    // Migrate, wire and unwire across it.
    assert_eq!(
        s.gm.region_migrate(across, gid, MigrateScope::Populated)
            .unwrap(),
        4
    );
    for (r, k) in [(a, 2), (a, 3), (b, 0), (b, 1)] {
        assert_eq!(
            s.gm.as_page_frame(space, page(r, k))
                .unwrap()
                .map(|(m, _)| m),
            Some(gid)
        );
    }
    assert_eq!(
        s.gm.as_page_frame(space, page(a, 1))
            .unwrap()
            .map(|(m, _)| m),
        Some(s.host().id)
    );
    assert_eq!(s.gm.region_wire(across).unwrap(), 4);
    s.gm.region_unwire(across).unwrap();
    // An asynchronous unmap across it calls its callback once, after both pieces.
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = calls.clone();
    s.gm.region_unmap(
        across,
        MapFlags::ASYNC,
        Some(Box::new(move |result| {
            assert_eq!(result, Ok(()));
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })),
    )
    .unwrap();
    s.gm.as_synchronize(space).unwrap();
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Pages outside the range keep what was written last (`w` by the checks above).
    for (r, k, byte) in [(a, 1, b'w'), (a, 2, 0), (b, 1, 0), (b, 2, b'w')] {
        assert_eq!(s.read(0, page(r, k), 1).unwrap(), [byte], "{r:?} page {k}");
    }
    s.gm.check_invariants(space).unwrap();
}
