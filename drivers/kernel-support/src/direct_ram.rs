//! [`DirectRam`]: the core's view of the RAM a kernel gives it, reached directly at its
//! physical addresses (identity mapped).

use gmem_core::{DeviceMemory, MemError, PhysAddr};

/// The core's view of RAM: direct access to the identity-mapped range it manages.
pub struct DirectRam {
    start: u64,
    end: u64,
}

impl DirectRam {
    /// Direct access to `[start, end)`.
    ///
    /// # Safety
    /// The range is identity mapped (or paging is off) whenever the core calls it, and
    /// only the core (through mappings it installs) uses that memory.
    pub const unsafe fn new(start: u64, end: u64) -> DirectRam {
        DirectRam { start, end }
    }

    fn check(&self, pa: PhysAddr, len: u64) -> Result<*mut u8, MemError> {
        let a = pa.as_u64();
        match a.checked_add(len) {
            Some(e) if a >= self.start && e <= self.end => Ok(a as *mut u8),
            _ => Err(MemError::OutOfRange { pa }),
        }
    }
}

impl DeviceMemory for DirectRam {
    fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        let p = self.check(pa, len)?;
        // SAFETY: `check` keeps `[pa, pa + len)` inside the managed range, which `new`'s
        // contract makes identity mapped and the core's alone.
        unsafe { core::ptr::write_bytes(p, 0, len as usize) };
        Ok(())
    }

    fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
        let p = self.check(pa, buf.len() as u64)?;
        // SAFETY: as in `zero`; `buf` is ordinary kernel memory, disjoint from the range.
        unsafe { core::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
        let p = self.check(pa, buf.len() as u64)?;
        // SAFETY: as in `read`.
        unsafe { core::ptr::copy_nonoverlapping(buf.as_ptr(), p, buf.len()) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::Buffer;
    use gmem_core::PAGE_SIZE;

    fn ram(buf: &Buffer) -> DirectRam {
        // SAFETY: the buffer is ours alone and outlives the view.
        unsafe { DirectRam::new(buf.addr(), buf.addr() + buf.len()) }
    }

    #[test]
    fn writes_read_back_and_zero_clears() {
        let buf = Buffer::filled(2, 0x11);
        let r = ram(&buf);
        let at = PhysAddr::new(buf.addr() + PAGE_SIZE - 3);
        r.write(at, b"abcdef").unwrap();
        let mut out = [0u8; 8];
        r.read(PhysAddr::new(at.as_u64() - 1), &mut out).unwrap();
        assert_eq!(&out, b"\x11abcdef\x11");
        r.zero(at, 4).unwrap();
        r.read(PhysAddr::new(at.as_u64() - 1), &mut out).unwrap();
        assert_eq!(&out, b"\x11\0\0\0\0ef\x11");
    }

    #[test]
    fn accesses_outside_the_range_fail_untouched() {
        let buf = Buffer::filled(1, 0x22);
        let r = ram(&buf);
        let end = buf.addr() + buf.len();
        let out_of_range = |pa: u64| {
            Err(MemError::OutOfRange {
                pa: PhysAddr::new(pa),
            })
        };
        assert_eq!(
            r.write(PhysAddr::new(end - 2), b"xyz"),
            out_of_range(end - 2)
        );
        assert_eq!(
            r.zero(PhysAddr::new(buf.addr() - 1), 2),
            out_of_range(buf.addr() - 1)
        );
        let mut one = [0u8; 1];
        assert_eq!(r.read(PhysAddr::new(end), &mut one), out_of_range(end));
        assert_eq!(
            r.zero(PhysAddr::new(buf.addr()), u64::MAX),
            out_of_range(buf.addr())
        );
        assert!(
            buf.bytes().iter().all(|&b| b == 0x22),
            "a failed access wrote"
        );
        // The last byte is inside.
        r.read(PhysAddr::new(end - 1), &mut one).unwrap();
        assert_eq!(one, [0x22]);
    }
}
