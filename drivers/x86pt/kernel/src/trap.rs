//! The interrupt descriptor table: page faults go to the core, other exceptions stop
//! the kernel.
//!
//! `__pf_entry` runs on the interrupted stack (ring 0, no stack switch): it saves the
//! registers no Rust function preserves (`rax rcx rdx rsi rdi r8-r11` and, with
//! `fxsave`, the x87/SSE state), calls [`page_fault`] with a pointer to the error code
//! and the hardware's frame, restores them, drops the error code and `iretq`s, so the
//! faulting instruction runs again. [`page_fault`] turns CR2 and the error code into
//! an access and hands it to [`serve`], the one place that calls the core:
//! - `Ok`: the core installed the mapping through the CPU driver; `iretq` retries the
//!   access (x86 caches no not-present entry, so no invalidation is needed);
//! - `Err(e)`: if a [`probe_write`] is in progress, the error is handed to it and the
//!   handler resumes after the store; otherwise the kernel reports it and fails.
//!
//! The handler enters the core through `dev_try_fault`, the entry that never waits for
//! a lock: if the interrupted context held one the fault needs (a core call on this
//! CPU whose driver callback touched a region, say), the core answers
//! `FaultError::Busy` instead of the CPU spinning on its own lock forever. On this
//! one-CPU kernel only the interrupted context can hold a core lock, and retrying its
//! access would fault again forever, so the handler reports that as a kernel bug
//! ([`CorePlatform`] counts how deep this CPU is inside core calls); on an SMP kernel a
//! `Busy` from a lock another CPU holds is retried by returning. The core's [`CorePlatform`] runs every core call
//! with interrupts disabled (its critical section), so no interrupt arrives while the
//! core holds a lock. (Interrupts stay disabled for the whole run anyway: the kernel
//! `cli`s after leaving boot services.)

use crate::board::exit_fail;
use crate::println;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use gmem_core::{FaultError, FaultResolution, Prot, VirtAddr};
use x86_64::structures::idt::InterruptDescriptorTable;

core::arch::global_asm!(
    ".globl __pf_entry",
    "__pf_entry:",
    "push rax",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    // Error code + 5 frame words + 9 registers: rsp is 8 mod 16; 520 more bytes make it
    // 16-aligned for `fxsave` and for the call.
    "sub rsp, 520",
    "fxsave [rsp]",
    "lea rdi, [rsp + 520 + 72]",
    "call {handler}",
    "fxrstor [rsp]",
    "add rsp, 520",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "pop rax",
    "add rsp, 8",
    "iretq",
    // The fatal stubs never return: they pass the vector and the frame, align the
    // stack for the call (an exception without an error code leaves it 8 off) and stop.
    ".globl __fatal_entry_gp",
    "__fatal_entry_gp:",
    "mov rdi, 13",
    "mov rsi, rsp",
    "and rsp, -16",
    "call {fatal}",
    ".globl __fatal_entry_df",
    "__fatal_entry_df:",
    "mov rdi, 8",
    "mov rsi, rsp",
    "and rsp, -16",
    "call {fatal}",
    ".globl __fatal_entry_ud",
    "__fatal_entry_ud:",
    "mov rdi, 6",
    "mov rsi, rsp",
    "and rsp, -16",
    "call {fatal}",
    handler = sym page_fault,
    fatal = sym fatal,
);

extern "C" {
    fn __pf_entry();
    fn __fatal_entry_gp();
    fn __fatal_entry_df();
    fn __fatal_entry_ud();
}

/// Page faults taken on reads.
pub static READ_FAULTS: AtomicU64 = AtomicU64::new(0);
/// Page faults taken on writes.
pub static WRITE_FAULTS: AtomicU64 = AtomicU64::new(0);
/// Page faults taken on instruction fetches.
pub static FETCH_FAULTS: AtomicU64 = AtomicU64::new(0);
/// Faults the core served (the access was retried).
pub static SERVED: AtomicU64 = AtomicU64::new(0);
/// Faults the core answered `Busy` (retried by returning).
pub static BUSY: AtomicU64 = AtomicU64::new(0);

/// The core's platform on this one-CPU kernel: CPU 0 of 1, and a critical section
/// around every core call that saves the interrupt flag and clears it (restored on
/// exit), as `spin_lock_irqsave` does.
pub struct CorePlatform;

/// How many core calls this CPU is inside (the platform's critical sections).
static IN_CORE: AtomicU64 = AtomicU64::new(0);

impl gmem_core::Platform for CorePlatform {
    fn current_cpu(&self) -> usize {
        0
    }
    fn cpu_count(&self) -> usize {
        1
    }
    fn enter_critical(&self) -> usize {
        let enabled = x86_64::instructions::interrupts::are_enabled();
        x86_64::instructions::interrupts::disable();
        IN_CORE.fetch_add(1, Ordering::Relaxed);
        usize::from(enabled)
    }
    fn exit_critical(&self, saved: usize) {
        IN_CORE.fetch_sub(1, Ordering::Relaxed);
        if saved != 0 {
            x86_64::instructions::interrupts::enable();
        }
    }
}

static IN_TRAP: AtomicBool = AtomicBool::new(false);
static IDT: spin::Once<InterruptDescriptorTable> = spin::Once::new();

/// Faults of each kind printed one by one before the handler goes quiet.
const VERBOSE_FAULTS: u64 = 2;

enum Probe {
    Idle,
    Armed,
    Refused(FaultError),
}

static PROBE: spin::Mutex<Probe> = spin::Mutex::new(Probe::Idle);

/// Load the IDT: #PF to the core, #GP, #DF and #UD reported as fatal.
pub fn init() {
    let idt = IDT.call_once(|| {
        let mut idt = InterruptDescriptorTable::new();
        let addr = |f: unsafe extern "C" fn()| x86_64::VirtAddr::new(f as usize as u64);
        // SAFETY: each address is an entry stub above: `__pf_entry` returns with `iretq`
        // after restoring what it saved; the fatal stubs never return. The kernel's code
        // segment (OVMF's, kept) is what `set_handler_addr` records.
        unsafe {
            idt.page_fault.set_handler_addr(addr(__pf_entry));
            idt.general_protection_fault
                .set_handler_addr(addr(__fatal_entry_gp));
            idt.double_fault.set_handler_addr(addr(__fatal_entry_df));
            idt.invalid_opcode.set_handler_addr(addr(__fatal_entry_ud));
        }
        idt
    });
    idt.load();
}

/// CR2: the address of the last page fault.
fn cr2() -> u64 {
    let v: u64;
    // SAFETY: reading CR2 has no side effect (ring 0).
    unsafe { core::arch::asm!("mov {}, cr2", out(reg) v, options(nomem, nostack)) };
    v
}

/// The current CR3.
pub fn cr3() -> u64 {
    let v: u64;
    // SAFETY: reading CR3 has no side effect (ring 0).
    unsafe { core::arch::asm!("mov {}, cr3", out(reg) v, options(nomem, nostack)) };
    v
}

extern "sysv64" fn fatal(vector: u64, frame: *const u64) -> ! {
    // SAFETY: `frame` is the stack pointer at the exception: the hardware frame
    // (with the error code for #GP and #DF) is readable there.
    let words = unsafe { core::slice::from_raw_parts(frame, 3) };
    println!(
        "x86 kernel: FAIL: exception {vector} (frame {:#x} {:#x} {:#x}), cr2 {:#x}",
        words[0],
        words[1],
        words[2],
        cr2()
    );
    exit_fail(4)
}

/// The one call into the core for a CPU page fault: the entry that never waits for a
/// lock (see the module header).
fn serve(va: VirtAddr, access: Prot) -> Result<FaultResolution, FaultError> {
    let Some(k) = crate::KERNEL.get() else {
        println!("page fault before the core is up: cr2 {va}");
        exit_fail(5);
    };
    k.gm.dev_try_fault(k.cpu, va, access)
}

/// `frame`: the error code, then RIP, CS, RFLAGS, RSP, SS.
extern "sysv64" fn page_fault(frame: *mut u64) {
    let va = cr2();
    // SAFETY: `__pf_entry` passes the address of the error code the CPU pushed, followed
    // by the five words of the interrupt frame, on the current stack.
    let (code, rip) = unsafe { (frame.read(), frame.add(1).read()) };
    if IN_TRAP.swap(true, Ordering::AcqRel) {
        println!("nested page fault: cr2 {va:#x} error {code:#x} rip {rip:#x}");
        exit_fail(3);
    }
    let (access, counter, what) = if code & (1 << 4) != 0 {
        (Prot::EXEC, &FETCH_FAULTS, "fetch")
    } else if code & (1 << 1) != 0 {
        (Prot::WRITE, &WRITE_FAULTS, "write")
    } else {
        (Prot::READ, &READ_FAULTS, "read")
    };
    let nth = counter.fetch_add(1, Ordering::Relaxed) + 1;
    match serve(VirtAddr::new(va), access) {
        Ok(r) => {
            SERVED.fetch_add(1, Ordering::Relaxed);
            if nth <= VERBOSE_FAULTS {
                println!(
                    "  #PF: {what} at {va:#x} (error {code:#x}) -> dev_try_fault: {:?}, {} page(s); iretq",
                    r.kind, r.pages
                );
            } else if nth == VERBOSE_FAULTS + 1 {
                println!("  #PF: ... (further {what} faults served quietly)");
            }
        }
        // A lock the fault needs is held. By the context this handler interrupted (a
        // core call on this CPU: the only holder on one CPU): retrying would fault
        // again forever, a kernel bug. (An SMP kernel returns when another CPU holds
        // it: that one goes on and the retry is served.)
        Err(FaultError::Busy(_)) => {
            BUSY.fetch_add(1, Ordering::Relaxed);
            // The handler's own `dev_try_fault` section has been left: any depth left
            // is the interrupted context's.
            if IN_CORE.load(Ordering::Relaxed) > 0 {
                println!(
                    "{what} page fault at {va:#x} (rip {rip:#x}) inside a core call: the core's lock is held by the context that faulted"
                );
                exit_fail(7);
            }
        }
        Err(e) => {
            let mut probe = PROBE.lock();
            if matches!(*probe, Probe::Armed) {
                let resume = PROBE_RESUME.load(Ordering::Acquire);
                println!(
                    "  #PF: {what} at {va:#x} (error {code:#x}) -> dev_try_fault: Err({e:?}); the probe resumes"
                );
                *probe = Probe::Refused(e);
                // SAFETY: the saved RIP is the word after the error code; the probe's
                // resume label is in the same function, after the faulting store.
                unsafe { frame.add(1).write(resume) };
            } else {
                println!("unrecoverable {what} page fault at {va:#x} (rip {rip:#x}): {e:?}");
                exit_fail(6);
            }
        }
    }
    IN_TRAP.store(false, Ordering::Release);
}

/// Store `value` at `va` (8-byte aligned), letting the core serve a fault; a fault the
/// core refuses comes back as its typed error instead of stopping the kernel, and the
/// store is skipped.
///
/// # Errors
/// The core's [`FaultError`] when `dev_try_fault` refused the page fault the store took
/// ([`FaultError::ProtectionViolation`] for a read-only region,
/// [`FaultError::NotAllocated`] for an address in no region, ...).
pub fn probe_write(va: VirtAddr, value: u64) -> Result<(), FaultError> {
    *PROBE.lock() = Probe::Armed;
    // SAFETY: one aligned store to `va`, preceded by recording the address of label `2`
    // (right after the store) in `PROBE_RESUME`. If the store faults and the core
    // refuses, the handler moves RIP to that label, skipping the store; the entry stub
    // restores every register either way. Only `PROBE_RESUME` and `va` are written.
    unsafe {
        core::arch::asm!(
            "lea {r}, [rip + 2f]",
            "mov [{p}], {r}",
            "mov [{a}], {v}",
            "2:",
            r = out(reg) _,
            p = in(reg) PROBE_RESUME.as_ptr(),
            a = in(reg) va.as_u64() & !7,
            v = in(reg) value,
            options(nostack)
        )
    };
    match core::mem::replace(&mut *PROBE.lock(), Probe::Idle) {
        Probe::Refused(e) => Err(e),
        _ => Ok(()),
    }
}

/// Where a refused probe resumes (written by the probe before its store).
static PROBE_RESUME: AtomicU64 = AtomicU64::new(0);
