//! The CI subset of the chaos suite (`rhc-chaos --smoke`) through the debug binaries:
//! kill -9 and restart (also at random moments with segments sealed and uploaded by every
//! group, resending answered batches), a storage outage, the disk budget, SIGTERM under load, a torn
//! segment, slowloris, oversized and malformed bodies, bodies declared and never sent or
//! sent in part and stalled, keep-alive probe connections filling every place, and every
//! place kept busy by bodies arriving late with heads pipelined behind them, and the node lost
//! (SIGKILL and the spool deleted under 200 events/s with a 2 s upload window, on `file://`
//! and on moto: every event acknowledged more than 2 s before the kill must be in the bucket,
//! in one object per partition, every version a reader polled whole). Each scenario checks
//! correctness (every acknowledged event in the bucket exactly once, the right answers,
//! memory flat), not speed; the loads are small and the whole run takes about 120 s on two
//! busy cores (it is stopped at 240 s).
//!
//! The S3 scenarios use moto from `$RHC_MOTO_SERVER` (exported by `./scripts/test.sh`).
//! Without it the rest runs against a local directory and the S3 ones are skipped, unless
//! `RHC_REQUIRE_SERVICES=1`, which makes a missing moto a failure.
//! The full suite and the benchmarks: `bench/chaos.sh`, `bench/run.sh` (BENCHMARKS.md).
//!
//! The collector under test is this build's `target/<profile>/ray-history-collector`, which
//! `cargo test --workspace` builds for the root package's integration tests (or
//! `$RHC_COLLECTOR_BIN`).

use std::io::Read;

use rhc_testkit::collector::collector_bin;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn chaos_smoke_subset_passes() {
    let moto = std::env::var("RHC_MOTO_SERVER")
        .ok()
        .filter(|p| !p.trim().is_empty());
    let required = std::env::var("RHC_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
    let storage = match &moto {
        Some(p) => format!("moto:{p}"),
        None if required => {
            panic!("RHC_MOTO_SERVER is not set but RHC_REQUIRE_SERVICES=1; run ./scripts/test.sh")
        }
        None => {
            eprintln!(
                "RHC_MOTO_SERVER is not set: running the chaos smoke subset against a local \
                 directory; the S3 scenarios (outage, budget) are skipped"
            );
            "file".to_string()
        }
    };
    let work = tempfile::tempdir().expect("temp dir");
    let mut out = tempfile::tempfile().expect("temp file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rhc-chaos"))
        .args([
            "--smoke",
            "--collector",
            &collector_bin().display().to_string(),
            "--storage",
            &storage,
            "--work-dir",
        ])
        .arg(work.path().join("chaos"))
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("dup"))
        .stderr(out.try_clone().expect("dup"))
        .spawn()
        .expect("start rhc-chaos");
    let limit = Duration::from_secs(240);
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for rhc-chaos") {
            break Some(s);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    use std::io::Seek;
    let mut text = String::new();
    let _ = out.rewind();
    let _ = out.read_to_string(&mut text);
    println!("{text}");
    let status = status
        .unwrap_or_else(|| panic!("rhc-chaos --smoke did not finish within {limit:?}:\n{text}"));
    let verdicts: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("PASS ") || l.starts_with("FAIL ") || l.starts_with("SKIP "))
        .collect();
    let failed: Vec<&&str> = verdicts.iter().filter(|l| l.starts_with("FAIL ")).collect();
    assert!(failed.is_empty(), "chaos scenarios failed:\n{text}");
    assert!(status.success(), "rhc-chaos exited with {status}:\n{text}");
    let passed = verdicts.iter().filter(|l| l.starts_with("PASS ")).count();
    let expected = if moto.is_some() { 13 } else { 11 };
    assert_eq!(
        passed, expected,
        "expected {expected} passing scenarios:\n{text}"
    );
}
