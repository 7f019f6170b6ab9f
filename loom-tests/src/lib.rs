//! # gmem-loom-tests: loom models of the core's concurrent paths
//!
//! The models live in `tests/` and exist only under `RUSTFLAGS="--cfg gmem_loom"`, the
//! cfg that switches [`gmem_core::sync`] to loom's locks and atomics, so loom explores
//! every interleaving of the real code (bounded by `LOOM_MAX_PREEMPTIONS`, which each
//! model states). Without the cfg this crate builds and its tests compile to nothing.
//! `cargo xtask loom` runs the suite, and then each deliberately broken variant
//! (`--cfg gmem_loom_bug="..."`) expecting its model to fail.
