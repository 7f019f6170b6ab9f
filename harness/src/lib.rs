//! `gmem-harness` as a library: the parts other crates use — the trace parsers, which
//! the fuzz targets drive with arbitrary input. The CLI (`src/main.rs`) is the binary.

pub mod trace;
