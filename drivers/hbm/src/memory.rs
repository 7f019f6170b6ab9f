//! The stacks' bytes: the core's data mover for the device, the page-group classes, the
//! frame placement of coarse pages, and the access path of SMs and host.
//!
//! Two views of one memory, on purpose:
//! - the **core's view** ([`DeviceMemory`]: zero, read, write, copy) decodes each page
//!   by the class of its page group, which the core announces
//!   ([`DeviceMemory::group_class_changed`]) before any frame of the group is used —
//!   the operating system's own record of each page's mode;
//! - the **hardware's view** ([`HbmMemory::load`], [`HbmMemory::store`]) decodes by the
//!   granularity bit of the translation that served the access, as CODA's memory
//!   controller does. If a PTE's bit disagrees with the page's group, the access lands
//!   on other bytes than the core wrote — verification fails, which is what makes the
//!   bit real.
//!
//! Every access of the hardware view is accounted in 128-byte chunks by path: an SM to
//! its own stack (local), to another stack (remote), the host to any stack (host).

use crate::attrs::CodaAttrs;
use crate::config::{ConfigError, HbmConfig};
use crate::decode::{contiguous_len, decode, Granularity};
use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};
use gmem_core::{
    DeviceMemory, FrameConstraint, FramePlacement, FrameRequest, MemError, PhysAddr, PAGE_SIZE,
};
use spin::Mutex;

/// Traffic is counted in chunks of this many bytes.
pub const CHUNK: u64 = 128;

/// Who issues an access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Requester {
    /// The host processor (over its links).
    Host,
    /// Near-data SM number `n` (in stack `n / sms_per_stack`).
    Sm(u32),
}

/// Bytes moved by path, in whole 128-byte chunks (priced by [`crate::cost`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// SM to its own stack.
    pub local: u64,
    /// SM to another stack.
    pub remote: u64,
    /// Host to a stack.
    pub host: u64,
}

impl Traffic {
    /// The share of SM traffic that went to another stack.
    pub fn remote_fraction(&self) -> f64 {
        let sm = self.local + self.remote;
        if sm == 0 {
            0.0
        } else {
            self.remote as f64 / sm as f64
        }
    }
}

/// The memory of an HBM-stack system.
pub struct HbmMemory {
    cfg: HbmConfig,
    stacks: Vec<Mutex<Vec<u8>>>,
    /// Page-group class of each group (0 fine, 1 coarse), as the core announced.
    classes: Mutex<Vec<u8>>,
    local: AtomicU64,
    remote: AtomicU64,
    host: AtomicU64,
    /// Per stack: `[local, remote, host]` bytes. SM traffic is counted at the
    /// requesting SM's stack (what its stack's links carry in), host traffic at the
    /// stack that served it (the host's link to that stack).
    by_stack: Vec<[AtomicU64; 3]>,
    /// Coarse requests of several pages (no single stack can hold them contiguously).
    spread_requests: AtomicU64,
}

impl HbmMemory {
    /// Zeroed stacks for `cfg`.
    ///
    /// # Errors
    /// [`ConfigError`] for a bad configuration.
    pub fn new(cfg: HbmConfig) -> Result<HbmMemory, ConfigError> {
        cfg.validate()?;
        let groups = (cfg.total_bytes() / cfg.group_bytes()) as usize;
        Ok(HbmMemory {
            cfg,
            stacks: (0..cfg.stacks)
                .map(|_| Mutex::new(vec![0u8; cfg.stack_bytes as usize]))
                .collect(),
            classes: Mutex::new(vec![0u8; groups]),
            local: AtomicU64::new(0),
            remote: AtomicU64::new(0),
            host: AtomicU64::new(0),
            by_stack: (0..cfg.stacks)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
            spread_requests: AtomicU64::new(0),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &HbmConfig {
        &self.cfg
    }

    /// The mode the core gave the page group holding `pa` (`None` outside).
    pub fn granularity(&self, pa: PhysAddr) -> Option<Granularity> {
        let g = self.group_of(pa)?;
        Some(Granularity::of_class(u32::from(self.classes.lock()[g])))
    }

    fn group_of(&self, pa: PhysAddr) -> Option<usize> {
        let a = pa.as_u64().checked_sub(self.cfg.base.as_u64())?;
        (a < self.cfg.total_bytes()).then(|| (a / self.cfg.group_bytes()) as usize)
    }

    /// Traffic so far.
    pub fn traffic(&self) -> Traffic {
        Traffic {
            local: self.local.load(Ordering::Relaxed),
            remote: self.remote.load(Ordering::Relaxed),
            host: self.host.load(Ordering::Relaxed),
        }
    }

    /// Traffic so far by stack: SM traffic at the requesting SM's stack, host traffic
    /// at the stack that served it.
    pub fn traffic_by_stack(&self) -> Vec<Traffic> {
        self.by_stack
            .iter()
            .map(|c| Traffic {
                local: c[0].load(Ordering::Relaxed),
                remote: c[1].load(Ordering::Relaxed),
                host: c[2].load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Forget the traffic counted so far.
    pub fn reset_traffic(&self) {
        self.local.store(0, Ordering::Relaxed);
        self.remote.store(0, Ordering::Relaxed);
        self.host.store(0, Ordering::Relaxed);
        for c in &self.by_stack {
            for x in c {
                x.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Coarse-grain frame requests of more than one page (placed anywhere: one stack
    /// cannot give several contiguous coarse frames).
    pub fn spread_requests(&self) -> u64 {
        self.spread_requests.load(Ordering::Relaxed)
    }

    /// Walk `[pa, pa + len)` piece by piece, each piece inside one stack under `g`.
    fn pieces(
        &self,
        pa: PhysAddr,
        g: impl Fn(PhysAddr) -> Option<Granularity>,
        len: u64,
        mut f: impl FnMut(u32, u64, u64, u64) -> Result<(), MemError>,
    ) -> Result<(), MemError> {
        let mut done = 0;
        while done < len {
            let at = PhysAddr::new(pa.as_u64() + done);
            let mode = g(at).ok_or(MemError::OutOfRange { pa: at })?;
            let loc = decode(&self.cfg, at, mode).ok_or(MemError::OutOfRange { pa: at })?;
            let n = contiguous_len(&self.cfg, at, mode, len - done);
            f(loc.stack, loc.offset, done, n)?;
            done += n;
        }
        Ok(())
    }

    fn copy_out(
        &self,
        pa: PhysAddr,
        buf: &mut [u8],
        g: impl Fn(PhysAddr) -> Option<Granularity>,
    ) -> Result<(), MemError> {
        self.pieces(pa, g, buf.len() as u64, |stack, off, at, n| {
            let s = self.stacks[stack as usize].lock();
            buf[at as usize..(at + n) as usize]
                .copy_from_slice(&s[off as usize..(off + n) as usize]);
            Ok(())
        })
    }

    fn copy_in(
        &self,
        pa: PhysAddr,
        data: &[u8],
        g: impl Fn(PhysAddr) -> Option<Granularity>,
    ) -> Result<(), MemError> {
        self.pieces(pa, g, data.len() as u64, |stack, off, at, n| {
            let mut s = self.stacks[stack as usize].lock();
            s[off as usize..(off + n) as usize]
                .copy_from_slice(&data[at as usize..(at + n) as usize]);
            Ok(())
        })
    }

    /// Count an access of `who` touching `[pa, pa + len)` under `g` (whole 128-byte
    /// chunks by path) without moving bytes: what a data cache's miss or write-back
    /// costs ([`crate::dcache`]). Returns the traffic it added.
    ///
    /// # Errors
    /// [`MemError::OutOfRange`] outside the stacks' memory.
    pub fn account(
        &self,
        who: Requester,
        pa: PhysAddr,
        g: Granularity,
        len: u64,
    ) -> Result<Traffic, MemError> {
        let mut added = Traffic::default();
        self.pieces(
            pa,
            |_| Some(g),
            len,
            |stack, _, at, n| {
                let first = (pa.as_u64() + at) / CHUNK;
                let last = (pa.as_u64() + at + n - 1) / CHUNK;
                let bytes = (last - first + 1) * CHUNK;
                let (counter, at_stack, class) = match who {
                    Requester::Host => {
                        added.host += bytes;
                        (&self.host, stack, 2)
                    }
                    Requester::Sm(sm) if self.cfg.stack_of_sm(sm) == stack => {
                        added.local += bytes;
                        (&self.local, stack, 0)
                    }
                    Requester::Sm(sm) => {
                        added.remote += bytes;
                        (&self.remote, self.cfg.stack_of_sm(sm), 1)
                    }
                };
                counter.fetch_add(bytes, Ordering::Relaxed);
                if let Some(c) = self.by_stack.get(at_stack as usize) {
                    c[class].fetch_add(bytes, Ordering::Relaxed);
                }
                Ok(())
            },
        )?;
        Ok(added)
    }

    /// Read `buf.len()` bytes at `pa` decoded by the bit `g`, counting nothing (the
    /// caller accounts the access through its data caches, [`HbmMemory::account`]).
    ///
    /// # Errors
    /// [`MemError::OutOfRange`] outside the stacks' memory.
    pub fn read_as(&self, pa: PhysAddr, g: Granularity, buf: &mut [u8]) -> Result<(), MemError> {
        self.copy_out(pa, buf, |_| Some(g))
    }

    /// Write `data` at `pa` decoded by the bit `g`, counting nothing (see
    /// [`HbmMemory::read_as`]).
    ///
    /// # Errors
    /// [`MemError::OutOfRange`] outside the stacks' memory.
    pub fn write_as(&self, pa: PhysAddr, g: Granularity, data: &[u8]) -> Result<(), MemError> {
        self.copy_in(pa, data, |_| Some(g))
    }

    /// A load by `who` through a translation whose granularity bit is `g` (CODA's
    /// memory controller routes by the bit, not by the page's group).
    ///
    /// # Errors
    /// [`MemError::OutOfRange`] outside the stacks' memory.
    pub fn load(
        &self,
        who: Requester,
        pa: PhysAddr,
        g: Granularity,
        buf: &mut [u8],
    ) -> Result<(), MemError> {
        let _ = self.account(who, pa, g, buf.len() as u64)?;
        self.copy_out(pa, buf, |_| Some(g))
    }

    /// A store by `who` through a translation whose granularity bit is `g`.
    ///
    /// # Errors
    /// [`MemError::OutOfRange`] outside the stacks' memory.
    pub fn store(
        &self,
        who: Requester,
        pa: PhysAddr,
        g: Granularity,
        data: &[u8],
    ) -> Result<(), MemError> {
        let _ = self.account(who, pa, g, data.len() as u64)?;
        self.copy_in(pa, data, |_| Some(g))
    }
}

impl DeviceMemory for HbmMemory {
    fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        let zeros = vec![0u8; PAGE_SIZE as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(PAGE_SIZE);
            self.write(PhysAddr::new(pa.as_u64() + done), &zeros[..n as usize])?;
            done += n;
        }
        Ok(())
    }
    fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
        self.copy_out(pa, buf, |a| self.granularity(a))
    }
    fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
        self.copy_in(pa, buf, |a| self.granularity(a))
    }
    fn frame_class(&self, request: &FrameRequest) -> u32 {
        CodaAttrs::decode(request.attrs).granularity.class()
    }
    fn frame_request(&self, request: &FrameRequest) -> FramePlacement {
        let attrs = CodaAttrs::decode(request.attrs);
        let Some(stack) = attrs.stack_of(request.va.as_u64(), self.cfg.stacks) else {
            return FramePlacement::Any;
        };
        if request.pages > 1 {
            self.spread_requests.fetch_add(1, Ordering::Relaxed);
            return FramePlacement::Any;
        }
        // The frame of its group that the coarse decode puts in `stack`; when that
        // stack has no free coarse slot, a fine-grain frame (the core counts it).
        FramePlacement::PreferOrClass {
            prefer: FrameConstraint {
                align: self.cfg.group_bytes(),
                phase: u64::from(stack) * PAGE_SIZE,
                nocross: 0,
                min: self.cfg.base,
                max: PhysAddr::new(self.cfg.end().as_u64() - 1),
            },
            class: Granularity::Fine.class(),
        }
    }
    fn group_class_changed(&self, base: PhysAddr, frames: u64, _from: u32, to: u32) {
        let mut classes = self.classes.lock();
        let mut pa = base.as_u64();
        let end = base.as_u64() + frames * PAGE_SIZE;
        while pa < end {
            if let Some(g) = self.group_of(PhysAddr::new(pa)) {
                classes[g] = to as u8;
            }
            pa += self.cfg.group_bytes();
        }
    }
}
