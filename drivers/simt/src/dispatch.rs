//! Thread-block dispatch and warp scheduling policies.
//!
//! A [`Dispatch`] decides where thread blocks go: it may pin a block to a unit (the
//! affinity policy a near-data system needs: the block waits for that unit, no work
//! stealing) or leave it to whichever unit has room, choosing among those ([`Greedy`]
//! fills the lowest-numbered unit first, [`RoundRobin`] rotates). A [`WarpScheduler`]
//! picks which ready warp of a unit issues next ([`LooseRoundRobin`], [`Gto`]).

/// Where thread blocks run.
pub trait Dispatch {
    /// A unit `block` must run on (`< units`), or `None` to let any unit take it.
    fn preferred(&mut self, block: u64, units: usize) -> Option<usize>;
    /// Pick the unit for the next unpinned block among `candidates` (units with a
    /// free block slot, ascending, never empty). Returns an element of `candidates`.
    fn choose(&mut self, candidates: &[usize]) -> usize;
}

/// Fill the lowest-numbered unit with room first.
#[derive(Clone, Copy, Debug, Default)]
pub struct Greedy;

impl Dispatch for Greedy {
    fn preferred(&mut self, _block: u64, _units: usize) -> Option<usize> {
        None
    }
    fn choose(&mut self, candidates: &[usize]) -> usize {
        candidates[0]
    }
}

/// Give each next block to the next unit with room after the last one used.
#[derive(Clone, Copy, Debug, Default)]
pub struct RoundRobin {
    last: Option<usize>,
}

impl Dispatch for RoundRobin {
    fn preferred(&mut self, _block: u64, _units: usize) -> Option<usize> {
        None
    }
    fn choose(&mut self, candidates: &[usize]) -> usize {
        let u = match self.last {
            Some(l) => candidates
                .iter()
                .copied()
                .find(|&u| u > l)
                .unwrap_or(candidates[0]),
            None => candidates[0],
        };
        self.last = Some(u);
        u
    }
}

/// Pin each block to the unit a callback names (modulo the unit count); blocks the
/// callback leaves open go round-robin.
pub struct Affinity<F: FnMut(u64) -> Option<usize>> {
    prefer: F,
    rest: RoundRobin,
}

impl<F: FnMut(u64) -> Option<usize>> Affinity<F> {
    /// Pin with `prefer(block)`.
    pub fn new(prefer: F) -> Affinity<F> {
        Affinity {
            prefer,
            rest: RoundRobin::default(),
        }
    }
}

impl<F: FnMut(u64) -> Option<usize>> Dispatch for Affinity<F> {
    fn preferred(&mut self, block: u64, units: usize) -> Option<usize> {
        (self.prefer)(block).map(|u| u % units.max(1))
    }
    fn choose(&mut self, candidates: &[usize]) -> usize {
        self.rest.choose(candidates)
    }
}

/// A warp slot holding no warp has this `ready_at`.
pub const DEAD: u64 = u64::MAX;

/// Which ready warp of a unit issues next.
pub trait WarpScheduler {
    /// A slot `i` with `ready_at[i] <= now` (dead slots hold [`DEAD`]), or `None` if
    /// there is none. `age[i]` orders warps by when they became resident (smaller =
    /// older).
    fn pick(&mut self, ready_at: &[u64], age: &[u64], now: u64) -> Option<usize>;
    /// [`WarpScheduler::pick`] given also `ready`, whose bit `i` is set exactly when
    /// `ready_at[i] <= now` (the engine keeps it when a unit has at most 64 slots). A
    /// scheduler may pick from the mask without scanning; the default calls `pick`.
    fn pick_ready(&mut self, ready: u64, ready_at: &[u64], age: &[u64], now: u64) -> Option<usize> {
        let _ = ready;
        self.pick(ready_at, age, now)
    }
    /// This scheduler as a [`LooseRoundRobin`], if it is one (the default: `None`).
    /// When every unit's is one, the engine holds those copies by value and runs a
    /// version of itself compiled for them, without a virtual call per pick; they pick
    /// exactly as these would.
    fn as_loose_round_robin(&self) -> Option<LooseRoundRobin> {
        None
    }
}

/// A boxed scheduler picks as the one in the box.
impl WarpScheduler for Box<dyn WarpScheduler> {
    fn pick(&mut self, ready_at: &[u64], age: &[u64], now: u64) -> Option<usize> {
        (**self).pick(ready_at, age, now)
    }
    fn pick_ready(&mut self, ready: u64, ready_at: &[u64], age: &[u64], now: u64) -> Option<usize> {
        (**self).pick_ready(ready, ready_at, age, now)
    }
    fn as_loose_round_robin(&self) -> Option<LooseRoundRobin> {
        (**self).as_loose_round_robin()
    }
}

/// Loose round-robin: the next ready slot after the last one issued.
#[derive(Clone, Copy, Debug, Default)]
pub struct LooseRoundRobin {
    last: usize,
}

impl WarpScheduler for LooseRoundRobin {
    #[inline]
    fn pick(&mut self, ready_at: &[u64], _age: &[u64], now: u64) -> Option<usize> {
        let n = ready_at.len();
        let from = (self.last + 1).min(n);
        let i = ready_at[from..]
            .iter()
            .position(|&r| r <= now)
            .map(|i| from + i)
            .or_else(|| ready_at[..from].iter().position(|&r| r <= now))?;
        self.last = i;
        Some(i)
    }
    #[inline]
    fn pick_ready(
        &mut self,
        ready: u64,
        _ready_at: &[u64],
        _age: &[u64],
        _now: u64,
    ) -> Option<usize> {
        // `pick`'s order: the first ready slot at or after `last + 1`, else the first.
        let from = self.last + 1;
        let after = if from < 64 {
            ready & (!0u64 << from)
        } else {
            0
        };
        let m = if after != 0 { after } else { ready };
        if m == 0 {
            return None;
        }
        let i = m.trailing_zeros() as usize;
        self.last = i;
        Some(i)
    }
    fn as_loose_round_robin(&self) -> Option<LooseRoundRobin> {
        Some(*self)
    }
}

/// Greedy-then-oldest: keep issuing the last warp while it is ready, else the oldest
/// ready one.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gto {
    last: Option<usize>,
}

impl WarpScheduler for Gto {
    fn pick(&mut self, ready_at: &[u64], age: &[u64], now: u64) -> Option<usize> {
        if let Some(l) = self.last {
            if ready_at.get(l).is_some_and(|&r| r <= now) {
                return Some(l);
            }
        }
        let i = (0..ready_at.len())
            .filter(|&i| ready_at[i] <= now)
            .min_by_key(|&i| age[i])?;
        self.last = Some(i);
        Some(i)
    }
    fn pick_ready(
        &mut self,
        ready: u64,
        _ready_at: &[u64],
        age: &[u64],
        _now: u64,
    ) -> Option<usize> {
        // `pick`'s choice from the set bits only: the last warp if ready, else the
        // oldest (the first in slot order among equal ages).
        if let Some(l) = self.last {
            if l < 64 && ready & (1 << l) != 0 {
                return Some(l);
            }
        }
        let (mut m, mut best) = (ready, None::<usize>);
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            if best.map_or(true, |b| age[i] < age[b]) {
                best = Some(i);
            }
        }
        let i = best?;
        self.last = Some(i);
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_round_robin_and_affinity_choose_as_documented() {
        let mut g = Greedy;
        assert_eq!(g.choose(&[1, 2, 3]), 1);
        let mut r = RoundRobin::default();
        assert_eq!(
            (
                r.choose(&[0, 1, 2]),
                r.choose(&[0, 1, 2]),
                r.choose(&[0, 2]),
                r.choose(&[0, 1])
            ),
            (0, 1, 2, 0)
        );
        let mut a = Affinity::new(|b| (b % 2 == 0).then_some(b as usize + 5));
        assert_eq!(a.preferred(2, 4), Some(3));
        assert_eq!(a.preferred(3, 4), None);
    }

    #[test]
    fn schedulers_issue_only_ready_live_warps() {
        let ready = [5, DEAD, 0, 0];
        let age = [0, 1, 2, 3];
        let mut lrr = LooseRoundRobin::default();
        assert_eq!(lrr.pick(&ready, &age, 0), Some(2));
        assert_eq!(lrr.pick(&ready, &age, 0), Some(3));
        assert_eq!(lrr.pick(&ready, &age, 0), Some(2));
        assert_eq!(lrr.pick(&ready, &age, 5), Some(3));
        assert_eq!(lrr.pick(&ready, &age, 5), Some(0));
        let mut gto = Gto::default();
        assert_eq!(gto.pick(&ready, &age, 10), Some(0));
        assert_eq!(gto.pick(&ready, &age, 10), Some(0));
        assert_eq!(gto.pick(&ready, &age, 1), Some(2));
        assert_eq!(gto.pick(&[DEAD], &[0], 9), None);
    }

    /// Loose round-robin's and GTO's picks from the ready mask against their scans of
    /// `ready_at`,
    /// over pseudo-random slot states and slot counts up to 64.
    #[test]
    fn picking_from_the_ready_mask_matches_the_scan() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let (mut picked, mut none) = (0, 0);
        for n in [1usize, 2, 13, 63, 64] {
            let (mut scan, mut mask) = (LooseRoundRobin::default(), LooseRoundRobin::default());
            let (mut gscan, mut gmask) = (Gto::default(), Gto::default());
            let mut ready = vec![0u64; n];
            let age: Vec<u64> = (0..n as u64).map(|i| (i * 7) % n as u64).collect();
            for now in 0..3_000u64 {
                let mut bits = 0u64;
                for (i, r) in ready.iter_mut().enumerate() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *r = if x % 32 == 0 {
                        DEAD
                    } else {
                        now + (x >> 40) % 64
                    };
                    if *r <= now {
                        bits |= 1 << i;
                    }
                }
                let g = gscan.pick(&ready, &age, now);
                assert_eq!(gmask.pick_ready(bits, &ready, &age, now), g, "gto n {n}");
                let want = scan.pick(&ready, &age, now);
                assert_eq!(
                    mask.pick_ready(bits, &ready, &age, now),
                    want,
                    "n {n} at {now}"
                );
                match want {
                    Some(_) => picked += 1,
                    None => none += 1,
                }
            }
        }
        assert!(
            picked > 1000 && none > 1000,
            "{picked} picks, {none} without"
        );
    }
}
