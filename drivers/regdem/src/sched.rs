//! Control-word assignment: stall counts for fixed-latency dependences and scoreboard
//! barriers for variable-latency ones, with the paper's barrier tracker (§3.2).
//!
//! Two users: the kernel builder schedules a whole kernel from scratch (our stand-in for
//! nvcc's scheduler), and the demotion pass *repairs* a scheduled kernel after inserting
//! spill code — it keeps every existing control word and only adds barriers and waits for
//! hazards on the registers it touched (the value registers), as RegDem does when it
//! "updates the instruction schedule".
//!
//! # Rules (the ISA contract the simulator checks)
//! - A fixed-latency result (ALU) may be read [`FIXED_LATENCY`] cycles after issue; stall
//!   counts must cover the distance. [`fix_stalls`] raises the stall of the instruction
//!   before a reader that comes too early.
//! - A variable-latency result is read only after waiting on the producer's write
//!   barrier; a register read by a variable-latency instruction is overwritten only after
//!   waiting on that instruction's read barrier; a loop branch waits on every outstanding
//!   barrier (barriers are cleared before jumps, the property the tracker relies on).
//!
//! # The barrier tracker
//! [`Tracker`] records, per barrier, the latency class of the last instruction that set
//! it and the cycles (summed stall counts) since. `GetBarrier` returns a barrier no
//! instruction holds, else one whose setter is expected to have completed, else the one
//! with the least expected remaining wait. In repair mode it first avoids barriers that
//! the already-scheduled code sets or waits on between the new instruction and its
//! consumer (our addition: the paper's tracker looks only backwards, and sharing such a
//! barrier makes the consumer wait for unrelated, often long, work). Latency estimates
//! are the compiler's, not the
//! simulator's: [`GL_MEM_STALL`] = 200 and [`SH_MEM_STALL`] = 24 are the paper's values;
//! the FP64, SFU and S2R estimates are ours (the paper names only the two memory ones),
//! and so is [`READ_STALL`]: a read barrier clears when the sources are read, long before
//! a load's result returns.

use crate::ir::{Class, Inst, Kernel, Op, Origin, Reg};

/// Cycles before an ALU result can be read (the ISA's fixed latency).
pub const FIXED_LATENCY: u32 = 6;
/// The compiler's estimate of a global/local memory access (the paper's GL_MEM_STALL).
pub const GL_MEM_STALL: u32 = 200;
/// The compiler's estimate of a shared memory access (the paper's SH_MEM_STALL).
pub const SH_MEM_STALL: u32 = 24;
/// The compiler's estimate of an FP64 instruction (ours).
pub const FP64_STALL: u32 = 40;
/// The compiler's estimate of an SFU or S2R instruction (ours).
pub const SFU_STALL: u32 = 20;
/// The compiler's estimate of a *read* barrier: sources are read when the instruction is
/// dispatched to its unit, a few cycles after issue, whatever its result latency (ours).
pub const READ_STALL: u32 = 4;

/// The compiler's latency estimate for an instruction class.
pub fn estimate(class: Class) -> u32 {
    match class {
        Class::Global | Class::Local => GL_MEM_STALL,
        Class::Shared => SH_MEM_STALL,
        Class::Fp64 => FP64_STALL,
        Class::Sfu | Class::S2r => SFU_STALL,
        Class::Alu | Class::Sync | Class::Branch => FIXED_LATENCY,
    }
}

/// How new barriers are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierPolicy {
    /// The paper's tracker.
    Tracker,
    /// Always the same barrier (the ablation without a tracker).
    Fixed(u8),
}

/// The barrier tracker of §3.2 (`UpdateBarrierTracker` / `GetBarrier`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Tracker {
    /// Per barrier: (estimated latency of its last setter, cycles since it was set).
    state: [Option<(u32, u32)>; 6],
}

impl Tracker {
    /// `b` was set as the write barrier of an instruction of latency class `class`.
    pub fn set(&mut self, b: u8, class: Class) {
        self.set_estimate(b, estimate(class));
    }
    /// `b` was set by an instruction expected to release it after `est` cycles.
    pub fn set_estimate(&mut self, b: u8, est: u32) {
        let s = &mut self.state[usize::from(b)];
        // A counter barrier already in use completes with its slowest setter.
        *s = Some(match *s {
            Some((l, e)) if l.saturating_sub(e) > est => (l, e),
            _ => (est, 0),
        });
    }
    /// Everything on `mask` has been waited for.
    pub fn clear(&mut self, mask: u8) {
        for b in 0..6 {
            if mask & (1 << b) != 0 {
                self.state[b] = None;
            }
        }
    }
    /// `cycles` passed (the stall count of the instruction just placed).
    pub fn advance(&mut self, cycles: u32) {
        for (_, e) in self.state.iter_mut().flatten() {
            *e += cycles;
        }
    }
    /// Expected cycles until `b` clears.
    pub fn remaining(&self, b: u8) -> u32 {
        self.state[usize::from(b)].map_or(0, |(l, e)| l.saturating_sub(e))
    }
    /// `GetBarrier()`: a free barrier, else the one with the least expected wait.
    pub fn get(&self, policy: BarrierPolicy) -> u8 {
        self.get_avoiding(policy, 0)
    }

    /// `GetBarrier()` preferring barriers outside `avoid` (those the already-scheduled
    /// code sets or waits on before this instruction's consumer: sharing them would make
    /// the consumer wait for unrelated work, or that work wait for ours).
    pub fn get_avoiding(&self, policy: BarrierPolicy, avoid: u8) -> u8 {
        match policy {
            BarrierPolicy::Fixed(b) => b,
            BarrierPolicy::Tracker => {
                let ok = |b: u8| avoid & (1 << b) == 0;
                let free = |b: u8| self.state[usize::from(b)].is_none();
                if let Some(b) = (0..6u8).find(|&b| ok(b) && free(b)) {
                    return b;
                }
                if let Some(b) = (0..6u8)
                    .filter(|&b| ok(b))
                    .min_by_key(|&b| (self.remaining(b), b))
                {
                    return b;
                }
                if let Some(b) = (0..6u8).find(|&b| free(b)) {
                    return b;
                }
                (0..6u8)
                    .min_by_key(|&b| (self.remaining(b), b))
                    .unwrap_or(0)
            }
        }
    }
}

/// Set every stall count to at least 1 and raise stalls so each fixed-latency result is
/// read no earlier than [`FIXED_LATENCY`] cycles after its producer issued. A loop
/// branch also waits out every fixed-latency result in flight (its header may read it).
pub fn fix_stalls(k: &mut Kernel) {
    let mut ready = [0u32; 256];
    let mut pos = 0u32;
    let mut prev: Option<(usize, usize)> = None;
    for b in 0..k.blocks.len() {
        for i in 0..k.blocks[b].insts.len() {
            let inst = &k.blocks[b].insts[i];
            let need = inst
                .reads()
                .iter()
                .map(|&r| ready[usize::from(r)])
                .max()
                .unwrap_or(0);
            if need > pos {
                if let Some((pb, pi)) = prev {
                    let s = &mut k.blocks[pb].insts[pi].ctrl.stall;
                    *s = s.saturating_add((need - pos) as u8);
                }
                pos = need;
            }
            let inst = &mut k.blocks[b].insts[i];
            inst.ctrl.stall = inst.ctrl.stall.max(1);
            let fixed = !inst.op.variable_latency();
            for w in inst.writes() {
                ready[usize::from(w)] = if fixed { pos + FIXED_LATENCY } else { 0 };
            }
            pos += u32::from(inst.ctrl.stall);
            if let Op::LoopBr { .. } = inst.op {
                let last = ready.iter().copied().max().unwrap_or(0);
                if last > pos {
                    inst.ctrl.stall = inst.ctrl.stall.saturating_add((last - pos) as u8);
                }
                ready = [0; 256];
                pos = 0;
            }
            prev = Some((b, i));
        }
    }
}

/// Which hazards [`assign_barriers`] handles and how.
#[derive(Clone, Copy)]
pub struct AssignOptions<'a> {
    /// Registers whose hazards are handled (all registers for a full schedule).
    pub scope: &'a dyn Fn(Reg) -> bool,
    /// Keep existing control words (repair mode) instead of rebuilding them.
    pub keep_existing: bool,
    /// How new barriers are chosen.
    pub policy: BarrierPolicy,
    /// Deliberately omit the wait for spill-load results (a broken pass, for tests
    /// that show the simulator's poisoned-read check catches it).
    pub broken_skip_spill_load_waits: bool,
}

/// Assign write/read barriers and wait masks for hazards on registers in `opt.scope`.
/// Run [`fix_stalls`] first: the tracker counts stall cycles.
pub fn assign_barriers(k: &mut Kernel, opt: &AssignOptions<'_>) {
    // Pass 1 (backwards): which variable-latency instructions have a scoped source that
    // is overwritten later (after a loop branch: by the loop body or the code after it).
    let linear: Vec<(usize, usize)> = k
        .blocks
        .iter()
        .enumerate()
        .flat_map(|(b, blk)| (0..blk.insts.len()).map(move |i| (b, i)))
        .collect();
    let mut needs_rd = vec![false; linear.len()];
    let mut written_later = [false; 256];
    for (n, &(b, i)) in linear.iter().enumerate().rev() {
        let inst = &k.blocks[b].insts[i];
        if let Op::LoopBr { target, .. } = inst.op {
            // After the branch comes either the code after the loop (already in the set)
            // or the loop body again: add everything the body writes.
            for blk in &k.blocks[target..=b] {
                for w in blk.insts.iter().flat_map(|x| x.writes()) {
                    if (opt.scope)(w) {
                        written_later[usize::from(w)] = true;
                    }
                }
            }
        }
        needs_rd[n] = inst.op.variable_latency()
            && inst
                .reads()
                .iter()
                .any(|&r| (opt.scope)(r) && written_later[usize::from(r)]);
        for w in inst.writes() {
            if (opt.scope)(w) {
                written_later[usize::from(w)] = true;
            }
        }
    }
    // Pass 2 (forwards).
    let mut pending_w: [Option<(u8, bool)>; 256] = [None; 256];
    let mut pending_r = [0u8; 256];
    let mut outstanding = 0u8;
    let mut tracker = Tracker::default();
    for (n, &(b, i)) in linear.iter().enumerate() {
        let avoid = if opt.keep_existing && k.blocks[b].insts[i].op.variable_latency() {
            lookahead(k, &linear, n)
        } else {
            0
        };
        let inst: &mut Inst = &mut k.blocks[b].insts[i];
        if !opt.keep_existing {
            inst.ctrl.wait = 0;
            inst.ctrl.wr_bar = None;
            inst.ctrl.rd_bar = None;
        }
        let mut wait = inst.ctrl.wait;
        for r in inst.reads() {
            if let Some((bar, from_spill)) = pending_w[usize::from(r)] {
                if !(opt.broken_skip_spill_load_waits && from_spill) {
                    wait |= 1 << bar;
                }
            }
        }
        for w in inst.writes() {
            wait |= pending_r[usize::from(w)];
            if let Some((bar, _)) = pending_w[usize::from(w)] {
                wait |= 1 << bar;
            }
        }
        if let Op::LoopBr { .. } = inst.op {
            wait |= outstanding;
        }
        inst.ctrl.wait = wait;
        if wait != 0 {
            tracker.clear(wait);
            outstanding &= !wait;
            for p in pending_w.iter_mut() {
                if matches!(*p, Some((bar, _)) if wait & (1 << bar) != 0) {
                    *p = None;
                }
            }
            for p in pending_r.iter_mut() {
                *p &= !wait;
            }
        }
        if inst.op.variable_latency() {
            let class = inst.op.class();
            let scoped_write = inst.writes().iter().any(|&w| (opt.scope)(w));
            if scoped_write && inst.ctrl.wr_bar.is_none() {
                let bar = tracker.get_avoiding(opt.policy, avoid);
                inst.ctrl.wr_bar = Some(bar);
                tracker.set(bar, class);
            } else if let Some(bar) = inst.ctrl.wr_bar {
                tracker.set(bar, class);
            }
            if needs_rd[n] && inst.ctrl.rd_bar.is_none() {
                let mine = inst.ctrl.wr_bar.map_or(0, |x| 1u8 << x);
                let bar = tracker.get_avoiding(opt.policy, avoid | mine);
                inst.ctrl.rd_bar = Some(bar);
                tracker.set_estimate(bar, READ_STALL);
            } else if let Some(bar) = inst.ctrl.rd_bar {
                tracker.set_estimate(bar, READ_STALL);
            }
            let from_spill = matches!(inst.origin, Origin::SpillLoad(_));
            if let Some(bar) = inst.ctrl.wr_bar {
                outstanding |= 1 << bar;
                for w in inst.writes() {
                    if (opt.scope)(w) {
                        pending_w[usize::from(w)] = Some((bar, from_spill));
                    }
                }
            }
            if let Some(bar) = inst.ctrl.rd_bar {
                outstanding |= 1 << bar;
                for r in inst.reads() {
                    if (opt.scope)(r) {
                        pending_r[usize::from(r)] |= 1 << bar;
                    }
                }
            }
        }
        tracker.advance(u32::from(inst.ctrl.stall.max(1)));
        if let Op::LoopBr { .. } = inst.op {
            tracker = Tracker::default();
        }
    }
}

/// Barriers that already-scheduled instructions after linear position `n` set or wait
/// on before the first instruction that depends on `n` (reads its result or overwrites
/// its sources) or the next loop branch.
fn lookahead(k: &Kernel, linear: &[(usize, usize)], n: usize) -> u8 {
    let (b0, i0) = linear[n];
    let me = &k.blocks[b0].insts[i0];
    let (writes, reads) = (me.writes(), me.reads());
    let mut mask = 0u8;
    for &(b, i) in &linear[n + 1..] {
        let x = &k.blocks[b].insts[i];
        if x.reads().iter().any(|r| writes.contains(r))
            || x.writes()
                .iter()
                .any(|r| reads.contains(r) || writes.contains(r))
            || matches!(x.op, Op::LoopBr { .. })
        {
            break;
        }
        mask |= x.ctrl.wait;
        for bar in [x.ctrl.wr_bar, x.ctrl.rd_bar].into_iter().flatten() {
            mask |= 1 << bar;
        }
    }
    mask
}

/// Schedule a kernel from scratch (the builder's stand-in for nvcc): stall counts for
/// every fixed-latency dependence and tracker-chosen barriers for every variable-latency
/// one.
pub fn schedule(k: &mut Kernel) {
    for inst in k.blocks.iter_mut().flat_map(|b| b.insts.iter_mut()) {
        inst.ctrl = Default::default();
    }
    fix_stalls(k);
    assign_barriers(
        k,
        &AssignOptions {
            scope: &|_| true,
            keep_existing: false,
            policy: BarrierPolicy::Tracker,
            broken_skip_spill_load_waits: false,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracker_prefers_free_then_least_remaining() {
        let mut t = Tracker::default();
        for b in 0..6 {
            assert_eq!(t.get(BarrierPolicy::Tracker), b);
            t.set(b, if b == 3 { Class::Shared } else { Class::Global });
        }
        t.advance(10);
        assert_eq!(t.get(BarrierPolicy::Tracker), 3);
        t.clear(1 << 4);
        assert_eq!(t.get(BarrierPolicy::Tracker), 4);
        assert_eq!(t.get(BarrierPolicy::Fixed(0)), 0);
    }
}
