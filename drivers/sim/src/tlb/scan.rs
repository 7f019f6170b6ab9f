//! The probe groups of a [`Tlb`](super::Tlb) and their scan: which ways of a set may hold
//! a lookup's page, sixteen ways per step whatever page sizes they hold.
//!
//! Each way keeps a 32-bit mask (clearing the low bits of the 4 KiB page number that a
//! larger page covers) and a 32-bit word (its page's probe word under that mask). A
//! lookup of probe word `x` has candidate lane `k` where `x & mask[k] == word[k]`; each
//! candidate is then confirmed on its full key by the caller. On x86-64 four groups
//! (sixteen ways) are compared with SSE2 — `pand`, `pcmpeqd`, two saturating packs and
//! one `pmovmskb` — with no branch per lane or per group; other targets use the portable
//! version, which a test checks against the SSE2 one on random groups.
//!
//! This is the one place of the crate with `unsafe`: the 16-byte loads of the SSE2
//! version (module `sse2`), each fenced with its justification.

/// The probe words of four ways. Lane `k` is a candidate for a lookup of word `x` when
/// `x & masks[k] == words[k]`: `masks[k]` is the page mask of the way's page shift and
/// `words[k]` the probe word of its page and asid under that mask; an empty lane has
/// mask 0 and word 1, which nothing matches. So one pass finds the candidates of every
/// page size; each is confirmed on the full key and asid.
///
/// Aligned to 16 bytes so that each array is one aligned SSE2 load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(16))]
pub(super) struct Group {
    pub(super) masks: [u32; 4],
    pub(super) words: [u32; 4],
}

/// Four empty lanes.
pub(super) const EMPTY_GROUP: Group = Group {
    masks: [0; 4],
    words: [1; 4],
};

impl Group {
    /// Bit `k` set where lane `k` is a candidate for `x` (portable: no branch per lane).
    #[inline(always)]
    pub(super) fn candidates(&self, x: u32) -> u32 {
        let mut b = 0u32;
        for k in 0..4 {
            b |= u32::from(x & self.masks[k] == self.words[k]) << k;
        }
        b
    }
}

/// The candidates for `x` among the sixteen lanes of `quad`: bit `4 n + k` set where
/// lane `k` of group `n` is one.
#[inline(always)]
pub(super) fn quad(quad: &[Group; 4], x: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        sse2::quad(quad, x)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        quad_portable(quad, x)
    }
}

/// [`quad`] without SIMD intrinsics (the version of other targets, and the reference the
/// SSE2 one is tested against).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
#[inline(always)]
pub(super) fn quad_portable(quad: &[Group; 4], x: u32) -> u32 {
    quad[0].candidates(x)
        | quad[1].candidates(x) << 4
        | quad[2].candidates(x) << 8
        | quad[3].candidates(x) << 12
}

/// Groups per [`block`]: 32 ways, one `u32` of candidate bits.
pub(super) const BLOCK: usize = 8;

/// The candidates of every lane of `groups` (at most [`BLOCK`] groups; bit `4 n + k` for
/// lane `k` of group `n`): sixteen lanes per step, then group by group. The common set
/// sizes (32 and 16 ways) take straight-line code with no branch per group.
#[inline(always)]
pub(super) fn block(groups: &[Group], x: u32) -> u32 {
    debug_assert!(groups.len() <= BLOCK);
    match (groups.len(), groups.split_first_chunk::<4>()) {
        (8, Some((a, rest))) => match rest.first_chunk::<4>() {
            Some(b) => quad(a, x) | quad(b, x) << 16,
            None => 0, // unreachable: eight groups hold two quads
        },
        (4, Some((a, _))) => quad(a, x),
        _ => {
            let mut m = 0u32;
            let mut quads = groups.chunks_exact(4);
            let mut at = 0;
            for q in &mut quads {
                if let Ok(q) = <&[Group; 4]>::try_from(q) {
                    m |= quad(q, x) << at;
                }
                at += 16;
            }
            for g in quads.remainder() {
                m |= g.candidates(x) << at;
                at += 4;
            }
            m
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod sse2 {
    //! The SSE2 scan of four groups. SSE2 is part of the x86-64 baseline, so these
    //! instructions exist on every x86-64 processor; the only `unsafe` operations are
    //! the aligned loads of the groups' arrays (and, before Rust 1.87, the intrinsics'
    //! calls themselves, which were `unsafe fn`s).

    use super::Group;
    use core::arch::x86_64::{
        __m128i, _mm_and_si128, _mm_cmpeq_epi32, _mm_load_si128, _mm_movemask_epi8,
        _mm_packs_epi16, _mm_packs_epi32, _mm_set1_epi32,
    };

    /// All ones in lane `k` where lane `k` of `g` is a candidate for the splat `xv`.
    #[inline(always)]
    fn hits(g: &Group, xv: __m128i) -> __m128i {
        // SAFETY: SSE2 is enabled on every x86-64 target. `Group` is `repr(C,
        // align(16))` with `masks` at offset 0 and `words` at offset 16, both `[u32; 4]`
        // (16 bytes), so each pointer is 16-byte aligned and the 16-byte load reads
        // exactly that array, inside the borrowed group.
        unsafe {
            let m = _mm_load_si128(g.masks.as_ptr().cast::<__m128i>());
            let w = _mm_load_si128(g.words.as_ptr().cast::<__m128i>());
            _mm_cmpeq_epi32(_mm_and_si128(xv, m), w)
        }
    }

    /// See [`super::quad`]. The four compare results (lanes of all ones or all zeros)
    /// narrow by signed saturation, which keeps all ones as all ones, to sixteen bytes
    /// in lane order; `pmovmskb` takes their top bits.
    #[inline(always)]
    pub(super) fn quad(q: &[Group; 4], x: u32) -> u32 {
        // SAFETY: SSE2 is enabled on every x86-64 target; no memory is touched here
        // (the block only calls SSE2 intrinsics on registers).
        unsafe {
            let xv = _mm_set1_epi32(x as i32);
            let lo = _mm_packs_epi32(hits(&q[0], xv), hits(&q[1], xv));
            let hi = _mm_packs_epi32(hits(&q[2], xv), hits(&q[3], xv));
            _mm_movemask_epi8(_mm_packs_epi16(lo, hi)) as u32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// A random group whose lanes match `x` about one time in three, with masks of
    /// random page sizes (and some empty lanes).
    fn group(s: &mut u64, x: u32) -> Group {
        let mut g = EMPTY_GROUP;
        for k in 0..4 {
            let r = xorshift(s);
            let mask = match r % 5 {
                0 => 0,
                1 => u32::MAX,
                _ => u32::MAX << ((r >> 8) % 32),
            };
            g.masks[k] = mask;
            g.words[k] = match (r >> 16) % 4 {
                0 => 1, // empty when the mask is 0, rarely a match otherwise
                1 => x & mask,
                2 => (x ^ (1 << ((r >> 24) % 32))) & mask,
                _ => (r >> 32) as u32 & mask,
            };
        }
        g
    }

    #[test]
    fn the_simd_scan_equals_the_portable_one_on_random_groups() {
        let mut s = 0x1234_5678_9ABC_DEF1u64;
        let mut seen = 0u32;
        for _ in 0..20_000 {
            let x = xorshift(&mut s) as u32;
            let q = [0; 4].map(|_| group(&mut s, x));
            let m = quad(&q, x);
            assert_eq!(m, quad_portable(&q, x), "{q:?} {x:#x}");
            for (n, g) in q.iter().enumerate() {
                for k in 0..4 {
                    let want = x & g.masks[k] == g.words[k];
                    assert_eq!(m >> (4 * n + k) & 1 == 1, want);
                }
            }
            seen |= m;
        }
        assert_eq!(seen, 0xFFFF, "every lane was a candidate at least once");
    }

    #[test]
    fn a_block_covers_whole_quads_and_a_remainder() {
        let mut s = 77u64;
        for len in (0..=BLOCK).chain([4, 8, 8, 4]) {
            let x = xorshift(&mut s) as u32;
            let gs: Vec<Group> = (0..len).map(|_| group(&mut s, x)).collect();
            let want = gs
                .iter()
                .enumerate()
                .fold(0u32, |m, (n, g)| m | g.candidates(x) << (4 * n));
            assert_eq!(block(&gs, x), want, "{len} groups");
        }
    }

    #[test]
    fn an_empty_lane_matches_nothing() {
        let q = [EMPTY_GROUP; 4];
        for x in [0, 1, u32::MAX, 0x8000_0000] {
            assert_eq!(quad(&q, x), 0);
            assert_eq!(quad_portable(&q, x), 0);
        }
    }
}
