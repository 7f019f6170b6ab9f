//! Four harts on one address space: start-up, concurrent faults, TLB shootdowns, stress.
//!
//! ## The embedding
//! The core sees **one CPU device** whose TLB is spread over every hart that runs on
//! its table (as a Unix `mm` runs on the CPUs of its `mm_cpumask`): one Sv39 driver, one
//! page table per space, and the driver's set of harts that activated it. Each hart
//! writes its own `satp` by calling the driver's `activate` itself (the boot hart
//! through `as_attach`, the others at start-up), which adds it to the set. When the
//! core invalidates (a strict unmap, protect or dealloc before it returns; an
//! asynchronous batch when its queue drains, before its frames are reused), the
//! driver's `invalidate` fences the calling hart and asks the SBI to fence the others
//! (`sbi::SmpHart`), which returns when they have all done it.
//!
//! ## The checks
//! 1. **Harts up**: harts other than the boot hart are started through SBI HSM, each on
//!    its own stack with its own trap vector, and activate the space's table.
//! 2. **Concurrent faults**: all harts store at once into a 2 MiB-aligned block and into
//!    every page of a 64-page region (two harts racing on each page); each page (and the
//!    block) is zero-filled exactly once, the other faults are spurious; every byte is
//!    verified.
//! 3. **Shootdowns**: the other harts spin reading a page while the boot hart deallocates
//!    it and writes new contents into its freed frame: after the call returns they must
//!    fault and never see the new contents (strict); a write after `protect(READ)` must
//!    fault on every hart; after an asynchronous dealloc the spinners may still read the
//!    old contents until `as_synchronize` drains the batch, and must fault after it.
//!    Built with `no-shootdown`, these checks fail (the xtask's negative boot).
//! 4. **Stress**: a fixed number of mixed operations per hart (allocations, faults,
//!    writes, protects, strict and asynchronous unmaps and deallocs, synchronizations)
//!    against a model of every page's contents, then every byte verified, the core's
//!    invariant check, and every frame back.
//!
//! Every wait is bounded (`WAIT_TICKS`) and a failing hart aborts the others, so a
//! broken run ends with a `FAIL` line instead of a hang.

use crate::board::{hart_index, MAX_HARTS};
use crate::memory::{DirectRam, Layout};
use crate::sbi::{self, SmpHart};
use crate::trap::{self, probe_read, probe_write, HART_FAULTS};
use crate::{check, println, Kernel};
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use gmem_core::{
    AllocRequest, DevCaps, DeviceDesc, DeviceId, FaultError, MapFlags, MigrateScope, Mmu, PageSize,
    PageTableRoot, PhysAddr, Prot, Region, SpaceId, VaRange, VirtAddr, PAGE_SIZE,
};
use gmem_sv39::{Sv39, Sv39Hardware};

/// What every hart needs: the driver, the space's table, the space.
pub struct Smp {
    /// The Sv39 driver (every hart's).
    pub mmu: Arc<Sv39<SmpHart>>,
    /// The space's page table.
    pub root: PageTableRoot,
    /// The space.
    pub space: SpaceId,
    /// The memory device the stress run migrates pages to and from.
    pub second: DeviceId,
}

static SMP: spin::Once<Smp> = spin::Once::new();

/// Harts that activated the table.
static UP: AtomicU32 = AtomicU32::new(0);
/// The last phase the boot hart released.
static PHASE: AtomicU32 = AtomicU32::new(0);
/// (hart, phase) completions.
static DONE: AtomicU32 = AtomicU32::new(0);
/// Set by the first hart that fails: every wait gives up.
static ABORT: AtomicBool = AtomicBool::new(false);
/// What failed, per hart.
static ERRORS: spin::Mutex<Vec<String>> = spin::Mutex::new(Vec::new());

/// `time` ticks every wait may take: 90 s of QEMU virt's 10 MHz timebase (the
/// `timebase-frequency` of its device tree; assumption: QEMU's default, not read from
/// the tree here).
const WAIT_TICKS: u64 = 90 * 10_000_000;
/// `time` ticks the asynchronous check leaves the spinners between the dealloc and
/// the drain (20 ms).
const ASYNC_WINDOW_TICKS: u64 = 200_000;

/// Pages of the concurrent-fault region.
const FAULT_PAGES: u64 = 64;
/// A 2 MiB block.
const BLOCK: u64 = 2 << 20;
/// Operations each hart makes in the stress run.
const STRESS_OPS_PER_HART: u64 = 100;
/// Pages of the region every hart writes its own slice of during the stress run.
const SHARED_PAGES: u64 = 16;
/// Regions a hart keeps at most during the stress run.
const STRESS_LIVE: usize = 4;
/// Largest region of the stress run, in pages.
const STRESS_MAX_PAGES: u64 = 8;

/// The deliberately broken build (`no-shootdown`): each shootdown check must fail with
/// a [`STALE`] failure, and the run fails after all of them.
const NEGATIVE: bool = cfg!(feature = "no-shootdown");
/// What a shootdown check's failure says when a hart used a translation the core had
/// invalidated (`cargo xtask qemu` looks for it).
const STALE: &str = "stale translation";

/// Contents written into a freed frame after its unmap returned.
const POISON: u64 = 0x5057_4e45_445f_4652;

/// Region addresses and values a phase shares.
#[derive(Clone, Copy, Debug, Default)]
struct Plan {
    /// First region of the phase.
    a: u64,
    /// Second region of the phase.
    b: u64,
    /// The value a spinner expects at `a` before the unmap.
    value: u64,
}

static PLAN: spin::Mutex<Plan> = spin::Mutex::new(Plan {
    a: 0,
    b: 0,
    value: 0,
});
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
/// Phase barrier.
static BARRIER: Barrier = Barrier::new();
#[allow(clippy::declare_interior_mutable_const)]
const NO_TRAPS: AtomicU32 = AtomicU32::new(0);
/// Harts whose store into page `i` of the concurrent-fault region trapped.
static PAGE_TRAPS: [AtomicU32; FAULT_PAGES as usize] = [NO_TRAPS; FAULT_PAGES as usize];

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

/// The `time` CSR.
fn now() -> u64 {
    let t: u64;
    // SAFETY: reading `time` has no side effect (OpenSBI lets S-mode read it).
    unsafe { core::arch::asm!("csrr {0}, time", out(reg) t, options(nomem, nostack)) };
    t
}

/// Spin until `done()`, giving up on abort or after [`WAIT_TICKS`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool) -> Result<(), String> {
    let start = now();
    loop {
        if done() {
            return Ok(());
        }
        if ABORT.load(Ordering::Acquire) {
            return Err(format!("{what}: {GAVE_UP}"));
        }
        if now().wrapping_sub(start) > WAIT_TICKS {
            ABORT.store(true, Ordering::Release);
            return Err(format!("{what}: timed out"));
        }
        core::hint::spin_loop();
    }
}

/// A reusable barrier for the harts that are up.
struct Barrier {
    arrived: AtomicU32,
    generation: AtomicU32,
}

impl Barrier {
    const fn new() -> Barrier {
        Barrier {
            arrived: AtomicU32::new(0),
            generation: AtomicU32::new(0),
        }
    }

    /// Forget the arrivals of harts that gave up (only when no hart is waiting).
    fn reset(&self) {
        self.arrived.store(0, Ordering::Release);
    }

    fn wait(&self, what: &str) -> Result<(), String> {
        let n = UP.load(Ordering::Acquire);
        let g = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == n {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.store(g.wrapping_add(1), Ordering::Release);
            return Ok(());
        }
        wait_until(what, || self.generation.load(Ordering::Acquire) != g)
    }
}

/// The word written at `va` by hart `hart` (its stamp `stamp`).
fn tag(va: u64, stamp: u64) -> u64 {
    va.rotate_left(23) ^ stamp.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x736d_7021
}

fn store(va: u64, v: u64) {
    // SAFETY: every caller passes an address of a region it allocated in the space all
    // harts run on and that it has not freed: the store either hits a mapping the core
    // made or faults and the core maps the page before it retries.
    unsafe { core::ptr::write_volatile(va as *mut u64, v) }
}

fn load(va: u64) -> u64 {
    // SAFETY: as for `store`.
    unsafe { core::ptr::read_volatile(va as *const u64) }
}

/// Record `hart`'s failure, then make every wait give up.
fn fail(hart: usize, e: String) {
    ERRORS.lock().push(format!("hart {hart}: {e}"));
    ABORT.store(true, Ordering::Release);
}

/// What a hart that gave up because another failed reports.
const GAVE_UP: &str = "another hart failed";

/// The first failure (every one printed), if any hart failed.
fn report_errors() -> Result<(), String> {
    let errors = ERRORS.lock();
    // The first failure of its own (not a hart that gave up because of it).
    let Some(first) = errors
        .iter()
        .position(|e| !e.contains(GAVE_UP))
        .or((!errors.is_empty()).then_some(0))
    else {
        return Ok(());
    };
    for (i, e) in errors.iter().enumerate() {
        if i != first {
            println!("smp: also failed: {e}");
        }
    }
    Err(format!("{} ({} failure(s))", errors[first], errors.len()))
}

/// Run phase `n` on this hart, recording its failure, and count it done.
fn run_phase(n: u32, hart: usize) {
    let ctx = SMP.get().expect("set before any hart starts");
    let k = crate::KERNEL.get().expect("set before any hart starts");
    if NEGATIVE && (2..=5).contains(&n) {
        // The previous check left stale entries behind: start each check clean, so that
        // each shows its own missing shootdown.
        ctx.mmu.hardware().sfence_vma(None);
    }
    let r = match n {
        1 => concurrent_faults(hart),
        2 => strict_shootdown(hart),
        3 => protect_shootdown(hart),
        4 => async_shootdown(hart),
        5 => migrate_shootdown(hart),
        6 => stress(k, ctx, hart),
        _ => Ok(()),
    };
    if let Err(e) = r {
        fail(hart, e);
    }
    DONE.fetch_add(1, Ordering::AcqRel);
}

/// A secondary hart's Rust entry (from `_secondary_start`, `tp` = hart id, on its own
/// stack, translation off).
#[no_mangle]
extern "C" fn secondary_main(hart: usize) -> ! {
    trap::init();
    let ctx = SMP.get().expect("set before any hart starts");
    // This hart's satp: the space's table (the driver adds the hart to its set first).
    ctx.mmu.activate(Some(ctx.root));
    UP.fetch_add(1, Ordering::AcqRel);
    let mut done = 0;
    loop {
        while PHASE.load(Ordering::Acquire) <= done {
            core::hint::spin_loop();
        }
        done += 1;
        run_phase(done, hart);
    }
}

extern "C" {
    fn _secondary_start();
    static __hart_stacks: u8;
}

/// Bytes of each secondary hart's stack (`main.rs`'s `__hart_stacks`).
pub const HART_STACK: usize = 65536;

/// Release phase `n`, run the boot hart's part, wait for every hart, report failures.
fn phase(n: u32, hart: usize) -> Result<(), String> {
    PHASE.store(n, Ordering::Release);
    run_phase(n, hart);
    finish(n)
}

/// Wait until every hart has finished phase `n` (failed or not; bounded), then take the
/// failures and clear the failure state (abort flag, barrier) for the next phase.
///
/// # Errors
/// The first failure of the phase (every one is printed).
fn finish(n: u32) -> Result<(), String> {
    let harts = UP.load(Ordering::Acquire);
    let start = now();
    while DONE.load(Ordering::Acquire) < n * harts {
        if now().wrapping_sub(start) > WAIT_TICKS {
            ERRORS
                .lock()
                .push(format!("phase {n}: a hart never finished"));
            break;
        }
        core::hint::spin_loop();
    }
    let r = report_errors();
    ERRORS.lock().clear();
    ABORT.store(false, Ordering::Release);
    BARRIER.reset();
    r
}

/// Bring the other harts up and run the SMP checks.
///
/// # Errors
/// The first check that failed, as a sentence.
pub fn run(
    k: &Kernel,
    mmu: &Arc<Sv39<SmpHart>>,
    root: PageTableRoot,
    space: SpaceId,
    layout: &Layout,
) -> Result<(), String> {
    let gm = &k.gm;
    let boot = hart_index();
    BOOT.store(boot as u32, Ordering::Relaxed);
    trap::QUIET.store(true, Ordering::Relaxed);
    // A second memory to migrate pages to: a memory device (it never faults and is
    // attached nowhere; its driver is never called).
    // SAFETY: the range is free RAM (layout), identity mapped, and only the core hands
    // it out.
    let second_ram = Arc::new(unsafe { DirectRam::new(layout.second.0, layout.second.1) });
    let second = gm
        .dev_create(DeviceDesc {
            name: "mem1".into(),
            mmu: mmu.clone(),
            memory: Some(second_ram),
            caps: DevCaps::empty(),
            data: None,
        })
        .map_err(|e| format!("dev_create: {e}"))?;
    gm.dev_register_physmem(
        second,
        PhysAddr::new(layout.second.0),
        PhysAddr::new(layout.second.1),
    )
    .map_err(|e| format!("dev_register_physmem: {e}"))?;
    SMP.call_once(|| Smp {
        mmu: mmu.clone(),
        root,
        space,
        second,
    });
    UP.store(1, Ordering::Release);
    let entry = _secondary_start as *const () as usize;
    let stacks = core::ptr::addr_of!(__hart_stacks) as usize;
    let mut started = Vec::new();
    for h in (0..MAX_HARTS).filter(|&h| h != boot) {
        let top = stacks + (h + 1) * HART_STACK;
        sbi::hart_start(h, entry, top).map_err(|e| format!("sbi hart_start({h}): error {e}"))?;
        started.push(h);
    }
    wait_until("harts up", || {
        UP.load(Ordering::Acquire) == MAX_HARTS as u32
    })?;
    for &h in &started {
        let s = sbi::hart_status(h).map_err(|e| format!("sbi hart_get_status({h}): {e}"))?;
        check(s == sbi::HART_STARTED, || {
            format!("hart {h} has HSM state {s}")
        })?;
    }
    let set = mmu.harts();
    check(set == (1 << MAX_HARTS) - 1, || {
        format!("the driver's hart set is {set:#b}, not all {MAX_HARTS} harts")
    })?;
    println!(
        "smp: {MAX_HARTS} harts up (boot hart {boot}; harts {started:?} started through SBI HSM, each on its own stack and trap vector, satp {:#x}; driver hart set {set:#b})",
        mmu.satp_of(root)
    );

    // ---- 2. concurrent faults ------------------------------------------------------
    let before = gm.stats();
    let faults_before: Vec<u64> = HART_FAULTS
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    let r1 = gm
        .as_alloc(space, AllocRequest::new(FAULT_PAGES * PAGE_SIZE))
        .map_err(|e| format!("as_alloc: {e}"))?;
    gm.region_set_zero_fill_block(r1, PAGE_SIZE)
        .map_err(|e| format!("region_set_zero_fill_block: {e}"))?;
    let mut req = AllocRequest::new(BLOCK);
    req.align = BLOCK;
    let r2 = gm
        .as_alloc(space, req)
        .map_err(|e| format!("as_alloc (2 MiB): {e}"))?;
    *PLAN.lock() = Plan {
        a: r1.start.as_u64(),
        b: r2.start.as_u64(),
        value: 0,
    };
    phase(1, boot)?;
    let s = gm.stats();
    let per_hart: Vec<u64> = HART_FAULTS
        .iter()
        .zip(&faults_before)
        .map(|(c, b)| c.load(Ordering::Relaxed) - b)
        .collect();
    let traps: u64 = per_hart.iter().sum();
    let zero_fills = s.faults_zero_fill - before.faults_zero_fill;
    let spurious = s.faults_spurious - before.faults_spurious;
    let existing = s.faults_map_existing - before.faults_map_existing;
    let zeroed = s.pages_zeroed - before.pages_zeroed;
    let large = s.large_maps - before.large_maps;
    check(
        zero_fills == FAULT_PAGES + 1
            && zeroed == FAULT_PAGES + BLOCK / PAGE_SIZE
            && large == 1
            && s.faults_failed == before.faults_failed
            && traps == zero_fills + spurious + existing,
        || {
            format!(
                "concurrent faults: {traps} traps, {zero_fills} zero-fills ({zeroed} pages), {spurious} spurious, {existing} mapped existing, {large} large maps, failed {}",
                s.faults_failed - before.faults_failed
            )
        },
    )?;
    // Every page has its own frame, the block one 2 MiB leaf; every byte as written.
    let mut frames = Vec::new();
    let words = PAGE_SIZE / 8;
    for p in 0..FAULT_PAGES {
        let page = r1.start.as_u64() + p * PAGE_SIZE;
        let t = mmu
            .translate(root, VirtAddr::new(page))
            .ok_or_else(|| format!("page {page:#x} unmapped after the concurrent faults"))?;
        frames.push(t.pa.as_u64());
        for w in 0..words {
            let va = page + w * 8;
            let want = if (w as usize) < MAX_HARTS {
                tag(va, w)
            } else {
                0
            };
            let v = load(va);
            check(v == want, || {
                format!("word {va:#x}: {v:#x}, expected {want:#x}")
            })?;
        }
    }
    frames.sort_unstable();
    frames.dedup();
    check(frames.len() as u64 == FAULT_PAGES, || {
        format!("{} distinct frames for {FAULT_PAGES} pages", frames.len())
    })?;
    let b = r2.start.as_u64();
    let t = mmu
        .translate(root, r2.start)
        .ok_or("the block is unmapped after the concurrent faults")?;
    check(t.page_size == PageSize::Size2M, || {
        format!("the block maps {t:?}")
    })?;
    for w in 0..BLOCK / 8 {
        let va = b + w * 8;
        let owner = (0..MAX_HARTS as u64).find(|&h| va == b + h * (BLOCK / 4) + h * 8);
        let want = owner.map_or(0, |h| tag(va, h));
        let v = load(va);
        check(v == want, || {
            format!("block word {va:#x}: {v:#x}, expected {want:#x}")
        })?;
    }
    let raced = PAGE_TRAPS
        .iter()
        .filter(|t| t.load(Ordering::Relaxed) > 1)
        .count();
    println!(
        "smp: concurrent faults served: {traps} page faults on {MAX_HARTS} harts (per hart {per_hart:?}); {FAULT_PAGES} pages, all harts leaving a barrier to store into each ({raced} pages faulted by 2+ harts), zero-filled once each ({FAULT_PAGES} distinct frames); one 2 MiB block all {MAX_HARTS} harts left a barrier to store into ({} fault(s)), zero-filled once (one megapage, {} pages); {} zero-fills, {spurious} spurious (the page was mapped by the time the core took the fault), {existing} mapped existing, 0 refused; {} words verified",
        traps - PAGE_TRAPS.iter().map(|t| u64::from(t.load(Ordering::Relaxed))).sum::<u64>(),
        BLOCK / PAGE_SIZE,
        zero_fills,
        FAULT_PAGES * words + BLOCK / 8
    );
    for r in [r1, r2] {
        gm.region_dealloc(r, MapFlags::empty(), None)
            .map_err(|e| format!("region_dealloc: {e}"))?;
    }

    // ---- 3. shootdowns -------------------------------------------------------------
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
    let mut moved_to = 0;
    let r = phase_spinners(5, boot, || {
        let range = VaRange::new(r6.start, PAGE_SIZE).map_err(|e| format!("{e}"))?;
        let moved = gm
            .region_migrate_range(r6, range, second, MigrateScope::Populated)
            .map_err(|e| format!("region_migrate_range: {e}"))?;
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
        "smp: shootdown verified on {MAX_HARTS} harts: strict region_dealloc ({} spinners faulted, none read the page after it returned nor the freed frame's new contents), protect(READ) (the write after it refused on {refused} harts), async region_dealloc (frame quarantined, {} stale reads of the old contents before the batch drained, then {} spinners faulted), region_migrate_range to the second memory ({pa6:#x} -> {moved_to:#x}: {} spinners read the new frame's contents after it returned, none the old frame's); {fences} SBI remote fences ({} range, {} full)",
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

    // ---- 4. stress -----------------------------------------------------------------
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

/// Phase 1: every hart stores into the block and into every page of the region.
fn concurrent_faults(hart: usize) -> Result<(), String> {
    let plan = *PLAN.lock();
    BARRIER.wait("fault start")?;
    let h = hart as u64;
    // Page by page, all harts leave a barrier together and store into the same page.
    for p in 0..FAULT_PAGES {
        BARRIER.wait("page start")?;
        let va = plan.a + p * PAGE_SIZE + h * 8;
        let before = HART_FAULTS[hart].load(Ordering::Relaxed);
        store(va, tag(va, h));
        if HART_FAULTS[hart].load(Ordering::Relaxed) != before {
            PAGE_TRAPS[p as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
    BARRIER.wait("block start")?;
    // All harts in the same 2 MiB block at once: each in its own quarter.
    let va = plan.b + h * (BLOCK / 4) + h * 8;
    store(va, tag(va, h));
    BARRIER.wait("fault end")?;
    for p in 0..FAULT_PAGES {
        for o in 0..MAX_HARTS as u64 {
            let va = plan.a + p * PAGE_SIZE + o * 8;
            let v = load(va);
            check(v == tag(va, o), || {
                format!("word {va:#x} of hart {o}: {v:#x} seen by hart {hart}")
            })?;
        }
    }
    Ok(())
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
fn migrate_shootdown(hart: usize) -> Result<(), String> {
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
                    "stale translation: hart {hart} read the old frame at {va} after region_migrate_range returned"
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
fn strict_shootdown(hart: usize) -> Result<(), String> {
    if hart == boot_hart() {
        return Ok(());
    }
    spin(hart, || STRICT_GO.load(Ordering::Acquire), || false)
}

/// Phase 4: the asynchronous dealloc.
fn async_shootdown(hart: usize) -> Result<(), String> {
    if hart == boot_hart() {
        return Ok(());
    }
    spin(
        hart,
        || ASYNC_GO.load(Ordering::Acquire) == 2,
        || ASYNC_GO.load(Ordering::Acquire) == 1,
    )
}

/// The hart that booted (it runs the phases' unmaps).
fn boot_hart() -> usize {
    BOOT.load(Ordering::Relaxed) as usize
}

/// The boot hart's index, set before any secondary hart starts.
pub static BOOT: AtomicU32 = AtomicU32::new(0);

/// Phase 3: every hart writes the page, the boot hart protects it read-only, every
/// hart's next write must fault.
fn protect_shootdown(hart: usize) -> Result<(), String> {
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
        k.gm.region_protect_range(info.region, range, Prot::READ)
            .map_err(|e| format!("region_protect_range: {e}"))?;
    }
    BARRIER.wait("protected")?;
    match probe_write(VirtAddr::new(mine), POISON) {
        Err(FaultError::ProtectionViolation { .. }) => {}
        Ok(()) => {
            return Err(format!(
                "stale translation: hart {hart} wrote {mine:#x} after region_protect_range(READ) returned"
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
fn stress(k: &Kernel, ctx: &Smp, hart: usize) -> Result<(), String> {
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
                gm.region_protect_range(l.region, range, Prot::READ)
                    .map_err(|e| format!("op {op}: region_protect_range: {e}"))?;
                match probe_write(VirtAddr::new(va), POISON) {
                    Err(FaultError::ProtectionViolation { .. }) => {}
                    other => {
                        return Err(format!(
                            "op {op}: write to {va:#x} after protect(READ): {other:?}"
                        ))
                    }
                }
                verify_page(va, l.stamps[p as usize]).map_err(|e| format!("op {op}: {e}"))?;
                gm.region_protect_range(l.region, range, Prot::RW)
                    .map_err(|e| format!("op {op}: region_protect_range: {e}"))?;
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
                    .region_migrate_range(l.region, range, target, MigrateScope::Populated)
                    .map_err(|e| format!("op {op}: region_migrate_range: {e}"))?;
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
                gm.region_unmap_range(l.region, range, flags, None)
                    .map_err(|e| format!("op {op}: region_unmap_range: {e}"))?;
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
