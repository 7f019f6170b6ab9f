//! `cargo xtask qemu`: build the Sv39 kernel and boot it under QEMU.
//!
//! The kernel (`drivers/sv39/kernel`, its own cargo workspace) is format-checked, linted
//! and built for `riscv64gc-unknown-none-elf`, then booted with
//! `qemu-system-riscv64 -machine virt -smp 4 -nographic -bios default` (QEMU's
//! OpenSBI). The UART output is streamed as it comes. The run passes when QEMU exits
//! with status 0 (the kernel wrote the SiFive test device's pass code) *and* the kernel
//! printed its pass line and every line of [`REQUIRED`]: the single-hart megapage lines
//! (`megapage:` one fault served by one 2 MiB leaf, `split:` the leaf split by a
//! partial protect) and the four-hart lines (`smp:` harts up, concurrent faults,
//! shootdowns, stress); a failure code, a missing line or the timeout fails it.
//!
//! Then the **negative boot**, the way `xtask loom` runs its broken variants: the kernel
//! is rebuilt with the cargo feature `no-shootdown` (the driver's remote fences are
//! skipped, so the other harts keep stale translations) and booted again. It must fail
//! *with* the line saying that each of its four shootdown checks saw a stale
//! translation (a failure for another reason, a check that passes, a pass or a hang
//! fails the task); the xtask then prints `smp: missing shootdown caught`.

use crate::boot::{self, Kernel, Run};
use std::path::Path;
use std::time::Duration;

/// The kernel's directory, relative to the repository root.
const KERNEL_DIR: &str = "drivers/sv39/kernel";
/// Its target.
const TARGET: &str = "riscv64gc-unknown-none-elf";
/// The line the kernel prints when every check passed.
const PASS_LINE: &str = "sv39-kernel: PASS";
/// Lines the kernel must print before its pass line: the megapage demonstration (one
/// fault served by one 2 MiB leaf, then split by a partial protect) and the four-hart
/// checks (`drivers/sv39/kernel/src/smp/`).
const REQUIRED: [&str; 6] = [
    "megapage: ",
    "split: ",
    "smp: 4 harts up",
    "smp: concurrent faults served",
    "smp: shootdown verified on 4 harts",
    "smp: stress ok",
];
/// What the negative boot's kernel must fail with: each of its four shootdown checks
/// (strict dealloc, protect, asynchronous dealloc, migration) saw a hart use a
/// translation the core had invalidated.
const STALE_LINE: &str = "stale translation caught by 4 of 4 shootdown checks";
/// The feature that leaves the shootdown out.
const NEGATIVE_FEATURE: &str = "no-shootdown";
/// Harts QEMU gives the kernel.
const HARTS: &str = "4";
/// How long one boot may take, OpenSBI included.
const TIMEOUT: Duration = Duration::from_secs(120);
/// The QEMU binary.
const QEMU: &str = "qemu-system-riscv64";

/// Check, build and boot the kernel.
pub fn qemu() -> Result<(), String> {
    let kernel = Kernel::new(KERNEL_DIR, TARGET);
    kernel.check("kernel")?;
    let elf = kernel.artifact("sv39-kernel");
    // The negative kernel first, kept under its own name, so that the kernel left in
    // the target directory is the real one.
    let negative_elf = elf.with_file_name(format!("sv39-kernel-{NEGATIVE_FEATURE}"));
    kernel.build(
        "kernel build (negative: no-shootdown)",
        &["--features", NEGATIVE_FEATURE],
    )?;
    std::fs::copy(&elf, &negative_elf)
        .map_err(|e| format!("copy {} to {}: {e}", elf.display(), negative_elf.display()))?;
    kernel.build("kernel build", &[])?;
    judge(&boot(&elf)?)?;

    // The negative boot: without the remote fences the shootdown check must fail.
    let run = boot(&negative_elf)?;
    let caught = run
        .lines
        .iter()
        .find(|l| l.contains(STALE_LINE) && l.contains("FAIL"));
    match (run.status, caught) {
        (Some(code), Some(line)) if code != 0 => {
            println!("smp: missing shootdown caught (`{NEGATIVE_FEATURE}` build: {})", line.trim());
            Ok(())
        }
        (Some(0), _) => Err(format!(
            "qemu (negative): the `{NEGATIVE_FEATURE}` kernel passed: the shootdown check cannot fail"
        )),
        _ => Err(format!(
            "qemu (negative): the `{NEGATIVE_FEATURE}` kernel did not fail with a `{STALE_LINE}` line (status {:?})",
            run.status
        )),
    }
}

/// Judge a boot that must pass.
fn judge(run: &Run) -> Result<(), String> {
    let passed = run.lines.iter().any(|l| l.trim() == PASS_LINE);
    if let Some(r) = REQUIRED
        .iter()
        .find(|r| !run.lines.iter().any(|l| l.starts_with(*r)))
    {
        return Err(format!(
            "qemu: the kernel never printed its `{}` line",
            r.trim()
        ));
    }
    match (run.status, passed) {
        (Some(0), true) => {
            eprintln!("\nqemu: the kernel passed (test device: pass)");
            Ok(())
        }
        (Some(0), false) => Err("qemu: exited 0 but the kernel never printed its pass line".into()),
        (Some(code), _) => Err(format!(
            "qemu: the kernel failed (exit status {code}: the kernel's failure code)"
        )),
        (None, _) => Err("qemu: killed by a signal".into()),
    }
}

/// Boot `elf`, stream its output, and collect it with QEMU's exit status.
fn boot(elf: &Path) -> Result<Run, String> {
    let mut args: Vec<String> = [
        "-machine",
        "virt",
        "-nographic",
        "-bios",
        "default",
        "-m",
        "128M",
        "-smp",
        HARTS,
        "-monitor",
        "none",
        "-no-reboot",
        "-kernel",
    ]
    .map(String::from)
    .to_vec();
    args.push(elf.display().to_string());
    boot::qemu("boot", QEMU, &args, TIMEOUT, "qemu-system-misc")
}
