//! The block-sequential executor: a kernel launch is a grid of thread blocks, each a
//! closure over a [`Ctx`] through which it loads and stores (one call = one coalesced
//! request of contiguous bytes; a gather is one call per element). Blocks run one
//! after another on the SM the schedule gives them — order does not change traffic.
//! Per launch it counts, for every SM, the thread operations its blocks did (words
//! loaded and stored, arithmetic reported with [`Ctx::alu`]), their line accesses
//! served by the data caches and the bytes of the local and remote transactions that
//! missed them: what the cost model prices ([`crate::cost`]). An SM's accesses go
//! through its L1 and its stack's L2 ([`crate::dcache`]), which decide what is traffic
//! (the bytes always move through memory); each launch ends with the caches flushed
//! (a kernel boundary). These counts are tallied as the accesses happen, not by
//! snapshotting the memory's counters around each block; the host's blocks, uncached,
//! still take a snapshot each (a host window is priced per stack).
//!
//! Schedules (§4.3.1): round robin over all SMs (a baseline GPU's), or *affinity*:
//! block `b` runs in stack `(b / blocks_per_stack) mod stacks`, the stack that CODA's
//! placement gives the chunk of data the block indexes; no work stealing, as in the
//! paper. The same executor runs the work on the host instead (host-side execution),
//! pricing each block's accesses as one window of host traffic.
//!
//! While running, it records what the experiment reports: traffic per launch and
//! stack, pages by number of thread blocks touching them (the paper's Fig. 3), the
//! stack of the first SM touching each page (the first-touch oracle's input), and,
//! with first-touch migration on, moves each page to the stack of the first SM that
//! touches it ([`HbmMachine::migrate_page`]).

use crate::config::HbmConfig;
use crate::cost::{binding, delta, host_window_ns, sm_time_ns, total, Bound, SmLoad};
use crate::dcache::{CacheStats, DataCaches, Served};
use crate::decode::Granularity;
use crate::machine::{HbmMachine, MachineError};
use crate::memory::{Requester, Traffic, CHUNK};
use gmem_core::{PhysAddr, Region, PAGE_SIZE};
use std::collections::{BTreeMap, HashMap};
use std::vec::Vec;

/// Consecutive thread blocks that one stack runs under affinity scheduling (Eq. 1):
/// its SMs × the blocks each holds, from the occupancy calculator
/// ([`HbmConfig::blocks_per_stack`]; before issue 33 a hard-coded 4 × 2 = 8).
pub fn blocks_per_stack(cfg: &HbmConfig) -> u64 {
    cfg.blocks_per_stack()
}

/// Where thread blocks go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Block `b` in stack `b mod stacks` (SM `(b / stacks) mod sms_per_stack` there):
    /// a location-oblivious dispatcher over SMs numbered across the stacks. (Numbering
    /// them stack by stack instead would line block `b` up with coarse page `b / 4`
    /// whenever four 1 KiB blocks fill a page and a stack has four SMs — a coincidence
    /// of sizes, not a policy.)
    RoundRobin,
    /// Block `b` in stack `(b / blocks_per_stack) mod stacks`.
    Affinity,
    /// Every block on the host CPU.
    Host,
}

impl Schedule {
    /// Who runs block `b`.
    pub fn runner(self, cfg: &HbmConfig, b: u64) -> Requester {
        let sms = u64::from(cfg.sms());
        match self {
            Schedule::RoundRobin => {
                let n = u64::from(cfg.stacks);
                let sm =
                    (b % n) * u64::from(cfg.sms_per_stack) + (b / n) % u64::from(cfg.sms_per_stack);
                Requester::Sm((sm % sms) as u32)
            }
            Schedule::Affinity => {
                let bps = blocks_per_stack(cfg);
                let stack = (b / bps) % u64::from(cfg.stacks);
                let sm =
                    stack * u64::from(cfg.sms_per_stack) + (b % bps) % u64::from(cfg.sms_per_stack);
                Requester::Sm(sm as u32)
            }
            Schedule::Host => Requester::Host,
        }
    }
}

/// What an [`Exec`] does besides running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecOptions {
    /// The schedule.
    pub schedule: Schedule,
    /// Move each page to the stack of the first SM touching it (first-touch migration).
    pub migrate_on_first_touch: bool,
    /// Record `(block, address)` of every access (a profile for another input's
    /// placement).
    pub profile: bool,
}

/// What the executor knows of one page: the blocks and stacks touching it.
#[derive(Clone, Copy)]
struct PageRecord {
    /// The launch the per-launch counts below belong to.
    launch: u32,
    /// The last block that touched the page in that launch.
    last_block: u64,
    /// Distinct blocks touching it in that launch, and the most in any launch.
    blocks: u32,
    most_blocks: u32,
    /// The stacks of that launch's SMs touching it, as a bit mask (machines of at most
    /// 64 stacks, the mask's width), and the most stacks in any launch (0: no SM of
    /// such a stack ever touched it).
    stacks: u64,
    most_stacks: u32,
    /// The stack of the first SM touching it.
    first_stack: Option<u32>,
}

impl PageRecord {
    fn new(launch: u32) -> PageRecord {
        PageRecord {
            launch,
            last_block: u64::MAX,
            blocks: 0,
            most_blocks: 0,
            stacks: 0,
            most_stacks: 0,
            first_stack: None,
        }
    }
}

#[derive(Default)]
struct Record {
    /// Per page touched, one entry (one hash probe per page an access covers).
    pages: HashMap<u64, PageRecord>,
    migrations: u64,
    migrations_fine: u64,
    samples: Vec<(u64, u64)>,
}

/// A thread block's view of the machine.
pub struct Ctx<'a> {
    m: &'a HbmMachine,
    who: Requester,
    block: u64,
    launch: u32,
    opts: ExecOptions,
    objects: &'a BTreeMap<u64, (u64, Region)>,
    rec: &'a mut Record,
    caches: &'a mut DataCaches,
    /// What the block did so far (an SM's block; the host's counts only `thread_ops`).
    load: SmLoad,
}

impl Ctx<'_> {
    /// The block's index.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// Who runs the block.
    pub fn runner(&self) -> Requester {
        self.who
    }

    fn note(&mut self, va: u64, len: u64) -> Result<(), MachineError> {
        let cfg = *self.m.config();
        if self.opts.profile {
            self.rec.samples.push((self.block, va));
        }
        let first = va / PAGE_SIZE;
        let last = (va + len.max(1) - 1) / PAGE_SIZE;
        for page in first..=last {
            let e = self
                .rec
                .pages
                .entry(page)
                .or_insert_with(|| PageRecord::new(self.launch));
            if e.launch != self.launch {
                e.launch = self.launch;
                e.last_block = u64::MAX;
                e.blocks = 0;
                e.stacks = 0;
            }
            if e.last_block != self.block {
                e.last_block = self.block;
                e.blocks += 1;
                e.most_blocks = e.most_blocks.max(e.blocks);
            }
            let Requester::Sm(sm) = self.who else {
                continue;
            };
            let stack = cfg.stack_of_sm(sm);
            if stack < 64 {
                e.stacks |= 1 << stack;
                e.most_stacks = e.most_stacks.max(e.stacks.count_ones());
            }
            if e.first_stack.is_some() {
                continue;
            }
            e.first_stack = Some(stack);
            if !self.opts.migrate_on_first_touch {
                continue;
            }
            let at = page * PAGE_SIZE;
            let here = self.m.placement_of(at);
            if here == Some((Granularity::Coarse, stack)) || here.is_none() {
                continue;
            }
            let Some((&start, &(len, region))) = self.objects.range(..=at).next_back() else {
                continue;
            };
            if at >= start + len {
                continue;
            }
            if let Some(frame) = self.m.frame(at) {
                let _ = self
                    .caches
                    .evict_page(self.m.memory(), frame)
                    .map_err(MachineError::Memory)?;
            }
            let before = self.m.memory().traffic();
            let landed = self.m.migrate_page(region, self.who, at, stack)?;
            let after = self.m.memory().traffic();
            self.load.local += after.local - before.local;
            self.load.remote += after.remote - before.remote;
            self.rec.migrations += 1;
            if landed.map(|l| l.0) == Some(Granularity::Fine) {
                self.rec.migrations_fine += 1;
            }
        }
        Ok(())
    }

    /// Report `n` thread-level arithmetic instructions the block just did (the cost
    /// model's issue time counts them with the words loaded and stored). A
    /// multiply-add is one instruction (Fermi's FFMA), as on the hardware.
    pub fn alu(&mut self, n: u64) {
        self.load.thread_ops += n;
    }

    /// Report `n` thread-level reads of words the block already loaded and holds on
    /// chip (a tile in shared memory, a broadcast operand): each is a load
    /// instruction a thread issues, without a memory transaction. The words loaded
    /// from memory count once each, when loaded; a kernel whose threads read every
    /// word of a tile (SGEMM's row and column, a stencil's neighbours, k-means'
    /// centroids) reports those reads here so the issue time sees them.
    pub fn reads(&mut self, n: u64) {
        self.load.thread_ops += n;
    }

    /// Read `buf.len()` bytes at `va`: an SM's through its caches, the host's directly.
    fn read(&mut self, va: u64, buf: &mut [u8]) -> Result<(), MachineError> {
        let Requester::Sm(sm) = self.who else {
            return self.m.load(self.who, va, buf);
        };
        let mem = self.m.memory();
        let (caches, load) = (&mut *self.caches, &mut self.load);
        self.m.load_via(self.who, va, buf, |pa, g, n| {
            let first = pa.as_u64() / CHUNK;
            let last = (pa.as_u64() + n - 1) / CHUNK;
            for line in first..=last {
                tally(load, caches.load(mem, sm, PhysAddr::new(line * CHUNK), g)?);
            }
            Ok(())
        })
    }

    /// Write `data` at `va`: an SM's through its caches, the host's directly.
    fn write(&mut self, va: u64, data: &[u8]) -> Result<(), MachineError> {
        let Requester::Sm(sm) = self.who else {
            return self.m.store(self.who, va, data);
        };
        let mem = self.m.memory();
        let (caches, load) = (&mut *self.caches, &mut self.load);
        self.m.store_via(self.who, va, data, |pa, g, n| {
            let (start, end) = (pa.as_u64(), pa.as_u64() + n);
            let mut at = start;
            while at < end {
                let to = ((at / CHUNK + 1) * CHUNK).min(end);
                tally(load, caches.store(mem, sm, PhysAddr::new(at), to - at, g)?);
                at = to;
            }
            Ok(())
        })
    }

    /// Load `n` words at `va`.
    ///
    /// # Errors
    /// As [`HbmMachine::load`].
    pub fn load_u32s(&mut self, va: u64, n: usize) -> Result<Vec<u32>, MachineError> {
        self.load.thread_ops += n as u64;
        self.note(va, n as u64 * 4)?;
        let mut b = std::vec![0u8; n * 4];
        self.read(va, &mut b)?;
        Ok(b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Load one word at `va`.
    ///
    /// # Errors
    /// As [`HbmMachine::load`].
    pub fn load_u32(&mut self, va: u64) -> Result<u32, MachineError> {
        Ok(self.load_u32s(va, 1)?[0])
    }

    /// Store words at `va`.
    ///
    /// # Errors
    /// As [`HbmMachine::store`].
    pub fn store_u32s(&mut self, va: u64, w: &[u32]) -> Result<(), MachineError> {
        self.load.thread_ops += w.len() as u64;
        self.note(va, w.len() as u64 * 4)?;
        let b: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.write(va, &b)
    }

    /// Load `n` floats at `va`.
    ///
    /// # Errors
    /// As [`HbmMachine::load`].
    pub fn load_f32s(&mut self, va: u64, n: usize) -> Result<Vec<f32>, MachineError> {
        Ok(self
            .load_u32s(va, n)?
            .into_iter()
            .map(f32::from_bits)
            .collect())
    }

    /// Load one float at `va`.
    ///
    /// # Errors
    /// As [`HbmMachine::load`].
    pub fn load_f32(&mut self, va: u64) -> Result<f32, MachineError> {
        Ok(self.load_f32s(va, 1)?[0])
    }

    /// Store floats at `va`.
    ///
    /// # Errors
    /// As [`HbmMachine::store`].
    pub fn store_f32s(&mut self, va: u64, v: &[f32]) -> Result<(), MachineError> {
        let w: Vec<u32> = v.iter().map(|x| x.to_bits()).collect();
        self.store_u32s(va, &w)
    }
}

/// Add what the caches made of one line access to a block's counts.
fn tally(load: &mut SmLoad, served: Served) {
    match served {
        Served::L1 => load.l1_hits += 1,
        Served::L2 => load.l2_hits += 1,
        Served::Memory(t) => {
            load.local += t.local;
            load.remote += t.remote;
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExecReport {
    /// Traffic of each launch by stack (near-data runs).
    pub launches: Vec<Vec<Traffic>>,
    /// What each SM did in each launch (near-data runs; indexed by SM).
    pub sm_loads: Vec<Vec<SmLoad>>,
    /// Modelled time of the host-side run, ns (0 for near-data runs).
    pub host_ns: f64,
    /// Pages by the most distinct thread blocks of one launch touching them:
    /// `histogram[k]` pages touched by `k` blocks (`k` ≥ 1).
    pub blocks_per_page: BTreeMap<u32, u64>,
    /// Pages touched by the SMs, by the most distinct stacks (of the SMs touching them
    /// in one launch): `histogram[k]` pages touched from `k` stacks. With
    /// [`ExecReport::blocks_per_page`] this is what CODA §6 classifies a benchmark by
    /// (block-exclusive, core-exclusive, ...). Empty on a machine of more than 64
    /// stacks.
    pub stacks_per_page: BTreeMap<u32, u64>,
    /// Per page number: the stack of the first SM touching it.
    pub first_stack: HashMap<u64, u32>,
    /// Pages moved by first-touch migration.
    pub migrations: u64,
    /// Of those, pages that found no coarse slot in their stack and went fine grain.
    pub migrations_fine: u64,
    /// `(block, address)` of every access, when profiling.
    pub samples: Vec<(u64, u64)>,
    /// The SMs' data caches' counters over the run.
    pub cache: CacheStats,
}

impl ExecReport {
    /// All traffic of the run.
    pub fn traffic(&self) -> Traffic {
        let per: Vec<Traffic> = self.launches.iter().map(|l| total(l)).collect();
        total(&per)
    }

    /// The modelled time under `cfg`'s cost model, ns (launches one after another).
    pub fn time_ns(&self, cfg: &HbmConfig) -> f64 {
        if self.host_ns > 0.0 {
            return self.host_ns;
        }
        self.launches
            .iter()
            .zip(&self.sm_loads)
            .map(|(l, s)| sm_time_ns(cfg, l, s))
            .sum()
    }
}

impl ExecReport {
    /// The modelled time under `cfg` split by the bound that set each launch's time,
    /// ns, in [`Bound::ALL`] order (host-side runs: all zero).
    pub fn time_by_bound(&self, cfg: &HbmConfig) -> [f64; 4] {
        let mut by = [0.0; 4];
        if self.host_ns > 0.0 {
            return by;
        }
        for (l, s) in self.launches.iter().zip(&self.sm_loads) {
            let (b, t): (Bound, f64) = binding(cfg, l, s);
            by[b.index()] += t;
        }
        by
    }
}

/// Runs launches on a machine and records them.
pub struct Exec<'m> {
    m: &'m HbmMachine,
    opts: ExecOptions,
    objects: BTreeMap<u64, (u64, Region)>,
    rec: Record,
    caches: DataCaches,
    report: ExecReport,
}

impl<'m> Exec<'m> {
    /// An executor over `m` whose objects (for migration) are `(region, bytes)`, with
    /// empty data caches of `m`'s [`crate::config::CacheModel`].
    ///
    /// # Errors
    /// [`MachineError::Config`] if the cache geometry is refused.
    pub fn new(
        m: &'m HbmMachine,
        opts: ExecOptions,
        objects: &[(Region, u64)],
    ) -> Result<Exec<'m>, MachineError> {
        let caches = DataCaches::new(m.config()).map_err(MachineError::Config)?;
        Ok(Exec {
            m,
            opts,
            objects: objects
                .iter()
                .map(|&(r, len)| (r.start.as_u64(), (len, r)))
                .collect(),
            rec: Record::default(),
            caches,
            report: ExecReport::default(),
        })
    }

    /// The machine.
    pub fn machine(&self) -> &'m HbmMachine {
        self.m
    }

    /// Run a grid of `blocks` thread blocks, block `b` being `f(ctx)`.
    ///
    /// # Errors
    /// The first [`MachineError`] a block returns (the launch stops there).
    pub fn launch(
        &mut self,
        blocks: u64,
        mut f: impl FnMut(&mut Ctx<'_>) -> Result<(), MachineError>,
    ) -> Result<(), MachineError> {
        let cfg = *self.m.config();
        let mem = self.m.memory();
        let start = mem.traffic_by_stack();
        let launch = self.report.launches.len() as u32;
        let mut sms = std::vec![SmLoad::default(); cfg.sms() as usize];
        for b in 0..blocks {
            let who = self.opts.schedule.runner(&cfg, b);
            let before = (who == Requester::Host).then(|| mem.traffic_by_stack());
            let mut ctx = Ctx {
                m: self.m,
                who,
                block: b,
                launch,
                opts: self.opts,
                objects: &self.objects,
                rec: &mut self.rec,
                caches: &mut self.caches,
                load: SmLoad::default(),
            };
            f(&mut ctx)?;
            let done = ctx.load;
            match (who, before) {
                (Requester::Host, Some(before)) => {
                    let block = delta(&mem.traffic_by_stack(), &before);
                    self.report.host_ns += host_window_ns(&cfg, &block);
                }
                (Requester::Sm(sm), _) => {
                    if let Some(l) = sms.get_mut(sm as usize) {
                        l.thread_ops += done.thread_ops;
                        l.local += done.local;
                        l.remote += done.remote;
                        l.l1_hits += done.l1_hits;
                        l.l2_hits += done.l2_hits;
                    }
                }
                (Requester::Host, None) => {}
            }
        }
        // The kernel boundary: dirty lines go home (the launch's traffic), caches empty.
        let _ = self.caches.flush(mem).map_err(MachineError::Memory)?;
        self.report
            .launches
            .push(delta(&mem.traffic_by_stack(), &start));
        self.report.sm_loads.push(sms);
        Ok(())
    }

    /// The record of the run.
    pub fn finish(mut self) -> ExecReport {
        let report = &mut self.report;
        for (&page, r) in &self.rec.pages {
            *report.blocks_per_page.entry(r.most_blocks).or_insert(0) += 1;
            if r.most_stacks > 0 {
                *report.stacks_per_page.entry(r.most_stacks).or_insert(0) += 1;
            }
            if let Some(stack) = r.first_stack {
                report.first_stack.insert(page, stack);
            }
        }
        self.report.migrations = self.rec.migrations;
        self.report.migrations_fine = self.rec.migrations_fine;
        self.report.samples = self.rec.samples;
        self.report.cache = self.caches.stats();
        self.report
    }
}
