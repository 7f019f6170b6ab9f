//! The mapping layer alone: one map + unmap pair of a 1-page and a 16-page DMA buffer,
//! through the KPI against the FreeBSD-style baseline (`GiantLockDomain::load` /
//! `unload`), in the same run. GMEM twice: the DMA path (`dma_map` and a strict
//! `dma_unmap`, through `DmaDevice::map_buffer` / `unmap_buffer`; variants `GM-V`,
//! `GM-V-CAS`) and the region path it replaced (`as_alloc` + `region_map` and a strict
//! `region_dealloc`, through `map_buffer_region` / `unmap_buffer_region`; variants
//! `GM-V-reg`, `GM-V-CAS-reg`: the *before* of issue 36's item 2). And `core-only`: the DMA path
//! over a driver whose calls do nothing (`NullMmu`), so that its time is the core's
//! own share of a pair (registry look-ups, locks, IOVA, record), without table edits.
//!
//! No invalidation is waited for (`InvalidationLatency::accounted(0)`: the IOTLB is
//! still invalidated, with no latency) and the time inside the invalidation calls (the
//! simulated IOTLB dropping its entries) is subtracted
//! (`gmem_iommu::invalidating_nanos_on_this_thread`); no DMA happens: the pair is the
//! IOVA allocation and free, the bookkeeping, the table edits and the locks. GMEM runs on
//! the locked tables (GM-V, the baseline's discipline) and on the lock-free ones
//! (GM-V-CAS). Buffers are scattered frames (every other frame), as receive buffers
//! are.
//!
//! Criterion reports each pair's time; then the bench measures the same pairs again
//! itself — batches of 20 000 pairs, the variants interleaved, the median batch of 7 —
//! and prints each GMEM variant's ratio to the baseline, with issue 36's targets
//! (≤ 0.5x the baseline and ≤ 300 ns for a 1-page strict pair).
//!
//! `cargo bench -p gmem-iommu --bench map_unmap`

use criterion::{criterion_group, Criterion};
use gmem_core::{
    Activation, AllocPolicy, DevCaps, DeviceDesc, Gmem, MapFlags, MapRun, Mmu, MmuError, MmuMode,
    PageSizes, PageTableFormat, PageTableRoot, PhysAddr, Prot, SingleCpu, VaRange, VirtAddr,
    PAGE_SIZE,
};
use gmem_host_cpu::{HostCpu, HostCpuConfig};
use gmem_iommu::{
    invalidating_nanos_on_this_thread, BusDmaMap, Discipline, GiantLockDomain, InvalidationLatency,
    Iommu, IommuConfig,
};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Buffer sizes measured, in pages.
const SIZES: [usize; 2] = [1, 16];

/// One machine: host memory, the core managing its low part, buffers above.
struct Host {
    cpu: HostCpu,
    gm: Gmem,
    frames: Vec<PhysAddr>,
}

fn host() -> Host {
    let cpu = HostCpu::new(HostCpuConfig {
        memory_bytes: 64 << 20,
        table_frames: 256,
        ..HostCpuConfig::default()
    })
    .expect("host");
    let gm = Gmem::new(Arc::new(SingleCpu), cpu.device_desc()).expect("core");
    cpu.port().bind(gm.host()).expect("bind");
    cpu.memory_map()
        .add(gm.host(), cpu.memory().clone())
        .expect("memory map");
    let base = cpu.memory().base().as_u64();
    gm.dev_register_physmem(
        gm.host(),
        PhysAddr::new(base + (1 << 20)),
        PhysAddr::new(base + (32 << 20)),
    )
    .expect("physmem");
    // Every other frame above the core's memory: no two frames of a buffer contiguous.
    let frames = (0..16u64)
        .map(|i| PhysAddr::new(base + (32 << 20) + 2 * i * PAGE_SIZE))
        .collect();
    Host { cpu, gm, frames }
}

fn config(discipline: Discipline) -> IommuConfig {
    IommuConfig {
        discipline,
        latency: InvalidationLatency::accounted(0),
        ..IommuConfig::default()
    }
}

/// A variant's map + unmap pair of `pages` pages, ready to call repeatedly.
type Pair = Box<dyn FnMut()>;

fn gmem_pair(discipline: Discipline, pages: usize, region: bool) -> Pair {
    let h = host();
    let iommu = Iommu::new(config(discipline), h.cpu.memory_map().clone()).expect("iommu");
    let nic = iommu.create_device(&h.gm, "nic").expect("device");
    let space = nic
        .create_space(
            &h.gm,
            VirtAddr::new(1 << 20),
            VirtAddr::new(1 << 32),
            AllocPolicy::CACHED,
        )
        .expect("space");
    let host_dev = h.gm.host();
    if region {
        return Box::new(move || {
            let r = nic
                .map_buffer_region(&h.gm, space, &h.frames[..pages], host_dev, Prot::WRITE)
                .expect("map");
            nic.unmap_buffer_region(&h.gm, black_box(r), MapFlags::empty(), None)
                .expect("unmap");
            let _ = &iommu;
        });
    }
    Box::new(move || {
        let r = nic
            .map_buffer(&h.gm, space, &h.frames[..pages], host_dev, Prot::WRITE)
            .expect("map");
        nic.unmap_buffer(&h.gm, black_box(r), MapFlags::empty(), None)
            .expect("unmap");
        let _ = &iommu;
    })
}

/// A driver that does nothing: what a pair costs over it is the core's alone.
struct NullMmu;

impl Mmu for NullMmu {
    fn format(&self) -> PageTableFormat {
        PageTableFormat(0x4e55)
    }
    fn page_sizes(&self) -> PageSizes {
        PageSizes::S4K
    }
    fn create_page_table(&self) -> Result<PageTableRoot, MmuError> {
        Ok(PageTableRoot(1))
    }
    fn destroy_page_table(&self, _: PageTableRoot) {}
    fn map(&self, _: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        black_box(run);
        Ok(())
    }
    fn unmap(&self, _: PageTableRoot, range: VaRange) {
        black_box(range);
    }
    fn protect(&self, _: PageTableRoot, _: VaRange, _: Prot) -> Result<(), MmuError> {
        Ok(())
    }
    fn invalidate(&self, _: PageTableRoot, ranges: &[VaRange]) {
        black_box(ranges);
    }
    fn invalidate_all(&self, _: PageTableRoot) {}
    fn activate(&self, _: Option<PageTableRoot>) {}
}

fn core_only_pair(pages: usize) -> Pair {
    let h = host();
    let nic =
        h.gm.dev_create(DeviceDesc {
            name: "null".into(),
            mmu: Arc::new(NullMmu),
            memory: None,
            caps: DevCaps::empty(),
            data: None,
        })
        .expect("device");
    let space =
        h.gm.as_create(
            VirtAddr::new(1 << 20),
            VirtAddr::new(1 << 32),
            AllocPolicy::CACHED,
        )
        .expect("space");
    h.gm.as_attach(space, nic, MmuMode::Coherent, Activation::Switch)
        .expect("attach");
    let host_dev = h.gm.host();
    Box::new(move || {
        let m =
            h.gm.dma_map(space, &h.frames[..pages], host_dev, Prot::WRITE)
                .expect("map");
        h.gm.dma_unmap(black_box(m), MapFlags::empty(), None)
            .expect("unmap");
    })
}

fn baseline_pair(pages: usize) -> Pair {
    let h = host();
    let iommu = Iommu::new(config(Discipline::Locked), h.cpu.memory_map().clone()).expect("iommu");
    let dom = GiantLockDomain::new(
        &iommu,
        VirtAddr::new(1 << 20),
        VirtAddr::new(1 << 32),
        h.gm.host(),
    )
    .expect("domain");
    let map = BusDmaMap::new();
    Box::new(move || {
        let va = dom
            .load(&map, &h.frames[..pages], Prot::WRITE)
            .expect("load");
        black_box(va);
        dom.unload(&map).expect("unload");
        let _ = &iommu;
    })
}

fn variants(pages: usize) -> Vec<(&'static str, Pair)> {
    vec![
        ("baseline", baseline_pair(pages)),
        ("GM-V", gmem_pair(Discipline::Locked, pages, false)),
        ("GM-V-CAS", gmem_pair(Discipline::Cas, pages, false)),
        ("GM-V-reg", gmem_pair(Discipline::Locked, pages, true)),
        ("GM-V-CAS-reg", gmem_pair(Discipline::Cas, pages, true)),
        ("core-only", core_only_pair(pages)),
    ]
}

fn bench(c: &mut Criterion) {
    for pages in SIZES {
        let mut g = c.benchmark_group(format!("map_unmap_{pages}page"));
        for (name, mut pair) in variants(pages) {
            g.bench_function(name, |b| b.iter_custom(|iters| timed(&mut pair, iters)));
        }
        g.finish();
    }
}

/// `iters` pairs' time less the time spent inside the IOTLB invalidations in them.
fn timed(pair: &mut Pair, iters: u64) -> Duration {
    let inval = invalidating_nanos_on_this_thread();
    let t = Instant::now();
    for _ in 0..iters {
        pair();
    }
    let took = t.elapsed();
    took.saturating_sub(Duration::from_nanos(
        invalidating_nanos_on_this_thread() - inval,
    ))
}

/// Nanoseconds per pair: the median of 7 batches of 20 000 pairs, variants interleaved.
fn same_run_ratios() {
    const BATCH: u32 = 20_000;
    println!(
        "same-run ratios (median of 7 interleaved batches of {BATCH} pairs, no invalidation wait):"
    );
    for pages in SIZES {
        let mut vs = variants(pages);
        for (_, p) in vs.iter_mut() {
            for _ in 0..BATCH {
                p();
            }
        }
        let mut samples: Vec<Vec<f64>> = vs.iter().map(|_| Vec::new()).collect();
        for _ in 0..7 {
            for (k, (_, p)) in vs.iter_mut().enumerate() {
                let took = timed(p, u64::from(BATCH));
                samples[k].push(took.as_nanos() as f64 / f64::from(BATCH));
            }
        }
        let median: Vec<f64> = samples
            .iter_mut()
            .map(|s| {
                s.sort_by(f64::total_cmp);
                s[s.len() / 2]
            })
            .collect();
        for (k, (name, _)) in vs.iter().enumerate() {
            let ratio = median[k] / median[0];
            let verdict = if k == 0 || pages != 1 || name.ends_with("-reg") || *name == "core-only"
            {
                String::new()
            } else {
                format!(
                    "  [target <= 0.50x: {}; <= 300 ns: {}]",
                    if ratio <= 0.5 { "met" } else { "FAIL" },
                    if median[k] <= 300.0 { "met" } else { "FAIL" }
                )
            };
            println!(
                "  {pages:>2} page{} {name:<12} {:>8.0} ns/pair  {ratio:>5.2}x the baseline{verdict}",
                if pages == 1 { " " } else { "s" },
                median[k]
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    same_run_ratios();
}
