//! One 2 MiB first-touch fault with zero-fill against a same-run `memset` of 2 MiB,
//! and 512 4 KiB faults over the same range, through `dev_fault` on the test MMU (a
//! device whose MMU maps 4 KiB and 2 MiB leaves, 16 MiB of memory).
//!
//! The device's memory is [`DenseMemory`], a flat buffer of real bytes (pre-touched,
//! filled with a pattern) whose `zero` is a real `memset` of the range: the zero-fill is
//! the work a kernel does, not the sparse test memory's free "forget the page".
//!
//! - `one_2m_fault`: a fresh 2 MiB-aligned region of 2 MiB with the default zero-fill
//!   block (2 MiB): one fault allocates an aligned 2 MiB frame block, zeroes its 2 MiB
//!   and maps it with one 2 MiB leaf.
//! - `memset_2m`: the peer, `memset` of the very 2 MiB of the device buffer that the
//!   2 MiB fault zeroes (same bytes, same page backing): what zeroing the block costs
//!   by itself. Target: the fault costs at most 1.5x this. In the printed medians each
//!   round runs the 2 MiB fault, the 512 faults with reservations, the memset, then the
//!   512 faults without: between the fault and its memset, and between the memset and
//!   the next fault, 2 MiB of other frames are zeroed, so neither finds the block hot in
//!   cache because the other just wrote it (criterion's own `memset_2m` repeats the
//!   memset back to back, hot: read the printed figures).
//! - `512_4k_faults`: the same region with a 4 KiB zero-fill block: 512 faults, each
//!   allocating one frame (from the block's superpage reservation), zeroing 4 KiB and
//!   mapping it with a 4 KiB leaf; the last one finds the block complete and promotes it
//!   to one 2 MiB leaf (what a 4 KiB-faulting device costs, reservations on).
//! - `512_4k_faults_no_reservations`: the same without reservations (no promotion).
//!
//! After criterion's runs the bench prints its own medians, sampled alternately (fault,
//! memset, fault, ...) so that a neighbour's load hits both sides alike, and the ratios.
//! The region's deallocation is outside the timed part. Before timing, one fault is
//! checked to have really zeroed its block.

use criterion::{criterion_group, Criterion, Throughput};
use gmem_core::driver::{DeviceMemory, MemError};
use gmem_core::testing::{EventLog, TableStore, TestMmu, TestSystem};
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, DevCaps, DeviceDesc, MapFlags, MmuMode, PageSizes,
    PhysAddr, Prot, SpaceId, VirtAddr, PAGE_SIZE,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod timing;
use timing::{medians, Stopwatch, Timed};

const BLOCK: u64 = 2 << 20;
const MEM_BASE: u64 = 0x8000_0000;
const MEM_PAGES: u64 = 4096;

/// Device memory as one flat, pre-touched buffer of real bytes.
struct DenseMemory {
    bytes: Mutex<Vec<u8>>,
}

impl DenseMemory {
    fn new() -> DenseMemory {
        // A pattern, not zeros: every page is touched (no lazy kernel page behind it)
        // and a missing zero-fill shows.
        DenseMemory {
            bytes: Mutex::new(vec![0xa5; (MEM_PAGES * PAGE_SIZE) as usize]),
        }
    }

    fn range(pa: PhysAddr, len: u64) -> Result<core::ops::Range<usize>, MemError> {
        let a = pa.as_u64();
        if a < MEM_BASE || a.saturating_add(len) > MEM_BASE + MEM_PAGES * PAGE_SIZE {
            return Err(MemError::OutOfRange { pa });
        }
        let off = (a - MEM_BASE) as usize;
        Ok(off..off + len as usize)
    }
}

impl DeviceMemory for DenseMemory {
    fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        let r = DenseMemory::range(pa, len)?;
        self.bytes.lock().unwrap()[r].fill(0);
        Ok(())
    }
    fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
        let r = DenseMemory::range(pa, buf.len() as u64)?;
        buf.copy_from_slice(&self.bytes.lock().unwrap()[r]);
        Ok(())
    }
    fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
        let r = DenseMemory::range(pa, buf.len() as u64)?;
        self.bytes.lock().unwrap()[r].copy_from_slice(buf);
        Ok(())
    }
}

struct Setup {
    sys: TestSystem,
    space: SpaceId,
    dev: gmem_core::DeviceId,
    memory: Arc<DenseMemory>,
    mmu: Arc<TestMmu>,
}

fn setup(reservations: bool) -> Setup {
    let sys = TestSystem::without_log(1024);
    let space = sys
        .gm
        .as_create(
            VirtAddr::new(1 << 32),
            VirtAddr::new(1 << 40),
            AllocPolicy::empty(),
        )
        .unwrap();
    let log: EventLog = Arc::new(gmem_core::sync::Mutex::new(Vec::new()));
    let mmu = Arc::new(
        TestMmu::new(1, 7, TableStore::new(), log)
            .with_page_sizes(PageSizes::S4K | PageSizes::S2M)
            .without_log(),
    );
    let memory = Arc::new(DenseMemory::new());
    let dev = sys
        .gm
        .dev_create(DeviceDesc {
            name: String::from("gpu"),
            mmu: mmu.clone(),
            memory: Some(memory.clone()),
            caps: DevCaps::FAULTABLE,
            data: None,
        })
        .unwrap();
    sys.gm
        .dev_register_physmem(
            dev,
            PhysAddr::new(MEM_BASE),
            PhysAddr::new(MEM_BASE + MEM_PAGES * PAGE_SIZE),
        )
        .unwrap();
    sys.gm.dev_set_reservations(dev, reservations).unwrap();
    sys.gm
        .as_attach(space, dev, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    Setup {
        sys,
        space,
        dev,
        memory,
        mmu,
    }
}

/// Time the faults that populate one fresh 2 MiB block with zero-fill block `gran`;
/// with `check`, verify (untimed) that the block reads as zeros through the device.
/// Returns the time and the offset in the device buffer of the block's first frame.
fn block(s: &Setup, gran: u64, check: bool) -> (Timed, usize) {
    let gm = &s.sys.gm;
    let mut req = AllocRequest::new(BLOCK);
    req.align = BLOCK;
    let r = gm.as_alloc(s.space, req).unwrap();
    gm.region_set_zero_fill_block(r, gran).unwrap();
    let base = r.start.as_u64();
    let t = Stopwatch::start();
    let mut p = 0;
    while p < BLOCK {
        let res = gm
            .dev_fault(s.dev, VirtAddr::new(base + p), Prot::WRITE)
            .unwrap();
        p += std::hint::black_box(res).pages.max(1) * PAGE_SIZE;
    }
    let d = t.stop();
    let first = s.mmu.translate(VirtAddr::new(base)).unwrap().pfn;
    let off = (first * PAGE_SIZE - MEM_BASE) as usize;
    if check {
        let mut pfns = Vec::new();
        for k in 0..BLOCK / PAGE_SIZE {
            let pte = s
                .mmu
                .translate(VirtAddr::new(base + k * PAGE_SIZE))
                .unwrap();
            pfns.push(pte.pfn);
        }
        for pfn in pfns {
            let mut page = vec![0xffu8; PAGE_SIZE as usize];
            s.memory
                .read(PhysAddr::new(pfn * PAGE_SIZE), &mut page)
                .unwrap();
            assert!(page.iter().all(|&b| b == 0), "frame {pfn:#x} not zeroed");
        }
    }
    gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
    (d, off)
}

/// Time one `memset` of the 2 MiB at `off` in the device buffer.
fn memset(s: &Setup, off: usize) -> Timed {
    let mut bytes = s.memory.bytes.lock().unwrap();
    let buf = &mut bytes[off..off + BLOCK as usize];
    let t = Stopwatch::start();
    buf.fill(0);
    std::hint::black_box(&mut *buf);
    t.stop()
}

fn bench(c: &mut Criterion) {
    let with = setup(true);
    let without = setup(false);
    // The zero-fill is real: a pattern-filled block reads back as zeros.
    block(&with, 0, true);
    block(&with, PAGE_SIZE, true);
    let off = block(&with, 0, false).1;

    let mut g = c.benchmark_group("large_fault");
    g.throughput(Throughput::Bytes(BLOCK));
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("one_2m_fault", |b| {
        b.iter_custom(|n| (0..n).map(|_| block(&with, 0, false).0.wall).sum())
    });
    g.bench_function("memset_2m", |b| {
        b.iter_custom(|n| (0..n).map(|_| memset(&with, off).wall).sum())
    });
    g.bench_function("512_4k_faults", |b| {
        b.iter_custom(|n| (0..n).map(|_| block(&with, PAGE_SIZE, false).0.wall).sum())
    });
    g.bench_function("512_4k_faults_no_reservations", |b| {
        b.iter_custom(|n| {
            (0..n)
                .map(|_| block(&without, PAGE_SIZE, false).0.wall)
                .sum()
        })
    });
    g.finish();

    const SAMPLES: usize = 101;
    let (mut large, mut set, mut small, mut small_nr) = (vec![], vec![], vec![], vec![]);
    for _ in 0..SAMPLES {
        let (t, off) = block(&with, 0, false);
        large.push(t);
        small.push(block(&with, PAGE_SIZE, false).0);
        set.push(memset(&with, off));
        small_nr.push(block(&without, PAGE_SIZE, false).0);
    }
    // Paired: each fault sample minus the memset sample of its round (the
    // fault's own cost beyond zeroing, less exposed to the load drifting over the run).
    let mut diff: Vec<f64> = large
        .iter()
        .zip(&set)
        .map(|(f, m)| (f.cpu.as_secs_f64() - m.cpu.as_secs_f64()) * 1e6)
        .collect();
    let diff = timing::median(&mut diff);
    let (large, large_c) = medians(&large, 1.0, 1e6);
    let (set, set_c) = medians(&set, 1.0, 1e6);
    let (small, small_c) = medians(&small, 1.0, 1e6);
    let (small_nr, small_nr_c) = medians(&small_nr, 1.0, 1e6);
    println!();
    println!(
        "2 MiB first touch, median of {SAMPLES} alternated samples, wall / thread CPU \
         (zero-fill is a real memset):"
    );
    println!("  one 2 MiB fault (zero-fill + one 2 MiB leaf)  {large:>8.1} / {large_c:>8.1} us");
    println!("  memset of 2 MiB (same run)                    {set:>8.1} / {set_c:>8.1} us");
    println!(
        "  ratio fault / memset                          {:>8.2} / {:>8.2}x  (target <= 1.5x: {})",
        large / set,
        large_c / set_c,
        if large / set <= 1.5 { "met" } else { "NOT met" }
    );
    println!("  paired difference fault - memset (CPU)        {diff:>8.1} us (median)");
    println!(
        "  512 4 KiB faults, reservations (promoted)     {small:>8.1} / {small_c:>8.1} us  ({:.2}x the 2 MiB fault)",
        small / large
    );
    println!(
        "  512 4 KiB faults, no reservations             {small_nr:>8.1} / {small_nr_c:>8.1} us  ({:.2}x the 2 MiB fault)",
        small_nr / large
    );
    let s = with.sys.gm.stats();
    println!(
        "  counters: large_maps {}, promotions {}, large_fallback_partial {}",
        s.large_maps, s.promotions, s.large_fallback_partial
    );
}

criterion_group!(benches, bench);

/// `GMEM_LARGE_PROFILE=N`: only `N` 2 MiB faults (no criterion, no peer), for a
/// profiler such as callgrind.
fn main() {
    if let Some(n) = std::env::var("GMEM_LARGE_PROFILE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        let with = setup(true);
        let us: f64 = (0..n)
            .map(|_| block(&with, 0, false).0.wall.as_secs_f64() * 1e6)
            .sum();
        println!(
            "profile: {n} 2 MiB faults, {:.1} us each",
            us / f64::from(n.max(1))
        );
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
