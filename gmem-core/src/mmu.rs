//! The driver-facing interface: what a device driver implements.
//!
//! A driver implements [`Mmu`] (its page-table format and its TLB) and, if the device
//! has local memory, [`DeviceMemory`] (how to zero, read and write its frames). That is
//! all: the core decides what is mapped where and calls these functions.
//!
//! ## Contracts
//! - **Where driver calls come from.** Every call the core makes to a driver (but
//!   [`Mmu::page_sizes`], asked once when the device registers) is made inside a KPI
//!   call, on the thread (the CPU) making it, so inside the platform's critical section
//!   ([`crate::Platform::enter_critical`]: interrupts and preemption off in a kernel). Most run with the owning space's lock held; [`Mmu::activate`]
//!   also with the device's binding; [`DeviceMemory::group_class_changed`] with the
//!   device's frame lock. A driver therefore must not call back into the core — the
//!   one call that answers instead of waiting is [`crate::Gmem::dev_try_fault`], with
//!   [`crate::FaultError::Busy`], and not from `group_class_changed` (a fault waits for
//!   the frame lock it runs under) — and must not wait for anything that needs an
//!   interrupt on the calling CPU (an IPI's acknowledgement must reach a CPU spinning
//!   with interrupts off: see the guide's *SMP* section, [`crate::guide`]).
//! - **How calls on one table are serialised.** A page table belongs to one address
//!   space. The core makes every `create_page_table`, `map`, `unmap`, `protect`,
//!   `test_and_clear_accessed`, `activate` and `destroy_page_table` concerning it with
//!   that space's lock held, so they never overlap and an implementation needs no
//!   locking of its own for one table's entries. Two exceptions: [`Mmu::invalidate`]
//!   may come without the space lock (a strict `region_dealloc` invalidates after
//!   releasing it), concurrently with other calls on the same MMU; and a driver that
//!   opts in with [`Mmu::concurrent_edits`] gets `map`s and `unmap`s of *disjoint*
//!   ranges of one table at once (below). Calls concerning **different** tables — two
//!   spaces, on two CPUs — run at the same time: state a driver shares between its
//!   tables (its page-table frame pool, its list of roots, a TLB or the set of CPUs to
//!   shoot down) needs its own synchronisation.
//! - **Empty protection.** The core does not install a mapping that allows nothing:
//!   `region_map` refuses [`Prot::empty`], and a protect to no access
//!   (`region_protect` of a region or a range) *unmaps* the pages instead of calling
//!   [`Mmu::protect`] (and invalidates them), so a format need not encode a present
//!   leaf without permissions. Eager mappings (replicas, wiring, private frames) and
//!   large leaves skip pages of no access, and a fault on a page of no access is
//!   refused ([`crate::FaultError::ProtectionViolation`]) whatever access it names,
//!   the empty one included.
//! - **What `activate(None)` means.** The core calls `activate(Some(root))` when the
//!   device is switched to a space (`dev_switch`, `as_attach` with
//!   [`crate::Activation::Switch`]) and `activate(None)` when the space it is active in
//!   detaches it or is destroyed (`dev_detach`, `as_destroy`), always before that table
//!   is destroyed. The call runs on the calling CPU only: for the CPU device it means
//!   "this CPU stops translating through the core's tables", not "turn paging off" —
//!   the kernel keeps running, so a CPU driver points the CPU at a table holding only
//!   the kernel's own mappings (`drivers/sv39` switches to its template table of global
//!   mappings). Other CPUs running on the table must switch away themselves before
//!   the device is detached, each calling the driver's own `activate(None)` on its
//!   own CPU (as the Sv39 kernel's harts do): the core's call reaches only the caller.
//! - **The kernel's half is the driver's.** The core maps, unmaps, protects and
//!   invalidates only addresses inside its spaces' ranges (`as_create`); it never
//!   touches what lies outside. Since `activate` points the CPU at a table the core
//!   asked for, every table a CPU driver creates must already hold the kernel's own
//!   mappings (code, stacks, heap, MMIO, the direct map: the upper half), as
//!   `drivers/sv39` copies its *global* mappings into every table it creates; and no
//!   space may overlap them. The kernel's heap, and everything a core call or a driver
//!   callback touches, lives there: a fault on it inside a core call cannot be served.
//! - [`Mmu::map`] receives a whole physically contiguous run with the leaf size the
//!   core asks for in [`MapRun::page_size`] (see *Large leaves* below); a driver may add
//!   contiguity hints (MESC subregion bits). [`Mmu::unmap`] and [`Mmu::protect`] receive
//!   whole virtual ranges, never split by the core; ranges handed to one call never cross
//!   the boundary of a region.
//! - After [`Mmu::unmap`] or [`Mmu::protect`] the core calls [`Mmu::invalidate`] on every
//!   device using that table before it reuses the virtual range or the frames; a driver
//!   must not rely on its own invalidation inside `unmap` (it may do one — the core's is
//!   then redundant, never missing).
//! - The core never invalidates after [`Mmu::map`] (nothing valid was replaced). Hardware
//!   that may cache a *non-present* entry it read earlier (RISC-V harts, IOMMUs in
//!   caching mode) needs a fence after `map`: that fence is the driver's job.
//! - Page-table pages a driver unlinks in `unmap` may still be cached by page-walk
//!   caches until the next invalidation; a driver frees them only after its own
//!   invalidation of that table. (For a table shared by several devices the core
//!   invalidates every sharer in the same call sequence, the last sharer's
//!   invalidation completing the batch.)
//! - Accessed bits ([`Mmu::test_and_clear_accessed`], optional): the eviction scan asks
//!   the tables that map a candidate page whether the hardware set its accessed bit
//!   since the last look, and clears it. A TLB that caches the translation would let
//!   the device keep using the page without setting the bit again, so for every range
//!   the driver reports referenced the core invalidates the TLB of every device using
//!   that table (one `invalidate` per device, as for an unmap) before it trusts the bit
//!   again; a driver need not invalidate inside the call. A driver without accessed
//!   bits keeps the default (`None`) and its memory is aged by fault order (FIFO).
//! - Region attributes ([`Attrs`], `region_set_attrs`) are the driver's per-page value:
//!   the core stores them with the pages' protection (split off per page range as a
//!   range protect splits a region) and hands them back in every [`MapRun`] (a format
//!   bit in the PTE, such as CODA's granularity bit) and every [`FrameRequest`].
//! - Frame placement: before every allocation in a device's memory the core asks its
//!   [`DeviceMemory::frame_request`] with the space, the virtual address, the page
//!   count, the attributes and the faulting device (if a fault asked). The answer is
//!   any frame, a hard constraint ([`FramePlacement::Require`]: when none is free the
//!   core evicts rather than look elsewhere) or a soft preference
//!   ([`FramePlacement::Prefer`]: tried first, then any frame, never evicting for it).
//! - Page groups ([`DeviceMemory::frame_class`], [`DeviceMemory::group_class_changed`],
//!   optional): once a device's memory is managed in groups of `2^k` frames
//!   (`Gmem::dev_set_page_groups`), every frame request names a class and gets frames
//!   of groups of that class only. A group changes class only while all its frames are
//!   free, and the driver hears of the change before any frame of the group is handed
//!   out — so before it is zeroed, copied or mapped. The announcement comes with the
//!   device's frame lock held: the driver records it and must not call into the core.
//! - Copies ([`DeviceMemory::copy`]): migration, eviction and compaction move each
//!   physically contiguous run of pages in one call (up to 2 MiB for migration and
//!   compaction, 64 KiB for eviction, which takes only cold pages along).
//!
//! ## Large leaves
//! A driver advertises the leaf sizes its format maps in [`Mmu::page_sizes`] (4 KiB
//! always; 64 KiB, 2 MiB, 1 GiB as the hardware allows). The core asks for a large leaf
//! — a [`MapRun`] whose `page_size` is that size, whose `va`, `pa` and `len` are
//! multiples of it — exactly when the virtual block is aligned, the frames behind it are
//! one aligned contiguous block in one memory, and the block lies in one region with
//! one protection; everything else comes as 4 KiB runs. The driver:
//! - maps a run with leaves of `page_size` and never larger ones (a run asked for as
//!   4 KiB gets 4 KiB leaves even where its alignment would allow more; the core keeps
//!   a record of every large leaf it asked for and checks it in `check_invariants`). A
//!   size it did not advertise, or a misaligned large run, is
//!   [`MmuError::Unsupported`]. A driver that cannot hold a large leaf right now may
//!   map the run with smaller leaves (translation is what counts; the split below is
//!   then a no-op);
//! - **splits** a large leaf when an [`Mmu::unmap`] or [`Mmu::protect`] covers it in
//!   part — a partial unmap, protect (`region_protect`), migration or eviction:
//!   it replaces the leaf by a table of smaller leaves that translate every page
//!   exactly as before and then applies the edit to the covered ones. The core treats
//!   the block as mapped by 4 KiB leaves afterwards (a driver that splits into an
//!   intermediate size, 1 GiB into 2 MiB, must be able to split those again the same
//!   way). An unmap or protect covering a leaf whole keeps it whole (or clears it);
//! - **gets the table page for the split without failing**: `unmap` cannot fail, so
//!   the page must already be there. The way the drivers here do it
//!   (`gmem_ptengine::Engine::with_split_reserve`): when a large leaf is installed, one
//!   table page is taken and kept as the leaf's *split reserve*; the split builds the
//!   new table in it; clearing the leaf whole gives the reserve back. A large leaf whose
//!   reserve cannot be had is installed as smaller leaves. [`Mmu::protect`] may instead
//!   allocate and fail ([`MmuError::OutOfTableMemory`]), leaving that leaf whole and
//!   unchanged: the core then unmaps the leaf's block from that table (faultable
//!   devices fault it back, eager tables get it again), so its record stays true.
//!
//! The core promotes a block back to a large leaf when a fault finds its whole block
//! populated on aligned contiguous frames (typically the fault that fills a superpage
//! reservation), and on `region_promote`; in both cases it first unmaps the block's
//! 4 KiB leaves from the table (and invalidates) and then maps one large run, so a
//! driver never has to replace a table by a leaf in `map`.
//!
//! ## Other contracts
//! - Two MMUs with equal [`PageTableFormat`] can share one page table (shared mode):
//!   the core then edits the table through the MMU of the device that created it
//!   (when that device detaches while others still use the table, through one of
//!   theirs from then on, so that a destroyed device's MMU is never called) and
//!   invalidates the TLB of every sharer through its own MMU.
//! - After [`crate::Gmem::dev_destroy`] returns `Ok`, the core never calls the
//!   device's MMU again; it refuses ([`crate::DeviceError::EditsInFlight`]) while an
//!   edit or invalidation running outside a space lock may still reach it.

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
