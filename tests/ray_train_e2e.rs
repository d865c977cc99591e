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
//! As in `ray_e2e.rs`: everything Ray writes lives in one short temp dir
//! (`/tmp/rhc-train-XXXXXX`, short because of the ~107-byte limit on unix socket paths),
//! `$HOME` included; Ray's processes carry a marker variable, and a drop guard kills, by pid,
//! any process still carrying it when the test ends, however it ends.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use support::collector::Collector;
use support::services::{free_port, run_with_timeout, tool};

/// Upper bound for the Python workload (Ray start, the task, the training run, waiting for
/// the collector, Ray shutdown). A normal run takes 30-60 s.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(150);
/// How long the collector may take to exit after SIGTERM.
const TERMINATE_LIMIT: Duration = Duration::from_secs(30);
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
/// How long Ray's processes may take to exit after `ray.shutdown()` returned.
const RAY_EXIT_GRACE: Duration = Duration::from_secs(5);

#[test]
fn ray_train_run_and_failed_task_appear_in_inspect() {
    let Some(python) = tool("RHC_PYTHON") else {
        eprintln!(
            "skipping: RHC_PYTHON is not set, so Ray is not available (run ./scripts/test.sh)"
        );
        return;
    };
    let started = Instant::now();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/ray_train_workload.py");

    let work = RayWorkDir::new();
    let spool = work.path().join("spool");
    let store_dir = work.path().join("store");
    let ray_tmp = work.path().join("ray");
    let home = work.path().join("home");
    let train_storage = work.path().join("train-storage");
    for d in [&spool, &store_dir, &ray_tmp, &home, &train_storage] {
        std::fs::create_dir_all(d).expect("create test dir");
    }
    let dashboard_port = free_port().to_string();

    // 1. The collector: pushed events on HTTP, export events tailed from the Ray temp dir.
    let mut collector = Collector::start(
        &spool,
        &[
            "--storage",
            store_dir.to_str().expect("utf-8 temp path"),
            "--cluster-name",
            CLUSTER,
            "--cluster-namespace",
            NAMESPACE,
            "--role",
            "head",
            "--rotation-interval",
            "2s",
            "--shutdown-timeout",
            "20s",
            "--ray-tmp-dir",
            ray_tmp.to_str().expect("utf-8 temp path"),
            "--enable-export-events",
            "true",
            "--enable-log-collector",
            "false",
            "--dashboard-address",
            &format!("http://127.0.0.1:{dashboard_port}"),
        ],
        &[],
    );

    // 2. The Ray workload.
    let mut cmd = Command::new(&python);
    cmd.arg(&script)
        .current_dir(work.path())
        .env_remove("RAY_ADDRESS")
        .env_remove("RAY_DASHBOARD_AGGREGATOR_AGENT_PRESERVE_PROTO_FIELD_NAME")
        .env("RAY_enable_ray_event", "true")
        .env("RAY_enable_core_worker_ray_event_to_aggregator", "true")
        .env(
            "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR",
            collector.url("/v1/events"),
        )
        .env(
            "RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES",
            "ALL",
        )
        .env(
            "RAY_DASHBOARD_AGGREGATOR_AGENT_PUBLISHER_HTTP_ENDPOINT_EXPOSABLE_EVENT_TYPES",
            "ALL",
        )
        .env("RAY_TRAIN_V2_ENABLED", "1")
        .env("RAY_TRAIN_ENABLE_STATE_TRACKING", "1")
        .env("RAY_enable_export_api_write", "1")
        .env("RAY_USAGE_STATS_ENABLED", "0")
        // Makes Ray use 127.0.0.1 as the node address (Linux node-IP lookup switch).
        .env("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        .env("HOME", &home)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env("PYTHONUNBUFFERED", "1")
        .env("RHC_COLLECTOR_URL", collector.url(""))
        .env("RHC_E2E_RAY_TEMP_DIR", &ray_tmp)
        .env("RHC_E2E_TRAIN_STORAGE", &train_storage)
        .env("RHC_E2E_DASHBOARD_PORT", &dashboard_port)
        .env("RHC_E2E_RUN_NAME", RUN_NAME)
        .env("RHC_E2E_FAILURE_TEXT", FAILURE_TEXT)
        .env("RHC_E2E_QUIET_SECONDS", "3")
        .env("RHC_E2E_WAIT_LIMIT_SECONDS", "60")
        .env(MARKER_VAR, work.marker());
    let script_started = Instant::now();
    let out = run_with_timeout(&mut cmd, SCRIPT_TIMEOUT);
    let script_secs = script_started.elapsed().as_secs_f64();
    let diagnostics = |collector: &Collector| {
        format!(
            "--- workload exit: {}\n--- workload stdout ---\n{}\n\
             --- workload stderr (tail) ---\n{}\n--- collector log (tail) ---\n{}",
            out.status,
            out.stdout,
            tail(&out.stderr, 24 * 1024),
            tail(&collector.log_text(), 32 * 1024)
        )
    };
    assert!(
        out.status.success(),
        "the Ray workload failed\n{}",
        diagnostics(&collector)
    );
    let lingering = work.wait_for_ray_exit(RAY_EXIT_GRACE);
    let info = workload_result(&out.stdout).unwrap_or_else(|| {
        panic!(
            "no JSON result line from the workload\n{}",
            diagnostics(&collector)
        )
    });

    // 3. SIGTERM: the collector reads the export files one last time, seals and uploads.
    let terminate_started = Instant::now();
    let status = collector.terminate(TERMINATE_LIMIT);
    let terminate_secs = terminate_started.elapsed().as_secs_f64();
    assert!(
        status.success(),
        "collector exited with {status} after SIGTERM\n{}",
        diagnostics(&collector)
    );

    // 4. Read the bucket back with inspect.
    let store = store_dir.to_str().expect("utf-8 temp path");
    let text = run_inspect(&[store, "--session", &info.session]);
    println!("{text}");
    let json_text = run_inspect(&[store, "--session", &info.session, "--json"]);
    let report: Value = serde_json::from_str(&json_text)
        .unwrap_or_else(|e| panic!("inspect printed no JSON ({e}):\n{json_text}"));
    println!(
        "ray {} session {} job {} node {}; workload {script_secs:.1} s, collector SIGTERM -> \
         exit {terminate_secs:.2} s, test {:.1} s; Ray processes left after the workload: {}",
        info.ray_version,
        info.session,
        info.job_id,
        info.node_id,
        started.elapsed().as_secs_f64(),
        if lingering.is_empty() {
            "none".to_string()
        } else {
            lingering.join("; ")
        }
    );

    let mut failures = Vec::new();
    check_train_run(&report, &info, &mut failures);
    check_failed_task(&report, &info, &mut failures);
    if report["problems"]["unreadable_objects"] != 0 || report["problems"]["bad_lines"] != 0 {
        failures.push(format!("inspect reported problems: {}", report["problems"]));
    }
    assert!(
        failures.is_empty(),
        "{} check(s) failed:\n  - {}\n--- inspect --json ---\n{json_text}\n{}",
        failures.len(),
        failures.join("\n  - "),
        diagnostics(&collector)
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

// ------------------------------------------------------------------------ workload output

struct WorkloadResult {
    /// Lower-case hex.
    job_id: String,
    session: String,
    /// Lower-case hex.
    node_id: String,
    ray_version: String,
}

/// The workload's JSON line (the last stdout line that is a JSON object with `job_id`).
fn workload_result(stdout: &str) -> Option<WorkloadResult> {
    stdout.lines().rev().find_map(|line| {
        let v: Value = serde_json::from_str(line.trim()).ok()?;
        let s = |k: &str| v[k].as_str().map(str::to_string);
        Some(WorkloadResult {
            job_id: s("job_id")?.to_ascii_lowercase(),
            session: s("session")?,
            node_id: s("node_id")?.to_ascii_lowercase(),
            ray_version: s("ray_version").unwrap_or_default(),
        })
    })
}

fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = s.len() - max;
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    format!("...{}", &s[cut..])
}

// ------------------------------------------------------------------------ Ray processes

/// The test's temp dir (`/tmp/rhc-train-XXXXXX`). On drop, first kills (SIGKILL, by pid)
/// every process that still carries this test's marker variable (`RHC_TRAIN_E2E_MARKER=<this
/// dir>`) in its environment: only the workload gets it, and every Ray process inherits it.
/// Then the dir is removed.
struct RayWorkDir {
    dir: Option<tempfile::TempDir>,
}

impl RayWorkDir {
    fn new() -> RayWorkDir {
        // In /tmp, not $TMPDIR: Ray's unix socket paths under it must stay short.
        let dir = tempfile::Builder::new()
            .prefix("rhc-train-")
            .tempdir_in("/tmp")
            .expect("create /tmp/rhc-train-* temp dir");
        RayWorkDir { dir: Some(dir) }
    }

    fn path(&self) -> &Path {
        self.dir.as_ref().expect("temp dir").path()
    }

    /// The value of [`MARKER_VAR`] for this test: the dir's path, unique while it exists.
    fn marker(&self) -> String {
        self.path().display().to_string()
    }

    /// Waits up to `limit` for the marked processes to exit; returns those still alive.
    fn wait_for_ray_exit(&self, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        loop {
            let pids = self.marked_processes();
            if pids.is_empty() || Instant::now() >= deadline {
                return pids
                    .into_iter()
                    .map(|pid| format!("{pid} {}", command_line(pid)))
                    .collect();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Pids of live processes (other than this one) that carry the marker.
    fn marked_processes(&self) -> Vec<i32> {
        let own = std::process::id() as i32;
        let env_entry = format!("{MARKER_VAR}={}", self.marker());
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut pids = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            if pid == own {
                continue;
            }
            let proc_dir = PathBuf::from("/proc").join(pid.to_string());
            // Unreadable (another user's process) or empty (a zombie): not ours to kill.
            let marked = std::fs::read(proc_dir.join("environ"))
                .map(|b| b.split(|&c| c == 0).any(|v| v == env_entry.as_bytes()))
                .unwrap_or(false);
            if marked {
                pids.push(pid);
            }
        }
        pids
    }
}

impl Drop for RayWorkDir {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut killed = BTreeSet::new();
        loop {
            let pids = self.marked_processes();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                if killed.insert(pid) {
                    eprintln!(
                        "ray_train_e2e: killing leftover Ray process {pid}: {}",
                        command_line(pid)
                    );
                }
                // SAFETY: sending a signal to a process this test started (it carries our
                // marker); kill(2) has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if Instant::now() >= deadline {
                eprintln!("ray_train_e2e: some Ray processes are still alive after 10 s");
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if let Some(dir) = self.dir.take() {
            let path = dir.path().to_path_buf();
            if let Err(e) = dir.close() {
                eprintln!("ray_train_e2e: cannot remove {}: {e}", path.display());
            }
        }
    }
}

/// A process's command line (shortened), for messages.
fn command_line(pid: i32) -> String {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default();
    let cmd = cmd.trim();
    if cmd.len() <= 160 {
        return cmd.to_string();
    }
    let mut cut = 160;
    while !cmd.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &cmd[..cut])
}
