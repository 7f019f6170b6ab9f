//! Error enums: one per family of calls whose failures differ, variants with payloads
//! (`gm_ret_t`).
//!
//! Every KPI call either succeeds or returns one of these and leaves the state as it
//! was: checks come before the first change, and a driver failure after a change is
//! rolled back. Variants name what was wrong with which value, so a driver can act on
//! them and a test can assert them. Errors that wrap another (a region handle problem
//! inside a [`MapError`], a driver's [`MmuError`]) expose it as
//! [`core::error::Error::source`].
//!
//! | enum | calls |
//! |---|---|
//! | [`DeviceError`] | `Gmem::new`, `dev_create`, `dev_destroy`, `dev_register_physmem`, the `dev_*` queries |
//! | [`SpaceError`] | `as_create`, `as_destroy`, `as_synchronize`, the `as_*` queries, `mapping_set_create` |
//! | [`AttachError`] | `as_attach`, `dev_switch`, `dev_detach` |
//! | [`AllocError`] | `as_alloc` |
//! | [`LookupError`] | `as_lookup` |
//! | [`RegionError`] | `region_info`, `region_unmap`, `region_dealloc`, `region_unwire` |
//! | [`ProtectError`] | `region_protect` |
//! | [`PolicyError`] | `region_set_policy`, `region_set_zero_fill_block` |
//! | [`MapError`] | `region_map` |
//! | [`PopulateError`] | `region_migrate`, `region_wire` |
//! | [`SetError`] | `mapping_set_unmap`, `mapping_set_destroy` |
//! | [`FaultError`] | `dev_fault`, `dev_try_fault`, `dev_fault_in`, `dev_try_fault_in` |
//! | [`MoveError`] | inside [`FaultError::Move`] and [`PopulateError::Move`]: a page could not be allocated, filled, moved or mapped |

use crate::addr::{AddrError, PhysAddr, VaRange, VirtAddr};
use crate::flags::{AllocPolicy, Prot};
use crate::handle::{DeviceId, MappingSetId, Region, SpaceId};
use crate::mmu::{MemError, MmuError};
use crate::physmem::RegisterError;
use crate::vmem;
use core::fmt;

/// Errors of `Gmem::new`, `dev_create`, `dev_destroy`, `dev_register_physmem` and the
/// device queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceError {
    /// The handle names no live device.
    UnknownDevice(DeviceId),
    /// The host CPU device cannot be destroyed while the instance lives.
    IsHost,
    /// The device is still attached to this many address spaces.
    StillAttached {
        /// How many.
        spaces: usize,
    },
    /// Frames of the device's memory (managed, or given to `region_map`) still back
    /// pages of address spaces.
    MemoryInUse {
        /// How many frames.
        frames: u64,
    },
    /// A page-table edit or TLB invalidation that names the device is still running
    /// in another thread (a table it was the last user of, kept until an unlocked
    /// edit ends, or a strict `region_dealloc`'s invalidation listed before it
    /// detached): nothing changed; destroy it once that call has returned.
    EditsInFlight,
    /// The device has no [`crate::DeviceMemory`] to hold registered memory.
    NoMemoryInterface(DeviceId),
    /// The physical range was rejected.
    Register(RegisterError),
    /// The MMU reports no 4 KiB pages, which the core needs.
    No4KPages,
}

/// Errors of `as_create`, `as_destroy`, `as_synchronize`, the space queries and
/// `mapping_set_create`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpaceError {
    /// The handle names no live address space.
    UnknownSpace(SpaceId),
    /// `[begin, end)` is empty, unaligned or overflows.
    BadRange(AddrError),
    /// More than one fit flag.
    BadPolicy(AllocPolicy),
}

/// Errors of `as_attach`, `dev_switch` and `dev_detach`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttachError {
    /// The handle names no live address space.
    UnknownSpace(SpaceId),
    /// The handle names no live device (or one being destroyed).
    UnknownDevice(DeviceId),
    /// The device is already attached to the space.
    AlreadyAttached,
    /// The device is not attached to the space.
    NotAttached,
    /// The space already has the maximum of 32 page tables or attachments.
    TooManyAttachments,
    /// The driver could not create or fill its page table.
    Mmu(MmuError),
}

/// Errors of `as_alloc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllocError {
    /// The handle names no live address space.
    UnknownSpace(SpaceId),
    /// Size, alignment, no-cross or hint are not page multiples / powers of two.
    BadArgument(AddrError),
    /// The constraints contradict each other.
    BadConstraint(vmem::ConstraintProblem),
    /// No free range satisfies the request.
    NoSpace {
        /// The size asked for.
        size: u64,
    },
    /// Failure injected for testing (`as_fail_every`, feature `test-util`).
    #[cfg(feature = "test-util")]
    Injected,
}

/// Errors of `as_lookup`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LookupError {
    /// The handle names no live address space.
    UnknownSpace(SpaceId),
    /// No region of the space holds this address.
    NotAllocated(VirtAddr),
}

/// Errors of the calls that only resolve a region handle: `region_info`,
/// `region_unmap`, `region_dealloc`, `region_unwire`. The other region calls wrap it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegionError {
    /// The handle's address space is gone.
    UnknownSpace(SpaceId),
    /// The region handle is stale (deallocated before).
    StaleRegion(Region),
    /// The range of a range call ([`crate::Pages`]) is empty or not page-aligned, or a
    /// range given with a region is not inside it.
    BadRange(VaRange),
    /// A range call over a space's range ([`crate::Pages::range`]): no region holds
    /// this page of the range (the first such page); nothing changed.
    Unallocated(VirtAddr),
}

/// Errors of `region_protect`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtectError {
    /// The region handle does not resolve.
    Region(RegionError),
    /// Protection argument with bits no protection has.
    BadProt(Prot),
    /// The driver failed to change a page table (every change was rolled back).
    Mmu(MmuError),
}

/// Errors of `region_set_policy` and `region_set_zero_fill_block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// The region handle does not resolve.
    Region(RegionError),
    /// The placement target names no live device.
    UnknownDevice(DeviceId),
    /// The placement target has no registered memory.
    NoMemory(DeviceId),
    /// The zero-fill block size is not a power of two between 4 KiB and 1 GiB.
    BadZeroFillBlock(u64),
}

/// Errors of `region_map`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MapError {
    /// The region handle does not resolve.
    Region(RegionError),
    /// The memory device names no live device (or one being destroyed).
    UnknownDevice(DeviceId),
    /// Protection argument out of range (empty).
    BadProt(Prot),
    /// The frame list does not have one frame per page of the region.
    FrameCount {
        /// Pages in the region.
        expected: u64,
        /// Frames given.
        given: u64,
    },
    /// A frame is not page aligned, or lies in memory the core manages for the device
    /// (caller-given frames must stay outside it).
    BadFrame(PhysAddr),
    /// The region is already mapped, or some of its pages are populated (unmap first).
    AlreadyMapped,
    /// The mapping-set handle is stale or from another space.
    UnknownSet(MappingSetId),
    /// The space already names the most memories it can (255).
    TooManyMemories(DeviceId),
    /// The driver failed to update a page table (nothing of the map remains).
    Mmu(MmuError),
}

/// Errors of `region_migrate` and `region_wire`: the calls that allocate, zero-fill or
/// move pages outside a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PopulateError {
    /// The region handle does not resolve.
    Region(RegionError),
    /// The target names no live device.
    UnknownDevice(DeviceId),
    /// Allocating, filling or moving a page failed (shared with [`FaultError::Move`]).
    Move(MoveError),
    /// `dev_evacuate` of the host, whose memory is where evacuated pages go.
    IsHost,
    /// `region_alloc_private`: the device is not attached to the region's space.
    NotAttached(DeviceId),
    /// `region_alloc_private`: the device can fault, has no memory, or shares its
    /// page table with another device (any of which would let a private frame leak).
    CannotHoldPrivate(DeviceId),
}

/// Errors of `mapping_set_unmap` and `mapping_set_destroy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SetError {
    /// The handle names no live address space.
    UnknownSpace(SpaceId),
    /// The mapping-set handle is stale or from another space.
    UnknownSet(MappingSetId),
}

/// Errors of `dev_fault`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultError {
    /// The handle names no live device.
    UnknownDevice(DeviceId),
    /// The device cannot recover from faults; its memory must be wired.
    NotFaultable(DeviceId),
    /// The device is active in no address space.
    NotActive(DeviceId),
    /// `dev_fault_in`: the handle names no live address space.
    UnknownSpace(SpaceId),
    /// `dev_fault_in`: the device is not attached to the named space.
    NotAttached(DeviceId),
    /// No region holds the address.
    NotAllocated(VirtAddr),
    /// The region holds the address, but it was explicitly unmapped: nothing backs it.
    NotMapped(VirtAddr),
    /// The access is not permitted.
    ProtectionViolation {
        /// The faulting address.
        va: VirtAddr,
        /// The access attempted.
        access: Prot,
        /// What the region permits.
        allowed: Prot,
    },
    /// Allocating, filling, moving or mapping the page failed (shared with
    /// [`PopulateError::Move`]).
    Move(MoveError),
    /// Another call is editing the page's translations right now (an unlocked
    /// `region_map` of its region, see [`crate::Mmu::concurrent_edits`]): nothing
    /// changed; retry the access (it succeeds once that call has returned).
    Busy(VirtAddr),
    /// The page thrashes and the faulting device is throttled (thrashing detection,
    /// [`crate::Gmem::as_set_thrashing`]): nothing changed; retry the access later
    /// (another processor has the page for the current throttling period).
    Throttled(VirtAddr),
    /// `dev_fault_batch`: the batch itself is malformed (empty, larger than the
    /// device's batch size, or a record with no access); nothing was serviced.
    Batch(crate::policy::batch::BatchError),
}

/// Why the core could not allocate, fill, move or map a page: the failures the fault
/// path shares with `region_migrate`, `region_wire`, `region_alloc_private` and
/// `dev_evacuate`, carried by [`FaultError::Move`] and [`PopulateError::Move`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MoveError {
    /// Neither the target memory nor host memory (after eviction) has a free frame.
    OutOfMemory(DeviceId),
    /// The space already names the most memories it can (255) and cannot place a page
    /// in one more: the device's memory is refused rather than aliased.
    TooManyMemories(DeviceId),
    /// The driver failed to update a page table.
    Mmu(MmuError),
    /// A data mover failed.
    Memory(MemError),
}

impl From<MmuError> for MoveError {
    fn from(e: MmuError) -> Self {
        MoveError::Mmu(e)
    }
}
impl From<MemError> for MoveError {
    fn from(e: MemError) -> Self {
        MoveError::Memory(e)
    }
}
impl From<MoveError> for FaultError {
    fn from(e: MoveError) -> Self {
        FaultError::Move(e)
    }
}
impl From<MoveError> for PopulateError {
    fn from(e: MoveError) -> Self {
        PopulateError::Move(e)
    }
}
impl From<MmuError> for FaultError {
    fn from(e: MmuError) -> Self {
        FaultError::Move(MoveError::Mmu(e))
    }
}
impl From<MemError> for FaultError {
    fn from(e: MemError) -> Self {
        FaultError::Move(MoveError::Memory(e))
    }
}
impl From<MmuError> for ProtectError {
    fn from(e: MmuError) -> Self {
        ProtectError::Mmu(e)
    }
}
impl From<MmuError> for MapError {
    fn from(e: MmuError) -> Self {
        MapError::Mmu(e)
    }
}
macro_rules! from_region {
    ($($t:ident),*) => {$(
        impl From<RegionError> for $t {
            fn from(e: RegionError) -> Self {
                $t::Region(e)
            }
        }
    )*};
}
from_region!(ProtectError, PolicyError, MapError, PopulateError);

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::UnknownDevice(d) => write!(f, "no live device {d}"),
            DeviceError::IsHost => f.write_str("the host CPU device cannot be destroyed"),
            DeviceError::EditsInFlight => f.write_str(
                "a page-table edit or invalidation naming the device is still in flight",
            ),
            DeviceError::StillAttached { spaces } => {
                write!(f, "device still attached to {spaces} address space(s)")
            }
            DeviceError::MemoryInUse { frames } => {
                write!(
                    f,
                    "{frames} frame(s) of the device's memory still back pages"
                )
            }
            DeviceError::NoMemoryInterface(d) => {
                write!(f, "device {d} has no data mover for registered memory")
            }
            DeviceError::Register(e) => write!(f, "physical memory rejected: {e}"),
            DeviceError::No4KPages => f.write_str("the MMU does not map 4 KiB pages"),
        }
    }
}

impl fmt::Display for SpaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpaceError::UnknownSpace(s) => write!(f, "no live address space {s}"),
            SpaceError::BadRange(e) => write!(f, "bad address-space range: {e}"),
            SpaceError::BadPolicy(p) => write!(f, "allocation policy {p:?} names two fits"),
        }
    }
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::UnknownSpace(s) => write!(f, "no live address space {s}"),
            AttachError::UnknownDevice(d) => write!(f, "no live device {d}"),
            AttachError::AlreadyAttached => f.write_str("device already attached to the space"),
            AttachError::NotAttached => f.write_str("device not attached to the space"),
            AttachError::TooManyAttachments => {
                f.write_str("the space already has 32 page tables or attachments")
            }
            AttachError::Mmu(e) => write!(f, "driver failed on the page table: {e}"),
        }
    }
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::UnknownSpace(s) => write!(f, "no live address space {s}"),
            AllocError::BadArgument(e) => write!(f, "bad allocation argument: {e}"),
            AllocError::BadConstraint(p) => write!(f, "contradictory constraints: {p:?}"),
            AllocError::NoSpace { size } => write!(f, "no free range of {size:#x} bytes"),
            #[cfg(feature = "test-util")]
            AllocError::Injected => f.write_str("allocation failure injected for testing"),
        }
    }
}

impl fmt::Display for LookupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LookupError::UnknownSpace(s) => write!(f, "no live address space {s}"),
            LookupError::NotAllocated(va) => write!(f, "no region holds {va:?}"),
        }
    }
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::UnknownSpace(s) => write!(f, "the region's address space {s} is gone"),
            RegionError::StaleRegion(r) => {
                write!(f, "stale region handle at {:?} (deallocated)", r.start)
            }
            RegionError::BadRange(r) => write!(
                f,
                "range {:?}+{:#x} is empty, unaligned or outside the region",
                r.start, r.len
            ),
            RegionError::Unallocated(va) => write!(f, "no region holds {va:?} of the range"),
        }
    }
}

impl fmt::Display for ProtectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtectError::Region(e) => e.fmt(f),
            ProtectError::BadProt(p) => write!(f, "protection {p:?} out of range"),
            ProtectError::Mmu(e) => write!(f, "driver failed to change protection: {e}"),
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Region(e) => e.fmt(f),
            PolicyError::UnknownDevice(d) => write!(f, "placement target {d} is no live device"),
            PolicyError::NoMemory(d) => write!(f, "placement target {d} has no memory"),
            PolicyError::BadZeroFillBlock(g) => {
                write!(
                    f,
                    "zero-fill block {g:#x} is not a power of two in 4 KiB..=1 GiB"
                )
            }
        }
    }
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapError::Region(e) => e.fmt(f),
            MapError::UnknownDevice(d) => write!(f, "memory device {d} is no live device"),
            MapError::BadProt(p) => write!(f, "protection {p:?} out of range"),
            MapError::FrameCount { expected, given } => {
                write!(f, "{given} frame(s) given for {expected} page(s)")
            }
            MapError::BadFrame(pa) => {
                write!(f, "frame {pa:?} is unaligned or in memory the core manages")
            }
            MapError::AlreadyMapped => f.write_str("region already mapped or populated"),
            MapError::UnknownSet(s) => write!(f, "no live mapping set {s}"),
            MapError::TooManyMemories(d) => {
                write!(f, "the space names 255 memories and cannot name {d}'s")
            }
            MapError::Mmu(e) => write!(f, "driver failed to map: {e}"),
        }
    }
}

impl fmt::Display for PopulateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PopulateError::Region(e) => e.fmt(f),
            PopulateError::UnknownDevice(d) => write!(f, "target {d} is no live device"),
            PopulateError::Move(e) => e.fmt(f),
            PopulateError::IsHost => write!(f, "host memory cannot be evacuated"),
            PopulateError::NotAttached(d) => write!(f, "{d} is not attached to the space"),
            PopulateError::CannotHoldPrivate(d) => write!(
                f,
                "{d} cannot hold private frames (it faults, has no memory or shares its table)"
            ),
        }
    }
}

impl fmt::Display for SetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetError::UnknownSpace(s) => write!(f, "no live address space {s}"),
            SetError::UnknownSet(s) => write!(f, "no live mapping set {s}"),
        }
    }
}

impl fmt::Display for FaultError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultError::UnknownDevice(d) => write!(f, "no live device {d}"),
            FaultError::NotFaultable(d) => write!(f, "device {d} cannot take faults"),
            FaultError::NotActive(d) => write!(f, "device {d} is active in no address space"),
            FaultError::UnknownSpace(s) => write!(f, "no live address space {s}"),
            FaultError::NotAttached(d) => write!(f, "device {d} is not attached to the space"),
            FaultError::NotAllocated(va) => write!(f, "no region holds {va:?}"),
            FaultError::NotMapped(va) => write!(f, "{va:?} was unmapped: nothing backs it"),
            FaultError::ProtectionViolation {
                va,
                access,
                allowed,
            } => write!(
                f,
                "{access:?} access to {va:?} where the region allows {allowed:?}"
            ),
            FaultError::Move(e) => e.fmt(f),
            FaultError::Throttled(va) => {
                write!(
                    f,
                    "{va:?} thrashes and this device is throttled: retry later"
                )
            }
            FaultError::Busy(va) => {
                write!(
                    f,
                    "{va:?} is being mapped by another call: retry the access"
                )
            }
            FaultError::Batch(e) => e.fmt(f),
        }
    }
}

impl core::error::Error for DeviceError {}
impl core::error::Error for SpaceError {}
impl core::error::Error for AllocError {}
impl core::error::Error for LookupError {}
impl core::error::Error for RegionError {}
impl core::error::Error for SetError {}

impl core::error::Error for AttachError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            AttachError::Mmu(e) => Some(e),
            _ => None,
        }
    }
}

impl core::error::Error for ProtectError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            ProtectError::Region(e) => Some(e),
            ProtectError::Mmu(e) => Some(e),
            ProtectError::BadProt(_) => None,
        }
    }
}

impl core::error::Error for PolicyError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            PolicyError::Region(e) => Some(e),
            _ => None,
        }
    }
}

impl core::error::Error for MapError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            MapError::Region(e) => Some(e),
            MapError::Mmu(e) => Some(e),
            _ => None,
        }
    }
}

impl core::error::Error for PopulateError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            PopulateError::Region(e) => Some(e),
            PopulateError::Move(e) => Some(e),
            _ => None,
        }
    }
}

impl core::error::Error for FaultError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            FaultError::Move(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Display for MoveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MoveError::OutOfMemory(d) => {
                write!(f, "no free frame in {d}'s memory, even after eviction")
            }
            MoveError::TooManyMemories(d) => {
                write!(f, "the space names 255 memories and cannot name {d}'s")
            }
            MoveError::Mmu(e) => write!(f, "driver failed: {e}"),
            MoveError::Memory(e) => write!(f, "data mover failed: {e}"),
        }
    }
}

impl core::error::Error for MoveError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            MoveError::Mmu(e) => Some(e),
            MoveError::Memory(e) => Some(e),
            _ => None,
        }
    }
}
