//! The bench's global allocator: large blocks 2 MiB aligned and, with
//! `GMEM_BENCH_THP=1`, advised `MADV_HUGEPAGE`, for every allocator the bench drives.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

/// Advise large allocations huge (`GMEM_BENCH_THP=1`); see [`BenchAlloc`].
static HUGE: AtomicBool = AtomicBool::new(false);
/// Allocations from this size up are 2 MiB aligned (and advised huge with [`HUGE`]).
const HUGE_MIN: usize = 2 << 20;

/// The bench's global allocator: the system's, except that every allocation of
/// [`HUGE_MIN`] bytes or more is 2 MiB aligned and, when [`HUGE`] is set, advised
/// `MADV_HUGEPAGE` (this machine's transparent huge pages are `madvise`-only).
///
/// At a million live ranges the allocators' tables (our hash and segment slab, 49
/// MiB; offset-allocator's node arrays) are tens of MiB of 4 KiB pages, so every
/// random access is also a TLB miss; a kernel's allocator keeps such tables in the
/// huge-page direct map. The option applies to every allocator the bench drives
/// alike and is off by default (the tables and the README's history are without it);
/// it tells how much of the growth from 1k to 1M live ranges is the TLB.
struct BenchAlloc;

impl BenchAlloc {
    /// The layout a block of layout `l` really has: 2 MiB aligned when large.
    fn real(l: Layout) -> Layout {
        if l.size() >= HUGE_MIN {
            Layout::from_size_align(l.size(), l.align().max(HUGE_MIN)).unwrap_or(l)
        } else {
            l
        }
    }
}

// SAFETY: every block comes from `System` with `real(l)` and goes back to it with
// `real(l)` (a pure function of the layout, which the caller passes unchanged to
// `dealloc`), so `System`'s contract carries over; `real(l)` only raises the
// alignment, which still satisfies the caller's. `madvise` only advises on the
// fresh block, which this allocation owns.
unsafe impl GlobalAlloc for BenchAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let r = Self::real(l);
        // SAFETY: `r` has the caller's non-zero size.
        let p = unsafe { System.alloc(r) };
        if !p.is_null() && r.size() >= HUGE_MIN && HUGE.load(Ordering::Relaxed) {
            // SAFETY: `[p, p + size)` is the fresh block; advice changes no data.
            unsafe { libc::madvise(p.cast(), r.size(), libc::MADV_HUGEPAGE) };
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `alloc` with `real(l)`.
        unsafe { System.dealloc(p, Self::real(l)) }
    }
}

#[global_allocator]
static GLOBAL: BenchAlloc = BenchAlloc;

/// True when the run advises large allocations huge.
pub(super) fn huge_pages() -> bool {
    HUGE.load(Ordering::Relaxed)
}

/// Turn the huge-page advice on or off (before the first large allocation).
pub(super) fn set(on: bool) {
    HUGE.store(on, Ordering::Relaxed);
}
