//! Reports: a title, named counters, a verification line; printed as a table, JSON or
//! CSV.

use gmem_core::Stats;

/// How to print a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Aligned text for people.
    Table,
    /// One JSON object.
    Json,
    /// `key,value` rows.
    Csv,
}

/// What a run did and whether it verified.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    title: String,
    rows: Vec<(String, u64)>,
    verified: bool,
    verification: String,
    /// Print nothing (the caller already printed the rows in the requested format).
    #[serde(skip)]
    quiet: bool,
}

impl Report {
    /// An empty report.
    pub fn new(title: String) -> Report {
        Report {
            title,
            rows: Vec::new(),
            verified: false,
            verification: String::new(),
            quiet: false,
        }
    }

    /// Add a counter.
    pub fn row(&mut self, key: &str, value: u64) {
        self.rows.push((key.to_string(), value));
    }

    /// Add the core's counters.
    pub fn stats(&mut self, s: &Stats) {
        for (k, v) in [
            ("faults: zero-fill", s.faults_zero_fill),
            ("faults: migrate", s.faults_migrate),
            ("faults: remote", s.faults_remote),
            ("faults: map existing", s.faults_map_existing),
            ("faults: spurious", s.faults_spurious),
            ("faults: failed", s.faults_failed),
            ("pages zeroed", s.pages_zeroed),
            ("bytes host->dev", s.bytes_host_to_dev),
            ("bytes dev->host", s.bytes_dev_to_host),
            ("bytes dev->dev", s.bytes_dev_to_dev),
            ("evictions (pages)", s.evictions),
            ("mmu map calls", s.mmu_maps),
            ("mmu unmap calls", s.mmu_unmaps),
            ("TLB invalidations", s.invalidations),
            ("invalidations coalesced", s.invalidations_coalesced),
        ] {
            self.row(k, v);
        }
    }

    /// Record the verification outcome.
    pub fn verify(&mut self, ok: bool, what: String) {
        self.verified = ok;
        self.verification = what;
    }

    /// Whether the run verified.
    pub fn ok(&self) -> bool {
        self.verified
    }

    /// This report with printing switched off (its verdict still sets the exit code).
    pub fn quiet(mut self) -> Report {
        self.quiet = true;
        self
    }

    /// This report as a `reproduce` experiment ends it: printed as a table, or, when
    /// the rows went out as CSV or JSON, switched off with only the verdict on stderr
    /// (`experiment: verified = ...`) so that the machine-readable output stays clean.
    pub fn for_output(self, experiment: &str, output: Output) -> Report {
        if output == Output::Table {
            self
        } else {
            eprintln!("{experiment}: verified = {}", self.verified);
            self.quiet()
        }
    }

    /// Print it.
    pub fn print(&self, output: Output) {
        if self.quiet {
            return;
        }
        match output {
            Output::Table => {
                println!("{}", self.title);
                for (k, v) in &self.rows {
                    println!("  {k:<24} {v:>14}");
                }
                println!(
                    "verify: {} ({})",
                    if self.verified { "OK" } else { "FAILED" },
                    self.verification
                );
            }
            Output::Json => {
                let obj = serde_json::json!({
                    "title": self.title,
                    "counters": self.rows.iter().map(|(k, v)| (k.clone(), serde_json::Value::from(*v))).collect::<serde_json::Map<_, _>>(),
                    "verified": self.verified,
                    "verification": self.verification,
                });
                println!("{obj}");
            }
            Output::Csv => {
                println!("key,value");
                println!("title,\"{}\"", self.title.replace('"', "\"\""));
                for (k, v) in &self.rows {
                    println!("\"{k}\",{v}");
                }
                println!("verified,{}", self.verified);
            }
        }
    }
}
