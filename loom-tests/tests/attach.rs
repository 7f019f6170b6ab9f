//! Loom model (d): attachment races — a switch against a detach, an attach against a
//! destroy.
//!
//! 1. `dev_switch` racing `dev_detach` of the same device and space: whichever order
//!    the two take, a device that ends up active is active on a table that still
//!    exists, and a device whose table was destroyed is not active anywhere. Broken
//!    variant `gmem_loom_bug="switch_activates_after_unlock"` binds and activates after
//!    dropping the space lock (the code before the fix): the detach can destroy the
//!    table in between, and the device is activated on a freed root.
//! 2. `as_attach` racing `dev_destroy` of the same device: exactly one of them may
//!    succeed, and if the destroy did, no space has the device attached. Broken
//!    variant `gmem_loom_bug="attach_binds_after_unlock"` records the binding after the
//!    space lock is dropped (the code before the fix): the destroy passes its
//!    `StillAttached` check in between and both calls succeed.

#![cfg(gmem_loom)]

mod common;

use std::sync::Arc;

use gmem_core::testing::TestSystem;
use gmem_core::*;

/// Preemption bound of these models.
const PREEMPTIONS: usize = 3;

fn space(s: &TestSystem) -> SpaceId {
    common::space(s, 4 * PAGE_SIZE, &[])
}

#[test]
#[cfg_attr(
    gmem_loom_bug = "switch_activates_after_unlock",
    should_panic(expected = "activated on a destroyed page table")
)]
fn a_switch_racing_a_detach_never_activates_a_destroyed_table() {
    common::model("attach: switch vs detach", PREEMPTIONS, || {
        let mut s = TestSystem::without_log(2);
        let d = s.add_device(7, DevCaps::FAULTABLE, 0x8000_0000, 1);
        let sp = space(&s);
        let id = s.devices[d].id;
        s.gm.as_attach(sp, id, MmuMode::Coherent, Activation::Leave)
            .unwrap();
        let s = Arc::new(s);
        let switcher = {
            let s = s.clone();
            loom::thread::spawn(move || s.gm.dev_switch(id, sp))
        };
        let detached = s.gm.dev_detach(id, sp);
        let switched = switcher.join().unwrap();
        assert_eq!(detached, Ok(()));
        let mmu = &s.devices[d].mmu;
        if let Some(root) = mmu.active_root() {
            assert!(
                mmu.store().is_live(root),
                "device activated on a destroyed page table {root:?} (switch: {switched:?})"
            );
        }
        // Either the switch came first (and the detach deactivated the device) or it
        // found the device detached.
        assert!(switched.is_ok() || switched == Err(AttachError::NotAttached));
        assert_eq!(s.gm.dev_active(id), Ok(None));
    });
}

#[test]
#[cfg_attr(
    gmem_loom_bug = "attach_binds_after_unlock",
    should_panic(expected = "destroyed device left attached")
)]
fn an_attach_racing_a_destroy_lets_exactly_one_win() {
    common::model("attach: attach vs destroy", PREEMPTIONS, || {
        let mut s = TestSystem::without_log(2);
        let d = s.add_device(7, DevCaps::FAULTABLE, 0, 0);
        let sp = space(&s);
        let id = s.devices[d].id;
        let s = Arc::new(s);
        let attacher = {
            let s = s.clone();
            loom::thread::spawn(move || {
                s.gm.as_attach(sp, id, MmuMode::Coherent, Activation::Leave)
            })
        };
        let destroyed = s.gm.dev_destroy(id);
        let attached = attacher.join().unwrap();
        assert!(
            !(destroyed.is_ok() && attached.is_ok()),
            "destroyed device left attached (attach: {attached:?})"
        );
        assert!(destroyed.is_ok() || attached.is_ok());
        if destroyed.is_ok() {
            assert_eq!(s.gm.dev_caps(id), Err(DeviceError::UnknownDevice(id)));
        }
        s.gm.check_invariants(sp).unwrap();
    });
}
