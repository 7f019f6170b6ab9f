//! Where CODA's speedup comes from: for fine grain only and for CODA, the share of each
//! workload's modelled near-data time set by each bound of the cost model (the
//! busiest stack's local bandwidth, the remote network, the slowest SM's issue, the
//! slowest SM's memory latency over its requests in flight). A kernel bound by the
//! remote network under fine grain and by its SMs under CODA gains the ratio of the
//! two; one bound by its SMs under both gains little.
//!
//! Also the hotspot decomposition ablation ([`tiles`]): the same grid split by
//! Rodinia's 2D tiles (`gmem_hbm::hotspot2d`, the experiment's hotspot since issue 33,
//! whose runs the measurement already made) and by whole rows (the first pass's
//! hotspot), under fine grain, fine grain + affinity and CODA.

use crate::coda_report::{Measured, MeasuredClass, Row, Size};
use gmem_hbm::coda::{run, Config, Inputs, RunResult};
use gmem_hbm::cost::Bound;
use gmem_hbm::workloads::Hotspot;
use gmem_hbm::workloads::Workload;
use gmem_hbm::HbmConfig;

/// One run of the hotspot decomposition ablation.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TileRow {
    /// `hotspot` (row split) or `hotspot-2d` (16 × 16 tiles).
    pub workload: String,
    /// The configuration.
    pub config: &'static str,
    /// Fine-grain-only time of the same decomposition over this time.
    pub speedup_vs_fgp: f64,
    /// Remote share of SM traffic.
    pub remote_fraction: f64,
    /// Share of the pages touched by 16 or more blocks of one launch.
    pub pages_16_plus: f64,
    /// Share of the pages touched from one stack in every launch (under this
    /// configuration's scheduling).
    pub one_stack: f64,
    /// The class CODA §6's rule gives this run's pages.
    pub measured_class: &'static str,
    /// Result equals the CPU reference.
    pub verified: bool,
}

/// The configurations a [`TileRow`] is measured under.
pub const TILE_CONFIGS: [Config; 3] = [Config::Fgp, Config::FgpAffinity, Config::Coda];

/// The decomposition figures of `w`'s run `r` under `k`, whose class (measured on the
/// same run) is `class`; `fgp_ns` is the same workload's fine-grain-only time.
pub(crate) fn tile_row(
    w: &dyn Workload,
    k: Config,
    r: &RunResult,
    class: &MeasuredClass,
    fgp_ns: f64,
    cfg: &HbmConfig,
) -> TileRow {
    let pages: u64 = r.report.blocks_per_page.values().sum();
    let many: u64 = r.report.blocks_per_page.range(16..).map(|(_, n)| n).sum();
    TileRow {
        workload: w.name(),
        config: k.name(),
        speedup_vs_fgp: fgp_ns / r.report.time_ns(cfg),
        remote_fraction: r.report.traffic().remote_fraction(),
        pages_16_plus: many as f64 / pages.max(1) as f64,
        one_stack: class.one_stack,
        measured_class: class.measured,
        verified: r.verified,
    }
}

/// The hotspot decomposition ablation: the experiment's row-split hotspot, whose
/// rows `measure` already produced (its [`Measured::layouts`]), beside the same grid
/// split into 16 × 16 tiles, run here under [`TILE_CONFIGS`].
///
/// # Errors
/// A machine failure, naming the run; a measurement without the row-split hotspot.
pub fn tiles(cfg: &HbmConfig, size: Size, m: &Measured) -> Result<Vec<TileRow>, String> {
    let rows = crate::coda_report::hotspot_rows(size);
    let mut out: Vec<TileRow> = m
        .layouts
        .iter()
        .filter(|r| r.workload == "hotspot-2d")
        .cloned()
        .collect();
    if out.len() != TILE_CONFIGS.len() {
        return Err("coda tiles: the measurement has no tiled hotspot runs".into());
    }
    let w = Hotspot {
        rows,
        cols: crate::coda_report::HOTSPOT_COLS,
        rows_per_block: 2,
        steps: 2,
    };
    let cfg = &cfg
        .for_kernel(&w.kernel())
        .map_err(|e| format!("hotspot rows: occupancy: {e}"))?;
    let mut fgp = None;
    for k in TILE_CONFIGS {
        let r = run(cfg, &w, k, false, &Inputs::default())
            .map_err(|e| format!("{} / {}: {e}", w.name(), k.name()))?;
        let base = *fgp.get_or_insert(r.report.time_ns(cfg));
        let class = MeasuredClass::of(&w, &r.report.blocks_per_page, &r.report.stacks_per_page);
        out.push(tile_row(&w, k, &r, &class, base, cfg));
    }
    Ok(out)
}

/// The ablation's table.
pub fn tiles_table(rows: &[TileRow]) -> String {
    let mut s = String::from(
        "\nhotspot decomposition (same grid; 2d = Rodinia's 16x16 tiles, the experiment's; hotspot = the first pass's row split):\n",
    );
    s += &format!(
        "{:<12} {:<12} {:>8} {:>7} {:>14} {:>10} {:<16} {:>5}\n",
        "workload", "config", "speedup", "remote", "pages by >=16", "one stack", "§6 class", "ok"
    );
    for r in rows {
        s += &format!(
            "{:<12} {:<12} {:>7.2}x {:>6.1}% {:>13.1}% {:>9.1}% {:<16} {:>5}\n",
            r.workload,
            r.config,
            r.speedup_vs_fgp,
            r.remote_fraction * 100.0,
            r.pages_16_plus * 100.0,
            r.one_stack * 100.0,
            r.measured_class,
            r.verified
        );
    }
    s
}

/// The shares, in %, of `row`'s time by bound, in [`Bound::ALL`] order.
fn shares(row: &Row) -> [f64; 4] {
    let total: f64 = row.time_by_bound_us.iter().sum();
    row.time_by_bound_us
        .map(|t| if total > 0.0 { 100.0 * t / total } else { 0.0 })
}

/// A column header for `b`.
fn short(b: Bound) -> &'static str {
    match b {
        Bound::LocalNet => "L-net",
        Bound::RemoteNet => "R-net",
        Bound::SmIssue => "issue",
        Bound::SmMemory => "memory",
    }
}

/// The table: per workload, fine grain's and CODA's time by bound.
pub fn bounds_table(rows: &[Row]) -> String {
    let configs = [Config::Fgp.name(), Config::Coda.name()];
    let mut s = String::from(
        "\nwhat sets the near-data time (% of modelled time by bound: L-net = busiest stack's local\nbandwidth, R-net = remote network, issue / memory = slowest SM's issue / memory latency):\n",
    );
    s += &format!("{:<17}", "");
    for c in configs {
        s += &format!(" {:<31}", format!("{c}:"));
    }
    s += &format!("\n{:<17}", "workload");
    for _ in configs {
        for b in Bound::ALL {
            s += &format!(" {:>7}", short(b));
        }
    }
    s += "\n";
    let mut names: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.side == "sm") {
        if !names.contains(&r.workload.as_str()) {
            names.push(&r.workload);
        }
    }
    for w in names {
        s += &format!("{w:<17}");
        for c in configs {
            let Some(r) = rows
                .iter()
                .find(|r| r.side == "sm" && r.workload == w && r.config == c)
            else {
                continue;
            };
            for v in shares(r) {
                s += &format!(" {v:>6.0}%");
            }
        }
        s += "\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coda_report::{measure, Size};
    use gmem_hbm::HbmConfig;

    #[test]
    fn coda_bounds_add_up_to_the_modelled_time_and_name_every_workload() {
        let m = measure(&HbmConfig::default(), Size::Tiny, false).unwrap();
        for r in m.rows.iter().filter(|r| r.side == "sm") {
            let sum: f64 = r.time_by_bound_us.iter().sum();
            assert!(
                (sum - r.time_us).abs() <= 1e-9 * r.time_us.max(1.0),
                "{}",
                r.workload
            );
        }
        let t = bounds_table(&m.rows);
        assert!(t.contains("kmeans") && t.contains("dc-rmat"));
    }

    #[test]
    fn coda_tiles_verify_and_the_2d_hotspot_pages_are_widely_shared() {
        let cfg = HbmConfig::default();
        let m = measure(&cfg, Size::Tiny, false).unwrap();
        let rows = tiles(&cfg, Size::Tiny, &m).unwrap();
        assert_eq!(rows.len(), 6);
        assert!(rows.iter().all(|r| r.verified));
        let fgp = |w: &str| {
            rows.iter()
                .find(|r| r.workload == w && r.config == Config::Fgp.name())
                .unwrap()
        };
        assert!(fgp("hotspot-2d").pages_16_plus > 0.9);
        assert!(fgp("hotspot").pages_16_plus < 0.1);
        assert!(tiles_table(&rows).contains("hotspot-2d"));
    }
}
