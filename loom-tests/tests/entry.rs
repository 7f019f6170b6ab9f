//! Loom model (j): the entry protocol of a fault — `dev_fault` racing `as_destroy` and
//! `dev_detach`.
//!
//! On its fast path a fault takes the space lock with `try_lock` while the device's
//! binding still names the space, drops the binding and works on the space with no
//! reference of its own: the registry's reference, which `as_destroy` drops only after
//! its locked section, keeps the space alive (`gmem_core`'s `kpi::device` header gives
//! the argument). A loom build keeps the spaces the registry lets go allocated and
//! marks them; the fault asserts that the space it holds is still registered.
//!
//! 1. A host fault racing the destroy of its space: the fault either resolves (before
//!    the destroy, which then frees the page's frame) or finds the device not active;
//!    either way every host frame is free afterwards. Broken variant
//!    `gmem_loom_bug="fault_unbinds_before_locking"` drops the binding before it
//!    locks the space through the pointer: the destroy can run to its end in between,
//!    and the fault reaches a space a real build would have freed.
//! 2. A host fault racing the detach of the host from its space: the fault resolves
//!    or finds the device not active, the space's invariants hold, and the device is
//!    active nowhere afterwards.

#![cfg(gmem_loom)]

mod common;

use std::sync::Arc;

use gmem_core::testing::TestSystem;
use gmem_core::*;

/// Preemption bound of these models.
const PREEMPTIONS: usize = 3;

#[test]
#[cfg_attr(
    gmem_loom_bug = "fault_unbinds_before_locking",
    should_panic(expected = "the registry has let go")
)]
fn a_fault_racing_a_destroy_never_reaches_a_released_space() {
    common::model("entry: fault vs destroy", PREEMPTIONS, || {
        let s = TestSystem::without_log(4);
        let space = common::space(&s, 4 * PAGE_SIZE, &[0]);
        let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        let host = s.gm.host();
        let registered = s.gm.dev_frames(host).unwrap().registered;
        let s = Arc::new(s);
        let faulter = {
            let s = s.clone();
            loom::thread::spawn(move || s.gm.dev_fault(host, r.start, Prot::WRITE))
        };
        s.gm.as_destroy(space).unwrap();
        let faulted = faulter.join().unwrap();
        assert!(
            faulted.is_ok() || faulted == Err(FaultError::NotActive(host)),
            "fault racing a destroy: {faulted:?}"
        );
        assert_eq!(
            s.gm.dev_frames(host).unwrap().free,
            registered,
            "a frame outlived the destroyed space (fault: {faulted:?})"
        );
        assert_eq!(s.gm.dev_active(host), Ok(None));
    });
}

#[test]
fn a_fault_racing_a_detach_resolves_or_finds_the_device_inactive() {
    common::model("entry: fault vs detach", PREEMPTIONS, || {
        let s = TestSystem::without_log(4);
        let space = common::space(&s, 4 * PAGE_SIZE, &[0]);
        let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        let host = s.gm.host();
        let s = Arc::new(s);
        let faulter = {
            let s = s.clone();
            loom::thread::spawn(move || s.gm.dev_fault(host, r.start, Prot::WRITE))
        };
        s.gm.dev_detach(host, space).unwrap();
        let faulted = faulter.join().unwrap();
        assert!(
            faulted.is_ok() || faulted == Err(FaultError::NotActive(host)),
            "fault racing a detach: {faulted:?}"
        );
        s.gm.check_invariants(space).unwrap();
        assert_eq!(s.gm.dev_active(host), Ok(None));
    });
}
