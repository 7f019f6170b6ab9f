//! The memory the tables live in, as the engine sees it.
//!
//! A [`TableMemory`] reads and writes 64-bit entries at physical addresses, hands out
//! zeroed table pages and takes them back, and may keep one piece of metadata per
//! table page: the number of present entries (as an OS keeps a `struct page`). The
//! engine never assumes more: simulated memory behind a lock, volatile physical memory
//! of a real machine and a memory of atomic words all fit.
//!
//! [`AtomicTableMemory`] marks memories whose every entry access is one atomic
//! operation, with a real compare-exchange and swap; only those may be edited under
//! the concurrent disciplines ([`crate::Discipline::Cas`], [`crate::Discipline::Rw`]).

/// Memory holding table pages.
pub trait TableMemory {
    /// The entry at `pa` (8-byte aligned); `None` when `pa` is not in the memory.
    fn read(&self, pa: u64) -> Option<u64>;
    /// Store `raw` at `pa` with one store (a concurrent walk sees the old or the new
    /// entry); `None` when `pa` is not in the memory.
    fn write(&self, pa: u64, raw: u64) -> Option<()>;
    /// Store `raw` at `pa` and return what was there. The default reads then writes,
    /// which is atomic only under the caller's serialisation.
    fn swap(&self, pa: u64, raw: u64) -> Option<u64> {
        let old = self.read(pa)?;
        self.write(pa, raw)?;
        Some(old)
    }
    /// Store `new` at `pa` if it holds `current`: `Ok(current)`, or `Err(what it
    /// holds)`. The default reads, compares and writes (atomic only under the caller's
    /// serialisation); `None` when `pa` is not in the memory.
    fn compare_exchange(&self, pa: u64, current: u64, new: u64) -> Option<Result<u64, u64>> {
        let old = self.read(pa)?;
        if old != current {
            return Some(Err(old));
        }
        self.write(pa, new)?;
        Some(Ok(old))
    }
    /// A zeroed table page (4 KiB aligned), or `None` when none is left.
    fn alloc(&self) -> Option<u64>;
    /// Give back a table page nobody can reach any more.
    fn free(&self, table: u64);
    /// Table page `table`, just unlinked from the tree of `root`, may still be cached
    /// by a page walker: free it once no walker can reach it. The default frees at
    /// once (no walker caches tables).
    fn retire(&self, root: u64, table: u64) {
        let _ = root;
        self.free(table)
    }
    /// Add `delta` to the present-entry count of table page `table` and return the new
    /// count (`delta = 0` reads it); `None` when the memory keeps no counts (the
    /// engine then scans a table to know whether it is empty).
    fn count(&self, table: u64, delta: i32) -> Option<u32> {
        let _ = (table, delta);
        None
    }
}

/// A [`TableMemory`] whose `read` is an acquire load, `write` a release store, `swap`
/// and `compare_exchange` single atomic read-modify-writes, and whose counts (if kept)
/// are atomic: the concurrent disciplines are correct only on such a memory.
pub trait AtomicTableMemory: TableMemory {}

impl<M: TableMemory + ?Sized> TableMemory for &M {
    fn read(&self, pa: u64) -> Option<u64> {
        (**self).read(pa)
    }
    fn write(&self, pa: u64, raw: u64) -> Option<()> {
        (**self).write(pa, raw)
    }
    fn swap(&self, pa: u64, raw: u64) -> Option<u64> {
        (**self).swap(pa, raw)
    }
    fn compare_exchange(&self, pa: u64, current: u64, new: u64) -> Option<Result<u64, u64>> {
        (**self).compare_exchange(pa, current, new)
    }
    fn alloc(&self) -> Option<u64> {
        (**self).alloc()
    }
    fn free(&self, table: u64) {
        (**self).free(table)
    }
    fn retire(&self, root: u64, table: u64) {
        (**self).retire(root, table)
    }
    fn count(&self, table: u64, delta: i32) -> Option<u32> {
        (**self).count(table, delta)
    }
}

impl<M: AtomicTableMemory + ?Sized> AtomicTableMemory for &M {}
