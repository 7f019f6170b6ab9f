//! Tests of the x86-64 tables against a model: a map from virtual page to (frame,
//! protection) that every sequence of map, unmap and protect must leave the tables
//! agreeing with, leaf by leaf and walk by walk.

use crate::{X86Codec, X86Config};
use gmem_core::testing::TestSystem;
use gmem_core::{
    DeviceId, MapRun, MmuError, PageSize, PageTableRoot, PhysAddr, Prot, VaRange, VirtAddr,
    PAGE_SIZE,
};
use gmem_sim::radix::HW_UNKNOWN_ROOT;
use gmem_sim::{RadixTables, Replacement, SimMemory, TableFormat, Tlb, TlbConfig};
use std::collections::BTreeMap;
use std::sync::Arc;

const POOL: u64 = 0x10_0000;

type X86Tables = RadixTables<X86Codec>;

fn tables(pool_frames: u64, config: X86Config) -> X86Tables {
    let m = Arc::new(SimMemory::new("host", PhysAddr::new(0), 64 << 20).unwrap());
    X86Tables::new(X86Codec { config }, m, PhysAddr::new(POOL), pool_frames).unwrap()
}

fn some_device() -> DeviceId {
    TestSystem::new(1).host().id
}

fn run(va: u64, pa: u64, pages: u64, prot: Prot, memory: DeviceId) -> MapRun {
    MapRun {
        va: VirtAddr::new(va),
        pa: PhysAddr::new(pa),
        len: pages * PAGE_SIZE,
        prot,
        page_size: PageSize::Size4K,
        memory,
        attrs: Default::default(),
    }
}

/// [`run`] with 2 MiB leaves asked for (the run must be 2 MiB aligned in both spaces).
fn run2m(va: u64, pa: u64, pages: u64, prot: Prot, memory: DeviceId) -> MapRun {
    MapRun {
        page_size: PageSize::Size2M,
        ..run(va, pa, pages, prot, memory)
    }
}

/// Map `pages` pages from `va` onto `pa..` as the core does: a 2 MiB leaf for every
/// aligned block the run covers on aligned frames (when `large`), 4 KiB elsewhere.
#[allow(clippy::too_many_arguments)]
fn map_as_core(
    t: &X86Tables,
    root: PageTableRoot,
    va: u64,
    pa: u64,
    pages: u64,
    prot: Prot,
    dev: DeviceId,
    large: bool,
) {
    let (mut v, end) = (va >> 12, (va >> 12) + pages);
    while v < end {
        let f = (pa >> 12) + (v - (va >> 12));
        let big = large && v % 512 == 0 && f % 512 == 0 && v + 512 <= end;
        let n = if big {
            let mut n = 512;
            while v + n + 512 <= end {
                n += 512;
            }
            n
        } else {
            let mut n = 1;
            while v + n < end
                && !(large && (v + n) % 512 == 0 && (f + n) % 512 == 0 && v + n + 512 <= end)
            {
                n += 1;
            }
            n
        };
        let r = if big {
            run2m(v << 12, f << 12, n, prot, dev)
        } else {
            run(v << 12, f << 12, n, prot, dev)
        };
        t.map(root, &r).unwrap();
        v += n;
    }
}

fn range(va: u64, pages: u64) -> VaRange {
    VaRange::new(VirtAddr::new(va), pages * PAGE_SIZE).unwrap()
}

/// The tables' leaves as 4 KiB pages: vpn → (pfn, prot).
fn expand(t: &X86Tables, root: PageTableRoot) -> BTreeMap<u64, (u64, Prot)> {
    let mut m = BTreeMap::new();
    for (va, leaf) in t.leaves(root) {
        let n = 1u64 << (leaf.shift - 12);
        for k in 0..n {
            m.insert(
                (va.as_u64() >> 12) + k,
                ((leaf.frame.as_u64() >> 12) + k, leaf.prot),
            );
        }
    }
    m
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_map_unmap_protect_sequences_agree_with_the_model_leaf_by_leaf_and_walk_by_walk() {
    let dev = some_device();
    for large in [false, true] {
        let t = tables(
            4096,
            X86Config {
                user: true,
                large_pages: large,
                mesc: false,
                granularity_bit: false,
            },
        );
        let root = t.create().unwrap();
        let mut model: BTreeMap<u64, (u64, Prot)> = BTreeMap::new();
        let mut rng = Rng(0x5eed + large as u64);
        // Windows that cross PT, PD and PDPT boundaries, and one in the upper half.
        let windows = [0x3fe0_0000u64, 0x7f_ffe0_0000, 0xffff_8000_0000_0000];
        let prots = [Prot::READ, Prot::RW, Prot::RWX, Prot::READ | Prot::EXEC];
        for step in 0..600 {
            let w = windows[rng.below(3) as usize];
            let first = w + rng.below(1024) * PAGE_SIZE;
            let most = if rng.below(8) == 0 { 1200 } else { 40 };
            let pages = 1 + rng.below(most);
            let prot = prots[rng.below(4) as usize];
            let vpn0 = first >> 12;
            match rng.below(3) {
                0 => {
                    // 2 MiB-aligned physical runs now and then, so large leaves happen.
                    let pa = if rng.below(2) == 0 {
                        (8 + rng.below(8)) << 21 | (first & 0x1f_f000)
                    } else {
                        (16 << 20) + rng.below(4096) * PAGE_SIZE
                    };
                    map_as_core(&t, root, first, pa, pages, prot, dev, large);
                    for k in 0..pages {
                        model.insert(vpn0 + k, ((pa >> 12) + k, prot));
                    }
                }
                1 => {
                    t.unmap(root, range(first, pages));
                    for k in 0..pages {
                        model.remove(&(vpn0 + k));
                    }
                }
                _ => {
                    t.protect(root, range(first, pages), prot).unwrap();
                    for k in 0..pages {
                        if let Some(e) = model.get_mut(&(vpn0 + k)) {
                            e.1 = prot;
                        }
                    }
                }
            }
            if step % 50 == 0 || step == 599 {
                assert_eq!(expand(&t, root), model, "step {step}, large {large}");
            }
            for _ in 0..8 {
                let w = windows[rng.below(3) as usize];
                let va = w + rng.below(2048) * PAGE_SIZE + rng.below(PAGE_SIZE);
                let got = t.lookup(root, VirtAddr::new(va)).map(|l| {
                    let pa = l.translate(VirtAddr::new(va)).as_u64();
                    (pa >> 12, l.prot)
                });
                let want = model.get(&(va >> 12)).copied();
                assert_eq!(got, want, "walk of {va:#x} at step {step}");
            }
        }
        let s = t.stats();
        assert!(
            s.edits.leaves_small > 0 && s.edits.leaves_cleared > 0 && s.edits.leaves_protected > 0
        );
        if large {
            assert!(s.edits.leaves_large > 0, "{s:?}");
            assert!(s.edits.splits > 0, "{s:?}");
        }
        // Unmapping everything leaves only the root: every emptied table was freed (no
        // walker was active, so nothing waited).
        for w in windows {
            t.unmap(root, range(w, 4096));
        }
        assert!(t.leaves(root).is_empty());
        assert_eq!(t.stats().tables_in_use, 1, "large {large}");
        t.destroy(root);
        assert_eq!(t.pool().stats().in_use, 0);
    }
}

#[test]
fn a_cold_walk_reads_four_entries_and_the_walk_cache_cuts_it_to_one() {
    let dev = some_device();
    let t = tables(64, X86Config::default());
    let root = t.create().unwrap();
    t.map(root, &run(0x40_0000, 0x80_0000, 4, Prot::RW, dev))
        .unwrap();
    let w = t.walk(root, VirtAddr::new(0x40_1234), Prot::READ, None);
    assert_eq!((w.reads, w.skipped), (4, 0));
    assert_eq!(
        w.leaf.unwrap().translate(VirtAddr::new(0x40_1234)),
        PhysAddr::new(0x80_1234)
    );
    let mut pwc: Tlb<u64> = Tlb::new(TlbConfig::new(4, 4, Replacement::Lru)).unwrap();
    let cold = t.walk(root, VirtAddr::new(0x40_2000), Prot::READ, Some(&mut pwc));
    let warm = t.walk(root, VirtAddr::new(0x40_3000), Prot::READ, Some(&mut pwc));
    assert_eq!((cold.reads, warm.reads, warm.skipped), (4, 1, 3));
    assert_eq!((pwc.stats().hits, pwc.stats().misses), (1, 1));
    // An address outside the PT's 2 MiB but inside the PD's 1 GiB skips two levels.
    let other = t.walk(root, VirtAddr::new(0x60_0000), Prot::READ, Some(&mut pwc));
    assert_eq!((other.reads, other.skipped, other.leaf), (1, 2, None));
}

#[test]
fn walks_set_accessed_on_use_and_dirty_on_store_with_one_write_each() {
    let dev = some_device();
    let t = tables(64, X86Config::default());
    let root = t.create().unwrap();
    t.map(root, &run(0x1000, 0x9000, 1, Prot::RW, dev)).unwrap();
    let va = VirtAddr::new(0x1000);
    let r = t.walk(root, va, Prot::READ, None);
    assert_eq!((r.writes, r.leaf.unwrap().dirty), (1, false));
    assert_eq!(t.walk(root, va, Prot::READ, None).writes, 0);
    let w = t.walk(root, va, Prot::WRITE, None);
    assert_eq!((w.writes, w.leaf.unwrap().dirty), (1, true));
    assert!(t.leaves(root)[0].1.dirty);
    // A forbidden access changes nothing.
    t.map(root, &run(0x2000, 0xa000, 1, Prot::READ, dev))
        .unwrap();
    let f = t.walk(root, VirtAddr::new(0x2000), Prot::WRITE, None);
    assert_eq!((f.writes, f.leaf.unwrap().prot), (0, Prot::READ));
}

#[test]
fn a_failed_map_leaves_nothing_of_its_run_and_gives_its_tables_back() {
    let dev = some_device();
    // Root + PDPT + PD + one PT: a run crossing into a second PT needs a fifth frame.
    let t = tables(4, X86Config::default());
    let root = t.create().unwrap();
    let r = t.map(root, &run(0x1f_e000, 0x10_0000, 4, Prot::RW, dev));
    assert_eq!(r, Err(MmuError::OutOfTableMemory));
    assert!(t.leaves(root).is_empty());
    assert_eq!(t.stats().tables_in_use, 1);
    assert_eq!(t.stats().edits.failed_maps, 1);
    t.map(root, &run(0x1f_e000, 0x10_0000, 2, Prot::RW, dev))
        .unwrap();
    assert_eq!(t.leaves(root).len(), 2);
}

#[test]
fn bad_requests_are_typed_errors() {
    let dev = some_device();
    let t = tables(16, X86Config::default());
    let root = t.create().unwrap();
    let noncanon = run(0x7fff_ffff_f000, 0x1000, 2, Prot::RW, dev);
    assert_eq!(
        t.map(root, &noncanon),
        Err(MmuError::Unsupported {
            va: VirtAddr::new(0x7fff_ffff_f000)
        })
    );
    let far = run(0x1000, (1 << 52) - 0x1000, 2, Prot::RW, dev);
    assert!(matches!(
        t.map(root, &far),
        Err(MmuError::Unsupported { .. })
    ));
    let ghost = PageTableRoot(0x0424_2000);
    assert_eq!(
        t.map(ghost, &run(0x1000, 0x1000, 1, Prot::RW, dev)),
        Err(MmuError::Hardware(HW_UNKNOWN_ROOT))
    );
    assert_eq!(
        t.protect(ghost, range(0x1000, 1), Prot::READ),
        Err(MmuError::Hardware(HW_UNKNOWN_ROOT))
    );
    t.unmap(ghost, range(0x1000, 1)); // ignored
    assert!(t.leaves(root).is_empty());
}

#[test]
fn emptied_tables_wait_for_every_active_walker_before_they_are_freed() {
    let dev = some_device();
    let t = tables(64, X86Config::default());
    let root = t.create().unwrap();
    let (cpu, gpu) = (t.new_walker(), t.new_walker());
    t.walker_activated(cpu, Some(root));
    t.walker_activated(gpu, Some(root));
    t.map(root, &run(0x40_0000, 0x80_0000, 1, Prot::RW, dev))
        .unwrap();
    assert_eq!(t.stats().tables_in_use, 4);
    t.unmap(root, range(0x40_0000, 1));
    // PT, PD and PDPT were unlinked but both walkers may still cache them.
    assert_eq!(t.stats().tables_in_use, 4);
    assert_eq!(t.stats().reclaim.waiting, 3);
    t.walker_invalidated(cpu, root);
    assert_eq!(t.stats().tables_in_use, 4);
    t.walker_invalidated(gpu, root);
    assert_eq!(t.stats().tables_in_use, 1);
    assert_eq!(t.stats().reclaim.freed_after_invalidation, 3);
}

#[test]
fn large_leaves_split_on_partial_unmap_and_protect_without_allocating() {
    let dev = some_device();
    let t = tables(
        8,
        X86Config {
            user: false,
            large_pages: true,
            mesc: false,
            granularity_bit: false,
        },
    );
    let root = t.create().unwrap();
    // Root, PDPT, PD: 3 frames; two 2 MiB leaves reserve 2 more.
    t.map(root, &run2m(0x4000_0000, 0x20_0000, 1024, Prot::RW, dev))
        .unwrap();
    let s = t.stats();
    assert_eq!(
        (s.edits.leaves_large, s.edits.leaves_small, s.tables_in_use),
        (2, 0, 5)
    );
    let l = t.lookup(root, VirtAddr::new(0x4012_3456)).unwrap();
    assert_eq!(
        (l.shift, l.translate(VirtAddr::new(0x4012_3456))),
        (21, PhysAddr::new(0x32_3456))
    );
    t.protect(root, range(0x4000_1000, 1), Prot::READ).unwrap();
    t.unmap(root, range(0x4020_0000, 1));
    let s = t.stats();
    assert_eq!((s.edits.splits, s.tables_in_use), (2, 5));
    assert_eq!(
        t.lookup(root, VirtAddr::new(0x4000_1000)).unwrap().prot,
        Prot::READ
    );
    assert_eq!(
        t.lookup(root, VirtAddr::new(0x4000_2000)).unwrap().prot,
        Prot::RW
    );
    assert_eq!(t.lookup(root, VirtAddr::new(0x4020_0000)), None);
    assert_eq!(
        t.lookup(root, VirtAddr::new(0x4020_1000))
            .unwrap()
            .translate(VirtAddr::new(0x4020_1000)),
        PhysAddr::new(0x40_1000)
    );
    assert_eq!(expand(&t, root).len(), 1023);
    // Unmapping a whole large leaf gives its reserve back.
    let t2 = tables(
        8,
        X86Config {
            user: false,
            large_pages: true,
            mesc: false,
            granularity_bit: false,
        },
    );
    let r2 = t2.create().unwrap();
    t2.map(r2, &run(0x4000_0000, 0x20_0000, 512, Prot::RW, dev))
        .unwrap();
    assert_eq!(t2.stats().tables_in_use, 4);
    t2.unmap(r2, range(0x4000_0000, 512));
    assert_eq!(t2.stats().tables_in_use, 1);
}

#[test]
fn accessed_bits_are_read_and_cleared_over_a_range_keeping_dirty() {
    let dev = some_device();
    let t = tables(
        16,
        X86Config {
            user: false,
            large_pages: true,
            mesc: false,
            granularity_bit: false,
        },
    );
    let root = t.create().unwrap();
    t.map(root, &run(0x1000, 0x9000, 4, Prot::RW, dev)).unwrap();
    // Nothing used yet: no bit set.
    assert_eq!(
        t.test_and_clear_accessed(root, range(0x1000, 4)),
        Some(false)
    );
    t.walk(root, VirtAddr::new(0x3000), Prot::WRITE, None);
    assert_eq!(
        t.test_and_clear_accessed(root, range(0x1000, 2)),
        Some(false)
    );
    assert_eq!(
        t.test_and_clear_accessed(root, range(0x1000, 4)),
        Some(true)
    );
    // Cleared: asked again, not referenced; the dirty bit stays.
    assert_eq!(
        t.test_and_clear_accessed(root, range(0x3000, 1)),
        Some(false)
    );
    assert!(t.lookup(root, VirtAddr::new(0x3000)).unwrap().dirty);
    // The next use walks and sets it again (one write).
    assert_eq!(
        t.walk(root, VirtAddr::new(0x3000), Prot::READ, None).writes,
        1
    );
    assert_eq!(
        t.test_and_clear_accessed(root, range(0x3000, 1)),
        Some(true)
    );
    // A large leaf: any page of it reports (and clears) the one bit.
    t.map(root, &run2m(0x4000_0000, 0x20_0000, 512, Prot::RW, dev))
        .unwrap();
    t.walk(root, VirtAddr::new(0x4010_0000), Prot::READ, None);
    assert_eq!(
        t.test_and_clear_accessed(root, range(0x4000_0000, 1)),
        Some(true)
    );
    assert_eq!(
        t.test_and_clear_accessed(root, range(0x4000_0000, 512)),
        Some(false)
    );
    // Unmapped ranges and unknown roots: nothing referenced.
    assert_eq!(
        t.test_and_clear_accessed(root, range(0x80_0000, 8)),
        Some(false)
    );
    assert_eq!(
        t.test_and_clear_accessed(PageTableRoot(0x7000), range(0x1000, 1)),
        Some(false)
    );
}

#[test]
fn the_page_size_the_core_asks_for_is_honoured() {
    let dev = some_device();
    let t = tables(
        16,
        X86Config {
            user: false,
            large_pages: true,
            mesc: false,
            granularity_bit: false,
        },
    );
    let root = t.create().unwrap();
    // An aligned block asked for as 4 KiB leaves gets 4 KiB leaves.
    t.map(root, &run(0x4000_0000, 0x20_0000, 512, Prot::RW, dev))
        .unwrap();
    let s = t.stats();
    assert_eq!((s.edits.leaves_large, s.edits.leaves_small), (0, 512));
    // A size the format lacks, or a misaligned large run, is refused, nothing mapped.
    let mut big = run2m(0x8000_0000, 0x40_0000, 512, Prot::RW, dev);
    big.page_size = PageSize::Size1G;
    assert!(matches!(
        t.map(root, &big),
        Err(MmuError::Unsupported { .. })
    ));
    assert!(matches!(
        t.map(root, &run2m(0x8000_0000, 0x41_0000, 512, Prot::RW, dev)),
        Err(MmuError::Unsupported { .. })
    ));
    assert!(t.lookup(root, VirtAddr::new(0x8000_0000)).is_none());
    // Asked for as 2 MiB: one leaf.
    t.map(root, &run2m(0x8000_0000, 0x40_0000, 512, Prot::RW, dev))
        .unwrap();
    assert_eq!(
        t.lookup(root, VirtAddr::new(0x8000_0000)).unwrap().shift,
        21
    );
}
