//! Append-only segment files on local disk: what makes a 2xx answer mean "durable".
//!
//! One writer thread owns every open segment. Requests hand it their events already
//! routed; it takes every request that is waiting at that moment as one group, appends
//! each partition's lines with one `write` per segment, `fdatasync`s every segment the
//! group touched, and only then answers all of them (group commit). A failed write rolls
//! the whole group back (truncate to the previous length, forget the event ids), so a
//! non-2xx answer never leaves half a batch behind to be duplicated by Ray's resend.
//!
//! The spool mirrors the bucket: `events/<session>/<node>/node_events/<node>-<hour>-<n>.jsonl`
//! is uploaded to `P/<same path>[.gz]`, so a segment's key is fixed when it is created and a
//! retried upload overwrites instead of duplicating. A segment is sealed (closed and handed to
//! the uploader) when older than the rotation interval, larger than the size limit, at
//! shutdown, or when found at start; the uploader deletes it only after the upload succeeded.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{mpsc as tokio_mpsc, oneshot};

use crate::contract::{format_rfc3339, is_safe_segment, Hour, Partition};
use crate::events::dedup::{id_hash, DedupWindow};
use crate::events::parse::{parse_event, ParsedEvent};
use crate::events::route::QuarantineReason;
use crate::metrics as m;

/// Errors of the spool; each carries what it was doing and on which path.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// A filesystem operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What we were doing.
        action: &'static str,
        /// On which file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Another process holds the spool directory.
    #[error("spool directory {0} is locked by another ray-history-collector")]
    Locked(PathBuf),
    /// The writer thread is gone (shutdown or a panic).
    #[error("the spool writer has stopped")]
    Stopped,
    /// Another write of the same group failed, so this request was rolled back too.
    #[error("{message}")]
    GroupFailed {
        /// The failing write's error.
        message: String,
        /// The failure was a full disk.
        no_space: bool,
    },
}

impl SpoolError {
    fn io(action: &'static str, path: &Path, source: io::Error) -> Self {
        SpoolError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }

    /// True when the disk is full or over quota: the caller should answer 503, not 500.
    pub fn is_no_space(&self) -> bool {
        match self {
            SpoolError::Io { source, .. } => {
                matches!(
                    source.raw_os_error(),
                    Some(libc::ENOSPC) | Some(libc::EDQUOT)
                )
            }
            SpoolError::GroupFailed { no_space, .. } => *no_space,
            _ => false,
        }
    }
}

/// Settings of the spool.
#[derive(Debug, Clone)]
pub struct SpoolConfig {
    /// Root directory; everything the collector writes locally is below it.
    pub dir: PathBuf,
    /// Seal a segment this long after it was opened.
    pub rotation_interval: Duration,
    /// Seal a segment once it holds this many bytes.
    pub max_segment_bytes: u64,
    /// At most this many segment files are kept open; the least recently written are closed
    /// (and reopened on the next write), so 10k jobs use neither 10k fds nor 10k buffers.
    pub max_open_files: usize,
    /// How many recent event ids are remembered for deduplication.
    pub dedup_window: usize,
    /// Write session markers (head role).
    pub write_session_markers: bool,
    /// Directory name for this collector's quarantine objects.
    pub quarantine_node: String,
}

/// What kind of object a sealed file becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FileKind {
    /// Empty session marker under `cluster-metadata/`; `relative_key` is the session.
    Marker,
    /// Event segment; `relative_key` is below `P`.
    Events,
    /// Quarantine records or bodies; `relative_key` is below the quarantine prefix.
    Quarantine,
}

/// A file in the spool that is complete and must reach the bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedFile {
    /// Where it is on disk.
    pub path: PathBuf,
    /// What it becomes.
    pub kind: FileKind,
    /// Key relative to the prefix of its kind, without compression suffix.
    pub relative_key: String,
    /// When it was created, Unix nanoseconds; orders uploads oldest first.
    pub created_unix_nanos: u64,
    /// Its size on disk.
    pub bytes: u64,
    /// Gzip on upload (the body quarantine keeps raw bytes as they came).
    pub compressible: bool,
}

/// Counters shared by the writer, the uploader and the HTTP side.
#[derive(Debug, Default)]
pub struct SpoolStats {
    /// Bytes of all spool files not yet uploaded (open and sealed).
    pub bytes: AtomicU64,
    /// Files not yet uploaded (open and sealed).
    pub files: AtomicU64,
    /// Creation times (Unix ns) of files not yet uploaded, for the oldest-age gauge.
    pending_created: Mutex<BTreeMap<u64, u32>>,
}

impl SpoolStats {
    fn add_file(&self, created: u64) {
        self.files.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut p) = self.pending_created.lock() {
            *p.entry(created).or_insert(0) += 1;
        }
    }

    /// Called by the uploader once a file is uploaded and deleted.
    pub fn file_done(&self, f: &SealedFile) {
        self.files.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_sub(f.bytes, Ordering::Relaxed);
        if let Ok(mut p) = self.pending_created.lock() {
            if let Some(c) = p.get_mut(&f.created_unix_nanos) {
                *c -= 1;
                if *c == 0 {
                    p.remove(&f.created_unix_nanos);
                }
            }
        }
    }

    /// Age in seconds of the oldest file not yet uploaded, 0 when none.
    pub fn oldest_pending_age_seconds(&self) -> f64 {
        let oldest = self
            .pending_created
            .lock()
            .ok()
            .and_then(|p| p.keys().next().copied());
        match oldest {
            Some(c) => (unix_nanos().saturating_sub(c)) as f64 / 1e9,
            None => 0.0,
        }
    }
}

/// Events of one request for one partition.
#[derive(Debug)]
pub struct PartitionBatch {
    /// Where they go.
    pub partition: Partition,
    /// Their byte ranges in the request body.
    pub events: Vec<EventSpan>,
}

/// One event inside a request body.
#[derive(Debug, Clone, Copy)]
pub struct EventSpan {
    /// Start offset in the body.
    pub start: usize,
    /// End offset in the body.
    pub end: usize,
    /// Hash of the event id, if the event has one.
    pub id_hash: Option<u64>,
    /// The bytes contain line breaks that must become spaces.
    pub has_newline: bool,
}

/// An event kept aside, with why.
#[derive(Debug)]
pub struct QuarantinedEvent {
    /// Why.
    pub reason: QuarantineReason,
    /// Its byte range in the body (valid JSON unless `source` is set).
    pub start: usize,
    /// End of the range.
    pub end: usize,
    /// For lines read from a file: the file name and the line's offset; the bytes are then
    /// kept as a string, since they may not be JSON.
    pub source: Option<(String, u64)>,
}

/// Everything one request wants stored.
#[derive(Debug)]
pub struct AppendBatch {
    /// The (decompressed) request body that the spans point into.
    pub body: Bytes,
    /// Routed events, grouped by partition.
    pub partitions: Vec<PartitionBatch>,
    /// Events that could not be routed.
    pub quarantined: Vec<QuarantinedEvent>,
}

/// What happened to a request's events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AppendOutcome {
    /// Stored, new.
    pub accepted: u64,
    /// Dropped: their event id was accepted recently.
    pub duplicates: u64,
    /// Stored in quarantine.
    pub quarantined: u64,
}

enum Command {
    Append(
        AppendBatch,
        oneshot::Sender<Result<AppendOutcome, SpoolError>>,
    ),
    QuarantineBody {
        body: Bytes,
        detail: String,
        reply: oneshot::Sender<Result<(), SpoolError>>,
    },
    SealAll(oneshot::Sender<()>),
    Marker(String, oneshot::Sender<Result<(), SpoolError>>),
    Stop,
    /// From the sync thread: the group in flight is durable, or not.
    Synced(Result<(), SpoolError>),
}

type AppendReply = oneshot::Sender<Result<AppendOutcome, SpoolError>>;

/// Handle to the spool; cheap to clone.
#[derive(Clone)]
pub struct Spool {
    tx: mpsc::Sender<Command>,
    stats: Arc<SpoolStats>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
    stopped: Arc<AtomicBool>,
    /// The writer ends when every handle is gone (its sync thread keeps the channel open).
    _alive: Arc<()>,
}

/// What the spool found at start.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    /// Segments and quarantine files queued for upload.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Segments whose torn last line was cut into quarantine.
    pub torn: usize,
    /// Files in the spool we do not recognise (left alone, reported).
    pub unknown: Vec<PathBuf>,
    /// Event ids loaded into the deduplication window.
    pub dedup_ids: usize,
}

impl Spool {
    /// Opens (creating if needed) the spool directory, locks it, recovers what an earlier run
    /// left (torn lines to quarantine, every file queued on `sealed`), and starts the writer.
    pub fn open(
        cfg: SpoolConfig,
        sealed: tokio_mpsc::UnboundedSender<SealedFile>,
    ) -> Result<(Spool, RecoveryReport), SpoolError> {
        let stats = Arc::new(SpoolStats::default());
        let (tx, rx) = mpsc::channel();
        let (init_tx, init_rx) = mpsc::channel();
        let stats2 = stats.clone();
        let alive = Arc::new(());
        let inbox = Inbox {
            rx,
            to_self: tx.clone(),
            alive: Arc::downgrade(&alive),
        };
        let thread = std::thread::Builder::new()
            .name("spool-writer".into())
            .spawn(move || {
                let mut w = match Writer::start(cfg, stats2, sealed, inbox) {
                    Ok((w, report)) => {
                        let _ = init_tx.send(Ok(report));
                        w
                    }
                    Err(e) => {
                        let _ = init_tx.send(Err(e));
                        return;
                    }
                };
                w.run();
            })
            .map_err(|e| {
                SpoolError::io("starting the spool writer thread for", Path::new("."), e)
            })?;
        let report = init_rx.recv().map_err(|_| SpoolError::Stopped)??;
        Ok((
            Spool {
                tx,
                stats,
                thread: Arc::new(Mutex::new(Some(thread))),
                stopped: Arc::new(AtomicBool::new(false)),
                _alive: alive,
            },
            report,
        ))
    }

    /// Shared counters.
    pub fn stats(&self) -> &Arc<SpoolStats> {
        &self.stats
    }

    /// Stores a request's events durably; resolves once they are fsync'd.
    pub async fn append(&self, batch: AppendBatch) -> Result<AppendOutcome, SpoolError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Append(batch, reply))
            .map_err(|_| SpoolError::Stopped)?;
        rx.await.map_err(|_| SpoolError::Stopped)?
    }

    /// Keeps a body that is not JSON in quarantine, once per distinct body.
    pub async fn quarantine_body(&self, body: Bytes, detail: String) -> Result<(), SpoolError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::QuarantineBody {
                body,
                detail,
                reply,
            })
            .map_err(|_| SpoolError::Stopped)?;
        rx.await.map_err(|_| SpoolError::Stopped)?
    }

    /// Makes sure the session's marker is recorded on disk and queued for upload (head role;
    /// a no-op on workers). Used by the log side, which sees sessions without any event.
    pub async fn ensure_marker(&self, session: &str) -> Result<(), SpoolError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Marker(session.to_string(), reply))
            .map_err(|_| SpoolError::Stopped)?;
        rx.await.map_err(|_| SpoolError::Stopped)?
    }

    /// Seals every open segment (shutdown); they are on the upload queue when this returns.
    pub async fn seal_all(&self) -> Result<(), SpoolError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::SealAll(reply))
            .map_err(|_| SpoolError::Stopped)?;
        rx.await.map_err(|_| SpoolError::Stopped)
    }

    /// Stops the writer thread and waits for it.
    pub fn stop(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.tx.send(Command::Stop);
        if let Ok(mut t) = self.thread.lock() {
            if let Some(t) = t.take() {
                let _ = t.join();
            }
        }
    }
}

/// Where open segments are kept: events by partition, quarantine by hour.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Target {
    Events(Partition),
    Quarantine(Hour),
}

struct OpenSegment {
    path: PathBuf,
    relative_key: String,
    kind: FileKind,
    created_unix_nanos: u64,
    opened_at: Instant,
    /// Bytes durably in the file.
    len: u64,
    /// Bytes written to the file: `len` plus groups not yet synced (rolled back on failure).
    written: u64,
    /// Shared with the sync thread, which may still be syncing it after it is closed here.
    file: Option<Arc<File>>,
    last_use: u64,
    /// Lines of the group being staged, not yet written.
    pending: Vec<u8>,
}

/// The writer's command channel, and what it needs to hand its own sync thread a way back.
struct Inbox {
    rx: mpsc::Receiver<Command>,
    to_self: mpsc::Sender<Command>,
    alive: Weak<()>,
}

/// What one write of the pending buffers touched, to be made durable.
#[derive(Default)]
struct Written {
    /// Bytes appended to each segment.
    appended: Vec<(Target, u64)>,
    files: Vec<(Arc<File>, PathBuf)>,
    dirs: Vec<PathBuf>,
    /// Too many files: one `syncfs` instead.
    whole_fs: bool,
    bytes: u64,
}

impl Written {
    fn merge(&mut self, other: Written) {
        self.appended.extend(other.appended);
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

/// Requests written to their segments whose sync has not yet answered.
struct InFlight {
    written: Written,
    replies: Vec<(AppendReply, AppendOutcome)>,
    /// Event ids to forget if the sync fails.
    inserted: Vec<u64>,
    new_sessions: Vec<String>,
    started: Instant,
}

/// A sync for the sync thread.
struct SyncJob {
    files: Vec<(Arc<File>, PathBuf)>,
    dirs: Vec<PathBuf>,
    /// `syncfs` on this fd instead of syncing `files`.
    whole_fs: Option<Arc<File>>,
}

struct Writer {
    cfg: SpoolConfig,
    stats: Arc<SpoolStats>,
    sealed: tokio_mpsc::UnboundedSender<SealedFile>,
    dedup: DedupWindow,
    open: HashMap<Target, OpenSegment>,
    open_fds: usize,
    clock: u64,
    last_n: u64,
    marked_sessions: HashSet<String>,
    synced_dirs: HashSet<PathBuf>,
    /// Directories with new entries not yet synced; synced by the next flush.
    dirty_dirs: HashSet<PathBuf>,
    recent_bodies: VecDeque<u64>,
    /// Reusable line buffers for the segments a group touches.
    buffers: Vec<Vec<u8>>,
    inbox: Inbox,
    /// Commands read while waiting for a sync, handled next.
    deferred: VecDeque<Command>,
    /// The group the sync thread is making durable.
    syncing: Option<InFlight>,
    /// Groups written after it, waiting for the next sync.
    waiting: Option<InFlight>,
    syncer: mpsc::Sender<SyncJob>,
    /// Shared with the sync thread; used directly only when nothing is in flight.
    sync_pool: Arc<SyncPool>,
    lock: Arc<File>,
}

/// Buffers kept for reuse, and the largest capacity worth keeping.
const POOLED_BUFFERS: usize = 4;
const POOLED_CAPACITY: usize = 1 << 20;

fn recycle(pool: &mut Vec<Vec<u8>>, mut buf: Vec<u8>) {
    if pool.len() < POOLED_BUFFERS && buf.capacity() <= POOLED_CAPACITY {
        buf.clear();
        pool.push(buf);
    }
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Replaces `path` with `value` as JSON, atomically and durably (temp file, fsync, rename,
/// fsync of the directory): the small state files beside the spool (log ledger, export
/// offsets) are never seen half written.
pub(crate) fn write_json_atomically(path: &Path, value: &impl serde::Serialize) -> io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
    let mut f = File::create(&tmp)?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// The sync thread: makes each job durable and tells the writer.
fn run_syncer(jobs: mpsc::Receiver<SyncJob>, done: mpsc::Sender<Command>, pool: Arc<SyncPool>) {
    while let Ok(job) = jobs.recv() {
        if done.send(Command::Synced(run_sync(job, &pool))).is_err() {
            return;
        }
    }
}

fn run_sync(job: SyncJob, pool: &SyncPool) -> Result<(), SpoolError> {
    #[cfg(test)]
    tests::injected_sync_failure(&job)?;
    if let Some(fs_handle) = &job.whole_fs {
        // SAFETY: syncfs on an fd we hold open (the spool's lock file).
        if unsafe { libc::syncfs(fs_handle.as_raw_fd()) } != 0 {
            return Err(SpoolError::io(
                "syncing the filesystem of the spool",
                Path::new(""),
                io::Error::last_os_error(),
            ));
        }
        return Ok(());
    }
    let targets = job
        .files
        .into_iter()
        .map(|(f, p)| SyncTarget::File(f, p))
        .chain(job.dirs.into_iter().map(SyncTarget::Dir))
        .collect();
    pool.sync_all(targets)
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

/// One file to `fdatasync` or directory to `fsync`.
enum SyncTarget {
    File(Arc<File>, PathBuf),
    Dir(PathBuf),
}

impl SyncTarget {
    fn sync(&self) -> Result<(), SpoolError> {
        match self {
            SyncTarget::File(f, path) => f
                .sync_data()
                .map_err(|e| SpoolError::io("syncing segment", path, e)),
            SyncTarget::Dir(dir) => fsync_dir(dir),
        }
    }
}

struct SyncTask {
    target: SyncTarget,
    done: mpsc::Sender<Result<(), SpoolError>>,
}

/// Threads that sync the files and directories of one group at the same time.
///
/// The syncs of a group overlap: the disk queues their writes together instead of one
/// file's data, inode and cache flush after the other (measured on this project's 2-core
/// VM: 5 files of a 1 MB group, 3.4 ms one after the other, 2.5-2.9 ms at once). The
/// threads are kept between groups: spawning one per file and group cost about 2.2 % of
/// the machine's CPU at full load (`clone3`, and `munmap` of its stack).
struct SyncPool {
    workers: Mutex<Vec<mpsc::Sender<SyncTask>>>,
}

/// At most one sync thread per file or directory of a group (a larger group is synced
/// with `syncfs`).
const MAX_SYNC_THREADS: usize = SYNCFS_ABOVE;

impl SyncPool {
    fn new() -> SyncPool {
        SyncPool {
            workers: Mutex::new(Vec::new()),
        }
    }

    /// Syncs every target, the first on the calling thread and the others at the same
    /// time on the pool's threads; returns the first error after all have finished.
    fn sync_all(&self, targets: Vec<SyncTarget>) -> Result<(), SpoolError> {
        let mut targets = targets.into_iter();
        let Some(mine) = targets.next() else {
            return Ok(());
        };
        let (done_tx, done_rx) = mpsc::channel();
        let mut first_error = None;
        let mut sent = 0usize;
        {
            let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
            for (i, target) in targets.enumerate() {
                if i >= workers.len() && workers.len() < MAX_SYNC_THREADS {
                    if let Some(w) = spawn_sync_worker() {
                        workers.push(w);
                    }
                }
                let task = SyncTask {
                    target,
                    done: done_tx.clone(),
                };
                let task = match workers.get(i % workers.len().max(1)) {
                    Some(w) => match w.send(task) {
                        Ok(()) => {
                            sent += 1;
                            continue;
                        }
                        Err(mpsc::SendError(task)) => task,
                    },
                    None => task,
                };
                // No thread to take it: sync it here, in turn.
                if let Err(e) = task.target.sync() {
                    first_error.get_or_insert(e);
                }
            }
        }
        drop(done_tx);
        if let Err(e) = mine.sync() {
            first_error.get_or_insert(e);
        }
        for _ in 0..sent {
            let result = done_rx.recv().unwrap_or_else(|_| {
                Err(SpoolError::io(
                    "syncing (a sync thread ended without answering)",
                    Path::new(""),
                    io::Error::other("sync thread ended"),
                ))
            });
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Starts one pool thread, or `None` if the system refuses (its work is then done inline).
fn spawn_sync_worker() -> Option<mpsc::Sender<SyncTask>> {
    let (tx, rx) = mpsc::channel::<SyncTask>();
    let spawned = std::thread::Builder::new()
        .name("spool-sync-file".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            while let Ok(task) = rx.recv() {
                let _ = task.done.send(task.target.sync());
            }
        });
    match spawned {
        Ok(_) => Some(tx),
        Err(e) => {
            tracing::warn!(error = %e, "could not start a sync thread; syncing in turn");
            None
        }
    }
}

fn fsync_dir(dir: &Path) -> Result<(), SpoolError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| SpoolError::io("syncing directory", dir, e))
}

const EVENTS_DIR: &str = "events";
const QUARANTINE_DIR: &str = "quarantine";
const MARKERS_DIR: &str = "markers";
const RECENT_BODIES: usize = 1024;
/// Quiet time after which freed heap memory is returned to the system.
const IDLE_TRIM_AFTER: Duration = Duration::from_secs(5);

/// Returns free heap pages to the system (glibc only; a no-op elsewhere).
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory malloc already considers free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Export event ids are hashed apart from pushed event ids (different id spaces).
pub const EXPORT_ID_SALT: u64 = 0x6578_706f_7274_0000;
/// Above this many files in one group, one `syncfs` replaces per-file `fdatasync`.
const SYNCFS_ABOVE: usize = 32;

impl Writer {
    fn start(
        cfg: SpoolConfig,
        stats: Arc<SpoolStats>,
        sealed: tokio_mpsc::UnboundedSender<SealedFile>,
        inbox: Inbox,
    ) -> Result<(Writer, RecoveryReport), SpoolError> {
        for sub in [EVENTS_DIR, QUARANTINE_DIR, MARKERS_DIR] {
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
        let (syncer, jobs) = mpsc::channel();
        let done = inbox.to_self.clone();
        let sync_pool = Arc::new(SyncPool::new());
        let pool = sync_pool.clone();
        std::thread::Builder::new()
            .name("spool-sync".into())
            .spawn(move || run_syncer(jobs, done, pool))
            .map_err(|e| SpoolError::io("starting the spool sync thread for", &cfg.dir, e))?;
        let mut w = Writer {
            dedup: DedupWindow::new(cfg.dedup_window),
            cfg,
            stats,
            sealed,
            open: HashMap::new(),
            open_fds: 0,
            clock: 0,
            last_n: 0,
            marked_sessions: HashSet::new(),
            synced_dirs: HashSet::new(),
            dirty_dirs: HashSet::new(),
            recent_bodies: VecDeque::new(),
            buffers: Vec::new(),
            inbox,
            deferred: VecDeque::new(),
            syncing: None,
            waiting: None,
            syncer,
            sync_pool,
            lock: Arc::new(lock),
        };
        let report = w.recover()?;
        Ok((w, report))
    }

    fn next_n(&mut self) -> u64 {
        self.last_n = unix_nanos().max(self.last_n + 1);
        self.last_n
    }

    /// Walks what an earlier run left: every file is sealed and queued; torn tails are cut.
    fn recover(&mut self) -> Result<RecoveryReport, SpoolError> {
        let mut report = RecoveryReport::default();
        let mut found: Vec<(SealedFile, Option<Partition>)> = Vec::new();
        for kind in [FileKind::Events, FileKind::Quarantine] {
            let base = self.cfg.dir.join(match kind {
                FileKind::Events => EVENTS_DIR,
                _ => QUARANTINE_DIR,
            });
            let mut files = Vec::new();
            walk_files(&base, &mut files).map_err(|e| SpoolError::io("listing", &base, e))?;
            for path in files {
                let rel = match path.strip_prefix(&base).ok().and_then(|p| p.to_str()) {
                    Some(r) => r.to_string(),
                    None => {
                        report.unknown.push(path);
                        continue;
                    }
                };
                let meta =
                    fs::symlink_metadata(&path).map_err(|e| SpoolError::io("reading", &path, e))?;
                if !meta.file_type().is_file() {
                    report.unknown.push(path);
                    continue;
                }
                let (partition, created, compressible) = match kind {
                    FileKind::Events => match Partition::parse_relative_key(&rel) {
                        Some((p, n)) => (Some(p), n, true),
                        None => {
                            report.unknown.push(path);
                            continue;
                        }
                    },
                    _ => match parse_quarantine_key(&rel) {
                        Some((n, compressible)) => (None, n, compressible),
                        None => {
                            report.unknown.push(path);
                            continue;
                        }
                    },
                };
                self.last_n = self.last_n.max(created);
                found.push((
                    SealedFile {
                        path,
                        kind,
                        relative_key: rel,
                        created_unix_nanos: created,
                        bytes: meta.len(),
                        compressible,
                    },
                    partition,
                ));
            }
        }
        // Cut torn tails first: the torn bytes go to quarantine before the segment shrinks.
        let mut torn = Vec::new();
        for (f, _) in found.iter_mut() {
            if f.kind != FileKind::Events && !f.relative_key.ends_with(".jsonl") {
                continue;
            }
            if let Some((keep, tail)) = torn_tail(&f.path)? {
                torn.push((f.path.clone(), keep, tail));
                f.bytes = keep;
            }
        }
        if !torn.is_empty() {
            let hour = Hour::from_unix_seconds((unix_nanos() / 1_000_000_000) as i64);
            let target = Target::Quarantine(hour);
            for (path, keep, tail) in &torn {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let line = quarantine_raw_line(QuarantineReason::TornLine, &name, *keep, tail);
                self.segment(&target)?.pending.extend_from_slice(&line);
                m::events_quarantined(QuarantineReason::TornLine, 1);
            }
            self.flush_group()?;
            for (path, keep, _) in &torn {
                let f = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|e| SpoolError::io("opening", path, e))?;
                f.set_len(*keep)
                    .and_then(|_| f.sync_all())
                    .map_err(|e| SpoolError::io("truncating torn line of", path, e))?;
                tracing::warn!(path = %path.display(), kept_bytes = keep, "cut an incomplete last line into quarantine");
            }
            report.torn = torn.len();
        }
        // Reload recent event ids, newest segments first, so a batch resent across our
        // restart is still recognised.
        found.sort_by_key(|f| std::cmp::Reverse(f.0.created_unix_nanos));
        let mut budget = self.cfg.dedup_window;
        for (f, p) in found.iter().filter(|(f, _)| f.kind == FileKind::Events) {
            if budget == 0 {
                break;
            }
            let salt = match p.as_ref().map(|p| &p.stream) {
                Some(crate::contract::Stream::Export(_)) => EXPORT_ID_SALT,
                _ => 0,
            };
            report.dedup_ids += self.load_ids(&f.path, salt, &mut budget);
        }
        found.sort_by_key(|f| f.0.created_unix_nanos);
        // Sessions seen in the spool still need their markers (head role).
        if self.cfg.write_session_markers {
            let sessions: HashSet<String> = found
                .iter()
                .filter_map(|(_, p)| p.as_ref().map(|p| p.session.clone()))
                .collect();
            for s in sessions {
                self.ensure_marker(&s)?;
            }
        }
        let marker_dir = self.cfg.dir.join(MARKERS_DIR);
        let entries =
            fs::read_dir(&marker_dir).map_err(|e| SpoolError::io("listing", &marker_dir, e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !is_safe_segment(&name) {
                report.unknown.push(entry.path());
                continue;
            }
            if self.marked_sessions.insert(name.clone()) {
                self.queue_marker(&name, entry.path());
            }
        }
        for (f, _) in found {
            report.files += 1;
            report.bytes += f.bytes;
            self.stats.bytes.fetch_add(f.bytes, Ordering::Relaxed);
            self.stats.add_file(f.created_unix_nanos);
            let _ = self.sealed.send(f);
        }
        Ok(report)
    }

    /// Streams one segment's lines (never the whole file in memory) into the window.
    fn load_ids(&mut self, path: &Path, salt: u64, budget: &mut usize) -> usize {
        use std::io::BufRead;
        let Ok(f) = File::open(path) else { return 0 };
        let mut reader = io::BufReader::with_capacity(256 * 1024, f);
        let mut line = Vec::new();
        let mut n = 0;
        while *budget > 0 {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if let Ok(ParsedEvent::Object(f)) = parse_event(&line) {
                if let Some(id) = f.event_id.as_str() {
                    self.dedup.insert(id_hash(id.as_bytes()) ^ salt);
                    *budget -= 1;
                    n += 1;
                }
            }
        }
        n
    }

    /// The next command: one deferred while waiting for a sync, or one from the channel.
    fn next_command(&mut self, wait: Duration) -> Result<Command, mpsc::RecvTimeoutError> {
        match self.deferred.pop_front() {
            Some(c) => Ok(c),
            None => self.inbox.rx.recv_timeout(wait),
        }
    }

    /// The next command if one is there now.
    fn try_next_command(&mut self) -> Option<Command> {
        self.deferred
            .pop_front()
            .or_else(|| self.inbox.rx.try_recv().ok())
    }

    fn run(&mut self) {
        let tick = Duration::from_millis(250);
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
                        // The pooled line buffers too (up to 4 MiB): a burst refills them.
                        self.buffers = Vec::new();
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
                            self.ensure_marker(&session)
                        } else {
                            Ok(())
                        };
                        let _ = reply.send(r);
                    }
                    Command::SealAll(reply) => {
                        self.seal_where(|_| true);
                        let _ = reply.send(());
                    }
                    Command::Stop => {
                        self.seal_where(|_| true);
                        return;
                    }
                    Command::Append(..) | Command::Synced(_) => {}
                }
            }
            // Size-based sealing once the data is durable.
            let max = self.cfg.max_segment_bytes;
            self.seal_where(|s| s.len >= max);
            if last_age_check.elapsed() >= Duration::from_millis(500) {
                last_age_check = Instant::now();
                let max_age = self.cfg.rotation_interval;
                self.seal_where(|s| s.opened_at.elapsed() >= max_age);
            }
        }
    }

    /// Stages and writes every request of the group; its sync and answers come later.
    ///
    /// The disk and the CPU overlap: this group is written (into the page cache) while the
    /// sync thread makes the previous one durable, and its sync starts as soon as that one
    /// ends. A group is answered only after its own sync.
    fn write_group(&mut self, group: Vec<(AppendBatch, AppendReply)>) {
        let started = Instant::now();
        let mut outcomes = Vec::with_capacity(group.len());
        let mut inserted: Vec<u64> = Vec::new();
        let mut new_sessions: Vec<String> = Vec::new();
        let mut failure: Option<SpoolError> = None;
        for (batch, _) in &group {
            match self.stage(batch, &mut inserted, &mut new_sessions) {
                Ok(o) => outcomes.push(o),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let written = match failure {
            None => self.write_pending(),
            Some(e) => Err(e),
        };
        let written = match written {
            Ok(w) => w,
            Err(err) => {
                // What came before is answered first; then only this group is cut off.
                self.drain();
                self.rollback_to_durable();
                for h in inserted {
                    self.dedup.forget(h);
                }
                let replies = group.into_iter().map(|(_, r)| r).collect();
                fail_all(replies, err);
                return;
            }
        };
        let flight = InFlight {
            written,
            replies: group.into_iter().map(|(_, r)| r).zip(outcomes).collect(),
            inserted,
            new_sessions,
            started,
        };
        match &mut self.waiting {
            Some(w) => {
                w.written.merge(flight.written);
                w.replies.extend(flight.replies);
                w.inserted.extend(flight.inserted);
                w.new_sessions.extend(flight.new_sessions);
            }
            None => self.waiting = Some(flight),
        }
    }

    /// Hands the waiting groups to the sync thread if it is free.
    fn start_sync(&mut self) {
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
    fn synced(&mut self, result: Result<(), SpoolError>) {
        let Some(flight) = self.syncing.take() else {
            return;
        };
        if let Err(err) = result {
            // Everything written since the last durable point goes: the failed group and
            // the ones written after it, which sit behind it in the same files.
            let mut replies: Vec<AppendReply> =
                flight.replies.into_iter().map(|(r, _)| r).collect();
            let mut inserted = flight.inserted;
            if let Some(w) = self.waiting.take() {
                replies.extend(w.replies.into_iter().map(|(r, _)| r));
                inserted.extend(w.inserted);
            }
            self.rollback_to_durable();
            for h in inserted {
                self.dedup.forget(h);
            }
            fail_all(replies, err);
            return;
        }
        // The next sync first, so the disk does not wait for the answers.
        self.start_sync();
        self.mark_durable(&flight.written);
        m::spool_commit(flight.written.bytes, flight.started.elapsed());
        for s in flight.new_sessions {
            if let Err(e) = self.ensure_marker(&s) {
                tracing::error!(session = %s, error = %e, "could not record the session marker on disk; uploading it from memory");
                self.queue_marker(&s, PathBuf::new());
            }
        }
        for (reply, outcome) in flight.replies {
            m::events_accepted(outcome.accepted, outcome.duplicates);
            let _ = reply.send(Ok(outcome));
        }
    }

    /// Waits until every written group is synced and answered; other commands that arrive
    /// meanwhile are kept, in order, for the main loop.
    fn drain(&mut self) {
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

    /// Copies one request's lines into the pending buffers of their segments.
    fn stage(
        &mut self,
        batch: &AppendBatch,
        inserted: &mut Vec<u64>,
        new_sessions: &mut Vec<String>,
    ) -> Result<AppendOutcome, SpoolError> {
        let mut out = AppendOutcome::default();
        let body = &batch.body[..];
        for pb in &batch.partitions {
            if self.cfg.write_session_markers
                && !self.marked_sessions.contains(&pb.partition.session)
                && !new_sessions.contains(&pb.partition.session)
            {
                new_sessions.push(pb.partition.session.clone());
            }
            // Dedup first so a partition whose events are all duplicates opens no file.
            let mut keep: Vec<&EventSpan> = Vec::with_capacity(pb.events.len());
            for ev in &pb.events {
                if let Some(h) = ev.id_hash {
                    if !self.dedup.insert(h) {
                        out.duplicates += 1;
                        continue;
                    }
                    inserted.push(h);
                }
                keep.push(ev);
            }
            if keep.is_empty() {
                continue;
            }
            // Sized once, in a buffer of an earlier group when there is one: growing a
            // fresh buffer by doubling copied each line about twice more.
            let bytes: usize = keep.iter().map(|ev| ev.end - ev.start + 1).sum();
            let mut spare = self.buffers.pop();
            let seg = self.segment(&Target::Events(pb.partition.clone()))?;
            if seg.pending.capacity() == 0 {
                if let Some(buf) = spare.take() {
                    seg.pending = buf;
                }
            }
            seg.pending.reserve(bytes);
            for ev in keep {
                push_line(&mut seg.pending, &body[ev.start..ev.end], ev.has_newline);
                out.accepted += 1;
            }
            if let Some(buf) = spare {
                self.buffers.push(buf);
            }
        }
        if !batch.quarantined.is_empty() {
            let hour = Hour::from_unix_seconds((unix_nanos() / 1_000_000_000) as i64);
            let target = Target::Quarantine(hour);
            for q in &batch.quarantined {
                let raw = &body[q.start..q.end];
                // The same bad event resent by Ray is kept once.
                let h = id_hash(raw) ^ 0x9e37_79b9_7f4a_7c15;
                if !self.dedup.insert(h) {
                    out.duplicates += 1;
                    continue;
                }
                inserted.push(h);
                let line = match &q.source {
                    Some((file, offset)) => quarantine_raw_line(q.reason, file, *offset, raw),
                    None => quarantine_event_line(q.reason, raw),
                };
                self.segment(&target)?.pending.extend_from_slice(&line);
                m::events_quarantined(q.reason, 1);
                out.quarantined += 1;
            }
        }
        Ok(out)
    }

    /// Returns the open segment of `target`, creating its file if needed.
    fn segment(&mut self, target: &Target) -> Result<&mut OpenSegment, SpoolError> {
        self.clock += 1;
        let clock = self.clock;
        if !self.open.contains_key(target) {
            let n = self.next_n();
            let (base, rel, kind) = match target {
                Target::Events(p) => (EVENTS_DIR, p.segment_relative_key(n), FileKind::Events),
                Target::Quarantine(h) => (
                    QUARANTINE_DIR,
                    format!(
                        "{}/quarantine-{}-{}.jsonl",
                        self.cfg.quarantine_node,
                        h.label(),
                        n
                    ),
                    FileKind::Quarantine,
                ),
            };
            let path = self.cfg.dir.join(base).join(&rel);
            self.make_room_for_fd();
            let created = self.create_file(&path)?;
            // At the limit with every fd busy in this group: reopen it when flushing.
            let file = if self.open_fds < self.cfg.max_open_files.max(1) {
                self.open_fds += 1;
                Some(Arc::new(created))
            } else {
                None
            };
            self.stats.add_file(n);
            self.open.insert(
                target.clone(),
                OpenSegment {
                    path,
                    relative_key: rel,
                    kind,
                    created_unix_nanos: n,
                    opened_at: Instant::now(),
                    len: 0,
                    written: 0,
                    file,
                    last_use: clock,
                    pending: Vec::new(),
                },
            );
        }
        let seg = self.open.get_mut(target).ok_or_else(|| {
            SpoolError::io(
                "finding open segment",
                Path::new(""),
                io::ErrorKind::NotFound.into(),
            )
        })?;
        seg.last_use = clock;
        Ok(seg)
    }

    /// Creates a new segment file and makes its directory entry durable.
    fn create_file(&mut self, path: &Path) -> Result<File, SpoolError> {
        let parent = path.parent().unwrap_or(Path::new("."));
        self.ensure_dir(parent)?;
        let f = OpenOptions::new()
            .create_new(true)
            .append(true)
            .mode(0o644)
            .open(path)
            .map_err(|e| SpoolError::io("creating segment", path, e))?;
        // The new entry is made durable with the group's data, before any answer.
        self.dirty_dirs.insert(parent.to_path_buf());
        Ok(f)
    }

    /// Creates `dir` and its missing parents, syncing each new entry once.
    fn ensure_dir(&mut self, dir: &Path) -> Result<(), SpoolError> {
        if self.synced_dirs.contains(dir) {
            return Ok(());
        }
        if !dir.exists() {
            if let Some(parent) = dir.parent() {
                if parent.starts_with(&self.cfg.dir) && parent != self.cfg.dir {
                    self.ensure_dir(parent)?;
                }
            }
            match fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(SpoolError::io("creating directory", dir, e)),
            }
            if let Some(parent) = dir.parent() {
                self.dirty_dirs.insert(parent.to_path_buf());
            }
        }
        self.synced_dirs.insert(dir.to_path_buf());
        Ok(())
    }

    /// Closes the least recently used idle fds when at the limit.
    fn make_room_for_fd(&mut self) {
        if self.open_fds < self.cfg.max_open_files.max(1) {
            return;
        }
        let mut idle: Vec<(u64, Target)> = self
            .open
            .iter()
            .filter(|(_, s)| s.file.is_some() && s.pending.is_empty())
            .map(|(t, s)| (s.last_use, t.clone()))
            .collect();
        idle.sort_by_key(|(u, _)| *u);
        // Close an eighth at a time so the scan is amortised.
        let n = (self.cfg.max_open_files / 8).max(1);
        for (_, t) in idle.into_iter().take(n) {
            if let Some(s) = self.open.get_mut(&t) {
                s.file = None;
                self.open_fds -= 1;
            }
        }
    }

    /// Writes every pending buffer and makes it durable now (recovery, quarantined bodies;
    /// nothing else may be in flight); on error the caller rolls back.
    fn flush_group(&mut self) -> Result<(), SpoolError> {
        let started = Instant::now();
        let mut written = self.write_pending()?;
        run_sync(self.sync_job(&mut written), &self.sync_pool)?;
        self.mark_durable(&written);
        m::spool_commit(written.bytes, started.elapsed());
        Ok(())
    }

    /// Writes every pending buffer to its segment (into the page cache, not yet durable)
    /// and returns what must be synced.
    ///
    /// A group touching more than [`SYNCFS_ABOVE`] files (thousands of jobs at once) is made
    /// durable with one `syncfs` instead of one sync per file. The buffers go back to the
    /// pool, and fds may be closed before the sync: the sync holds its own references.
    fn write_pending(&mut self) -> Result<Written, SpoolError> {
        let targets: Vec<Target> = self
            .open
            .iter()
            .filter(|(_, s)| !s.pending.is_empty())
            .map(|(t, _)| t.clone())
            .collect();
        let mut out = Written {
            whole_fs: targets.len() + self.dirty_dirs.len() > SYNCFS_ABOVE,
            ..Written::default()
        };
        for t in &targets {
            let need_fd = self.open.get(t).is_some_and(|s| s.file.is_none());
            if need_fd {
                self.make_room_for_fd();
                let Some(seg) = self.open.get_mut(t) else {
                    continue;
                };
                let f = OpenOptions::new()
                    .append(true)
                    .open(&seg.path)
                    .map_err(|e| SpoolError::io("reopening segment", &seg.path, e))?;
                seg.file = Some(Arc::new(f));
                self.open_fds += 1;
            }
            let Some(seg) = self.open.get_mut(t) else {
                continue;
            };
            let Some(file) = seg.file.as_ref() else {
                continue;
            };
            let n = seg.pending.len() as u64;
            // Counted first: if the write fails half way, rollback still truncates it.
            seg.written += n;
            (&**file)
                .write_all(&seg.pending)
                .map_err(|e| SpoolError::io("appending to segment", &seg.path, e))?;
            out.bytes += n;
            out.appended.push((t.clone(), n));
            if !out.whole_fs {
                out.files.push((file.clone(), seg.path.clone()));
            }
            recycle(&mut self.buffers, std::mem::take(&mut seg.pending));
        }
        if out.whole_fs {
            self.dirty_dirs.clear();
        } else {
            out.dirs = self.dirty_dirs.drain().collect();
        }
        Ok(out)
    }

    /// What syncing `written` takes; its files and directories move into the job (only
    /// what it appended is needed afterwards).
    fn sync_job(&self, written: &mut Written) -> SyncJob {
        SyncJob {
            files: std::mem::take(&mut written.files),
            dirs: std::mem::take(&mut written.dirs),
            whole_fs: written.whole_fs.then(|| self.lock.clone()),
        }
    }

    /// Records that what `written` appended is durable.
    fn mark_durable(&mut self, written: &Written) {
        for (t, n) in &written.appended {
            if let Some(seg) = self.open.get_mut(t) {
                seg.len += n;
            }
        }
        self.stats.bytes.fetch_add(written.bytes, Ordering::Relaxed);
    }

    /// Drops pending lines and truncates every segment back to its durable length.
    fn rollback_to_durable(&mut self) {
        let mut broken = Vec::new();
        for (t, seg) in self.open.iter_mut() {
            if seg.pending.is_empty() && seg.written == seg.len {
                continue;
            }
            recycle(&mut self.buffers, std::mem::take(&mut seg.pending));
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
                broken.push(t.clone());
            }
        }
        // A segment we could not truncate is sealed; the uploader cuts any torn tail.
        for t in broken {
            tracing::error!(target = ?t, "could not roll back a failed write; sealing the segment");
            self.seal(&t);
        }
    }

    fn seal_where(&mut self, pred: impl Fn(&OpenSegment) -> bool) {
        let due: Vec<Target> = self
            .open
            .iter()
            .filter(|(_, s)| pred(s))
            .map(|(t, _)| t.clone())
            .collect();
        for t in due {
            self.seal(&t);
        }
    }

    fn seal(&mut self, t: &Target) {
        if self.open.get(t).is_some_and(|s| s.written > s.len) {
            // Its last group is still being synced: wait for that answer first.
            self.drain();
        }
        let Some(seg) = self.open.remove(t) else {
            return;
        };
        if seg.file.is_some() {
            self.open_fds -= 1;
        }
        drop(seg.file);
        let f = SealedFile {
            path: seg.path,
            kind: seg.kind,
            relative_key: seg.relative_key,
            created_unix_nanos: seg.created_unix_nanos,
            bytes: seg.len,
            compressible: true,
        };
        if seg.len == 0 {
            // Every write of it was rolled back: nothing to upload.
            let _ = fs::remove_file(&f.path);
            self.stats.file_done(&f);
            return;
        }
        let _ = self.sealed.send(f);
    }

    /// Records (durably) that a session needs its marker, and queues the upload.
    fn ensure_marker(&mut self, session: &str) -> Result<(), SpoolError> {
        if !self.marked_sessions.insert(session.to_string()) {
            return Ok(());
        }
        let dir = self.cfg.dir.join(MARKERS_DIR);
        let path = dir.join(session);
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| SpoolError::io("creating marker", &path, e))?;
        fsync_dir(&dir)?;
        self.queue_marker(session, path);
        Ok(())
    }

    fn queue_marker(&mut self, session: &str, path: PathBuf) {
        let n = unix_nanos();
        self.stats.add_file(n);
        let _ = self.sealed.send(SealedFile {
            path,
            kind: FileKind::Marker,
            relative_key: session.to_string(),
            created_unix_nanos: n,
            bytes: 0,
            compressible: false,
        });
    }

    /// Keeps an unparseable body (once per distinct content) and a record saying why.
    fn store_body(&mut self, body: &[u8], detail: &str) -> Result<(), SpoolError> {
        let h = xxhash_rust::xxh3::xxh3_64(body);
        if self.recent_bodies.contains(&h) {
            return Ok(());
        }
        // Its record is synced here and now, which needs nothing else in flight.
        self.drain();
        let rel = format!("{}/bodies/body-{:016x}.bin", self.cfg.quarantine_node, h);
        let path = self.cfg.dir.join(QUARANTINE_DIR).join(&rel);
        if !path.exists() {
            let n = self.next_n();
            let mut f = self.create_file(&path)?;
            f.write_all(body)
                .and_then(|_| f.sync_data())
                .map_err(|e| SpoolError::io("writing quarantined body", &path, e))?;
            self.stats
                .bytes
                .fetch_add(body.len() as u64, Ordering::Relaxed);
            self.stats.add_file(n);
            let record = serde_json::json!({
                "reason": "invalid_body",
                "detail": detail,
                "received_at": format_rfc3339((n / 1_000_000_000) as i64),
                "body_object": format!("bodies/body-{h:016x}.bin"),
                "body_bytes": body.len(),
            });
            let hour = Hour::from_unix_seconds((n / 1_000_000_000) as i64);
            let mut line = serde_json::to_vec(&record).unwrap_or_default();
            line.push(b'\n');
            self.segment(&Target::Quarantine(hour))?
                .pending
                .extend_from_slice(&line);
            if let Err(e) = self.flush_group() {
                self.rollback_to_durable();
                return Err(e);
            }
            let _ = self.sealed.send(SealedFile {
                path,
                kind: FileKind::Quarantine,
                relative_key: rel,
                created_unix_nanos: n,
                bytes: body.len() as u64,
                compressible: false,
            });
        }
        if self.recent_bodies.len() == RECENT_BODIES {
            self.recent_bodies.pop_front();
        }
        self.recent_bodies.push_back(h);
        Ok(())
    }
}

/// Appends one event as a line; line breaks (only possible as whitespace) become spaces.
fn push_line(out: &mut Vec<u8>, raw: &[u8], has_newline: bool) {
    let start = out.len();
    out.extend_from_slice(raw);
    if has_newline {
        for c in &mut out[start..] {
            if *c == b'\n' || *c == b'\r' {
                *c = b' ';
            }
        }
    }
    out.push(b'\n');
}

/// A quarantine record for a JSON element: `{"reason":..,"detail":..,"received_at":..,"event":<raw>}`.
fn quarantine_event_line(reason: QuarantineReason, raw: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(raw.len() + 160);
    line.extend_from_slice(b"{\"reason\":\"");
    line.extend_from_slice(reason.code().as_bytes());
    line.extend_from_slice(b"\",\"detail\":\"");
    line.extend_from_slice(reason.describe().as_bytes());
    line.extend_from_slice(b"\",\"received_at\":\"");
    line.extend_from_slice(format_rfc3339((unix_nanos() / 1_000_000_000) as i64).as_bytes());
    line.extend_from_slice(b"\",\"event\":");
    push_line(
        &mut line,
        raw,
        raw.iter().any(|&c| c == b'\n' || c == b'\r'),
    );
    // push_line ended the event with '\n'; close the record before it.
    line.pop();
    line.extend_from_slice(b"}\n");
    line
}

/// A quarantine record for bytes that are not JSON: kept as a string, lossless for UTF-8.
fn quarantine_raw_line(reason: QuarantineReason, source: &str, offset: u64, raw: &[u8]) -> Vec<u8> {
    let record = serde_json::json!({
        "reason": reason.code(),
        "detail": reason.describe(),
        "received_at": format_rfc3339((unix_nanos() / 1_000_000_000) as i64),
        "source_file": source,
        "source_offset": offset,
        "raw": String::from_utf8_lossy(raw),
        "raw_is_utf8": std::str::from_utf8(raw).is_ok(),
    });
    let mut line = serde_json::to_vec(&record).unwrap_or_default();
    line.push(b'\n');
    line
}

/// If `path` does not end with a newline, returns (length to keep, the torn bytes).
fn torn_tail(path: &Path) -> Result<Option<(u64, Vec<u8>)>, SpoolError> {
    let mut f = File::open(path).map_err(|e| SpoolError::io("opening", path, e))?;
    let len = f
        .metadata()
        .map_err(|e| SpoolError::io("reading", path, e))?
        .len();
    if len == 0 {
        return Ok(None);
    }
    let mut last = [0u8; 1];
    f.seek(SeekFrom::Start(len - 1))
        .and_then(|_| f.read_exact(&mut last))
        .map_err(|e| SpoolError::io("reading", path, e))?;
    if last[0] == b'\n' {
        return Ok(None);
    }
    // Scan back in chunks for the last newline.
    let mut end = len;
    let chunk = 64 * 1024u64;
    loop {
        let start = end.saturating_sub(chunk);
        let mut buf = vec![0u8; (end - start) as usize];
        f.seek(SeekFrom::Start(start))
            .and_then(|_| f.read_exact(&mut buf))
            .map_err(|e| SpoolError::io("reading", path, e))?;
        if let Some(i) = buf.iter().rposition(|&c| c == b'\n') {
            let keep = start + i as u64 + 1;
            let mut tail = vec![0u8; (len - keep) as usize];
            f.seek(SeekFrom::Start(keep))
                .and_then(|_| f.read_exact(&mut tail))
                .map_err(|e| SpoolError::io("reading", path, e))?;
            return Ok(Some((keep, tail)));
        }
        if start == 0 {
            let mut tail = vec![0u8; len as usize];
            f.seek(SeekFrom::Start(0))
                .and_then(|_| f.read_exact(&mut tail))
                .map_err(|e| SpoolError::io("reading", path, e))?;
            return Ok(Some((0, tail)));
        }
        end = start;
    }
}

/// Parses a quarantine file's relative key: `<node>/quarantine-<hour>-<n>.jsonl` or
/// `<node>/bodies/body-<hash>.bin`; returns (creation ns or 0, compressible).
fn parse_quarantine_key(rel: &str) -> Option<(u64, bool)> {
    let parts: Vec<&str> = rel.split('/').collect();
    match parts.as_slice() {
        [node, file] if is_safe_segment(node) => {
            let stem = file.strip_prefix("quarantine-")?.strip_suffix(".jsonl")?;
            let (hour, n) = stem.rsplit_once('-')?;
            Hour::parse_label(hour)?;
            Some((n.parse().ok()?, true))
        }
        [node, "bodies", file] if is_safe_segment(node) && is_safe_segment(file) => {
            let hex = file.strip_prefix("body-")?.strip_suffix(".bin")?;
            u64::from_str_radix(hex, 16).ok()?;
            Some((0, false))
        }
        _ => None,
    }
}

/// Lists regular files below `dir`, without following symlinks.
fn walk_files(dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let ft = entry.file_type()?;
        if ft.is_dir() {
            walk_files(&entry.path(), out)?;
        } else {
            out.push(entry.path());
        }
    }
    Ok(())
}

/// Lists every file left in the spool, for the shutdown report.
pub fn leftover_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut files = Vec::new();
    for sub in [EVENTS_DIR, QUARANTINE_DIR, MARKERS_DIR] {
        let _ = walk_files(&dir.join(sub), &mut files);
    }
    files
        .into_iter()
        .map(|p| {
            let len = fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            (p, len)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Stream;

    /// Spool directories whose next sync fails, after a delay.
    static FAIL_NEXT_SYNC: Mutex<Vec<(PathBuf, Duration)>> = Mutex::new(Vec::new());

    pub(super) fn injected_sync_failure(job: &SyncJob) -> Result<(), SpoolError> {
        let mut armed = FAIL_NEXT_SYNC.lock().unwrap();
        let hit = armed.iter().position(|(dir, _)| {
            job.files.iter().any(|(_, p)| p.starts_with(dir))
                || job.dirs.iter().any(|p| p.starts_with(dir))
        });
        let Some(i) = hit else { return Ok(()) };
        let (_, delay) = armed.remove(i);
        drop(armed);
        std::thread::sleep(delay);
        Err(SpoolError::io(
            "syncing segment",
            Path::new("(test)"),
            io::Error::other("injected failure"),
        ))
    }

    fn batch(ids: &[&str]) -> AppendBatch {
        let mut body = Vec::new();
        let mut events = Vec::new();
        for id in ids {
            let start = body.len();
            body.extend_from_slice(format!(r#"{{"eventId":"{id}"}}"#).as_bytes());
            events.push(EventSpan {
                start,
                end: body.len(),
                id_hash: Some(id_hash(id.as_bytes())),
                has_newline: false,
            });
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

    #[test]
    fn quarantine_lines_are_json() {
        let l = quarantine_event_line(QuarantineReason::MissingSession, b"{\"a\":\n1}");
        let v: serde_json::Value = serde_json::from_slice(&l).unwrap();
        assert_eq!(v["reason"], "missing_session_name");
        assert_eq!(v["event"]["a"], 1);
        assert_eq!(l.iter().filter(|&&c| c == b'\n').count(), 1);
        let r = quarantine_raw_line(QuarantineReason::TornLine, "y.jsonl", 10, b"{\"a\":\xff");
        let v: serde_json::Value = serde_json::from_slice(&r).unwrap();
        assert_eq!(v["source_file"], "y.jsonl");
        assert_eq!(v["raw_is_utf8"], false);
    }

    #[test]
    fn quarantine_keys() {
        assert_eq!(
            parse_quarantine_key("n/quarantine-2026-11-22-02-5.jsonl"),
            Some((5, true))
        );
        assert_eq!(
            parse_quarantine_key("n/bodies/body-00ff.bin"),
            Some((0, false))
        );
        assert_eq!(
            parse_quarantine_key("../quarantine-2026-11-22-02-5.jsonl"),
            None
        );
        assert_eq!(parse_quarantine_key("n/other"), None);
    }

    #[test]
    fn torn_tail_found() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        fs::write(&p, b"{\"a\":1}\n{\"b\":").unwrap();
        assert_eq!(torn_tail(&p).unwrap(), Some((8, b"{\"b\":".to_vec())));
        fs::write(&p, b"{\"a\":1}\n").unwrap();
        assert_eq!(torn_tail(&p).unwrap(), None);
        fs::write(&p, b"partial").unwrap();
        assert_eq!(torn_tail(&p).unwrap(), Some((0, b"partial".to_vec())));
    }

    #[test]
    fn sync_pool_syncs_every_target_reuses_its_threads_and_reports_the_first_error() {
        let dir = tempfile::tempdir().unwrap();
        let targets = || -> Vec<SyncTarget> {
            let mut t: Vec<SyncTarget> = (0..6)
                .map(|i| {
                    let path = dir.path().join(format!("f{i}"));
                    let mut f = File::create(&path).unwrap();
                    f.write_all(b"{}\n").unwrap();
                    SyncTarget::File(Arc::new(f), path)
                })
                .collect();
            t.push(SyncTarget::Dir(dir.path().to_path_buf()));
            t
        };
        let pool = SyncPool::new();
        for _ in 0..3 {
            pool.sync_all(targets()).unwrap();
        }
        // The caller syncs one target itself; the other six each had a thread, kept.
        assert_eq!(pool.workers.lock().unwrap().len(), 6);
        let mut failing = targets();
        failing.insert(3, SyncTarget::Dir(dir.path().join("missing")));
        let err = pool.sync_all(failing).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        assert_eq!(pool.workers.lock().unwrap().len(), 7);
        // Still usable after an error.
        pool.sync_all(targets()).unwrap();
        pool.sync_all(Vec::new()).unwrap();
    }
}
