//! [`Violation`]: what a broken invariant is, and `fail`, how a check reports one. A
//! leaf: every part of the space's state checks its own invariants with it.

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

impl core::error::Error for Violation {}
