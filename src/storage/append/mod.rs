//! Appending the new bytes of a growing log to its object, where the store can do that, so a
//! live log costs what Ray wrote and not its whole size every round.
//!
//! Before anything is appended, the object must still be the one we wrote: its ETag (and
//! size) as the ledger recorded them; otherwise the caller uploads the file whole. What is
//! appended is the file's bytes `[from, to)`, read as they are now; the caller has checked
//! the file only grew (same inode, same bytes before `from`). A store whose HEAD gives no
//! ETag leaves only the size to compare: there an S3 append goes on only once the store was
//! seen to honour the copy's ETag condition (`probe`), which then protects it.
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
//!   upload carries; the copies are [`S3Wire`](super::s3::S3Wire)'s, made from the same
//!   configuration (see `storage::s3`).
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
//! - Azure: event objects only ([`AzureAppender`], `blocks`): every version is written as
//!   blocks with ids we choose, and the next one commits the blob's blocks plus the new
//!   bytes as new blocks (Put Block, Put Block List with `If-Match`); see `blocks`. Logs are
//!   uploaded whole on the schedule ([`Appender::appends_logs`]): their whole uploads are
//!   object_store's, whose block ids are not ours.
//! - GCS: event objects only ([`GcsAppender`], `compose`), through GCS's JSON API
//!   (`storage::gcs`): every version is written whole as a media upload conditional on its
//!   generation, and the next one uploads the new bytes as a part object of its own and
//!   composes it onto the object (`ifGenerationMatch` on the object's generation, every
//!   source pinned to its generation), then deletes the part; see `compose`. Without a JSON
//!   API behind `gs://` (an S3-compatible server), or on a server that composes whatever the
//!   generation, it turns itself off for the run (one WARN) and every version goes whole
//!   through `object_store`. Logs are uploaded whole on the schedule
//!   ([`Appender::appends_logs`]).
//!
//! Layout: this file is the face (the errors, [`Appender`] and what the stores share: the
//! check that the object is still the one we wrote, the meaning of a failed request);
//! `local` appends and replaces in place on `file://`; `multipart` is [`S3Appender`], the
//! multipart uploads and their aborts; `probe` is the verdict, once per run of a store,
//! whether it honours `x-amz-copy-source-if-match` (asked only of a store whose HEAD gives
//! no ETag); `blocks` is [`AzureAppender`]; `compose` is [`GcsAppender`].

mod blocks;
mod compose;
mod local;
mod multipart;
mod probe;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::s3::classify_store_error;
use super::wire::{Failure, WireError};
use crate::util::fs::Beneath;
use crate::util::pace::Flow;
pub use blocks::{block_id, AzureAppender};
pub use compose::{part_name, GcsAppender, GCS_PART_SUFFIX};
use local::{append_local, remove_temporaries, replace_local};
pub use local::{local_temp_tag, remove_local_temp, sync_local_object_dir, LOCAL_TEMP_SUFFIX};
pub use multipart::{copy_ranges, S3Appender, S3_MAX_COPY_PART};

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
    /// The object's version after it, when the store gives one (GCS: its generation).
    pub version: Option<String>,
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
    /// Azure Blob Storage: event objects only (`blocks`); the log lane is not given it.
    Azure(Arc<AzureAppender>),
    /// Google Cloud Storage: event objects only (`compose`); the log lane is not given it.
    Gcs(Arc<GcsAppender>),
}

impl Appender {
    /// The same appender, S3 copies left unanswered for `timeout` failing without retry:
    /// for the log lane only, whose appends fall back on the whole upload (the event
    /// publisher keeps object_store's own request timeout, see `s3`).
    pub fn with_answer_timeout(self, timeout: Duration) -> Appender {
        match self {
            Appender::Local(fs) => Appender::Local(fs),
            Appender::S3(s3) => Appender::S3(Arc::new(s3.with_answer_timeout(timeout))),
            other => other,
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
                conditions: a.conditions.clone(),
            })),
            other => other,
        }
    }

    /// Whether the log lane may append with it: not on Azure, whose log objects are
    /// written by whole uploads (`object_store`'s ids), never as blocks of ours, nor on
    /// GCS, whose logs go with `object_store` (XML API) only.
    pub fn appends_logs(&self) -> bool {
        !matches!(self, Appender::Azure(_) | Appender::Gcs(_))
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
            // Any blob written as blocks of ours (an empty one never is); none once appends
            // are off on the store (`blocks`: a Get Block List refused for lack of permission).
            Appender::Azure(a) if a.appends_on() => 1,
            Appender::Azure(_) => u64::MAX,
            // Any object written whole through the JSON API, once the probe found it usable.
            Appender::Gcs(g) if g.appends_on() => 1,
            Appender::Gcs(_) => u64::MAX,
        }
    }

    /// Whether appends are still tried with it (`false`: Azure, after a Get Block List
    /// refused for lack of permission, said once there).
    pub fn appends_on(&self) -> bool {
        match self {
            Appender::Azure(a) => a.appends_on(),
            Appender::Gcs(g) => g.appends_on(),
            _ => true,
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
            // Uncommitted blocks of a killed run are Azure's to discard.
            Appender::Azure(_) => Prepared::default(),
            // Parts are named by the host, not the node: [`Appender::remove_parts`].
            Appender::Gcs(_) => Prepared::default(),
        }
    }

    /// At start: GCS's probe of whether its JSON API is there and composes conditionally
    /// is started (in a task of its own: nothing waits for it, `compose`), its test part
    /// beside `history_prefix/rhc-probe`; nothing to do elsewhere.
    pub fn start_probe(&self, history_prefix: &str) {
        if let Appender::Gcs(g) = self {
            let key = format!("{}/rhc-probe", history_prefix.trim_end_matches('/'));
            let _ = g.usable(&key);
        }
    }

    /// Tests only: waits (at most `limit`) for GCS's probe started by
    /// [`Appender::start_probe`] to end (`storage::TEST_GCS_PROBE_FIRST`).
    pub async fn probe_ended(&self, limit: std::time::Duration) {
        if let Appender::Gcs(g) = self {
            g.probe_ended(limit).await;
        }
    }

    /// At start, without waiting for the node id: GCS's parts of event objects under
    /// `prefixes` (the history and quarantine prefixes) that an earlier run of this host
    /// left (killed while growing one) are deleted (`compose`); nothing to do elsewhere.
    pub async fn remove_parts(&self, prefixes: &[String]) {
        if let Appender::Gcs(g) = self {
            let mut removed = 0;
            for p in prefixes {
                removed += g.remove_parts(p).await;
            }
            if removed > 0 {
                tracing::info!(
                    removed,
                    "removed part objects of event objects an earlier run left (killed while growing one)"
                );
            }
        }
    }

    /// `file://`: writes the first `len` bytes of `source` as the new version of the object
    /// `key`, atomically (see `local::write_version`); `None` on other stores.
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
            Appender::Local(_) | Appender::Azure(_) | Appender::Gcs(_) => 0,
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
            Appender::Azure(az) => az.append(key, file, from, to, e_tag).await,
            Appender::Gcs(g) => g.append(key, file, from, to, None).await,
        }
    }

    /// [`Appender::append`] of an event object's new bytes, which on GCS grows the object
    /// from its generation `version` (the record's).
    #[allow(clippy::too_many_arguments)]
    pub async fn grow(
        &self,
        key: &str,
        file: &Beneath,
        from: u64,
        to: u64,
        e_tag: Option<&str>,
        version: Option<&str>,
        pace: Flow<'_>,
    ) -> Result<Appended, AppendError> {
        match self {
            Appender::Gcs(g) => g.append(key, file, from, to, version).await,
            _ => self.append(key, file, from, to, e_tag, pace).await,
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

/// An ETag as compared: without a weak validator's `W/`, the quotes or the case (S3's
/// XML answers and headers, and S3-compatible stores, do not all quote alike); `None` for
/// an empty one (some S3-compatible stores answer a completion with `<ETag></ETag>`), which
/// says nothing.
pub(crate) fn etag_key(tag: &str) -> Option<String> {
    let t = tag.trim();
    let t = t.strip_prefix("W/").unwrap_or(t).trim_matches('"').trim();
    (!t.is_empty()).then(|| t.to_ascii_lowercase())
}

/// The object must exist with `size` bytes and, when known, the ETag `e_tag`; an object
/// whose HEAD gives no ETag to compare with `e_tag` is [`Checked::NoETag`].
async fn check_object(
    store: &dyn ObjectStore,
    key: &str,
    location: &object_store::path::Path,
    size: u64,
    e_tag: Option<&str>,
) -> Result<Checked, AppendError> {
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
    if let Some(want) = e_tag.and_then(etag_key) {
        // Compared as the ledger checks compare them (review r42w D2: a store whose HEAD
        // gives the ETag unquoted had every growing log uploaded whole each round).
        let found = meta.e_tag.as_deref().and_then(etag_key);
        let why = format!(
            "the object's ETag is {:?}, the ledger says {want:?}",
            meta.e_tag
        );
        match found {
            Some(f) if f == want => {}
            Some(_) => return Err(changed(why)),
            // Only the size could be compared (review r42x): the caller decides.
            None => return Ok(Checked::NoETag { why }),
        }
    }
    Ok(Checked::Same)
}

/// What [`check_object`] found of an object with the ledger's size.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Checked {
    /// Its ETag is the ledger's (or the ledger has none to compare).
    Same,
    /// The store's HEAD gave no ETag to compare with the ledger's (`why` says so): the
    /// object may be another of the same size. Appending is safe only where the store
    /// honours the copy's condition (`probe`); otherwise the object goes whole.
    NoETag {
        /// The mismatch, as a [`AppendError::Changed`] would say it.
        why: String,
    },
}

/// What a failed request of object_store's (`what`) means for this append (see
/// `s3::classify_store_error`): a deterministic answer (a 4xx other than 401, 408 and 429,
/// an error document in a 200) is a refusal for this object, a missing object or failed
/// precondition a changed object, anything else transient.
fn store_failure(key: &str, what: &str, e: &object_store::Error) -> AppendError {
    store_failure_as(key, what, e, classify_store_error(e))
}

/// [`store_failure`] with the failure already classified (`UploadPart`:
/// `s3::classify_part_error`).
fn store_failure_as(
    key: &str,
    what: &str,
    e: &object_store::Error,
    failure: Failure,
) -> AppendError {
    let message = format!("{what}: {e}");
    match failure {
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

/// What a failed request of our own wire (Azure's block requests, GCS's JSON API) means
/// for the write.
fn wire_failure(key: &str, e: WireError) -> AppendError {
    match e.failure {
        Failure::Precondition | Failure::Missing => AppendError::Changed {
            key: key.into(),
            why: e.to_string(),
        },
        Failure::Unsupported | Failure::Refused => AppendError::Refused {
            key: key.into(),
            unsupported: e.failure == Failure::Unsupported,
            message: e.to_string(),
        },
        Failure::Transient => unavailable(key, &e),
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
