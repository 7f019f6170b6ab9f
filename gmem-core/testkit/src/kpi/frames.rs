//! Frames in the KPI runner: stale handles, device destruction, free extents,
//! compaction and page groups.

use super::*;

impl KpiRunner {
    pub(super) fn stale(&mut self, ctx: &str, pick: u16, what: StaleUse) {
        if self.dead_regions.is_empty() {
            return;
        }
        let h = self.dead_regions[usize::from(pick) % self.dead_regions.len()];
        let space_alive = self.slot_of(h.space).is_some();
        let want = if space_alive {
            RegionError::StaleRegion(h)
        } else {
            RegionError::UnknownSpace(h.space)
        };
        let gm = &self.sys.gm;
        let r = match what {
            StaleUse::Dealloc => gm.region_dealloc(h, MapFlags::ASYNC, None),
            StaleUse::Unmap => gm.region_unmap(h, MapFlags::empty(), None),
            StaleUse::Protect => {
                let r = gm.region_protect(h, Prot::READ);
                return self.misuse(ctx, r, ProtectError::Region(want));
            }
            StaleUse::Info => gm.region_info(h).map(|_| ()),
            StaleUse::SetPolicy => {
                let r = gm.region_set_policy(h, Placement::default());
                return self.misuse(ctx, r, PolicyError::Region(want));
            }
            StaleUse::Map => {
                // A wrong frame count too: the handle is checked first.
                let f = vec![PhysAddr::new(self.next_external); 64];
                let r = gm.region_map(h, MapRequest::new(&f, self.devices[HOST]));
                return self.misuse(ctx, r, MapError::Region(want));
            }
            StaleUse::Unwire => gm.region_unwire(h),
            StaleUse::Migrate | StaleUse::Wire => {
                let r = if matches!(what, StaleUse::Migrate) {
                    gm.region_migrate(h, self.devices[HOST], MigrateScope::Prefetch)
                        .map(|_| ())
                } else {
                    gm.region_wire(h).map(|_| ())
                };
                return self.misuse(ctx, r, PopulateError::Region(want));
            }
        };
        self.misuse(ctx, r, want);
    }

    pub(super) fn destroy_device(&mut self, ctx: &str, dev: usize) {
        let id = self.devices[dev];
        let frames = self.sys.gm.dev_frames(id).ok();
        let r = self.sys.gm.dev_destroy(id);
        if dev == HOST {
            return self.misuse(ctx, r, DeviceError::IsHost);
        }
        if !self.alive[dev] {
            return self.misuse(ctx, r, DeviceError::UnknownDevice(id));
        }
        let spaces = self
            .live_slots()
            .into_iter()
            .filter(|&s| self.space(s).attached.contains_key(&dev))
            .count();
        if spaces > 0 {
            return self.misuse(ctx, r, DeviceError::StillAttached { spaces });
        }
        let used = frames.map_or(0, |f| f.active + f.inactive + f.wired + f.pending);
        if used > 0 {
            return self.misuse(ctx, r, DeviceError::MemoryInUse { frames: used });
        }
        assert_eq!(r, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        self.alive[dev] = false;
        // Regions that name the device as their target keep the handle: a fault then
        // places pages in host memory.
    }

    // ----- frames: extents, compaction, page groups ----------------------------------

    /// The misuse a frame call on `dev` gets before its own checks, if any.
    pub(super) fn frame_misuse(&self, dev: usize) -> Option<FrameError> {
        let id = self.devices[dev];
        if !self.alive[dev] {
            Some(FrameError::UnknownDevice(id))
        } else if dev == IGPU || dev == IO {
            Some(FrameError::NoMemory(id))
        } else {
            None
        }
    }

    pub(super) fn extents(&mut self, ctx: &str, dev: usize, order: u8) {
        let id = self.devices[dev];
        let r = self.sys.gm.dev_free_extents(id);
        if let Some(want) = self.frame_misuse(dev) {
            return self.misuse(ctx, r.map(|_| ()), want);
        }
        let e = r.unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
        let f = self.sys.gm.dev_frames(id).expect("live device");
        let sum: u64 = e.blocks.iter().enumerate().map(|(k, n)| n << k).sum();
        assert_eq!(
            (sum, e.free, e.registered),
            (f.free, f.free, f.registered),
            "{ctx}: the histogram adds up to the free frames"
        );
        let order = u32::from(order % 20);
        let i = e.unusable_index(order);
        assert!((0.0..=1.0).contains(&i), "{ctx}: index {i}");
        assert_eq!(
            e.unusable_frames(order) + e.free_in_blocks_from(order),
            e.free,
            "{ctx}"
        );
        self.summary.succeeded += 1;
        self.unchanged(ctx);
    }

    pub(super) fn compact(&mut self, ctx: &str, dev: usize, order: u8) {
        let id = self.devices[dev];
        let order = match order {
            248.. => 19 + u32::from(order % 2),
            _ => u32::from(order % 4),
        };
        let before = self.sys.gm.dev_frames(id).ok();
        let r = self.sys.gm.dev_compact(id, order);
        if let Some(want) = self.frame_misuse(dev) {
            return self.misuse(ctx, r.map(|_| ()), want);
        }
        if order > 18 {
            return self.misuse(ctx, r.map(|_| ()), FrameError::BadOrder { order });
        }
        let rep = r.unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
        let (before, after) = (
            before.expect("live device"),
            self.sys.gm.dev_frames(id).expect("live device"),
        );
        assert_eq!(before.registered, after.registered, "{ctx}");
        // Compaction may drain a queue (a page it meets is awaiting invalidation),
        // which frees frames; it never takes one.
        assert!(after.free >= before.free, "{ctx}: {before:?} -> {after:?}");
        assert!(
            rep.free_blocks_after >= rep.free_blocks_before
                && rep.blocks_made <= rep.blocks_tried
                && rep.copies <= rep.pages_moved
                && (rep.copies > 0) == (rep.pages_moved > 0),
            "{ctx}: {rep:?}"
        );
        if order == 0 {
            assert_eq!(rep.pages_moved, 0, "{ctx}: nothing to gain at order 0");
        }
        self.summary.pages_compacted += rep.pages_moved;
        self.summary.succeeded += 1;
    }

    pub(super) fn page_groups(&mut self, ctx: &str, dev: usize, order: Option<u8>) {
        let id = self.devices[dev];
        let order = order.map(|o| u32::from(o % 21));
        let frames = self.sys.gm.dev_frames(id).ok();
        let r = self.sys.gm.dev_set_page_groups(id, order);
        if let Some(want) = self.frame_misuse(dev) {
            return self.misuse(ctx, r, want);
        }
        if let Some(o) = order.filter(|&o| o > 18) {
            return self.misuse(ctx, r, FrameError::BadOrder { order: o });
        }
        let f = frames.expect("live device");
        if f.free != f.registered {
            let frames = f.registered - f.free;
            return self.misuse(ctx, r, FrameError::FramesInUse { frames });
        }
        assert_eq!(r, Ok(()), "{ctx}");
        let g = self.sys.gm.dev_page_groups(id).expect("live device");
        assert_eq!(g.map(|g| g.order), order, "{ctx}");
        self.summary.succeeded += 1;
    }

    pub(super) fn group_class(&mut self, ctx: &str, dev: usize, frame: u8, class: u8) {
        let id = self.devices[dev];
        let class = u32::from(class % 4);
        let (base, pages) = match dev {
            HOST => (HOST_BASE, 48 + u64::from(self.setup.host_pages % 160)),
            _ => (DGPU_BASE, 2 + u64::from(self.setup.dev_pages % 30)),
        };
        let pa = PhysAddr::new(base + (u64::from(frame) % (pages + 2)) * PAGE_SIZE);
        let grouped = self.alive[dev]
            && self.frame_misuse(dev).is_none()
            && self.sys.gm.dev_page_groups(id) != Ok(None);
        let r = self.sys.gm.dev_set_group_class(id, pa, class);
        if let Some(want) = self.frame_misuse(dev) {
            return self.misuse(ctx, r, want);
        }
        if !grouped {
            return self.misuse(ctx, r, FrameError::NoGroups(id));
        }
        if pa.as_u64() >= base + pages * PAGE_SIZE {
            return self.misuse(ctx, r, FrameError::NotRegistered { pa });
        }
        match r {
            Ok(()) => {
                assert_eq!(
                    self.sys.gm.dev_group_class(id, pa),
                    Ok(Some(class)),
                    "{ctx}"
                );
                self.summary.succeeded += 1;
            }
            Err(FrameError::GroupInUse { frames, .. }) => {
                assert!(frames > 0, "{ctx}");
                self.summary.rejected += 1;
                self.unchanged(ctx);
            }
            Err(e) => panic!("{ctx}: {e:?}"),
        }
    }
}
