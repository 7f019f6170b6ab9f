//! `cargo xtask qemu-x86`: build the x86-64 kernel and boot it under QEMU's `q35` with
//! an Intel VT-d IOMMU.
//!
//! The kernel (`drivers/x86pt/kernel`, its own cargo workspace) is format-checked,
//! linted and built for `x86_64-unknown-uefi`, copied to `EFI/BOOT/BOOTX64.EFI` of a
//! directory QEMU serves as a FAT drive, and booted by OVMF (Debian's `ovmf` package)
//! with `qemu-system-x86_64 -machine q35 -device intel-iommu,aw-bits=48`, QEMU's `edu`
//! device and an NVMe controller over a raw image the xtask creates. The serial output
//! is streamed as it comes. The run passes when QEMU exits through `isa-debug-exit` with
//! the kernel's pass status (33) *and* the kernel printed every line of [`REQUIRED`]
//! and its pass line last; a failure status, a missing line or the timeout fails it.
//!
//! A second boot is the negative test: the kernel, told by `\gmem.cfg` on the boot
//! drive, gives the edu device's IOMMU driver a format that sets a reserved bit in every
//! second-level leaf. QEMU's VT-d model must refuse those entries: the run passes only if
//! the kernel did *not* pass and printed the unit's reserved-field fault (reason 0xc)
//! from its fault recording registers. A kernel that wrote a wrong entry format and
//! still passed would fail `cargo xtask qemu-x86`.

use crate::boot::{self, Kernel, Run};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The kernel's directory, relative to the repository root.
const KERNEL_DIR: &str = "drivers/x86pt/kernel";
/// Its target.
const TARGET: &str = "x86_64-unknown-uefi";
/// The line the kernel prints last when every check passed.
const PASS_LINE: &str = "x86 kernel: PASS";
/// Lines the kernel must print before its pass line (prefixes).
const REQUIRED: &[&str] = &[
    "x86: zero-fill faults served",
    "x86: write to read-only range refused",
    "x86: 2 MiB leaf",
    "vtd: translation enabled",
    "vtd: dma fault recorded",
    "edu: dma verified",
    "nvme: 2 MiB verified",
    "vtd: invalidations per 1000 buffers: strict ",
];
/// The configuration word that makes the kernel write a reserved bit (11, `SNP` in
/// legacy mode) into every second-level leaf of the edu domain.
const NEGATIVE_CONFIG: &str = "vtd-reserved-bit";
/// The fault the unit must record for such an entry: reason 0xc, a reserved field in a
/// second-level entry.
const NEGATIVE_FAULT: &str = "vtd: dma fault recorded: reason 0xc";
/// QEMU's exit status for the kernel's pass code (`0x10 << 1 | 1`).
const PASS_STATUS: i32 = 33;
/// Bytes of the NVMe disk image.
const NVME_IMAGE_BYTES: u64 = 8 << 20;
/// How long one boot may take, firmware included.
const TIMEOUT: Duration = Duration::from_secs(90);
/// The QEMU binary.
const QEMU: &str = "qemu-system-x86_64";
/// OVMF's code and variable store (Debian's `ovmf` package).
const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";

/// Check, build and boot the kernel.
pub fn qemu_x86() -> Result<(), String> {
    let kernel = Kernel::new(KERNEL_DIR, TARGET);
    kernel.check("x86 kernel")?;
    kernel.build("x86 kernel build", &[])?;
    let efi = kernel.artifact("x86-kernel.efi");
    let work = kernel.target_dir.join("qemu");
    let run = boot(&efi, &work, "ok")?;
    judge(&run)?;
    // The negative test: the same kernel told to set a reserved bit in every
    // second-level leaf must be stopped by QEMU's VT-d model, not pass.
    let negative = boot(&efi, &work, NEGATIVE_CONFIG)?;
    judge_negative(&negative)
}

/// The boot directory (the FAT drive) for `efi` with the kernel's configuration word
/// `config`, a fresh copy of OVMF's variable store, and the NVMe disk image.
fn prepare(efi: &Path, work: &Path, config: &str) -> Result<(PathBuf, PathBuf, PathBuf), String> {
    let esp = work.join(format!("esp-{config}"));
    let boot_dir = esp.join("EFI").join("BOOT");
    std::fs::create_dir_all(&boot_dir).map_err(|e| format!("{}: {e}", boot_dir.display()))?;
    std::fs::copy(efi, boot_dir.join("BOOTX64.EFI"))
        .map_err(|e| format!("{}: {e} (was the kernel built?)", efi.display()))?;
    std::fs::write(esp.join("gmem.cfg"), format!("{config}\n"))
        .map_err(|e| format!("gmem.cfg: {e}"))?;
    // The NVMe namespace: a fresh 8 MiB raw image of zeros.
    let image = work.join(format!("nvme-{config}.img"));
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(NVME_IMAGE_BYTES))
        .map_err(|e| format!("{}: {e}", image.display()))?;
    let vars = work.join(format!("vars-{config}.fd"));
    std::fs::copy(OVMF_VARS, &vars)
        .map_err(|e| format!("{OVMF_VARS}: {e} (install ovmf; `bash .ci/run` does)"))?;
    Ok((esp, vars, image))
}

/// Boot `efi` with configuration word `config` and collect its output.
fn boot(efi: &Path, work: &Path, config: &str) -> Result<Run, String> {
    let (esp, vars, image) = prepare(efi, work, config)?;
    let nvme_drive = format!("file={},if=none,id=nvm,format=raw", image.display());
    let code = format!("if=pflash,format=raw,readonly=on,file={OVMF_CODE}");
    let vars = format!("if=pflash,format=raw,file={}", vars.display());
    let fat = format!("format=raw,file=fat:rw:{}", esp.display());
    let args: Vec<String> = [
        "-machine",
        "q35",
        // 48-bit I/O virtual addresses: the unit walks 3- and 4-level tables, and the
        // kernel gives the NVMe domain 4 levels (the CPU's depth), edu's 3.
        "-device",
        "intel-iommu,aw-bits=48",
        "-m",
        "256M",
        "-smp",
        "1",
        "-nographic",
        "-monitor",
        "none",
        "-no-reboot",
        "-net",
        "none",
        "-device",
        "isa-debug-exit,iobase=0xf4,iosize=0x04",
        "-device",
        "edu",
        "-drive",
        &nvme_drive,
        // mdts=9: transfers of up to 2^9 4 KiB pages, so one command moves 2 MiB.
        "-device",
        "nvme,serial=gmem0,drive=nvm,mdts=9",
        "-drive",
        &code,
        "-drive",
        &vars,
        "-drive",
        &fat,
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    boot::qemu(
        &format!("boot ({config})"),
        QEMU,
        &args,
        TIMEOUT,
        "qemu-system-x86 and ovmf",
    )
}

/// The negative run: the kernel must fail, on the unit's reserved-field fault.
fn judge_negative(run: &Run) -> Result<(), String> {
    let passed = run.status == Some(PASS_STATUS) || run.lines.iter().any(|l| l.trim() == PASS_LINE);
    if passed {
        return Err(format!(
            "negative test: second-level entries with a reserved bit went unnoticed (the kernel passed under `{NEGATIVE_CONFIG}`)"
        ));
    }
    if !run.lines.iter().any(|l| l.starts_with(NEGATIVE_FAULT)) {
        return Err(format!(
            "negative test: the kernel failed (status {:?}) but never printed `{NEGATIVE_FAULT}`",
            run.status
        ));
    }
    eprintln!(
        "\nqemu-x86: negative test caught: VT-d refused the reserved bit (status {:?})",
        run.status
    );
    Ok(())
}

/// A passing run: the pass status, every required line, the pass line last.
fn judge(run: &Run) -> Result<(), String> {
    for r in REQUIRED {
        if !run.lines.iter().any(|l| l.starts_with(r)) {
            return Err(format!("qemu: the kernel never printed its `{r}` line"));
        }
    }
    // QEMU's own diagnostics (stderr) may come after the kernel's last line.
    let last = run
        .lines
        .iter()
        .rev()
        .find(|l| !l.trim().is_empty() && !l.starts_with("qemu-system-x86_64:"));
    match (run.status, last) {
        (Some(PASS_STATUS), Some(l)) if l.trim() == PASS_LINE => {
            eprintln!("\nqemu-x86: the kernel passed (isa-debug-exit: pass)");
            Ok(())
        }
        (Some(PASS_STATUS), _) => Err(format!(
            "qemu: exited with the pass status but `{PASS_LINE}` is not the last line"
        )),
        (Some(code), _) => Err(format!(
            "qemu: the kernel failed (exit status {code}; 33 is a pass)"
        )),
        (None, _) => Err("qemu: killed by a signal".into()),
    }
}
