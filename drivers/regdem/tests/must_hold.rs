//! The properties issue 14 requires, on small grids so debug-mode runs take seconds.

use gmem_regdem::demote::{demote, DemoteError, Options, Space, Strategy};
use gmem_regdem::interp;
use gmem_regdem::kernels::Bench;
use gmem_regdem::liveness;
use gmem_regdem::sched::BarrierPolicy;
use gmem_regdem::sim::{simulate, SimConfig, SimError};
use gmem_regdem::variants::{self, ablations, Kind};
use gmem_regdem::SmConfig;

fn small_benches() -> Vec<Bench> {
    vec![
        Bench::Sgemm {
            tm: 4,
            tn: 4,
            k: 16,
        },
        Bench::SgemmPrefetch {
            tm: 6,
            tn: 4,
            k: 16,
        },
        Bench::Nbody {
            unroll: 8,
            tiles: 1,
        },
        Bench::Stencil {
            outputs: 20,
            tiles: 1,
        },
        Bench::Butterfly { batches: 1 },
        Bench::Gather {
            coeffs: 32,
            trips: 2,
        },
    ]
}

#[test]
fn every_variant_is_bit_identical_to_the_baseline_on_random_inputs() {
    let sm = SmConfig::maxwell();
    let mut demoted_variants = 0;
    for bench in small_benches() {
        let k = bench.build(1).unwrap();
        let vs = variants::generate(&k, &sm);
        for seed in [11u64, 12] {
            let g0 = interp::init_global(&k, seed);
            let mut g = g0.clone();
            interp::run(&k, &mut g).unwrap();
            let base = interp::outputs(&k, &g);
            assert_eq!(base, bench.reference(&k, &g0), "{} reference", bench.name());
            for v in &vs {
                let out = interp::run_outputs(&v.kernel, seed).unwrap();
                assert_eq!(out, base, "{} {} seed {seed}", bench.name(), v.name);
                if v.kind != Kind::Baseline {
                    demoted_variants += 1;
                }
            }
        }
    }
    assert!(
        demoted_variants > 20,
        "only {demoted_variants} variants checked"
    );
}

#[test]
fn demoted_accesses_cause_zero_bank_conflicts_and_no_hazards() {
    let sm = SmConfig::maxwell();
    let cfg = SimConfig {
        strict: true,
        ..SimConfig::maxwell()
    };
    for bench in [
        Bench::Sgemm {
            tm: 4,
            tn: 4,
            k: 16,
        },
        Bench::Butterfly { batches: 1 },
    ] {
        let k = bench.build(2).unwrap();
        for s in Strategy::ALL {
            let d = demote(&k, &sm, &Options::regdem(s, 40)).unwrap();
            let mut g = interp::init_global(&k, 3);
            let st = simulate(&d.kernel, &sm, &cfg, &mut g).unwrap();
            assert!(st.spill_shared_accesses > 0, "{} {:?}", bench.name(), s);
            assert_eq!(st.spill_bank_conflicts, 0, "{} {:?}", bench.name(), s);
            assert_eq!(st.poisoned, 0);
            // The kernel's own shared accesses do conflict (the counter can count).
            assert!(
                st.bank_conflicts > 0
                    || bench
                        != (Bench::Sgemm {
                            tm: 4,
                            tn: 4,
                            k: 16
                        })
            );
        }
    }
}

#[test]
fn a_pass_that_skips_barrier_waits_is_caught_by_the_poisoned_read_check() {
    let sm = SmConfig::maxwell();
    let strict = SimConfig {
        strict: true,
        ..SimConfig::maxwell()
    };
    let k = Bench::Sgemm {
        tm: 4,
        tn: 4,
        k: 16,
    }
    .build(1)
    .unwrap();
    let good = demote(&k, &sm, &Options::regdem(Strategy::LoopWeighted, 40)).unwrap();
    let broken = demote(
        &k,
        &sm,
        &Options {
            broken_skip_spill_load_waits: true,
            ..Options::regdem(Strategy::LoopWeighted, 40)
        },
    )
    .unwrap();
    let g0 = interp::init_global(&k, 5);
    assert!(simulate(&good.kernel, &sm, &strict, &mut g0.clone()).is_ok());
    match simulate(&broken.kernel, &sm, &strict, &mut g0.clone()) {
        Err(SimError::Poisoned(p)) => {
            let inst = &broken.kernel.blocks[p.block].insts[p.inst];
            assert!(inst.reads().contains(&p.reg), "{inst}");
        }
        other => panic!("broken pass not caught: {other:?}"),
    }
    // Non-strict mode counts them all.
    let lax = SimConfig::maxwell();
    let st = simulate(&broken.kernel, &sm, &lax, &mut g0.clone()).unwrap();
    assert!(st.poisoned > 0);
}

#[test]
fn compaction_reaches_the_live_register_bound() {
    let sm = SmConfig::maxwell();
    for bench in small_benches() {
        let k = bench.build(1).unwrap();
        for t in variants::cliffs(&k, &sm, 2) {
            for s in Strategy::ALL {
                let Ok(d) = demote(&k, &sm, &Options::regdem(s, t)) else {
                    continue;
                };
                let regs = d.kernel.registers();
                let mut used = std::collections::BTreeSet::new();
                for i in d.kernel.insts() {
                    used.extend(i.reads());
                    used.extend(i.writes());
                }
                // No gap is left: the count equals the registers in use (the bound for any
                // renaming) ...
                assert_eq!(regs as usize, used.len(), "{} {:?}@{t}", bench.name(), s);
                // ... which is the maximum live count up to the reserved value/address
                // registers' own alignment slack.
                let live = liveness::max_live(&d.kernel) as u32;
                assert!(
                    regs <= live + 2,
                    "{} {:?}@{t}: {regs} vs live {live}",
                    bench.name(),
                    s
                );
                assert!(regs <= t, "{} {:?}: {regs} > target {t}", bench.name(), s);
                assert!(d.registers_before_compaction > regs);
            }
        }
    }
}

#[test]
fn ablations_show_compaction_and_the_barrier_tracker_matter() {
    let sm = SmConfig::maxwell();
    let cfg = SimConfig::maxwell();
    // The prefetching SGEMM keeps global loads in flight on scoreboard barriers across
    // its whole compute phase, where the spill code lives.
    let bench = Bench::SgemmPrefetch {
        tm: 4,
        tn: 4,
        k: 32,
    };
    let a = ablations(bench, 4, 9, &sm, &cfg).unwrap();
    let get = |n: &str| a.iter().find(|x| x.config == n).unwrap();
    let full = get("regdem");
    let no_compact = get("no-compaction");
    let no_tracker = get("no-barrier-tracker");
    assert!(a.iter().all(|x| x.verified));
    // Without compaction the register count does not fall, so occupancy does not rise.
    assert!(no_compact.registers > full.registers);
    assert!(no_compact.warps < full.warps);
    // Without the tracker (every spill access on barrier 0), consumers of spilled values
    // also wait for the global prefetch that holds barrier 0: the simulator measures
    // how long they were held by their wait masks.
    assert!(
        no_tracker.spill_barrier_stall > full.spill_barrier_stall * 3 / 2,
        "tracker {} vs fixed barrier {} stall cycles",
        full.spill_barrier_stall,
        no_tracker.spill_barrier_stall
    );
}

#[test]
fn bad_requests_get_typed_errors_and_leave_the_kernel_alone() {
    let sm = SmConfig::maxwell();
    let k = Bench::Sgemm {
        tm: 4,
        tn: 4,
        k: 16,
    }
    .build(1)
    .unwrap();
    let before = k.clone();
    assert_eq!(
        demote(&k, &sm, &Options::regdem(Strategy::Static, 64)).unwrap_err(),
        DemoteError::NothingToDo
    );
    assert!(matches!(
        demote(&k, &sm, &Options::regdem(Strategy::Static, 4)),
        Err(DemoteError::TargetUnreachable { .. })
    ));
    // A stencil with a large tile cannot fit its demotion area in 48 KiB.
    let st = Bench::Stencil {
        outputs: 40,
        tiles: 1,
    }
    .build(1)
    .unwrap();
    assert!(matches!(
        demote(&st, &sm, &Options::regdem(Strategy::LoopWeighted, 32)),
        Err(DemoteError::SharedTooSmall { .. }) | Err(DemoteError::TargetUnreachable { .. })
    ));
    assert_eq!(k, before);
    assert!(Bench::Sgemm {
        tm: 3,
        tn: 4,
        k: 16
    }
    .build(1)
    .is_err());
    // A gather with one coefficient, or arrays beyond a 32-bit address space.
    for (coeffs, trips, grid) in [(1, 4, 1), (8, 0, 1), (8, 1 << 20, 1 << 12)] {
        assert_eq!(
            Bench::Gather { coeffs, trips }.build(grid).unwrap_err(),
            gmem_regdem::ir::IrError::BadParameter
        );
    }
    // Local-memory spills need no address register.
    let l = demote(&k, &sm, &Options::local_cap(40)).unwrap();
    assert!(l.kernel.local_bytes > 0 && l.kernel.spill_shared == 0);
    assert_eq!(Options::local_cap(40).space, Space::Local);
    let _ = BarrierPolicy::Tracker;
}

#[test]
fn interpreter_rejects_out_of_range_accesses() {
    let mut k = Bench::Sgemm {
        tm: 4,
        tn: 4,
        k: 16,
    }
    .build(1)
    .unwrap();
    k.global_words = 16;
    let mut g = vec![0u32; 16];
    assert!(matches!(
        interp::run(&k, &mut g),
        Err(interp::ExecError::Global(_))
    ));
}

#[test]
fn fp64_pairs_are_demoted_whole_through_an_aligned_value_pair() {
    let sm = SmConfig::maxwell();
    let k = Bench::Butterfly { batches: 1 }.build(1).unwrap();
    let pair_bases: std::collections::BTreeSet<u8> =
        k.insts().flat_map(|i| i.pair_bases()).collect();
    let mut saw_pair = false;
    for s in Strategy::ALL {
        let d = demote(&k, &sm, &Options::regdem(s, 32)).unwrap();
        for &r in &d.demoted {
            if pair_bases.contains(&r) {
                saw_pair = true;
                assert!(
                    d.demoted.contains(&(r + 1)),
                    "{s:?}: R{r} demoted without R{}",
                    r + 1
                );
            }
        }
        d.kernel.validate().unwrap();
        assert_eq!(
            interp::run_outputs(&d.kernel, 21).unwrap(),
            interp::run_outputs(&k, 21).unwrap()
        );
    }
    assert!(saw_pair, "no strategy demoted an FP64 pair");
}
