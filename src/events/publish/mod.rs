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
//!   its ETag) plus the new bytes as the last part, completed at once; Azure: the new bytes
//!   as a new block committed after the blob's blocks (Get Block List, Put Block, Put Block
//!   List with `If-Match`; every version is written as blocks of our ids for that,
//!   `storage::append::AzureAppender`); GCS: the new bytes uploaded as a part object and
//!   composed onto the object, the part deleted (every version is written through GCS's
//!   JSON API for that, `storage::append::GcsAppender`); smaller objects on S3, and every
//!   object on a `gs://` server without the JSON API: a PUT of the object's bytes so far (a
//!   multipart upload completes atomically);
//!   every such write (the PUT, the completion, the block list, the upload and the compose)
//!   is conditional on the version it grows from, the record's ETag or GCS generation
//!   (`If-None-Match: *`, `ifGenerationMatch=0`, for a first write), so a write delivered late (a
//!   killed run's, or one that timed out) is refused instead of replacing a newer version,
//!   and a 412 to our own is settled by reading the object (`storage::versioned`; the review
//!   r35j lost 100 of 300 acknowledged events to a late PUT);
//! - then what was published is recorded beside the shadow (`.rec`: raw bytes, object
//!   length, ETag), so a restart can continue.
//!
//! So every version a reader can see is whole gzip members of whole lines, and its lines
//! are a prefix of the next version's. A failed growth leaves the previous version whole
//! (S3: nothing is visible before the completion; Azure: before the block list is committed;
//! GCS: before the compose; file://: before the rename), and it is
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
//! Each key deleted that way is looked at again until no write of a killed earlier run
//! can land there (a create on its way would find the key absent and land: `late`).
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
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::ObjectStore;
use tokio::sync::{watch, Mutex as AsyncMutex, Semaphore};
use tokio::task::JoinSet;

use crate::events::object::UploaderConfig;
use crate::events::spool::{OpenView, SpoolStats};
use crate::metrics as m;
use crate::storage::append::Appender;
use crate::storage::gzip::MemberEncoder;
use crate::storage::put::UploadError;
use crate::storage::versioned::conditions_in_use;
use crate::util::time::unix_nanos;

mod grow;
mod keys;
pub mod late;
mod records;
mod seal;
mod shadow;

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
    /// Objects deleted under an earlier key, looked at again for late writes.
    late: Arc<late::LateDeletes>,
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
            store,
            appender,
            stats,
            states: Mutex::new(HashMap::new()),
            budget: Semaphore::new(ROUND_BUDGET_KIB as usize),
            compressing: Semaphore::new(COMPRESSORS),
            encoders: Arc::new(Mutex::new(Vec::new())),
            late: Arc::new(late::LateDeletes::load(&spool_dir)),
            spool_dir,
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
        // Keys deleted under an earlier key, looked at again for late writes (`late`); one
        // check at a time, off this loop.
        let mut late_at = tokio::time::Instant::now();
        let mut late_check: Option<tokio::task::JoinHandle<()>> = None;
        // Due segments with the time their durable length was read.
        let mut queue: VecDeque<(PathBuf, OpenView, u64)> = VecDeque::new();
        let mut scanned_at: Option<tokio::time::Instant> = None;
        let mut more = false;
        // What an earlier run left goes first (issue 35): no publication of this run's
        // segments starts while the uploader takes those files, until none is left or none
        // was taken for a window (an outage, a file the store refuses).
        let held_since = tokio::time::Instant::now();
        let mut held = self.stats.earlier_left() > 0;
        self.stats.set_earlier_holding(held);
        if held {
            tracing::info!(
                files = self.stats.earlier_left(),
                "the new events are published once the files of the earlier run are uploaded"
            );
        }
        while !*stop.borrow() {
            if held && !self.stats.earlier_run_holds(window) {
                held = false;
                self.stats.set_earlier_holding(false);
                let left = self.stats.earlier_left();
                let waited_ms = held_since.elapsed().as_millis() as u64;
                if left == 0 {
                    tracing::info!(
                        waited_ms,
                        "the files of the earlier run are uploaded; publishing the new events"
                    );
                } else {
                    tracing::warn!(
                        files = left,
                        waited_ms,
                        "no file of the earlier run was uploaded for a window; publishing the new events beside them"
                    );
                }
            }
            // The open segments are scanned (under the writer's lock, walking all of them)
            // for a batch of due ones when the last batch is all started: at once if it was
            // full, else at most once a poll.
            if !held && queue.is_empty() && (more || scanned_at.is_none_or(|t| t.elapsed() >= poll))
            {
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
            self.late.save_if_due();
            if late_at.elapsed() >= self.late.every()
                && late_check.as_ref().is_none_or(|h| h.is_finished())
            {
                late_at = tokio::time::Instant::now();
                let (late, store) = (self.late.clone(), self.store.clone());
                late_check = Some(tokio::spawn(async move { late.check(&store).await }));
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
        self.stats.set_earlier_holding(false);
        tasks.detach_all();
        self.late.flush();
    }

    /// Saves the keys watched for late writes that are not saved yet (see `late`): the
    /// shutdown calls this once its drain ended.
    pub fn flush_late_deletes(&self) {
        self.late.flush();
    }

    fn state(&self, path: &Path) -> Arc<AsyncMutex<State>> {
        lock(&self.states)
            .entry(path.to_path_buf())
            .or_default()
            .clone()
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
}
