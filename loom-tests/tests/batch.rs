//! Loom model: a batched fault races a strict unmap of its region (issue 35).
//!
//! Setup: the host and a faultable device with four pages of local memory, attached
//! coherent to one space, and a two-page region holding a pattern the host wrote.
//! Then at once: the device serves a batch of three records (both pages, one of them
//! twice) with tree prefetch on, as its fault buffer would deliver them; and the host
//! unmaps the region's first page strictly (`region_unmap` without `ASYNC`: its
//! pages are invalidated everywhere before the call returns).
//!
//! Checked: the batch is never refused whole and each record's outcome is a success
//! (every page is allocated, readable and writable; an unmapped anonymous page is
//! zero-filled again); the second page keeps its pattern wherever it lives; the first
//! page reads the pattern (the batch came after the unmap's edits, or the unmap has
//! not run) or zeros (the unmap came last) — never anything else; no frame is mapped
//! again before the invalidation of its old mapping (the event log); no TLB holds a
//! translation its table lacks; `check_invariants` holds.

#![cfg(gmem_loom)]

mod common;

use std::sync::Arc;

use gmem_core::policy::prefetch::PrefetchConfig;
use gmem_core::testing::TestSystem;
use gmem_core::*;

/// Preemption bound of this model.
const PREEMPTIONS: usize = 3;
const PATTERN: &[u8] = b"gmem-ok!";

#[test]
fn a_batched_fault_racing_a_strict_unmap_leaves_the_bytes_and_no_stale_translation() {
    common::model("batch", PREEMPTIONS, || {
        let mut s = TestSystem::new(8);
        let d = s.add_device(7, DevCaps::FAULTABLE, 0x8000_0000, 4);
        let space = common::space(&s, 4 * PAGE_SIZE, &[0, d]);
        let r =
            s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
                .unwrap();
        let second = VirtAddr::new(r.start.as_u64() + PAGE_SIZE);
        s.write(0, r.start, PATTERN).unwrap();
        s.write(0, second, PATTERN).unwrap();
        let gpu = s.devices[d].id;
        s.gm.dev_set_prefetch(gpu, Some(PrefetchConfig::new(51, 1).unwrap()))
            .unwrap();
        let s = Arc::new(s);

        let faulter = {
            let s = s.clone();
            loom::thread::spawn(move || {
                let batch = [
                    BatchFault {
                        va: second,
                        access: Prot::READ,
                    },
                    BatchFault {
                        va: r.start,
                        access: Prot::READ,
                    },
                    BatchFault {
                        va: VirtAddr::new(second.as_u64() + 8),
                        access: Prot::WRITE,
                    },
                ];
                let rep = s.gm.dev_fault_batch(gpu, &batch).unwrap();
                assert_eq!((rep.pages, rep.duplicates), (2, 1));
                for o in &rep.outcomes {
                    assert!(o.is_ok(), "{o:?}");
                }
            })
        };
        let unmap = Pages::range(space, VaRange::new(r.start, PAGE_SIZE).unwrap());
        s.gm.region_unmap(unmap, MapFlags::empty(), None).unwrap();
        faulter.join().unwrap();

        assert_eq!(s.read(d, second, PATTERN.len()).unwrap(), PATTERN);
        let first = s.read(d, r.start, PATTERN.len()).unwrap();
        assert!(
            first == PATTERN || first == [0; PATTERN.len()],
            "the first page reads {first:?}"
        );
        assert_eq!(s.read(0, second, PATTERN.len()).unwrap(), PATTERN);
        s.gm.as_synchronize(space).unwrap();
        for dev in [0, d] {
            let mmu = &s.devices[dev].mmu;
            let root = mmu.active_root().unwrap();
            for va in [r.start, second] {
                common::assert_tlb_current(mmu, root, va, &format!("device {dev}"));
            }
        }
        common::check_reuse_after_invalidation(&s.take_events());
        s.gm.check_invariants(space).unwrap();
    });
}
