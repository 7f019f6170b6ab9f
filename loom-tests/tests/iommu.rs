//! Loom models (d): the IOMMU page tables of `gmem-iommu`, where two DMA mappings meet
//! on a shared intermediate table.
//!
//! Every model sets up on one thread: a table memory of [`FRAMES`] frames, a root, and
//! one mapping (so the root's path down to the level-1 table exists). Two threads then
//! run map and unmap calls on disjoint pages at once; afterwards the main thread checks
//! the table with software walks and the table memory's counters. No walker is active,
//! so a reclaimed table page goes straight back to the free list and "frames in use" is
//! exactly the set of frames linked into the table.
//!
//! - CAS discipline: two mappers need the same missing leaf table (exactly one is
//!   installed, the loser's page goes back, both mappings are reachable); and a map
//!   racing an unmap of its neighbour in the same leaf table (loom finds no dependent
//!   access between the two: distinct leaf words, and CAS never unlinks a table, so
//!   one execution covers every interleaving).
//!   Broken variant `--cfg gmem_loom_bug="iommu_cas_plain_store"` installs with a load
//!   and a store instead of a CAS; the model must see a table installed twice.
//! - RW discipline: an unmap empties a leaf table (and reclaims it and its empty parents
//!   under the write lock) while a mapper puts a page in that same table under the read
//!   lock. Afterwards the mapping is reachable, no freed page is linked and the frames
//!   in use are exactly the linked tables. Broken variant
//!   `--cfg gmem_loom_bug="iommu_rw_no_recheck"` reclaims without re-checking the count
//!   under the write lock; the model must see the mapping lost.

#![cfg(gmem_loom)]

mod common;

use std::collections::HashSet;

use gmem_core::PAGE_SIZE;
use gmem_core::{DeviceId, MapRun, PageSize, PageTableRoot, PhysAddr, Prot, VaRange, VirtAddr};
use gmem_iommu::{Discipline, IoTables};
use gmem_sim::TableFormat;
use loom::sync::Arc;

/// Preemption bound of the CAS models (they explore the same executions unbounded).
const CAS_PREEMPTIONS: usize = 4;
/// Preemption bound of the RW model (it explores the same executions unbounded).
const RW_PREEMPTIONS: usize = 4;
/// Frames of the table memory: a root, three tables of one path and spares.
const FRAMES: u64 = 8;
/// The table memory's physical base.
const BASE: u64 = 0x100_0000;
/// Levels of intermediate tables below the root (x86-64, 4 levels).
const INTERMEDIATE: u64 = 3;

fn run(va: u64, pa: u64) -> MapRun {
    MapRun {
        va: VirtAddr::new(va),
        pa: PhysAddr::new(pa),
        len: PAGE_SIZE,
        prot: Prot::READ | Prot::WRITE,
        page_size: PageSize::Size4K,
        memory: DeviceId::from_raw(0, 1),
        attrs: Default::default(),
    }
}

fn page(va: u64) -> VaRange {
    VaRange::new(VirtAddr::new(va), PAGE_SIZE).unwrap()
}

/// Tables of `discipline` with a root, and `va` mapped to `pa`.
fn setup(discipline: Discipline, va: u64, pa: u64) -> (Arc<IoTables>, PageTableRoot) {
    let t = IoTables::new(discipline, PhysAddr::new(BASE), FRAMES).unwrap();
    let root = t.create().unwrap();
    t.map(root, &run(va, pa)).unwrap();
    (Arc::new(t), root)
}

/// The table frames on `va`'s path below the root, read as the hardware walker does.
fn path(t: &IoTables, root: PageTableRoot, va: u64) -> Vec<u64> {
    let mut frames = Vec::new();
    let mut table = root.0;
    for level in (1..=INTERMEDIATE as u32).rev() {
        let shift = 12 + 9 * level;
        let entry = table + ((va >> shift) & 511) * 8;
        let raw = t.memory().read_u64(PhysAddr::new(entry)).unwrap_or(0);
        if raw & 1 == 0 {
            break;
        }
        table = raw & 0x000f_ffff_ffff_f000;
        frames.push(table);
    }
    frames
}

/// `va` translates to `pa` in `root`.
fn assert_mapped(t: &IoTables, root: PageTableRoot, va: u64, pa: u64, what: &str) {
    let leaf = t.lookup(root, VirtAddr::new(va));
    assert!(
        leaf.is_some_and(|l| l.frame.as_u64() == pa),
        "{what}: mapping of {va:#x} lost (walk found {leaf:?})"
    );
}

/// Both threads' mappings share one leaf table (same 2 MiB); the setup's mapping lives
/// in another leaf table under the same level-1 table, so only the leaf table is missing.
const A: u64 = 0x4000_0000;
const B: u64 = A + PAGE_SIZE;
const OTHER: u64 = A + (2 << 20);

#[test]
#[cfg_attr(
    gmem_loom_bug = "iommu_cas_plain_store",
    should_panic(expected = "installed twice")
)]
fn cas_mappers_of_one_missing_table_install_it_once_and_both_map() {
    common::model("iommu cas install", CAS_PREEMPTIONS, || {
        let (t, root) = setup(Discipline::Cas, OTHER, 0x9000_0000);
        let installs_before = t.installs();
        let t1 = t.clone();
        let h = loom::thread::spawn(move || t1.map(root, &run(A, 0xa000_0000)).unwrap());
        t.map(root, &run(B, 0xb000_0000)).unwrap();
        h.join().unwrap();

        assert_eq!(
            t.installs() - installs_before,
            1,
            "the missing leaf table was installed twice (or not at all)"
        );
        assert_mapped(&t, root, A, 0xa000_0000, "cas install");
        assert_mapped(&t, root, B, 0xb000_0000, "cas install");
        assert_mapped(&t, root, OTHER, 0x9000_0000, "cas install");
        let (pa, pb) = (path(&t, root, A), path(&t, root, B));
        assert_eq!(pa, pb, "A and B reach different tables");
        // Linked: the root, the shared upper tables, and the two leaf tables.
        assert_eq!(
            t.stats().memory.in_use,
            1 + INTERMEDIATE + 1,
            "a table page leaked (the CAS loser's page did not go back)"
        );
    });
}

#[test]
fn cas_map_racing_an_unmap_of_its_neighbour_keeps_the_map_and_drops_the_neighbour() {
    common::model("iommu cas map vs neighbour unmap", CAS_PREEMPTIONS, || {
        let (t, root) = setup(Discipline::Cas, A, 0xa000_0000);
        let t1 = t.clone();
        let h = loom::thread::spawn(move || t1.unmap(root, page(A)));
        t.map(root, &run(B, 0xb000_0000)).unwrap();
        h.join().unwrap();

        assert_mapped(&t, root, B, 0xb000_0000, "cas map vs unmap");
        assert!(
            t.lookup(root, VirtAddr::new(A)).is_none(),
            "the unmapped neighbour is still mapped"
        );
        // CAS never reclaims: the path stays, nothing more was installed.
        assert_eq!(t.installs(), INTERMEDIATE, "a table was installed again");
        assert_eq!(t.stats().memory.in_use, 1 + INTERMEDIATE, "table pages");
    });
}

#[test]
#[cfg_attr(gmem_loom_bug = "iommu_rw_no_recheck", should_panic(expected = "lost"))]
fn rw_reclaim_racing_a_map_into_the_emptied_table_keeps_the_map_reachable() {
    common::model("iommu rw reclaim vs map", RW_PREEMPTIONS, || {
        let (t, root) = setup(Discipline::Rw, A, 0xa000_0000);
        let t1 = t.clone();
        // The unmap empties the only leaf table (and with it the whole path).
        let h = loom::thread::spawn(move || t1.unmap(root, page(A)));
        t.map(root, &run(B, 0xb000_0000)).unwrap();
        h.join().unwrap();

        assert_mapped(&t, root, B, 0xb000_0000, "rw reclaim vs map");
        assert!(
            t.lookup(root, VirtAddr::new(A)).is_none(),
            "the unmapped page is still mapped"
        );
        let linked = path(&t, root, B);
        assert_eq!(linked.len() as u64, INTERMEDIATE, "B's path is incomplete");
        let distinct: HashSet<u64> = linked.iter().copied().chain([root.0]).collect();
        assert_eq!(
            distinct.len() as u64,
            1 + INTERMEDIATE,
            "a table page linked twice"
        );
        // Nothing else is mapped, so the frames in use are exactly B's path: a freed
        // page still linked would make this smaller, a leaked one larger.
        assert_eq!(
            t.stats().memory.in_use,
            1 + INTERMEDIATE,
            "frames in use differ from the linked tables (freed while linked, or leaked)"
        );
        let s = t.stats();
        assert_eq!(
            s.edits.tables_installed - s.edits.tables_unlinked,
            INTERMEDIATE,
            "installs minus unlinks differ from the linked tables"
        );
    });
}
