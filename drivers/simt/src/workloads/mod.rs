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
pub mod spec;

use crate::engine::RunStats;
use crate::machine::SimtMachine;
use spec::{Spec, SpecKernel, MAX_OPS};

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

/// `out[t] = Σ_k a[row(t,k)] * v[k]`-style matrix-vector product.
struct MatVec {
    n: u64,
    /// The matrix.
    a: u64,
    /// Walk `A` by rows per thread (`A[t][k]`, strided across lanes) or by columns
    /// (`A[k][t]`, coalesced).
    rows: bool,
    v: u64,
    out: u64,
}

impl Spec for MatVec {
    fn threads(&self) -> u64 {
        self.n
    }
    fn steps(&self) -> u64 {
        self.n
    }
    fn operands(&self) -> usize {
        2
    }
    fn addr(&self, t: u64, k: u64, op: usize) -> Option<u64> {
        Some(match op {
            0 if self.rows => self.a + 4 * (t * self.n + k),
            0 => self.a + 4 * (k * self.n + t),
            _ => self.v + 4 * k,
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0] * v[1];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.out + 4 * t)
    }
}

/// GESUMMV: `y[i] = α Σ A[i][j] x[j] + β Σ B[i][j] x[j]`.
struct Gesummv {
    n: u64,
    a: u64,
    b: u64,
    x: u64,
    y: u64,
}

const ALPHA: f32 = 1.5;
const BETA: f32 = 1.2;

impl Spec for Gesummv {
    fn threads(&self) -> u64 {
        self.n
    }
    fn steps(&self) -> u64 {
        self.n
    }
    fn operands(&self) -> usize {
        3
    }
    fn addr(&self, t: u64, k: u64, op: usize) -> Option<u64> {
        Some(match op {
            0 => self.a + 4 * (t * self.n + k),
            1 => self.b + 4 * (t * self.n + k),
            _ => self.x + 4 * k,
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0] * v[2];
        acc[1] += v[1] * v[2];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.y + 4 * t)
    }
    fn result(&self, _t: u64, acc: &[f32; 4]) -> f32 {
        ALPHA * acc[0] + BETA * acc[1]
    }
}

fn matvec_ref(a: &[f32], n: usize, rows: bool, v: &[f32]) -> Vec<f32> {
    (0..n)
        .map(|t| {
            let mut s = 0f32;
            for k in 0..n {
                let e = if rows { a[t * n + k] } else { a[k * n + t] };
                s += e * v[k];
            }
            s
        })
        .collect()
}

fn polybench(m: &SimtMachine, name: &str, n: u64) -> Result<Outcome, String> {
    let nn = n as usize;
    let a_h = values(n * n, 1);
    let x_h = values(n, 2);
    let y_h = values(n, 3);
    let a = m.upload_f32(&a_h)?;
    let x = m.upload_f32(&x_h)?;
    let mut total = RunStats::default();
    let mut footprint = (n * n + n) * 4;
    let (got, want) = match name {
        "atax" => {
            // tmp = A x (rows per thread); y = Aᵀ tmp (columns per thread).
            let tmp = m.alloc(n * 4)?;
            let y = m.alloc(n * 4)?;
            footprint += 2 * n * 4;
            let rows = |v, out| MatVec {
                n,
                a: a.start.as_u64(),
                rows: true,
                v,
                out,
            };
            launch(m, rows(x.start.as_u64(), tmp.start.as_u64()), &mut total)?;
            launch(
                m,
                MatVec {
                    n,
                    a: a.start.as_u64(),
                    rows: false,
                    v: tmp.start.as_u64(),
                    out: y.start.as_u64(),
                },
                &mut total,
            )?;
            let t = matvec_ref(&a_h, nn, true, &x_h);
            (m.download_f32(y, nn)?, matvec_ref(&a_h, nn, false, &t))
        }
        "bicg" => {
            // s = Aᵀ r (columns per thread); q = A p (rows per thread).
            let p = m.upload_f32(&y_h)?;
            let s = m.alloc(n * 4)?;
            let q = m.alloc(n * 4)?;
            footprint += 3 * n * 4;
            launch(
                m,
                MatVec {
                    n,
                    a: a.start.as_u64(),
                    rows: false,
                    v: x.start.as_u64(),
                    out: s.start.as_u64(),
                },
                &mut total,
            )?;
            launch(
                m,
                MatVec {
                    n,
                    a: a.start.as_u64(),
                    rows: true,
                    v: p.start.as_u64(),
                    out: q.start.as_u64(),
                },
                &mut total,
            )?;
            let mut got = m.download_f32(s, nn)?;
            got.extend(m.download_f32(q, nn)?);
            let mut want = matvec_ref(&a_h, nn, false, &x_h);
            want.extend(matvec_ref(&a_h, nn, true, &y_h));
            (got, want)
        }
        "mvt" => {
            // x1 = A y1 (rows per thread); x2 = Aᵀ y2 (columns per thread).
            let y2 = m.upload_f32(&y_h)?;
            let x1 = m.alloc(n * 4)?;
            let x2 = m.alloc(n * 4)?;
            footprint += 3 * n * 4;
            launch(
                m,
                MatVec {
                    n,
                    a: a.start.as_u64(),
                    rows: true,
                    v: x.start.as_u64(),
                    out: x1.start.as_u64(),
                },
                &mut total,
            )?;
            launch(
                m,
                MatVec {
                    n,
                    a: a.start.as_u64(),
                    rows: false,
                    v: y2.start.as_u64(),
                    out: x2.start.as_u64(),
                },
                &mut total,
            )?;
            let mut got = m.download_f32(x1, nn)?;
            got.extend(m.download_f32(x2, nn)?);
            let mut want = matvec_ref(&a_h, nn, true, &x_h);
            want.extend(matvec_ref(&a_h, nn, false, &y_h));
            (got, want)
        }
        _ => {
            let b_h = values(n * n, 4);
            let b = m.upload_f32(&b_h)?;
            let y = m.alloc(n * 4)?;
            footprint += (n * n + n) * 4;
            launch(
                m,
                Gesummv {
                    n,
                    a: a.start.as_u64(),
                    b: b.start.as_u64(),
                    x: x.start.as_u64(),
                    y: y.start.as_u64(),
                },
                &mut total,
            )?;
            let ax = matvec_ref(&a_h, nn, true, &x_h);
            let bx = matvec_ref(&b_h, nn, true, &x_h);
            let want = ax
                .iter()
                .zip(&bx)
                .map(|(p, q)| ALPHA * p + BETA * q)
                .collect();
            (m.download_f32(y, nn)?, want)
        }
    };
    let err = max_rel_error(&got, &want);
    Ok(Outcome {
        name: name.into(),
        stats: total,
        verified: err < TOLERANCE,
        max_error: err,
        footprint,
    })
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
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] = v[0] + v[1];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.c + 4 * t)
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

/// Rodinia hotspot, one time step per launch: each cell moves toward its neighbours'
/// temperatures and gains its power (edges clamp to the cell itself).
struct Hotspot {
    n: u64,
    temp: u64,
    power: u64,
    out: u64,
}

const HS_CAP: f32 = 0.5;
const HS_RX: f32 = 0.25;
const HS_RY: f32 = 0.25;
const HS_RZ: f32 = 0.05;
const HS_AMB: f32 = 0.3;

fn hotspot_cell(c: f32, n: f32, s: f32, w: f32, e: f32, p: f32) -> f32 {
    c + HS_CAP * (p + (n + s - 2.0 * c) * HS_RY + (e + w - 2.0 * c) * HS_RX + (HS_AMB - c) * HS_RZ)
}

impl Spec for Hotspot {
    fn threads(&self) -> u64 {
        self.n * self.n
    }
    fn steps(&self) -> u64 {
        1
    }
    fn operands(&self) -> usize {
        6
    }
    fn addr(&self, t: u64, _k: u64, op: usize) -> Option<u64> {
        let (i, j, n) = (t / self.n, t % self.n, self.n);
        let cell = |i: u64, j: u64| self.temp + 4 * (i * n + j);
        Some(match op {
            0 => cell(i, j),
            1 => cell(i.saturating_sub(1), j),
            2 => cell((i + 1).min(n - 1), j),
            3 => cell(i, j.saturating_sub(1)),
            4 => cell(i, (j + 1).min(n - 1)),
            _ => self.power + 4 * t,
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] = hotspot_cell(v[0], v[1], v[2], v[3], v[4], v[5]);
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.out + 4 * t)
    }
    fn cycles(&self) -> u32 {
        12
    }
}

fn hotspot(m: &SimtMachine, n: u64) -> Result<Outcome, String> {
    let t_h: Vec<f32> = values(n * n, 41).iter().map(|v| v.abs()).collect();
    let p_h: Vec<f32> = values(n * n, 42).iter().map(|v| v.abs() * 0.1).collect();
    let t0 = m.upload_f32(&t_h)?;
    let p = m.upload_f32(&p_h)?;
    let t1 = m.alloc(n * n * 4)?;
    let mut total = RunStats::default();
    let steps = 2;
    let (mut src, mut dst) = (t0, t1);
    for _ in 0..steps {
        launch(
            m,
            Hotspot {
                n,
                temp: src.start.as_u64(),
                power: p.start.as_u64(),
                out: dst.start.as_u64(),
            },
            &mut total,
        )?;
        std::mem::swap(&mut src, &mut dst);
    }
    let nn = n as usize;
    let mut cur = t_h;
    for _ in 0..steps {
        let mut next = vec![0f32; nn * nn];
        for i in 0..nn {
            for j in 0..nn {
                let at = |a: usize, b: usize| cur[a * nn + b];
                next[i * nn + j] = hotspot_cell(
                    at(i, j),
                    at(i.saturating_sub(1), j),
                    at((i + 1).min(nn - 1), j),
                    at(i, j.saturating_sub(1)),
                    at(i, (j + 1).min(nn - 1)),
                    p_h[i * nn + j],
                );
            }
        }
        cur = next;
    }
    let err = max_rel_error(&m.download_f32(src, nn * nn)?, &cur);
    Ok(Outcome {
        name: "hotspot".into(),
        stats: total,
        verified: err < TOLERANCE,
        max_error: err,
        footprint: 3 * n * n * 4,
    })
}

/// Rodinia k-means' membership kernel: a thread per point finds its nearest centroid
/// (features stored feature-major, `feat[f][p]`, so lanes read consecutive words).
struct KmeansAssign {
    n: u64,
    f: u64,
    k: u64,
    feat: u64,
    clusters: u64,
    out: u64,
}

impl Spec for KmeansAssign {
    fn threads(&self) -> u64 {
        self.n
    }
    fn steps(&self) -> u64 {
        self.k * self.f
    }
    fn operands(&self) -> usize {
        2
    }
    fn addr(&self, t: u64, s: u64, op: usize) -> Option<u64> {
        let (c, f) = (s / self.f, s % self.f);
        Some(if op == 0 {
            self.feat + 4 * (f * self.n + t)
        } else {
            self.clusters + 4 * (c * self.f + f)
        })
    }
    fn fold(&self, _t: u64, s: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        let (c, f) = (s / self.f, s % self.f);
        let d = v[0] - v[1];
        acc[0] += d * d;
        if f + 1 == self.f {
            if c == 0 || acc[0] < acc[1] {
                acc[1] = acc[0];
                acc[2] = c as f32;
            }
            acc[0] = 0.0;
        }
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.out + 4 * t)
    }
    fn result(&self, _t: u64, acc: &[f32; 4]) -> f32 {
        acc[2]
    }
}

fn kmeans_size(size: Size) -> (u64, u64, u64) {
    match size {
        Size::Quick => (8192, 8, 5),
        Size::Medium => (1 << 15, 8, 5),
        Size::Full => (1 << 17, 16, 8),
    }
}

fn kmeans(m: &SimtMachine, size: Size) -> Result<Outcome, String> {
    let (n, f, k) = kmeans_size(size);
    let (nu, fu, ku) = (n as usize, f as usize, k as usize);
    let feat_h = values(n * f, 51);
    let feat = m.upload_f32(&feat_h)?;
    let mut cent: Vec<f32> = (0..ku * fu)
        .map(|i| feat_h[(i % fu) * nu + i / fu])
        .collect();
    let clusters = m.upload_f32(&cent)?;
    let member = m.alloc(n * 4)?;
    let mut total = RunStats::default();
    let mut verified = true;
    for _ in 0..2 {
        m.store_words(
            clusters,
            &cent.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        )?;
        launch(
            m,
            KmeansAssign {
                n,
                f,
                k,
                feat: feat.start.as_u64(),
                clusters: clusters.start.as_u64(),
                out: member.start.as_u64(),
            },
            &mut total,
        )?;
        let got: Vec<usize> = m
            .download_f32(member, nu)?
            .iter()
            .map(|&x| x as usize)
            .collect();
        // CPU reference: the same nearest-centroid rule, feature by feature.
        let want: Vec<usize> = (0..nu)
            .map(|p| {
                let (mut best, mut best_d) = (0, 0f32);
                for c in 0..ku {
                    let mut d = 0f32;
                    for ff in 0..fu {
                        let x = feat_h[ff * nu + p] - cent[c * fu + ff];
                        d += x * x;
                    }
                    if c == 0 || d < best_d {
                        best = c;
                        best_d = d;
                    }
                }
                best
            })
            .collect();
        verified &= got == want;
        // Host update step (as Rodinia does): new centroids from the memberships.
        let mut sum = vec![0f32; ku * fu];
        let mut cnt = vec![0u32; ku];
        for p in 0..nu {
            cnt[want[p]] += 1;
            for ff in 0..fu {
                sum[want[p] * fu + ff] += feat_h[ff * nu + p];
            }
        }
        for c in 0..ku {
            if cnt[c] > 0 {
                for ff in 0..fu {
                    cent[c * fu + ff] = sum[c * fu + ff] / cnt[c] as f32;
                }
            }
        }
    }
    Ok(Outcome {
        name: "kmeans".into(),
        stats: total,
        verified,
        max_error: if verified { 0.0 } else { 1.0 },
        footprint: (n * f + k * f + n) * 4,
    })
}

/// Rodinia back-propagation's forward layer, a thread per hidden unit:
/// `hidden[j] = sigmoid(Σ_i input[i] · w[i][j])` over `w` of `(n_in + 1) × (hid + 1)`.
struct BpForward {
    n_in: u64,
    hid: u64,
    input: u64,
    w: u64,
    out: u64,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl Spec for BpForward {
    fn threads(&self) -> u64 {
        self.hid + 1
    }
    fn steps(&self) -> u64 {
        self.n_in + 1
    }
    fn operands(&self) -> usize {
        2
    }
    fn addr(&self, t: u64, i: u64, op: usize) -> Option<u64> {
        Some(if op == 0 {
            self.input + 4 * i
        } else {
            self.w + 4 * (i * (self.hid + 1) + t)
        })
    }
    fn fold(&self, _t: u64, _i: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0] * v[1];
    }
    fn out(&self, t: u64) -> Option<u64> {
        (t >= 1).then_some(self.out + 4 * t)
    }
    fn result(&self, _t: u64, acc: &[f32; 4]) -> f32 {
        sigmoid(acc[0])
    }
}

/// Rodinia back-propagation's weight adjustment, a thread per weight:
/// `w[i][j] += η · delta[j] · input[i] + μ · oldw[i][j]`.
struct BpAdjust {
    n_in: u64,
    hid: u64,
    delta: u64,
    input: u64,
    w: u64,
    oldw: u64,
}

const ETA: f32 = 0.3;
const MOMENTUM: f32 = 0.3;

impl Spec for BpAdjust {
    fn threads(&self) -> u64 {
        (self.n_in + 1) * (self.hid + 1)
    }
    fn steps(&self) -> u64 {
        1
    }
    fn operands(&self) -> usize {
        4
    }
    fn addr(&self, t: u64, _k: u64, op: usize) -> Option<u64> {
        let (i, j) = (t / (self.hid + 1), t % (self.hid + 1));
        Some(match op {
            0 => self.delta + 4 * j,
            1 => self.input + 4 * i,
            2 => self.oldw + 4 * t,
            _ => self.w + 4 * t,
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] = v[3] + (ETA * v[0] * v[1] + MOMENTUM * v[2]);
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.w + 4 * t)
    }
}

fn backprop_inputs(size: Size) -> u64 {
    match size {
        Size::Quick => 4096,
        Size::Medium => 16384,
        Size::Full => 65536,
    }
}

fn backprop(m: &SimtMachine, size: Size) -> Result<Outcome, String> {
    let (n_in, hid) = (backprop_inputs(size), 16u64);
    let cols = (hid + 1) as usize;
    let input_h: Vec<f32> = {
        let mut v = values(n_in + 1, 61);
        v[0] = 1.0; // bias unit
        v
    };
    let w_h = values((n_in + 1) * (hid + 1), 62);
    let oldw_h = values((n_in + 1) * (hid + 1), 63);
    let delta_h = values(hid + 1, 64);
    let input = m.upload_f32(&input_h)?;
    let w = m.upload_f32(&w_h)?;
    let oldw = m.upload_f32(&oldw_h)?;
    let delta = m.upload_f32(&delta_h)?;
    let hidden = m.upload_f32(&vec![0.0; cols])?;
    let mut total = RunStats::default();
    let mut k = SpecKernel::new(BpForward {
        n_in,
        hid,
        input: input.start.as_u64(),
        w: w.start.as_u64(),
        out: hidden.start.as_u64(),
    });
    k.threads_per_block = 32;
    total.plus(&m.launch(&k).map_err(|e| e.to_string())?);
    launch(
        m,
        BpAdjust {
            n_in,
            hid,
            delta: delta.start.as_u64(),
            input: input.start.as_u64(),
            w: w.start.as_u64(),
            oldw: oldw.start.as_u64(),
        },
        &mut total,
    )?;
    let want_hidden: Vec<f32> = (0..cols)
        .map(|j| {
            if j == 0 {
                return 0.0;
            }
            let mut s = 0f32;
            for i in 0..=n_in as usize {
                s += input_h[i] * w_h[i * cols + j];
            }
            sigmoid(s)
        })
        .collect();
    let want_w: Vec<f32> = (0..w_h.len())
        .map(|t| {
            let (i, j) = (t / cols, t % cols);
            w_h[t] + (ETA * delta_h[j] * input_h[i] + MOMENTUM * oldw_h[t])
        })
        .collect();
    let mut got = m.download_f32(hidden, cols)?;
    got.extend(m.download_f32(w, w_h.len())?);
    let mut want = want_hidden;
    want.extend(want_w);
    let err = max_rel_error(&got, &want);
    Ok(Outcome {
        name: "backprop".into(),
        stats: total,
        verified: err < TOLERANCE,
        max_error: err,
        footprint: (3 * (n_in + 1) * (hid + 1) + n_in + 2 * hid + 3) * 4,
    })
}
