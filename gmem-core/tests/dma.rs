//! Short-lived DMA mappings (`dma_map` / `dma_unmap`): the round trip with bytes, stale
//! and double unmaps, bad arguments refused with state unchanged, a driver's refusal
//! undone, asynchronous unmaps, the interplay with regions, attach, detach and
//! destroy, and no heap allocation per buffer in the steady state. `check_invariants`
//! after every step.

use gmem_core::testing::{AccessError, TestSystem, HOST_BASE};
use gmem_core::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts this thread's heap allocations (other tests' threads are not counted).
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a
// const-initialised thread-local without destructor, so touching it never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this `layout` (see `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract for `realloc` is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

const NIC_FORMAT: u32 = 2;

/// A host of 16 pages, a space [1 GiB, 2 GiB) with `policy`, the CPU and a NIC (it
/// cannot fault, tables of its own) attached.
fn system(policy: AllocPolicy) -> (TestSystem, SpaceId, usize) {
    let mut s = TestSystem::new(16);
    let nic = s.add_device(NIC_FORMAT, DevCaps::empty(), 0, 0);
    let space =
        s.gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), policy)
            .unwrap();
    s.gm.as_attach(space, s.host().id, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    s.attach(space, nic);
    (s, space, nic)
}

/// Frame `k` of host RAM past the core's 16 pages.
fn buf(k: u64) -> PhysAddr {
    PhysAddr::new(HOST_BASE + (100 + k) * PAGE_SIZE)
}

fn at(m: &DmaMapping, page: u64) -> VirtAddr {
    VirtAddr::new(m.start.as_u64() + page * PAGE_SIZE)
}

#[test]
fn a_mapping_is_in_every_table_carries_bytes_and_is_gone_after_a_strict_unmap() {
    let (s, space, nic) = system(AllocPolicy::CACHED);
    let gm = &s.gm;
    // Two contiguous frames and one apart: two runs per table.
    let frames = [buf(0), buf(1), buf(5)];
    let before = gm.stats();
    let m = gm.dma_map(space, &frames, gm.host(), Prot::RW).unwrap();
    gm.check_invariants(space).unwrap();
    assert_eq!(m.len, 3 * PAGE_SIZE);
    assert_eq!(
        gm.stats().mmu_maps - before.mmu_maps,
        4,
        "2 runs x 2 tables"
    );
    for (k, f) in frames.iter().enumerate() {
        for dev in [0, nic] {
            let pte = s.translate(dev, at(&m, k as u64), Prot::WRITE).unwrap();
            assert_eq!(pte.pfn, f.pfn().0);
        }
    }
    // The NIC writes across the page boundary; the CPU reads it back.
    let data: Vec<u8> = (0..6000u32).map(|i| (i * 7) as u8).collect();
    s.write(nic, VirtAddr::new(m.start.as_u64() + 3000), &data)
        .unwrap();
    assert_eq!(
        s.read(0, VirtAddr::new(m.start.as_u64() + 3000), data.len())
            .unwrap(),
        data
    );
    assert_eq!(gm.dma_mappings(space), Ok(1));
    let inval = gm.stats().invalidations;
    gm.dma_unmap(m, MapFlags::empty(), None).unwrap();
    gm.check_invariants(space).unwrap();
    assert_eq!(gm.stats().invalidations - inval, 2, "one per device");
    for k in 0..3 {
        assert_eq!(
            s.translate(nic, at(&m, k), Prot::READ),
            Err(AccessError::Unmapped(at(&m, k)))
        );
        assert!(
            s.translate(0, at(&m, k), Prot::READ).is_err(),
            "no region there"
        );
    }
    assert_eq!(gm.dma_mappings(space), Ok(0));
}

#[test]
fn a_stale_or_double_unmap_is_refused_and_changes_nothing() {
    let (s, space, nic) = system(AllocPolicy::CACHED);
    let gm = &s.gm;
    let a = gm.dma_map(space, &[buf(0)], gm.host(), Prot::READ).unwrap();
    gm.dma_unmap(a, MapFlags::empty(), None).unwrap();
    assert_eq!(
        gm.dma_unmap(a, MapFlags::empty(), None),
        Err(DmaUnmapError::StaleMapping(a))
    );
    // The slot is reused by the next mapping under a new generation: the old handle
    // still does not name it, even at the same IOVA.
    let b = gm.dma_map(space, &[buf(1)], gm.host(), Prot::READ).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let seen = ran.clone();
    let cb: Callback = Box::new(move |_| {
        seen.fetch_add(1, Ordering::SeqCst);
    });
    assert_eq!(
        gm.dma_unmap(a, MapFlags::ASYNC, Some(cb)),
        Err(DmaUnmapError::StaleMapping(a))
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the callback is dropped unrun"
    );
    gm.check_invariants(space).unwrap();
    assert_eq!(
        s.translate(nic, b.start, Prot::READ).unwrap().pfn,
        buf(1).pfn().0
    );
    assert_eq!(gm.dma_mappings(space), Ok(1));
    gm.dma_unmap(b, MapFlags::empty(), None).unwrap();
    gm.check_invariants(space).unwrap();
}

#[test]
fn bad_arguments_are_typed_errors_that_leave_the_space_unchanged() {
    let (mut s, space, _) = system(AllocPolicy::empty());
    let spare = s.add_device(5, DevCaps::empty(), 0x9000_0000, 4);
    let spare_id = s.devices[spare].id;
    let gm = &s.gm;
    s.take_events();
    let arena = gm.as_arena_stats(space).unwrap();
    let host = gm.host();
    let unaligned = PhysAddr::new(buf(0).as_u64() + 8);
    let managed = PhysAddr::new(HOST_BASE + PAGE_SIZE);
    let cases: Vec<(DmaMapError, Result<DmaMapping, DmaMapError>)> = vec![
        (
            DmaMapError::BadProt(Prot::empty()),
            gm.dma_map(space, &[buf(0)], host, Prot::empty()),
        ),
        (
            DmaMapError::BadLength(0),
            gm.dma_map(space, &[], host, Prot::RW),
        ),
        (
            DmaMapError::BadFrame(unaligned),
            gm.dma_map(space, &[buf(0), unaligned], host, Prot::RW),
        ),
        (
            DmaMapError::BadFrame(managed),
            gm.dma_map(space, &[managed], host, Prot::RW),
        ),
        (
            DmaMapError::BadFrame(PhysAddr::new(0x9000_0000)),
            gm.dma_map(space, &[PhysAddr::new(0x9000_0000)], spare_id, Prot::RW),
        ),
    ];
    for (want, got) in cases {
        assert_eq!(got, Err(want));
    }
    gm.dev_destroy(spare_id).unwrap();
    assert_eq!(
        gm.dma_map(space, &[buf(0)], spare_id, Prot::RW),
        Err(DmaMapError::UnknownDevice(spare_id))
    );
    let dead = gm
        .as_create(
            VirtAddr::new(4 << 30),
            VirtAddr::new(5 << 30),
            AllocPolicy::empty(),
        )
        .unwrap();
    gm.as_destroy(dead).unwrap();
    assert_eq!(
        gm.dma_map(dead, &[buf(0)], host, Prot::RW),
        Err(DmaMapError::UnknownSpace(dead))
    );
    // Larger than the space.
    let many: Vec<PhysAddr> = (0..(1u64 << 18) + 1).map(buf).collect();
    assert_eq!(
        gm.dma_map(space, &many, host, Prot::RW),
        Err(DmaMapError::NoSpace {
            size: many.len() as u64 * PAGE_SIZE
        })
    );
    assert!(s.take_events().is_empty(), "no table was touched");
    assert_eq!(gm.dma_mappings(space), Ok(0));
    assert_eq!(gm.as_arena_stats(space).unwrap().allocated, arena.allocated);
    gm.check_invariants(space).unwrap();
}

#[test]
fn a_driver_refusal_undoes_the_map_and_frees_the_iova() {
    let (s, space, nic) = system(AllocPolicy::empty());
    let gm = &s.gm;
    let arena = gm.as_arena_stats(space).unwrap();
    // The second table's map fails: the first table's edits are undone.
    s.devices[nic].mmu.fail_next_maps(1);
    let r = gm.dma_map(space, &[buf(0), buf(1)], gm.host(), Prot::RW);
    assert!(matches!(r, Err(DmaMapError::Mmu(_))), "{r:?}");
    gm.check_invariants(space).unwrap();
    assert_eq!(gm.dma_mappings(space), Ok(0));
    assert_eq!(gm.as_arena_stats(space).unwrap().allocated, arena.allocated);
    // The host's table (mapped first) was emptied again.
    let root = s.host().mmu.active_root().unwrap();
    assert!(s.host_store.entries(root).is_empty(), "the undone edits");
    let m = gm
        .dma_map(space, &[buf(0), buf(1)], gm.host(), Prot::RW)
        .unwrap();
    gm.check_invariants(space).unwrap();
    gm.dma_unmap(m, MapFlags::empty(), None).unwrap();
}

#[test]
fn an_async_unmap_clears_at_once_and_frees_the_iova_after_the_queued_invalidation() {
    // A space of exactly one page: the IOVA cannot be reused before it is released.
    let mut s = TestSystem::new(16);
    let nic = s.add_device(NIC_FORMAT, DevCaps::empty(), 0, 0);
    let gm = &s.gm;
    let space = gm
        .as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new((1 << 30) + PAGE_SIZE),
            AllocPolicy::empty(),
        )
        .unwrap();
    gm.as_attach(
        space,
        s.devices[nic].id,
        MmuMode::Coherent,
        Activation::Switch,
    )
    .unwrap();
    let m = gm
        .dma_map(space, &[buf(0)], gm.host(), Prot::WRITE)
        .unwrap();
    s.write(nic, m.start, b"rx").unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let seen = ran.clone();
    let cb: Callback = Box::new(move |r| {
        assert!(r.is_ok());
        seen.fetch_add(1, Ordering::SeqCst);
    });
    let inval = gm.stats().invalidations;
    gm.dma_unmap(m, MapFlags::ASYNC, Some(cb)).unwrap();
    gm.check_invariants(space).unwrap();
    // The entry is cleared, but the NIC's TLB may still translate it until the
    // queued invalidation: that is why the frame waits for the callback.
    assert!(
        s.translate(nic, m.start, Prot::WRITE).is_ok(),
        "the stale TLB entry"
    );
    assert_eq!(gm.stats().invalidations, inval, "not yet invalidated");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert_eq!(gm.as_pending(space), Ok(1));
    assert_eq!(
        gm.dma_map(space, &[buf(1)], gm.host(), Prot::WRITE),
        Err(DmaMapError::NoSpace { size: PAGE_SIZE }),
        "the IOVA is still reserved"
    );
    gm.as_synchronize(space).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(gm.stats().invalidations - inval, 1);
    assert!(s.translate(nic, m.start, Prot::WRITE).is_err());
    gm.check_invariants(space).unwrap();
    let again = gm
        .dma_map(space, &[buf(1)], gm.host(), Prot::WRITE)
        .unwrap();
    assert_eq!(again.start, m.start);
    gm.dma_unmap(again, MapFlags::empty(), None).unwrap();
    gm.check_invariants(space).unwrap();
}

#[test]
fn a_dma_range_is_not_a_region() {
    let (s, space, _) = system(AllocPolicy::empty());
    let gm = &s.gm;
    let m = gm
        .dma_map(space, &[buf(0), buf(1)], gm.host(), Prot::RW)
        .unwrap();
    assert!(gm.as_lookup(space, m.start).is_err());
    assert!(gm
        .region_unmap(Pages::range(space, m.range()), MapFlags::empty(), None)
        .is_err());
    assert!(gm
        .region_protect(Pages::range(space, m.range()), Prot::READ)
        .is_err());
    // Regions allocated meanwhile never overlap it.
    for _ in 0..8 {
        let r = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        assert!(!m.range().contains(r.start));
    }
    gm.check_invariants(space).unwrap();
    gm.dma_unmap(m, MapFlags::empty(), None).unwrap();
    gm.check_invariants(space).unwrap();
}

#[test]
fn a_later_attach_sees_the_mappings_and_a_detach_takes_them_from_its_table_only() {
    let (mut s, space, nic) = system(AllocPolicy::empty());
    let m =
        s.gm.dma_map(space, &[buf(0), buf(3)], s.gm.host(), Prot::READ)
            .unwrap();
    let second = s.add_device(7, DevCaps::empty(), 0, 0);
    let gm = &s.gm;
    gm.as_attach(
        space,
        s.devices[second].id,
        MmuMode::Coherent,
        Activation::Switch,
    )
    .unwrap();
    gm.check_invariants(space).unwrap();
    assert_eq!(
        s.translate(second, at(&m, 1), Prot::READ).unwrap().pfn,
        buf(3).pfn().0
    );
    gm.dev_detach(s.devices[nic].id, space).unwrap();
    gm.check_invariants(space).unwrap();
    assert_eq!(
        s.translate(second, at(&m, 0), Prot::READ).unwrap().pfn,
        buf(0).pfn().0
    );
    // The NIC again: its new table is filled.
    gm.as_attach(
        space,
        s.devices[nic].id,
        MmuMode::Coherent,
        Activation::Switch,
    )
    .unwrap();
    gm.check_invariants(space).unwrap();
    assert!(s.translate(nic, at(&m, 1), Prot::READ).is_ok());
    gm.dma_unmap(m, MapFlags::empty(), None).unwrap();
    gm.check_invariants(space).unwrap();
    assert!(s.translate(second, at(&m, 0), Prot::READ).is_err());
    assert!(s.translate(nic, at(&m, 0), Prot::READ).is_err());
}

#[test]
fn destroying_the_space_tears_mappings_down_and_the_memory_device_waits_for_them() {
    let (mut s, space, nic) = system(AllocPolicy::empty());
    // Frames in a device's physical address space, outside its managed 4 pages.
    let gpu = s.add_device(3, DevCaps::empty(), 0x8000_0000, 4);
    let gpu_id = s.devices[gpu].id;
    let gm = &s.gm;
    let frame = PhysAddr::new(0x8000_0000 + 10 * PAGE_SIZE);
    let m = gm.dma_map(space, &[frame], gpu_id, Prot::RW).unwrap();
    assert_eq!(
        s.translate(nic, m.start, Prot::READ).unwrap().memory,
        gpu_id
    );
    gm.check_invariants(space).unwrap();
    assert_eq!(
        gm.dev_destroy(gpu_id),
        Err(DeviceError::MemoryInUse { frames: 1 })
    );
    let _live = gm.dma_map(space, &[buf(0)], gm.host(), Prot::RW).unwrap();
    gm.as_destroy(space).unwrap();
    assert_eq!(
        gm.dma_unmap(m, MapFlags::empty(), None),
        Err(DmaUnmapError::UnknownSpace(space))
    );
    assert!(s.translate(nic, m.start, Prot::READ).is_err());
    gm.dev_destroy(gpu_id).unwrap();
}

/// A driver that keeps nothing (counts its calls): what allocates per buffer in the
/// steady state is then the core's alone (the test MMU's table store is a map whose
/// nodes come and go with the entries).
#[derive(Default)]
struct CountingMmu {
    maps: AtomicUsize,
    unmaps: AtomicUsize,
    invalidations: AtomicUsize,
}

impl Mmu for CountingMmu {
    fn format(&self) -> PageTableFormat {
        PageTableFormat(77)
    }
    fn page_sizes(&self) -> PageSizes {
        PageSizes::S4K
    }
    fn create_page_table(&self) -> Result<PageTableRoot, MmuError> {
        Ok(PageTableRoot(1))
    }
    fn destroy_page_table(&self, _: PageTableRoot) {}
    fn map(&self, _: PageTableRoot, _: &MapRun) -> Result<(), MmuError> {
        self.maps.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn unmap(&self, _: PageTableRoot, _: VaRange) {
        self.unmaps.fetch_add(1, Ordering::Relaxed);
    }
    fn protect(&self, _: PageTableRoot, _: VaRange, _: Prot) -> Result<(), MmuError> {
        Ok(())
    }
    fn invalidate(&self, _: PageTableRoot, _: &[VaRange]) {
        self.invalidations.fetch_add(1, Ordering::Relaxed);
    }
    fn invalidate_all(&self, _: PageTableRoot) {}
    fn activate(&self, _: Option<PageTableRoot>) {}
}

#[test]
fn the_steady_state_allocates_nothing_on_the_heap() {
    let s = TestSystem::without_log(16);
    let gm = &s.gm;
    let mmu = Arc::new(CountingMmu::default());
    let nic = gm
        .dev_create(DeviceDesc {
            name: "nic".into(),
            mmu: mmu.clone(),
            memory: None,
            caps: DevCaps::empty(),
            data: None,
        })
        .unwrap();
    let space = gm
        .as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new(2 << 30),
            AllocPolicy::CACHED,
        )
        .unwrap();
    gm.as_attach(space, nic, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    // Scattered frames: a 16-page buffer is 16 runs.
    let frames: Vec<PhysAddr> = (0..16).map(|k| buf(2 * k)).collect();
    let pair = |pages: usize| {
        let m = gm
            .dma_map(space, &frames[..pages], gm.host(), Prot::WRITE)
            .unwrap();
        gm.dma_unmap(m, MapFlags::empty(), None).unwrap();
    };
    for _ in 0..1000 {
        pair(1);
        pair(16);
    }
    let before = allocs();
    let calls = mmu.maps.load(Ordering::Relaxed);
    for _ in 0..1000 {
        pair(1);
        pair(16);
    }
    assert_eq!(
        allocs() - before,
        0,
        "heap allocations in 2000 steady pairs"
    );
    assert_eq!(
        mmu.maps.load(Ordering::Relaxed) - calls,
        17_000,
        "the maps were made"
    );
    assert_eq!(mmu.invalidations.load(Ordering::Relaxed), 4000);
    assert_eq!(mmu.unmaps.load(Ordering::Relaxed), 4000);
    gm.check_invariants(space).unwrap();
}
