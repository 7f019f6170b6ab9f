//! `gmem-harness` as a library: the parts other crates use — the trace parsers, which
//! the fuzz targets drive with arbitrary input, and the seeded fragmenter. The CLI (`src/main.rs`) is the binary.

#![warn(clippy::missing_errors_doc)]

pub mod frag;
pub mod trace;
