//! One operation of the KPI runner dispatched to the call it exercises.

use super::*;

impl KpiRunner {
    pub(super) fn apply(&mut self, op: &Op, ctx: &str) {
        match *op {
            Op::CreateSpace { large, policy } => self.create_space(ctx, large, policy),
            Op::CreateSpaceBad { what } => self.create_space_bad(ctx, what),
            Op::DestroySpace { space } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                let id = self.space(slot).id;
                assert_eq!(self.sys.gm.as_destroy(id), Ok(()), "{ctx}");
                self.summary.succeeded += 1;
                self.space_destroyed(slot);
            }
            Op::Attach {
                space,
                dev,
                mode,
                activate,
            } => self.attach(ctx, space, usize::from(dev) % NDEV, mode, activate),
            Op::Detach { space, dev } => self.detach(ctx, space, usize::from(dev) % NDEV),
            Op::Switch { space, dev } => self.switch(ctx, space, usize::from(dev) % NDEV),
            Op::Alloc {
                space,
                pages,
                align_shift,
                nocross_shift,
                hint,
                max,
            } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                self.alloc(ctx, slot, pages, align_shift, nocross_shift, hint, max);
            }
            Op::AllocBad { space, what } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                self.alloc_bad(ctx, slot, what);
            }
            Op::Dealloc {
                region,
                asynchronous,
                callback,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.dealloc(ctx, slot, start, asynchronous, callback);
            }
            Op::Unmap {
                region,
                asynchronous,
                callback,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.unmap(ctx, slot, start, asynchronous, callback);
            }
            Op::Map {
                region,
                prot,
                asynchronous,
                callback,
                misuse,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.map(
                    ctx,
                    slot,
                    start,
                    prot.prot(),
                    asynchronous,
                    callback,
                    misuse,
                );
            }
            Op::Write {
                dev,
                region,
                page,
                offset,
                len,
                seed,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let r = self.region(slot, start);
                let va = r.start() + u64::from(page) % r.pages() * PAGE_SIZE;
                let off = u64::from(offset) % PAGE_SIZE;
                let len = (u64::from(len) % 64 + 1).min(PAGE_SIZE - off);
                self.write(ctx, usize::from(dev) % NDEV, va + off, len as usize, seed);
            }
            Op::Read {
                dev,
                region,
                page,
                offset,
                len,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let r = self.region(slot, start);
                let va = r.start() + u64::from(page) % r.pages() * PAGE_SIZE;
                let off = u64::from(offset) % PAGE_SIZE;
                let len = (u64::from(len) % 256 + 1).min(PAGE_SIZE - off);
                self.read(ctx, usize::from(dev) % NDEV, va + off, len as usize);
            }
            Op::ReadAnywhere { dev, space, page } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                let sp = self.space(slot);
                let va = sp.begin + u64::from(page) % sp.pages * PAGE_SIZE;
                self.read(ctx, usize::from(dev) % NDEV, va, 16);
            }
            Op::Fault {
                dev,
                region,
                page,
                offset,
                write,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let r = self.region(slot, start);
                let va = r.start()
                    + u64::from(page) % r.pages() * PAGE_SIZE
                    + u64::from(offset) % PAGE_SIZE;
                self.fault(ctx, usize::from(dev) % NDEV, va, write);
            }
            Op::Advise {
                region,
                page,
                pages,
                kind,
                dev,
                bad,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.advise(ctx, (slot, start), (page, pages), kind, dev, bad);
            }
            Op::SetPolicy {
                region,
                target,
                remote,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.set_policy(ctx, slot, start, target, remote);
            }
            Op::ZeroFillBlock { region, shift } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let handle = self.region(slot, start).handle;
                let bytes = match shift {
                    s if s < 11 => PAGE_SIZE << s,
                    11 => 0,
                    _ => 3 * PAGE_SIZE,
                };
                let r = self.sys.gm.region_set_zero_fill_block(handle, bytes);
                if bytes == 3 * PAGE_SIZE {
                    self.misuse(ctx, r, PolicyError::BadZeroFillBlock(bytes));
                } else {
                    assert_eq!(r, Ok(()), "{ctx}");
                    self.summary.succeeded += 1;
                    self.region_mut(slot, start).zero_fill_block = bytes;
                }
            }
            Op::Protect { region, prot } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let handle = self.region(slot, start).handle;
                let p = prot.prot();
                let r = self.sys.gm.region_protect(handle, p);
                assert_eq!(r, Ok(()), "{ctx}");
                self.summary.succeeded += 1;
                let m = self.region_mut(slot, start);
                m.prot = p;
                m.prots.clear();
            }
            Op::ProtectRange {
                region,
                page,
                pages,
                prot,
                bad,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.protect_range(ctx, slot, start, page, pages, prot.prot(), bad);
            }
            Op::UnmapRange {
                region,
                page,
                pages,
                bad,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.unmap_range(ctx, slot, start, page, pages, bad);
            }
            Op::MigrateRange {
                region,
                page,
                pages,
                dev,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.migrate_range(ctx, slot, start, page, pages, usize::from(dev) % NDEV);
            }
            Op::WireRange {
                region,
                page,
                pages,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.wire_range(ctx, slot, start, page, pages);
            }
            Op::UnwireRange {
                region,
                page,
                pages,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let r = self.region(slot, start);
                let (p0, n) = r.range(page, pages, false);
                let range = r.va_range((p0, n));
                let handle = r.handle;
                assert_eq!(
                    self.sys
                        .gm
                        .region_unwire(gmem_core::Pages::range(handle.space, range)),
                    Ok(()),
                    "{ctx}"
                );
                self.summary.succeeded += 1;
                let m = self.region_mut(slot, start);
                for p in p0..p0 + n {
                    m.wired.remove(&p);
                }
            }
            Op::Evacuate { dev } => self.evacuate(ctx, usize::from(dev) % NDEV),
            Op::SetAttrs {
                region,
                whole,
                page,
                pages,
                value,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.set_attrs(ctx, slot, start, whole, page, pages, u32::from(value % 4));
            }
            Op::Promote { region } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let handle = self.region(slot, start).handle;
                match self.sys.gm.region_promote(handle) {
                    Ok(_) => self.summary.succeeded += 1,
                    // No aligned free block: the block's mappings were dropped (they
                    // fault back), its pages and bytes are where they were.
                    Err(PopulateError::Move(gmem_core::MoveError::OutOfMemory(_))) => {}
                    Err(e) => panic!("{ctx}: {e:?}"),
                }
            }
            Op::DmaMap {
                space,
                pages,
                prot,
                scattered,
                misuse,
            } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                self.dma_map(
                    ctx,
                    slot,
                    1 + u64::from(pages % 8),
                    prot.prot(),
                    scattered,
                    misuse,
                );
            }
            Op::DmaUnmap {
                which,
                asynchronous,
                callback,
                stale,
            } => self.dma_unmap(ctx, which, asynchronous, callback, stale),
            Op::DmaWrite {
                dev,
                which,
                page,
                offset,
                len,
                seed,
            } => {
                let Some((slot, start)) = self.pick_dma(which) else {
                    return;
                };
                let d = &self.space(slot).dmas[&start];
                let va = start + (u64::from(page) % d.pages()) * PAGE_SIZE;
                let off = u64::from(offset) % PAGE_SIZE;
                let len = 1 + u64::from(len) % (PAGE_SIZE - off);
                self.write(ctx, usize::from(dev) % NDEV, va + off, len as usize, seed);
            }
            Op::SetReservations { dev, on } => {
                let dev = usize::from(dev) % NDEV;
                let id = self.devices[dev];
                let r = self.sys.gm.dev_set_reservations(id, on);
                if !self.alive[dev] {
                    return self.misuse(ctx, r, DeviceError::UnknownDevice(id));
                }
                assert_eq!(r, Ok(()), "{ctx}");
                self.summary.succeeded += 1;
            }
            Op::FaultBatch {
                dev,
                region,
                pages,
                records,
                writes,
                prefetch,
            } => {
                let dev = usize::from(dev) % NDEV;
                self.set_prefetch(ctx, dev, prefetch);
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let r = self.region(slot, start);
                let n = if records == 255 {
                    0
                } else {
                    1 + usize::from(records) % 4
                };
                let recs: Vec<(u64, bool)> = (0..n)
                    .map(|i| {
                        let va = r.start() + u64::from(pages[i]) % r.pages() * PAGE_SIZE;
                        (va + 8 * i as u64, writes & (1 << i) != 0)
                    })
                    .collect();
                self.fault_batch(ctx, dev, &recs);
            }
            Op::Thrashing {
                space,
                config,
                stale,
            } => self.set_thrashing(ctx, space, config, stale),
            Op::ExpirePins { space, stale } => self.expire_pins(ctx, space, stale),
            Op::PingPong {
                a,
                b,
                region,
                page,
                rounds,
                loads,
                faults,
                seed,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let r = self.region(slot, start);
                let va = r.start() + u64::from(page) % r.pages() * PAGE_SIZE;
                let devs = [usize::from(a) % NDEV, usize::from(b) % NDEV];
                self.ping_pong(ctx, devs, va, 2 + rounds % 15, (loads, faults), seed);
            }
            Op::Migrate {
                region,
                dev,
                prefetch,
            } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.migrate(ctx, slot, start, usize::from(dev) % NDEV, prefetch);
            }
            Op::Wire { region } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                self.wire(ctx, slot, start);
            }
            Op::Unwire { region } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let handle = self.region(slot, start).handle;
                assert_eq!(self.sys.gm.region_unwire(handle), Ok(()), "{ctx}");
                self.summary.succeeded += 1;
                self.region_mut(slot, start).wired.clear();
            }
            Op::Synchronize { space } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                let id = self.space(slot).id;
                assert_eq!(self.sys.gm.as_synchronize(id), Ok(()), "{ctx}");
                self.summary.succeeded += 1;
                assert_eq!(self.sys.gm.as_pending(id), Ok(0), "{ctx}: drained");
                self.summary.succeeded += 1;
            }
            Op::Stale { pick, what } => self.stale(ctx, pick, what),
            Op::StaleSpace { pick } => {
                if self.dead_spaces.is_empty() {
                    return;
                }
                let id = self.dead_spaces[usize::from(pick) % self.dead_spaces.len()];
                let r = self.sys.gm.as_destroy(id);
                self.misuse(ctx, r, SpaceError::UnknownSpace(id));
                let r = self
                    .sys
                    .gm
                    .as_alloc(id, gmem_core::AllocRequest::new(PAGE_SIZE));
                self.misuse(ctx, r.map(|_| ()), AllocError::UnknownSpace(id));
                let r = self.sys.gm.as_attach(
                    id,
                    self.devices[HOST],
                    MmuMode::Coherent,
                    Activation::Leave,
                );
                let want = if self.alive[HOST] {
                    AttachError::UnknownSpace(id)
                } else {
                    AttachError::UnknownDevice(self.devices[HOST])
                };
                self.misuse(ctx, r.map(|_| ()), want);
                let r = self.sys.gm.check_invariants(id);
                assert!(r.is_err(), "{ctx}: invariants of a dead space");
            }
            Op::DestroyDevice { dev } => self.destroy_device(ctx, usize::from(dev) % NDEV),
            Op::FailEvery { space, n } => {
                let Some(slot) = self.pick_space(space) else {
                    return;
                };
                let n = n % 4;
                let id = self.space(slot).id;
                assert_eq!(self.sys.gm.as_fail_every(id, u32::from(n)), Ok(()), "{ctx}");
                self.summary.succeeded += 1;
                let sp = self.space_mut(slot);
                sp.fail_every = u64::from(n);
                sp.attempts = 0;
            }
            Op::SetEviction { dev, clock } => {
                let dev = usize::from(dev) % NDEV;
                let id = self.devices[dev];
                let policy = match clock {
                    true => EvictionPolicy::Clock,
                    false => EvictionPolicy::Fifo,
                };
                let r = self.sys.gm.dev_set_eviction_policy(id, policy);
                if !self.alive[dev] {
                    return self.misuse(ctx, r, DeviceError::UnknownDevice(id));
                }
                assert_eq!(r, Ok(()), "{ctx}");
                self.summary.succeeded += 1;
            }
            Op::Extents { dev, order } => self.extents(ctx, usize::from(dev) % NDEV, order),
            Op::Compact { dev, order } => self.compact(ctx, usize::from(dev) % NDEV, order),
            Op::PageGroups { dev, order } => self.page_groups(ctx, usize::from(dev) % NDEV, order),
            Op::GroupClass { dev, frame, class } => {
                self.group_class(ctx, usize::from(dev) % NDEV, frame, class)
            }
            Op::FrameClasses { classes } => {
                let n = u32::from(classes % 4);
                if let Some(m) = &self.sys.devices[DGPU].memory {
                    m.set_frame_classes(Some(n));
                }
            }
            Op::Verify { dev, region } => {
                let Some((slot, start)) = self.pick_region(region) else {
                    return;
                };
                let (a, pages) = {
                    let r = self.region(slot, start);
                    (r.start(), r.pages())
                };
                for p in 0..pages {
                    self.read(
                        ctx,
                        usize::from(dev) % NDEV,
                        a + p * PAGE_SIZE,
                        PAGE_SIZE as usize,
                    );
                }
            }
        }
    }
}
