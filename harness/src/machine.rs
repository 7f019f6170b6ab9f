//! The machine workloads run on: a host CPU and one accelerator attached to one shared
//! address space, with typed loads and stores through either device.
//!
//! Today the devices are gmem-core's test MMU and byte-holding test memory (translation
//! with a TLB that must be invalidated, faults served by `dev_fault` and retried).
//! Workloads only see this interface, so they move unchanged onto the simulated GPU
//! drivers.

use gmem_core::testing::{AccessError, TestSystem};
use gmem_core::{
    AllocPolicy, AllocRequest, DevCaps, Gmem, MapFlags, MmuMode, Region, SpaceId, VirtAddr,
    PAGE_SIZE,
};

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
    /// A discrete GPU with this many pages of local memory.
    Discrete { pages: u64 },
    /// An integrated GPU (no local memory) sharing the CPU's page table.
    IntegratedShared,
    /// An integrated GPU with a coherent page table of its own.
    IntegratedCoherent,
}

const GPU_BASE: u64 = 0x40_0000_0000;

/// A host, an accelerator and one address space.
pub struct Machine {
    sys: TestSystem,
    space: SpaceId,
    gpu: usize,
}

fn access(e: AccessError) -> String {
    format!("device access failed: {e:?}")
}

impl Machine {
    /// A machine with `host_pages` of host memory and the given accelerator.
    pub fn new(host_pages: u64, accel: Accel) -> Result<Machine, String> {
        let mut sys = TestSystem::without_log(host_pages);
        let (format, pages, mode) = match accel {
            Accel::Discrete { pages } => (7, pages.max(1), MmuMode::Coherent),
            Accel::IntegratedShared => (1, 0, MmuMode::Shared),
            Accel::IntegratedCoherent => (1, 0, MmuMode::Coherent),
        };
        let gpu = sys.add_device(format, DevCaps::FAULTABLE, GPU_BASE, pages);
        let gm = &sys.gm;
        let space = gm
            .as_create(
                VirtAddr::new(1 << 32),
                VirtAddr::new(1 << 46),
                AllocPolicy::empty(),
            )
            .map_err(|e| e.to_string())?;
        let cpu_mode = if accel == Accel::IntegratedShared {
            MmuMode::Shared
        } else {
            MmuMode::Coherent
        };
        gm.as_attach(space, sys.host().id, cpu_mode, true)
            .map_err(|e| e.to_string())?;
        let got = gm
            .as_attach(space, sys.devices[gpu].id, mode, true)
            .map_err(|e| e.to_string())?;
        if got != mode {
            return Err(format!(
                "accelerator attached in {got:?} mode, wanted {mode:?}"
            ));
        }
        Ok(Machine { sys, space, gpu })
    }

    /// The GMEM instance.
    pub fn gm(&self) -> &Gmem {
        &self.sys.gm
    }

    /// A region of `bytes` (rounded up to pages).
    pub fn alloc(&self, bytes: u64) -> Result<Region, String> {
        let size = bytes.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        self.sys
            .gm
            .as_alloc(self.space, AllocRequest::new(size))
            .map_err(|e| e.to_string())
    }

    /// Free a region.
    pub fn free(&self, r: Region) -> Result<(), String> {
        self.sys
            .gm
            .region_dealloc(r, MapFlags::empty(), None)
            .map_err(|e| e.to_string())
    }

    fn dev(&self, on: On) -> usize {
        match on {
            On::Cpu => 0,
            On::Gpu => self.gpu,
        }
    }

    /// Load `n` f32s at element `index` of `r`.
    pub fn load_f32(&self, on: On, r: Region, index: u64, n: usize) -> Result<Vec<f32>, String> {
        let va = VirtAddr::new(r.start.as_u64() + index * 4);
        let bytes = self.sys.read(self.dev(on), va, n * 4).map_err(access)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Store f32s at element `index` of `r`.
    pub fn store_f32(&self, on: On, r: Region, index: u64, values: &[f32]) -> Result<(), String> {
        let va = VirtAddr::new(r.start.as_u64() + index * 4);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.sys.write(self.dev(on), va, &bytes).map_err(access)
    }

    /// Load `n` u32s at element `index` of `r`.
    pub fn load_u32(&self, on: On, r: Region, index: u64, n: usize) -> Result<Vec<u32>, String> {
        let va = VirtAddr::new(r.start.as_u64() + index * 4);
        let bytes = self.sys.read(self.dev(on), va, n * 4).map_err(access)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Store u32s at element `index` of `r`.
    pub fn store_u32(&self, on: On, r: Region, index: u64, values: &[u32]) -> Result<(), String> {
        let va = VirtAddr::new(r.start.as_u64() + index * 4);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.sys.write(self.dev(on), va, &bytes).map_err(access)
    }

    /// Bytes zero-filled in the accelerator's local memory.
    pub fn device_bytes_zeroed(&self) -> u64 {
        self.sys.devices[self.gpu]
            .memory
            .as_ref()
            .map_or(0, |m| m.counts().zeroed)
    }

    /// TLB hits and misses of a device's MMU.
    pub fn tlb(&self, on: On) -> (u64, u64) {
        self.sys.devices[self.dev(on)].mmu.tlb_counts()
    }

    /// Check the core's invariants.
    pub fn check(&self) -> Result<(), String> {
        self.sys
            .gm
            .check_invariants(self.space)
            .map_err(|e| e.to_string())
    }
}
