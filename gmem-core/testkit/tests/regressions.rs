//! Minimized findings of the runners and fuzz targets, replayed on every `cargo test`.
//!
//! A finding whose fix is outside this crate stays here as a `should_panic` test that
//! states the bug; when the core is fixed the test fails, and it then becomes an
//! ordinary test (drop the attribute) and the runner's workaround goes. Both findings
//! below are fixed in the core and are ordinary regression tests now.

use gmem_core::testing::TestSystem;
use gmem_core::*;

/// Found by the seeded KPI runner (seed 54), fixed: `region_set_policy` switching a
/// region from remote access back to unique left its pages mapped by the tables of both
/// devices that mapped them remotely, and `check_invariants` (invariant 1: a page of
/// a unique-policy region is mapped by at most one table) rejects the state. The fix
/// belongs in `gmem-core/src/gmem.rs` (`region_set_policy`): when the mode becomes
/// unique, tear down (unmap + invalidate) every mapping of each page but one, or all
/// of them and let the next fault map the page again.
#[test]
fn set_policy_back_to_unique_leaves_no_page_mapped_by_two_tables() {
    let mut s = TestSystem::new(64);
    let space =
        s.gm.as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new((1 << 30) + 64 * PAGE_SIZE),
            AllocPolicy::empty(),
        )
        .unwrap();
    s.gm.as_attach(space, s.host().id, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let gpu = s.add_device(7, DevCaps::FAULTABLE, 0x8000_0000, 8);
    s.gm.as_attach(
        space,
        s.devices[gpu].id,
        MmuMode::Coherent,
        Activation::Switch,
    )
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

/// Every input kept in `gmem-core/testkit/regressions/<runner>/` (minimized fuzz findings) still
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

#[test]
fn fuzz_findings_of_the_kpi_target_stay_fixed() {
    replay_dir("kpi", gmem_testkit::replay_kpi);
}

/// Found by the `kpi` fuzz target after about 7 minutes (input
/// `regressions/kpi/crash-ac43363b...`, minimized here): a device that cannot fault is
/// attached while an asynchronous `region_map` is still queued. `fill_table` skips the
/// queued (pending) pages, and the drain mirrors the map only into the tables in the
/// mask it captured at enqueue time, which does not include the new table. After the
/// drain the device's table misses the wired page: `check_invariants` reports it and
/// the device cannot reach memory it was mapped. The fix belongs in the core: the
/// drain of a queued map (`gmem-core/src/queue.rs`, `Op::Map`) should mirror into the
/// space's current `wired_mask()`, or `as_attach` (`gmem.rs`) should drain the queue
/// before `fill_table`. The same holds for a replicate-mode table.
#[test]
fn a_device_that_cannot_fault_attached_during_a_queued_map_gets_the_page() {
    let mut s = TestSystem::new(16);
    let space =
        s.gm.as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new((1 << 30) + 16 * PAGE_SIZE),
            AllocPolicy::empty(),
        )
        .unwrap();
    s.gm.as_attach(space, s.host().id, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let io = s.add_device(9, DevCaps::empty(), 0, 0);
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let frame = [PhysAddr::new(0x7000_0000)];
    s.gm.region_map(
        r,
        MapRequest {
            prot: Prot::RW,
            frames: &frame,
            memory: s.host().id,
            set: None,
            flags: MapFlags::ASYNC,
            callback: None,
        },
    )
    .unwrap();
    s.gm.as_attach(
        space,
        s.devices[io].id,
        MmuMode::Coherent,
        Activation::Switch,
    )
    .unwrap();
    s.gm.as_synchronize(space).unwrap();
    if let Err(v) = s.gm.check_invariants(space) {
        panic!("{v}");
    }
    assert_eq!(
        s.read(io, r.start, 1).unwrap(),
        [0],
        "the device reaches the page"
    );
}

/// Found by the seeded KPI runner (seed 179, once `Op::FaultBatch` changed how seeds
/// decode): a device attached in `Shared` mode uses the host's table, whose page sizes
/// (4 KiB and 64 KiB here) stayed the table's after the host detached; the shared
/// device (4 KiB only) then filled a 64 KiB block page by page, and the fault of its
/// last page asked the device's MMU for a 64 KiB leaf: `MmuError::Unsupported`, and
/// the page was never mapped. Fixed in the core's detach (the heir's sizes become the
/// table's, the maker's leaves the heir cannot map go first); the core's own test is
/// `a_shared_table_handed_to_a_4k_only_heir_drops_the_makers_large_leaves`.
#[test]
fn a_shared_device_after_the_host_detaches_fills_a_large_block_without_error() {
    let mut s = TestSystem::with_host_sizes(64, PageSizes::S4K | PageSizes::S64K);
    let igpu = s.add_device(1, DevCaps::FAULTABLE, 0, 0);
    let space =
        s.gm.as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new((1 << 30) + 64 * PAGE_SIZE),
            AllocPolicy::empty(),
        )
        .unwrap();
    s.gm.as_attach(space, s.host().id, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    s.gm.as_attach(
        space,
        s.devices[igpu].id,
        MmuMode::Shared,
        Activation::Switch,
    )
    .unwrap();
    let mut req = AllocRequest::new(16 * PAGE_SIZE);
    req.align = 16 * PAGE_SIZE;
    let r = s.gm.as_alloc(space, req).unwrap();
    s.gm.dev_detach(s.host().id, space).unwrap();
    for k in 0..16 {
        let va = VirtAddr::new(r.start.as_u64() + k * PAGE_SIZE);
        if let Err(e) = s.read(igpu, va, 1) {
            panic!("page {k}: {e:?}");
        }
    }
}

/// Found by the KPI fuzz target in CI (stop 40's run, `crash-01718f40…`; replayed here
/// from a local find of the same kind): a `region_unmap` over a page range that
/// covers a whole `region_map`ped region is the region's own unmap (`Pages::range`
/// resolves it to the region), so the region may be mapped again; the runner's model
/// kept it mapped with every page a hole and panicked when the next `region_map`
/// succeeded. A bug of the model, fixed in `kpi/regions.rs` (`unmap_range`).
#[test]
fn kpi_runner_a_range_unmap_covering_a_mapped_region_lets_it_be_mapped_again() {
    use gmem_testkit::kpi::{KpiRunner, MapMisuse, Mode, Op, PolicySel, ProtSel, Setup};
    let setup = Setup {
        host_pages: 0,
        dev_pages: 8,
        batch_limit: 0,
        policy: PolicySel {
            fit: 0,
            guarded: true,
            cached: false,
        },
        igpu_mode: Mode::Coherent,
        io_mode: Mode::Coherent,
        io_concurrent: false,
    };
    let map = Op::Map {
        region: 0,
        prot: ProtSel::Read,
        asynchronous: false,
        callback: false,
        misuse: MapMisuse::None,
    };
    let ops = [
        map,
        Op::UnmapRange {
            region: 0,
            page: 0,
            pages: 255,
            bad: false,
        },
        map,
        Op::Verify { dev: 0, region: 0 },
    ];
    let s = KpiRunner::new(setup).run(&ops);
    assert!(s.succeeded >= 3, "{s:?}");
}
