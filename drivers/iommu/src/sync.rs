//! The sync facade: the atomics, fence and locks of the table code ([`crate::memory`],
//! [`crate::table`]) come from here.
//!
//! In normal builds the atomics are `std`'s and the locks are `gmem_core::sync`'s
//! (`spin` locks), exactly what the table code used before the facade existed. Built
//! with `RUSTFLAGS="--cfg gmem_loom"` the atomics and the fence are `loom`'s, and so are
//! the locks (gmem-core's facade switches on the same cfg), so that the models in
//! `loom-tests/tests/iommu.rs` explore every interleaving of the real map, unmap and
//! reclaim paths. The edit counters of [`crate::table`] are statistics that order
//! nothing and stay `std` atomics in both builds, which keeps them out of the models'
//! state space.

#[cfg(not(gmem_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

#[cfg(gmem_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

pub(crate) use gmem_core::sync::{Mutex, RwLock};
