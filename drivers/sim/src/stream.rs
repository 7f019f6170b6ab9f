//! A recorded translation stream pre-decoded for replay, and the replay split by level.
//!
//! ## The compact stream
//! [`ReplayStream::new`] decodes a [`TraceLog`] once per recording: each event becomes
//! a 16-byte op (address, answer index, unit, root index, access and the level the
//! walk stops at), the answers are interned in a table of distinct leaves, and each
//! unit gets its own sub-stream (its translations plus every invalidation, in order).
//! A [`TraceEvent`] is several times larger, and every replay used to decode it again.
//!
//! ## Replay split by level
//! The per-unit L1 TLBs are independent of each other, so [`ReplayStream::replay_split`]
//! replays each unit's sub-stream alone through its L1 (whose state then stays in the
//! host's cache), writing one outcome byte per translation at the request's index in
//! the stream; a second pass replays the shared level (L2 TLB, page-walk cache, walks)
//! over the original stream in the original order, reading those outcomes and
//! skipping plain L1 hits (zero bytes, eight at a time).
//!
//! The split pays where requests hit their L1 (BFS R-MAT, 94% L1 hits: 410 → 340
//! instructions per translation against the one-pass replay of before); the L1 lookup
//! itself (probe scan, confirmation, LRU refresh) is the same work in both designs, so a
//! stream that misses its L1 often gains less (ATAX, 66% hits: 494 → 421).
//!
//! Everything an L1 does is decided by its own state and the request (its access and
//! recorded answer), except after an L1 miss: the one-pass replay then fills the L1
//! with what the L2 held (the L2's leaf `X`), or after a walk with the answer `A`. The
//! L1 pass *predicts* an L1 miss fills `A` when `A` permits the access and fills
//! nothing otherwise. The shared pass checks each prediction against the L2 it
//! actually finds:
//! - L2 miss: the walk fills `A` exactly when it permits the access, as predicted;
//! - L2 hit on `X == A`, no walk needed: the L1 holds `A`, as predicted;
//! - L2 hit on a clean `X` for a store, a walk whose `A` permits and has `X`'s page
//!   size: the one-pass replay fills `X` and then overwrites the same slot with `A`;
//!   the L1 ends in the predicted state with one more fill, added to its counter;
//! - anything else (an L2 hit whose leaf forbids the access, `X != A`, a store whose
//!   walk does not permit after an L2 hit) is a fill that crosses levels: the split
//!   replay restores the caches and replays in one pass
//!   ([`ReplayPath::OnePass`] says why).
//!
//! An L1 hit never depends on the L2: its `forget` (a hit that forbids the access) and
//! its walk and refill (a store through a clean entry) reach the L2 in the shared pass,
//! in order. Invalidations and flushes go to every L1 in its pass and to the shared
//! level in the shared pass. A cache organisation with fewer units than the recording
//! (units sharing an L1) replays in one pass. So the split replay's counters and final
//! cache state equal the one-pass replay's ([`crate::replay()`]) in every case.

use crate::format::Leaf;
use crate::hierarchy::{TlbHierarchy, TranslationCaches};
use crate::mmu::{replay_walk_in, translate_in, walk_end, ReplayStats, TraceEvent, TraceLog};
use crate::tlb::Tlb;
use gmem_core::Prot;
use std::collections::HashMap;
use std::fmt;

/// One pre-decoded event (16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Op {
    /// A translation's address; a control event's index in [`ReplayStream::controls`].
    va: u64,
    /// A translation's answer: index in [`ReplayStream::leaves`] plus one (0: none) in
    /// the low 28 bits, the live walk's entry writes in the high 4.
    arg: u32,
    /// The unit asking.
    unit: u16,
    /// Index of the root in [`ReplayStream::roots`].
    root: u8,
    /// Access bits (0-2), the level the walk stops at (3-5), [`CONTROL`] (7).
    bits: u8,
}

/// [`Op::bits`]: the op is a control event.
const CONTROL: u8 = 1 << 7;
const LEAF_BITS: u32 = 28;
const LEAF_MASK: u32 = (1 << LEAF_BITS) - 1;

/// An invalidation or a flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Control {
    /// `invalidate(root, ranges[first..first + count])`.
    Invalidate {
        root: u64,
        first: usize,
        count: usize,
    },
    /// `invalidate_all(root)`.
    InvalidateRoot { root: u64 },
    /// `activate`: every cache flushed.
    Flush,
}

/// Why a [`TraceLog`] does not fit the compact stream (replay it with
/// [`crate::replay()`] instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamError {
    /// More than 256 distinct roots.
    TooManyRoots,
    /// A unit number of 65536 or more.
    TooManyUnits,
    /// More than 2^28 - 1 distinct answers.
    TooManyLeaves,
    /// A walk that wrote back more than 15 entries.
    TooManyWrites,
    /// More than 2^32 - 1 events.
    TooManyEvents,
    /// A table format deeper than 8 levels (or of depth 0).
    TooDeep {
        /// The depth asked for.
        levels: u32,
    },
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::TooManyRoots => write!(f, "more than 256 page-table roots"),
            StreamError::TooManyUnits => write!(f, "a unit number above 65535"),
            StreamError::TooManyLeaves => write!(f, "more than 2^28 - 1 distinct leaves"),
            StreamError::TooManyWrites => write!(f, "a walk wrote more than 15 entries"),
            StreamError::TooManyEvents => write!(f, "more than 2^32 - 1 events"),
            StreamError::TooDeep { levels } => write!(f, "{levels} table levels (1 to 8)"),
        }
    }
}

/// Which replay produced a [`SplitReplay`]'s counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayPath {
    /// The L1 passes and the shared pass.
    Split,
    /// One pass, because the stream cannot be split for these caches.
    OnePass(Unsplit),
}

/// Why a stream was replayed in one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsplit {
    /// The caches have fewer units than the recording: units share an L1.
    SharedL1,
    /// An L1 miss's fill depended on the shared level (see the module documentation);
    /// `at` is the translation's index among the stream's events.
    CrossLevelFill {
        /// Index of the event.
        at: usize,
    },
}

/// The result of [`ReplayStream::replay_split`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitReplay {
    /// The counters (equal to the one-pass replay's).
    pub stats: ReplayStats,
    /// How they were obtained.
    pub path: ReplayPath,
}

/// A recorded translation stream decoded for replay (see the module documentation).
#[derive(Clone, Debug)]
pub struct ReplayStream {
    /// Depth of the table format.
    levels: u32,
    /// Every event in order.
    ops: Vec<Op>,
    /// Each recorded unit's translations and every control event, in order.
    units: Vec<Vec<Op>>,
    /// For each op of `units`, its index in `ops`.
    seqs: Vec<Vec<u32>>,
    /// One outcome byte per op: [`HIT`] for a translation, [`CONTROL_OUT`] for a
    /// control event (the L1 passes overwrite the translations' bytes).
    template: Vec<u8>,
    /// The control events only (for L1s of units that never translated).
    controls_only: Vec<Op>,
    roots: Vec<u64>,
    leaves: Vec<Leaf>,
    controls: Vec<Control>,
    ranges: Vec<(u64, u64)>,
    translations: u64,
}

/// Interning key of a leaf (every field).
type LeafKey = (u64, u8, u8, bool, bool, u64);

fn leaf_key(l: &Leaf) -> LeafKey {
    (
        l.frame.as_u64(),
        l.shift,
        l.prot.bits(),
        l.dirty,
        l.local,
        l.bits,
    )
}

/// The leaf when it permits `access` (what a walk fills).
#[inline(always)]
fn permitting(answer: Option<Leaf>, access: Prot) -> Option<Leaf> {
    answer.filter(|a| a.prot.contains(access))
}

// Outcomes of a translation's L1 step (one byte each).
/// An L1 hit that permits the access: nothing reaches the shared level.
const HIT: u8 = 0;
/// An L1 hit that forbids the access: the entry is forgotten in the L2 too.
const FORGET: u8 = 1;
/// A store through a clean L1 entry, walked; the answer does not permit.
const HIT_WALK: u8 = 2;
/// A store through a clean L1 entry, walked, the answer refilled in L1 and L2.
const HIT_WALK_FILL: u8 = 3;
/// An L1 miss predicted to fill nothing (the answer does not permit).
const MISS_NONE: u8 = 4;
/// An L1 miss predicted to fill the answer.
const MISS_FILL: u8 = 5;
/// Not a translation: a control event.
const CONTROL_OUT: u8 = 6;

impl ReplayStream {
    /// Decode `log`, recorded on a table format of depth `levels` (4 for x86-64).
    ///
    /// # Errors
    /// A [`StreamError`] when the log exceeds the compact encoding (more than 256
    /// roots, a unit number above 65535, 2^28 distinct leaves, a walk writing more than
    /// 15 entries, or a depth outside 1 to 8); replay such a log with
    /// [`crate::replay()`].
    pub fn new(log: &TraceLog, levels: u32) -> Result<ReplayStream, StreamError> {
        if !(1..=8).contains(&levels) {
            return Err(StreamError::TooDeep { levels });
        }
        let top = levels - 1;
        let mut s = ReplayStream {
            levels,
            ops: Vec::with_capacity(log.events.len()),
            units: Vec::new(),
            seqs: Vec::new(),
            template: Vec::new(),
            controls_only: Vec::new(),
            roots: Vec::new(),
            leaves: Vec::new(),
            controls: Vec::new(),
            ranges: log.ranges.clone(),
            translations: 0,
        };
        let mut interned: HashMap<LeafKey, u32> = HashMap::new();
        for e in &log.events {
            let op = match *e {
                TraceEvent::Translate {
                    unit,
                    root,
                    va,
                    access,
                    answer,
                    walked,
                    reads,
                    writes,
                    skipped,
                } => {
                    let unit = u16::try_from(unit).map_err(|_| StreamError::TooManyUnits)?;
                    if writes > 15 {
                        return Err(StreamError::TooManyWrites);
                    }
                    let leaf = match answer {
                        None => 0,
                        Some(l) => {
                            let next = s.leaves.len() as u32 + 1;
                            if next > LEAF_MASK {
                                return Err(StreamError::TooManyLeaves);
                            }
                            *interned.entry(leaf_key(&l)).or_insert_with(|| {
                                s.leaves.push(l);
                                next
                            })
                        }
                    };
                    let end = walk_end(top, answer, walked, reads, skipped).min(7) as u8;
                    s.translations += 1;
                    Op {
                        va,
                        arg: leaf | writes << LEAF_BITS,
                        unit,
                        root: s.root_index(root)?,
                        bits: (access.bits() & 7) | end << 3,
                    }
                }
                TraceEvent::Invalidate { root, first, count } => s.control(Control::Invalidate {
                    root,
                    first: first as usize,
                    count: count as usize,
                }),
                TraceEvent::InvalidateRoot { root } => s.control(Control::InvalidateRoot { root }),
                TraceEvent::Flush => s.control(Control::Flush),
            };
            s.ops.push(op);
        }
        let n = s
            .ops
            .iter()
            .filter(|o| o.bits & CONTROL == 0)
            .map(|o| o.unit as usize + 1)
            .max()
            .unwrap_or(0);
        if u32::try_from(s.ops.len()).is_err() {
            return Err(StreamError::TooManyEvents);
        }
        s.units = vec![Vec::new(); n];
        s.seqs = vec![Vec::new(); n];
        for (at, op) in s.ops.iter().enumerate() {
            if op.bits & CONTROL != 0 {
                s.units.iter_mut().for_each(|u| u.push(*op));
                s.seqs.iter_mut().for_each(|u| u.push(at as u32));
                s.controls_only.push(*op);
                s.template.push(CONTROL_OUT);
            } else {
                s.units[op.unit as usize].push(*op);
                s.seqs[op.unit as usize].push(at as u32);
                s.template.push(HIT);
            }
        }
        Ok(s)
    }

    fn root_index(&mut self, root: u64) -> Result<u8, StreamError> {
        if let Some(i) = self.roots.iter().position(|&r| r == root) {
            return Ok(i as u8);
        }
        if self.roots.len() == 256 {
            return Err(StreamError::TooManyRoots);
        }
        self.roots.push(root);
        Ok((self.roots.len() - 1) as u8)
    }

    fn control(&mut self, c: Control) -> Op {
        self.controls.push(c);
        Op {
            va: (self.controls.len() - 1) as u64,
            arg: 0,
            unit: 0,
            root: 0,
            bits: CONTROL,
        }
    }

    /// Translation requests in the stream.
    pub fn translations(&self) -> u64 {
        self.translations
    }

    /// Units the recording used (the highest unit number plus one).
    pub fn units(&self) -> usize {
        self.units.len()
    }

    #[inline(always)]
    fn answer(&self, op: &Op) -> Option<Leaf> {
        match op.arg & LEAF_MASK {
            0 => None,
            i => Some(self.leaves[i as usize - 1]),
        }
    }

    #[inline(always)]
    fn decode(&self, op: &Op) -> (u64, Prot, Option<Leaf>) {
        (
            self.roots[op.root as usize],
            Prot::from_bits_retain(op.bits & 7),
            self.answer(op),
        )
    }

    fn control_of(&self, op: &Op) -> Control {
        self.controls[op.va as usize]
    }

    /// Replay the stream through `caches` in one pass: the same logic and counters as
    /// [`crate::replay()`] over the log it was decoded from.
    pub fn replay<C: TranslationCaches>(&self, caches: &mut C) -> ReplayStats {
        let top = self.levels - 1;
        let mut walks = 0;
        for op in &self.ops {
            if op.bits & CONTROL != 0 {
                match self.control_of(op) {
                    Control::Invalidate { root, first, count } => {
                        caches.invalidate(root, &self.ranges[first..first + count])
                    }
                    Control::InvalidateRoot { root } => caches.invalidate_root(root),
                    Control::Flush => caches.flush(),
                }
                continue;
            }
            let (root, access, answer) = self.decode(op);
            let (end, writes) = (u32::from(op.bits >> 3 & 7), op.arg >> LEAF_BITS);
            let _ = translate_in(
                caches,
                &mut walks,
                op.unit as usize,
                root,
                op.va,
                access,
                |c| replay_walk_in(c.walk_cache(), root, op.va, top, end, answer, writes),
            );
        }
        ReplayStats {
            caches: caches.stats(),
            translations: walks,
        }
    }

    /// Replay the stream through `caches` split by level (see the module
    /// documentation), falling back to one pass when the stream cannot be split for
    /// these caches. The counters and the final cache state equal
    /// [`ReplayStream::replay`]'s.
    pub fn replay_split(&self, caches: &mut TlbHierarchy) -> SplitReplay {
        if caches.units() < self.units.len() {
            return SplitReplay {
                stats: self.replay(caches),
                path: ReplayPath::OnePass(Unsplit::SharedL1),
            };
        }
        let saved = caches.clone();
        match self.try_split(caches) {
            Ok(stats) => SplitReplay {
                stats,
                path: ReplayPath::Split,
            },
            Err(why) => {
                *caches = saved;
                SplitReplay {
                    stats: self.replay(caches),
                    path: ReplayPath::OnePass(why),
                }
            }
        }
    }

    /// The L1 pass of one unit: its translations and the control events through its
    /// L1, each translation's outcome byte written at its index in the stream
    /// (`seqs[k]` for `ops[k]`).
    fn l1_pass(&self, l1: &mut Tlb<Leaf>, ops: &[Op], seqs: &[u32], out: &mut [u8]) {
        for (k, op) in ops.iter().enumerate() {
            if op.bits & CONTROL != 0 {
                match self.control_of(op) {
                    Control::Invalidate { root, first, count } => {
                        l1.invalidate(root, &self.ranges[first..first + count]);
                    }
                    Control::InvalidateRoot { root } => {
                        l1.flush_asid(root);
                    }
                    Control::Flush => {
                        l1.flush();
                    }
                }
                continue;
            }
            // The answer is read only where it is used (most requests are hits).
            let root = self.roots[op.root as usize];
            let access = Prot::from_bits_retain(op.bits & 7);
            let outcome = match l1.lookup_ref(root, op.va) {
                Some(held) => {
                    let (prot, dirty) = (held.prot, held.dirty);
                    if !prot.contains(access) {
                        l1.remove(root, op.va);
                        FORGET
                    } else if dirty || !access.contains(Prot::WRITE) {
                        HIT
                    } else if let Some(a) = permitting(self.answer(op), access) {
                        l1.insert(root, op.va, a.shift, a);
                        HIT_WALK_FILL
                    } else {
                        HIT_WALK
                    }
                }
                None => match permitting(self.answer(op), access) {
                    Some(a) => {
                        l1.insert_missing(root, op.va, a.shift, a);
                        MISS_FILL
                    }
                    None => MISS_NONE,
                },
            };
            if outcome != HIT {
                out[seqs[k] as usize] = outcome;
            }
        }
    }

    fn try_split(&self, caches: &mut TlbHierarchy) -> Result<ReplayStats, Unsplit> {
        let top = self.levels - 1;
        let (l1s, mut l2, mut pwc, counters) = caches.levels_mut();
        let mut outcomes = self.template.clone();
        for (u, l1) in l1s.iter_mut().enumerate() {
            match (self.units.get(u), self.seqs.get(u)) {
                (Some(ops), Some(seqs)) => self.l1_pass(l1, ops, seqs, &mut outcomes),
                // Only control events: no outcome written.
                _ => self.l1_pass(l1, &self.controls_only, &[], &mut []),
            }
        }
        let mut refills = vec![0u64; self.units.len()];
        let mut walks = 0u64;
        let mut at = 0;
        let n = outcomes.len();
        while at < n {
            // Skip plain L1 hits (zero bytes) eight at a time.
            if at + 8 <= n {
                let mut w = [0u8; 8];
                w.copy_from_slice(&outcomes[at..at + 8]);
                let w = u64::from_le_bytes(w);
                if w == 0 {
                    at += 8;
                    continue;
                }
                at += (w.trailing_zeros() / 8) as usize;
            }
            let outcome = outcomes[at];
            let here = at;
            let op = &self.ops[here];
            at += 1;
            if outcome == HIT {
                continue;
            }
            if outcome == CONTROL_OUT {
                match self.control_of(op) {
                    Control::Invalidate { root, first, count } => {
                        if let Some(l2) = l2.as_deref_mut() {
                            l2.invalidate(root, &self.ranges[first..first + count]);
                        }
                        if let Some(w) = pwc.as_deref_mut() {
                            w.flush_asid(root);
                        }
                    }
                    Control::InvalidateRoot { root } => {
                        if let Some(l2) = l2.as_deref_mut() {
                            l2.flush_asid(root);
                        }
                        if let Some(w) = pwc.as_deref_mut() {
                            w.flush_asid(root);
                        }
                    }
                    Control::Flush => {
                        if let Some(l2) = l2.as_deref_mut() {
                            l2.flush();
                        }
                        if let Some(w) = pwc.as_deref_mut() {
                            w.flush();
                        }
                    }
                }
                continue;
            }
            let u = op.unit as usize;
            let (root, access, answer) = self.decode(op);
            let mut walk = |pwc: Option<&mut Tlb<u64>>| {
                walks += 1;
                let (end, writes) = (u32::from(op.bits >> 3 & 7), op.arg >> LEAF_BITS);
                let w = replay_walk_in(pwc, root, op.va, top, end, answer, writes);
                counters.note(&w);
            };
            match outcome {
                FORGET => {
                    if let Some(l2) = l2.as_deref_mut() {
                        l2.remove(root, op.va);
                    }
                }
                HIT_WALK | HIT_WALK_FILL => {
                    walk(pwc.as_deref_mut());
                    if let (HIT_WALK_FILL, Some(a), Some(l2)) = (outcome, answer, l2.as_deref_mut())
                    {
                        l2.insert(root, op.va, a.shift, a);
                    }
                }
                _ => {
                    let held = match l2.as_deref_mut() {
                        Some(l2) => l2.lookup_ref(root, op.va).copied(),
                        None => None,
                    };
                    match held {
                        None => {
                            walk(pwc.as_deref_mut());
                            if let (MISS_FILL, Some(a), Some(l2)) =
                                (outcome, answer, l2.as_deref_mut())
                            {
                                l2.insert_missing(root, op.va, a.shift, a);
                            }
                        }
                        Some(x) if !x.prot.contains(access) => {
                            return Err(Unsplit::CrossLevelFill { at: here });
                        }
                        Some(x) if x.dirty || !access.contains(Prot::WRITE) => {
                            if outcome != MISS_FILL || answer != Some(x) {
                                return Err(Unsplit::CrossLevelFill { at: here });
                            }
                        }
                        Some(x) => {
                            // A store through a clean L2 entry walks again.
                            walk(pwc.as_deref_mut());
                            match (permitting(answer, access), l2.as_deref_mut()) {
                                (Some(a), Some(l2)) if a.shift == x.shift => {
                                    l2.insert(root, op.va, a.shift, a);
                                    refills[u] += 1;
                                }
                                _ => return Err(Unsplit::CrossLevelFill { at: here }),
                            }
                        }
                    }
                }
            }
        }
        for (l1, n) in l1s.iter_mut().zip(&refills) {
            l1.count_fills(*n);
        }
        Ok(ReplayStats {
            caches: caches.stats(),
            translations: walks,
        })
    }
}

#[cfg(test)]
mod tests;
