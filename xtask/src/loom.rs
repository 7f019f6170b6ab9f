//! `cargo xtask loom`: the loom models of `loom-tests/`, then every deliberately
//! broken variant, each of which its model must catch.
//!
//! The models only exist under `--cfg gmem_loom` (which switches `gmem_core::sync` and
//! `gmem-iommu`'s table code to loom). A broken variant adds `--cfg gmem_loom_bug="<name>"`; under it the model that
//! must catch the bug is a `should_panic` test expecting the model's own failure
//! message, so a variant whose run passes was caught, and one whose run fails was
//! missed (or failed for another reason). Each flag set builds into its own target
//! directory so that switching between them does not rebuild everything each time.
//! Output is not captured: each model prints its executions, preemption bound and
//! time, and each caught variant the failure its model reported.

use std::process::Command;
use std::time::Instant;

/// The broken variants (cfg values declared in the workspace's `check-cfg`) and the
/// models that catch them.
pub const BUGS: &[(&str, &str)] = &[
    ("fault_unbinds_before_locking", "entry"),
    ("magazine_depot_race", "magazines"),
    ("magazine_hit_split", "magazine_hits"),
    ("callback_before_invalidation", "queue"),
    ("frames_before_invalidation", "queue, faults"),
    ("iommu_cas_plain_store", "iommu"),
    ("iommu_rw_no_recheck", "iommu"),
    ("switch_activates_after_unlock", "attach"),
    ("attach_binds_after_unlock", "attach"),
    ("strict_release_before_invalidation", "strict"),
    ("destroy_table_during_unlocked_edit", "unlocked"),
    ("fault_maps_busy_region", "unlocked"),
    ("fill_mirrors_busy_pages", "unlocked"),
    ("try_fault_waits_for_the_space", "reentry"),
    ("stats_fold_after_unregister", "stats"),
    ("dma_release_before_invalidation", "dma"),
    ("collapse_skips_copy_invalidation", "readdup"),
    ("expire_pins_keeps_mappings", "pin"),
];

/// Run the loom tests under `rustflags`: every model (`models` empty) or only the
/// named ones (`--test <model>` each, so a broken variant builds and runs just the
/// models that must catch it).
fn loom_test(step: &str, rustflags: &str, target_dir: &str, models: &[&str]) -> Result<(), String> {
    let mut args = vec!["test", "-p", "gmem-loom-tests", "--release"];
    for m in models {
        args.extend(["--test", m]);
    }
    eprintln!(
        "\n== {step}: RUSTFLAGS='{rustflags}' cargo {}",
        args.join(" ")
    );
    args.extend(["--", "--nocapture"]);
    let start = Instant::now();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let status = Command::new(env!("CARGO"))
        .args(&args)
        .current_dir(root)
        .env("RUSTFLAGS", rustflags)
        .env("CARGO_TARGET_DIR", format!("{root}/{target_dir}"))
        .status()
        .map_err(|e| format!("{step}: {e}"))?;
    eprintln!("== {step}: {:.1} s", start.elapsed().as_secs_f64());
    if status.success() {
        Ok(())
    } else {
        Err(format!("{step} failed ({status})"))
    }
}

/// Run the models, then each broken variant expecting its model to fail.
pub fn loom() -> Result<(), String> {
    loom_test("loom models", "--cfg gmem_loom", "target/loom", &[])?;
    for (bug, models) in BUGS {
        let names: Vec<&str> = models.split(", ").collect();
        loom_test(
            &format!("loom broken variant {bug} (caught by: {models})"),
            &format!("--cfg gmem_loom --cfg gmem_loom_bug=\"{bug}\""),
            &format!("target/loom-{bug}"),
            &names,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::BUGS;

    /// A broken variant runs only the models named beside it, so each name must be a
    /// test target of `loom-tests` (a typo would make `cargo test --test` fail, not
    /// silently run nothing — this catches it before CI does).
    #[test]
    fn every_catching_model_is_a_loom_test_target() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../loom-tests/tests");
        for (bug, models) in BUGS {
            for m in models.split(", ") {
                let file = format!("{dir}/{m}.rs");
                assert!(
                    std::path::Path::new(&file).is_file(),
                    "{bug}: no loom model {file}"
                );
            }
        }
    }

    /// Every broken variant is declared in the workspace's `check-cfg` list.
    #[test]
    fn every_broken_variant_is_a_declared_cfg_value() {
        let manifest = include_str!("../../Cargo.toml");
        for (bug, _) in BUGS {
            assert!(
                manifest.contains(&format!("\"{bug}\"")),
                "{bug} not in check-cfg"
            );
        }
    }
}
