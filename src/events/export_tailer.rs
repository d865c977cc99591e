//! Ray's file-based export events (`<session>/logs/export_events/event_EXPORT_*.log`),
//! tailed into the spool and uploaded partitioned by job.
//!
//! Ray Train's run and attempt history exists only here. Each line is one JSON object
//! (`event_id`, `timestamp` in seconds, `source_type`, `event_data`). Lines are read from a
//! per-file offset and appended to the spool like pushed events, so they share its
//! durability, deduplication and uploads, and land at
//! `P/<session>/<node>/export_events/<job-hex | node>/<node>-<YYYY-MM-DD-HH>-<n>.jsonl.gz`.
//!
//! Offsets are kept per file identity (inode plus a hash of its first bytes, so a recycled
//! inode is not mistaken for the old file) in `<spool>/export-offsets.json`, saved after the
//! lines they cover are durable in the spool. Ray rotates these files by renaming
//! (`name` → `name.1`), which keeps the inode, so a rotation neither loses nor repeats a
//! line; a crash between the spool write and the offset save repeats lines that the
//! deduplication window (reloaded from the spool at start) drops. An incomplete last line
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
//! 90 % of it. A backlog of export lines is already on disk in Ray's own files, so the tailer
//! stops reading at [`YIELD_PERCENT`] of the budget and leaves the rest of the room to pushed
//! events; it resumes once uploads have made room. Its last pass at shutdown is bounded by
//! [`FINAL_PASS_LIMIT`], so the events already in the spool keep the rest of the deadline.
//!
//! The offsets file is saved at the end of each pass and every [`SAVE_EVERY_BYTES`] within one
//! (not after every chunk: each save is an fsync), and entries of files that no longer exist
//! are dropped from it.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::contract::events::EXPORT_NODE_GROUP;
use crate::contract::{id_to_hex, is_safe_segment, Hour, Partition, Stream};
use crate::events::dedup::id_hash;
use crate::events::quarantine::QuarantineReason;
use crate::events::spool::{AppendBatch, EventSpan, PartitionBatch, QuarantinedEvent, Spool};
use crate::node::node_id::NodeIdResolver;
use crate::node::session::{list_sessions, ActiveSession};

/// Most bytes read from one file at once (one spool append), so one huge backlog cannot hog
/// the spool's writer; also the longest line kept whole. Smaller when the spool's budget is
/// small: see [`read_limit`].
const MAX_READ: u64 = 8 << 20;
/// Smallest read, whatever the budget: a Ray export line is a few KiB.
const MIN_READ: u64 = 1 << 20;
/// Share of the spool's budget the tailer fills at most (pushed events get 503 at 90 %): a
/// chunk started below it ends at most one read (at most 5 % of the budget) above it.
pub const YIELD_PERCENT: u64 = 80;
/// Longest last pass at shutdown: lines left then are still in Ray's files for the next
/// start, while the time left goes to uploading what the spool holds.
pub const FINAL_PASS_LIMIT: Duration = Duration::from_secs(5);
/// Bytes read between two saves of the offsets file within a pass. A crash repeats at most
/// this much, which the deduplication window drops; saving after every chunk cost an fsync
/// per 8 MiB.
pub const SAVE_EVERY_BYTES: u64 = 64 << 20;
/// Bytes hashed to recognise a file whose inode was reused.
const FINGERPRINT_BYTES: u64 = 64;

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

/// Where reading stopped in one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct FileOffset {
    inode: u64,
    offset: u64,
    fingerprint: u64,
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
        let state = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::error!(path = %path.display(), error = %e, "export offsets unreadable; reading export files from the start");
                OffsetsFile::default()
            }),
            Err(_) => OffsetsFile::default(),
        };
        ExportTailer {
            cfg,
            spool,
            nodes,
            state,
            dirty: false,
            yielding: false,
        }
    }

    /// Tails until `shutdown`, then makes one last pass so lines written just before the
    /// end are kept, and returns.
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
            tokio::select! {
                _ = tick.tick() => {}
                Some(()) = rx.recv() => {
                    // Batch a burst of writes into one pass.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    while rx.try_recv().is_ok() {}
                }
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        self.pass_until(Some(Instant::now() + FINAL_PASS_LIMIT)).await;
                        break;
                    }
                }
            }
            self.pass().await;
        }
        drop(watcher);
    }

    /// Reads every session's export files once.
    pub async fn pass(&mut self) -> PassReport {
        self.pass_until(None).await
    }

    /// Reads every session's export files once, stopping between two chunks at `deadline` or
    /// when the spool reaches [`YIELD_PERCENT`] of its budget.
    async fn pass_until(&mut self, deadline: Option<Instant>) -> PassReport {
        let mut total = PassReport::default();
        let mut unsaved = 0u64;
        // Offsets entries of files still there, by session whose directory could be listed.
        let mut present: BTreeMap<String, HashSet<u64>> = BTreeMap::new();
        let mut stopped = false;
        for s in list_sessions(&self.cfg.ray_tmp) {
            let dir = s.dir.join("logs").join("export_events");
            if !dir.is_dir() {
                continue;
            }
            let mut files: Vec<(String, PathBuf, u64)> = match std::fs::read_dir(&dir) {
                Ok(rd) => rd
                    .flatten()
                    .filter_map(|e| {
                        let name = e.file_name().to_str()?.to_string();
                        let ino = e.metadata().ok()?.ino();
                        (name.starts_with("event_EXPORT_") && is_safe_segment(&name))
                            .then(|| (name, e.path(), ino))
                    })
                    .collect(),
                Err(_) => continue,
            };
            present.insert(
                s.name.clone(),
                files.iter().map(|(_, _, ino)| *ino).collect(),
            );
            if stopped {
                continue; // listed for pruning only
            }
            let Some(node) = self.nodes.resolve_local(&s.dir) else {
                continue; // the node is not known yet; the lines wait on disk
            };
            files.sort_by_key(|(name, _, _)| read_order(name));
            'files: for (name, path, _) in files {
                let finished = split_backup(&name).1 > 0;
                loop {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        tracing::warn!(
                            limit_s = FINAL_PASS_LIMIT.as_secs(),
                            "last pass over the export event files stopped at its time limit; the rest is read by the next start"
                        );
                        stopped = true;
                        break 'files;
                    }
                    if self.must_yield() {
                        stopped = true;
                        break 'files;
                    }
                    match self
                        .read_file(&s.name, &s.dir, &node, &name, &path, finished)
                        .await
                    {
                        Ok(Some(r)) => {
                            unsaved += r.bytes;
                            total.add(r);
                            if unsaved >= SAVE_EVERY_BYTES {
                                self.save();
                                unsaved = 0;
                            }
                        }
                        Ok(None) => break,
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
        self.prune(&present);
        self.save();
        total
    }

    /// True when the spool holds [`YIELD_PERCENT`] of its budget: the rest is for pushed
    /// events. Logged when it starts and ends.
    fn must_yield(&mut self) -> bool {
        let used = self.spool.stats().bytes.load(Ordering::Relaxed);
        let mark = yield_mark(self.cfg.max_spool_bytes);
        let full = used >= mark;
        if full != self.yielding {
            self.yielding = full;
            if full {
                tracing::warn!(
                    spool_bytes = used,
                    mark_bytes = mark,
                    "spool at {YIELD_PERCENT}% of its budget: export event files wait on disk so pushed events keep room"
                );
            } else {
                tracing::info!(
                    spool_bytes = used,
                    "spool has room again: reading export event files"
                );
            }
        }
        full
    }

    /// Drops the offsets of files that are gone: those of a session whose export directory
    /// no longer exists, and those of a listed session whose inode was not in the listing.
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

    /// Stores the next chunk of complete lines of one file; `None` when there is nothing new.
    /// In a `finished` file (a backup Ray no longer writes) a last line without its newline
    /// is read as a line too.
    async fn read_file(
        &mut self,
        session: &str,
        session_dir: &Path,
        node: &str,
        name: &str,
        path: &Path,
        finished: bool,
    ) -> io::Result<Option<PassReport>> {
        let limit = read_limit(self.cfg.max_spool_bytes);
        let meta = std::fs::symlink_metadata(path)?;
        if !meta.file_type().is_file() {
            return Ok(None);
        }
        let key = format!("{session}/{}", meta.ino());
        let known = self.state.files.get(&key).cloned();
        // Up to 8 MiB of reading: off the async workers, which serve Ray's requests.
        let read = off_async_thread(|| -> io::Result<Option<(File, u64, Vec<u8>)>> {
            // From the session directory's descriptor, never through a symlink (a `logs`
            // directory swapped for one included): see `util::fs::Beneath`.
            let mut f = crate::util::fs::Beneath {
                root: session_dir.to_path_buf(),
                rel: Path::new("logs").join("export_events").join(name),
                dev: meta.dev(),
                ino: meta.ino(),
            }
            .open()?;
            let start = match known {
                Some(o)
                    if o.inode == meta.ino()
                        && o.offset <= meta.len()
                        && fingerprint(&mut f, o.offset)? == o.fingerprint =>
                {
                    o.offset
                }
                _ => 0,
            };
            if start >= meta.len() {
                return Ok(None);
            }
            let want = (meta.len() - start).min(limit);
            let mut buf = vec![0u8; want as usize];
            f.seek(SeekFrom::Start(start))?;
            f.read_exact(&mut buf)?;
            Ok(Some((f, start, buf)))
        })?;
        let Some((mut f, start, mut buf)) = read else {
            return Ok(None);
        };
        let want = buf.len() as u64;
        // Only complete lines; an incomplete last line waits for its newline.
        let complete = buf.iter().rposition(|&c| c == b'\n').map(|i| i + 1);
        let at_eof = start + want == meta.len();
        let (body, consumed) = match complete {
            // A finished file's torn last line will never be completed: read it now.
            _ if finished && at_eof && buf.last() != Some(&b'\n') => {
                let torn_at = start + complete.unwrap_or(0) as u64;
                tracing::warn!(
                    file = %path.display(),
                    offset = torn_at,
                    bytes = want - complete.unwrap_or(0) as u64,
                    "a rotated export event file ends in a line without its newline; read as its last line"
                );
                buf.push(b'\n');
                (Bytes::from(buf), want)
            }
            Some(end) => {
                buf.truncate(end);
                (Bytes::from(buf), end as u64)
            }
            None if want == limit => {
                // One line longer than a whole read: keep it aside instead of stalling.
                tracing::warn!(file = %path.display(), offset = start, limit, "export event line longer than a read; quarantined");
                let batch = AppendBatch {
                    body: Bytes::from(buf),
                    partitions: Vec::new(),
                    quarantined: vec![QuarantinedEvent {
                        reason: QuarantineReason::ExportBadEvent,
                        start: 0,
                        end: want as usize,
                        source: Some((name.to_string(), start)),
                    }],
                    quarantine_dropped: 0,
                };
                self.spool.append(batch).await.map_err(io::Error::other)?;
                self.remember(key, &mut f, meta.ino(), start + want)?;
                return Ok(Some(PassReport {
                    quarantined: 1,
                    bytes: want,
                    ..Default::default()
                }));
            }
            None => return Ok(None),
        };
        let batch = self.route(&body, session, node, name, start);
        let outcome = self.spool.append(batch).await.map_err(io::Error::other)?;
        // The offsets are saved by the pass, after the lines they cover are durable.
        self.remember(key, &mut f, meta.ino(), start + consumed)?;
        Ok(Some(PassReport {
            accepted: outcome.accepted,
            duplicates: outcome.duplicates,
            quarantined: outcome.quarantined,
            bytes: consumed,
        }))
    }

    /// Records that `file` (inode `ino`) was consumed up to `offset`.
    fn remember(&mut self, key: String, f: &mut File, ino: u64, offset: u64) -> io::Result<()> {
        let fp = off_async_thread(|| fingerprint(f, offset))?;
        self.state.files.insert(
            key,
            FileOffset {
                inode: ino,
                offset,
                fingerprint: fp,
            },
        );
        self.dirty = true;
        Ok(())
    }

    /// Routes the lines of `body` (complete lines read at `file_offset` of `file`).
    fn route(
        &mut self,
        body: &Bytes,
        session: &str,
        node: &str,
        file: &str,
        file_offset: u64,
    ) -> AppendBatch {
        let mut partitions: Vec<PartitionBatch> = Vec::new();
        let mut quarantined = Vec::new();
        let mut pos = 0usize;
        for line in body.split(|&c| c == b'\n') {
            let start = pos;
            let end = pos + line.len();
            pos = end + 1;
            if line.iter().all(|c| c.is_ascii_whitespace()) {
                continue;
            }
            let q = |reason| QuarantinedEvent {
                reason,
                start,
                end,
                source: Some((file.to_string(), file_offset + start as u64)),
            };
            let parsed: ExportLine = match serde_json::from_slice(line) {
                Ok(p) => p,
                Err(e) if e.is_syntax() || e.is_eof() => {
                    quarantined.push(q(QuarantineReason::ExportNotJson));
                    continue;
                }
                Err(_) => {
                    quarantined.push(q(QuarantineReason::ExportBadEvent));
                    continue;
                }
            };
            let Some(ts) = parsed.timestamp else {
                quarantined.push(q(QuarantineReason::ExportBadEvent));
                continue;
            };
            let data = parsed.event_data.as_ref();
            let job = match data
                .and_then(|d| d.job_id.as_deref())
                .filter(|j| !j.is_empty())
            {
                Some(j) => match id_to_hex(j) {
                    Ok(h) => Some(h.as_str().to_string()),
                    Err(_) => {
                        quarantined.push(q(QuarantineReason::ExportBadEvent));
                        continue;
                    }
                },
                None => None,
            };
            let source = parsed.source_type.as_deref().unwrap_or("");
            // Train runs name their job; their attempts only their run.
            let job = match (source, data) {
                ("EXPORT_TRAIN_RUN", Some(d)) => {
                    if let (Some(run), Some(j)) = (d.id.as_deref(), job.as_ref()) {
                        if is_safe_segment(run) && self.state.run_jobs.get(run) != Some(j) {
                            self.state.run_jobs.insert(run.to_string(), j.clone());
                            self.dirty = true;
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
            let partition = Partition {
                session: session.to_string(),
                node: node.to_string(),
                stream: Stream::Export(group),
                hour: Hour::from_unix_seconds(ts),
            };
            let id = parsed
                .event_id
                .as_deref()
                .map(|id| id_hash(id.as_bytes()) ^ crate::events::spool::EXPORT_ID_SALT);
            // A read is at most MAX_READ bytes, far below what a span can address.
            let Some(span) = EventSpan::new(start..end, id, false) else {
                quarantined.push(q(QuarantineReason::ExportBadEvent));
                continue;
            };
            match partitions.iter_mut().find(|p| p.partition == partition) {
                Some(p) => p.events.push(span),
                None => partitions.push(PartitionBatch {
                    partition,
                    events: vec![span],
                }),
            }
        }
        AppendBatch {
            body: body.clone(),
            partitions,
            quarantined,
            quarantine_dropped: 0,
        }
    }

    fn save(&mut self) {
        if !self.dirty {
            return;
        }
        let path = offsets_path(&self.cfg.state_dir);
        // Written and fsync'd: off the async workers.
        let result =
            off_async_thread(|| crate::util::fs::write_json_atomically(&path, &self.state));
        match result {
            Ok(()) => self.dirty = false,
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

/// Spool bytes at which the tailer stops reading: [`YIELD_PERCENT`] of the budget.
fn yield_mark(max_spool_bytes: u64) -> u64 {
    max_spool_bytes / 100 * YIELD_PERCENT
}

/// Bytes read at once: [`MAX_READ`], or 5 % of a small budget (at least [`MIN_READ`]), so a
/// read started below the yield mark stays clear of the 90 % mark.
fn read_limit(max_spool_bytes: u64) -> u64 {
    (max_spool_bytes / 20).clamp(MIN_READ, MAX_READ)
}

/// Hash of the file's first bytes (up to `FINGERPRINT_BYTES`, and not past `upto`).
fn fingerprint(f: &mut File, upto: u64) -> io::Result<u64> {
    let n = upto.min(FINGERPRINT_BYTES) as usize;
    let mut buf = vec![0u8; n];
    f.seek(SeekFrom::Start(0))?;
    f.read_exact(&mut buf)?;
    Ok(xxhash_rust::xxh3::xxh3_64(&buf))
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
    fn reads_stay_clear_of_the_503_mark() {
        assert_eq!(read_limit(1 << 30), MAX_READ);
        assert_eq!(read_limit(40 << 20), 2 << 20);
        assert_eq!(read_limit(1 << 20), MIN_READ);
        let budget = 1u64 << 30;
        assert!(yield_mark(budget) + read_limit(budget) < budget / 10 * 9);
    }
}
