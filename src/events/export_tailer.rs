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
//! is left for the next read. Train attempts carry no job id: they are filed under the job
//! of their run when the run's events were seen, else under `node`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// Most bytes read from one file per pass, so one huge backlog cannot hog the spool.
const MAX_READ: u64 = 8 << 20;
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
                        self.pass().await;
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
        let mut total = PassReport::default();
        for s in list_sessions(&self.cfg.ray_tmp) {
            let dir = s.dir.join("logs").join("export_events");
            if !dir.is_dir() {
                continue;
            }
            let Some(node) = self.nodes.resolve_local(&s.dir) else {
                continue; // the node is not known yet; the lines wait on disk
            };
            let mut files: Vec<(String, PathBuf)> = match std::fs::read_dir(&dir) {
                Ok(rd) => rd
                    .flatten()
                    .filter_map(|e| {
                        let name = e.file_name().to_str()?.to_string();
                        (name.starts_with("event_EXPORT_") && is_safe_segment(&name))
                            .then(|| (name, e.path()))
                    })
                    .collect(),
                Err(_) => continue,
            };
            // Older backups first (`.N` before the live file), so order is kept.
            files.sort_by_key(|(name, _)| std::cmp::Reverse(backup_index(name)));
            for (name, path) in files {
                loop {
                    match self.read_file(&s.name, &s.dir, &node, &name, &path).await {
                        Ok(Some(r)) => {
                            total.accepted += r.accepted;
                            total.duplicates += r.duplicates;
                            total.quarantined += r.quarantined;
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
        self.save();
        total
    }

    /// Stores the next chunk of complete lines of one file; `None` when there is nothing new.
    async fn read_file(
        &mut self,
        session: &str,
        session_dir: &Path,
        node: &str,
        name: &str,
        path: &Path,
    ) -> io::Result<Option<PassReport>> {
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
            let want = (meta.len() - start).min(MAX_READ);
            let mut buf = vec![0u8; want as usize];
            f.seek(SeekFrom::Start(start))?;
            f.read_exact(&mut buf)?;
            Ok(Some((f, start, buf)))
        })?;
        let Some((mut f, mut start, mut buf)) = read else {
            return Ok(None);
        };
        let want = buf.len() as u64;
        // Only complete lines; an incomplete last line waits for its newline.
        let Some(end) = buf.iter().rposition(|&c| c == b'\n').map(|i| i + 1) else {
            if want == MAX_READ {
                // One line longer than a whole read: keep it aside instead of stalling.
                tracing::warn!(file = %path.display(), offset = start, "export event line longer than 8 MiB; quarantined");
                buf.truncate(want as usize);
            } else {
                return Ok(None);
            }
            let consumed = buf.len() as u64;
            let batch = AppendBatch {
                body: Bytes::from(buf),
                partitions: Vec::new(),
                quarantined: vec![QuarantinedEvent {
                    reason: QuarantineReason::ExportBadEvent,
                    start: 0,
                    end: consumed as usize,
                    source: Some((name.to_string(), start)),
                }],
                quarantine_dropped: 0,
            };
            self.spool.append(batch).await.map_err(io::Error::other)?;
            start += consumed;
            let fp = off_async_thread(|| fingerprint(&mut f, start))?;
            self.state.files.insert(
                key,
                FileOffset {
                    inode: meta.ino(),
                    offset: start,
                    fingerprint: fp,
                },
            );
            self.dirty = true;
            return Ok(Some(PassReport {
                quarantined: 1,
                ..Default::default()
            }));
        };
        buf.truncate(end);
        let body = Bytes::from(buf);
        let batch = self.route(&body, session, node, name, start);
        let outcome = self.spool.append(batch).await.map_err(io::Error::other)?;
        let new_offset = start + end as u64;
        let fp = off_async_thread(|| fingerprint(&mut f, new_offset))?;
        self.state.files.insert(
            key,
            FileOffset {
                inode: meta.ino(),
                offset: new_offset,
                fingerprint: fp,
            },
        );
        self.dirty = true;
        // Save after every durable chunk: the offsets then lag the spool by at most one chunk.
        self.save();
        Ok(Some(PassReport {
            accepted: outcome.accepted,
            duplicates: outcome.duplicates,
            quarantined: outcome.quarantined,
        }))
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

/// `event_EXPORT_TASK.log.3` → 3; the live file → 0.
fn backup_index(name: &str) -> u32 {
    name.rsplit_once('.')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(0)
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
    fn backups_sort_before_the_live_file() {
        let mut names = vec![
            "event_EXPORT_TASK.log",
            "event_EXPORT_TASK.log.2",
            "event_EXPORT_TASK.log.1",
        ];
        names.sort_by_key(|n| std::cmp::Reverse(backup_index(n)));
        assert_eq!(
            names,
            [
                "event_EXPORT_TASK.log.2",
                "event_EXPORT_TASK.log.1",
                "event_EXPORT_TASK.log"
            ]
        );
    }
}
