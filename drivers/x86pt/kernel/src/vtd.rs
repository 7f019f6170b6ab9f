//! The Intel VT-d remapping unit: root and context tables, queued invalidation, fault
//! recording, and one [`VtdDomain`] per device as the walker of a
//! [`gmem_x86pt::PagedMmu`] over [`gmem_x86pt::VtdCodec`] — the core's `Mmu` for that
//! device.
//!
//! ## Theory
//! The unit translates a DMA request by its source id (bus/device/function): the *root
//! table* (one entry per bus, set in `RTADDR` and latched with `GCMD.SRTP`) points to a
//! *context table* (one 128-bit entry per device/function), whose entry names a domain
//! id, an address width and the root of the device's *second-level* page table. The
//! core owns the second-level tables through the same engine and driver as the CPU's
//! ([`gmem_x86pt::PagedMmu`]); this module is the walker side of that driver:
//! - **entries**: volatile 64-bit stores, each followed by `clflush` when the unit's
//!   page walks do not snoop the CPU caches (`ECAP.C` clear);
//! - **invalidation**: the *queued-invalidation* interface (`ECAP.QI`, `GCMD.QIE`): a
//!   ring of 128-bit descriptors in memory (`IQA`), the tail in `IQT`. A range
//!   invalidation becomes page-selective IOTLB descriptors (naturally aligned power-of-two
//!   blocks up to `CAP.MAMV`) and one *wait* descriptor whose status write the kernel
//!   polls: when it lands, every earlier descriptor has completed. A whole-table one is
//!   a domain-selective IOTLB descriptor and a wait;
//! - **activation**: writing the device's context entry (`AW`, `DID`, the root, `P` last)
//!   and invalidating the context cache and the domain's IOTLB entries.
//!
//! A DMA the tables do not permit is blocked by the unit and logged in its *fault
//! recording registers* (`CAP.FRO`, `CAP.NFR`), which [`VtdUnit::take_faults`] reads and
//! clears. The counters ([`VtdCounters`]) count descriptors by kind: the strict/async
//! comparison reads them.

use crate::board::Bdf;
use crate::memory::DmaArena;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};
use gmem_core::{PageTableRoot, PhysAddr, VaRange, PAGE_SIZE};
use gmem_x86pt::vtd::invalidation_blocks;
use gmem_x86pt::{PagingHardware, VtdCodec};

const CAP: u64 = 0x08;
const ECAP: u64 = 0x10;
const GCMD: u64 = 0x18;
const GSTS: u64 = 0x1c;
const RTADDR: u64 = 0x20;
const FSTS: u64 = 0x34;
const FECTL: u64 = 0x38;
const IQT: u64 = 0x88;
const IQA: u64 = 0x90;

const GCMD_TE: u32 = 1 << 31;
const GCMD_SRTP: u32 = 1 << 30;
const GCMD_QIE: u32 = 1 << 26;
/// GSTS bits that are one-shot commands, cleared before writing GCMD.
const GCMD_ONE_SHOT: u32 = 0x96ff_ffff;

/// Page-selective descriptors one invalidation may take before it becomes one
/// domain-selective descriptor.
const MAX_PAGE_DESCRIPTORS: usize = 16;

/// Descriptors in the invalidation queue (`IQA.QS` = 0: one 4 KiB page).
const QUEUE_LEN: u64 = 256;

/// Descriptors the unit was given, by kind.
#[derive(Debug, Default)]
pub struct VtdCounters {
    /// Page-selective IOTLB invalidation descriptors.
    pub iotlb_page: AtomicU64,
    /// Domain-selective IOTLB invalidation descriptors.
    pub iotlb_domain: AtomicU64,
    /// Context-cache invalidation descriptors.
    pub context: AtomicU64,
    /// Wait descriptors (one per completed batch).
    pub wait: AtomicU64,
    /// Batches whose wait did not complete or that the unit reported as invalid.
    pub errors: AtomicU64,
}

impl VtdCounters {
    /// IOTLB invalidation descriptors of either kind.
    pub fn iotlb(&self) -> u64 {
        self.iotlb_page.load(Ordering::Relaxed) + self.iotlb_domain.load(Ordering::Relaxed)
    }
}

/// One recorded DMA fault.
#[derive(Clone, Copy, Debug)]
pub struct DmaFault {
    /// The fault reason the unit reported.
    pub reason: u8,
    /// The requester's source id.
    pub source: u16,
    /// The page of the faulting address.
    pub address: u64,
    /// A read request (otherwise a write).
    pub read: bool,
}

impl DmaFault {
    /// The VT-d specification's name of the reason.
    pub fn reason_name(&self) -> &'static str {
        match self.reason {
            1 => "root entry not present",
            2 => "context entry not present",
            3 => "invalid context entry",
            4 => "address beyond the address width",
            5 => "write not permitted (entry not present or read-only)",
            6 => "read not permitted (entry not present)",
            7 => "invalid paging entry",
            0xa => "reserved field in a root entry",
            0xb => "reserved field in a context entry",
            0xc => "reserved field in a second-level entry",
            _ => "other",
        }
    }
}

struct Queue {
    base: u64,
    tail: u64,
    status: u64,
    seq: u32,
}

/// The remapping unit.
pub struct VtdUnit {
    regs: u64,
    cap: u64,
    ecap: u64,
    root_table: u64,
    context_table: u64,
    coherent: bool,
    queue: spin::Mutex<Queue>,
    /// Descriptors submitted.
    pub counters: VtdCounters,
}

fn read32(at: u64) -> u32 {
    // SAFETY: `at` is a register of the unit's block (identity mapped MMIO below 4 GiB).
    unsafe { core::ptr::read_volatile(at as *const u32) }
}

fn write32(at: u64, v: u32) {
    // SAFETY: as in `read32`.
    unsafe { core::ptr::write_volatile(at as *mut u32, v) }
}

fn read64(at: u64) -> u64 {
    // SAFETY: as in `read32`; the unit takes 64-bit accesses to its 64-bit registers.
    unsafe { core::ptr::read_volatile(at as *const u64) }
}

fn write64(at: u64, v: u64) {
    // SAFETY: as in `read64`.
    unsafe { core::ptr::write_volatile(at as *mut u64, v) }
}

fn flush_line(pa: u64) {
    // SAFETY: `clflush` of an identity-mapped kernel address only writes the line back.
    unsafe { core::arch::asm!("clflush [{}]", "mfence", in(reg) pa, options(nostack)) };
}

impl VtdUnit {
    /// Take over the unit at `regs`: root table (bus 0's context table), queued
    /// invalidation on, caches invalidated. Translation stays off until
    /// [`VtdUnit::enable_translation`].
    ///
    /// # Errors
    /// A description when the unit lacks queued invalidation, a status bit never
    /// follows its command, or `arena` has no room.
    ///
    /// # Safety
    /// `regs` is the register block of a VT-d unit (from the DMAR table), identity
    /// mapped, and nothing else drives the unit.
    pub unsafe fn new(regs: u64, arena: &mut DmaArena) -> Result<VtdUnit, String> {
        let cap = read64(regs + CAP);
        let ecap = read64(regs + ECAP);
        if ecap & (1 << 1) == 0 {
            return Err(format!(
                "the unit has no queued invalidation (ECAP {ecap:#x})"
            ));
        }
        let room = || String::from("no DMA memory for the VT-d structures");
        let root_table = arena.take(PAGE_SIZE, PAGE_SIZE).ok_or_else(room)?;
        let context_table = arena.take(PAGE_SIZE, PAGE_SIZE).ok_or_else(room)?;
        let queue = arena.take(PAGE_SIZE, PAGE_SIZE).ok_or_else(room)?;
        let status = arena.take(PAGE_SIZE, PAGE_SIZE).ok_or_else(room)?;
        let unit = VtdUnit {
            regs,
            cap,
            ecap,
            root_table,
            context_table,
            coherent: ecap & 1 != 0,
            queue: spin::Mutex::new(Queue {
                base: queue,
                tail: 0,
                status,
                seq: 0,
            }),
            counters: VtdCounters::default(),
        };
        // Bus 0's root entry: its context table, present.
        unit.store(root_table, context_table | 1);
        write64(regs + RTADDR, root_table);
        unit.command(GCMD_SRTP)?;
        // Fault events stay masked: the kernel polls the recording registers.
        write32(regs + FECTL, 1 << 31);
        write64(regs + IQT, 0);
        write64(regs + IQA, queue);
        unit.command(GCMD_QIE)?;
        unit.submit(&[(1 | (1 << 4), 0)], |c| &c.context)?;
        unit.submit(&[(2 | (1 << 4) | (1 << 6) | (1 << 7), 0)], |c| {
            &c.iotlb_domain
        })?;
        Ok(unit)
    }

    /// The capability register.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// The root table's physical address.
    pub fn root_table(&self) -> u64 {
        self.root_table
    }

    /// The extended capability register.
    pub fn ecap(&self) -> u64 {
        self.ecap
    }

    /// The second-level codec the unit walks: 4 levels when `SAGAW` has 48-bit tables
    /// and `wide`, else 3; 2 MiB superpages when `CAP.SLLPS` says so.
    pub fn codec(&self, wide: bool) -> Option<VtdCodec> {
        let sagaw = (self.cap >> 8) & 0x1f;
        let levels = if wide && sagaw & 0b100 != 0 {
            4
        } else if sagaw & 0b10 != 0 {
            3
        } else {
            return None;
        };
        VtdCodec::new(levels, self.cap & (1 << 34) != 0)
    }

    fn status(&self) -> u32 {
        read32(self.regs + GSTS)
    }

    /// Issue `GCMD` command `bit` (keeping what is enabled) and wait for its status.
    fn command(&self, bit: u32) -> Result<(), String> {
        let cmd = (self.status() & GCMD_ONE_SHOT) | bit;
        write32(self.regs + GCMD, cmd);
        for _ in 0..1_000_000 {
            if self.status() & bit != 0 {
                return Ok(());
            }
        }
        Err(format!(
            "GSTS never showed {bit:#x} (GSTS {:#x})",
            self.status()
        ))
    }

    /// Turn DMA remapping on: from now on every DMA is translated or blocked.
    ///
    /// # Errors
    /// A description when `GSTS.TES` does not follow.
    pub fn enable_translation(&self) -> Result<u32, String> {
        self.command(GCMD_TE)?;
        Ok(self.status())
    }

    fn store(&self, pa: u64, v: u64) {
        // SAFETY: `pa` is an entry of the unit's root or context table (DMA memory the
        // kernel took for it, identity mapped).
        unsafe { core::ptr::write_volatile(pa as *mut u64, v) };
        if !self.coherent {
            flush_line(pa);
        }
    }

    /// Queue `descriptors` and a wait descriptor; return when the wait's status write
    /// landed. `count` picks the counter the descriptors add to.
    fn submit(
        &self,
        descriptors: &[(u64, u64)],
        count: impl Fn(&VtdCounters) -> &AtomicU64,
    ) -> Result<(), String> {
        let mut q = self.queue.lock();
        q.seq = q.seq.wrapping_add(1);
        let seq = q.seq;
        let wait = (5 | (1 << 5) | (u64::from(seq) << 32), q.status);
        for &(lo, hi) in descriptors.iter().chain(core::iter::once(&wait)) {
            let at = q.base + 16 * q.tail;
            // SAFETY: `at` is a descriptor slot of the queue page (DMA memory the kernel
            // took for it); the unit reads it only once the tail passes it.
            unsafe {
                core::ptr::write_volatile(at as *mut u64, lo);
                core::ptr::write_volatile((at + 8) as *mut u64, hi);
            }
            if !self.coherent {
                flush_line(at);
            }
            q.tail = (q.tail + 1) % QUEUE_LEN;
        }
        write64(self.regs + IQT, q.tail << 4);
        count(&self.counters).fetch_add(descriptors.len() as u64, Ordering::Relaxed);
        self.counters.wait.fetch_add(1, Ordering::Relaxed);
        for _ in 0..10_000_000 {
            // SAFETY: the status word is DMA memory the kernel took for it; the unit
            // writes it.
            let v = unsafe { core::ptr::read_volatile(q.status as *const u32) };
            if v == seq {
                return Ok(());
            }
            if read32(self.regs + FSTS) & (1 << 4) != 0 {
                break;
            }
        }
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        Err(format!(
            "invalidation wait {seq} did not complete (FSTS {:#x})",
            read32(self.regs + FSTS)
        ))
    }

    fn iotlb_domain(&self, did: u16) {
        let lo = 2 | (2 << 4) | (1 << 6) | (1 << 7) | (u64::from(did) << 16);
        let _ = self.submit(&[(lo, 0)], |c| &c.iotlb_domain);
    }

    /// Invalidate the pages of `ranges` in domain `did`: one page-selective descriptor
    /// per block of [`invalidation_blocks`] (the ranges merged, aligned power-of-two
    /// blocks up to `CAP.MAMV`); one domain-selective descriptor instead when the unit
    /// has no page-selective invalidation or that would take more than
    /// [`MAX_PAGE_DESCRIPTORS`].
    fn iotlb_pages(&self, did: u16, ranges: &[VaRange]) {
        let psi = self.cap & (1 << 39) != 0;
        let mamv = ((self.cap >> 48) & 0x3f) as u32;
        let blocks = invalidation_blocks(ranges, mamv, MAX_PAGE_DESCRIPTORS);
        if !psi || blocks.len() > MAX_PAGE_DESCRIPTORS {
            self.iotlb_domain(did);
            return;
        }
        let lo = 2 | (3 << 4) | (1 << 6) | (1 << 7) | (u64::from(did) << 16);
        let d: Vec<(u64, u64)> = blocks
            .iter()
            .map(|&(addr, order)| (lo, addr | u64::from(order)))
            .collect();
        let _ = self.submit(&d, |c| &c.iotlb_page);
    }

    /// Point the context entry of `bdf` (bus 0) at `root` in domain `did` with address
    /// width `aw`, or clear it; then invalidate the context cache and the domain's IOTLB.
    fn set_context(&self, bdf: Bdf, root: Option<u64>, did: u16, aw: u64) {
        let devfn = u64::from(bdf.source_id() & 0xff);
        let at = self.context_table + 16 * devfn;
        match root {
            Some(r) => {
                self.store(at + 8, aw | (u64::from(did) << 8));
                self.store(at, r | 1);
            }
            None => self.store(at, 0),
        }
        let _ = self.submit(&[(1 | (1 << 4), 0)], |c| &c.context);
        self.iotlb_domain(did);
    }

    /// Read and clear every recorded fault.
    pub fn take_faults(&self) -> Vec<DmaFault> {
        let fro = ((self.cap >> 24) & 0x3ff) * 16;
        let nfr = ((self.cap >> 40) & 0xff) + 1;
        let mut out = Vec::new();
        for i in 0..nfr {
            let at = self.regs + fro + 16 * i;
            let hi = read64(at + 8);
            if hi >> 63 == 1 {
                out.push(DmaFault {
                    reason: (hi >> 32) as u8,
                    source: hi as u16,
                    address: read64(at) & !0xfff,
                    read: hi & (1 << 62) != 0,
                });
                // F is write-1-to-clear.
                write32(at + 12, 1 << 31);
            }
        }
        // Clear an overflow too.
        write32(self.regs + FSTS, 1);
        out
    }
}

/// One device's domain: the walker side of its [`gmem_x86pt::PagedMmu`].
pub struct VtdDomain {
    unit: Arc<VtdUnit>,
    bdf: Bdf,
    did: u16,
    aw: u64,
}

impl VtdDomain {
    /// Device `bdf` in domain `did`, its tables of `codec`'s width.
    pub fn new(unit: Arc<VtdUnit>, bdf: Bdf, did: u16, codec: &VtdCodec) -> VtdDomain {
        VtdDomain {
            unit,
            bdf,
            did,
            aw: codec.context_aw(),
        }
    }
}

impl PagingHardware for VtdDomain {
    unsafe fn read_pte(&self, pa: PhysAddr) -> u64 {
        // SAFETY: the caller guarantees an aligned entry of a live table frame; the
        // frame pool is identity mapped.
        unsafe { core::ptr::read_volatile(pa.as_u64() as *const u64) }
    }

    unsafe fn write_pte(&self, pa: PhysAddr, pte: u64) {
        // SAFETY: as in `read_pte`; one aligned 64-bit store.
        unsafe { core::ptr::write_volatile(pa.as_u64() as *mut u64, pte) };
        if !self.unit.coherent {
            flush_line(pa.as_u64());
        }
    }

    fn invalidate(&self, _root: PageTableRoot, ranges: &[VaRange]) {
        self.unit.iotlb_pages(self.did, ranges);
    }

    fn invalidate_all(&self, _root: PageTableRoot) {
        self.unit.iotlb_domain(self.did);
    }

    unsafe fn activate(&self, root: Option<PageTableRoot>) {
        self.unit
            .set_context(self.bdf, root.map(|r| r.0), self.did, self.aw);
    }
}
