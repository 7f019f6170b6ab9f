//! The issue's must-hold tests on the whole machine: every workload verifies under
//! every configuration; the granularity bit is really used; page groups never mix
//! modes; placement depends only on the descriptor or another input's profile; every
//! configuration is priced with the same bandwidths; a migration that finds no coarse
//! slot in its stack falls back to fine grain and is counted.

use crate::coda::{plan, profiles, run, Config, Inputs};
use crate::config::{CacheModel, HbmConfig, SmModel};
use crate::decode::Granularity;
use crate::exec::{Exec, ExecOptions, Schedule};
use crate::graphs::{Algo, GraphKind, GraphWork};
use crate::machine::HbmMachine;
use crate::memory::{Requester, CHUNK};
use crate::workloads::*;
use gmem_core::PAGE_SIZE;
use std::boxed::Box;
use std::collections::{HashMap, HashSet};
use std::vec::Vec;

fn cfg() -> HbmConfig {
    HbmConfig {
        stack_bytes: 4 << 20,
        ..HbmConfig::default()
    }
}

fn small() -> Vec<Box<dyn Workload>> {
    std::vec![
        Box::new(VecAdd { n: 8192 }),
        Box::new(KMeans { n: 4096 }),
        Box::new(Hotspot {
            rows: 64,
            cols: 256,
            rows_per_block: 2,
            steps: 2,
        }),
        Box::new(Sgemm { n: 64 }),
        Box::new(Atax { n: 64 }),
        Box::new(Backprop { n: 4096 }),
        Box::new(GraphWork::new(Algo::Bfs, GraphKind::Uniform, 2048, 4, 1)),
        Box::new(GraphWork::new(Algo::Bfs, GraphKind::Rmat, 2048, 4, 2)),
        Box::new(GraphWork::new(
            Algo::PageRank(2),
            GraphKind::Uniform,
            2048,
            4,
            3
        )),
        Box::new(GraphWork::new(
            Algo::PageRank(2),
            GraphKind::Rmat,
            2048,
            4,
            4
        )),
        Box::new(GraphWork::new(Algo::Sssp, GraphKind::Uniform, 2048, 4, 5)),
        Box::new(GraphWork::new(Algo::Sssp, GraphKind::Rmat, 2048, 4, 6)),
        Box::new(GraphWork::new(Algo::Dc, GraphKind::Uniform, 2048, 4, 7)),
        Box::new(GraphWork::new(Algo::Dc, GraphKind::Rmat, 2048, 4, 8)),
        Box::new(crate::gaussian::Gaussian { n: 24 }),
        Box::new(crate::hotspot2d::Hotspot2d {
            rows: 32,
            cols: 512,
            tile: 16,
            steps: 2,
        }),
    ]
}

/// The SSSP reference (Dijkstra) agrees with plain Bellman-Ford relaxation to a fixed
/// point, and DC's reference counts every edge twice (once at each end).
#[test]
fn the_sssp_and_dc_references_agree_with_brute_force() {
    use crate::graphs::{dc_ref, sssp_ref, weight};
    use gmem_simt::workloads::graph::rmat;
    let g = rmat(9, 4, 11);
    let n = g.nodes();
    let mut d = std::vec![u32::MAX; n];
    d[0] = 0;
    loop {
        let mut changed = false;
        for u in 0..n {
            if d[u] == u32::MAX {
                continue;
            }
            for &v in &g.col[g.row[u] as usize..g.row[u + 1] as usize] {
                let nd = d[u] + weight(u as u32, v);
                if nd < d[v as usize] {
                    d[v as usize] = nd;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    assert_eq!(sssp_ref(&g, 0), d);
    assert!(d.iter().filter(|&&x| x != u32::MAX).count() > 1);
    let dc = dc_ref(&g);
    assert_eq!(
        dc.iter().map(|&x| u64::from(x)).sum::<u64>(),
        2 * g.col.len() as u64
    );
}

#[test]
fn every_workload_verifies_under_every_configuration_and_on_the_host() {
    let c = cfg();
    for w in small() {
        let mut inputs = Inputs {
            profiles: profiles(&c, w.as_ref()).unwrap(),
            ..Inputs::default()
        };
        let mut remote = HashMap::new();
        for config in Config::ALL {
            let r = run(&c, w.as_ref(), config, false, &inputs).unwrap();
            assert!(r.verified, "{} under {}", w.name(), config.name());
            if config == Config::FgpAffinity {
                inputs.first_stack = r.report.first_stack.clone();
            }
            remote.insert(config, r.report.traffic().remote_fraction());
        }
        // Fine grain spreads every page: about three quarters of SM traffic is remote.
        assert!(remote[&Config::Fgp] > 0.5, "{}: {remote:?}", w.name());
        for config in [Config::Fgp, Config::Coda] {
            let r = run(&c, w.as_ref(), config, true, &inputs).unwrap();
            assert!(
                r.verified,
                "{} on the host under {}",
                w.name(),
                config.name()
            );
            assert!(r.report.host_ns > 0.0);
        }
    }
}

#[test]
fn coda_keeps_block_exclusive_data_local() {
    let c = cfg();
    let w = VecAdd { n: 16384 };
    let none = Inputs::default();
    let fgp = run(&c, &w, Config::Fgp, false, &none).unwrap();
    let coda = run(&c, &w, Config::Coda, false, &none).unwrap();
    assert!(coda.verified && fgp.verified);
    assert_eq!(
        coda.report.traffic().remote,
        0,
        "vector add is block-exclusive"
    );
    assert!(coda.report.time_ns(&c) < fgp.report.time_ns(&c));
    assert!(coda.groups.1 > 0 && coda.placement_fallbacks == 0);
}

#[test]
fn the_sm_model_prices_what_each_sm_really_did() {
    // 128 blocks: more than one round of affinity's 24-block grain per stack, so
    // every SM runs blocks under CODA too.
    let n = 32768u64;
    let w = VecAdd { n };
    for (k, cache) in [Config::Fgp, Config::Coda]
        .into_iter()
        .flat_map(|k| [(k, CacheModel::default()), (k, CacheModel::off())])
    {
        let c = HbmConfig { cache, ..cfg() };
        let r = run(&c, &w, k, false, &Inputs::default()).unwrap();
        let loads = &r.report.sm_loads[0];
        // Two words loaded, one stored and one add per element, over all SMs.
        let ops: u64 = loads.iter().map(|l| l.thread_ops).sum();
        assert_eq!(ops, 4 * n);
        // The per-SM bytes (their misses) and the L2s' write-backs add up to the
        // launch's SM traffic; without caches every access is the SM's own.
        let t = r.report.traffic();
        let local: u64 = loads.iter().map(|l| l.local).sum();
        let remote: u64 = loads.iter().map(|l| l.remote).sum();
        let wb = r.report.cache.writebacks * CHUNK;
        assert_eq!(local + remote + wb, t.local + t.remote);
        if cache.enabled {
            // Streaming: each input line missed once, each output line written back once.
            assert_eq!(r.report.cache.misses * CHUNK, 2 * n * 4);
            assert_eq!(wb, n * 4);
            let hits: u64 = loads.iter().map(|l| l.l1_hits).sum();
            assert_eq!(hits, r.report.cache.l1_hits);
        } else {
            assert_eq!((r.report.cache.writebacks, r.report.cache.l1_hits), (0, 0));
        }
        assert!(
            loads.iter().all(|l| l.thread_ops > 0),
            "every SM ran blocks"
        );
    }
}

#[test]
fn sgemm_issues_its_loads_its_multiply_adds_and_its_tile_reads() {
    let n = 64u64;
    let r = run(
        &cfg(),
        &Sgemm { n },
        Config::Coda,
        false,
        &Inputs::default(),
    )
    .unwrap();
    let ops: u64 = r.report.sm_loads[0].iter().map(|l| l.thread_ops).sum();
    // Per block of ROWS_PER_BLOCK rows: its rows of A and all of B loaded, its rows
    // of C stored, one multiply-add per (row, column, k) and two tile reads for it.
    let k = ROWS_PER_BLOCK;
    let per_block = k * n + n * n + k * n + 3 * k * n * n;
    assert_eq!(ops, n / k * per_block);
}

#[test]
fn flipping_a_pages_granularity_bit_without_moving_its_data_fails_verification() {
    let c = cfg();
    let w = VecAdd { n: 8192 };
    for coarse in [false, true] {
        let m = HbmMachine::new(c).unwrap();
        let objects = w.objects();
        let regions: Vec<_> = objects.iter().map(|o| m.alloc(o.bytes).unwrap()).collect();
        let base: Vec<u64> = regions.iter().map(|r| r.start.as_u64()).collect();
        if coarse {
            for (r, a) in regions.iter().zip(plan(&c, &objects, &base, &[])) {
                m.set_attrs(*r, a).unwrap();
            }
        }
        w.init(&m, &base).unwrap();
        let opts = ExecOptions {
            schedule: Schedule::Affinity,
            migrate_on_first_touch: false,
            profile: false,
        };
        let mut x = Exec::new(&m, opts, &[]).unwrap();
        w.run(&mut x, &base).unwrap();
        assert!(w.verify(&m, &base).unwrap());
        // The second page of the result: its frame's mode is as placed.
        let va = base[2] + PAGE_SIZE;
        let want = if coarse {
            Granularity::Coarse
        } else {
            Granularity::Fine
        };
        assert_eq!(m.placement_of(va).unwrap().0, want);
        m.flip_granularity_bit(regions[2], va).unwrap();
        assert_eq!(m.placement_of(va).unwrap().0, want, "the data did not move");
        assert!(
            !w.verify(&m, &base).unwrap(),
            "a wrong bit must read other bytes (coarse = {coarse})"
        );
        m.check_invariants().unwrap();
    }
}

#[test]
fn a_page_group_never_mixes_modes() {
    let c = cfg();
    // A sharing workload (fine and coarse objects side by side) under CODA and the
    // per-page oracle placement.
    let w = Sgemm { n: 64 };
    let first = run(&c, &w, Config::FgpAffinity, false, &Inputs::default()).unwrap();
    let inputs = Inputs {
        first_stack: first.report.first_stack,
        ..Inputs::default()
    };
    for config in [
        Config::Coda,
        Config::FirstTouchOracle,
        Config::FirstTouchMigrate,
    ] {
        let m = HbmMachine::new(c).unwrap();
        let objects = w.objects();
        let regions: Vec<_> = objects.iter().map(|o| m.alloc(o.bytes).unwrap()).collect();
        let base: Vec<u64> = regions.iter().map(|r| r.start.as_u64()).collect();
        if config == Config::Coda {
            for (r, a) in regions.iter().zip(plan(&c, &objects, &base, &[])) {
                m.set_attrs(*r, a).unwrap();
            }
        }
        if config == Config::FirstTouchOracle {
            crate::coda::place_oracle(&m, &regions, &objects, &inputs.first_stack).unwrap();
        }
        w.init(&m, &base).unwrap();
        let opts = ExecOptions {
            schedule: Schedule::Affinity,
            migrate_on_first_touch: config == Config::FirstTouchMigrate,
            profile: false,
        };
        let with_len: Vec<_> = regions
            .iter()
            .zip(&objects)
            .map(|(r, o)| (*r, o.bytes))
            .collect();
        let mut x = Exec::new(&m, opts, &with_len).unwrap();
        w.run(&mut x, &base).unwrap();
        assert!(w.verify(&m, &base).unwrap());
        m.check_invariants().unwrap();
        let mut modes: HashMap<u64, HashSet<Granularity>> = HashMap::new();
        for (r, o) in regions.iter().zip(&objects) {
            for p in 0..o.bytes.div_ceil(PAGE_SIZE) {
                let pa = m.frame(r.start.as_u64() + p * PAGE_SIZE).unwrap();
                let g = m.memory().granularity(pa).unwrap();
                modes
                    .entry(pa.as_u64() / c.group_bytes())
                    .or_default()
                    .insert(g);
            }
        }
        assert!(modes.values().all(|s| s.len() == 1), "{config:?}");
        let (fine, coarse) = m.page_groups();
        assert!(fine > 0 && coarse > 0, "{config:?}: both modes in use");
    }
}

#[test]
fn placement_uses_only_the_descriptor_or_another_inputs_profile() {
    let c = cfg();
    let a = GraphWork::new(Algo::PageRank(1), GraphKind::Uniform, 2048, 4, 10);
    let b = GraphWork::new(Algo::PageRank(1), GraphKind::Uniform, 2048, 4, 20);
    // The profile comes from another input than the one measured...
    let other = a.other_input().unwrap();
    assert_ne!(other.name(), "", "another input exists");
    let prof = profiles(&c, &a).unwrap();
    assert!(prof.iter().any(|p| p.is_some()));
    // ...and the plan depends on nothing but descriptors and profiles: two different
    // inputs of the same shape get the same placement at the same addresses.
    let base: Vec<u64> = (0..a.objects().len() as u64)
        .map(|i| (i + 1) << 24)
        .collect();
    assert_eq!(
        plan(&c, &a.objects(), &base, &prof),
        plan(&c, &b.objects(), &base, &prof)
    );
    // Without a profile an input-dependent object stays fine grain.
    let bare = plan(&c, &a.objects(), &base, &[]);
    for (o, p) in a.objects().iter().zip(bare) {
        if o.descriptor == Descriptor::Profile {
            assert_eq!(p.granularity, Granularity::Fine, "{}", o.name);
        }
    }
}

#[test]
fn every_configuration_is_priced_with_the_same_cost_model() {
    let c = cfg();
    let w = KMeans { n: 4096 };
    let results: Vec<_> = Config::ALL
        .iter()
        .map(|&k| run(&c, &w, k, false, &Inputs::default()).unwrap())
        .collect();
    // Doubling every bandwidth and the SMs' speed (clock, latencies) halves every
    // configuration's time: time is traffic and work over the one configuration's
    // parameters, nothing per design.
    let fast = HbmConfig {
        local_gbps: c.local_gbps * 2.0,
        host_gbps: c.host_gbps * 2.0,
        remote_gbps: c.remote_gbps * 2.0,
        sm: SmModel {
            ghz: c.sm.ghz * 2.0,
            local_latency_ns: c.sm.local_latency_ns / 2.0,
            remote_hop_ns: c.sm.remote_hop_ns / 2.0,
            ..c.sm
        },
        cache: CacheModel {
            l1_hit_ns: c.cache.l1_hit_ns / 2.0,
            l2_hit_ns: c.cache.l2_hit_ns / 2.0,
            ..c.cache
        },
        ..c
    };
    for r in &results {
        let (t, f) = (r.report.time_ns(&c), r.report.time_ns(&fast));
        assert!(t > 0.0 && (t / f - 2.0).abs() < 1e-9);
    }
}

#[test]
fn a_migration_that_finds_no_coarse_slot_in_its_stack_goes_fine_and_is_counted() {
    // Eight page groups: at most eight stack-1 slots, one group kept fine.
    let c = HbmConfig {
        stack_bytes: 8 * PAGE_SIZE,
        ..cfg()
    };
    let m = HbmMachine::new(c).unwrap();
    let a = m.alloc(3 * PAGE_SIZE).unwrap();
    m.store(Requester::Host, a.start.as_u64(), &[7u8; 3 * 4096])
        .unwrap();
    let b = m.alloc(8 * PAGE_SIZE).unwrap();
    let data: Vec<u8> = (0..8 * PAGE_SIZE).map(|i| (i % 253) as u8).collect();
    m.store(Requester::Host, b.start.as_u64(), &data).unwrap();
    let before = m.stats().placement_fallbacks;
    let mut fine = 0;
    for p in 0..8 {
        let va = b.start.as_u64() + p * PAGE_SIZE;
        match m.migrate_page(b, Requester::Sm(4), va, 1).unwrap().unwrap() {
            (Granularity::Coarse, s) => assert_eq!(s, 1),
            (Granularity::Fine, _) => fine += 1,
        }
    }
    assert!(fine >= 1, "eight pages cannot all find a stack-1 slot");
    assert_eq!(m.stats().placement_fallbacks - before, fine);
    let mut back = std::vec![0u8; data.len()];
    m.load(Requester::Host, b.start.as_u64(), &mut back)
        .unwrap();
    assert_eq!(back, data, "migration kept every byte");
    m.check_invariants().unwrap();
}

#[test]
fn data_caches_cut_the_remote_bytes_of_kernels_with_reuse_and_outputs_still_verify() {
    let reuse: Vec<Box<dyn Workload>> =
        std::vec![Box::new(Sgemm { n: 64 }), Box::new(Atax { n: 64 }),];
    // (Hotspot reads each block's rows and halos in one request, and round robin puts
    // neighbouring blocks in different stacks: no reuse a cache could catch there.)
    for w in &reuse {
        let on = HbmConfig {
            cache: CacheModel::default(),
            ..cfg()
        };
        let off = HbmConfig {
            cache: CacheModel::off(),
            ..cfg()
        };
        let a = run(&on, w.as_ref(), Config::Fgp, false, &Inputs::default()).unwrap();
        let b = run(&off, w.as_ref(), Config::Fgp, false, &Inputs::default()).unwrap();
        assert!(a.verified && b.verified, "{}", w.name());
        let (ra, rb) = (a.report.traffic().remote, b.report.traffic().remote);
        assert!(
            ra < rb,
            "{}: remote {ra} with caches, {rb} without",
            w.name()
        );
        assert!(a.report.cache.l1_hits + a.report.cache.l2_hits > 0);
        assert!(
            a.report.time_ns(&on) < b.report.time_ns(&off),
            "{}",
            w.name()
        );
    }
}
