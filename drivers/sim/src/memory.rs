//! Simulated physical memory that holds real bytes.
//!
//! A [`SimMemory`] answers for one physical range `[base, base + size)`: host DRAM, a
//! discrete GPU's video memory. It stores data sparsely, one 4 KiB page at a time: a
//! page that was never written (or was zeroed whole) holds no storage and reads as
//! zeros, so a simulated 64 GiB memory costs only what a workload touches. Every access
//! is bounds-checked and a bad one is a typed [`BoundsError`], never a panic.
//!
//! Page-table formats keep their tables in these memories too ([`SimMemory::read_u64`],
//! [`SimMemory::write_u64`]), so a page walk is real memory reads that can be counted.

use crate::lock;
use gmem_core::{DeviceMemory, MemError, PhysAddr, PAGE_SIZE};
use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

const PAGE: usize = PAGE_SIZE as usize;

/// An access outside the memory's range, or a range that cannot describe one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundsError {
    /// `[pa, pa + len)` is not inside `[base, end)`.
    OutOfRange {
        /// First address of the access.
        pa: PhysAddr,
        /// Its length in bytes.
        len: u64,
        /// First address of the memory.
        base: PhysAddr,
        /// One past its last address.
        end: PhysAddr,
    },
    /// A 64-bit entry access at an address that is not 8-byte aligned.
    Unaligned {
        /// The address.
        pa: PhysAddr,
    },
    /// `SimMemory::new` got a base or size that is not page aligned, a zero size, or a
    /// range that overflows.
    BadRange {
        /// The base asked for.
        base: u64,
        /// The size asked for.
        size: u64,
    },
}

impl fmt::Display for BoundsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BoundsError::OutOfRange { pa, len, base, end } => {
                write!(f, "{pa}+{len:#x} is outside memory [{base}, {end})")
            }
            BoundsError::Unaligned { pa } => write!(f, "{pa} is not 8-byte aligned"),
            BoundsError::BadRange { base, size } => {
                write!(f, "memory range {base:#x}+{size:#x} is empty or unaligned")
            }
        }
    }
}

impl From<BoundsError> for MemError {
    fn from(e: BoundsError) -> MemError {
        match e {
            BoundsError::OutOfRange { pa, .. } | BoundsError::Unaligned { pa } => {
                MemError::OutOfRange { pa }
            }
            BoundsError::BadRange { base, .. } => MemError::OutOfRange {
                pa: PhysAddr::new(base),
            },
        }
    }
}

/// What a memory was asked to do, in bytes, and what it holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes read (by any reader: devices, the data mover, page walks).
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Bytes zeroed.
    pub bytes_zeroed: u64,
    /// Pages that hold storage now (written and not zeroed whole since).
    pub resident_pages: u64,
}

/// Hashes a page number with one multiplication (Fibonacci hashing): the keys are
/// frame numbers, not attacker-chosen, and SipHash was a tenth of a migration's time.
#[derive(Default)]
struct PfnHasher(u64);

impl std::hash::Hasher for PfnHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The storage of one page, aligned to a cache line: a 4 KiB copy between two
/// line-aligned pages runs about twice as fast as between the 16-byte-aligned blocks
/// the allocator returns for a plain `[u8; 4096]` (measured on this project's
/// machine), which is what a DMA engine copying whole lines would see.
#[derive(Clone)]
#[repr(C, align(64))]
struct PageBytes([u8; PAGE]);

impl PageBytes {
    fn zeroed() -> Box<PageBytes> {
        Box::new(PageBytes([0; PAGE]))
    }
}

impl std::ops::Deref for PageBytes {
    type Target = [u8; PAGE];
    fn deref(&self) -> &[u8; PAGE] {
        &self.0
    }
}

impl std::ops::DerefMut for PageBytes {
    fn deref_mut(&mut self) -> &mut [u8; PAGE] {
        &mut self.0
    }
}

/// What a page never written holds: the bytes [`SimMemory::read_with`] hands out for
/// one.
static ZERO_PAGE: [u8; PAGE] = [0; PAGE];

type PageMap = HashMap<u64, Box<PageBytes>, std::hash::BuildHasherDefault<PfnHasher>>;

#[derive(Default)]
struct Inner {
    pages: PageMap,
    stats: MemoryStats,
}

/// Sparse, page-granular, byte-holding physical memory over `[base, base + size)`.
pub struct SimMemory {
    name: String,
    base: u64,
    end: u64,
    inner: Mutex<Inner>,
}

impl fmt::Debug for SimMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SimMemory({} [{:#x}, {:#x}))",
            self.name, self.base, self.end
        )
    }
}

impl SimMemory {
    /// A memory named `name` answering for `[base, base + size)`; base and size must be
    /// page aligned and the size non-zero.
    ///
    /// # Errors
    /// [`BoundsError::BadRange`] for an unaligned base or size, a zero size, or a range
    /// that overflows.
    pub fn new(name: &str, base: PhysAddr, size: u64) -> Result<SimMemory, BoundsError> {
        let bad = BoundsError::BadRange {
            base: base.as_u64(),
            size,
        };
        if !base.is_page_aligned() || size == 0 || size % PAGE_SIZE != 0 {
            return Err(bad);
        }
        let end = base.as_u64().checked_add(size).ok_or(bad)?;
        Ok(SimMemory {
            name: name.to_string(),
            base: base.as_u64(),
            end,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// The name given at creation.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// First address.
    pub fn base(&self) -> PhysAddr {
        PhysAddr::new(self.base)
    }

    /// One past the last address.
    pub fn end(&self) -> PhysAddr {
        PhysAddr::new(self.end)
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.end - self.base
    }

    /// Whether `pa` lies inside the memory.
    #[inline]
    pub fn contains(&self, pa: PhysAddr) -> bool {
        (self.base..self.end).contains(&pa.as_u64())
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> MemoryStats {
        let g = lock(&self.inner);
        MemoryStats {
            resident_pages: g.pages.len() as u64,
            ..g.stats
        }
    }

    fn check(&self, pa: PhysAddr, len: u64) -> Result<(), BoundsError> {
        let a = pa.as_u64();
        match a.checked_add(len) {
            Some(e) if a >= self.base && e <= self.end => Ok(()),
            _ => Err(BoundsError::OutOfRange {
                pa,
                len,
                base: self.base(),
                end: self.end(),
            }),
        }
    }

    /// Whether `[pa, pa + len)` lies inside this memory.
    ///
    /// # Errors
    /// [`BoundsError::OutOfRange`] if it does not.
    pub fn check_range(&self, pa: PhysAddr, len: u64) -> Result<(), BoundsError> {
        self.check(pa, len)
    }

    /// Calls `f(page number, offset in page, bytes, offset in the access)` for each
    /// page piece of `[pa, pa + len)`.
    fn pieces(pa: u64, len: u64, mut f: impl FnMut(u64, usize, usize, usize)) {
        let mut done = 0u64;
        while done < len {
            let a = pa + done;
            let off = (a % PAGE_SIZE) as usize;
            let n = ((PAGE - off) as u64).min(len - done) as usize;
            f(a / PAGE_SIZE, off, n, done as usize);
            done += n as u64;
        }
    }

    /// Calls `f(source page, offset, destination page, offset, bytes)` for each piece
    /// of a copy of `len` bytes from `src` to `dst` that crosses no page boundary on
    /// either side.
    fn pieces2(src: u64, dst: u64, len: u64, mut f: impl FnMut(u64, usize, u64, usize, usize)) {
        let mut done = 0u64;
        while done < len {
            let (s, d) = (src + done, dst + done);
            let (so, dof) = ((s % PAGE_SIZE) as usize, (d % PAGE_SIZE) as usize);
            let n = (PAGE - so).min(PAGE - dof).min((len - done) as usize);
            f(s / PAGE_SIZE, so, d / PAGE_SIZE, dof, n);
            done += n as u64;
        }
    }

    /// Read `buf.len()` bytes from `pa`.
    ///
    /// # Errors
    /// [`BoundsError::OutOfRange`] if the range is not inside this memory; nothing is
    /// read.
    pub fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), BoundsError> {
        self.check(pa, buf.len() as u64)?;
        let mut g = lock(&self.inner);
        Self::pieces(pa.as_u64(), buf.len() as u64, |pfn, off, n, at| {
            match g.pages.get(&pfn) {
                Some(p) => buf[at..at + n].copy_from_slice(&p[off..off + n]),
                None => buf[at..at + n].fill(0),
            }
        });
        g.stats.bytes_read += buf.len() as u64;
        Ok(())
    }

    /// Hand `f` the `N` bytes at physical address `pas[i]`, with `i`, for each `i` in
    /// order, under one lock of the memory (a warp's cache lines: the same bytes and
    /// counters as one [`SimMemory::read`] per line). A line within one page is handed
    /// in place (a page never written reads as zeros), so no bytes are copied unless
    /// `f` copies them; one that straddles pages is gathered first.
    ///
    /// # Errors
    /// [`BoundsError::OutOfRange`] for the first range not inside this memory; then
    /// nothing is read and `f` is not called.
    pub fn read_each_with<const N: usize>(
        &self,
        pas: &[u64],
        mut f: impl FnMut(usize, &[u8; N]),
    ) -> Result<(), BoundsError> {
        for &pa in pas {
            self.check(PhysAddr::new(pa), N as u64)?;
        }
        let mut g = lock(&self.inner);
        for (i, &pa) in pas.iter().enumerate() {
            Self::with_line(&g.pages, pa, |line| f(i, line));
        }
        g.stats.bytes_read += (pas.len() * N) as u64;
        Ok(())
    }

    /// [`SimMemory::read_each_with`] for one line: `f` gets the `N` bytes at `pa` and
    /// its answer is returned.
    ///
    /// # Errors
    /// [`BoundsError::OutOfRange`] if the range is not inside this memory; nothing is
    /// read and `f` is not called.
    // Always inlined, as `modify`: a device's one-line access, run in its caller's
    // frame (no call, no spills around it).
    #[inline(always)]
    pub fn read_with<const N: usize, R>(
        &self,
        pa: PhysAddr,
        f: impl FnOnce(&[u8; N]) -> R,
    ) -> Result<R, BoundsError> {
        self.check(pa, N as u64)?;
        let mut g = lock(&self.inner);
        let r = Self::with_line(&g.pages, pa.as_u64(), f);
        g.stats.bytes_read += N as u64;
        Ok(r)
    }

    /// Call `f` on the `N` bytes at `pa` (inside the memory, checked by the caller):
    /// in place when they lie in one page (the shared zero page for one never
    /// written), else gathered into a copy.
    #[inline]
    fn with_line<const N: usize, R>(pages: &PageMap, pa: u64, f: impl FnOnce(&[u8; N]) -> R) -> R {
        let off = (pa % PAGE_SIZE) as usize;
        if let Some(end) = off.checked_add(N).filter(|&e| e <= PAGE) {
            let page: &[u8; PAGE] = match pages.get(&(pa / PAGE_SIZE)) {
                Some(p) => p,
                None => &ZERO_PAGE,
            };
            if let Ok(line) = <&[u8; N]>::try_from(&page[off..end]) {
                return f(line);
            }
        }
        let mut line = [0u8; N];
        Self::pieces(pa, N as u64, |pfn, off, n, at| {
            if let Some(p) = pages.get(&pfn) {
                line[at..at + n].copy_from_slice(&p[off..off + n]);
            }
        });
        f(&line)
    }

    /// Let `f` change the `len` bytes at `pa` in place, under one lock of the memory (a
    /// partial store of a cache line: one lookup of its page, no copy of the line).
    /// Counted as a read and a write of `len` bytes, as a read, a change and a write
    /// back would be. The bytes' pages get storage (a page never written starts as
    /// zeros). A range that straddles pages is gathered, changed and scattered back.
    ///
    /// # Errors
    /// [`BoundsError::OutOfRange`] if the range is not inside this memory; nothing is
    /// read or written and `f` is not called.
    // Always inlined: a device's one-line store, run in its caller's frame.
    #[inline(always)]
    pub fn modify(
        &self,
        pa: PhysAddr,
        len: usize,
        f: impl FnOnce(&mut [u8]),
    ) -> Result<(), BoundsError> {
        let n = len as u64;
        self.check(pa, n)?;
        let mut g = lock(&self.inner);
        let g = &mut *g;
        let off = (pa.as_u64() % PAGE_SIZE) as usize;
        if off + len <= PAGE {
            // Within one page (a cache line always is): one lookup of the page when it
            // holds storage (the usual case, without the entry API's out-of-line call).
            let pfn = pa.as_u64() / PAGE_SIZE;
            match g.pages.get_mut(&pfn) {
                Some(p) => f(&mut p[off..off + len]),
                None => {
                    f(&mut g.pages.entry(pfn).or_insert_with(PageBytes::zeroed)[off..off + len])
                }
            }
        } else {
            let mut buf = vec![0u8; len];
            Self::pieces(pa.as_u64(), n, |pfn, off, n, at| {
                if let Some(p) = g.pages.get(&pfn) {
                    buf[at..at + n].copy_from_slice(&p[off..off + n]);
                }
            });
            f(&mut buf);
            Self::pieces(pa.as_u64(), n, |pfn, off, n, at| {
                let p = g.pages.entry(pfn).or_insert_with(PageBytes::zeroed);
                p[off..off + n].copy_from_slice(&buf[at..at + n]);
            });
        }
        g.stats.bytes_read += n;
        g.stats.bytes_written += n;
        Ok(())
    }

    /// Write `buf` at `pa`.
    ///
    /// # Errors
    /// [`BoundsError::OutOfRange`] if the range is not inside this memory; nothing is
    /// written.
    pub fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), BoundsError> {
        self.check(pa, buf.len() as u64)?;
        let mut g = lock(&self.inner);
        Self::pieces(pa.as_u64(), buf.len() as u64, |pfn, off, n, at| {
            let p = g.pages.entry(pfn).or_insert_with(PageBytes::zeroed);
            p[off..off + n].copy_from_slice(&buf[at..at + n]);
        });
        g.stats.bytes_written += buf.len() as u64;
        Ok(())
    }

    /// Fill `len` bytes from `pa` with zeros; whole pages give their storage back.
    ///
    /// # Errors
    /// [`BoundsError::OutOfRange`] if the range is not inside this memory; nothing is
    /// zeroed.
    pub fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), BoundsError> {
        self.check(pa, len)?;
        let mut g = lock(&self.inner);
        Self::pieces(pa.as_u64(), len, |pfn, off, n, _| {
            if n == PAGE {
                g.pages.remove(&pfn);
            } else if let Some(p) = g.pages.get_mut(&pfn) {
                p[off..off + n].fill(0);
            }
        });
        g.stats.bytes_zeroed += len;
        Ok(())
    }

    /// Copy `len` bytes from `src` in this memory to `dst` in `to` (this memory or
    /// another) in one operation: both memories are locked once (in address order, so
    /// two copies in opposite directions cannot deadlock), whole pages are copied
    /// page to page, and a source page that holds no storage (zeros) clears the
    /// destination page's storage instead of copying zeros.
    ///
    /// # Errors
    /// [`BoundsError::OutOfRange`] if the source range is not inside this memory or the
    /// destination range not inside `to`; both are checked before a byte moves.
    pub fn copy_to(
        &self,
        src: PhysAddr,
        to: &SimMemory,
        dst: PhysAddr,
        len: u64,
    ) -> Result<(), BoundsError> {
        self.check(src, len)?;
        to.check(dst, len)?;
        if std::ptr::eq(self, to) {
            // Within one memory: through a one-page buffer (the ranges may share pages).
            let mut g = lock(&self.inner);
            let mut tmp = [0u8; PAGE];
            Self::pieces2(src.as_u64(), dst.as_u64(), len, |spfn, so, dpfn, dof, n| {
                match g.pages.get(&spfn) {
                    Some(p) => tmp[..n].copy_from_slice(&p[so..so + n]),
                    None => tmp[..n].fill(0),
                }
                let dp = g.pages.entry(dpfn).or_insert_with(PageBytes::zeroed);
                dp[dof..dof + n].copy_from_slice(&tmp[..n]);
            });
            g.stats.bytes_read += len;
            g.stats.bytes_written += len;
            return Ok(());
        }
        let (mut a, mut b);
        let (from, into) = if (self as *const SimMemory) < (to as *const SimMemory) {
            a = lock(&self.inner);
            b = lock(&to.inner);
            (&mut *a, &mut *b)
        } else {
            b = lock(&to.inner);
            a = lock(&self.inner);
            (&mut *a, &mut *b)
        };
        Self::pieces2(
            src.as_u64(),
            dst.as_u64(),
            len,
            |spfn, so, dpfn, dof, n| match from.pages.get(&spfn) {
                Some(sp) if n == PAGE => match into.pages.get_mut(&dpfn) {
                    Some(dp) => dp.copy_from_slice(&sp[..]),
                    None => {
                        into.pages.insert(dpfn, sp.clone());
                    }
                },
                Some(sp) => {
                    let dp = into.pages.entry(dpfn).or_insert_with(PageBytes::zeroed);
                    dp[dof..dof + n].copy_from_slice(&sp[so..so + n]);
                }
                None if n == PAGE => {
                    into.pages.remove(&dpfn);
                }
                None => {
                    if let Some(dp) = into.pages.get_mut(&dpfn) {
                        dp[dof..dof + n].fill(0);
                    }
                }
            },
        );
        from.stats.bytes_read += len;
        into.stats.bytes_written += len;
        Ok(())
    }

    /// Read the little-endian 64-bit entry at `pa` (8-byte aligned).
    ///
    /// # Errors
    /// [`BoundsError::Unaligned`] if `pa` is not 8-byte aligned,
    /// [`BoundsError::OutOfRange`] if the entry is not inside this memory.
    pub fn read_u64(&self, pa: PhysAddr) -> Result<u64, BoundsError> {
        if !pa.is_aligned(8) {
            return Err(BoundsError::Unaligned { pa });
        }
        let mut b = [0u8; 8];
        self.read(pa, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Write the little-endian 64-bit entry at `pa` (8-byte aligned): one store, so a
    /// walker sees the old or the new entry.
    ///
    /// # Errors
    /// [`BoundsError::Unaligned`] if `pa` is not 8-byte aligned,
    /// [`BoundsError::OutOfRange`] if the entry is not inside this memory; nothing is
    /// written.
    pub fn write_u64(&self, pa: PhysAddr, value: u64) -> Result<(), BoundsError> {
        if !pa.is_aligned(8) {
            return Err(BoundsError::Unaligned { pa });
        }
        self.write(pa, &value.to_le_bytes())
    }
}

impl DeviceMemory for SimMemory {
    /// One operation to another simulated memory, or into a device memory behind a
    /// [`crate::DmaEngine`] (counted there host → device) ([`SimMemory::copy_to`]);
    /// the bounce-buffer default for any other destination.
    fn copy(
        &self,
        src: PhysAddr,
        to: &dyn DeviceMemory,
        dst: PhysAddr,
        len: u64,
    ) -> Result<(), MemError> {
        let any = to.as_any();
        if let Some(dest) = any.and_then(|a| a.downcast_ref::<SimMemory>()) {
            return self.copy_to(src, dest, dst, len).map_err(MemError::from);
        }
        if let Some(engine) = any.and_then(|a| a.downcast_ref::<crate::DmaEngine>()) {
            self.copy_to(src, engine.memory(), dst, len)?;
            engine.copied_in(len);
            return Ok(());
        }
        gmem_core::bounce_copy(self, src, to, dst, len)
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
    fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        SimMemory::zero(self, pa, len).map_err(MemError::from)
    }
    fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
        SimMemory::read(self, pa, buf).map_err(MemError::from)
    }
    fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
        SimMemory::write(self, pa, buf).map_err(MemError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> SimMemory {
        SimMemory::new("m", PhysAddr::new(0x10_000), 4 * PAGE_SIZE).unwrap()
    }

    /// `read_each_with` gives the bytes and counters of one `read` per line (lines
    /// that straddle a page, untouched pages reading 0), in order, and reads nothing
    /// when one range is out of bounds; `read_with` is the same for one line.
    #[test]
    fn read_each_with_equals_a_read_per_line_and_checks_every_range_first() {
        let m = mem();
        let data: Vec<u8> = (0..3 * PAGE_SIZE).map(|i| (i * 7 % 251) as u8).collect();
        m.write(PhysAddr::new(0x10_000), &data).unwrap();
        let pas = [0x10_000u64, 0x10_ff8, 0x12_040, 0x13_f80];
        let mut lines = [[0xeeu8; 128]; 4];
        let mut order = Vec::new();
        let before = m.stats().bytes_read;
        m.read_each_with(&pas, |i, line: &[u8; 128]| {
            order.push(i);
            lines[i] = *line;
        })
        .unwrap();
        assert_eq!(order, [0, 1, 2, 3]);
        assert_eq!(m.stats().bytes_read - before, 4 * 128);
        for (&pa, line) in pas.iter().zip(&lines) {
            let mut want = [0u8; 128];
            m.read(PhysAddr::new(pa), &mut want).unwrap();
            assert_eq!(line, &want);
            let one = m.read_with(PhysAddr::new(pa), |l: &[u8; 128]| *l).unwrap();
            assert_eq!(one, want);
        }
        // The last line is in a page never written: zeros.
        assert_eq!(lines[3], [0u8; 128]);
        let before = m.stats().bytes_read;
        let mut called = false;
        assert!(m
            .read_each_with(&[0x10_000, 0x13_fc0], |_, _: &[u8; 128]| called = true)
            .is_err());
        assert!(m
            .read_with(PhysAddr::new(0x13_fc0), |_: &[u8; 128]| called = true)
            .is_err());
        assert!(!called);
        assert_eq!(m.stats().bytes_read, before);
    }

    #[test]
    fn modify_changes_only_what_f_changes_and_checks_bounds_first() {
        let m = mem();
        m.write(PhysAddr::new(0x10_ff8), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
            .unwrap();
        // Across a page boundary: gathered, changed, scattered.
        m.modify(PhysAddr::new(0x10_ff8), 16, |b| {
            assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 0, 0, 0, 0, 0]);
            b[9] = 42;
        })
        .unwrap();
        let mut back = [0u8; 16];
        m.read(PhysAddr::new(0x10_ff8), &mut back).unwrap();
        assert_eq!(back, [1, 2, 3, 4, 5, 6, 7, 8, 9, 42, 0, 0, 0, 0, 0, 0]);
        // Within one page, in place.
        m.modify(PhysAddr::new(0x10_ff8), 4, |b| {
            assert_eq!(b, [1, 2, 3, 4]);
            b[0] = 7;
        })
        .unwrap();
        m.read(PhysAddr::new(0x10_ff8), &mut back).unwrap();
        assert_eq!(back[..5], [7, 2, 3, 4, 5]);
        // A page never written starts as zeros and gets storage.
        let pages = m.stats().resident_pages;
        m.modify(PhysAddr::new(0x12_080), 128, |b| {
            assert_eq!(b, [0u8; 128]);
            b[127] = 9;
        })
        .unwrap();
        assert_eq!(m.stats().resident_pages, pages + 1);
        let end = PhysAddr::new(0x10_000 + 4 * PAGE_SIZE - 8);
        let mut called = false;
        assert!(matches!(
            m.modify(end, 16, |_| called = true),
            Err(BoundsError::OutOfRange { .. })
        ));
        assert!(!called);
        assert!(m.check_range(end, 8).is_ok() && m.check_range(end, 9).is_err());
        let st = m.stats();
        assert_eq!(
            (st.bytes_read, st.bytes_written),
            (16 + 16 + 4 + 16 + 128, 10 + 16 + 4 + 128)
        );
        let mut last = [0u8; 128];
        m.read(PhysAddr::new(0x12_080), &mut last).unwrap();
        assert_eq!(last[127], 9);
        assert_eq!(last[..127], [0u8; 127]);
    }

    #[test]
    fn unwritten_memory_reads_zero_and_holds_no_pages() {
        let m = mem();
        let mut b = [0xffu8; 100];
        m.read(PhysAddr::new(0x10_ff0), &mut b).unwrap();
        assert!(b.iter().all(|x| *x == 0));
        assert_eq!(m.stats().resident_pages, 0);
        assert_eq!(m.stats().bytes_read, 100);
    }

    #[test]
    fn writes_across_a_page_boundary_read_back_and_zeroing_frees_storage() {
        let m = mem();
        let data: Vec<u8> = (0..10_000).map(|i| (i % 251) as u8).collect();
        m.write(PhysAddr::new(0x10_800), &data).unwrap();
        assert_eq!(m.stats().resident_pages, 3);
        let mut back = vec![0u8; 10_000];
        m.read(PhysAddr::new(0x10_800), &mut back).unwrap();
        assert_eq!(back, data);
        // Zero part of the first page and all of the second.
        m.zero(PhysAddr::new(0x10_800), 0x800 + PAGE_SIZE).unwrap();
        assert_eq!(m.stats().resident_pages, 2);
        m.read(PhysAddr::new(0x10_800), &mut back).unwrap();
        assert!(back[..0x800 + PAGE].iter().all(|x| *x == 0));
        assert_eq!(back[0x1800..], data[0x1800..]);
    }

    #[test]
    fn out_of_range_and_unaligned_accesses_are_typed_errors_that_change_nothing() {
        let m = mem();
        let end = PhysAddr::new(0x14_000);
        assert_eq!(
            m.write(PhysAddr::new(0x13_ffc), &[1; 8]),
            Err(BoundsError::OutOfRange {
                pa: PhysAddr::new(0x13_ffc),
                len: 8,
                base: PhysAddr::new(0x10_000),
                end
            })
        );
        assert!(m.read(PhysAddr::new(0xf_fff), &mut [0; 1]).is_err());
        assert!(m.zero(PhysAddr::new(u64::MAX - 1), 4).is_err());
        assert_eq!(
            m.read_u64(PhysAddr::new(0x10_004)),
            Err(BoundsError::Unaligned {
                pa: PhysAddr::new(0x10_004)
            })
        );
        assert_eq!(m.stats(), MemoryStats::default());
        assert!(SimMemory::new("x", PhysAddr::new(0x800), PAGE_SIZE).is_err());
        assert!(SimMemory::new("x", PhysAddr::new(0), 0).is_err());
        assert!(SimMemory::new("x", PhysAddr::new(u64::MAX - 0xfff), 2 * PAGE_SIZE).is_err());
    }

    #[test]
    fn copies_between_and_within_memories_match_read_and_write() {
        let a = mem();
        let b = SimMemory::new("b", PhysAddr::new(0x40_000), 4 * PAGE_SIZE).unwrap();
        let data: Vec<u8> = (0..3 * PAGE).map(|i| (i % 253) as u8 + 1).collect();
        a.write(PhysAddr::new(0x10_000), &data).unwrap();
        // Page to page, then at offsets that straddle pages on both sides.
        a.copy_to(
            PhysAddr::new(0x10_000),
            &b,
            PhysAddr::new(0x41_000),
            2 * PAGE_SIZE,
        )
        .unwrap();
        let mut back = vec![0u8; 2 * PAGE];
        b.read(PhysAddr::new(0x41_000), &mut back).unwrap();
        assert_eq!(back, data[..2 * PAGE]);
        a.copy_to(PhysAddr::new(0x10_100), &b, PhysAddr::new(0x40_f00), 0x1234)
            .unwrap();
        let mut part = vec![0u8; 0x1234];
        b.read(PhysAddr::new(0x40_f00), &mut part).unwrap();
        assert_eq!(part, data[0x100..0x100 + 0x1234]);
        // A zero source page clears the destination's storage.
        a.copy_to(
            PhysAddr::new(0x13_000),
            &b,
            PhysAddr::new(0x41_000),
            PAGE_SIZE,
        )
        .unwrap();
        b.read(PhysAddr::new(0x41_000), &mut back[..PAGE]).unwrap();
        assert!(back[..PAGE].iter().all(|x| *x == 0));
        // Within one memory.
        a.copy_to(
            PhysAddr::new(0x10_000),
            &a,
            PhysAddr::new(0x13_000),
            PAGE_SIZE,
        )
        .unwrap();
        a.read(PhysAddr::new(0x13_000), &mut back[..PAGE]).unwrap();
        assert_eq!(back[..PAGE], data[..PAGE]);
        // Out of range on either side: a typed error, nothing copied.
        let before = b.stats();
        assert!(a
            .copy_to(
                PhysAddr::new(0x13_000),
                &b,
                PhysAddr::new(0x43_800),
                PAGE_SIZE
            )
            .is_err());
        assert_eq!(b.stats(), before);
        // Through the trait, to a memory of another kind: the bounce-buffer default.
        let t = gmem_core::testing::TestMemory::default();
        DeviceMemory::copy(
            &a,
            PhysAddr::new(0x10_000),
            &t,
            PhysAddr::new(0x9000),
            PAGE_SIZE,
        )
        .unwrap();
        let mut tb = vec![0u8; PAGE];
        DeviceMemory::read(&t, PhysAddr::new(0x9000), &mut tb).unwrap();
        assert_eq!(tb, data[..PAGE]);
    }

    #[test]
    fn entries_round_trip_little_endian() {
        let m = mem();
        m.write_u64(PhysAddr::new(0x10_008), 0x0123_4567_89ab_cdef)
            .unwrap();
        assert_eq!(
            m.read_u64(PhysAddr::new(0x10_008)).unwrap(),
            0x0123_4567_89ab_cdef
        );
        let mut b = [0u8; 1];
        m.read(PhysAddr::new(0x10_008), &mut b).unwrap();
        assert_eq!(b[0], 0xef);
    }
}
