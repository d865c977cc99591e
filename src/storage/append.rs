//! Appending the new bytes of a growing log to its object, where the store can do that, so a
//! live log costs what Ray wrote and not its whole size every round.
//!
//! Before anything is appended, the object must still be the one we wrote: its ETag (and
//! size) as the ledger recorded them; otherwise the caller uploads the file whole. What is
//! appended is the file's bytes `[from, to)`, read as they are now; the caller has checked
//! the file only grew (same inode, same bytes before `from`).
//!
//! - `file://`: the object is a file under the bucket directory; the bytes are appended to
//!   it in place. If that fails halfway the object is longer than the ledger says, which the
//!   next round sees (its ETag changed) and repairs with a whole upload.
//!   Event objects are never appended to in place ([`Appender::replace_local`]): each of
//!   their versions is written whole beside the object under a temporary name and renamed
//!   over it, since a reader must never see a part of a gzip member and a node killed
//!   mid-append cannot repair it. [`Appender::prepare`] removes this node's temporaries an
//!   earlier run left.
//! - S3 and S3-compatible stores: a multipart upload to the same key whose first parts are
//!   server-side copies of the current object (`UploadPartCopy`, conditional on its ETag, in
//!   ranges of at most [`S3_MAX_COPY_PART`], since S3 copies at most 5 GiB per part) and whose
//!   next parts are the new bytes; only those cross the network. Nothing else is written:
//!   the parts are invisible until the upload completes, when the object is replaced at
//!   once, so a reader (the history server) sees the old or the new object, never a tail. A
//!   copied part must be at least 5 MiB (S3's minimum for every part but the last), so
//!   smaller objects are uploaded whole. The upload, the new parts, the completion and the
//!   abort are `object_store`'s `MultipartStore` calls, so they carry every setting a whole
//!   upload carries; the copies are [`S3Wire`]'s, made from the same configuration (see
//!   `storage::s3`).
//!
//!   No upload is left behind: one that fails is aborted at once; one whose append is
//!   dropped (a deadline, shutdown) is aborted in the background and, failing that, by
//!   [`Appender::abort_pending`] at the end of the final flush; [`Appender::prepare`] lists
//!   and aborts those an earlier run left (killed mid-append). A failed abort is a warning.
//!   It also reads the bucket's versioning: in a bucket with versioning `Enabled` each
//!   append keeps the whole previous object as a noncurrent version, so the caller turns
//!   appends off there (with `Suspended`, a write replaces the `null` version: no cost).
//!   At the end of the final flush [`Appender::abort_node_log_uploads`] aborts what is left
//!   under the node's `logs/` (never under [`UNKNOWN_NODE`], shared by other nodes).
//!
//!   Failures say what they mean ([`AppendError`]), for every request of the append (the
//!   HEAD, the creation, the copies, the parts, the completion; see
//!   `s3::classify_store_error`): the object changed (upload whole), the store refused
//!   (a 501, another 4xx than 401, 408 and 429, an error document in a 200: upload whole;
//!   counts toward turning appends off; a conditional completion answered 501, 400 or 403
//!   is first sent again without its condition, `storage::versioned`), or a transient
//!   failure after retries (try again next round; never turns appends off; see
//!   `logs::gate` for the bound on how long).
//!   S3 Express directory buckets are addressed like object_store does, but appends have
//!   not been run against one.
//! - GCS and Azure: no appends (uploaded whole on the schedule). GCS's compose needs the tail
//!   as an object of its own first, and Azure's block lists need block blobs written by
//!   block id, which object_store's uploads do not leave.

use std::collections::HashMap;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::local::LocalFileSystem;
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::put::{parse_key, part_size_for, MAX_PARTS};
use super::s3::{
    classify_store_error, may_refuse_conditions, CapturingConnector, Failure, Precondition, S3Wire,
};
use crate::util::fs::Beneath;
use crate::util::pace::Flow;
use object_store::multipart::PartId;

/// Why an append did not happen.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The object is not what the ledger says (missing, changed by someone else, or left
    /// longer by an append that failed halfway): upload the file whole.
    #[error("{key}: {why}")]
    Changed {
        /// The key.
        key: String,
        /// What differed.
        why: String,
    },
    /// Reading the local file failed.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The store refused to copy the object (it cannot do `UploadPartCopy`, or will not for
    /// this object): upload the file whole; counts toward switching appends off.
    #[error("appending to {key} refused: {message}")]
    Refused {
        /// The key.
        key: String,
        /// The store does not do the request at all (501, `NotImplemented`), rather than
        /// refusing it for this object.
        unsupported: bool,
        /// The answer.
        message: String,
    },
    /// The store failed in a way that may pass (5xx, throttling, a timeout, credentials),
    /// after retries: try again next round; never a reason to switch appends off.
    #[error("appending to {key}: {message}")]
    Unavailable {
        /// The key.
        key: String,
        /// Why.
        message: String,
    },
}

/// What an append did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// Bytes of the file appended (read and sent).
    pub bytes: u64,
    /// The object's ETag after it.
    pub e_tag: Option<String>,
    /// xxh3 of the bytes appended, as they were read and sent (`None` for an event
    /// object's version written whole): with a hash of the object's bytes before them, the
    /// caller can check that the file still holds exactly what the object now holds.
    pub tail: Option<u64>,
}

/// Where an appender reports each incomplete multipart upload it aborts (`true`) or could
/// not abort (`false`): the caller's metrics (`app` wires `metrics::append_upload_aborted`).
/// Storage records no metric itself, so the metrics room and this one never import each
/// other; until a report is set, aborts are only logged.
pub type AbortReport = fn(bool);

/// A store that can append to an object.
#[derive(Debug, Clone)]
pub enum Appender {
    /// A local bucket directory.
    Local(Arc<LocalFileSystem>),
    /// S3 or an S3-compatible server.
    S3(Arc<S3Appender>),
}

impl Appender {
    /// The same appender, S3 copies left unanswered for `timeout` failing without retry:
    /// for the log lane only, whose appends fall back on the whole upload (the event
    /// publisher keeps object_store's own request timeout, see `s3`).
    pub fn with_answer_timeout(self, timeout: Duration) -> Appender {
        match self {
            Appender::Local(fs) => Appender::Local(fs),
            Appender::S3(s3) => Appender::S3(Arc::new(s3.with_answer_timeout(timeout))),
        }
    }

    /// The same appender, its uploads (creation, new bytes, completion) made with `s3`
    /// (the log lane's client, whose request timeout lets a big part go over a slow
    /// uplink: `storage::for_log_bodies`); the copies keep their wire.
    pub fn with_uploads_on(self, s3: Arc<AmazonS3>) -> Appender {
        match self {
            Appender::Local(fs) => Appender::Local(fs),
            Appender::S3(a) => Appender::S3(Arc::new(S3Appender {
                s3,
                wire: a.wire.clone(),
                max_copy_part: a.max_copy_part,
                pending: a.pending.clone(),
                report: a.report.clone(),
            })),
        }
    }
}

/// S3's smallest part but the last: an object must have this much to be copied as a part.
pub const S3_MIN_PART: u64 = 5 << 20;

/// The new bytes go up in parts of this size (one in memory at a time).
pub const TAIL_PART: usize = 8 << 20;

impl Appender {
    /// Reports every incomplete upload this appender aborts to `report`. The first report
    /// set stays (the appender of a store is shared: see `Configured::appender`); a local
    /// directory has no uploads to abort.
    pub fn report_aborts_to(&self, report: AbortReport) {
        if let Appender::S3(s3) = self {
            // Already set: the same process wired it once before, and that one stays.
            let _ = s3.report.set(report);
        }
    }

    /// An appender for the local bucket directory `dir`.
    pub fn local(dir: &Path) -> Result<Appender, object_store::Error> {
        Ok(Appender::Local(Arc::new(LocalFileSystem::new_with_prefix(
            dir,
        )?)))
    }

    /// The smallest object this store can append to (below it, upload whole).
    pub fn min_object_bytes(&self) -> u64 {
        match self {
            Appender::Local(_) => 0,
            Appender::S3(_) => S3_MIN_PART,
        }
    }

    /// At start, once the node is known (`history_prefix` is `P`, `node` the node id): what
    /// the bucket's versioning makes appends cost, and the cleanup of the incomplete uploads
    /// an earlier run left under this node (S3; nothing to do elsewhere).
    pub async fn prepare(&self, history_prefix: &str, node: &str) -> Prepared {
        match self {
            Appender::Local(fs) => {
                let root = fs
                    .path_to_filesystem(&ObjectPath::from(history_prefix))
                    .ok();
                let n = node.to_string();
                let removed = match root {
                    Some(root) => tokio::task::spawn_blocking(move || {
                        remove_temporaries(&root, &n, local_temp_tag())
                    })
                    .await
                    .unwrap_or(0),
                    None => 0,
                };
                if removed > 0 {
                    tracing::info!(
                        removed,
                        node,
                        "removed temporaries of event objects an earlier run left (killed while writing a version)"
                    );
                }
                Prepared {
                    temporaries_removed: removed,
                    ..Prepared::default()
                }
            }
            Appender::S3(s3) => s3.prepare(history_prefix, node).await,
        }
    }

    /// `file://`: writes the first `len` bytes of `source` as the new version of the object
    /// `key`, atomically (see [`write_version`]); `None` on other stores.
    pub async fn replace_local(
        &self,
        key: &str,
        source: &Beneath,
        len: u64,
    ) -> Option<Result<Appended, AppendError>> {
        let Appender::Local(fs) = self else {
            return None;
        };
        Some(replace_local(fs, key, source, len).await)
    }

    /// At the end of the final flush, when the log lane is done: aborts every incomplete
    /// log upload under `node` (none under [`UNKNOWN_NODE`], which other nodes share), so an
    /// upload whose creation was still in flight when it was cancelled does not stay; the
    /// number aborted and failed.
    pub async fn abort_node_log_uploads(&self, history_prefix: &str, node: &str) -> (usize, usize) {
        match self {
            Appender::S3(s3) if node != UNKNOWN_NODE => {
                s3.abort_ours(history_prefix, node, false).await
            }
            _ => (0, 0),
        }
    }

    /// Aborts the uploads of appends that were cancelled (shutdown), until `deadline`; the
    /// number left.
    pub async fn abort_pending(&self, deadline: Instant) -> usize {
        match self {
            Appender::Local(_) => 0,
            Appender::S3(s3) => s3.abort_pending(deadline).await,
        }
    }

    /// Appends the bytes `[from, to)` of `file` (the regular file a scan saw, reopened
    /// without following a symlink) to the object `key`, which must have `from` bytes and
    /// the ETag `e_tag`.
    pub async fn append(
        &self,
        key: &str,
        file: &Beneath,
        from: u64,
        to: u64,
        e_tag: Option<&str>,
        pace: Flow<'_>,
    ) -> Result<Appended, AppendError> {
        match self {
            Appender::Local(fs) => append_local(fs, key, file, from, to, e_tag, pace).await,
            Appender::S3(s3) => s3.append(key, file, from, to, e_tag, pace).await,
        }
    }
}

async fn append_local(
    fs: &Arc<LocalFileSystem>,
    key: &str,
    file: &Beneath,
    from: u64,
    to: u64,
    e_tag: Option<&str>,
    pace: Flow<'_>,
) -> Result<Appended, AppendError> {
    let location = parse_key(key).map_err(|e| unavailable(key, &e))?;
    check_object(fs.as_ref(), key, &location, from, e_tag).await?;
    let target = fs
        .path_to_filesystem(&location)
        .map_err(|e| unavailable(key, &e))?;
    pace.take(to - from).await;
    let source = file.clone();
    let key_owned = key.to_string();
    let (written, tail) =
        tokio::task::spawn_blocking(move || copy_range(&source, &target, from, to, &key_owned))
            .await
            .map_err(|e| unavailable(key, &e))??;
    let after = fs.head(&location).await.map_err(|e| unavailable(key, &e))?;
    Ok(Appended {
        bytes: written,
        e_tag: after.e_tag,
        tail: Some(tail),
    })
}

async fn replace_local(
    fs: &Arc<LocalFileSystem>,
    key: &str,
    source: &Beneath,
    len: u64,
) -> Result<Appended, AppendError> {
    let location = parse_key(key).map_err(|e| unavailable(key, &e))?;
    let target = fs
        .path_to_filesystem(&location)
        .map_err(|e| unavailable(key, &e))?;
    let (source, key_owned) = (source.clone(), key.to_string());
    tokio::task::spawn_blocking(move || {
        write_version(&source, &target, len, local_temp_tag(), &key_owned)
    })
    .await
    .map_err(|e| unavailable(key, &e))??;
    let after = fs.head(&location).await.map_err(|e| unavailable(key, &e))?;
    Ok(Appended {
        bytes: len,
        e_tag: after.e_tag,
        tail: None,
    })
}

/// The end of the name of a temporary a new version of an event object is written to on
/// `file://`: `.<object name>.<node tag>.rhc-tmp`, beside the object. The history server
/// (which wants `-YYYY-MM-DD-HH[-<n>][.jsonl][.gz]` at the end) and `inspect` never take it
/// for an object.
pub const LOCAL_TEMP_SUFFIX: &str = ".rhc-tmp";

/// This node's tag in the names of its temporaries: the host name (the pod's name on
/// Kubernetes, kept across restarts of the container), reduced to `[A-Za-z0-9-]`.
pub fn local_temp_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is valid for its length; gethostname writes at most that.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let tag: String = if rc == 0 { &buf[..end] } else { &[][..] }
            .iter()
            .map(|&b| b as char)
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(64)
            .collect();
        if tag.is_empty() {
            "node".to_string()
        } else {
            tag
        }
    })
}

/// The temporary beside `target` that its next version is written to.
fn temp_path(target: &Path, tag: &str) -> Option<PathBuf> {
    let name = target.file_name()?.to_str()?;
    Some(target.with_file_name(format!(".{name}.{tag}{LOCAL_TEMP_SUFFIX}")))
}

/// Writes the first `len` bytes of `source` beside `target` under a temporary name, fsyncs
/// it and renames it over `target` (the directory is fsync'd at the seal only, see
/// [`sync_local_object_dir`]): a reader opens the previous
/// version or this one, never a part of one, and a kill at any point leaves the previous
/// version whole (and at most this temporary, which [`Appender::prepare`] removes at the
/// next start). The copy is the kernel's (`copy_file_range` on Linux).
fn write_version(
    source: &Beneath,
    target: &Path,
    len: u64,
    tag: &str,
    key: &str,
) -> Result<(), AppendError> {
    let path = source.path();
    let store_err = |e: io::Error| unavailable(key, &e);
    let dir = target
        .parent()
        .ok_or_else(|| unavailable(key, &"no parent directory"))?;
    std::fs::create_dir_all(dir).map_err(store_err)?;
    let tmp = temp_path(target, tag).ok_or_else(|| unavailable(key, &"not a plain file name"))?;
    let result = (|| {
        let src = source.open().map_err(|e| read_err(&path, e))?;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(store_err)?;
        let copied = io::copy(&mut src.take(len), &mut out).map_err(|e| read_err(&path, e))?;
        if copied != len {
            return Err(read_err(
                &path,
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{copied} bytes where {len} were expected"),
                ),
            ));
        }
        out.sync_all().map_err(store_err)?;
        std::fs::rename(&tmp, target).map_err(store_err)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `file://`: makes the last rename of the object `key` durable (its directory fsync'd):
/// called once a segment's last version is written, before the segment is deleted. Every
/// version is fsync'd before its rename, so after a power loss the object is one whole
/// version; without this the last rename could be lost with the segment already gone. Not
/// done for each round's version: at 50,000 partitions a second fsync per publication
/// halved the rounds' pace and made the drain at SIGTERM miss its deadline.
pub async fn sync_local_object_dir(app: &Appender, key: &str) {
    let Appender::Local(fs) = app else { return };
    let Ok(location) = parse_key(key) else { return };
    let Ok(target) = fs.path_to_filesystem(&location) else {
        return;
    };
    let Some(dir) = target.parent().map(Path::to_path_buf) else {
        return;
    };
    let synced =
        tokio::task::spawn_blocking(move || std::fs::File::open(&dir).and_then(|d| d.sync_all()))
            .await;
    if let Ok(Err(e)) = synced {
        tracing::warn!(%key, error = %e, "could not fsync the object's directory");
    }
}

/// `file://`: removes the temporary this node may have left beside the object `key` (a run
/// killed while writing one of its versions). Called at the seal, under the segment's lock,
/// so no version of `key` is being written: the restart that finishes a segment whose first
/// version was cut short uploads it whole by another path, and without this the temporary
/// would stay beside the object.
pub async fn remove_local_temp(app: &Appender, key: &str) {
    let Appender::Local(fs) = app else { return };
    let Ok(location) = parse_key(key) else { return };
    let Ok(target) = fs.path_to_filesystem(&location) else {
        return;
    };
    let Some(tmp) = temp_path(&target, local_temp_tag()) else {
        return;
    };
    let removed = tokio::task::spawn_blocking(move || std::fs::remove_file(&tmp)).await;
    match removed {
        Ok(Ok(())) => {
            tracing::info!(%key, "removed a temporary an earlier run left beside the object")
        }
        Ok(Err(e)) if e.kind() == io::ErrorKind::NotFound => {}
        Ok(Err(e)) => {
            tracing::warn!(%key, error = %e, "could not remove the temporary beside the object")
        }
        Err(_) => {}
    }
}

/// Removes this node's temporaries (tag `tag`) below `<history root>/<any session>/<node>/`:
/// what a run killed while writing a version left. The number removed.
fn remove_temporaries(history_root: &Path, node: &str, tag: &str) -> usize {
    let end = format!(".{tag}{LOCAL_TEMP_SUFFIX}");
    let mut removed = 0;
    let Ok(sessions) = std::fs::read_dir(history_root) else {
        return 0;
    };
    for s in sessions.flatten() {
        let mut stack = vec![s.path().join(node)];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let Ok(ft) = e.file_type() else { continue };
                let name = e.file_name();
                let name = name.to_string_lossy();
                if ft.is_dir() {
                    stack.push(e.path());
                } else if ft.is_file() && name.starts_with('.') && name.ends_with(&end) {
                    match std::fs::remove_file(e.path()) {
                        Ok(()) => removed += 1,
                        Err(err) => {
                            tracing::warn!(path = %e.path().display(), error = %err, "could not remove a temporary an earlier run left")
                        }
                    }
                }
            }
        }
    }
    removed
}

/// The object must exist with `size` bytes and, when known, the ETag `e_tag`.
async fn check_object(
    store: &dyn ObjectStore,
    key: &str,
    location: &object_store::path::Path,
    size: u64,
    e_tag: Option<&str>,
) -> Result<(), AppendError> {
    let changed = |why: String| AppendError::Changed {
        key: key.to_string(),
        why,
    };
    let meta = match store.head(location).await {
        Ok(m) => m,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(changed("the object is gone".into()))
        }
        Err(e) => return Err(store_failure(key, "HEAD", &e)),
    };
    if meta.size != size {
        return Err(changed(format!(
            "the object has {} bytes, the ledger says {size}",
            meta.size
        )));
    }
    if let Some(want) = e_tag {
        if meta.e_tag.as_deref() != Some(want) {
            return Err(changed(format!(
                "the object's ETag is {:?}, the ledger says {want:?}",
                meta.e_tag
            )));
        }
    }
    Ok(())
}

/// Appends `source[from..to)` to `target`, which must have exactly `from` bytes.
fn copy_range(
    source: &Beneath,
    target: &Path,
    from: u64,
    to: u64,
    key: &str,
) -> Result<(u64, u64), AppendError> {
    let path = source.path();
    let read_err = |e| read_err(&path, e);
    let store_err = |e: io::Error| unavailable(key, &e);
    let mut src = source.open().map_err(read_err)?;
    src.seek(SeekFrom::Start(from)).map_err(read_err)?;
    let mut out = std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(target)
        .map_err(store_err)?;
    if out.metadata().map_err(store_err)?.len() != from {
        return Err(AppendError::Changed {
            key: key.to_string(),
            why: "the object changed size during the append".into(),
        });
    }
    let mut src = src.take(to - from);
    let mut buf = vec![0u8; 256 * 1024];
    let mut written = 0u64;
    let mut tail = xxhash_rust::xxh3::Xxh3Default::new();
    let result = loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) => break Err(read_err(e)),
        };
        if let Err(e) = out.write_all(&buf[..n]) {
            break Err(store_err(e));
        }
        tail.update(&buf[..n]);
        written += n as u64;
    };
    let result = result.and_then(|()| {
        if written != to - from {
            return Err(read_err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the file shrank to {} bytes during the append",
                    from + written
                ),
            )));
        }
        Ok((written, tail.digest()))
    });
    if result.is_err() && written > 0 {
        // Cut back: the object stays the previous version, whole (an event object's
        // readers must never see half a member).
        let _ = out.set_len(from);
    }
    result
}

/// An incomplete upload the collector started and has not finished: aborted when the
/// append that owns it fails, is cancelled (dropped), or at the end of the final flush.
type PendingUploads = Arc<Mutex<HashMap<String, ObjectPath>>>;

/// Appends to S3 objects: `object_store`'s multipart calls for the upload and the new bytes,
/// [`S3Wire`] for the server-side copies (see the module doc).
#[derive(Debug)]
pub struct S3Appender {
    s3: Arc<AmazonS3>,
    wire: S3Wire,
    /// The largest range copied as one part (S3: 5 GiB).
    max_copy_part: u64,
    /// Upload id → key of the uploads in flight.
    pending: PendingUploads,
    /// Where aborts are reported ([`Appender::report_aborts_to`]); shared with the
    /// background aborts of cancelled appends.
    report: Arc<OnceLock<AbortReport>>,
}

/// S3's largest copy source for one `UploadPartCopy`: bigger objects are copied in ranges.
pub const S3_MAX_COPY_PART: u64 = 5 << 30;

/// An upload a dropped (cancelled) append leaves behind is aborted in the background; what
/// that misses, [`S3Appender::abort_pending`] aborts at the end of the final flush.
struct PendingGuard<'a> {
    app: &'a S3Appender,
    id: String,
    location: ObjectPath,
    open: bool,
}

impl PendingGuard<'_> {
    /// The upload completed or was aborted: nothing to do any more.
    fn close(mut self) {
        self.open = false;
        lock(&self.app.pending).remove(&self.id);
    }
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        // Cancelled mid-append (a deadline, shutdown): abort now, off this task.
        let (s3, pending) = (self.app.s3.clone(), self.app.pending.clone());
        let (id, location) = (self.id.clone(), self.location.clone());
        let report = self.app.report.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if abort_upload(&s3, &location, &id, &report).await {
                    lock(&pending).remove(&id);
                }
            });
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Aborts one upload; false (and a warning) when that failed. An upload already gone
/// (aborted by another path) counts as aborted. Either way it is told to `report`, once set.
async fn abort_upload(
    s3: &AmazonS3,
    location: &ObjectPath,
    id: &str,
    report: &OnceLock<AbortReport>,
) -> bool {
    let tell = |ok: bool| {
        if let Some(report) = report.get() {
            report(ok);
        }
    };
    match s3.abort_multipart(location, &id.to_string()).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {
            tell(true);
            true
        }
        Err(e) => {
            tell(false);
            tracing::warn!(key = %location, upload_id = %id, error = %e,
                "could not abort an incomplete multipart upload: it keeps a copy of the object \
                 until the next start's cleanup or the bucket's lifecycle rule removes it");
            false
        }
    }
}

/// What [`Appender::prepare`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prepared {
    /// The bucket's versioning status (`Enabled`, `Suspended`), when ever set. `Enabled`
    /// keeps every replaced object (appends are not worth it there); `Suspended` replaces
    /// the `null` version instead, so appends cost nothing extra.
    pub versioned: Option<String>,
    /// Incomplete uploads of ours aborted.
    pub aborted: usize,
    /// Incomplete uploads of ours that could not be aborted.
    pub abort_failed: usize,
    /// `file://`: temporaries of ours an earlier run left (killed while writing a version).
    pub temporaries_removed: usize,
}

/// An incomplete upload of an event object older than this is an orphan (an event object
/// is at most a segment, uploaded in seconds); log uploads under our node are all orphans
/// at start, since the log lane is the only writer there and has not begun (not under
/// [`UNKNOWN_NODE`], which other nodes share).
pub const STALE_UPLOAD_AGE: Duration = Duration::from_secs(3600);

/// The node directory logs go under at the final flush when no node id is known: shared by
/// every node in that state, so nobody owns the uploads under it.
pub const UNKNOWN_NODE: &str = "unknown-node";

impl S3Appender {
    /// The appender for the store `builder` built as `s3`, `connector` being the builder's
    /// HTTP connector; `max_copy_part` the largest range copied as one part (a test lowers
    /// it; at least twice S3's minimum part, so that ranges can be equal and all allowed).
    pub fn new(
        builder: &AmazonS3Builder,
        connector: &CapturingConnector,
        s3: Arc<AmazonS3>,
        max_copy_part: u64,
    ) -> Result<S3Appender, String> {
        let wire = S3Wire::new(builder, connector, s3.credentials().clone())?;
        Ok(S3Appender {
            s3,
            wire,
            max_copy_part: max_copy_part.clamp(2 * S3_MIN_PART, S3_MAX_COPY_PART),
            pending: Arc::default(),
            report: Arc::default(),
        })
    }

    /// The same appender (its uploads in flight and abort report shared), its copies
    /// failing without retry when left unanswered for `timeout` (see `s3`).
    pub fn with_answer_timeout(&self, timeout: Duration) -> S3Appender {
        S3Appender {
            s3: self.s3.clone(),
            wire: self.wire.clone().with_answer_timeout(timeout),
            max_copy_part: self.max_copy_part,
            pending: self.pending.clone(),
            report: self.report.clone(),
        }
    }

    /// Our own requests to the bucket, made as object_store's are (see `s3`).
    pub fn wire(&self) -> &S3Wire {
        &self.wire
    }

    /// The bucket's URL, as the requests address it.
    pub fn bucket_url(&self) -> &str {
        self.wire.bucket_url()
    }

    async fn append(
        &self,
        key: &str,
        file: &Beneath,
        from: u64,
        to: u64,
        e_tag: Option<&str>,
        pace: Flow<'_>,
    ) -> Result<Appended, AppendError> {
        let location = parse_key(key).map_err(|e| unavailable(key, &e))?;
        if from < S3_MIN_PART {
            return Err(AppendError::Changed {
                key: key.into(),
                why: format!("{from} bytes are too few to copy as a part"),
            });
        }
        let Some(e_tag) = e_tag else {
            return Err(AppendError::Changed {
                key: key.into(),
                why: "no ETag recorded".into(),
            });
        };
        check_object(self.s3.as_ref(), key, &location, from, Some(e_tag)).await?;
        pace.moved();
        let id = self
            .s3
            .create_multipart(&location)
            .await
            .map_err(|e| store_failure(key, "CreateMultipartUpload", &e))?;
        pace.moved();
        lock(&self.pending).insert(id.clone(), location.clone());
        let guard = PendingGuard {
            app: self,
            id: id.clone(),
            location: location.clone(),
            open: true,
        };
        let condition = Precondition::ETag(e_tag.to_string());
        let result = self
            .parts(
                key,
                &location,
                &id,
                file,
                (from, to),
                Some(e_tag),
                Some(&condition),
                pace,
            )
            .await;
        match result {
            Ok((e_tag, tail)) => {
                guard.close();
                Ok(Appended {
                    bytes: to - from,
                    e_tag,
                    tail: Some(tail),
                })
            }
            Err(e) => {
                if abort_upload(&self.s3, &location, &id, &self.report).await {
                    guard.close();
                }
                Err(e)
            }
        }
    }

    /// Writes the first `len` bytes of `file` as the object `key`, as a multipart upload of
    /// parts of [`TAIL_PART`] (an object too big for one PUT), completed only if the object
    /// is still as `condition` says (`None`: unconditionally) (see `storage::versioned`): a 412 is
    /// [`AppendError::Changed`]. The upload is aborted if anything fails.
    pub async fn put_whole(
        &self,
        key: &str,
        file: &Beneath,
        len: u64,
        condition: Option<&Precondition>,
        pace: Flow<'_>,
    ) -> Result<Appended, AppendError> {
        let location = parse_key(key).map_err(|e| unavailable(key, &e))?;
        let id = self
            .s3
            .create_multipart(&location)
            .await
            .map_err(|e| store_failure(key, "CreateMultipartUpload", &e))?;
        pace.moved();
        lock(&self.pending).insert(id.clone(), location.clone());
        let guard = PendingGuard {
            app: self,
            id: id.clone(),
            location: location.clone(),
            open: true,
        };
        let result = self
            .parts(key, &location, &id, file, (0, len), None, condition, pace)
            .await;
        match result {
            Ok((e_tag, tail)) => {
                guard.close();
                Ok(Appended {
                    bytes: len,
                    e_tag,
                    tail: Some(tail),
                })
            }
            Err(e) => {
                if abort_upload(&self.s3, &location, &id, &self.report).await {
                    guard.close();
                }
                Err(e)
            }
        }
    }

    /// The copied ranges (the object's first `from` bytes, which must have the ETag
    /// `copy_of`; none without it), the new bytes `[from, to)` of `file`, the completion
    /// (conditional on `condition` unless the store refused conditions, see
    /// `storage::versioned`); the object's ETag after it and the hash of the new bytes as
    /// they were read.
    #[allow(clippy::too_many_arguments)]
    async fn parts(
        &self,
        key: &str,
        location: &ObjectPath,
        id: &str,
        file: &Beneath,
        (from, to): (u64, u64),
        copy_of: Option<&str>,
        condition: Option<&Precondition>,
        pace: Flow<'_>,
    ) -> Result<(Option<String>, u64), AppendError> {
        let mut parts = Vec::new();
        let copies = match copy_of {
            Some(e_tag) => copy_ranges(from, self.max_copy_part)
                .into_iter()
                .map(|r| (r, e_tag))
                .collect(),
            None => Vec::new(),
        };
        for (range, e_tag) in copies {
            let part = self
                .wire
                .upload_part_copy(key, id, parts.len() + 1, range, e_tag)
                .await
                .map_err(|e| match e.failure {
                    Failure::Precondition | Failure::Missing => AppendError::Changed {
                        key: key.into(),
                        why: format!("the object changed before it was copied: {e}"),
                    },
                    Failure::Unsupported | Failure::Refused => AppendError::Refused {
                        key: key.into(),
                        unsupported: e.failure == Failure::Unsupported,
                        message: e.to_string(),
                    },
                    Failure::Transient => unavailable(key, &e),
                })?;
            pace.moved();
            parts.push(part);
        }
        let part_size = part_size_for(
            to - from,
            TAIL_PART,
            MAX_PARTS.saturating_sub(parts.len() as u64).max(1),
        );
        let path = file.path();
        let mut src = file.open().map_err(|e| read_err(&path, e))?;
        src.seek(SeekFrom::Start(from))
            .map_err(|e| read_err(&path, e))?;
        let mut offset = from;
        let mut tail = xxhash_rust::xxh3::Xxh3Default::new();
        while offset < to {
            let n = (to - offset).min(part_size as u64);
            let (part, back) = read_exact_blocking(src, n, &path).await?;
            src = back;
            tail.update(&part);
            pace.take(n).await;
            pace.sending(n);
            let done = self
                .s3
                .put_part(
                    location,
                    &id.to_string(),
                    parts.len(),
                    PutPayload::from(part),
                )
                .await
                .map_err(|e| store_failure(key, "UploadPart", &e))?;
            pace.moved();
            parts.push(done);
            offset += n;
        }
        let e_tag = self.complete(key, id, &parts, condition).await?;
        Ok((e_tag, tail.digest()))
    }

    /// The completion, conditional on `condition` while the store takes conditions: a store
    /// that answers the condition with 501 / `NotImplemented` has them turned off (once, with
    /// a warning, `storage::conditions::refuse_conditions`) and the completion sent again
    /// without it. A 400 or 403 to it (`s3::may_refuse_conditions`) has the completion sent
    /// once more without the condition, and conditions turned off only when that one lands.
    async fn complete(
        &self,
        key: &str,
        id: &str,
        parts: &[PartId],
        condition: Option<&Precondition>,
    ) -> Result<Option<String>, AppendError> {
        let conditional = condition.is_some() && super::conditions::conditions_on();
        let sent = self
            .wire
            .complete_multipart(key, id, parts, condition.filter(|_| conditional))
            .await;
        let sent = match sent {
            Err(e) if conditional && e.failure == Failure::Unsupported => {
                super::conditions::refuse_conditions(e.status, e.code.as_deref(), &e.to_string());
                self.wire.complete_multipart(key, id, parts, None).await
            }
            Err(e) if conditional && may_refuse_conditions(e.failure, e.status) => {
                // Until the refusals have lasted (`conditions::REFUSAL_SPAN`), the refusal is
                // the completion's own, as any 4xx (the log goes whole; a 400 such as
                // `InvalidPart` is one), and nothing goes without its condition.
                if !super::conditions::condition_refused(
                    e.status,
                    e.code.as_deref(),
                    &e.to_string(),
                ) {
                    return Err(AppendError::Refused {
                        key: key.into(),
                        unsupported: false,
                        message: e.to_string(),
                    });
                }
                tracing::info!(%key, error = %e, "conditional writes refused (400 / 403) for long: this completion sent once more without its condition, to tell whether the store refuses the condition or the completion");
                let again = self.wire.complete_multipart(key, id, parts, None).await;
                match &again {
                    Ok(_) => super::conditions::refuse_conditions(
                        e.status,
                        e.code.as_deref(),
                        &e.to_string(),
                    ),
                    Err(_) => super::conditions::refusal_was_the_writes(),
                }
                again
            }
            r => r,
        };
        sent.map_err(|e| match e.failure {
            Failure::Precondition | Failure::Missing => AppendError::Changed {
                key: key.into(),
                why: format!("the object changed before the completion: {e}"),
            },
            Failure::Transient => unavailable(key, &e),
            Failure::Unsupported | Failure::Refused => AppendError::Refused {
                key: key.into(),
                unsupported: e.failure == Failure::Unsupported,
                message: e.to_string(),
            },
        })
    }

    /// At start, once the collector knows its node directory `node_prefix`
    /// (`P/<session>/<node>/`, any session: `P/` and the node id): reads the bucket's
    /// versioning, and aborts our own incomplete uploads (see [`STALE_UPLOAD_AGE`]).
    async fn prepare(&self, history_prefix: &str, node: &str) -> Prepared {
        let mut out = Prepared::default();
        match self.wire.versioning().await {
            Ok(v) => {
                if v.as_deref() == Some("Enabled") {
                    warn_versioned_event_growth();
                }
                out.versioned = v
            }
            Err(e) => {
                tracing::info!(error = %e, "could not read the bucket's versioning (appends stay on)")
            }
        }
        (out.aborted, out.abort_failed) = self.abort_ours(history_prefix, node, true).await;
        out
    }

    /// Aborts the incomplete uploads of ours under `P/` (any session) and `node`: every log
    /// upload of the node (not under [`UNKNOWN_NODE`]), and with `events` the event uploads
    /// older than [`STALE_UPLOAD_AGE`]; (aborted, failed).
    async fn abort_ours(&self, history_prefix: &str, node: &str, events: bool) -> (usize, usize) {
        let (mut aborted, mut failed) = (0, 0);
        let prefix = format!("{}/", history_prefix.trim_end_matches('/'));
        let uploads = match self.wire.list_uploads(&prefix).await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(error = %e, %prefix, "could not list incomplete multipart uploads; none cleaned up");
                return (0, 0);
            }
        };
        let now = crate::util::time::unix_seconds() as i64;
        for u in uploads {
            let Some(rest) = u.key.strip_prefix(&prefix) else {
                continue;
            };
            let age = u
                .initiated
                .as_deref()
                .and_then(crate::util::time::parse_rfc3339_seconds)
                .map(|t| now.saturating_sub(t));
            if !ours_and_stale(rest, node, age, events) {
                continue;
            }
            let Ok(location) = ObjectPath::parse(&u.key) else {
                continue;
            };
            if abort_upload(&self.s3, &location, &u.upload_id, &self.report).await {
                tracing::info!(key = %u.key, upload_id = %u.upload_id, initiated = ?u.initiated, "aborted an incomplete multipart upload left by an earlier run or a cancelled upload");
                aborted += 1;
            } else {
                failed += 1;
            }
        }
        (aborted, failed)
    }

    /// Aborts the uploads of appends that were cancelled, until `deadline`.
    async fn abort_pending(&self, deadline: Instant) -> usize {
        let open: Vec<(String, ObjectPath)> = lock(&self.pending)
            .iter()
            .map(|(id, loc)| (id.clone(), loc.clone()))
            .collect();
        let mut left = 0;
        for (id, location) in open {
            match tokio::time::timeout_at(
                deadline.into(),
                abort_upload(&self.s3, &location, &id, &self.report),
            )
            .await
            {
                Ok(true) => {
                    lock(&self.pending).remove(&id);
                }
                Ok(false) => left += 1,
                Err(_) => {
                    left += 1;
                    tracing::warn!(key = %location, upload_id = %id, "no time left to abort an incomplete multipart upload; the next start cleans it up");
                }
            }
        }
        left
    }
}

/// Once per process: in a bucket with versioning `Enabled`, the growth of open segments'
/// objects within `--upload-window` (issue 23) keeps going, since the window is the promise
/// that a vanished node loses nothing older; but every growth keeps the previous version as
/// a noncurrent one. The operator is told what it costs and what bounds it.
fn warn_versioned_event_growth() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!(
            "the bucket has versioning Enabled: every growth of an open event object (each round, every half --upload-window, for each partition that got events) keeps the previous version as a noncurrent version, up to a segment's compressed size each; expire noncurrent versions with a lifecycle rule (NoncurrentVersionExpiration) or lengthen --upload-window; log appends are off in this bucket"
        );
    });
}

/// Whether the incomplete upload of `rest` (its key under `P/`), started `age` seconds ago
/// (when known), is ours under `node` and to be aborted: every log upload of the node (the
/// log lane is their only writer: not begun at start, done at the end of the final flush),
/// and with `events` any upload under the node older than [`STALE_UPLOAD_AGE`]. Under the
/// fallback [`UNKNOWN_NODE`] other nodes' collectors may be uploading right now, so only
/// the age applies there.
fn ours_and_stale(rest: &str, node: &str, age: Option<i64>, events: bool) -> bool {
    let rest = format!("/{rest}");
    let node_dir = format!("/{node}/");
    if !rest.contains(&node_dir) {
        return false;
    }
    let logs = node != UNKNOWN_NODE && rest.contains(&format!("{node_dir}logs/"));
    logs || (events && age.is_some_and(|a| a >= STALE_UPLOAD_AGE.as_secs() as i64))
}

/// Byte ranges (first, last) that copy an object of `size` bytes in parts of at most
/// `max_part`, as equal as can be (so each is at least half of `max_part`).
pub fn copy_ranges(size: u64, max_part: u64) -> Vec<(u64, u64)> {
    if size == 0 {
        return Vec::new();
    }
    let n = size.div_ceil(max_part.max(1));
    let (base, extra) = (size / n, size % n);
    let mut out = Vec::with_capacity(n as usize);
    let mut start = 0;
    for i in 0..n {
        let len = base + u64::from(i < extra);
        out.push((start, start + len - 1));
        start += len;
    }
    out
}

/// What a failed request of object_store's (`what`) means for this append (see
/// `s3::classify_store_error`): a deterministic answer (a 4xx other than 401, 408 and 429,
/// an error document in a 200) is a refusal for this object, a missing object or failed
/// precondition a changed object, anything else transient.
fn store_failure(key: &str, what: &str, e: &object_store::Error) -> AppendError {
    let message = format!("{what}: {e}");
    match classify_store_error(e) {
        Failure::Transient => AppendError::Unavailable {
            key: key.to_string(),
            message,
        },
        f @ (Failure::Unsupported | Failure::Refused) => AppendError::Refused {
            key: key.to_string(),
            unsupported: f == Failure::Unsupported,
            message,
        },
        Failure::Precondition | Failure::Missing => AppendError::Changed {
            key: key.to_string(),
            why: message,
        },
    }
}

fn unavailable(key: &str, e: &dyn std::fmt::Display) -> AppendError {
    AppendError::Unavailable {
        key: key.to_string(),
        message: e.to_string(),
    }
}

fn read_err(path: &Path, source: io::Error) -> AppendError {
    AppendError::Read {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads exactly `n` bytes from `src` on the blocking pool; the file back with them.
async fn read_exact_blocking(
    src: std::fs::File,
    n: u64,
    path: &Path,
) -> Result<(Vec<u8>, std::fs::File), AppendError> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut buf = Vec::with_capacity(n as usize);
        let mut src = src;
        (&mut src)
            .take(n)
            .read_to_end(&mut buf)
            .map_err(|e| read_err(&p, e))?;
        if (buf.len() as u64) < n {
            return Err(read_err(
                &p,
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file shrank during the append",
                ),
            ));
        }
        Ok((buf, src))
    })
    .await
    .map_err(|e| read_err(path, io::Error::other(e.to_string())))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_own_stale_uploads_are_aborted() {
        let old = Some(STALE_UPLOAD_AGE.as_secs() as i64);
        let young = Some(5);
        let logs = "s/n1/logs/raylet.out";
        let events = "s/n1/node_events/n1-2026-11-22-02-1.jsonl.gz";
        // Our node's logs: always, at start (events) and at the end of the final flush.
        assert!(ours_and_stale(logs, "n1", young, true));
        assert!(ours_and_stale(logs, "n1", young, false));
        // Another node's: never.
        assert!(!ours_and_stale(logs, "n2", old, true));
        // Event objects: only old ones, only at start.
        assert!(!ours_and_stale(events, "n1", young, true));
        assert!(ours_and_stale(events, "n1", old, true));
        assert!(!ours_and_stale(events, "n1", old, false));
        assert!(!ours_and_stale(events, "n1", None, true));
        // Under unknown-node, shared with other nodes: a sibling's upload in flight stays.
        let shared = "s/unknown-node/logs/worker-x.out";
        assert!(!ours_and_stale(shared, UNKNOWN_NODE, young, true));
        assert!(!ours_and_stale(shared, UNKNOWN_NODE, None, true));
        assert!(ours_and_stale(shared, UNKNOWN_NODE, old, true));
    }

    #[test]
    fn a_version_replaces_the_object_whole_and_leftovers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let shadow = dir.path().join("shadow");
        std::fs::write(&shadow, b"0123456789").unwrap();
        let src = Beneath {
            root: dir.path().to_path_buf(),
            rel: "shadow".into(),
            dev: 0,
            ino: 0,
        };
        let root = dir.path().join("bucket/P");
        let node_dir = root.join("s1/n1/job_events/AQAAAA==");
        let target = node_dir.join("e-2026-11-22-02-1.jsonl.gz");
        write_version(&src, &target, 4, "host-a", "k").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"0123");
        write_version(&src, &target, 10, "host-a", "k").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"0123456789");
        // Asked for more than the source has: the object stays as it was, no temporary.
        let err = write_version(&src, &target, 11, "host-a", "k").unwrap_err();
        assert!(matches!(err, AppendError::Read { .. }), "{err}");
        assert_eq!(std::fs::read(&target).unwrap(), b"0123456789");
        assert_eq!(std::fs::read_dir(&node_dir).unwrap().count(), 1);
        // A kill between the write and the rename leaves a temporary; the history server's
        // pattern does not take it for an event object, and only this host's are removed.
        let ours = temp_path(&target, "host-a").unwrap();
        let theirs = temp_path(&target, "host-b").unwrap();
        std::fs::write(&ours, b"x").unwrap();
        std::fs::write(&theirs, b"x").unwrap();
        let name = ours.file_name().unwrap().to_str().unwrap();
        assert!(
            crate::contract::events::parse_event_object_name(name).is_none(),
            "{name}"
        );
        // Another node's directory is not looked at.
        let other = root.join("s1/n2/job_events/x");
        std::fs::create_dir_all(&other).unwrap();
        let other_tmp = other.join(".o-2026-11-22-02.jsonl.gz.host-a.rhc-tmp");
        std::fs::write(&other_tmp, b"x").unwrap();
        assert_eq!(remove_temporaries(&root, "n1", "host-a"), 1);
        assert!(!ours.exists() && theirs.exists() && other_tmp.exists() && target.exists());
    }

    #[tokio::test]
    async fn appends_only_to_the_object_it_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let bucket = dir.path().join("bucket");
        std::fs::create_dir(&bucket).unwrap();
        let app = Appender::local(&bucket).unwrap();
        let Appender::Local(fs) = &app else {
            unreachable!()
        };
        let file = dir.path().join("raylet.out");
        std::fs::write(&file, b"line 1\nline 2\n").unwrap();
        let src = Beneath {
            root: dir.path().to_path_buf(),
            rel: "raylet.out".into(),
            dev: 0,
            ino: 0,
        };
        let key = "P/s/n/logs/raylet.out";
        let loc = parse_key(key).unwrap();
        let put = fs
            .put(&loc, object_store::PutPayload::from_static(b"line 1\n"))
            .await
            .unwrap();
        let done = app
            .append(key, &src, 7, 14, put.e_tag.as_deref(), Flow::default())
            .await
            .unwrap();
        assert_eq!(done.bytes, 7);
        let got = fs.get(&loc).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"line 1\nline 2\n");
        // The old ETag no longer matches: someone (here, we) changed the object.
        let err = app
            .append(key, &src, 14, 14, put.e_tag.as_deref(), Flow::default())
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::Changed { .. }), "{err}");
        // A wrong size is refused before anything is written.
        let err = app
            .append(key, &src, 7, 14, done.e_tag.as_deref(), Flow::default())
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::Changed { .. }), "{err}");
        let got = fs.get(&loc).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"line 1\nline 2\n");
        // A file shorter than asked: an error, and the ledger is not advanced by the caller.
        let err = app
            .append(key, &src, 14, 20, done.e_tag.as_deref(), Flow::default())
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::Read { .. }), "{err}");
        // A missing object.
        let err = app
            .append("P/s/n/logs/none", &src, 0, 1, None, Flow::default())
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::Changed { .. }), "{err}");
    }
}
