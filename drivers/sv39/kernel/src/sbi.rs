//! The SBI calls the SMP kernel makes, and the two hooks they implement: the Sv39
//! driver's hardware for several harts ([`SmpHart`]) and the core's [`Platform`].
//!
//! - **HSM** (hart state management, SBI v1.0 chapter 9, EID `0x48534D`): `hart_start`
//!   starts a stopped hart in S-mode at a given address with `a0` = its hart id and
//!   `a1` = an opaque word (the kernel passes the top of the hart's stack);
//!   `hart_get_status` tells when it runs.
//! - **RFENCE** (SBI v1.0 chapter 8, EID `0x52464E43`): `remote_sfence_vma` has the
//!   harts of a mask execute `sfence.vma` for a range (or everything: start 0, size
//!   `u64::MAX`). OpenSBI (QEMU's `-bios default`) sends the harts a machine-mode IPI,
//!   which they take even while supervisor interrupts are off (a hart spinning on a
//!   core lock is fenced as well), and returns only when every one of them has
//!   processed it (its `tlb_sync` waits for their acknowledgement, handling the fences
//!   sent to its own hart meanwhile, so two harts fencing each other do not deadlock):
//!   the driver's `invalidate` returns after every hart dropped the stale entries.
//!
//! Built with the cargo feature `no-shootdown` (only for `cargo xtask qemu`'s negative
//! boot), [`SmpHart`] skips the remote fence: the kernel's shootdown checks must then
//! fail, and the xtask requires that they do.

use crate::board::{hart_index, MAX_HARTS};
use core::sync::atomic::{AtomicU64, Ordering};
use gmem_core::{PhysAddr, Platform, VaRange, VirtAddr};
use gmem_sv39::{DirectHart, Sv39Hardware};

/// HSM extension id.
const EID_HSM: usize = 0x48_534D;
/// RFENCE extension id.
const EID_RFENCE: usize = 0x5246_4E43;
/// `sbi_hart_start`.
const HSM_HART_START: usize = 0;
/// `sbi_hart_get_status`.
const HSM_HART_GET_STATUS: usize = 2;
/// `sbi_remote_sfence_vma`.
const RFENCE_SFENCE_VMA: usize = 1;
/// `hart_get_status`: the hart is running.
pub const HART_STARTED: usize = 0;

/// One SBI call: `(error, value)` (error 0 is success).
fn ecall(eid: usize, fid: usize, a0: usize, a1: usize, a2: usize, a3: usize) -> (isize, usize) {
    let (error, value): (isize, usize);
    // SAFETY: an SBI call traps to OpenSBI, which follows the SBI calling convention:
    // it reads a0-a5, a6 (function) and a7 (extension), writes a0 and a1 only, and
    // touches no memory of ours for the calls made here.
    unsafe {
        core::arch::asm!(
            "ecall",
            inlateout("a0") a0 => error,
            inlateout("a1") a1 => value,
            in("a2") a2,
            in("a3") a3,
            in("a6") fid,
            in("a7") eid,
            options(nostack)
        )
    };
    (error, value)
}

/// Start hart `hart` at `entry` (a physical address: it starts with translation off)
/// with `opaque` in `a1`.
///
/// # Errors
/// The SBI error code (`-3` invalid parameter: no such hart; `-6` already available).
pub fn hart_start(hart: usize, entry: usize, opaque: usize) -> Result<(), isize> {
    match ecall(EID_HSM, HSM_HART_START, hart, entry, opaque, 0) {
        (0, _) => Ok(()),
        (e, _) => Err(e),
    }
}

/// The HSM state of hart `hart` ([`HART_STARTED`] when it runs).
///
/// # Errors
/// The SBI error code.
pub fn hart_status(hart: usize) -> Result<usize, isize> {
    match ecall(EID_HSM, HSM_HART_GET_STATUS, hart, 0, 0, 0) {
        (0, s) => Ok(s),
        (e, _) => Err(e),
    }
}

/// Remote fences asked of OpenSBI (each for every hart of its mask).
pub static REMOTE_FENCES: AtomicU64 = AtomicU64::new(0);
/// Remote fences OpenSBI refused (must stay 0).
pub static REMOTE_FENCE_ERRORS: AtomicU64 = AtomicU64::new(0);
/// Remote fences skipped (only the `no-shootdown` build).
pub static REMOTE_FENCES_SKIPPED: AtomicU64 = AtomicU64::new(0);

/// The Sv39 driver's hardware on the SMP kernel: the hart's own entry accesses, fences
/// and `satp` are [`DirectHart`]'s; its index comes from `tp`; other harts are fenced
/// with the SBI's `remote_sfence_vma`.
pub struct SmpHart {
    local: DirectHart,
}

impl SmpHart {
    /// Wrap the hart's direct access.
    pub const fn new(local: DirectHart) -> SmpHart {
        SmpHart { local }
    }
}

impl Sv39Hardware for SmpHart {
    unsafe fn read_pte(&self, pa: PhysAddr) -> u64 {
        // SAFETY: the driver's contract for `read_pte`, passed on.
        unsafe { self.local.read_pte(pa) }
    }

    unsafe fn write_pte(&self, pa: PhysAddr, pte: u64) {
        // SAFETY: the driver's contract for `write_pte`, passed on.
        unsafe { self.local.write_pte(pa, pte) }
    }

    fn sfence_vma(&self, va: Option<VirtAddr>) {
        self.local.sfence_vma(va);
    }

    unsafe fn write_satp(&self, satp: u64) {
        // SAFETY: the driver's contract for `write_satp`, passed on.
        unsafe { self.local.write_satp(satp) }
    }

    fn current_hart(&self) -> usize {
        hart_index()
    }

    fn remote_sfence_vma(&self, harts: u64, range: Option<VaRange>) {
        if cfg!(feature = "no-shootdown") {
            // The deliberately broken build: the other harts keep their stale entries.
            REMOTE_FENCES_SKIPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let (start, size) = match range {
            Some(r) => (r.start.as_u64(), r.len),
            // Start 0 with size 2^64 - 1: the whole address space.
            None => (0, u64::MAX),
        };
        REMOTE_FENCES.fetch_add(1, Ordering::Relaxed);
        let (error, _) = ecall(
            EID_RFENCE,
            RFENCE_SFENCE_VMA,
            harts as usize,
            0,
            start as usize,
            size as usize,
        );
        if error != 0 {
            REMOTE_FENCE_ERRORS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The core's platform: CPU `i` is hart `i`.
pub struct SmpPlatform;

impl Platform for SmpPlatform {
    fn current_cpu(&self) -> usize {
        hart_index()
    }

    fn cpu_count(&self) -> usize {
        MAX_HARTS
    }
}
