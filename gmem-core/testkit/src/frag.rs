//! A seeded fragmenter: brings a device's memory to a chosen unusable-free-space index
//! by holding frames. It lives in the harness (whose MESC reproduction uses it); this
//! module re-exports it for the testkit's tests.

pub use gmem_harness::frag::{Fragmented, Fragmenter};
