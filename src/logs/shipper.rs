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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use object_store::{ObjectStore, ObjectStoreExt};
use tokio::sync::{mpsc, watch};

use super::gate::{AppendGate, Change};
use super::lane::{
    slot, stall_limit, Failures, InFlight, Job, Pass, SendError, Sender, Sent, MAX_BESIDE,
    MAX_BESIDE_SMALL, MIN_SEND_DEADLINE, TEST_MIN_STALL,
};
use super::ledger::{Ledger, LedgerEntry};
use super::placement::{session_owner, SessionObjects};
use super::scan::{object_key, priority, scan_logs, skip, LogFile};
use super::schedule::{self, SMALL};
use super::{LogConfig, LogError};
use crate::events::spool::Spool;
use crate::metrics as m;
use crate::node::node_id::{LogNode, NodeIdResolver, RemoteNodeLookup};
use crate::node::session::{
    list_sessions, raylet_answers, settled_earlier_sessions, ActiveSession, SESSION_QUIET,
};
use crate::storage::put::{head_hash, read_marks, window_hash, UploadError};
use crate::util::pace::Pacer;
use crate::util::time::unix_seconds;
use crate::util::watch::watch_dir;

/// Whole-upload failures in a row after which a round stops trying (the bucket is down).
/// Each file is tried once a round and files that failed before go last (`lane::Failures`),
/// so these are different files, and the first of them had not been failing.
const MAX_FAILURES_IN_A_ROW: usize = 3;

/// Files whose too-long key was logged, at most (each is logged once; past it, counted only).
const MAX_KEYS_LOGGED: usize = 1024;

/// Ledger entries checked with a HEAD each round, in turn: a file the ledger calls uploaded
/// but the bucket lost (emptied, expired by a lifecycle rule) is uploaded again within
/// `ledger size / VERIFY_PER_ROUND` rounds, for a few cheap requests per round.
const VERIFY_PER_ROUND: usize = 8;

/// How often the final flush looks whether a send beside the lane has ended (its result is
/// left in the task for the next pass to take): a few wake-ups a second, for a flush
/// that lasts seconds.
const BESIDE_POLL: Duration = Duration::from_millis(50);

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

/// Passes the final flush makes, after one that started a send with nothing left beside
/// it, to send what changed meanwhile (review r42g G3 and G4: Ray rotated, or rewrote, a file
/// during the last pass, and nothing looked at the session again: the rotated file's last
/// lines were in neither object). The flush ends at the first pass that starts no send; a
/// log Ray still writes goes as it is at the last of these passes.
const MAX_SETTLING_PASSES: usize = 3;

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
    /// The last ledger key checked with a HEAD (see [`VERIFY_PER_ROUND`]).
    verify_cursor: Option<String>,
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
        });
        Ok(LogShipper {
            sender,
            beside: Vec::new(),
            current: None,
            flush_named: BTreeSet::new(),
            failures: Failures::default(),
            long_keys: BTreeSet::new(),
            whole_only: BTreeSet::new(),
            seen: HashMap::new(),
            written_total: 0,
            uploaded_total: 0,
            prepared_nodes: BTreeSet::new(),
            verify_cursor: None,
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
            self.verify_some().await;
        }
        let session_dir = s.dir.clone();
        let mut files = match tokio::task::spawn_blocking(move || scan_logs(&session_dir)).await {
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
            if key.len() > self.cfg.max_key_bytes {
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

    /// Takes the results of the sends beside the lane that ended; with `until`, waits for
    /// the others until then and cancels those still running (named as not reached).
    async fn collect_beside(&mut self, until: Option<Instant>) -> RoundReport {
        let mut report = RoundReport::default();
        let mut running = Vec::new();
        for mut b in std::mem::take(&mut self.beside) {
            let limit = match until {
                _ if b.finished() => Some(Duration::ZERO),
                Some(u) => Some(u.saturating_duration_since(Instant::now())),
                None => {
                    running.push(b);
                    continue;
                }
            };
            match b.wait(limit).await {
                Some(result) => {
                    let (key, path) = (b.key.clone(), b.path.clone());
                    self.settle(&key, &path, result, &mut report);
                }
                None if until.is_some() => {
                    if b.append_running() {
                        // Hanging or slow: the final flush sends it whole.
                        self.whole_only.insert(b.key.clone());
                    }
                    report.not_reached.push(b.path.clone());
                    b.cancel().await;
                }
                None => running.push(b),
            }
        }
        self.beside = running;
        report
    }

    /// Waits until one of the sends beside the lane has ended or has not moved for its
    /// stall limit (see [`Self::abandon_stalled_beside`]), or `until`.
    async fn wait_any_beside(&self, until: Instant, stall: KeptStall) {
        let ready =
            |b: &InFlight| b.finished() || Instant::now() >= b.last_moved() + stall.limit(b);
        while !self.beside.iter().any(ready) && Instant::now() < until {
            let next = (Instant::now() + BESIDE_POLL).min(until);
            tokio::time::sleep_until(next.into()).await;
        }
    }

    /// At the final flush: cancels the sends beside the lane that have not moved for their
    /// stall limit (see [`KEPT_STALL_SHARE_BODY`]); their files are sent again by the next
    /// pass, and are not counted as failed. An abandoned append does not make its file
    /// whole-only: the next pass appends again if the object is still the one the ledger
    /// recorded (the append's copy names it; an object that changed is sent whole).
    async fn abandon_stalled_beside(&mut self, stall: KeptStall) {
        let mut running = Vec::new();
        for b in std::mem::take(&mut self.beside) {
            let idle = Instant::now().saturating_duration_since(b.last_moved());
            let limit = stall.limit(&b);
            if b.finished() || idle < limit {
                running.push(b);
                continue;
            }
            tracing::warn!(path = %b.path.display(), key = %b.key, idle_s = idle.as_secs_f64(),
                limit_s = limit.as_secs_f64(), appending = b.appending,
                body_in_flight = b.body_in_flight(),
                "a log upload beside the final flush has not moved (no request ended) for its \
                 share of the flush's budget; abandoned, the file is sent again");
            b.cancel().await;
        }
        self.beside = running;
    }

    /// At SIGTERM: takes the results of the sends beside the lane that ended, and cancels
    /// the appends still running (hanging, or slow: the final flush sends those files whole,
    /// it has no round after it). Whole uploads still running go on: each is bounded by its
    /// own deadline, and the final flush waits for it (see [`Self::final_flush`]).
    async fn cancel_appends_beside(&mut self) -> RoundReport {
        let mut report = RoundReport::default();
        let mut running = Vec::new();
        for mut b in std::mem::take(&mut self.beside) {
            if b.finished() {
                if let Some(result) = b.wait(Some(Duration::ZERO)).await {
                    let (key, path) = (b.key.clone(), b.path.clone());
                    self.settle(&key, &path, result, &mut report);
                }
            } else if b.append_running() {
                self.whole_only.insert(b.key.clone());
                tracing::info!(path = %b.path.display(), "a log append still running at SIGTERM was cancelled; the final flush sends the file whole");
                b.cancel().await;
            } else if b.appending {
                tracing::info!(path = %b.path.display(), "a log append the store completed is being checked against the file at SIGTERM; the final flush waits for the check, then sends what the file grew since");
                running.push(b);
            } else {
                tracing::info!(path = %b.path.display(), "a log upload still running at SIGTERM goes on; the final flush waits for it, then sends what the file grew since");
                running.push(b);
            }
        }
        self.beside = running;
        report
    }

    /// A file whose key is longer than the store allows: skipped, logged once, counted.
    fn refuse_long_key(&mut self, f: &LogFile, key: &str) {
        skip("key_too_long", &f.abs);
        if self.long_keys.len() < MAX_KEYS_LOGGED && self.long_keys.insert(f.abs.clone()) {
            tracing::warn!(path = %f.abs.display(), key_bytes = key.len(),
                limit = self.cfg.max_key_bytes,
                "log file not uploaded: its object key is longer than the store allows \
                 (rhc_log_files_skipped_total{{reason=\"key_too_long\"}}); logged once");
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

    /// True when the file still has every byte the ledger recorded before `p.size`: same
    /// inode and the same hash of all of them ([`LedgerEntry::full`]; one read of `p.size`
    /// bytes). For a file whose size and mtime no longer say it is unchanged while its size
    /// is the object's (touched, or rewritten with as many bytes). Without that hash (a
    /// ledger before version 5), [`Self::file_still_matches`].
    async fn file_still_whole(&self, f: &LogFile, p: &LedgerEntry) -> bool {
        let Some(want) = p.full else {
            return self.file_still_matches(f, p).await;
        };
        if p.ino != 0 && p.ino != f.ino {
            return false;
        }
        let file = f.file.clone();
        let size = p.size;
        let read = tokio::task::spawn_blocking(move || read_marks(&file, size, size)).await;
        m::log_bytes_read(size);
        matches!(read, Ok(Ok(Some(marks))) if marks.all.full == want)
    }

    /// True when the file still looks like the bytes the ledger recorded before `p.size`
    /// (same inode, same hash of the window before that point, and the same head where the
    /// ledger has its hash: a file truncated and rewritten with another head is another
    /// file, however alike their later bytes). A cheap look (128 KiB read), not a proof:
    /// an append it lets through is checked byte for byte after it ran (`lane`).
    async fn file_still_matches(&self, f: &LogFile, p: &LedgerEntry) -> bool {
        if p.ino != 0 && p.ino != f.ino {
            return false;
        }
        if !self.head_matches(f, p).await {
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

    /// False when the ledger has the hash of the file's head at its upload and the file's
    /// first bytes are no longer those (see [`LedgerEntry::head`]); true without a hash (a
    /// ledger written before version 4).
    async fn head_matches(&self, f: &LogFile, p: &LedgerEntry) -> bool {
        let Some(want) = p.head else {
            return true;
        };
        let file = f.file.clone();
        let size = p.size;
        match tokio::task::spawn_blocking(move || head_hash(&file, size)).await {
            Ok(Ok((hash, whole))) => {
                m::log_bytes_read(size.min(crate::storage::put::HEAD));
                whole && hash == want
            }
            _ => false,
        }
    }

    /// The key a rotated backup was uploaded under before, when the file still begins with
    /// what that object holds (see [`super::placement`]); `None` for a live file or a backup
    /// never uploaded.
    async fn backup_key(&self, placed: &SessionObjects, node: &str, f: &LogFile) -> Option<String> {
        let live = f.rotated_from.as_deref()?;
        let keys = placed.backup_keys(node, live, f.ino);
        // Unchanged since its upload: no need to read it.
        for k in keys.iter().rev() {
            if let Some(p) = self.ledger.data.objects.get(k) {
                if p.size == f.size && p.mtime_ns == f.mtime_ns {
                    return Some(k.clone());
                }
            }
        }
        for k in keys.iter().rev() {
            if let Some(p) = self.ledger.data.objects.get(k) {
                if p.size <= f.size && self.file_still_matches(f, p).await {
                    return Some(k.clone());
                }
            }
        }
        None
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
        self.sender.gate()
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
    /// object. At the final flush (`how` is not a live round's), an object whose append was
    /// still running beside the lane at SIGTERM, or whose last append failed, goes whole
    /// without trying one: the flush has no round after it.
    async fn can_append(&self, key: &str, f: &LogFile, p: &LedgerEntry, how: Pass) -> bool {
        let Some(app) = self.cfg.appender.as_ref().filter(|_| self.cfg.appends) else {
            return false;
        };
        if how != Pass::Scheduled
            && (self.whole_only.contains(key) || self.gate().failing_transiently(key))
        {
            return false;
        }
        let (allowed, change) = self.gate().allows(key, Instant::now());
        if change == Change::TurnedOn {
            tracing::info!("trying appends again after the store's refusals turned them off");
            m::log_appends_enabled(true);
        }
        if !allowed {
            return false;
        }
        f.size > p.size
            && p.size > 0
            && p.size >= app.min_object_bytes()
            && p.ino != 0
            && p.e_tag.is_some()
            && p.full.is_some()
            && self.file_still_matches(f, p).await
    }

    /// True when appends are on and the store could append to an object of `p`'s size
    /// (whatever the file did since).
    fn appends_could_take(&self, p: &LedgerEntry) -> bool {
        self.cfg
            .appender
            .as_ref()
            .is_some_and(|app| self.cfg.appends && p.size > 0 && p.size >= app.min_object_bytes())
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
    /// until `deadline`; returns the files that did not make it, each with why.
    ///
    /// The appends still running beside the lane are cancelled first and their files sent
    /// whole in the flush (it was hanging, or slow: the flush has no round after it). The
    /// whole uploads still running beside it go on (a big log nearly uploaded is not thrown
    /// away), and so does the send the lane was waiting for when shutdown cut its round.
    /// The flush makes passes over every session (the active one, then the earlier ones):
    /// a send that outlasts its slot in a pass goes on beside it, files whose send is beside
    /// are skipped, and once a send beside ends, every session is listed again and what
    /// changed meanwhile (the file grew, Ray rotated it) is sent (appended where the store
    /// can, else whole); so every object ends equal to its file or the file is named. No
    /// pass waits for a send, so no session's files wait behind another's hung upload.
    /// A send beside that stops moving is abandoned and its file sent again (see
    /// [`KEPT_STALL_SHARE_BODY`]); a kept send that failed is named only if the flush's own send
    /// of its file fails too. A pass that started a send with nothing left beside is
    /// followed by another (at most [`MAX_SETTLING_PASSES`]), so a rotation or a rewrite
    /// during it is sent too: the flush ends at a pass that starts no send, or the deadline.
    pub async fn final_flush(
        &mut self,
        active: Option<ActiveSession>,
        deadline: Instant,
    ) -> Vec<(PathBuf, String)> {
        let mut earlier = self.cancel_appends_beside().await;
        // Whatever failed there, the flush tries again.
        earlier.failed_files.clear();
        // A node id nobody knows still must not lose the logs: file them under the fallback.
        if let Some(s) = &active {
            if !self.knows_node(&s.dir) && self.remote_node.is_none() {
                self.remote_node = Some(crate::storage::append::UNKNOWN_NODE.into());
            }
        }
        // Keep the end of the budget to abort an append the deadline cuts short.
        let reserve = ABORT_RESERVE.min(deadline.saturating_duration_since(Instant::now()) / 4);
        let flush_deadline = deadline.checked_sub(reserve).unwrap_or(deadline);
        // Passes over every session until nothing is left beside the lane: each pass tries
        // every session's files (a send that outlasts its slot goes beside, so no file and no
        // session waits behind another), then the flush waits for the first send beside to
        // end and lists every session again, so what was rotated, created or grew during the
        // wait is sent too (review r42e E2, E5). A pass at the deadline names what is left.
        // A send beside that stops moving is abandoned and its file sent again in the next
        // pass (review r42g G1); a pass that sent something is followed by another, so what
        // was rotated or rewritten during it is sent too (r42g G3, G4).
        let left = flush_deadline.saturating_duration_since(Instant::now());
        let kept_stall = KeptStall {
            body: left / KEPT_STALL_SHARE_BODY,
            bare: left / KEPT_STALL_SHARE_BARE,
        };
        self.flush_named.clear();
        let mut reports = Vec::new();
        let mut settling = 0;
        loop {
            self.abandon_stalled_beside(kept_stall).await;
            let pass = self
                .snapshot_all(active.as_ref(), Some(flush_deadline), true)
                .await;
            let sends: usize = pass.iter().map(|r| r.sends).sum();
            for r in &pass {
                self.flush_named
                    .extend(r.failed_files.iter().map(|(p, _)| p.clone()));
            }
            reports.extend(pass);
            if Instant::now() >= flush_deadline {
                break;
            }
            if !self.beside.is_empty() {
                self.wait_any_beside(flush_deadline, kept_stall).await;
                continue;
            }
            if sends == 0 || settling >= MAX_SETTLING_PASSES {
                break;
            }
            settling += 1;
        }
        reports.push(self.collect_beside(Some(flush_deadline)).await);
        reports.push(earlier);
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
        let failed: usize = reports.iter().map(|r| r.failed).sum();
        let uploaded: usize = reports.iter().map(|r| r.uploaded).sum();
        let not_reached: usize = reports.iter().map(|r| r.not_reached.len()).sum();
        tracing::info!(uploaded, failed, not_reached, "final log flush done");
        let mut left: Vec<(PathBuf, String)> = reports
            .into_iter()
            .flat_map(|r| {
                r.failed_files.into_iter().chain(
                    r.not_reached
                        .into_iter()
                        .map(|p| (p, "not reached before the shutdown deadline".to_string())),
                )
            })
            .collect();
        left.sort();
        left.dedup_by(|a, b| a.0 == b.0);
        left
    }
}

/// The final flush's stall limits for a send beside it (see [`KEPT_STALL_SHARE_BODY`]).
#[derive(Debug, Clone, Copy)]
struct KeptStall {
    /// While a request carrying a body is in flight.
    body: Duration,
    /// Otherwise (waiting for the answer of a request without a body, or between requests).
    bare: Duration,
}

impl KeptStall {
    fn limit(&self, b: &InFlight) -> Duration {
        if b.body_in_flight() {
            self.body
        } else {
            self.bare
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
