//! Which node and which session a log is filed under, through the real binary on a Ray temp
//! root built by the test (`file://` bucket):
//!
//! - a raylet restarted into the same session (`raylet.1.out` beside `raylet.out`, Ray's own
//!   numbering) files the new logs under the new node, and each worker's logs under the node
//!   its core worker log names;
//! - a `session_latest` link that is missing for a few seconds (Ray removes it, then creates
//!   it again) does not finish the live session: what it writes afterwards still reaches the
//!   bucket when a newer session replaces it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::local::LocalFileSystem;
use object_store::ObjectStore;

use rhc_testkit::collector::{append_to, read_all, Collector};

const NODE_A: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
const NODE_B: &str = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";
const S1: &str = "session_2026-11-22_02-56-13_816177_24314";
const S2: &str = "session_2026-11-22_03-10-00_000001_30001";
const CLUSTER: &str = "node-identity";
const P: &str = "cluster-history/raycluster/default/node-identity";

fn setting(node: &str) -> String {
    format!(
        "[2026-11-22 02:56:15,477 I 1 1] (raylet) main.cc:711: Setting node ID node_id={node}\n"
    )
}

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

fn point_latest(ray: &Path, target: &Path) {
    let link = ray.join("session_latest");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(target, &link).unwrap();
}

fn bucket(dir: &Path) -> Arc<dyn ObjectStore> {
    std::fs::create_dir_all(dir).unwrap();
    Arc::new(LocalFileSystem::new_with_prefix(dir).unwrap())
}

fn key(session: &str, node: &str, rel: &str) -> String {
    format!("{P}/{session}/{node}/logs/{rel}")
}

/// Polls the bucket until `pred` holds (at most 20 s).
fn wait_for(
    store: &Arc<dyn ObjectStore>,
    what: &str,
    c: &Collector,
    pred: impl Fn(&BTreeMap<String, Vec<u8>>) -> bool,
) -> BTreeMap<String, Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let objects = read_all(store);
        if pred(&objects) {
            return objects;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; objects: {:#?}\n{}",
            objects.keys().collect::<Vec<_>>(),
            c.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn start(tmp: &Path, ray: &Path, interval: &str) -> Collector {
    let storage = format!("file://{}", tmp.join("bucket").display());
    Collector::start(
        &tmp.join("spool"),
        &[
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
        ],
        &[],
    )
}

#[test]
fn a_restarted_raylet_files_logs_under_its_own_node_and_workers_under_theirs() {
    let tmp = tempfile::tempdir().unwrap();
    let ray: PathBuf = tmp.path().join("ray");
    let logs = ray.join(S1).join("logs");
    let (w_a, w_b) = ("ab".repeat(28), "cd".repeat(28));
    // The first raylet (node A) and one of its workers.
    write(&logs.join("raylet.out"), &setting(NODE_A));
    write(
        &logs.join(format!("python-core-worker-{w_a}_111.log")),
        &core_worker_log(&w_a, NODE_A),
    );
    let out_a = format!("worker-{w_a}-01000000-111.out");
    write(&logs.join(&out_a), "from a worker of A\n");
    // Ray's container restarts with the emptyDir kept: the new raylet (node B) gets the next
    // free name, and starts a worker of its own.
    write(&logs.join("raylet.1.out"), &setting(NODE_B));
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
    point_latest(&ray, &ray.join(S1));

    let store = bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray, "1s");
    let expected = [
        key(S1, NODE_A, "raylet.out"),
        key(S1, NODE_A, &out_a),
        key(S1, NODE_A, &format!("python-core-worker-{w_a}_111.log")),
        key(S1, NODE_B, "raylet.1.out"),
        key(S1, NODE_B, &out_b),
        key(S1, NODE_B, &format!("python-core-worker-{w_b}_222.log")),
        key(S1, NODE_A, "dashboard_agent.log"),
        key(S1, NODE_B, "dashboard_agent.1.log"),
        // Nothing names its writer: the newest raylet's node.
        key(S1, NODE_B, "gcs_server.out"),
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
    assert_eq!(logs_of(NODE_A).len(), 4, "{:#?}", objects.keys());
    assert_eq!(logs_of(NODE_B).len(), 5, "{:#?}", objects.keys());
    assert!(c.terminate(Duration::from_secs(30)).success());
}

#[test]
fn a_briefly_broken_session_latest_link_does_not_finish_the_live_session() {
    let tmp = tempfile::tempdir().unwrap();
    let ray: PathBuf = tmp.path().join("ray");
    let s1 = ray.join(S1);
    write(&s1.join("logs/raylet.out"), &setting(NODE_A));
    write(&s1.join("logs/app.log"), "one\n");
    point_latest(&ray, &s1);
    let store = bucket(&tmp.path().join("bucket"));
    // Rounds only at start, on a session change and at SIGTERM.
    let mut c = start(tmp.path(), &ray, "1h");
    let app = key(S1, NODE_A, "app.log");
    wait_for(&store, "the first snapshot", &c, |o| {
        o.get(&app).is_some_and(|v| v == b"one\n")
    });

    // Ray replaces the link: for a few seconds it names a folder that is not there.
    point_latest(&ray, &ray.join("session_not_there_yet"));
    std::thread::sleep(Duration::from_secs(4));
    point_latest(&ray, &s1);
    std::thread::sleep(Duration::from_secs(2));
    // The live session goes on writing; then a newer session starts.
    append_to(&s1.join("logs/app.log"), b"two\n");
    let s2 = ray.join(S2);
    write(&s2.join("logs/raylet.out"), &setting(NODE_A));
    point_latest(&ray, &s2);
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
    let ray: PathBuf = tmp.path().join("ray");
    let logs = ray.join(S1).join("logs");
    // Ray rotated the raylet's output more often than it keeps backups: no file has the id.
    for f in ["raylet.out.3", "raylet.out.2", "raylet.out.1", "raylet.out"] {
        write(
            &logs.join(f),
            "[2026-11-22 03:00:00,000 I 1 1] (raylet) busy\n",
        );
    }
    write(&ray.join("raylet_node_id"), &format!("{NODE_A}\n"));
    let out = "dashboard.log";
    write(&logs.join(out), "dashboard output\n");
    point_latest(&ray, &ray.join(S1));
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
    let store = bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray, "1s");
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
    let ray: PathBuf = tmp.path().join("ray");
    let (s1, s2) = (ray.join(S1), ray.join(S2));
    for s in [&s1, &s2] {
        write(&s.join("logs/raylet.out"), &setting(NODE_A));
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
    point_latest(&ray, &s2);
    let store = bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray, "1s");
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
    let ray: PathBuf = tmp.path().join("ray");
    let logs = ray.join(S1).join("logs");
    let w = "ab".repeat(28);
    write(&logs.join("raylet.out"), &setting(NODE_A));
    let cw = format!("python-core-worker-{w}_555.log");
    write(&logs.join(format!("{cw}.1")), &core_worker_log(&w, NODE_A));
    write(
        &logs.join(&cw),
        "[..] core_worker.cc:1: later lines of A's worker\n",
    );
    let out = format!("worker-{w}-01000000-555.out");
    write(&logs.join(&out), "A's worker printed this\n");
    // Then the container restarted: B is the newest raylet.
    write(&logs.join("raylet.1.out"), &setting(NODE_B));
    point_latest(&ray, &ray.join(S1));
    let store = bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray, "1s");
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
    let ray: PathBuf = tmp.path().join("ray");
    let logs = ray.join(S1).join("logs");
    let w = "ab".repeat(28);
    write(&logs.join("raylet.out"), &setting(NODE_A));
    write(&logs.join("raylet.1.out"), &setting(NODE_B));
    point_latest(&ray, &ray.join(S1));
    let store = bucket(&tmp.path().join("bucket"));
    let mut c = start(tmp.path(), &ray, "1s");
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
