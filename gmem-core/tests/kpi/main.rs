//! The KPI end to end on the test MMU: every call, its success and error paths, which
//! mappings and invalidations happened in which order, and the invariants after each
//! step.
//!
//! By subject: `spaces` (spaces, attachment, allocation), `faults` (first touch,
//! placement, migration), `mappings` (wired and asynchronous mappings, replication),
//! `devices` (handles, destruction, protection, eviction, concurrency), `atomicity`
//! (failures part-way), `residency` (eviction policies, contiguous migration).

mod atomicity;
mod devices;
mod faults;
mod mappings;
mod residency;
mod spaces;

use gmem_core::testing::{AccessError, MmuEvent, TestSystem};
use gmem_core::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const GPU_BASE: u64 = 0x8000_0000;
const GPU: u32 = 7; // a page-table format of its own

fn va(x: u64) -> VirtAddr {
    VirtAddr::new(x)
}

/// A host with 1024 pages, a space [1 GiB, 2 GiB) with the CPU attached and active.
fn system() -> (TestSystem, SpaceId) {
    let s = TestSystem::new(1024);
    let space = s.space();
    (s, space)
}

fn gpu(s: &mut TestSystem, space: SpaceId, pages: u64) -> usize {
    let g = s.add_device(GPU, DevCaps::FAULTABLE, GPU_BASE, pages);
    s.attach(space, g);
    g
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn ok(s: &TestSystem, space: SpaceId) {
    s.gm.check_invariants(space).unwrap();
}
