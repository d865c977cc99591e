//! Conditional writes of the versions of an object we grow in place (the event objects of
//! open segments, `events::publish`): each new version lands only if the object is still the
//! version it grows from, so a write delivered late (a PUT or a completion of a run killed
//! while it was on its way, or one whose client gave up and sent it again) can never replace
//! a newer version: the store answers 412 (the review r35j found 100 of 300 acknowledged
//! events lost that way, exit 0).
//!
//! - The condition is the version last read or written ([`Base`]): `If-Match: <ETag>` (S3,
//!   Azure; GCS: `x-goog-if-generation-match`, `object_store`'s `PutMode::Update`), or
//!   `If-None-Match: *` (`PutMode::Create`) for a first write. A single PUT goes through
//!   `object_store` (`put_opts`); on S3 an object over one part goes up as a multipart
//!   upload whose completion carries the condition (`append::S3Appender::put_whole`), as
//!   an append's does. On Azure every version is written as blocks of ours whatever its
//!   size, the condition on its Put Block List (`append::AzureAppender::put_whole`), so that
//!   the next version can be committed after them; blocks refused (another writer's
//!   uncommitted blocks with ids of another length) have it written with one conditional
//!   Put Blob instead, and once appends are off on the store (Get Block List refused for
//!   lack of permission) a version of one part goes as one Put Blob. On GCS every version
//!   is one media upload through the JSON API with `ifGenerationMatch` (0 for a first
//!   write), whatever its size ([`write_version_gcs`]: so that the next one can be composed
//!   onto it, `append::GcsAppender`), its 412 settled the same way with reads through the
//!   JSON API; without the JSON API (or while it is not known yet, or turned off) a version
//!   goes through `object_store`, and one over one part is written unconditionally there
//!   (`object_store`'s multipart uploads take no condition there).
//! - A 412 (or a missing object where one was expected, or one present where none was) is
//!   answered by reading what the object holds now ([`write_version`]): if it is byte for byte
//!   what we meant to write (our own write landed, then its retry met the condition), that is
//!   the write done; otherwise the write is sent again conditional on what is there now, at
//!   most [`MAX_CONFLICTS`] times. Our new version holds every line of every earlier version
//!   of the object (a segment's durable bytes only grow), so writing over what is there
//!   loses nothing; only a late write of an older version is refused.
//! - The state of conditions lives in `storage::conditions`, per kind of condition
//!   ([`Kind`]: a PUT's or a completion's `If-None-Match` or `If-Match`), each counted,
//!   cleared and turned off on its own: a store may take one kind and refuse another
//!   (review r35r C1, C2). A store that answers the condition with 501 / `NotImplemented`
//!   (some S3-compatible stores) has that kind turned off for the process
//!   ([`refuse_conditions`]: one warning; the metric reads [`conditional_writes_now`]), with
//!   every kind that has not landed with its condition in the run, and the write sent again
//!   without it, as before this module existed. A store or gateway that answers it with 400
//!   or 403 instead (`InvalidArgument`, `InvalidRequest`, `AccessDenied`:
//!   `s3::may_refuse_conditions`) has the same write sent once more without the condition
//!   once its refusals have lasted ([`REFUSALS_TO_SWITCH`], [`REFUSAL_SPAN`](super::conditions::REFUSAL_SPAN):
//!   [`condition_refused`]; until then the write fails and is tried again with its
//!   condition): when that one lands, its kind is turned off the same way; when it is
//!   refused too, the refusal is the write's own (credentials, a bad request): it fails as
//!   any write does, tried again later, and conditions stay on. Refusals count per write
//!   and end when a write of the same kind lands with its condition
//!   (`conditions::condition_taken`): only a condition refused continuously counts. At
//!   shutdown, for a kind not landed with its condition in the run, a refused write is
//!   tried again with it after `conditions::SHUTDOWN_RETRY_PAUSE`, and sent without it
//!   when refused [`REFUSALS_TO_SWITCH`] times (`conditions::shutting_down`): one passing
//!   refusal never is (review r35r S2). A 412 is never one of these.
//!
//! `file://` needs none of this: every version is renamed into place by the one process
//! that holds the spool (`append::Appender::replace_local`), and a killed process leaves no
//! write on its way.

use std::io::Read;
use std::sync::Arc;

use futures::StreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::{
    GetOptions, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutPayload, UpdateVersion,
};

use super::append::{AppendError, Appender, AzureAppender, GcsAppender};
use super::azure::Condition;
use super::conditions::{
    condition_refused, condition_taken, conditions_on, refusal_span, refusal_was_the_writes,
    refuse_conditions, Kind, Refused, REFUSALS_TO_SWITCH,
};
// The publisher and the ingest's status read these here, beside the writes they govern.
pub use super::conditions::{conditional_writes_now, conditions_in_use};
use super::put::{parse_key, put_file_prefix, UploadError};
use super::s3::{classify_store_error, may_refuse_conditions, store_error_answer, Precondition};
use super::wire::Failure;
use crate::util::fs::Beneath;
use crate::util::pace::Flow;

/// Writes of one version answered 412 (each followed by a read of the object) before the
/// publication gives up for this round (tried again half a window later).
pub const MAX_CONFLICTS: u32 = 3;

/// The version a write grows from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// No object is expected under the key (a first write: `If-None-Match: *`).
    Absent,
    /// The object as last written or read (both `None`: unknown, written unconditionally).
    Version {
        /// Its ETag.
        e_tag: Option<String>,
        /// Its version (GCS's generation), when the store gave one.
        version: Option<String>,
    },
}

impl Base {
    fn of(meta: &ObjectMeta) -> Base {
        Base::Version {
            e_tag: meta.e_tag.clone(),
            version: meta.version.clone(),
        }
    }
}

/// What [`write_version`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Bytes sent (the last attempt's; 0 when the object was found holding them already).
    pub bytes: u64,
    /// The object's ETag now.
    pub e_tag: Option<String>,
    /// Its version (GCS's generation), when the store gave one.
    pub version: Option<String>,
    /// Writes answered 412 on the way (each followed by a read of the object).
    pub conflicts: u32,
}

/// How one attempt ended.
enum Attempt {
    Done(Option<String>, Option<String>, u64),
    /// 412, or the object missing or present against the condition: read it.
    Conflict,
    Failed(UploadError),
}

/// Writes the first `len` bytes of `source` as the object `key`, conditional on `base` (see
/// the module doc); objects over `part_size` bytes go as a multipart upload (S3: through
/// `appender`'s conditional completion; other stores: unconditionally).
pub async fn write_version(
    store: &Arc<dyn ObjectStore>,
    appender: Option<&Appender>,
    key: &str,
    source: &Beneath,
    len: u64,
    part_size: usize,
    base: Base,
) -> Result<Written, UploadError> {
    let location = parse_key(key)?;
    if let Some(Appender::Gcs(g)) = appender {
        // Through GCS's JSON API while it is there (so the next version can be composed
        // onto this one); otherwise, or while that is not known yet (the probe runs on its
        // own: nothing waits for it), object_store's.
        if g.usable(key) == Some(true) {
            return write_version_gcs(g, key, source, len, base).await;
        }
    }
    let mut base = base;
    let mut conflicts = 0;
    loop {
        // Azure: as blocks of ours while appends are on (and always past one part, so the
        // write keeps its condition); once they are off, a version of one part goes as one
        // Put Blob, as before appends.
        let blocks = match appender {
            Some(Appender::Azure(az)) if az.appends_on() || len > part_size as u64 => Some(az),
            _ => None,
        };
        let attempt = if let Some(az) = blocks {
            put_blocks_once(store, &location, az, key, source, len, part_size, &base).await
        } else if len <= part_size as u64 {
            put_once(store, &location, key, source, len, &base).await
        } else {
            match appender {
                Some(Appender::S3(s3)) => {
                    let condition = match &base {
                        Base::Absent => Some(Precondition::Absent),
                        Base::Version { e_tag: Some(e), .. } => Some(Precondition::ETag(e.clone())),
                        Base::Version { .. } => None,
                    };
                    match s3
                        .put_whole(key, source, len, condition.as_ref(), Flow::default())
                        .await
                    {
                        Ok(done) => Attempt::Done(done.e_tag, None, len),
                        Err(AppendError::Changed { .. }) => Attempt::Conflict,
                        Err(e) => Attempt::Failed(UploadError::Append {
                            key: key.to_string(),
                            message: e.to_string(),
                        }),
                    }
                }
                _ => match put_file_prefix(store, key, source, len, part_size, Flow::default())
                    .await
                {
                    Ok(put) => Attempt::Done(put.e_tag, None, put.bytes),
                    Err(e) => Attempt::Failed(e),
                },
            }
        };
        match attempt {
            Attempt::Done(e_tag, version, bytes) => {
                return Ok(Written {
                    bytes,
                    e_tag,
                    version,
                    conflicts,
                })
            }
            Attempt::Failed(e) => return Err(e),
            Attempt::Conflict => {
                conflicts += 1;
                match now(store, &location, key, source, len).await? {
                    Now::Ours(meta) => {
                        tracing::info!(%key, "a conditional write met its condition failed, and the object already holds what it meant to write (an earlier attempt of it landed)");
                        return Ok(Written {
                            bytes: 0,
                            e_tag: meta.e_tag,
                            version: meta.version,
                            conflicts,
                        });
                    }
                    Now::Other(meta) => {
                        tracing::info!(%key, size = meta.size, e_tag = ?meta.e_tag, "the object is not the version this write grows from (a write delivered late, or one that landed without its answer): written again over what it holds now");
                        base = Base::of(&meta);
                    }
                    Now::Absent => base = Base::Absent,
                }
                if conflicts > MAX_CONFLICTS {
                    return Err(UploadError::Append {
                        key: key.to_string(),
                        message: format!(
                            "the object changed under {conflicts} conditional writes in a row; tried again later"
                        ),
                    });
                }
            }
        }
    }
}

/// GCS, through the JSON API (`append::GcsAppender`): the first `len` bytes of `source` as
/// one media upload conditional on the generation of `base` (`ifGenerationMatch=0` for
/// none); a 412 is settled as [`write_version`] settles one, the object read through the
/// JSON API too (its metadata, then its bytes at that generation when it has `len` bytes,
/// up to `s3::MAX_ANSWER_BODY`: a larger one is written over, conditional on it). The
/// version is read into memory whole, whatever its size (at most a segment's object; as
/// `put_blocks_once`'s Put Blob does, where [`put_once`] takes versions of one part only).
async fn write_version_gcs(
    g: &GcsAppender,
    key: &str,
    source: &Beneath,
    len: u64,
    base: Base,
) -> Result<Written, UploadError> {
    let body = read_prefix(source, len).await?;
    let failed = |e: &dyn std::fmt::Display| UploadError::Append {
        key: key.to_string(),
        message: e.to_string(),
    };
    let kind = Kind::put(matches!(base, Base::Absent));
    // `None`: no generation known (a record without one): read it first.
    let mut condition = match &base {
        Base::Absent => Some(0),
        Base::Version { version, .. } => version.as_deref().and_then(|v| v.parse::<u64>().ok()),
    };
    let mut conflicts = 0;
    loop {
        if let Some(generation) = condition {
            match g.wire.upload(key, body.clone(), Some(generation)).await {
                Ok(o) => {
                    condition_taken(kind);
                    return Ok(Written {
                        bytes: len,
                        e_tag: o.e_tag,
                        version: Some(o.generation.to_string()),
                        conflicts,
                    });
                }
                Err(e) if matches!(e.failure, Failure::Precondition | Failure::Missing) => {
                    conflicts += 1;
                }
                Err(e) => return Err(failed(&e)),
            }
        }
        if conflicts > MAX_CONFLICTS {
            return Err(failed(&format!(
                "the object changed under {conflicts} conditional writes in a row; tried again later"
            )));
        }
        match g.wire.stat(key).await.map_err(|e| failed(&e))? {
            None => condition = Some(0),
            Some(o) => {
                if o.size == len {
                    match g.wire.read(key, o.generation).await {
                        Ok(bytes) if bytes == body => {
                            tracing::info!(%key, "a conditional write met its condition failed, and the object already holds what it meant to write (an earlier attempt of it landed)");
                            return Ok(Written {
                                bytes: 0,
                                e_tag: o.e_tag,
                                version: Some(o.generation.to_string()),
                                conflicts,
                            });
                        }
                        // Another version, or one that could not be read (changed again
                        // since, or over `MAX_ANSWER_BODY`): written over, conditional on
                        // it, which loses nothing (it is a prefix of ours or ours).
                        _ => {}
                    }
                }
                if condition.is_some() {
                    tracing::info!(%key, size = o.size, generation = o.generation, "the object is not the version this write grows from (a write delivered late, or one that landed without its answer): written again over what it holds now");
                }
                condition = Some(o.generation);
            }
        }
    }
}

/// The first `len` bytes of `source`, in memory.
async fn read_prefix(source: &Beneath, len: u64) -> Result<bytes::Bytes, UploadError> {
    let path = source.path();
    let src = source.clone();
    tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
        let mut buf = Vec::with_capacity(len as usize);
        src.open()?.take(len).read_to_end(&mut buf)?;
        if (buf.len() as u64) < len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{} bytes where {len} were expected", buf.len()),
            ));
        }
        Ok(buf)
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
    .map(bytes::Bytes::from)
    .map_err(|source| UploadError::Read { path, source })
}

/// Azure: the first `len` bytes of `source` as blocks of ours (so the next version can be
/// committed after them, `append::AzureAppender`), their Put Block List conditional on
/// `base`. Blocks refused (review r35a D1: a block another writer left uncommitted on the
/// blob with an id of another length has every Put Block of ours answered 400
/// `InvalidBlobOrBlock`, for up to a week) have the version written with one Put Blob,
/// conditional on `base` as the commit was ([`put_once`]; the version is read into memory
/// whole, at most a segment), which Azure lets discard the blob's uncommitted blocks; the
/// next publication finds a blob not of our blocks and writes it whole as blocks again.
#[allow(clippy::too_many_arguments)]
async fn put_blocks_once(
    store: &Arc<dyn ObjectStore>,
    location: &ObjectPath,
    az: &AzureAppender,
    key: &str,
    source: &Beneath,
    len: u64,
    part_size: usize,
    base: &Base,
) -> Attempt {
    let kind = Kind::put(matches!(base, Base::Absent));
    let condition = match base {
        _ if !conditions_on(kind) => None,
        Base::Absent => Some(Condition::Absent),
        Base::Version { e_tag: Some(e), .. } => Some(Condition::ETag(e.clone())),
        Base::Version { .. } => None,
    };
    match az
        .put_whole(key, source, len, part_size as u64, condition.as_ref())
        .await
    {
        Ok((done, version)) => {
            if condition.is_some() {
                condition_taken(kind);
            }
            Attempt::Done(done.e_tag, version, len)
        }
        Err(AppendError::Changed { .. }) => Attempt::Conflict,
        Err(AppendError::Refused { message, .. }) => {
            tracing::warn!(%key, message, "the blocks of a whole upload were refused (a block another writer left uncommitted on the blob, its id of another length?): this version is written with one Put Blob, conditional as their commit was, which discards the blob's uncommitted blocks");
            put_once(store, location, key, source, len, base).await
        }
        Err(e) => Attempt::Failed(UploadError::Append {
            key: key.to_string(),
            message: e.to_string(),
        }),
    }
}

/// One PUT of the first `len` bytes of `source`, conditional on `base`.
async fn put_once(
    store: &Arc<dyn ObjectStore>,
    location: &ObjectPath,
    key: &str,
    source: &Beneath,
    len: u64,
    base: &Base,
) -> Attempt {
    let body = match read_prefix(source, len).await {
        Ok(b) => b,
        Err(e) => return Attempt::Failed(e),
    };
    let failed = |source| {
        Attempt::Failed(UploadError::Store {
            key: key.to_string(),
            source,
        })
    };
    let kind = Kind::put(matches!(base, Base::Absent));
    loop {
        let mode = match base {
            _ if !conditions_on(kind) => PutMode::Overwrite,
            Base::Absent => PutMode::Create,
            Base::Version {
                e_tag: None,
                version: None,
            } => PutMode::Overwrite,
            Base::Version { e_tag, version } => PutMode::Update(UpdateVersion {
                e_tag: e_tag.clone(),
                version: version.clone(),
            }),
        };
        let conditional = !matches!(mode, PutMode::Overwrite);
        let e = match store
            .put_opts(location, PutPayload::from(body.clone()), mode.into())
            .await
        {
            Ok(put) => {
                if conditional {
                    condition_taken(kind);
                }
                return Attempt::Done(put.e_tag, put.version, len);
            }
            Err(e) => e,
        };
        if !conditional {
            return failed(e);
        }
        if is_conflict(&e) {
            return Attempt::Conflict;
        }
        let failure = classify_store_error(&e);
        let (status, code) = store_error_answer(&e);
        if failure == Failure::Unsupported {
            refuse_conditions(kind, status, code.as_deref(), &e.to_string());
            continue;
        }
        if !may_refuse_conditions(failure, status) {
            return failed(e);
        }
        // 400 / 403: perhaps the condition, perhaps the write. Tried again with the condition
        // until the refusals have lasted; then the same write without it tells.
        match condition_refused(kind, key, status, code.as_deref(), &e.to_string()) {
            Refused::Fail => return failed(e),
            Refused::RetryAfter(pause) => {
                tokio::time::sleep(pause).await;
                continue;
            }
            Refused::SendWithout => {}
        }
        tracing::info!(%key, kind = kind.name(), error = %e, "conditional writes of this kind refused (400 / 403) for {}s (or {} times at shutdown): this one sent once more without its condition, to tell whether the store refuses the condition or the write", refusal_span().as_secs(), REFUSALS_TO_SWITCH);
        return match store
            .put_opts(
                location,
                PutPayload::from(body.clone()),
                PutMode::Overwrite.into(),
            )
            .await
        {
            Ok(put) => {
                refuse_conditions(kind, status, code.as_deref(), &e.to_string());
                Attempt::Done(put.e_tag, put.version, len)
            }
            Err(again) => {
                refusal_was_the_writes(kind);
                failed(again)
            }
        };
    }
}

/// A conditional write's answer that says the object is not the version it names: 412,
/// 304, 409 (`AlreadyExists` for a create), a missing object, or a condition the store could
/// not form from what was recorded (GCS needs the generation, S3 and Azure the ETag: read the
/// object to learn both).
fn is_conflict(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    match e {
        E::Precondition { .. }
        | E::AlreadyExists { .. }
        | E::NotModified { .. }
        | E::NotFound { .. } => true,
        E::Generic { source, .. } => {
            let t = source.to_string();
            t.contains("required for conditional")
        }
        _ => false,
    }
}

/// What the object holds now, against the version a write meant to write.
enum Now {
    /// Exactly the first `len` bytes of the source.
    Ours(ObjectMeta),
    /// Something else.
    Other(ObjectMeta),
    /// Nothing.
    Absent,
}

/// Reads what the object `key` holds now: its metadata, and when it has `len` bytes, its
/// bytes compared (by hash, streamed) with the first `len` bytes of `source`.
async fn now(
    store: &Arc<dyn ObjectStore>,
    location: &ObjectPath,
    key: &str,
    source: &Beneath,
    len: u64,
) -> Result<Now, UploadError> {
    let store_err = |source| UploadError::Store {
        key: key.to_string(),
        source,
    };
    let meta = match store.head(location).await {
        Ok(m) => m,
        Err(object_store::Error::NotFound { .. }) => return Ok(Now::Absent),
        Err(e) => return Err(store_err(e)),
    };
    if meta.size != len {
        return Ok(Now::Other(meta));
    }
    let opts = GetOptions {
        if_match: meta.e_tag.clone(),
        ..Default::default()
    };
    let got = match store.get_opts(location, opts).await {
        Ok(g) => g,
        // Changed again since the HEAD: the next write meets the new version and reads again.
        Err(object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }) => {
            return Ok(Now::Other(meta))
        }
        Err(e) => return Err(store_err(e)),
    };
    let mut theirs = xxhash_rust::xxh3::Xxh3Default::new();
    let mut read = 0u64;
    let mut stream = got.into_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(store_err)?;
        read += chunk.len() as u64;
        theirs.update(&chunk);
    }
    let path = source.path();
    let src = source.clone();
    let ours = tokio::task::spawn_blocking(move || -> std::io::Result<(u64, u64)> {
        let mut h = xxhash_rust::xxh3::Xxh3Default::new();
        let mut f = src.open()?.take(len);
        let mut buf = vec![0u8; 256 << 10];
        let mut n_all = 0u64;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            n_all += n as u64;
        }
        Ok((h.digest(), n_all))
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
    .map_err(|source| UploadError::Read { path, source })?;
    if read == len && ours == (theirs.digest(), len) {
        Ok(Now::Ours(meta))
    } else {
        Ok(Now::Other(meta))
    }
}
