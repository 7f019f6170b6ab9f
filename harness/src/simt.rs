//! `gmem-harness simt`: the SIMT GPU model's workloads, each verified, with their
//! translation behaviour: per-unit L1 TLB hit ratio (all units and the range across
//! units), shared-TLB hit ratio, walks per 1000 translation requests, modelled cycles.
//!
//! The GPU is the MESC paper's (Table I): 16 CUs, a 32-entry fully associative L1 TLB
//! per CU, a 512-entry 16-way shared (IOMMU) TLB, an 8 KiB page-walk cache, 4 KiB pages;
//! integrated (walking the CPU's x86-64 table, the paper's setting) or discrete.
//!
//! Two ratios describe the shared TLB: its hit ratio per lookup (lookups are per-CU L1
//! misses: the usual meaning, and what the tables call "L2 hit"), and the share of all
//! translation requests served without a walk ("no walk" = 1 − walks / requests). The
//! MESC text does not say which of the two its Figure 3 plots. Hit ratios are the
//! engine's, by issue time: a request that waited for a walk of its page already in
//! flight is a merged miss ("merged", share of requests), a hit of neither level. [`sweep`] replays a
//! recorded stream through shared TLBs of several sizes (the same run, offline).

use gmem_sim::{replay, Replacement, ReplayStream, TlbConfig, TlbHierarchy};
use gmem_simt::machine::{mesc_tlbs, GpuKind, SimtMachine, MESC_UNITS};
use gmem_simt::workloads::{self, classified, pages_needed, sensitive, Size, WORKLOADS};
use std::fmt::Write as _;

/// One verified SIMT run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SimtRow {
    /// Workload name.
    pub workload: String,
    /// Translation-sensitive in the MESC paper's classification.
    pub sensitive: bool,
    /// In one of the two compared classes (otherwise `sensitive` is false and means
    /// nothing).
    pub classified: bool,
    /// GPU kind.
    pub gpu: String,
    /// Bytes of data.
    pub footprint: u64,
    /// Resident warps per unit.
    pub warps_per_unit: u32,
    /// Memory instructions.
    pub memory_instructions: u64,
    /// Translation requests (distinct pages per instruction).
    pub translations: u64,
    /// Per-unit L1 TLB hit ratio (all units together).
    pub l1_hit: f64,
    /// Lowest and highest unit's L1 hit ratio.
    pub l1_hit_min: f64,
    /// Highest unit's L1 hit ratio.
    pub l1_hit_max: f64,
    /// Shared TLB hit ratio.
    pub l2_hit: f64,
    /// Requests that merged with a walk in flight, over all requests.
    pub merged: f64,
    /// The shared TLB's hit ratio were merged misses counted as its hits (the MESC
    /// text does not say how its simulator counted them).
    pub l2_hit_or_merged: f64,
    /// Walks per 1000 translation requests.
    pub walks_per_kilo_access: f64,
    /// Requests served without a walk (by either TLB level), over all requests.
    pub no_walk: f64,
    /// Modelled cycles.
    pub cycles: u64,
    /// Of the waiting, the share spent on translation.
    pub translation_share: f64,
    /// Host wall time of the run, seconds.
    pub wall_seconds: f64,
    /// Matched the CPU reference.
    pub verified: bool,
    /// The run timed its page walks ([`gmem_simt::cost::CostModel::timed_walks`]).
    pub timed_walks: bool,
}

/// Run `names` at `size` on `gpu`, with timed page walks when `timed_walks`
/// ([`gmem_simt::cost::CostModel::timed_walks`]).
pub fn run(
    names: &[&str],
    size: Size,
    discrete: bool,
    timed_walks: bool,
) -> Result<Vec<SimtRow>, String> {
    let mut rows = Vec::new();
    for &name in names {
        let pages = pages_needed(name, size);
        let (mut m, gpu) = if discrete {
            let m = SimtMachine::new(
                pages + 1024,
                GpuKind::Discrete {
                    pages: pages + 1024,
                },
                mesc_tlbs(MESC_UNITS),
            )?;
            (m, "discrete")
        } else {
            (SimtMachine::mesc(pages)?, "integrated")
        };
        m.cost.timed_walks = timed_walks;
        let t = std::time::Instant::now();
        let o = workloads::run(&m, name, size)?;
        let wall = t.elapsed().as_secs_f64();
        let mmu = m.gpu_mmu().caches;
        let per_unit: Vec<f64> = (0..MESC_UNITS)
            .filter_map(|u| m.l1_stats(u))
            .filter(|s| s.hits + s.misses > 0)
            .map(|s| s.hit_ratio())
            .collect();
        let s = o.stats;
        let waited = (s.translation_cycles + s.data_cycles).max(1);
        rows.push(SimtRow {
            workload: name.into(),
            sensitive: sensitive(name),
            classified: classified(name),
            gpu: gpu.into(),
            footprint: o.footprint,
            warps_per_unit: s.warps_per_unit,
            memory_instructions: s.memory_instructions,
            translations: s.translations,
            l1_hit: s.served_l1 as f64 / s.translations.max(1) as f64,
            l1_hit_min: per_unit.iter().copied().fold(1.0, f64::min),
            l1_hit_max: per_unit.iter().copied().fold(0.0, f64::max),
            l2_hit: s.served_l2 as f64 / (s.translations - s.served_l1).max(1) as f64,
            merged: s.merged as f64 / s.translations.max(1) as f64,
            l2_hit_or_merged: (s.served_l2 + s.merged) as f64
                / (s.translations - s.served_l1).max(1) as f64,
            walks_per_kilo_access: 1000.0 * mmu.walks as f64 / s.translations.max(1) as f64,
            no_walk: 1.0 - mmu.walks as f64 / s.translations.max(1) as f64,
            cycles: s.cycles,
            translation_share: s.translation_cycles as f64 / waited as f64,
            wall_seconds: wall,
            verified: o.verified,
            timed_walks,
        });
    }
    Ok(rows)
}

/// The workloads to run for `arg` (`all` or one name).
pub fn names(arg: &str) -> Result<Vec<&'static str>, String> {
    if arg == "all" {
        return Ok(WORKLOADS.to_vec());
    }
    WORKLOADS
        .iter()
        .find(|&&w| w == arg)
        .map(|&w| vec![w])
        .ok_or_else(|| {
            format!(
                "unknown workload {arg}; known: all, {}",
                WORKLOADS.join(", ")
            )
        })
}

/// The rows as an aligned table, with the cost model's parameters.
pub fn table(rows: &[SimtRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "SIMT GPU: {MESC_UNITS} CUs, L1 TLB 32 entries fully assoc., shared TLB 512 x 16-way, \
         8 KiB walk cache, 4 KiB pages (MESC Table I)"
    );
    let cost = gmem_simt::cost::CostModel {
        timed_walks: rows.first().is_some_and(|r| r.timed_walks),
        ..gmem_simt::cost::CostModel::calibrated()
    };
    let _ = writeln!(s, "{cost}");
    let _ = writeln!(
        s,
        "{:<17} {:>4} {:>10} {:>5} {:>10} {:>10} {:>6} {:>13} {:>6} {:>6} {:>7} {:>9} {:>11} {:>6} {:>7} {:>8}",
        "workload",
        "sens",
        "gpu",
        "warps",
        "mem instr",
        "requests",
        "L1 hit",
        "L1 min-max",
        "L2 hit",
        "merged",
        "no walk",
        "walks/1k",
        "cycles",
        "xlate",
        "wall s",
        "verified"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<17} {:>4} {:>10} {:>5} {:>10} {:>10} {:>6.3} {:>6.3}-{:<6.3} {:>6.3} {:>6.3} {:>7.3} {:>9.1} {:>11} {:>6.2} {:>7.2} {:>8}",
            r.workload,
            match (r.classified, r.sensitive) {
                (false, _) => "-",
                (true, true) => "yes",
                (true, false) => "no",
            },
            r.gpu,
            r.warps_per_unit,
            r.memory_instructions,
            r.translations,
            r.l1_hit,
            r.l1_hit_min,
            r.l1_hit_max,
            r.l2_hit,
            r.merged,
            r.no_walk,
            r.walks_per_kilo_access,
            r.cycles,
            r.translation_share,
            r.wall_seconds,
            r.verified
        );
    }
    let avg = |sens: bool, f: fn(&SimtRow) -> f64| {
        let v: Vec<f64> = rows
            .iter()
            .filter(|r| r.classified && r.sensitive == sens)
            .map(f)
            .collect();
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let _ = writeln!(
        s,
        "mean L1 / shared-TLB hit / no walk: sensitive {:.3} / {:.3} / {:.3}, insensitive \
         {:.3} / {:.3} / {:.3} (MESC Fig. 3 baseline: per-CU 0.399 / shared 0.554 sensitive, \
         0.538 / 0.986 insensitive)",
        avg(true, |r| r.l1_hit),
        avg(true, |r| r.l2_hit),
        avg(true, |r| r.no_walk),
        avg(false, |r| r.l1_hit),
        avg(false, |r| r.l2_hit),
        avg(false, |r| r.no_walk)
    );
    let _ = writeln!(
        s,
        "mean shared-TLB hit counting merged misses as hits: sensitive {:.3}, insensitive {:.3}",
        avg(true, |r| r.l2_hit_or_merged),
        avg(false, |r| r.l2_hit_or_merged)
    );
    s
}

/// Shared-TLB sizes [`sweep`] replays through (16 ways each; 512 is MESC Table I's).
pub const SWEEP_ENTRIES: &[usize] = &[256, 512, 1024, 2048, 4096, 8192];

/// Run each of `names` once at `size` on the integrated GPU, recording its translation
/// stream, and replay the stream offline through the MESC hierarchy with each shared
/// TLB size of [`SWEEP_ENTRIES`] (LRU), and with 512 entries under random replacement:
/// the shared TLB's hit ratio per lookup and the share of requests served without a
/// walk, per configuration, as a table.
///
/// # Errors
/// A machine that could not be built or a workload that failed.
pub fn sweep(names: &[&str], size: Size) -> Result<String, String> {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "shared-TLB size sweep (offline replay of each run's translation stream; 16 ways; \
         L1 and walk cache as MESC Table I): shared-TLB hit / no walk"
    );
    let _ = write!(s, "{:<17} {:>10}", "workload", "recorded");
    for e in SWEEP_ENTRIES {
        let _ = write!(s, " {:>13}", format!("{e} entries"));
    }
    let _ = write!(s, " {:>13}", "512 random");
    let _ = writeln!(s);
    for &name in names {
        let m = SimtMachine::mesc(pages_needed(name, size))?;
        m.start_recording();
        let o = workloads::run(&m, name, size)?;
        let log = m.take_recording();
        if !o.verified {
            return Err(format!("{name}: result does not match the CPU reference"));
        }
        let _ = write!(s, "{:<17} {:>10}", name, log.translations());
        // Decoded once per recording, replayed split by level per configuration (the
        // same counters; a log beyond the compact encoding replays from the log).
        let stream = ReplayStream::new(&log, 4).ok();
        let policies = SWEEP_ENTRIES
            .iter()
            .map(|&e| (e, Replacement::Lru))
            .chain([(512, Replacement::Random { seed: 1 })]);
        for (entries, policy) in policies {
            let mut config = mesc_tlbs(MESC_UNITS);
            config.l2 = Some(TlbConfig::new(entries / 16, 16, policy));
            let mut caches = TlbHierarchy::new(config).map_err(|e| e.to_string())?;
            let r = match &stream {
                Some(stream) => stream.replay_split(&mut caches).stats,
                None => replay(&mut caches, &log, 4),
            };
            let no_walk = 1.0 - r.caches.walks as f64 / log.translations().max(1) as f64;
            let _ = write!(
                s,
                " {:>13}",
                format!("{:.3}/{:.3}", r.caches.l2.hit_ratio(), no_walk)
            );
        }
        let _ = writeln!(s);
    }
    Ok(s)
}
