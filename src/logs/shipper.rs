//! The log lane: a round every `--log-upload-interval` over the active session and the
//! earlier sessions not finished yet, rotations captured as they happen, and the final
//! flush at SIGTERM within the deadline. Uploads run one at a time, apart from events.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use tokio::sync::{mpsc, watch};

use super::ledger::{Ledger, LedgerEntry};
use super::scan::{object_key, priority, scan_logs, skip};
use super::{LogConfig, LogError};
use crate::events::spool::Spool;
use crate::metrics as m;
use crate::node::node_id::{NodeIdResolver, RemoteNodeLookup};
use crate::node::session::{list_sessions, ActiveSession};
use crate::storage::put::{hash_file_prefix, put_file_prefix, UploadError};
use crate::util::watch::watch_dir;

/// Store failures in a row after which a round stops trying (the bucket is down).
const MAX_FAILURES_IN_A_ROW: usize = 3;

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
    remote_lookup: Option<RemoteNodeLookup>,
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

    /// Enables the last-resort node id lookup (the dashboard's node list, by `POD_IP`).
    pub fn with_remote_lookup(mut self, lookup: RemoteNodeLookup) -> Self {
        self.remote_lookup = Some(lookup);
        self
    }

    /// Asks the remote source for this node's id, at most every 10 s, when nothing local
    /// knows it.
    async fn try_remote_node(&mut self) {
        let Some(lookup) = &self.remote_lookup else {
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
        match lookup.lookup().await {
            Ok(Some(id)) => {
                tracing::info!(node = %id, source = %lookup.source(), "node id found remotely");
                self.remote_node = Some(id);
            }
            Ok(None) => {
                tracing::debug!(source = %lookup.source(), "no node id remotely yet")
            }
            Err(e) => {
                tracing::debug!(source = %lookup.source(), error = %e, "remote node id lookup failed")
            }
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
        m::log_snapshot_done(started.elapsed());
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
                    m::log_file_uploaded(up.bytes);
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
                    m::log_upload_failure();
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
