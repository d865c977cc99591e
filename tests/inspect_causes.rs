//! `inspect` explains why a job failed or hung, without Ray: the bucket a real two-raylet Ray
//! 2.60 session left (`tests/data/causes-session.tar.gz`, captured by `inspect_causes_e2e.rs`
//! with `RHC_E2E_KEEP_BUCKET`: its events, its logs, the head's dashboard snapshots) and Ray's
//! own live answers about it (`ray-state.json` in the same archive, recorded by
//! `tests/e2e/causes_workload.py` while the cluster lived).
//!
//! What the session holds: a task killed by Ray's memory monitor; workers that killed
//! themselves (SIGKILL, `os._exit(3)`); a task whose first attempt's worker exited and whose
//! retry finished; an actor whose worker exited; two tasks running on the second raylet when
//! it was SIGKILLed; a placement group of 64 CPUs and a task asking for a GPU, neither ever
//! scheduled; a task running when the whole cluster was SIGKILLed, its job never finished.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use rhc_testkit::services::run_with_timeout;

mod causes_oracle;

const SESSION: &str = "session_2026-11-26_14-15-42_969279_30047";
const OOM_TASK: &str = "67a2e8cfa5a06db3ffffffffffffffffffffffff02000000";
const NODE2: &str = "41db179b1bb43bbd392680e2a8d077536ef88cd51453896f39b6ec58";
/// The worker `exit_self` ran on; it wrote one line to its stderr before `os._exit(3)`.
const EXIT_SELF_WORKER: &str = "925a6b0de1e2481f08dcec90a0e846f100cee3bd325b6490b31ec898";

/// The capture unpacked into `work`: (the bucket, Ray's answers).
fn unpack(work: &Path) -> (PathBuf, Value) {
    let archive = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/causes-session.tar.gz");
    let out = Command::new("tar")
        .arg("xzf")
        .arg(&archive)
        .arg("-C")
        .arg(work)
        .output()
        .expect("run tar");
    assert!(out.status.success(), "tar: {out:?}");
    let ray = std::fs::read_to_string(work.join("ray-state.json")).expect("ray-state.json");
    (
        work.to_path_buf(),
        serde_json::from_str(&ray).expect("Ray's answers"),
    )
}

fn inspect(args: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ray-history-collector"));
    cmd.arg("inspect").args(args).env_remove("STORAGE_ROOT_DIR");
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "inspect {args:?}: {}\n{}",
        out.status,
        out.stderr
    );
    out.stdout
}

#[test]
fn causes_agree_with_rays_own_answers() {
    let work = tempfile::tempdir().unwrap();
    let (bucket, ray) = unpack(work.path());
    let b = bucket.to_str().unwrap();
    let report: Value = serde_json::from_str(&inspect(&[
        b,
        "--session",
        SESSION,
        "--json",
        "--pending-after",
        "1s",
        "--failed-limit",
        "1000",
    ]))
    .unwrap();
    let failures = causes_oracle::compare(&ray, &report);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_text_report_says_why_in_one_line_per_cause() {
    let work = tempfile::tempdir().unwrap();
    let (bucket, _) = unpack(work.path());
    let text = inspect(&[
        bucket.to_str().unwrap(),
        "--session",
        SESSION,
        "--pending-after",
        "1s",
    ]);
    let why: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("WHY IT FAILED"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter(|l| !l.trim_start().starts_with("log:"))
        .collect();
    let expect = [
        "1 attempt (hog): worker killed by the memory monitor on node a89ae5d5 at 2026-11-26 14:15:54.572: 1 worker(s) were killed due to the node running low on memory.",
        "3 attempts (sigkill_self, exit_self, flaky): worker process died (SYSTEM_ERROR) on node a89ae5d5 at 2026-11-26 14:15:55.312: The leased worker has unrecoverable failure.",
        "1 attempt and 1 actor (run_workload.<locals>.Doomed, Doomed.crash): actor's worker died (SYSTEM_ERROR) on node 41db179b at 2026-11-26 14:15:57.244: Worker unexpectedly exits with a connection error code 2.",
        "2 attempts (on_node2): node died (UNEXPECTED_TERMINATION) on node 41db179b at 2026-11-26 14:16:00.021: health check failed due to missing too many heartbeats",
    ];
    assert_eq!(why.len(), expect.len(), "{text}");
    for (line, want) in why.iter().zip(expect) {
        assert!(
            line.trim().starts_with(want),
            "{line:?}\nwanted {want:?}\n{text}"
        );
    }
    for want in [
        &format!("node {} died at 2026-11-26 14:15:59.962: UNEXPECTED_TERMINATION (health check failed due to missing too many heartbeats)", &NODE2[..8]),
        "job 02000000 never finished",
        "1 task attempt(s) left RUNNING (job 02000000, node a89ae5d5), unfinished: its job never finished",
        "1 task attempt(s) left PENDING_NODE_ASSIGNMENT (job 02000000, node -), unfinished",
        "placement group 106900c7548fa17beadbe785ac4b02000000 (rhc-e2e-never) PENDING/INFEASIBLE since 2026-11-26 14:16:00.944, strategy -, bundles {CPU: 64} {CPU: 1}: never fits, CPU: 64 asked by bundle 0, at most 2 on a node",
        "(needs_gpu) PENDING_NODE_ASSIGNMENT for 10.8s asking {CPU: 1, GPU: 1}: never fits, GPU: 1 asked, at most 0 on a node",
        "WORKER DEATHS (5 of 5, intended exits not counted)",
        &format!("--logs {OOM_TASK} --err"),
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    // Nothing said to be RUNNING without saying why it never ended.
    assert!(!text.contains("left RUNNING (job 01000000"), "{text}");
}

#[test]
fn pending_after_decides_what_hung() {
    let work = tempfile::tempdir().unwrap();
    let (bucket, _) = unpack(work.path());
    let report: Value = serde_json::from_str(&inspect(&[
        bucket.to_str().unwrap(),
        "--session",
        SESSION,
        "--json",
        "--pending-after",
        "1m",
    ]))
    .unwrap();
    // Pending 10.8 s when the events stop: not hung at a minute. The placement group is.
    assert_eq!(report["hangs"]["pending_tasks_total"], 0);
    assert_eq!(report["hangs"]["pending_after_seconds"], 60.0);
    assert_eq!(
        report["hangs"]["placement_groups"][0]["name"],
        "rhc-e2e-never"
    );
}

#[test]
fn logs_of_a_dead_worker_by_its_id() {
    let work = tempfile::tempdir().unwrap();
    let (bucket, _) = unpack(work.path());
    let err = inspect(&[
        bucket.to_str().unwrap(),
        "--session",
        SESSION,
        "--logs",
        EXIT_SELF_WORKER,
        "--err",
    ]);
    assert!(
        err.contains("rhc-e2e: exit_self is about to os._exit(3)"),
        "{err}"
    );
}

/// The page (`--html`) in real Chromium: every cause, every failed attempt with its worker
/// and node, every worker death, the dead node, what was left unfinished and what hung are
/// in the DOM Chromium parsed; its screenshot is kept under `target/tmp/inspect-html/`
/// (docs/inspect.md's picture is one).
#[test]
fn html_page_shows_the_causes_in_chromium() {
    let Some(chromium) = rhc_testkit::chromium::chromium() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let (bucket, _) = unpack(work.path());
    let page = work.path().join("causes.html");
    let report: Value = serde_json::from_str(&inspect(&[
        bucket.to_str().unwrap(),
        "--session",
        SESSION,
        "--json",
        "--pending-after",
        "1s",
        "--html",
        page.to_str().unwrap(),
    ]))
    .unwrap();
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("inspect-html");
    std::fs::create_dir_all(&shots).unwrap();
    let png = shots.join("causes-session.png");
    let _ = std::fs::remove_file(&png);
    rhc_testkit::chromium::screenshot(&chromium, &page, &png, 1400, 1500);
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(rhc_testkit::chromium::png_size(&bytes), Some((1400, 1500)));
    println!("screenshot: {}", png.display());

    let dom = rhc_testkit::chromium::dump_dom(&chromium, &page);
    let esc = |s: &str| s.replace('&', "&amp;");
    let groups = report["failure_causes"].as_array().unwrap();
    assert_eq!(groups.len(), 4, "{groups:?}");
    for g in groups {
        let cause = esc(g["cause"].as_str().unwrap());
        assert!(
            dom.contains(&format!("<tr class=\"cause-row\" data-cause=\"{cause}\"")),
            "cause {cause:?} not in the page"
        );
    }
    for t in report["failed_tasks"].as_array().unwrap() {
        let row = format!(
            "<tr class=\"failed-task\" data-task-id=\"{}\" data-attempt=\"{}\">",
            t["task_id"].as_str().unwrap(),
            t["attempt"]
        );
        let at = dom.find(&row).unwrap_or_else(|| panic!("no row {row}"));
        let end = at + dom[at..].find("</tr>").unwrap();
        let cells = &dom[at..end];
        assert!(
            cells.contains(&format!(
                "<td class=\"cause\">{}</td>",
                esc(t["cause"].as_str().unwrap())
            )),
            "{cells}"
        );
        if let Some(exit) = t["worker"]["exit_type"].as_str() {
            assert!(cells.contains(exit), "{cells}");
        }
        if t["node"]["state"] == "DEAD" {
            assert!(cells.contains("UNEXPECTED_TERMINATION"), "{cells}");
        }
    }
    for d in report["worker_deaths"].as_array().unwrap() {
        assert!(dom.contains(&format!(
            "<tr data-worker-id=\"{}\">",
            d["worker_id"].as_str().unwrap()
        )));
    }
    for want in [
        "<li class=\"node-died\">node 41db179b…39b6ec58 died at",
        "<li class=\"unfinished\">1 task attempt(s) left RUNNING (job 02000000",
        "<li class=\"pg\">placement group 106900c7548fa17beadbe785ac4b02000000 (rhc-e2e-never)",
        "<li class=\"pending\">task 0d12401e8fa9a714ffffffffffffffffffffffff02000000 (needs_gpu)",
    ] {
        assert!(dom.contains(want), "missing {want:?}");
    }
}
