//! # Embedding guide: gmem-core in a kernel
//!
//! What a kernel author writes, calls and must not do, in the order they meet it. The
//! crate's landing page has the ten-line quick start; this page goes through the rest.
//! Every example is compiled and run as a doctest; most use the test system of the
//! `test-util` feature (`gmem_core::testing::TestSystem`: a [`Gmem`](crate::Gmem) with a
//! recording test MMU per device whose TLB stays stale until the core invalidates it).
//!
//! 1. [What you implement](#1-what-you-implement)
//! 2. [A page-fault handler](#2-a-page-fault-handler)
//! 3. [Locks and interrupts: which call is legal where](#3-locks-and-interrupts-which-call-is-legal-where)
//! 4. [SMP: TLB shootdowns](#4-smp-tlb-shootdowns)
//! 5. [What the core allocates](#5-what-the-core-allocates)
//! 6. [Devices: memory, detach, destroy](#6-devices-memory-detach-destroy)
//!
//! ## 1. What you implement
//! | trait | who | what |
//! |---|---|---|
//! | [`Mmu`](crate::Mmu) | every driver | the page-table format and the TLB: create and destroy a table, map a physically contiguous run, unmap and protect ranges, invalidate (ranges or all), activate a table. Every contract it may rely on is in [`crate::driver`] |
//! | [`DeviceMemory`](crate::DeviceMemory) | a device with memory the core manages (the CPU: RAM) | zero, read and write physical ranges (and copy, which defaults to a bounce through read and write) |
//! | [`Platform`](crate::Platform) | the kernel, once | the current CPU's index and the CPU count (per-CPU caches of the `CACHED` allocation policy), and a critical section around every KPI call (section 3) |
//! | [`FrameSource`](crate::FrameSource) | the kernel, for its drivers | zeroed 4 KiB frames for page-table pages. The core never calls it and never allocates a page-table page: a driver takes its table pages from wherever its hardware wants them, and this `unsafe trait` is the conventional way a kernel hands them out |
//!
//! The core calls the drivers; a driver never needs to call the core. The kernel calls
//! the KPI ([`crate::kpi`]) from its system calls, its device setup and its fault
//! handlers.
//!
//! A platform for a kernel saves and clears the interrupt flag in
//! [`Platform::enter_critical`](crate::Platform::enter_critical) and restores it in
//! [`Platform::exit_critical`](crate::Platform::exit_critical), as `spin_lock_irqsave`
//! does. The example below models the flag with an atomic and checks what the core
//! promises: the driver's `map` runs with interrupts off, and they are on again when the
//! call returns.
//!
//! ```
//! use gmem_core::testing::{EventLog, GateCall, TableStore, TestMemory, TestMmu};
//! use gmem_core::*;
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::sync::{Arc, Mutex};
//!
//! /// A uniprocessor kernel; `irq_on` stands for the CPU's interrupt flag.
//! struct Kernel {
//!     irq_on: AtomicBool,
//! }
//!
//! impl Platform for Kernel {
//!     fn current_cpu(&self) -> usize { 0 }
//!     fn cpu_count(&self) -> usize { 1 }
//!     fn enter_critical(&self) -> usize {
//!         // x86-64: `let flags = rflags(); cli(); flags as usize`
//!         self.irq_on.swap(false, Ordering::SeqCst) as usize
//!     }
//!     fn exit_critical(&self, saved: usize) {
//!         // x86-64: `if saved & IF != 0 { sti() }`
//!         self.irq_on.store(saved != 0, Ordering::SeqCst);
//!     }
//! }
//!
//! let kernel = Arc::new(Kernel { irq_on: AtomicBool::new(true) });
//! let log: EventLog = Arc::new(gmem_core::sync::Mutex::new(Vec::new()));
//! let mmu = Arc::new(TestMmu::new(0, 1, TableStore::new(), log));
//! let gm = Gmem::new(kernel.clone(), DeviceDesc {
//!     name: "cpu".into(), mmu: mmu.clone(), memory: Some(Arc::new(TestMemory::default())),
//!     caps: DevCaps::FAULTABLE, data: None,
//! }).unwrap();
//! gm.dev_register_physmem(gm.host(), PhysAddr::new(0), PhysAddr::new(16 * PAGE_SIZE)).unwrap();
//! let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty()).unwrap();
//! gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch).unwrap();
//! let buf = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
//!
//! // Look at the flag from inside the driver's next `map`.
//! let irq_in_map = Arc::new(Mutex::new(None));
//! let (k, seen) = (kernel.clone(), irq_in_map.clone());
//! mmu.run_in_next(GateCall::Map, Box::new(move || {
//!     *seen.lock().unwrap() = Some(k.irq_on.load(Ordering::SeqCst));
//! }));
//! gm.dev_fault(gm.host(), buf.start, Prot::WRITE).unwrap();
//! assert_eq!(*irq_in_map.lock().unwrap(), Some(false), "map ran with interrupts off");
//! assert!(kernel.irq_on.load(Ordering::SeqCst), "restored when the call returned");
//! ```
//!
//! ## 2. A page-fault handler
//! The CPU is a device like any other (the *host*, [`Gmem::host`](crate::Gmem::host)).
//! Its page-fault handler turns the fault address and the hardware's error code into
//! the access that faulted ([`Prot`](crate::Prot)), asks the core to serve it, and
//! either returns from the exception — the access retries through the mapping the
//! core installed — or delivers the typed [`FaultError`](crate::FaultError) to whoever
//! made the access (a signal to a user task, a panic for the kernel's own access).
//!
//! **Which space.** A device faults in the space it is active in
//! ([`Gmem::dev_switch`](crate::Gmem::dev_switch) makes it active there). A kernel with
//! one CPU device for all its harts, each running a different process, names the space
//! instead: [`Gmem::dev_try_fault_in`](crate::Gmem::dev_try_fault_in) (and
//! [`dev_fault_in`](crate::Gmem::dev_fault_in)) serve the fault in the given space the
//! device is attached to, with no `dev_switch` per context switch (the kernel loads
//! the space's table root itself).
//!
//! The entry for a handler is [`Gmem::dev_try_fault`](crate::Gmem::dev_try_fault): it
//! never waits for a lock, and answers [`FaultError::Busy`](crate::FaultError::Busy)
//! when one it needs is held. `Busy` has two causes, told apart by whether this CPU was
//! inside a core call when it faulted (a kernel knows: it is between its own
//! `enter_critical` and `exit_critical`):
//! - **not inside a core call**: another CPU holds the lock, or an unlocked
//!   `region_map` is writing the page's region right now. Return; the access faults
//!   again and is served once they finish.
//! - **inside a core call** (the core itself, or a driver callback it made, touched
//!   memory that faults): the lock is held by the very context the fault interrupted,
//!   which cannot go on until the handler returns. Retrying would loop forever: it is a
//!   kernel bug (the core's heap, its code and the drivers' data must be mapped
//!   outside every space the core manages, as the kernel's upper half is).
//!
//! The skeleton for x86-64 (error code bit 1: write, bit 4: instruction fetch;
//! RISC-V's `scause` 12/13/15 say the same):
//!
//! ```
//! use gmem_core::testing::TestSystem;
//! use gmem_core::*;
//!
//! /// What the handler does after the core answered.
//! #[derive(Debug, PartialEq)]
//! enum Outcome {
//!     /// Return from the exception: the access retries.
//!     Retry,
//!     /// Deliver the error to the task (SIGSEGV, SIGBUS) or panic for the kernel.
//!     Deliver(FaultError),
//! }
//!
//! /// The #PF handler: `cr2` is the fault address, `error_code` the pushed code, and
//! /// `in_core_call` whether this CPU was inside a core call (the platform's section).
//! fn page_fault(gm: &Gmem, cr2: u64, error_code: u64, in_core_call: bool) -> Outcome {
//!     let access = if error_code & (1 << 4) != 0 {
//!         Prot::EXEC
//!     } else if error_code & (1 << 1) != 0 {
//!         Prot::WRITE
//!     } else {
//!         Prot::READ
//!     };
//!     match gm.dev_try_fault(gm.host(), VirtAddr::new(cr2), access) {
//!         Ok(_served) => Outcome::Retry,
//!         Err(FaultError::Busy(_)) if !in_core_call => Outcome::Retry,
//!         Err(e) => Outcome::Deliver(e),
//!     }
//! }
//!
//! let sys = TestSystem::new(16);
//! let gm = &sys.gm;
//! let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty()).unwrap();
//! gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch).unwrap();
//! let code = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
//! gm.region_protect(code, Prot::READ | Prot::EXEC).unwrap();
//!
//! // An instruction fetch (error code 0x10) is served; a write (0x2) is refused.
//! let at = code.start.as_u64();
//! assert_eq!(page_fault(gm, at, 0x10, false), Outcome::Retry);
//! assert_eq!(
//!     page_fault(gm, at, 0x2 | 0x1, false),
//!     Outcome::Deliver(FaultError::ProtectionViolation {
//!         va: code.start,
//!         access: Prot::WRITE,
//!         allowed: Prot::READ | Prot::EXEC,
//!     })
//! );
//! // An address no region holds.
//! assert_eq!(
//!     page_fault(gm, 0x7000, 0x0, false),
//!     Outcome::Deliver(FaultError::NotAllocated(VirtAddr::new(0x7000)))
//! );
//! ```
//!
//! [`Gmem::dev_fault`](crate::Gmem::dev_fault) serves the same faults but waits for
//! the locks: use it where the caller cannot have interrupted a core call on its own
//! CPU — a fault taken in user mode (a core call runs in the kernel), a device's
//! fault reported through a threaded interrupt handler, a kernel thread.
//!
//! A device that reports translation faults (a GPU's fault buffer, an IOMMU's page
//! request queue) does the same with its own [`DeviceId`](crate::DeviceId): the
//! core serves the fault in the space the device is active in (`dev_switch`), places
//! the page by the region's policy (its own memory, by default) and maps it through
//! the device's MMU; the driver then replays the access.
//!
//! ## 3. Locks and interrupts: which call is legal where
//! The core's locks are spin locks ([`crate::sync`] states their order). Every KPI call
//! runs inside [`Platform::enter_critical`](crate::Platform::enter_critical) ..
//! [`Platform::exit_critical`](crate::Platform::exit_critical): a kernel disables
//! interrupts and preemption there, so no interrupt arrives on a CPU while the core
//! holds a lock on it, and no thread is switched out holding one. Sections nest (each
//! exit restores what its own enter saved). The defaults do nothing: right for
//! simulators and tests, and for a kernel that never calls the core from an interrupt
//! or exception handler and never preempts a thread inside a call.
//!
//! | where | legal calls |
//! |---|---|
//! | a page-fault (or any exception or interrupt) handler | [`dev_try_fault`](crate::Gmem::dev_try_fault) or [`dev_try_fault_in`](crate::Gmem::dev_try_fault_in); [`dev_fault`](crate::Gmem::dev_fault) and the rest only if the handler cannot have interrupted a core call on the same CPU (a fault from user mode) |
//! | with interrupts off | every call: the core never enables interrupts. It spins on its locks, so a call that may wait for a lock another CPU holds must not be made by a CPU that that CPU is waiting for (for an IPI's acknowledgement, say: section 4) |
//! | with the kernel's heap lock held | none: every call may allocate (a fault allocates logical-page-table leaves and queue entries), [`dev_try_fault`](crate::Gmem::dev_try_fault) included |
//! | inside a driver callback ([`Mmu`](crate::Mmu), [`DeviceMemory`](crate::DeviceMemory)) | none but [`dev_try_fault`](crate::Gmem::dev_try_fault), which answers `Busy`: the core calls drivers with the space's lock held (all but the unlocked edits of [`Mmu::concurrent_edits`](crate::Mmu::concurrent_edits) and a strict dealloc's invalidation; and with the device's binding for [`Mmu::activate`](crate::Mmu::activate)), and a call that waits for it waits forever. [`DeviceMemory::group_class_changed`](crate::DeviceMemory::group_class_changed) is the exception to the exception: it runs with the device's frame lock held (`dev_set_group_class` holds no space lock), which a fault waits for, so it calls nothing at all |
//! | inside a completion callback ([`Callback`](crate::Callback)) | every call but `as_synchronize` of the callback's own space (it would wait for itself). Callbacks run after the core released its locks, still inside the critical section of the call that ran them |
//!
//! The heap itself must never fault into the core: it, the kernel's code and stacks and
//! the drivers' data live in memory the core does not manage (the kernel's upper half,
//! mapped in every table a driver creates; see [`crate::driver`]).
//!
//! A driver callback that calls back, as an interrupt on the same CPU would, gets
//! `Busy` at once — here a fault arrives inside the driver's `map` of another fault:
//!
//! ```
//! use gmem_core::testing::{GateCall, TestSystem};
//! use gmem_core::*;
//! use std::sync::{Arc, Mutex};
//!
//! let sys = Arc::new(TestSystem::new(16));
//! let host = sys.host().id;
//! let space = sys.gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty()).unwrap();
//! sys.gm.as_attach(space, host, MmuMode::Coherent, Activation::Switch).unwrap();
//! let a = sys.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
//! let b = sys.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
//!
//! let inner = Arc::new(Mutex::new(None));
//! let (weak, seen) = (Arc::downgrade(&sys), inner.clone());
//! sys.host().mmu.run_in_next(GateCall::Map, Box::new(move || {
//!     let sys = weak.upgrade().unwrap();
//!     *seen.lock().unwrap() = Some(sys.gm.dev_try_fault(host, b.start, Prot::WRITE));
//! }));
//! // The outer fault holds the space lock while its `map` runs the re-entry.
//! assert_eq!(sys.gm.dev_fault(host, a.start, Prot::WRITE).unwrap().kind, FaultKind::ZeroFill);
//! assert_eq!(*inner.lock().unwrap(), Some(Err(FaultError::Busy(b.start))));
//! // Nothing of `b` changed; the retry, once the handler returned, is served.
//! assert_eq!(sys.gm.as_page_frame(space, b.start), Ok(None));
//! assert!(sys.gm.dev_try_fault(host, b.start, Prot::WRITE).is_ok());
//! ```
//!
//! ## 4. SMP: TLB shootdowns
//! The core owns *when* to invalidate; the driver owns *how*. Before the core reuses a
//! virtual range or a frame that a table mapped — a strict unmap, dealloc, protect,
//! migration or eviction, or the drain of an asynchronous batch — it calls
//! [`Mmu::invalidate`](crate::Mmu::invalidate) (or `invalidate_all`) on every device
//! using that table, each through its own MMU, and waits for the call to return. When
//! it returns, no access through a stale translation of those ranges may be in flight.
//!
//! On a multiprocessor the CPUs are best one device (one driver, one table per space)
//! whose TLB is spread over every CPU that activated the table, as a Unix `mm` runs on
//! the CPUs of its `mm_cpumask`; `drivers/sv39/kernel` does exactly this. The driver:
//! - keeps the set of CPUs that activated each of its tables (a CPU joins in
//!   [`Mmu::activate`](crate::Mmu::activate)`(Some(root))`, made on that CPU, and leaves
//!   on `activate(None)` after its own full flush);
//! - in `invalidate`, flushes the calling CPU (`invlpg` per page, or a full flush above
//!   a threshold) and sends the others an IPI naming the ranges, then **waits until
//!   every one acknowledged** before it returns;
//! - frees page-table pages it unlinked only after such a full flush on every CPU.
//!
//! The wait is the delicate part. `invalidate` runs inside the caller's critical
//! section (interrupts off) and often with the space lock held, while another CPU may
//! be spinning with interrupts off on that very lock. A maskable IPI would never be
//! taken there, and the two CPUs would wait for each other. The IPI must therefore
//! reach a CPU whose interrupts are off: an NMI, a machine-mode IPI (OpenSBI's
//! `remote_sfence_vma`, which the Sv39 kernel uses), or a mailbox that every CPU polls
//! while it waits (for a lock or for acknowledgements).
//!
//! Asynchronous calls ([`MapFlags::ASYNC`](crate::MapFlags::ASYNC)) batch the work: the
//! entries are cleared at once, but the invalidation, the release of frames and ranges
//! and the completion callbacks wait in the space's queue until it holds
//! `as_set_batch_limit` requests (64 by default) or `as_synchronize` drains it; the
//! drain makes one `invalidate` per device with the batch's ranges coalesced, so eight
//! unmaps cost one shootdown:
//!
//! ```
//! use gmem_core::testing::{MmuEvent, TestSystem};
//! use gmem_core::*;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//!
//! let sys = TestSystem::new(64);
//! let gm = &sys.gm;
//! let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty()).unwrap();
//! gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch).unwrap();
//! let mut regions = Vec::new();
//! for _ in 0..8 {
//!     let r = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
//!     sys.write(0, r.start, b"x").unwrap(); // mapped: its TLB entry must be shot down
//!     regions.push(r);
//! }
//! sys.take_events();
//! let done = Arc::new(AtomicUsize::new(0));
//! for r in regions {
//!     let done = done.clone();
//!     let callback: Callback = Box::new(move |result| {
//!         assert!(result.is_ok());
//!         done.fetch_add(1, Ordering::SeqCst);
//!     });
//!     gm.region_dealloc(r, MapFlags::ASYNC, Some(callback)).unwrap();
//! }
//! assert_eq!(gm.as_pending(space), Ok(8));
//! assert_eq!(done.load(Ordering::SeqCst), 0, "no callback before the invalidation");
//! gm.as_synchronize(space).unwrap();
//! assert_eq!(done.load(Ordering::SeqCst), 8);
//! let shootdowns = sys.take_events().into_iter()
//!     .filter(|e| matches!(e, MmuEvent::Invalidate { .. } | MmuEvent::InvalidateAll { .. }))
//!     .count();
//! assert_eq!(shootdowns, 1, "one invalidation for the whole batch");
//! ```
//!
//! ## 5. What the core allocates
//! - **The kernel's heap** (`alloc`), for its own records: each address space's vmem
//!   arena (boundary tags and hash; per-CPU magazines with the `CACHED` policy), the
//!   logical page table — 16 bytes per populated page, in leaves of 512 entries (8 KiB
//!   per 2 MiB of virtual space that holds anything, freed when empty) — region and
//!   segment records, page-table bookkeeping, queued requests and their callbacks, and
//!   bounce buffers of at most [`COPY_BOUNCE_BYTES`](crate::COPY_BOUNCE_BYTES) when a
//!   data mover copies through one.
//! - **Frames** only from memory registered with
//!   [`dev_register_physmem`](crate::Gmem::dev_register_physmem): zero-filled on
//!   fault, migrated, evicted to host memory when a device's memory is full, given back
//!   on unmap and dealloc once invalidated. Frames given to `region_map` stay the
//!   caller's and are never freed by the core.
//! - **Page-table pages: never.** A driver gets them itself (typically from the
//!   kernel's [`FrameSource`](crate::FrameSource)), for `create_page_table`, for `map`
//!   (which may fail with [`MmuError::OutOfTableMemory`](crate::MmuError)) and for the
//!   split reserve of a large leaf.
//!
//! ```
//! use gmem_core::testing::TestSystem;
//! use gmem_core::*;
//!
//! let sys = TestSystem::new(16); // 16 host frames registered
//! let gm = &sys.gm;
//! let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty()).unwrap();
//! gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch).unwrap();
//! let r = gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE)).unwrap();
//! assert_eq!(gm.dev_frames(gm.host()).unwrap().free, 16, "allocating a region takes no frame");
//! sys.write(0, r.start, b"hello").unwrap();
//! let after_fault = gm.dev_frames(gm.host()).unwrap();
//! assert_eq!((after_fault.free, after_fault.active), (15, 1), "one fault, one frame");
//! gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
//! assert_eq!(gm.dev_frames(gm.host()).unwrap().free, 16, "a strict dealloc gives it back");
//! ```
//!
//! ## 6. Devices: memory, detach, destroy
//! A device with memory of its own registers it; a fault of that device then places
//! its pages there (the default placement: the faulting device's memory), and the CPU
//! reaches them remotely or by migration ([`Placement`](crate::Placement)):
//!
//! ```
//! use gmem_core::testing::TestSystem;
//! use gmem_core::*;
//!
//! let mut sys = TestSystem::new(16);
//! // A faultable GPU with 32 pages of memory at 0x8000_0000 (the test system
//! // registers it with `dev_register_physmem`).
//! let gpu = sys.add_device(2, DevCaps::FAULTABLE, 0x8000_0000, 32);
//! let gpu_id = sys.devices[gpu].id;
//! assert_eq!(sys.gm.dev_frames(gpu_id).unwrap().registered, 32);
//! // Registering the same range again is refused.
//! let again = sys.gm.dev_register_physmem(gpu_id, PhysAddr::new(0x8000_0000), PhysAddr::new(0x8000_1000));
//! assert!(matches!(again, Err(DeviceError::Register(_))));
//!
//! let gm = &sys.gm;
//! let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty()).unwrap();
//! gm.as_attach(space, gpu_id, MmuMode::Coherent, Activation::Switch).unwrap();
//! let r = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
//! let served = gm.dev_fault(gpu_id, r.start, Prot::WRITE).unwrap();
//! assert_eq!(served.kind, FaultKind::ZeroFill);
//! let frame = gm.as_page_frame(space, r.start).unwrap().unwrap();
//! assert_eq!(frame.0, gpu_id, "placed in the faulting device's memory");
//! ```
//!
//! Tearing a device down is detach (every space), then destroy. Detach deactivates
//! the device (`activate(None)`) if it was active there, unmaps and destroys its table,
//! and frees its private frames; destroy refuses while the device is attached anywhere
//! or its memory backs pages (move them out first with
//! [`dev_evacuate`](crate::Gmem::dev_evacuate)):
//!
//! ```
//! use gmem_core::testing::TestSystem;
//! use gmem_core::*;
//!
//! let mut sys = TestSystem::new(16);
//! let dev = sys.add_device(2, DevCaps::FAULTABLE, 0, 0); // no memory of its own
//! let id = sys.devices[dev].id;
//! let gm = &sys.gm;
//! let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty()).unwrap();
//! gm.as_attach(space, id, MmuMode::Coherent, Activation::Switch).unwrap();
//! assert_eq!(gm.dev_active(id), Ok(Some(space)));
//! assert_eq!(gm.dev_destroy(id), Err(DeviceError::StillAttached { spaces: 1 }));
//!
//! gm.dev_detach(id, space).unwrap();
//! assert_eq!(gm.dev_active(id), Ok(None));
//! assert_eq!(sys.devices[dev].mmu.active_root(), None, "deactivated before its table went");
//! assert_eq!(gm.dev_detach(id, space), Err(AttachError::NotAttached));
//!
//! gm.dev_destroy(id).unwrap();
//! assert_eq!(gm.dev_caps(id), Err(DeviceError::UnknownDevice(id)));
//! ```
