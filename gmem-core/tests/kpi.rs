//! The KPI end to end on the test MMU: every call, its success and error paths, which
//! mappings and invalidations happened in which order, and the invariants after each
//! step.

use gmem_core::testing::{AccessError, MmuEvent, TestSystem};
use gmem_core::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const GPU_BASE: u64 = 0x8000_0000;
const GPU: u32 = 7; // a page-table format of its own

fn va(x: u64) -> VirtAddr {
    VirtAddr::new(x)
}

/// A host with 1024 pages, a space [1 GiB, 2 GiB) with the CPU attached and active.
fn system() -> (TestSystem, SpaceId) {
    let s = TestSystem::new(1024);
    let space =
        s.gm.as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
            .unwrap();
    s.gm.as_attach(space, s.host().id, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    (s, space)
}

fn gpu(s: &mut TestSystem, space: SpaceId, pages: u64) -> usize {
    let g = s.add_device(GPU, DevCaps::FAULTABLE, GPU_BASE, pages);
    s.gm.as_attach(
        space,
        s.devices[g].id,
        MmuMode::Coherent,
        Activation::Switch,
    )
    .unwrap();
    g
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn ok(s: &TestSystem, space: SpaceId) {
    s.gm.check_invariants(space).unwrap();
}

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
        Err(FaultError::Mmu(MmuError::OutOfTableMemory))
    );
    assert_eq!(s.gm.dev_frames(host).unwrap().active, 0);
    assert_eq!(s.gm.stats().faults_failed, 5);
    ok(&s, space);
    s.gm.dev_destroy(idle_id).unwrap();
    assert_eq!(
        s.gm.dev_fault(idle_id, r.start, Prot::READ),
        Err(FaultError::UnknownDevice(idle_id))
    );
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
    s.gm.as_attach(
        space,
        s.devices[io].id,
        MmuMode::Coherent,
        Activation::Switch,
    )
    .unwrap();
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
    s.gm.as_attach(
        space,
        s.devices[io].id,
        MmuMode::Coherent,
        Activation::Switch,
    )
    .unwrap();
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
    s.gm.as_attach(
        space,
        s.devices[io].id,
        MmuMode::Coherent,
        Activation::Switch,
    )
    .unwrap();
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

#[test]
fn stale_handles_and_double_frees_are_typed_errors() {
    let (s, space) = system();
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
    assert_eq!(
        s.gm.region_dealloc(r, MapFlags::empty(), None),
        Err(RegionError::StaleRegion(r))
    );
    assert_eq!(
        s.gm.region_unmap(r, MapFlags::empty(), None),
        Err(RegionError::StaleRegion(r))
    );
    assert_eq!(
        s.gm.region_protect(r, Prot::READ),
        Err(ProtectError::Region(RegionError::StaleRegion(r)))
    );
    let again = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    assert_eq!(again.start, r.start, "the range is reused");
    assert_eq!(
        s.gm.region_dealloc(r, MapFlags::empty(), None),
        Err(RegionError::StaleRegion(r)),
        "old handle still stale"
    );
    assert!(s.gm.region_info(again).is_ok());
    let other =
        s.gm.as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
            .unwrap();
    let elsewhere = s.gm.as_alloc(other, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.gm.as_destroy(other).unwrap();
    assert_eq!(
        s.gm.region_info(elsewhere),
        Err(RegionError::UnknownSpace(other)),
        "a region of a destroyed space"
    );
    assert!(s.gm.region_info(again).is_ok());
    ok(&s, space);
}

#[test]
fn dev_destroy_refuses_while_attached_or_holding_pages() {
    let (mut s, space) = system();
    assert_eq!(s.gm.dev_destroy(s.host().id), Err(DeviceError::IsHost));
    let g = gpu(&mut s, space, 4);
    let gid = s.devices[g].id;
    assert_eq!(
        s.gm.dev_destroy(gid),
        Err(DeviceError::StillAttached { spaces: 1 })
    );
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.write(g, r.start, b"v").unwrap();
    s.gm.dev_detach(gid, space).unwrap();
    assert_eq!(
        s.gm.dev_destroy(gid),
        Err(DeviceError::MemoryInUse { frames: 1 })
    );
    s.gm.region_migrate(r, s.host().id, MigrateScope::Populated)
        .unwrap();
    s.gm.dev_destroy(gid).unwrap();
    assert_eq!(s.gm.dev_destroy(gid), Err(DeviceError::UnknownDevice(gid)));
    assert_eq!(s.read(0, r.start, 1).unwrap(), b"v");
    ok(&s, space);
}

#[test]
fn a_destroyed_device_is_freed_and_no_space_keeps_it() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 4);
    let gid = s.devices[g].id;
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.write(g, r.start, b"v").unwrap();
    s.gm.dev_detach(gid, space).unwrap();
    s.gm.region_migrate(r, s.host().id, MigrateScope::Populated)
        .unwrap();
    // The core holds the device's MMU and memory while the device lives (the space
    // names its memory: a page lived there).
    let mmu = s.devices[g].mmu.clone();
    let mem = s.devices[g].memory.clone().unwrap();
    assert!(Arc::strong_count(&mmu) > 2 && Arc::strong_count(&mem) > 2);
    s.gm.dev_destroy(gid).unwrap();
    // Only the test system's and this test's references are left: the device record
    // was freed, and the space forgot the memory it once used.
    assert_eq!(Arc::strong_count(&mmu), 2);
    assert_eq!(Arc::strong_count(&mem), 2);
    assert_eq!(s.read(0, r.start, 1).unwrap(), b"v");
    ok(&s, space);
}

#[test]
fn dev_destroy_refuses_while_caller_frames_of_its_memory_are_mapped() {
    let (mut s, space) = system();
    let g = s.add_device(GPU, DevCaps::FAULTABLE, GPU_BASE, 4);
    let gid = s.devices[g].id;
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    // A frame of the device's address space outside the memory the core manages.
    let frame = [PhysAddr::new(GPU_BASE + 64 * PAGE_SIZE)];
    s.gm.region_map(r, MapRequest::new(&frame, gid)).unwrap();
    assert_eq!(
        s.gm.dev_destroy(gid),
        Err(DeviceError::MemoryInUse { frames: 1 })
    );
    // Refused without change: the device and its memory still serve.
    assert_eq!(s.gm.dev_frames(gid).unwrap().free, 4);
    s.gm.region_unmap(r, MapFlags::empty(), None).unwrap();
    s.gm.dev_destroy(gid).unwrap();
    ok(&s, space);
}

#[test]
fn protect_updates_tables_and_invalidates_then_allows_the_write() {
    let (s, space) = system();
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.write(0, r.start, b"rw").unwrap();
    s.gm.region_protect(r, Prot::READ).unwrap();
    assert!(matches!(
        s.write(0, r.start, b"no"),
        Err(AccessError::Fault(FaultError::ProtectionViolation { .. }))
    ));
    assert_eq!(s.read(0, r.start, 2).unwrap(), b"rw");
    s.gm.region_protect(r, Prot::RW).unwrap();
    s.write(0, r.start, b"ok").unwrap();
    assert_eq!(s.read(0, r.start, 2).unwrap(), b"ok");
    let junk = Prot::from_bits_retain(0x80);
    assert_eq!(
        s.gm.region_protect(r, junk),
        Err(ProtectError::BadProt(junk))
    );
    // No access: every access faults, the data stays.
    s.gm.region_protect(r, Prot::empty()).unwrap();
    ok(&s, space);
    assert!(matches!(
        s.read(0, r.start, 2),
        Err(AccessError::Fault(FaultError::ProtectionViolation { .. }))
    ));
    s.gm.region_protect(r, Prot::READ).unwrap();
    assert_eq!(s.read(0, r.start, 2).unwrap(), b"ok");
    ok(&s, space);
}

#[test]
fn detach_removes_the_devices_table_and_destroy_frees_everything() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 8);
    let gid = s.devices[g].id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    s.write(g, r.start, &pattern(9, 4 * PAGE_SIZE as usize))
        .unwrap();
    let tables = s.devices[g].mmu.store().tables();
    s.take_events();
    s.gm.dev_detach(gid, space).unwrap();
    let ev = s.take_events();
    let off = ev
        .iter()
        .position(|e| matches!(e, MmuEvent::Activate { root: None, .. }))
        .expect("deactivated");
    let gone = ev
        .iter()
        .position(|e| matches!(e, MmuEvent::Destroy { .. }))
        .expect("table destroyed");
    assert!(
        off < gone,
        "the device stops translating before its table is destroyed: {ev:?}"
    );
    assert_eq!(s.devices[g].mmu.store().tables(), tables - 1);
    assert_eq!(
        s.read(0, r.start, 4 * PAGE_SIZE as usize).unwrap(),
        pattern(9, 4 * PAGE_SIZE as usize)
    );
    ok(&s, space);
    s.gm.as_destroy(space).unwrap();
    let host = s.gm.dev_frames(s.host().id).unwrap();
    let dev = s.gm.dev_frames(gid).unwrap();
    assert_eq!((host.active, dev.active, dev.free), (0, 0, 8));
    assert_eq!(s.gm.dev_active(s.host().id).unwrap(), None);
}

#[test]
fn eviction_reclaims_pages_of_another_space_sharing_the_device() {
    let (mut s, a) = system();
    let g = gpu(&mut s, a, 4);
    let gid = s.devices[g].id;
    let b =
        s.gm.as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
            .unwrap();
    s.gm.as_attach(b, gid, MmuMode::Coherent, Activation::Leave)
        .unwrap();
    let ra = s.gm.as_alloc(a, AllocRequest::new(4 * PAGE_SIZE)).unwrap();
    s.write(g, ra.start, &pattern(1, 4 * PAGE_SIZE as usize))
        .unwrap();
    assert_eq!(
        s.gm.dev_frames(gid).unwrap().free,
        0,
        "space a filled the device"
    );
    s.gm.dev_switch(gid, b).unwrap();
    let rb = s.gm.as_alloc(b, AllocRequest::new(2 * PAGE_SIZE)).unwrap();
    s.write(g, rb.start, &pattern(2, 2 * PAGE_SIZE as usize))
        .unwrap();
    assert_eq!(
        s.gm.stats().evictions,
        2,
        "two pages of space a went to host memory"
    );
    s.gm.check_invariants(a).unwrap();
    s.gm.check_invariants(b).unwrap();
    assert_eq!(
        s.read(g, rb.start, 2 * PAGE_SIZE as usize).unwrap(),
        pattern(2, 2 * PAGE_SIZE as usize)
    );
    s.gm.dev_switch(gid, a).unwrap();
    assert_eq!(
        s.read(g, ra.start, 4 * PAGE_SIZE as usize).unwrap(),
        pattern(1, 4 * PAGE_SIZE as usize)
    );
    s.gm.check_invariants(a).unwrap();
    s.gm.check_invariants(b).unwrap();
}

#[test]
fn concurrent_faults_from_two_devices_keep_one_owner_and_every_byte() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 64);
    let r =
        s.gm.as_alloc(space, AllocRequest::new(128 * PAGE_SIZE))
            .unwrap();
    let s = Arc::new(s);
    // Each device owns alternate pages for writing, then both read everything: pages
    // migrate back and forth under the unique policy while the other thread faults.
    let writers: Vec<_> = [0usize, g]
        .into_iter()
        .enumerate()
        .map(|(k, dev)| {
            let s = s.clone();
            std::thread::spawn(move || {
                for p in (k as u64..128).step_by(2) {
                    let at = va(r.start.as_u64() + p * PAGE_SIZE);
                    s.write(dev, at, &pattern(p as u8, PAGE_SIZE as usize))
                        .unwrap();
                }
                for p in 0..128u64 {
                    let at = va(r.start.as_u64() + p * PAGE_SIZE);
                    let got = s.read(dev, at, PAGE_SIZE as usize);
                    // A page not yet written by the other thread reads as zeros.
                    let got = got.unwrap();
                    assert!(
                        got == pattern(p as u8, PAGE_SIZE as usize) || got.iter().all(|b| *b == 0),
                        "page {p}"
                    );
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    for p in 0..128u64 {
        let at = va(r.start.as_u64() + p * PAGE_SIZE);
        assert_eq!(
            s.read(0, at, PAGE_SIZE as usize).unwrap(),
            pattern(p as u8, PAGE_SIZE as usize)
        );
    }
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn wiring_pins_pages_replicates_them_and_unwiring_releases_them() {
    let (mut s, space) = system();
    let host = s.host().id;
    let io = s.add_device(GPU, DevCaps::empty(), 0, 0);
    s.gm.as_attach(
        space,
        s.devices[io].id,
        MmuMode::Coherent,
        Activation::Switch,
    )
    .unwrap();
    let g = gpu(&mut s, space, 2);
    let gid = s.devices[g].id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    s.write(0, r.start, b"pinned").unwrap();
    assert_eq!(
        s.read(io, r.start, 1),
        Err(AccessError::Unmapped(r.start)),
        "not wired yet"
    );
    assert_eq!(s.gm.region_wire(r).unwrap(), 4);
    assert_eq!(s.gm.dev_frames(host).unwrap().wired, 4);
    assert_eq!(
        s.read(io, r.start, 6).unwrap(),
        b"pinned",
        "replicated to the device that cannot fault"
    );
    ok(&s, space);
    // The GPU faults on the wired page: it is mapped where it is, not migrated.
    assert_eq!(s.read(g, r.start, 6).unwrap(), b"pinned");
    assert_eq!(s.gm.stats().faults_migrate, 0);
    assert_eq!(s.gm.dev_frames(gid).unwrap().active, 0);
    assert_eq!(
        s.gm.region_wire(r).unwrap(),
        0,
        "wiring twice wires nothing new"
    );
    s.gm.region_unwire(r).unwrap();
    assert_eq!(s.gm.dev_frames(host).unwrap().wired, 0);
    assert_eq!(
        s.read(io, r.start, 1),
        Err(AccessError::Unmapped(r.start)),
        "unwired pages leave the device"
    );
    ok(&s, space);
    // Wiring more than the target memory can hold fails and leaves nothing wired.
    let big =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    let on_gpu = Placement {
        target: PlacementTarget::Device(gid),
        mode: PlacementMode::Unique,
    };
    s.gm.region_set_policy(big, on_gpu).unwrap();
    assert!(matches!(
        s.gm.region_wire(big),
        Err(PopulateError::OutOfMemory(_))
    ));
    assert_eq!(s.gm.dev_frames(gid).unwrap().wired, 0);
    ok(&s, space);
}

#[test]
fn driver_frame_constraint_steers_placement_and_forces_eviction_inside_its_window() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 8);
    let lo = GPU_BASE + 4 * PAGE_SIZE;
    let hi = GPU_BASE + 6 * PAGE_SIZE;
    let window = FrameConstraint {
        align: 0,
        phase: 0,
        nocross: 0,
        min: PhysAddr::new(lo),
        max: PhysAddr::new(hi - 1),
    };
    s.devices[g]
        .memory
        .as_ref()
        .unwrap()
        .set_frame_placement(FramePlacement::Require(window));
    let r =
        s.gm.as_alloc(space, AllocRequest::new(3 * PAGE_SIZE))
            .unwrap();
    s.write(g, r.start, &pattern(4, 3 * PAGE_SIZE as usize))
        .unwrap();
    let mut in_window = 0;
    for p in 0..3 {
        if let Some(pte) = s.devices[g]
            .mmu
            .translate(va(r.start.as_u64() + p * PAGE_SIZE))
        {
            let pa = pte.pfn * PAGE_SIZE;
            if pa >= GPU_BASE {
                assert!((lo..hi).contains(&pa), "frame {pa:#x} outside the window");
                in_window += 1;
            }
        }
    }
    assert_eq!(
        in_window, 2,
        "a two-frame window holds two of the three pages"
    );
    assert_eq!(s.gm.stats().evictions, 1);
    assert_eq!(
        s.read(0, r.start, 3 * PAGE_SIZE as usize).unwrap(),
        pattern(4, 3 * PAGE_SIZE as usize)
    );
    ok(&s, space);
}

#[test]
fn writes_racing_with_migration_of_the_same_page_are_never_lost() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 64);
    const PAGES: u64 = 2;
    const ROUNDS: u32 = 2000;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(PAGES * PAGE_SIZE))
            .unwrap();
    let s = Arc::new(s);
    let half = (PAGE_SIZE / 2) as usize;
    let byte = |round: u32, dev: usize, p: u64| (round as u8) ^ (dev as u8 * 0x40) ^ p as u8;
    // The CPU owns the low half of two pages, the GPU the high half; each write by one
    // migrates the page away from the other (unique policy) while the other keeps
    // writing through the translation it holds: a migration that copied before it
    // invalidated would lose that write.
    let start = Arc::new(std::sync::Barrier::new(2));
    let threads: Vec<_> = [(0usize, 0u64), (g, PAGE_SIZE / 2)]
        .into_iter()
        .map(|(dev, offset)| {
            let s = s.clone();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                for round in 1..=ROUNDS {
                    for p in 0..PAGES {
                        let at = va(r.start.as_u64() + p * PAGE_SIZE + offset);
                        s.write(dev, at, &vec![byte(round, dev, p); half]).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for p in 0..PAGES {
        let page = s
            .read(0, va(r.start.as_u64() + p * PAGE_SIZE), PAGE_SIZE as usize)
            .unwrap();
        assert!(
            page[..half].iter().all(|b| *b == byte(ROUNDS, 0, p)),
            "page {p}: a CPU write was lost"
        );
        assert!(
            page[half..].iter().all(|b| *b == byte(ROUNDS, g, p)),
            "page {p}: a GPU write was lost"
        );
    }
    assert!(
        s.gm.stats().faults_migrate >= PAGES,
        "every page migrated at least once"
    );
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn dropping_the_instance_frees_devices_and_spaces() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 8);
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    s.write(g, r.start, b"bytes").unwrap();
    let mmu = Arc::downgrade(&s.devices[g].mmu);
    let memory = Arc::downgrade(s.devices[g].memory.as_ref().unwrap());
    drop(s);
    assert!(mmu.upgrade().is_none(), "the GPU's MMU was freed");
    assert!(memory.upgrade().is_none(), "the GPU's memory was freed");
}

// ----- failure atomicity ------------------------------------------------------------

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
        Err(FaultError::Mmu(MmuError::OutOfTableMemory))
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
        Err(FaultError::TooManyMemories(id)),
        "the 256th memory"
    );
    ok(&s, space);
    // Pages already placed keep working, and the host memory still serves faults.
    assert_eq!(s.read(0, r.start, 4).unwrap(), vec![0; 4]);
}

/// One hot page read between writes of a stream of cold pages, on a GPU with 8 frames:
/// returns, for each cold page after the first 8 evictions (warm-up), whether the hot
/// page was in GPU memory right after that cold page was written.
fn hot_page_residency(policy: EvictionPolicy) -> (Vec<bool>, Stats) {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 8);
    let gid = s.devices[g].id;
    s.gm.dev_set_eviction_policy(gid, policy).unwrap();
    let pages = 48;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(pages * PAGE_SIZE))
            .unwrap();
    let page = |k: u64| va(r.start.as_u64() + k * PAGE_SIZE);
    let hot = pattern(7, PAGE_SIZE as usize);
    s.write(g, page(0), &hot).unwrap();
    let mut resident = Vec::new();
    for c in 1..pages {
        assert_eq!(
            s.read(g, page(0), hot.len()).unwrap(),
            hot,
            "hot page bytes"
        );
        s.write(g, page(c), &pattern(c as u8, PAGE_SIZE as usize))
            .unwrap();
        ok(&s, space);
        if c > 16 {
            let root = s.devices[g].mmu.active_root().unwrap();
            let pte = s.devices[g].mmu.store().lookup(root, page(0).vpn().0);
            resident.push(pte.is_some_and(|p| p.memory == gid));
        }
    }
    for c in 1..pages {
        let want = pattern(c as u8, PAGE_SIZE as usize);
        assert_eq!(
            s.read(0, page(c), want.len()).unwrap(),
            want,
            "cold page {c}"
        );
    }
    (resident, s.gm.stats())
}

#[test]
fn clock_keeps_a_hot_page_that_fifo_evicts() {
    let (fifo, fs) = hot_page_residency(EvictionPolicy::Fifo);
    let (clock, cs) = hot_page_residency(EvictionPolicy::Clock);
    assert!(
        fifo.iter().any(|r| !r),
        "FIFO evicts the hot page once it is the oldest: {fifo:?}"
    );
    assert!(
        clock.iter().all(|r| *r),
        "CLOCK gives the referenced hot page a second chance on every scan: {clock:?}"
    );
    assert_eq!(
        (fs.second_chances, fs.pages_scanned, fs.evictions_clock),
        (0, 0, 0)
    );
    assert_eq!(fs.evictions_fifo, fs.evictions);
    assert!(cs.second_chances > 0 && cs.pages_scanned >= cs.second_chances);
    assert_eq!(cs.evictions_clock + cs.evictions_fifo, cs.evictions);
    assert!(
        cs.evictions < fs.evictions,
        "the hot page's round trips are saved: {} vs {}",
        cs.evictions,
        fs.evictions
    );
}

#[test]
fn migration_moves_a_contiguous_run_in_one_copy_and_keeps_bytes() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 64);
    let gid = s.devices[g].id;
    let pages = 32;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(pages * PAGE_SIZE))
            .unwrap();
    // One fault zero-fills the whole region on one contiguous host run.
    s.gm.region_set_zero_fill_block(r, pages * PAGE_SIZE)
        .unwrap();
    let data = pattern(11, (pages * PAGE_SIZE) as usize);
    s.write(0, r.start, &data).unwrap();
    assert_eq!(s.gm.stats().faults_zero_fill, 1);
    let host_mem = s.host().memory.clone().unwrap();
    let gpu_mem = s.devices[g].memory.clone().unwrap();
    let copies = host_mem.counts().copies;
    assert_eq!(
        s.gm.region_migrate(r, gid, MigrateScope::Populated)
            .unwrap(),
        pages
    );
    assert_eq!(host_mem.counts().copies - copies, 1, "one copy for the run");
    assert_eq!(s.gm.stats().bytes_host_to_dev, pages * PAGE_SIZE);
    ok(&s, space);
    assert_eq!(s.read(g, r.start, data.len()).unwrap(), data, "GPU sees it");
    // And back: the GPU's frames came as one run too.
    assert_eq!(
        s.gm.region_migrate(r, s.host().id, MigrateScope::Populated)
            .unwrap(),
        pages
    );
    assert_eq!(gpu_mem.counts().copies, 1);
    assert_eq!(s.gm.stats().bytes_dev_to_host, pages * PAGE_SIZE);
    ok(&s, space);
    assert_eq!(s.read(0, r.start, data.len()).unwrap(), data, "CPU sees it");
    // A target too full for the run falls back to pages (with eviction): bytes kept.
    let small = gpu(&mut s, space, 8);
    let sid = s.devices[small].id;
    assert_eq!(
        s.gm.region_migrate(r, sid, MigrateScope::Populated)
            .unwrap(),
        pages
    );
    let f = s.gm.dev_frames(sid).unwrap();
    assert_eq!((f.active + f.inactive, f.free), (8, 0));
    ok(&s, space);
    assert_eq!(s.read(0, r.start, data.len()).unwrap(), data);
}
