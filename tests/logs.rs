//! Log shipping through the real binary: a session tree built by the test, appended to,
//! rotated, replaced by a new session, against local storage and S3 (moto).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::local::LocalFileSystem;
use object_store::ObjectStore;

use rhc_testkit::collector::{append_to, files_under, read_all, Collector};
use rhc_testkit::services::MotoS3;

const NODE_A: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
const NODE_B: &str = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";
const S1: &str = "session_2026-11-22_02-56-13_816177_24314";
const S2: &str = "session_2026-11-22_03-10-00_000001_30001";
const P: &str = "cluster-history/raycluster/default/logs-test";

/// A Ray temp root with sessions, as Ray lays it out.
struct RayTmp {
    root: PathBuf,
}

impl RayTmp {
    fn new(root: &Path) -> RayTmp {
        std::fs::create_dir_all(root).unwrap();
        RayTmp {
            root: root.to_path_buf(),
        }
    }

    fn logs(&self, session: &str) -> PathBuf {
        self.root.join(session).join("logs")
    }

    /// Creates a session whose raylet names `node`, and points session_latest at it.
    fn start_session(&self, session: &str, node: &str) {
        let logs = self.logs(session);
        std::fs::create_dir_all(logs.join("events")).unwrap();
        std::fs::write(
            logs.join("raylet.out"),
            format!("[2026-11-22 02:56:15,477 I 1 1] (raylet) main.cc:711: Setting node ID node_id={node}\n"),
        )
        .unwrap();
        std::fs::write(logs.join("gcs_server.out"), "gcs started\n").unwrap();
        std::fs::write(logs.join("events/event_GCS.log"), "{\"event_id\":\"1\"}\n").unwrap();
        let link = self.root.join("session_latest");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(self.root.join(session), &link).unwrap();
    }

    fn append(&self, session: &str, rel: &str, text: &str) {
        append_to(&self.logs(session).join(rel), text.as_bytes());
    }

    /// Ray's rotation: name.(N-1) → name.N …, name → name.1, then a fresh name.
    fn rotate(&self, session: &str, rel: &str, backups: u32) {
        let logs = self.logs(session);
        for n in (1..backups).rev() {
            let from = logs.join(format!("{rel}.{n}"));
            if from.exists() {
                std::fs::rename(&from, logs.join(format!("{rel}.{}", n + 1))).unwrap();
            }
        }
        std::fs::rename(logs.join(rel), logs.join(format!("{rel}.1"))).unwrap();
        std::fs::write(logs.join(rel), "").unwrap();
    }
}

fn local(dir: &Path) -> Arc<dyn ObjectStore> {
    std::fs::create_dir_all(dir).unwrap();
    Arc::new(LocalFileSystem::new_with_prefix(dir).unwrap())
}

/// Polls the bucket until `pred` holds (bounded).
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
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn key(session: &str, node: &str, rel: &str) -> String {
    format!("{P}/{session}/{node}/logs/{rel}")
}

fn has(objects: &BTreeMap<String, Vec<u8>>, k: &str, content: &[u8]) -> bool {
    objects.get(k).is_some_and(|v| v == content)
}

#[test]
fn live_snapshots_rotation_and_a_new_session() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayTmp::new(&tmp.path().join("ray"));
    ray.start_session(S1, NODE_A);
    ray.append(S1, "worker-aa-01000000-1.out", "hello from the worker\n");
    // Odd entries: a symlink out of the tree, a socket, a name that is not a safe segment.
    std::os::unix::fs::symlink("/etc/passwd", ray.logs(S1).join("escape.log")).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(ray.logs(S1).join("sock")).unwrap();
    std::fs::write(ray.logs(S1).join("bad name.log"), "x").unwrap();
    let bucket = tmp.path().join("bucket");
    let store = local(&bucket);
    let mut c = Collector::start(
        &tmp.path().join("spool"),
        &[
            "--storage",
            bucket.to_str().unwrap(),
            "--cluster-name",
            "logs-test",
            "--ray-tmp-dir",
            ray.root.to_str().unwrap(),
            "--log-upload-interval",
            "1s",
        ],
        &[],
    );
    // First snapshot, while the collector runs.
    let raylet = std::fs::read(ray.logs(S1).join("raylet.out")).unwrap();
    wait_for(&store, "the first snapshot", &c, |o| {
        has(o, &key(S1, NODE_A, "raylet.out"), &raylet)
            && has(
                o,
                &key(S1, NODE_A, "worker-aa-01000000-1.out"),
                b"hello from the worker\n",
            )
            && has(
                o,
                &key(S1, NODE_A, "events/event_GCS.log"),
                b"{\"event_id\":\"1\"}\n",
            )
            && o.contains_key(&format!(
                "cluster-metadata/raycluster/default_logs-test/{S1}"
            ))
    });
    // Appends show up in the next snapshot.
    ray.append(S1, "worker-aa-01000000-1.out", "more\n");
    wait_for(&store, "the appended worker log", &c, |o| {
        has(
            o,
            &key(S1, NODE_A, "worker-aa-01000000-1.out"),
            b"hello from the worker\nmore\n",
        )
    });
    // Rotation: the backup is kept under a stable name, the live file keeps its base name.
    ray.append(S1, "raylet.out", "line before rotation 1\n");
    let first_backup = std::fs::read(ray.logs(S1).join("raylet.out")).unwrap();
    ray.rotate(S1, "raylet.out", 3);
    ray.append(S1, "raylet.out", "after rotation 1\n");
    let o = wait_for(&store, "the first rotated backup", &c, |o| {
        o.iter()
            .any(|(k, v)| k.contains("/raylet.out.rotated.") && *v == first_backup)
            && has(o, &key(S1, NODE_A, "raylet.out"), b"after rotation 1\n")
    });
    let rotated: Vec<&String> = o.keys().filter(|k| k.contains(".rotated.")).collect();
    assert_eq!(rotated.len(), 1, "{rotated:?}");
    ray.rotate(S1, "raylet.out", 3);
    ray.append(S1, "raylet.out", "after rotation 2\n");
    let o = wait_for(&store, "the second rotated backup", &c, |o| {
        o.keys()
            .filter(|k| k.contains("/raylet.out.rotated."))
            .count()
            == 2
            && has(o, &key(S1, NODE_A, "raylet.out"), b"after rotation 2\n")
    });
    // The first backup, now raylet.out.2, was not uploaded again under another name.
    assert_eq!(o.keys().filter(|k| k.contains(".rotated.")).count(), 2);
    // A file deleted mid-run: no crash, its last snapshot stays.
    std::fs::remove_file(ray.logs(S1).join("gcs_server.out")).unwrap();
    // A new session (Ray restarted on this node, with a new node id).
    ray.start_session(S2, NODE_B);
    ray.append(S1, "worker-aa-01000000-1.out", "last words of session 1\n");
    let o = wait_for(
        &store,
        "the new session and the rest of the old one",
        &c,
        |o| {
            has(
                o,
                &key(S2, NODE_B, "raylet.out"),
                &std::fs::read(ray.logs(S2).join("raylet.out")).unwrap(),
            ) && has(
                o,
                &key(S1, NODE_A, "worker-aa-01000000-1.out"),
                b"hello from the worker\nmore\nlast words of session 1\n",
            ) && o.contains_key(&format!(
                "cluster-metadata/raycluster/default_logs-test/{S2}"
            ))
        },
    );
    assert!(o.contains_key(&key(S1, NODE_A, "gcs_server.out")));
    for k in o.keys() {
        assert!(
            !k.contains("escape") && !k.contains("sock") && !k.contains("bad"),
            "{k}"
        );
        assert!(
            k.starts_with(P) || k.starts_with("cluster-metadata/"),
            "{k}"
        );
    }
    assert!(c.metric("rhc_log_files_skipped_total") >= 3.0);
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
}

#[test]
fn final_flush_uploads_everything_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayTmp::new(&tmp.path().join("ray"));
    ray.start_session(S1, NODE_A);
    // An earlier session left on disk (a Ray container restart): uploaded once, completely.
    ray.start_session(S2, NODE_B);
    ray.append(S1, "worker-old-01000000-7.err", "old traceback\n");
    let link = ray.root.join("session_latest");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(ray.root.join(S2), &link).unwrap();
    let bucket = tmp.path().join("bucket");
    let store = local(&bucket);
    let mut c = Collector::start(
        &tmp.path().join("spool"),
        &[
            "--storage",
            bucket.to_str().unwrap(),
            "--cluster-name",
            "logs-test",
            "--ray-tmp-dir",
            ray.root.to_str().unwrap(),
            "--log-upload-interval",
            "1h",
        ],
        &[],
    );
    wait_for(&store, "the first pass", &c, |o| {
        o.contains_key(&key(S2, NODE_B, "raylet.out"))
    });
    // Written after the last snapshot: only the final flush can save these.
    ray.append(S2, "raylet.out", "shutting down\n");
    ray.append(S2, "debug_state.txt", "state\n");
    let big: String = (0..200_000).map(|i| format!("worker line {i}\n")).collect();
    ray.append(S2, "worker-bb-02000000-9.out", &big);
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
    let objects = read_all(&store);
    for (session, node) in [(S1, NODE_A), (S2, NODE_B)] {
        let logs = ray.logs(session);
        let mut n = 0;
        for entry in files_under(&logs) {
            let rel = entry
                .strip_prefix(&logs)
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            let k = key(session, node, &rel);
            let want = std::fs::read(&entry).unwrap();
            assert_eq!(
                objects.get(&k),
                Some(&want),
                "{k} differs from {}",
                entry.display()
            );
            n += 1;
        }
        assert!(n >= 4, "{session}: {n} files");
    }
    let ledger = std::fs::read_to_string(tmp.path().join("spool/log-ledger.json")).unwrap();
    assert!(
        ledger.contains(S1),
        "earlier session not recorded as finished: {ledger}"
    );
}

#[test]
fn kill_9_then_restart_uploads_only_what_changed() {
    let Some(s3) = MotoS3::start() else {
        return;
    };
    s3.create_bucket("logs");
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayTmp::new(&tmp.path().join("ray"));
    ray.start_session(S1, NODE_A);
    for i in 0..5 {
        ray.append(S1, &format!("worker-{i}-01000000-{i}.out"), "x\n");
    }
    let store = s3.store("logs");
    let env = s3.collector_env();
    let args = [
        "--storage",
        "s3://logs",
        "--cluster-name",
        "logs-test",
        "--ray-tmp-dir",
        ray.root.to_str().unwrap(),
        "--log-upload-interval",
        "1s",
    ];
    let mut c = Collector::start(&tmp.path().join("spool"), &args, &env);
    let files = 5 + 3; // workers, raylet.out, gcs_server.out, events/event_GCS.log
    wait_for(&store, "all files", &c, |o| {
        o.keys().filter(|k| k.contains("/logs/")).count() == files
    });
    // Let the ledger reach disk (it is saved after every pass).
    std::thread::sleep(Duration::from_millis(1500));
    c.kill9();
    ray.append(
        S1,
        "worker-3-01000000-3.out",
        "changed while the collector was down\n",
    );
    c.restart();
    wait_for(&store, "the changed file", &c, |o| {
        has(
            o,
            &key(S1, NODE_A, "worker-3-01000000-3.out"),
            b"x\nchanged while the collector was down\n",
        )
    });
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        c.metric("rhc_log_files_uploaded_total"),
        1.0,
        "unchanged files uploaded again after the restart:\n{}",
        c.log_text()
    );
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
}

#[test]
fn rotated_backups_with_the_same_mtime_are_all_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayTmp::new(&tmp.path().join("ray"));
    ray.start_session(S1, NODE_A);
    // Ray rotated three times within one timestamp tick (or a copy kept one mtime for all).
    let same = std::time::SystemTime::now() - Duration::from_secs(60);
    let mut backups = Vec::new();
    for k in 1..=3 {
        let path = ray.logs(S1).join(format!("gcs_server.out.{k}"));
        let content = format!("backup {k} content\n");
        std::fs::write(&path, &content).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(same)
            .unwrap();
        backups.push(content.into_bytes());
    }
    let bucket = tmp.path().join("bucket");
    let store = local(&bucket);
    let mut c = Collector::start(
        &tmp.path().join("spool"),
        &[
            "--storage",
            bucket.to_str().unwrap(),
            "--cluster-name",
            "logs-test",
            "--ray-tmp-dir",
            ray.root.to_str().unwrap(),
            "--log-upload-interval",
            "1s",
        ],
        &[],
    );
    let rotated = |o: &BTreeMap<String, Vec<u8>>| -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = o
            .iter()
            .filter(|(k, _)| k.contains("/gcs_server.out.rotated."))
            .map(|(_, v)| v.clone())
            .collect();
        v.sort();
        v
    };
    wait_for(&store, "every backup", &c, |o| rotated(o) == backups);
    assert!(c.terminate(Duration::from_secs(30)).success());
    // Stable across rounds and the final flush: still one object per backup.
    assert_eq!(rotated(&read_all(&store)), backups);
}
