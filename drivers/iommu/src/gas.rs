//! The baseline's IOVA allocator: FreeBSD's guest address space (GAS), a balanced search
//! tree of map entries augmented with the largest free gap below each node.
//!
//! ## What it models (FreeBSD `sys/dev/iommu/iommu_gas.c`)
//! - **Entries in a balanced tree keyed by their end** (`iommu_gas_cmp_entries`
//!   compares `end`; `RB_GENERATE(iommu_gas_entries_tree, ...)`). FreeBSD's tree is a
//!   red-black tree; this one is a treap (a binary search tree that is also a heap on
//!   random priorities: expected depth O(log n), the same order as the red-black
//!   tree's worst case, with simpler deletion). Written here from the description, not
//!   copied.
//! - **The augmentation** (`iommu_gas_augment_entry`): every node keeps `first` (the
//!   lowest start in its subtree), `last` (the highest end) and `free_down` (the largest
//!   gap between two consecutive entries inside its subtree), recomputed from its
//!   children on every path the tree changes.
//! - **Placeholders at both ends** (`iommu_gas_init_domain`): zero-size entries at the
//!   domain's start and end, so every free gap lies between two entries.
//! - **Address-ordered first fit with guard pages** (`iommu_gas_find_space`,
//!   `iommu_gas_match_one`): an allocation of `size` bytes needs a gap of `size` plus a
//!   free page on each side (so an overrun faults) and takes the lowest such gap,
//!   starting one page after the entry below it. The search descends from the root and
//!   skips every subtree whose `free_down` is too small, so it visits O(depth) nodes;
//!   FreeBSD starts from a cached `start_gap` entry and climbs, which is the same
//!   bound. Alignment is one page and no boundary is set (a NIC's receive buffer tag),
//!   so `match_one`'s rounding never moves the start.
//! - **Entries from a zone** (`iommu_gas_alloc_entry` → `uma_zalloc` of
//!   `iommu_map_entry_zone`): nodes live in one vector and freed ones go to a free
//!   list, so a warmed allocator allocates no memory per entry (UMA's per-CPU caches
//!   give FreeBSD the same).
//!
//! The tree is not locked here: [`crate::baseline::GiantLockDomain`] holds it under
//! its domain lock, as `IOMMU_DOMAIN_LOCK` covers `iommu_gas_find_space` and
//! `iommu_gas_free_space`.

use gmem_core::PAGE_SIZE;
use std::fmt;

const NIL: u32 = u32::MAX;

/// Why the GAS refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IovaError {
    /// No free gap holds this many pages plus a guard page on each side (or zero
    /// pages were asked for).
    NoSpace {
        /// Pages asked for.
        pages: u64,
    },
    /// The entry is not allocated (freed already, or never handed out).
    NotAllocated {
        /// The entry given.
        entry: GasEntry,
    },
    /// The range is empty, not page aligned, or too small for one page between two
    /// guard pages.
    BadRange {
        /// First address.
        start: u64,
        /// One past the last.
        end: u64,
    },
}

impl fmt::Display for IovaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IOVA allocator: {self:?}")
    }
}

/// An allocated map entry: a handle its owner frees with (FreeBSD keeps the entry
/// pointer in the busdma map). A stale handle is refused, never frees another entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GasEntry {
    index: u32,
    generation: u32,
}

/// Counters of a [`Gas`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GasStats {
    /// Successful allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Allocations that found no gap.
    pub failed: u64,
    /// Tree nodes visited by allocation searches.
    pub nodes_visited: u64,
    /// Entries the zone holds (live, free and the two placeholders).
    pub zone_entries: u64,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    start: u64,
    end: u64,
    first: u64,
    last: u64,
    free_down: u64,
    left: u32,
    right: u32,
    priority: u32,
    generation: u32,
    live: bool,
}

/// A guest address space over `[start, end)`: the tree, its zone, its counters.
#[derive(Clone, Debug)]
pub struct Gas {
    start: u64,
    end: u64,
    nodes: Vec<Node>,
    free: Vec<u32>,
    root: u32,
    seed: u32,
    live: usize,
    stats: GasStats,
}

impl Gas {
    /// A GAS over `[start, end)` (page aligned, room for one page between guards).
    ///
    /// # Errors
    /// [`IovaError::BadRange`] when `start`/`end` are not page aligned or the range
    /// holds fewer than three pages.
    pub fn new(start: u64, end: u64) -> Result<Gas, IovaError> {
        if start % PAGE_SIZE != 0
            || end % PAGE_SIZE != 0
            || end <= start
            || end - start < 3 * PAGE_SIZE
        {
            return Err(IovaError::BadRange { start, end });
        }
        let mut g = Gas {
            start,
            end,
            nodes: Vec::new(),
            free: Vec::new(),
            root: NIL,
            seed: 0x9e37_79b9,
            live: 0,
            stats: GasStats::default(),
        };
        // The placeholders (never freed).
        for a in [start, end] {
            let n = g.new_node(a, a);
            g.root = g.insert(g.root, n);
        }
        Ok(g)
    }

    /// Live allocations (placeholders not counted).
    pub fn live(&self) -> usize {
        self.live
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> GasStats {
        GasStats {
            zone_entries: self.nodes.len() as u64,
            ..self.stats
        }
    }

    /// The range `[start, end)` of a live entry.
    pub fn range(&self, e: GasEntry) -> Option<(u64, u64)> {
        let n = self.nodes.get(e.index as usize)?;
        (n.live && n.generation == e.generation).then_some((n.start, n.end))
    }

    /// Allocate `pages` pages at the lowest address with a free guard page on each
    /// side; returns the entry and its first address.
    ///
    /// # Errors
    /// [`IovaError::NoSpace`] when `pages` is zero or no gap fits (counted in
    /// [`GasStats::failed`]); nothing is allocated then.
    pub fn alloc(&mut self, pages: u64) -> Result<(GasEntry, u64), IovaError> {
        let no = IovaError::NoSpace { pages };
        let size = pages
            .checked_mul(PAGE_SIZE)
            .filter(|s| *s > 0 && *s <= self.end - self.start)
            .ok_or(no)?;
        let need = size.saturating_add(2 * PAGE_SIZE);
        let mut visited = 0;
        let found = self.find(self.root, need, &mut visited);
        self.stats.nodes_visited += visited;
        let Some(start) = found else {
            self.stats.failed += 1;
            return Err(no);
        };
        let n = self.new_node(start, start + size);
        self.root = self.insert(self.root, n);
        self.live += 1;
        self.stats.allocs += 1;
        Ok((
            GasEntry {
                index: n,
                generation: self.nodes[n as usize].generation,
            },
            start,
        ))
    }

    /// Free entry `e` (its range becomes free, its node goes back to the zone);
    /// returns its size in pages.
    ///
    /// # Errors
    /// [`IovaError::NotAllocated`] when `e` is not live (a double free or a stale
    /// handle); nothing changes.
    pub fn free(&mut self, e: GasEntry) -> Result<u64, IovaError> {
        let (start, end) = self.range(e).ok_or(IovaError::NotAllocated { entry: e })?;
        self.root = self.remove(self.root, end);
        let n = &mut self.nodes[e.index as usize];
        n.live = false;
        n.generation = n.generation.wrapping_add(1);
        self.free.push(e.index);
        self.live -= 1;
        self.stats.frees += 1;
        Ok((end - start) / PAGE_SIZE)
    }

    /// Check the tree against its definition: in-order entries sorted and disjoint,
    /// the heap order of priorities, and every node's `first`/`last`/`free_down`
    /// recomputed from scratch (FreeBSD's `iommu_gas_check_free`). Returns the live
    /// entries in address order.
    ///
    /// # Errors
    /// A description of the first violation.
    pub fn check(&self) -> Result<Vec<(u64, u64)>, String> {
        let mut out = Vec::new();
        self.check_node(self.root, u32::MAX, &mut out)?;
        if out.first() != Some(&(self.start, self.start))
            || out.last() != Some(&(self.end, self.end))
        {
            return Err("the placeholders are missing".into());
        }
        for w in out.windows(2) {
            if w[0].1 > w[1].0 {
                return Err(format!("entries {:x?} and {:x?} overlap", w[0], w[1]));
            }
        }
        if out.len() != self.live + 2 {
            return Err(format!(
                "{} entries in the tree, {} live",
                out.len(),
                self.live
            ));
        }
        Ok(out[1..out.len() - 1].to_vec())
    }

    fn check_node(
        &self,
        n: u32,
        parent_priority: u32,
        out: &mut Vec<(u64, u64)>,
    ) -> Result<(), String> {
        if n == NIL {
            return Ok(());
        }
        let nd = self.nodes[n as usize];
        if !nd.live || nd.priority > parent_priority {
            return Err(format!("node {n}: dead or above its parent's priority"));
        }
        self.check_node(nd.left, nd.priority, out)?;
        out.push((nd.start, nd.end));
        self.check_node(nd.right, nd.priority, out)?;
        let (first, last, free_down) = self.augmentation(&nd);
        if (first, last, free_down) != (nd.first, nd.last, nd.free_down) {
            return Err(format!(
                "node {n} [{:#x}, {:#x}): augmentation {:#x?} should be {:#x?}",
                nd.start,
                nd.end,
                (nd.first, nd.last, nd.free_down),
                (first, last, free_down)
            ));
        }
        Ok(())
    }

    fn new_node(&mut self, start: u64, end: u64) -> u32 {
        // xorshift32: the treap's priorities (any fixed sequence works; deterministic
        // layouts make runs repeatable).
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 17;
        self.seed ^= self.seed << 5;
        let node = |generation| Node {
            start,
            end,
            first: start,
            last: end,
            free_down: 0,
            left: NIL,
            right: NIL,
            priority: self.seed,
            generation,
            live: true,
        };
        match self.free.pop() {
            Some(i) => {
                let g = self.nodes[i as usize].generation;
                self.nodes[i as usize] = node(g);
                i
            }
            None => {
                self.nodes.push(node(0));
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// `(first, last, free_down)` of `nd` from its children's (`iommu_gas_augment_entry`).
    fn augmentation(&self, nd: &Node) -> (u64, u64, u64) {
        let (mut first, mut last, mut free_down) = (nd.start, nd.end, 0);
        if nd.left != NIL {
            let l = &self.nodes[nd.left as usize];
            first = l.first;
            free_down = l.free_down.max(nd.start - l.last);
        }
        if nd.right != NIL {
            let r = &self.nodes[nd.right as usize];
            last = r.last;
            free_down = free_down.max(r.free_down).max(r.first - nd.end);
        }
        (first, last, free_down)
    }

    fn update(&mut self, n: u32) {
        let (first, last, free_down) = self.augmentation(&self.nodes[n as usize]);
        let nd = &mut self.nodes[n as usize];
        nd.first = first;
        nd.last = last;
        nd.free_down = free_down;
    }

    /// The lowest start of a gap of `need` bytes (guards included) inside subtree `n`.
    fn find(&self, n: u32, need: u64, visited: &mut u64) -> Option<u64> {
        if n == NIL {
            return None;
        }
        *visited += 1;
        let nd = &self.nodes[n as usize];
        if nd.free_down < need {
            return None;
        }
        // A left subtree whose largest gap fits always holds the answer: no
        // backtracking, one root-to-leaf path.
        if let Some(a) = self.find(nd.left, need, visited) {
            return Some(a);
        }
        if nd.left != NIL {
            let l = &self.nodes[nd.left as usize];
            if nd.start - l.last >= need {
                return Some(l.last + PAGE_SIZE);
            }
        }
        if nd.right != NIL {
            let r = &self.nodes[nd.right as usize];
            if r.first - nd.end >= need {
                return Some(nd.end + PAGE_SIZE);
            }
        }
        self.find(nd.right, need, visited)
    }

    fn rotate_right(&mut self, n: u32) -> u32 {
        let l = self.nodes[n as usize].left;
        self.nodes[n as usize].left = self.nodes[l as usize].right;
        self.nodes[l as usize].right = n;
        self.update(n);
        self.update(l);
        l
    }

    fn rotate_left(&mut self, n: u32) -> u32 {
        let r = self.nodes[n as usize].right;
        self.nodes[n as usize].right = self.nodes[r as usize].left;
        self.nodes[r as usize].left = n;
        self.update(n);
        self.update(r);
        r
    }

    fn insert(&mut self, t: u32, n: u32) -> u32 {
        if t == NIL {
            return n;
        }
        let key = self.nodes[n as usize].end;
        let mut t = t;
        if key < self.nodes[t as usize].end {
            let l = self.insert(self.nodes[t as usize].left, n);
            self.nodes[t as usize].left = l;
            if self.nodes[l as usize].priority > self.nodes[t as usize].priority {
                t = self.rotate_right(t);
            } else {
                self.update(t);
            }
        } else {
            let r = self.insert(self.nodes[t as usize].right, n);
            self.nodes[t as usize].right = r;
            if self.nodes[r as usize].priority > self.nodes[t as usize].priority {
                t = self.rotate_left(t);
            } else {
                self.update(t);
            }
        }
        t
    }

    /// Remove the entry ending at `key` from subtree `t` (it is there).
    fn remove(&mut self, t: u32, key: u64) -> u32 {
        if t == NIL {
            return NIL;
        }
        let nd = self.nodes[t as usize];
        if key < nd.end {
            let l = self.remove(nd.left, key);
            self.nodes[t as usize].left = l;
        } else if key > nd.end {
            let r = self.remove(nd.right, key);
            self.nodes[t as usize].right = r;
        } else {
            // Rotate the node down below its higher-priority child until it is a leaf
            // on one side, then splice it out.
            if nd.left == NIL {
                return nd.right;
            }
            if nd.right == NIL {
                return nd.left;
            }
            let up =
                if self.nodes[nd.left as usize].priority > self.nodes[nd.right as usize].priority {
                    self.rotate_right(t)
                } else {
                    self.rotate_left(t)
                };
            return self.remove(up, key);
        }
        self.update(t);
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = PAGE_SIZE;

    /// The reference: a sorted list of entries, first fit by a linear scan of the gaps.
    fn model_alloc(model: &[(u64, u64)], lo: u64, hi: u64, pages: u64) -> Option<u64> {
        let need = pages * P + 2 * P;
        let mut prev = lo;
        for &(s, e) in model.iter().chain(std::iter::once(&(hi, hi))) {
            if s - prev >= need {
                return Some(prev + P);
            }
            prev = e;
        }
        None
    }

    #[test]
    fn first_fit_with_guard_pages_reuses_the_lowest_gap_and_refuses_bad_frees() {
        let mut g = Gas::new(0, 16 * P).unwrap();
        let (a, va) = g.alloc(2).unwrap();
        let (b, vb) = g.alloc(2).unwrap();
        assert_eq!((va, vb), (P, 4 * P), "a guard page after each entry");
        g.free(a).unwrap();
        assert_eq!(g.free(a), Err(IovaError::NotAllocated { entry: a }));
        let (_, vc) = g.alloc(1).unwrap();
        assert_eq!(vc, P, "the freed gap at the bottom first");
        assert_eq!(g.alloc(9), Err(IovaError::NoSpace { pages: 9 }));
        let (_, vd) = g.alloc(8).unwrap();
        assert_eq!(vd, 7 * P, "the last page is the end's guard");
        assert_eq!(g.alloc(0), Err(IovaError::NoSpace { pages: 0 }));
        assert_eq!(g.range(b), Some((4 * P, 6 * P)));
        assert_eq!(g.live(), 3);
        assert_eq!(g.stats().failed, 1);
        g.check().unwrap();
        assert!(Gas::new(P, P).is_err() && Gas::new(0, 2 * P).is_err());
        assert!(Gas::new(1, 16 * P).is_err());
        // A size next to the top of the address space is refused, not overflowed.
        let mut top = Gas::new(0, u64::MAX - (P - 1)).unwrap();
        let pages = (u64::MAX - (P - 1)) / P;
        assert_eq!(top.alloc(pages), Err(IovaError::NoSpace { pages }));
        assert_eq!(top.alloc(pages - 2).unwrap().1, P);
    }

    #[test]
    fn the_tree_matches_a_reference_model_over_random_allocations_and_frees() {
        let (lo, hi) = (1 << 20, (1 << 20) + 2048 * P);
        let mut g = Gas::new(lo, hi).unwrap();
        let mut live: Vec<(GasEntry, u64, u64)> = Vec::new();
        let mut x: u64 = 0x5eed;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut failed = 0;
        for step in 0..20_000 {
            let r = next();
            if live.is_empty() || r % 5 < 3 {
                let pages = 1 + next() % if r % 7 == 0 { 64 } else { 4 };
                let mut model: Vec<(u64, u64)> = live.iter().map(|l| (l.1, l.2)).collect();
                model.sort_unstable();
                let want = model_alloc(&model, lo, hi, pages);
                match (g.alloc(pages), want) {
                    (Ok((e, a)), Some(w)) => {
                        assert_eq!(a, w, "step {step}: {pages} pages");
                        live.push((e, a, a + pages * P));
                    }
                    (Err(IovaError::NoSpace { .. }), None) => failed += 1,
                    (got, w) => panic!("step {step}: got {got:?}, model {w:?}"),
                }
            } else {
                let (e, a, b) = live.swap_remove((next() % live.len() as u64) as usize);
                assert_eq!(g.free(e), Ok((b - a) / P));
                assert!(g.free(e).is_err(), "a double free is refused");
            }
            if step % 97 == 0 {
                let mut model: Vec<(u64, u64)> = live.iter().map(|l| (l.1, l.2)).collect();
                model.sort_unstable();
                assert_eq!(g.check().unwrap(), model, "step {step}");
            }
        }
        assert!(failed > 0, "the run reached a full allocator");
        for (e, ..) in live.drain(..) {
            g.free(e).unwrap();
        }
        assert_eq!(g.check().unwrap(), vec![]);
        let s = g.stats();
        assert_eq!(s.allocs, s.frees);
        // The zone reuses its nodes: it never held more than the peak of live entries.
        assert!(s.zone_entries < 2048, "{s:?}");
    }

    #[test]
    fn a_search_visits_a_path_not_the_tree() {
        let mut g = Gas::new(0, 1 << 32).unwrap();
        let mut es = Vec::new();
        for _ in 0..4096 {
            es.push(g.alloc(1).unwrap().0);
        }
        // Free every other entry: 2048 one-page holes too small for 2 pages.
        for e in es.iter().step_by(2) {
            g.free(*e).unwrap();
        }
        let before = g.stats().nodes_visited;
        g.alloc(2).unwrap();
        let visited = g.stats().nodes_visited - before;
        assert!(visited < 100, "{visited} nodes visited for one search");
    }
}
