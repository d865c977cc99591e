//! One publication: the object of a segment brought to the segment's first `durable` bytes
//! ([`Publisher::publish`]): the new bytes compressed as whole gzip members onto the
//! shadow, then the object grown in place (`UploadPartCopy` plus a part, a new block
//! committed after the blob's on Azure, a part composed onto the object on GCS, a
//! conditional PUT, or a local copy renamed over it) or uploaded whole when it is not what
//! the record says,
//! and the record written after the object holds what it says. Every version a reader can
//! see is whole members of whole lines, a prefix of the next.

use std::path::{Path, PathBuf};

use crate::events::object::{gzip_level, object_key};
use crate::events::spool::{FileKind, SealedFile, GROWTH_DIR};
use crate::metrics as m;
use crate::storage::append::{AppendError, Appender};
use crate::storage::gzip::{MemberEncoder, MEMBER_INPUT};
use crate::storage::put::UploadError;
use crate::storage::versioned::{write_version, Base};
use crate::util::fs::Beneath;

use super::keys::stale_keys;
use super::records::write_record;
use super::shadow::{check_line_end, extend_shadow, CopyAccount, CopyJob};
use super::{lock, Ahead, PublishError, Publisher, Record, State, ROUND_BUDGET_KIB};

impl Publisher {
    /// Brings the object of `segment` to its first `durable` bytes; the bytes sent, `None`
    /// when nothing was new (no request).
    pub(super) async fn publish(
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
            earlier_run: false,
        };
        let cfg = self.cfg_for(st.record.as_ref(), &file);
        let key = object_key(&cfg, &file);
        let gzip = gzip_level(&cfg, &file);
        // A key deleted earlier as another layout's and written again now (a switch back)
        // is this run's from here on: no longer looked at for late writes (`late`).
        self.late.claim(&key).await;
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
        let version = st.record.as_ref().and_then(|r| r.version.clone());
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
                    result = Some((new_len - from, done.e_tag, None));
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
                .grow(
                    &key,
                    &source,
                    from,
                    new_len,
                    e_tag.as_deref(),
                    version.as_deref(),
                    crate::util::pace::Flow::default(),
                )
                .await
            {
                Ok(done) => {
                    m::publication("append", done.bytes);
                    result = Some((new_len - from, done.e_tag, done.version));
                }
                Err(AppendError::Changed { why, .. }) => {
                    tracing::warn!(%key, why, "the object is not as last published; uploading it whole");
                }
                Err(AppendError::Refused { message, .. }) if a.appends_on() => {
                    tracing::warn!(%key, message, "the store refused to append; uploading the object whole");
                }
                Err(AppendError::Refused { message, .. }) => {
                    // Appends turned off on the store by this refusal or one in parallel
                    // (said once, where it was decided).
                    tracing::debug!(%key, message, "appends are off on this store; uploading the object whole");
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
            Some(done) => done,
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
}

fn permits(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024))
        .unwrap_or(u32::MAX)
        .clamp(1, ROUND_BUDGET_KIB)
}
