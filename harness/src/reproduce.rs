//! Reproductions of the papers' results.
//!
//! `gmem-table4` — GMEM's Table 4: the memory traffic of training a neural network with
//! back-propagation on a discrete GPU whose local memory is smaller (100 MB) and larger
//! (200 MB) than the 137.5 MB working set: bytes zero-filled in device memory, bytes
//! migrated host→device and device→host. We keep the paper's two ratios of device memory
//! to working set (72.7% and 145.5%); the default network has the paper's size.

use crate::machine::Accel;
use crate::plot::{write_svg, BarChart, BarSeries, PALETTE};
use crate::workloads::{self, Outcome};
use std::path::Path;

/// One row of Table 4.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Table4Row {
    /// Device memory in MiB.
    pub device_mib: f64,
    /// Device memory as a percentage of the working set.
    pub device_percent: f64,
    /// Bytes zero-filled in device memory, MiB.
    pub dev_zero_fill_mib: f64,
    /// Host to device, MiB.
    pub host_to_dev_mib: f64,
    /// Device to host, MiB.
    pub dev_to_host_mib: f64,
    /// Pages evicted.
    pub evictions: u64,
    /// Whether the trained weights matched the CPU-only reference bit for bit.
    pub verified: bool,
}

/// The paper's figures (MB) for its 137.5 MB network, for side-by-side printing.
pub const PAPER: [(f64, f64, f64, f64); 2] =
    [(100.0, 91.6, 412.7, 406.5), (200.0, 91.6, 137.5, 91.6)];

const MIB: f64 = (1 << 20) as f64;

/// Run Table 4 with a network of `inputs` input units, `steps` training steps.
///
/// # Errors
/// As [`workloads::backprop`] for the first device-memory size that failed. Weights
/// that differ from the CPU-only reference are not an error: the row says
/// [`Table4Row::verified`] `false`.
pub fn table4(inputs: u64, steps: u32) -> Result<(u64, Vec<Table4Row>), String> {
    let mut rows = Vec::new();
    let mut ws = 0;
    for (paper_dev, ..) in PAPER {
        let percent_x10 = (paper_dev / 137.5 * 1000.0).round() as u64;
        let pages = |w: u64| (w.div_ceil(gmem_core::PAGE_SIZE) * percent_x10 / 1000).max(1);
        let o: Outcome =
            workloads::backprop(inputs, steps, |w| Accel::Discrete { pages: pages(w) })?;
        ws = o.working_set;
        let dev_bytes = pages(o.working_set) * gmem_core::PAGE_SIZE;
        rows.push(Table4Row {
            device_mib: dev_bytes as f64 / MIB,
            device_percent: percent_x10 as f64 / 10.0,
            dev_zero_fill_mib: o.device_zeroed as f64 / MIB,
            host_to_dev_mib: o.stats.bytes_host_to_dev as f64 / MIB,
            dev_to_host_mib: o.stats.bytes_dev_to_host as f64 / MIB,
            evictions: o.stats.evictions,
            verified: o.mismatches == 0,
        });
    }
    Ok((ws, rows))
}

/// Write the rows as CSV, JSON and an SVG bar chart into `dir`; returns the paths.
///
/// # Errors
/// The path and error of the first directory or file that could not be created or
/// written (the chart's rendering included); the files before it stay written.
pub fn write_table4(
    dir: &Path,
    working_set: u64,
    rows: &[Table4Row],
) -> Result<Vec<String>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let csv_path = dir.join("gmem-table4.csv");
    let mut csv = String::from("device_mib,device_percent,dev_zero_fill_mib,host_to_dev_mib,dev_to_host_mib,evictions,verified\n");
    for r in rows {
        csv += &format!(
            "{:.2},{:.1},{:.2},{:.2},{:.2},{},{}\n",
            r.device_mib,
            r.device_percent,
            r.dev_zero_fill_mib,
            r.host_to_dev_mib,
            r.dev_to_host_mib,
            r.evictions,
            r.verified
        );
    }
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    let json_path = dir.join("gmem-table4.json");
    let json = serde_json::json!({ "working_set_mib": working_set as f64 / MIB, "rows": rows });
    std::fs::write(&json_path, json.to_string())
        .map_err(|e| format!("{}: {e}", json_path.display()))?;
    let svg_path = dir.join("gmem-table4.svg");
    plot(&svg_path, working_set, rows).map_err(|e| format!("{}: {e}", svg_path.display()))?;
    Ok([csv_path, json_path, svg_path]
        .iter()
        .map(|p| p.display().to_string())
        .collect())
}

fn plot(
    path: &Path,
    working_set: u64,
    rows: &[Table4Row],
) -> Result<(), Box<dyn std::error::Error>> {
    let series = |name: &str, k: usize, value: fn(&Table4Row) -> f64| BarSeries {
        name: name.into(),
        color: PALETTE[k],
        values: rows.iter().map(value).collect(),
    };
    let chart = BarChart {
        caption: format!(
            "Back-propagation, {:.1} MiB working set: traffic by device memory",
            working_set as f64 / MIB
        ),
        groups: rows
            .iter()
            .map(|r| format!("{:.1} MiB ({:.0}%)", r.device_mib, r.device_percent))
            .collect(),
        series: vec![
            series("dev-zero-fill", 0, |r| r.dev_zero_fill_mib),
            series("host-to-dev", 1, |r| r.host_to_dev_mib),
            series("dev-to-host", 2, |r| r.dev_to_host_mib),
        ],
        y_desc: "MiB".into(),
        reference: None,
    };
    write_svg(path, (720, 420), &[chart])
}
