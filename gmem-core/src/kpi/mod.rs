//! The KPI entry points, one module per object they act on.
//!
//! | module | calls |
//! |---|---|
//! | [`device`] | `dev_create`, `dev_destroy`, `dev_register_physmem`, `dev_frames`, `dev_data`, `dev_name`, `dev_caps`, `dev_active`, `dev_switch`, `dev_detach`, `dev_fault` |
//! | [`space`] | `as_create`, `as_destroy`, `as_attach`, `as_alloc`, `as_lookup`, `as_regions`, `as_synchronize`, `as_set_batch_limit`, `as_pending`, `as_arena_stats`, `as_fail_every` |
//! | [`region`] | `region_info`, `region_dealloc`, `region_map`, `region_unmap`, `region_set_policy`, `region_set_zero_fill_block`, `region_protect`, `region_migrate`, `region_wire`, `region_unwire` |
//! | [`frames`] | `dev_free_extents`, `dev_compact`, `dev_set_page_groups`, `dev_page_groups`, `dev_group_class`, `dev_set_group_class`, `as_page_frame` |
//! | [`large`] | `region_promote`, `as_large_leaves`, `as_frames`, `dev_set_reservations`, `dev_reservations` |
//! | [`mapping_set`] | `mapping_set_create`, `mapping_set_unmap`, `mapping_set_destroy` |
//!
//! Each call resolves its handles (a stale handle is a typed error), locks the one
//! space it works on through `SpaceInner::lock` — whose guard, when
//! dropped, releases the lock and then runs the completion callbacks that became ready —
//! and does its work in [`crate::space`], [`crate::fault`] and `queue`.

pub mod device;
pub mod frames;
pub mod large;
pub mod mapping_set;
pub mod region;
pub mod space;
