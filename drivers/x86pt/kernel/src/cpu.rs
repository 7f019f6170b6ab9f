//! The CPU's MMU through the core: demand zero-fill, a refused write, a 2 MiB leaf and
//! its split.
//!
//! The CPU is attached to a space at 1 TiB (PML4 slot 2, apart from the identity
//! mapping of the low 4 GiB in slot 0): the driver loads CR3 with the space's table and
//! the kernel runs on in it. Every region below starts unmapped; each first touch is a
//! real #PF that the trap handler gives to `gm.dev_try_fault`.

use crate::{check, trap, CpuMmu};
use alloc::format;
use alloc::string::String;
use core::sync::atomic::Ordering;
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, DeviceId, FaultError, Gmem, MapFlags, MmuMode, PageSize,
    PageTableRoot, PhysAddr, Prot, SpaceId, VaRange, VirtAddr, PAGE_SIZE,
};

use crate::memory::Layout;
use crate::println;

/// The CPU's space.
const SPACE_BEGIN: u64 = 0x100_0000_0000;
const SPACE_END: u64 = 0x200_0000_0000;
/// Pages of the zero-fill region, and how many of them a read touches first.
const REGION_PAGES: u64 = 32;
const READ_PAGES: u64 = 8;
const BLOCK: u64 = 2 << 20;

fn pattern(va: u64) -> u64 {
    va.rotate_left(17) ^ 0x6d65_6d67_5f78_3836
}

fn faults() -> (u64, u64) {
    (
        trap::READ_FAULTS.load(Ordering::Relaxed),
        trap::WRITE_FAULTS.load(Ordering::Relaxed),
    )
}

/// Register the core's RAM, create and attach the CPU's space, and run the three
/// demonstrations. Returns the space.
///
/// # Errors
/// A description of the first check that failed.
pub fn run(gm: &Gmem, cpu: DeviceId, mmu: &CpuMmu, layout: &Layout) -> Result<SpaceId, String> {
    gm.dev_register_physmem(
        cpu,
        PhysAddr::new(layout.gmem.0),
        PhysAddr::new(layout.gmem.1),
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
    let before = trap::cr3();
    gm.as_attach(space, cpu, MmuMode::Coherent, Activation::Switch)
        .map_err(|e| format!("as_attach: {e}"))?;
    let cr3 = trap::cr3();
    let root = PageTableRoot(cr3 & 0x000f_ffff_ffff_f000);
    check(
        cr3 != before && mmu.translate(root, VirtAddr::new(0x1000)).is_some(),
        || format!("CR3 {cr3:#x} is not a table of the driver"),
    )?;
    println!(
        "x86: {registered} frames registered, space {SPACE_BEGIN:#x}..{SPACE_END:#x}; CR3 {before:#x} (firmware) -> {cr3:#x} (gmem) - kernel still running"
    );
    zero_fill(gm, mmu, root, space, layout)?;
    read_only(gm, space)?;
    large(gm, mmu, root, space, layout)?;
    let s = gm.stats();
    let d = mmu.stats();
    println!(
        "x86: gmem stats: faults_zero_fill {}, pages_zeroed {}, mmu_maps {}, mmu_unmaps {}, invalidations {}, faults_failed {}, large_maps {}, large_splits {}",
        s.faults_zero_fill, s.pages_zeroed, s.mmu_maps, s.mmu_unmaps, s.invalidations, s.faults_failed, s.large_maps, s.large_splits
    );
    println!(
        "x86: CPU driver: pages mapped {}, unmapped {}, protected {}, tables allocated {} / freed {}, invlpg batches {}, CR3 reloads {}, CR3 loads {}",
        d.pages_mapped, d.pages_unmapped, d.pages_protected, d.tables_allocated, d.tables_freed, d.invalidations_ranged, d.invalidations_all, d.activations
    );
    Ok(space)
}

fn zero_fill(
    gm: &Gmem,
    mmu: &CpuMmu,
    root: PageTableRoot,
    space: SpaceId,
    layout: &Layout,
) -> Result<(), String> {
    let region = gm
        .as_alloc(space, AllocRequest::new(REGION_PAGES * PAGE_SIZE))
        .map_err(|e| format!("as_alloc: {e}"))?;
    let base = region.start.as_u64();
    check(mmu.translate(root, region.start).is_none(), || {
        "a fresh region is already mapped".into()
    })?;
    let (r0, w0) = faults();
    for p in 0..READ_PAGES {
        let va = (base + p * PAGE_SIZE) as *const u64;
        // SAFETY: inside the region the core just allocated for the active space; the
        // first access faults and the core maps a zeroed frame before the load retries.
        let v = unsafe { core::ptr::read_volatile(va) };
        check(v == 0, || {
            format!("page {p}: read {v:#x} from a zero-filled page")
        })?;
    }
    let words = PAGE_SIZE / 8;
    for p in 0..REGION_PAGES {
        for w in 0..words {
            let va = base + p * PAGE_SIZE + w * 8;
            // SAFETY: inside the region; a store to a page not yet mapped faults and the
            // core maps it before the store retries.
            unsafe { core::ptr::write_volatile(va as *mut u64, pattern(va)) };
        }
    }
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
            // SAFETY: inside the region, now mapped; `pa + w * 8` is the same byte
            // through the identity mapping of RAM.
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
    let (r1, w1) = faults();
    let (reads, writes) = (r1 - r0, w1 - w0);
    check(
        reads == READ_PAGES && writes == REGION_PAGES - READ_PAGES,
        || {
            format!(
                "expected {READ_PAGES} read and {} write faults, took {reads} and {writes}",
                REGION_PAGES - READ_PAGES
            )
        },
    )?;
    let s = gm.stats();
    check(s.faults_zero_fill == REGION_PAGES, || {
        format!("core stats disagree with the faults taken: {s:?}")
    })?;
    println!(
        "x86: zero-fill faults served: {} ({reads} read, {writes} write) over {REGION_PAGES} pages at {base:#x}; {} words verified through the region and the frames",
        reads + writes,
        REGION_PAGES * words
    );
    gm.region_dealloc(region, MapFlags::empty(), None)
        .map_err(|e| format!("region_dealloc: {e}"))?;
    check(mmu.translate(root, region.start).is_none(), || {
        "the region is still mapped after dealloc".into()
    })?;
    Ok(())
}

fn read_only(gm: &Gmem, space: SpaceId) -> Result<(), String> {
    let region = gm
        .as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
        .map_err(|e| format!("as_alloc: {e}"))?;
    gm.region_protect(region, Prot::READ)
        .map_err(|e| format!("region_protect: {e}"))?;
    let va = region.start;
    // SAFETY: inside the region; the read faults and the core maps a zeroed frame
    // read-only.
    let v = unsafe { core::ptr::read_volatile(va.as_u64() as *const u64) };
    check(v == 0, || {
        format!("read {v:#x} from a fresh read-only page")
    })?;
    let refused = match trap::probe_write(va, 0x5eed) {
        Err(e @ FaultError::ProtectionViolation { va: at, access, .. })
            if at == va && access == Prot::WRITE =>
        {
            e
        }
        other => return Err(format!("a write to a read-only page gave {other:?}")),
    };
    // SAFETY: as above, mapped now.
    let after = unsafe { core::ptr::read_volatile(va.as_u64() as *const u64) };
    check(after == 0, || {
        format!("the refused write changed the page to {after:#x}")
    })?;
    println!("x86: write to read-only range refused: {refused:?}; the page still reads 0");
    gm.region_dealloc(region, MapFlags::empty(), None)
        .map_err(|e| format!("region_dealloc: {e}"))?;
    Ok(())
}

fn large(
    gm: &Gmem,
    mmu: &CpuMmu,
    root: PageTableRoot,
    space: SpaceId,
    layout: &Layout,
) -> Result<(), String> {
    let mut req = AllocRequest::new(BLOCK);
    req.align = BLOCK;
    let big = gm
        .as_alloc(space, req)
        .map_err(|e| format!("as_alloc (2 MiB aligned): {e}"))?;
    let base = big.start.as_u64();
    let before = gm.stats();
    let served = trap::SERVED.load(Ordering::Relaxed);
    // SAFETY: inside the region the core just allocated; the store faults and the core
    // maps the block before it retries.
    unsafe { core::ptr::write_volatile(base as *mut u64, pattern(base)) };
    let t = mmu
        .translate(root, big.start)
        .ok_or("the 2 MiB region is not mapped after its fault")?;
    let last = mmu
        .translate(root, VirtAddr::new(base + BLOCK - 8))
        .ok_or("the end of the 2 MiB region is not mapped")?;
    let pa = t.pa.as_u64();
    check(
        t.page_size == PageSize::Size2M && pa % BLOCK == 0 && last.pa.as_u64() == pa + BLOCK - 8,
        || format!("expected one 2 MiB leaf, got {t:?} .. {last:?}"),
    )?;
    check((layout.gmem.0..layout.gmem.1).contains(&pa), || {
        format!("the 2 MiB leaf maps {pa:#x}, outside the registered RAM")
    })?;
    let words = BLOCK / 8;
    for w in 0..words {
        let va = base + w * 8;
        // SAFETY: inside the region, mapped by the 2 MiB leaf.
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
    verify("2 MiB leaf")?;
    let s = gm.stats();
    let n = trap::SERVED.load(Ordering::Relaxed) - served;
    check(n == 1 && s.large_maps - before.large_maps == 1, || {
        format!("expected one fault and one large map: {n} faults, {s:?}")
    })?;
    println!(
        "x86: 2 MiB leaf: {base:#x} -> {pa:#x}, served by {n} fault, {words} words verified through the region and the frame"
    );
    let ro = VirtAddr::new(base + 16 * PAGE_SIZE);
    let range = VaRange::new(ro, 4 * PAGE_SIZE).map_err(|e| format!("{e}"))?;
    gm.region_protect(gmem_core::Pages::range(big.space, range), Prot::READ)
        .map_err(|e| format!("region_protect: {e}"))?;
    let after = gm.stats();
    let t0 = mmu
        .translate(root, big.start)
        .ok_or("unmapped by the split")?;
    let tr = mmu.translate(root, ro).ok_or("protected page unmapped")?;
    check(
        after.large_splits - s.large_splits == 1
            && t0.page_size == PageSize::Size4K
            && tr.prot == Prot::READ
            && t0.prot.contains(Prot::WRITE)
            && tr.pa.as_u64() == pa + 16 * PAGE_SIZE,
        || format!("expected a split into 4 KiB leaves: {t0:?} {tr:?}, {after:?}"),
    )?;
    let served = trap::SERVED.load(Ordering::Relaxed);
    verify("after the split")?;
    check(trap::SERVED.load(Ordering::Relaxed) == served, || {
        "reads after the split faulted".into()
    })?;
    let refused = trap::probe_write(ro, 1);
    check(
        matches!(refused, Err(FaultError::ProtectionViolation { .. })),
        || format!("a write to the protected part gave {refused:?}"),
    )?;
    println!(
        "x86: 2 MiB leaf split by region_protect({ro}, 4 pages, READ): 4 KiB leaves, same frames, {words} words verified again without a fault; a write there is refused"
    );
    gm.region_dealloc(big, MapFlags::empty(), None)
        .map_err(|e| format!("region_dealloc: {e}"))?;
    Ok(())
}
