//! `ray-history-collector inspect` through the real binary: on buckets written by the real
//! collector from the captured Ray 2.60 fixtures, on buckets laid out the way KubeRay's Go
//! collector writes them, on Ray Train export events, with the --job/--since/--until
//! partition filters, and on corrupt objects. Expected values are computed here from the
//! fixtures, independently of the code under test.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;

use rhc_testkit::collector::Collector;
use rhc_testkit::services::{free_port, run_with_timeout, CommandOutput, MotoS3};

const CAMEL: &str = include_str!("data/posts-camel.jsonl");
const SNAKE: &str = include_str!("data/posts-snake.jsonl");
const EXPORT_TRAIN: &str = include_str!("data/export_events/event_EXPORT_TRAIN_STATE.log");
const EXPORT_ACTOR: &str = include_str!("data/export_events/event_EXPORT_ACTOR.log");
const EXPORT_DRIVER_JOB: &str = include_str!("data/export_events/event_EXPORT_DRIVER_JOB.log");
const EXPORT_NODE: &str = include_str!("data/export_events/event_EXPORT_NODE.log");

const CAMEL_SESSION: &str = "session_2026-11-22_02-06-36_260774_21819";
const SNAKE_SESSION: &str = "session_2026-11-22_02-06-54_202993_22498";
/// The session of the Ray Train capture (from the paths inside its events).
const TRAIN_SESSION: &str = "session_2026-11-22_02-08-16_569038_24326";
const TRAIN_NODE: &str = "f6d276f4e8fdee60cf3f62b8e0130b040f0c5788f5138674dc27719e";
const JOB: &str = "01000000";
const INSPECT_TIMEOUT: Duration = Duration::from_secs(60);

// ------------------------------------------------------------------------ helpers

/// Runs `ray-history-collector inspect <args>`.
fn inspect(args: &[&str]) -> CommandOutput {
    inspect_with_env(args, &[])
}

/// Runs `ray-history-collector inspect <args>` with extra environment variables.
fn inspect_with_env(args: &[&str], env: &[(&str, &str)]) -> CommandOutput {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ray-history-collector"));
    cmd.arg("inspect").args(args).env_remove("STORAGE_ROOT_DIR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_with_timeout(&mut cmd, INSPECT_TIMEOUT)
}

/// `inspect <args> --json`, which must succeed.
fn inspect_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = inspect(&all);
    assert!(
        out.status.success(),
        "inspect {all:?} failed: {}\n{}",
        out.status,
        out.stderr
    );
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("inspect {all:?} printed no JSON ({e}):\n{}", out.stdout))
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

/// A member under its camelCase or snake_case name.
fn get<'a>(v: &'a Value, camel: &str, snake: &str) -> &'a Value {
    match v.get(camel) {
        Some(x) => x,
        None => &v[snake],
    }
}

fn events_of(fixture: &str) -> Vec<Value> {
    fixture
        .lines()
        .flat_map(|l| match serde_json::from_str::<Value>(l).unwrap() {
            Value::Array(a) => a,
            other => panic!("not a POST body: {other}"),
        })
        .collect()
}

/// An RFC 3339 UTC timestamp with its fraction padded to 9 digits, so that strings compare
/// like times.
fn sortable_time(t: &str) -> String {
    let t = t.trim_end_matches('Z');
    let (base, frac) = t.split_once('.').unwrap_or((t, ""));
    format!("{base}.{frac:0<9}")
}

/// What a session should report, computed straight from the fixture.
#[derive(Debug, Default)]
struct Expected {
    /// (taskId hex, attempt) → (time, state) of the latest transition.
    task_states: BTreeMap<(String, i64), (String, String)>,
    /// (name, error type, error message) of failed attempts.
    failed: Vec<(String, String, String)>,
    job_entrypoint: String,
    job_states: BTreeSet<String>,
    actors: BTreeMap<String, (String, String)>,
    node_hex: String,
}

fn expected(fixture: &str) -> Expected {
    let mut e = Expected::default();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut errors: BTreeMap<(String, i64), (String, String)> = BTreeMap::new();
    let terminal = |s: &str| s == "FINISHED" || s == "FAILED";
    for ev in events_of(fixture) {
        let ty = get(&ev, "eventType", "event_type")
            .as_str()
            .unwrap()
            .to_string();
        match ty.as_str() {
            "TASK_DEFINITION_EVENT" | "ACTOR_TASK_DEFINITION_EVENT" => {
                let p = if ty == "TASK_DEFINITION_EVENT" {
                    get(&ev, "taskDefinitionEvent", "task_definition_event")
                } else {
                    get(
                        &ev,
                        "actorTaskDefinitionEvent",
                        "actor_task_definition_event",
                    )
                };
                let id = b64_to_hex(get(p, "taskId", "task_id").as_str().unwrap());
                let attempt = get(p, "taskAttempt", "task_attempt").as_i64().unwrap_or(0);
                let name = if ty == "TASK_DEFINITION_EVENT" {
                    get(p, "taskName", "task_name")
                } else {
                    get(p, "actorTaskName", "actor_task_name")
                };
                names.insert(id.clone(), name.as_str().unwrap_or("").to_string());
                e.task_states.entry((id, attempt)).or_default();
            }
            "TASK_LIFECYCLE_EVENT" => {
                let p = get(&ev, "taskLifecycleEvent", "task_lifecycle_event");
                let id = b64_to_hex(get(p, "taskId", "task_id").as_str().unwrap());
                let attempt = get(p, "taskAttempt", "task_attempt").as_i64().unwrap_or(0);
                let slot = e.task_states.entry((id.clone(), attempt)).or_default();
                for t in get(p, "stateTransitions", "state_transitions")
                    .as_array()
                    .unwrap()
                {
                    let time = sortable_time(t["timestamp"].as_str().unwrap());
                    let state = t["state"].as_str().unwrap().to_string();
                    let later = time > slot.0 || (time == slot.0 && terminal(&state));
                    if later {
                        *slot = (time, state);
                    }
                }
                let err = get(p, "rayErrorInfo", "ray_error_info");
                if err.is_object() {
                    errors.insert(
                        (id, attempt),
                        (
                            get(err, "errorType", "error_type")
                                .as_str()
                                .unwrap()
                                .to_string(),
                            get(err, "errorMessage", "error_message")
                                .as_str()
                                .unwrap()
                                .to_string(),
                        ),
                    );
                }
            }
            "DRIVER_JOB_DEFINITION_EVENT" => {
                let p = get(
                    &ev,
                    "driverJobDefinitionEvent",
                    "driver_job_definition_event",
                );
                e.job_entrypoint = p["entrypoint"].as_str().unwrap().to_string();
            }
            "DRIVER_JOB_LIFECYCLE_EVENT" => {
                let p = get(&ev, "driverJobLifecycleEvent", "driver_job_lifecycle_event");
                for t in get(p, "stateTransitions", "state_transitions")
                    .as_array()
                    .unwrap()
                {
                    e.job_states
                        .insert(t["state"].as_str().unwrap().to_string());
                }
            }
            "ACTOR_DEFINITION_EVENT" => {
                let p = get(&ev, "actorDefinitionEvent", "actor_definition_event");
                let id = b64_to_hex(get(p, "actorId", "actor_id").as_str().unwrap());
                let class = get(p, "className", "class_name")
                    .as_str()
                    .unwrap()
                    .to_string();
                e.actors.entry(id).or_default().0 = class;
            }
            "ACTOR_LIFECYCLE_EVENT" => {
                let p = get(&ev, "actorLifecycleEvent", "actor_lifecycle_event");
                let id = b64_to_hex(get(p, "actorId", "actor_id").as_str().unwrap());
                let mut latest = (String::new(), String::new());
                for t in get(p, "stateTransitions", "state_transitions")
                    .as_array()
                    .unwrap()
                {
                    let time = sortable_time(t["timestamp"].as_str().unwrap());
                    if time > latest.0 {
                        latest = (time, t["state"].as_str().unwrap().to_string());
                    }
                }
                e.actors.entry(id).or_default().1 = latest.1;
            }
            "NODE_DEFINITION_EVENT" => {
                let p = get(&ev, "nodeDefinitionEvent", "node_definition_event");
                e.node_hex = p["labels"]["ray.io/node-id"].as_str().unwrap().to_string();
            }
            _ => {}
        }
    }
    for (key, (_, state)) in &e.task_states {
        if state == "FAILED" {
            let (ty, msg) = errors.get(key).cloned().unwrap_or_default();
            e.failed.push((names[&key.0].clone(), ty, msg));
        }
    }
    e
}

impl Expected {
    fn counts(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for (_, state) in self.task_states.values() {
            let state = if state.is_empty() { "UNKNOWN" } else { state };
            *counts.entry(state.to_string()).or_insert(0) += 1;
        }
        counts
    }
}

/// Checks a session report against what the fixture says.
fn check_session(report: &Value, want: &Expected, what: &str) {
    let counts: BTreeMap<String, u64> = report["tasks"]["by_state"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    assert_eq!(counts, want.counts(), "{what}: task counts by state");
    assert_eq!(
        report["tasks"]["total"].as_u64().unwrap(),
        want.task_states.len() as u64,
        "{what}"
    );

    let jobs = report["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{what}: jobs {jobs:?}");
    let job = &jobs[0];
    assert_eq!(job["job_id"], JOB, "{what}");
    let status = if want.job_states.contains("FINISHED") {
        "FINISHED"
    } else {
        "CREATED"
    };
    assert_eq!(job["status"], status, "{what}");
    assert_eq!(job["entrypoint"], want.job_entrypoint.as_str(), "{what}");
    assert!(job["started"].is_string(), "{what}: {job}");
    assert_eq!(
        job["ended"].is_string(),
        status == "FINISHED",
        "{what}: {job}"
    );
    assert_eq!(
        job["tasks"]["total"].as_u64().unwrap(),
        want.task_states.len() as u64,
        "{what}"
    );

    let failed = report["failed_tasks"].as_array().unwrap();
    assert!(
        !want.failed.is_empty(),
        "{what}: the fixture has a failing task"
    );
    assert_eq!(failed.len(), want.failed.len(), "{what}: {failed:?}");
    assert_eq!(
        report["failed_tasks_total"].as_u64().unwrap(),
        want.failed.len() as u64
    );
    for (got, (name, ty, msg)) in failed.iter().zip(&want.failed) {
        assert_eq!(got["name"], name.as_str(), "{what}");
        assert_eq!(got["error_type"], ty.as_str(), "{what}");
        assert_eq!(got["error_message"], msg.as_str(), "{what}");
        assert_eq!(got["job_id"], JOB, "{what}");
        assert!(got["failed_at"].is_string(), "{what}");
    }
    assert!(
        want.failed
            .iter()
            .any(|(n, _, m)| n == "fails" && m.contains("RuntimeError: boom")),
        "{what}: {:?}",
        want.failed
    );

    let actors: BTreeMap<String, (String, String)> = report["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["actor_id"].as_str().unwrap().to_string(),
                (
                    a["class_name"].as_str().unwrap_or("").to_string(),
                    a["state"].as_str().unwrap_or("").to_string(),
                ),
            )
        })
        .collect();
    assert_eq!(actors, want.actors, "{what}: actors");

    let nodes = report["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{what}: {nodes:?}");
    assert_eq!(nodes[0]["node_id"], want.node_hex.as_str(), "{what}");
    assert_eq!(nodes[0]["state"], "ALIVE", "{what}");
    assert_eq!(nodes[0]["ip"], "192.0.2.2", "{what}");
    assert_eq!(nodes[0]["is_head"], true, "{what}");
    assert_eq!(report["problems"]["unreadable_objects"], 0, "{what}");
    assert_eq!(report["problems"]["bad_lines"], 0, "{what}");
}

/// The table that follows the line `title` in text output: its header and rows.
fn table_after<'a>(text: &'a str, title: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| !l.starts_with(title))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect()
}

/// Every cell of every row starts where its column header starts (left-aligned columns),
/// after the two-space gap that separates columns.
fn assert_aligned(table: &[&str], columns: &[&str]) {
    let header = table[0];
    for col in columns {
        let at = header
            .find(col)
            .unwrap_or_else(|| panic!("no column {col} in {header:?}"));
        let pos = header[..at].chars().count();
        assert!(pos >= 2, "{col} is the first column");
        for row in &table[1..] {
            let chars: Vec<char> = row.chars().collect();
            let starts_here = chars.get(pos - 2) == Some(&' ')
                && chars.get(pos - 1) == Some(&' ')
                && chars.get(pos).is_some_and(|c| *c != ' ');
            assert!(starts_here, "column {col} misaligned:\n{header}\n{row}");
        }
    }
}

/// Writes `bytes` at `key` under the file bucket `dir`.
fn put(dir: &Path, key: &str, bytes: &[u8]) {
    let path = dir.join(key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// Runs the real collector on both fixtures into the local bucket `store`.
fn collect_fixtures(work: &Path, store: &Path) {
    collect_fixtures_to(work, store.to_str().unwrap(), &[]);
}

/// Runs the real collector on both fixtures into `storage` (a --storage value).
fn collect_fixtures_to(work: &Path, storage: &str, env: &[(&str, &str)]) {
    let ray_tmp = work.join("ray");
    std::fs::create_dir_all(&ray_tmp).unwrap();
    let dashboard = format!("http://127.0.0.1:{}", free_port());
    let mut c = Collector::start(
        &work.join("spool"),
        &[
            "--storage",
            storage,
            "--cluster-name",
            "c1",
            "--enable-log-collector",
            "false",
            "--ray-tmp-dir",
            ray_tmp.to_str().unwrap(),
            "--dashboard-address",
            &dashboard,
        ],
        env,
    );
    for line in CAMEL.lines().chain(SNAKE.lines()) {
        let r = c.post(line.as_bytes());
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "collector: {status}\n{}", c.log_text());
}

// ------------------------------------------------------------------------ tests

#[test]
fn collector_bucket_lists_sessions_and_reports_jobs_tasks_actors_nodes() {
    let started = Instant::now();
    let work = tempfile::tempdir().unwrap();
    let store = work.path().join("store");
    collect_fixtures(work.path(), &store);
    let dir = store.to_str().unwrap();

    // Without --session: both sessions of cluster c1, with sizes and hour spans.
    let list = inspect_json(&[dir]);
    let clusters = list["clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 1, "{list}");
    assert_eq!(clusters[0]["kind"], "raycluster");
    assert_eq!(clusters[0]["namespace"], "default");
    assert_eq!(clusters[0]["cluster"], "c1");
    let sessions: Vec<&str> = clusters[0]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap())
        .collect();
    assert_eq!(sessions, [CAMEL_SESSION, SNAKE_SESSION]);
    for s in clusters[0]["sessions"].as_array().unwrap() {
        assert_eq!(s["nodes"], 1, "{s}");
        assert!(s["objects"].as_u64().unwrap() >= 2, "{s}");
        assert!(s["bytes"].as_u64().unwrap() > 1000, "{s}");
        assert_eq!(s["events_from"], "2026-11-22T02:00:00Z", "{s}");
        assert_eq!(s["events_until"], "2026-11-22T03:00:00Z", "{s}");
    }
    assert_eq!(
        clusters[0]["sessions"][0]["started"],
        "2026-11-22T02:06:36.260774"
    );
    let text = inspect_text(&[dir]);
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("KIND"))
        .collect();
    assert_eq!(table.len(), 3, "{text}");
    assert_aligned(&table, &["NAMESPACE", "CLUSTER", "SESSION", "STARTED"]);

    // Each session against its fixture: camelCase and snake_case.
    for (session, fixture) in [(CAMEL_SESSION, CAMEL), (SNAKE_SESSION, SNAKE)] {
        let report = inspect_json(&[dir, "--session", session]);
        assert_eq!(report["session"], session);
        check_session(&report, &expected(fixture), session);
        assert!(
            report["events"]["total"].as_u64().unwrap() > 300,
            "{report}"
        );
    }
    // `latest` is the later session.
    assert_eq!(
        inspect_json(&[dir, "--session", "latest"])["session"],
        SNAKE_SESSION
    );

    // Text: aligned tables holding the same facts.
    let text = inspect_text(&[dir, "--session", CAMEL_SESSION]);
    let jobs = table_after(&text, "JOBS");
    assert!(jobs[1].starts_with("01000000  FINISHED"), "{text}");
    assert_aligned(&jobs, &["STATUS", "STARTED", "ENDED", "ENTRYPOINT"]);
    let section = table_after(&text, "FAILED TASKS");
    // The table, then the commands that print each failed attempt's log.
    let failed: Vec<&str> = section
        .iter()
        .copied()
        .take_while(|l| !l.starts_with("  "))
        .collect();
    assert_eq!(failed.len(), 2, "{text}");
    assert!(
        section[2..].iter().any(
            |l| l.trim_start().starts_with("ray-history-collector inspect ")
                && l.ends_with("--logs 79cc316456d39201ffffffffffffffffffffffff01000000 --err")
        ),
        "{text}"
    );
    assert_aligned(
        &failed,
        &["TASK ID", "NAME", "JOB ID", "ERROR TYPE", "ERROR"],
    );
    assert!(
        failed[1].ends_with("TASK_EXECUTION_EXCEPTION  RuntimeError: boom"),
        "{text}"
    );
    assert!(
        !text.contains('\u{1b}'),
        "terminal escapes leaked into text output"
    );
    let actors = table_after(&text, "ACTORS");
    assert_aligned(&actors, &["CLASS", "NAME", "JOB ID", "STATE"]);
    assert!(
        actors[1].contains("Counter") && actors[1].contains("DEAD"),
        "{text}"
    );
    let nodes = table_after(&text, "NODES");
    assert_aligned(&nodes, &["IP", "HOSTNAME", "STATE"]);
    println!("{text}");
    println!("test took {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn kuberay_style_bucket_reads_the_same() {
    let work = tempfile::tempdir().unwrap();
    let collector_store = work.path().join("store");
    collect_fixtures(work.path(), &collector_store);
    let ours = inspect_json(&[
        collector_store.to_str().unwrap(),
        "--session",
        CAMEL_SESSION,
    ]);

    // The same events as KubeRay's Go collector lays them out, for a RayJob-owned cluster:
    // node events in one JSON-array file without a suffix, job events as plain JSON lines
    // in two files named with Unix nanoseconds.
    let bucket = work.path().join("kuberay");
    let want = expected(CAMEL);
    let node = want.node_hex.clone();
    let prefix =
        format!("cluster-history/rayjob/ns1/myjob/myjob-raycluster-x/{CAMEL_SESSION}/{node}");
    put(
        &bucket,
        &format!("cluster-metadata/rayjob/ns1_myjob_myjob-raycluster-x/{CAMEL_SESSION}"),
        b"",
    );
    let mut node_events = Vec::new();
    let mut job_lines = Vec::new();
    for ev in events_of(CAMEL) {
        let payload = ev
            .as_object()
            .unwrap()
            .values()
            .find(|v| v.is_object())
            .unwrap();
        match payload
            .get("jobId")
            .and_then(Value::as_str)
            .filter(|j| !j.is_empty())
        {
            Some(j) if !ev["eventType"].as_str().unwrap().starts_with("NODE_") => {
                assert_eq!(b64_to_hex(j), JOB);
                job_lines.push(ev.to_string());
            }
            _ => node_events.push(ev),
        }
    }
    put(
        &bucket,
        &format!("{prefix}/node_events/{node}-2026-11-22-02"),
        serde_json::to_string_pretty(&node_events)
            .unwrap()
            .as_bytes(),
    );
    let half = job_lines.len() / 2;
    put(
        &bucket,
        &format!("{prefix}/job_events/{JOB}/{node}-2026-11-22-02-1795313302138000000.jsonl"),
        (job_lines[..half].join("\n") + "\n").as_bytes(),
    );
    put(
        &bucket,
        &format!("{prefix}/job_events/{JOB}/{node}-2026-11-22-02-1795313602138000000.jsonl"),
        job_lines[half..].join("\n").as_bytes(),
    );
    // Logs and the head's endpoint snapshots are not events.
    put(
        &bucket,
        &format!("{prefix}/logs/raylet.out"),
        b"Setting node ID\n",
    );
    put(
        &bucket,
        &format!("cluster-history/rayjob/ns1/myjob/myjob-raycluster-x/{CAMEL_SESSION}/fetched_endpoints/restful__timezone"),
        b"{}",
    );

    let dir = bucket.to_str().unwrap();
    let list = inspect_json(&[dir]);
    let cluster = &list["clusters"][0];
    assert_eq!(cluster["kind"], "rayjob");
    assert_eq!(cluster["namespace"], "ns1");
    assert_eq!(cluster["owner"], "myjob");
    assert_eq!(cluster["cluster"], "myjob-raycluster-x");
    assert_eq!(cluster["sessions"][0]["nodes"], 1);
    assert_eq!(cluster["sessions"][0]["objects"], 5);
    assert_eq!(cluster["sessions"][0]["event_objects"], 3);

    let theirs = inspect_json(&[
        dir,
        "--session",
        CAMEL_SESSION,
        "--cluster",
        "myjob-raycluster-x",
    ]);
    check_session(&theirs, &want, "kuberay layout");
    // The command that shows a failed task's log names its own bucket.
    let (mut theirs, mut ours) = (theirs, ours);
    for report in [&mut theirs, &mut ours] {
        for t in report["failed_tasks"].as_array_mut().unwrap() {
            let command = t["log_command"].take();
            assert!(
                command
                    .as_str()
                    .unwrap()
                    .starts_with("ray-history-collector inspect /"),
                "{command}"
            );
        }
    }
    for section in [
        "jobs",
        "tasks",
        "failed_tasks",
        "actors",
        "train_runs",
        "events",
    ] {
        assert_eq!(theirs[section], ours[section], "{section} differs");
    }
    assert_eq!(theirs["nodes"][0]["log_objects"], 1);
    assert_eq!(theirs["objects"]["read"], 3);
}

#[test]
fn export_events_show_train_runs_with_history_attempts_and_workers() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    let prefix = format!("cluster-history/raycluster/default/train/{TRAIN_SESSION}/{TRAIN_NODE}");
    put(
        &bucket,
        &format!("cluster-metadata/raycluster/default_train/{TRAIN_SESSION}"),
        b"",
    );
    // As the collector files them: run, driver job and actor events under their job;
    // attempts (no job id) and node events under "node".
    let mut job_part = String::new();
    let mut node_part = String::new();
    for line in EXPORT_TRAIN.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        if v["source_type"] == "EXPORT_TRAIN_RUN_ATTEMPT" {
            node_part.push_str(line);
            node_part.push('\n');
        } else {
            job_part.push_str(line);
            job_part.push('\n');
        }
    }
    job_part.push_str(EXPORT_DRIVER_JOB);
    job_part.push_str(EXPORT_ACTOR);
    node_part.push_str(EXPORT_NODE);
    put(
        &bucket,
        &format!(
            "{prefix}/export_events/{JOB}/{TRAIN_NODE}-2026-11-22-02-1795313307000000000.jsonl.gz"
        ),
        &gzip(job_part.as_bytes()),
    );
    put(
        &bucket,
        &format!(
            "{prefix}/export_events/node/{TRAIN_NODE}-2026-11-22-02-1795313307000000001.jsonl.gz"
        ),
        &gzip(node_part.as_bytes()),
    );

    let dir = bucket.to_str().unwrap();
    let report = inspect_json(&[dir, "--session", TRAIN_SESSION]);
    let runs = report["train_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{report}");
    let run = &runs[0];
    assert_eq!(run["name"], "probe-run");
    assert_eq!(run["run_id"], "ae4afcdffed845d89575cec07359e11c");
    assert_eq!(run["job_id"], JOB);
    assert_eq!(run["status"], "FINISHED");
    assert!(
        run["started"].is_string() && run["ended"].is_string(),
        "{run}"
    );
    assert_eq!(run["framework_versions"]["ray"], "2.60.0");
    let history: Vec<&str> = run["status_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        history,
        ["INITIALIZING", "SCHEDULING", "RUNNING", "FINISHED"]
    );
    let attempts = run["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{run}");
    assert_eq!(
        attempts[0]["attempt_id"],
        "739abb6d31b046b785ecc555ad523bd8"
    );
    assert_eq!(attempts[0]["status"], "FINISHED");
    let attempt_history: Vec<&str> = attempts[0]["status_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(attempt_history, ["PENDING", "RUNNING", "FINISHED"]);
    let workers = attempts[0]["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2, "{}", attempts[0]);
    for (rank, w) in workers.iter().enumerate() {
        assert_eq!(w["world_rank"], rank as u64, "{w}");
        assert_eq!(w["node_id"], TRAIN_NODE);
        assert_eq!(w["node_ip"], "192.0.2.2");
        assert!(w["pid"].as_u64().unwrap() > 0);
        assert_eq!(w["actor_id"].as_str().unwrap().len(), 32, "{w}");
    }

    // The driver job and node come from the export events too.
    let job = &report["jobs"][0];
    assert_eq!(job["job_id"], JOB);
    assert_eq!(job["status"], "FINISHED");
    assert_eq!(job["entrypoint"], "./venv/bin/python job4.py");
    assert_eq!(job["started"], "2026-11-22T02:08:22.138Z");
    let node = &report["nodes"][0];
    assert_eq!(node["node_id"], TRAIN_NODE);
    assert_eq!(node["state"], "DEAD");
    assert_eq!(node["death_reason"], "EXPECTED_TERMINATION");
    assert_eq!(node["is_head"], true);
    let classes: BTreeSet<&str> = report["actors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["class_name"].as_str())
        .collect();
    assert!(classes.contains("TrainController"), "{classes:?}");
    assert_eq!(report["problems"]["unreadable_objects"], 0);

    let text = inspect_text(&[dir, "--session", "latest"]);
    assert!(
        text.contains("status history: INITIALIZING → SCHEDULING → RUNNING → FINISHED"),
        "{text}"
    );
    assert!(text.contains("FINISHED, 2 worker(s)"), "{text}");
    let runs = table_after(&text, "RAY TRAIN RUNS");
    assert!(runs[1].contains("probe-run"), "{text}");
    assert_aligned(&runs, &["NAME", "JOB ID", "STATUS", "STARTED"]);
    println!("{text}");
}

#[test]
fn job_and_time_filters_read_only_matching_partitions() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    let want = expected(CAMEL);
    let node = want.node_hex.clone();
    let prefix = format!("cluster-history/raycluster/default/c1/{CAMEL_SESSION}/{node}");
    put(
        &bucket,
        &format!("cluster-metadata/raycluster/default_c1/{CAMEL_SESSION}"),
        b"",
    );
    let mut node_lines = String::new();
    let mut job_lines = String::new();
    for ev in events_of(CAMEL) {
        let payload = ev
            .as_object()
            .unwrap()
            .values()
            .find(|v| v.is_object())
            .unwrap();
        let has_job = payload
            .get("jobId")
            .and_then(Value::as_str)
            .is_some_and(|j| !j.is_empty());
        let target = if has_job && !ev["eventType"].as_str().unwrap().starts_with("NODE_") {
            &mut job_lines
        } else {
            &mut node_lines
        };
        target.push_str(&ev.to_string());
        target.push('\n');
    }
    put(
        &bucket,
        &format!("{prefix}/node_events/{node}-2026-11-22-02-1.jsonl.gz"),
        &gzip(node_lines.as_bytes()),
    );
    put(
        &bucket,
        &format!("{prefix}/job_events/{JOB}/{node}-2026-11-22-02-2.jsonl.gz"),
        &gzip(job_lines.as_bytes()),
    );
    // Corrupt objects, one per partition the filters must not read.
    let corrupt = b"this is not gzip";
    put(
        &bucket,
        &format!("{prefix}/job_events/02000000/{node}-2026-11-22-02-3.jsonl.gz"),
        corrupt,
    );
    put(
        &bucket,
        &format!("{prefix}/job_events/{JOB}/{node}-2026-11-22-09-4.jsonl.gz"),
        corrupt,
    );
    put(
        &bucket,
        &format!("{prefix}/node_events/{node}-2026-11-22-02-5.jsonl.gz"),
        corrupt,
    );
    let dir = bucket.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![dir, "--session", CAMEL_SESSION];
        args.extend_from_slice(extra);
        inspect_json(&args)
    };
    let unreadable = |r: &Value| r["problems"]["unreadable_objects"].as_u64().unwrap();
    let bad_keys = |r: &Value| -> Vec<String> {
        r["problems"]["details"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                d["key"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };

    // No filter: everything is read, the three corrupt objects are reported.
    let all = run(&[]);
    assert_eq!(unreadable(&all), 3, "{}", all["problems"]);
    assert_eq!(all["objects"]["event_objects_listed"], 5);
    assert_eq!(all["objects"]["read"], 2);
    assert_eq!(all["objects"]["unreadable"], 3);
    let jobs: Vec<&str> = all["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(jobs, [JOB, "02000000"]);

    // --job: only job_events/01000000 (both hours), never node_events or job 02000000.
    for job in [JOB, "AQAAAA=="] {
        let r = run(&["--job", job]);
        assert_eq!(unreadable(&r), 1, "{}", r["problems"]);
        assert_eq!(bad_keys(&r), [format!("{node}-2026-11-22-09-4.jsonl.gz")]);
        assert_eq!(r["objects"]["event_objects_listed"], 2);
        assert_eq!(r["objects"]["read"], 1);
        assert_eq!(r["objects"]["unreadable"], 1);
        assert_eq!(r["filter"]["job"], JOB);
        assert_eq!(r["jobs"].as_array().unwrap().len(), 1);
        assert_eq!(r["tasks"], all["tasks"]);
        // The same failures; their worker's pid and node come from node_events (worker
        // definitions carry no job), which --job does not read.
        let without_links = |v: &Value| {
            let mut v = v.clone();
            for t in v.as_array_mut().unwrap() {
                let t = t.as_object_mut().unwrap();
                t.remove("worker");
                t.remove("node");
            }
            v
        };
        assert_eq!(
            without_links(&r["failed_tasks"]),
            without_links(&all["failed_tasks"])
        );
        assert_eq!(r["jobs"][0]["status"], "FINISHED");
    }

    // --since/--until: hour 09 is outside 01..03 widened by an hour, so it is not read.
    let r = run(&["--since", "2026-11-22T01", "--until", "2026-11-22T03"]);
    assert_eq!(unreadable(&r), 2, "{}", r["problems"]);
    assert!(!bad_keys(&r).contains(&format!("{node}-2026-11-22-09-4.jsonl.gz")));
    assert_eq!(r["objects"]["skipped_by_time"], 1);
    assert_eq!(r["tasks"], all["tasks"]);

    // Both: nothing corrupt is read, and the job is complete.
    let r = run(&[
        "--job",
        JOB,
        "--since",
        "2026-11-22T02",
        "--until",
        "2026-11-22T02",
    ]);
    assert_eq!(unreadable(&r), 0, "{}", r["problems"]);
    assert_eq!(r["objects"]["read"], 1);
    assert_eq!(r["tasks"], all["tasks"]);
    check_session_job_only(&r, &want);

    // A window inside the hour keeps only the events of the window, by their own times.
    let r = run(&[
        "--job",
        JOB,
        "--since",
        "2026-11-22T02:06:44Z",
        "--until",
        "2026-11-22T02:06:45Z",
    ]);
    assert!(
        r["events"]["outside_time_window"].as_u64().unwrap() > 0,
        "{}",
        r["events"]
    );
    assert!(
        r["tasks"]["total"].as_u64().unwrap() < all["tasks"]["total"].as_u64().unwrap(),
        "{}",
        r["tasks"]
    );
    assert_eq!(r["failed_tasks"][0]["name"], "fails");
    assert_eq!(r["filter"]["since"], "2026-11-22T02:06:44Z");

    // Sessions outside the window are not listed.
    let listed = inspect_json(&[dir, "--since", "2026-11-23"]);
    assert_eq!(listed["clusters"].as_array().unwrap().len(), 0, "{listed}");
    let listed = inspect_json(&[dir, "--until", "2026-11-22T02"]);
    assert_eq!(listed["clusters"].as_array().unwrap().len(), 1, "{listed}");
}

/// With --job the report still has the job's header and failures.
fn check_session_job_only(report: &Value, want: &Expected) {
    let job = &report["jobs"][0];
    assert_eq!(job["entrypoint"], want.job_entrypoint.as_str());
    assert_eq!(
        report["failed_tasks"].as_array().unwrap().len(),
        want.failed.len()
    );
}

#[test]
fn corrupt_objects_are_reported_not_fatal() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    let want = expected(CAMEL);
    let node = want.node_hex.clone();
    let prefix = format!("cluster-history/raycluster/default/c1/{CAMEL_SESSION}/{node}");
    put(
        &bucket,
        &format!("cluster-metadata/raycluster/default_c1/{CAMEL_SESSION}"),
        b"",
    );
    // Every event, one per line, with bad lines in between.
    let mut content = String::new();
    for (i, ev) in events_of(CAMEL).iter().enumerate() {
        content.push_str(&ev.to_string());
        content.push('\n');
        if i == 3 {
            content.push_str("{\"eventType\": truncated\n");
            content.push_str("[1, 2]\n");
            content.push_str("\"just a string\"\n");
        }
    }
    put(
        &bucket,
        &format!("{prefix}/job_events/{JOB}/{node}-2026-11-22-02-1.jsonl.gz"),
        &gzip(content.as_bytes()),
    );
    // A gzip stream cut short, a non-gzip .gz, an unterminated JSON array, an empty object
    // and a name the History Server would not read.
    let full = gzip(content.as_bytes());
    put(
        &bucket,
        &format!("{prefix}/job_events/{JOB}/{node}-2026-11-22-02-2.jsonl.gz"),
        &full[..full.len() / 2],
    );
    put(
        &bucket,
        &format!("{prefix}/node_events/{node}-2026-11-22-02-3.jsonl.gz"),
        b"\x1b[31mnot gzip",
    );
    put(
        &bucket,
        &format!("{prefix}/node_events/{node}-2026-11-22-02-4"),
        b"[{\"eventType\":\"NODE_DEFINITION_EVENT\"",
    );
    put(
        &bucket,
        &format!("{prefix}/node_events/{node}-2026-11-22-02-5.jsonl"),
        b"",
    );
    put(
        &bucket,
        &format!("{prefix}/node_events/notes.txt"),
        b"hello",
    );

    let dir = bucket.to_str().unwrap();
    let r = inspect_json(&[dir, "--session", CAMEL_SESSION]);
    let problems = &r["problems"];
    assert_eq!(problems["unreadable_objects"], 2, "{problems}");
    // 3 bad lines in the full object (the same 3 in the truncated copy if it got that
    // far), and the unterminated array.
    assert!(problems["bad_lines"].as_u64().unwrap() >= 4, "{problems}");
    assert_eq!(r["objects"]["not_event_objects"], 1);
    // Read to their end: the full object, the unterminated array (bad lines, not
    // unreadable) and the empty one; the truncated and the non-gzip ones are not read.
    assert_eq!(r["objects"]["event_objects_listed"], 5);
    assert_eq!(r["objects"]["read"], 3, "{}", r["objects"]);
    assert_eq!(r["objects"]["unreadable"], 2, "{}", r["objects"]);
    // The readable data is all there (the truncated copy only repeats it).
    check_session_counts(&r, &want);
    assert!(r["events"]["duplicates"].as_u64().unwrap() > 0);

    let out = inspect(&[dir, "--session", CAMEL_SESSION]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout.contains("PROBLEMS: 2 unreadable object(s)"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("read      3 of 5 event objects, 2 unreadable ("),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains('\u{1b}'),
        "escape reached the terminal"
    );

    // Clear errors, exit code 1.
    let missing = work.path().join("no-such-bucket");
    let out = inspect(&[missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("does not exist"), "{}", out.stderr);
    assert!(!missing.exists(), "inspect created the directory");
    let empty = work.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = inspect(&[empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("no session markers"), "{}", out.stderr);
    let out = inspect(&[dir, "--session", "session_nope"]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains(CAMEL_SESSION), "{}", out.stderr);
    let out = inspect(&[dir, "--cluster", "other"]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let out = inspect(&[dir, "--session", "latest", "--since", "soon"]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("--since"), "{}", out.stderr);
}

/// Task counts and the failure, as in the fixture.
fn check_session_counts(report: &Value, want: &Expected) {
    let counts: BTreeMap<String, u64> = report["tasks"]["by_state"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    assert_eq!(counts, want.counts());
    assert_eq!(report["failed_tasks"][0]["name"], "fails");
    assert_eq!(
        report["failed_tasks"][0]["error_type"],
        want.failed[0].1.as_str()
    );
}

#[test]
fn s3_bucket_reads_like_a_directory() {
    let Some(s3) = MotoS3::start() else { return };
    s3.create_bucket("ray-history");
    let work = tempfile::tempdir().unwrap();
    let env = s3.collector_env();
    collect_fixtures_to(work.path(), "s3://ray-history/prod", &env);

    let run = |args: &[&str]| {
        let out = inspect_with_env(args, &env);
        assert!(out.status.success(), "inspect {args:?}: {}", out.stderr);
        serde_json::from_str::<Value>(&out.stdout).unwrap()
    };
    let list = run(&["s3://ray-history/prod", "--json"]);
    assert_eq!(
        list["clusters"][0]["sessions"].as_array().unwrap().len(),
        2,
        "{list}"
    );
    assert_eq!(list["storage"], "s3://ray-history/prod");
    // The root can also come from --storage-root-dir (KubeRay's STORAGE_ROOT_DIR).
    for args in [
        vec![
            "s3://ray-history/prod",
            "--session",
            CAMEL_SESSION,
            "--json",
        ],
        vec![
            "s3://ray-history",
            "--storage-root-dir",
            "prod",
            "--session",
            CAMEL_SESSION,
            "--json",
        ],
    ] {
        check_session(&run(&args), &expected(CAMEL), "s3");
    }
    let filtered = run(&[
        "s3://ray-history/prod",
        "--session",
        SNAKE_SESSION,
        "--job",
        JOB,
        "--json",
    ]);
    assert_eq!(filtered["objects"]["read"], 1, "{}", filtered["objects"]);
    assert_eq!(
        filtered["tasks"]["total"].as_u64().unwrap(),
        expected(SNAKE).task_states.len() as u64
    );

    // A bucket that does not exist, and one without markers: exit 1, one clear line.
    let out = inspect_with_env(&["s3://no-such-bucket"], &env);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("no-such-bucket"), "{}", out.stderr);
    s3.create_bucket("empty");
    let out = inspect_with_env(&["s3://empty"], &env);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("no session markers"), "{}", out.stderr);
}
