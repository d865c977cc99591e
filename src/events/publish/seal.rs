//! The end of a segment's publication: at its seal, the last bytes published to the same
//! key (or the segment uploaded whole when the publication cannot continue, or it never had
//! one, its key recorded first), the earlier keys deleted and the growth state forgotten
//! ([`Publisher::seal`]); once the uploader has deleted the segment, its record goes too
//! ([`Publisher::uploaded`]).

use std::fs::{self};
use std::io::{self};
use std::sync::Arc;

use crate::events::object::{object_key, upload_file};
use crate::events::spool::{FileKind, SealedFile};
use crate::storage::put::UploadError;

use super::keys::stale_keys;
use super::{PublishError, Publisher, Record};

impl Publisher {
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
                self.late.claim(&key).await;
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
}
