//! The sync facade: every lock and atomic the core uses comes from here.
//!
//! In normal builds the locks are `spin`'s (the core runs in kernels without an OS
//! scheduler underneath) and the atomics are `core`'s. Built with
//! `RUSTFLAGS="--cfg gmem_loom"`, the same names resolve to `loom`'s types so that the
//! models in `loom-tests/` explore every interleaving of the real code. The cfg is
//! crate-specific (declared in the workspace's `check-cfg`) so that a dependant who uses
//! loom for its own code does not switch the core into loom mode by accident.
//!
//! ## Lock order (the one place it is written down)
//! Outermost first; a thread holding a lock may take only locks below it:
//! 1. **one address space's state** (`SpaceInner::lock`). A second space's state is
//!    taken only with `try_lock` (cross-space eviction), never waited for;
//! 2. **one device's binding** (where it is attached and active; `as_attach`,
//!    `dev_switch` and `detach_slot` change it under the space lock);
//! 3. **one device's physical memory** (`PhysMem`: queues, reverse map, frame arena);
//! 4. **leaves** — held only to copy a value in or out, with nothing taken under them:
//!    the device and space registries of `Gmem` (a fault looks a placement target or an
//!    eviction victim's space up while it holds a space lock), a space's range arena and
//!    its quantum caches, a queue's in-flight counter.
//!
//! Calls into drivers (`Mmu`, `DeviceMemory`) happen with the space lock (and, for
//! `activate`, the binding) held; a driver must not call back into the core from them.
//! Completion callbacks run after every lock is released (the space guard runs them
//! on drop). `dev_destroy` takes the binding, then the physical memory, then each space
//! in turn, never two at once.

#[cfg(not(gmem_loom))]
mod imp {
    pub use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

    /// How a thread waits for a held lock: spinning (a kernel, which holds spin locks
    /// with preemption off), or yielding its CPU with the `std` feature (a user-space
    /// host, where a lock holder can be descheduled).
    #[cfg(not(feature = "std"))]
    type Relax = spin::relax::Spin;
    #[cfg(feature = "std")]
    type Relax = spin::relax::Yield;

    /// A mutual-exclusion spin lock.
    pub struct Mutex<T>(spin::mutex::Mutex<T, Relax>);
    /// Guard of a [`Mutex`].
    pub type MutexGuard<'a, T> = spin::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// A new unlocked mutex.
        pub const fn new(value: T) -> Self {
            Self(spin::mutex::Mutex::new(value))
        }
        /// Lock, spinning until the lock is free.
        #[inline]
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
        /// Lock if free.
        #[inline]
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock()
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Self::new(T::default())
        }
    }

    /// A reader-writer spin lock.
    pub struct RwLock<T>(spin::rwlock::RwLock<T, Relax>);
    /// Shared guard of an [`RwLock`].
    pub type RwLockReadGuard<'a, T> = spin::RwLockReadGuard<'a, T>;
    /// Exclusive guard of an [`RwLock`].
    pub type RwLockWriteGuard<'a, T> = spin::rwlock::RwLockWriteGuard<'a, T, Relax>;

    impl<T> RwLock<T> {
        /// A new unlocked reader-writer lock.
        pub const fn new(value: T) -> Self {
            Self(spin::rwlock::RwLock::new(value))
        }
        /// Shared lock.
        #[inline]
        pub fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read()
        }
        /// Exclusive lock.
        #[inline]
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write()
        }
    }
}

#[cfg(gmem_loom)]
mod imp {
    pub use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

    /// A mutual-exclusion lock (loom model).
    pub struct Mutex<T>(loom::sync::Mutex<T>);
    /// Guard of a [`Mutex`].
    pub type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// A new unlocked mutex.
        pub fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }
        /// Lock.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().expect("loom mutex poisoned")
        }
        /// Lock if free.
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Self::new(T::default())
        }
    }

    /// A reader-writer lock (loom model).
    pub struct RwLock<T>(loom::sync::RwLock<T>);
    /// Shared guard of an [`RwLock`].
    pub type RwLockReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
    /// Exclusive guard of an [`RwLock`].
    pub type RwLockWriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

    impl<T> RwLock<T> {
        /// A new unlocked reader-writer lock.
        pub fn new(value: T) -> Self {
            Self(loom::sync::RwLock::new(value))
        }
        /// Shared lock.
        pub fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().expect("loom rwlock poisoned")
        }
        /// Exclusive lock.
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().expect("loom rwlock poisoned")
        }
    }
}

pub use alloc::sync::Arc;
pub use imp::*;

/// Tell the scheduler (real or loom's) that this thread is waiting for another.
#[inline]
pub fn spin_wait() {
    #[cfg(not(gmem_loom))]
    core::hint::spin_loop();
    #[cfg(gmem_loom)]
    loom::thread::yield_now();
}
