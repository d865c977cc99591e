//! Runs the real `ray-history-collector` binary, for the integration tests and the chaos
//! suite alike, and reads back what it wrote to a bucket.
//!
//! A [`Collector`] listens on a free loopback port with its own spool dir and log file; it is
//! ready when `/healthz` answers 200 and the log says "collector ready" (the log side is set
//! up after the server answers). It is killed and reaped on drop, however a test ends.
//! [`Collector::start`] panics on failure, for tests; [`Collector::configure`] with
//! [`Collector::try_spawn`] returns errors, for tools.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::{ObjectStore, ObjectStoreExt};

use crate::http::{try_http_request, HttpResponse};
use crate::services::free_port;
use crate::usage::{wait_usage, Usage};

/// How long a start may take until ready.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// The collector binary of this build: `$RHC_COLLECTOR_BIN` if set, else
/// `ray-history-collector` beside the running test's `deps/` directory (`target/<profile>/`),
/// where cargo puts it for the root package's integration tests.
pub fn collector_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RHC_COLLECTOR_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary lives in target/<profile>/deps");
    let bin = profile_dir.join("ray-history-collector");
    assert!(
        bin.is_file(),
        "{} is missing: build it first (cargo build) or set RHC_COLLECTOR_BIN",
        bin.display()
    );
    bin
}

/// A collector process on a free loopback port, with its own spool dir.
pub struct Collector {
    pub bin: PathBuf,
    pub port: u16,
    pub spool: PathBuf,
    pub log: PathBuf,
    /// `RUST_LOG` of the process.
    pub rust_log: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Collector {
    /// Starts this build's binary ([`collector_bin`]) with `args` (plus `--listen` and
    /// `--spool-dir`) and `env`, and waits until it is ready; panics with its log otherwise.
    pub fn start(spool: &Path, args: &[&str], env: &[(&str, &str)]) -> Collector {
        let mut c = Collector::configure(collector_bin(), spool, args, env);
        c.rust_log = "info,ray_history_collector=debug".into();
        if let Err(e) = c.try_spawn() {
            panic!("{e}");
        }
        c
    }

    /// A collector not started yet: `bin` with `args` and `env`, its log beside the spool dir.
    pub fn configure(
        bin: PathBuf,
        spool: &Path,
        args: &[impl AsRef<str>],
        env: &[(impl AsRef<str>, impl AsRef<str>)],
    ) -> Collector {
        Collector {
            bin,
            port: free_port(),
            spool: spool.to_path_buf(),
            log: spool.with_extension("log"),
            rust_log: "info".into(),
            args: args.iter().map(|s| s.as_ref().to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_string()))
                .collect(),
            child: None,
        }
    }

    /// Starts the process and waits until it is ready; returns how long that took.
    pub fn try_spawn(&mut self) -> Result<Duration, String> {
        if self.child.is_some() {
            return Err("the collector is already running".into());
        }
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("opening {}: {e}", self.log.display()))?;
        let log_err = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--spool-dir")
            .arg(&self.spool)
            .args(&self.args)
            .env("RUST_LOG", &self.rust_log)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        // Hermetic by default: Ray sessions of this machine's /tmp/ray (a developer's own Ray,
        // another test's) must not reach a test that did not ask for a Ray directory.
        let ray_tmp_given = self.args.iter().any(|a| a.starts_with("--ray-tmp-dir"))
            || self.env.iter().any(|(k, _)| k == "RAY_TMP_ROOT");
        if !ray_tmp_given {
            cmd.arg("--ray-tmp-dir")
                .arg(self.spool.with_extension("no-ray"));
        }
        for k in [
            "RAY_TMP_ROOT",
            "STORAGE_BACKEND",
            "RHC_STORAGE",
            "EVENTS_PORT",
            "RAY_ROLE",
            "RHC_NODE_ID",
            "RHC_LISTEN",
        ] {
            cmd.env_remove(k);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        // Only this start's lines count: a restart appends to the same log.
        let log_len = fs::metadata(&self.log)
            .map(|m| m.len() as usize)
            .unwrap_or(0);
        let started = Instant::now();
        self.child = Some(
            cmd.spawn()
                .map_err(|e| format!("starting {}: {e}", self.bin.display()))?,
        );
        let deadline = started + READY_LIMIT;
        loop {
            if let Ok(r) = self.get("/healthz") {
                // Done starting: the server answers before the log side is set up.
                let text = self.log_text();
                let new = text.get(log_len..).unwrap_or_default();
                if r.status == 200 && new.contains("collector ready") {
                    return Ok(started.elapsed());
                }
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!(
                    "collector exited at start ({status}):\n{}",
                    self.log_tail(30)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "collector not ready within {READY_LIMIT:?}:\n{}",
                    self.log_tail(30)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the same configuration again (after a crash or a clean stop); panics if it fails.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        if let Err(e) = self.try_spawn() {
            panic!("{e}");
        }
    }

    /// The process id, 0 when not running.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    pub fn post(&self, body: &[u8]) -> HttpResponse {
        self.post_with(body, &[])
    }

    pub fn post_with(&self, body: &[u8], headers: &[(&str, &str)]) -> HttpResponse {
        let mut h = vec![("Content-Type", "application/json")];
        h.extend_from_slice(headers);
        try_http_request("POST", &self.url("/v1/events"), &h, body).expect("POST /v1/events")
    }

    pub fn get(&self, path: &str) -> std::io::Result<HttpResponse> {
        try_http_request("GET", &self.url(path), &[], b"")
    }

    /// A metric's value from `/metrics` (sum over label sets), NaN when it cannot be read.
    pub fn metric(&self, name: &str) -> f64 {
        let Ok(r) = self.get("/metrics") else {
            return f64::NAN;
        };
        String::from_utf8_lossy(&r.body)
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// A metric's value for the series whose labels include `label` (e.g. `kind="append"`),
    /// summed; NaN when it cannot be read.
    pub fn metric_labeled(&self, name: &str, label: &str) -> f64 {
        let Ok(r) = self.get("/metrics") else {
            return f64::NAN;
        };
        String::from_utf8_lossy(&r.body)
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
            .filter(|l| {
                l.split_once('}')
                    .is_some_and(|(labels, _)| labels.contains(label))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Resident memory of the process in bytes, from `/proc` (0 when not running).
    pub fn rss(&self) -> u64 {
        rss_bytes(self.pid()).unwrap_or(0)
    }

    /// Sends SIGTERM (nothing when not running).
    pub fn signal_term(&self) {
        if let Some(c) = &self.child {
            // SAFETY: sending a signal to our own child process.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
    }

    /// Waits up to `limit` for the exit; kills it after that and says so.
    pub fn wait_exit(&mut self, limit: Duration) -> Result<ExitStatus, String> {
        let Some(mut child) = self.child.take() else {
            return Err("the collector is not running".into());
        };
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "collector did not exit within {limit:?}:\n{}",
                    self.log_tail(30)
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Like [`Collector::wait_exit`], with what the whole life of the process cost (CPU time
    /// and peak resident set, from `wait4`).
    pub fn wait_exit_usage(&mut self, limit: Duration) -> Result<(ExitStatus, Usage), String> {
        let child = self.child.take().ok_or("the collector is not running")?;
        wait_usage(child, limit).map_err(|e| format!("{e}:\n{}", self.log_tail(30)))
    }

    /// SIGTERM, then waits up to `limit`; the exit status and how long the shutdown took.
    pub fn try_terminate(&mut self, limit: Duration) -> Result<(ExitStatus, Duration), String> {
        let t = Instant::now();
        self.signal_term();
        let status = self.wait_exit(limit)?;
        Ok((status, t.elapsed()))
    }

    /// Sends SIGTERM and waits (up to `limit`) for the exit status; panics otherwise.
    pub fn terminate(&mut self, limit: Duration) -> ExitStatus {
        match self.try_terminate(limit) {
            Ok((status, _)) => status,
            Err(e) => panic!("{e}"),
        }
    }

    /// SIGTERM, then waits up to `limit` for an exit that must be a success; panics with the
    /// whole log otherwise. The end of most tests.
    pub fn terminate_ok(&mut self, limit: Duration) {
        let status = self.terminate(limit);
        assert!(status.success(), "{}", self.log_text());
    }

    /// Polls `ok` every 100 ms until it holds; panics after `limit` with `what` and the
    /// last 40 lines of the log.
    pub fn wait_until(&self, what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !ok() {
            assert!(
                Instant::now() < deadline,
                "timed out: {what}\n{}",
                self.log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// kill -9: no chance to flush or upload anything. Nothing when not running.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The node vanishes (a reclaimed spot node, an eviction): kill -9, then the spool
    /// directory is deleted, as the pod's emptyDir goes with the node. What was not in the
    /// bucket by then is gone for good. An error names the spool when it cannot be deleted.
    pub fn vanish(&mut self) -> Result<(), String> {
        self.kill9();
        fs::remove_dir_all(&self.spool)
            .map_err(|e| format!("deleting the spool {}: {e}", self.spool.display()))
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let t = self.log_text();
        let all: Vec<&str> = t.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Resident memory of process `pid` in bytes (`VmRSS` in `/proc/<pid>/status`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Appends `bytes` to the file at `path`, creating it (as Ray's loggers write).
pub fn append_to(path: &Path, bytes: &[u8]) {
    use std::io::Write as _;
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open for appending");
    f.write_all(bytes).expect("append");
}

/// Most files created aside while waiting for a freed inode to come back, in
/// [`create_on_freed_inode`].
const INODE_REUSE_TRIES: usize = 10_000;

/// Creates `path` holding `bytes` on the inode `ino`, freed just before (a file deleted), as
/// ext4 does for the next file created in the same directory: it hands out the lowest free
/// inode of the directory's group, which is usually the one just freed. When the new file got
/// another inode (a lower one was free, or the freed one was still open), it is moved aside
/// and the file created again, until the inode comes back; the files moved aside are removed
/// afterwards. Returns how many were moved aside; an error when `ino` never came back (a
/// filesystem that does not reuse inodes this way), so that a test that needs the reuse fails
/// instead of passing without it.
pub fn create_on_freed_inode(path: &Path, ino: u64, bytes: &[u8]) -> Result<usize, String> {
    use std::os::unix::fs::MetadataExt as _;
    let dir = path.parent().ok_or("no parent directory")?;
    let mut aside = Vec::new();
    let result = loop {
        fs::write(path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))?;
        let got = fs::metadata(path).map_err(|e| e.to_string())?.ino();
        if got == ino {
            break Ok(aside.len());
        }
        if aside.len() >= INODE_REUSE_TRIES {
            let _ = fs::remove_file(path);
            break Err(format!(
                "inode {ino} was not reused after {} files created in {} (last got {got}): this filesystem does not reuse freed inodes the way ext4 does",
                aside.len(),
                dir.display()
            ));
        }
        let to = dir.join(format!(".inode-reuse-{}", aside.len()));
        fs::rename(path, &to).map_err(|e| e.to_string())?;
        aside.push(to);
    };
    for p in aside {
        let _ = fs::remove_file(p);
    }
    result
}

/// Every regular file under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Copies a recorded session's `logs/` tree (`fixture`) into `<work>/ray/<session>/logs/`
/// and runs the real collector over it until SIGTERM (export events tailed, logs shipped,
/// nothing pushed; the dashboard address is a closed port); returns the file bucket.
pub fn ship_session_logs(work: &Path, fixture: &Path, session: &str, cluster: &str) -> PathBuf {
    let ray_tmp = work.join("ray");
    let logs = ray_tmp.join(session).join("logs");
    for file in files_under(fixture) {
        let to = logs.join(file.strip_prefix(fixture).expect("under the fixture"));
        fs::create_dir_all(to.parent().expect("a parent")).expect("create_dir_all");
        fs::copy(&file, &to).expect("copy the fixture");
    }
    let store = work.join("store");
    let dashboard = format!("http://127.0.0.1:{}", free_port());
    let mut c = Collector::start(
        &work.join("spool"),
        &[
            "--storage",
            store.to_str().expect("UTF-8 path"),
            "--cluster-name",
            cluster,
            "--enable-export-events",
            "true",
            "--ray-tmp-dir",
            ray_tmp.to_str().expect("UTF-8 path"),
            "--dashboard-address",
            &dashboard,
        ],
        &[],
    );
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "collector: {status}\n{}", c.log_text());
    store
}

/// Copies every file of the file bucket `from` into the file bucket `into` (same keys), to
/// put sessions that separate collectors wrote into one bucket. A key both hold is a
/// failure: the buckets are meant to be disjoint.
pub fn merge_bucket(from: &Path, into: &Path) {
    for file in files_under(from) {
        let to = into.join(file.strip_prefix(from).expect("under the bucket"));
        assert!(!to.exists(), "{} is in both buckets", to.display());
        fs::create_dir_all(to.parent().expect("a parent")).expect("create_dir_all");
        fs::copy(&file, &to).expect("copy an object");
    }
}

/// Every object in `store` (key → bytes). An object listed and gone before it is read (a
/// collector renaming its temporary over the object meanwhile) is not in the answer.
pub fn read_all(store: &Arc<dyn ObjectStore>) -> BTreeMap<String, Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        use futures::TryStreamExt;
        let metas: Vec<_> = store.list(None).try_collect().await.expect("list");
        let mut out = BTreeMap::new();
        for m in metas {
            let got = match store.get(&m.location).await {
                Err(object_store::Error::NotFound { .. }) => continue,
                got => got.expect("get"),
            };
            let bytes = got.bytes().await.expect("body");
            out.insert(m.location.to_string(), bytes.to_vec());
        }
        out
    })
}

/// gunzips if the key says so.
pub fn decode(key: &str, bytes: &[u8]) -> Vec<u8> {
    if key.ends_with(".gz") {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .unwrap_or_else(|e| panic!("{key}: not gzip: {e}"));
        out
    } else {
        bytes.to_vec()
    }
}

/// The history server's accepted event-file name pattern.
pub fn history_server_accepts(name: &str) -> bool {
    let re =
        regex::Regex::new(r"-\d{4}-\d{2}-\d{2}-\d{2}(-\d+)?(\.jsonl)?(\.gz)?$").expect("regex");
    re.is_match(name)
}
