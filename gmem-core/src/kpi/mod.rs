//! The KPI entry points, one module per object they act on.
//!
//! Every public call of [`crate::Gmem`] (74 of them; 75 with `test-util`), by module:
//!
//! | module | calls |
//! |---|---|
//! | the instance (`gmem`, `check`) | [`new`](crate::Gmem::new), [`host`](crate::Gmem::host), [`platform`](crate::Gmem::platform), [`stats`](crate::Gmem::stats), [`check_invariants`](crate::Gmem::check_invariants) |
//! | `device` | [`dev_create`](crate::Gmem::dev_create), [`dev_destroy`](crate::Gmem::dev_destroy), [`dev_register_physmem`](crate::Gmem::dev_register_physmem), [`dev_frames`](crate::Gmem::dev_frames), [`dev_set_eviction_policy`](crate::Gmem::dev_set_eviction_policy), [`dev_evacuate`](crate::Gmem::dev_evacuate), [`dev_data`](crate::Gmem::dev_data), [`dev_name`](crate::Gmem::dev_name), [`dev_caps`](crate::Gmem::dev_caps), [`dev_active`](crate::Gmem::dev_active), [`dev_switch`](crate::Gmem::dev_switch), [`dev_detach`](crate::Gmem::dev_detach), [`dev_fault`](crate::Gmem::dev_fault), [`dev_try_fault`](crate::Gmem::dev_try_fault), [`dev_fault_in`](crate::Gmem::dev_fault_in), [`dev_try_fault_in`](crate::Gmem::dev_try_fault_in) |
//! | `space` | [`as_create`](crate::Gmem::as_create), [`as_destroy`](crate::Gmem::as_destroy), [`as_attach`](crate::Gmem::as_attach), [`as_alloc`](crate::Gmem::as_alloc), [`as_lookup`](crate::Gmem::as_lookup), [`as_regions`](crate::Gmem::as_regions), [`as_synchronize`](crate::Gmem::as_synchronize), [`as_set_batch_limit`](crate::Gmem::as_set_batch_limit), [`as_pending`](crate::Gmem::as_pending), [`as_arena_stats`](crate::Gmem::as_arena_stats), `as_fail_every` (failure injection for tests) |
//! | `region` | [`region_info`](crate::Gmem::region_info), [`region_dealloc`](crate::Gmem::region_dealloc), [`region_map`](crate::Gmem::region_map), [`region_unmap`](crate::Gmem::region_unmap), [`region_set_policy`](crate::Gmem::region_set_policy), [`region_set_zero_fill_block`](crate::Gmem::region_set_zero_fill_block), [`region_protect`](crate::Gmem::region_protect), [`region_set_attrs`](crate::Gmem::region_set_attrs), [`region_migrate`](crate::Gmem::region_migrate), [`region_wire`](crate::Gmem::region_wire), [`region_unwire`](crate::Gmem::region_unwire) (these six take [`Pages`](crate::Pages): a region, or a range of a space), [`region_alloc_private`](crate::Gmem::region_alloc_private), [`region_free_private`](crate::Gmem::region_free_private) |
//! | `frames` | [`dev_free_extents`](crate::Gmem::dev_free_extents), [`dev_compact`](crate::Gmem::dev_compact), [`dev_set_page_groups`](crate::Gmem::dev_set_page_groups), [`dev_page_groups`](crate::Gmem::dev_page_groups), [`dev_group_class`](crate::Gmem::dev_group_class), [`dev_set_group_class`](crate::Gmem::dev_set_group_class), [`as_page_frame`](crate::Gmem::as_page_frame), [`as_private_frame`](crate::Gmem::as_private_frame) |
//! | `large` | [`region_promote`](crate::Gmem::region_promote), [`as_large_leaves`](crate::Gmem::as_large_leaves), [`as_frames`](crate::Gmem::as_frames), [`dev_set_reservations`](crate::Gmem::dev_set_reservations), [`dev_reservations`](crate::Gmem::dev_reservations) |
//! | `dma` | [`dma_map`](crate::Gmem::dma_map), [`dma_unmap`](crate::Gmem::dma_unmap), [`dma_mappings`](crate::Gmem::dma_mappings) |
//! | `advice` | [`region_advise`](crate::Gmem::region_advise), [`region_advice`](crate::Gmem::region_advice) |
//! | `batch` | [`dev_fault_batch`](crate::Gmem::dev_fault_batch), [`dev_set_prefetch`](crate::Gmem::dev_set_prefetch), [`dev_prefetch`](crate::Gmem::dev_prefetch) |
//! | `access` | [`as_set_access_counters`](crate::Gmem::as_set_access_counters), [`as_access_counters`](crate::Gmem::as_access_counters), [`dev_report_accesses`](crate::Gmem::dev_report_accesses) |
//! | `thrashing` | [`as_set_thrashing`](crate::Gmem::as_set_thrashing), [`as_expire_pins`](crate::Gmem::as_expire_pins), [`as_thrashing`](crate::Gmem::as_thrashing) |
//! | `mapping_set` | [`mapping_set_create`](crate::Gmem::mapping_set_create), [`mapping_set_unmap`](crate::Gmem::mapping_set_unmap), [`mapping_set_destroy`](crate::Gmem::mapping_set_destroy) |
//!
//! The main calls carry a runnable example; the embedding guide ([`crate::guide`])
//! shows them together (a fault handler, shootdowns, device teardown).
//!
//! Each call enters the platform's critical section
//! ([`crate::Platform::enter_critical`]), resolves its handles (a stale handle is a
//! typed error), locks the one space it works on through `SpaceInner::lock` — whose
//! guard, when dropped, releases the lock and then runs the completion callbacks that
//! became ready — and does its work in `space`, `fault` and `queue`.
//!
//! ## Counters
//! [`crate::Gmem::stats`] sums the instance's counters and every live space's: what
//! the faults did, the bytes moved each way, the MMU calls and invalidations made.
//!
//! ```
//! use gmem_core::testing::TestSystem;
//! use gmem_core::*;
//!
//! let sys = TestSystem::new(16);
//! let gm = &sys.gm;
//! let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty()).unwrap();
//! gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch).unwrap();
//! let r = gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE)).unwrap();
//! let before = gm.stats();
//! sys.write(0, r.start, &[7; 2 * PAGE_SIZE as usize]).unwrap(); // two pages, two faults
//! let after = gm.stats();
//! assert_eq!(after.faults_zero_fill - before.faults_zero_fill, 2);
//! assert_eq!(after.pages_zeroed - before.pages_zeroed, 2);
//! assert_eq!(after.mmu_maps - before.mmu_maps, 2);
//! assert_eq!(after.faults_failed, 0);
//! gm.check_invariants(space).unwrap();
//! ```

pub(crate) mod access;
pub(crate) mod advice;
pub(crate) mod batch;
pub(crate) mod device;
pub(crate) mod dma;
pub(crate) mod frames;
pub(crate) mod large;
pub(crate) mod mapping_set;
pub(crate) mod pages;
pub(crate) mod region;
pub(crate) mod space;
pub(crate) mod thrashing;
