//! [`TestMemory`]: sparse, page-granular memory that holds real bytes, answers frame
//! requests with a settable placement and page-group classes, and counts what it was
//! asked to do.

use crate::addr::{PhysAddr, VirtAddr, PAGE_SHIFT, PAGE_SIZE};
use crate::mmu::{DeviceMemory, FramePlacement, FrameRequest, MemError};
use crate::sync::{AtomicBool, AtomicU32, Mutex, Ordering};
use alloc::boxed::Box;
use alloc::vec::Vec;
use hashbrown::HashMap;

/// Sparse byte-holding memory: absent pages read as zeros.
pub struct TestMemory {
    /// The bytes and the counts of what was done to them, under one lock: a `zero`
    /// (once per fault) takes one lock, not two. No lock of the core covers this map,
    /// so the lock stays even on the fault path: one memory holds the frames of every
    /// space placed in it, whose faults run at once (each holds only its own space's
    /// lock), and `read`, `write` and `copy` come from device accesses and migrations
    /// on other threads.
    store: Mutex<Store>,
    /// `[base, end)` of addresses this memory answers for (`None` = any).
    bounds: Option<(u64, u64)>,
    placement: Mutex<FramePlacement>,
    /// Whether `placement` is [`FramePlacement::Any`] (the default): then a frame
    /// request, once per allocation, reads this flag instead of taking the lock.
    placement_any: AtomicBool,
    requests: Mutex<Vec<FrameRequest>>,
    /// Do not keep the frame requests (benchmarks: the log grows without bound).
    skip_requests: bool,
    /// Page-group classes: `n > 0` answers class `(va / 16 KiB) % n`, `0` class 0 for
    /// all. An atomic read, not a lock, on every allocation's `frame_class`.
    classes: AtomicU32,
    /// Every page-group class change the core announced: `(base, frames, from, to)`.
    class_changes: Mutex<Vec<(PhysAddr, u64, u32, u32)>>,
}

impl Default for TestMemory {
    fn default() -> Self {
        TestMemory {
            store: Mutex::default(),
            bounds: None,
            placement: Mutex::new(FramePlacement::Any),
            placement_any: AtomicBool::new(true),
            requests: Mutex::default(),
            skip_requests: false,
            classes: AtomicU32::new(0),
            class_changes: Mutex::default(),
        }
    }
}

/// A [`TestMemory`]'s pages and counts.
#[derive(Default)]
struct Store {
    pages: HashMap<u64, Box<[u8; PAGE_SIZE as usize]>>,
    counts: MemCounts,
}

impl Store {
    /// Make `[pa, pa + len)` read as zeros: whole pages are forgotten, parts of pages
    /// cleared (out of line: [`DeviceMemory::zero`] of an empty memory skips it).
    #[inline(never)]
    fn forget(&mut self, pa: PhysAddr, len: u64) {
        let pages = &mut self.pages;
        TestMemory::each_page(pa, len, |pfn, off, n, _| {
            if n == PAGE_SIZE as usize {
                pages.remove(&pfn);
            } else if let Some(p) = pages.get_mut(&pfn) {
                p[off..off + n].fill(0);
            }
        });
    }
}

/// What a [`TestMemory`] was asked to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemCounts {
    /// Bytes zeroed.
    pub zeroed: u64,
    /// Bytes read.
    pub read: u64,
    /// Bytes written.
    pub written: u64,
    /// `copy` calls made from this memory (each moves one run, through the bounce
    /// buffer of [`crate::mmu::bounce_copy`]).
    pub copies: u64,
}

impl TestMemory {
    /// Memory answering for `[base, end)`.
    pub fn with_bounds(base: u64, end: u64) -> TestMemory {
        TestMemory {
            bounds: Some((base, end)),
            ..TestMemory::default()
        }
    }

    /// The same memory without the frame-request log ([`TestMemory::take_frame_requests`]
    /// then returns nothing): for benchmarks, where the log grows by one entry per
    /// allocation and its lock and pushes would be timed with the core.
    pub fn without_request_log(mut self) -> TestMemory {
        self.skip_requests = true;
        self
    }

    /// Answer every frame request with `placement`.
    pub fn set_frame_placement(&self, placement: FramePlacement) {
        let mut p = self.placement.lock();
        *p = placement;
        self.placement_any
            .store(placement == FramePlacement::Any, Ordering::Release);
    }

    /// The frame requests asked of this memory since the last call, in order.
    pub fn take_frame_requests(&self) -> Vec<FrameRequest> {
        core::mem::take(&mut *self.requests.lock())
    }

    /// Answer frame requests with page-group class `(va / 16 KiB) % n` (`None` or
    /// `Some(0)`: class 0 for all).
    pub fn set_frame_classes(&self, n: Option<u32>) {
        self.classes.store(n.unwrap_or(0), Ordering::Relaxed);
    }

    /// Record a frame request (out of line: the answer `Any` with the log off, every
    /// fault of a benchmark, then needs no call frame).
    #[inline(never)]
    fn log_request(&self, request: &FrameRequest) {
        self.requests.lock().push(*request);
    }

    /// The placement a test set (out of line, as [`TestMemory::log_request`]).
    #[inline(never)]
    fn set_placement(&self) -> FramePlacement {
        *self.placement.lock()
    }

    /// The class [`DeviceMemory::frame_class`] answers for `va`.
    pub fn class_of(&self, va: VirtAddr) -> u32 {
        match self.classes.load(Ordering::Relaxed) {
            0 => 0,
            n => ((va.as_u64() >> (PAGE_SHIFT + 2)) % u64::from(n)) as u32,
        }
    }

    /// The page-group class changes announced so far: `(base, frames, from, to)`.
    pub fn class_changes(&self) -> Vec<(PhysAddr, u64, u32, u32)> {
        self.class_changes.lock().clone()
    }

    /// What it was asked to do.
    pub fn counts(&self) -> MemCounts {
        self.store.lock().counts
    }

    fn check(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        match self.bounds {
            Some((b, e)) if pa.as_u64() < b || pa.as_u64().saturating_add(len) > e => {
                Err(MemError::OutOfRange { pa })
            }
            _ => Ok(()),
        }
    }

    fn each_page(pa: PhysAddr, len: u64, mut f: impl FnMut(u64, usize, usize, usize)) {
        let mut done = 0u64;
        while done < len {
            let a = pa.as_u64() + done;
            let off = (a & (PAGE_SIZE - 1)) as usize;
            let n = ((PAGE_SIZE as usize - off) as u64).min(len - done) as usize;
            f(a >> PAGE_SHIFT, off, n, done as usize);
            done += n as u64;
        }
    }
}

impl DeviceMemory for TestMemory {
    fn copy(
        &self,
        src: PhysAddr,
        to: &dyn DeviceMemory,
        dst: PhysAddr,
        len: u64,
    ) -> Result<(), MemError> {
        self.store.lock().counts.copies += 1;
        crate::mmu::bounce_copy(self, src, to, dst, len)
    }
    fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        self.check(pa, len)?;
        let mut store = self.store.lock();
        // A memory that holds no bytes yet (every page reads as zeros: a benchmark's
        // memory, never written) has nothing to forget: no hash probe per page, and
        // the probes stay out of line.
        if !store.pages.is_empty() {
            store.forget(pa, len);
        }
        store.counts.zeroed += len;
        Ok(())
    }
    fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
        self.check(pa, buf.len() as u64)?;
        let mut store = self.store.lock();
        let pages = &store.pages;
        TestMemory::each_page(pa, buf.len() as u64, |pfn, off, n, at| {
            match pages.get(&pfn) {
                Some(p) => buf[at..at + n].copy_from_slice(&p[off..off + n]),
                None => buf[at..at + n].fill(0),
            }
        });
        store.counts.read += buf.len() as u64;
        Ok(())
    }
    fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
        self.check(pa, buf.len() as u64)?;
        let mut store = self.store.lock();
        let pages = &mut store.pages;
        TestMemory::each_page(pa, buf.len() as u64, |pfn, off, n, at| {
            let p = pages
                .entry(pfn)
                .or_insert_with(|| Box::new([0; PAGE_SIZE as usize]));
            p[off..off + n].copy_from_slice(&buf[at..at + n]);
        });
        store.counts.written += buf.len() as u64;
        Ok(())
    }
    fn frame_request(&self, request: &FrameRequest) -> FramePlacement {
        if !self.skip_requests {
            self.log_request(request);
        }
        if self.placement_any.load(Ordering::Acquire) {
            return FramePlacement::Any;
        }
        self.set_placement()
    }
    fn frame_class(&self, request: &FrameRequest) -> u32 {
        self.class_of(request.va)
    }
    fn group_class_changed(&self, base: PhysAddr, frames: u64, from: u32, to: u32) {
        self.class_changes.lock().push((base, frames, from, to));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `zero` forgets whole pages and clears partial ones when the memory holds bytes,
    /// and counts the bytes either way (also when it holds none and skips the probes).
    #[test]
    fn zero_clears_written_bytes_and_counts_when_empty() {
        let m = TestMemory::default();
        m.zero(PhysAddr::new(0x4000), 2 * PAGE_SIZE).unwrap();
        assert_eq!(m.counts().zeroed, 2 * PAGE_SIZE);

        m.write(PhysAddr::new(0x4000), &[7; 2 * PAGE_SIZE as usize])
            .unwrap();
        // A partial zero of the first page, a whole-page zero of the second.
        m.zero(PhysAddr::new(0x4010), 0x10).unwrap();
        m.zero(PhysAddr::new(0x5000), PAGE_SIZE).unwrap();
        let mut buf = [0u8; 2 * PAGE_SIZE as usize];
        m.read(PhysAddr::new(0x4000), &mut buf).unwrap();
        assert!(buf[..0x10].iter().all(|&b| b == 7));
        assert!(buf[0x10..0x20].iter().all(|&b| b == 0));
        assert!(buf[0x20..PAGE_SIZE as usize].iter().all(|&b| b == 7));
        assert!(buf[PAGE_SIZE as usize..].iter().all(|&b| b == 0));
        assert_eq!(m.counts().zeroed, 3 * PAGE_SIZE + 0x10);
        assert_eq!(
            m.store.lock().pages.len(),
            1,
            "the whole-page zero forgot its page"
        );
    }
}
