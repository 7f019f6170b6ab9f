//! First-touch 4 KiB fault through `dev_fault` on the test MMU, next to a Linux
//! anonymous-memory first-touch fault measured in the same run.
//!
//! Ours: a fresh region of `BATCH` pages is faulted page by page (`dev_fault` with a
//! write access: region lookup, protection check, frame allocation, logical page table
//! update, driver map call). The test memory's zeroing of a never-written frame is a
//! no-op, so zeroing is excluded, as the target states. The region's deallocation is
//! outside the timed part.
//!
//! Peer: `mmap(MAP_PRIVATE | MAP_ANONYMOUS)` of `BATCH` pages, one write per page (each
//! a page fault that allocates, zeroes and maps a page), `munmap` untimed. Linux's number
//! includes zeroing 4 KiB, ours does not: read the ratio with that in mind.
//!
//! Floor: the round trip of the core's spin lock (one `lock cmpxchg` to take it, a
//! release store to drop it), timed alone in the same run, times the atomic
//! read-modify-writes a fault executes ([`ATOMICS_PER_FAULT`]): what the fault's
//! atomics cost on this machine, whatever its instructions.

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use gmem_core::testing::TestSystem;
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, MapFlags, MmuMode, Prot, SpaceId, VirtAddr, PAGE_SIZE,
};
use std::time::{Duration, Instant};

mod timing;
use timing::{medians, Stopwatch, Timed};

const BATCH: u64 = 4096;

/// Atomic read-modify-writes per 4 KiB first-touch fault of this bench, as
/// `python3 gmem-core/benches/fault_stages.py --atomics` counts them: the binding lock
/// and the space `try_lock` (`dev_fault`), the physical-memory lock
/// (`DeviceInner::alloc_pages`), the test driver's table lock (`TestMmu::map`) and
/// store lock (`TestMemory::zero`). Update it with that count when the path changes.
const ATOMICS_PER_FAULT: f64 = 5.0;

struct Setup {
    sys: TestSystem,
    space: SpaceId,
}

fn setup() -> Setup {
    let sys = TestSystem::without_log(4 * BATCH);
    let space = sys
        .gm
        .as_create(
            VirtAddr::new(1 << 32),
            VirtAddr::new(1 << 40),
            AllocPolicy::empty(),
        )
        .unwrap();
    sys.gm
        .as_attach(space, sys.host().id, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    Setup { sys, space }
}

/// Time `BATCH` first-touch faults through the core.
fn gmem_batch(s: &Setup) -> Timed {
    let gm = &s.sys.gm;
    let host = s.sys.host().id;
    let r = gm
        .as_alloc(s.space, AllocRequest::new(BATCH * PAGE_SIZE))
        .unwrap();
    let base = r.start.as_u64();
    let t = Stopwatch::start();
    for p in 0..BATCH {
        let res = gm
            .dev_fault(host, VirtAddr::new(base + p * PAGE_SIZE), Prot::WRITE)
            .unwrap();
        let _retry = std::hint::black_box(res);
    }
    let d = t.stop();
    gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
    d
}

/// Time `BATCH` round trips of the core's spin lock, uncontended: `lock` (a
/// compare-and-swap) and the guard's drop (a release store), as each of the fault's
/// locks does once.
fn spin_batch(m: &gmem_core::sync::Mutex<u64>) -> Timed {
    let t = Stopwatch::start();
    for _ in 0..BATCH {
        *std::hint::black_box(m).lock() += 1;
    }
    t.stop()
}

/// Time `BATCH` first-touch faults of Linux anonymous memory.
fn linux_batch() -> Timed {
    let len = (BATCH * PAGE_SIZE) as usize;
    // SAFETY: an anonymous private mapping with no address hint; checked for failure.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap failed");
    let base = p as *mut u8;
    let t = Stopwatch::start();
    for i in 0..BATCH as usize {
        // SAFETY: `i * 4096` lies inside the `len`-byte mapping created above.
        unsafe { std::ptr::write_volatile(base.add(i * PAGE_SIZE as usize), 1) };
    }
    let d = t.stop();
    // SAFETY: unmapping exactly the mapping created above.
    unsafe { libc::munmap(p, len) };
    d
}

fn bench(c: &mut Criterion) {
    let s = setup();
    let mut g = c.benchmark_group("first_touch_fault_4k");
    g.throughput(Throughput::Elements(BATCH));
    g.sample_size(30).measurement_time(Duration::from_secs(3));
    g.bench_function(BenchmarkId::new("gmem_dev_fault", "test-mmu"), |b| {
        b.iter_custom(|iters| (0..iters).map(|_| gmem_batch(&s).wall).sum())
    });
    g.bench_function(BenchmarkId::new("linux_anon_fault", "mmap+touch"), |b| {
        b.iter_custom(|iters| (0..iters).map(|_| linux_batch().wall).sum())
    });
    g.finish();

    // Alternated samples: a neighbour's load hits both sides alike.
    const SAMPLES: usize = 31;
    let lock = gmem_core::sync::Mutex::new(0u64);
    let (mut o, mut l, mut k) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..SAMPLES {
        o.push(gmem_batch(&s));
        l.push(linux_batch());
        k.push(spin_batch(&lock));
    }
    assert_eq!(*lock.lock(), SAMPLES as u64 * BATCH, "every round trip ran");
    let (ours, ours_cpu) = medians(&o, BATCH as f64, 1e9);
    let (linux, linux_cpu) = medians(&l, BATCH as f64, 1e9);
    let (spin, spin_cpu) = medians(&k, BATCH as f64, 1e9);
    println!();
    println!("first-touch 4 KiB fault, median of {SAMPLES} alternated batches of {BATCH} faults (wall / thread CPU):");
    println!(
        "  gmem dev_fault (test MMU, zeroing excluded) {ours:>8.1} / {ours_cpu:>8.1} ns/fault"
    );
    println!(
        "  Linux anonymous fault (zeroing included)    {linux:>8.1} / {linux_cpu:>8.1} ns/fault"
    );
    println!(
        "  ratio Linux / gmem                          {:>8.2} / {:>8.2}x",
        linux / ours,
        linux_cpu / ours_cpu
    );
    println!(
        "  {:<43} {spin:>8.1} / {spin_cpu:>8.1} ns",
        "spin lock round trip (cmpxchg + store)"
    );
    println!(
        "  {:<43} {:>8.1} / {:>8.1} ns/fault ({:.0}% of gmem's wall)",
        format!("floor: {ATOMICS_PER_FAULT} atomics x round trip"),
        spin * ATOMICS_PER_FAULT,
        spin_cpu * ATOMICS_PER_FAULT,
        100.0 * spin * ATOMICS_PER_FAULT / ours
    );
    println!(
        "  target (issue 15): gmem <= 150 ns -> {}; Linux / gmem >= 10x -> {} (wall)",
        if ours <= 150.0 { "met" } else { "NOT met" },
        if linux / ours >= 10.0 {
            "met"
        } else {
            "NOT met"
        }
    );
    println!("  per-stage breakdown: python3 gmem-core/benches/fault_stages.py (callgrind)");
}

criterion_group!(benches, bench);

/// `GMEM_FAULT_PROFILE=N`: only `N` batches of our faults, no criterion and no peer,
/// for a profiler (`benches/fault_stages.py` runs this under callgrind).
fn main() {
    if let Some(n) = std::env::var("GMEM_FAULT_PROFILE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        // One region of `n` batches, never deallocated: the profile holds the fault
        // path alone (the timed batches also allocate and free their region, untimed).
        let s = setup();
        let gm = &s.sys.gm;
        let pages = n.min(4) * BATCH;
        let r = gm
            .as_alloc(s.space, AllocRequest::new(pages * PAGE_SIZE))
            .unwrap();
        let t = Instant::now();
        for p in 0..pages {
            let va = VirtAddr::new(r.start.as_u64() + p * PAGE_SIZE);
            let res = gm.dev_fault(s.sys.host().id, va, Prot::WRITE).unwrap();
            let _retry = std::hint::black_box(res);
        }
        println!(
            "profile: {pages} faults, {:.1} ns/fault",
            t.elapsed().as_nanos() as f64 / pages as f64
        );
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
