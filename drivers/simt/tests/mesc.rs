//! The six designs of the MESC evaluation plugged into the integrated GPU (and into the
//! discrete GPU, its own tables keeping the bits): every
//! translation a design's caches serve equals a fresh walk, workloads stay verified,
//! MESC coalesces what the allocator made contiguous, one changed page drops the entry
//! covering it, and runs are repeatable.

use gmem_core::{Prot, VaRange, VirtAddr, PAGE_SIZE};
use gmem_simt::caches::GpuCaches;
use gmem_simt::machine::{SimtMachine, MESC_UNITS};
use gmem_simt::mesc::{Design, DesignCaches, Geometry};
use gmem_simt::workloads::{self, pages_needed, Size};

fn machine(design: Design, pages: u64) -> SimtMachine {
    SimtMachine::integrated_with(pages + 1024, design.x86(), |t| {
        DesignCaches::new(design, Geometry::paper(MESC_UNITS), t)
            .map(|c| Box::new(c) as Box<dyn GpuCaches>)
            .map_err(|e| e.to_string())
    })
    .unwrap()
}

fn discrete(design: Design, pages: u64) -> SimtMachine {
    SimtMachine::discrete_with(pages + 1024, pages + 1024, design.mesc(), |t| {
        DesignCaches::new(design, Geometry::paper(MESC_UNITS), t)
            .map(|c| Box::new(c) as Box<dyn GpuCaches>)
            .map_err(|e| e.to_string())
    })
    .unwrap()
}

/// The space's data starts at 4 GiB (see `SimtMachine::new`).
const BASE: u64 = 1 << 32;

/// Run ATAX (medium) on `m` built with design `d`: the output verifies, every cached
/// translation equals a fresh walk, and only MESC designs touch subregion entries.
/// Returns the walks.
fn atax_walks(m: &SimtMachine, d: Design, pages: u64) -> u64 {
    let o = workloads::run(m, "atax", Size::Medium).unwrap();
    assert!(o.verified, "{d:?}: atax did not verify");
    let checked = m
        .audit_tlbs((0..pages).map(|p| BASE + p * PAGE_SIZE))
        .unwrap();
    assert!(checked > 0, "{d:?}: nothing cached to audit");
    let ds = m.design_stats().unwrap();
    if d.mesc() {
        assert!(ds.subregion_hits > 0, "{d:?}: no subregion entry ever hit");
    } else {
        assert_eq!((ds.subregion_hits, ds.extra_reads), (0, 0));
    }
    m.gpu_mmu().caches.walks
}

#[test]
fn every_design_serves_what_a_walk_gives_and_workloads_verify() {
    // Medium: the matrix spans two 2 MiB blocks, so THP has aligned blocks to use.
    let pages = pages_needed("atax", Size::Medium);
    let mut walks = Vec::new();
    for d in Design::ALL {
        walks.push((d, atax_walks(&machine(d, pages), d, pages)));
    }
    let of = |d| walks.iter().find(|w| w.0 == d).unwrap().1;
    // On an unfragmented memory, the allocator's runs let MESC walk far less.
    assert!(of(Design::Mesc) * 2 < of(Design::Base), "{walks:?}");
    assert!(of(Design::Thp) < of(Design::Base), "{walks:?}");
}

#[test]
fn every_design_on_the_discrete_gpu_serves_what_a_walk_gives_and_workloads_verify() {
    let pages = pages_needed("atax", Size::Medium);
    let mut walks = Vec::new();
    for d in Design::ALL {
        walks.push((d, atax_walks(&discrete(d, pages), d, pages)));
    }
    let of = |d| walks.iter().find(|w| w.0 == d).unwrap().1;
    // Video memory is unfragmented: the pages migrated in keep runs MESC coalesces.
    assert!(of(Design::Mesc) * 2 < of(Design::Base), "{walks:?}");
    // The format has no 2 MiB leaves: THP is the baseline there.
    assert_eq!(of(Design::Thp), of(Design::Base), "{walks:?}");
}

#[test]
fn results_are_repeatable() {
    let pages = pages_needed("bicg", Size::Quick);
    let run = || {
        let m = machine(Design::MescColt, pages);
        let o = workloads::run(&m, "bicg", Size::Quick).unwrap();
        (
            o.stats.cycles,
            m.gpu_mmu().caches,
            m.design_stats().unwrap(),
        )
    };
    assert_eq!(run(), run());
}

#[test]
fn one_changed_page_drops_the_subregion_entry_covering_it() {
    let m = machine(Design::Mesc, 2048);
    let r = m.upload(&vec![7u32; 1 << 19]).unwrap(); // 2 MiB
    let gm = m.gm();
    let port = m.port();
    // A page inside a contiguous subregion: a walk coalesces it.
    let va = |p: u64| VirtAddr::new(r.start.as_u64() + p * PAGE_SIZE);
    assert_eq!(port.load_u32(gm, 0, va(70)).unwrap(), 7);
    assert!(m.design_stats().unwrap().modes[0] + m.design_stats().unwrap().modes[2] > 0);
    // Page 100 of the same subregion is held by the shared TLB without a walk of it.
    let walks = m.gpu_mmu().caches.walks;
    assert_eq!(port.load_u32(gm, 1, va(100)).unwrap(), 7);
    assert_eq!(m.gpu_mmu().caches.walks, walks, "page 100 walked");
    assert!(m.audit_tlbs((0..512).map(|p| va(p).as_u64())).unwrap() > 0);
    // Change page 90 (in the same subregion): the covering entry must go.
    let one = VaRange::new(va(90), PAGE_SIZE).unwrap();
    gm.region_protect(gmem_core::Pages::range(r.space, one), Prot::READ)
        .unwrap();
    m.audit_tlbs((0..512).map(|p| va(p).as_u64())).unwrap();
    let s = m.gpu_mmu().caches;
    assert_eq!(port.load_u32(gm, 2, va(100)).unwrap(), 7);
    assert!(
        m.gpu_mmu().caches.walks > s.walks,
        "page 100 served by a stale entry"
    );
    assert!(m.audit_tlbs((0..512).map(|p| va(p).as_u64())).unwrap() > 0);
    // The frame is no longer one run: page 300 (subregion 4, still contiguous) walks
    // in mode (c) and fills the memory-subregion cache; changing page 310 drops the
    // cache's line of the frame with the entry.
    let before = m.design_stats().unwrap();
    assert_eq!(port.load_u32(gm, 3, va(300)).unwrap(), 7);
    let after = m.design_stats().unwrap();
    assert_eq!(after.modes[2], before.modes[2] + 1, "{after:?}");
    assert_eq!(after.msc_lines, 1);
    let one = VaRange::new(va(310), PAGE_SIZE).unwrap();
    gm.region_protect(gmem_core::Pages::range(r.space, one), Prot::READ)
        .unwrap();
    assert_eq!(m.design_stats().unwrap().msc_lines, 0);
    m.audit_tlbs((0..512).map(|p| va(p).as_u64())).unwrap();
}

/// MESC §IV-D's upkeep: with the bits not kept in edits, MESC coalesces nothing until
/// the OS scan before a launch writes them; with the scan on, it coalesces again, the
/// scan finds the lagging pointers, and every served translation still equals a walk.
#[test]
fn without_eager_upkeep_the_launch_scan_alone_gives_the_bits() {
    let pages = pages_needed("atax", Size::Medium);
    let lazy = |scan: bool| {
        let x86 = gmem_x86pt::X86Config {
            mesc: false,
            ..Design::Mesc.x86()
        };
        let m = SimtMachine::integrated_with(pages + 1024, x86, |t| {
            DesignCaches::new(Design::Mesc, Geometry::paper(MESC_UNITS), t)
                .map(|c| Box::new(c) as Box<dyn GpuCaches>)
                .map_err(|e| e.to_string())
        })
        .unwrap();
        m.set_mesc_scan(scan);
        let o = workloads::run(&m, "atax", Size::Medium).unwrap();
        assert!(o.verified);
        m.audit_tlbs((0..pages).map(|p| BASE + p * PAGE_SIZE))
            .unwrap();
        (m.design_stats().unwrap().subregion_hits, m.mesc_scans())
    };
    let (hits, log) = lazy(false);
    assert_eq!(
        (hits, log),
        (0, None),
        "no upkeep, no scan: no bit, no subregion hit"
    );
    let (hits, log) = lazy(true);
    let log = log.unwrap();
    assert!(hits > 0, "the scan's bits were used");
    assert!(
        log.scans >= 1 && log.repaired > 0 && log.entries_read > 0,
        "{log:?}"
    );
}
