//! `cargo xtask qemu`: build the Sv39 kernel and boot it under QEMU.
//!
//! The kernel (`drivers/sv39/kernel`, its own cargo workspace) is format-checked, linted
//! and built for `riscv64gc-unknown-none-elf`, then booted with
//! `qemu-system-riscv64 -machine virt -nographic -bios default` (QEMU's OpenSBI). The
//! UART output is streamed as it comes. The run passes when QEMU exits with status 0
//! (the kernel wrote the SiFive test device's pass code) *and* the kernel printed its
//! pass line and its megapage lines (`megapage:` one fault served by one 2 MiB leaf,
//! `split:` the leaf split by a partial protect); a failure code, a missing line or the
//! timeout fails it.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// The kernel's directory, relative to the repository root.
const KERNEL_DIR: &str = "drivers/sv39/kernel";
/// Its target.
const TARGET: &str = "riscv64gc-unknown-none-elf";
/// The line the kernel prints when every check passed.
const PASS_LINE: &str = "sv39-kernel: PASS";
/// Lines the kernel must print before its pass line (the megapage demonstration: one
/// fault served by one 2 MiB leaf, then split by a partial protect).
const REQUIRED: [&str; 2] = ["megapage: ", "split: "];
/// How long the boot may take, OpenSBI included.
const TIMEOUT: Duration = Duration::from_secs(60);
/// The QEMU binary.
const QEMU: &str = "qemu-system-riscv64";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the repository root")
        .to_path_buf()
}

fn cargo_in(dir: &Path, step: &str, args: &[&str]) -> Result<(), String> {
    eprintln!("\n== {step}: (in {KERNEL_DIR}) cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(dir)
        .status()
        .map_err(|e| format!("{step}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{step} failed ({status})"))
    }
}

/// Check, build and boot the kernel.
pub fn qemu() -> Result<(), String> {
    let dir = repo_root().join(KERNEL_DIR);
    let target_dir = dir.join("target");
    let target_dir_s = target_dir.to_string_lossy().into_owned();
    cargo_in(&dir, "kernel format", &["fmt", "--", "--check"])?;
    let common = [
        "--release",
        "--target",
        TARGET,
        "--target-dir",
        &target_dir_s,
    ];
    let mut clippy = vec!["clippy"];
    clippy.extend(common);
    clippy.extend(["--", "-D", "warnings"]);
    cargo_in(&dir, "kernel clippy", &clippy)?;
    let mut build = vec!["build"];
    build.extend(common);
    cargo_in(&dir, "kernel build", &build)?;
    let elf = target_dir.join(TARGET).join("release").join("sv39-kernel");
    boot(&elf)
}

enum Output {
    Line(String),
    Closed,
}

fn pump(from: impl Read + Send + 'static, to: mpsc::Sender<Output>) {
    thread::spawn(move || {
        let mut r = BufReader::new(from);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    let line = line.trim_end_matches(['\n', '\r']).to_string();
                    if to.send(Output::Line(line)).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.send(Output::Closed);
    });
}

fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Boot `elf` and judge the run.
fn boot(elf: &Path) -> Result<(), String> {
    let args = [
        "-machine",
        "virt",
        "-nographic",
        "-bios",
        "default",
        "-m",
        "128M",
        "-smp",
        "1",
        "-monitor",
        "none",
        "-no-reboot",
        "-kernel",
    ];
    eprintln!(
        "\n== boot: {QEMU} {} {} (timeout {} s)",
        args.join(" "),
        elf.display(),
        TIMEOUT.as_secs()
    );
    let mut child = Command::new(QEMU)
        .args(args)
        .arg(elf)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!("cannot start {QEMU}: {e} (install qemu-system-misc; `bash .ci/run` does)")
        })?;
    let (tx, rx) = mpsc::channel();
    pump(child.stdout.take().expect("piped stdout"), tx.clone());
    pump(child.stderr.take().expect("piped stderr"), tx);
    let deadline = Instant::now() + TIMEOUT;
    let mut open = 2;
    let mut passed = false;
    let mut seen = [false; REQUIRED.len()];
    while open > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Output::Line(line)) => {
                passed |= line.trim() == PASS_LINE;
                for (k, r) in REQUIRED.iter().enumerate() {
                    seen[k] |= line.starts_with(r);
                }
                println!("{line}");
            }
            Ok(Output::Closed) => open -= 1,
            Err(_) => {
                stop(&mut child);
                return Err(format!(
                    "qemu: no exit within {} s (kernel hung?)",
                    TIMEOUT.as_secs()
                ));
            }
        }
    }
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                stop(&mut child);
                return Err("qemu: closed its output but did not exit".into());
            }
            Err(e) => return Err(format!("qemu: {e}")),
        }
    };
    if let Some(k) = seen.iter().position(|s| !s) {
        return Err(format!(
            "qemu: the kernel never printed its `{}` line",
            REQUIRED[k].trim()
        ));
    }
    match (status.code(), passed) {
        (Some(0), true) => {
            eprintln!("\nqemu: the kernel passed (test device: pass)");
            Ok(())
        }
        (Some(0), false) => Err("qemu: exited 0 but the kernel never printed its pass line".into()),
        (Some(code), _) => Err(format!(
            "qemu: the kernel failed (exit status {code}: the kernel's failure code)"
        )),
        (None, _) => Err(format!("qemu: killed ({status})")),
    }
}
