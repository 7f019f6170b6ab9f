//! One 2 MiB fault against 512 4 KiB faults of the same block, through `dev_fault` on
//! the test MMU (a device whose MMU maps 4 KiB and 2 MiB leaves, 16 MiB of memory).
//!
//! - `one_2m_fault`: a fresh 2 MiB-aligned region of 2 MiB with the default zero-fill
//!   block (2 MiB): one fault allocates an aligned 2 MiB frame block, zeroes it and
//!   maps it with one 2 MiB leaf.
//! - `512_4k_faults`: the same region with a 4 KiB zero-fill block: 512 faults, each
//!   allocating one frame (from the block's superpage reservation), zeroing and mapping
//!   it with a 4 KiB leaf; the last one finds the block complete and promotes it to one
//!   2 MiB leaf (what a 4 KiB-faulting device costs, reservations on).
//! - `512_4k_faults_no_reservations`: the same without reservations (no promotion).
//!
//! The test memory zeroes a never-written frame by forgetting it (a map removal), so
//! the zeroing cost is nearly absent from both sides: the ratio is the core's
//! per-fault overhead (lookup, allocation, page-table update, driver call). The region's
//! deallocation is outside the timed part.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gmem_core::testing::TestSystem;
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, DevCaps, MapFlags, MmuMode, PageSizes, Prot, SpaceId,
    VirtAddr, PAGE_SIZE,
};
use std::time::{Duration, Instant};

const BLOCK: u64 = 2 << 20;

struct Setup {
    sys: TestSystem,
    space: SpaceId,
    gpu: usize,
}

fn setup(reservations: bool) -> Setup {
    let mut sys = TestSystem::without_log(1024);
    let space = sys
        .gm
        .as_create(
            VirtAddr::new(1 << 32),
            VirtAddr::new(1 << 40),
            AllocPolicy::empty(),
        )
        .unwrap();
    let gpu = sys.add_device_with_sizes(
        7,
        DevCaps::FAULTABLE,
        0x8000_0000,
        4096,
        PageSizes::S4K | PageSizes::S2M,
    );
    let id = sys.devices[gpu].id;
    sys.gm.dev_set_reservations(id, reservations).unwrap();
    sys.gm
        .as_attach(space, id, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    Setup { sys, space, gpu }
}

/// Time the faults that populate one fresh 2 MiB block with zero-fill block `gran`.
fn block(s: &Setup, gran: u64) -> Duration {
    let gm = &s.sys.gm;
    let dev = s.sys.devices[s.gpu].id;
    let mut req = AllocRequest::new(BLOCK);
    req.align = BLOCK;
    let r = gm.as_alloc(s.space, req).unwrap();
    gm.region_set_zero_fill_block(r, gran).unwrap();
    let base = r.start.as_u64();
    let t = Instant::now();
    let mut p = 0;
    while p < BLOCK {
        let res = gm
            .dev_fault(dev, VirtAddr::new(base + p), Prot::WRITE)
            .unwrap();
        p += std::hint::black_box(res).pages.max(1) * PAGE_SIZE;
    }
    let d = t.elapsed();
    gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
    d
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("large_fault");
    g.throughput(Throughput::Bytes(BLOCK));
    g.measurement_time(Duration::from_secs(3));
    let with = setup(true);
    g.bench_function("one_2m_fault", |b| {
        b.iter_custom(|n| (0..n).map(|_| block(&with, 0)).sum())
    });
    g.bench_function("512_4k_faults", |b| {
        b.iter_custom(|n| (0..n).map(|_| block(&with, PAGE_SIZE)).sum())
    });
    let without = setup(false);
    g.bench_function("512_4k_faults_no_reservations", |b| {
        b.iter_custom(|n| (0..n).map(|_| block(&without, PAGE_SIZE)).sum())
    });
    g.finish();
    let s = with.sys.gm.stats();
    println!(
        "large_fault: large_maps {}, promotions {}, large_fallback_partial {}",
        s.large_maps, s.promotions, s.large_fallback_partial
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
