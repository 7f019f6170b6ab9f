//! Thread-per-output kernels described by a [`Spec`]: each thread runs `steps`
//! iterations, each loading a few operands and folding them into four accumulators,
//! then stores one result. ATAX, BICG, MVT, GESUMMV, 2DCONV, vector add, SGEMM and
//! hotspot are all of this shape (the Polybench-GPU and Rodinia CUDA versions).

use crate::kernel::{Kernel, Op, WarpIo, WarpProgram};
use crate::occupancy::KernelResources;
use std::sync::Arc;

/// Most operands one step loads.
pub const MAX_OPS: usize = 9;

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
    Store,
    Done,
}

/// The warp program of a [`SpecKernel`].
pub struct SpecWarp<S> {
    spec: Arc<S>,
    base: u64,
    active: u32,
    k: u64,
    op: usize,
    pending: Option<usize>,
    phase: Phase,
    acc: [[f32; 4]; 32],
    vals: [[f32; MAX_OPS]; 32],
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
            op: 0,
            pending: None,
            phase: Phase::Done,
            acc: [[0.0; 4]; 32],
            vals: [[0.0; MAX_OPS]; 32],
        };
        self.rewarp(&mut w, block, warp);
        w
    }
    fn rewarp(&self, w: &mut SpecWarp<S>, block: u64, warp: u32) {
        let base = block * u64::from(self.threads_per_block) + u64::from(warp) * 32;
        let mut active = 0u32;
        for l in 0..32u64 {
            let t = base + l;
            if t < self.spec.threads()
                && (l as u32) < self.threads_per_block - warp * 32
                && self.spec.out(t).is_some()
            {
                active |= 1 << l;
            }
        }
        w.base = base;
        w.active = active;
        w.k = 0;
        w.op = 0;
        w.pending = None;
        w.phase = if active == 0 {
            Phase::Done
        } else {
            Phase::Load
        };
        // `vals` needs no reset: every active lane's operand is written before a fold
        // reads it.
        w.acc = [[0.0; 4]; 32];
    }
}

impl<S: Spec> WarpProgram for SpecWarp<S> {
    fn next(&mut self, io: &mut WarpIo) -> Op {
        if let Some(op) = self.pending.take() {
            let mut m = io.mask;
            while m != 0 {
                let l = m.trailing_zeros() as usize;
                m &= m - 1;
                self.vals[l][op] = io.f32(l);
            }
            // An active thread that skipped this operand reads 0.
            let mut z = self.active & !io.mask;
            while z != 0 {
                let l = z.trailing_zeros() as usize;
                z &= z - 1;
                self.vals[l][op] = 0.0;
            }
        }
        loop {
            match self.phase {
                Phase::Load => {
                    if self.k == self.spec.steps() {
                        self.phase = Phase::Store;
                        continue;
                    }
                    if self.op < self.spec.operands() {
                        let op = self.op;
                        self.op += 1;
                        let (spec, base, k, active) = (&self.spec, self.base, self.k, self.active);
                        if io.lanes_of(active, |l| spec.addr(base + l as u64, k, op)) {
                            self.pending = Some(op);
                            return Op::Load;
                        }
                        let mut z = active;
                        while z != 0 {
                            let l = z.trailing_zeros() as usize;
                            z &= z - 1;
                            self.vals[l][op] = 0.0;
                        }
                        continue;
                    }
                    let mut m = self.active;
                    while m != 0 {
                        let l = m.trailing_zeros() as usize;
                        m &= m - 1;
                        self.spec.fold(
                            self.base + l as u64,
                            self.k,
                            &mut self.acc[l],
                            &self.vals[l],
                        );
                    }
                    self.k += 1;
                    self.op = 0;
                    return Op::Compute(self.spec.cycles());
                }
                Phase::Store => {
                    let (spec, base, active) = (&self.spec, self.base, self.active);
                    io.lanes(|l| {
                        (active & (1 << l) != 0)
                            .then(|| spec.out(base + l as u64))
                            .flatten()
                    });
                    for l in 0..32 {
                        if io.active(l) {
                            io.value[l] = self
                                .spec
                                .result(self.base + l as u64, &self.acc[l])
                                .to_bits();
                        }
                    }
                    self.phase = Phase::Done;
                    return Op::Store;
                }
                Phase::Done => return Op::Exit,
            }
        }
    }
}
