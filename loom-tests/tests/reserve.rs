//! Loom model (f): two devices fault into one superpage reservation at once.
//!
//! Setup: the host and two faultable devices; device 1 has 1024 pages of local memory
//! (two 2 MiB blocks), both are attached coherent to one space, and a 2 MiB-aligned
//! region of two pages, zero-filled a 4 KiB page at a time, places every page in
//! device 1's memory. Then device 1 writes page 0 and device 2 writes page 1 at once
//! (fault-and-retry as hardware does): the first fault reserves an aligned 2 MiB block
//! of device 1's memory, the second is served from the same reservation, whichever
//! comes first.
//!
//! Checked: both pages hold what was written (read back through the host); both live
//! in device 1's memory on the frames at their offsets of one 2 MiB-aligned block; one
//! reservation was made and serves both; `check_invariants` (with the reservation
//! invariants: every frame of a reservation reserved, pending or backing the page at
//! its offset) holds.

#![cfg(gmem_loom)]

mod common;

use std::sync::Arc;

use gmem_core::testing::TestSystem;
use gmem_core::*;

/// Preemption bound of this model.
const PREEMPTIONS: usize = 2;
const BLOCK: u64 = 2 << 20;

#[test]
fn two_devices_faulting_into_one_reserved_block_share_its_reservation() {
    common::model("reserve", PREEMPTIONS, || {
        let mut s = TestSystem::new(4);
        let d1 = s.add_device(7, DevCaps::FAULTABLE, 0x8000_0000, 1024);
        let d2 = s.add_device(8, DevCaps::FAULTABLE, 0, 0);
        let space = common::space(&s, 2 * BLOCK, &[0, d1, d2]);
        let mut req = AllocRequest::new(2 * PAGE_SIZE);
        req.align = BLOCK;
        let r = s.gm.as_alloc(space, req).unwrap();
        s.gm.region_set_zero_fill_block(r, PAGE_SIZE).unwrap();
        let placement = Placement {
            target: PlacementTarget::Device(s.devices[d1].id),
            mode: PlacementMode::RemoteAccess,
        };
        s.gm.region_set_policy(r, placement).unwrap();
        let s = Arc::new(s);
        let writers: Vec<_> = [(d1, 0u64), (d2, 1)]
            .into_iter()
            .map(|(d, page)| {
                let s = s.clone();
                loom::thread::spawn(move || {
                    let va = VirtAddr::new(r.start.as_u64() + page * PAGE_SIZE);
                    s.write(d, va, &[page as u8 + 1; 8]).unwrap();
                })
            })
            .collect();
        for t in writers {
            t.join().unwrap();
        }
        s.gm.check_invariants(space).unwrap();
        let mut frames = Vec::new();
        s.gm.as_frames(
            space,
            VaRange::new(r.start, 2 * PAGE_SIZE).unwrap(),
            |v, d, pa| frames.push((v, d, pa)),
        )
        .unwrap();
        let mem = s.devices[d1].id;
        assert_eq!(frames.len(), 2);
        assert!(frames.iter().all(|(_, d, _)| *d == mem));
        let base = frames[0].2.as_u64();
        assert_eq!(base % BLOCK, 0, "page 0 at offset 0 of an aligned block");
        assert_eq!(frames[1].2.as_u64(), base + PAGE_SIZE, "page 1 beside it");
        let rs = s.gm.dev_reservations(mem).unwrap();
        assert_eq!((rs.made, rs.live, rs.frames_served), (1, 1, 2));
        for page in 0..2u64 {
            let va = VirtAddr::new(r.start.as_u64() + page * PAGE_SIZE);
            assert_eq!(s.read(0, va, 8).unwrap(), vec![page as u8 + 1; 8]);
        }
        s.gm.check_invariants(space).unwrap();
    });
}
