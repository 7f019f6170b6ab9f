//! Thread-per-output kernels described by a [`Spec`]: each thread runs `steps`
//! iterations, each loading a few operands and folding them into four accumulators,
//! then stores one result. ATAX, BICG, MVT, GESUMMV, 2DCONV, vector add, SGEMM and
//! hotspot are all of this shape (the Polybench-GPU and Rodinia CUDA versions).
//!
//! ## Unrolled as a compiler does
//! A warp runs its iterations [`UNROLL`] at a time, as the code nvcc emits for these
//! loops: it issues the operand loads of the whole batch ([`Op::LoadTo`], none of
//! them waits), then waits once ([`Op::Wait`], the first use of a loaded value) and
//! folds the batch. The factor is 4 for every workload: 4 is the factor nvcc applies
//! by default to a loop whose trip count is not a compile-time constant (Polybench's
//! and Rodinia's loops over `n`) — recalled, not checked against NVIDIA's text. Only
//! the register budget cuts it: a batch loads at most [`LOAD_REGS`] values, so a step
//! of 6 operands runs 2 at a time and one of 9 (2DCONV) one at a time (its 9 loads
//! still issue before their use). Never chosen per design or per workload.
//!
//! ## Lanes at once
//! A warp's per-lane work (addresses, folds, results) runs as loops over the 32 lanes
//! on plain arrays (accumulators stored lane-major, a lane's body inlined), which the
//! compiler vectorises when the spec's functions are simple. A spec whose operand or
//! output address is affine in the thread id ([`Affine`]) may say so
//! ([`Spec::affine`], [`Spec::out_affine`]): the warp then writes its lane addresses
//! as `start + stride·lane` without calling [`Spec::addr`] per lane. Every declaration
//! is checked against [`Spec::addr`] / [`Spec::out`] over the warp's lanes in debug
//! builds, so a wrong one fails the tests; the addresses, hence the model's results,
//! are the same either way.

use crate::coalesce::LANES;
use crate::kernel::{Kernel, Op, WarpIo, WarpProgram, LOAD_REGS};
use crate::occupancy::KernelResources;
use std::sync::Arc;

/// Most operands one step loads.
pub const MAX_OPS: usize = 9;

/// Iterations a warp loads before it uses them (see the module documentation).
pub const UNROLL: u64 = 4;

/// An address affine in the thread id: thread `t`'s address is `base + stride·t`
/// (wrapping arithmetic, as the lanes' addresses are formed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Affine {
    /// Thread 0's address.
    pub base: u64,
    /// Bytes between consecutive threads' addresses.
    pub stride: u64,
}

impl Affine {
    /// Thread `t`'s address.
    #[inline(always)]
    pub fn at(self, t: u64) -> u64 {
        self.base.wrapping_add(self.stride.wrapping_mul(t))
    }
}

/// A thread-per-output kernel.
pub trait Spec: Send + Sync + 'static {
    /// Threads (outputs).
    fn threads(&self) -> u64;
    /// Iterations per thread.
    fn steps(&self) -> u64;
    /// Operands loaded per iteration (at most [`MAX_OPS`]).
    fn operands(&self) -> usize;
    /// Address of operand `op` of iteration `k` of thread `t` (`None`: not loaded, 0).
    fn addr(&self, t: u64, k: u64, op: usize) -> Option<u64>;
    /// Operand `op` of iteration `k` as an [`Affine`] address, if it is one: `Some(a)`
    /// promises `addr(t, k, op) == Some(a.at(t))` for every thread `t` whose
    /// [`Spec::out`] is `Some` (checked in debug builds). The default, `None`, makes
    /// the warp call [`Spec::addr`] per lane.
    fn affine(&self, k: u64, op: usize) -> Option<Affine> {
        let _ = (k, op);
        None
    }
    /// Fold iteration `k`'s operands into the four accumulators.
    fn fold(&self, t: u64, k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]);
    /// Where thread `t` stores its result (`None`: the thread does nothing).
    fn out(&self, t: u64) -> Option<u64>;
    /// [`Spec::out`] as an [`Affine`] address, if it is one: `Some(a)` promises
    /// `out(t) == Some(a.at(t))` for every thread `t` below [`Spec::threads`] (checked
    /// in debug builds). The default, `None`, makes the warp call [`Spec::out`] per
    /// lane.
    fn out_affine(&self) -> Option<Affine> {
        None
    }
    /// The value stored.
    fn result(&self, t: u64, acc: &[f32; 4]) -> f32 {
        let _ = t;
        acc[0]
    }
    /// ALU cycles per iteration.
    fn cycles(&self) -> u32 {
        4
    }
}

/// A [`Spec`] launched with `threads_per_block` threads per block.
pub struct SpecKernel<S> {
    /// The spec.
    pub spec: Arc<S>,
    /// Threads per block.
    pub threads_per_block: u32,
    /// Registers per thread (for occupancy).
    pub registers: u32,
}

impl<S: Spec> SpecKernel<S> {
    /// Launch `spec` in blocks of 256 threads using 32 registers each.
    pub fn new(spec: S) -> SpecKernel<S> {
        SpecKernel {
            spec: Arc::new(spec),
            threads_per_block: 256,
            registers: 32,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Load,
    Fold,
    Store,
    Done,
}

/// The warp program of a [`SpecKernel`].
pub struct SpecWarp<S> {
    spec: Arc<S>,
    base: u64,
    active: u32,
    /// First iteration of the batch.
    k: u64,
    /// Iterations in the batch.
    batch: u64,
    /// Next register of the batch to load (iteration `j`, operand `op` is `j·ops + op`).
    reg: usize,
    /// Lanes each register was loaded for (the others read 0).
    loaded: [u32; LOAD_REGS],
    phase: Phase,
    /// Accumulator `i` of lane `l` is `acc[i][l]` (lane-major, so a loop over the
    /// lanes reads and writes each accumulator contiguously). Valid once the first
    /// batch has been folded (`k > 0`); before, every accumulator is 0.
    acc: [[f32; LANES]; 4],
}

impl<S: Spec> Kernel for SpecKernel<S> {
    type Warp = SpecWarp<S>;
    fn blocks(&self) -> u64 {
        self.spec
            .threads()
            .div_ceil(u64::from(self.threads_per_block))
    }
    fn resources(&self) -> KernelResources {
        KernelResources {
            threads_per_block: self.threads_per_block,
            registers_per_thread: self.registers,
            shared_bytes_per_block: 0,
        }
    }
    fn warp(&self, block: u64, warp: u32) -> SpecWarp<S> {
        let mut w = SpecWarp {
            spec: self.spec.clone(),
            base: 0,
            active: 0,
            k: 0,
            batch: 0,
            reg: 0,
            loaded: [0; LOAD_REGS],
            phase: Phase::Done,
            acc: [[0.0; LANES]; 4],
        };
        self.rewarp(&mut w, block, warp);
        w
    }
    fn rewarp(&self, w: &mut SpecWarp<S>, block: u64, warp: u32) {
        let base = block * u64::from(self.threads_per_block) + u64::from(warp) * 32;
        // Lanes below `lanes` are threads of the grid and of the block.
        let lanes = self
            .spec
            .threads()
            .saturating_sub(base)
            .min(u64::from(self.threads_per_block.saturating_sub(warp * 32)))
            .min(32);
        let active = if let Some(a) = self.spec.out_affine() {
            // Every thread of the grid stores.
            debug_assert!(
                (base..base + lanes).all(|t| self.spec.out(t) == Some(a.at(t))),
                "Spec::out_affine disagrees with Spec::out"
            );
            u32::MAX.checked_shr(32 - lanes as u32).unwrap_or(0)
        } else {
            let mut active = 0u32;
            for l in 0..lanes {
                if self.spec.out(base + l).is_some() {
                    active |= 1 << l;
                }
            }
            active
        };
        w.base = base;
        w.active = active;
        w.k = 0;
        w.batch = 0;
        w.reg = 0;
        w.phase = if active == 0 {
            Phase::Done
        } else {
            Phase::Load
        };
        // `acc` is not cleared: the first fold starts from 0 (`k == 0`).
    }
}

/// Set every lane's address to `a.at(base + lane)` and the mask to `active` (the
/// lanes off the mask get addresses too; nothing reads them). A loop over the lanes
/// without branches.
#[inline(always)]
fn affine_lanes(io: &mut WarpIo, a: Affine, base: u64, active: u32) {
    // Written for all 32 lanes (a lane outside `active` is masked off, its address
    // unread), and declared affine to the coalescer for a full warp.
    io.set_affine(a.at(base), a.stride);
    if active != u32::MAX {
        io.mask = active;
        io.stride = 0;
    }
}

/// Set each lane of `candidates` to `f(lane)`'s address, the mask to the lanes where
/// it is `Some`; returns whether any is. [`WarpIo::lanes_of`] inlined here, so that
/// `f` (a spec's `addr` or `out`) is inlined into the loop over the lanes.
#[inline(always)]
fn spec_lanes(io: &mut WarpIo, candidates: u32, f: impl Fn(usize) -> Option<u64>) -> bool {
    // The mask in a local: written through `io` it would be stored every lane.
    let mut mask = 0u32;
    let mut lane = |l: usize| {
        if let Some(a) = f(l) {
            io.addr[l] = a;
            mask |= 1 << l;
        }
    };
    if candidates == u32::MAX {
        (0..LANES).for_each(&mut lane);
    } else {
        WarpIo::each_lane(candidates, &mut lane);
    }
    io.mask = mask;
    io.stride = 0;
    mask != 0
}

/// Lanes a full warp folds at a time: their 4 accumulators fit in 8 SSE registers.
const FOLD_GROUP: usize = 8;

/// Fold iteration `k` (registers `r0..r0 + ops`, each 0 in the lanes its load left
/// out) into lane `l`'s accumulators. `fresh`: the lane's accumulators start from 0
/// (its first iteration). Inlined into a loop over the lanes, where it runs without
/// branches: every operand slot is read (`% LOAD_REGS` keeps the read in bounds) and
/// the slots past `ops` are then set to 0.
#[inline(always)]
fn fold_lane<S: Spec>(
    spec: &S,
    (t, k, l): (u64, u64, usize),
    (r0, ops): (usize, usize),
    regs: &[[u32; LANES]; LOAD_REGS],
    acc: &mut [[f32; LANES]; 4],
    fresh: bool,
) {
    let v: [f32; MAX_OPS] = std::array::from_fn(|op| {
        let bits = regs[(r0 + op) % LOAD_REGS][l];
        f32::from_bits(if op < ops { bits } else { 0 })
    });
    let mut a = if fresh {
        [0.0; 4]
    } else {
        [acc[0][l], acc[1][l], acc[2][l], acc[3][l]]
    };
    spec.fold(t, k, &mut a, &v);
    for (i, x) in a.into_iter().enumerate() {
        acc[i][l] = x;
    }
}

impl<S: Spec> WarpProgram for SpecWarp<S> {
    fn next(&mut self, io: &mut WarpIo) -> Op {
        let ops = self.spec.operands();
        loop {
            match self.phase {
                Phase::Load => {
                    if self.reg == 0 {
                        if self.k == self.spec.steps() {
                            self.phase = Phase::Store;
                            continue;
                        }
                        let fit = (LOAD_REGS / ops.max(1)).max(1) as u64;
                        self.batch = UNROLL.min(fit).min(self.spec.steps() - self.k);
                    }
                    if self.reg < self.batch as usize * ops {
                        let r = self.reg;
                        self.reg += 1;
                        let (spec, base, active) = (&*self.spec, self.base, self.active);
                        let (k, op) = (self.k + (r / ops) as u64, r % ops);
                        let lanes = match spec.affine(k, op) {
                            Some(a) => {
                                affine_lanes(io, a, base, active);
                                debug_assert!(
                                    (0..LANES).all(|l| active & (1 << l) == 0
                                        || spec.addr(base + l as u64, k, op) == Some(io.addr[l])),
                                    "Spec::affine({k}, {op}) disagrees with Spec::addr"
                                );
                                true
                            }
                            None => spec_lanes(io, active, |l| spec.addr(base + l as u64, k, op)),
                        };
                        self.loaded[r] = io.mask;
                        if lanes {
                            return Op::LoadTo(r as u8);
                        }
                        continue;
                    }
                    self.phase = Phase::Fold;
                    if self.loaded[..self.reg].iter().any(|&m| m != 0) {
                        return Op::Wait;
                    }
                }
                Phase::Fold => {
                    let (spec, base, k0, batch) = (&*self.spec, self.base, self.k, self.batch);
                    let (active, regs) = (self.active, &mut io.regs);
                    // A lane a load left out reads 0: clear it in the register (the
                    // engine reads no register lane; it only writes the loaded ones).
                    for (reg, &m) in regs.iter_mut().zip(&self.loaded[..self.reg]) {
                        if m != u32::MAX {
                            WarpIo::each_lane(!m, |l| reg[l] = 0);
                        }
                    }
                    let (regs, acc) = (&*regs, &mut self.acc);
                    if active == u32::MAX {
                        // Straight loops over the lanes, vectorised when the spec's fold
                        // is simple; a group of lanes at a time, whose accumulators stay
                        // in registers through the batch.
                        for g in (0..LANES).step_by(FOLD_GROUP) {
                            for j in 0..batch as usize {
                                let (k, rs) = (k0 + j as u64, (j * ops, ops));
                                for l in g..g + FOLD_GROUP {
                                    let at = (base + l as u64, k, l);
                                    fold_lane(spec, at, rs, regs, acc, k == 0);
                                }
                            }
                        }
                    } else {
                        for j in 0..batch as usize {
                            let (k, rs) = (k0 + j as u64, (j * ops, ops));
                            WarpIo::each_lane(active, |l| {
                                fold_lane(spec, (base + l as u64, k, l), rs, regs, acc, k == 0);
                            });
                        }
                    }
                    let cycles = self.spec.cycles() * self.batch as u32;
                    self.k += self.batch;
                    self.reg = 0;
                    self.phase = Phase::Load;
                    return Op::Compute(cycles);
                }
                Phase::Store => {
                    let (spec, base, active) = (&*self.spec, self.base, self.active);
                    match spec.out_affine() {
                        Some(a) => {
                            affine_lanes(io, a, base, active);
                            debug_assert!(
                                (0..LANES).all(|l| active & (1 << l) == 0
                                    || spec.out(base + l as u64) == Some(io.addr[l])),
                                "Spec::out_affine disagrees with Spec::out"
                            );
                        }
                        None => {
                            spec_lanes(io, active, |l| spec.out(base + l as u64));
                        }
                    }
                    // With no iteration folded, every accumulator is 0.
                    let folded = self.k > 0;
                    let (value, acc) = (&mut io.value, &self.acc);
                    let result = |l: usize| {
                        let a = if folded {
                            [acc[0][l], acc[1][l], acc[2][l], acc[3][l]]
                        } else {
                            [0.0; 4]
                        };
                        spec.result(base + l as u64, &a).to_bits()
                    };
                    if io.mask == u32::MAX {
                        for (l, x) in value.iter_mut().enumerate() {
                            *x = result(l);
                        }
                    } else {
                        WarpIo::each_lane(io.mask, |l| value[l] = result(l));
                    }
                    self.phase = Phase::Done;
                    return Op::Store;
                }
                Phase::Done => return Op::Exit,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::RunStats;
    use crate::machine::SimtMachine;

    /// 300 threads (the last warp has 12 lanes); thread `t`, step `k` loads
    /// `a[t·row + k]` and `a[k]`, every fifth thread stores nothing unless `all`, and
    /// the addresses are declared affine when `affine` (`wrong`: with a stride off by
    /// one word).
    struct Walk {
        a: u64,
        c: u64,
        row: u64,
        all: bool,
        affine: bool,
        wrong: bool,
    }

    const N: u64 = 300;
    const STEPS: u64 = 6;

    impl Spec for Walk {
        fn threads(&self) -> u64 {
            N
        }
        fn steps(&self) -> u64 {
            STEPS
        }
        fn operands(&self) -> usize {
            2
        }
        fn addr(&self, t: u64, k: u64, op: usize) -> Option<u64> {
            Some(match op {
                0 => self.a + 4 * (t * self.row + k),
                _ => self.a + 4 * k,
            })
        }
        fn affine(&self, k: u64, op: usize) -> Option<Affine> {
            let off = u64::from(self.wrong) * 4;
            self.affine.then_some(match op {
                0 => Affine {
                    base: self.a + 4 * k,
                    stride: 4 * self.row + off,
                },
                _ => Affine {
                    base: self.a + 4 * k,
                    stride: 0,
                },
            })
        }
        fn fold(&self, t: u64, k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
            acc[0] += v[0] * v[1] + (t % 3) as f32;
            acc[1] += k as f32;
        }
        fn out(&self, t: u64) -> Option<u64> {
            (self.all || t % 5 != 0).then_some(self.c + 4 * t)
        }
        fn out_affine(&self) -> Option<Affine> {
            (self.all && self.affine).then_some(Affine {
                base: self.c,
                stride: 4,
            })
        }
        fn result(&self, _t: u64, acc: &[f32; 4]) -> f32 {
            acc[0] - acc[1]
        }
    }

    fn launch(row: u64, all: bool, affine: bool, wrong: bool) -> (RunStats, Vec<f32>) {
        let len = N * row + STEPS;
        let m = SimtMachine::mesc(2 * len / 1024 + 64).unwrap();
        let data: Vec<f32> = (0..len).map(|i| (i % 89) as f32).collect();
        let a = m.upload_f32(&data).unwrap();
        let c = m.upload_f32(&vec![-1.0; N as usize]).unwrap();
        let w = Walk {
            a: a.start.as_u64(),
            c: c.start.as_u64(),
            row,
            all,
            affine,
            wrong,
        };
        let st = m.launch(&SpecKernel::new(w)).unwrap();
        (st, m.download_f32(c, N as usize).unwrap())
    }

    /// Declaring the addresses affine changes nothing the model reports: the same
    /// statistics and stored values, which match a reference computed here.
    #[test]
    fn affine_declarations_give_the_plain_results() {
        for row in [1, 64, 1024] {
            for all in [false, true] {
                let plain = launch(row, all, false, false);
                let affine = launch(row, all, true, false);
                assert_eq!(plain, affine, "row {row}, all {all}");
                for (t, &got) in plain.1.iter().enumerate() {
                    let t = t as u64;
                    let want = if all || t % 5 != 0 {
                        let (mut a0, mut a1) = (0f32, 0f32);
                        for k in 0..STEPS {
                            let v0 = ((t * row + k) % 89) as f32;
                            a0 += v0 * (k % 89) as f32 + (t % 3) as f32;
                            a1 += k as f32;
                        }
                        a0 - a1
                    } else {
                        -1.0
                    };
                    assert_eq!(got, want, "thread {t}, row {row}, all {all}");
                }
            }
        }
    }

    /// A declaration that disagrees with `addr` fails in a debug build.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "disagrees with Spec::addr")]
    fn a_wrong_affine_declaration_is_caught() {
        launch(16, true, true, true);
    }
}
