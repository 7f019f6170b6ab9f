//! Physical memory of one device: registered ranges, page queues, reverse map.
//!
//! A device registers ranges of local memory (`dev_register_physmem`). Free frames
//! live in a vmem [`Arena`] with a 4 KiB quantum — the same allocator type that hands out
//! virtual ranges — so the core can ask for a naturally aligned run of frames (a 2 MiB
//! block for bulk zeroing) or a single frame with the same call.
//!
//! Every frame has a small record (`FrameMeta`): its state and, when in use, its
//! reverse mapping (which address space and virtual page it backs). Frames in use sit
//! on one of three queues, doubly linked through their records by index:
//! - **active**: recently faulted in;
//! - **inactive**: aged out of the active queue, the first candidates for eviction;
//! - **wired**: pinned (caller-given or `region_map`ped), never evicted.
//!
//! A frame released while a TLB may still translate to it (an asynchronous unmap not yet
//! invalidated) is **pending**: on no queue and not in the arena until the invalidation
//! completed. The states partition the registered frames:
//! `free + active + inactive + wired + pending = registered` (checked by
//! `PhysMem::check`).
//!
//! Aging is by fault order (the core sees faults, not accessed bits): eviction takes the
//! head of the inactive queue; when the inactive queue holds less than a third of the
//! frames in use, the oldest active frames are moved to its tail first.

use crate::addr::{Pfn, PhysAddr, Vpn, PAGE_SHIFT, PAGE_SIZE};
use crate::handle::SpaceId;
use crate::mmu::FrameConstraint;
use crate::vmem::{Arena, ArenaConfig, Constraint, SpanError};
use alloc::vec::Vec;

const NIL: u32 = u32::MAX;

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
    prev: u32,
    next: u32,
    state: FrameState,
}

#[derive(Clone, Copy, Default)]
struct List {
    head: u32,
    tail: u32,
    len: u64,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
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
}

/// Why registering physical memory failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    queues: [List; 3],
    pending: u64,
    /// Set while `dev_destroy` retires the memory: no frame is handed out any more.
    retired: bool,
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
            queues: [List::EMPTY; 3],
            pending: 0,
            retired: false,
        }
    }

    /// Stop (or, with `false`, resume) handing out frames: the device is being
    /// destroyed. Returns the frames still in use (on a queue or pending); retiring
    /// succeeds only when that is 0, and then leaves the memory retired.
    pub fn retire(&mut self, retire: bool) -> u64 {
        let c = self.counts();
        let used = c.active + c.inactive + c.wired + c.pending;
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
        self.frames.resize(
            (first + pages) as usize,
            FrameMeta {
                owner: None,
                prev: NIL,
                next: NIL,
                state: FrameState::Free,
            },
        );
        Ok(())
    }

    fn index(&self, pfn: u64) -> Option<u32> {
        let pos = self.ranges.partition_point(|r| r.base_pfn <= pfn);
        let r = self.ranges.get(pos.checked_sub(1)?)?;
        (pfn < r.base_pfn + r.pages).then(|| r.first + (pfn - r.base_pfn) as u32)
    }

    fn pfn_of(&self, index: u32) -> u64 {
        let pos = self.ranges.partition_point(|r| r.first <= index);
        let r = &self.ranges[pos - 1];
        r.base_pfn + (index - r.first) as u64
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

    fn unlink(&mut self, i: u32) {
        let meta = self.frames[i as usize];
        let Some(q) = queue_of(meta.state) else {
            return;
        };
        let list = &mut self.queues[q];
        if meta.prev == NIL {
            list.head = meta.next
        } else {
            self.frames[meta.prev as usize].next = meta.next
        }
        if meta.next == NIL {
            list.tail = meta.prev
        } else {
            self.frames[meta.next as usize].prev = meta.prev
        }
        list.len -= 1;
        let m = &mut self.frames[i as usize];
        m.prev = NIL;
        m.next = NIL;
    }

    fn push_tail(&mut self, i: u32, state: FrameState) {
        let q = queue_of(state).expect("push_tail takes a queue state");
        let tail = self.queues[q].tail;
        {
            let m = &mut self.frames[i as usize];
            m.state = state;
            m.prev = tail;
            m.next = NIL;
        }
        if tail == NIL {
            self.queues[q].head = i
        } else {
            self.frames[tail as usize].next = i
        }
        self.queues[q].tail = i;
        self.queues[q].len += 1;
    }

    fn set_state(&mut self, i: u32, state: FrameState) {
        let old = self.frames[i as usize].state;
        if old == FrameState::Pending {
            self.pending -= 1;
        }
        self.unlink(i);
        match state {
            FrameState::Active | FrameState::Inactive | FrameState::Wired => {
                self.push_tail(i, state)
            }
            FrameState::Pending => {
                self.pending += 1;
                self.frames[i as usize].state = state;
            }
            FrameState::Free => self.frames[i as usize].state = state,
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
            _ => {
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
                self.arena.xalloc(&c).ok()?
            }
        };
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
        Some(Pfn(pfn))
    }

    /// Return an in-use frame to the allocator now (its mappings are gone and invalidated).
    pub fn free(&mut self, pfn: Pfn) {
        let pfn = pfn.0;
        if let Some(i) = self.index(pfn) {
            if self.frames[i as usize].state == FrameState::Free {
                return;
            }
            self.set_state(i, FrameState::Free);
            self.frames[i as usize].owner = None;
            let freed = self.arena.free(pfn << PAGE_SHIFT, PAGE_SIZE);
            debug_assert!(freed.is_ok(), "frame {pfn:#x} was not allocated: {freed:?}");
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

    /// Up to `max` eviction candidates, oldest first, after ageing the active queue.
    pub fn eviction_candidates(&mut self, max: usize) -> Vec<(Pfn, Owner)> {
        let in_use = self.queues[0].len + self.queues[1].len;
        while self.queues[1].len * 3 < in_use && self.queues[0].head != NIL {
            let i = self.queues[0].head;
            self.set_state(i, FrameState::Inactive);
        }
        let mut out = Vec::new();
        let mut i = self.queues[1].head;
        while i != NIL && out.len() < max {
            if let Some(owner) = self.frames[i as usize].owner {
                out.push((Pfn(self.pfn_of(i)), owner));
            }
            i = self.frames[i as usize].next;
        }
        if out.len() < max {
            let mut i = self.queues[0].head;
            while i != NIL && out.len() < max {
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
        if c.free + c.active + c.inactive + c.wired + c.pending != c.registered {
            return Err("free + active + inactive + wired + pending != registered");
        }
        let mut by_state = [0u64; 5];
        for m in &self.frames {
            by_state[m.state as usize] += 1;
        }
        if by_state != [c.free, c.active, c.inactive, c.wired, c.pending] {
            return Err("frame states disagree with queue lengths");
        }
        for (q, list) in self.queues.iter().enumerate() {
            let mut n = 0;
            let mut prev = NIL;
            let mut i = list.head;
            while i != NIL {
                let m = &self.frames[i as usize];
                if queue_of(m.state) != Some(q) || m.prev != prev {
                    return Err("queue link or state corrupted");
                }
                prev = i;
                i = m.next;
                n += 1;
                if n > list.len {
                    return Err("queue longer than its count");
                }
            }
            if n != list.len || prev != list.tail {
                return Err("queue length or tail mismatch");
            }
        }
        Ok(())
    }
}
