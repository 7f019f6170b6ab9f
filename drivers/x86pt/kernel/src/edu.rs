//! QEMU's `edu` device (PCI 1234:11e8): a DMA engine between a 4 KiB buffer inside the
//! device (at device address `0x40000`) and a bus address, which behind VT-d is an I/O
//! virtual address. One transfer at a time, started by the command register and polled
//! until its busy bit clears (the model completes a transfer 100 ms after it starts).
//! The kernel moves [`EDU_CHUNK`] bytes per transfer.
//! Its DMA addresses are 28 bits wide.

use crate::board::{pci_find, Bdf};
use alloc::format;
use alloc::string::String;

/// The device-side address of the edu buffer.
pub const EDU_BUFFER: u64 = 0x40000;
/// Bytes one transfer moves: half the 4 KiB buffer (QEMU 7.2's range check refuses a
/// transfer that ends exactly at the buffer's end, so a whole-buffer one never runs).
pub const EDU_CHUNK: u64 = 2048;
/// The highest bus address the device can reach (a 28-bit DMA mask).
pub const EDU_DMA_LIMIT: u64 = 1 << 28;

const IDENT: u64 = 0x00;
const LIVENESS: u64 = 0x04;
const DMA_SRC: u64 = 0x80;
const DMA_DST: u64 = 0x88;
const DMA_COUNT: u64 = 0x90;
const DMA_CMD: u64 = 0x98;

/// The edu device.
pub struct Edu {
    /// Its PCI address.
    pub bdf: Bdf,
    bar: u64,
}

impl Edu {
    /// The first edu device on bus 0, with memory decoding and bus mastering on.
    ///
    /// # Errors
    /// A description when there is none or its registers do not answer as edu's do.
    pub fn find() -> Result<Edu, String> {
        let bdf = pci_find(0x1234, 0x11e8).ok_or("no edu device (-device edu)")?;
        let bar = bdf.memory_bar(0).ok_or("edu BAR0 is not a memory BAR")?;
        bdf.enable();
        let edu = Edu { bdf, bar };
        let ident = edu.read32(IDENT);
        edu.write32(LIVENESS, 0x1234_5678);
        let live = edu.read32(LIVENESS);
        if ident & 0xff != 0xed || live != !0x1234_5678 {
            return Err(format!(
                "edu at {bar:#x}: ident {ident:#x}, liveness {live:#x}"
            ));
        }
        Ok(edu)
    }

    fn read32(&self, off: u64) -> u32 {
        // SAFETY: a register of the device's BAR0 (MMIO below 4 GiB, identity mapped).
        unsafe { core::ptr::read_volatile((self.bar + off) as *const u32) }
    }

    fn write32(&self, off: u64, v: u32) {
        // SAFETY: as in `read32`.
        unsafe { core::ptr::write_volatile((self.bar + off) as *mut u32, v) }
    }

    fn write64(&self, off: u64, v: u64) {
        // SAFETY: as in `read32`; the DMA registers take 64-bit accesses.
        unsafe { core::ptr::write_volatile((self.bar + off) as *mut u64, v) }
    }

    /// Copy `len` bytes from `src` to `dst` (one of them [`EDU_BUFFER`]-relative,
    /// the other a bus address); `to_ram`: from the edu buffer to the bus address.
    ///
    /// # Errors
    /// A description when the transfer does not finish.
    pub fn dma(&self, src: u64, dst: u64, len: u64, to_ram: bool) -> Result<(), String> {
        self.write64(DMA_SRC, src);
        self.write64(DMA_DST, dst);
        self.write64(DMA_COUNT, len);
        self.write32(DMA_CMD, 1 | (u32::from(to_ram) << 1));
        for _ in 0..200_000_000u64 {
            if self.read32(DMA_CMD) & 1 == 0 {
                return Ok(());
            }
            core::hint::spin_loop();
        }
        Err(format!("edu: DMA {src:#x} -> {dst:#x} never finished"))
    }
}
