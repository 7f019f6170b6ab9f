//! The SIMT engine: runs a [`Kernel`] on a device's [`gmem_sim::Port`] in lockstep warps.
//!
//! ## Model
//! The grid's blocks are queued in order; the [`Dispatch`] policy pins some to units
//! and places the rest on units with a free block slot. A unit holds as many blocks as
//! the [`OccupancyModel`] allows, so `W = blocks × warps per block` warps are resident.
//! Each unit has its own cycle clock; the engine always advances the unit whose clock is
//! earliest, so the units' requests reach the shared TLB and DRAM interleaved in time
//! (a unit that is still the earliest after its step steps again at once, a burst,
//! without the search: the same order).
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
use crate::coalesce::LANES;
use crate::cost::CostModel;
use crate::datacache::DataCache;
use crate::dispatch::{Dispatch, LooseRoundRobin, WarpScheduler, DEAD};
use crate::earliest::{Earliest, IDLE};
use crate::kernel::{Kernel, Op, WarpIo, WarpProgram, LOAD_REGS};
use crate::occupancy::{KernelResources, Occupancy, OccupancyModel};
use crate::wakes::Wakes;
use gmem_core::Gmem;
use gmem_sim::Served;
use std::collections::VecDeque;

mod report;
#[cfg(test)]
mod tests;
pub use report::{RunStats, SimtError};

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

struct Unit<W, S> {
    now: u64,
    warps: Vec<Option<Warp<W>>>,
    ready_at: Vec<u64>,
    /// With at most 64 slots (`MASKED` in the engine): bit `i` set exactly when
    /// `ready_at[i] <= now`.
    ready: u64,
    /// With `MASKED`: the warps waiting on a latency, by the cycle they become ready.
    wakes: Wakes,
    age: Vec<u64>,
    /// Warps left in each block slot (0 = free).
    left: Vec<u32>,
    /// Block slots free (`left` is 0).
    free: usize,
    live: usize,
    /// Live warps waiting in the walk queue (their slots hold [`PARKED`]).
    parked: usize,
    pinned: VecDeque<u64>,
    /// Its warp scheduler (a [`LooseRoundRobin`] by value when every unit has one:
    /// its picks inline; else the boxed ones).
    sched: S,
    l1d: Option<DataCache>,
    /// Register files from earlier launches for this unit's new warps.
    spare_io: Spares,
}

/// A unit's spare register files, from earlier launches (boxed: a warp takes one by
/// moving a pointer, not 2.4 KiB).
#[allow(clippy::vec_box)]
struct Spares(Vec<Box<WarpIo>>);

impl Spares {
    /// A register file for a new warp: a spare one as it is, with only the mask and the
    /// affine declaration reset (see [`WarpIo`] on what a warp may read), else a fresh
    /// one.
    fn take(&mut self) -> Box<WarpIo> {
        match self.0.pop() {
            Some(mut io) => {
                io.mask = 0;
                io.stride = 0;
                io
            }
            None => Box::default(),
        }
    }
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
    /// them as they are (only the mask and the affine declaration are cleared; see
    /// [`WarpIo`] on what a warp may read) instead of zeroing 2.4 KiB each, and the
    /// launch gives every warp's back when it ends. An empty list (or one lost to an
    /// error) only costs fresh ones.
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

    /// The same transaction with the virtual address `va` of its 128-byte line: the
    /// engine calls this one, and the default forwards to
    /// [`transaction`](Self::transaction). An observer that counts by page (the
    /// access counters of a GPU, which count remote accesses per virtual region)
    /// overrides it.
    fn transaction_at(&mut self, unit: usize, va: u64, pa: u64, store: bool, served: Served) {
        let _ = va;
        self.transaction(unit, pa, store, served);
    }
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
    launch: Launch<'_, '_>,
) -> Result<RunStats, SimtError> {
    run_in::<K, true>(dev, kernel, launch)
}

/// [`run`] without its fast paths: every step goes back to the search for the
/// earliest unit, and every waiting warp passes through its unit's wake calendar
/// (what [`run`] does must equal this, counter for counter; a test checks it).
///
/// # Errors
/// As [`run`].
#[cfg(test)]
pub(crate) fn run_stepwise<K: Kernel>(
    dev: Device<'_>,
    kernel: &K,
    launch: Launch<'_, '_>,
) -> Result<RunStats, SimtError> {
    run_in::<K, false>(dev, kernel, launch)
}

/// [`run`], with its fast paths if `FAST`: burst runs — after a step, the unit just
/// stepped steps again at once while it stays the earliest (by
/// [`Earliest::keep_first`]), the dispatcher placed no open block in the step, and the
/// walk queue's head is not due by its clock, exactly the step the search would pick
/// next — and a warp due again by its unit's next clock kept in the ready mask
/// (`Unit::wait_issued`).
fn run_in<K: Kernel, const FAST: bool>(
    dev: Device<'_>,
    kernel: &K,
    launch: Launch<'_, '_>,
) -> Result<RunStats, SimtError> {
    let res = kernel.resources();
    let occ = launch
        .occupancy
        .occupancy(&res)
        .map_err(SimtError::Occupancy)?;
    let n_units = dev.port.units();
    if n_units == 0 {
        return Err(SimtError::NoUnits);
    }
    // A unit with at most 64 slots keeps the ready mask and the wake calendar.
    let masked = occ.blocks_per_sm as usize * res.threads_per_block.div_ceil(32) as usize <= 64;
    // The units' schedulers: the default one by value (the engine is compiled for it,
    // its picks inline), any other through its trait object.
    let scheds: Vec<Box<dyn WarpScheduler>> = (0..n_units).map(|_| (launch.scheduler)()).collect();
    let loose = scheds
        .iter()
        .map(|s| s.as_loose_round_robin())
        .collect::<Option<Vec<LooseRoundRobin>>>();
    match (loose, masked) {
        (Some(l), true) => run_units::<K, _, FAST, true>(dev, kernel, launch, l, (res, occ)),
        (Some(l), false) => run_units::<K, _, FAST, false>(dev, kernel, launch, l, (res, occ)),
        (None, true) => run_units::<K, _, FAST, true>(dev, kernel, launch, scheds, (res, occ)),
        (None, false) => run_units::<K, _, FAST, false>(dev, kernel, launch, scheds, (res, occ)),
    }
}

/// [`run_in`] with unit `u`'s warp scheduler `scheds[u]`, the kernel's resources `res`
/// and occupancy `occ`, and the ready mask and wake calendar kept if `MASKED` (at most
/// 64 slots per unit).
fn run_units<K: Kernel, S: WarpScheduler, const FAST: bool, const MASKED: bool>(
    dev: Device<'_>,
    kernel: &K,
    mut launch: Launch<'_, '_>,
    scheds: Vec<S>,
    (res, occ): (KernelResources, Occupancy),
) -> Result<RunStats, SimtError> {
    let Occupancy {
        blocks_per_sm,
        warps_per_sm,
        ..
    } = occ;
    let n_units = scheds.len();
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
    let mut units: Vec<Unit<K::Warp, S>> = scheds
        .into_iter()
        .map(|sched| {
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
                age: vec![0; slots * wpb],
                left: vec![0; slots],
                free: slots,
                live: 0,
                parked: 0,
                pinned: VecDeque::new(),
                sched,
                l1d: cache(cost.l1_data_geometry)?,
                spare_io: {
                    let spare = &mut *launch.spare_io;
                    Spares(spare.split_off(spare.len().saturating_sub(slots * wpb)))
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
    let l2d =
        cache(cost.l2_data_geometry)?.map(|c| if cost.l2_data_hashed { c.hashed() } else { c });
    let mut mem = Memory::new(l2d, cost);
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
            place::<K, S, MASKED>(unit, kernel, b, slot, wpb, &mut age, &mut stats);
        }
    }
    fill_open::<K, _, MASKED>(
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
                unit.unpark::<MASKED>(q.slot, ready);
            }
            continue;
        }
        let Some(u) = next else {
            break;
        };
        touched = Some(u);
        // Unit `u` steps, then again while it stays first (a burst run).
        loop {
            'stepped: {
                let unit = &mut units[u];
                // A warp that stalls at its wait takes no time, so the unit keeps its clock and
                // stays the earliest with the walk queue as it was: it picks again at once
                // (what the next step would do, without its scan).
                let (now, s, op, w) = 'pick: loop {
                    let now = unit.now;
                    let picked = if MASKED {
                        // Warps whose latency has elapsed join the ready mask.
                        unit.ready |= unit.wakes.take_due(now);
                        unit.sched
                            .pick_ready(unit.ready, &unit.ready_at, &unit.age, now)
                    } else {
                        unit.sched.pick(&unit.ready_at, &unit.age, now)
                    };
                    let Some(s) = picked else {
                        unit.now = if MASKED {
                            // Nothing is ready: every live warp waits in `wakes`, so its earliest
                            // wait is the minimum of `ready_at`.
                            unit.wakes.earliest().expect("a live warp")
                        } else {
                            unit.ready_at.iter().copied().min().expect("a live warp")
                        };
                        break 'stepped;
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
                            unit.park::<MASKED>(s);
                        } else {
                            let at = w.data_at;
                            unit.wait::<MASKED>(s, at);
                        }
                        if unit.live > unit.parked {
                            continue 'pick;
                        }
                        break 'stepped;
                    };
                    break (now, s, op, w);
                };
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
                        // The program's declaration holds for this instruction only.
                        let stride = core::mem::take(&mut w.io.stride);
                        mem.co
                            .fill_declared(&w.io.addr, w.io.mask, stride, launch.page_shift)
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
                                unit.wait_issued::<FAST, MASKED>(s, now + 1);
                            } else {
                                unit.park::<MASKED>(s);
                            }
                            break 'stepped;
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
                                place::<K, S, MASKED>(
                                    unit, kernel, b, slot, wpb, &mut age, &mut stats,
                                );
                            } else {
                                fill_open::<K, _, MASKED>(
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
                        break 'stepped;
                    }
                };
                unit.now += 1;
                unit.wait_issued::<FAST, MASKED>(s, ready);
            }
            // The next step is this unit's again when it stays the earliest, no other unit
            // changed, and the walk queue's head is not due by its clock.
            if !FAST || !placed.is_empty() {
                continue 'step;
            }
            // `keep_first` has set the unit's key either way.
            touched = None;
            let key = clock(&units[u]);
            if !clocks.keep_first(u, key)
                || queue
                    .front()
                    .is_some_and(|q| (q.issue + pwb).max(mem.walkers.next_free()) <= key)
            {
                continue 'step;
            }
        }
    }
    stats.cycles = units.iter().map(|u| u.now).max().unwrap_or(0);
    for u in units {
        launch.spare_wakes.0.push(u.wakes);
        launch.spare_io.extend(u.spare_io.0);
        launch
            .spare_io
            .extend(u.warps.into_iter().flatten().map(|w| w.io));
    }
    Ok(stats)
}

/// A unit's key for [`Earliest`]: its clock while a warp may issue (a live warp not
/// waiting in the walk queue), else [`IDLE`] (no clock reaches it).
fn clock<W, S>(u: &Unit<W, S>) -> u64 {
    if u.live > u.parked {
        u.now
    } else {
        IDLE
    }
}

impl<W, S> Unit<W, S> {
    /// Set slot `s`'s `ready_at` to `at` where the slot is not waiting in `wakes` (a
    /// picked, parked or dead slot): the calendar's entries never go stale, because a
    /// waiting slot's `ready_at` is written only by the push that made it wait (see
    /// `wakes`).
    #[inline]
    fn set_ready_at_unwaited(&mut self, s: usize, at: u64) {
        debug_assert!(!self.wakes.is_pending(s), "slot {s} waits in the calendar");
        self.ready_at[s] = at;
    }

    /// Picked slot `s` waits until cycle `at`: it leaves the ready mask and joins the
    /// calendar (with `MASKED`).
    #[inline]
    fn wait<const MASKED: bool>(&mut self, s: usize, at: u64) {
        self.ready_at[s] = at;
        if MASKED {
            self.ready &= !(1u64 << s);
            self.wakes.push(at, s);
        }
    }

    /// Picked slot `s` issued (the unit's clock has moved past the issue cycle) and
    /// waits until cycle `at`. With `MASKED`, a slot due by the unit's clock (`at` is
    /// at most `now`, e.g. after a non-blocking load) stays in the ready mask instead
    /// of passing through the calendar: the unit's next pick is at `now` or later,
    /// where the calendar would give it back, so that pick sees the same mask. (Only
    /// if `FAST`: `run_stepwise` takes the calendar's way, for the comparison.)
    #[inline]
    fn wait_issued<const FAST: bool, const MASKED: bool>(&mut self, s: usize, at: u64) {
        if FAST && MASKED && at <= self.now {
            self.set_ready_at_unwaited(s, at);
            return;
        }
        self.wait::<MASKED>(s, at);
    }

    /// Picked slot `s` waits in the walk queue: it counts as parked, holds [`PARKED`]
    /// and leaves the ready mask (with `MASKED`).
    #[inline]
    fn park<const MASKED: bool>(&mut self, s: usize) {
        self.parked += 1;
        self.set_ready_at_unwaited(s, PARKED);
        if MASKED {
            self.ready &= !(1u64 << s);
        }
    }

    /// Parked slot `s` left the walk queue and waits until cycle `at` (which may be
    /// before the unit's clock: then it is due at the next pick).
    #[inline]
    fn unpark<const MASKED: bool>(&mut self, s: usize, at: u64) {
        self.parked -= 1;
        self.set_ready_at_unwaited(s, at);
        if MASKED {
            self.wakes.push(at, s);
        }
    }
}

fn free_slot<W, S>(u: &Unit<W, S>) -> Option<usize> {
    if u.free == 0 {
        return None;
    }
    u.left.iter().position(|&l| l == 0)
}

fn place<K: Kernel, S, const MASKED: bool>(
    unit: &mut Unit<K::Warp, S>,
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
                old.io.stride = 0;
                old.block = block;
                old.block_slot = slot;
                old.loaded = 0;
                old.data_at = 0;
            }
            None => {
                unit.warps[i] = Some(Warp {
                    prog: kernel.warp(block, w as u32),
                    // A register file of an earlier launch's warp, as a finished warp's is
                    // reused above: only the mask and the declaration are reset.
                    io: unit.spare_io.take(),
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
        if MASKED {
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

fn fill_open<K: Kernel, S, const MASKED: bool>(
    units: &mut [Unit<K::Warp, S>],
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
        place::<K, S, MASKED>(&mut units[u], kernel, b, slot, wpb, age, stats);
        placed.push(u);
    }
}
