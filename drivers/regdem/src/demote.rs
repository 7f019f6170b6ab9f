//! The demotion pass (§3.2): move registers into shared memory (RegDem) or into local
//! memory (the `--maxrregcount` spill baseline) until a target register count is met.
//!
//! # Algorithm
//! 1. **Units.** A register used as an FP64 pair anywhere is demoted together with its
//!    partner (challenge (3)); every other register is its own unit.
//! 2. **Candidates (§3.4.3).** Ordered by ascending estimated access count under one of
//!    three [`Strategy`]s: static count, loop-weighted count (×10 per loop level), or
//!    operand conflicts. After a unit is demoted, every unit that appears in one
//!    instruction with it is dropped from the list (challenge (2): one value register
//!    serves one demoted register per instruction).
//! 3. **Stop** when the register count, after compaction and counting the reserved
//!    address and value registers, reaches the target (or the list is empty: the target
//!    is unreachable with one value register).
//! 4. **Slots (Eq. 1).** The `i`-th demoted word of thread `t` lives at
//!    `S + i·T·4 + t·4`, `S` the kernel's static shared memory rounded up to 4 bytes and
//!    `T` the threads per block: a warp's 32 lanes hit 32 consecutive words, one per bank,
//!    so demoted accesses never conflict. RDA holds `S + t·4`, computed once at entry;
//!    each access adds the immediate `i·T·4`. (Equation 1 itself is missing from the
//!    text; this is the layout its prose and Figure 2's caption describe.) Local-memory
//!    spills need no address register (local memory is per thread and interleaved).
//! 5. **Rewrite.** Every read of a demoted register becomes a load into RDV placed just
//!    before the reader, every write a store from RDV just after the writer.
//! 6. **Optimise** (§3.4.2, [`crate::optimize`]), **compact** (§3.3, [`crate::compact`]),
//!    then **repair the schedule**: stall counts for the new fixed-latency distances and
//!    barriers for the new variable-latency instructions, chosen by the barrier tracker
//!    ([`crate::sched`]).

use crate::compact;
use crate::ir::{Inst, IrError, Kernel, Op, Origin, Reg, Special, Src};
use crate::occupancy::SmConfig;
use crate::optimize;
use crate::sched::{self, AssignOptions, BarrierPolicy};

/// How demotion candidates are ordered (§3.4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Ascending static access count.
    Static,
    /// Ascending access count with accesses inside loops weighted ×10 per level.
    LoopWeighted,
    /// Ascending number of operand conflicts (other registers sharing an instruction).
    Conflicts,
}

impl Strategy {
    /// All strategies.
    pub const ALL: [Strategy; 3] = [
        Strategy::Static,
        Strategy::LoopWeighted,
        Strategy::Conflicts,
    ];

    /// A short name.
    pub fn name(&self) -> &'static str {
        match self {
            Strategy::Static => "static",
            Strategy::LoopWeighted => "loop",
            Strategy::Conflicts => "conflict",
        }
    }
}

/// Where demoted registers go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Space {
    /// Unused shared memory (RegDem).
    Shared,
    /// Off-chip local memory (nvcc's spilling under `--maxrregcount`).
    Local,
}

/// Options of one demotion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Candidate order.
    pub strategy: Strategy,
    /// Registers per thread to reach.
    pub target_registers: u32,
    /// Destination memory.
    pub space: Space,
    /// Run the §3.4.2 optimisations.
    pub optimize: bool,
    /// Compact registers (§3.3); off only for the ablation.
    pub compact: bool,
    /// Bank-aware compaction (§3.4.1).
    pub bank_aware: bool,
    /// Barrier choice for spill code (the tracker, or a fixed barrier for the ablation).
    pub barrier_policy: BarrierPolicy,
    /// A deliberately broken pass for tests: consumers of demoted loads do not wait.
    pub broken_skip_spill_load_waits: bool,
}

impl Options {
    /// RegDem with everything on.
    pub fn regdem(strategy: Strategy, target_registers: u32) -> Options {
        Options {
            strategy,
            target_registers,
            space: Space::Shared,
            optimize: true,
            compact: true,
            bank_aware: true,
            barrier_policy: BarrierPolicy::Tracker,
            broken_skip_spill_load_waits: false,
        }
    }

    /// nvcc-style spilling to local memory under a register cap (loop-weighted spill
    /// costs, the same redundant-spill clean-up).
    pub fn local_cap(target_registers: u32) -> Options {
        Options {
            space: Space::Local,
            ..Options::regdem(Strategy::LoopWeighted, target_registers)
        }
    }
}

/// Why a demotion could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DemoteError {
    /// The candidates ran out (operand conflicts) before the target was met.
    TargetUnreachable {
        /// Registers the kernel would still need.
        reached: u32,
        /// The target.
        target: u32,
    },
    /// The demotion area does not fit the per-block shared memory limit.
    SharedTooSmall {
        /// Bytes needed per block.
        needed: u32,
        /// The limit.
        max: u32,
    },
    /// The kernel already meets the target.
    NothingToDo,
    /// The result failed validation.
    Ir(IrError),
}

impl std::fmt::Display for DemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for DemoteError {}

/// A demoted kernel and what was done to it.
#[derive(Clone, Debug)]
pub struct Demotion {
    /// The rewritten kernel.
    pub kernel: Kernel,
    /// The demoted registers (original numbers), in demotion order.
    pub demoted: Vec<Reg>,
    /// 32-bit words spilled per thread.
    pub spill_words: u32,
    /// Spill loads left in the code (static count).
    pub spill_loads: u32,
    /// Spill stores left in the code (static count).
    pub spill_stores: u32,
    /// Registers per thread before compaction.
    pub registers_before_compaction: u32,
    /// The compaction result, if compaction ran.
    pub compaction: Option<compact::Compaction>,
}

#[derive(Clone, Debug)]
struct Unit {
    regs: Vec<Reg>,
}

fn units_of(k: &Kernel) -> (Vec<Unit>, Vec<Option<usize>>) {
    let mut used = [false; 256];
    let mut pair = [false; 256];
    for i in k.insts() {
        for r in i.reads().into_iter().chain(i.writes()) {
            used[usize::from(r)] = true;
        }
        for r in i.pair_bases() {
            pair[usize::from(r)] = true;
        }
    }
    let mut units = Vec::new();
    let mut of = vec![None; 256];
    let mut r = 0usize;
    while r < 255 {
        if pair[r] {
            of[r] = Some(units.len());
            of[r + 1] = Some(units.len());
            units.push(Unit {
                regs: vec![r as Reg, r as Reg + 1],
            });
            r += 2;
        } else {
            if used[r] {
                of[r] = Some(units.len());
                units.push(Unit {
                    regs: vec![r as Reg],
                });
            }
            r += 1;
        }
    }
    (units, of)
}

fn unit_set(inst: &Inst, of: &[Option<usize>]) -> Vec<usize> {
    let mut v: Vec<usize> = inst
        .reads()
        .into_iter()
        .chain(inst.writes())
        .filter_map(|r| of[usize::from(r)])
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Candidate order under `strategy`: unit indices, cheapest first.
fn candidates(k: &Kernel, units: &[Unit], of: &[Option<usize>], strategy: Strategy) -> Vec<usize> {
    let depth = k.block_depth();
    let n = units.len();
    let mut stat = vec![0u64; n];
    let mut weighted = vec![0u64; n];
    let mut partners = vec![std::collections::BTreeSet::new(); n];
    for (b, blk) in k.blocks.iter().enumerate() {
        let w = 10u64.pow(depth[b].min(6));
        for inst in &blk.insts {
            let us = unit_set(inst, of);
            for &u in &us {
                stat[u] += 1;
                weighted[u] += w;
                for &p in &us {
                    if p != u {
                        partners[u].insert(p);
                    }
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    match strategy {
        Strategy::Static => order.sort_by_key(|&u| (stat[u], u)),
        Strategy::LoopWeighted => order.sort_by_key(|&u| (weighted[u], u)),
        Strategy::Conflicts => order.sort_by_key(|&u| (partners[u].len(), weighted[u], u)),
    }
    order
}

/// Demote registers of `k` per `opt`.
///
/// # Errors
/// [`DemoteError::NothingToDo`] when `k` already fits the target,
/// [`DemoteError::TargetUnreachable`] when operand conflicts exhaust the candidates,
/// [`DemoteError::SharedTooSmall`] when the demotion area exceeds the per-block shared
/// memory limit, [`DemoteError::Ir`] if the result fails validation. `k` is never
/// modified.
pub fn demote(k: &Kernel, sm: &SmConfig, opt: &Options) -> Result<Demotion, DemoteError> {
    let regs = k.registers();
    if regs <= opt.target_registers {
        return Err(DemoteError::NothingToDo);
    }
    let (units, of) = units_of(k);
    let order = candidates(k, &units, &of, opt.strategy);
    // Which units share an instruction with which.
    let mut partners = vec![std::collections::BTreeSet::new(); units.len()];
    for inst in k.insts() {
        let us = unit_set(inst, &of);
        for &u in &us {
            partners[u].extend(us.iter().copied().filter(|&p| p != u));
        }
    }
    let used_slots: u32 = units.iter().map(|u| u.regs.len() as u32).sum();
    let rda_count = u32::from(opt.space == Space::Shared);
    let mut banned = vec![false; units.len()];
    let mut chosen: Vec<usize> = Vec::new();
    let mut remaining = used_slots;
    let mut rdv_width = 1u32;
    let estimate = |remaining: u32, rdv_width: u32| {
        // Pairs stay aligned: an odd single count next to an RDV pair may pad by one.
        remaining
            + rda_count
            + rdv_width
            + u32::from(rdv_width == 2 && (remaining + rda_count) % 2 == 1)
    };
    for &u in &order {
        if estimate(remaining, rdv_width) <= opt.target_registers {
            break;
        }
        if banned[u] {
            continue;
        }
        chosen.push(u);
        remaining -= units[u].regs.len() as u32;
        rdv_width = rdv_width.max(units[u].regs.len() as u32);
        for &p in &partners[u] {
            banned[p] = true;
        }
    }
    let reached = estimate(remaining, rdv_width);
    if reached > opt.target_registers {
        return Err(DemoteError::TargetUnreachable {
            reached,
            target: opt.target_registers,
        });
    }
    // Spill words: each 32-bit register of a demoted unit gets its own Eq. 1 column.
    let mut word_of = [None::<u16>; 256];
    let mut words = 0u16;
    let mut demoted = Vec::new();
    for &u in &chosen {
        for &r in &units[u].regs {
            word_of[usize::from(r)] = Some(words);
            words += 1;
            demoted.push(r);
        }
    }
    let t = k.threads_per_block;
    let s_align = k.static_shared.div_ceil(4) * 4;
    let mut out = k.clone();
    match opt.space {
        Space::Shared => {
            out.spill_shared = u32::from(words) * t * 4;
            let needed = out.shared_bytes().div_ceil(sm.shared_alloc_unit) * sm.shared_alloc_unit;
            if needed > sm.max_shared_per_block {
                return Err(DemoteError::SharedTooSmall {
                    needed,
                    max: sm.max_shared_per_block,
                });
            }
        }
        Space::Local => out.local_bytes = k.local_bytes + u32::from(words) * 4,
    }
    // Reserved registers take freed numbers (lowest first; RDV pair aligned), else fresh.
    // Reserved registers take freed numbers, else fresh ones above the kernel's. RDV
    // comes from the register bank that conflicts least with the other operands of the
    // instructions touching demoted registers (§3.4.1's first strategy).
    let mut free: Vec<u32> = demoted.iter().map(|&r| u32::from(r)).collect();
    free.sort_unstable();
    let mut next_fresh = regs;
    let mut bank_use = [0u32; 4];
    for inst in k.insts() {
        let regs_of: Vec<Reg> = inst.reads().into_iter().chain(inst.writes()).collect();
        if regs_of.iter().any(|&r| word_of[usize::from(r)].is_some()) {
            for &r in regs_of
                .iter()
                .filter(|&&r| word_of[usize::from(r)].is_none())
            {
                bank_use[usize::from(r) % 4] += 1;
            }
        }
    }
    let cost = |r: u32, w: u32| (r..r + w).map(|x| bank_use[(x % 4) as usize]).sum::<u32>();
    let rdv: u32 = if rdv_width == 2 {
        let best = free
            .iter()
            .copied()
            .filter(|&r| r % 2 == 0 && free.contains(&(r + 1)))
            .min_by_key(|&r| (cost(r, 2), r));
        match best {
            Some(p) => {
                free.retain(|&x| x != p && x != p + 1);
                p
            }
            None => {
                next_fresh += next_fresh % 2;
                next_fresh += 2;
                next_fresh - 2
            }
        }
    } else if let Some(r) = free.iter().copied().min_by_key(|&r| (cost(r, 1), r)) {
        free.retain(|&x| x != r);
        r
    } else {
        next_fresh += 1;
        next_fresh - 1
    };
    let rda: Option<u32> = (opt.space == Space::Shared).then(|| {
        if free.is_empty() {
            next_fresh += 1;
            next_fresh - 1
        } else {
            free.remove(0)
        }
    });
    if next_fresh > 255 {
        return Err(DemoteError::TargetUnreachable {
            reached: next_fresh,
            target: opt.target_registers,
        });
    }
    let rdv = rdv as Reg;
    let rda = rda.map(|r| r as Reg);
    // Value register for each demoted register: RDV, or RDV+1 for a pair's high half.
    let mut value_of = [None::<Reg>; 256];
    for &u in &chosen {
        for (h, &r) in units[u].regs.iter().enumerate() {
            value_of[usize::from(r)] = Some(rdv + h as Reg);
        }
    }
    let addr = |w: u16| u32::from(w) * t * 4;
    let load = |w: u16, v: Reg| -> Inst {
        let mut i = match (opt.space, rda) {
            (Space::Shared, Some(a)) => Inst::new(Op::Lds, Some(v), vec![Src::R(a)], addr(w)),
            _ => Inst::new(Op::Ldl, Some(v), vec![], u32::from(w) * 4 + k.local_bytes),
        };
        i.origin = Origin::SpillLoad(w);
        i
    };
    let store = |w: u16, v: Reg| -> Inst {
        let mut i = match (opt.space, rda) {
            (Space::Shared, Some(a)) => {
                Inst::new(Op::Sts, None, vec![Src::R(a), Src::R(v)], addr(w))
            }
            _ => Inst::new(
                Op::Stl,
                None,
                vec![Src::R(v)],
                u32::from(w) * 4 + k.local_bytes,
            ),
        };
        i.origin = Origin::SpillStore(w);
        i
    };
    let rename = |r: Reg| value_of[usize::from(r)].unwrap_or(r);
    for blk in out.blocks.iter_mut() {
        let mut insts = Vec::with_capacity(blk.insts.len() * 2);
        for inst in blk.insts.drain(..) {
            let mut read_words: Vec<Reg> = inst
                .reads()
                .into_iter()
                .filter(|&r| word_of[usize::from(r)].is_some())
                .collect();
            read_words.sort_unstable();
            read_words.dedup();
            for r in &read_words {
                if let (Some(w), Some(v)) = (word_of[usize::from(*r)], value_of[usize::from(*r)]) {
                    insts.push(load(w, v));
                }
            }
            let written: Vec<Reg> = inst
                .writes()
                .into_iter()
                .filter(|&r| word_of[usize::from(r)].is_some())
                .collect();
            let mut new = inst;
            new.rename(&rename);
            insts.push(new);
            for r in &written {
                if let (Some(w), Some(v)) = (word_of[usize::from(*r)], value_of[usize::from(*r)]) {
                    insts.push(store(w, v));
                }
            }
        }
        blk.insts = insts;
    }
    if let Some(a) = rda {
        let mut s2r = Inst::new(Op::S2R(Special::Tid), Some(a), vec![], 0);
        s2r.origin = Origin::Setup;
        let mut imad = Inst::new(
            Op::IMad,
            Some(a),
            vec![Src::R(a), Src::I(4), Src::I(s_align)],
            0,
        );
        imad.origin = Origin::Setup;
        out.blocks[0].insts.insert(0, imad);
        out.blocks[0].insts.insert(0, s2r);
    }
    let mut value_regs: Vec<Reg> = (0..rdv_width as Reg).map(|h| rdv + h).collect();
    if opt.optimize {
        let temps = optimize::optimize(&mut out, &value_regs, rda);
        value_regs.extend(temps);
    }
    let registers_before_compaction = out.registers();
    let compaction = opt
        .compact
        .then(|| compact::compact(&mut out, opt.bank_aware));
    let map = |r: Reg| -> Reg {
        compaction
            .as_ref()
            .and_then(|c| c.map[usize::from(r)])
            .unwrap_or(r)
    };
    let mut scope = [false; 256];
    for &v in &value_regs {
        scope[usize::from(map(v))] = true;
    }
    if let Some(a) = rda {
        scope[usize::from(map(a))] = true;
    }
    sched::fix_stalls(&mut out);
    sched::assign_barriers(
        &mut out,
        &AssignOptions {
            scope: &|r| scope[usize::from(r)],
            keep_existing: true,
            policy: opt.barrier_policy,
            broken_skip_spill_load_waits: opt.broken_skip_spill_load_waits,
        },
    );
    out.validate().map_err(DemoteError::Ir)?;
    let spill_loads = out
        .insts()
        .filter(|i| matches!(i.origin, Origin::SpillLoad(_)))
        .count() as u32;
    let spill_stores = out
        .insts()
        .filter(|i| matches!(i.origin, Origin::SpillStore(_)))
        .count() as u32;
    out.name = k.name.clone();
    Ok(Demotion {
        kernel: out,
        demoted,
        spill_words: u32::from(words),
        spill_loads,
        spill_stores,
        registers_before_compaction,
        compaction,
    })
}
