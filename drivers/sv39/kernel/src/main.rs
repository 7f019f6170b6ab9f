//! # sv39-kernel: gmem-core serving real harts' page faults
//!
//! A minimal S-mode kernel for QEMU's `virt` machine (entered from OpenSBI at
//! 0x8020_0000). It embeds `gmem-core` with the harts as the CPU device: the Sv39 driver
//! is its `Mmu`, direct RAM access its `DeviceMemory`. Then:
//! 1. registers 16 MiB of RAM with the core and creates an address space;
//! 2. attaches the CPU, which makes the driver write `satp`: paging is on, the kernel
//!    keeps running on the driver's global identity mappings;
//! 3. allocates a region and touches it: loads on the first pages, then stores over
//!    all of them. Each first touch is a real page fault (scause 13 / 15) that the trap
//!    handler hands to `gm.dev_fault`; the core zero-fills a frame and maps it through
//!    the driver, and `sret` retries the access;
//! 4. verifies the data through the region and through the physical frames the driver's
//!    tables point at;
//! 5. deallocates the region and probes it: the fault comes back from the core as
//!    `FaultError::NotAllocated`, which the kernel reports and survives;
//! 6. megapages: allocates a 2 MiB-aligned 2 MiB region and stores to it once — one
//!    fault, which the core serves with one zero-filled 2 MiB block mapped by one Sv39
//!    megapage (the driver reports 2 MiB leaves) — then stores and verifies every word
//!    without another fault; `region_protect` makes 4 of its pages read-only,
//!    which splits the megapage into 512 4 KiB leaves (the driver builds the table in
//!    the megapage's split reserve), and every word is verified again;
//! 7. prints a summary;
//! 8. four harts (`smp`): starts the other harts through SBI HSM, each activating the
//!    space's table, and runs the concurrent-fault, shootdown and stress checks on all
//!    of them (the CPU device's driver fences the other harts through SBI remote fences,
//!    `sbi::SmpHart`); then exits QEMU through the SiFive test device (pass `0x5555`,
//!    fail `0x3333 | code << 16`; any panic fails).
//!
//! The core's platform is `sbi::SmpPlatform` (CPU `i` is hart `i`); the single-hart
//! steps 1-7 run on the boot hart before the others start.
//! `cargo xtask qemu` builds and boots it.

#![no_std]
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]

extern crate alloc;

mod board;
mod memory;
mod sbi;
mod smp;
mod trap;

use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use board::{exit_fail, exit_pass, RAM_BASE, RAM_END};
use core::sync::atomic::Ordering;
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, DevCaps, DeviceDesc, DeviceId, FaultError, Gmem,
    MapFlags, MmuMode, PageSize, PageTableRoot, Prot, VirtAddr, PAGE_SIZE,
};
use gmem_kernel_support::{DirectRam, FramePool};
use gmem_sv39::{DirectHart, GlobalMapping, Sv39, Sv39Config};
use memory::Layout;
use sbi::{SmpHart, SmpPlatform};

core::arch::global_asm!(
    ".section .text.boot",
    ".globl _start",
    "_start:",
    // OpenSBI passes the hart id in a0 and the device tree in a1; keep both for kmain.
    // `tp` holds the hart id for the rest of the run (`board::hart_index`).
    "mv tp, a0",
    "la sp, __boot_stack_top",
    "la t0, __bss_start",
    "la t1, __bss_end",
    "1:",
    "bgeu t0, t1, 2f",
    "sd zero, 0(t0)",
    "addi t0, t0, 8",
    "j 1b",
    "2:",
    "call kmain",
    "3:",
    "wfi",
    "j 3b",
    // Harts started through SBI HSM: a0 = hart id, a1 = the top of its stack (the
    // opaque word `smp::run` passed), translation off.
    ".globl _secondary_start",
    "_secondary_start:",
    "mv tp, a0",
    "mv sp, a1",
    "call secondary_main",
    "4:",
    "wfi",
    "j 4b",
    ".section .bss.stack",
    ".align 12",
    "__boot_stack_bottom:",
    ".space 65536",
    "__boot_stack_top:",
    // One stack per hart id (`smp::HART_STACK` bytes each; the boot hart's slot unused).
    ".globl __hart_stacks",
    "__hart_stacks:",
    ".space 65536 * 4",
);

/// What the trap handler needs: the core and the CPU's device id.
pub struct Kernel {
    /// The memory manager.
    pub gm: Gmem,
    /// The harts, as the core's host CPU device (one device for all of them).
    pub cpu: DeviceId,
}

/// Set once the core is up; read by the trap handler.
pub static KERNEL: spin::Once<Kernel> = spin::Once::new();

/// Where the region lives and how big it is.
const SPACE_BEGIN: u64 = 0x1_0000_0000;
const SPACE_END: u64 = 0x2_0000_0000;
const REGION_PAGES: u64 = 32;
/// Pages first touched by a load (the rest by a store).
const LOAD_PAGES: u64 = 8;

fn pattern(va: u64) -> u64 {
    va.rotate_left(17) ^ 0x6d65_6d67_5f73_7639
}

#[no_mangle]
extern "C" fn kmain(hart: u64, dtb: u64) -> ! {
    println!();
    println!("sv39-kernel: hart {hart}, device tree at {dtb:#x}");
    trap::init();
    let Some(layout) = Layout::compute() else {
        println!("the kernel image leaves no room for heap, page tables and RAM");
        exit_fail(2);
    };
    // SAFETY: called once, first thing, with the computed layout (free RAM after the
    // kernel image, below the end of RAM).
    unsafe { layout.init_heap() };
    println!(
        "memory: kernel ends {:#x}, heap {:#x}..{:#x}, page tables {:#x}..{:#x}, gmem RAM {:#x}..{:#x}",
        layout.kernel_end,
        layout.heap.0,
        layout.heap.1,
        layout.page_tables.0,
        layout.page_tables.1,
        layout.gmem.0,
        layout.gmem.1
    );
    match run(&layout) {
        Ok(()) => {
            println!("sv39-kernel: PASS");
            exit_pass()
        }
        Err(e) => {
            println!("sv39-kernel: FAIL: {e}");
            exit_fail(7)
        }
    }
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

fn run(layout: &Layout) -> Result<(), String> {
    // Page-table frames and the global mappings: MMIO (UART, test device) and all of
    // RAM, identity-mapped, so the kernel runs on after satp is written.
    // SAFETY: the pool's range is free RAM (layout), identity mapped by the globals below
    // and used by nothing else.
    let pool = Arc::new(unsafe {
        FramePool::new(layout.page_tables.0, layout.page_tables.1, |line| {
            println!("{line}")
        })
    });
    println!("{}", pool.check_reuse()?);
    let globals = [
        GlobalMapping::identity(0, 1 << 30, Prot::RW),
        GlobalMapping::identity(RAM_BASE, RAM_END - RAM_BASE, Prot::RWX),
    ];
    // SAFETY: paging is off now and RAM is identity mapped afterwards, so page-table
    // frames are reachable at their physical addresses (offset 0).
    let hart = SmpHart::new(unsafe { DirectHart::new(0) });
    // SAFETY: the pool's frames are the driver's alone and reachable through `hart`;
    // the global mappings cover the kernel image, stack, heap and MMIO it runs on.
    let mmu = Arc::new(
        unsafe { Sv39::new(hart, pool.clone(), Sv39Config::default(), &globals) }
            .map_err(|e| format!("Sv39 driver: {e}"))?,
    );
    // SAFETY: the gmem range is free RAM (layout), identity mapped, and only the core
    // hands it out.
    let ram = Arc::new(unsafe { DirectRam::new(layout.gmem.0, layout.gmem.1) });
    let gm = Gmem::new(
        Arc::new(SmpPlatform),
        DeviceDesc {
            name: "hart0".into(),
            mmu: mmu.clone(),
            memory: Some(ram),
            caps: DevCaps::FAULTABLE,
            data: None,
        },
    )
    .map_err(|e| format!("Gmem::new: {e}"))?;
    let cpu = gm.host();
    let k = KERNEL.call_once(|| Kernel { gm, cpu });
    let gm = &k.gm;

    gm.dev_register_physmem(
        cpu,
        gmem_core::PhysAddr::new(layout.gmem.0),
        gmem_core::PhysAddr::new(layout.gmem.1),
    )
    .map_err(|e| format!("dev_register_physmem: {e}"))?;
    let registered = gm.dev_frames(cpu).map_err(|e| format!("{e}"))?.free;
    let space = gm
        .as_create(
            VirtAddr::new(SPACE_BEGIN),
            VirtAddr::new(SPACE_END),
            AllocPolicy::empty(),
        )
        .map_err(|e| format!("as_create: {e}"))?;
    println!(
        "gmem: {registered} frames registered, space {SPACE_BEGIN:#x}..{SPACE_END:#x}; satp = {:#x} (bare)",
        trap::satp()
    );

    gm.as_attach(space, cpu, MmuMode::Coherent, Activation::Switch)
        .map_err(|e| format!("as_attach: {e}"))?;
    let satp = trap::satp();
    check(satp >> 60 == 8, || format!("satp {satp:#x} is not Sv39"))?;
    let root = PageTableRoot((satp & ((1 << 44) - 1)) << 12);
    println!(
        "attached: satp = {satp:#x} (Sv39, root {:#x}) - paging on, kernel still running",
        root.0
    );

    let region = gm
        .as_alloc(space, AllocRequest::new(REGION_PAGES * PAGE_SIZE))
        .map_err(|e| format!("as_alloc: {e}"))?;
    let base = region.start.as_u64();
    println!(
        "region: {base:#x}..{:#x} ({REGION_PAGES} pages), nothing mapped yet",
        base + REGION_PAGES * PAGE_SIZE
    );
    check(mmu.translate(root, region.start).is_none(), || {
        "a fresh region is already mapped".into()
    })?;

    // Loads first: each first touch is a load page fault, served with a zeroed page.
    for p in 0..LOAD_PAGES {
        let va = (base + p * PAGE_SIZE) as *const u64;
        // SAFETY: `va` is inside the region the core just allocated for this space; the
        // first access faults and the core maps a zeroed frame before the load retries.
        let v = unsafe { core::ptr::read_volatile(va) };
        check(v == 0, || {
            format!("page {p}: read {v:#x} from a zero-filled page")
        })?;
    }
    // Then stores over every word of every page.
    let words = PAGE_SIZE / 8;
    for p in 0..REGION_PAGES {
        for w in 0..words {
            let va = base + p * PAGE_SIZE + w * 8;
            // SAFETY: inside the region; the first store to a page not yet mapped faults
            // and the core maps it (read-write) before the store retries.
            unsafe { core::ptr::write_volatile(va as *mut u64, pattern(va)) };
        }
    }
    // Verify through the region and through the frames the hart's table points at.
    for p in 0..REGION_PAGES {
        let page = base + p * PAGE_SIZE;
        let t = mmu
            .translate(root, VirtAddr::new(page))
            .ok_or_else(|| format!("page {page:#x} is not mapped after its fault"))?;
        let pa = t.pa.as_u64();
        check((layout.gmem.0..layout.gmem.1).contains(&pa), || {
            format!("page {page:#x} maps {pa:#x}, outside the registered RAM")
        })?;
        for w in 0..words {
            let va = page + w * 8;
            // SAFETY: inside the region, now mapped; `pa + w * 8` is the same byte through
            // the identity mapping of RAM.
            let (v, raw) = unsafe {
                (
                    core::ptr::read_volatile(va as *const u64),
                    core::ptr::read_volatile((pa + w * 8) as *const u64),
                )
            };
            check(v == pattern(va) && raw == v, || {
                format!(
                    "word {va:#x}: read {v:#x} (frame {raw:#x}), wrote {:#x}",
                    pattern(va)
                )
            })?;
        }
    }
    let loads = trap::LOAD_FAULTS.load(Ordering::Relaxed);
    let stores = trap::STORE_FAULTS.load(Ordering::Relaxed);
    println!(
        "touched: {REGION_PAGES} pages, {} words verified through the region and the frames",
        REGION_PAGES * words
    );
    check(
        loads == LOAD_PAGES && stores == REGION_PAGES - LOAD_PAGES,
        || {
            format!(
                "expected {LOAD_PAGES} load and {} store faults, took {loads} and {stores}",
                REGION_PAGES - LOAD_PAGES
            )
        },
    )?;
    let s = gm.stats();
    check(
        s.faults_zero_fill == REGION_PAGES && s.pages_zeroed == REGION_PAGES,
        || format!("core stats disagree with the faults taken: {s:?}"),
    )?;
    let tables_before = mmu.frames_held();

    // Deallocate, then touch the freed range: the core refuses with a typed error.
    gm.region_dealloc(region, MapFlags::empty(), None)
        .map_err(|e| format!("region_dealloc: {e}"))?;
    check(mmu.translate(root, region.start).is_none(), || {
        "the region is still mapped after dealloc".into()
    })?;
    let frames = gm.dev_frames(cpu).map_err(|e| format!("{e}"))?;
    check(frames.free == registered, || {
        format!("{} of {registered} frames free after dealloc", frames.free)
    })?;
    println!(
        "dealloc: region unmapped, {} frames back, {} page-table pages freed",
        REGION_PAGES,
        tables_before - mmu.frames_held()
    );
    let probe = trap::probe_read(region.start);
    let refused = match probe {
        Err(e @ FaultError::NotAllocated(va)) if va == region.start => e,
        other => return Err(format!("probe of the freed region gave {other:?}")),
    };
    println!("probe: access to the freed region -> {refused:?} (recovered)");

    megapage(gm, &mmu, root, space, layout)?;

    let s = gm.stats();
    let d = mmu.stats();
    println!("---- summary ----");
    println!(
        "page faults taken: {} (load {}, store {}, instruction {}); served by gmem: {}; refused: {}",
        trap::LOAD_FAULTS.load(Ordering::Relaxed)
            + trap::STORE_FAULTS.load(Ordering::Relaxed)
            + trap::FETCH_FAULTS.load(Ordering::Relaxed),
        trap::LOAD_FAULTS.load(Ordering::Relaxed),
        trap::STORE_FAULTS.load(Ordering::Relaxed),
        trap::FETCH_FAULTS.load(Ordering::Relaxed),
        trap::SERVED.load(Ordering::Relaxed),
        s.faults_failed
    );
    println!(
        "gmem stats: faults_zero_fill {}, pages_zeroed {}, mmu_maps {}, mmu_unmaps {}, invalidations {}, faults_failed {}, large_maps {}, large_splits {}",
        s.faults_zero_fill, s.pages_zeroed, s.mmu_maps, s.mmu_unmaps, s.invalidations, s.faults_failed, s.large_maps, s.large_splits
    );
    println!(
        "sv39 driver: pages mapped {}, unmapped {}, tables allocated {} / freed {}, sfence.vma per-page {} / full {}, satp writes {}",
        d.pages_mapped, d.pages_unmapped, d.tables_allocated, d.tables_freed, d.fences_page, d.fences_all, d.satp_writes
    );
    println!("typed error from the freed region: {refused:?}");
    println!(
        "page-table frames in use {}, heap in use {} KiB",
        pool.in_use(),
        memory::heap_used() / 1024
    );
    check(s.faults_failed == 1, || {
        format!("{} faults refused, expected 1", s.faults_failed)
    })?;
    smp::run(k, &mmu, root, space, layout)
}

/// A 2 MiB-aligned region: one fault, one megapage, every word verified; then a
/// partial protect splits the megapage and every word is verified again.
fn megapage(
    gm: &Gmem,
    mmu: &Sv39<SmpHart>,
    root: PageTableRoot,
    space: gmem_core::SpaceId,
    layout: &Layout,
) -> Result<(), String> {
    const BLOCK: u64 = 2 << 20;
    let mut req = AllocRequest::new(BLOCK);
    req.align = BLOCK;
    let big = gm
        .as_alloc(space, req)
        .map_err(|e| format!("as_alloc (2 MiB aligned): {e}"))?;
    let base = big.start.as_u64();
    let before = gm.stats();
    let served = trap::SERVED.load(Ordering::Relaxed);
    // One store: one fault.
    // SAFETY: inside the region the core just allocated; the store faults and the core
    // maps the block before it retries.
    unsafe { core::ptr::write_volatile(base as *mut u64, pattern(base)) };
    let t = mmu
        .translate(root, big.start)
        .ok_or("the megapage region is not mapped after its fault")?;
    let last = mmu
        .translate(root, VirtAddr::new(base + BLOCK - 8))
        .ok_or("the end of the megapage region is not mapped")?;
    let pa = t.pa.as_u64();
    check(
        t.page_size == PageSize::Size2M && pa % BLOCK == 0 && last.pa.as_u64() == pa + BLOCK - 8,
        || format!("expected one 2 MiB leaf, got {t:?} .. {last:?}"),
    )?;
    check((layout.gmem.0..layout.gmem.1).contains(&pa), || {
        format!("the megapage maps {pa:#x}, outside the registered RAM")
    })?;
    let words = BLOCK / 8;
    for w in 0..words {
        let va = base + w * 8;
        // SAFETY: inside the region, mapped by the megapage.
        unsafe { core::ptr::write_volatile(va as *mut u64, pattern(va)) };
    }
    let verify = |what: &str| -> Result<(), String> {
        for w in 0..words {
            let va = base + w * 8;
            // SAFETY: inside the region, mapped; `pa + w * 8` is the same byte through
            // the identity mapping of RAM.
            let (v, raw) = unsafe {
                (
                    core::ptr::read_volatile(va as *const u64),
                    core::ptr::read_volatile((pa + w * 8) as *const u64),
                )
            };
            check(v == pattern(va) && raw == v, || {
                format!("{what}: word {va:#x} read {v:#x} (frame {raw:#x})")
            })?;
        }
        Ok(())
    };
    verify("megapage")?;
    let s = gm.stats();
    let faults = trap::SERVED.load(Ordering::Relaxed) - served;
    check(
        faults == 1
            && s.faults_zero_fill - before.faults_zero_fill == 1
            && s.large_maps - before.large_maps == 1
            && s.pages_zeroed - before.pages_zeroed == 512,
        || format!("expected one fault and one large map: {faults} faults, {s:?}"),
    )?;
    println!(
        "megapage: region {base:#x}..{:#x} (2 MiB, aligned) served by {faults} fault: one 2 MiB leaf {base:#x} -> {pa:#x}, {} pages zeroed, {words} words verified through the region and the frames",
        base + BLOCK,
        s.pages_zeroed - before.pages_zeroed
    );
    // A partial protect: 4 pages from +64 KiB read-only.
    let ro = VirtAddr::new(base + 16 * PAGE_SIZE);
    let range = gmem_core::VaRange::new(ro, 4 * PAGE_SIZE).map_err(|e| format!("{e}"))?;
    gm.region_protect(gmem_core::Pages::range(big.space, range), Prot::READ)
        .map_err(|e| format!("region_protect: {e}"))?;
    let after = gm.stats();
    let t0 = mmu
        .translate(root, big.start)
        .ok_or("unmapped by the split")?;
    let tr = mmu.translate(root, ro).ok_or("protected page unmapped")?;
    let tl = mmu
        .translate(root, VirtAddr::new(base + BLOCK - PAGE_SIZE))
        .ok_or("last page unmapped by the split")?;
    check(
        after.large_splits - s.large_splits == 1
            && t0.page_size == PageSize::Size4K
            && tr.page_size == PageSize::Size4K
            && tr.prot == Prot::READ
            && t0.prot == Prot::RW
            && tl.prot == Prot::RW
            && tr.pa.as_u64() == pa + 16 * PAGE_SIZE
            && tl.pa.as_u64() == pa + BLOCK - PAGE_SIZE,
        || format!("expected a split into 4 KiB leaves: {t0:?} {tr:?} {tl:?}, {after:?}"),
    )?;
    let served = trap::SERVED.load(Ordering::Relaxed);
    verify("after the split")?;
    check(trap::SERVED.load(Ordering::Relaxed) == served, || {
        "reads after the split faulted".into()
    })?;
    println!(
        "split: region_protect({ro}, 4 pages, READ) split the megapage into 4 KiB leaves (large_splits {}): {ro} is {:?}, {base:#x} is {:?}, same frames; {words} words verified again without a fault",
        after.large_splits, tr.prot, t0.prot
    );
    gm.region_dealloc(big, MapFlags::empty(), None)
        .map_err(|e| format!("region_dealloc: {e}"))?;
    check(mmu.translate(root, big.start).is_none(), || {
        "the megapage region is still mapped after dealloc".into()
    })?;
    Ok(())
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    println!("sv39-kernel: PANIC: {info}");
    exit_fail(1)
}
