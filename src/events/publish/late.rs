//! Objects deleted under an earlier key that a late write of a killed run could bring back
//! ([`LateDeletes`]). A segment published under another layout's key (another
//! `--storage-root-dir` or `--prefix`, an older version's record) is written whole under the
//! new key and its object under the earlier key deleted (`keys::delete_stale`). A write of
//! the earlier run to that earlier key may still be on its way (a create held by the
//! network when the run was killed): it meets no object there after the delete, so its
//! `If-None-Match: *` holds and it lands, and the segment's lines are stored twice, once
//! under each root (review r35r D3, r35k D1: 100 of 200 events twice).
//!
//! So each key deleted that way is kept here, in `<spool>/stale-keys.json` (written
//! atomically; it survives restarts), with the time until which a write of an earlier run
//! can still land: this run's start plus [`LATE_WRITE_HORIZON`] (every earlier run ended
//! before this one started: one process holds the spool). Every [`LATE_CHECK_EVERY`] (more
//! spread out as more keys are watched: [`LATE_CHECK_PER_KEY`]) each key is looked at (HEAD) and, when an object is there again, deleted again; once past its
//! time and checked once more, it is dropped. A key this run is about to write under
//! ([`LateDeletes::claim`]) is dropped first, under the same lock the check holds, so the
//! check never deletes an object this run wrote.
//!
//! What bounds the horizon: S3 (and S3-compatible stores that check SigV4) refuses a request
//! whose signature time is more than 15 minutes from its own clock, so no request of a run
//! that ended before this one started lands later than 15 minutes after that start (a
//! minute more for clocks). Azure's Shared Key requests carry the same 15-minute limit. GCS
//! requests carry a bearer token (up to an hour): a write held longer than the horizon
//! there is not caught (documented in docs/guarantees.md). Until the next check, a late
//! write that landed is visible beside the new object.
//!
//! A store that answers the HEAD of a missing key 403 (S3 without `s3:ListBucket`) tells
//! nothing by its looks: such a key is deleted once, when its time is past (a DELETE is
//! allowed: the key was deleted before; one, not one per look, so a versioned bucket gets one
//! delete marker, review r35t D2), which removes a late write that landed meanwhile (no WARN:
//! nothing tells whether one did). A key is dropped [`GIVE_UP_AFTER`] past its time whatever
//! its looks answered, so no key is watched for good (review r35s D2: past-due keys looked at
//! three times a second forever).
//!
//! The keys are indexed (a claim, done at every seal, looks one key up, not the list) and the
//! file is saved at most once per [`SAVE_EVERY`] (or ten times the last save's duration), the
//! rest by [`LateDeletes::flush`] at the end of the publisher's run and of the shutdown's
//! drain (review r35s D3: with 100,000 keys watched, a save and an fsync of the whole file per
//! segment made a layout switch of 100 partitions take 60 s). A kill -9 between a delete and
//! the next save loses at most that second's keys from the watch. The list's lock is never
//! held across a request: a delete holds only [`LateDeletes::deleting`], which a claim waits
//! for only when its key is watched (review r35t D1: a delete held 20 s under the list's lock
//! held the publisher's rounds and the shutdown's flush as long).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use std::sync::Mutex;

use tokio::sync::Mutex as AsyncMutex;

use crate::util::time::unix_seconds;

/// How long after a run's start a write of an earlier run may still land (see the module
/// doc): S3's 15-minute limit on a request's signature time, plus a minute for clocks.
pub const LATE_WRITE_HORIZON: Duration = Duration::from_secs(16 * 60);

/// How often the keys deleted under an earlier key are looked at again (one HEAD each), at
/// most: a late write that landed is visible beside the new object until the next look, so
/// the looks are frequent while few keys are watched (one key costs about 1,000 HEADs over
/// the horizon), and spread as more are ([`LATE_CHECK_PER_KEY`]).
pub const LATE_CHECK_EVERY: Duration = Duration::from_secs(1);

/// The least time between two looks, per key watched: at most 20 HEADs a second on
/// average, so a switch of a spool of 5,000 segments looks at each every 250 s.
pub const LATE_CHECK_PER_KEY: Duration = Duration::from_millis(50);

/// How long past its time a key is dropped whatever its looks answered (a store that
/// refuses both the HEAD and the DELETE, say): it was looked at for the whole horizon.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(10 * 60);

/// The least time between two saves of the file (more when a save takes long: ten times
/// its duration); changes meanwhile are saved by the next save or [`LateDeletes::flush`].
pub const SAVE_EVERY: Duration = Duration::from_secs(1);

/// The file, under the spool directory.
pub const FILE: &str = "stale-keys.json";

/// At most so many keys are kept (a switch of a spool holding more segments than this
/// checks the oldest ones only; each entry is a key of about 150 bytes).
const MAX_KEYS: usize = 100_000;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Entry {
    key: String,
    /// Unix seconds until which a late write may land under it.
    until: u64,
}

/// The keys watched, in the order they were added, with an index of their keys.
#[derive(Default)]
struct Watched {
    entries: Vec<Entry>,
    keys: HashSet<String>,
    /// Changed since the last save.
    dirty: bool,
    /// When the last save ended, and how long it took.
    saved: Option<(Instant, Duration)>,
}

impl Watched {
    fn new(entries: Vec<Entry>) -> Watched {
        let keys = entries.iter().map(|e| e.key.clone()).collect();
        Watched {
            entries,
            keys,
            dirty: false,
            saved: None,
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) {
        let keys = &mut self.keys;
        self.entries.retain(|e| {
            let kept = keep(e);
            if !kept {
                keys.remove(&e.key);
            }
            kept
        });
    }
}

/// The keys deleted under an earlier key, watched for late writes (see the module doc).
pub struct LateDeletes {
    path: PathBuf,
    /// The list; its lock is never held across an await.
    entries: Mutex<Watched>,
    /// Held across a delete of a watched key, and by a claim of a watched key, so a key
    /// claimed meanwhile is never deleted.
    deleting: AsyncMutex<()>,
    /// Unix seconds of this run's start plus the horizon.
    until: u64,
    /// How many keys are watched (read by the publisher's loop without the lock).
    watched: std::sync::atomic::AtomicUsize,
}

impl LateDeletes {
    /// Loads `<spool_dir>/stale-keys.json` (none, or unreadable: no key is watched; a
    /// warning for the latter).
    pub fn load(spool_dir: &Path) -> LateDeletes {
        let path = spool_dir.join(FILE);
        let entries: Vec<Entry> = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), error = %e, "could not read the keys deleted under an earlier key; they are not watched for late writes");
                Vec::new()
            }),
            Err(_) => Vec::new(),
        };
        LateDeletes {
            path,
            watched: entries.len().into(),
            entries: Mutex::new(Watched::new(entries)),
            deleting: AsyncMutex::new(()),
            until: unix_seconds() + LATE_WRITE_HORIZON.as_secs(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watched> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long after the last [`LateDeletes::check`] the next one is due.
    pub fn every(&self) -> Duration {
        let n = self.watched.load(std::sync::atomic::Ordering::Relaxed) as u32;
        LATE_CHECK_EVERY.max(LATE_CHECK_PER_KEY.saturating_mul(n))
    }

    /// `keys` were deleted under an earlier key: watched until this run's horizon.
    pub async fn deleted(&self, keys: &[String]) {
        if keys.is_empty() {
            return;
        }
        let mut w = self.lock();
        let mut new = false;
        for key in keys {
            if w.keys.contains(key) {
                if let Some(e) = w.entries.iter_mut().find(|e| &e.key == key) {
                    e.until = e.until.max(self.until);
                }
            } else {
                w.keys.insert(key.clone());
                w.entries.push(Entry {
                    key: key.clone(),
                    until: self.until,
                });
                new = true;
            }
        }
        if w.entries.len() > MAX_KEYS {
            let over = w.entries.len() - MAX_KEYS;
            for e in w.entries.drain(..over).collect::<Vec<_>>() {
                w.keys.remove(&e.key);
            }
        }
        if new {
            w.dirty = true;
        }
        self.save_soon(&mut w);
    }

    /// This run is about to write under `key`: it is no longer watched (an object there
    /// from now on may be this run's).
    pub async fn claim(&self, key: &str) {
        if !self.lock().keys.contains(key) {
            return;
        }
        // A delete of it under way ends first.
        let _deleting = self.deleting.lock().await;
        let mut w = self.lock();
        if w.keys.remove(key) {
            w.entries.retain(|e| e.key != key);
            w.dirty = true;
            self.save_soon(&mut w);
        }
    }

    /// Saves the changes not saved yet when the last save is old enough (the publisher's
    /// rounds call this).
    pub fn save_if_due(&self) {
        let mut w = self.lock();
        self.save_soon(&mut w);
    }

    /// Saves the file now if anything changed since its last save (the end of the
    /// publisher's run and of the shutdown's drain).
    pub fn flush(&self) {
        let mut w = self.lock();
        if w.dirty {
            self.save(&mut w);
        }
    }

    /// Deletes `location` if `key` is still watched (not claimed meanwhile); `None` when it
    /// was claimed.
    async fn delete_watched(
        &self,
        store: &Arc<dyn ObjectStore>,
        key: &str,
        location: &object_store::path::Path,
    ) -> Option<object_store::Result<()>> {
        let _deleting = self.deleting.lock().await;
        if !self.lock().keys.contains(key) {
            return None;
        }
        Some(store.delete(location).await)
    }

    /// Looks at every key watched: an object there again (a late write landed) is deleted
    /// again; a key past its time is dropped after this look. A delete waits for no claim
    /// and a claim of a watched key waits for the delete ([`Self::deleting`]), so a key
    /// claimed meanwhile is never deleted.
    pub async fn check(&self, store: &Arc<dyn ObjectStore>) {
        let watched: Vec<Entry> = self.lock().entries.clone();
        if watched.is_empty() {
            return;
        }
        tracing::debug!(
            keys = watched.len(),
            "looking at the keys deleted under an earlier key, for late writes"
        );
        let now = unix_seconds();
        let mut done = Vec::new();
        for e in watched {
            let Ok(location) = object_store::path::Path::parse(&e.key) else {
                done.push(e.key);
                continue;
            };
            let gone = match store.head(&location).await {
                Err(object_store::Error::NotFound { .. }) => true,
                Err(err) if super::keys::delete_refused(&err) => {
                    // A HEAD answered 403 (no `s3:ListBucket`) tells nothing: once its time
                    // is past, the key is deleted once, which removes a late write that
                    // landed meanwhile.
                    if now <= e.until {
                        false
                    } else {
                        match self.delete_watched(store, &e.key, &location).await {
                            None => continue,
                            Some(Ok(()) | Err(object_store::Error::NotFound { .. })) => true,
                            Some(Err(err)) => {
                                tracing::debug!(key = %e.key, error = %err, "could not delete a key deleted under an earlier layout whose HEAD was refused; looked at again");
                                false
                            }
                        }
                    }
                }
                Ok(meta) => {
                    let Some(deleted) = self.delete_watched(store, &e.key, &location).await else {
                        // Claimed meanwhile: this run's object now.
                        continue;
                    };
                    match deleted {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                            tracing::warn!(key = %e.key, size = meta.size, "a write of an earlier run landed under a key already deleted for another layout (a late write): deleted again, the segment's lines are under the new key");
                            true
                        }
                        Err(err) => {
                            tracing::warn!(key = %e.key, error = %err, "could not delete again an object a late write left under an earlier key; tried again");
                            false
                        }
                    }
                }
                Err(err) => {
                    tracing::debug!(key = %e.key, error = %err, "could not look at a key deleted under an earlier layout; looked at again");
                    false
                }
            };
            if gone && now > e.until {
                done.push(e.key);
            } else if now > e.until.saturating_add(GIVE_UP_AFTER.as_secs()) {
                tracing::warn!(key = %e.key, "a key deleted under an earlier layout could not be looked at since its time passed; no longer watched");
                done.push(e.key);
            }
        }
        if !done.is_empty() {
            let done: HashSet<String> = done.into_iter().collect();
            let mut w = self.lock();
            w.retain(|e| !(done.contains(&e.key) && e.until < now));
            w.dirty = true;
            self.save(&mut w);
        }
    }

    /// Saves when the last save is old enough ([`SAVE_EVERY`], or ten times its duration);
    /// otherwise the change waits for the next save or [`LateDeletes::flush`].
    fn save_soon(&self, w: &mut Watched) {
        self.watched
            .store(w.entries.len(), std::sync::atomic::Ordering::Relaxed);
        let due = w
            .saved
            .is_none_or(|(at, took)| at.elapsed() >= SAVE_EVERY.max(took.saturating_mul(10)));
        if w.dirty && due {
            self.save(w);
        }
    }

    fn save(&self, w: &mut Watched) {
        let started = Instant::now();
        let entries = &w.entries;
        self.watched
            .store(entries.len(), std::sync::atomic::Ordering::Relaxed);
        let result = if entries.is_empty() {
            match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            crate::util::fs::write_json_atomically(&self.path, &entries)
        };
        if let Err(e) = &result {
            tracing::warn!(path = %self.path.display(), error = %e, "could not record the keys deleted under an earlier key; a restart does not watch them for late writes");
        }
        // A failed save is tried again by the next one.
        w.dirty = result.is_err();
        w.saved = Some((Instant::now(), started.elapsed()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::PutPayload;

    #[tokio::test]
    async fn a_late_write_is_deleted_again_and_a_claimed_key_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let put = |k: &'static str| {
            let store = store.clone();
            async move {
                store
                    .put(&object_store::path::Path::from(k), PutPayload::from("x"))
                    .await
                    .unwrap();
            }
        };
        let exists = |k: &'static str| {
            let store = store.clone();
            async move { store.head(&object_store::path::Path::from(k)).await.is_ok() }
        };
        let late = LateDeletes::load(dir.path());
        late.deleted(&["rootA/k1".into(), "rootA/k2".into()]).await;
        // Survives a restart.
        let late = LateDeletes::load(dir.path());
        put("rootA/k1").await;
        put("rootA/k2").await;
        late.claim("rootA/k2").await;
        late.check(&store).await;
        assert!(!exists("rootA/k1").await, "the late write stayed");
        assert!(exists("rootA/k2").await, "a claimed key was deleted");
        // Still watched before its time.
        put("rootA/k1").await;
        late.check(&store).await;
        assert!(!exists("rootA/k1").await);
        assert!(dir.path().join(FILE).exists());
    }

    /// Many keys watched: each further change is saved at most once per [`SAVE_EVERY`], the
    /// rest by `flush` (review r35s D3: a save of the whole file per segment).
    #[tokio::test]
    async fn changes_are_saved_at_most_once_a_second_and_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let late = LateDeletes::load(dir.path());
        late.deleted(&["k0".into()]).await;
        let first = std::fs::read(dir.path().join(FILE)).unwrap();
        for i in 1..100 {
            late.deleted(&[format!("k{i}")]).await;
            late.claim(&format!("k{}", i - 1)).await;
        }
        assert_eq!(std::fs::read(dir.path().join(FILE)).unwrap(), first);
        late.flush();
        let again = LateDeletes::load(dir.path());
        let w = again.lock();
        assert_eq!(w.entries.len(), 1);
        assert_eq!(w.entries[0].key, "k99");
        assert!(w.keys.contains("k99"));
    }
}
