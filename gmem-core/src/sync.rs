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
//!    taken only with `try_lock` (cross-space eviction), never waited for. A fault
//!    tries its space's lock while it holds its device's binding (the fast entry of
//!    `dev_fault`, see `kpi::device`), and waits for it only after dropping the binding;
//! 2. **one device's binding** (where it is attached and active; `as_attach`,
//!    `dev_switch` and `detach_slot` change it under the space lock);
//! 3. **one device's physical memory** (`PhysMem`: queues, reverse map, frame arena);
//! 4. **leaves** — held only to copy a value in or out, with nothing taken under them:
//!    the device and space registries of `Gmem` (a fault looks a placement target or an
//!    eviction victim's space up while it holds a space lock), a space's range arena and
//!    its quantum caches, a queue's in-flight counter.
//!
//! Each lock carries its [`Rank`]; in debug builds with the `std` feature (every test
//! of the workspace) a thread that waits for a lock out of this order panics, naming
//! both ranks.
//!
//! Calls into drivers (`Mmu`, `DeviceMemory`) happen with the space lock (and, for
//! `activate`, the binding) held; a driver must not call back into the core from them,
//! except through `Gmem::dev_try_fault`, which takes every lock it needs with
//! `try_lock`/`try_read` and answers `FaultError::Busy` instead of waiting.
//!
//! ## Interrupts
//! These are spin locks: a CPU that waits for a lock its own interrupted context holds
//! waits forever. Every KPI call therefore runs inside the embedder's critical section
//! (`Platform::enter_critical` .. `Platform::exit_critical`, where a kernel disables
//! interrupts and preemption on the current CPU, as `spin_lock_irqsave` does), so no
//! interrupt arrives on a CPU while the core holds a lock there. What can still run on
//! a CPU whose context holds a core lock — an exception taken inside a driver callback,
//! or the callback itself calling back — must enter through `dev_try_fault`.
//! Completion callbacks run after every lock is released (the space guard runs them
//! on drop). `dev_destroy` takes the binding, then the physical memory, then each space
//! in turn, never two at once.

#[cfg(not(gmem_loom))]
mod imp {
    use super::Rank;
    pub use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

    /// How a thread waits for a held lock: spinning (a kernel, which holds spin locks
    /// with preemption off), or yielding its CPU with the `std` feature (a user-space
    /// host, where a lock holder can be descheduled).
    #[cfg(not(feature = "std"))]
    type Relax = spin::relax::Spin;
    #[cfg(feature = "std")]
    type Relax = spin::relax::Yield;

    /// A mutual-exclusion spin lock with a [`Rank`] in the lock order.
    pub struct Mutex<T> {
        lock: spin::mutex::Mutex<T, Relax>,
        #[allow(dead_code)]
        rank: Rank,
    }

    /// Guard of a [`Mutex`]: releases it on drop (and, in checked builds, forgets its
    /// rank for this thread).
    pub struct MutexGuard<'a, T> {
        guard: spin::mutex::MutexGuard<'a, T>,
        _held: super::order::Held,
    }

    impl<T> core::ops::Deref for MutexGuard<'_, T> {
        type Target = T;
        #[inline]
        fn deref(&self) -> &T {
            &self.guard
        }
    }

    impl<T> core::ops::DerefMut for MutexGuard<'_, T> {
        #[inline]
        fn deref_mut(&mut self) -> &mut T {
            &mut self.guard
        }
    }

    impl<T> Mutex<T> {
        /// A new unlocked mutex of rank [`Rank::Leaf`].
        pub const fn new(value: T) -> Self {
            Self::ranked(value, Rank::Leaf)
        }
        /// A new unlocked mutex of rank `rank`.
        pub const fn ranked(value: T, rank: Rank) -> Self {
            Self {
                lock: spin::mutex::Mutex::new(value),
                rank,
            }
        }
        /// Lock, waiting until the lock is free. In checked builds (debug + `std`),
        /// panics if the calling thread holds a lock this one may not be taken under.
        #[inline]
        pub fn lock(&self) -> MutexGuard<'_, T> {
            let held = super::order::Held::wait_for(self.rank);
            // The uncontended case inline; the wait out of line, so that the callers'
            // fast paths do not carry the spin loop.
            let guard = match self.lock.try_lock() {
                Some(guard) => guard,
                None => self.lock_contended(),
            };
            MutexGuard { guard, _held: held }
        }
        /// [`Self::lock`]'s wait, when the first attempt found the lock taken.
        #[cold]
        #[inline(never)]
        fn lock_contended(&self) -> spin::mutex::MutexGuard<'_, T> {
            self.lock.lock()
        }
        /// Lock if free (never waits, so it may be taken out of order).
        #[inline]
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            let guard = self.lock.try_lock()?;
            Some(MutexGuard {
                guard,
                _held: super::order::Held::took(self.rank),
            })
        }
        /// The value, through an exclusive borrow of the mutex: no lock is taken (no
        /// other reference to the mutex can exist).
        #[inline]
        pub fn get_mut(&mut self) -> &mut T {
            self.lock.get_mut()
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Self::new(T::default())
        }
    }

    /// The lock of an address space's state, which a thread may take with `try_lock`
    /// while it holds locks ranked below it (a fault under its device's binding,
    /// cross-space eviction). In normal builds it is [`Mutex`]; loom builds model it as
    /// a spin lock on a flag (see there).
    pub type SpinMutex<T> = Mutex<T>;
    /// Guard of a [`SpinMutex`].
    pub type SpinMutexGuard<'a, T> = MutexGuard<'a, T>;

    /// A reader-writer spin lock (a leaf of the lock order).
    pub struct RwLock<T>(spin::rwlock::RwLock<T, Relax>);

    /// Shared guard of an [`RwLock`].
    pub struct RwLockReadGuard<'a, T> {
        guard: spin::rwlock::RwLockReadGuard<'a, T>,
        _held: super::order::Held,
    }

    /// Exclusive guard of an [`RwLock`].
    pub struct RwLockWriteGuard<'a, T> {
        guard: spin::rwlock::RwLockWriteGuard<'a, T, Relax>,
        _held: super::order::Held,
    }

    impl<T> core::ops::Deref for RwLockReadGuard<'_, T> {
        type Target = T;
        #[inline]
        fn deref(&self) -> &T {
            &self.guard
        }
    }

    impl<T> core::ops::Deref for RwLockWriteGuard<'_, T> {
        type Target = T;
        #[inline]
        fn deref(&self) -> &T {
            &self.guard
        }
    }

    impl<T> core::ops::DerefMut for RwLockWriteGuard<'_, T> {
        #[inline]
        fn deref_mut(&mut self) -> &mut T {
            &mut self.guard
        }
    }

    impl<T> RwLock<T> {
        /// A new unlocked reader-writer lock.
        pub const fn new(value: T) -> Self {
            Self(spin::rwlock::RwLock::new(value))
        }
        /// Shared lock.
        #[inline]
        pub fn read(&self) -> RwLockReadGuard<'_, T> {
            let held = super::order::Held::wait_for(Rank::Leaf);
            RwLockReadGuard {
                guard: self.0.read(),
                _held: held,
            }
        }
        /// Exclusive lock.
        #[inline]
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
            let held = super::order::Held::wait_for(Rank::Leaf);
            RwLockWriteGuard {
                guard: self.0.write(),
                _held: held,
            }
        }
        /// Shared lock if no writer holds it (never waits, so it may be taken out of
        /// order).
        #[inline]
        pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
            let guard = self.0.try_read()?;
            Some(RwLockReadGuard {
                guard,
                _held: super::order::Held::took(Rank::Leaf),
            })
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
        /// A new unlocked mutex (loom explores orders itself; the rank is unused).
        pub fn ranked(value: T, _rank: super::Rank) -> Self {
            Self::new(value)
        }
        /// Lock. (Poisoning is ignored, as a real build's spin lock has none: a model
        /// that caught a failure inside a call goes on to report it.)
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
        /// Lock if free.
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(g) => Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }
        /// The value, through an exclusive borrow of the mutex.
        pub fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().expect("loom mutex poisoned")
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Self::new(T::default())
        }
    }

    /// The lock of an address space's state, modelled as the spin lock it is in a
    /// real build: a flag taken by compare-and-swap (waiting threads yield to loom's
    /// scheduler), and the value behind a loom mutex that only the flag's holder ever
    /// takes. Loom's own `try_lock` may be scheduled as a blocking acquisition (a
    /// thread about to try a mutex that another then takes is marked blocked), which
    /// reports a false deadlock when the trying thread holds a lock the owner then
    /// waits for: exactly what a fault does, trying the space under its binding.
    ///
    /// It also names its holder (outside loom's view: loom runs every model thread on
    /// one OS thread, so a plain mutex never waits), so that a thread that waits for a
    /// lock it already holds — a re-entry that would spin forever in a real build —
    /// fails at once with a message instead of exhausting loom's branch bound.
    pub struct SpinMutex<T> {
        held: AtomicBool,
        value: loom::sync::Mutex<T>,
        holder: std::sync::Mutex<Option<loom::thread::ThreadId>>,
    }

    /// Guard of a [`SpinMutex`]: releases the value, then the flag.
    pub struct SpinMutexGuard<'a, T> {
        guard: Option<loom::sync::MutexGuard<'a, T>>,
        held: &'a AtomicBool,
        holder: &'a std::sync::Mutex<Option<loom::thread::ThreadId>>,
    }

    impl<T> SpinMutex<T> {
        /// A new unlocked lock (loom explores orders itself; the rank is unused).
        pub fn ranked(value: T, _rank: super::Rank) -> Self {
            Self {
                held: AtomicBool::new(false),
                value: loom::sync::Mutex::new(value),
                holder: std::sync::Mutex::new(None),
            }
        }
        /// Lock, yielding until the flag is free.
        pub fn lock(&self) -> SpinMutexGuard<'_, T> {
            let me = loom::thread::current().id();
            let holder = *self.holder.lock().unwrap_or_else(|e| e.into_inner());
            assert!(
                holder != Some(me),
                "a thread waits for a lock it holds (a re-entry that never returns)"
            );
            loop {
                if let Some(g) = self.try_lock() {
                    return g;
                }
                loom::thread::yield_now();
            }
        }
        /// Lock if the flag is free.
        pub fn try_lock(&self) -> Option<SpinMutexGuard<'_, T>> {
            self.held
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .ok()?;
            // Only the flag's holder takes the value's mutex: it is always free here
            // (poisoned only by a model that already failed, while unwinding).
            let guard = self.value.lock().unwrap_or_else(|e| e.into_inner());
            *self.holder.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(loom::thread::current().id());
            Some(SpinMutexGuard {
                guard: Some(guard),
                held: &self.held,
                holder: &self.holder,
            })
        }
    }

    impl<T> core::ops::Deref for SpinMutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.guard.as_ref().expect("held until drop")
        }
    }

    impl<T> core::ops::DerefMut for SpinMutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.guard.as_mut().expect("held until drop")
        }
    }

    impl<T> Drop for SpinMutexGuard<'_, T> {
        fn drop(&mut self) {
            *self.holder.lock().unwrap_or_else(|e| e.into_inner()) = None;
            drop(self.guard.take());
            self.held.store(false, Ordering::Release);
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
            self.0.read().unwrap_or_else(|e| e.into_inner())
        }
        /// Exclusive lock.
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(|e| e.into_inner())
        }
        /// Shared lock if no writer holds it.
        pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
            self.0.try_read().ok()
        }
    }
}

pub use alloc::sync::Arc;
pub use imp::*;

/// A lock's place in the lock order written above, outermost first. A thread may wait
/// for a lock only if every lock it holds has a lower rank, except that leaves may nest
/// (an arena's internal locks, a test MMU's); `try_lock` never waits and is exempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rank {
    /// One address space's state.
    SpaceState = 1,
    /// One device's binding.
    Binding = 2,
    /// One device's physical memory.
    PhysMem = 3,
    /// Anything held only to copy a value in or out.
    Leaf = 4,
}

/// The debug-build lock-order checker: with `std` (a thread-local list of the ranks a
/// thread holds) and debug assertions, waiting for a lock out of order panics with
/// both ranks; otherwise a zero-sized no-op.
#[cfg(not(gmem_loom))]
mod order {
    use super::Rank;

    /// A rank this thread holds, forgotten when dropped (with the guard that holds it).
    pub struct Held {
        #[cfg(all(feature = "std", debug_assertions))]
        rank: Rank,
    }

    #[cfg(all(feature = "std", debug_assertions))]
    std::thread_local! {
        static HELD: core::cell::RefCell<alloc::vec::Vec<Rank>> =
            const { core::cell::RefCell::new(alloc::vec::Vec::new()) };
    }

    impl Held {
        /// About to wait for a lock of `rank`: check the order, then record it.
        #[inline]
        pub fn wait_for(rank: Rank) -> Held {
            #[cfg(all(feature = "std", debug_assertions))]
            HELD.with(|h| {
                if let Some(&top) = h.borrow().iter().max() {
                    assert!(
                        rank > top || (rank == Rank::Leaf && top == Rank::Leaf),
                        "lock order violated: waiting for a {rank:?} lock while holding a \
                         {top:?} lock (gmem_core::sync lists the order)"
                    );
                }
            });
            Held::took(rank)
        }

        /// A lock of `rank` was taken without waiting: record it.
        #[inline]
        pub fn took(rank: Rank) -> Held {
            #[cfg(all(feature = "std", debug_assertions))]
            {
                HELD.with(|h| h.borrow_mut().push(rank));
                Held { rank }
            }
            #[cfg(not(all(feature = "std", debug_assertions)))]
            {
                let _ = rank;
                Held {}
            }
        }
    }

    #[cfg(all(feature = "std", debug_assertions))]
    impl Drop for Held {
        fn drop(&mut self) {
            let _ = HELD.try_with(|h| {
                let mut h = h.borrow_mut();
                if let Some(i) = h.iter().rposition(|r| *r == self.rank) {
                    h.remove(i);
                }
            });
        }
    }
}

/// Tell the scheduler (real or loom's) that this thread is waiting for another.
#[inline]
pub fn spin_wait() {
    #[cfg(not(gmem_loom))]
    core::hint::spin_loop();
    #[cfg(gmem_loom)]
    loom::thread::yield_now();
}

#[cfg(all(test, feature = "std", debug_assertions, not(gmem_loom)))]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_rank_order_pass() {
        let space = Mutex::ranked(0u8, Rank::SpaceState);
        let binding = Mutex::ranked(0u8, Rank::Binding);
        let phys = Mutex::ranked(0u8, Rank::PhysMem);
        let leaf = Mutex::new(0u8);
        let other_leaf = Mutex::new(0u8);
        let _s = space.lock();
        let _b = binding.lock();
        let _p = phys.lock();
        let _l = leaf.lock();
        let _m = other_leaf.lock();
    }

    #[test]
    #[should_panic(expected = "lock order violated")]
    fn waiting_for_a_space_while_holding_physical_memory_panics() {
        let phys = Mutex::ranked(0u8, Rank::PhysMem);
        let space = Mutex::ranked(0u8, Rank::SpaceState);
        let _p = phys.lock();
        let _s = space.lock();
    }

    #[test]
    fn try_lock_never_waits_so_it_may_go_out_of_order() {
        let a = Mutex::ranked(0u8, Rank::SpaceState);
        let b = Mutex::ranked(0u8, Rank::SpaceState);
        let _a = a.lock();
        assert!(b.try_lock().is_some());
        // Released guards are forgotten: the order starts afresh.
        drop(_a);
        let phys = Mutex::ranked(0u8, Rank::PhysMem);
        drop(phys.lock());
        let _again = a.lock();
    }
}
