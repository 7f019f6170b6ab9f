//! Spaces and devices in the KPI runner: create, destroy, attach, detach, switch,
//! and the failure injection of a space's MMUs.

use super::*;

impl KpiRunner {
    pub(super) fn create_space(&mut self, ctx: &str, large: bool, p: PolicySel) {
        if self.live_slots().len() >= MAX_SPACES {
            return;
        }
        let mut policy = match p.fit % 5 {
            1 => AllocPolicy::INSTANT_FIT,
            2 => AllocPolicy::BEST_FIT,
            3 => AllocPolicy::FIRST_FIT,
            4 => AllocPolicy::NEXT_FIT,
            _ => AllocPolicy::empty(),
        };
        if p.guarded {
            policy |= AllocPolicy::GUARDED;
        }
        if p.cached {
            policy |= AllocPolicy::CACHED;
        }
        let pages = if large { 192 } else { 64 };
        let begin = SPACE_BASE;
        let id = self
            .sys
            .gm
            .as_create(
                VirtAddr::new(begin),
                VirtAddr::new(begin + pages * PAGE_SIZE),
                policy,
            )
            .unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
        assert_eq!(
            self.sys.gm.as_set_batch_limit(id, self.batch_limit),
            Ok(()),
            "{ctx}"
        );
        let model = SpaceModel {
            id,
            begin,
            pages,
            guard: if p.guarded { PAGE_SIZE } else { 0 },
            regions: BTreeMap::new(),
            dmas: BTreeMap::new(),
            attached: BTreeMap::new(),
            queue: Vec::new(),
            fail_every: 0,
            attempts: 0,
            thrashing: None,
            thrash_seen: ThrashingStats::default(),
        };
        match self.spaces.iter().position(Option::is_none) {
            Some(s) => self.spaces[s] = Some(model),
            None => self.spaces.push(Some(model)),
        }
    }

    pub(super) fn create_space_bad(&mut self, ctx: &str, what: CreateMisuse) {
        let b = SPACE_BASE;
        let (begin, end, policy, want) = match what {
            CreateMisuse::Empty => (
                b,
                b,
                AllocPolicy::empty(),
                SpaceError::BadRange(AddrError::BadRange { start: b, len: 0 }),
            ),
            CreateMisuse::UnalignedBegin => (
                b + 8,
                b + PAGE_SIZE + 8,
                AllocPolicy::empty(),
                SpaceError::BadRange(AddrError::Unaligned {
                    addr: b + 8,
                    align: PAGE_SIZE,
                }),
            ),
            CreateMisuse::UnalignedEnd => (
                b,
                b + PAGE_SIZE + 8,
                AllocPolicy::empty(),
                SpaceError::BadRange(AddrError::Unaligned {
                    addr: PAGE_SIZE + 8,
                    align: PAGE_SIZE,
                }),
            ),
            CreateMisuse::TwoFits => {
                let two = AllocPolicy::BEST_FIT | AllocPolicy::FIRST_FIT;
                (b, b + PAGE_SIZE, two, SpaceError::BadPolicy(two))
            }
        };
        let r = self
            .sys
            .gm
            .as_create(VirtAddr::new(begin), VirtAddr::new(end), policy);
        self.misuse(ctx, r.map(|_| ()), want);
    }

    pub(super) fn space_destroyed(&mut self, slot: usize) {
        let sp = self.spaces[slot].take().expect("live slot");
        // Destroy drains the queue: every queued callback has run.
        for q in &sp.queue {
            let cb = match q {
                Request::Unmap { callback, .. } | Request::Map { callback, .. } => *callback,
            };
            self.expected_fired.extend(cb);
        }
        for r in sp.regions.values() {
            self.dead_regions.push(r.handle);
        }
        self.dead_dmas.extend(sp.dmas.values().map(|d| d.handle));
        self.dead_spaces.push(sp.id);
        for d in 0..NDEV {
            if self.active[d] == Some(slot) {
                self.active[d] = None;
            }
        }
        self.roots.retain(|(s, _), _| *s != slot);
    }

    pub(super) fn attach(&mut self, ctx: &str, space: u8, dev: usize, mode: Mode, activate: bool) {
        let Some(slot) = self.pick_space(space) else {
            return;
        };
        let activation = if activate {
            Activation::Switch
        } else {
            Activation::Leave
        };
        let id = self.space(slot).id;
        let mmu_mode = match mode {
            Mode::Shared => MmuMode::Shared,
            Mode::Coherent => MmuMode::Coherent,
            Mode::Replicate => MmuMode::Replicate,
        };
        let r = self
            .sys
            .gm
            .as_attach(id, self.devices[dev], mmu_mode, activation);
        if !self.alive[dev] {
            return self.misuse(
                ctx,
                r.map(|_| ()),
                AttachError::UnknownDevice(self.devices[dev]),
            );
        }
        if self.space(slot).attached.contains_key(&dev) {
            return self.misuse(ctx, r.map(|_| ()), AttachError::AlreadyAttached);
        }
        let eff = r.unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
        match mmu_mode {
            MmuMode::Shared => assert!(
                matches!(eff, MmuMode::Shared | MmuMode::Coherent),
                "{ctx}: shared became {eff:?}"
            ),
            m => assert_eq!(eff, m, "{ctx}"),
        }
        self.space_mut(slot).attached.insert(dev, eff);
        if activate {
            self.active[dev] = Some(slot);
        }
        self.learn_roots(slot);
    }

    /// Record which root each device uses in `slot`, from the events of this op.
    pub(super) fn learn_roots(&mut self, slot: usize) {
        for e in self.sys.take_events() {
            match e {
                MmuEvent::Create { mmu, root }
                | MmuEvent::Activate {
                    mmu,
                    root: Some(root),
                } => {
                    self.roots.insert((slot, mmu as usize), root);
                }
                _ => {}
            }
        }
    }

    pub(super) fn detach(&mut self, ctx: &str, space: u8, dev: usize) {
        let Some(slot) = self.pick_space(space) else {
            return;
        };
        let id = self.space(slot).id;
        let r = self.sys.gm.dev_detach(self.devices[dev], id);
        if !self.alive[dev] {
            return self.misuse(ctx, r, AttachError::UnknownDevice(self.devices[dev]));
        }
        if !self.space(slot).attached.contains_key(&dev) {
            return self.misuse(ctx, r, AttachError::NotAttached);
        }
        assert_eq!(r, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        self.space_mut(slot).attached.remove(&dev);
        if self.active[dev] == Some(slot) {
            self.active[dev] = None;
        }
        self.roots.remove(&(slot, dev));
    }

    pub(super) fn switch(&mut self, ctx: &str, space: u8, dev: usize) {
        let Some(slot) = self.pick_space(space) else {
            return;
        };
        let id = self.space(slot).id;
        let r = self.sys.gm.dev_switch(self.devices[dev], id);
        if !self.alive[dev] {
            return self.misuse(ctx, r, AttachError::UnknownDevice(self.devices[dev]));
        }
        if !self.space(slot).attached.contains_key(&dev) {
            return self.misuse(ctx, r, AttachError::NotAttached);
        }
        assert_eq!(r, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        self.active[dev] = Some(slot);
        self.learn_roots(slot);
    }

    /// One injection check of a valid attempt.
    pub(super) fn injected(&mut self, slot: usize) -> bool {
        let sp = self.space_mut(slot);
        if sp.fail_every == 0 {
            return false;
        }
        sp.attempts += 1;
        sp.attempts % sp.fail_every == 0
    }
}
