//! The simulated machine the runtime drives, and the runtime's error type.
//!
//! Owned here: a host CPU (x86-64 tables, host memory that holds real bytes), a discrete
//! GPU configured as one that **cannot fault** (no `FAULTABLE` capability: the core
//! never serves a miss of it, so everything it touches must be mapped before a kernel
//! runs), and one address space with both attached, the GPU with a table of its own
//! (which is what lets it hold device-private frames).

use crate::model::Timeline;
use crate::program::Kernel;
use gmem_core::{
    Activation, AllocError, AllocPolicy, AttachError, DeviceId, Gmem, LookupError, MmuMode,
    PopulateError, ProtectError, RegionError, SpaceError, SpaceId, VirtAddr,
};
use gmem_dgpu::{Dgpu, DgpuConfig, DgpuError};
use gmem_host_cpu::{HostCpu, HostCpuConfig, HostCpuError};
use gmem_sim::{AccessError, BoundsError, Grid, LaunchError};
use std::fmt;

/// Why a runtime operation failed. Every failure leaves the runtime's objects as they
/// were before the call unless the variant says otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdsmError {
    /// The host CPU could not be built.
    Host(HostCpuError),
    /// The GPU could not be built or created.
    Gpu(DgpuError),
    /// The core refused to create the space.
    Space(SpaceError),
    /// The core refused an attachment.
    Attach(AttachError),
    /// The core could not allocate a region.
    Alloc(AllocError),
    /// The core could not populate a region or give it private frames.
    Populate(PopulateError),
    /// The core could not change a protection.
    Protect(ProtectError),
    /// A region operation failed.
    Region(RegionError),
    /// An address lookup failed.
    Lookup(LookupError),
    /// A CPU access failed for a reason the runtime does not handle (a real segfault).
    Access(AccessError),
    /// A kernel failed (for a device that cannot fault: it touched something unmapped).
    Launch(LaunchError),
    /// The copy engine rejected a transfer.
    Dma(BoundsError),
    /// A page of an object has no frame where the runtime needs one.
    NoFrame(VirtAddr),
    /// The address is not the start of a shared object.
    NotAnObject(VirtAddr),
    /// A kernel is running: shared objects belong to the device until `sync`.
    KernelRunning,
    /// `sync` without a kernel call.
    NotRunning,
    /// A size or parameter that makes no sense (zero bytes, a block size that is not a
    /// page multiple, a rolling size of zero).
    BadArgument(&'static str),
    /// A CPU access kept faulting on an object (a runtime bug; reported, not looped on).
    FaultLoop(VirtAddr),
}

impl fmt::Display for AdsmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "adsm: {self:?}")
    }
}

impl std::error::Error for AdsmError {}

macro_rules! from {
    ($($t:ty => $v:ident),*) => {
        $(impl From<$t> for AdsmError {
            fn from(e: $t) -> Self {
                AdsmError::$v(e)
            }
        })*
    };
}
from!(HostCpuError => Host, DgpuError => Gpu, SpaceError => Space, AttachError => Attach,
      AllocError => Alloc, PopulateError => Populate, ProtectError => Protect,
      RegionError => Region, LookupError => Lookup, AccessError => Access,
      LaunchError => Launch, BoundsError => Dma);

/// Sizes of the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MachineConfig {
    /// Host memory in bytes (8 MiB of it hold page tables).
    pub host_bytes: u64,
    /// GPU video memory in bytes (1 MiB of it holds the GPU's page tables).
    pub vram_bytes: u64,
    /// GPU compute units.
    pub cus: usize,
}

impl MachineConfig {
    /// A machine with `host_bytes` of host memory and `vram_bytes` of video memory,
    /// 4 compute units.
    pub fn new(host_bytes: u64, vram_bytes: u64) -> MachineConfig {
        MachineConfig {
            host_bytes,
            vram_bytes,
            cus: 4,
        }
    }
}

/// The CPU, the GPU that cannot fault, and their shared space.
pub struct Machine {
    /// The GMEM instance.
    pub gm: Gmem,
    /// The host CPU.
    pub cpu: HostCpu,
    /// The discrete GPU (created without `FAULTABLE`).
    pub gpu: Dgpu,
    /// The GPU's id in the core.
    pub gpu_id: DeviceId,
    /// The space both are attached to (and active in).
    pub space: SpaceId,
}

impl Machine {
    /// Build the machine.
    ///
    /// # Errors
    /// [`AdsmError::Host`] or [`AdsmError::Gpu`] when a size is rejected (not page
    /// aligned, or too small for the page-table pool), [`AdsmError::Space`] or
    /// [`AdsmError::Attach`] when the core refuses the shared space or an attachment.
    pub fn new(config: MachineConfig) -> Result<Machine, AdsmError> {
        let host = HostCpuConfig {
            memory_bytes: config.host_bytes,
            ..HostCpuConfig::default()
        };
        let (gm, cpu) = HostCpu::boot(host)?;
        let mut gc = DgpuConfig::new(0, config.vram_bytes, config.cus).cannot_fault();
        gc.table_frames = 256;
        let gpu = Dgpu::new(cpu.memory_map().clone(), gc)?;
        let gpu_id = gpu.create(&gm, "dgpu")?;
        let space = gm.as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new(1 << 38),
            AllocPolicy::empty(),
        )?;
        gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)?;
        gm.as_attach(space, gpu_id, MmuMode::Coherent, Activation::Switch)?;
        Ok(Machine {
            gm,
            cpu,
            gpu,
            gpu_id,
            space,
        })
    }

    /// Run `kernel` on the GPU over `grid` and charge the bytes it moved through device
    /// memory to `tl` (charged even when the kernel fails part-way, as its traffic
    /// happened).
    ///
    /// # Errors
    /// [`AdsmError::Launch`] naming the first work-item whose access failed (e.g. an
    /// address the GPU, which cannot fault, has no mapping for); the items before it
    /// ran.
    pub fn launch(
        &self,
        tl: &mut Timeline,
        grid: Grid,
        kernel: Kernel<'_>,
    ) -> Result<(), AdsmError> {
        let before = self.gpu.stats().port;
        let r = self.gpu.launch(&self.gm, grid, kernel);
        let after = self.gpu.stats().port;
        tl.kernel(
            (after.bytes_loaded - before.bytes_loaded) + (after.bytes_stored - before.bytes_stored),
        );
        r?;
        Ok(())
    }
}
