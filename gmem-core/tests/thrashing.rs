//! Thrashing detection and mitigation through the KPI (issue 35, item 3): a page two
//! devices write in turn is pinned (mapped remotely, no more migrations) or its
//! faulting device is throttled; pins end on `as_expire_pins` after their time and on
//! reconfiguration; bytes stay coherent and the invariants hold throughout (a pinned
//! unique page is the one allowed to have two mappings).

use gmem_core::policy::thrashing::{Mitigation, ThrashingConfig};
use gmem_core::testing::TestSystem;
use gmem_core::*;

const GPU_BASE: u64 = 0x8000_0000;

/// A host and a GPU (32 pages) in one space, and a one-page region.
fn system() -> (TestSystem, SpaceId, usize, Region) {
    let mut s = TestSystem::new(64);
    let gpu = s.add_device(2, DevCaps::FAULTABLE, GPU_BASE, 32);
    let space = s.space();
    s.attach(space, gpu);
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    (s, space, gpu, r)
}

fn home(s: &TestSystem, space: SpaceId, r: Region) -> DeviceId {
    s.gm.as_page_frame(space, r.start).unwrap().unwrap().0
}

/// Writes by the CPU and the GPU in turn, `rounds` of them (round `k` writes `k`),
/// each checked by reading it back through the other device.
fn ping_pong(s: &TestSystem, space: SpaceId, gpu: usize, r: Region, rounds: u8) {
    for k in 0..rounds {
        let (w, o) = if k % 2 == 0 { (0, gpu) } else { (gpu, 0) };
        s.write(w, r.start, &[k; 8]).unwrap();
        assert_eq!(s.read(o, r.start, 8).unwrap(), [k; 8], "round {k}");
        s.gm.check_invariants(space).unwrap();
    }
}

#[test]
fn a_ping_ponging_page_is_pinned_and_both_devices_keep_it_mapped() {
    let (s, space, gpu, r) = system();
    let config = ThrashingConfig::new(2, 10, 1, 1000, Mitigation::Pin).unwrap();
    s.gm.as_set_thrashing(space, Some(config)).unwrap();
    let before = s.gm.stats();
    ping_pong(&s, space, gpu, r, 12);
    let after = s.gm.stats();
    let state = s.gm.as_thrashing(space).unwrap().unwrap();
    assert_eq!((state.stats.detected, state.stats.pins), (1, 1));
    // Without detection every round migrates once (12, next test); pinned, only the
    // migrations before the pin happen.
    let migrated = after.faults_migrate - before.faults_migrate;
    assert!(migrated <= 4, "{migrated} migrations");
    // Pinned: both devices map it, so neither faults any more.
    let faults = s.gm.stats().faults_remote;
    ping_pong(&s, space, gpu, r, 4);
    assert_eq!(s.gm.stats().faults_remote, faults, "no fault while pinned");
    // A different pin time does not matter once detection goes off: the pin ends,
    // the mappings go, and the page migrates again on the next round.
    s.gm.as_set_thrashing(space, None).unwrap();
    s.gm.check_invariants(space).unwrap();
    let was = home(&s, space, r);
    let other = if was == s.gm.host() { gpu } else { 0 };
    s.write(other, r.start, &[99; 8]).unwrap();
    assert_ne!(
        home(&s, space, r),
        was,
        "migrates again once detection is off"
    );
    assert_eq!(s.read(0, r.start, 8).unwrap(), [99; 8]);
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn without_detection_every_round_migrates() {
    let (s, space, gpu, r) = system();
    let before = s.gm.stats();
    ping_pong(&s, space, gpu, r, 12);
    // The first write zero-fills in host memory; every read-back by the other device
    // moves it (the next round's writer then has it already).
    assert_eq!(s.gm.stats().faults_migrate - before.faults_migrate, 12);
    assert_eq!(s.gm.as_thrashing(space).unwrap(), None);
}

#[test]
fn a_throttled_device_is_told_to_retry_and_gets_the_page_in_a_later_period() {
    let (s, space, gpu, r) = system();
    let gpu_id = s.devices[gpu].id;
    let config = ThrashingConfig::new(2, 100, 3, 1000, Mitigation::Throttle).unwrap();
    s.gm.as_set_thrashing(space, Some(config)).unwrap();
    // Thrash it: the test system's accesses wait out `Throttled` answers.
    ping_pong(&s, space, gpu, r, 8);
    let state = s.gm.as_thrashing(space).unwrap().unwrap();
    assert_eq!(state.stats.detected, 1);
    assert!(state.stats.throttles > 0, "{:?}", state.stats);
    // Straight through the KPI: the device that is not the period's do-not-throttle
    // processor is answered Throttled and nothing changes.
    let mut throttled = 0;
    for _ in 0..8 {
        let holder = home(&s, space, r);
        let (dev, idx) = if holder == s.gm.host() {
            (gpu_id, gpu)
        } else {
            (s.gm.host(), 0)
        };
        let mapped_before = s.gm.stats().faults_migrate;
        match s.gm.dev_fault(dev, r.start, Prot::WRITE) {
            Err(FaultError::Throttled(va)) => {
                assert_eq!(va, r.start);
                assert_eq!(s.gm.stats().faults_migrate, mapped_before, "nothing moved");
                assert_eq!(home(&s, space, r), holder);
                throttled += 1;
                // The test system retries until the period ends.
                s.write(idx, r.start, &[7; 8]).unwrap();
            }
            Ok(_) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
        s.gm.check_invariants(space).unwrap();
    }
    assert!(throttled > 0);
    assert_eq!(s.read(0, r.start, 8).unwrap(), [7; 8]);
}

#[test]
fn a_pin_ends_after_its_time_on_expire_and_the_page_moves_again() {
    let (s, space, gpu, r) = system();
    // Pinned for 3 ticks of the migration clock.
    let config = ThrashingConfig::new(2, 10, 1, 3, Mitigation::Pin).unwrap();
    s.gm.as_set_thrashing(space, Some(config)).unwrap();
    ping_pong(&s, space, gpu, r, 6);
    assert_eq!(s.gm.as_thrashing(space).unwrap().unwrap().stats.pins, 1);
    assert_eq!(
        s.gm.as_expire_pins(space).unwrap(),
        0,
        "not yet: no tick since"
    );
    // Other pages migrating move the clock on.
    let q =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    for k in 0..4 {
        let at = VirtAddr::new(q.start.as_u64() + k * PAGE_SIZE);
        s.write(0, at, &[1]).unwrap();
        s.write(gpu, at, &[2]).unwrap();
    }
    assert_eq!(s.gm.as_expire_pins(space).unwrap(), 1);
    s.gm.check_invariants(space).unwrap();
    let state = s.gm.as_thrashing(space).unwrap().unwrap();
    assert_eq!(state.stats.unpins, 1);
    // Unmapped everywhere: the next access faults and is served as usual.
    let faults = s.gm.stats();
    assert_eq!(s.read(gpu, r.start, 8).unwrap(), [5; 8]);
    let after = s.gm.stats();
    assert_eq!(
        after.faults_migrate + after.faults_map_existing + after.faults_remote
            - faults.faults_migrate
            - faults.faults_map_existing
            - faults.faults_remote,
        1
    );
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn stale_space_handles_are_refused() {
    let (s, space, _, _) = system();
    s.gm.as_destroy(space).unwrap();
    let config = ThrashingConfig::new(2, 10, 1, 3, Mitigation::Pin).unwrap();
    assert_eq!(
        s.gm.as_set_thrashing(space, Some(config)),
        Err(SpaceError::UnknownSpace(space))
    );
    assert_eq!(
        s.gm.as_thrashing(space),
        Err(SpaceError::UnknownSpace(space))
    );
    assert_eq!(
        s.gm.as_expire_pins(space),
        Err(SpaceError::UnknownSpace(space))
    );
}

/// A platform whose clock the test sets.
struct Clock(std::sync::atomic::AtomicU64);

impl Platform for Clock {
    fn current_cpu(&self) -> usize {
        0
    }
    fn cpu_count(&self) -> usize {
        1
    }
    fn now_ns(&self) -> Option<u64> {
        Some(self.0.load(std::sync::atomic::Ordering::Relaxed))
    }
}

#[test]
fn with_a_platform_clock_only_migrations_within_the_lapse_thrash() {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    // UVM's defaults, in nanoseconds: threshold 3, lapse 500 us, pin 150 ms.
    let run = |gap_ns: u64| {
        let clock = Arc::new(Clock(0.into()));
        let mut s = TestSystem::with_platform(64, clock.clone());
        let gpu = s.add_device(2, DevCaps::FAULTABLE, GPU_BASE, 32);
        let space = s.space();
        s.attach(space, gpu);
        let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        let config = ThrashingConfig::new(3, 500_000, 500_000, 150_000_000, Mitigation::Pin);
        s.gm.as_set_thrashing(space, Some(config.unwrap())).unwrap();
        for k in 0..12u8 {
            clock.0.fetch_add(gap_ns, Ordering::Relaxed);
            s.write(if k % 2 == 0 { 0 } else { gpu }, r.start, &[k])
                .unwrap();
            s.gm.check_invariants(space).unwrap();
        }
        assert_eq!(s.read(0, r.start, 1).unwrap(), [11]);
        s.gm.as_thrashing(space).unwrap().unwrap().stats
    };
    // 100 us between accesses: thrashing, pinned.
    let quick = run(100_000);
    assert_eq!((quick.detected, quick.pins), (1, 1), "{quick:?}");
    // 1 ms between accesses: every migration is a new streak.
    let slow = run(1_000_000);
    assert_eq!((slow.detected, slow.pins), (0, 0), "{slow:?}");
    assert!(slow.migrations >= 11, "{slow:?}");
}
