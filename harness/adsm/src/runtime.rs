//! The ADSM runtime: shared objects at one address for the CPU and the GPU, release
//! consistency, and GMAC's three coherence protocols.
//!
//! **Objects.** [`Adsm::alloc`] takes a region of the space, gives every page a
//! device-private frame in the GPU's memory ([`gmem_core::Gmem::region_alloc_private`]:
//! mapped at the same address in the GPU's table only) and host frames for the CPU
//! (prefetched zero-filled pages, mapped by the CPU's faults): one pointer, two copies.
//! [`Adsm::safe_alloc`] is §4.2's `adsmSafeAlloc`: the device copy lives in a second
//! region, only the device's, whose address [`Adsm::safe`] gives for a CPU address.
//!
//! **Release consistency.** [`Adsm::call`] releases every object the CPU may have
//! written to the device before the kernel runs; [`Adsm::sync`] waits for it, after
//! which the device's writes are visible to the CPU. Between the two the objects are
//! the device's: a CPU access is refused ([`AdsmError::KernelRunning`]).
//!
//! **Protocols** (reconstructed; the paper's text only names them):
//! - *batch*: no protection; `call` copies every object to the device, `sync` every
//!   object back.
//! - *lazy*: one block per object, in state invalid (no access), read-only or dirty
//!   (read-write), kept by the core's region protection; the CPU's fault path does the
//!   rest: a CPU write to a read-only object faults into the runtime, which marks it
//!   dirty and opens it; `call` sends the dirty objects and makes every object invalid;
//!   the CPU's first access after `sync` faults and fetches the object whole.
//! - *rolling*: the same per fixed-size block, with a FIFO of at most `rolling` dirty
//!   blocks: when a block joins a full FIFO, the oldest is made read-only and flushed
//!   to the device in the background (on the DMA timeline, while the CPU goes on); a
//!   later CPU write to it faults and makes it dirty again (waiting for its flush
//!   first); after `sync` only the blocks the CPU touches are fetched.
//!
//! A deliberately broken variant ([`Adsm::with_forgotten_release`]) skips the release
//! at `call`; the tests show the device then computes on stale data and verification
//! catches it.

use crate::dma::transfer_timed;
use crate::machine::{AdsmError, Machine};
use crate::model::{TimeModel, Timeline, Way};
use crate::program::{Buf, Kernel, Measured, Program, Window};
use gmem_core::{
    AllocRequest, FaultError, MigrateScope, Prot, Region, VaRange, VirtAddr, PAGE_SIZE,
};
use gmem_sim::{AccessError, Grid};
use std::collections::{BTreeMap, VecDeque};

/// A coherence protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Copy every object at every call and sync.
    Batch,
    /// Per object: invalid / read-only / dirty, by page protection.
    Lazy,
    /// Per block of `block` bytes, at most `rolling` dirty blocks pending.
    Rolling {
        /// Block size in bytes (a multiple of 4 KiB).
        block: u64,
        /// Dirty-FIFO capacity in blocks (at least 1).
        rolling: usize,
    },
}

impl Protocol {
    /// Rolling with the defaults used for every workload: 256 KiB blocks, 4 pending.
    pub const ROLLING_DEFAULT: Protocol = Protocol::Rolling {
        block: 256 << 10,
        rolling: 4,
    };

    /// Short name: `batch`, `lazy`, `rolling`.
    pub fn name(&self) -> &'static str {
        match self {
            Protocol::Batch => "batch",
            Protocol::Lazy => "lazy",
            Protocol::Rolling { .. } => "rolling",
        }
    }
}

/// A block's state on the CPU side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// The device's copy is newer: no CPU access.
    Invalid,
    /// Both copies agree: the CPU may read.
    ReadOnly,
    /// The CPU's copy is newer: the CPU may read and write.
    Dirty,
}

struct Object {
    region: Region,
    dev: VirtAddr,
    dev_region: Option<Region>,
    len: u64,
    block: u64,
    states: Vec<BlockState>,
    /// When the last background flush of each block ends (ns).
    flush_end: Vec<f64>,
}

impl Object {
    fn host(&self) -> VirtAddr {
        self.region.start
    }
    fn block_range(&self, b: usize) -> (u64, u64) {
        let off = b as u64 * self.block;
        (off, self.block.min(self.len - off))
    }
}

/// The ADSM runtime over a [`Machine`].
pub struct Adsm {
    m: Machine,
    protocol: Protocol,
    tl: Timeline,
    objects: BTreeMap<u64, Object>,
    fifo: VecDeque<(u64, usize)>,
    max_fifo: usize,
    eager_flushes: u64,
    running: bool,
    forget_release: bool,
    window: Window,
}

impl Adsm {
    /// A runtime with `protocol` on `machine`, timed by `model`.
    ///
    /// # Errors
    /// [`AdsmError::BadArgument`] for a rolling block size that is zero or not a page
    /// multiple, or a rolling size of zero.
    pub fn new(machine: Machine, protocol: Protocol, model: TimeModel) -> Result<Adsm, AdsmError> {
        if let Protocol::Rolling { block, rolling } = protocol {
            if block == 0 || block % PAGE_SIZE != 0 {
                return Err(AdsmError::BadArgument(
                    "block size: a non-zero page multiple",
                ));
            }
            if rolling == 0 {
                return Err(AdsmError::BadArgument("rolling size: at least 1"));
            }
        }
        let window = Window::open(&machine);
        Ok(Adsm {
            m: machine,
            protocol,
            tl: Timeline::new(model),
            objects: BTreeMap::new(),
            fifo: VecDeque::new(),
            max_fifo: 0,
            eager_flushes: 0,
            running: false,
            forget_release: false,
            window,
        })
    }

    /// The deliberately broken variant: `call` releases nothing. For tests only: it
    /// shows that the device then reads stale data.
    pub fn with_forgotten_release(mut self) -> Adsm {
        self.forget_release = true;
        self
    }

    /// The protocol.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The current length of the dirty FIFO (rolling).
    pub fn fifo_len(&self) -> usize {
        self.fifo.len()
    }

    /// The state of the block holding CPU address `at`, if an object holds it.
    pub fn state_at(&self, at: VirtAddr) -> Option<BlockState> {
        let (_, o) = self.object_of(at)?;
        let b = ((at.as_u64() - o.host().as_u64()) / o.block) as usize;
        Some(o.states[b])
    }

    fn object_of(&self, at: VirtAddr) -> Option<(u64, &Object)> {
        let (&k, o) = self.objects.range(..=at.as_u64()).next_back()?;
        (at.as_u64() < k + o.len).then_some((k, o))
    }

    fn new_object(&mut self, len: u64, safe: bool) -> Result<VirtAddr, AdsmError> {
        if len == 0 {
            return Err(AdsmError::BadArgument("zero-byte allocation"));
        }
        let len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let gm = &self.m.gm;
        let region = gm.as_alloc(self.m.space, AllocRequest::new(len))?;
        let dev_region = if safe {
            match gm.as_alloc(self.m.space, AllocRequest::new(len)) {
                Ok(r) => Some(r),
                Err(e) => {
                    let _ = gm.region_dealloc(region, gmem_core::MapFlags::empty(), None);
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        let undo = |e: AdsmError| {
            let _ = gm.region_dealloc(region, gmem_core::MapFlags::empty(), None);
            if let Some(d) = dev_region {
                let _ = gm.region_dealloc(d, gmem_core::MapFlags::empty(), None);
            }
            e
        };
        let setup = || -> Result<(), AdsmError> {
            // The device copy: private frames, at the same address or the second one.
            gm.region_alloc_private(dev_region.unwrap_or(region), self.m.gpu_id)?;
            if let Some(d) = dev_region {
                // Only the device's: the CPU may not touch the second address.
                gm.region_protect(d, Prot::empty())?;
            }
            // The CPU copy: host frames (zero-filled, like the device's).
            gm.region_migrate(region, gm.host(), MigrateScope::Prefetch)?;
            Ok(())
        };
        setup().map_err(undo)?;
        let block = match self.protocol {
            Protocol::Rolling { block, .. } => block.min(len),
            _ => len,
        };
        let blocks = len.div_ceil(block) as usize;
        let initial = match self.protocol {
            Protocol::Batch => BlockState::Dirty,
            _ => BlockState::ReadOnly,
        };
        if initial == BlockState::ReadOnly {
            gm.region_protect(region, Prot::READ)
                .map_err(|e| undo(e.into()))?;
        }
        self.objects.insert(
            region.start.as_u64(),
            Object {
                region,
                dev: dev_region.map_or(region.start, |d| d.start),
                dev_region,
                len,
                block,
                states: vec![initial; blocks],
                flush_end: vec![0.0; blocks],
            },
        );
        Ok(region.start)
    }

    /// `adsmAlloc`: a shared object of `len` bytes (rounded up to pages); the one
    /// pointer the CPU and kernels both use.
    ///
    /// # Errors
    /// [`AdsmError::BadArgument`] for zero bytes; the core's error when host or device
    /// memory runs out (nothing of the call is left).
    pub fn alloc(&mut self, len: u64) -> Result<VirtAddr, AdsmError> {
        self.new_object(len, false)
    }

    /// `adsmSafeAlloc`: a shared object whose pointer is valid on the CPU only; kernels
    /// get its device address from [`Adsm::safe`].
    ///
    /// # Errors
    /// As [`Adsm::alloc`].
    pub fn safe_alloc(&mut self, len: u64) -> Result<VirtAddr, AdsmError> {
        self.new_object(len, true)
    }

    /// `adsmSafe`: the device address of CPU address `at` in a shared object.
    ///
    /// # Errors
    /// [`AdsmError::NotAnObject`] when no object holds `at`.
    pub fn safe(&self, at: VirtAddr) -> Result<VirtAddr, AdsmError> {
        let (k, o) = self.object_of(at).ok_or(AdsmError::NotAnObject(at))?;
        Ok(VirtAddr::new(o.dev.as_u64() + (at.as_u64() - k)))
    }

    /// `adsmFree`: release the object starting at `at`.
    ///
    /// # Errors
    /// [`AdsmError::KernelRunning`]; [`AdsmError::NotAnObject`] unless `at` starts an
    /// object; nothing changes then.
    pub fn free(&mut self, at: VirtAddr) -> Result<(), AdsmError> {
        if self.running {
            return Err(AdsmError::KernelRunning);
        }
        let o = self
            .objects
            .remove(&at.as_u64())
            .ok_or(AdsmError::NotAnObject(at))?;
        self.fifo.retain(|&(k, _)| k != at.as_u64());
        let gm = &self.m.gm;
        gm.region_dealloc(o.region, gmem_core::MapFlags::empty(), None)?;
        if let Some(d) = o.dev_region {
            gm.region_dealloc(d, gmem_core::MapFlags::empty(), None)?;
        }
        Ok(())
    }

    fn protect(&mut self, region: Region, off: u64, len: u64, prot: Prot) -> Result<(), AdsmError> {
        let range = VaRange {
            start: VirtAddr::new(region.start.as_u64() + off),
            len,
        };
        self.m
            .gm
            .region_protect(gmem_core::Pages::range(region.space, range), prot)?;
        self.tl.protect();
        Ok(())
    }

    /// Move block `b` of object `k` from the device to the host (synchronously).
    fn fetch(&mut self, k: u64, b: usize) -> Result<(), AdsmError> {
        let o = &self.objects[&k];
        let (off, len) = o.block_range(b);
        let (h, d) = (o.host().as_u64() + off, o.dev.as_u64() + off);
        transfer_timed(
            &self.m,
            &mut self.tl,
            Way::ToHost,
            VirtAddr::new(h),
            VirtAddr::new(d),
            len,
            true,
        )?;
        Ok(())
    }

    /// Block `b` of object `k` becomes dirty (read-write); rolling: it joins the FIFO,
    /// whose overflow is flushed in the background.
    fn make_dirty(&mut self, k: u64, b: usize) -> Result<(), AdsmError> {
        let (region, off, len) = {
            let o = &self.objects[&k];
            let (off, len) = o.block_range(b);
            (o.region, off, len)
        };
        self.protect(region, off, len, Prot::RW)?;
        self.objects.get_mut(&k).expect("object").states[b] = BlockState::Dirty;
        if let Protocol::Rolling { rolling, .. } = self.protocol {
            self.fifo.push_back((k, b));
            while self.fifo.len() > rolling {
                let (ok, ob) = self.fifo.pop_front().expect("non-empty");
                self.flush_early(ok, ob)?;
            }
            self.max_fifo = self.max_fifo.max(self.fifo.len());
        }
        Ok(())
    }

    /// Rolling's eager flush: make the block read-only (a later write faults and
    /// re-dirties it), send it in the background.
    fn flush_early(&mut self, k: u64, b: usize) -> Result<(), AdsmError> {
        let (region, off, len, dev) = {
            let o = &self.objects[&k];
            let (off, len) = o.block_range(b);
            (o.region, off, len, o.dev)
        };
        self.protect(region, off, len, Prot::READ)?;
        let end = transfer_timed(
            &self.m,
            &mut self.tl,
            Way::ToDevice,
            VirtAddr::new(region.start.as_u64() + off),
            VirtAddr::new(dev.as_u64() + off),
            len,
            false,
        )?;
        let o = self.objects.get_mut(&k).expect("object");
        o.states[b] = BlockState::ReadOnly;
        o.flush_end[b] = end;
        self.eager_flushes += 1;
        Ok(())
    }

    /// The runtime's fault handler (GMAC's SIGSEGV handler): a CPU access at `va`
    /// faulted with a protection violation.
    fn handle_fault(&mut self, va: VirtAddr, access: Prot) -> Result<(), AdsmError> {
        let (k, b, state) = match self.object_of(va) {
            Some((k, o)) if self.protocol != Protocol::Batch => {
                let b = ((va.as_u64() - k) / o.block) as usize;
                (k, b, o.states[b])
            }
            _ => return Err(AdsmError::FaultLoop(va)),
        };
        self.tl.faults(1);
        let write = access.contains(Prot::WRITE);
        match state {
            BlockState::Invalid => {
                self.fetch(k, b)?;
                if write {
                    self.make_dirty(k, b)?;
                } else {
                    let o = &self.objects[&k];
                    let (region, (off, len)) = (o.region, o.block_range(b));
                    self.protect(region, off, len, Prot::READ)?;
                    self.objects.get_mut(&k).expect("object").states[b] = BlockState::ReadOnly;
                }
            }
            BlockState::ReadOnly if write => {
                // A block being flushed in the background is written only after its
                // DMA has read it.
                let end = self.objects[&k].flush_end[b];
                self.tl.wait_until(end);
                self.make_dirty(k, b)?;
            }
            _ => return Err(AdsmError::FaultLoop(va)),
        }
        Ok(())
    }

    /// A CPU access of `len` bytes at `va` through `op` (a store or a load of the bytes
    /// `range` of the caller's buffer at an address), handling protection faults on
    /// shared objects and retrying from the faulting page.
    fn cpu_access(
        &mut self,
        va: VirtAddr,
        len: usize,
        mut op: impl FnMut(&Machine, VirtAddr, std::ops::Range<usize>) -> Result<(), AccessError>,
    ) -> Result<(), AdsmError> {
        if self.running && self.object_of(va).is_some() {
            return Err(AdsmError::KernelRunning);
        }
        self.tl.cpu_work(len as u64);
        let mut done = 0usize;
        let mut budget = 3 * (len as u64 / PAGE_SIZE + 2);
        while done < len {
            let at = VirtAddr::new(va.as_u64() + done as u64);
            match op(&self.m, at, done..len) {
                Ok(()) => return Ok(()),
                Err(AccessError::Fault {
                    va: fva,
                    access,
                    error: FaultError::ProtectionViolation { .. },
                }) if budget > 0 => {
                    budget -= 1;
                    self.handle_fault(fva, access)?;
                    done = (fva.as_u64() - va.as_u64()) as usize;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Release: send what the device must see, then every object becomes the device's.
    fn release(&mut self) -> Result<(), AdsmError> {
        let keys: Vec<u64> = self.objects.keys().copied().collect();
        for k in keys {
            let (region, dev, len) = {
                let o = &self.objects[&k];
                (o.region, o.dev, o.len)
            };
            match self.protocol {
                Protocol::Batch => {
                    if !self.forget_release {
                        transfer_timed(
                            &self.m,
                            &mut self.tl,
                            Way::ToDevice,
                            region.start,
                            dev,
                            len,
                            true,
                        )?;
                    }
                }
                _ => {
                    // Dirty blocks, adjacent ones in one transfer.
                    let o = &self.objects[&k];
                    let mut runs: Vec<(u64, u64)> = Vec::new();
                    for b in 0..o.states.len() {
                        if o.states[b] != BlockState::Dirty {
                            continue;
                        }
                        let (off, n) = o.block_range(b);
                        match runs.last_mut() {
                            Some((s, l)) if *s + *l == off => *l += n,
                            _ => runs.push((off, n)),
                        }
                    }
                    if !self.forget_release {
                        for (off, n) in runs {
                            transfer_timed(
                                &self.m,
                                &mut self.tl,
                                Way::ToDevice,
                                VirtAddr::new(region.start.as_u64() + off),
                                VirtAddr::new(dev.as_u64() + off),
                                n,
                                true,
                            )?;
                        }
                    }
                    // The kernel may write anything: the CPU's copy is invalid.
                    self.m.gm.region_protect(region, Prot::empty())?;
                    self.tl.protect();
                    let o = self.objects.get_mut(&k).expect("object");
                    o.states.fill(BlockState::Invalid);
                }
            }
        }
        self.fifo.clear();
        Ok(())
    }

    /// Acquire after the kernel: batch copies every object back; lazy and rolling
    /// fetch on the CPU's faults.
    fn acquire(&mut self) -> Result<(), AdsmError> {
        if self.protocol != Protocol::Batch {
            return Ok(());
        }
        let objs: Vec<(VirtAddr, VirtAddr, u64)> = self
            .objects
            .values()
            .map(|o| (o.host(), o.dev, o.len))
            .collect();
        for (h, d, len) in objs {
            transfer_timed(&self.m, &mut self.tl, Way::ToHost, h, d, len, true)?;
        }
        Ok(())
    }
}

impl Program for Adsm {
    fn alloc(&mut self, len: u64) -> Result<Buf, AdsmError> {
        let p = Adsm::alloc(self, len)?;
        Ok(Buf {
            host: p,
            dev: p,
            len,
        })
    }
    fn free(&mut self, buf: Buf) -> Result<(), AdsmError> {
        Adsm::free(self, buf.host)
    }
    fn store(&mut self, at: VirtAddr, data: &[u8]) -> Result<(), AdsmError> {
        self.cpu_access(at, data.len(), |m, a, r| m.cpu.store(&m.gm, a, &data[r]))
    }
    fn load(&mut self, at: VirtAddr, out: &mut [u8]) -> Result<(), AdsmError> {
        let len = out.len();
        self.cpu_access(at, len, |m, a, r| m.cpu.load(&m.gm, a, &mut out[r]))
    }
    fn copy_in(&mut self, _buf: Buf) -> Result<(), AdsmError> {
        Ok(())
    }
    fn copy_out(&mut self, _buf: Buf) -> Result<(), AdsmError> {
        Ok(())
    }
    fn call(&mut self, grid: Grid, kernel: Kernel<'_>) -> Result<(), AdsmError> {
        if self.running {
            return Err(AdsmError::KernelRunning);
        }
        self.release()?;
        self.m.launch(&mut self.tl, grid, kernel)?;
        self.running = true;
        Ok(())
    }
    fn sync(&mut self) -> Result<(), AdsmError> {
        if !self.running {
            return Err(AdsmError::NotRunning);
        }
        self.running = false;
        self.tl.wait_gpu();
        self.acquire()
    }
    fn begin(&mut self) {
        self.tl.reset();
        self.max_fifo = self.fifo.len();
        self.eager_flushes = 0;
        self.window = Window::open(&self.m);
    }
    fn measure(&self) -> Measured {
        Measured {
            max_fifo: self.max_fifo,
            eager_flushes: self.eager_flushes,
            ..self.window.close(&self.m, &self.tl)
        }
    }
    fn machine(&self) -> &Machine {
        &self.m
    }
}
