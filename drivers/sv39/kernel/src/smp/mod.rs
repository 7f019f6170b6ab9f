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
//!
//! | module | owns |
//! |---|---|
//! | this one | start-up, the phases (released by the boot hart, run by every hart), barrier, bounded waits, failures |
//! | `faults` | check 2 |
//! | `shootdown` | check 3, and the `no-shootdown` build's verdict |
//! | `stress` | check 4: the operation mix, the page model |

mod faults;
mod shootdown;
mod stress;

use crate::board::{hart_index, MAX_HARTS};
use crate::memory::Layout;
use crate::sbi::{self, SmpHart};
use crate::trap;
use crate::{check, println, Kernel};
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use gmem_core::{DevCaps, DeviceDesc, DeviceId, Mmu, PageTableRoot, PhysAddr, SpaceId};
use gmem_kernel_support::DirectRam;
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

/// Phase barrier.
static BARRIER: Barrier = Barrier::new();

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
    if shootdown::NEGATIVE && (2..=5).contains(&n) {
        // The previous check left stale entries behind: start each check clean, so that
        // each shows its own missing shootdown.
        ctx.mmu.hardware().sfence_vma(None);
    }
    let r = match n {
        1 => faults::concurrent_faults(hart),
        2 => shootdown::strict_shootdown(hart),
        3 => shootdown::protect_shootdown(hart),
        4 => shootdown::async_shootdown(hart),
        5 => shootdown::migrate_shootdown(hart),
        6 => stress::stress(k, ctx, hart),
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

    faults::run(k, mmu, root, space, boot)?;
    shootdown::run(k, mmu, root, space, boot, second, layout)?;
    stress::run(k, space, boot, second)
}

/// The hart that booted (it runs the phases' unmaps).
fn boot_hart() -> usize {
    BOOT.load(Ordering::Relaxed) as usize
}

/// The boot hart's index, set before any secondary hart starts.
pub static BOOT: AtomicU32 = AtomicU32::new(0);
