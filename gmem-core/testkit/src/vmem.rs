//! The vmem runner: one [`Arena`] against a brute-force interval model.
//!
//! The model is a list of spans and a map of live allocations (start → size). It knows
//! nothing of boundary tags, freelists or caches; it answers by exhaustive search:
//! - a successful allocation must lie inside one span, be quantum aligned, overlap no
//!   live allocation and satisfy its constraint (alignment, phase, `nocross`, window);
//!   without quantum caches a first-fit allocation must be the lowest feasible address;
//! - `NoSpace` is right only if no feasible placement exists in the complement of the
//!   live allocations (the arena reaps its caches before it gives up);
//! - failure injection fails exactly every n-th valid attempt;
//! - misuse (double free, wrong size, foreign or unaligned address, overlapping span,
//!   impossible constraint, zero or unaligned size) gets its typed error and leaves
//!   [`ArenaStats`] unchanged except the failure counter;
//! - after every operation `total == allocated + cached + free`, `allocated` is the
//!   sum of the live sizes, and the operation counters equal the model's; after a reap
//!   nothing is cached and the free space is exactly the model's maximal gaps (every
//!   free neighbour coalesced).
//!
//! Frees of cached sizes are trusted when the arena does not check frees (an address
//! space relies on that); the runner then issues no misuse with such a size, since the
//! arena is allowed to believe it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arbitrary::Arbitrary;
use gmem_core::vmem::{
    AllocError, Arena, ArenaConfig, ArenaStats, Constraint, ConstraintProblem, FitPolicy,
    FreeError, SpanError,
};
use gmem_core::Platform;

/// Operations a fuzz input or a seeded sequence may hold at most.
pub const MAX_OPS: usize = 512;

/// A fit policy, as the arena's default or per call.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// [`FitPolicy::InstantFit`].
    Instant,
    /// [`FitPolicy::BestFit`].
    Best,
    /// [`FitPolicy::FirstFit`].
    First,
    /// [`FitPolicy::NextFit`].
    Next,
}

impl Fit {
    fn policy(self) -> FitPolicy {
        match self {
            Fit::Instant => FitPolicy::InstantFit,
            Fit::Best => FitPolicy::BestFit,
            Fit::First => FitPolicy::FirstFit,
            Fit::Next => FitPolicy::NextFit,
        }
    }
}

/// The arena under test.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct VmemConfig {
    /// `log2(quantum)`, taken modulo 13 (1 byte to 4 KiB).
    pub quantum_shift: u8,
    /// Quantum caches for sizes up to this many quanta (modulo 9; 0 = none).
    pub qcache_quanta: u8,
    /// Per-CPU magazines and a depot instead of one stack per size.
    pub magazines: bool,
    /// Validate frees of cached sizes.
    pub check_frees: bool,
    /// The default fit policy.
    pub fit: Fit,
    /// CPUs of the platform (modulo 3, plus 1).
    pub cpus: u8,
    /// Put the second span at the very top of the 64-bit space.
    pub high: bool,
}

/// Which span a window of [`VmemOp::Xalloc`] is relative to.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct Window {
    /// Index into the spans (modulo their number).
    pub span: u8,
    /// `min` = span base + this many quanta.
    pub lo: u8,
    /// `max` = span base + this many quanta - 1 (saturating); may lie below `min`.
    pub hi: u8,
}

/// One operation on the arena. Indices (`pick`) choose among live or freed
/// allocations modulo their number; an operation with nothing to choose is a no-op.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum VmemOp {
    /// `alloc(quanta * quantum)` on CPU `cpu`; through the exclusive-owner
    /// `alloc_mut` when `cpu`'s top bit is set.
    Alloc {
        /// Size in quanta (0 = a zero-size request).
        quanta: u8,
        /// The CPU the caller runs on.
        cpu: u8,
    },
    /// `alloc_fit` with an explicit policy.
    AllocFit {
        /// Size in quanta.
        quanta: u8,
        /// The policy.
        fit: Fit,
        /// The CPU.
        cpu: u8,
    },
    /// `xalloc` under a constraint (possibly an impossible one).
    Xalloc {
        /// Size in quanta.
        quanta: u8,
        /// `align = 1 << align_shift` quanta when below 9, else 0 (none); 255 = an
        /// alignment that is not a power of two.
        align_shift: u8,
        /// Phase in quanta (may be out of range on purpose).
        phase: u8,
        /// `nocross = 1 << nocross_shift` quanta when below 10, else 0; 255 = not a
        /// power of two.
        nocross_shift: u8,
        /// The window, if any.
        window: Option<Window>,
        /// The policy.
        fit: Fit,
    },
    /// Free a live allocation.
    Free {
        /// Which.
        pick: u16,
        /// The CPU; through the exclusive-owner `free_mut` when its top bit is set.
        /// When bit 6 is set the free is first announced (`prefetch_free`, then
        /// `prefetch_frees`), together with a stale address (the last one freed) and
        /// a misaligned one: hints that must change nothing.
        cpu: u8,
    },
    /// Free an address that was freed before and is not live now.
    DoubleFree {
        /// Which of the freed.
        pick: u16,
    },
    /// Free a live allocation with another size.
    WrongSizeFree {
        /// Which.
        pick: u16,
        /// The wrong size in quanta.
        quanta: u8,
    },
    /// Free an address and size nobody allocated.
    ForeignFree {
        /// Quanta from the first span's base.
        offset: u16,
        /// Size in quanta.
        quanta: u8,
    },
    /// Free a live allocation at an unaligned address or with an unaligned size.
    UnalignedFree {
        /// Which.
        pick: u16,
        /// Unalign the size instead of the address.
        size: bool,
    },
    /// Split a live arena allocation into pieces of `piece` quanta.
    Split {
        /// Which.
        pick: u16,
        /// Piece size in quanta (0 and non-divisors are misuse).
        piece: u8,
    },
    /// Return every cached object to the arena.
    Reap,
    /// Failure injection: every n-th attempt fails (0 = off).
    FailEvery {
        /// n.
        n: u8,
    },
    /// Add a span (overlapping, empty or unaligned ones are misuse).
    AddSpan {
        /// Base in quanta from 4096 quanta.
        base: u16,
        /// Size in quanta.
        quanta: u8,
        /// Unalign the base by one byte (misuse when the quantum is above 1).
        unaligned: bool,
    },
}

/// A platform whose current CPU the runner sets before each call.
struct RunnerCpus {
    cpu: Arc<AtomicUsize>,
    count: usize,
}

impl Platform for RunnerCpus {
    fn current_cpu(&self) -> usize {
        self.cpu.load(Ordering::Relaxed)
    }
    fn cpu_count(&self) -> usize {
        self.count
    }
}

#[derive(Clone, Copy, Debug)]
struct Live {
    size: u64,
    /// Returned by a quantum cache (its segment may be a cached one).
    via_cache: bool,
}

/// The runner: the arena, its configuration and the model.
pub struct VmemRunner {
    arena: Arena,
    cpu: Arc<AtomicUsize>,
    cpus: usize,
    q: u64,
    qcache_max: u64,
    check_frees: bool,
    default_fit: Fit,
    spans: Vec<(u64, u64)>,
    live: BTreeMap<u64, Live>,
    freed: Vec<(u64, u64)>,
    allocs: u64,
    frees: u64,
    failures: u64,
    fail_every: u64,
    attempts: u64,
    misuses: u64,
    step: usize,
}

/// Spans every runner starts with, in quanta: `[16, 16 + 48)` and `[128, 128 + 64)`
/// (or 64 quanta ending at 2^64 with `high`).
const SPAN_A: (u64, u64) = (16, 48);
const SPAN_B: (u64, u64) = (128, 64);

impl VmemRunner {
    /// An arena built from `config` with its two initial spans.
    pub fn new(config: VmemConfig) -> VmemRunner {
        let q = 1u64 << (config.quantum_shift % 13);
        let qcache_max = u64::from(config.qcache_quanta % 9) * q;
        let cpus = usize::from(config.cpus % 3) + 1;
        let cpu = Arc::new(AtomicUsize::new(0));
        let arena = Arena::new(
            ArenaConfig {
                quantum: q,
                qcache_max,
                magazines: config.magazines,
                check_frees: config.check_frees,
                fit: config.fit.policy(),
            },
            Some(Arc::new(RunnerCpus {
                cpu: cpu.clone(),
                count: cpus,
            })),
        )
        .expect("a power-of-two quantum and at most 8 cached quanta are valid");
        let b_base = if config.high {
            0u64.wrapping_sub(SPAN_B.1 * q)
        } else {
            SPAN_B.0 * q
        };
        let spans = vec![(SPAN_A.0 * q, SPAN_A.1 * q), (b_base, SPAN_B.1 * q)];
        for &(b, s) in &spans {
            arena.add_span(b, s).expect("initial spans are valid");
        }
        let r = VmemRunner {
            arena,
            cpu,
            cpus,
            q,
            qcache_max,
            check_frees: config.check_frees,
            default_fit: config.fit,
            spans,
            live: BTreeMap::new(),
            freed: Vec::new(),
            allocs: 0,
            frees: 0,
            failures: 0,
            fail_every: 0,
            attempts: 0,
            misuses: 0,
            step: 0,
        };
        r.check_stats("setup");
        r
    }

    /// Apply every operation, checking the model after each; at the end free
    /// everything, reap, and check the arena is back to its spans.
    pub fn run(mut self, ops: &[VmemOp]) -> crate::Summary {
        for op in ops {
            self.apply(op);
            self.step += 1;
        }
        let summary = crate::Summary {
            ops: ops.len() as u64,
            succeeded: self.allocs + self.frees,
            rejected: self.failures + self.misuses,
            ..Default::default()
        };
        self.arena.set_fail_every(0);
        self.fail_every = 0;
        let live: Vec<(u64, Live)> = self.live.iter().map(|(a, l)| (*a, *l)).collect();
        for (a, l) in live {
            let r = self.arena.free(a, l.size);
            assert_eq!(r, Ok(()), "final free of {a:#x}+{:#x}", l.size);
            self.live.remove(&a);
            self.frees += 1;
        }
        self.arena.reap();
        self.check_stats("final");
        let s = self.arena.stats();
        assert_eq!(s.allocated, 0, "final: nothing allocated");
        assert_eq!(s.cached, 0, "final: nothing cached");
        assert_eq!(s.free, s.total, "final: everything free");
        assert_eq!(
            s.free_segments, s.spans,
            "final: one free segment per span (all coalesced)"
        );
        summary
    }

    fn is_cached_size(&self, size: u64) -> bool {
        size != 0 && size <= self.qcache_max && size % self.q == 0
    }

    fn set_cpu(&self, cpu: u8) {
        // Out-of-range CPUs are folded by the arena; give it some.
        self.cpu
            .store(usize::from(cpu) % (self.cpus + 1), Ordering::Relaxed);
    }

    fn pick_live(&self, pick: u16) -> Option<(u64, Live)> {
        if self.live.is_empty() {
            return None;
        }
        let i = usize::from(pick) % self.live.len();
        self.live.iter().nth(i).map(|(a, l)| (*a, *l))
    }

    fn ctx(&self, op: &VmemOp) -> String {
        format!("step {} {op:?}", self.step)
    }

    fn apply(&mut self, op: &VmemOp) {
        let ctx = self.ctx(op);
        let q = self.q;
        match *op {
            VmemOp::Alloc { quanta, cpu } => {
                self.set_cpu(cpu);
                let size = u64::from(quanta % 72) * q;
                let r = if cpu & 0x80 != 0 {
                    self.arena.alloc_mut(size)
                } else {
                    self.arena.alloc(size)
                };
                let fit = self.default_fit;
                self.check_plain_alloc(&ctx, size, fit, r);
            }
            VmemOp::AllocFit { quanta, fit, cpu } => {
                self.set_cpu(cpu);
                let size = u64::from(quanta % 72) * q;
                let r = self.arena.alloc_fit(size, fit.policy());
                self.check_plain_alloc(&ctx, size, fit, r);
            }
            VmemOp::Xalloc {
                quanta,
                align_shift,
                phase,
                nocross_shift,
                window,
                fit,
            } => {
                let mut c = Constraint::new(u64::from(quanta % 72) * q);
                c.align = match align_shift {
                    255 => 3 * q.max(2),
                    s if s < 9 => q << s,
                    _ => 0,
                };
                c.phase = u64::from(phase % 40) * q;
                c.nocross = match nocross_shift {
                    255 => 3 * q.max(2),
                    s if s < 10 => q << s,
                    _ => 0,
                };
                if let Some(w) = window {
                    let base = self.spans[usize::from(w.span) % self.spans.len()].0;
                    c.min = base.wrapping_add(u64::from(w.lo) * q);
                    c.max = base.wrapping_add(u64::from(w.hi) * q).saturating_sub(1);
                }
                c.fit = fit.policy();
                let r = self.arena.xalloc(&c);
                self.check_xalloc(&ctx, &c, r);
            }
            VmemOp::Free { pick, cpu } => {
                let Some((a, l)) = self.pick_live(pick) else {
                    return;
                };
                self.set_cpu(cpu);
                if cpu & 0x40 != 0 {
                    let before = self.arena.stats();
                    let stale = self.freed.last().copied().unwrap_or((a, l.size));
                    self.arena.prefetch_free(stale.0, stale.1);
                    self.arena.prefetch_free(a | 1, l.size);
                    self.arena.prefetch_free(a, l.size);
                    self.arena
                        .prefetch_frees([stale, (a | 1, l.size), (a, l.size)]);
                    assert_eq!(
                        self.arena.stats(),
                        before,
                        "{ctx}: an announcement changed state"
                    );
                }
                let r = if cpu & 0x80 != 0 {
                    self.arena.free_mut(a, l.size)
                } else {
                    self.arena.free(a, l.size)
                };
                assert_eq!(r, Ok(()), "{ctx}: free of a live allocation {a:#x}");
                self.live.remove(&a);
                self.freed.push((a, l.size));
                self.frees += 1;
            }
            VmemOp::DoubleFree { pick } => {
                if self.freed.is_empty() {
                    return;
                }
                let (a, size) = self.freed[usize::from(pick) % self.freed.len()];
                if self.live.contains_key(&a) || (!self.check_frees && self.is_cached_size(size)) {
                    return;
                }
                self.misuse(
                    &ctx,
                    |ar| ar.free(a, size),
                    |e| {
                        matches!(e, FreeError::NotAllocated { addr } if *addr == a)
                            || matches!(e, FreeError::SizeMismatch { addr, given, .. }
                            if *addr == a && *given == size)
                    },
                );
            }
            VmemOp::WrongSizeFree { pick, quanta } => {
                let Some((a, l)) = self.pick_live(pick) else {
                    return;
                };
                let size = u64::from(quanta % 72 + 1) * q;
                if size == l.size || (!self.check_frees && self.is_cached_size(size)) {
                    return;
                }
                let via_cache = l.via_cache;
                let allocated = l.size;
                self.misuse(
                    &ctx,
                    |ar| ar.free(a, size),
                    |e| match e {
                        FreeError::SizeMismatch {
                            addr,
                            allocated: al,
                            given,
                        } => *addr == a && *given == size && *al == allocated,
                        FreeError::NotAllocated { addr } => via_cache && *addr == a,
                        // Unaligned, or a variant added later: not the error expected here.
                        _ => false,
                    },
                );
            }
            VmemOp::ForeignFree { offset, quanta } => {
                let a = self.spans[0]
                    .0
                    .wrapping_add(u64::from(offset % 512) * q)
                    .wrapping_sub(8 * q);
                let size = u64::from(quanta % 16 + 1) * q;
                if self.live.contains_key(&a) || (!self.check_frees && self.is_cached_size(size)) {
                    return;
                }
                self.misuse(
                    &ctx,
                    |ar| ar.free(a, size),
                    |e| {
                        matches!(e, FreeError::NotAllocated { addr } if *addr == a)
                            || matches!(e, FreeError::SizeMismatch { addr, given, .. }
                            if *addr == a && *given == size)
                    },
                );
            }
            VmemOp::UnalignedFree { pick, size } => {
                let Some((a, l)) = self.pick_live(pick) else {
                    return;
                };
                if q == 1 {
                    // Everything is aligned to one byte: use the zero size instead.
                    self.misuse(
                        &ctx,
                        |ar| ar.free(a, 0),
                        |e| *e == FreeError::Unaligned { addr: a, size: 0 },
                    );
                    return;
                }
                // With a quantum above one byte, `a + 1` stays below the span's end.
                let (fa, fs) = if size {
                    (a, l.size + 1)
                } else {
                    (a + 1, l.size)
                };
                self.misuse(
                    &ctx,
                    |ar| ar.free(fa, fs),
                    |e| *e == FreeError::Unaligned { addr: fa, size: fs },
                );
            }
            VmemOp::Split { pick, piece } => {
                let Some((a, l)) = self.pick_live(pick) else {
                    return;
                };
                if l.via_cache && !self.check_frees {
                    // A trusted free may have put an arena segment into a cache.
                    return;
                }
                if l.via_cache {
                    // A cached object is not the caller's segment to split.
                    self.misuse(
                        &ctx,
                        |ar| ar.split(a, l.size, q),
                        |e| matches!(e, FreeError::NotAllocated { addr } if *addr == a),
                    );
                    return;
                }
                let p = u64::from(piece % 8) * q;
                if p == 0 || l.size % p != 0 {
                    self.misuse(
                        &ctx,
                        |ar| ar.split(a, l.size, p),
                        |e| {
                            *e == FreeError::Unaligned { addr: a, size: p }
                                || (p == 0
                                    && *e
                                        == FreeError::Unaligned {
                                            addr: a,
                                            size: l.size,
                                        })
                        },
                    );
                    return;
                }
                let r = self.arena.split(a, l.size, p);
                assert_eq!(r, Ok(()), "{ctx}: split of {a:#x}+{:#x}", l.size);
                self.live.remove(&a);
                let n = l.size / p;
                for k in 0..n {
                    self.live.insert(
                        a + k * p,
                        Live {
                            size: p,
                            via_cache: false,
                        },
                    );
                }
                self.allocs += n - 1;
            }
            VmemOp::Reap => {
                self.arena.reap();
                self.check_reaped(&ctx);
            }
            VmemOp::FailEvery { n } => {
                let n = u32::from(n % 8);
                self.arena.set_fail_every(n);
                self.fail_every = u64::from(n);
                self.attempts = 0;
            }
            VmemOp::AddSpan {
                base,
                quanta,
                unaligned,
            } => {
                let b = (4096 + u64::from(base % 256)) * q + u64::from(unaligned && q > 1);
                let size = u64::from(quanta % 64) * q;
                let overlaps = size != 0
                    && self
                        .spans
                        .iter()
                        .any(|&(sb, ss)| b <= sb + (ss - 1) && sb <= b + (size - 1));
                if size == 0 {
                    self.misuse_span(&ctx, b, size, |e| *e == SpanError::Empty);
                } else if b % q != 0 {
                    self.misuse_span(&ctx, b, size, |e| matches!(e, SpanError::Unaligned { .. }));
                } else if overlaps {
                    self.misuse_span(&ctx, b, size, |e| {
                        *e == SpanError::Overlaps { base: b, size }
                    });
                } else {
                    let r = self.arena.add_span(b, size);
                    assert_eq!(r, Ok(()), "{ctx}: add_span");
                    self.spans.push((b, size));
                }
            }
        }
        self.check_stats(&ctx);
    }

    /// The expected outcome of an injection check for a valid attempt.
    fn injected(&mut self) -> bool {
        if self.fail_every == 0 {
            return false;
        }
        self.attempts += 1;
        self.attempts % self.fail_every == 0
    }

    fn check_plain_alloc(&mut self, ctx: &str, size: u64, fit: Fit, r: Result<u64, AllocError>) {
        if size == 0 {
            assert_eq!(r, Err(AllocError::ZeroSize), "{ctx}");
            self.failures += 1;
            return;
        }
        if self.injected() {
            assert_eq!(r, Err(AllocError::Injected), "{ctx}");
            self.failures += 1;
            return;
        }
        let mut c = Constraint::new(size);
        c.fit = fit.policy();
        let via_cache = fit != Fit::Next && self.is_cached_size(size);
        self.check_result(ctx, &c, r, via_cache);
    }

    fn check_xalloc(&mut self, ctx: &str, c: &Constraint, r: Result<u64, AllocError>) {
        if let Some(e) = self.constraint_problem(c) {
            assert_eq!(r, Err(e), "{ctx}: invalid constraint");
            self.failures += 1;
            return;
        }
        if self.injected() {
            assert_eq!(r, Err(AllocError::Injected), "{ctx}");
            self.failures += 1;
            return;
        }
        self.check_result(ctx, c, r, false);
    }

    /// The reference validation of a constraint, in the documented order.
    fn constraint_problem(&self, c: &Constraint) -> Option<AllocError> {
        let q = self.q;
        let bad = |reason| Some(AllocError::BadConstraint { reason });
        if c.size == 0 {
            return Some(AllocError::ZeroSize);
        }
        if c.size % q != 0 {
            return Some(AllocError::Unaligned {
                size: c.size,
                quantum: q,
            });
        }
        if c.align != 0 && !c.align.is_power_of_two() {
            return bad(ConstraintProblem::AlignNotPowerOfTwo);
        }
        let stated = if c.align == 0 { q } else { c.align };
        if c.phase >= stated {
            return bad(ConstraintProblem::PhaseNotBelowAlign);
        }
        if c.phase % q != 0 {
            return bad(ConstraintProblem::PhaseNotQuantumMultiple);
        }
        if c.nocross != 0 {
            if !c.nocross.is_power_of_two() {
                return bad(ConstraintProblem::NocrossNotPowerOfTwo);
            }
            if c.nocross < c.size {
                return bad(ConstraintProblem::NocrossSmallerThanSize);
            }
            if c.phase % c.nocross + c.size > c.nocross {
                return bad(ConstraintProblem::NocrossConflictsWithPhase);
            }
        }
        if c.min > c.max {
            return bad(ConstraintProblem::MinAboveMax);
        }
        let min = c.min.div_ceil(q).checked_mul(q);
        match min {
            Some(m) if m <= c.max && c.max - m >= c.size - 1 => None,
            _ => bad(ConstraintProblem::WindowSmallerThanSize),
        }
    }

    /// Whether an allocation of `c` at `a` satisfies the constraint and lies in free
    /// space of the model.
    fn feasible(&self, c: &Constraint, a: u64) -> bool {
        let q = self.q;
        let align = if c.align == 0 { q } else { c.align.max(q) };
        let Some(last) = a.checked_add(c.size - 1) else {
            return false;
        };
        if a % q != 0 || a & (align - 1) != c.phase || a < c.min || last > c.max {
            return false;
        }
        if c.nocross != 0 && (a ^ last) & !(c.nocross - 1) != 0 {
            return false;
        }
        let in_span = self
            .spans
            .iter()
            .any(|&(b, s)| a >= b && last <= b + (s - 1));
        if !in_span {
            return false;
        }
        !self.overlaps_live(a, last)
    }

    fn overlaps_live(&self, a: u64, last: u64) -> bool {
        if let Some((s, l)) = self.live.range(..=last).next_back() {
            if s + (l.size - 1) >= a {
                return true;
            }
        }
        false
    }

    /// The lowest feasible address for `c`, by exhaustive search over the quanta of
    /// every span.
    fn lowest_feasible(&self, c: &Constraint) -> Option<u64> {
        let mut spans = self.spans.clone();
        spans.sort_unstable();
        for (b, s) in spans {
            let n = s / self.q;
            for k in 0..n {
                let a = b + k * self.q;
                if self.feasible(c, a) {
                    return Some(a);
                }
            }
        }
        None
    }

    fn check_result(
        &mut self,
        ctx: &str,
        c: &Constraint,
        r: Result<u64, AllocError>,
        via_cache: bool,
    ) {
        match r {
            Ok(a) => {
                assert!(
                    self.feasible(c, a),
                    "{ctx}: allocation at {a:#x} is not feasible \
                     (overlap, outside a span or constraint broken); live {:x?}",
                    self.live
                );
                if c.fit == FitPolicy::FirstFit && self.qcache_max == 0 {
                    let best = self.lowest_feasible(c);
                    assert_eq!(Some(a), best, "{ctx}: first-fit is not the lowest");
                }
                self.live.insert(
                    a,
                    Live {
                        size: c.size,
                        via_cache,
                    },
                );
                self.allocs += 1;
                assert!(
                    self.arena.contains_allocated(a),
                    "{ctx}: arena does not know its own allocation {a:#x}"
                );
            }
            Err(AllocError::NoSpace { size }) => {
                assert_eq!(size, c.size, "{ctx}: NoSpace names the size");
                let found = self.lowest_feasible(c);
                assert_eq!(
                    found, None,
                    "{ctx}: NoSpace although {found:x?} is free and feasible; live {:x?}",
                    self.live
                );
                self.failures += 1;
            }
            Err(e) => panic!("{ctx}: unexpected {e:?}"),
        }
    }

    fn misuse<E: std::fmt::Debug>(
        &mut self,
        ctx: &str,
        f: impl FnOnce(&Arena) -> Result<(), E>,
        expect: impl FnOnce(&E) -> bool,
    ) {
        let before = self.arena.stats();
        self.misuses += 1;
        let r = f(&self.arena);
        match r {
            Err(e) => assert!(expect(&e), "{ctx}: wrong error {e:?}"),
            Ok(()) => panic!("{ctx}: misuse accepted"),
        }
        let after = self.arena.stats();
        assert_eq!(
            ArenaStats {
                failures: 0,
                ..before
            },
            ArenaStats {
                failures: 0,
                ..after
            },
            "{ctx}: misuse changed the arena"
        );
    }

    fn misuse_span(
        &mut self,
        ctx: &str,
        b: u64,
        size: u64,
        expect: impl FnOnce(&SpanError) -> bool,
    ) {
        self.misuse(ctx, |ar| ar.add_span(b, size), expect);
    }

    fn check_stats(&self, ctx: &str) {
        let s = self.arena.stats();
        let total: u64 = self.spans.iter().map(|s| s.1).sum();
        let live: u64 = self.live.values().map(|l| l.size).sum();
        assert_eq!(s.spans, self.spans.len() as u64, "{ctx}: spans");
        assert_eq!(s.total, total, "{ctx}: total");
        assert_eq!(s.allocated, live, "{ctx}: allocated != live bytes");
        assert_eq!(
            s.allocated + s.cached + s.free,
            s.total,
            "{ctx}: bytes do not balance"
        );
        assert_eq!(s.allocs, self.allocs, "{ctx}: alloc counter");
        assert_eq!(s.frees, self.frees, "{ctx}: free counter");
        assert_eq!(s.failures, self.failures, "{ctx}: failure counter");
    }

    /// After a reap: nothing cached; the free segments are the model's maximal gaps.
    fn check_reaped(&self, ctx: &str) {
        let s = self.arena.stats();
        assert_eq!(s.cached, 0, "{ctx}: cached after reap");
        let mut gaps = 0u64;
        for &(b, size) in &self.spans {
            let last = b + (size - 1);
            let mut at = b;
            let mut open = false;
            for (&a, l) in self.live.range(b..=last) {
                if a > at {
                    gaps += 1;
                }
                at = a + (l.size - 1);
                open = at < last;
                at = at.wrapping_add(1);
            }
            if self.live.range(b..=last).next().is_none() || open {
                gaps += 1;
            }
        }
        assert_eq!(s.free_segments, gaps, "{ctx}: free segments after reap");
        assert_eq!(
            s.segments,
            gaps + self.live.len() as u64,
            "{ctx}: segments after reap"
        );
    }
}
