//! MESC in the discrete GPU's tables (simulated video memory): the stored bits of a
//! level-1 pointer equal a recomputation from its leaves after every edit (map, unmap,
//! protect, remap of one page), Alg. 1's scan finds nothing stale, a leaf of the other
//! aperture breaks a run, and the walk modes translate as a plain walk does.

use crate::format::{GpuCodec, GpuTables, ADDR_MASK};
use gmem_core::testing::TestSystem;
use gmem_core::{
    DevCaps, DeviceId, MapRun, PageSize, PageTableRoot, PhysAddr, Prot, VaRange, VirtAddr,
    PAGE_SIZE,
};
use gmem_ptengine::mesc::{self, Contiguity, Mode};
use gmem_ptengine::TableMemory;
use gmem_sim::{SimMemory, TableFormat};
use std::sync::Arc;

const BASE: u64 = 1 << 36;
/// A 2 MiB-aligned virtual frame.
const VA: u64 = 0x4000_0000;

/// MESC tables in 64 MiB of video memory, and two memories: the GPU's own (its leaves
/// get the local aperture) and another.
fn tables() -> (GpuTables, DeviceId, DeviceId) {
    let m = Arc::new(SimMemory::new("vram", PhysAddr::new(BASE), 64 << 20).unwrap());
    let codec = GpuCodec::with_mesc(0);
    let mut sys = TestSystem::new(1);
    let i = sys.add_device(7, DevCaps::empty(), 0, 0);
    let (host, gpu) = (sys.host().id, sys.devices[i].id);
    codec.bind(gpu).unwrap();
    let t = GpuTables::new(codec, m, PhysAddr::new(BASE), 64).unwrap();
    (t, gpu, host)
}

fn run(va: u64, pa: u64, pages: u64, prot: Prot, memory: DeviceId) -> MapRun {
    MapRun {
        va: VirtAddr::new(va),
        pa: PhysAddr::new(BASE + pa),
        len: pages * PAGE_SIZE,
        prot,
        page_size: PageSize::Size4K,
        memory,
        attrs: Default::default(),
    }
}

fn range(va: u64, pages: u64) -> VaRange {
    VaRange::new(VirtAddr::new(va), pages * PAGE_SIZE).unwrap()
}

/// The raw level-1 entry over `VA`.
fn pointer(t: &GpuTables, root: PageTableRoot) -> u64 {
    let m = t.engine().memory();
    let l2 = m.read(root.0 + gmem_ptengine::index(VA, 2) * 8).unwrap();
    m.read((l2 & ADDR_MASK) + gmem_ptengine::index(VA, 1) * 8)
        .unwrap()
}

/// The stored bits over `VA`, after checking that Alg. 1 finds nothing stale.
fn bits(t: &GpuTables, root: PageTableRoot) -> (u8, bool) {
    let report = mesc::scan(t.codec(), t.engine().memory(), root.0, false);
    assert_eq!(
        report.stale, 0,
        "stored bits differ from the leaves: {report:?}"
    );
    let c = Contiguity::of(pointer(t, root));
    (c.subregions, c.frame)
}

#[test]
fn bits_follow_every_edit_and_alg1_agrees() {
    let (t, gpu, host) = tables();
    let root = t.create().unwrap();
    let pa = 0x20_0000 + 0x7000; // physically unaligned
    t.map(root, &run(VA, pa, 160, Prot::RW, gpu)).unwrap();
    assert_eq!(bits(&t, root), (0b11, false));
    t.map(
        root,
        &run(
            VA + 160 * PAGE_SIZE,
            pa + 160 * PAGE_SIZE,
            352,
            Prot::RW,
            gpu,
        ),
    )
    .unwrap();
    assert_eq!(bits(&t, root), (0xff, true));
    // A protection change breaks subregion 1 and the frame; undoing it restores them.
    t.protect(root, range(VA + 70 * PAGE_SIZE, 1), Prot::READ)
        .unwrap();
    assert_eq!(bits(&t, root), (0xfd, false));
    t.protect(root, range(VA + 70 * PAGE_SIZE, 1), Prot::RW)
        .unwrap();
    assert_eq!(bits(&t, root), (0xff, true));
    // A page migrated elsewhere, then back.
    t.unmap(root, range(VA + 200 * PAGE_SIZE, 1));
    assert_eq!(bits(&t, root), (0xf7, false));
    t.map(
        root,
        &run(VA + 200 * PAGE_SIZE, 0x90_0000, 1, Prot::RW, gpu),
    )
    .unwrap();
    assert_eq!(bits(&t, root), (0xf7, false));
    t.map(
        root,
        &run(VA + 200 * PAGE_SIZE, pa + 200 * PAGE_SIZE, 1, Prot::RW, gpu),
    )
    .unwrap();
    assert_eq!(bits(&t, root), (0xff, true));
    // The same frame number but on the system aperture: not the same run.
    t.map(
        root,
        &run(
            VA + 400 * PAGE_SIZE,
            pa + 400 * PAGE_SIZE,
            1,
            Prot::RW,
            host,
        ),
    )
    .unwrap();
    assert_eq!(bits(&t, root), (0xbf, false));
    let report = mesc::scan(t.codec(), t.engine().memory(), root.0, false);
    assert_eq!(
        (report.pointers, report.subregions, report.frames),
        (1, 7, 0)
    );
    // Unmapping one page of each subregion clears every bit.
    for s in 0..8 {
        t.unmap(root, range(VA + (s * 64 + 3) * PAGE_SIZE, 1));
    }
    assert_eq!(bits(&t, root), (0, false));
}

#[test]
fn a_codec_without_mesc_leaves_the_pointers_bare() {
    let m = Arc::new(SimMemory::new("vram", PhysAddr::new(BASE), 64 << 20).unwrap());
    let t = GpuTables::new(GpuCodec::new(0), m, PhysAddr::new(BASE), 64).unwrap();
    let root = t.create().unwrap();
    let host = TestSystem::new(1).host().id;
    t.map(root, &run(VA, 0x20_0000, 512, Prot::RW, host))
        .unwrap();
    assert_eq!(pointer(&t, root) & mesc::MESC_MASK, 0);
}

#[test]
fn each_walk_mode_translates_as_a_plain_walk() {
    let (t, gpu, _) = tables();
    let root = t.create().unwrap();
    let (codec, memory) = (t.codec(), t.engine().memory());
    let check = |va: u64, mode: Mode, reads: u32| {
        let w = mesc::walk(codec, memory, root.0, va, None);
        let plain = t.lookup(root, VirtAddr::new(va)).unwrap();
        assert_eq!((w.mode, w.reads), (mode, reads), "at {va:#x}");
        let leaf = w.leaf.unwrap();
        assert_eq!(
            leaf.translate(VirtAddr::new(va)),
            plain.translate(VirtAddr::new(va))
        );
        assert_eq!((leaf.prot, leaf.local), (plain.prot, plain.local));
        if let Some(c) = w.coalesced {
            for k in [0, c.pages / 2, c.pages - 1] {
                let v = (c.vpn + k) << 12;
                let leaf = t.lookup(root, VirtAddr::new(v)).unwrap();
                assert_eq!(leaf.frame.as_u64() >> 12, c.pfn + k);
            }
        }
    };
    t.map(root, &run(VA, 0x40_3000, 512, Prot::RW, gpu))
        .unwrap();
    check(VA + 300 * PAGE_SIZE, Mode::Frame, 3);
    t.unmap(root, range(VA + (3 * 64 + 9) * PAGE_SIZE, 1));
    check(VA + (3 * 64 + 20) * PAGE_SIZE, Mode::Normal, 3);
    check(VA + (64 + 7) * PAGE_SIZE, Mode::Subregion, 3);
}
