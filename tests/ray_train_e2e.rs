//! End to end with a real Ray Train V2 run: a local Ray 2.60 instance runs a
//! `DataParallelTrainer` (2 workers, no framework) and a task that fails; the real collector
//! takes Ray's pushed events over HTTP and tails Ray Train's export events
//! (`<session>/logs/export_events/event_EXPORT_TRAIN_STATE.log`) from `--ray-tmp-dir`; after
//! SIGTERM, `inspect --session <s> --json` must show the run with its status history and
//! workers, and the failed task with its error.
//!
//! Needs `RHC_PYTHON` (a Python with `ray[default,train]`, from
//! `./scripts/install-test-deps.sh`); without it the test prints `skipping: ...` and passes,
//! unless `RHC_REQUIRE_SERVICES=1`.
//!
//! ```text
//! eval "$(./scripts/install-test-deps.sh)"
//! RHC_REQUIRE_SERVICES=1 cargo test --test ray_train_e2e -- --nocapture
//! ```
//!
//! As in `ray_e2e.rs`, with the same harness (`support/ray.rs`): everything Ray writes lives
//! in one short temp dir (`/tmp/rhc-train-XXXXXX`, short because of the ~107-byte limit on
//! unix socket paths), `$HOME` included; Ray's processes carry a marker variable, and a drop
//! guard kills, by pid, any process still carrying it when the test ends, however it ends.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use rhc_testkit::ray::{
    ray_python, run_workload, start_collector, workload_command, RayWorkDir, WorkloadResult,
};
use rhc_testkit::services::{free_port, run_with_timeout};

/// Upper bound for the Python workload (Ray start, the task, the training run, waiting for
/// the collector, Ray shutdown). A normal run takes 30-60 s.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(150);
/// How long `inspect` may take.
const INSPECT_TIMEOUT: Duration = Duration::from_secs(60);
const NAMESPACE: &str = "default";
const CLUSTER: &str = "train-e2e";
/// The Ray Train run's name (`RunConfig(name=...)`).
const RUN_NAME: &str = "rhc-train-run";
/// Name of the task in the workload that raises, and the text it raises.
const FAILING_TASK: &str = "fails";
const FAILURE_TEXT: &str = "rhc-train-e2e intentional failure";
/// Environment variable set on the workload; every Ray process inherits it.
const MARKER_VAR: &str = "RHC_TRAIN_E2E_MARKER";

#[test]
fn ray_train_run_and_failed_task_appear_in_inspect() {
    let Some(python) = ray_python() else {
        return;
    };
    let started = Instant::now();

    let work = RayWorkDir::new("ray_train_e2e", "rhc-train-", MARKER_VAR);
    let store_dir = work.store();
    let train_storage = work.path().join("train-storage");
    std::fs::create_dir_all(&train_storage).expect("create test dir");
    let dashboard_port = free_port().to_string();

    // 1. The collector: pushed events on HTTP, export events tailed from the Ray temp dir.
    let mut collector = start_collector(
        &work,
        NAMESPACE,
        CLUSTER,
        &[
            "--enable-export-events",
            "true",
            "--enable-log-collector",
            "false",
            "--dashboard-address",
            &format!("http://127.0.0.1:{dashboard_port}"),
        ],
    );

    // 2. The Ray workload.
    let mut cmd = workload_command(
        &python,
        "ray_train_workload.py",
        &work,
        &collector,
        &dashboard_port,
    );
    cmd.env("RAY_TRAIN_V2_ENABLED", "1")
        .env("RAY_TRAIN_ENABLE_STATE_TRACKING", "1")
        .env("RAY_enable_export_api_write", "1")
        .env("RHC_E2E_TRAIN_STORAGE", &train_storage)
        .env("RHC_E2E_RUN_NAME", RUN_NAME)
        .env("RHC_E2E_FAILURE_TEXT", FAILURE_TEXT);
    let run = run_workload(&mut cmd, SCRIPT_TIMEOUT, &work, &collector, 32 * 1024);
    let info = &run.result;

    // 3. SIGTERM: the collector reads the export files one last time, seals and uploads.
    let terminate_secs = run.terminate_collector(&mut collector);

    // 4. Read the bucket back with inspect.
    let store = store_dir.to_str().expect("utf-8 temp path");
    let text = run_inspect(&[store, "--session", &info.session]);
    println!("{text}");
    let json_text = run_inspect(&[store, "--session", &info.session, "--json"]);
    let report: Value = serde_json::from_str(&json_text)
        .unwrap_or_else(|e| panic!("inspect printed no JSON ({e}):\n{json_text}"));
    println!(
        "ray {} session {} job {} node {}; workload {:.1} s, collector SIGTERM -> \
         exit {terminate_secs:.2} s, test {:.1} s; Ray processes left after the workload: {}",
        info.ray_version,
        info.session,
        info.job_id,
        info.node_id,
        run.secs,
        started.elapsed().as_secs_f64(),
        run.lingering_summary()
    );

    let mut failures = Vec::new();
    // The tasks' pushed events were read. (Ray 2.60 writes no `EXPORT_TASK` files when its
    // core workers push task events to the aggregator, as here; when both records exist the
    // attempts are merged: tests/inspect_export.rs.)
    if report["events"]["by_type"]["TASK_LIFECYCLE_EVENT"]
        .as_u64()
        .unwrap_or(0)
        == 0
    {
        failures.push(format!(
            "no TASK_LIFECYCLE_EVENT read: {}",
            report["events"]["by_type"]
        ));
    }
    check_train_run(&report, info, &mut failures);
    check_failed_task(&report, info, &mut failures);
    if report["problems"]["unreadable_objects"] != 0 || report["problems"]["bad_lines"] != 0 {
        failures.push(format!("inspect reported problems: {}", report["problems"]));
    }
    assert!(
        failures.is_empty(),
        "{} check(s) failed:\n  - {}\n--- inspect --json ---\n{json_text}\n{}",
        failures.len(),
        failures.join("\n  - "),
        run.diagnostics(&collector)
    );
}

/// The run is there, FINISHED, with its status history, an attempt and its 2 workers.
fn check_train_run(report: &Value, info: &WorkloadResult, failures: &mut Vec<String>) {
    let runs: Vec<&Value> = report["train_runs"]
        .as_array()
        .map(|a| a.iter().filter(|r| r["name"] == RUN_NAME).collect())
        .unwrap_or_default();
    let [run] = runs.as_slice() else {
        failures.push(format!(
            "expected one Train run named {RUN_NAME}, found {}: {}",
            runs.len(),
            report["train_runs"]
        ));
        return;
    };
    if run["status"] != "FINISHED" {
        failures.push(format!("run status is {}, not FINISHED", run["status"]));
    }
    if run["job_id"] != info.job_id.as_str() {
        failures.push(format!("run job {} is not {}", run["job_id"], info.job_id));
    }
    let history: Vec<&str> = run["status_history"]
        .as_array()
        .map(|h| h.iter().filter_map(|s| s["status"].as_str()).collect())
        .unwrap_or_default();
    let mut expected = ["INITIALIZING", "SCHEDULING", "RUNNING", "FINISHED"]
        .iter()
        .peekable();
    for status in &history {
        if expected.peek() == Some(&status) {
            expected.next();
        }
    }
    if expected.peek().is_some() || history.first() != Some(&"INITIALIZING") {
        failures.push(format!(
            "status history {history:?} is not INITIALIZING → SCHEDULING → RUNNING → FINISHED"
        ));
    }
    let attempts = run["attempts"].as_array().cloned().unwrap_or_default();
    let Some(last) = attempts.last() else {
        failures.push(format!("the run has no attempts: {run}"));
        return;
    };
    if last["status"] != "FINISHED" {
        failures.push(format!("last attempt status is {}", last["status"]));
    }
    let workers = last["workers"].as_array().cloned().unwrap_or_default();
    let ranks: BTreeSet<i64> = workers
        .iter()
        .filter_map(|w| w["world_rank"].as_i64())
        .collect();
    if workers.len() != 2 || ranks != BTreeSet::from([0, 1]) {
        failures.push(format!("expected workers of rank 0 and 1: {workers:?}"));
    }
    for w in &workers {
        if w["node_id"] != info.node_id.as_str() || w["pid"].as_i64().unwrap_or(0) <= 0 {
            failures.push(format!(
                "worker not on node {} or without pid: {w}",
                info.node_id
            ));
        }
    }
}

/// The failing task is listed with its error type and message.
fn check_failed_task(report: &Value, info: &WorkloadResult, failures: &mut Vec<String>) {
    let failed = report["failed_tasks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ours: Vec<&Value> = failed
        .iter()
        .filter(|t| t["name"] == FAILING_TASK)
        .collect();
    let [task] = ours.as_slice() else {
        failures.push(format!(
            "expected one failed task named {FAILING_TASK}: {failed:?}"
        ));
        return;
    };
    if task["error_type"] != "TASK_EXECUTION_EXCEPTION" {
        failures.push(format!("error type {}", task["error_type"]));
    }
    if !task["error_message"]
        .as_str()
        .is_some_and(|m| m.contains(FAILURE_TEXT))
    {
        failures.push(format!("error message lacks {FAILURE_TEXT:?}: {task}"));
    }
    if task["job_id"] != info.job_id.as_str() {
        failures.push(format!(
            "failed task's job {} is not {}",
            task["job_id"], info.job_id
        ));
    }
    let job_known = report["jobs"]
        .as_array()
        .is_some_and(|jobs| jobs.iter().any(|j| j["job_id"] == info.job_id.as_str()));
    if !job_known {
        failures.push(format!(
            "job {} is not listed: {}",
            info.job_id, report["jobs"]
        ));
    }
}

/// `ray-history-collector inspect <args>`, which must succeed; its stdout.
fn run_inspect(args: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ray-history-collector"));
    cmd.arg("inspect").args(args).env_remove("STORAGE_ROOT_DIR");
    let out = run_with_timeout(&mut cmd, INSPECT_TIMEOUT);
    assert!(
        out.status.success(),
        "inspect {args:?} failed with {}:\n{}",
        out.status,
        out.stderr
    );
    out.stdout
}
