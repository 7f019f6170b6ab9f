//! Tests of the IOMMU driver: the three table disciplines against a model, alone and
//! under concurrent editors with a concurrent walker; table-page reclamation waiting
//! for the IOTLB; DMA through the core's IOVA spaces with strict and asynchronous
//! unmaps; the baseline's allocator and domain; the invalidation latency model.

use crate::*;
use gmem_core::{
    AllocPolicy, DeviceId, Gmem, MapFlags, MapRun, Mmu, PageSize, PageTableRoot, PhysAddr, Prot,
    SingleCpu, VaRange, VirtAddr, PAGE_SIZE,
};
use gmem_host_cpu::{HostCpu, HostCpuConfig};
use gmem_sim::{Miss, TableFormat, Translator};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ALL: [Discipline; 3] = [Discipline::Locked, Discipline::Cas, Discipline::Rw];

fn tables(d: Discipline, frames: u64) -> IoTables {
    IoTables::new(d, PhysAddr::new(0xf0_0000_0000), frames).unwrap()
}

fn mem() -> DeviceId {
    DeviceId::from_raw(0, 1)
}

fn run(va: u64, pa: u64, pages: u64, prot: Prot) -> MapRun {
    MapRun {
        va: VirtAddr::new(va),
        pa: PhysAddr::new(pa),
        len: pages * PAGE_SIZE,
        prot,
        page_size: PageSize::Size4K,
        memory: mem(),
        attrs: Default::default(),
    }
}

fn range(va: u64, pages: u64) -> VaRange {
    VaRange::new(VirtAddr::new(va), pages * PAGE_SIZE).unwrap()
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn random_map_unmap_protect_agree_with_a_model_and_only_cas_keeps_emptied_tables() {
    for d in ALL {
        let t = tables(d, 512);
        let root = t.create().unwrap();
        let mut model: BTreeMap<u64, (u64, Prot)> = BTreeMap::new();
        let mut rng = Rng(0x1234 + d as u64);
        // Windows across leaf-table (2 MiB), PD (1 GiB) and PDPT (512 GiB) boundaries.
        let bases = [0x1ff000u64, 0x3fff_f000, 0x7f_ffff_e000];
        for step in 0..3000 {
            let base = bases[rng.below(3) as usize] + rng.below(16) * PAGE_SIZE;
            let pages = 1 + rng.below(8);
            let vpns = (base >> 12)..(base >> 12) + pages;
            match rng.below(3) {
                0 if vpns.clone().all(|v| !model.contains_key(&v)) => {
                    let pa = 0x1_0000_0000 + rng.below(1 << 16) * PAGE_SIZE;
                    t.map(root, &run(base, pa, pages, Prot::RW)).unwrap();
                    for (k, v) in vpns.enumerate() {
                        model.insert(v, ((pa >> 12) + k as u64, Prot::RW));
                    }
                }
                1 => {
                    t.protect(root, range(base, pages), Prot::READ).unwrap();
                    for v in vpns {
                        if let Some(e) = model.get_mut(&v) {
                            e.1 = Prot::READ;
                        }
                    }
                }
                _ => {
                    t.unmap(root, range(base, pages));
                    for v in vpns {
                        model.remove(&v);
                    }
                }
            }
            if step % 100 == 0 {
                for b in bases {
                    for v in (b >> 12) - 4..(b >> 12) + 28 {
                        let got = t
                            .lookup(root, VirtAddr::new(v << 12))
                            .map(|l| (l.frame.as_u64() >> 12, l.prot));
                        let want = model.get(&v).map(|(f, p)| (*f, *p | Prot::READ));
                        assert_eq!(got, want, "{d:?}: page {v:#x} after step {step}");
                    }
                }
            }
        }
        for b in bases {
            t.unmap(root, range(b - 16 * PAGE_SIZE, 64));
        }
        let s = t.stats();
        assert_eq!(
            s.edits.leaves_small - s.edits.leaves_cleared,
            0,
            "{d:?}: every leaf cleared"
        );
        if d == Discipline::Cas {
            // Three windows, each with its own PDPT/PD/PT chain (two share a PDPT).
            assert!(s.memory.in_use > 1, "{d:?}: CAS keeps its emptied tables");
            assert_eq!(s.edits.tables_unlinked, 0);
        } else {
            assert_eq!(s.memory.in_use, 1, "{d:?}: only the root is left");
            assert!(s.edits.tables_unlinked > 0);
        }
        t.destroy(root);
        assert_eq!(
            t.stats().memory.in_use,
            0,
            "{d:?}: destroy frees everything"
        );
    }
}

#[test]
fn concurrent_disjoint_editors_and_a_walker_never_see_a_foreign_translation() {
    for d in ALL {
        let t = Arc::new(tables(d, 2048));
        let root = t.create().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let walks = Arc::new(AtomicUsize::new(0));
        // The walker is registered like a device's: a table page unlinked while it
        // may be walking waits for the unmapper's "invalidation" of the walker, which
        // cannot overlap a walk, before it can be reused.
        let w = t.new_walker();
        t.walker_activated(w, Some(root));
        // Held by the walker during a walk; an editor takes it to "invalidate" the
        // walker after an unmap (as `SimMmu` serialises invalidation with translation).
        let walking = Arc::new(Mutex::new(()));
        // Four editors share leaf tables: editor i owns pages i, i+4, i+8, ... of a
        // window that spans two leaf tables, and maps each page to a frame that
        // encodes (page, editor).
        let editors: Vec<_> = (0..4u64)
            .map(|i| {
                let (t, walking) = (t.clone(), walking.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(77 + i);
                    for _ in 0..3000 {
                        let page = rng.below(256) * 4 + i;
                        let va = 0x1f_0000 + page * PAGE_SIZE;
                        let pa = (1 << 32) + (page << 16 | i << 12);
                        t.map(root, &run(va, pa, 1, Prot::RW)).unwrap();
                        let leaf = t.lookup(root, VirtAddr::new(va)).expect("own page mapped");
                        assert_eq!(leaf.frame.as_u64(), pa);
                        t.unmap(root, range(va, 1));
                        let _g = walking.lock().unwrap();
                        t.walker_invalidated(w, root);
                    }
                })
            })
            .collect();
        let walker = {
            let (t, stop, walks) = (t.clone(), stop.clone(), walks.clone());
            let walking = walking.clone();
            std::thread::spawn(move || {
                let mut page = 0u64;
                // At least one walk, however the threads are scheduled.
                loop {
                    let _g = walking.lock().unwrap();
                    page = (page + 1) % 1024;
                    let va = 0x1f_0000 + page * PAGE_SIZE;
                    if let Some(leaf) = t.lookup(root, VirtAddr::new(va)) {
                        let f = leaf.frame.as_u64() - (1 << 32);
                        assert_eq!(f >> 16, page, "{d:?}: a walk found another page's frame");
                        assert_eq!(f >> 12 & 0xf, page % 4, "{d:?}: and its owner");
                    }
                    walks.fetch_add(1, Ordering::Relaxed);
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
            })
        };
        for e in editors {
            e.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        walker.join().unwrap();
        t.walker_activated(w, None);
        for page in 0..1024 {
            let va = VirtAddr::new(0x1f_0000 + page * PAGE_SIZE);
            assert!(t.lookup(root, va).is_none(), "{d:?}: every page unmapped");
        }
        assert!(walks.load(Ordering::Relaxed) > 0);
        let s = t.stats();
        assert_eq!(s.edits.leaves_small, s.edits.leaves_cleared, "{d:?}");
        if d.reclaims() {
            assert_eq!(s.memory.in_use, 1, "{d:?}: emptied tables were reclaimed");
        } else {
            assert_eq!(s.edits.tables_unlinked, 0);
        }
    }
}

#[test]
fn rw_tables_take_the_writer_lock_only_when_a_table_page_empties() {
    let t = tables(Discipline::Rw, 64);
    let root = t.create().unwrap();
    t.map(root, &run(0x40_0000, 1 << 32, 2, Prot::RW)).unwrap();
    t.unmap(root, range(0x40_0000, 1));
    assert_eq!(
        t.stats().edits.writer_reclaims,
        0,
        "the leaf table still holds a page"
    );
    t.unmap(root, range(0x40_1000, 1));
    let s = t.stats();
    assert_eq!(s.edits.writer_reclaims, 1);
    // PT, PD and PDPT emptied one after the other and were unlinked.
    assert_eq!((s.edits.tables_unlinked, s.memory.in_use), (3, 1));
}

#[test]
fn unlinked_table_pages_wait_for_the_iotlb_invalidation_before_reuse() {
    let t = Arc::new(tables(Discipline::Rw, 64));
    let mmu = IommuMmu::new(t.clone(), iotlb(1), InvalidationLatency::accounted(2000)).unwrap();
    let root = mmu.create_page_table().unwrap();
    mmu.activate(Some(root));
    mmu.map(root, &run(0x40_0000, 1 << 32, 1, Prot::RW))
        .unwrap();
    mmu.translate(0, VirtAddr::new(0x40_0000), Prot::READ)
        .unwrap();
    mmu.unmap(root, range(0x40_0000, 1));
    let s = t.stats().memory;
    assert_eq!((s.waiting, s.in_use), (3, 4), "retired, not freed");
    // Until the invalidation the IOTLB still translates (the async window).
    assert!(mmu.cached(0, VirtAddr::new(0x40_0000)));
    mmu.invalidate(root, &[range(0x40_0000, 1)]);
    let s = t.stats().memory;
    assert_eq!((s.waiting, s.in_use, s.freed_after_invalidation), (0, 1, 3));
    assert!(!mmu.cached(0, VirtAddr::new(0x40_0000)));
    let st = mmu.stats();
    assert_eq!((st.invalidations, st.invalidation_nanos), (1, 2000));
}

#[test]
fn bad_roots_and_unencodable_requests_are_typed_errors_and_a_failed_map_leaves_nothing() {
    for d in ALL {
        let t = tables(d, 4);
        let root = t.create().unwrap();
        assert!(matches!(
            t.map(PageTableRoot(0x1000), &run(0, 0, 1, Prot::RW)),
            Err(gmem_core::MmuError::Hardware(table::HW_UNKNOWN_ROOT))
        ));
        assert!(matches!(
            t.map(root, &run(0x8000_0000_0000, 0, 1, Prot::RW)),
            Err(gmem_core::MmuError::Unsupported { .. })
        ));
        // Root + 3 tables fit; a second 1 GiB window needs 2 more: out of memory.
        t.map(root, &run(0, 1 << 32, 1, Prot::RW)).unwrap();
        assert_eq!(
            t.map(root, &run(1 << 39, 1 << 32, 1, Prot::RW)),
            Err(gmem_core::MmuError::OutOfTableMemory)
        );
        assert!(t.lookup(root, VirtAddr::new(1 << 39)).is_none());
        assert!(t.lookup(root, VirtAddr::new(0)).is_some(), "{d:?}");
        assert_eq!(t.stats().edits.failed_maps, 1);
    }
}

#[test]
fn an_invalidation_spins_its_latency_or_only_counts_it() {
    let t = Arc::new(tables(Discipline::Cas, 4));
    let spun = IommuMmu::new(t.clone(), iotlb(1), InvalidationLatency::spin(300_000)).unwrap();
    let root = spun.create_page_table().unwrap();
    let start = Instant::now();
    spun.invalidate_all(root);
    assert!(start.elapsed() >= Duration::from_micros(300));
    let counted = IommuMmu::new(t, iotlb(1), InvalidationLatency::accounted(300_000_000)).unwrap();
    let start = Instant::now();
    counted.invalidate(root, &[range(0, 1)]);
    assert!(start.elapsed() < Duration::from_millis(300));
    assert_eq!(counted.stats().invalidation_nanos, 300_000_000);
}

// ----- through the core ---------------------------------------------------------------

struct Machine {
    cpu: HostCpu,
    gm: Gmem,
    /// First frame of the buffer area (host memory the core does not manage).
    buffers: u64,
}

fn machine() -> Machine {
    let cpu = HostCpu::new(HostCpuConfig {
        memory_bytes: 64 << 20,
        table_frames: 256,
        ..HostCpuConfig::default()
    })
    .unwrap();
    let gm = Gmem::new(Arc::new(SingleCpu), cpu.device_desc()).unwrap();
    cpu.port().bind(gm.host()).unwrap();
    cpu.memory_map()
        .add(gm.host(), cpu.memory().clone())
        .unwrap();
    let base = cpu.memory().base().as_u64();
    let buffers = base + (32 << 20);
    gm.dev_register_physmem(
        gm.host(),
        PhysAddr::new(base + 256 * PAGE_SIZE),
        PhysAddr::new(buffers),
    )
    .unwrap();
    Machine { cpu, gm, buffers }
}

fn nic(m: &Machine, d: Discipline) -> (Iommu, DmaDevice, gmem_core::SpaceId) {
    let config = IommuConfig {
        discipline: d,
        latency: InvalidationLatency::accounted(2000),
        ..IommuConfig::default()
    };
    let iommu = Iommu::new(config, m.cpu.memory_map().clone()).unwrap();
    let dev = iommu.create_device(&m.gm, "nic").unwrap();
    let space = dev
        .create_space(
            &m.gm,
            VirtAddr::new(1 << 20),
            VirtAddr::new(1 << 32),
            AllocPolicy::CACHED,
        )
        .unwrap();
    (iommu, dev, space)
}

#[test]
fn dma_lands_in_the_mapped_buffer_and_a_strict_unmap_leaves_no_translation_behind() {
    for d in ALL {
        let m = machine();
        let (_iommu, dev, space) = nic(&m, d);
        let frames = [PhysAddr::new(m.buffers), PhysAddr::new(m.buffers + 0x5000)];
        let r = dev
            .map_buffer(&m.gm, space, &frames, m.gm.host(), Prot::RW)
            .unwrap();
        let data: Vec<u8> = (0..6000).map(|i| (i * 7 % 251) as u8).collect();
        dev.write(0, r.start, &data).unwrap();
        // The two pages of the IOVA range land in the two (discontiguous) frames.
        let mut got = vec![0u8; 6000];
        m.cpu.memory().read(frames[0], &mut got[..4096]).unwrap();
        m.cpu.memory().read(frames[1], &mut got[4096..]).unwrap();
        assert_eq!(got, data, "{d:?}");
        let mut back = vec![0u8; 6000];
        dev.read(0, r.start, &mut back).unwrap();
        assert_eq!(back, data);
        dev.unmap_buffer(&m.gm, r, MapFlags::empty(), None).unwrap();
        assert!(
            !dev.mmu().cached(0, r.start),
            "{d:?}: strict unmap invalidated"
        );
        assert_eq!(
            dev.write(0, r.start, &[1]),
            Err(DmaError::Fault(DmaFault {
                va: r.start,
                access: Prot::WRITE,
                miss: Miss::NotPresent
            }))
        );
        let s = dev.stats();
        assert_eq!((s.faults, s.mmu.invalidations), (1, 1));
    }
}

#[test]
fn a_read_only_buffer_refuses_a_device_write_with_a_protection_fault() {
    let m = machine();
    let (_iommu, dev, space) = nic(&m, Discipline::Rw);
    let r = dev
        .map_buffer(
            &m.gm,
            space,
            &[PhysAddr::new(m.buffers)],
            m.gm.host(),
            Prot::READ,
        )
        .unwrap();
    let e = dev.write(0, r.start, &[1, 2, 3]).unwrap_err();
    assert!(matches!(
        e,
        DmaError::Fault(DmaFault {
            miss: Miss::Protection { .. },
            ..
        })
    ));
    let mut b = [9u8; 3];
    dev.read(0, r.start, &mut b).unwrap();
    assert_eq!(b, [0, 0, 0]);
}

#[test]
fn async_unmaps_share_one_invalidation_per_batch_and_call_back_after_it() {
    for d in [Discipline::Cas, Discipline::Rw] {
        let m = machine();
        let (iommu, dev, space) = nic(&m, d);
        m.gm.as_set_batch_limit(space, 8).unwrap();
        let done = Arc::new(Mutex::new(Vec::new()));
        let mut seen = Vec::new();
        for i in 0..20u64 {
            let f = PhysAddr::new(m.buffers + i * PAGE_SIZE);
            let r = dev
                .map_buffer(&m.gm, space, &[f], m.gm.host(), Prot::WRITE)
                .unwrap();
            // No IOVA of a queued unmap is handed out again before its invalidation.
            assert!(!seen.contains(&r.start), "{d:?}: IOVA reused early");
            dev.write(0, r.start, &i.to_le_bytes()).unwrap();
            let (done2, inv) = (done.clone(), dev.mmu().clone());
            let cb: gmem_core::Callback = Box::new(move |res| {
                res.unwrap();
                let st = inv.stats();
                done2
                    .lock()
                    .unwrap()
                    .push((i, st.invalidations - st.walk_cache_flushes));
            });
            let root = dev.mmu().active_root().unwrap();
            dev.unmap_buffer(&m.gm, r, MapFlags::ASYNC, Some(cb))
                .unwrap();
            // The entry left the table at once; until the batch's invalidation the IOTLB
            // may still translate it (the window async unmap accepts: the buffer is not
            // reused before the callback).
            assert!(iommu.tables().lookup(root, r.start).is_none());
            if i % 8 != 7 {
                assert!(dev.mmu().cached(0, r.start), "{d:?}: in the window");
            } else {
                assert!(!dev.mmu().cached(0, r.start), "{d:?}: batch invalidated");
            }
            seen.push(r.start);
            if i % 8 == 7 {
                seen.clear();
            }
        }
        // 20 unmaps, batch of 8: two batches drained, 4 requests still queued.
        let st = dev.stats().mmu;
        assert_eq!(st.invalidations - st.walk_cache_flushes, 2, "{d:?}");
        // Reader-writer tables reclaimed the emptied tables at every unmap, so every
        // map that rebuilt them before its batch drained flushed the walk cache.
        let flushes = if d == Discipline::Rw { 19 - 2 } else { 0 };
        assert_eq!(st.walk_cache_flushes, flushes, "{d:?}");
        assert_eq!(done.lock().unwrap().len(), 16);
        assert_eq!(m.gm.as_pending(space).unwrap(), 4);
        m.gm.as_synchronize(space).unwrap();
        let done = done.lock().unwrap();
        assert_eq!(done.len(), 20);
        // Every callback ran after the invalidation of its batch.
        for (i, invals) in done.iter() {
            assert_eq!(*invals, i / 8 + 1, "{d:?}: callback {i}");
        }
        assert_eq!(m.gm.stats().invalidations_coalesced, 7 + 7 + 3);
        for i in 0..20u64 {
            let mut b = [0u8; 8];
            m.cpu
                .memory()
                .read(PhysAddr::new(m.buffers + i * PAGE_SIZE), &mut b)
                .unwrap();
            assert_eq!(u64::from_le_bytes(b), i);
        }
    }
}

#[test]
fn detaching_the_device_destroys_its_table_and_returns_every_table_page() {
    let m = machine();
    let (iommu, dev, space) = nic(&m, Discipline::Cas);
    for i in 0..4u64 {
        let f = PhysAddr::new(m.buffers + i * PAGE_SIZE);
        dev.map_buffer(&m.gm, space, &[f], m.gm.host(), Prot::RW)
            .unwrap();
    }
    assert!(iommu.table_stats().memory.in_use >= 4);
    m.gm.dev_detach(dev.id(), space).unwrap();
    assert_eq!(iommu.table_stats().memory.in_use, 0);
    assert!(matches!(
        dev.write(0, VirtAddr::new(1 << 20), &[1]),
        Err(DmaError::Fault(DmaFault {
            miss: Miss::Inactive,
            ..
        }))
    ));
}

// ----- baseline -------------------------------------------------------------------------

#[test]
fn the_freebsd_baseline_loads_dmas_and_unloads_strictly_on_the_same_hardware() {
    let m = machine();
    let config = IommuConfig {
        discipline: Discipline::Locked,
        latency: InvalidationLatency::accounted(2000),
        ..IommuConfig::default()
    };
    let iommu = Iommu::new(config, m.cpu.memory_map().clone()).unwrap();
    let dom = GiantLockDomain::new(
        &iommu,
        VirtAddr::new(1 << 20),
        VirtAddr::new(1 << 32),
        m.gm.host(),
    )
    .unwrap();
    let map = BusDmaMap::new();
    let f = PhysAddr::new(m.buffers + 0x3000);
    let iova = dom.load(&map, &[f], Prot::WRITE).unwrap();
    assert_eq!(
        iova.as_u64(),
        (1 << 20) + PAGE_SIZE,
        "first fit after a guard page"
    );
    assert!(map.is_loaded());
    dom.port().write(0, iova, b"frame").unwrap();
    let mut got = [0u8; 5];
    m.cpu.memory().read(f, &mut got).unwrap();
    assert_eq!(&got, b"frame");
    // The guard page after the buffer faults.
    assert!(dom
        .port()
        .write(0, VirtAddr::new(iova.as_u64() + PAGE_SIZE), b"x")
        .is_err());
    dom.unload(&map).unwrap();
    assert!(!map.is_loaded());
    assert!(dom.port().write(0, iova, b"x").is_err());
    assert_eq!(dom.unload(&map), Err(LegacyError::NotLoaded));
    assert_eq!(dom.load(&map, &[], Prot::WRITE), Err(LegacyError::Empty));
    assert_eq!(dom.port().stats().mmu.invalidations, 1);
    let s = dom.stats();
    assert_eq!((s.loads, s.unloads, s.live), (1, 1, 0));
    assert_eq!(
        iommu.table_stats().memory.in_use,
        1,
        "locked tables reclaim"
    );
    drop(dom);
    assert_eq!(iommu.table_stats().memory.in_use, 0);
}

#[test]
fn the_baseline_maps_a_16_page_buffer_of_scattered_frames_and_every_byte_verifies() {
    let m = machine();
    let config = IommuConfig {
        discipline: Discipline::Locked,
        latency: InvalidationLatency::accounted(0),
        ..IommuConfig::default()
    };
    let iommu = Iommu::new(config, m.cpu.memory_map().clone()).unwrap();
    let dom = GiantLockDomain::new(
        &iommu,
        VirtAddr::new(1 << 20),
        VirtAddr::new(1 << 24),
        m.gm.host(),
    )
    .unwrap();
    // Two contiguous runs of 8 frames, the second below the first.
    let frames: Vec<PhysAddr> = (0..16u64)
        .map(|i| PhysAddr::new(m.buffers + ((i + 8) % 16) * PAGE_SIZE))
        .collect();
    let maps: Vec<BusDmaMap> = (0..3).map(|_| BusDmaMap::new()).collect();
    let a = dom.load(&maps[0], &frames, Prot::RW).unwrap();
    let b = dom.load(&maps[1], &frames[..1], Prot::RW).unwrap();
    assert_eq!(
        b.as_u64(),
        a.as_u64() + 17 * PAGE_SIZE,
        "one guard page between"
    );
    let data: Vec<u8> = (0..16 * PAGE_SIZE as usize)
        .map(|i| (i * 7 + 3) as u8)
        .collect();
    dom.port().write(0, a, &data).unwrap();
    for (k, f) in frames.iter().enumerate() {
        let mut got = vec![0u8; PAGE_SIZE as usize];
        m.cpu.memory().read(*f, &mut got).unwrap();
        assert_eq!(
            got,
            data[k * PAGE_SIZE as usize..(k + 1) * PAGE_SIZE as usize]
        );
    }
    let mut back = vec![0u8; data.len()];
    dom.port().read(0, a, &mut back).unwrap();
    assert_eq!(back, data);
    dom.unload(&maps[0]).unwrap();
    // The freed 16 pages are found first again.
    let c = dom.load(&maps[2], &frames[..4], Prot::READ).unwrap();
    assert_eq!(c, a);
    assert_eq!(
        dom.check().unwrap(),
        vec![
            (a.as_u64(), a.as_u64() + 4 * PAGE_SIZE),
            (b.as_u64(), b.as_u64() + PAGE_SIZE)
        ]
    );
    dom.unload(&maps[1]).unwrap();
    dom.unload(&maps[2]).unwrap();
    assert!(dom.check().unwrap().is_empty());
    assert_eq!(iommu.table_stats().memory.in_use, 1);
}

#[test]
fn the_baseline_keeps_its_books_under_two_threads_loading_and_unloading() {
    let m = machine();
    let config = IommuConfig {
        discipline: Discipline::Locked,
        latency: InvalidationLatency::accounted(0),
        queues: 2,
        ..IommuConfig::default()
    };
    let iommu = Iommu::new(config, m.cpu.memory_map().clone()).unwrap();
    let dom = GiantLockDomain::new(
        &iommu,
        VirtAddr::new(1 << 20),
        VirtAddr::new(1 << 26),
        m.gm.host(),
    )
    .unwrap();
    std::thread::scope(|s| {
        for q in 0..2u64 {
            let (dom, m) = (&dom, &m);
            s.spawn(move || {
                let maps: Vec<BusDmaMap> = (0..8).map(|_| BusDmaMap::new()).collect();
                for i in 0..2000u64 {
                    let map = &maps[(i % 8) as usize];
                    if map.is_loaded() {
                        dom.unload(map).unwrap();
                    }
                    let f = PhysAddr::new(m.buffers + (q * 8 + i % 8) * PAGE_SIZE);
                    let va = dom.load(map, &[f], Prot::RW).unwrap();
                    let word = (q << 32 | i).to_le_bytes();
                    dom.port().write(q as usize, va, &word).unwrap();
                    let mut got = [0u8; 8];
                    m.cpu.memory().read(f, &mut got).unwrap();
                    assert_eq!(got, word);
                }
                for map in &maps {
                    dom.unload(map).unwrap();
                }
            });
        }
    });
    let s = dom.stats();
    assert_eq!((s.loads, s.unloads, s.live), (4000, 4000, 0));
    assert_eq!(s.gas.allocs, s.gas.frees);
    assert!(dom.check().unwrap().is_empty());
    assert_eq!(iommu.table_stats().memory.in_use, 1);
}

// ----- superpages -----------------------------------------------------------------------

const TWO_MIB: u64 = 2 << 20;

fn superpage_nic(m: &Machine, superpages: bool) -> (Iommu, DmaDevice, gmem_core::SpaceId) {
    let config = IommuConfig {
        discipline: Discipline::Locked,
        latency: InvalidationLatency::accounted(2000),
        superpages,
        ..IommuConfig::default()
    };
    let iommu = Iommu::new(config, m.cpu.memory_map().clone()).unwrap();
    let dev = iommu.create_device(&m.gm, "nic").unwrap();
    let space = dev
        .create_space(
            &m.gm,
            VirtAddr::new(1 << 20),
            VirtAddr::new(1 << 32),
            AllocPolicy::CACHED,
        )
        .unwrap();
    (iommu, dev, space)
}

/// 512 contiguous frames at the first 2 MiB boundary of the buffer memory.
fn two_mib_of_frames(m: &Machine) -> Vec<PhysAddr> {
    let first = m.buffers.next_multiple_of(TWO_MIB);
    (0..512)
        .map(|i| PhysAddr::new(first + i * PAGE_SIZE))
        .collect()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 12) as u8 ^ seed)
        .collect()
}

#[test]
fn a_2mib_buffer_is_one_leaf_one_iotlb_entry_and_a_partial_unmap_splits_it() {
    let m = machine();
    let (iommu, dev, space) = superpage_nic(&m, true);
    let frames = two_mib_of_frames(&m);
    let region = dev
        .map_buffer_region(&m.gm, space, &frames, m.gm.host(), Prot::RW)
        .unwrap();
    assert_eq!(region.start.as_u64() % TWO_MIB, 0, "a 2 MiB-aligned IOVA");
    let edits = iommu.table_stats().edits;
    assert_eq!((edits.leaves_large, edits.leaves_small), (1, 0), "one leaf");
    // DMA over all of it: one walk, one IOTLB entry serves the 512 pages.
    let data = pattern(TWO_MIB as usize, 7);
    dev.write(0, region.start, &data).unwrap();
    let st = dev.stats().mmu.sim;
    assert_eq!(st.caches.walks, 1, "{st:?}");
    for k in [0u64, 255, 511] {
        assert!(dev
            .mmu()
            .cached(0, VirtAddr::new(region.start.as_u64() + k * PAGE_SIZE)));
    }
    let mut got = vec![0u8; TWO_MIB as usize];
    m.cpu.memory().read(frames[0], &mut got).unwrap();
    assert!(got == data, "the bytes landed in the 512 frames");
    // Unmap 4 pages in the middle: the leaf is split, those pages fault, the other 508
    // still translate to their frames.
    let hole = VaRange::new(
        VirtAddr::new(region.start.as_u64() + 100 * PAGE_SIZE),
        4 * PAGE_SIZE,
    )
    .unwrap();
    m.gm.region_unmap(
        gmem_core::Pages::range(region.space, hole),
        MapFlags::empty(),
        None,
    )
    .unwrap();
    assert_eq!(iommu.table_stats().edits.splits, 1);
    for k in 100..104u64 {
        let va = VirtAddr::new(region.start.as_u64() + k * PAGE_SIZE);
        assert!(!dev.mmu().cached(0, va));
        assert!(matches!(
            dev.write(0, va, &[1]),
            Err(DmaError::Fault(DmaFault {
                miss: Miss::NotPresent,
                ..
            }))
        ));
    }
    let before = pattern(100 * PAGE_SIZE as usize, 7);
    let mut back = vec![0u8; before.len()];
    dev.read(0, region.start, &mut back).unwrap();
    assert!(
        back == before,
        "pages below the hole read their frames' bytes"
    );
    let tail_va = VirtAddr::new(region.start.as_u64() + 104 * PAGE_SIZE);
    let mut tail = vec![0u8; (408 * PAGE_SIZE) as usize];
    dev.read(0, tail_va, &mut tail).unwrap();
    assert!(tail == data[(104 * PAGE_SIZE) as usize..], "and above it");
    // A fresh write through the split leaves lands in the right frame.
    dev.write(
        0,
        VirtAddr::new(region.start.as_u64() + 300 * PAGE_SIZE),
        b"split",
    )
    .unwrap();
    let mut w = [0u8; 5];
    m.cpu.memory().read(frames[300], &mut w).unwrap();
    assert_eq!(&w, b"split");
    m.gm.check_invariants(space).unwrap();
    dev.unmap_buffer_region(&m.gm, region, MapFlags::empty(), None)
        .unwrap();
    assert!(dev.write(0, region.start, &[1]).is_err());
    m.gm.dev_detach(dev.id(), space).unwrap();
    assert_eq!(
        iommu.table_stats().memory.in_use,
        0,
        "split reserve and tables freed"
    );
}

#[test]
fn without_superpages_the_same_buffer_is_512_leaves_and_other_disciplines_refuse_them() {
    let m = machine();
    let (iommu, dev, space) = superpage_nic(&m, false);
    let frames = two_mib_of_frames(&m);
    let region = dev
        .map_buffer_region(&m.gm, space, &frames, m.gm.host(), Prot::RW)
        .unwrap();
    let edits = iommu.table_stats().edits;
    assert_eq!((edits.leaves_large, edits.leaves_small), (0, 512));
    let data = pattern(TWO_MIB as usize, 3);
    dev.write(0, region.start, &data).unwrap();
    assert_eq!(dev.stats().mmu.sim.caches.walks, 512);
    dev.unmap_buffer_region(&m.gm, region, MapFlags::empty(), None)
        .unwrap();
    for d in [Discipline::Cas, Discipline::Rw] {
        let config = IommuConfig {
            discipline: d,
            superpages: true,
            ..IommuConfig::default()
        };
        assert_eq!(
            Iommu::new(config, m.cpu.memory_map().clone()).err(),
            Some(IommuError::SuperpagesNeedLocked(d))
        );
    }
}
