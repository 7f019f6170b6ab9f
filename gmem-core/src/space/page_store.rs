//! The page store (FreeBSD's `vm_object` and its pages): one owned part of a space's
//! state. It owns what each page of the space *holds* — the logical page table (where
//! each page lives, in which memory, with which flags, and which tables map it), the
//! list of memories page entries name, the device-private frames some tables map
//! instead of a page's shared frame, and the read-only copies of read-mostly pages
//! (`duplicate`) — and the frame accounting that goes with them.
//!
//! Its own invariant (DESIGN.md's 2), checked by [`PageStore::check_frames`]: every
//! frame a page entry, a private frame or a read copy names is an in-use frame of its memory whose
//! reverse mapping points back at that page of this space (a caller-given frame lies
//! outside managed memory instead), every memory's queues partition its frames, and
//! the space owns no frame it does not name.
//!
//! The mapping bits of an entry are the translation side's to keep true and the
//! region a page belongs to is the region map's; the invariants that join them are in
//! `check`. The logical page table and the memories stay reachable by the other
//! modules of the space as fields (`store.lpt`, `store.memories`): the fault path edits
//! entries while it reads a memory, and those are disjoint borrows of two fields.

use super::memories::{Memories, TooManyMemories};
use crate::addr::{Pfn, Vpn};
use crate::device::DeviceInner;
use crate::handle::{DeviceId, SpaceId};
use crate::lpt::{LogicalPageTable, PageEntry, EXTERNAL, NO_MEM, PENDING};
use crate::physmem::FrameState;
use crate::space::violation::{fail, Violation};
use crate::sync::Arc;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;

/// The private frames of one space: (slot, page) → (memory index, frame).
#[derive(Default)]
pub(crate) struct PrivateFrames {
    frames: BTreeMap<(usize, u64), (u8, Pfn)>,
}

impl PrivateFrames {
    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Whether attachment `slot` has a private frame for page `vpn`.
    pub fn contains(&self, slot: usize, vpn: Vpn) -> bool {
        self.frames.contains_key(&(slot, vpn.0))
    }

    /// The private frame of attachment `slot` for page `vpn`: (memory index, frame).
    pub fn get(&self, slot: usize, vpn: Vpn) -> Option<(u8, Pfn)> {
        self.frames.get(&(slot, vpn.0)).copied()
    }

    /// Record frame `pfn` of memory `mem` as `slot`'s private frame for `vpn`.
    pub fn insert(&mut self, slot: usize, vpn: Vpn, mem: u8, pfn: Pfn) {
        self.frames.insert((slot, vpn.0), (mem, pfn));
    }

    /// Forget `slot`'s private frame for `vpn`, returning it.
    pub fn remove(&mut self, slot: usize, vpn: Vpn) -> Option<(u8, Pfn)> {
        self.frames.remove(&(slot, vpn.0))
    }

    /// The private frames of the pages `[first, first + pages)`, of every slot.
    pub fn in_range(&self, first: Vpn, pages: u64) -> Vec<(usize, Vpn)> {
        if self.frames.is_empty() {
            return Vec::new();
        }
        self.frames
            .keys()
            .filter(|&&(_, v)| v >= first.0 && v < first.0 + pages)
            .map(|&(s, v)| (s, Vpn(v)))
            .collect()
    }

    /// The private frames of attachment `slot`.
    pub fn of_slot(&self, slot: usize) -> Vec<(usize, Vpn)> {
        self.frames
            .keys()
            .filter(|&&(s, _)| s == slot)
            .map(|&(s, v)| (s, Vpn(v)))
            .collect()
    }

    /// Every private frame: `(slot, page, memory index, frame)`.
    pub fn iter(&self) -> impl Iterator<Item = (usize, Vpn, u8, Pfn)> + '_ {
        self.frames
            .iter()
            .map(|(&(s, v), &(m, p))| (s, Vpn(v), m, p))
    }
}

/// One read-only copy of a read-mostly page (read duplication, `duplicate`): table
/// `table` maps frame `pfn` of memory `mem` instead of the page's shared frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadCopy {
    /// The table that maps the copy.
    pub table: u8,
    /// The memory (an index of the space's memory list) holding it.
    pub mem: u8,
    /// Its frame.
    pub pfn: Pfn,
}

/// The copies of one duplicated page, and the tables that map its shared frame
/// read-only while they exist.
#[derive(Clone, Debug, Default)]
pub(crate) struct Duplicated {
    /// Tables whose mapping of the shared frame the duplication path made read-only
    /// (the page's mapping bits must lie inside this mask).
    pub read_only: u32,
    /// The copies, at most one per table.
    pub copies: Vec<ReadCopy>,
}

/// The read-only copies of a space's duplicated pages, by page, and the order they
/// were made in (memory pressure drops the oldest first).
#[derive(Default)]
pub(crate) struct ReadCopies {
    pages: BTreeMap<u64, Duplicated>,
    /// `(page, table, memory)` of each copy made, oldest first; entries of copies
    /// already dropped are skipped (and pruned) by [`ReadCopies::oldest_in`].
    order: VecDeque<(u64, u8, u8)>,
}

impl ReadCopies {
    /// Whether no page has copies.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// The copies of page `vpn`, if it has any.
    pub fn get(&self, vpn: Vpn) -> Option<&Duplicated> {
        self.pages.get(&vpn.0)
    }

    /// The copies of page `vpn`, created empty if absent.
    pub fn entry(&mut self, vpn: Vpn) -> &mut Duplicated {
        self.pages.entry(vpn.0).or_default()
    }

    /// Forget the copies of page `vpn`, returning them.
    pub fn remove(&mut self, vpn: Vpn) -> Option<Duplicated> {
        let d = self.pages.remove(&vpn.0);
        if self.pages.is_empty() {
            self.order.clear();
        }
        d
    }

    /// Record copy `c` of page `vpn`.
    pub fn push(&mut self, vpn: Vpn, c: ReadCopy) {
        self.pages.entry(vpn.0).or_default().copies.push(c);
        self.order.push_back((vpn.0, c.table, c.mem));
    }

    /// Forget table `t`'s copy of page `vpn` (the page keeps its other copies),
    /// returning it.
    pub fn remove_one(&mut self, vpn: Vpn, t: u8) -> Option<ReadCopy> {
        let d = self.pages.get_mut(&vpn.0)?;
        let i = d.copies.iter().position(|c| c.table == t)?;
        Some(d.copies.swap_remove(i))
    }

    /// The oldest live copy held in memory `mem`: `(page, table, copies the page
    /// has)`. Entries of dropped copies met on the way are pruned.
    pub fn oldest_in(&mut self, mem: u8) -> Option<(Vpn, u8, usize)> {
        let mut i = 0;
        while i < self.order.len() {
            let (v, t, m) = self.order[i];
            let live = self.pages.get(&v).and_then(|d| {
                d.copies
                    .iter()
                    .find(|c| c.table == t)
                    .map(|c| (c.mem, d.copies.len()))
            });
            match live {
                Some((cm, n)) if cm == m => {
                    if m == mem {
                        self.order.remove(i);
                        return Some((Vpn(v), t, n));
                    }
                    i += 1;
                }
                _ => {
                    self.order.remove(i);
                }
            }
        }
        None
    }

    /// The table `t`'s copy of page `vpn`, if any.
    pub fn in_table(&self, t: usize, vpn: Vpn) -> Option<ReadCopy> {
        self.pages
            .get(&vpn.0)
            .and_then(|d| d.copies.iter().find(|c| usize::from(c.table) == t).copied())
    }

    /// The duplicated pages of `[first, first + pages)`.
    pub fn in_range(&self, first: Vpn, pages: u64) -> Vec<Vpn> {
        if self.pages.is_empty() {
            return Vec::new();
        }
        self.pages
            .range(first.0..first.0.saturating_add(pages))
            .map(|(&v, _)| Vpn(v))
            .collect()
    }

    /// Whether any page of `[first, first + pages)` has copies (no allocation: the
    /// question `map_run` asks on every install once any copy exists).
    #[inline]
    pub fn any_in(&self, first: Vpn, pages: u64) -> bool {
        !self.pages.is_empty()
            && self
                .pages
                .range(first.0..first.0.saturating_add(pages))
                .next()
                .is_some()
    }

    /// The duplicated pages with a copy in memory `mem`.
    pub fn in_memory(&self, mem: u8) -> Vec<Vpn> {
        self.pages
            .iter()
            .filter(|(_, d)| d.copies.iter().any(|c| c.mem == mem))
            .map(|(&v, _)| Vpn(v))
            .collect()
    }

    /// Every duplicated page.
    pub fn all(&self) -> Vec<Vpn> {
        self.pages.keys().map(|&v| Vpn(v)).collect()
    }

    /// Every duplicated page with its copies.
    pub fn iter(&self) -> impl Iterator<Item = (Vpn, &Duplicated)> + '_ {
        self.pages.iter().map(|(&v, d)| (Vpn(v), d))
    }
}

/// The page store of one space (see the module header).
pub(crate) struct PageStore {
    /// The logical page table: where each page lives and which tables map it.
    pub(super) lpt: LogicalPageTable,
    /// Memories frames of this space live in; an entry's `mem` indexes this list.
    pub(super) memories: Memories,
    /// Device-private frames (`private`).
    pub(super) private: PrivateFrames,
    /// Read-only copies of read-mostly pages (`duplicate`).
    pub(super) copies: ReadCopies,
}

impl PageStore {
    pub(super) fn new(host: Arc<DeviceInner>) -> PageStore {
        PageStore {
            lpt: LogicalPageTable::default(),
            memories: Memories::new(host),
            private: PrivateFrames::default(),
            copies: ReadCopies::default(),
        }
    }

    /// How many pages of the space have their frame in device `dev`'s memory.
    pub fn pages_in_memory(&self, dev: DeviceId) -> u64 {
        let Some(m) = self.memories.position(dev) else {
            return 0;
        };
        self.lpt
            .iter()
            .filter(|(_, e)| e.is_populated() && e.mem == m)
            .count() as u64
    }

    /// Index of `dev` in the memory list, adding it if needed.
    #[inline]
    pub fn mem_index(&mut self, dev: &Arc<DeviceInner>) -> Result<u8, TooManyMemories> {
        self.memories.index_of(dev)
    }

    /// Forget the memory of device `id` (destroyed; no page names it).
    pub fn forget_memory(&mut self, id: DeviceId) {
        self.memories.forget(id);
    }

    /// Give a page's frame back to its memory (or quarantine it until its
    /// invalidation). Caller-given frames and absent pages have none of ours.
    pub fn release_frame(&self, e: &PageEntry, pending: bool) {
        if e.mem == NO_MEM || e.has(EXTERNAL) {
            return;
        }
        let mut phys = self.memories.get(e.mem).phys.lock();
        if pending {
            phys.quarantine(e.pfn)
        } else {
            phys.free(e.pfn)
        }
    }

    /// Whether any page of `[first, first+pages)` has a queued unmap or map.
    pub fn any_pending(&self, first: Vpn, pages: u64) -> bool {
        self.lpt
            .entries_in(first, pages)
            .any(|(_, e)| e.has(PENDING))
    }

    /// Check the page store's own invariant (module header) for space `id`.
    pub fn check_frames(&self, id: SpaceId) -> Result<(), Violation> {
        let mut owned: Vec<(u8, Pfn)> = Vec::new();
        for (Vpn(vpn), e) in self.lpt.iter() {
            if !e.is_populated() {
                continue;
            }
            let Some(memory) = self.memories.try_get(e.mem) else {
                return fail("page names an unknown memory", Some(vpn));
            };
            let phys = memory.phys.lock();
            if e.has(EXTERNAL) {
                if phys.contains(e.pfn) {
                    return fail("caller-given frame lies in managed memory", Some(vpn));
                }
                continue;
            }
            match phys.state(e.pfn) {
                Some(FrameState::Active | FrameState::Inactive | FrameState::Wired) => {}
                _ => return fail("page's frame is not in use", Some(vpn)),
            }
            match phys.owner(e.pfn) {
                Some(o) if o.space == id && o.vpn == Vpn(vpn) => {}
                _ => return fail("frame's reverse mapping does not point back", Some(vpn)),
            }
            owned.push((e.mem, e.pfn));
        }
        for (_, vpn, mem, pfn) in self.private.iter() {
            let Some(memory) = self.memories.try_get(mem) else {
                return fail("private frame names an unknown memory", Some(vpn.0));
            };
            let phys = memory.phys.lock();
            if phys.state(pfn) != Some(FrameState::Wired) {
                return fail("private frame is not wired", Some(vpn.0));
            }
            match phys.owner(pfn) {
                Some(o) if o.space == id && o.vpn == vpn => {}
                _ => {
                    return fail(
                        "private frame's reverse mapping does not point back",
                        Some(vpn.0),
                    )
                }
            }
            owned.push((mem, pfn));
        }
        for (vpn, d) in self.copies.iter() {
            for c in &d.copies {
                let Some(memory) = self.memories.try_get(c.mem) else {
                    return fail("read copy names an unknown memory", Some(vpn.0));
                };
                let phys = memory.phys.lock();
                if phys.state(c.pfn) != Some(FrameState::Wired) {
                    return fail("read copy's frame is not wired", Some(vpn.0));
                }
                match phys.owner(c.pfn) {
                    Some(o) if o.space == id && o.vpn == vpn => {}
                    _ => {
                        return fail(
                            "read copy's reverse mapping does not point back",
                            Some(vpn.0),
                        )
                    }
                }
                owned.push((c.mem, c.pfn));
            }
        }
        // The space owns exactly the frames it names; every memory's queues are sound.
        for (m, dev) in self.memories.iter() {
            let phys = dev.phys.lock();
            if let Err(what) = phys.check() {
                return fail(what, None);
            }
            let mine = phys
                .in_use()
                .filter(|(_, _, o)| o.is_some_and(|o| o.space == id))
                .count();
            let named = owned.iter().filter(|(mem, _)| *mem == m).count();
            if mine != named {
                return fail(
                    "space owns frames its logical page table does not name",
                    None,
                );
            }
        }
        Ok(())
    }
}
