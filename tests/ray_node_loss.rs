//! The node vanishes mid-job, with real Ray: a local Ray 2.60 instance keeps finishing tasks
//! while the collector, at its defaults (a 10 s `--upload-window`, a 5-minute rotation), is
//! killed with SIGKILL and its spool deleted, as when a spot node is reclaimed. Nothing was
//! sealed by rotation, so everything in the bucket got there by the growth of open objects.
//!
//! Then the `file://` bucket is read the way the history server reads it (every event object
//! whole gzip of JSON lines) and by `inspect`: every task that Ray reported finished more
//! than the window before the kill must be there with its FINISHED transition. The driver
//! records, for each task, when `ray.get` returned (at or after the task finished, so the
//! bound is conservative by the event's trip from the worker through Ray's aggregator).
//!
//! KubeRay's history server half (the session opened through the real server) needs its
//! binary, which cannot be installed here (the Go module proxy refuses KubeRay's module):
//! `tests/history_e2e.rs` opens sessions through it where `RHC_HISTORY_SERVER` is set.
//!
//! ```text
//! eval "$(./scripts/install-test-deps.sh)"
//! RHC_REQUIRE_SERVICES=1 cargo test --test ray_node_loss -- --nocapture
//! ```

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use object_store::local::LocalFileSystem;
use object_store::ObjectStore;
use serde_json::Value;

use rhc_testkit::collector::*;
use rhc_testkit::ray::*;
use rhc_testkit::services::*;

const NAMESPACE: &str = "default";
const CLUSTER: &str = "nodeloss";
const MARKER_VAR: &str = "RHC_NODE_LOSS_MARKER";
/// The collector's default `--upload-window`: the promise under test.
const WINDOW: Duration = Duration::from_secs(10);
/// How long the job runs; the kill comes [`KILL_AFTER`] after its first finished task.
const RUN_SECONDS: u64 = 40;
const KILL_AFTER: Duration = Duration::from_secs(24);
/// Bound on everything the workload waits for, Ray's start and shutdown included.
const WORKLOAD_LIMIT: Duration = Duration::from_secs(180);

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The tasks the driver saw finish: (hex task id, Unix seconds when `ray.get` returned).
fn finished_tasks(path: &std::path::Path) -> Vec<(String, f64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| {
                    Some((
                        t["task_id"].as_str()?.to_ascii_lowercase(),
                        t["done"].as_f64()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn tasks_finished_before_the_window_survive_the_node() {
    let Some(python) = ray_python() else {
        return;
    };
    let started = Instant::now();
    let work = RayWorkDir::new("ray_node_loss", "rhc-nl-", MARKER_VAR);
    let store_dir = work.store();
    let ray_tmp = work.ray_tmp();
    // The defaults of a sidecar: only storage, identity, Ray's temp dir (and the test's
    // --listen and --spool-dir, added by Collector::start).
    let mut collector = Collector::start(
        &work.spool(),
        &[
            "--storage",
            store_dir.to_str().expect("utf-8 temp path"),
            "--cluster-name",
            CLUSTER,
            "--cluster-namespace",
            NAMESPACE,
            "--role",
            "head",
            "--ray-tmp-dir",
            ray_tmp.to_str().expect("utf-8 temp path"),
        ],
        &[],
    );

    let tasks_file = work.path().join("tasks.json");
    let dashboard_port = free_port().to_string();
    let mut cmd = workload_command(
        &python,
        "node_loss_workload.py",
        &work,
        &collector,
        &dashboard_port,
    );
    cmd.env("RHC_E2E_TASKS", &tasks_file)
        .env("RHC_E2E_RUN_SECONDS", RUN_SECONDS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start the Ray workload");
    let stdout = child.stdout.take().expect("workload stdout");
    let stderr = child.stderr.take().expect("workload stderr");
    let out_thread = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });

    // Wait for the first finished task, then let the job run until the kill.
    let limit = Instant::now() + WORKLOAD_LIMIT;
    let first_done = loop {
        if let Some(first) = finished_tasks(&tasks_file).first() {
            break first.1;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the workload exited ({status}) before any task finished\n{}\n--- collector log ---\n{}",
                err_thread.join().unwrap_or_default(),
                collector.log_tail(60)
            );
        }
        assert!(
            Instant::now() < limit,
            "no task finished in time\n{}",
            collector.log_tail(60)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    while now_unix() < first_done + KILL_AFTER.as_secs_f64() {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(collector.alive(), "the collector died on its own");
    let accepted_before_kill = collector.metric("rhc_events_accepted_total");

    // The node vanishes: SIGKILL, and its disk with it.
    collector.kill9();
    let killed_at = now_unix();
    std::fs::remove_dir_all(work.spool()).expect("delete the spool");

    // The job goes on without a collector; Ray retries its POSTs until it shuts down.
    let deadline = Instant::now() + WORKLOAD_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the workload") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the Ray workload did not end within {WORKLOAD_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout_lines = out_thread.join().unwrap_or_default();
    let stderr_text = err_thread.join().unwrap_or_default();
    assert!(
        status.success(),
        "the Ray workload failed ({status})\n{}",
        tail(&stderr_text, 8 * 1024)
    );
    let result = workload_result(&stdout_lines.join("\n")).expect("the workload's result line");
    let lingering = work.wait_for_ray_exit(RAY_EXIT_GRACE);

    // What should be in the bucket: tasks finished more than the window before the kill.
    let tasks = finished_tasks(&tasks_file);
    let due: BTreeSet<String> = tasks
        .iter()
        .filter(|(_, done)| *done < killed_at - WINDOW.as_secs_f64())
        .map(|(id, _)| id.clone())
        .collect();
    let after: usize = tasks.iter().filter(|(_, d)| *d >= killed_at).count();

    // Read the bucket as the history server does: every event object whole, line by line.
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(&store_dir).expect("open the file bucket"));
    let objects = read_all(&store);
    let prefix = format!(
        "cluster-history/raycluster/{NAMESPACE}/{CLUSTER}/{}/",
        result.session
    );
    let mut finished_in_bucket = BTreeSet::new();
    let mut event_objects = 0usize;
    let mut lines = 0usize;
    let mut problems = Vec::new();
    for (key, bytes) in &objects {
        if !key.starts_with(&prefix)
            || !(key.contains("/job_events/") || key.contains("/node_events/"))
        {
            continue;
        }
        let name = key.rsplit('/').next().unwrap_or_default();
        if !history_server_accepts(name) {
            problems.push(format!("{key}: a name the history server would not read"));
            continue;
        }
        event_objects += 1;
        let text = decode(key, bytes);
        if !text.is_empty() && !text.ends_with(b"\n") {
            problems.push(format!("{key}: ends inside a line"));
        }
        for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            lines += 1;
            let Ok(event) = serde_json::from_slice::<Value>(line) else {
                problems.push(format!("{key}: a line that is not JSON"));
                continue;
            };
            let Some(task) = event.get("taskLifecycleEvent") else {
                continue;
            };
            let finished = task["stateTransitions"]
                .as_array()
                .is_some_and(|t| t.iter().any(|s| s["state"] == "FINISHED"));
            let id = task["taskId"]
                .as_str()
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok());
            if let (true, Some(id)) = (finished, id) {
                finished_in_bucket
                    .insert(id.iter().map(|b| format!("{b:02x}")).collect::<String>());
            }
        }
    }
    let missing: Vec<&String> = due.difference(&finished_in_bucket).collect();

    // inspect reads the same session from the bucket alone.
    let inspect = std::process::Command::new(collector_bin())
        .args([
            "inspect",
            store_dir.to_str().expect("utf-8 temp path"),
            "--session",
            &result.session,
            "--json",
        ])
        .output()
        .expect("run inspect");
    assert!(
        inspect.status.success(),
        "inspect failed: {}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    let report: Value = serde_json::from_slice(&inspect.stdout).expect("inspect --json");
    let unreadable = report["objects"]["unreadable"].as_u64().unwrap_or(u64::MAX);
    let bad_lines = report["problems"]["bad_lines"].as_u64().unwrap_or(u64::MAX);
    let inspect_finished = report["tasks"]["by_state"]["FINISHED"]
        .as_u64()
        .unwrap_or(0);

    println!(
        "ray {} session {}: {} tasks finished in {RUN_SECONDS} s ({} after the kill); \
         killed {:.1} s after the first; {} finished more than {}s before it, {} of them \
         FINISHED in the bucket ({} missing); {} event objects, {lines} lines, {} events \
         accepted before the kill; inspect: {inspect_finished} FINISHED, {unreadable} \
         unreadable objects, {bad_lines} bad lines; Ray processes left: {}; test {:.0} s",
        result.ray_version,
        result.session,
        tasks.len(),
        after,
        killed_at - first_done,
        due.len(),
        WINDOW.as_secs(),
        due.len() - missing.len(),
        missing.len(),
        event_objects,
        accepted_before_kill,
        if lingering.is_empty() {
            "none".to_string()
        } else {
            lingering.join("; ")
        },
        started.elapsed().as_secs_f64()
    );
    assert!(
        due.len() >= 50,
        "too few tasks finished before the window to test anything ({})",
        due.len()
    );
    assert!(
        problems.is_empty(),
        "objects a reader cannot use: {problems:?}"
    );
    assert!(
        missing.is_empty(),
        "{} of {} tasks finished more than {WINDOW:?} before the node vanished are not in the \
         bucket, e.g. {:?}\n--- collector log ---\n{}",
        missing.len(),
        due.len(),
        missing.iter().take(5).collect::<Vec<_>>(),
        tail(&collector.log_text(), 16 * 1024)
    );
    assert_eq!(unreadable, 0, "inspect found unreadable objects");
    assert_eq!(bad_lines, 0, "inspect found bad lines");
    assert!(
        inspect_finished as usize >= due.len(),
        "inspect shows {inspect_finished} FINISHED tasks, fewer than the {} due",
        due.len()
    );
}
