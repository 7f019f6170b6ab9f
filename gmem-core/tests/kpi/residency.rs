//! Eviction policies and contiguous migration.

use super::*;

/// One hot page read between writes of a stream of cold pages, on a GPU with 8 frames:
/// returns, for each cold page after the first 8 evictions (warm-up), whether the hot
/// page was in GPU memory right after that cold page was written.
fn hot_page_residency(policy: EvictionPolicy) -> (Vec<bool>, Stats) {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 8);
    let gid = s.devices[g].id;
    s.gm.dev_set_eviction_policy(gid, policy).unwrap();
    let pages = 48;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(pages * PAGE_SIZE))
            .unwrap();
    let page = |k: u64| va(r.start.as_u64() + k * PAGE_SIZE);
    let hot = pattern(7, PAGE_SIZE as usize);
    s.write(g, page(0), &hot).unwrap();
    let mut resident = Vec::new();
    for c in 1..pages {
        assert_eq!(
            s.read(g, page(0), hot.len()).unwrap(),
            hot,
            "hot page bytes"
        );
        s.write(g, page(c), &pattern(c as u8, PAGE_SIZE as usize))
            .unwrap();
        ok(&s, space);
        if c > 16 {
            let root = s.devices[g].mmu.active_root().unwrap();
            let pte = s.devices[g].mmu.store().lookup(root, page(0).vpn().0);
            resident.push(pte.is_some_and(|p| p.memory == gid));
        }
    }
    for c in 1..pages {
        let want = pattern(c as u8, PAGE_SIZE as usize);
        assert_eq!(
            s.read(0, page(c), want.len()).unwrap(),
            want,
            "cold page {c}"
        );
    }
    (resident, s.gm.stats())
}

#[test]
fn clock_keeps_a_hot_page_that_fifo_evicts() {
    let (fifo, fs) = hot_page_residency(EvictionPolicy::Fifo);
    let (clock, cs) = hot_page_residency(EvictionPolicy::Clock);
    assert!(
        fifo.iter().any(|r| !r),
        "FIFO evicts the hot page once it is the oldest: {fifo:?}"
    );
    assert!(
        clock.iter().all(|r| *r),
        "CLOCK gives the referenced hot page a second chance on every scan: {clock:?}"
    );
    assert_eq!(
        (fs.second_chances, fs.pages_scanned, fs.evictions_clock),
        (0, 0, 0)
    );
    assert_eq!(fs.evictions_fifo, fs.evictions);
    assert!(cs.second_chances > 0 && cs.pages_scanned >= cs.second_chances);
    assert_eq!(cs.evictions_clock + cs.evictions_fifo, cs.evictions);
    assert!(
        cs.evictions < fs.evictions,
        "the hot page's round trips are saved: {} vs {}",
        cs.evictions,
        fs.evictions
    );
}

#[test]
fn migration_moves_a_contiguous_run_in_one_copy_and_keeps_bytes() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 64);
    let gid = s.devices[g].id;
    let pages = 32;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(pages * PAGE_SIZE))
            .unwrap();
    // One fault zero-fills the whole region on one contiguous host run.
    s.gm.region_set_zero_fill_block(r, pages * PAGE_SIZE)
        .unwrap();
    let data = pattern(11, (pages * PAGE_SIZE) as usize);
    s.write(0, r.start, &data).unwrap();
    assert_eq!(s.gm.stats().faults_zero_fill, 1);
    let host_mem = s.host().memory.clone().unwrap();
    let gpu_mem = s.devices[g].memory.clone().unwrap();
    let copies = host_mem.counts().copies;
    assert_eq!(
        s.gm.region_migrate(r, gid, MigrateScope::Populated)
            .unwrap(),
        pages
    );
    assert_eq!(host_mem.counts().copies - copies, 1, "one copy for the run");
    assert_eq!(s.gm.stats().bytes_host_to_dev, pages * PAGE_SIZE);
    ok(&s, space);
    assert_eq!(s.read(g, r.start, data.len()).unwrap(), data, "GPU sees it");
    // And back: the GPU's frames came as one run too.
    assert_eq!(
        s.gm.region_migrate(r, s.host().id, MigrateScope::Populated)
            .unwrap(),
        pages
    );
    assert_eq!(gpu_mem.counts().copies, 1);
    assert_eq!(s.gm.stats().bytes_dev_to_host, pages * PAGE_SIZE);
    ok(&s, space);
    assert_eq!(s.read(0, r.start, data.len()).unwrap(), data, "CPU sees it");
    // A target too full for the run falls back to pages (with eviction): bytes kept.
    let small = gpu(&mut s, space, 8);
    let sid = s.devices[small].id;
    assert_eq!(
        s.gm.region_migrate(r, sid, MigrateScope::Populated)
            .unwrap(),
        pages
    );
    let f = s.gm.dev_frames(sid).unwrap();
    assert_eq!((f.active + f.inactive, f.free), (8, 0));
    ok(&s, space);
    assert_eq!(s.read(0, r.start, data.len()).unwrap(), data);
}
