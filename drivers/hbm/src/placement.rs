//! CODA's data-placement decision (§4.3.2): from how a kernel indexes an object, or
//! from a profile of another input, decide fine or coarse grain and each stack's chunk.
//!
//! The paper's compiler pass finds, for each global access, an index expression of
//! kernel-invocation constants, the thread index, the block index and loop indices; the
//! runtime computes the stride between consecutive thread blocks from it. Here the
//! expression is given as an [`AffineIndex`] (standing in for that pass), or observed
//! from a profile ([`Profile`], for input-dependent accesses such as graphs), and:
//! - an object every block reads alike (block stride 0), or whose blocks' footprints
//!   overlap by more than a page (shared data), stays **fine grain**;
//! - otherwise it is **coarse grain**, and each stack gets the bytes of the
//!   consecutive blocks that run on it: `chunk = stride × blocks_per_stack` (the
//!   paper's Eq. 2, rebuilt from its prose — the equation was an image), rounded up to
//!   whole pages.
//!
//! `blocks_per_stack` is the affinity scheduler's: how many consecutive thread blocks
//! one stack runs together (its SMs × resident blocks per SM).

use crate::attrs::CodaAttrs;
use alloc::vec::Vec;
use gmem_core::PAGE_SIZE;

/// Element `block_coeff·b + thread_coeff·t + loop_coeff·l + offset` of an object of
/// `elem_bytes`-byte elements is touched by thread `t` of block `b` in iteration `l` of
/// a loop of `loop_len` iterations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AffineIndex {
    /// Coefficient of the block index.
    pub block_coeff: i64,
    /// Coefficient of the thread index.
    pub thread_coeff: i64,
    /// Coefficient of the loop index.
    pub loop_coeff: i64,
    /// Loop iterations (1 without a loop).
    pub loop_len: u64,
    /// Bytes per element.
    pub elem_bytes: u64,
}

/// The launch the placement is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Threads per block.
    pub threads_per_block: u64,
    /// Consecutive blocks one stack runs (the affinity scheduler's).
    pub blocks_per_stack: u64,
    /// Stacks.
    pub stacks: u32,
}

/// Per-block byte stride and footprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pattern {
    /// Bytes between the data of consecutive blocks.
    pub stride: u64,
    /// Bytes one block's accesses span.
    pub footprint: u64,
}

impl AffineIndex {
    /// The per-block pattern of the expression.
    pub fn pattern(&self, threads_per_block: u64) -> Pattern {
        let span = |coeff: i64, n: u64| coeff.unsigned_abs() * n.saturating_sub(1);
        Pattern {
            stride: self.block_coeff.unsigned_abs() * self.elem_bytes,
            footprint: (span(self.thread_coeff, threads_per_block)
                + span(self.loop_coeff, self.loop_len)
                + 1)
                * self.elem_bytes,
        }
    }
}

/// Accesses observed on another input: `(block, byte offset in the object)` samples.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// The samples.
    pub accesses: Vec<(u64, u64)>,
}

impl Profile {
    /// The per-block pattern the samples show (medians over blocks of their span and
    /// of the distance between consecutive blocks' first bytes); `None` with fewer
    /// than two blocks.
    pub fn pattern(&self) -> Option<Pattern> {
        let mut by_block: alloc::collections::BTreeMap<u64, (u64, u64)> = Default::default();
        for &(b, off) in &self.accesses {
            let e = by_block.entry(b).or_insert((off, off));
            e.0 = e.0.min(off);
            e.1 = e.1.max(off);
        }
        if by_block.len() < 2 {
            return None;
        }
        let firsts: Vec<(u64, u64)> = by_block.iter().map(|(&b, &(lo, _))| (b, lo)).collect();
        let mut strides: Vec<u64> = firsts
            .windows(2)
            .map(|w| w[1].1.abs_diff(w[0].1) / (w[1].0 - w[0].0))
            .collect();
        let mut spans: Vec<u64> = by_block.values().map(|&(lo, hi)| hi - lo + 1).collect();
        strides.sort_unstable();
        spans.sort_unstable();
        Some(Pattern {
            stride: strides[strides.len() / 2],
            footprint: spans[spans.len() / 2],
        })
    }
}

/// The descriptor of an input-dependent object starting at `base` from a profile of
/// another input: the profile's pattern decides as [`decide`] does, and a coarse
/// placement is kept only if the profile predicts it serves more of the accesses from
/// the accessing block's own stack (under affinity scheduling) than fine grain's
/// `1 / stacks` — an irregular object whose median stride does not line up with its
/// blocks stays fine grain rather than lose.
pub fn decide_profiled(base: u64, profile: &Profile, launch: Launch) -> CodaAttrs {
    let relative = decide(0, profile.pattern(), launch);
    if relative.granularity != crate::decode::Granularity::Coarse || profile.accesses.is_empty() {
        return CodaAttrs::FINE;
    }
    let n = u64::from(launch.stacks.max(1));
    let bps = launch.blocks_per_stack.max(1);
    let local = profile
        .accesses
        .iter()
        .filter(|&&(b, off)| relative.stack_of(off, launch.stacks) == Some(((b / bps) % n) as u32))
        .count();
    if local as f64 / profile.accesses.len() as f64 > 1.0 / n as f64 {
        decide(base, profile.pattern(), launch)
    } else {
        CodaAttrs::FINE
    }
}

/// The descriptor of an object starting at `base` accessed with `pattern` (`None`:
/// irregular, no pattern found) by `launch`.
pub fn decide(base: u64, pattern: Option<Pattern>, launch: Launch) -> CodaAttrs {
    let Some(p) = pattern else {
        return CodaAttrs::FINE;
    };
    let shared = p.stride == 0 || p.footprint > p.stride + PAGE_SIZE;
    if shared {
        return CodaAttrs::FINE;
    }
    let chunk = p.stride * launch.blocks_per_stack.max(1);
    CodaAttrs::coarse(base, chunk, launch.stacks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Granularity;

    const LAUNCH: Launch = Launch {
        threads_per_block: 256,
        blocks_per_stack: 8,
        stacks: 4,
    };

    #[test]
    fn block_exclusive_data_goes_coarse_with_its_stacks_chunk_shared_data_fine() {
        // Vector add: element 256·b + t of 4-byte floats: 1 KiB per block, 8 KiB per stack.
        let vadd = AffineIndex {
            block_coeff: 256,
            thread_coeff: 1,
            loop_coeff: 0,
            loop_len: 1,
            elem_bytes: 4,
        };
        let a = decide(0, Some(vadd.pattern(256)), LAUNCH);
        assert_eq!(a.granularity, Granularity::Coarse);
        assert_eq!(u64::from(a.chunk_pages), 2);
        // K-means features: each thread reads nfeatures = 34 consecutive floats.
        let kmeans = AffineIndex {
            block_coeff: 256 * 34,
            thread_coeff: 34,
            loop_coeff: 1,
            loop_len: 34,
            elem_bytes: 4,
        };
        assert_eq!(
            decide(0, Some(kmeans.pattern(256)), LAUNCH).granularity,
            Granularity::Coarse
        );
        // A vector every block reads whole (SGEMM's B, ATAX's x): shared.
        let shared = AffineIndex {
            block_coeff: 0,
            thread_coeff: 1,
            loop_coeff: 256,
            loop_len: 64,
            elem_bytes: 4,
        };
        assert_eq!(
            decide(0, Some(shared.pattern(256)), LAUNCH),
            CodaAttrs::FINE
        );
        assert_eq!(decide(0, None, LAUNCH), CodaAttrs::FINE);
    }

    #[test]
    fn a_profile_finds_the_stride_a_regular_input_has() {
        let mut p = Profile::default();
        for b in 0..16u64 {
            for t in (0..256u64).step_by(37) {
                p.accesses.push((b, (b * 256 + t) * 8));
            }
        }
        let pat = p.pattern().unwrap();
        assert_eq!(pat.stride, 2048);
        assert!(pat.footprint <= 2048);
        let a = decide(0, Some(pat), LAUNCH);
        assert_eq!((a.granularity, a.chunk_pages), (Granularity::Coarse, 4));
        assert_eq!(Profile::default().pattern(), None);
    }

    #[test]
    fn a_profile_that_predicts_no_locality_keeps_the_object_fine() {
        // Regular: block b reads its own 2 KiB.
        let mut regular = Profile::default();
        for b in 0..64u64 {
            for t in 0..8u64 {
                regular.accesses.push((b, b * 2048 + t * 256));
            }
        }
        assert_eq!(
            decide_profiled(0, &regular, LAUNCH).granularity,
            Granularity::Coarse
        );
        // Same median stride, but every block's accesses land on a scrambled chunk.
        let mut scrambled = Profile::default();
        for b in 0..64u64 {
            let c = (b * 37 + 11) % 64;
            for t in 0..8u64 {
                scrambled.accesses.push((b, c * 2048 + t * 256));
            }
        }
        scrambled.accesses.sort_by_key(|&(b, _)| b);
        let d = decide_profiled(0, &scrambled, LAUNCH);
        assert_eq!(d, CodaAttrs::FINE, "{d:?}");
        assert_eq!(
            decide_profiled(0, &Profile::default(), LAUNCH),
            CodaAttrs::FINE
        );
    }
}
