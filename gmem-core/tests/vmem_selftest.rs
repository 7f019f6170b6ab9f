//! Self-test of the vmem arena, in the spirit of NVIDIA UVM's range-allocator test:
//! whole-range allocation, every alignment up to 2^63, the top of the 64-bit space,
//! and a long seeded random mix of plain, fit-policy and constrained allocations and
//! frees checked against a brute-force model of which quanta are in use, for every
//! fit policy with and without quantum caches.

use gmem_core::vmem::{
    AllocError, Arena, ArenaConfig, ArenaStats, Constraint, FitPolicy, FreeError,
};

const Q: u64 = 0x1000;
const POLICIES: [FitPolicy; 4] = [
    FitPolicy::InstantFit,
    FitPolicy::BestFit,
    FitPolicy::FirstFit,
    FitPolicy::NextFit,
];

fn arena(quantum: u64, fit: FitPolicy) -> Arena {
    Arena::new(
        ArenaConfig {
            fit,
            ..ArenaConfig::new(quantum)
        },
        None,
    )
    .unwrap()
}

fn balanced(a: &Arena) -> ArenaStats {
    let s = a.stats();
    assert_eq!(s.total, s.allocated + s.cached + s.free, "{s:?}");
    s
}

#[test]
fn the_full_range_allocates_in_one_go_and_nothing_larger_fits() {
    for fit in POLICIES {
        // Byte-granular arena over [1, 2^64): the largest span there is.
        let a = arena(1, fit);
        a.add_span(1, u64::MAX).unwrap();
        assert_eq!(a.alloc(u64::MAX), Ok(1));
        assert_eq!(a.alloc(1), Err(AllocError::NoSpace { size: 1 }));
        a.free(1, u64::MAX).unwrap();
        assert_eq!(a.alloc(u64::MAX), Ok(1), "{fit:?}");
        a.free(1, u64::MAX).unwrap();
        // A smaller span: its size + 1 and u64::MAX do not fit.
        let b = arena(1, fit);
        b.add_span(0x1000, 0x10_0000).unwrap();
        assert_eq!(
            b.alloc(0x10_0001),
            Err(AllocError::NoSpace { size: 0x10_0001 })
        );
        assert_eq!(
            b.alloc(u64::MAX),
            Err(AllocError::NoSpace { size: u64::MAX })
        );
        assert_eq!(b.alloc(0x10_0000), Ok(0x1000));
        assert_eq!(b.alloc(1), Err(AllocError::NoSpace { size: 1 }));
        // Page-granular: [Q, 2^64) is the largest span; it allocates whole.
        let c = arena(Q, fit);
        let all = 0u64.wrapping_sub(Q);
        c.add_span(Q, all).unwrap();
        assert_eq!(c.alloc(all), Ok(Q));
        assert_eq!(c.alloc(Q), Err(AllocError::NoSpace { size: Q }));
        let s = balanced(&c);
        assert_eq!((s.allocated, s.free), (all, 0));
        c.free(Q, all).unwrap();
        assert_eq!(balanced(&c).free, all);
        // And in a smaller one, size + quantum and the largest size do not fit.
        let d = arena(Q, fit);
        d.add_span(0x10000, 0x100000).unwrap();
        assert_eq!(
            d.alloc(0x101000),
            Err(AllocError::NoSpace { size: 0x101000 })
        );
        assert_eq!(d.alloc(all), Err(AllocError::NoSpace { size: all }));
        assert_eq!(
            d.alloc(u64::MAX),
            Err(AllocError::Unaligned {
                size: u64::MAX,
                quantum: Q
            })
        );
        assert_eq!(d.alloc(0x100000), Ok(0x10000));
    }
}

#[test]
fn every_power_of_two_alignment_up_to_two_to_the_63_is_honoured() {
    for quantum in [1, Q] {
        for fit in POLICIES {
            let a = arena(quantum, fit);
            // [quantum, 2^64): every power-of-two-aligned address >= quantum is in it.
            a.add_span(quantum, 0u64.wrapping_sub(quantum)).unwrap();
            let mut got = Vec::new();
            for k in quantum.trailing_zeros()..64 {
                let mut c = Constraint::new(quantum);
                c.align = 1 << k;
                c.fit = fit;
                let x = a.xalloc(&c).unwrap();
                assert_eq!(x % (1 << k), 0, "align 2^{k} {fit:?}");
                got.push(x);
            }
            // The only 2^63-aligned address left is 2^63 itself; it is taken now.
            let mut c = Constraint::new(quantum);
            c.align = 1 << 63;
            assert_eq!(a.xalloc(&c), Err(AllocError::NoSpace { size: quantum }));
            for x in got {
                a.free(x, quantum).unwrap();
            }
            let s = balanced(&a);
            assert_eq!((s.allocated, s.free_segments), (0, 1));
        }
    }
}

#[test]
fn allocations_at_the_very_top_of_the_address_space_do_not_overflow() {
    for fit in POLICIES {
        let a = arena(Q, fit);
        let top = u64::MAX - Q + 1; // the last quantum
        let base = top - 15 * Q;
        a.add_span(base, 16 * Q).unwrap();
        let mut c = Constraint::new(Q);
        c.min = top;
        c.fit = fit;
        assert_eq!(a.xalloc(&c), Ok(top));
        assert!(a.contains_allocated(u64::MAX));
        // max = u64::MAX is "no limit"; a window ending at the top works too.
        let mut c = Constraint::new(2 * Q);
        c.align = 4 * Q;
        c.phase = 2 * Q;
        c.max = u64::MAX;
        c.fit = fit;
        let x = a.xalloc(&c).unwrap();
        assert_eq!(x % (4 * Q), 2 * Q);
        let mut c = Constraint::new(2 * Q);
        c.nocross = 4 * Q;
        c.min = top - 3 * Q;
        c.max = u64::MAX - Q;
        c.fit = fit;
        let y = a.xalloc(&c).unwrap();
        assert!(y >= top - 3 * Q && y + 2 * Q - 1 <= u64::MAX - Q);
        assert_eq!(y / (4 * Q), (y + 2 * Q - 1) / (4 * Q), "crosses nocross");
        // Nothing else fits in the top window: the request is refused, not wrapped.
        let mut c = Constraint::new(2 * Q);
        c.min = top - Q;
        assert_eq!(a.xalloc(&c), Err(AllocError::NoSpace { size: 2 * Q }));
        for (addr, size) in [(top, Q), (x, 2 * Q), (y, 2 * Q)] {
            a.free(addr, size).unwrap();
        }
        assert_eq!(a.alloc(16 * Q), Ok(base));
        a.free(base, 16 * Q).unwrap();
        let s = balanced(&a);
        assert_eq!((s.allocated, s.free_segments), (0, 1));
    }
}

/// xorshift64: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Which quanta of each span are in use, as the arena's callers see it.
struct Model {
    spans: Vec<(u64, Vec<bool>)>,
    live: Vec<(u64, u64)>,
}

impl Model {
    fn locate(&self, addr: u64) -> Option<(usize, usize)> {
        self.spans.iter().enumerate().find_map(|(s, (base, used))| {
            let off = addr.checked_sub(*base)? / Q;
            (off < used.len() as u64).then_some((s, off as usize))
        })
    }

    /// Mark `[addr, +size)` used; it must lie in one span and be entirely free.
    fn take(&mut self, addr: u64, size: u64) {
        let (s, i) = self.locate(addr).expect("allocation outside every span");
        let n = (size / Q) as usize;
        let used = &mut self.spans[s].1;
        assert!(i + n <= used.len(), "allocation crosses its span's end");
        assert!(used[i..i + n].iter().all(|u| !u), "overlap at {addr:#x}");
        used[i..i + n].fill(true);
        self.live.push((addr, size));
    }

    fn release(&mut self, k: usize) -> (u64, u64) {
        let (addr, size) = self.live.swap_remove(k);
        let (s, i) = self.locate(addr).unwrap();
        self.spans[s].1[i..i + (size / Q) as usize].fill(false);
        (addr, size)
    }

    fn used_bytes(&self) -> u64 {
        self.live.iter().map(|l| l.1).sum()
    }

    /// Brute force: does any free placement satisfy `c`?
    fn fits(&self, c: &Constraint) -> bool {
        let n = (c.size / Q) as usize;
        self.spans.iter().any(|(base, used)| {
            (0..used.len().saturating_sub(n - 1)).any(|i| {
                let addr = base + i as u64 * Q;
                let last = addr + (c.size - 1);
                satisfies(addr, c) && last <= c.max && used[i..i + n].iter().all(|u| !u)
            })
        })
    }
}

fn satisfies(addr: u64, c: &Constraint) -> bool {
    let align = c.align.max(Q);
    let last = addr + (c.size - 1);
    addr % align == c.phase
        && (c.nocross == 0 || addr / c.nocross == last / c.nocross)
        && addr >= c.min
        && last <= c.max
}

/// A random constraint that is valid by construction.
fn random_constraint(rng: &mut Rng, spans: &[(u64, u64)], fit: FitPolicy) -> Constraint {
    let mut c = Constraint::new((rng.below(8) + 1) * Q);
    c.fit = fit;
    if rng.below(2) == 0 {
        c.align = Q << rng.below(7);
        c.phase = rng.below(c.align / Q) * Q;
    }
    if rng.below(3) == 0 {
        let nocross = Q << (3 + rng.below(3));
        if (c.phase % nocross) + c.size <= nocross {
            c.nocross = nocross;
        }
    }
    if rng.below(3) == 0 {
        // A window inside one span (possibly the one ending at 2^64), at least as
        // large as the request.
        let (base, quanta) = spans[rng.below(spans.len() as u64) as usize];
        let n = c.size / Q;
        let lo = rng.below(quanta - n + 1);
        c.min = base + lo * Q;
        let end = (lo + n + rng.below(quanta)).min(quanta);
        c.max = if rng.below(2) == 0 {
            u64::MAX
        } else {
            base + (end * Q - 1)
        };
    }
    c
}

#[derive(Clone, Copy, Debug)]
enum Caches {
    Off,
    StackChecked,
    MagazinesChecked,
    MagazinesTrusted,
}

fn random_mix(fit: FitPolicy, caches: Caches, seed: u64) {
    let mut cfg = ArenaConfig {
        fit,
        ..ArenaConfig::new(Q)
    };
    match caches {
        Caches::Off => {}
        Caches::StackChecked => cfg.qcache_max = 8 * Q,
        Caches::MagazinesChecked => {
            cfg.qcache_max = 8 * Q;
            cfg.magazines = true;
        }
        Caches::MagazinesTrusted => {
            cfg.qcache_max = 8 * Q;
            cfg.magazines = true;
            cfg.check_frees = false;
        }
    }
    let checked = cfg.check_frees || cfg.qcache_max == 0;
    let a = Arena::new(cfg, None).unwrap();
    // A low span and one ending exactly at 2^64.
    let spans = [
        (0x4000_0000u64, 1024u64),
        (0u64.wrapping_sub(1024 * Q), 1024),
    ];
    for &(base, quanta) in &spans {
        a.add_span(base, quanta * Q).unwrap();
    }
    let mut m = Model {
        spans: spans
            .iter()
            .map(|&(b, n)| (b, vec![false; n as usize]))
            .collect(),
        live: Vec::new(),
    };
    let mut rng = Rng(seed);
    let ctx = format!("{fit:?} {caches:?} seed {seed:#x}");

    // Fill everything with single quanta.
    loop {
        match a.alloc(Q) {
            Ok(x) => m.take(x, Q),
            Err(AllocError::NoSpace { .. }) => break,
            Err(e) => panic!("{ctx}: {e:?}"),
        }
    }
    assert_eq!(m.live.len(), 2048, "{ctx}: fill");
    assert_eq!(balanced(&a).allocated, 2048 * Q);

    // Outcomes of alloc_fit and xalloc: [ok, no space] each.
    let mut outcomes = [[0u32; 2]; 2];
    for step in 0..6000 {
        // A crowded first half, then one where frees win and the arena empties out.
        let [free_below, alloc_below, xalloc_below] = if step < 3000 {
            [8, 14, 18]
        } else {
            [11, 15, 19]
        };
        let op = rng.below(20);
        if op < free_below && !m.live.is_empty() {
            let k = rng.below(m.live.len() as u64) as usize;
            let (addr, size) = m.release(k);
            a.free(addr, size)
                .unwrap_or_else(|e| panic!("{ctx} step {step}: {e:?}"));
            if checked && rng.below(4) == 0 {
                // Double free: refused, nothing changes.
                let before = a.stats();
                assert_eq!(
                    a.free(addr, size),
                    Err(FreeError::NotAllocated { addr }),
                    "{ctx}"
                );
                assert_eq!(a.stats().free, before.free);
            }
        } else if op < alloc_below {
            let size = (rng.below(12) + 1) * Q;
            let policy = if rng.below(2) == 0 {
                fit
            } else {
                POLICIES[rng.below(4) as usize]
            };
            match a.alloc_fit(size, policy) {
                Ok(x) => {
                    m.take(x, size);
                    outcomes[0][0] += 1;
                }
                Err(AllocError::NoSpace { .. }) => {
                    assert!(
                        !m.fits(&Constraint::new(size)),
                        "{ctx} step {step}: lost space"
                    );
                    outcomes[0][1] += 1;
                }
                Err(e) => panic!("{ctx}: {e:?}"),
            }
        } else if op < xalloc_below {
            let c = random_constraint(&mut rng, &spans, fit);
            match a.xalloc(&c) {
                Ok(x) => {
                    assert!(satisfies(x, &c), "{ctx} step {step}: {x:#x} violates {c:?}");
                    m.take(x, c.size);
                    outcomes[1][0] += 1;
                }
                Err(AllocError::NoSpace { .. }) => {
                    assert!(!m.fits(&c), "{ctx} step {step}: {c:?} had a fit");
                    outcomes[1][1] += 1;
                }
                Err(e) => panic!("{ctx} step {step}: {c:?}: {e:?}"),
            }
        } else if checked && !m.live.is_empty() {
            // Wrong size: refused, nothing changes.
            let (addr, size) = m.live[rng.below(m.live.len() as u64) as usize];
            let before = a.stats();
            assert_eq!(
                a.free(addr, size + Q),
                Err(FreeError::SizeMismatch {
                    addr,
                    allocated: size,
                    given: size + Q
                }),
                "{ctx}"
            );
            assert_eq!(a.stats().allocated, before.allocated);
        }
        let s = balanced(&a);
        assert_eq!(s.allocated, m.used_bytes(), "{ctx} step {step}");
        if step % 64 == 0 {
            for &(addr, size) in m.live.iter().take(8) {
                assert!(a.contains_allocated(addr + size - 1), "{ctx}");
            }
        }
    }

    // The mix must have exercised both outcomes of both kinds of allocation.
    assert!(
        outcomes.iter().flatten().all(|&n| n >= 50),
        "{ctx}: {outcomes:?}"
    );

    while !m.live.is_empty() {
        let (addr, size) = m.release(0);
        a.free(addr, size).unwrap();
    }
    a.reap();
    let s = balanced(&a);
    assert_eq!(
        (s.allocated, s.cached, s.free, s.free_segments, s.segments),
        (0, 0, 2048 * Q, 2, 2),
        "{ctx}: arena not empty"
    );
    assert_eq!(s.allocs, s.frees, "{ctx}");
}

#[test]
fn random_mix_matches_the_model_for_every_policy_with_and_without_caches() {
    for (i, fit) in POLICIES.into_iter().enumerate() {
        for (j, caches) in [
            Caches::Off,
            Caches::StackChecked,
            Caches::MagazinesChecked,
            Caches::MagazinesTrusted,
        ]
        .into_iter()
        .enumerate()
        {
            random_mix(fit, caches, 0x5eed_0000 + (i * 4 + j) as u64 * 0x9e37_79b9);
        }
    }
}
