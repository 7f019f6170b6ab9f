//! Polybench-GPU matrix-vector kernels (ATAX, BICG, MVT, GESUMMV): one thread per row
//! or column, each verified against a CPU reference. The translation-sensitive class of
//! the MESC paper: walking `A` by rows puts a different page under every lane.

use super::spec::{Affine, Spec, MAX_OPS};
use super::{launch, max_rel_error, values, Outcome, TOLERANCE};
use crate::engine::RunStats;
use crate::machine::SimtMachine;

/// `out[t] = Σ_k a[row(t,k)] * v[k]`-style matrix-vector product over an `n × n`
/// row-major `f32` matrix, one thread per output: the kernel of ATAX, BICG and MVT
/// (public so that analyses such as `examples/atax_shape.rs` launch the same kernel).
pub struct MatVec {
    /// Rows (= columns).
    pub n: u64,
    /// The matrix's device address.
    pub a: u64,
    /// Walk `A` by rows per thread (`A[t][k]`, strided across lanes) or by columns
    /// (`A[k][t]`, coalesced).
    pub rows: bool,
    /// The vector's device address.
    pub v: u64,
    /// The output's device address.
    pub out: u64,
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
    fn affine(&self, k: u64, op: usize) -> Option<Affine> {
        let (base, stride) = match op {
            0 if self.rows => (self.a + 4 * k, 4 * self.n),
            0 => (self.a + 4 * k * self.n, 4),
            _ => (self.v + 4 * k, 0),
        };
        Some(Affine { base, stride })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0] * v[1];
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
    fn affine(&self, k: u64, op: usize) -> Option<Affine> {
        let (base, stride) = match op {
            0 => (self.a + 4 * k, 4 * self.n),
            1 => (self.b + 4 * k, 4 * self.n),
            _ => (self.x + 4 * k, 0),
        };
        Some(Affine { base, stride })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0] * v[2];
        acc[1] += v[1] * v[2];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.y + 4 * t)
    }
    fn out_affine(&self) -> Option<Affine> {
        Some(Affine {
            base: self.y,
            stride: 4,
        })
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

pub(super) fn polybench(m: &SimtMachine, name: &str, n: u64) -> Result<Outcome, String> {
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
