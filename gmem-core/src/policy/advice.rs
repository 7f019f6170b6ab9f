//! The advice record: per-range hints about where data should live and who reads it.
//!
//! The anchors are CUDA's `cudaMemAdvise` (advice values `SetReadMostly`,
//! `SetPreferredLocation`, `SetAccessedBy` and their `Unset` twins, CUDA Runtime API
//! reference, "Memory Management") as UVM stores them per range
//! (`uvm_va_policy_t`: `preferred_location`, `accessed_by`, `read_duplication`), and
//! the GMEM RFC's `hmadvise`. An [`AdviceMap`] covers one address space's page
//! numbers `[lo, hi)`; every page has an [`Advice`], by default none. The map stores
//! only the pages whose advice is not the default, as maximal runs of equal advice:
//! setting advice over a range splits the runs it cuts, and runs that become equal
//! to a neighbour merge with it, so the map's size is the number of distinct
//! advised ranges, however often they were edited.
//!
//! The map does not know which devices exist: the caller says, through the `known`
//! predicate of [`AdviceMap::apply_checked`], and an edit naming an unknown device is
//! [`AdviceError::UnknownDevice`].

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt;

use crate::addr::{AddrError, VaRange, Vpn};
use crate::handle::DeviceId;

/// A set of devices, sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DeviceSet(Vec<DeviceId>);

impl DeviceSet {
    /// The empty set.
    pub const fn new() -> Self {
        Self(Vec::new())
    }

    /// Whether `d` is in the set.
    pub fn contains(&self, d: DeviceId) -> bool {
        self.0.binary_search(&d).is_ok()
    }

    /// Adds `d`; returns whether it was absent.
    pub fn insert(&mut self, d: DeviceId) -> bool {
        match self.0.binary_search(&d) {
            Ok(_) => false,
            Err(i) => {
                self.0.insert(i, d);
                true
            }
        }
    }

    /// Removes `d`; returns whether it was present.
    pub fn remove(&mut self, d: DeviceId) -> bool {
        match self.0.binary_search(&d) {
            Ok(i) => {
                self.0.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    /// The devices, ascending.
    pub fn iter(&self) -> impl Iterator<Item = DeviceId> + '_ {
        self.0.iter().copied()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The advice of one page.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Advice {
    /// Where the data should live (`cudaMemAdviseSetPreferredLocation`).
    pub preferred: Option<DeviceId>,
    /// Devices that map the data where it lives instead of migrating it
    /// (`cudaMemAdviseSetAccessedBy`).
    pub accessed_by: DeviceSet,
    /// Mostly read: readers get read-only copies (`cudaMemAdviseSetReadMostly`).
    pub read_mostly: bool,
}

static NO_ADVICE: Advice = Advice {
    preferred: None,
    accessed_by: DeviceSet::new(),
    read_mostly: false,
};

impl Advice {
    /// Whether this is the default: no advice.
    pub fn is_none(&self) -> bool {
        *self == NO_ADVICE
    }
}

/// One edit, as `cudaMemAdvise`'s advice values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdviceOp {
    /// Set the preferred location.
    SetPreferred(DeviceId),
    /// Clear the preferred location.
    UnsetPreferred,
    /// Add a device to the accessed-by set.
    SetAccessedBy(DeviceId),
    /// Remove a device from the accessed-by set.
    UnsetAccessedBy(DeviceId),
    /// Mark read-mostly.
    SetReadMostly,
    /// Clear read-mostly.
    UnsetReadMostly,
    /// Clear every advice.
    Clear,
}

impl AdviceOp {
    /// The device the edit names, if any.
    pub fn device(self) -> Option<DeviceId> {
        match self {
            Self::SetPreferred(d) | Self::SetAccessedBy(d) | Self::UnsetAccessedBy(d) => Some(d),
            _ => None,
        }
    }

    fn apply(self, a: &mut Advice) {
        match self {
            Self::SetPreferred(d) => a.preferred = Some(d),
            Self::UnsetPreferred => a.preferred = None,
            Self::SetAccessedBy(d) => {
                a.accessed_by.insert(d);
            }
            Self::UnsetAccessedBy(d) => {
                a.accessed_by.remove(d);
            }
            Self::SetReadMostly => a.read_mostly = true,
            Self::UnsetReadMostly => a.read_mostly = false,
            Self::Clear => *a = Advice::default(),
        }
    }
}

/// Why an edit was rejected (the map is unchanged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdviceError {
    /// The range is malformed: unaligned, empty or overflowing.
    Range(AddrError),
    /// The range is not inside the map's pages `[lo, hi)`.
    OutOfBounds {
        /// First page of the range.
        first: Vpn,
        /// Its length in pages.
        pages: u64,
    },
    /// The edit names a device that does not exist.
    UnknownDevice(DeviceId),
}

impl fmt::Display for AdviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Range(e) => write!(f, "bad advice range: {e}"),
            Self::OutOfBounds { first, pages } => {
                write!(
                    f,
                    "advice range {:#x}+{pages} pages is outside the space",
                    first.0
                )
            }
            Self::UnknownDevice(d) => write!(f, "advice names unknown device {d:?}"),
        }
    }
}

impl core::error::Error for AdviceError {}

impl From<AddrError> for AdviceError {
    fn from(e: AddrError) -> Self {
        Self::Range(e)
    }
}

/// Advice over the pages `[lo, hi)` of one address space.
#[derive(Clone, Debug)]
pub struct AdviceMap {
    lo: u64,
    hi: u64,
    /// start page -> (end page, advice); disjoint, non-default, no two adjacent equal.
    runs: BTreeMap<u64, (u64, Advice)>,
}

impl AdviceMap {
    /// A map over the pages `[lo, hi)` with no advice.
    pub fn new(lo: Vpn, hi: Vpn) -> Self {
        Self {
            lo: lo.0,
            hi: hi.0.max(lo.0),
            runs: BTreeMap::new(),
        }
    }

    /// The advice of `page` (the default outside every advised range).
    pub fn get(&self, page: Vpn) -> &Advice {
        self.run_at(page).map_or(&NO_ADVICE, |(_, _, a)| a)
    }

    /// The advised run holding `page`: `(first, end, advice)`.
    pub fn run_at(&self, page: Vpn) -> Option<(Vpn, Vpn, &Advice)> {
        let (&s, (e, a)) = self.runs.range(..=page.0).next_back()?;
        (page.0 < *e).then_some((Vpn(s), Vpn(*e), a))
    }

    /// The advised runs, ascending: `(first, end, advice)`.
    pub fn runs(&self) -> impl Iterator<Item = (Vpn, Vpn, &Advice)> + '_ {
        self.runs.iter().map(|(&s, (e, a))| (Vpn(s), Vpn(*e), a))
    }

    /// Applies `op` to every page of `range`.
    ///
    /// # Errors
    /// [`AdviceError::OutOfBounds`] if the range is not inside the map; the map is
    /// unchanged.
    pub fn apply(&mut self, range: VaRange, op: AdviceOp) -> Result<(), AdviceError> {
        let (s, n) = (range.first_vpn().0, range.pages());
        let e = s.checked_add(n).ok_or(AdviceError::OutOfBounds {
            first: Vpn(s),
            pages: n,
        })?;
        if s < self.lo || e > self.hi {
            return Err(AdviceError::OutOfBounds {
                first: Vpn(s),
                pages: n,
            });
        }
        // The new pieces of [s, e): existing runs cut to it, and the gaps between them.
        let mut pieces: Vec<(u64, u64, Advice)> = Vec::new();
        let mut at = s;
        let overlapping: Vec<(u64, u64, Advice)> = self
            .runs
            .range(..e)
            .rev()
            .take_while(|(_, (re, _))| *re > s)
            .map(|(&rs, (re, a))| (rs, *re, a.clone()))
            .collect();
        for (rs, re, a) in overlapping.iter().rev() {
            if *rs > at {
                pieces.push((at, *rs, Advice::default()));
            }
            pieces.push(((*rs).max(s), (*re).min(e), a.clone()));
            at = (*re).min(e);
        }
        if at < e {
            pieces.push((at, e, Advice::default()));
        }
        for p in &mut pieces {
            op.apply(&mut p.2);
        }
        // Replace: remove the overlapping runs, keep their parts outside [s, e).
        for (rs, re, a) in overlapping {
            self.runs.remove(&rs);
            if rs < s {
                self.runs.insert(rs, (s, a.clone()));
            }
            if re > e {
                self.runs.insert(e, (re, a));
            }
        }
        for (ps, pe, a) in pieces {
            if !a.is_none() {
                self.runs.insert(ps, (pe, a));
            }
        }
        self.merge_around(s, e);
        Ok(())
    }

    /// [`apply`](Self::apply), after checking that the device `op` names (if any)
    /// satisfies `known`.
    ///
    /// # Errors
    /// [`AdviceError::UnknownDevice`] if it does not; otherwise as
    /// [`apply`](Self::apply). The map is unchanged on every error.
    pub fn apply_checked(
        &mut self,
        range: VaRange,
        op: AdviceOp,
        known: impl Fn(DeviceId) -> bool,
    ) -> Result<(), AdviceError> {
        if let Some(d) = op.device().filter(|&d| !known(d)) {
            return Err(AdviceError::UnknownDevice(d));
        }
        self.apply(range, op)
    }

    /// Applies `op` to `len` bytes from `start`, checking the range first.
    ///
    /// # Errors
    /// [`AdviceError::Range`] for an unaligned, empty or overflowing range;
    /// [`AdviceError::OutOfBounds`] as [`apply`](Self::apply).
    pub fn apply_bytes(
        &mut self,
        start: crate::addr::VirtAddr,
        len: u64,
        op: AdviceOp,
    ) -> Result<(), AdviceError> {
        self.apply(VaRange::new(start, len)?, op)
    }

    /// Merges equal adjacent runs from the run before `s` to the run after `e`.
    fn merge_around(&mut self, s: u64, e: u64) {
        let from = self.runs.range(..s).next_back().map_or(s, |(&k, _)| k);
        let keys: Vec<u64> = self.runs.range(from..=e).map(|(&k, _)| k).collect();
        let mut prev: Option<u64> = None;
        for k in keys {
            if let Some(p) = prev {
                let (pe, same) = {
                    let (pe, pa) = &self.runs[&p];
                    let (_, ka) = &self.runs[&k];
                    (*pe, pa == ka)
                };
                if pe == k && same {
                    if let Some((ke, _)) = self.runs.remove(&k) {
                        if let Some(run) = self.runs.get_mut(&p) {
                            run.0 = ke;
                        }
                    }
                    continue;
                }
            }
            prev = Some(k);
        }
    }

    /// Removes `device` from every advice (it was unregistered): preferred locations
    /// naming it are cleared, and it leaves every accessed-by set.
    pub fn forget_device(&mut self, device: DeviceId) {
        let runs = core::mem::take(&mut self.runs);
        let mut last: Option<(u64, u64, Advice)> = None;
        for (s, (e, mut a)) in runs {
            if a.preferred == Some(device) {
                a.preferred = None;
            }
            a.accessed_by.remove(device);
            if a.is_none() {
                continue;
            }
            match &mut last {
                Some((_, le, la)) if *le == s && *la == a => *le = e,
                _ => {
                    if let Some((ls, le, la)) = last.take() {
                        self.runs.insert(ls, (le, la));
                    }
                    last = Some((s, e, a));
                }
            }
        }
        if let Some((ls, le, la)) = last {
            self.runs.insert(ls, (le, la));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{VirtAddr, PAGE_SIZE};

    fn dev(i: u32) -> DeviceId {
        DeviceId::from_raw(i, 0)
    }

    fn range(first: u64, pages: u64) -> VaRange {
        VaRange::new(VirtAddr::new(first * PAGE_SIZE), pages * PAGE_SIZE).unwrap()
    }

    /// The map's structural invariant: disjoint ascending runs inside the bounds,
    /// none default, no two adjacent runs equal.
    fn check(m: &AdviceMap) {
        let runs: Vec<_> = m.runs().collect();
        for (s, e, a) in &runs {
            assert!(s.0 < e.0 && s.0 >= m.lo && e.0 <= m.hi);
            assert!(!a.is_none(), "a default run is stored");
        }
        for w in runs.windows(2) {
            assert!(w[0].1 .0 <= w[1].0 .0, "runs overlap");
            assert!(
                !(w[0].1 == w[1].0 && w[0].2 == w[1].2),
                "equal neighbours unmerged"
            );
        }
    }

    #[test]
    fn setting_inside_a_run_splits_it_and_unsetting_merges_it_back() {
        let mut m = AdviceMap::new(Vpn(0), Vpn(100));
        m.apply(range(10, 50), AdviceOp::SetPreferred(dev(1)))
            .unwrap();
        m.apply(range(20, 10), AdviceOp::SetReadMostly).unwrap();
        check(&m);
        assert_eq!(m.runs().count(), 3);
        assert!(m.get(Vpn(25)).read_mostly && m.get(Vpn(25)).preferred == Some(dev(1)));
        assert!(!m.get(Vpn(30)).read_mostly);
        m.apply(range(20, 10), AdviceOp::UnsetReadMostly).unwrap();
        check(&m);
        assert_eq!(m.runs().count(), 1, "the split run merged back");
        m.apply(range(0, 100), AdviceOp::Clear).unwrap();
        assert_eq!(m.runs().count(), 0);
    }

    #[test]
    fn accessed_by_is_a_set_per_page_and_lookup_outside_runs_is_default() {
        let mut m = AdviceMap::new(Vpn(0), Vpn(64));
        m.apply(range(0, 8), AdviceOp::SetAccessedBy(dev(2)))
            .unwrap();
        m.apply(range(4, 8), AdviceOp::SetAccessedBy(dev(1)))
            .unwrap();
        check(&m);
        let set: Vec<_> = m.get(Vpn(5)).accessed_by.iter().collect();
        assert_eq!(set, [dev(1), dev(2)]);
        assert!(m.get(Vpn(10)).accessed_by.contains(dev(1)));
        assert!(!m.get(Vpn(10)).accessed_by.contains(dev(2)));
        assert!(m.get(Vpn(40)).is_none());
        assert_eq!(m.run_at(Vpn(40)), None);
        m.forget_device(dev(1));
        check(&m);
        assert_eq!(m.runs().count(), 1);
    }

    #[test]
    fn the_map_matches_a_per_page_model_under_pseudorandom_edits() {
        let mut x = 0x0bad_5eed_1234_5678u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        const N: u64 = 96;
        let mut m = AdviceMap::new(Vpn(0), Vpn(N));
        let mut model: Vec<Advice> = (0..N).map(|_| Advice::default()).collect();
        for _ in 0..2000 {
            let s = next() % N;
            let n = 1 + next() % (N - s);
            let d = dev((next() % 3) as u32);
            let op = match next() % 7 {
                0 => AdviceOp::SetPreferred(d),
                1 => AdviceOp::UnsetPreferred,
                2 => AdviceOp::SetAccessedBy(d),
                3 => AdviceOp::UnsetAccessedBy(d),
                4 => AdviceOp::SetReadMostly,
                5 => AdviceOp::UnsetReadMostly,
                _ => AdviceOp::Clear,
            };
            m.apply(range(s, n), op).unwrap();
            for a in &mut model[s as usize..(s + n) as usize] {
                op.apply(a);
            }
            check(&m);
            for p in 0..N {
                assert_eq!(m.get(Vpn(p)), &model[p as usize], "page {p} after {op:?}");
            }
        }
    }

    #[test]
    fn bad_ranges_and_unknown_devices_are_typed_errors_that_leave_the_map_unchanged() {
        let mut m = AdviceMap::new(Vpn(16), Vpn(32));
        m.apply(range(16, 4), AdviceOp::SetReadMostly).unwrap();
        let before: Vec<_> = m.runs().map(|(s, e, a)| (s, e, a.clone())).collect();
        assert_eq!(
            m.apply(range(30, 4), AdviceOp::SetReadMostly),
            Err(AdviceError::OutOfBounds {
                first: Vpn(30),
                pages: 4
            })
        );
        assert_eq!(
            m.apply(range(8, 9), AdviceOp::Clear),
            Err(AdviceError::OutOfBounds {
                first: Vpn(8),
                pages: 9
            })
        );
        assert!(matches!(
            m.apply_bytes(VirtAddr::new(0x10_800), 4096, AdviceOp::Clear),
            Err(AdviceError::Range(AddrError::Unaligned { .. }))
        ));
        assert!(matches!(
            m.apply_bytes(VirtAddr::new(0x10_000), 0, AdviceOp::Clear),
            Err(AdviceError::Range(AddrError::BadRange { .. }))
        ));
        let known = |d: DeviceId| d.index() < 2;
        assert_eq!(
            m.apply_checked(range(16, 4), AdviceOp::SetPreferred(dev(7)), known),
            Err(AdviceError::UnknownDevice(dev(7)))
        );
        assert_eq!(
            m.apply_checked(range(16, 4), AdviceOp::UnsetAccessedBy(dev(9)), known),
            Err(AdviceError::UnknownDevice(dev(9)))
        );
        let after: Vec<_> = m.runs().map(|(s, e, a)| (s, e, a.clone())).collect();
        assert_eq!(before, after);
        m.apply_checked(range(16, 4), AdviceOp::SetPreferred(dev(1)), known)
            .unwrap();
        assert_eq!(m.get(Vpn(17)).preferred, Some(dev(1)));
    }
}
