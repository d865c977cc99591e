//! Publication: the object of every open segment grows in place in the bucket, so that an
//! acknowledged event is there within `--upload-window` even if the node (and its spool)
//! vanishes without a SIGTERM, at the same object count and under the same key as before.
//!
//! The writer shares each open segment's durable length ([`SpoolStats::grown_segments`]:
//! whole lines, every one fsync'd). [`Publisher::run`] takes the segments that grew, oldest
//! unpublished first, each at most once per half window, [`CONCURRENCY`] at a time and
//! without rounds (none waits for the others), and for each brings its object to the new
//! version:
//!
//! - the new bytes `[published, durable)` are compressed as whole gzip members and appended
//!   to the segment's *shadow* (`<spool>/growth/<e|q>.<file>.gz`: the object's bytes so
//!   far, counted against `--max-spool-bytes`); with `--compression none` the segment itself
//!   is the object's bytes;
//! - `file://`: the object's bytes so far (the shadow; with `--compression none` the
//!   segment's first `durable` bytes) are copied beside the object under a temporary name
//!   (`.<name>.<host>.rhc-tmp`, see `storage::append::LOCAL_TEMP_SUFFIX`), fsync'd and
//!   renamed over it (the directory is fsync'd after the seal's last version): a reader opens the old or the new inode,
//!   never a part of one, and a kill leaves the previous version whole plus at most the
//!   temporary (removed at the next start of this node). It costs a local copy of the
//!   object per round (at most a segment's compressed size; `copy_file_range`). S3 and S3-compatible stores, once the object has
//!   [`Appender::min_object_bytes`]: `UploadPartCopy` of the current object (conditional on
//!   its ETag) plus the new bytes as the last part, completed at once; smaller objects, GCS
//!   and Azure: a PUT of the object's bytes so far (a multipart upload completes atomically);
//! - then what was published is recorded beside the shadow (`.rec`: raw bytes, object
//!   length, ETag), so a restart can continue.
//!
//! So every version a reader can see is whole gzip members of whole lines, and its lines
//! are a prefix of the next version's. A failed growth leaves the previous version whole
//! (S3: nothing is visible before the completion; file://: before the rename), and it is
//! tried again half a window later; an object that is not what the record says (changed, or left longer
//! by an upload a crash interrupted) is uploaded whole from the shadow.
//!
//! Sealing ends with a last publication of the remaining bytes to the same key
//! ([`Publisher::seal`], called by the uploader), then the shadow and record are deleted
//! (the uploader deletes the segment). One upload per key at a time: a seal waits for the
//! publication of its segment in flight. A segment with nothing new costs no request. A
//! segment without a record (an old spool, a record lost) is uploaded whole by the uploader,
//! as before.
//!
//! Invariants relied on: the writer's durable lengths only grow and end on a line break
//! (checked here before anything is published); a shadow is only written under its
//! segment's lock; the record is written after the object holds what it says (a stale or
//! missing record only costs a whole upload). The record and shadow are not fsync'd: a
//! kill -9 keeps the page cache; after a power loss with the spool kept, a shadow shorter
//! than its record makes the seal upload the segment whole.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::{ObjectStore, ObjectStoreExt};
use tokio::sync::{watch, Mutex as AsyncMutex, Semaphore};
use tokio::task::JoinSet;

use crate::events::spool::{FileKind, OpenView, SealedFile, SpoolStats, GROWTH_DIR};
use crate::events::upload::{gzip_level, object_key, UploaderConfig};
use crate::metrics as m;
use crate::storage::append::{AppendError, Appender};
use crate::storage::gzip::{MemberEncoder, MEMBER_INPUT};
use crate::storage::put::{put_file_prefix, UploadError};
use crate::util::fs::{open_scanned, Beneath};
use crate::util::time::unix_nanos;

/// Publications in flight at once, at most (each also takes its share of
/// [`ROUND_BUDGET_KIB`]).
const CONCURRENCY: usize = 32;
/// Memory the publications in flight may hold at once (compression buffers and the
/// object's bytes of a whole PUT), in KiB.
const ROUND_BUDGET_KIB: u32 = 32 * 1024;
/// Compressions at once (CPU-bound: more than the cores buys nothing); their encoders and
/// buffers are kept and reused, so 50,000 partitions cost two encoders, not 50,000
/// allocations spread over the blocking pool's threads.
const COMPRESSORS: usize = 2;
/// How often the open segments are scanned for due ones when no slot frees up, at least
/// and at most.
const MIN_POLL: Duration = Duration::from_millis(50);
const MAX_POLL: Duration = Duration::from_millis(500);
/// Due segments taken from one scan of the open ones, at most.
const SCAN_BATCH: usize = 1024;
/// How often the states no task holds are dropped.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// A reusable encoder and its member buffer.
type Compressor = (MemberEncoder, Vec<u8>);

/// What is known of one segment's object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Record {
    /// The object's key (a restart with other settings may name it differently).
    key: String,
    /// Bytes of the segment in the object.
    raw: u64,
    /// The object's length (the shadow's first bytes).
    object_len: u64,
    /// Its ETag after our last write.
    e_tag: Option<String>,
}

#[derive(Default)]
struct State {
    loaded: bool,
    record: Option<Record>,
    /// The object may not match the record: the next publication uploads it whole.
    whole_next: bool,
    /// Sealed and finished: nothing more to publish.
    done: bool,
    /// Shadow bytes counted in the spool's budget.
    counted: u64,
}

/// Why a publication did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Uploading failed (retried half a window later, or by the uploader's backoff at a
    /// seal).
    #[error(transparent)]
    Upload(#[from] UploadError),
    /// The runtime is shutting down and cancelled the compression: the segment stays in
    /// the spool, published as far as its record says.
    #[error("{path}: compression cancelled by the shutdown; the segment stays in the spool")]
    Cancelled {
        /// Which segment.
        path: PathBuf,
    },
    /// The spool's files are not as expected (a durable length not on a line break, a
    /// shadow shorter than its record): the seal uploads the segment whole.
    #[error("{path}: {why}")]
    Local {
        /// Which file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// Reading or writing the shadow failed (a full or failing spool disk): nothing is wrong
    /// with the files, so the publication is tried again half a window later (at a seal: by
    /// the uploader's backoff), never given up until the seal.
    #[error("{path}: {why}")]
    Io {
        /// Which file.
        path: PathBuf,
        /// What failed.
        why: String,
    },
}

/// Grows open segments' objects; shared by [`Publisher::run`] and the uploader's seals.
pub struct Publisher {
    cfg: Arc<UploaderConfig>,
    spool_dir: PathBuf,
    store: Arc<dyn ObjectStore>,
    appender: Option<Appender>,
    stats: Arc<SpoolStats>,
    states: Mutex<HashMap<PathBuf, Arc<AsyncMutex<State>>>>,
    budget: Semaphore,
    /// [`COMPRESSORS`] permits; the idle encoders (with their member buffer).
    compressing: Semaphore,
    encoders: Arc<Mutex<Vec<Compressor>>>,
}

/// The shadow and record names of a segment file named `file_name` of `kind`.
pub fn growth_names(kind: FileKind, file_name: &str) -> (String, String) {
    let tag = match kind {
        FileKind::Quarantine => "q",
        _ => "e",
    };
    (
        format!("{tag}.{file_name}.gz"),
        format!("{tag}.{file_name}.rec"),
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Publisher {
    /// A publisher for the spool at `spool_dir`; `appender` is the store's, if it has one.
    pub fn new(
        cfg: Arc<UploaderConfig>,
        spool_dir: PathBuf,
        store: Arc<dyn ObjectStore>,
        appender: Option<Appender>,
        stats: Arc<SpoolStats>,
    ) -> Publisher {
        Publisher {
            cfg,
            spool_dir,
            store,
            appender,
            stats,
            states: Mutex::new(HashMap::new()),
            budget: Semaphore::new(ROUND_BUDGET_KIB as usize),
            compressing: Semaphore::new(COMPRESSORS),
            encoders: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Publishes open segments until `stop` turns true, [`CONCURRENCY`] at a time, without
    /// rounds: a segment is due as soon as it has durable bytes not yet published and no
    /// publication of it started in the last half `window`; the oldest unpublished byte goes
    /// first. So a segment is published at most twice a window, and when the store cannot
    /// keep up every segment is published again as soon as its turn comes, no publication
    /// waiting for others. After `stop` nothing new starts; those in flight finish (a seal
    /// waits for its segment's).
    pub async fn run(self: Arc<Self>, window: Duration, mut stop: watch::Receiver<bool>) {
        let gap = u64::try_from((window / 2).as_nanos()).unwrap_or(u64::MAX);
        let poll = (window / 20).clamp(MIN_POLL, MAX_POLL);
        let mut tasks: JoinSet<(PathBuf, bool)> = JoinSet::new();
        let mut busy: HashSet<PathBuf> = HashSet::new();
        let mut failed = 0usize;
        let mut warned_at = tokio::time::Instant::now();
        let mut pruned_at = tokio::time::Instant::now();
        // Due segments with the time their durable length was read.
        let mut queue: VecDeque<(PathBuf, OpenView, u64)> = VecDeque::new();
        let mut scanned_at: Option<tokio::time::Instant> = None;
        let mut more = false;
        while !*stop.borrow() {
            // The open segments are scanned (under the writer's lock, walking all of them)
            // for a batch of due ones when the last batch is all started: at once if it was
            // full, else at most once a poll.
            if queue.is_empty() && (more || scanned_at.is_none_or(|t| t.elapsed() >= poll)) {
                scanned_at = Some(tokio::time::Instant::now());
                let read_at = unix_nanos();
                let before = queue.len();
                queue.extend(
                    self.stats
                        .due_segments(read_at, gap, &busy, SCAN_BATCH)
                        .into_iter()
                        .map(|(p, v)| (p, v, read_at)),
                );
                // A full batch: more may be due, scanned for as soon as this one is started.
                more = queue.len() - before == SCAN_BATCH;
            }
            while tasks.len() < CONCURRENCY {
                let Some((path, view, read_at)) = queue.pop_front() else {
                    break;
                };
                self.stats.publication_started(&path, unix_nanos());
                busy.insert(path.clone());
                let this = self.clone();
                tasks.spawn(async move {
                    let ok = this.publish_open(&path, view, read_at).await;
                    (path, ok)
                });
            }
            tokio::select! {
                Some(j) = tasks.join_next(), if !tasks.is_empty() => {
                    match j {
                        Ok((path, ok)) => {
                            busy.remove(&path);
                            failed += usize::from(!ok);
                        }
                        Err(e) => {
                            // Not cancelled (the set is never aborted): a panic; its path
                            // stays busy, the seal uploads it.
                            tracing::error!(error = %e, "a publication task panicked");
                            failed += 1;
                        }
                    }
                }
                _ = tokio::time::sleep(poll) => {}
                r = stop.changed() => {
                    if r.is_err() {
                        break;
                    }
                }
            }
            if failed > 0 && warned_at.elapsed() >= window {
                warned_at = tokio::time::Instant::now();
                tracing::warn!(
                    publications = failed,
                    "could not publish the new events of some open segments; retried after half a window"
                );
                failed = 0;
            }
            // A state nobody holds is forgotten: its record and shadow on disk are the truth,
            // and the next publication or the seal loads them again (a small read), so
            // 50,000 open partitions do not keep 50,000 states. Only the map clones a state,
            // under its lock, so a count of one means no task has it. Kept: a segment that
            // is not published (its seal uploads it whole) while it is open.
            if pruned_at.elapsed() >= PRUNE_EVERY {
                pruned_at = tokio::time::Instant::now();
                let mut states = lock(&self.states);
                states.retain(|p, s| {
                    Arc::strong_count(s) > 1
                        || s.try_lock()
                            .map_or(true, |g| g.whole_next || (g.done && self.stats.is_open(p)))
                });
                states.shrink_to_fit();
            }
        }
        // Those in flight finish on their own; nothing new starts.
        tasks.detach_all();
    }

    fn state(&self, path: &Path) -> Arc<AsyncMutex<State>> {
        lock(&self.states)
            .entry(path.to_path_buf())
            .or_default()
            .clone()
    }

    fn growth_paths(&self, kind: FileKind, segment: &Path) -> Option<(PathBuf, PathBuf)> {
        let name = segment.file_name()?.to_str()?;
        let (shadow, record) = growth_names(kind, name);
        let dir = self.spool_dir.join(GROWTH_DIR);
        Some((dir.join(shadow), dir.join(record)))
    }

    fn load(&self, st: &mut State, kind: FileKind, segment: &Path) {
        if st.loaded {
            return;
        }
        st.loaded = true;
        let Some((shadow, record)) = self.growth_paths(kind, segment) else {
            return;
        };
        st.record = fs::read(&record)
            .ok()
            .and_then(|b| serde_json::from_slice::<Record>(&b).ok());
        // Counted by the spool's recovery when it found it.
        st.counted = fs::metadata(&shadow).map(|m| m.len()).unwrap_or(0);
    }

    async fn publish_open(&self, path: &Path, view: OpenView, read_at: u64) -> bool {
        let state = self.state(path);
        let mut st = state.lock().await;
        if st.done || !self.stats.is_open(path) {
            return true;
        }
        self.load(&mut st, view.kind, path);
        match self
            .publish(&mut st, path, view.kind, &view.relative_key, view.durable)
            .await
        {
            Ok(_) => {
                self.stats.segment_published(path, view.durable, read_at);
                true
            }
            Err(e) => {
                m::publication("failed", 0);
                tracing::debug!(path = %path.display(), error = %e, "publication failed");
                match &e {
                    PublishError::Local { .. } => {
                        tracing::error!(error = %e, "not publishing an open segment; it is uploaded whole when sealed");
                        st.done = true;
                    }
                    PublishError::Io { .. } => {
                        tracing::warn!(error = %e, "could not publish an open segment; tried again half a window later");
                    }
                    _ => {}
                }
                false
            }
        }
    }

    /// Brings the object of `segment` to its first `durable` bytes; the bytes sent, `None`
    /// when nothing was new (no request).
    async fn publish(
        &self,
        st: &mut State,
        segment: &Path,
        kind: FileKind,
        relative_key: &str,
        durable: u64,
    ) -> Result<Option<u64>, PublishError> {
        let file = SealedFile {
            path: segment.to_path_buf(),
            kind,
            relative_key: relative_key.to_string(),
            created_unix_nanos: 0,
            bytes: durable,
            compressible: true,
            pending_since: None,
        };
        let key = object_key(&self.cfg, &file);
        let gzip = gzip_level(&self.cfg, &file);
        if st.record.as_ref().is_some_and(|r| r.key != key) {
            // Published under another key (`--compression` changed across a restart): this
            // one is written whole first, then that object goes, so a reader always has one
            // of them (and a failure leaves the earlier one, tried again later).
            let old = st.record.take();
            st.whole_next = true;
            let written = Box::pin(self.publish(st, segment, kind, relative_key, durable)).await;
            match (&written, old) {
                (Ok(_), Some(old)) => {
                    if let Ok(p) = object_store::path::Path::parse(&old.key) {
                        if let Err(e) = self.store.delete(&p).await {
                            tracing::warn!(key = %old.key, error = %e, "could not delete the object published under the earlier key");
                        }
                    }
                }
                (Err(_), old) if st.record.is_none() => st.record = old,
                _ => {}
            }
            return written;
        }
        let published = st.record.as_ref().map_or(0, |r| r.raw);
        if durable <= published && !st.whole_next {
            return Ok(None);
        }
        if durable < published {
            return Err(PublishError::Local {
                path: segment.to_path_buf(),
                why: format!("durable length {durable} below the {published} bytes published"),
            });
        }
        let from = st.record.as_ref().map_or(0, |r| r.object_len);
        let local = |why: String| PublishError::Local {
            path: segment.to_path_buf(),
            why,
        };
        let (source, new_len) = match gzip {
            Some(level) => {
                let (shadow, _) = self
                    .growth_paths(kind, segment)
                    .ok_or_else(|| local("not a plain file name".into()))?;
                let rel = PathBuf::from(GROWTH_DIR).join(shadow.file_name().unwrap_or_default());
                let seg = segment.to_path_buf();
                let new_bytes = durable - published;
                let cost = permits(2 * new_bytes.min(MEMBER_INPUT as u64) + (256 << 10));
                let _permit = self.budget.acquire_many(cost).await;
                let _cpu = self.compressing.acquire().await;
                let pool = self.encoders.clone();
                let (len, before) = tokio::task::spawn_blocking(move || {
                    let mut enc = lock(&pool)
                        .pop()
                        .unwrap_or_else(|| (MemberEncoder::new(level), Vec::new()));
                    let r = extend_shadow(&seg, &shadow, published, durable, from, &mut enc);
                    lock(&pool).push(enc);
                    r
                })
                .await
                .map_err(|e| {
                    if e.is_cancelled() {
                        PublishError::Cancelled {
                            path: segment.to_path_buf(),
                        }
                    } else {
                        local(format!("compressing: {e}"))
                    }
                })??;
                self.add_counted(st, before, len);
                (
                    Beneath {
                        root: self.spool_dir.clone(),
                        rel,
                        dev: 0,
                        ino: 0,
                    },
                    len,
                )
            }
            None => {
                let rel = segment
                    .strip_prefix(&self.spool_dir)
                    .map_err(|_| local("not in the spool".into()))?
                    .to_path_buf();
                check_line_end(segment, durable)?;
                (
                    Beneath {
                        root: self.spool_dir.clone(),
                        rel,
                        dev: 0,
                        ino: 0,
                    },
                    durable,
                )
            }
        };
        let append = match (&self.appender, &st.record) {
            (Some(a), Some(r)) if !st.whole_next && r.object_len >= a.min_object_bytes() => Some(a),
            _ => None,
        };
        let e_tag = st.record.as_ref().and_then(|r| r.e_tag.clone());
        let mut result = None;
        if let Some(a @ Appender::Local(_)) = &self.appender {
            // file://: every version is written whole beside the object and renamed over it
            // (never appended in place: a reader or a kill would see a part of a member).
            let written = a.replace_local(&key, &source, new_len).await;
            match written {
                Some(Ok(done)) => {
                    if append.is_some() {
                        m::publication("append", new_len - from);
                    } else {
                        m::publication("whole", new_len);
                    }
                    result = Some((new_len - from, done.e_tag));
                }
                Some(Err(e)) => {
                    return Err(UploadError::Append {
                        key,
                        message: e.to_string(),
                    }
                    .into());
                }
                None => {}
            }
        } else if let Some(a) = append {
            match a
                .append(&key, &source, from, new_len, e_tag.as_deref(), None)
                .await
            {
                Ok(done) => {
                    m::publication("append", done.bytes);
                    result = Some((new_len - from, done.e_tag));
                }
                Err(AppendError::Changed { why, .. }) => {
                    tracing::warn!(%key, why, "the object is not as last published; uploading it whole");
                }
                Err(AppendError::Refused { message, .. }) => {
                    tracing::warn!(%key, message, "the store refused to append; uploading the object whole");
                }
                Err(e @ (AppendError::Unavailable { .. } | AppendError::Read { .. })) => {
                    return Err(UploadError::Append {
                        key,
                        message: e.to_string(),
                    }
                    .into());
                }
            }
        }
        let (sent, e_tag) = match result {
            Some(r) => r,
            None => {
                let _permit = self
                    .budget
                    .acquire_many(permits(new_len.min(self.cfg.part_size as u64)))
                    .await;
                let put = put_file_prefix(
                    &self.store,
                    &key,
                    &source,
                    new_len,
                    self.cfg.part_size,
                    None,
                )
                .await?;
                m::publication("whole", put.bytes);
                (put.bytes, put.e_tag)
            }
        };
        let record = Record {
            key,
            raw: durable,
            object_len: new_len,
            e_tag,
        };
        if let Some((_, path)) = self.growth_paths(kind, segment) {
            if let Err(e) = write_record(&path, &record) {
                tracing::warn!(path = %path.display(), error = %e, "could not record a publication; a restart uploads the segment whole");
                let _ = fs::remove_file(&path);
            }
        }
        st.record = Some(record);
        st.whole_next = false;
        Ok(Some(sent))
    }

    fn add_counted(&self, st: &mut State, before: u64, after: u64) {
        // The shadow was cut back to `before` (dropping what a failed round appended) and
        // grew to `after`.
        if st.counted > before {
            self.stats
                .bytes
                .fetch_sub(st.counted - before, Ordering::Relaxed);
        } else {
            self.stats
                .bytes
                .fetch_add(before - st.counted, Ordering::Relaxed);
        }
        self.stats
            .bytes
            .fetch_add(after - before, Ordering::Relaxed);
        st.counted = after;
    }

    /// At a seal: publishes what is left of `f` to its object and forgets its growth state.
    /// `None` when it has no publication (upload it whole, as before); the bytes sent
    /// otherwise. A publication that cannot continue (the object or the shadow not as
    /// recorded) is redone whole from the segment here.
    pub async fn seal(&self, f: &SealedFile) -> Option<Result<u64, UploadError>> {
        if !(f.compressible && matches!(f.kind, FileKind::Events | FileKind::Quarantine)) {
            return None;
        }
        let state = self.state(&f.path);
        let mut st = state.lock().await;
        if let Some(a) = &self.appender {
            crate::storage::append::remove_local_temp(a, &object_key(&self.cfg, f)).await;
        }
        self.load(&mut st, f.kind, &f.path);
        if st.record.is_none() {
            self.forget(&mut st, f);
            return None;
        }
        match self
            .publish(&mut st, &f.path, f.kind, &f.relative_key, f.bytes)
            .await
        {
            Ok(sent) => {
                if let (Some(a), Some(r)) = (&self.appender, &st.record) {
                    crate::storage::append::sync_local_object_dir(a, &r.key).await;
                }
                self.forget(&mut st, f);
                Some(Ok(sent.unwrap_or(0)))
            }
            Err(PublishError::Local { path, why }) => {
                tracing::warn!(path = %path.display(), why, "uploading the sealed segment whole");
                self.forget(&mut st, f);
                None
            }
            Err(PublishError::Upload(e)) => Some(Err(e)),
            Err(PublishError::Io { path, why }) => Some(Err(UploadError::Read {
                path,
                source: io::Error::other(why),
            })),
            Err(e @ PublishError::Cancelled { .. }) => {
                // Not a reason to upload it whole: the next start continues from the record.
                let path = f.path.clone();
                Some(Err(UploadError::Read {
                    path,
                    source: io::Error::new(io::ErrorKind::Interrupted, e.to_string()),
                }))
            }
        }
    }

    /// Deletes the shadow and the record of `f`; its state is done.
    fn forget(&self, st: &mut State, f: &SealedFile) {
        if let Some((shadow, record)) = self.growth_paths(f.kind, &f.path) {
            let _ = fs::remove_file(&record);
            let _ = fs::remove_file(&shadow);
        }
        self.stats.bytes.fetch_sub(st.counted, Ordering::Relaxed);
        st.counted = 0;
        st.record = None;
        st.done = true;
    }
}

fn permits(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024))
        .unwrap_or(u32::MAX)
        .clamp(1, ROUND_BUDGET_KIB)
}

/// The last byte before `durable` must end a line.
fn check_line_end(segment: &Path, durable: u64) -> Result<(), PublishError> {
    let local = |why: String| PublishError::Local {
        path: segment.to_path_buf(),
        why,
    };
    if durable == 0 {
        return Ok(());
    }
    let mut f = open_scanned(segment, None).map_err(|e| local(e.to_string()))?;
    f.seek(SeekFrom::Start(durable - 1))
        .map_err(|e| local(e.to_string()))?;
    let mut b = [0u8; 1];
    f.read_exact(&mut b).map_err(|e| local(e.to_string()))?;
    if b[0] != b'\n' {
        return Err(local(format!("byte {durable} does not end a line")));
    }
    Ok(())
}

/// Cuts the shadow back to `object_len` (what a failed round appended goes) and appends the
/// segment's bytes `[from, to)` as gzip members; (the shadow's new length, `object_len`).
fn extend_shadow(
    segment: &Path,
    shadow: &Path,
    from: u64,
    to: u64,
    object_len: u64,
    (enc, member): &mut Compressor,
) -> Result<(u64, u64), PublishError> {
    let local = |why: String| PublishError::Io {
        path: shadow.to_path_buf(),
        why,
    };
    let mut out = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(shadow)
        .map_err(|e| local(format!("opening: {e}")))?;
    let have = out.metadata().map_err(|e| local(e.to_string()))?.len();
    if have < object_len {
        return Err(PublishError::Local {
            path: shadow.to_path_buf(),
            why: format!("the shadow has {have} bytes, the object {object_len}"),
        });
    }
    out.set_len(object_len)
        .and_then(|_| out.seek(SeekFrom::Start(object_len)).map(|_| ()))
        .map_err(|e| local(e.to_string()))?;
    let src = open_scanned(segment, None).map_err(|e| PublishError::Local {
        path: segment.to_path_buf(),
        why: e.to_string(),
    })?;
    let mut src = src;
    src.seek(SeekFrom::Start(from))
        .map_err(|e| local(e.to_string()))?;
    if from == to {
        // Nothing new (a whole upload of the object so far).
        return Ok((object_len, object_len));
    }
    // Never fed an empty input: a reused encoder then yields no member at all.
    let mut reader = src.take(to - from);
    let mut read = 0u64;
    let mut last = 0u8;
    loop {
        member.clear();
        let more = enc
            .next_member(&mut reader, member, |b| {
                read += b.len() as u64;
                if let Some(&l) = b.last() {
                    last = l;
                }
            })
            .map_err(|e| local(format!("compressing: {e}")))?;
        out.write_all(member)
            .map_err(|e| local(format!("writing: {e}")))?;
        if !more {
            break;
        }
    }
    if read != to - from || last != b'\n' {
        let _ = out.set_len(object_len);
        return Err(PublishError::Local {
            path: segment.to_path_buf(),
            why: format!("bytes {from}..{to} are not whole lines ({read} read)"),
        });
    }
    let len = out.metadata().map_err(|e| local(e.to_string()))?.len();
    Ok((len, object_len))
}

/// Replaces the record (not fsync'd: see the module doc).
fn write_record(path: &Path, r: &Record) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec(r).map_err(io::Error::other)?;
    let mut f = File::create(&tmp)?;
    f.write_all(&bytes)?;
    drop(f);
    fs::rename(&tmp, path)
}
