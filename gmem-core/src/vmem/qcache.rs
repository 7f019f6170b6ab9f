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

use super::magazine::{rounds_for, CacheCounts, CpuCache, MagazineLayer, Padded};
use crate::sync::{AtomicUsize, Mutex, Ordering};

/// Objects a stack-mode class imports per miss.
pub(super) const STACK_IMPORT: usize = 16;
/// Objects a stack-mode class holds before flushing the older half to the arena.
pub(super) const STACK_LIMIT: usize = 128;

/// A locked stack of cached objects and its counters.
struct Stack {
    objs: Vec<u64>,
    counts: CacheCounts,
}

/// The quantum caches of an arena, class `k` holding objects of `k + 1` quanta.
///
/// Layout: what a cache hit needs is reached from this struct's own fields without
/// loading anything per class first. With magazines, every class's per-CPU cache
/// records sit in one CPU-major array (`cpus[cpu * classes + k]`, each record on its
/// own cache lines), so a hit locks the record found from a base pointer all classes
/// share; the depots (`layers`), touched only when both of a CPU's magazines are
/// empty or full, and the outstanding sets of `check_frees` are separate arrays. With
/// a descriptor per class holding its own per-CPU pointer (the previous layout), a
/// hit first waited for that descriptor's line and then for the record's: on the
/// `iova_churn` fragmenting trace, whose 128 classes each see about one operation in
/// a hundred, both were usually cold.
pub(super) struct QuantumCaches {
    quantum_shift: u32,
    /// `quantum - 1`.
    quantum_mask: u64,
    /// Number of classes.
    classes: usize,
    /// Classes the free hit path ([`Self::hit_class_free`]) serves: all of them with per-CPU
    /// magazines and trusted frees, none otherwise.
    hit_classes: usize,
    /// Classes the alloc hit path ([`Self::hit_class_alloc`]) serves: `hit_classes`,
    /// or none while the arena injects failures or allocates next fit (whose
    /// allocations bypass the caches). One load and one compare on every alloc hit
    /// replace a test of each (see [`Self::set_alloc_hits`]).
    alloc_hit_classes: AtomicUsize,
    /// Per-CPU magazines of every class, CPU-major (empty without magazines).
    cpus: Vec<Padded<Mutex<CpuCache>>>,
    /// Each class's depot (empty without magazines).
    layers: Vec<MagazineLayer>,
    /// Each class's locked stack (empty with magazines).
    stacks: Vec<Padded<Mutex<Stack>>>,
    /// Each class's set of objects handed out (empty unless frees are checked).
    outstanding: Vec<Mutex<HashSet<u64>>>,
}

/// One class of [`QuantumCaches`]: a reference and an index, found without a load.
#[derive(Clone, Copy)]
pub(super) struct Class<'a> {
    caches: &'a QuantumCaches,
    k: usize,
}

/// One class of [`QuantumCaches`] through an exclusive borrow (no lock on a hit).
pub(super) struct ClassMut<'a> {
    caches: &'a mut QuantumCaches,
    k: usize,
}

impl QuantumCaches {
    /// Caches for sizes `quantum..=qcache_max` (both validated by the arena), with
    /// per-CPU magazines for `ncpus` CPUs or one locked stack per class.
    pub fn new(
        quantum: u64,
        qcache_max: u64,
        magazines: bool,
        check_frees: bool,
        ncpus: usize,
    ) -> Self {
        let n = (qcache_max / quantum) as usize;
        let ncpus = ncpus.max(1);
        let (cpus, layers, stacks) = if magazines {
            let layers: Vec<MagazineLayer> = (1..=n as u64)
                .map(|k| MagazineLayer::new(rounds_for(k)))
                .collect();
            let cpus = (0..ncpus)
                .flat_map(|_| layers.iter().map(|l| l.rounds()))
                .map(|r| Padded(Mutex::new(CpuCache::new(r))))
                .collect();
            (cpus, layers, Vec::new())
        } else {
            let stacks = (0..n)
                .map(|_| {
                    Padded(Mutex::new(Stack {
                        objs: Vec::new(),
                        counts: CacheCounts::default(),
                    }))
                })
                .collect();
            (Vec::new(), Vec::new(), stacks)
        };
        let outstanding = if check_frees {
            (0..n).map(|_| Mutex::new(HashSet::new())).collect()
        } else {
            Vec::new()
        };
        Self {
            quantum_shift: quantum.trailing_zeros(),
            quantum_mask: quantum - 1,
            classes: n,
            hit_classes: if magazines && !check_frees { n } else { 0 },
            alloc_hit_classes: AtomicUsize::new(if magazines && !check_frees { n } else { 0 }),
            cpus,
            layers,
            stacks,
            outstanding,
        }
    }

    /// The class serving `size` (a non-zero multiple of the quantum), if cached.
    #[inline(always)]
    pub fn class_of(&self, size: u64) -> Option<Class<'_>> {
        let k = ((size >> self.quantum_shift) as usize).wrapping_sub(1);
        (k < self.classes).then_some(Class { caches: self, k })
    }

    /// [`Self::class_of`], mutably.
    #[inline(always)]
    pub fn class_of_mut(&mut self, size: u64) -> Option<ClassMut<'_>> {
        let k = ((size >> self.quantum_shift) as usize).wrapping_sub(1);
        (k < self.classes).then_some(ClassMut { caches: self, k })
    }

    /// The class of `size` for the alloc hit path: `Some(k)` when `size` is a
    /// non-zero multiple of the quantum whose class keeps per-CPU magazines, frees are
    /// trusted (with `check_frees` every operation takes the full path) and the alloc
    /// hit path is on (see [`Self::set_alloc_hits`]). One shift, one load, one mask
    /// and one compare; the arena tries [`Self::hit_alloc`] with it before anything
    /// else.
    #[inline(always)]
    pub fn hit_class_alloc(&self, size: u64) -> Option<usize> {
        let k = ((size >> self.quantum_shift) as usize).wrapping_sub(1);
        let classes = self.alloc_hit_classes.load(Ordering::Relaxed);
        (k < classes && size & self.quantum_mask == 0).then_some(k)
    }

    /// Turn the alloc hit path on (every magazine class, frees trusted) or off
    /// (no class: every allocation takes the full path). The arena turns it off while
    /// it injects failures (every attempt must be counted) and for good when its
    /// policy is next fit. Frees are not affected.
    pub fn set_alloc_hits(&self, on: bool) {
        let classes = if on { self.hit_classes } else { 0 };
        self.alloc_hit_classes.store(classes, Ordering::SeqCst);
    }

    /// The class of a free of `[addr, addr + size)` for the free hit path: `size` a
    /// non-zero multiple of the quantum whose class keeps per-CPU magazines with
    /// trusted frees, and `addr` a multiple of the quantum as well (one mask tests
    /// both). The arena tries [`Self::hit_free`] with it before anything else.
    #[inline(always)]
    pub fn hit_class_free(&self, addr: u64, size: u64) -> Option<usize> {
        let k = ((size >> self.quantum_shift) as usize).wrapping_sub(1);
        (k < self.hit_classes && (addr | size) & self.quantum_mask == 0).then_some(k)
    }

    /// The index of CPU `cpu`'s record of class `k` in `cpus` (possibly out of
    /// range for a stray CPU id). CPU 0 needs no multiply, and a one-CPU arena, whose
    /// `cpu` is the constant 0 after inlining, none at all.
    #[inline(always)]
    fn record(&self, cpu: usize, k: usize) -> usize {
        if cpu == 0 {
            k
        } else {
            cpu.wrapping_mul(self.classes).wrapping_add(k)
        }
    }

    /// Pop a round from CPU `cpu`'s record of class `k` (from
    /// [`Self::hit_class_alloc`]) under the record's lock, if that lock is free.
    /// `None`, with nothing changed or counted, when both of its magazines are empty,
    /// its lock is held or `cpu` is out of range: the caller then takes the full path
    /// ([`Class::alloc`]), which waits for the lock, trades with the depot or counts
    /// the miss.
    #[inline(always)]
    pub fn hit_alloc(&self, cpu: usize, k: usize) -> Option<u64> {
        let rec = &self.cpus.get(self.record(cpu, k))?.0;
        #[cfg(gmem_loom_bug = "magazine_hit_split")]
        {
            // Deliberately broken (loom model `magazine_hits` must catch it): the
            // round is read under one critical section and taken under another, so
            // two threads on one record can both hand out the same round.
            let top = rec.try_lock()?.peek()?;
            let taken = rec.try_lock()?.hit_pop();
            return taken.map(|_| top);
        }
        #[cfg(not(gmem_loom_bug = "magazine_hit_split"))]
        rec.try_lock()?.hit_pop()
    }

    /// Push `addr` onto CPU `cpu`'s record of class `k` (from [`Self::hit_class_free`])
    /// under the record's lock, if that lock is free. False, with nothing changed or
    /// counted, when both of its magazines are full, its lock is held or `cpu` is out
    /// of range: the caller then takes the full path ([`Class::free`]).
    #[inline(always)]
    pub fn hit_free(&self, cpu: usize, k: usize, addr: u64) -> bool {
        match self.cpus.get(self.record(cpu, k)) {
            Some(c) => match c.0.try_lock() {
                Some(mut g) => g.hit_push(addr),
                None => false,
            },
            None => false,
        }
    }

    /// [`Self::hit_alloc`] through an exclusive borrow: no lock.
    #[inline(always)]
    pub fn hit_alloc_mut(&mut self, cpu: usize, k: usize) -> Option<u64> {
        let i = self.record(cpu, k);
        self.cpus.get_mut(i)?.0.get_mut().hit_pop()
    }

    /// [`Self::hit_free`] through an exclusive borrow: no lock.
    #[inline(always)]
    pub fn hit_free_mut(&mut self, cpu: usize, k: usize, addr: u64) -> bool {
        let i = self.record(cpu, k);
        match self.cpus.get_mut(i) {
            Some(c) => c.0.get_mut().hit_push(addr),
            None => false,
        }
    }

    /// True when there are no caches.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.classes == 0
    }

    /// All classes, smallest first.
    pub fn classes(&self) -> impl Iterator<Item = Class<'_>> {
        (0..self.classes).map(move |k| Class { caches: self, k })
    }

    /// CPU `cpu`'s record of class `k` (a magazine class). The arena passes `cpu <
    /// ncpus`; an out-of-range id shares CPU 0's magazines (correct, only slower)
    /// instead of paying a division on every operation.
    #[inline(always)]
    fn cpu_cache(&self, cpu: usize, k: usize) -> &Mutex<CpuCache> {
        let i = cpu.wrapping_mul(self.classes).wrapping_add(k);
        match self.cpus.get(i) {
            Some(c) => &c.0,
            None => &self.cpus[k].0,
        }
    }

    /// [`Self::cpu_cache`]'s index, for an exclusive borrow.
    #[inline(always)]
    fn slot(&self, cpu: usize, k: usize) -> usize {
        let i = cpu.wrapping_mul(self.classes).wrapping_add(k);
        if i < self.cpus.len() {
            i
        } else {
            k
        }
    }

    /// The class's CPU records in ascending CPU order.
    fn cpus_of(&self, k: usize) -> impl Iterator<Item = &Mutex<CpuCache>> {
        self.cpus
            .iter()
            .skip(k)
            .step_by(self.classes.max(1))
            .map(|c| &c.0)
    }
}

impl Class<'_> {
    /// The object size in bytes.
    #[inline(always)]
    pub fn size(&self) -> u64 {
        ((self.k + 1) as u64) << self.caches.quantum_shift
    }

    /// Objects to import from the arena on a miss.
    pub fn import_count(&self) -> usize {
        match self.caches.layers.get(self.k) {
            Some(l) => l.rounds(),
            None => STACK_IMPORT,
        }
    }

    /// An object from the cache, or `None` on a miss.
    #[inline(always)]
    pub fn alloc(&self, cpu: usize) -> Option<u64> {
        let c = self.caches;
        if let Some(layer) = c.layers.get(self.k) {
            return layer.alloc(c.cpu_cache(cpu, self.k));
        }
        let mut s = c.stacks.get(self.k)?.0.lock();
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

    /// [`Self::alloc`] out of line (the exclusive path's stack-mode fallback).
    #[inline(never)]
    fn alloc_cold(&self, cpu: usize) -> Option<u64> {
        self.alloc(cpu)
    }

    /// [`Self::free`] out of line (the exclusive path's stack-mode fallback).
    #[inline(never)]
    fn free_cold(&self, cpu: usize, addr: u64) -> Option<Vec<u64>> {
        self.free(cpu, addr)
    }

    /// Store the rest of an import after a served miss; returns objects for the arena.
    pub fn fill(&self, cpu: usize, objs: Vec<u64>) -> Option<Vec<u64>> {
        let c = self.caches;
        if let Some(layer) = c.layers.get(self.k) {
            return layer.fill(c.cpu_cache(cpu, self.k), objs);
        }
        let mut s = c.stacks.get(self.k)?.0.lock();
        s.counts.allocs += 1;
        s.objs.extend(objs);
        overflow(&mut s)
    }

    /// Cache a freed object; returns objects for the arena when the cache overflows.
    #[inline(always)]
    pub fn free(&self, cpu: usize, addr: u64) -> Option<Vec<u64>> {
        let c = self.caches;
        if let Some(layer) = c.layers.get(self.k) {
            return layer.free(c.cpu_cache(cpu, self.k), addr);
        }
        // A class exists only in one of the two stores, so `stacks[k]` exists here.
        let mut s = c.stacks.get(self.k)?.0.lock();
        s.counts.frees += 1;
        s.objs.push(addr);
        overflow(&mut s)
    }

    /// Take every cached object into `out`; with `shrink` (the arena ran dry) a
    /// magazine class halves its depot's bound.
    pub fn drain(&self, out: &mut Vec<u64>, shrink: bool) {
        let c = self.caches;
        if let Some(layer) = c.layers.get(self.k) {
            layer.drain(c.cpus_of(self.k), out, shrink);
        } else if let Some(s) = c.stacks.get(self.k) {
            out.append(&mut s.0.lock().objs);
        }
    }

    /// Counters and the number of objects held.
    pub fn counts(&self) -> CacheCounts {
        let c = self.caches;
        if let Some(layer) = c.layers.get(self.k) {
            return layer.counts(c.cpus_of(self.k));
        }
        c.stacks.get(self.k).map_or_else(CacheCounts::default, |s| {
            let s = s.0.lock();
            CacheCounts {
                objects: s.objs.len() as u64,
                ..s.counts
            }
        })
    }

    /// Record that `addr` was handed to a caller (when frees are checked).
    #[inline(always)]
    pub fn track(&self, addr: u64) {
        if let Some(set) = self.caches.outstanding.get(self.k) {
            let fresh = set.lock().insert(addr);
            debug_assert!(fresh, "a cache handed out {addr:#x} twice");
        }
    }

    /// Accept a free of `addr` into the cache: true when frees are trusted or `addr`
    /// was handed out by this class (it is then no longer outstanding).
    #[inline(always)]
    pub fn untrack(&self, addr: u64) -> bool {
        match self.caches.outstanding.get(self.k) {
            Some(set) => set.lock().remove(&addr),
            None => true,
        }
    }
}

impl ClassMut<'_> {
    /// The shared view of the same class.
    #[inline(always)]
    pub fn shared(&self) -> Class<'_> {
        Class {
            caches: self.caches,
            k: self.k,
        }
    }

    /// [`Class::alloc`] through an exclusive borrow: no lock on the common path.
    #[inline(always)]
    pub fn alloc_mut(&mut self, cpu: usize) -> Option<u64> {
        let i = self.caches.slot(cpu, self.k);
        let QuantumCaches { cpus, layers, .. } = &mut *self.caches;
        match (layers.get(self.k), cpus.get_mut(i)) {
            (Some(layer), Some(c)) => layer.alloc_mut(&mut c.0),
            _ => self.shared().alloc_cold(cpu),
        }
    }

    /// [`Class::free`] through an exclusive borrow: no lock on the common path.
    #[inline(always)]
    pub fn free_mut(&mut self, cpu: usize, addr: u64) -> Option<Vec<u64>> {
        let i = self.caches.slot(cpu, self.k);
        let QuantumCaches { cpus, layers, .. } = &mut *self.caches;
        match (layers.get(self.k), cpus.get_mut(i)) {
            (Some(layer), Some(c)) => layer.free_mut(&mut c.0, addr),
            _ => self.shared().free_cold(cpu, addr),
        }
    }
}

/// Past the limit, the older (colder) half of the stack goes back to the arena.
fn overflow(s: &mut Stack) -> Option<Vec<u64>> {
    (s.objs.len() > STACK_LIMIT).then(|| s.objs.drain(..STACK_LIMIT / 2).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_lookup_maps_each_cached_size_and_nothing_else() {
        let c = QuantumCaches::new(0x1000, 0x4000, false, true, 1);
        assert!(c.class_of(0).is_none());
        assert_eq!(c.class_of(0x1000).map(|k| k.size()), Some(0x1000));
        assert_eq!(c.class_of(0x4000).map(|k| k.size()), Some(0x4000));
        assert!(c.class_of(0x5000).is_none());
        assert!(c.class_of(!0xfff).is_none());
        assert!(QuantumCaches::new(0x1000, 0, false, true, 1).is_empty());
    }

    #[test]
    fn a_stack_class_is_lifo_and_flushes_its_older_half_past_the_limit() {
        let qc = QuantumCaches::new(0x1000, 0x1000, false, false, 1);
        let c = qc.class_of(0x1000).expect("cached size");
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
        let qc = QuantumCaches::new(0x1000, 0x1000, true, true, 1);
        let checked = qc.class_of(0x1000).expect("cached size");
        checked.track(0x5000);
        assert!(checked.untrack(0x5000));
        assert!(!checked.untrack(0x5000));
        assert!(!checked.untrack(0x6000));
        let qt = QuantumCaches::new(0x1000, 0x1000, true, false, 1);
        let trusted = qt.class_of(0x1000).expect("cached size");
        assert!(trusted.untrack(0x6000));
    }

    #[test]
    fn the_hit_paths_decline_a_held_record_and_the_full_path_then_serves_it() {
        let qc = QuantumCaches::new(0x1000, 0x1000, true, false, 1);
        let c = qc.class_of(0x1000).expect("cached size");
        assert!(qc.hit_free(0, 0, 0xa000));
        let held = qc.cpus[0].0.lock();
        assert_eq!(
            qc.hit_alloc(0, 0),
            None,
            "a held record declines the alloc hit"
        );
        assert!(!qc.hit_free(0, 0, 0xb000), "and the free hit");
        drop(held);
        assert!(c.free(0, 0xb000).is_none());
        assert_eq!(qc.hit_alloc(0, 0), Some(0xb000));
        assert_eq!(c.alloc(0), Some(0xa000));
        let n = c.counts();
        assert_eq!((n.hits, n.frees, n.objects), (2, 2, 0));
    }

    #[test]
    fn the_alloc_hit_gate_closes_and_reopens_without_touching_frees() {
        let qc = QuantumCaches::new(0x1000, 0x2000, true, false, 1);
        assert_eq!(qc.hit_class_alloc(0x2000), Some(1));
        qc.set_alloc_hits(false);
        assert_eq!(qc.hit_class_alloc(0x1000), None);
        assert_eq!(qc.hit_class_free(0x4000, 0x1000), Some(0));
        qc.set_alloc_hits(true);
        assert_eq!(qc.hit_class_alloc(0x1000), Some(0));
        assert_eq!(qc.hit_class_alloc(0x1800), None, "not a quantum multiple");
        let checked = QuantumCaches::new(0x1000, 0x2000, true, true, 1);
        checked.set_alloc_hits(true);
        assert_eq!(
            checked.hit_class_alloc(0x1000),
            None,
            "checked frees: no hits"
        );
    }

    #[test]
    fn each_cpu_and_class_has_its_own_magazines_and_a_stray_cpu_id_shares_cpu_zeros() {
        let mut qc = QuantumCaches::new(0x1000, 0x2000, true, false, 2);
        let one = qc.class_of(0x1000).expect("cached size");
        let two = qc.class_of(0x2000).expect("cached size");
        assert!(one.free(1, 0xa000).is_none());
        assert_eq!(one.alloc(0), None, "CPU 0 does not see CPU 1's magazine");
        assert_eq!(
            two.alloc(1),
            None,
            "class 2 does not see class 1's magazine"
        );
        assert_eq!(one.alloc(1), Some(0xa000));
        assert!(two.free(7, 0xb000).is_none());
        assert_eq!(two.alloc(0), Some(0xb000), "CPU 7 of 2 shares CPU 0's");
        let mut m = qc.class_of_mut(0x2000).expect("cached size");
        assert!(m.free_mut(1, 0xc000).is_none());
        assert_eq!(m.alloc_mut(0), None);
        assert_eq!(m.alloc_mut(1), Some(0xc000));
        let n = qc.class_of(0x2000).expect("cached size").counts();
        assert_eq!((n.hits, n.frees, n.objects), (2, 2, 0));
    }
}
