//! The live SIMT model's cost per memory instruction, for a noise-free count under
//! `valgrind --tool=callgrind`: the benchmark's three live kernels (a coalesced stream,
//! a coalesced loop of 64 loads per thread, a strided loop with a page per lane; the
//! same shapes as `benches/simt.rs`, at a quarter of the stream's size) launched
//! `launches` times on warm pages. Run it with 1 and with 3 launches: the difference of
//! the two instruction counts over twice the memory instructions printed is the cost
//! of one memory instruction in a steady launch (setup and first-touch faults cancel).
//!
//! Each run checks every stored result (each is the thread's step count).
//!
//! The kernels declare their addresses affine in the thread id ([`Spec::affine`],
//! [`Spec::out_affine`]); a third argument `plain` runs them without the declaration
//! (the warp calls `addr` and `out` per lane), to compare. The model's results are the
//! same either way.
//!
//! `valgrind --tool=callgrind target/release/examples/live_speed stream 3 [plain]`

use gmem_simt::machine::SimtMachine;
use gmem_simt::workloads::spec::{Affine, Spec, SpecKernel, MAX_OPS};

/// `c[t] = a[t] + 1`, or a 64-step loop over `a` (`stride` 1: coalesced columns,
/// `stride` `n`: a row per lane).
struct Loop {
    n: u64,
    steps: u64,
    /// Thread `t`, step `k` loads `a + 4 (t·row + k·col)`.
    row: u64,
    col: u64,
    a: u64,
    c: u64,
    /// Declare the addresses affine (see the module documentation).
    affine: bool,
}

impl Spec for Loop {
    fn threads(&self) -> u64 {
        self.n
    }
    fn steps(&self) -> u64 {
        self.steps
    }
    fn operands(&self) -> usize {
        1
    }
    fn addr(&self, t: u64, k: u64, _op: usize) -> Option<u64> {
        Some(self.a + 4 * (t * self.row + k * self.col))
    }
    fn affine(&self, k: u64, _op: usize) -> Option<Affine> {
        self.affine.then_some(Affine {
            base: self.a + 4 * k * self.col,
            stride: 4 * self.row,
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.c + 4 * t)
    }
    fn out_affine(&self) -> Option<Affine> {
        self.affine.then_some(Affine {
            base: self.c,
            stride: 4,
        })
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let case = args.next().unwrap_or_else(|| "stream".into());
    let launches: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let affine = match args.next().as_deref() {
        None => true,
        Some("plain") => false,
        Some(other) => {
            eprintln!("unknown option {other}: plain or nothing");
            std::process::exit(2);
        }
    };
    let n = 1u64 << 18;
    let m = SimtMachine::mesc(3 * n / 1024 + 2048).expect("machine");
    let a = m.upload_f32(&vec![1.0; n as usize]).expect("upload");
    let out = m.upload_f32(&vec![0.0; n as usize]).expect("upload");
    let (a, c) = (a.start.as_u64(), out.start.as_u64());
    let out_region = out;
    let spec = match case.as_str() {
        "stream" => Loop {
            n,
            steps: 1,
            row: 1,
            col: 0,
            a,
            c,
            affine,
        },
        "columns" => Loop {
            n: 4096,
            steps: 64,
            row: 1,
            col: 4096,
            a,
            c,
            affine,
        },
        "rows" => Loop {
            n: 256,
            steps: 64,
            row: 1024,
            col: 1,
            a,
            c,
            affine,
        },
        other => {
            eprintln!("unknown case {other}: stream, columns or rows");
            std::process::exit(2);
        }
    };
    let (threads, steps) = (spec.n, spec.steps);
    let k = SpecKernel::new(spec);
    let mut instrs = 0;
    for _ in 0..launches {
        let st = m.launch(&k).expect("launch");
        instrs = st.memory_instructions;
    }
    // Every element of `a` is 1: each thread stores its step count.
    let got = m
        .download_f32(out_region, threads as usize)
        .expect("download");
    let bad = got.iter().filter(|&&v| v != steps as f32).count();
    if bad != 0 {
        eprintln!("{case}: {bad} of {threads} results wrong");
        std::process::exit(1);
    }
    let form = if affine { "affine" } else { "plain" };
    println!("{case}: {instrs} memory instructions per launch, {launches} launches ({form})");
}
