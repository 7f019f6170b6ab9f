//! Page groups: a device's frames managed in aligned groups of `2^k` frames, each group
//! tagged with a class the driver chooses.
//!
//! CODA places a page either fine-grain interleaved across memory stacks or wholly in
//! one stack, and the two layouts cannot share a group of physical frames (the
//! address-to-stack mapping of the group depends on its layout). So the frames of such
//! a device are cut into **groups** — group `g` is the frames whose number shifted
//! right by `k` is `g`, that is an aligned block of `2^k` frames, less where a
//! registered range ends inside it — and every group carries a **class** (a `u32`
//! whose meaning is the driver's; every group starts in class 0).
//!
//! ## Rules
//! - Every frame request names a class ([`crate::DeviceMemory::frame_class`], asked
//!   before every allocation in the device's memory); the frames it gets lie in groups
//!   of that class only. A group whose frames are all free may change class to serve a
//!   request (or by `Gmem::dev_set_group_class`); a group with any frame in use or
//!   awaiting invalidation never does.
//! - The driver is told of a class change ([`crate::DeviceMemory::group_class_changed`])
//!   before any frame of the group is handed out, so before any is zeroed, copied or
//!   mapped. The call comes with the device's frame lock held: it must not call back
//!   into the core.
//! - `PhysMem::check` (so `check_invariants`) verifies that every group is uniform:
//!   each frame in use or pending was allocated for its group's class, and the group's
//!   free count and the allocator's indices agree with the frame states.
//!
//! ## Allocation
//! A request of `n ≤ 2^k` frames tries, in order: groups of its class with free frames
//! (but not all free), wholly free groups already of its class, then wholly free
//! groups of another class (converted). A request longer than a group looks for a
//! window of consecutive groups, each of the class or wholly free. Inside a candidate
//! the arena's constrained allocation (`min`/`max` set to the candidate's frames) finds
//! the run, so the driver's own constraint still applies. When nothing fits the
//! request fails as any full memory does (the fault path then evicts and retries).
//! Indices: the groups of each class with some (not all) frames free, and the wholly
//! free groups (all of them, and by class), are kept in ordered sets, and candidates
//! are taken one at a time, so a request that its first candidate serves costs a few
//! ordered-set lookups, not a pass over every group.

use super::{FrameState, PhysMem, RunRequest};
use crate::addr::{Pfn, PhysAddr, Vpn, PAGE_SHIFT};
use crate::handle::SpaceId;
use crate::mmu::DeviceMemory;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;
use core::ops::Bound::{Excluded, Unbounded};

/// The largest group order (`2^18` frames = 1 GiB).
pub const MAX_GROUP_ORDER: u32 = 18;

#[derive(Clone, Copy, Debug)]
struct Group {
    class: u32,
    frames: u64,
    free: u64,
}

/// Where a group sits in the allocation indices.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    Avail(u32),
    Empty(u32),
    Full,
}

impl Group {
    fn slot(&self) -> Slot {
        if self.free == self.frames {
            Slot::Empty(self.class)
        } else if self.free > 0 {
            Slot::Avail(self.class)
        } else {
            Slot::Full
        }
    }
}

/// Which kind of candidate [`PhysMem::next_group`] is passing over.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pass {
    /// Groups of the request's class with some frames free.
    Avail,
    /// Wholly free groups of the request's class.
    EmptySame,
    /// Wholly free groups of another class.
    EmptyOther,
}

/// The page groups of one device's memory.
pub(crate) struct Groups {
    order: u32,
    groups: BTreeMap<u64, Group>,
    /// Per class, the groups with some but not all frames free.
    avail: BTreeMap<u32, BTreeSet<u64>>,
    /// Groups whose frames are all free, whatever their class.
    empty: BTreeSet<u64>,
    /// The same groups by class, so a request finds a free group of its own class
    /// without passing over the others.
    empty_of: BTreeMap<u32, BTreeSet<u64>>,
    /// The class each frame (by frame index) was last allocated for.
    frame_class: Vec<u32>,
    /// Class changes so far.
    changes: u64,
}

/// Statistics of a device's page groups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// Frames per group: `2^order`.
    pub order: u32,
    /// Groups (a group cut by the end of a registered range counts once).
    pub groups: u64,
    /// Per class in use by some group: `(class, groups, free frames in them)`, by class.
    pub by_class: Vec<(u32, u64, u64)>,
    /// Groups whose frames are all free.
    pub empty: u64,
    /// Class changes since the groups were set up.
    pub class_changes: u64,
}

impl Groups {
    fn index_remove(&mut self, g: u64, slot: Slot) {
        match slot {
            Slot::Avail(c) => {
                if let Some(s) = self.avail.get_mut(&c) {
                    s.remove(&g);
                    if s.is_empty() {
                        self.avail.remove(&c);
                    }
                }
            }
            Slot::Empty(c) => {
                self.empty.remove(&g);
                if let Some(s) = self.empty_of.get_mut(&c) {
                    s.remove(&g);
                    if s.is_empty() {
                        self.empty_of.remove(&c);
                    }
                }
            }
            Slot::Full => {}
        }
    }

    fn index_insert(&mut self, g: u64, slot: Slot) {
        match slot {
            Slot::Avail(c) => {
                self.avail.entry(c).or_default().insert(g);
            }
            Slot::Empty(c) => {
                self.empty.insert(g);
                self.empty_of.entry(c).or_default().insert(g);
            }
            Slot::Full => {}
        }
    }

    /// Change group `g` with `f`, keeping the indices in step.
    fn edit(&mut self, g: u64, f: impl FnOnce(&mut Group)) {
        let Some(grp) = self.groups.get_mut(&g) else {
            return;
        };
        let before = grp.slot();
        f(grp);
        let after = grp.slot();
        if before != after {
            self.index_remove(g, before);
            self.index_insert(g, after);
        }
    }

    /// Frames `[base_pfn, base_pfn + pages)` (frame indices from `first`) were
    /// registered, all free.
    pub fn add_range(&mut self, first: u32, base_pfn: u64, pages: u64) {
        self.frame_class.resize(first as usize + pages as usize, 0);
        let mut pfn = base_pfn;
        let end = base_pfn + pages;
        while pfn < end {
            let g = pfn >> self.order;
            let next = ((g + 1) << self.order).min(end);
            let n = next - pfn;
            let before = self.groups.get(&g).map(Group::slot);
            let grp = self.groups.entry(g).or_insert(Group {
                class: 0,
                frames: 0,
                free: 0,
            });
            grp.frames += n;
            grp.free += n;
            let after = grp.slot();
            if let Some(b) = before {
                self.index_remove(g, b);
            }
            self.index_insert(g, after);
            pfn = next;
        }
    }

    /// Frame `pfn` went from `old` to `new`.
    pub fn on_state(&mut self, pfn: u64, old: FrameState, new: FrameState) {
        let g = pfn >> self.order;
        match (old == FrameState::Free, new == FrameState::Free) {
            (true, false) => self.edit(g, |x| x.free -= 1),
            (false, true) => self.edit(g, |x| x.free += 1),
            _ => {}
        }
    }

    fn group_range(&self, g: u64) -> (u64, u64) {
        (g << self.order, (g + 1) << self.order)
    }
}

impl PhysMem {
    /// Manage the frames in groups of `2^order` (`Some`), or stop (`None`). Every
    /// frame must be free (the caller checked [`PhysMem::counts`]).
    pub(crate) fn set_groups(&mut self, order: Option<u32>) {
        self.groups = order.map(|order| {
            let mut g = Groups {
                order,
                groups: BTreeMap::new(),
                avail: BTreeMap::new(),
                empty: BTreeSet::new(),
                empty_of: BTreeMap::new(),
                frame_class: Vec::new(),
                changes: 0,
            };
            for r in &self.ranges {
                g.add_range(r.first, r.base_pfn, r.pages);
            }
            g
        });
    }

    /// The group order, if the memory is managed in groups.
    pub(crate) fn group_order(&self) -> Option<u32> {
        self.groups.as_ref().map(|g| g.order)
    }

    /// The class of the group holding `pfn` (`None` without groups or for a frame that
    /// is not registered).
    pub(crate) fn group_class(&self, pfn: Pfn) -> Option<u32> {
        let g = self.groups.as_ref()?;
        self.index(pfn.0)?;
        g.groups.get(&(pfn.0 >> g.order)).map(|x| x.class)
    }

    /// Statistics of the groups, if any.
    pub(crate) fn group_stats(&self) -> Option<GroupStats> {
        let g = self.groups.as_ref()?;
        let mut by: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for grp in g.groups.values() {
            let e = by.entry(grp.class).or_default();
            e.0 += 1;
            e.1 += grp.free;
        }
        Some(GroupStats {
            order: g.order,
            groups: g.groups.len() as u64,
            by_class: by.into_iter().map(|(c, (n, f))| (c, n, f)).collect(),
            empty: g.empty.len() as u64,
            class_changes: g.changes,
        })
    }

    /// Give the group holding `pfn` class `class`, telling `mem`. Returns the frames of
    /// the group in use or pending (the change is made only when that is 0), or `None`
    /// when there are no groups or `pfn` is not registered.
    pub(crate) fn set_group_class(
        &mut self,
        pfn: Pfn,
        class: u32,
        mem: Option<&dyn DeviceMemory>,
    ) -> Option<u64> {
        self.index(pfn.0)?;
        let groups = self.groups.as_mut()?;
        let g = pfn.0 >> groups.order;
        let grp = *groups.groups.get(&g)?;
        let used = grp.frames - grp.free;
        if used == 0 {
            self.change_class(g, class, mem);
        }
        Some(used)
    }

    /// Group `g` (all free) becomes class `class`; the driver hears of it first.
    fn change_class(&mut self, g: u64, class: u32, mem: Option<&dyn DeviceMemory>) {
        let Some(groups) = self.groups.as_mut() else {
            return;
        };
        let Some(grp) = groups.groups.get(&g).copied() else {
            return;
        };
        if grp.class == class {
            return;
        }
        debug_assert_eq!(
            grp.free, grp.frames,
            "only a wholly free group changes class"
        );
        if grp.free != grp.frames {
            return;
        }
        let (lo, hi) = groups.group_range(g);
        // The registered part of the group: its first frame and length.
        let first = (lo..hi).find(|&p| self.index(p).is_some()).unwrap_or(lo);
        if let Some(m) = mem {
            m.group_class_changed(
                PhysAddr::new(first << PAGE_SHIFT),
                grp.frames,
                grp.class,
                class,
            );
        }
        let groups = self.groups.as_mut().expect("checked above");
        groups.edit(g, |x| x.class = class);
        groups.changes += 1;
    }

    /// The next candidate group for a request of at most one group of `class`, after
    /// `at` (the group last tried, `None` to start): groups of the class with free
    /// frames (but not all free), then wholly free groups of the class, then wholly
    /// free groups of another class (which a successful request converts), each in
    /// group order. Each step is one ordered-set lookup, so a request that the first
    /// candidate serves costs `O(log groups)`, not a pass over every group.
    fn next_group(&self, class: u32, at: Option<(Pass, u64)>) -> Option<(Pass, u64)> {
        let g = self.groups.as_ref()?;
        let (mut pass, mut after) = match at {
            Some((p, x)) => (p, Some(x)),
            None => (Pass::Avail, None),
        };
        loop {
            let lower = after.map_or(Unbounded, Excluded);
            let found = match pass {
                Pass::Avail => g
                    .avail
                    .get(&class)
                    .and_then(|s| s.range((lower, Unbounded)).next().copied()),
                Pass::EmptySame => g
                    .empty_of
                    .get(&class)
                    .and_then(|s| s.range((lower, Unbounded)).next().copied()),
                // The lowest next group over the other classes' sets: one lookup per
                // class (a handful), never a walk past this class's free groups.
                Pass::EmptyOther => g
                    .empty_of
                    .iter()
                    .filter(|&(&c, _)| c != class)
                    .filter_map(|(_, s)| s.range((lower, Unbounded)).next().copied())
                    .min(),
            };
            if let Some(x) = found {
                return Some((pass, x));
            }
            pass = match pass {
                Pass::Avail => Pass::EmptySame,
                Pass::EmptySame => Pass::EmptyOther,
                Pass::EmptyOther => return None,
            };
            after = None;
        }
    }

    /// Candidate windows `[lo, hi)` for a request of `pages` frames of `class` longer
    /// than one group: runs of consecutive groups, each of the class or wholly free.
    fn multi_group_windows(&self, pages: u64, class: u32) -> Vec<(u64, u64)> {
        let Some(g) = self.groups.as_ref() else {
            return Vec::new();
        };
        let m = pages.div_ceil(1u64 << g.order);
        let ok = |x: u64| {
            g.groups
                .get(&x)
                .is_some_and(|grp| grp.class == class || grp.free == grp.frames)
        };
        g.groups
            .keys()
            .filter(|&&start| (0..m).all(|i| ok(start + i)))
            .map(|&start| (start << g.order, (start + m) << g.order))
            .collect()
    }

    /// [`PhysMem::alloc_run`] for a memory managed in groups: the frames of `req` come
    /// from groups of its class (wholly free groups of another class are converted, `mem`
    /// told first).
    pub(crate) fn alloc_grouped(
        &mut self,
        req: &RunRequest,
        wired: bool,
        mem: Option<&dyn DeviceMemory>,
    ) -> Option<Pfn> {
        let RunRequest {
            pages,
            align: align_pages,
            space,
            vpn,
            limit,
            class,
        } = *req;
        if self.retired {
            return None;
        }
        let order = self.group_order()?;
        let mut found = None;
        if pages <= 1 << order {
            // Lazily, best candidate first: the first usually serves the request.
            let mut at = None;
            while let Some((pass, x)) = self.next_group(class, at) {
                at = Some((pass, x));
                let (lo, hi) = (x << order, (x + 1) << order);
                if let Some(pa) = self.constrained_alloc(pages, align_pages, limit, lo, hi) {
                    found = Some((pa, lo, hi));
                    break;
                }
            }
        } else {
            for (lo, hi) in self.multi_group_windows(pages, class) {
                if let Some(pa) = self.constrained_alloc(pages, align_pages, limit, lo, hi) {
                    found = Some((pa, lo, hi));
                    break;
                }
            }
        }
        let (pa, lo, hi) = found?;
        let pfn = pa >> PAGE_SHIFT;
        debug_assert!(
            pfn >= lo && pfn + pages <= hi,
            "run {pfn:#x}+{pages} outside window [{lo:#x}, {hi:#x})"
        );
        self.claim_groups(pfn, pages, class, mem);
        Some(self.take_run(pa, pages, space, vpn, wired))
    }

    /// The frames `[pfn, pfn + pages)` were just taken from the arena for `class`:
    /// convert their groups (wholly free until now) and record the class per frame.
    /// Called before the frames change state.
    fn claim_groups(&mut self, pfn: u64, pages: u64, class: u32, mem: Option<&dyn DeviceMemory>) {
        let Some(order) = self.group_order() else {
            return;
        };
        let (g0, g1) = (pfn >> order, (pfn + pages - 1) >> order);
        for g in g0..=g1 {
            self.change_class(g, class, mem);
        }
        for k in 0..pages {
            if let Some(i) = self.index(pfn + k) {
                if let Some(groups) = self.groups.as_mut() {
                    groups.frame_class[i as usize] = class;
                }
            }
        }
    }

    /// One run of `pages` frames inside the frames `[lo, hi)` (a compaction
    /// destination), from groups of `class` when the memory has groups (no group
    /// changes class here). Owners as [`PhysMem::alloc_run`]'s.
    pub(crate) fn alloc_within(
        &mut self,
        lo: u64,
        hi: u64,
        pages: u64,
        class: Option<u32>,
        space: SpaceId,
        vpn: Vpn,
    ) -> Option<Pfn> {
        if self.retired {
            return None;
        }
        let windows: Vec<(u64, u64)> = match (&self.groups, class) {
            (Some(g), Some(c)) => {
                let mut w = Vec::new();
                let mut x = lo >> g.order;
                while x << g.order < hi {
                    if g.groups.get(&x).is_some_and(|grp| grp.class == c) {
                        let (a, b) = g.group_range(x);
                        w.push((a.max(lo), b.min(hi)));
                    }
                    x += 1;
                }
                w
            }
            _ => alloc::vec![(lo, hi)],
        };
        for (a, b) in windows {
            if let Some(pa) = self.constrained_alloc(pages, 1, None, a, b) {
                let pfn = pa >> PAGE_SHIFT;
                if let (Some(c), Some(groups)) = (class, self.groups.as_mut()) {
                    for k in 0..pages {
                        let i = self.ranges.partition_point(|r| r.base_pfn <= pfn + k);
                        if let Some(r) = self.ranges.get(i.wrapping_sub(1)) {
                            groups.frame_class
                                [(r.first as u64 + (pfn + k - r.base_pfn)) as usize] = c;
                        }
                    }
                }
                return Some(self.take_run(pa, pages, space, vpn, false));
            }
        }
        None
    }

    /// The class frame `pfn` was allocated for (`None` without groups).
    pub(crate) fn frame_class(&self, pfn: Pfn) -> Option<u32> {
        let g = self.groups.as_ref()?;
        let i = self.index(pfn.0)?;
        g.frame_class.get(i as usize).copied()
    }

    /// The group invariants (see the module documentation).
    pub(crate) fn check_groups(&self) -> Result<(), &'static str> {
        let Some(g) = self.groups.as_ref() else {
            return Ok(());
        };
        let mut seen: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for r in &self.ranges {
            for k in 0..r.pages {
                let pfn = r.base_pfn + k;
                let i = (r.first as u64 + k) as usize;
                let grp = g
                    .groups
                    .get(&(pfn >> g.order))
                    .ok_or("a registered frame belongs to no page group")?;
                let e = seen.entry(pfn >> g.order).or_default();
                e.0 += 1;
                if self.frames[i].state == FrameState::Free {
                    e.1 += 1;
                } else if g.frame_class[i] != grp.class {
                    return Err("a page group holds a frame of another class");
                }
            }
        }
        if seen.len() != g.groups.len() {
            return Err("a page group holds no registered frame");
        }
        for (x, grp) in &g.groups {
            if seen.get(x) != Some(&(grp.frames, grp.free)) {
                return Err("a page group's frame counts disagree with the frame states");
            }
            let indexed = match grp.slot() {
                Slot::Avail(c) => g.avail.get(&c).is_some_and(|s| s.contains(x)),
                Slot::Empty(c) => {
                    g.empty.contains(x) && g.empty_of.get(&c).is_some_and(|s| s.contains(x))
                }
                Slot::Full => true,
            };
            if !indexed {
                return Err("a page group is missing from its allocation index");
            }
        }
        let indexed = g.empty.len() + g.avail.values().map(BTreeSet::len).sum::<usize>();
        let want = g.groups.values().filter(|x| x.slot() != Slot::Full).count();
        let by_class = g.empty_of.values().map(BTreeSet::len).sum::<usize>();
        if indexed != want || by_class != g.empty.len() {
            return Err("a page group is indexed twice or wrongly");
        }
        Ok(())
    }
}
