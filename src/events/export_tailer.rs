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
//! carries the offsets it reaches as the spool's [`Checkpoint`]: the spool's writer saves
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
//! ([`PARTITION_FILES_COST`]) and the growth files segments have yet to claim, and a
//! line that does not fit the room left is not read yet. A batch opens at most
//! [`MAX_PARTITIONS_PER_REQUEST`] partitions, the spool's bound for one request (past it
//! the spool re-homes events to their arrival hour, then quarantines them): it ends before,
//! so every line is stored at its own job and hour (review r41i D1). The rest of the room is
//! left to pushed events; reading resumes once uploads have made room. A batch reads at most
//! [`MAX_READ`] bytes, but an empty batch always takes one quarantine record larger than that
//! (of a line cut at [`line_limit`], or of a whole line that is not JSON: up to
//! [`RECORD_GROWTH`] times its bytes) while it fits below the yield mark, so an overlong or
//! bad line is quarantined and reading goes on; [`line_limit`] makes it fit an empty spool
//! whatever the budget.
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
//! while it was read: review r41q) is kept in memory, whole: each later pass first stores
//! it again, as it was read, and reads nothing new before it is stored. Any other batch is
//! dropped and its lines read again next pass, in a batch sized to the room then (review
//! r41s D1: kept, a batch sized to an earlier room never fitted while pushed events held a
//! few KiB). Memory stays bounded: at
//! most one batch is kept, since nothing is read while one is (at most [`MAX_READ`] bytes
//! of lines, or one cut line of at most [`line_limit`] bytes, with a 16-byte span per
//! line). A batch still unstored when the collector exits is lost for a file that is gone;
//! a file still there is read again from its saved offset by the next start.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::contract::events::EXPORT_NODE_GROUP;
use crate::contract::{id_to_hex, is_safe_segment, Hour, Partition, Stream};
use crate::events::dedup::id_hash;
use crate::events::quarantine::{raw_record, QuarantineReason};
use crate::events::spool::{
    AppendBatch, Checkpoint, EventSpan, LineSource, PartitionBatch, QuarantinedEvent, Spool,
    SpoolError, FILE_BUDGET_BYTES, MAX_COST_PER_LINE_BYTE, MAX_PARTITIONS_PER_REQUEST,
};
use crate::node::node_id::NodeIdResolver;
use crate::node::session::{list_sessions, ActiveSession};

mod identity;
use identity::{FirstLine, Identity, Known, Verdict};

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

/// Version of the offsets file written now: 1 added the file identity (first line, birth
/// time) to each entry; version 0 entries are read too (see [`identity`]).
const OFFSETS_VERSION: u32 = 1;

/// Where reading stopped in one file, and which file that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct FileOffset {
    inode: u64,
    offset: u64,
    /// Hash of the first `min(offset, 64)` bytes: all an older collector kept, and still
    /// written so that one can read this file.
    fingerprint: u64,
    /// The file's first line (absent in entries of an older collector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    first_line: Option<FirstLine>,
    /// The file's birth time, where the filesystem records one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    born_ns: Option<u64>,
    /// An entry without `first_line`: when it was saved at the latest (the modification time
    /// of the offsets file it was loaded from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    saved_before_ns: Option<u64>,
}

impl FileOffset {
    fn known(&self) -> Known {
        Known {
            offset: self.offset,
            legacy_fingerprint: self.fingerprint,
            identity: self.first_line.map(|first_line| Identity {
                first_line,
                born_ns: self.born_ns,
            }),
            saved_before_ns: self.saved_before_ns,
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct OffsetsFile {
    version: u32,
    /// `<session>/<inode>` → offset.
    files: BTreeMap<String, FileOffset>,
    /// Train run id → job hex, so attempts follow their run across restarts.
    run_jobs: BTreeMap<String, String>,
}

/// The routing view of one export event line.
#[derive(Deserialize)]
struct ExportLine<'a> {
    #[serde(borrow, default)]
    event_id: Option<Cow<'a, str>>,
    #[serde(default)]
    timestamp: Option<i64>,
    #[serde(borrow, default)]
    source_type: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    event_data: Option<ExportData<'a>>,
}

#[derive(Deserialize)]
struct ExportData<'a> {
    #[serde(borrow, default)]
    job_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    run_id: Option<Cow<'a, str>>,
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
}

/// Whole lines read in one pass and not yet stored, from one file or many (a pass over
/// thousands of small files makes one append and one save of the offsets per batch, not per
/// file).
#[derive(Default)]
struct Batch {
    /// The lines, file after file.
    body: Vec<u8>,
    partitions: Vec<PartitionBatch>,
    quarantined: Vec<QuarantinedEvent>,
    /// Where each file's reading ends once the batch is stored.
    offsets: BTreeMap<String, FileOffset>,
    /// Bytes the batch adds to the spool (a quarantined line as its record).
    cost: u64,
    /// Most bytes it may add: the spool's room below the yield mark when it was started
    /// ([`ExportTailer::spool_room`]), at most [`MAX_READ`].
    room: u64,
    /// Room below the yield mark when it was started, not bounded by [`MAX_READ`]: an
    /// empty batch takes one quarantine record larger than `room` (a cut line's, or a
    /// whole line's that is not JSON, up to six times its bytes) while it fits here, so
    /// such a line never stalls the file ([`Batch::takes`]).
    spare: u64,
    /// Bytes of the files it consumes.
    bytes: u64,
}

impl Batch {
    /// Whether nothing was read into it: judged by its lines, not its offsets, so lines
    /// read are stored whatever became of their file's entry.
    fn is_empty(&self) -> bool {
        self.body.is_empty() && self.offsets.is_empty()
    }

    /// Whether the batch takes `cost` more bytes: while they fit its room, and one record
    /// alone in an empty batch while it fits the spool's room below the yield mark (a
    /// quarantine record of a line of up to [`MAX_READ`] bytes may be larger than the room).
    fn takes(&self, cost: u64) -> bool {
        self.cost.saturating_add(cost) <= self.room || (self.cost == 0 && cost <= self.spare)
    }

    /// Records that the file `key` (inode `ino`, first bytes `head`, identity `id`), read
    /// from `start`, is consumed up to `offset` once the batch is stored.
    fn record(
        &mut self,
        key: String,
        ino: u64,
        start: u64,
        offset: u64,
        head: &[u8],
        id: Identity,
    ) {
        self.bytes += offset.saturating_sub(start);
        let n = (offset.min(identity::LEGACY_FINGERPRINT_BYTES) as usize).min(head.len());
        self.offsets.insert(
            key,
            FileOffset {
                inode: ino,
                offset,
                fingerprint: xxhash_rust::xxh3::xxh3_64(&head[..n]),
                first_line: Some(id.first_line),
                born_ns: id.born_ns,
                saved_before_ns: None,
            },
        );
    }
}

/// A batch whose store failed (the spool could not write it, or refused it as over its
/// budget) and that holds lines of a file gone from Ray's files (a backup deleted by Ray's
/// rotation, [`Piece::StoreFirst`]): kept whole, with the offsets it reaches, and stored again
/// at the start of each pass before anything new is read. Any other failed batch is dropped
/// and its lines read again next pass from its files, in a batch sized to the room then
/// (review r41s D1: a kept batch sized to a room measured earlier never fitted again while
/// pushed events held a few KiB, and the tailer read nothing more). At most one exists (nothing is read while it does), so it
/// holds at most one batch of lines ([`MAX_READ`] bytes, or one cut line of at most
/// [`line_limit`] bytes) and their spans.
struct Unstored {
    /// The lines, shared with the append that retries them.
    body: Bytes,
    partitions: Vec<PartitionBatch>,
    quarantined: Vec<QuarantinedEvent>,
    /// Where each file's reading ends once the batch is stored.
    offsets: BTreeMap<String, FileOffset>,
    /// Bytes of the files it consumes.
    bytes: u64,
    /// Failed stores so far (the first is logged as a warning, the rest at debug level).
    failures: u32,
    /// Kept when its store fails: it holds lines of a file that is gone.
    keep: bool,
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

/// What reading a file into a batch did.
enum Piece {
    /// Lines were added; more may follow.
    Read,
    /// Nothing new (or only an incomplete last line).
    Done,
    /// The batch has no room for the file's next line.
    NoRoom,
    /// The batch holds lines of another file that had this inode (Ray's rotation deleted a
    /// backup read into it and the new live file took its inode): the batch is stored first,
    /// with that file's offset, and this file is then read from its start (review r41n D1).
    StoreFirst,
}

/// Where one line goes.
enum Routed {
    Blank,
    Quarantine(QuarantineReason),
    Event {
        partition: Partition,
        id: Option<u64>,
        /// A Train run and its job, remembered once the line is taken.
        run: Option<(String, String)>,
    },
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

fn offsets_path(dir: &Path) -> PathBuf {
    dir.join("export-offsets.json")
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
        if let Some(unstored) = self.unstored.take() {
            match self.store(unstored).await {
                Ok(r) => {
                    tracing::info!(
                        lines = r.accepted + r.duplicates + r.quarantined,
                        "export events kept after a failed store are stored"
                    );
                    total.add(r);
                }
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
    }

    /// Adds the next whole lines of one file to `batch`, as many as its room takes. In a
    /// `finished` file (a backup Ray no longer writes) a last line without its newline is
    /// read as a line too. A line with no newline within [`line_limit`] bytes is cut there
    /// and its first part quarantined.
    async fn read_piece(&mut self, file: &FileRef<'_>, batch: &mut Batch) -> io::Result<Piece> {
        let meta = std::fs::symlink_metadata(file.path)?;
        if !meta.file_type().is_file() {
            return Ok(Piece::Done);
        }
        let key = format!("{}/{}", file.session, meta.ino());
        let known = batch
            .offsets
            .get(&key)
            .or_else(|| self.state.files.get(&key))
            .copied();
        let room = batch.room.saturating_sub(batch.cost);
        let base = batch.body.len();
        let body = &mut batch.body;
        // Up to 8 MiB of reading: off the async workers, which serve Ray's requests.
        /// What the blocking part found: where reading starts, the file's identity when it is
        /// the file `known` was read from, why not when another file took its inode, and the
        /// piece read (its length, and the file's first bytes) when there was anything new.
        struct Found {
            start: u64,
            id: Option<Identity>,
            other: Option<&'static str>,
            read: Option<(u64, Vec<u8>)>,
        }
        let found = off_async_thread(|| -> io::Result<Found> {
            // From the session directory's descriptor, never through a symlink (a `logs`
            // directory swapped for one included): see `util::fs::Beneath`.
            let mut f = crate::util::fs::Beneath {
                root: file.dir.to_path_buf(),
                rel: Path::new("logs").join("export_events").join(file.name),
                dev: meta.dev(),
                ino: meta.ino(),
            }
            .open()?;
            let (start, id, other) = match known.filter(|o| o.inode == meta.ino()) {
                Some(o) => match identity::judge(&f, &meta, &o.known())? {
                    Verdict::Same(id) if o.offset > 0 => (o.offset, Some(id), None),
                    Verdict::Same(_) => (0, None, None),
                    Verdict::Other(why) => (0, None, Some(why)),
                },
                None => (0, None, None),
            };
            if start >= meta.len() {
                return Ok(Found {
                    start,
                    id,
                    other,
                    read: None,
                });
            }
            let want = (meta.len() - start).min(room);
            body.resize(base + want as usize, 0);
            f.seek(SeekFrom::Start(start))?;
            f.read_exact(&mut body[base..])?;
            let mut head = vec![0u8; meta.len().min(identity::LEGACY_FINGERPRINT_BYTES) as usize];
            f.seek(SeekFrom::Start(0))?;
            f.read_exact(&mut head)?;
            Ok(Found {
                start,
                id,
                other,
                read: Some((want, head)),
            })
        });
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                batch.body.truncate(base);
                return Err(e);
            }
        };
        if found.other.is_some() && batch.offsets.contains_key(&key) {
            // The batch holds lines of the file this entry was read from (gone now): they
            // are stored first, with its offset; this file is read once that is done.
            batch.body.truncate(base);
            return Ok(Piece::StoreFirst);
        }
        if let Some(why) = found.other {
            // The entry was another file's, now gone: forgotten, so this is said once.
            tracing::info!(
                file = %file.path.display(),
                inode = meta.ino(),
                reason = why,
                "export file at the inode of a file read before: read from its start"
            );
            self.state.files.remove(&key);
            batch.offsets.remove(&key);
            self.dirty = true;
        } else if let (Some(id), Some(entry)) = (found.id, self.state.files.get_mut(&key)) {
            // An older collector's entry, recognised: it keeps the file's identity from now.
            if entry.first_line.is_none() {
                entry.first_line = Some(id.first_line);
                entry.born_ns = id.born_ns;
                entry.saved_before_ns = None;
                self.dirty = true;
            }
        }
        let (start, id) = (found.start, found.id);
        let Some((want, head)) = found.read else {
            batch.body.truncate(base);
            return Ok(Piece::Done);
        };
        // A file read from its start is known from now on by what this read holds.
        let born = identity::born_ns(&meta);
        let identify = |body: &[u8], consumed: u64| {
            id.unwrap_or_else(|| Identity {
                first_line: FirstLine::of(body, consumed as usize),
                born_ns: born,
            })
        };
        if want == 0 {
            return Ok(Piece::NoRoom);
        }
        // Its quarantined lines are remembered by the identity its offsets keep (the same
        // bytes make it), so a new file (rewritten in place, or on a reused inode) never
        // matches an old file's record.
        let file_id = |body: &[u8], consumed: u64| {
            file_id(file.session, meta.ino(), &identify(body, consumed))
        };
        let at_eof = start + want == meta.len();
        let piece = &batch.body[base..];
        let complete = piece.iter().rposition(|&c| c == b'\n').map(|i| i + 1);
        // A finished file's torn last line will never be completed: read it now.
        let torn = file.finished && at_eof && piece.last() != Some(&b'\n');
        let limit = line_limit(self.cfg.max_spool_bytes);
        let end = if torn {
            batch.body.push(b'\n');
            want as usize + 1
        } else if let Some(end) = complete {
            end
        } else if want >= limit {
            // One line longer than the longest kept whole: keep its first part aside
            // instead of stalling.
            let cut = base + limit as usize;
            let cost = raw_record(
                QuarantineReason::ExportBadEvent,
                file.name,
                start,
                &batch.body[base..cut],
            )
            .len() as u64;
            if !batch.takes(cost) {
                batch.body.truncate(base);
                return Ok(Piece::NoRoom);
            }
            tracing::warn!(file = %file.path.display(), offset = start, limit, "export event line longer than the longest kept whole; its first part is quarantined");
            batch.body.truncate(cut);
            let file_id = file_id(&batch.body[base..], limit);
            batch.cost += cost;
            batch.quarantined.push(QuarantinedEvent {
                reason: QuarantineReason::ExportBadEvent,
                start: base,
                end: cut,
                source: Some(LineSource {
                    file: file.name.to_string(),
                    file_id,
                    offset: start,
                }),
            });
            let id = identify(&batch.body[base..], limit);
            batch.record(key, meta.ino(), start, start + limit, &head, id);
            return Ok(Piece::Read);
        } else {
            batch.body.truncate(base);
            // An incomplete last line waits for its newline; a longer read may hold it.
            return Ok(if at_eof { Piece::Done } else { Piece::NoRoom });
        };
        // The bytes the batch's offsets identify the file by when any line is taken (a torn
        // last line's added newline is not the file's).
        let file_id = file_id(&batch.body[base..], (end as u64).min(want));
        let taken = self.route_into(batch, base, end, file, file_id, start);
        batch.body.truncate(base + taken);
        if taken == 0 {
            return Ok(Piece::NoRoom);
        }
        let consumed = (taken as u64).min(want);
        if torn && taken == end {
            let at = start + complete.unwrap_or(0) as u64;
            tracing::warn!(
                file = %file.path.display(),
                offset = at,
                bytes = start + want - at,
                "a rotated export event file ends in a line without its newline; read as its last line"
            );
        }
        let id = identify(&batch.body[base..], consumed);
        batch.record(key, meta.ino(), start, start + consumed, &head, id);
        Ok(if taken < end {
            Piece::NoRoom
        } else {
            Piece::Read
        })
    }

    /// Routes the whole lines of `batch.body[base..base + end]` (read at `file_offset` of
    /// the file, whose identity is `file_id`) into the batch, while they fit its room;
    /// returns the bytes taken.
    fn route_into(
        &mut self,
        batch: &mut Batch,
        base: usize,
        end: usize,
        file: &FileRef<'_>,
        file_id: u64,
        file_offset: u64,
    ) -> usize {
        let source = |offset| {
            Some(LineSource {
                file: file.name.to_string(),
                file_id,
                offset,
            })
        };
        let stop = base + end;
        let mut pos = base;
        while pos < stop {
            let line_end = batch.body[pos..stop]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(stop, |i| pos + i);
            let line = &batch.body[pos..line_end];
            let offset = file_offset + (pos - base) as u64;
            let routed = self.route_line(line, file.session, file.node);
            let cost = match &routed {
                // Not stored, but counted: every byte read into the batch counts against
                // its bound, so no run of blank lines makes one batch hold a whole file.
                Routed::Blank => line.len() as u64 + 1,
                Routed::Event { partition, .. } => {
                    let new = !batch.partitions.iter().any(|p| p.partition == *partition);
                    // One request's partitions are bounded by the spool (past the bound
                    // it files events under the arrival hour, then quarantines them): a
                    // batch ends before it, the rest goes in the next one.
                    if new && batch.partitions.len() >= MAX_PARTITIONS_PER_REQUEST {
                        break;
                    }
                    line.len() as u64 + 1 + if new { PARTITION_FILES_COST } else { 0 }
                }
                Routed::Quarantine(reason) => {
                    let first = batch.quarantined.is_empty();
                    raw_record(*reason, file.name, offset, line).len() as u64
                        + if first { PARTITION_FILES_COST } else { 0 }
                }
            };
            if !batch.takes(cost) {
                break;
            }
            batch.cost += cost;
            match routed {
                Routed::Blank => {}
                Routed::Quarantine(reason) => batch.quarantined.push(QuarantinedEvent {
                    reason,
                    start: pos,
                    end: line_end,
                    source: source(offset),
                }),
                Routed::Event { partition, id, run } => {
                    if let Some((run, job)) = run {
                        if self.state.run_jobs.get(&run) != Some(&job) {
                            self.state.run_jobs.insert(run, job);
                            self.dirty = true;
                        }
                    }
                    // Every byte read into a batch counts against its room (at most
                    // MAX_READ), so its body stays far below what a span can address.
                    let span = EventSpan::new(pos..line_end, id, false);
                    match (
                        span,
                        batch
                            .partitions
                            .iter_mut()
                            .find(|p| p.partition == partition),
                    ) {
                        (Some(span), Some(p)) => p.events.push(span),
                        (Some(span), None) => batch.partitions.push(PartitionBatch {
                            partition,
                            events: vec![span],
                        }),
                        (None, _) => batch.quarantined.push(QuarantinedEvent {
                            reason: QuarantineReason::ExportBadEvent,
                            start: pos,
                            end: line_end,
                            source: source(offset),
                        }),
                    }
                }
            }
            pos = line_end + 1;
        }
        pos.min(stop) - base
    }

    /// Where one line goes.
    fn route_line(&self, line: &[u8], session: &str, node: &str) -> Routed {
        if line.iter().all(|c| c.is_ascii_whitespace()) {
            return Routed::Blank;
        }
        let parsed: ExportLine = match serde_json::from_slice(line) {
            Ok(p) => p,
            Err(e) if e.is_syntax() || e.is_eof() => {
                return Routed::Quarantine(QuarantineReason::ExportNotJson)
            }
            Err(_) => return Routed::Quarantine(QuarantineReason::ExportBadEvent),
        };
        let Some(ts) = parsed.timestamp else {
            return Routed::Quarantine(QuarantineReason::ExportBadEvent);
        };
        let data = parsed.event_data.as_ref();
        let job = match data
            .and_then(|d| d.job_id.as_deref())
            .filter(|j| !j.is_empty())
        {
            Some(j) => match id_to_hex(j) {
                Ok(h) => Some(h.as_str().to_string()),
                Err(_) => return Routed::Quarantine(QuarantineReason::ExportBadEvent),
            },
            None => None,
        };
        let source = parsed.source_type.as_deref().unwrap_or("");
        // Train runs name their job; their attempts only their run.
        let mut run = None;
        let job = match (source, data) {
            ("EXPORT_TRAIN_RUN", Some(d)) => {
                if let (Some(r), Some(j)) = (d.id.as_deref(), job.as_ref()) {
                    if is_safe_segment(r) {
                        run = Some((r.to_string(), j.clone()));
                    }
                }
                job
            }
            ("EXPORT_TRAIN_RUN_ATTEMPT", Some(d)) if job.is_none() => d
                .run_id
                .as_deref()
                .and_then(|r| self.state.run_jobs.get(r).cloned()),
            _ => job,
        };
        let group = job.unwrap_or_else(|| EXPORT_NODE_GROUP.to_string());
        Routed::Event {
            partition: Partition {
                session: session.to_string(),
                node: node.to_string(),
                stream: Stream::Export(group),
                hour: Hour::from_unix_seconds(ts),
            },
            id: parsed
                .event_id
                .as_deref()
                .map(|id| id_hash(id.as_bytes()) ^ crate::events::spool::EXPORT_ID_SALT),
            run,
        }
    }

    /// Stores the batch and, with it, the offsets it reaches (see [`Self::store`]); `keep`:
    /// it holds lines of a file that is gone, kept if its store fails ([`Unstored`]).
    async fn flush(&mut self, batch: &mut Batch, keep: bool) -> Result<PassReport, StoreError> {
        let b = std::mem::take(batch);
        if b.is_empty() {
            return Ok(PassReport::default());
        }
        self.store(Unstored {
            body: Bytes::from(b.body),
            partitions: b.partitions,
            quarantined: b.quarantined,
            offsets: b.offsets,
            bytes: b.bytes,
            failures: 0,
            keep,
        })
        .await
    }

    /// Stores a batch and, with it, the offsets it reaches (a [`Checkpoint`] the spool
    /// writes once the lines are durable and before any segment holding them can be
    /// uploaded). Refused or failed (the spool rolls the whole batch back), its offsets are
    /// not advanced and the batch is kept in [`Self::unstored`], stored again next pass
    /// before anything new is read: never dropped, as its lines may be gone from Ray's
    /// files (review r41q: a backup deleted by Ray's rotation). Errors are logged here.
    async fn store(&mut self, u: Unstored) -> Result<PassReport, StoreError> {
        let previous: Vec<(String, Option<FileOffset>)> = u
            .offsets
            .iter()
            .map(|(k, o)| (k.clone(), self.state.files.insert(k.clone(), *o)))
            .collect();
        let checkpoint = serde_json::to_vec(&self.state).map(|bytes| Checkpoint {
            path: offsets_path(&self.cfg.state_dir),
            bytes,
        });
        let outcome = match checkpoint {
            Ok(c) => self
                .spool
                .append(AppendBatch {
                    body: u.body.clone(),
                    partitions: u.partitions.clone(),
                    quarantined: u.quarantined.clone(),
                    quarantine_dropped: 0,
                    checkpoint: Some(c),
                })
                .await
                .map_err(StoreError::Spool),
            Err(e) => Err(StoreError::Encode(e)),
        };
        match outcome {
            Ok(o) => {
                // The checkpoint holds the whole state, prunes and runs included.
                self.dirty = false;
                Ok(PassReport {
                    accepted: o.accepted,
                    duplicates: o.duplicates,
                    quarantined: o.quarantined,
                    bytes: u.bytes,
                })
            }
            Err(e @ StoreError::Spool(SpoolError::Checkpoint { .. })) => {
                // The lines are stored, but their offsets are not saved: the spool seals
                // nothing until a later checkpoint (holding these offsets) is, so reading
                // stops until [`Self::save`] succeeds.
                tracing::warn!(error = %e, "export events stored but their offsets not saved; saved again next pass");
                self.dirty = true;
                Err(e)
            }
            Err(e) => {
                for (k, before) in previous {
                    match before {
                        Some(o) => self.state.files.insert(k, o),
                        None => self.state.files.remove(&k),
                    };
                }
                if !u.keep {
                    tracing::warn!(error = %e, "storing export events failed; read again next pass");
                    return Err(e);
                }
                let failures = u.failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(error = %e, "storing export events failed; the batch is kept and stored again next pass, before anything new is read");
                } else {
                    tracing::debug!(error = %e, failures, "storing kept export events failed again");
                }
                self.unstored = Some(Unstored { failures, ..u });
                Err(e)
            }
        }
    }

    /// Saves the offsets when they changed, as a checkpoint without lines: the spool's writer
    /// is the only one to write the file, and a save clears a failed batch's checkpoint.
    async fn save(&mut self) {
        if !self.dirty {
            return;
        }
        let path = offsets_path(&self.cfg.state_dir);
        let result = match serde_json::to_vec(&self.state) {
            Ok(bytes) => self
                .spool
                .append(AppendBatch {
                    body: Bytes::new(),
                    partitions: Vec::new(),
                    quarantined: Vec::new(),
                    quarantine_dropped: 0,
                    checkpoint: Some(Checkpoint {
                        path: path.clone(),
                        bytes,
                    }),
                })
                .await
                .map_err(StoreError::Spool),
            Err(e) => Err(StoreError::Encode(e)),
        };
        match result {
            Ok(_) => self.dirty = false,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "could not save export offsets")
            }
        }
    }
}

/// Runs blocking file work without stalling the other tasks of an async worker thread
/// (they move to another worker meanwhile); runs it inline outside a multi-thread runtime.
fn off_async_thread<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// `event_EXPORT_TASK.log.3` (Python, Ray's patched spdlog) and `event_EXPORT_TASK.3.log`
/// (stock spdlog) → (`event_EXPORT_TASK.log`, 3); the live file → (its name, 0).
fn split_backup(name: &str) -> (Cow<'_, str>, u32) {
    if let Some((base, n)) = name.rsplit_once('.') {
        if let Ok(i) = n.parse::<u32>() {
            return (Cow::Borrowed(base), i);
        }
    }
    if let Some(stem) = name.strip_suffix(".log") {
        if let Some((base, n)) = stem.rsplit_once('.') {
            if let Ok(i) = n.parse::<u32>() {
                return (Cow::Owned(format!("{base}.log")), i);
            }
        }
    }
    (Cow::Borrowed(name), 0)
}

/// The order files are read in: files that can hold Train runs first (so every attempt's run
/// is known when the attempt is routed), then the rest; within each, the oldest backup first
/// and the live file last, then by name.
fn read_order(name: &str) -> (u8, std::cmp::Reverse<u32>, String) {
    let (base, index) = split_backup(name);
    let runs_first = base.starts_with("event_EXPORT_TRAIN_STATE")
        || (base.starts_with("event_EXPORT_TRAIN_RUN") && !base.contains("ATTEMPT"));
    (
        u8::from(!runs_first),
        std::cmp::Reverse(index),
        base.into_owned(),
    )
}

/// The identity of an export file, by which its quarantined lines are remembered
/// ([`LineSource`]): its session and inode, and the identity its offsets keep ([`identity`]:
/// its first line and birth time), all of which Ray's rotation (a rename) keeps, so a file
/// rewritten in place or a new file on a reused inode never has an older file's identity
/// (review r41n D3).
fn file_id(session: &str, ino: u64, id: &Identity) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(session.as_bytes());
    h.update(&[0]);
    h.update(&ino.to_le_bytes());
    h.update(&[u8::from(id.born_ns.is_some())]);
    h.update(&id.born_ns.unwrap_or(0).to_le_bytes());
    h.update(&id.first_line.len.to_le_bytes());
    h.update(&id.first_line.hash.to_le_bytes());
    h.digest()
}

/// Spool bytes at which the tailer stops reading: [`YIELD_PERCENT`] of the budget.
fn yield_mark(max_spool_bytes: u64) -> u64 {
    max_spool_bytes / 100 * YIELD_PERCENT
}

/// The export files of one session's `export_events` directory: name, path and inode.
fn list_export_files(dir: &Path) -> io::Result<Vec<(String, PathBuf, u64)>> {
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let ino = e.metadata().ok()?.ino();
            (name.starts_with("event_EXPORT_") && is_safe_segment(&name))
                .then(|| (name, e.path(), ino))
        })
        .collect())
}

/// Inodes of the export files there now, by session whose directory could be listed.
fn present_files(ray_tmp: &Path) -> BTreeMap<String, HashSet<u64>> {
    list_sessions(ray_tmp)
        .into_iter()
        .filter_map(|s| {
            let files = list_export_files(&s.dir.join("logs").join("export_events")).ok()?;
            Some((s.name, files.into_iter().map(|(_, _, ino)| ino).collect()))
        })
        .collect()
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

/// Dates the entries of an older collector (without a file identity) with the modification
/// time of the offsets file they were loaded from: they were saved then at the latest, so a
/// file born later is not theirs ([`identity`]).
fn date_older_entries(state: &mut OffsetsFile, path: &Path) {
    let saved = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| u64::try_from(d.as_nanos()).ok());
    for entry in state.files.values_mut() {
        if entry.first_line.is_none() && entry.saved_before_ns.is_none() {
            entry.saved_before_ns = saved;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_first_then_backups_before_their_live_file() {
        let mut names = vec![
            "event_EXPORT_TASK.log",
            "event_EXPORT_TRAIN_RUN_ATTEMPT.log.1",
            "event_EXPORT_TASK.log.2",
            "event_EXPORT_TRAIN_RUN.log",
            "event_EXPORT_TASK.1.log",
            "event_EXPORT_TRAIN_STATE.log",
            "event_EXPORT_TRAIN_RUN.log.1",
        ];
        names.sort_by_key(|n| read_order(n));
        assert_eq!(
            names,
            [
                "event_EXPORT_TRAIN_RUN.log.1",
                "event_EXPORT_TRAIN_RUN.log",
                "event_EXPORT_TRAIN_STATE.log",
                "event_EXPORT_TASK.log.2",
                "event_EXPORT_TASK.1.log",
                "event_EXPORT_TRAIN_RUN_ATTEMPT.log.1",
                "event_EXPORT_TASK.log",
            ]
        );
    }

    #[test]
    fn backup_names_of_both_writers() {
        assert_eq!(
            split_backup("event_EXPORT_TASK.log"),
            ("event_EXPORT_TASK.log".into(), 0)
        );
        assert_eq!(
            split_backup("event_EXPORT_TASK.log.3"),
            ("event_EXPORT_TASK.log".into(), 3)
        );
        assert_eq!(
            split_backup("event_EXPORT_TASK.12.log"),
            ("event_EXPORT_TASK.log".into(), 12)
        );
        assert_eq!(
            split_backup("event_EXPORT_X.log.log"),
            ("event_EXPORT_X.log.log".into(), 0)
        );
    }

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
