//! The writer thread: the only owner of the open segments. It takes every request waiting
//! at that moment as one group, stages each partition's lines, writes them with one `writev`
//! per segment, hands the group to the sync thread while it writes the next one (pipelined
//! group commit), and answers a group only after its own sync. A failed write or sync rolls
//! back every group not yet durable (truncate to the durable length, forget their event
//! ids), so no answer ever leaves half a batch behind. Once a group is durable, its ids and
//! the lengths of the files it wrote them into go to the ids journal ([`super::journal`])
//! before its answers: a restart knows from it which lines of the spool came after.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc as tokio_mpsc;

use super::journal::{Head, Journal};
use super::pending::Pending;
use super::segments::{OpenSegment, Segments, Target};
use super::sync::{run_sync, run_syncer, sync_dir, SyncJob, SYNCFS_ABOVE};
use super::{
    AppendBatch, AppendOutcome, AppendReply, Checkpoint, Command, RecoveryReport, SealedFile,
    SpoolConfig, SpoolError, SpoolStats, CUTS_DIR, EVENTS_DIR, GROWTH_DIR, MARKERS_DIR,
    QUARANTINE_DIR,
};
use crate::contract::is_safe_segment;
use crate::metrics as m;
use crate::util::dedup::DedupWindow;
use crate::util::memory::release_free_memory;
use crate::util::time::unix_nanos;

/// Distinct bad events remembered, so that Ray's resend of a batch keeps each once; apart
/// from the event ids, whose window bad input must not crowd out.
const QUARANTINE_WINDOW: usize = 4096;

/// Quiet time after which freed heap memory is returned to the system.
const IDLE_TRIM_AFTER: Duration = Duration::from_secs(5);

/// The writer's command channel, and what it needs to hand its own sync thread a way back.
pub(super) struct Inbox {
    pub(super) rx: mpsc::Receiver<Command>,
    pub(super) to_self: mpsc::Sender<Command>,
    pub(super) alive: Weak<()>,
    /// Set by [`super::Spool::stop`]: the shutdown is past its deadline, so seals not yet
    /// done are left to the next start, which seals and queues whatever it finds (issue 35:
    /// 50,000 seals at a stop outlasted a kubelet's grace period).
    pub(super) stopping: Arc<AtomicBool>,
}

/// What one write of the staged lines touched, to be made durable.
#[derive(Default)]
pub(super) struct Written {
    /// Bytes appended to each segment.
    pub(super) appended: Vec<(Target, u64)>,
    /// The segments given lines with event ids: the ids journal records their lengths.
    pub(super) with_ids: Vec<Target>,
    pub(super) files: Vec<(Arc<File>, PathBuf)>,
    pub(super) dirs: Vec<PathBuf>,
    /// Too many files: one `syncfs` instead.
    pub(super) whole_fs: bool,
    pub(super) bytes: u64,
}

impl Written {
    pub(super) fn merge(&mut self, other: Written) {
        self.appended.extend(other.appended);
        self.with_ids.extend(other.with_ids);
        for (f, p) in other.files {
            if !self.files.iter().any(|(_, q)| *q == p) {
                self.files.push((f, p));
            }
        }
        self.dirs.extend(other.dirs);
        self.whole_fs |= other.whole_fs;
        self.bytes += other.bytes;
    }
}

/// What the requests of a group hold until their sync answers: the ids they made the
/// windows remember (forgotten again if the group is rolled back, so Ray's resend is
/// stored), and the disk budget they claimed (given back once they are durable, when the
/// spool's counters hold them, or rolled back).
#[derive(Default)]
pub(super) struct Held {
    pub(super) events: Vec<u64>,
    pub(super) quarantine: Vec<u64>,
    pub(super) bytes: u64,
}

impl Held {
    fn merge(&mut self, other: Held) {
        self.events.extend(other.events);
        self.quarantine.extend(other.quarantine);
        self.bytes += other.bytes;
    }
}

/// Requests of a group staged and not yet written ([`Writer::write_group`]).
struct Part {
    staged: Vec<(AppendReply, AppendOutcome)>,
    held: Held,
    new_sessions: Vec<String>,
    checkpoints: Vec<(usize, Checkpoint)>,
    started: Instant,
}

impl Default for Part {
    fn default() -> Part {
        Part {
            staged: Vec::new(),
            held: Held::default(),
            new_sessions: Vec::new(),
            checkpoints: Vec::new(),
            started: Instant::now(),
        }
    }
}

/// Requests written to their segments whose sync has not yet answered.
struct InFlight {
    written: Written,
    replies: Vec<(AppendReply, AppendOutcome)>,
    held: Held,
    new_sessions: Vec<String>,
    /// State files to replace once the group is durable, with the index of their request
    /// in `replies`.
    checkpoints: Vec<(usize, Checkpoint)>,
    started: Instant,
}

pub(super) struct Writer {
    pub(super) cfg: SpoolConfig,
    pub(super) stats: Arc<SpoolStats>,
    pub(super) sealed: tokio_mpsc::UnboundedSender<SealedFile>,
    pub(super) dedup: DedupWindow,
    /// Recently kept bad events ([`QUARANTINE_WINDOW`]).
    pub(super) quarantine_dedup: DedupWindow,
    /// The open segments.
    pub(super) segs: Segments,
    pub(super) recent_bodies: VecDeque<u64>,
    pub(super) inbox: Inbox,
    /// Commands read while waiting for a sync, handled next.
    pub(super) deferred: VecDeque<Command>,
    /// The group the sync thread is making durable.
    syncing: Option<InFlight>,
    /// Groups written after it, waiting for the next sync.
    waiting: Option<InFlight>,
    /// The last checkpoint could not be saved: no segment is sealed (so none is uploaded and
    /// deleted) until a later one is, see [`Checkpoint`].
    checkpoint_unsaved: bool,
    pub(super) syncer: mpsc::Sender<SyncJob>,
    pub(super) lock: Arc<File>,
    /// The ids of answered groups, on disk: the window across restarts.
    pub(super) journal: Journal,
    /// Quarantine records of torn lines a start could not write (a full disk): written once
    /// there is room, tried every [`TORN_RECORD_RETRY`].
    pub(super) torn_later: Vec<Vec<u8>>,
    torn_tried: Instant,
}

/// How often the quarantine records of torn lines that a start could not write are tried
/// again: each try writes them and, on a full disk, cuts them back.
const TORN_RECORD_RETRY: Duration = Duration::from_secs(5);

/// How often the writer asks whether the spool needs room (over its high watermark, or a
/// request refused that sealing can make room for), to seal open segments already in the
/// bucket: often enough to free the
/// spool well within an upload window, rarely enough that walking the open segments costs
/// nothing.
const ROOM_CHECK_EVERY: Duration = Duration::from_millis(200);

/// What a generation of the ids journal starts with: the last creation number handed out,
/// and the durable length of every open segment (a file created later has a higher number).
pub(super) fn journal_head(segs: &Segments) -> Head {
    Head {
        last_n: segs.last_n,
        files: segs
            .open
            .values()
            .map(|s| (s.created_unix_nanos, s.len))
            .collect(),
    }
}

/// Answers every request of a failed group with the error (the first gets it whole).
fn fail_all(replies: Vec<AppendReply>, err: SpoolError) {
    tracing::error!(error = %err, requests = replies.len(), "spool write failed; the group is rolled back and not acknowledged");
    let message = err.to_string();
    let no_space = err.is_no_space();
    let mut first = Some(err);
    for reply in replies {
        let e = first.take().unwrap_or_else(|| SpoolError::GroupFailed {
            message: message.clone(),
            no_space,
        });
        let _ = reply.send(Err(e));
    }
}

impl Writer {
    pub(super) fn start(
        cfg: SpoolConfig,
        stats: Arc<SpoolStats>,
        sealed: tokio_mpsc::UnboundedSender<SealedFile>,
        inbox: Inbox,
    ) -> Result<(Writer, RecoveryReport), SpoolError> {
        // Every directory made here is new below the nearest one that exists.
        let mut created: Vec<PathBuf> = Vec::new();
        let mut d = cfg.dir.as_path();
        while !d.exists() {
            created.push(d.to_path_buf());
            match d.parent() {
                Some(p) => d = p,
                None => break,
            }
        }
        for sub in [
            EVENTS_DIR,
            QUARANTINE_DIR,
            MARKERS_DIR,
            CUTS_DIR,
            GROWTH_DIR,
        ] {
            let d = cfg.dir.join(sub);
            fs::create_dir_all(&d).map_err(|e| SpoolError::io("creating", &d, e))?;
        }
        let lock_path = cfg.dir.join("LOCK");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| SpoolError::io("opening", &lock_path, e))?;
        // SAFETY: flock on a valid fd we own; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(SpoolError::Locked(cfg.dir.clone()));
        }
        // The entries made at first start are durable before anything is acknowledged: the
        // folders and the lock in the spool dir, each new directory in its parent.
        sync_dir(&cfg.dir)?;
        for dir in &created {
            match dir.parent() {
                Some(p) if p.as_os_str().is_empty() => sync_dir(std::path::Path::new("."))?,
                Some(p) => sync_dir(p)?,
                None => {}
            }
        }
        let (journal, loaded) = Journal::open(&cfg.dir, cfg.dedup_window);
        let (syncer, jobs) = mpsc::channel();
        let done = inbox.to_self.clone();
        std::thread::Builder::new()
            .name("spool-sync".into())
            .spawn(move || run_syncer(jobs, done))
            .map_err(|e| SpoolError::io("starting the spool sync thread for", &cfg.dir, e))?;
        let mut w = Writer {
            dedup: DedupWindow::new(cfg.dedup_window),
            quarantine_dedup: DedupWindow::new(QUARANTINE_WINDOW),
            segs: Segments::new(&cfg, stats.clone(), sealed.clone()),
            cfg,
            stats,
            sealed,
            recent_bodies: VecDeque::new(),
            inbox,
            deferred: VecDeque::new(),
            syncing: None,
            waiting: None,
            checkpoint_unsaved: false,
            syncer,
            lock: Arc::new(lock),
            journal,
            torn_later: Vec::new(),
            torn_tried: Instant::now(),
        };
        let report = w.recover(loaded)?;
        Ok((w, report))
    }

    /// The next command: one deferred while waiting for a sync, or one from the channel.
    pub(super) fn next_command(
        &mut self,
        wait: Duration,
    ) -> Result<Command, mpsc::RecvTimeoutError> {
        match self.deferred.pop_front() {
            Some(c) => Ok(c),
            None => self.inbox.rx.recv_timeout(wait),
        }
    }

    /// The next command if one is there now.
    pub(super) fn try_next_command(&mut self) -> Option<Command> {
        self.deferred
            .pop_front()
            .or_else(|| self.inbox.rx.try_recv().ok())
    }

    pub(super) fn run(&mut self) {
        let tick = Duration::from_millis(250);
        let mut last_room_check = Instant::now();
        let mut last_age_check = Instant::now();
        let mut last_write = Instant::now();
        let mut trimmed = true;
        loop {
            let first = match self.next_command(tick) {
                Ok(c) => {
                    last_write = Instant::now();
                    trimmed = false;
                    Some(c)
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if self.inbox.alive.upgrade().is_none() {
                        // Every handle is gone without a Stop: nobody is left to answer.
                        return;
                    }
                    // After a burst, give the freed heap back to the node: malloc keeps it
                    // otherwise, and an idle sidecar should look idle.
                    if !trimmed && last_write.elapsed() >= IDLE_TRIM_AFTER {
                        release_free_memory();
                        trimmed = true;
                    }
                    None
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            let mut group = Vec::new();
            let mut controls = Vec::new();
            let mut next = first;
            while let Some(cmd) = next {
                match cmd {
                    Command::Append(b, r) => group.push((b, r)),
                    Command::Synced(r) => self.synced(r),
                    other => controls.push(other),
                }
                // Cap a group so one fsync never waits behind an unbounded amount of work.
                if group.len() >= 256 {
                    break;
                }
                next = self.try_next_command();
            }
            if !group.is_empty() {
                self.write_group(group);
            }
            self.start_sync();
            for c in controls {
                match c {
                    Command::QuarantineBody {
                        body,
                        detail,
                        reply,
                    } => {
                        let r = self.store_body(&body, &detail);
                        if let Err(e) = &r {
                            tracing::error!(error = %e, "could not keep an invalid body in quarantine");
                        }
                        let _ = reply.send(r);
                    }
                    Command::Marker(session, reply) => {
                        let r = if self.cfg.write_session_markers && is_safe_segment(&session) {
                            self.segs.ensure_marker(&session)
                        } else {
                            Ok(())
                        };
                        let _ = reply.send(r);
                    }
                    Command::SealAll(reply) => {
                        // Shutdown: what is not sealed now is not uploaded before the pod goes,
                        // so an unsaved export checkpoint does not hold it back here. The
                        // export lines it does not cover are read again after a restart; their
                        // ids are in the ids journal (fsync'd by the seal, before the uploader
                        // deletes a segment), so the restart's window drops them.
                        if self.checkpoint_unsaved {
                            tracing::warn!("sealing every segment for shutdown although the last export checkpoint is unsaved; export lines it does not cover are read again after a restart and dropped as duplicates");
                            self.checkpoint_unsaved = false;
                        }
                        self.final_journal_sync();
                        self.seal_where(|_| true);
                        let _ = reply.send(());
                    }
                    Command::Stop => {
                        self.final_journal_sync();
                        self.seal_where(|_| true);
                        return;
                    }
                    Command::Append(..) | Command::Synced(_) => {}
                }
            }
            if !self.torn_later.is_empty() && self.torn_tried.elapsed() >= TORN_RECORD_RETRY {
                self.retry_torn_records();
            }
            // Size-based sealing once the data is durable.
            let max = self.cfg.max_segment_bytes;
            self.seal_where(|s| s.len >= max);
            // A quarter window answered since the journal was last durable: made durable now,
            // so what a power loss can take from it always fits in the window a start refills.
            if self.journal.due_for_sync() {
                self.sync_journal();
            }
            // Segments whose compressed copy has no room in the budget: sealed, so they
            // go up whole instead of waiting for their rotation (the review of issue 35).
            let asked = self.stats.take_seal_requests();
            if !asked.is_empty() {
                tracing::info!(
                    segments = asked.len(),
                    "sealing open segments whose compressed copy has no room in --max-spool-bytes; they are uploaded whole"
                );
                self.seal_where(|s| asked.contains(&s.path));
            }
            // Over the high watermark (or a request refused for room): open segments whose
            // events are all in the bucket are sealed, which frees their bytes, copy and
            // record at once, so the spool frees within about the upload window instead of
            // at their rotation (the review r35e: a healthy store with everything uploaded,
            // and every request 503 for 5 minutes). A segment not yet published is sealed
            // once it is, at a later turn.
            let room_due = last_room_check.elapsed() >= ROOM_CHECK_EVERY;
            if room_due {
                last_room_check = Instant::now();
            }
            // Only when that frees the room wanted: at the high watermark any room helps;
            // for a refused write, sealing helps only if it frees what that write lacked
            // (the review r35h: a batch too big for the spool, retried every 2 s, sealed
            // every published partition each time, objects multiplying for nothing).
            let wanted = if room_due {
                self.stats.budget().wants_room()
            } else {
                None
            };
            if let Some(short) = wanted {
                let (published, freed) = self.stats.published_open_segments();
                if !published.is_empty() && freed >= short {
                    tracing::info!(
                        segments = published.len(),
                        used = self.stats.budget_used(),
                        "the spool needs room (over its high watermark, or a refused request this makes room for): sealing the open segments already in the bucket to free their room"
                    );
                    self.seal_where(|s| published.contains(&s.path));
                }
            }
            if last_age_check.elapsed() >= Duration::from_millis(500) {
                last_age_check = Instant::now();
                let max_age = self.cfg.rotation_interval;
                self.seal_where(|s| s.opened_at.elapsed() >= max_age);
            }
        }
    }

    /// Tries again to keep the torn lines a start found in quarantine (see
    /// [`Writer::torn_later`]), with nothing else in flight.
    fn retry_torn_records(&mut self) {
        self.torn_tried = Instant::now();
        self.drain();
        let records = std::mem::take(&mut self.torn_later);
        match self.write_torn_records(&records) {
            Ok(()) => {
                tracing::info!(
                    lines = records.len(),
                    "kept the torn lines found at start in quarantine, now that there is room"
                );
            }
            Err(e) => {
                tracing::debug!(error = %e, "the torn lines found at start still cannot be kept in quarantine");
                self.torn_later = records;
            }
        }
    }

    /// Stages and writes every request of the group; its sync and answers come later.
    ///
    /// The disk and the CPU overlap: this group is written (into the page cache) while the
    /// sync thread makes the previous one durable, and its sync starts as soon as that one
    /// ends. A group is answered only after its own sync.
    ///
    /// A request that would take the ids not yet durable in the ids journal past a quarter
    /// window ([`Writer::ids_not_durable`]) is written only after the requests before it are
    /// answered and the journal is synced: so what a power loss can take from the journal,
    /// whose lines a start finds in the spool in an order nothing records, is at most a
    /// quarter window (or one request holding more) and always fits in the window (review
    /// r40j D2: a group of 800 ids after 240 unsynced ones, a window of 1,000, lost 40 to
    /// the start's guess of their order, and the resend of 599 was stored twice).
    pub(super) fn write_group(&mut self, group: Vec<(AppendBatch, AppendReply)>) {
        let every = self.journal.sync_every();
        let mut part = Part::default();
        for (mut batch, reply) in group {
            // At most this many new ids (duplicates are counted too).
            let ids: usize = batch.partitions.iter().map(|p| p.events.len()).sum();
            let before = self.ids_not_durable() + part.held.events.len();
            if every > 0 && before > 0 && before + ids > every && self.journal.syncs_now() {
                if !part.staged.is_empty() {
                    self.write_part(std::mem::take(&mut part));
                }
                self.drain();
                self.sync_journal();
            }
            match self.stage(&batch, &mut part.held, &mut part.new_sessions) {
                Ok(o) => {
                    if let Some(c) = batch.checkpoint.take() {
                        part.checkpoints.push((part.staged.len(), c));
                    }
                    part.staged.push((reply, o));
                }
                // Refused, or failed, before anything of it was staged: only this request
                // is answered so; the others of the group go on.
                Err(e) => {
                    if e.is_over_budget() {
                        m::backpressure();
                    } else {
                        tracing::error!(error = %e, "could not stage a request; it alone is refused");
                    }
                    let _ = reply.send(Err(e));
                }
            }
        }
        self.write_part(part);
    }

    /// Ids whose record a power loss could take from the ids journal: answered since its
    /// last sync, or staged in groups not yet answered (whose records come with their
    /// answers).
    fn ids_not_durable(&self) -> usize {
        self.journal.unsynced_ids()
            + self.syncing.as_ref().map_or(0, |f| f.held.events.len())
            + self.waiting.as_ref().map_or(0, |f| f.held.events.len())
    }

    /// Writes the staged requests of a part of a group and hands them to the next sync.
    fn write_part(&mut self, part: Part) {
        let Part {
            staged,
            held,
            new_sessions,
            checkpoints,
            started,
        } = part;
        let written = match self.write_pending() {
            Ok(w) => w,
            Err(err) => {
                // What came before is answered first; then only this group is cut off.
                self.drain();
                self.rollback_to_durable();
                self.stats.budget().release(held.bytes);
                self.forget(held);
                let replies = staged.into_iter().map(|(r, _)| r).collect();
                fail_all(replies, err);
                return;
            }
        };
        let flight = InFlight {
            written,
            replies: staged,
            held,
            new_sessions,
            checkpoints,
            started,
        };
        match &mut self.waiting {
            Some(w) => {
                let shift = w.replies.len();
                w.checkpoints
                    .extend(flight.checkpoints.into_iter().map(|(i, c)| (i + shift, c)));
                w.written.merge(flight.written);
                w.replies.extend(flight.replies);
                w.held.merge(flight.held);
                w.new_sessions.extend(flight.new_sessions);
            }
            None => self.waiting = Some(flight),
        }
    }

    /// Forgets the ids `held` made the windows remember.
    fn forget(&mut self, held: Held) {
        for h in held.events {
            self.dedup.forget(h);
        }
        for h in held.quarantine {
            self.quarantine_dedup.forget(h);
        }
    }

    /// Claims room for `bytes` more, `lines` of them lines of segments (which get compressed
    /// copies), or refuses them when they would take the spool past its budget: one rule
    /// with the high watermark and the export tailer ([`super::Budget`]).
    pub(super) fn claim_budget(&self, bytes: u64, lines: u64) -> Result<u64, SpoolError> {
        Ok(self.stats.budget().claim(bytes, lines)?)
    }

    /// Hands the waiting groups to the sync thread if it is free.
    pub(super) fn start_sync(&mut self) {
        if self.syncing.is_some() {
            return;
        }
        let Some(mut flight) = self.waiting.take() else {
            return;
        };
        let job = self.sync_job(&mut flight.written);
        self.syncing = Some(flight);
        if self.syncer.send(job).is_err() {
            self.synced(Err(SpoolError::io(
                "syncing (the sync thread is gone) in",
                &self.cfg.dir,
                io::Error::other("sync thread ended"),
            )));
        }
    }

    /// The sync thread's answer for the group in flight.
    pub(super) fn synced(&mut self, result: Result<(), SpoolError>) {
        let Some(flight) = self.syncing.take() else {
            return;
        };
        if let Err(err) = result {
            // Everything written since the last durable point goes: the failed group and
            // the ones written after it, which sit behind it in the same files.
            let mut replies: Vec<AppendReply> =
                flight.replies.into_iter().map(|(r, _)| r).collect();
            let mut held = flight.held;
            self.retry_dirs(&flight.written);
            if let Some(w) = self.waiting.take() {
                replies.extend(w.replies.into_iter().map(|(r, _)| r));
                held.merge(w.held);
                self.retry_dirs(&w.written);
            }
            self.stats.budget().release(held.bytes);
            self.rollback_to_durable();
            self.forget(held);
            fail_all(replies, err);
            return;
        }
        // The next sync first, so the disk does not wait for the answers.
        self.start_sync();
        self.mark_durable(&flight.written);
        // The group's record: its ids, and the durable length of each file it wrote ids
        // into. Page cache only: fsync'd before any segment is handed to the uploader (a
        // power loss before that leaves the group's lines past the lengths the journal
        // holds, which a start reloads; see [`super::journal`]).
        let open = &self.segs.open;
        let mut files: Vec<(u64, u64)> = flight
            .written
            .with_ids
            .iter()
            .filter_map(|t| open.get(t))
            .map(|s| (s.created_unix_nanos, s.len))
            .collect();
        // Groups merged while waiting for a sync may name a file more than once.
        files.sort_unstable();
        files.dedup();
        let segs = &self.segs;
        self.journal
            .append(&flight.held.events, &files, || journal_head(segs));
        m::spool_commit(flight.written.bytes, flight.started.elapsed());
        for s in flight.new_sessions {
            if let Err(e) = self.segs.ensure_marker(&s) {
                tracing::error!(session = %s, error = %e, "could not record the session marker on disk; uploading it from memory");
                self.segs.queue_marker(&s, PathBuf::new());
            }
        }
        // Counted now (bytes, files, bytes to copy): the claim goes.
        self.stats.budget().release(flight.held.bytes);
        // Before the answers and before any of these segments can be sealed (sealing waits
        // for this answer): see [`Checkpoint`].
        let mut failed = Vec::new();
        for (i, c) in flight.checkpoints {
            match crate::util::fs::write_atomically(&c.path, &c.bytes) {
                Ok(()) => self.checkpoint_unsaved = false,
                Err(source) => {
                    tracing::error!(path = %c.path.display(), error = %source, "could not save a checkpoint after its events were stored; no segment is sealed until one is saved");
                    self.checkpoint_unsaved = true;
                    failed.push((
                        i,
                        SpoolError::Checkpoint {
                            path: c.path,
                            source,
                        },
                    ));
                }
            }
        }
        for (i, (reply, outcome)) in flight.replies.into_iter().enumerate() {
            m::events_accepted(outcome.accepted, outcome.duplicates);
            match failed.iter().position(|(f, _)| *f == i) {
                Some(at) => {
                    let _ = reply.send(Err(failed.swap_remove(at).1));
                }
                None => {
                    let _ = reply.send(Ok(outcome));
                }
            }
        }
    }

    /// Waits until every written group is synced and answered; other commands that arrive
    /// meanwhile are kept, in order, for the main loop.
    pub(super) fn drain(&mut self) {
        loop {
            self.start_sync();
            if self.syncing.is_none() {
                return;
            }
            match self.inbox.rx.recv() {
                Ok(Command::Synced(r)) => self.synced(r),
                Ok(other) => self.deferred.push_back(other),
                Err(_) => {
                    // Cannot happen while we hold a sender; answer rather than wait forever.
                    self.synced(Err(SpoolError::Stopped));
                }
            }
        }
    }

    /// Seals every open segment for which `pred` holds; none while the last checkpoint is
    /// unsaved, as a segment may hold lines it does not cover.
    pub(super) fn seal_where(&mut self, pred: impl Fn(&OpenSegment) -> bool) {
        if self.checkpoint_unsaved {
            return;
        }
        for t in self.segs.due(pred) {
            if self.inbox.stopping.load(Ordering::Relaxed) {
                return;
            }
            self.seal(&t);
        }
    }

    /// Seals one segment, once what was written to it is durable (or rolled back), and once
    /// the ids journal holds every id answered so far: the uploader deletes the segment.
    pub(super) fn seal(&mut self, t: &Target) {
        if self.segs.awaits_sync(t) {
            // Its last group is still being synced: wait for that answer first.
            self.drain();
        }
        self.sync_journal();
        self.segs.close(t);
    }

    /// Makes the ids journal durable before anything leaves the spool: fsyncs what was
    /// appended or, when it is behind (a failed write), writes the window whole, with no
    /// group in flight so that it holds answered ids only.
    pub(super) fn sync_journal(&mut self) {
        if self.journal.wants_snapshot() {
            self.drain();
            let ids = self.dedup.ids();
            self.journal
                .snapshot(&ids, &journal_head(&self.segs), self.dedup.hold());
        } else {
            self.journal.sync();
        }
    }

    /// At shutdown: the journal made durable, and when it is behind, its snapshot tried now
    /// whatever the last try (the disk may have room again), before the final seals hand
    /// every segment to the uploader (review r40i D3).
    fn final_journal_sync(&mut self) {
        self.journal.retry_now();
        self.sync_journal();
    }

    /// Writes every pending buffer and makes it durable now (recovery, quarantined bodies;
    /// nothing else may be in flight); on error the caller rolls back.
    pub(super) fn flush_group(&mut self) -> Result<(), SpoolError> {
        let started = Instant::now();
        let mut written = self.write_pending()?;
        if let Err(e) = run_sync(self.sync_job(&mut written)) {
            self.retry_dirs(&written);
            return Err(e);
        }
        self.mark_durable(&written);
        m::spool_commit(written.bytes, started.elapsed());
        Ok(())
    }

    /// Writes every pending buffer to its segment (into the page cache, not yet durable)
    /// and returns what must be synced.
    ///
    /// A group touching more than [`SYNCFS_ABOVE`] files (thousands of jobs at once) is made
    /// durable with one `syncfs` instead of one sync per file. The staged lines let go of
    /// their request bodies, and fds may be closed before the sync: the sync holds its own
    /// references.
    pub(super) fn write_pending(&mut self) -> Result<Written, SpoolError> {
        let targets: Vec<Target> = self.segs.due(|s| !s.pending.is_empty());
        let mut out = Written {
            whole_fs: targets.len() + self.segs.dirty_dirs.len() > SYNCFS_ABOVE,
            ..Written::default()
        };
        for t in &targets {
            let need_fd = self.segs.open.get(t).is_some_and(|s| s.file.is_none());
            if need_fd {
                self.segs.make_room_for_fd();
                let Some(seg) = self.segs.open.get_mut(t) else {
                    continue;
                };
                let f = OpenOptions::new()
                    .append(true)
                    .open(&seg.path)
                    .map_err(|e| SpoolError::io("reopening segment", &seg.path, e))?;
                seg.file = Some(Arc::new(f));
                self.segs.open_fds += 1;
            }
            let Some(seg) = self.segs.open.get_mut(t) else {
                continue;
            };
            let Some(file) = seg.file.as_ref() else {
                continue;
            };
            let n = seg.pending.len();
            // Counted first: if the write fails half way, rollback still truncates it.
            seg.written += n;
            seg.pending
                .write_to(file)
                .map_err(|e| SpoolError::io("appending to segment", &seg.path, e))?;
            out.bytes += n;
            out.appended.push((t.clone(), n));
            if seg.pending.ids {
                out.with_ids.push(t.clone());
            }
            if !out.whole_fs {
                out.files.push((file.clone(), seg.path.clone()));
            }
            // Lets go of the request bodies it referenced.
            seg.pending = Pending::default();
        }
        // Kept even when one `syncfs` covers them: a failed sync puts them back.
        out.dirs = self.segs.dirty_dirs.drain().collect();
        Ok(out)
    }

    /// What syncing `written` takes; its files move into the job (only what it appended is
    /// needed afterwards), its directories are copied: if the sync fails they are synced
    /// again with the next group ([`Writer::retry_dirs`]).
    pub(super) fn sync_job(&self, written: &mut Written) -> SyncJob {
        SyncJob {
            files: std::mem::take(&mut written.files),
            dirs: if written.whole_fs {
                Vec::new()
            } else {
                written.dirs.clone()
            },
            whole_fs: written.whole_fs.then(|| self.lock.clone()),
        }
    }

    /// Directories whose sync failed (or was never done): the next group syncs them again,
    /// and is not answered before that succeeds. A new entry in them may belong to a segment
    /// that later groups append to, which would otherwise be acknowledged with only the
    /// file synced.
    pub(super) fn retry_dirs(&mut self, written: &Written) {
        self.segs.dirty_dirs.extend(written.dirs.iter().cloned());
    }

    /// Records that what `written` appended is durable.
    pub(super) fn mark_durable(&mut self, written: &Written) {
        for (t, n) in &written.appended {
            if let Some(seg) = self.segs.open.get_mut(t) {
                seg.len += n;
            }
        }
        // One lock per group: the publisher sees the new durable lengths (whole lines).
        let open = &self.segs.open;
        self.stats.segments_grew(
            written
                .appended
                .iter()
                .filter_map(|(t, _)| open.get(t))
                .map(|s| (s.path.as_path(), s.len)),
            unix_nanos(),
        );
        self.stats.budget().add_stored(written.bytes);
    }

    /// Drops pending lines and truncates every segment back to its durable length.
    pub(super) fn rollback_to_durable(&mut self) {
        let mut broken = Vec::new();
        for (t, seg) in self.segs.open.iter_mut() {
            if seg.pending.is_empty() && seg.written == seg.len {
                continue;
            }
            seg.pending = Pending::default();
            seg.written = seg.len;
            let ok = match seg.file.as_ref() {
                Some(f) => f.set_len(seg.len).and_then(|_| f.sync_data()).is_ok(),
                None => OpenOptions::new()
                    .write(true)
                    .open(&seg.path)
                    .and_then(|f| f.set_len(seg.len).and_then(|_| f.sync_data()))
                    .is_ok(),
            };
            if !ok {
                broken.push((t.clone(), seg.path.clone(), seg.len));
            }
        }
        // A segment we could not truncate is sealed at its durable length: the uploader sends
        // that many bytes, never the rolled-back lines behind them (their ids are forgotten,
        // so Ray's resend is stored again elsewhere). The length is also recorded on disk,
        // for a restart before the upload.
        for (t, path, len) in broken {
            tracing::error!(target = ?t, durable_bytes = len, "could not roll back a failed write; sealing the segment at its durable length");
            if let Err(e) = self.record_cut(&path, len) {
                tracing::error!(error = %e, "could not record the durable length of the segment either; a restart before its upload would send the rolled-back lines too");
            }
            self.seal(&t);
        }
    }

    /// Records durably that only the first `len` bytes of the segment at `path` count
    /// ([`CUTS_DIR`]); recovery applies it.
    fn record_cut(&mut self, path: &std::path::Path, len: u64) -> Result<(), SpoolError> {
        let dir = self.cfg.dir.join(CUTS_DIR);
        let Some(name) = path.file_name() else {
            return Ok(());
        };
        let cut = dir.join(name);
        let mut f = File::create(&cut).map_err(|e| SpoolError::io("creating", &cut, e))?;
        f.write_all(len.to_string().as_bytes())
            .and_then(|_| f.sync_data())
            .map_err(|e| SpoolError::io("writing", &cut, e))?;
        sync_dir(&dir)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::super::sync::failpoint::FAIL_NEXT_SYNC;
    use super::super::{EventSpan, PartitionBatch, Spool};
    use super::*;
    use crate::contract::{Hour, Partition, Stream};
    use crate::events::dedup::id_hash;

    fn batch(ids: &[&str]) -> AppendBatch {
        let mut body = Vec::new();
        let mut events = Vec::new();
        for id in ids {
            let start = body.len();
            body.extend_from_slice(format!(r#"{{"eventId":"{id}"}}"#).as_bytes());
            events.push(
                EventSpan::new(start..body.len(), Some(id_hash(id.as_bytes())), false).unwrap(),
            );
        }
        AppendBatch {
            body: Bytes::from(body),
            partitions: vec![PartitionBatch {
                partition: Partition {
                    session: "session_t".into(),
                    node: "n1".into(),
                    stream: Stream::Node,
                    hour: Hour::from_unix_seconds(1_700_000_000),
                },
                events,
            }],
            quarantined: Vec::new(),
            quarantine_dropped: 0,
            checkpoint: None,
        }
    }

    /// A failed sync rolls back its group and the group written behind it while it ran;
    /// neither is acknowledged, their ids are forgotten (Ray's resend is accepted), and
    /// only acknowledged events end up in the sealed segment.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failed_sync_rolls_back_the_groups_in_flight() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("spool");
        let (sealed_tx, mut sealed_rx) = tokio_mpsc::unbounded_channel();
        let cfg = SpoolConfig {
            dir: dir.clone(),
            rotation_interval: Duration::from_secs(3600),
            max_segment_bytes: 1 << 30,
            max_open_files: 16,
            dedup_window: 1000,
            max_bytes: 1 << 30,
            copies: true,
            write_session_markers: false,
            quarantine_node: "q".into(),
        };
        let (spool, _) = Spool::open(cfg, sealed_tx).unwrap();
        let ok = spool.append(batch(&["ok1"])).await.unwrap();
        assert_eq!(ok.accepted, 1);

        FAIL_NEXT_SYNC
            .lock()
            .unwrap()
            .push((dir.clone(), Duration::from_millis(400)));
        let first = tokio::spawn({
            let s = spool.clone();
            async move { s.append(batch(&["a1", "a2"])).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Written while the failing sync runs, so it sits behind it in the same file.
        let second = spool.append(batch(&["b1"])).await;
        let first = first.await.unwrap();
        assert!(first.is_err(), "{first:?}");
        assert!(second.is_err(), "{second:?}");

        let after = spool.append(batch(&["c1"])).await.unwrap();
        assert_eq!((after.accepted, after.duplicates), (1, 0));
        let resent = spool.append(batch(&["a1", "a2"])).await.unwrap();
        assert_eq!((resent.accepted, resent.duplicates), (2, 0));
        let again = spool.append(batch(&["ok1", "c1"])).await.unwrap();
        assert_eq!((again.accepted, again.duplicates), (0, 2));

        spool.seal_all().await.unwrap();
        let sealed = sealed_rx.recv().await.unwrap();
        let text = fs::read_to_string(&sealed.path).unwrap();
        assert_eq!(
            text,
            "{\"eventId\":\"ok1\"}\n{\"eventId\":\"c1\"}\n{\"eventId\":\"a1\"}\n{\"eventId\":\"a2\"}\n"
        );
        assert_eq!(sealed.bytes, text.len() as u64);
        spool.stop();
    }
}
