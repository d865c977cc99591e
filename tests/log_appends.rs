//! Live logs at linear cost, through the real binary: a log that keeps growing is appended
//! to its object (file:// in place, S3 through UploadPartCopy against moto) instead of being
//! uploaded whole every round, and every case where an append would be wrong falls back to
//! a whole upload: the file truncated, the file replaced by a new one under the same name
//! (Ray's rotation), the object changed in the bucket behind our back, the collector killed
//! in the middle of an append. Whatever the bucket holds at any moment is a prefix of the
//! file, and after the final flush it is the file, byte for byte.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use rhc_testkit::collector::{append_to as append, read_all, Collector};
use rhc_testkit::services::MotoS3;

const NODE: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
const SESSION: &str = "session_2026-11-22_02-56-13_816177_24314";
const P: &str = "cluster-history/raycluster/default/appends";
const LOG: &str = "worker-aa-01000000-1.out";

fn key() -> String {
    format!("{P}/{SESSION}/{NODE}/logs/{LOG}")
}

/// A Ray session whose raylet names the node, and the worker log under test.
fn ray_session(root: &Path) -> PathBuf {
    let logs = root.join(SESSION).join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(
        logs.join("raylet.out"),
        format!("[2026-11-22 02:56:15,477 I 1 1] (raylet) main.cc:711: Setting node ID node_id={NODE}\n"),
    )
    .unwrap();
    std::os::unix::fs::symlink(root.join(SESSION), root.join("session_latest")).unwrap();
    logs.join(LOG)
}

/// `n` bytes of numbered log lines, starting at line `from`.
fn lines(from: usize, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 64);
    let mut i = from;
    while out.len() < n {
        out.extend_from_slice(format!("{i:012} the worker says something\n").as_bytes());
        i += 1;
    }
    out.truncate(n);
    out
}

/// The object under test, when there is one.
fn object(store: &Arc<dyn ObjectStore>) -> Option<Vec<u8>> {
    read_all(store).remove(&key())
}

/// Waits until the object equals the file; with `prefix`, checks that whatever it holds
/// meanwhile is a prefix of the file (never a tail, never someone else's bytes).
fn wait_equal(store: &Arc<dyn ObjectStore>, file: &Path, c: &Collector, what: &str) {
    wait_for_file(store, file, c, what, true)
}

/// [`wait_equal`] for a file whose start changed (the old object is no prefix of it).
fn wait_replaced(store: &Arc<dyn ObjectStore>, file: &Path, c: &Collector, what: &str) {
    wait_for_file(store, file, c, what, false)
}

fn wait_for_file(
    store: &Arc<dyn ObjectStore>,
    file: &Path,
    c: &Collector,
    what: &str,
    prefix: bool,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let want = std::fs::read(file).unwrap();
        if let Some(got) = object(store) {
            if got == want {
                return;
            }
            assert!(
                !prefix || want.starts_with(&got),
                "{what}: the object ({} bytes) is not a prefix of the file ({} bytes)\n{}",
                got.len(),
                want.len(),
                c.log_tail(30)
            );
        }
        assert!(
            Instant::now() < deadline,
            "{what}: timed out; object {:?} bytes, file {} bytes\n{}",
            object(store).map(|o| o.len()),
            want.len(),
            c.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn appends(c: &Collector) -> f64 {
    c.metric_labeled("rhc_log_uploads_total", "kind=\"append\"")
}

fn wholes(c: &Collector) -> f64 {
    c.metric_labeled("rhc_log_uploads_total", "kind=\"whole\"")
}

/// The same story against any store: `start` bytes, growth by appends, then each case
/// where an append must not happen.
fn story(store: Arc<dyn ObjectStore>, storage: &str, env: &[(&str, &str)], start: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let ray = tmp.path().join("ray");
    let log = ray_session(&ray);
    append(&log, &lines(0, start));
    let args = [
        "--storage",
        storage,
        "--cluster-name",
        "appends",
        "--ray-tmp-dir",
        ray.to_str().unwrap(),
        "--log-upload-interval",
        "1s",
    ];
    let mut c = Collector::start(&tmp.path().join("spool"), &args, env);
    wait_equal(&store, &log, &c, "first upload");
    assert_eq!(appends(&c), 0.0);

    // Growth: only the new bytes go up.
    let mut line = start;
    for round in 0..3 {
        append(&log, &lines(line, 100_000));
        line += 100_000;
        wait_equal(&store, &log, &c, &format!("growth {round}"));
    }
    assert!(appends(&c) >= 3.0, "no appends:\n{}", c.log_tail(40));
    let uploaded = c.metric("rhc_log_bytes_uploaded_total");
    let file_len = std::fs::metadata(&log).unwrap().len() as f64;
    assert!(
        uploaded < file_len * 1.2,
        "{uploaded} bytes uploaded for a {file_len}-byte file"
    );

    // The object changed behind our back: the next round uploads the file whole.
    let whole_before = wholes(&c);
    let loc = ObjectPath::parse(key()).unwrap();
    let foreign = lines(7_000_000, start);
    block_on(store.put(&loc, PutPayload::from(foreign))).unwrap();
    append(&log, b"after the object was replaced\n");
    wait_replaced(&store, &log, &c, "object changed behind our back");
    assert!(wholes(&c) > whole_before, "{}", c.log_tail(40));

    // Truncated (copytruncate), then grown again.
    let whole_before = wholes(&c);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(0)
        .unwrap();
    append(&log, &lines(9_000_000, start));
    wait_replaced(&store, &log, &c, "truncated");
    assert!(wholes(&c) > whole_before);

    // Replaced by a new file under the same name (a new inode), as long as the old one.
    let whole_before = wholes(&c);
    std::fs::remove_file(&log).unwrap();
    append(&log, &lines(11_000_000, start + 10));
    wait_replaced(&store, &log, &c, "replaced");
    assert!(wholes(&c) > whole_before);

    // Killed during a big append, restarted: the object is still a prefix, then the file.
    append(&log, &lines(13_000_000, 30 << 20));
    std::thread::sleep(Duration::from_millis(1300));
    c.kill9();
    if let Some(got) = object(&store) {
        let want = std::fs::read(&log).unwrap();
        assert!(want.starts_with(&got), "after kill -9: not a prefix");
    }
    c.restart();
    append(&log, b"after the restart\n");
    wait_equal(&store, &log, &c, "after kill -9 and a restart");

    // The final flush leaves the file byte for byte.
    append(&log, b"the last line\n");
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "{}", c.log_text());
    assert_eq!(object(&store).unwrap(), std::fs::read(&log).unwrap());
    let leftovers: BTreeMap<String, Vec<u8>> = read_all(&store)
        .into_iter()
        .filter(|(k, _)| k.contains("/logs/") && !k.ends_with("/raylet.out") && *k != key())
        .collect();
    assert!(
        leftovers.is_empty(),
        "objects other than Ray's logs under logs/: {:?}",
        leftovers.keys()
    );
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn file_store_appends_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&bucket).unwrap());
    let storage = format!("file://{}", bucket.display());
    story(store, &storage, &[], 2 << 20);
}

#[test]
fn s3_appends_with_upload_part_copy() {
    let Some(s3) = MotoS3::start() else {
        return;
    };
    s3.create_bucket("logs");
    // Above S3's 5 MiB minimum for a copied part.
    story(s3.store("logs"), "s3://logs", &s3.collector_env(), 6 << 20);
}

#[test]
fn small_files_first_and_the_lane_capped() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = tmp.path().join("ray");
    let log = ray_session(&ray);
    let logs = log.parent().unwrap().to_path_buf();
    // One big file (new, so it goes whole) and small ones, written after it.
    append(&log, &lines(0, 12 << 20));
    std::thread::sleep(Duration::from_millis(20));
    for i in 0..5 {
        std::fs::write(logs.join(format!("small-{i}.log")), format!("small {i}\n")).unwrap();
    }
    let bucket = tmp.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&bucket).unwrap());
    let storage = format!("file://{}", bucket.display());
    let args = [
        "--storage",
        &storage,
        "--cluster-name",
        "appends",
        "--ray-tmp-dir",
        ray.to_str().unwrap(),
        "--log-upload-interval",
        "1s",
        "--log-upload-max-bytes-per-second",
        "2MiB",
    ];
    let started = Instant::now();
    let mut c = Collector::start(&tmp.path().join("spool"), &args, &[]);
    let mut first_seen: BTreeMap<String, Duration> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !first_seen.contains_key(&key()) {
        assert!(Instant::now() < deadline, "{}", c.log_tail(30));
        for k in read_all(&store).into_keys() {
            first_seen.entry(k).or_insert_with(|| started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let big = first_seen[&key()];
    let smalls: Vec<Duration> = (0..5)
        .map(|i| {
            let k = format!("{P}/{SESSION}/{NODE}/logs/small-{i}.log");
            *first_seen
                .get(&k)
                .unwrap_or_else(|| panic!("{k} not uploaded before the big file"))
        })
        .collect();
    assert!(smalls.iter().all(|s| *s <= big), "{smalls:?} vs {big:?}");
    // 12 MiB at 2 MiB/s with one second of burst: about 5 s, not the instant a local copy takes.
    assert!(
        big >= Duration::from_secs(4),
        "the big file arrived after {big:?}"
    );
    wait_equal(&store, &log, &c, "big file");
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
}
