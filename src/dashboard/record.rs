//! What the bucket holds, as far as the final poll's rule needs it, kept in the spool
//! directory (`dashboard-snapshots.json`): for the session being polled in this storage and
//! cluster (storage URL and history prefix), the list length and byte size of the last
//! snapshot stored for each URI.
//!
//! The final poll at SIGTERM never replaces a stored list with a shorter one. After a restart
//! this process has uploaded nothing, so it must know what an earlier run stored. Reading the
//! object back needs `s3:GetObject`, and on S3 without `s3:ListBucket` the GET of a key that
//! was never written answers 403, not 404: a read cannot tell "nothing stored" from "not
//! allowed". This record answers without a request to the bucket.
//!
//! It is written atomically (temp file, fsync, rename) BEFORE each upload that changes an
//! entry, growing or shrinking it (write-ahead, with the longer of the old and the new list,
//! marked uncertain: the bucket holds one of the two), and
//! after a poll with the figures each upload settled: the new snapshot's once it is stored;
//! the entry from before the upload when the store answered that it did not store it (a 4xx,
//! a local I/O error, no connection made, at the first attempt: a retried upload may have
//! landed on an earlier one); the longer of the two, marked uncertain, when no
//! answer proved either (a timeout, a connection cut after the request left, a 5xx, which a
//! gateway in front of the store may answer after the store took it), since that upload may
//! have landed or land yet. So a poll cut at the shutdown deadline or a kill -9 between an
//! upload and the end of its poll leaves a record at least as long as the bucket, and a
//! refused upload does not leave the record claiming a list the bucket never got (review
//! r41e D1, D2). An uncertain entry is an upper bound, not a proof: the final poll reads the
//! bucket for it rather than refusing a better answer against a list that may never have
//! been stored (review r41g D1, D2). A record that is missing, too
//! large, not of this shape or of another storage or cluster is not used (the final poll then
//! falls back to reading the bucket), never a reason not to start; one that cannot be written
//! is removed, so a restart reads the bucket rather than trusting a stale record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The record's file name in the spool directory.
pub const RECORD_FILE: &str = "dashboard-snapshots.json";

/// Most URIs recorded for a session: every datasets endpoint of the most jobs one poll asks
/// ([`super::MAX_JOBS_PER_POLL`]) plus the static and additional ones fits. A URI beyond it
/// is not recorded (the final poll reads the bucket for it, as without a record).
pub const MAX_RECORDED_SNAPSHOTS: usize = 16_384;

/// Largest record read at start: [`MAX_RECORDED_SNAPSHOTS`] entries of the longest URI
/// accepted ([`super::MAX_ENDPOINT_LEN`]) and their figures fit (about 9.5 MiB; a datasets URI
/// is some 40 bytes); a larger file is not one we wrote and is ignored.
pub const MAX_RECORD_BYTES: u64 = 16 << 20;

/// One snapshot stored in the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// Length of its list, when the endpoint has one.
    pub list_len: Option<usize>,
    /// Its size in bytes.
    pub bytes: usize,
    /// The figures come from an upload whose outcome is unknown (written ahead of it, or
    /// left by one whose answer never came): the bucket may hold them or less. The final
    /// poll reads the bucket for such an entry instead of trusting it (review r41g D1).
    /// Absent in records of earlier versions, which wrote every entry ahead as certain.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub uncertain: bool,
}

impl Recorded {
    /// The more cautious of two entries: the longer list and the larger size. Written before
    /// an upload, it holds whichever of the old and the new snapshot the bucket ends up with.
    /// Uncertain when either is, or when `other` (the upload's) differs from `self`, longer
    /// or shorter: then the bucket holds one of the two, and which is not known yet (a
    /// shrinking upload landed and then a kill -9 leaves the bucket shorter than `self`,
    /// review r41i D4).
    fn at_least(self, other: Recorded) -> Recorded {
        let list_len = match (self.list_len, other.list_len) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let bytes = self.bytes.max(other.bytes);
        Recorded {
            list_len,
            bytes,
            uncertain: self.uncertain
                || other.uncertain
                || other.list_len != self.list_len
                || other.bytes != self.bytes,
        }
    }
}

/// The file's content.
#[derive(Debug, Default, Serialize, Deserialize)]
struct OnDisk {
    /// Where the snapshots are stored: the storage URL and the cluster's history prefix. A
    /// record of another place (another `--storage`, `--cluster-name`, namespace or root) says
    /// nothing about this one. Absent in records of earlier versions: they start over.
    #[serde(default)]
    place: String,
    session: String,
    snapshots: BTreeMap<String, Recorded>,
}

/// The record and whether it changed since the last write.
#[derive(Debug, Default)]
struct State {
    data: OnDisk,
    dirty: bool,
}

/// The record of the session being polled, and where it is kept. Shared by the uploads of a
/// poll in flight: each writes its entry before its upload.
#[derive(Debug)]
pub struct SnapshotRecord {
    path: Option<PathBuf>,
    /// Where the snapshots of this process go (see [`OnDisk::place`]).
    place: String,
    state: std::sync::Mutex<State>,
    /// Held while the file is written, so a later write never lands before an earlier one.
    writing: tokio::sync::Mutex<()>,
}

impl SnapshotRecord {
    /// A record kept in memory only (no spool directory given).
    pub fn in_memory() -> Self {
        SnapshotRecord {
            path: None,
            place: String::new(),
            state: std::sync::Mutex::new(State::default()),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    /// Reads the record in `dir`; a missing file is an empty record, an unreadable one is
    /// logged and ignored. `place` names where this process stores its snapshots (storage URL
    /// and history prefix): a record of another place is not used.
    pub fn load(dir: &Path, place: &str) -> Self {
        let path = dir.join(RECORD_FILE);
        let data = match read(&path) {
            Ok(Some(d)) if d.place == place => d,
            Ok(Some(d)) => {
                tracing::info!(
                    recorded = %d.place,
                    now = %place,
                    "the record of stored dashboard snapshots is of another storage or cluster; it starts over"
                );
                OnDisk::default()
            }
            Ok(None) => OnDisk::default(),
            Err(why) => {
                tracing::warn!(
                    path = %path.display(),
                    %why,
                    "the record of stored dashboard snapshots is ignored; the final poll reads the bucket instead"
                );
                OnDisk::default()
            }
        };
        SnapshotRecord {
            path: Some(path),
            place: place.to_string(),
            state: std::sync::Mutex::new(State { data, dirty: false }),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves a consistent map (every change is one insert).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts over when `session` is not the recorded one.
    pub fn enter_session(&self, session: &str) {
        let mut st = self.state();
        if st.data.session != session || st.data.place != self.place {
            st.data = OnDisk {
                place: self.place.clone(),
                session: session.to_string(),
                snapshots: BTreeMap::new(),
            };
        }
    }

    /// What is recorded for `uri` in the current session.
    pub fn get(&self, uri: &str) -> Option<Recorded> {
        self.state().data.snapshots.get(uri).copied()
    }

    /// Sets (or, with `None`, removes) the entry of `uri` in `session`; false when the record
    /// is of another session, or full and `uri` not in it.
    fn set(
        &self,
        session: &str,
        uri: &str,
        entry: impl FnOnce(Option<Recorded>) -> Option<Recorded>,
    ) -> bool {
        let mut st = self.state();
        if st.data.session != session {
            return false;
        }
        let old = st.data.snapshots.get(uri).copied();
        if old.is_none() && st.data.snapshots.len() >= MAX_RECORDED_SNAPSHOTS {
            return false;
        }
        let new = entry(old);
        if old != new {
            match new {
                Some(new) => st.data.snapshots.insert(uri.to_string(), new),
                None => st.data.snapshots.remove(uri),
            };
            st.dirty = true;
        }
        true
    }

    /// Write-ahead, before `snapshot` is uploaded for `uri` in `session`: the entry becomes
    /// at least `snapshot` (the longer list of the old and the new, uncertain when they
    /// differ) and is written durably
    /// before this returns. A process killed during or after the upload leaves a record that
    /// covers what the bucket holds. Returns the entry as it was before, for
    /// [`Self::not_stored`]. When the record cannot be written (a full disk, a directory in
    /// its place) the file is removed, so a restart reads the bucket instead of trusting a
    /// stale record; an error means not even that worked, and the caller must not upload.
    /// Another session than the record's (the poller moved on) changes nothing.
    pub async fn before_upload(
        &self,
        session: &str,
        uri: &str,
        snapshot: Recorded,
    ) -> Result<Option<Recorded>, String> {
        let mut changed = false;
        let mut before = None;
        let recorded = self.set(session, uri, |old| {
            before = old;
            let new = match old {
                Some(o) => o.at_least(snapshot),
                None => Recorded {
                    uncertain: true,
                    ..snapshot
                },
            };
            changed = old != Some(new);
            Some(new)
        });
        if !recorded || !changed || self.path.is_none() {
            // Full or another session: the final poll reads the bucket for this URI.
            // Unchanged: what is on disk already covers the upload.
            return Ok(before);
        }
        let Err(why) = self.write().await else {
            return Ok(before);
        };
        match self.discard() {
            Ok(()) => {
                tracing::warn!(
                    %why,
                    "the record of stored dashboard snapshots could not be written; it is removed, a restart reads the bucket instead"
                );
                Ok(before)
            }
            Err(e) => Err(format!("{why}; removing it failed too: {e}")),
        }
    }

    /// Removes the record file, unless what is there is not a file (a directory: ignored when
    /// read, so as good as absent).
    fn discard(&self) -> std::io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => {
                std::fs::remove_file(path)?;
                match path.parent() {
                    Some(dir) => crate::util::fs::fsync_dir(dir),
                    None => Ok(()),
                }
            }
        }
    }

    /// Records the snapshot just stored for `uri` in `session`, exactly (it may be shorter
    /// than the entry written ahead); written by the next [`Self::save`].
    pub fn stored(&self, session: &str, uri: &str, snapshot: Recorded) {
        self.set(session, uri, |_| Some(snapshot));
    }

    /// The store answered that the upload for `uri` in `session` was not stored: the entry
    /// goes back to `before` (what [`Self::before_upload`] returned; none removes it), the
    /// bucket holding what it held. In memory until the next [`Self::save`]: the file stays
    /// the more cautious meanwhile.
    pub fn not_stored(&self, session: &str, uri: &str, before: Option<Recorded>) {
        self.set(session, uri, |_| before);
    }

    /// The upload of `snapshot` for `uri` in `session` got no answer (a timeout, a connection
    /// cut after the request left, a 5xx that does not prove the store refused it): it may
    /// have landed, or land yet, or not. The entry becomes the longer of `before` (what
    /// [`Self::before_upload`] returned) and `snapshot`, marked uncertain, so the final poll
    /// reads the bucket rather than refusing a better answer against a list that may never
    /// have been stored (review r41g D1). In memory until the next [`Self::save`].
    pub fn unknown(&self, session: &str, uri: &str, before: Option<Recorded>, snapshot: Recorded) {
        let entry = match before {
            Some(b) => b.at_least(snapshot),
            None => snapshot,
        };
        self.set(session, uri, |_| {
            Some(Recorded {
                uncertain: true,
                ..entry
            })
        });
    }

    /// Writes the record if it changed. A failure is logged: the record on disk stays as
    /// cautious as the last write-ahead left it.
    pub async fn save(&self) {
        if self.path.is_none() || !self.state().dirty {
            return;
        }
        if let Err(why) = self.write().await {
            tracing::warn!(%why, "the record of stored dashboard snapshots was not written");
        }
    }

    /// Writes the record as it is now (atomically: temp file, fsync, rename); the writes are
    /// serialised and each takes the state when its turn comes, so the file ends with the
    /// latest.
    async fn write(&self) -> Result<(), String> {
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        let _turn = self.writing.lock().await;
        let bytes = {
            let mut st = self.state();
            if !st.dirty {
                // A write that started after this change took it with it.
                return Ok(());
            }
            st.dirty = false;
            serde_json::to_vec(&st.data).map_err(|e| e.to_string())
        };
        let written = match bytes {
            Ok(bytes) => tokio::task::spawn_blocking(move || {
                crate::util::fs::write_atomically(&path, &bytes)
                    .map_err(|e| format!("{}: {e}", path.display()))
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r),
            Err(e) => Err(e),
        };
        if written.is_err() {
            self.state().dirty = true;
        }
        written
    }
}

/// The record at `path`: `None` when there is none, an error text when it is not usable.
fn read(path: &Path) -> Result<Option<OnDisk>, String> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(format!("larger than {MAX_RECORD_BYTES} bytes"));
    }
    let mut data: OnDisk = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if data.snapshots.len() > MAX_RECORDED_SNAPSHOTS {
        return Err(format!("more than {MAX_RECORDED_SNAPSHOTS} entries"));
    }
    if !crate::contract::is_safe_segment(&data.session) {
        data = OnDisk::default();
    }
    Ok(Some(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_record_survives_a_restart_and_a_corrupt_one_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let r = SnapshotRecord::load(dir.path(), "file:///b c1");
        r.enter_session("session_1");
        let pgs = Recorded {
            list_len: Some(3),
            bytes: 120,
            uncertain: false,
        };
        r.stored("session_1", "/pgs", pgs);
        r.save().await;
        let elsewhere = SnapshotRecord::load(dir.path(), "file:///b c2");
        elsewhere.enter_session("session_1");
        assert_eq!(elsewhere.get("/pgs"), None, "another place starts over");
        let again = SnapshotRecord::load(dir.path(), "file:///b c1");
        again.enter_session("session_1");
        assert_eq!(again.get("/pgs"), Some(pgs));
        again.enter_session("session_2");
        assert_eq!(again.get("/pgs"), None, "another session starts over");

        std::fs::write(dir.path().join(RECORD_FILE), b"{\"session\": 3").unwrap();
        let corrupt = SnapshotRecord::load(dir.path(), "file:///b c1");
        corrupt.enter_session("session_1");
        assert_eq!(corrupt.get("/pgs"), None);
    }

    #[tokio::test]
    async fn written_ahead_it_covers_the_longer_list_until_the_upload_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let r = SnapshotRecord::load(dir.path(), "p");
        r.enter_session("s");
        let five = Recorded {
            list_len: Some(5),
            bytes: 50,
            uncertain: false,
        };
        let two = Recorded {
            list_len: Some(2),
            bytes: 20,
            uncertain: false,
        };
        assert_eq!(r.before_upload("s", "/pgs", five).await.unwrap(), None);
        let on_disk = || {
            let again = SnapshotRecord::load(dir.path(), "p");
            again.enter_session("s");
            again.get("/pgs")
        };
        let uncertain = |r: Recorded| Recorded {
            uncertain: true,
            ..r
        };
        assert_eq!(
            on_disk(),
            Some(uncertain(five)),
            "durable before the upload, its outcome unknown"
        );
        r.stored("s", "/pgs", five);
        // A shorter list: until its upload is done the record keeps the longer one.
        assert_eq!(r.before_upload("s", "/pgs", two).await.unwrap(), Some(five));
        assert_eq!(on_disk(), Some(uncertain(five)), "not written since");
        r.stored("s", "/pgs", two);
        r.save().await;
        assert_eq!(on_disk(), Some(two));
    }

    #[tokio::test]
    async fn an_upload_the_store_refused_puts_the_entry_back() {
        let dir = tempfile::tempdir().unwrap();
        let r = SnapshotRecord::load(dir.path(), "p");
        r.enter_session("s");
        let on_disk = || {
            let again = SnapshotRecord::load(dir.path(), "p");
            again.enter_session("s");
            again.get("/pgs")
        };
        let three = Recorded {
            list_len: Some(3),
            bytes: 30,
            uncertain: false,
        };
        let five = Recorded {
            list_len: Some(5),
            bytes: 50,
            uncertain: false,
        };
        // Nothing stored, and the first upload refused: nothing is recorded (review r41e D2).
        let before = r.before_upload("s", "/pgs", three).await.unwrap();
        r.not_stored("s", "/pgs", before);
        assert_eq!(r.get("/pgs"), None);
        r.save().await;
        assert_eq!(on_disk(), None);
        // 3 stored, then 5 refused: back to 3 (review r41e D1).
        r.before_upload("s", "/pgs", three).await.unwrap();
        r.stored("s", "/pgs", three);
        let before = r.before_upload("s", "/pgs", five).await.unwrap();
        assert_eq!(
            on_disk(),
            Some(Recorded {
                uncertain: true,
                ..five
            }),
            "written ahead"
        );
        r.not_stored("s", "/pgs", before);
        assert_eq!(r.get("/pgs"), Some(three));
        r.save().await;
        assert_eq!(on_disk(), Some(three));
        // 5 without an answer (review r41g D1): the longer list, uncertain, so the final
        // poll reads the bucket for it.
        let before = r.before_upload("s", "/pgs", five).await.unwrap();
        r.unknown("s", "/pgs", before, five);
        assert_eq!(
            r.get("/pgs"),
            Some(Recorded {
                uncertain: true,
                ..five
            })
        );
        // Stored later: certain again.
        r.stored("s", "/pgs", three);
        assert_eq!(r.get("/pgs"), Some(three));
        r.save().await;
        // A shorter list without an answer: the longer figures stay, uncertain (the bucket
        // may hold either).
        let two = Recorded {
            list_len: Some(2),
            bytes: 20,
            uncertain: false,
        };
        let before = r.before_upload("s", "/pgs", two).await.unwrap();
        assert_eq!(
            on_disk(),
            Some(Recorded {
                uncertain: true,
                ..three
            }),
            "a shrinking upload is written ahead too: the bucket may end up shorter (r41i D4)"
        );
        r.unknown("s", "/pgs", before, two);
        assert_eq!(
            r.get("/pgs"),
            Some(Recorded {
                uncertain: true,
                ..three
            })
        );
        // An upload of an earlier session settling late changes nothing.
        r.enter_session("s2");
        r.stored("s", "/pgs", five);
        assert_eq!(r.get("/pgs"), None);
    }

    #[tokio::test]
    async fn a_record_that_cannot_be_written_does_not_stop_uploads() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(RECORD_FILE)).unwrap();
        let r = SnapshotRecord::load(dir.path(), "p");
        r.enter_session("s");
        let one = Recorded {
            list_len: Some(1),
            bytes: 1,
            uncertain: false,
        };
        r.before_upload("s", "/pgs", one).await.unwrap();
    }

    #[test]
    fn the_record_is_bounded() {
        let r = SnapshotRecord::in_memory();
        r.enter_session("s");
        let one = Recorded {
            list_len: Some(1),
            bytes: 1,
            uncertain: false,
        };
        for i in 0..MAX_RECORDED_SNAPSHOTS + 5 {
            r.stored("s", &format!("/u{i}"), one);
        }
        assert_eq!(r.state().data.snapshots.len(), MAX_RECORDED_SNAPSHOTS);
        assert_eq!(r.get(&format!("/u{MAX_RECORDED_SNAPSHOTS}")), None);
    }
}
