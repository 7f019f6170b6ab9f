//! Linux's HMM selftests (`tools/testing/selftests/mm/hmm-tests.c`) adapted to GMEM on
//! the simulated host CPU and discrete GPU.
//!
//! HMM's `dmirror` device reads or writes a buffer of the process through its own page
//! table, faulting pages in, and its tests check what the device saw and what the CPU
//! sees afterwards. Here the device is a [`Dgpu`] running a kernel (one work-item per
//! page, each loading or storing the whole page through the GPU's TLBs and table), the
//! buffer is a region of one address space shared by the CPU and the GPU, `mprotect` is
//! `region_protect` and "migrate to device" is `region_migrate`. Where HMM asserts one
//! fault per range, GMEM's counters say what each fault did (zero-fill, migration,
//! remote mapping) and every byte is compared. Under GMEM's default placement (unique,
//! faulting device) a GPU read of a host page migrates it into video memory; the
//! double-map test asks for remote access instead, which is what HMM's mirror does.

use gmem_core::{
    Activation, AllocPolicy, AllocRequest, FaultError, Gmem, MapFlags, MigrateScope, MmuMode,
    Placement, PlacementMode, PlacementTarget, Prot, Region, SpaceId, VirtAddr, PAGE_SIZE,
};
use gmem_dgpu::{Dgpu, DgpuConfig};
use gmem_host_cpu::{HostCpu, HostCpuConfig};
use gmem_sim::{AccessError, Grid, LaunchError, LaunchStats};

/// HMM_BUFFER_SIZE: 1024 pages.
const NPAGES: u64 = 1024;
const PAGE: usize = PAGE_SIZE as usize;

struct Machine {
    gm: Gmem,
    cpu: HostCpu,
    gpus: Vec<Dgpu>,
    space: SpaceId,
}

/// A CPU and `gpus` discrete GPUs with `vram_pages` pages of video memory each (plus
/// their table pools), attached to one space below 2^39 (the GPU format's reach).
fn machine(gpus: u32, vram_pages: u64) -> Machine {
    let (gm, cpu) = HostCpu::boot(HostCpuConfig::default()).unwrap();
    let space = gm
        .as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new(1 << 39),
            AllocPolicy::empty(),
        )
        .unwrap();
    gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let gpus = (0..gpus)
        .map(|i| {
            let mut c = DgpuConfig::new(i, 0, 4);
            c.vram_bytes = (c.table_frames + vram_pages) * PAGE_SIZE;
            let g = Dgpu::new(cpu.memory_map().clone(), c).unwrap();
            let id = g.create(&gm, &format!("dgpu{i}")).unwrap();
            // Shared mode falls back to coherent: no other device has the GPU's format.
            assert_eq!(
                gm.as_attach(space, id, MmuMode::Shared, Activation::Switch),
                Ok(MmuMode::Coherent)
            );
            g
        })
        .collect();
    Machine {
        gm,
        cpu,
        gpus,
        space,
    }
}

impl Machine {
    fn alloc(&self, pages: u64) -> Region {
        self.gm
            .as_alloc(self.space, AllocRequest::new(pages * PAGE_SIZE))
            .unwrap()
    }

    fn ok(&self) {
        self.gm.check_invariants(self.space).unwrap();
    }
}

fn page_va(r: &Region, page: u64) -> VirtAddr {
    VirtAddr::new(r.start.as_u64() + page * PAGE_SIZE)
}

/// The bytes of page `page` when the buffer holds `ptr[i] = i + seed` as 32-bit ints.
fn pattern(page: u64, seed: u32) -> Vec<u8> {
    let first = (page * PAGE_SIZE / 4) as u32;
    (0..PAGE as u32 / 4)
        .flat_map(|k| (first + k).wrapping_add(seed).to_le_bytes())
        .collect()
}

fn cpu_fill(m: &Machine, r: &Region, pages: std::ops::Range<u64>, seed: u32) {
    for p in pages {
        m.cpu
            .store(&m.gm, page_va(r, p), &pattern(p, seed))
            .unwrap();
    }
}

fn cpu_check(m: &Machine, r: &Region, pages: std::ops::Range<u64>, seed: u32) {
    let mut buf = vec![0u8; PAGE];
    for p in pages {
        m.cpu.load(&m.gm, page_va(r, p), &mut buf).unwrap();
        assert_eq!(buf, pattern(p, seed), "CPU view of page {p}");
    }
}

/// HMM_DMIRROR_READ: the GPU reads `pages` pages into a mirror, one work-item a page.
fn gpu_read(
    g: &Dgpu,
    gm: &Gmem,
    r: &Region,
    pages: u64,
) -> Result<(Vec<u8>, LaunchStats), LaunchError> {
    let mut mirror = vec![0u8; (pages * PAGE_SIZE) as usize];
    let stats = g.launch(gm, Grid::covering(pages, 64), |w| {
        let p = w.global;
        if p >= pages {
            return Ok(());
        }
        w.load(
            page_va(r, p),
            &mut mirror[p as usize * PAGE..(p as usize + 1) * PAGE],
        )
    })?;
    Ok((mirror, stats))
}

/// HMM_DMIRROR_WRITE: the GPU writes the pattern into `pages` pages.
fn gpu_write(
    g: &Dgpu,
    gm: &Gmem,
    r: &Region,
    pages: u64,
    seed: u32,
) -> Result<LaunchStats, LaunchError> {
    g.launch(gm, Grid::covering(pages, 64), |w| match w.global {
        p if p < pages => w.store(page_va(r, p), &pattern(p, seed)),
        _ => Ok(()),
    })
}

fn check_mirror(mirror: &[u8], pages: std::ops::Range<u64>, seed: u32) {
    for p in pages {
        let got = &mirror[p as usize * PAGE..(p as usize + 1) * PAGE];
        assert!(
            got == pattern(p, seed).as_slice(),
            "device view of page {p}"
        );
    }
}

#[test]
fn anon_read_device_sees_zero_pages_and_cpu_data_of_a_read_only_buffer() {
    let m = machine(1, 2 * NPAGES);
    let g = &m.gpus[0];
    let r = m.alloc(NPAGES);
    // Initialise all but the first two pages; make the buffer read-only; the CPU reads
    // page 1 (HMM's zero page).
    cpu_fill(&m, &r, 2..NPAGES, 0);
    m.gm.region_protect(r, Prot::READ).unwrap();
    let mut b = [0xffu8; 4];
    m.cpu.load(&m.gm, page_va(&r, 1), &mut b).unwrap();
    assert_eq!(b, [0; 4]);

    let (mirror, s) = gpu_read(g, &m.gm, &r, NPAGES).unwrap();
    assert_eq!(s.items, NPAGES);
    assert!(mirror[..2 * PAGE].iter().all(|x| *x == 0));
    check_mirror(&mirror, 2..NPAGES, 0);
    // One fault per page: page 0 had no frame (zero-filled in video memory), the others
    // lived in host memory and migrated (unique placement, faulting device).
    assert_eq!(
        (s.port.faults, s.port.zero_fills, s.port.migrations),
        (NPAGES, 1, NPAGES - 1)
    );
    let moved = (NPAGES - 1) * PAGE_SIZE;
    assert_eq!(m.gm.stats().bytes_host_to_dev, moved);
    assert_eq!(g.stats().dma.host_to_device, moved);
    // A second read is served by the GPU's own mappings: no fault.
    let (_, again) = gpu_read(g, &m.gm, &r, NPAGES).unwrap();
    assert_eq!(again.port.faults, 0);
    m.ok();
}

#[test]
fn anon_write_device_writes_are_seen_by_the_cpu() {
    let m = machine(1, 2 * NPAGES);
    let g = &m.gpus[0];
    let r = m.alloc(NPAGES);
    let s = gpu_write(g, &m.gm, &r, NPAGES, 7).unwrap();
    assert_eq!((s.port.faults, s.port.zero_fills), (NPAGES, NPAGES));
    assert_eq!(g.stats().dma.zeroed, NPAGES * PAGE_SIZE);
    assert_eq!(m.gm.dev_frames(g.id().unwrap()).unwrap().active, NPAGES);
    cpu_check(&m, &r, 0..NPAGES, 7);
    // The CPU's reads faulted every page back to host memory.
    assert_eq!(m.cpu.stats().port.migrations, NPAGES);
    assert_eq!(g.stats().dma.device_to_host, NPAGES * PAGE_SIZE);
    assert_eq!(m.gm.stats().bytes_dev_to_host, NPAGES * PAGE_SIZE);
    m.ok();
}

#[test]
fn anon_write_prot_write_to_read_only_fails_typed_then_succeeds_after_region_protect() {
    let m = machine(1, 2 * NPAGES);
    let g = &m.gpus[0];
    let r = m.alloc(NPAGES);
    m.gm.region_protect(r, Prot::READ).unwrap();
    // The device reads a zero page.
    let (mirror, s) = gpu_read(g, &m.gm, &r, 1).unwrap();
    assert_eq!((s.port.loads, s.port.faults), (1, 1));
    assert!(mirror.iter().all(|x| *x == 0));
    // Writing is refused with a typed protection fault, on the first work-item.
    let err = gpu_write(g, &m.gm, &r, NPAGES, 0).unwrap_err();
    assert_eq!(err.item, 0);
    assert!(matches!(
        err.error,
        AccessError::Fault { error: FaultError::ProtectionViolation { access, allowed, .. }, .. }
            if access == Prot::WRITE && allowed == Prot::READ
    ));
    let mut buf = vec![0xffu8; PAGE];
    for p in 0..NPAGES {
        m.cpu.load(&m.gm, page_va(&r, p), &mut buf).unwrap();
        assert!(buf.iter().all(|x| *x == 0), "page {p} was written");
    }
    // Now allow writing: the same kernel succeeds.
    m.gm.region_protect(r, Prot::RW).unwrap();
    gpu_write(g, &m.gm, &r, NPAGES, 0).unwrap();
    cpu_check(&m, &r, 0..NPAGES, 0);
    m.ok();
}

#[test]
fn migrate_moves_every_page_to_video_memory_and_the_device_reads_it_locally() {
    let m = machine(1, 2 * NPAGES);
    let g = &m.gpus[0];
    let r = m.alloc(NPAGES);
    cpu_fill(&m, &r, 0..NPAGES, 0);
    assert_eq!(
        m.gm.region_migrate(r, g.id().unwrap(), MigrateScope::Populated),
        Ok(NPAGES)
    );
    assert_eq!(m.gm.dev_frames(g.id().unwrap()).unwrap().active, NPAGES);
    assert_eq!(g.stats().dma.host_to_device, NPAGES * PAGE_SIZE);
    let (mirror, s) = gpu_read(g, &m.gm, &r, NPAGES).unwrap();
    check_mirror(&mirror, 0..NPAGES, 0);
    // The pages were already in place: each fault only installed the local mapping.
    assert_eq!(
        (s.port.faults, s.port.mapped_existing, s.port.migrations),
        (NPAGES, NPAGES, 0)
    );
    let root = g.mmu().active_root().unwrap();
    let leaf = g.tables().lookup(root, r.start).unwrap();
    assert!(leaf.local && g.vram().contains(leaf.frame));
    m.ok();
}

#[test]
fn migrate_fault_half_faulted_back_to_the_cpu_then_the_mix_migrates_again() {
    let m = machine(1, 2 * NPAGES);
    let g = &m.gpus[0];
    let gid = g.id().unwrap();
    let r = m.alloc(NPAGES);
    cpu_fill(&m, &r, 0..NPAGES, 0);
    assert_eq!(
        m.gm.region_migrate(r, gid, MigrateScope::Populated),
        Ok(NPAGES)
    );
    let (mirror, _) = gpu_read(g, &m.gm, &r, NPAGES).unwrap();
    check_mirror(&mirror, 0..NPAGES, 0);
    // Fault half the pages back to system memory and check them.
    cpu_check(&m, &r, 0..NPAGES / 2, 0);
    assert_eq!(m.cpu.stats().port.migrations, NPAGES / 2);
    assert_eq!(m.gm.dev_frames(gid).unwrap().active, NPAGES / 2);
    // Migrate the mix again: only the half in host memory moves.
    assert_eq!(
        m.gm.region_migrate(r, gid, MigrateScope::Populated),
        Ok(NPAGES / 2)
    );
    assert_eq!(m.gm.dev_frames(gid).unwrap().active, NPAGES);
    let (mirror, _) = gpu_read(g, &m.gm, &r, NPAGES).unwrap();
    check_mirror(&mirror, 0..NPAGES, 0);
    m.ok();
}

#[test]
fn migrate_multiple_ten_rounds_to_the_device_and_back() {
    let m = machine(1, 2 * NPAGES);
    let g = &m.gpus[0];
    let gid = g.id().unwrap();
    for c in 0..10u32 {
        let r = m.alloc(NPAGES);
        cpu_fill(&m, &r, 0..NPAGES, c);
        assert_eq!(
            m.gm.region_migrate(r, gid, MigrateScope::Populated),
            Ok(NPAGES),
            "round {c}"
        );
        let (mirror, _) = gpu_read(g, &m.gm, &r, NPAGES).unwrap();
        check_mirror(&mirror, 0..NPAGES, c);
        // Back to system memory by CPU faults.
        cpu_check(&m, &r, 0..NPAGES, c);
        assert_eq!(m.gm.dev_frames(gid).unwrap().active, 0, "round {c}");
        m.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
        m.ok();
    }
    assert_eq!(m.gm.stats().bytes_host_to_dev, 10 * NPAGES * PAGE_SIZE);
    assert_eq!(m.gm.stats().bytes_dev_to_host, 10 * NPAGES * PAGE_SIZE);
    // Every GPU table page of every round went back (only the root is left).
    assert_eq!(g.stats().tables.tables_in_use, 1);
}

#[test]
fn double_map_two_gpus_read_the_same_frames_then_one_reads_the_others_memory() {
    let m = machine(2, NPAGES);
    let (g0, g1) = (&m.gpus[0], &m.gpus[1]);
    let npages = 6;
    let r = m.alloc(npages);
    m.gm.region_set_policy(
        r,
        Placement {
            target: PlacementTarget::Host,
            mode: PlacementMode::RemoteAccess,
        },
    )
    .unwrap();
    cpu_fill(&m, &r, 0..npages, 0);
    m.gm.region_protect(r, Prot::READ).unwrap();
    // Device 0 and device 1 read system memory: both map the same host frames, where
    // the policy wants them (no migration, the CPU's mappings stay); a frame in another
    // device's memory mapped in place is a remote mapping.
    for g in [g0, g1] {
        let (mirror, s) = gpu_read(g, &m.gm, &r, npages).unwrap();
        check_mirror(&mirror, 0..npages, 0);
        assert_eq!((s.port.faults, s.port.remote), (npages, npages));
    }
    assert_eq!(m.gm.stats().faults_migrate, 0);
    for p in 0..npages {
        let va = page_va(&r, p);
        let l0 = g0
            .tables()
            .lookup(g0.mmu().active_root().unwrap(), va)
            .unwrap();
        let l1 = g1
            .tables()
            .lookup(g1.mmu().active_root().unwrap(), va)
            .unwrap();
        assert_eq!(l0.frame, l1.frame);
        assert!(!l0.local && m.cpu.memory().contains(l0.frame));
    }
    // Migrate the pages to device 1 and read them from device 0: a peer mapping.
    assert_eq!(
        m.gm.region_migrate(r, g1.id().unwrap(), MigrateScope::Populated),
        Ok(npages)
    );
    let (mirror, s) = gpu_read(g0, &m.gm, &r, npages).unwrap();
    check_mirror(&mirror, 0..npages, 0);
    assert_eq!(s.port.remote, npages);
    let l0 = g0
        .tables()
        .lookup(g0.mmu().active_root().unwrap(), r.start)
        .unwrap();
    assert!(!l0.local && g1.vram().contains(l0.frame));
    m.ok();
}

#[test]
fn oversubscribed_video_memory_of_a_quarter_of_the_working_set_keeps_every_byte() {
    // VectorAdd: c = a + b over u32s; three vectors of 64 pages, video memory 48 pages.
    let pages = 64;
    let n = pages * PAGE_SIZE / 4;
    let m = machine(1, 3 * pages / 4);
    let g = &m.gpus[0];
    let (a, b, c) = (m.alloc(pages), m.alloc(pages), m.alloc(pages));
    let word = |x: u64| x.wrapping_mul(2_654_435_761) as u32;
    for p in 0..pages {
        let (mut va, mut vb) = (Vec::with_capacity(PAGE), Vec::with_capacity(PAGE));
        for k in 0..PAGE as u64 / 4 {
            let i = p * PAGE_SIZE / 4 + k;
            va.extend_from_slice(&word(i).to_le_bytes());
            vb.extend_from_slice(&(i as u32).to_le_bytes());
        }
        m.cpu.store(&m.gm, page_va(&a, p), &va).unwrap();
        m.cpu.store(&m.gm, page_va(&b, p), &vb).unwrap();
    }
    let at = |r: &Region, i: u64| VirtAddr::new(r.start.as_u64() + 4 * i);
    let s = g
        .launch(&m.gm, Grid::covering(n, 256), |w| {
            let i = w.global;
            let x = w.load_u32(at(&a, i))?;
            let y = w.load_u32(at(&b, i))?;
            w.store_u32(at(&c, i), x.wrapping_add(y))
        })
        .unwrap();
    assert_eq!(s.items, n);
    // Every byte of all three vectors, read back by the CPU.
    let mut buf = vec![0u8; PAGE];
    for p in 0..pages {
        for (r, f) in [
            (&a, &word as &dyn Fn(u64) -> u32),
            (&b, &|i: u64| i as u32),
            (&c, &|i: u64| word(i).wrapping_add(i as u32)),
        ] {
            m.cpu.load(&m.gm, page_va(r, p), &mut buf).unwrap();
            for k in 0..PAGE / 4 {
                let i = p * PAGE_SIZE / 4 + k as u64;
                let got = u32::from_le_bytes(buf[4 * k..4 * k + 4].try_into().unwrap());
                assert_eq!(got, f(i), "element {i} of {:?}", r.start);
            }
        }
    }
    let st = m.gm.stats();
    assert!(st.evictions > 0, "{st:?}");
    let d = g.stats().dma;
    assert_eq!(d.host_to_device, st.bytes_host_to_dev);
    assert_eq!(d.device_to_host, st.bytes_dev_to_host);
    assert!(d.zeroed > 0 && d.device_to_host >= st.evictions * PAGE_SIZE);
    // The GPU's TLBs did most of the work: one walk per page touched or re-touched.
    let caches = g.stats().mmu.caches;
    assert!(caches.l1.hits > 10 * caches.walks, "{caches:?}");
    m.ok();
}
