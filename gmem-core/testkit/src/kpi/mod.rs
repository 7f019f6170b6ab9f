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
//! - thrashing detection (`as_set_thrashing`, `as_expire_pins`): a fault may be
//!   answered `Throttled` only while a throttling mitigation is on, and then nothing
//!   changed; a pinned page is mapped by several devices, and every read through
//!   any of them still equals the model's bytes; the detector's counters only grow
//!   and balance (no more unpins than pins, each expiry counted);
//! - at the end every space is destroyed and every frame of every memory is free.
//!
//! ## Where things are
//! This module holds the model and the runner's loop; `ops` the input, `apply` the
//! dispatch of one operation, `spaces`, `regions`, `access` and `frames` the calls by
//! subject (`advice`: `region_advise`), `checks` what is checked after each operation.
//! subject (`thrashing` the detector's calls), `checks` what is checked after each
//! operation.

mod access;
mod advice;
mod apply;
mod batch;
mod checks;
mod dma;
mod frames;
mod ops;
mod regions;
mod spaces;
mod thrashing;

pub use checks::constraint_problem;
pub use ops::*;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use gmem_core::policy::thrashing::{Mitigation, ThrashingConfig, ThrashingStats};
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
    /// Live DMA mappings by first IOVA.
    dmas: BTreeMap<u64, dma::DmaModel>,
    /// Queued requests, oldest first.
    queue: Vec<Request>,
    fail_every: u64,
    attempts: u64,
    /// Thrashing detection (`as_set_thrashing`), when on.
    thrashing: Option<ThrashingConfig>,
    /// The detector's counters as last read (they only grow until reconfigured).
    thrash_seen: ThrashingStats,
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
    /// Whether a fault may be answered [`FaultError::Throttled`]: thrashing detection
    /// is on with a mitigation that throttles.
    fn throttles(&self) -> bool {
        self.thrashing
            .is_some_and(|c| c.mitigation() != Mitigation::Pin)
    }
    /// Reservations a new region must not overlap: live regions' and queued ones'.
    fn busy(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.regions.values().map(|r| r.reserve).collect();
        v.extend(self.dmas.values().map(|d| d.reserve));
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
    /// Devices with tree prefetch on (`dev_set_prefetch`).
    prefetch: [bool; NDEV],
    spaces: Vec<Option<SpaceModel>>,
    dead_spaces: Vec<SpaceId>,
    dead_regions: Vec<Region>,
    /// DMA mappings unmapped or destroyed with their space (stale handles).
    dead_dmas: Vec<gmem_core::DmaMapping>,
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
            prefetch: [false; NDEV],
            spaces: Vec::new(),
            dead_spaces: Vec::new(),
            dead_regions: Vec::new(),
            dead_dmas: Vec::new(),
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
        self.summary.fault_batches = st.fault_batches;
        self.summary.pages_prefetched = st.pages_prefetched;
        self.summary.read_duplications = st.read_duplications;
        self.summary.read_copies_dropped = st.read_copies_dropped;
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

    /// A misused range of the region at `start` and the error the core must answer:
    /// the region's pages from `p0` and one page past its end when no region of the
    /// model holds that page (`Unallocated`: a range call checks every page of a range,
    /// which may cross regions), else the same range one byte off its page (`BadRange`).
    fn misused_range(&self, slot: usize, start: u64, p0: u64) -> (VaRange, RegionError) {
        let r = self.region(slot, start);
        let past = r.start() + r.pages() * PAGE_SIZE;
        let held = self
            .space(slot)
            .regions
            .range(..=past)
            .next_back()
            .is_some_and(|(_, m)| past < m.start() + m.pages() * PAGE_SIZE);
        let range = r.va_range((p0, r.pages() - p0 + 1));
        if held {
            let unaligned = VaRange {
                start: VirtAddr::new(range.start.as_u64() + 1),
                len: range.len,
            };
            (unaligned, RegionError::BadRange(unaligned))
        } else {
            (range, RegionError::Unallocated(VirtAddr::new(past)))
        }
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
}
