//! Spaces, attachment modes, switching, allocation with constraints, guard pages.

use super::*;

#[test]
fn as_create_rejects_bad_ranges_and_policies() {
    let s = TestSystem::new(16);
    assert!(matches!(
        s.gm.as_create(va(0x2000), va(0x1000), AllocPolicy::empty()),
        Err(SpaceError::BadRange(_))
    ));
    assert!(matches!(
        s.gm.as_create(va(0x1001), va(0x9000), AllocPolicy::empty()),
        Err(SpaceError::BadRange(_))
    ));
    let two = AllocPolicy::BEST_FIT | AllocPolicy::NEXT_FIT;
    assert_eq!(
        s.gm.as_create(va(0x1000), va(0x9000), two),
        Err(SpaceError::BadPolicy(two))
    );
    let sp =
        s.gm.as_create(va(0x1000), va(0x9000), AllocPolicy::FIRST_FIT)
            .unwrap();
    s.gm.as_destroy(sp).unwrap();
    assert_eq!(s.gm.as_destroy(sp), Err(SpaceError::UnknownSpace(sp)));
    assert_eq!(s.gm.as_synchronize(sp), Err(SpaceError::UnknownSpace(sp)));
}

#[test]
fn register_physmem_rejects_bad_ranges_and_leaves_memory_unchanged() {
    let mut s = TestSystem::new(16);
    let host = s.host().id;
    let before = s.gm.dev_frames(host).unwrap();
    let overlap = s.gm.dev_register_physmem(
        host,
        PhysAddr::new(testing::HOST_BASE),
        PhysAddr::new(testing::HOST_BASE + 0x2000),
    );
    assert!(matches!(overlap, Err(DeviceError::Register(_))));
    let unaligned =
        s.gm.dev_register_physmem(host, PhysAddr::new(0x100), PhysAddr::new(0x2000));
    assert!(matches!(unaligned, Err(DeviceError::Register(_))));
    assert_eq!(s.gm.dev_frames(host).unwrap(), before);
    let nomem = s.add_device(GPU, DevCaps::FAULTABLE, 0, 0);
    let id = s.devices[nomem].id;
    assert_eq!(
        s.gm.dev_register_physmem(id, PhysAddr::new(0x1000), PhysAddr::new(0x2000)),
        Err(DeviceError::NoMemoryInterface(id))
    );
    s.gm.dev_register_physmem(host, PhysAddr::new(0x4000_0000), PhysAddr::new(0x4000_4000))
        .unwrap();
    assert_eq!(
        s.gm.dev_frames(host).unwrap().registered,
        before.registered + 4
    );
}

#[test]
fn attach_modes_share_fall_back_and_reject_misuse() {
    let (mut s, space) = system();
    let host = s.host().id;
    assert_eq!(
        s.gm.as_attach(space, host, MmuMode::Coherent, Activation::Leave),
        Err(AttachError::AlreadyAttached)
    );
    // Same format as the host's table: the iGPU shares it.
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
    // A replicate table is never shared.
    let sp3 =
        s.gm.as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
            .unwrap();
    s.gm.as_attach(sp3, host, MmuMode::Replicate, Activation::Leave)
        .unwrap();
    assert_eq!(
        s.gm.as_attach(sp3, s.devices[igpu].id, MmuMode::Shared, Activation::Leave),
        Ok(MmuMode::Coherent)
    );
    // A second space where the CPU attaches shared first: the iGPU then shares it.
    let sp2 =
        s.gm.as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
            .unwrap();
    assert_eq!(
        s.gm.as_attach(sp2, host, MmuMode::Shared, Activation::Leave),
        Ok(MmuMode::Coherent)
    );
    assert_eq!(
        s.gm.as_attach(sp2, s.devices[igpu].id, MmuMode::Shared, Activation::Leave),
        Ok(MmuMode::Shared)
    );
    let dgpu = s.add_device(GPU, DevCaps::FAULTABLE, GPU_BASE, 8);
    assert_eq!(
        s.gm.as_attach(sp2, s.devices[dgpu].id, MmuMode::Shared, Activation::Leave),
        Ok(MmuMode::Coherent)
    );
    let stale =
        s.gm.as_create(va(0x1000), va(0x2000), AllocPolicy::empty())
            .unwrap();
    s.gm.as_destroy(stale).unwrap();
    assert_eq!(
        s.gm.as_attach(stale, host, MmuMode::Coherent, Activation::Leave),
        Err(AttachError::UnknownSpace(stale))
    );
    assert_eq!(
        s.gm.dev_detach(s.devices[dgpu].id, space),
        Err(AttachError::NotAttached)
    );
    assert_eq!(
        s.gm.dev_switch(s.devices[dgpu].id, space),
        Err(AttachError::NotAttached)
    );
    ok(&s, space);
    ok(&s, sp2);
}

#[test]
fn switch_activates_in_one_space_at_a_time() {
    let (s, space) = system();
    let host = s.host().id;
    let sp2 =
        s.gm.as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
            .unwrap();
    s.gm.as_attach(sp2, host, MmuMode::Coherent, Activation::Leave)
        .unwrap();
    assert_eq!(s.gm.dev_active(host).unwrap(), Some(space));
    s.gm.dev_switch(host, sp2).unwrap();
    assert_eq!(s.gm.dev_active(host).unwrap(), Some(sp2));
    // A fault now resolves in sp2, where nothing is allocated.
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    assert_eq!(
        s.gm.dev_fault(host, r.start, Prot::READ),
        Err(FaultError::NotAllocated(r.start))
    );
    s.gm.dev_detach(host, sp2).unwrap();
    assert_eq!(s.gm.dev_active(host).unwrap(), None);
    assert_eq!(
        s.gm.dev_fault(host, r.start, Prot::READ),
        Err(FaultError::NotActive(host))
    );
}

#[test]
fn as_alloc_honours_constraints_and_rejects_bad_arguments_without_change() {
    let (s, space) = system();
    let before = s.gm.as_arena_stats(space).unwrap();
    let bad = [
        AllocRequest::new(0),
        AllocRequest::new(100),
        AllocRequest {
            align: 3 * PAGE_SIZE,
            ..AllocRequest::new(PAGE_SIZE)
        },
        AllocRequest {
            nocross: 12288,
            ..AllocRequest::new(PAGE_SIZE)
        },
        AllocRequest {
            hint: va(0x1234),
            ..AllocRequest::new(PAGE_SIZE)
        },
    ];
    for req in bad {
        assert!(
            matches!(s.gm.as_alloc(space, req), Err(AllocError::BadArgument(_))),
            "{req:?}"
        );
    }
    assert!(matches!(
        s.gm.as_alloc(space, AllocRequest::new(2 << 30)),
        Err(AllocError::NoSpace { .. })
    ));
    assert_eq!(
        s.gm.as_arena_stats(space).unwrap().allocated,
        before.allocated
    );
    assert!(s.gm.as_regions(space).unwrap().is_empty());

    let a =
        s.gm.as_alloc(
            space,
            AllocRequest {
                align: 1 << 21,
                ..AllocRequest::new(3 * PAGE_SIZE)
            },
        )
        .unwrap();
    assert!(a.start.is_aligned(1 << 21));
    let n =
        s.gm.as_alloc(
            space,
            AllocRequest {
                nocross: 1 << 16,
                ..AllocRequest::new(8 * PAGE_SIZE)
            },
        )
        .unwrap();
    assert_eq!(
        n.start.as_u64() >> 16,
        (n.start.as_u64() + 8 * PAGE_SIZE - 1) >> 16
    );
    let m =
        s.gm.as_alloc(
            space,
            AllocRequest {
                max: va((1 << 30) + (64 << 20) - 1),
                ..AllocRequest::new(PAGE_SIZE)
            },
        )
        .unwrap();
    assert!(m.start.as_u64() + PAGE_SIZE <= (1 << 30) + (64 << 20));
    let h =
        s.gm.as_alloc(
            space,
            AllocRequest {
                hint: va((1 << 31) - (1 << 20)),
                ..AllocRequest::new(PAGE_SIZE)
            },
        )
        .unwrap();
    assert!(h.start.as_u64() >= (1 << 31) - (1 << 20));
    let info = s.gm.as_lookup(space, va(a.start.as_u64() + 5000)).unwrap();
    assert_eq!(info.region, a);
    assert_eq!(info.range.len, 3 * PAGE_SIZE);
    assert_eq!(
        s.gm.as_lookup(space, va(a.start.as_u64() + 3 * PAGE_SIZE))
            .map(|i| i.region)
            .ok()
            .filter(|r| *r == a),
        None
    );
    ok(&s, space);
}

#[test]
fn guarded_regions_keep_an_unmapped_page_on_each_side() {
    let s = TestSystem::new(64);
    let space =
        s.gm.as_create(
            va(1 << 20),
            va(2 << 20),
            AllocPolicy::GUARDED | AllocPolicy::FIRST_FIT,
        )
        .unwrap();
    s.gm.as_attach(space, s.host().id, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let a =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    let b =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    assert_eq!(a.start.as_u64(), (1 << 20) + PAGE_SIZE);
    assert_eq!(
        b.start.as_u64(),
        a.start.as_u64() + 4 * PAGE_SIZE,
        "b's guard follows a's guard"
    );
    let guard = va(a.start.as_u64() + 2 * PAGE_SIZE);
    assert_eq!(
        s.gm.dev_fault(s.host().id, guard, Prot::WRITE),
        Err(FaultError::NotAllocated(guard))
    );
    s.gm.region_dealloc(a, MapFlags::empty(), None).unwrap();
    s.gm.region_dealloc(b, MapFlags::empty(), None).unwrap();
    assert_eq!(s.gm.as_arena_stats(space).unwrap().allocated, 0);
}

#[test]
fn injected_allocation_failure_is_typed_and_harmless() {
    let (s, space) = system();
    s.gm.as_fail_every(space, 1).unwrap();
    assert_eq!(
        s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)),
        Err(AllocError::Injected)
    );
    s.gm.as_fail_every(space, 0).unwrap();
    s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    ok(&s, space);
}
