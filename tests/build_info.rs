//! What a binary says about its build: the compressor of `--gzip-level` 1 and 2 (igzip with
//! the `igzip` cargo feature, the container image's; libdeflate in the default build) in
//! the startup log and in `rhc_build_info`, so an operator can tell which build runs.

use rhc_testkit::collector::Collector;

/// What this test binary was built with: the same features as the collector it starts.
const EXPECTED: &str = if cfg!(feature = "igzip") {
    "igzip"
} else {
    "libdeflate"
};

#[test]
fn the_binary_names_its_compressor_at_startup_and_in_build_info() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let c = Collector::start(
        &dir.path().join("spool"),
        &["--storage", bucket.to_str().unwrap(), "--gzip-level", "2"],
        &[("RAY_ROLE", "worker")],
    );
    let metrics = String::from_utf8(c.get("/metrics").unwrap().body).unwrap();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("rhc_build_info{"))
        .unwrap_or_else(|| panic!("no rhc_build_info in /metrics:\n{metrics}"));
    assert!(line.ends_with("} 1"), "{line}");
    assert!(
        line.contains(&format!("compressor=\"{EXPECTED}\"")),
        "{line}"
    );
    assert!(
        line.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
        "{line}"
    );
    let log = c.log_text();
    let ready = log
        .lines()
        .find(|l| l.contains("collector ready"))
        .unwrap_or_else(|| panic!("no ready line:\n{log}"));
    assert!(
        ready.contains(&format!("gzip level 2 by {EXPECTED}")),
        "{ready}"
    );
}

#[test]
fn levels_above_two_name_libdeflate_in_every_build() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let c = Collector::start(
        &dir.path().join("spool"),
        &["--storage", bucket.to_str().unwrap(), "--gzip-level", "6"],
        &[("RAY_ROLE", "worker")],
    );
    let log = c.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("collector ready") && l.contains("gzip level 6 by libdeflate")),
        "{log}"
    );
}
