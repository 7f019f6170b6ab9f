//! `cargo xtask fuzz [--secs N]`: each fuzz target of `fuzz/` for N seconds.
//!
//! `fuzz/` is its own workspace (cargo-fuzz, libfuzzer-sys, arbitrary) whose targets
//! call the `gmem-testkit` runners. It needs a nightly toolchain for the sanitizer
//! flags: `rustup run nightly` when one is installed, else the stable toolchain with
//! `RUSTC_BOOTSTRAP=1` and no sanitizer. cargo-fuzz is installed
//! with `cargo install cargo-fuzz --locked` when absent. A crash fails the step and
//! leaves its input in `fuzz/artifacts/<target>/`; libFuzzer's final statistics
//! (executions, executions per second) are printed per target. Each run starts from
//! seeded long inputs in `fuzz/corpus/<target>/` and may grow inputs to `MAX_LEN`
//! bytes. CI fuzzes with a fixed libFuzzer seed (a red run is made again by a rerun);
//! `cargo xtask fuzz` by hand draws a new one each run.

use std::process::{Command, Stdio};

/// The fuzz targets, each a `[[bin]]` of `fuzz/Cargo.toml`.
pub const TARGETS: &[&str] = &["vmem", "kpi", "page_table", "trace", "private"];

fn have_nightly() -> bool {
    Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn have_cargo_fuzz() -> bool {
    Command::new("cargo")
        .args(["fuzz", "--version"])
        .env_remove("CARGO")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Install cargo-fuzz if `cargo fuzz` does not run.
fn ensure_cargo_fuzz() -> Result<(), String> {
    if have_cargo_fuzz() {
        return Ok(());
    }
    eprintln!("\n== installing cargo-fuzz: cargo install cargo-fuzz --locked");
    let ok = Command::new(env!("CARGO"))
        .args(["install", "cargo-fuzz", "--locked"])
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(())
    } else {
        Err("cargo install cargo-fuzz failed".into())
    }
}

/// The `Done N runs in S second(s)` line and the `stat::` lines of libFuzzer's output.
fn final_stats(output: &str) -> Vec<&str> {
    output
        .lines()
        .filter(|l| l.starts_with("Done ") || l.starts_with("stat::"))
        .collect()
}

/// Longest input libFuzzer may build: an operation list of several hundred steps (the
/// default grows inputs so slowly that ten minutes of `kpi` reached only 116 bytes).
pub const MAX_LEN: usize = 4096;
/// Seed inputs written per target, and their length.
const SEEDS: u64 = 8;
const SEED_LEN: usize = 1024;

/// Write `SEEDS` deterministic pseudo-random inputs of `SEED_LEN` bytes into the
/// target's corpus directory (if absent), so that every run starts from long operation
/// sequences rather than from empty input. Returns the directory.
fn seed_corpus(target: &str) -> Result<std::path::PathBuf, String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for k in 0..SEEDS {
        let path = dir.join(format!("seed-{k}"));
        if path.exists() {
            continue;
        }
        // xorshift64*, seeded per target and seed index: repeatable across runs.
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (k + 1) ^ ((target.len() as u64) << 32);
        let bytes: Vec<u8> = (0..SEED_LEN)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
            })
            .collect();
        std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(dir)
}

/// Run every target for `secs` seconds.
///
/// `seed`: libFuzzer's `-seed` (CI passes a fixed one, so that the mutations a red run
/// made are made again on a rerun; by hand, none: a new random seed each run).
pub fn fuzz(secs: u64, seed: Option<u32>) -> Result<(), String> {
    ensure_cargo_fuzz()?;
    let nightly = have_nightly();
    for target in TARGETS {
        let step = format!("fuzz {target} for {secs} s");
        let mut cmd = if nightly {
            let mut c = Command::new("rustup");
            c.args(["run", "nightly", "cargo"]);
            c
        } else {
            let mut c = Command::new("cargo");
            c.env("RUSTC_BOOTSTRAP", "1");
            c
        };
        cmd.args(["fuzz", "run"]);
        if !nightly {
            // Without nightly's sanitizer runtimes: coverage-guided, no AddressSanitizer
            // (the runners are safe Rust; the sanitizer only adds a net under it).
            cmd.args(["--sanitizer", "none"]);
        }
        let corpus = seed_corpus(target)?;
        cmd.arg(target)
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={secs}"))
            .arg(format!("-max_len={MAX_LEN}"))
            .args(seed.map(|s| format!("-seed={s}")))
            .arg("-print_final_stats=1")
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz"))
            .env_remove("CARGO")
            .env_remove("RUSTC")
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_TARGET_DIR");
        eprintln!(
            "\n== {step}: {}cargo fuzz run {target} fuzz/corpus/{target} -- -max_total_time={secs} -max_len={MAX_LEN}{}",
            if nightly {
                "rustup run nightly "
            } else {
                "RUSTC_BOOTSTRAP=1 "
            },
            seed.map(|s| format!(" -seed={s}")).unwrap_or_default()
        );
        let out = cmd
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("{step}: {e}"))?;
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            eprintln!("{err}");
            return Err(format!(
                "{step} failed ({}); the crashing input is in fuzz/artifacts/{target}/",
                out.status
            ));
        }
        for line in final_stats(&err) {
            eprintln!("   {target}: {line}");
        }
    }
    Ok(())
}
