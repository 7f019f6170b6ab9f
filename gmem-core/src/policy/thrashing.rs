//! Thrashing detection and mitigation: pages that bounce between processors.
//!
//! The model is UVM's (`kernel-open/nvidia-uvm/uvm_perf_thrashing.c`):
//!
//! - **Detection** (`thrashing_event_cb`). Every migration of a page is an event with
//!   a time stamp. An event within `lapse` of the page's previous event is a
//!   *thrashing event*; when a page has `threshold` consecutive thrashing events it
//!   *is thrashing*. An event after a longer gap ends the streak. (UVM's code only
//!   resets a page whose count already reached the threshold; below it the count
//!   survives a long gap although its field is documented as "consecutive" events.
//!   We follow the documentation: a long gap restarts the count.)
//! - **Mitigation** (`uvm_perf_thrashing_get_hint`). When a processor faults on a
//!   thrashing page, the fault path asks for a hint:
//!   - *pin*: keep the page where it is and map it remotely in the faulting
//!     processor's table, for `pin_time` (`uvm_perf_thrashing_pin`, 300 lapses);
//!   - *throttle*: in each throttling period of `nap` (`uvm_perf_thrashing_nap`, one
//!     lapse), one processor, the *do-not-throttle* one, alternating between periods
//!     (`thrashing_throttle_update`), services its fault; every other faulting
//!     processor waits until the period ends;
//!   - *throttle then pin*: UVM's default sequence, throttling until the page has
//!     been throttled `pin_threshold` times (`uvm_perf_thrashing_pin_threshold`, 10),
//!     then pinning it to the do-not-throttle processor.
//! - **Return to normal.** A page pinned for `pin_time` is unpinned by [`Thrashing::expire`]
//!   (UVM's `thrashing_unpin_pages` worker); a thrashing, unpinned page with no event
//!   for a `lapse` is no longer thrashing (UVM resets it on its next event; we also
//!   reset it when asked for a hint).
//!
//! **Time.** The core has no clock (`Platform` has none), so every call takes `now`,
//! a monotonic `u64` in the caller's unit, and the configuration is in the same unit.
//! [`ThrashingConfig::default`] is UVM's, in nanoseconds; a caller counting faults
//! instead builds its own with [`ThrashingConfig::new`]. The harness passes its
//! simulated clock in nanoseconds.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt;

use super::{block_of, PageMask, BLOCK_PAGES};
use crate::addr::Vpn;
use crate::handle::DeviceId;

/// What the fault path does about a thrashing page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mitigation {
    /// Keep the page where it is; map it remotely for the faulting processor.
    Pin,
    /// Let one processor per period through; the others wait.
    Throttle,
    /// Throttle, then pin to the do-not-throttle processor after `pin_threshold`
    /// throttlings (UVM's behaviour).
    ThrottleThenPin {
        /// Throttlings before pinning (`uvm_perf_thrashing_pin_threshold`, 10).
        pin_threshold: u8,
    },
}

/// Thrashing tuning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThrashingConfig {
    threshold: u8,
    lapse: u64,
    nap: u64,
    pin_time: u64,
    mitigation: Mitigation,
}

/// Why a configuration or a call was rejected (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ThrashingError {
    /// The threshold is outside `1..=7` (`UVM_PERF_THRASHING_THRESHOLD_MAX`: a 3-bit
    /// counter).
    Threshold(u8),
    /// A zero lapse or nap, or a zero pin threshold.
    ZeroParameter(&'static str),
    /// `now` is earlier than a time the engine was already given.
    TimeWentBack {
        /// The time given.
        now: u64,
        /// The latest time seen.
        latest: u64,
    },
}

impl fmt::Display for ThrashingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Threshold(t) => write!(f, "thrashing threshold {t} is not in 1..=7"),
            Self::ZeroParameter(p) => write!(f, "thrashing parameter {p} must be non-zero"),
            Self::TimeWentBack { now, latest } => {
                write!(f, "time {now} is before the latest time seen, {latest}")
            }
        }
    }
}

impl core::error::Error for ThrashingError {}

impl Default for ThrashingConfig {
    /// UVM's defaults in nanoseconds (`uvm_perf_thrashing.c`): threshold 3
    /// (`UVM_PERF_THRASHING_THRESHOLD_DEFAULT`), lapse 500 us
    /// (`UVM_PERF_THRASHING_LAPSE_USEC_DEFAULT`), nap 1 lapse
    /// (`UVM_PERF_THRASHING_NAP_DEFAULT`), pin 300 lapses
    /// (`UVM_PERF_THRASHING_PIN_DEFAULT`), throttle then pin after 10 throttlings
    /// (`UVM_PERF_THRASHING_PIN_THRESHOLD_DEFAULT`).
    fn default() -> Self {
        let lapse = 500_000;
        Self {
            threshold: 3,
            lapse,
            nap: lapse,
            pin_time: 300 * lapse,
            mitigation: Mitigation::ThrottleThenPin { pin_threshold: 10 },
        }
    }
}

impl ThrashingConfig {
    /// A configuration; times in the caller's unit. A `pin_time` of 0 pins forever
    /// (as UVM's `uvm_perf_thrashing_pin = 0`).
    ///
    /// # Errors
    /// [`ThrashingError::Threshold`] unless `1 <= threshold <= 7`;
    /// [`ThrashingError::ZeroParameter`] for a zero `lapse`, `nap` or pin threshold.
    pub fn new(
        threshold: u8,
        lapse: u64,
        nap: u64,
        pin_time: u64,
        mitigation: Mitigation,
    ) -> Result<Self, ThrashingError> {
        if !(1..=7).contains(&threshold) {
            return Err(ThrashingError::Threshold(threshold));
        }
        if lapse == 0 {
            return Err(ThrashingError::ZeroParameter("lapse"));
        }
        if nap == 0 {
            return Err(ThrashingError::ZeroParameter("nap"));
        }
        if mitigation == (Mitigation::ThrottleThenPin { pin_threshold: 0 }) {
            return Err(ThrashingError::ZeroParameter("pin_threshold"));
        }
        Ok(Self {
            threshold,
            lapse,
            nap,
            pin_time,
            mitigation,
        })
    }

    /// Consecutive thrashing events that make a page thrashing.
    pub fn threshold(&self) -> u8 {
        self.threshold
    }
    /// The longest gap between two events of one streak.
    pub fn lapse(&self) -> u64 {
        self.lapse
    }
    /// The length of a throttling period.
    pub fn nap(&self) -> u64 {
        self.nap
    }
    /// How long a page stays pinned (0: forever).
    pub fn pin_time(&self) -> u64 {
        self.pin_time
    }
    /// The mitigation.
    pub fn mitigation(&self) -> Mitigation {
        self.mitigation
    }
}

/// The engine's answer for a fault on a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThrashingHint {
    /// Service the fault as usual.
    None,
    /// Do not migrate: keep the page at `residency` and map it there remotely.
    Pin {
        /// Where the page stays.
        residency: DeviceId,
    },
    /// The faulting processor waits until `until`, then retries.
    Throttle {
        /// End of the throttling period.
        until: u64,
    },
}

/// The engine's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThrashingStats {
    /// Migrations recorded.
    pub migrations: u64,
    /// Times a page became thrashing.
    pub detected: u64,
    /// Throttle hints given.
    pub throttles: u64,
    /// Pages pinned.
    pub pins: u64,
    /// Pins ended (time out, or the page was moved anyway).
    pub unpins: u64,
    /// Thrashing pages that returned to normal after a quiet lapse.
    pub recovered: u64,
}

#[derive(Clone, Debug, Default)]
struct PageState {
    last: u64,
    events: u8,
    thrashing: bool,
    pinned: Option<(DeviceId, u64)>,
    throttle_end: u64,
    throttle_count: u8,
    do_not_throttle: Option<DeviceId>,
    /// Migration destinations and faulting processors since the last reset, sorted.
    processors: Vec<DeviceId>,
}

impl PageState {
    fn add_processor(&mut self, d: DeviceId) {
        if let Err(i) = self.processors.binary_search(&d) {
            self.processors.insert(i, d);
        }
    }
}

/// Per-page thrashing state for one address space.
#[derive(Clone, Debug, Default)]
pub struct Thrashing {
    config: ThrashingConfig,
    pages: BTreeMap<u64, PageState>,
    latest: u64,
    stats: ThrashingStats,
}

impl Thrashing {
    /// An engine with `config` and no history.
    pub fn new(config: ThrashingConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ThrashingConfig {
        &self.config
    }

    /// The counters so far.
    pub fn stats(&self) -> ThrashingStats {
        self.stats
    }

    fn tick(&mut self, now: u64) -> Result<(), ThrashingError> {
        if now < self.latest {
            return Err(ThrashingError::TimeWentBack {
                now,
                latest: self.latest,
            });
        }
        self.latest = now;
        Ok(())
    }

    /// Records that `page` migrated to `to` at `now`; returns whether it just became
    /// thrashing. A migration of a pinned page (the caller moved it anyway) ends the
    /// pin.
    ///
    /// # Errors
    /// [`ThrashingError::TimeWentBack`] if `now` is earlier than a time already seen.
    pub fn record_migration(
        &mut self,
        page: Vpn,
        to: DeviceId,
        now: u64,
    ) -> Result<bool, ThrashingError> {
        self.tick(now)?;
        self.stats.migrations += 1;
        let lapse = self.config.lapse;
        let threshold = self.config.threshold;
        let Some(st) = self.pages.get_mut(&page.0) else {
            let mut st = PageState {
                last: now,
                ..PageState::default()
            };
            st.add_processor(to);
            self.pages.insert(page.0, st);
            return Ok(false);
        };
        if st.pinned.take().is_some() {
            self.stats.unpins += 1;
            *st = PageState::default();
        } else if now - st.last <= lapse {
            st.events = st.events.saturating_add(1).min(7);
            st.last = now;
            st.add_processor(to);
            if st.events >= threshold && !st.thrashing {
                st.thrashing = true;
                self.stats.detected += 1;
                return Ok(true);
            }
            return Ok(false);
        } else if st.thrashing {
            self.stats.recovered += 1;
            *st = PageState::default();
        } else {
            st.events = 0;
            st.processors.clear();
        }
        st.last = now;
        st.add_processor(to);
        Ok(false)
    }

    /// Whether `page` is thrashing (pinned pages are).
    pub fn is_thrashing(&self, page: Vpn) -> bool {
        self.pages.get(&page.0).is_some_and(|s| s.thrashing)
    }

    /// Where `page` is pinned, if it is.
    pub fn pinned(&self, page: Vpn) -> Option<DeviceId> {
        self.pages.get(&page.0).and_then(|s| s.pinned.map(|p| p.0))
    }

    /// The processors that took part in `page`'s current streak: its migrations'
    /// destinations and the processors that faulted on it while it thrashed. A pin maps
    /// the page remotely in each of them (UVM's `hint.pin.processors`).
    pub fn processors(&self, page: Vpn) -> &[DeviceId] {
        self.pages.get(&page.0).map_or(&[], |s| &s.processors)
    }

    /// The thrashing pages of the block holding `block` (the prefetcher skips them).
    pub fn thrashing_mask(&self, block: Vpn) -> PageMask {
        let (base, _) = block_of(block);
        let mut m = PageMask::new();
        for (&vpn, st) in self.pages.range(base.0..base.0 + BLOCK_PAGES as u64) {
            if st.thrashing {
                m.set((vpn - base.0) as usize);
            }
        }
        m
    }

    /// What to do about `requester`'s fault on `page` at `now`; `resident` is where
    /// the page lives now (`None`: nowhere yet).
    ///
    /// # Errors
    /// [`ThrashingError::TimeWentBack`] if `now` is earlier than a time already seen.
    pub fn hint(
        &mut self,
        page: Vpn,
        requester: DeviceId,
        resident: Option<DeviceId>,
        now: u64,
    ) -> Result<ThrashingHint, ThrashingError> {
        self.tick(now)?;
        let config = self.config;
        let Some(st) = self.pages.get_mut(&page.0) else {
            return Ok(ThrashingHint::None);
        };
        if !st.thrashing {
            return Ok(ThrashingHint::None);
        }
        if let Some((residency, deadline)) = st.pinned {
            if config.pin_time == 0 || now < deadline {
                return Ok(ThrashingHint::Pin { residency });
            }
            self.stats.unpins += 1;
            self.stats.recovered += 1;
            *st = PageState::default();
            st.last = now;
            return Ok(ThrashingHint::None);
        }
        if now - st.last > config.lapse {
            self.stats.recovered += 1;
            *st = PageState::default();
            st.last = now;
            return Ok(ThrashingHint::None);
        }
        st.add_processor(requester);
        let pin = |st: &mut PageState, stats: &mut ThrashingStats, residency: DeviceId| {
            st.pinned = Some((residency, now.saturating_add(config.pin_time)));
            st.throttle_count = 0;
            stats.pins += 1;
            ThrashingHint::Pin { residency }
        };
        let hint = match config.mitigation {
            Mitigation::Pin => pin(st, &mut self.stats, resident.unwrap_or(requester)),
            Mitigation::Throttle | Mitigation::ThrottleThenPin { .. } => {
                // A new period: its do-not-throttle processor is the first to fault
                // in it, unless that one had the previous period too.
                if now > st.throttle_end {
                    st.throttle_end = now + config.nap;
                    st.do_not_throttle = if st.do_not_throttle == Some(requester) {
                        None
                    } else {
                        Some(requester)
                    };
                } else if st.do_not_throttle.is_none() {
                    st.do_not_throttle = Some(requester);
                }
                let pin_threshold = match config.mitigation {
                    Mitigation::ThrottleThenPin { pin_threshold } => Some(pin_threshold),
                    _ => None,
                };
                if st.do_not_throttle == Some(requester) {
                    match pin_threshold {
                        Some(t) if st.throttle_count >= t => pin(st, &mut self.stats, requester),
                        _ => ThrashingHint::None,
                    }
                } else {
                    st.throttle_count = st.throttle_count.saturating_add(1);
                    self.stats.throttles += 1;
                    ThrashingHint::Throttle {
                        until: st.throttle_end,
                    }
                }
            }
        };
        Ok(hint)
    }

    /// Ends the pins whose time is up and forgets quiet pages; returns the pages
    /// unpinned, whose remote mappings the caller removes so that the next access
    /// faults and migrates normally.
    ///
    /// # Errors
    /// [`ThrashingError::TimeWentBack`] if `now` is earlier than a time already seen.
    pub fn expire(&mut self, now: u64) -> Result<Vec<Vpn>, ThrashingError> {
        self.tick(now)?;
        let (lapse, pin_time) = (self.config.lapse, self.config.pin_time);
        let mut unpinned = Vec::new();
        let stats = &mut self.stats;
        self.pages.retain(|&vpn, st| match st.pinned {
            Some((_, deadline)) if pin_time != 0 && now >= deadline => {
                unpinned.push(Vpn(vpn));
                stats.unpins += 1;
                stats.recovered += 1;
                false
            }
            Some(_) => true,
            None if now - st.last > lapse => {
                if st.thrashing {
                    stats.recovered += 1;
                }
                false
            }
            None => true,
        });
        Ok(unpinned)
    }

    /// Forgets every page in `[first, first + pages)` (the range was unmapped);
    /// returns how many pinned pages it held.
    pub fn forget(&mut self, first: Vpn, pages: u64) -> usize {
        let keys: Vec<u64> = self
            .pages
            .range(first.0..first.0.saturating_add(pages))
            .map(|(&k, _)| k)
            .collect();
        let mut pinned = 0;
        for k in keys {
            if self.pages.remove(&k).is_some_and(|s| s.pinned.is_some()) {
                pinned += 1;
            }
        }
        pinned
    }

    /// Every pinned page, in address order.
    pub fn pinned_pages(&self) -> impl Iterator<Item = Vpn> + '_ {
        self.pages
            .iter()
            .filter(|(_, s)| s.pinned.is_some())
            .map(|(&v, _)| Vpn(v))
    }

    /// Pages with history.
    pub fn tracked(&self) -> usize {
        self.pages.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(i: u32) -> DeviceId {
        DeviceId::from_raw(i, 0)
    }

    fn cfg(mitigation: Mitigation) -> ThrashingConfig {
        // threshold 3, lapse 10, nap 5, pin 100 ticks.
        ThrashingConfig::new(3, 10, 5, 100, mitigation).unwrap()
    }

    /// Migrates `page` back and forth `n` times, `gap` ticks apart from `t`;
    /// returns the time of the last migration.
    fn bounce(t: &mut Thrashing, page: Vpn, n: u64, gap: u64, start: u64) -> u64 {
        let mut now = start;
        for k in 0..n {
            // Back and forth between devices 0 and 1.
            t.record_migration(page, dev((k % 2) as u32), now).unwrap();
            now += gap;
        }
        now - gap
    }

    #[test]
    fn a_page_bouncing_within_the_lapse_is_thrashing_after_threshold_events() {
        let mut t = Thrashing::new(cfg(Mitigation::Pin));
        let p = Vpn(0x1234);
        // The first migration is history, the next three are thrashing events.
        bounce(&mut t, p, 3, 4, 0);
        assert!(
            !t.is_thrashing(p),
            "two events are below the threshold of 3"
        );
        assert!(t.record_migration(p, dev(1), 12).unwrap());
        assert!(t.is_thrashing(p));
        assert_eq!(t.stats().detected, 1);
        assert_eq!(t.processors(p), [dev(0), dev(1)]);
        t.hint(p, dev(2), Some(dev(1)), 13).unwrap();
        assert_eq!(
            t.processors(p),
            [dev(0), dev(1), dev(2)],
            "the requester joins"
        );
        assert_eq!(t.processors(Vpn(9)), []);
        assert_eq!(
            t.thrashing_mask(p).iter().collect::<alloc::vec::Vec<_>>(),
            [0x34]
        );
    }

    #[test]
    fn migrations_farther_apart_than_the_lapse_never_thrash() {
        let mut t = Thrashing::new(cfg(Mitigation::Pin));
        let p = Vpn(7);
        bounce(&mut t, p, 50, 11, 0);
        assert!(!t.is_thrashing(p));
        // A streak broken by a long gap restarts: 2 quick events, a gap, 2 quick.
        let q = Vpn(8);
        for now in [1000, 1001, 1002, 1100, 1101, 1102] {
            t.record_migration(q, dev(0), now).unwrap();
        }
        assert!(!t.is_thrashing(q));
        assert_eq!(t.stats().detected, 0);
    }

    #[test]
    fn pin_keeps_the_page_where_it_is_until_the_pin_time_ends() {
        let mut t = Thrashing::new(cfg(Mitigation::Pin));
        let p = Vpn(1);
        let last = bounce(&mut t, p, 4, 2, 0);
        let h = t.hint(p, dev(2), Some(dev(1)), last + 1).unwrap();
        assert_eq!(h, ThrashingHint::Pin { residency: dev(1) });
        assert_eq!(t.pinned(p), Some(dev(1)));
        // Still pinned well after the lapse, until pin_time (100) passes.
        let h = t.hint(p, dev(3), Some(dev(1)), last + 50).unwrap();
        assert_eq!(h, ThrashingHint::Pin { residency: dev(1) });
        assert_eq!(t.expire(last + 100).unwrap(), []);
        assert_eq!(t.expire(last + 101).unwrap(), [p]);
        assert!(!t.is_thrashing(p) && t.pinned(p).is_none());
        assert_eq!(
            t.hint(p, dev(2), Some(dev(1)), last + 102).unwrap(),
            ThrashingHint::None
        );
        let s = t.stats();
        assert_eq!((s.pins, s.unpins, s.recovered), (1, 1, 1));
    }

    #[test]
    fn throttle_lets_one_processor_through_per_period_and_alternates() {
        let mut t = Thrashing::new(cfg(Mitigation::Throttle));
        let p = Vpn(2);
        let last = bounce(&mut t, p, 4, 1, 0); // thrashing at 3
        let now = last + 1;
        // First to fault in the period is let through; the other waits to its end.
        assert_eq!(t.hint(p, dev(1), None, now).unwrap(), ThrashingHint::None);
        assert_eq!(
            t.hint(p, dev(2), None, now).unwrap(),
            ThrashingHint::Throttle { until: now + 5 }
        );
        // Keep the page active so it stays thrashing, then a new period: the same
        // first processor does not get two periods in a row.
        t.record_migration(p, dev(0), now + 5).unwrap();
        assert_eq!(
            t.hint(p, dev(1), None, now + 6).unwrap(),
            ThrashingHint::Throttle { until: now + 11 }
        );
        assert_eq!(
            t.hint(p, dev(2), None, now + 6).unwrap(),
            ThrashingHint::None
        );
        assert_eq!(t.stats().throttles, 2);
        assert_eq!(t.stats().pins, 0, "throttle alone never pins");
    }

    #[test]
    fn throttle_then_pin_pins_to_the_let_through_processor_after_enough_throttles() {
        let c = ThrashingConfig::new(
            3,
            10,
            5,
            0,
            Mitigation::ThrottleThenPin { pin_threshold: 2 },
        );
        let mut t = Thrashing::new(c.unwrap());
        let p = Vpn(3);
        let mut now = bounce(&mut t, p, 4, 1, 0) + 1;
        assert_eq!(t.hint(p, dev(1), None, now).unwrap(), ThrashingHint::None);
        for _ in 0..2 {
            assert!(matches!(
                t.hint(p, dev(2), None, now).unwrap(),
                ThrashingHint::Throttle { .. }
            ));
        }
        now += 1;
        t.record_migration(p, dev(0), now).unwrap();
        assert_eq!(
            t.hint(p, dev(1), None, now).unwrap(),
            ThrashingHint::Pin { residency: dev(1) }
        );
        // pin_time 0: pinned forever, expire never ends it.
        assert_eq!(t.expire(now + 1_000_000).unwrap(), []);
        assert_eq!(t.pinned(p), Some(dev(1)));
    }

    #[test]
    fn a_quiet_lapse_returns_a_thrashing_page_to_normal() {
        let mut t = Thrashing::new(cfg(Mitigation::Throttle));
        let p = Vpn(4);
        let last = bounce(&mut t, p, 4, 1, 0);
        assert!(t.is_thrashing(p));
        assert_eq!(
            t.hint(p, dev(1), None, last + 11).unwrap(),
            ThrashingHint::None
        );
        assert!(!t.is_thrashing(p));
        assert_eq!(t.stats().recovered, 1);
        // expire forgets quiet pages, bounding the state.
        t.expire(last + 100).unwrap();
        assert_eq!(t.tracked(), 0);
    }

    #[test]
    fn moving_a_pinned_page_anyway_ends_the_pin_and_forget_drops_state() {
        let mut t = Thrashing::new(cfg(Mitigation::Pin));
        let p = Vpn(5);
        let last = bounce(&mut t, p, 4, 1, 0);
        t.hint(p, dev(1), Some(dev(0)), last).unwrap();
        t.record_migration(p, dev(1), last + 1).unwrap();
        assert_eq!(t.pinned(p), None);
        assert!(!t.is_thrashing(p));
        let last = bounce(&mut t, p, 5, 1, last + 2);
        t.hint(p, dev(1), Some(dev(0)), last).unwrap();
        assert_eq!(t.forget(Vpn(0), 10), 1);
        assert_eq!(t.tracked(), 0);
    }

    #[test]
    fn invariants_hold_under_pseudorandom_operation_sequences() {
        let mut x = 0x005e_ed0f_7e57_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for mitigation in [
            Mitigation::Pin,
            Mitigation::Throttle,
            Mitigation::ThrottleThenPin { pin_threshold: 3 },
        ] {
            let mut t = Thrashing::new(ThrashingConfig::new(3, 10, 4, 50, mitigation).unwrap());
            let mut now = 0u64;
            for _ in 0..5000 {
                // Often within a lapse of the page's last event, sometimes not.
                now += if next() % 256 == 0 { 60 } else { next() % 2 };
                let p = Vpn(next() % 4);
                let d = dev((next() % 3) as u32);
                match next() % 10 {
                    0..=4 => {
                        t.record_migration(p, d, now).unwrap();
                    }
                    5..=8 => match t.hint(p, d, Some(dev(0)), now).unwrap() {
                        ThrashingHint::Pin { residency } => {
                            assert_eq!(t.pinned(p), Some(residency));
                            assert!(t.is_thrashing(p), "pinned but not thrashing");
                        }
                        ThrashingHint::Throttle { until } => {
                            assert!(until >= now && until <= now + 4, "throttled past a nap");
                            assert!(mitigation != Mitigation::Pin);
                        }
                        ThrashingHint::None => {}
                    },
                    _ => {
                        for q in t.expire(now).unwrap() {
                            assert_eq!(t.pinned(q), None);
                        }
                    }
                }
                let s = t.stats();
                let pinned = (0..4).filter(|&q| t.pinned(Vpn(q)).is_some()).count() as u64;
                assert_eq!(s.pins - s.unpins, pinned, "pins and unpins disagree");
                assert!(s.detected <= s.migrations);
                if mitigation == Mitigation::Throttle {
                    assert_eq!(s.pins, 0);
                }
            }
            // The sequence reached every path it checks.
            let s = t.stats();
            assert!(s.detected > 0 && s.recovered > 0, "{mitigation:?}: {s:?}");
            assert!(s.pins > 0 || mitigation == Mitigation::Throttle, "{s:?}");
            assert!(s.throttles > 0 || mitigation == Mitigation::Pin, "{s:?}");
        }
    }

    #[test]
    fn bad_configs_and_backwards_time_are_typed_errors_that_change_nothing() {
        let m = Mitigation::Pin;
        assert_eq!(
            ThrashingConfig::new(0, 1, 1, 1, m),
            Err(ThrashingError::Threshold(0))
        );
        assert_eq!(
            ThrashingConfig::new(8, 1, 1, 1, m),
            Err(ThrashingError::Threshold(8))
        );
        assert_eq!(
            ThrashingConfig::new(3, 0, 1, 1, m),
            Err(ThrashingError::ZeroParameter("lapse"))
        );
        assert_eq!(
            ThrashingConfig::new(3, 1, 1, 1, Mitigation::ThrottleThenPin { pin_threshold: 0 }),
            Err(ThrashingError::ZeroParameter("pin_threshold"))
        );
        let mut t = Thrashing::new(cfg(m));
        t.record_migration(Vpn(1), dev(0), 50).unwrap();
        let before = t.stats();
        assert_eq!(
            t.record_migration(Vpn(1), dev(0), 49),
            Err(ThrashingError::TimeWentBack {
                now: 49,
                latest: 50
            })
        );
        assert_eq!(
            t.hint(Vpn(1), dev(1), None, 3),
            Err(ThrashingError::TimeWentBack { now: 3, latest: 50 })
        );
        assert_eq!(t.stats(), before);
        assert_eq!(ThrashingConfig::default().lapse(), 500_000);
    }
}
