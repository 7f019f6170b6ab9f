//! Finding the VT-d remapping unit: ACPI's RSDP (from UEFI's configuration table), its
//! XSDT, the DMAR table and its first DMA-remapping hardware unit definition (DRHD).
//!
//! The tables are firmware memory below 4 GiB, identity mapped before and after the
//! kernel loads its own CR3; they are only read.

use alloc::format;
use alloc::string::String;

/// What the DMAR table says about the first remapping unit.
#[derive(Clone, Copy, Debug)]
pub struct Drhd {
    /// Physical address of its register block.
    pub registers: u64,
    /// The DMAR's host address width (bits, `value + 1`).
    pub host_address_width: u32,
    /// `INCLUDE_PCI_ALL`: the unit covers every PCI device of its segment.
    pub include_all: bool,
}

fn read<T: Copy>(pa: u64) -> T {
    // SAFETY: callers read inside ACPI tables whose lengths they checked: firmware memory
    // below 4 GiB, identity mapped and never written by the kernel.
    unsafe { core::ptr::read_unaligned(pa as *const T) }
}

fn signature(pa: u64) -> [u8; 4] {
    read(pa)
}

/// The first DRHD of the DMAR table reachable from the RSDP at `rsdp`.
///
/// # Errors
/// A description when the RSDP is not ACPI 2.0, no DMAR table is listed, or it has no
/// DRHD.
pub fn find_drhd(rsdp: u64) -> Result<Drhd, String> {
    let sig: [u8; 8] = read(rsdp);
    let revision: u8 = read(rsdp + 15);
    if &sig != b"RSD PTR " || revision < 2 {
        return Err(format!("no ACPI 2.0 RSDP at {rsdp:#x}"));
    }
    let xsdt: u64 = read(rsdp + 24);
    if &signature(xsdt) != b"XSDT" {
        return Err(format!("no XSDT at {xsdt:#x}"));
    }
    let len: u32 = read(xsdt + 4);
    let entries = (u64::from(len).saturating_sub(36)) / 8;
    let dmar = (0..entries)
        .map(|i| read::<u64>(xsdt + 36 + 8 * i))
        .find(|&t| &signature(t) == b"DMAR")
        .ok_or("the XSDT lists no DMAR table (is -device intel-iommu given?)")?;
    let dlen = u64::from(read::<u32>(dmar + 4));
    let haw = u32::from(read::<u8>(dmar + 36)) + 1;
    let mut at = dmar + 48;
    while at + 4 <= dmar + dlen {
        let kind: u16 = read(at);
        let slen = u64::from(read::<u16>(at + 2));
        if slen < 4 {
            break;
        }
        if kind == 0 && slen >= 16 {
            let flags: u8 = read(at + 4);
            return Ok(Drhd {
                registers: read(at + 8),
                host_address_width: haw,
                include_all: flags & 1 != 0,
            });
        }
        at += slen;
    }
    Err(format!("the DMAR table at {dmar:#x} has no DRHD"))
}
