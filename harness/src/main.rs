//! `gmem-harness`: runs workloads and replays traces over gmem-core on simulated devices
//! that hold real bytes, and verifies every result against a CPU-only reference.

mod adsm_report;
mod aging;
mod coda_bounds;
mod coda_report;
mod contiguity;
mod full_report;
mod iommu_bench;
mod machine;
mod mesc;
mod mesc_iommu;
mod pagemap;
mod plot;
mod regdem_report;
mod replay;
mod report;
mod reproduce;
mod simt;
mod uvm;
mod uvm_work;
mod workloads;

use gmem_trace as trace;

use clap::{Parser, Subcommand, ValueEnum};
use report::{Output, Report};
use std::fs::File;
use std::io::BufReader;
use std::process::ExitCode;

// Bounds of the numeric arguments: each keeps a run's memory (the simulated devices
// hold real bytes) and time finite, with the default well inside. An out-of-range
// value is refused by the parser with the range in its message, before anything runs.
/// Device memory as a percentage of the working set.
const MAX_PERCENT: u64 = 1000;
/// VectorAdd elements per vector: three u32 vectors of 256 MiB.
const MAX_ELEMENTS: u64 = 1 << 26;
/// Backprop input units: about 4x the paper's 137.5 MiB network.
const MAX_INPUTS: u64 = 1 << 22;
/// Training steps.
const MAX_STEPS: u32 = 1000;
/// ATAX matrix dimension: a 256 MiB matrix of f32.
const MAX_ATAX_N: u64 = 8192;
/// Pages of a working set or of accelerator memory (4 GiB).
const MAX_PAGES: u64 = 1 << 20;
/// Pages of host memory for replay (16 GiB).
const MAX_HOST_PAGES: u64 = 1 << 22;
/// Hot/cold accesses.
const MAX_ACCESSES: u64 = 100_000_000;

/// A parser of u64 values in `lo..=hi`.
fn bounded(lo: u64, hi: u64) -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(lo..=hi)
}

/// A parser of u32 values in `lo..=hi`.
fn bounded_u32(lo: u32, hi: u32) -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(i64::from(lo)..=i64::from(hi))
}

#[derive(Parser)]
#[command(
    name = "gmem-harness",
    about = "Run workloads and replay traces over gmem-core, verified"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Print the report as JSON.
    #[arg(long, global = true, conflicts_with = "csv")]
    json: bool,
    /// Print the report as CSV (`key,value` rows).
    #[arg(long, global = true)]
    csv: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum Workload {
    /// c = a + b over u32 vectors: CPU prepares, device computes, CPU checks.
    Vectoradd,
    /// Back-propagation on a 3-layer network (n inputs, 16 hidden, 1 output).
    Backprop,
    /// Polybench ATAX: y = A^T (A x).
    Atax,
}

#[derive(Clone, Copy, ValueEnum)]
enum AccelKind {
    /// A discrete GPU with local memory (sized by --device-memory-percent).
    Discrete,
    /// An integrated GPU sharing the CPU's page table.
    IntegratedShared,
    /// An integrated GPU with a coherent page table of its own.
    IntegratedCoherent,
}

#[derive(Clone, Copy, ValueEnum)]
enum Experiment {
    /// GMEM Table 4: back-propagation traffic with device memory below and above the
    /// working set.
    GmemTable4,
    /// GMEM Table 3 (BUS_DMA): NIC DMA churn through the IOMMU driver, every GMEM
    /// variant against the tree-allocator + giant-lock baseline, on 1 and 2 threads.
    Iommu,
    /// RegDem: register demotion into unused shared memory, every variant simulated on a
    /// Maxwell SM model and verified bit for bit; predictor vs exhaustive search.
    Regdem,
    /// ADSM/GMAC: batch / lazy / rolling update against explicit copies on a GPU that
    /// cannot fault, six workloads, block- and rolling-size sweeps (`--quick` for CI).
    Adsm,
    /// CODA: HBM-stack near-data processing, six placement/scheduling configurations,
    /// ten workloads, remote-bandwidth sweep, host-side execution (`--quick` for CI).
    Coda,
    /// MESC: subregion contiguity bits against base, CoLT, full CoLT, THP and
    /// MESC+CoLT on the integrated GPU over fragmented memory (`--quick` for CI).
    Mesc,
    /// UVM-style policies (issue 35): stream, stencil, a table shared by two GPUs and a
    /// graph gather on the discrete GPU at 50/100/150% device memory (`--quick` for CI).
    Uvm,
}

#[derive(Clone, Copy, ValueEnum)]
enum TraceFormat {
    /// gmem's own text format (see `harness/src/trace.rs`).
    Gmem,
    /// valgrind --tool=lackey --trace-mem=yes output.
    Lackey,
}

#[derive(Clone, Copy, ValueEnum)]
enum OnDevice {
    Cpu,
    Gpu,
}

#[derive(Subcommand)]
enum Command {
    /// Run a workload (default: vectoradd with its defaults).
    #[command(alias = "vectoradd")]
    Run {
        #[arg(value_enum, default_value = "vectoradd")]
        workload: Workload,
        /// The accelerator.
        #[arg(long, value_enum, default_value = "discrete")]
        accel: AccelKind,
        /// Discrete-GPU memory as a percentage of the working set (1..=1000).
        #[arg(long, default_value_t = 50, value_parser = bounded(1, MAX_PERCENT))]
        device_memory_percent: u64,
        /// VectorAdd: elements per vector (u32; 1..=2^26, three vectors of 256 MiB).
        #[arg(long, default_value_t = 1 << 20, value_parser = bounded(1, MAX_ELEMENTS))]
        elements: u64,
        /// Backprop: input units (1..=2^22, about 4x the paper's network).
        #[arg(long, default_value_t = 1 << 16, value_parser = bounded(1, MAX_INPUTS))]
        inputs: u64,
        /// Backprop: training steps (1..=1000).
        #[arg(long, default_value_t = 3, value_parser = bounded_u32(1, MAX_STEPS))]
        steps: u32,
        /// ATAX: matrix dimension (1..=8192, a 256 MiB matrix).
        #[arg(long, default_value_t = 1024, value_parser = bounded(1, MAX_ATAX_N))]
        n: u64,
    },
    /// Reproduce a paper's result; writes CSV, JSON and an SVG plot.
    Reproduce {
        #[arg(value_enum)]
        experiment: Experiment,
        /// Backprop input units (the default makes the paper's 137.5 MiB network;
        /// 1..=2^22).
        #[arg(long, default_value_t = 1_092_000, value_parser = bounded(1, MAX_INPUTS))]
        inputs: u64,
        /// Training steps (1..=1000).
        #[arg(long, default_value_t = 3, value_parser = bounded_u32(1, MAX_STEPS))]
        steps: u32,
        /// Where to write the table and the plot.
        #[arg(long, default_value = "out")]
        out: String,
        /// iommu: modeled IOTLB invalidation latency in ns (busy-waited by the CPU
        /// that issues the invalidation; 0..=100000).
        #[arg(long, default_value_t = 2000, value_parser = bounded(0, iommu_bench::MAX_INVAL_NS))]
        inval_ns: u64,
        /// iommu: packets per receive queue per run (1..=1000000).
        #[arg(long, default_value_t = 20_000, value_parser = bounded(1, iommu_bench::MAX_PACKETS))]
        packets: u64,
        /// regdem, adsm, coda, mesc, uvm: CI sizes (seconds).
        #[arg(long)]
        quick: bool,
        /// mesc: instead of the experiment, print the VA->PA contiguity histogram of
        /// process PID (this process when no PID is given) from /proc/PID/pagemap.
        #[arg(long, num_args = 0..=1, default_missing_value = "self")]
        pagemap: Option<String>,
    },
    /// The main job: every workload on every accelerator configuration and the paper
    /// reproductions (Table 4, Table 3), each verified; tables and plots written to --out.
    Report {
        /// Where to write the report, tables and plots.
        #[arg(long, default_value = "out")]
        out: String,
    },
    /// FIFO against CLOCK eviction of the discrete GPU's memory: Table 4's traffic and
    /// a skewed hot/cold workload under each policy, in one run (every run verified).
    Aging {
        /// Backprop input units (1_092_000 is the paper's 137.5 MiB network; 1..=2^22).
        #[arg(long, default_value_t = 1 << 16, value_parser = bounded(1, MAX_INPUTS))]
        inputs: u64,
        /// Backprop training steps (1..=1000).
        #[arg(long, default_value_t = 3, value_parser = bounded_u32(1, MAX_STEPS))]
        steps: u32,
        /// Hot/cold: pages of the working set (the device holds half; 2..=2^20).
        #[arg(long, default_value_t = 4096, value_parser = bounded(2, MAX_PAGES))]
        pages: u64,
        /// Hot/cold: accesses (1..=10^8).
        #[arg(long, default_value_t = 200_000, value_parser = bounded(1, MAX_ACCESSES))]
        accesses: u64,
    },
    /// Run workloads on the SIMT GPU model (MESC geometry), verified, with per-unit L1
    /// and shared-TLB hit ratios, walks per 1000 requests and modelled cycles.
    Simt {
        /// A workload name or `all`.
        #[arg(default_value = "all")]
        workload: String,
        /// The small CI size (a few seconds per workload).
        #[arg(long)]
        quick: bool,
        /// The discrete GPU (own tables, data migrates on first touch) instead of the
        /// integrated one walking the CPU's table.
        #[arg(long)]
        discrete: bool,
        /// Instead of the table: replay each run's translation stream through shared
        /// TLBs of 256 to 8192 entries (integrated GPU).
        #[arg(long)]
        l2_sweep: bool,
        /// Time page walks across the device: one walk queue for the shared walkers,
        /// fills when the walks start, requests for a page being walked merge (off by
        /// default; harness/results/simt.md compares the two).
        #[arg(long)]
        timed_walks: bool,
    },
    /// VA→PA contiguity after a realistic churn (random faults, migrations, frees
    /// under memory pressure), with and without superpage reservations; every byte
    /// verified.
    Contiguity {
        /// The CI size (about a second).
        #[arg(long)]
        quick: bool,
        /// The churn's seed (any u64; a value that does not parse as one is refused).
        #[arg(long, default_value_t = 0x5eed, value_parser = bounded(0, u64::MAX))]
        seed: u64,
    },
    /// Replay a trace, checking every load against a reference model of the bytes.
    Replay {
        /// The trace file.
        file: String,
        #[arg(long, value_enum, default_value = "gmem")]
        format: TraceFormat,
        /// Device that replays lackey accesses.
        #[arg(long, value_enum, default_value = "gpu")]
        on: OnDevice,
        /// Pages of accelerator memory (fewer than the trace touches = oversubscription;
        /// 1..=2^20).
        #[arg(long, default_value_t = 4096, value_parser = bounded(1, MAX_PAGES))]
        gpu_pages: u64,
        /// Pages of host memory (1..=2^22, 16 GiB).
        #[arg(long, default_value_t = 1 << 20, value_parser = bounded(1, MAX_HOST_PAGES))]
        host_pages: u64,
        /// Check the core's invariants after every event (slow on long traces).
        #[arg(long)]
        check_every_event: bool,
    },
}

#[allow(clippy::too_many_arguments)]
fn run_workload(
    workload: Workload,
    accel: AccelKind,
    percent: u64,
    elements: u64,
    inputs: u64,
    steps: u32,
    n: u64,
) -> Result<Report, String> {
    if percent == 0 || elements == 0 || inputs == 0 || n == 0 {
        return Err("sizes and --device-memory-percent must be positive".into());
    }
    let accel_of = move |ws: u64| match accel {
        AccelKind::Discrete => machine::Accel::Discrete {
            pages: workloads::device_pages(ws, percent),
        },
        AccelKind::IntegratedShared => machine::Accel::IntegratedShared,
        AccelKind::IntegratedCoherent => machine::Accel::IntegratedCoherent,
    };
    let (title, o) = match workload {
        Workload::Vectoradd => (
            format!("VectorAdd: {elements} u32 elements"),
            workloads::vectoradd(elements, accel_of)?,
        ),
        Workload::Backprop => (
            format!("Back-propagation: {inputs} inputs x 16 hidden x 1 output, {steps} steps"),
            workloads::backprop(inputs, steps, accel_of)?,
        ),
        Workload::Atax => (format!("ATAX: {n} x {n}"), workloads::atax(n, accel_of)?),
    };
    let accel_desc = match accel {
        AccelKind::Discrete => format!("discrete GPU, memory {percent}% of the working set"),
        AccelKind::IntegratedShared => "integrated GPU, shared page table".to_string(),
        AccelKind::IntegratedCoherent => "integrated GPU, coherent page table".to_string(),
    };
    let mut r = Report::new(format!("{title}; {accel_desc}"));
    r.row("working set (bytes)", o.working_set);
    r.stats(&o.stats);
    r.row("device bytes zeroed", o.device_zeroed);
    r.row("GPU L1 TLB hits", o.gpu_tlb.l1_hits);
    r.row("GPU L1 TLB misses", o.gpu_tlb.l1_misses);
    r.row("GPU L2 TLB hits", o.gpu_tlb.l2_hits);
    r.row("GPU L2 TLB misses", o.gpu_tlb.l2_misses);
    r.row("GPU page walks", o.gpu_tlb.walks);
    let ok = o.mismatches == 0;
    r.verify(
        ok,
        if ok {
            format!(
                "{} values match the CPU-only reference bit for bit",
                o.compared
            )
        } else {
            format!(
                "{} of {} values differ from the CPU-only reference",
                o.mismatches, o.compared
            )
        },
    );
    Ok(r)
}

fn run_reproduce(inputs: u64, steps: u32, out: &str) -> Result<Report, String> {
    if inputs == 0 {
        return Err("--inputs must be positive".into());
    }
    let (ws, rows) = reproduce::table4(inputs, steps)?;
    let files = reproduce::write_table4(std::path::Path::new(out), ws, &rows)?;
    println!(
        "GMEM Table 4, reproduced: back-propagation, {:.1} MiB working set, {steps} steps",
        ws as f64 / (1 << 20) as f64
    );
    println!(
        "{:>22} {:>14} {:>14} {:>14} {:>10}",
        "device memory", "dev-zero-fill", "host-to-dev", "dev-to-host", "evictions"
    );
    for r in &rows {
        println!(
            "{:>12.1} MiB ({:>3.0}%) {:>10.1} MiB {:>10.1} MiB {:>10.1} MiB {:>10}",
            r.device_mib,
            r.device_percent,
            r.dev_zero_fill_mib,
            r.host_to_dev_mib,
            r.dev_to_host_mib,
            r.evictions
        );
    }
    println!("paper (137.5 MB network):");
    for (d, z, h, o) in reproduce::PAPER {
        println!(
            "{:>12.1} MB  ({:>3.0}%) {:>10.1} MB  {:>10.1} MB  {:>10.1} MB",
            d,
            d / 137.5 * 100.0,
            z,
            h,
            o
        );
    }
    println!("written: {}", files.join(", "));
    let mut r = Report::new("gmem-table4".to_string());
    for (row, label) in rows.iter().zip(["below", "above"]) {
        r.row(
            &format!("{label}: host-to-dev bytes"),
            (row.host_to_dev_mib * (1 << 20) as f64) as u64,
        );
        r.row(
            &format!("{label}: dev-to-host bytes"),
            (row.dev_to_host_mib * (1 << 20) as f64) as u64,
        );
        r.row(&format!("{label}: evictions"), row.evictions);
    }
    let ok = rows.iter().all(|r| r.verified);
    r.verify(
        ok,
        if ok {
            "trained weights match the CPU-only reference in both runs".into()
        } else {
            "weights differ".into()
        },
    );
    Ok(r)
}

fn run_full_report(out: &str) -> Result<Report, String> {
    let total = full_report::configurations().len() as u64 * 3 + 1;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} report [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?,
    );
    let full_report::FullReport {
        rows,
        table4: t4,
        files,
    } = full_report::run(std::path::Path::new(out), &bar)?;
    bar.finish_and_clear();
    println!(
        "{:<10} {:<20} {:>9} {:>8} {:>8} {:>8} {:>10} {:>10} {:>9} {:>7} {:>7} {:>8} {:>8}",
        "workload",
        "accelerator",
        "WS MiB",
        "zero",
        "migrate",
        "remote",
        "h->d MiB",
        "d->h MiB",
        "evicted",
        "L1 hit",
        "L2 hit",
        "L2 look",
        "walks"
    );
    for r in &rows {
        println!(
            "{:<10} {:<20} {:>9.1} {:>8} {:>8} {:>8} {:>10.1} {:>10.1} {:>9} {:>7.3} {:>7.3} {:>8} {:>8}",
            r.workload,
            r.accel,
            r.working_set as f64 / (1 << 20) as f64,
            r.faults_zero_fill,
            r.faults_migrate,
            r.faults_remote,
            r.bytes_host_to_dev as f64 / (1 << 20) as f64,
            r.bytes_dev_to_host as f64 / (1 << 20) as f64,
            r.evictions,
            r.gpu_l1_hit_ratio,
            r.gpu_l2_hit_ratio,
            r.gpu_l2_lookups,
            r.gpu_walks
        );
    }
    println!("{}", full_report::l2_note(&rows));
    println!("\nGMEM Table 4 (device memory: dev-zero-fill / host-to-dev / dev-to-host, MiB):");
    for r in &t4 {
        println!(
            "  {:>6.1} MiB ({:>3.0}%): {:>6.1} / {:>6.1} / {:>6.1}",
            r.device_mib,
            r.device_percent,
            r.dev_zero_fill_mib,
            r.host_to_dev_mib,
            r.dev_to_host_mib
        );
    }
    println!("\nwritten: {}", files.join(", "));
    // GMEM Table 3: prints its own table and writes out/iommu.{csv,json,svg}.
    println!();
    let iommu = iommu_bench::run(2000, 20_000, out)?;
    // The SIMT GPU model (MESC geometry, integrated GPU): every workload, full size.
    println!();
    let simt_rows = simt::run(
        gmem_simt::workloads::WORKLOADS,
        gmem_simt::workloads::Size::Full,
        false,
        false,
    )?;
    let simt_table = simt::table(&simt_rows);
    print!("{simt_table}");
    let dir = std::path::Path::new(out);
    std::fs::write(dir.join("simt.txt"), &simt_table).map_err(|e| e.to_string())?;
    std::fs::write(
        dir.join("simt.json"),
        serde_json::to_string_pretty(&simt_rows).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let failed = rows.iter().filter(|r| !r.verified).count()
        + t4.iter().filter(|r| !r.verified).count()
        + simt_rows.iter().filter(|r| !r.verified).count()
        + usize::from(!iommu.ok());
    let runs = rows.len() + t4.len() + simt_rows.len();
    let mut r = Report::new(format!("gmem-harness report: {runs} runs"));
    r.row("runs", runs as u64);
    r.row("runs that differ from their reference", failed as u64);
    r.verify(
        failed == 0,
        if failed == 0 {
            format!(
                "all {runs} runs match their CPU-only references and every DMA of the IOMMU churn landed its bytes; report in {out}/report.md, SIMT table in {out}/simt.txt"
            )
        } else {
            format!("{failed} runs differ")
        },
    );
    Ok(r)
}

fn run_replay(
    file: &str,
    format: trace::Format,
    gpu_pages: u64,
    host_pages: u64,
    check_every: bool,
) -> Result<Report, String> {
    let f = File::open(file).map_err(|e| format!("{file}: {e}"))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} replay [{bar:30}] {bytes}/{total_bytes} {per_sec} eta {eta}",
        )
        .map_err(|e| e.to_string())?,
    );
    let reader = trace::Reader::new(BufReader::new(bar.wrap_read(f)), file, format);
    let mut rep = replay::Replayer::new(gpu_pages, host_pages)?;
    for ev in reader {
        let ev = ev.map_err(|e| e.to_string())?;
        rep.step(&ev)
            .map_err(|e| format!("{file}: event {}: {e}", rep.counts.events + 1))?;
        if check_every {
            rep.check()?;
        }
    }
    bar.finish_and_clear();
    rep.check()?;
    let c = rep.counts;
    let mut r = Report::new(format!("replay {file}: {} events", c.events));
    r.row("events", c.events);
    r.row("loads checked", c.loads);
    r.row("stores", c.stores);
    r.row("bytes accessed", c.bytes);
    r.stats(&rep.stats());
    r.verify(
        true,
        format!(
            "{} loads match the reference model; invariants hold",
            c.loads
        ),
    );
    Ok(r)
}

fn run_simt(
    workload: &str,
    quick: bool,
    discrete: bool,
    timed_walks: bool,
    output: Output,
) -> ExitCode {
    let size = if quick {
        gmem_simt::workloads::Size::Quick
    } else {
        gmem_simt::workloads::Size::Full
    };
    let rows = match simt::names(workload).and_then(|n| simt::run(&n, size, discrete, timed_walks))
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("simt: {e}");
            return ExitCode::FAILURE;
        }
    };
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("rows serialise")
        ),
        Output::Csv | Output::Table => print!("{}", simt::table(&rows)),
    }
    if rows.iter().all(|r| r.verified) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let output = if cli.json {
        Output::Json
    } else if cli.csv {
        Output::Csv
    } else {
        Output::Table
    };
    let result = match cli.command {
        None => run_workload(
            Workload::Vectoradd,
            AccelKind::Discrete,
            50,
            1 << 20,
            1 << 16,
            3,
            1024,
        ),
        Some(Command::Run {
            workload,
            accel,
            device_memory_percent,
            elements,
            inputs,
            steps,
            n,
        }) => run_workload(
            workload,
            accel,
            device_memory_percent,
            elements,
            inputs,
            steps,
            n,
        ),
        Some(Command::Report { out }) => run_full_report(&out),
        Some(Command::Simt {
            workload,
            quick,
            discrete,
            l2_sweep: false,
            timed_walks,
        }) => return run_simt(&workload, quick, discrete, timed_walks, output),
        Some(Command::Simt {
            workload,
            quick,
            l2_sweep: true,
            ..
        }) => {
            let size = if quick {
                gmem_simt::workloads::Size::Quick
            } else {
                gmem_simt::workloads::Size::Full
            };
            return match simt::names(&workload).and_then(|n| simt::sweep(&n, size)) {
                Ok(t) => {
                    print!("{t}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("simt: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Some(Command::Reproduce {
            experiment: Experiment::GmemTable4,
            inputs,
            steps,
            out,
            ..
        }) => run_reproduce(inputs, steps, &out),
        Some(Command::Reproduce {
            experiment: Experiment::Iommu,
            inval_ns,
            packets,
            out,
            ..
        }) => iommu_bench::run(inval_ns, packets, &out),
        Some(Command::Aging {
            inputs,
            steps,
            pages,
            accesses,
        }) => match aging::run(inputs, steps, pages, accesses) {
            Ok(rows) => {
                print!("{}", aging::render(&rows));
                if rows.iter().all(|r| r.verified) {
                    return ExitCode::SUCCESS;
                }
                eprintln!("a run did not verify");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("aging: {e}");
                return ExitCode::FAILURE;
            }
        },
        Some(Command::Contiguity { quick, seed }) => {
            let p = contiguity::Params::new(quick, seed);
            return match contiguity::run(p) {
                Ok(rows) => {
                    match output {
                        Output::Json => println!(
                            "{}",
                            serde_json::to_string_pretty(&rows).unwrap_or_default()
                        ),
                        _ => print!("{}", contiguity::render(&rows, &p)),
                    }
                    if rows.iter().all(|r| r.verified) {
                        ExitCode::SUCCESS
                    } else {
                        eprintln!("a run did not verify");
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("contiguity: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Some(Command::Reproduce {
            experiment: Experiment::Regdem,
            quick,
            out,
            ..
        }) => regdem_report::run(quick, &out, output),
        Some(Command::Reproduce {
            experiment: Experiment::Adsm,
            quick,
            out,
            ..
        }) => adsm_report::run(quick, &out, output),
        Some(Command::Reproduce {
            experiment: Experiment::Coda,
            quick,
            out,
            ..
        }) => coda_report::run_report(quick, &out, output),
        Some(Command::Reproduce {
            experiment: Experiment::Mesc,
            pagemap: Some(pid),
            ..
        }) => {
            return match pagemap::read(&pid) {
                Ok(p) => {
                    pagemap::print(&pid, &p);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("pagemap: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Some(Command::Reproduce {
            experiment: Experiment::Mesc,
            quick,
            out,
            ..
        }) => mesc::run(quick, &out, output),
        Some(Command::Reproduce {
            experiment: Experiment::Uvm,
            quick,
            out,
            ..
        }) => uvm::run(quick, &out, output),
        Some(Command::Replay {
            file,
            format,
            on,
            gpu_pages,
            host_pages,
            check_every_event,
        }) => {
            let on = match on {
                OnDevice::Cpu => trace::Dev::Cpu,
                OnDevice::Gpu => trace::Dev::Gpu,
            };
            let format = match format {
                TraceFormat::Gmem => trace::Format::Gmem,
                TraceFormat::Lackey => trace::Format::Lackey { on },
            };
            run_replay(&file, format, gpu_pages, host_pages, check_every_event)
        }
    };
    match result {
        Ok(report) => {
            report.print(output);
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(args: &[&str]) -> String {
        match Cli::try_parse_from(args) {
            Ok(_) => panic!("{args:?} was accepted"),
            Err(e) => {
                assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{e}");
                e.to_string()
            }
        }
    }

    #[test]
    fn an_invalidation_latency_out_of_range_is_refused_with_the_range() {
        let m = refused(&[
            "gmem-harness",
            "reproduce",
            "iommu",
            "--inval-ns",
            "99999999999999",
        ]);
        assert!(m.contains("--inval-ns") && m.contains("0..=100000"), "{m}");
        assert!(Cli::try_parse_from([
            "gmem-harness",
            "reproduce",
            "iommu",
            "--inval-ns",
            "100000"
        ])
        .is_ok());
    }

    #[test]
    fn every_bounded_numeric_argument_refuses_zero_or_too_much() {
        let cases: &[&[&str]] = &[
            &["run", "--device-memory-percent", "0"],
            &["run", "--device-memory-percent", "1001"],
            &["run", "--elements", "0"],
            &["run", "--elements", "67108865"],
            &["run", "--inputs", "4194305"],
            &["run", "--steps", "0"],
            &["run", "--steps", "1001"],
            &["run", "--n", "8193"],
            &["reproduce", "iommu", "--packets", "0"],
            &["reproduce", "iommu", "--packets", "1000001"],
            &["reproduce", "gmem-table4", "--inputs", "0"],
            &["reproduce", "gmem-table4", "--steps", "4000000000"],
            &["aging", "--pages", "1"],
            &["aging", "--pages", "1048577"],
            &["aging", "--accesses", "0"],
            &["aging", "--accesses", "100000001"],
            &["aging", "--inputs", "0"],
            &["aging", "--steps", "0"],
            &["replay", "t", "--gpu-pages", "0"],
            &["replay", "t", "--host-pages", "4194305"],
        ];
        for c in cases {
            let args: Vec<&str> = std::iter::once("gmem-harness")
                .chain(c.iter().copied())
                .collect();
            let m = refused(&args);
            assert!(m.contains(c[c.len() - 2]), "{c:?}: {m}");
        }
        // A seed takes any u64 but not something else.
        assert!(Cli::try_parse_from([
            "gmem-harness",
            "contiguity",
            "--seed",
            "18446744073709551615"
        ])
        .is_ok());
        assert!(Cli::try_parse_from(["gmem-harness", "contiguity", "--seed", "-1"]).is_err());
        // The defaults are inside the bounds.
        for c in [
            &["run"][..],
            &["reproduce", "iommu"],
            &["aging"],
            &["replay", "t"],
        ] {
            let args: Vec<&str> = std::iter::once("gmem-harness")
                .chain(c.iter().copied())
                .collect();
            assert!(Cli::try_parse_from(&args).is_ok(), "{c:?}");
        }
    }
}
