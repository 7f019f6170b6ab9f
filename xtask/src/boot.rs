//! What the two kernel tasks (`qemu`, `qemu-x86`) share: the kernel crate's checks and
//! builds in its own cargo workspace, and one QEMU boot with its output streamed as it
//! comes, collected, and bounded in time.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// A bare-metal kernel crate: its own cargo workspace, built for one target into its
/// own target directory.
pub struct Kernel {
    /// The crate's directory, relative to the repository root (for messages).
    pub rel: &'static str,
    /// Its directory.
    pub dir: PathBuf,
    /// The rust target it is built for.
    pub target: &'static str,
    /// Its target directory.
    pub target_dir: PathBuf,
}

impl Kernel {
    /// The kernel crate at `rel` (relative to the repository root), built for `target`.
    pub fn new(rel: &'static str, target: &'static str) -> Kernel {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask lives in the repository root")
            .to_path_buf();
        let dir = root.join(rel);
        let target_dir = dir.join("target");
        Kernel {
            rel,
            dir,
            target,
            target_dir,
        }
    }

    /// `cargo <args>` in the kernel's workspace, as step `step`.
    pub fn cargo(&self, step: &str, args: &[&str]) -> Result<(), String> {
        eprintln!("\n== {step}: (in {}) cargo {}", self.rel, args.join(" "));
        let status = Command::new(env!("CARGO"))
            .args(args)
            .current_dir(&self.dir)
            .status()
            .map_err(|e| format!("{step}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("{step} failed ({status})"))
        }
    }

    /// `cargo <command> --release --target T --target-dir D <extra>`.
    fn cargo_for_target(&self, step: &str, command: &str, extra: &[&str]) -> Result<(), String> {
        let target_dir = self.target_dir.to_string_lossy().into_owned();
        let mut args = vec![
            command,
            "--release",
            "--target",
            self.target,
            "--target-dir",
            &target_dir,
        ];
        args.extend(extra);
        self.cargo(step, &args)
    }

    /// The format check and the lints (`-D warnings`), named `what` in the steps.
    pub fn check(&self, what: &str) -> Result<(), String> {
        self.cargo(&format!("{what} format"), &["fmt", "--", "--check"])?;
        self.cargo_for_target(
            &format!("{what} clippy"),
            "clippy",
            &["--", "-D", "warnings"],
        )
    }

    /// A release build with the cargo arguments `extra` (features), as step `step`.
    pub fn build(&self, step: &str, extra: &[&str]) -> Result<(), String> {
        self.cargo_for_target(step, "build", extra)
    }

    /// Where the release build of binary `name` lands.
    pub fn artifact(&self, name: &str) -> PathBuf {
        self.target_dir.join(self.target).join("release").join(name)
    }
}

/// What one boot printed (control characters taken out: firmware consoles write
/// terminal escapes) and how QEMU exited.
pub struct Run {
    pub lines: Vec<String>,
    /// QEMU's exit status (`None`: killed by a signal).
    pub status: Option<i32>,
}

enum Output {
    Line(String),
    Closed,
}

/// Send every line `from` gives to `to`, then say it closed.
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

/// Run `qemu` with `args` (announced as step `step`), print its output as it comes and
/// collect it; fail if it has not exited within `timeout`. `install` names what a
/// machine without `qemu` must install.
pub fn qemu(
    step: &str,
    qemu: &str,
    args: &[String],
    timeout: Duration,
    install: &str,
) -> Result<Run, String> {
    eprintln!(
        "\n== {step}: {qemu} {} (timeout {} s)",
        args.join(" "),
        timeout.as_secs()
    );
    let mut child = Command::new(qemu)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!("cannot start {qemu}: {e} (install {install}; `bash .ci/run` does)")
        })?;
    let (tx, rx) = mpsc::channel();
    pump(child.stdout.take().expect("piped stdout"), tx.clone());
    pump(child.stderr.take().expect("piped stderr"), tx);
    let deadline = Instant::now() + timeout;
    let mut open = 2;
    let mut lines = Vec::new();
    while open > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Output::Line(line)) => {
                println!("{line}");
                lines.push(line.chars().filter(|c| !c.is_control()).collect());
            }
            Ok(Output::Closed) => open -= 1,
            Err(_) => {
                stop(&mut child);
                return Err(format!(
                    "qemu: no exit within {} s (kernel hung?)",
                    timeout.as_secs()
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
    Ok(Run {
        lines,
        status: status.code(),
    })
}
