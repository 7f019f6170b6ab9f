//! A pool of 4 KiB frames in simulated memory, for page-table pages.
//!
//! A driver's page tables live in the memory its hardware walks: the x86-64 tables of
//! the CPU and the integrated GPU in host memory, a discrete GPU's tables in its video
//! memory. A [`FramePool`] owns a range of such a memory that is *not* registered with
//! the core (the core never hands those frames out) and gives them to a page-table
//! format one at a time, zeroed. It implements the core's [`FrameSource`].

use crate::lock;
use crate::memory::{BoundsError, SimMemory};
use gmem_core::{FrameSource, PhysAddr, PAGE_SIZE};
use std::sync::{Arc, Mutex};

/// Counters of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Frames in the pool.
    pub frames: u64,
    /// Frames handed out and not given back.
    pub in_use: u64,
    /// Most frames in use at once.
    pub peak: u64,
    /// Allocations that failed because the pool was empty.
    pub exhausted: u64,
    /// Frames given back that were not the pool's or not in use (ignored).
    pub bad_frees: u64,
}

struct Inner {
    free: Vec<u64>,
    used: Vec<bool>,
    stats: PoolStats,
}

/// 4 KiB frames `[base, base + frames * 4 KiB)` of a [`SimMemory`].
pub struct FramePool {
    memory: Arc<SimMemory>,
    base: u64,
    inner: Mutex<Inner>,
}

impl FramePool {
    /// A pool of `frames` frames from `base` in `memory`; the range must lie inside it.
    ///
    /// # Errors
    /// [`BoundsError::BadRange`] if `base` is not page aligned, `frames` is zero or the
    /// range overflows; [`BoundsError::OutOfRange`] if it is not inside `memory`.
    pub fn new(
        memory: Arc<SimMemory>,
        base: PhysAddr,
        frames: u64,
    ) -> Result<FramePool, BoundsError> {
        let len = frames.checked_mul(PAGE_SIZE).ok_or(BoundsError::BadRange {
            base: base.as_u64(),
            size: u64::MAX,
        })?;
        if !base.is_page_aligned() || frames == 0 {
            return Err(BoundsError::BadRange {
                base: base.as_u64(),
                size: len,
            });
        }
        let end = base.as_u64().checked_add(len);
        if !memory.contains(base) || !matches!(end, Some(e) if e <= memory.end().as_u64()) {
            return Err(BoundsError::OutOfRange {
                pa: base,
                len,
                base: memory.base(),
                end: memory.end(),
            });
        }
        // Lowest addresses first: deterministic layouts.
        let free = (0..frames).rev().collect();
        Ok(FramePool {
            memory,
            base: base.as_u64(),
            inner: Mutex::new(Inner {
                free,
                used: vec![false; frames as usize],
                stats: PoolStats {
                    frames,
                    ..PoolStats::default()
                },
            }),
        })
    }

    /// The memory the frames belong to.
    pub fn memory(&self) -> &Arc<SimMemory> {
        &self.memory
    }

    /// Whether `pa` is a frame of this pool.
    pub fn owns(&self, pa: PhysAddr) -> bool {
        self.index(pa).is_some()
    }

    fn index(&self, pa: PhysAddr) -> Option<usize> {
        let a = pa.as_u64();
        let frames = lock(&self.inner).stats.frames;
        (pa.is_page_aligned() && a >= self.base && (a - self.base) / PAGE_SIZE < frames)
            .then(|| ((a - self.base) / PAGE_SIZE) as usize)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        lock(&self.inner).stats
    }
}

// SAFETY: the pool owns a range of simulated memory the core does not manage (checked
// at creation); `alloc_frame` pops a frame off the free list (so it is handed out once
// until freed) and zeroes it, and `free_frame` ignores (and counts) frames that are not
// the pool's or not in use.
#[allow(unsafe_code)]
unsafe impl FrameSource for FramePool {
    fn alloc_frame(&self) -> Option<PhysAddr> {
        let mut g = lock(&self.inner);
        let Some(i) = g.free.pop() else {
            g.stats.exhausted += 1;
            return None;
        };
        g.used[i as usize] = true;
        g.stats.in_use += 1;
        g.stats.peak = g.stats.peak.max(g.stats.in_use);
        drop(g);
        let pa = PhysAddr::new(self.base + i * PAGE_SIZE);
        // The frame lies inside the memory (checked at creation).
        let _ = self.memory.zero(pa, PAGE_SIZE);
        Some(pa)
    }

    fn free_frame(&self, frame: PhysAddr) {
        let i = self.index(frame);
        let mut g = lock(&self.inner);
        match i {
            Some(i) if g.used[i] => {
                g.used[i] = false;
                g.free.push(i as u64);
                g.stats.in_use -= 1;
            }
            _ => g.stats.bad_frees += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_zeroed_lowest_first_and_exhaustion_is_counted() {
        let m = Arc::new(SimMemory::new("h", PhysAddr::new(0), 8 * PAGE_SIZE).unwrap());
        m.write(PhysAddr::new(0x2000), &[7; 16]).unwrap();
        let p = FramePool::new(m.clone(), PhysAddr::new(0x1000), 2).unwrap();
        let a = p.alloc_frame().unwrap();
        let b = p.alloc_frame().unwrap();
        assert_eq!((a, b), (PhysAddr::new(0x1000), PhysAddr::new(0x2000)));
        assert_eq!(m.read_u64(PhysAddr::new(0x2000)).unwrap(), 0);
        assert_eq!(p.alloc_frame(), None);
        p.free_frame(a);
        p.free_frame(a);
        p.free_frame(PhysAddr::new(0x5000));
        let s = p.stats();
        assert_eq!((s.in_use, s.peak, s.exhausted, s.bad_frees), (1, 2, 1, 2));
        assert_eq!(p.alloc_frame(), Some(a));
    }

    #[test]
    fn a_pool_outside_its_memory_is_rejected() {
        let m = Arc::new(SimMemory::new("h", PhysAddr::new(0), 4 * PAGE_SIZE).unwrap());
        assert!(FramePool::new(m.clone(), PhysAddr::new(0x2000), 3).is_err());
        assert!(FramePool::new(m.clone(), PhysAddr::new(0x800), 1).is_err());
        assert!(FramePool::new(m, PhysAddr::new(0), 0).is_err());
    }
}
