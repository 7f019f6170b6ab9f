//! The driver face: everything a device driver implements or is handed.
//!
//! | item | what |
//! |---|---|
//! | [`Mmu`] | the device's page-table format and its TLB (every driver) |
//! | [`DeviceMemory`] | zero, read, write and copy the device's frames (devices with memory) |
//! | [`MapRun`], [`Attrs`], [`PageTableRoot`], [`PageTableFormat`] | what `Mmu` calls are given |
//! | [`FrameRequest`], [`FramePlacement`], [`FrameConstraint`] | where the core places frames, and how a driver steers it |
//! | [`MmuError`], [`MemError`] | what a driver answers on failure |
//! | [`Platform`], [`SingleCpu`] | the kernel's hooks: CPUs and critical sections |
//! | [`FrameSource`] | 4 KiB frames for page-table pages, from the kernel to its drivers (the core never calls it) |
//! | [`DeviceDesc`] | what a driver registers with [`crate::Gmem::dev_create`] |
//! | [`bounce_copy`], [`COPY_BOUNCE_BYTES`] | a default device-to-device copy |
//! | [`crate::sync`] | the core's locks and atomics (loom-switchable), for drivers that want them |
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
//!   `region_map` refuses [`crate::Prot::empty`], and a protect to no access
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

pub use crate::device::DeviceDesc;
pub use crate::mmu::{
    bounce_copy, Attrs, DeviceMemory, FrameConstraint, FramePlacement, FrameRequest, MapRun,
    MemError, Mmu, MmuError, PageTableFormat, PageTableRoot, COPY_BOUNCE_BYTES,
};
pub use crate::platform::{FrameSource, Platform, SingleCpu};
