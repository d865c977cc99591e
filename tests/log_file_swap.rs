//! A log file swapped for a symlink between the scan and the upload: nothing of the link's
//! target reaches the bucket. Ray's user code shares the session directory with the
//! collector and could point a log at a file only the collector can read (its service
//! account token, mounted credentials). The swap is made deterministic by an `LD_PRELOAD`
//! shim (`rhc_testkit::preload`) that replaces the file by the symlink at the instant the
//! collector opens it, after the scan saw a regular file. The same holds for directories:
//! the session's `logs/` swapped for a symlink to a directory only the collector can read,
//! and a subdirectory swapped at the instant a round's scan opens it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::local::LocalFileSystem;
use object_store::ObjectStore;

use rhc_testkit::collector::{append_to as append, read_all, Collector};
use rhc_testkit::preload::SwapShim;
use rhc_testkit::ray_logs::RayRoot;

const NODE: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
const SESSION: &str = "session_2026-11-22_02-56-13_816177_24314";
const LOG: &str = "worker-aa-01000000-1.out";
const SECRET: &[u8] = b"TOPSECRET-service-account-token-";

/// The session whose `raylet.out` names [`NODE`], active; the path of its log [`LOG`].
fn ray_session(root: &Path) -> PathBuf {
    RayRoot::new(root).session(SESSION, NODE, true).join(LOG)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `after_first_upload`: swap at the first open after the first upload (the append path),
/// else at the very first open (the whole upload).
fn swapped_for_a_symlink(after_first_upload: bool) {
    let shim = match SwapShim::build() {
        Ok(s) => s,
        Err(e) => panic!("the test's LD_PRELOAD shim: {e}"),
    };
    let tmp = tempfile::tempdir().unwrap();
    let ray = tmp.path().join("ray");
    let log = ray_session(&ray);
    let secret = tmp.path().join("token");
    std::fs::write(&secret, SECRET.repeat(4096)).unwrap();
    append(&log, &b"an honest log line\n".repeat(2000));
    let bucket = tmp.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&bucket).unwrap());
    let storage = format!("file://{}", bucket.display());
    let armed = tmp.path().join("armed");
    let done = tmp.path().join("swapped");
    let env = shim.env(&log, &secret, Some(&armed), &done);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    if !after_first_upload {
        std::fs::write(&armed, b"").unwrap();
    }
    let args = [
        "--storage",
        &storage,
        "--cluster-name",
        "swap",
        "--ray-tmp-dir",
        ray.to_str().unwrap(),
        "--log-upload-interval",
        "1s",
    ];
    let mut c = Collector::start(&tmp.path().join("spool"), &args, &env);
    let log_key = |k: &str| k.ends_with(&format!("/logs/{LOG}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    if after_first_upload {
        while !read_all(&store).keys().any(|k| log_key(k)) {
            assert!(Instant::now() < deadline, "{}", c.log_tail(30));
            std::thread::sleep(Duration::from_millis(100));
        }
        // The file grows (an append is due), and its next open meets the symlink.
        std::fs::write(&armed, b"").unwrap();
        append(&log, &b"more honest lines\n".repeat(2000));
    }
    while !done.exists() {
        assert!(
            Instant::now() < deadline,
            "the shim never swapped the file\n{}",
            c.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(std::fs::symlink_metadata(&log)
        .unwrap()
        .file_type()
        .is_symlink());
    // Several rounds with the symlink in place, then the final flush.
    std::thread::sleep(Duration::from_secs(3));
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
    let objects = read_all(&store);
    for (k, v) in &objects {
        assert!(
            !contains(v, SECRET),
            "{k}: the symlink's target reached the bucket\n{}",
            c.log_tail(30)
        );
    }
    assert!(
        objects.keys().any(|k| k.ends_with("/logs/raylet.out")),
        "the other logs still go: {:?}",
        objects.keys()
    );
}

#[test]
fn symlink_swapped_in_before_the_first_upload_is_not_followed() {
    swapped_for_a_symlink(false);
}

#[test]
fn symlink_swapped_in_before_an_append_is_not_followed() {
    swapped_for_a_symlink(true);
}

/// A directory only the collector can read, holding a secret; returns it.
fn secrets(root: &Path) -> PathBuf {
    let dir = root.join("secrets");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), SECRET.repeat(64)).unwrap();
    dir
}

/// Runs the collector on `ray` into a `file://` bucket (with `env`) for a few rounds and
/// the final flush; returns the bucket's objects.
fn run_rounds(
    tmp: &Path,
    ray: &Path,
    env: &[(String, String)],
    arm: Option<(&Path, &Path)>,
) -> std::collections::BTreeMap<String, Vec<u8>> {
    let bucket = tmp.join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&bucket).unwrap());
    let storage = format!("file://{}", bucket.display());
    let args = [
        "--storage",
        &storage,
        "--cluster-name",
        "swap",
        "--ray-tmp-dir",
        ray.to_str().unwrap(),
        "--log-upload-interval",
        "1s",
        "--node-id",
        NODE,
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut c = Collector::start(&tmp.join("spool"), &args, &env);
    if let Some((armed, done)) = arm {
        // After a first round (so the swap meets a round's scan, not the start-up).
        let deadline = Instant::now() + Duration::from_secs(30);
        while !read_all(&store)
            .keys()
            .any(|k| k.ends_with("/logs/raylet.out"))
        {
            assert!(Instant::now() < deadline, "{}", c.log_tail(30));
            std::thread::sleep(Duration::from_millis(100));
        }
        std::fs::write(armed, b"").unwrap();
        while !done.exists() {
            assert!(
                Instant::now() < deadline,
                "the shim never swapped\n{}",
                c.log_tail(30)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    std::thread::sleep(Duration::from_secs(3));
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
    read_all(&store).into_iter().collect()
}

fn assert_no_secret(objects: &std::collections::BTreeMap<String, Vec<u8>>) {
    for (k, v) in objects {
        assert!(
            !contains(v, SECRET) && !k.ends_with("/token"),
            "{k}: the symlink's target reached the bucket: {:?}",
            objects.keys()
        );
    }
}

#[test]
fn a_logs_directory_swapped_for_a_symlink_is_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = tmp.path().join("ray");
    let log = ray_session(&ray);
    let logs = log.parent().unwrap();
    let secrets = secrets(tmp.path());
    // Ray's user code: logs/ -> a directory only the collector can read.
    std::fs::rename(logs, logs.with_extension("orig")).unwrap();
    std::os::unix::fs::symlink(&secrets, logs).unwrap();
    let objects = run_rounds(tmp.path(), &ray, &[], None);
    assert_no_secret(&objects);
}

#[test]
fn a_log_subdirectory_swapped_for_a_symlink_while_scanned_is_not_followed() {
    let shim = match SwapShim::build() {
        Ok(s) => s,
        Err(e) => panic!("the test's LD_PRELOAD shim: {e}"),
    };
    let tmp = tempfile::tempdir().unwrap();
    let ray = tmp.path().join("ray");
    let log = ray_session(&ray);
    let sub = log.parent().unwrap().join("events");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("event_GCS.log"), b"an honest event line\n").unwrap();
    let secrets = secrets(tmp.path());
    // The directory is swapped at the instant a round's scan opens it, after it saw a
    // directory there: the race made deterministic.
    let (armed, done) = (tmp.path().join("armed"), tmp.path().join("swapped"));
    let env = shim.env(&sub, &secrets, Some(&armed), &done);
    let objects = run_rounds(tmp.path(), &ray, &env, Some((&armed, &done)));
    assert_no_secret(&objects);
    assert!(
        objects.keys().any(|k| k.ends_with("/logs/raylet.out")),
        "the other logs still go: {:?}",
        objects.keys()
    );
}
