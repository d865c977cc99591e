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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
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

/// The keys deleted under an earlier key, watched for late writes (see the module doc).
pub struct LateDeletes {
    path: PathBuf,
    entries: AsyncMutex<Vec<Entry>>,
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
            entries: AsyncMutex::new(entries),
            until: unix_seconds() + LATE_WRITE_HORIZON.as_secs(),
        }
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
        let mut entries = self.entries.lock().await;
        for key in keys {
            match entries.iter_mut().find(|e| &e.key == key) {
                Some(e) => e.until = e.until.max(self.until),
                None => entries.push(Entry {
                    key: key.clone(),
                    until: self.until,
                }),
            }
        }
        if entries.len() > MAX_KEYS {
            let over = entries.len() - MAX_KEYS;
            entries.drain(..over);
        }
        self.save(&entries);
    }

    /// This run is about to write under `key`: it is no longer watched (an object there
    /// from now on may be this run's).
    pub async fn claim(&self, key: &str) {
        let mut entries = self.entries.lock().await;
        if let Some(i) = entries.iter().position(|e| e.key == key) {
            entries.remove(i);
            self.save(&entries);
        }
    }

    /// Looks at every key watched: an object there again (a late write landed) is deleted
    /// again; a key past its time is dropped after this look. The lock is held only for a
    /// delete (so a key claimed meanwhile is never deleted), not for the looks.
    pub async fn check(&self, store: &Arc<dyn ObjectStore>) {
        let watched: Vec<Entry> = self.entries.lock().await.clone();
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
                Ok(meta) => {
                    let entries = self.entries.lock().await;
                    if !entries.iter().any(|w| w.key == e.key) {
                        // Claimed meanwhile: this run's object now.
                        continue;
                    }
                    let deleted = store.delete(&location).await;
                    drop(entries);
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
            }
        }
        if !done.is_empty() {
            let mut entries = self.entries.lock().await;
            entries.retain(|w| !(done.contains(&w.key) && w.until < now));
            self.save(&entries);
        }
    }

    fn save(&self, entries: &[Entry]) {
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
        if let Err(e) = result {
            tracing::warn!(path = %self.path.display(), error = %e, "could not record the keys deleted under an earlier key; a restart does not watch them for late writes");
        }
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
}
