//! The kernel representation: a grid of thread blocks whose warps are programs that
//! yield warp instructions.
//!
//! A [`Kernel`] says how many blocks it has, what one block needs (for occupancy) and
//! makes the [`WarpProgram`] of each warp. The engine calls [`WarpProgram::next`]
//! whenever the warp may issue; the program fills the [`WarpIo`] (32 lane addresses, an
//! active mask, store values) and returns the [`Op`]. After a load the engine puts each
//! active lane's 32-bit value in [`WarpIo::value`] before the next call, so programs
//! can branch on loaded data (BFS, PageRank). Divergence is the active mask: lanes a
//! branch excludes sit out the instruction, and a warp whose lanes take different
//! paths runs both, one after the other, as hardware does.
//!
//! ## Scoreboarding
//! [`Op::Load`] blocks the warp until its data arrives: the form for a load whose
//! value the very next instruction needs, e.g. to form an address (BFS, PageRank). A
//! GPU does not otherwise wait at a load: the warp issues on and stalls only at the
//! first instruction that reads the loaded register (GPGPU-Sim's scoreboard, which the
//! MESC paper's gem5-gpu uses). [`Op::LoadTo`] is that load: it names one of
//! [`LOAD_REGS`] registers, the warp goes on issuing, and [`Op::Wait`] marks the first
//! use — the warp stalls there until every load since the previous wait has its data;
//! the values are then in [`WarpIo::regs`]. Values are exact whatever the timing: the
//! engine moves a load's bytes before the warp passes its wait. Each register is
//! loaded at most once between two waits, and a warp waits before it exits (else
//! [`crate::engine::SimtError::Register`]).

use crate::coalesce::LANES;
use crate::occupancy::KernelResources;

/// Registers an [`Op::LoadTo`] may name: 16 of the 32 registers a thread of the
/// workloads is given for occupancy (the rest hold addresses, indices and
/// accumulators).
pub const LOAD_REGS: usize = 16;

/// What a warp does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Load 4 bytes at each active lane's `io.addr` into `io.value`; the warp waits
    /// for the data before its next instruction.
    Load,
    /// Load 4 bytes at each active lane's `io.addr` into register `io.regs[r]` without
    /// waiting: the warp issues on until its next [`Op::Wait`].
    LoadTo(u8),
    /// Stall until every [`Op::LoadTo`] since the previous wait has its data (the first
    /// use of a loaded register). Not an instruction: it takes no issue slot.
    Wait,
    /// Store each active lane's `io.value` at its `io.addr`.
    Store,
    /// Arithmetic for this many cycles (no memory access).
    Compute(u32),
    /// The warp is done.
    Exit,
}

/// A warp instruction's operands and, after a load, its results.
///
/// A new warp starts with no active lane ([`WarpIo::mask`] 0) and no affine
/// declaration ([`WarpIo::set_affine`]); the other fields hold whatever an earlier warp
/// left there (the engine reuses register files within a
/// launch and, through `Launch::spare_io`, across launches). Nothing reads them
/// before they are written: the engine reads a lane's address and store value only
/// for a lane of the mask the program set for that instruction, and writes a load's
/// value (or register) for exactly those lanes; a program reads a lane of
/// [`WarpIo::value`] or [`WarpIo::regs`] only after a load that had that lane active
/// (the crate's programs track the lanes of each register, as `SpecWarp`'s `loaded`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarpIo {
    /// Lane addresses.
    pub addr: [u64; LANES],
    /// Store values in, load values out (raw 32-bit words; `f32::to_bits` for floats).
    pub value: [u32; LANES],
    /// Active lanes (bit `i` = lane `i`).
    pub mask: u32,
    /// The registers [`Op::LoadTo`] fills, each a value per lane (valid after the
    /// [`Op::Wait`] that follows the load).
    pub regs: [[u32; LANES]; LOAD_REGS],
    /// A declaration for the next memory instruction: non-zero `s` says all 32 lanes
    /// are active at `addr[0] + s·l` (written so by [`WarpIo::set_affine`]), so the
    /// engine's coalescer skips its per-lane check; 0 declares nothing. The engine
    /// clears it when it takes a memory instruction; [`WarpIo::lanes`] and
    /// [`WarpIo::lanes_of`] clear it too.
    pub(crate) stride: u64,
}

impl Default for WarpIo {
    fn default() -> WarpIo {
        WarpIo {
            addr: [0; LANES],
            value: [0; LANES],
            mask: 0,
            regs: [[0; LANES]; LOAD_REGS],
            stride: 0,
        }
    }
}

impl WarpIo {
    /// Set each active lane's address with `f(lane)`; lanes where `f` gives `None` are
    /// masked off. Returns whether any lane is active.
    pub fn lanes(&mut self, mut f: impl FnMut(usize) -> Option<u64>) -> bool {
        // The mask in a local: written through `self` it would be stored every lane.
        let mut mask = 0u32;
        for l in 0..LANES {
            if let Some(a) = f(l) {
                self.addr[l] = a;
                mask |= 1 << l;
            }
        }
        self.mask = mask;
        self.stride = 0;
        mask != 0
    }

    /// All 32 lanes active, lane `l` at `start + stride·l` (wrapping), declared so for
    /// the coalescer (which then skips its per-lane check; a run that wraps or is
    /// unaligned still takes the general path, with its error).
    #[inline(always)]
    pub fn set_affine(&mut self, start: u64, stride: u64) {
        if stride == 4 {
            // The coalesced access: constant offsets, which the compiler adds two lanes
            // at a time (the induction below stays scalar for a stride known only at
            // run time; a 64-bit multiply per lane would be emulated in SSE2).
            for (l, a) in self.addr.iter_mut().enumerate() {
                *a = start.wrapping_add(4 * l as u64);
            }
        } else {
            let mut x = start;
            for a in self.addr.iter_mut() {
                *a = x;
                x = x.wrapping_add(stride);
            }
        }
        self.mask = u32::MAX;
        self.stride = stride;
    }

    /// [`WarpIo::lanes`] over the lanes of `candidates` only (the others are masked
    /// off without calling `f`).
    pub fn lanes_of(&mut self, candidates: u32, mut f: impl FnMut(usize) -> Option<u64>) -> bool {
        if candidates == u32::MAX {
            // Every lane a candidate: one straight loop over the lanes (no bit scan),
            // which the compiler unrolls around an inlined `f`.
            return self.lanes(f);
        }
        let mut mask = 0;
        let mut c = candidates;
        while c != 0 {
            let l = c.trailing_zeros() as usize;
            c &= c - 1;
            if let Some(a) = f(l) {
                self.addr[l] = a;
                mask |= 1 << l;
            }
        }
        self.mask = mask;
        self.stride = 0;
        mask != 0
    }

    /// Call `f` for each lane of `mask` in ascending order (a straight loop when all 32
    /// are set).
    pub fn each_lane(mask: u32, mut f: impl FnMut(usize)) {
        if mask == u32::MAX {
            for l in 0..LANES {
                f(l);
            }
            return;
        }
        let mut m = mask;
        while m != 0 {
            let l = m.trailing_zeros() as usize;
            m &= m - 1;
            f(l);
        }
    }

    /// Lane `l`'s value as an `f32`.
    pub fn f32(&self, l: usize) -> f32 {
        f32::from_bits(self.value[l])
    }

    /// Whether lane `l` is active.
    pub fn active(&self, l: usize) -> bool {
        self.mask & (1 << l) != 0
    }
}

/// The program of one warp.
pub trait WarpProgram {
    /// The next instruction; `io.value` holds the last [`Op::Load`]'s values, and
    /// after an [`Op::Wait`] `io.regs` holds the registers loaded before it.
    fn next(&mut self, io: &mut WarpIo) -> Op;
}

/// A kernel launch.
pub trait Kernel {
    /// The warp program type.
    type Warp: WarpProgram;
    /// Thread blocks in the grid.
    fn blocks(&self) -> u64;
    /// What one block needs.
    fn resources(&self) -> KernelResources;
    /// The program of warp `warp` of block `block`.
    fn warp(&self, block: u64, warp: u32) -> Self::Warp;
    /// Turn `prog`, a finished warp of this kernel, into the program of warp `warp` of
    /// block `block` (the engine reuses a slot's storage). The default replaces it
    /// with [`Kernel::warp`]; a kernel with large warp state may reset it in place.
    fn rewarp(&self, prog: &mut Self::Warp, block: u64, warp: u32) {
        *prog = self.warp(block, warp);
    }
}
