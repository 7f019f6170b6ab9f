//! Thrashing detection in the KPI runner (`as_set_thrashing`, `as_expire_pins`,
//! `as_thrashing`; issue 35, item 3).
//!
//! The model keeps each space's configuration (the test system has no platform
//! clock, so its times are ticks of the space's migration clock) and the detector's
//! counters as last read. What pinning and throttling may do to the other calls:
//! - a pinned page stays where it lives and a faulting device maps it there
//!   remotely, so it has several mappings: the model does not care where a page
//!   lives, and every read through any device is still checked against its bytes;
//! - a fault may be answered [`FaultError::Throttled`] only while a throttling
//!   mitigation is on, for a page that could migrate (anonymous, not wired), and
//!   then nothing changed ([`KpiRunner::throttle_allowed`]); the test system's
//!   accesses wait such answers out, so reads and writes still succeed;
//! - after every operation the detector's configuration is the model's, its counters
//!   only grow, no more pins end than began, and a mitigation that never pins (never
//!   throttles) has pinned (throttled) nothing ([`KpiRunner::check_thrashing`]).

use super::*;

impl KpiRunner {
    /// A dead space handle, if any is known.
    fn stale_space(&self, pick: u8) -> Option<SpaceId> {
        (!self.dead_spaces.is_empty())
            .then(|| self.dead_spaces[usize::from(pick) % self.dead_spaces.len()])
    }

    /// `as_set_thrashing` of the space `space` picks (or of a dead handle).
    pub(super) fn set_thrashing(
        &mut self,
        ctx: &str,
        space: u8,
        config: Option<ThrashSel>,
        stale: bool,
    ) {
        let config = config.map(ThrashSel::config);
        if stale {
            let Some(id) = self.stale_space(space) else {
                return;
            };
            let r = self.sys.gm.as_set_thrashing(id, config);
            self.misuse(ctx, r, SpaceError::UnknownSpace(id));
            assert_eq!(
                self.sys.gm.as_thrashing(id),
                Err(SpaceError::UnknownSpace(id)),
                "{ctx}"
            );
            return;
        }
        let Some(slot) = self.pick_space(space) else {
            return;
        };
        let id = self.space(slot).id;
        assert_eq!(self.sys.gm.as_set_thrashing(id, config), Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        // A new detector starts with no history and zero counters.
        let want = config.map(|config| gmem_core::ThrashingState {
            config,
            stats: ThrashingStats::default(),
        });
        assert_eq!(self.sys.gm.as_thrashing(id), Ok(want), "{ctx}");
        let sp = self.space_mut(slot);
        sp.thrashing = config;
        sp.thrash_seen = ThrashingStats::default();
    }

    /// `as_expire_pins` of the space `space` picks (or of a dead handle): it ends
    /// no more pins than are held (none while detection is off, none with a pin time
    /// of 0, which pins until detection goes off), and counts each as an unpin.
    pub(super) fn expire_pins(&mut self, ctx: &str, space: u8, stale: bool) {
        if stale {
            let Some(id) = self.stale_space(space) else {
                return;
            };
            let r = self.sys.gm.as_expire_pins(id);
            return self.misuse(ctx, r.map(|_| ()), SpaceError::UnknownSpace(id));
        }
        let Some(slot) = self.pick_space(space) else {
            return;
        };
        let id = self.space(slot).id;
        let before = self.sys.gm.as_thrashing(id).expect("live space");
        let n = self
            .sys
            .gm
            .as_expire_pins(id)
            .unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
        self.summary.succeeded += 1;
        let after = self.sys.gm.as_thrashing(id).expect("live space");
        match (self.space(slot).thrashing, before, after) {
            (None, None, None) => assert_eq!(n, 0, "{ctx}: pins expired with detection off"),
            (Some(c), Some(b), Some(a)) => {
                let held = b.stats.pins - b.stats.unpins;
                assert!(n <= held, "{ctx}: {n} pins expired, at most {held} held");
                if c.pin_time() == 0 {
                    assert_eq!(n, 0, "{ctx}: a pin time of 0 pins until detection goes off");
                }
                assert_eq!(
                    a.stats.unpins,
                    b.stats.unpins + n,
                    "{ctx}: each expired pin counts as an unpin"
                );
                self.summary.pins_expired += n;
            }
            (m, b, a) => panic!("{ctx}: model {m:?}, detector before {b:?}, after {a:?}"),
        }
    }

    /// `Op::PingPong`: devices `devs` take turns at the page at `va` (turn `k` by
    /// `devs[k % 2]`): a load of its first 64 bytes when bit `k % 8` of `loads` is
    /// set, else a store of 8 bytes at `8 * (k % 8)`; through `dev_fault` instead
    /// when bit `k % 8` of `faults` is set. Every access is checked as alone.
    pub(super) fn ping_pong(
        &mut self,
        ctx: &str,
        devs: [usize; 2],
        va: u64,
        rounds: u8,
        (loads, faults): (u8, u8),
        seed: u8,
    ) {
        for k in 0..rounds {
            let dev = devs[usize::from(k % 2)];
            let bit = 1 << (k % 8);
            let load = loads & bit != 0;
            if faults & bit != 0 {
                self.fault(ctx, dev, va, !load);
            } else if load {
                self.read(ctx, dev, va, 64);
            } else {
                let at = va + 8 * u64::from(k % 8);
                self.write(ctx, dev, at, 8, seed.wrapping_add(k));
            }
        }
    }

    /// Whether a fault of `dev` at `va` (whose model answer is `expect`) may be
    /// answered `Throttled`: the page could migrate (an anonymous, unwired page the
    /// fault may populate) in a space whose detector throttles.
    pub(super) fn throttle_allowed(&self, dev: usize, va: u64, expect: &Expect) -> bool {
        if !matches!(expect, Expect::Either(_)) {
            return false;
        }
        let Some(slot) = self.active[dev] else {
            return false;
        };
        let sp = self.space(slot);
        if !sp.throttles() {
            return false;
        }
        sp.region_at(va).is_some_and(|r| {
            r.kind == Kind::Anonymous && !r.wired.contains(&((va - r.start()) / PAGE_SIZE))
        })
    }

    /// After every operation: the detector of each live space is the model's, its
    /// counters only grew since last read and balance; what they grew by is added to
    /// the run's summary.
    pub(super) fn check_thrashing(&mut self, ctx: &str, slot: usize) {
        let id = self.space(slot).id;
        let got = self.sys.gm.as_thrashing(id).expect("live space");
        let sp = self.space(slot);
        let (c, s) = match (sp.thrashing, got) {
            (None, None) => return,
            (Some(c), Some(st)) if st.config == c => (c, st.stats),
            (m, g) => panic!("{ctx}: thrashing detector {g:?}, model {m:?}"),
        };
        let seen = sp.thrash_seen;
        let grew = s.migrations >= seen.migrations
            && s.detected >= seen.detected
            && s.throttles >= seen.throttles
            && s.pins >= seen.pins
            && s.unpins >= seen.unpins
            && s.recovered >= seen.recovered;
        assert!(
            grew,
            "{ctx}: thrashing counters went back: {seen:?} -> {s:?}"
        );
        assert!(s.unpins <= s.pins, "{ctx}: more unpins than pins: {s:?}");
        assert!(
            s.detected <= s.migrations,
            "{ctx}: more pages found thrashing than migrations: {s:?}"
        );
        match c.mitigation() {
            Mitigation::Pin => assert_eq!(s.throttles, 0, "{ctx}: pin throttled: {s:?}"),
            Mitigation::Throttle => assert_eq!(s.pins, 0, "{ctx}: throttle pinned: {s:?}"),
            _ => {}
        }
        self.summary.thrashing_pins += s.pins - seen.pins;
        self.summary.thrashing_throttles += s.throttles - seen.throttles;
        self.space_mut(slot).thrash_seen = s;
    }
}
