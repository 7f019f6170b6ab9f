//! Fragmentation measured and controlled, page groups, and eviction by runs (issue 9,
//! items 3, 6 and 8), on a [`TestSystem`] whose memories hold real bytes.

use gmem_core::testing::TestSystem;
use gmem_core::*;
use gmem_testkit::frag::Fragmenter;

const GPU_BASE: u64 = 0x8000_0000;

/// A host of 1024 pages, a GPU with `pages` pages of memory, one space both are
/// attached to and active in.
fn system(pages: u64) -> (TestSystem, usize, SpaceId) {
    let mut s = TestSystem::without_log(1024);
    let gpu = s.add_device(7, DevCaps::FAULTABLE, GPU_BASE, pages);
    let space =
        s.gm.as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new((1 << 30) + (1 << 26)),
            AllocPolicy::empty(),
        )
        .unwrap();
    for d in [0, gpu] {
        s.gm.as_attach(
            space,
            s.devices[d].id,
            MmuMode::Coherent,
            Activation::Switch,
        )
        .unwrap();
    }
    (s, gpu, space)
}

fn page_bytes(pa: u64) -> Vec<u8> {
    (0..64u64)
        .map(|i| (pa / PAGE_SIZE + i * 7) as u8 | 1)
        .collect()
}

#[test]
fn free_extents_cut_free_runs_into_aligned_blocks() {
    let (s, gpu, space) = system(64);
    let id = s.devices[gpu].id;
    let e = s.gm.dev_free_extents(id).unwrap();
    assert_eq!((e.free, e.registered, e.blocks[6]), (64, 64, 1));
    assert_eq!(e.unusable_index(6), 0.0);
    assert_eq!(e.unusable_index(7), 1.0);
    // Hold every frame, release frames 5..16 (as 5 | 6-7 | 8-15) and frame 33.
    let mut f = Fragmenter::new(space, id);
    assert_eq!(f.fill(&s.gm).unwrap(), 64);
    let held: Vec<(PhysAddr, Region)> = f.held().collect();
    for (pa, r) in &held {
        let pfn = (pa.as_u64() - GPU_BASE) / PAGE_SIZE;
        if (5..16).contains(&pfn) || pfn == 33 {
            s.gm.region_dealloc(*r, MapFlags::empty(), None).unwrap();
        }
    }
    let e = s.gm.dev_free_extents(id).unwrap();
    assert_eq!(e.free, 12);
    assert_eq!(&e.blocks[..5], &[2, 1, 0, 1, 0]);
    assert_eq!(e.free_in_blocks_from(1), 10);
    assert_eq!(e.unusable_frames(3), 4);
    assert!((e.unusable_index(3) - 4.0 / 12.0).abs() < 1e-12);
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn the_fragmenter_reaches_its_target_index() {
    for (target, seed) in [(0.0, 1), (0.5, 2), (0.9, 3), (1.0, 4)] {
        let (s, gpu, space) = system(256);
        let id = s.devices[gpu].id;
        let mut f = Fragmenter::new(space, id);
        f.fill(&s.gm).unwrap();
        let r = f.fragment(&s.gm, 3, target, 128, seed).unwrap();
        assert_eq!(r.free, 128);
        // Whole blocks of 8 frames: the index is a multiple of 8/128.
        assert!(
            (r.achieved - target).abs() <= 8.0 / 128.0 / 2.0 + 1e-12,
            "target {target}: {r:?}"
        );
        assert!(
            (r.achieved - r.scattered as f64 / 128.0).abs() < 1e-12,
            "{r:?}"
        );
        s.gm.check_invariants(space).unwrap();
    }
}

#[test]
fn compaction_makes_aligned_blocks_and_keeps_every_byte() {
    let (s, gpu, space) = system(256);
    let id = s.devices[gpu].id;
    let mut f = Fragmenter::new(space, id);
    f.fill(&s.gm).unwrap();
    let r = f.fragment(&s.gm, 3, 1.0, 128, 7).unwrap();
    assert_eq!(r.achieved, 1.0);
    // Every held page gets bytes of its own, written through the GPU (its frame is in
    // the GPU's memory, so the write maps it in place).
    let pages: Vec<(VirtAddr, Vec<u8>)> = f
        .held()
        .map(|(pa, reg)| (reg.start, page_bytes(pa.as_u64())))
        .collect();
    for (va, b) in &pages {
        s.write(gpu, *va, b).unwrap();
    }
    let before = s.gm.dev_frames(id).unwrap();
    let copies = s.devices[gpu].memory.as_ref().unwrap().counts().copies;
    let rep = s.gm.dev_compact(id, 3).unwrap();
    s.gm.check_invariants(space).unwrap();
    let after = s.gm.dev_frames(id).unwrap();
    assert_eq!(before, after, "compaction moves pages within the memory");
    // 128 pages in use fit in 16 blocks of 8: at least half of the 32 blocks can be
    // freed; scattered holes make the exact number depend on the seed.
    assert_eq!(rep.free_blocks_before, 0);
    assert!(rep.blocks_made >= 12, "{rep:?}");
    assert_eq!(rep.free_blocks_after, rep.blocks_made, "{rep:?}");
    assert!(
        rep.pages_moved > 0 && rep.copies <= rep.pages_moved,
        "{rep:?}"
    );
    let copies_made = s.devices[gpu].memory.as_ref().unwrap().counts().copies - copies;
    assert_eq!(
        copies_made, rep.copies,
        "one DeviceMemory::copy per run moved"
    );
    let e = s.gm.dev_free_extents(id).unwrap();
    assert!(e.unusable_index(3) < 0.3, "{e:?}");
    for (va, b) in &pages {
        assert_eq!(&s.read(gpu, *va, b.len()).unwrap(), b, "bytes at {va:?}");
        let (d, _) = s.gm.as_page_frame(space, *va).unwrap().unwrap();
        assert_eq!(d, id, "compaction kept the page in the device");
    }
    s.gm.check_invariants(space).unwrap();
    // A second pass finds nothing left to gain... or makes more; it never loses blocks.
    let again = s.gm.dev_compact(id, 3).unwrap();
    assert!(again.free_blocks_after >= again.free_blocks_before);
    f.refresh(&s.gm).unwrap();
    f.release_all(&s.gm).unwrap();
    assert_eq!(s.gm.dev_frames(id).unwrap().free, 256);
}

#[test]
fn compaction_leaves_wired_pages_where_they_are() {
    let (s, gpu, space) = system(64);
    let id = s.devices[gpu].id;
    let mut f = Fragmenter::new(space, id);
    f.fill(&s.gm).unwrap();
    f.fragment(&s.gm, 2, 1.0, 32, 11).unwrap();
    let wired: Vec<(Region, PhysAddr)> = f.held().step_by(5).map(|(pa, r)| (r, pa)).collect();
    for (r, _) in &wired {
        s.gm.region_wire(*r).unwrap();
    }
    let rep = s.gm.dev_compact(id, 2).unwrap();
    s.gm.check_invariants(space).unwrap();
    for (r, pa) in &wired {
        assert_eq!(
            s.gm.as_page_frame(space, r.start).unwrap(),
            Some((id, *pa)),
            "a wired page never moves"
        );
    }
    assert!(rep.blocks_made > 0, "{rep:?}");
}

#[test]
fn frame_calls_refuse_misuse_and_change_nothing() {
    let (mut s, gpu, space) = system(32);
    let id = s.devices[gpu].id;
    let igpu = s.add_device(1, DevCaps::FAULTABLE, 0, 0);
    let igpu = s.devices[igpu].id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    s.write(gpu, r.start, b"held").unwrap();
    let frames = s.gm.dev_frames(id).unwrap();
    let extents = s.gm.dev_free_extents(id).unwrap();
    let stats = s.gm.stats();
    assert_eq!(
        s.gm.dev_compact(id, 19),
        Err(FrameError::BadOrder { order: 19 })
    );
    assert_eq!(s.gm.dev_compact(igpu, 2), Err(FrameError::NoMemory(igpu)));
    assert_eq!(s.gm.dev_free_extents(igpu), Err(FrameError::NoMemory(igpu)));
    assert_eq!(
        s.gm.dev_set_page_groups(id, Some(19)),
        Err(FrameError::BadOrder { order: 19 })
    );
    let used = frames.registered - frames.free;
    assert!(used > 0);
    assert_eq!(
        s.gm.dev_set_page_groups(id, Some(2)),
        Err(FrameError::FramesInUse { frames: used })
    );
    assert_eq!(s.gm.dev_page_groups(id), Ok(None));
    assert_eq!(
        s.gm.dev_set_group_class(id, PhysAddr::new(GPU_BASE), 1),
        Err(FrameError::NoGroups(id))
    );
    assert_eq!(s.gm.dev_frames(id).unwrap(), frames);
    assert_eq!(s.gm.dev_free_extents(id).unwrap(), extents);
    assert_eq!(s.gm.stats(), stats, "no fault, move or map happened");
    s.gm.check_invariants(space).unwrap();
    let dead = s.add_device(9, DevCaps::empty(), 0x9000_0000, 4);
    let dead = s.devices[dead].id;
    s.gm.dev_destroy(dead).unwrap();
    assert_eq!(
        s.gm.dev_compact(dead, 1),
        Err(FrameError::UnknownDevice(dead))
    );
    assert_eq!(
        s.gm.as_page_frame(space, VirtAddr::new(1 << 29)),
        Err(LookupError::NotAllocated(VirtAddr::new(1 << 29)))
    );
}

#[test]
fn page_groups_hold_one_class_each_and_the_driver_hears_first() {
    let (s, gpu, space) = system(64);
    let id = s.devices[gpu].id;
    let mem = s.devices[gpu].memory.clone().unwrap();
    s.gm.dev_set_page_groups(id, Some(2)).unwrap();
    let g = s.gm.dev_page_groups(id).unwrap().unwrap();
    assert_eq!((g.order, g.groups, g.empty), (2, 16, 16));
    assert_eq!(g.by_class, vec![(0, 16, 64)]);
    mem.set_frame_classes(Some(2));
    let r =
        s.gm.as_alloc(space, AllocRequest::new(48 * PAGE_SIZE))
            .unwrap();
    s.gm.region_set_zero_fill_block(r, PAGE_SIZE).unwrap();
    // Touch pages out of order so both classes are requested interleaved.
    let mut order: Vec<u64> = (0..48).collect();
    order.sort_by_key(|p| (p * 29) % 48);
    for p in order {
        let va = VirtAddr::new(r.start.as_u64() + p * PAGE_SIZE);
        s.write(gpu, va, &[p as u8 | 1]).unwrap();
        s.gm.check_invariants(space).unwrap();
        let (d, pa) = s.gm.as_page_frame(space, va).unwrap().unwrap();
        assert_eq!(d, id);
        let class = mem.class_of(va);
        assert_eq!(s.gm.dev_group_class(id, pa), Ok(Some(class)), "page {p}");
        // The driver's own view, built only from the announcements, agrees.
        let told = mem
            .class_changes()
            .iter()
            .rev()
            .find(|(base, n, _, _)| {
                (base.as_u64()..base.as_u64() + n * PAGE_SIZE).contains(&pa.as_u64())
            })
            .map_or(0, |c| c.3);
        assert_eq!(
            told, class,
            "page {p}: the driver was told the group's class"
        );
    }
    for c in mem.class_changes() {
        assert_ne!(c.2, c.3, "an announced change changes the class");
        assert_eq!(c.1, 4, "whole groups change");
    }
    let g = s.gm.dev_page_groups(id).unwrap().unwrap();
    assert_eq!(g.class_changes, mem.class_changes().len() as u64);
    // A group in use keeps its class.
    let (_, pa) = s.gm.as_page_frame(space, r.start).unwrap().unwrap();
    let class = mem.class_of(r.start);
    assert!(matches!(
        s.gm.dev_set_group_class(id, pa, class + 5),
        Err(FrameError::GroupInUse { .. })
    ));
    assert_eq!(s.gm.dev_group_class(id, pa), Ok(Some(class)));
    assert_eq!(
        s.gm.dev_set_group_class(id, PhysAddr::new(GPU_BASE + 64 * PAGE_SIZE), 1),
        Err(FrameError::NotRegistered {
            pa: PhysAddr::new(GPU_BASE + 64 * PAGE_SIZE)
        })
    );
    // Memory pressure across classes: more pages than frames, every byte kept.
    let big =
        s.gm.as_alloc(space, AllocRequest::new(96 * PAGE_SIZE))
            .unwrap();
    s.gm.region_set_zero_fill_block(big, PAGE_SIZE).unwrap();
    for p in 0..96u64 {
        let va = VirtAddr::new(big.start.as_u64() + p * PAGE_SIZE);
        s.write(gpu, va, &[(p as u8) ^ 0x5a]).unwrap();
        s.gm.check_invariants(space).unwrap();
    }
    for p in 0..96u64 {
        let va = VirtAddr::new(big.start.as_u64() + p * PAGE_SIZE);
        assert_eq!(s.read(gpu, va, 1).unwrap(), vec![(p as u8) ^ 0x5a]);
        s.gm.check_invariants(space).unwrap();
    }
    // Compaction respects classes too.
    s.gm.dev_compact(id, 3).unwrap();
    s.gm.check_invariants(space).unwrap();
    // Once everything is free, the groups can be dropped.
    s.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
    s.gm.region_dealloc(big, MapFlags::empty(), None).unwrap();
    s.gm.as_synchronize(space).unwrap();
    assert_eq!(
        s.gm.dev_set_group_class(id, PhysAddr::new(GPU_BASE), 7),
        Ok(())
    );
    assert_eq!(
        s.gm.dev_group_class(id, PhysAddr::new(GPU_BASE)),
        Ok(Some(7))
    );
    assert_eq!(s.gm.dev_set_page_groups(id, None), Ok(()));
    assert_eq!(s.gm.dev_page_groups(id), Ok(None));
}

#[test]
fn a_frame_request_takes_its_own_class_first_then_converts_the_lowest_free_group() {
    let (s, gpu, space) = system(64);
    let id = s.devices[gpu].id;
    let mem = s.devices[gpu].memory.clone().unwrap();
    s.gm.dev_set_page_groups(id, Some(2)).unwrap();
    // Classes alternate every four virtual pages; group 12 (frames 48..52) is made
    // class 1 while every group is free.
    mem.set_frame_classes(Some(2));
    s.gm.dev_set_group_class(id, PhysAddr::new(GPU_BASE + 48 * PAGE_SIZE), 1)
        .unwrap();
    let r =
        s.gm.as_alloc(space, AllocRequest::new(16 * PAGE_SIZE))
            .unwrap();
    s.gm.region_set_zero_fill_block(r, PAGE_SIZE).unwrap();
    let group_of = |page: u64| {
        let va = VirtAddr::new(r.start.as_u64() + page * PAGE_SIZE);
        s.write(gpu, va, &[page as u8 | 1]).unwrap();
        s.gm.check_invariants(space).unwrap();
        let (_, pa) = s.gm.as_page_frame(space, va).unwrap().unwrap();
        ((pa.as_u64() - GPU_BASE) / PAGE_SIZE) >> 2
    };
    // A wholly free group of the request's class beats lower free groups of another.
    assert_eq!(group_of(4), 12);
    // A partly used group of the class comes first of all.
    assert_eq!(group_of(5), 12);
    // Class 0 takes the lowest free group already of class 0, with no conversion.
    assert_eq!(group_of(0), 0);
    assert_eq!(group_of(6), 12);
    assert_eq!(group_of(7), 12);
    let set = (PhysAddr::new(GPU_BASE + 48 * PAGE_SIZE), 4, 0, 1);
    assert_eq!(mem.class_changes(), vec![set], "nothing converted so far");
    // Group 12 is full and no other group is class 1: the lowest wholly free group of
    // another class converts (group 0 is in use, so group 1).
    assert_eq!(group_of(12), 1);
    assert_eq!(
        mem.class_changes(),
        vec![set, (PhysAddr::new(GPU_BASE + 4 * PAGE_SIZE), 4, 0, 1)]
    );
    assert_eq!(group_of(1), 0);
}

#[test]
fn eviction_moves_a_cold_run_in_one_copy() {
    let (s, gpu, space) = system(16);
    let id = s.devices[gpu].id;
    s.gm.dev_set_eviction_policy(id, EvictionPolicy::Fifo)
        .unwrap();
    let mem = s.devices[gpu].memory.clone().unwrap();
    let r =
        s.gm.as_alloc(space, AllocRequest::new(32 * PAGE_SIZE))
            .unwrap();
    // One fault zero-fills 16 pages on 16 consecutive frames.
    s.gm.region_set_zero_fill_block(r, 16 * PAGE_SIZE).unwrap();
    s.write(gpu, r.start, b"first").unwrap();
    for p in 1..16u64 {
        s.write(
            gpu,
            VirtAddr::new(r.start.as_u64() + p * PAGE_SIZE),
            &[p as u8],
        )
        .unwrap();
    }
    assert_eq!(s.gm.dev_frames(id).unwrap().free, 0);
    let st = s.gm.stats();
    let copies = mem.counts().copies;
    // The next block needs a frame: the oldest pages go, as runs.
    s.write(
        gpu,
        VirtAddr::new(r.start.as_u64() + 16 * PAGE_SIZE),
        b"next",
    )
    .unwrap();
    let d = s.gm.stats();
    let evicted = d.evictions - st.evictions;
    let runs = mem.counts().copies - copies;
    assert!(evicted > 1, "a cold run went at once: {evicted}");
    assert_eq!(runs, 1, "{evicted} pages in one copy");
    assert_eq!(
        d.bytes_dev_to_host - st.bytes_dev_to_host,
        evicted * PAGE_SIZE
    );
    s.gm.check_invariants(space).unwrap();
    assert_eq!(s.read(gpu, r.start, 5).unwrap(), b"first");
    for p in 1..16u64 {
        let va = VirtAddr::new(r.start.as_u64() + p * PAGE_SIZE);
        assert_eq!(s.read(0, va, 1).unwrap(), vec![p as u8]);
    }
    s.gm.check_invariants(space).unwrap();
}

/// A seeded model run of compaction: a fragmented memory whose held pages carry bytes
/// of their own, then random compactions (valid and misused orders), writes, releases
/// and new pages; after every step the invariants, the frame accounting and the
/// histogram are checked, and every page's bytes are compared with the model.
#[test]
fn compaction_agrees_with_a_byte_model_on_seeded_sequences() {
    use gmem_testkit::SeedBytes;
    use std::collections::BTreeMap;
    let mut moved = 0;
    for seed in 0..12u64 {
        let mut rng = SeedBytes::new(seed);
        let (s, gpu, space) = system(128);
        let id = s.devices[gpu].id;
        let mut f = Fragmenter::new(space, id);
        f.fill(&s.gm).unwrap();
        let order = 1 + (rng.next_u64() % 4) as u32;
        let target = (rng.next_u64() % 5) as f64 / 4.0;
        f.fragment(&s.gm, order, target, 64, seed).unwrap();
        let mut model: BTreeMap<u64, (Region, Vec<u8>)> = BTreeMap::new();
        for (_, r) in f.held() {
            let b = rng.bytes(32);
            s.write(gpu, r.start, &b).unwrap();
            model.insert(r.start.as_u64(), (r, b));
        }
        for step in 0..40 {
            let ctx = format!("seed {seed} step {step}");
            let frames = s.gm.dev_frames(id).unwrap();
            match rng.next_u64() % 5 {
                0 | 1 => {
                    let o = (rng.next_u64() % 6) as u32;
                    let o = if o == 5 { 19 } else { o };
                    let r = s.gm.dev_compact(id, o);
                    if o > 18 {
                        assert_eq!(r, Err(FrameError::BadOrder { order: o }), "{ctx}");
                        assert_eq!(s.gm.dev_frames(id).unwrap(), frames, "{ctx}");
                    } else {
                        let rep = r.unwrap();
                        assert!(rep.free_blocks_after >= rep.free_blocks_before, "{ctx}");
                        assert_eq!(s.gm.dev_frames(id).unwrap().free, frames.free, "{ctx}");
                        moved += rep.pages_moved;
                    }
                }
                2 if !model.is_empty() => {
                    let k = rng.next_u64() as usize % model.len();
                    let (&va, (r, _)) = model.iter().nth(k).unwrap();
                    let b = rng.bytes(32);
                    s.write(gpu, r.start, &b).unwrap();
                    model.insert(va, (*r, b));
                }
                3 if !model.is_empty() => {
                    let k = rng.next_u64() as usize % model.len();
                    let va = *model.keys().nth(k).unwrap();
                    let (r, _) = model.remove(&va).unwrap();
                    s.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
                }
                _ => {
                    if frames.free > 0 {
                        let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
                        let b = rng.bytes(32);
                        s.write(gpu, r.start, &b).unwrap();
                        model.insert(r.start.as_u64(), (r, b));
                    }
                }
            }
            s.gm.check_invariants(space)
                .unwrap_or_else(|v| panic!("{ctx}: {v}"));
            let e = s.gm.dev_free_extents(id).unwrap();
            let sum: u64 = e.blocks.iter().enumerate().map(|(k, n)| n << k).sum();
            assert_eq!(sum, s.gm.dev_frames(id).unwrap().free, "{ctx}");
            for (r, b) in model.values() {
                assert_eq!(&s.read(gpu, r.start, b.len()).unwrap(), b, "{ctx}");
            }
        }
    }
    assert!(moved > 100, "compaction moved pages: {moved}");
}

#[test]
fn a_run_longer_than_a_group_takes_consecutive_groups_of_its_class() {
    let (s, gpu, space) = system(64);
    let id = s.devices[gpu].id;
    let mem = s.devices[gpu].memory.clone().unwrap();
    s.gm.dev_set_page_groups(id, Some(1)).unwrap();
    mem.set_frame_classes(Some(3));
    // Zero-fill blocks of 4 pages (16 KiB: one class per block) need 2 groups each.
    let r =
        s.gm.as_alloc(space, AllocRequest::new(40 * PAGE_SIZE))
            .unwrap();
    s.gm.region_set_zero_fill_block(r, 4 * PAGE_SIZE).unwrap();
    for p in (0..40u64).step_by(4) {
        let va = VirtAddr::new(r.start.as_u64() + p * PAGE_SIZE);
        let res = s.gm.dev_fault(id, va, Prot::WRITE).unwrap();
        assert_eq!(res.pages, 4, "one block per fault");
        s.gm.check_invariants(space).unwrap();
        for k in 0..4 {
            let v = VirtAddr::new(va.as_u64() + k * PAGE_SIZE);
            let (_, pa) = s.gm.as_page_frame(space, v).unwrap().unwrap();
            assert_eq!(s.gm.dev_group_class(id, pa), Ok(Some(mem.class_of(va))));
        }
    }
    let g = s.gm.dev_page_groups(id).unwrap().unwrap();
    let in_use: u64 = g.by_class.iter().map(|c| c.1 * 2 - c.2).sum();
    assert_eq!(in_use, 40, "{g:?}");
}
