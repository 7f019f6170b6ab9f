//! A test MMU and test memory that record everything (feature `test-util`).
//!
//! [`TestMmu`] keeps its page tables in a [`TableStore`] (which two MMUs of the same
//! format may share, as shared mode needs) and a TLB of its own that caches translations
//! until the core invalidates them — so a missing invalidation shows up as a stale
//! translation in a test. Every call is recorded as an [`MmuEvent`], in order, in a log
//! that may be shared by several MMUs, so tests can assert which mappings and
//! invalidations happened and in which order relative to frame and range reuse.
//!
//! [`TestMemory`] stores real bytes, sparse and page-granular.
//!
//! [`TestSystem`] puts a [`Gmem`] together with a host and any number of test devices
//! and performs device loads and stores the way hardware would: translate through the
//! device's TLB and page table, on a miss call `dev_fault` and retry, then move bytes in
//! the memory the translation points to.

use crate::addr::{PhysAddr, VaRange, VirtAddr, PAGE_SHIFT, PAGE_SIZE};
use crate::device::DeviceDesc;
use crate::error::FaultError;
use crate::flags::{DevCaps, PageSizes, Prot};
use crate::gmem::Gmem;
use crate::handle::DeviceId;
use crate::mmu::{
    DeviceMemory, FramePlacement, FrameRequest, MapRun, MemError, Mmu, MmuError, PageTableFormat,
    PageTableRoot,
};
use crate::platform::SingleCpu;
use crate::sync::{Arc, Mutex, RwLock};
use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashMap;

/// One recorded MMU call. `mmu` is the recording MMU's number; the other fields are
/// the call's arguments.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MmuEvent {
    /// `create_page_table` returned this root.
    Create { mmu: u32, root: PageTableRoot },
    /// `destroy_page_table`.
    Destroy { mmu: u32, root: PageTableRoot },
    /// `map`.
    Map {
        mmu: u32,
        root: PageTableRoot,
        run: MapRun,
    },
    /// `unmap`.
    Unmap {
        mmu: u32,
        root: PageTableRoot,
        range: VaRange,
    },
    /// `protect`.
    Protect {
        mmu: u32,
        root: PageTableRoot,
        range: VaRange,
        prot: Prot,
    },
    /// `invalidate` with its batch of ranges.
    Invalidate {
        mmu: u32,
        root: PageTableRoot,
        ranges: Vec<VaRange>,
    },
    /// `invalidate_all`.
    InvalidateAll { mmu: u32, root: PageTableRoot },
    /// `activate`.
    Activate {
        mmu: u32,
        root: Option<PageTableRoot>,
    },
}

/// A leaf translation: frame, protection, and the device whose memory holds the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pte {
    /// Frame number.
    pub pfn: u64,
    /// Permitted accesses.
    pub prot: Prot,
    /// Whose memory.
    pub memory: DeviceId,
    /// The region attributes the core gave the mapping.
    pub attrs: crate::mmu::Attrs,
}

/// Root → (vpn → PTE).
type Tables = BTreeMap<u64, BTreeMap<u64, Pte>>;

/// (root, first vpn) → pages of each large leaf, and the splits so far.
type LargeLeaves = (BTreeMap<(u64, u64), u64>, u64);

/// Page tables of one format: root → (vpn → PTE). Shared by MMUs that share tables.
///
/// Each PTE also has an accessed bit (kept beside the tables): a walk that fills a TLB
/// sets it, a new mapping starts with it clear, and
/// [`Mmu::test_and_clear_accessed`] reads and clears it.
#[derive(Default)]
///
/// Large leaves are kept as per-page PTEs (so every lookup is exact) plus a record of
/// each leaf: `(root, first vpn) → pages`. An unmap or protect that covers a leaf in
/// part splits it (the record goes, the pages stay as they were), as a driver must.
pub struct TableStore {
    tables: Mutex<(u64, Tables)>,
    accessed: Mutex<BTreeSet<(u64, u64)>>,
    dead_edits: Mutex<u64>,
    large: Mutex<LargeLeaves>,
}

impl TableStore {
    /// A new empty store.
    pub fn new() -> Arc<TableStore> {
        Arc::new(TableStore::default())
    }

    /// The PTE of `vpn` in `root`.
    pub fn lookup(&self, root: PageTableRoot, vpn: u64) -> Option<Pte> {
        self.tables
            .lock()
            .1
            .get(&root.0)
            .and_then(|t| t.get(&vpn))
            .copied()
    }

    /// Every PTE of `root`.
    pub fn entries(&self, root: PageTableRoot) -> Vec<(u64, Pte)> {
        self.tables
            .lock()
            .1
            .get(&root.0)
            .map(|t| t.iter().map(|(v, p)| (*v, *p)).collect())
            .unwrap_or_default()
    }

    /// Whether the accessed bit of `vpn`'s PTE in `root` is set.
    pub fn accessed(&self, root: PageTableRoot, vpn: u64) -> bool {
        self.accessed.lock().contains(&(root.0, vpn))
    }

    /// Whether `root` names a live (created, not yet destroyed) table.
    pub fn is_live(&self, root: PageTableRoot) -> bool {
        self.tables.lock().1.contains_key(&root.0)
    }

    /// Number of live tables.
    pub fn tables(&self) -> usize {
        self.tables.lock().1.len()
    }

    /// `map`, `unmap` and `protect` calls that named a table already destroyed (the
    /// core must never make one: a real driver would write freed memory).
    pub fn edits_of_destroyed(&self) -> u64 {
        *self.dead_edits.lock()
    }

    /// Count an edit of `root` if it was created and is gone.
    fn note_edit(&self, tables: &(u64, Tables), root: PageTableRoot) {
        if root.0 <= tables.0 && !tables.1.contains_key(&root.0) {
            *self.dead_edits.lock() += 1;
        }
    }

    /// The large leaves of `root`: (first vpn, pages), in address order.
    pub fn large_leaves(&self, root: PageTableRoot) -> Vec<(u64, u64)> {
        self.large
            .lock()
            .0
            .iter()
            .filter(|((r, _), _)| *r == root.0)
            .map(|((_, v), n)| (*v, *n))
            .collect()
    }

    /// Large leaves split so far (by a partial unmap or protect).
    pub fn splits(&self) -> u64 {
        self.large.lock().1
    }

    /// Forget the leaves of `root` in `[first, first + pages)`: whole ones silently,
    /// partly covered ones as splits (when `split_only`, whole ones stay).
    fn edit_large(&self, root: u64, first: u64, pages: u64, split_only: bool) {
        let mut l = self.large.lock();
        let lo = first.saturating_sub((1 << 18) - 1);
        let hit: Vec<(u64, u64)> =
            l.0.range((root, lo)..(root, first + pages))
                .filter(|((_, v), n)| v + *n > first)
                .map(|((_, v), n)| (*v, *n))
                .collect();
        for (v, n) in hit {
            let partial = v < first || v + n > first + pages;
            if partial || !split_only {
                l.0.remove(&(root, v));
            }
            if partial {
                l.1 += 1;
            }
        }
    }
}

/// A shared, ordered log of MMU events.
pub type EventLog = Arc<Mutex<Vec<MmuEvent>>>;

struct TlbState {
    root: Option<PageTableRoot>,
    entries: HashMap<(u64, u64), Pte>,
    hits: u64,
    misses: u64,
}

/// An MMU whose page tables and TLB live in ordinary memory, recording every call.
pub struct TestMmu {
    id: u32,
    format: PageTableFormat,
    sizes: PageSizes,
    store: Arc<TableStore>,
    log: EventLog,
    record: bool,
    tlb: Mutex<TlbState>,
    fail_next_maps: Mutex<u32>,
    fail_next_protects: Mutex<u32>,
    concurrent: bool,
    /// Held shared by every access from translation to the end of its memory access,
    /// and exclusively by invalidation: an invalidation completes only after the
    /// accesses that may have used a stale translation have finished, as a real TLB
    /// shootdown waits for outstanding accesses.
    inflight: RwLock<()>,
}

impl TestMmu {
    /// A test MMU numbered `id` (used in its events), of `format`, keeping tables in
    /// `store` and recording into `log`.
    pub fn new(id: u32, format: u32, store: Arc<TableStore>, log: EventLog) -> TestMmu {
        TestMmu {
            id,
            format: PageTableFormat(format),
            sizes: PageSizes::S4K,
            store,
            log,
            record: true,
            tlb: Mutex::new(TlbState {
                root: None,
                entries: HashMap::new(),
                hits: 0,
                misses: 0,
            }),
            fail_next_maps: Mutex::new(0),
            fail_next_protects: Mutex::new(0),
            concurrent: false,
            inflight: RwLock::new(()),
        }
    }

    /// Report these page sizes instead of 4 KiB only.
    pub fn with_page_sizes(mut self, sizes: PageSizes) -> TestMmu {
        self.sizes = sizes;
        self
    }

    /// Declare that the tables take concurrent edits of disjoint ranges
    /// ([`Mmu::concurrent_edits`]; the store's lock makes that true).
    pub fn with_concurrent_edits(mut self) -> TestMmu {
        self.concurrent = true;
        self
    }

    /// Do not record events (benchmarks).
    pub fn without_log(mut self) -> TestMmu {
        self.record = false;
        self
    }

    /// Make the next `n` calls to `map` fail with `OutOfTableMemory`.
    pub fn fail_next_maps(&self, n: u32) {
        *self.fail_next_maps.lock() = n;
    }

    /// Make the next `n` `protect` calls fail with `OutOfTableMemory` after changing
    /// the first page of their range (a driver that fails half-way through a run).
    pub fn fail_next_protects(&self, n: u32) {
        *self.fail_next_protects.lock() = n;
    }

    /// The table store.
    pub fn store(&self) -> &Arc<TableStore> {
        &self.store
    }

    /// The root the device translates with.
    pub fn active_root(&self) -> Option<PageTableRoot> {
        self.tlb.lock().root
    }

    /// TLB hits and misses so far.
    pub fn tlb_counts(&self) -> (u64, u64) {
        let t = self.tlb.lock();
        (t.hits, t.misses)
    }

    /// What the device would use to translate `va`: its TLB first, then a walk of the
    /// active table (filling the TLB). `None` when nothing translates it.
    pub fn translate(&self, va: VirtAddr) -> Option<Pte> {
        let mut tlb = self.tlb.lock();
        let root = tlb.root?;
        let key = (root.0, va.vpn().0);
        if let Some(p) = tlb.entries.get(&key).copied() {
            tlb.hits += 1;
            return Some(p);
        }
        tlb.misses += 1;
        let p = self.store.lookup(root, va.vpn().0)?;
        // The walk sets the accessed bit. (A concurrent unmap may remove the PTE between
        // the lookup and here; the stale bit is cleared by the next map of the page.)
        self.store.accessed.lock().insert(key);
        tlb.entries.insert(key, p);
        Some(p)
    }

    /// Whether the TLB holds an entry for `va` in `root` (stale or not).
    pub fn tlb_holds(&self, root: PageTableRoot, va: VirtAddr) -> bool {
        self.tlb.lock().entries.contains_key(&(root.0, va.vpn().0))
    }

    fn log(&self, e: MmuEvent) {
        if self.record {
            self.log.lock().push(e);
        }
    }
}

impl Mmu for TestMmu {
    fn format(&self) -> PageTableFormat {
        self.format
    }
    fn page_sizes(&self) -> PageSizes {
        self.sizes
    }
    fn create_page_table(&self) -> Result<PageTableRoot, MmuError> {
        let root = {
            let mut t = self.store.tables.lock();
            t.0 += 1;
            let root = t.0;
            t.1.insert(root, BTreeMap::new());
            PageTableRoot(root)
        };
        self.log(MmuEvent::Create { mmu: self.id, root });
        Ok(root)
    }
    fn destroy_page_table(&self, root: PageTableRoot) {
        self.store.tables.lock().1.remove(&root.0);
        self.store.accessed.lock().retain(|(r, _)| *r != root.0);
        self.store.large.lock().0.retain(|(r, _), _| *r != root.0);
        self.log(MmuEvent::Destroy { mmu: self.id, root });
    }
    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        {
            let mut f = self.fail_next_maps.lock();
            if *f > 0 {
                *f -= 1;
                return Err(MmuError::OutOfTableMemory);
            }
        }
        let size = run.page_size.bytes();
        if !self.sizes.supports(run.page_size)
            || run.va.as_u64() % size != 0
            || run.pa.as_u64() % size != 0
            || run.len == 0
            || run.len % size != 0
        {
            return Err(MmuError::Unsupported { va: run.va });
        }
        {
            let mut t = self.store.tables.lock();
            self.store.note_edit(&t, root);
            let table = t.1.get_mut(&root.0).ok_or(MmuError::Hardware(1))?;
            if size > PAGE_SIZE {
                let n = size >> PAGE_SHIFT;
                let mut l = self.store.large.lock();
                for k in 0..run.len / size {
                    l.0.insert((root.0, run.va.vpn().0 + k * n), n);
                }
            }
            let mut accessed = self.store.accessed.lock();
            for k in 0..run.len >> PAGE_SHIFT {
                accessed.remove(&(root.0, run.va.vpn().0 + k));
                table.insert(
                    run.va.vpn().0 + k,
                    Pte {
                        pfn: run.pa.pfn().0 + k,
                        prot: run.prot,
                        memory: run.memory,
                        attrs: run.attrs,
                    },
                );
            }
        }
        self.log(MmuEvent::Map {
            mmu: self.id,
            root,
            run: *run,
        });
        Ok(())
    }
    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        {
            let mut t = self.store.tables.lock();
            self.store.note_edit(&t, root);
            if let Some(table) = t.1.get_mut(&root.0) {
                let first = range.first_vpn().0;
                self.store.edit_large(root.0, first, range.pages(), false);
                let mut accessed = self.store.accessed.lock();
                for v in first..first + range.pages() {
                    table.remove(&v);
                    accessed.remove(&(root.0, v));
                }
            }
        }
        self.log(MmuEvent::Unmap {
            mmu: self.id,
            root,
            range,
        });
    }
    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        let fail = {
            let mut f = self.fail_next_protects.lock();
            let fail = *f > 0;
            *f = f.saturating_sub(1);
            fail
        };
        {
            let mut t = self.store.tables.lock();
            self.store.note_edit(&t, root);
            if let Some(table) = t.1.get_mut(&root.0) {
                let first = range.first_vpn().0;
                // Split first (a reserve makes it infallible), then change.
                self.store.edit_large(root.0, first, range.pages(), true);
                let pages = if fail { 1 } else { range.pages() };
                for v in first..first + pages {
                    if let Some(p) = table.get_mut(&v) {
                        p.prot = prot;
                    }
                }
            }
        }
        self.log(MmuEvent::Protect {
            mmu: self.id,
            root,
            range,
            prot,
        });
        if fail {
            return Err(MmuError::OutOfTableMemory);
        }
        Ok(())
    }
    fn invalidate(&self, root: PageTableRoot, ranges: &[VaRange]) {
        let _drained = self.inflight.write();
        {
            let mut tlb = self.tlb.lock();
            for r in ranges {
                let first = r.first_vpn().0;
                if r.pages() as usize > tlb.entries.len() {
                    tlb.entries.retain(|(rt, v), _| {
                        !(*rt == root.0 && *v >= first && *v < first + r.pages())
                    });
                } else {
                    for v in first..first + r.pages() {
                        tlb.entries.remove(&(root.0, v));
                    }
                }
            }
        }
        self.log(MmuEvent::Invalidate {
            mmu: self.id,
            root,
            ranges: ranges.to_vec(),
        });
    }
    fn invalidate_all(&self, root: PageTableRoot) {
        let _drained = self.inflight.write();
        self.tlb.lock().entries.retain(|(r, _), _| *r != root.0);
        self.log(MmuEvent::InvalidateAll { mmu: self.id, root });
    }
    fn activate(&self, root: Option<PageTableRoot>) {
        self.tlb.lock().root = root;
        self.log(MmuEvent::Activate { mmu: self.id, root });
    }
    fn concurrent_edits(&self) -> bool {
        self.concurrent
    }
    fn test_and_clear_accessed(&self, root: PageTableRoot, range: VaRange) -> Option<bool> {
        let first = range.first_vpn().0;
        let mut accessed = self.store.accessed.lock();
        let mut any = false;
        for v in first..first + range.pages() {
            any |= accessed.remove(&(root.0, v));
        }
        Some(any)
    }
}

/// Sparse byte-holding memory: absent pages read as zeros.
#[derive(Default)]
pub struct TestMemory {
    pages: Mutex<HashMap<u64, Box<[u8; PAGE_SIZE as usize]>>>,
    /// `[base, end)` of addresses this memory answers for (`None` = any).
    bounds: Option<(u64, u64)>,
    counts: Mutex<MemCounts>,
    placement: Mutex<FramePlacement>,
    requests: Mutex<Vec<FrameRequest>>,
    /// Page-group classes: `Some(n)` answers class `(va / 16 KiB) % n`.
    classes: Mutex<Option<u32>>,
    /// Every page-group class change the core announced: `(base, frames, from, to)`.
    class_changes: Mutex<Vec<(PhysAddr, u64, u32, u32)>>,
}

/// What a [`TestMemory`] was asked to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemCounts {
    /// Bytes zeroed.
    pub zeroed: u64,
    /// Bytes read.
    pub read: u64,
    /// Bytes written.
    pub written: u64,
    /// `copy` calls made from this memory (each moves one run, through the bounce
    /// buffer of [`crate::mmu::bounce_copy`]).
    pub copies: u64,
}

impl TestMemory {
    /// Memory answering for `[base, end)`.
    pub fn with_bounds(base: u64, end: u64) -> TestMemory {
        TestMemory {
            bounds: Some((base, end)),
            ..TestMemory::default()
        }
    }

    /// Answer every frame request with `placement`.
    pub fn set_frame_placement(&self, placement: FramePlacement) {
        *self.placement.lock() = placement;
    }

    /// The frame requests asked of this memory since the last call, in order.
    pub fn take_frame_requests(&self) -> Vec<FrameRequest> {
        core::mem::take(&mut *self.requests.lock())
    }

    /// Answer frame requests with page-group class `(va / 16 KiB) % n` (`None` or
    /// `Some(0)`: class 0 for all).
    pub fn set_frame_classes(&self, n: Option<u32>) {
        *self.classes.lock() = n.filter(|&n| n > 0);
    }

    /// The class [`DeviceMemory::frame_class`] answers for `va`.
    pub fn class_of(&self, va: VirtAddr) -> u32 {
        match *self.classes.lock() {
            Some(n) => ((va.as_u64() >> (PAGE_SHIFT + 2)) % u64::from(n)) as u32,
            None => 0,
        }
    }

    /// The page-group class changes announced so far: `(base, frames, from, to)`.
    pub fn class_changes(&self) -> Vec<(PhysAddr, u64, u32, u32)> {
        self.class_changes.lock().clone()
    }

    /// What it was asked to do.
    pub fn counts(&self) -> MemCounts {
        *self.counts.lock()
    }

    fn check(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        match self.bounds {
            Some((b, e)) if pa.as_u64() < b || pa.as_u64().saturating_add(len) > e => {
                Err(MemError::OutOfRange { pa })
            }
            _ => Ok(()),
        }
    }

    fn each_page(pa: PhysAddr, len: u64, mut f: impl FnMut(u64, usize, usize, usize)) {
        let mut done = 0u64;
        while done < len {
            let a = pa.as_u64() + done;
            let off = (a & (PAGE_SIZE - 1)) as usize;
            let n = ((PAGE_SIZE as usize - off) as u64).min(len - done) as usize;
            f(a >> PAGE_SHIFT, off, n, done as usize);
            done += n as u64;
        }
    }
}

impl DeviceMemory for TestMemory {
    fn copy(
        &self,
        src: PhysAddr,
        to: &dyn DeviceMemory,
        dst: PhysAddr,
        len: u64,
    ) -> Result<(), MemError> {
        self.counts.lock().copies += 1;
        crate::mmu::bounce_copy(self, src, to, dst, len)
    }
    fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        self.check(pa, len)?;
        let mut pages = self.pages.lock();
        TestMemory::each_page(pa, len, |pfn, off, n, _| {
            if n == PAGE_SIZE as usize {
                pages.remove(&pfn);
            } else if let Some(p) = pages.get_mut(&pfn) {
                p[off..off + n].fill(0);
            }
        });
        self.counts.lock().zeroed += len;
        Ok(())
    }
    fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
        self.check(pa, buf.len() as u64)?;
        let pages = self.pages.lock();
        TestMemory::each_page(pa, buf.len() as u64, |pfn, off, n, at| {
            match pages.get(&pfn) {
                Some(p) => buf[at..at + n].copy_from_slice(&p[off..off + n]),
                None => buf[at..at + n].fill(0),
            }
        });
        self.counts.lock().read += buf.len() as u64;
        Ok(())
    }
    fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
        self.check(pa, buf.len() as u64)?;
        let mut pages = self.pages.lock();
        TestMemory::each_page(pa, buf.len() as u64, |pfn, off, n, at| {
            let p = pages
                .entry(pfn)
                .or_insert_with(|| Box::new([0; PAGE_SIZE as usize]));
            p[off..off + n].copy_from_slice(&buf[at..at + n]);
        });
        self.counts.lock().written += buf.len() as u64;
        Ok(())
    }
    fn frame_request(&self, request: &FrameRequest) -> FramePlacement {
        self.requests.lock().push(*request);
        *self.placement.lock()
    }
    fn frame_class(&self, request: &FrameRequest) -> u32 {
        self.class_of(request.va)
    }
    fn group_class_changed(&self, base: PhysAddr, frames: u64, from: u32, to: u32) {
        self.class_changes.lock().push((base, frames, from, to));
    }
}

/// One device of a [`TestSystem`].
pub struct TestDevice {
    /// Its handle.
    pub id: DeviceId,
    /// Its MMU.
    pub mmu: Arc<TestMmu>,
    /// Its memory, if it has any.
    pub memory: Option<Arc<TestMemory>>,
}

/// Why a test access failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessError {
    /// The fault could not be served.
    Fault(FaultError),
    /// The device cannot fault and nothing translates the address.
    Unmapped(VirtAddr),
    /// The translation points at memory no device of the system has.
    NoMemory(DeviceId),
    /// A fault was answered with a retry, but the retry faulted again too often.
    Livelock(VirtAddr),
}

/// A GMEM instance with a host and test devices, and hardware-like accesses.
pub struct TestSystem {
    /// The instance.
    pub gm: Gmem,
    /// The host CPU (index 0) and the devices added, in order.
    pub devices: Vec<TestDevice>,
    /// The shared event log.
    pub log: EventLog,
    /// Table store of format 1 (the host's format, shared-mode capable).
    pub host_store: Arc<TableStore>,
    /// Whether devices added from now on declare [`Mmu::concurrent_edits`].
    pub concurrent_edits: bool,
}

/// Base of the host memory of a [`TestSystem`].
pub const HOST_BASE: u64 = 0x1000_0000;

impl TestSystem {
    /// A system whose host has `host_pages` pages of memory, recording events.
    pub fn new(host_pages: u64) -> TestSystem {
        TestSystem::build(host_pages, true, PageSizes::S4K)
    }

    /// The same without an event log (benchmarks).
    pub fn without_log(host_pages: u64) -> TestSystem {
        TestSystem::build(host_pages, false, PageSizes::S4K)
    }

    /// [`TestSystem::new`] with a host MMU that maps the page sizes `sizes`.
    pub fn with_host_sizes(host_pages: u64, sizes: PageSizes) -> TestSystem {
        TestSystem::build(host_pages, true, sizes)
    }

    fn build(host_pages: u64, record: bool, sizes: PageSizes) -> TestSystem {
        let log: EventLog = Arc::new(Mutex::new(Vec::new()));
        let host_store = TableStore::new();
        let mut mmu = TestMmu::new(0, 1, host_store.clone(), log.clone()).with_page_sizes(sizes);
        if !record {
            mmu = mmu.without_log();
        }
        let mmu = Arc::new(mmu);
        let memory = Arc::new(TestMemory::default());
        let gm = Gmem::new(
            Arc::new(SingleCpu),
            DeviceDesc {
                name: String::from("cpu"),
                mmu: mmu.clone(),
                memory: Some(memory.clone()),
                caps: DevCaps::FAULTABLE,
                data: None,
            },
        )
        .expect("the test MMU supports 4 KiB pages");
        let host = gm.host();
        gm.dev_register_physmem(
            host,
            PhysAddr::new(HOST_BASE),
            PhysAddr::new(HOST_BASE + host_pages * PAGE_SIZE),
        )
        .expect("fresh host memory registers");
        TestSystem {
            gm,
            devices: alloc::vec![TestDevice {
                id: host,
                mmu,
                memory: Some(memory)
            }],
            log,
            host_store,
            concurrent_edits: false,
        }
    }

    /// The host device.
    pub fn host(&self) -> &TestDevice {
        &self.devices[0]
    }

    /// Add a device with MMU `format` (1 = the host's, so it can share tables),
    /// capabilities, and `mem_pages` pages of local memory at `mem_base` (0 pages = none).
    /// Returns its index in [`TestSystem::devices`].
    pub fn add_device(
        &mut self,
        format: u32,
        caps: DevCaps,
        mem_base: u64,
        mem_pages: u64,
    ) -> usize {
        self.add_device_with_sizes(format, caps, mem_base, mem_pages, PageSizes::S4K)
    }

    /// [`TestSystem::add_device`] with an MMU that maps the page sizes `sizes` (large
    /// leaves are recorded in its table store, see [`TableStore::large_leaves`]).
    pub fn add_device_with_sizes(
        &mut self,
        format: u32,
        caps: DevCaps,
        mem_base: u64,
        mem_pages: u64,
        sizes: PageSizes,
    ) -> usize {
        let n = self.devices.len() as u32;
        let store = if format == 1 {
            self.host_store.clone()
        } else {
            TableStore::new()
        };
        let mut mmu = TestMmu::new(n, format, store, self.log.clone()).with_page_sizes(sizes);
        if self.concurrent_edits {
            mmu = mmu.with_concurrent_edits();
        }
        if self.log.lock().is_empty() && !self.devices[0].mmu.record {
            mmu = mmu.without_log();
        }
        let mmu = Arc::new(mmu);
        let memory = (mem_pages > 0).then(|| {
            Arc::new(TestMemory::with_bounds(
                mem_base,
                mem_base + mem_pages * PAGE_SIZE,
            ))
        });
        let id = self
            .gm
            .dev_create(DeviceDesc {
                name: alloc::format!("dev{n}"),
                mmu: mmu.clone(),
                memory: memory.clone().map(|m| m as Arc<dyn DeviceMemory>),
                caps,
                data: None,
            })
            .expect("the test MMU supports 4 KiB pages");
        if memory.is_some() {
            self.gm
                .dev_register_physmem(
                    id,
                    PhysAddr::new(mem_base),
                    PhysAddr::new(mem_base + mem_pages * PAGE_SIZE),
                )
                .expect("fresh device memory registers");
        }
        self.devices.push(TestDevice { id, mmu, memory });
        self.devices.len() - 1
    }

    fn memory_of(&self, id: DeviceId) -> Option<&Arc<TestMemory>> {
        self.devices
            .iter()
            .find(|d| d.id == id)
            .and_then(|d| d.memory.as_ref())
    }

    /// Perform one access of `dev` (an index) to the page holding `va`, as hardware
    /// would: translate (TLB, then table walk); on a miss or a protection fault drop the
    /// translation, report the fault to the core and retry. `f` runs with the
    /// translation while the access is in flight (an invalidation waits for it).
    ///
    /// # Errors
    /// [`AccessError`]: the fault the core refused (with its typed [`FaultError`]), a
    /// device that cannot fault touching an unmapped address, a translation to memory
    /// no device has, or a retry that kept faulting.
    pub fn access<R>(
        &self,
        dev: usize,
        va: VirtAddr,
        access: Prot,
        f: impl FnOnce(Pte) -> R,
    ) -> Result<R, AccessError> {
        let d = &self.devices[dev];
        let mut f = Some(f);
        for _ in 0..4 {
            {
                let _inflight = d.mmu.inflight.read();
                if let Some(p) = d.mmu.translate(va) {
                    if p.prot.contains(access) {
                        let f = f.take().expect("called once");
                        return Ok(f(p));
                    }
                }
            }
            if !self
                .gm
                .dev_caps(d.id)
                .map(|c| c.contains(DevCaps::FAULTABLE))
                .unwrap_or(false)
            {
                return Err(AccessError::Unmapped(va));
            }
            // A real MMU reports the fault and drops its cached translation.
            if let Some(root) = d.mmu.active_root() {
                d.mmu.tlb.lock().entries.remove(&(root.0, va.vpn().0));
            }
            let _retry = self
                .gm
                .dev_fault(d.id, va, access)
                .map_err(AccessError::Fault)?;
        }
        Err(AccessError::Livelock(va))
    }

    /// Translate `va` for device `dev` (an index), faulting as hardware would.
    ///
    /// # Errors
    /// [`AccessError`]: the fault the core refused (with its typed [`FaultError`]), a
    /// device that cannot fault touching an unmapped address, a translation to memory
    /// no device has, or a retry that kept faulting.
    pub fn translate(&self, dev: usize, va: VirtAddr, access: Prot) -> Result<Pte, AccessError> {
        self.access(dev, va, access, |p| p)
    }

    /// Store `data` at `va` through device `dev`.
    ///
    /// # Errors
    /// [`AccessError`]: the fault the core refused (with its typed [`FaultError`]), a
    /// device that cannot fault touching an unmapped address, a translation to memory
    /// no device has, or a retry that kept faulting.
    pub fn write(&self, dev: usize, va: VirtAddr, data: &[u8]) -> Result<(), AccessError> {
        let mut done = 0usize;
        while done < data.len() {
            let a = VirtAddr::new(va.as_u64() + done as u64);
            let n = ((PAGE_SIZE - a.page_offset()) as usize).min(data.len() - done);
            let chunk = &data[done..done + n];
            self.access(dev, a, Prot::WRITE, |p| {
                let mem = self
                    .memory_of(p.memory)
                    .ok_or(AccessError::NoMemory(p.memory))?;
                mem.write(
                    PhysAddr::new((p.pfn << PAGE_SHIFT) + a.page_offset()),
                    chunk,
                )
                .map_err(|e| AccessError::Fault(FaultError::Memory(e)))
            })??;
            done += n;
        }
        Ok(())
    }

    /// Load `len` bytes at `va` through device `dev`.
    ///
    /// # Errors
    /// [`AccessError`]: the fault the core refused (with its typed [`FaultError`]), a
    /// device that cannot fault touching an unmapped address, a translation to memory
    /// no device has, or a retry that kept faulting.
    pub fn read(&self, dev: usize, va: VirtAddr, len: usize) -> Result<Vec<u8>, AccessError> {
        let mut out = alloc::vec![0u8; len];
        let mut done = 0usize;
        while done < len {
            let a = VirtAddr::new(va.as_u64() + done as u64);
            let n = ((PAGE_SIZE - a.page_offset()) as usize).min(len - done);
            let chunk = &mut out[done..done + n];
            self.access(dev, a, Prot::READ, |p| {
                let mem = self
                    .memory_of(p.memory)
                    .ok_or(AccessError::NoMemory(p.memory))?;
                mem.read(
                    PhysAddr::new((p.pfn << PAGE_SHIFT) + a.page_offset()),
                    chunk,
                )
                .map_err(|e| AccessError::Fault(FaultError::Memory(e)))
            })??;
            done += n;
        }
        Ok(out)
    }

    /// Take and clear the event log.
    pub fn take_events(&self) -> Vec<MmuEvent> {
        core::mem::take(&mut *self.log.lock())
    }
}
