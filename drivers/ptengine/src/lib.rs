//! # gmem-ptengine: one radix page-table engine for every MMU format
//!
//! The walk, the edits (map a run, unmap a range, protect a range), the split of large
//! leaves, the collapse of emptied tables and their reclamation, written once and
//! shared by every page-table format of gmem: x86-64 (the host CPU, the integrated GPU,
//! the IOMMU), Sv39 (real RISC-V hardware), the discrete GPU's format and EPT. A format
//! is a [`Codec`]; the memory its tables live in is a [`TableMemory`]; how concurrent
//! edits meet is a [`Discipline`]. `no_std` (with `alloc`), so the same code runs in
//! the simulator and in a kernel.
//!
//! ## Big theory statement
//!
//! **1. Vocabulary.** A *tree* is a radix tree of *table pages*: 4 KiB pages of 512
//! eight-byte *entries*, nine virtual-address bits per *level*; level 0 entries map
//! 4 KiB, an entry of level `l` maps `4 KiB << 9l` ([`level_size`]). The *root* is the
//! one table page at the top level (`codec.levels() - 1`); the core's `PageTableRoot`
//! is its physical address. An entry is *not present*, a *table* entry (pointing to
//! the table page one level down), a *leaf* (a translation of its whole span: a 4 KiB
//! leaf at level 0, a *large leaf* above), or *reserved* (valid but meaningless to the
//! format). What the bits mean is the codec's business alone; the engine only asks it
//! to decode and encode ([`Codec`]). Two hooks carry what the generic tree does not
//! know: *format bits*, opaque bits a leaf is written with ([`Run::bits`]) and a walk
//! returns in [`Leaf::bits`] (so that a TLB entry keeps them, e.g. a per-page
//! granularity bit); and *derived bits*, bits of a table entry that are a function of
//! the 512 entries of the table it points to ([`Codec::derive`], e.g. contiguity bits
//! over the leaves below).
//!
//! **2. The edit algorithm.** Map, unmap and protect are one recursive edit of a range
//! `[va, last]` (inclusive, so a range may end at the top of the address space). At a
//! table of level `l` it visits each entry the range touches; the entry is *covered
//! whole* when the range spans all of it.
//! - *Map* writes a leaf where one fits: always at level 0; at a level the codec
//!   allows large leaves at ([`Codec::large_levels`]) when the entry is covered whole,
//!   the physical address is aligned to the entry's span, and the slot is empty or a
//!   leaf (a table already there is kept and descended into). Elsewhere it descends:
//!   into the table there, into a new table installed in an empty slot, or into the
//!   table a large leaf is *split* into. A map that fails takes its whole range back
//!   (unmap), so nothing of a failed run stays mapped.
//! - *Unmap* clears leaves covered whole (and every level-0 leaf it touches); a large
//!   leaf covered in part is split first and the edit descends. *Protect* rewrites the
//!   permissions the same way.
//! - A *split* replaces a large leaf by a table of 512 leaves one level down that
//!   translate exactly as it did ([`Codec::split`]), then points the entry at it. With
//!   a *split reserve* ([`Engine::with_split_reserve`]) every large leaf keeps a table
//!   page from the moment it is mapped, so a split never allocates and unmap never
//!   fails for lack of memory.
//! - After the edit of a child table returns, if anything below changed and the
//!   entry's level has derived bits, the engine reads the child's 512 entries and
//!   rewrites the entry with [`Codec::derive`]'s result *before the edit returns*: the
//!   caller's invalidation, which follows the edit, never runs with stale derived bits,
//!   and after every edit the stored bits equal a recomputation
//!   ([`Engine::check_derived`]).
//!
//! **3. Reclamation.** A table page is *empty* when none of its entries is present.
//! The memory may count present entries per page ([`TableMemory::count`], the OS's
//! `struct page`); when it does not, the engine scans the page. Under the plain
//! discipline an unmap that leaves a child table empty unlinks it (clears the parent
//! entry) and *retires* it ([`TableMemory::retire`]): the page goes back to the memory
//! only once no page-walk cache can still hold a pointer to it, which is the memory's
//! rule to keep: [`Retirement`] (pages wait for the invalidations of the walkers that
//! used their root) for simulated device walkers, a full `sfence.vma` on a real hart. The
//! root is never reclaimed by an edit; [`Engine::free_tree`] frees a whole tree once
//! no walker uses it.
//!
//! **4. Disciplines.** [`Discipline::Plain`]: the caller serialises every edit of a
//! tree (a lock around the tree, or a core that serialises per table). Edits of
//! *different* ranges may run at once only under the concurrent disciplines, which
//! need an [`AtomicTableMemory`] (every entry access one atomic operation) and a codec
//! without large leaves or derived bits ([`Engine::concurrent`]):
//! - [`Discipline::Cas`]: a missing table is installed with a compare-exchange on the
//!   parent entry; the loser of a race frees its page and descends into the winner's
//!   table. Leaves are swapped in and out (nobody else edits them: the ranges are
//!   disjoint). Nothing counts entries, so nothing knows when a table empties: no
//!   table page is reclaimed before the tree is destroyed.
//! - [`Discipline::Rw`]: edits run as *readers* of a per-tree reader-writer lock the
//!   caller holds, install tables as above and keep atomic counts. An unmap whose
//!   decrement brought a leaf table's count to zero reports it
//!   ([`Edited::emptied`]); the caller drops the read lock, takes the write lock and
//!   calls [`Engine::collapse`], which re-checks every count on the path (a mapper may
//!   have refilled the table in between) and unlinks, bottom up, what is still empty.
//!   A writer excludes every reader, so no mapper holds a pointer to a page being
//!   unlinked.
//!
//! **5. Concurrency contract.** A hardware walk ([`Engine::walk`]) takes no lock and
//! may run during any edit: it reads each entry once, and every edit changes an entry
//! with one store (a new table is fully written before its entry is published; a
//! split table is filled before the large leaf is replaced), so a walk sees the old or
//! the new entry, never half of one. Accessed/dirty bits are set with a
//! compare-exchange so they never resurrect an entry an edit just cleared. Between
//! edits, the engine holds no state of a tree but the split reserves.
//!
//! | module | owns |
//! |---|---|
//! | [`codec`] | [`Codec`], [`Entry`], [`Leaf`], [`Run`], the address geometry |
//! | [`memory`] | [`TableMemory`], [`AtomicTableMemory`] |
//! | [`retire`] | [`Retirement`]: unlinked pages released after the walkers' invalidations |
//! | [`engine`] | [`Engine`]: the edits, the walk, reclamation, [`EditStats`] |
//! | [`counters!`] | the one statistics macro of the page-table code |

#![no_std]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]
#![forbid(unsafe_code)]

extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod codec;
pub mod engine;
pub mod memory;
pub mod mesc;
pub mod retire;
#[cfg(test)]
mod tests;

pub use codec::{index, level_shift, level_size, Codec, Entry, Leaf, Run, ENTRIES};
pub use engine::{ConfigError, Discipline, EditError, EditStats, Edited, Engine, Walked};
pub use memory::{AtomicTableMemory, TableMemory};
pub use retire::{RetireStats, Retirement, WalkerId};

/// One statistics counter: relaxed atomic adds (statistics order nothing, so they are
/// `core` atomics even in loom builds).
#[derive(Debug, Default)]
pub struct StatCounter(core::sync::atomic::AtomicU64);

impl StatCounter {
    /// Add `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, core::sync::atomic::Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(core::sync::atomic::Ordering::Relaxed)
    }
}

/// Declare a set of counters: a private struct `$counters` of [`StatCounter`]s with a
/// `snapshot()` method returning the public plain-`u64` struct `$stats`.
///
/// ```
/// gmem_ptengine::counters! {
///     /// What the driver did.
///     pub struct DriverStats in Counters {
///         /// Fences issued.
///         fences,
///     }
/// }
/// let c = Counters::default();
/// c.fences.add(2);
/// assert_eq!(c.snapshot().fences, 2);
/// ```
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $stats:ident in $counters:ident {
            $( $(#[$doc:meta])* $name:ident ),* $(,)?
        }
    ) => {
        #[derive(Debug, Default)]
        struct $counters { $( $name: $crate::StatCounter, )* }

        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        $vis struct $stats { $( $(#[$doc])* pub $name: u64, )* }

        impl $counters {
            #[allow(dead_code)]
            fn snapshot(&self) -> $stats {
                $stats { $( $name: self.$name.get(), )* }
            }
        }
    };
}
