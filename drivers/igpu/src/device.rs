//! The integrated GPU device: creation in the core, kernels, loads and stores.
//!
//! The device-independent part of the driver: the GPU has no memory of its own (its
//! pages are placed in host memory), so creating it is one `dev_create` with the
//! `FAULTABLE` capability; everything it runs (kernels, and single loads and stores
//! through [`Igpu::port`]) goes through its [`Port`], which turns translation misses
//! into `dev_fault` and retries.

use crate::mmu::{igpu_tlbs, IgpuMmu};
use gmem_core::{DevCaps, DeviceDesc, DeviceError, DeviceId, Gmem};
use gmem_sim::RadixTables;
use gmem_sim::{
    AccessError, Grid, HierarchyConfig, LaunchError, LaunchStats, MemoryMap, MmuStats, Port,
    PortStats, SimMmu, TlbConfigError, WorkItem,
};
use gmem_x86pt::X86Codec;

type X86Tables = RadixTables<X86Codec>;
use std::sync::Arc;

/// Why the integrated GPU could not be built or created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IgpuError {
    /// The TLB geometry was rejected.
    Tlb(TlbConfigError),
    /// The core refused the device.
    Device(DeviceError),
    /// The GPU was already created in an instance.
    AlreadyCreated(DeviceId),
}

/// Counters of the integrated GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IgpuStats {
    /// Loads, stores and faults.
    pub port: PortStats,
    /// TLBs, walks, invalidations.
    pub mmu: MmuStats,
}

/// A simulated faultable integrated GPU.
pub struct Igpu {
    mmu: Arc<IgpuMmu>,
    port: Port,
}

impl Igpu {
    /// A GPU with `compute_units` CUs walking the machine's x86 `tables`, resolving
    /// physical addresses through `map` (both from the host CPU).
    ///
    /// # Errors
    /// [`IgpuError::Tlb`]: [`TlbConfigError::NoUnits`] for zero `compute_units`
    /// (the TLB sizes of [`igpu_tlbs`] are valid). Nothing is changed on failure.
    pub fn new(
        tables: Arc<X86Tables>,
        map: Arc<MemoryMap>,
        compute_units: usize,
    ) -> Result<Igpu, IgpuError> {
        Igpu::with_tlbs(tables, map, igpu_tlbs(compute_units))
    }

    /// The same with translation caches of geometry `tlbs`.
    ///
    /// # Errors
    /// [`IgpuError::Tlb`]: `tlbs` has no compute unit, or a TLB with zero sets or ways
    /// or more than 2^20 entries. Nothing is changed on failure.
    pub fn with_tlbs(
        tables: Arc<X86Tables>,
        map: Arc<MemoryMap>,
        tlbs: HierarchyConfig,
    ) -> Result<Igpu, IgpuError> {
        let mmu = Arc::new(SimMmu::new(tables, tlbs).map_err(IgpuError::Tlb)?);
        let port = Port::new(mmu.clone(), map, None);
        Ok(Igpu { mmu, port })
    }

    /// Create the device in `gm` (faultable, no local memory).
    ///
    /// # Errors
    /// - [`IgpuError::AlreadyCreated`]: this GPU was already created (in `gm` or in
    ///   another instance); nothing is changed. (Of two `create` calls racing on one
    ///   GPU, the loser gets it after destroying the device it had made in `gm`.)
    /// - [`IgpuError::Device`]: `gm` refused the device; nothing is changed. The core
    ///   refuses only an MMU without 4 KiB pages ([`DeviceError::No4KPages`]), which
    ///   an MMU walking x86-64 tables never is.
    pub fn create(&self, gm: &Gmem, name: &str) -> Result<DeviceId, IgpuError> {
        if let Some(id) = self.port.id() {
            return Err(IgpuError::AlreadyCreated(id));
        }
        let id = gm
            .dev_create(DeviceDesc {
                name: name.into(),
                mmu: self.mmu.clone(),
                memory: None,
                caps: DevCaps::FAULTABLE,
                data: None,
            })
            .map_err(IgpuError::Device)?;
        if let Err(winner) = self.port.bind(id) {
            // Another `create` on this GPU won the race: the device made here goes.
            let _ = gm.dev_destroy(id);
            return Err(IgpuError::AlreadyCreated(winner));
        }
        Ok(id)
    }

    /// The core's id of the GPU, once created.
    pub fn id(&self) -> Option<DeviceId> {
        self.port.id()
    }

    /// The GPU's MMU.
    pub fn mmu(&self) -> &Arc<IgpuMmu> {
        &self.mmu
    }

    /// The GPU's memory port.
    pub fn port(&self) -> &Port {
        &self.port
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> IgpuStats {
        IgpuStats {
            port: self.port.stats(),
            mmu: self.mmu.stats(),
        }
    }

    /// Run `kernel` over `grid`; work-group `g` runs on CU `g % compute units`.
    ///
    /// # Errors
    /// A [`LaunchError`] naming the first work-item whose `kernel` returned an
    /// [`AccessError`] (e.g. [`AccessError::NotCreated`] before [`Igpu::create`], or a
    /// fault the core could not serve); the launch stops there, and the loads, stores
    /// and faults of the items before it have taken effect.
    pub fn launch<K>(&self, gm: &Gmem, grid: Grid, kernel: K) -> Result<LaunchStats, LaunchError>
    where
        K: FnMut(&WorkItem<'_>) -> Result<(), AccessError>,
    {
        self.port.launch(gm, grid, kernel)
    }
}
