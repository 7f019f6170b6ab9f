//! Advice followed by the fault path (issue 35, item 5): a preferred location is where
//! a page is populated and stays, other processors mapping it there; an accessed-by
//! device maps a page where it lives instead of migrating it; taking the advice back
//! takes the shared mappings down; the batch path leaves advised pages to the
//! single-fault path. Bytes and invariants checked after every access.

use gmem_core::policy::advice::AdviceOp;
use gmem_core::policy::prefetch::PrefetchConfig;
use gmem_core::testing::TestSystem;
use gmem_core::*;

const GPU_BASE: u64 = 0x8000_0000;

/// A host and a GPU (32 pages) in one space, and a 4-page region.
fn system() -> (TestSystem, SpaceId, usize, Region) {
    let mut s = TestSystem::new(64);
    let gpu = s.add_device(2, DevCaps::FAULTABLE, GPU_BASE, 32);
    let space = s.space();
    s.attach(space, gpu);
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    (s, space, gpu, r)
}

fn home(s: &TestSystem, space: SpaceId, va: VirtAddr) -> DeviceId {
    s.gm.as_page_frame(space, va).unwrap().unwrap().0
}

fn migrations(s: &TestSystem) -> u64 {
    s.gm.stats().faults_migrate
}

#[test]
fn a_preferred_location_holds_the_page_and_the_other_device_maps_it_there() {
    let (s, space, gpu, r) = system();
    s.gm.region_advise(r, AdviceOp::SetPreferred(s.gm.host()))
        .unwrap();
    // First touch by the GPU populates the page at the preferred location.
    s.write(gpu, r.start, b"gpu first").unwrap();
    assert_eq!(home(&s, space, r.start), s.gm.host());
    let before = migrations(&s);
    for k in 0..6u8 {
        let dev = if k % 2 == 0 { 0 } else { gpu };
        s.write(dev, r.start, &[k; 4]).unwrap();
        assert_eq!(
            s.read(if dev == 0 { gpu } else { 0 }, r.start, 4).unwrap(),
            [k; 4]
        );
        s.gm.check_invariants(space).unwrap();
    }
    assert_eq!(migrations(&s), before, "nothing migrates");
    assert_eq!(home(&s, space, r.start), s.gm.host());
    // Taking the advice back takes the second mapping down; the page then migrates
    // on a fault as usual.
    s.gm.region_advise(r, AdviceOp::UnsetPreferred).unwrap();
    s.gm.check_invariants(space).unwrap();
    s.write(gpu, r.start, b"moved").unwrap();
    assert_eq!(home(&s, space, r.start), s.devices[gpu].id);
    assert_eq!(s.read(0, r.start, 5).unwrap(), b"moved");
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn a_gpu_preferred_location_takes_the_cpus_first_touch() {
    let (s, space, gpu, r) = system();
    let gpu_id = s.devices[gpu].id;
    s.gm.region_advise(r, AdviceOp::SetPreferred(gpu_id))
        .unwrap();
    s.write(0, r.start, b"cpu first").unwrap();
    assert_eq!(
        home(&s, space, r.start),
        gpu_id,
        "populated at the preferred GPU"
    );
    let before = migrations(&s);
    assert_eq!(s.read(gpu, r.start, 9).unwrap(), b"cpu first");
    assert_eq!(s.read(0, r.start, 9).unwrap(), b"cpu first");
    assert_eq!(migrations(&s), before);
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn an_accessed_by_device_maps_the_page_where_it_lives() {
    let (s, space, gpu, r) = system();
    let gpu_id = s.devices[gpu].id;
    s.write(0, r.start, b"host data").unwrap();
    s.gm.region_advise(r, AdviceOp::SetAccessedBy(gpu_id))
        .unwrap();
    let before = migrations(&s);
    assert_eq!(s.read(gpu, r.start, 9).unwrap(), b"host data");
    s.write(gpu, r.start, b"gpu wrote").unwrap();
    assert_eq!(s.read(0, r.start, 9).unwrap(), b"gpu wrote");
    assert_eq!(migrations(&s), before, "mapped remotely, not migrated");
    assert_eq!(home(&s, space, r.start), s.gm.host());
    s.gm.check_invariants(space).unwrap();
    // Unset: the GPU's remote mapping goes; its next access migrates.
    s.gm.region_advise(r, AdviceOp::UnsetAccessedBy(gpu_id))
        .unwrap();
    s.gm.check_invariants(space).unwrap();
    assert_eq!(s.read(gpu, r.start, 9).unwrap(), b"gpu wrote");
    assert_eq!(home(&s, space, r.start), gpu_id);
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn the_batch_path_leaves_advised_pages_to_the_single_fault_path() {
    let (s, space, gpu, r) = system();
    let gpu_id = s.devices[gpu].id;
    for k in 0..4 {
        s.write(
            0,
            VirtAddr::new(r.start.as_u64() + k * PAGE_SIZE),
            &[k as u8; 8],
        )
        .unwrap();
    }
    s.gm.dev_set_prefetch(gpu_id, Some(PrefetchConfig::default()))
        .unwrap();
    s.gm.region_advise(r, AdviceOp::SetAccessedBy(gpu_id))
        .unwrap();
    let before = migrations(&s);
    let records: Vec<BatchFault> = (0..4)
        .map(|k| BatchFault {
            va: VirtAddr::new(r.start.as_u64() + k * PAGE_SIZE),
            access: Prot::READ,
        })
        .collect();
    let report = s.gm.dev_fault_batch(gpu_id, &records).unwrap();
    assert_eq!(report.failed(), 0);
    assert_eq!(migrations(&s), before, "no page migrated past the advice");
    for k in 0..4u64 {
        let va = VirtAddr::new(r.start.as_u64() + k * PAGE_SIZE);
        assert_eq!(home(&s, space, va), s.gm.host());
        assert_eq!(s.read(gpu, va, 8).unwrap(), [k as u8; 8]);
    }
    s.gm.check_invariants(space).unwrap();
}
