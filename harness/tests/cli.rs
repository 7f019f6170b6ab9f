//! The binary end to end: defaults that work, reports in every output format, and
//! malformed input answered with an error naming file and line and a non-zero exit.

use std::process::Command;

fn harness(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gmem-harness"))
        .args(args)
        .output()
        .expect("the harness runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("gmem-harness-{}-{name}", std::process::id()));
    std::fs::write(&p, text).expect("temp file written");
    p
}

#[test]
fn vectoradd_verifies_with_oversubscribed_device_memory() {
    let (ok, out, _) = harness(&[
        "run",
        "vectoradd",
        "--elements",
        "65536",
        "--device-memory-percent",
        "25",
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("verify: OK"), "{out}");
}

#[test]
fn json_and_csv_reports_carry_the_counters_and_the_verdict() {
    let (ok, out, _) = harness(&["run", "--elements", "4096", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(v["verified"], true);
    assert!(v["counters"]["faults: zero-fill"].as_u64().unwrap() > 0);
    let (ok, out, _) = harness(&["run", "--elements", "4096", "--csv"]);
    assert!(ok);
    assert!(out.lines().any(|l| l == "verified,true"), "{out}");
}

#[test]
fn replay_of_a_gmem_trace_verifies() {
    let p = temp_file(
        "ok.gmt",
        "alloc a 16K\naccess cpu w a 16K\naccess gpu r a 16K\nfree a\n",
    );
    let (ok, out, err) = harness(&["replay", p.to_str().unwrap(), "--gpu-pages", "2"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("verify: OK"), "{out}");
}

#[test]
fn malformed_trace_names_file_and_line_and_fails() {
    let p = temp_file("bad.gmt", "alloc a 4K\n\n# fine so far\nacess cpu r a 4\n");
    let (ok, _, err) = harness(&["replay", p.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains(&format!("{}:4:", p.display())), "{err}");
    let lackey = temp_file("bad.lackey", " L 0400,8\n Q 12,4\n");
    let (ok, _, err) = harness(&["replay", lackey.to_str().unwrap(), "--format", "lackey"]);
    assert!(!ok);
    assert!(err.contains(":2:"), "{err}");
    let (ok, _, err) = harness(&["replay", "/nonexistent/trace.gmt"]);
    assert!(!ok && err.contains("/nonexistent/trace.gmt"), "{err}");
}

#[test]
fn reproduce_table4_writes_csv_json_and_svg_and_verifies() {
    let dir = std::env::temp_dir().join(format!("gmem-harness-{}-t4", std::process::id()));
    let (ok, out, err) = harness(&[
        "reproduce",
        "gmem-table4",
        "--inputs",
        "20000",
        "--steps",
        "1",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("verify: OK"), "{out}");
    let csv = std::fs::read_to_string(dir.join("gmem-table4.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "header and two rows: {csv}");
    let svg = std::fs::read_to_string(dir.join("gmem-table4.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("host-to-dev"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("gmem-table4.json")).unwrap())
            .unwrap();
    let rows = json["rows"].as_array().unwrap();
    assert!(
        rows[0]["evictions"].as_u64().unwrap() > 0 && rows[1]["evictions"].as_u64().unwrap() == 0
    );
}
