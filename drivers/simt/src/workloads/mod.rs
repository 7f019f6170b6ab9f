//! GPU workloads real address-translation papers use, each verified against a CPU
//! reference.
//!
//! | name | shape | class (MESC paper) |
//! |---|---|---|
//! | `atax`, `bicg`, `mvt`, `gesummv` | Polybench-GPU matrix-vector kernels: one kernel walks rows per thread (a page per lane) | translation-sensitive |
//! | `bfs-uniform`, `bfs-rmat` | Rodinia-style level-synchronous BFS on seeded graphs | translation-sensitive |
//! | `pagerank-uniform`, `pagerank-rmat` | pull PageRank, 3 iterations | (graph) |
//! | `vectoradd`, `2dconv`, `sgemm`, `hotspot` | coalesced streaming / stencil / dense | translation-insensitive |
//! | `kmeans` | Rodinia k-means membership kernel (feature-major), host centroid update, 2 iterations | (not classified) |
//! | `backprop` | Rodinia back-propagation: forward layer (a thread per hidden unit) and weight adjustment (a thread per weight) | (not classified) |
//!
//! Data lives in one gmem address space: each array is allocated with `Gmem::as_alloc`
//! and written by the host CPU on its own; the GPU reaches it through its MMU.
//! Rebuilt, not copied: Rodinia's back-propagation forward layer reduces 16×16 tiles in
//! shared memory; this model has no shared memory or barriers yet, so a thread per
//! hidden unit sums its column.
//!
//! Polybench initialises MVT's `x1`/`x2` with data; here they start at zero (the
//! kernels still read and write them). Matrices are row-major `f32`.

pub mod graph;
mod polybench;
pub use polybench::MatVec;
mod rodinia;
pub mod spec;

use crate::engine::RunStats;
use crate::machine::SimtMachine;
use polybench::polybench;
use rodinia::{backprop, backprop_inputs, hotspot, kmeans, kmeans_size};
use spec::{Affine, Spec, SpecKernel, MAX_OPS};

/// Problem sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// A few seconds per workload (CI).
    Quick,
    /// Between the two: matrices and vectors of a few 2 MiB blocks (the MESC
    /// reproduction's size, where large pages and subregions have room).
    Medium,
    /// The default report size.
    Full,
}

/// The workloads, in report order.
pub const WORKLOADS: &[&str] = &[
    "atax",
    "bicg",
    "mvt",
    "gesummv",
    "bfs-uniform",
    "bfs-rmat",
    "pagerank-uniform",
    "pagerank-rmat",
    "vectoradd",
    "2dconv",
    "sgemm",
    "hotspot",
    "kmeans",
    "backprop",
];

/// Whether the MESC paper counts `name` as translation-sensitive.
pub fn sensitive(name: &str) -> bool {
    matches!(
        name,
        "atax" | "bicg" | "mvt" | "gesummv" | "bfs-uniform" | "bfs-rmat"
    )
}

/// Whether `name` is in one of the two classes the SIMT issue compares (sensitive:
/// ATAX, BICG, MVT, GESUMMV, BFS; insensitive: vector add, 2DCONV, SGEMM, hotspot).
pub fn classified(name: &str) -> bool {
    sensitive(name) || matches!(name, "vectoradd" | "2dconv" | "sgemm" | "hotspot")
}

/// What a workload run produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Workload name.
    pub name: String,
    /// SIMT counters summed over its launches.
    pub stats: RunStats,
    /// The GPU result matched the CPU reference.
    pub verified: bool,
    /// Largest relative error seen (0 for exact workloads).
    pub max_error: f64,
    /// Bytes of data allocated.
    pub footprint: u64,
}

/// Pages of host memory `name` at `size` needs (data plus slack).
pub fn pages_needed(name: &str, size: Size) -> u64 {
    let n = matrix_n(size);
    let bytes = match name {
        "atax" | "bicg" | "mvt" => n * n * 4 + 8 * n * 4,
        "gesummv" => 2 * n * n * 4 + 8 * n * 4,
        "vectoradd" => 3 * vector_n(size) * 4,
        "2dconv" | "hotspot" => 3 * grid_n(size) * grid_n(size) * 4,
        "sgemm" => 3 * sgemm_n(size) * sgemm_n(size) * 4,
        "kmeans" => {
            let (n, f, k) = kmeans_size(size);
            (n * f + k * f + n) * 4
        }
        "backprop" => (3 * (backprop_inputs(size) + 1) * 17 + backprop_inputs(size) + 64) * 4,
        _ => graph::bytes(size),
    };
    bytes.div_ceil(4096) + 256
}

fn matrix_n(size: Size) -> u64 {
    match size {
        Size::Quick => 512,
        Size::Medium => 1024,
        Size::Full => 2048,
    }
}
fn vector_n(size: Size) -> u64 {
    match size {
        Size::Quick => 1 << 18,
        Size::Medium => 1 << 20,
        Size::Full => 1 << 22,
    }
}
fn grid_n(size: Size) -> u64 {
    match size {
        Size::Quick => 256,
        Size::Medium => 768,
        Size::Full => 1024,
    }
}
fn sgemm_n(size: Size) -> u64 {
    match size {
        Size::Quick => 96,
        Size::Medium => 160,
        Size::Full => 256,
    }
}

/// Seeded values in `[-1, 1)` (xorshift).
pub fn values(n: u64, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Run workload `name` at `size` on `m` and verify it.
///
/// # Errors
/// An unknown name, or a description of what failed (allocation, launch).
pub fn run(m: &SimtMachine, name: &str, size: Size) -> Result<Outcome, String> {
    match name {
        "atax" | "bicg" | "mvt" | "gesummv" => polybench(m, name, matrix_n(size)),
        "vectoradd" => vectoradd(m, vector_n(size)),
        "2dconv" => conv2d(m, grid_n(size)),
        "hotspot" => hotspot(m, grid_n(size)),
        "sgemm" => sgemm(m, sgemm_n(size)),
        "kmeans" => kmeans(m, size),
        "backprop" => backprop(m, size),
        "bfs-uniform" | "bfs-rmat" | "pagerank-uniform" | "pagerank-rmat" => {
            graph::run(m, name, size)
        }
        _ => Err(format!(
            "unknown workload {name}; known: {}",
            WORKLOADS.join(", ")
        )),
    }
}

/// Largest relative error of `got` against `want` (denominator at least 1).
pub fn max_rel_error(got: &[f32], want: &[f32]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| ((g - w).abs() / w.abs().max(1.0)) as f64)
        .fold(0.0, f64::max)
        + if got.len() == want.len() {
            0.0
        } else {
            f64::INFINITY
        }
}

const TOLERANCE: f64 = 1e-3;

fn launch<S: Spec>(m: &SimtMachine, spec: S, total: &mut RunStats) -> Result<(), String> {
    let s = m
        .launch(&SpecKernel::new(spec))
        .map_err(|e| e.to_string())?;
    total.plus(&s);
    Ok(())
}

/// `c[i] = a[i] + b[i]`.
struct VecAdd {
    n: u64,
    a: u64,
    b: u64,
    c: u64,
}

impl Spec for VecAdd {
    fn threads(&self) -> u64 {
        self.n
    }
    fn steps(&self) -> u64 {
        1
    }
    fn operands(&self) -> usize {
        2
    }
    fn addr(&self, t: u64, _k: u64, op: usize) -> Option<u64> {
        Some(if op == 0 { self.a } else { self.b } + 4 * t)
    }
    fn affine(&self, _k: u64, op: usize) -> Option<Affine> {
        Some(Affine {
            base: if op == 0 { self.a } else { self.b },
            stride: 4,
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] = v[0] + v[1];
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

fn vectoradd(m: &SimtMachine, n: u64) -> Result<Outcome, String> {
    // Each array initialised on its own (three host passes).
    let a_h = values(n, 11);
    let b_h = values(n, 12);
    let a = m.upload_f32(&a_h)?;
    let b = m.upload_f32(&b_h)?;
    let c = m.upload_f32(&vec![0.0; n as usize])?;
    let mut total = RunStats::default();
    launch(
        m,
        VecAdd {
            n,
            a: a.start.as_u64(),
            b: b.start.as_u64(),
            c: c.start.as_u64(),
        },
        &mut total,
    )?;
    let want: Vec<f32> = a_h.iter().zip(&b_h).map(|(x, y)| x + y).collect();
    let err = max_rel_error(&m.download_f32(c, n as usize)?, &want);
    Ok(Outcome {
        name: "vectoradd".into(),
        stats: total,
        verified: err == 0.0,
        max_error: err,
        footprint: 3 * n * 4,
    })
}

/// Polybench 2DCONV's 3×3 coefficients, row by row.
const CONV: [f32; 9] = [0.2, 0.5, -0.8, -0.3, 0.6, -0.9, 0.4, 0.7, 0.10];

struct Conv2d {
    n: u64,
    a: u64,
    b: u64,
}

impl Spec for Conv2d {
    fn threads(&self) -> u64 {
        self.n * self.n
    }
    fn steps(&self) -> u64 {
        1
    }
    fn operands(&self) -> usize {
        9
    }
    fn addr(&self, t: u64, _k: u64, op: usize) -> Option<u64> {
        let (i, j) = (t / self.n, t % self.n);
        let (di, dj) = (op as u64 / 3, op as u64 % 3);
        Some(self.a + 4 * ((i + di - 1) * self.n + (j + dj - 1)))
    }
    fn affine(&self, _k: u64, op: usize) -> Option<Affine> {
        // `(i + di - 1)·n + j + dj - 1 = t + (di - 1)·n + dj - 1` for the interior
        // threads (those that store): an offset from `4 t`, negative for `di = 0`.
        let (di, dj) = (op as u64 / 3, op as u64 % 3);
        Some(Affine {
            base: (self.a + 4 * (di * self.n + dj)).wrapping_sub(4 * (self.n + 1)),
            stride: 4,
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] = (0..9).fold(0.0, |s, q| s + CONV[q] * v[q]);
    }
    fn out(&self, t: u64) -> Option<u64> {
        let (i, j) = (t / self.n, t % self.n);
        (i > 0 && j > 0 && i + 1 < self.n && j + 1 < self.n).then_some(self.b + 4 * t)
    }
}

fn conv2d(m: &SimtMachine, n: u64) -> Result<Outcome, String> {
    let a_h = values(n * n, 21);
    let a = m.upload_f32(&a_h)?;
    let b = m.upload_f32(&vec![0.0; (n * n) as usize])?;
    let mut total = RunStats::default();
    launch(
        m,
        Conv2d {
            n,
            a: a.start.as_u64(),
            b: b.start.as_u64(),
        },
        &mut total,
    )?;
    let nn = n as usize;
    let mut want = vec![0f32; nn * nn];
    for i in 1..nn - 1 {
        for j in 1..nn - 1 {
            let mut s = 0f32;
            for di in 0..3 {
                for dj in 0..3 {
                    s += CONV[di * 3 + dj] * a_h[(i + di - 1) * nn + j + dj - 1];
                }
            }
            want[i * nn + j] = s;
        }
    }
    let err = max_rel_error(&m.download_f32(b, nn * nn)?, &want);
    Ok(Outcome {
        name: "2dconv".into(),
        stats: total,
        verified: err < TOLERANCE,
        max_error: err,
        footprint: 2 * n * n * 4,
    })
}

/// Naive SGEMM: `C[i][j] = Σ_k A[i][k] B[k][j]`, a thread per element.
struct Sgemm {
    n: u64,
    a: u64,
    b: u64,
    c: u64,
}

impl Spec for Sgemm {
    fn threads(&self) -> u64 {
        self.n * self.n
    }
    fn steps(&self) -> u64 {
        self.n
    }
    fn operands(&self) -> usize {
        2
    }
    fn addr(&self, t: u64, k: u64, op: usize) -> Option<u64> {
        let (i, j) = (t / self.n, t % self.n);
        Some(if op == 0 {
            self.a + 4 * (i * self.n + k)
        } else {
            self.b + 4 * (k * self.n + j)
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0] * v[1];
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

fn sgemm(m: &SimtMachine, n: u64) -> Result<Outcome, String> {
    let a_h = values(n * n, 31);
    let b_h = values(n * n, 32);
    let a = m.upload_f32(&a_h)?;
    let b = m.upload_f32(&b_h)?;
    let c = m.alloc(n * n * 4)?;
    let mut total = RunStats::default();
    launch(
        m,
        Sgemm {
            n,
            a: a.start.as_u64(),
            b: b.start.as_u64(),
            c: c.start.as_u64(),
        },
        &mut total,
    )?;
    let nn = n as usize;
    let mut want = vec![0f32; nn * nn];
    for i in 0..nn {
        for j in 0..nn {
            let mut s = 0f32;
            for k in 0..nn {
                s += a_h[i * nn + k] * b_h[k * nn + j];
            }
            want[i * nn + j] = s;
        }
    }
    let err = max_rel_error(&m.download_f32(c, nn * nn)?, &want);
    Ok(Outcome {
        name: "sgemm".into(),
        stats: total,
        verified: err < TOLERANCE,
        max_error: err,
        footprint: 3 * n * n * 4,
    })
}
