//! The interrupt-safe entry (issue 30, item 1): every KPI call runs inside the
//! platform's critical section, and `dev_try_fault` — the entry for a fault handler
//! that may have interrupted a core call on its own CPU, or a driver callback that
//! calls back — never waits for a lock: it answers `FaultError::Busy` at once.
//!
//! The re-entry is made exactly as an interrupt or a misbehaving driver would make it:
//! inside a driver call (`TestMmu::run_in_next`), on the same thread, while the core
//! holds its locks around that call.

use gmem_core::testing::{EventLog, GateCall, TableStore, TestMemory, TestMmu, TestSystem};
use gmem_core::*;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A re-entered fault's answer and how long it took.
type Answer = (Result<FaultResolution, FaultError>, Duration);

fn va(x: u64) -> VirtAddr {
    VirtAddr::new(x)
}

/// A space [1 GiB, 2 GiB) with the CPU attached and two 1-page regions.
fn setup(s: &TestSystem) -> (SpaceId, Region, Region) {
    let space = s.space();
    let a = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let b = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    (space, a, b)
}

#[test]
fn a_fault_reentering_from_a_driver_call_is_answered_busy_at_once_and_nothing_deadlocks() {
    let s = Arc::new(TestSystem::new(16));
    let (space, a, b) = setup(&s);
    let host = s.host().id;
    // Inside the map of `a`'s fault (the space lock held), a fault on `b` arrives on
    // the same thread, as an interrupt's or a callback's would.
    let seen: Arc<Mutex<Option<Answer>>> = Arc::default();
    {
        let (weak, seen) = (Arc::downgrade(&s), seen.clone());
        s.host().mmu.run_in_next(
            GateCall::Map,
            Box::new(move || {
                let s = weak.upgrade().expect("the system outlives the fault");
                let t = Instant::now();
                let r = s.gm.dev_try_fault(host, b.start, Prot::WRITE);
                *seen.lock().unwrap() = Some((r, t.elapsed()));
            }),
        );
    }
    let outer = s.gm.dev_fault(host, a.start, Prot::WRITE).unwrap();
    assert_eq!(outer.kind, FaultKind::ZeroFill);
    let (inner, took) = seen.lock().unwrap().take().expect("the driver call ran it");
    assert_eq!(inner, Err(FaultError::Busy(b.start)));
    // A bound, not a benchmark: an answer that waited for the lock would never come.
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    // Nothing of `b` changed, and the retry after the handler returned succeeds.
    assert_eq!(s.gm.as_page_frame(space, b.start), Ok(None));
    assert_eq!(
        s.gm.dev_try_fault(host, b.start, Prot::WRITE)
            .map(|r| r.kind),
        Ok(FaultKind::ZeroFill)
    );
    assert_eq!(
        s.gm.stats().faults_failed,
        0,
        "a Busy answer is not a failed fault"
    );
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn dev_try_fault_answers_busy_while_another_thread_holds_the_space_and_serves_after() {
    let s = Arc::new(TestSystem::new(16));
    let (space, a, b) = setup(&s);
    let host = s.host().id;
    // Another thread holds the space lock inside a map of its own fault.
    let gate = s.host().mmu.hold_next(GateCall::Map);
    let t = {
        let s = s.clone();
        std::thread::spawn(move || s.gm.dev_fault(host, a.start, Prot::WRITE))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gate.is_held() {
        assert!(Instant::now() < deadline, "the held map never came");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        s.gm.dev_try_fault(host, b.start, Prot::READ),
        Err(FaultError::Busy(b.start))
    );
    gate.open();
    assert!(t.join().unwrap().is_ok());
    assert!(s.gm.dev_try_fault(host, b.start, Prot::READ).is_ok());
    s.gm.check_invariants(space).unwrap();
}

/// Waiting for the lock instead (what `dev_fault` does) from inside a driver call is
/// the deadlock the try-entry avoids; in a debug build the lock-order checker names
/// it instead of hanging.
#[cfg(debug_assertions)]
#[test]
fn a_waiting_reentry_is_caught_by_the_lock_order_checker() {
    let s = Arc::new(TestSystem::new(16));
    let (_space, a, b) = setup(&s);
    let host = s.host().id;
    let caught: Arc<Mutex<Option<String>>> = Arc::default();
    {
        let (weak, caught) = (Arc::downgrade(&s), caught.clone());
        s.host().mmu.run_in_next(
            GateCall::Map,
            Box::new(move || {
                let s = weak.upgrade().expect("alive");
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    s.gm.dev_fault(host, b.start, Prot::WRITE)
                }));
                let msg = match r {
                    Ok(r) => format!("returned {r:?}"),
                    Err(p) => p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|m| m.to_string()))
                        .unwrap_or_default(),
                };
                *caught.lock().unwrap() = Some(msg);
            }),
        );
    }
    // The outer fault may go on (the inner one panicked before waiting).
    let _ = s.gm.dev_fault(host, a.start, Prot::WRITE);
    let msg = caught
        .lock()
        .unwrap()
        .take()
        .expect("the driver call ran it");
    assert!(
        msg.contains("order") || msg.contains("rank"),
        "the checker did not name the re-entry: {msg}"
    );
}

/// A platform that counts its critical sections and how deep the current one is.
#[derive(Default)]
struct Counting {
    depth: AtomicIsize,
    entered: AtomicUsize,
}

impl Platform for Counting {
    fn current_cpu(&self) -> usize {
        0
    }
    fn cpu_count(&self) -> usize {
        1
    }
    fn enter_critical(&self) -> usize {
        self.entered.fetch_add(1, Ordering::SeqCst);
        // What a kernel saves: the state before (here, the depth).
        self.depth.fetch_add(1, Ordering::SeqCst) as usize
    }
    fn exit_critical(&self, saved: usize) {
        let was = self.depth.fetch_sub(1, Ordering::SeqCst);
        assert_eq!(was - 1, saved as isize, "sections left out of order");
    }
}

#[test]
fn every_kpi_call_and_every_driver_call_runs_inside_the_platforms_critical_section() {
    let platform = Arc::new(Counting::default());
    let log: EventLog = Arc::new(gmem_core::sync::Mutex::new(Vec::new()));
    let mmu = Arc::new(TestMmu::new(0, 1, TableStore::new(), log));
    let memory = Arc::new(TestMemory::with_bounds(0x1000_0000, 0x1001_0000));
    let gm = Gmem::new(
        platform.clone(),
        DeviceDesc {
            name: "cpu".into(),
            mmu: mmu.clone(),
            memory: Some(memory),
            caps: DevCaps::FAULTABLE,
            data: None,
        },
    )
    .unwrap();
    let host = gm.host();
    gm.dev_register_physmem(host, PhysAddr::new(0x1000_0000), PhysAddr::new(0x1001_0000))
        .unwrap();
    let space = gm
        .as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
        .unwrap();
    gm.as_attach(space, host, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let r = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    // The driver looks at the section depth in a map and in an unmap.
    let depth_in_driver: Arc<Mutex<Vec<isize>>> = Arc::default();
    let probe = |call: GateCall| {
        let (p, d) = (platform.clone(), depth_in_driver.clone());
        mmu.run_in_next(
            call,
            Box::new(move || d.lock().unwrap().push(p.depth.load(Ordering::SeqCst))),
        );
    };
    probe(GateCall::Map);
    let _served = gm.dev_fault(host, r.start, Prot::WRITE).unwrap();
    probe(GateCall::Unmap);
    gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
    gm.as_destroy(space).unwrap();
    assert_eq!(
        platform.depth.load(Ordering::SeqCst),
        0,
        "a section left open"
    );
    // register, create, attach, alloc, fault, dealloc, destroy.
    assert!(platform.entered.load(Ordering::SeqCst) >= 7);
    let seen = depth_in_driver.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "both driver calls ran the probe");
    assert!(
        seen.iter().all(|&d| d >= 1),
        "a driver call outside a section: {seen:?}"
    );
}

/// The explicit fault context: `dev_try_fault_in` re-entering from a driver call on the
/// same thread answers `Busy` at once, as `dev_try_fault` does; the retry serves it in
/// the named space, with the device active nowhere.
#[test]
fn a_fault_in_a_named_space_reentering_from_a_driver_call_is_answered_busy() {
    let s = Arc::new(TestSystem::new(16));
    let host = s.host().id;
    let space =
        s.gm.as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
            .unwrap();
    s.gm.as_attach(space, host, MmuMode::Coherent, Activation::Leave)
        .unwrap();
    let a = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let b = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    assert_eq!(s.gm.dev_active(host), Ok(None), "active nowhere");
    let seen: Arc<Mutex<Option<Answer>>> = Arc::default();
    {
        let (weak, seen) = (Arc::downgrade(&s), seen.clone());
        s.host().mmu.run_in_next(
            GateCall::Map,
            Box::new(move || {
                let s = weak.upgrade().expect("the system outlives the fault");
                let t = Instant::now();
                let r = s.gm.dev_try_fault_in(host, space, b.start, Prot::WRITE);
                *seen.lock().unwrap() = Some((r, t.elapsed()));
            }),
        );
    }
    let outer =
        s.gm.dev_fault_in(host, space, a.start, Prot::WRITE)
            .unwrap();
    assert_eq!(outer.kind, FaultKind::ZeroFill);
    let (inner, took) = seen.lock().unwrap().take().expect("the driver call ran it");
    assert_eq!(inner, Err(FaultError::Busy(b.start)));
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    assert_eq!(s.gm.as_page_frame(space, b.start), Ok(None));
    assert_eq!(
        s.gm.dev_try_fault_in(host, space, b.start, Prot::WRITE)
            .map(|r| r.kind),
        Ok(FaultKind::ZeroFill)
    );
    // A space the device is not attached to, and misuse: typed errors, nothing mapped.
    let other =
        s.gm.as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
            .unwrap();
    let r = s.gm.as_alloc(other, AllocRequest::new(PAGE_SIZE)).unwrap();
    assert_eq!(
        s.gm.dev_fault_in(host, other, r.start, Prot::READ),
        Err(FaultError::NotAttached(host))
    );
    assert_eq!(s.gm.as_page_frame(other, r.start), Ok(None));
    s.gm.check_invariants(space).unwrap();
    s.gm.check_invariants(other).unwrap();
}
