//! The values a caller picks for a space and reads back: how a device's table
//! relates to the others ([`MmuMode`]), whether attaching switches the device
//! ([`Activation`]), a region's placement ([`Placement`]), a region request
//! ([`AllocRequest`]) and a region's description ([`RegionInfo`]). Plain values: this
//! module depends on nothing of the space.

use crate::addr::{VaRange, VirtAddr};
use crate::flags::Prot;
use crate::handle::{DeviceId, Region};
use crate::mmu::Attrs;

/// Maximum page tables and attachments per space (one bit each in a page entry).
pub const MAX_TABLES: usize = 32;

/// How a device's page table relates to the others of the space (`gm_mmu_mode_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmuMode {
    /// Use the same page table as an attached device of the same format; falls back to
    /// [`MmuMode::Coherent`] when there is none.
    Shared,
    /// A page table of its own, kept coherent by the core; filled by faults (or, for a
    /// device that cannot fault, with every wired page).
    Coherent,
    /// A page table of its own that mirrors every populated page eagerly, for devices
    /// that must see all memory without faulting.
    Replicate,
}

/// Whether `as_attach` also makes the space the device's active one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// Switch the device to the space, as [`crate::Gmem::dev_switch`] does.
    Switch,
    /// Leave the device active where it is (or nowhere).
    Leave,
}

/// Where a fault places a page that has no frame yet (`gm_region_placement_t`'s device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementTarget {
    /// The faulting device's local memory, or host memory when it has none.
    Faulting,
    /// This device's memory.
    Device(DeviceId),
    /// Host memory.
    Host,
}

/// What a fault does with a page that lives elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementMode {
    /// One mapping at a time: tear down every other mapping, migrate the page to the
    /// target, map it for the faulter.
    Unique,
    /// Map the frame where it is (remote access); a fault from a device that already
    /// maps the page remotely is the hint to migrate it.
    RemoteAccess,
}

/// A region's placement policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Where new pages go.
    pub target: PlacementTarget,
    /// Migration or remote access.
    pub mode: PlacementMode,
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            target: PlacementTarget::Faulting,
            mode: PlacementMode::Unique,
        }
    }
}

/// A public description of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// The handle.
    pub region: Region,
    /// The range.
    pub range: VaRange,
    /// Permitted accesses.
    pub prot: Prot,
    /// Placement policy.
    pub placement: Placement,
    /// Zero-fill block size in bytes (0 = the faulting device's largest page size up
    /// to 2 MiB).
    pub zero_fill_block: u64,
    /// Whether `region_map` gave it wired frames.
    pub mapped: bool,
    /// The driver's attributes of its pages (`region_set_attrs`; a range call may
    /// have given some pages others).
    pub attrs: Attrs,
}

/// A constrained region request (`gm_as_alloc`'s arguments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocRequest {
    /// Where to look first (0 = anywhere).
    pub hint: VirtAddr,
    /// Size in bytes, a multiple of 4 KiB.
    pub size: u64,
    /// Alignment (0 = page).
    pub align: u64,
    /// The region must not cross a multiple of this (0 = no constraint).
    pub nocross: u64,
    /// The last address the region may cover (`u64::MAX` = no limit).
    pub max: VirtAddr,
}

impl AllocRequest {
    /// `size` bytes anywhere.
    pub const fn new(size: u64) -> AllocRequest {
        AllocRequest {
            hint: VirtAddr::new(0),
            size,
            align: 0,
            nocross: 0,
            max: VirtAddr::new(u64::MAX),
        }
    }
}
