//! The log scan's own resources are bounded whatever Ray's user code makes under `logs/`:
//! thousands of sibling directories must not take one file descriptor each while a round
//! scans them (a process out of descriptors fails the event server and the spool too, and
//! the logs past the limit were silently never shipped).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::local::LocalFileSystem;
use object_store::ObjectStore;

use rhc_testkit::collector::{read_all, Collector};

const NODE: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
const SESSION: &str = "session_2026-11-22_02-56-13_816177_24314";
/// Sibling directories made under `logs/`, each holding one log.
const DIRS: usize = 400;
/// The collector's descriptor limit, set once it runs: far below `DIRS`, far above what it
/// needs otherwise (about 20).
const NOFILE: u64 = 128;

fn set_nofile(pid: u32, limit: u64) {
    let lim = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: prlimit with a valid pid, a pointer to an initialised rlimit and a null old
    // value pointer, as its manual allows.
    let rc = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[test]
fn thousands_of_sibling_directories_do_not_exhaust_descriptors() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = tmp.path().join("ray");
    let logs = ray.join(SESSION).join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(
        logs.join("raylet.out"),
        format!("[2026-11-22 02:56:15,477 I 1 1] (raylet) main.cc:711: Setting node ID node_id={NODE}\n"),
    )
    .unwrap();
    std::os::unix::fs::symlink(ray.join(SESSION), ray.join("session_latest")).unwrap();
    let bucket = tmp.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&bucket).unwrap());
    let storage = format!("file://{}", bucket.display());
    let args = [
        "--storage",
        &storage,
        "--cluster-name",
        "wide",
        "--ray-tmp-dir",
        ray.to_str().unwrap(),
        "--log-upload-interval",
        "1s",
    ];
    let env: [(&str, &str); 0] = [];
    let mut c = Collector::start(&tmp.path().join("spool"), &args, &env);
    set_nofile(c.pid(), NOFILE);
    // Made only now, so every scan of them runs under the limit.
    make_dirs(&logs);
    let wanted = |objects: &std::collections::BTreeMap<String, Vec<u8>>| {
        objects
            .keys()
            .filter(|k| k.contains("/logs/d") && k.ends_with("/w.log"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut peak = 0;
    while wanted(&read_all(&store)) < DIRS && Instant::now() < deadline {
        peak = peak.max(open_fds(c.pid()));
        std::thread::sleep(Duration::from_millis(200));
    }
    let live = wanted(&read_all(&store));
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(40));
    let after = wanted(&read_all(&store));
    assert_eq!(
        live,
        DIRS,
        "{live} of {DIRS} logs arrived during the rounds ({after} after the final flush), with \
         at most {NOFILE} descriptors (peak sampled {peak})\n{}",
        c.log_tail(40)
    );
    assert!(
        (peak as u64) < NOFILE / 2,
        "the scan held {peak} descriptors for {DIRS} sibling directories"
    );
}

fn make_dirs(logs: &Path) {
    for i in 0..DIRS {
        let d = logs.join(format!("d{i}"));
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("w.log"), format!("log of d{i}\n")).unwrap();
    }
}
