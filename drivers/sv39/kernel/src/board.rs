//! The QEMU `virt` board: the ns16550 UART, the SiFive test device, the RAM window.
//!
//! Addresses are those of QEMU's `virt` machine; `cargo xtask qemu` boots it with
//! `-m 128M`, so RAM is `[0x8000_0000, 0x8800_0000)`. OpenSBI owns the first 2 MiB.

use core::fmt;
use core::sync::atomic::{AtomicUsize, Ordering};

/// Harts the kernel runs on (`-smp 4`); hart ids of the `virt` board are `0..MAX_HARTS`.
pub const MAX_HARTS: usize = 4;

/// The index of the running hart: its hart id, which every entry path (boot and
/// secondary) puts in `tp` before any Rust code runs; the kernel never changes `tp`
/// afterwards (no thread-local storage). Clamped below [`MAX_HARTS`].
pub fn hart_index() -> usize {
    let tp: usize;
    // SAFETY: reading a general register has no side effect.
    unsafe { core::arch::asm!("mv {0}, tp", out(reg) tp, options(nomem, nostack)) };
    tp.min(MAX_HARTS - 1)
}

/// No hart holds the print lock.
const NOBODY: usize = usize::MAX;
/// The hart printing now (lines of different harts do not interleave).
static PRINT_OWNER: AtomicUsize = AtomicUsize::new(NOBODY);

/// The print lock, reentrant per hart (a trap taken while printing may print); released
/// on drop if this guard took it.
pub struct PrintGuard(bool);

impl PrintGuard {
    /// Take the print lock for the running hart.
    pub fn take() -> PrintGuard {
        let me = hart_index();
        if PRINT_OWNER.load(Ordering::Acquire) == me {
            return PrintGuard(false);
        }
        while PRINT_OWNER
            .compare_exchange_weak(NOBODY, me, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
        PrintGuard(true)
    }
}

impl Drop for PrintGuard {
    fn drop(&mut self) {
        if self.0 {
            PRINT_OWNER.store(NOBODY, Ordering::Release);
        }
    }
}

/// The ns16550 UART's registers.
const UART: usize = 0x1000_0000;
/// Transmit holding register.
const UART_THR: usize = 0;
/// Line status register; bit 5: transmit holding register empty.
const UART_LSR: usize = 5;
/// The SiFive test device ("finisher").
const TEST_DEVICE: usize = 0x10_0000;

/// First byte of RAM.
pub const RAM_BASE: u64 = 0x8000_0000;
/// One past the last byte of RAM (`-m 128M`).
pub const RAM_END: u64 = 0x8800_0000;

/// The UART as a `fmt::Write` sink.
pub struct Uart;

impl Uart {
    fn put(&mut self, byte: u8) {
        // SAFETY: the UART's registers are device memory at a fixed address of the
        // `virt` board, identity-mapped by the global mappings once paging is on; only
        // this function touches them, with byte-wide volatile accesses.
        unsafe {
            let base = UART as *mut u8;
            while core::ptr::read_volatile(base.add(UART_LSR)) & (1 << 5) == 0 {}
            core::ptr::write_volatile(base.add(UART_THR), byte);
        }
    }
}

impl fmt::Write for Uart {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            if b == b'\n' {
                self.put(b'\r');
            }
            self.put(b);
        }
        Ok(())
    }
}

/// Print to the UART.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {{
        use core::fmt::Write as _;
        let _guard = $crate::board::PrintGuard::take();
        let _ = write!($crate::board::Uart, $($arg)*);
    }};
}

/// Print a line to the UART.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => {{
        use core::fmt::Write as _;
        let _guard = $crate::board::PrintGuard::take();
        let _ = writeln!($crate::board::Uart, $($arg)*);
    }};
}

fn finish(code: u32) -> ! {
    // SAFETY: the test device is a fixed MMIO register of the `virt` board (identity
    // mapped); a 32-bit store there makes QEMU exit and nothing runs afterwards.
    unsafe { core::ptr::write_volatile(TEST_DEVICE as *mut u32, code) };
    loop {
        // SAFETY: `wfi` only waits; reached only if QEMU did not exit.
        unsafe { core::arch::asm!("wfi", options(nomem, nostack)) };
    }
}

/// Exit QEMU with success.
pub fn exit_pass() -> ! {
    finish(0x5555)
}

/// Exit QEMU with failure `code` (QEMU's exit status).
pub fn exit_fail(code: u16) -> ! {
    finish(0x3333 | (u32::from(code) << 16))
}
