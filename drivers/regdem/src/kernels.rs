//! The benchmark kernels, written in the kernel language, each with a CPU reference.
//!
//! The paper's nine benchmarks are not in its text; we use register-heavy kernels of the
//! kinds the issue names, each with a knob that sweeps register pressure across the
//! occupancy cliffs:
//!
//! - [`Bench::Sgemm`]: batched, register-blocked SGEMM; each of 256 threads computes a
//!   `tm × tn` micro-tile from `As`/`Bs` tiles staged in shared memory (the knob).
//! - [`Bench::Nbody`]: an n-body force tile; each thread accumulates the acceleration of
//!   its body over tiles of 256 bodies in shared memory, the inner loop unrolled `unroll`
//!   times (the knob).
//! - [`Bench::Stencil`]: a 9-point 1-D stencil; each thread computes `outputs`
//!   consecutive points from a window kept in registers; its large shared-memory tile
//!   makes shared memory the tight resource (the case where RegDem should not help).
//! - [`Bench::Butterfly`]: FP64 radix-4 butterflies with twiddles (register pairs).
//! - [`Bench::Gather`]: a latency-bound, register-limited gather (issue 34): each
//!   iteration loads an index word, gathers the element it points to (a dependent
//!   global load, irregular within a band of 16 words), and evaluates a polynomial whose
//!   `coeffs` coefficients stay in registers for the whole loop (the knob). Written as
//!   nvcc emits such a loop: every address and constant (coefficients, the output and
//!   epilogue addresses, the epilogue's `alpha` and `beta`) is computed or loaded at
//!   kernel entry and kept live across the loop, so the kernel carries long-lived,
//!   rarely read registers — the cheap candidates demotion relies on (paper §3).
//! - [`Bench::Chase`]: the gather with a second dependent hop (BFS / CSR-SpMV style:
//!   the gathered word is itself an index into a second array), so two global loads
//!   stand in each iteration's dependence chain.
//!
//! Every kernel's CPU reference performs the same IEEE operations in the same order, so
//! the reference, the interpreter and every variant agree bit for bit.

use crate::interp;
use crate::ir::{InputKind, IrError, Kernel, Op, Special};
use crate::lang::{Builder, VSrc, V};

/// A benchmark and its register-pressure knob.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bench {
    /// Register-blocked SGEMM with a `tm × tn` micro-tile per thread and depth `k`.
    Sgemm {
        /// Rows per thread (even).
        tm: u32,
        /// Columns per thread (2, 4 or 8: the B tile width must be a power of two).
        tn: u32,
        /// Inner dimension (a multiple of 8).
        k: u32,
    },
    /// Maxas-style SGEMM: the inner loop fully unrolled and the next chunk of A and B
    /// prefetched into registers while the current one is computed, so global loads are
    /// in flight (on scoreboard barriers) across the whole compute phase.
    SgemmPrefetch {
        /// Rows per thread (even).
        tm: u32,
        /// Columns per thread (2, 4 or 8).
        tn: u32,
        /// Inner dimension (a multiple of 8).
        k: u32,
    },
    /// N-body tile with the inner loop unrolled `unroll` times (a divisor of 256).
    Nbody {
        /// Inner-loop unroll.
        unroll: u32,
        /// Tiles of 256 bodies.
        tiles: u32,
    },
    /// 1-D 9-point stencil, `outputs` consecutive points per thread.
    Stencil {
        /// Points per thread.
        outputs: u32,
        /// Tiles processed per block.
        tiles: u32,
    },
    /// FP64 radix-4 butterflies.
    Butterfly {
        /// Butterflies per thread.
        batches: u32,
    },
    /// Dependent gather plus a `coeffs`-term polynomial per element, `trips` elements
    /// per thread, `y = alpha · Σ p(x) + beta · y_old` at the end.
    Gather {
        /// Polynomial coefficients kept in registers (at least 2).
        coeffs: u32,
        /// Elements per thread.
        trips: u32,
    },
    /// [`Bench::Gather`] with two dependent hops per element: index word → index in a
    /// first array → element of a second array.
    Chase {
        /// Polynomial coefficients kept in registers (at least 2).
        coeffs: u32,
        /// Elements per thread.
        trips: u32,
    },
}

const T: u32 = 256;
const KC: u32 = 8;
const EPS: f32 = 1e-3;
const STENCIL_W: [f32; 9] = [0.05, 0.1, 0.1, 0.15, 0.2, 0.15, 0.1, 0.1, 0.05];

fn f32w(g: &[u32], i: u32) -> f32 {
    f32::from_bits(g[i as usize])
}

fn f64w(g: &[u32], i: u32) -> f64 {
    f64::from_bits(u64::from(g[i as usize]) | (u64::from(g[i as usize + 1]) << 32))
}

/// Twiddles of the butterfly (cos, sin of 2πk/16 for k = 1, 2, 3).
fn twiddles() -> [(f64, f64); 3] {
    let w = |k: f64| {
        let a = 2.0 * std::f64::consts::PI * k / 16.0;
        (a.cos(), -a.sin())
    };
    [w(1.0), w(2.0), w(3.0)]
}

impl Bench {
    /// A short name with the knob, for reports.
    pub fn name(&self) -> String {
        match self {
            Bench::Sgemm { tm, tn, .. } => format!("sgemm-{tm}x{tn}"),
            Bench::SgemmPrefetch { tm, tn, .. } => format!("sgemm-pf-{tm}x{tn}"),
            Bench::Nbody { unroll, .. } => format!("nbody-u{unroll}"),
            Bench::Stencil { outputs, .. } => format!("stencil-{outputs}"),
            Bench::Butterfly { .. } => "fft4-fp64".to_string(),
            Bench::Gather { coeffs, .. } => format!("gather-c{coeffs}"),
            Bench::Chase { coeffs, .. } => format!("chase-c{coeffs}"),
        }
    }

    /// Build the kernel for a grid of `grid` blocks of 256 threads.
    ///
    /// # Errors
    /// [`IrError`] if the parameters are malformed (e.g. an odd micro-tile) or the
    /// kernel needs more than 255 registers.
    pub fn build(&self, grid: u32) -> Result<Kernel, IrError> {
        match *self {
            Bench::Sgemm { tm, tn, k } => sgemm(tm, tn, k, grid, false),
            Bench::SgemmPrefetch { tm, tn, k } => sgemm(tm, tn, k, grid, true),
            Bench::Nbody { unroll, tiles } => nbody(unroll, tiles, grid),
            Bench::Stencil { outputs, tiles } => stencil(outputs, tiles, grid),
            Bench::Butterfly { batches } => butterfly(batches, grid),
            Bench::Gather { coeffs, trips } => gather(coeffs, trips, grid, 1),
            Bench::Chase { coeffs, trips } => gather(coeffs, trips, grid, 2),
        }
    }

    /// The expected output words, computed on the CPU from the initial global memory.
    pub fn reference(&self, k: &Kernel, g: &[u32]) -> Vec<u32> {
        let grid = k.grid_blocks;
        let mut out = Vec::new();
        match *self {
            Bench::Sgemm { tm, tn, k: kd } | Bench::SgemmPrefetch { tm, tn, k: kd } => {
                let (bm, bn) = (16 * tm, 16 * tn);
                let (a0, b0) = (0, grid * bm * kd);
                for b in 0..grid {
                    for m in 0..bm {
                        for n in 0..bn {
                            let mut acc = 0f32;
                            for kk in 0..kd {
                                let a = f32w(g, a0 + b * bm * kd + m * kd + kk);
                                let bb = f32w(g, b0 + b * kd * bn + kk * bn + n);
                                acc = a.mul_add(bb, acc);
                            }
                            out.push(acc.to_bits());
                        }
                    }
                }
            }
            Bench::Nbody { tiles, .. } => {
                let nb = T * tiles;
                let mut res = Vec::new();
                for b in 0..grid {
                    let base = b * nb * 4;
                    for i in 0..T {
                        let p = |j: u32, c: u32| f32w(g, base + j * 4 + c);
                        let (xi, yi, zi) = (p(i, 0), p(i, 1), p(i, 2));
                        let (mut ax, mut ay, mut az) = (0f32, 0f32, 0f32);
                        for j in 0..nb {
                            let dx = xi.mul_add(-1.0, p(j, 0));
                            let dy = yi.mul_add(-1.0, p(j, 1));
                            let dz = zi.mul_add(-1.0, p(j, 2));
                            let d2 = dz.mul_add(dz, dy.mul_add(dy, dx.mul_add(dx, EPS)));
                            let inv = 1.0 / d2.sqrt();
                            let s = p(j, 3) * (inv * inv * inv);
                            ax = dx.mul_add(s, ax);
                            ay = dy.mul_add(s, ay);
                            az = dz.mul_add(s, az);
                        }
                        res.push([ax.to_bits(), ay.to_bits(), az.to_bits()]);
                    }
                }
                for c in 0..3 {
                    out.extend(res.iter().map(|r| r[c]));
                }
            }
            Bench::Stencil { outputs: u, tiles } => {
                let tile = T * u;
                let row = tile * tiles + 8;
                for b in 0..grid {
                    for x in 0..tile * tiles {
                        let mut acc = 0f32;
                        for (d, w) in STENCIL_W.iter().enumerate() {
                            acc = f32w(g, b * row + x + d as u32).mul_add(*w, acc);
                        }
                        out.push(acc.to_bits());
                    }
                }
            }
            Bench::Butterfly { batches } => {
                let nt = grid * T;
                let tw = twiddles();
                for bt in 0..batches {
                    let mut y = vec![[0u32; 16]; nt as usize];
                    for (th, yt) in y.iter_mut().enumerate() {
                        let idx = |e: u32| ((bt * 8 + e) * nt + th as u32) * 2;
                        let x: Vec<f64> = (0..8).map(|e| f64w(g, idx(e))).collect();
                        let r = butterfly_ref(&x, &tw);
                        for (e, v) in r.iter().enumerate() {
                            let bits = v.to_bits();
                            yt[2 * e] = bits as u32;
                            yt[2 * e + 1] = (bits >> 32) as u32;
                        }
                    }
                    for e in 0..8 {
                        for yt in &y {
                            out.push(yt[2 * e]);
                            out.push(yt[2 * e + 1]);
                        }
                    }
                }
            }
            Bench::Gather { coeffs, trips } | Bench::Chase { coeffs, trips } => {
                let hops = if matches!(self, Bench::Chase { .. }) {
                    2
                } else {
                    1
                };
                let Some(l) = GatherLayout::new(coeffs, trips, grid, hops) else {
                    return out;
                };
                let c = |i: u32| f32w(g, l.coef0 + i);
                let (alpha, beta) = (c(coeffs), c(coeffs + 1));
                for gid in 0..l.n {
                    let mut acc = 0f32;
                    for t in 0..trips {
                        let j = g[(l.idx0 + t * l.n + gid) as usize] & GATHER_BAND;
                        let mut x = f32w(g, l.x0 + gid + j);
                        if hops == 2 {
                            x = f32w(g, l.z0 + gid + (x.to_bits() & GATHER_BAND));
                        }
                        let mut h = c(coeffs - 1).mul_add(x, c(coeffs - 2));
                        for i in (0..coeffs - 2).rev() {
                            h = h.mul_add(x, c(i));
                        }
                        acc += h;
                    }
                    let r = alpha.mul_add(acc, beta * f32w(g, l.yold0 + gid));
                    out.push(r.to_bits());
                }
            }
        }
        out
    }

    /// Check `k` (built from this bench) against the CPU reference on inputs from `seed`.
    ///
    /// # Errors
    /// The interpreter's [`interp::ExecError`].
    pub fn verify(&self, k: &Kernel, seed: u64) -> Result<bool, interp::ExecError> {
        let g0 = interp::init_global(k, seed);
        let mut g = g0.clone();
        interp::run(k, &mut g)?;
        Ok(interp::outputs(k, &g) == self.reference(k, &g0))
    }
}

fn bad() -> IrError {
    IrError::BadParameter
}

fn sgemm(tm: u32, tn: u32, kd: u32, grid: u32, prefetch: bool) -> Result<Kernel, IrError> {
    if tm == 0 || tm % 2 != 0 || !matches!(tn, 2 | 4 | 8) || kd == 0 || kd % KC != 0 {
        return Err(bad());
    }
    let (bm, bn) = (16 * tm, 16 * tn);
    let a0 = 0u32;
    let b0 = grid * bm * kd;
    let c0 = b0 + grid * kd * bn;
    let name = if prefetch {
        format!("sgemm-pf-{tm}x{tn}")
    } else {
        format!("sgemm-{tm}x{tn}")
    };
    let mut b = Builder::new(&name, T, grid);
    b.static_shared = 4 * KC * (bm + bn);
    b.global_words = c0 + grid * bm * bn;
    b.inputs = vec![(a0, c0)];
    b.outputs = vec![(c0, grid * bm * bn)];
    let tid = b.s2r(Special::Tid);
    let cta = b.s2r(Special::CtaId);
    let tx = b.op(Op::And, &[tid.into(), 15u32.into()]);
    let ty = b.op(Op::Shr, &[tid.into(), 4u32.into()]);
    // Cooperative-load addresses: tm/2 words of A and tn/2 of B per thread per chunk.
    let abase = b.imad(cta, bm * kd * 4, a0 * 4);
    let bbase = b.imad(cta, kd * bn * 4, b0 * 4);
    let mut ga = Vec::new();
    let mut sa = Vec::new();
    for j in 0..(bm * KC / T) {
        let e = b.iadd(tid, j * T);
        let m = b.op(Op::Shr, &[e.into(), 3u32.into()]);
        let kk = b.op(Op::And, &[e.into(), 7u32.into()]);
        let row = b.imad(m, kd * 4, abase);
        ga.push(b.imad(kk, 4u32, row));
        let s = b.imad(kk, bm * 4, VSrc::I(0));
        sa.push(b.imad(m, 4u32, s));
    }
    let mut gb = Vec::new();
    let mut sb = Vec::new();
    for j in 0..(bn * KC / T) {
        let e = b.iadd(tid, j * T);
        let kk = b.op(Op::Shr, &[e.into(), bn.trailing_zeros().into()]);
        let n = b.op(Op::And, &[e.into(), (bn - 1).into()]);
        let row = b.imad(kk, bn * 4, bbase);
        gb.push(b.imad(n, 4u32, row));
        let s = b.imad(kk, bn * 4, VSrc::I(4 * KC * bm));
        sb.push(b.imad(n, 4u32, s));
    }
    let accs: Vec<V> = (0..tm * tn).map(|_| b.mov(0f32)).collect();
    let a_start = b.imad(ty, tm * 4, VSrc::I(0));
    let b_start = b.imad(tx, tn * 4, VSrc::I(4 * KC * bm));
    let aptr = b.reg();
    let bptr = b.reg();
    if prefetch {
        return sgemm_prefetch(
            b,
            SgemmParts {
                tm,
                tn,
                bm,
                bn,
                c0,
                tx,
                ty,
                cta,
                ga,
                sa,
                gb,
                sb,
                accs,
                a_start,
                b_start,
            },
            kd,
        );
    }
    let chunks = b.loop_begin(kd / KC);
    for (g, s) in ga.iter().zip(&sa) {
        let x = b.ldg(*g, 0);
        b.sts(*s, 0, x);
    }
    for (g, s) in gb.iter().zip(&sb) {
        let x = b.ldg(*g, 0);
        b.sts(*s, 0, x);
    }
    for g in &ga {
        b.iadd_to(*g, *g, KC * 4);
    }
    for g in &gb {
        b.iadd_to(*g, *g, KC * bn * 4);
    }
    b.op_to(aptr, Op::Mov, &[a_start.into()]);
    b.op_to(bptr, Op::Mov, &[b_start.into()]);
    b.bar();
    let inner = b.loop_begin(KC);
    let av: Vec<V> = (0..tm).map(|i| b.lds(aptr, i * 4)).collect();
    let bv: Vec<V> = (0..tn).map(|j| b.lds(bptr, j * 4)).collect();
    for i in 0..tm as usize {
        for j in 0..tn as usize {
            let acc = accs[i * tn as usize + j];
            b.ffma_to(acc, av[i], bv[j], acc);
        }
    }
    b.iadd_to(aptr, aptr, bm * 4);
    b.iadd_to(bptr, bptr, bn * 4);
    b.loop_end(inner);
    b.bar();
    b.loop_end(chunks);
    let crow = b.imad(ty, tm * bn * 4, VSrc::I(c0 * 4));
    let ccol = b.imad(tx, tn * 4, crow);
    let cptr = b.imad(cta, bm * bn * 4, ccol);
    for i in 0..tm {
        for j in 0..tn {
            b.stg(cptr, (i * bn + j) * 4, accs[(i * tn + j) as usize]);
        }
    }
    b.finish()
}

/// The registers an SGEMM kernel has set up before its main loop.
struct SgemmParts {
    tm: u32,
    tn: u32,
    bm: u32,
    bn: u32,
    c0: u32,
    tx: V,
    ty: V,
    cta: V,
    ga: Vec<V>,
    sa: Vec<V>,
    gb: Vec<V>,
    sb: Vec<V>,
    accs: Vec<V>,
    a_start: V,
    b_start: V,
}

/// The maxas-style main loop: stage the prefetched chunk, prefetch the next one (the
/// last iteration's prefetch reads the next row or array — in bounds, never used — as
/// unguarded maxas code does), compute the fully unrolled chunk, store C.
fn sgemm_prefetch(mut b: Builder, p: SgemmParts, kd: u32) -> Result<Kernel, IrError> {
    let SgemmParts {
        tm,
        tn,
        bm,
        bn,
        c0,
        tx,
        ty,
        cta,
        ga,
        sa,
        gb,
        sb,
        accs,
        a_start,
        b_start,
    } = p;
    let pa: Vec<V> = ga.iter().map(|g| b.ldg(*g, 0)).collect();
    let pb: Vec<V> = gb.iter().map(|g| b.ldg(*g, 0)).collect();
    let chunks = b.loop_begin(kd / KC);
    for (x, s) in pa.iter().zip(&sa) {
        b.sts(*s, 0, *x);
    }
    for (x, s) in pb.iter().zip(&sb) {
        b.sts(*s, 0, *x);
    }
    b.bar();
    for g in &ga {
        b.iadd_to(*g, *g, KC * 4);
    }
    for g in &gb {
        b.iadd_to(*g, *g, KC * bn * 4);
    }
    for (x, g) in pa.iter().zip(&ga) {
        b.ldg_to(*x, *g);
    }
    for (x, g) in pb.iter().zip(&gb) {
        b.ldg_to(*x, *g);
    }
    for kk in 0..KC {
        let av: Vec<V> = (0..tm).map(|i| b.lds(a_start, (kk * bm + i) * 4)).collect();
        let bv: Vec<V> = (0..tn).map(|j| b.lds(b_start, (kk * bn + j) * 4)).collect();
        for i in 0..tm as usize {
            for j in 0..tn as usize {
                let acc = accs[i * tn as usize + j];
                b.ffma_to(acc, av[i], bv[j], acc);
            }
        }
    }
    b.bar();
    b.loop_end(chunks);
    let crow = b.imad(ty, tm * bn * 4, VSrc::I(c0 * 4));
    let ccol = b.imad(tx, tn * 4, crow);
    let cptr = b.imad(cta, bm * bn * 4, ccol);
    for i in 0..tm {
        for j in 0..tn {
            b.stg(cptr, (i * bn + j) * 4, accs[(i * tn + j) as usize]);
        }
    }
    b.finish()
}

fn nbody(u: u32, tiles: u32, grid: u32) -> Result<Kernel, IrError> {
    if u == 0 || T % u != 0 || tiles == 0 {
        return Err(bad());
    }
    let nb = T * tiles;
    let out0 = grid * nb * 4;
    let mut b = Builder::new(&format!("nbody-u{u}"), T, grid);
    b.static_shared = T * 16;
    b.global_words = out0 + grid * T * 3;
    b.inputs = vec![(0, out0)];
    b.outputs = vec![(out0, grid * T * 3)];
    let tid = b.s2r(Special::Tid);
    let cta = b.s2r(Special::CtaId);
    let base = b.imad(cta, nb * 16, VSrc::I(0));
    let me = b.imad(tid, 16u32, base);
    let xi = b.ldg(me, 0);
    let yi = b.ldg(me, 4);
    let zi = b.ldg(me, 8);
    let ax = b.mov(0f32);
    let ay = b.mov(0f32);
    let az = b.mov(0f32);
    let gptr = b.reg();
    b.op_to(gptr, Op::Mov, &[me.into()]);
    let sptr = b.shl(tid, 4);
    let jptr = b.reg();
    let tl = b.loop_begin(tiles);
    for c in 0..4 {
        let x = b.ldg(gptr, c * 4);
        b.sts(sptr, c * 4, x);
    }
    b.iadd_to(gptr, gptr, T * 16);
    b.op_to(jptr, Op::Mov, &[0u32.into()]);
    b.bar();
    let jl = b.loop_begin(T / u);
    let mut loads = Vec::new();
    for k in 0..u {
        let p: Vec<V> = (0..4).map(|c| b.lds(jptr, k * 16 + c * 4)).collect();
        loads.push(p);
    }
    let neg = -1f32;
    let mut d = Vec::new();
    for p in &loads {
        let dx = b.ffma(xi, neg, p[0]);
        let dy = b.ffma(yi, neg, p[1]);
        let dz = b.ffma(zi, neg, p[2]);
        d.push((dx, dy, dz));
    }
    let mut s = Vec::new();
    for (k, &(dx, dy, dz)) in d.iter().enumerate() {
        let d2 = b.ffma(dx, dx, EPS);
        let d2 = b.ffma(dy, dy, d2);
        let d2 = b.ffma(dz, dz, d2);
        let inv = b.frsq(d2);
        let i2 = b.fmul(inv, inv);
        let i3 = b.fmul(i2, inv);
        s.push(b.fmul(loads[k][3], i3));
    }
    for (k, &(dx, dy, dz)) in d.iter().enumerate() {
        b.ffma_to(ax, dx, s[k], ax);
        b.ffma_to(ay, dy, s[k], ay);
        b.ffma_to(az, dz, s[k], az);
    }
    b.iadd_to(jptr, jptr, u * 16);
    b.loop_end(jl);
    b.bar();
    b.loop_end(tl);
    let o = b.imad(cta, T * 4, VSrc::I(out0 * 4));
    let o = b.imad(tid, 4u32, o);
    b.stg(o, 0, ax);
    b.stg(o, grid * T * 4, ay);
    b.stg(o, 2 * grid * T * 4, az);
    b.finish()
}

fn stencil(u: u32, tiles: u32, grid: u32) -> Result<Kernel, IrError> {
    if u == 0 || tiles == 0 {
        return Err(bad());
    }
    let tile = T * u;
    let row = tile * tiles + 8;
    let out0 = grid * row;
    let mut b = Builder::new(&format!("stencil-{u}"), T, grid);
    let stage = tile + 8;
    b.static_shared = stage * 4;
    b.global_words = out0 + grid * tile * tiles;
    b.inputs = vec![(0, out0)];
    b.outputs = vec![(out0, grid * tile * tiles)];
    let tid = b.s2r(Special::Tid);
    let cta = b.s2r(Special::CtaId);
    let gbase = b.imad(cta, row * 4, VSrc::I(0));
    let gout = b.imad(cta, tile * tiles * 4, VSrc::I(out0 * 4));
    let gout = b.imad(tid, u * 4, gout);
    let sst = b.shl(tid, 2);
    let swin = b.imad(tid, u * 4, VSrc::I(0));
    let loads_per_thread = stage.div_ceil(T);
    let tl = b.loop_begin(tiles);
    let gin = b.imad(tid, 4u32, gbase);
    for j in 0..loads_per_thread {
        if j * T + T <= stage {
            let x = b.ldg(gin, j * T * 4);
            b.sts(sst, j * T * 4, x);
        } else {
            // The last, partial row of the staging buffer (the 8 halo words): thread t
            // loads word `t & 7`, so eight threads store each word, all the same value.
            let lane = b.op(Op::And, &[tid.into(), 7u32.into()]);
            let a = b.imad(lane, 4u32, gbase);
            let x = b.ldg(a, j * T * 4);
            let sa = b.shl(lane, 2);
            b.sts(sa, j * T * 4, x);
        }
    }
    b.bar();
    let win: Vec<V> = (0..u + 8).map(|k| b.lds(swin, k * 4)).collect();
    let mut outs = Vec::new();
    for o in 0..u as usize {
        let mut acc = b.mov(0f32);
        for (dd, w) in STENCIL_W.iter().enumerate() {
            acc = b.ffma(win[o + dd], *w, acc);
        }
        outs.push(acc);
    }
    for (o, v) in outs.iter().enumerate() {
        b.stg(gout, o as u32 * 4, *v);
    }
    b.iadd_to(gbase, gbase, tile * 4);
    b.iadd_to(gout, gout, tile * 4);
    b.bar();
    b.loop_end(tl);
    b.finish()
}

/// The butterfly's arithmetic, shared by the kernel builder's structure and the CPU
/// reference: x are 4 complex values as (re, im) f64 pairs, in order.
fn butterfly_ref(x: &[f64], tw: &[(f64, f64); 3]) -> [f64; 8] {
    let c = |k: usize| (x[2 * k], x[2 * k + 1]);
    let mul = |(xr, xi): (f64, f64), (wr, wi): (f64, f64)| {
        let re = xr.mul_add(wr, xi * -wi);
        let im = xr.mul_add(wi, xi * wr);
        (re, im)
    };
    let sub = |a: f64, b: f64| b.mul_add(-1.0, a);
    let x0 = c(0);
    let t1 = mul(c(1), tw[0]);
    let t2 = mul(c(2), tw[1]);
    let t3 = mul(c(3), tw[2]);
    let a0 = (x0.0 + t2.0, x0.1 + t2.1);
    let a1 = (sub(x0.0, t2.0), sub(x0.1, t2.1));
    let a2 = (t1.0 + t3.0, t1.1 + t3.1);
    let a3 = (sub(t1.0, t3.0), sub(t1.1, t3.1));
    [
        a0.0 + a2.0,
        a0.1 + a2.1,
        a1.0 + a3.1,
        sub(a1.1, a3.0),
        sub(a0.0, a2.0),
        sub(a0.1, a2.1),
        sub(a1.0, a3.1),
        a1.1 + a3.0,
    ]
}

fn butterfly(batches: u32, grid: u32) -> Result<Kernel, IrError> {
    if batches == 0 {
        return Err(bad());
    }
    let nt = grid * T;
    let words = batches * 8 * nt * 2;
    let mut b = Builder::new("fft4-fp64", T, grid);
    b.global_words = 2 * words;
    b.inputs = vec![(0, words)];
    b.outputs = vec![(words, words)];
    b.input_kind = InputKind::F64;
    let tid = b.s2r(Special::Tid);
    let cta = b.s2r(Special::CtaId);
    let g = b.imad(cta, T, tid);
    let p = b.shl(g, 3);
    let tw = twiddles();
    // Twiddles (w, -w_im) and -1.0 as pairs, materialised once outside the loop.
    let consts: Vec<(V, V, V)> = tw
        .iter()
        .map(|&(wr, wi)| {
            let a = b.dconst(wr);
            let c = b.dconst(wi);
            let n = b.dconst(-wi);
            (a, c, n)
        })
        .collect();
    let m1 = b.dconst(-1.0);
    let l = b.loop_begin(batches);
    let xs: Vec<V> = (0..4)
        .flat_map(|k| [2 * k, 2 * k + 1])
        .map(|e| {
            let lo = b.ldg(p, e * nt * 8);
            let hi = b.ldg(p, e * nt * 8 + 4);
            b.pack(lo, hi)
        })
        .collect();
    let c = |k: usize| (xs[2 * k], xs[2 * k + 1]);
    let mul = |b: &mut Builder, (xr, xi): (V, V), (wr, wi, nwi): (V, V, V)| {
        let t = b.dmul(xi, nwi);
        let re = b.dfma(xr, wr, t);
        let t2 = b.dmul(xi, wr);
        let im = b.dfma(xr, wi, t2);
        (re, im)
    };
    let t1 = mul(&mut b, c(1), consts[0]);
    let t2 = mul(&mut b, c(2), consts[1]);
    let t3 = mul(&mut b, c(3), consts[2]);
    let x0 = c(0);
    let sub = |b: &mut Builder, a: V, x: V| b.dfma(x, m1, a);
    let a0 = (b.dadd(x0.0, t2.0), b.dadd(x0.1, t2.1));
    let a1 = (sub(&mut b, x0.0, t2.0), sub(&mut b, x0.1, t2.1));
    let a2 = (b.dadd(t1.0, t3.0), b.dadd(t1.1, t3.1));
    let a3 = (sub(&mut b, t1.0, t3.0), sub(&mut b, t1.1, t3.1));
    let y = [
        b.dadd(a0.0, a2.0),
        b.dadd(a0.1, a2.1),
        b.dadd(a1.0, a3.1),
        sub(&mut b, a1.1, a3.0),
        sub(&mut b, a0.0, a2.0),
        sub(&mut b, a0.1, a2.1),
        sub(&mut b, a1.0, a3.1),
        b.dadd(a1.1, a3.0),
    ];
    for (e, v) in y.iter().enumerate() {
        let off = words * 4 + e as u32 * nt * 8;
        b.stg(p, off, VSrc::Lo(*v));
        b.stg(p, off + 4, VSrc::Hi(*v));
    }
    b.iadd_to(p, p, 8 * nt * 8);
    b.loop_end(l);
    b.finish()
}

/// The gather's index mask: an element is gathered from within 16 words of its thread.
const GATHER_BAND: u32 = 15;

/// Where the gather's arrays live (word offsets), for `n = grid · 256` threads.
struct GatherLayout {
    n: u32,
    idx0: u32,
    x0: u32,
    /// The second hop's array (empty for one hop).
    z0: u32,
    coef0: u32,
    yold0: u32,
    out0: u32,
}

impl GatherLayout {
    /// The layout, or `None` if the arrays do not fit a 32-bit byte address space.
    fn new(coeffs: u32, trips: u32, grid: u32, hops: u32) -> Option<GatherLayout> {
        let n = grid.checked_mul(T)?;
        let idx0 = 0;
        let x0 = trips.checked_mul(n)?;
        let z0 = x0.checked_add(n)?.checked_add(GATHER_BAND + 1)?;
        let z_words = if hops == 2 { n + GATHER_BAND + 1 } else { 0 };
        let coef0 = z0.checked_add(z_words)?;
        let yold0 = coef0.checked_add(coeffs)?.checked_add(2)?;
        let out0 = yold0.checked_add(n)?;
        // Every byte address (word index · 4) must fit in 32 bits.
        out0.checked_add(n)?.checked_mul(4)?;
        Some(GatherLayout {
            n,
            idx0,
            x0,
            z0,
            coef0,
            yold0,
            out0,
        })
    }
}

/// The gather (`hops` = 1) or the two-hop chase (`hops` = 2).
fn gather(coeffs: u32, trips: u32, grid: u32, hops: u32) -> Result<Kernel, IrError> {
    if !(2..=200).contains(&coeffs) || trips == 0 || grid == 0 || !(1..=2).contains(&hops) {
        return Err(bad());
    }
    let l = GatherLayout::new(coeffs, trips, grid, hops).ok_or_else(bad)?;
    let name = if hops == 2 { "chase" } else { "gather" };
    let mut b = Builder::new(&format!("{name}-c{coeffs}"), T, grid);
    b.global_words = l.out0 + l.n;
    b.inputs = vec![(0, l.out0)];
    b.outputs = vec![(l.out0, l.n)];
    let tid = b.s2r(Special::Tid);
    let cta = b.s2r(Special::CtaId);
    let gid = b.imad(cta, T, tid);
    // Hoisted as nvcc does: addresses and constants first, live across the loop.
    let yout = b.imad(gid, 4u32, VSrc::I(l.out0 * 4));
    let yold = b.imad(gid, 4u32, VSrc::I(l.yold0 * 4));
    let xb = b.imad(gid, 4u32, VSrc::I(l.x0 * 4));
    let zb = (hops == 2).then(|| b.imad(gid, 4u32, VSrc::I(l.z0 * 4)));
    let p = b.imad(gid, 4u32, VSrc::I(l.idx0 * 4));
    let cb = b.mov(l.coef0 * 4);
    let alpha = b.ldg(cb, coeffs * 4);
    let beta = b.ldg(cb, coeffs * 4 + 4);
    let c: Vec<V> = (0..coeffs).map(|i| b.ldg(cb, i * 4)).collect();
    let acc = b.mov(0f32);
    let lp = b.loop_begin(trips);
    let w = b.ldg(p, 0);
    let j = b.op(Op::And, &[w.into(), GATHER_BAND.into()]);
    let a = b.imad(j, 4u32, xb);
    let mut x = b.ldg(a, 0);
    if let Some(zb) = zb {
        let k = b.op(Op::And, &[x.into(), GATHER_BAND.into()]);
        let a2 = b.imad(k, 4u32, zb);
        x = b.ldg(a2, 0);
    }
    let h = b.ffma(c[coeffs as usize - 1], x, c[coeffs as usize - 2]);
    for i in (0..coeffs as usize - 2).rev() {
        b.ffma_to(h, h, x, c[i]);
    }
    b.op_to(acc, Op::FAdd, &[acc.into(), h.into()]);
    b.iadd_to(p, p, l.n * 4);
    b.loop_end(lp);
    let yo = b.ldg(yold, 0);
    let t = b.fmul(beta, yo);
    let r = b.ffma(alpha, acc, t);
    b.stg(yout, 0, r);
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bench_matches_its_cpu_reference() {
        for bench in [
            Bench::Sgemm {
                tm: 4,
                tn: 4,
                k: 16,
            },
            Bench::Nbody {
                unroll: 4,
                tiles: 1,
            },
            Bench::Stencil {
                outputs: 8,
                tiles: 2,
            },
            Bench::Butterfly { batches: 2 },
            Bench::Gather {
                coeffs: 8,
                trips: 3,
            },
            Bench::Chase {
                coeffs: 8,
                trips: 3,
            },
        ] {
            let k = bench.build(2).unwrap();
            assert!(bench.verify(&k, 7).unwrap(), "{}", bench.name());
        }
    }

    #[test]
    fn unroll_knob_raises_register_pressure() {
        let r = |u| {
            Bench::Nbody {
                unroll: u,
                tiles: 1,
            }
            .build(1)
            .unwrap()
            .registers()
        };
        assert!(r(1) < r(4) && r(4) < r(8), "{} {} {}", r(1), r(4), r(8));
    }
}
