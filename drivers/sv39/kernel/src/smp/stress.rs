//! The stress run: a fixed number of mixed operations per hart against a model.

use super::shootdown::POISON;
use super::{load, now, phase, store, tag, Plan, Smp, ABORT, BARRIER, GAVE_UP, PLAN};
use crate::board::MAX_HARTS;
use crate::sbi;
use crate::trap::probe_write;
use crate::{check, println, Kernel};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};
use gmem_core::{
    AllocRequest, DeviceId, FaultError, MapFlags, MigrateScope, Prot, Region, SpaceId, VaRange,
    VirtAddr, PAGE_SIZE,
};

/// Operations each hart makes in the stress run.
const STRESS_OPS_PER_HART: u64 = 100;
/// Pages of the region every hart writes its own slice of during the stress run.
const SHARED_PAGES: u64 = 16;
/// Regions a hart keeps at most during the stress run.
const STRESS_LIVE: usize = 4;
/// Largest region of the stress run, in pages.
const STRESS_MAX_PAGES: u64 = 8;

/// Stress counters, summed over the harts.
struct StressCounts {
    ops: AtomicU64,
    allocs: AtomicU64,
    writes: AtomicU64,
    verifies: AtomicU64,
    protects: AtomicU64,
    unmaps: AtomicU64,
    async_unmaps: AtomicU64,
    syncs: AtomicU64,
    deallocs: AtomicU64,
    shared_writes: AtomicU64,
    migrations: AtomicU64,
    pages_migrated: AtomicU64,
    words_verified: AtomicU64,
}

static STRESS: StressCounts = StressCounts {
    ops: AtomicU64::new(0),
    allocs: AtomicU64::new(0),
    writes: AtomicU64::new(0),
    verifies: AtomicU64::new(0),
    protects: AtomicU64::new(0),
    unmaps: AtomicU64::new(0),
    async_unmaps: AtomicU64::new(0),
    syncs: AtomicU64::new(0),
    deallocs: AtomicU64::new(0),
    shared_writes: AtomicU64::new(0),
    migrations: AtomicU64::new(0),
    pages_migrated: AtomicU64::new(0),
    words_verified: AtomicU64::new(0),
};

/// The last stamp each hart wrote into its slice of each shared page.
#[allow(clippy::declare_interior_mutable_const)]
const STAMP0: AtomicU64 = AtomicU64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const STAMPS0: [AtomicU64; SHARED_PAGES as usize] = [STAMP0; SHARED_PAGES as usize];
static SHARED_STAMPS: [[AtomicU64; SHARED_PAGES as usize]; MAX_HARTS] = [STAMPS0; MAX_HARTS];

/// xorshift64: the stress run's deterministic choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One region of a hart's stress run: the stamp of each page (0: zero), and the pages
/// an asynchronous unmap left pending. Until the batch drains, this hart's TLB may still
/// translate such a page to its old, quarantined frame (the queue's contract: the
/// invalidation is deferred, the frame not reused), so touching it would be a use after
/// unmap: the hart synchronizes first.
struct Live {
    region: Region,
    stamps: Vec<u64>,
    pending: Vec<bool>,
}

impl Live {
    fn base(&self) -> u64 {
        self.region.start.as_u64()
    }
}

/// Drain the space's queue if any page of `live` is pending.
fn settle(gm: &gmem_core::Gmem, space: SpaceId, live: &mut [Live]) -> Result<(), String> {
    if live.iter().any(|l| l.pending.iter().any(|p| *p)) {
        gm.as_synchronize(space)
            .map_err(|e| format!("as_synchronize: {e}"))?;
        STRESS.syncs.fetch_add(1, Ordering::Relaxed);
        for l in live {
            l.pending.iter_mut().for_each(|p| *p = false);
        }
    }
    Ok(())
}

fn write_page(va: u64, stamp: u64) {
    for w in 0..PAGE_SIZE / 8 {
        store(va + w * 8, tag(va + w * 8, stamp));
    }
}

fn verify_page(va: u64, stamp: u64) -> Result<(), String> {
    for w in 0..PAGE_SIZE / 8 {
        let a = va + w * 8;
        let want = if stamp == 0 { 0 } else { tag(a, stamp) };
        let v = load(a);
        check(v == want, || {
            format!("word {a:#x}: {v:#x}, expected {want:#x}")
        })?;
    }
    STRESS
        .words_verified
        .fetch_add(PAGE_SIZE / 8, Ordering::Relaxed);
    Ok(())
}

/// Phase 5: a hart's share of the stress run.
pub(super) fn stress(k: &Kernel, ctx: &Smp, hart: usize) -> Result<(), String> {
    let gm = &k.gm;
    let plan = *PLAN.lock();
    let c = &STRESS;
    let mut rng =
        Rng(0x9e37_79b9_7f4a_7c15 ^ (hart as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9));
    let mut live: Vec<Live> = Vec::new();
    let slice = PAGE_SIZE / 8 / MAX_HARTS as u64;
    BARRIER.wait("stress start")?;
    for op in 0..STRESS_OPS_PER_HART {
        let roll = rng.below(100);
        let pick = (!live.is_empty()).then(|| rng.below(live.len() as u64) as usize);
        match (roll, pick) {
            (0..=14, _) | (_, None) if live.len() < STRESS_LIVE => {
                let pages = 1 + rng.below(STRESS_MAX_PAGES);
                let region = gm
                    .as_alloc(ctx.space, AllocRequest::new(pages * PAGE_SIZE))
                    .map_err(|e| format!("op {op}: as_alloc: {e}"))?;
                live.push(Live {
                    region,
                    stamps: alloc::vec![0; pages as usize],
                    pending: alloc::vec![false; pages as usize],
                });
                c.allocs.fetch_add(1, Ordering::Relaxed);
            }
            (_, None) => {}
            (0..=39, Some(i)) => {
                settle(gm, ctx.space, &mut live)?;
                let l = &mut live[i];
                let p = rng.below(l.stamps.len() as u64);
                let stamp = rng.next() | 1;
                write_page(l.base() + p * PAGE_SIZE, stamp);
                l.stamps[p as usize] = stamp;
                c.writes.fetch_add(1, Ordering::Relaxed);
            }
            (40..=54, Some(i)) => {
                settle(gm, ctx.space, &mut live)?;
                let l = &live[i];
                let p = rng.below(l.stamps.len() as u64);
                verify_page(l.base() + p * PAGE_SIZE, l.stamps[p as usize])
                    .map_err(|e| format!("op {op}: {e}"))?;
                c.verifies.fetch_add(1, Ordering::Relaxed);
            }
            (55..=61, Some(i)) => {
                settle(gm, ctx.space, &mut live)?;
                let l = &live[i];
                let (p, n) = sub_range(&mut rng, l.stamps.len() as u64);
                let va = l.base() + p * PAGE_SIZE;
                let range =
                    VaRange::new(VirtAddr::new(va), n * PAGE_SIZE).map_err(|e| format!("{e}"))?;
                gm.region_protect(gmem_core::Pages::range(l.region.space, range), Prot::READ)
                    .map_err(|e| format!("op {op}: region_protect: {e}"))?;
                match probe_write(VirtAddr::new(va), POISON) {
                    Err(FaultError::ProtectionViolation { .. }) => {}
                    other => {
                        return Err(format!(
                            "op {op}: write to {va:#x} after protect(READ): {other:?}"
                        ))
                    }
                }
                verify_page(va, l.stamps[p as usize]).map_err(|e| format!("op {op}: {e}"))?;
                gm.region_protect(gmem_core::Pages::range(l.region.space, range), Prot::RW)
                    .map_err(|e| format!("op {op}: region_protect: {e}"))?;
                c.protects.fetch_add(1, Ordering::Relaxed);
            }
            (62..=67, Some(i)) => {
                // Pages move between the two memories; their contents must not change.
                settle(gm, ctx.space, &mut live)?;
                let l = &live[i];
                let (p, n) = sub_range(&mut rng, l.stamps.len() as u64);
                let range = VaRange::new(VirtAddr::new(l.base() + p * PAGE_SIZE), n * PAGE_SIZE)
                    .map_err(|e| format!("{e}"))?;
                let target = if rng.below(2) == 0 { ctx.second } else { k.cpu };
                let moved = gm
                    .region_migrate(
                        gmem_core::Pages::range(l.region.space, range),
                        target,
                        MigrateScope::Populated,
                    )
                    .map_err(|e| format!("op {op}: region_migrate: {e}"))?;
                c.migrations.fetch_add(1, Ordering::Relaxed);
                c.pages_migrated.fetch_add(moved, Ordering::Relaxed);
                verify_page(l.base() + p * PAGE_SIZE, l.stamps[p as usize])
                    .map_err(|e| format!("op {op}: after migration: {e}"))?;
            }
            (68..=82, Some(i)) => {
                let asynchronous = roll >= 75;
                let l = &mut live[i];
                let (p, n) = sub_range(&mut rng, l.stamps.len() as u64);
                let range = VaRange::new(VirtAddr::new(l.base() + p * PAGE_SIZE), n * PAGE_SIZE)
                    .map_err(|e| format!("{e}"))?;
                let flags = if asynchronous {
                    MapFlags::ASYNC
                } else {
                    MapFlags::empty()
                };
                gm.region_unmap(gmem_core::Pages::range(l.region.space, range), flags, None)
                    .map_err(|e| format!("op {op}: region_unmap: {e}"))?;
                for s in &mut l.stamps[p as usize..(p + n) as usize] {
                    *s = 0;
                }
                for q in &mut l.pending[p as usize..(p + n) as usize] {
                    *q = asynchronous;
                }
                if asynchronous {
                    c.async_unmaps.fetch_add(1, Ordering::Relaxed);
                } else {
                    c.unmaps.fetch_add(1, Ordering::Relaxed);
                }
            }
            (83..=87, _) => {
                gm.as_synchronize(ctx.space)
                    .map_err(|e| format!("op {op}: as_synchronize: {e}"))?;
                c.syncs.fetch_add(1, Ordering::Relaxed);
                for l in &mut live {
                    l.pending.iter_mut().for_each(|p| *p = false);
                }
            }
            (88..=93, Some(i)) => {
                settle(gm, ctx.space, &mut live)?;
                let l = live.swap_remove(i);
                for (p, s) in l.stamps.iter().enumerate() {
                    verify_page(l.base() + p as u64 * PAGE_SIZE, *s)
                        .map_err(|e| format!("op {op}: {e}"))?;
                }
                let flags = if rng.below(2) == 0 {
                    MapFlags::ASYNC
                } else {
                    MapFlags::empty()
                };
                gm.region_dealloc(l.region, flags, None)
                    .map_err(|e| format!("op {op}: region_dealloc: {e}"))?;
                c.deallocs.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                let p = rng.below(SHARED_PAGES);
                let stamp = rng.next() | 1;
                let first = plan.a + p * PAGE_SIZE + hart as u64 * slice * 8;
                for w in 0..slice {
                    store(first + w * 8, tag(first + w * 8, stamp));
                }
                SHARED_STAMPS[hart][p as usize].store(stamp, Ordering::Release);
                for w in 0..slice {
                    let a = first + w * 8;
                    let v = load(a);
                    check(v == tag(a, stamp), || {
                        format!("op {op}: shared word {a:#x}: {v:#x}")
                    })?;
                }
                c.shared_writes.fetch_add(1, Ordering::Relaxed);
            }
        }
        c.ops.fetch_add(1, Ordering::Relaxed);
        if ABORT.load(Ordering::Acquire) {
            return Err(GAVE_UP.into());
        }
    }
    // Every byte of every region left, then free them.
    settle(gm, ctx.space, &mut live)?;
    for l in live.drain(..) {
        for (p, s) in l.stamps.iter().enumerate() {
            verify_page(l.base() + p as u64 * PAGE_SIZE, *s)?;
        }
        gm.region_dealloc(l.region, MapFlags::empty(), None)
            .map_err(|e| format!("region_dealloc: {e}"))?;
        c.deallocs.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// A random non-empty page range `(first, count)` of a region of `pages` pages.
fn sub_range(rng: &mut Rng, pages: u64) -> (u64, u64) {
    let p = rng.below(pages);
    (p, 1 + rng.below(pages - p))
}

/// The boot hart's side: the shared region, the phase, the final verification, the
/// invariant check and the frame count, and the `smp: stress ok` line.
///
/// # Errors
/// The first check that failed.
pub(super) fn run(k: &Kernel, space: SpaceId, boot: usize, second: DeviceId) -> Result<(), String> {
    let gm = &k.gm;
    let registered = gm.dev_frames(k.cpu).map_err(|e| format!("{e}"))?;
    let second_free = gm.dev_frames(second).map_err(|e| format!("{e}"))?.free;
    let shared = gm
        .as_alloc(space, AllocRequest::new(SHARED_PAGES * PAGE_SIZE))
        .map_err(|e| format!("as_alloc: {e}"))?;
    *PLAN.lock() = Plan {
        a: shared.start.as_u64(),
        b: 0,
        value: 0,
    };
    let before = gm.stats();
    let fences_before = sbi::REMOTE_FENCES.load(Ordering::Relaxed);
    let t0 = now();
    phase(6, boot)?;
    let ticks = now().wrapping_sub(t0);
    gm.as_synchronize(space)
        .map_err(|e| format!("as_synchronize: {e}"))?;
    gm.check_invariants(space)
        .map_err(|e| format!("invariants after the stress run: {e:?}"))?;
    // The shared region: every hart's last stamp per page (they wrote their own slice).
    let slice = PAGE_SIZE / 8 / MAX_HARTS as u64;
    for p in 0..SHARED_PAGES {
        for h in 0..MAX_HARTS as u64 {
            let stamp = SHARED_STAMPS[h as usize][p as usize].load(Ordering::Acquire);
            for w in 0..slice {
                let va = shared.start.as_u64() + p * PAGE_SIZE + (h * slice + w) * 8;
                let want = if stamp == 0 { 0 } else { tag(va, stamp) };
                let v = load(va);
                check(v == want, || {
                    format!("shared word {va:#x}: {v:#x}, expected {want:#x}")
                })?;
            }
        }
    }
    STRESS
        .words_verified
        .fetch_add(SHARED_PAGES * PAGE_SIZE / 8, Ordering::Relaxed);
    gm.region_dealloc(shared, MapFlags::empty(), None)
        .map_err(|e| format!("region_dealloc: {e}"))?;
    gm.as_synchronize(space)
        .map_err(|e| format!("as_synchronize: {e}"))?;
    gm.check_invariants(space)
        .map_err(|e| format!("invariants after the stress run's frees: {e:?}"))?;
    let after = gm.dev_frames(k.cpu).map_err(|e| format!("{e}"))?;
    check(after.free == registered.free, || {
        format!(
            "{} frames free after the stress run, {} before",
            after.free, registered.free
        )
    })?;
    let second_after = gm.dev_frames(second).map_err(|e| format!("{e}"))?.free;
    check(second_after == second_free, || {
        format!("{second_after} frames of the second memory free after the stress run, {second_free} before")
    })?;
    let s = gm.stats();
    let c = &STRESS;
    let ops = c.ops.load(Ordering::Relaxed);
    check(ops == STRESS_OPS_PER_HART * MAX_HARTS as u64, || {
        format!("{ops} stress operations ran")
    })?;
    println!(
        "smp: stress ok: {ops} operations on {MAX_HARTS} harts in {} ms ({} allocs, {} page writes, {} page verifies, {} protect/refused-write/unprotect, {} strict range unmaps, {} async range unmaps, {} synchronizes, {} deallocs, {} shared-page writes, {} migrations moving {} pages between the two memories); {} faults served ({} zero-fills, {} migrations back, {} spurious), {} async batches, {} SBI remote fences; invariants hold, {} words verified, every frame back",
        ticks / 10_000,
        c.allocs.load(Ordering::Relaxed),
        c.writes.load(Ordering::Relaxed),
        c.verifies.load(Ordering::Relaxed),
        c.protects.load(Ordering::Relaxed),
        c.unmaps.load(Ordering::Relaxed),
        c.async_unmaps.load(Ordering::Relaxed),
        c.syncs.load(Ordering::Relaxed),
        c.deallocs.load(Ordering::Relaxed),
        c.shared_writes.load(Ordering::Relaxed),
        c.migrations.load(Ordering::Relaxed),
        c.pages_migrated.load(Ordering::Relaxed),
        (s.faults_zero_fill
            + s.faults_spurious
            + s.faults_map_existing
            + s.faults_migrate
            + s.faults_remote)
            - (before.faults_zero_fill
                + before.faults_spurious
                + before.faults_map_existing
                + before.faults_migrate
                + before.faults_remote),
        s.faults_zero_fill - before.faults_zero_fill,
        s.faults_migrate - before.faults_migrate,
        s.faults_spurious - before.faults_spurious,
        s.async_batches - before.async_batches,
        sbi::REMOTE_FENCES.load(Ordering::Relaxed) - fences_before,
        c.words_verified.load(Ordering::Relaxed),
    );
    Ok(())
}
