//! The functional ground truth: an interpreter that runs a kernel for every thread of
//! every block on real bytes, with no notion of time.
//!
//! Threads of a block execute in lockstep, one instruction for all threads before the
//! next (control flow is uniform — loop trip counts are the same for every thread, which
//! the interpreter checks — so lockstep is a legal schedule and `BAR.SYNC` holds
//! trivially). [`exec`] is the per-thread semantics of one instruction; the cycle-level
//! simulator calls it too, so both agree on *what* an instruction does and differ only in
//! *when*.
//!
//! Inputs are random words drawn from a seeded generator ([`init_global`]); a variant is
//! correct when its final global memory is bit-identical to the baseline's.

use crate::ir::{InputKind, Inst, Kernel, Op, Special, Src};

/// Why execution stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecError {
    /// A global access outside memory or unaligned; the byte address.
    Global(u32),
    /// A shared access outside the block's allocation; the byte address.
    Shared(u32),
    /// A local access outside the thread's allocation; the byte offset.
    Local(u32),
    /// A pair operand given as an immediate.
    BadOperand,
    /// Threads of one block disagree on a loop branch.
    Divergent {
        /// Block index.
        block: usize,
    },
    /// More than the step limit of instructions executed (a runaway loop).
    StepLimit,
}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for ExecError {}

/// What one thread sees besides its registers.
pub struct LaneCtx<'a> {
    /// Thread index in the block.
    pub tid: u32,
    /// Block index.
    pub ctaid: u32,
    /// Threads per block.
    pub ntid: u32,
    /// Global memory.
    pub global: &'a mut [u32],
    /// The block's shared memory.
    pub shared: &'a mut [u32],
    /// The thread's local memory.
    pub local: &'a mut [u32],
}

fn word(mem: &[u32], byte: u32) -> Option<usize> {
    let i = (byte / 4) as usize;
    (byte % 4 == 0 && i < mem.len()).then_some(i)
}

/// Execute `inst` for one thread (everything but the branch decision of `LoopBr`).
///
/// # Errors
/// [`ExecError`] for an out-of-range or unaligned access or a malformed operand; the
/// registers and memory are then unchanged.
pub fn exec(inst: &Inst, regs: &mut [u32], ctx: &mut LaneCtx<'_>) -> Result<(), ExecError> {
    let v = |k: usize| -> u32 {
        match inst.srcs.get(k) {
            Some(Src::R(r)) => regs[usize::from(*r)],
            Some(Src::I(x)) => *x,
            None => 0,
        }
    };
    let f = |k: usize| f32::from_bits(v(k));
    let d64 = |k: usize| -> Result<f64, ExecError> {
        match inst.srcs.get(k) {
            Some(Src::R(r)) => {
                let r = usize::from(*r);
                Ok(f64::from_bits(
                    u64::from(regs[r]) | (u64::from(regs[r + 1]) << 32),
                ))
            }
            _ => Err(ExecError::BadOperand),
        }
    };
    let one = |x: u32| Some((x, None));
    let two = |x: f64| {
        let b = x.to_bits();
        Some((b as u32, Some((b >> 32) as u32)))
    };
    let result: Option<(u32, Option<u32>)> = match inst.op {
        Op::Mov => one(v(0)),
        Op::IAdd => one(v(0).wrapping_add(v(1))),
        Op::IMul => one(v(0).wrapping_mul(v(1))),
        Op::IMad => one(v(0).wrapping_mul(v(1)).wrapping_add(v(2))),
        Op::Shl => one(v(0) << (v(1) & 31)),
        Op::Shr => one(v(0) >> (v(1) & 31)),
        Op::And => one(v(0) & v(1)),
        Op::Xor => one(v(0) ^ v(1)),
        Op::FAdd => one((f(0) + f(1)).to_bits()),
        Op::FMul => one((f(0) * f(1)).to_bits()),
        Op::FFma => one(f(0).mul_add(f(1), f(2)).to_bits()),
        Op::FRsq => one((1.0 / f(0).sqrt()).to_bits()),
        Op::DAdd => two(d64(0)? + d64(1)?),
        Op::DMul => two(d64(0)? * d64(1)?),
        Op::DFma => two(d64(0)?.mul_add(d64(1)?, d64(2)?)),
        Op::Pack => Some((v(0), Some(v(1)))),
        Op::S2R(s) => one(match s {
            Special::Tid => ctx.tid,
            Special::CtaId => ctx.ctaid,
            Special::NTid => ctx.ntid,
        }),
        Op::Ldg => {
            let a = v(0).wrapping_add(inst.off);
            one(ctx.global[word(ctx.global, a).ok_or(ExecError::Global(a))?])
        }
        Op::Stg => {
            let a = v(0).wrapping_add(inst.off);
            let i = word(ctx.global, a).ok_or(ExecError::Global(a))?;
            ctx.global[i] = v(1);
            None
        }
        Op::Lds => {
            let a = v(0).wrapping_add(inst.off);
            one(ctx.shared[word(ctx.shared, a).ok_or(ExecError::Shared(a))?])
        }
        Op::Sts => {
            let a = v(0).wrapping_add(inst.off);
            let i = word(ctx.shared, a).ok_or(ExecError::Shared(a))?;
            ctx.shared[i] = v(1);
            None
        }
        Op::Ldl => one(ctx.local[word(ctx.local, inst.off).ok_or(ExecError::Local(inst.off))?]),
        Op::Stl => {
            let i = word(ctx.local, inst.off).ok_or(ExecError::Local(inst.off))?;
            ctx.local[i] = v(0);
            None
        }
        Op::Bar | Op::LoopBr { .. } => None,
    };
    if let (Some(d), Some((lo, hi))) = (inst.dst, result) {
        let d = usize::from(d);
        regs[d] = lo;
        if let Some(h) = hi {
            regs[d + 1] = h;
        }
    }
    Ok(())
}

/// A deterministic generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

/// Global memory for `k` with its input ranges filled from `seed`.
pub fn init_global(k: &Kernel, seed: u64) -> Vec<u32> {
    let mut g = vec![0u32; k.global_words as usize];
    let mut rng = Rng::new(seed);
    for &(start, len) in &k.inputs {
        let mut i = start as usize;
        let end = (start + len) as usize;
        while i < end && i < g.len() {
            match k.input_kind {
                InputKind::F32 => {
                    g[i] = (rng.unit() as f32).to_bits();
                    i += 1;
                }
                InputKind::F64 => {
                    let b = rng.unit().to_bits();
                    g[i] = b as u32;
                    if i + 1 < end {
                        g[i + 1] = (b >> 32) as u32;
                    }
                    i += 2;
                }
            }
        }
    }
    g
}

/// The output words of `k` from a final global memory image.
pub fn outputs(k: &Kernel, global: &[u32]) -> Vec<u32> {
    k.outputs
        .iter()
        .flat_map(|&(s, l)| global[s as usize..(s + l) as usize].iter().copied())
        .collect()
}

/// Run every block of `k` over `global` (modified in place).
///
/// # Errors
/// The first [`ExecError`]; `global` may then hold partial results.
pub fn run(k: &Kernel, global: &mut [u32]) -> Result<(), ExecError> {
    let nregs = (k.registers() as usize).max(1);
    let t = k.threads_per_block as usize;
    let local_words = (k.local_bytes as usize).div_ceil(4);
    let step_limit: u64 = 1 << 28;
    let mut steps = 0u64;
    for cta in 0..k.grid_blocks {
        let mut shared = vec![0u32; (k.shared_bytes() as usize).div_ceil(4)];
        let mut regs = vec![0u32; t * nregs];
        let mut local = vec![0u32; t * local_words];
        let (mut b, mut i) = (0usize, 0usize);
        while b < k.blocks.len() {
            let Some(inst) = k.blocks[b].insts.get(i) else {
                b += 1;
                i = 0;
                continue;
            };
            steps += 1;
            if steps > step_limit {
                return Err(ExecError::StepLimit);
            }
            if let Op::LoopBr { target, trips } = inst.op {
                let c = match inst.srcs.first() {
                    Some(Src::R(r)) => usize::from(*r),
                    _ => return Err(ExecError::BadOperand),
                };
                let taken = regs[c] < trips;
                if (0..t).any(|th| (regs[th * nregs + c] < trips) != taken) {
                    return Err(ExecError::Divergent { block: b });
                }
                if taken {
                    b = target;
                    i = 0;
                } else {
                    b += 1;
                    i = 0;
                }
                continue;
            }
            for th in 0..t {
                let mut ctx = LaneCtx {
                    tid: th as u32,
                    ctaid: cta,
                    ntid: k.threads_per_block,
                    global: &mut *global,
                    shared: &mut shared,
                    local: &mut local[th * local_words..(th + 1) * local_words],
                };
                exec(inst, &mut regs[th * nregs..(th + 1) * nregs], &mut ctx)?;
            }
            i += 1;
        }
    }
    Ok(())
}

/// Run `k` on inputs from `seed` and return its output words.
///
/// # Errors
/// The first [`ExecError`].
pub fn run_outputs(k: &Kernel, seed: u64) -> Result<Vec<u32>, ExecError> {
    let mut g = init_global(k, seed);
    run(k, &mut g)?;
    Ok(outputs(k, &g))
}
