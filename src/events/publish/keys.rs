//! Which key a segment's object is under, and the keys it was under before: the settings a
//! segment keeps across a restart with another `--compression` ([`Publisher::cfg_for`],
//! [`Publisher::cfg_unrecorded`]), so no object ever needs deleting for a switch, and the
//! deletion of objects under earlier keys of another layout once the new one holds what
//! they held ([`Publisher::delete_stale`]); a delete the store refuses for good is not
//! tried again.

use std::path::Path;
use std::sync::Arc;

use object_store::ObjectStoreExt;

use crate::events::object::{object_key, Compression, UploaderConfig};
use crate::events::spool::{FileKind, SealedFile};
use crate::metrics as m;
use crate::storage::put::UploadError;

use super::records::write_record;
use super::{Publisher, Record, State};

impl Publisher {
    /// Deletes the objects the record names as published under earlier keys
    /// ([`Record::stale`]); the record is rewritten without those that are gone. Called only
    /// once the object under the record's key holds at least what they held.
    pub(super) async fn delete_stale(
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
    pub(super) async fn delete_keys(&self, keys: &[String]) -> (Vec<String>, Option<UploadError>) {
        let mut left = Vec::new();
        let mut failed = None;
        let mut deleted = Vec::new();
        for key in keys {
            let result = match object_store::path::Path::parse(key) {
                Ok(p) => self.store.delete(&p).await,
                // Not a key the store can name: nothing was ever published under it.
                Err(_) => Ok(()),
            };
            match result {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    tracing::info!(%key, "deleted the object published under the earlier key");
                    deleted.push(key.clone());
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
        // A write of the earlier run may still land there: looked at again (`late`).
        self.late.deleted(&deleted).await;
        (left, failed)
    }

    /// The settings `f` is published and uploaded with: this run's, unless its record names
    /// the key the other `--compression` gives it (an earlier run published it, or recorded
    /// it before uploading it whole): then that compression. So a segment keeps its key and
    /// compression across a restart with another `--compression` (only segments without a
    /// record take the new setting) and no object of it ever needs deleting: the S3
    /// permissions docs/storage.md documents have no `s3:DeleteObject` (the review r35h found
    /// the switch's delete refused with 403 and retried forever, the segments kept in the
    /// spool and SIGTERM exiting 3).
    pub(super) fn cfg_for(&self, record: Option<&Record>, f: &SealedFile) -> Arc<UploaderConfig> {
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
    pub(super) async fn cfg_unrecorded(
        &self,
        f: &SealedFile,
    ) -> Result<Arc<UploaderConfig>, UploadError> {
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
}

/// The keys a segment's objects were published under that are not `key`: the record's
/// earlier ones and, if it names another, its own.
pub(super) fn stale_keys(record: Option<&Record>, key: &str) -> Vec<String> {
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
