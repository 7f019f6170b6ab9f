//! The concurrent faults: every hart stores into the same pages at once.

use super::{load, phase, store, tag, Plan, BARRIER, PLAN};
use crate::board::MAX_HARTS;
use crate::sbi::SmpHart;
use crate::trap::HART_FAULTS;
use crate::{check, println, Kernel};
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};
use gmem_core::{AllocRequest, MapFlags, PageSize, PageTableRoot, SpaceId, VirtAddr, PAGE_SIZE};
use gmem_sv39::Sv39;

/// Pages of the concurrent-fault region.
const FAULT_PAGES: u64 = 64;
/// A 2 MiB block.
const BLOCK: u64 = 2 << 20;

#[allow(clippy::declare_interior_mutable_const)]
const NO_TRAPS: AtomicU32 = AtomicU32::new(0);
/// Harts whose store into page `i` of the concurrent-fault region trapped.
static PAGE_TRAPS: [AtomicU32; FAULT_PAGES as usize] = [NO_TRAPS; FAULT_PAGES as usize];

/// Phase 1: every hart stores into the block and into every page of the region.
pub(super) fn concurrent_faults(hart: usize) -> Result<(), String> {
    let plan = *PLAN.lock();
    BARRIER.wait("fault start")?;
    let h = hart as u64;
    // Page by page, all harts leave a barrier together and store into the same page.
    for p in 0..FAULT_PAGES {
        BARRIER.wait("page start")?;
        let va = plan.a + p * PAGE_SIZE + h * 8;
        let before = HART_FAULTS[hart].load(Ordering::Relaxed);
        store(va, tag(va, h));
        if HART_FAULTS[hart].load(Ordering::Relaxed) != before {
            PAGE_TRAPS[p as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
    BARRIER.wait("block start")?;
    // All harts in the same 2 MiB block at once: each in its own quarter.
    let va = plan.b + h * (BLOCK / 4) + h * 8;
    store(va, tag(va, h));
    BARRIER.wait("fault end")?;
    for p in 0..FAULT_PAGES {
        for o in 0..MAX_HARTS as u64 {
            let va = plan.a + p * PAGE_SIZE + o * 8;
            let v = load(va);
            check(v == tag(va, o), || {
                format!("word {va:#x} of hart {o}: {v:#x} seen by hart {hart}")
            })?;
        }
    }
    Ok(())
}

/// The boot hart's side: the regions, the phase, the counts and the verification.
///
/// # Errors
/// The first check that failed.
pub(super) fn run(
    k: &Kernel,
    mmu: &Arc<Sv39<SmpHart>>,
    root: PageTableRoot,
    space: SpaceId,
    boot: usize,
) -> Result<(), String> {
    let gm = &k.gm;
    let before = gm.stats();
    let faults_before: Vec<u64> = HART_FAULTS
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    let r1 = gm
        .as_alloc(space, AllocRequest::new(FAULT_PAGES * PAGE_SIZE))
        .map_err(|e| format!("as_alloc: {e}"))?;
    gm.region_set_zero_fill_block(r1, PAGE_SIZE)
        .map_err(|e| format!("region_set_zero_fill_block: {e}"))?;
    let mut req = AllocRequest::new(BLOCK);
    req.align = BLOCK;
    let r2 = gm
        .as_alloc(space, req)
        .map_err(|e| format!("as_alloc (2 MiB): {e}"))?;
    *PLAN.lock() = Plan {
        a: r1.start.as_u64(),
        b: r2.start.as_u64(),
        value: 0,
    };
    phase(1, boot)?;
    let s = gm.stats();
    let per_hart: Vec<u64> = HART_FAULTS
        .iter()
        .zip(&faults_before)
        .map(|(c, b)| c.load(Ordering::Relaxed) - b)
        .collect();
    let traps: u64 = per_hart.iter().sum();
    let zero_fills = s.faults_zero_fill - before.faults_zero_fill;
    let spurious = s.faults_spurious - before.faults_spurious;
    let existing = s.faults_map_existing - before.faults_map_existing;
    let zeroed = s.pages_zeroed - before.pages_zeroed;
    let large = s.large_maps - before.large_maps;
    check(
        zero_fills == FAULT_PAGES + 1
            && zeroed == FAULT_PAGES + BLOCK / PAGE_SIZE
            && large == 1
            && s.faults_failed == before.faults_failed
            && traps == zero_fills + spurious + existing,
        || {
            format!(
                "concurrent faults: {traps} traps, {zero_fills} zero-fills ({zeroed} pages), {spurious} spurious, {existing} mapped existing, {large} large maps, failed {}",
                s.faults_failed - before.faults_failed
            )
        },
    )?;
    // Every page has its own frame, the block one 2 MiB leaf; every byte as written.
    let mut frames = Vec::new();
    let words = PAGE_SIZE / 8;
    for p in 0..FAULT_PAGES {
        let page = r1.start.as_u64() + p * PAGE_SIZE;
        let t = mmu
            .translate(root, VirtAddr::new(page))
            .ok_or_else(|| format!("page {page:#x} unmapped after the concurrent faults"))?;
        frames.push(t.pa.as_u64());
        for w in 0..words {
            let va = page + w * 8;
            let want = if (w as usize) < MAX_HARTS {
                tag(va, w)
            } else {
                0
            };
            let v = load(va);
            check(v == want, || {
                format!("word {va:#x}: {v:#x}, expected {want:#x}")
            })?;
        }
    }
    frames.sort_unstable();
    frames.dedup();
    check(frames.len() as u64 == FAULT_PAGES, || {
        format!("{} distinct frames for {FAULT_PAGES} pages", frames.len())
    })?;
    let b = r2.start.as_u64();
    let t = mmu
        .translate(root, r2.start)
        .ok_or("the block is unmapped after the concurrent faults")?;
    check(t.page_size == PageSize::Size2M, || {
        format!("the block maps {t:?}")
    })?;
    for w in 0..BLOCK / 8 {
        let va = b + w * 8;
        let owner = (0..MAX_HARTS as u64).find(|&h| va == b + h * (BLOCK / 4) + h * 8);
        let want = owner.map_or(0, |h| tag(va, h));
        let v = load(va);
        check(v == want, || {
            format!("block word {va:#x}: {v:#x}, expected {want:#x}")
        })?;
    }
    let raced = PAGE_TRAPS
        .iter()
        .filter(|t| t.load(Ordering::Relaxed) > 1)
        .count();
    println!(
        "smp: concurrent faults served: {traps} page faults on {MAX_HARTS} harts (per hart {per_hart:?}); {FAULT_PAGES} pages, all harts leaving a barrier to store into each ({raced} pages faulted by 2+ harts), zero-filled once each ({FAULT_PAGES} distinct frames); one 2 MiB block all {MAX_HARTS} harts left a barrier to store into ({} fault(s)), zero-filled once (one megapage, {} pages); {} zero-fills, {spurious} spurious (the page was mapped by the time the core took the fault), {existing} mapped existing, 0 refused; {} words verified",
        traps - PAGE_TRAPS.iter().map(|t| u64::from(t.load(Ordering::Relaxed))).sum::<u64>(),
        BLOCK / PAGE_SIZE,
        zero_fills,
        FAULT_PAGES * words + BLOCK / 8
    );
    for r in [r1, r2] {
        gm.region_dealloc(r, MapFlags::empty(), None)
            .map_err(|e| format!("region_dealloc: {e}"))?;
    }
    Ok(())
}
