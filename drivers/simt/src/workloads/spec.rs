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

use crate::kernel::{Kernel, Op, WarpIo, WarpProgram, LOAD_REGS};
use crate::occupancy::KernelResources;
use std::sync::Arc;

/// Most operands one step loads.
pub const MAX_OPS: usize = 9;

/// Iterations a warp loads before it uses them (see the module documentation).
pub const UNROLL: u64 = 4;

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
    /// Fold iteration `k`'s operands into the four accumulators.
    fn fold(&self, t: u64, k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]);
    /// Where thread `t` stores its result (`None`: the thread does nothing).
    fn out(&self, t: u64) -> Option<u64>;
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
    acc: [[f32; 4]; 32],
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
            acc: [[0.0; 4]; 32],
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
        let mut active = 0u32;
        for l in 0..lanes {
            if self.spec.out(base + l).is_some() {
                active |= 1 << l;
            }
        }
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
        w.acc = [[0.0; 4]; 32];
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
                        let (spec, base, active) = (&self.spec, self.base, self.active);
                        let k = self.k + (r / ops) as u64;
                        let lanes = io.lanes_of(active, |l| spec.addr(base + l as u64, k, r % ops));
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
                    let (spec, base, k, batch) = (&self.spec, self.base, self.k, self.batch);
                    let (loaded, acc) = (&self.loaded, &mut self.acc);
                    WarpIo::each_lane(self.active, |l| {
                        for j in 0..batch as usize {
                            let mut v = [0f32; MAX_OPS];
                            for (op, x) in v.iter_mut().enumerate().take(ops) {
                                let r = j * ops + op;
                                if loaded[r] & (1 << l) != 0 {
                                    *x = f32::from_bits(io.regs[r][l]);
                                }
                            }
                            spec.fold(base + l as u64, k + j as u64, &mut acc[l], &v);
                        }
                    });
                    let cycles = self.spec.cycles() * self.batch as u32;
                    self.k += self.batch;
                    self.reg = 0;
                    self.phase = Phase::Load;
                    return Op::Compute(cycles);
                }
                Phase::Store => {
                    let (spec, base, active) = (&self.spec, self.base, self.active);
                    io.lanes_of(active, |l| spec.out(base + l as u64));
                    let (value, acc) = (&mut io.value, &self.acc);
                    WarpIo::each_lane(io.mask, |l| {
                        value[l] = spec.result(base + l as u64, &acc[l]).to_bits();
                    });
                    self.phase = Phase::Done;
                    return Op::Store;
                }
                Phase::Done => return Op::Exit,
            }
        }
    }
}
