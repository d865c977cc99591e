//! `inspect` on a session recorded only through Ray's file-based export events: a real Ray
//! 2.60 Train run with `RAY_enable_export_api_write=1` and no pushed events
//! (`tests/data/export-session/`), put through the real collector (export events tailed,
//! logs shipped). The report must count its tasks from `EXPORT_TASK`, `--logs` must print the
//! failed task's own stderr, and `--timeline` must hold every execution the workers
//! profiled. Expected values are computed here from the fixture.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;

use rhc_testkit::collector::{files_under, ship_session_logs};
use rhc_testkit::services::{run_with_timeout, CommandOutput};

const INSPECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `ray-history-collector inspect <args>`.
fn inspect(args: &[&str]) -> CommandOutput {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ray-history-collector"));
    cmd.arg("inspect").args(args).env_remove("STORAGE_ROOT_DIR");
    run_with_timeout(&mut cmd, INSPECT_TIMEOUT)
}

/// `inspect <args>` as text, which must succeed.
fn inspect_text(args: &[&str]) -> String {
    let out = inspect(args);
    assert!(
        out.status.success(),
        "inspect {args:?} failed: {}\n{}",
        out.status,
        out.stderr
    );
    out.stdout
}

fn b64_to_hex(s: &str) -> String {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_else(|e| panic!("{s}: {e}"));
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A Ray Train session recorded only through Ray's file-based export events
/// (`RAY_enable_export_api_write=1`, no pushed events): `tests/data/export-session/logs/`
/// holds its `export_events/` (from a real Ray 2.60 run; a task that prints to stderr and
/// fails, three squares, a Train run of two workers), the failing worker's logs and the
/// raylet's first and last lines.
const EXPORT_SESSION: &str = "session_2026-11-25_16-46-44_859917_18993";
const EXPORT_NODE_ID: &str = "10c4c42284f62663ab8fa611a43a876684fb7ac9cc661c586ad8a36c";
const EXPORT_FAILING_TASK: &str = "32d950ec0ccf9d2affffffffffffffffffffffff01000000";
const EXPORT_FAILING_WORKER: &str = "84eb66b236c17db5c8488c841c1c969facaba5469607466e655c3e1f";

/// The fixture through the real collector (export events tailed, logs shipped, nothing
/// pushed); returns the bucket.
fn collect_export_session(work: &Path) -> std::path::PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/export-session/logs");
    ship_session_logs(work, &fixture, EXPORT_SESSION, "train")
}

/// The `EXPORT_TASK` lines of the fixture.
fn export_task_events() -> Vec<Value> {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/export-session/logs/export_events");
    let mut out = Vec::new();
    for path in files_under(&dir) {
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if !name.starts_with("event_EXPORT_TASK_") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            out.push(serde_json::from_str(line).unwrap());
        }
    }
    out
}

const TASK_STATUS: [&str; 13] = [
    "NIL",
    "PENDING_ARGS_AVAIL",
    "PENDING_NODE_ASSIGNMENT",
    "PENDING_OBJ_STORE_MEM_AVAIL",
    "PENDING_ARGS_FETCH",
    "SUBMITTED_TO_WORKER",
    "PENDING_ACTOR_TASK_ARGS_FETCH",
    "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY",
    "RUNNING",
    "RUNNING_IN_RAY_GET",
    "RUNNING_IN_RAY_WAIT",
    "FINISHED",
    "FAILED",
];

#[test]
fn export_only_session_reports_its_tasks_logs_and_timeline() {
    let work = tempfile::tempdir().unwrap();
    let store = collect_export_session(work.path());
    let dir = store.to_str().unwrap();

    // Expected, from the fixture: each attempt's state is the one with the latest time in
    // any of its events' `state_ts_ns` (UNKNOWN without any).
    let events = export_task_events();
    let mut latest: BTreeMap<(String, i64), Option<(i64, usize)>> = BTreeMap::new();
    // (task, attempt) -> (worker, start ns, end ns) of the worker's `task::` profile event.
    let mut executions: BTreeMap<(String, i64), (String, i64, i64)> = BTreeMap::new();
    for e in &events {
        let d = &e["event_data"];
        let key = (
            b64_to_hex(d["task_id"].as_str().unwrap()),
            d["attempt_number"].as_i64().unwrap(),
        );
        let slot = latest.entry(key.clone()).or_insert(None);
        if let Some(states) = d["state_updates"]["state_ts_ns"].as_object() {
            for (state, ns) in states {
                let ns: i64 = ns.as_str().unwrap().parse().unwrap();
                let state: usize = state.parse().unwrap();
                if slot.is_none_or(|(t, s)| (ns, state) > (t, s)) {
                    *slot = Some((ns, state));
                }
            }
        }
        let profile = &d["profile_events"];
        if profile["component_type"] == "worker" {
            for p in profile["events"].as_array().unwrap() {
                if p["event_name"].as_str().unwrap().starts_with("task::") {
                    let ns = |k: &str| p[k].as_str().unwrap().parse::<i64>().unwrap();
                    executions.insert(
                        key.clone(),
                        (
                            b64_to_hex(profile["component_id"].as_str().unwrap()),
                            ns("start_time"),
                            ns("end_time"),
                        ),
                    );
                }
            }
        }
    }
    let mut by_state: BTreeMap<String, u64> = BTreeMap::new();
    for state in latest.values() {
        let name = state.map(|(_, s)| TASK_STATUS[s]).unwrap_or("UNKNOWN");
        *by_state.entry(name.to_string()).or_default() += 1;
    }
    assert!(
        by_state["FINISHED"] > 10 && by_state["FAILED"] == 1,
        "{by_state:?}"
    );

    let timeline = work.path().join("timeline.json");
    let html = work.path().join("page.html");
    let out = inspect(&[
        dir,
        "--session",
        EXPORT_SESSION,
        "--json",
        "--timeline",
        timeline.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        report["tasks"]["total"],
        latest.len() as u64,
        "{}",
        report["tasks"]
    );
    let got: BTreeMap<String, u64> =
        serde_json::from_value(report["tasks"]["by_state"].clone()).unwrap();
    assert_eq!(got, by_state);
    assert_eq!(report["jobs"][0]["tasks"]["total"], latest.len() as u64);
    let failed = &report["failed_tasks"][0];
    assert_eq!(failed["task_id"], EXPORT_FAILING_TASK);
    assert_eq!(failed["name"], "fails");
    assert_eq!(failed["error_type"], "TASK_EXECUTION_EXCEPTION");
    assert!(
        failed["error_message"]
            .as_str()
            .unwrap()
            .ends_with("RuntimeError: rhc-capture intentional failure"),
        "{failed}"
    );
    assert_eq!(
        failed["log_command"],
        format!(
            "ray-history-collector inspect {dir} --session {EXPORT_SESSION} --logs \
             {EXPORT_FAILING_TASK} --err"
        )
    );
    assert_eq!(report["train_runs"][0]["name"], "probe-run");
    assert_eq!(report["problems"]["unreadable_objects"], 0);

    // The timeline: every profiled execution, on its worker, at its exact times.
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&timeline).unwrap()).unwrap();
    let trace_events = trace["traceEvents"].as_array().unwrap();
    let thread_names: BTreeMap<(u64, u64), String> = trace_events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| {
            (
                (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()),
                e["args"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let slices: Vec<&Value> = trace_events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "task")
        .collect();
    assert!(executions.len() > 10, "{executions:?}");
    for ((task, attempt), (worker, start, end)) in &executions {
        let found = slices.iter().any(|s| {
            let thread = &thread_names[&(s["pid"].as_u64().unwrap(), s["tid"].as_u64().unwrap())];
            let ts = s["ts"].as_f64().unwrap();
            let te = ts + s["dur"].as_f64().unwrap();
            s["args"]["task_id"] == task.as_str()
                && s["args"]["attempt"] == *attempt
                && thread == &format!("worker:{worker}")
                && (ts - *start as f64 / 1000.0).abs() < 1.0
                && (te - *end as f64 / 1000.0).abs() < 1.0
        });
        assert!(
            found,
            "no slice for task {task} on worker {worker} at {start}..{end}"
        );
    }
    let failure = trace_events
        .iter()
        .find(|e| e["ph"] == "i" && e["args"]["task_id"] == EXPORT_FAILING_TASK);
    assert!(failure.is_some(), "no failure instant for the failed task");
    for cat in ["job", "train_run", "train_attempt", "actor"] {
        assert!(
            trace_events.iter().any(|e| e["cat"] == cat),
            "no {cat} slice in the timeline"
        );
    }
    // The page draws each of those slices (its rendering is checked in inspect_html.rs).
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(
        page.matches("<rect class=\"attempt ").count(),
        slices.len(),
        "bars drawn vs slices in the timeline"
    );
    assert!(!page.contains("<script") && !page.contains("http://") && !page.contains("https://"));

    // Logs from the bucket: the failing task's own stderr, its last line, its worker's log,
    // the node's raylet.out, and clear errors.
    let text = inspect_text(&[
        dir,
        "--session",
        EXPORT_SESSION,
        "--logs",
        EXPORT_FAILING_TASK,
        "--err",
    ]);
    assert!(text.contains("rhc-capture: about to fail\n"), "{text}");
    let text = inspect_text(&[
        dir,
        "--session",
        EXPORT_SESSION,
        "--logs",
        EXPORT_FAILING_TASK,
        "--err",
        "--tail",
        "1",
    ]);
    assert_eq!(text, "rhc-capture: about to fail\n");
    let text = inspect_text(&[dir, "--session", "latest", "--logs", EXPORT_FAILING_WORKER]);
    assert_eq!(
        text,
        ":job_id:01000000\n:task_name:square\n:task_name:fails\n"
    );
    let text = inspect_text(&[
        dir,
        "--session",
        "latest",
        "--logs",
        EXPORT_NODE_ID,
        "--tail",
        "1",
    ]);
    assert!(
        text.ends_with("Stats module has shutdown.\n") && text.lines().count() == 1,
        "{text}"
    );
    let out = inspect(&[dir, "--session", "latest", "--logs", "0102030405060708"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr
            .contains("no task, actor, worker or node 0102030405060708 in session"),
        "{}",
        out.stderr
    );
    // A task whose worker's log is not in the bucket (the fixture has one worker's logs).
    let other = executions
        .iter()
        .find(|(_, (worker, _, _))| worker != EXPORT_FAILING_WORKER)
        .map(|((task, _), _)| task.clone())
        .unwrap();
    let out = inspect(&[dir, "--session", "latest", "--logs", &other]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.contains("is not in the bucket"),
        "{}",
        out.stderr
    );
    // The text report says how to get each failed task's log.
    let text = inspect_text(&[dir, "--session", EXPORT_SESSION]);
    assert!(
        text.contains(&format!("--logs {EXPORT_FAILING_TASK} --err")),
        "{text}"
    );
    assert!(text.contains("TASKS BY FINAL STATE ("), "{text}");
    assert!(
        !text.contains("TASKS BY FINAL STATE (0 task attempts)"),
        "{text}"
    );
}

/// `unix_ns` as RFC 3339 with nanoseconds, as Ray writes timestamps in pushed events.
fn rfc3339_ns(unix_ns: i64) -> String {
    let base = ray_history_collector::util::time::format_rfc3339(unix_ns.div_euclid(1_000_000_000));
    format!(
        "{}.{:09}Z",
        base.trim_end_matches('Z'),
        unix_ns.rem_euclid(1_000_000_000)
    )
}

#[test]
fn pushed_and_export_records_of_the_same_attempts_count_once() {
    let work = tempfile::tempdir().unwrap();
    let store = collect_export_session(work.path());
    let dir = store.to_str().unwrap();
    let before = inspect_json_ok(&[dir, "--session", EXPORT_SESSION, "--json"]);

    // The same attempts as pushed lifecycle events (camelCase, as the aggregator sends
    // them), in the job's partition where the collector files pushed events.
    let mut lines = String::new();
    for (i, e) in export_task_events().iter().enumerate() {
        let d = &e["event_data"];
        let Some(states) = d["state_updates"]["state_ts_ns"].as_object() else {
            continue;
        };
        let transitions: Vec<Value> = states
            .iter()
            .map(|(state, ns)| {
                let state: usize = state.parse().unwrap();
                let ns: i64 = ns.as_str().unwrap().parse().unwrap();
                serde_json::json!({"state": TASK_STATUS[state], "timestamp": rfc3339_ns(ns)})
            })
            .collect();
        let event = serde_json::json!({
            "eventId": base64::engine::general_purpose::STANDARD.encode(format!("pushed-{i}")),
            "sourceType": "CORE_WORKER",
            "eventType": "TASK_LIFECYCLE_EVENT",
            "timestamp": rfc3339_ns(e["timestamp"].as_i64().unwrap() * 1_000_000_000),
            "sessionName": EXPORT_SESSION,
            "taskLifecycleEvent": {
                "taskId": d["task_id"],
                "taskAttempt": d["attempt_number"],
                "jobId": d["job_id"],
                "stateTransitions": transitions,
            },
        });
        lines.push_str(&event.to_string());
        lines.push('\n');
    }
    let key = format!(
        "cluster-history/raycluster/default/train/{EXPORT_SESSION}/{EXPORT_NODE_ID}/job_events/\
         01000000/{EXPORT_NODE_ID}-2026-11-25-16-1.jsonl"
    );
    let path = store.join(key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, lines).unwrap();

    let after = inspect_json_ok(&[dir, "--session", EXPORT_SESSION, "--json"]);
    assert!(
        after["events"]["by_type"]["TASK_LIFECYCLE_EVENT"]
            .as_u64()
            .unwrap()
            > 50,
        "{}",
        after["events"]
    );
    assert_eq!(
        after["tasks"], before["tasks"],
        "the same attempts counted twice?"
    );
    assert_eq!(after["failed_tasks_total"], 1);
    assert_eq!(after["failed_tasks"][0]["task_id"], EXPORT_FAILING_TASK);
}

/// `inspect <args>` (which end with --json), parsed.
fn inspect_json_ok(args: &[&str]) -> Value {
    let out = inspect(args);
    assert!(out.status.success(), "inspect {args:?}: {}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}
