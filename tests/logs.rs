//! Log shipping through the real binary: a session tree built by the test, appended to,
//! rotated, replaced by a new session, against local storage and S3 (moto).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use rhc_testkit::collector::{collector_bin, files_under, read_all, Collector};
use rhc_testkit::ray_logs::{local_bucket, local_object, wait_for_objects as wait_for, RayRoot};
use rhc_testkit::serve::Serve;
use rhc_testkit::services::{percent_encode, MotoS3};

const NODE_A: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
const NODE_B: &str = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";
const S1: &str = "session_2026-11-22_02-56-13_816177_24314";
const S2: &str = "session_2026-11-22_03-10-00_000001_30001";
const P: &str = "cluster-history/raycluster/default/logs-test";

/// Creates a session whose raylet names `node`, with a GCS log and a GCS event file, and
/// points session_latest at it.
fn start_session(ray: &RayRoot, session: &str, node: &str) {
    let logs = ray.session(session, node, false);
    std::fs::create_dir_all(logs.join("events")).unwrap();
    std::fs::write(logs.join("gcs_server.out"), "gcs started\n").unwrap();
    std::fs::write(logs.join("events/event_GCS.log"), "{\"event_id\":\"1\"}\n").unwrap();
    ray.point_latest(session);
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
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    ray.append(S1, "worker-aa-01000000-1.out", "hello from the worker\n");
    // Odd entries: a symlink out of the tree, a socket, a name no key can hold.
    std::os::unix::fs::symlink("/etc/passwd", ray.logs(S1).join("escape.log")).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(ray.logs(S1).join("sock")).unwrap();
    std::fs::write(ray.logs(S1).join("bad\u{7}name.log"), "x").unwrap();
    let bucket = tmp.path().join("bucket");
    let store = local_bucket(&bucket);
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
    start_session(&ray, S2, NODE_B);
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

fn start_local(tmp: &Path, ray: &RayRoot) -> Collector {
    let bucket = tmp.join("bucket");
    Collector::start(
        &tmp.join("spool"),
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
    )
}

fn backups_of<'a>(o: &'a BTreeMap<String, Vec<u8>>, live: &str) -> Vec<(&'a String, &'a Vec<u8>)> {
    let marker = format!("/logs/{live}.rotated.");
    o.iter().filter(|(k, _)| k.contains(&marker)).collect()
}

/// Python's `RotatingFileHandler` rotates by renaming the file and opening a new one; a
/// process that still holds the old descriptor writes once more into the backup after its
/// rename (and after the collector captured it). One backup, one object: the late line grows
/// it instead of making a second object under another name.
#[test]
fn a_backup_written_once_more_after_its_rename_is_one_object() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    let logs = ray.logs(S1);
    let line = "2026-11-22 02:56:15,477 INFO dashboard.py:1 -- a line of the dashboard's log\n";
    ray.append(S1, "dashboard.log", &line.repeat(12));
    let mut old_fd = std::fs::OpenOptions::new()
        .append(true)
        .open(logs.join("dashboard.log"))
        .unwrap();
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start_local(tmp.path(), &ray);
    wait_for(&store, "the live dashboard.log", &c, |o| {
        o.contains_key(&key(S1, NODE_A, "dashboard.log"))
    });
    // Rotated Python-style: rename, then a new file under the live name.
    std::fs::rename(logs.join("dashboard.log"), logs.join("dashboard.log.1")).unwrap();
    ray.append(S1, "dashboard.log", line);
    let renamed = Instant::now();
    wait_for(&store, "the backup's capture", &c, |o| {
        !backups_of(o, "dashboard.log").is_empty()
    });
    // 3 s after the rename, the old descriptor writes one more line into the backup.
    std::thread::sleep(Duration::from_secs(3).saturating_sub(renamed.elapsed()));
    old_fd
        .write_all(b"2026-11-22 02:56:18,000 INFO dashboard.py:2 -- one more\n")
        .unwrap();
    drop(old_fd);
    std::thread::sleep(Duration::from_secs(3));
    assert!(c.terminate(Duration::from_secs(30)).success());
    let objects = read_all(&store);
    let backups = backups_of(&objects, "dashboard.log");
    assert_eq!(
        backups.len(),
        1,
        "one backup, several objects: {:#?}",
        backups
            .iter()
            .map(|(k, v)| (k, v.len()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        backups[0].1,
        &std::fs::read(logs.join("dashboard.log.1")).unwrap(),
        "the backup's object differs from the file"
    );
}

/// The file issue 39's review (D4) truncated and rewrote in place: the same inode, another
/// head, the same bytes in the 64 KiB before the end of what was uploaded (a repeated line),
/// then longer. Only a hash of the window before that end was compared, so the new bytes were
/// appended after the old file's head.
fn rewrite_with_another_head(path: &Path, body: &str) {
    use std::io::{Seek, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(0).unwrap();
    f.seek(std::io::SeekFrom::Start(0)).unwrap();
    f.write_all(format!("HEAD-TWO\n{body}tail\n").as_bytes())
        .unwrap();
}

/// A backup truncated and rewritten with another head is another file: a new object (a new
/// key named by its mtime, as for any backup), the old object kept as it was, never the new
/// bytes appended to the old head.
#[test]
fn a_backup_rewritten_with_another_head_is_a_new_object() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    let logs = ray.logs(S1);
    ray.append(S1, "dashboard.log", "live\n");
    let body = "2026-11-22 INFO heartbeat ok\n".repeat(8000);
    let first = format!("HEAD-ONE\n{body}");
    std::fs::write(logs.join("dashboard.log.1"), &first).unwrap();
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start_local(tmp.path(), &ray);
    wait_for(&store, "the backup's first upload", &c, |o| {
        backups_of(o, "dashboard.log")
            .iter()
            .any(|(_, v)| v.as_slice() == first.as_bytes())
    });
    std::thread::sleep(Duration::from_millis(1500));
    rewrite_with_another_head(&logs.join("dashboard.log.1"), &body);
    let now = std::fs::read(logs.join("dashboard.log.1")).unwrap();
    wait_for(&store, "the rewritten backup", &c, |o| {
        backups_of(o, "dashboard.log")
            .iter()
            .any(|(_, v)| **v == now)
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(c.terminate(Duration::from_secs(30)).success());
    let objects = read_all(&store);
    let mut backups: Vec<&[u8]> = backups_of(&objects, "dashboard.log")
        .into_iter()
        .map(|(_, v)| v.as_slice())
        .collect();
    backups.sort();
    let mut want = vec![first.as_bytes(), now.as_slice()];
    want.sort();
    assert!(
        backups == want,
        "want the old backup and the rewritten one, each as its file was; got {:?}",
        backups
            .iter()
            .map(|v| (
                v.len(),
                String::from_utf8_lossy(&v[..9.min(v.len())]).into_owned()
            ))
            .collect::<Vec<_>>()
    );
}

/// A live file truncated and rewritten with another head is uploaded whole (its object
/// restarted from byte 0, as for any truncated file), never appended to the old head.
#[test]
fn a_live_file_rewritten_with_another_head_is_uploaded_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    let logs = ray.logs(S1);
    let body = "2026-11-22 INFO heartbeat ok\n".repeat(8000);
    let first = format!("HEAD-ONE\n{body}");
    std::fs::write(logs.join("dashboard.log"), &first).unwrap();
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start_local(tmp.path(), &ray);
    let k = key(S1, NODE_A, "dashboard.log");
    wait_for(&store, "the first upload", &c, |o| {
        has(o, &k, first.as_bytes())
    });
    std::thread::sleep(Duration::from_millis(1500));
    rewrite_with_another_head(&logs.join("dashboard.log"), &body);
    std::thread::sleep(Duration::from_secs(4));
    assert!(c.terminate(Duration::from_secs(30)).success());
    let now = std::fs::read(logs.join("dashboard.log")).unwrap();
    let objects = read_all(&store);
    let got = objects.get(&k).cloned().unwrap_or_default();
    assert!(
        got == now,
        "the object is not the file: {} bytes beginning {:?}, the file {} bytes beginning {:?}",
        got.len(),
        String::from_utf8_lossy(&got[..9.min(got.len())]),
        now.len(),
        String::from_utf8_lossy(&now[..9])
    );
}

/// Issue 42's review, defect 3: SIGTERM came while a big log's whole upload ran beside the
/// lane, slowed by the lane's cap and most of the way done; the final flush cancelled it and
/// started it again from zero, which the shutdown budget could not hold (exit 3, the log
/// left behind). The upload must go on and finish, and what the file grew since it began
/// must follow: the object equals the file at the end.
#[test]
fn a_whole_upload_beside_the_lane_at_sigterm_finishes_and_the_object_equals_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    let rel = "worker-0101-01000000-77.out";
    let line = "2026-11-22 02:56:15,477 INFO a line of a worker that writes a lot of output\n";
    // 8 MB: about 7 s at the 1 MB/s cap (after its one second of burst).
    ray.append(S1, rel, &line.repeat(8_000_000 / line.len()));
    let store = local_bucket(&tmp.path().join("bucket"));
    let bucket = tmp.path().join("bucket");
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
            "--log-upload-max-bytes-per-second",
            "1000000",
            "--shutdown-timeout",
            "10s",
        ],
        &[],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c
        .log_text()
        .contains("log upload still running after its slot; the lane goes on beside it")
    {
        assert!(
            Instant::now() < deadline,
            "the big log's upload never went beside the lane\n{}",
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Most of the way through (3 of its 7 s), Ray writes more, then SIGTERM: restarted from
    // zero it would need about 11 s more at the cap, finished about 4.
    std::thread::sleep(Duration::from_secs(3));
    ray.append(S1, rel, &line.repeat(500));
    let k = key(S1, NODE_A, rel);
    assert!(
        !read_all(&store).contains_key(&k),
        "the upload finished before SIGTERM: the test shows nothing"
    );
    let t0 = Instant::now();
    let status = c.terminate(Duration::from_secs(30));
    let took = t0.elapsed();
    let file = std::fs::read(ray.logs(S1).join(rel)).unwrap();
    let objects = read_all(&store);
    let got = objects.get(&k).map_or(0, Vec::len);
    assert!(
        objects.get(&k) == Some(&file),
        "the object has {got} bytes, the file {} (exit {status:?} after {took:?})\n{}",
        file.len(),
        c.log_text()
    );
    assert!(status.success(), "exit {status:?}\n{}", c.log_text());
}

/// Review r42c, D1: a file truncated and rewritten in place (same inode, another head,
/// longer) while its whole upload waited for the cap. The ledger's head and window hashes
/// were taken from the file after the upload, i.e. from the new content, so the next round
/// appended the new file's tail to the object holding the old bytes. The hashes are of the
/// bytes as they were read for the upload now: the next round sees another head and sends
/// the file whole.
#[test]
fn a_file_rewritten_in_place_during_its_upload_ends_equal_to_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    let rel = "app.log";
    let old: String = (0..25_000)
        .map(|i| format!("OLD line {i:07} aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n"))
        .collect();
    ray.append(S1, rel, &old);
    let store = local_bucket(&tmp.path().join("bucket"));
    let bucket = tmp.path().join("bucket");
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
            "2s",
            "--log-upload-max-bytes-per-second",
            "200000",
            "--shutdown-timeout",
            "20s",
        ],
        &[],
    );
    // 1.5 MB at 200 kB/s: the upload waits for the cap about 7 s; 4 s in, the rewrite.
    std::thread::sleep(Duration::from_secs(4));
    let k = key(S1, NODE_A, rel);
    assert!(
        !read_all(&store).contains_key(&k),
        "the upload finished before the rewrite: the test shows nothing"
    );
    {
        use std::io::{Seek, Write};
        let path = ray.logs(S1).join(rel);
        let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.set_len(0).unwrap();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        let new: String = (0..33_000)
            .map(|i| format!("NEW line {i:07} bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\n"))
            .collect();
        f.write_all(new.as_bytes()).unwrap();
    }
    let file = std::fs::read(ray.logs(S1).join(rel)).unwrap();
    // The upload ends and the next live round looks at the file; SIGTERM after it (the
    // final flush sends whatever is left: 2 MB at the cap is about 10 s of the 20).
    std::thread::sleep(Duration::from_secs(8));
    let status = c.terminate(Duration::from_secs(40));
    let object = read_all(&store).get(&k).cloned().unwrap_or_default();
    assert!(
        object == file,
        "the object has {} bytes ({} OLD lines), the file {} (exit {status:?})\n{}",
        object.len(),
        object
            .split(|b| *b == b'\n')
            .filter(|l| l.starts_with(b"OLD"))
            .count(),
        file.len(),
        c.log_text()
    );
    assert!(status.success(), "exit {status:?}\n{}", c.log_text());
}

/// Review r42c, D2: under a cap, a big upload booked its whole part (40 s of a 100 kB/s
/// cap) before sending it, and the final flush's small, most valuable files (raylet.out's
/// new line, gcs_server.out) waited behind that booking past the deadline. The cap is booked
/// in short slices now: they go in between and land, while the big file is named (exit 3).
#[test]
fn a_big_upload_under_a_cap_does_not_starve_the_final_flush() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    let line = "2026-11-22 02:56:15,477 INFO a line of a worker that writes a lot of output\n";
    // 4 MB: 40 s at the 100 kB/s cap, longer than the 15 s shutdown budget.
    ray.append(S1, "worker-big.log", &line.repeat(4_000_000 / line.len()));
    let store = local_bucket(&tmp.path().join("bucket"));
    let bucket = tmp.path().join("bucket");
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
            "2s",
            "--log-upload-max-bytes-per-second",
            "100000",
            "--shutdown-timeout",
            "15s",
        ],
        &[],
    );
    std::thread::sleep(Duration::from_secs(5));
    ray.append(
        S1,
        "raylet.out",
        "a raylet line written just before SIGTERM\n",
    );
    ray.append(S1, "gcs_server.out", "gcs line\n");
    std::thread::sleep(Duration::from_secs(2));
    let status = c.terminate(Duration::from_secs(30));
    let objects = read_all(&store);
    for rel in ["raylet.out", "gcs_server.out"] {
        let file = std::fs::read(ray.logs(S1).join(rel)).unwrap();
        assert!(
            objects.get(&key(S1, NODE_A, rel)) == Some(&file),
            "{rel}: object {:?} bytes, file {} (exit {status:?})\n{}",
            objects.get(&key(S1, NODE_A, rel)).map(Vec::len),
            file.len(),
            c.log_text()
        );
    }
    // The big file cannot make it in the budget: named, exit 3.
    assert_eq!(status.code(), Some(3), "{}", c.log_text());
}

/// Review r42c, D4: Ray rotated a log while the final flush waited for its whole upload
/// beside the lane; the flush went on with the file list from before the wait, so the
/// rotated backup's tail and the new live file were never sent, with exit 0 and nothing
/// named. After the wait the session's logs are listed again: the backup's object equals
/// the backup and the live object the new file.
#[test]
fn a_rotation_while_the_final_flush_waits_for_an_upload_beside_it_is_sent() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    let rel = "monitor.log";
    let line = "2026-11-22 02:56:15,477 INFO monitor.py:123 -- a line of the autoscaler monitor\n";
    // 8 MB: about 7 s at the 1 MB/s cap (after its one second of burst).
    ray.append(S1, rel, &line.repeat(8_000_000 / line.len()));
    let live = ray.logs(S1).join(rel);
    let mut old = std::fs::OpenOptions::new()
        .append(true)
        .open(&live)
        .unwrap();
    let store = local_bucket(&tmp.path().join("bucket"));
    let bucket = tmp.path().join("bucket");
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
            "--log-upload-max-bytes-per-second",
            "1000000",
            "--shutdown-timeout",
            "25s",
        ],
        &[],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c
        .log_text()
        .contains("log upload still running after its slot; the lane goes on beside it")
    {
        assert!(
            Instant::now() < deadline,
            "the big log's upload never went beside the lane\n{}",
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    c.signal_term();
    std::thread::sleep(Duration::from_secs(1));
    let k = key(S1, NODE_A, rel);
    assert!(
        !read_all(&store).contains_key(&k),
        "the upload finished before the rotation: the test shows nothing"
    );
    // Ray-style rotation during the flush's wait: rename, one more line through the old
    // descriptor, a new live file.
    let backup = ray.logs(S1).join("monitor.log.1");
    std::fs::rename(&live, &backup).unwrap();
    old.write_all(b"old descriptor after rename\n").unwrap();
    drop(old);
    std::fs::write(&live, "new monitor line\n".repeat(100)).unwrap();
    let status = c.wait_exit(Duration::from_secs(40)).unwrap();
    let objects = read_all(&store);
    let backup_bytes = std::fs::read(&backup).unwrap();
    let live_bytes = std::fs::read(&live).unwrap();
    let backups = backups_of(&objects, rel);
    assert!(
        backups.len() == 1 && *backups[0].1 == backup_bytes,
        "backup objects {:?} (sizes {:?}), the backup has {} bytes (exit {status:?})\n{}",
        backups.iter().map(|b| b.0).collect::<Vec<_>>(),
        backups.iter().map(|b| b.1.len()).collect::<Vec<_>>(),
        backup_bytes.len(),
        c.log_text()
    );
    assert!(
        objects.get(&k) == Some(&live_bytes),
        "the live object has {:?} bytes, the new file {} (exit {status:?})\n{}",
        objects.get(&k).map(Vec::len),
        live_bytes.len(),
        c.log_text()
    );
    assert!(status.success(), "exit {status:?}\n{}", c.log_text());
}

/// Issue 42's review, defect 2: under a bandwidth cap, big sends that shared it all missed
/// deadlines counted from their bytes at an assumed rate, were dropped and restarted from
/// zero, forever. A send's deadline is on its progress now (waiting for its share of the
/// cap is progress): five logs sharing a small cap, with the stall limit's floor lowered to
/// 3 s so this runs in seconds (at a deadline of 3 s plus the bytes at half the cap, the
/// last ones were cut), all land whole and no send is dropped.
#[test]
fn big_sends_sharing_a_small_cap_all_land_and_none_is_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    let line = "2026-11-22 02:56:15,477 INFO a line of a worker that writes a lot of output\n";
    let rels: Vec<String> = (1..=5)
        .map(|i| format!("worker-010{i}-01000000-{i}.out"))
        .collect();
    // 5 x 300 kB at 100 kB/s: about 14 s after the first second's burst.
    for rel in &rels {
        ray.append(S1, rel, &line.repeat(300_000 / line.len()));
    }
    let store = local_bucket(&tmp.path().join("bucket"));
    let bucket = tmp.path().join("bucket");
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
            "--log-upload-max-bytes-per-second",
            "100000",
        ],
        &[("RHC_TEST_LOG_MIN_STALL_SECS", "3")],
    );
    let files: Vec<(String, Vec<u8>)> = rels
        .iter()
        .map(|rel| {
            (
                key(S1, NODE_A, rel),
                std::fs::read(ray.logs(S1).join(rel)).unwrap(),
            )
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let objects = read_all(&store);
        if files.iter().all(|(k, v)| has(&objects, k, v)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all landed in 45 s: {:?}\n{}",
            files
                .iter()
                .map(|(k, v)| (
                    k.rsplit('/').next().unwrap_or_default(),
                    objects.get(k).map(Vec::len),
                    v.len()
                ))
                .collect::<Vec<_>>(),
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let status = c.terminate(Duration::from_secs(30));
    let log = c.log_text();
    assert!(
        !log.contains("dropped"),
        "a capped send was dropped:\n{log}"
    );
    assert!(status.success(), "exit {status:?}\n{log}");
}

/// kill -9 and a restart after rotations (one backup written again after its rename, one
/// renamed again `.1` → `.2`): nothing is uploaded again and no key is added.
#[test]
fn kill_9_and_restart_after_rotations_uploads_nothing_again() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    let logs = ray.logs(S1);
    ray.append(S1, "raylet.out", "before rotation 1\n");
    ray.append(S1, "dashboard.log", "dashboard before rotation\n");
    let store = local_bucket(&tmp.path().join("bucket"));
    let mut c = start_local(tmp.path(), &ray);
    wait_for(&store, "the first snapshot", &c, |o| {
        o.contains_key(&key(S1, NODE_A, "dashboard.log"))
    });
    ray.rotate(S1, "raylet.out", 3);
    ray.append(S1, "raylet.out", "after rotation 1\n");
    ray.rotate(S1, "dashboard.log", 3);
    wait_for(&store, "the first backups", &c, |o| {
        backups_of(o, "raylet.out").len() == 1 && backups_of(o, "dashboard.log").len() == 1
    });
    std::thread::sleep(Duration::from_secs(2));
    // Written once more after its rename; the other backup renamed again.
    ray.append(S1, "dashboard.log.1", "late line\n");
    ray.rotate(S1, "raylet.out", 3);
    ray.append(S1, "raylet.out", "after rotation 2\n");
    let grown = std::fs::read(logs.join("dashboard.log.1")).unwrap();
    let o = wait_for(
        &store,
        "the grown backup and the second rotation",
        &c,
        |o| {
            backups_of(o, "raylet.out").len() == 2
                && backups_of(o, "dashboard.log")
                    .iter()
                    .any(|(_, v)| **v == grown)
                && has(o, &key(S1, NODE_A, "raylet.out"), b"after rotation 2\n")
        },
    );
    let keys: Vec<String> = o.keys().cloned().collect();
    assert_eq!(backups_of(&o, "dashboard.log").len(), 1, "{keys:#?}");
    // Let the ledger reach disk (it is saved after every pass).
    std::thread::sleep(Duration::from_millis(2500));
    c.kill9();
    c.restart();
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        c.metric("rhc_log_files_uploaded_total"),
        0.0,
        "uploaded again after the restart:\n{}",
        c.log_text()
    );
    assert!(c.terminate(Duration::from_secs(30)).success());
    let after: Vec<String> = read_all(&store).keys().cloned().collect();
    assert_eq!(after, keys, "keys added after the restart");
}

#[test]
fn final_flush_uploads_everything_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    // An earlier session left on disk (a Ray container restart): uploaded once, completely.
    start_session(&ray, S2, NODE_B);
    ray.append(S1, "worker-old-01000000-7.err", "old traceback\n");
    ray.point_latest(S2);
    let bucket = tmp.path().join("bucket");
    let store = local_bucket(&bucket);
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
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
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
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
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
    let store = local_bucket(&bucket);
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

/// Writes `content` to `logs/<dirs>/<name>` without ever naming the whole path (it may be
/// longer than the kernel takes as one path): each directory made and opened from its
/// parent's descriptor.
fn write_beneath(logs: &Path, dirs: &[String], name: &str, content: &[u8]) {
    use std::ffi::CString;
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let c = |s: &str| CString::new(s).unwrap();
    let root = c(logs.to_str().unwrap());
    // SAFETY: valid NUL-terminated paths; every descriptor opened here is closed here.
    unsafe {
        let mut fd = libc::open(root.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY);
        assert!(fd >= 0, "open {}", logs.display());
        for d in dirs {
            let d = c(d);
            let _ = libc::mkdirat(fd, d.as_ptr(), 0o755);
            let next = libc::openat(fd, d.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY);
            libc::close(fd);
            assert!(next >= 0, "openat");
            fd = next;
        }
        let n = c(name);
        let file = libc::openat(
            fd,
            n.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
            0o644,
        );
        libc::close(fd);
        assert!(file >= 0, "openat {name}");
        let mut f = std::fs::File::from_raw_fd(file);
        f.write_all(content).unwrap();
    }
}

/// Issue 39: three files 36 directories of 120 bytes deep (valid names; a key of about
/// 4,500 bytes, which no store takes) never stop a round or the final flush for the five
/// ordinary files beside them: those reach the bucket live and at the final flush, and the
/// deep ones are skipped before any upload, logged once each and counted.
#[test]
fn files_whose_keys_the_store_refuses_never_stop_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    let logs = ray.logs(S1);
    for i in 0..5 {
        ray.append(S1, &format!("app_{i}.log"), &format!("app {i} starts\n"));
    }
    let dirs: Vec<String> = (0..36)
        .map(|level| format!("{level:02}{}", "n".repeat(118)))
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    for i in 0..3 {
        write_beneath(&logs, &dirs, &format!("deep_{i}.log"), b"deep down\n");
    }
    let bucket = tmp.path().join("bucket");
    let store = local_bucket(&bucket);
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
    wait_for(&store, "the ordinary logs, live", &c, |o| {
        (0..5).all(|i| {
            has(
                o,
                &key(S1, NODE_A, &format!("app_{i}.log")),
                format!("app {i} starts\n").as_bytes(),
            )
        })
    });
    // Two more rounds, then lines only the final flush can save.
    std::thread::sleep(Duration::from_secs(2));
    for i in 0..5 {
        ray.append(S1, &format!("app_{i}.log"), "app stops\n");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.metric_labeled("rhc_log_files_skipped_total", "reason=\"key_too_long\"") < 3.0 {
        assert!(Instant::now() < deadline, "{}", c.log_tail(40));
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
    let objects = read_all(&store);
    for i in 0..5 {
        assert!(
            has(
                &objects,
                &key(S1, NODE_A, &format!("app_{i}.log")),
                format!("app {i} starts\napp stops\n").as_bytes()
            ),
            "app_{i}.log after the final flush\n{}",
            c.log_text()
        );
    }
    let text = c.log_text();
    assert_eq!(
        text.matches("longer than the store allows").count(),
        3,
        "each deep file logged once\n{text}"
    );
    assert!(!objects.keys().any(|k| k.contains("deep_")));
}

/// Where the odd-names scenario's collector writes, read back without object_store: the
/// files of a `file://` bucket, or moto's objects over plain HTTP.
enum Bucket<'a> {
    Local(&'a Path),
    Moto(&'a MotoS3, &'a str),
}

impl Bucket<'_> {
    fn storage(&self) -> String {
        match self {
            Bucket::Local(dir) => format!("file://{}", dir.display()),
            Bucket::Moto(_, bucket) => format!("s3://{bucket}"),
        }
    }

    fn object(&self, key: &str) -> Option<Vec<u8>> {
        match self {
            Bucket::Local(dir) => local_object(dir, key),
            Bucket::Moto(s3, bucket) => s3.get_object(bucket, key),
        }
    }

    fn keys(&self) -> Vec<String> {
        match self {
            Bucket::Local(dir) => files_under(dir)
                .iter()
                .map(|p| p.strip_prefix(dir).unwrap().to_string_lossy().into_owned())
                .collect(),
            Bucket::Moto(s3, bucket) => s3.list_keys(bucket, ""),
        }
    }
}

/// Issue 39 (review r39t D1): log files whose names Ray and its users write but KubeRay's
/// session-name rule refuses (a driver log named by a submission id with spaces, a Serve
/// replica's 200-byte name, unicode) are shipped under their names, and `serve` finds each by
/// its name; a name no key can hold (a control character, not UTF-8) is never uploaded,
/// logged once at WARN at the default log level and counted once, however many rounds meet it.
fn odd_names_are_shipped_and_unusable_ones_told_once(bucket: Bucket<'_>, env: &[(&str, &str)]) {
    let tmp = tempfile::tempdir().unwrap();
    let ray = RayRoot::new(&tmp.path().join("ray"));
    start_session(&ray, S1, NODE_A);
    let replica = format!(
        "serve/replica_default_{}{}_7h3k2j1.log",
        "RecommendationRankingDeployment".repeat(5),
        "x".repeat(17)
    );
    assert_eq!(replica.len() - "serve/".len(), 200);
    // Linux's longest name: S3 takes it; a `file://` bucket cannot, as object_store writes
    // `<name>#1` first (skipped as `key_too_long`, not failed every round).
    let longest = format!("{}.log", "L".repeat(251));
    let local = matches!(bucket, Bucket::Local(_));
    let mut shipped = vec![
        "job-driver-nightly eval 2026-12-04.log".to_string(),
        replica,
        "job-driver-évaluation nocturne 夜間 🚀.log".to_string(),
    ];
    if !local {
        shipped.push(longest.clone());
    }
    let logs = ray.logs(S1);
    std::fs::create_dir(logs.join("serve")).unwrap();
    for name in &shipped {
        ray.append(S1, name, &format!("output of {name}\n"));
    }
    std::fs::write(logs.join(&longest), format!("output of {longest}\n")).unwrap();
    std::fs::write(logs.join("job-driver-ctl\u{1}name.log"), "never shipped\n").unwrap();
    std::fs::write(
        logs.join(
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(
                b"job-driver-latin1-\xe9t\xe9.log",
            ),
        ),
        "never shipped\n",
    )
    .unwrap();
    let storage = bucket.storage();
    // The default log level (info), as deployed.
    let mut c = Collector::configure(
        collector_bin(),
        &tmp.path().join("spool"),
        &[
            "--storage",
            &storage,
            "--cluster-name",
            "logs-test",
            "--ray-tmp-dir",
            ray.root.to_str().unwrap(),
            "--log-upload-interval",
            "1s",
        ],
        env,
    );
    c.try_spawn().unwrap_or_else(|e| panic!("{e}"));
    let deadline = Instant::now() + Duration::from_secs(15);
    for name in &shipped {
        let want = format!("output of {name}\n");
        while bucket.object(&key(S1, NODE_A, name)).as_deref() != Some(want.as_bytes()) {
            assert!(
                Instant::now() < deadline,
                "{name:?} not in the bucket under its name; keys: {:#?}\n{}",
                bucket.keys(),
                c.log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // Three more rounds meet the refused names again.
    std::thread::sleep(Duration::from_millis(3200));
    for reason in ["unsafe_name", "name_not_utf8"] {
        assert_eq!(
            c.metric_labeled(
                "rhc_log_files_skipped_total",
                &format!("reason=\"{reason}\"")
            ),
            1.0,
            "{reason}: counted once\n{}",
            c.log_text()
        );
    }
    // `serve` finds each file by its name.
    let mut serve = Serve::start(&storage, &tmp.path().join("serve.log"), &[], env);
    let cookies: Vec<(String, String)> = [
        ("cluster_name", "logs-test"),
        ("cluster_namespace", "default"),
        ("session_name", S1),
        ("owner_kind", ""),
        ("owner_name", ""),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for name in &shipped {
        let path = format!(
            "/api/v0/logs/file?node_id={NODE_A}&filename={}&lines=-1",
            percent_encode(name, false)
        );
        let r = serve.get(&path, &cookies).unwrap();
        assert_eq!(
            (r.status, String::from_utf8_lossy(&r.body).into_owned()),
            (200, format!("output of {name}\n")),
            "GET {path}\n{}",
            serve.log_text()
        );
    }
    serve.terminate(Duration::from_secs(10)).unwrap();
    c.terminate_ok(Duration::from_secs(30));
    let text = c.log_text();
    for shown in [
        "job-driver-ctl\\u{1}name.log",
        "job-driver-latin1-\\x{e9}t\\x{e9}.log",
    ] {
        let warned = text
            .lines()
            .filter(|l| l.contains(" WARN ") && l.contains(shown))
            .count();
        assert_eq!(warned, 1, "{shown} logged once at WARN, escaped\n{text}");
    }
    let keys = bucket.keys();
    assert!(
        !keys
            .iter()
            .any(|k| k.contains("ctl") || k.contains("latin1")),
        "{keys:#?}"
    );
    if local {
        assert!(!keys.iter().any(|k| k.contains("LLLL")), "{keys:#?}");
        assert_eq!(
            text.matches("longer than the store allows").count(),
            1,
            "{text}"
        );
        assert!(!text.contains("log upload failed"), "{text}");
    }
}

#[test]
fn odd_log_names_reach_a_local_bucket_under_their_names() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    odd_names_are_shipped_and_unusable_ones_told_once(Bucket::Local(&bucket), &[]);
}

#[test]
fn odd_log_names_reach_s3_under_their_names() {
    let Some(s3) = MotoS3::start() else {
        return;
    };
    s3.create_bucket("odd-names");
    let env = s3.collector_env();
    odd_names_are_shipped_and_unusable_ones_told_once(Bucket::Moto(&s3, "odd-names"), &env);
}
