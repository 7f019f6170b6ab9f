//! Faults: first touch, typed errors, placement policies, migration, oversubscription.

use super::*;

#[test]
fn first_touch_zero_fills_maps_once_and_round_trips_bytes() {
    let (s, space) = system();
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    s.take_events();
    assert_eq!(s.read(0, r.start, 16).unwrap(), vec![0; 16]);
    let ev = s.take_events();
    assert!(
        matches!(&ev[..], [MmuEvent::Map { run, .. }] if run.va == r.start && run.len == PAGE_SIZE && run.prot == Prot::RW)
    );
    let data = pattern(1, 3 * PAGE_SIZE as usize);
    s.write(0, va(r.start.as_u64() + 100), &data).unwrap();
    assert_eq!(
        s.read(0, va(r.start.as_u64() + 100), data.len()).unwrap(),
        data
    );
    let st = s.gm.stats();
    assert_eq!(st.faults_zero_fill, 4);
    assert_eq!(st.pages_zeroed, 4);
    assert_eq!(s.gm.dev_frames(s.host().id).unwrap().active, 4);
    ok(&s, space);
}

#[test]
fn faults_alternating_between_regions_find_each_and_a_gap_is_not_allocated() {
    // The fault path remembers the last region it found: a fault elsewhere must not
    // be served from it, and a miss must still find the right region or none.
    let (s, space) = system();
    let host = s.host().id;
    let a =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    let b =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    let (lo, hi) = if a.start < b.start { (a, b) } else { (b, a) };
    for (r, k) in [(lo, 0), (hi, 0), (lo, 1), (hi, 1)] {
        let v = va(r.start.as_u64() + k * PAGE_SIZE);
        let res = s.gm.dev_fault(host, v, Prot::WRITE).unwrap();
        assert_eq!((res.kind, res.pages), (FaultKind::ZeroFill, 1));
    }
    assert_eq!(s.gm.stats().faults_zero_fill, 4);
    // Back in the first region (a hint miss), then past the end of the second.
    let again = s.gm.dev_fault(host, lo.start, Prot::READ).unwrap();
    assert_eq!(again.kind, FaultKind::Spurious);
    let past = va(hi.start.as_u64() + 2 * PAGE_SIZE);
    assert_eq!(
        s.gm.dev_fault(host, past, Prot::READ),
        Err(FaultError::NotAllocated(past))
    );
    ok(&s, space);
}

#[test]
fn fault_errors_are_typed_and_change_nothing() {
    let (mut s, space) = system();
    let host = s.host().id;
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let outside = va(r.start.as_u64() + PAGE_SIZE);
    assert_eq!(
        s.gm.dev_fault(host, outside, Prot::READ),
        Err(FaultError::NotAllocated(outside))
    );
    s.gm.region_protect(r, Prot::READ).unwrap();
    assert_eq!(
        s.gm.dev_fault(host, r.start, Prot::WRITE),
        Err(FaultError::ProtectionViolation {
            va: r.start,
            access: Prot::WRITE,
            allowed: Prot::READ
        })
    );
    let nf = s.add_device(GPU, DevCaps::empty(), 0, 0);
    let nf_id = s.devices[nf].id;
    assert_eq!(
        s.gm.dev_fault(nf_id, r.start, Prot::READ),
        Err(FaultError::NotFaultable(nf_id))
    );
    let idle = s.add_device(GPU, DevCaps::FAULTABLE, 0, 0);
    let idle_id = s.devices[idle].id;
    assert_eq!(
        s.gm.dev_fault(idle_id, r.start, Prot::READ),
        Err(FaultError::NotActive(idle_id))
    );
    // A driver failure leaves no frame behind.
    s.host().mmu.fail_next_maps(1);
    assert_eq!(
        s.gm.dev_fault(host, r.start, Prot::READ),
        Err(FaultError::Move(gmem_core::MoveError::Mmu(
            MmuError::OutOfTableMemory
        )))
    );
    assert_eq!(s.gm.dev_frames(host).unwrap().active, 0);
    assert_eq!(s.gm.stats().faults_failed, 5);
    ok(&s, space);
    s.gm.dev_destroy(idle_id).unwrap();
    assert_eq!(
        s.gm.dev_fault(idle_id, r.start, Prot::READ),
        Err(FaultError::UnknownDevice(idle_id))
    );
    // The host's slot under another generation is no host: a host fault borrows the
    // host only for its exact handle, any other goes through the registry.
    let stale_host = gmem_core::DeviceId::from_raw(host.index(), u32::MAX);
    assert_eq!(
        s.gm.dev_fault(stale_host, r.start, Prot::READ),
        Err(FaultError::UnknownDevice(stale_host))
    );
    assert_eq!(s.gm.dev_frames(host).unwrap().active, 0);
}

#[test]
fn unique_policy_migrates_after_tearing_down_and_invalidating_the_old_mapping() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 16);
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let data = pattern(7, PAGE_SIZE as usize);
    s.write(0, r.start, &data).unwrap();
    s.take_events();
    assert_eq!(
        s.read(g, r.start, data.len()).unwrap(),
        data,
        "bytes survive migration"
    );
    let ev = s.take_events();
    let unmap = ev
        .iter()
        .position(|e| matches!(e, MmuEvent::Unmap { mmu: 0, .. }))
        .expect("host mapping removed");
    let inval = ev
        .iter()
        .position(|e| matches!(e, MmuEvent::Invalidate { mmu: 0, .. }))
        .expect("host TLB invalidated");
    let map = ev
        .iter()
        .position(|e| matches!(e, MmuEvent::Map { mmu, .. } if *mmu == g as u32))
        .expect("GPU mapping");
    assert!(
        unmap < inval && inval < map,
        "unmap, then invalidate, then map: {ev:?}"
    );
    assert!(
        matches!(ev[map], MmuEvent::Map { run, .. } if run.memory == s.devices[g].id && run.pa.as_u64() >= GPU_BASE)
    );
    let st = s.gm.stats();
    assert_eq!((st.faults_migrate, st.bytes_host_to_dev), (1, PAGE_SIZE));
    assert_eq!(
        s.gm.dev_frames(s.host().id).unwrap().active,
        0,
        "the host frame was freed"
    );
    // And back: the CPU reads it, the page returns to host memory.
    assert_eq!(s.read(0, r.start, 8).unwrap(), data[..8]);
    assert_eq!(s.gm.stats().bytes_dev_to_host, PAGE_SIZE);
    assert!(
        !s.devices[g]
            .mmu
            .tlb_holds(s.devices[g].mmu.active_root().unwrap(), r.start),
        "GPU TLB shot down"
    );
    ok(&s, space);
}

#[test]
fn remote_access_maps_in_place_and_a_repeated_fault_migrates() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 16);
    let gid = s.devices[g].id;
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.gm.region_set_policy(
        r,
        Placement {
            target: PlacementTarget::Faulting,
            mode: PlacementMode::RemoteAccess,
        },
    )
    .unwrap();
    s.write(0, r.start, b"remote").unwrap();
    assert_eq!(s.read(g, r.start, 6).unwrap(), b"remote");
    assert_eq!(s.gm.stats().faults_remote, 1);
    assert_eq!(s.gm.stats().bytes_host_to_dev, 0, "no bytes moved");
    // Both keep their mappings: the CPU reads without faulting again.
    let faults = s.gm.stats().faults_zero_fill + s.gm.stats().faults_remote;
    assert_eq!(s.read(0, r.start, 6).unwrap(), b"remote");
    assert_eq!(
        s.gm.stats().faults_zero_fill + s.gm.stats().faults_remote,
        faults
    );
    // The driver reports a second fault on the remote page: migrate.
    let res = s.gm.dev_fault(gid, r.start, Prot::READ).unwrap();
    assert_eq!(res.kind, FaultKind::Migrated);
    assert_eq!(s.gm.stats().bytes_host_to_dev, PAGE_SIZE);
    assert_eq!(s.read(g, r.start, 6).unwrap(), b"remote");
    ok(&s, space);
}

#[test]
fn bulk_zeroing_prepares_a_whole_block_with_one_fault() {
    let (s, space) = system();
    let r =
        s.gm.as_alloc(
            space,
            AllocRequest {
                align: 1 << 21,
                ..AllocRequest::new(1 << 21)
            },
        )
        .unwrap();
    s.gm.region_set_zero_fill_block(r, 1 << 21).unwrap();
    assert_eq!(
        s.gm.region_set_zero_fill_block(r, 3 << 12),
        Err(PolicyError::BadZeroFillBlock(3 << 12))
    );
    s.take_events();
    let res =
        s.gm.dev_fault(
            s.host().id,
            va(r.start.as_u64() + 5 * PAGE_SIZE),
            Prot::WRITE,
        )
        .unwrap();
    assert_eq!(
        res,
        FaultResolution {
            kind: FaultKind::ZeroFill,
            pages: 512
        }
    );
    let ev = s.take_events();
    assert!(
        matches!(&ev[..], [MmuEvent::Map { run, .. }] if run.len == 1 << 21 && run.va == r.start)
    );
    assert_eq!(s.gm.stats().pages_zeroed, 512);
    // The rest of the block does not fault.
    s.write(0, va(r.start.as_u64() + 300 * PAGE_SIZE), b"x")
        .unwrap();
    assert_eq!(s.gm.stats().faults_zero_fill, 1);
    ok(&s, space);
    // Releasing single pages of the block gives them back one by one.
    s.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
    assert_eq!(s.gm.dev_frames(s.host().id).unwrap().active, 0);
    ok(&s, space);
}

#[test]
fn oversubscription_evicts_oldest_device_pages_to_host_and_keeps_bytes() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 4);
    let r =
        s.gm.as_alloc(space, AllocRequest::new(12 * PAGE_SIZE))
            .unwrap();
    let data = pattern(3, 12 * PAGE_SIZE as usize);
    s.write(g, r.start, &data).unwrap();
    let st = s.gm.stats();
    assert_eq!(st.evictions, 8);
    assert_eq!(st.bytes_dev_to_host, 8 * PAGE_SIZE);
    let f = s.gm.dev_frames(s.devices[g].id).unwrap();
    assert_eq!(f.active + f.inactive, 4);
    ok(&s, space);
    assert_eq!(
        s.read(0, r.start, data.len()).unwrap(),
        data,
        "CPU sees every byte"
    );
    assert_eq!(
        s.read(g, r.start, data.len()).unwrap(),
        data,
        "GPU sees every byte again"
    );
    ok(&s, space);
}

#[test]
fn named_placement_puts_cpu_faults_in_device_memory() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 8);
    let gid = s.devices[g].id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    let nomem = s.add_device(GPU, DevCaps::FAULTABLE, 0, 0);
    let nid = s.devices[nomem].id;
    let place = |t| Placement {
        target: t,
        mode: PlacementMode::Unique,
    };
    assert_eq!(
        s.gm.region_set_policy(r, place(PlacementTarget::Device(nid))),
        Err(PolicyError::NoMemory(nid))
    );
    s.gm.region_set_policy(r, place(PlacementTarget::Device(gid)))
        .unwrap();
    s.write(0, r.start, b"in vram").unwrap();
    assert_eq!(s.gm.dev_frames(gid).unwrap().active, 1);
    assert_eq!(s.read(0, r.start, 7).unwrap(), b"in vram");
    ok(&s, space);
}

#[test]
fn region_migrate_and_prefetch_move_pages_before_any_fault() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 8);
    let gid = s.devices[g].id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    s.write(0, r.start, b"hello").unwrap();
    assert_eq!(
        s.gm.region_migrate(r, gid, MigrateScope::Prefetch).unwrap(),
        4
    );
    assert_eq!(s.gm.dev_frames(gid).unwrap().active, 4);
    let before = s.gm.stats().faults_migrate;
    assert_eq!(s.read(g, r.start, 5).unwrap(), b"hello");
    assert_eq!(
        s.gm.stats().faults_migrate,
        before,
        "no migration on the GPU's fault"
    );
    ok(&s, space);
}

#[test]
fn stats_sum_every_space_and_keep_a_destroyed_space_s_counts_once() {
    // The fault path counts in its space's block; `stats` adds every live space's
    // block to the global counters and `as_destroy` folds a space's block into them.
    let (s, one) = system();
    let a =
        s.gm.as_alloc(one, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    s.write(0, a.start, &pattern(1, 2 * PAGE_SIZE as usize))
        .unwrap();
    let two =
        s.gm.as_create(va(3 << 30), va(4 << 30), AllocPolicy::empty())
            .unwrap();
    s.gm.as_attach(two, s.host().id, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let b = s.gm.as_alloc(two, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.write(0, b.start, b"b").unwrap();
    let all = s.gm.stats();
    assert_eq!(
        (all.faults_zero_fill, all.pages_zeroed, all.mmu_maps),
        (3, 3, 3)
    );
    s.gm.as_destroy(one).unwrap();
    let st = s.gm.stats();
    assert_eq!(
        (st.faults_zero_fill, st.pages_zeroed, st.mmu_maps),
        (3, 3, 3)
    );
    assert_eq!(
        s.gm.as_destroy(one),
        Err(SpaceError::UnknownSpace(one)),
        "a double destroy"
    );
    s.gm.as_destroy(two).unwrap();
    let st = s.gm.stats();
    assert_eq!(
        (st.faults_zero_fill, st.pages_zeroed, st.mmu_maps),
        (3, 3, 3)
    );
}

#[test]
fn a_fault_naming_no_access_on_a_page_of_no_access_is_refused_and_maps_nothing() {
    // `prot.contains(empty)` is true for every `prot`: the check must not let an
    // empty access through to a `map` with an empty protection.
    let (s, space) = system();
    let host = s.host().id;
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.gm.region_protect(r, Prot::empty()).unwrap();
    s.take_events();
    assert!(matches!(
        s.gm.dev_fault(host, r.start, Prot::empty()),
        Err(FaultError::ProtectionViolation { .. })
    ));
    assert!(
        !s.take_events()
            .iter()
            .any(|e| matches!(e, MmuEvent::Map { .. })),
        "a mapping that allows nothing was installed"
    );
    assert_eq!(s.gm.as_page_frame(space, r.start), Ok(None));
    ok(&s, space);
}
