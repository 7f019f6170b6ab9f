//! Where CODA's speedup comes from: for fine grain only and for CODA, the share of each
//! workload's modelled near-data time set by each bound of the cost model (the
//! busiest stack's local bandwidth, the remote network, the slowest SM's issue, the
//! slowest SM's memory latency over its requests in flight). A kernel bound by the
//! remote network under fine grain and by its SMs under CODA gains the ratio of the
//! two; one bound by its SMs under both gains little.

use crate::coda_report::Row;
use gmem_hbm::coda::Config;
use gmem_hbm::cost::Bound;

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
        assert!(t.contains("vecadd") && t.contains("pagerank-rmat"));
    }
}
