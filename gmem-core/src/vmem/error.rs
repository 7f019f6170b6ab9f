//! Errors of the vmem arena: one enum per operation, every variant carrying the values
//! that explain it. A call that returns an error has changed nothing in the arena
//! (apart from the failure counter of [`crate::vmem::ArenaStats`]).

use core::fmt;

/// Why [`crate::vmem::Arena::new`] rejected a configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArenaError {
    /// The quantum is zero or not a power of two.
    BadQuantum {
        /// The rejected quantum.
        quantum: u64,
    },
    /// `qcache_max` is not a multiple of the quantum or asks for more than
    /// [`crate::vmem::MAX_QCACHE_CLASSES`] size classes.
    BadQcacheMax {
        /// The rejected limit.
        qcache_max: u64,
    },
}

impl fmt::Display for ArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::BadQuantum { quantum } => {
                write!(f, "quantum {quantum:#x} is not a non-zero power of two")
            }
            Self::BadQcacheMax { qcache_max } => write!(
                f,
                "qcache_max {qcache_max:#x} is not a multiple of the quantum \
                 or exceeds {} quanta",
                super::MAX_QCACHE_CLASSES
            ),
        }
    }
}

/// Why [`crate::vmem::Arena::add_span`] rejected a span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpanError {
    /// The span has size zero.
    Empty,
    /// The base or the size is not a multiple of the quantum.
    Unaligned {
        /// Requested base.
        base: u64,
        /// Requested size.
        size: u64,
        /// The arena's quantum.
        quantum: u64,
    },
    /// The span would end beyond 2^64 (`base + size - 1` overflows), or the arena's
    /// bookkeeping would overflow (its total size would reach 2^64, or its segment
    /// table is full).
    Overflow {
        /// Requested base.
        base: u64,
        /// Requested size.
        size: u64,
    },
    /// The span overlaps a span already in the arena.
    Overlaps {
        /// Requested base.
        base: u64,
        /// Requested size.
        size: u64,
    },
}

impl fmt::Display for SpanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Empty => write!(f, "span is empty"),
            Self::Unaligned {
                base,
                size,
                quantum,
            } => write!(
                f,
                "span [{base:#x}, +{size:#x}) is not aligned to the quantum {quantum:#x}"
            ),
            Self::Overflow { base, size } => write!(
                f,
                "span [{base:#x}, +{size:#x}) overflows the address space or the arena"
            ),
            Self::Overlaps { base, size } => {
                write!(f, "span [{base:#x}, +{size:#x}) overlaps an existing span")
            }
        }
    }
}

/// Why a constraint given to [`crate::vmem::Arena::xalloc`] can never be satisfied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConstraintProblem {
    /// `align` is neither zero nor a power of two.
    AlignNotPowerOfTwo,
    /// `phase` is not below the alignment (the quantum when `align` is 0).
    PhaseNotBelowAlign,
    /// `phase` is not a multiple of the quantum.
    PhaseNotQuantumMultiple,
    /// `nocross` is neither zero nor a power of two.
    NocrossNotPowerOfTwo,
    /// `nocross` is smaller than the size: every placement would cross a boundary.
    NocrossSmallerThanSize,
    /// Every address with the requested alignment and phase crosses a `nocross`
    /// boundary (`phase % nocross + size > nocross`).
    NocrossConflictsWithPhase,
    /// `min` is above `max`.
    MinAboveMax,
    /// The window `[min, max]` (after rounding `min` up to the quantum) is smaller than
    /// the size.
    WindowSmallerThanSize,
}

impl fmt::Display for ConstraintProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::AlignNotPowerOfTwo => "align is not zero or a power of two",
            Self::PhaseNotBelowAlign => "phase is not below the alignment",
            Self::PhaseNotQuantumMultiple => "phase is not a multiple of the quantum",
            Self::NocrossNotPowerOfTwo => "nocross is not zero or a power of two",
            Self::NocrossSmallerThanSize => "nocross is smaller than the size",
            Self::NocrossConflictsWithPhase => {
                "every address with this alignment and phase crosses a nocross boundary"
            }
            Self::MinAboveMax => "min is above max",
            Self::WindowSmallerThanSize => "the window [min, max] is smaller than the size",
        })
    }
}

/// Why an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllocError {
    /// A zero-sized allocation was requested.
    ZeroSize,
    /// The size is not a multiple of the quantum.
    Unaligned {
        /// Requested size.
        size: u64,
        /// The arena's quantum.
        quantum: u64,
    },
    /// The constraint can never be satisfied.
    BadConstraint {
        /// What is wrong with it.
        reason: ConstraintProblem,
    },
    /// No free segment can hold the request (after reaping the quantum caches).
    NoSpace {
        /// Requested size.
        size: u64,
    },
    /// Failure injection (`Arena::set_fail_every`, feature `test-util`) failed this attempt.
    #[cfg(feature = "test-util")]
    Injected,
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::ZeroSize => write!(f, "zero-sized allocation"),
            Self::Unaligned { size, quantum } => write!(
                f,
                "size {size:#x} is not a multiple of the quantum {quantum:#x}"
            ),
            Self::BadConstraint { reason } => write!(f, "unsatisfiable constraint: {reason}"),
            Self::NoSpace { size } => write!(f, "no free segment of {size:#x} bytes"),
            #[cfg(feature = "test-util")]
            Self::Injected => write!(f, "injected allocation failure"),
        }
    }
}

/// Why a free was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FreeError {
    /// Nothing is allocated at this address (never allocated, or already freed).
    NotAllocated {
        /// The address given.
        addr: u64,
    },
    /// The allocation at this address has another size.
    SizeMismatch {
        /// The address given.
        addr: u64,
        /// The size it was allocated with.
        allocated: u64,
        /// The size given.
        given: u64,
    },
    /// The address or the size is not a multiple of the quantum, or the size is zero.
    Unaligned {
        /// The address given.
        addr: u64,
        /// The size given.
        size: u64,
    },
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::NotAllocated { addr } => write!(f, "nothing allocated at {addr:#x}"),
            Self::SizeMismatch {
                addr,
                allocated,
                given,
            } => write!(
                f,
                "allocation at {addr:#x} has size {allocated:#x}, not {given:#x}"
            ),
            Self::Unaligned { addr, size } => write!(
                f,
                "free of [{addr:#x}, +{size:#x}) is empty or not aligned to the quantum"
            ),
        }
    }
}
