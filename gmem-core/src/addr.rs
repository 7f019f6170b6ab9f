//! Addresses and page sizes.
//!
//! This module owns the address vocabulary shared by every layer: [`VirtAddr`] (a
//! virtual address inside an address space, `gm_va_t`), [`PhysAddr`] (a physical address
//! in some device's local memory, `gm_pa_t`), page numbers ([`Vpn`], [`Pfn`]) and the
//! page sizes an MMU may support ([`PageSize`]). Constructors are checked: an address that
//! must be page aligned is rejected with a typed [`AddrError`] instead of being silently
//! truncated, so a malformed request never reaches the core's data structures.

use core::fmt;

/// The base page size of the core: the logical page table and every physical frame
/// allocator work in units of 4 KiB.
pub const PAGE_SIZE: u64 = 4096;
/// `log2(PAGE_SIZE)`.
pub const PAGE_SHIFT: u32 = 12;

/// Why an address or a range was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddrError {
    /// The address is not aligned to the required boundary.
    Unaligned {
        /// The offending address.
        addr: u64,
        /// The required alignment in bytes.
        align: u64,
    },
    /// `start + len` overflows the 64-bit address space, or the length is zero.
    BadRange {
        /// Start of the range.
        start: u64,
        /// Its length in bytes.
        len: u64,
    },
}

impl core::error::Error for AddrError {}

impl fmt::Display for AddrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddrError::Unaligned { addr, align } => {
                write!(f, "address {addr:#x} is not aligned to {align:#x}")
            }
            AddrError::BadRange { start, len } => {
                write!(f, "range {start:#x}+{len:#x} is empty or overflows")
            }
        }
    }
}

macro_rules! address_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        #[repr(transparent)]
        pub struct $name(u64);

        impl $name {
            /// The address `raw`, whatever its alignment.
            pub const fn new(raw: u64) -> Self {
                Self(raw)
            }

            /// The address `raw`, which must be aligned to the base page size.
            ///
            /// # Errors
            /// [`AddrError::Unaligned`] if `raw` is not a multiple of 4 KiB.
            pub const fn new_page_aligned(raw: u64) -> Result<Self, AddrError> {
                if raw % PAGE_SIZE == 0 {
                    Ok(Self(raw))
                } else {
                    Err(AddrError::Unaligned { addr: raw, align: PAGE_SIZE })
                }
            }

            /// The raw 64-bit value.
            pub const fn as_u64(self) -> u64 {
                self.0
            }

            /// Whether the address is a multiple of `align` (a power of two).
            pub const fn is_aligned(self, align: u64) -> bool {
                self.0 & (align.wrapping_sub(1)) == 0
            }

            /// Whether the address is page aligned.
            pub const fn is_page_aligned(self) -> bool {
                self.is_aligned(PAGE_SIZE)
            }

            /// The address rounded down to `align` (a power of two).
            pub const fn align_down(self, align: u64) -> Self {
                Self(self.0 & !(align.wrapping_sub(1)))
            }

            /// The address plus `bytes`, or `None` on overflow.
            pub const fn checked_add(self, bytes: u64) -> Option<Self> {
                match self.0.checked_add(bytes) {
                    Some(v) => Some(Self(v)),
                    None => None,
                }
            }

            /// Offset of the address inside its base page.
            pub const fn page_offset(self) -> u64 {
                self.0 & (PAGE_SIZE - 1)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "({:#x})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
    };
}

address_type!(
    /// A virtual address in an address space (`gm_va_t`).
    VirtAddr,
    "VirtAddr"
);
address_type!(
    /// A physical address in the local memory of some device (`gm_pa_t`).
    PhysAddr,
    "PhysAddr"
);

impl VirtAddr {
    /// The virtual page number holding this address.
    pub const fn vpn(self) -> Vpn {
        Vpn(self.0 >> PAGE_SHIFT)
    }
}

impl PhysAddr {
    /// The physical frame number holding this address.
    pub const fn pfn(self) -> Pfn {
        Pfn(self.0 >> PAGE_SHIFT)
    }
}

/// A virtual page number: a virtual address divided by [`PAGE_SIZE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Vpn(pub u64);

impl Vpn {
    /// The first address of the page.
    pub const fn addr(self) -> VirtAddr {
        VirtAddr(self.0 << PAGE_SHIFT)
    }
}

impl Vpn {
    /// The page `n` pages further on.
    #[inline]
    pub const fn add(self, n: u64) -> Vpn {
        Vpn(self.0 + n)
    }

    /// Pages from `earlier` to `self` (`self >= earlier`).
    #[inline]
    pub const fn since(self, earlier: Vpn) -> u64 {
        self.0 - earlier.0
    }

    /// The first page of the naturally aligned block of `pages` (a power of two) that
    /// holds this page.
    #[inline]
    pub const fn align_down(self, pages: u64) -> Vpn {
        Vpn(self.0 & !(pages - 1))
    }

    /// The `pages` pages from this one, in order.
    pub fn span(self, pages: u64) -> impl Iterator<Item = Vpn> + Clone {
        (self.0..self.0 + pages).map(Vpn)
    }
}

impl core::ops::Add<u64> for Vpn {
    type Output = Vpn;
    #[inline]
    fn add(self, n: u64) -> Vpn {
        Vpn(self.0 + n)
    }
}

impl core::ops::Add<u64> for Pfn {
    type Output = Pfn;
    #[inline]
    fn add(self, n: u64) -> Pfn {
        Pfn(self.0 + n)
    }
}

/// A physical frame number: a physical address divided by [`PAGE_SIZE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Pfn(pub u64);

impl Pfn {
    /// The frame `n` frames further on.
    #[inline]
    pub const fn add(self, n: u64) -> Pfn {
        Pfn(self.0 + n)
    }

    /// The first address of the frame.
    pub const fn addr(self) -> PhysAddr {
        PhysAddr(self.0 << PAGE_SHIFT)
    }
}

/// A page size that an MMU may support.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PageSize {
    /// 4 KiB, the base page.
    Size4K,
    /// 64 KiB (arm64 contiguous hint, many GPU MMUs).
    Size64K,
    /// 2 MiB (x86-64 / Sv39 level-1 leaf).
    Size2M,
    /// 1 GiB (x86-64 / Sv39 level-2 leaf).
    Size1G,
}

impl PageSize {
    /// Every page size, smallest first.
    pub const ALL: [PageSize; 4] = [
        PageSize::Size4K,
        PageSize::Size64K,
        PageSize::Size2M,
        PageSize::Size1G,
    ];

    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        match self {
            PageSize::Size4K => 4 << 10,
            PageSize::Size64K => 64 << 10,
            PageSize::Size2M => 2 << 20,
            PageSize::Size1G => 1 << 30,
        }
    }

    /// The number of base pages it covers.
    pub const fn base_pages(self) -> u64 {
        self.bytes() / PAGE_SIZE
    }

    /// The page size of exactly `bytes` bytes, if there is one.
    pub const fn from_bytes(bytes: u64) -> Option<PageSize> {
        match bytes {
            0x1000 => Some(PageSize::Size4K),
            0x1_0000 => Some(PageSize::Size64K),
            0x20_0000 => Some(PageSize::Size2M),
            0x4000_0000 => Some(PageSize::Size1G),
            _ => None,
        }
    }
}

/// A half-open range of virtual addresses `[start, start + len)`, page aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VaRange {
    /// First address.
    pub start: VirtAddr,
    /// Length in bytes, a non-zero multiple of [`PAGE_SIZE`].
    pub len: u64,
}

impl VaRange {
    /// A checked range: page aligned start and length, non-empty, no overflow past
    /// the top of the 64-bit space (the range may end exactly at 2^64).
    ///
    /// # Errors
    /// [`AddrError`] if `start` is not page aligned, `len` is 0 or not a page multiple, or
    /// the range overflows.
    pub fn new(start: VirtAddr, len: u64) -> Result<Self, AddrError> {
        if !start.is_page_aligned() {
            return Err(AddrError::Unaligned {
                addr: start.0,
                align: PAGE_SIZE,
            });
        }
        if len % PAGE_SIZE != 0 {
            return Err(AddrError::Unaligned {
                addr: len,
                align: PAGE_SIZE,
            });
        }
        if len == 0 || start.0.checked_add(len - 1).is_none() {
            return Err(AddrError::BadRange {
                start: start.0,
                len,
            });
        }
        Ok(Self { start, len })
    }

    /// Number of base pages.
    pub const fn pages(&self) -> u64 {
        self.len / PAGE_SIZE
    }

    /// First page.
    pub const fn first_vpn(&self) -> Vpn {
        self.start.vpn()
    }

    /// The last address inside the range.
    pub const fn last(&self) -> VirtAddr {
        VirtAddr(self.start.0 + (self.len - 1))
    }

    /// Whether `va` lies inside the range.
    pub const fn contains(&self, va: VirtAddr) -> bool {
        va.0 >= self.start.0 && va.0 - self.start.0 < self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_aligned_constructor_rejects_unaligned_addresses() {
        assert_eq!(
            VirtAddr::new_page_aligned(0x1001),
            Err(AddrError::Unaligned {
                addr: 0x1001,
                align: PAGE_SIZE
            })
        );
        assert_eq!(PhysAddr::new_page_aligned(0x2000).unwrap().pfn(), Pfn(2));
    }

    #[test]
    fn range_constructor_rejects_empty_unaligned_and_overflowing_ranges() {
        assert!(VaRange::new(VirtAddr::new(0x1000), 0).is_err());
        assert!(VaRange::new(VirtAddr::new(0x1000), 0x800).is_err());
        assert!(VaRange::new(VirtAddr::new(0x1800), 0x1000).is_err());
        assert!(VaRange::new(VirtAddr::new(u64::MAX - 0xfff), 0x2000).is_err());
        let top = VaRange::new(VirtAddr::new(u64::MAX - 0xfff), 0x1000).unwrap();
        assert_eq!(top.last(), VirtAddr::new(u64::MAX));
        assert!(top.contains(VirtAddr::new(u64::MAX)));
    }

    #[test]
    fn page_sizes_round_trip_through_bytes() {
        for s in PageSize::ALL {
            assert_eq!(PageSize::from_bytes(s.bytes()), Some(s));
        }
        assert_eq!(PageSize::Size2M.base_pages(), 512);
        assert_eq!(PageSize::from_bytes(8192), None);
    }
}
