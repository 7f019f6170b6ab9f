//! `gmem-harness`: runs workloads and replays traces over gmem-core on simulated devices
//! that hold real bytes, and verifies every result against a CPU-only reference.

mod replay;
mod report;
mod trace;
mod workloads;

use clap::{Parser, Subcommand, ValueEnum};
use report::{Output, Report};
use std::fs::File;
use std::io::BufReader;
use std::process::ExitCode;

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
        /// Elements per vector (u32).
        #[arg(long, default_value_t = 1 << 20)]
        elements: u64,
        /// Device memory as a percentage of the working set.
        #[arg(long, default_value_t = 50)]
        device_memory_percent: u64,
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
        /// Pages of accelerator memory (fewer than the trace touches = oversubscription).
        #[arg(long, default_value_t = 4096)]
        gpu_pages: u64,
        /// Pages of host memory.
        #[arg(long, default_value_t = 1 << 20)]
        host_pages: u64,
        /// Check the core's invariants after every event (slow on long traces).
        #[arg(long)]
        check_every_event: bool,
    },
}

fn run_workload(elements: u64, percent: u64) -> Result<Report, String> {
    if elements == 0 || percent == 0 {
        return Err("--elements and --device-memory-percent must be positive".into());
    }
    let (stats, mismatches) = workloads::vectoradd(elements, percent)?;
    let mut r = Report::new(format!(
        "VectorAdd: {elements} u32 elements, device memory {percent}% of the working set"
    ));
    r.stats(&stats);
    r.verify(
        mismatches == 0,
        if mismatches == 0 {
            format!("{elements} elements match the CPU-only reference")
        } else {
            format!("{mismatches} of {elements} elements differ from the CPU-only reference")
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
        None => run_workload(1 << 20, 50),
        Some(Command::Run {
            workload: Workload::Vectoradd,
            elements,
            device_memory_percent,
        }) => run_workload(elements, device_memory_percent),
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
