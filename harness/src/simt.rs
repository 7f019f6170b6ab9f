//! `gmem-harness simt`: the SIMT GPU model's workloads, each verified, with their
//! translation behaviour: per-unit L1 TLB hit ratio (all units and the range across
//! units), shared-TLB hit ratio, walks per 1000 translation requests, modelled cycles.
//!
//! The GPU is the MESC paper's (Table I): 16 CUs, a 32-entry fully associative L1 TLB
//! per CU, a 512-entry 16-way shared (IOMMU) TLB, an 8 KiB page-walk cache, 4 KiB pages;
//! integrated (walking the CPU's x86-64 table, the paper's setting) or discrete.

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
    /// Walks per 1000 translation requests.
    pub walks_per_kilo_access: f64,
    /// Modelled cycles.
    pub cycles: u64,
    /// Of the waiting, the share spent on translation.
    pub translation_share: f64,
    /// Host wall time of the run, seconds.
    pub wall_seconds: f64,
    /// Matched the CPU reference.
    pub verified: bool,
}

/// Run `names` at `size` on `gpu`.
pub fn run(names: &[&str], size: Size, discrete: bool) -> Result<Vec<SimtRow>, String> {
    let mut rows = Vec::new();
    for &name in names {
        let pages = pages_needed(name, size);
        let (m, gpu) = if discrete {
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
            l1_hit: mmu.l1.hit_ratio(),
            l1_hit_min: per_unit.iter().copied().fold(1.0, f64::min),
            l1_hit_max: per_unit.iter().copied().fold(0.0, f64::max),
            l2_hit: mmu.l2.hit_ratio(),
            walks_per_kilo_access: 1000.0 * mmu.walks as f64 / s.translations.max(1) as f64,
            cycles: s.cycles,
            translation_share: s.translation_cycles as f64 / waited as f64,
            wall_seconds: wall,
            verified: o.verified,
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
    let _ = writeln!(s, "{}", gmem_simt::cost::CostModel::calibrated());
    let _ = writeln!(
        s,
        "{:<17} {:>4} {:>10} {:>5} {:>10} {:>10} {:>6} {:>13} {:>6} {:>9} {:>11} {:>6} {:>7} {:>8}",
        "workload",
        "sens",
        "gpu",
        "warps",
        "mem instr",
        "requests",
        "L1 hit",
        "L1 min-max",
        "L2 hit",
        "walks/1k",
        "cycles",
        "xlate",
        "wall s",
        "verified"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<17} {:>4} {:>10} {:>5} {:>10} {:>10} {:>6.3} {:>6.3}-{:<6.3} {:>6.3} {:>9.1} {:>11} {:>6.2} {:>7.2} {:>8}",
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
        "mean L1 / shared-TLB hit: sensitive {:.3} / {:.3}, insensitive {:.3} / {:.3} \
         (MESC baseline figures: shared TLB ~0.55 sensitive, ~0.98 insensitive)",
        avg(true, |r| r.l1_hit),
        avg(true, |r| r.l2_hit),
        avg(false, |r| r.l1_hit),
        avg(false, |r| r.l2_hit)
    );
    s
}
