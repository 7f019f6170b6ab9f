//! Access counters through the KPI (issue 35, item 6): hot remote-mapped regions
//! migrate to the accessing device with their bytes; misuse is a typed error that
//! counts nothing and moves nothing; a detached device's counts are forgotten.

use gmem_core::policy::counters::{AccessCounterConfig, AccessReport, CounterError};
use gmem_core::testing::TestSystem;
use gmem_core::*;

const GPU_BASE: u64 = 0x8000_0000;

fn va(x: u64) -> VirtAddr {
    VirtAddr::new(x)
}

/// A host and a GPU (64 pages) attached to one space [1 GiB, 2 GiB), and `regions`
/// adjacent remote-access regions of `pages` pages each, written by the CPU (page `i`
/// of the whole holds byte `i + 1`) and mapped remotely by the GPU (it read them).
fn system(regions: usize, pages: u64) -> (TestSystem, SpaceId, usize, Vec<Region>) {
    let mut s = TestSystem::new(256);
    let space = s.space();
    let gpu = s.add_device(2, DevCaps::FAULTABLE, GPU_BASE, 64);
    s.attach(space, gpu);
    let mut out = Vec::new();
    for _ in 0..regions {
        let r =
            s.gm.as_alloc(space, AllocRequest::new(pages * PAGE_SIZE))
                .unwrap();
        s.gm.region_set_policy(
            r,
            Placement {
                target: PlacementTarget::Faulting,
                mode: PlacementMode::RemoteAccess,
            },
        )
        .unwrap();
        out.push(r);
    }
    let first = out[0].start.as_u64();
    for i in 0..regions as u64 * pages {
        s.write(0, va(first + i * PAGE_SIZE), &[i as u8 + 1; 64])
            .unwrap();
        assert_eq!(
            s.read(gpu, va(first + i * PAGE_SIZE), 1).unwrap(),
            [i as u8 + 1]
        );
    }
    (s, space, gpu, out)
}

fn home(s: &TestSystem, space: SpaceId, at: u64) -> DeviceId {
    s.gm.as_page_frame(space, va(at)).unwrap().unwrap().0
}

#[test]
fn a_hot_range_over_two_regions_migrates_both_with_their_bytes() {
    let (s, space, gpu, regions) = system(2, 4);
    let gpu_id = s.devices[gpu].id;
    let first = regions[0].start.as_u64();
    // 64 KiB counting regions: both 16 KiB regions lie in one when aligned so.
    s.gm.as_set_access_counters(space, Some(AccessCounterConfig::new(64 << 10, 10).unwrap()))
        .unwrap();
    let lo = first & !((64 << 10) - 1);
    assert!(regions[1].start.as_u64() + 4 * PAGE_SIZE <= lo + (64 << 10));
    let report = |n| AccessReport {
        device: gpu_id,
        va: regions[1].start,
        count: n,
    };
    let done =
        s.gm.dev_report_accesses(space, &[report(4), report(5)])
            .unwrap();
    assert_eq!(done, AccessOutcome::default(), "9 < 10: nothing hot yet");
    assert_eq!(home(&s, space, first), s.gm.host());
    let done = s.gm.dev_report_accesses(space, &[report(1)]).unwrap();
    assert_eq!(
        (done.hot_regions, done.pages_migrated, done.failed),
        (1, 8, 0)
    );
    for i in 0..8u64 {
        let at = first + i * PAGE_SIZE;
        assert_eq!(home(&s, space, at), gpu_id, "page {i} moved");
        assert_eq!(s.read(gpu, va(at), 64).unwrap(), [i as u8 + 1; 64]);
        assert_eq!(s.read(0, va(at), 64).unwrap(), [i as u8 + 1; 64]);
    }
    let state = s.gm.as_access_counters(space).unwrap().unwrap();
    assert_eq!(
        (state.stats.reports, state.stats.accesses, state.stats.hot),
        (3, 10, 1)
    );
    assert_eq!(
        state.stats.resets, 1,
        "the migrated region's count starts again"
    );
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn misuse_is_a_typed_error_that_counts_and_moves_nothing() {
    let (mut s, space, gpu, regions) = system(1, 2);
    let gpu_id = s.devices[gpu].id;
    let at = regions[0].start;
    let ok = AccessReport {
        device: gpu_id,
        va: at,
        count: 1000,
    };
    // Counting off.
    assert_eq!(
        s.gm.dev_report_accesses(space, &[ok]),
        Err(AccessError::CountersOff(space))
    );
    s.gm.as_set_access_counters(space, Some(AccessCounterConfig::new(64 << 10, 10).unwrap()))
        .unwrap();
    // A device that exists but is not attached, one that is gone, an address outside
    // the space, a zero count: each after a valid report in the same batch.
    let other = s.add_device(3, DevCaps::FAULTABLE, GPU_BASE + (1 << 28), 8);
    let other_id = s.devices[other].id;
    let gone = s.add_device(4, DevCaps::FAULTABLE, GPU_BASE + (2 << 28), 8);
    let gone_id = s.devices[gone].id;
    s.gm.dev_destroy(gone_id).unwrap();
    let cases = [
        (
            AccessReport {
                device: other_id,
                ..ok
            },
            AccessError::NotAttached(other_id),
        ),
        (
            AccessReport {
                device: gone_id,
                ..ok
            },
            AccessError::UnknownDevice(gone_id),
        ),
        (
            AccessReport {
                va: va(3 << 30),
                ..ok
            },
            AccessError::Outside(va(3 << 30)),
        ),
        (
            AccessReport { count: 0, ..ok },
            AccessError::Counter(CounterError::ZeroCount { index: 1 }),
        ),
    ];
    for (bad, want) in cases {
        assert_eq!(s.gm.dev_report_accesses(space, &[ok, bad]), Err(want));
        let state = s.gm.as_access_counters(space).unwrap().unwrap();
        assert_eq!(state.stats.reports, 0, "nothing counted after {want:?}");
        assert_eq!(home(&s, space, at.as_u64()), s.gm.host(), "nothing moved");
    }
    // A stale space.
    let dead =
        s.gm.as_create(va(4 << 30), va(5 << 30), AllocPolicy::empty())
            .unwrap();
    s.gm.as_destroy(dead).unwrap();
    assert_eq!(
        s.gm.dev_report_accesses(dead, &[ok]),
        Err(AccessError::UnknownSpace(dead))
    );
    assert_eq!(
        s.gm.as_set_access_counters(dead, None),
        Err(AccessError::UnknownSpace(dead))
    );
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn a_detached_devices_counts_are_forgotten_and_counting_off_drops_them() {
    let (s, space, gpu, regions) = system(1, 1);
    let gpu_id = s.devices[gpu].id;
    let at = regions[0].start;
    s.gm.as_set_access_counters(space, Some(AccessCounterConfig::new(64 << 10, 10).unwrap()))
        .unwrap();
    let report = |n| AccessReport {
        device: gpu_id,
        va: at,
        count: n,
    };
    s.gm.dev_report_accesses(space, &[report(9)]).unwrap();
    s.gm.dev_detach(gpu_id, space).unwrap();
    s.gm.as_attach(space, gpu_id, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    // 9 were forgotten: one more is not enough.
    assert_eq!(
        s.gm.dev_report_accesses(space, &[report(1)])
            .unwrap()
            .hot_regions,
        0
    );
    assert_eq!(home(&s, space, at.as_u64()), s.gm.host());
    // Off and on again: the count starts from zero.
    s.gm.as_set_access_counters(space, None).unwrap();
    assert_eq!(s.gm.as_access_counters(space).unwrap(), None);
    s.gm.as_set_access_counters(space, Some(AccessCounterConfig::new(64 << 10, 10).unwrap()))
        .unwrap();
    assert_eq!(
        s.gm.dev_report_accesses(space, &[report(9)])
            .unwrap()
            .hot_regions,
        0
    );
    let done = s.gm.dev_report_accesses(space, &[report(1)]).unwrap();
    assert_eq!((done.hot_regions, done.pages_migrated), (1, 1));
    assert_eq!(home(&s, space, at.as_u64()), gpu_id);
    s.gm.check_invariants(space).unwrap();
}
