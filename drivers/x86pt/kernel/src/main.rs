//! # x86-kernel: gmem-core managing a real x86-64 CPU MMU and an Intel VT-d IOMMU
//!
//! A UEFI application for QEMU's `q35` machine with `-device intel-iommu`. It takes a
//! block of memory from UEFI, leaves boot services, and embeds `gmem-core` as a kernel
//! would, through the public API only:
//! 1. **the CPU** is the core's host device: its `Mmu` is [`gmem_x86pt::PagedMmu`] with
//!    the x86-64 codec and 2 MiB leaves over [`gmem_x86pt::DirectCpu`] (CR3, `invlpg`),
//!    its memory direct RAM. Page faults (#PF) go through `trap` to `gm.dev_try_fault`.
//!    [`cpu::run`] shows demand zero-fill, a write to a read-only range refused with
//!    the core's typed error, and a 2 MiB region served by one fault with one 2 MiB leaf
//!    and split by a partial protect, every word verified;
//! 2. **VT-d** (`vtd`): the remapping unit found in ACPI's DMAR table (`acpi`), its
//!    root and context tables, queued invalidation, translation enabled; every DMA
//!    device is a core device whose `Mmu` is the same driver over the VT-d
//!    second-level codec, its walker a VT-d domain;
//! 3. **DMA** (`dma`): QEMU's edu device copies through IOVAs the core mapped, and a DMA
//!    from an unmapped IOVA is blocked and read from the fault recording registers; the
//!    NVMe controller (`nvme`) writes and reads a 2 MiB buffer mapped by superpages, and
//!    the receive churn counts IOTLB invalidations for strict and asynchronous unmaps.
//!
//! With `vtd-reserved-bit` in `\gmem.cfg` (the xtask's negative test) the edu domain's
//! leaves carry a reserved bit, and the run must fail on the unit's fault.
//!
//! It prints its results on COM1 and ends QEMU through `isa-debug-exit` (33 = pass).
//! `cargo xtask qemu-x86` builds and boots it.

#![no_std]
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]

extern crate alloc;

mod acpi;
mod board;
mod cpu;
mod dma;
mod edu;
mod memory;
mod nvme;
mod trap;
mod vtd;

use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use board::{exit_fail, exit_pass};
use core::sync::atomic::Ordering;
use gmem_core::{DevCaps, DeviceDesc, DeviceId, Gmem, Prot};
use gmem_kernel_support::{DirectRam, FramePool};
use gmem_x86pt::{DirectCpu, GlobalMapping, PagedConfig, PagedMmu, X86Codec, X86Config};
use memory::{DmaArena, Layout, BLOCK_BYTES};
use uefi::boot::{AllocateType, MemoryType};
use uefi::{entry, Status};

/// The CPU's MMU driver.
pub type CpuMmu = PagedMmu<X86Codec, DirectCpu>;

/// What the page-fault handler needs: the core and the CPU's device id.
pub struct Kernel {
    /// The memory manager.
    pub gm: Gmem,
    /// The CPU, as the core's host device.
    pub cpu: DeviceId,
}

/// Set once the core is up; read by the page-fault handler.
pub static KERNEL: spin::Once<Kernel> = spin::Once::new();

/// Physical memory the CPU's global mappings identity-map: the low 4 GiB (RAM, the
/// kernel image, firmware structures, the 32-bit PCI and chipset MMIO windows).
const IDENTITY_END: u64 = 4 << 30;

#[entry]
fn main() -> Status {
    board::serial_init();
    println!();
    println!("x86 kernel: UEFI entry");
    let rsdp = uefi::system::with_config_table(|t| {
        t.iter()
            .find(|e| e.guid == uefi::table::cfg::ACPI2_GUID)
            .map(|e| e.address as u64)
    });
    let block = match uefi::boot::allocate_pages(
        AllocateType::MaxAddress(IDENTITY_END - 1),
        MemoryType::LOADER_DATA,
        (BLOCK_BYTES / 4096) as usize,
    ) {
        Ok(p) => p.as_ptr() as u64,
        Err(e) => {
            println!("x86 kernel: FAIL: no {BLOCK_BYTES:#x} bytes from UEFI: {e:?}");
            exit_fail(2)
        }
    };
    let layout = Layout::within(block);
    // SAFETY: the block is ours (LOADER_DATA pages just allocated) and nothing allocates
    // before this.
    unsafe { layout.init_heap() };
    let config = read_config();
    println!("config (\\gmem.cfg): {config:?}");
    // SAFETY: no UEFI protocol or boot-service pointer is used after this call; the
    // kernel keeps running on the firmware's GDT and stack, which stay in memory nothing
    // reuses.
    let _map = unsafe { uefi::boot::exit_boot_services(None) };
    x86_64::instructions::interrupts::disable();
    trap::init();
    println!(
        "memory: heap {:#x}..{:#x}, page tables {:#x}..{:#x}, gmem RAM {:#x}..{:#x}, DMA {:#x}..{:#x}",
        layout.heap.0,
        layout.heap.1,
        layout.page_tables.0,
        layout.page_tables.1,
        layout.gmem.0,
        layout.gmem.1,
        layout.dma.0,
        layout.dma.1
    );
    match run(&layout, rsdp, &config) {
        Ok(()) => {
            println!("x86 kernel: PASS");
            exit_pass()
        }
        Err(e) => {
            println!("x86 kernel: FAIL: {e}");
            exit_fail(7)
        }
    }
}

/// The configuration word of the negative test (the xtask writes it to `\gmem.cfg`).
const NEGATIVE_CONFIG: &str = "vtd-reserved-bit";

/// The first line of `\gmem.cfg` on the boot drive (empty if there is none).
fn read_config() -> String {
    let Ok(proto) = uefi::boot::get_image_file_system(uefi::boot::image_handle()) else {
        return String::new();
    };
    let mut fs = uefi::fs::FileSystem::new(proto);
    fs.read(uefi::cstr16!("\\gmem.cfg"))
        .map(|b| {
            String::from_utf8_lossy(&b)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .into()
        })
        .unwrap_or_default()
}

/// `Err(what())` unless `ok`.
pub fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

fn run(layout: &Layout, rsdp: Option<u64>, config: &str) -> Result<(), String> {
    // SAFETY: the pool's range is the kernel's block (layout), identity mapped by the
    // global mappings below and used by nothing else.
    let pool = Arc::new(unsafe {
        FramePool::new(layout.page_tables.0, layout.page_tables.1, |line| {
            println!("{line}")
        })
    });
    println!("{}", pool.check_reuse()?);
    // PCI first: a BAR the firmware put above 4 GiB joins the global mappings.
    let controller = nvme::find()?;
    let mut globals = alloc::vec![GlobalMapping::identity(0, IDENTITY_END, Prot::RWX)];
    if controller.1 >= IDENTITY_END {
        let at = controller.1 & !((2 << 20) - 1);
        globals.push(GlobalMapping::identity(at, 2 << 20, Prot::RW));
    }
    let codec = X86Codec {
        config: X86Config {
            large_pages: true,
            ..X86Config::default()
        },
    };
    // SAFETY: ring 0, long mode (UEFI); the pool's frames are identity mapped now (the
    // firmware's tables) and by the global mappings afterwards, which also cover the
    // kernel image, its stack and heap (all below 4 GiB).
    let mmu = Arc::new(
        unsafe {
            PagedMmu::new(
                codec,
                DirectCpu::new(),
                pool.clone(),
                PagedConfig::default(),
                &globals,
            )
        }
        .map_err(|e| format!("CPU driver: {e}"))?,
    );
    // SAFETY: the gmem range is the kernel's (layout), identity mapped, and only the
    // core hands it out.
    let ram = Arc::new(unsafe { DirectRam::new(layout.gmem.0, layout.gmem.1) });
    let gm = Gmem::new(
        Arc::new(trap::CorePlatform),
        DeviceDesc {
            name: "cpu0".into(),
            mmu: mmu.clone(),
            memory: Some(ram),
            caps: DevCaps::FAULTABLE,
            data: None,
        },
    )
    .map_err(|e| format!("Gmem::new: {e}"))?;
    let cpu = gm.host();
    let k = KERNEL.call_once(|| Kernel { gm, cpu });
    cpu::run(&k.gm, k.cpu, &mmu, layout)?;

    let drhd = acpi::find_drhd(rsdp.ok_or("UEFI gave no ACPI 2.0 table")?)?;
    // SAFETY: the DMA range is the kernel's block (layout), identity mapped by the
    // global mappings, and only the arena hands it out.
    let mut arena = unsafe { DmaArena::new(layout.dma.0, layout.dma.1) };
    // SAFETY: the DRHD's register block (MMIO below 4 GiB, identity mapped); the kernel
    // is the only driver of the unit.
    let unit = Arc::new(unsafe { vtd::VtdUnit::new(drhd.registers, &mut arena) }?);
    println!(
        "vtd: DMAR unit at {:#x} (host address width {}, all PCI devices: {}), CAP {:#x}, ECAP {:#x}; root table {:#x}, queued invalidation on",
        drhd.registers,
        drhd.host_address_width,
        drhd.include_all,
        unit.cap(),
        unit.ecap(),
        unit.root_table()
    );
    let gsts = unit.enable_translation()?;
    println!("vtd: translation enabled (GSTS {gsts:#x}): every DMA is now translated by tables the core writes, or blocked");
    let wrong = if config == NEGATIVE_CONFIG {
        println!("vtd: NEGATIVE TEST: every second-level leaf gets reserved bit 11 (SNP); the unit must refuse to translate");
        gmem_x86pt::vtd::VTD_SNP
    } else {
        0
    };
    dma::edu(&k.gm, k.cpu, &unit, pool.clone(), &mut arena, wrong)?;
    let churn = dma::nvme(&k.gm, k.cpu, &unit, pool.clone(), &mut arena, controller)?;
    println!(
        "vtd: invalidations per 1000 buffers: strict {}, async {} (IOTLB invalidation descriptors the unit processed per {} map/DMA/unmap cycles; wait descriptors {} and {})",
        churn.strict * 1000 / dma::CHURN_BUFFERS,
        churn.asynchronous * 1000 / dma::CHURN_BUFFERS,
        dma::CHURN_BUFFERS,
        churn.strict_waits,
        churn.async_waits
    );
    let c = &unit.counters;
    println!(
        "vtd: descriptors: IOTLB {} (page-selective {}, domain {}), context-cache {}, wait {}, errors {}",
        c.iotlb(),
        c.iotlb_page.load(Ordering::Relaxed),
        c.iotlb_domain.load(Ordering::Relaxed),
        c.context.load(Ordering::Relaxed),
        c.wait.load(Ordering::Relaxed),
        c.errors.load(Ordering::Relaxed)
    );
    check(c.errors.load(Ordering::Relaxed) == 0, || {
        "the unit reported invalidation errors".into()
    })?;
    println!(
        "page-table frames in use {}, heap in use {} KiB",
        pool.in_use(),
        memory::heap_used() / 1024
    );
    Ok(())
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    println!("x86 kernel: FAIL: panic: {info}");
    exit_fail(1)
}
