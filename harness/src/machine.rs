//! The machine workloads run on: the simulated host CPU and one simulated accelerator
//! (a discrete GPU with video memory, or an integrated GPU on the CPU's page-table
//! format) attached to one shared address space.
//!
//! Every load and store goes through the device's MMU model — per-unit L1 TLBs, a shared
//! L2, a page-walk cache, walks of page tables that live in simulated memory — and a
//! miss the tables cannot serve becomes `dev_fault` into gmem-core, after which the
//! device retries. Bytes live in simulated memories: host DRAM and video memory.
//! Workloads only see this interface.

use gmem_core::{
    Activation, AllocPolicy, AllocRequest, Gmem, MapFlags, MmuMode, Region, SpaceId, VirtAddr,
    PAGE_SIZE,
};
use gmem_dgpu::{Dgpu, DgpuConfig};
use gmem_host_cpu::{HostCpu, HostCpuConfig};
use gmem_igpu::Igpu;
use gmem_sim::{MmuStats, Port};

/// Which device performs an access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum On {
    /// The host CPU.
    Cpu,
    /// The accelerator.
    Gpu,
}

/// What kind of accelerator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// A discrete GPU with this many pages of video memory for the core to manage.
    Discrete { pages: u64 },
    /// An integrated GPU (no local memory) sharing the CPU's page table.
    IntegratedShared,
    /// An integrated GPU with a coherent page table of its own.
    IntegratedCoherent,
}

thread_local! {
    /// The eviction policy machines built on this thread give the discrete GPU's memory
    /// (the `aging` comparison runs the same workload under each).
    static GPU_EVICTION: std::cell::Cell<gmem_core::EvictionPolicy> =
        const { std::cell::Cell::new(gmem_core::EvictionPolicy::Clock) };
}

/// Make machines built on this thread from now on evict the discrete GPU's memory by
/// `policy`; returns the previous setting.
pub fn set_gpu_eviction_policy(policy: gmem_core::EvictionPolicy) -> gmem_core::EvictionPolicy {
    GPU_EVICTION.with(|p| p.replace(policy))
}

/// Compute units of the simulated GPUs.
pub const COMPUTE_UNITS: usize = 4;

enum Gpu {
    Discrete(Dgpu),
    Integrated(Igpu),
}

/// TLB counters of one device's MMU.
#[derive(Clone, Copy, Debug, Default)]
pub struct TlbReport {
    /// L1 hits (all units).
    pub l1_hits: u64,
    /// L1 misses.
    pub l1_misses: u64,
    /// L2 hits.
    pub l2_hits: u64,
    /// L2 misses.
    pub l2_misses: u64,
    /// Page walks.
    pub walks: u64,
}

impl From<MmuStats> for TlbReport {
    fn from(m: MmuStats) -> Self {
        let c = m.caches;
        TlbReport {
            l1_hits: c.l1.hits,
            l1_misses: c.l1.misses,
            l2_hits: c.l2.hits,
            l2_misses: c.l2.misses,
            walks: c.walks,
        }
    }
}

/// A host, an accelerator and one address space.
pub struct Machine {
    gm: Gmem,
    cpu: HostCpu,
    gpu: Gpu,
    space: SpaceId,
}

impl Machine {
    /// A machine with `host_pages` of host memory for the core and the given
    /// accelerator; its address space is `[4 GiB, 512 GiB)`.
    ///
    /// # Errors
    /// As [`Machine::with_space`].
    pub fn new(host_pages: u64, accel: Accel) -> Result<Machine, String> {
        Machine::with_space(host_pages, accel, 1 << 32, 1 << 39)
    }

    /// The same with the address space `[begin, end)` (the discrete GPU translates
    /// 39-bit addresses).
    ///
    /// # Errors
    /// A message naming the part that was refused: the host CPU (`host_pages` zero,
    /// too many to address, or more frames than the core indexes per device), the space (`[begin, end)`
    /// empty or not page aligned), an attachment the core refused, the accelerator's
    /// build or creation, or an accelerator attached in another mode than asked for
    /// (the core found no table to share).
    pub fn with_space(
        host_pages: u64,
        accel: Accel,
        begin: u64,
        end: u64,
    ) -> Result<Machine, String> {
        let defaults = HostCpuConfig::default();
        let memory_bytes = host_pages
            .checked_add(defaults.table_frames)
            .and_then(|p| p.checked_mul(PAGE_SIZE))
            .ok_or_else(|| format!("host CPU: {host_pages} pages do not fit the address width"))?;
        let config = HostCpuConfig {
            memory_bytes,
            ..defaults
        };
        let (gm, cpu) = HostCpu::boot(config).map_err(|e| e.to_string())?;
        let space = gm
            .as_create(
                VirtAddr::new(begin),
                VirtAddr::new(end),
                AllocPolicy::empty(),
            )
            .map_err(|e| e.to_string())?;
        let cpu_mode = if accel == Accel::IntegratedShared {
            MmuMode::Shared
        } else {
            MmuMode::Coherent
        };
        gm.as_attach(space, gm.host(), cpu_mode, Activation::Switch)
            .map_err(|e| e.to_string())?;
        let (gpu, id, mode) = match accel {
            Accel::Discrete { pages } => {
                let mut c = DgpuConfig::new(0, 0, COMPUTE_UNITS);
                // Page-table frames in video memory: a leaf table per 512 pages the GPU
                // may map (at most the machine's memory), plus upper levels and tables
                // retired until their invalidation.
                c.table_frames = (host_pages + pages).div_ceil(512) + 64;
                c.vram_bytes = (c.table_frames + pages.max(1)) * PAGE_SIZE;
                let g = Dgpu::new(cpu.memory_map().clone(), c)
                    .map_err(|e| format!("discrete GPU: {e:?}"))?;
                let id = g
                    .create(&gm, "dgpu")
                    .map_err(|e| format!("discrete GPU: {e:?}"))?;
                gm.dev_set_eviction_policy(id, GPU_EVICTION.with(|p| p.get()))
                    .map_err(|e| e.to_string())?;
                (Gpu::Discrete(g), id, MmuMode::Coherent)
            }
            Accel::IntegratedShared | Accel::IntegratedCoherent => {
                let g = Igpu::new(
                    cpu.tables().clone(),
                    cpu.memory_map().clone(),
                    COMPUTE_UNITS,
                )
                .map_err(|e| format!("integrated GPU: {e:?}"))?;
                let id = g
                    .create(&gm, "igpu")
                    .map_err(|e| format!("integrated GPU: {e:?}"))?;
                let mode = if accel == Accel::IntegratedShared {
                    MmuMode::Shared
                } else {
                    MmuMode::Coherent
                };
                (Gpu::Integrated(g), id, mode)
            }
        };
        let got = gm
            .as_attach(space, id, mode, Activation::Switch)
            .map_err(|e| e.to_string())?;
        if got != mode {
            return Err(format!(
                "accelerator attached in {got:?} mode, wanted {mode:?}"
            ));
        }
        Ok(Machine {
            gm,
            cpu,
            gpu,
            space,
        })
    }

    /// The GMEM instance.
    pub fn gm(&self) -> &Gmem {
        &self.gm
    }

    /// The address space.
    pub fn space(&self) -> SpaceId {
        self.space
    }

    /// A region of `bytes` (rounded up to pages).
    ///
    /// # Errors
    /// The core's allocation error as text: no free range of that size is left in the
    /// space (or `bytes` does not round up to whole pages within 64 bits).
    pub fn alloc(&self, bytes: u64) -> Result<Region, String> {
        let size = bytes
            .max(1)
            .div_ceil(PAGE_SIZE)
            .checked_mul(PAGE_SIZE)
            .ok_or_else(|| format!("{bytes} bytes do not fit the address width"))?;
        self.gm
            .as_alloc(self.space, AllocRequest::new(size))
            .map_err(|e| e.to_string())
    }

    /// Free a region.
    ///
    /// # Errors
    /// The core's error as text for a stale region (freed before); nothing changes.
    pub fn free(&self, r: Region) -> Result<(), String> {
        self.gm
            .region_dealloc(r, MapFlags::empty(), None)
            .map_err(|e| e.to_string())
    }

    /// The accelerator's core id.
    pub fn gpu_id(&self) -> gmem_core::DeviceId {
        match &self.gpu {
            Gpu::Discrete(g) => g.id(),
            Gpu::Integrated(g) => g.id(),
        }
        .expect("created in new")
    }

    fn gpu_port(&self) -> &Port {
        match &self.gpu {
            Gpu::Discrete(g) => g.port(),
            Gpu::Integrated(g) => g.port(),
        }
    }

    /// Load bytes at `va` through a device (GPU accesses spread over its compute units
    /// by page).
    ///
    /// # Errors
    /// A message naming the device, the address and the port's error: an empty access,
    /// a fault the core could not serve (an address in no region, an access the region
    /// does not permit, memory exhausted), or a fault that kept recurring. The pages
    /// before the failing one have been read.
    pub fn load(&self, on: On, va: u64, buf: &mut [u8]) -> Result<(), String> {
        let r = match on {
            On::Cpu => self.cpu.load(&self.gm, VirtAddr::new(va), buf),
            On::Gpu => self
                .gpu_port()
                .load(&self.gm, unit(va), VirtAddr::new(va), buf),
        };
        r.map_err(|e| format!("{on:?} load at {va:#x}: {e:?}"))
    }

    /// Store bytes at `va` through a device.
    ///
    /// # Errors
    /// As [`Machine::load`]; the pages before the failing one have been written.
    pub fn store(&self, on: On, va: u64, data: &[u8]) -> Result<(), String> {
        let r = match on {
            On::Cpu => self.cpu.store(&self.gm, VirtAddr::new(va), data),
            On::Gpu => self
                .gpu_port()
                .store(&self.gm, unit(va), VirtAddr::new(va), data),
        };
        r.map_err(|e| format!("{on:?} store at {va:#x}: {e:?}"))
    }

    /// Load `n` f32s at element `index` of `r`.
    ///
    /// # Errors
    /// As [`Machine::load`] (`n` zero is an empty access); an element offset or
    /// length beyond 64 bits is refused before any access.
    pub fn load_f32(&self, on: On, r: Region, index: u64, n: usize) -> Result<Vec<f32>, String> {
        let len = n
            .checked_mul(4)
            .ok_or_else(|| format!("{n} elements do not fit the address width"))?;
        let mut bytes = vec![0u8; len];
        self.load(on, element(r, index)?, &mut bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Store f32s at element `index` of `r`.
    ///
    /// # Errors
    /// As [`Machine::store`] (no value is an empty access); an element offset beyond
    /// 64 bits is refused before any access.
    pub fn store_f32(&self, on: On, r: Region, index: u64, values: &[f32]) -> Result<(), String> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.store(on, element(r, index)?, &bytes)
    }

    /// Load `n` u32s at element `index` of `r`.
    ///
    /// # Errors
    /// As [`Machine::load`] (`n` zero is an empty access); an element offset or
    /// length beyond 64 bits is refused before any access.
    pub fn load_u32(&self, on: On, r: Region, index: u64, n: usize) -> Result<Vec<u32>, String> {
        let len = n
            .checked_mul(4)
            .ok_or_else(|| format!("{n} elements do not fit the address width"))?;
        let mut bytes = vec![0u8; len];
        self.load(on, element(r, index)?, &mut bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Store u32s at element `index` of `r`.
    ///
    /// # Errors
    /// As [`Machine::store`] (no value is an empty access); an element offset beyond
    /// 64 bits is refused before any access.
    pub fn store_u32(&self, on: On, r: Region, index: u64, values: &[u32]) -> Result<(), String> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.store(on, element(r, index)?, &bytes)
    }

    /// Bytes of data pages zero-filled in the accelerator's local memory (by its copy
    /// engine, the core's data mover; page-table pages are not counted).
    pub fn device_bytes_zeroed(&self) -> u64 {
        match &self.gpu {
            Gpu::Discrete(g) => g.stats().dma.zeroed,
            Gpu::Integrated(_) => 0,
        }
    }

    /// TLB counters of a device's MMU.
    pub fn tlb(&self, on: On) -> TlbReport {
        match (on, &self.gpu) {
            (On::Cpu, _) => self.cpu.stats().mmu.into(),
            (On::Gpu, Gpu::Discrete(g)) => g.stats().mmu.into(),
            (On::Gpu, Gpu::Integrated(g)) => g.stats().mmu.into(),
        }
    }

    /// Check the core's invariants.
    ///
    /// # Errors
    /// The first violated invariant of the space the core reports, as text.
    pub fn check(&self) -> Result<(), String> {
        self.gm
            .check_invariants(self.space)
            .map_err(|e| e.to_string())
    }
}

/// The compute unit that accesses `va`: pages are spread round-robin over the units.
fn unit(va: u64) -> usize {
    ((va / PAGE_SIZE) % COMPUTE_UNITS as u64) as usize
}

/// The address of 4-byte element `index` of `r`, or a message if it overflows (a
/// huge index then fails like any address outside the space, without a panic).
fn element(r: Region, index: u64) -> Result<u64, String> {
    index
        .checked_mul(4)
        .and_then(|o| r.start.as_u64().checked_add(o))
        .ok_or_else(|| format!("element {index} of {r:?} is beyond the address width"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_indexes_beyond_64_bits_are_errors_not_panics() {
        assert!(Machine::new(u64::MAX, Accel::IntegratedCoherent).is_err());
        let m = Machine::new(64, Accel::IntegratedCoherent).unwrap();
        assert!(m.alloc(u64::MAX).is_err());
        let r = m.alloc(PAGE_SIZE).unwrap();
        m.store_u32(On::Cpu, r, 0, &[7]).unwrap();
        assert!(m.load_u32(On::Cpu, r, u64::MAX, 1).is_err());
        assert!(m.store_f32(On::Gpu, r, u64::MAX / 2, &[1.0]).is_err());
        assert!(m.load_f32(On::Cpu, r, 0, usize::MAX).is_err());
        assert_eq!(m.load_u32(On::Cpu, r, 0, 1).unwrap(), vec![7]);
    }
}
