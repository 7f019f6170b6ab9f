//! The table the host CPU and the near-data SMs share (CODA §4.2, shared mode): x86-64
//! tables whose leaves carry the *granularity bit* of their frame.
//!
//! [`HbmTables`] is a `gmem_sim` table format: every map asks the memory which mode the
//! core gave each frame's page group and writes the bit into the leaf
//! ([`gmem_x86pt::GRANULARITY_BIT`]), so every translation — and every TLB entry that
//! caches it — carries it, and the access path routes each request by the bit of the
//! translation that served it ([`HbmMemory::load`]). A run whose frames change mode
//! part-way (it crosses page groups of both classes) is mapped in pieces.

use crate::decode::Granularity;
use crate::memory::HbmMemory;
use gmem_core::{MapRun, MmuError, PageSizes, PageTableFormat, PageTableRoot, PhysAddr, Prot};
use gmem_core::{VaRange, VirtAddr, PAGE_SIZE};
use gmem_sim::{BoundsError, RadixTables, SimMemory, TableFormat, Tlb, Walk, WalkerId};
use gmem_x86pt::{X86Codec, X86Config, GRANULARITY_BIT};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The format id of the HBM system's shared tables (x86-64 with the granularity bit).
pub const HBM_FORMAT: PageTableFormat = PageTableFormat(0xc0da);

/// x86-64 tables in simulated host memory whose leaves carry each frame's granularity.
pub struct HbmTables {
    tables: RadixTables<X86Codec>,
    memory: Arc<HbmMemory>,
    /// Frames whose leaves get the wrong bit from now on (fault injection, see
    /// [`HbmTables::set_wrong_bit`]).
    wrong: Mutex<HashSet<u64>>,
}

impl HbmTables {
    /// Tables in `host` memory, their frames from `[pool, pool + frames × 4 KiB)`, for
    /// the stacks of `memory`.
    ///
    /// # Errors
    /// The pool does not fit `host`.
    pub fn new(
        host: Arc<SimMemory>,
        pool: PhysAddr,
        frames: u64,
        memory: Arc<HbmMemory>,
    ) -> Result<HbmTables, BoundsError> {
        let codec = X86Codec {
            config: X86Config {
                user: true,
                large_pages: false,
                mesc: false,
                granularity_bit: true,
            },
        };
        Ok(HbmTables {
            tables: RadixTables::new(codec, host, pool, frames)?,
            memory,
            wrong: Mutex::new(HashSet::new()),
        })
    }

    /// The underlying tables.
    pub fn tables(&self) -> &RadixTables<X86Codec> {
        &self.tables
    }

    /// The mode of the frame at `pa`: its page group's in the stacks, fine grain for
    /// any other memory (host memory is not interleaved by CODA).
    fn mode(&self, pa: PhysAddr) -> Granularity {
        let g = self.memory.granularity(pa).unwrap_or(Granularity::Fine);
        let wrong = self
            .wrong
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(pa.as_u64() / PAGE_SIZE));
        match (g, wrong) {
            (Granularity::Fine, true) => Granularity::Coarse,
            (Granularity::Coarse, true) => Granularity::Fine,
            (g, false) => g,
        }
    }

    /// Fault injection: from the next map on, the leaf of frame `pa` carries the
    /// opposite granularity bit to its page group's mode (`wrong = false` undoes it).
    /// The data stay where the core put them, so accesses through such a leaf read
    /// other bytes — the test that the bit is really used.
    pub fn set_wrong_bit(&self, pa: PhysAddr, wrong: bool) {
        let mut w = self.wrong.lock().unwrap_or_else(|e| e.into_inner());
        if wrong {
            w.insert(pa.as_u64() / PAGE_SIZE);
        } else {
            w.remove(&(pa.as_u64() / PAGE_SIZE));
        }
    }
}

/// The granularity a leaf's format bits say.
pub fn granularity_of(bits: u64) -> Granularity {
    if bits & GRANULARITY_BIT != 0 {
        Granularity::Coarse
    } else {
        Granularity::Fine
    }
}

impl TableFormat for HbmTables {
    fn format(&self) -> PageTableFormat {
        HBM_FORMAT
    }
    fn page_sizes(&self) -> PageSizes {
        PageSizes::S4K
    }
    fn create(&self) -> Result<PageTableRoot, MmuError> {
        self.tables.create()
    }
    fn destroy(&self, root: PageTableRoot) {
        self.tables.destroy(root)
    }
    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        let pages = run.len / PAGE_SIZE;
        let mut k = 0;
        while k < pages {
            let pa = PhysAddr::new(run.pa.as_u64() + k * PAGE_SIZE);
            let mode = self.mode(pa);
            let mut n = 1;
            while k + n < pages && self.mode(PhysAddr::new(pa.as_u64() + n * PAGE_SIZE)) == mode {
                n += 1;
            }
            let piece = MapRun {
                va: VirtAddr::new(run.va.as_u64() + k * PAGE_SIZE),
                pa,
                len: n * PAGE_SIZE,
                ..*run
            };
            let bits = match mode {
                Granularity::Coarse => GRANULARITY_BIT,
                Granularity::Fine => 0,
            };
            if let Err(e) = self.tables.map_with_bits(root, &piece, bits) {
                // Nothing of the run may stay mapped.
                if k > 0 {
                    self.tables.unmap(
                        root,
                        VaRange {
                            start: run.va,
                            len: k * PAGE_SIZE,
                        },
                    );
                }
                return Err(e);
            }
            k += n;
        }
        Ok(())
    }
    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        self.tables.unmap(root, range)
    }
    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        self.tables.protect(root, range, prot)
    }
    fn test_and_clear_accessed(&self, root: PageTableRoot, range: VaRange) -> Option<bool> {
        self.tables.test_and_clear_accessed(root, range)
    }
    fn walk(
        &self,
        root: PageTableRoot,
        va: VirtAddr,
        access: Prot,
        cache: Option<&mut Tlb<u64>>,
    ) -> Walk {
        self.tables.walk(root, va, access, cache)
    }
    fn new_walker(&self) -> WalkerId {
        self.tables.new_walker()
    }
    fn walker_activated(&self, walker: WalkerId, root: Option<PageTableRoot>) {
        self.tables.walker_activated(walker, root)
    }
    fn walker_invalidated(&self, walker: WalkerId, root: PageTableRoot) {
        self.tables.walker_invalidated(walker, root)
    }
}
