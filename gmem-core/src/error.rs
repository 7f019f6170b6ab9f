//! Error enums: one per operation, variants with payloads (`gm_ret_t`).
//!
//! Every KPI call either succeeds or returns one of these and leaves the state as it
//! was: checks come before the first change. Variants name what was wrong with which
//! value, so a driver can act on them and a test can assert them.

use crate::addr::{AddrError, PhysAddr, VirtAddr};
use crate::flags::{AllocPolicy, Prot};
use crate::handle::{DeviceId, MappingSetId, SpaceId};
use crate::mmu::{MemError, MmuError};
use crate::physmem::RegisterError;
use crate::space::Region;
use crate::vmem;
use core::fmt;

macro_rules! display_via_debug {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self, f)
            }
        }
    )*};
}

/// Errors of `dev_create`, `dev_destroy` and `dev_register_physmem`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// Frames of the device's memory still back pages of address spaces.
    MemoryInUse {
        /// How many frames.
        frames: u64,
    },
    /// The device has no [`crate::DeviceMemory`] to hold registered memory.
    NoMemoryInterface(DeviceId),
    /// The physical range was rejected.
    Register(RegisterError),
    /// The MMU reports no 4 KiB pages, which the core needs.
    No4KPages,
}

/// Errors of `as_create` and `as_destroy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
pub enum AttachError {
    /// The handle names no live address space.
    UnknownSpace(SpaceId),
    /// The handle names no live device.
    UnknownDevice(DeviceId),
    /// The device is already attached to the space.
    AlreadyAttached,
    /// The device is not attached to the space.
    NotAttached,
    /// The space already has the maximum of 32 page tables or attachments.
    TooManyAttachments,
    /// The driver could not create its page table.
    Mmu(MmuError),
}

/// Errors of `as_alloc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// Failure injected for testing.
    Injected,
}

/// Errors of the region calls: `as_lookup`, `region_dealloc`, `region_map`,
/// `region_unmap`, `region_set_policy`, `region_protect`, and of mapping sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionError {
    /// The handle names no live address space.
    UnknownSpace(SpaceId),
    /// No region of the space holds this address.
    NotAllocated(VirtAddr),
    /// The region handle is stale (deallocated before) or from another space.
    StaleRegion(Region),
    /// The handle names no live device.
    UnknownDevice(DeviceId),
    /// The placement target has no registered memory.
    NoMemory(DeviceId),
    /// `region_map` got a frame list of the wrong length.
    FrameCount {
        /// Pages in the region.
        expected: u64,
        /// Frames given.
        given: u64,
    },
    /// A frame given to `region_map` is unaligned or not registered memory of its device.
    BadFrame(PhysAddr),
    /// A frame given to `region_map` already backs a page.
    FrameInUse(PhysAddr),
    /// The region is already mapped (unmap it first).
    AlreadyMapped,
    /// The mapping-set handle is stale or from another space.
    UnknownSet(MappingSetId),
    /// The driver failed to update a page table.
    Mmu(MmuError),
    /// Protection argument out of range (empty).
    BadProt(Prot),
    /// The granularity is not a power of two between 4 KiB and 1 GiB.
    BadGranularity(u64),
    /// The space already names the most memories it can (255).
    TooManyMemories(DeviceId),
}

/// Errors of `dev_fault`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultError {
    /// The handle names no live device.
    UnknownDevice(DeviceId),
    /// The device cannot recover from faults; its memory must be wired.
    NotFaultable(DeviceId),
    /// The device is active in no address space.
    NotActive(DeviceId),
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
    /// Neither the target memory nor host memory (after eviction) has a free frame.
    OutOfMemory(DeviceId),
    /// The driver failed to update a page table.
    Mmu(MmuError),
    /// A data mover failed.
    Memory(MemError),
    /// The space already names the most memories it can (255) and cannot place a page
    /// in one more: the device's memory is refused rather than aliased.
    TooManyMemories(DeviceId),
}

display_via_debug!(
    DeviceError,
    SpaceError,
    AttachError,
    AllocError,
    RegionError,
    FaultError
);

impl From<MmuError> for FaultError {
    fn from(e: MmuError) -> Self {
        FaultError::Mmu(e)
    }
}
impl From<MemError> for FaultError {
    fn from(e: MemError) -> Self {
        FaultError::Memory(e)
    }
}
impl From<MmuError> for RegionError {
    fn from(e: MmuError) -> Self {
        RegionError::Mmu(e)
    }
}
