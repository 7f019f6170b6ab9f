//! The `page_table` runner: a driver page table (the x86-64 format in simulated memory,
//! shared by the host CPU, the integrated GPU and the IOMMU) driven by map, unmap,
//! protect and walk operations against a model — a map from virtual page to
//! (frame, protection).
//!
//! After every operation the tables must agree with the model leaf by leaf (large
//! leaves expanded to 4 KiB pages) and walk by walk; a rejected map (a non-canonical
//! range, or a table pool too small for the run) must leave nothing of its run mapped.
//! At the end, unmapping everything must free every table but the root.

use arbitrary::Arbitrary;
use gmem_core::{
    DeviceId, MapRun, MmuError, PageSize, PageTableRoot, PhysAddr, Prot, VaRange, VirtAddr,
    PAGE_SIZE,
};
use gmem_sim::{RadixTables, SimMemory, TableFormat};
use gmem_x86pt::{X86Codec, X86Config};

type X86Tables = RadixTables<X86Codec>;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Most operations one run applies.
pub const MAX_OPS: usize = 200;

/// Windows of virtual space the operations fall in: they straddle table boundaries at
/// every level, and one is in the upper (kernel) half.
const WINDOWS: [u64; 3] = [0x3fe0_0000, 0x7f_ffe0_0000, 0xffff_8000_0000_0000];
const POOL_BASE: u64 = 0x10_0000;
const PROTS: [Prot; 4] = [
    Prot::READ,
    Prot::RW,
    Prot::RWX,
    Prot::from_bits_truncate(0b101),
];

/// How the tables are built.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct PtConfig {
    /// 2 MiB leaves where a run allows.
    pub large_pages: bool,
    /// Table-pool frames (small pools make maps fail for lack of table memory).
    pub pool_frames: u8,
    /// Keep MESC's contiguity bits; after every operation they must equal a
    /// recomputation from the leaves (Alg. 1 finds nothing stale).
    pub mesc: bool,
}

/// One operation.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum PtOp {
    /// Map `pages` pages at `page` of window `window` onto frames at `frame` (2 MiB
    /// aligned in the same phase when `aligned`, so large leaves happen).
    Map {
        window: u8,
        page: u16,
        pages: u16,
        frame: u16,
        aligned: bool,
        prot: u8,
    },
    /// Unmap a range.
    Unmap { window: u8, page: u16, pages: u16 },
    /// Change the protection of a range.
    Protect {
        window: u8,
        page: u16,
        pages: u16,
        prot: u8,
    },
    /// Walk one address and compare with the model.
    Walk { window: u8, page: u16, offset: u16 },
    /// Try to map a range that crosses out of the canonical lower half (must fail).
    NonCanonical { pages: u8 },
}

/// Runs operations against the model.
pub struct PtRunner {
    tables: X86Tables,
    root: PageTableRoot,
    model: BTreeMap<u64, (u64, Prot)>,
    device: DeviceId,
}

fn va_of(window: u8, page: u16) -> u64 {
    WINDOWS[window as usize % WINDOWS.len()] + (page as u64 % 2048) * PAGE_SIZE
}

fn pages_of(pages: u16) -> u64 {
    1 + pages as u64 % 600
}

fn range(va: u64, pages: u64) -> VaRange {
    VaRange::new(VirtAddr::new(va), pages * PAGE_SIZE).expect("windows keep ranges valid")
}

impl PtRunner {
    /// Fresh tables in 64 MiB of simulated memory.
    pub fn new(config: PtConfig) -> PtRunner {
        let memory =
            Arc::new(SimMemory::new("host", PhysAddr::new(0), 64 << 20).expect("valid memory"));
        let x86 = X86Config {
            user: true,
            large_pages: config.large_pages,
            mesc: config.mesc,
        };
        let frames = 4 + config.pool_frames as u64;
        let tables = X86Tables::new(
            X86Codec { config: x86 },
            memory,
            PhysAddr::new(POOL_BASE),
            frames,
        )
        .expect("pool fits");
        let root = tables.create().expect("a pool of 4+ frames holds a root");
        PtRunner {
            tables,
            root,
            model: BTreeMap::new(),
            device: DeviceId::from_raw(0, 1),
        }
    }

    fn leaves(&self) -> BTreeMap<u64, (u64, Prot)> {
        let mut m = BTreeMap::new();
        for (va, leaf) in self.tables.leaves(self.root) {
            for k in 0..1u64 << (leaf.shift - 12) {
                m.insert(
                    (va.as_u64() >> 12) + k,
                    ((leaf.frame.as_u64() >> 12) + k, leaf.prot),
                );
            }
        }
        m
    }

    fn walk(&self, va: u64) -> Option<(u64, Prot)> {
        self.tables
            .lookup(self.root, VirtAddr::new(va))
            .map(|l| (l.translate(VirtAddr::new(va)).as_u64() >> 12, l.prot))
    }

    /// Apply `op` and check the tables against the model.
    pub fn step(&mut self, i: usize, op: PtOp) {
        match op {
            PtOp::Map {
                window,
                page,
                pages,
                frame,
                aligned,
                prot,
            } => {
                let va = va_of(window, page);
                let pages = pages_of(pages);
                let pa = if aligned {
                    (8 + frame as u64 % 8) << 21 | (va & 0x1f_f000)
                } else {
                    (16 << 20) + (frame as u64 % 4096) * PAGE_SIZE
                };
                let prot = PROTS[prot as usize % PROTS.len()];
                let run = MapRun {
                    va: VirtAddr::new(va),
                    pa: PhysAddr::new(pa),
                    len: pages * PAGE_SIZE,
                    prot,
                    page_size: PageSize::Size4K,
                    memory: self.device,
                    attrs: Default::default(),
                };
                match self.tables.map(self.root, &run) {
                    Ok(()) => {
                        for k in 0..pages {
                            self.model.insert((va >> 12) + k, ((pa >> 12) + k, prot));
                        }
                    }
                    // The contract: nothing of a failed run stays mapped. The core never
                    // maps over a live mapping, so what became of older mappings in the
                    // range is the driver's choice: the model takes the tables' word for
                    // those pages, but none may translate to the run's frames.
                    Err(MmuError::OutOfTableMemory) => {
                        for k in 0..pages {
                            let vpn = (va >> 12) + k;
                            let got = self.walk(vpn << 12);
                            let had = self.model.get(&vpn).copied();
                            assert!(got == had || got.is_none(), "op {i} {op:?}: page {vpn:#x} of a failed run maps {got:?} (was {had:?})");
                            if got.is_none() {
                                self.model.remove(&vpn);
                            }
                        }
                    }
                    Err(e) => panic!("op {i} {op:?}: map failed with {e:?}"),
                }
            }
            PtOp::Unmap {
                window,
                page,
                pages,
            } => {
                let (va, pages) = (va_of(window, page), pages_of(pages));
                self.tables.unmap(self.root, range(va, pages));
                for k in 0..pages {
                    self.model.remove(&((va >> 12) + k));
                }
            }
            PtOp::Protect {
                window,
                page,
                pages,
                prot,
            } => {
                let (va, pages) = (va_of(window, page), pages_of(pages));
                let prot = PROTS[prot as usize % PROTS.len()];
                match self.tables.protect(self.root, range(va, pages), prot) {
                    Ok(()) => {
                        for k in 0..pages {
                            if let Some(e) = self.model.get_mut(&((va >> 12) + k)) {
                                e.1 = prot;
                            }
                        }
                    }
                    // Splitting a large leaf may need a table frame; a refused protect
                    // changes nothing.
                    Err(MmuError::OutOfTableMemory) => {}
                    Err(e) => panic!("op {i} {op:?}: protect failed with {e:?}"),
                }
            }
            PtOp::Walk {
                window,
                page,
                offset,
            } => {
                let va = va_of(window, page) + offset as u64 % PAGE_SIZE;
                assert_eq!(
                    self.walk(va),
                    self.model.get(&(va >> 12)).copied(),
                    "op {i}: walk of {va:#x}"
                );
            }
            PtOp::NonCanonical { pages } => {
                let pages = 1 + pages as u64 % 8;
                let va = (1u64 << 47) - PAGE_SIZE;
                let run = MapRun {
                    va: VirtAddr::new(va),
                    pa: PhysAddr::new(16 << 20),
                    len: pages * PAGE_SIZE,
                    prot: Prot::RW,
                    page_size: PageSize::Size4K,
                    memory: self.device,
                    attrs: Default::default(),
                };
                match self.tables.map(self.root, &run) {
                    Err(MmuError::Unsupported { .. }) if pages > 1 => {}
                    Ok(()) if pages == 1 => {
                        self.model.insert(va >> 12, (16 << 8, Prot::RW));
                    }
                    Err(MmuError::OutOfTableMemory) if pages == 1 => {}
                    other => panic!(
                        "op {i} {op:?}: a map of {pages} pages ending past 2^47 gave {other:?}"
                    ),
                }
            }
        }
        // The op's own range walk by walk after every op; every table leaf against the
        // whole model every 8th op (and at the end of a run).
        if let PtOp::Map {
            window,
            page,
            pages,
            ..
        }
        | PtOp::Unmap {
            window,
            page,
            pages,
        }
        | PtOp::Protect {
            window,
            page,
            pages,
            ..
        } = op
        {
            let va = va_of(window, page);
            for k in 0..pages_of(pages) {
                let vpn = (va >> 12) + k;
                assert_eq!(
                    self.walk(vpn << 12),
                    self.model.get(&vpn).copied(),
                    "op {i} {op:?}: walk of page {vpn:#x}"
                );
            }
        }
        if i % 8 == 7 {
            self.check_all(i, op);
        }
        if self.tables.codec().config.mesc {
            let scan = gmem_x86pt::mesc::scan(
                self.tables.codec(),
                self.tables.engine().memory(),
                self.root.0,
                false,
            );
            assert_eq!(
                scan.stale, 0,
                "op {i} {op:?}: MESC bits differ from the leaves ({scan:?})"
            );
        }
    }

    /// Every leaf of the tables against the whole model.
    fn check_all(&self, i: usize, op: PtOp) {
        let leaves = self.leaves();
        if leaves != self.model {
            let keys: std::collections::BTreeSet<u64> =
                leaves.keys().chain(self.model.keys()).copied().collect();
            let diff: Vec<String> = keys
                .into_iter()
                .filter(|k| leaves.get(k) != self.model.get(k))
                .take(4)
                .map(|k| {
                    format!(
                        "vpn {k:#x}: tables {:?}, model {:?}",
                        leaves.get(&k),
                        self.model.get(&k)
                    )
                })
                .collect();
            panic!(
                "op {i} {op:?}: tables ({} pages) and model ({} pages) disagree: {}",
                leaves.len(),
                self.model.len(),
                diff.join("; ")
            );
        }
    }

    /// Run `ops`, then unmap everything and check that only the root is left.
    pub fn run(mut self, ops: &[PtOp]) -> crate::Summary {
        for (i, op) in ops.iter().enumerate() {
            self.step(i, *op);
        }
        if let Some(last) = ops.last() {
            self.check_all(ops.len() - 1, *last);
        }
        for w in WINDOWS {
            self.tables.unmap(self.root, range(w, 4096));
        }
        self.tables
            .unmap(self.root, range((1 << 47) - PAGE_SIZE, 1));
        assert!(
            self.tables.leaves(self.root).is_empty(),
            "leaves left after unmapping everything"
        );
        assert_eq!(
            self.tables.stats().tables_in_use,
            1,
            "emptied tables were not freed"
        );
        self.tables.destroy(self.root);
        assert_eq!(
            self.tables.pool().stats().in_use,
            0,
            "the root was not freed"
        );
        crate::Summary {
            ops: ops.len() as u64,
            succeeded: self.model.len() as u64,
            ..Default::default()
        }
    }
}
