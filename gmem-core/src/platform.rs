//! The platform trait: the few hooks the embedding kernel gives the core.
//!
//! The core never asks the OS for anything except through [`Platform`]: which CPU is
//! running (to pick a per-CPU magazine in the vmem arenas), how many CPUs there are,
//! and a critical section around every KPI call (interrupts and preemption off, so
//! that no interrupt handler on a CPU waits for a spin lock its own interrupted
//! context holds).
//! Memory for page-table pages is the drivers' business (an [`crate::Mmu`] gets it from
//! wherever its hardware wants it); the core never allocates a page-table page.
//! [`FrameSource`] is the vocabulary a kernel and its drivers share for handing such
//! frames over (the Sv39, x86-64 and simulated drivers take one): it lives here so that
//! every driver crate names the same trait, not because the core calls it.

use crate::addr::PhysAddr;

/// Hooks the embedding kernel implements once.
pub trait Platform: Send + Sync {
    /// The index of the CPU running the caller, in `0..cpu_count()`.
    fn current_cpu(&self) -> usize;
    /// The number of CPUs; per-CPU structures are sized by it.
    fn cpu_count(&self) -> usize;
    /// Enter a critical section on the current CPU, before the core takes any lock:
    /// every KPI call of [`crate::Gmem`] runs between this and
    /// [`Platform::exit_critical`]. A kernel disables interrupts (and preemption) here
    /// and returns what it must restore — the saved interrupt flag — as
    /// `spin_lock_irqsave` does; then no interrupt handler can run on a CPU while the
    /// core holds one of its spin locks there, so none can wait for it forever. Calls
    /// nest (a completion callback runs inside its caller's section and may call the
    /// KPI again): each exit restores what its own enter saved.
    ///
    /// The default does nothing, for hosts without interrupts (simulators, tests) and
    /// kernels that never call the core from an interrupt handler.
    #[inline]
    fn enter_critical(&self) -> usize {
        0
    }
    /// Leave the critical section [`Platform::enter_critical`] entered, restoring the
    /// state it returned (`saved`).
    #[inline]
    fn exit_critical(&self, saved: usize) {
        let _ = saved;
    }
    /// A monotonic clock in nanoseconds, if the platform has one (a kernel's TSC or
    /// `mtime`, a simulator's simulated time). The policies that measure time use it:
    /// thrashing detection's lapse, nap and pin time
    /// ([`crate::Gmem::as_set_thrashing`]). Without one (the default) they count
    /// events instead (see there). It must never go back.
    #[inline]
    fn now_ns(&self) -> Option<u64> {
        None
    }
}

/// A source of 4 KiB frames for page-table pages, as a kernel hands them to its MMU
/// drivers.
///
/// # Safety
/// A driver writes page-table entries into the frames it gets and lets hardware walk
/// them, so its soundness rests on this contract, which an implementor guarantees:
/// - a frame returned by [`FrameSource::alloc_frame`] is 4 KiB aligned, zeroed, backed
///   by real memory, and used by nothing else (no other owner, no other mapping that
///   writes it) until it is given back with [`FrameSource::free_frame`];
/// - no frame is handed out twice without a `free_frame` in between;
/// - `free_frame` is only ever given frames this source handed out.
#[allow(unsafe_code)]
pub unsafe trait FrameSource: Send + Sync {
    /// A zeroed 4 KiB frame, or `None` when memory is exhausted.
    fn alloc_frame(&self) -> Option<PhysAddr>;
    /// Give back a frame obtained from [`FrameSource::alloc_frame`].
    fn free_frame(&self, frame: PhysAddr);
}

/// A uniprocessor platform: always CPU 0 of 1. Good for single-threaded kernels and
/// tests.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleCpu;

impl Platform for SingleCpu {
    fn current_cpu(&self) -> usize {
        0
    }
    fn cpu_count(&self) -> usize {
        1
    }
}
