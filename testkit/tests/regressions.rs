//! Minimized findings of the runners and fuzz targets, replayed on every `cargo test`.
//!
//! A finding whose fix is outside this crate stays here as a `should_panic` test that
//! states the bug; when the core is fixed the test fails, and it then becomes an
//! ordinary test (drop the attribute) and the runner's workaround goes.

use gmem_core::testing::TestSystem;
use gmem_core::*;

/// Found by the seeded KPI runner (seed 54): `region_set_policy` switching a region
/// from remote access back to unique leaves its pages mapped by the tables of both
/// devices that mapped them remotely, and `check_invariants` (invariant 1: a page of
/// a unique-policy region is mapped by at most one table) rejects the state. The fix
/// belongs in `gmem-core/src/gmem.rs` (`region_set_policy`): when the mode becomes
/// unique, tear down (unmap + invalidate) every mapping of each page but one, or all
/// of them and let the next fault map the page again.
#[test]
#[should_panic(expected = "unique page mapped by more than one page table")]
fn set_policy_back_to_unique_leaves_a_page_mapped_by_two_tables() {
    let mut s = TestSystem::new(64);
    let space =
        s.gm.as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new((1 << 30) + 64 * PAGE_SIZE),
            AllocPolicy::empty(),
        )
        .unwrap();
    s.gm.as_attach(space, s.host().id, MmuMode::Coherent, true)
        .unwrap();
    let gpu = s.add_device(7, DevCaps::FAULTABLE, 0x8000_0000, 8);
    s.gm.as_attach(space, s.devices[gpu].id, MmuMode::Coherent, true)
        .unwrap();
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let remote = Placement {
        target: PlacementTarget::Host,
        mode: PlacementMode::RemoteAccess,
    };
    s.gm.region_set_policy(r, remote).unwrap();
    s.write(0, r.start, b"x").unwrap();
    assert_eq!(s.read(gpu, r.start, 1).unwrap(), b"x", "remote mapping");
    s.gm.check_invariants(space).unwrap();
    s.gm.region_set_policy(r, Placement::default()).unwrap();
    if let Err(v) = s.gm.check_invariants(space) {
        panic!("{v}");
    }
}

/// Every input kept in `testkit/regressions/<runner>/` (minimized fuzz findings) still
/// passes its runner. A file's name says what it found (see the README there).
fn replay_dir(runner: &str, f: fn(&[u8]) -> gmem_testkit::Summary) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(runner);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("regressions directory") {
        let path = entry.expect("directory entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            continue;
        }
        let data = std::fs::read(&path).expect("regression input");
        let r = std::panic::catch_unwind(|| f(&data));
        assert!(r.is_ok(), "{} fails again", path.display());
        n += 1;
    }
    assert!(n > 0, "no inputs in {}", dir.display());
}

#[test]
fn fuzz_findings_of_the_vmem_target_stay_fixed() {
    replay_dir("vmem", gmem_testkit::replay_vmem);
}
