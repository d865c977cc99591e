//! A Ray temp root as the log shipper sees it: session dirs whose `raylet.out` names the
//! node, `session_latest` pointing at the active one, log files written, grown, rotated and
//! rewritten the way Ray does it; a `file://` bucket's objects read back by key; and
//! [`LocalRig`], one test's world (a Ray temp root, a `file://` bucket, a spool) with the
//! real collector between them, so that a test builds its session tree and starts the
//! collector in a line each, and reads as its scenario and its assertions.

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::local::LocalFileSystem;
use object_store::ObjectStore;

use crate::collector::{read_all, Collector};

/// How long [`LocalRig::wait_for`] polls the bucket.
const BUCKET_WAIT_LIMIT: Duration = Duration::from_secs(20);

/// The line of `raylet.out` that names the node (`node_id=<node>`), as Ray 2.x writes it.
pub fn raylet_line(node: &str) -> String {
    format!(
        "[2026-11-22 02:56:15,477 I 1 1] (raylet) main.cc:711: Setting node ID node_id={node}\n"
    )
}

/// A Ray temp root (`--ray-tmp-dir`).
pub struct RayRoot {
    /// The root.
    pub root: PathBuf,
}

impl RayRoot {
    /// Creates the root.
    pub fn new(root: &Path) -> RayRoot {
        std::fs::create_dir_all(root).expect("create the ray root");
        RayRoot {
            root: root.to_path_buf(),
        }
    }

    /// The logs dir of `session`.
    pub fn logs(&self, session: &str) -> PathBuf {
        self.root.join(session).join("logs")
    }

    /// Creates `session` with a `raylet.out` naming `node`; `active` points session_latest
    /// at it.
    pub fn session(&self, session: &str, node: &str, active: bool) -> PathBuf {
        let logs = self.logs(session);
        std::fs::create_dir_all(&logs).expect("create the session's logs");
        std::fs::write(logs.join("raylet.out"), raylet_line(node)).expect("write raylet.out");
        if active {
            self.point_latest(session);
        }
        logs
    }

    /// Points `session_latest` at `session` (replacing the link).
    pub fn point_latest(&self, session: &str) {
        let link = self.root.join("session_latest");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(self.root.join(session), &link).expect("session_latest");
    }

    /// Appends `text` to `rel` in `session`'s logs, creating the file, as Ray's loggers do.
    pub fn append(&self, session: &str, rel: &str, text: &str) {
        crate::collector::append_to(&self.logs(session).join(rel), text.as_bytes());
    }

    /// Ray's rotation of `rel` in `session`'s logs with `backups` backups kept:
    /// `rel.(N-1)` → `rel.N` …, `rel` → `rel.1`, then a fresh empty `rel`.
    pub fn rotate(&self, session: &str, rel: &str, backups: u32) {
        let logs = self.logs(session);
        for n in (1..backups).rev() {
            let from = logs.join(format!("{rel}.{n}"));
            if from.exists() {
                std::fs::rename(&from, logs.join(format!("{rel}.{}", n + 1)))
                    .expect("rename a backup");
            }
        }
        std::fs::rename(logs.join(rel), logs.join(format!("{rel}.1")))
            .expect("rename the live file");
        std::fs::write(logs.join(rel), "").expect("a fresh live file");
    }
}

/// One test's world under one directory: a Ray temp root (`ray/`), a `file://` bucket
/// (`bucket/`) and a spool (`spool/`), and the collector shipping the one to the other.
/// The sessions are the test's to build ([`LocalRig::ray`]).
pub struct LocalRig {
    _tmp: Option<tempfile::TempDir>,
    /// The directory holding it all.
    pub dir: PathBuf,
    /// The Ray temp root (`--ray-tmp-dir`).
    pub ray: RayRoot,
    /// The `file://` bucket's directory (`--storage`).
    pub bucket: PathBuf,
    /// The spool directory.
    pub spool: PathBuf,
    defaults: Vec<String>,
}

impl LocalRig {
    /// A world in a new temporary directory (removed when dropped).
    pub fn new() -> LocalRig {
        let tmp = tempfile::tempdir().expect("a temporary directory");
        let mut w = LocalRig::at(tmp.path());
        w._tmp = Some(tmp);
        w
    }

    /// A world in `dir` (left in place when dropped).
    pub fn at(dir: &Path) -> LocalRig {
        LocalRig {
            _tmp: None,
            dir: dir.to_path_buf(),
            ray: RayRoot::new(&dir.join("ray")),
            bucket: dir.join("bucket"),
            spool: dir.join("spool"),
            defaults: Vec::new(),
        }
    }

    /// The flags every collector of this world gets after `--storage` and `--ray-tmp-dir`
    /// (a test file's usual settings), unless [`LocalCollector::only`] replaces them.
    pub fn defaults(mut self, args: &[&str]) -> LocalRig {
        self.defaults = args.iter().map(|a| a.to_string()).collect();
        self
    }

    /// A collector of this world to configure, then [`LocalCollector::start`].
    pub fn collector(&self) -> LocalCollector<'_> {
        LocalCollector {
            rig: self,
            storage: self.bucket.to_str().expect("a UTF-8 path").to_string(),
            args: self.defaults.clone(),
            env: Vec::new(),
        }
    }

    /// Starts a collector with the defaults, `extra` flags after them and `env` added to its
    /// environment; waits until it is ready.
    pub fn start(&self, extra: &[&str], env: &[(&str, &str)]) -> Collector {
        self.collector().args(extra).env(env).start()
    }

    /// The bucket as an object store (the directory made if missing).
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        local_bucket(&self.bucket)
    }

    /// Every object of the bucket (key → bytes).
    pub fn objects(&self) -> BTreeMap<String, Vec<u8>> {
        bucket_objects(&self.bucket)
    }

    /// [`wait_for_objects`] on this world's bucket.
    pub fn wait_for(
        &self,
        what: &str,
        c: &Collector,
        pred: impl Fn(&BTreeMap<String, Vec<u8>>) -> bool,
    ) -> BTreeMap<String, Vec<u8>> {
        wait_for_objects(&self.store(), what, c, pred)
    }

    /// Every upload fails from now on: the bucket's directory becomes a file.
    pub fn refuse_uploads(&self) {
        if self.bucket.is_dir() {
            std::fs::remove_dir_all(&self.bucket).expect("remove the bucket");
        }
        std::fs::write(&self.bucket, b"not a directory").expect("a file for the bucket");
    }
}

impl Default for LocalRig {
    fn default() -> Self {
        LocalRig::new()
    }
}

/// A collector of a [`LocalRig`] being configured.
pub struct LocalCollector<'a> {
    rig: &'a LocalRig,
    storage: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl LocalCollector<'_> {
    /// Flags after the world's defaults.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// These flags instead of the world's defaults (still after `--storage` and
    /// `--ray-tmp-dir`).
    pub fn only(mut self, args: &[&str]) -> Self {
        self.args = args.iter().map(|a| a.to_string()).collect();
        self
    }

    /// `--storage` as a `file://` URL rather than a path.
    pub fn file_url(mut self) -> Self {
        self.storage = format!("file://{}", self.rig.bucket.display());
        self
    }

    /// Added to the environment.
    pub fn env(mut self, env: &[(&str, &str)]) -> Self {
        self.env
            .extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    /// Starts it and waits until it is ready (panics with its log otherwise).
    pub fn start(self) -> Collector {
        let ray = self.rig.ray.root.to_str().expect("a UTF-8 path");
        let mut args: Vec<&str> = vec!["--storage", &self.storage, "--ray-tmp-dir", ray];
        args.extend(self.args.iter().map(String::as_str));
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Collector::start(&self.rig.spool, &args, &env)
    }
}

/// `n` numbered lines of 60 bytes, `tag` first (`OLD line 0000001 aaaa…`), from line `from`.
pub fn tagged_lines(tag: &str, from: usize, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 61);
    for i in from..from + n {
        let line = format!("{tag} line {i:07} ");
        out.extend_from_slice(line.as_bytes());
        out.extend(std::iter::repeat_n(
            b'x',
            59usize.saturating_sub(line.len()),
        ));
        out.push(b'\n');
    }
    out
}

/// Truncates `path` in place (same inode) and writes `bytes` from offset 0: a log rewritten
/// with another head.
pub fn rewrite_in_place(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open for the rewrite");
    f.set_len(0).expect("truncate");
    f.seek(SeekFrom::Start(0)).expect("seek");
    f.write_all(bytes).expect("rewrite");
}

/// The `file://` bucket at `dir` as an object store (the directory made if missing).
pub fn local_bucket(dir: &Path) -> Arc<dyn ObjectStore> {
    std::fs::create_dir_all(dir).expect("create the bucket");
    Arc::new(LocalFileSystem::new_with_prefix(dir).expect("a local bucket"))
}

/// Polls `store` (every 200 ms, at most 20 s) until `pred` holds of its objects, and returns
/// them; panics with `what`, the keys and the end of `c`'s log otherwise.
pub fn wait_for_objects(
    store: &Arc<dyn ObjectStore>,
    what: &str,
    c: &Collector,
    pred: impl Fn(&BTreeMap<String, Vec<u8>>) -> bool,
) -> BTreeMap<String, Vec<u8>> {
    let deadline = Instant::now() + BUCKET_WAIT_LIMIT;
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

/// Every object of the `file://` bucket at `bucket` (key → bytes).
pub fn bucket_objects(bucket: &Path) -> BTreeMap<String, Vec<u8>> {
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(bucket).expect("a local bucket"));
    read_all(&store)
}

/// The object `key` of a `file://` bucket at `bucket`; `None` when it is not there.
pub fn local_object(bucket: &Path, key: &str) -> Option<Vec<u8>> {
    std::fs::read(bucket.join(key)).ok()
}
