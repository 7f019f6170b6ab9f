//! The integrated GPU next to the host CPU in both page-table modes of the GMEM paper
//! (section 6.4): sharing the CPU's table, and keeping a coherent table of its own.

use gmem_core::{
    Activation, AllocPolicy, AllocRequest, Gmem, MapFlags, MmuMode, Region, SpaceId, VirtAddr,
    PAGE_SIZE,
};
use gmem_host_cpu::{HostCpu, HostCpuConfig};
use gmem_igpu::Igpu;
use gmem_sim::Grid;

const PAGES: u64 = 32;
const N: u64 = PAGES * PAGE_SIZE / 4;

fn machine(mode: MmuMode) -> (Gmem, HostCpu, Igpu, SpaceId, MmuMode) {
    let (gm, cpu) = HostCpu::boot(HostCpuConfig::default()).unwrap();
    let space = gm
        .as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new(1 << 40),
            AllocPolicy::empty(),
        )
        .unwrap();
    gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let gpu = Igpu::new(cpu.tables().clone(), cpu.memory_map().clone(), 4).unwrap();
    let id = gpu.create(&gm, "igpu").unwrap();
    let effective = gm.as_attach(space, id, mode, Activation::Switch).unwrap();
    (gm, cpu, gpu, space, effective)
}

fn at(r: &Region, i: u64) -> VirtAddr {
    VirtAddr::new(r.start.as_u64() + 4 * i)
}

/// The CPU writes `a[i] = 3i + 1` page by page.
fn cpu_init(gm: &Gmem, cpu: &HostCpu, a: &Region) {
    for p in 0..PAGES {
        let bytes: Vec<u8> = (0..PAGE_SIZE / 4)
            .flat_map(|k| (3 * (p * PAGE_SIZE / 4 + k) as u32 + 1).to_le_bytes())
            .collect();
        cpu.store(gm, VirtAddr::new(a.start.as_u64() + p * PAGE_SIZE), &bytes)
            .unwrap();
    }
}

/// The GPU computes `b[i] = 2 a[i]`.
fn gpu_double(gm: &Gmem, gpu: &Igpu, a: &Region, b: &Region) -> gmem_sim::LaunchStats {
    gpu.launch(gm, Grid::covering(N, 128), |w| {
        let x = w.load_u32(at(a, w.global))?;
        w.store_u32(at(b, w.global), 2 * x)
    })
    .unwrap()
}

fn cpu_check_double(gm: &Gmem, cpu: &HostCpu, b: &Region) {
    for i in (0..N).step_by(97).chain([N - 1]) {
        assert_eq!(
            cpu.load_u32(gm, at(b, i)).unwrap(),
            2 * (3 * i as u32 + 1),
            "b[{i}]"
        );
    }
}

#[test]
fn shared_mode_one_table_the_gpu_never_faults_on_what_the_cpu_faulted_in() {
    let (gm, cpu, gpu, space, mode) = machine(MmuMode::Shared);
    assert_eq!(mode, MmuMode::Shared);
    // One table: both devices translate with the same root in host memory.
    assert_eq!(cpu.mmu().active_root(), gpu.mmu().active_root());
    let a = gm
        .as_alloc(space, AllocRequest::new(PAGES * PAGE_SIZE))
        .unwrap();
    let b = gm
        .as_alloc(space, AllocRequest::new(PAGES * PAGE_SIZE))
        .unwrap();
    cpu_init(&gm, &cpu, &a);
    // The CPU also touches b, so every page of both buffers is in the shared table.
    for p in 0..PAGES {
        cpu.store_u32(&gm, VirtAddr::new(b.start.as_u64() + p * PAGE_SIZE), 0)
            .unwrap();
    }
    let cpu_faults = cpu.stats().port.faults;
    assert_eq!(cpu_faults, 2 * PAGES);
    let s = gpu_double(&gm, &gpu, &a, &b);
    assert_eq!(s.port.faults, 0, "the GPU walked the CPU's entries");
    assert!(gpu.stats().mmu.caches.walks >= 2 * PAGES);
    // The GPU's stores set the dirty bits in the very entries the CPU walks.
    cpu_check_double(&gm, &cpu, &b);
    assert_eq!(cpu.stats().port.faults, cpu_faults);
    gm.check_invariants(space).unwrap();

    // Unmapping shoots down both TLBs; the emptied table pages wait for both.
    let before = (
        cpu.stats().mmu.invalidate_calls,
        gpu.stats().mmu.invalidate_calls,
    );
    gm.region_dealloc(b, MapFlags::empty(), None).unwrap();
    assert_eq!(cpu.stats().mmu.invalidate_calls, before.0 + 1);
    assert_eq!(gpu.stats().mmu.invalidate_calls, before.1 + 1);
    assert!(!gpu.mmu().cached(0, b.start));
    gm.region_dealloc(a, MapFlags::empty(), None).unwrap();
    let t = cpu.stats().tables;
    assert_eq!(t.reclaim.waiting, 0);
    assert!(t.reclaim.freed_after_invalidation > 0, "{t:?}");
    assert_eq!(t.tables_in_use, 1, "only the shared root is left");
    gm.check_invariants(space).unwrap();
}

#[test]
fn coherent_mode_own_table_kept_coherent_by_the_core() {
    let (gm, cpu, gpu, space, mode) = machine(MmuMode::Coherent);
    assert_eq!(mode, MmuMode::Coherent);
    let (cr, gr) = (
        cpu.mmu().active_root().unwrap(),
        gpu.mmu().active_root().unwrap(),
    );
    assert_ne!(cr, gr);
    let a = gm
        .as_alloc(space, AllocRequest::new(PAGES * PAGE_SIZE))
        .unwrap();
    let b = gm
        .as_alloc(space, AllocRequest::new(PAGES * PAGE_SIZE))
        .unwrap();
    cpu_init(&gm, &cpu, &a);
    let s = gpu_double(&gm, &gpu, &a, &b);
    // The GPU faults once per page of each buffer: a's pages are mapped where they are
    // (host memory, the GPU has none), b's are zero-filled in host memory.
    assert_eq!(s.port.faults, 2 * PAGES);
    assert_eq!((s.port.mapped_existing, s.port.zero_fills), (PAGES, PAGES));
    // Unique placement: the CPU lost its mappings of a (the GPU took them over), so its
    // table and the GPU's never map a page at once.
    assert!(cpu.tables().lookup(cr, a.start).is_none());
    assert!(cpu.tables().lookup(gr, a.start).is_some());
    let cpu_faults = cpu.stats().port.faults;
    cpu_check_double(&gm, &cpu, &b);
    assert!(cpu.stats().port.faults > cpu_faults);
    // No byte moved: an integrated GPU's pages stay in host memory.
    let st = gm.stats();
    assert_eq!((st.bytes_host_to_dev, st.bytes_dev_to_host), (0, 0));
    gm.check_invariants(space).unwrap();
}
