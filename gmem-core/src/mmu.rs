//! The driver traits and their argument types. The contracts are documented on the
//! public face, [`crate::driver`].

use crate::addr::{PageSize, PhysAddr, VaRange, VirtAddr};
use crate::flags::{PageSizes, Prot};
use crate::handle::{DeviceId, SpaceId};
use core::fmt;

/// Identifies a page-table format. Devices whose formats are equal can share one page
/// table; the value is chosen by the driver author (a constant per hardware format).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageTableFormat(pub u32);

/// A page table created by a driver, opaque to the core (typically the physical address
/// of its root page).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageTableRoot(pub u64);

/// One physically contiguous run to map: `len` bytes from `va` onto `pa`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapRun {
    /// First virtual address, page aligned.
    pub va: VirtAddr,
    /// First physical address, page aligned.
    pub pa: PhysAddr,
    /// Length in bytes, a multiple of `page_size`.
    pub len: u64,
    /// The protection of every page of the run.
    pub prot: Prot,
    /// The leaf size the core asks for: one the MMU reported, with `va`, `pa` and `len`
    /// multiples of it (see the module's *Large leaves*). The driver maps leaves of this
    /// size and none larger.
    pub page_size: PageSize,
    /// The device whose local memory holds the frames; a driver compares it with its own
    /// id to pick an aperture (local vs system memory) in its PTEs.
    pub memory: DeviceId,
    /// The region attributes of every page of the run (`region_set_attrs`): opaque to
    /// the core, for the driver's format bits (CODA's granularity bit).
    pub attrs: Attrs,
}

/// Region attributes: a value the core stores per page for the driver and hands back
/// in every [`MapRun`] and [`FrameRequest`] of those pages, never interpreting it (a
/// placement descriptor, a format bit such as CODA's fine/coarse granularity, a cache
/// policy). 0 unless `region_set_attrs` says otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Attrs(pub u32);

/// What the core is about to allocate frames for, asked of the memory's driver before
/// every allocation in it ([`DeviceMemory::frame_request`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRequest {
    /// The address space whose pages the frames will back.
    pub space: SpaceId,
    /// The first page's virtual address.
    pub va: VirtAddr,
    /// Pages (one contiguous, aligned run when more than one).
    pub pages: u64,
    /// The attributes of those pages.
    pub attrs: Attrs,
    /// The device whose fault asked for the frames; `None` for a KPI call (migration,
    /// prefetch, wiring) or an eviction.
    pub device: Option<DeviceId>,
}

/// A driver's answer to a [`FrameRequest`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FramePlacement {
    /// Any free frame (the default).
    #[default]
    Any,
    /// Only frames within the constraint: when none is free the core evicts pages
    /// inside it rather than use others (a DMA window, a page group of one class).
    Require(FrameConstraint),
    /// Frames within the constraint if one is free, any frame otherwise (a stack near
    /// the unit that will use the pages).
    Prefer(FrameConstraint),
    /// Frames within `prefer` (of the request's page-group class) if one is free, any
    /// frame of page-group class `class` otherwise (CODA: a coarse-grain page whose
    /// stack has no free slot goes fine-grain). Counted in `Stats::placement_fallbacks`
    /// when the fallback is taken.
    PreferOrClass {
        /// The preferred frames.
        prefer: FrameConstraint,
        /// The class of the fallback frames.
        class: u32,
    },
}

impl MapRun {
    /// The virtual range of the run.
    pub fn range(&self) -> VaRange {
        VaRange {
            start: self.va,
            len: self.len,
        }
    }
}

/// Why an MMU operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MmuError {
    /// No memory for page-table pages.
    OutOfTableMemory,
    /// The request is outside what the hardware can translate (address width, page size).
    Unsupported {
        /// The virtual address concerned.
        va: VirtAddr,
    },
    /// A hardware-specific failure, with the driver's code.
    Hardware(u32),
}

impl fmt::Display for MmuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MmuError::OutOfTableMemory => write!(f, "out of page-table memory"),
            MmuError::Unsupported { va } => write!(f, "unsupported translation at {va}"),
            MmuError::Hardware(code) => write!(f, "hardware error {code}"),
        }
    }
}

/// The MMU functions of a device (`gm_mmu_t`).
pub trait Mmu: Send + Sync {
    /// The page-table format; equal formats may share one table.
    fn format(&self) -> PageTableFormat;
    /// The leaf sizes the format maps (4 KiB must be among them); the core asks for
    /// larger ones only from this set (see the module's *Large leaves*). A capability
    /// that never changes: the core asks it once, when the device registers, and
    /// keeps the answer (its page tables and faults read the kept one).
    fn page_sizes(&self) -> PageSizes;
    /// Create an empty page table.
    ///
    /// # Errors
    /// [`MmuError::OutOfTableMemory`] when no page can be had for the root, or a
    /// hardware-specific [`MmuError`].
    fn create_page_table(&self) -> Result<PageTableRoot, MmuError>;
    /// Destroy a page table the core no longer uses (all its mappings were unmapped and
    /// invalidated before).
    fn destroy_page_table(&self, root: PageTableRoot);
    /// Install a run of mappings. On error nothing of the run may remain mapped.
    ///
    /// # Errors
    /// [`MmuError`] when a table page cannot be allocated or the run is outside what the
    /// hardware translates; nothing of the run may then remain mapped.
    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError>;
    /// Remove every mapping in `range` (pages that are not mapped are skipped). A large
    /// leaf the range covers in part is split first, without allocating (from its split
    /// reserve; see the module's *Large leaves*): this call cannot fail.
    fn unmap(&self, root: PageTableRoot, range: VaRange);
    /// Change the protection of every mapping in `range`, splitting a large leaf the
    /// range covers in part.
    ///
    /// # Errors
    /// [`MmuError`] when the change needs a table page that cannot be had (splitting a
    /// large leaf) or the hardware refuses; the core then restores the old protection on
    /// what was changed.
    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError>;
    /// Invalidate this device's TLB entries for every range in `ranges` (one coalesced
    /// batch; the driver may turn it into a full flush). When it returns, no access
    /// through a stale translation of those ranges is in flight.
    ///
    /// The core may call this without the space lock (a strict `region_dealloc`
    /// invalidates outside it), concurrently with other calls on the same MMU, and for a
    /// `root` that a concurrent detach destroyed meanwhile: the driver may then treat
    /// it as a no-op. That is safe because the detach of a table's last user calls
    /// [`Mmu::invalidate_all`] for the root (after clearing what the core still had
    /// mapped, before [`Mmu::destroy_page_table`]), so every translation the table ever
    /// held, including ranges a strict dealloc or a queued unmap cleared and had not
    /// invalidated yet, is gone from that device's TLB before the table is.
    fn invalidate(&self, root: PageTableRoot, ranges: &[VaRange]);
    /// Invalidate every TLB entry of this device for `root`.
    fn invalidate_all(&self, root: PageTableRoot);
    /// Whether this MMU's tables accept [`Mmu::map`] and [`Mmu::unmap`] of *disjoint*
    /// virtual ranges of one table from several threads at once, concurrently with
    /// hardware walks (`false`, the default: the core serialises every edit of a table
    /// under its space's lock).
    ///
    /// When `true` the core may edit such a table without the space lock — the eager
    /// mapping of a `region_map`ped region (when every table that takes it eagerly
    /// says `true`) and the unmapping of a strict `region_dealloc` — while other
    /// threads edit other ranges of the same table. It guarantees that the ranges of
    /// concurrent calls never overlap, that no `unmap` of a range runs with a `map` of
    /// it, and that [`Mmu::destroy_page_table`] waits until every unlocked edit of the
    /// table has returned. While an unlocked `region_map` runs, a fault on its region
    /// is answered [`crate::FaultError::Busy`] and a table attached meanwhile in shared
    /// mode leaves that region's pages to the edit, so no call of the core maps them
    /// into the same table at the same time.
    fn concurrent_edits(&self) -> bool {
        false
    }
    /// Point the device's translation at `root` (the device is activated in the owning
    /// space), or at nothing.
    fn activate(&self, root: Option<PageTableRoot>);
    /// Read and clear the accessed bits of every mapping in `range` of `root`: `Some(true)`
    /// when the hardware set at least one of them since it was last cleared (or since the
    /// mapping was installed), `Some(false)` when none was set or nothing is mapped there,
    /// `None` when the format keeps no accessed bits (the default; the core then evicts
    /// this device's pages by fault order).
    ///
    /// Hardware sets accessed bits concurrently with this call (a walk sets them with an
    /// atomic read-modify-write): clearing must be one compare-exchange per entry so
    /// that a bit set meanwhile is either reported now or kept for the next call. The
    /// driver need not invalidate its TLB here: the core invalidates every device using
    /// the table for a range reported referenced (see the module's contracts).
    fn test_and_clear_accessed(&self, root: PageTableRoot, range: VaRange) -> Option<bool> {
        let _ = (root, range);
        None
    }
}

/// Why a memory operation of a driver failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemError {
    /// The physical range is not memory of this device.
    OutOfRange {
        /// The physical address concerned.
        pa: PhysAddr,
    },
    /// A hardware-specific failure, with the driver's code.
    Hardware(u32),
}

impl core::error::Error for MmuError {}
impl core::error::Error for MemError {}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemError::OutOfRange { pa } => write!(f, "{pa} is not memory of this device"),
            MemError::Hardware(code) => write!(f, "hardware error {code}"),
        }
    }
}

/// A driver's constraint on the frames that may back some pages: CODA's page-groups, a
/// memory stack close to the unit that will use the pages, a DMA window. Frames
/// `[pa, pa + len)` given out under it satisfy `pa % align == phase`, do not cross a
/// multiple of `nocross` (0 = no constraint) and lie within `[min, max]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameConstraint {
    /// Alignment of the first frame (0 or a power of two of at least 4 KiB).
    pub align: u64,
    /// Offset from that alignment.
    pub phase: u64,
    /// Boundary the run may not cross (0 or a power of two).
    pub nocross: u64,
    /// Lowest usable physical address.
    pub min: PhysAddr,
    /// Highest usable physical address (inclusive).
    pub max: PhysAddr,
}

/// The largest bounce buffer [`DeviceMemory::copy`]'s default uses (64 KiB).
pub const COPY_BOUNCE_BYTES: u64 = 64 << 10;

/// [`DeviceMemory::copy`]'s default: `len` bytes from `src` of `from` to `dst` of `to`
/// through a bounce buffer of at most [`COPY_BOUNCE_BYTES`]. An overriding `copy` calls
/// it for destinations it cannot copy to directly.
///
/// # Errors
/// The first [`MemError`] of a `read` or `write`.
pub fn bounce_copy<M: DeviceMemory + ?Sized>(
    from: &M,
    src: PhysAddr,
    to: &dyn DeviceMemory,
    dst: PhysAddr,
    len: u64,
) -> Result<(), MemError> {
    let mut buf = alloc::vec![0u8; len.min(COPY_BOUNCE_BYTES) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(COPY_BOUNCE_BYTES);
        let b = &mut buf[..n as usize];
        let at = |base: PhysAddr| {
            base.as_u64()
                .checked_add(done)
                .map(PhysAddr::new)
                .ok_or(MemError::OutOfRange { pa: base })
        };
        from.read(at(src)?, b)?;
        to.write(at(dst)?, b)?;
        done += n;
    }
    Ok(())
}

/// How the core moves bytes in a device's local memory (the data mover).
pub trait DeviceMemory: Send + Sync {
    /// Fill `len` bytes from `pa` with zeros (bulk zeroing: `len` may be a whole 2 MiB
    /// block).
    ///
    /// # Errors
    /// [`MemError`] when the range is not memory of this device or the hardware fails.
    fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError>;
    /// Read `buf.len()` bytes from `pa`.
    ///
    /// # Errors
    /// [`MemError`] when the range is not memory of this device or the hardware fails.
    fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError>;
    /// Write `buf` at `pa`.
    ///
    /// # Errors
    /// [`MemError`] when the range is not memory of this device or the hardware fails.
    fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), MemError>;
    /// Copy `len` bytes from `src` in this memory to `dst` in memory `to` (another
    /// device's, or this one: the ranges then do not overlap) in one operation. The core
    /// calls it once per physically contiguous run it migrates.
    ///
    /// The default moves the bytes through a bounce buffer of at most
    /// [`COPY_BOUNCE_BYTES`], `read` from this memory then `write` to `to`, which any
    /// pair of memories supports. A data mover that copies directly (a DMA engine, or a
    /// simulated memory copying between its own kind) overrides it, recognising `to`
    /// through [`DeviceMemory::as_any`], and falls back to the bounce copy otherwise.
    ///
    /// # Errors
    /// [`MemError`] when a range is not memory of its device or the hardware fails; the
    /// bytes of `dst` copied before the failure may have changed.
    fn copy(
        &self,
        src: PhysAddr,
        to: &dyn DeviceMemory,
        dst: PhysAddr,
        len: u64,
    ) -> Result<(), MemError> {
        bounce_copy(self, src, to, dst, len)
    }
    /// This memory as [`core::any::Any`], so that an overriding [`DeviceMemory::copy`]
    /// can recognise a destination of its own type. `None` (the default) opts out.
    fn as_any(&self) -> Option<&dyn core::any::Any> {
        None
    }
    /// Where the frames of `request` should come from in this memory (the default:
    /// anywhere). Asked before every allocation in this device's memory, under the
    /// space's lock: answer from the request alone, without calling the core.
    fn frame_request(&self, request: &FrameRequest) -> FramePlacement {
        let _ = request;
        FramePlacement::Any
    }
    /// The page-group class of the frames of `request` (0, the default, for every
    /// request). Asked with [`DeviceMemory::frame_request`] before every allocation
    /// in this device's memory; it matters only once the memory is managed in page
    /// groups (`Gmem::dev_set_page_groups`): the frames then come from groups of that
    /// class (CODA: fine- or coarse-grain interleaving, from the pages' attributes).
    fn frame_class(&self, request: &FrameRequest) -> u32 {
        let _ = request;
        0
    }
    /// The page group of `frames` frames from `base` (all free) changes class from
    /// `from` to `to`. The core calls it before it hands out any frame of the group,
    /// so before any is zeroed, copied or mapped; it holds the device's frame lock
    /// meanwhile, so the driver must not call back into the core. The default does
    /// nothing.
    fn group_class_changed(&self, base: PhysAddr, frames: u64, from: u32, to: u32) {
        let _ = (base, frames, from, to);
    }
}
