//! The engine against a model, with a test codec and a plain in-memory table memory.
//!
//! The test codec is a four-level format with large leaves at levels 1 and 2, four
//! opaque format bits in every leaf, and derived bits in level-1 table entries: one bit
//! per 64-page subregion of the 2 MiB below, set when its 64 entries are present 4 KiB
//! leaves that map contiguous frames with one protection (the shape of MESC's
//! contiguity bits).

use crate::*;
use gmem_core::{DeviceId, PageTableFormat, PhysAddr, Prot};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::vec::Vec;

const VALID: u64 = 1;
const LEAF: u64 = 1 << 1;
const R: u64 = 1 << 2;
const W: u64 = 1 << 3;
const X: u64 = 1 << 4;
const BITS_SHIFT: u32 = 5;
const BITS_MASK: u64 = 0xf << BITS_SHIFT;
const ADDR: u64 = 0x000f_ffff_ffff_f000;
const DERIVED_SHIFT: u32 = 52;
const DERIVED: u64 = 0xff << DERIVED_SHIFT;

struct TestCodec {
    large: u32,
    derived: bool,
}

fn prot_bits(p: Prot) -> u64 {
    let mut b = 0;
    if p.contains(Prot::READ) {
        b |= R;
    }
    if p.contains(Prot::WRITE) {
        b |= W;
    }
    if p.contains(Prot::EXEC) {
        b |= X;
    }
    b
}

/// The derived bits a level-1 entry must hold for the leaf table `below`.
fn contiguity(below: &[u64; 512]) -> u64 {
    let mut bits = 0;
    for k in 0..8 {
        let sub = &below[k * 64..(k + 1) * 64];
        let first = sub[0];
        let ok = first & VALID != 0
            && sub.iter().enumerate().all(|(i, &e)| {
                e & VALID != 0
                    && (e & ADDR) == (first & ADDR) + i as u64 * 4096
                    && (e & (R | W | X)) == (first & (R | W | X))
            });
        if ok {
            bits |= 1 << (DERIVED_SHIFT + k as u32);
        }
    }
    bits
}

impl Codec for TestCodec {
    fn format(&self) -> PageTableFormat {
        PageTableFormat(0x7e57)
    }
    fn levels(&self) -> u32 {
        4
    }
    fn va_ok(&self, va: u64, len: u64) -> bool {
        len > 0 && va.checked_add(len).is_some_and(|e| e <= 1 << 48)
    }
    fn large_levels(&self) -> u32 {
        self.large
    }
    fn table(&self, table: PhysAddr) -> Option<u64> {
        Some(table.as_u64() | VALID)
    }
    fn format_bits(&self) -> u64 {
        0xf
    }
    fn leaf(&self, frame: PhysAddr, level: u32, run: &Run) -> Option<u64> {
        let f = frame.as_u64();
        if f & !ADDR != 0 || f % level_size(level) != 0 || run.prot.is_empty() {
            return None;
        }
        let leaf = if level > 0 { LEAF } else { 0 };
        Some(f | VALID | leaf | prot_bits(run.prot) | run.bits << BITS_SHIFT)
    }
    fn decode(&self, raw: u64, level: u32) -> Entry {
        if raw & VALID == 0 {
            return Entry::NotPresent;
        }
        if level > 0 && raw & LEAF == 0 {
            return Entry::Table(PhysAddr::new(raw & ADDR));
        }
        let mut prot = Prot::empty();
        prot.set(Prot::READ, raw & R != 0);
        prot.set(Prot::WRITE, raw & W != 0);
        prot.set(Prot::EXEC, raw & X != 0);
        Entry::Leaf(Leaf {
            frame: PhysAddr::new(raw & ADDR),
            shift: level_shift(level),
            prot,
            dirty: true,
            local: false,
            bits: (raw & BITS_MASK) >> BITS_SHIFT,
        })
    }
    fn with_prot(&self, raw: u64, prot: Prot, _: u32) -> Option<u64> {
        (!prot.is_empty()).then(|| (raw & !(R | W | X)) | prot_bits(prot))
    }
    fn split(&self, raw: u64, level: u32, i: u64) -> u64 {
        let keep = raw & !ADDR & !if level > 1 { 0 } else { LEAF };
        ((raw & ADDR) + i * level_size(level - 1)) | keep
    }
    fn derived_levels(&self) -> u32 {
        if self.derived {
            1 << 1
        } else {
            0
        }
    }
    fn derive(&self, entry: u64, _: u32, below: &[u64; 512]) -> u64 {
        (entry & !DERIVED) | contiguity(below)
    }
}

/// Table pages in a map, handed out lowest address first, with optional counts.
struct VecMemory {
    state: Mutex<Pages>,
    counted: bool,
}

struct Pages {
    pages: BTreeMap<u64, Vec<u64>>,
    free: BTreeSet<u64>,
    counts: BTreeMap<u64, u32>,
    retired: u64,
}

impl VecMemory {
    fn new(frames: u64, counted: bool) -> VecMemory {
        VecMemory {
            state: Mutex::new(Pages {
                pages: BTreeMap::new(),
                free: (0..frames).map(|i| 0x10_0000 + i * 4096).collect(),
                counts: BTreeMap::new(),
                retired: 0,
            }),
            counted,
        }
    }
    fn in_use(&self) -> usize {
        self.state.lock().unwrap().pages.len()
    }
}

impl TableMemory for VecMemory {
    fn read(&self, pa: u64) -> Option<u64> {
        let s = self.state.lock().unwrap();
        s.pages
            .get(&(pa & !0xfff))
            .map(|p| p[(pa & 0xfff) as usize / 8])
    }
    fn write(&self, pa: u64, raw: u64) -> Option<()> {
        let mut s = self.state.lock().unwrap();
        let p = s.pages.get_mut(&(pa & !0xfff))?;
        p[(pa & 0xfff) as usize / 8] = raw;
        Some(())
    }
    fn alloc(&self) -> Option<u64> {
        let mut s = self.state.lock().unwrap();
        let f = s.free.pop_first()?;
        s.pages.insert(f, std::vec![0; 512]);
        s.counts.insert(f, 0);
        Some(f)
    }
    fn free(&self, table: u64) {
        let mut s = self.state.lock().unwrap();
        assert!(
            s.pages.remove(&table).is_some(),
            "double free of {table:#x}"
        );
        s.counts.remove(&table);
        s.free.insert(table);
    }
    fn retire(&self, _root: u64, table: u64) {
        self.state.lock().unwrap().retired += 1;
        self.free(table);
    }
    fn count(&self, table: u64, delta: i32) -> Option<u32> {
        if !self.counted {
            return None;
        }
        let mut s = self.state.lock().unwrap();
        let c = s.counts.get_mut(&table)?;
        *c = c.checked_add_signed(delta).expect("count underflow");
        Some(*c)
    }
}

impl AtomicTableMemory for VecMemory {}

/// SplitMix64: seeded, deterministic.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

fn dev() -> Option<DeviceId> {
    Some(DeviceId::from_raw(0, 1))
}

const PROTS: [Prot; 3] = [Prot::READ, Prot::RW, Prot::RWX];
/// A window straddling a 1 GiB boundary (levels 2 and 1 both cross).
const WINDOW: u64 = (1 << 30) - (32 << 20);
/// Pages in the window (64 MiB: 32 slots of 2 MiB).
const SPAN: u64 = 16384;

type Model = BTreeMap<u64, (u64, Prot, u64)>;

/// The tree's leaves as 4 KiB pages: vpn → (pfn, prot, bits).
fn expand<M: TableMemory>(e: &Engine<TestCodec, M>, root: u64) -> Model {
    let mut m = BTreeMap::new();
    e.for_each_leaf(root, |va, leaf| {
        for k in 0..1u64 << (leaf.shift - 12) {
            m.insert(
                (va >> 12) + k,
                ((leaf.frame.as_u64() >> 12) + k, leaf.prot, leaf.bits),
            );
        }
    });
    m
}

/// The level-1 table covering virtual address 0.
fn l1_table(e: &Engine<TestCodec, VecMemory>, root: u64) -> u64 {
    let l2 = e.memory().read(root).unwrap() & ADDR;
    e.memory().read(l2).unwrap() & ADDR
}

fn run_sequence(seed: u64, large: u32, derived: bool, counted: bool, reserve: bool) {
    // Small pools without a reserve: splits and maps run out of pages.
    let mem = VecMemory::new(if reserve { 400 } else { 24 }, counted);
    let mut e = Engine::new(TestCodec { large, derived }, mem).unwrap();
    if reserve {
        e = e.with_split_reserve();
    }
    let root = e.create_root().unwrap();
    let mut model = Model::new();
    let mut rng = Rng(seed);
    for step in 0..120 {
        // A third of the edits start on a 2 MiB boundary, a quarter run long.
        let page = match rng.below(3) {
            0 => rng.below(SPAN / 512) * 512,
            _ => rng.below(SPAN),
        };
        let pages = 1 + match rng.below(4) {
            0 => 512 + rng.below(600),
            _ => rng.below(80),
        };
        let pages = pages.min(SPAN - page);
        let va = WINDOW + page * 4096;
        match rng.below(10) {
            0..=3 => {
                // Frames 2 MiB aligned in phase with va half the time: large leaves.
                let pa = if rng.below(2) == 0 {
                    (1 << 32) + (va & ((1 << 30) - 1))
                } else {
                    (2 << 32) + rng.below(1 << 20) * 4096
                };
                let prot = PROTS[rng.below(3) as usize];
                let bits = rng.below(16);
                let run = Run {
                    va,
                    pa,
                    len: pages * 4096,
                    prot,
                    memory: dev(),
                    bits,
                };
                match e.map(root, &run) {
                    Ok(()) => {
                        for k in 0..pages {
                            model.insert((va >> 12) + k, ((pa >> 12) + k, prot, bits));
                        }
                    }
                    // With a reserve, the run is taken back whole; without one, taking
                    // back a run that split a large leaf may itself run out of pages.
                    Err(EditError::OutOfTableMemory) if reserve => {
                        for k in 0..pages {
                            model.remove(&((va >> 12) + k));
                        }
                    }
                    Err(EditError::OutOfTableMemory) => model = expand(&e, root),
                    Err(err) => panic!("step {step}: map failed: {err}"),
                }
            }
            4..=6 => {
                match e.unmap(root, va, pages * 4096) {
                    Ok(_) => {
                        for k in 0..pages {
                            model.remove(&((va >> 12) + k));
                        }
                    }
                    // Without a reserve a split may find no page: what came before
                    // the failure is unmapped, the rest kept.
                    Err(EditError::OutOfTableMemory) if !reserve => model = expand(&e, root),
                    Err(err) => panic!("step {step}: unmap failed: {err}"),
                }
            }
            _ => {
                let prot = PROTS[rng.below(3) as usize];
                match e.protect(root, va, pages * 4096, prot) {
                    Ok(_) => {
                        for k in 0..pages {
                            if let Some(x) = model.get_mut(&((va >> 12) + k)) {
                                x.1 = prot;
                            }
                        }
                    }
                    Err(EditError::OutOfTableMemory) if !reserve => model = expand(&e, root),
                    Err(err) => panic!("step {step}: protect failed: {err}"),
                }
            }
        }
        // The whole tree every fifth step, walks and derived bits every step.
        if step % 5 == 4 {
            let got = expand(&e, root);
            if got != model {
                let diff = got.iter().zip(model.iter()).find(|(a, b)| a != b);
                let (g, m) = (got.len(), model.len());
                panic!("seed {seed} step {step}: tree {g} pages, model {m}; first {diff:?}");
            }
        }
        assert_eq!(
            e.check_derived(root),
            Ok(()),
            "seed {seed} step {step}: derived bits"
        );
        for _ in 0..8 {
            let v = WINDOW + rng.below(SPAN) * 4096 + rng.below(4096);
            let got = e.lookup(root, v).map(|l| {
                (
                    l.translate(gmem_core::VirtAddr::new(v)).as_u64(),
                    l.prot,
                    l.bits,
                )
            });
            let want = model
                .get(&(v >> 12))
                .map(|&(pfn, p, b)| ((pfn << 12) | (v & 0xfff), p, b));
            assert_eq!(got, want, "seed {seed} step {step}: walk of {v:#x}");
        }
    }
    assert_eq!(expand(&e, root), model, "seed {seed}: final tree");
    let s = e.stats();
    if large != 0 {
        assert!(s.leaves_large > 0 && s.splits > 0, "{s:?}");
    }
    e.unmap(root, WINDOW, SPAN * 4096).unwrap();
    assert!(expand(&e, root).is_empty());
    // Only the root is left: emptied tables went back, and so did the reserves of
    // the cleared large leaves.
    assert_eq!(
        e.memory().in_use(),
        1,
        "seed {seed}: tables or reserves leaked"
    );
    assert_eq!(e.check_derived(root), Ok(()));
}

#[test]
fn random_edits_agree_with_the_model_and_reclaim_every_emptied_table() {
    for seed in 1..=2 {
        run_sequence(seed * 0x9e37_79b9, 0b110, true, true, true);
        run_sequence(seed * 0x1234_5677, 0b010, true, false, true);
        run_sequence(seed * 0x5151_5151, 0, false, true, false);
    }
}

#[test]
fn without_a_split_reserve_edits_still_agree_with_what_the_tree_holds() {
    for seed in 1..=2 {
        run_sequence(seed * 0x7777_1111, 0b010, true, true, false);
    }
}

#[test]
fn a_partial_unmap_splits_a_large_leaf_into_equivalent_small_ones() {
    let e = Engine::new(
        TestCodec {
            large: 0b010,
            derived: true,
        },
        VecMemory::new(16, true),
    )
    .unwrap()
    .with_split_reserve();
    let root = e.create_root().unwrap();
    let run = Run {
        va: 0x20_0000,
        pa: 0x4000_0000,
        len: 0x20_0000,
        prot: Prot::RW,
        memory: dev(),
        bits: 5,
    };
    e.map(root, &run).unwrap();
    assert_eq!(e.lookup(root, 0x20_0000).unwrap().shift, 21);
    // root + level-2 and level-1 tables + the reserve
    assert_eq!(e.memory().in_use(), 4);
    let done = e.unmap(root, 0x20_1000, 0x1000).unwrap();
    assert_eq!(done.pages, 1);
    let s = e.stats();
    assert_eq!(
        (s.splits, s.tables_allocated),
        (1, 3),
        "the split used the reserve"
    );
    let l = e.lookup(root, 0x20_2000).unwrap();
    assert_eq!(
        (l.shift, l.frame.as_u64(), l.bits, l.prot),
        (12, 0x4000_2000, 5, Prot::RW)
    );
    assert!(e.lookup(root, 0x20_1000).is_none());
    // The first subregion lost a page; the other seven stay contiguous.
    let entry = e.memory().read(l1_table(&e, root) + 8).unwrap();
    assert_eq!(entry & DERIVED, 0xfe << DERIVED_SHIFT);
    e.protect(root, 0x20_0000, 0x20_0000, Prot::READ).unwrap();
    assert_eq!(e.check_derived(root), Ok(()));
    e.unmap(root, 0x20_0000, 0x20_0000).unwrap();
    assert_eq!(
        e.memory().in_use(),
        1,
        "split table and level-1 table reclaimed"
    );
}

#[test]
fn derived_bits_follow_every_edit_of_the_leaves_below() {
    let e = Engine::new(
        TestCodec {
            large: 0,
            derived: true,
        },
        VecMemory::new(16, false),
    )
    .unwrap();
    let root = e.create_root().unwrap();
    let entry =
        |e: &Engine<TestCodec, VecMemory>| e.memory().read(l1_table(e, root)).unwrap() & DERIVED;
    let run = |va: u64, pa: u64, pages: u64| Run {
        va,
        pa,
        len: pages * 4096,
        prot: Prot::RW,
        memory: dev(),
        bits: 0,
    };
    e.map(root, &run(0, 0x100_0000, 63)).unwrap();
    assert_eq!(entry(&e), 0, "63 pages are not a subregion");
    e.map(root, &run(63 * 4096, 0x100_0000 + 63 * 4096, 65))
        .unwrap();
    assert_eq!(entry(&e), 0b11 << DERIVED_SHIFT);
    e.map(root, &run(70 * 4096, 0x900_0000, 1)).unwrap();
    assert_eq!(
        entry(&e),
        0b01 << DERIVED_SHIFT,
        "a remapped page breaks its subregion"
    );
    e.protect(root, 0, 4096, Prot::READ).unwrap();
    assert_eq!(entry(&e), 0, "a protection change breaks it too");
    assert!(e.stats().derived_updates >= 3);
    assert_eq!(e.check_derived(root), Ok(()));
    // A stale bit is caught.
    let l1 = l1_table(&e, root);
    let l0 = e.memory().read(l1).unwrap() & ADDR;
    e.memory()
        .write(l1, l0 | VALID | 1 << DERIVED_SHIFT)
        .unwrap();
    assert_eq!(e.check_derived(root), Err(l1));
}

#[test]
fn format_bits_round_trip_through_map_split_protect_and_walk() {
    let e = Engine::new(
        TestCodec {
            large: 0b010,
            derived: false,
        },
        VecMemory::new(32, true),
    )
    .unwrap();
    let root = e.create_root().unwrap();
    for bits in 0..16 {
        let va = bits * 0x40_0000;
        let run = Run {
            va,
            pa: 0x8000_0000 + va,
            len: 0x20_0000,
            prot: Prot::RW,
            memory: dev(),
            bits,
        };
        e.map(root, &run).unwrap();
        e.protect(root, va + 0x1000, 0x1000, Prot::READ).unwrap();
        let w = e.walk(root, e.top(), va + 0x1000, Some(Prot::READ), |_, _| {});
        assert_eq!(
            w.leaf.map(|l| (l.bits, l.shift, l.prot)),
            Some((bits, 12, Prot::READ))
        );
        assert_eq!(e.lookup(root, va + 0x3000).map(|l| l.bits), Some(bits));
    }
    let bad = Run {
        va: 0,
        pa: 0x8000_0000,
        len: 0x1000,
        prot: Prot::RW,
        memory: dev(),
        bits: 16,
    };
    assert_eq!(e.map(root, &bad), Err(EditError::Unsupported { va: 0 }));
    let kept = e.lookup(root, 0).map(|l| (l.bits, l.frame.as_u64()));
    assert_eq!(
        kept,
        Some((0, 0x8000_0000)),
        "a refused map changes nothing"
    );
}

#[test]
fn a_failed_map_takes_its_run_back_and_its_tables_too() {
    let e = Engine::new(
        TestCodec {
            large: 0,
            derived: false,
        },
        VecMemory::new(4, true),
    )
    .unwrap();
    let root = e.create_root().unwrap();
    // Two leaf tables are needed, the memory has room for the root, one level-2, one
    // level-1 and one level-0 table.
    let run = Run {
        va: 0x1f_f000,
        pa: 0x100_0000,
        len: 0x2000,
        prot: Prot::RW,
        memory: dev(),
        bits: 0,
    };
    assert_eq!(e.map(root, &run), Err(EditError::OutOfTableMemory));
    assert!(e.lookup(root, 0x1f_f000).is_none());
    assert_eq!(e.memory().in_use(), 1);
    assert_eq!(e.stats().failed_maps, 1);
    let top = Run {
        pa: u64::MAX - 0xfff,
        ..run
    };
    assert_eq!(
        e.map(root, &top),
        Err(EditError::Unsupported { va: run.va })
    );
    assert_eq!(
        e.map(root, &Run { va: 1 << 48, ..run }),
        Err(EditError::Unsupported { va: 1 << 48 })
    );
}

#[test]
fn concurrent_disciplines_refuse_large_leaves_and_derived_bits_and_rw_reports_emptied_tables() {
    let c = |large, derived| TestCodec { large, derived };
    for d in [Discipline::Cas, Discipline::Rw] {
        assert!(matches!(
            Engine::concurrent(c(0b10, false), VecMemory::new(4, true), d),
            Err(ConfigError::NeedsPlainCodec)
        ));
        assert!(Engine::concurrent(c(0, true), VecMemory::new(4, true), d).is_err());
    }
    assert!(matches!(
        Engine::new(c(1, false), VecMemory::new(4, true)),
        Err(ConfigError::BadGeometry)
    ));
    assert!(Engine::new(c(1 << 4, false), VecMemory::new(4, true)).is_err());
    let e = Engine::concurrent(c(0, false), VecMemory::new(8, true), Discipline::Rw).unwrap();
    let root = e.create_root().unwrap();
    let run = Run {
        va: 0x5000,
        pa: 0x100_0000,
        len: 0x2000,
        prot: Prot::RW,
        memory: dev(),
        bits: 0,
    };
    e.map(root, &run).unwrap();
    let done = e.unmap(root, 0x5000, 0x1000).unwrap();
    assert!(done.emptied.is_empty(), "the leaf table still holds a page");
    let done = e.unmap(root, 0x6000, 0x1000).unwrap();
    assert_eq!(done.emptied, std::vec![0x6000]);
    assert_eq!(
        e.memory().in_use(),
        4,
        "nothing unlinked before the writer runs"
    );
    assert!(e.collapse(root, 0x6000));
    assert_eq!(e.memory().in_use(), 1);
    assert!(!e.collapse(root, 0x6000));
    let s = e.stats();
    assert_eq!(
        (s.tables_unlinked, s.writer_reclaims, s.reclaims_abandoned),
        (3, 2, 1)
    );

    let e = Engine::concurrent(c(0, false), VecMemory::new(8, true), Discipline::Cas).unwrap();
    let root = e.create_root().unwrap();
    e.map(root, &run).unwrap();
    let done = e.unmap(root, 0x5000, 0x2000).unwrap();
    assert_eq!((done.pages, done.emptied.len()), (2, 0));
    assert_eq!(e.memory().in_use(), 4, "CAS never reclaims");
    e.free_tree(root, |_| false);
    assert_eq!(e.memory().in_use(), 1);
}
