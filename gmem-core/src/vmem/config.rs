//! Arena configuration: the quantum, the quantum-cache limit, the magazine switch, free
//! validation and the default fit policy.
//!
//! An [`ArenaConfig`] is plain data; [`crate::vmem::Arena::new`] validates it and
//! returns [`crate::vmem::ArenaError`] when it is unusable.

/// How the arena chooses a free segment for an allocation (`VM_INSTANTFIT`,
/// `VM_BESTFIT`, `VM_FIRSTFIT`, `VM_NEXTFIT` in illumos).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FitPolicy {
    /// Constant time: the head of the smallest size-class freelist whose every
    /// segment is large enough (exact classes below 64 quanta, so a good fit; see the
    /// theory statement, section 4).
    #[default]
    InstantFit,
    /// The smallest free segment that fits (searches the size's freelists upward).
    BestFit,
    /// The fitting free segment at the lowest address.
    FirstFit,
    /// The first fitting free segment at or after a rotor that follows the previous
    /// next-fit allocation, wrapping around: addresses are reused as late as possible.
    NextFit,
}

/// Parameters of an arena, fixed at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaConfig {
    /// The unit of allocation, a power of two: every span base and size, every
    /// allocation size and address is a multiple of it.
    pub quantum: u64,
    /// Sizes up to and including this (a multiple of `quantum`, at most
    /// [`crate::vmem::MAX_QCACHE_CLASSES`] quanta) are served by per-size quantum
    /// caches; `0` disables the caches. Next-fit allocations bypass the caches, so an arena whose `fit` is
    /// [`FitPolicy::NextFit`] gains nothing from them.
    pub qcache_max: u64,
    /// Quantum caches use per-CPU magazines and a depot (Bonwick & Adams 2001) when
    /// `true`, one locked stack per size class when `false`.
    pub magazines: bool,
    /// Validate every free, including frees of cached sizes, against a set of
    /// outstanding cached objects. When `false`, a free of a cached size is trusted and
    /// goes straight into its cache: the caller (e.g. an address space, which checks its
    /// own region map before freeing) guarantees it frees only what it allocated, with
    /// the same size. Frees of other sizes are always validated through the
    /// allocated-segment hash.
    pub check_frees: bool,
    /// The policy [`crate::vmem::Arena::alloc`] uses.
    pub fit: FitPolicy,
}

impl ArenaConfig {
    /// A configuration with the given quantum, no quantum caches, validated frees and
    /// instant-fit.
    pub fn new(quantum: u64) -> Self {
        Self {
            quantum,
            qcache_max: 0,
            magazines: false,
            check_frees: true,
            fit: FitPolicy::InstantFit,
        }
    }
}
