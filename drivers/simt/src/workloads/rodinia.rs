//! Rodinia-style workloads: the hotspot stencil, the k-means membership kernel and
//! back-propagation, each verified against a CPU reference.

use super::spec::{Affine, Spec, SpecKernel, MAX_OPS};
use super::{launch, max_rel_error, values, Outcome, Size, TOLERANCE};
use crate::engine::RunStats;
use crate::machine::SimtMachine;

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
    fn affine(&self, _k: u64, op: usize) -> Option<Affine> {
        // The centre cell and the power; the neighbours clamp at the edges.
        let base = match op {
            0 => self.temp,
            5 => self.power,
            _ => return None,
        };
        Some(Affine { base, stride: 4 })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] = hotspot_cell(v[0], v[1], v[2], v[3], v[4], v[5]);
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
    fn cycles(&self) -> u32 {
        12
    }
}

pub(super) fn hotspot(m: &SimtMachine, n: u64) -> Result<Outcome, String> {
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
    fn affine(&self, s: u64, op: usize) -> Option<Affine> {
        let (c, f) = (s / self.f, s % self.f);
        let (base, stride) = if op == 0 {
            (self.feat + 4 * f * self.n, 4)
        } else {
            (self.clusters + 4 * (c * self.f + f), 0)
        };
        Some(Affine { base, stride })
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
    fn out_affine(&self) -> Option<Affine> {
        Some(Affine {
            base: self.out,
            stride: 4,
        })
    }
    fn result(&self, _t: u64, acc: &[f32; 4]) -> f32 {
        acc[2]
    }
}

pub(super) fn kmeans_size(size: Size) -> (u64, u64, u64) {
    match size {
        Size::Quick => (8192, 8, 5),
        Size::Medium => (1 << 15, 8, 5),
        Size::Full => (1 << 17, 16, 8),
    }
}

pub(super) fn kmeans(m: &SimtMachine, size: Size) -> Result<Outcome, String> {
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
    fn affine(&self, i: u64, op: usize) -> Option<Affine> {
        let (base, stride) = if op == 0 {
            (self.input + 4 * i, 0)
        } else {
            (self.w + 4 * i * (self.hid + 1), 4)
        };
        Some(Affine { base, stride })
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
    fn affine(&self, _k: u64, op: usize) -> Option<Affine> {
        // The weights; `delta[j]` and `input[i]` follow `t`'s row and column.
        let base = match op {
            2 => self.oldw,
            3 => self.w,
            _ => return None,
        };
        Some(Affine { base, stride: 4 })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] = v[3] + (ETA * v[0] * v[1] + MOMENTUM * v[2]);
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.w + 4 * t)
    }
    fn out_affine(&self) -> Option<Affine> {
        Some(Affine {
            base: self.w,
            stride: 4,
        })
    }
}

pub(super) fn backprop_inputs(size: Size) -> u64 {
    match size {
        Size::Quick => 4096,
        Size::Medium => 16384,
        Size::Full => 65536,
    }
}

pub(super) fn backprop(m: &SimtMachine, size: Size) -> Result<Outcome, String> {
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
