//! Gaussian elimination as Rodinia's `gaussian` runs it (the CODA paper's GE, the one
//! benchmark whose remote accesses CODA does not reduce, §6.2): for each pivot `t`, a
//! `Fan1` launch computes the multipliers `m[i][t] = a[i][t] / a[t][t]` of the rows
//! below it (blocks of 512 threads, one row each), and a `Fan2` launch subtracts
//! `m[i][t] · a[t][j]` from every element below and right of the pivot and
//! `m[i][t] · b[t]` from `b[i]` (a 2D grid of 4 × 4-thread blocks, x over rows, y over
//! columns, flattened row-major as `by · gx + bx`, Rodinia's `BLOCK_SIZE_XY` 4).
//! Blocks wholly outside the active submatrix return at once, as Rodinia's threads do.
//!
//! Descriptors: `a` and `m` are indexed by both kernels with different block strides
//! (512 rows per `Fan1` block, 4 rows per `Fan2` block), so the placement keeps them
//! fine grain, as a compiler pass that sees both kernels must; `b` follows `Fan2`.
//! The result (`a` reduced to upper-triangular form, `m`, `b`) is checked bit for bit
//! against the same arithmetic on the CPU. The input is a random diagonally dominant
//! matrix (an **assumption**: Rodinia generates its own; dominance keeps the pivots
//! away from zero without pivoting, which Rodinia does not do either).

use crate::config::KernelShape;
use crate::exec::Exec;
use crate::machine::{HbmMachine, MachineError};
use crate::memory::Requester;
use crate::placement::AffineIndex;
use crate::workloads::{Class, Descriptor, Object, Rng, Workload};
use std::string::String;
use std::vec::Vec;

/// Threads of a `Fan1` block (Rodinia's `MAXBLOCKSIZE`).
pub const FAN1_THREADS: u64 = 512;
/// Side of a `Fan2` block (Rodinia's `BLOCK_SIZE_XY`).
pub const FAN2_SIDE: u64 = 4;

/// Gaussian elimination of an `n × n` system.
pub struct Gaussian {
    /// Unknowns.
    pub n: u64,
}

const HOST: Requester = Requester::Host;

impl Gaussian {
    fn inputs(&self) -> (Vec<f32>, Vec<f32>) {
        let n = self.n as usize;
        let mut r = Rng(0x6a55);
        let mut a: Vec<f32> = (0..n * n).map(|_| r.f32() - 0.5).collect();
        for i in 0..n {
            a[i * n + i] += n as f32;
        }
        let b = (0..n).map(|_| r.f32()).collect();
        (a, b)
    }

    /// The CPU reference: the same operations, in an order the kernels' results do
    /// not depend on (each element is written by one thread per launch).
    fn reference(&self) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let n = self.n as usize;
        let (mut a, mut b) = self.inputs();
        let mut m = vec![0f32; n * n];
        for t in 0..n.saturating_sub(1) {
            for i in t + 1..n {
                m[i * n + t] = a[i * n + t] / a[t * n + t];
            }
            for i in t + 1..n {
                for j in t..n {
                    a[i * n + j] -= m[i * n + t] * a[t * n + j];
                }
                b[i] -= m[i * n + t] * b[t];
            }
        }
        (a, b, m)
    }

    fn index(&self, block_rows: u64, cols: u64) -> AffineIndex {
        AffineIndex {
            block_coeff: (block_rows * self.n) as i64,
            thread_coeff: self.n as i64,
            loop_coeff: 1,
            loop_len: cols,
            elem_bytes: 4,
        }
    }
}

impl Workload for Gaussian {
    fn name(&self) -> String {
        "gaussian".into()
    }
    fn class(&self) -> Class {
        Class::Sharing
    }
    fn kernel(&self) -> KernelShape {
        // Fan2's block, where the work is (one shape per workload).
        KernelShape::threads((FAN2_SIDE * FAN2_SIDE) as u32)
    }
    fn paper_name(&self) -> Option<&'static str> {
        Some("GE")
    }
    fn objects(&self) -> Vec<Object> {
        let n = self.n;
        // Fan1: element n·(512·bx + tx + t + 1) + t; Fan2: n·(4·bx + tx + 1 + t) +
        // 4·by + ty + t (tx over 4 rows, ty over 4 columns).
        let fan1 = self.index(FAN1_THREADS, 1);
        let fan2 = self.index(FAN2_SIDE, FAN2_SIDE);
        let both = Descriptor::Affine2(fan1, FAN1_THREADS, fan2, FAN2_SIDE);
        let b = Descriptor::Affine(
            AffineIndex {
                block_coeff: FAN2_SIDE as i64,
                thread_coeff: 1,
                loop_coeff: 0,
                loop_len: 1,
                elem_bytes: 4,
            },
            FAN2_SIDE,
        );
        std::vec![
            Object {
                name: "m",
                bytes: n * n * 4,
                descriptor: both,
            },
            Object {
                name: "a",
                bytes: n * n * 4,
                descriptor: both,
            },
            Object {
                name: "b",
                bytes: n * 4,
                descriptor: b,
            },
        ]
    }
    fn init(&self, m: &HbmMachine, base: &[u64]) -> Result<(), MachineError> {
        let (a, b) = self.inputs();
        m.store_f32s(HOST, base[0], &std::vec![0f32; a.len()])?;
        m.store_f32s(HOST, base[1], &a)?;
        m.store_f32s(HOST, base[2], &b)
    }
    fn run(&self, x: &mut Exec<'_>, base: &[u64]) -> Result<(), MachineError> {
        let n = self.n;
        let (mb, ab, bb) = (base[0], base[1], base[2]);
        let at = |r: u64, c: u64| (r * n + c) * 4;
        let gx = n.div_ceil(FAN2_SIDE);
        for t in 0..n.saturating_sub(1) {
            x.launch(n.div_ceil(FAN1_THREADS), |c| {
                let first = c.block() * FAN1_THREADS;
                if first >= n - 1 - t {
                    return Ok(());
                }
                let pivot = c.load_f32(ab + at(t, t))?;
                for x in first..(first + FAN1_THREADS).min(n - 1 - t) {
                    let r = x + 1 + t;
                    let v = c.load_f32(ab + at(r, t))?;
                    c.alu(1);
                    c.store_f32s(mb + at(r, t), &[v / pivot])?;
                }
                Ok(())
            })?;
            x.launch(gx * gx, |c| {
                let (by, bx) = (c.block() / gx, c.block() % gx);
                let (x0, y0) = (bx * FAN2_SIDE, by * FAN2_SIDE);
                if x0 >= n - 1 - t || y0 >= n - t {
                    return Ok(());
                }
                let rows = FAN2_SIDE.min(n - 1 - t - x0);
                let cols = FAN2_SIDE.min(n - t - y0) as usize;
                let pivot_row = c.load_f32s(ab + at(t, y0 + t), cols)?;
                let bt = if y0 == 0 {
                    Some(c.load_f32(bb + t * 4)?)
                } else {
                    None
                };
                for tx in 0..rows {
                    let r = x0 + tx + 1 + t;
                    let mrt = c.load_f32(mb + at(r, t))?;
                    let row = c.load_f32s(ab + at(r, y0 + t), cols)?;
                    let out: Vec<f32> = row
                        .iter()
                        .zip(&pivot_row)
                        .map(|(v, p)| v - mrt * p)
                        .collect();
                    c.alu(cols as u64); // a multiply-add per element
                    c.store_f32s(ab + at(r, y0 + t), &out)?;
                    if let Some(bt) = bt {
                        let br = c.load_f32(bb + r * 4)?;
                        c.alu(1);
                        c.store_f32s(bb + r * 4, &[br - mrt * bt])?;
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }
    fn verify(&self, m: &HbmMachine, base: &[u64]) -> Result<bool, MachineError> {
        let (a, b, mm) = self.reference();
        let n = self.n as usize;
        Ok(m.load_f32s(HOST, base[1], n * n)? == a
            && m.load_f32s(HOST, base[2], n)? == b
            && m.load_f32s(HOST, base[0], n * n)? == mm)
    }
}
