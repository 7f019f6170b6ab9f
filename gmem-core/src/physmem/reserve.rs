//! Superpage reservations: contiguity-conserving frame allocation for one device memory.
//!
//! ## Theory
//! The idea is Navarro, Iyer, Druschel and Cox's (OSDI 2002), as FreeBSD's `vm_reserv.c`
//! keeps it; this is a rebuild from the paper's description for the core's frames, not
//! a port. A 2 MiB virtual block is usually populated a page at a time (4 KiB faults,
//! migrations, evictions coming back). Taking each page's frame from anywhere scatters
//! the block over physical memory, and no large leaf can ever map it. Instead:
//! - the first single-page request of a space for a page of an aligned block of
//!   [`RESERVATION_PAGES`] pages *reserves* an aligned block of as many frames (when the
//!   arena has one free) and gives the page the frame at its offset in the block;
//! - every later request for a page of that block gets the frame at the page's offset,
//!   as long as that frame is still reserved, so a block that fills is VA→PA contiguous
//!   and 2 MiB aligned in both spaces, and the core may map it with one large leaf;
//! - a frame of a reservation that is freed goes back to the reservation (its page may
//!   come back: an eviction returning, a migration back), not to the arena; a
//!   reservation whose frames are all back is dissolved (its block returns to the arena);
//! - a reservation whose every frame backs its page is *filled* and stays: when one of
//!   its pages moves out (a migration, an eviction) its frame waits in the reservation
//!   for the page to come back, so the block is whole and contiguous again and can be
//!   mapped large again. A request for a whole aligned block makes a filled
//!   reservation at once;
//! - under memory pressure (an allocation the arena cannot serve) the oldest
//!   reservation is *broken*: its still-reserved frames return to the arena, the frames
//!   in use stay with their pages as ordinary frames (FreeBSD breaks the least recently
//!   *created* reservation first, too; it also keeps partially populated reservations on
//!   an LRU list, which this rebuild does not: age is creation order).
//!
//! Requests with a driver constraint ([`crate::FrameConstraint`]) bypass reservations
//! (the driver's placement wins), as do requests when reservations are disabled for the
//! memory ([`crate::Gmem::dev_set_reservations`]).
//!
//! ## Invariants (`PhysMem::check_reservations`)
//! Every frame of a reservation is reserved, pending (waiting for an invalidation) or in
//! use by exactly the page at its offset of the reservation's block in the
//! reservation's space; the reservation's count of used frames is the number of frames
//! that are not reserved; the reserved frames of all reservations are the memory's
//! frames in the reserved state; the three indexes (by block, by frame, by age) agree
//! and name exactly the live records of the slab; the memo names a live block.
//! A live reservation's block is one allocated segment of the arena (split into frames
//! lazily: only when the reservation is broken with frames in use).

use super::{queue_of, FrameState, Owner, PhysMem, NIL};
use crate::addr::{Pfn, Vpn, PAGE_SHIFT, PAGE_SIZE};
use crate::handle::SpaceId;
use crate::mmu::FrameConstraint;
use crate::vmem::Constraint;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;

/// Pages of one reservation: a 2 MiB block.
pub(crate) const RESERVATION_PAGES: u64 = 512;

/// Counters of one memory's reservations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReservationStats {
    /// Reservations live now.
    pub live: u64,
    /// Reservations made (an aligned block taken from the arena).
    pub made: u64,
    /// Reservations that filled (every frame backs its page; counted each time).
    pub filled: u64,
    /// Reservations broken under memory pressure (oldest first).
    pub broken: u64,
    /// Reservations dissolved because every frame came back unused.
    pub dissolved: u64,
    /// Frames returned to the arena by breaking reservations.
    pub frames_returned: u64,
    /// Frames handed out from a reservation (its first page's included).
    pub frames_served: u64,
    /// Single-frame requests that could not be served from a reservation (no aligned
    /// block free, or the frame at the page's offset was busy) and took any frame.
    pub fallbacks: u64,
}

/// One reservation.
#[derive(Clone, Copy, Debug)]
struct Resv {
    /// First frame of the physical block.
    base: u64,
    space: SpaceId,
    /// First page of the virtual block.
    block: u64,
    /// Frames not in the reserved state (in use or pending).
    used: u64,
    /// Creation order (smaller = older).
    age: u64,
    /// The frame index of `base` when the block's indices are consecutive (they are
    /// unless it straddles two registered ranges): a claim finds its frame's record
    /// by addition, without the range search.
    first_index: Option<u32>,
}

/// The reservations of one memory.
///
/// The records live in a slab (`records`); the three indexes name a record by its
/// slot, so that the memo of the last block (`last`) hands a fault its record without
/// any tree lookup.
pub(crate) struct Reservations {
    enabled: bool,
    /// The records; `None` slots are in `free`.
    records: Vec<Option<Resv>>,
    /// Empty slots of `records`.
    free: Vec<u32>,
    /// (space, first page of the block) → slot.
    blocks: BTreeMap<(SpaceId, u64), u32>,
    /// First frame → slot.
    by_base: BTreeMap<u64, u32>,
    /// Age → slot.
    by_age: BTreeMap<u64, u32>,
    next_age: u64,
    reserved: u64,
    stats: ReservationStats,
    /// The last block looked up or made, `(space, block, slot)`: consecutive faults
    /// mostly fall in one 2 MiB block, and this spares them the tree lookups.
    /// Cleared whenever a reservation goes.
    last: Option<(SpaceId, u64, u32)>,
}

impl Default for Reservations {
    fn default() -> Self {
        Reservations {
            enabled: true,
            records: Vec::new(),
            free: Vec::new(),
            blocks: BTreeMap::new(),
            by_base: BTreeMap::new(),
            by_age: BTreeMap::new(),
            next_age: 0,
            reserved: 0,
            stats: ReservationStats::default(),
            last: None,
        }
    }
}

impl Reservations {
    /// Frames in the reserved state.
    pub fn reserved_frames(&self) -> u64 {
        self.reserved
    }

    /// The live record in `slot` (a slot an index or the memo named).
    fn record(&self, slot: u32) -> &Resv {
        self.records[slot as usize]
            .as_ref()
            .expect("an indexed slot holds a reservation")
    }

    fn record_mut(&mut self, slot: u32) -> &mut Resv {
        self.records[slot as usize]
            .as_mut()
            .expect("an indexed slot holds a reservation")
    }
}

impl PhysMem {
    /// Enable or disable reservations; disabling breaks every live one.
    pub fn set_reservations(&mut self, enabled: bool) {
        self.reservations.enabled = enabled;
        if !enabled {
            while self.break_oldest_reservation() {}
        }
    }

    /// The reservation counters.
    pub fn reservation_stats(&self) -> ReservationStats {
        ReservationStats {
            live: self.reservations.by_base.len() as u64,
            ..self.reservations.stats
        }
    }

    /// Frames for pages `vpn..vpn + pages` of `space` (active or wired, owned by those
    /// pages), contiguous: from the reservation of their block when there is one, in a
    /// new reservation when the arena has a free aligned block, otherwise any frames
    /// ([`PhysMem::alloc_run`]). `None` when nothing fits. Inlined, so that a caller's
    /// one-page request goes straight to [`PhysMem::alloc_page`].
    #[inline(always)]
    pub fn alloc_pages(
        &mut self,
        pages: u64,
        space: SpaceId,
        vpn: Vpn,
        wired: bool,
        limit: Option<FrameConstraint>,
    ) -> Option<Pfn> {
        if pages == 1 && limit.is_none() {
            return self.alloc_page(space, vpn, wired);
        }
        self.alloc_pages_unmemoised(pages, space, vpn, wired, limit)
    }

    /// [`PhysMem::alloc_pages`] of one page without a limit (every 4 KiB fault): its
    /// common case, the memo's reservation, is inlined into the caller; everything else
    /// goes out of line, down the general path.
    #[inline]
    fn alloc_page(&mut self, space: SpaceId, vpn: Vpn, wired: bool) -> Option<Pfn> {
        match self.claim_memoised(space, vpn, wired) {
            Some(pfn) => Some(pfn),
            None => self.alloc_pages_unmemoised(1, space, vpn, wired, None),
        }
    }

    /// [`PhysMem::alloc_pages`] past the memo (`claim_memoised` declined or was not
    /// asked).
    #[inline(never)]
    fn alloc_pages_unmemoised(
        &mut self,
        pages: u64,
        space: SpaceId,
        vpn: Vpn,
        wired: bool,
        limit: Option<FrameConstraint>,
    ) -> Option<Pfn> {
        let r = RESERVATION_PAGES;
        let block = vpn.0 & !(r - 1);
        let inside = pages > 0 && vpn.0 - block + pages <= r;
        // Without a reservation, a power-of-two block is naturally aligned (a zero-fill
        // block can still be one large leaf), anything else is any contiguous run.
        let align = if pages.is_power_of_two() { pages } else { 1 };
        if !self.reservations.enabled || limit.is_some() || self.retired || !inside {
            return self.alloc_run(pages, align, space, vpn, wired, limit);
        }
        let off = vpn.0 - block;
        if let Some(slot) = self.block_slot(space, block) {
            let resv = self.reservations.record(slot);
            let (base, first_index) = (resv.base, resv.first_index);
            // One page (every 4 KiB fault): find its frame's index once, for the
            // state check and the claim.
            let first = match pages {
                1 => first_index
                    .map(|i0| i0 + off as u32)
                    .or_else(|| self.index(base + off))
                    .filter(|&i| self.frames[i as usize].state == FrameState::Reserved),
                _ => None,
            };
            if first.is_some() || (pages > 1 && self.all_reserved(base + off, pages)) {
                self.claim(slot, off, pages, space, wired, first);
                return Some(Pfn(base + off));
            }
            self.reservations.stats.fallbacks += 1;
            return self.alloc_run(pages, align, space, vpn, wired, limit);
        }
        match self.reserve_block(space, block, off, pages) {
            Some((slot, base, first)) => {
                self.claim(slot, off, pages, space, wired, first);
                Some(Pfn(base + off))
            }
            None => {
                self.reservations.stats.fallbacks += 1;
                self.alloc_run(pages, align, space, vpn, wired, limit)
            }
        }
    }

    /// The common case of [`PhysMem::alloc_pages`] (every 4 KiB fault but the first of
    /// each 2 MiB block): one page whose block's reservation is the memo's, with a
    /// known first frame index and the page's frame still reserved. Claims that frame
    /// exactly as [`PhysMem::claim`] claims a one-page run — record and counters, owner,
    /// onto the queue of its state — without the run loop and the general checks;
    /// `None` (nothing changed) sends the caller down the general path.
    #[inline]
    fn claim_memoised(&mut self, space: SpaceId, vpn: Vpn, wired: bool) -> Option<Pfn> {
        let block = vpn.0 & !(RESERVATION_PAGES - 1);
        let off = vpn.0 - block;
        let rs = &mut self.reservations;
        let slot = match rs.last {
            Some((s, b, slot)) if s == space && b == block => slot,
            _ => return None,
        };
        if !rs.enabled || self.retired || self.groups.is_some() {
            return None;
        }
        let resv = rs.record_mut(slot);
        let i = resv.first_index? + off as u32;
        // The frame's record is found once, for the check, the owner and the links.
        let frame = &mut self.frames[i as usize];
        if frame.state != FrameState::Reserved {
            return None;
        }
        let state = if wired {
            FrameState::Wired
        } else {
            FrameState::Active
        };
        // A reserved frame is on no queue and not pending: linking it at its queue's
        // tail is the whole state change (as in `claim`, which calls `push_tail`).
        let q = queue_of(state).expect("active and wired frames are queued");
        let tail = self.queues[q].tail;
        frame.owner = Some(Owner { space, vpn });
        frame.state = state;
        frame.prev = tail;
        frame.next = NIL;
        let base = resv.base;
        resv.used += 1;
        if resv.used == RESERVATION_PAGES {
            rs.stats.filled += 1;
        }
        rs.reserved -= 1;
        rs.stats.frames_served += 1;
        self.link_tail(q, tail, i);
        Some(Pfn(base + off))
    }

    /// The first frame of the reservation of `space`'s block holding `vpn`, if any.
    pub fn reservation_of(&self, space: SpaceId, vpn: Vpn) -> Option<Pfn> {
        let block = vpn.0 & !(RESERVATION_PAGES - 1);
        let rs = &self.reservations;
        rs.blocks
            .get(&(space, block))
            .map(|&slot| Pfn(rs.record(slot).base))
    }

    /// The slot of `space`'s reservation for `block`, through the memo.
    #[inline]
    fn block_slot(&mut self, space: SpaceId, block: u64) -> Option<u32> {
        let rs = &mut self.reservations;
        if let Some((s, b, slot)) = rs.last {
            if s == space && b == block {
                return Some(slot);
            }
        }
        let slot = *rs.blocks.get(&(space, block))?;
        rs.last = Some((space, block, slot));
        Some(slot)
    }

    fn all_reserved(&self, pfn: u64, pages: u64) -> bool {
        (0..pages).all(|k| self.state(Pfn(pfn + k)) == Some(FrameState::Reserved))
    }

    /// Take an aligned block from the arena and reserve it for `(space, block)`, about
    /// to hand its frames `off..off + pages` out ([`PhysMem::claim`] follows at once):
    /// those stay free until the claim makes them active, without a detour through
    /// the reserved state (a whole 2 MiB zero-fill block claims all 512). Returns the
    /// record's slot, the block's first frame and, when the block's frame indices are
    /// consecutive (they are unless it straddles two registered ranges), the index of
    /// frame `off`.
    fn reserve_block(
        &mut self,
        space: SpaceId,
        block: u64,
        off: u64,
        pages: u64,
    ) -> Option<(u32, u64, Option<u32>)> {
        let r = RESERVATION_PAGES;
        let mut c = Constraint::new(r << PAGE_SHIFT);
        c.align = r << PAGE_SHIFT;
        // The block stays one allocated arena segment while the reservation lives (its
        // frames never go back to the arena one by one then); it is split into frames
        // only if the reservation is broken with frames in use (`release_reserved`).
        let pa = self.arena.xalloc(&c).ok()?;
        let base = pa >> PAGE_SHIFT;
        let i0 = self
            .index(base)
            .expect("the arena hands out registered frames only");
        let consecutive = self.index(base + r - 1) == Some(i0 + (r - 1) as u32);
        if consecutive && self.groups.is_none() {
            // Free frames are on no queue and own nothing: free -> reserved is a state
            // write (what `set_state` would do, without its per-frame checks).
            let claimed = off as usize..(off + pages) as usize;
            let block = &mut self.frames[i0 as usize..(i0 as usize + r as usize)];
            for (k, m) in block.iter_mut().enumerate() {
                debug_assert!(m.state == FrameState::Free && m.owner.is_none());
                if !claimed.contains(&k) {
                    m.state = FrameState::Reserved;
                }
            }
        } else {
            for k in (0..r).filter(|k| !(off..off + pages).contains(k)) {
                let i = self
                    .index(base + k)
                    .expect("the arena hands out registered frames only");
                self.frames[i as usize].owner = None;
                self.set_state(i, FrameState::Reserved);
            }
        }
        let rs = &mut self.reservations;
        let age = rs.next_age;
        rs.next_age += 1;
        let record = Some(Resv {
            base,
            space,
            block,
            used: 0,
            age,
            first_index: consecutive.then_some(i0),
        });
        let slot = match rs.free.pop() {
            Some(slot) => {
                rs.records[slot as usize] = record;
                slot
            }
            None => {
                rs.records.push(record);
                (rs.records.len() - 1) as u32
            }
        };
        rs.blocks.insert((space, block), slot);
        rs.last = Some((space, block, slot));
        rs.by_base.insert(base, slot);
        rs.by_age.insert(age, slot);
        rs.reserved += r;
        rs.stats.made += 1;
        Some((slot, base, consecutive.then_some(i0 + off as u32)))
    }

    /// Hand frames `off..off + pages` of the reservation in `slot` to their pages
    /// (`first`: the frame index of the first one, when the caller knows it and the
    /// run's indices are consecutive).
    #[inline]
    fn claim(
        &mut self,
        slot: u32,
        off: u64,
        pages: u64,
        space: SpaceId,
        wired: bool,
        first: Option<u32>,
    ) {
        let state = if wired {
            FrameState::Wired
        } else {
            FrameState::Active
        };
        let rs = &mut self.reservations;
        let resv = rs.record_mut(slot);
        let (base, block) = (resv.base, resv.block);
        resv.used += pages;
        if resv.used == RESERVATION_PAGES {
            rs.stats.filled += 1;
        }
        rs.reserved -= pages;
        rs.stats.frames_served += pages;
        for k in off..off + pages {
            let i = match first {
                Some(i) => i + (k - off) as u32,
                None => self
                    .index(base + k)
                    .expect("reserved frames are registered"),
            };
            self.frames[i as usize].owner = Some(Owner {
                space,
                vpn: Vpn(block + k),
            });
            if self.groups.is_none() {
                // A claimed frame is reserved, or free in a block just reserved: on no
                // queue and not pending, so `set_state` would only link it.
                debug_assert!(matches!(
                    self.frames[i as usize].state,
                    FrameState::Reserved | FrameState::Free
                ));
                self.push_tail(i, state);
            } else {
                self.set_state(i, state);
            }
        }
    }

    /// Remove the reservation in `slot` from the slab and every index; returns it.
    fn forget_reservation(&mut self, slot: u32) -> Resv {
        let rs = &mut self.reservations;
        let resv = rs.records[slot as usize]
            .take()
            .expect("an indexed slot holds a reservation");
        rs.free.push(slot);
        rs.last = None;
        rs.by_base.remove(&resv.base);
        rs.by_age.remove(&resv.age);
        rs.blocks.remove(&(resv.space, resv.block));
        resv
    }

    /// The slot of the reservation holding frame `pfn`.
    pub(super) fn reservation_at(&self, pfn: u64) -> Option<u32> {
        let (&base, &slot) = self.reservations.by_base.range(..=pfn).next_back()?;
        (pfn < base + RESERVATION_PAGES).then_some(slot)
    }

    /// A frame of index `i` (owner already cleared) is being freed: if it belongs to a
    /// reservation it goes back to it (and a reservation left without used frames is
    /// dissolved into the arena). Returns whether the reservation took it.
    pub(super) fn reservation_take_back(&mut self, i: u32) -> bool {
        let pfn = self.pfn_of(i);
        let Some(slot) = self.reservation_at(pfn) else {
            return false;
        };
        self.set_state(i, FrameState::Reserved);
        self.reservations.reserved += 1;
        let resv = self.reservations.record_mut(slot);
        resv.used -= 1;
        if resv.used == 0 {
            self.release_reserved(slot);
            self.reservations.stats.dissolved += 1;
        }
        true
    }

    /// Return the reserved frames of the reservation in `slot` to the arena and forget
    /// it; frames in use stay with their pages. Returns the frames returned.
    ///
    /// A live reservation's block is one allocated arena segment. With no frame in use
    /// it goes back whole; otherwise it is split into frames first, so that the frames
    /// in use become ordinary single-frame allocations.
    fn release_reserved(&mut self, slot: u32) -> u64 {
        let resv = self.forget_reservation(slot);
        let base = resv.base;
        let r = RESERVATION_PAGES;
        if resv.used == 0 {
            for k in 0..r {
                let i = self
                    .index(base + k)
                    .expect("reserved frames are registered");
                self.set_state(i, FrameState::Free);
            }
            let freed = self.arena.free(base << PAGE_SHIFT, r << PAGE_SHIFT);
            debug_assert!(freed.is_ok(), "reservation block {base:#x}: {freed:?}");
            self.reservations.reserved -= r;
            return r;
        }
        let split = self
            .arena
            .split(base << PAGE_SHIFT, r << PAGE_SHIFT, PAGE_SIZE);
        debug_assert!(split.is_ok(), "a reservation's block splits: {split:?}");
        let mut n = 0;
        for k in 0..RESERVATION_PAGES {
            let pfn = base + k;
            let i = self.index(pfn).expect("reserved frames are registered");
            if self.frames[i as usize].state == FrameState::Reserved {
                self.set_state(i, FrameState::Free);
                let freed = self.arena.free(pfn << PAGE_SHIFT, PAGE_SIZE);
                debug_assert!(freed.is_ok(), "reserved frame {pfn:#x}: {freed:?}");
                n += 1;
            }
        }
        self.reservations.reserved -= n;
        n
    }

    /// Break the oldest reservation that holds reserved frames (memory pressure): they
    /// go back to the arena. Returns whether there was one.
    pub fn break_oldest_reservation(&mut self) -> bool {
        let rs = &self.reservations;
        let Some(&slot) = rs
            .by_age
            .values()
            .find(|&&slot| rs.record(slot).used < RESERVATION_PAGES)
        else {
            return false;
        };
        let n = self.release_reserved(slot);
        self.reservations.stats.broken += 1;
        self.reservations.stats.frames_returned += n;
        true
    }

    /// The reservation invariants (see the module documentation).
    pub(super) fn check_reservations(&self) -> Result<(), &'static str> {
        let rs = &self.reservations;
        if rs.by_base.len() != rs.blocks.len() || rs.by_base.len() != rs.by_age.len() {
            return Err("reservation indexes disagree in size");
        }
        let live = rs.records.iter().filter(|r| r.is_some()).count();
        if live != rs.by_base.len()
            || live + rs.free.len() != rs.records.len()
            || rs.free.iter().any(|&f| rs.records[f as usize].is_some())
        {
            return Err("reservation slab disagrees with its indexes");
        }
        if let Some((space, block, slot)) = rs.last {
            if rs.blocks.get(&(space, block)) != Some(&slot) {
                return Err("reservation memo names no live block");
            }
        }
        let mut reserved = 0;
        for (&base, &slot) in &rs.by_base {
            let resv = rs.records[slot as usize]
                .as_ref()
                .ok_or("reservation index names an empty slot")?;
            if resv.base != base
                || resv
                    .first_index
                    .is_some_and(|i0| self.index(base) != Some(i0))
            {
                return Err("reservation record disagrees with its index");
            }
            if base % RESERVATION_PAGES != 0 || resv.block % RESERVATION_PAGES != 0 {
                return Err("reservation not aligned");
            }
            if rs.blocks.get(&(resv.space, resv.block)) != Some(&slot)
                || rs.by_age.get(&resv.age) != Some(&slot)
            {
                return Err("reservation indexes disagree");
            }
            let mut used = 0;
            for k in 0..RESERVATION_PAGES {
                let i = self
                    .index(base + k)
                    .ok_or("reservation frame not registered")?;
                let m = self.frames[i as usize];
                match m.state {
                    FrameState::Reserved => reserved += 1,
                    FrameState::Pending => used += 1,
                    FrameState::Free => return Err("free frame inside a reservation"),
                    _ => {
                        used += 1;
                        let want = Owner {
                            space: resv.space,
                            vpn: Vpn(resv.block + k),
                        };
                        if m.owner != Some(want) {
                            return Err("reservation frame backs a page other than its own");
                        }
                    }
                }
            }
            if used != resv.used || used == 0 {
                return Err("reservation's used count is wrong");
            }
        }
        if reserved != rs.reserved {
            return Err("reserved frames outside every reservation");
        }
        Ok(())
    }
}
