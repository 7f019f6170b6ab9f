//! Loom model (the re-entry rule): a fault that arrives on a CPU whose interrupted
//! context — here, a driver call of another fault — holds the space lock must be
//! answered at once through `dev_try_fault`, never wait for that lock.
//!
//! Setup: a space with the CPU attached and two one-page regions. Thread 1 faults on
//! the first page; inside the driver's `map` of that fault (the space lock held) a
//! fault on the second page re-enters through `dev_try_fault`, as an interrupt handler
//! on the same CPU would. Thread 2 faults on the second page through `dev_try_fault`
//! at the same time, retrying on `Busy` a bounded number of times.
//!
//! Checked: the re-entered fault is answered `Busy` (it cannot get the lock its own
//! thread holds); thread 2 gets `Busy` or a served fault, and once both are done the
//! second page is served by one more try; the invariants hold. Broken variant
//! `gmem_loom_bug="try_fault_waits_for_the_space"` makes `dev_try_fault` wait for the
//! space lock as `dev_fault` does: the re-entered fault then waits for its own thread
//! forever, which the loom spin lock model reports (it names its holder).

#![cfg(gmem_loom)]

mod common;

use std::sync::{Arc, Mutex};

use gmem_core::testing::{GateCall, TestSystem};
use gmem_core::*;

/// What the re-entered fault answered, or the message it failed with.
type Answer = Result<Result<FaultResolution, FaultError>, String>;

/// Preemption bound of this model.
const PREEMPTIONS: usize = 2;

#[test]
#[cfg_attr(
    gmem_loom_bug = "try_fault_waits_for_the_space",
    should_panic(expected = "waits for a lock it holds")
)]
fn a_reentered_fault_is_answered_busy_and_never_waits_for_its_own_context() {
    common::model("re-entered fault", PREEMPTIONS, || {
        let s = TestSystem::new(4);
        let space = common::space(&s, 4 * PAGE_SIZE, &[0]);
        let host = s.host().id;
        let a = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        let b = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        let s = Arc::new(s);
        let inner: Arc<Mutex<Option<Answer>>> = Arc::default();
        {
            let (weak, inner) = (Arc::downgrade(&s), inner.clone());
            s.host().mmu.run_in_next(
                GateCall::Map,
                Box::new(move || {
                    let s = weak.upgrade().expect("alive");
                    // A failure inside the core is carried out of the driver call and
                    // raised where the model holds no lock.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        s.gm.dev_try_fault(host, b.start, Prot::READ)
                    }))
                    .map_err(|p| {
                        p.downcast_ref::<&str>()
                            .map(|m| m.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_default()
                    });
                    *inner.lock().unwrap() = Some(r);
                }),
            );
        }
        let other = {
            let s = s.clone();
            loom::thread::spawn(move || s.gm.dev_try_fault(host, b.start, Prot::READ))
        };
        let outer = s.gm.dev_fault(host, a.start, Prot::WRITE);
        let other = other.join().unwrap();
        assert!(outer.is_ok(), "{outer:?}");
        // The hook ran inside the first map of thread 1's fault, or inside thread 2's
        // map of page b if that came first: either way the lock was its own thread's.
        let answer = inner.lock().unwrap().take();
        let inner = match answer.expect("the driver call ran it") {
            Ok(r) => r,
            Err(message) => panic!("the re-entered fault failed: {message}"),
        };
        assert_eq!(inner, Err(FaultError::Busy(b.start)), "re-entered fault");
        assert!(
            matches!(other, Ok(_) | Err(FaultError::Busy(_))),
            "thread 2: {other:?}"
        );
        assert!(s.gm.dev_try_fault(host, b.start, Prot::READ).is_ok());
        s.gm.check_invariants(space).unwrap();
    });
}
