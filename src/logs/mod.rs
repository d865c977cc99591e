//! Live snapshots of the Ray session logs, captured rotations, earlier sessions, and the
//! final flush at SIGTERM.
//!
//! KubeRay's collector uploads logs once, at SIGTERM, whole files in memory: a pod killed
//! hard loses every log. Here every `--log-upload-interval` the files that changed since
//! their last upload are streamed to `P/<session>/<node>/logs/<relative path>`, and a ledger
//! in the spool dir (size, mtime, hash per object) means a restart re-uploads nothing that
//! did not change. A notify watch catches Ray's log rotations (`name` → `name.1` …) as they
//! happen, and each rotated file is uploaded once under a stable name,
//! `<name>.rotated.<UTC mtime>`, before Ray can delete it. Log uploads run one at a time
//! on their own lane, so a 10 GB worker log never delays events.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::contract::{self, is_safe_segment, ClusterLayout};
use crate::events::spool::Spool;
use crate::node::node_id::NodeIdResolver;
use crate::node::session::{list_sessions, ActiveSession};
use crate::storage::put::{hash_file_prefix, put_file_prefix, UploadError};

/// Store failures in a row after which a round stops trying (the bucket is down).
const MAX_FAILURES_IN_A_ROW: usize = 3;

/// Settings of the log shipper.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Ray's temp root (`/tmp/ray`), holding `session_latest` and the session dirs.
    pub ray_tmp: PathBuf,
    /// Where the ledger lives (the spool dir).
    pub state_dir: PathBuf,
    /// Time between snapshots.
    pub upload_interval: Duration,
    /// Multipart part size.
    pub part_size: usize,
    /// Key layout.
    pub layout: ClusterLayout,
}

/// Errors that stop the log shipper from starting.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The ledger exists but cannot be read.
    #[error("reading the log ledger {path}: {message}")]
    Ledger {
        /// Its path.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

/// What the bucket holds for one log object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct LedgerEntry {
    size: u64,
    mtime_ns: i64,
    hash: u64,
}

/// The ledger file: uploaded objects and sessions completely done.
#[derive(Debug, Default, Serialize, Deserialize)]
struct LedgerFile {
    version: u32,
    objects: BTreeMap<String, LedgerEntry>,
    finished_sessions: BTreeSet<String>,
}

struct Ledger {
    path: PathBuf,
    data: LedgerFile,
    dirty: bool,
}

impl Ledger {
    fn load(path: PathBuf) -> Result<Ledger, LogError> {
        let data = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| LogError::Ledger {
                path: path.clone(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => LedgerFile {
                version: 1,
                ..Default::default()
            },
            Err(e) => {
                return Err(LogError::Ledger {
                    path,
                    message: e.to_string(),
                })
            }
        };
        Ok(Ledger {
            path,
            data,
            dirty: false,
        })
    }

    /// Writes the ledger atomically (temp file, fsync, rename) if it changed.
    fn save(&mut self) {
        if !self.dirty {
            return;
        }
        let result = crate::events::spool::write_json_atomically(&self.path, &self.data);
        match result {
            Ok(()) => self.dirty = false,
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "could not save the log ledger; unchanged files may be uploaded again after a restart")
            }
        }
    }
}

/// One regular file found under a session's `logs/`.
#[derive(Debug, Clone)]
struct LogFile {
    abs: PathBuf,
    /// Relative to `logs/`, '/'-separated, every segment safe.
    rel: String,
    size: u64,
    mtime_ns: i64,
    /// `Some(base)` when this is a rotated backup `base.N` of a live `base`.
    rotated_from: Option<String>,
}

/// Why a file was not shipped.
fn skip(reason: &'static str, path: &Path) {
    counter!(crate::metrics::LOG_FILES_SKIPPED, "reason" => reason).increment(1);
    tracing::debug!(path = %path.display(), reason, "log file skipped");
}

/// Lists the regular files under `logs`, never following symlinks, skipping names that
/// cannot be a key segment.
fn scan_logs(logs: &Path) -> Vec<LogFile> {
    let mut out = Vec::new();
    let mut stack = vec![(logs.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in rd.flatten() {
            let path = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                skip("name_not_utf8", &path);
                continue;
            };
            if !is_safe_segment(&name) {
                skip("unsafe_name", &path);
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let rel = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let ft = meta.file_type();
            if ft.is_dir() {
                stack.push((path, rel));
            } else if ft.is_file() {
                out.push(LogFile {
                    abs: path,
                    rel,
                    size: meta.len(),
                    mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
                    rotated_from: None,
                });
            } else if ft.is_symlink() {
                skip("symlink", &path);
            } else {
                skip("not_a_regular_file", &path);
            }
        }
    }
    // Mark rotated backups: `name.N` next to a live `name`.
    let names: BTreeSet<String> = out.iter().map(|f| f.rel.clone()).collect();
    for f in &mut out {
        if let Some((base, n)) = f.rel.rsplit_once('.') {
            if !n.is_empty()
                && n.len() <= 4
                && n.bytes().all(|c| c.is_ascii_digit())
                && names.contains(base)
            {
                f.rotated_from = Some(base.to_string());
            }
        }
    }
    out
}

/// The object key of a log file (rotated backups get their stable name).
fn object_key(prefix: &str, session: &str, node: &str, f: &LogFile) -> String {
    match &f.rotated_from {
        Some(base) => contract::logs::rotated_log_key(prefix, session, node, base, f.mtime_ns),
        None => contract::logs::log_key(prefix, session, node, &f.rel),
    }
}

/// Upload order: what explains a failure first.
fn priority(f: &LogFile) -> u8 {
    let name = f.rel.rsplit('/').next().unwrap_or(&f.rel);
    if matches!(
        name,
        "raylet.out" | "raylet.err" | "gcs_server.out" | "gcs_server.err" | "debug_state.txt"
    ) {
        0
    } else if f.rotated_from.is_some() {
        1
    } else if name.ends_with(".err") {
        2
    } else if name.starts_with("worker-")
        || name.starts_with("python-core-worker-")
        || name.starts_with("job-driver-")
    {
        3
    } else {
        4
    }
}

/// Result of one pass over a session.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RoundReport {
    /// Files found.
    pub files: usize,
    /// Files uploaded.
    pub uploaded: usize,
    /// Bytes uploaded.
    pub bytes: u64,
    /// Files whose upload failed (retried next round).
    pub failed: usize,
    /// Files not reached before the deadline.
    pub not_reached: Vec<PathBuf>,
    /// Node directory used; `None` when the node id is not known yet (round skipped).
    pub node: Option<String>,
}

/// The log side of the collector.
pub struct LogShipper {
    cfg: LogConfig,
    store: Arc<dyn ObjectStore>,
    spool: Spool,
    ledger: Ledger,
    nodes: NodeIdResolver,
    /// Node id from the dashboard's node list, when nothing local knows it.
    remote_node: Option<String>,
    prefix: String,
    warned_no_node: BTreeSet<String>,
    /// Last resort for the node id: the dashboard's node list matched by this pod's IP.
    remote_lookup: Option<(crate::dashboard::DashboardConfig, String)>,
    last_remote_try: Option<Instant>,
}

impl LogShipper {
    /// Loads the ledger; nothing is uploaded until [`LogShipper::run`].
    pub fn new(
        cfg: LogConfig,
        store: Arc<dyn ObjectStore>,
        spool: Spool,
        nodes: NodeIdResolver,
    ) -> Result<LogShipper, LogError> {
        let ledger = Ledger::load(cfg.state_dir.join("log-ledger.json"))?;
        let prefix = cfg.layout.history_prefix();
        Ok(LogShipper {
            cfg,
            store,
            spool,
            ledger,
            nodes,
            remote_node: None,
            prefix,
            warned_no_node: BTreeSet::new(),
            remote_lookup: None,
            last_remote_try: None,
        })
    }

    /// Enables the last-resort node id lookup through the dashboard (`POD_IP`).
    pub fn with_remote_lookup(
        mut self,
        dashboard: crate::dashboard::DashboardConfig,
        pod_ip: String,
    ) -> Self {
        self.remote_lookup = Some((dashboard, pod_ip));
        self
    }

    /// Asks the dashboard for this node's id, at most every 10 s, when nothing local knows it.
    async fn try_remote_node(&mut self) {
        let Some((cfg, ip)) = &self.remote_lookup else {
            return;
        };
        if self.remote_node.is_some()
            || self
                .last_remote_try
                .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            return;
        }
        self.last_remote_try = Some(Instant::now());
        match crate::dashboard::node_id_by_ip(cfg, ip).await {
            Ok(Some(id)) => {
                tracing::info!(node = %id, pod_ip = %ip, "node id found in the dashboard's node list");
                self.remote_node = Some(id);
            }
            Ok(None) => {
                tracing::debug!(pod_ip = %ip, "no node with this IP in the dashboard's node list yet")
            }
            Err(e) => tracing::debug!(error = %e, "node id lookup through the dashboard failed"),
        }
    }

    /// Sets a node id found remotely (dashboard), used when no local source knows it.
    pub fn set_remote_node(&mut self, node: Option<String>) {
        self.remote_node = node;
    }

    /// True when a local or remote source knows the node id for `session_dir`.
    pub fn knows_node(&mut self, session_dir: &Path) -> bool {
        self.node_for(session_dir).is_some()
    }

    fn node_for(&mut self, session_dir: &Path) -> Option<String> {
        self.nodes
            .resolve_local(session_dir)
            .or_else(|| self.remote_node.clone())
    }

    /// Snapshots until `shutdown` turns true, then returns itself for the final flush.
    pub async fn run(
        mut self,
        mut sessions: watch::Receiver<Option<ActiveSession>>,
        mut shutdown: watch::Receiver<bool>,
    ) -> LogShipper {
        let (ev_tx, mut ev_rx) = mpsc::channel::<()>(1);
        let mut watcher: Option<notify::RecommendedWatcher> = None;
        let mut watched: Option<PathBuf> = None;
        let mut tick = tokio::time::interval(self.cfg.upload_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // (Re)watch the active session's logs for rotations.
            let active = sessions.borrow().clone();
            let want = active.as_ref().map(|s| s.dir.join("logs"));
            if want != watched && want.as_ref().is_some_and(|w| w.is_dir()) {
                watcher = want
                    .as_ref()
                    .and_then(|dir| watch_dir(dir, ev_tx.clone(), false));
                watched = want.clone();
            }
            tokio::select! {
                _ = tick.tick() => {
                    // A long round (a huge file) must not hold up shutdown: the final flush
                    // takes over from the ledger.
                    let stop = wait_true(shutdown.clone());
                    tokio::select! {
                        _ = self.snapshot_all(active.as_ref(), None, true) => {}
                        _ = stop => break,
                    }
                }
                Some(()) = ev_rx.recv() => {
                    // Let a burst of renames settle, then capture the new backups.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    while ev_rx.try_recv().is_ok() {}
                    if let Some(s) = &active {
                        self.capture_rotations(s).await;
                    }
                }
                r = sessions.changed() => {
                    if r.is_err() {
                        break;
                    }
                    tick.reset_immediately();
                }
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        break;
                    }
                }
            }
        }
        drop(watcher);
        self
    }

    /// One pass: the active session, then earlier sessions not finished yet.
    async fn snapshot_all(
        &mut self,
        active: Option<&ActiveSession>,
        deadline: Option<Instant>,
        earlier: bool,
    ) -> Vec<RoundReport> {
        let started = Instant::now();
        let mut reports = Vec::new();
        if let Some(s) = active {
            if let Err(e) = self.spool.ensure_marker(&s.name).await {
                tracing::warn!(session = %s.name, error = %e, "could not record the session marker");
            }
            reports.push(self.snapshot_session(s, deadline, false).await);
        }
        if earlier {
            for s in list_sessions(&self.cfg.ray_tmp) {
                if active.is_some_and(|a| a.name == s.name)
                    || self.ledger.data.finished_sessions.contains(&s.name)
                {
                    continue;
                }
                if let Err(e) = self.spool.ensure_marker(&s.name).await {
                    tracing::warn!(session = %s.name, error = %e, "could not record the session marker");
                }
                let r = self.snapshot_session(&s, deadline, false).await;
                if r.node.is_some() && r.failed == 0 && r.not_reached.is_empty() {
                    tracing::info!(session = %s.name, files = r.files, uploaded = r.uploaded, "earlier session uploaded completely");
                    self.ledger.data.finished_sessions.insert(s.name.clone());
                    self.ledger.dirty = true;
                }
                reports.push(r);
            }
        }
        self.ledger.save();
        histogram!(crate::metrics::LOG_SNAPSHOT_SECONDS).record(started.elapsed().as_secs_f64());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        gauge!(crate::metrics::LOG_LAST_SNAPSHOT).set(now);
        reports
    }

    /// Uploads every changed file of one session, most valuable first, until `deadline`.
    async fn snapshot_session(
        &mut self,
        s: &ActiveSession,
        deadline: Option<Instant>,
        rotated_only: bool,
    ) -> RoundReport {
        let mut report = RoundReport::default();
        if self.nodes.resolve_local(&s.dir).is_none() {
            self.try_remote_node().await;
        }
        let Some(node) = self.node_for(&s.dir) else {
            if self.warned_no_node.insert(s.name.clone()) {
                tracing::warn!(session = %s.name, "node id not known yet (no raylet.out line, no events, no --node-id); logs wait");
            }
            return report;
        };
        report.node = Some(node.clone());
        let logs = s.dir.join("logs");
        let mut files = match tokio::task::spawn_blocking(move || scan_logs(&logs)).await {
            Ok(f) => f,
            Err(_) => return report,
        };
        report.files = files.len();
        files.retain(|f| !rotated_only || f.rotated_from.is_some());
        // Newest first inside a priority class.
        files.sort_by(|a, b| {
            priority(a)
                .cmp(&priority(b))
                .then(b.mtime_ns.cmp(&a.mtime_ns))
        });
        // Consecutive store failures: past a few, the bucket is down, and trying every other
        // file now would only hold up rotation captures and the next round.
        let mut failed_in_a_row = 0;
        for f in files {
            if failed_in_a_row >= MAX_FAILURES_IN_A_ROW {
                report.failed += 1;
                continue;
            }
            let key = object_key(&self.prefix, &s.name, &node, &f);
            let prev = self.ledger.data.objects.get(&key).copied();
            if f.rotated_from.is_some() && prev.is_some() {
                continue; // a backup's content never changes once rotated
            }
            if prev.is_some_and(|p| p.size == f.size && p.mtime_ns == f.mtime_ns) {
                continue;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                report.not_reached.push(f.abs.clone());
                continue;
            }
            // Same size, new mtime: maybe only touched. Compare content before uploading.
            if let Some(p) = prev.filter(|p| p.size == f.size) {
                let abs = f.abs.clone();
                let size = f.size;
                if let Ok(Ok((hash, n))) =
                    tokio::task::spawn_blocking(move || hash_file_prefix(&abs, size)).await
                {
                    if hash == p.hash && n == size {
                        self.ledger.data.objects.insert(
                            key,
                            LedgerEntry {
                                mtime_ns: f.mtime_ns,
                                ..p
                            },
                        );
                        self.ledger.dirty = true;
                        continue;
                    }
                }
            }
            let upload = put_file_prefix(&self.store, &key, &f.abs, f.size, self.cfg.part_size);
            let result = match deadline {
                Some(d) => match tokio::time::timeout_at(d.into(), upload).await {
                    Ok(r) => r,
                    Err(_) => {
                        report.not_reached.push(f.abs.clone());
                        continue;
                    }
                },
                None => upload.await,
            };
            match result {
                Ok(up) => {
                    counter!(crate::metrics::LOG_FILES_UPLOADED).increment(1);
                    counter!(crate::metrics::LOG_BYTES_UPLOADED).increment(up.bytes);
                    self.ledger.data.objects.insert(
                        key,
                        LedgerEntry {
                            // What was read: a file that shrank mid-upload is retried next round.
                            size: up.bytes,
                            mtime_ns: if up.bytes == f.size { f.mtime_ns } else { 0 },
                            hash: up.hash,
                        },
                    );
                    self.ledger.dirty = true;
                    report.uploaded += 1;
                    report.bytes += up.bytes;
                    failed_in_a_row = 0;
                }
                Err(UploadError::Read { source, .. })
                    if source.kind() == io::ErrorKind::NotFound =>
                {
                    skip("vanished", &f.abs);
                }
                Err(UploadError::Read { source, path }) => {
                    skip("unreadable", &path);
                    tracing::warn!(path = %path.display(), error = %source, "log file unreadable; skipped");
                }
                Err(e) => {
                    counter!(crate::metrics::LOG_UPLOAD_FAILURES).increment(1);
                    tracing::warn!(error = %e, "log upload failed; retried next round");
                    report.failed += 1;
                    failed_in_a_row += 1;
                    continue;
                }
            }
        }
        report
    }

    /// Uploads rotated backups of the active session right away, before Ray deletes them.
    async fn capture_rotations(&mut self, s: &ActiveSession) {
        let r = self.snapshot_session(s, None, true).await;
        if r.uploaded > 0 {
            tracing::debug!(session = %s.name, uploaded = r.uploaded, "captured rotated logs");
            self.ledger.save();
        }
    }

    /// The SIGTERM flush: everything changed since the last snapshot, most valuable first,
    /// until `deadline`; returns what did not make it.
    pub async fn final_flush(
        &mut self,
        active: Option<ActiveSession>,
        deadline: Instant,
    ) -> Vec<PathBuf> {
        // A node id nobody knows still must not lose the logs: file them under the fallback.
        if let Some(s) = &active {
            if !self.knows_node(&s.dir) && self.remote_node.is_none() {
                self.remote_node = Some("unknown-node".into());
            }
        }
        let reports = self
            .snapshot_all(active.as_ref(), Some(deadline), true)
            .await;
        let mut left: Vec<PathBuf> = reports.iter().flat_map(|r| r.not_reached.clone()).collect();
        let failed: usize = reports.iter().map(|r| r.failed).sum();
        let uploaded: usize = reports.iter().map(|r| r.uploaded).sum();
        tracing::info!(
            uploaded,
            failed,
            not_reached = left.len(),
            "final log flush done"
        );
        left.sort();
        left
    }
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Watches `dir` recursively; a create or rename (or, with `any_change`, any change) sends
/// a wake-up. Failures (no inotify, watch limits) are logged and the periodic rescan
/// carries on alone.
pub(crate) fn watch_dir(
    dir: &Path,
    tx: mpsc::Sender<()>,
    any_change: bool,
) -> Option<notify::RecommendedWatcher> {
    use notify::{EventKind, RecursiveMode, Watcher};
    let handler = move |res: notify::Result<notify::Event>| {
        if let Ok(ev) = res {
            let wanted = any_change
                || matches!(
                    ev.kind,
                    EventKind::Create(_) | EventKind::Modify(notify::event::ModifyKind::Name(_))
                );
            if wanted {
                let _ = tx.try_send(());
            }
        }
    };
    match notify::recommended_watcher(handler) {
        Ok(mut w) => match w.watch(dir, RecursiveMode::Recursive) {
            Ok(()) => Some(w),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the logs directory; relying on periodic rescans");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "file watching unavailable; relying on periodic rescans");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotated_names_are_stable_and_sort_by_time() {
        let f = LogFile {
            abs: "/x".into(),
            rel: "raylet.out.1".into(),
            size: 1,
            mtime_ns: 1_795_314_700_123_456_789,
            rotated_from: Some("raylet.out".into()),
        };
        assert_eq!(
            object_key("P", "s", "n", &f),
            "P/s/n/logs/raylet.out.rotated.20261122T023140.123456789Z"
        );
        let g = LogFile {
            rotated_from: None,
            rel: "events/event_GCS.log".into(),
            ..f.clone()
        };
        assert_eq!(
            object_key("P", "s", "n", &g),
            "P/s/n/logs/events/event_GCS.log"
        );
    }

    #[test]
    fn scan_skips_odd_entries_and_marks_backups() {
        let tmp = tempfile::tempdir().unwrap();
        let logs = tmp.path();
        std::fs::write(logs.join("raylet.out"), "a").unwrap();
        std::fs::write(logs.join("raylet.out.1"), "b").unwrap();
        std::fs::write(logs.join("orphan.log.2"), "c").unwrap();
        std::fs::write(logs.join("bad name.log"), "d").unwrap();
        std::fs::create_dir(logs.join("events")).unwrap();
        std::fs::write(logs.join("events/event_GCS.log"), "e").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", logs.join("link.log")).unwrap();
        std::os::unix::fs::symlink("/etc", logs.join("linkdir")).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(logs.join("sock")).unwrap();
        let mut files = scan_logs(logs);
        files.sort_by(|a, b| a.rel.cmp(&b.rel));
        let rels: Vec<(&str, Option<&str>)> = files
            .iter()
            .map(|f| (f.rel.as_str(), f.rotated_from.as_deref()))
            .collect();
        assert_eq!(
            rels,
            [
                ("events/event_GCS.log", None),
                ("orphan.log.2", None),
                ("raylet.out", None),
                ("raylet.out.1", Some("raylet.out")),
            ]
        );
    }

    #[test]
    fn priorities() {
        let mk = |rel: &str, rot: bool| LogFile {
            abs: "/x".into(),
            rel: rel.into(),
            size: 0,
            mtime_ns: 0,
            rotated_from: rot.then(|| "b".to_string()),
        };
        assert_eq!(priority(&mk("raylet.out", false)), 0);
        assert_eq!(priority(&mk("debug_state.txt", false)), 0);
        assert_eq!(priority(&mk("raylet.out.1", true)), 1);
        assert_eq!(priority(&mk("worker-ab-01000000-1.err", false)), 2);
        assert_eq!(priority(&mk("worker-ab-01000000-1.out", false)), 3);
        assert_eq!(priority(&mk("dashboard.log", false)), 4);
    }
}
