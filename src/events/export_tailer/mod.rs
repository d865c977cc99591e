//! Ray's file-based export events (`<session>/logs/export_events/event_EXPORT_*.log`),
//! tailed into the spool and uploaded partitioned by job.
//!
//! Ray Train's run and attempt history exists only here. Each line is one JSON object
//! (`event_id`, `timestamp` in seconds, `source_type`, `event_data`). Lines are read from a
//! per-file offset and appended to the spool like pushed events, so they share its
//! durability, deduplication and uploads, and land at
//! `P/<session>/<node>/export_events/<job-hex | node>/<node>-<YYYY-MM-DD-HH>-<n>.jsonl.gz`.
//!
//! Offsets are kept per file in `<spool>/export-offsets.json`, keyed by session and inode, and
//! applied only to the file they were read from: one with the same birth time, the same whole
//! first line and no fewer bytes ([`identity`]), so a new file that got a deleted backup's
//! inode is read from its start; when that backup's lines are in the batch being read (Ray's
//! rotation ran during the pass), the batch is stored first, with the backup's offset, so its
//! lines never go with its entry (review r41n D1). A quarantined line is remembered by the
//! same identity (`file_id`), so a new file's bad line never passes for an older file's
//! (review r41n D3). Lines are stored
//! in batches (whole lines of one or many files, at most [`MAX_READ`] bytes), and each batch
//! carries the offsets it reaches as the spool's `Checkpoint`: the spool's writer saves
//! them (fsync'd) once the batch is durable and before any segment holding it can be sealed,
//! i.e. handed to the uploader, which deletes a segment once uploaded. So a crash at any
//! moment repeats only lines of the last batch whose offsets were not saved, and those are
//! still in a spool segment: the restart reloads their ids (hashed with the export salt, as
//! at ingest; a quarantined line's key, its file's identity and offset, with them) into the
//! deduplication window, which drops them (a batch holds at most 8 MiB
//! of lines, some thousands of Ray's export events of about 1 KB, well within the window's
//! default of 262,144 ids; with `--dedup-window 0` nothing is dropped). (Saving the offsets
//! from the
//! tailer after the append answered would leave a moment in which a sealed segment can be
//! uploaded and deleted first; a crash there duplicated a whole read in the bucket.) Ray
//! rotates these files by renaming (`name` → `name.1`), which keeps the inode, so a
//! rotation neither loses nor repeats a line. An incomplete last line
//! is left for the next read, except in a finished file (a rotated backup, which Ray never
//! writes again): there the torn last line is read as the file's last line, so it is stored if
//! it is JSON and quarantined with its file and offset if not, and logged either way.
//!
//! Train attempts carry no job id: they are filed under the job of their run. So a pass reads
//! the files that hold runs (`event_EXPORT_TRAIN_RUN*` without `_ATTEMPT`, and Ray Train's
//! mixed `event_EXPORT_TRAIN_STATE*`) before every other file, whatever their backup index,
//! and only then the attempts; an attempt whose run was never seen goes under `node`, and
//! nothing already stored is moved. Backups are recognised under both names Ray's writers give
//! them (`name.log.N` from Python and Ray's patched spdlog, `name.N.log` from stock spdlog)
//! and read oldest first, before their live file.
//!
//! The tailer shares the spool's disk budget with Ray's pushed events, which get 503 above
//! 90 % of it. A backlog of export lines is already on disk in Ray's own files, so a batch
//! never takes the spool past [`YIELD_PERCENT`] of the budget, whatever the budget: its
//! lines are counted as the spool counts them (a quarantined line as its record, each with
//! the room reserved for its compressed copy), with the files each partition it opens makes
//! ([`PARTITION_FILES_COST`]), the marker file of each session it holds lines of that the
//! tailer never stored lines of (on the head the spool writes one per session; a worker,
//! which writes none, leaves that little room aside once per session: review r41n D4), and
//! the growth files segments have yet to claim, and a
//! line that does not fit the room left is not read yet. A batch opens at most
//! `MAX_PARTITIONS_PER_REQUEST` partitions, the spool's bound for one request (past it
//! the spool re-homes events to their arrival hour, then quarantines them): it ends before,
//! so every line is stored at its own job and hour (review r41i D1). The rest of the room is
//! left to pushed events; reading resumes once uploads have made room. A batch reads at most
//! [`MAX_READ`] bytes, but an empty batch always takes one quarantine record larger than that
//! (of a line cut at [`line_limit`], or of a whole line that is not JSON: up to
//! [`RECORD_GROWTH`] times its bytes) while it fits below the yield mark, so an overlong or
//! bad line is quarantined and reading goes on; [`line_limit`] makes it fit an empty spool
//! whatever the budget. A line of [`line_limit`] bytes or more is always cut there, whatever
//! the room of the read, so a file is read in the same pieces (and its first line, part of its
//! identity, is the same) in every run that reads it (review r41q D4).
//!
//! Reading ends [`FINAL_PASS_LIMIT`] after the shutdown is seen, whether a regular pass is
//! running then (it is checked between two files and between two batches) or the last pass
//! starts, so the events already in the spool keep the rest of the deadline.
//!
//! The offsets file is saved with every batch (one fsync per batch of up to 8 MiB, not per
//! file) and at the end of each pass (a checkpoint without lines), always by the spool's
//! writer, and entries of files that no longer exist (not in a listing taken after the
//! pass's reading, so a file rotated during the pass keeps its entry) are dropped from it.
//! When a save fails, the batch's lines stay stored and its offsets kept in memory, the
//! spool seals no segment until a later save succeeds, and no line is read before that.
//! When storing a batch fails (the spool could not write it, ENOSPC say, or refused it as
//! over its budget; the spool rolls the whole batch back), its offsets do not advance. A
//! batch holding lines of a file gone from Ray's files (a backup deleted by Ray's rotation
//! while it was read: review r41q) is kept in memory: each later pass first stores it, in
//! parts sized to the room below [`YIELD_PERCENT`] at that moment (its lines in the order
//! read, each part with the offsets its lines reach in each file), and reads nothing new
//! before all of it is stored; a line that has no room waits for uploads, like a line in
//! Ray's files (review r41s D1: stored whole, a batch read at a low copy ratio needed more
//! than the whole budget at the ratio pushed events had since raised, and was refused for as
//! long as they held a few KiB). Any other batch is dropped and its lines read again next
//! pass, in a batch sized to the room then. Memory stays bounded: at
//! most one batch is kept, since nothing is read while one is (at most [`MAX_READ`] bytes
//! of lines, or one cut line of at most [`line_limit`] bytes, with a 16-byte span per
//! line, and where each piece read sits in the body and its file). A batch still unstored when the collector exits is lost for a file that is gone;
//! a file still there is read again from its saved offset by the next start.
//!
//! Layout: this file is the face (the configuration, the tailer, its passes and the room it
//! leaves pushed events); `read` finds Ray's files and reads whole lines from them; `batch`
//! routes the lines of a batch into partitions and stores it in the spool with its offsets;
//! `offsets` is the checkpoint of how far each file was read; `identity` tells a file's
//! identity across renames.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::contract::is_safe_segment;
use crate::events::spool::{Spool, SpoolError, FILE_BUDGET_BYTES, MAX_COST_PER_LINE_BYTE};
use crate::node::node_id::NodeIdResolver;
use crate::node::session::{list_sessions, ActiveSession};

mod batch;
mod identity;
mod offsets;
mod read;
use batch::{Batch, Unstored};
use offsets::{date_older_entries, offsets_path, OffsetsFile, OFFSETS_VERSION};
use read::{list_export_files, present_files, read_order, split_backup, Piece};

/// Most bytes of one batch (one spool append and one save of the offsets), so one huge
/// backlog cannot hog the spool's writer and a crash repeats little; also the longest line
/// kept whole, less when the spool's budget is small: see [`line_limit`].
const MAX_READ: u64 = 8 << 20;
/// What a partition new to a batch costs the spool's budget besides its lines: its segment
/// file, claimed when it is opened, and the two growth files (shadow and record) its upload
/// claims. Counted as line bytes (so a little more than needed).
const PARTITION_FILES_COST: u64 = 3 * FILE_BUDGET_BYTES;
/// Share of the spool's budget the tailer fills at most (pushed events get 503 at 90 %): a
/// batch never takes the spool past it, so the last tenth below the 503 mark is always
/// left to pushed events.
pub const YIELD_PERCENT: u64 = 80;
/// A byte of a line kept in a quarantine record takes at most this many: serde_json writes a
/// control character as `\u00XX`.
const RECORD_GROWTH: u64 = 6;
/// The rest of a quarantine record at most: reason, sentence, time, file name (at most 255
/// bytes), offset and keys.
const RECORD_FIELDS: u64 = 1024;
/// How often a kept batch is tried again during the shutdown's last pass.
const KEPT_RETRY_AT_SHUTDOWN: Duration = Duration::from_millis(100);

/// Longest last pass at shutdown: lines left then are still in Ray's files for the next
/// start, while the time left goes to uploading what the spool holds.
pub const FINAL_PASS_LIMIT: Duration = Duration::from_secs(5);

/// Settings of the tailer.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// Ray's temp root.
    pub ray_tmp: PathBuf,
    /// Where the offsets file lives (the spool dir).
    pub state_dir: PathBuf,
    /// Time between passes when nothing wakes the tailer earlier.
    pub poll_interval: Duration,
    /// The spool's disk budget (`--max-spool-bytes`), shared with pushed events.
    pub max_spool_bytes: u64,
}

/// Tails every session's export event files.
pub struct ExportTailer {
    cfg: ExportConfig,
    spool: Spool,
    nodes: NodeIdResolver,
    state: OffsetsFile,
    dirty: bool,
    /// Whether the last pass stopped for pushed events (logged on change only).
    yielding: bool,
    /// When reading ends: [`FINAL_PASS_LIMIT`] after the shutdown was first seen.
    stop_at: Option<Instant>,
    /// Whether the end of reading was logged.
    time_up_logged: bool,
    /// A batch whose store failed, stored again before anything new is read.
    unstored: Option<Unstored>,
    /// Sessions this tailer stored lines of: their session markers exist (on the head). A
    /// batch counts the marker file of any other session it holds lines of (one of the
    /// node's sessions each, dropped with the session's export directory).
    stored_sessions: HashSet<String>,
}

/// Why storing a batch failed; the batch is kept and stored again next pass ([`Unstored`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The offsets could not be encoded as JSON.
    #[error("encoding the export offsets: {0}")]
    Encode(serde_json::Error),
    /// The spool refused the batch (over its budget) or could not write it.
    #[error("appending export events to the spool: {0}")]
    Spool(SpoolError),
    /// The next line of the kept batch has no room below the yield mark yet.
    #[error("no room below the spool's mark for the next kept export line yet")]
    NoRoom,
}

impl StoreError {
    /// The lines are stored but their offsets not saved ([`SpoolError::Checkpoint`]).
    fn is_checkpoint(&self) -> bool {
        matches!(self, StoreError::Spool(SpoolError::Checkpoint { .. }))
    }
}

/// The file a piece is read from.
struct FileRef<'a> {
    session: &'a str,
    /// The session directory: files are opened from its descriptor (`util::fs::Beneath`).
    dir: &'a Path,
    node: &'a str,
    name: &'a str,
    path: &'a Path,
    finished: bool,
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    /// Lines stored.
    pub accepted: u64,
    /// Lines dropped as already stored.
    pub duplicates: u64,
    /// Lines quarantined.
    pub quarantined: u64,
    /// Bytes of the files consumed.
    pub bytes: u64,
}

impl PassReport {
    fn add(&mut self, r: PassReport) {
        self.accepted += r.accepted;
        self.duplicates += r.duplicates;
        self.quarantined += r.quarantined;
        self.bytes += r.bytes;
    }
}

impl ExportTailer {
    /// Loads saved offsets (a damaged file is reported and replaced: lines are then read
    /// again and the deduplication window drops what the spool still holds).
    pub fn new(cfg: ExportConfig, spool: Spool, nodes: NodeIdResolver) -> ExportTailer {
        let path = offsets_path(&cfg.state_dir);
        let mut state: OffsetsFile = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::error!(path = %path.display(), error = %e, "export offsets unreadable; reading export files from the start");
                OffsetsFile::default()
            }),
            Err(_) => OffsetsFile::default(),
        };
        date_older_entries(&mut state, &path);
        state.version = OFFSETS_VERSION;
        ExportTailer {
            cfg,
            spool,
            nodes,
            state,
            dirty: false,
            yielding: false,
            stop_at: None,
            time_up_logged: false,
            unstored: None,
            stored_sessions: HashSet::new(),
        }
    }

    /// Tails until `shutdown`, then makes one last pass so lines written just before the
    /// end are kept, and returns. Reading ends [`FINAL_PASS_LIMIT`] after `shutdown` is seen,
    /// whether the pass running then is a regular one or the last.
    pub async fn run(
        mut self,
        sessions: watch::Receiver<Option<ActiveSession>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let (tx, mut rx) = mpsc::channel::<()>(1);
        let mut watcher = None;
        let mut watched: Option<PathBuf> = None;
        let mut tick = tokio::time::interval(self.cfg.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let active = sessions.borrow().clone();
            let dir = active
                .as_ref()
                .map(|s| s.dir.join("logs").join("export_events"));
            if dir != watched && dir.as_ref().is_some_and(|d| d.is_dir()) {
                watcher = dir
                    .as_ref()
                    .and_then(|d| crate::util::watch::watch_dir(d, tx.clone(), true));
                watched = dir.clone();
            }
            let last = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = rx.recv() => {
                    // Batch a burst of writes into one pass.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    while rx.try_recv().is_ok() {}
                    false
                }
                // A sender gone is an end too: nobody is left to say stop.
                changed = shutdown.changed() => changed.is_err() || *shutdown.borrow(),
            };
            if last {
                self.stop_at
                    .get_or_insert_with(|| Instant::now() + FINAL_PASS_LIMIT);
            }
            self.pass_until(&shutdown).await;
            if last {
                // A kept batch (lines of a file that may be gone) is tried again until
                // reading ends: the shutdown's uploads make room meanwhile (review r41t D1:
                // it was dropped at once, silently, with room there 26 ms later).
                while self.unstored.is_some() && !self.out_of_time(&shutdown) {
                    tokio::time::sleep(KEPT_RETRY_AT_SHUTDOWN).await;
                    self.pass_until(&shutdown).await;
                }
                if let Some(u) = &self.unstored {
                    let left = &u.body[u.stored_to.min(u.body.len())..];
                    tracing::error!(
                        lines = left.iter().filter(|&&b| b == b'\n').count(),
                        bytes = left.len(),
                        "export event lines kept for a file that may be gone (a rotated backup Ray deleted) were not stored before the shutdown's reading ended: lost if their file is gone; the next start reads them again if it is not"
                    );
                }
                break;
            }
        }
        drop(watcher);
    }

    /// True once reading must end: [`FINAL_PASS_LIMIT`] after `shutdown` was first seen.
    fn out_of_time(&mut self, shutdown: &watch::Receiver<bool>) -> bool {
        if self.stop_at.is_none() && *shutdown.borrow() {
            self.stop_at = Some(Instant::now() + FINAL_PASS_LIMIT);
        }
        let over = self.stop_at.is_some_and(|d| Instant::now() >= d);
        if over && !self.time_up_logged {
            self.time_up_logged = true;
            tracing::warn!(
                limit_s = FINAL_PASS_LIMIT.as_secs(),
                "reading export event files stopped {}s after the shutdown began; the rest is read by the next start",
                FINAL_PASS_LIMIT.as_secs()
            );
        }
        over
    }

    /// Reads every session's export files once, in batches of whole lines from one or many
    /// files (one spool append and one save of the offsets each), stopping between two reads
    /// when the time is up ([`Self::out_of_time`]) or when the spool has no room below
    /// [`YIELD_PERCENT`] of its budget for the next line.
    async fn pass_until(&mut self, shutdown: &watch::Receiver<bool>) -> PassReport {
        let mut total = PassReport::default();
        // Offsets of stored lines not saved yet (a failed checkpoint): the spool seals
        // nothing until they are, so nothing more is read before.
        self.save().await;
        if self.dirty {
            return total;
        }
        // A batch whose store failed: its lines may be gone from Ray's files (a deleted
        // backup), so it is stored, as it was read, before anything new is read.
        if self.unstored.is_some() {
            match self.store_kept().await {
                Ok(r) => total.add(r),
                Err(_) => return total,
            }
        }
        let mut stopped = false;
        let mut full = false;
        let mut batch = Batch::default();
        for s in list_sessions(&self.cfg.ray_tmp) {
            let dir = s.dir.join("logs").join("export_events");
            if !dir.is_dir() {
                continue;
            }
            if stopped {
                break;
            }
            let Ok(mut files) = list_export_files(&dir) else {
                continue;
            };
            let Some(node) = self.nodes.resolve_local(&s.dir) else {
                continue; // the node is not known yet; the lines wait on disk
            };
            files.sort_by_key(|(name, _, _)| read_order(name));
            'files: for (name, path, _) in files {
                let finished = split_backup(&name).1 > 0;
                loop {
                    if self.out_of_time(shutdown) {
                        stopped = true;
                        break 'files;
                    }
                    if batch.is_empty() {
                        batch.spare = self.spool_room();
                        batch.room = batch.spare.min(MAX_READ);
                    }
                    let file = FileRef {
                        session: &s.name,
                        dir: &s.dir,
                        node: &node,
                        name: &name,
                        path: &path,
                        finished,
                    };
                    match self.read_piece(&file, &mut batch).await {
                        Ok(Piece::Read) => {}
                        Ok(Piece::Done) => break,
                        Ok(Piece::NoRoom) if batch.is_empty() => {
                            // Not even an empty batch takes the next line: wait for uploads.
                            full = true;
                            stopped = true;
                            break 'files;
                        }
                        Ok(piece @ (Piece::NoRoom | Piece::StoreFirst)) => match self
                            .flush(&mut batch, matches!(piece, Piece::StoreFirst))
                            .await
                        {
                            Ok(r) => total.add(r),
                            Err(_) => {
                                stopped = true;
                                break 'files;
                            }
                        },
                        Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                            // A symlink or odd file swapped in: never followed; not news
                            // every pass.
                            tracing::debug!(file = %path.display(), error = %e, "export events file not followed");
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(file = %path.display(), error = %e, "reading export events failed; retried next pass");
                            break;
                        }
                    }
                }
            }
        }
        if let Ok(r) = self.flush(&mut batch, false).await {
            total.add(r);
        }
        self.note_yield(full);
        // Listed now, after the reading: a file read in this pass is found under its
        // current name even if Ray rotated it (or created its new live file) meanwhile.
        self.prune(&present_files(&self.cfg.ray_tmp));
        self.save().await;
        total
    }

    /// Bytes of lines the next batch may add to the spool: up to [`YIELD_PERCENT`] of the
    /// budget, counted by the spool's one rule with the room reserved for their compressed
    /// copies and the growth files the segments will claim (the rest is for pushed
    /// events); a batch takes at most [`MAX_READ`] of it but for one overlong record, and
    /// counts the files of each partition it opens ([`PARTITION_FILES_COST`]).
    fn spool_room(&self) -> u64 {
        let stats = self.spool.stats();
        // The growth files the segments, open and sealed (this tailer's earlier partitions
        // among them), will claim once published or sealed are not counted yet: left aside
        // now.
        let growth = stats
            .unclaimed_growth_files()
            .saturating_mul(FILE_BUDGET_BYTES);
        stats
            .budget()
            .room_for_lines(yield_mark(self.cfg.max_spool_bytes).saturating_sub(growth))
    }

    /// Logs when the tailer starts and stops waiting for room in the spool.
    fn note_yield(&mut self, full: bool) {
        if full == self.yielding {
            return;
        }
        self.yielding = full;
        let used = self.spool.stats().budget_used();
        if full {
            tracing::warn!(
                budget_used_bytes = used,
                mark_bytes = yield_mark(self.cfg.max_spool_bytes),
                "spool at {YIELD_PERCENT}% of its budget: export event files wait on disk so pushed events keep room"
            );
        } else {
            tracing::info!(
                budget_used_bytes = used,
                "spool has room again: reading export event files"
            );
        }
    }

    /// Drops the offsets of files that are gone: those of a session whose export directory
    /// no longer exists, and those of a listed session whose inode is not in `present`, a
    /// listing taken after the pass's reading (so it holds every file read in the pass).
    fn prune(&mut self, present: &BTreeMap<String, HashSet<u64>>) {
        let before = self.state.files.len();
        let ray_tmp = &self.cfg.ray_tmp;
        self.state.files.retain(|key, off| {
            let Some((session, _)) = key.split_once('/') else {
                return false;
            };
            match present.get(session) {
                Some(inodes) => inodes.contains(&off.inode),
                // Not listed this pass: kept unless its directory is gone.
                None => {
                    is_safe_segment(session)
                        && ray_tmp
                            .join(session)
                            .join("logs")
                            .join("export_events")
                            .is_dir()
                }
            }
        });
        if self.state.files.len() != before {
            self.dirty = true;
        }
        self.stored_sessions.retain(|s| present.contains_key(s));
    }
}

/// Spool bytes at which the tailer stops reading: [`YIELD_PERCENT`] of the budget.
fn yield_mark(max_spool_bytes: u64) -> u64 {
    max_spool_bytes / 100 * YIELD_PERCENT
}

/// The longest line kept whole: [`MAX_READ`], or less when the budget is small, so that the
/// quarantine record of a longer line's first part (at most [`RECORD_GROWTH`] times its
/// bytes plus [`RECORD_FIELDS`], and the room reserved for its compressed copy) fits below
/// the yield mark of an empty spool and the file never stalls on it.
fn line_limit(max_spool_bytes: u64) -> u64 {
    ((yield_mark(max_spool_bytes) / MAX_COST_PER_LINE_BYTE).saturating_sub(RECORD_FIELDS)
        / RECORD_GROWTH)
        .clamp(1, MAX_READ)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_line_fits_an_empty_spool_below_the_mark() {
        assert_eq!(line_limit(1 << 30), MAX_READ);
        for budget in [1u64 << 10, 1 << 20, 5 << 20, 40 << 20, 1 << 30] {
            let limit = line_limit(budget);
            assert!(limit >= 1);
            assert!(
                limit == 1
                    || (limit * RECORD_GROWTH + RECORD_FIELDS) * MAX_COST_PER_LINE_BYTE
                        <= yield_mark(budget),
                "{budget}"
            );
        }
    }
}
