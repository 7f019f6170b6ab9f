//! A small kernel language: a builder over virtual registers, a register allocator and
//! the scheduler, producing a [`Kernel`] the way nvcc produces a SASS binary.
//!
//! Kernels are written as straight-line code and counted loops
//! ([`Builder::loop_begin`] / [`Builder::loop_end`]); a virtual register may be
//! reassigned (`*_to` forms), which is how loop-carried accumulators are written. The
//! allocator computes liveness over virtual registers, turns each into one interval over
//! the layout order (reads at an instruction happen before its writes, so a value dying
//! at an instruction may share a register with that instruction's result), and assigns
//! the lowest free register (an even-aligned pair for FP64 values) by linear scan — a
//! tight allocation, so the kernel's register count is close to its maximum pressure,
//! like nvcc's default allocation (no `--maxrregcount`).

use crate::ir::{Block, InputKind, Inst, IrError, Kernel, Op, Reg, Special, Src};
use crate::liveness::{Flow, Liveness};
use crate::sched;

/// A virtual register (a 32-bit value or an f64 pair).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct V(u32);

/// An operand in the kernel language.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VSrc {
    /// A whole virtual register.
    V(V),
    /// The low word of a pair.
    Lo(V),
    /// The high word of a pair.
    Hi(V),
    /// An immediate.
    I(u32),
}

impl From<V> for VSrc {
    fn from(v: V) -> VSrc {
        VSrc::V(v)
    }
}

impl From<u32> for VSrc {
    fn from(x: u32) -> VSrc {
        VSrc::I(x)
    }
}

impl From<f32> for VSrc {
    fn from(x: f32) -> VSrc {
        VSrc::I(x.to_bits())
    }
}

#[derive(Clone, Debug)]
struct VInst {
    op: Op,
    dst: Option<V>,
    srcs: Vec<VSrc>,
    off: u32,
}

/// An open loop.
#[derive(Clone, Copy, Debug)]
pub struct Loop {
    header: usize,
    counter: V,
    trips: u32,
}

/// Builds a kernel.
#[derive(Clone, Debug)]
pub struct Builder {
    name: String,
    widths: Vec<u8>,
    blocks: Vec<Vec<VInst>>,
    open: usize,
    /// Threads per block.
    pub threads_per_block: u32,
    /// Blocks in the grid.
    pub grid_blocks: u32,
    /// Static shared memory per block, bytes.
    pub static_shared: u32,
    /// Global memory words.
    pub global_words: u32,
    /// Input word ranges.
    pub inputs: Vec<(u32, u32)>,
    /// Output word ranges.
    pub outputs: Vec<(u32, u32)>,
    /// Input distribution.
    pub input_kind: InputKind,
}

impl Builder {
    /// A new kernel named `name` with `threads_per_block` threads and `grid_blocks` blocks.
    pub fn new(name: &str, threads_per_block: u32, grid_blocks: u32) -> Builder {
        Builder {
            name: name.to_string(),
            widths: Vec::new(),
            blocks: vec![Vec::new()],
            open: 0,
            threads_per_block,
            grid_blocks,
            static_shared: 0,
            global_words: 0,
            inputs: Vec::new(),
            outputs: Vec::new(),
            input_kind: InputKind::F32,
        }
    }

    /// A fresh 32-bit virtual register.
    pub fn reg(&mut self) -> V {
        self.widths.push(1);
        V(self.widths.len() as u32 - 1)
    }

    /// A fresh f64 pair.
    pub fn pair(&mut self) -> V {
        self.widths.push(2);
        V(self.widths.len() as u32 - 1)
    }

    /// Emit `op` writing the existing register `dst`.
    pub fn op_to(&mut self, dst: V, op: Op, srcs: &[VSrc]) {
        self.emit(op, Some(dst), srcs, 0);
    }

    /// Emit `op` into a fresh register (a pair for FP64 ops and `Pack`).
    pub fn op(&mut self, op: Op, srcs: &[VSrc]) -> V {
        let d = if op.pair_operands() || op == Op::Pack {
            self.pair()
        } else {
            self.reg()
        };
        self.op_to(d, op, srcs);
        d
    }

    fn emit(&mut self, op: Op, dst: Option<V>, srcs: &[VSrc], off: u32) {
        self.blocks
            .last_mut()
            .expect("a builder always has a current block")
            .push(VInst {
                op,
                dst,
                srcs: srcs.to_vec(),
                off,
            });
    }

    /// `d = special`.
    pub fn s2r(&mut self, s: Special) -> V {
        self.op(Op::S2R(s), &[])
    }
    /// `d = x` (an immediate or a register).
    pub fn mov(&mut self, x: impl Into<VSrc>) -> V {
        self.op(Op::Mov, &[x.into()])
    }
    /// `d = a + b`.
    pub fn iadd(&mut self, a: impl Into<VSrc>, b: impl Into<VSrc>) -> V {
        self.op(Op::IAdd, &[a.into(), b.into()])
    }
    /// `dst = a + b`.
    pub fn iadd_to(&mut self, dst: V, a: impl Into<VSrc>, b: impl Into<VSrc>) {
        self.op_to(dst, Op::IAdd, &[a.into(), b.into()]);
    }
    /// `d = a * b + c`.
    pub fn imad(&mut self, a: impl Into<VSrc>, b: impl Into<VSrc>, c: impl Into<VSrc>) -> V {
        self.op(Op::IMad, &[a.into(), b.into(), c.into()])
    }
    /// `d = a << s`.
    pub fn shl(&mut self, a: impl Into<VSrc>, s: u32) -> V {
        self.op(Op::Shl, &[a.into(), VSrc::I(s)])
    }
    /// `d = a * b + c` (f32).
    pub fn ffma(&mut self, a: impl Into<VSrc>, b: impl Into<VSrc>, c: impl Into<VSrc>) -> V {
        self.op(Op::FFma, &[a.into(), b.into(), c.into()])
    }
    /// `dst = a * b + c` (f32).
    pub fn ffma_to(&mut self, dst: V, a: impl Into<VSrc>, b: impl Into<VSrc>, c: impl Into<VSrc>) {
        self.op_to(dst, Op::FFma, &[a.into(), b.into(), c.into()]);
    }
    /// `d = a + b` (f32).
    pub fn fadd(&mut self, a: impl Into<VSrc>, b: impl Into<VSrc>) -> V {
        self.op(Op::FAdd, &[a.into(), b.into()])
    }
    /// `d = a * b` (f32).
    pub fn fmul(&mut self, a: impl Into<VSrc>, b: impl Into<VSrc>) -> V {
        self.op(Op::FMul, &[a.into(), b.into()])
    }
    /// `d = 1/sqrt(a)` (f32).
    pub fn frsq(&mut self, a: impl Into<VSrc>) -> V {
        self.op(Op::FRsq, &[a.into()])
    }
    /// `d = a * b + c` (f64 pairs).
    pub fn dfma(&mut self, a: V, b: V, c: V) -> V {
        self.op(Op::DFma, &[a.into(), b.into(), c.into()])
    }
    /// `d = a + b` (f64 pairs).
    pub fn dadd(&mut self, a: V, b: V) -> V {
        self.op(Op::DAdd, &[a.into(), b.into()])
    }
    /// `d = a * b` (f64 pairs).
    pub fn dmul(&mut self, a: V, b: V) -> V {
        self.op(Op::DMul, &[a.into(), b.into()])
    }
    /// A pair from two words.
    pub fn pack(&mut self, lo: impl Into<VSrc>, hi: impl Into<VSrc>) -> V {
        self.op(Op::Pack, &[lo.into(), hi.into()])
    }
    /// An f64 constant as a pair (two moves and a pack, as nvcc materialises it).
    pub fn dconst(&mut self, x: f64) -> V {
        let bits = x.to_bits();
        self.pack(VSrc::I(bits as u32), VSrc::I((bits >> 32) as u32))
    }
    /// `d = global[addr + off]`.
    pub fn ldg(&mut self, addr: V, off: u32) -> V {
        let d = self.reg();
        self.emit(Op::Ldg, Some(d), &[addr.into()], off);
        d
    }
    /// `dst = global[addr]` into an existing register.
    pub fn ldg_to(&mut self, dst: V, addr: V) {
        self.emit(Op::Ldg, Some(dst), &[addr.into()], 0);
    }
    /// `global[addr + off] = v`.
    pub fn stg(&mut self, addr: V, off: u32, v: impl Into<VSrc>) {
        self.emit(Op::Stg, None, &[addr.into(), v.into()], off);
    }
    /// `d = shared[addr + off]`.
    pub fn lds(&mut self, addr: V, off: u32) -> V {
        let d = self.reg();
        self.emit(Op::Lds, Some(d), &[addr.into()], off);
        d
    }
    /// `dst = shared[addr + off]`.
    pub fn lds_to(&mut self, dst: V, addr: V, off: u32) {
        self.emit(Op::Lds, Some(dst), &[addr.into()], off);
    }
    /// `shared[addr + off] = v`.
    pub fn sts(&mut self, addr: V, off: u32, v: impl Into<VSrc>) {
        self.emit(Op::Sts, None, &[addr.into(), v.into()], off);
    }
    /// Block-wide barrier.
    pub fn bar(&mut self) {
        self.emit(Op::Bar, None, &[], 0);
    }

    /// Open a loop of `trips` iterations: a counter set to 0, then a new block (the
    /// header).
    pub fn loop_begin(&mut self, trips: u32) -> Loop {
        let counter = self.mov(0u32);
        self.blocks.push(Vec::new());
        self.open += 1;
        Loop {
            header: self.blocks.len() - 1,
            counter,
            trips,
        }
    }

    /// Close `l`: increment the counter and branch back.
    pub fn loop_end(&mut self, l: Loop) {
        self.iadd_to(l.counter, l.counter, 1u32);
        self.emit(
            Op::LoopBr {
                target: l.header,
                trips: l.trips,
            },
            None,
            &[l.counter.into()],
            0,
        );
        self.blocks.push(Vec::new());
        self.open = self.open.saturating_sub(1);
    }

    /// Allocate registers, schedule, and return the kernel.
    ///
    /// # Errors
    /// [`IrError::UnbalancedLoop`] if a loop is still open, [`IrError::OutOfRegisters`]
    /// if more than 255 registers would be needed, or a structural [`IrError`] from
    /// [`Kernel::validate`].
    pub fn finish(mut self) -> Result<Kernel, IrError> {
        if self.open != 0 {
            return Err(IrError::UnbalancedLoop);
        }
        while self.blocks.len() > 1 && self.blocks.last().is_some_and(|b| b.is_empty()) {
            self.blocks.pop();
        }
        let assign = self.allocate()?;
        let phys = |v: V| assign[v.0 as usize];
        let blocks = self
            .blocks
            .iter()
            .map(|b| Block {
                insts: b
                    .iter()
                    .map(|vi| {
                        let srcs = vi
                            .srcs
                            .iter()
                            .map(|s| match *s {
                                VSrc::V(v) | VSrc::Lo(v) => Src::R(phys(v)),
                                VSrc::Hi(v) => Src::R(phys(v) + 1),
                                VSrc::I(x) => Src::I(x),
                            })
                            .collect();
                        Inst::new(vi.op, vi.dst.map(phys), srcs, vi.off)
                    })
                    .collect(),
            })
            .collect();
        let mut k = Kernel {
            name: self.name,
            blocks,
            threads_per_block: self.threads_per_block,
            grid_blocks: self.grid_blocks,
            static_shared: self.static_shared,
            spill_shared: 0,
            local_bytes: 0,
            global_words: self.global_words,
            inputs: self.inputs,
            outputs: self.outputs,
            input_kind: self.input_kind,
        };
        sched::schedule(&mut k);
        k.validate()?;
        Ok(k)
    }

    /// Linear-scan allocation over liveness intervals.
    fn allocate(&self) -> Result<Vec<Reg>, IrError> {
        let vref = |s: &VSrc| match *s {
            VSrc::V(v) | VSrc::Lo(v) | VSrc::Hi(v) => Some(v.0 as usize),
            VSrc::I(_) => None,
        };
        let mut succs = Vec::new();
        for (b, blk) in self.blocks.iter().enumerate() {
            let mut s = Vec::new();
            if b + 1 < self.blocks.len() {
                s.push(b + 1);
            }
            if let Some(VInst {
                op: Op::LoopBr { target, .. },
                ..
            }) = blk.last()
            {
                s.push(*target);
            }
            succs.push(s);
        }
        let flow = Flow {
            names: self.widths.len(),
            blocks: self
                .blocks
                .iter()
                .map(|b| {
                    b.iter()
                        .map(|vi| {
                            (
                                vi.srcs.iter().filter_map(vref).collect(),
                                vi.dst.iter().map(|d| d.0 as usize).collect(),
                            )
                        })
                        .collect()
                })
                .collect(),
            succs,
        };
        let live = Liveness::analyze(&flow);
        // Points: instruction p reads at 2p and writes at 2p + 1.
        let n = self.widths.len();
        let mut lo = vec![u64::MAX; n];
        let mut hi = vec![0u64; n];
        let mut touch = |v: usize, pt: u64| {
            lo[v] = lo[v].min(pt);
            hi[v] = hi[v].max(pt);
        };
        let mut p = 0u64;
        for (b, blk) in flow.blocks.iter().enumerate() {
            let start = 2 * p;
            for v in live.live_in[b].iter() {
                touch(v, start);
            }
            for (reads, writes) in blk {
                for &r in reads {
                    touch(r, 2 * p);
                }
                for &w in writes {
                    touch(w, 2 * p + 1);
                }
                p += 1;
            }
            let end = 2 * p;
            for v in live.live_out[b].iter() {
                touch(v, end);
            }
        }
        let mut order: Vec<usize> = (0..n).filter(|&v| lo[v] != u64::MAX).collect();
        order.sort_by_key(|&v| (lo[v], std::cmp::Reverse(self.widths[v])));
        let mut assign = vec![0 as Reg; n];
        let mut busy_until = [None::<u64>; 255];
        for v in order {
            for slot in busy_until.iter_mut() {
                if matches!(*slot, Some(e) if e < lo[v]) {
                    *slot = None;
                }
            }
            let w = usize::from(self.widths[v]);
            let step = w;
            let r = (0..=255 - w)
                .step_by(step)
                .find(|&r| (r..r + w).all(|x| busy_until[x].is_none()))
                .ok_or(IrError::OutOfRegisters)?;
            for slot in busy_until.iter_mut().skip(r).take(w) {
                *slot = Some(hi[v]);
            }
            assign[v] = r as Reg;
        }
        Ok(assign)
    }
}
