//! The KPI runner's input: the system's sizes and the operations a fuzz input or a
//! seeded sequence decodes into.

use super::*;

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
    pub(super) fn prot(self) -> Prot {
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
    /// `region_protect` of pages `page..page + pages` (modulo the region).
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
    /// `region_unmap` (strict).
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
    /// `region_migrate` of populated pages.
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
    /// `region_wire`.
    WireRange {
        /// Which.
        region: u16,
        /// First page.
        page: u8,
        /// Pages.
        pages: u8,
    },
    /// `region_unwire`.
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
    /// `region_set_attrs` of the whole region or of a range; then every
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
    /// `dma_map` of fresh caller frames in host memory (contiguous or every other one).
    DmaMap {
        /// Into which space.
        space: u8,
        /// Pages: 1 + this modulo 8.
        pages: u8,
        /// Its protection.
        prot: ProtSel,
        /// Frames every other page (else contiguous: one run).
        scattered: bool,
        /// A wrong argument, if any.
        misuse: DmaMisuse,
    },
    /// `dma_unmap` of a live mapping, or of one already unmapped (a stale handle).
    DmaUnmap {
        /// Which.
        which: u16,
        /// With [`MapFlags::ASYNC`].
        asynchronous: bool,
        /// With a completion callback.
        callback: bool,
        /// A dead handle instead of a live one (if any is known).
        stale: bool,
    },
    /// A store through a device into a DMA mapping of its active space.
    DmaWrite {
        /// Through which device.
        dev: u8,
        /// Which mapping.
        which: u16,
        /// Page of the mapping.
        page: u8,
        /// Offset in the page.
        offset: u16,
        /// Bytes (up to the end of the page).
        len: u16,
        /// Content seed.
        seed: u8,
    },
    /// `dev_fault_batch` of up to four records on one region (duplicates likely),
    /// after `dev_set_prefetch`.
    FaultBatch {
        /// Which device.
        dev: u8,
        /// Which region.
        region: u16,
        /// Pages of the region (modulo its size), one record each.
        pages: [u8; 4],
        /// Records: `1 + n % 4`; 0 records when `n == 255` (an empty batch, misuse).
        records: u8,
        /// Bit `i`: record `i` is a store.
        writes: u8,
        /// 0: leave prefetch as it is; 1: off; else on at threshold `1 + p % 100`
        /// with big pages of `1 << (p % 5)` pages.
        prefetch: u8,
    },
    /// `region_advise` over pages of a region (read-mostly pages are read-duplicated).
    Advise {
        /// Which region.
        region: u16,
        /// First page (modulo the region's size).
        page: u8,
        /// Pages: `1 + n % left`.
        pages: u8,
        /// Which advice (modulo 7, see `advice`).
        kind: u8,
        /// The device the advice names (modulo 4).
        dev: u8,
        /// A range one page past the region (misuse).
        bad: bool,
    },
    /// `as_set_thrashing`: thrashing detection on with a small configuration (times
    /// in ticks of the space's migration clock: the test system has no platform
    /// clock) or off; with `stale`, a dead space handle (misuse).
    Thrashing {
        /// Which space.
        space: u8,
        /// On with this configuration, or off.
        config: Option<ThrashSel>,
        /// A dead space handle instead (if any is known).
        stale: bool,
    },
    /// Two devices take turns accessing one page: what makes a page thrash under
    /// the unique policy (each turn migrates it, until thrashing detection pins it or
    /// throttles a device). Turn `k` (by `a` when even, else `b`) loads the page's
    /// first 64 bytes when bit `k % 8` of `loads` is set, else stores 8 bytes at `8
    /// * (k % 8)`; it goes through `dev_fault` (which may be answered `Throttled`)
    /// instead of an access when bit `k % 8` of `faults` is set. Each turn is checked
    /// as a lone `Read`, `Write` or `Fault`.
    PingPong {
        /// One device.
        a: u8,
        /// The other.
        b: u8,
        /// Which region.
        region: u16,
        /// Page of the region.
        page: u8,
        /// Turns: `2 + rounds % 15`.
        rounds: u8,
        /// Turns that load (else store).
        loads: u8,
        /// Turns that call `dev_fault` (else access).
        faults: u8,
        /// Content seed.
        seed: u8,
    },
    /// `as_expire_pins`: the pins whose time is up end; with `stale`, a dead space
    /// handle (misuse).
    ExpirePins {
        /// Which space.
        space: u8,
        /// A dead space handle instead (if any is known).
        stale: bool,
    },
}

/// A thrashing configuration, small so that sequences of a few hundred operations
/// reach it: threshold `1 + threshold % 3` events, lapse `1 + lapse % 8` ticks, nap
/// `1 + nap % 4` ticks, pin time `pin_time % 16` ticks (0: pinned until detection
/// goes off).
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct ThrashSel {
    /// Thrashing events that make a page thrashing.
    pub threshold: u8,
    /// The longest gap between two events of a streak.
    pub lapse: u8,
    /// The throttling period.
    pub nap: u8,
    /// How long a page stays pinned.
    pub pin_time: u8,
    /// The mitigation.
    pub mitigation: MitigationSel,
}

/// A thrashing mitigation.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum MitigationSel {
    /// [`Mitigation::Pin`].
    Pin,
    /// [`Mitigation::Throttle`].
    Throttle,
    /// [`Mitigation::ThrottleThenPin`] after `1 + n % 4` throttlings.
    ThrottleThenPin(u8),
}

impl ThrashSel {
    /// The configuration this selects (always a valid one).
    pub fn config(self) -> ThrashingConfig {
        let mitigation = match self.mitigation {
            MitigationSel::Pin => Mitigation::Pin,
            MitigationSel::Throttle => Mitigation::Throttle,
            MitigationSel::ThrottleThenPin(n) => Mitigation::ThrottleThenPin {
                pin_threshold: 1 + n % 4,
            },
        };
        ThrashingConfig::new(
            1 + self.threshold % 3,
            1 + u64::from(self.lapse % 8),
            1 + u64::from(self.nap % 4),
            u64::from(self.pin_time % 16),
            mitigation,
        )
        .expect("a valid thrashing configuration")
    }
}

/// A wrong argument of `dma_map`.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaMisuse {
    /// None: a valid call.
    None,
    /// No frames.
    NoFrames,
    /// A frame one byte off its page.
    UnalignedFrame,
    /// A frame the core manages (host memory).
    ManagedFrame,
}
