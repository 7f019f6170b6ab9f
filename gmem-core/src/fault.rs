//! The fault path: `dev_fault(dev, va, access)` and what it may set in motion —
//! allocation, bulk zero-fill, migration, remote mapping, eviction to host memory.
//!
//! ## Theory
//! A device whose MMU found no valid translation reports the faulting address and the
//! access. The core, holding the lock of the space the device is active in:
//! 1. finds the region holding the address (or answers `NotAllocated`) and checks the
//!    access against the region's protection (`ProtectionViolation`);
//! 2. reads the page's logical entry. A pending asynchronous request on the page drains
//!    the queue first, so a fault never races an invalidation;
//! 3. decides by the region's placement policy:
//!    - **no frame yet**: allocate in the target memory (the faulter's local memory by
//!      default, host memory if it has none, or a named device), zero-fill and map. The
//!      region's *zero-fill block* (by default the faulter's largest page size,
//!      at most 2 MiB) makes one fault allocate a naturally aligned block at once, zero
//!      it with one call and map it with one run: bulk zeroing;
//!    - **unique**: the page must be mapped by one page table at a time. Tear down every
//!      other mapping (unmap + TLB invalidation on every device using those tables),
//!      migrate the bytes to the target memory if they live elsewhere, map for the
//!      faulter;
//!    - **remote access**: map the frame where it lives. If the faulter already maps the
//!      page remotely, the repeated fault is the hint that the locality is false:
//!      migrate it as under unique;
//!    - **wired** pages never move: they are mapped where they are;
//! 4. if the target memory is full, evicts its oldest pages (inactive queue first) to
//!    host memory — host memory is every device memory's swap space — and retries. Pages
//!    of other spaces are evicted only if their space's lock can be taken without waiting;
//! 5. returns a [`FaultResolution`]: the driver retries the access.
//!
//! Every step before the first change is a check, so an error leaves the logical state
//! as it was (evictions done on the way are logically invisible: the bytes moved, the
//! pages are still there).

//!
//! This module holds the answer a driver gets ([`FaultResolution`]); the path itself is
//! `space::fault`, a part of the address space's state, whose fields it works on.

/// What a fault did. In every case the driver retries the faulting access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Fresh memory was allocated and zero-filled (`pages` of it: bulk zeroing).
    ZeroFill,
    /// The page was migrated to the placement target.
    Migrated,
    /// A frame outside the faulter's own memory (its local memory, or host memory for
    /// a device without one) was mapped where it lives: remote access, whether the
    /// policy asked for it or the page already sits at a placement target elsewhere.
    Remote,
    /// A frame already at its place was mapped for the faulter.
    MappedExisting,
    /// The faulter's table already mapped the page (stale TLB entry, invalidated).
    Spurious,
    /// A read-only copy of a read-mostly page was made in the faulter's own memory
    /// and mapped read-only (read duplication, [`crate::policy::advice::AdviceOp::SetReadMostly`]).
    Duplicated,
}

/// The answer to a successful fault: retry the access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "the driver must retry the faulting access"]
pub struct FaultResolution {
    /// What the core did.
    pub kind: FaultKind,
    /// Pages prepared or moved.
    pub pages: u64,
}
