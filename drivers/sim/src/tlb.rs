//! A set-associative TLB with a replacement policy as a parameter.
//!
//! ## Model
//! A [`Tlb`] has `sets × ways` entries. An entry caches one translation of one address
//! space tag (`asid`; the drivers use the page-table root) for a naturally aligned page
//! of `1 << shift` bytes: its key is `(asid, va >> shift, shift)` and it lives in set
//! `(va >> shift) % sets`. Entries of different page sizes share the sets; a lookup
//! finds the smallest page holding the address: a fully associative TLB checks every
//! size in one pass over its ways, a set-associative one probes each size it has ever
//! held, smallest first. The value is whatever the
//! owner caches: a leaf translation in a TLB, the address of a next-level table in a
//! page-walk cache (one `shift` per level).
//!
//! When a set is full, the [`Replacement`] policy picks the victim:
//! - **LRU** evicts the entry used longest ago (a hit refreshes it);
//! - **FIFO** evicts the entry filled longest ago (hits do not matter);
//! - **Random** evicts a way drawn from a xorshift generator seeded by the
//!   configuration, so a run is reproducible.
//!
//! Free ways are always used before anything is evicted, lowest way first. Everything is
//! deterministic: the same sequence of calls gives the same hits, misses and victims.
//!
//! ## Invalidation
//! [`Tlb::invalidate`] drops every entry of an asid that overlaps any range of a list
//! (the coalesced batch the core hands a driver), probing sets page by page when the
//! list is small and sweeping the whole array when it is not. [`Tlb::flush_asid`] and
//! [`Tlb::flush`] drop one tag's entries or all.

use std::fmt;

mod scan;

use scan::{Group, BLOCK, EMPTY_GROUP};

/// How a full set picks its victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replacement {
    /// Least recently used.
    Lru,
    /// First in, first out.
    Fifo,
    /// A pseudo-random way, from a generator seeded with `seed`.
    Random {
        /// The seed (0 is replaced by a fixed non-zero constant).
        seed: u64,
    },
}

/// Geometry and policy of a TLB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlbConfig {
    /// Number of sets (1 = fully associative).
    pub sets: usize,
    /// Entries per set.
    pub ways: usize,
    /// Victim selection.
    pub policy: Replacement,
}

impl TlbConfig {
    /// `sets × ways` entries with `policy`.
    pub const fn new(sets: usize, ways: usize, policy: Replacement) -> TlbConfig {
        TlbConfig { sets, ways, policy }
    }

    /// Total entries.
    pub const fn entries(&self) -> usize {
        self.sets * self.ways
    }
}

/// Why a TLB configuration was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlbConfigError {
    /// Zero sets or zero ways.
    Empty,
    /// More than 2^20 entries (a model, not a cache of everything).
    TooLarge {
        /// Entries asked for.
        entries: usize,
    },
    /// A hierarchy with no compute unit.
    NoUnits,
}

impl fmt::Display for TlbConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlbConfigError::Empty => write!(f, "a TLB needs at least one set and one way"),
            TlbConfigError::TooLarge { entries } => write!(f, "{entries} TLB entries is too many"),
            TlbConfigError::NoUnits => write!(f, "a TLB hierarchy needs at least one unit"),
        }
    }
}

/// Counters of one TLB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlbStats {
    /// Lookups that found an entry.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Entries filled.
    pub fills: u64,
    /// Valid entries evicted by the replacement policy.
    pub evictions: u64,
    /// Entries dropped by invalidation (ranges, single addresses or flushes).
    pub invalidated: u64,
    /// Invalidation requests (one per call, whatever it dropped).
    pub invalidations: u64,
}

impl TlbStats {
    /// Hits over lookups, 0 when there was none.
    pub fn hit_ratio(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }

    /// The sum of two sets of counters.
    pub fn plus(self, o: TlbStats) -> TlbStats {
        TlbStats {
            hits: self.hits + o.hits,
            misses: self.misses + o.misses,
            fills: self.fills + o.fills,
            evictions: self.evictions + o.evictions,
            invalidated: self.invalidated + o.invalidated,
            invalidations: self.invalidations + o.invalidations,
        }
    }
}

fn overlaps(tag: u64, shift: u8, start: u64, len: u64) -> bool {
    let s = (tag as u128) << shift;
    let e = s + (1u128 << shift);
    s < start as u128 + len as u128 && (start as u128) < e
}

/// A set-associative TLB caching values of type `V`.
///
/// Stored as two arrays indexed by way: the 32-bit probe words a lookup scans (sixteen
/// ways per SSE2 step on x86-64, whatever page sizes the set holds; module `scan`) and one record per way
/// (key, asid, value, recency links) where a candidate is confirmed on its full key
/// and asid; an LRU or FIFO victim is the tail of the set's recency list.
#[derive(Clone, Debug)]
pub struct Tlb<V> {
    config: TlbConfig,
    /// Each slot's entry and recency links, one record per way: a confirmed candidate,
    /// a fill or an LRU refresh touches one record (one bounds check).
    slots: Vec<Slot<V>>,
    /// What a lookup scans: each set's ways four to a group (`groups` per set, the last
    /// one padded with empty lanes). Way `w` of set `s` is lane `w % 4` of group
    /// `s * groups + w / 4`.
    probes: Vec<Group>,
    /// Groups per set (`ways` divided by four, rounded up).
    groups: usize,
    /// `sets - 1` when `sets` is a power of two (a tag's set is then a mask away),
    /// `u64::MAX` otherwise.
    set_mask: u64,
    /// `log2(ways)` when `ways` is a power of two, `u32::MAX` otherwise.
    way_bits: u32,
    /// Each set's most recent slot ([`NIL`] when empty).
    head: Vec<u32>,
    /// Each set's least recent slot: the victim.
    tail: Vec<u32>,
    /// Valid ways per set.
    filled: Vec<u32>,
    /// Valid entries.
    valid: usize,
    /// While `mixed` is false every valid entry has this asid, so a lookup of another
    /// asid misses at once.
    asid0: u64,
    /// Valid entries of more than one asid may be present.
    mixed: bool,
    rng: u64,
    /// Bit `s` set: entries of page shift `s` may be present.
    shifts: u64,
    /// The key of the last [`Tlb::lookup_ref_recent`] (a hint: when the next one asks
    /// for the same key, its set's most recent slot is checked before the scan).
    last_key: u64,
    stats: TlbStats,
}

const MAX_ENTRIES: usize = 1 << 20;

const INVALID: u64 = u64::MAX;

/// No slot (an end of a recency list).
const NIL: u32 = u32::MAX;

fn key(tag: u64, shift: u8) -> u64 {
    tag << 6 | u64::from(shift)
}

/// The word a lookup of `va` for `asid` compares: bits 12..44 of `va` (the low 32 bits
/// of its 4 KiB page number) mixed with a hash of the asid. An entry's page of
/// `1 << shift` bytes holds `va` only if the two words agree under the entry's
/// [`page_mask`]; the converse may fail (a larger address space, another asid whose
/// hash agrees), so a candidate is confirmed on the full key and asid.
#[inline(always)]
fn probe_word(va: u64, asid: u64) -> u32 {
    ((va >> 12) as u32) ^ ((asid.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32)
}

/// The bits of a [`probe_word`] that an entry of page shift `shift` fixes: all of them
/// for pages of 4 KiB and below, none of the low `shift - 12` for a larger page, none at
/// all from 2^44 bytes up.
#[inline(always)]
fn page_mask(shift: u8) -> u32 {
    match shift {
        0..=12 => u32::MAX,
        13..=43 => u32::MAX << (shift - 12),
        _ => 0,
    }
}

/// One way's entry.
#[derive(Clone, Copy, Debug)]
struct Slot<V> {
    /// `tag << 6 | shift`, [`INVALID`] when empty.
    key: u64,
    /// The entry's asid.
    asid: u64,
    /// `va >> shift`.
    tag: u64,
    /// The slot's neighbours in its set's recency list (more recent, less recent;
    /// [`NIL`] at the ends) while valid: most recently filled or (LRU) used first, so
    /// the LRU / FIFO victim is the list's tail, found without a search.
    newer: u32,
    /// See `newer`.
    older: u32,
    /// The cached value (`None` when empty).
    value: Option<V>,
}

impl<V: Copy> Tlb<V> {
    /// An empty TLB.
    ///
    /// # Errors
    /// [`TlbConfigError::Empty`] for zero sets or ways, [`TlbConfigError::TooLarge`] for
    /// more than 2^20 entries.
    pub fn new(config: TlbConfig) -> Result<Tlb<V>, TlbConfigError> {
        if config.sets == 0 || config.ways == 0 {
            return Err(TlbConfigError::Empty);
        }
        let entries = config.sets.saturating_mul(config.ways);
        if entries > MAX_ENTRIES {
            return Err(TlbConfigError::TooLarge { entries });
        }
        let rng = match config.policy {
            Replacement::Random { seed: 0 } => 0x9E37_79B9_7F4A_7C15,
            Replacement::Random { seed } => seed,
            _ => 1,
        };
        Ok(Tlb {
            config,
            slots: vec![
                Slot {
                    key: INVALID,
                    asid: 0,
                    tag: 0,
                    newer: NIL,
                    older: NIL,
                    value: None,
                };
                entries
            ],
            probes: vec![EMPTY_GROUP; config.sets * config.ways.div_ceil(4)],
            groups: config.ways.div_ceil(4),
            set_mask: if config.sets.is_power_of_two() {
                config.sets as u64 - 1
            } else {
                u64::MAX
            },
            way_bits: if config.ways.is_power_of_two() {
                config.ways.trailing_zeros()
            } else {
                u32::MAX
            },
            head: vec![NIL; config.sets],
            tail: vec![NIL; config.sets],
            filled: vec![0; config.sets],
            valid: 0,
            asid0: 0,
            mixed: false,
            rng,
            shifts: 0,
            last_key: INVALID,
            stats: TlbStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> TlbConfig {
        self.config
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> TlbStats {
        self.stats
    }

    /// Count `n` more fills (the split replayer's correction for a fill it made in
    /// place of two on the same slot).
    pub(crate) fn count_fills(&mut self, n: u64) {
        self.stats.fills += n;
    }

    /// Valid entries.
    pub fn len(&self) -> usize {
        self.valid
    }

    /// Whether no entry is valid.
    pub fn is_empty(&self) -> bool {
        self.valid == 0
    }

    /// The set a tag lives in (a mask for power-of-two sets, no division).
    #[inline(always)]
    fn set_index(&self, tag: u64) -> usize {
        if self.set_mask != u64::MAX {
            (tag & self.set_mask) as usize
        } else {
            (tag % self.config.sets as u64) as usize
        }
    }

    /// The set of slot `i` (a shift for power-of-two ways, no division).
    #[inline(always)]
    fn slot_set(&self, i: usize) -> usize {
        if self.way_bits != u32::MAX {
            i >> self.way_bits
        } else {
            i / self.config.ways
        }
    }

    #[inline(always)]
    fn find(&self, asid: u64, va: u64, shift: u8) -> Option<usize> {
        let tag = va >> shift;
        self.find_in(asid, va, key(tag, shift), self.set_index(tag))
    }

    /// [`Tlb::find`] of key `k` in set `set` (the caller computed both from `va`).
    #[inline(always)]
    fn find_in(&self, asid: u64, va: u64, k: u64, set: usize) -> Option<usize> {
        if !self.mixed && asid != self.asid0 {
            return None;
        }
        // The set's probe words 32 ways per step ([`scan::block`]); each candidate is
        // confirmed on the full key and asid (a key is in a set once per asid).
        let x = probe_word(va, asid);
        let (start, first) = (set * self.config.ways, set * self.groups);
        let probes = &self.probes[first..first + self.groups];
        if probes.len() <= BLOCK {
            // One block (up to 32 ways, the common case): no loop over blocks.
            return self.confirm(scan::block(probes, x), start, k, asid);
        }
        for (n, b) in probes.chunks(BLOCK).enumerate() {
            let hit = self.confirm(scan::block(b, x), start + n * 4 * BLOCK, k, asid);
            if hit.is_some() {
                return hit;
            }
        }
        None
    }

    /// The first candidate of `m` (bit `w` for slot `start + w`) whose key and asid are
    /// `k` and `asid`.
    #[inline(always)]
    fn confirm(&self, mut m: u32, start: usize, k: u64, asid: u64) -> Option<usize> {
        while m != 0 {
            let i = start + m.trailing_zeros() as usize;
            if let Some(s) = self.slots.get(i) {
                if s.key == k && s.asid == asid {
                    return Some(i);
                }
            }
            m &= m - 1;
        }
        None
    }

    /// The group and lane of slot `i` of set `set`.
    #[inline(always)]
    fn lane(&self, set: usize, i: usize) -> (usize, usize) {
        let way = i - set * self.config.ways;
        (set * self.groups + way / 4, way % 4)
    }

    /// The entry of the smallest page size that translates `va` for `asid`, found in
    /// one pass over the whole array whatever page sizes it holds (a fully associative
    /// TLB: every size lives in the one set). The same entry as probing each size
    /// present, smallest first.
    #[inline(always)]
    fn find_any_size(&self, asid: u64, va: u64) -> Option<usize> {
        if !self.mixed && asid != self.asid0 {
            return None;
        }
        let x = probe_word(va, asid);
        let (mut best, mut best_shift) = (None, u64::MAX);
        for (n, b) in self.probes.chunks(BLOCK).enumerate() {
            let mut m = scan::block(b, x);
            while m != 0 {
                let i = n * 4 * BLOCK + m.trailing_zeros() as usize;
                let k = self.slots[i].key;
                let s = k & 63;
                if s < best_shift && k == key(va >> s, s as u8) && self.slots[i].asid == asid {
                    (best, best_shift) = (Some(i), s);
                }
                m &= m - 1;
            }
        }
        best
    }

    /// Fill slot `i` of set `set` with a valid entry; returns the previous entry's
    /// `(asid, tag, shift)` if the slot was valid. The entry becomes its set's most
    /// recent.
    #[inline(always)]
    fn occupy(
        &mut self,
        set: usize,
        i: usize,
        asid: u64,
        tag: u64,
        shift: u8,
        value: V,
    ) -> Option<(u64, u64, u8)> {
        let k_old = self.slots[i].key;
        let old = if k_old != INVALID {
            let old = (self.slots[i].asid, self.slots[i].tag, (k_old & 63) as u8);
            if self.head[set] != i as u32 {
                self.raise(set, i);
            }
            Some(old)
        } else {
            if self.valid == 0 {
                self.asid0 = asid;
                self.mixed = false;
            }
            self.valid += 1;
            self.filled[set] += 1;
            self.push_front(set, i);
            None
        };
        if asid != self.asid0 {
            self.mixed = true;
        }
        let mask = page_mask(shift);
        let (g, l) = self.lane(set, i);
        // One bounds check per array: the group's lane, then the slot's record.
        let p = &mut self.probes[g];
        p.masks[l] = mask;
        p.words[l] = probe_word(tag << shift, asid) & mask;
        let s = &mut self.slots[i];
        s.key = key(tag, shift);
        s.asid = asid;
        s.tag = tag;
        s.value = Some(value);
        old
    }

    /// Empty slot `i` (nothing happens if it is empty).
    fn vacate(&mut self, i: usize) {
        let set = self.slot_set(i);
        if self.slots[i].key != INVALID {
            self.unlink(set, i);
            self.valid -= 1;
            self.filled[set] -= 1;
            if self.valid == 0 {
                self.mixed = false;
            }
        }
        self.slots[i].key = INVALID;
        let (g, l) = self.lane(set, i);
        self.probes[g].masks[l] = 0;
        self.probes[g].words[l] = 1;
        self.slots[i].value = None;
    }

    /// Take valid slot `i` out of its set's recency list.
    #[inline(always)]
    fn unlink(&mut self, set: usize, i: usize) {
        let (n, o) = (self.slots[i].newer, self.slots[i].older);
        if n == NIL {
            self.head[set] = o;
        } else {
            self.slots[n as usize].older = o;
        }
        if o == NIL {
            self.tail[set] = n;
        } else {
            self.slots[o as usize].newer = n;
        }
    }

    /// Make valid slot `i`, which is not its set's most recent, the most recent: an
    /// LRU hit, or the reuse of a full set's victim. The same list as [`Tlb::unlink`]
    /// then [`Tlb::push_front`], with the branches those two take for a slot at the
    /// head (none here) left out.
    #[inline(always)]
    fn raise(&mut self, set: usize, i: usize) {
        let (n, o) = (self.slots[i].newer, self.slots[i].older);
        debug_assert!(n != NIL, "raise of the most recent slot");
        let h = self.head[set];
        self.slots[n as usize].older = o;
        if o == NIL {
            self.tail[set] = n;
        } else {
            self.slots[o as usize].newer = n;
        }
        let s = &mut self.slots[i];
        s.newer = NIL;
        s.older = h;
        self.slots[h as usize].newer = i as u32;
        self.head[set] = i as u32;
    }

    /// Make slot `i` (not in the list) its set's most recent.
    #[inline]
    fn push_front(&mut self, set: usize, i: usize) {
        let h = self.head[set];
        self.slots[i].newer = NIL;
        self.slots[i].older = h;
        if h == NIL {
            self.tail[set] = i as u32;
        } else {
            self.slots[h as usize].newer = i as u32;
        }
        self.head[set] = i as u32;
    }

    /// The page shifts present, smallest first (the set bits of `shifts`, one step per
    /// size present, not per possible size).
    fn shift_list(&self) -> impl Iterator<Item = u8> + '_ {
        let mut m = self.shifts;
        std::iter::from_fn(move || {
            if m == 0 {
                return None;
            }
            let s = m.trailing_zeros() as u8;
            m &= m - 1;
            Some(s)
        })
    }

    /// Look `va` up in any page size, smallest first; a hit refreshes the entry for
    /// LRU. Returns the entry's page shift and value.
    #[inline(always)]
    pub fn lookup(&mut self, asid: u64, va: u64) -> Option<(u8, V)> {
        let i = self.lookup_any(asid, va)?;
        Some(((self.slots[i].key & 63) as u8, self.slots[i].value?))
    }

    /// [`Tlb::lookup`] returning a reference to the value (no copy through the
    /// return value: the caller copies it once, where it needs it).
    #[inline(always)]
    pub fn lookup_ref(&mut self, asid: u64, va: u64) -> Option<&V> {
        let i = self.lookup_any(asid, va)?;
        self.slots[i].value.as_ref()
    }

    /// [`Tlb::lookup_ref`] with a fast path for a repeated hit (consecutive accesses to
    /// one page, as a unit's L1 sees them): when one page size is present and the
    /// set's most recent slot holds the key, that slot is the hit, with no scan. A key
    /// is in a set once per asid, so it is the slot the scan would find; the counters
    /// and the recency order move as in [`Tlb::lookup_ref`].
    #[inline(always)]
    pub fn lookup_ref_recent(&mut self, asid: u64, va: u64) -> Option<&V> {
        if self.shifts.is_power_of_two() {
            let s = self.shifts.trailing_zeros() as u8;
            let tag = va >> s;
            let (k, set) = (key(tag, s), self.set_index(tag));
            // Only a repeated key is checked against the most recent slot (a lookup of
            // another page pays one compare, not the check).
            let again = k == self.last_key;
            self.last_key = k;
            if again {
                if let Some(h) = self.recent_hit(asid, k, set) {
                    return self.slots[h].value.as_ref();
                }
            }
            // The scan, with the key and set computed above.
            let hit = self.find_in(asid, va, k, set);
            let i = self.count_hit(hit)?;
            return self.slots[i].value.as_ref();
        }
        self.lookup_ref(asid, va)
    }

    /// The repeated-hit half of [`Tlb::lookup_ref_recent`] alone: its answer when one
    /// page size is present, the key is the last one looked up and the set's most
    /// recent slot holds it (counted as that hit is), otherwise `None` with nothing
    /// changed — the caller then makes the whole [`Tlb::lookup_ref_recent`], which
    /// answers and counts exactly as if this had not been asked. Small, so that the
    /// common case inlines where a whole lookup would not.
    #[inline(always)]
    pub fn lookup_repeated(&mut self, asid: u64, va: u64) -> Option<&V> {
        if !self.shifts.is_power_of_two() {
            return None;
        }
        let s = self.shifts.trailing_zeros() as u8;
        let tag = va >> s;
        let k = key(tag, s);
        if k != self.last_key {
            return None;
        }
        // `last_key` is `k` already.
        let h = self.recent_hit(asid, k, self.set_index(tag))?;
        self.slots[h].value.as_ref()
    }

    /// The repeated-key check of both lookups above: set `set`'s most recent slot when
    /// it holds key `k` of `asid`, counted as a hit (it needs no LRU refresh); `None`
    /// with nothing changed otherwise.
    #[inline(always)]
    fn recent_hit(&mut self, asid: u64, k: u64, set: usize) -> Option<usize> {
        let h = self.head.get(set).map_or(NIL, |&h| h) as usize;
        let slot = self.slots.get(h)?;
        if slot.key != k || slot.asid != asid {
            return None;
        }
        self.stats.hits += 1;
        Some(h)
    }

    /// The slot a lookup in any page size hits (counted and refreshed).
    #[inline(always)]
    fn lookup_any(&mut self, asid: u64, va: u64) -> Option<usize> {
        if self.shifts & (self.shifts.wrapping_sub(1)) == 0 {
            // One page size (the common case): no list to build.
            let s = self.shifts.trailing_zeros().min(63) as u8;
            let hit = self.find(asid, va, s);
            return self.count_hit(hit);
        }
        if self.config.sets == 1 {
            // Several sizes in the one set: one pass over it for all of them.
            let hit = self.find_any_size(asid, va);
            return self.count_hit(hit);
        }
        // Several sizes in several sets: probe each present one, smallest first (no
        // list built).
        let mut m = self.shifts;
        let mut hit = None;
        while m != 0 {
            hit = self.find(asid, va, m.trailing_zeros() as u8);
            if hit.is_some() {
                break;
            }
            m &= m - 1;
        }
        self.count_hit(hit)
    }

    /// Look `va` up in page size `1 << shift` only (a page-walk-cache level).
    #[inline]
    pub fn lookup_at(&mut self, asid: u64, va: u64, shift: u8) -> Option<V> {
        self.lookup_deepest(asid, va, &[shift]).map(|(_, v)| v)
    }

    /// Look `va` up in each page size of `shifts`, in order, and return the first
    /// entry found with its shift: one hit or one miss is counted (a page-walk cache
    /// probing its levels deepest first).
    #[inline(always)]
    pub fn lookup_deepest(&mut self, asid: u64, va: u64, shifts: &[u8]) -> Option<(u8, V)> {
        let (s, i) = self.lookup_slot(asid, va, shifts)?;
        Some((s, self.slots[i].value?))
    }

    /// The shift and slot of the first of `shifts` that hits (one hit or miss counted,
    /// the entry refreshed for LRU).
    #[inline(always)]
    fn lookup_slot(&mut self, asid: u64, va: u64, shifts: &[u8]) -> Option<(u8, usize)> {
        let hit = shifts
            .iter()
            .find_map(|&s| self.find(asid, va, s).map(|i| (s, i)));
        let i = self.count_hit(hit.map(|(_, i)| i))?;
        Some((hit?.0, i))
    }

    /// Count a lookup's hit or miss and refresh a hit slot for LRU.
    #[inline(always)]
    fn count_hit(&mut self, hit: Option<usize>) -> Option<usize> {
        match hit {
            Some(i) => {
                self.stats.hits += 1;
                if self.config.policy == Replacement::Lru && self.slots[i].newer != NIL {
                    let set = self.slot_set(i);
                    self.raise(set, i);
                }
                Some(i)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Whether an entry translates `va` for `asid`, without counting or refreshing.
    pub fn holds(&self, asid: u64, va: u64) -> bool {
        self.shift_list().any(|s| self.find(asid, va, s).is_some())
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Cache `value` for the page of `1 << shift` bytes holding `va`. An entry with the
    /// same key is overwritten; otherwise a free way is used, or the policy's victim is
    /// evicted. Returns the evicted entry's `(asid, page address)` if one was.
    pub fn insert(&mut self, asid: u64, va: u64, shift: u8, value: V) -> Option<(u64, u64)> {
        self.insert_inner(asid, va, shift, value, true)
    }

    /// [`Tlb::insert`] for a key the caller just looked up and missed (no entry of
    /// `asid` translates `va` in any size): skips the search for an entry to overwrite.
    /// Inserting a key that is present would duplicate it; use [`Tlb::insert`] then.
    #[inline(always)]
    pub fn insert_missing(
        &mut self,
        asid: u64,
        va: u64,
        shift: u8,
        value: V,
    ) -> Option<(u64, u64)> {
        debug_assert!(!self.holds(asid, va), "insert_missing of a present key");
        self.insert_inner(asid, va, shift, value, false)
    }

    /// [`Tlb::insert`] of a key known absent at this `shift` (a page-walk-cache level
    /// the caller just probed and missed): skips the search for an entry to overwrite.
    pub(crate) fn insert_absent(&mut self, asid: u64, va: u64, shift: u8, value: V) {
        debug_assert!(
            self.find(asid, va, shift.min(63)).is_none(),
            "insert_absent of a present key"
        );
        self.insert_inner(asid, va, shift, value, false);
    }

    #[inline(always)]
    fn insert_inner(
        &mut self,
        asid: u64,
        va: u64,
        shift: u8,
        value: V,
        search: bool,
    ) -> Option<(u64, u64)> {
        let shift = shift.min(63);
        self.shifts |= 1 << shift;
        self.stats.fills += 1;
        let tag = va >> shift;
        if search {
            if let Some(i) = self.find(asid, va, shift) {
                let set = self.slot_set(i);
                self.occupy(set, i, asid, tag, shift, value);
                return None;
            }
        }
        let set = self.set_index(tag);
        let range = set * self.config.ways..(set + 1) * self.config.ways;
        if self.filled[set] < self.config.ways as u32 {
            if let Some(i) = self.slots[range.clone()]
                .iter()
                .position(|s| s.key == INVALID)
            {
                self.occupy(set, range.start + i, asid, tag, shift, value);
                return None;
            }
        }
        let victim = match self.config.policy {
            Replacement::Random { .. } => {
                range.start + (self.next_random() % self.config.ways as u64) as usize
            }
            // The set is full: its least recent entry (the list's tail).
            Replacement::Lru | Replacement::Fifo => self.tail[set] as usize,
        };
        let (old_asid, old_tag, old_shift) = self
            .occupy(set, victim, asid, tag, shift, value)
            .expect("full set");
        self.stats.evictions += 1;
        Some((old_asid, old_tag << old_shift))
    }

    /// Drop the entries translating `va` for `asid` (what hardware does with the entry
    /// that caused a fault). Returns how many were dropped.
    pub fn remove(&mut self, asid: u64, va: u64) -> u64 {
        let (mut hits, mut n) = ([0usize; 64], 0);
        for s in self.shift_list() {
            if let Some(i) = self.find(asid, va, s) {
                hits[n] = i;
                n += 1;
            }
        }
        for &i in &hits[..n] {
            self.vacate(i);
        }
        self.stats.invalidated += n as u64;
        n as u64
    }

    /// Drop every entry of `asid` overlapping any of `ranges` (`(start, len)` in bytes).
    /// Returns how many were dropped.
    pub fn invalidate(&mut self, asid: u64, ranges: &[(u64, u64)]) -> u64 {
        self.stats.invalidations += 1;
        let capacity = self.slots.len() as u64;
        let shifts: Vec<u8> = self.shift_list().collect();
        let probes: u64 = ranges
            .iter()
            .map(|&(s, l)| {
                shifts
                    .iter()
                    .map(|&sh| pages_at(s, l, sh))
                    .fold(0u64, u64::saturating_add)
            })
            .fold(0u64, u64::saturating_add);
        let mut dropped = 0;
        if probes <= capacity {
            for &(start, len) in ranges {
                for &sh in &shifts {
                    if len == 0 {
                        continue;
                    }
                    let first = start >> sh;
                    let last = start.saturating_add(len - 1) >> sh;
                    for tag in first..=last {
                        if let Some(i) = self.find(asid, tag << sh, sh) {
                            self.vacate(i);
                            dropped += 1;
                        }
                    }
                }
            }
        } else {
            for i in 0..self.slots.len() {
                let k = self.slots[i].key;
                if k != INVALID
                    && self.slots[i].asid == asid
                    && ranges
                        .iter()
                        .any(|&(s, l)| l > 0 && overlaps(self.slots[i].tag, (k & 63) as u8, s, l))
                {
                    self.vacate(i);
                    dropped += 1;
                }
            }
        }
        self.stats.invalidated += dropped;
        dropped
    }

    /// Drop every entry of `asid`.
    pub fn flush_asid(&mut self, asid: u64) -> u64 {
        self.stats.invalidations += 1;
        let mut dropped = 0;
        if self.valid > 0 && (self.mixed || self.asid0 == asid) {
            for i in 0..self.slots.len() {
                if self.slots[i].key != INVALID && self.slots[i].asid == asid {
                    self.vacate(i);
                    dropped += 1;
                }
            }
        }
        self.stats.invalidated += dropped;
        dropped
    }

    /// Drop every entry.
    pub fn flush(&mut self) -> u64 {
        self.stats.invalidations += 1;
        let dropped = self.valid as u64;
        if dropped > 0 {
            self.slots.iter_mut().for_each(|s| {
                s.key = INVALID;
                s.value = None;
            });
            self.probes.iter_mut().for_each(|g| *g = EMPTY_GROUP);
            self.filled.iter_mut().for_each(|f| *f = 0);
            self.head.iter_mut().for_each(|f| *f = NIL);
            self.tail.iter_mut().for_each(|f| *f = NIL);
        }
        self.valid = 0;
        self.mixed = false;
        self.shifts = 0;
        self.stats.invalidated += dropped;
        dropped
    }
}

/// Number of pages of `1 << shift` bytes that `[start, start + len)` touches.
fn pages_at(start: u64, len: u64, shift: u8) -> u64 {
    if len == 0 {
        return 0;
    }
    (start.saturating_add(len - 1) >> shift) - (start >> shift) + 1
}

#[cfg(test)]
mod tests;
