//! Physical memory of one device: registered ranges, page queues, reverse map.
//!
//! A device registers ranges of local memory (`dev_register_physmem`). Free frames
//! live in a vmem [`Arena`] with a 4 KiB quantum — the same allocator type that hands out
//! virtual ranges — so the core can ask for a naturally aligned run of frames (a 2 MiB
//! block for bulk zeroing) or a single frame with the same call.
//!
//! Every frame has a small record (`FrameMeta`): its state and, when in use, its
//! reverse mapping (which address space and virtual page it backs). Frames in use sit
//! on one of three page queues, doubly linked lists threaded through the frame records
//! by frame index (`prev`/`next`, as a kernel threads its page queues through its
//! `vm_page` array), so that any frame leaves its queue in O(1) with no pointer and no
//! atomic operation:
//! - **active**: recently faulted in, or referenced when the eviction scan looked;
//! - **inactive**: aged out of the active queue, the first candidates for eviction;
//! - **wired**: pinned (caller-given or `region_map`ped), never evicted.
//!
//! Free frames are not on a list: they live in the arena, which the core asks for
//! aligned contiguous runs (a linked free list could not answer "a free, 2 MiB-aligned
//! run of 512 frames" without a scan).
//!
//! A frame released while a TLB may still translate to it (an asynchronous unmap not yet
//! invalidated) is **pending**: on no queue and not in the arena until the invalidation
//! completed. The states partition the registered frames:
//! `free + active + inactive + wired + pending = registered` (checked by
//! `PhysMem::check`).
//!
//! Aging: when the inactive queue holds less than a third of the frames in use, the
//! oldest active frames are moved to its tail; eviction scans the inactive queue from
//! its head. Under [`EvictionPolicy::Fifo`] the head is evicted (fault order). Under
//! [`EvictionPolicy::Clock`] (second chance) the scan asks the page tables that map a
//! candidate whether it was referenced since the last look (`Mmu::test_and_clear_accessed`,
//! which also clears the bit); a referenced page goes back to the active tail
//! (`PhysMem::second_chance`), an unreferenced one is evicted. The scan itself is
//! in `space::fault` (it needs the page tables); this module keeps the queues.
//!
//! Two submodules: `extents` measures fragmentation (free blocks by order, the
//! unusable-free-space index, block use for compaction) and `groups` manages the frames
//! in page groups with driver-chosen classes.
//!
//! ## Reservations
//! Superpage reservations (Navarro et al., OSDI 2002; the idea of FreeBSD's
//! `vm_reserv.c`, rebuilt here for frames of any device memory) live in the child module
//! `reserve`: the first single-page request in an aligned 2 MiB virtual block reserves an
//! aligned 2 MiB physical block; later requests for pages of that block get the frame
//! at the same offset. Reserved frames not yet backing a page are in the fifth state,
//! **reserved**; the partition becomes
//! `free + active + inactive + wired + pending + reserved = registered`.

use crate::addr::{Pfn, PhysAddr, Vpn, PAGE_SHIFT, PAGE_SIZE};
use crate::handle::SpaceId;
use crate::mmu::FrameConstraint;
use crate::vmem::{Arena, ArenaConfig, Constraint, SpanError};
use alloc::vec::Vec;

mod extents;
mod groups;

/// One frame allocation as a device memory sees it: `pages` contiguous frames aligned
/// to `align` pages (a power of two; 1 for a run through the reservations) for the
/// pages of `space` from `vpn`, within the driver's constraint `limit`, from page
/// groups of `class` when the memory has groups. The core's side of a
/// [`crate::FrameRequest`] once the driver has answered it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunRequest {
    /// Frames wanted.
    pub pages: u64,
    /// Their alignment, in pages.
    pub align: u64,
    /// The space whose pages they back (the reverse map's owner).
    pub space: SpaceId,
    /// The first page they back.
    pub vpn: Vpn,
    /// Where the driver requires them, if anywhere.
    pub limit: Option<FrameConstraint>,
    /// Their page-group class (ignored by a memory without groups).
    pub class: u32,
}

impl RunRequest {
    /// One frame for page `vpn` of `space`.
    #[inline(always)]
    pub(crate) fn page(
        space: SpaceId,
        vpn: Vpn,
        limit: Option<FrameConstraint>,
        class: u32,
    ) -> Self {
        RunRequest {
            pages: 1,
            align: 1,
            space,
            vpn,
            limit,
            class,
        }
    }
}

pub(crate) use extents::BlockUse;
pub use extents::{FreeExtents, MAX_ORDER};
pub use groups::{GroupStats, MAX_GROUP_ORDER};
mod reserve;
pub use reserve::ReservationStats;
pub(crate) use reserve::RESERVATION_PAGES;

const NIL: u32 = u32::MAX;

/// How the core picks the page of a full device memory to evict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum EvictionPolicy {
    /// Oldest first by fault order: the head of the inactive queue, whatever its use.
    Fifo,
    /// Second chance (CLOCK) on the hardware's accessed bits: a page referenced since
    /// the scan last looked goes back to the active queue with its bit cleared. A device
    /// whose MMU keeps no accessed bits is aged FIFO.
    #[default]
    Clock,
}

/// One page queue: the frame indices of its head and tail (`NIL` when empty; the
/// frames link each other through `FrameMeta::prev`/`next`) and its length.
#[derive(Clone, Copy)]
struct PageQueue {
    head: u32,
    tail: u32,
    len: u64,
}

impl PageQueue {
    const EMPTY: PageQueue = PageQueue {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// One registered range in frame-index order: frame indices `first..` are frames
/// `base_pfn..` (chunks are kept in index order).
struct Chunk {
    first: u32,
    base_pfn: u64,
}

/// What a frame is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameState {
    /// In the arena.
    Free = 0,
    /// In use, on the active queue.
    Active = 1,
    /// In use, on the inactive queue.
    Inactive = 2,
    /// In use and pinned.
    Wired = 3,
    /// Released, waiting for its TLB invalidation before returning to the arena.
    Pending = 4,
    /// Out of the arena, held by a superpage reservation for the one page of its block
    /// it may back (see the module's section on reservations).
    Reserved = 5,
}

/// The reverse mapping of a frame in use: the page it backs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The address space.
    pub space: SpaceId,
    /// The virtual page number in that space.
    pub vpn: Vpn,
}

#[derive(Clone, Copy)]
struct FrameMeta {
    owner: Option<Owner>,
    state: FrameState,
    /// Neighbours on the frame's page queue (frame indices, `NIL` at the ends);
    /// meaningful only while the state names a queue.
    prev: u32,
    next: u32,
}

impl FrameMeta {
    const FREE: FrameMeta = FrameMeta {
        owner: None,
        state: FrameState::Free,
        prev: NIL,
        next: NIL,
    };
}

struct Range {
    base_pfn: u64,
    pages: u64,
    first: u32,
}

/// Page counts by state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameCounts {
    /// Registered frames.
    pub registered: u64,
    /// Frames in the allocator.
    pub free: u64,
    /// Frames on the active queue.
    pub active: u64,
    /// Frames on the inactive queue.
    pub inactive: u64,
    /// Wired frames.
    pub wired: u64,
    /// Frames awaiting invalidation.
    pub pending: u64,
    /// Frames held by superpage reservations for pages not populated yet.
    pub reserved: u64,
}

/// Why registering physical memory failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegisterError {
    /// `begin` or `end` is not page aligned, or `end <= begin`.
    BadRange {
        /// Start of the range.
        begin: PhysAddr,
        /// End of the range (exclusive).
        end: PhysAddr,
    },
    /// The range overlaps memory registered before.
    Overlaps {
        /// Start of the range.
        begin: PhysAddr,
    },
    /// More frames than the frame index can name (2^32 - 1 per device).
    TooLarge,
}

impl core::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RegisterError::BadRange { begin, end } => {
                write!(f, "[{begin}, {end}) is empty or not page aligned")
            }
            RegisterError::Overlaps { begin } => {
                write!(f, "range at {begin} overlaps memory registered before")
            }
            RegisterError::TooLarge => f.write_str("more frames than a device can name"),
        }
    }
}

impl core::error::Error for RegisterError {}

/// The local physical memory of one device.
pub(crate) struct PhysMem {
    arena: Arena,
    ranges: Vec<Range>,
    frames: Vec<FrameMeta>,
    /// Active, inactive, wired.
    queues: [PageQueue; 3],
    /// One chunk per registered range, in frame-index order.
    chunks: Vec<Chunk>,
    pending: u64,
    /// Superpage reservations (`reserve`).
    reservations: reserve::Reservations,
    policy: EvictionPolicy,
    /// Set while `dev_destroy` retires the memory: no frame is handed out any more.
    retired: bool,
    /// Page groups, when the driver asked for them (`groups`).
    groups: Option<groups::Groups>,
}

fn queue_of(state: FrameState) -> Option<usize> {
    match state {
        FrameState::Active => Some(0),
        FrameState::Inactive => Some(1),
        FrameState::Wired => Some(2),
        _ => None,
    }
}

impl PhysMem {
    pub fn new() -> PhysMem {
        let arena = Arena::new(ArenaConfig::new(PAGE_SIZE), None)
            .expect("a 4 KiB quantum is a valid arena configuration");
        PhysMem {
            arena,
            ranges: Vec::new(),
            frames: Vec::new(),
            queues: [PageQueue::EMPTY; 3],
            chunks: Vec::new(),
            pending: 0,
            reservations: reserve::Reservations::default(),
            policy: EvictionPolicy::default(),
            retired: false,
            groups: None,
        }
    }

    /// The eviction policy of this memory.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Set the eviction policy of this memory.
    pub fn set_policy(&mut self, policy: EvictionPolicy) {
        self.policy = policy;
    }

    /// Stop (or, with `false`, resume) handing out frames: the device is being
    /// destroyed. Returns the frames still in use (on a queue or pending); retiring
    /// succeeds only when that is 0, and then leaves the memory retired.
    pub fn retire(&mut self, retire: bool) -> u64 {
        let c = self.counts();
        let used = c.active + c.inactive + c.wired + c.pending + c.reserved;
        self.retired = retire && used == 0;
        used
    }

    /// Whether [`PhysMem::retire`] retired the memory.
    pub fn is_retired(&self) -> bool {
        self.retired
    }

    /// Add `[begin, end)` to the device's memory.
    pub fn register(&mut self, begin: PhysAddr, end: PhysAddr) -> Result<(), RegisterError> {
        let bad = RegisterError::BadRange { begin, end };
        if !begin.is_page_aligned() || !end.is_page_aligned() || end <= begin {
            return Err(bad);
        }
        let pages = (end.as_u64() - begin.as_u64()) >> PAGE_SHIFT;
        let first = self.frames.len() as u64;
        if first + pages >= NIL as u64 {
            return Err(RegisterError::TooLarge);
        }
        let base_pfn = begin.as_u64() >> PAGE_SHIFT;
        if self
            .ranges
            .iter()
            .any(|r| base_pfn < r.base_pfn + r.pages && r.base_pfn < base_pfn + pages)
        {
            return Err(RegisterError::Overlaps { begin });
        }
        match self
            .arena
            .add_span(begin.as_u64(), end.as_u64() - begin.as_u64())
        {
            Ok(()) => {}
            Err(SpanError::Overlaps { .. }) => return Err(RegisterError::Overlaps { begin }),
            Err(_) => return Err(bad),
        }
        let pos = self.ranges.partition_point(|r| r.base_pfn < base_pfn);
        self.ranges.insert(
            pos,
            Range {
                base_pfn,
                pages,
                first: first as u32,
            },
        );
        self.frames
            .resize((first + pages) as usize, FrameMeta::FREE);
        self.chunks.push(Chunk {
            first: first as u32,
            base_pfn,
        });
        if let Some(g) = self.groups.as_mut() {
            g.add_range(first as u32, base_pfn, pages);
        }
        Ok(())
    }

    fn chunk_of(&self, index: u32) -> &Chunk {
        let pos = self.chunks.partition_point(|c| c.first <= index);
        &self.chunks[pos - 1]
    }

    fn index(&self, pfn: u64) -> Option<u32> {
        let pos = self.ranges.partition_point(|r| r.base_pfn <= pfn);
        let r = self.ranges.get(pos.checked_sub(1)?)?;
        (pfn < r.base_pfn + r.pages).then(|| r.first + (pfn - r.base_pfn) as u32)
    }

    fn pfn_of(&self, index: u32) -> u64 {
        let c = self.chunk_of(index);
        c.base_pfn + (index - c.first) as u64
    }

    /// Whether `pfn` is a registered frame of this device.
    pub fn contains(&self, pfn: Pfn) -> bool {
        self.index(pfn.0).is_some()
    }

    /// The state of a registered frame.
    pub fn state(&self, pfn: Pfn) -> Option<FrameState> {
        self.index(pfn.0).map(|i| self.frames[i as usize].state)
    }

    /// The reverse mapping of a frame in use.
    pub fn owner(&self, pfn: Pfn) -> Option<Owner> {
        self.index(pfn.0)
            .and_then(|i| self.frames[i as usize].owner)
    }

    /// Take frame `i` off the queue its state names (every state change goes through
    /// `set_state`, which links and unlinks in step; `check` verifies the links).
    fn unlink(&mut self, i: u32) {
        let Some(q) = queue_of(self.frames[i as usize].state) else {
            return;
        };
        let FrameMeta { prev, next, .. } = self.frames[i as usize];
        match prev {
            NIL => self.queues[q].head = next,
            p => self.frames[p as usize].next = next,
        }
        match next {
            NIL => self.queues[q].tail = prev,
            n => self.frames[n as usize].prev = prev,
        }
        let m = &mut self.frames[i as usize];
        m.prev = NIL;
        m.next = NIL;
        self.queues[q].len -= 1;
    }

    /// Put frame `i` (on no queue now) at the tail of the queue of `state`.
    #[inline]
    fn push_tail(&mut self, i: u32, state: FrameState) {
        let q = queue_of(state).expect("push_tail takes a queue state");
        let tail = self.queues[q].tail;
        let m = &mut self.frames[i as usize];
        m.state = state;
        m.prev = tail;
        m.next = NIL;
        self.link_tail(q, tail, i);
    }

    /// The rest of a push of frame `i` at the tail of queue `q` (whose tail was
    /// `tail`), once the frame's own state and links are written (`prev = tail`,
    /// `next = NIL`): the old tail (or the head) points to it, it is the tail.
    #[inline]
    fn link_tail(&mut self, q: usize, tail: u32, i: u32) {
        match tail {
            NIL => self.queues[q].head = i,
            t => self.frames[t as usize].next = i,
        }
        self.queues[q].tail = i;
        self.queues[q].len += 1;
    }

    #[inline]
    fn set_state(&mut self, i: u32, state: FrameState) {
        let old = self.frames[i as usize].state;
        if self.groups.is_some() {
            let pfn = self.pfn_of(i);
            if let Some(g) = self.groups.as_mut() {
                g.on_state(pfn, old, state);
            }
        }
        match old {
            FrameState::Pending => self.pending -= 1,
            FrameState::Active | FrameState::Inactive | FrameState::Wired => self.unlink(i),
            // Free and reserved frames are on no queue.
            FrameState::Free | FrameState::Reserved => {}
        }
        match state {
            FrameState::Active | FrameState::Inactive | FrameState::Wired => {
                self.push_tail(i, state)
            }
            FrameState::Pending => {
                self.pending += 1;
                self.frames[i as usize].state = state;
            }
            FrameState::Free | FrameState::Reserved => self.frames[i as usize].state = state,
        }
    }

    /// Allocate `pages` contiguous frames aligned to `align_pages` (a power of two), put
    /// them on the active (or wired) queue with their owners `space`, `vpn..vpn+pages`.
    /// Returns the first frame number, or `None` when no such run is free.
    pub fn alloc_run(
        &mut self,
        pages: u64,
        align_pages: u64,
        space: SpaceId,
        vpn: Vpn,
        wired: bool,
        limit: Option<FrameConstraint>,
    ) -> Option<Pfn> {
        if self.retired {
            return None;
        }
        let pa = match limit {
            None if pages == 1 => self.arena.alloc(PAGE_SIZE).ok()?,
            _ => self.constrained_alloc(pages, align_pages, limit, 0, u64::MAX >> PAGE_SHIFT)?,
        };
        Some(self.take_run(pa, pages, space, vpn, wired))
    }

    /// Take `pages` frames aligned to `align_pages` from the arena, within the driver's
    /// `limit` and within frames `[lo, hi)`; returns the physical address.
    fn constrained_alloc(
        &mut self,
        pages: u64,
        align_pages: u64,
        limit: Option<FrameConstraint>,
        lo: u64,
        hi: u64,
    ) -> Option<u64> {
        let mut c = Constraint::new(pages << PAGE_SHIFT);
        c.align = align_pages << PAGE_SHIFT;
        if let Some(l) = limit {
            if pages > 1 && l.phase % c.align.max(1) != 0 {
                return None;
            }
            if l.align > c.align {
                c.align = l.align;
                c.phase = l.phase;
            }
            c.nocross = l.nocross;
            c.min = l.min.as_u64();
            c.max = l.max.as_u64();
        }
        c.min = c.min.max(lo << PAGE_SHIFT);
        if hi < u64::MAX >> PAGE_SHIFT {
            c.max = c.max.min((hi << PAGE_SHIFT).checked_sub(1)?);
        }
        if c.min > c.max {
            return None;
        }
        self.arena.xalloc(&c).ok()
    }

    /// Frames `[pa, pa + pages)`, just taken from the arena as one segment, become
    /// single frames on the active (or wired) queue owned by `space`, `vpn..`.
    fn take_run(&mut self, pa: u64, pages: u64, space: SpaceId, vpn: Vpn, wired: bool) -> Pfn {
        if pages > 1 {
            let split = self.arena.split(pa, pages << PAGE_SHIFT, PAGE_SIZE);
            debug_assert!(split.is_ok(), "a fresh run splits into frames: {split:?}");
        }
        let pfn = pa >> PAGE_SHIFT;
        let state = if wired {
            FrameState::Wired
        } else {
            FrameState::Active
        };
        for k in 0..pages {
            let i = self
                .index(pfn + k)
                .expect("the arena hands out registered frames only");
            self.frames[i as usize].owner = Some(Owner {
                space,
                vpn: vpn.add(k),
            });
            self.set_state(i, state);
        }
        Pfn(pfn)
    }

    /// Return an in-use frame to the allocator now (its mappings are gone and invalidated).
    pub fn free(&mut self, pfn: Pfn) {
        let pfn = pfn.0;
        if let Some(i) = self.index(pfn) {
            if matches!(
                self.frames[i as usize].state,
                FrameState::Free | FrameState::Reserved
            ) {
                return;
            }
            self.frames[i as usize].owner = None;
            if self.reservation_take_back(i) {
                return;
            }
            self.set_state(i, FrameState::Free);
            let freed = self.arena.free(pfn << PAGE_SHIFT, PAGE_SIZE);
            debug_assert!(freed.is_ok(), "frame {pfn:#x} was not allocated: {freed:?}");
        }
    }

    /// Return `pages` in-use frames from `pfn` to the allocator now (their mappings are
    /// gone and invalidated), in one arena operation when they are adjacent
    /// allocations (a migrated or evicted run).
    pub fn free_run(&mut self, pfn: Pfn, pages: u64) {
        let in_use = |p: &PhysMem, k: u64| {
            p.index(pfn.0 + k)
                .is_some_and(|i| p.frames[i as usize].state != FrameState::Free)
        };
        // Frames of a reservation go back to it, one by one (`free`).
        let reserved = (0..pages).any(|k| self.reservation_at(pfn.0 + k).is_some());
        if pages < 2 || reserved || !(0..pages).all(|k| in_use(self, k)) {
            for k in 0..pages {
                self.free(pfn.add(k));
            }
            return;
        }
        for k in 0..pages {
            let i = self.index(pfn.0 + k).expect("checked above");
            self.set_state(i, FrameState::Free);
            self.frames[i as usize].owner = None;
        }
        let pa = pfn.0 << PAGE_SHIFT;
        if self
            .arena
            .free_run(pa, pages << PAGE_SHIFT, PAGE_SIZE)
            .is_err()
        {
            // Not one segment per frame side by side (cannot happen for frames handed
            // out by `take_run`, but the arena's answer is the authority): one by one.
            for k in 0..pages {
                let freed = self.arena.free(pa + (k << PAGE_SHIFT), PAGE_SIZE);
                debug_assert!(freed.is_ok(), "frame {:#x} was not allocated", pfn.0 + k);
            }
        }
    }

    /// Take an in-use frame off its queue until its invalidation completed.
    pub fn quarantine(&mut self, pfn: Pfn) {
        let pfn = pfn.0;
        if let Some(i) = self.index(pfn) {
            if matches!(
                self.frames[i as usize].state,
                FrameState::Active | FrameState::Inactive | FrameState::Wired
            ) {
                self.frames[i as usize].owner = None;
                self.set_state(i, FrameState::Pending);
            }
        }
    }

    /// Move a frame to the tail of the active queue (it was just used).
    pub fn touch(&mut self, pfn: Pfn) {
        let pfn = pfn.0;
        if let Some(i) = self.index(pfn) {
            if matches!(
                self.frames[i as usize].state,
                FrameState::Active | FrameState::Inactive
            ) {
                self.set_state(i, FrameState::Active);
            }
        }
    }

    /// Pin (`true`) or unpin an in-use frame: wired frames are never evicted.
    pub fn set_wired(&mut self, pfn: Pfn, wired: bool) {
        if let Some(i) = self.index(pfn.0) {
            match (self.frames[i as usize].state, wired) {
                (FrameState::Active | FrameState::Inactive, true) => {
                    self.set_state(i, FrameState::Wired)
                }
                (FrameState::Wired, false) => self.set_state(i, FrameState::Active),
                _ => {}
            }
        }
    }

    /// Give an evictable frame a second chance: it was referenced, so it goes to the
    /// tail of the active queue. Returns whether the frame was on the active or
    /// inactive queue (wired, pending and free frames are left alone).
    pub fn second_chance(&mut self, pfn: Pfn) -> bool {
        match self.index(pfn.0) {
            Some(i)
                if matches!(
                    self.frames[i as usize].state,
                    FrameState::Active | FrameState::Inactive
                ) =>
            {
                self.set_state(i, FrameState::Active);
                true
            }
            _ => false,
        }
    }

    /// Frames on the active and inactive queues (the ones eviction may take).
    pub fn evictable(&self) -> u64 {
        self.queues[0].len + self.queues[1].len
    }

    /// Up to `max` eviction candidates, oldest first, after ageing the active queue.
    pub fn eviction_candidates(&mut self, max: usize) -> Vec<(Pfn, Owner)> {
        let in_use = self.queues[0].len + self.queues[1].len;
        while self.queues[1].len * 3 < in_use {
            let i = self.queues[0].head;
            if i == NIL {
                break;
            }
            self.set_state(i, FrameState::Inactive);
        }
        let mut out = Vec::new();
        for q in [1, 0] {
            let mut i = self.queues[q].head;
            while i != NIL {
                if out.len() >= max {
                    return out;
                }
                if let Some(owner) = self.frames[i as usize].owner {
                    out.push((Pfn(self.pfn_of(i)), owner));
                }
                i = self.frames[i as usize].next;
            }
        }
        out
    }

    /// Frame counts by state.
    pub fn counts(&self) -> FrameCounts {
        let s = self.arena.stats();
        FrameCounts {
            registered: self.frames.len() as u64,
            free: s.free >> PAGE_SHIFT,
            active: self.queues[0].len,
            inactive: self.queues[1].len,
            wired: self.queues[2].len,
            pending: self.pending,
            reserved: self.reservations.reserved_frames(),
        }
    }

    /// Frames in use (on a queue), with their owners.
    pub fn in_use(&self) -> impl Iterator<Item = (Pfn, FrameState, Option<Owner>)> + '_ {
        self.frames.iter().enumerate().filter_map(|(i, m)| {
            queue_of(m.state).map(|_| (Pfn(self.pfn_of(i as u32)), m.state, m.owner))
        })
    }

    /// Check the queue invariants; returns a description of the first violation.
    pub fn check(&self) -> Result<(), &'static str> {
        let c = self.counts();
        if c.free + c.active + c.inactive + c.wired + c.pending + c.reserved != c.registered {
            return Err("free + active + inactive + wired + pending + reserved != registered");
        }
        let mut by_state = [0u64; 6];
        for m in &self.frames {
            by_state[m.state as usize] += 1;
        }
        if by_state != [c.free, c.active, c.inactive, c.wired, c.pending, c.reserved] {
            return Err("frame states disagree with queue lengths");
        }
        for (q, queue) in self.queues.iter().enumerate() {
            let mut n = 0;
            let (mut prev, mut i) = (NIL, queue.head);
            while i != NIL {
                let m = self
                    .frames
                    .get(i as usize)
                    .ok_or("queue link names no frame")?;
                if queue_of(m.state) != Some(q) || m.prev != prev {
                    return Err("queue link or state corrupted");
                }
                n += 1;
                if n > queue.len {
                    return Err("queue longer than its count");
                }
                (prev, i) = (i, m.next);
            }
            if n != queue.len || queue.tail != prev {
                return Err("queue length or tail mismatch");
            }
        }
        self.check_groups().and_then(|()| self.check_reservations())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> SpaceId {
        SpaceId {
            index: 0,
            generation: 1,
        }
    }

    /// The frames of queue `q` from head to tail, following the links.
    fn order(p: &PhysMem, q: usize) -> Vec<u64> {
        let mut out = Vec::new();
        let mut i = p.queues[q].head;
        while i != NIL {
            out.push(p.pfn_of(i));
            i = p.frames[i as usize].next;
        }
        out
    }

    #[test]
    fn queues_link_by_index_and_unlink_any_frame_in_order() {
        let mut p = PhysMem::new();
        p.set_reservations(false);
        // Two registered ranges: frame indices run on across them.
        p.register(PhysAddr::new(0x10_0000), PhysAddr::new(0x10_3000))
            .unwrap();
        p.register(PhysAddr::new(0x40_0000), PhysAddr::new(0x40_2000))
            .unwrap();
        let frames: Vec<u64> = (0..5)
            .map(|k| p.alloc_run(1, 1, space(), Vpn(k), false, None).unwrap().0)
            .collect();
        assert_eq!(order(&p, 0), frames);
        // From the middle, the head and the tail: each leaves in O(1) and the rest
        // keep their order.
        p.touch(Pfn(frames[2]));
        assert_eq!(
            order(&p, 0),
            [frames[0], frames[1], frames[3], frames[4], frames[2]]
        );
        p.set_wired(Pfn(frames[0]), true);
        p.quarantine(Pfn(frames[2]));
        assert_eq!(order(&p, 0), [frames[1], frames[3], frames[4]]);
        assert_eq!(order(&p, 2), [frames[0]]);
        p.free(Pfn(frames[4]));
        p.set_wired(Pfn(frames[0]), false);
        assert_eq!(order(&p, 0), [frames[1], frames[3], frames[0]]);
        assert_eq!(order(&p, 2), Vec::<u64>::new());
        p.check().unwrap();
        // Ageing moves the oldest active frames to the inactive queue, oldest first.
        let c = p.eviction_candidates(8);
        assert_eq!(c.first().map(|(f, _)| f.0), Some(frames[1]));
        assert_eq!(c.len(), 3);
        p.check().unwrap();
        let counts = p.counts();
        assert_eq!((counts.active + counts.inactive, counts.pending), (3, 1));
    }
}
