//! Caller-frame and wired mappings, the asynchronous queue, mapping sets, shared
//! tables and replication.

use super::*;

fn external_frames(n: u64) -> Vec<PhysAddr> {
    (0..n)
        .map(|i| PhysAddr::new(0x7000_0000 + i * PAGE_SIZE))
        .collect()
}

#[test]
fn wired_map_replicates_to_devices_that_cannot_fault_and_unmap_removes_everywhere() {
    let (mut s, space) = system();
    let host = s.host().id;
    let io = s.add_device(GPU, DevCaps::empty(), 0, 0);
    s.attach(space, io);
    let r =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    assert_eq!(
        s.gm.region_map(
            r,
            MapRequest {
                prot: Prot::RW,
                frames: &external_frames(1),
                memory: host,
                set: None,
                flags: MapFlags::empty(),
                callback: None
            }
        ),
        Err(MapError::FrameCount {
            expected: 2,
            given: 1
        })
    );
    let managed = PhysAddr::new(testing::HOST_BASE);
    assert_eq!(
        s.gm.region_map(
            r,
            MapRequest {
                prot: Prot::RW,
                frames: &[managed, managed],
                memory: host,
                set: None,
                flags: MapFlags::empty(),
                callback: None
            }
        ),
        Err(MapError::BadFrame(managed))
    );
    s.take_events();
    s.gm.region_map(
        r,
        MapRequest {
            prot: Prot::RW,
            frames: &external_frames(2),
            memory: host,
            set: None,
            flags: MapFlags::empty(),
            callback: None,
        },
    )
    .unwrap();
    let ev = s.take_events();
    assert!(
        matches!(&ev[..], [MmuEvent::Map { mmu, run, .. }] if *mmu == io as u32 && run.len == 2 * PAGE_SIZE)
    );
    assert_eq!(
        s.gm.region_map(
            r,
            MapRequest {
                prot: Prot::RW,
                frames: &external_frames(2),
                memory: host,
                set: None,
                flags: MapFlags::empty(),
                callback: None
            }
        ),
        Err(MapError::AlreadyMapped)
    );
    s.write(io, r.start, b"dma").unwrap();
    assert_eq!(
        s.read(0, r.start, 3).unwrap(),
        b"dma",
        "the CPU faults the wired page in"
    );
    ok(&s, space);
    s.gm.region_unmap(r, MapFlags::empty(), None).unwrap();
    assert_eq!(s.read(io, r.start, 1), Err(AccessError::Unmapped(r.start)));
    assert_eq!(
        s.gm.dev_fault(host, r.start, Prot::READ),
        Err(FaultError::NotMapped(r.start))
    );
    ok(&s, space);
}

#[test]
fn async_unmaps_coalesce_into_one_invalidation_and_release_only_after_it() {
    let (s, space) = system();
    let host = s.host().id;
    let done = Arc::new(AtomicUsize::new(0));
    let mut regions = Vec::new();
    for _ in 0..3 {
        let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        s.write(0, r.start, b"x").unwrap();
        regions.push(r);
    }
    let frames_before = s.gm.dev_frames(host).unwrap();
    s.take_events();
    for r in &regions {
        let d = done.clone();
        s.gm.region_dealloc(
            *r,
            MapFlags::ASYNC,
            Some(Box::new(move |res| {
                assert!(res.is_ok());
                d.fetch_add(1, Ordering::SeqCst);
            })),
        )
        .unwrap();
    }
    let ev = s.take_events();
    assert_eq!(
        ev.iter()
            .filter(|e| matches!(e, MmuEvent::Unmap { .. }))
            .count(),
        3,
        "entries cleared at once"
    );
    assert!(
        !ev.iter().any(|e| matches!(e, MmuEvent::Invalidate { .. })),
        "no invalidation yet"
    );
    assert_eq!(done.load(Ordering::SeqCst), 0);
    assert_eq!(
        s.gm.dev_frames(host).unwrap().pending,
        3,
        "frames quarantined"
    );
    assert_eq!(
        s.gm.as_lookup(space, regions[0].start),
        Err(LookupError::NotAllocated(regions[0].start))
    );
    // The ranges are not handed out again before the invalidation.
    let fresh = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    assert!(regions.iter().all(|r| r.start != fresh.start));
    ok(&s, space);
    s.gm.as_synchronize(space).unwrap();
    let ev = s.take_events();
    let inv: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            MmuEvent::Invalidate { ranges, .. } => Some(ranges.len()),
            _ => None,
        })
        .collect();
    assert_eq!(inv, vec![3], "one invalidation with three ranges");
    assert_eq!(done.load(Ordering::SeqCst), 3, "each callback exactly once");
    assert_eq!(s.gm.stats().invalidations_coalesced, 2);
    let after = s.gm.dev_frames(host).unwrap();
    // Frames go back to their superpage reservation, which dissolves into the free
    // pool once all of its frames are back.
    assert_eq!(
        (after.pending, after.free + after.reserved),
        (0, frames_before.free + frames_before.reserved + 3)
    );
    ok(&s, space);
    s.gm.as_synchronize(space).unwrap();
    assert_eq!(done.load(Ordering::SeqCst), 3);
}

#[test]
fn queue_drains_itself_at_its_batch_limit_and_before_touching_a_pending_page() {
    let (s, space) = system();
    s.gm.as_set_batch_limit(space, 2).unwrap();
    let a = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let b = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.write(0, a.start, b"a").unwrap();
    s.write(0, b.start, b"b").unwrap();
    s.gm.region_unmap(a, MapFlags::ASYNC, None).unwrap();
    assert_eq!(s.gm.as_pending(space).unwrap(), 1);
    // The CPU's TLB may still translate the page until the invalidation (that is what
    // deferral means), but a fault on the pending page drains the queue first, then
    // zero-fills it again.
    let res = s.gm.dev_fault(s.host().id, a.start, Prot::READ).unwrap();
    assert_eq!(res.kind, FaultKind::ZeroFill);
    assert_eq!(s.read(0, a.start, 1).unwrap(), [0]);
    assert_eq!(s.gm.as_pending(space).unwrap(), 0);
    s.gm.region_unmap(a, MapFlags::ASYNC, None).unwrap();
    s.gm.region_unmap(b, MapFlags::ASYNC, None).unwrap();
    assert_eq!(
        s.gm.as_pending(space).unwrap(),
        0,
        "the second request hit the limit"
    );
    ok(&s, space);
}

#[test]
fn async_map_reaches_non_faultable_devices_when_the_queue_drains() {
    let (mut s, space) = system();
    let io = s.add_device(GPU, DevCaps::empty(), 0, 0);
    s.attach(space, io);
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    s.gm.region_map(
        r,
        MapRequest {
            prot: Prot::READ,
            frames: &external_frames(1),
            memory: s.host().id,
            set: None,
            flags: MapFlags::ASYNC,
            callback: Some(Box::new(move |_| {
                d.fetch_add(1, Ordering::SeqCst);
            })),
        },
    )
    .unwrap();
    assert_eq!(s.read(io, r.start, 1), Err(AccessError::Unmapped(r.start)));
    s.gm.as_synchronize(space).unwrap();
    assert_eq!(done.load(Ordering::SeqCst), 1);
    assert_eq!(s.read(io, r.start, 1).unwrap(), [0]);
    ok(&s, space);
}

#[test]
fn mapping_set_unmap_unmaps_every_member_with_one_callback() {
    let (mut s, space) = system();
    let host = s.host().id;
    let io = s.add_device(GPU, DevCaps::empty(), 0, 0);
    s.attach(space, io);
    let set = s.gm.mapping_set_create(space).unwrap();
    let mut regions = Vec::new();
    for i in 0..3u64 {
        let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        let f = [PhysAddr::new(0x7000_0000 + i * PAGE_SIZE)];
        s.gm.region_map(
            r,
            MapRequest {
                prot: Prot::RW,
                frames: &f,
                memory: host,
                set: Some(set),
                flags: MapFlags::empty(),
                callback: None,
            },
        )
        .unwrap();
        regions.push(r);
    }
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    s.gm.mapping_set_unmap(
        space,
        set,
        MapFlags::ASYNC,
        Some(Box::new(move |_| {
            d.fetch_add(1, Ordering::SeqCst);
        })),
    )
    .unwrap();
    assert_eq!(done.load(Ordering::SeqCst), 0);
    s.gm.as_synchronize(space).unwrap();
    assert_eq!(done.load(Ordering::SeqCst), 1);
    for r in &regions {
        assert_eq!(s.read(io, r.start, 1), Err(AccessError::Unmapped(r.start)));
        assert!(!s.gm.region_info(*r).unwrap().mapped);
    }
    s.gm.mapping_set_destroy(space, set).unwrap();
    assert_eq!(
        s.gm.mapping_set_unmap(space, set, MapFlags::empty(), None),
        Err(SetError::UnknownSet(set))
    );
    ok(&s, space);
}

#[test]
fn shared_table_serves_both_devices_and_invalidates_both_tlbs() {
    let mut s = TestSystem::new(64);
    let space =
        s.gm.as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
            .unwrap();
    s.gm.as_attach(space, s.host().id, MmuMode::Shared, Activation::Switch)
        .unwrap();
    let igpu = s.add_device(1, DevCaps::FAULTABLE, 0, 0);
    assert_eq!(
        s.gm.as_attach(
            space,
            s.devices[igpu].id,
            MmuMode::Shared,
            Activation::Switch
        ),
        Ok(MmuMode::Shared)
    );
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.write(0, r.start, b"shared").unwrap();
    let faults = s.gm.stats();
    assert_eq!(s.read(igpu, r.start, 6).unwrap(), b"shared");
    assert_eq!(
        s.gm.stats(),
        faults,
        "the iGPU walked the same table: no fault"
    );
    s.take_events();
    s.gm.region_unmap(r, MapFlags::empty(), None).unwrap();
    let ev = s.take_events();
    let invalidated: Vec<u32> = ev
        .iter()
        .filter_map(|e| match e {
            MmuEvent::Invalidate { mmu, .. } => Some(*mmu),
            _ => None,
        })
        .collect();
    assert_eq!(invalidated.len(), 2);
    assert!(invalidated.contains(&0) && invalidated.contains(&(igpu as u32)));
    assert_eq!(
        ev.iter()
            .filter(|e| matches!(e, MmuEvent::Unmap { .. }))
            .count(),
        1,
        "one table, one unmap"
    );
    ok(&s, space);
}

#[test]
fn replicate_mode_mirrors_every_populated_page_and_follows_migration() {
    let (mut s, space) = system();
    let r =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    s.write(0, r.start, b"early").unwrap();
    let rep = s.add_device(GPU, DevCaps::empty(), 0, 0);
    s.gm.as_attach(
        space,
        s.devices[rep].id,
        MmuMode::Replicate,
        Activation::Switch,
    )
    .unwrap();
    assert_eq!(
        s.read(rep, r.start, 5).unwrap(),
        b"early",
        "filled at attach"
    );
    s.write(0, va(r.start.as_u64() + PAGE_SIZE), b"late")
        .unwrap();
    assert_eq!(
        s.read(rep, va(r.start.as_u64() + PAGE_SIZE), 4).unwrap(),
        b"late",
        "mirrored on population"
    );
    let g = gpu(&mut s, space, 4);
    s.write(g, r.start, b"moved").unwrap();
    assert_eq!(
        s.read(rep, r.start, 5).unwrap(),
        b"moved",
        "mirror follows the migrated frame"
    );
    ok(&s, space);
}
