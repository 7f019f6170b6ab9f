//! The experiment's workloads (CODA §6's classes, rebuilt at small sizes): each
//! declares its objects with a placement descriptor, lets the host initialise them,
//! runs its kernels on an [`Exec`] and verifies the result against a CPU-only
//! reference computed here.
//!
//! | class (label) | workloads |
//! |---|---|
//! | block-exclusive | vector add, k-means |
//! | core-exclusive | hotspot (row tiles with one-row halos) |
//! | sharing | SGEMM, ATAX, back-propagation |
//! | graph | BFS, PageRank, SSSP and DC on uniform and R-MAT graphs ([`crate::graphs`]) |
//!
//! The experiment (`gmem-harness reproduce coda`, issue 33) runs the paper's own:
//! k-means, back-propagation, the tiled hotspot ([`crate::hotspot2d`]), Gaussian
//! elimination ([`crate::gaussian`]) and the graphs, and classifies each by CODA
//! §5.2's rule as measured; the labels here are the kernels' intent.
//!
//! A descriptor is what the paper's compiler pass would give: an affine index
//! expression per object ([`AffineIndex`]), "shared" for objects every block reads, or
//! "profile" for input-dependent ones (their pattern is observed on another input).

use crate::config::KernelShape;
use crate::exec::Exec;
use crate::machine::{HbmMachine, MachineError};
use crate::memory::Requester;
use crate::placement::AffineIndex;
use std::boxed::Box;
use std::string::String;
use std::vec::Vec;

/// The paper's workload classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Each block reads and writes data of its own.
    BlockExclusive,
    /// Blocks share a little data with their neighbours (halos).
    CoreExclusive,
    /// Some objects are read by every block.
    Sharing,
    /// Input-dependent (graph) accesses.
    Graph,
}

impl Class {
    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Class::BlockExclusive => "block-exclusive",
            Class::CoreExclusive => "core-exclusive",
            Class::Sharing => "sharing",
            Class::Graph => "graph",
        }
    }
}

/// How the kernel indexes an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Descriptor {
    /// An affine expression over blocks of this many threads.
    Affine(AffineIndex, u64),
    /// Indexed by two kernels, each with its expression (and threads per block): the
    /// object is localized only if both give the same placement, as a compiler pass
    /// that sees every access of the object decides.
    Affine2(AffineIndex, u64, AffineIndex, u64),
    /// Read by every block (or a parameter): fine grain.
    Shared,
    /// Input-dependent: observe it on another input.
    Profile,
}

/// One object of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Object {
    /// Its name.
    pub name: &'static str,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its descriptor.
    pub descriptor: Descriptor,
}

/// A verified workload.
pub trait Workload {
    /// Its name.
    fn name(&self) -> String;
    /// Its class.
    fn class(&self) -> Class;
    /// Its objects, in the order `base` slices are given below.
    fn objects(&self) -> Vec<Object>;
    /// The host writes the inputs (`base[i]` is object `i`'s address).
    ///
    /// # Errors
    /// A machine failure.
    fn init(&self, m: &HbmMachine, base: &[u64]) -> Result<(), MachineError>;
    /// Run the kernels.
    ///
    /// # Errors
    /// A machine failure.
    fn run(&self, x: &mut Exec<'_>, base: &[u64]) -> Result<(), MachineError>;
    /// Whether the result equals the CPU reference.
    ///
    /// # Errors
    /// A machine failure reading the result.
    fn verify(&self, m: &HbmMachine, base: &[u64]) -> Result<bool, MachineError>;
    /// The same workload on another input (for a profile), if it has input-dependent
    /// objects.
    fn other_input(&self) -> Option<Box<dyn Workload>> {
        None
    }
    /// Its thread block, for the occupancy calculator (Eq. 1's blocks per stack; CODA
    /// §4.3.2 takes the first kernel's when several use an object — here one shape
    /// per workload, [`THREADS`] threads unless the workload says).
    fn kernel(&self) -> KernelShape {
        KernelShape::threads(THREADS as u32)
    }
    /// Whether the CODA paper names it (§3 / §5.2: GraphBIG BFS, DC, PR, SSSP, BC,
    /// GC; Rodinia NW, HS, HS3D, backprop, k-means; Parboil SAD; GE), and by what.
    fn paper_name(&self) -> Option<&'static str> {
        None
    }
}

/// Threads per block of the element-wise kernels.
pub const THREADS: u64 = 256;

/// A deterministic generator (xorshift64*).
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A float in `[0, 1)`.
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

pub(crate) fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    (0..n).map(|_| r.f32()).collect()
}

fn rows(block_coeff: u64, loop_coeff: i64, loop_len: u64) -> AffineIndex {
    AffineIndex {
        block_coeff: block_coeff as i64,
        thread_coeff: 1,
        loop_coeff,
        loop_len,
        elem_bytes: 4,
    }
}

const HOST: Requester = Requester::Host;

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-4 * (1.0 + y.abs()))
}

/// `c = a + b` over `n` floats.
pub struct VecAdd {
    /// Elements.
    pub n: u64,
}

impl Workload for VecAdd {
    fn name(&self) -> String {
        "vecadd".into()
    }
    fn class(&self) -> Class {
        Class::BlockExclusive
    }
    fn objects(&self) -> Vec<Object> {
        let d = Descriptor::Affine(rows(THREADS, 0, 1), THREADS);
        ["a", "b", "c"]
            .map(|name| Object {
                name,
                bytes: self.n * 4,
                descriptor: d,
            })
            .to_vec()
    }
    fn init(&self, m: &HbmMachine, base: &[u64]) -> Result<(), MachineError> {
        m.store_f32s(HOST, base[0], &data(self.n as usize, 1))?;
        m.store_f32s(HOST, base[1], &data(self.n as usize, 2))
    }
    fn run(&self, x: &mut Exec<'_>, base: &[u64]) -> Result<(), MachineError> {
        x.launch(self.n.div_ceil(THREADS), |c| {
            let i = c.block() * THREADS;
            let k = THREADS.min(self.n - i) as usize;
            let a = c.load_f32s(base[0] + i * 4, k)?;
            let b = c.load_f32s(base[1] + i * 4, k)?;
            let s: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            c.alu(k as u64); // one FADD per element
            c.store_f32s(base[2] + i * 4, &s)
        })
    }
    fn verify(&self, m: &HbmMachine, base: &[u64]) -> Result<bool, MachineError> {
        let n = self.n as usize;
        let want: Vec<f32> = data(n, 1)
            .iter()
            .zip(data(n, 2))
            .map(|(x, y)| x + y)
            .collect();
        Ok(m.load_f32s(HOST, base[2], n)? == want)
    }
}

/// One k-means assignment step: `n` points of `FEATURES` features to the nearest of
/// `CLUSTERS` centroids.
pub struct KMeans {
    /// Points.
    pub n: u64,
}

const FEATURES: u64 = 8;
const CLUSTERS: u64 = 8;

fn nearest(p: &[f32], cent: &[f32]) -> u32 {
    let mut best = (f32::MAX, 0u32);
    for k in 0..CLUSTERS as usize {
        let c = &cent[k * FEATURES as usize..(k + 1) * FEATURES as usize];
        let d: f32 = p.iter().zip(c).map(|(a, b)| (a - b) * (a - b)).sum();
        if d < best.0 {
            best = (d, k as u32);
        }
    }
    best.1
}

impl Workload for KMeans {
    fn name(&self) -> String {
        "kmeans".into()
    }
    fn paper_name(&self) -> Option<&'static str> {
        Some("k-means")
    }
    fn class(&self) -> Class {
        Class::BlockExclusive
    }
    fn objects(&self) -> Vec<Object> {
        vec_of([
            Object {
                name: "features",
                bytes: self.n * FEATURES * 4,
                descriptor: Descriptor::Affine(
                    AffineIndex {
                        block_coeff: (THREADS * FEATURES) as i64,
                        thread_coeff: FEATURES as i64,
                        loop_coeff: 1,
                        loop_len: FEATURES,
                        elem_bytes: 4,
                    },
                    THREADS,
                ),
            },
            Object {
                name: "centroids",
                bytes: CLUSTERS * FEATURES * 4,
                descriptor: Descriptor::Shared,
            },
            Object {
                name: "membership",
                bytes: self.n * 4,
                descriptor: Descriptor::Affine(rows(THREADS, 0, 1), THREADS),
            },
        ])
    }
    fn init(&self, m: &HbmMachine, base: &[u64]) -> Result<(), MachineError> {
        m.store_f32s(HOST, base[0], &data((self.n * FEATURES) as usize, 3))?;
        m.store_f32s(HOST, base[1], &data((CLUSTERS * FEATURES) as usize, 4))
    }
    fn run(&self, x: &mut Exec<'_>, base: &[u64]) -> Result<(), MachineError> {
        x.launch(self.n.div_ceil(THREADS), |c| {
            let i = c.block() * THREADS;
            let k = THREADS.min(self.n - i);
            let f = FEATURES as usize;
            let pts = c.load_f32s(base[0] + i * FEATURES * 4, (k * FEATURES) as usize)?;
            let cent = c.load_f32s(base[1], (CLUSTERS * FEATURES) as usize)?;
            let out: Vec<u32> = pts.chunks_exact(f).map(|p| nearest(p, &cent)).collect();
            // Per point and centroid (`nearest`): a subtract and a multiply-add per
            // feature, one compare; each thread reads every centroid's features
            // from the block's copy.
            c.alu(k * CLUSTERS * (2 * FEATURES + 1));
            c.reads(k * CLUSTERS * FEATURES);
            c.store_u32s(base[2] + i * 4, &out)
        })
    }
    fn verify(&self, m: &HbmMachine, base: &[u64]) -> Result<bool, MachineError> {
        let pts = data((self.n * FEATURES) as usize, 3);
        let cent = data((CLUSTERS * FEATURES) as usize, 4);
        let want: Vec<u32> = pts
            .chunks_exact(FEATURES as usize)
            .map(|p| nearest(p, &cent))
            .collect();
        Ok(m.load_u32s(HOST, base[2], self.n as usize)? == want)
    }
}

fn vec_of<const N: usize>(a: [Object; N]) -> Vec<Object> {
    a.to_vec()
}

/// Hotspot: `steps` 5-point stencil steps on a `rows × cols` grid; a block owns
/// `rows_per_block` rows and reads one halo row on each side.
pub struct Hotspot {
    /// Rows.
    pub rows: u64,
    /// Columns.
    pub cols: u64,
    /// Rows per block (at least 1 is used).
    pub rows_per_block: u64,
    /// Steps (ping-pong between two grids).
    pub steps: u32,
}

impl Hotspot {
    pub(crate) fn step(&self, t: &[f32], p: &[f32], r0: usize, r1: usize, lo: usize) -> Vec<f32> {
        let cols = self.cols as usize;
        let at = |r: usize, c: usize| t[(r - lo) * cols + c];
        let mut out = Vec::with_capacity((r1 - r0) * cols);
        for r in r0..r1 {
            for c in 0..cols {
                out.push(self.cell(at, r, c, p[(r - r0) * cols + c]));
            }
        }
        out
    }

    /// The stencil at cell `(r, c)`: `at` reads the grid around it (a block's tile with
    /// its halo), `p` is the cell's power. An edge cell stands in for its missing
    /// neighbour. Every decomposition of the grid ([`crate::hotspot2d`] too) computes a
    /// cell with this one expression, so all of them verify bit for bit against
    /// [`Hotspot::step`] over the whole grid.
    pub(crate) fn cell(&self, at: impl Fn(usize, usize) -> f32, r: usize, c: usize, p: f32) -> f32 {
        let (rows, cols) = (self.rows as usize, self.cols as usize);
        let me = at(r, c);
        let n = if r > 0 { at(r - 1, c) } else { me };
        let s = if r + 1 < rows { at(r + 1, c) } else { me };
        let w = if c > 0 { at(r, c - 1) } else { me };
        let e = if c + 1 < cols { at(r, c + 1) } else { me };
        me + 0.1 * (n + s + w + e - 4.0 * me) + 0.05 * p
    }

    /// The stencil's three objects, `temp` and `temp2` (read with the halo: `grid`)
    /// and `power` (read only where a block writes: `own`), whatever the decomposition
    /// that gives their descriptors.
    pub(crate) fn objects_with(&self, grid: Descriptor, own: Descriptor) -> Vec<Object> {
        let bytes = self.rows * self.cols * 4;
        [("temp", grid), ("power", own), ("temp2", grid)]
            .map(|(name, descriptor)| Object {
                name,
                bytes,
                descriptor,
            })
            .to_vec()
    }
}

impl Workload for Hotspot {
    fn name(&self) -> String {
        "hotspot".into()
    }
    fn class(&self) -> Class {
        Class::CoreExclusive
    }
    fn objects(&self) -> Vec<Object> {
        let t = self.cols;
        let rpb = self.rows_per_block.max(1);
        let grid = Descriptor::Affine(rows(rpb * self.cols, self.cols as i64, rpb + 2), t);
        let own = Descriptor::Affine(rows(rpb * self.cols, self.cols as i64, rpb), t);
        self.objects_with(grid, own)
    }
    fn init(&self, m: &HbmMachine, base: &[u64]) -> Result<(), MachineError> {
        let n = (self.rows * self.cols) as usize;
        m.store_f32s(HOST, base[0], &data(n, 5))?;
        m.store_f32s(HOST, base[1], &data(n, 6))
    }
    fn run(&self, x: &mut Exec<'_>, base: &[u64]) -> Result<(), MachineError> {
        let (rows, cols, rpb) = (self.rows, self.cols, self.rows_per_block.max(1));
        for s in 0..self.steps {
            let (from, to) = if s % 2 == 0 {
                (base[0], base[2])
            } else {
                (base[2], base[0])
            };
            x.launch(rows.div_ceil(rpb), |c| {
                let r0 = c.block() * rpb;
                let r1 = (r0 + rpb).min(rows);
                let lo = r0.saturating_sub(1);
                let hi = (r1 + 1).min(rows);
                let t = c.load_f32s(from + lo * cols * 4, ((hi - lo) * cols) as usize)?;
                let p = c.load_f32s(base[1] + r0 * cols * 4, ((r1 - r0) * cols) as usize)?;
                let out = self.step(&t, &p, r0 as usize, r1 as usize, lo as usize);
                // Per cell (`step`): three adds of the neighbours, three multiply-adds
                // (`- 4 me`, `me + 0.1 x`, `+ 0.05 p`); five reads of the tile.
                c.alu(out.len() as u64 * 6);
                c.reads(out.len() as u64 * 5);
                c.store_f32s(to + r0 * cols * 4, &out)
            })?;
        }
        Ok(())
    }
    fn verify(&self, m: &HbmMachine, base: &[u64]) -> Result<bool, MachineError> {
        let n = (self.rows * self.cols) as usize;
        let mut t = data(n, 5);
        let p = data(n, 6);
        for _ in 0..self.steps {
            t = self.step(&t, &p, 0, self.rows as usize, 0);
        }
        let at = if self.steps % 2 == 1 {
            base[2]
        } else {
            base[0]
        };
        Ok(m.load_f32s(HOST, at, n)? == t)
    }
}

/// SGEMM `C = A × B` of `n × n` floats; a block computes `ROWS_PER_BLOCK` rows of C,
/// reading its rows of A and all of B (shared).
pub struct Sgemm {
    /// Matrix order.
    pub n: u64,
}

/// Rows of the output one block of the matrix kernels computes.
pub const ROWS_PER_BLOCK: u64 = 4;

fn matmul_rows(a: &[f32], b: &[f32], n: usize) -> Vec<f32> {
    let mut c = std::vec![0f32; a.len()];
    for (i, row) in a.chunks_exact(n).enumerate() {
        for (k, &x) in row.iter().enumerate() {
            for j in 0..n {
                c[i * n + j] += x * b[k * n + j];
            }
        }
    }
    c
}

impl Workload for Sgemm {
    fn name(&self) -> String {
        "sgemm".into()
    }
    fn class(&self) -> Class {
        Class::Sharing
    }
    fn objects(&self) -> Vec<Object> {
        let n = self.n;
        let own = Descriptor::Affine(rows(ROWS_PER_BLOCK * n, n as i64, ROWS_PER_BLOCK), n);
        vec_of([
            Object {
                name: "A",
                bytes: n * n * 4,
                descriptor: own,
            },
            Object {
                name: "B",
                bytes: n * n * 4,
                descriptor: Descriptor::Shared,
            },
            Object {
                name: "C",
                bytes: n * n * 4,
                descriptor: own,
            },
        ])
    }
    fn init(&self, m: &HbmMachine, base: &[u64]) -> Result<(), MachineError> {
        let nn = (self.n * self.n) as usize;
        m.store_f32s(HOST, base[0], &data(nn, 7))?;
        m.store_f32s(HOST, base[1], &data(nn, 8))
    }
    fn run(&self, x: &mut Exec<'_>, base: &[u64]) -> Result<(), MachineError> {
        let n = self.n;
        x.launch(n.div_ceil(ROWS_PER_BLOCK), |c| {
            let r0 = c.block() * ROWS_PER_BLOCK;
            let k = ROWS_PER_BLOCK.min(n - r0);
            let a = c.load_f32s(base[0] + r0 * n * 4, (k * n) as usize)?;
            let b = c.load_f32s(base[1], (n * n) as usize)?;
            // Per output: n multiply-adds, reading n of its A row and n of B's column
            // from the block's tiles.
            c.alu(k * n * n);
            c.reads(2 * k * n * n);
            c.store_f32s(base[2] + r0 * n * 4, &matmul_rows(&a, &b, n as usize))
        })
    }
    fn verify(&self, m: &HbmMachine, base: &[u64]) -> Result<bool, MachineError> {
        let nn = (self.n * self.n) as usize;
        let want = matmul_rows(&data(nn, 7), &data(nn, 8), self.n as usize);
        Ok(close(&m.load_f32s(HOST, base[2], nn)?, &want))
    }
}

/// ATAX `y = Aᵀ(A x)`: a row kernel (`tmp = A x`, blocks of rows) and a column kernel
/// (`y = Aᵀ tmp`, blocks of columns reading a strip of every row).
pub struct Atax {
    /// Matrix order.
    pub n: u64,
}

fn atax_ref(a: &[f32], x: &[f32], n: usize) -> Vec<f32> {
    let tmp: Vec<f32> = a
        .chunks_exact(n)
        .map(|r| r.iter().zip(x).map(|(p, q)| p * q).sum())
        .collect();
    (0..n)
        .map(|j| (0..n).map(|i| a[i * n + j] * tmp[i]).sum())
        .collect()
}

impl Workload for Atax {
    fn name(&self) -> String {
        "atax".into()
    }
    fn class(&self) -> Class {
        Class::Sharing
    }
    fn objects(&self) -> Vec<Object> {
        let n = self.n;
        let vec_desc = Descriptor::Affine(rows(ROWS_PER_BLOCK, 0, 1), ROWS_PER_BLOCK);
        vec_of([
            Object {
                name: "A",
                bytes: n * n * 4,
                // Rows by the first kernel, column strips of every row by the second.
                descriptor: Descriptor::Affine2(
                    rows(ROWS_PER_BLOCK * n, n as i64, ROWS_PER_BLOCK),
                    n,
                    rows(ROWS_PER_BLOCK, n as i64, n),
                    ROWS_PER_BLOCK,
                ),
            },
            Object {
                name: "x",
                bytes: n * 4,
                descriptor: Descriptor::Shared,
            },
            Object {
                name: "tmp",
                bytes: n * 4,
                descriptor: Descriptor::Shared,
            },
            Object {
                name: "y",
                bytes: n * 4,
                descriptor: vec_desc,
            },
        ])
    }
    fn init(&self, m: &HbmMachine, base: &[u64]) -> Result<(), MachineError> {
        m.store_f32s(HOST, base[0], &data((self.n * self.n) as usize, 9))?;
        m.store_f32s(HOST, base[1], &data(self.n as usize, 10))
    }
    fn run(&self, x: &mut Exec<'_>, base: &[u64]) -> Result<(), MachineError> {
        let n = self.n;
        let blocks = n.div_ceil(ROWS_PER_BLOCK);
        x.launch(blocks, |c| {
            let r0 = c.block() * ROWS_PER_BLOCK;
            let k = ROWS_PER_BLOCK.min(n - r0);
            let a = c.load_f32s(base[0] + r0 * n * 4, (k * n) as usize)?;
            let xv = c.load_f32s(base[1], n as usize)?;
            let t: Vec<f32> = a
                .chunks_exact(n as usize)
                .map(|r| r.iter().zip(&xv).map(|(p, q)| p * q).sum())
                .collect();
            // Per row: n multiply-adds, each thread reading all of x.
            c.alu(k * n);
            c.reads(k * n);
            c.store_f32s(base[2] + r0 * 4, &t)
        })?;
        x.launch(blocks, |c| {
            let c0 = c.block() * ROWS_PER_BLOCK;
            let k = ROWS_PER_BLOCK.min(n - c0) as usize;
            let tmp = c.load_f32s(base[2], n as usize)?;
            let mut y = std::vec![0f32; k];
            for (i, t) in tmp.iter().enumerate() {
                let strip = c.load_f32s(base[0] + (i as u64 * n + c0) * 4, k)?;
                for (yj, a) in y.iter_mut().zip(strip) {
                    *yj += a * t;
                }
            }
            // Per column: n multiply-adds, each thread reading all of tmp.
            c.alu(k as u64 * n);
            c.reads(k as u64 * n);
            c.store_f32s(base[3] + c0 * 4, &y)
        })
    }
    fn verify(&self, m: &HbmMachine, base: &[u64]) -> Result<bool, MachineError> {
        let n = self.n as usize;
        let want = atax_ref(&data(n * n, 9), &data(n, 10), n);
        Ok(close(&m.load_f32s(HOST, base[3], n)?, &want))
    }
}

/// Back-propagation of one layer of `HIDDEN` units over `n` inputs: a forward kernel
/// (each block sums its inputs' weighted contributions per hidden unit), the host
/// reducing the partial sums and computing the error terms, and a weight-adjust
/// kernel (each block its rows of weights, all blocks reading the error terms).
pub struct Backprop {
    /// Input units.
    pub n: u64,
}

const HIDDEN: u64 = 16;

fn partials(input: &[f32], w: &[f32]) -> Vec<f32> {
    let h = HIDDEN as usize;
    let mut s = std::vec![0f32; h];
    for (i, x) in input.iter().enumerate() {
        for j in 0..h {
            s[j] += x * w[i * h + j];
        }
    }
    s
}

fn deltas(sums: &[f32]) -> Vec<f32> {
    sums.iter()
        .map(|s| {
            let o = 1.0 / (1.0 + (-s).exp());
            o * (1.0 - o) * (0.5 - o)
        })
        .collect()
}

impl Workload for Backprop {
    fn name(&self) -> String {
        "backprop".into()
    }
    fn paper_name(&self) -> Option<&'static str> {
        Some("backprop")
    }
    fn class(&self) -> Class {
        Class::Sharing
    }
    fn objects(&self) -> Vec<Object> {
        let blocks = self.n.div_ceil(THREADS);
        vec_of([
            Object {
                name: "input",
                bytes: self.n * 4,
                descriptor: Descriptor::Affine(rows(THREADS, 0, 1), THREADS),
            },
            Object {
                name: "weights",
                bytes: self.n * HIDDEN * 4,
                descriptor: Descriptor::Affine(
                    rows(THREADS * HIDDEN, HIDDEN as i64, HIDDEN),
                    THREADS,
                ),
            },
            Object {
                name: "partial",
                bytes: blocks * HIDDEN * 4,
                descriptor: Descriptor::Affine(rows(HIDDEN, 0, 1), HIDDEN),
            },
            Object {
                name: "delta",
                bytes: HIDDEN * 4,
                descriptor: Descriptor::Shared,
            },
        ])
    }
    fn init(&self, m: &HbmMachine, base: &[u64]) -> Result<(), MachineError> {
        m.store_f32s(HOST, base[0], &data(self.n as usize, 11))?;
        let w: Vec<f32> = data((self.n * HIDDEN) as usize, 12)
            .iter()
            .map(|x| x - 0.5)
            .collect();
        m.store_f32s(HOST, base[1], &w)
    }
    fn run(&self, x: &mut Exec<'_>, base: &[u64]) -> Result<(), MachineError> {
        let n = self.n;
        let blocks = n.div_ceil(THREADS);
        x.launch(blocks, |c| {
            let i = c.block() * THREADS;
            let k = THREADS.min(n - i);
            let input = c.load_f32s(base[0] + i * 4, k as usize)?;
            let w = c.load_f32s(base[1] + i * HIDDEN * 4, (k * HIDDEN) as usize)?;
            // `partials`: a multiply-add per weight, each input read once per unit.
            c.alu(k * HIDDEN);
            c.reads(k * HIDDEN);
            c.store_f32s(base[2] + c.block() * HIDDEN * 4, &partials(&input, &w))
        })?;
        // The host reduces the partial sums (its own work, not a near-data kernel).
        let m = x.machine();
        let p = m.load_f32s(HOST, base[2], (blocks * HIDDEN) as usize)?;
        let mut sums = std::vec![0f32; HIDDEN as usize];
        for b in p.chunks_exact(HIDDEN as usize) {
            for (s, v) in sums.iter_mut().zip(b) {
                *s += v;
            }
        }
        m.store_f32s(HOST, base[3], &deltas(&sums))?;
        x.launch(blocks, |c| {
            let i = c.block() * THREADS;
            let k = THREADS.min(n - i);
            let d = c.load_f32s(base[3], HIDDEN as usize)?;
            let input = c.load_f32s(base[0] + i * 4, k as usize)?;
            let mut w = c.load_f32s(base[1] + i * HIDDEN * 4, (k * HIDDEN) as usize)?;
            adjust(&mut w, &input, &d);
            // `adjust`: a multiply and a multiply-add per weight, reading the unit's
            // delta and the row's input.
            c.alu(2 * k * HIDDEN);
            c.reads(2 * k * HIDDEN);
            c.store_f32s(base[1] + i * HIDDEN * 4, &w)
        })
    }
    fn verify(&self, m: &HbmMachine, base: &[u64]) -> Result<bool, MachineError> {
        let input = data(self.n as usize, 11);
        let mut w: Vec<f32> = data((self.n * HIDDEN) as usize, 12)
            .iter()
            .map(|x| x - 0.5)
            .collect();
        let mut sums = std::vec![0f32; HIDDEN as usize];
        for (xs, ws) in input
            .chunks(THREADS as usize)
            .zip(w.chunks((THREADS * HIDDEN) as usize))
        {
            for (s, v) in sums.iter_mut().zip(partials(xs, ws)) {
                *s += v;
            }
        }
        adjust(&mut w, &input, &deltas(&sums));
        Ok(m.load_f32s(HOST, base[1], w.len())? == w)
    }
}

fn adjust(w: &mut [f32], input: &[f32], d: &[f32]) {
    for (row, x) in w.chunks_exact_mut(HIDDEN as usize).zip(input) {
        for (wj, dj) in row.iter_mut().zip(d) {
            *wj += 0.3 * dj * x;
        }
    }
}
