//! Quantum caches: one object cache per small size (1 to `qcache_max / quantum`
//! quanta), in front of the segment allocator.
//!
//! Most allocations of an arena are a few quanta. Serving them from a per-size cache
//! of ready-made segments replaces the freelist search, the split, the hash insert and
//! the coalescing with a pop or a push, and removes the arena lock from the common
//! path. A cache imports objects from the arena in batches (one arena lock per batch)
//! and gives them back when it overflows or when the arena is reaped. Each class
//! stores its objects either in per-CPU magazines with a depot
//! ([`super::magazine`]) or, without magazines, in one locked stack.
//!
//! With `check_frees` a class also keeps the set of objects it has handed out, so a
//! free of a cached size is validated (double frees and foreign addresses get a typed
//! error) before it enters the cache. Without it, such frees are trusted.

use alloc::vec::Vec;

use hashbrown::HashSet;

use super::magazine::{rounds_for, CacheCounts, MagazineLayer, Padded};
use crate::sync::Mutex;

/// Objects a stack-mode class imports per miss.
pub(super) const STACK_IMPORT: usize = 16;
/// Objects a stack-mode class holds before flushing the older half to the arena.
pub(super) const STACK_LIMIT: usize = 128;

/// A locked stack of cached objects and its counters.
struct Stack {
    objs: Vec<u64>,
    counts: CacheCounts,
}

/// Where a class keeps its objects.
enum Store {
    Stack(Padded<Mutex<Stack>>),
    Magazines(MagazineLayer),
}

/// The cache of one size.
pub(super) struct SizeClass {
    size: u64,
    store: Store,
    /// Objects handed out, when frees are checked.
    outstanding: Option<Mutex<HashSet<u64>>>,
}

impl SizeClass {
    /// The cache of objects of `size` bytes, `quanta` quanta each.
    fn new(size: u64, quanta: u64, magazines: bool, check_frees: bool, ncpus: usize) -> Self {
        let store = if magazines {
            Store::Magazines(MagazineLayer::new(ncpus, rounds_for(quanta)))
        } else {
            Store::Stack(Padded(Mutex::new(Stack {
                objs: Vec::new(),
                counts: CacheCounts::default(),
            })))
        };
        Self {
            size,
            store,
            outstanding: check_frees.then(|| Mutex::new(HashSet::new())),
        }
    }

    /// The object size in bytes.
    #[inline]
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Objects to import from the arena on a miss.
    pub fn import_count(&self) -> usize {
        match &self.store {
            Store::Stack(_) => STACK_IMPORT,
            Store::Magazines(m) => m.rounds(),
        }
    }

    /// An object from the cache, or `None` on a miss.
    #[inline]
    pub fn alloc(&self, cpu: usize) -> Option<u64> {
        match &self.store {
            Store::Magazines(m) => m.alloc(cpu),
            Store::Stack(s) => {
                let mut s = s.0.lock();
                match s.objs.pop() {
                    Some(a) => {
                        s.counts.hits += 1;
                        s.counts.allocs += 1;
                        Some(a)
                    }
                    None => {
                        s.counts.misses += 1;
                        None
                    }
                }
            }
        }
    }

    /// [`Self::alloc`] through an exclusive borrow: no lock on the common path.
    #[inline]
    pub fn alloc_mut(&mut self, cpu: usize) -> Option<u64> {
        match &mut self.store {
            Store::Magazines(m) => m.alloc_mut(cpu),
            Store::Stack(_) => self.alloc(cpu),
        }
    }

    /// [`Self::free`] through an exclusive borrow: no lock on the common path.
    #[inline]
    pub fn free_mut(&mut self, cpu: usize, addr: u64) -> Option<Vec<u64>> {
        match &mut self.store {
            Store::Magazines(m) => m.free_mut(cpu, addr),
            Store::Stack(_) => self.free(cpu, addr),
        }
    }

    /// Store the rest of an import after a served miss; returns objects for the arena.
    pub fn fill(&self, cpu: usize, objs: Vec<u64>) -> Option<Vec<u64>> {
        match &self.store {
            Store::Magazines(m) => m.fill(cpu, objs),
            Store::Stack(s) => {
                let mut s = s.0.lock();
                s.counts.allocs += 1;
                s.objs.extend(objs);
                Self::overflow(&mut s)
            }
        }
    }

    /// Cache a freed object; returns objects for the arena when the cache overflows.
    #[inline]
    pub fn free(&self, cpu: usize, addr: u64) -> Option<Vec<u64>> {
        match &self.store {
            Store::Magazines(m) => m.free(cpu, addr),
            Store::Stack(s) => {
                let mut s = s.0.lock();
                s.counts.frees += 1;
                s.objs.push(addr);
                Self::overflow(&mut s)
            }
        }
    }

    /// Past the limit, the older (colder) half of the stack goes back to the arena.
    fn overflow(s: &mut Stack) -> Option<Vec<u64>> {
        (s.objs.len() > STACK_LIMIT).then(|| s.objs.drain(..STACK_LIMIT / 2).collect())
    }

    /// Take every cached object into `out`; with `shrink` (the arena ran dry) a
    /// magazine class halves its depot's bound.
    pub fn drain(&self, out: &mut Vec<u64>, shrink: bool) {
        match &self.store {
            Store::Magazines(m) => m.drain(out, shrink),
            Store::Stack(s) => out.append(&mut s.0.lock().objs),
        }
    }

    /// Counters and the number of objects held.
    pub fn counts(&self) -> CacheCounts {
        match &self.store {
            Store::Magazines(m) => m.counts(),
            Store::Stack(s) => {
                let s = s.0.lock();
                CacheCounts {
                    objects: s.objs.len() as u64,
                    ..s.counts
                }
            }
        }
    }

    /// Record that `addr` was handed to a caller (when frees are checked).
    #[inline]
    pub fn track(&self, addr: u64) {
        if let Some(set) = &self.outstanding {
            let fresh = set.lock().insert(addr);
            debug_assert!(fresh, "a cache handed out {addr:#x} twice");
        }
    }

    /// Accept a free of `addr` into the cache: true when frees are trusted or `addr`
    /// was handed out by this class (it is then no longer outstanding).
    #[inline]
    pub fn untrack(&self, addr: u64) -> bool {
        match &self.outstanding {
            Some(set) => set.lock().remove(&addr),
            None => true,
        }
    }
}

/// The quantum caches of an arena, class `i` holding objects of `i + 1` quanta.
pub(super) struct QuantumCaches {
    quantum_shift: u32,
    classes: Vec<SizeClass>,
}

impl QuantumCaches {
    /// Caches for sizes `quantum..=qcache_max` (both validated by the arena).
    pub fn new(
        quantum: u64,
        qcache_max: u64,
        magazines: bool,
        check_frees: bool,
        ncpus: usize,
    ) -> Self {
        let n = qcache_max / quantum;
        Self {
            quantum_shift: quantum.trailing_zeros(),
            classes: (1..=n)
                .map(|k| SizeClass::new(k * quantum, k, magazines, check_frees, ncpus))
                .collect(),
        }
    }

    /// The class serving `size` (a non-zero multiple of the quantum), if cached.
    #[inline]
    pub fn class_of(&self, size: u64) -> Option<&SizeClass> {
        let k = (size >> self.quantum_shift) as usize;
        self.classes.get(k.wrapping_sub(1))
    }

    /// [`Self::class_of`], mutably.
    #[inline]
    pub fn class_of_mut(&mut self, size: u64) -> Option<&mut SizeClass> {
        let k = (size >> self.quantum_shift) as usize;
        self.classes.get_mut(k.wrapping_sub(1))
    }

    /// True when there are no caches.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    /// All classes, smallest first.
    pub fn classes(&self) -> &[SizeClass] {
        &self.classes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_lookup_maps_each_cached_size_and_nothing_else() {
        let c = QuantumCaches::new(0x1000, 0x4000, false, true, 1);
        assert!(c.class_of(0).is_none());
        assert_eq!(c.class_of(0x1000).map(SizeClass::size), Some(0x1000));
        assert_eq!(c.class_of(0x4000).map(SizeClass::size), Some(0x4000));
        assert!(c.class_of(0x5000).is_none());
        assert!(c.class_of(!0xfff).is_none());
        assert!(QuantumCaches::new(0x1000, 0, false, true, 1).is_empty());
    }

    #[test]
    fn a_stack_class_is_lifo_and_flushes_its_older_half_past_the_limit() {
        let c = SizeClass::new(0x1000, 1, false, false, 1);
        assert_eq!(c.alloc(0), None);
        let mut flushed = Vec::new();
        for a in 0..=STACK_LIMIT as u64 {
            if let Some(f) = c.free(0, a) {
                flushed.extend(f);
            }
        }
        assert_eq!(flushed, (0..(STACK_LIMIT / 2) as u64).collect::<Vec<_>>());
        assert_eq!(c.alloc(0), Some(STACK_LIMIT as u64));
        let n = c.counts();
        assert_eq!(
            (n.hits, n.misses, n.objects),
            (1, 1, (STACK_LIMIT / 2) as u64)
        );
    }

    #[test]
    fn tracking_accepts_each_handed_out_object_once() {
        let checked = SizeClass::new(0x1000, 1, true, true, 1);
        checked.track(0x5000);
        assert!(checked.untrack(0x5000));
        assert!(!checked.untrack(0x5000));
        assert!(!checked.untrack(0x6000));
        let trusted = SizeClass::new(0x1000, 1, true, false, 1);
        assert!(trusted.untrack(0x6000));
    }
}
