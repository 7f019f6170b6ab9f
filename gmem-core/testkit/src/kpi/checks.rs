//! The KPI runner's checks after every operation: unchanged state after a misuse,
//! invariants, large leaves, stale TLB entries; the reference constraint validation.

use super::*;

impl KpiRunner {
    // ----- checks --------------------------------------------------------------------

    /// Everything a failed call must leave as it was. `None` while some queue holds
    /// requests, since a call that fails after draining a queue legitimately completed
    /// queued work.
    pub(super) fn snapshot(&self) -> Option<String> {
        if self
            .live_slots()
            .iter()
            .any(|&s| self.sys.gm.as_pending(self.space(s).id) != Ok(0))
        {
            return None;
        }
        let mut out = String::new();
        for s in self.live_slots() {
            let id = self.space(s).id;
            // What callers hold: a failed allocation may reap the quantum caches (cached
            // bytes become free bytes), which no caller can observe.
            let a = self.sys.gm.as_arena_stats(id).expect("live space");
            // The detector's configuration (its counters move on a throttled fault,
            // which changes nothing else).
            let thrashing = self.sys.gm.as_thrashing(id).map(|t| t.map(|t| t.config));
            out += &format!(
                "{id:?} {:?} dma {:?} thrashing {thrashing:?} total {} allocated {} allocs {} frees {}\n",
                self.sys.gm.as_regions(id),
                self.sys.gm.dma_mappings(id),
                a.total,
                a.allocated,
                a.allocs,
                a.frees
            );
        }
        for d in 0..NDEV {
            out += &format!(
                "{d} {:?} {:?} {:?}\n",
                self.sys.gm.dev_frames(self.devices[d]),
                self.sys.gm.dev_active(self.devices[d]),
                self.sys.gm.dev_page_groups(self.devices[d]),
            );
        }
        Some(out)
    }

    /// Remember the state (and forget MMU events) before a call that may fail.
    pub(super) fn checkpoint(&mut self) {
        self.pre = self.snapshot();
        self.sys.take_events();
    }

    /// The state equals the snapshot taken before the operation, and no MMU call was
    /// made since.
    pub(super) fn unchanged(&mut self, ctx: &str) {
        let Some(before) = self.pre.clone() else {
            return;
        };
        let after = self.snapshot().unwrap_or_default();
        assert_eq!(before, after, "{ctx}: a failed call changed the state");
        let ev = self.sys.take_events();
        assert!(ev.is_empty(), "{ctx}: a failed call made MMU calls {ev:?}");
    }

    /// A misuse: exactly the typed error `want`, and nothing changed.
    pub(super) fn misuse<E: PartialEq + std::fmt::Debug>(
        &mut self,
        ctx: &str,
        r: Result<(), E>,
        want: E,
    ) {
        assert_eq!(r, Err(want), "{ctx}: misuse");
        self.summary.rejected += 1;
        self.unchanged(ctx);
    }

    /// A legitimate failure (no space, injected): exactly `want`, and nothing changed.
    pub(super) fn expect_failed<E: PartialEq + std::fmt::Debug>(
        &mut self,
        ctx: &str,
        r: Result<(), E>,
        want: E,
    ) {
        assert_eq!(r, Err(want), "{ctx}: failure");
        self.summary.rejected += 1;
        self.unchanged(ctx);
    }

    /// The checks after every operation: queue progress and callbacks, invariants, TLBs.
    pub(super) fn after(&mut self, ctx: &str) {
        if std::env::var_os("GMEM_TESTKIT_TRACE_EVENTS").is_some() {
            for e in self.sys.log.lock().iter() {
                eprintln!("    {e:?}");
            }
        }
        for slot in self.live_slots() {
            let id = self.space(slot).id;
            let n = self.sys.gm.as_pending(id).expect("live space");
            let m = self.space(slot).queue.len();
            assert!(n <= m, "{ctx}: {n} requests queued, the model knows {m}");
            let done: Vec<Request> = self.space_mut(slot).queue.drain(..m - n).collect();
            for q in done {
                let cb = match q {
                    Request::Unmap { callback, .. } | Request::Map { callback, .. } => callback,
                };
                self.expected_fired.extend(cb);
            }
        }
        {
            let c = self.callbacks.lock().expect("callback log");
            assert!(c.violations.is_empty(), "{ctx}: {:?}", c.violations);
            let mut fired = c.fired.clone();
            let mut want = self.expected_fired.clone();
            fired.sort_unstable();
            want.sort_unstable();
            assert_eq!(fired, want, "{ctx}: callbacks run (each exactly once)");
        }
        // No two edits of one table range were ever in flight at once (the
        // `Mmu::concurrent_edits` promise; the stores count it across threads too).
        for d in &self.sys.devices {
            assert_eq!(
                d.mmu.store().overlapping_edits(),
                0,
                "{ctx}: two edits of one table range overlapped"
            );
        }
        for slot in self.live_slots() {
            let id = self.space(slot).id;
            if let Err(v) = self.sys.gm.check_invariants(id) {
                panic!("{ctx}: invariant broken in {id:?}: {v}");
            }
            if self.space(slot).queue.is_empty() {
                self.check_tlbs(ctx, slot);
            }
            self.check_large(ctx, slot);
            self.check_thrashing(ctx, slot);
        }
        self.sys.take_events();
    }

    /// The large leaves the core recorded for `slot` are exactly those its drivers'
    /// tables hold (leaf sizes agree with the logical page table: `check_invariants`).
    pub(super) fn check_large(&self, ctx: &str, slot: usize) {
        let id = self.space(slot).id;
        let mut core: Vec<(u64, u64, u64)> = self
            .sys
            .gm
            .as_large_leaves(id)
            .expect("live space")
            .into_iter()
            .map(|l| {
                (
                    l.root.0,
                    l.va.as_u64() / PAGE_SIZE,
                    l.size.bytes() / PAGE_SIZE,
                )
            })
            .collect();
        let mut tables: Vec<(u64, u64, u64)> = Vec::new();
        let mut seen = BTreeSet::new();
        for (&(s, d), &root) in &self.roots {
            let store = self.sys.devices[d].mmu.store();
            // Roots are numbered per store: a table is (store, root).
            if s != slot || !self.alive[d] || !seen.insert((Arc::as_ptr(store) as usize, root.0)) {
                continue;
            }
            if !store.is_live(root) {
                continue;
            }
            tables.extend(
                store
                    .large_leaves(root)
                    .into_iter()
                    .map(|(v, n)| (root.0, v, n)),
            );
        }
        core.sort_unstable();
        tables.sort_unstable();
        assert_eq!(
            core, tables,
            "{ctx}: large leaves of the core vs the tables"
        );
    }

    /// No TLB of a device attached to `slot` holds a translation its page table does
    /// not have (and the active one's entries equal the table's).
    pub(super) fn check_tlbs(&self, ctx: &str, slot: usize) {
        let sp = self.space(slot);
        for (&(s, d), &root) in &self.roots {
            if s != slot || !self.alive[d] {
                continue;
            }
            let mmu = &self.sys.devices[d].mmu;
            let active = self.active[d] == Some(slot) && mmu.active_root() == Some(root);
            for p in 0..sp.pages {
                let va = VirtAddr::new(sp.begin + p * PAGE_SIZE);
                if !mmu.tlb_holds(root, va) {
                    continue;
                }
                let pte = mmu.store().lookup(root, va.vpn().0);
                assert!(
                    pte.is_some(),
                    "{ctx}: device {d}'s TLB still translates unmapped {va:?} in {:?}",
                    sp.id
                );
                if active {
                    assert_eq!(
                        mmu.translate(va),
                        pte,
                        "{ctx}: device {d}'s TLB is stale at {va:?}"
                    );
                }
            }
        }
    }
}

/// The reference validation of an arena constraint (quantum `q`), in the order the
/// arena documents.
pub fn constraint_problem(c: &Constraint, q: u64) -> Option<ConstraintProblem> {
    if c.align != 0 && !c.align.is_power_of_two() {
        return Some(ConstraintProblem::AlignNotPowerOfTwo);
    }
    let stated = if c.align == 0 { q } else { c.align };
    if c.phase >= stated {
        return Some(ConstraintProblem::PhaseNotBelowAlign);
    }
    if c.phase % q != 0 {
        return Some(ConstraintProblem::PhaseNotQuantumMultiple);
    }
    if c.nocross != 0 {
        if !c.nocross.is_power_of_two() {
            return Some(ConstraintProblem::NocrossNotPowerOfTwo);
        }
        if c.nocross < c.size {
            return Some(ConstraintProblem::NocrossSmallerThanSize);
        }
        if c.phase % c.nocross + c.size > c.nocross {
            return Some(ConstraintProblem::NocrossConflictsWithPhase);
        }
    }
    if c.min > c.max {
        return Some(ConstraintProblem::MinAboveMax);
    }
    match c.min.div_ceil(q).checked_mul(q) {
        Some(m) if m <= c.max && c.max - m >= c.size - 1 => None,
        _ => Some(ConstraintProblem::WindowSmallerThanSize),
    }
}
