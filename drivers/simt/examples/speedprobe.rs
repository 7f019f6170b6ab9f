// Temporary probe (not committed): CPU-time speed of replay and live.
use gmem_sim::{replay, TlbHierarchy};
use gmem_simt::machine::{mesc_tlbs, SimtMachine, MESC_UNITS};
use gmem_simt::workloads::spec::{Spec, MAX_OPS};
use gmem_simt::workloads::{pages_needed, run, Size};
fn cpu_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    s.split_whitespace().next().unwrap().parse().unwrap()
}
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

fn launch_probe() {
    use gmem_simt::workloads::spec::SpecKernel;
    let n = 1u64 << 20;
    let m = SimtMachine::mesc(3 * n / 1024 + 2048).unwrap();
    let a = m.upload_f32(&vec![1.0; n as usize]).unwrap();
    let out = m.upload_f32(&vec![0.0; n as usize]).unwrap();
    let stream = SpecKernel::new(Stream {
        n,
        a: a.start.as_u64(),
        c: out.start.as_u64(),
    });
    let rows = SpecKernel::new(Rows {
        n: 1024,
        a: a.start.as_u64(),
        out: out.start.as_u64(),
    });
    for _ in 0..2 {
        let c0 = cpu_ns();
        let s = m.launch(&stream).unwrap();
        let ns = cpu_ns() - c0;
        println!(
            "stream: {:.2} M mem instr/s cpu",
            s.memory_instructions as f64 / ns as f64 * 1e3
        );
        let c0 = cpu_ns();
        let s = m.launch(&rows).unwrap();
        let ns = cpu_ns() - c0;
        println!(
            "rows: {:.3} M mem instr/s cpu, {:.2} M translations/s",
            s.memory_instructions as f64 / ns as f64 * 1e3,
            s.translations as f64 / ns as f64 * 1e3
        );
    }
}
fn main() {
    if std::env::args().nth(1).as_deref() == Some("launch") {
        return launch_probe();
    }
    let which = std::env::args().nth(1).unwrap_or("replay".into());
    let name = std::env::args().nth(2).unwrap_or("atax".into());
    let m = SimtMachine::mesc(pages_needed(&name, Size::Quick)).unwrap();
    if which != "live" {
        m.start_recording();
    }
    let c0 = cpu_ns();
    let o = run(&m, &name, Size::Quick).unwrap();
    let live_ns = cpu_ns() - c0;
    assert!(o.verified);
    let log = m.take_recording();
    if which == "live" {
        println!(
            "live {name}: {} mem instr, {:.2} M/s cpu",
            o.stats.memory_instructions,
            o.stats.memory_instructions as f64 / live_ns as f64 * 1e3
        );
        return;
    }
    let n = log.translations();
    let reps = 20;
    let c0 = cpu_ns();
    for _ in 0..reps {
        let mut caches = TlbHierarchy::new(mesc_tlbs(MESC_UNITS)).unwrap();
        std::hint::black_box(replay(&mut caches, &log, 4));
    }
    let ns = cpu_ns() - c0;
    println!(
        "replay {name}: {n} translations, {:.2} M/s cpu",
        (n * reps) as f64 / ns as f64 * 1e3
    );
}
