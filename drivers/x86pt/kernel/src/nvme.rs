//! A polling NVMe driver for QEMU's `nvme` device (PCI 1b36:0010) whose every DMA
//! address is an I/O virtual address the core mapped through VT-d: the admin and I/O
//! queues, the identify buffer, the PRP list and the data buffers.
//!
//! One admin queue pair and one I/O queue pair, interrupts off, completions polled by
//! their phase bit. A transfer of more than two pages describes its pages with a PRP
//! list (one 4 KiB page of 512 entries: up to 2 MiB + 4 KiB per command).

use crate::board::{pci_find, Bdf};
use alloc::format;
use alloc::string::String;

const CAP: u64 = 0x00;
const CC: u64 = 0x14;
const CSTS: u64 = 0x1c;
const AQA: u64 = 0x24;
const ASQ: u64 = 0x28;
const ACQ: u64 = 0x30;

/// Entries in each queue.
pub const QUEUE_ENTRIES: u64 = 64;
/// Bytes of one queue's memory (64-byte submission entries: the larger).
pub const QUEUE_BYTES: u64 = QUEUE_ENTRIES * 64;

/// A queue's memory: the kernel's physical address and the device's IOVA.
#[derive(Clone, Copy, Debug)]
pub struct Buffer {
    /// Physical address (identity mapped).
    pub pa: u64,
    /// The device's I/O virtual address of it.
    pub iova: u64,
}

struct Queue {
    qid: u16,
    sq: Buffer,
    cq: Buffer,
    tail: u64,
    head: u64,
    phase: bool,
    cid: u16,
}

/// The controller.
pub struct Nvme {
    bar: u64,
    stride: u64,
    admin: Queue,
    io: Queue,
    prp_list: Buffer,
    /// Commands completed.
    pub commands: u64,
}

/// The controller's PCI function and register block (before anything is mapped).
///
/// # Errors
/// A description when there is no NVMe device.
pub fn find() -> Result<(Bdf, u64), String> {
    let bdf = pci_find(0x1b36, 0x0010).ok_or("no NVMe controller (-device nvme)")?;
    let bar = bdf.memory_bar(0).ok_or("NVMe BAR0 is not a memory BAR")?;
    bdf.enable();
    Ok((bdf, bar))
}

fn wait(what: &str, mut done: impl FnMut() -> bool) -> Result<(), String> {
    for _ in 0..50_000_000u64 {
        if done() {
            return Ok(());
        }
        core::hint::spin_loop();
    }
    Err(format!("nvme: timed out waiting for {what}"))
}

impl Nvme {
    fn r32(&self, off: u64) -> u32 {
        // SAFETY: a register of the controller's BAR0 (identity-mapped MMIO).
        unsafe { core::ptr::read_volatile((self.bar + off) as *const u32) }
    }
    fn w32(&self, off: u64, v: u32) {
        // SAFETY: as in `r32`.
        unsafe { core::ptr::write_volatile((self.bar + off) as *mut u32, v) }
    }
    fn w64(&self, off: u64, v: u64) {
        // SAFETY: as in `r32`; the 64-bit registers take 64-bit accesses.
        unsafe { core::ptr::write_volatile((self.bar + off) as *mut u64, v) }
    }

    /// Reset and enable the controller at `bar` with the admin queues `admin_sq`,
    /// `admin_cq`, then create I/O queue pair 1 in `io_sq`, `io_cq`. `prp_list` is a
    /// page the device may read. Every buffer is already mapped for the device.
    ///
    /// # Errors
    /// A description when the controller does not become ready or refuses a command.
    ///
    /// # Safety
    /// `bar` is the identity-mapped BAR0 of an NVMe controller nothing else drives, and
    /// every buffer is the kernel's, identity mapped at `pa` and mapped for the
    /// controller at `iova`.
    pub unsafe fn init(
        bar: u64,
        admin: (Buffer, Buffer),
        io: (Buffer, Buffer),
        prp_list: Buffer,
    ) -> Result<Nvme, String> {
        // SAFETY: CAP of the controller's BAR0.
        let cap = unsafe { core::ptr::read_volatile((bar + CAP) as *const u64) };
        let queue = |qid, (sq, cq): (Buffer, Buffer)| Queue {
            qid,
            sq,
            cq,
            tail: 0,
            head: 0,
            phase: true,
            cid: 0,
        };
        let mut n = Nvme {
            bar,
            stride: 4 << ((cap >> 32) & 0xf),
            admin: queue(0, admin),
            io: queue(1, io),
            prp_list,
            commands: 0,
        };
        n.w32(CC, 0);
        wait("the controller to stop", || n.r32(CSTS) & 1 == 0)?;
        let size = (QUEUE_ENTRIES - 1) as u32;
        n.w32(AQA, size | (size << 16));
        n.w64(ASQ, n.admin.sq.iova);
        n.w64(ACQ, n.admin.cq.iova);
        // EN, 4 KiB pages, NVM command set, 64-byte SQ and 16-byte CQ entries.
        n.w32(CC, 1 | (6 << 16) | (4 << 20));
        wait("the controller to be ready", || n.r32(CSTS) & 3 != 0)?;
        if n.r32(CSTS) & 2 != 0 {
            return Err("nvme: controller fatal status after enable".into());
        }
        let qsize = (QUEUE_ENTRIES - 1) << 16;
        let mut c = [0u32; 16];
        // Create I/O completion queue 1 (physically contiguous, no interrupts).
        c[0] = 0x05;
        c[6] = n.io.cq.iova as u32;
        c[7] = (n.io.cq.iova >> 32) as u32;
        c[10] = (qsize | 1) as u32;
        c[11] = 1;
        n.admin_command(c)?;
        // Create I/O submission queue 1 on completion queue 1.
        c = [0; 16];
        c[0] = 0x01;
        c[6] = n.io.sq.iova as u32;
        c[7] = (n.io.sq.iova >> 32) as u32;
        c[10] = (qsize | 1) as u32;
        c[11] = (1 << 16) | 1;
        n.admin_command(c)?;
        Ok(n)
    }

    /// Identify namespace 1 into `buffer` (4 KiB, mapped writable): its block count and
    /// block size.
    ///
    /// # Errors
    /// A description when the command fails.
    pub fn identify_namespace(&mut self, buffer: Buffer) -> Result<(u64, u64), String> {
        let mut c = [0u32; 16];
        c[0] = 0x06;
        c[1] = 1;
        c[6] = buffer.iova as u32;
        c[7] = (buffer.iova >> 32) as u32;
        self.admin_command(c)?;
        // SAFETY: the identify page (identity mapped), written by the completed command.
        let (blocks, flbas) = unsafe {
            (
                core::ptr::read_volatile(buffer.pa as *const u64),
                core::ptr::read_volatile((buffer.pa + 26) as *const u8),
            )
        };
        // SAFETY: as above; LBA format `flbas` is at 128 + 4 * index.
        let lbaf = unsafe {
            core::ptr::read_volatile((buffer.pa + 128 + 4 * u64::from(flbas & 0xf)) as *const u32)
        };
        Ok((blocks, 1 << ((lbaf >> 16) & 0xff)))
    }

    fn admin_command(&mut self, c: [u32; 16]) -> Result<(), String> {
        let (bar, stride) = (self.bar, self.stride);
        let status = submit(bar, stride, &mut self.admin, c)?;
        self.commands += 1;
        if status != 0 {
            return Err(format!(
                "nvme: admin opcode {:#x} failed: status {status:#x}",
                c[0] & 0xff
            ));
        }
        Ok(())
    }

    /// Transfer `len` bytes (a multiple of 4 KiB, at most 2 MiB + 4 KiB) between the
    /// device-contiguous IOVA range from `iova` and the blocks from `lba` (`block`
    /// bytes each): a write to the disk when `write`, else a read.
    ///
    /// # Errors
    /// A description when the controller reports an error or does not complete.
    pub fn io(
        &mut self,
        write: bool,
        lba: u64,
        block: u64,
        iova: u64,
        len: u64,
    ) -> Result<(), String> {
        let pages = len.div_ceil(4096);
        if len == 0 || !len.is_multiple_of(block) || pages > 513 {
            return Err(format!("nvme: bad transfer of {len} bytes"));
        }
        let prp2 = match pages {
            1 => 0,
            2 => iova + 4096,
            _ => {
                for k in 1..pages {
                    // SAFETY: entry `k - 1` of the PRP list page (identity mapped, the
                    // kernel's, read by the device only during this command).
                    unsafe {
                        core::ptr::write_volatile(
                            (self.prp_list.pa + 8 * (k - 1)) as *mut u64,
                            iova + 4096 * k,
                        )
                    };
                }
                self.prp_list.iova
            }
        };
        let mut c = [0u32; 16];
        c[0] = if write { 0x01 } else { 0x02 };
        c[1] = 1;
        c[6] = iova as u32;
        c[7] = (iova >> 32) as u32;
        c[8] = prp2 as u32;
        c[9] = (prp2 >> 32) as u32;
        c[10] = lba as u32;
        c[11] = (lba >> 32) as u32;
        c[12] = (len / block - 1) as u32;
        let (bar, stride) = (self.bar, self.stride);
        let status = submit(bar, stride, &mut self.io, c)?;
        self.commands += 1;
        if status != 0 {
            return Err(format!(
                "nvme: {} of {len} bytes at LBA {lba} failed: status {status:#x}",
                if write { "write" } else { "read" }
            ));
        }
        Ok(())
    }
}

/// Submit `c` on `q` and poll its completion; the completion's status field.
fn submit(bar: u64, stride: u64, q: &mut Queue, mut c: [u32; 16]) -> Result<u32, String> {
    q.cid = q.cid.wrapping_add(1);
    c[0] |= u32::from(q.cid) << 16;
    let slot = q.sq.pa + 64 * q.tail;
    for (i, w) in c.iter().enumerate() {
        // SAFETY: slot `tail` of the submission queue (identity mapped, the kernel's);
        // the device reads it only after the doorbell below.
        unsafe { core::ptr::write_volatile((slot + 4 * i as u64) as *mut u32, *w) };
    }
    q.tail = (q.tail + 1) % QUEUE_ENTRIES;
    let sq_doorbell = bar + 0x1000 + 2 * u64::from(q.qid) * stride;
    // SAFETY: the queue's submission doorbell in BAR0.
    unsafe { core::ptr::write_volatile(sq_doorbell as *mut u32, q.tail as u32) };
    let entry = q.cq.pa + 16 * q.head;
    let phase = u32::from(q.phase);
    let mut dw3 = 0;
    wait("a completion", || {
        // SAFETY: completion entry `head` (identity mapped), written by the device.
        dw3 = unsafe { core::ptr::read_volatile((entry + 12) as *const u32) };
        (dw3 >> 16) & 1 == phase
    })?;
    if dw3 & 0xffff != u32::from(q.cid) {
        return Err(format!(
            "nvme: completion for command {} while waiting for {}",
            dw3 & 0xffff,
            q.cid
        ));
    }
    q.head = (q.head + 1) % QUEUE_ENTRIES;
    if q.head == 0 {
        q.phase = !q.phase;
    }
    let cq_doorbell = sq_doorbell + stride;
    // SAFETY: the queue's completion doorbell in BAR0.
    unsafe { core::ptr::write_volatile(cq_doorbell as *mut u32, q.head as u32) };
    Ok(dw3 >> 17)
}
