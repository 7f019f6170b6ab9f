//! `reproduce iommu` end to end: the binary runs every variant, verifies every DMA and
//! writes its table and plot.

use std::process::Command;

#[test]
fn reproduce_iommu_verifies_and_writes_csv_json_and_svg() {
    let dir = std::env::temp_dir().join(format!("gmem-harness-iommu-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_gmem-harness"))
        .args([
            "reproduce",
            "iommu",
            "--packets",
            "300",
            "--inval-ns",
            "500",
            "--out",
        ])
        .arg(&dir)
        .output()
        .expect("the harness runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("verify: OK"), "{stdout}");
    assert!(stdout.contains("GM-V-RW-A"), "{stdout}");
    let csv = std::fs::read_to_string(dir.join("iommu.csv")).expect("csv written");
    assert_eq!(csv.lines().count(), 1 + 12, "{csv}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("iommu.json")).unwrap()).unwrap();
    assert_eq!(json["params"]["inval_ns"], 500);
    // The mapping layer's own cost is there for the baseline and every variant.
    for row in json["rows"].as_array().unwrap() {
        let ns = row["map_unmap_ns_per_packet"].as_f64().unwrap();
        assert!(ns > 0.0, "{row}");
    }
    assert!(stdout.contains("map+unmap"), "{stdout}");
    assert!(dir.join("iommu.svg").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_invalidation_latency_out_of_range_is_refused_before_anything_runs() {
    let out = Command::new(env!("CARGO_BIN_EXE_gmem-harness"))
        .args(["reproduce", "iommu", "--inval-ns", "99999999999999"])
        .output()
        .expect("the harness runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--inval-ns") && stderr.contains("0..=100000"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing ran");
}
