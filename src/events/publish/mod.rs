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
//!   far, counted against `--max-spool-bytes` as it is written, member by member, each
//!   only when the budget has room for it, see [`crate::events::spool::Budget`]: a copy
//!   refused part way has its segment sealed, uploaded whole without a copy; a write
//!   that fails, a full disk included, cuts the shadow back to what its record says, and
//!   the spool's count follows the shadow's length on disk whatever happens; a shadow or
//!   record that cannot be written twice in a row, and at a seal once, has its segment
//!   uploaded whole, which needs no local disk, [`PublishError::Copy`]); with
//!   `--compression none` the segment itself is the object's bytes;
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
//!   every such write (the PUT, the completion) is conditional on the version it grows from,
//!   the record's ETag (`If-None-Match: *` for a first write), so a write delivered late (a
//!   killed run's, or one that timed out) is refused instead of replacing a newer version,
//!   and a 412 to our own is settled by reading the object (`storage::versioned`; the review
//!   r35j lost 100 of 300 acknowledged events to a late PUT);
//! - then what was published is recorded beside the shadow (`.rec`: raw bytes, object
//!   length, ETag), so a restart can continue.
//!
//! So every version a reader can see is whole gzip members of whole lines, and its lines
//! are a prefix of the next version's. A failed growth leaves the previous version whole
//! (S3: nothing is visible before the completion; file://: before the rename), and it is
//! tried again half a window later; an object that is not what the record says (changed, or left longer
//! by an upload a crash interrupted) is uploaded whole from the shadow.
//!
//! A restart with another `--compression` changes only the segments without a record (new
//! ones, and those no record names: an old spool, a record lost, and then only if no object
//! of the segment is under the other compression's key, one HEAD at the start,
//! [`Publisher::cfg_unrecorded`]): a segment whose record
//! names a key keeps that key and its compression to the end, whole upload included
//! ([`Publisher::cfg_for`]), so no object ever needs deleting, and a store that refuses
//! deletes (the S3 permissions docs/storage.md lists have no `s3:DeleteObject`) holds
//! nothing back (the review r35h found a switch's delete refused with 403 retried forever).
//! Only a record naming a key of another layout (an older version's record, another
//! `--prefix`) is written whole under the new key, the earlier one named in the record
//! ([`Record::stale`]) before that object is deleted, so a delete that fails or is cut by
//! a kill is tried again, by the next publication, the seal (which does not end until it
//! is done) or the next start.
//!
//! Every key written is named by the record first: a segment's first publication writes a
//! record naming its key (holding nothing yet) and fsyncs it before the PUT, as a
//! write-ahead log; a switch names the new key in the record before it is written; a seal
//! of a segment never published records the key the uploader then uploads it whole under.
//! The record stays until the segment has left the spool ([`Publisher::uploaded`]). So a
//! kill -9 anywhere, then a restart in any `--compression`, knows the key an object of
//! the segment may be under, and keeps it (the review r35e found a kill between a first
//! PUT and its record, then the other setting, leaving both objects).
//!
//! Sealing ends with a last publication of the remaining bytes to the same key
//! ([`Publisher::seal`], called by the uploader), then the shadow is deleted, and the
//! record once the uploader has deleted the segment. One upload per key at a time: a seal waits for the
//! publication of its segment in flight. A segment with nothing new costs no request. A
//! segment without a record (an old spool, a record lost) is uploaded whole by the uploader,
//! as before.
//!
//! Invariants relied on: the writer's durable lengths only grow and end on a line break
//! (checked here before anything is published); a shadow is only written under its
//! segment's lock; the record is written after the object holds what it says (a stale
//! record only costs a whole upload), except the record naming a key before its first write
//! (fsync'd, with its directory, at a first publication; not at a switch, which a restart
//! does for every segment at once, nor at the seal of a segment never published, the
//! shutdown's path: there a power loss between the write and the record reaching the disk,
//! then a restart with another `--compression`, can keep both objects). The other records and the shadow are not fsync'd: a kill -9 keeps the page
//! cache; after a power loss with the spool kept, a shadow shorter
//! than its record makes the seal upload the segment whole.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::{ObjectStore, ObjectStoreExt};
use tokio::sync::{watch, Mutex as AsyncMutex, Semaphore};
use tokio::task::JoinSet;

use crate::events::object::{gzip_level, object_key, upload_file, Compression, UploaderConfig};
use crate::events::spool::{
    growth_names, FileKind, OpenView, SealedFile, SpoolStats, FILE_BUDGET_BYTES, GROWTH_DIR,
};
use crate::metrics as m;
use crate::storage::append::{AppendError, Appender};
use crate::storage::gzip::{MemberEncoder, MEMBER_INPUT};
use crate::storage::put::UploadError;
use crate::storage::versioned::{conditions_in_use, write_version, Base};
use crate::util::fs::Beneath;
use crate::util::time::unix_nanos;

mod shadow;
use shadow::{check_line_end, extend_shadow, CopyAccount, CopyJob};

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
    /// Its version after our last write (GCS's generation, which its conditional writes
    /// name), when the store gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    /// Keys this segment's objects were published under before (a key of another layout, or
    /// of another `--compression` in the records of versions before r35h) whose deletion is not known to be done: deleted once the object
    /// under `key` holds what they held, and the seal ends only when none is left.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    stale: Vec<String>,
}

#[derive(Default)]
struct State {
    loaded: bool,
    record: Option<Record>,
    /// The object may not match the record: the next publication uploads it whole.
    whole_next: bool,
    /// Sealed and finished: nothing more to publish.
    done: bool,
    /// Shadow bytes counted in the spool's budget: its length on disk (every change of
    /// the shadow goes through [`CopyAccount`]), so a state dropped and loaded again (from
    /// the shadow's length) counts the same.
    counted: u64,
    /// Files of this segment under `spool/growth/` counted in the budget's files (its shadow
    /// and record: [`FILE_BUDGET_BYTES`] each, like every spool file, counted before they
    /// are created, [`Publisher::claim_growth_files`]; the review of issue 35 found 800
    /// partitions taking 2.3 times the budget on disk, their 1,600 growth files uncounted).
    files: u64,
    /// While a key switch writes the object under its new key: the earlier keys, for the
    /// new record.
    stale: Vec<String>,
    /// A copy written past the record that its upload did not take (a store outage): the
    /// shadow's bytes from the record's `object_len` to `shadow_len` are whole members of
    /// the segment's bytes up to `raw`. The next round appends only what is newer, instead
    /// of cutting the shadow back and compressing it all again.
    ahead: Option<Ahead>,
    /// Publications of this open segment in a row that failed writing its copy or record
    /// ([`PublishError::Copy`]): the second has it sealed.
    copy_failures: u8,
}

/// See [`State::ahead`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ahead {
    /// The record's `object_len` the copy continues.
    object_len: u64,
    /// Segment bytes in the shadow.
    raw: u64,
    /// The shadow's length.
    shadow_len: u64,
}

/// Why a publication did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Uploading failed (retried half a window later, or by the uploader's backoff at a
    /// seal).
    #[error(transparent)]
    Upload(#[from] UploadError),
    /// The spool's budget has no room for the next member of the compressed copy: the copy
    /// is cut back and the segment sealed (asked of the writer), so it is uploaded whole,
    /// which needs no copy; only seals free room, so trying again would not.
    #[error("{path}: no room in --max-spool-bytes for {needed} more bytes of its compressed copy")]
    NoRoom {
        /// Which segment.
        path: PathBuf,
        /// The member's bytes.
        needed: u64,
    },
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
    /// Writing the compressed copy (the shadow) or the record failed: a full or failing
    /// spool disk (ENOSPC, EDQUOT, EIO...). An open segment's publication is tried again
    /// half a window later once (a passing failure); a second failure in a row has it
    /// sealed, and a seal uploads the segment whole, which needs no local disk: so a full
    /// spool disk never holds acknowledged events out of the bucket (the review r35h found
    /// them kept out until a node loss lost them, the seal retried forever and SIGTERM
    /// exiting 3). The record's earlier keys are still deleted after the whole upload.
    #[error("{path}: {why}")]
    Copy {
        /// Which file.
        path: PathBuf,
        /// What failed.
        why: String,
    },
    /// Reading the segment failed (EIO, EMFILE, a signal...): nothing is known to be wrong
    /// with the files, so the publication is tried again half a window later (at a seal: by
    /// the uploader's backoff).
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
    /// When this publisher was made (Unix ns): segments created before are an earlier
    /// run's ([`Publisher::cfg_unrecorded`]).
    started_unix_nanos: u64,
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
        // `rhc_event_conditional_writes` is 1 from the start for a store that takes
        // conditions (read at each scrape), 0 for `file://`, which needs none.
        if !matches!(appender, Some(Appender::Local(_))) {
            conditions_in_use();
        }
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
            started_unix_nanos: unix_nanos(),
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
                        || s.try_lock().map_or(true, |g| {
                            g.whole_next
                                || g.ahead.is_some()
                                || g.copy_failures > 0
                                || (g.done && self.stats.is_open(p))
                        })
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
        // Counted as long as it is: by the spool's recovery when it found it, and by every
        // publication since, which leaves the count at the shadow's length on disk
        // ([`CopyAccount`]), whether it succeeded or not.
        st.counted = fs::metadata(&shadow).map(|m| m.len()).unwrap_or(0);
        // Counted when they were made (by this run or the spool's recovery).
        st.files = u64::from(shadow.exists()) + u64::from(record.exists());
    }

    /// Counts, before they are created, the growth files of `segment` that a publication
    /// makes (its shadow with compression, its record), when the budget has room for them:
    /// else [`PublishError::NoRoom`].
    fn claim_growth_files(
        &self,
        st: &mut State,
        kind: FileKind,
        segment: &Path,
        shadow: bool,
    ) -> Result<(), PublishError> {
        let Some((s, r)) = self.growth_paths(kind, segment) else {
            return Ok(());
        };
        let wanted = u64::from(shadow) + 1;
        if st.files >= wanted {
            return Ok(());
        }
        let have = u64::from(shadow && s.exists()) + u64::from(r.exists());
        let new = wanted.saturating_sub(have.max(st.files));
        if new > 0 && !self.stats.budget().claim_files(new) {
            return Err(PublishError::NoRoom {
                path: segment.to_path_buf(),
                needed: new * FILE_BUDGET_BYTES,
            });
        }
        st.files += new;
        Ok(())
    }

    /// After a publication, whatever came of it: the growth files counted are those that
    /// exist (one claimed and never made, or a record removed after a failed write, is
    /// given back).
    fn settle_growth_files(&self, st: &mut State, kind: FileKind, segment: &Path) {
        let Some((s, r)) = self.growth_paths(kind, segment) else {
            return;
        };
        let have = u64::from(s.exists()) + u64::from(r.exists());
        if have < st.files {
            self.stats.budget().files_gone(st.files - have);
            st.files = have;
        }
    }

    async fn publish_open(&self, path: &Path, view: OpenView, read_at: u64) -> bool {
        let state = self.state(path);
        let mut st = state.lock().await;
        if st.done || !self.stats.is_open(path) {
            return true;
        }
        self.load(&mut st, view.kind, path);
        let published = self
            .publish(&mut st, path, view.kind, &view.relative_key, view.durable)
            .await;
        self.settle_growth_files(&mut st, view.kind, path);
        match published {
            Ok(_) => {
                st.copy_failures = 0;
                self.stats.segment_published(path, view.durable, read_at);
                // Earlier keys (none in an open segment of this run, in practice): their
                // failure is logged and tried again with the next publication or the seal.
                let _ = self.delete_stale(&mut st, view.kind, path).await;
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
                    PublishError::NoRoom { .. } => {
                        // Its copy does not fit beside what the spool holds: only seals free
                        // room, so it is sealed and uploaded whole (no copy needed) rather
                        // than tried again until its rotation while its events stay out of
                        // the bucket (the review of issue 35).
                        tracing::warn!(error = %e, "no room for an open segment's compressed copy; sealing it to upload it whole");
                        self.stats.request_seal(path);
                    }
                    PublishError::Copy { .. } => {
                        st.copy_failures = st.copy_failures.saturating_add(1);
                        if st.copy_failures >= 2 {
                            // The spool disk stays full (or failing): the segment goes up
                            // whole, which needs no local disk, instead of its events waiting
                            // out of the bucket for the disk to free.
                            tracing::warn!(error = %e, "could not write an open segment's compressed copy or record twice in a row; sealing it to upload it whole");
                            self.stats.request_seal(path);
                        } else {
                            tracing::warn!(error = %e, "could not write an open segment's compressed copy or record; tried again half a window later");
                        }
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
        let cfg = self.cfg_for(st.record.as_ref(), &file);
        let key = object_key(&cfg, &file);
        let gzip = gzip_level(&cfg, &file);
        if st.record.as_ref().is_some_and(|r| r.key != key) {
            // Published under another key (not a compression switch, which keeps the
            // record's key: another layout, or a record of an older version): this
            // one is written whole first, then that object goes, so a reader always has one
            // of them (and a failure leaves the earlier one, tried again later). The earlier
            // key goes into the new record before it is deleted ([`Record::stale`]), so a
            // failed or interrupted delete is tried again, across restarts too, and the seal
            // ends only once it is done: never both objects, every line twice.
            //
            // Before anything is written under the new key, the record on disk names it
            // among the keys to delete once the object under the record's key is whole
            // (the review of issue 35: a kill -9 after the new PUT, then the setting
            // reverted, left both objects; a record that could not be written after it
            // left the old key in memory only, forgotten, both objects kept). If that
            // cannot be recorded (a full disk), nothing is switched now: tried again.
            if let Some(r) = st.record.as_mut() {
                if !r.stale.contains(&key) {
                    let mut intended = r.clone();
                    intended.stale.push(key.clone());
                    // Not fsync'd (a kill -9 keeps it): a restart switches every segment
                    // of the spool at once, and 400 fsync pairs doubled its drain (29 s to
                    // 62 s on the shared machine).
                    self.write_intent(kind, segment, &intended, false).await?;
                    *r = intended;
                }
            }
            let old = st.record.take();
            st.stale = stale_keys(old.as_ref(), &key);
            st.whole_next = true;
            st.ahead = None;
            let written = Box::pin(self.publish(st, segment, kind, relative_key, durable)).await;
            if written.is_err() && st.record.is_none() {
                // Nothing new was recorded: the record on disk is still the old one.
                st.record = old;
            }
            st.stale.clear();
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
        self.claim_growth_files(st, kind, segment, gzip.is_some())?;
        if st.record.is_none() && st.stale.is_empty() {
            // A first publication: nothing on disk names the key yet, so before anything is
            // written under it, a record does (durably, as a write-ahead log): a kill after
            // the PUT then leaves a record naming the object, and a restart with another
            // `--compression` keeps publishing under it ([`Publisher::cfg_for`]) (the
            // review r35e found both objects, every line twice, after a kill between a first
            // PUT and its record). It holds nothing yet, so the next publication is whole.
            // If it cannot be written (a full disk), nothing is published now: tried again.
            let intent = Record {
                key: key.clone(),
                raw: 0,
                object_len: 0,
                e_tag: None,
                version: None,
                stale: Vec::new(),
            };
            self.write_intent(kind, segment, &intent, true).await?;
            st.record = Some(intent);
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
                let new_bytes = durable - published;
                let cost = permits(2 * new_bytes.min(MEMBER_INPUT as u64) + (256 << 10));
                let _permit = self.budget.acquire_many(cost).await;
                let _cpu = self.compressing.acquire().await;
                let pool = self.encoders.clone();
                let job = CopyJob {
                    segment: segment.to_path_buf(),
                    shadow,
                    from: published,
                    to: durable,
                    object_len: from,
                    resume: st
                        .ahead
                        .take()
                        .filter(|a| a.object_len == from && a.raw >= published && a.raw <= durable),
                };
                let mut acct = CopyAccount {
                    stats: self.stats.clone(),
                    counted: st.counted,
                };
                let joined = tokio::task::spawn_blocking(move || {
                    let mut enc = lock(&pool)
                        .pop()
                        .unwrap_or_else(|| (MemberEncoder::new(level), Vec::new()));
                    let r = extend_shadow(&job, &mut enc, &mut acct);
                    lock(&pool).push(enc);
                    (r, acct.counted)
                })
                .await;
                let len = match joined {
                    Ok((r, counted)) => {
                        // Whatever came of it, the spool counts what the shadow holds now.
                        st.counted = counted;
                        r?
                    }
                    // Not run (the shutdown): nothing changed.
                    Err(e) if e.is_cancelled() => {
                        return Err(PublishError::Cancelled {
                            path: segment.to_path_buf(),
                        })
                    }
                    // A panic (a bug): the shadow is uploaded whole at the seal.
                    Err(e) => return Err(local(format!("compressing: {e}"))),
                };
                st.ahead = Some(Ahead {
                    object_len: from,
                    raw: durable,
                    shadow_len: len,
                });
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
                .append(
                    &key,
                    &source,
                    from,
                    new_len,
                    e_tag.as_deref(),
                    crate::util::pace::Flow::default(),
                )
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
        let (sent, e_tag, version) = match result {
            Some((sent, e_tag)) => (sent, e_tag, None),
            None => {
                let _permit = self
                    .budget
                    .acquire_many(permits(new_len.min(self.cfg.part_size as u64)))
                    .await;
                // Conditional on the version it grows from (the record's), or on no object
                // for a first write, so that a write of an older version delivered late
                // cannot replace this one, nor this one a newer (`storage::versioned`).
                let base = match &st.record {
                    Some(r) if r.object_len == 0 && r.e_tag.is_none() => Base::Absent,
                    Some(r) => Base::Version {
                        e_tag: r.e_tag.clone(),
                        version: r.version.clone(),
                    },
                    None => Base::Absent,
                };
                let put = write_version(
                    &self.store,
                    self.appender.as_ref(),
                    &key,
                    &source,
                    new_len,
                    self.cfg.part_size,
                    base,
                )
                .await?;
                for _ in 0..put.conflicts {
                    m::publication("conflict", 0);
                }
                m::publication("whole", put.bytes);
                (put.bytes, put.e_tag, put.version)
            }
        };
        let stale = match &st.record {
            Some(r) => r.stale.clone(),
            None => std::mem::take(&mut st.stale),
        };
        let record = Record {
            key,
            raw: durable,
            object_len: new_len,
            e_tag,
            version,
            stale,
        };
        if let Some((_, path)) = self.growth_paths(kind, segment) {
            if let Err(e) = write_record(&path, &record) {
                // The record on disk stays (never removed while the segment is in the
                // spool): it names this key (or the earlier key and this one as one to
                // delete), so whatever happens next (a restart, a state dropped and loaded
                // again) knows every key that may exist and ends with one object; it is
                // only behind, which costs a whole upload (an object not as recorded is
                // uploaded whole).
                tracing::warn!(path = %path.display(), error = %e, "could not record a publication; the earlier record stays, naming the object");
            }
        }
        st.record = Some(record);
        st.whole_next = false;
        st.ahead = None;
        Ok(Some(sent))
    }

    /// Deletes the objects the record names as published under earlier keys
    /// ([`Record::stale`]); the record is rewritten without those that are gone. Called only
    /// once the object under the record's key holds at least what they held.
    async fn delete_stale(
        &self,
        st: &mut State,
        kind: FileKind,
        segment: &Path,
    ) -> Result<(), UploadError> {
        let Some(r) = st.record.as_mut() else {
            return Ok(());
        };
        if r.stale.is_empty() {
            return Ok(());
        }
        let (left, failed) = self.delete_keys(&r.stale).await;
        if left.len() != r.stale.len() {
            r.stale = left;
            if let Some((_, path)) = self.growth_paths(kind, segment) {
                if let Err(e) = write_record(&path, r) {
                    // The keys deleted stay named: deleting them again costs a request.
                    tracing::warn!(path = %path.display(), error = %e, "could not record the deletion of an earlier key");
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Deletes each of `keys` (one that is not there is gone already); the keys left, and
    /// the first failure.
    async fn delete_keys(&self, keys: &[String]) -> (Vec<String>, Option<UploadError>) {
        let mut left = Vec::new();
        let mut failed = None;
        for key in keys {
            let result = match object_store::path::Path::parse(key) {
                Ok(p) => self.store.delete(&p).await,
                // Not a key the store can name: nothing was ever published under it.
                Err(_) => Ok(()),
            };
            match result {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    tracing::info!(%key, "deleted the object published under the earlier key");
                }
                Err(e) if delete_refused(&e) => {
                    // Final: retrying a delete the credentials do not allow would keep the
                    // segment in the spool for good (the review r35h).
                    tracing::warn!(%key, error = %e, "the store refuses to delete the object published under the earlier key (the credentials lack s3:DeleteObject or its equivalent): it stays in the bucket beside the new one; not tried again");
                    m::publication("delete_refused", 0);
                }
                Err(e) => {
                    tracing::warn!(%key, error = %e, "could not delete the object published under the earlier key; tried again");
                    left.push(key.clone());
                    failed.get_or_insert(UploadError::Delete {
                        key: key.clone(),
                        source: e,
                    });
                }
            }
        }
        (left, failed)
    }

    /// At a seal: publishes what is left of `f` to its object, deletes the objects it had
    /// under earlier keys, and forgets its growth state. `None` when it has no publication
    /// (upload it whole, as before); the bytes sent otherwise. A publication that cannot
    /// continue (the object or the shadow not as recorded, no room in the budget for the
    /// copy, the copy or the record not written: a full spool disk) is redone whole from
    /// the segment. An error leaves the record (and with it
    /// the earlier keys still to delete) for the uploader's next try.
    pub async fn seal(&self, f: &SealedFile) -> Option<Result<u64, UploadError>> {
        if !(f.compressible && matches!(f.kind, FileKind::Events | FileKind::Quarantine)) {
            return None;
        }
        let state = self.state(&f.path);
        let mut st = state.lock().await;
        self.load(&mut st, f.kind, &f.path);
        // The key and compression the segment was published with, whatever this run's.
        let cfg = self.cfg_for(st.record.as_ref(), f);
        if let Some(a) = &self.appender {
            crate::storage::append::remove_local_temp(a, &object_key(&cfg, f)).await;
        }
        if st.record.is_none() {
            // Uploaded whole by the uploader: the key it PUTs is recorded first, so a kill
            // before the segment leaves the spool, then a restart with another
            // `--compression`, uploads it under that key again instead of keeping both. A record that
            // cannot be written (a full disk) does not hold the upload back: the segment's
            // events are not in the bucket yet, and freeing the disk comes first.
            //
            // The record file is counted in the budget's files before it is made, like every
            // growth file (the review r35h found it made uncounted here, then given back by
            // the next seal's forget after a failed upload: the files count one short).
            // Knowing the key matters more than a few hundred bytes: counted even past the
            // budget.
            if self
                .claim_growth_files(&mut st, f.kind, &f.path, false)
                .is_err()
            {
                self.stats.budget().add_growth_file();
                st.files += 1;
            }
            // A segment an earlier run left without a record (its record could not be
            // written, a full spool disk) may be in the bucket under the other
            // `--compression`'s key already: then it keeps that key and compression.
            let cfg = match self.cfg_unrecorded(f).await {
                Ok(c) => c,
                Err(e) => return Some(Err(e)),
            };
            if !Arc::ptr_eq(&cfg, &self.cfg) {
                if let Some(a) = &self.appender {
                    crate::storage::append::remove_local_temp(a, &object_key(&cfg, f)).await;
                }
            }
            let intent = Record {
                key: object_key(&cfg, f),
                raw: 0,
                object_len: 0,
                e_tag: None,
                version: None,
                stale: Vec::new(),
            };
            if let Err(e) = self.write_intent(f.kind, &f.path, &intent, false).await {
                tracing::warn!(error = %e, "could not record the key of a sealed segment before uploading it whole");
            }
            self.settle_growth_files(&mut st, f.kind, &f.path);
            self.forget(&mut st, f);
            if Arc::ptr_eq(&cfg, &self.cfg) {
                return None;
            }
            // Uploaded whole over the object found: it holds a prefix of the segment (or
            // all of it), so overwriting it loses nothing.
            return Some(upload_file(&cfg, &self.store, f).await);
        }
        match self
            .publish(&mut st, &f.path, f.kind, &f.relative_key, f.bytes)
            .await
        {
            Ok(sent) => {
                if let (Some(a), Some(r)) = (&self.appender, &st.record) {
                    crate::storage::append::sync_local_object_dir(a, &r.key).await;
                }
                if let Err(e) = self.delete_stale(&mut st, f.kind, &f.path).await {
                    return Some(Err(e));
                }
                self.forget(&mut st, f);
                Some(Ok(sent.unwrap_or(0)))
            }
            Err(
                e @ (PublishError::Local { .. }
                | PublishError::NoRoom { .. }
                | PublishError::Copy { .. }),
            ) => {
                tracing::warn!(error = %e, "uploading the sealed segment whole");
                let key = object_key(&cfg, f);
                let stale = stale_keys(st.record.as_ref(), &key);
                if stale.is_empty() && Arc::ptr_eq(&cfg, &self.cfg) {
                    self.forget(&mut st, f);
                    return None;
                }
                // Uploaded here under the key the record names (in its compression, which
                // may not be this run's); objects under earlier keys go once this one holds
                // the segment whole; until then the record (naming them) stays for the next
                // try.
                let sent = match upload_file(&cfg, &self.store, f).await {
                    Ok(n) => n,
                    Err(e) => return Some(Err(e)),
                };
                if let (_, Some(e)) = self.delete_keys(&stale).await {
                    return Some(Err(e));
                }
                self.forget(&mut st, f);
                Some(Ok(sent))
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

    /// The uploader deleted the segment of `f` (uploaded): its record goes too (a kill
    /// between the two leaves a record without a segment, removed by the next start).
    pub fn uploaded(&self, f: &SealedFile) {
        if let Some((shadow, record)) = self.growth_paths(f.kind, &f.path) {
            // The record stayed counted after [`Publisher::forget`]: given back as it goes.
            if fs::remove_file(&record).is_ok() {
                self.stats.budget().files_gone(1);
            }
            let _ = fs::remove_file(&shadow);
        }
    }

    /// The settings `f` is published and uploaded with: this run's, unless its record names
    /// the key the other `--compression` gives it (an earlier run published it, or recorded
    /// it before uploading it whole): then that compression. So a segment keeps its key and
    /// compression across a restart with another `--compression` (only segments without a
    /// record take the new setting) and no object of it ever needs deleting: the S3
    /// permissions docs/storage.md documents have no `s3:DeleteObject` (the review r35h found
    /// the switch's delete refused with 403 and retried forever, the segments kept in the
    /// spool and SIGTERM exiting 3).
    fn cfg_for(&self, record: Option<&Record>, f: &SealedFile) -> Arc<UploaderConfig> {
        let Some(r) = record else {
            return self.cfg.clone();
        };
        if r.key == object_key(&self.cfg, f) {
            return self.cfg.clone();
        }
        let mut other = (*self.cfg).clone();
        other.compression = match self.cfg.compression {
            Compression::Gzip => Compression::None,
            Compression::None => Compression::Gzip,
        };
        if object_key(&other, f) == r.key {
            Arc::new(other)
        } else {
            // Another layout (not a compression switch): published under this run's key,
            // the record's deleted after (see [`Record::stale`]).
            self.cfg.clone()
        }
    }

    /// The settings a segment without a record is uploaded whole with: this run's, unless it
    /// was created before this publisher (an earlier run's, found by the spool's recovery)
    /// and an object of it is already under the key the other `--compression` gives it:
    /// then that compression, so a restart with the other setting does not leave a second
    /// object of the same lines (the review r35i found a segment whose record a full spool
    /// disk kept from being written uploaded by one run, then again under the other key by
    /// the next). One HEAD per such segment, at a start only: a segment of this run without
    /// a record was never uploaded. A HEAD the store refuses (403: no `s3:GetObject`, or a
    /// missing key without `s3:ListBucket`) counts as no object; any other failure is
    /// retried by the uploader's backoff.
    async fn cfg_unrecorded(&self, f: &SealedFile) -> Result<Arc<UploaderConfig>, UploadError> {
        if f.created_unix_nanos >= self.started_unix_nanos {
            return Ok(self.cfg.clone());
        }
        let mut other = (*self.cfg).clone();
        other.compression = match self.cfg.compression {
            Compression::Gzip => Compression::None,
            Compression::None => Compression::Gzip,
        };
        let key = object_key(&other, f);
        if key == object_key(&self.cfg, f) {
            return Ok(self.cfg.clone());
        }
        let Ok(location) = object_store::path::Path::parse(&key) else {
            return Ok(self.cfg.clone());
        };
        match self.store.head(&location).await {
            Ok(_) => {
                tracing::info!(%key, "a segment of an earlier run without a record is already under the other --compression's key: it keeps that key and compression");
                Ok(Arc::new(other))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(self.cfg.clone()),
            Err(e) if delete_refused(&e) => {
                tracing::warn!(%key, error = %e, "the store refuses the HEAD that checks whether a segment of an earlier run is under the other --compression's key: uploaded under this run's");
                Ok(self.cfg.clone())
            }
            Err(source) => Err(UploadError::Store { key, source }),
        }
    }

    /// Writes `r` as the record of `segment` and makes it durable (the file and the
    /// directory fsync'd) before anything is written under a key it names for the first
    /// time: a write-ahead entry, once per segment (and per key switch).
    ///
    /// `sync: false` (a seal of a segment never published: the shutdown's path, 5,000
    /// partitions at once) writes it like every other record, which a kill -9 keeps (the
    /// page cache) but a power loss may not: see the module doc.
    async fn write_intent(
        &self,
        kind: FileKind,
        segment: &Path,
        r: &Record,
        sync: bool,
    ) -> Result<(), PublishError> {
        let Some((_, path)) = self.growth_paths(kind, segment) else {
            return Ok(());
        };
        let written = if sync {
            // Off the runtime's threads: an fsync of the file and of the directory.
            let (p, r) = (path.clone(), r.clone());
            tokio::task::spawn_blocking(move || write_record_synced(&p, &r))
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)))
        } else {
            write_record(&path, r)
        };
        written.map_err(|e| PublishError::Copy {
            path: path.clone(),
            why: format!("recording the key before writing it: {e}"),
        })
    }

    /// Deletes the shadow of `f`; its state is done. The record stays on disk until the
    /// segment is gone ([`Publisher::uploaded`]): a kill before that, then a restart with
    /// another `--compression`, must still know the key its object is under; it stays
    /// counted in the budget's files until then, so every growth file is counted from just
    /// before it is made until it is removed, and what is claimed is what is given back.
    fn forget(&self, st: &mut State, f: &SealedFile) {
        let mut kept = 0;
        if let Some((shadow, record)) = self.growth_paths(f.kind, &f.path) {
            let _ = fs::remove_file(&shadow);
            kept = u64::from(record.exists()).min(st.files);
        }
        self.stats.budget().sub_stored(st.counted);
        self.stats.budget().files_gone(st.files - kept);
        st.counted = 0;
        st.files = kept;
        st.record = None;
        st.done = true;
    }
}

/// The keys a segment's objects were published under that are not `key`: the record's
/// earlier ones and, if it names another, its own.
fn stale_keys(record: Option<&Record>, key: &str) -> Vec<String> {
    let Some(r) = record else {
        return Vec::new();
    };
    let mut keys: Vec<String> = r.stale.iter().filter(|k| *k != key).cloned().collect();
    if r.key != key && !keys.contains(&r.key) {
        keys.push(r.key.clone());
    }
    keys
}

/// A delete the store refuses for good: the credentials do not allow it (403, or
/// `AccessDenied` for the key in a DeleteObjects answer).
fn delete_refused(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }
    ) || e.to_string().contains("AccessDenied")
}

fn permits(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024))
        .unwrap_or(u32::MAX)
        .clamp(1, ROUND_BUDGET_KIB)
}

/// Why reading an open segment failed: [`PublishError::Local`] (the seal uploads it whole)
/// only when the file itself is not what it must be (a symlink or not a regular file now,
/// gone, shorter than its durable length); any other error (EIO, EMFILE, ENFILE, ENOMEM, a
/// signal) says nothing about the file, so it is [`PublishError::Io`] and the publication
/// is tried again half a window later (the review of issue 35 found one EMFILE stopping a
/// segment's publication until its seal).
/// Replaces the record (not fsync'd: see the module doc).
fn write_record(path: &Path, r: &Record) -> io::Result<()> {
    write_record_with(path, r, false)
}

/// Replaces the record durably: the file fsync'd before the rename, the directory after.
fn write_record_synced(path: &Path, r: &Record) -> io::Result<()> {
    write_record_with(path, r, true)
}

fn write_record_with(path: &Path, r: &Record, sync: bool) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec(r).map_err(io::Error::other)?;
    let written = File::create(&tmp).and_then(|mut f| {
        f.write_all(&bytes)?;
        if sync {
            f.sync_all()?;
        }
        Ok(())
    });
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        // No temporary left behind (a full disk: the record stays as it was).
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if sync {
        if let Some(dir) = path.parent() {
            crate::util::fs::fsync_dir(dir)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record whose write fails leaves no temporary behind (review r35i, D2).
    #[test]
    fn a_failed_record_write_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        // The rename fails: the target is a non-empty directory.
        let path = dir.path().join("e.x.rec");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("keep"), b"x").unwrap();
        let r = Record {
            key: "k".into(),
            raw: 0,
            object_len: 0,
            e_tag: None,
            version: None,
            stale: Vec::new(),
        };
        assert!(write_record(&path, &r).is_err());
        assert!(!path.with_extension("tmp").exists(), "the temporary stayed");
    }
}
