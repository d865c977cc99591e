//! End to end with real Ray: a local Ray 2.60 instance's dashboard agent POSTs its events to
//! the real collector binary, which uploads them to a `file://` bucket; the test reads the
//! bucket back and checks it the way KubeRay's History Server would read it.
//!
//! Needs `RHC_PYTHON` (a Python with `ray[default]`, from `./scripts/install-test-deps.sh`);
//! without it the test prints `skipping: ...` and passes, unless `RHC_REQUIRE_SERVICES=1`.
//!
//! ```text
//! eval "$(./scripts/install-test-deps.sh)"
//! RHC_REQUIRE_SERVICES=1 cargo test --test ray_e2e -- --nocapture
//! ```
//!
//! Then `inspect` reads the bucket after the collector's SIGTERM, as someone would after the
//! cluster is gone, and two of its answers are checked against Ray itself:
//!
//! - `--timeline`: Ray's own Chrome trace of the live cluster (`ray.timeline`, what
//!   `ray timeline` writes), recorded by the workload before shutdown, is the oracle: every
//!   task execution in it (a `task::<name>` slice) must be in our trace, on the same worker,
//!   starting and ending within [`TIMELINE_TOLERANCE_US`].
//! - `--logs <failing task> --err`: prints what the failing task wrote to its stderr.
//!
//! The workload is `tests/e2e/ray_workload.py`, run with the harness in `support/ray.rs`:
//! everything Ray writes lives in one short temp dir (`/tmp/rhc-e2e-XXXXXX`, short because of
//! the ~107-byte limit on unix socket paths), including `$HOME` (Ray 2.60 writes
//! `~/.ray/auth_token`). Ray's processes carry a marker variable; a drop guard kills, by pid,
//! any process still carrying it when the test ends, however it ends.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use object_store::local::LocalFileSystem;
use object_store::ObjectStore;
use serde_json::Value;

use rhc_testkit::collector::*;
use rhc_testkit::ray::*;
use rhc_testkit::services::*;

/// Upper bound for the whole Python workload (Ray start, tasks, waiting for the collector,
/// Ray shutdown). A normal run takes 15-40 s.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(240);
/// The test's cluster identity (`--cluster-namespace`, `--cluster-name`).
const NAMESPACE: &str = "default";
const CLUSTER: &str = "e2e";
/// Name of the task in the workload that raises.
const FAILING_TASK: &str = "fails";
/// Text of the exception it raises.
const FAILURE_TEXT: &str = "rhc-e2e intentional failure";
/// Environment variable set on the workload; every Ray process inherits it.
const MARKER_VAR: &str = "RHC_E2E_MARKER";
/// What the failing task prints to its stderr before it raises.
const FAILING_STDERR: &str = "rhc-e2e: the failing task's own stderr";
/// How far our timeline's slices may be from Ray's, at each end (microseconds).
const TIMELINE_TOLERANCE_US: f64 = 5_000.0;
/// How long `inspect` may take.
const INSPECT_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn real_ray_job_events_reach_job_events_partition() {
    let Some(python) = ray_python() else {
        return;
    };
    let started = Instant::now();

    let work = RayWorkDir::new("ray_e2e", "rhc-e2e-", MARKER_VAR);
    let store_dir = work.store();

    // 1. The collector.
    let mut collector =
        start_collector(&work, NAMESPACE, CLUSTER, &["--log-upload-interval", "2s"]);

    // 2. The Ray workload.
    let dashboard_port = free_port().to_string();
    let ray_trace = work.path().join("ray-timeline.json");
    let mut cmd = workload_command(
        &python,
        "ray_workload.py",
        &work,
        &collector,
        &dashboard_port,
    );
    cmd.env("RHC_E2E_TIMELINE", &ray_trace);
    let run = run_workload(&mut cmd, SCRIPT_TIMEOUT, &work, &collector, 48 * 1024);
    let info = &run.result;
    let job_hex = &info.job_id;
    let node_hex = &info.node_id;
    let session = &info.session;

    // Ray has shut down; nothing more can arrive. What the collector says it stored:
    let accepted = collector.metric("rhc_events_accepted_total");
    let duplicates = collector.metric("rhc_events_duplicate_total");
    let quarantined = collector.metric("rhc_events_quarantined_total");
    let requests = post_statuses(&collector);

    // Logs reach the bucket while the collector runs, not only at SIGTERM.
    {
        let store: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(&store_dir).expect("open the file bucket"));
        let logs_prefix =
            format!("cluster-history/raycluster/{NAMESPACE}/{CLUSTER}/{session}/{node_hex}/logs/");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let objects = read_all(&store);
            let logs: Vec<&String> = objects
                .keys()
                .filter(|k| k.starts_with(&logs_prefix))
                .collect();
            let raylet = objects
                .get(&format!("{logs_prefix}raylet.out"))
                .is_some_and(|v| v.windows(15).any(|w| w == b"Setting node ID"));
            let worker = logs
                .iter()
                .any(|k| k[logs_prefix.len()..].starts_with("worker-"));
            let events = logs
                .iter()
                .any(|k| k[logs_prefix.len()..].starts_with("events/event_"));
            if raylet && worker && events {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "logs not uploaded during the run (raylet.out {raylet}, worker {worker}, events/ {events}): {logs:?}\n{}",
                run.diagnostics(&collector)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    // 3. SIGTERM: the collector seals and uploads everything, then exits 0.
    let terminate_secs = run.terminate_collector(&mut collector);

    // 4. Read the bucket back.
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(&store_dir).expect("open the file bucket"));
    let objects = read_all(&store);

    let check = BucketCheck::run(&objects, session, node_hex, job_hex);

    // What Ray sent, for the report.
    let mut report = String::new();
    let _ = writeln!(
        report,
        "ray {} session {session} node {node_hex} job {job_hex}",
        info.ray_version
    );
    let _ = writeln!(
        report,
        "workload {:.1} s, collector SIGTERM -> exit {terminate_secs:.2} s, test {:.1} s",
        run.secs,
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(
        report,
        "POST /v1/events by status: {requests:?}; events accepted {accepted}, \
         duplicates {duplicates}, quarantined {quarantined}"
    );
    let _ = writeln!(
        report,
        "Ray processes still alive {RAY_EXIT_GRACE:?} after the workload exited \
         (killed at the end): {}",
        run.lingering_summary()
    );
    let _ = writeln!(report, "{} objects:", objects.len());
    for (key, bytes) in &objects {
        let _ = writeln!(report, "  {key} ({} bytes)", bytes.len());
    }
    let _ = writeln!(report, "events in the bucket by partition and type:");
    for ((partition, event_type), n) in &check.counts {
        let _ = writeln!(report, "  {partition:<22} {event_type:<30} {n}");
    }
    println!("{report}");

    // inspect, from the bucket alone: the timeline against Ray's, the failing task's log.
    let mut failures = check.failures;
    let store_arg = store_dir.to_str().expect("utf-8 temp path");
    let our_trace = work.path().join("inspect-timeline.json");
    let out = run_inspect(&[
        store_arg,
        "--session",
        session,
        "--timeline",
        our_trace.to_str().expect("utf-8 temp path"),
    ]);
    let (compared, timeline_failures) = compare_timelines(&ray_trace, &our_trace);
    println!(
        "timeline: {compared} task executions of Ray's trace compared; {}",
        out.trim_end().lines().next().unwrap_or("")
    );
    failures.extend(timeline_failures);
    let failing_task = run
        .out
        .stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .and_then(|v| v["failing_task_id"].as_str().map(str::to_string))
        .unwrap_or_default();
    let log = run_inspect(&[
        store_arg,
        "--session",
        session,
        "--logs",
        &failing_task,
        "--err",
    ]);
    println!("inspect --logs {failing_task} --err:\n{log}");
    if !log.contains(FAILING_STDERR) {
        failures.push(format!(
            "inspect --logs {failing_task} --err does not print {FAILING_STDERR:?}:\n{log}"
        ));
    }
    let tail = run_inspect(&[
        store_arg,
        "--session",
        session,
        "--logs",
        &failing_task,
        "--err",
        "--tail",
        "1",
    ]);
    if tail.trim_end() != FAILING_STDERR {
        failures.push(format!(
            "--tail 1 printed {tail:?}, not the last line {FAILING_STDERR:?}"
        ));
    }

    // Every event the collector stored is in the bucket, and nothing was set aside.
    if quarantined != 0.0 {
        failures.push(format!("{quarantined} events were quarantined"));
    }
    if accepted != check.total_lines as f64 {
        failures.push(format!(
            "the collector accepted {accepted} events but the bucket holds {} event lines",
            check.total_lines
        ));
    }
    assert!(
        failures.is_empty(),
        "{} check(s) failed (the report above shows what the bucket holds):\n  - {}\n{}",
        failures.len(),
        failures.join("\n  - "),
        run.diagnostics(&collector)
    );
}

// ------------------------------------------------------------------------ bucket checks

/// The result of reading the bucket as the History Server would.
struct BucketCheck {
    failures: Vec<String>,
    /// (partition, eventType) -> number of events; the partition is `node_events` or
    /// `job_events/<job>`.
    counts: BTreeMap<(String, String), usize>,
    total_lines: usize,
}

impl BucketCheck {
    fn run(
        objects: &BTreeMap<String, Vec<u8>>,
        session: &str,
        node_hex: &str,
        job_hex: &str,
    ) -> BucketCheck {
        let mut failures = Vec::new();
        let mut counts = BTreeMap::new();
        let mut total_lines = 0;
        let job_bytes = hex_decode(job_hex).expect("the job id from Ray is hex");

        let marker = format!("cluster-metadata/raycluster/{NAMESPACE}_{CLUSTER}/{session}");
        match objects.get(&marker) {
            None => failures.push(format!("session marker {marker} is missing")),
            Some(b) if !b.is_empty() => failures.push(format!(
                "session marker {marker} is not empty ({} bytes)",
                b.len()
            )),
            Some(_) => {}
        }

        let history = format!("cluster-history/raycluster/{NAMESPACE}/{CLUSTER}/");
        let node_prefix = format!("{history}{session}/{node_hex}/");
        let job_prefix = format!("{node_prefix}job_events/{job_hex}/");
        if !objects.keys().any(|k| k.starts_with(&job_prefix)) {
            failures.push(format!("no object under {job_prefix}"));
        }

        let mut event_ids = BTreeSet::new();
        // The job's events: (eventType, event).
        let mut job_events: Vec<Value> = Vec::new();
        for (key, bytes) in objects {
            if key == &marker {
                continue;
            }
            let Some(rest) = key.strip_prefix(&node_prefix) else {
                failures.push(format!("unexpected object {key} (not under {node_prefix})"));
                continue;
            };
            if rest.starts_with("logs/") {
                continue; // log snapshots, checked while the collector ran
            }
            let file_name = rest.rsplit('/').next().unwrap_or(rest);
            let partition = match rest.split('/').collect::<Vec<_>>()[..] {
                ["node_events", _] => "node_events".to_string(),
                ["job_events", job, _] => format!("job_events/{job}"),
                _ => {
                    failures.push(format!(
                        "unexpected object {key} (not node_events or job_events)"
                    ));
                    continue;
                }
            };
            if !history_server_accepts(file_name) {
                failures.push(format!("the History Server would skip {key}"));
            }
            if !file_name.starts_with(&format!("{node_hex}-")) {
                failures.push(format!("{key}: file name does not start with the node id"));
            }
            let in_job = partition == format!("job_events/{job_hex}");
            let text = String::from_utf8_lossy(&decode(key, bytes)).into_owned();
            if text.trim().is_empty() {
                failures.push(format!("{key}: empty event object"));
            }
            for (i, line) in text.lines().enumerate() {
                total_lines += 1;
                let at = format!("{key} line {}", i + 1);
                let event: Value = match serde_json::from_str(line) {
                    Ok(v @ Value::Object(_)) => v,
                    Ok(_) => {
                        failures.push(format!("{at}: not a JSON object: {}", short(line)));
                        continue;
                    }
                    Err(e) => {
                        failures.push(format!("{at}: not JSON ({e}): {}", short(line)));
                        continue;
                    }
                };
                let event_type = event["eventType"].as_str().unwrap_or("?").to_string();
                *counts
                    .entry((partition.clone(), event_type.clone()))
                    .or_insert(0) += 1;
                if event["sessionName"].as_str() != Some(session) {
                    failures.push(format!("{at}: sessionName is {}", event["sessionName"]));
                }
                match event["eventId"].as_str() {
                    Some(id) if !event_ids.insert(id.to_string()) => {
                        failures.push(format!("{at}: eventId {id} appears more than once"))
                    }
                    None => failures.push(format!("{at}: no eventId")),
                    _ => {}
                }
                // One node here, so every event names it.
                let node = event["nodeId"].as_str().and_then(b64_to_hex);
                if node.as_deref() != Some(node_hex) {
                    failures.push(format!(
                        "{at}: nodeId {} is not node {node_hex}",
                        event["nodeId"]
                    ));
                }
                let payload_job = payload(&event)
                    .and_then(|p| p.get("jobId"))
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty());
                if partition == "node_events" {
                    if let Some(j) = payload_job {
                        failures.push(format!(
                            "{at}: {event_type} with jobId {j} is in node_events"
                        ));
                    }
                } else {
                    let decoded = payload_job
                        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok());
                    let expected = if in_job {
                        Some(job_bytes.clone())
                    } else {
                        hex_decode(partition.trim_start_matches("job_events/"))
                    };
                    if decoded.is_none() || decoded != expected {
                        failures.push(format!(
                            "{at}: payload jobId {payload_job:?} does not match {partition}"
                        ));
                    }
                }
                if in_job {
                    job_events.push(event);
                }
            }
        }

        let has = |t: &str| job_events.iter().any(|e| e["eventType"] == t);
        for t in ["TASK_DEFINITION_EVENT", "TASK_LIFECYCLE_EVENT"] {
            if !has(t) {
                failures.push(format!("no {t} in job {job_hex}'s events"));
            }
        }
        check_failed_task(&job_events, &mut failures);

        BucketCheck {
            failures,
            counts,
            total_lines,
        }
    }
}

/// The task named [`FAILING_TASK`] has a definition, and a lifecycle event with a FAILED
/// state transition whose error carries the exception text.
fn check_failed_task(job_events: &[Value], failures: &mut Vec<String>) {
    let task_ids: BTreeSet<&str> = job_events
        .iter()
        .filter(|e| e["eventType"] == "TASK_DEFINITION_EVENT")
        .map(|e| &e["taskDefinitionEvent"])
        .filter(|d| d["taskName"] == FAILING_TASK)
        .filter_map(|d| d["taskId"].as_str())
        .collect();
    if task_ids.len() != 1 {
        failures.push(format!(
            "expected one TASK_DEFINITION_EVENT named {FAILING_TASK:?}, found task ids {task_ids:?}"
        ));
        return;
    }
    let lifecycle: Vec<&Value> = job_events
        .iter()
        .filter(|e| e["eventType"] == "TASK_LIFECYCLE_EVENT")
        .map(|e| &e["taskLifecycleEvent"])
        .filter(|l| l["taskId"].as_str().is_some_and(|id| task_ids.contains(id)))
        .collect();
    let failed: Vec<&&Value> = lifecycle
        .iter()
        .filter(|l| {
            l["stateTransitions"]
                .as_array()
                .is_some_and(|ts| ts.iter().any(|t| t["state"] == "FAILED"))
        })
        .collect();
    if failed.is_empty() {
        let states: Vec<Vec<&Value>> = lifecycle
            .iter()
            .map(|l| {
                l["stateTransitions"]
                    .as_array()
                    .map(|ts| ts.iter().map(|t| &t["state"]).collect())
                    .unwrap_or_default()
            })
            .collect();
        failures.push(format!(
            "no TASK_LIFECYCLE_EVENT of task {FAILING_TASK:?} has a FAILED transition; \
             its lifecycle events' states: {states:?}"
        ));
        return;
    }
    let carries_error = failed.iter().any(|l| {
        l["rayErrorInfo"]["errorMessage"]
            .as_str()
            .is_some_and(|m| m.contains(FAILURE_TEXT))
    });
    if !carries_error {
        failures.push(format!(
            "the FAILED lifecycle event of {FAILING_TASK:?} does not carry the error \
             {FAILURE_TEXT:?}: {}",
            short(&failed[0].to_string())
        ));
    }
}

/// The event's payload: its one top-level member whose value is a JSON object
/// (`taskLifecycleEvent`, `nodeDefinitionEvent`, ...).
fn payload(event: &Value) -> Option<&serde_json::Map<String, Value>> {
    let mut objects = event.as_object()?.values().filter_map(Value::as_object);
    let first = objects.next()?;
    objects.next().is_none().then_some(first)
}

// ------------------------------------------------------------------------ inspect

/// `ray-history-collector inspect <args>`, which must succeed; its stdout.
fn run_inspect(args: &[&str]) -> String {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ray-history-collector"));
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

/// One task execution: (task id, worker id, start, end), times in microseconds.
type Execution = (String, String, f64, f64);

/// The task executions of Ray's trace (`task::<name>` slices of a worker).
fn ray_executions(trace: &Value) -> Vec<Execution> {
    trace
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["ph"] == "X" && e["cat"].as_str().is_some_and(|c| c.starts_with("task::")))
        .filter_map(|e| {
            let worker = e["tid"].as_str()?.strip_prefix("worker:")?.to_string();
            let ts = e["ts"].as_f64()?;
            Some((
                e["args"]["task_id"].as_str()?.to_string(),
                worker,
                ts,
                ts + e["dur"].as_f64()?,
            ))
        })
        .collect()
}

/// The task slices of our trace, with their workers from the thread names.
fn our_executions(trace: &Value) -> Vec<Execution> {
    let events = trace["traceEvents"].as_array().cloned().unwrap_or_default();
    let threads: BTreeMap<(u64, u64), String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .filter_map(|e| {
            let name = e["args"]["name"].as_str()?.strip_prefix("worker:")?;
            Some(((e["pid"].as_u64()?, e["tid"].as_u64()?), name.to_string()))
        })
        .collect();
    events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "task")
        .filter_map(|e| {
            let worker = threads
                .get(&(e["pid"].as_u64()?, e["tid"].as_u64()?))?
                .clone();
            let ts = e["ts"].as_f64()?;
            Some((
                e["args"]["task_id"].as_str()?.to_string(),
                worker,
                ts,
                ts + e["dur"].as_f64()?,
            ))
        })
        .collect()
}

/// Every task execution of Ray's trace has a slice in ours on the same worker, within
/// [`TIMELINE_TOLERANCE_US`] at both ends. Returns how many were compared, and the failures.
fn compare_timelines(ray: &std::path::Path, ours: &std::path::Path) -> (usize, Vec<String>) {
    let read = |p: &std::path::Path| -> Value {
        let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", p.display()))
    };
    let theirs = ray_executions(&read(ray));
    let mine = our_executions(&read(ours));
    let mut failures = Vec::new();
    if theirs.len() < 10 {
        failures.push(format!(
            "Ray's trace has only {} task executions: {theirs:?}",
            theirs.len()
        ));
    }
    for (task, worker, start, end) in &theirs {
        let candidates: Vec<&Execution> = mine.iter().filter(|m| &m.0 == task).collect();
        let close = candidates.iter().any(|m| {
            &m.1 == worker
                && (m.2 - start).abs() <= TIMELINE_TOLERANCE_US
                && (m.3 - end).abs() <= TIMELINE_TOLERANCE_US
        });
        if !close {
            failures.push(format!(
                "Ray's execution of task {task} on worker {worker} ({start:.0}..{end:.0} us) has no \
                 slice within {TIMELINE_TOLERANCE_US} us on that worker in ours: {candidates:?}"
            ));
        }
    }
    (theirs.len(), failures)
}

// ------------------------------------------------------------------------ collector metrics

/// `POST /v1/events` request counts by response status, from `rhc_http_requests_total`.
fn post_statuses(collector: &Collector) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Ok(r) = collector.get("/metrics") else {
        return out;
    };
    let text = String::from_utf8_lossy(&r.body).into_owned();
    for line in text.lines() {
        let Some(labels) = line.strip_prefix("rhc_http_requests_total{") else {
            continue;
        };
        if !labels.contains("/v1/events") {
            continue;
        }
        let status = labels
            .split("status=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap_or("?")
            .to_string();
        let n: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *out.entry(status).or_insert(0.0) += n;
    }
    out
}

// ------------------------------------------------------------------------ helpers

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn b64_to_hex(s: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn short(s: &str) -> String {
    short_to(s, 400)
}
