//! `check_invariants`: the design's invariants, checked on demand.
//!
//! Tests, fuzz targets and loom models call [`crate::Gmem::check_invariants`] after every
//! step. It checks, for one address space:
//! 1. every mapping bit of the logical page table names a live page table; every
//!    populated, non-wired page of a unique-policy region is mapped by at most one page
//!    table besides replicate-mode mirrors;
//! 2. every frame the table names is an in-use frame of its device whose reverse mapping
//!    points back at this page, and the space owns no other frame; every device's queues
//!    partition its registered frames;
//! 3. pages marked pending exist only while the queue holds requests;
//! 4. replicate tables map every populated page, and tables of devices that cannot fault
//!    map every wired page (once no request is pending);
//! 5. regions lie inside the space, do not overlap, and are allocated in its arena; a page
//!    outside every region holds nothing but a pending marker.

use crate::gmem::Gmem;
use crate::handle::SpaceId;
use core::fmt;

/// A broken invariant: which one, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The invariant, in words.
    pub what: &'static str,
    /// The virtual page (or frame) concerned, if any.
    pub at: Option<u64>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some(at) => write!(f, "{} (at {at:#x})", self.what),
            None => write!(f, "{}", self.what),
        }
    }
}

pub(crate) fn fail<T>(what: &'static str, at: Option<u64>) -> Result<T, Violation> {
    Err(Violation { what, at })
}

impl Gmem {
    /// Check the invariants of one address space and of every memory it uses.
    ///
    /// # Errors
    /// The first [`Violation`] found, or one naming a stale space handle.
    pub fn check_invariants(&self, id: SpaceId) -> Result<(), Violation> {
        let _critical = self.critical();
        let Some(space) = self.space(id) else {
            return fail("unknown address space", None);
        };
        let st = space.lock();
        st.check(&space, id)
    }
}
