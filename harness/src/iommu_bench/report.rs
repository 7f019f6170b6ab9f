//! `reproduce iommu`'s output: the printed tables, `out/iommu.{csv,json,svg}`, the
//! verified [`Report`], and the paper's Table 3 beside them.

use super::{
    edits_table, host, table3, EditRow, Params, Row, Variant, PACKET_BYTES, REPS, RING, THREADS,
};
use crate::plot::{write_svg, BarChart, BarSeries, PALETTE};
use crate::report::Report;
use std::path::Path;

/// The paper's Table 3 (Gbps) for FreeBSD and the GMEM variants, RX and TX with 1 and 4
/// connections, in [`Variant::ALL`]'s order (baseline = FreeBSD).
pub const PAPER: [(&str, [f64; 6]); 4] = [
    ("RX 1 conn", [5.8, 7.4, 8.3, 8.1, 12.2, 11.5]),
    ("RX 4 conn", [8.0, 10.5, 12.7, 11.4, 23.9, 16.0]),
    ("TX 1 conn", [14.9, 18.4, 18.9, 18.1, 34.6, 28.7]),
    ("TX 4 conn", [20.8, 27.5, 29.6, 27.4, 37.7, 37.7]),
];

/// Write the rows as CSV, JSON and an SVG chart into `dir`; returns the paths.
///
/// # Errors
/// The path and I/O error of the first directory or file that could not be created
/// or written; the files before it stay written.
pub fn write(
    dir: &Path,
    p: &Params,
    rows: &[Row],
    edits: &[EditRow],
) -> Result<Vec<String>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let csv_path = dir.join("iommu.csv");
    let mut csv = String::from("variant,threads,packets,wall_s,kpps,cpu_us_per_packet,cpu_percent,pps_vs_baseline,cpu_vs_baseline,map_unmap_ns_per_packet,map_unmap_vs_baseline,invalidations,invalidations_per_packet,walk_cache_flushes,table_pages_peak,table_pages_end,verified\n");
    for r in rows {
        csv += &format!(
            "{},{},{},{:.4},{:.2},{:.3},{:.1},{:.3},{:.3},{:.1},{:.3},{},{:.4},{},{},{},{}\n",
            r.variant,
            r.threads,
            r.packets,
            r.wall_s,
            r.kpps,
            r.cpu_us_per_packet,
            r.cpu_percent,
            r.pps_vs_baseline,
            r.cpu_vs_baseline,
            r.map_unmap_ns_per_packet,
            r.map_unmap_vs_baseline,
            r.invalidations,
            r.invalidations_per_packet,
            r.walk_cache_flushes,
            r.table_pages_peak,
            r.table_pages_end,
            r.verified
        );
    }
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    let json_path = dir.join("iommu.json");
    let paper: Vec<_> = PAPER
        .iter()
        .map(|(w, g)| serde_json::json!({ "workload": w, "gbps": g }))
        .collect();
    let json = serde_json::json!({
        "params": {
            "inval_ns": p.inval_ns,
            "inval_wait": "busy-wait",
            "packets_per_queue": p.packets,
            "reps": p.reps,
            "ring": RING,
            "packet_bytes": PACKET_BYTES,
            "async_batch": 64,
        },
        "variants": Variant::ALL.iter().map(|v| v.name()).collect::<Vec<_>>(),
        "rows": rows,
        "paper_table3": paper,
        "table_edits_alone": edits,
    });
    std::fs::write(&json_path, json.to_string())
        .map_err(|e| format!("{}: {e}", json_path.display()))?;
    let svg_path = dir.join("iommu.svg");
    plot(&svg_path, p, rows).map_err(|e| format!("{}: {e}", svg_path.display()))?;
    Ok([csv_path, json_path, svg_path]
        .iter()
        .map(|x| x.display().to_string())
        .collect())
}

type Column = (&'static str, fn(&Row) -> f64);

fn plot(path: &Path, p: &Params, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let columns: [Column; 2] = [
        ("thousand packets / s", |r| r.kpps),
        ("CPU µs / packet", |r| r.cpu_us_per_packet),
    ];
    let names: Vec<&str> = Variant::ALL.iter().map(|v| v.name()).collect();
    let charts: Vec<BarChart> = columns
        .iter()
        .map(|(label, value)| BarChart {
            caption: format!("{label} (invalidation {} ns)", p.inval_ns),
            groups: names.iter().map(|n| n.to_string()).collect(),
            series: THREADS
                .iter()
                .enumerate()
                .map(|(k, t)| BarSeries {
                    name: format!("{t} thread{}", if *t == 1 { "" } else { "s" }),
                    color: PALETTE[k],
                    values: names
                        .iter()
                        .map(|n| {
                            rows.iter()
                                .find(|r| r.threads == *t && r.variant == *n)
                                .map_or(f64::NAN, value)
                        })
                        .collect(),
                })
                .collect(),
            y_desc: label.to_string(),
            reference: None,
        })
        .collect();
    write_svg(path, (960, 440), &charts)
}

/// `gmem-harness reproduce iommu`: measure, print, write `out/iommu.{csv,json,svg}`.
///
/// # Errors
/// As [`table3`] (a zero `packets`, or a failed run), building the host for the
/// table-edit runs, [`edits_table`], then [`write()`].
pub fn run(inval_ns: u64, packets: u64, out: &str) -> Result<Report, String> {
    let p = Params {
        inval_ns,
        packets,
        reps: REPS,
    };
    let (rows, problems) = table3(&p)?;
    let memory = host(1)?.gm.host();
    let edits = edits_table(packets * 5, p.reps, memory)?;
    let files = write(Path::new(out), &p, &rows, &edits)?;
    println!(
        "GMEM Table 3, reproduced: NIC receive churn through the IOMMU (per packet: DMA into a posted buffer, verify, unmap, post a new one)"
    );
    println!(
        "  ring {RING} buffers/queue, {PACKET_BYTES}-byte packets, {packets} packets/queue/run, IOTLB invalidation {inval_ns} ns (busy-wait), async batch 64, median of {} runs",
        p.reps
    );
    println!(
        "{:<11} {:>3} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11} {:>8}",
        "variant",
        "thr",
        "kpkt/s",
        "CPUus/pkt",
        "CPU%",
        "pkt/s",
        "CPU/pkt",
        "map+unmap",
        "map+unmap",
        "inval/pkt",
        "tbl pk/end",
        "verified"
    );
    println!(
        "{:<11} {:>3} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9} {:>9}",
        "", "", "", "", "", "vs base", "vs base", "ns/pkt", "vs base"
    );
    for r in &rows {
        println!(
            "{:<11} {:>3} {:>9.1} {:>9.3} {:>6.0} {:>8.2}x {:>8.2}x {:>9.0} {:>8.2}x {:>9.3} {:>5}/{:<5} {:>8}",
            r.variant,
            r.threads,
            r.kpps,
            r.cpu_us_per_packet,
            r.cpu_percent,
            r.pps_vs_baseline,
            r.cpu_vs_baseline,
            r.map_unmap_ns_per_packet,
            r.map_unmap_vs_baseline,
            r.invalidations_per_packet,
            r.table_pages_peak,
            r.table_pages_end,
            if r.verified { "yes" } else { "NO" }
        );
    }
    println!(
        "page-table edits alone (driver level, no core / DMA / invalidation; {RING} pages kept mapped per thread, one replaced per step):"
    );
    println!(
        "{:<11} {:>3} {:>10} {:>11} {:>9} {:>12} {:>8}",
        "discipline", "thr", "Mpairs/s", "CPUns/pair", "vs locked", "writer locks", "CAS lost"
    );
    for e in &edits {
        println!(
            "{:<11} {:>3} {:>10.2} {:>11.1} {:>8.2}x {:>12} {:>8}",
            e.discipline,
            e.threads,
            e.mpairs_per_s,
            e.cpu_ns_per_pair,
            e.vs_locked,
            e.writer_reclaims,
            e.cas_lost
        );
    }
    println!("paper (netperf on a 40 Gbps NIC, Gbps; ratio vs FreeBSD):");
    for (w, g) in PAPER {
        let cells: Vec<String> = g
            .iter()
            .zip(Variant::ALL)
            .map(|(x, v)| format!("{} {x:.1} ({:.2}x)", v.name(), x / g[0]))
            .collect();
        println!("  {w:<9} {}", cells.join(", "));
    }
    println!("written: {}", files.join(", "));
    let mut r = Report::new(format!(
        "iommu (GMEM Table 3): invalidation {inval_ns} ns, {packets} packets/queue"
    ));
    for row in &rows {
        let key = format!("{} x{}", row.variant, row.threads);
        r.row(&format!("{key}: packets/s"), (row.kpps * 1e3) as u64);
        r.row(
            &format!("{key}: CPU ns/packet"),
            (row.cpu_us_per_packet * 1e3) as u64,
        );
        r.row(
            &format!("{key}: map+unmap ns/packet"),
            row.map_unmap_ns_per_packet as u64,
        );
        r.row(&format!("{key}: invalidations"), row.invalidations);
    }
    let ok = problems.is_empty() && rows.iter().all(|x| x.verified);
    let total: u64 = rows.iter().map(|x| x.packets).sum::<u64>() * p.reps as u64;
    r.verify(
        ok,
        if ok {
            format!("all {total} DMAs landed intact in their buffers; after every run no buffer stayed mapped and no unmapped IOVA translated")
        } else {
            problems.join("; ")
        },
    );
    Ok(r)
}
