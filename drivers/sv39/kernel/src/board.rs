//! The QEMU `virt` board: the ns16550 UART, the SiFive test device, the RAM window.
//!
//! Addresses are those of QEMU's `virt` machine; `cargo xtask qemu` boots it with
//! `-m 128M`, so RAM is `[0x8000_0000, 0x8800_0000)`. OpenSBI owns the first 2 MiB.

use core::fmt;

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
        let _ = write!($crate::board::Uart, $($arg)*);
    }};
}

/// Print a line to the UART.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => {{
        use core::fmt::Write as _;
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
