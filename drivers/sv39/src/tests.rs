//! Host tests: the driver over a `Vec`-backed page-table memory and a recording hart.
//!
//! The test memory hands out frames from a fixed physical window and panics when the
//! driver reads or writes a frame it does not hold, so a use-after-free of a table is
//! a failing test, not silent corruption.

use crate::pte::{is_canonical, is_canonical_range, LeafAttrs, Pte, PteFlags, PteKind};
use crate::{GlobalMapping, Sv39, Sv39Config, Sv39Hardware, HW_UNKNOWN_ROOT};
use gmem_core::sync::{AtomicU64, Mutex, Ordering};
use gmem_core::{
    Activation, DeviceId, FrameSource, MapRun, Mmu, MmuError, PageSize, PageTableRoot, PhysAddr,
    Prot, VaRange, VirtAddr, PAGE_SIZE,
};
use std::boxed::Box;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::vec::Vec;

/// Page-table frames in a window at `BASE`, contents in a map.
struct TestFrames {
    frames: Mutex<HashMap<u64, Box<[u64; 512]>>>,
    free: Mutex<Vec<u64>>,
    /// Allocations still allowed (failure injection).
    budget: AtomicU64,
}

const BASE: u64 = 0x8000_0000;
const WINDOW_FRAMES: u64 = 4096;

impl TestFrames {
    fn new() -> Arc<TestFrames> {
        Arc::new(TestFrames {
            frames: Mutex::new(HashMap::new()),
            free: Mutex::new(
                (0..WINDOW_FRAMES)
                    .rev()
                    .map(|k| BASE + k * PAGE_SIZE)
                    .collect(),
            ),
            budget: AtomicU64::new(u64::MAX),
        })
    }
    fn outstanding(&self) -> u64 {
        self.frames.lock().len() as u64
    }
}

// SAFETY: frames come off a free list over a private window (each handed out once until
// freed), their contents are fresh zeroed boxes, and a double free panics.
unsafe impl FrameSource for TestFrames {
    fn alloc_frame(&self) -> Option<PhysAddr> {
        if self.budget.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.budget.fetch_sub(1, Ordering::Relaxed);
        let f = self.free.lock().pop()?;
        self.frames.lock().insert(f, Box::new([0; 512]));
        Some(PhysAddr::new(f))
    }
    fn free_frame(&self, frame: PhysAddr) {
        let f = frame.as_u64();
        assert!(
            self.frames.lock().remove(&f).is_some(),
            "double free of table {f:#x}"
        );
        self.free.lock().push(f);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Fence(Option<u64>),
    Satp(u64),
    /// A remote fence: the harts, the range (`None`: everything) and the table frames
    /// the test memory still held when it was asked.
    Remote(u64, Option<(u64, u64)>, u64),
}

struct TestHart {
    mem: Arc<TestFrames>,
    log: Mutex<Vec<Event>>,
    /// The hart the test pretends to run on.
    me: AtomicU64,
}

impl TestHart {
    fn new(mem: Arc<TestFrames>) -> TestHart {
        TestHart {
            mem,
            log: Mutex::new(Vec::new()),
            me: AtomicU64::new(0),
        }
    }
    fn slot(&self, pa: PhysAddr) -> (u64, usize) {
        let a = pa.as_u64();
        assert_eq!(a % 8, 0, "unaligned entry access {a:#x}");
        (a & !(PAGE_SIZE - 1), ((a % PAGE_SIZE) / 8) as usize)
    }
    fn take_log(&self) -> Vec<Event> {
        core::mem::take(&mut *self.log.lock())
    }
}

impl Sv39Hardware for TestHart {
    unsafe fn read_pte(&self, pa: PhysAddr) -> u64 {
        let (f, i) = self.slot(pa);
        let frames = self.mem.frames.lock();
        let frame = frames
            .get(&f)
            .unwrap_or_else(|| panic!("read of {pa} outside a held table"));
        frame[i]
    }
    unsafe fn write_pte(&self, pa: PhysAddr, pte: u64) {
        let (f, i) = self.slot(pa);
        let mut frames = self.mem.frames.lock();
        let frame = frames
            .get_mut(&f)
            .unwrap_or_else(|| panic!("write of {pa} outside a held table"));
        frame[i] = pte;
    }
    fn sfence_vma(&self, va: Option<VirtAddr>) {
        self.log.lock().push(Event::Fence(va.map(|v| v.as_u64())));
    }
    unsafe fn write_satp(&self, satp: u64) {
        self.log.lock().push(Event::Satp(satp));
    }
    fn current_hart(&self) -> usize {
        self.me.load(Ordering::Relaxed) as usize
    }
    fn remote_sfence_vma(&self, harts: u64, range: Option<VaRange>) {
        assert_eq!(
            harts & (1 << self.current_hart()),
            0,
            "a remote fence names the caller"
        );
        let held = self.mem.outstanding();
        self.log.lock().push(Event::Remote(
            harts,
            range.map(|r| (r.start.as_u64(), r.len)),
            held,
        ));
    }
}

struct Rig {
    mem: Arc<TestFrames>,
    mmu: Sv39<TestHart>,
}

fn rig_with(config: Sv39Config, globals: &[GlobalMapping]) -> Result<Rig, MmuError> {
    let mem = TestFrames::new();
    let hart = TestHart::new(mem.clone());
    // SAFETY: the test hart never translates; the frames are the test memory's own.
    let mmu = unsafe { Sv39::new(hart, mem.clone(), config, globals) }?;
    Ok(Rig { mem, mmu })
}

fn rig() -> Rig {
    rig_with(Sv39Config::default(), &[]).expect("empty driver")
}

fn run(va: u64, pa: u64, pages: u64, prot: Prot) -> MapRun {
    MapRun {
        va: VirtAddr::new(va),
        pa: PhysAddr::new(pa),
        len: pages * PAGE_SIZE,
        prot,
        page_size: PageSize::Size4K,
        memory: any_device(),
        attrs: Default::default(),
    }
}

/// A device id for `MapRun::memory` (the driver ignores it). `DeviceId` has no public
/// constructor, so it comes from a throwaway instance.
fn any_device() -> DeviceId {
    static ID: std::sync::OnceLock<DeviceId> = std::sync::OnceLock::new();
    *ID.get_or_init(|| {
        let gm = gmem_core::Gmem::new(
            Arc::new(gmem_core::SingleCpu),
            gmem_core::DeviceDesc {
                name: "any".into(),
                mmu: Arc::new(rig().mmu),
                memory: None,
                caps: gmem_core::DevCaps::empty(),
                data: None,
            },
        )
        .expect("an Sv39 MMU has 4 KiB pages");
        gm.host()
    })
}

fn range(va: u64, pages: u64) -> VaRange {
    VaRange::new(VirtAddr::new(va), pages * PAGE_SIZE).expect("test range")
}

// ----- format ------------------------------------------------------------------------

#[test]
fn leaf_entries_round_trip_pa_and_permissions() {
    let prots = [
        Prot::READ,
        Prot::RW,
        Prot::EXEC,
        Prot::READ | Prot::EXEC,
        Prot::RWX,
    ];
    let pas = [0, 0x1000, 0x8020_3000, 0x00ff_ffff_ffff_f000];
    for pa in pas {
        for prot in prots {
            for (user, global) in [(false, false), (true, false), (false, true)] {
                let attrs = LeafAttrs { user, global };
                let e = Pte::leaf(PhysAddr::new(pa), prot, attrs).unwrap();
                let PteKind::Leaf {
                    pa: p,
                    prot: q,
                    flags,
                } = e.decode()
                else {
                    panic!("{e:?} is not a leaf");
                };
                assert_eq!((p.as_u64(), q), (pa, prot));
                assert!(flags.contains(PteFlags::V | PteFlags::A));
                assert_eq!(flags.contains(PteFlags::D), prot.contains(Prot::WRITE));
                assert_eq!(flags.contains(PteFlags::U), user);
                assert_eq!(flags.contains(PteFlags::G), global);
                assert_eq!(e.0 >> 54, 0, "reserved bits stay clear");
            }
        }
    }
    // Write-only is not encodable (W without R is reserved): it becomes read-write.
    let w = Pte::leaf(PhysAddr::new(0x2000), Prot::WRITE, LeafAttrs::default()).unwrap();
    assert!(matches!(w.decode(), PteKind::Leaf { prot: Prot::RW, .. }));
    // The PPN sits at bit 10.
    assert_eq!(w.0 >> 10, 2);
}

#[test]
fn table_invalid_and_reserved_entries_decode_as_such() {
    let t = Pte::table(PhysAddr::new(0x8765_4000)).unwrap();
    assert_eq!(t.0, (0x87654 << 10) | 1);
    assert_eq!(t.decode(), PteKind::Table(PhysAddr::new(0x8765_4000)));
    assert_eq!(Pte::INVALID.decode(), PteKind::Invalid);
    assert_eq!(Pte(0xffff_fffe).decode(), PteKind::Invalid);
    let w_only = Pte(PteFlags::V.bits() | PteFlags::W.bits());
    assert_eq!(w_only.decode(), PteKind::Reserved(w_only.0));
    let high = Pte(t.0 | 1 << 62);
    assert_eq!(high.decode(), PteKind::Reserved(high.0));
}

#[test]
fn unencodable_entries_are_refused() {
    let a = LeafAttrs::default();
    assert_eq!(Pte::leaf(PhysAddr::new(0x1000), Prot::empty(), a), None);
    assert_eq!(Pte::leaf(PhysAddr::new(0x1800), Prot::READ, a), None);
    assert_eq!(Pte::leaf(PhysAddr::new(1 << 56), Prot::READ, a), None);
    assert_eq!(Pte::table(PhysAddr::new(0x10)), None);
}

#[test]
fn protection_rewrite_keeps_ppn_user_and_global_bits() {
    let attrs = LeafAttrs {
        user: true,
        global: true,
    };
    let e = Pte::leaf(PhysAddr::new(0x4_2000), Prot::RW, attrs).unwrap();
    let r = e.with_prot(Prot::READ).unwrap();
    assert_eq!(r.pa(), e.pa());
    assert!(r.flags().contains(PteFlags::U | PteFlags::G | PteFlags::R));
    assert!(!r.flags().intersects(PteFlags::W | PteFlags::D));
    assert_eq!(e.with_prot(Prot::empty()), None);
}

#[test]
fn canonical_means_sign_extended_from_bit_38() {
    assert!(is_canonical(0));
    assert!(is_canonical((1 << 38) - 1));
    assert!(!is_canonical(1 << 38));
    assert!(!is_canonical(1 << 39));
    assert!(is_canonical(0xffff_ffc0_0000_0000));
    assert!(!is_canonical(0xffff_ff80_0000_0000));
    assert!(is_canonical(u64::MAX));
    assert!(is_canonical_range(0, 1 << 38));
    assert!(!is_canonical_range(0, (1 << 38) + PAGE_SIZE));
    assert!(!is_canonical_range((1 << 38) - PAGE_SIZE, 2 * PAGE_SIZE));
    assert!(is_canonical_range(u64::MAX - 0xfff, PAGE_SIZE));
    assert!(!is_canonical_range(0, 0));
}

// ----- map / walk / unmap / protect --------------------------------------------------

/// Candidate pages: around 2 MiB and 1 GiB boundaries in the lower half, and at the
/// top of the upper half.
fn candidates() -> Vec<u64> {
    let mut v = Vec::new();
    for base in [
        0x4000_0000u64,
        0x4020_0000 - 4 * PAGE_SIZE,
        0x7fff_f000 - 2 * PAGE_SIZE,
        0x3f_ffe0_0000,
        0xffff_ffc0_0000_0000,
        u64::MAX - 8 * PAGE_SIZE + 1,
    ] {
        for k in 0..8 {
            v.push(base + k * PAGE_SIZE);
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn map_walk_unmap_and_protect_agree_with_a_model() {
    let r = rig();
    let root = r.mmu.create_page_table().unwrap();
    let cands = candidates();
    let mut model: BTreeMap<u64, (u64, Prot)> = BTreeMap::new();
    let prots = [Prot::READ, Prot::RW, Prot::RWX, Prot::READ | Prot::EXEC];
    let mut rng = Lcg(0x5339);
    for step in 0..3000 {
        let i = (rng.next() as usize) % cands.len();
        // Runs stay inside one block of consecutive candidates.
        let mut n = 1 + rng.next() % 4;
        while n > 1
            && !(1..n)
                .all(|k| cands.get(i + k as usize) == Some(&cands[i].wrapping_add(k * PAGE_SIZE)))
        {
            n -= 1;
        }
        let va = cands[i];
        let prot = prots[(rng.next() % 4) as usize];
        match rng.next() % 4 {
            0 | 1 => {
                let pa = 0x1_0000_0000 + (rng.next() % 4096) * PAGE_SIZE;
                r.mmu.map(root, &run(va, pa, n, prot)).unwrap();
                for k in 0..n {
                    model.insert(va + k * PAGE_SIZE, (pa + k * PAGE_SIZE, prot));
                }
            }
            2 => {
                r.mmu.unmap(root, range(va, n));
                for k in 0..n {
                    model.remove(&(va + k * PAGE_SIZE));
                }
            }
            _ => {
                r.mmu.protect(root, range(va, n), prot).unwrap();
                for k in 0..n {
                    if let Some(e) = model.get_mut(&(va + k * PAGE_SIZE)) {
                        e.1 = prot;
                    }
                }
            }
        }
        if step % 7 == 0 {
            r.mmu.invalidate(root, &[range(va, n)]);
        }
        for &c in &cands {
            let got = r
                .mmu
                .translate(root, VirtAddr::new(c + 0x123))
                .map(|t| (t.pa.as_u64() - 0x123, t.prot));
            assert_eq!(got, model.get(&c).copied(), "step {step}, page {c:#x}");
        }
    }
    // Unmapping everything leaves the root alone; the next invalidation frees the rest.
    for &c in &cands {
        r.mmu.unmap(root, range(c, 1));
    }
    r.mmu.invalidate_all(root);
    assert_eq!(r.mem.outstanding(), 2, "template and root");
    assert_eq!(r.mmu.frames_held(), 2);
    r.mmu.destroy_page_table(root);
    assert_eq!(r.mem.outstanding(), 1, "template");
}

#[test]
fn translation_adds_the_offset_and_reports_the_leaf() {
    let r = rig();
    let root = r.mmu.create_page_table().unwrap();
    r.mmu
        .map(root, &run(0x1234_5000, 0x9_8765_4000, 1, Prot::RW))
        .unwrap();
    let t = r.mmu.translate(root, VirtAddr::new(0x1234_5abc)).unwrap();
    assert_eq!(t.pa, PhysAddr::new(0x9_8765_4abc));
    assert_eq!(t.page_size, PageSize::Size4K);
    assert!(t.flags.contains(PteFlags::A | PteFlags::D | PteFlags::W));
    assert!(!t.flags.intersects(PteFlags::U | PteFlags::G));
    assert_eq!(r.mmu.translate(root, VirtAddr::new(0x1234_6000)), None);
    assert_eq!(r.mmu.translate(root, VirtAddr::new(1 << 38)), None);
}

#[test]
fn user_configuration_sets_the_u_bit() {
    let config = Sv39Config {
        user: true,
        ..Sv39Config::default()
    };
    let r = rig_with(config, &[]).unwrap();
    let root = r.mmu.create_page_table().unwrap();
    r.mmu
        .map(root, &run(0x1000, 0x2000, 1, Prot::READ))
        .unwrap();
    let t = r.mmu.translate(root, VirtAddr::new(0x1000)).unwrap();
    assert!(t.flags.contains(PteFlags::U));
}

// ----- table reclamation -------------------------------------------------------------

#[test]
fn emptied_tables_are_freed_only_after_the_next_invalidation() {
    let r = rig();
    let root = r.mmu.create_page_table().unwrap();
    assert_eq!(r.mem.outstanding(), 2);
    // Two pages in one level-0 table, one page in another 1 GiB slot.
    r.mmu
        .map(root, &run(0x20_0000, 0x5000, 2, Prot::RW))
        .unwrap();
    r.mmu
        .map(root, &run(0x4000_0000, 0x7000, 1, Prot::RW))
        .unwrap();
    assert_eq!(r.mem.outstanding(), 2 + 2 + 2);
    // Unmapping one of two pages frees nothing.
    r.mmu.unmap(root, range(0x20_0000, 1));
    assert_eq!(r.mmu.stats().tables_retired, 0);
    // Unmapping the other empties its level-0 and level-1 tables: retired, not freed.
    r.mmu.unmap(root, range(0x20_1000, 1));
    assert_eq!(r.mmu.stats().tables_retired, 2);
    assert_eq!(r.mem.outstanding(), 6);
    r.mmu.invalidate(root, &[range(0x20_0000, 2)]);
    assert_eq!(r.mem.outstanding(), 4);
    assert_eq!(r.mmu.stats().tables_freed, 2);
    // The other slot's tables are untouched and still translate.
    assert!(r.mmu.translate(root, VirtAddr::new(0x4000_0000)).is_some());
    r.mmu.unmap(root, range(0x4000_0000, 1));
    r.mmu.invalidate(root, &[range(0x4000_0000, 1)]);
    assert_eq!(r.mem.outstanding(), 2);
    // Destroying a table gives back whatever it still holds.
    r.mmu
        .map(root, &run(0x6000_0000, 0x9000, 3, Prot::READ))
        .unwrap();
    r.mmu.destroy_page_table(root);
    assert_eq!(r.mem.outstanding(), 1);
    assert_eq!(r.mmu.frames_held(), 1);
    drop(r.mmu);
    assert_eq!(r.mem.outstanding(), 0);
}

#[test]
fn a_failed_map_leaves_nothing_mapped_and_no_table_behind() {
    let r = rig();
    let root = r.mmu.create_page_table().unwrap();
    // The run crosses a 2 MiB boundary: it needs a level-1 table and two level-0
    // tables; the second level-0 table cannot be had.
    r.mem.budget.store(2, Ordering::Relaxed);
    let va = 0x40_0000 - 2 * PAGE_SIZE;
    let e = r.mmu.map(root, &run(va, 0x10_0000, 4, Prot::RW));
    assert_eq!(e, Err(MmuError::OutOfTableMemory));
    for k in 0..4 {
        assert_eq!(
            r.mmu.translate(root, VirtAddr::new(va + k * PAGE_SIZE)),
            None
        );
    }
    r.mem.budget.store(u64::MAX, Ordering::Relaxed);
    r.mmu.invalidate_all(root);
    assert_eq!(r.mem.outstanding(), 2, "template and root only");
}

// ----- bad input ---------------------------------------------------------------------

#[test]
fn misaligned_or_out_of_range_requests_are_unsupported_and_change_nothing() {
    let r = rig();
    let root = r.mmu.create_page_table().unwrap();
    let held = r.mem.outstanding();
    let unsupported = |va: u64| {
        Err(MmuError::Unsupported {
            va: VirtAddr::new(va),
        })
    };
    let cases = [
        (run(0x1800, 0x2000, 1, Prot::RW), 0x1800), // unaligned va
        (run(0x1000, 0x2800, 1, Prot::RW), 0x1000), // unaligned pa
        (run(1 << 38, 0x2000, 1, Prot::RW), 1 << 38), // beyond 39 bits
        (
            run((1 << 38) - PAGE_SIZE, 0, 2, Prot::RW),
            (1 << 38) - PAGE_SIZE,
        ), // crosses
        (
            run(0xffff_ff80_0000_0000, 0, 1, Prot::RW),
            0xffff_ff80_0000_0000,
        ), // not sign-extended
        (run(0x1000, (1 << 56) - PAGE_SIZE, 2, Prot::RW), 0x1000), // pa beyond 56 bits
        (run(0x1000, 0x2000, 0, Prot::RW), 0x1000), // empty
        (run(0x1000, 0x2000, 1, Prot::empty()), 0x1000), // no permission
    ];
    for (req, va) in cases {
        assert_eq!(r.mmu.map(root, &req), unsupported(va), "{req:?}");
    }
    // A megapage asked for on misaligned frames, or a 1 GiB leaf: refused.
    let mut big = run(0x20_0000, 0x21_0000, 512, Prot::RW);
    big.page_size = PageSize::Size2M;
    assert_eq!(r.mmu.map(root, &big), unsupported(0x20_0000));
    let mut huge = run(0x4000_0000, 0x4000_0000, 512, Prot::RW);
    huge.page_size = PageSize::Size1G;
    assert_eq!(r.mmu.map(root, &huge), unsupported(0x4000_0000));
    assert_eq!(
        r.mmu.protect(root, range(1 << 38, 1), Prot::READ),
        unsupported(1 << 38)
    );
    assert_eq!(
        r.mmu.protect(root, range(0x1000, 1), Prot::empty()),
        unsupported(0x1000)
    );
    // An unknown root is a typed error, and unmap of it is a no-op.
    let stranger = PageTableRoot(0x1234_5000);
    assert_eq!(
        r.mmu.map(stranger, &run(0x1000, 0x2000, 1, Prot::RW)),
        Err(MmuError::Hardware(HW_UNKNOWN_ROOT))
    );
    r.mmu.unmap(stranger, range(0x1000, 1));
    r.mmu.unmap(root, range(1 << 38, 1));
    assert_eq!(r.mem.outstanding(), held);
    assert_eq!(r.mmu.stats().pages_mapped, 0);
    // The upper half is fine.
    r.mmu
        .map(root, &run(0xffff_ffff_ffff_f000, 0x3000, 1, Prot::READ))
        .unwrap();
    let t = r.mmu.translate(root, VirtAddr::new(u64::MAX)).unwrap();
    assert_eq!(t.pa, PhysAddr::new(0x3fff));
}

// ----- invalidation ------------------------------------------------------------------

#[test]
fn invalidations_fence_each_page_up_to_the_threshold_and_everything_above() {
    let config = Sv39Config {
        flush_all_above: 4,
        ..Sv39Config::default()
    };
    let r = rig_with(config, &[]).unwrap();
    let hart = r.mmu.hardware();
    let root = r.mmu.create_page_table().unwrap();
    r.mmu
        .map(root, &run(0x10_0000, 0x10_0000, 16, Prot::RW))
        .unwrap();
    assert_eq!(
        hart.take_log(),
        [Event::Fence(None)],
        "16 pages > 4: full fence"
    );
    r.mmu
        .map(root, &run(0x11_0000, 0x11_0000, 2, Prot::RW))
        .unwrap();
    assert_eq!(
        hart.take_log(),
        [Event::Fence(Some(0x11_0000)), Event::Fence(Some(0x11_1000))],
        "map fences the pages it made valid"
    );
    r.mmu
        .protect(root, range(0x10_0000, 3), Prot::READ)
        .unwrap();
    assert!(
        hart.take_log().is_empty(),
        "protect leaves fencing to invalidate"
    );
    r.mmu
        .invalidate(root, &[range(0x10_0000, 3), range(0x10_8000, 1)]);
    assert_eq!(
        hart.take_log(),
        [
            Event::Fence(Some(0x10_0000)),
            Event::Fence(Some(0x10_1000)),
            Event::Fence(Some(0x10_2000)),
            Event::Fence(Some(0x10_8000)),
        ]
    );
    r.mmu.invalidate(root, &[range(0x10_0000, 5)]);
    assert_eq!(hart.take_log(), [Event::Fence(None)]);
    // A small invalidation after tables were unlinked must still fence everything:
    // per-address fences do not drop cached non-leaf entries.
    r.mmu.unmap(root, range(0x10_0000, 16));
    r.mmu.unmap(root, range(0x11_0000, 2));
    assert!(
        hart.take_log().is_empty(),
        "unmap leaves fencing to invalidate"
    );
    r.mmu.invalidate(root, &[range(0x10_0000, 1)]);
    assert_eq!(hart.take_log(), [Event::Fence(None)]);
    r.mmu.invalidate_all(root);
    assert_eq!(hart.take_log(), [Event::Fence(None)]);
    let s = r.mmu.stats();
    assert_eq!((s.fences_page, s.fences_all), (6, 4));
}

#[test]
fn activation_writes_satp_then_fences_everything() {
    let config = Sv39Config {
        asid: 7,
        ..Sv39Config::default()
    };
    let r = rig_with(config, &[]).unwrap();
    let hart = r.mmu.hardware();
    let root = r.mmu.create_page_table().unwrap();
    r.mmu.activate(Some(root));
    let satp = (8 << 60) | (7 << 44) | (root.0 >> 12);
    assert_eq!(hart.take_log(), [Event::Satp(satp), Event::Fence(None)]);
    // Without global mappings, "nothing" is bare translation.
    r.mmu.activate(None);
    assert_eq!(hart.take_log(), [Event::Satp(0), Event::Fence(None)]);
    // A root the driver does not know is not written.
    r.mmu.activate(Some(PageTableRoot(0x5000)));
    assert!(hart.take_log().is_empty());
}

// ----- several harts -----------------------------------------------------------------

#[test]
fn invalidations_fence_every_hart_that_activated_a_table_and_maps_only_the_caller() {
    let r = rig();
    let hart = r.mmu.hardware();
    let root = r.mmu.create_page_table().unwrap();
    r.mmu.activate(Some(root));
    hart.me.store(2, Ordering::Relaxed);
    r.mmu.activate(Some(root));
    hart.me.store(0, Ordering::Relaxed);
    assert_eq!(r.mmu.harts(), 0b101);
    hart.take_log();
    r.mmu
        .map(root, &run(0x10_0000, 0x10_0000, 2, Prot::RW))
        .unwrap();
    assert_eq!(
        hart.take_log(),
        [Event::Fence(Some(0x10_0000)), Event::Fence(Some(0x10_1000))],
        "map fences the caller only"
    );
    r.mmu
        .protect(root, range(0x10_0000, 2), Prot::READ)
        .unwrap();
    let held = r.mem.outstanding();
    r.mmu.invalidate(root, &[range(0x10_0000, 2)]);
    assert_eq!(
        hart.take_log(),
        [
            Event::Fence(Some(0x10_0000)),
            Event::Fence(Some(0x10_1000)),
            Event::Remote(0b100, Some((0x10_0000, 2 * PAGE_SIZE)), held),
        ],
        "the caller per page, then hart 2 for the range"
    );
    // From hart 2, hart 0 is the other one.
    hart.me.store(2, Ordering::Relaxed);
    let many: Vec<VaRange> = (0..5)
        .map(|k| range(0x10_0000 + k * PAGE_SIZE, 1))
        .collect();
    r.mmu.invalidate(root, &many);
    let log = hart.take_log();
    assert_eq!(
        log.last(),
        Some(&Event::Remote(0b001, None, held)),
        "five ranges: one full remote fence"
    );
    r.mmu.invalidate_all(root);
    assert_eq!(
        hart.take_log(),
        [Event::Fence(None), Event::Remote(0b001, None, held)]
    );
    // Hart 2 switches away: it leaves the set after its own full fence.
    r.mmu.activate(None);
    assert_eq!(r.mmu.harts(), 0b001);
    hart.me.store(0, Ordering::Relaxed);
    hart.take_log();
    r.mmu.invalidate(root, &[range(0x10_0000, 1)]);
    assert_eq!(hart.take_log(), [Event::Fence(Some(0x10_0000))]);
    let s = r.mmu.stats();
    // Full remote fences: hart 2's two activations (with hart 0 in the set), the five
    // ranges, invalidate_all.
    assert_eq!((s.remote_fences_range, s.remote_fences_all), (1, 4));
}

#[test]
fn retired_tables_are_freed_only_after_every_hart_fenced() {
    let r = rig();
    let hart = r.mmu.hardware();
    let root = r.mmu.create_page_table().unwrap();
    r.mmu.activate(Some(root));
    hart.me.store(1, Ordering::Relaxed);
    r.mmu.activate(Some(root));
    hart.me.store(0, Ordering::Relaxed);
    r.mmu
        .map(root, &run(0x20_0000, 0x5000, 1, Prot::RW))
        .unwrap();
    r.mmu.unmap(root, range(0x20_0000, 1));
    assert_eq!(r.mmu.stats().tables_retired, 2);
    let held = r.mem.outstanding();
    hart.take_log();
    r.mmu.invalidate(root, &[range(0x20_0000, 1)]);
    assert_eq!(
        hart.take_log(),
        [Event::Fence(None), Event::Remote(0b10, None, held)],
        "the retired tables are still held when hart 1 is asked to fence"
    );
    assert_eq!(
        r.mem.outstanding(),
        held - 2,
        "and freed after it acknowledged"
    );
}

// ----- global mappings ---------------------------------------------------------------

fn kernel_globals() -> [GlobalMapping; 3] {
    [
        // MMIO: one 1 GiB leaf.
        GlobalMapping::identity(0, 1 << 30, Prot::RW),
        // Kernel image: 2 MiB leaves then 4 KiB leaves.
        GlobalMapping::identity(0x8000_0000, (4 << 20) + 3 * PAGE_SIZE, Prot::RWX),
        // An offset mapping in the upper half.
        GlobalMapping {
            va: VirtAddr::new(0xffff_ffc0_0000_0000),
            pa: PhysAddr::new(0x8000_0000),
            len: 1 << 30,
            prot: Prot::RW,
        },
    ]
}

#[test]
fn global_mappings_use_the_largest_leaves_and_appear_in_every_table() {
    let r = rig_with(Sv39Config::default(), &kernel_globals()).unwrap();
    let a = r.mmu.create_page_table().unwrap();
    let b = r.mmu.create_page_table().unwrap();
    for root in [a, b, r.mmu.template_root()] {
        let t = r.mmu.translate(root, VirtAddr::new(0x1000_0000)).unwrap();
        assert_eq!(
            (t.pa.as_u64(), t.page_size),
            (0x1000_0000, PageSize::Size1G)
        );
        assert!(t.flags.contains(PteFlags::G));
        assert!(!t.flags.contains(PteFlags::U));
        let t = r.mmu.translate(root, VirtAddr::new(0x8020_0010)).unwrap();
        assert_eq!(
            (t.pa.as_u64(), t.page_size),
            (0x8020_0010, PageSize::Size2M)
        );
        assert_eq!(t.prot, Prot::RWX);
        let t = r.mmu.translate(root, VirtAddr::new(0x8040_2000)).unwrap();
        assert_eq!(t.page_size, PageSize::Size4K);
        assert_eq!(r.mmu.translate(root, VirtAddr::new(0x8040_3000)), None);
        let t = r
            .mmu
            .translate(root, VirtAddr::new(0xffff_ffc0_0000_5000))
            .unwrap();
        assert_eq!(t.pa, PhysAddr::new(0x8000_5000));
    }
    // Slots 0, 2 and 256 are the template's: the core's mappings stay out of them.
    assert!(r.mmu.is_global_slot(0) && r.mmu.is_global_slot(2) && r.mmu.is_global_slot(256));
    assert_eq!(
        r.mmu.map(a, &run(0x8100_0000, 0x1000, 1, Prot::RW)),
        Err(MmuError::Unsupported {
            va: VirtAddr::new(0x8100_0000)
        })
    );
    assert_eq!(
        r.mmu.map(a, &run(0x7fff_f000, 0x1000, 2, Prot::RW)),
        Err(MmuError::Unsupported {
            va: VirtAddr::new(0x8000_0000)
        })
    );
    // Unmap and protect over the kernel's slots leave them alone.
    r.mmu.unmap(a, range(0, 1 << 18));
    r.mmu.protect(a, range(0x8000_0000, 4), Prot::READ).unwrap();
    let t = r.mmu.translate(a, VirtAddr::new(0x8000_0000)).unwrap();
    assert_eq!(t.prot, Prot::RWX);
    // The core's own mappings live beside them.
    r.mmu
        .map(a, &run(0x1_0000_0000, 0x8300_0000, 1, Prot::RW))
        .unwrap();
    assert!(r.mmu.translate(b, VirtAddr::new(0x1_0000_0000)).is_none());
    // With no space active, the hart runs on the template.
    r.mmu.activate(Some(a));
    r.mmu.hardware().take_log();
    r.mmu.activate(None);
    assert_eq!(
        r.mmu.hardware().take_log()[0],
        Event::Satp(r.mmu.satp_of(r.mmu.template_root()))
    );
    // Destroying the active table first moves the hart to the template.
    r.mmu.activate(Some(b));
    r.mmu.hardware().take_log();
    r.mmu.destroy_page_table(b);
    assert_eq!(
        r.mmu.hardware().take_log(),
        [
            Event::Satp(r.mmu.satp_of(r.mmu.template_root())),
            Event::Fence(None)
        ]
    );
    // Destroying tables never frees the shared global subtrees.
    r.mmu.unmap(a, range(0x1_0000_0000, 1));
    r.mmu.destroy_page_table(a);
    let t = r
        .mmu
        .translate(r.mmu.template_root(), VirtAddr::new(0x8040_2000));
    assert!(t.is_some());
    drop(r.mmu);
    assert_eq!(
        r.mem.outstanding(),
        0,
        "drop gives back the template's tables"
    );
}

#[test]
fn bad_global_mappings_are_refused_without_leaking_tables() {
    let overlapping = [
        GlobalMapping::identity(0x8000_0000, 4 << 20, Prot::RWX),
        GlobalMapping::identity(0x8020_0000, PAGE_SIZE, Prot::RW),
    ];
    let bad: [&[GlobalMapping]; 4] = [
        &overlapping,
        &[GlobalMapping::identity(0x8000_0800, PAGE_SIZE, Prot::RW)],
        &[GlobalMapping::identity(1 << 38, PAGE_SIZE, Prot::RW)],
        &[GlobalMapping::identity(
            0x8000_0000,
            PAGE_SIZE,
            Prot::empty(),
        )],
    ];
    for globals in bad {
        let mem = TestFrames::new();
        let hart = TestHart::new(mem.clone());
        // SAFETY: the test hart never translates.
        let r = unsafe { Sv39::new(hart, mem.clone(), Sv39Config::default(), globals) };
        assert!(
            matches!(r, Err(MmuError::Unsupported { .. })),
            "{globals:?}"
        );
        assert_eq!(mem.outstanding(), 0);
    }
    let mem = TestFrames::new();
    mem.budget.store(0, Ordering::Relaxed);
    let hart = TestHart::new(mem.clone());
    // SAFETY: as above.
    let r = unsafe { Sv39::new(hart, mem.clone(), Sv39Config::default(), &[]) };
    assert!(matches!(r, Err(MmuError::OutOfTableMemory)));
}

// ----- through the core --------------------------------------------------------------

mod with_core {
    use super::*;
    use gmem_core::{
        AllocPolicy, AllocRequest, DevCaps, DeviceDesc, DeviceMemory, FaultError, FaultKind, Gmem,
        MapFlags, MemError, MmuMode, SingleCpu,
    };

    /// Data memory: 1 MiB at `DATA`.
    struct Ram(Mutex<Vec<u8>>);
    const DATA: u64 = 0x9000_0000;

    impl Ram {
        fn slice(&self, pa: PhysAddr, len: usize) -> Result<core::ops::Range<usize>, MemError> {
            let off = pa
                .as_u64()
                .checked_sub(DATA)
                .ok_or(MemError::OutOfRange { pa })? as usize;
            let n = self.0.lock().len();
            if off + len > n {
                return Err(MemError::OutOfRange { pa });
            }
            Ok(off..off + len)
        }
    }

    impl DeviceMemory for Ram {
        fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
            let r = self.slice(pa, len as usize)?;
            self.0.lock()[r].fill(0);
            Ok(())
        }
        fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
            let r = self.slice(pa, buf.len())?;
            buf.copy_from_slice(&self.0.lock()[r]);
            Ok(())
        }
        fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
            let r = self.slice(pa, buf.len())?;
            self.0.lock()[r].copy_from_slice(buf);
            Ok(())
        }
    }

    #[test]
    fn core_faults_install_real_entries_and_dealloc_frees_them() {
        let mem = TestFrames::new();
        let hart = TestHart::new(mem.clone());
        let globals = [GlobalMapping::identity(0x8000_0000, 1 << 30, Prot::RWX)];
        // SAFETY: the test hart never translates.
        let mmu = Arc::new(
            unsafe { Sv39::new(hart, mem.clone(), Sv39Config::default(), &globals) }.unwrap(),
        );
        let ram = Arc::new(Ram(Mutex::new(std::vec![0xaa; 1 << 20])));
        let gm = Gmem::new(
            Arc::new(SingleCpu),
            DeviceDesc {
                name: "hart0".into(),
                mmu: mmu.clone(),
                memory: Some(ram.clone()),
                caps: DevCaps::FAULTABLE,
                data: None,
            },
        )
        .unwrap();
        let cpu = gm.host();
        gm.dev_register_physmem(cpu, PhysAddr::new(DATA), PhysAddr::new(DATA + (1 << 20)))
            .unwrap();
        let space = gm
            .as_create(
                VirtAddr::new(0x1_0000_0000),
                VirtAddr::new(0x2_0000_0000),
                AllocPolicy::empty(),
            )
            .unwrap();
        gm.as_attach(space, cpu, MmuMode::Coherent, Activation::Switch)
            .unwrap();
        let log = mmu.hardware().take_log();
        let Some(Event::Satp(satp)) = log.first().copied() else {
            panic!("attach did not write satp: {log:?}");
        };
        let root = PageTableRoot((satp & ((1 << 44) - 1)) << 12);
        let region = gm
            .as_alloc(space, AllocRequest::new(8 * PAGE_SIZE))
            .unwrap();
        for k in 0..8 {
            let va = VirtAddr::new(region.start.as_u64() + k * PAGE_SIZE);
            assert_eq!(mmu.translate(root, va), None);
            let access = if k % 2 == 0 { Prot::READ } else { Prot::WRITE };
            let f = gm.dev_fault(cpu, va, access).unwrap();
            assert_eq!(f.kind, FaultKind::ZeroFill);
            let t = mmu.translate(root, va).unwrap();
            assert_eq!(t.prot, Prot::RW);
            let pa = t.pa.as_u64();
            assert!((DATA..DATA + (1 << 20)).contains(&pa));
            let mut page = [0xffu8; 4096];
            ram.read(t.pa, &mut page).unwrap();
            assert!(page.iter().all(|b| *b == 0), "fault zero-filled the frame");
            let fences = mmu.hardware().take_log();
            assert!(
                fences.contains(&Event::Fence(Some(va.as_u64()))),
                "the new entry was fenced: {fences:?}"
            );
        }
        gm.check_invariants(space).unwrap();
        assert_eq!(mmu.stats().pages_mapped, 8);
        let held = mmu.frames_held();
        gm.region_dealloc(region, MapFlags::empty(), None).unwrap();
        assert_eq!(mmu.translate(root, region.start), None);
        assert_eq!(
            mmu.frames_held(),
            held - 2,
            "level-1 and level-0 tables freed"
        );
        assert_eq!(
            gm.dev_fault(cpu, region.start, Prot::READ),
            Err(FaultError::NotAllocated(region.start))
        );
        assert_eq!(gm.dev_frames(cpu).unwrap().free, 256);
        gm.as_destroy(space).unwrap();
        assert_eq!(mmu.frames_held(), 1, "only the template remains");
        assert!(mmu
            .translate(mmu.template_root(), VirtAddr::new(0x8000_0000))
            .is_some());
    }
}
