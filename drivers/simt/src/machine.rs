//! The machine workloads run on: a host CPU and a GPU sharing one gmem address space.
//!
//! Two GPUs: the integrated GPU of the MESC paper's setting (16 CUs walking the CPU's
//! x86-64 tables in host memory: shared mode, so data the host initialised is already
//! mapped for it) and the discrete GPU (its own tables in video memory; data faults over
//! and migrates on first touch). Both get the MESC paper's TLB geometry (Table I):
//! a 32-entry fully associative L1 TLB per CU, a 512-entry 16-way shared TLB, and an
//! 8 KiB page-walk cache (1024 eight-byte entries, 64 × 16). Data is allocated with
//! `Gmem::as_alloc` and written by the host CPU through its own MMU. Either GPU can
//! take a pluggable cache organisation instead ([`SimtMachine::integrated_with`],
//! [`SimtMachine::discrete_with`]: the MESC designs of [`crate::mesc`]).

use crate::caches::{DesignStats, GpuCaches, Plugged};
use crate::cost::CostModel;
use crate::dispatch::{Dispatch, LooseRoundRobin, RoundRobin, WarpScheduler};
use crate::engine::{run, AccessObserver, Device, Launch, RunStats, SimtError, SpareWakes};
use crate::kernel::{Kernel, WarpIo};
use crate::mesc::X86Tables;
use crate::occupancy::{OccupancyModel, SmConfig};
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, Gmem, MmuMode, Region, SpaceId, VirtAddr, PAGE_SIZE,
};
use gmem_core::{DevCaps, DeviceDesc};
use gmem_dgpu::{Dgpu, DgpuConfig, DgpuError, GpuTables};
use gmem_host_cpu::{HostCpu, HostCpuConfig};
use gmem_igpu::Igpu;
use gmem_sim::{
    HierarchyConfig, MmuStats, Port, Replacement, SimMmu, TlbConfig, TlbStats, TraceLog, Translator,
};
use gmem_x86pt::X86Config;
use std::sync::{Arc, Mutex};

/// Which GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuKind {
    /// Integrated, walking the CPU's table (shared mode).
    Integrated,
    /// Discrete, with this many pages of video memory.
    Discrete {
        /// Pages of video memory for data.
        pages: u64,
    },
}

/// The MESC paper's translation caches (Table I) for `cus` compute units.
pub fn mesc_tlbs(cus: usize) -> HierarchyConfig {
    HierarchyConfig {
        units: cus,
        l1: TlbConfig::new(1, 32, Replacement::Lru),
        l2: Some(TlbConfig::new(32, 16, Replacement::Lru)),
        walk_cache: Some(TlbConfig::new(64, 16, Replacement::Lru)),
    }
}

/// Compute units of the MESC paper's GPU.
pub const MESC_UNITS: usize = 16;

/// The integrated GPU's MMU with a plugged cache design.
pub type PluggedMmu = SimMmu<X86Tables, Plugged>;

enum Gpu {
    Integrated(Igpu),
    Discrete(Dgpu),
    /// The integrated GPU with a pluggable cache organisation.
    Plugged(Arc<PluggedMmu>, Port),
    /// The discrete GPU with a pluggable cache organisation.
    PluggedDiscrete(Dgpu<Plugged>),
}

/// A host, a GPU and one address space.
pub struct SimtMachine {
    gm: Gmem,
    cpu: HostCpu,
    gpu: Gpu,
    space: SpaceId,
    /// Occupancy calculation used for launches.
    pub occupancy: Box<dyn OccupancyModel + Send + Sync>,
    /// The cost model used for launches.
    pub cost: CostModel,
    /// Warp register files kept between launches (see `Launch::spare_io`; boxed, as
    /// warps hold them).
    #[allow(clippy::vec_box)]
    spare_io: Mutex<Vec<Box<WarpIo>>>,
    /// The units' wake calendars kept between launches (see `Launch::spare_wakes`).
    spare_wakes: Mutex<SpareWakes>,
    /// MESC §IV-D's OS scan before each launch, and what the scans found
    /// ([`SimtMachine::set_mesc_scan`]).
    mesc_scan: Mutex<Option<ScanLog>>,
}

/// What MESC's OS scans before launches found ([`SimtMachine::set_mesc_scan`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanLog {
    /// Scans run (one per launch).
    pub scans: u64,
    /// Level-1 table pointers whose stored bits lagged their leaves when a scan came
    /// and were rewritten: the contiguity the GPU could not use until then.
    pub repaired: u64,
    /// Table entries the scans read.
    pub entries_read: u64,
}

impl SimtMachine {
    /// A machine with `host_pages` of host memory and `gpu` with `tlbs`.
    ///
    /// # Errors
    /// A description of what the core or a driver refused.
    pub fn new(
        host_pages: u64,
        gpu: GpuKind,
        tlbs: HierarchyConfig,
    ) -> Result<SimtMachine, String> {
        SimtMachine::build(host_pages, gpu, tlbs, None, HostCpuConfig::default().x86)
    }

    /// The integrated GPU over host tables of format options `x86`, with the cache
    /// organisation `caches` builds over the machine's x86-64 tables (see
    /// [`crate::mesc`]), and `host_pages` of host memory.
    ///
    /// # Errors
    /// As [`SimtMachine::new`].
    pub fn integrated_with(
        host_pages: u64,
        x86: X86Config,
        caches: impl FnOnce(Arc<X86Tables>) -> Result<Box<dyn GpuCaches>, String>,
    ) -> Result<SimtMachine, String> {
        SimtMachine::build(
            host_pages,
            GpuKind::Integrated,
            mesc_tlbs(MESC_UNITS),
            Some(Plug::Integrated(Box::new(caches))),
            x86,
        )
    }

    /// The discrete GPU (the MESC paper's 16 CUs) with `vram_pages` of video memory for
    /// data, its tables keeping MESC's bits when `mesc`, with the cache organisation
    /// `caches` builds over its tables (see [`crate::mesc`]), and `host_pages` of host
    /// memory. Data the host initialised migrates to video memory on first touch.
    ///
    /// # Errors
    /// As [`SimtMachine::new`].
    pub fn discrete_with(
        host_pages: u64,
        vram_pages: u64,
        mesc: bool,
        caches: impl FnOnce(Arc<GpuTables>) -> Result<Box<dyn GpuCaches>, String>,
    ) -> Result<SimtMachine, String> {
        SimtMachine::build(
            host_pages,
            GpuKind::Discrete { pages: vram_pages },
            mesc_tlbs(MESC_UNITS),
            Some(Plug::Discrete(Box::new(caches), mesc)),
            HostCpuConfig::default().x86,
        )
    }

    fn build(
        host_pages: u64,
        gpu: GpuKind,
        tlbs: HierarchyConfig,
        plug: Option<Plug<'_>>,
        x86: X86Config,
    ) -> Result<SimtMachine, String> {
        let defaults = HostCpuConfig {
            x86,
            ..HostCpuConfig::default()
        };
        // A whole number of 2 MiB blocks of table frames keeps the memory the core
        // manages 2 MiB aligned, so an aligned block of it can be one large leaf.
        let table_frames = (host_pages.div_ceil(512) + 256).next_multiple_of(512);
        let config = HostCpuConfig {
            memory_bytes: (host_pages + table_frames) * PAGE_SIZE,
            table_frames,
            ..defaults
        };
        let (gm, cpu) = HostCpu::boot(config).map_err(|e| format!("{e:?}"))?;
        let space = gm
            .as_create(
                VirtAddr::new(1 << 32),
                VirtAddr::new(1 << 39),
                AllocPolicy::empty(),
            )
            .map_err(|e| e.to_string())?;
        let shared = gpu == GpuKind::Integrated;
        let cpu_mode = if shared {
            MmuMode::Shared
        } else {
            MmuMode::Coherent
        };
        gm.as_attach(space, gm.host(), cpu_mode, Activation::Switch)
            .map_err(|e| e.to_string())?;
        let (gpu, id, mode) = match (gpu, plug) {
            (GpuKind::Integrated, Some(Plug::Integrated(plug))) => {
                let caches = plug(cpu.tables().clone())?;
                let mmu = Arc::new(SimMmu::with_caches(cpu.tables().clone(), Plugged(caches)));
                let port = Port::new(mmu.clone(), cpu.memory_map().clone(), None);
                let id = gm
                    .dev_create(DeviceDesc {
                        name: "igpu".into(),
                        mmu: mmu.clone(),
                        memory: None,
                        caps: DevCaps::FAULTABLE,
                        data: None,
                    })
                    .map_err(|e| format!("{e:?}"))?;
                port.bind(id)
                    .map_err(|d| format!("already bound to {d:?}"))?;
                (Gpu::Plugged(mmu, port), id, MmuMode::Shared)
            }
            (GpuKind::Integrated, None) => {
                let g = Igpu::with_tlbs(cpu.tables().clone(), cpu.memory_map().clone(), tlbs)
                    .map_err(|e| format!("{e:?}"))?;
                let id = g.create(&gm, "igpu").map_err(|e| format!("{e:?}"))?;
                (Gpu::Integrated(g), id, MmuMode::Shared)
            }
            (GpuKind::Discrete { pages }, plug) => {
                let mut c = DgpuConfig::new(0, 0, tlbs.units);
                c.tlbs = tlbs;
                c.table_frames = (host_pages + pages).div_ceil(512) + 64;
                c.vram_bytes = (c.table_frames + pages.max(1)) * PAGE_SIZE;
                let map = cpu.memory_map().clone();
                match plug {
                    None => {
                        let g = Dgpu::new(map, c).map_err(|e| format!("{e:?}"))?;
                        let id = g.create(&gm, "dgpu").map_err(|e| format!("{e:?}"))?;
                        (Gpu::Discrete(g), id, MmuMode::Coherent)
                    }
                    Some(Plug::Discrete(plug, mesc)) => {
                        c.mesc = mesc;
                        // A whole number of 2 MiB blocks of table frames keeps the video
                        // memory the core manages 2 MiB aligned (as on the host side).
                        c.table_frames = c.table_frames.next_multiple_of(512);
                        c.vram_bytes = (c.table_frames + pages.max(1)) * PAGE_SIZE;
                        let g = Dgpu::with_caches(map, c, |t| {
                            plug(t.clone()).map(Plugged).map_err(Failed)
                        })
                        .map_err(|Failed(e)| e)?;
                        let id = g.create(&gm, "dgpu").map_err(|e| format!("{e:?}"))?;
                        (Gpu::PluggedDiscrete(g), id, MmuMode::Coherent)
                    }
                    Some(Plug::Integrated(_)) => {
                        return Err("integrated caches plugged into the discrete GPU".into())
                    }
                }
            }
            (GpuKind::Integrated, Some(Plug::Discrete(..))) => {
                return Err("discrete caches plugged into the integrated GPU".into())
            }
        };
        let got = gm
            .as_attach(space, id, mode, Activation::Switch)
            .map_err(|e| e.to_string())?;
        if got != mode {
            return Err(format!("GPU attached in {got:?} mode, wanted {mode:?}"));
        }
        Ok(SimtMachine {
            gm,
            cpu,
            gpu,
            space,
            occupancy: Box::new(SmConfig::maxwell()),
            cost: CostModel::calibrated(),
            spare_io: Mutex::new(Vec::new()),
            spare_wakes: Mutex::new(SpareWakes::default()),
            mesc_scan: Mutex::new(None),
        })
    }

    /// The MESC paper's integrated GPU with enough host memory for `data_pages`.
    ///
    /// # Errors
    /// As [`SimtMachine::new`].
    pub fn mesc(data_pages: u64) -> Result<SimtMachine, String> {
        SimtMachine::new(
            data_pages + 1024,
            GpuKind::Integrated,
            mesc_tlbs(MESC_UNITS),
        )
    }

    /// Run MESC's OS scan (Alg. 1, rewriting stale bits) over the tables the GPU walks
    /// before every launch: §IV-D has the OS scan the page table after memory is
    /// allocated, so contiguity the allocator made becomes visible at the next launch
    /// (a program allocates, writes, then launches). Boot the host tables without the
    /// eager upkeep (`X86Config::mesc` off) for the bits to come from the scan alone.
    pub fn set_mesc_scan(&self, on: bool) {
        *gmem_sim::lock(&self.mesc_scan) = on.then(ScanLog::default);
    }

    /// What the launch scans found (`None` when [`SimtMachine::set_mesc_scan`] is off).
    pub fn mesc_scans(&self) -> Option<ScanLog> {
        *gmem_sim::lock(&self.mesc_scan)
    }

    fn scan_before_launch(&self) {
        let mut g = gmem_sim::lock(&self.mesc_scan);
        let Some(log) = g.as_mut() else {
            return;
        };
        let Some(root) = self.gpu_root() else {
            return;
        };
        let r = match self.discrete_tables() {
            Some(t) => gmem_ptengine::mesc::scan(t.codec(), t.engine().memory(), root.0, true),
            None => {
                let t = self.cpu.tables();
                gmem_ptengine::mesc::scan(t.codec(), t.engine().memory(), root.0, true)
            }
        };
        log.scans += 1;
        log.repaired += r.stale;
        log.entries_read += r.entries_read;
    }

    /// The GMEM instance.
    pub fn gm(&self) -> &Gmem {
        &self.gm
    }

    /// The GPU's port.
    pub fn port(&self) -> &Port {
        match &self.gpu {
            Gpu::Integrated(g) => g.port(),
            Gpu::Discrete(g) => g.port(),
            Gpu::Plugged(_, p) => p,
            Gpu::PluggedDiscrete(g) => g.port(),
        }
    }

    /// The plugged design's own counters (`None` for the built-in caches).
    pub fn design_stats(&self) -> Option<DesignStats> {
        match &self.gpu {
            Gpu::Plugged(m, _) => Some(m.with_cache_state(|c| c.design_stats())),
            Gpu::PluggedDiscrete(g) => Some(g.mmu().with_cache_state(|c| c.design_stats())),
            _ => None,
        }
    }

    /// The active root of the GPU's MMU.
    pub fn gpu_root(&self) -> Option<gmem_core::PageTableRoot> {
        match &self.gpu {
            Gpu::Integrated(g) => g.mmu().active_root(),
            Gpu::Discrete(g) => g.mmu().active_root(),
            Gpu::Plugged(m, _) => m.active_root(),
            Gpu::PluggedDiscrete(g) => g.mmu().active_root(),
        }
    }

    /// The discrete GPU's own tables (`None` on the integrated GPU, which walks the
    /// CPU's: [`HostCpu::tables`]).
    pub fn discrete_tables(&self) -> Option<&Arc<GpuTables>> {
        match &self.gpu {
            Gpu::Discrete(g) => Some(g.tables()),
            Gpu::PluggedDiscrete(g) => Some(g.tables()),
            _ => None,
        }
    }

    /// The host CPU.
    pub fn cpu(&self) -> &HostCpu {
        &self.cpu
    }

    /// The address space.
    pub fn space(&self) -> SpaceId {
        self.space
    }

    /// A second port of the GPU (same device id, same memories) whose translations go
    /// through `wrap(GPU MMU)`: instrumentation for tests (pausing an access between
    /// its translation and its bytes).
    ///
    /// # Errors
    /// Never in practice: binding a fresh port to the GPU's id.
    pub fn port_through(
        &self,
        wrap: impl FnOnce(Arc<dyn Translator>) -> Arc<dyn Translator>,
    ) -> Result<Port, String> {
        let (mmu, local): (Arc<dyn Translator>, _) = match &self.gpu {
            Gpu::Integrated(g) => (g.mmu().clone(), None),
            Gpu::Discrete(g) => (g.mmu().clone(), Some(g.vram().clone())),
            Gpu::Plugged(m, _) => (m.clone(), None),
            Gpu::PluggedDiscrete(g) => (g.mmu().clone(), Some(g.vram().clone())),
        };
        let port = Port::new(wrap(mmu), self.cpu.memory_map().clone(), local);
        let id = self.port().id().ok_or("GPU not created")?;
        port.bind(id)
            .map_err(|d| format!("already bound to {d:?}"))?;
        Ok(port)
    }

    /// For each address of `vas` and each unit whose caches hold a translation of it,
    /// check that the translation the caches serve equals a fresh walk of the table
    /// (frame, page size, permissions, format bits). Returns how many cached translations were
    /// checked.
    ///
    /// # Errors
    /// The first mismatch, described.
    pub fn audit_tlbs(&self, vas: impl Iterator<Item = u64>) -> Result<u64, String> {
        match &self.gpu {
            Gpu::Integrated(g) => audit(g.mmu(), vas),
            Gpu::Discrete(g) => audit(g.mmu(), vas),
            Gpu::Plugged(m, _) => audit(m, vas),
            Gpu::PluggedDiscrete(g) => audit(g.mmu(), vas),
        }
    }

    /// The GPU's MMU counters.
    pub fn gpu_mmu(&self) -> MmuStats {
        match &self.gpu {
            Gpu::Integrated(g) => g.mmu().stats(),
            Gpu::Discrete(g) => g.mmu().stats(),
            Gpu::Plugged(m, _) => m.stats(),
            Gpu::PluggedDiscrete(g) => g.mmu().stats(),
        }
    }

    /// Unit `u`'s L1 TLB counters.
    pub fn l1_stats(&self, u: usize) -> Option<TlbStats> {
        match &self.gpu {
            Gpu::Integrated(g) => g.mmu().l1_stats(u),
            Gpu::Discrete(g) => g.mmu().l1_stats(u),
            Gpu::Plugged(m, _) => m.l1_stats(u),
            Gpu::PluggedDiscrete(g) => g.mmu().l1_stats(u),
        }
    }

    /// Start recording the GPU's translation stream.
    pub fn start_recording(&self) {
        match &self.gpu {
            Gpu::Integrated(g) => g.mmu().start_recording(),
            Gpu::Discrete(g) => g.mmu().start_recording(),
            Gpu::Plugged(m, _) => m.start_recording(),
            Gpu::PluggedDiscrete(g) => g.mmu().start_recording(),
        }
    }

    /// Stop recording and take the stream.
    pub fn take_recording(&self) -> TraceLog {
        match &self.gpu {
            Gpu::Integrated(g) => g.mmu().take_recording(),
            Gpu::Discrete(g) => g.mmu().take_recording(),
            Gpu::Plugged(m, _) => m.take_recording(),
            Gpu::PluggedDiscrete(g) => g.mmu().take_recording(),
        }
    }

    /// Allocate `bytes` (rounded up to pages) in the space.
    ///
    /// # Errors
    /// The core's refusal.
    pub fn alloc(&self, bytes: u64) -> Result<Region, String> {
        let size = bytes.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        self.gm
            .as_alloc(self.space, AllocRequest::new(size))
            .map_err(|e| e.to_string())
    }

    /// Allocate an array of `values` and write it through the host CPU.
    ///
    /// # Errors
    /// As [`SimtMachine::alloc`], or a failed host store.
    pub fn upload(&self, values: &[u32]) -> Result<Region, String> {
        let r = self.alloc(values.len() as u64 * 4)?;
        self.store_words(r, values)?;
        Ok(r)
    }

    /// Write `values` at the start of `r` through the host CPU.
    ///
    /// # Errors
    /// A failed host store.
    pub fn store_words(&self, r: Region, values: &[u32]) -> Result<(), String> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        for (i, c) in bytes.chunks(PAGE_SIZE as usize).enumerate() {
            self.cpu
                .store(
                    &self.gm,
                    VirtAddr::new(r.start.as_u64() + i as u64 * PAGE_SIZE),
                    c,
                )
                .map_err(|e| format!("host store: {e}"))?;
        }
        Ok(())
    }

    /// Allocate an array of f32 `values` and write it through the host CPU.
    ///
    /// # Errors
    /// As [`SimtMachine::upload`].
    pub fn upload_f32(&self, values: &[f32]) -> Result<Region, String> {
        let v: Vec<u32> = values.iter().map(|x| x.to_bits()).collect();
        self.upload(&v)
    }

    /// Read `n` words at the start of `r` through the host CPU.
    ///
    /// # Errors
    /// A failed host load.
    pub fn download(&self, r: Region, n: usize) -> Result<Vec<u32>, String> {
        let mut bytes = vec![0u8; n * 4];
        for (i, c) in bytes.chunks_mut(PAGE_SIZE as usize).enumerate() {
            self.cpu
                .load(
                    &self.gm,
                    VirtAddr::new(r.start.as_u64() + i as u64 * PAGE_SIZE),
                    c,
                )
                .map_err(|e| format!("host load: {e}"))?;
        }
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Read `n` f32s at the start of `r` through the host CPU.
    ///
    /// # Errors
    /// As [`SimtMachine::download`].
    pub fn download_f32(&self, r: Region, n: usize) -> Result<Vec<f32>, String> {
        Ok(self
            .download(r, n)?
            .into_iter()
            .map(f32::from_bits)
            .collect())
    }

    /// Launch `kernel` with round-robin dispatch and loose round-robin warp scheduling.
    /// (GPGPU-Sim's default is greedy-then-oldest, [`crate::dispatch::Gto`]; at report
    /// size it moves every hit ratio by less than 0.01, because a memory instruction
    /// blocks its warp either way in this model.)
    ///
    /// # Errors
    /// As [`crate::engine::run`].
    pub fn launch<K: Kernel>(&self, kernel: &K) -> Result<RunStats, SimtError> {
        self.launch_with(kernel, &mut RoundRobin::default(), &|| {
            Box::new(LooseRoundRobin::default()) as Box<dyn WarpScheduler>
        })
    }

    /// Launch `kernel` with the given dispatch policy and warp schedulers.
    ///
    /// # Errors
    /// As [`crate::engine::run`].
    pub fn launch_with<K: Kernel>(
        &self,
        kernel: &K,
        dispatch: &mut dyn Dispatch,
        scheduler: &dyn Fn() -> Box<dyn WarpScheduler>,
    ) -> Result<RunStats, SimtError> {
        self.launch_observed(kernel, dispatch, scheduler, None)
    }

    /// [`SimtMachine::launch_with`], telling `observer` about every transaction.
    ///
    /// # Errors
    /// As [`crate::engine::run`].
    pub fn launch_observed<K: Kernel>(
        &self,
        kernel: &K,
        dispatch: &mut dyn Dispatch,
        scheduler: &dyn Fn() -> Box<dyn WarpScheduler>,
        observer: Option<&mut dyn AccessObserver>,
    ) -> Result<RunStats, SimtError> {
        self.scan_before_launch();
        // Taken, not held: launches from other threads run meanwhile with fresh ones.
        let mut spare = std::mem::take(&mut *gmem_sim::lock(&self.spare_io));
        let mut wakes = std::mem::take(&mut *gmem_sim::lock(&self.spare_wakes));
        let r = run(
            Device {
                gm: &self.gm,
                port: self.port(),
            },
            kernel,
            Launch {
                occupancy: &*self.occupancy,
                dispatch,
                scheduler,
                cost: &self.cost,
                page_shift: 12,
                observer,
                spare_io: &mut spare,
                spare_wakes: &mut wakes,
            },
        );
        gmem_sim::lock(&self.spare_io).append(&mut spare);
        *gmem_sim::lock(&self.spare_wakes) = wakes;
        r
    }
}

/// Builds a plugged design's caches over the GPU's tables: the CPU's for the
/// integrated GPU, the discrete GPU's own (with MESC bits or not).
enum Plug<'a> {
    Integrated(PlugFn<'a, X86Tables>),
    Discrete(PlugFn<'a, GpuTables>, bool),
}

type PlugFn<'a, T> = Box<dyn FnOnce(Arc<T>) -> Result<Box<dyn GpuCaches>, String> + 'a>;

/// Why building the plugged discrete GPU failed, described.
struct Failed(String);

impl From<DgpuError> for Failed {
    fn from(e: DgpuError) -> Failed {
        Failed(format!("{e:?}"))
    }
}

fn audit<F: gmem_sim::TableFormat, C: gmem_sim::TranslationCaches>(
    mmu: &gmem_sim::SimMmu<F, C>,
    vas: impl Iterator<Item = u64>,
) -> Result<u64, String> {
    use gmem_core::Prot;
    let Some(root) = mmu.active_root() else {
        return Ok(0);
    };
    let mut checked = 0;
    for va in vas {
        let va = VirtAddr::new(va);
        for u in 0..mmu.units() {
            if !mmu.cached(u, va) {
                continue;
            }
            let fresh = mmu.table_format().walk(root, va, Prot::empty(), None).leaf;
            let served = mmu.translate(u, va, Prot::empty());
            let same = match (&served, &fresh) {
                (Ok(s), Some(f)) => {
                    s.frame == f.frame && s.shift == f.shift && s.prot == f.prot && s.bits == f.bits
                }
                _ => false,
            };
            if !same {
                return Err(format!(
                    "unit {u} at {va}: caches serve {served:?}, a walk gives {fresh:?}"
                ));
            }
            checked += 1;
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coalesce::LANES;
    use crate::kernel::LOAD_REGS;
    use crate::workloads::spec::{Spec, SpecKernel, MAX_OPS};
    use gmem_sim::lock;

    /// Thread `t` folds `2·a[t + k·n] + a[n·steps + t]` (the second operand only for
    /// even `t`) over its steps; every seventh thread stores nothing. 200 threads: the
    /// last warp has 8 lanes.
    struct Gather {
        a: u64,
        c: u64,
    }

    const N: u64 = 200;
    const STEPS: u64 = 5;

    impl Spec for Gather {
        fn threads(&self) -> u64 {
            N
        }
        fn steps(&self) -> u64 {
            STEPS
        }
        fn operands(&self) -> usize {
            2
        }
        fn addr(&self, t: u64, k: u64, op: usize) -> Option<u64> {
            match op {
                0 => Some(self.a + 4 * (t + k * N)),
                _ => (t % 2 == 0).then_some(self.a + 4 * (N * STEPS + t)),
            }
        }
        fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
            acc[0] += 2.0 * v[0] + v[1];
        }
        fn out(&self, t: u64) -> Option<u64> {
            (t % 7 != 0).then_some(self.c + 4 * t)
        }
    }

    fn launch_gather(m: &SimtMachine) -> (RunStats, Vec<f32>) {
        let data: Vec<f32> = (0..N * (STEPS + 1)).map(|i| (i % 97) as f32).collect();
        let a = m.upload_f32(&data).unwrap();
        let c = m.upload_f32(&vec![-1.0; N as usize]).unwrap();
        let k = SpecKernel::new(Gather {
            a: a.start.as_u64(),
            c: c.start.as_u64(),
        });
        let st = m.launch(&k).unwrap();
        let got = m.download_f32(c, N as usize).unwrap();
        let want: Vec<f32> = (0..N)
            .map(|t| match t % 7 {
                0 => -1.0,
                _ => (0..STEPS).fold(0.0, |s, k| {
                    let extra = if t % 2 == 0 {
                        data[(N * STEPS + t) as usize]
                    } else {
                        0.0
                    };
                    s + 2.0 * data[(t + k * N) as usize] + extra
                }),
            })
            .collect();
        assert_eq!(got, want, "against the CPU");
        (st, got)
    }

    #[test]
    fn register_files_kept_from_earlier_launches_are_never_read_before_written() {
        let fresh = SimtMachine::mesc(64).unwrap();
        let (st_fresh, got_fresh) = launch_gather(&fresh);
        assert!(
            !lock(&fresh.spare_io).is_empty(),
            "the launch gave its back"
        );
        // Another machine whose kept register files hold junk in every field.
        let junk = SimtMachine::mesc(64).unwrap();
        let bad = WarpIo {
            addr: [0xdead_beef_dead_beef; LANES],
            value: [0xa5a5_a5a5; LANES],
            mask: u32::MAX,
            regs: [[0x5a5a_5a5a; LANES]; LOAD_REGS],
            stride: 4,
        };
        lock(&junk.spare_io).extend((0..256).map(|_| Box::new(bad.clone())));
        let (st_junk, got_junk) = launch_gather(&junk);
        assert_eq!((st_junk, got_junk), (st_fresh, got_fresh));
        assert!(lock(&junk.spare_io).len() >= 256);
    }
}
