//! The six workloads of `gmem-harness reproduce adsm`, written once against
//! [`Program`] (so the ADSM runtime and the explicit-copy baseline run the same code;
//! the baseline's copies are the `copy_in` / `copy_out` lines), each checked bit for
//! bit against a CPU-only reference computed in the same order.
//!
//! | workload | shape |
//! |---|---|
//! | vector add | the CPU produces two vectors, one call, the CPU reads the sum |
//! | stencil | the CPU produces a grid, many calls (Jacobi sweeps), the CPU reads the result |
//! | back-propagation | a forward call, the CPU reads 16 hidden units and writes 16 deltas, a weight-update call, the CPU reads the weights |
//! | file ingest | the CPU fills a large input in 64 KiB chunks (reading a file), one call, a small output |
//! | sparse readback | one call writes a large output, the CPU reads 1% of its pages |
//! | ATAX | `y = Aᵀ(A x)`: two calls, the intermediate never leaves the device |

use crate::explicit::Explicit;
use crate::machine::{AdsmError, Machine, MachineConfig};
use crate::model::TimeModel;
use crate::program::{load_f32s, store_f32s, Buf, Measured, Program};
use crate::runtime::{Adsm, Protocol};
use gmem_core::{VirtAddr, PAGE_SIZE};
use gmem_sim::{AccessError, Grid, WorkItem};

/// f32 elements per page.
const CHUNK: u64 = PAGE_SIZE / 4;
/// Work-group size of every launch.
const GROUP: u64 = 64;

/// A workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Vector add.
    VecAdd,
    /// Iterative 1-D Jacobi stencil.
    Stencil,
    /// One training step of a two-layer network.
    Backprop,
    /// File ingest.
    Ingest,
    /// Sparse readback (1% of the pages).
    Sparse,
    /// ATAX.
    Atax,
}

impl Workload {
    /// Every workload, in report order.
    pub const ALL: [Workload; 6] = [
        Workload::VecAdd,
        Workload::Stencil,
        Workload::Backprop,
        Workload::Ingest,
        Workload::Sparse,
        Workload::Atax,
    ];

    /// Its name in tables.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::VecAdd => "vecadd",
            Workload::Stencil => "stencil",
            Workload::Backprop => "backprop",
            Workload::Ingest => "ingest",
            Workload::Sparse => "sparse",
            Workload::Atax => "atax",
        }
    }

    /// Whether the program makes a single kernel call.
    pub fn single_call(&self) -> bool {
        matches!(self, Workload::VecAdd | Workload::Ingest | Workload::Sparse)
    }
}

/// Problem sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// Vector add: elements per vector.
    pub vec_elems: u64,
    /// Stencil: grid points.
    pub stencil_elems: u64,
    /// Stencil: sweeps (calls).
    pub stencil_iters: u32,
    /// Back-propagation: input units (16 hidden units).
    pub bp_inputs: u64,
    /// File ingest: input bytes.
    pub ingest_bytes: u64,
    /// Sparse readback: output bytes.
    pub sparse_bytes: u64,
    /// ATAX: rows.
    pub atax_m: u64,
    /// ATAX: columns.
    pub atax_n: u64,
}

impl Sizes {
    /// CI sizes (seconds in a debug build).
    pub fn quick() -> Sizes {
        Sizes {
            vec_elems: 512 << 10,
            stencil_elems: 256 << 10,
            stencil_iters: 8,
            bp_inputs: 32 << 10,
            ingest_bytes: 8 << 20,
            sparse_bytes: 16 << 20,
            atax_m: 512,
            atax_n: 1024,
        }
    }

    /// Report sizes.
    pub fn full() -> Sizes {
        Sizes {
            vec_elems: 2 << 20,
            stencil_elems: 1 << 20,
            stencil_iters: 16,
            bp_inputs: 128 << 10,
            ingest_bytes: 32 << 20,
            sparse_bytes: 64 << 20,
            atax_m: 1024,
            atax_n: 2048,
        }
    }

    /// Tiny sizes for unit tests.
    pub fn tiny() -> Sizes {
        Sizes {
            vec_elems: 40 << 10,
            stencil_elems: 20 << 10,
            stencil_iters: 4,
            bp_inputs: 8 << 10,
            ingest_bytes: 1 << 20,
            sparse_bytes: 2 << 20,
            atax_m: 96,
            atax_n: 2048,
        }
    }
}

fn kload(w: &WorkItem<'_>, va: VirtAddr, n: u64) -> Result<Vec<f32>, AccessError> {
    let mut b = vec![0u8; (n * 4) as usize];
    w.load(va, &mut b)?;
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn kstore(w: &WorkItem<'_>, va: VirtAddr, v: &[f32]) -> Result<(), AccessError> {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    w.store(va, &b)
}

fn at(base: VirtAddr, elem: u64) -> VirtAddr {
    VirtAddr::new(base.as_u64() + elem * 4)
}

/// Store `v` into `buf` from element 0 in chunks of `chunk` elements (the CPU
/// producing it piece by piece).
fn produce(p: &mut dyn Program, buf: Buf, v: &[f32], chunk: usize) -> Result<(), AdsmError> {
    for (k, c) in v.chunks(chunk).enumerate() {
        store_f32s(p, at(buf.host, (k * chunk) as u64), c)?;
    }
    Ok(())
}

fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Run workload `w` with sizes `s` on `p`; the measured window starts after the
/// allocations. Returns whether the result matched the CPU-only reference bit for bit.
///
/// # Errors
/// The first [`AdsmError`] a call of `p` returned (allocation, access, transfer or
/// kernel); the workload stops there.
pub fn run(w: Workload, p: &mut dyn Program, s: &Sizes) -> Result<bool, AdsmError> {
    match w {
        Workload::VecAdd => vecadd(p, s.vec_elems),
        Workload::Stencil => stencil(p, s.stencil_elems, s.stencil_iters),
        Workload::Backprop => backprop(p, s.bp_inputs),
        Workload::Ingest => ingest(p, s.ingest_bytes),
        Workload::Sparse => sparse(p, s.sparse_bytes),
        Workload::Atax => atax(p, s.atax_m, s.atax_n),
    }
}

/// Vector add of `n` elements.
///
/// # Errors
/// The first [`AdsmError`] a call of `p` returned (allocation, access, transfer or
/// kernel); the workload stops there.
pub fn vecadd(p: &mut dyn Program, n: u64) -> Result<bool, AdsmError> {
    let (a, b, c) = (p.alloc(n * 4)?, p.alloc(n * 4)?, p.alloc(n * 4)?);
    p.begin();
    let av: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.5 + 1.0).collect();
    let bv: Vec<f32> = (0..n).map(|i| ((i * 7) % 1000) as f32 * 0.25).collect();
    produce(p, a, &av, CHUNK as usize)?;
    produce(p, b, &bv, CHUNK as usize)?;
    p.copy_in(a)?;
    p.copy_in(b)?;
    let chunks = n.div_ceil(CHUNK);
    p.call(Grid::covering(chunks, GROUP), &mut |w| {
        if w.global >= chunks {
            return Ok(());
        }
        let lo = w.global * CHUNK;
        let k = CHUNK.min(n - lo);
        let x = kload(w, at(a.dev, lo), k)?;
        let y = kload(w, at(b.dev, lo), k)?;
        let z: Vec<f32> = x.iter().zip(&y).map(|(x, y)| x + y).collect();
        kstore(w, at(c.dev, lo), &z)
    })?;
    p.sync()?;
    p.copy_out(c)?;
    let got = load_f32s(p, c.host, n as usize)?;
    let want: Vec<f32> = av.iter().zip(&bv).map(|(x, y)| x + y).collect();
    Ok(same(&got, &want))
}

/// Points `[lo, hi)` of one sweep over `n` points, from `src` holding points
/// `[from, from + src.len())`.
fn sweep(src: &[f32], from: usize, n: usize, lo: usize, hi: usize) -> Vec<f32> {
    let g = |i: usize| src[i - from];
    (lo..hi)
        .map(|i| {
            if i == 0 || i == n - 1 {
                g(i)
            } else {
                (g(i - 1) + g(i) + g(i + 1)) * (1.0 / 3.0)
            }
        })
        .collect()
}

/// `iters` Jacobi sweeps over `n` points, one call each.
///
/// # Errors
/// The first [`AdsmError`] a call of `p` returned (allocation, access, transfer or
/// kernel); the workload stops there.
pub fn stencil(p: &mut dyn Program, n: u64, iters: u32) -> Result<bool, AdsmError> {
    let (u, v) = (p.alloc(n * 4)?, p.alloc(n * 4)?);
    p.begin();
    let init: Vec<f32> = (0..n).map(|i| (i % 97) as f32).collect();
    produce(p, u, &init, CHUNK as usize)?;
    p.copy_in(u)?;
    let chunks = n.div_ceil(CHUNK);
    for k in 0..iters {
        let (src, dst) = if k % 2 == 0 { (u, v) } else { (v, u) };
        p.call(Grid::covering(chunks, GROUP), &mut |w| {
            if w.global >= chunks {
                return Ok(());
            }
            let lo = w.global * CHUNK;
            let hi = (lo + CHUNK).min(n);
            // This chunk and one neighbour each side.
            let from = lo.saturating_sub(1);
            let to = (hi + 1).min(n);
            let part = kload(w, at(src.dev, from), to - from)?;
            let out = sweep(&part, from as usize, n as usize, lo as usize, hi as usize);
            kstore(w, at(dst.dev, lo), &out)
        })?;
        p.sync()?;
    }
    let result = if iters % 2 == 0 { u } else { v };
    p.copy_out(result)?;
    let got = load_f32s(p, result.host, n as usize)?;
    let mut want = init;
    for _ in 0..iters {
        want = sweep(&want, 0, n as usize, 0, n as usize);
    }
    Ok(same(&got, &want))
}

const HIDDEN: u64 = 16;
const ETA: f32 = 0.3;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// One training step of an `inputs` × 16 layer (weights column-major, per hidden unit).
///
/// # Errors
/// The first [`AdsmError`] a call of `p` returned (allocation, access, transfer or
/// kernel); the workload stops there.
pub fn backprop(p: &mut dyn Program, inputs: u64) -> Result<bool, AdsmError> {
    let x = p.alloc(inputs * 4)?;
    let wt = p.alloc(inputs * HIDDEN * 4)?;
    let h = p.alloc(HIDDEN * 4)?;
    let d = p.alloc(HIDDEN * 4)?;
    p.begin();
    let xv: Vec<f32> = (0..inputs)
        .map(|i| ((i * 13) % 101) as f32 / 101.0)
        .collect();
    let wv: Vec<f32> = (0..inputs * HIDDEN)
        .map(|i| (((i * 31) % 211) as f32 - 105.0) / 2110.0)
        .collect();
    produce(p, x, &xv, CHUNK as usize)?;
    produce(p, wt, &wv, CHUNK as usize)?;
    p.copy_in(x)?;
    p.copy_in(wt)?;
    p.call(Grid::covering(HIDDEN, HIDDEN), &mut |w| {
        let j = w.global;
        let mut s = 0.0f32;
        let mut i = 0;
        while i < inputs {
            let k = CHUNK.min(inputs - i);
            let xs = kload(w, at(x.dev, i), k)?;
            let ws = kload(w, at(wt.dev, j * inputs + i), k)?;
            for (a, b) in xs.iter().zip(&ws) {
                s += a * b;
            }
            i += k;
        }
        kstore(w, at(h.dev, j), &[sigmoid(s)])
    })?;
    p.sync()?;
    p.copy_out(h)?;
    let hv = load_f32s(p, h.host, HIDDEN as usize)?;
    let dv: Vec<f32> = hv
        .iter()
        .enumerate()
        .map(|(j, &o)| o * (1.0 - o) * ((j % 2) as f32 - o))
        .collect();
    store_f32s(p, d.host, &dv)?;
    p.copy_in(d)?;
    let per = inputs.div_ceil(CHUNK);
    p.call(Grid::covering(HIDDEN * per, GROUP), &mut |w| {
        if w.global >= HIDDEN * per {
            return Ok(());
        }
        let (j, c) = (w.global / per, w.global % per);
        let i = c * CHUNK;
        let k = CHUNK.min(inputs - i);
        let dj = kload(w, at(d.dev, j), 1)?[0];
        let xs = kload(w, at(x.dev, i), k)?;
        let mut ws = kload(w, at(wt.dev, j * inputs + i), k)?;
        for (wv, xv) in ws.iter_mut().zip(&xs) {
            *wv += ETA * dj * xv;
        }
        kstore(w, at(wt.dev, j * inputs + i), &ws)
    })?;
    p.sync()?;
    p.copy_out(wt)?;
    let got_w = load_f32s(p, wt.host, (inputs * HIDDEN) as usize)?;
    // The reference, in the kernels' order.
    let mut want_h = Vec::new();
    for j in 0..HIDDEN {
        let mut s = 0.0f32;
        for i in 0..inputs {
            s += xv[i as usize] * wv[(j * inputs + i) as usize];
        }
        want_h.push(sigmoid(s));
    }
    let want_d: Vec<f32> = want_h
        .iter()
        .enumerate()
        .map(|(j, &o)| o * (1.0 - o) * ((j % 2) as f32 - o))
        .collect();
    let mut want_w = wv.clone();
    for j in 0..HIDDEN {
        for i in 0..inputs {
            want_w[(j * inputs + i) as usize] += ETA * want_d[j as usize] * xv[i as usize];
        }
    }
    Ok(same(&hv, &want_h) && same(&got_w, &want_w))
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn page_sum(page: &[u8]) -> u64 {
    page.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64)
        .fold(0u64, u64::wrapping_add)
}

/// The CPU reads a `bytes`-byte file into the input in 64 KiB chunks; one call sums
/// each page; the CPU reads the sums.
///
/// # Errors
/// The first [`AdsmError`] a call of `p` returned (allocation, access, transfer or
/// kernel); the workload stops there.
pub fn ingest(p: &mut dyn Program, bytes: u64) -> Result<bool, AdsmError> {
    let pages = bytes.div_ceil(PAGE_SIZE);
    let input = p.alloc(pages * PAGE_SIZE)?;
    let out = p.alloc(pages * 8)?;
    p.begin();
    let mut file = vec![0u8; (pages * PAGE_SIZE) as usize];
    let mut st = 0x2545_f491_4f6c_dd1d;
    for c in file.chunks_exact_mut(8) {
        c.copy_from_slice(&xorshift(&mut st).to_le_bytes());
    }
    const READ: usize = 64 << 10;
    for (k, c) in file.chunks(READ).enumerate() {
        p.store(input.host_at((k * READ) as u64), c)?;
    }
    p.copy_in(input)?;
    p.call(Grid::covering(pages, GROUP), &mut |w| {
        if w.global >= pages {
            return Ok(());
        }
        let mut b = vec![0u8; PAGE_SIZE as usize];
        w.load(input.dev_at(w.global * PAGE_SIZE), &mut b)?;
        w.store(out.dev_at(w.global * 8), &page_sum(&b).to_le_bytes())
    })?;
    p.sync()?;
    p.copy_out(out)?;
    let mut got = vec![0u8; (pages * 8) as usize];
    p.load(out.host, &mut got)?;
    let want: Vec<u8> = file
        .chunks_exact(PAGE_SIZE as usize)
        .flat_map(|pg| page_sum(pg).to_le_bytes())
        .collect();
    Ok(got == want)
}

fn hash(seed: u64, i: u64) -> u32 {
    ((i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed) >> 29) as u32
}

/// One call fills a `bytes`-byte output; the CPU reads 64 bytes of every 100th page
/// (1% of the pages).
///
/// # Errors
/// The first [`AdsmError`] a call of `p` returned (allocation, access, transfer or
/// kernel); the workload stops there.
pub fn sparse(p: &mut dyn Program, bytes: u64) -> Result<bool, AdsmError> {
    let pages = bytes.div_ceil(PAGE_SIZE);
    let param = p.alloc(8)?;
    let out = p.alloc(pages * PAGE_SIZE)?;
    p.begin();
    let seed = 0x5eed_u64;
    p.store(param.host, &seed.to_le_bytes())?;
    p.copy_in(param)?;
    p.call(Grid::covering(pages, GROUP), &mut |w| {
        if w.global >= pages {
            return Ok(());
        }
        let mut s = [0u8; 8];
        w.load(param.dev, &mut s)?;
        let seed = u64::from_le_bytes(s);
        let first = w.global * CHUNK;
        let page: Vec<u8> = (first..first + CHUNK)
            .flat_map(|i| hash(seed, i).to_le_bytes())
            .collect();
        w.store(out.dev_at(w.global * PAGE_SIZE), &page)
    })?;
    p.sync()?;
    p.copy_out(out)?;
    let mut ok = true;
    for pg in (0..pages).step_by(100) {
        let mut b = [0u8; 64];
        p.load(out.host_at(pg * PAGE_SIZE), &mut b)?;
        let want: Vec<u8> = (pg * CHUNK..pg * CHUNK + 16)
            .flat_map(|i| hash(seed, i).to_le_bytes())
            .collect();
        ok &= b[..] == want[..];
    }
    Ok(ok)
}

/// `y = Aᵀ (A x)` for an `m` × `n` matrix: two calls.
///
/// # Errors
/// The first [`AdsmError`] a call of `p` returned (allocation, access, transfer or
/// kernel); the workload stops there.
pub fn atax(p: &mut dyn Program, m: u64, n: u64) -> Result<bool, AdsmError> {
    let a = p.alloc(m * n * 4)?;
    let x = p.alloc(n * 4)?;
    let tmp = p.alloc(m * 4)?;
    let y = p.alloc(n * 4)?;
    p.begin();
    let av: Vec<f32> = (0..m * n).map(|i| ((i * 17) % 23) as f32 / 23.0).collect();
    let xv: Vec<f32> = (0..n).map(|j| (j % 11) as f32 - 5.0).collect();
    produce(p, a, &av, CHUNK as usize)?;
    produce(p, x, &xv, CHUNK as usize)?;
    p.copy_in(a)?;
    p.copy_in(x)?;
    p.call(Grid::covering(m, GROUP), &mut |w| {
        let i = w.global;
        if i >= m {
            return Ok(());
        }
        let mut s = 0.0f32;
        let mut j = 0;
        while j < n {
            let k = CHUNK.min(n - j);
            let row = kload(w, at(a.dev, i * n + j), k)?;
            let xs = kload(w, at(x.dev, j), k)?;
            for (r, v) in row.iter().zip(&xs) {
                s += r * v;
            }
            j += k;
        }
        kstore(w, at(tmp.dev, i), &[s])
    })?;
    p.sync()?;
    let chunks = n.div_ceil(CHUNK);
    p.call(Grid::covering(chunks, GROUP), &mut |w| {
        if w.global >= chunks {
            return Ok(());
        }
        let lo = w.global * CHUNK;
        let k = CHUNK.min(n - lo);
        let t = kload(w, tmp.dev, m)?;
        let mut acc = vec![0.0f32; k as usize];
        for (i, ti) in t.iter().enumerate() {
            let row = kload(w, at(a.dev, i as u64 * n + lo), k)?;
            for (s, r) in acc.iter_mut().zip(&row) {
                *s += r * ti;
            }
        }
        kstore(w, at(y.dev, lo), &acc)
    })?;
    p.sync()?;
    p.copy_out(y)?;
    let got = load_f32s(p, y.host, n as usize)?;
    let mut t = vec![0.0f32; m as usize];
    for (i, ti) in t.iter_mut().enumerate() {
        for j in 0..n as usize {
            *ti += av[i * n as usize + j] * xv[j];
        }
    }
    let mut want = vec![0.0f32; n as usize];
    for (i, ti) in t.iter().enumerate() {
        for (j, s) in want.iter_mut().enumerate() {
            *s += av[i * n as usize + j] * ti;
        }
    }
    Ok(same(&got, &want))
}

/// Who runs a workload: the explicit-copy baseline or ADSM with a protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Explicit copies.
    Explicit,
    /// The ADSM runtime.
    Adsm(Protocol),
}

impl Variant {
    /// `explicit`, `batch`, `lazy`, `rolling`.
    pub fn name(&self) -> &'static str {
        match self {
            Variant::Explicit => "explicit",
            Variant::Adsm(p) => p.name(),
        }
    }
}

/// One run's result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunResult {
    /// The workload.
    pub workload: Workload,
    /// Who ran it.
    pub variant: Variant,
    /// What the measured window did.
    pub measured: Measured,
    /// Bit-exact against the CPU-only reference.
    pub verified: bool,
}

/// The machine every run gets (fresh each time): 512 MiB of host memory, 512 MiB of
/// video memory.
///
/// # Errors
/// [`Machine::new`]'s: an [`AdsmError`] when the CPU, the GPU, the space or an
/// attachment is refused. The sizes are fixed and valid, so this fails only if the
/// core or a driver changes what it accepts (every run and test would then fail here
/// first).
pub fn machine() -> Result<Machine, AdsmError> {
    Machine::new(MachineConfig::new(512 << 20, 512 << 20))
}

/// Run `w` under `v` on a fresh [`machine`].
///
/// # Errors
/// [`machine`]'s error, [`Adsm::new`]'s (an ADSM variant with a bad protocol
/// parameter), or the first [`AdsmError`] the workload met while running.
pub fn run_one(
    w: Workload,
    v: Variant,
    s: &Sizes,
    model: TimeModel,
) -> Result<RunResult, AdsmError> {
    let m = machine()?;
    let (verified, measured) = match v {
        Variant::Explicit => {
            let mut p = Explicit::new(m, model);
            let ok = run(w, &mut p, s)?;
            (ok, p.measure())
        }
        Variant::Adsm(proto) => {
            let mut p = Adsm::new(m, proto, model)?;
            let ok = run(w, &mut p, s)?;
            (ok, p.measure())
        }
    };
    Ok(RunResult {
        workload: w,
        variant: v,
        measured,
        verified,
    })
}
