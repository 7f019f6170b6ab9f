//! A SASS-like IR: physical 32-bit registers and aligned pairs, basic blocks, counted
//! loops, and Maxwell-style control information on every instruction.
//!
//! # Model
//! A [`Kernel`] is a list of basic blocks in layout order. Control leaves a block by
//! falling through to the next one or, when its last instruction is [`Op::LoopBr`], by
//! jumping back to the loop header `trips - 1` times (the loop counter is an ordinary
//! register, so it costs register pressure like it does in real SASS). Loop trip counts
//! are uniform across threads, so warps never diverge; the interpreter checks this.
//!
//! Registers are `R0..R254`, 32 bits wide. FP64 instructions ([`Op::DAdd`], [`Op::DMul`],
//! [`Op::DFma`]) and [`Op::Pack`] name an aligned pair by its even register (`R8` means
//! `R8:R9`); every other instruction reads and writes single registers, so the two
//! halves of a pair can be stored or read one by one. The kernel's register count is the
//! highest register number used plus one (§3.1 (5)).
//!
//! Each instruction carries [`Ctrl`], the Maxwell control word (§3.1 (4)): a stall count
//! (cycles before the warp may issue its next instruction; it must cover the fixed
//! latency of ALU results), an optional write barrier (set until a variable-latency
//! result is written), an optional read barrier (set until its source registers have
//! been read), and a wait mask of barriers that must be clear before it issues. Six
//! barriers exist per warp and they are counters: several instructions may set one, and
//! waiting on it waits for all of them.
//!
//! Memory spaces: *global* (byte addresses into one word array shared by all threads),
//! *shared* (per thread block; the kernel's static allocation first, then the demotion
//! area of Eq. 1), and *local* (per thread, interleaved across a warp's lanes like CUDA
//! local memory, so a warp's spill access is coalesced).

/// A physical register number.
pub type Reg = u8;

/// An operand: a register or a 32-bit immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Src {
    /// A register (the even half of a pair for FP64 operands).
    R(Reg),
    /// An immediate.
    I(u32),
}

/// Special registers readable with [`Op::S2R`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Special {
    /// Thread index within the block.
    Tid,
    /// Block index within the grid.
    CtaId,
    /// Threads per block.
    NTid,
}

/// Operations. Integer ops wrap; `F*` are IEEE f32 on register bits, `D*` IEEE f64 on
/// pairs (low word in the even register).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `d = a`.
    Mov,
    /// `d = a + b`.
    IAdd,
    /// `d = a * b`.
    IMul,
    /// `d = a * b + c`.
    IMad,
    /// `d = a << (b & 31)`.
    Shl,
    /// `d = a >> (b & 31)` (logical).
    Shr,
    /// `d = a & b`.
    And,
    /// `d = a ^ b`.
    Xor,
    /// `d = a + b` (f32).
    FAdd,
    /// `d = a * b` (f32).
    FMul,
    /// `d = a * b + c` (f32, fused).
    FFma,
    /// `d = 1 / sqrt(a)` (f32, correctly rounded sqrt then division; a special-function
    /// unit instruction).
    FRsq,
    /// `d:d+1 = a + b` (f64 pairs).
    DAdd,
    /// `d:d+1 = a * b` (f64 pairs).
    DMul,
    /// `d:d+1 = a * b + c` (f64 pairs, fused).
    DFma,
    /// `d:d+1 = (a, b)`: builds a pair from two single registers.
    Pack,
    /// `d = special register`.
    S2R(Special),
    /// `d = global[a + off]`.
    Ldg,
    /// `global[a + off] = b`.
    Stg,
    /// `d = shared[a + off]`.
    Lds,
    /// `shared[a + off] = b`.
    Sts,
    /// `d = local[off]` (the thread's own local memory).
    Ldl,
    /// `local[off] = a`.
    Stl,
    /// Block-wide barrier (`BAR.SYNC`).
    Bar,
    /// `if a < trips { goto target }` — the loop's back edge; `a` is the loop counter,
    /// set to 0 before the loop and incremented at the end of the body.
    LoopBr {
        /// The loop header block.
        target: usize,
        /// Iterations of the loop.
        trips: u32,
    },
}

/// What kind of unit executes an instruction; variable-latency classes need barriers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Integer / FP32 ALU (fixed latency).
    Alu,
    /// Special-function unit (variable latency on Maxwell, low throughput).
    Sfu,
    /// FP64 unit (variable latency on Maxwell).
    Fp64,
    /// Special-register read (variable latency).
    S2r,
    /// Global memory.
    Global,
    /// Shared memory.
    Shared,
    /// Local memory (spills).
    Local,
    /// Block barrier.
    Sync,
    /// Branch.
    Branch,
}

impl Op {
    /// The unit class.
    pub fn class(&self) -> Class {
        match self {
            Op::Mov
            | Op::IAdd
            | Op::IMul
            | Op::IMad
            | Op::Shl
            | Op::Shr
            | Op::And
            | Op::Xor
            | Op::FAdd
            | Op::FMul
            | Op::FFma
            | Op::Pack => Class::Alu,
            Op::FRsq => Class::Sfu,
            Op::DAdd | Op::DMul | Op::DFma => Class::Fp64,
            Op::S2R(_) => Class::S2r,
            Op::Ldg | Op::Stg => Class::Global,
            Op::Lds | Op::Sts => Class::Shared,
            Op::Ldl | Op::Stl => Class::Local,
            Op::Bar => Class::Sync,
            Op::LoopBr { .. } => Class::Branch,
        }
    }

    /// Whether results arrive after a variable delay (tracked with barriers, not stall
    /// counts).
    pub fn variable_latency(&self) -> bool {
        matches!(
            self.class(),
            Class::Sfu | Class::Fp64 | Class::S2r | Class::Global | Class::Shared | Class::Local
        )
    }

    /// Whether every register operand (destination and sources) is an aligned pair.
    pub fn pair_operands(&self) -> bool {
        matches!(self, Op::DAdd | Op::DMul | Op::DFma)
    }

    /// Whether the instruction stores to memory.
    pub fn is_store(&self) -> bool {
        matches!(self, Op::Stg | Op::Sts | Op::Stl)
    }
}

/// Maxwell control information (§3.1 (4)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ctrl {
    /// Cycles before this warp may issue its next instruction (1..=15; 0 is treated as 1).
    pub stall: u8,
    /// Barrier set until the destination is written.
    pub wr_bar: Option<u8>,
    /// Barrier set until the source registers have been read.
    pub rd_bar: Option<u8>,
    /// Barriers (bit mask over 0..6) that must be clear before issue.
    pub wait: u8,
}

/// Where an instruction came from (for statistics and the optimisations of §3.4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// The input kernel.
    Kernel,
    /// A demoted load of spill word `.0` (shared or local memory).
    SpillLoad(u16),
    /// A demoted store of spill word `.0`.
    SpillStore(u16),
    /// Setup code added by a pass (the RDA address computation).
    Setup,
}

impl Origin {
    /// Whether this instruction is spill code added by a pass.
    pub fn is_spill(&self) -> bool {
        matches!(self, Origin::SpillLoad(_) | Origin::SpillStore(_))
    }
}

/// One instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inst {
    /// The operation.
    pub op: Op,
    /// The destination register (the even register of a pair for pair results).
    pub dst: Option<Reg>,
    /// Source operands, in the order documented on [`Op`].
    pub srcs: Vec<Src>,
    /// Immediate address offset for memory operations.
    pub off: u32,
    /// Control word.
    pub ctrl: Ctrl,
    /// Provenance.
    pub origin: Origin,
}

impl Inst {
    /// A new instruction with an empty control word and `Origin::Kernel`.
    pub fn new(op: Op, dst: Option<Reg>, srcs: Vec<Src>, off: u32) -> Inst {
        Inst {
            op,
            dst,
            srcs,
            off,
            ctrl: Ctrl::default(),
            origin: Origin::Kernel,
        }
    }

    /// Width in registers of the destination.
    pub fn dst_width(&self) -> u8 {
        if self.op.pair_operands() || self.op == Op::Pack {
            2
        } else {
            1
        }
    }

    /// Width in registers of register sources.
    pub fn src_width(&self) -> u8 {
        if self.op.pair_operands() {
            2
        } else {
            1
        }
    }

    /// Every 32-bit register read.
    pub fn reads(&self) -> Vec<Reg> {
        let w = self.src_width();
        let mut v = Vec::with_capacity(self.srcs.len() * usize::from(w));
        for s in &self.srcs {
            if let Src::R(r) = *s {
                for k in 0..w {
                    v.push(r + k);
                }
            }
        }
        v
    }

    /// Every 32-bit register written.
    pub fn writes(&self) -> Vec<Reg> {
        match self.dst {
            Some(d) => (0..self.dst_width()).map(|k| d + k).collect(),
            None => Vec::new(),
        }
    }

    /// Registers used as the even half of a pair operand.
    pub fn pair_bases(&self) -> Vec<Reg> {
        let mut v = Vec::new();
        if self.dst_width() == 2 {
            v.extend(self.dst);
        }
        if self.src_width() == 2 {
            for s in &self.srcs {
                if let Src::R(r) = *s {
                    v.push(r);
                }
            }
        }
        v
    }

    /// Rename every register operand through `f` (applied to a pair's even register).
    pub fn rename(&mut self, f: &dyn Fn(Reg) -> Reg) {
        if let Some(d) = self.dst {
            self.dst = Some(f(d));
        }
        for s in &mut self.srcs {
            if let Src::R(r) = *s {
                *s = Src::R(f(r));
            }
        }
    }
}

/// A basic block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Block {
    /// Instructions in order; a [`Op::LoopBr`] may only be last.
    pub insts: Vec<Inst>,
}

/// A kernel with its launch shape and memory layout.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// Name for reports.
    pub name: String,
    /// Basic blocks in layout order; execution starts at block 0.
    pub blocks: Vec<Block>,
    /// Threads per block (a multiple of 32).
    pub threads_per_block: u32,
    /// Blocks in the grid.
    pub grid_blocks: u32,
    /// Static shared memory per block, bytes (the kernel's own use).
    pub static_shared: u32,
    /// Shared memory added for demoted registers per block, bytes (Eq. 1's area).
    pub spill_shared: u32,
    /// Local memory per thread, bytes (off-chip spills).
    pub local_bytes: u32,
    /// Global memory size in 32-bit words.
    pub global_words: u32,
    /// Word ranges `(start, len)` filled with random inputs.
    pub inputs: Vec<(u32, u32)>,
    /// Word ranges `(start, len)` holding the results.
    pub outputs: Vec<(u32, u32)>,
    /// How input words are drawn (floats in [-1, 1) or small integers).
    pub input_kind: InputKind,
}

/// The distribution of random input words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// f32 values in [-1, 1).
    F32,
    /// f64 values in [-1, 1), written as (low, high) word pairs.
    F64,
}

impl Kernel {
    /// Registers per thread: the highest register used plus one (0 if none).
    pub fn registers(&self) -> u32 {
        let mut top: Option<u32> = None;
        for i in self.insts() {
            for r in i.reads().into_iter().chain(i.writes()) {
                top = Some(top.map_or(u32::from(r), |t: u32| t.max(u32::from(r))));
            }
        }
        top.map_or(0, |t| t + 1)
    }

    /// Total shared memory per block (static plus demotion area), bytes.
    pub fn shared_bytes(&self) -> u32 {
        self.static_shared.div_ceil(4) * 4 + self.spill_shared
    }

    /// All instructions in layout order.
    pub fn insts(&self) -> impl Iterator<Item = &Inst> {
        self.blocks.iter().flat_map(|b| b.insts.iter())
    }

    /// How many times each block runs per thread (products of enclosing loop trips).
    pub fn block_trips(&self) -> Vec<u64> {
        let mut trips = vec![1u64; self.blocks.len()];
        for (b, blk) in self.blocks.iter().enumerate() {
            if let Some(Inst {
                op: Op::LoopBr { target, trips: t },
                ..
            }) = blk.insts.last()
            {
                for x in trips.iter_mut().take(b + 1).skip(*target) {
                    *x *= u64::from(*t);
                }
            }
        }
        trips
    }

    /// Loop nesting depth of each block.
    pub fn block_depth(&self) -> Vec<u32> {
        let mut depth = vec![0u32; self.blocks.len()];
        for (b, blk) in self.blocks.iter().enumerate() {
            if let Some(Inst {
                op: Op::LoopBr { target, .. },
                ..
            }) = blk.insts.last()
            {
                for x in depth.iter_mut().take(b + 1).skip(*target) {
                    *x += 1;
                }
            }
        }
        depth
    }

    /// Successor blocks of block `b` (fall-through and back edge).
    pub fn successors(&self, b: usize) -> Vec<usize> {
        let mut s = Vec::new();
        if b + 1 < self.blocks.len() {
            s.push(b + 1);
        }
        if let Some(Inst {
            op: Op::LoopBr { target, .. },
            ..
        }) = self.blocks[b].insts.last()
        {
            s.push(*target);
        }
        s
    }

    /// Check structural rules: loop branches last and pointing backwards, pairs aligned,
    /// registers in range, barriers below 6, block size a positive multiple of 32.
    ///
    /// # Errors
    /// [`IrError`] naming the first violation.
    pub fn validate(&self) -> Result<(), IrError> {
        if self.threads_per_block == 0 || self.threads_per_block % 32 != 0 {
            return Err(IrError::BlockSize(self.threads_per_block));
        }
        for (b, blk) in self.blocks.iter().enumerate() {
            for (i, inst) in blk.insts.iter().enumerate() {
                let at = (b, i);
                if let Op::LoopBr { target, trips } = inst.op {
                    if i + 1 != blk.insts.len() || target > b || trips == 0 {
                        return Err(IrError::BadBranch(at));
                    }
                }
                for r in inst.pair_bases() {
                    if r % 2 != 0 {
                        return Err(IrError::UnalignedPair(at));
                    }
                }
                for r in inst.reads().into_iter().chain(inst.writes()) {
                    if r == 255 {
                        return Err(IrError::RegisterRange(at));
                    }
                }
                let bars = [inst.ctrl.wr_bar, inst.ctrl.rd_bar];
                if bars.iter().flatten().any(|&x| x >= 6) || inst.ctrl.wait & 0xC0 != 0 {
                    return Err(IrError::BadBarrier(at));
                }
            }
        }
        Ok(())
    }
}

/// A structural error in a kernel; positions are `(block, instruction)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrError {
    /// Threads per block not a positive multiple of 32.
    BlockSize(u32),
    /// A loop branch not last in its block, jumping forwards, or with zero trips.
    BadBranch((usize, usize)),
    /// A pair operand on an odd register.
    UnalignedPair((usize, usize)),
    /// A register beyond R254.
    RegisterRange((usize, usize)),
    /// A barrier index of 6 or more.
    BadBarrier((usize, usize)),
    /// The builder ran out of registers.
    OutOfRegisters,
    /// A loop was closed that was not open, or left open.
    UnbalancedLoop,
    /// A kernel parameter out of its documented range.
    BadParameter,
}

impl std::fmt::Display for IrError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for IrError {}

impl std::fmt::Display for Inst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.ctrl;
        let bar = |b: Option<u8>| b.map_or("-".to_string(), |x| x.to_string());
        write!(
            f,
            "{:02x}:{}:{}:{:>2} ",
            c.wait,
            bar(c.rd_bar),
            bar(c.wr_bar),
            c.stall
        )?;
        write!(f, "{:?}", self.op)?;
        if let Some(d) = self.dst {
            write!(f, " R{d}")?;
        }
        for s in &self.srcs {
            match s {
                Src::R(r) => write!(f, ", R{r}")?,
                Src::I(v) => write!(f, ", {v:#x}")?,
            }
        }
        if self.off != 0 {
            write!(f, " +{:#x}", self.off)?;
        }
        Ok(())
    }
}
