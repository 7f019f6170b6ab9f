//! The KPI runner: a [`TestSystem`] driven through the whole KPI against a model of
//! address spaces, regions and their bytes.
//!
//! ## The system
//! Four devices exist from the start, in [`TestSystem::devices`] order:
//! 0. the host CPU (format 1, faultable, `host_pages` pages of memory);
//! 1. a discrete GPU (format 7, faultable, `dev_pages` pages of local memory);
//! 2. an integrated GPU (format 1 like the host, so it can share the host's table;
//!    faultable, no memory);
//! 3. an I/O device that cannot fault (format 9, no memory): it sees only wired pages
//!    (and, attached in replicate mode, every populated page).
//!
//! Spaces (at most three live) all cover virtual addresses from 1 GiB, so a device
//! active in one space and accessing an address of another sees the other's pages:
//! the model resolves every access in the device's active space.
//!
//! ## The model
//! Per space: its regions (start, length, reservation with guard pages, protection,
//! placement, anonymous or `region_map`ped, wired) with the bytes of each page that is
//! not all zeros, the attached devices, and the queued asynchronous requests in
//! order. `as_pending` tells how many of the newest requests are still queued (a drain
//! empties the whole queue), so the model knows exactly which requests completed in
//! each operation: their ranges become reusable, their callbacks must have run once.
//!
//! ## What is checked after every operation
//! - the result, or the exact typed error, the model predicts (where the core may
//!   legitimately choose, such as out-of-memory during a fault, the set of allowed
//!   outcomes); every successful read equals the model's bytes, and every write is
//!   read back at once;
//! - a misuse leaves the state as it was: regions, arena counters (but the failure
//!   count), frame counts, queue lengths, active spaces, and no MMU call was made;
//! - [`gmem_core::Gmem::check_invariants`] on every live space;
//! - no TLB holds a translation its page table no longer has (DESIGN invariant 3), in
//!   every space whose queue is empty;
//! - callbacks: each ran exactly once, only after its request's batch, and at that
//!   moment no TLB of the space's devices held a page of an unmapped range;
//! - frames: `dev_free_extents` adds up to the free frames, `dev_compact` keeps the
//!   frames in the memory and never loses a free block (and the bytes it moved are
//!   read back by later operations), page groups are set up only on a free memory, a
//!   group changes class only while free (`check_invariants` checks every group is
//!   uniform), and every misuse of these calls is a typed error that changes nothing;
//! - at the end every space is destroyed and every frame of every memory is free.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use gmem_core::testing::{AccessError, MmuEvent, TestMmu, TestSystem, HOST_BASE};
use gmem_core::vmem::{Constraint, ConstraintProblem};
use gmem_core::{
    Activation, AddrError, AllocError, AllocPolicy, AttachError, Attrs, DevCaps, DeviceError,
    DeviceId, EvictionPolicy, FaultError, FrameError, MapError, MapFlags, MapRequest, MigrateScope,
    MmuMode, PageSizes, PageTableRoot, PhysAddr, Placement, PlacementMode, PlacementTarget,
    PolicyError, PopulateError, Prot, ProtectError, Region, RegionError, SpaceError, SpaceId,
    VaRange, VirtAddr, PAGE_SIZE,
};

/// Operations a fuzz input or a seeded sequence may hold at most.
pub const MAX_OPS: usize = 256;

/// Devices of the system (see the module documentation).
pub const NDEV: usize = 4;
const HOST: usize = 0;
const DGPU: usize = 1;
const IGPU: usize = 2;
const IO: usize = 3;
const DGPU_BASE: u64 = 0x8000_0000;
/// Caller-owned frames for `region_map`: host memory outside the registered range,
/// handed out once each (a bump pointer) so that no two mappings alias.
const EXTERNAL_BASE: u64 = 0x7000_0000;
/// Every space starts here.
const SPACE_BASE: u64 = 1 << 30;
const MAX_SPACES: usize = 3;

/// Sizes of the system.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct Setup {
    /// Host memory: 48 + this modulo 160 pages.
    pub host_pages: u8,
    /// Discrete GPU memory: 2 + this modulo 30 pages.
    pub dev_pages: u8,
    /// The queue's batch limit of every new space: 1 + this modulo 8.
    pub batch_limit: u8,
    /// The policy of the first space, which the runner creates before the operations
    /// (with every device attached and active, regions of 1, 4 and 8 pages and two of 16
    /// pages aligned to 64 KiB).
    pub policy: PolicySel,
    /// The mode the integrated GPU attaches to the first space with.
    pub igpu_mode: Mode,
    /// The mode the I/O device attaches to the first space with.
    pub io_mode: Mode,
    /// Whether the I/O device's tables take concurrent edits (so that `region_map`
    /// and strict deallocation edit them outside the space lock).
    pub io_concurrent: bool,
}

/// An allocation policy of a new space.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct PolicySel {
    /// 0: none, 1: instant, 2: best, 3: first, 4: next (modulo 5).
    pub fit: u8,
    /// Guard pages.
    pub guarded: bool,
    /// Quantum caches with magazines.
    pub cached: bool,
}

/// An MMU mode.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// [`MmuMode::Shared`].
    Shared,
    /// [`MmuMode::Coherent`].
    Coherent,
    /// [`MmuMode::Replicate`].
    Replicate,
}

/// A protection.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum ProtSel {
    /// Read only.
    Read,
    /// Read and write.
    ReadWrite,
    /// Everything.
    All,
    /// Nothing: no access (a misuse for `region_map` only).
    Empty,
}

impl ProtSel {
    fn prot(self) -> Prot {
        match self {
            ProtSel::Read => Prot::READ,
            ProtSel::ReadWrite => Prot::RW,
            ProtSel::All => Prot::RWX,
            ProtSel::Empty => Prot::empty(),
        }
    }
}

/// A wrong argument of `region_map`.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapMisuse {
    /// None: a valid call.
    None,
    /// One frame too few.
    FrameCount,
    /// A frame inside the managed host memory.
    ManagedFrame,
    /// A frame that is not page aligned.
    UnalignedFrame,
}

/// A bad `as_alloc` argument.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum AllocMisuse {
    /// Size 0.
    ZeroSize,
    /// Size not a page multiple.
    UnalignedSize,
    /// Hint not page aligned.
    UnalignedHint,
    /// Alignment not a power of two.
    AlignNotPowerOfTwo,
    /// Alignment below a page.
    SmallAlign,
    /// No-cross boundary not a power of two.
    NocrossNotPowerOfTwo,
}

/// A bad `as_create` argument.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum CreateMisuse {
    /// `end <= begin`.
    Empty,
    /// `begin` not page aligned.
    UnalignedBegin,
    /// Length not a page multiple.
    UnalignedEnd,
    /// Two fit policies.
    TwoFits,
}

/// What a stale region handle is used for.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum StaleUse {
    /// `region_dealloc`.
    Dealloc,
    /// `region_unmap`.
    Unmap,
    /// `region_protect`.
    Protect,
    /// `region_info`.
    Info,
    /// `region_set_policy`.
    SetPolicy,
    /// `region_map`.
    Map,
    /// `region_migrate`.
    Migrate,
    /// `region_wire`.
    Wire,
    /// `region_unwire`.
    Unwire,
}

/// One KPI operation. `space`, `region` and `dev` choose among live spaces, live
/// regions (of all spaces, in order) and the four devices, modulo their number; an
/// operation with nothing to choose is a no-op.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Op {
    /// `as_create` over 64 or 192 pages.
    CreateSpace {
        /// 192 pages instead of 64.
        large: bool,
        /// The policy.
        policy: PolicySel,
    },
    /// `as_create` with a bad argument.
    CreateSpaceBad {
        /// Which.
        what: CreateMisuse,
    },
    /// `as_destroy`.
    DestroySpace {
        /// Which.
        space: u8,
    },
    /// `as_attach`.
    Attach {
        /// Where.
        space: u8,
        /// Who.
        dev: u8,
        /// How.
        mode: Mode,
        /// And make it the device's active space.
        activate: bool,
    },
    /// `dev_detach`.
    Detach {
        /// Where.
        space: u8,
        /// Who.
        dev: u8,
    },
    /// `dev_switch`.
    Switch {
        /// Where.
        space: u8,
        /// Who.
        dev: u8,
    },
    /// `as_alloc` with constraints.
    Alloc {
        /// Where.
        space: u8,
        /// Size in pages (modulo 24; 0 is misuse).
        pages: u8,
        /// Alignment `PAGE_SIZE << s` when below 8, else none.
        align_shift: u8,
        /// No-cross boundary `PAGE_SIZE << s` when below 9, else none.
        nocross_shift: u8,
        /// A hint, in pages from the space's start.
        hint: Option<u8>,
        /// The last address, in pages from the space's start (exclusive end).
        max: Option<u8>,
    },
    /// `as_alloc` with a bad argument.
    AllocBad {
        /// Where.
        space: u8,
        /// Which.
        what: AllocMisuse,
    },
    /// `region_dealloc`.
    Dealloc {
        /// Which.
        region: u16,
        /// With [`MapFlags::ASYNC`].
        asynchronous: bool,
        /// With a completion callback.
        callback: bool,
    },
    /// `region_unmap`.
    Unmap {
        /// Which.
        region: u16,
        /// With [`MapFlags::ASYNC`].
        asynchronous: bool,
        /// With a completion callback.
        callback: bool,
    },
    /// `region_map` of fresh caller frames in host memory.
    Map {
        /// Which.
        region: u16,
        /// Its protection.
        prot: ProtSel,
        /// With [`MapFlags::ASYNC`].
        asynchronous: bool,
        /// With a completion callback.
        callback: bool,
        /// A wrong argument, if any.
        misuse: MapMisuse,
    },
    /// A store through a device (fault-and-retry as hardware does).
    Write {
        /// Through which device.
        dev: u8,
        /// Into which region (the address is resolved in the device's active space).
        region: u16,
        /// Page of the region.
        page: u8,
        /// Offset in the page.
        offset: u16,
        /// Bytes (up to the end of the page).
        len: u16,
        /// Content seed.
        seed: u8,
    },
    /// A load through a device.
    Read {
        /// Through which device.
        dev: u8,
        /// From which region.
        region: u16,
        /// Page of the region.
        page: u8,
        /// Offset in the page.
        offset: u16,
        /// Bytes (up to the end of the page).
        len: u16,
    },
    /// A load at any page of a space's range (allocated or not, guard pages too).
    ReadAnywhere {
        /// Through which device.
        dev: u8,
        /// Whose range.
        space: u8,
        /// Page from the space's start.
        page: u8,
    },
    /// `dev_fault` called directly, at any offset of a page.
    Fault {
        /// Which device.
        dev: u8,
        /// Which region.
        region: u16,
        /// Page of the region.
        page: u8,
        /// Offset in the page (unaligned addresses are fine for faults).
        offset: u16,
        /// A store (else a load).
        write: bool,
    },
    /// `region_set_policy`.
    SetPolicy {
        /// Which.
        region: u16,
        /// 0: faulting device, 1: host, 2..: device `n - 2` (modulo 6).
        target: u8,
        /// Remote access instead of unique.
        remote: bool,
    },
    /// `region_set_zero_fill_block`.
    ZeroFillBlock {
        /// Which.
        region: u16,
        /// `PAGE_SIZE << s` when below 11, 0 (default) at 11, else a bad value.
        shift: u8,
    },
    /// `region_protect`.
    Protect {
        /// Which.
        region: u16,
        /// The new protection (empty is no access).
        prot: ProtSel,
    },
    /// `region_protect_range` of pages `page..page + pages` (modulo the region).
    ProtectRange {
        /// Which.
        region: u16,
        /// First page.
        page: u8,
        /// Pages (1 + this modulo what is left of the region).
        pages: u8,
        /// The new protection.
        prot: ProtSel,
        /// Reach one page past the region's end (misuse).
        bad: bool,
    },
    /// `region_unmap_range` (strict).
    UnmapRange {
        /// Which.
        region: u16,
        /// First page.
        page: u8,
        /// Pages.
        pages: u8,
        /// Reach one page past the region's end (misuse).
        bad: bool,
    },
    /// `region_migrate_range` of populated pages.
    MigrateRange {
        /// Which.
        region: u16,
        /// First page.
        page: u8,
        /// Pages.
        pages: u8,
        /// Where.
        dev: u8,
    },
    /// `region_wire_range`.
    WireRange {
        /// Which.
        region: u16,
        /// First page.
        page: u8,
        /// Pages.
        pages: u8,
    },
    /// `region_unwire_range`.
    UnwireRange {
        /// Which.
        region: u16,
        /// First page.
        page: u8,
        /// Pages.
        pages: u8,
    },
    /// `dev_evacuate` (the host and dead devices are misuse).
    Evacuate {
        /// Which device.
        dev: u8,
    },
    /// `region_set_attrs` (whole region) or `region_set_attrs_range`; then every
    /// mapping of the region's pages in every active table carries the model's value.
    SetAttrs {
        /// Which.
        region: u16,
        /// The whole region (else a range).
        whole: bool,
        /// First page.
        page: u8,
        /// Pages.
        pages: u8,
        /// The value (small, so that equal values meet and pieces merge).
        value: u8,
    },
    /// `region_migrate`.
    Migrate {
        /// Which.
        region: u16,
        /// Where.
        dev: u8,
        /// Also prepare pages that have no frame.
        prefetch: bool,
    },
    /// `region_wire`.
    Wire {
        /// Which.
        region: u16,
    },
    /// `region_unwire`.
    Unwire {
        /// Which.
        region: u16,
    },
    /// `as_synchronize`.
    Synchronize {
        /// Which.
        space: u8,
    },
    /// A region handle that outlived its region (or its space), used again.
    Stale {
        /// Which of the dead handles.
        pick: u16,
        /// For what.
        what: StaleUse,
    },
    /// A space handle that outlived its space, used again.
    StaleSpace {
        /// Which of the dead handles.
        pick: u8,
    },
    /// `dev_destroy` (the host and attached or busy devices are misuse).
    DestroyDevice {
        /// Which.
        dev: u8,
    },
    /// `as_fail_every`: every n-th region allocation fails (0 = off).
    FailEvery {
        /// Where.
        space: u8,
        /// n, modulo 4.
        n: u8,
    },
    /// Read every page of a region through a device and compare it with the model.
    Verify {
        /// Through which device.
        dev: u8,
        /// Which region.
        region: u16,
    },
    /// `dev_set_eviction_policy`: FIFO or CLOCK for a device's memory (which pages get
    /// evicted changes, never the bytes the model predicts).
    SetEviction {
        /// Which device.
        dev: u8,
        /// CLOCK (else FIFO).
        clock: bool,
    },
    /// `dev_free_extents`: the histogram adds up to the device's free frames (a device
    /// without memory is misuse).
    Extents {
        /// Which device.
        dev: u8,
        /// The order of the index checked (modulo 20).
        order: u8,
    },
    /// `dev_compact` at order `order % 4` (the memories are small), or 19 + `order %
    /// 2` (misuse) for `order >= 248`: frames stay in the memory, free blocks never
    /// decrease, bytes are checked by later reads.
    Compact {
        /// Which device.
        dev: u8,
        /// The order.
        order: u8,
    },
    /// `dev_set_page_groups`: groups of `2^(order % 21)` frames (above 18 misuse) or
    /// none; refused unless every frame of the memory is free.
    PageGroups {
        /// Which device.
        dev: u8,
        /// The group order, or none.
        order: Option<u8>,
    },
    /// `dev_set_group_class` for the group of frame `frame % (pages + 2)` of the
    /// device's memory (past its end: misuse).
    GroupClass {
        /// Which device.
        dev: u8,
        /// Which frame.
        frame: u8,
        /// The class (modulo 4).
        class: u8,
    },
    /// The discrete GPU's memory answers page-group class `(va / 16 KiB) % n` for
    /// `n = classes % 4` (0: class 0 for every request).
    FrameClasses {
        /// n.
        classes: u8,
    },
    /// `region_promote`: gather the region's large-leaf blocks and map them large
    /// (where pages go never changes the bytes the model predicts).
    Promote {
        /// Which region.
        region: u16,
    },
    /// `dev_set_reservations`: superpage reservations on or off in a device's memory.
    SetReservations {
        /// Which device.
        dev: u8,
        /// On (else off).
        on: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Anonymous,
    /// `region_map`ped caller frames; `mapped` false after an unmap.
    Explicit {
        mapped: bool,
    },
}

#[derive(Clone, Debug)]
struct RegionModel {
    handle: Region,
    len: u64,
    reserve: (u64, u64),
    prot: Prot,
    placement: Placement,
    zero_fill_block: u64,
    kind: Kind,
    /// Pages whose bytes are not all zero.
    bytes: BTreeMap<u64, Vec<u8>>,
    /// Pages that certainly have a frame.
    populated: BTreeSet<u64>,
    /// Some page may have a frame the model does not know of (bulk zeroing).
    maybe_populated: bool,
    /// Pages `region_wire(_range)` wired and nothing unwired or unmapped since.
    wired: BTreeSet<u64>,
    /// Pages whose protection a range protect made differ from the region's.
    prots: BTreeMap<u64, Prot>,
    /// Pages of a `region_map`ped region that a range unmap emptied.
    holes: BTreeSet<u64>,
    /// The driver attributes of each page whose value is not 0.
    attrs: BTreeMap<u64, u32>,
}

impl RegionModel {
    fn pages(&self) -> u64 {
        self.len / PAGE_SIZE
    }
    fn start(&self) -> u64 {
        self.handle.start.as_u64()
    }
    fn clear_pages(&mut self) {
        self.bytes.clear();
        self.populated.clear();
        self.maybe_populated = false;
        self.wired.clear();
        self.holes.clear();
    }
    /// The protection of `page`.
    fn prot_of(&self, page: u64) -> Prot {
        self.prots.get(&page).copied().unwrap_or(self.prot)
    }
    /// Pages `page..page + pages` of a range op (in range), or one page past the end.
    fn range(&self, page: u8, pages: u8, bad: bool) -> (u64, u64) {
        let p0 = u64::from(page) % self.pages();
        let left = self.pages() - p0;
        if bad {
            return (p0, left + 1);
        }
        (p0, 1 + u64::from(pages) % left)
    }
    fn va_range(&self, (p0, n): (u64, u64)) -> VaRange {
        VaRange {
            start: VirtAddr::new(self.start() + p0 * PAGE_SIZE),
            len: n * PAGE_SIZE,
        }
    }
    fn any_populated(&self) -> Option<bool> {
        if !self.populated.is_empty() || !self.wired.is_empty() {
            Some(true)
        } else if self.maybe_populated {
            None
        } else {
            Some(false)
        }
    }
}

#[derive(Clone, Debug)]
enum Request {
    /// An unmap or dealloc: `range` (start, len) of the pages; `reserve` released at
    /// completion (dealloc).
    Unmap {
        range: (u64, u64),
        reserve: Option<(u64, u64)>,
        callback: Option<u64>,
    },
    /// An asynchronous `region_map` of the region starting here.
    Map { start: u64, callback: Option<u64> },
}

#[derive(Debug)]
struct SpaceModel {
    id: SpaceId,
    begin: u64,
    pages: u64,
    guard: u64,
    regions: BTreeMap<u64, RegionModel>,
    /// Attached devices and their effective modes.
    attached: BTreeMap<usize, MmuMode>,
    /// Queued requests, oldest first.
    queue: Vec<Request>,
    fail_every: u64,
    attempts: u64,
}

impl SpaceModel {
    fn end(&self) -> u64 {
        self.begin + self.pages * PAGE_SIZE
    }
    fn region_at(&self, va: u64) -> Option<&RegionModel> {
        let (_, r) = self.regions.range(..=va).next_back()?;
        (va - r.start() < r.len).then_some(r)
    }
    /// Whether a queued unmap covers `va` (a TLB may still translate it).
    fn unmap_pending(&self, va: u64) -> bool {
        self.queue.iter().any(|q| match q {
            Request::Unmap { range, .. } => va >= range.0 && va - range.0 < range.1,
            Request::Map { .. } => false,
        })
    }
    fn map_pending(&self, start: u64) -> bool {
        self.queue
            .iter()
            .any(|q| matches!(q, Request::Map { start: s, .. } if *s == start))
    }
    /// Reservations a new region must not overlap: live regions' and queued ones'.
    fn busy(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.regions.values().map(|r| r.reserve).collect();
        for q in &self.queue {
            if let Request::Unmap {
                reserve: Some(r), ..
            } = q
            {
                v.push(*r);
            }
        }
        v
    }
}

/// What the model allows an access or a fault to end with.
#[derive(Clone, Debug)]
enum Expect {
    /// Must succeed.
    Ok,
    /// Must fail with exactly this.
    Err(AccessError),
    /// May succeed (then with the model's bytes) or fail with one of these.
    Either(Vec<AccessError>),
    /// A stale translation may serve it: anything but a panic goes, nothing is checked.
    Unknown,
}

/// Callback bookkeeping shared with the callbacks themselves.
#[derive(Default)]
struct Callbacks {
    /// Ids in the order they ran.
    fired: Vec<u64>,
    /// Broken expectations seen inside callbacks.
    violations: Vec<String>,
}

/// The runner: the system under test and the model.
pub struct KpiRunner {
    sys: TestSystem,
    devices: [DeviceId; NDEV],
    alive: [bool; NDEV],
    active: [Option<usize>; NDEV],
    spaces: Vec<Option<SpaceModel>>,
    dead_spaces: Vec<SpaceId>,
    dead_regions: Vec<Region>,
    /// Page-table roots learnt from the event log: (space slot, device) → root.
    roots: HashMap<(usize, usize), PageTableRoot>,
    batch_limit: usize,
    setup: Setup,
    next_external: u64,
    callbacks: Arc<Mutex<Callbacks>>,
    expected_fired: Vec<u64>,
    next_callback: u64,
    /// The state before the current operation, for misuse checks.
    pre: Option<String>,
    summary: crate::Summary,
    step: usize,
}

fn pattern(seed: u8, len: usize, at: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((at + i).wrapping_mul(131) as u8).wrapping_add(seed) | 1)
        .collect()
}

fn prot_access(write: bool) -> Prot {
    if write {
        Prot::WRITE
    } else {
        Prot::READ
    }
}

impl KpiRunner {
    /// A system with the four devices and no space.
    pub fn new(setup: Setup) -> KpiRunner {
        let host_pages = 48 + u64::from(setup.host_pages % 160);
        let dev_pages = 2 + u64::from(setup.dev_pages % 30);
        // The host and the discrete GPU map 64 KiB leaves too: 16-page blocks fit the
        // small memories, so large leaves, splits and promotions happen in sequences.
        let mut sys = TestSystem::with_host_sizes(host_pages, PageSizes::S4K | PageSizes::S64K);
        let dgpu = sys.add_device_with_sizes(
            7,
            DevCaps::FAULTABLE,
            DGPU_BASE,
            dev_pages,
            PageSizes::S4K | PageSizes::S64K,
        );
        let igpu = sys.add_device(1, DevCaps::FAULTABLE, 0, 0);
        sys.concurrent_edits = setup.io_concurrent;
        let io = sys.add_device(9, DevCaps::empty(), 0, 0);
        assert_eq!((dgpu, igpu, io), (DGPU, IGPU, IO));
        let devices = [
            sys.devices[HOST].id,
            sys.devices[DGPU].id,
            sys.devices[IGPU].id,
            sys.devices[IO].id,
        ];
        sys.take_events();
        KpiRunner {
            sys,
            devices,
            alive: [true; NDEV],
            active: [None; NDEV],
            spaces: Vec::new(),
            dead_spaces: Vec::new(),
            dead_regions: Vec::new(),
            roots: HashMap::new(),
            batch_limit: 1 + usize::from(setup.batch_limit % 8),
            setup,
            next_external: EXTERNAL_BASE,
            callbacks: Arc::new(Mutex::new(Callbacks::default())),
            expected_fired: Vec::new(),
            next_callback: 0,
            pre: None,
            summary: crate::Summary::default(),
            step: 0,
        }
    }

    /// Apply every operation with its checks; then destroy every space and check that
    /// every frame is free again and every callback ran once.
    pub fn run(mut self, ops: &[Op]) -> crate::Summary {
        let prologue = self.prologue();
        for op in prologue.iter().chain(ops) {
            let ctx = format!("step {} {op:?}", self.step);
            if std::env::var_os("GMEM_TESTKIT_TRACE").is_some() {
                eprintln!("{ctx}");
            }
            self.checkpoint();
            self.apply(op, &ctx);
            self.after(&ctx);
            self.step += 1;
        }
        let ctx = "teardown".to_string();
        for slot in 0..self.spaces.len() {
            if let Some(sp) = &self.spaces[slot] {
                let id = sp.id;
                assert_eq!(self.sys.gm.as_destroy(id), Ok(()), "{ctx}");
                self.summary.succeeded += 1;
                self.space_destroyed(slot);
            }
        }
        self.after(&ctx);
        for d in [HOST, DGPU] {
            if !self.alive[d] {
                continue;
            }
            let f = self
                .sys
                .gm
                .dev_frames(self.devices[d])
                .expect("live device");
            assert_eq!(
                (f.free, f.active, f.inactive, f.wired, f.pending),
                (f.registered, 0, 0, 0, 0),
                "{ctx}: device {d} lost frames"
            );
        }
        self.summary.ops = ops.len() as u64;
        let st = self.sys.gm.stats();
        self.summary.large_maps = st.large_maps;
        self.summary.large_splits = st.large_splits;
        self.summary.promotions = st.promotions;
        self.summary
    }

    /// The first space, its devices and regions, as operations (so the model follows).
    fn prologue(&self) -> Vec<Op> {
        let s = self.setup;
        let mut ops = vec![Op::CreateSpace {
            large: false,
            policy: s.policy,
        }];
        for (dev, mode) in [
            (HOST, Mode::Coherent),
            (DGPU, Mode::Coherent),
            (IGPU, s.igpu_mode),
            (IO, s.io_mode),
        ] {
            ops.push(Op::Attach {
                space: 0,
                dev: dev as u8,
                mode,
                activate: true,
            });
        }
        for pages in [1, 4, 8] {
            ops.push(Op::Alloc {
                space: 0,
                pages,
                align_shift: 255,
                nocross_shift: 255,
                hint: None,
                max: None,
            });
        }
        // Two 64 KiB blocks, 64 KiB aligned: large leaves, splits and promotions.
        for _ in 0..2 {
            ops.push(Op::Alloc {
                space: 0,
                pages: 16,
                align_shift: 4,
                nocross_shift: 255,
                hint: None,
                max: None,
            });
        }
        ops
    }

    // ----- choosing ------------------------------------------------------------------

    fn live_slots(&self) -> Vec<usize> {
        (0..self.spaces.len())
            .filter(|&s| self.spaces[s].is_some())
            .collect()
    }

    fn pick_space(&self, k: u8) -> Option<usize> {
        let live = self.live_slots();
        (!live.is_empty()).then(|| live[usize::from(k) % live.len()])
    }

    fn pick_region(&self, k: u16) -> Option<(usize, u64)> {
        let all: Vec<(usize, u64)> = self
            .live_slots()
            .into_iter()
            .flat_map(|s| {
                self.spaces[s]
                    .as_ref()
                    .map(|sp| sp.regions.keys().map(move |a| (s, *a)).collect::<Vec<_>>())
                    .unwrap_or_default()
            })
            .collect();
        (!all.is_empty()).then(|| all[usize::from(k) % all.len()])
    }

    fn space(&self, slot: usize) -> &SpaceModel {
        self.spaces[slot].as_ref().expect("live slot")
    }

    fn space_mut(&mut self, slot: usize) -> &mut SpaceModel {
        self.spaces[slot].as_mut().expect("live slot")
    }

    fn region(&self, slot: usize, start: u64) -> &RegionModel {
        &self.space(slot).regions[&start]
    }

    fn region_mut(&mut self, slot: usize, start: u64) -> &mut RegionModel {
        self.space_mut(slot)
            .regions
            .get_mut(&start)
            .expect("live region")
    }

    fn slot_of(&self, id: SpaceId) -> Option<usize> {
        self.live_slots()
            .into_iter()
            .find(|&s| self.space(s).id == id)
    }

    fn callback(
        &mut self,
        want: bool,
        unmapped: Option<(usize, u64, u64)>,
    ) -> Option<(u64, gmem_core::Callback)> {
        if !want {
            return None;
        }
        let id = self.next_callback;
        self.next_callback += 1;
        let log = self.callbacks.clone();
        // For an unmap: the MMUs and roots of the space's devices, to check at
        // completion that no TLB still holds a page of the range.
        let probes: Vec<(Arc<TestMmu>, PageTableRoot)> = match unmapped {
            Some((slot, _, _)) => self
                .roots
                .iter()
                .filter(|((s, _), _)| *s == slot)
                .map(|((_, d), r)| (self.sys.devices[*d].mmu.clone(), *r))
                .collect(),
            None => Vec::new(),
        };
        let range = unmapped.map(|(_, a, l)| (a, l));
        let cb: gmem_core::Callback = Box::new(move |res| {
            let mut c = log.lock().expect("callback log");
            if res.is_err() {
                c.violations.push(format!("callback {id} got {res:?}"));
            }
            if let Some((a, l)) = range {
                for (mmu, root) in &probes {
                    for p in 0..l / PAGE_SIZE {
                        let va = VirtAddr::new(a + p * PAGE_SIZE);
                        if mmu.tlb_holds(*root, va) {
                            c.violations.push(format!(
                                "callback {id} ran while a TLB still held {va:?} (root {root:?})"
                            ));
                        }
                    }
                }
            }
            c.fired.push(id);
        });
        Some((id, cb))
    }

    // ----- operations ----------------------------------------------------------------

    fn apply(&mut self, op: &Op, ctx: &str) {
        match *op {
            Op::CreateSpace { large, policy } => self.create_space(ctx, large, policy),
            Op::CreateSpaceBad { what } => self.create_space_bad(ctx, what),
            Op::DestroySpace { space } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                let id = self.space(slot).id;
                assert_eq!(self.sys.gm.as_destroy(id), Ok(()), "{ctx}");
                self.summary.succeeded += 1;
                self.space_destroyed(slot);
            }
            Op::Attach {
                space,
                dev,
                mode,
                activate,
            } => self.attach(ctx, space, usize::from(dev) % NDEV, mode, activate),
            Op::Detach { space, dev } => self.detach(ctx, space, usize::from(dev) % NDEV),
            Op::Switch { space, dev } => self.switch(ctx, space, usize::from(dev) % NDEV),
            Op::Alloc {
                space,
                pages,
                align_shift,
                nocross_shift,
                hint,
                max,
            } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                self.alloc(ctx, slot, pages, align_shift, nocross_shift, hint, max);
            }
            Op::AllocBad { space, what } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                self.alloc_bad(ctx, slot, what);
            }
            Op::Dealloc {
                region,
                asynchronous,
                callback,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.dealloc(ctx, slot, start, asynchronous, callback);
            }
            Op::Unmap {
                region,
                asynchronous,
                callback,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.unmap(ctx, slot, start, asynchronous, callback);
            }
            Op::Map {
                region,
                prot,
                asynchronous,
                callback,
                misuse,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.map(
                    ctx,
                    slot,
                    start,
                    prot.prot(),
                    asynchronous,
                    callback,
                    misuse,
                );
            }
            Op::Write {
                dev,
                region,
                page,
                offset,
                len,
                seed,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let r = self.region(slot, start);
                let va = r.start() + u64::from(page) % r.pages() * PAGE_SIZE;
                let off = u64::from(offset) % PAGE_SIZE;
                let len = (u64::from(len) % 64 + 1).min(PAGE_SIZE - off);
                self.write(ctx, usize::from(dev) % NDEV, va + off, len as usize, seed);
            }
            Op::Read {
                dev,
                region,
                page,
                offset,
                len,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let r = self.region(slot, start);
                let va = r.start() + u64::from(page) % r.pages() * PAGE_SIZE;
                let off = u64::from(offset) % PAGE_SIZE;
                let len = (u64::from(len) % 256 + 1).min(PAGE_SIZE - off);
                self.read(ctx, usize::from(dev) % NDEV, va + off, len as usize);
            }
            Op::ReadAnywhere { dev, space, page } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                let sp = self.space(slot);
                let va = sp.begin + u64::from(page) % sp.pages * PAGE_SIZE;
                self.read(ctx, usize::from(dev) % NDEV, va, 16);
            }
            Op::Fault {
                dev,
                region,
                page,
                offset,
                write,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let r = self.region(slot, start);
                let va = r.start()
                    + u64::from(page) % r.pages() * PAGE_SIZE
                    + u64::from(offset) % PAGE_SIZE;
                self.fault(ctx, usize::from(dev) % NDEV, va, write);
            }
            Op::SetPolicy {
                region,
                target,
                remote,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.set_policy(ctx, slot, start, target, remote);
            }
            Op::ZeroFillBlock { region, shift } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let handle = self.region(slot, start).handle;
                let bytes = match shift {
                    s if s < 11 => PAGE_SIZE << s,
                    11 => 0,
                    _ => 3 * PAGE_SIZE,
                };
                let r = self.sys.gm.region_set_zero_fill_block(handle, bytes);
                if bytes == 3 * PAGE_SIZE {
                    self.misuse(ctx, r, PolicyError::BadZeroFillBlock(bytes));
                } else {
                    assert_eq!(r, Ok(()), "{ctx}");
                    self.summary.succeeded += 1;
                    self.region_mut(slot, start).zero_fill_block = bytes;
                }
            }
            Op::Protect { region, prot } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let handle = self.region(slot, start).handle;
                let p = prot.prot();
                let r = self.sys.gm.region_protect(handle, p);
                assert_eq!(r, Ok(()), "{ctx}");
                self.summary.succeeded += 1;
                let m = self.region_mut(slot, start);
                m.prot = p;
                m.prots.clear();
            }
            Op::ProtectRange {
                region,
                page,
                pages,
                prot,
                bad,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.protect_range(ctx, slot, start, page, pages, prot.prot(), bad);
            }
            Op::UnmapRange {
                region,
                page,
                pages,
                bad,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.unmap_range(ctx, slot, start, page, pages, bad);
            }
            Op::MigrateRange {
                region,
                page,
                pages,
                dev,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.migrate_range(ctx, slot, start, page, pages, usize::from(dev) % NDEV);
            }
            Op::WireRange {
                region,
                page,
                pages,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.wire_range(ctx, slot, start, page, pages);
            }
            Op::UnwireRange {
                region,
                page,
                pages,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let r = self.region(slot, start);
                let (p0, n) = r.range(page, pages, false);
                let range = r.va_range((p0, n));
                let handle = r.handle;
                assert_eq!(
                    self.sys.gm.region_unwire_range(handle, range),
                    Ok(()),
                    "{ctx}"
                );
                self.summary.succeeded += 1;
                let m = self.region_mut(slot, start);
                for p in p0..p0 + n {
                    m.wired.remove(&p);
                }
            }
            Op::Evacuate { dev } => self.evacuate(ctx, usize::from(dev) % NDEV),
            Op::SetAttrs {
                region,
                whole,
                page,
                pages,
                value,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.set_attrs(ctx, slot, start, whole, page, pages, u32::from(value % 4));
            }
            Op::Promote { region } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let handle = self.region(slot, start).handle;
                match self.sys.gm.region_promote(handle) {
                    Ok(_) => self.summary.succeeded += 1,
                    // No aligned free block: the block's mappings were dropped (they
                    // fault back), its pages and bytes are where they were.
                    Err(PopulateError::OutOfMemory(_)) => {}
                    Err(e) => panic!("{ctx}: {e:?}"),
                }
            }
            Op::SetReservations { dev, on } => {
                let dev = usize::from(dev) % NDEV;
                let id = self.devices[dev];
                let r = self.sys.gm.dev_set_reservations(id, on);
                if !self.alive[dev] {
                    return self.misuse(ctx, r, DeviceError::UnknownDevice(id));
                }
                assert_eq!(r, Ok(()), "{ctx}");
                self.summary.succeeded += 1;
            }
            Op::Migrate {
                region,
                dev,
                prefetch,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.migrate(ctx, slot, start, usize::from(dev) % NDEV, prefetch);
            }
            Op::Wire { region } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.wire(ctx, slot, start);
            }
            Op::Unwire { region } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let handle = self.region(slot, start).handle;
                assert_eq!(self.sys.gm.region_unwire(handle), Ok(()), "{ctx}");
                self.summary.succeeded += 1;
                self.region_mut(slot, start).wired.clear();
            }
            Op::Synchronize { space } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                let id = self.space(slot).id;
                assert_eq!(self.sys.gm.as_synchronize(id), Ok(()), "{ctx}");
                self.summary.succeeded += 1;
                assert_eq!(self.sys.gm.as_pending(id), Ok(0), "{ctx}: drained");
                self.summary.succeeded += 1;
            }
            Op::Stale { pick, what } => self.stale(ctx, pick, what),
            Op::StaleSpace { pick } => {
                if self.dead_spaces.is_empty() {
                    return;
                }
                let id = self.dead_spaces[usize::from(pick) % self.dead_spaces.len()];
                let r = self.sys.gm.as_destroy(id);
                self.misuse(ctx, r, SpaceError::UnknownSpace(id));
                let r = self
                    .sys
                    .gm
                    .as_alloc(id, gmem_core::AllocRequest::new(PAGE_SIZE));
                self.misuse(ctx, r.map(|_| ()), AllocError::UnknownSpace(id));
                let r = self.sys.gm.as_attach(
                    id,
                    self.devices[HOST],
                    MmuMode::Coherent,
                    Activation::Leave,
                );
                let want = if self.alive[HOST] {
                    AttachError::UnknownSpace(id)
                } else {
                    AttachError::UnknownDevice(self.devices[HOST])
                };
                self.misuse(ctx, r.map(|_| ()), want);
                let r = self.sys.gm.check_invariants(id);
                assert!(r.is_err(), "{ctx}: invariants of a dead space");
            }
            Op::DestroyDevice { dev } => self.destroy_device(ctx, usize::from(dev) % NDEV),
            Op::FailEvery { space, n } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                let n = n % 4;
                let id = self.space(slot).id;
                assert_eq!(self.sys.gm.as_fail_every(id, u32::from(n)), Ok(()), "{ctx}");
                self.summary.succeeded += 1;
                let sp = self.space_mut(slot);
                sp.fail_every = u64::from(n);
                sp.attempts = 0;
            }
            Op::SetEviction { dev, clock } => {
                let dev = usize::from(dev) % NDEV;
                let id = self.devices[dev];
                let policy = match clock {
                    true => EvictionPolicy::Clock,
                    false => EvictionPolicy::Fifo,
                };
                let r = self.sys.gm.dev_set_eviction_policy(id, policy);
                if !self.alive[dev] {
                    return self.misuse(ctx, r, DeviceError::UnknownDevice(id));
                }
                assert_eq!(r, Ok(()), "{ctx}");
                self.summary.succeeded += 1;
            }
            Op::Extents { dev, order } => self.extents(ctx, usize::from(dev) % NDEV, order),
            Op::Compact { dev, order } => self.compact(ctx, usize::from(dev) % NDEV, order),
            Op::PageGroups { dev, order } => self.page_groups(ctx, usize::from(dev) % NDEV, order),
            Op::GroupClass { dev, frame, class } => {
                self.group_class(ctx, usize::from(dev) % NDEV, frame, class)
            }
            Op::FrameClasses { classes } => {
                let n = u32::from(classes % 4);
                if let Some(m) = &self.sys.devices[DGPU].memory {
                    m.set_frame_classes(Some(n));
                }
            }
            Op::Verify { dev, region } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let (a, pages) = {
                    let r = self.region(slot, start);
                    (r.start(), r.pages())
                };
                for p in 0..pages {
                    self.read(
                        ctx,
                        usize::from(dev) % NDEV,
                        a + p * PAGE_SIZE,
                        PAGE_SIZE as usize,
                    );
                }
            }
        }
    }

    fn create_space(&mut self, ctx: &str, large: bool, p: PolicySel) {
        if self.live_slots().len() >= MAX_SPACES {
            return;
        }
        let mut policy = match p.fit % 5 {
            1 => AllocPolicy::INSTANT_FIT,
            2 => AllocPolicy::BEST_FIT,
            3 => AllocPolicy::FIRST_FIT,
            4 => AllocPolicy::NEXT_FIT,
            _ => AllocPolicy::empty(),
        };
        if p.guarded {
            policy |= AllocPolicy::GUARDED;
        }
        if p.cached {
            policy |= AllocPolicy::CACHED;
        }
        let pages = if large { 192 } else { 64 };
        let begin = SPACE_BASE;
        let id = self
            .sys
            .gm
            .as_create(
                VirtAddr::new(begin),
                VirtAddr::new(begin + pages * PAGE_SIZE),
                policy,
            )
            .unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
        assert_eq!(
            self.sys.gm.as_set_batch_limit(id, self.batch_limit),
            Ok(()),
            "{ctx}"
        );
        let model = SpaceModel {
            id,
            begin,
            pages,
            guard: if p.guarded { PAGE_SIZE } else { 0 },
            regions: BTreeMap::new(),
            attached: BTreeMap::new(),
            queue: Vec::new(),
            fail_every: 0,
            attempts: 0,
        };
        match self.spaces.iter().position(Option::is_none) {
            Some(s) => self.spaces[s] = Some(model),
            None => self.spaces.push(Some(model)),
        }
    }

    fn create_space_bad(&mut self, ctx: &str, what: CreateMisuse) {
        let b = SPACE_BASE;
        let (begin, end, policy, want) = match what {
            CreateMisuse::Empty => (
                b,
                b,
                AllocPolicy::empty(),
                SpaceError::BadRange(AddrError::BadRange { start: b, len: 0 }),
            ),
            CreateMisuse::UnalignedBegin => (
                b + 8,
                b + PAGE_SIZE + 8,
                AllocPolicy::empty(),
                SpaceError::BadRange(AddrError::Unaligned {
                    addr: b + 8,
                    align: PAGE_SIZE,
                }),
            ),
            CreateMisuse::UnalignedEnd => (
                b,
                b + PAGE_SIZE + 8,
                AllocPolicy::empty(),
                SpaceError::BadRange(AddrError::Unaligned {
                    addr: PAGE_SIZE + 8,
                    align: PAGE_SIZE,
                }),
            ),
            CreateMisuse::TwoFits => {
                let two = AllocPolicy::BEST_FIT | AllocPolicy::FIRST_FIT;
                (b, b + PAGE_SIZE, two, SpaceError::BadPolicy(two))
            }
        };
        let r = self
            .sys
            .gm
            .as_create(VirtAddr::new(begin), VirtAddr::new(end), policy);
        self.misuse(ctx, r.map(|_| ()), want);
    }

    fn space_destroyed(&mut self, slot: usize) {
        let sp = self.spaces[slot].take().expect("live slot");
        // Destroy drains the queue: every queued callback has run.
        for q in &sp.queue {
            let cb = match q {
                Request::Unmap { callback, .. } | Request::Map { callback, .. } => *callback,
            };
            self.expected_fired.extend(cb);
        }
        for r in sp.regions.values() {
            self.dead_regions.push(r.handle);
        }
        self.dead_spaces.push(sp.id);
        for d in 0..NDEV {
            if self.active[d] == Some(slot) {
                self.active[d] = None;
            }
        }
        self.roots.retain(|(s, _), _| *s != slot);
    }

    fn attach(&mut self, ctx: &str, space: u8, dev: usize, mode: Mode, activate: bool) {
        let Some(slot) = self.pick_space(space) else {
            return;
        };
        let activation = if activate {
            Activation::Switch
        } else {
            Activation::Leave
        };
        let id = self.space(slot).id;
        let mmu_mode = match mode {
            Mode::Shared => MmuMode::Shared,
            Mode::Coherent => MmuMode::Coherent,
            Mode::Replicate => MmuMode::Replicate,
        };
        let r = self
            .sys
            .gm
            .as_attach(id, self.devices[dev], mmu_mode, activation);
        if !self.alive[dev] {
            return self.misuse(
                ctx,
                r.map(|_| ()),
                AttachError::UnknownDevice(self.devices[dev]),
            );
        }
        if self.space(slot).attached.contains_key(&dev) {
            return self.misuse(ctx, r.map(|_| ()), AttachError::AlreadyAttached);
        }
        let eff = r.unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
        match mmu_mode {
            MmuMode::Shared => assert!(
                matches!(eff, MmuMode::Shared | MmuMode::Coherent),
                "{ctx}: shared became {eff:?}"
            ),
            m => assert_eq!(eff, m, "{ctx}"),
        }
        self.space_mut(slot).attached.insert(dev, eff);
        if activate {
            self.active[dev] = Some(slot);
        }
        self.learn_roots(slot);
    }

    /// Record which root each device uses in `slot`, from the events of this op.
    fn learn_roots(&mut self, slot: usize) {
        for e in self.sys.take_events() {
            match e {
                MmuEvent::Create { mmu, root }
                | MmuEvent::Activate {
                    mmu,
                    root: Some(root),
                } => {
                    self.roots.insert((slot, mmu as usize), root);
                }
                _ => {}
            }
        }
    }

    fn detach(&mut self, ctx: &str, space: u8, dev: usize) {
        let Some(slot) = self.pick_space(space) else {
            return;
        };
        let id = self.space(slot).id;
        let r = self.sys.gm.dev_detach(self.devices[dev], id);
        if !self.alive[dev] {
            return self.misuse(ctx, r, AttachError::UnknownDevice(self.devices[dev]));
        }
        if !self.space(slot).attached.contains_key(&dev) {
            return self.misuse(ctx, r, AttachError::NotAttached);
        }
        assert_eq!(r, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        self.space_mut(slot).attached.remove(&dev);
        if self.active[dev] == Some(slot) {
            self.active[dev] = None;
        }
        self.roots.remove(&(slot, dev));
    }

    fn switch(&mut self, ctx: &str, space: u8, dev: usize) {
        let Some(slot) = self.pick_space(space) else {
            return;
        };
        let id = self.space(slot).id;
        let r = self.sys.gm.dev_switch(self.devices[dev], id);
        if !self.alive[dev] {
            return self.misuse(ctx, r, AttachError::UnknownDevice(self.devices[dev]));
        }
        if !self.space(slot).attached.contains_key(&dev) {
            return self.misuse(ctx, r, AttachError::NotAttached);
        }
        assert_eq!(r, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        self.active[dev] = Some(slot);
        self.learn_roots(slot);
    }

    /// One injection check of a valid attempt.
    fn injected(&mut self, slot: usize) -> bool {
        let sp = self.space_mut(slot);
        if sp.fail_every == 0 {
            return false;
        }
        sp.attempts += 1;
        sp.attempts % sp.fail_every == 0
    }

    #[allow(clippy::too_many_arguments)]
    fn alloc(
        &mut self,
        ctx: &str,
        slot: usize,
        pages: u8,
        align_shift: u8,
        nocross_shift: u8,
        hint: Option<u8>,
        max: Option<u8>,
    ) {
        let sp = self.space(slot);
        let (id, begin, guard) = (sp.id, sp.begin, sp.guard);
        let size = u64::from(pages % 24) * PAGE_SIZE;
        let align = if align_shift < 8 {
            PAGE_SIZE << align_shift
        } else {
            0
        };
        let nocross = if nocross_shift < 9 {
            PAGE_SIZE << nocross_shift
        } else {
            0
        };
        let hint = hint.map_or(0, |h| begin + u64::from(h) % sp.pages * PAGE_SIZE);
        let max = max.map_or(u64::MAX, |m| {
            begin + (u64::from(m) % sp.pages + 1) * PAGE_SIZE - 1
        });
        let req = gmem_core::AllocRequest {
            hint: VirtAddr::new(hint),
            size,
            align,
            nocross,
            max: VirtAddr::new(max),
        };
        let r = self.sys.gm.as_alloc(id, req);
        if size == 0 {
            let want = AllocError::BadArgument(AddrError::BadRange { start: 0, len: 0 });
            return self.misuse(ctx, r.map(|_| ()), want);
        }
        let reserve = size + 2 * guard;
        let plain = align <= PAGE_SIZE && nocross == 0 && max == u64::MAX && hint == 0;
        let mut c = Constraint::new(reserve);
        let eff_align = align.max(PAGE_SIZE);
        c.align = eff_align;
        c.phase = (eff_align - guard % eff_align) % eff_align;
        c.nocross = nocross;
        c.max = max.saturating_add(guard);
        // The reference validation (the arena's quantum is a page).
        let problem = (!plain)
            .then(|| constraint_problem(&c, PAGE_SIZE))
            .flatten();
        let hinted = (hint != 0).then(|| {
            let mut h = c;
            h.min = hint.saturating_sub(guard);
            h
        });
        let hinted_problem = hinted.and_then(|h| constraint_problem(&h, PAGE_SIZE));
        if let Some(p) = hinted_problem {
            return self.misuse(ctx, r.map(|_| ()), AllocError::BadConstraint(p));
        }
        // The attempts: the hinted one (if any), then the plain or unhinted one.
        let mut injected_all = false;
        if let Some(h) = hinted {
            if !self.injected(slot) && self.feasible_somewhere(slot, &h).is_some() {
                return self.alloc_ok(ctx, slot, r, &h, size);
            }
        }
        if let Some(p) = problem {
            return self.misuse(ctx, r.map(|_| ()), AllocError::BadConstraint(p));
        }
        if self.injected(slot) {
            injected_all = true;
        }
        if injected_all {
            return self.expect_failed(ctx, r.map(|_| ()), AllocError::Injected);
        }
        if self.feasible_somewhere(slot, &c).is_none() {
            return self.expect_failed(ctx, r.map(|_| ()), AllocError::NoSpace { size });
        }
        self.alloc_ok(ctx, slot, r, &c, size);
    }

    fn alloc_ok(
        &mut self,
        ctx: &str,
        slot: usize,
        r: Result<Region, AllocError>,
        c: &Constraint,
        size: u64,
    ) {
        let region = r.unwrap_or_else(|e| panic!("{ctx}: expected success, got {e:?}"));
        self.summary.succeeded += 1;
        let guard = self.space(slot).guard;
        let start = region.start.as_u64();
        let res = start - guard;
        assert!(
            self.feasible(slot, c, res),
            "{ctx}: region at {start:#x} breaks its constraint or overlaps; busy {:x?}",
            self.space(slot).busy()
        );
        self.space_mut(slot).regions.insert(
            start,
            RegionModel {
                handle: region,
                len: size,
                reserve: (res, c.size),
                prot: Prot::RW,
                placement: Placement::default(),
                zero_fill_block: 0,
                kind: Kind::Anonymous,
                bytes: BTreeMap::new(),
                populated: BTreeSet::new(),
                maybe_populated: false,
                wired: BTreeSet::new(),
                prots: BTreeMap::new(),
                holes: BTreeSet::new(),
                attrs: BTreeMap::new(),
            },
        );
    }

    fn feasible(&self, slot: usize, c: &Constraint, a: u64) -> bool {
        let sp = self.space(slot);
        let Some(last) = a.checked_add(c.size - 1) else {
            return false;
        };
        let align = c.align.max(PAGE_SIZE);
        a % PAGE_SIZE == 0
            && a & (align - 1) == c.phase
            && a >= c.min
            && last <= c.max
            && (c.nocross == 0 || (a ^ last) & !(c.nocross - 1) == 0)
            && a >= sp.begin
            && last < sp.end()
            && sp.busy().iter().all(|&(b, l)| last < b || a > b + (l - 1))
    }

    fn feasible_somewhere(&self, slot: usize, c: &Constraint) -> Option<u64> {
        let sp = self.space(slot);
        (0..sp.pages)
            .map(|p| sp.begin + p * PAGE_SIZE)
            .find(|&a| self.feasible(slot, c, a))
    }

    fn alloc_bad(&mut self, ctx: &str, slot: usize, what: AllocMisuse) {
        let id = self.space(slot).id;
        let un = |addr| {
            AllocError::BadArgument(AddrError::Unaligned {
                addr,
                align: PAGE_SIZE,
            })
        };
        let base = gmem_core::AllocRequest::new(PAGE_SIZE);
        let (req, want) = match what {
            AllocMisuse::ZeroSize => (
                gmem_core::AllocRequest::new(0),
                AllocError::BadArgument(AddrError::BadRange { start: 0, len: 0 }),
            ),
            AllocMisuse::UnalignedSize => (
                gmem_core::AllocRequest::new(PAGE_SIZE + 512),
                un(PAGE_SIZE + 512),
            ),
            AllocMisuse::UnalignedHint => {
                let h = SPACE_BASE + 100;
                (
                    gmem_core::AllocRequest {
                        hint: VirtAddr::new(h),
                        ..base
                    },
                    un(h),
                )
            }
            AllocMisuse::AlignNotPowerOfTwo => (
                gmem_core::AllocRequest {
                    align: 3 * PAGE_SIZE,
                    ..base
                },
                un(3 * PAGE_SIZE),
            ),
            AllocMisuse::SmallAlign => (
                gmem_core::AllocRequest {
                    align: 2048,
                    ..base
                },
                un(2048),
            ),
            AllocMisuse::NocrossNotPowerOfTwo => (
                gmem_core::AllocRequest {
                    nocross: 3 * PAGE_SIZE,
                    ..base
                },
                un(3 * PAGE_SIZE),
            ),
        };
        let r = self.sys.gm.as_alloc(id, req);
        self.misuse(ctx, r.map(|_| ()), want);
    }

    fn dealloc(&mut self, ctx: &str, slot: usize, start: u64, asynchronous: bool, cb: bool) {
        let r = self.region(slot, start).clone();
        let cbk = self.callback(cb, Some((slot, r.start(), r.len)));
        let (cid, cbox) = cbk.map_or((None, None), |(i, b)| (Some(i), Some(b)));
        let flags = if asynchronous {
            MapFlags::ASYNC
        } else {
            MapFlags::empty()
        };
        let res = self.sys.gm.region_dealloc(r.handle, flags, cbox);
        assert_eq!(res, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        let sp = self.space_mut(slot);
        sp.regions.remove(&start);
        if asynchronous {
            sp.queue.push(Request::Unmap {
                range: (r.start(), r.len),
                reserve: Some(r.reserve),
                callback: cid,
            });
        } else {
            self.expected_fired.extend(cid);
        }
        self.dead_regions.push(r.handle);
    }

    fn unmap(&mut self, ctx: &str, slot: usize, start: u64, asynchronous: bool, cb: bool) {
        let r = self.region(slot, start).clone();
        let cbk = self.callback(cb, Some((slot, r.start(), r.len)));
        let (cid, cbox) = cbk.map_or((None, None), |(i, b)| (Some(i), Some(b)));
        let flags = if asynchronous {
            MapFlags::ASYNC
        } else {
            MapFlags::empty()
        };
        let res = self.sys.gm.region_unmap(r.handle, flags, cbox);
        assert_eq!(res, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        let m = self.region_mut(slot, start);
        m.clear_pages();
        if let Kind::Explicit { .. } = m.kind {
            m.kind = Kind::Explicit { mapped: false };
        }
        if asynchronous {
            self.space_mut(slot).queue.push(Request::Unmap {
                range: (r.start(), r.len),
                reserve: None,
                callback: cid,
            });
        } else {
            self.expected_fired.extend(cid);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn map(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        prot: Prot,
        asynchronous: bool,
        cb: bool,
        misuse: MapMisuse,
    ) {
        let r = self.region(slot, start).clone();
        let pages = r.pages();
        let mut frames: Vec<PhysAddr> = (0..pages)
            .map(|i| PhysAddr::new(self.next_external + i * PAGE_SIZE))
            .collect();
        let mut want = None;
        if prot.is_empty() {
            want = Some(MapError::BadProt(prot));
        } else {
            match misuse {
                MapMisuse::None => {}
                MapMisuse::FrameCount => {
                    frames.pop();
                    want = Some(MapError::FrameCount {
                        expected: pages,
                        given: pages - 1,
                    });
                }
                MapMisuse::ManagedFrame => {
                    frames[0] = PhysAddr::new(HOST_BASE);
                    want = Some(MapError::BadFrame(frames[0]));
                }
                MapMisuse::UnalignedFrame => {
                    frames[0] = PhysAddr::new(frames[0].as_u64() + 16);
                    want = Some(MapError::BadFrame(frames[0]));
                }
            }
        }
        let already = match r.kind {
            Kind::Explicit { mapped: true } => Some(true),
            Kind::Explicit { mapped: false } => Some(false),
            Kind::Anonymous => r.any_populated(),
        };
        let cbk = if want.is_none() {
            self.callback(cb, None)
        } else {
            None
        };
        let (cid, cbox) = cbk.map_or((None, None), |(i, b)| (Some(i), Some(b)));
        let flags = if asynchronous {
            MapFlags::ASYNC
        } else {
            MapFlags::empty()
        };
        let res = self.sys.gm.region_map(
            r.handle,
            MapRequest {
                prot,
                frames: &frames,
                memory: self.devices[HOST],
                set: None,
                flags,
                callback: cbox,
            },
        );
        if let Some(w) = want {
            return self.misuse(ctx, res, w);
        }
        match (already, res) {
            (Some(true) | None, Err(MapError::AlreadyMapped)) => {
                // A misuse: nothing changed (not even a queue drain), and a callback
                // given with the failed call is dropped unrun.
                self.summary.rejected += 1;
                self.unchanged(ctx);
                return;
            }
            (Some(false) | None, Ok(())) => {}
            (a, res) => panic!("{ctx}: already mapped {a:?} but region_map gave {res:?}"),
        }
        self.next_external += pages * PAGE_SIZE;
        self.summary.succeeded += 1;
        let m = self.region_mut(slot, start);
        m.clear_pages();
        m.kind = Kind::Explicit { mapped: true };
        m.prot = prot;
        m.prots.clear();
        if asynchronous {
            self.space_mut(slot).queue.push(Request::Map {
                start,
                callback: cid,
            });
        } else {
            self.expected_fired.extend(cid);
        }
    }

    /// What an access (or, with `direct`, a `dev_fault`) of `dev` at `va` may end with.
    fn expect_access(&self, dev: usize, va: u64, write: bool, direct: bool) -> Expect {
        let id = self.devices[dev];
        let v = VirtAddr::new(va);
        let faultable = dev != IO;
        let unmapped = AccessError::Unmapped(v);
        let fault = AccessError::Fault;
        if !self.alive[dev] {
            return Expect::Err(if direct {
                fault(FaultError::UnknownDevice(id))
            } else {
                unmapped
            });
        }
        if direct && !faultable {
            return Expect::Err(fault(FaultError::NotFaultable(id)));
        }
        let Some(slot) = self.active[dev] else {
            return Expect::Err(if faultable {
                fault(FaultError::NotActive(id))
            } else {
                unmapped
            });
        };
        let sp = self.space(slot);
        if !direct && sp.unmap_pending(va) {
            return Expect::Unknown;
        }
        let Some(r) = sp.region_at(va) else {
            return Expect::Err(if faultable {
                fault(FaultError::NotAllocated(v))
            } else {
                unmapped
            });
        };
        let access = prot_access(write);
        let page = (va - r.start()) / PAGE_SIZE;
        let allowed = r.prot_of(page);
        if !allowed.contains(access) {
            return Expect::Err(if faultable {
                fault(FaultError::ProtectionViolation {
                    va: v,
                    access,
                    allowed,
                })
            } else {
                unmapped
            });
        }
        let queue_empty = sp.queue.is_empty();
        match r.kind {
            Kind::Explicit { mapped: false } => Expect::Err(if faultable {
                fault(FaultError::NotMapped(v))
            } else {
                unmapped
            }),
            Kind::Explicit { mapped: true } if r.holes.contains(&page) => {
                Expect::Err(if faultable {
                    fault(FaultError::NotMapped(v))
                } else {
                    unmapped
                })
            }
            Kind::Explicit { mapped: true } => {
                if faultable || (queue_empty && !sp.map_pending(r.start())) {
                    Expect::Ok
                } else {
                    Expect::Either(vec![unmapped])
                }
            }
            Kind::Anonymous if faultable => Expect::Either(vec![
                fault(FaultError::OutOfMemory(self.devices[HOST])),
                fault(FaultError::OutOfMemory(self.devices[DGPU])),
            ]),
            Kind::Anonymous => {
                let replicate = sp.attached.get(&dev) == Some(&MmuMode::Replicate);
                let wired = r.wired.contains(&page);
                if wired && queue_empty {
                    Expect::Ok
                } else if wired || (replicate && (r.populated.contains(&page) || r.maybe_populated))
                {
                    Expect::Either(vec![unmapped])
                } else {
                    Expect::Err(unmapped)
                }
            }
        }
    }

    /// Record that a faultable access populated the page at `va` in `dev`'s space.
    fn populated(&mut self, dev: usize, va: u64) {
        let Some(slot) = self.active[dev] else {
            return;
        };
        let Some(start) = self.space(slot).region_at(va).map(RegionModel::start) else {
            return;
        };
        let r = self.region_mut(slot, start);
        if r.kind == Kind::Anonymous {
            r.populated.insert((va - start) / PAGE_SIZE);
            // Block 0 is the faulter's largest page size: 64 KiB for the host and the
            // discrete GPU, whose MMUs map 64 KiB leaves.
            if r.zero_fill_block > PAGE_SIZE
                || (r.zero_fill_block == 0 && matches!(dev, HOST | DGPU))
            {
                r.maybe_populated = true;
            }
        }
    }

    fn model_bytes(&self, dev: usize, va: u64, len: usize) -> Vec<u8> {
        let slot = self.active[dev].expect("checked active");
        let r = self.space(slot).region_at(va).expect("checked region");
        let page = (va - r.start()) / PAGE_SIZE;
        let off = (va % PAGE_SIZE) as usize;
        match r.bytes.get(&page) {
            Some(b) => b[off..off + len].to_vec(),
            None => vec![0; len],
        }
    }

    /// Whether the access succeeded and must be checked against the model; an exact
    /// expected error must also have left the state unchanged.
    fn check_outcome<T>(
        &mut self,
        ctx: &str,
        what: &str,
        expect: &Expect,
        r: &Result<T, AccessError>,
    ) -> bool
    where
        T: std::fmt::Debug,
    {
        match (expect, r) {
            (Expect::Unknown, _) => false,
            (Expect::Ok | Expect::Either(_), Ok(_)) => {
                self.summary.succeeded += 1;
                true
            }
            (Expect::Err(e), Err(got)) if e == got => {
                self.summary.rejected += 1;
                self.unchanged(ctx);
                false
            }
            (Expect::Either(set), Err(got)) if set.contains(got) => false,
            (e, got) => panic!("{ctx}: {what}: expected {e:?}, got {got:?}"),
        }
    }

    fn write(&mut self, ctx: &str, dev: usize, va: u64, len: usize, seed: u8) {
        let data = pattern(seed, len, va);
        let expect = self.expect_access(dev, va, true, false);
        self.checkpoint();
        if matches!(expect, Expect::Unknown) {
            // A stale translation could take the store: the model could not follow.
            return;
        }
        let r = self.sys.write(dev, VirtAddr::new(va), &data);
        if !self.check_outcome(ctx, "write", &expect, &r) {
            return;
        }
        self.populated(dev, va);
        let slot = self.active[dev].expect("succeeded: active");
        let start = self.space(slot).region_at(va).expect("region").start();
        let page = (va - start) / PAGE_SIZE;
        let off = (va % PAGE_SIZE) as usize;
        let m = self.region_mut(slot, start);
        let buf = m
            .bytes
            .entry(page)
            .or_insert_with(|| vec![0; PAGE_SIZE as usize]);
        buf[off..off + len].copy_from_slice(&data);
        // Read back what was written, through the same device.
        let back = self.sys.read(dev, VirtAddr::new(va), len);
        assert_eq!(
            back.as_deref(),
            Ok(&data[..]),
            "{ctx}: read back after write"
        );
        self.summary.succeeded += 1;
        self.summary.bytes_checked += len as u64;
    }

    fn read(&mut self, ctx: &str, dev: usize, va: u64, len: usize) {
        let expect = self.expect_access(dev, va, false, false);
        self.checkpoint();
        if matches!(expect, Expect::Unknown) {
            return;
        }
        let r = self.sys.read(dev, VirtAddr::new(va), len);
        if !self.check_outcome(ctx, "read", &expect, &r) {
            return;
        }
        let got = r.expect("checked ok");
        let want = self.model_bytes(dev, va, len);
        self.summary.bytes_checked += len as u64;
        assert!(
            got == want,
            "{ctx}: read {va:#x}+{len} through device {dev}: got {got:?}, model {want:?}"
        );
        if dev != IO {
            self.populated(dev, va);
        }
    }

    fn fault(&mut self, ctx: &str, dev: usize, va: u64, write: bool) {
        let expect = self.expect_access(dev, va, write, true);
        self.checkpoint();
        let r = self
            .sys
            .gm
            .dev_fault(self.devices[dev], VirtAddr::new(va), prot_access(write))
            .map_err(AccessError::Fault);
        if self.check_outcome(ctx, "fault", &expect, &r) {
            self.populated(dev, va);
        }
    }

    fn set_policy(&mut self, ctx: &str, slot: usize, start: u64, target: u8, remote: bool) {
        let handle = self.region(slot, start).handle;
        let t = match target % 6 {
            0 => PlacementTarget::Faulting,
            1 => PlacementTarget::Host,
            k => PlacementTarget::Device(self.devices[usize::from(k - 2)]),
        };
        let placement = Placement {
            target: t,
            mode: if remote {
                PlacementMode::RemoteAccess
            } else {
                PlacementMode::Unique
            },
        };
        let r = self.sys.gm.region_set_policy(handle, placement);
        if let PlacementTarget::Device(d) = t {
            let k = self
                .devices
                .iter()
                .position(|x| *x == d)
                .expect("one of ours");
            if !self.alive[k] {
                return self.misuse(ctx, r, PolicyError::UnknownDevice(d));
            }
            if k == IGPU || k == IO {
                return self.misuse(ctx, r, PolicyError::NoMemory(d));
            }
        }
        assert_eq!(r, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        self.region_mut(slot, start).placement = placement;
    }

    fn migrate(&mut self, ctx: &str, slot: usize, start: u64, dev: usize, prefetch: bool) {
        let handle = self.region(slot, start).handle;
        let r = self.sys.gm.region_migrate(
            handle,
            self.devices[dev],
            if prefetch {
                MigrateScope::Prefetch
            } else {
                MigrateScope::Populated
            },
        );
        if !self.alive[dev] {
            return self.misuse(
                ctx,
                r.map(|_| ()),
                PopulateError::UnknownDevice(self.devices[dev]),
            );
        }
        match r {
            Ok(_) => {
                let m = self.region_mut(slot, start);
                if prefetch && m.kind == Kind::Anonymous {
                    m.populated.extend(0..m.pages());
                }
            }
            Err(PopulateError::OutOfMemory(_)) => {
                // Pages moved before the failure stay moved: logically invisible.
                self.region_mut(slot, start).maybe_populated = true;
            }
            Err(e) => panic!("{ctx}: {e:?}"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn protect_range(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        page: u8,
        pages: u8,
        prot: Prot,
        bad: bool,
    ) {
        let r = self.region(slot, start);
        let (p0, n) = r.range(page, pages, bad);
        let range = r.va_range((p0, n));
        let res = self.sys.gm.region_protect_range(r.handle, range, prot);
        if bad {
            return self.misuse(ctx, res, ProtectError::Region(RegionError::BadRange(range)));
        }
        assert_eq!(res, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        let m = self.region_mut(slot, start);
        for p in p0..p0 + n {
            if prot == m.prot {
                m.prots.remove(&p);
            } else {
                m.prots.insert(p, prot);
            }
        }
    }

    fn unmap_range(&mut self, ctx: &str, slot: usize, start: u64, page: u8, pages: u8, bad: bool) {
        let r = self.region(slot, start);
        let (p0, n) = r.range(page, pages, bad);
        let range = r.va_range((p0, n));
        let res = self
            .sys
            .gm
            .region_unmap_range(r.handle, range, MapFlags::empty(), None);
        if bad {
            return self.misuse(ctx, res, RegionError::BadRange(range));
        }
        assert_eq!(res, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        let m = self.region_mut(slot, start);
        for p in p0..p0 + n {
            m.bytes.remove(&p);
            m.populated.remove(&p);
            m.wired.remove(&p);
            if m.kind == (Kind::Explicit { mapped: true }) {
                m.holes.insert(p);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn migrate_range(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        page: u8,
        pages: u8,
        dev: usize,
    ) {
        let r = self.region(slot, start);
        let range = r.va_range(r.range(page, pages, false));
        let res = self.sys.gm.region_migrate_range(
            r.handle,
            range,
            self.devices[dev],
            MigrateScope::Populated,
        );
        if !self.alive[dev] {
            return self.misuse(
                ctx,
                res.map(|_| ()),
                PopulateError::UnknownDevice(self.devices[dev]),
            );
        }
        match res {
            Ok(_) => self.summary.succeeded += 1,
            Err(PopulateError::OutOfMemory(_)) => {
                self.region_mut(slot, start).maybe_populated = true;
            }
            Err(e) => panic!("{ctx}: {e:?}"),
        }
    }

    fn wire_range(&mut self, ctx: &str, slot: usize, start: u64, page: u8, pages: u8) {
        let r = self.region(slot, start);
        let (p0, n) = r.range(page, pages, false);
        let range = r.va_range((p0, n));
        let kind = r.kind;
        let res = self.sys.gm.region_wire_range(r.handle, range);
        match (kind, res) {
            (Kind::Explicit { .. }, r) => assert_eq!(r, Ok(0), "{ctx}: wiring caller frames"),
            (Kind::Anonymous, Ok(_)) => {
                self.summary.succeeded += 1;
                let m = self.region_mut(slot, start);
                m.wired.extend(p0..p0 + n);
                m.populated.extend(p0..p0 + n);
            }
            (Kind::Anonymous, Err(PopulateError::OutOfMemory(_))) => {
                self.region_mut(slot, start).maybe_populated = true;
            }
            (_, Err(e)) => panic!("{ctx}: {e:?}"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn set_attrs(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        whole: bool,
        page: u8,
        pages: u8,
        value: u32,
    ) {
        let r = self.region(slot, start);
        let (p0, n) = if whole {
            (0, r.pages())
        } else {
            r.range(page, pages, false)
        };
        let handle = r.handle;
        let res = if whole {
            self.sys.gm.region_set_attrs(handle, Attrs(value))
        } else {
            let range = r.va_range((p0, n));
            self.sys
                .gm
                .region_set_attrs_range(handle, range, Attrs(value))
        };
        assert_eq!(res, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        let m = self.region_mut(slot, start);
        for p in p0..p0 + n {
            if value == 0 {
                m.attrs.remove(&p);
            } else {
                m.attrs.insert(p, value);
            }
        }
        // Every mapping of the region's pages, in the tables of the devices active in
        // its space, carries the value.
        let (a, attrs, npages) = {
            let r = self.region(slot, start);
            (r.start(), r.attrs.clone(), r.pages())
        };
        for dev in 0..NDEV {
            if self.active[dev] != Some(slot) || !self.alive[dev] {
                continue;
            }
            let mmu = &self.sys.devices[dev].mmu;
            let Some(root) = mmu.active_root() else {
                continue;
            };
            for p in 0..npages {
                let vpn = (a + p * PAGE_SIZE) / PAGE_SIZE;
                if let Some(pte) = mmu.store().lookup(root, vpn) {
                    let want = attrs.get(&p).copied().unwrap_or(0);
                    assert_eq!(
                        pte.attrs,
                        Attrs(want),
                        "{ctx}: page {p} (vpn {vpn:#x}) mapped by {dev}"
                    );
                }
            }
        }
    }

    fn evacuate(&mut self, ctx: &str, dev: usize) {
        let id = self.devices[dev];
        let res = self.sys.gm.dev_evacuate(id);
        if dev == HOST {
            return self.misuse(ctx, res.map(|_| ()), PopulateError::IsHost);
        }
        if !self.alive[dev] {
            return self.misuse(ctx, res.map(|_| ()), PopulateError::UnknownDevice(id));
        }
        match res {
            Ok(_) => {
                self.summary.succeeded += 1;
                if let Ok(f) = self.sys.gm.dev_frames(id) {
                    assert_eq!(
                        (f.active, f.inactive, f.wired),
                        (0, 0, 0),
                        "{ctx}: the evacuated memory still backs pages"
                    );
                }
            }
            Err(PopulateError::OutOfMemory(_)) => {}
            Err(e) => panic!("{ctx}: {e:?}"),
        }
    }

    fn wire(&mut self, ctx: &str, slot: usize, start: u64) {
        let handle = self.region(slot, start).handle;
        let kind = self.region(slot, start).kind;
        let r = self.sys.gm.region_wire(handle);
        match (kind, r) {
            (Kind::Explicit { .. }, r) => assert_eq!(r, Ok(0), "{ctx}: wiring caller frames"),
            (Kind::Anonymous, Ok(_)) => {
                let m = self.region_mut(slot, start);
                m.wired.extend(0..m.pages());
                m.populated.extend(0..m.pages());
            }
            (Kind::Anonymous, Err(PopulateError::OutOfMemory(_))) => {
                self.region_mut(slot, start).maybe_populated = true;
            }
            (_, Err(e)) => panic!("{ctx}: {e:?}"),
        }
    }

    fn stale(&mut self, ctx: &str, pick: u16, what: StaleUse) {
        if self.dead_regions.is_empty() {
            return;
        }
        let h = self.dead_regions[usize::from(pick) % self.dead_regions.len()];
        let space_alive = self.slot_of(h.space).is_some();
        let want = if space_alive {
            RegionError::StaleRegion(h)
        } else {
            RegionError::UnknownSpace(h.space)
        };
        let gm = &self.sys.gm;
        let r = match what {
            StaleUse::Dealloc => gm.region_dealloc(h, MapFlags::ASYNC, None),
            StaleUse::Unmap => gm.region_unmap(h, MapFlags::empty(), None),
            StaleUse::Protect => {
                let r = gm.region_protect(h, Prot::READ);
                return self.misuse(ctx, r, ProtectError::Region(want));
            }
            StaleUse::Info => gm.region_info(h).map(|_| ()),
            StaleUse::SetPolicy => {
                let r = gm.region_set_policy(h, Placement::default());
                return self.misuse(ctx, r, PolicyError::Region(want));
            }
            StaleUse::Map => {
                // A wrong frame count too: the handle is checked first.
                let f = vec![PhysAddr::new(self.next_external); 64];
                let r = gm.region_map(h, MapRequest::new(&f, self.devices[HOST]));
                return self.misuse(ctx, r, MapError::Region(want));
            }
            StaleUse::Unwire => gm.region_unwire(h),
            StaleUse::Migrate | StaleUse::Wire => {
                let r = if matches!(what, StaleUse::Migrate) {
                    gm.region_migrate(h, self.devices[HOST], MigrateScope::Prefetch)
                        .map(|_| ())
                } else {
                    gm.region_wire(h).map(|_| ())
                };
                return self.misuse(ctx, r, PopulateError::Region(want));
            }
        };
        self.misuse(ctx, r, want);
    }

    fn destroy_device(&mut self, ctx: &str, dev: usize) {
        let id = self.devices[dev];
        let frames = self.sys.gm.dev_frames(id).ok();
        let r = self.sys.gm.dev_destroy(id);
        if dev == HOST {
            return self.misuse(ctx, r, DeviceError::IsHost);
        }
        if !self.alive[dev] {
            return self.misuse(ctx, r, DeviceError::UnknownDevice(id));
        }
        let spaces = self
            .live_slots()
            .into_iter()
            .filter(|&s| self.space(s).attached.contains_key(&dev))
            .count();
        if spaces > 0 {
            return self.misuse(ctx, r, DeviceError::StillAttached { spaces });
        }
        let used = frames.map_or(0, |f| f.active + f.inactive + f.wired + f.pending);
        if used > 0 {
            return self.misuse(ctx, r, DeviceError::MemoryInUse { frames: used });
        }
        assert_eq!(r, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        self.alive[dev] = false;
        // Regions that name the device as their target keep the handle: a fault then
        // places pages in host memory.
    }

    // ----- frames: extents, compaction, page groups ----------------------------------

    /// The misuse a frame call on `dev` gets before its own checks, if any.
    fn frame_misuse(&self, dev: usize) -> Option<FrameError> {
        let id = self.devices[dev];
        if !self.alive[dev] {
            Some(FrameError::UnknownDevice(id))
        } else if dev == IGPU || dev == IO {
            Some(FrameError::NoMemory(id))
        } else {
            None
        }
    }

    fn extents(&mut self, ctx: &str, dev: usize, order: u8) {
        let id = self.devices[dev];
        let r = self.sys.gm.dev_free_extents(id);
        if let Some(want) = self.frame_misuse(dev) {
            return self.misuse(ctx, r.map(|_| ()), want);
        }
        let e = r.unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
        let f = self.sys.gm.dev_frames(id).expect("live device");
        let sum: u64 = e.blocks.iter().enumerate().map(|(k, n)| n << k).sum();
        assert_eq!(
            (sum, e.free, e.registered),
            (f.free, f.free, f.registered),
            "{ctx}: the histogram adds up to the free frames"
        );
        let order = u32::from(order % 20);
        let i = e.unusable_index(order);
        assert!((0.0..=1.0).contains(&i), "{ctx}: index {i}");
        assert_eq!(
            e.unusable_frames(order) + e.free_in_blocks_from(order),
            e.free,
            "{ctx}"
        );
        self.summary.succeeded += 1;
        self.unchanged(ctx);
    }

    fn compact(&mut self, ctx: &str, dev: usize, order: u8) {
        let id = self.devices[dev];
        let order = match order {
            248.. => 19 + u32::from(order % 2),
            _ => u32::from(order % 4),
        };
        let before = self.sys.gm.dev_frames(id).ok();
        let r = self.sys.gm.dev_compact(id, order);
        if let Some(want) = self.frame_misuse(dev) {
            return self.misuse(ctx, r.map(|_| ()), want);
        }
        if order > 18 {
            return self.misuse(ctx, r.map(|_| ()), FrameError::BadOrder { order });
        }
        let rep = r.unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
        let (before, after) = (
            before.expect("live device"),
            self.sys.gm.dev_frames(id).expect("live device"),
        );
        assert_eq!(before.registered, after.registered, "{ctx}");
        // Compaction may drain a queue (a page it meets is awaiting invalidation),
        // which frees frames; it never takes one.
        assert!(after.free >= before.free, "{ctx}: {before:?} -> {after:?}");
        assert!(
            rep.free_blocks_after >= rep.free_blocks_before
                && rep.blocks_made <= rep.blocks_tried
                && rep.copies <= rep.pages_moved
                && (rep.copies > 0) == (rep.pages_moved > 0),
            "{ctx}: {rep:?}"
        );
        if order == 0 {
            assert_eq!(rep.pages_moved, 0, "{ctx}: nothing to gain at order 0");
        }
        self.summary.pages_compacted += rep.pages_moved;
        self.summary.succeeded += 1;
    }

    fn page_groups(&mut self, ctx: &str, dev: usize, order: Option<u8>) {
        let id = self.devices[dev];
        let order = order.map(|o| u32::from(o % 21));
        let frames = self.sys.gm.dev_frames(id).ok();
        let r = self.sys.gm.dev_set_page_groups(id, order);
        if let Some(want) = self.frame_misuse(dev) {
            return self.misuse(ctx, r, want);
        }
        if let Some(o) = order.filter(|&o| o > 18) {
            return self.misuse(ctx, r, FrameError::BadOrder { order: o });
        }
        let f = frames.expect("live device");
        if f.free != f.registered {
            let frames = f.registered - f.free;
            return self.misuse(ctx, r, FrameError::FramesInUse { frames });
        }
        assert_eq!(r, Ok(()), "{ctx}");
        let g = self.sys.gm.dev_page_groups(id).expect("live device");
        assert_eq!(g.map(|g| g.order), order, "{ctx}");
        self.summary.succeeded += 1;
    }

    fn group_class(&mut self, ctx: &str, dev: usize, frame: u8, class: u8) {
        let id = self.devices[dev];
        let class = u32::from(class % 4);
        let (base, pages) = match dev {
            HOST => (HOST_BASE, 48 + u64::from(self.setup.host_pages % 160)),
            _ => (DGPU_BASE, 2 + u64::from(self.setup.dev_pages % 30)),
        };
        let pa = PhysAddr::new(base + (u64::from(frame) % (pages + 2)) * PAGE_SIZE);
        let grouped = self.alive[dev]
            && self.frame_misuse(dev).is_none()
            && self.sys.gm.dev_page_groups(id) != Ok(None);
        let r = self.sys.gm.dev_set_group_class(id, pa, class);
        if let Some(want) = self.frame_misuse(dev) {
            return self.misuse(ctx, r, want);
        }
        if !grouped {
            return self.misuse(ctx, r, FrameError::NoGroups(id));
        }
        if pa.as_u64() >= base + pages * PAGE_SIZE {
            return self.misuse(ctx, r, FrameError::NotRegistered { pa });
        }
        match r {
            Ok(()) => {
                assert_eq!(
                    self.sys.gm.dev_group_class(id, pa),
                    Ok(Some(class)),
                    "{ctx}"
                );
                self.summary.succeeded += 1;
            }
            Err(FrameError::GroupInUse { frames, .. }) => {
                assert!(frames > 0, "{ctx}");
                self.summary.rejected += 1;
                self.unchanged(ctx);
            }
            Err(e) => panic!("{ctx}: {e:?}"),
        }
    }

    // ----- checks --------------------------------------------------------------------

    /// Everything a failed call must leave as it was. `None` while some queue holds
    /// requests, since a call that fails after draining a queue legitimately completed
    /// queued work.
    fn snapshot(&self) -> Option<String> {
        if self
            .live_slots()
            .iter()
            .any(|&s| self.sys.gm.as_pending(self.space(s).id) != Ok(0))
        {
            return None;
        }
        let mut out = String::new();
        for s in self.live_slots() {
            let id = self.space(s).id;
            // What callers hold: a failed allocation may reap the quantum caches (cached
            // bytes become free bytes), which no caller can observe.
            let a = self.sys.gm.as_arena_stats(id).expect("live space");
            out += &format!(
                "{id:?} {:?} total {} allocated {} allocs {} frees {}\n",
                self.sys.gm.as_regions(id),
                a.total,
                a.allocated,
                a.allocs,
                a.frees
            );
        }
        for d in 0..NDEV {
            out += &format!(
                "{d} {:?} {:?} {:?}\n",
                self.sys.gm.dev_frames(self.devices[d]),
                self.sys.gm.dev_active(self.devices[d]),
                self.sys.gm.dev_page_groups(self.devices[d]),
            );
        }
        Some(out)
    }

    /// Remember the state (and forget MMU events) before a call that may fail.
    fn checkpoint(&mut self) {
        self.pre = self.snapshot();
        self.sys.take_events();
    }

    /// The state equals the snapshot taken before the operation, and no MMU call was
    /// made since.
    fn unchanged(&mut self, ctx: &str) {
        let Some(before) = self.pre.clone() else {
            return;
        };
        let after = self.snapshot().unwrap_or_default();
        assert_eq!(before, after, "{ctx}: a failed call changed the state");
        let ev = self.sys.take_events();
        assert!(ev.is_empty(), "{ctx}: a failed call made MMU calls {ev:?}");
    }

    /// A misuse: exactly the typed error `want`, and nothing changed.
    fn misuse<E: PartialEq + std::fmt::Debug>(&mut self, ctx: &str, r: Result<(), E>, want: E) {
        assert_eq!(r, Err(want), "{ctx}: misuse");
        self.summary.rejected += 1;
        self.unchanged(ctx);
    }

    /// A legitimate failure (no space, injected): exactly `want`, and nothing changed.
    fn expect_failed<E: PartialEq + std::fmt::Debug>(
        &mut self,
        ctx: &str,
        r: Result<(), E>,
        want: E,
    ) {
        assert_eq!(r, Err(want), "{ctx}: failure");
        self.summary.rejected += 1;
        self.unchanged(ctx);
    }

    /// The checks after every operation: queue progress and callbacks, invariants, TLBs.
    fn after(&mut self, ctx: &str) {
        if std::env::var_os("GMEM_TESTKIT_TRACE_EVENTS").is_some() {
            for e in self.sys.log.lock().iter() {
                eprintln!("    {e:?}");
            }
        }
        for slot in self.live_slots() {
            let id = self.space(slot).id;
            let n = self.sys.gm.as_pending(id).expect("live space");
            let m = self.space(slot).queue.len();
            assert!(n <= m, "{ctx}: {n} requests queued, the model knows {m}");
            let done: Vec<Request> = self.space_mut(slot).queue.drain(..m - n).collect();
            for q in done {
                let cb = match q {
                    Request::Unmap { callback, .. } | Request::Map { callback, .. } => callback,
                };
                self.expected_fired.extend(cb);
            }
        }
        {
            let c = self.callbacks.lock().expect("callback log");
            assert!(c.violations.is_empty(), "{ctx}: {:?}", c.violations);
            let mut fired = c.fired.clone();
            let mut want = self.expected_fired.clone();
            fired.sort_unstable();
            want.sort_unstable();
            assert_eq!(fired, want, "{ctx}: callbacks run (each exactly once)");
        }
        for slot in self.live_slots() {
            let id = self.space(slot).id;
            if let Err(v) = self.sys.gm.check_invariants(id) {
                panic!("{ctx}: invariant broken in {id:?}: {v}");
            }
            if self.space(slot).queue.is_empty() {
                self.check_tlbs(ctx, slot);
            }
            self.check_large(ctx, slot);
        }
        self.sys.take_events();
    }

    /// The large leaves the core recorded for `slot` are exactly those its drivers'
    /// tables hold (leaf sizes agree with the logical page table: `check_invariants`).
    fn check_large(&self, ctx: &str, slot: usize) {
        let id = self.space(slot).id;
        let mut core: Vec<(u64, u64, u64)> = self
            .sys
            .gm
            .as_large_leaves(id)
            .expect("live space")
            .into_iter()
            .map(|l| {
                (
                    l.root.0,
                    l.va.as_u64() / PAGE_SIZE,
                    l.size.bytes() / PAGE_SIZE,
                )
            })
            .collect();
        let mut tables: Vec<(u64, u64, u64)> = Vec::new();
        let mut seen = BTreeSet::new();
        for (&(s, d), &root) in &self.roots {
            let store = self.sys.devices[d].mmu.store();
            // Roots are numbered per store: a table is (store, root).
            if s != slot || !self.alive[d] || !seen.insert((Arc::as_ptr(store) as usize, root.0)) {
                continue;
            }
            if !store.is_live(root) {
                continue;
            }
            tables.extend(
                store
                    .large_leaves(root)
                    .into_iter()
                    .map(|(v, n)| (root.0, v, n)),
            );
        }
        core.sort_unstable();
        tables.sort_unstable();
        assert_eq!(
            core, tables,
            "{ctx}: large leaves of the core vs the tables"
        );
    }

    /// No TLB of a device attached to `slot` holds a translation its page table does
    /// not have (and the active one's entries equal the table's).
    fn check_tlbs(&self, ctx: &str, slot: usize) {
        let sp = self.space(slot);
        for (&(s, d), &root) in &self.roots {
            if s != slot || !self.alive[d] {
                continue;
            }
            let mmu = &self.sys.devices[d].mmu;
            let active = self.active[d] == Some(slot) && mmu.active_root() == Some(root);
            for p in 0..sp.pages {
                let va = VirtAddr::new(sp.begin + p * PAGE_SIZE);
                if !mmu.tlb_holds(root, va) {
                    continue;
                }
                let pte = mmu.store().lookup(root, va.vpn().0);
                assert!(
                    pte.is_some(),
                    "{ctx}: device {d}'s TLB still translates unmapped {va:?} in {:?}",
                    sp.id
                );
                if active {
                    assert_eq!(
                        mmu.translate(va),
                        pte,
                        "{ctx}: device {d}'s TLB is stale at {va:?}"
                    );
                }
            }
        }
    }
}

/// The reference validation of an arena constraint (quantum `q`), in the order the
/// arena documents.
pub fn constraint_problem(c: &Constraint, q: u64) -> Option<ConstraintProblem> {
    if c.align != 0 && !c.align.is_power_of_two() {
        return Some(ConstraintProblem::AlignNotPowerOfTwo);
    }
    let stated = if c.align == 0 { q } else { c.align };
    if c.phase >= stated {
        return Some(ConstraintProblem::PhaseNotBelowAlign);
    }
    if c.phase % q != 0 {
        return Some(ConstraintProblem::PhaseNotQuantumMultiple);
    }
    if c.nocross != 0 {
        if !c.nocross.is_power_of_two() {
            return Some(ConstraintProblem::NocrossNotPowerOfTwo);
        }
        if c.nocross < c.size {
            return Some(ConstraintProblem::NocrossSmallerThanSize);
        }
        if c.phase % c.nocross + c.size > c.nocross {
            return Some(ConstraintProblem::NocrossConflictsWithPhase);
        }
    }
    if c.min > c.max {
        return Some(ConstraintProblem::MinAboveMax);
    }
    match c.min.div_ceil(q).checked_mul(q) {
        Some(m) if m <= c.max && c.max - m >= c.size - 1 => None,
        _ => Some(ConstraintProblem::WindowSmallerThanSize),
    }
}
