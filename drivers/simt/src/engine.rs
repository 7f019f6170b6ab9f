//! The SIMT engine: runs a [`Kernel`] on a device's [`gmem_sim::Port`] in lockstep warps.
//!
//! ## Model
//! The grid's blocks are queued in order; the [`Dispatch`] policy pins some to units
//! and places the rest on units with a free block slot. A unit holds as many blocks as
//! the [`OccupancyModel`] allows, so `W = blocks × warps per block` warps are resident.
//! Each unit has its own cycle clock; the engine always advances the unit whose clock is
//! earliest, so the units' requests reach the shared TLB and DRAM interleaved in time.
//! On a unit the [`WarpScheduler`] picks a ready warp, which issues one instruction
//! (one cycle); a memory instruction's 32 lane addresses are coalesced into 128-byte
//! transactions, each distinct page among them is one translation request by that unit
//! (its L1 TLB, the shared TLB, a walk of the real table, or a fault served by the
//! core and retried), and the bytes move in simulated memory while invalidations of the
//! device wait ([`gmem_sim::Port::with_pages`]). The [`CostModel`] turns what served each request
//! into the cycles the warp waits. When a block's last warp exits its slot takes the
//! next block.
//!
//! Faults are not timed (the first touch of a page costs its translation as served
//! after the retry). Everything is deterministic.

use crate::coalesce::{CoalesceError, Coalesced, TRANSACTION};
use crate::cost::CostModel;
use crate::dispatch::{Dispatch, WarpScheduler, DEAD};
use crate::kernel::{Kernel, Op, WarpIo, WarpProgram};
use crate::occupancy::{Occupancy, OccupancyError, OccupancyModel};
use gmem_core::{Gmem, PhysAddr, Prot, VirtAddr};
use gmem_sim::{AccessError, Replacement, Resolved, Served, Tlb, TlbConfig};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;

/// Why a launch failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimtError {
    /// The kernel does not fit a unit.
    Occupancy(OccupancyError),
    /// A warp's lane addresses were rejected.
    Coalesce {
        /// The block.
        block: u64,
        /// The error.
        error: CoalesceError,
    },
    /// An access failed (fault not served, livelock, no memory, ...).
    Access {
        /// The block.
        block: u64,
        /// The error.
        error: AccessError,
    },
    /// A cost-model cache geometry was rejected.
    Geometry,
    /// The device has no compute unit.
    NoUnits,
}

impl fmt::Display for SimtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimtError::Occupancy(e) => write!(f, "occupancy: {e}"),
            SimtError::Coalesce { block, error } => write!(f, "block {block}: {error:?}"),
            SimtError::Access { block, error } => write!(f, "block {block}: {error}"),
            SimtError::Geometry => write!(f, "bad data-cache geometry"),
            SimtError::NoUnits => write!(f, "the device has no compute unit"),
        }
    }
}

/// What a launch did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RunStats {
    /// Cycles until the last unit finished.
    pub cycles: u64,
    /// Thread blocks run.
    pub blocks: u64,
    /// Warps run.
    pub warps: u64,
    /// Resident warps per unit (the occupancy).
    pub warps_per_unit: u32,
    /// Warp instructions issued.
    pub instructions: u64,
    /// Of those, loads and stores.
    pub memory_instructions: u64,
    /// 128-byte transactions.
    pub transactions: u64,
    /// Translation requests (distinct pages per memory instruction).
    pub translations: u64,
    /// Requests served by the unit's L1 TLB.
    pub served_l1: u64,
    /// Requests served by the shared TLB.
    pub served_l2: u64,
    /// Requests that walked.
    pub walks: u64,
    /// Table entries those walks read.
    pub walk_reads: u64,
    /// Transactions served by an L1 data cache.
    pub l1_data_hits: u64,
    /// Transactions served by the L2 data cache.
    pub l2_data_hits: u64,
    /// Transactions that went to DRAM.
    pub dram_transactions: u64,
    /// Cycles warps waited for translation (summed over memory instructions).
    pub translation_cycles: u64,
    /// Cycles warps waited for data (summed over memory instructions).
    pub data_cycles: u64,
}

impl RunStats {
    /// Add another launch's counters (cycles add: launches run one after another).
    pub fn plus(&mut self, o: &RunStats) {
        self.cycles += o.cycles;
        self.blocks += o.blocks;
        self.warps += o.warps;
        self.warps_per_unit = self.warps_per_unit.max(o.warps_per_unit);
        self.instructions += o.instructions;
        self.memory_instructions += o.memory_instructions;
        self.transactions += o.transactions;
        self.translations += o.translations;
        self.served_l1 += o.served_l1;
        self.served_l2 += o.served_l2;
        self.walks += o.walks;
        self.walk_reads += o.walk_reads;
        self.l1_data_hits += o.l1_data_hits;
        self.l2_data_hits += o.l2_data_hits;
        self.dram_transactions += o.dram_transactions;
        self.translation_cycles += o.translation_cycles;
        self.data_cycles += o.data_cycles;
    }
}

struct Warp<W> {
    prog: W,
    io: WarpIo,
    block: u64,
    block_slot: usize,
}

struct Unit<W> {
    now: u64,
    warps: Vec<Option<Warp<W>>>,
    ready_at: Vec<u64>,
    /// With at most 64 slots (`masked`): bit `i` set exactly when `ready_at[i] <= now`.
    ready: u64,
    /// With `masked`: `(ready_at, slot)` of each warp waiting on a latency, earliest
    /// first; an entry whose slot's `ready_at` has changed since is stale and skipped.
    wakes: BinaryHeap<Reverse<(u64, usize)>>,
    /// The unit has at most 64 slots, so `ready` and `wakes` are kept and the scheduler
    /// picks from the mask.
    masked: bool,
    age: Vec<u64>,
    /// Warps left in each block slot (0 = free).
    left: Vec<u32>,
    live: usize,
    pinned: VecDeque<u64>,
    sched: Box<dyn WarpScheduler>,
    l1d: Option<Tlb<()>>,
}

/// A device to run on: the core and the device's port.
#[derive(Clone, Copy)]
pub struct Device<'a> {
    /// The GMEM instance.
    pub gm: &'a Gmem,
    /// The device's memory port.
    pub port: &'a gmem_sim::Port,
}

/// Launch options.
pub struct Launch<'a, 'o> {
    /// Occupancy calculation.
    pub occupancy: &'a dyn OccupancyModel,
    /// Block dispatch.
    pub dispatch: &'a mut dyn Dispatch,
    /// Makes each unit's warp scheduler.
    pub scheduler: &'a dyn Fn() -> Box<dyn WarpScheduler>,
    /// The cost model.
    pub cost: &'a CostModel,
    /// Page size used to split a warp's transactions into translation requests.
    pub page_shift: u8,
    /// Told about every 128-byte transaction (traffic accounting by where the frame
    /// lives, e.g. per memory stack), if given.
    pub observer: Option<&'o mut (dyn AccessObserver + 'o)>,
}

/// Sees every transaction a launch makes.
pub trait AccessObserver {
    /// Unit `unit` moved the 128 bytes at physical `pa` (a store if `store`), through a
    /// translation served as `served`.
    fn transaction(&mut self, unit: usize, pa: u64, store: bool, served: Served);
}

struct Memory {
    co: Coalesced,
    pages: Vec<(VirtAddr, Prot)>,
    resolved: Vec<Resolved>,
    lines: Vec<[u8; TRANSACTION as usize]>,
    l2d: Option<Tlb<()>>,
    link_free: u64,
}

/// Run `kernel` on `dev` with the options of `launch`.
///
/// # Errors
/// [`SimtError::Occupancy`] when a block does not fit a unit (nothing ran);
/// [`SimtError::Coalesce`] or [`SimtError::Access`] for the first failing instruction
/// (stores before it stay done, as on hardware); [`SimtError::Geometry`] for a bad
/// data-cache geometry; [`SimtError::NoUnits`].
pub fn run<K: Kernel>(
    dev: Device<'_>,
    kernel: &K,
    mut launch: Launch<'_, '_>,
) -> Result<RunStats, SimtError> {
    let res = kernel.resources();
    let Occupancy {
        blocks_per_sm,
        warps_per_sm,
        ..
    } = launch
        .occupancy
        .occupancy(&res)
        .map_err(SimtError::Occupancy)?;
    let n_units = dev.port.units();
    if n_units == 0 {
        return Err(SimtError::NoUnits);
    }
    let cost = launch.cost;
    let cache = |(sets, ways): (usize, usize)| -> Result<Option<Tlb<()>>, SimtError> {
        if !cost.data_caches {
            return Ok(None);
        }
        Tlb::new(TlbConfig::new(sets, ways, Replacement::Lru))
            .map(Some)
            .map_err(|_| SimtError::Geometry)
    };
    let wpb = res.threads_per_block.div_ceil(32) as usize;
    let slots = blocks_per_sm as usize;
    let mut units: Vec<Unit<K::Warp>> = (0..n_units)
        .map(|_| {
            Ok(Unit {
                now: 0,
                warps: (0..slots * wpb).map(|_| None).collect(),
                ready_at: vec![DEAD; slots * wpb],
                ready: 0,
                wakes: BinaryHeap::with_capacity(slots * wpb),
                masked: slots * wpb <= 64,
                age: vec![0; slots * wpb],
                left: vec![0; slots],
                live: 0,
                pinned: VecDeque::new(),
                sched: (launch.scheduler)(),
                l1d: cache(cost.l1_data_geometry)?,
            })
        })
        .collect::<Result<_, SimtError>>()?;
    let mut open = VecDeque::new();
    for b in 0..kernel.blocks() {
        match launch.dispatch.preferred(b, n_units) {
            Some(u) => units[u % n_units].pinned.push_back(b),
            None => open.push_back(b),
        }
    }
    let mut mem = Memory {
        co: Coalesced::default(),
        pages: Vec::with_capacity(32),
        resolved: Vec::with_capacity(32),
        lines: vec![[0; TRANSACTION as usize]; 32],
        l2d: cache(cost.l2_data_geometry)?,
        link_free: 0,
    };
    let mut stats = RunStats {
        warps_per_unit: warps_per_sm,
        ..RunStats::default()
    };
    let mut age = 0u64;
    // Initial placement: pinned blocks first, then open blocks by the policy.
    for unit in units.iter_mut() {
        while let Some(slot) = free_slot(unit) {
            let Some(b) = unit.pinned.pop_front() else {
                break;
            };
            place(unit, kernel, b, slot, wpb, &mut age, &mut stats);
        }
    }
    fill_open(
        &mut units,
        &mut open,
        &mut *launch.dispatch,
        kernel,
        wpb,
        &mut age,
        &mut stats,
    );
    while let Some(u) = (0..n_units)
        .filter(|&u| units[u].live > 0)
        .min_by_key(|&u| units[u].now)
    {
        let unit = &mut units[u];
        let now = unit.now;
        let picked = if unit.masked {
            // Warps whose latency has elapsed join the ready mask.
            while let Some(&Reverse((t, i))) = unit.wakes.peek() {
                if t > now {
                    break;
                }
                unit.wakes.pop();
                if unit.ready_at[i] == t {
                    unit.ready |= 1 << i;
                }
            }
            unit.sched
                .pick_ready(unit.ready, &unit.ready_at, &unit.age, now)
        } else {
            unit.sched.pick(&unit.ready_at, &unit.age, now)
        };
        let Some(s) = picked else {
            unit.now = if unit.masked {
                // Nothing is ready: every live warp waits in `wakes`, so the earliest
                // valid entry is the minimum of `ready_at`.
                loop {
                    let Reverse((t, i)) = *unit.wakes.peek().expect("a live warp");
                    if unit.ready_at[i] == t {
                        break t;
                    }
                    unit.wakes.pop();
                }
            } else {
                unit.ready_at.iter().copied().min().expect("a live warp")
            };
            continue;
        };
        let w = unit.warps[s].as_mut().expect("scheduler picks live warps");
        let op = w.prog.next(&mut w.io);
        stats.instructions += 1;
        let wait = match op {
            Op::Compute(c) => u64::from(c),
            Op::Load | Op::Store => {
                let block = w.block;
                stats.memory_instructions += 1;
                memory(
                    dev,
                    u,
                    op,
                    &mut w.io,
                    launch.page_shift,
                    cost,
                    now,
                    &mut mem,
                    &mut unit.l1d,
                    &mut stats,
                    &mut launch.observer,
                )
                .map_err(|e| match e {
                    MemError::Coalesce(error) => SimtError::Coalesce { block, error },
                    MemError::Access(error) => SimtError::Access { block, error },
                })?
            }
            Op::Exit => {
                let slot = w.block_slot;
                // The slot keeps the finished program for reuse; DEAD keeps it out of
                // the schedulers.
                unit.ready_at[s] = DEAD;
                unit.ready &= !(1u64 << (s & 63));
                unit.live -= 1;
                unit.left[slot] -= 1;
                unit.now += 1;
                if unit.left[slot] == 0 {
                    if let Some(b) = unit.pinned.pop_front() {
                        place(unit, kernel, b, slot, wpb, &mut age, &mut stats);
                    } else {
                        fill_open(
                            &mut units,
                            &mut open,
                            &mut *launch.dispatch,
                            kernel,
                            wpb,
                            &mut age,
                            &mut stats,
                        );
                    }
                }
                continue;
            }
        };
        unit.ready_at[s] = now + 1 + wait;
        if unit.masked {
            unit.ready &= !(1u64 << s);
            unit.wakes.push(Reverse((now + 1 + wait, s)));
        }
        unit.now += 1;
    }
    stats.cycles = units.iter().map(|u| u.now).max().unwrap_or(0);
    Ok(stats)
}

fn free_slot<W>(u: &Unit<W>) -> Option<usize> {
    u.left.iter().position(|&l| l == 0)
}

fn place<K: Kernel>(
    unit: &mut Unit<K::Warp>,
    kernel: &K,
    block: u64,
    slot: usize,
    wpb: usize,
    age: &mut u64,
    stats: &mut RunStats,
) {
    for w in 0..wpb {
        let i = slot * wpb + w;
        match unit.warps[i].as_mut() {
            // A finished warp's storage is reused in place (no large moves).
            Some(old) => {
                kernel.rewarp(&mut old.prog, block, w as u32);
                old.io.mask = 0;
                old.block = block;
                old.block_slot = slot;
            }
            None => {
                unit.warps[i] = Some(Warp {
                    prog: kernel.warp(block, w as u32),
                    io: WarpIo::default(),
                    block,
                    block_slot: slot,
                })
            }
        }
        unit.ready_at[i] = unit.now;
        if unit.masked {
            unit.ready |= 1 << i;
        }
        unit.age[i] = *age;
        *age += 1;
    }
    unit.left[slot] = wpb as u32;
    unit.live += wpb;
    stats.blocks += 1;
    stats.warps += wpb as u64;
}

fn fill_open<K: Kernel>(
    units: &mut [Unit<K::Warp>],
    open: &mut VecDeque<u64>,
    dispatch: &mut dyn Dispatch,
    kernel: &K,
    wpb: usize,
    age: &mut u64,
    stats: &mut RunStats,
) {
    let mut cands = Vec::with_capacity(units.len());
    while !open.is_empty() {
        cands.clear();
        cands.extend((0..units.len()).filter(|&u| free_slot(&units[u]).is_some()));
        if cands.is_empty() {
            return;
        }
        let u = dispatch.choose(&cands);
        let u = if cands.contains(&u) { u } else { cands[0] };
        let b = open.pop_front().expect("not empty");
        let slot = free_slot(&units[u]).expect("candidate has room");
        place(&mut units[u], kernel, b, slot, wpb, age, stats);
    }
}

enum MemError {
    Coalesce(CoalesceError),
    Access(AccessError),
}

/// Run one memory instruction of unit `u`; returns the cycles the warp waits.
#[allow(clippy::too_many_arguments)]
fn memory(
    dev: Device<'_>,
    u: usize,
    op: Op,
    io: &mut WarpIo,
    page_shift: u8,
    cost: &CostModel,
    now: u64,
    m: &mut Memory,
    l1d: &mut Option<Tlb<()>>,
    stats: &mut RunStats,
    observer: &mut Option<&mut (dyn AccessObserver + '_)>,
) -> Result<u64, MemError> {
    m.co.fill(&io.addr, io.mask, page_shift)
        .map_err(MemError::Coalesce)?;
    if m.co.transactions.is_empty() {
        return Ok(0);
    }
    let access = if op == Op::Store {
        Prot::WRITE
    } else {
        Prot::READ
    };
    m.pages.clear();
    m.pages
        .extend(m.co.pages.iter().map(|&p| (VirtAddr::new(p), access)));
    let pmask = !((1u64 << page_shift) - 1);
    let (co, lines) = (&m.co, &mut m.lines);
    let mut line_pa = [0u64; 32];
    dev.port
        .with_pages(dev.gm, u, &m.pages, &mut m.resolved, |res| {
            for (ti, &t) in co.transactions.iter().enumerate() {
                let pi = co
                    .pages
                    .binary_search(&(t & pmask))
                    .expect("pages come from the transactions");
                let pa = PhysAddr::new(res[pi].pa.as_u64() + (t - (t & pmask)));
                line_pa[ti] = pa.as_u64();
                if let Some(o) = observer.as_mut() {
                    o.transaction(u, pa.as_u64(), op == Op::Store, res[pi].served);
                }
                res[pi]
                    .memory
                    .read(pa, &mut lines[ti])
                    .map_err(AccessError::Bounds)?;
            }
            for l in 0..32 {
                if io.mask & (1 << l) == 0 {
                    continue;
                }
                let a = io.addr[l];
                let ti = co.transaction_of(a).expect("lane coalesced");
                let off = (a % TRANSACTION) as usize;
                let word = &mut lines[ti][off..off + 4];
                if op == Op::Store {
                    word.copy_from_slice(&io.value[l].to_le_bytes());
                } else {
                    io.value[l] = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                }
            }
            if op == Op::Store {
                for (ti, &t) in co.transactions.iter().enumerate() {
                    let pi = co.pages.binary_search(&(t & pmask)).expect("coalesced");
                    res[pi]
                        .memory
                        .write(PhysAddr::new(line_pa[ti]), &lines[ti])
                        .map_err(AccessError::Bounds)?;
                }
            }
            Ok(())
        })
        .map_err(MemError::Access)?;
    // Translation cost: the slowest page; walks beyond the walker count queue.
    let (mut worst, mut walks, mut worst_walk) = (0u64, 0u64, 0u64);
    for r in &m.resolved {
        stats.translations += 1;
        let c = match r.served {
            Served::L1 | Served::Unknown => {
                stats.served_l1 += u64::from(r.served == Served::L1);
                cost.l1_tlb
            }
            Served::L2 => {
                stats.served_l2 += 1;
                cost.l1_tlb + cost.l2_tlb
            }
            Served::Walk { reads } => {
                stats.walks += 1;
                stats.walk_reads += u64::from(reads);
                walks += 1;
                let c = cost.l1_tlb + cost.l2_tlb + cost.walk_cache + u64::from(reads) * cost.dram;
                worst_walk = worst_walk.max(c);
                c
            }
        };
        worst = worst.max(c);
    }
    let translation = worst + (walks.saturating_sub(1) / cost.walkers.max(1)) * worst_walk;
    // Data cost: the slowest transaction.
    let t0 = now + 1 + translation;
    let mut data = 0u64;
    let link = (TRANSACTION as f64 / cost.dram_bytes_per_cycle).ceil() as u64;
    for &pa in line_pa.iter().take(m.co.transactions.len()) {
        stats.transactions += 1;
        let l1_hit = op == Op::Load
            && l1d
                .as_mut()
                .is_some_and(|c| c.lookup_at(0, pa, 7).is_some());
        let c = if l1_hit {
            stats.l1_data_hits += 1;
            cost.l1_data
        } else if m
            .l2d
            .as_mut()
            .is_some_and(|c| c.lookup_at(0, pa, 7).is_some())
        {
            stats.l2_data_hits += 1;
            if op == Op::Load {
                if let Some(c) = l1d.as_mut() {
                    c.insert(0, pa, 7, ());
                }
            }
            cost.l2_data
        } else {
            stats.dram_transactions += 1;
            let start = t0.max(m.link_free);
            m.link_free = start + link;
            if let Some(c) = m.l2d.as_mut() {
                c.insert(0, pa, 7, ());
            }
            if op == Op::Load {
                if let Some(c) = l1d.as_mut() {
                    c.insert(0, pa, 7, ());
                }
            }
            (m.link_free - t0) + cost.dram
        };
        data = data.max(c);
    }
    stats.translation_cycles += translation;
    stats.data_cycles += data;
    Ok(translation + data)
}
