//! Device-private frames (`region_alloc_private`): one virtual page, the CPU's table on
//! the shared frame, a device that cannot fault on its own copy at the same address;
//! the copies are independent, the eager mirror leaves the private mapping alone,
//! freeing invalidates before the frame goes, and misuse is typed and changes nothing.

use gmem_core::testing::{AccessError, MmuEvent, TestSystem};
use gmem_core::*;

const DEV_BASE: u64 = 0x8000_0000;
const FMT: u32 = 7;

fn va(x: u64) -> VirtAddr {
    VirtAddr::new(x)
}

/// A host, a space with it attached, and a device that cannot fault with `pages`
/// pages of memory, attached with its own table.
fn system(pages: u64) -> (TestSystem, SpaceId, usize) {
    let mut s = TestSystem::new(256);
    let space = s.space();
    let d = s.add_device(FMT, DevCaps::empty(), DEV_BASE, pages);
    s.attach(space, d);
    (s, space, d)
}

fn page(r: Region, k: u64) -> VirtAddr {
    va(r.start.as_u64() + k * PAGE_SIZE)
}

#[test]
fn one_pointer_two_copies_and_the_mirror_leaves_the_private_one() {
    let (s, space, d) = system(8);
    let dev = s.devices[d].id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    for k in 0..4 {
        s.write(0, page(r, k), &[k as u8 + 1; 8]).unwrap();
    }
    assert_eq!(s.gm.region_alloc_private(r, dev).unwrap(), 4);
    assert_eq!(
        s.gm.region_alloc_private(r, dev).unwrap(),
        0,
        "they have one"
    );
    assert_eq!(s.gm.dev_frames(dev).unwrap().wired, 4);
    s.gm.check_invariants(space).unwrap();
    // Same addresses, two copies: the device sees its zeroed frames, the CPU its data.
    for k in 0..4 {
        assert_eq!(s.read(d, page(r, k), 8).unwrap(), [0; 8]);
        assert_eq!(s.read(0, page(r, k), 8).unwrap(), [k as u8 + 1; 8]);
        let (mem, pa) =
            s.gm.as_private_frame(space, page(r, k), dev)
                .unwrap()
                .unwrap();
        assert_eq!(mem, dev);
        assert!(pa.as_u64() >= DEV_BASE);
    }
    // A runtime's copy into the device's frame shows at the same address for it only.
    s.write(d, page(r, 2), b"device").unwrap();
    assert_eq!(s.read(d, page(r, 2), 6).unwrap(), b"device");
    assert_eq!(s.read(0, page(r, 2), 1).unwrap(), [3]);
    // Wiring mirrors wired pages to devices that cannot fault: not over private frames.
    s.gm.region_wire(r).unwrap();
    assert_eq!(s.read(d, page(r, 2), 6).unwrap(), b"device");
    s.gm.check_invariants(space).unwrap();
    // Freeing: unmapped and invalidated before the frames go; the table then gets the
    // shared (wired) frames.
    s.take_events();
    assert_eq!(s.gm.region_free_private(r, dev).unwrap(), 4);
    let ev = s.take_events();
    let inval = ev
        .iter()
        .position(|e| matches!(e, MmuEvent::Invalidate { mmu, .. } if *mmu == d as u32))
        .expect("the device's TLB is invalidated");
    let remap = ev
        .iter()
        .position(|e| matches!(e, MmuEvent::Map { mmu, .. } if *mmu == d as u32))
        .expect("the shared frames are mirrored again");
    assert!(inval < remap);
    assert_eq!(s.gm.dev_frames(dev).unwrap().wired, 0);
    assert_eq!(
        s.read(d, page(r, 2), 1).unwrap(),
        [3],
        "the shared copy now"
    );
    assert_eq!(s.gm.as_private_frame(space, page(r, 2), dev).unwrap(), None);
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn deallocation_and_detach_free_private_frames() {
    let (s, space, d) = system(8);
    let dev = s.devices[d].id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    let q =
        s.gm.as_alloc(space, AllocRequest::new(3 * PAGE_SIZE))
            .unwrap();
    s.gm.region_alloc_private(r, dev).unwrap();
    s.gm.region_alloc_private(q, dev).unwrap();
    assert_eq!(s.gm.dev_frames(dev).unwrap().wired, 5);
    s.gm.region_unmap(
        gmem_core::Pages::range(
            q.space,
            VaRange {
                start: page(q, 1),
                len: PAGE_SIZE,
            },
        ),
        MapFlags::empty(),
        None,
    )
    .unwrap();
    assert_eq!(s.gm.dev_frames(dev).unwrap().wired, 4);
    s.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
    assert_eq!(s.gm.dev_frames(dev).unwrap().wired, 2);
    s.gm.check_invariants(space).unwrap();
    s.gm.dev_detach(dev, space).unwrap();
    assert_eq!(s.gm.dev_frames(dev).unwrap().wired, 0);
    s.gm.check_invariants(space).unwrap();
    s.gm.dev_destroy(dev).unwrap();
}

#[test]
fn misuse_and_exhaustion_are_typed_and_leave_nothing() {
    let (mut s, space, d) = system(3);
    let dev = s.devices[d].id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    assert_eq!(
        s.gm.region_alloc_private(r, dev),
        Err(PopulateError::Move(gmem_core::MoveError::OutOfMemory(dev)))
    );
    let c = s.gm.dev_frames(dev).unwrap();
    assert_eq!(
        (c.wired, c.active, c.free),
        (0, 0, 3),
        "nothing of the call is left"
    );
    assert_eq!(
        s.gm.region_alloc_private(r, s.host().id),
        Err(PopulateError::CannotHoldPrivate(s.host().id)),
        "a faultable device"
    );
    let stray = s.add_device(9, DevCaps::empty(), DEV_BASE + (1 << 24), 4);
    let stray = s.devices[stray].id;
    assert_eq!(
        s.gm.region_alloc_private(r, stray),
        Err(PopulateError::NotAttached(stray))
    );
    // Two devices of one format sharing a table: a private frame would leak.
    let twin = s.add_device(FMT, DevCaps::empty(), DEV_BASE + (2 << 24), 4);
    let twin_id = s.devices[twin].id;
    s.gm.as_attach(space, twin_id, MmuMode::Shared, Activation::Switch)
        .unwrap();
    assert_eq!(
        s.gm.region_alloc_private(r, twin_id),
        Err(PopulateError::CannotHoldPrivate(twin_id))
    );
    assert_eq!(
        s.read(d, page(r, 0), 1),
        Err(AccessError::Unmapped(page(r, 0)))
    );
    s.gm.check_invariants(space).unwrap();
}

/// Found by the `private` fuzz target: attaching a device that cannot fault mirrors
/// every wired page in one pass, and two neighbouring regions whose frames follow on
/// must not share a run; each keeps its own protection in the new table.
#[test]
fn attach_mirrors_neighbouring_wired_regions_each_with_its_own_protection() {
    let (s, space, d) = system(4);
    let dev = s.devices[d].id;
    s.gm.dev_detach(dev, space).unwrap();
    let a =
        s.gm.as_alloc(space, AllocRequest::new(3 * PAGE_SIZE))
            .unwrap();
    s.gm.region_wire(a).unwrap();
    let b = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    assert_eq!(
        b.start.as_u64(),
        a.start.as_u64() + 3 * PAGE_SIZE,
        "neighbours"
    );
    s.gm.region_protect(a, Prot::READ).unwrap();
    s.gm.region_wire(b).unwrap();
    s.write(0, page(b, 0), &[7; 8]).unwrap();
    s.gm.as_attach(space, dev, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    s.gm.check_invariants(space).unwrap();
    // The read-write neighbour is writable from the device, the read-only one is not.
    s.write(d, page(b, 0), &[9; 8]).unwrap();
    assert_eq!(s.read(0, page(b, 0), 8).unwrap(), [9; 8]);
    assert_eq!(s.read(d, page(a, 2), 8).unwrap(), [0; 8]);
    assert!(s.write(d, page(a, 2), &[1; 8]).is_err());
    assert_eq!(s.read(0, page(a, 2), 8).unwrap(), [0; 8]);
}
