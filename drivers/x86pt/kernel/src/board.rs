//! The machine around the kernel: the COM1 serial console and QEMU's `isa-debug-exit`
//! port.

use core::fmt::Write;
use uart_16550::SerialPort;
use x86_64::instructions::port::Port;

static SERIAL: spin::Mutex<Option<SerialPort>> = spin::Mutex::new(None);

/// Initialise COM1 (0x3f8).
pub fn serial_init() {
    // SAFETY: 0x3f8 is COM1 on every PC machine QEMU emulates; nothing else in the
    // kernel drives it (UEFI's console stops with boot services, and until then it
    // writes whole lines the same way).
    let mut port = unsafe { SerialPort::new(0x3f8) };
    port.init();
    *SERIAL.lock() = Some(port);
}

/// Write formatted text to the serial console.
pub fn print(args: core::fmt::Arguments<'_>) {
    if let Some(port) = SERIAL.lock().as_mut() {
        let _ = port.write_fmt(args);
    }
}

/// Print to the serial console.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::board::print(format_args!($($arg)*))
    };
}

/// Print a line to the serial console.
#[macro_export]
macro_rules! println {
    () => {
        $crate::print!("\n")
    };
    ($($arg:tt)*) => {
        $crate::board::print(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// QEMU's `isa-debug-exit` device (`-device isa-debug-exit,iobase=0xf4,iosize=4`):
/// writing `v` ends QEMU with status `(v << 1) | 1`.
const DEBUG_EXIT: u16 = 0xf4;
/// The value whose exit status (33) the xtask takes as a pass.
pub const PASS_CODE: u32 = 0x10;

fn exit(code: u32) -> ! {
    // SAFETY: writing the debug-exit port ends the machine; without the device the write
    // goes nowhere and the loop below halts.
    unsafe { Port::<u32>::new(DEBUG_EXIT).write(code) };
    loop {
        x86_64::instructions::interrupts::disable();
        x86_64::instructions::hlt();
    }
}

/// End QEMU with the pass status.
pub fn exit_pass() -> ! {
    exit(PASS_CODE)
}

/// End QEMU with failure `code` (never the pass code).
pub fn exit_fail(code: u32) -> ! {
    exit(if code == PASS_CODE { 0x11 } else { code })
}
