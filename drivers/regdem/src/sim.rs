//! A cycle-level model of one SM: the timing ground truth, independent of the compile-time estimator.
//!
//! # What it models
//! - **Residency.** Thread blocks are dispatched up to the occupancy calculator's
//!   `blocks_per_sm` (from the variant's registers and shared memory); a finished block's
//!   slot is refilled from the grid.
//! - **Issue.** Four schedulers; warp `w` belongs to scheduler `w % 4`; each issues at
//!   most one instruction per cycle, greedy-then-oldest. A warp issues when its previous
//!   instruction's stall count has elapsed, every barrier in its wait mask is clear, it is
//!   not held at `BAR.SYNC`, and the unit it needs can accept work.
//! - **Units.** FP32/integer ALUs (fixed [`SimConfig::alu_latency`]); per-partition FP64
//!   and SFU pipes that a warp instruction occupies for `32 / lanes` cycles; one
//!   shared-memory pipe per SM serving one conflict-free wavefront per cycle (an n-way
//!   bank conflict takes n wavefronts); one off-chip port per SM with a byte bandwidth and
//!   separate latencies for global memory and for local-memory spills.
//! - **Scoreboard.** Six counting barriers per warp, released by completion events.
//! - **Register banks.** Four banks (`Rn` in bank `n % 4`); each extra source register in
//!   an already-read bank costs one issue cycle.
//! - **Poisoned reads.** Every register carries the time its pending write lands and the
//!   time a pending variable-latency read of it happens. An instruction that reads a
//!   register before its write landed (RAW), or whose write would land before a pending
//!   read or write of the same register (WAR/WAW), is a hazard the control words failed to
//!   cover: the value would be stale or clobbered on hardware. The simulator counts these
//!   and returns [`SimError::Poisoned`] when `strict` — this is how a broken pass (a
//!   missing barrier wait) is caught.
//!
//! Values are computed with the interpreter's per-thread semantics at issue time, so the
//! simulator also produces the kernel's real output (checked against the interpreter).
//!
//! # Parameters and their sources
//! [`SimConfig::maxwell`] holds the timing constants, printed by the harness. The memory
//! latencies follow Mei & Chu, "Dissecting GPU Memory Hierarchy through
//! Microbenchmarking" (IEEE TPDS 2017), GTX 980 measurements (shared memory ~28 cycles;
//! L2 hits ~200; DRAM ~350, rounded); bandwidth is the GM204 L2's per-SM share (about 32
//! bytes/cycle); FP64 and SFU rates are Maxwell's (4 FP64 and 32 SFU lanes per SM). They
//! were set once and are not tuned per kernel or variant. None of these constants is
//! shared with the compile-time estimator, which keeps its own.

use crate::interp::{self, ExecError, LaneCtx};
use crate::ir::{Class, Kernel, Op, Reg, Src};
use crate::occupancy::{occupancy, KernelResources, OccupancyError, SmConfig};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The simulator's timing parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// ALU result latency (cycles).
    pub alu_latency: u32,
    /// S2R latency.
    pub s2r_latency: u32,
    /// SFU latency after the pipe.
    pub sfu_latency: u32,
    /// SFU lanes per scheduler partition.
    pub sfu_lanes: u32,
    /// FP64 latency after the pipe.
    pub fp64_latency: u32,
    /// FP64 lanes per scheduler partition.
    pub fp64_lanes: u32,
    /// Shared-memory latency after the last wavefront.
    pub shared_latency: u32,
    /// Global-memory latency.
    pub global_latency: u32,
    /// Local-memory (spill) latency: L2-resident.
    pub local_latency: u32,
    /// Off-chip bytes per cycle per SM.
    pub offchip_bytes_per_cycle: u32,
    /// How far (cycles) the off-chip and shared pipes may be booked ahead before a warp
    /// cannot issue to them (queue depth).
    pub queue_cycles: u32,
    /// Strict mode: stop at the first poisoned read.
    pub strict: bool,
}

impl SimConfig {
    /// The Maxwell (GTX 980-class) parameters described in the module docs.
    pub fn maxwell() -> SimConfig {
        SimConfig {
            alu_latency: 6,
            s2r_latency: 20,
            sfu_latency: 16,
            sfu_lanes: 8,
            fp64_latency: 20,
            fp64_lanes: 1,
            shared_latency: 28,
            global_latency: 350,
            local_latency: 200,
            offchip_bytes_per_cycle: 32,
            queue_cycles: 64,
            strict: false,
        }
    }
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig::maxwell()
    }
}

/// Which hazard a poisoned access was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hazard {
    /// Read before the pending write landed.
    ReadAfterWrite,
    /// Write landing before a pending read.
    WriteAfterRead,
    /// Write landing before an earlier pending write.
    WriteAfterWrite,
}

/// Where a hazard happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Poison {
    /// Block index.
    pub block: usize,
    /// Instruction index in the block.
    pub inst: usize,
    /// The register.
    pub reg: Reg,
    /// The hazard.
    pub hazard: Hazard,
}

/// Why a simulation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimError {
    /// The kernel cannot be resident at all.
    Occupancy(OccupancyError),
    /// A functional error (bad address, divergence).
    Exec(ExecError),
    /// Strict mode: the first hazard.
    Poisoned(Poison),
    /// No warp can ever issue again.
    Deadlock,
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for SimError {}

/// What a simulation measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Cycles until the last block finished.
    pub cycles: u64,
    /// Warp instructions issued.
    pub warp_insts: u64,
    /// Of which spill code (demoted loads and stores).
    pub spill_insts: u64,
    /// Resident blocks per SM.
    pub blocks_per_sm: u32,
    /// Resident warps per SM.
    pub warps_per_sm: u32,
    /// Hazards the control words failed to cover.
    pub poisoned: u64,
    /// The first of them.
    pub first_poison: Option<Poison>,
    /// Shared-memory warp accesses.
    pub shared_accesses: u64,
    /// Extra wavefronts caused by bank conflicts, all shared accesses.
    pub bank_conflicts: u64,
    /// Shared-memory warp accesses by spill code.
    pub spill_shared_accesses: u64,
    /// Extra wavefronts caused by bank conflicts in spill code.
    pub spill_bank_conflicts: u64,
    /// Extra issue cycles from register-bank conflicts.
    pub register_bank_conflicts: u64,
    /// Off-chip bytes moved (global and local).
    pub offchip_bytes: u64,
    /// Cycles instructions were held by their wait mask after their stall count had
    /// elapsed (summed over issued instructions).
    pub barrier_stall_cycles: u64,
    /// Of which: instructions reading a value a spill load produced (the cost of the
    /// spill code's barrier choice).
    pub spill_barrier_stall_cycles: u64,
}

#[derive(Clone, Debug)]
struct Decoded {
    reads: Vec<Reg>,
    writes: Vec<Reg>,
}

#[derive(Clone, Debug)]
struct Warp {
    cta: usize,
    first_tid: u32,
    age: u64,
    block: usize,
    inst: usize,
    regs: Vec<u32>,
    local: Vec<u32>,
    next_issue: u64,
    sb: [u32; 6],
    at_bar: bool,
    done: bool,
    write_ready: Vec<u64>,
    read_busy: Vec<u64>,
    /// When each barrier's counter last returned to zero.
    cleared_at: [u64; 6],
    /// Whether each register's last writer was a spill load.
    from_spill: Vec<bool>,
}

#[derive(Clone, Debug)]
struct Cta {
    id: u32,
    shared: Vec<u32>,
    warps: Vec<usize>,
    at_bar: u32,
    live: u32,
}

/// Simulate `k` on one SM over `global` (which receives the kernel's output).
///
/// # Errors
/// [`SimError::Occupancy`] if a block cannot be resident, [`SimError::Exec`] for a
/// functional error, [`SimError::Poisoned`] at the first hazard in strict mode,
/// [`SimError::Deadlock`] if no warp can make progress.
pub fn simulate(
    k: &Kernel,
    sm: &SmConfig,
    cfg: &SimConfig,
    global: &mut [u32],
) -> Result<SimStats, SimError> {
    let regs = k.registers();
    let occ = occupancy(
        sm,
        &KernelResources {
            threads_per_block: k.threads_per_block,
            registers_per_thread: regs,
            shared_bytes_per_block: k.shared_bytes(),
        },
    )
    .map_err(SimError::Occupancy)?;
    let nregs = (regs as usize).max(1);
    let ws = sm.warp_size as usize;
    let warps_per_cta = (k.threads_per_block as usize).div_ceil(ws);
    let local_words = (k.local_bytes as usize).div_ceil(4);
    let decoded: Vec<Vec<Decoded>> = k
        .blocks
        .iter()
        .map(|b| {
            b.insts
                .iter()
                .map(|i| Decoded {
                    reads: i.reads(),
                    writes: i.writes(),
                })
                .collect()
        })
        .collect();
    let mut st = SimStats {
        blocks_per_sm: occ.blocks_per_sm,
        warps_per_sm: occ.warps_per_sm,
        ..SimStats::default()
    };
    let nsched = sm.schedulers.max(1) as usize;
    let slots = occ.blocks_per_sm as usize;
    let mut warps: Vec<Warp> = Vec::new();
    let mut ctas: Vec<Option<Cta>> = vec![None; slots];
    let mut next_cta = 0u32;
    let mut age = 0u64;
    let mut events: BinaryHeap<Reverse<(u64, usize, u8)>> = BinaryHeap::new();
    let mut fp64_free = vec![0u64; nsched];
    let mut sfu_free = vec![0u64; nsched];
    let mut shared_free = 0u64;
    let mut mem_free = 0u64;
    let mut last = vec![usize::MAX; nsched];
    let mut t = 0u64;
    // Warps per slot are reused: slot s owns warp indices s*wpc .. (s+1)*wpc.
    for s in 0..slots {
        for _ in 0..warps_per_cta {
            warps.push(Warp {
                cta: s,
                first_tid: 0,
                age: 0,
                block: 0,
                inst: 0,
                regs: vec![0; ws * nregs],
                local: vec![0; ws * local_words],
                next_issue: 0,
                sb: [0; 6],
                at_bar: false,
                done: true,
                write_ready: vec![0; nregs],
                read_busy: vec![0; nregs],
                cleared_at: [0; 6],
                from_spill: vec![false; nregs],
            });
        }
    }
    let launch = |slot: usize,
                  id: u32,
                  t: u64,
                  warps: &mut Vec<Warp>,
                  ctas: &mut Vec<Option<Cta>>,
                  age: &mut u64| {
        let ids: Vec<usize> = (slot * warps_per_cta..(slot + 1) * warps_per_cta).collect();
        for (j, &w) in ids.iter().enumerate() {
            let wp = &mut warps[w];
            wp.first_tid = (j * ws) as u32;
            wp.age = *age;
            *age += 1;
            wp.block = 0;
            wp.inst = 0;
            while wp.block < k.blocks.len() && k.blocks[wp.block].insts.is_empty() {
                wp.block += 1;
            }
            wp.regs.iter_mut().for_each(|x| *x = 0);
            wp.local.iter_mut().for_each(|x| *x = 0);
            wp.next_issue = t;
            wp.sb = [0; 6];
            wp.at_bar = false;
            wp.done = false;
            wp.write_ready.iter_mut().for_each(|x| *x = 0);
            wp.read_busy.iter_mut().for_each(|x| *x = 0);
            wp.cleared_at = [0; 6];
            wp.from_spill.iter_mut().for_each(|x| *x = false);
        }
        ctas[slot] = Some(Cta {
            id,
            shared: vec![0; (k.shared_bytes() as usize).div_ceil(4)],
            warps: ids,
            at_bar: 0,
            live: warps_per_cta as u32,
        });
    };
    for slot in 0..slots {
        if next_cta < k.grid_blocks {
            launch(slot, next_cta, 0, &mut warps, &mut ctas, &mut age);
            next_cta += 1;
        }
    }
    loop {
        while let Some(&Reverse((time, w, b))) = events.peek() {
            if time > t {
                break;
            }
            events.pop();
            let wp = &mut warps[w];
            wp.sb[usize::from(b)] = wp.sb[usize::from(b)].saturating_sub(1);
            if wp.sb[usize::from(b)] == 0 {
                wp.cleared_at[usize::from(b)] = time;
            }
        }
        // Retire finished warps and blocks; refill slots.
        for slot in 0..slots {
            let Some(cta) = &mut ctas[slot] else { continue };
            for &w in &cta.warps {
                let wp = &mut warps[w];
                if !wp.done && wp.block >= k.blocks.len() && wp.sb.iter().all(|&c| c == 0) {
                    wp.done = true;
                    cta.live -= 1;
                }
            }
            if cta.live == 0 {
                ctas[slot] = None;
                if next_cta < k.grid_blocks {
                    launch(slot, next_cta, t + 1, &mut warps, &mut ctas, &mut age);
                    next_cta += 1;
                }
            }
        }
        if ctas.iter().all(Option::is_none) {
            st.cycles = t;
            return Ok(st);
        }
        let mut issued_any = false;
        for (s, last_s) in last.iter_mut().enumerate() {
            // Candidates: greedy (last issued) first, then oldest.
            let mut cand: Option<usize> = None;
            let mut best_age = u64::MAX;
            let mut w = s;
            while w < warps.len() {
                let wp = &warps[w];
                if !wp.done && !wp.at_bar && wp.block < k.blocks.len() && wp.next_issue <= t {
                    let inst = &k.blocks[wp.block].insts[wp.inst];
                    let waits_ok = (0..6).all(|b| inst.ctrl.wait & (1 << b) == 0 || wp.sb[b] == 0);
                    let unit_ok = match inst.op.class() {
                        Class::Fp64 => fp64_free[s] <= t,
                        Class::Sfu => sfu_free[s] <= t,
                        Class::Shared => shared_free <= t + u64::from(cfg.queue_cycles),
                        Class::Global | Class::Local => mem_free <= t + u64::from(cfg.queue_cycles),
                        _ => true,
                    };
                    if waits_ok && unit_ok {
                        if w == *last_s {
                            cand = Some(w);
                            break;
                        }
                        if wp.age < best_age {
                            best_age = wp.age;
                            cand = Some(w);
                        }
                    }
                }
                w += nsched;
            }
            let Some(w) = cand else { continue };
            *last_s = w;
            issued_any = true;
            let (b, i) = (warps[w].block, warps[w].inst);
            let inst = &k.blocks[b].insts[i];
            let dec = &decoded[b][i];
            st.warp_insts += 1;
            if inst.origin.is_spill() {
                st.spill_insts += 1;
            }
            let cta_slot = warps[w].cta;
            // Register-bank conflicts among distinct source registers.
            let mut per_bank = [0u32; 4];
            let mut seen: Vec<Reg> = Vec::with_capacity(dec.reads.len());
            for &r in &dec.reads {
                if !seen.contains(&r) {
                    seen.push(r);
                    per_bank[usize::from(r) % 4] += 1;
                }
            }
            let bank_extra: u64 = per_bank
                .iter()
                .map(|&c| u64::from(c.saturating_sub(1)))
                .sum();
            st.register_bank_conflicts += bank_extra;
            let issue = t + bank_extra;
            // Functional execution (all lanes) and memory footprint.
            let mut lane_addrs: Vec<u32> = Vec::new();
            if let Op::LoopBr { trips, .. } = inst.op {
                let c = match inst.srcs.first() {
                    Some(Src::R(r)) => usize::from(*r),
                    _ => return Err(SimError::Exec(ExecError::BadOperand)),
                };
                let wp = &warps[w];
                let taken = wp.regs[c] < trips;
                if (0..ws).any(|l| (wp.regs[l * nregs + c] < trips) != taken) {
                    return Err(SimError::Exec(ExecError::Divergent { block: b }));
                }
            } else {
                let Some(cta) = ctas[cta_slot].as_mut() else {
                    return Err(SimError::Deadlock);
                };
                let wp = &mut warps[w];
                for l in 0..ws {
                    let tid = wp.first_tid + l as u32;
                    if tid >= k.threads_per_block {
                        continue;
                    }
                    let regs_l = &mut wp.regs[l * nregs..(l + 1) * nregs];
                    if matches!(inst.op.class(), Class::Shared | Class::Global) {
                        if let Some(Src::R(a)) = inst.srcs.first() {
                            lane_addrs.push(regs_l[usize::from(*a)].wrapping_add(inst.off));
                        }
                    }
                    let mut ctx = LaneCtx {
                        tid,
                        ctaid: cta.id,
                        ntid: k.threads_per_block,
                        global: &mut *global,
                        shared: &mut cta.shared,
                        local: &mut wp.local[l * local_words..(l + 1) * local_words],
                    };
                    interp::exec(inst, regs_l, &mut ctx).map_err(SimError::Exec)?;
                }
            }
            // Timing by class: (operand-read time for variable-latency ops, write time).
            let class = inst.op.class();
            let (read_at, write_at) = match class {
                Class::Alu | Class::Branch | Class::Sync => {
                    (issue, issue + u64::from(cfg.alu_latency))
                }
                Class::S2r => (issue, issue + u64::from(cfg.s2r_latency)),
                Class::Sfu => {
                    let busy = u64::from(32 / cfg.sfu_lanes.max(1));
                    let start = issue.max(sfu_free[s]);
                    sfu_free[s] = start + busy;
                    (start, start + busy + u64::from(cfg.sfu_latency))
                }
                Class::Fp64 => {
                    let busy = u64::from(32 / cfg.fp64_lanes.max(1));
                    let start = issue.max(fp64_free[s]);
                    fp64_free[s] = start + busy;
                    (start, start + busy + u64::from(cfg.fp64_latency))
                }
                Class::Shared => {
                    let mut words: Vec<u32> = lane_addrs.iter().map(|a| a / 4).collect();
                    words.sort_unstable();
                    words.dedup();
                    let mut per = [0u32; 32];
                    for wd in &words {
                        per[(*wd % 32) as usize] += 1;
                    }
                    let waves = u64::from(per.iter().copied().max().unwrap_or(1).max(1));
                    st.shared_accesses += 1;
                    st.bank_conflicts += waves - 1;
                    if inst.origin.is_spill() {
                        st.spill_shared_accesses += 1;
                        st.spill_bank_conflicts += waves - 1;
                    }
                    let start = issue.max(shared_free);
                    shared_free = start + waves;
                    (start, start + waves + u64::from(cfg.shared_latency))
                }
                Class::Global | Class::Local => {
                    let bytes: u64 = if class == Class::Local {
                        (ws * 4) as u64
                    } else {
                        let mut sectors: Vec<u32> = lane_addrs.iter().map(|a| a / 32).collect();
                        sectors.sort_unstable();
                        sectors.dedup();
                        32 * sectors.len() as u64
                    };
                    st.offchip_bytes += bytes;
                    let busy = bytes.div_ceil(u64::from(cfg.offchip_bytes_per_cycle.max(1)));
                    let start = issue.max(mem_free);
                    mem_free = start + busy;
                    let lat = if class == Class::Local {
                        cfg.local_latency
                    } else {
                        cfg.global_latency
                    };
                    (start, start + busy + u64::from(lat))
                }
            };
            // Hazard checks against the control words.
            let variable = inst.op.variable_latency();
            let wp = &mut warps[w];
            if inst.ctrl.wait != 0 {
                let clear = (0..6)
                    .filter(|&x| inst.ctrl.wait & (1 << x) != 0)
                    .map(|x| wp.cleared_at[x])
                    .max()
                    .unwrap_or(0);
                let held = clear.saturating_sub(wp.next_issue);
                st.barrier_stall_cycles += held;
                if dec.reads.iter().any(|&r| wp.from_spill[usize::from(r)]) {
                    st.spill_barrier_stall_cycles += held;
                }
            }
            let spill_load = matches!(inst.origin, crate::ir::Origin::SpillLoad(_));
            for &r in &dec.writes {
                wp.from_spill[usize::from(r)] = spill_load;
            }
            let poison = |reg: Reg, hazard: Hazard, st: &mut SimStats| {
                st.poisoned += 1;
                let p = Poison {
                    block: b,
                    inst: i,
                    reg,
                    hazard,
                };
                if st.first_poison.is_none() {
                    st.first_poison = Some(p);
                }
                p
            };
            for &r in &dec.reads {
                if wp.write_ready[usize::from(r)] > issue {
                    let p = poison(r, Hazard::ReadAfterWrite, &mut st);
                    if cfg.strict {
                        return Err(SimError::Poisoned(p));
                    }
                }
            }
            for &r in &dec.writes {
                let ru = usize::from(r);
                let hz = if wp.read_busy[ru] > write_at {
                    Some(Hazard::WriteAfterRead)
                } else if wp.write_ready[ru] > write_at {
                    Some(Hazard::WriteAfterWrite)
                } else {
                    None
                };
                if let Some(h) = hz {
                    let p = poison(r, h, &mut st);
                    if cfg.strict {
                        return Err(SimError::Poisoned(p));
                    }
                }
                wp.write_ready[ru] = write_at;
            }
            if variable {
                for &r in &dec.reads {
                    let ru = usize::from(r);
                    wp.read_busy[ru] = wp.read_busy[ru].max(read_at + 1);
                }
                if let Some(bar) = inst.ctrl.wr_bar {
                    wp.sb[usize::from(bar)] += 1;
                    events.push(Reverse((write_at, w, bar)));
                }
                if let Some(bar) = inst.ctrl.rd_bar {
                    wp.sb[usize::from(bar)] += 1;
                    events.push(Reverse((read_at + 1, w, bar)));
                }
            }
            wp.next_issue = issue + u64::from(inst.ctrl.stall.max(1));
            // Advance the program counter.
            match inst.op {
                Op::LoopBr { target, trips } => {
                    let c = match inst.srcs.first() {
                        Some(Src::R(r)) => usize::from(*r),
                        _ => 0,
                    };
                    if wp.regs[c] < trips {
                        wp.block = target;
                    } else {
                        wp.block += 1;
                    }
                    wp.inst = 0;
                }
                _ => {
                    wp.inst += 1;
                }
            }
            while wp.block < k.blocks.len() && wp.inst >= k.blocks[wp.block].insts.len() {
                wp.block += 1;
                wp.inst = 0;
            }
            if inst.op == Op::Bar {
                wp.at_bar = true;
                let Some(cta) = ctas[cta_slot].as_mut() else {
                    return Err(SimError::Deadlock);
                };
                cta.at_bar += 1;
                if cta.at_bar == cta.live {
                    cta.at_bar = 0;
                    for &x in &cta.warps {
                        if warps[x].at_bar {
                            warps[x].at_bar = false;
                            warps[x].next_issue = warps[x].next_issue.max(t + 1);
                        }
                    }
                }
            }
        }
        if issued_any {
            t += 1;
            continue;
        }
        // Nothing issued: jump to the next time something can change.
        let mut next = u64::MAX;
        if let Some(&Reverse((time, _, _))) = events.peek() {
            next = next.min(time);
        }
        for wp in &warps {
            if !wp.done && !wp.at_bar && wp.block < k.blocks.len() && wp.next_issue > t {
                next = next.min(wp.next_issue);
            }
        }
        for &f in fp64_free.iter().chain(&sfu_free) {
            if f > t {
                next = next.min(f);
            }
        }
        for f in [shared_free, mem_free] {
            let f = f.saturating_sub(u64::from(cfg.queue_cycles));
            if f > t {
                next = next.min(f);
            }
        }
        // Warps past their last instruction retire once their barriers clear (events).
        if next == u64::MAX {
            let pending_retire = warps
                .iter()
                .any(|wp| !wp.done && wp.block >= k.blocks.len());
            if pending_retire {
                next = t + 1;
            } else {
                return Err(SimError::Deadlock);
            }
        }
        t = next.max(t + 1);
    }
}
