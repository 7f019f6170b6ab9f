//! Failure atomicity: a call that fails part-way leaves no trace.

use super::*;

/// The protection every table holds for the pages of `r`.
fn table_prots(s: &TestSystem, devs: &[usize], r: &Region, pages: u64) -> Vec<Option<Prot>> {
    let mut out = Vec::new();
    for &d in devs {
        let mmu = &s.devices[d].mmu;
        let root = mmu.active_root().unwrap();
        for p in 0..pages {
            let vpn = r.start.vpn().0 + p;
            out.push(mmu.store().lookup(root, vpn).map(|e| e.prot));
        }
    }
    out
}

#[test]
fn a_protect_failing_half_way_restores_every_run_and_invalidates_them() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 16);
    let r =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    s.write(0, r.start, b"host").unwrap();
    s.gm.region_set_policy(
        r,
        Placement {
            target: PlacementTarget::Host,
            mode: PlacementMode::RemoteAccess,
        },
    )
    .unwrap();
    s.write(0, r.start.checked_add(PAGE_SIZE).unwrap(), b"host")
        .unwrap();
    s.read(g, r.start, 4).unwrap();
    s.read(g, r.start.checked_add(PAGE_SIZE).unwrap(), 4)
        .unwrap();
    let before = table_prots(&s, &[0, g], &r, 2);
    assert!(before.iter().all(|p| *p == Some(Prot::RW)), "{before:?}");
    s.take_events();
    // The host's table is protected first and succeeds; the GPU's fails half-way.
    s.devices[g].mmu.fail_next_protects(1);
    assert_eq!(
        s.gm.region_protect(r, Prot::READ),
        Err(ProtectError::Mmu(MmuError::OutOfTableMemory))
    );
    assert_eq!(
        table_prots(&s, &[0, g], &r, 2),
        before,
        "every run restored"
    );
    assert_eq!(s.gm.region_info(r).unwrap().prot, Prot::RW);
    let invalidated: Vec<u32> = s
        .take_events()
        .iter()
        .filter_map(|e| match e {
            MmuEvent::Invalidate { mmu, .. } => Some(*mmu),
            _ => None,
        })
        .collect();
    assert!(
        invalidated.contains(&0) && invalidated.contains(&(g as u32)),
        "both TLBs may hold the briefly changed protection: {invalidated:?}"
    );
    ok(&s, space);
    // And the call works once the driver does.
    s.gm.region_protect(r, Prot::READ).unwrap();
    assert!(table_prots(&s, &[0, g], &r, 2)
        .iter()
        .all(|p| *p == Some(Prot::READ)));
}

#[test]
fn a_zero_fill_whose_replica_fails_leaves_no_page_no_mapping_and_no_frame() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 16);
    let rep = s.add_device(9, DevCaps::FAULTABLE, 0, 0);
    s.gm.as_attach(
        space,
        s.devices[rep].id,
        MmuMode::Replicate,
        Activation::Leave,
    )
    .unwrap();
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.devices[rep].mmu.fail_next_maps(1);
    let gid = s.devices[g].id;
    assert_eq!(
        s.gm.dev_fault(gid, r.start, Prot::WRITE),
        Err(FaultError::Move(gmem_core::MoveError::Mmu(
            MmuError::OutOfTableMemory
        )))
    );
    let root = s.devices[g].mmu.active_root().unwrap();
    assert_eq!(
        s.devices[g].mmu.store().lookup(root, r.start.vpn().0),
        None,
        "the faulter's mapping is gone again"
    );
    assert_eq!(s.gm.dev_frames(gid).unwrap().active, 0, "the frame is free");
    ok(&s, space);
    // The next fault succeeds and the page is zero.
    assert_eq!(s.read(g, r.start, 8).unwrap(), vec![0; 8]);
    ok(&s, space);
}

#[test]
fn region_map_on_a_mapped_region_is_refused_before_draining_the_queue() {
    let (s, space) = system();
    let host = s.host().id;
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let frame = [PhysAddr::new(0x4000_0000)];
    s.gm.region_map(
        r,
        MapRequest {
            prot: Prot::RW,
            frames: &frame,
            memory: host,
            set: None,
            flags: MapFlags::empty(),
            callback: None,
        },
    )
    .unwrap();
    let other = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.write(0, other.start, b"x").unwrap();
    s.gm.region_dealloc(other, MapFlags::ASYNC, None).unwrap();
    assert_eq!(s.gm.as_pending(space).unwrap(), 1);
    s.take_events();
    assert_eq!(
        s.gm.region_map(
            r,
            MapRequest {
                prot: Prot::RW,
                frames: &frame,
                memory: host,
                set: None,
                flags: MapFlags::empty(),
                callback: None
            }
        ),
        Err(MapError::AlreadyMapped)
    );
    assert_eq!(
        s.gm.as_pending(space).unwrap(),
        1,
        "the queue was not drained"
    );
    assert!(s.take_events().is_empty(), "no MMU call for a refused map");
    ok(&s, space);
}

#[test]
fn a_space_refuses_a_memory_beyond_the_255_it_can_name() {
    let (mut s, space) = system();
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    // 254 device memories besides the host's fill every name a page entry has.
    let mut last = None;
    for k in 0..255u64 {
        let d = s.add_device(1, DevCaps::FAULTABLE, 0x10_0000_0000 + k * PAGE_SIZE * 4, 1);
        let id = s.devices[d].id;
        let rk = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        s.gm.region_set_policy(
            rk,
            Placement {
                target: PlacementTarget::Device(id),
                mode: PlacementMode::Unique,
            },
        )
        .unwrap();
        last = Some((id, s.gm.dev_fault(s.host().id, rk.start, Prot::READ)));
    }
    let (id, res) = last.unwrap();
    assert_eq!(
        res,
        Err(FaultError::Move(gmem_core::MoveError::TooManyMemories(id))),
        "the 256th memory"
    );
    ok(&s, space);
    // Pages already placed keep working, and the host memory still serves faults.
    assert_eq!(s.read(0, r.start, 4).unwrap(), vec![0; 4]);
}
