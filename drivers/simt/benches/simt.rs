//! Speed of the simulator itself: offline replay (translations per second) and the live
//! SIMT model (memory instructions per second). Criterion prints both as throughput
//! (`thrpt`, elements per second).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gmem_sim::{replay, TlbHierarchy};
use gmem_simt::machine::{mesc_tlbs, SimtMachine, MESC_UNITS};
use gmem_simt::workloads::spec::{Spec, SpecKernel, MAX_OPS};
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
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] = v[0] + 1.0;
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.c + 4 * t)
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
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.out + 4 * t)
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
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.out + 4 * t)
    }
}

fn benches(c: &mut Criterion) {
    // Offline replay of recorded streams through the MESC geometry: ATAX (quick size,
    // nine requests in ten miss the L1 TLB) and BFS on an R-MAT graph (mostly hits).
    let mut g = c.benchmark_group("replay");
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
    let mut g = c.benchmark_group("live");
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
    targets = benches
}
criterion_main!(simt);
