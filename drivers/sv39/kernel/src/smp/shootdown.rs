//! The TLB shootdown checks: strict dealloc, protect(READ), asynchronous dealloc,
//! migration; each with the other harts spinning on the page.

use super::{
    boot_hart, fail, finish, load, now, phase, run_phase, store, tag, wait_until, Plan, ABORT,
    BARRIER, GAVE_UP, PHASE, PLAN, SMP, UP, WAIT_TICKS,
};
use crate::board::MAX_HARTS;
use crate::memory::Layout;
use crate::sbi::{self, SmpHart};
use crate::trap::{probe_read, probe_write};
use crate::{check, println, Kernel};
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use gmem_core::{
    AllocRequest, DeviceId, FaultError, MapFlags, MigrateScope, PageTableRoot, Placement,
    PlacementMode, PlacementTarget, Prot, Region, SpaceId, VaRange, VirtAddr, PAGE_SIZE,
};
use gmem_sv39::Sv39;

/// `time` ticks the asynchronous check leaves the spinners between the dealloc and
/// the drain (20 ms).
const ASYNC_WINDOW_TICKS: u64 = 200_000;

/// The deliberately broken build (`no-shootdown`): each shootdown check must fail with
/// a [`STALE`] failure, and the run fails after all of them.
pub(super) const NEGATIVE: bool = cfg!(feature = "no-shootdown");
/// What a shootdown check's failure says when a hart used a translation the core had
/// invalidated (`cargo xtask qemu` looks for it).
const STALE: &str = "stale translation";

/// Contents written into a freed frame after its unmap returned.
pub(super) const POISON: u64 = 0x5057_4e45_445f_4652;

/// Spinners that read the page at least once.
static READY: AtomicU32 = AtomicU32::new(0);
/// Strict check: the dealloc returned (and the freed frame holds `POISON`).
static STRICT_GO: AtomicBool = AtomicBool::new(false);
/// Asynchronous check: 1 once the dealloc returned, 2 once the batch drained (and the
/// freed frame holds `POISON`).
static ASYNC_GO: AtomicU32 = AtomicU32::new(0);
/// Migration check: the page moved and its new frame holds [`NEW_CONTENTS`].
static MIGRATE_GO: AtomicBool = AtomicBool::new(false);
/// What the migration check writes into the page's new frame.
const NEW_CONTENTS: u64 = 0x4e45_5746_5241_4d45;
/// Spinners' reads of the old contents after the asynchronous dealloc returned.
static ASYNC_STALE_READS: AtomicU64 = AtomicU64::new(0);
/// Spinners that took the fault (and read nothing after the invalidation completed).
static FAULTED: AtomicU32 = AtomicU32::new(0);
/// Harts whose write after `protect(READ)` was refused.
static WRITES_REFUSED: AtomicU32 = AtomicU32::new(0);

/// A shootdown check's outcome. In the real build a failure fails the run; in the
/// `no-shootdown` build a [`STALE`] failure is what the check must show: it is noted in
/// `caught` and the run goes on to the next check.
///
/// # Errors
/// `r`'s failure, unless it is the expected one.
fn shootdown_check(
    name: &'static str,
    r: Result<(), String>,
    caught: &mut Vec<&'static str>,
) -> Result<(), String> {
    match r {
        Err(e) if NEGATIVE && e.contains(STALE) => {
            println!("smp: no-shootdown: the {name} check failed as it must: {e}");
            caught.push(name);
            Ok(())
        }
        other => other,
    }
}

/// A one-page region holding a known value, and its frame; published in the plan.
fn spin_target(
    k: &Kernel,
    mmu: &Sv39<SmpHart>,
    root: PageTableRoot,
    space: SpaceId,
) -> Result<(Region, u64), String> {
    let r =
        k.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE))
            .map_err(|e| format!("as_alloc: {e}"))?;
    let va = r.start.as_u64();
    let value = tag(va, 0x5eed);
    store(va, value);
    let pa = mmu
        .translate(root, r.start)
        .ok_or("the spin target is unmapped after its fault")?
        .pa
        .as_u64();
    *PLAN.lock() = Plan { a: va, b: 0, value };
    Ok((r, pa))
}

/// Fill the freed frame at `pa` with [`POISON`] (through the identity map of RAM: the
/// frame is free, nothing maps it legitimately; the core zero-fills it before reuse).
fn poison(pa: u64) {
    for w in 0..PAGE_SIZE / 8 {
        // SAFETY: `pa` is a frame of the core's RAM that the unmap just freed; it is
        // identity mapped, and nothing else writes it until the core allocates it again
        // (no allocation runs now: the other harts only spin on a freed address).
        unsafe { core::ptr::write_volatile((pa + w * 8) as *mut u64, POISON) };
    }
}

/// Release phase `n` whose non-boot harts spin on the plan's page; once they all read
/// it, run `act` (which unmaps it and sets the phase's flag).
fn phase_spinners(
    n: u32,
    boot: usize,
    act: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    READY.store(0, Ordering::Release);
    PHASE.store(n, Ordering::Release);
    let spinners = UP.load(Ordering::Acquire) - 1;
    let acted = wait_until("spinners ready", || {
        READY.load(Ordering::Acquire) == spinners
    })
    .and_then(|()| act());
    if let Err(e) = acted {
        fail(boot, e);
    }
    run_phase(n, boot);
    finish(n)
}

/// A spinner's read loop: old contents until the flag says the unmap's invalidation
/// completed, then a fault; never anything else.
fn spin(
    hart: usize,
    complete: impl Fn() -> bool,
    stale_ok: impl Fn() -> bool,
) -> Result<(), String> {
    let plan = *PLAN.lock();
    let va = VirtAddr::new(plan.a);
    let mut reads = 0u64;
    let start = now();
    loop {
        let done = complete();
        let stale_allowed = stale_ok();
        match probe_read(va) {
            Ok(v) if v == plan.value && !done => {
                reads += 1;
                if reads == 1 {
                    READY.fetch_add(1, Ordering::AcqRel);
                }
                if stale_allowed {
                    ASYNC_STALE_READS.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(v) if v == plan.value => {
                return Err(format!(
                    "stale translation: hart {hart} read {va} (the old contents) after the invalidation completed"
                ))
            }
            Ok(v) => {
                return Err(format!(
                    "stale translation: hart {hart} read {v:#x} at {va}, not the page's {:#x} (a frame the core had unmapped)",
                    plan.value
                ))
            }
            Err(FaultError::NotAllocated(_)) if reads > 0 => {
                FAULTED.fetch_add(1, Ordering::AcqRel);
                return Ok(());
            }
            Err(e) => return Err(format!("hart {hart}: probe of {va}: {e:?}")),
        }
        if ABORT.load(Ordering::Acquire) {
            return Err(GAVE_UP.into());
        }
        if now().wrapping_sub(start) > WAIT_TICKS {
            ABORT.store(true, Ordering::Release);
            return Err(format!("hart {hart}: never faulted on {va}"));
        }
    }
}

/// Phase 5: the migration. The page is always readable (its faults are served): the
/// old contents until the flag, then only the new frame's.
pub(super) fn migrate_shootdown(hart: usize) -> Result<(), String> {
    if hart == boot_hart() {
        return Ok(());
    }
    let plan = *PLAN.lock();
    let va = VirtAddr::new(plan.a);
    let mut reads = 0u64;
    let start = now();
    loop {
        let go = MIGRATE_GO.load(Ordering::Acquire);
        match probe_read(va) {
            Ok(NEW_CONTENTS) if go => {
                FAULTED.fetch_add(1, Ordering::AcqRel);
                return Ok(());
            }
            Ok(NEW_CONTENTS) => {}
            Ok(v) if v == plan.value && !go => {
                reads += 1;
                if reads == 1 {
                    READY.fetch_add(1, Ordering::AcqRel);
                }
            }
            Ok(v) if v == plan.value => {
                return Err(format!(
                    "stale translation: hart {hart} read the old frame at {va} after region_migrate returned"
                ))
            }
            Ok(v) => return Err(format!("hart {hart} read {v:#x} at {va} during a migration")),
            Err(e) => return Err(format!("hart {hart}: probe of {va} during a migration: {e:?}")),
        }
        if ABORT.load(Ordering::Acquire) {
            return Err(GAVE_UP.into());
        }
        if now().wrapping_sub(start) > WAIT_TICKS {
            ABORT.store(true, Ordering::Release);
            return Err(format!(
                "hart {hart}: never read the migrated page's new contents"
            ));
        }
    }
}

/// Phase 2: the strict dealloc.
pub(super) fn strict_shootdown(hart: usize) -> Result<(), String> {
    if hart == boot_hart() {
        return Ok(());
    }
    spin(hart, || STRICT_GO.load(Ordering::Acquire), || false)
}

/// Phase 4: the asynchronous dealloc.
pub(super) fn async_shootdown(hart: usize) -> Result<(), String> {
    if hart == boot_hart() {
        return Ok(());
    }
    spin(
        hart,
        || ASYNC_GO.load(Ordering::Acquire) == 2,
        || ASYNC_GO.load(Ordering::Acquire) == 1,
    )
}

/// Phase 3: every hart writes the page, the boot hart protects it read-only, every
/// hart's next write must fault.
pub(super) fn protect_shootdown(hart: usize) -> Result<(), String> {
    let plan = *PLAN.lock();
    let h = hart as u64;
    let mine = plan.a + 8 * h;
    BARRIER.wait("protect start")?;
    store(mine, tag(mine, 7));
    BARRIER.wait("written")?;
    if hart == boot_hart() {
        let k = crate::KERNEL.get().expect("set");
        let info =
            k.gm.as_lookup(SMP.get().expect("set").space, VirtAddr::new(plan.a))
                .map_err(|e| format!("as_lookup: {e}"))?;
        let range = VaRange::new(VirtAddr::new(plan.a), PAGE_SIZE).map_err(|e| format!("{e}"))?;
        k.gm.region_protect(
            gmem_core::Pages::range(info.region.space, range),
            Prot::READ,
        )
        .map_err(|e| format!("region_protect: {e}"))?;
    }
    BARRIER.wait("protected")?;
    match probe_write(VirtAddr::new(mine), POISON) {
        Err(FaultError::ProtectionViolation { .. }) => {}
        Ok(()) => {
            return Err(format!(
                "stale translation: hart {hart} wrote {mine:#x} after region_protect(READ) returned"
            ))
        }
        Err(e) => return Err(format!("write after protect: {e:?}")),
    }
    let v = load(mine);
    check(v == tag(mine, 7), || {
        format!("{mine:#x} changed to {v:#x} by a refused write")
    })?;
    WRITES_REFUSED.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// The boot hart's side of the four checks, and the `smp: shootdown verified` line.
///
/// # Errors
/// The first check that failed (in the `no-shootdown` build: always, once every check
/// has run).
pub(super) fn run(
    k: &Kernel,
    mmu: &Arc<Sv39<SmpHart>>,
    root: PageTableRoot,
    space: SpaceId,
    boot: usize,
    second: DeviceId,
    layout: &Layout,
) -> Result<(), String> {
    let gm = &k.gm;
    let fences_before = sbi::REMOTE_FENCES.load(Ordering::Relaxed);
    let d_before = mmu.stats();
    // Strict: a dealloc returns only after every hart fenced.
    let mut caught = Vec::new();
    let (r3, pa3) = spin_target(k, mmu, root, space)?;
    let r = phase_spinners(2, boot, || {
        gm.region_dealloc(r3, MapFlags::empty(), None)
            .map_err(|e| format!("region_dealloc: {e}"))?;
        poison(pa3);
        STRICT_GO.store(true, Ordering::Release);
        Ok(())
    });
    shootdown_check("strict dealloc", r, &mut caught)?;
    let strict_faulted = FAULTED.swap(0, Ordering::AcqRel);

    // protect(READ): a write after it faults on every hart.
    let r4 = gm
        .as_alloc(space, AllocRequest::new(PAGE_SIZE))
        .map_err(|e| format!("as_alloc: {e}"))?;
    store(
        r4.start.as_u64() + 8 * boot as u64,
        tag(r4.start.as_u64(), 0),
    );
    *PLAN.lock() = Plan {
        a: r4.start.as_u64(),
        b: 0,
        value: 0,
    };
    shootdown_check("protect(READ)", phase(3, boot), &mut caught)?;
    let refused = WRITES_REFUSED.load(Ordering::Acquire);
    gm.region_dealloc(r4, MapFlags::empty(), None)
        .map_err(|e| format!("region_dealloc: {e}"))?;

    // Asynchronous: stale reads allowed until the batch drains, faults after it.
    let (r5, pa5) = spin_target(k, mmu, root, space)?;
    let pending_before = gm.dev_frames(k.cpu).map_err(|e| format!("{e}"))?.pending;
    let mut quarantined = 0;
    let mut drained = 0;
    let r = phase_spinners(4, boot, || {
        gm.region_dealloc(r5, MapFlags::ASYNC, None)
            .map_err(|e| format!("region_dealloc (async): {e}"))?;
        quarantined = gm.dev_frames(k.cpu).map_err(|e| format!("{e}"))?.pending - pending_before;
        ASYNC_GO.store(1, Ordering::Release);
        let t = now();
        while now().wrapping_sub(t) < ASYNC_WINDOW_TICKS {
            core::hint::spin_loop();
        }
        gm.as_synchronize(space)
            .map_err(|e| format!("as_synchronize: {e}"))?;
        drained = gm.dev_frames(k.cpu).map_err(|e| format!("{e}"))?.pending;
        poison(pa5);
        ASYNC_GO.store(2, Ordering::Release);
        Ok(())
    });
    shootdown_check("async dealloc", r, &mut caught)?;
    let async_faulted = FAULTED.swap(0, Ordering::AcqRel);
    check(quarantined == 1 && drained == pending_before, || {
        format!("async dealloc: {quarantined} frame(s) quarantined until the drain, {drained} pending after it")
    })?;

    // Migration: the page moves to the second memory; once the call returned and the
    // new frame holds new contents, no hart may read the old frame.
    let (r6, pa6) = spin_target(k, mmu, root, space)?;
    // The page's home is the second memory from now on: a spinner that faults on it
    // after the migration maps it where it is, instead of migrating it straight back
    // to the faulting hart's memory (the default placement), which could happen before
    // the check below looks at the frame.
    gm.region_set_policy(
        r6,
        Placement {
            target: PlacementTarget::Device(second),
            mode: PlacementMode::Unique,
        },
    )
    .map_err(|e| format!("region_set_policy: {e}"))?;
    let mut moved_to = 0;
    let r = phase_spinners(5, boot, || {
        let range = VaRange::new(r6.start, PAGE_SIZE).map_err(|e| format!("{e}"))?;
        let moved = gm
            .region_migrate(
                gmem_core::Pages::range(r6.space, range),
                second,
                MigrateScope::Populated,
            )
            .map_err(|e| format!("region_migrate: {e}"))?;
        let mut frame = None;
        gm.as_frames(space, range, |_, dev, pa| frame = Some((dev, pa)))
            .map_err(|e| format!("as_frames: {e}"))?;
        let (dev, new) = frame.ok_or("the migrated page has no frame")?;
        check(
            moved == 1
                && dev == second
                && (layout.second.0..layout.second.1).contains(&new.as_u64()),
            || format!("migration moved {moved} page(s) to {new} of {dev:?}"),
        )?;
        moved_to = new.as_u64();
        // New contents in the new frame (as the memory device would write them).
        // SAFETY: `new` is the page's frame now, in the second memory's identity-mapped
        // RAM; one aligned store, as a device's DMA write would make.
        unsafe { core::ptr::write_volatile(new.as_u64() as *mut u64, NEW_CONTENTS) };
        MIGRATE_GO.store(true, Ordering::Release);
        Ok(())
    });
    shootdown_check("migration", r, &mut caught)?;
    if NEGATIVE {
        return Err(format!(
            "{STALE} caught by {} of 4 shootdown checks ({}): the no-shootdown build",
            caught.len(),
            caught.join(", ")
        ));
    }
    let migrate_read_new = FAULTED.swap(0, Ordering::AcqRel);
    gm.region_dealloc(r6, MapFlags::empty(), None)
        .map_err(|e| format!("region_dealloc: {e}"))?;
    let fences = sbi::REMOTE_FENCES.load(Ordering::Relaxed) - fences_before;
    let d = mmu.stats();
    check(
        sbi::REMOTE_FENCE_ERRORS.load(Ordering::Relaxed) == 0,
        || "OpenSBI refused a remote fence".into(),
    )?;
    println!(
        "smp: shootdown verified on {MAX_HARTS} harts: strict region_dealloc ({} spinners faulted, none read the page after it returned nor the freed frame's new contents), protect(READ) (the write after it refused on {refused} harts), async region_dealloc (frame quarantined, {} stale reads of the old contents before the batch drained, then {} spinners faulted), region_migrate to the second memory ({pa6:#x} -> {moved_to:#x}: {} spinners read the new frame's contents after it returned, none the old frame's); {fences} SBI remote fences ({} range, {} full)",
        strict_faulted,
        ASYNC_STALE_READS.load(Ordering::Relaxed),
        async_faulted,
        migrate_read_new,
        d.remote_fences_range - d_before.remote_fences_range,
        d.remote_fences_all - d_before.remote_fences_all,
    );
    check(
        strict_faulted as usize == MAX_HARTS - 1
            && async_faulted as usize == MAX_HARTS - 1
            && migrate_read_new as usize == MAX_HARTS - 1
            && refused as usize == MAX_HARTS,
        || "not every hart took part in the shootdown checks".into(),
    )?;
    Ok(())
}
