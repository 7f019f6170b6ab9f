//! Read duplication (issue 35, item 4): a page advised read-mostly gets a read-only
//! copy in each reading device's memory instead of migrating; a write collapses the
//! copies (every other mapping invalidated) before it proceeds; bytes stay coherent.
//! Memory pressure, advice edits, deallocation and detach drop copies. Bytes and
//! invariants are checked after every step.

use gmem_core::policy::advice::AdviceOp;
use gmem_core::testing::TestSystem;
use gmem_core::*;

const GPU0_BASE: u64 = 0x8000_0000;
const GPU1_BASE: u64 = 0xA000_0000;

/// A host and two GPUs (`gpu_pages` each, formats of their own) in one space, and an
/// 8-page region the host filled with distinct bytes, advised read-mostly.
fn system(gpu_pages: u64) -> (TestSystem, SpaceId, [usize; 2], Region) {
    let mut s = TestSystem::new(64);
    let g0 = s.add_device(2, DevCaps::FAULTABLE, GPU0_BASE, gpu_pages);
    let g1 = s.add_device(3, DevCaps::FAULTABLE, GPU1_BASE, gpu_pages);
    let space = s.space();
    s.attach(space, g0);
    s.attach(space, g1);
    let r =
        s.gm.as_alloc(space, AllocRequest::new(8 * PAGE_SIZE))
            .unwrap();
    for k in 0..8 {
        s.write(0, page(r, k), &fill(k as u8)).unwrap();
    }
    s.gm.region_advise(r, AdviceOp::SetReadMostly).unwrap();
    s.gm.check_invariants(space).unwrap();
    (s, space, [g0, g1], r)
}

fn page(r: Region, k: u64) -> VirtAddr {
    VirtAddr::new(r.start.as_u64() + k * PAGE_SIZE)
}

fn fill(b: u8) -> Vec<u8> {
    vec![b; 64]
}

/// Wired frames of device `d` (read copies are wired).
fn wired(s: &TestSystem, d: usize) -> u64 {
    s.gm.dev_frames(s.devices[d].id).unwrap().wired
}

fn home(s: &TestSystem, space: SpaceId, va: VirtAddr) -> DeviceId {
    s.gm.as_page_frame(space, va).unwrap().unwrap().0
}

#[test]
fn readers_get_copies_and_the_page_stays_home() {
    let (s, space, [g0, g1], r) = system(32);
    let before = s.gm.stats();
    for dev in [g0, g1, 0, g0, g1] {
        for k in 0..8 {
            assert_eq!(s.read(dev, page(r, k), 64).unwrap(), fill(k as u8));
        }
        s.gm.check_invariants(space).unwrap();
    }
    let after = s.gm.stats();
    assert_eq!(after.read_duplications - before.read_duplications, 16);
    assert_eq!(
        after.faults_migrate, before.faults_migrate,
        "nothing migrates"
    );
    assert_eq!(
        after.bytes_host_to_dev - before.bytes_host_to_dev,
        16 * PAGE_SIZE,
        "each GPU copies each page once"
    );
    for k in 0..8 {
        assert_eq!(home(&s, space, page(r, k)), s.gm.host());
    }
    // The copies live in the GPUs' memories: each GPU translates to its own frames.
    for dev in [g0, g1] {
        let pte = s.translate(dev, page(r, 0), Prot::READ).unwrap();
        assert_eq!(pte.memory, s.devices[dev].id);
        assert!(!pte.prot.contains(Prot::WRITE), "copies are read-only");
    }
}

#[test]
fn a_write_collapses_the_copies_and_every_reader_sees_it() {
    let (s, space, [g0, g1], r) = system(32);
    for dev in [g0, g1] {
        s.read(dev, page(r, 3), 64).unwrap();
    }
    // The host's own mapping became read-only when the first copy was made.
    let pte = s.translate(0, page(r, 3), Prot::READ).unwrap();
    assert!(!pte.prot.contains(Prot::WRITE));
    let dropped = s.gm.stats().read_copies_dropped;
    s.write(g0, page(r, 3), b"gpu0 wrote this").unwrap();
    assert_eq!(s.gm.stats().read_copies_dropped - dropped, 2);
    s.gm.check_invariants(space).unwrap();
    for dev in [0, g1, g0] {
        assert_eq!(s.read(dev, page(r, 3), 15).unwrap(), b"gpu0 wrote this");
        s.gm.check_invariants(space).unwrap();
    }
    // The host writes: the copies made since collapse again.
    s.write(0, page(r, 3), b"host wrote that").unwrap();
    for dev in [g0, g1, 0] {
        assert_eq!(s.read(dev, page(r, 3), 15).unwrap(), b"host wrote that");
        s.gm.check_invariants(space).unwrap();
    }
    // The other pages' copies were never touched.
    assert_eq!(s.read(g1, page(r, 4), 64).unwrap(), fill(4));
}

#[test]
fn taking_the_advice_back_drops_the_copies_and_pages_migrate_again() {
    let (s, space, [g0, _], r) = system(32);
    for k in 0..8 {
        s.read(g0, page(r, k), 64).unwrap();
    }
    let dropped = s.gm.stats().read_copies_dropped;
    s.gm.region_advise(r, AdviceOp::UnsetReadMostly).unwrap();
    assert_eq!(s.gm.stats().read_copies_dropped - dropped, 8);
    s.gm.check_invariants(space).unwrap();
    let migrations = s.gm.stats().faults_migrate;
    assert_eq!(s.read(g0, page(r, 1), 64).unwrap(), fill(1));
    assert_eq!(s.gm.stats().faults_migrate, migrations + 1);
    assert_eq!(home(&s, space, page(r, 1)), s.devices[g0].id);
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn a_full_memory_drops_its_copies_before_it_evicts() {
    // GPU 0 holds 4 frames: 8 read-mostly pages cannot all have a copy there.
    let (s, space, [g0, _], r) = system(4);
    for k in 0..8 {
        assert_eq!(s.read(g0, page(r, k), 64).unwrap(), fill(k as u8));
        s.gm.check_invariants(space).unwrap();
    }
    let st = s.gm.stats();
    // Pages 0-3 get copies; each of pages 4-7 finds no free frame, migrates as
    // without advice, and its migration takes the oldest copy's frame (no eviction).
    assert_eq!(st.read_duplications, 4);
    assert_eq!(st.faults_migrate, 4);
    assert_eq!(st.read_copies_dropped, 4);
    assert_eq!(st.evictions, 0, "no page was evicted while copies could go");
    // Every byte still reads back, on every device.
    for dev in [0, g0] {
        for k in 0..8 {
            assert_eq!(s.read(dev, page(r, k), 64).unwrap(), fill(k as u8));
        }
    }
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn deallocation_and_detach_give_the_copy_frames_back() {
    let (s, space, [g0, g1], r) = system(32);
    let free0 = wired(&s, g0);
    for k in 0..8 {
        s.read(g0, page(r, k), 64).unwrap();
        s.read(g1, page(r, k), 64).unwrap();
    }
    assert_eq!(wired(&s, g0), free0 + 8);
    s.gm.dev_detach(s.devices[g1].id, space).unwrap();
    s.gm.check_invariants(space).unwrap();
    assert_eq!(wired(&s, g0), free0, "a detach drops every copy");
    for k in 0..8 {
        s.read(g0, page(r, k), 64).unwrap();
    }
    s.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
    s.gm.check_invariants(space).unwrap();
    assert_eq!(wired(&s, g0), free0);
}

#[test]
fn wiring_and_protection_changes_collapse_first() {
    let (s, space, [g0, g1], r) = system(32);
    for dev in [g0, g1] {
        s.read(dev, page(r, 0), 64).unwrap();
        s.read(dev, page(r, 1), 64).unwrap();
    }
    s.gm.region_protect(
        Pages::range(
            space,
            VaRange {
                start: page(r, 0),
                len: PAGE_SIZE,
            },
        ),
        Prot::empty(),
    )
    .unwrap();
    s.gm.check_invariants(space).unwrap();
    assert!(
        s.read(g0, page(r, 0), 1).is_err(),
        "no copy survives a protection that takes reading away"
    );
    s.gm.region_wire(Pages::range(
        space,
        VaRange {
            start: page(r, 1),
            len: PAGE_SIZE,
        },
    ))
    .unwrap();
    s.gm.check_invariants(space).unwrap();
    s.write(0, page(r, 1), b"wired").unwrap();
    for dev in [g0, g1] {
        assert_eq!(s.read(dev, page(r, 1), 5).unwrap(), b"wired");
    }
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn pressure_drops_one_copy_and_the_pages_other_copies_stay_coherent() {
    let (s, space, [g0, g1], r) = system(4);
    for k in 0..4 {
        for dev in [g0, g1] {
            assert_eq!(s.read(dev, page(r, k), 64).unwrap(), fill(k as u8));
        }
    }
    assert_eq!(s.gm.stats().read_duplications, 8);
    // GPU 0 needs frames: its oldest copies go one by one; GPU 1's stay.
    for k in 4..6 {
        assert_eq!(s.read(g0, page(r, k), 64).unwrap(), fill(k as u8));
        s.gm.check_invariants(space).unwrap();
    }
    assert_eq!(s.gm.stats().read_copies_dropped, 2);
    let pte = s.translate(g1, page(r, 0), Prot::READ).unwrap();
    assert_eq!(
        pte.memory, s.devices[g1].id,
        "GPU 1 keeps its copy of page 0"
    );
    // A write still collapses what is left, and everyone reads it.
    s.write(0, page(r, 0), b"after pressure").unwrap();
    for dev in [g1, g0, 0] {
        assert_eq!(s.read(dev, page(r, 0), 14).unwrap(), b"after pressure");
        s.gm.check_invariants(space).unwrap();
    }
}
