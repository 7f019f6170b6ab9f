//! One memory instruction of the SIMT engine: its bytes moved through the device's
//! port and what its translations and data cost.
//!
//! [`Memory`] holds the state the engine's memory instructions share: the coalescing
//! scratch, the instruction's page list, the shared L2 data cache and DRAM link, and
//! the device's page-table walkers ([`crate::timing`]). [`memory`] runs one coalesced
//! instruction (loads fill the lane values given, stores write them) and returns the
//! cycle its data is ready, charged by the [`CostModel`] as the engine's module
//! documentation describes.

use crate::coalesce::{Coalesced, LANES, TRANSACTION};
use crate::cost::CostModel;
use crate::datacache::DataCache;
use crate::engine::{Device, RunStats};
use crate::kernel::Op;
use crate::timing::Walkers;
use gmem_core::{PhysAddr, Prot, VirtAddr};
use gmem_sim::{AccessError, PageList, Served};
use std::sync::Arc;

use crate::engine::AccessObserver;

/// The state memory instructions share.
pub(crate) struct Memory {
    /// The current instruction, coalesced.
    pub(crate) co: Coalesced,
    /// Its pages, each with the access it makes (see [`fill_pages`]).
    pub(crate) pages: Vec<(VirtAddr, Prot)>,
    /// The port's scratch list, kept across instructions so that its memories serve
    /// the next one; after an access its live entries are that access's pages.
    resolved: PageList,
    /// Physical address of each transaction of the instruction in `co`.
    line_pa: [u64; 32],
    l2d: Option<DataCache>,
    link_free: u64,
    /// Cycles one transaction holds the DRAM link.
    link: u64,
    /// The device's page-table walkers.
    pub(crate) walkers: Walkers,
}

impl Memory {
    /// Fresh state with the shared L2 data cache `l2d` and the walkers and DRAM link of
    /// `cost`.
    pub(crate) fn new(l2d: Option<DataCache>, cost: &CostModel) -> Memory {
        Memory {
            co: Coalesced::default(),
            pages: Vec::with_capacity(32),
            resolved: PageList::new(),
            line_pa: [0; 32],
            l2d,
            link_free: 0,
            link: (TRANSACTION as f64 / cost.dram_bytes_per_cycle).ceil() as u64,
            walkers: Walkers::new(cost.walkers),
        }
    }
}

/// The pages in `m.pages` (filled by [`fill_pages`]) that unit `u`'s TLBs do not hold
/// now, as a mask by page index; 0 when the translator does not say.
pub(crate) fn held_mask(dev: Device<'_>, u: usize, m: &Memory) -> u64 {
    let n = m.pages.len().min(64);
    let all = if n == 64 { !0 } else { (1u64 << n) - 1 };
    dev.port.held(u, &m.pages).map_or(0, |h| all & !h)
}

/// Fill `m.pages` with the coalesced instruction's pages (`m.co`), each with the access
/// `op` makes. Built once per run of an instruction: the issue-time probe
/// ([`held_mask`]) and the translation ([`memory`]) share it. Inlined: it is a few
/// instructions for the usual one page, fewer than a call's.
#[inline]
pub(crate) fn fill_pages(op: Op, m: &mut Memory) {
    let access = if op == Op::Store {
        Prot::WRITE
    } else {
        Prot::READ
    };
    m.pages.clear();
    m.pages
        .extend(m.co.pages.iter().map(|&p| (VirtAddr::new(p), access)));
}

/// The lanes of one memory instruction.
pub(crate) struct Lanes<'a> {
    /// Lane addresses.
    pub(crate) addr: &'a [u64; LANES],
    /// Active lanes.
    pub(crate) mask: u32,
    /// Store values in, load values out.
    pub(crate) value: &'a mut [u32; LANES],
    /// A store (else a load).
    pub(crate) store: bool,
}

/// When an instruction issued and ran, and what it found at issue.
#[derive(Clone, Copy)]
pub(crate) struct When {
    /// Cycle it issued.
    pub(crate) issue: u64,
    /// Cycle it ran (later than `issue` when it waited for a walker).
    pub(crate) run: u64,
    /// Pages (by index in `m.pages`) its unit's TLBs did not hold at issue.
    pub(crate) missed: u64,
    /// No instruction still to run issued before this cycle (walks that ended by then
    /// may be forgotten).
    pub(crate) horizon: u64,
}

/// Run one memory instruction of unit `u`, coalesced in `m.co` with its pages in
/// `m.pages` ([`fill_pages`]), at the times of `when`; returns the cycle its data is
/// ready (for a load, the cycle its values may be used).
///
/// # Errors
/// The port's [`AccessError`] (fault not served, bounds, ...); nothing of the
/// instruction's timing is charged then.
#[allow(clippy::too_many_arguments)]
pub(crate) fn memory(
    dev: Device<'_>,
    u: usize,
    io: Lanes<'_>,
    (cost, page_shift): (&CostModel, u8),
    when: When,
    m: &mut Memory,
    l1d: &mut Option<DataCache>,
    stats: &mut RunStats,
    observer: &mut Option<&mut (dyn AccessObserver + '_)>,
) -> Result<u64, AccessError> {
    let When {
        issue,
        run,
        missed,
        horizon,
    } = when;
    let op = if io.store { Op::Store } else { Op::Load };
    if m.co.transactions.is_empty() {
        return Ok(run + 1);
    }
    let (co, line_pa) = (&m.co, &mut m.line_pa);
    let store = op == Op::Store;
    dev.port
        .with_pages(dev.gm, u, &m.pages, &mut m.resolved, |res| {
            let in_page = (1u64 << page_shift) - 1;
            if co.whole_line() {
                // One aligned line, lane `l` at its word `l` (all 32 lanes active): the
                // values move as the line, in place in the memory, without a lane loop
                // or a lane's offset. Its range is checked by `modify` / `read_with`
                // before anything moves, as the loop below checks each line's.
                let r = &res[co.transaction_page(0)];
                let pa = PhysAddr::new(r.pa.as_u64() + (co.transactions[0] & in_page));
                line_pa[0] = pa.as_u64();
                if let Some(o) = observer.as_mut() {
                    o.transaction_at(u, co.transactions[0], pa.as_u64(), store, r.served);
                }
                if store {
                    return r
                        .memory
                        .modify(pa, TRANSACTION as usize, |line| {
                            for (w, v) in line.chunks_exact_mut(4).zip(io.value.iter()) {
                                w.copy_from_slice(&v.to_le_bytes());
                            }
                        })
                        .map_err(AccessError::Bounds);
                }
                return r
                    .memory
                    .read_with(pa, |line: &[u8; TRANSACTION as usize]| {
                        for (v, w) in io.value.iter_mut().zip(line.chunks_exact(4)) {
                            *v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                        }
                    })
                    .map_err(AccessError::Bounds);
            }
            for (ti, &t) in co.transactions.iter().enumerate() {
                let r = &res[co.transaction_page(ti)];
                let pa = PhysAddr::new(r.pa.as_u64() + (t & in_page));
                line_pa[ti] = pa.as_u64();
                if let Some(o) = observer.as_mut() {
                    o.transaction_at(u, t, pa.as_u64(), store, r.served);
                }
                // Checked before any line moves: a store that fails writes nothing, and
                // a load fails at the same transaction as a read per line would.
                r.memory
                    .check_range(pa, TRANSACTION)
                    .map_err(AccessError::Bounds)?;
            }
            let n = co.transactions.len();
            // The active lanes of each transaction.
            let mut of_tx = [0u32; LANES];
            let mut lanes = io.mask;
            while lanes != 0 {
                let l = lanes.trailing_zeros() as usize;
                lanes &= lanes - 1;
                of_tx[co.lane_transaction(l)] |= 1 << l;
            }
            if !store {
                // Each run of transactions in one memory (usually all of them) read in
                // place under one lock of it, each line's lanes taking their words.
                // This is inside `f`, so under the gate, as a read per line was: no
                // shootdown completes until every line is read, and a racing migration
                // cannot give the frames up before.
                let value = &mut *io.value;
                let mut s = 0;
                while s < n {
                    let memory = &res[co.transaction_page(s)].memory;
                    let mut e = s + 1;
                    while e < n && Arc::ptr_eq(&res[co.transaction_page(e)].memory, memory) {
                        e += 1;
                    }
                    let first = s;
                    memory
                        .read_each_with(&line_pa[s..e], |i, line: &[u8; TRANSACTION as usize]| {
                            let mut lanes = of_tx[first + i];
                            while lanes != 0 {
                                let l = lanes.trailing_zeros() as usize;
                                lanes &= lanes - 1;
                                let off = (io.addr[l] % TRANSACTION) as usize;
                                let w = &line[off..off + 4];
                                value[l] = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                            }
                        })
                        .map_err(AccessError::Bounds)?;
                    s = e;
                }
                return Ok(());
            }
            // Each line's lanes' words written in place under one lock of its memory.
            for (ti, &pa) in line_pa.iter().enumerate().take(n) {
                let r = &res[co.transaction_page(ti)];
                r.memory
                    .modify(PhysAddr::new(pa), TRANSACTION as usize, |line| {
                        let mut lanes = of_tx[ti];
                        while lanes != 0 {
                            let l = lanes.trailing_zeros() as usize;
                            lanes &= lanes - 1;
                            let off = (io.addr[l] % TRANSACTION) as usize;
                            line[off..off + 4].copy_from_slice(&io.value[l].to_le_bytes());
                        }
                    })
                    .map_err(AccessError::Bounds)?;
            }
            Ok(())
        })?;
    // Translation: the slowest page. A hit costs its lookups from issue; a walk holds a
    // shared walker from when the request reached the walkers (or from when the
    // instruction ran, if later); a merged request waits for the walk it merged with.
    if !cost.timed_walks {
        return Ok(untimed(cost, issue, m, l1d, stats, op));
    }
    let at_walkers = (issue + 1 + cost.l1_tlb + cost.l2_tlb).max(run);
    let mut ready = issue + 1;
    for (i, r) in m.resolved.live().iter().enumerate() {
        stats.translations += 1;
        let page = m.co.pages[i];
        let missed_at_issue = i < 64 && missed & (1 << i) != 0;
        let t = match r.served {
            Served::Walk { reads } => {
                stats.walks += 1;
                stats.walk_reads += u64::from(reads);
                let link_free = &mut m.link_free;
                m.walkers.walk_with(page, at_walkers, |start| {
                    walk_end(cost, start, reads, link_free)
                })
            }
            hit => match m.walkers.in_flight(page, issue) {
                Some(end) => {
                    stats.merged += 1;
                    end.max(run)
                }
                None if missed_at_issue => {
                    stats.merged += 1;
                    m.walkers.last_end(page).unwrap_or(run).max(run)
                }
                None if hit == Served::L2 => {
                    stats.served_l2 += 1;
                    issue + 1 + cost.l1_tlb + cost.l2_tlb
                }
                None => {
                    stats.served_l1 += u64::from(hit == Served::L1);
                    issue + 1 + cost.l1_tlb
                }
            },
        };
        ready = ready.max(t);
    }
    m.walkers.prune(horizon.min(issue));
    Ok(data(cost, issue, ready, m, l1d, stats, op))
}

/// The first model's translation cost (`timed_walks` off): the slowest page, walks
/// beyond the walker count queueing behind the instruction's own; then the data.
fn untimed(
    cost: &CostModel,
    issue: u64,
    m: &mut Memory,
    l1d: &mut Option<DataCache>,
    stats: &mut RunStats,
    op: Op,
) -> u64 {
    let (mut worst, mut walks, mut worst_walk) = (0u64, 0u64, 0u64);
    // The page counts in locals, added to `stats` once (kept in registers in the loop).
    let (mut l1, mut l2, mut walk_reads) = (0u64, 0u64, 0u64);
    let live = m.resolved.live();
    for r in live {
        let c = match r.served {
            Served::L1 | Served::Unknown => {
                l1 += u64::from(r.served == Served::L1);
                cost.l1_tlb
            }
            Served::L2 => {
                l2 += 1;
                cost.l1_tlb + cost.l2_tlb
            }
            Served::Walk { reads } => {
                walk_reads += u64::from(reads);
                walks += 1;
                let start = issue + 1 + cost.l1_tlb + cost.l2_tlb;
                let c = walk_end(cost, start, reads, &mut m.link_free) - (issue + 1);
                worst_walk = worst_walk.max(c);
                c
            }
        };
        worst = worst.max(c);
    }
    stats.translations += live.len() as u64;
    stats.served_l1 += l1;
    stats.served_l2 += l2;
    stats.walks += walks;
    stats.walk_reads += walk_reads;
    // Walks beyond the walker count queue (none to divide for the usual 0 or 1 walk).
    let queued = if walks > 1 {
        ((walks - 1) / cost.walkers.max(1)) * worst_walk
    } else {
        0
    };
    let translation = worst + queued;
    data(cost, issue, issue + 1 + translation, m, l1d, stats, op)
}

/// The cycle a walk of `reads` table reads started at `start` ends: a page-walk-cache
/// probe, then its reads one after another, each a DRAM access. With
/// [`CostModel::walk_read_bytes`] set each read also holds the shared DRAM link (free
/// from `*link_free`) for that many bytes, so the data queued behind it waits that
/// much longer (walks take bandwidth, MESC §II-B), while the read itself goes ahead of
/// the queued data: the memory controller serves the walker first (assumption, chosen
/// after a first version that queued walk reads behind all booked data made the
/// streaming vector add 5.1x slower than THP, its walks waiting for the whole queue of
/// every warp's loads; this model has no bound on loads in flight, so that queue is
/// deeper than a real controller's; both measured in harness/results/mesc.md).
#[inline]
fn walk_end(cost: &CostModel, start: u64, reads: u32, link_free: &mut u64) -> u64 {
    let mut t = start + cost.walk_cache;
    if cost.walk_read_bytes == 0 {
        return t + u64::from(reads) * cost.dram;
    }
    let hold = (cost.walk_read_bytes as f64 / cost.dram_bytes_per_cycle).ceil() as u64;
    for _ in 0..reads {
        *link_free = (*link_free).max(t) + hold;
        t += hold + cost.dram;
    }
    t
}

/// Charge the data of the instruction in `m` (issued at `issue`) once its translations
/// are ready at `ready`; returns the cycle the warp is ready again.
///
/// One transaction (a coalesced warp's usual instruction) is charged straight; more go
/// through [`data_each`], in order. Either way each transaction is charged as
/// [`transaction`] says, in ascending order, so the caches and the DRAM link see the
/// same sequence. Inlined into its two callers (a call and its register saves cost
/// more than the single transaction's charge).
#[inline(always)]
fn data(
    cost: &CostModel,
    issue: u64,
    ready: u64,
    m: &mut Memory,
    l1d: &mut Option<DataCache>,
    stats: &mut RunStats,
    op: Op,
) -> u64 {
    let translation = ready - (issue + 1);
    // Data cost: the slowest transaction.
    let t0 = ready;
    let n = m.co.transactions.len();
    let load = op == Op::Load;
    let Memory {
        line_pa,
        l2d,
        link_free,
        link,
        ..
    } = m;
    let dram = (&mut *link_free, *link);
    let data = if n == 1 {
        transaction(cost, t0, line_pa[0], (l1d, l2d), dram, stats, load)
    } else {
        data_each(cost, t0, &line_pa[..n], (l1d, l2d), dram, stats, load)
    };
    stats.transactions += n as u64;
    stats.translation_cycles += translation;
    stats.data_cycles += data;
    t0 + data
}

/// [`data`] for the transactions at `line_pa`: the slowest one's cost.
#[inline(never)]
fn data_each(
    cost: &CostModel,
    t0: u64,
    line_pa: &[u64],
    (l1d, l2d): (&mut Option<DataCache>, &mut Option<DataCache>),
    (link_free, link): (&mut u64, u64),
    stats: &mut RunStats,
    load: bool,
) -> u64 {
    let mut data = 0u64;
    for &pa in line_pa {
        let c = transaction(cost, t0, pa, (l1d, l2d), (link_free, link), stats, load);
        data = data.max(c);
    }
    data
}

/// The cost of one transaction at physical address `pa` whose translation is ready at
/// `t0`, with the unit's L1 and the shared L2 data caches and the DRAM link (the cycle
/// it is free, the cycles a transaction holds it). Each cache it misses is filled: the
/// L1 for a load (from the L2 or DRAM), the L2 always (`touch` is a lookup and that
/// fill in one); a DRAM transaction holds the link from when it is free.
#[inline(always)]
fn transaction(
    cost: &CostModel,
    t0: u64,
    pa: u64,
    (l1d, l2d): (&mut Option<DataCache>, &mut Option<DataCache>),
    (link_free, link): (&mut u64, u64),
    stats: &mut RunStats,
    load: bool,
) -> u64 {
    let l1_hit = load && l1d.as_mut().is_some_and(|c| c.touch(pa));
    if l1_hit {
        stats.l1_data_hits += 1;
        cost.l1_data
    } else if l2d.as_mut().is_some_and(|c| c.touch(pa)) {
        stats.l2_data_hits += 1;
        cost.l2_data
    } else {
        stats.dram_transactions += 1;
        let start = t0.max(*link_free);
        *link_free = start + link;
        (*link_free - t0) + cost.dram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With walk reads on the link, each read holds it for its burst (pushing the
    /// data booked behind it) but does not wait for the data already booked; without,
    /// a walk costs latency only and the link is untouched.
    #[test]
    fn walk_reads_take_link_time_only_when_asked() {
        let mut cost = CostModel::calibrated();
        let mut link = 1_000u64;
        assert_eq!(
            walk_end(&cost, 0, 2, &mut link),
            cost.walk_cache + 2 * cost.dram
        );
        assert_eq!(link, 1_000, "latency only: the link is not touched");
        cost.walk_read_bytes = 64;
        let hold = (64.0 / cost.dram_bytes_per_cycle).ceil() as u64;
        assert_eq!(hold, 2, "one 64-byte burst at 45.7 B/cycle");
        let end = walk_end(&cost, 0, 2, &mut link);
        assert_eq!(end, cost.walk_cache + 2 * (hold + cost.dram));
        assert_eq!(
            link,
            1_000 + 2 * hold,
            "both reads pushed the booked data back"
        );
        let mut idle = 0u64;
        walk_end(&cost, 500, 1, &mut idle);
        assert_eq!(
            idle,
            500 + cost.walk_cache + hold,
            "an idle link is held from the read"
        );
    }
}
