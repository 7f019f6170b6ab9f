//! Regions in the KPI runner: allocation (and its misuses), deallocation, unmap,
//! `region_map`, policies, migration, range operations, attributes, eviction, wiring.

use super::*;

impl KpiRunner {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn alloc(
        &mut self,
        ctx: &str,
        slot: usize,
        pages: u8,
        align_shift: u8,
        nocross_shift: u8,
        hint: Option<u8>,
        max: Option<u8>,
    ) {
        let sp = self.space(slot);
        let (id, begin, guard) = (sp.id, sp.begin, sp.guard);
        let size = u64::from(pages % 24) * PAGE_SIZE;
        let align = if align_shift < 8 {
            PAGE_SIZE << align_shift
        } else {
            0
        };
        let nocross = if nocross_shift < 9 {
            PAGE_SIZE << nocross_shift
        } else {
            0
        };
        let hint = hint.map_or(0, |h| begin + u64::from(h) % sp.pages * PAGE_SIZE);
        let max = max.map_or(u64::MAX, |m| {
            begin + (u64::from(m) % sp.pages + 1) * PAGE_SIZE - 1
        });
        let req = gmem_core::AllocRequest {
            hint: VirtAddr::new(hint),
            size,
            align,
            nocross,
            max: VirtAddr::new(max),
        };
        let r = self.sys.gm.as_alloc(id, req);
        if size == 0 {
            let want = AllocError::BadArgument(AddrError::BadRange { start: 0, len: 0 });
            return self.misuse(ctx, r.map(|_| ()), want);
        }
        let reserve = size + 2 * guard;
        let plain = align <= PAGE_SIZE && nocross == 0 && max == u64::MAX && hint == 0;
        let mut c = Constraint::new(reserve);
        let eff_align = align.max(PAGE_SIZE);
        c.align = eff_align;
        c.phase = (eff_align - guard % eff_align) % eff_align;
        c.nocross = nocross;
        c.max = max.saturating_add(guard);
        // The reference validation (the arena's quantum is a page).
        let problem = (!plain)
            .then(|| constraint_problem(&c, PAGE_SIZE))
            .flatten();
        let hinted = (hint != 0).then(|| {
            let mut h = c;
            h.min = hint.saturating_sub(guard);
            h
        });
        let hinted_problem = hinted.and_then(|h| constraint_problem(&h, PAGE_SIZE));
        if let Some(p) = hinted_problem {
            return self.misuse(ctx, r.map(|_| ()), AllocError::BadConstraint(p));
        }
        // The attempts: the hinted one (if any), then the plain or unhinted one.
        let mut injected_all = false;
        if let Some(h) = hinted {
            if !self.injected(slot) && self.feasible_somewhere(slot, &h).is_some() {
                return self.alloc_ok(ctx, slot, r, &h, size);
            }
        }
        if let Some(p) = problem {
            return self.misuse(ctx, r.map(|_| ()), AllocError::BadConstraint(p));
        }
        if self.injected(slot) {
            injected_all = true;
        }
        if injected_all {
            return self.expect_failed(ctx, r.map(|_| ()), AllocError::Injected);
        }
        if self.feasible_somewhere(slot, &c).is_none() {
            return self.expect_failed(ctx, r.map(|_| ()), AllocError::NoSpace { size });
        }
        self.alloc_ok(ctx, slot, r, &c, size);
    }

    pub(super) fn alloc_ok(
        &mut self,
        ctx: &str,
        slot: usize,
        r: Result<Region, AllocError>,
        c: &Constraint,
        size: u64,
    ) {
        let region = r.unwrap_or_else(|e| panic!("{ctx}: expected success, got {e:?}"));
        self.summary.succeeded += 1;
        let guard = self.space(slot).guard;
        let start = region.start.as_u64();
        let res = start - guard;
        assert!(
            self.feasible(slot, c, res),
            "{ctx}: region at {start:#x} breaks its constraint or overlaps; busy {:x?}",
            self.space(slot).busy()
        );
        self.space_mut(slot).regions.insert(
            start,
            RegionModel {
                handle: region,
                len: size,
                reserve: (res, c.size),
                prot: Prot::RW,
                placement: Placement::default(),
                zero_fill_block: 0,
                kind: Kind::Anonymous,
                bytes: BTreeMap::new(),
                populated: BTreeSet::new(),
                maybe_populated: false,
                wired: BTreeSet::new(),
                prots: BTreeMap::new(),
                holes: BTreeSet::new(),
                attrs: BTreeMap::new(),
            },
        );
    }

    pub(super) fn feasible(&self, slot: usize, c: &Constraint, a: u64) -> bool {
        let sp = self.space(slot);
        let Some(last) = a.checked_add(c.size - 1) else {
            return false;
        };
        let align = c.align.max(PAGE_SIZE);
        a % PAGE_SIZE == 0
            && a & (align - 1) == c.phase
            && a >= c.min
            && last <= c.max
            && (c.nocross == 0 || (a ^ last) & !(c.nocross - 1) == 0)
            && a >= sp.begin
            && last < sp.end()
            && sp.busy().iter().all(|&(b, l)| last < b || a > b + (l - 1))
    }

    pub(super) fn feasible_somewhere(&self, slot: usize, c: &Constraint) -> Option<u64> {
        let sp = self.space(slot);
        (0..sp.pages)
            .map(|p| sp.begin + p * PAGE_SIZE)
            .find(|&a| self.feasible(slot, c, a))
    }

    pub(super) fn alloc_bad(&mut self, ctx: &str, slot: usize, what: AllocMisuse) {
        let id = self.space(slot).id;
        let un = |addr| {
            AllocError::BadArgument(AddrError::Unaligned {
                addr,
                align: PAGE_SIZE,
            })
        };
        let base = gmem_core::AllocRequest::new(PAGE_SIZE);
        let (req, want) = match what {
            AllocMisuse::ZeroSize => (
                gmem_core::AllocRequest::new(0),
                AllocError::BadArgument(AddrError::BadRange { start: 0, len: 0 }),
            ),
            AllocMisuse::UnalignedSize => (
                gmem_core::AllocRequest::new(PAGE_SIZE + 512),
                un(PAGE_SIZE + 512),
            ),
            AllocMisuse::UnalignedHint => {
                let h = SPACE_BASE + 100;
                (
                    gmem_core::AllocRequest {
                        hint: VirtAddr::new(h),
                        ..base
                    },
                    un(h),
                )
            }
            AllocMisuse::AlignNotPowerOfTwo => (
                gmem_core::AllocRequest {
                    align: 3 * PAGE_SIZE,
                    ..base
                },
                un(3 * PAGE_SIZE),
            ),
            AllocMisuse::SmallAlign => (
                gmem_core::AllocRequest {
                    align: 2048,
                    ..base
                },
                un(2048),
            ),
            AllocMisuse::NocrossNotPowerOfTwo => (
                gmem_core::AllocRequest {
                    nocross: 3 * PAGE_SIZE,
                    ..base
                },
                un(3 * PAGE_SIZE),
            ),
        };
        let r = self.sys.gm.as_alloc(id, req);
        self.misuse(ctx, r.map(|_| ()), want);
    }

    pub(super) fn dealloc(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        asynchronous: bool,
        cb: bool,
    ) {
        let r = self.region(slot, start).clone();
        let cbk = self.callback(cb, Some((slot, r.start(), r.len)));
        let (cid, cbox) = cbk.map_or((None, None), |(i, b)| (Some(i), Some(b)));
        let flags = if asynchronous {
            MapFlags::ASYNC
        } else {
            MapFlags::empty()
        };
        let res = self.sys.gm.region_dealloc(r.handle, flags, cbox);
        assert_eq!(res, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        let sp = self.space_mut(slot);
        sp.regions.remove(&start);
        if asynchronous {
            sp.queue.push(Request::Unmap {
                range: (r.start(), r.len),
                reserve: Some(r.reserve),
                callback: cid,
            });
        } else {
            self.expected_fired.extend(cid);
        }
        self.dead_regions.push(r.handle);
    }

    pub(super) fn unmap(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        asynchronous: bool,
        cb: bool,
    ) {
        let r = self.region(slot, start).clone();
        let cbk = self.callback(cb, Some((slot, r.start(), r.len)));
        let (cid, cbox) = cbk.map_or((None, None), |(i, b)| (Some(i), Some(b)));
        let flags = if asynchronous {
            MapFlags::ASYNC
        } else {
            MapFlags::empty()
        };
        let res = self.sys.gm.region_unmap(r.handle, flags, cbox);
        assert_eq!(res, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        let m = self.region_mut(slot, start);
        m.clear_pages();
        if let Kind::Explicit { .. } = m.kind {
            m.kind = Kind::Explicit { mapped: false };
        }
        if asynchronous {
            self.space_mut(slot).queue.push(Request::Unmap {
                range: (r.start(), r.len),
                reserve: None,
                callback: cid,
            });
        } else {
            self.expected_fired.extend(cid);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn map(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        prot: Prot,
        asynchronous: bool,
        cb: bool,
        misuse: MapMisuse,
    ) {
        let r = self.region(slot, start).clone();
        let pages = r.pages();
        let mut frames: Vec<PhysAddr> = (0..pages)
            .map(|i| PhysAddr::new(self.next_external + i * PAGE_SIZE))
            .collect();
        let mut want = None;
        if prot.is_empty() {
            want = Some(MapError::BadProt(prot));
        } else {
            match misuse {
                MapMisuse::None => {}
                MapMisuse::FrameCount => {
                    frames.pop();
                    want = Some(MapError::FrameCount {
                        expected: pages,
                        given: pages - 1,
                    });
                }
                MapMisuse::ManagedFrame => {
                    frames[0] = PhysAddr::new(HOST_BASE);
                    want = Some(MapError::BadFrame(frames[0]));
                }
                MapMisuse::UnalignedFrame => {
                    frames[0] = PhysAddr::new(frames[0].as_u64() + 16);
                    want = Some(MapError::BadFrame(frames[0]));
                }
            }
        }
        let already = match r.kind {
            Kind::Explicit { mapped: true } => Some(true),
            Kind::Explicit { mapped: false } => Some(false),
            Kind::Anonymous => r.any_populated(),
        };
        let cbk = if want.is_none() {
            self.callback(cb, None)
        } else {
            None
        };
        let (cid, cbox) = cbk.map_or((None, None), |(i, b)| (Some(i), Some(b)));
        let flags = if asynchronous {
            MapFlags::ASYNC
        } else {
            MapFlags::empty()
        };
        let res = self.sys.gm.region_map(
            r.handle,
            MapRequest {
                prot,
                frames: &frames,
                memory: self.devices[HOST],
                set: None,
                flags,
                callback: cbox,
            },
        );
        if let Some(w) = want {
            return self.misuse(ctx, res, w);
        }
        match (already, res) {
            (Some(true) | None, Err(MapError::AlreadyMapped)) => {
                // A misuse: nothing changed (not even a queue drain), and a callback
                // given with the failed call is dropped unrun.
                self.summary.rejected += 1;
                self.unchanged(ctx);
                return;
            }
            (Some(false) | None, Ok(())) => {}
            (a, res) => panic!("{ctx}: already mapped {a:?} but region_map gave {res:?}"),
        }
        self.next_external += pages * PAGE_SIZE;
        self.summary.succeeded += 1;
        let m = self.region_mut(slot, start);
        m.clear_pages();
        m.kind = Kind::Explicit { mapped: true };
        m.prot = prot;
        m.prots.clear();
        if asynchronous {
            self.space_mut(slot).queue.push(Request::Map {
                start,
                callback: cid,
            });
        } else {
            self.expected_fired.extend(cid);
        }
    }

    pub(super) fn set_policy(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        target: u8,
        remote: bool,
    ) {
        let handle = self.region(slot, start).handle;
        let t = match target % 6 {
            0 => PlacementTarget::Faulting,
            1 => PlacementTarget::Host,
            k => PlacementTarget::Device(self.devices[usize::from(k - 2)]),
        };
        let placement = Placement {
            target: t,
            mode: if remote {
                PlacementMode::RemoteAccess
            } else {
                PlacementMode::Unique
            },
        };
        let r = self.sys.gm.region_set_policy(handle, placement);
        if let PlacementTarget::Device(d) = t {
            let k = self
                .devices
                .iter()
                .position(|x| *x == d)
                .expect("one of ours");
            if !self.alive[k] {
                return self.misuse(ctx, r, PolicyError::UnknownDevice(d));
            }
            if k == IGPU || k == IO {
                return self.misuse(ctx, r, PolicyError::NoMemory(d));
            }
        }
        assert_eq!(r, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        self.region_mut(slot, start).placement = placement;
    }

    pub(super) fn migrate(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        dev: usize,
        prefetch: bool,
    ) {
        let handle = self.region(slot, start).handle;
        let r = self.sys.gm.region_migrate(
            handle,
            self.devices[dev],
            if prefetch {
                MigrateScope::Prefetch
            } else {
                MigrateScope::Populated
            },
        );
        if !self.alive[dev] {
            return self.misuse(
                ctx,
                r.map(|_| ()),
                PopulateError::UnknownDevice(self.devices[dev]),
            );
        }
        match r {
            Ok(_) => {
                let m = self.region_mut(slot, start);
                if prefetch && m.kind == Kind::Anonymous {
                    m.populated.extend(0..m.pages());
                }
            }
            Err(PopulateError::Move(gmem_core::MoveError::OutOfMemory(_))) => {
                // Pages moved before the failure stay moved: logically invisible.
                self.region_mut(slot, start).maybe_populated = true;
            }
            Err(e) => panic!("{ctx}: {e:?}"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn protect_range(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        page: u8,
        pages: u8,
        prot: Prot,
        bad: bool,
    ) {
        let r = self.region(slot, start);
        let space = r.handle.space;
        let (p0, n) = r.range(page, pages, bad);
        if bad {
            let (range, want) = self.misused_range(slot, start, p0);
            let res = self
                .sys
                .gm
                .region_protect(gmem_core::Pages::range(space, range), prot);
            return self.misuse(ctx, res, ProtectError::Region(want));
        }
        let range = r.va_range((p0, n));
        let res = self
            .sys
            .gm
            .region_protect(gmem_core::Pages::range(space, range), prot);
        assert_eq!(res, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        // Every page of the range, in every table of the space: nothing maps it with
        // more than the new protection.
        self.check_range_pages(slot, start, p0, n, |va, pte| {
            if let Some(pte) = pte {
                assert!(
                    prot.contains(pte.prot),
                    "{ctx}: {va:?} still mapped {:?} after protect {prot:?}",
                    pte.prot
                );
            }
        });
        let m = self.region_mut(slot, start);
        for p in p0..p0 + n {
            if prot == m.prot {
                m.prots.remove(&p);
            } else {
                m.prots.insert(p, prot);
            }
        }
    }

    /// Run `check` on every page `p0 .. p0 + n` of the region at `start` of `slot`
    /// with its entry in each page table of the space (the roots the event log named).
    fn check_range_pages(
        &self,
        slot: usize,
        start: u64,
        p0: u64,
        n: u64,
        check: impl Fn(VirtAddr, Option<gmem_core::testing::Pte>),
    ) {
        for (&(s, d), &root) in &self.roots {
            if s != slot || !self.alive[d] {
                continue;
            }
            let store = self.sys.devices[d].mmu.store();
            if !store.is_live(root) {
                continue;
            }
            for p in p0..p0 + n {
                let va = VirtAddr::new(start + p * PAGE_SIZE);
                check(va, store.lookup(root, va.vpn().0));
            }
        }
    }

    pub(super) fn unmap_range(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        page: u8,
        pages: u8,
        bad: bool,
    ) {
        let r = self.region(slot, start);
        let space = r.handle.space;
        let (p0, n) = r.range(page, pages, bad);
        if bad {
            let (range, want) = self.misused_range(slot, start, p0);
            let res = self.sys.gm.region_unmap(
                gmem_core::Pages::range(space, range),
                MapFlags::empty(),
                None,
            );
            return self.misuse(ctx, res, want);
        }
        let range = r.va_range((p0, n));
        let res = self.sys.gm.region_unmap(
            gmem_core::Pages::range(space, range),
            MapFlags::empty(),
            None,
        );
        assert_eq!(res, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        // Every page of the range: no frame, and no table of the space maps it.
        let id = self.space(slot).id;
        self.check_range_pages(slot, start, p0, n, |va, pte| {
            assert_eq!(pte, None, "{ctx}: {va:?} still mapped after unmap_range");
        });
        for p in p0..p0 + n {
            let va = VirtAddr::new(start + p * PAGE_SIZE);
            assert_eq!(
                self.sys.gm.as_page_frame(id, va),
                Ok(None),
                "{ctx}: {va:?} still has a frame after unmap_range"
            );
        }
        let m = self.region_mut(slot, start);
        if p0 == 0 && n == m.pages() {
            // A range that covers the whole region is the region's own call
            // (`Pages::range`): a `region_map`ped region is then unmapped whole and
            // may be mapped again (found by the fuzzer: the model kept it mapped, with
            // every page a hole, and refused the next `region_map`).
            m.clear_pages();
            if let Kind::Explicit { .. } = m.kind {
                m.kind = Kind::Explicit { mapped: false };
            }
            return;
        }
        for p in p0..p0 + n {
            m.bytes.remove(&p);
            m.populated.remove(&p);
            m.wired.remove(&p);
            if m.kind == (Kind::Explicit { mapped: true }) {
                m.holes.insert(p);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn migrate_range(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        page: u8,
        pages: u8,
        dev: usize,
    ) {
        let r = self.region(slot, start);
        let range = r.va_range(r.range(page, pages, false));
        let res = self.sys.gm.region_migrate(
            gmem_core::Pages::range(r.handle.space, range),
            self.devices[dev],
            MigrateScope::Populated,
        );
        if !self.alive[dev] {
            return self.misuse(
                ctx,
                res.map(|_| ()),
                PopulateError::UnknownDevice(self.devices[dev]),
            );
        }
        match res {
            Ok(_) => self.summary.succeeded += 1,
            Err(PopulateError::Move(gmem_core::MoveError::OutOfMemory(_))) => {
                self.region_mut(slot, start).maybe_populated = true;
            }
            Err(e) => panic!("{ctx}: {e:?}"),
        }
    }

    pub(super) fn wire_range(&mut self, ctx: &str, slot: usize, start: u64, page: u8, pages: u8) {
        let r = self.region(slot, start);
        let (p0, n) = r.range(page, pages, false);
        let range = r.va_range((p0, n));
        let kind = r.kind;
        let res = self
            .sys
            .gm
            .region_wire(gmem_core::Pages::range(r.handle.space, range));
        match (kind, res) {
            (Kind::Explicit { .. }, r) => assert_eq!(r, Ok(0), "{ctx}: wiring caller frames"),
            (Kind::Anonymous, Ok(_)) => {
                self.summary.succeeded += 1;
                let m = self.region_mut(slot, start);
                m.wired.extend(p0..p0 + n);
                m.populated.extend(p0..p0 + n);
            }
            (Kind::Anonymous, Err(PopulateError::Move(gmem_core::MoveError::OutOfMemory(_)))) => {
                self.region_mut(slot, start).maybe_populated = true;
            }
            (_, Err(e)) => panic!("{ctx}: {e:?}"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn set_attrs(
        &mut self,
        ctx: &str,
        slot: usize,
        start: u64,
        whole: bool,
        page: u8,
        pages: u8,
        value: u32,
    ) {
        let r = self.region(slot, start);
        let (p0, n) = if whole {
            (0, r.pages())
        } else {
            r.range(page, pages, false)
        };
        let handle = r.handle;
        let res = if whole {
            self.sys.gm.region_set_attrs(handle, Attrs(value))
        } else {
            let range = r.va_range((p0, n));
            self.sys
                .gm
                .region_set_attrs(gmem_core::Pages::range(handle.space, range), Attrs(value))
        };
        assert_eq!(res, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        let m = self.region_mut(slot, start);
        for p in p0..p0 + n {
            if value == 0 {
                m.attrs.remove(&p);
            } else {
                m.attrs.insert(p, value);
            }
        }
        // Every mapping of the region's pages, in the tables of the devices active in
        // its space, carries the value.
        let (a, attrs, npages) = {
            let r = self.region(slot, start);
            (r.start(), r.attrs.clone(), r.pages())
        };
        for dev in 0..NDEV {
            if self.active[dev] != Some(slot) || !self.alive[dev] {
                continue;
            }
            let mmu = &self.sys.devices[dev].mmu;
            let Some(root) = mmu.active_root() else {
                continue;
            };
            for p in 0..npages {
                let vpn = (a + p * PAGE_SIZE) / PAGE_SIZE;
                if let Some(pte) = mmu.store().lookup(root, vpn) {
                    let want = attrs.get(&p).copied().unwrap_or(0);
                    assert_eq!(
                        pte.attrs,
                        Attrs(want),
                        "{ctx}: page {p} (vpn {vpn:#x}) mapped by {dev}"
                    );
                }
            }
        }
    }

    pub(super) fn evacuate(&mut self, ctx: &str, dev: usize) {
        let id = self.devices[dev];
        let res = self.sys.gm.dev_evacuate(id);
        if dev == HOST {
            return self.misuse(ctx, res.map(|_| ()), PopulateError::IsHost);
        }
        if !self.alive[dev] {
            return self.misuse(ctx, res.map(|_| ()), PopulateError::UnknownDevice(id));
        }
        match res {
            Ok(_) => {
                self.summary.succeeded += 1;
                if let Ok(f) = self.sys.gm.dev_frames(id) {
                    assert_eq!(
                        (f.active, f.inactive, f.wired),
                        (0, 0, 0),
                        "{ctx}: the evacuated memory still backs pages"
                    );
                }
            }
            Err(PopulateError::Move(gmem_core::MoveError::OutOfMemory(_))) => {}
            Err(e) => panic!("{ctx}: {e:?}"),
        }
    }

    pub(super) fn wire(&mut self, ctx: &str, slot: usize, start: u64) {
        let handle = self.region(slot, start).handle;
        let kind = self.region(slot, start).kind;
        let r = self.sys.gm.region_wire(handle);
        match (kind, r) {
            (Kind::Explicit { .. }, r) => assert_eq!(r, Ok(0), "{ctx}: wiring caller frames"),
            (Kind::Anonymous, Ok(_)) => {
                let m = self.region_mut(slot, start);
                m.wired.extend(0..m.pages());
                m.populated.extend(0..m.pages());
            }
            (Kind::Anonymous, Err(PopulateError::Move(gmem_core::MoveError::OutOfMemory(_)))) => {
                self.region_mut(slot, start).maybe_populated = true;
            }
            (_, Err(e)) => panic!("{ctx}: {e:?}"),
        }
    }
}
