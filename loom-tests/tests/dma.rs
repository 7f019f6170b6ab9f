//! Loom model (n): a strict `dma_unmap`, whose IOTLB invalidation and IOVA release run
//! outside the space lock, racing a `dma_map` that needs the very IOVA it frees and a
//! host fault on a region of the same space.
//!
//! Setup: a space of exactly two pages, the host (it faults) and a NIC (it cannot, a
//! table of its own) attached; a one-page region `r` takes one page, the DMA mapping
//! `a` (an external frame) the other, and the NIC has written through `a` (its TLB
//! caches the translation). Then thread 1 unmaps `a` strictly while thread 2 writes
//! `r` through the host (a zero-fill fault under the space lock) and then maps a new
//! buffer (it can only get `a`'s IOVA) and, if it got one, writes it through the NIC.
//!
//! Checked: when the strict unmap returns the NIC's TLB no longer holds `a`'s page;
//! the map either fails (the IOVA is still reserved) or gets it only after the
//! invalidation — no IOVA is mapped again before the invalidation of its old mapping
//! (the event log, in order); the new buffer's bytes land in its own frame;
//! `check_invariants` holds and no mapping is left. Broken variant
//! `gmem_loom_bug="dma_release_before_invalidation"` returns the IOVA to the arena
//! before the unlocked invalidation: the map then reuses it while the NIC's TLB may
//! still translate it to the old frame, and the new buffer's write goes through that
//! stale translation (caught by the bytes check: the event log starts after `a` was
//! mapped, so it cannot see the reuse by itself).

#![cfg(gmem_loom)]

mod common;

use std::sync::Arc;

use gmem_core::testing::{TestSystem, HOST_BASE};
use gmem_core::*;

/// Preemption bound of this model.
const PREEMPTIONS: usize = 3;

#[test]
#[cfg_attr(
    gmem_loom_bug = "dma_release_before_invalidation",
    should_panic(expected = "stale translation")
)]
fn a_strict_dma_unmap_frees_its_iova_only_after_its_invalidation() {
    common::model(
        "strict dma_unmap vs dma_map and a fault",
        PREEMPTIONS,
        || {
            let mut s = TestSystem::new(1);
            let nic = s.add_device(2, DevCaps::empty(), 0, 0);
            let space = common::space(&s, 2 * PAGE_SIZE, &[0, nic]);
            let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
            let old = PhysAddr::new(HOST_BASE + 10 * PAGE_SIZE);
            let new = PhysAddr::new(HOST_BASE + 11 * PAGE_SIZE);
            let a = s.gm.dma_map(space, &[old], s.gm.host(), Prot::RW).unwrap();
            s.write(nic, a.start, b"a").unwrap();
            let root = s.devices[nic].mmu.active_root().unwrap();
            s.take_events();
            let s = Arc::new(s);
            let mapper = {
                let s = s.clone();
                loom::thread::spawn(move || {
                    s.write(0, r.start, b"r").unwrap();
                    let b = s.gm.dma_map(space, &[new], s.gm.host(), Prot::RW).ok()?;
                    s.write(nic, b.start, b"b").unwrap();
                    Some(b)
                })
            };
            s.gm.dma_unmap(a, MapFlags::empty(), None).unwrap();
            assert!(
                !s.devices[nic].mmu.tlb_holds(root, a.start)
                    || s.gm.dma_mappings(space).unwrap() > 0,
                "a strict dma_unmap returned while the TLB still held the page"
            );
            let b = mapper.join().unwrap();
            common::check_reuse_after_invalidation(&s.take_events());
            if let Some(b) = b {
                let mut got = [0u8; 1];
                s.devices[0]
                    .memory
                    .as_ref()
                    .unwrap()
                    .read(new, &mut got)
                    .unwrap();
                assert_eq!(
                    &got, b"b",
                    "the new buffer lost its DMA: it went through a stale translation of `a`"
                );
                s.gm.dma_unmap(b, MapFlags::empty(), None).unwrap();
            }
            assert_eq!(s.read(0, r.start, 1).unwrap(), b"r");
            s.gm.check_invariants(space).unwrap();
            assert_eq!(s.gm.dma_mappings(space).unwrap(), 0);
        },
    );
}
