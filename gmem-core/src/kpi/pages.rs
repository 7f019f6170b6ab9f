//! KPI: the range calls — protect, unmap, set attributes, migrate, wire and unwire a
//! set of [`Pages`]: a whole region, or any page-aligned range of a space, which the
//! core splits at region boundaries itself (as `mprotect(2)` and FreeBSD's
//! `vm_map_protect` take an address range, not a mapping).
//!
//! A whole region keeps the region-level meaning (`region_protect` of a region sets
//! the region's protection; pieces a range call split off merge back). A range is cut
//! into one piece per region it crosses; a piece that is a whole region is treated as
//! that region, the others as a sub-range of their region (split off as Linux splits a
//! VMA).
//!
//! **Checks first.** A range is checked whole before anything changes: empty or
//! unaligned ([`RegionError::BadRange`]), a page no region holds
//! ([`RegionError::Unallocated`]), a destroyed space. Then the pieces are applied in
//! address order, each under the space's lock as one call on its region; a failure of
//! a later piece (a driver error, memory exhausted, a region deallocated meanwhile by
//! another thread) leaves the earlier pieces done, as `mprotect` does across VMAs.

use crate::addr::{VaRange, VirtAddr, PAGE_SIZE};
use crate::error::{PopulateError, ProtectError, RegionError};
use crate::flags::{MapFlags, Prot};
use crate::gmem::Gmem;
use crate::handle::{DeviceId, SpaceId};
use crate::kpi::region::MigrateScope;
use crate::mmu::{Attrs, MmuError};
use crate::space::queue::Callback;
use crate::space::Region;
use crate::sync::{Arc, Mutex};
use alloc::boxed::Box;
use alloc::vec::Vec;

/// The pages a range call acts on: a whole region (`From<Region>`, so a [`Region`]
/// can be passed as it is), or a page-aligned range of a space that may cross several
/// regions ([`Pages::range`]), which the core splits at region boundaries itself (as
/// `mprotect(2)` and FreeBSD's `vm_map_protect` take an address range, not a mapping).
///
/// A whole region keeps the region-level meaning (`region_protect` of a region sets
/// the region's protection; pieces a range call split off merge back). A range is cut
/// into one piece per region it crosses; a piece that is a whole region is treated as
/// that region, the others as a sub-range of their region (split off as Linux splits a
/// VMA).
///
/// **Checks first.** A range is checked whole before anything changes: empty or
/// unaligned ([`RegionError::BadRange`]), a page no region holds
/// ([`RegionError::Unallocated`]), a destroyed space. Then the pieces are applied in
/// address order, each under the space's lock as one call on its region; a failure of
/// a later piece (a driver error, memory exhausted, a region deallocated meanwhile by
/// another thread) leaves the earlier pieces done, as `mprotect` does across VMAs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pages(Target);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Region(Region),
    Range(SpaceId, VaRange),
}

impl Pages {
    /// Every page of `region`.
    pub fn region(region: Region) -> Pages {
        Pages(Target::Region(region))
    }

    /// The pages of `range` in `space`: page-aligned, not empty, and every page held by
    /// some region (checked by the call, before it changes anything).
    pub fn range(space: SpaceId, range: VaRange) -> Pages {
        Pages(Target::Range(space, range))
    }
}

impl From<Region> for Pages {
    fn from(region: Region) -> Pages {
        Pages::region(region)
    }
}

/// One region's share of a [`Pages`]: the whole region (`None`) or a range inside it.
type Piece = (Region, Option<VaRange>);

/// The pieces of a [`Pages`]: a region's one piece needs no heap allocation (a
/// region handle is the common case, and a DMA unmap's hot path).
pub(crate) enum Pieces {
    One(core::iter::Once<Piece>),
    Many(alloc::vec::IntoIter<Piece>),
}

impl Iterator for Pieces {
    type Item = Piece;
    fn next(&mut self) -> Option<Piece> {
        match self {
            Pieces::One(p) => p.next(),
            Pieces::Many(p) => p.next(),
        }
    }
}

impl Pieces {
    fn count_left(&self) -> usize {
        match self {
            Pieces::One(p) => p.len(),
            Pieces::Many(p) => p.len(),
        }
    }
}

impl Gmem {
    /// The pieces of `pages`, checked: a region as it is (its handle is checked by the
    /// call on it), a range cut at region boundaries.
    pub(crate) fn pieces(&self, pages: Pages) -> Result<Pieces, RegionError> {
        let (space_id, range) = match pages.0 {
            Target::Region(r) => return Ok(Pieces::One(core::iter::once((r, None)))),
            Target::Range(s, r) => (s, r),
        };
        let start = range.start.as_u64();
        let end = start.checked_add(range.len);
        let aligned = range.len > 0 && start % PAGE_SIZE == 0 && range.len % PAGE_SIZE == 0;
        let Some(end) = end.filter(|_| aligned) else {
            return Err(RegionError::BadRange(range));
        };
        let space = self
            .space(space_id)
            .ok_or(RegionError::UnknownSpace(space_id))?;
        let st = space.lock();
        let mut pieces = Vec::new();
        let mut cursor = start;
        for (s, rec) in st.regions_overlapping(start, end) {
            if s > cursor {
                break;
            }
            let region = Region {
                space: space_id,
                start: VirtAddr::new(s),
                id: rec.id,
            };
            let (lo, hi) = (s.max(start), (s + rec.len).min(end));
            let whole = lo == s && hi == s + rec.len;
            let piece = (!whole).then(|| VaRange {
                start: VirtAddr::new(lo),
                len: hi - lo,
            });
            pieces.push((region, piece));
            cursor = hi;
        }
        if cursor < end {
            return Err(RegionError::Unallocated(VirtAddr::new(cursor)));
        }
        Ok(Pieces::Many(pieces.into_iter()))
    }

    /// Change the protection of `pages` (`gm_region_protect`, `mprotect`): every page
    /// table that maps them is updated and the TLBs invalidated before this returns. A
    /// whole region's protection is set (pieces a range protect split off merge back);
    /// a part of a region is split off as Linux splits a VMA, and merges back when its
    /// protection is the region's again. [`Prot::empty`] is no access: every mapping of
    /// the pages goes (they keep their data) and every access faults with a protection
    /// violation until the protection is raised again.
    ///
    /// # Errors
    /// [`ProtectError`]: a bad handle or range (see [`Pages`]), a protection
    /// with unknown bits, or a driver failure — after which every table holds the old
    /// protection of that region again (earlier regions of a range stay changed).
    ///
    /// # Examples
    /// A guard page in the middle of a stack-like region: writes there are refused,
    /// the rest stays writable.
    /// ```
    /// # use gmem_core::testing::{AccessError, TestSystem};
    /// # use gmem_core::*;
    /// let sys = TestSystem::new(16);
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)?;
    /// let r = gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))?;
    /// let page = |i: u64| VirtAddr::new(r.start.as_u64() + i * PAGE_SIZE);
    /// sys.write(0, page(2), b"before").unwrap();
    /// gm.region_protect(Pages::range(space, VaRange::new(page(2), PAGE_SIZE)?), Prot::READ)?;
    /// assert_eq!(
    ///     sys.write(0, page(2), b"after"),
    ///     Err(AccessError::Fault(FaultError::ProtectionViolation {
    ///         va: page(2),
    ///         access: Prot::WRITE,
    ///         allowed: Prot::READ,
    ///     }))
    /// );
    /// assert_eq!(sys.read(0, page(2), 6).unwrap(), b"before"); // still readable
    /// sys.write(0, page(3), b"fine").unwrap(); // the rest keeps its protection
    /// // A range reaching past the region (into no region) is refused whole.
    /// let past = Pages::range(space, VaRange::new(page(3), 2 * PAGE_SIZE)?);
    /// assert_eq!(
    ///     gm.region_protect(past, Prot::READ),
    ///     Err(ProtectError::Region(RegionError::Unallocated(page(4))))
    /// );
    /// sys.write(0, page(3), b"still fine").unwrap();
    /// // The whole region, by its handle.
    /// gm.region_protect(r, Prot::READ)?;
    /// assert_eq!(gm.region_info(r)?.prot, Prot::READ);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn region_protect(&self, pages: impl Into<Pages>, prot: Prot) -> Result<(), ProtectError> {
        let _critical = self.critical();
        if !Prot::RWX.contains(prot) {
            return Err(ProtectError::BadProt(prot));
        }
        for (region, piece) in self.pieces(pages.into())? {
            match piece {
                None => self.protect_whole(region, prot)?,
                Some(range) => self.protect_piece(region, range, prot)?,
            }
        }
        Ok(())
    }

    /// Unmap `pages` (`gm_region_unmap`), strictly or, with [`MapFlags::ASYNC`],
    /// queued. In a `region_map`ped region they then hold nothing (faults fail with
    /// `NotMapped`) until mapped again; an anonymous region loses them (they are
    /// zero-filled again on the next fault). `callback` runs once, when every page of
    /// the call is invalidated, with the first driver error if there was one.
    ///
    /// # Errors
    /// [`RegionError`]: a bad handle or range, or a destroyed space; `callback` is then
    /// dropped unrun (a range's earlier regions stay unmapped if a later one failed).
    ///
    /// # Examples
    /// Every page of the range goes, the last one included; the pages around it stay.
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// let sys = TestSystem::new(16);
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)?;
    /// let r = gm.as_alloc(space, AllocRequest::new(6 * PAGE_SIZE))?;
    /// let page = |i: u64| VirtAddr::new(r.start.as_u64() + i * PAGE_SIZE);
    /// sys.write(0, r.start, &[1; 6 * PAGE_SIZE as usize]).unwrap();
    /// let middle = Pages::range(space, VaRange::new(page(1), 4 * PAGE_SIZE)?);
    /// gm.region_unmap(middle, MapFlags::empty(), None)?;
    /// let mmu = &sys.host().mmu;
    /// let mapped: Vec<bool> = (0..6).map(|i| mmu.translate(page(i)).is_some()).collect();
    /// assert_eq!(mapped, [true, false, false, false, false, true]);
    /// assert_eq!(gm.dev_frames(gm.host())?.free, 16 - 2);
    /// // An anonymous region's unmapped pages are zero-filled again on the next touch.
    /// assert_eq!(sys.read(0, page(4), 1).unwrap(), [0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn region_unmap(
        &self,
        pages: impl Into<Pages>,
        flags: MapFlags,
        callback: Option<Callback>,
    ) -> Result<(), RegionError> {
        let _critical = self.critical();
        let pieces = self.pieces(pages.into())?;
        let mut callbacks = split_callback(callback, pieces.count_left());
        for (region, piece) in pieces {
            let callback = callbacks.next().flatten();
            match piece {
                None => self.unmap_whole(region, flags, callback)?,
                Some(range) => self.unmap_piece(region, range, flags, callback)?,
            }
        }
        Ok(())
    }

    /// Set the driver attributes of `pages` ([`Attrs`]: opaque to the core, handed to
    /// the driver in every [`crate::MapRun`] and [`crate::FrameRequest`] of the pages —
    /// CODA's granularity bit, a placement descriptor). Set them before the pages are
    /// first touched to steer where their frames go; pages already mapped are mapped
    /// again with the new value (their frames stay). A part of a region is split off as
    /// a range protect splits.
    ///
    /// # Errors
    /// [`ProtectError`]: a bad handle or range, or a driver failure re-making an eager
    /// mapping (the attributes are set).
    pub fn region_set_attrs(
        &self,
        pages: impl Into<Pages>,
        attrs: Attrs,
    ) -> Result<(), ProtectError> {
        let _critical = self.critical();
        for (region, piece) in self.pieces(pages.into())? {
            match piece {
                None => self.set_attrs_whole(region, attrs)?,
                Some(range) => self.set_attrs_piece(region, range, attrs)?,
            }
        }
        Ok(())
    }

    /// Move every page of `pages` that has a frame to `target`'s memory (host memory
    /// for a device without one); with [`MigrateScope::Prefetch`] also allocate and
    /// zero-fill there the pages that have none. Wired pages stay. Returns the number of
    /// pages moved or prepared.
    ///
    /// # Errors
    /// [`PopulateError`]: a bad handle, range or target, memory exhausted even after
    /// eviction, or a driver or data-mover failure. Pages moved before the failure stay
    /// moved (each is whole and consistent; the call is a sequence of page migrations).
    ///
    /// # Examples
    /// Before a kernel launch, move what the CPU wrote into the GPU's memory; the
    /// bytes follow the page.
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// let mut sys = TestSystem::new(16);
    /// let gpu = sys.add_device(2, DevCaps::FAULTABLE, 0x8000_0000, 32);
    /// let gpu_id = sys.devices[gpu].id;
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)?;
    /// gm.as_attach(space, gpu_id, MmuMode::Coherent, Activation::Switch)?;
    /// let r = gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))?;
    /// sys.write(0, r.start, b"input").unwrap(); // one page, in host memory
    /// assert_eq!(gm.as_page_frame(space, r.start)?.map(|(m, _)| m), Some(gm.host()));
    /// // Only the populated page moves; with `Prefetch` the other three would be
    /// // zero-filled there too.
    /// assert_eq!(gm.region_migrate(r, gpu_id, MigrateScope::Populated)?, 1);
    /// assert_eq!(gm.as_page_frame(space, r.start)?.map(|(m, _)| m), Some(gpu_id));
    /// assert_eq!(sys.read(gpu, r.start, 5).unwrap(), b"input");
    /// // Two regions in one call: the range crosses the boundary between them.
    /// let s = gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))?;
    /// assert_eq!(s.start.as_u64(), r.start.as_u64() + 4 * PAGE_SIZE);
    /// let across = Pages::range(space, VaRange::new(VirtAddr::new(s.start.as_u64() - PAGE_SIZE), 2 * PAGE_SIZE)?);
    /// assert_eq!(gm.region_migrate(across, gpu_id, MigrateScope::Prefetch)?, 2);
    /// assert_eq!(gm.as_page_frame(space, s.start)?.map(|(m, _)| m), Some(gpu_id));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn region_migrate(
        &self,
        pages: impl Into<Pages>,
        target: DeviceId,
        scope: MigrateScope,
    ) -> Result<u64, PopulateError> {
        let _critical = self.critical();
        let mut moved = 0;
        for (region, piece) in self.pieces(pages.into())? {
            moved += self.migrate_pages(region, piece, target, scope)?;
        }
        Ok(moved)
    }

    /// Wire `pages` (the host VM's `mlock`, or a KVM guest whose pass-through device
    /// cannot fault): every page gets a frame — zero-filled at its region's placement
    /// target, host memory when that is "the faulting device" — and is pinned on its
    /// memory's wired queue (never migrated, never evicted), and mapped at once in the
    /// tables of every device that cannot fault. Returns the pages newly wired.
    ///
    /// # Errors
    /// [`PopulateError`]: a bad handle or range, memory exhausted, or a driver or
    /// data-mover failure; no page of the failing region is then left wired by this
    /// call (earlier regions of a range stay wired).
    pub fn region_wire(&self, pages: impl Into<Pages>) -> Result<u64, PopulateError> {
        let _critical = self.critical();
        let mut wired = 0;
        for (region, piece) in self.pieces(pages.into())? {
            wired += match piece {
                None => self.wire_whole(region)?,
                Some(range) => self.wire_piece(region, range)?,
            };
        }
        Ok(wired)
    }

    /// Undo [`Gmem::region_wire`]: the pages may migrate and be evicted again; every
    /// mapping of them except replicate-mode mirrors is removed (devices that cannot
    /// fault lose them; the others fault them back under the region's policy).
    /// Caller-given frames (`region_map`) stay wired.
    ///
    /// # Errors
    /// [`RegionError`]: a bad handle or range, or a destroyed space.
    pub fn region_unwire(&self, pages: impl Into<Pages>) -> Result<(), RegionError> {
        let _critical = self.critical();
        for (region, piece) in self.pieces(pages.into())? {
            match piece {
                None => self.unwire_whole(region)?,
                Some(range) => self.unwire_piece(region, range)?,
            }
        }
        Ok(())
    }
}

/// `n` callbacks that together call `callback` once: when the last of them has run,
/// with the first error any of them saw. One piece passes `callback` through.
fn split_callback(callback: Option<Callback>, n: usize) -> impl Iterator<Item = Option<Callback>> {
    struct Join {
        left: usize,
        first_error: Option<MmuError>,
        callback: Option<Callback>,
    }
    let (single, shared) = match callback {
        Some(cb) if n > 1 => (
            None,
            Some(Arc::new(Mutex::new(Join {
                left: n,
                first_error: None,
                callback: Some(cb),
            }))),
        ),
        other => (other, None),
    };
    let mut single = single;
    (0..n).map(move |_| {
        if let Some(join) = &shared {
            let join = join.clone();
            let part: Callback = Box::new(move |result: Result<(), MmuError>| {
                let done = {
                    let mut j = join.lock();
                    if let Err(e) = result {
                        j.first_error.get_or_insert(e);
                    }
                    j.left -= 1;
                    if j.left == 0 {
                        j.callback.take().map(|cb| (cb, j.first_error))
                    } else {
                        None
                    }
                };
                if let Some((cb, error)) = done {
                    cb(error.map_or(Ok(()), Err));
                }
            });
            Some(part)
        } else {
            single.take()
        }
    })
}
