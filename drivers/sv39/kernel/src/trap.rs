//! The trap vector: page faults go to the core, everything else stops the kernel.
//!
//! `__trap_entry` saves every integer and floating-point register on the current
//! stack, calls [`trap_handler`], restores them and `sret`s, so the faulting
//! instruction runs again. The handler turns a load, store or instruction page fault
//! (`scause` 13, 15, 12) into `gm.dev_fault(cpu, stval, access)`:
//! - `Ok`: the core installed the mapping through the Sv39 driver (which fenced it);
//!   returning retries the access;
//! - `Err(e)`: if a [`probe_read`] or [`probe_write`] is in progress on this hart, the
//!   error is handed to it and the faulting access is skipped; otherwise the kernel
//!   reports it and fails.
//!
//! Every hart runs the same vector on its own stack; the state a trap keeps (the
//! nesting flag, the probe, the fault count) is per hart, indexed by
//! [`crate::board::hart_index`]. Traps do not nest: a fault inside the handler stops the
//! kernel.

use crate::board::{exit_fail, hart_index, MAX_HARTS};
use crate::println;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[allow(clippy::declare_interior_mutable_const)]
const FALSE: AtomicBool = AtomicBool::new(false);
#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
use gmem_core::{FaultError, Prot, VirtAddr};

core::arch::global_asm!(
    ".section .text",
    ".align 2",
    ".globl __trap_entry",
    "__trap_entry:",
    // The vector saves the FP registers too (the interrupted code may use them).
    ".option push",
    ".option arch, +d",
    "addi sp, sp, -544",
    ".irp n,1,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31",
    "sd x\\n, \\n*8(sp)",
    ".endr",
    ".irp n,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31",
    "fsd f\\n, 256+\\n*8(sp)",
    ".endr",
    "frcsr t0",
    "sd t0, 512(sp)",
    "call {handler}",
    "ld t0, 512(sp)",
    "fscsr t0",
    ".irp n,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31",
    "fld f\\n, 256+\\n*8(sp)",
    ".endr",
    ".irp n,1,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31",
    "ld x\\n, \\n*8(sp)",
    ".endr",
    "addi sp, sp, 544",
    "sret",
    ".option pop",
    handler = sym trap_handler,
);

extern "C" {
    fn __trap_entry();
}

/// Load page faults served or refused.
pub static LOAD_FAULTS: AtomicU64 = AtomicU64::new(0);
/// Store page faults served or refused.
pub static STORE_FAULTS: AtomicU64 = AtomicU64::new(0);
/// Instruction page faults served or refused.
pub static FETCH_FAULTS: AtomicU64 = AtomicU64::new(0);
/// Faults the core served (the access was retried).
pub static SERVED: AtomicU64 = AtomicU64::new(0);

/// Page faults each hart took (served or refused).
pub static HART_FAULTS: [AtomicU64; MAX_HARTS] = [ZERO; MAX_HARTS];
/// When set, refused probes are not reported one by one (the SMP checks probe in loops).
pub static QUIET: AtomicBool = AtomicBool::new(false);

static IN_TRAP: [AtomicBool; MAX_HARTS] = [FALSE; MAX_HARTS];

/// Faults of each kind printed one by one before the handler goes quiet.
const VERBOSE_FAULTS: u64 = 3;

enum Probe {
    Idle,
    Armed,
    Refused(FaultError),
}

#[allow(clippy::declare_interior_mutable_const)]
const IDLE: spin::Mutex<Probe> = spin::Mutex::new(Probe::Idle);
/// Each hart's probe.
static PROBE: [spin::Mutex<Probe>; MAX_HARTS] = [IDLE; MAX_HARTS];

macro_rules! csr_read {
    ($csr:literal) => {{
        let v: u64;
        // SAFETY: reading a supervisor CSR has no side effect.
        unsafe { core::arch::asm!(concat!("csrr {0}, ", $csr), out(reg) v, options(nomem, nostack)) };
        v
    }};
}

/// The current `satp`.
pub fn satp() -> u64 {
    csr_read!("satp")
}

/// Install the trap vector and enable the FPU state the vector saves.
pub fn init() {
    let entry = __trap_entry as *const () as u64;
    // SAFETY: `__trap_entry` is 4-byte aligned (direct mode) and saves and restores
    // everything it touches; setting `sstatus.FS` to Initial only makes the FP registers
    // the vector saves accessible. Interrupts stay disabled (`sstatus.SIE` is clear).
    unsafe {
        core::arch::asm!(
            "csrw stvec, {0}",
            "csrs sstatus, {1}",
            in(reg) entry,
            in(reg) 1u64 << 13,
            options(nostack)
        )
    };
}

fn skip_faulting_instruction(sepc: u64) {
    // SAFETY: `sepc` is the address of the kernel instruction that trapped: kernel text,
    // identity mapped readable by the global mappings.
    let low = unsafe { core::ptr::read_volatile(sepc as *const u16) };
    let len = if low & 3 == 3 { 4 } else { 2 };
    // SAFETY: resuming at the next instruction of the same code; `probe_read` is written
    // for it (its destination register keeps the sentinel).
    unsafe { core::arch::asm!("csrw sepc, {0}", in(reg) sepc + len, options(nomem, nostack)) };
}

#[no_mangle]
extern "C" fn trap_handler() {
    let scause = csr_read!("scause");
    let stval = csr_read!("stval");
    let sepc = csr_read!("sepc");
    let hart = hart_index();
    if IN_TRAP[hart].swap(true, Ordering::AcqRel) {
        println!("nested trap: scause {scause:#x} stval {stval:#x} sepc {sepc:#x}");
        exit_fail(3);
    }
    let (access, counter, what) = match scause {
        12 => (Prot::EXEC, &FETCH_FAULTS, "instruction"),
        13 => (Prot::READ, &LOAD_FAULTS, "load"),
        15 => (Prot::WRITE, &STORE_FAULTS, "store"),
        _ => {
            println!("unexpected trap: scause {scause:#x} stval {stval:#x} sepc {sepc:#x}");
            exit_fail(4);
        }
    };
    let nth = counter.fetch_add(1, Ordering::Relaxed) + 1;
    HART_FAULTS[hart].fetch_add(1, Ordering::Relaxed);
    let Some(k) = crate::KERNEL.get() else {
        println!("page fault before the core is up: stval {stval:#x} sepc {sepc:#x}");
        exit_fail(5);
    };
    match k.gm.dev_fault(k.cpu, VirtAddr::new(stval), access) {
        Ok(r) => {
            SERVED.fetch_add(1, Ordering::Relaxed);
            if nth <= VERBOSE_FAULTS {
                println!(
                    "  trap: {what} page fault (scause {scause}) at {stval:#x} -> dev_fault: {:?}, {} page(s); sret",
                    r.kind, r.pages
                );
            } else if nth == VERBOSE_FAULTS + 1 {
                println!("  trap: ... (further {what} faults served quietly)");
            }
        }
        Err(e) => {
            let mut probe = PROBE[hart].lock();
            if matches!(*probe, Probe::Armed) {
                if !QUIET.load(Ordering::Relaxed) {
                    println!(
                        "  trap: {what} page fault (scause {scause}) at {stval:#x} -> dev_fault: Err({e:?}); probe skips the access"
                    );
                }
                *probe = Probe::Refused(e);
                skip_faulting_instruction(sepc);
            } else {
                println!(
                    "unrecoverable {what} page fault on hart {hart} at {stval:#x} (sepc {sepc:#x}): {e:?}"
                );
                exit_fail(6);
            }
        }
    }
    IN_TRAP[hart].store(false, Ordering::Release);
}

/// Value a refused probe leaves in its destination register.
const PROBE_SENTINEL: u64 = 0xdead_beef_dead_beef;

/// Load the u64 at `va`, letting the core serve a fault; a fault the core refuses
/// comes back as its typed error instead of stopping the kernel.
///
/// # Errors
/// The core's [`FaultError`] when `dev_fault` refused the page fault the load took
/// ([`FaultError::NotAllocated`] for an address in no region,
/// [`FaultError::ProtectionViolation`] for a region that does not permit reads,
/// [`FaultError::Move`] when no frame is free, ...); the trap handler then
/// skipped the load.
pub fn probe_read(va: VirtAddr) -> Result<u64, FaultError> {
    let hart = hart_index();
    *PROBE[hart].lock() = Probe::Armed;
    let mut v = PROBE_SENTINEL;
    // SAFETY: a single aligned load from `va`; if it faults, the handler either has the
    // core map the page (the load retries) or skips the 4-byte load (`norvc`), leaving
    // the sentinel in `v`. The asm writes only `v`.
    unsafe {
        core::arch::asm!(
            ".option push",
            ".option norvc",
            "ld {v}, 0({a})",
            ".option pop",
            a = in(reg) va.as_u64() & !7,
            v = inout(reg) v,
            options(nostack, readonly)
        )
    };
    match core::mem::replace(&mut *PROBE[hart].lock(), Probe::Idle) {
        Probe::Refused(e) => Err(e),
        _ => Ok(v),
    }
}

/// Store `value` to the u64 at `va`, letting the core serve a fault; a fault the core
/// refuses comes back as its typed error (and nothing is stored).
///
/// # Errors
/// As for [`probe_read`]: the core's [`FaultError`] when it refused the page fault the
/// store took ([`FaultError::ProtectionViolation`] for a page the region does not let
/// be written, ...); the trap handler then skipped the store.
pub fn probe_write(va: VirtAddr, value: u64) -> Result<(), FaultError> {
    let hart = hart_index();
    *PROBE[hart].lock() = Probe::Armed;
    // SAFETY: a single aligned store to `va`; if it faults, the handler either has the
    // core map the page writable (the store retries) or skips the 4-byte store
    // (`norvc`). `va` is an address the caller's regions may hold: the store either
    // reaches a page the core mapped writable for this space or is refused.
    unsafe {
        core::arch::asm!(
            ".option push",
            ".option norvc",
            "sd {v}, 0({a})",
            ".option pop",
            a = in(reg) va.as_u64() & !7,
            v = in(reg) value,
            options(nostack)
        )
    };
    match core::mem::replace(&mut *PROBE[hart].lock(), Probe::Idle) {
        Probe::Refused(e) => Err(e),
        _ => Ok(()),
    }
}
