//! Tests of [`crate::PagedMmu`] over a `Vec`-backed physical memory and a walker that
//! records its invalidations and root loads: what the driver writes is what a walk of
//! those words finds, for the CPU's codec and the VT-d codec alike.

use crate::hardware::PagingHardware;
use crate::{GlobalMapping, PagedConfig, PagedMmu, VtdCodec, X86Codec, X86Config};
use gmem_core::testing::TestSystem;
use gmem_core::{
    FrameSource, MapRun, Mmu, MmuError, PageSize, PageTableRoot, PhysAddr, Prot, VaRange, VirtAddr,
    PAGE_SIZE,
};
use std::sync::{Arc, Mutex};
use std::vec;
use std::vec::Vec;

const MEM_BYTES: u64 = 4 << 20;

/// Physical memory `[0, MEM_BYTES)` as words, and what the walker was told.
#[derive(Default)]
struct Machine {
    words: Mutex<Vec<u64>>,
    invalidated: Mutex<Vec<(u64, u64)>>,
    flushes_all: Mutex<u64>,
    roots: Mutex<Vec<Option<u64>>>,
}

#[derive(Clone)]
struct Walker(Arc<Machine>);

impl PagingHardware for Walker {
    unsafe fn read_pte(&self, pa: PhysAddr) -> u64 {
        self.0.words.lock().unwrap()[(pa.as_u64() / 8) as usize]
    }
    unsafe fn write_pte(&self, pa: PhysAddr, pte: u64) {
        self.0.words.lock().unwrap()[(pa.as_u64() / 8) as usize] = pte;
    }
    fn invalidate(&self, _root: PageTableRoot, ranges: &[VaRange]) {
        let mut v = self.0.invalidated.lock().unwrap();
        v.extend(ranges.iter().map(|r| (r.start.as_u64(), r.len)));
    }
    fn invalidate_all(&self, _root: PageTableRoot) {
        *self.0.flushes_all.lock().unwrap() += 1;
    }
    unsafe fn activate(&self, root: Option<PageTableRoot>) {
        self.0.roots.lock().unwrap().push(root.map(|r| r.0));
    }
}

/// Frames `[1 MiB, 2 MiB)` of the machine, zeroed on allocation.
struct Frames {
    machine: Arc<Machine>,
    free: Mutex<Vec<u64>>,
}

// SAFETY: each frame is handed out once until freed, and zeroed.
unsafe impl FrameSource for Frames {
    fn alloc_frame(&self) -> Option<PhysAddr> {
        let f = self.free.lock().unwrap().pop()?;
        let mut w = self.machine.words.lock().unwrap();
        for i in 0..512 {
            w[(f / 8 + i) as usize] = 0;
        }
        Some(PhysAddr::new(f))
    }
    fn free_frame(&self, frame: PhysAddr) {
        self.free.lock().unwrap().push(frame.as_u64());
    }
}

fn machine() -> (Arc<Machine>, Arc<Frames>) {
    let m = Arc::new(Machine::default());
    *m.words.lock().unwrap() = vec![0; (MEM_BYTES / 8) as usize];
    let frames = Arc::new(Frames {
        machine: m.clone(),
        free: Mutex::new((256..512).rev().map(|k| k * PAGE_SIZE).collect()),
    });
    (m, frames)
}

fn cpu_codec() -> X86Codec {
    X86Codec {
        config: X86Config {
            large_pages: true,
            ..X86Config::default()
        },
    }
}

fn run(va: u64, pa: u64, len: u64, prot: Prot, size: PageSize) -> MapRun {
    MapRun {
        va: VirtAddr::new(va),
        pa: PhysAddr::new(pa),
        len,
        prot,
        page_size: size,
        memory: TestSystem::new(1).host().id,
        attrs: Default::default(),
    }
}

#[test]
fn cpu_tables_carry_globals_and_refuse_maps_into_their_slots() {
    let (m, frames) = machine();
    let globals = [GlobalMapping::identity(0, 4 << 30, Prot::RWX)];
    // SAFETY: the frames are the test machine's, reached through `Walker`.
    let mmu = unsafe {
        PagedMmu::new(
            cpu_codec(),
            Walker(m.clone()),
            frames,
            PagedConfig::default(),
            &globals,
        )
    }
    .unwrap();
    let root = mmu.create_page_table().unwrap();
    // The identity mapping is in the new table, with 2 MiB leaves.
    let t = mmu.translate(root, VirtAddr::new(0x1234_5678)).unwrap();
    assert_eq!(
        (t.pa.as_u64(), t.page_size),
        (0x1234_5678, PageSize::Size2M)
    );
    // A map into the global slot (the first 512 GiB) is refused, nothing changes.
    let r = mmu.map(
        root,
        &run(0x4000_0000, 0x10_0000, 4096, Prot::RW, PageSize::Size4K),
    );
    assert!(matches!(r, Err(MmuError::Unsupported { .. })));
    assert_eq!(
        mmu.translate(root, VirtAddr::new(0x4000_0000))
            .unwrap()
            .pa
            .as_u64(),
        0x4000_0000
    );
    mmu.activate(Some(root));
    assert_eq!(m.roots.lock().unwrap().last(), Some(&Some(root.0)));
    assert_eq!(mmu.active_root(), Some(root));
    // Deactivating goes back to the template, which keeps the kernel running.
    mmu.activate(None);
    assert_eq!(
        m.roots.lock().unwrap().last(),
        Some(&Some(mmu.template_root().0))
    );
}

#[test]
fn a_2m_leaf_splits_on_a_partial_protect_and_unmap_frees_tables_after_a_flush() {
    let (m, frames) = machine();
    // SAFETY: as above.
    let mmu = unsafe {
        PagedMmu::new(
            cpu_codec(),
            Walker(m.clone()),
            frames,
            PagedConfig::default(),
            &[],
        )
    }
    .unwrap();
    let root = mmu.create_page_table().unwrap();
    let va = 0x100_0000_0000;
    mmu.map(
        root,
        &run(va, 0x20_0000, 2 << 20, Prot::RW, PageSize::Size2M),
    )
    .unwrap();
    let t = mmu.translate(root, VirtAddr::new(va + 0x1234)).unwrap();
    assert_eq!((t.pa.as_u64(), t.page_size), (0x20_1234, PageSize::Size2M));
    let ro = VaRange::new(VirtAddr::new(va + 0x10_000), 2 * PAGE_SIZE).unwrap();
    mmu.protect(root, ro, Prot::READ).unwrap();
    let a = mmu.translate(root, VirtAddr::new(va)).unwrap();
    let b = mmu.translate(root, VirtAddr::new(va + 0x10_000)).unwrap();
    assert_eq!(
        (a.page_size, a.prot.contains(Prot::WRITE)),
        (PageSize::Size4K, true)
    );
    assert_eq!((b.pa.as_u64(), b.prot), (0x21_0000, Prot::READ));
    let held = mmu.frames_held();
    mmu.unmap(root, VaRange::new(VirtAddr::new(va), 2 << 20).unwrap());
    assert!(mmu.translate(root, VirtAddr::new(va)).is_none());
    // Emptied tables wait for an invalidation before they are freed.
    assert_eq!(mmu.frames_held(), held);
    mmu.invalidate(root, &[VaRange::new(VirtAddr::new(va), PAGE_SIZE).unwrap()]);
    assert!(mmu.frames_held() < held);
    assert_eq!(*m.flushes_all.lock().unwrap(), 1);
}

#[test]
fn small_invalidations_reach_the_walker_by_range_large_ones_as_a_flush() {
    let (m, frames) = machine();
    // SAFETY: as above.
    let mmu = unsafe {
        PagedMmu::new(
            cpu_codec(),
            Walker(m.clone()),
            frames,
            PagedConfig::default(),
            &[],
        )
    }
    .unwrap();
    let root = mmu.create_page_table().unwrap();
    mmu.invalidate(
        root,
        &[VaRange::new(VirtAddr::new(0x5000), 2 * PAGE_SIZE).unwrap()],
    );
    assert_eq!(
        *m.invalidated.lock().unwrap(),
        vec![(0x5000, 2 * PAGE_SIZE)]
    );
    mmu.invalidate(
        root,
        &[VaRange::new(VirtAddr::new(0x5000), 65 * PAGE_SIZE).unwrap()],
    );
    assert_eq!(*m.flushes_all.lock().unwrap(), 1);
    assert_eq!(mmu.stats().invalidations_ranged, 1);
}

#[test]
fn vtd_tables_hold_superpages_and_refuse_addresses_beyond_their_width() {
    let (m, frames) = machine();
    let codec = VtdCodec::new(3, true).unwrap();
    // SAFETY: as above.
    let mmu = unsafe {
        PagedMmu::new(
            codec,
            Walker(m.clone()),
            frames,
            PagedConfig::default(),
            &[],
        )
    }
    .unwrap();
    assert!(mmu.page_sizes().contains(gmem_core::PageSizes::S2M));
    let root = mmu.create_page_table().unwrap();
    mmu.map(
        root,
        &run(
            0x4000_0000,
            0x20_0000,
            2 << 20,
            Prot::WRITE,
            PageSize::Size2M,
        ),
    )
    .unwrap();
    // Level 2 (top of a 3-level table) -> level 1 superpage with W and PS.
    let l2 = mmu.entry(root.0, 1) & crate::vtd::VTD_ADDR_MASK;
    let leaf = mmu.entry(l2, 0);
    assert_eq!(leaf, 0x20_0000 | crate::vtd::VTD_W | crate::vtd::VTD_PS);
    let t = mmu.translate(root, VirtAddr::new(0x4000_0008)).unwrap();
    assert_eq!((t.pa.as_u64(), t.prot), (0x20_0008, Prot::WRITE));
    // 39 bits: nothing at or beyond 512 GiB.
    let r = mmu.map(
        root,
        &run(1 << 39, 0x10_0000, 4096, Prot::RW, PageSize::Size4K),
    );
    assert!(r.is_err());
    // No global mappings: deactivation points the walker at nothing.
    mmu.activate(None);
    assert_eq!(m.roots.lock().unwrap().last(), Some(&None));
}

#[test]
fn bad_runs_are_typed_errors_that_change_nothing() {
    let (m, frames) = machine();
    let codec = VtdCodec::new(3, false).unwrap();
    // SAFETY: as above.
    let mmu = unsafe {
        PagedMmu::new(
            codec,
            Walker(m.clone()),
            frames,
            PagedConfig::default(),
            &[],
        )
    }
    .unwrap();
    let root = mmu.create_page_table().unwrap();
    let held = mmu.frames_held();
    let cases = [
        // A 2 MiB run on a unit without superpages.
        run(0x20_0000, 0x20_0000, 2 << 20, Prot::RW, PageSize::Size2M),
        // Misaligned physical address for a 4 KiB run.
        run(0x1000, 0x1800, 4096, Prot::RW, PageSize::Size4K),
        // No permission.
        run(0x1000, 0x2000, 4096, Prot::empty(), PageSize::Size4K),
        // Empty.
        run(0x1000, 0x2000, 0, Prot::RW, PageSize::Size4K),
    ];
    for c in &cases {
        assert!(
            matches!(mmu.map(root, c), Err(MmuError::Unsupported { .. })),
            "{c:?}"
        );
    }
    let unknown = PageTableRoot(0x12_3000);
    let ok = run(0x1000, 0x2000, 4096, Prot::RW, PageSize::Size4K);
    assert!(matches!(
        mmu.map(unknown, &ok),
        Err(MmuError::Hardware(crate::HW_UNKNOWN_ROOT))
    ));
    assert_eq!(mmu.frames_held(), held);
    assert_eq!(mmu.stats().pages_mapped, 0);
    assert!(mmu.translate(root, VirtAddr::new(0x1000)).is_none());
}
