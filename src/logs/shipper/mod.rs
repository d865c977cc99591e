//! The log lane: a round every `--log-upload-interval` over the active session and the
//! earlier sessions not finished yet, rotations captured as they happen, and the final
//! flush at SIGTERM within the deadline. Uploads run one at a time, apart from events; one
//! that outlasts its slot (an interval) goes on beside the lane, within its own deadline
//! (see [`super::lane`]), so a stuck file never holds up the others. Files whose key is
//! longer than the store takes are skipped before any upload, logged once and counted.
//! Shutdown cuts every wait of the lane (a round, a capture of rotated backups): the send
//! the lane was waiting for goes on beside the final flush, which always runs, abandons a
//! send beside it that stopped moving, and passes over the sessions until one pass finds
//! nothing to send (see [`LogShipper::final_flush`]).
//!
//! Appends: the store's refusals decide when appends are off ([`super::gate`]); an object
//! whose append is refused goes whole at once, one whose appends fail transiently is
//! retried next round and goes whole after [`super::gate::MAX_TRANSIENT_APPEND_ROUNDS`]
//! rounds in a row, or [`super::gate::MAX_TRANSIENT_APPEND_INTERVALS`] intervals since the
//! first failed append began; the final flush and earlier sessions never leave a file
//! behind because its append failed (it goes whole). An append's failure is the object's, not the store's:
//! it does not count toward [`MAX_FAILURES_IN_A_ROW`], so other files still go. A versioned
//! bucket gets no appends. At the first round the incomplete uploads an earlier run left are
//! cleaned up (S3), whether appends are on or not.
//! Each round starts checks of a few ledger entries against the bucket with a HEAD, beside
//! the lane (at most `checks::VERIFY_PER_ROUND` at once; the next round takes their
//! outcomes, no round waits for one), so an object the bucket lost, or one whose size or
//! ETag is not the ledger's (overwritten), is uploaded again.
//!
//! Layout: this file is the face ([`LogShipper`], its rounds and what one send settles);
//! `beside` keeps the sends that outlast their slot going beside the lane, and cuts the ones
//! that stall; `checks` compares the ledger with the file and the bucket (whether a file
//! only grew, whether an append can go, a few entries verified each round); `flush` is the
//! final flush at SIGTERM.

mod beside;
mod checks;
mod flush;

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use tokio::sync::{mpsc, watch};

use super::gate::AppendGate;
use super::lane::{
    slot, stall_limit, Failures, InFlight, Job, Pass, SendError, Sender, Sent, MAX_BESIDE,
    MAX_BESIDE_SMALL, MIN_SEND_DEADLINE, TEST_MIN_STALL,
};
use super::ledger::{Ledger, LedgerEntry};
use super::placement::{session_owner, SessionObjects};
use super::scan::{object_key, priority, scan_logs, skip, LogFile, NameSkips};
use super::schedule::{self, SMALL};
use super::{LogConfig, LogError};
use crate::events::spool::Spool;
use crate::metrics as m;
use crate::node::node_id::{LogNode, NodeIdResolver, RemoteNodeLookup};
use crate::node::session::{
    list_sessions, raylet_answers, settled_earlier_sessions, ActiveSession, SESSION_QUIET,
};
use crate::storage::put::UploadError;
use crate::util::escape::escape_untrusted;
use crate::util::pace::Pacer;
use crate::util::time::unix_seconds;
use crate::util::watch::watch_dir;

/// Whole-upload failures in a row after which a round stops trying (the bucket is down).
/// Each file is tried once a round and files that failed before go last (`lane::Failures`),
/// so these are different files, and the first of them had not been failing.
const MAX_FAILURES_IN_A_ROW: usize = 3;

/// Files whose too-long key was logged, at most (each is logged once; past it, counted only).
const MAX_KEYS_LOGGED: usize = 1024;

/// The final flush abandons a send beside it (one kept from before SIGTERM, or one it
/// started that outlasted its slot) that has not moved for a share of the time it had
/// left when it began (its budget, less the reserve to abort uploads): no request of it
/// ended and it did not wait for the cap (the time a request's body may be on the wire
/// does not count, `util::pace::Progress::last_moved`). Its file is sent again in the
/// next pass, so a request the store never answers costs part of the budget, not all of
/// it (review r42g G1: a kept PUT the store held made the flush wait until its deadline
/// and name the file, exit 3, where a new PUT went through at once).
///
/// The share is [`KEPT_STALL_SHARE_BARE`] while the send waits for the answer of a
/// request without a body (an UploadPartCopy, a complete, a HEAD): S3 may take seconds to
/// answer a copy of a big object, and a re-send whole would cost far more (review r42h
/// D2: a copy answered after 7 s was abandoned and the 20 MB file re-sent whole, which
/// could not finish), and once the connection took the whole body of a request (the
/// kernel's socket buffer may still hold a few MiB of it: each byte of it the store
/// acknowledges moves the send, `storage::drain`, so a body draining slowly is not
/// abandoned either; review r42i D2). It is [`KEPT_STALL_SHARE_BODY`]
/// while the connection is taking a request's body: the log lane's client counts each
/// piece it takes as progress (`storage::counted`), so a body that keeps moving is never
/// abandoned, and one the connection stopped taking is (review r42h D3: a 20 MB PUT at
/// 2 MB/s, not seen moving, was cut after 5.75 s and restarted from byte 0 every pass).
const KEPT_STALL_SHARE_BODY: u32 = 4;
/// See [`KEPT_STALL_SHARE_BODY`]: a request without a body may wait for its answer half
/// the time the flush had left.
const KEPT_STALL_SHARE_BARE: u32 = 2;

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
    /// Sends started (whatever became of them).
    pub sends: usize,
    /// Those files, each with why.
    pub failed_files: Vec<(PathBuf, String)>,
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
    /// What a send needs (the store, the appender, the lane's cap, the append gate),
    /// shared with the sends beside the lane.
    sender: Arc<Sender>,
    /// Sends that outlasted their slot and go on beside the lane (see `lane`).
    beside: Vec<InFlight>,
    /// The send the lane is waiting for in its slot. Held here, not by the round, so that a
    /// round cut by shutdown leaves it running: it goes beside and the final flush takes it
    /// over (review r42e E3: at the default interval the whole upload the lane waited for at
    /// SIGTERM was dropped with the round and the flush started it again from byte 0).
    current: Option<InFlight>,
    /// Files the final flush named failed in an earlier pass: not tried again in a later
    /// one, so that the last word on a file is the one named (see `final_flush`).
    flush_named: BTreeSet<PathBuf>,
    /// Failed sends in a row, per file: files that keep failing go last.
    failures: Failures,
    /// Files whose key is over the store's limit, logged once.
    long_keys: BTreeSet<PathBuf>,
    /// Files and directories whose name cannot be a key segment, logged and counted once.
    /// Shared with the scan's blocking task, so a round cut while it scans loses none of it.
    name_skips: Arc<Mutex<NameSkips>>,
    /// Objects the final flush uploads whole without trying an append (their append was
    /// still running beside the lane at SIGTERM).
    whole_only: BTreeSet<String>,
    /// Per object key, the file's size and inode at the last round (to count what Ray wrote).
    seen: HashMap<String, (u64, u64)>,
    /// Bytes Ray wrote to the logs and bytes uploaded for them, since the start.
    written_total: u64,
    uploaded_total: u64,
    /// Node ids whose earlier incomplete uploads were cleaned up.
    prepared_nodes: BTreeSet<String>,
    /// The last ledger key checked with a HEAD (see `checks::VERIFY_PER_ROUND`).
    verify_cursor: Option<String>,
    /// Checks of ledger entries running beside the rounds, tried again ones included (see
    /// `checks::Check`; at most `checks::VERIFY_PER_ROUND`).
    verify_checks: Vec<checks::Check>,
    /// Whether the ledger checks compare ETags (see `checks::EtagTrust`; review r42v D2).
    etag_trust: checks::EtagTrust,
    /// New keys the ledger is saved for as soon as their first upload succeeds, not at the
    /// end of the round: keys nothing on disk would name again after a kill -9 (a rotated
    /// backup's, named by its mtime then; a worker file's filed under a guessed node).
    save_on_first: BTreeSet<String>,
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
        let sender = Arc::new(Sender {
            store: cfg.body_store.clone().unwrap_or_else(|| store.clone()),
            appender: cfg.appender.clone(),
            part_size: cfg.part_size,
            pace: Pacer::new(cfg.max_bytes_per_second).map(Arc::new),
            gate: Arc::new(Mutex::new(AppendGate::default())),
            stall: stall_limit(cfg.upload_interval, test_min_stall()),
            interval: cfg.upload_interval,
        });
        Ok(LogShipper {
            sender,
            beside: Vec::new(),
            current: None,
            flush_named: BTreeSet::new(),
            failures: Failures::default(),
            long_keys: BTreeSet::new(),
            name_skips: Arc::default(),
            whole_only: BTreeSet::new(),
            seen: HashMap::new(),
            written_total: 0,
            uploaded_total: 0,
            prepared_nodes: BTreeSet::new(),
            verify_cursor: None,
            verify_checks: Vec::new(),
            etag_trust: checks::EtagTrust::default(),
            save_on_first: BTreeSet::new(),
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
                        // Cut by shutdown like a round (review r42e E4: a capture waiting
                        // one slot for a backup's send outlasted the shutdown budget, and
                        // the final flush never ran); the send goes on beside the flush.
                        let stop = wait_true(shutdown.clone());
                        tokio::select! {
                            _ = self.capture_rotations(s) => {}
                            _ = stop => break,
                        }
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
        // The send the lane was waiting for when shutdown cut it goes on beside: the final
        // flush takes its result, or cancels it if it is an append (see `final_flush`).
        if let Some(flight) = self.current.take() {
            self.beside.push(flight);
        }
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
        // What the sends beside the lane did since the last pass.
        let mut collected = self.collect_beside(None).await;
        if deadline.is_some() {
            // The final flush's pass below sends every changed file again, these too: a
            // failure of theirs is named only if that send fails as well (review r42g G2: a
            // file re-sent equal after its kept send failed was still named, exit 3).
            collected.failed = 0;
            collected.failed_files.clear();
        }
        let mut reports = vec![collected];
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
        // Files no writer can be told for stay under one node for the whole session.
        let owner = session_owner(&mut self.ledger, &mut self.nodes, &s.name, &s.dir, &node);
        self.prepare_appends(&owner).await;
        let placed = SessionObjects::of(&self.ledger, &self.prefix, &s.name);
        if how == Pass::Scheduled {
            self.verify_some();
        }
        let session_dir = s.dir.clone();
        let names = Arc::clone(&self.name_skips);
        let scanned = tokio::task::spawn_blocking(move || {
            let mut names = names.lock().unwrap_or_else(PoisonError::into_inner);
            scan_logs(&session_dir, &mut names)
        })
        .await;
        let mut files = match scanned {
            Ok(f) => f,
            Err(_) => return report,
        };
        report.files = files.len();
        files.retain(|f| how != Pass::RotatedOnly || f.rotated_from.is_some());
        // Files whose last send failed go last, the one tried longest ago first (see `lane`).
        files.sort_by_key(|f| (self.failures.place(&f.abs), upload_order(f, how)));
        // Consecutive store failures: past a few, the bucket is down, and trying every other
        // file now would only hold up rotation captures and the next round.
        let mut failed_in_a_row = 0;
        for f in files {
            // Named failed by an earlier pass of the final flush: its last word stands.
            if deadline.is_some() && self.flush_named.contains(&f.abs) {
                continue;
            }
            if failed_in_a_row >= MAX_FAILURES_IN_A_ROW {
                report.failed += 1;
                report.failed_files.push((
                    f.abs.clone(),
                    format!("not tried: {MAX_FAILURES_IN_A_ROW} uploads failed in a row before it"),
                ));
                continue;
            }
            // Under the node whose raylet wrote it, where that can be told.
            let writer = f.rotated_from.as_deref().unwrap_or(&f.rel);
            let told = self.nodes.node_of_log(&s.dir, writer);
            // Placed by a guess (see `placement`): its key must be on disk as soon as it
            // exists, or a restart guesses again.
            let guessed = matches!(told, LogNode::Unnamed | LogNode::Wait);
            let file_node = match told {
                // A file already uploaded in this session stays under the node its object
                // has (a worker's output filed before its core worker log named the node).
                LogNode::Writer(n) => placed.node_of(writer).map_or(n, str::to_string),
                LogNode::Session => owner.clone(),
                LogNode::Wait if deadline.is_none() => {
                    report.waiting += 1;
                    continue;
                }
                // A worker's file whose node was not told in time, or still held at the final
                // flush (which cannot wait): the best node known (see `placement`).
                LogNode::Unnamed | LogNode::Wait => {
                    placed.node_of(writer).unwrap_or(&node).to_string()
                }
            };
            let f = LogFile {
                uploaded_as: self.backup_key(&placed, &file_node, &f).await,
                ..f
            };
            let key = object_key(&self.prefix, &s.name, &file_node, &f);
            if key.len() > self.cfg.max_key_bytes
                || key.split('/').any(|n| n.len() > self.cfg.max_name_bytes)
            {
                self.refuse_long_key(&f, &key);
                continue;
            }
            let prev = self.ledger.data.objects.get(&key).cloned();
            if prev.is_none() && (guessed || f.rotated_from.is_some()) {
                self.save_on_first.insert(key.clone());
            }
            if f.rotated_from.is_none() {
                self.count_written(&key, &f, prev.as_ref());
            }
            if prev
                .as_ref()
                .is_some_and(|p| p.size == f.size && p.mtime_ns == f.mtime_ns)
            {
                continue;
            }
            // Its send is still running beside the lane: not again until it ends (at the
            // final flush, after the other files: then what the file grew since that send
            // began is sent).
            if self.beside.iter().any(|b| b.key == key) {
                report.waiting += 1;
                continue;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                report.not_reached.push(f.abs.clone());
                continue;
            }
            // Same size, new mtime: maybe only touched. Compare every byte before calling it
            // unchanged (a file rewritten with the same size, head and last bytes is another).
            if let Some(p) = prev.as_ref().filter(|p| p.size == f.size) {
                if self.file_still_whole(&f, p).await {
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
                Some(p) => self.can_append(&key, &f, p, how).await.then_some(p.size),
                None => None,
            };
            if how == Pass::Scheduled && append_from.is_none() {
                let age = Duration::from_secs(
                    unix_seconds().saturating_sub(prev.as_ref().map_or(0, |p| p.uploaded_at)),
                );
                // Another file under the same name: another inode, or another head (a file
                // truncated and rewritten in place) goes now, whole, replacing the object.
                let replaced = match prev.as_ref() {
                    Some(p) => (p.ino != 0 && p.ino != f.ino) || !self.head_matches(&f, p).await,
                    None => false,
                };
                // An entry from a ledger before version 5 has no hash of every byte, so its
                // object is not appended to: it goes whole once, now, rather than wait for
                // the schedule (up to an interval per MiB), and is appended to after that.
                let unverified = prev
                    .as_ref()
                    .is_some_and(|p| p.full.is_none() && self.appends_could_take(p));
                let due = schedule::due(
                    prev.as_ref().map(|p| p.size),
                    age,
                    f.size,
                    self.cfg.upload_interval,
                    replaced || unverified,
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
            let job = Job {
                key: key.clone(),
                file: f.clone(),
                append_from,
                e_tag: prev.as_ref().and_then(|p| p.e_tag.clone()),
                full: prev.as_ref().and_then(|p| p.full),
                how,
                hard_deadline: deadline,
            };
            // No room beside the lane: a big send waits for room (next round, or the final
            // flush's next pass) instead of holding the lane up behind it (review r42e E6);
            // a small one may take one of the places kept for small sends.
            let sending = append_from.map_or(f.size, |from| f.size.saturating_sub(from));
            if self.beside.len() >= MAX_BESIDE && sending > SMALL {
                report.waiting += 1;
                continue;
            }
            let room = if sending > SMALL {
                MAX_BESIDE
            } else {
                MAX_BESIDE + MAX_BESIDE_SMALL
            };
            // The lane waits for it one slot (never past the deadline), then goes on beside it.
            let mut wait = slot(self.cfg.upload_interval);
            if let Some(d) = deadline {
                // The final flush: a quarter of what is left at most, so one hanging file
                // leaves the others most of the time.
                wait = wait.min(d.saturating_duration_since(Instant::now()) / 4);
            }
            // Held in `self.current` while the lane waits: shutdown may cut the round here.
            report.sends += 1;
            let flight = self.current.insert(InFlight::start(&self.sender, job));
            let waited = flight.wait(Some(wait)).await;
            let Some(flight) = self.current.take() else {
                continue;
            };
            let result = match waited {
                Some(r) => r,
                None if self.beside.len() < room => {
                    tracing::info!(path = %f.abs.display(), %key, appending = flight.appending,
                    slot_s = wait.as_secs_f64(),
                    "log upload still running after its slot; the lane goes on beside it");
                    self.beside.push(flight);
                    report.waiting += 1;
                    continue;
                }
                // No room beside, even for a small send (a black hole towards the store):
                // dropped and tried again next round or pass; the lane never waits for one
                // send past its slot.
                None => {
                    tracing::info!(path = %f.abs.display(), %key, slot_s = wait.as_secs_f64(),
                        beside = self.beside.len(),
                        "log upload still running after its slot and no room beside the lane; \
                         dropped, tried again later");
                    flight.cancel().await;
                    report.waiting += 1;
                    continue;
                }
            };
            match self.settle(&key, &f.abs, result, &mut report) {
                Settled::Uploaded => failed_in_a_row = 0,
                Settled::Failed => failed_in_a_row += 1,
                Settled::Skipped | Settled::AppendFailed => {}
            }
        }
        report
    }

    /// Takes the result of one send: the ledger, the counts, the file's failures.
    fn settle(
        &mut self,
        key: &str,
        path: &Path,
        result: Result<Sent, SendError>,
        report: &mut RoundReport,
    ) -> Settled {
        let path = path.to_path_buf();
        let first = self.save_on_first.remove(key);
        match result {
            Ok((entry, sent, appended)) => {
                self.uploaded_total += sent;
                self.ledger.data.objects.insert(key.to_string(), entry);
                self.ledger.dirty = true;
                if first {
                    // Its key must survive a kill -9 (see `save_on_first`).
                    self.ledger.save();
                }
                report.uploaded += 1;
                report.appended += usize::from(appended);
                report.bytes += sent;
                self.failures.cleared(&path);
                Settled::Uploaded
            }
            Err(SendError::Upload(UploadError::Read { source, .. }))
                if source.kind() == io::ErrorKind::NotFound =>
            {
                skip("vanished", &path);
                self.failures.cleared(&path);
                Settled::Skipped
            }
            Err(SendError::Upload(UploadError::Read { source, path }))
                if source.kind() == io::ErrorKind::InvalidInput =>
            {
                skip("not_a_regular_file", &path);
                tracing::warn!(path = %path.display(), error = %source, "log file is no longer a regular file (a symlink swapped in?); not followed, skipped");
                Settled::Skipped
            }
            Err(SendError::Upload(UploadError::Read { source, path })) => {
                skip("unreadable", &path);
                tracing::warn!(path = %path.display(), error = %source, "log file unreadable; skipped");
                Settled::Skipped
            }
            Err(SendError::Upload(e @ UploadError::Append { .. })) => {
                // This object's append, not the store: the other files still go.
                tracing::warn!(error = %e, "log append failed; retried next round");
                report.failed += 1;
                report.failed_files.push((path.clone(), e.to_string()));
                self.failures.failed(&path);
                Settled::AppendFailed
            }
            Err(e) => {
                m::log_upload_failure();
                let failed = self.failures.failed(&path);
                tracing::warn!(error = %e, path = %path.display(), failed_in_a_row = failed,
                    "log upload failed; retried next round");
                report.failed += 1;
                report.failed_files.push((path, e.to_string()));
                Settled::Failed
            }
        }
    }

    /// A file whose key, or a name in it, is longer than the store allows: skipped, logged
    /// once, counted.
    fn refuse_long_key(&mut self, f: &LogFile, key: &str) {
        skip("key_too_long", &f.abs);
        if self.long_keys.len() < MAX_KEYS_LOGGED && self.long_keys.insert(f.abs.clone()) {
            let longest_name = key.split('/').map(str::len).max().unwrap_or(0);
            tracing::warn!(path = %escape_untrusted(&f.abs.to_string_lossy()),
                key_bytes = key.len(), limit = self.cfg.max_key_bytes,
                longest_name_bytes = longest_name, name_limit = self.cfg.max_name_bytes,
                "log file not uploaded: its object key, or a name in it, is longer than the \
                 store allows (rhc_log_files_skipped_total{{reason=\"key_too_long\"}}); \
                 logged once");
        }
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

    /// Uploads rotated backups of the active session right away, before Ray deletes them.
    async fn capture_rotations(&mut self, s: &ActiveSession) {
        let r = self.snapshot_session(s, None, Pass::RotatedOnly).await;
        if r.uploaded > 0 {
            tracing::debug!(session = %s.name, uploaded = r.uploaded, "captured rotated logs");
            self.ledger.save();
        }
    }
}

/// What became of one send, for the round's failures in a row.
#[derive(Debug, PartialEq, Eq)]
enum Settled {
    Uploaded,
    /// The file is gone or unreadable: not the store's failure.
    Skipped,
    /// Its append failed transiently: the object's, not the store's.
    AppendFailed,
    Failed,
}

/// The order of a pass. A live round: small files first (cheap, and kept fresh), by what
/// explains a failure first and then newest first; then the big ones, smallest first, so
/// one huge file cannot hold up the rest. The final flush and earlier sessions: what
/// explains a failure first, newest first, whatever the size.
fn upload_order(f: &LogFile, how: Pass) -> (bool, u8, u64, i64) {
    let big = how == Pass::Scheduled && f.size > SMALL;
    (big, priority(f), if big { f.size } else { 0 }, -f.mtime_ns)
}

/// The floor of a send's stall limit: [`MIN_SEND_DEADLINE`], or [`TEST_MIN_STALL`]'s seconds
/// in tests (a value that is not a number is ignored with a warning).
fn test_min_stall() -> Duration {
    match std::env::var(TEST_MIN_STALL) {
        Ok(v) => match v.parse::<u64>() {
            Ok(secs) => Duration::from_secs(secs),
            Err(e) => {
                tracing::warn!(value = %v, error = %e, "{TEST_MIN_STALL} is not a number of seconds; ignored");
                MIN_SEND_DEADLINE
            }
        },
        Err(_) => MIN_SEND_DEADLINE,
    }
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
