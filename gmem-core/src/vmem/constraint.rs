//! Constrained placement: the public [`Constraint`] of `xalloc` and the internal
//! [`Placement`] it is validated into, with the arithmetic that finds the lowest
//! address inside a free segment satisfying size, alignment, phase, `nocross`, `min`
//! and `max` at once.
//!
//! All arithmetic is checked: a segment may end at the last byte of the 64-bit space,
//! and a constraint whose next candidate address would pass 2^64 simply has no fit in
//! that segment. Bounds are inclusive (`max` is the last byte an allocation may
//! occupy), so no value ever has to represent 2^64.

use super::config::FitPolicy;
use super::error::{AllocError, ConstraintProblem};

/// The request of [`crate::vmem::Arena::xalloc`], the one constrained entry point
/// (illumos `vmem_xalloc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Constraint {
    /// Bytes to allocate, a non-zero multiple of the quantum.
    pub size: u64,
    /// `0` (the quantum) or a power of two: the address is `phase` modulo `align`.
    pub align: u64,
    /// Offset from an `align` boundary, a multiple of the quantum below the alignment.
    pub phase: u64,
    /// `0` or a power of two: the allocation does not cross a multiple of `nocross`.
    pub nocross: u64,
    /// The lowest address the allocation may start at.
    pub min: u64,
    /// The last byte the allocation may occupy (inclusive); `u64::MAX` = no limit.
    pub max: u64,
    /// Which fitting free segment to choose.
    pub fit: FitPolicy,
}

impl Constraint {
    /// An unconstrained request of `size` bytes: no alignment beyond the quantum, no
    /// phase, no boundary, the whole address range, instant-fit.
    pub fn new(size: u64) -> Self {
        Self {
            size,
            align: 0,
            phase: 0,
            nocross: 0,
            min: 0,
            max: u64::MAX,
            fit: FitPolicy::InstantFit,
        }
    }
}

/// A validated placement request: `align >= quantum`, `phase < align`, both multiples
/// of the quantum, `nocross` zero or a power of two `>= size`, and `[min, max]` able to
/// hold `size` bytes with `min` quantum-aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Placement {
    /// Bytes to allocate.
    pub size: u64,
    /// Effective alignment (at least the quantum).
    pub align: u64,
    /// Offset from an `align` boundary.
    pub phase: u64,
    /// Boundary not to cross, 0 for none.
    pub nocross: u64,
    /// Lowest start address (quantum-aligned).
    pub min: u64,
    /// Last byte the allocation may occupy.
    pub max: u64,
    /// True when nothing but the size matters: the fast path of `fit_in`.
    plain: bool,
}

/// The smallest `a >= x` with `a % align == phase` (`align` a power of two, `phase <
/// align`), or `None` when it would pass 2^64.
fn phase_up(x: u64, align: u64, phase: u64) -> Option<u64> {
    let a = (x & !(align - 1)).checked_add(phase)?;
    if a >= x {
        Some(a)
    } else {
        a.checked_add(align)
    }
}

/// True when `[addr, last]` contains a multiple of `nocross` other than at `addr`.
fn crosses(addr: u64, last: u64, nocross: u64) -> bool {
    nocross != 0 && (addr ^ last) & !(nocross - 1) != 0
}

impl Placement {
    /// An unconstrained request of `size` bytes (already validated).
    pub fn plain(size: u64, quantum: u64) -> Self {
        Self {
            size,
            align: quantum,
            phase: 0,
            nocross: 0,
            min: 0,
            max: u64::MAX,
            plain: true,
        }
    }

    /// Validate a size: non-zero and a multiple of the quantum.
    pub fn check_size(size: u64, quantum: u64) -> Result<(), AllocError> {
        if size == 0 {
            Err(AllocError::ZeroSize)
        } else if size & (quantum - 1) != 0 {
            Err(AllocError::Unaligned { size, quantum })
        } else {
            Ok(())
        }
    }

    /// Validate a constraint against the arena's quantum (a power of two).
    pub fn from_constraint(c: &Constraint, quantum: u64) -> Result<Self, AllocError> {
        let bad = |reason| Err(AllocError::BadConstraint { reason });
        Self::check_size(c.size, quantum)?;
        if c.align != 0 && !c.align.is_power_of_two() {
            return bad(ConstraintProblem::AlignNotPowerOfTwo);
        }
        let stated_align = if c.align == 0 { quantum } else { c.align };
        if c.phase >= stated_align {
            return bad(ConstraintProblem::PhaseNotBelowAlign);
        }
        if c.phase & (quantum - 1) != 0 {
            return bad(ConstraintProblem::PhaseNotQuantumMultiple);
        }
        // An alignment below the quantum is implied by the quantum (and then the phase,
        // below it and a multiple of it, is 0).
        let align = stated_align.max(quantum);
        if c.nocross != 0 {
            if !c.nocross.is_power_of_two() {
                return bad(ConstraintProblem::NocrossNotPowerOfTwo);
            }
            if c.nocross < c.size {
                return bad(ConstraintProblem::NocrossSmallerThanSize);
            }
            // Within one nocross block the candidates are phase % nocross, then (when
            // align < nocross) that plus multiples of align: the first is the best.
            match (c.phase & (c.nocross - 1)).checked_add(c.size) {
                Some(end) if end <= c.nocross => {}
                _ => return bad(ConstraintProblem::NocrossConflictsWithPhase),
            }
        }
        if c.min > c.max {
            return bad(ConstraintProblem::MinAboveMax);
        }
        let min = match c.min.checked_add(quantum - 1) {
            Some(m) => m & !(quantum - 1),
            None => return bad(ConstraintProblem::WindowSmallerThanSize),
        };
        if min > c.max || c.max - min < c.size - 1 {
            return bad(ConstraintProblem::WindowSmallerThanSize);
        }
        let plain = align == quantum && c.nocross == 0 && min == 0 && c.max == u64::MAX;
        Ok(Self {
            size: c.size,
            align,
            phase: c.phase,
            nocross: c.nocross,
            min,
            max: c.max,
            plain,
        })
    }

    /// The lowest address at or above `lower` inside the free segment `[start, start +
    /// len)` where this placement fits, if any. `len >= 1`; `lower` is quantum-aligned.
    #[inline]
    pub fn fit_in(&self, start: u64, len: u64, lower: u64) -> Option<u64> {
        if self.plain && lower <= start {
            return (len >= self.size).then_some(start);
        }
        // The segment's last byte: never overflows, segments lie inside the space.
        let seg_last = start + (len - 1);
        let lo = start.max(self.min).max(lower);
        let hi = seg_last.min(self.max);
        if lo > hi {
            return None;
        }
        let mut addr = phase_up(lo, self.align, self.phase)?;
        let mut last = addr.checked_add(self.size - 1)?;
        if crosses(addr, last, self.nocross) {
            // Every aligned address below the next boundary crosses it too.
            let boundary = (addr | (self.nocross - 1)).checked_add(1)?;
            addr = phase_up(boundary, self.align, self.phase)?;
            last = addr.checked_add(self.size - 1)?;
            if crosses(addr, last, self.nocross) {
                return None;
            }
        }
        (last <= hi).then_some(addr)
    }

    /// True when an allocation at `addr` satisfies every part of this placement: the
    /// postcondition `xalloc` asserts.
    pub fn satisfied_by(&self, addr: u64) -> bool {
        let Some(last) = addr.checked_add(self.size - 1) else {
            return false;
        };
        addr & (self.align - 1) == self.phase
            && !crosses(addr, last, self.nocross)
            && addr >= self.min
            && last <= self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: u64 = 0x1000;

    fn placement(f: impl FnOnce(&mut Constraint)) -> Result<Placement, AllocError> {
        let mut c = Constraint::new(Q);
        f(&mut c);
        Placement::from_constraint(&c, Q)
    }

    fn problem(f: impl FnOnce(&mut Constraint)) -> ConstraintProblem {
        match placement(f) {
            Err(AllocError::BadConstraint { reason }) => reason,
            other => panic!("expected a constraint problem, got {other:?}"),
        }
    }

    #[test]
    fn phase_up_rounds_to_the_next_address_with_the_phase_or_reports_overflow() {
        assert_eq!(phase_up(0, 0x1000, 0), Some(0));
        assert_eq!(phase_up(1, 0x1000, 0), Some(0x1000));
        assert_eq!(phase_up(0x1000, 0x4000, 0x3000), Some(0x3000));
        assert_eq!(phase_up(0x3001, 0x4000, 0x3000), Some(0x7000));
        assert_eq!(phase_up(u64::MAX, 1 << 63, 0), None);
        assert_eq!(
            phase_up(u64::MAX - 0xfff, 0x1000, 0),
            Some(u64::MAX - 0xfff)
        );
    }

    #[test]
    fn each_malformed_constraint_is_named() {
        assert_eq!(
            problem(|c| c.align = 0x3000),
            ConstraintProblem::AlignNotPowerOfTwo
        );
        assert_eq!(
            problem(|c| {
                c.align = 0x2000;
                c.phase = 0x2000
            }),
            ConstraintProblem::PhaseNotBelowAlign
        );
        assert_eq!(
            problem(|c| c.phase = Q),
            ConstraintProblem::PhaseNotBelowAlign
        );
        assert_eq!(
            problem(|c| {
                c.align = 0x4000;
                c.phase = 0x800
            }),
            ConstraintProblem::PhaseNotQuantumMultiple
        );
        assert_eq!(
            problem(|c| c.nocross = 0x3000),
            ConstraintProblem::NocrossNotPowerOfTwo
        );
        assert_eq!(
            problem(|c| {
                c.size = 0x2000;
                c.nocross = 0x1000
            }),
            ConstraintProblem::NocrossSmallerThanSize
        );
        assert_eq!(
            problem(|c| {
                c.size = 0x2000;
                c.align = 0x4000;
                c.phase = 0x3000;
                c.nocross = 0x4000
            }),
            ConstraintProblem::NocrossConflictsWithPhase
        );
        assert_eq!(
            problem(|c| {
                c.min = 0x2000;
                c.max = 0x1fff
            }),
            ConstraintProblem::MinAboveMax
        );
        assert_eq!(
            problem(|c| {
                c.size = 0x2000;
                c.min = 0x1000;
                c.max = 0x2ffe
            }),
            ConstraintProblem::WindowSmallerThanSize
        );
        assert_eq!(
            problem(|c| c.min = u64::MAX),
            ConstraintProblem::WindowSmallerThanSize
        );
        assert_eq!(placement(|c| c.size = 0), Err(AllocError::ZeroSize));
        assert_eq!(
            placement(|c| c.size = 0x800),
            Err(AllocError::Unaligned {
                size: 0x800,
                quantum: Q
            })
        );
    }

    #[test]
    fn alignment_below_the_quantum_is_implied_by_the_quantum() {
        let p = placement(|c| c.align = 0x100).unwrap();
        assert_eq!(p.align, Q);
        assert!(p.plain);
    }

    #[test]
    fn fit_in_finds_the_lowest_address_satisfying_align_phase_and_bounds() {
        let p = placement(|c| {
            c.align = 0x4000;
            c.phase = 0x1000;
            c.min = 0x6000;
        })
        .unwrap();
        assert_eq!(p.fit_in(0, 0x10000, 0), Some(0x9000));
        assert_eq!(p.fit_in(0, 0x9000, 0), None);
        assert_eq!(p.fit_in(0, 0x10000, 0xa000), Some(0xd000));
        let window = placement(|c| {
            c.min = 0x3000;
            c.max = 0x3fff
        })
        .unwrap();
        assert_eq!(window.fit_in(0, 0x10000, 0), Some(0x3000));
        assert_eq!(window.fit_in(0x4000, 0x10000, 0), None);
    }

    #[test]
    fn fit_in_skips_to_the_next_boundary_when_the_first_candidate_crosses_nocross() {
        let p = placement(|c| {
            c.size = 0x2000;
            c.nocross = 0x4000
        })
        .unwrap();
        assert_eq!(p.fit_in(0x3000, 0x8000, 0), Some(0x4000));
        assert_eq!(p.fit_in(0x3000, 0x2000, 0), None);
        assert_eq!(p.fit_in(0x2000, 0x2000, 0), Some(0x2000));
    }

    #[test]
    fn fit_in_handles_a_segment_ending_at_the_top_of_the_address_space() {
        let top = u64::MAX - 0xfff;
        let p = placement(|c| c.align = 0x2000).unwrap();
        assert_eq!(p.fit_in(top - 0x1000, 0x2000, 0), Some(top - 0x1000));
        assert_eq!(p.fit_in(top, 0x1000, 0), None);
        let huge = placement(|c| c.align = 1 << 63).unwrap();
        assert_eq!(
            huge.fit_in(1 << 62, u64::MAX - (1 << 62) - 0xfff, 0),
            Some(1 << 63)
        );
        assert_eq!(huge.fit_in((1 << 63) + Q, 0x10000, 0), None);
        assert!(huge.satisfied_by(1 << 63));
        assert!(!huge.satisfied_by(Q));
    }
}
