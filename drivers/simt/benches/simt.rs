//! Speed of the simulator itself: offline replay (translations per second) and the live
//! SIMT model (memory instructions per second). Criterion prints both as throughput
//! (`thrpt`, elements per second), twice: by wall clock (groups `replay`, `live`) and by
//! the benchmark thread's own CPU time (groups `replay-cpu`, `live-cpu`, read from
//! Linux's `/proc/thread-self/schedstat`), which a machine shared with other jobs
//! inflates much less than wall time.
//!
//! The live kernels (`Stream`, `Columns`, `Rows`) declare their addresses affine in
//! the thread id ([`Spec::affine`], [`Spec::out_affine`]), as the Polybench workloads
//! do: the warp writes its lane addresses as `start + stride·lane` without calling
//! `addr` or `out` per lane (debug builds check each declaration against them; the
//! model's results are the same either way).

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gmem_sim::{replay, ReplayPath, ReplayStream, TlbHierarchy};
use gmem_simt::machine::{mesc_tlbs, SimtMachine, MESC_UNITS};
use gmem_simt::workloads::spec::{Affine, Spec, SpecKernel, MAX_OPS};
use gmem_simt::workloads::{pages_needed, run, Size};

/// `c[t] = a[t] + b[t]`: coalesced, one page per instruction.
struct Stream {
    n: u64,
    a: u64,
    c: u64,
}

impl Spec for Stream {
    fn threads(&self) -> u64 {
        self.n
    }
    fn steps(&self) -> u64 {
        1
    }
    fn operands(&self) -> usize {
        1
    }
    fn addr(&self, t: u64, _k: u64, _op: usize) -> Option<u64> {
        Some(self.a + 4 * t)
    }
    fn affine(&self, _k: u64, _op: usize) -> Option<Affine> {
        Some(Affine {
            base: self.a,
            stride: 4,
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] = v[0] + 1.0;
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.c + 4 * t)
    }
    fn out_affine(&self) -> Option<Affine> {
        Some(Affine {
            base: self.c,
            stride: 4,
        })
    }
}

/// `out[t] = Σ_k a[t][k]`: a page per lane per instruction (ATAX's first kernel).
struct Rows {
    n: u64,
    a: u64,
    out: u64,
}

impl Spec for Rows {
    fn threads(&self) -> u64 {
        self.n
    }
    fn steps(&self) -> u64 {
        64
    }
    fn operands(&self) -> usize {
        1
    }
    fn addr(&self, t: u64, k: u64, _op: usize) -> Option<u64> {
        Some(self.a + 4 * (t * self.n + k))
    }
    fn affine(&self, k: u64, _op: usize) -> Option<Affine> {
        Some(Affine {
            base: self.a + 4 * k,
            stride: 4 * self.n,
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.out + 4 * t)
    }
    fn out_affine(&self) -> Option<Affine> {
        Some(Affine {
            base: self.out,
            stride: 4,
        })
    }
}

/// `out[t] = Σ_k a[k][t]`: 64 coalesced loads per thread, one page per instruction
/// (ATAX's second kernel): the steady per-instruction cost without block turnover.
struct Columns {
    n: u64,
    a: u64,
    out: u64,
}

impl Spec for Columns {
    fn threads(&self) -> u64 {
        self.n
    }
    fn steps(&self) -> u64 {
        64
    }
    fn operands(&self) -> usize {
        1
    }
    fn addr(&self, t: u64, k: u64, _op: usize) -> Option<u64> {
        Some(self.a + 4 * (k * self.n + t))
    }
    fn affine(&self, k: u64, _op: usize) -> Option<Affine> {
        Some(Affine {
            base: self.a + 4 * k * self.n,
            stride: 4,
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.out + 4 * t)
    }
    fn out_affine(&self) -> Option<Affine> {
        Some(Affine {
            base: self.out,
            stride: 4,
        })
    }
}

/// The running thread's CPU time, nanoseconds (wall time since first use where
/// `/proc/thread-self/schedstat` is unavailable).
fn thread_cpu_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| {
            START
                .get_or_init(std::time::Instant::now)
                .elapsed()
                .as_nanos() as u64
        })
}

/// A criterion measurement of the benchmark thread's CPU time.
struct CpuTime {
    wall: WallTime,
}

impl Measurement for CpuTime {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Nanoseconds, formatted as criterion formats wall time.
        self.wall.formatter()
    }
}

fn benches_wall(c: &mut Criterion) {
    benches(c, "");
}

fn benches_cpu(c: &mut Criterion<CpuTime>) {
    benches(c, "-cpu");
}

fn benches<M: Measurement>(c: &mut Criterion<M>, suffix: &str) {
    // Offline replay of recorded streams through the MESC geometry: ATAX (quick size,
    // nine requests in ten miss the L1 TLB) and BFS on an R-MAT graph (mostly hits).
    let mut g = c.benchmark_group(format!("replay{suffix}"));
    for name in ["atax", "bfs-rmat"] {
        let m = SimtMachine::mesc(pages_needed(name, Size::Quick)).unwrap();
        m.start_recording();
        assert!(run(&m, name, Size::Quick).unwrap().verified);
        let log = m.take_recording();
        g.throughput(Throughput::Elements(log.translations()));
        g.bench_function(format!("{name}-quick translations"), |b| {
            b.iter(|| {
                let mut caches = TlbHierarchy::new(mesc_tlbs(MESC_UNITS)).unwrap();
                replay(&mut caches, &log, 4)
            })
        });
        // The same stream pre-decoded once, replayed split by level (its peer: the
        // one-pass replay above).
        let stream = ReplayStream::new(&log, 4).unwrap();
        let mut caches = TlbHierarchy::new(mesc_tlbs(MESC_UNITS)).unwrap();
        assert_eq!(stream.replay_split(&mut caches).path, ReplayPath::Split);
        g.bench_function(format!("{name}-quick split translations"), |b| {
            b.iter(|| {
                let mut caches = TlbHierarchy::new(mesc_tlbs(MESC_UNITS)).unwrap();
                stream.replay_split(&mut caches)
            })
        });
    }
    g.finish();

    // Live SIMT: memory instructions per second.
    let n = 1u64 << 20;
    let m = SimtMachine::mesc(3 * n / 1024 + 2048).unwrap();
    let a = m.upload_f32(&vec![1.0; n as usize]).unwrap();
    let out = m.upload_f32(&vec![0.0; n as usize]).unwrap();
    let stream = SpecKernel::new(Stream {
        n,
        a: a.start.as_u64(),
        c: out.start.as_u64(),
    });
    let instrs = m.launch(&stream).unwrap().memory_instructions;
    let mut g = c.benchmark_group(format!("live{suffix}"));
    g.throughput(Throughput::Elements(instrs));
    g.bench_function("stream memory instructions", |b| {
        b.iter(|| m.launch(&stream).unwrap())
    });
    let columns = SpecKernel::new(Columns {
        n: 16384,
        a: a.start.as_u64(),
        out: out.start.as_u64(),
    });
    let instrs = m.launch(&columns).unwrap().memory_instructions;
    g.throughput(Throughput::Elements(instrs));
    g.bench_function("coalesced-loop memory instructions", |b| {
        b.iter(|| m.launch(&columns).unwrap())
    });
    let rows = SpecKernel::new(Rows {
        n: 1024,
        a: a.start.as_u64(),
        out: out.start.as_u64(),
    });
    let instrs = m.launch(&rows).unwrap().memory_instructions;
    g.throughput(Throughput::Elements(instrs));
    g.bench_function("strided memory instructions", |b| {
        b.iter(|| m.launch(&rows).unwrap())
    });
    g.finish();
}

criterion_group! {
    name = simt;
    config = Criterion::default().sample_size(10);
    targets = benches_wall
}
criterion_group! {
    name = simt_cpu;
    config = Criterion::default()
        .with_measurement(CpuTime { wall: WallTime })
        .sample_size(10);
    targets = benches_cpu
}
criterion_main!(simt, simt_cpu);
