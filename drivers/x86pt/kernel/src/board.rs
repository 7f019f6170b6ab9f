//! The machine around the kernel: the COM1 serial console, QEMU's `isa-debug-exit`
//! port, and PCI configuration space through the legacy `0xcf8`/`0xcfc` ports.

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

/// A PCI function's address: bus, device, function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bdf {
    /// Bus.
    pub bus: u8,
    /// Device (0..32).
    pub dev: u8,
    /// Function (0..8).
    pub func: u8,
}

impl Bdf {
    /// The 16-bit source id the IOMMU sees: `bus << 8 | dev << 3 | func`.
    pub fn source_id(self) -> u16 {
        (u16::from(self.bus) << 8) | (u16::from(self.dev) << 3) | u16::from(self.func)
    }

    fn address(self, offset: u8) -> u32 {
        0x8000_0000
            | (u32::from(self.bus) << 16)
            | (u32::from(self.dev) << 11)
            | (u32::from(self.func) << 8)
            | u32::from(offset & 0xfc)
    }

    /// Read the 32-bit configuration register at `offset` (4-byte aligned).
    pub fn read32(self, offset: u8) -> u32 {
        let _guard = PCI.lock();
        // SAFETY: the legacy configuration mechanism: an address to 0xcf8, the data at
        // 0xcfc; serialised by `PCI`.
        unsafe {
            Port::<u32>::new(0xcf8).write(self.address(offset));
            Port::<u32>::new(0xcfc).read()
        }
    }

    /// Write the 32-bit configuration register at `offset` (4-byte aligned).
    pub fn write32(self, offset: u8, value: u32) {
        let _guard = PCI.lock();
        // SAFETY: as in `read32`.
        unsafe {
            Port::<u32>::new(0xcf8).write(self.address(offset));
            Port::<u32>::new(0xcfc).write(value)
        }
    }

    /// The memory BAR `bar` (0..6): its base (64-bit BARs spanning two registers).
    pub fn memory_bar(self, bar: u8) -> Option<u64> {
        let off = 0x10 + 4 * bar;
        let lo = self.read32(off);
        if lo & 1 != 0 {
            return None;
        }
        let base = u64::from(lo & !0xf);
        let high = if (lo >> 1) & 3 == 2 {
            u64::from(self.read32(off + 4)) << 32
        } else {
            0
        };
        Some(base | high)
    }

    /// Turn on memory decoding and bus mastering (DMA).
    pub fn enable(self) {
        let cmd = self.read32(0x04);
        self.write32(0x04, (cmd & 0xffff) | 0b110);
    }
}

static PCI: spin::Mutex<()> = spin::Mutex::new(());

/// The first function on bus 0 with `vendor:device`.
pub fn pci_find(vendor: u16, device: u16) -> Option<Bdf> {
    (0..32u8)
        .flat_map(|dev| (0..8u8).map(move |func| Bdf { bus: 0, dev, func }))
        .find(|b| {
            let id = b.read32(0);
            id != 0xffff_ffff && id & 0xffff == u32::from(vendor) && id >> 16 == u32::from(device)
        })
}
