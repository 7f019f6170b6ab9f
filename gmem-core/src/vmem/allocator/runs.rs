//! Runs of allocations: splitting one allocation into equal pieces that can be freed
//! one by one, and freeing consecutive pieces as one segment (frame runs allocated at
//! once and released page by page, or the reverse). Both validate every piece before
//! changing anything, so state is unchanged on error.

use super::super::error::FreeError;
use super::super::seglist::{Kind, Seg};
use super::SegmentAllocator;

impl SegmentAllocator {
    /// Turn the caller's allocation `[addr, addr + size)` into `size / piece`
    /// allocations of `piece` bytes each, so that its parts can be freed one by one (a
    /// run of frames allocated at once and released page by page). State is unchanged
    /// on error.
    pub fn split(&mut self, addr: u64, size: u64, piece: u64) -> Result<(), FreeError> {
        let Some(i) = self.hash.get(addr, &self.table) else {
            return Err(FreeError::NotAllocated { addr });
        };
        let seg = *self.table.get(i);
        if seg.kind() != Kind::Alloc {
            return Err(FreeError::NotAllocated { addr });
        }
        if seg.size != size {
            return Err(FreeError::SizeMismatch {
                addr,
                allocated: seg.size,
                given: size,
            });
        }
        if piece == 0 || piece & (self.quantum - 1) != 0 || size % piece != 0 {
            return Err(FreeError::Unaligned { addr, size: piece });
        }
        let n = size / piece;
        if n > u32::MAX as u64 || !self.table.can_take(n as usize) {
            return Err(FreeError::Unaligned { addr, size: piece });
        }
        self.table.get_mut(i).size = piece;
        let mut prev = i;
        for k in 1..n {
            let a = addr + k * piece;
            let j = self.table.take(Seg::new(a, piece, Kind::Alloc));
            self.table.insert_after(prev, j);
            self.hash.insert(a, j, &self.table);
            prev = j;
        }
        self.allocs += n - 1;
        Ok(())
    }

    /// Free `size / piece` consecutive caller allocations of `piece` bytes each from
    /// `addr` (the pieces of a [`SegmentAllocator::split`] run, or any adjacent
    /// allocations of that size) as one: every piece is validated first, then they
    /// merge into one segment that is freed and coalesced once. State is unchanged on
    /// error.
    pub fn free_run(&mut self, addr: u64, size: u64, piece: u64) -> Result<(), FreeError> {
        if piece == 0 || piece & (self.quantum - 1) != 0 || size == 0 || size % piece != 0 {
            return Err(FreeError::Unaligned { addr, size: piece });
        }
        let n = size / piece;
        let Some(first) = self.hash.get(addr, &self.table) else {
            return Err(FreeError::NotAllocated { addr });
        };
        let mut i = first;
        for k in 0..n {
            let a = addr + k * piece;
            let seg = *self.table.get(i);
            if seg.kind() != Kind::Alloc
                || seg.start != a
                || self.hash.get(a, &self.table) != Some(i)
            {
                return Err(FreeError::NotAllocated { addr: a });
            }
            if seg.size != piece {
                return Err(FreeError::SizeMismatch {
                    addr: a,
                    allocated: seg.size,
                    given: piece,
                });
            }
            i = seg.anext;
        }
        for _ in 1..n {
            let j = self.table.get(first).anext;
            let start = self.table.get(j).start;
            self.hash.remove(start, &self.table);
            self.table.unlink(j);
            self.table.release(j);
            self.retarget_rotor(j, first);
        }
        self.table.get_mut(first).size = size;
        self.hash.remove(addr, &self.table);
        self.free_segment(first);
        self.frees += n;
        Ok(())
    }
}
