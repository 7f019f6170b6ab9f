//! Arena statistics: a consistent snapshot of the arena's counters.

/// A snapshot of an arena's counters ([`crate::vmem::Arena::stats`]). Taken with the
/// arena lock and each cache's locks held, so `total == allocated + cached + free`
/// holds in every snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Spans added.
    pub spans: u64,
    /// Bytes in all spans.
    pub total: u64,
    /// Bytes handed to callers (through the arena or the quantum caches).
    pub allocated: u64,
    /// Bytes held in quantum caches, ready to be handed out.
    pub cached: u64,
    /// Bytes in free segments.
    pub free: u64,
    /// Successful allocations.
    pub allocs: u64,
    /// Successful frees.
    pub frees: u64,
    /// Failed allocation attempts (any [`crate::vmem::AllocError`]).
    pub failures: u64,
    /// Allocations served by a quantum cache without visiting the arena.
    pub cache_hits: u64,
    /// Allocations that found their quantum cache empty and imported from the arena.
    pub cache_misses: u64,
    /// Magazines traded between a CPU and a depot.
    pub depot_exchanges: u64,
    /// Reaps on exhaustion: an allocation found the segment layer out of space and
    /// returned every cached object to it before retrying.
    pub reaps: u64,
    /// Segments (free, allocated and cached), span markers excluded.
    pub segments: u64,
    /// Free segments.
    pub free_segments: u64,
}
