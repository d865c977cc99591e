//! Which node and which session a log is filed under, through the real binary on a Ray temp
//! root built by the test (`file://` bucket):
//!
//! - a raylet restarted into the same session (`raylet.1.out` beside `raylet.out`, Ray's own
//!   numbering) files the new logs under the new node, and each worker's logs under the node
//!   its core worker log names;
//! - the files no writer can be told for (GCS, monitor) stay under the session's first
//!   raylet's node, one object each, when a second raylet starts into the session;
//! - a worker's output without a core worker log is held at most 64 KiB or 30 s;
//! - a `session_latest` link that is missing for a few seconds (Ray removes it, then creates
//!   it again) does not finish the live session: what it writes afterwards still reaches the
//!   bucket when a newer session replaces it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rhc_testkit::collector::{append_to, read_all, Collector};
use rhc_testkit::ray_logs::{local_bucket, raylet_line, wait_for_objects as wait_for, RayRoot};

const NODE_A: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
const NODE_B: &str = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";
const S1: &str = "session_2026-11-22_02-56-13_816177_24314";
const S2: &str = "session_2026-11-22_03-10-00_000001_30001";
const CLUSTER: &str = "node-identity";
const P: &str = "cluster-history/raycluster/default/node-identity";

fn core_worker_log(worker: &str, node: &str) -> String {
    format!(
        "[2026-11-22 02:57:00,000 I 9 9] core_worker.cc:300: Initializing worker at address: \
         10.0.0.7:40001 worker_id={worker} node_id={node}\n\
         [2026-11-22 02:57:00,001 I 9 9] core_worker.cc:310: more\n"
    )
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn key(session: &str, node: &str, rel: &str) -> String {
    format!("{P}/{session}/{node}/logs/{rel}")
}

fn start(tmp: &Path, ray: &Path, interval: &str) -> Collector {
    start_with(tmp, ray, interval, &[])
}

/// [`start`] with more flags (kept across `restart`).
fn start_with(tmp: &Path, ray: &Path, interval: &str, extra: &[&str]) -> Collector {
    let storage = format!("file://{}", tmp.join("bucket").display());
    let mut args = vec![
        "--storage",
        &storage,
        "--ray-tmp-dir",
        ray.to_str().unwrap(),
        "--cluster-name",
        CLUSTER,
        "--role",
        "worker",
        "--log-upload-interval",
        interval,
        "--enable-export-events",
        "false",
    ];
    args.extend_from_slice(extra);
    Collector::start(&tmp.join("spool"), &args, &[])
}

/// Big files that keep a round busy for many seconds under the upload cap (`THROTTLE`): more
/// than go on beside the lane (4), so the round waits for the last one and is still running,
/// its ledger not saved at its end yet, when the test kills the collector.
fn busy_round(logs: &Path) {
    for i in 0..BUSY_FILES {
        write(
            &logs.join(format!("big-{i}.log")),
            &format!("{}\n", "q".repeat(99)).repeat(10_000),
        );
    }
}

/// Removes [`busy_round`]'s files.
fn end_busy_round(logs: &Path) {
    for i in 0..BUSY_FILES {
        std::fs::remove_file(logs.join(format!("big-{i}.log"))).unwrap();
    }
}

const BUSY_FILES: usize = 6;

const THROTTLE: [&str; 2] = ["--log-upload-max-bytes-per-second", "200000"];

#[test]
fn a_restarted_raylet_files_logs_under_its_own_node_and_workers_under_theirs() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    let logs = ray.logs(S1);
    let (w_a, w_b) = ("ab".repeat(28), "cd".repeat(28));
    // The first raylet (node A) and one of its workers.
    write(&logs.join("raylet.out"), &raylet_line(NODE_A));
    write(
        &logs.join(format!("python-core-worker-{w_a}_111.log")),
        &core_worker_log(&w_a, NODE_A),
    );
    let out_a = format!("worker-{w_a}-01000000-111.out");
    write(&logs.join(&out_a), "from a worker of A\n");
    // Ray's container restarts with the emptyDir kept: the new raylet (node B) gets the next
    // free name, and starts a worker of its own.
    write(&logs.join("raylet.1.out"), &raylet_line(NODE_B));
    write(
        &logs.join(format!("python-core-worker-{w_b}_222.log")),
        &core_worker_log(&w_b, NODE_B),
    );
    let out_b = format!("worker-{w_b}-01000000-222.out");
    write(&logs.join(&out_b), "from a worker of B\n");
    // Ray numbers the agents with their raylet: `dashboard_agent.log` is A's agent,
    // `dashboard_agent.1.log` B's.
    write(&logs.join("dashboard_agent.log"), "agent of A\n");
    write(&logs.join("dashboard_agent.1.log"), "agent of B\n");
    write(&logs.join("gcs_server.out"), "no writer named\n");
    ray.point_latest(S1);

    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray.root, "1s");
    let expected = [
        key(S1, NODE_A, "raylet.out"),
        key(S1, NODE_A, &out_a),
        key(S1, NODE_A, &format!("python-core-worker-{w_a}_111.log")),
        key(S1, NODE_B, "raylet.1.out"),
        key(S1, NODE_B, &out_b),
        key(S1, NODE_B, &format!("python-core-worker-{w_b}_222.log")),
        key(S1, NODE_A, "dashboard_agent.log"),
        key(S1, NODE_B, "dashboard_agent.1.log"),
        // Nothing names its writer: the session's first raylet's node.
        key(S1, NODE_A, "gcs_server.out"),
    ];
    let objects = wait_for(&store, "each log under its node", &c, |o| {
        expected.iter().all(|k| o.contains_key(k))
    });
    assert_eq!(objects[&key(S1, NODE_B, &out_b)], b"from a worker of B\n");
    let logs_of = |node: &str| -> Vec<&String> {
        objects
            .keys()
            .filter(|k| k.starts_with(&format!("{P}/{S1}/{node}/logs/")))
            .collect()
    };
    assert_eq!(
        objects[&key(S1, NODE_A, "dashboard_agent.log")],
        b"agent of A\n"
    );
    assert_eq!(logs_of(NODE_A).len(), 5, "{:#?}", objects.keys());
    assert_eq!(logs_of(NODE_B).len(), 4, "{:#?}", objects.keys());
    assert!(c.terminate(Duration::from_secs(30)).success());
}

#[test]
fn a_briefly_broken_session_latest_link_does_not_finish_the_live_session() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    let s1 = ray.root.join(S1);
    write(&s1.join("logs/raylet.out"), &raylet_line(NODE_A));
    write(&s1.join("logs/app.log"), "one\n");
    ray.point_latest(S1);
    let store = local_bucket(&tmp.path().join("bucket"));
    // Rounds only at start, on a session change and at SIGTERM.
    let mut c = start(tmp.path(), &ray.root, "1h");
    let app = key(S1, NODE_A, "app.log");
    wait_for(&store, "the first snapshot", &c, |o| {
        o.get(&app).is_some_and(|v| v == b"one\n")
    });

    // Ray replaces the link: for a few seconds it names a folder that is not there.
    ray.point_latest("session_not_there_yet");
    std::thread::sleep(Duration::from_secs(4));
    ray.point_latest(S1);
    std::thread::sleep(Duration::from_secs(2));
    // The live session goes on writing; then a newer session starts.
    append_to(&s1.join("logs/app.log"), b"two\n");
    let s2 = ray.root.join(S2);
    write(&s2.join("logs/raylet.out"), &raylet_line(NODE_A));
    ray.point_latest(S2);
    wait_for(&store, "the new session's first round", &c, |o| {
        o.contains_key(&key(S2, NODE_A, "raylet.out"))
    });

    assert!(c.terminate(Duration::from_secs(30)).success());
    let objects = read_all(&store);
    assert_eq!(
        String::from_utf8_lossy(&objects[&app]),
        "one\ntwo\n",
        "the session was finished while it was live; log:\n{}",
        c.log_tail(40)
    );
}

/// Sets the modification time of `path` (a file or a directory) `ago` in the past.
fn backdate(path: &Path, ago: Duration) {
    std::fs::File::open(path)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - ago)
        .unwrap();
}

#[test]
fn a_busy_raylet_whose_id_line_rotated_away_files_logs_under_the_stored_id() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    let logs = ray.logs(S1);
    // Ray rotated the raylet's output more often than it keeps backups: no file has the id.
    for f in ["raylet.out.3", "raylet.out.2", "raylet.out.1", "raylet.out"] {
        write(
            &logs.join(f),
            "[2026-11-22 03:00:00,000 I 1 1] (raylet) busy\n",
        );
    }
    write(&ray.root.join("raylet_node_id"), &format!("{NODE_A}\n"));
    let out = "dashboard.log";
    write(&logs.join(out), "dashboard output\n");
    ray.point_latest(S1);
    // The raylet keeps writing: its output is never old.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let (stop, path) = (stop.clone(), logs.join("raylet.out"));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                append_to(&path, b"[..] (raylet) busy\n");
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray.root, "1s");
    wait_for(
        &store,
        "the node's logs under the stored node id",
        &c,
        |o| o.contains_key(&key(S1, NODE_A, out)),
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.join().unwrap();
    assert!(c.terminate(Duration::from_secs(30)).success());
    let objects = read_all(&store);
    assert!(
        !objects.keys().any(|k| k.contains("unknown-node")),
        "{:#?}",
        objects.keys()
    );
}

#[test]
fn an_earlier_session_whose_raylet_still_answers_is_not_finished() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    let (s1, s2) = (ray.root.join(S1), ray.root.join(S2));
    for s in [&s1, &s2] {
        write(&s.join("logs/raylet.out"), &raylet_line(NODE_A));
    }
    let app = s1.join("logs/app.log");
    write(&app, "epoch 1\n");
    // S1's raylet is alive (two raylets share the tmp dir) but its files are quiet.
    std::fs::create_dir_all(s1.join("sockets")).unwrap();
    let _raylet = std::os::unix::net::UnixListener::bind(s1.join("sockets/raylet")).unwrap();
    let quiet = Duration::from_secs(60);
    backdate(&app, quiet);
    backdate(&s1.join("logs/raylet.out"), quiet);
    backdate(&s1.join("logs"), quiet);
    ray.point_latest(S2);
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray.root, "1s");
    let app_key = key(S1, NODE_A, "app.log");
    wait_for(&store, "the earlier session's first upload", &c, |o| {
        o.contains_key(&app_key)
    });
    // A few rounds pass while it is quiet, then its raylet's worker writes again.
    std::thread::sleep(Duration::from_secs(3));
    append_to(&app, b"epoch 2\n");
    assert!(c.terminate(Duration::from_secs(30)).success());
    let objects = read_all(&store);
    assert_eq!(
        String::from_utf8_lossy(&objects[&app_key]),
        "epoch 1\nepoch 2\n",
        "the session of a live raylet was finished; log:\n{}",
        c.log_tail(40)
    );
}

#[test]
fn a_rotated_core_worker_log_is_filed_under_the_node_its_oldest_backup_names() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    let logs = ray.logs(S1);
    let w = "ab".repeat(28);
    write(&logs.join("raylet.out"), &raylet_line(NODE_A));
    let cw = format!("python-core-worker-{w}_555.log");
    write(&logs.join(format!("{cw}.1")), &core_worker_log(&w, NODE_A));
    write(
        &logs.join(&cw),
        "[..] core_worker.cc:1: later lines of A's worker\n",
    );
    let out = format!("worker-{w}-01000000-555.out");
    write(&logs.join(&out), "A's worker printed this\n");
    // Then the container restarted: B is the newest raylet.
    write(&logs.join("raylet.1.out"), &raylet_line(NODE_B));
    ray.point_latest(S1);
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray.root, "1s");
    let objects = wait_for(&store, "A's worker logs", &c, |o| {
        o.contains_key(&key(S1, NODE_A, &cw)) && o.contains_key(&key(S1, NODE_A, &out))
    });
    assert!(c.terminate(Duration::from_secs(30)).success());
    let under_b: Vec<_> = objects
        .keys()
        .filter(|k| k.starts_with(&format!("{P}/{S1}/{NODE_B}/")) && k.contains(&w))
        .collect();
    assert!(under_b.is_empty(), "{under_b:#?}");
}

#[test]
fn a_slowly_starting_worker_is_held_until_it_names_its_node() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    let logs = ray.logs(S1);
    let w = "ab".repeat(28);
    write(&logs.join("raylet.out"), &raylet_line(NODE_A));
    write(&logs.join("raylet.1.out"), &raylet_line(NODE_B));
    ray.point_latest(S1);
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray.root, "1s");
    wait_for(&store, "the first round", &c, |o| {
        o.contains_key(&key(S1, NODE_B, "raylet.1.out"))
    });
    // A worker of A is starting: its core worker log has no "Initializing worker" line yet.
    let cw = format!("python-core-worker-{w}_555.log");
    write(
        &logs.join(&cw),
        "[..] core_worker_process.cc:1: Constructing CoreWorkerProcess\n",
    );
    let out = format!("worker-{w}-01000000-555.out");
    write(&logs.join(&out), "step 1\n");
    std::thread::sleep(Duration::from_secs(3));
    append_to(&logs.join(&cw), core_worker_log(&w, NODE_A).as_bytes());
    append_to(&logs.join(&out), b"step 2\n");
    wait_for(&store, "A's worker logs", &c, |o| {
        o.get(&key(S1, NODE_A, &out))
            .is_some_and(|v| v == b"step 1\nstep 2\n")
            && o.contains_key(&key(S1, NODE_A, &cw))
    });
    assert!(c.terminate(Duration::from_secs(30)).success());
    let objects = read_all(&store);
    let under_b: Vec<_> = objects
        .keys()
        .filter(|k| k.starts_with(&format!("{P}/{S1}/{NODE_B}/")) && k.contains(&w))
        .collect();
    assert!(under_b.is_empty(), "{under_b:#?}");
}

/// The objects whose key ends in `/logs/<rel>`, under any node.
fn copies_of<'a>(
    objects: &'a BTreeMap<String, Vec<u8>>,
    rel: &str,
) -> Vec<(&'a String, &'a Vec<u8>)> {
    let tail = format!("/logs/{rel}");
    objects.iter().filter(|(k, _)| k.ends_with(&tail)).collect()
}

#[test]
fn the_heads_files_stay_under_the_first_raylets_node_when_a_raylet_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    let logs = ray.logs(S1);
    write(&logs.join("raylet.out"), &raylet_line(NODE_A));
    write(&logs.join("gcs_server.out"), "gcs line 1\n");
    write(&logs.join("monitor.log"), "mon 1\n");
    ray.point_latest(S1);
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray.root, "1s");
    wait_for(&store, "the head's files under A", &c, |o| {
        o.contains_key(&key(S1, NODE_A, "gcs_server.out"))
            && o.contains_key(&key(S1, NODE_A, "monitor.log"))
    });
    // A second raylet (node B) starts into the session; the head's files grow.
    write(&logs.join("raylet.1.out"), &raylet_line(NODE_B));
    append_to(&logs.join("gcs_server.out"), b"gcs line 2\n");
    append_to(&logs.join("monitor.log"), b"mon 2\n");
    wait_for(&store, "B's raylet and the grown files", &c, |o| {
        o.contains_key(&key(S1, NODE_B, "raylet.1.out"))
            && o.get(&key(S1, NODE_A, "gcs_server.out"))
                .is_some_and(|v| v == b"gcs line 1\ngcs line 2\n")
    });
    // A few more live rounds, a last line for the final flush.
    std::thread::sleep(Duration::from_secs(3));
    append_to(&logs.join("gcs_server.out"), b"gcs line 3\n");
    assert!(c.terminate(Duration::from_secs(30)).success());
    let objects = read_all(&store);
    for rel in ["gcs_server.out", "monitor.log"] {
        let copies = copies_of(&objects, rel);
        assert_eq!(
            copies.len(),
            1,
            "{rel}: one file, one object: {:#?}",
            copies.iter().map(|(k, v)| (k, v.len())).collect::<Vec<_>>()
        );
        assert_eq!(copies[0].0, &key(S1, NODE_A, rel), "{rel}");
        assert_eq!(
            copies[0].1,
            &std::fs::read(logs.join(rel)).unwrap(),
            "{rel} differs from the file"
        );
    }
}

#[test]
fn a_worker_output_without_a_core_worker_log_is_held_at_most_64_kib_or_30_s() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    let logs = ray.logs(S1);
    write(&logs.join("raylet.out"), &raylet_line(NODE_A));
    write(&logs.join("raylet.1.out"), &raylet_line(NODE_B));
    ray.point_latest(S1);
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray.root, "1s");
    wait_for(&store, "the first round", &c, |o| {
        o.contains_key(&key(S1, NODE_B, "raylet.1.out"))
    });
    // Workers with RAY_LOG_TO_STDERR=1: output, never a core worker log. One prints 5 KB/s
    // (64 KiB after about 13 s), one 100 B/s (never 64 KiB in this test: the 30 s bound).
    let (w_fast, w_slow) = ("ab".repeat(28), "cd".repeat(28));
    let fast = format!("worker-{w_fast}-01000000-300.out");
    let slow = format!("worker-{w_slow}-01000000-301.out");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, fast, slow) = (stop.clone(), logs.join(&fast), logs.join(&slow));
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                append_to(&fast, format!("{:0>499}\n", i).as_bytes());
                if i.is_multiple_of(5) {
                    append_to(&slow, format!("{:0>49}\n", i).as_bytes());
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // Stops and joins the writer when dropped: at the end, or when a wait below fails
    // (before the temp dir goes).
    struct Writer(
        Arc<std::sync::atomic::AtomicBool>,
        Option<std::thread::JoinHandle<()>>,
    );
    impl Drop for Writer {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(t) = self.1.take() {
                let _ = t.join();
            }
        }
    }
    let writer = Writer(stop, Some(writer));
    let began = Instant::now();
    let seen = |rel: &str| read_all(&store).contains_key(&key(S1, NODE_B, rel));
    // 64 KiB at 5 KB/s, then a round (1 s), with room for a slow machine.
    let deadline = Duration::from_secs(20);
    loop {
        if seen(&fast) {
            break;
        }
        assert!(
            began.elapsed() < deadline,
            "a worker output growing 5 KB/s was not uploaded past 64 KiB in {deadline:?}\n{}",
            c.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let fast_at = began.elapsed();
    // 30 s since first seen, then a round.
    let deadline = Duration::from_secs(38);
    loop {
        if seen(&slow) {
            break;
        }
        assert!(
            began.elapsed() < deadline,
            "a worker output growing 100 B/s was not uploaded within 30 s of first sight\n{}",
            c.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let slow_at = began.elapsed();
    eprintln!("uploaded after {fast_at:?} (5 KB/s) and {slow_at:?} (100 B/s)");
    drop(writer);
    assert!(c.terminate(Duration::from_secs(30)).success());
    let objects = read_all(&store);
    for rel in [&fast, &slow] {
        let copies = copies_of(&objects, rel);
        assert_eq!(copies.len(), 1, "{rel}: {:#?}", objects.keys());
        // The newest raylet's node: the best one known for a worker that never named it.
        assert_eq!(copies[0].0, &key(S1, NODE_B, rel));
        assert_eq!(copies[0].1, &std::fs::read(logs.join(rel)).unwrap());
    }
}

/// The owner is recorded: after a collector restart at which no file names the first raylet
/// any more (its id line rotated away), the head's files still go under it.
#[test]
fn the_sessions_owner_survives_a_collector_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    let logs = ray.logs(S1);
    write(&logs.join("raylet.out"), &raylet_line(NODE_A));
    write(&logs.join("gcs_server.out"), "gcs line 1\n");
    ray.point_latest(S1);
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray.root, "1s");
    wait_for(&store, "the head's file under A", &c, |o| {
        o.contains_key(&key(S1, NODE_A, "gcs_server.out"))
    });
    std::thread::sleep(Duration::from_millis(1500));
    c.kill9();
    // While the collector is down: A's raylet rotates its id line out of every file it
    // keeps, then a second raylet (B) starts into the session; the GCS writes on.
    for f in ["raylet.out.2", "raylet.out.1", "raylet.out"] {
        write(
            &logs.join(f),
            "[2026-11-22 03:00:00,000 I 1 1] (raylet) busy\n",
        );
    }
    write(&logs.join("raylet.1.out"), &raylet_line(NODE_B));
    append_to(&logs.join("gcs_server.out"), b"gcs line 2\n");
    c.restart();
    wait_for(&store, "B's raylet and the grown file", &c, |o| {
        o.contains_key(&key(S1, NODE_B, "raylet.1.out"))
            && o.get(&key(S1, NODE_A, "gcs_server.out"))
                .is_some_and(|v| v == b"gcs line 1\ngcs line 2\n")
    });
    assert!(c.terminate(Duration::from_secs(30)).success());
    let objects = read_all(&store);
    let copies = copies_of(&objects, "gcs_server.out");
    assert_eq!(copies.len(), 1, "{:#?}", objects.keys());
}

/// A worker's output filed under the newest raylet before its core worker log named another
/// node stays under the node its object has: when that log appears, and after a kill -9 in
/// the round that first uploaded it (issue 39, review defect D1).
#[test]
fn a_worker_output_filed_before_its_core_worker_log_keeps_its_node() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    let logs = ray.logs(S1);
    write(&logs.join("raylet.out"), &raylet_line(NODE_A));
    write(&logs.join("raylet.1.out"), &raylet_line(NODE_B));
    let w = "ab".repeat(28);
    let out = format!("worker-{w}-01000000-4242.out");
    write(&logs.join(&out), &format!("{}\n", "x".repeat(99)));
    ray.point_latest(S1);
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start_with(tmp.path(), &ray.root, "1s", &THROTTLE);
    wait_for(&store, "the first round", &c, |o| {
        o.contains_key(&key(S1, NODE_B, "raylet.1.out"))
    });
    // Past 64 KiB without a core worker log: filed under the newest raylet (B); a big file
    // keeps that round busy.
    busy_round(&logs);
    append_to(
        &logs.join(&out),
        format!("{}\n", "y".repeat(99)).repeat(700).as_bytes(),
    );
    wait_for(&store, "the output under B", &c, |o| {
        o.contains_key(&key(S1, NODE_B, &out))
    });
    std::thread::sleep(Duration::from_millis(300));
    c.kill9();
    // The worker's core worker log appears (a slow start), naming A; the output grows.
    write(
        &logs.join(format!("python-core-worker-{w}_4242.log")),
        &core_worker_log(&w, NODE_A),
    );
    append_to(&logs.join(&out), b"late line\n");
    end_busy_round(&logs);
    c.restart();
    wait_for(&store, "the late line", &c, |o| {
        o.keys()
            .any(|k| k.ends_with(&format!("/logs/{out}")) && o[k].ends_with(b"late line\n"))
    });
    append_to(&logs.join(&out), b"last line\n");
    std::thread::sleep(Duration::from_secs(2));
    assert!(c.terminate(Duration::from_secs(30)).success());
    let objects = read_all(&store);
    let copies = copies_of(&objects, &out);
    assert_eq!(
        copies.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        [key(S1, NODE_B, &out)],
        "one file, one object, under the node it was filed under"
    );
    assert_eq!(copies[0].1, &std::fs::read(logs.join(&out)).unwrap());
}

/// A rotated backup's key (named by its mtime at its first upload) is on disk as soon as
/// that upload ends: killed before the round ends, then written once more after the rename,
/// the backup still grows its one object (issue 39, review defect D2).
#[test]
fn a_backups_key_survives_a_kill_before_the_round_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    let logs = ray.logs(S1);
    write(&logs.join("raylet.out"), &raylet_line(NODE_A));
    write(&logs.join("dashboard.log"), "live\n");
    let backup = logs.join("dashboard.log.1");
    write(&backup, &"backup line\n".repeat(100));
    busy_round(&logs);
    ray.point_latest(S1);
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start_with(tmp.path(), &ray.root, "1s", &THROTTLE);
    let rotated = |o: &BTreeMap<String, Vec<u8>>| {
        o.keys()
            .filter(|k| k.contains("/logs/dashboard.log.rotated."))
            .cloned()
            .collect::<Vec<_>>()
    };
    wait_for(&store, "the backup", &c, |o| !rotated(o).is_empty());
    std::thread::sleep(Duration::from_millis(300));
    c.kill9();
    // A new mtime second, then a process still holding the old descriptor writes on.
    std::thread::sleep(Duration::from_millis(1100));
    append_to(&backup, b"written after the rename\n");
    end_busy_round(&logs);
    c.restart();
    wait_for(&store, "the grown backup", &c, |o| {
        rotated(o)
            .iter()
            .any(|k| o[k].ends_with(b"written after the rename\n"))
    });
    assert!(c.terminate(Duration::from_secs(30)).success());
    let objects = read_all(&store);
    let keys = rotated(&objects);
    assert_eq!(keys.len(), 1, "one backup, one object: {keys:#?}");
    assert_eq!(objects[&keys[0]], std::fs::read(&backup).unwrap());
}

/// The session's owner is on disk as soon as it is known, not at the end of the round: a
/// kill -9 before the round ends, and a restart at which the first raylet's id line has
/// rotated out, keep the head's files under it (issue 39, review defect D3).
#[test]
fn the_sessions_owner_survives_a_kill_before_the_round_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    let logs = ray.logs(S1);
    write(&logs.join("raylet.out"), &raylet_line(NODE_A));
    write(&logs.join("raylet.1.out"), &raylet_line(NODE_B));
    write(&logs.join("gcs_server.out"), "gcs started\n");
    busy_round(&logs);
    ray.point_latest(S1);
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start_with(tmp.path(), &ray.root, "1s", &THROTTLE);
    wait_for(&store, "the head's file under A", &c, |o| {
        o.contains_key(&key(S1, NODE_A, "gcs_server.out"))
    });
    std::thread::sleep(Duration::from_millis(300));
    c.kill9();
    write(
        &logs.join("raylet.out"),
        "busy raylet, id line rotated out\n",
    );
    append_to(&logs.join("gcs_server.out"), b"more\n");
    end_busy_round(&logs);
    c.restart();
    wait_for(&store, "the grown file", &c, |o| {
        o.keys()
            .any(|k| k.ends_with("/logs/gcs_server.out") && o[k] == b"gcs started\nmore\n")
    });
    assert!(c.terminate(Duration::from_secs(30)).success());
    let objects = read_all(&store);
    let copies = copies_of(&objects, "gcs_server.out");
    assert_eq!(
        copies.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        [key(S1, NODE_A, "gcs_server.out")]
    );
}
