//! A device's memory port: loads and stores with fault-and-retry.
//!
//! Every access a simulated device makes goes through its [`Port`]:
//! 1. split the access at 4 KiB boundaries;
//! 2. translate each piece through the device's MMU ([`Translator`]: TLBs, then a page
//!    walk);
//! 3. on a miss (nothing mapped, or a leaf that does not permit the access) report the
//!    fault to the core with `Gmem::dev_fault` and, when the core answers with a
//!    retry, translate again — at most [`Port::max_faults`] times per piece, then the
//!    access fails as a livelock instead of spinning;
//! 4. move the bytes in the memory the leaf points to: the device's own memory for a
//!    leaf with the local aperture, otherwise whichever memory the machine's
//!    [`MemoryMap`] says holds the physical address — while the MMU's
//!    [`AccessGate`] is held, so an invalidation (a migration's shootdown) waits until
//!    the bytes have moved and no access touches a frame after it was given up.
//!
//! With a fault batch size `n > 0` ([`Port::set_fault_batch`]), step 3 translates the
//! pages of the access on past a miss and reports up to `n` misses in one
//! `Gmem::dev_fault_batch` call (a GPU's fault buffer), then replays the whole access
//! once.
//!
//! This is the device-independent half of every simulated driver: the drivers differ
//! only in the [`Translator`] (format and caches) behind the port.

use crate::map::MemoryMap;
use crate::memory::{BoundsError, SimMemory};
use crate::mmu::{AccessGate, Miss, Served, Translator};
use gmem_core::{
    BatchFault, DeviceId, FaultError, FaultKind, FaultResolution, Gmem, PhysAddr, Prot, VirtAddr,
    PAGE_SIZE,
};
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLockReadGuard};

/// Why an access failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessError {
    /// The device was not created in the core yet (no [`DeviceId`] bound to the port).
    NotCreated,
    /// The core could not serve the fault (not allocated, protection violation, out of
    /// memory, device not active, ...).
    Fault {
        /// The faulting address.
        va: VirtAddr,
        /// The access attempted.
        access: Prot,
        /// The core's answer.
        error: FaultError,
    },
    /// The core kept answering "retry" but the access kept missing.
    Livelock {
        /// The address.
        va: VirtAddr,
        /// Faults reported for it.
        faults: u32,
    },
    /// A leaf translated to a physical address that no memory answers for.
    NoMemory {
        /// The physical address.
        pa: PhysAddr,
    },
    /// The memory rejected the access.
    Bounds(BoundsError),
    /// An access of zero bytes or one that wraps the address space.
    BadAccess {
        /// The address.
        va: VirtAddr,
        /// The length.
        len: u64,
    },
}

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AccessError::NotCreated => write!(f, "device not created in the core"),
            AccessError::Fault { va, access, error } => {
                write!(f, "{access:?} fault at {va}: {error}")
            }
            AccessError::Livelock { va, faults } => {
                write!(f, "access at {va} still misses after {faults} faults")
            }
            AccessError::NoMemory { pa } => write!(f, "no memory at {pa}"),
            AccessError::Bounds(e) => write!(f, "{e}"),
            AccessError::BadAccess { va, len } => write!(f, "bad access {va}+{len:#x}"),
        }
    }
}

/// Counters of a port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Load calls.
    pub loads: u64,
    /// Store calls.
    pub stores: u64,
    /// Bytes loaded.
    pub bytes_loaded: u64,
    /// Bytes stored.
    pub bytes_stored: u64,
    /// Faults reported to the core (each followed by a retry or an error).
    pub faults: u64,
    /// Of those, misses on a present leaf that did not permit the access.
    pub protection_faults: u64,
    /// Faults the core answered with an error.
    pub failed_faults: u64,
    /// Faults the core served by zero-filling.
    pub zero_fills: u64,
    /// Faults the core served by migrating.
    pub migrations: u64,
    /// Faults the core served with a remote mapping.
    pub remote: u64,
    /// Faults the core served by mapping a frame already in place.
    pub mapped_existing: u64,
    /// Faults the core found spurious (a stale cached entry).
    pub spurious: u64,
    /// Faults the core served with a read-only copy (read duplication).
    pub duplicated: u64,
    /// Fault reports made: one per fault, or one per batch with batched faults on.
    pub batches: u64,
}

macro_rules! port_counters {
    ($($name:ident),*) => {
        #[derive(Default)]
        struct Counters { $($name: AtomicU64,)* }
        impl Counters {
            fn snapshot(&self) -> PortStats {
                PortStats { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
    };
}
port_counters!(
    loads,
    stores,
    bytes_loaded,
    bytes_stored,
    faults,
    protection_faults,
    failed_faults,
    zero_fills,
    migrations,
    remote,
    mapped_existing,
    spurious,
    duplicated,
    batches
);

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// One page of an access, translated.
///
/// Only [`Port::with_pages`] makes these, in a [`PageList`]: an entry also remembers
/// how its memory was found, so the next access through the same list can keep the
/// memory without asking the map again.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The physical address of the requested virtual address.
    pub pa: PhysAddr,
    /// The memory holding it.
    pub memory: Arc<SimMemory>,
    /// Where the translation was served.
    pub served: Served,
    /// Whether `memory` is the port's local memory (a leaf with the local aperture).
    local: bool,
    /// For a non-local entry, the [`MemoryMap::generation`] in which the map gave
    /// `memory`.
    generation: u64,
}

impl Resolved {
    /// Whether this entry's memory is still the one a leaf with aperture `local`
    /// translating to `pa` resolves to, through port memory `port_local` and a map
    /// now in state `generation`.
    #[inline]
    fn still_holds(
        &self,
        local: bool,
        pa: PhysAddr,
        port_local: Option<&Arc<SimMemory>>,
        generation: u64,
    ) -> bool {
        if local {
            // The port's local memory never changes, but the list may have been used
            // with another port.
            self.local && port_local.is_some_and(|m| Arc::ptr_eq(m, &self.memory))
        } else {
            // Generation numbers are unique to one state of one map: equal numbers
            // mean the map (this port's, in the same state) answers as it did, and
            // memories in a map do not overlap, so the one containing `pa` is the
            // map's answer for `pa`.
            !self.local && self.generation == generation && self.memory.contains(pa)
        }
    }
}

/// The translated pages of one access: the scratch list [`Port::with_pages`] writes,
/// kept by its caller across accesses so that the memories found for one access serve
/// the next (see "Keeping memories across accesses" there).
///
/// The list holds more entries than the last access's pages (older ones, kept for
/// their memories), but its only view, [`PageList::live`], is exactly the pages of the
/// last call that translated them all: no caller can read a stale entry.
#[derive(Debug, Default)]
pub struct PageList {
    /// Entries; those from `live` on are older ones, kept only for their memories.
    entries: Vec<Resolved>,
    /// Entries of the last call that translated every page (0 before any, and after a
    /// call that failed before the end of its translations).
    live: usize,
}

impl PageList {
    /// An empty list.
    pub fn new() -> PageList {
        PageList::default()
    }

    /// The translations of the last [`Port::with_pages`] call that translated all its
    /// pages, one per page in the order asked (empty before any such call and after a
    /// call that failed while translating). Once that call has returned, the frames
    /// may have moved (the gate is no longer held): read these for what served each
    /// page and where it was, never to move bytes.
    #[inline]
    pub fn live(&self) -> &[Resolved] {
        &self.entries[..self.live]
    }
}

/// Default bound on faults per page piece of an access.
pub const DEFAULT_MAX_FAULTS: u32 = 8;

/// The memory port of one device.
pub struct Port {
    translator: Arc<dyn Translator>,
    map: Arc<MemoryMap>,
    local: Option<Arc<SimMemory>>,
    id: OnceLock<DeviceId>,
    max_faults: u32,
    batch: AtomicU32,
    counters: Counters,
}

impl Port {
    /// A port translating with `translator`, resolving physical addresses through
    /// `map`, with `local` as the memory behind the local aperture.
    pub fn new(
        translator: Arc<dyn Translator>,
        map: Arc<MemoryMap>,
        local: Option<Arc<SimMemory>>,
    ) -> Port {
        Port {
            translator,
            map,
            local,
            id: OnceLock::new(),
            max_faults: DEFAULT_MAX_FAULTS,
            batch: AtomicU32::new(0),
            counters: Counters::default(),
        }
    }

    /// The same port with another bound on faults per page piece (at least 1).
    pub fn with_max_faults(mut self, n: u32) -> Port {
        self.max_faults = n.max(1);
        self
    }

    /// The bound on faults per page piece of an access.
    pub fn max_faults(&self) -> u32 {
        self.max_faults
    }

    /// How faults reach the core: `0` (the default), one `Gmem::dev_fault` per miss;
    /// `n > 0`, up to `n` misses of one access (a warp instruction's pages) per
    /// `Gmem::dev_fault_batch` call (at most 256 are accepted by the core), the access
    /// replayed once per batch. `1` reports each miss alone, through the batch call.
    pub fn set_fault_batch(&self, n: u32) {
        self.batch.store(n, Ordering::Relaxed);
    }

    /// The fault batch size (0: no batches).
    pub fn fault_batch(&self) -> u32 {
        self.batch.load(Ordering::Relaxed)
    }

    /// Bind the device id the core gave the device.
    ///
    /// # Errors
    /// The id already bound, if the port was bound before (binding is once).
    pub fn bind(&self, id: DeviceId) -> Result<(), DeviceId> {
        self.id.set(id).map_err(|_| *self.id.get().expect("set"))
    }

    /// The device id, once bound.
    #[inline]
    pub fn id(&self) -> Option<DeviceId> {
        self.id.get().copied()
    }

    /// The machine's memory map.
    pub fn memory_map(&self) -> &Arc<MemoryMap> {
        &self.map
    }

    /// The device's compute units.
    pub fn units(&self) -> usize {
        self.translator.units()
    }

    /// Which of `pages` unit `unit`'s translation caches hold now (see
    /// [`Translator::held`]); `None` when the translator does not say.
    pub fn held(&self, unit: usize, pages: &[(VirtAddr, Prot)]) -> Option<u64> {
        self.translator.held(unit, pages)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PortStats {
        self.counters.snapshot()
    }

    /// Report miss `miss` of `va` to the core and count the answer; `faults` is the
    /// access's running fault count, bounded by `limit`.
    #[allow(clippy::too_many_arguments)]
    fn fault(
        &self,
        gm: &Gmem,
        id: DeviceId,
        va: VirtAddr,
        access: Prot,
        miss: Miss,
        faults: &mut u32,
        limit: u32,
    ) -> Result<(), AccessError> {
        if *faults >= limit {
            return Err(AccessError::Livelock {
                va,
                faults: *faults,
            });
        }
        *faults += 1;
        let c = &self.counters;
        add(&c.faults, 1);
        if matches!(miss, Miss::Protection { .. }) {
            add(&c.protection_faults, 1);
        }
        add(&c.batches, 1);
        if self.fault_batch() > 0 {
            return self.serve_batch(gm, id, &[(va, access, miss)]);
        }
        match gm.dev_fault(id, va, access) {
            Ok(r) => {
                self.count_served(r);
                Ok(())
            }
            // Another thread maps the region without the lock right now, or the page
            // thrashes and this device is throttled: nothing changed, the access
            // retries (counted with the spurious faults).
            Err(FaultError::Busy(_) | FaultError::Throttled(_)) => {
                add(&c.spurious, 1);
                core::hint::spin_loop();
                Ok(())
            }
            Err(error) => {
                add(&c.failed_faults, 1);
                Err(AccessError::Fault { va, access, error })
            }
        }
    }

    /// Report the misses of one batched pass: counted as faults (each against the
    /// access's bound `limit`, `faults` running), then served as one batch.
    fn fault_many(
        &self,
        gm: &Gmem,
        id: DeviceId,
        missed: &[(VirtAddr, Prot, Miss)],
        faults: &mut u32,
        limit: u32,
    ) -> Result<(), AccessError> {
        if *faults >= limit {
            return Err(AccessError::Livelock {
                va: missed[0].0,
                faults: *faults,
            });
        }
        *faults = faults.saturating_add(missed.len() as u32);
        let c = &self.counters;
        add(&c.faults, missed.len() as u64);
        add(&c.batches, 1);
        let protection = missed
            .iter()
            .filter(|m| matches!(m.2, Miss::Protection { .. }))
            .count();
        add(&c.protection_faults, protection as u64);
        self.serve_batch(gm, id, missed)
    }

    /// Count a served fault by what the core did.
    fn count_served(&self, r: FaultResolution) {
        let c = &self.counters;
        add(
            match r.kind {
                FaultKind::ZeroFill => &c.zero_fills,
                FaultKind::Migrated => &c.migrations,
                FaultKind::Remote => &c.remote,
                FaultKind::MappedExisting => &c.mapped_existing,
                FaultKind::Spurious => &c.spurious,
                FaultKind::Duplicated => &c.duplicated,
            },
            1,
        );
    }

    /// Report the misses `missed` (already counted as faults and against the access's
    /// bound) to the core as one batch, and count the answers: `Busy` is a retry, any
    /// other refused record fails the access (the first one, in `missed`'s order).
    fn serve_batch(
        &self,
        gm: &Gmem,
        id: DeviceId,
        missed: &[(VirtAddr, Prot, Miss)],
    ) -> Result<(), AccessError> {
        let c = &self.counters;
        let records: Vec<BatchFault> = missed
            .iter()
            .map(|&(va, access, _)| BatchFault { va, access })
            .collect();
        let report = match gm.dev_fault_batch(id, &records) {
            Ok(r) => r,
            Err(error) => {
                add(&c.failed_faults, missed.len() as u64);
                let (va, access, _) = missed[0];
                return Err(AccessError::Fault { va, access, error });
            }
        };
        let mut first_error = None;
        for (&(va, access, _), outcome) in missed.iter().zip(report.outcomes) {
            match outcome {
                Ok(r) => self.count_served(r),
                Err(FaultError::Busy(_) | FaultError::Throttled(_)) => add(&c.spurious, 1),
                Err(error) => {
                    add(&c.failed_faults, 1);
                    first_error.get_or_insert(AccessError::Fault { va, access, error });
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Translate every `(va, access)` of `pages` for `unit`, faulting and retrying the
    /// whole list after each fault (as a GPU replays a faulted instruction), then run
    /// `f` on the translations while invalidations of this device wait: the frames `f`
    /// sees stay this device's until it returns. `out` receives the translations: `f`
    /// sees [`PageList::live`], one entry per page, and they stay there after the call;
    /// keep one list per caller across calls so that the memories found for one access
    /// serve the next. At most [`Port::max_faults`] faults per page are taken.
    ///
    /// A list of one page (most accesses) is translated without the batch:
    /// [`Translator::translate_served`] under the gate, its memory kept or resolved as
    /// the batch would for its first page, the gate dropped before a fault and held
    /// from the translation until `f` returns, as for any list.
    ///
    /// # Keeping memories across accesses
    /// An entry of `out` keeps its memory when the next call's leaf resolves to the
    /// same one: a local leaf to the same port's local memory; a non-local leaf to a
    /// physical address inside the entry's memory while the map's
    /// [`MemoryMap::generation`] is the one the entry was found in (so the map's
    /// answer is unchanged: its memories do not overlap, and the number changes with
    /// every add and remove). The map lock and the count changes of the memory's
    /// `Arc` are then skipped. This keeps the gate's guarantee exactly: what is cached
    /// is a memory object, never a frame or a translation. Each call translates every
    /// page afresh under the gate, so an access racing a migration sees the old leaf
    /// (and the shootdown waits for the gate until `f` returns) or the new one, as
    /// before; a migration moves bytes between frames, not memories in the map. A map
    /// change racing the access is ordered as before: the number is read once the
    /// gate is held, and an access that read the old number is one that looked the
    /// map up just before the change (the memory stays alive through its `Arc`).
    /// Entries past the live ones keep their memories alive until reused or dropped;
    /// [`PageList::live`] never shows them.
    ///
    /// # Errors
    /// [`AccessError::NotCreated`] before [`Port::bind`]; the core's answer to a fault
    /// it could not serve; [`AccessError::Livelock`] past the fault bound;
    /// [`AccessError::NoMemory`] for a leaf no memory answers for; whatever `f` returns.
    pub fn with_pages<R>(
        &self,
        gm: &Gmem,
        unit: usize,
        pages: &[(VirtAddr, Prot)],
        out: &mut PageList,
        f: impl FnOnce(&[Resolved]) -> Result<R, AccessError>,
    ) -> Result<R, AccessError> {
        let id = self.id().ok_or(AccessError::NotCreated)?;
        // Nothing is live until every page of this call is translated.
        out.live = 0;
        let gate = match *pages {
            [page] => self.translate_page(gm, id, unit, page, out)?,
            _ => self.translate_pages(gm, id, unit, pages, out)?,
        };
        // `f` runs with the gate held: invalidations of this device wait until it returns.
        let r = f(out.live());
        drop(gate);
        r
    }

    /// The translation half of [`Port::with_pages`] for a list of one page (most
    /// accesses: a load or store within a page, a coalesced instruction whose lines
    /// share a page), with `out.live` 0: the same steps as [`Port::translate_pages`]
    /// with no batch around them. The page is translated with
    /// [`Translator::translate_served`] (what the default batch calls per page, and what
    /// an MMU's batch answers page by page) under the gate, its memory kept in or
    /// resolved into `out`'s first entry exactly as the batch does for its first page,
    /// and a miss faulted with the gate dropped, at most [`Port::max_faults`] times.
    /// Returns the gate, held, with the page live in `out`.
    #[inline]
    fn translate_page(
        &self,
        gm: &Gmem,
        id: DeviceId,
        unit: usize,
        (va, access): (VirtAddr, Prot),
        out: &mut PageList,
    ) -> Result<Option<RwLockReadGuard<'_, ()>>, AccessError> {
        let mut faults = 0;
        loop {
            let gate = self.translator.gate().map(AccessGate::enter);
            // Read after entering the gate; see "Keeping memories across accesses" on
            // `with_pages`.
            let generation = self.map.generation();
            let (r, served) = self.translator.translate_served(unit, va, access);
            let leaf = match r {
                Ok(leaf) => leaf,
                Err(m) => {
                    // Never hold the gate across a fault: serving it may invalidate this
                    // very device.
                    drop(gate);
                    self.fault(gm, id, va, access, m, &mut faults, self.max_faults)?;
                    continue;
                }
            };
            let pa = leaf.translate(va);
            match out.entries.first_mut() {
                Some(e) if e.still_holds(leaf.local, pa, self.local.as_ref(), generation) => {
                    // The same memory as this entry's last use: no map lookup, no count
                    // change on the memory.
                    e.pa = pa;
                    e.served = served;
                }
                first => {
                    let e = Resolved {
                        pa,
                        memory: self.memory_of(leaf.local, pa)?,
                        served,
                        local: leaf.local,
                        generation,
                    };
                    match first {
                        Some(old) => *old = e,
                        None => out.entries.push(e),
                    }
                }
            }
            out.live = 1;
            return Ok(gate);
        }
    }

    /// The translation half of [`Port::with_pages`] for any list, with `out.live` 0:
    /// every page translated in one batch under the gate, the whole list faulted and
    /// retried after a miss. Returns the gate, held, with the pages live in `out`.
    #[inline]
    fn translate_pages(
        &self,
        gm: &Gmem,
        id: DeviceId,
        unit: usize,
        pages: &[(VirtAddr, Prot)],
        out: &mut PageList,
    ) -> Result<Option<RwLockReadGuard<'_, ()>>, AccessError> {
        let limit = self.max_faults.saturating_mul(pages.len().max(1) as u32);
        let mut faults = 0;
        let entries = &mut out.entries;
        let batch = self.fault_batch() as usize;
        // With batched faults: every miss of this pass, reported together.
        let mut misses: Vec<(VirtAddr, Prot, Miss)> = Vec::new();
        loop {
            misses.clear();
            let gate = self.translator.gate().map(AccessGate::enter);
            // Read after entering the gate; see "Keeping memories across accesses"
            // on `with_pages` for why a cached memory is still right.
            let generation = self.map.generation();
            let mut missed = None;
            let mut failed = None;
            // Entries written in this pass; `entries[n..]` are kept from earlier calls (their
            // memories may serve a later call) but not shown to `f`.
            let mut n = 0;
            // The entry of `out` holding the last non-local memory found: consecutive
            // pages usually live in the same one, so the memory map is not searched
            // again (and the memory's count is not touched for the memo itself).
            let mut last: Option<usize> = None;
            let local = self.local.as_ref();
            self.translator
                .translate_batch(unit, pages, &mut |i, r, served| match r {
                    // Past a miss of a batched pass only the other misses matter:
                    // the access is replayed whole once the batch is served.
                    Ok(_) if !misses.is_empty() => true,
                    Ok(leaf) => {
                        let (va, _) = pages[i];
                        let pa = leaf.translate(va);
                        if let Some(e) = entries.get_mut(n) {
                            if e.still_holds(leaf.local, pa, local, generation) {
                                // The same memory as this entry's last use: no map
                                // lookup, no count change on the memory.
                                e.pa = pa;
                                e.served = served;
                                if !leaf.local {
                                    last = Some(n);
                                }
                                n += 1;
                                return true;
                            }
                        }
                        let memory = match last.map(|j| &entries[j].memory) {
                            Some(m) if !leaf.local && m.contains(pa) => m.clone(),
                            _ => match self.memory_of(leaf.local, pa) {
                                Ok(m) => m,
                                Err(e) => {
                                    failed = Some(e);
                                    return false;
                                }
                            },
                        };
                        let e = Resolved {
                            pa,
                            memory,
                            served,
                            local: leaf.local,
                            generation,
                        };
                        match entries.get_mut(n) {
                            Some(old) => *old = e,
                            None => entries.push(e),
                        }
                        if !leaf.local {
                            last = Some(n);
                        }
                        n += 1;
                        true
                    }
                    Err(m) if batch > 0 => {
                        let (va, access) = pages[i];
                        misses.push((va, access, m));
                        misses.len() < batch
                    }
                    Err(m) => {
                        let (va, access) = pages[i];
                        missed = Some((va, access, m));
                        false
                    }
                });
            if let Some(e) = failed {
                return Err(e);
            }
            if !misses.is_empty() {
                // Never hold the gate across a fault (as below).
                drop(gate);
                self.fault_many(gm, id, &misses, &mut faults, limit)?;
                continue;
            }
            match missed {
                None => {
                    out.live = n;
                    return Ok(gate);
                }
                Some((va, access, m)) => {
                    // Never hold the gate across a fault: serving it may invalidate
                    // this very device.
                    drop(gate);
                    self.fault(gm, id, va, access, m, &mut faults, limit)?;
                }
            }
        }
    }

    /// The memory a leaf with the local aperture `local` (or not) translating to `pa`
    /// points at.
    fn memory_of(&self, local: bool, pa: PhysAddr) -> Result<Arc<SimMemory>, AccessError> {
        let memory = if local {
            self.local.clone()
        } else {
            self.map.at(pa).map(|(_, m)| m)
        };
        memory.ok_or(AccessError::NoMemory { pa })
    }

    /// Translate `va` for `access` by `unit`, faulting and retrying; returns the
    /// physical address and the memory holding it. The frame may move as soon as this
    /// returns: to move bytes safely use [`Port::with_pages`] (loads and stores do).
    ///
    /// # Errors
    /// As [`Port::with_pages`].
    pub fn resolve(
        &self,
        gm: &Gmem,
        unit: usize,
        va: VirtAddr,
        access: Prot,
    ) -> Result<(PhysAddr, Arc<SimMemory>), AccessError> {
        let mut out = PageList::new();
        self.with_pages(gm, unit, &[(va, access)], &mut out, |r| {
            Ok((r[0].pa, r[0].memory.clone()))
        })
    }

    fn pieces(
        va: VirtAddr,
        len: usize,
        mut f: impl FnMut(VirtAddr, std::ops::Range<usize>) -> Result<(), AccessError>,
    ) -> Result<(), AccessError> {
        if len == 0 || va.checked_add(len as u64 - 1).is_none() {
            return Err(AccessError::BadAccess {
                va,
                len: len as u64,
            });
        }
        let mut done = 0usize;
        while done < len {
            let a = VirtAddr::new(va.as_u64() + done as u64);
            let n = ((PAGE_SIZE - a.page_offset()) as usize).min(len - done);
            f(a, done..done + n)?;
            done += n;
        }
        Ok(())
    }

    /// Load `buf.len()` bytes at `va` by compute unit `unit`.
    ///
    /// # Errors
    /// [`AccessError::NotCreated`] before [`Port::bind`]; [`AccessError::BadAccess`]
    /// for an empty access or one that wraps; [`AccessError::Fault`] when the core
    /// could not serve a miss (not allocated, protection, out of memory, ...);
    /// [`AccessError::Livelock`] when a page kept missing after the core's answers;
    /// [`AccessError::NoMemory`] or [`AccessError::Bounds`] when a leaf points where
    /// no memory answers. The pages before the failing one have been read.
    pub fn load(
        &self,
        gm: &Gmem,
        unit: usize,
        va: VirtAddr,
        buf: &mut [u8],
    ) -> Result<(), AccessError> {
        add(&self.counters.loads, 1);
        let len = buf.len();
        let mut out = PageList::new();
        Self::pieces(va, len, |a, r| {
            self.with_pages(gm, unit, &[(a, Prot::READ)], &mut out, |p| {
                p[0].memory
                    .read(p[0].pa, &mut buf[r])
                    .map_err(AccessError::Bounds)
            })
        })?;
        add(&self.counters.bytes_loaded, len as u64);
        Ok(())
    }

    /// Store `data` at `va` by compute unit `unit`.
    ///
    /// # Errors
    /// As [`Port::load`]; the pages before the failing one have been written.
    pub fn store(
        &self,
        gm: &Gmem,
        unit: usize,
        va: VirtAddr,
        data: &[u8],
    ) -> Result<(), AccessError> {
        add(&self.counters.stores, 1);
        let mut out = PageList::new();
        Self::pieces(va, data.len(), |a, r| {
            self.with_pages(gm, unit, &[(a, Prot::WRITE)], &mut out, |p| {
                p[0].memory
                    .write(p[0].pa, &data[r])
                    .map_err(AccessError::Bounds)
            })
        })?;
        add(&self.counters.bytes_stored, data.len() as u64);
        Ok(())
    }
}

macro_rules! typed_access {
    ($($load:ident, $store:ident, $t:ty;)*) => {
        impl Port {
            $(
                #[doc = concat!("Load a little-endian `", stringify!($t), "` at `va`.")]
                ///
                /// # Errors
                /// As [`Port::load`].
                pub fn $load(&self, gm: &Gmem, unit: usize, va: VirtAddr) -> Result<$t, AccessError> {
                    let mut b = [0u8; std::mem::size_of::<$t>()];
                    self.load(gm, unit, va, &mut b)?;
                    Ok(<$t>::from_le_bytes(b))
                }

                #[doc = concat!("Store a little-endian `", stringify!($t), "` at `va`.")]
                ///
                /// # Errors
                /// As [`Port::store`].
                pub fn $store(&self, gm: &Gmem, unit: usize, va: VirtAddr, v: $t) -> Result<(), AccessError> {
                    self.store(gm, unit, va, &v.to_le_bytes())
                }
            )*
        }
    };
}

typed_access! {
    load_u32, store_u32, u32;
    load_u64, store_u64, u64;
    load_f32, store_f32, f32;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Grid;
    use crate::format::Leaf;
    use gmem_core::testing::TestSystem;
    use gmem_core::{Activation, AllocPolicy, AllocRequest, MmuMode};
    use std::sync::Mutex;

    /// A translator that maps every address to `frame` once `after` lookups missed,
    /// and records which unit asked.
    struct Fake {
        frame: Option<PhysAddr>,
        after: Mutex<u32>,
        units: Mutex<Vec<usize>>,
    }

    impl Translator for Fake {
        fn translate(&self, unit: usize, _va: VirtAddr, _access: Prot) -> Result<Leaf, Miss> {
            self.units.lock().unwrap().push(unit);
            let mut a = self.after.lock().unwrap();
            match self.frame {
                Some(frame) if *a == 0 => Ok(Leaf {
                    frame,
                    shift: 12,
                    prot: Prot::RW,
                    dirty: true,
                    local: false,
                    bits: 0,
                }),
                _ => {
                    *a = a.saturating_sub(1);
                    Err(Miss::NotPresent)
                }
            }
        }
        fn units(&self) -> usize {
            3
        }
    }

    fn fake(frame: Option<u64>, after: u32) -> Arc<Fake> {
        Arc::new(Fake {
            frame: frame.map(PhysAddr::new),
            after: Mutex::new(after),
            units: Mutex::new(Vec::new()),
        })
    }

    /// A core whose host is active in a space with one region; returns the region start.
    fn core() -> (TestSystem, VirtAddr) {
        let s = TestSystem::new(64);
        let sp =
            s.gm.as_create(
                VirtAddr::new(1 << 30),
                VirtAddr::new(2 << 30),
                AllocPolicy::empty(),
            )
            .unwrap();
        s.gm.as_attach(sp, s.host().id, MmuMode::Coherent, Activation::Switch)
            .unwrap();
        let r =
            s.gm.as_alloc(sp, AllocRequest::new(16 * PAGE_SIZE))
                .unwrap();
        (s, r.start)
    }

    #[test]
    fn an_access_that_keeps_missing_after_retries_is_a_livelock_not_a_hang() {
        let (s, va) = core();
        let port = Port::new(fake(None, 0), MemoryMap::new(), None).with_max_faults(3);
        assert_eq!(port.load_u32(&s.gm, 0, va), Err(AccessError::NotCreated));
        port.bind(s.host().id).unwrap();
        assert_eq!(port.bind(s.host().id), Err(s.host().id));
        assert_eq!(
            port.load_u32(&s.gm, 0, va),
            Err(AccessError::Livelock { va, faults: 3 })
        );
        // The core zero-filled and mapped the page, then took the repeated faults for
        // stale TLB entries; the port gave up after its bound.
        let st = port.stats();
        assert_eq!((st.faults, st.zero_fills, st.spurious), (3, 1, 2));
        assert_eq!(st.bytes_loaded, 0);
    }

    #[test]
    fn a_translation_to_unmapped_physical_memory_is_a_typed_error() {
        let (s, va) = core();
        let port = Port::new(fake(Some(0x7000_0000), 1), MemoryMap::new(), None);
        port.bind(s.host().id).unwrap();
        assert_eq!(
            port.store_u32(&s.gm, 0, va, 1),
            Err(AccessError::NoMemory {
                pa: PhysAddr::new(0x7000_0000)
            })
        );
        assert_eq!(port.stats().faults, 1);
    }

    #[test]
    fn a_kept_scratch_list_follows_every_change_of_the_memory_map() {
        let (s, va) = core();
        let map = MemoryMap::new();
        let host = s.host().id;
        let base = PhysAddr::new(0x10_0000);
        let a = Arc::new(SimMemory::new("a", base, PAGE_SIZE).unwrap());
        map.add(host, a.clone()).unwrap();
        let port = Port::new(fake(Some(0x10_0000), 0), map.clone(), None);
        port.bind(host).unwrap();
        let mut out = PageList::new();
        let page = [(va, Prot::WRITE)];
        let put = |out: &mut PageList, v: u32| {
            port.with_pages(&s.gm, 0, &page, out, |r| {
                assert_eq!(r.len(), 1);
                r[0].memory
                    .write(r[0].pa, &v.to_le_bytes())
                    .map_err(AccessError::Bounds)
            })
        };
        put(&mut out, 1).unwrap();
        // The second access keeps the entry's memory: no new count on `a`.
        let held = Arc::strong_count(&a);
        put(&mut out, 2).unwrap();
        assert_eq!(Arc::strong_count(&a), held);
        assert_eq!((a.read_u64(base).unwrap() as u32), 2);
        // Another memory at the same addresses: the kept list must not write `a`.
        map.remove(host).unwrap();
        let b = Arc::new(SimMemory::new("b", base, PAGE_SIZE).unwrap());
        map.add(host, b.clone()).unwrap();
        put(&mut out, 3).unwrap();
        assert_eq!(
            (
                (a.read_u64(base).unwrap() as u32),
                (b.read_u64(base).unwrap() as u32)
            ),
            (2, 3)
        );
        // No memory there any more: a typed error, whatever the list held.
        map.remove(host).unwrap();
        assert_eq!(put(&mut out, 4), Err(AccessError::NoMemory { pa: base }));
        assert_eq!((b.read_u64(base).unwrap() as u32), 3);
    }

    /// The list's only view is the pages of the last call that translated them all: a
    /// shorter access after a longer one shows its own pages only, and a call that
    /// fails while translating leaves nothing live.
    #[test]
    fn a_page_list_shows_only_the_last_access_pages() {
        let (s, va) = core();
        let map = MemoryMap::new();
        let base = PhysAddr::new(0x10_0000);
        let m = Arc::new(SimMemory::new("m", base, 4 * PAGE_SIZE).unwrap());
        map.add(s.host().id, m).unwrap();
        let port = Port::new(fake(Some(0x10_0000), 0), map.clone(), None);
        port.bind(s.host().id).unwrap();
        let mut out = PageList::new();
        assert!(out.live().is_empty());
        let next = VirtAddr::new(va.as_u64() + PAGE_SIZE);
        let three = [(va, Prot::READ), (next, Prot::READ), (va, Prot::READ)];
        let seen = port
            .with_pages(&s.gm, 0, &three, &mut out, |r| Ok(r.len()))
            .unwrap();
        assert_eq!((seen, out.live().len()), (3, 3));
        let seen = port
            .with_pages(&s.gm, 0, &three[..1], &mut out, |r| Ok(r.len()))
            .unwrap();
        assert_eq!((seen, out.live().len()), (1, 1));
        assert_eq!(out.live()[0].pa, base);
        // No memory at the frame any more: the call fails while translating.
        map.remove(s.host().id).unwrap();
        assert_eq!(
            port.with_pages(&s.gm, 0, &three, &mut out, |r| Ok(r.len())),
            Err(AccessError::NoMemory { pa: base })
        );
        assert!(out.live().is_empty());
    }

    /// Batched faults: the misses of one access reach the core as one batch and the
    /// access is replayed once; unbatched, one report per miss.
    #[test]
    fn batched_faults_report_every_miss_of_an_access_in_one_batch() {
        for batched in [false, true] {
            let (s, va) = core();
            let map = MemoryMap::new();
            let base = PhysAddr::new(0x10_0000);
            let m = Arc::new(SimMemory::new("m", base, 4 * PAGE_SIZE).unwrap());
            map.add(s.host().id, m).unwrap();
            // Misses on the first two lookups, then every page maps.
            let port = Port::new(fake(Some(0x10_0000), 2), map, None);
            port.set_fault_batch(if batched { 32 } else { 0 });
            assert_eq!(port.fault_batch() > 0, batched);
            port.bind(s.host().id).unwrap();
            let page = |k: u64| (VirtAddr::new(va.as_u64() + k * PAGE_SIZE), Prot::WRITE);
            let three = [page(0), page(1), page(2)];
            let before = s.gm.stats();
            let n = port
                .with_pages(&s.gm, 0, &three, &mut PageList::new(), |r| Ok(r.len()))
                .unwrap();
            assert_eq!(n, 3);
            let st = port.stats();
            let core = s.gm.stats();
            if batched {
                // One pass: pages 0 and 1 miss, one batch of two, one replay.
                assert_eq!((st.faults, st.batches, st.zero_fills), (2, 1, 2));
                assert_eq!(core.fault_batches - before.fault_batches, 1);
                assert_eq!(core.fault_batch_records - before.fault_batch_records, 2);
            } else {
                // Page 0 misses twice, one fault and one replay each.
                assert_eq!((st.faults, st.batches), (2, 2));
                assert_eq!(core.fault_batches, before.fault_batches);
            }
        }
    }

    #[test]
    fn work_groups_run_round_robin_on_units_and_items_in_order() {
        let (s, va) = core();
        let map = MemoryMap::new();
        let mem = Arc::new(SimMemory::new("m", PhysAddr::new(0x10_0000), PAGE_SIZE).unwrap());
        map.add(s.host().id, mem.clone()).unwrap();
        let f = fake(Some(0x10_0000), 0);
        let port = Port::new(f.clone(), map, None);
        port.bind(s.host().id).unwrap();
        let mut seen = Vec::new();
        let st = port
            .launch(
                &s.gm,
                Grid {
                    groups: 4,
                    group_size: 2,
                },
                |w| {
                    seen.push((w.global, w.group, w.local, w.unit));
                    w.store_u32(VirtAddr::new(va.as_u64() + 4 * w.global), w.global as u32)
                },
            )
            .unwrap();
        assert_eq!(
            (st.groups, st.items, st.port.stores, st.port.faults),
            (4, 8, 8, 0)
        );
        assert_eq!(seen[2], (2, 1, 0, 1));
        assert_eq!(seen[7], (7, 3, 1, 0));
        assert_eq!(*f.units.lock().unwrap(), vec![0, 0, 1, 1, 2, 2, 0, 0]);
        assert_eq!(mem.read_u64(PhysAddr::new(0x10_0018)).unwrap(), 7 << 32 | 6);
        // The first failing item stops the launch and is named.
        let err = port
            .launch(&s.gm, Grid::covering(5, 2), |w| match w.global {
                3 => w.store(VirtAddr::new(u64::MAX), &[0, 0]),
                _ => Ok(()),
            })
            .unwrap_err();
        assert_eq!((err.group, err.item), (1, 3));
        assert!(matches!(err.error, AccessError::BadAccess { .. }));
    }
}
