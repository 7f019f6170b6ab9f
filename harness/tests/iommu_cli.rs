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
    assert!(dir.join("iommu.svg").exists());
    let _ = std::fs::remove_dir_all(dir);
}
