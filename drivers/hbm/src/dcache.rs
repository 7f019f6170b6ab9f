//! The near-data SMs' data caches: what stands between an SM's loads and stores and
//! the stacks' networks. Only misses and write-backs become local, remote or host
//! traffic, in 128-byte lines; hits cost an L1 or L2 latency in the SM bound
//! ([`crate::cost`]).
//!
//! **The caches filter accounting only.** They hold tags and line states, never bytes:
//! every load still reads memory and every store still writes it
//! ([`HbmMachine::load_via`](crate::HbmMachine::load_via)), so a placement or decode
//! mistake still corrupts data and fails verification, and no coherence protocol is
//! needed for correctness.
//!
//! Organisation (rebuilt: CODA's Table 1, the SM configuration, was an image missing
//! from the text; its §4.2 says cache lines carry the granularity bit and that a line
//! evicted from the *last level cache* is written back to the stack chosen by that
//! bit — so the last level sits on the requesting side, caching any stack's lines):
//! - **L1, one per SM** ([`CacheModel`]: 16 KiB, 4 ways): loads allocate; stores are
//!   written through to the L2 and do not allocate (Fermi's policy for global data).
//! - **L2, one per stack, shared by that stack's SMs** (192 KiB, 8 ways), in the
//!   stack's logic layer beside the SMs: it caches lines of every stack, so reuse of
//!   remote data crosses the stack-to-stack network once per miss instead of once per
//!   access. A memory-side L2 (one slice per stack caching only its own memory, as in
//!   a discrete GPU) would not cut remote traffic at all, and would contradict the
//!   paper's write-back rule, which needs a line to learn its stack from its bit.
//!   Write-back, write-allocate: a store that misses allocates the line *without
//!   fetching it* (Fermi's L2 keeps byte masks); the line is then partial, and a load
//!   of a partial line fetches it (a miss). A store covering the whole line makes it
//!   complete. Each line records its granularity bit when allocated; its write-back
//!   goes to the stack that bit and its address decode to (§4.2).
//! - **Kernel boundaries:** GPUs keep such caches coherent by software at kernel
//!   boundaries; here every launch ends with [`DataCaches::flush`]: dirty L2 lines are
//!   written back (counted as the stack's traffic) and all lines dropped, so the next
//!   launch starts cold and no stack reads another's stale copy. Within a launch the
//!   workloads never read what another block of the same launch wrote.
//! - A page moved by first-touch migration first has its lines written back and
//!   dropped ([`DataCaches::evict_page`]).
//!
//! The set-associative array is the simulator's [`Tlb`] with 128-byte "pages" (shift
//! 7), as the SIMT GPU model's data caches use it; dirty lines and their bits live in
//! a side table per stack, because the array reports an evicted line's address but
//! not its value.
//!
//! The host is not cached here: host-side execution prices its traffic as before.

use crate::config::{CacheModel, ConfigError, HbmConfig};
use crate::decode::Granularity;
use crate::memory::{HbmMemory, Requester, Traffic, CHUNK};
use gmem_core::{MemError, PhysAddr, PAGE_SIZE};
use gmem_sim::{Replacement, Tlb, TlbConfig};
use std::collections::HashMap;
use std::vec::Vec;

/// `log2` of the line size.
const LINE_SHIFT: u8 = 7;

/// Where an access to one line was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// A load that hit the SM's L1.
    L1,
    /// A load that hit the stack's L2, or a store absorbed by it.
    L2,
    /// A load that went to memory; the traffic it made.
    Memory(Traffic),
}

/// Counters of a run's data caches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Line loads served by an L1.
    pub l1_hits: u64,
    /// Line loads served by an L2.
    pub l2_hits: u64,
    /// Line loads that went to memory.
    pub misses: u64,
    /// Line stores (all absorbed by an L2).
    pub stores: u64,
    /// Dirty lines written back (on eviction, migration or a kernel boundary).
    pub writebacks: u64,
}

/// Per-SM L1s and per-stack L2s of one machine.
pub struct DataCaches {
    model: CacheModel,
    sms_per_stack: u32,
    l1: Vec<Tlb<()>>,
    /// Value: the line is complete (fetched, or wholly written).
    l2: Vec<Tlb<bool>>,
    /// Per stack: dirty lines (line address) and the bit each was allocated with.
    dirty: Vec<HashMap<u64, Granularity>>,
    stats: CacheStats,
}

impl DataCaches {
    /// Empty caches for `cfg` (`None` inside when `cfg.cache` is off).
    ///
    /// # Errors
    /// [`ConfigError::Cache`] for a geometry the array refuses.
    pub fn new(cfg: &HbmConfig) -> Result<DataCaches, ConfigError> {
        let m = cfg.cache;
        let (l1, l2) = if m.enabled {
            let l1 = TlbConfig::new(m.l1_sets, m.l1_ways, Replacement::Lru);
            let l2 = TlbConfig::new(m.l2_sets, m.l2_ways, Replacement::Lru);
            (
                (0..cfg.sms())
                    .map(|_| Tlb::new(l1))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| ConfigError::Cache)?,
                (0..cfg.stacks)
                    .map(|_| Tlb::new(l2))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| ConfigError::Cache)?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(DataCaches {
            model: m,
            sms_per_stack: cfg.sms_per_stack.max(1),
            l1,
            l2,
            dirty: (0..cfg.stacks).map(|_| HashMap::new()).collect(),
            stats: CacheStats::default(),
        })
    }

    /// Whether the caches are modelled.
    pub fn enabled(&self) -> bool {
        self.model.enabled
    }

    /// The counters so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    fn stack_of(&self, sm: u32) -> usize {
        (sm / self.sms_per_stack) as usize
    }

    /// Write `line` back from `stack`'s L2 if it is dirty (counted as that stack's
    /// traffic to the line's home).
    fn write_back(
        &mut self,
        mem: &HbmMemory,
        stack: usize,
        line: u64,
    ) -> Result<Traffic, MemError> {
        let Some(g) = self.dirty.get_mut(stack).and_then(|d| d.remove(&line)) else {
            return Ok(Traffic::default());
        };
        self.stats.writebacks += 1;
        let who = Requester::Sm(stack as u32 * self.sms_per_stack);
        mem.account(who, PhysAddr::new(line), g, CHUNK)
    }

    /// Allocate `line` in `stack`'s L2 (complete or not), writing back the victim.
    fn fill_l2(
        &mut self,
        mem: &HbmMemory,
        stack: usize,
        line: u64,
        complete: bool,
    ) -> Result<(), MemError> {
        let evicted = self
            .l2
            .get_mut(stack)
            .and_then(|c| c.insert(0, line, LINE_SHIFT, complete));
        if let Some((_, victim)) = evicted {
            self.write_back(mem, stack, victim)?;
        }
        Ok(())
    }

    /// A load by SM `sm` of the line holding `pa`, reached through a translation whose
    /// bit is `g`.
    ///
    /// # Errors
    /// [`MemError::OutOfRange`] if the line (or a victim) lies outside memory.
    pub fn load(
        &mut self,
        mem: &HbmMemory,
        sm: u32,
        pa: PhysAddr,
        g: Granularity,
    ) -> Result<Served, MemError> {
        let line = pa.as_u64() & !(CHUNK - 1);
        let stack = self.stack_of(sm);
        if !self.model.enabled {
            self.stats.misses += 1;
            let t = mem.account(Requester::Sm(sm), PhysAddr::new(line), g, CHUNK)?;
            return Ok(Served::Memory(t));
        }
        let l1_hit = self
            .l1
            .get_mut(sm as usize)
            .is_some_and(|c| c.lookup_at(0, line, LINE_SHIFT).is_some());
        if l1_hit {
            self.stats.l1_hits += 1;
            return Ok(Served::L1);
        }
        let l2 = self
            .l2
            .get_mut(stack)
            .and_then(|c| c.lookup_at(0, line, LINE_SHIFT));
        let served = if l2 == Some(true) {
            self.stats.l2_hits += 1;
            Served::L2
        } else {
            self.stats.misses += 1;
            let t = mem.account(Requester::Sm(sm), PhysAddr::new(line), g, CHUNK)?;
            // A partial line keeps its slot (and dirty state); a missing one is filled.
            self.fill_l2(mem, stack, line, true)?;
            Served::Memory(t)
        };
        if let Some(c) = self.l1.get_mut(sm as usize) {
            let _ = c.insert(0, line, LINE_SHIFT, ());
        }
        Ok(served)
    }

    /// A store by SM `sm` of `len` bytes at `pa` (inside one line), through a
    /// translation whose bit is `g`. With caches off it is a memory transaction
    /// (returned); with caches on the L2 absorbs it ([`Served::L2`]).
    ///
    /// # Errors
    /// [`MemError::OutOfRange`] if the line (or a victim) lies outside memory.
    pub fn store(
        &mut self,
        mem: &HbmMemory,
        sm: u32,
        pa: PhysAddr,
        len: u64,
        g: Granularity,
    ) -> Result<Served, MemError> {
        let line = pa.as_u64() & !(CHUNK - 1);
        let stack = self.stack_of(sm);
        if !self.model.enabled {
            let t = mem.account(Requester::Sm(sm), pa, g, len)?;
            return Ok(Served::Memory(t));
        }
        self.stats.stores += 1;
        // Write-through L1: a hit keeps its (updated) line; a miss does not allocate.
        if let Some(c) = self.l1.get_mut(sm as usize) {
            let _ = c.lookup_at(0, line, LINE_SHIFT);
        }
        let whole = pa.as_u64() == line && len >= CHUNK;
        let held = self
            .l2
            .get_mut(stack)
            .and_then(|c| c.lookup_at(0, line, LINE_SHIFT));
        match held {
            Some(true) => {}
            Some(false) if !whole => {}
            _ => self.fill_l2(mem, stack, line, whole)?,
        }
        if let Some(d) = self.dirty.get_mut(stack) {
            let _ = d.insert(line, g);
        }
        Ok(Served::L2)
    }

    /// Write back the lines of the 4 KiB frame at `frame` and drop them from every
    /// cache (before first-touch migration moves the page). Returns the traffic.
    ///
    /// # Errors
    /// [`MemError::OutOfRange`] if a line lies outside memory.
    pub fn evict_page(&mut self, mem: &HbmMemory, frame: PhysAddr) -> Result<Traffic, MemError> {
        let mut t = Traffic::default();
        if !self.model.enabled {
            return Ok(t);
        }
        let base = frame.as_u64() & !(PAGE_SIZE - 1);
        for line in (base..base + PAGE_SIZE).step_by(CHUNK as usize) {
            for c in &mut self.l1 {
                let _ = c.remove(0, line);
            }
            for stack in 0..self.l2.len() {
                let _ = self.l2[stack].remove(0, line);
                t = add(t, self.write_back(mem, stack, line)?);
            }
        }
        Ok(t)
    }

    /// A kernel boundary: write back every dirty line (counted as its stack's
    /// traffic) and drop all lines. Returns the write-back traffic.
    ///
    /// # Errors
    /// [`MemError::OutOfRange`] if a line lies outside memory.
    pub fn flush(&mut self, mem: &HbmMemory) -> Result<Traffic, MemError> {
        let mut t = Traffic::default();
        for stack in 0..self.dirty.len() {
            let mut lines: Vec<u64> = self.dirty[stack].keys().copied().collect();
            lines.sort_unstable();
            for line in lines {
                t = add(t, self.write_back(mem, stack, line)?);
            }
        }
        for c in &mut self.l1 {
            let _ = c.flush();
        }
        for c in &mut self.l2 {
            let _ = c.flush();
        }
        Ok(t)
    }
}

fn add(a: Traffic, b: Traffic) -> Traffic {
    Traffic {
        local: a.local + b.local,
        remote: a.remote + b.remote,
        host: a.host + b.host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::decode;
    use gmem_core::PhysAddr;

    /// The policy of the module doc written the plainest way: per set, a list of lines
    /// most recent first.
    struct Reference {
        l1: Vec<Vec<Vec<u64>>>,
        l2: Vec<Vec<Vec<(u64, bool)>>>,
        dirty: Vec<HashMap<u64, Granularity>>,
        m: CacheModel,
    }

    fn touch<T: Copy>(set: &mut Vec<T>, at: usize) {
        let x = set.remove(at);
        set.insert(0, x);
    }

    impl Reference {
        fn l1_set(&mut self, sm: usize, line: u64) -> &mut Vec<u64> {
            let s = (line / CHUNK) as usize % self.m.l1_sets;
            &mut self.l1[sm][s]
        }
        fn l2_set(&mut self, stack: usize, line: u64) -> &mut Vec<(u64, bool)> {
            let s = (line / CHUNK) as usize % self.m.l2_sets;
            &mut self.l2[stack][s]
        }
        /// Fill the L2; whether the evicted line was dirty (it is written back).
        fn fill(&mut self, stack: usize, line: u64, complete: bool) -> bool {
            let ways = self.m.l2_ways;
            let set = self.l2_set(stack, line);
            if let Some(i) = set.iter().position(|e| e.0 == line) {
                set[i].1 = complete;
                touch(set, i);
                return false;
            }
            set.insert(0, (line, complete));
            if set.len() <= ways {
                return false;
            }
            match set.pop() {
                Some((victim, _)) => self.dirty[stack].remove(&victim).is_some(),
                None => false,
            }
        }
    }

    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    #[test]
    fn the_caches_agree_with_a_plain_lru_model_on_a_random_trace() {
        let m = CacheModel {
            enabled: true,
            l1_sets: 2,
            l1_ways: 2,
            l2_sets: 4,
            l2_ways: 3,
            ..CacheModel::default()
        };
        let cfg = HbmConfig {
            stacks: 2,
            sms_per_stack: 2,
            stack_bytes: 1 << 20,
            cache: m,
            ..HbmConfig::default()
        };
        let mem = HbmMemory::new(cfg).unwrap();
        let mut c = DataCaches::new(&cfg).unwrap();
        let mut r = Reference {
            l1: std::vec![std::vec![Vec::new(); 2]; 4],
            l2: std::vec![std::vec![Vec::new(); 4]; 2],
            dirty: std::vec![HashMap::new(); 2],
            m,
        };
        let base = cfg.base.as_u64();
        let home = |line: u64, g| decode(&cfg, PhysAddr::new(line), g).unwrap().stack as usize;
        let mut want_wb = 0u64;
        let (mut hits1, mut hits2, mut misses) = (0, 0, 0);
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..20_000 {
            let x = xorshift(&mut rng);
            let sm = (x % 4) as u32;
            let stack = (sm / 2) as usize;
            let idx = (x >> 8) % 48;
            let line = base + idx * CHUNK;
            let g = if idx % 3 == 0 {
                Granularity::Coarse
            } else {
                Granularity::Fine
            };
            let before = mem.traffic();
            let mut want_sent = 0;
            if (x >> 20) % 4 == 0 {
                // A store of a quarter or (one time in four) all of the line.
                let whole = (x >> 24) % 4 == 0;
                let (at, len) = if whole {
                    (line, CHUNK)
                } else {
                    (line + 32, 32)
                };
                let got = c.store(&mem, sm, PhysAddr::new(at), len, g).unwrap();
                assert_eq!(got, Served::L2, "step {step}");
                if let Some(i) = r.l1_set(sm as usize, line).iter().position(|&l| l == line) {
                    touch(r.l1_set(sm as usize, line), i);
                }
                let held = r.l2_set(stack, line).iter().position(|e| e.0 == line);
                let complete = held.is_some_and(|i| r.l2_set(stack, line)[i].1);
                if let Some(i) = held {
                    touch(r.l2_set(stack, line), i);
                }
                if !complete && (held.is_none() || whole) && r.fill(stack, line, whole) {
                    want_wb += 1;
                    want_sent += CHUNK;
                }
                r.dirty[stack].insert(line, g);
            } else {
                let got = c.load(&mem, sm, PhysAddr::new(line), g).unwrap();
                let ways1 = m.l1_ways;
                let in_l1 = r.l1_set(sm as usize, line).iter().position(|&l| l == line);
                let want = if let Some(i) = in_l1 {
                    touch(r.l1_set(sm as usize, line), i);
                    hits1 += 1;
                    Served::L1
                } else {
                    let held = r.l2_set(stack, line).iter().position(|e| e.0 == line);
                    let complete = held.is_some_and(|i| r.l2_set(stack, line)[i].1);
                    let want = if complete {
                        touch(r.l2_set(stack, line), held.unwrap_or(0));
                        hits2 += 1;
                        Served::L2
                    } else {
                        misses += 1;
                        want_sent += CHUNK;
                        if r.fill(stack, line, true) {
                            want_wb += 1;
                            want_sent += CHUNK;
                        }
                        let t = if home(line, g) == stack {
                            Traffic {
                                local: CHUNK,
                                ..Traffic::default()
                            }
                        } else {
                            Traffic {
                                remote: CHUNK,
                                ..Traffic::default()
                            }
                        };
                        Served::Memory(t)
                    };
                    let set = r.l1_set(sm as usize, line);
                    set.insert(0, line);
                    set.truncate(ways1);
                    want
                };
                assert_eq!(got, want, "step {step}: sm {sm} line {idx}");
            }
            // What the step sent to memory: its miss and its victim's write-back.
            let after = mem.traffic();
            let sent = (after.local + after.remote) - (before.local + before.remote);
            assert_eq!(sent, want_sent, "step {step}");
        }
        let s = c.stats();
        assert_eq!((s.l1_hits, s.l2_hits, s.misses), (hits1, hits2, misses));
        assert!(hits1 > 100 && hits2 > 100 && misses > 100, "{s:?}");
        assert_eq!(s.writebacks, want_wb);
        // The boundary writes back exactly the dirty lines, each to its home stack.
        let dirty: u64 = r.dirty.iter().map(|d| d.len() as u64).sum();
        let before = mem.traffic();
        let t = c.flush(&mem).unwrap();
        assert_eq!(c.stats().writebacks, want_wb + dirty);
        assert_eq!(t.local + t.remote, dirty * CHUNK);
        let want_local = r
            .dirty
            .iter()
            .enumerate()
            .flat_map(|(s, d)| d.iter().map(move |(&l, &g)| (s, l, g)))
            .filter(|&(s, l, g)| home(l, g) == s)
            .count() as u64;
        assert_eq!(t.local, want_local * CHUNK);
        assert_eq!(mem.traffic().local - before.local, t.local);
        // Empty afterwards: the next load misses.
        let again = c
            .load(&mem, 0, PhysAddr::new(base), Granularity::Fine)
            .unwrap();
        assert!(matches!(again, Served::Memory(_)));
    }

    #[test]
    fn without_caches_every_access_is_traffic_and_a_bad_geometry_is_refused() {
        let cfg = HbmConfig {
            cache: CacheModel::off(),
            ..HbmConfig::default()
        };
        let mem = HbmMemory::new(cfg).unwrap();
        let mut c = DataCaches::new(&cfg).unwrap();
        let pa = PhysAddr::new(cfg.base.as_u64());
        for _ in 0..3 {
            assert!(matches!(
                c.load(&mem, 0, pa, Granularity::Fine).unwrap(),
                Served::Memory(_)
            ));
        }
        assert_eq!(mem.traffic().local, 3 * CHUNK);
        assert_eq!(c.flush(&mem).unwrap(), Traffic::default());
        let bad = HbmConfig {
            cache: CacheModel {
                l2_ways: 0,
                ..CacheModel::default()
            },
            ..HbmConfig::default()
        };
        assert_eq!(bad.validate(), Err(ConfigError::Cache));
        assert!(DataCaches::new(&bad).is_err());
        // Outside memory: a typed error, nothing counted.
        let mut ok = DataCaches::new(&HbmConfig::default()).unwrap();
        let m2 = HbmMemory::new(HbmConfig::default()).unwrap();
        assert!(ok
            .load(&m2, 0, PhysAddr::new(0), Granularity::Fine)
            .is_err());
        assert_eq!(m2.traffic(), Traffic::default());
    }
}
