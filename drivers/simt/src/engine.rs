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
//! ## Scoreboard
//! A blocking instruction ([`Op::Load`], [`Op::Store`]) makes its warp wait for it.
//! An [`Op::LoadTo`] does not: its bytes move (at issue, or when it leaves the walk
//! queue) into the named register, the warp issues on, and its [`Op::Wait`] takes no
//! issue slot and stalls the warp until the latest of its loads has its data (or, if
//! some still wait for a walker, until they have run). Each warp keeps the registers
//! loaded since its last wait, so a register loaded twice, or a warp exiting with
//! loads it never waited for, is a [`SimtError::Register`].
//!
//! ## Timed walks
//! At issue the engine asks which of the instruction's pages the unit's TLBs hold
//! ([`gmem_sim::Port::held`], no counter moves). When all are held the instruction
//! runs at once. Otherwise the warp stalls and the instruction joins one queue shared
//! by all units (the page walk buffer): it runs — looks its pages up, walks the missing
//! ones, fills the TLBs, moves its bytes — when it reaches the head of the queue and a
//! walker is free, in global time order with every other unit's instructions. So a
//! walk's fill lands when the instruction runs, not when it was issued, and warps
//! whose pages hit run ahead while others wait for walkers. Each walk holds one of the
//! [`CostModel::walkers`] walkers for its latency (the `timing` module); a request for a
//! page whose walk is in flight waits for it and counts as a merged miss
//! ([`RunStats::merged`]), as does a request that missed at issue and finds the page
//! filled by another's walk when it runs. What is rebuilt rather than taken from the
//! MESC text (which names gem5-gpu and the walkers, not their timing): all of an
//! instruction's fills land when it runs, i.e. when its first walk starts (the walks'
//! ends would need deferred TLB updates), the walkers as the only queue (TLB ports
//! are not limited), and the issue-time probe that ignores
//! permissions and dirty bits (a store through a clean entry walks at once, on a
//! walker from the same pool).
//!
//! The MMU's own counters (and a recorded stream, which replays to them exactly) see
//! each lookup when the instruction runs: a merged request is a hit there. The engine's
//! [`RunStats`] classify requests by issue time.
//!
//! Faults are not timed (the first touch of a page costs its translation as served
//! after the retry). Everything is deterministic.

use crate::access::{fill_pages, held_mask, memory, Lanes, Memory, When};
use crate::coalesce::{CoalesceError, LANES};
use crate::cost::CostModel;
use crate::datacache::DataCache;
use crate::dispatch::{Dispatch, WarpScheduler, DEAD};
use crate::earliest::{Earliest, IDLE};
use crate::kernel::{Kernel, Op, WarpIo, WarpProgram, LOAD_REGS};
use crate::occupancy::{Occupancy, OccupancyError, OccupancyModel};
use crate::wakes::Wakes;
use gmem_core::Gmem;
use gmem_sim::{AccessError, Served};
use std::collections::VecDeque;
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
    /// A warp loaded into a register it had already loaded since its last
    /// [`Op::Wait`], or into one beyond [`LOAD_REGS`], or exited with loads it never
    /// waited for (a program error; the warp's earlier instructions stay done).
    Register {
        /// The block.
        block: u64,
        /// The register (`None`: exited with loads outstanding).
        reg: Option<u8>,
    },
}

impl fmt::Display for SimtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimtError::Occupancy(e) => write!(f, "occupancy: {e}"),
            SimtError::Coalesce { block, error } => write!(f, "block {block}: {error:?}"),
            SimtError::Access { block, error } => write!(f, "block {block}: {error}"),
            SimtError::Geometry => write!(f, "bad data-cache geometry"),
            SimtError::NoUnits => write!(f, "the device has no compute unit"),
            SimtError::Register {
                block,
                reg: Some(r),
            } => write!(
                f,
                "block {block}: register {r} loaded twice or out of range"
            ),
            SimtError::Register { block, reg: None } => {
                write!(
                    f,
                    "block {block}: a warp exited with loads it did not wait for"
                )
            }
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
    /// Requests that missed while a walk of their page was in flight (or missed at
    /// issue and found the page filled by another request's walk) and waited for it:
    /// neither a hit nor a walk of their own.
    pub merged: u64,
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
        self.merged += o.merged;
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
    /// Boxed so that the register file moves between launches without a copy.
    io: Box<WarpIo>,
    block: u64,
    block_slot: usize,
    /// The scoreboard: registers loaded since the last [`Op::Wait`] (bit `r`).
    loaded: u32,
    /// The cycle the latest of those loads that has run has its data.
    data_at: u64,
    /// Those loads still waiting in the walk queue.
    queued: u32,
    /// Parked at an [`Op::Wait`] until its queued loads run.
    waiting: bool,
}

struct Unit<W> {
    now: u64,
    warps: Vec<Option<Warp<W>>>,
    ready_at: Vec<u64>,
    /// With at most 64 slots (`masked`): bit `i` set exactly when `ready_at[i] <= now`.
    ready: u64,
    /// With `masked`: the warps waiting on a latency, by the cycle they become ready.
    wakes: Wakes,
    /// The unit has at most 64 slots, so `ready` and `wakes` are kept and the scheduler
    /// picks from the mask.
    masked: bool,
    age: Vec<u64>,
    /// Warps left in each block slot (0 = free).
    left: Vec<u32>,
    /// Block slots free (`left` is 0).
    free: usize,
    live: usize,
    /// Live warps waiting in the walk queue (their slots hold [`PARKED`]).
    parked: usize,
    pinned: VecDeque<u64>,
    sched: Box<dyn WarpScheduler>,
    l1d: Option<DataCache>,
    /// Register files from earlier launches for this unit's new warps (boxed: a warp
    /// takes one by moving a pointer, not 2.4 KiB).
    #[allow(clippy::vec_box)]
    spare_io: Vec<Box<WarpIo>>,
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
    /// Warp register files ([`WarpIo`]) kept from earlier launches: new warps take
    /// them as they are (only the mask is cleared; see [`WarpIo`] on what a warp may
    /// read) instead of zeroing 2.4 KiB each, and the launch gives every warp's back
    /// when it ends. An empty list (or one lost to an error) only costs fresh ones.
    pub spare_io: &'a mut Vec<Box<WarpIo>>,
    /// The units' wake calendars kept from earlier launches (a launch would otherwise
    /// clear 32 KiB per unit); the launch gives them back when it ends.
    pub spare_wakes: &'a mut SpareWakes,
}

/// Wake calendars kept between launches (see [`Launch::spare_wakes`]); the default
/// holds none.
#[derive(Default)]
pub struct SpareWakes(Vec<Wakes>);

/// Sees every transaction a launch makes.
pub trait AccessObserver {
    /// Unit `unit` moved the 128 bytes at physical `pa` (a store if `store`), through a
    /// translation served as `served`.
    fn transaction(&mut self, unit: usize, pa: u64, store: bool, served: Served);
}

/// `ready_at` of a warp whose instruction waits in the walk queue.
const PARKED: u64 = DEAD - 1;

/// An instruction waiting for a walker.
struct Queued {
    unit: usize,
    slot: usize,
    op: Op,
    /// Cycle it issued.
    issue: u64,
    /// Pages (by index) the unit's TLBs did not hold at issue.
    missed: u64,
    /// Lane addresses and mask of an [`Op::LoadTo`] (its warp has issued on since and
    /// its `io` holds other operands); unused for a blocking instruction.
    addr: [u64; LANES],
    mask: u32,
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
    let cache = |(sets, ways): (usize, usize)| -> Result<Option<DataCache>, SimtError> {
        if !cost.data_caches {
            return Ok(None);
        }
        DataCache::new(sets, ways)
            .map(Some)
            .ok_or(SimtError::Geometry)
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
                wakes: launch
                    .spare_wakes
                    .0
                    .pop()
                    .map_or_else(Wakes::new, Wakes::reused),
                masked: slots * wpb <= 64,
                age: vec![0; slots * wpb],
                left: vec![0; slots],
                free: slots,
                live: 0,
                parked: 0,
                pinned: VecDeque::new(),
                sched: (launch.scheduler)(),
                l1d: cache(cost.l1_data_geometry)?,
                spare_io: {
                    let spare = &mut *launch.spare_io;
                    spare.split_off(spare.len().saturating_sub(slots * wpb))
                },
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
    let mut mem = Memory::new(cache(cost.l2_data_geometry)?, cost);
    let mut queue: VecDeque<Queued> = VecDeque::new();
    let mut stats = RunStats {
        warps_per_unit: warps_per_sm,
        ..RunStats::default()
    };
    let mut age = 0u64;
    // The units with a free block slot, when the dispatcher places open blocks, and the
    // units it placed blocks on since the last step.
    let (mut cands, mut placed) = (Vec::with_capacity(n_units), Vec::new());
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
        (kernel, wpb, 0),
        &mut age,
        &mut stats,
        (&mut cands, &mut placed),
    );
    let pwb = 1 + cost.l1_tlb + cost.l2_tlb;
    // The units with a warp that may issue, by clock: each step changes one unit
    // (`touched`) and those the dispatcher placed blocks on (`placed`); all at first.
    let mut clocks = Earliest::new(n_units);
    let (mut touched, mut all) = (None::<usize>, true);
    'step: loop {
        if all {
            for (i, u) in units.iter().enumerate() {
                clocks.set(i, clock(u));
            }
            all = false;
            placed.clear();
        } else {
            if let Some(t) = touched.take() {
                clocks.set(t, clock(&units[t]));
            }
            // The units the dispatcher placed blocks on (no other unit changed).
            if !placed.is_empty() {
                for &p in &placed {
                    clocks.set(p, clock(&units[p]));
                }
                placed.clear();
            }
        }
        let next = clocks.first();
        // The head of the walk queue runs when it has reached the walkers and one is
        // free, before any instruction issued later.
        let head = queue
            .front()
            .map(|q| (q.issue + pwb).max(mem.walkers.next_free()));
        if let Some(t) = head.filter(|&t| next.map_or(true, |u| t <= units[u].now)) {
            let q = queue.pop_front().expect("head");
            touched = Some(q.unit);
            let horizon = queue.front().map_or(q.issue, |h| h.issue);
            let unit = &mut units[q.unit];
            let w = unit.warps[q.slot].as_mut().expect("a queued warp is live");
            let block = w.block;
            let (addr, mask) = match q.op {
                Op::LoadTo(_) => (&q.addr, q.mask),
                _ => (&w.io.addr, w.io.mask),
            };
            mem.co
                .fill(addr, mask, launch.page_shift)
                .map_err(|error| SimtError::Coalesce { block, error })?;
            fill_pages(q.op, &mut mem);
            let value = match q.op {
                Op::LoadTo(r) => &mut w.io.regs[usize::from(r)],
                _ => &mut w.io.value,
            };
            let ready = memory(
                dev,
                q.unit,
                Lanes {
                    addr,
                    mask,
                    value,
                    store: q.op == Op::Store,
                },
                (cost, launch.page_shift),
                When {
                    issue: q.issue,
                    run: t,
                    missed: q.missed,
                    horizon,
                },
                &mut mem,
                &mut unit.l1d,
                &mut stats,
                &mut launch.observer,
            )
            .map_err(|error| SimtError::Access { block, error })?;
            let wake = if let Op::LoadTo(_) = q.op {
                // A load the warp issued past: it is ready when its data is and the
                // warp has reached its wait.
                w.queued -= 1;
                w.data_at = w.data_at.max(ready);
                (w.queued == 0 && w.waiting).then(|| {
                    w.waiting = false;
                    w.data_at
                })
            } else {
                Some(ready)
            };
            if let Some(ready) = wake {
                unit.parked -= 1;
                unit.ready_at[q.slot] = ready;
                if unit.masked {
                    unit.wakes.push(ready, q.slot);
                }
            }
            continue;
        }
        let Some(u) = next else {
            break;
        };
        touched = Some(u);
        let unit = &mut units[u];
        // A warp that stalls at its wait takes no time, so the unit keeps its clock and
        // stays the earliest with the walk queue as it was: it picks again at once
        // (what the next step would do, without its scan).
        let (now, s, op) = 'pick: loop {
            let now = unit.now;
            let picked = if unit.masked {
                // Warps whose latency has elapsed join the ready mask.
                unit.ready |= unit.wakes.take_due(now);
                unit.sched
                    .pick_ready(unit.ready, &unit.ready_at, &unit.age, now)
            } else {
                unit.sched.pick(&unit.ready_at, &unit.age, now)
            };
            let Some(s) = picked else {
                unit.now = if unit.masked {
                    // Nothing is ready: every live warp waits in `wakes`, so its earliest
                    // wait is the minimum of `ready_at`.
                    unit.wakes.earliest().expect("a live warp")
                } else {
                    unit.ready_at.iter().copied().min().expect("a live warp")
                };
                continue 'step;
            };
            let w = unit.warps[s].as_mut().expect("scheduler picks live warps");
            // A wait whose loads all have their data by now costs nothing: the program
            // goes on to its next instruction in the same issue slot.
            let op = loop {
                let op = w.prog.next(&mut w.io);
                if op != Op::Wait {
                    break Some(op);
                }
                w.loaded = 0;
                if w.queued > 0 || w.data_at > now {
                    break None;
                }
            };
            let Some(op) = op else {
                // Stall at the first use of a loaded register (the scoreboard).
                if w.queued > 0 {
                    w.waiting = true;
                    unit.parked += 1;
                    unit.set_ready_at_unwaited(s, PARKED);
                    if unit.masked {
                        unit.ready &= !(1u64 << s);
                    }
                } else {
                    unit.ready_at[s] = w.data_at;
                    if unit.masked {
                        unit.ready &= !(1u64 << s);
                        unit.wakes.push(w.data_at, s);
                    }
                }
                if unit.live > unit.parked {
                    continue 'pick;
                }
                continue 'step;
            };
            break (now, s, op);
        };
        let w = unit.warps[s].as_mut().expect("the picked warp is live");
        stats.instructions += 1;
        let ready = match op {
            Op::Compute(c) => now + 1 + u64::from(c),
            Op::Wait => unreachable!("waits are taken above"),
            Op::Load | Op::Store | Op::LoadTo(_) => {
                let block = w.block;
                stats.memory_instructions += 1;
                if let Op::LoadTo(r) = op {
                    if usize::from(r) >= LOAD_REGS || w.loaded & (1 << r) != 0 {
                        return Err(SimtError::Register {
                            block,
                            reg: Some(r),
                        });
                    }
                    w.loaded |= 1 << r;
                }
                mem.co
                    .fill(&w.io.addr, w.io.mask, launch.page_shift)
                    .map_err(|error| SimtError::Coalesce { block, error })?;
                fill_pages(op, &mut mem);
                let missed = if cost.timed_walks {
                    held_mask(dev, u, &mem)
                } else {
                    0
                };
                if missed != 0 {
                    // The instruction waits for a walker; a blocking one stalls its
                    // warp until then, a non-blocking load lets it issue on.
                    queue.push_back(Queued {
                        unit: u,
                        slot: s,
                        op,
                        issue: now,
                        missed,
                        addr: w.io.addr,
                        mask: w.io.mask,
                    });
                    unit.now += 1;
                    if let Op::LoadTo(_) = op {
                        w.queued += 1;
                        unit.ready_at[s] = now + 1;
                        if unit.masked {
                            unit.ready &= !(1u64 << s);
                            unit.wakes.push(now + 1, s);
                        }
                    } else {
                        unit.parked += 1;
                        unit.set_ready_at_unwaited(s, PARKED);
                        if unit.masked {
                            unit.ready &= !(1u64 << s);
                        }
                    }
                    continue;
                }
                let (io, store) = (&mut w.io, op == Op::Store);
                let value = match op {
                    Op::LoadTo(r) => &mut io.regs[usize::from(r)],
                    _ => &mut io.value,
                };
                let ready = memory(
                    dev,
                    u,
                    Lanes {
                        addr: &io.addr,
                        mask: io.mask,
                        value,
                        store,
                    },
                    (cost, launch.page_shift),
                    When {
                        issue: now,
                        run: now,
                        missed: 0,
                        horizon: queue.front().map_or(now, |q| q.issue),
                    },
                    &mut mem,
                    &mut unit.l1d,
                    &mut stats,
                    &mut launch.observer,
                )
                .map_err(|error| SimtError::Access { block, error })?;
                if let Op::LoadTo(_) = op {
                    w.data_at = w.data_at.max(ready);
                    now + 1
                } else {
                    ready
                }
            }
            Op::Exit => {
                if w.loaded != 0 {
                    return Err(SimtError::Register {
                        block: w.block,
                        reg: None,
                    });
                }
                let slot = w.block_slot;
                // The slot keeps the finished program for reuse; DEAD keeps it out of
                // the schedulers.
                unit.set_ready_at_unwaited(s, DEAD);
                unit.ready &= !(1u64 << (s & 63));
                unit.live -= 1;
                unit.left[slot] -= 1;
                unit.now += 1;
                if unit.left[slot] == 0 {
                    unit.free += 1;
                    if let Some(b) = unit.pinned.pop_front() {
                        place(unit, kernel, b, slot, wpb, &mut age, &mut stats);
                    } else {
                        fill_open(
                            &mut units,
                            &mut open,
                            &mut *launch.dispatch,
                            (kernel, wpb, now),
                            &mut age,
                            &mut stats,
                            (&mut cands, &mut placed),
                        );
                    }
                }
                continue;
            }
        };
        unit.ready_at[s] = ready;
        if unit.masked {
            unit.ready &= !(1u64 << s);
            unit.wakes.push(ready, s);
        }
        unit.now += 1;
    }
    stats.cycles = units.iter().map(|u| u.now).max().unwrap_or(0);
    for u in units {
        launch.spare_wakes.0.push(u.wakes);
        launch.spare_io.extend(u.spare_io);
        launch
            .spare_io
            .extend(u.warps.into_iter().flatten().map(|w| w.io));
    }
    Ok(stats)
}

/// A unit's key for [`Earliest`]: its clock while a warp may issue (a live warp not
/// waiting in the walk queue), else [`IDLE`] (no clock reaches it).
fn clock<W>(u: &Unit<W>) -> u64 {
    if u.live > u.parked {
        u.now
    } else {
        IDLE
    }
}

impl<W> Unit<W> {
    /// Set slot `s`'s `ready_at` to `at` where the slot is not waiting in `wakes` (a
    /// picked, parked or dead slot): the calendar's entries never go stale, because a
    /// waiting slot's `ready_at` is written only by the push that made it wait (see
    /// `wakes`).
    #[inline]
    fn set_ready_at_unwaited(&mut self, s: usize, at: u64) {
        debug_assert!(!self.wakes.is_pending(s), "slot {s} waits in the calendar");
        self.ready_at[s] = at;
    }
}

fn free_slot<W>(u: &Unit<W>) -> Option<usize> {
    if u.free == 0 {
        return None;
    }
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
                old.loaded = 0;
                old.data_at = 0;
            }
            None => {
                unit.warps[i] = Some(Warp {
                    prog: kernel.warp(block, w as u32),
                    io: match unit.spare_io.pop() {
                        // A register file of an earlier launch's warp, as a finished
                        // warp's is reused above: only the mask is reset.
                        Some(mut io) => {
                            io.mask = 0;
                            io
                        }
                        None => Box::default(),
                    },
                    block,
                    block_slot: slot,
                    loaded: 0,
                    data_at: 0,
                    queued: 0,
                    waiting: false,
                })
            }
        }
        let now = unit.now;
        unit.set_ready_at_unwaited(i, now);
        if unit.masked {
            unit.ready |= 1 << i;
        }
        unit.age[i] = *age;
        *age += 1;
    }
    unit.left[slot] = wpb as u32;
    unit.free -= 1;
    unit.live += wpb;
    stats.blocks += 1;
    stats.warps += wpb as u64;
}

fn fill_open<K: Kernel>(
    units: &mut [Unit<K::Warp>],
    open: &mut VecDeque<u64>,
    dispatch: &mut dyn Dispatch,
    (kernel, wpb, now): (&K, usize, u64),
    age: &mut u64,
    stats: &mut RunStats,
    (cands, placed): (&mut Vec<usize>, &mut Vec<usize>),
) {
    while !open.is_empty() {
        cands.clear();
        cands.extend((0..units.len()).filter(|&u| units[u].free > 0));
        if cands.is_empty() {
            return;
        }
        let u = dispatch.choose(cands);
        let u = if cands.contains(&u) { u } else { cands[0] };
        let b = open.pop_front().expect("not empty");
        let slot = free_slot(&units[u]).expect("candidate has room");
        // A unit whose warps all wait for walkers kept the clock of its last issue:
        // the block starts now, not then.
        units[u].now = units[u].now.max(now);
        place(&mut units[u], kernel, b, slot, wpb, age, stats);
        placed.push(u);
    }
}
