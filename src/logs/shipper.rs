//! The log lane: a round every `--log-upload-interval` over the active session and the
//! earlier sessions not finished yet, rotations captured as they happen, and the final
//! flush at SIGTERM within the deadline. Uploads run one at a time, apart from events.
//!
//! Appends: the store's refusals decide when appends are off ([`super::gate`]); an object
//! whose append is refused goes whole at once, one whose appends fail transiently is
//! retried next round and goes whole after [`super::gate::MAX_TRANSIENT_APPEND_ROUNDS`]
//! rounds in a row; the final flush and earlier sessions never leave a file behind because
//! its append failed (it goes whole). An append's failure is the object's, not the store's:
//! it does not count toward [`MAX_FAILURES_IN_A_ROW`], so other files still go. A versioned
//! bucket gets no appends. At the first round the incomplete uploads an earlier run left are
//! cleaned up (S3), whether appends are on or not.
//! Each round checks [`VERIFY_PER_ROUND`] ledger entries against the
//! bucket with a HEAD, so an object the bucket lost is uploaded again.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::{ObjectStore, ObjectStoreExt};
use tokio::sync::{mpsc, watch};

use super::gate::{AppendGate, Change, APPENDS_RETRY_AFTER, MAX_TRANSIENT_APPEND_ROUNDS};
use super::ledger::{Ledger, LedgerEntry};
use super::scan::{object_key, priority, scan_logs, skip, LogFile};
use super::schedule::{self, SMALL};
use super::{LogConfig, LogError};
use crate::events::spool::Spool;
use crate::metrics as m;
use crate::node::node_id::{LogNode, NodeIdResolver, RemoteNodeLookup};
use crate::node::session::{
    list_sessions, raylet_answers, settled_earlier_sessions, ActiveSession, SESSION_QUIET,
};
use crate::storage::append::AppendError;
use crate::storage::put::{put_file_prefix, window_hash, UploadError};
use crate::util::pace::Pacer;
use crate::util::time::unix_seconds;
use crate::util::watch::watch_dir;

/// Whole-upload failures in a row after which a round stops trying (the bucket is down).
const MAX_FAILURES_IN_A_ROW: usize = 3;

/// Ledger entries checked with a HEAD each round, in turn: a file the ledger calls uploaded
/// but the bucket lost (emptied, expired by a lifecycle rule) is uploaded again within
/// `ledger size / VERIFY_PER_ROUND` rounds, for a few cheap requests per round.
const VERIFY_PER_ROUND: usize = 8;

/// Of the shutdown budget, what is kept at the end of the final flush to abort the
/// multipart upload of an append the deadline cut short (at most this, at most a quarter).
const ABORT_RESERVE: Duration = Duration::from_secs(2);

/// Result of one pass over a session.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RoundReport {
    /// Files found.
    pub files: usize,
    /// Files uploaded.
    pub uploaded: usize,
    /// Bytes uploaded.
    pub bytes: u64,
    /// Of those, files sent as an append of their new bytes.
    pub appended: usize,
    /// Changed files the schedule holds back this round (see `schedule`).
    pub waiting: usize,
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
    /// The log lane's bandwidth cap.
    pace: Option<Pacer>,
    /// Per object key, the file's size and inode at the last round (to count what Ray wrote).
    seen: HashMap<String, (u64, u64)>,
    /// Bytes Ray wrote to the logs and bytes uploaded for them, since the start.
    written_total: u64,
    uploaded_total: u64,
    /// Whether appends are on, from the store's refusals (see [`super::gate`]).
    gate: std::sync::Mutex<AppendGate>,
    /// Node ids whose earlier incomplete uploads were cleaned up.
    prepared_nodes: BTreeSet<String>,
    /// The last ledger key checked with a HEAD (see [`VERIFY_PER_ROUND`]).
    verify_cursor: Option<String>,
}

impl LogShipper {
    /// Loads the ledger; nothing is uploaded until [`LogShipper::run`].
    pub fn new(
        cfg: LogConfig,
        store: Arc<dyn ObjectStore>,
        spool: Spool,
        nodes: NodeIdResolver,
    ) -> Result<LogShipper, LogError> {
        let ledger = Ledger::load(cfg.state_dir.join("log-ledger.json"), &cfg.bucket)?;
        let prefix = cfg.layout.history_prefix();
        let pace = Pacer::new(cfg.max_bytes_per_second);
        Ok(LogShipper {
            pace,
            seen: HashMap::new(),
            written_total: 0,
            uploaded_total: 0,
            gate: std::sync::Mutex::new(AppendGate::default()),
            prepared_nodes: BTreeSet::new(),
            verify_cursor: None,
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
            // Live rounds follow the schedule; the final flush sends everything.
            let how = if deadline.is_none() {
                Pass::Scheduled
            } else {
                Pass::Everything
            };
            reports.push(self.snapshot_session(s, deadline, how).await);
        }
        if earlier {
            // Every other session not finished yet (live rounds: the older ones) is sent; it
            // is finished once sent completely, older than the active one, quiet, and no
            // raylet answers on its socket (two raylets can share one tmp dir).
            let settled: BTreeSet<String> =
                settled_earlier_sessions(&self.cfg.ray_tmp, active, SESSION_QUIET)
                    .into_iter()
                    .map(|s| s.name)
                    .collect();
            let others = list_sessions(&self.cfg.ray_tmp)
                .into_iter()
                .filter(|s| deadline.is_some() || active.is_some_and(|a| s.name < a.name));
            for s in others {
                if active.is_some_and(|a| a.name == s.name)
                    || self.ledger.data.finished_sessions.contains(&s.name)
                {
                    continue;
                }
                if let Err(e) = self.spool.ensure_marker(&s.name).await {
                    tracing::warn!(session = %s.name, error = %e, "could not record the session marker");
                }
                // One still written to follows the schedule like the active one.
                let how = if deadline.is_some() || settled.contains(&s.name) {
                    Pass::Everything
                } else {
                    Pass::Scheduled
                };
                let r = self.snapshot_session(&s, deadline, how).await;
                let complete =
                    r.node.is_some() && r.failed == 0 && r.waiting == 0 && r.not_reached.is_empty();
                if complete && settled.contains(&s.name) && !raylet_answers(&s.dir).await {
                    tracing::info!(session = %s.name, files = r.files, uploaded = r.uploaded, "earlier session uploaded completely");
                    self.ledger.data.finished_sessions.insert(s.name.clone());
                    self.ledger.dirty = true;
                }
                reports.push(r);
            }
        }
        self.ledger.save();
        m::log_snapshot_done(started.elapsed());
        m::log_amplification(self.uploaded_total, self.written_total);
        if deadline.is_none() {
            m::log_files_waiting(reports.iter().map(|r| r.waiting).sum());
        }
        reports
    }

    /// Uploads the changed files of one session that `how` asks for, most valuable and
    /// smallest first, until `deadline`.
    async fn snapshot_session(
        &mut self,
        s: &ActiveSession,
        deadline: Option<Instant>,
        how: Pass,
    ) -> RoundReport {
        let started = Instant::now();
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
        self.prepare_appends(&node).await;
        if how == Pass::Scheduled {
            self.verify_some().await;
        }
        let session_dir = s.dir.clone();
        let mut files = match tokio::task::spawn_blocking(move || scan_logs(&session_dir)).await {
            Ok(f) => f,
            Err(_) => return report,
        };
        report.files = files.len();
        files.retain(|f| how != Pass::RotatedOnly || f.rotated_from.is_some());
        files.sort_by_key(|f| upload_order(f, how));
        // Consecutive store failures: past a few, the bucket is down, and trying every other
        // file now would only hold up rotation captures and the next round.
        let mut failed_in_a_row = 0;
        for f in files {
            if failed_in_a_row >= MAX_FAILURES_IN_A_ROW {
                report.failed += 1;
                continue;
            }
            // Under the node whose raylet wrote it, where that can be told.
            let writer = f.rotated_from.as_deref().unwrap_or(&f.rel);
            let file_node = match self.nodes.node_of_log(&s.dir, writer) {
                LogNode::Writer(n) => n,
                LogNode::Session => node.clone(),
                // The final flush cannot wait: the session's node rather than nothing.
                LogNode::Wait if deadline.is_some() => node.clone(),
                LogNode::Wait => {
                    report.waiting += 1;
                    continue;
                }
            };
            let key = object_key(&self.prefix, &s.name, &file_node, &f);
            let prev = self.ledger.data.objects.get(&key).cloned();
            if f.rotated_from.is_none() {
                self.count_written(&key, &f, prev.as_ref());
            }
            if f.rotated_from.is_some() && prev.is_some() {
                continue; // a backup's content never changes once rotated
            }
            if prev
                .as_ref()
                .is_some_and(|p| p.size == f.size && p.mtime_ns == f.mtime_ns)
            {
                continue;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                report.not_reached.push(f.abs.clone());
                continue;
            }
            // Same size, new mtime: maybe only touched. Compare before uploading.
            if let Some(p) = prev.as_ref().filter(|p| p.size == f.size) {
                if self.file_still_matches(&f, p).await {
                    let mut entry = p.clone();
                    entry.mtime_ns = f.mtime_ns;
                    self.ledger.data.objects.insert(key, entry);
                    self.ledger.dirty = true;
                    continue;
                }
            }
            // What only grew is appended where the store can; that costs only the new bytes,
            // so it is not held back by the schedule.
            let append_from = match &prev {
                Some(p) => self.can_append(&key, &f, p).await.then_some(p.size),
                None => None,
            };
            if how == Pass::Scheduled && append_from.is_none() {
                let age = Duration::from_secs(
                    unix_seconds().saturating_sub(prev.as_ref().map_or(0, |p| p.uploaded_at)),
                );
                let replaced = prev.as_ref().is_some_and(|p| p.ino != 0 && p.ino != f.ino);
                let due = schedule::due(
                    prev.as_ref().map(|p| p.size),
                    age,
                    f.size,
                    self.cfg.upload_interval,
                    replaced,
                );
                if !due.now() {
                    report.waiting += 1;
                    continue;
                }
                // A round that has used its interval leaves big files to the next one,
                // where the small ones go first again.
                if f.size > SMALL && started.elapsed() >= self.cfg.upload_interval {
                    report.waiting += 1;
                    continue;
                }
                tracing::trace!(path = %f.abs.display(), ?due, "log file due");
            }
            let result = match deadline {
                Some(d) => {
                    match tokio::time::timeout_at(d.into(), self.send(&key, &f, append_from, how))
                        .await
                    {
                        Ok(r) => r,
                        Err(_) => {
                            report.not_reached.push(f.abs.clone());
                            continue;
                        }
                    }
                }
                None => self.send(&key, &f, append_from, how).await,
            };
            match result {
                Ok((entry, sent, appended)) => {
                    m::log_file_uploaded(sent, appended);
                    self.uploaded_total += sent;
                    self.ledger.data.objects.insert(key, entry);
                    self.ledger.dirty = true;
                    report.uploaded += 1;
                    report.appended += usize::from(appended);
                    report.bytes += sent;
                    failed_in_a_row = 0;
                }
                Err(UploadError::Read { source, .. })
                    if source.kind() == io::ErrorKind::NotFound =>
                {
                    skip("vanished", &f.abs);
                }
                Err(UploadError::Read { source, path })
                    if source.kind() == io::ErrorKind::InvalidInput =>
                {
                    skip("not_a_regular_file", &path);
                    tracing::warn!(path = %path.display(), error = %source, "log file is no longer a regular file (a symlink swapped in?); not followed, skipped");
                }
                Err(UploadError::Read { source, path }) => {
                    skip("unreadable", &path);
                    tracing::warn!(path = %path.display(), error = %source, "log file unreadable; skipped");
                }
                Err(e @ UploadError::Append { .. }) => {
                    // This object's append, not the store: the other files still go.
                    tracing::warn!(error = %e, "log append failed; retried next round");
                    report.failed += 1;
                    continue;
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

    /// Counts what Ray wrote to a live file since the last round saw it.
    fn count_written(&mut self, key: &str, f: &LogFile, prev: Option<&LedgerEntry>) {
        let ino = f.ino;
        let before = match self.seen.get(key) {
            Some(&(size, seen_ino)) if seen_ino == ino => size,
            Some(_) => 0,
            // First sight since the start: what the bucket has of the same file was
            // written before.
            None => prev.filter(|p| p.ino == ino).map_or(0, |p| p.size),
        };
        let grew = if f.size >= before {
            f.size - before
        } else {
            f.size
        };
        self.written_total += grew;
        m::log_bytes_written(grew);
        self.seen.insert(key.to_string(), (f.size, ino));
    }

    /// True when the file still has the bytes the ledger recorded before `p.size` (same
    /// inode, same hash of the window before that point).
    async fn file_still_matches(&self, f: &LogFile, p: &LedgerEntry) -> bool {
        if p.ino != 0 && p.ino != f.ino {
            return false;
        }
        let file = f.file.clone();
        let size = p.size;
        match tokio::task::spawn_blocking(move || window_hash(&file, size)).await {
            Ok(Ok((hash, whole))) => {
                m::log_bytes_read(size.min(crate::storage::put::WINDOW));
                whole && hash == p.hash
            }
            _ => false,
        }
    }

    /// Once per node id: what appends cost in this bucket (a versioned bucket turns them
    /// off) and the cleanup of incomplete uploads an earlier run left under the node.
    async fn prepare_appends(&mut self, node: &str) {
        let Some(app) = &self.cfg.appender else {
            return;
        };
        // The cleanup runs whatever the log settings; the versioning matters to appends.
        if !self.prepared_nodes.insert(node.to_string()) {
            return;
        }
        let first = self.prepared_nodes.len() == 1;
        let p = app.prepare(&self.prefix, node).await;
        if p.aborted > 0 || p.abort_failed > 0 {
            tracing::info!(
                aborted = p.aborted,
                failed = p.abort_failed,
                node,
                "incomplete multipart uploads of an earlier run cleaned up"
            );
        }
        // `Suspended` replaces the `null` version instead of keeping it: appends cost
        // nothing extra there (see `storage::append`).
        if let Some(status) = p
            .versioned
            .filter(|s| first && self.cfg.appends && s.as_str() == "Enabled")
        {
            self.gate().set_versioned();
            tracing::warn!(
                versioning = %status,
                "the bucket keeps object versions: every append would keep the whole previous \
                 object as a noncurrent version (a log appended N times stores about N times its \
                 size), so appends are off and growing logs go whole on the schedule; a \
                 lifecycle rule expiring noncurrent versions bounds what the schedule's uploads keep"
            );
        }
        let on = self.cfg.appends && self.gate().on(Instant::now());
        m::log_appends_enabled(on);
    }

    fn gate(&self) -> std::sync::MutexGuard<'_, AppendGate> {
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A few ledger entries checked with a HEAD (see [`VERIFY_PER_ROUND`]): an entry whose
    /// object is gone is dropped, so the file is uploaded again.
    async fn verify_some(&mut self) {
        use std::ops::Bound::{Excluded, Unbounded};
        let from = match &self.verify_cursor {
            Some(k) => Excluded(k.clone()),
            None => Unbounded,
        };
        let mut keys: Vec<String> = self
            .ledger
            .data
            .objects
            .range::<String, _>((from, Unbounded))
            .take(VERIFY_PER_ROUND)
            .map(|(k, _)| k.clone())
            .collect();
        if keys.len() < VERIFY_PER_ROUND {
            // Wrap around to the start, without checking a key twice in one round.
            let more: Vec<String> = self
                .ledger
                .data
                .objects
                .keys()
                .take(VERIFY_PER_ROUND - keys.len())
                .filter(|k| !keys.contains(k))
                .cloned()
                .collect();
            keys.extend(more);
        }
        for key in keys {
            self.verify_cursor = Some(key.clone());
            let Ok(location) = object_store::path::Path::parse(&key) else {
                continue;
            };
            match self.store.head(&location).await {
                Err(object_store::Error::NotFound { .. }) => {
                    tracing::warn!(%key, "the bucket lost an object the ledger recorded; uploading it again");
                    self.ledger.data.objects.remove(&key);
                    // Its session is not complete in the bucket any more.
                    let session = key
                        .strip_prefix(&format!("{}/", self.prefix))
                        .and_then(|rest| rest.split('/').next())
                        .unwrap_or_default()
                        .to_string();
                    self.ledger.data.finished_sessions.remove(&session);
                    self.ledger.dirty = true;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(%key, error = %e, "checking a ledger entry failed");
                    break;
                }
            }
        }
    }

    /// True when `f` only grew since the ledger's upload and the store can append to its
    /// object.
    async fn can_append(&self, key: &str, f: &LogFile, p: &LedgerEntry) -> bool {
        let Some(app) = self.cfg.appender.as_ref().filter(|_| self.cfg.appends) else {
            return false;
        };
        let (allowed, change) = self.gate().allows(key, Instant::now());
        if change == Change::TurnedOn {
            tracing::info!("trying appends again after the store's refusals turned them off");
            m::log_appends_enabled(true);
        }
        if !allowed {
            return false;
        }
        f.rotated_from.is_none()
            && f.size > p.size
            && p.size > 0
            && p.size >= app.min_object_bytes()
            && p.ino != 0
            && p.e_tag.is_some()
            && self.file_still_matches(f, p).await
    }

    /// Appends the new bytes of `f` (from `append_from`) or uploads it whole; returns the
    /// new ledger entry, the bytes sent and whether it was an append. An append that cannot
    /// be made (the object changed, the store refused it) falls back to a whole upload at
    /// once; a transient failure does too in a pass that sends everything (`how`: the final
    /// flush, earlier sessions) and after [`super::gate::MAX_TRANSIENT_APPEND_ROUNDS`] in a
    /// row; otherwise it is left to the next round.
    async fn send(
        &self,
        key: &str,
        f: &LogFile,
        append_from: Option<u64>,
        how: Pass,
    ) -> Result<(LedgerEntry, u64, bool), UploadError> {
        let ino = f.ino;
        let mut gave_up = false;
        if let (Some(from), Some(app)) = (append_from, &self.cfg.appender) {
            let e_tag = self
                .ledger
                .data
                .objects
                .get(key)
                .and_then(|p| p.e_tag.clone());
            match app
                .append(
                    key,
                    &f.file,
                    from,
                    f.size,
                    e_tag.as_deref(),
                    self.pace.as_ref(),
                )
                .await
            {
                Ok(done) => {
                    self.gate().succeeded(key);
                    m::log_bytes_read(done.bytes);
                    let entry = self.entry_for(f, from + done.bytes, ino, done.e_tag).await;
                    return Ok((entry, done.bytes, true));
                }
                Err(AppendError::Changed { key, why }) => {
                    m::log_append_failure("changed");
                    tracing::info!(%key, %why, "log object not as recorded; uploading it whole");
                }
                Err(AppendError::Read { path, source }) => {
                    return Err(UploadError::Read { path, source })
                }
                Err(AppendError::Unavailable { key, message }) => {
                    m::log_append_failure("transient");
                    if how != Pass::Scheduled {
                        // Nothing after this pass: the file goes whole, now.
                        tracing::warn!(%key, %message, "log append failed; uploading the file whole");
                    } else if self.gate().failed_transiently(&key) {
                        gave_up = true;
                        tracing::warn!(%key, %message, rounds = MAX_TRANSIENT_APPEND_ROUNDS,
                            "appending to this object failed {MAX_TRANSIENT_APPEND_ROUNDS} rounds \
                             in a row; uploading the file whole (it goes whole on the schedule \
                             for an hour)");
                    } else {
                        // The store may be back next round: no whole upload now (it would
                        // meet the same outage), and appends stay on.
                        return Err(UploadError::Append { key, message });
                    }
                }
                Err(AppendError::Refused {
                    key,
                    unsupported,
                    message,
                }) => {
                    m::log_append_failure(if unsupported {
                        "unsupported"
                    } else {
                        "refused"
                    });
                    let (refused, change) = self.gate().refused(&key, Instant::now());
                    tracing::warn!(%key, %message, unsupported,
                        "the store refused the append; uploading the file whole (this \
                         object goes whole on the schedule for an hour)");
                    if change == Change::TurnedOff {
                        m::log_appends_enabled(false);
                        tracing::warn!(
                            refused,
                            retry_in_s = APPENDS_RETRY_AFTER.as_secs(),
                            "the store refused appends {refused} times in a row: log files go \
                             whole on the schedule, and appends are tried again later \
                             (--log-appends false skips trying)"
                        );
                    }
                }
            }
        }
        let up = put_file_prefix(
            &self.store,
            key,
            &f.file,
            f.size,
            self.cfg.part_size,
            self.pace.as_ref(),
        )
        .await?;
        if gave_up {
            self.gate().gave_up_appending(key, Instant::now());
        }
        m::log_bytes_read(up.bytes);
        let entry = self.entry_for(f, up.bytes, ino, up.e_tag).await;
        Ok((entry, up.bytes, false))
    }

    /// The ledger entry after `size` bytes of `f` are in the bucket.
    async fn entry_for(
        &self,
        f: &LogFile,
        size: u64,
        ino: u64,
        e_tag: Option<String>,
    ) -> LedgerEntry {
        let file = f.file.clone();
        let hash = match tokio::task::spawn_blocking(move || window_hash(&file, size)).await {
            Ok(Ok((h, true))) => {
                m::log_bytes_read(size.min(crate::storage::put::WINDOW));
                h
            }
            // Unreadable now: a hash that matches nothing makes the next round upload it.
            _ => 0,
        };
        LedgerEntry {
            size,
            // What was read: a file that changed size mid-upload is looked at next round.
            mtime_ns: if size == f.size { f.mtime_ns } else { 0 },
            hash,
            ino,
            uploaded_at: unix_seconds(),
            e_tag,
        }
    }

    /// Uploads rotated backups of the active session right away, before Ray deletes them.
    async fn capture_rotations(&mut self, s: &ActiveSession) {
        let r = self.snapshot_session(s, None, Pass::RotatedOnly).await;
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
                self.remote_node = Some(crate::storage::append::UNKNOWN_NODE.into());
            }
        }
        // Keep the end of the budget to abort an append the deadline cuts short.
        let reserve = ABORT_RESERVE.min(deadline.saturating_duration_since(Instant::now()) / 4);
        let flush_deadline = deadline.checked_sub(reserve).unwrap_or(deadline);
        let reports = self
            .snapshot_all(active.as_ref(), Some(flush_deadline), true)
            .await;
        let dropped = crate::storage::put::wait_dropped_aborts(deadline).await;
        if let Some(app) = &self.cfg.appender {
            let mut left = app.abort_pending(deadline).await + dropped;
            // What a cancelled creation may have left (its id never came back): the lane is
            // done, so any log upload under our node is an orphan now.
            for node in &self.prepared_nodes {
                match tokio::time::timeout_at(
                    deadline.into(),
                    app.abort_node_log_uploads(&self.prefix, node),
                )
                .await
                {
                    Ok((_, failed)) => left += failed,
                    Err(_) => {
                        left += 1;
                        break;
                    }
                }
            }
            if left > 0 {
                tracing::warn!(
                    left,
                    "incomplete multipart uploads left at exit; the next start aborts them"
                );
            }
        }
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

/// Which files a pass over a session uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// A live round: changed files when the schedule says so (appends always).
    Scheduled,
    /// Everything not in the bucket yet (final flush, earlier sessions).
    Everything,
    /// Rotated backups only, right after Ray rotated.
    RotatedOnly,
}

/// The order of a pass. A live round: small files first (cheap, and kept fresh), by what
/// explains a failure first and then newest first; then the big ones, smallest first, so
/// one huge file cannot hold up the rest. The final flush and earlier sessions: what
/// explains a failure first, newest first, whatever the size.
fn upload_order(f: &LogFile, how: Pass) -> (bool, u8, u64, i64) {
    let big = how == Pass::Scheduled && f.size > SMALL;
    (big, priority(f), if big { f.size } else { 0 }, -f.mtime_ns)
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
