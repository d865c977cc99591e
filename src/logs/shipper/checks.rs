//! The ledger against the file and the bucket: whether a file still holds the bytes the
//! ledger recorded (so only its new bytes need to go), whether an append can go (appends on,
//! the object's size within what the store appends to), what appends cost in this bucket, and
//! a few entries each round checked with a HEAD ([`VERIFY_PER_ROUND`]) so an object the
//! bucket lost or someone overwrote is uploaded again. The checks run beside the rounds (at
//! most [`VERIFY_PER_ROUND`] at once, each within its deadline, tried again with a longer
//! one when it runs out): a round takes the outcomes of those that ended and never waits
//! for a HEAD, so a store whose HEADs hang holds up no log.

use std::time::Instant;

use futures::FutureExt;
use object_store::ObjectStoreExt;

use crate::logs::gate::{AppendGate, Change};
use crate::logs::lane::Pass;
use crate::logs::ledger::LedgerEntry;
use crate::logs::placement::SessionObjects;
use crate::logs::scan::LogFile;
use crate::metrics as m;
use crate::storage::put::{head_hash, read_marks, window_hash};

use super::LogShipper;

/// The deadline of a check that a ledger entry's object is still in the bucket (a `HEAD`)
/// when it starts; one that runs out is started again with twice its deadline, up to
/// [`LEDGER_RETRY_CAP`]. The checks run beside the rounds: no round waits for one.
const LEDGER_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// The longest deadline of a check tried again (it doubles from twice
/// [`LEDGER_CHECK_TIMEOUT`] each time it runs out).
const LEDGER_RETRY_CAP: std::time::Duration = std::time::Duration::from_secs(120);

/// A check of a ledger entry running beside the rounds (a `HEAD` within its deadline); its
/// outcome is taken at the next round after it ended. Aborted when dropped.
pub(super) struct Check {
    key: String,
    /// The ledger's entry when the check started: an answer is of use only while it is the
    /// same (review r42u D1: a late 404 of a check started before the key's upload sent the
    /// file again and warned of a loss that was not there).
    entry: Option<LedgerEntry>,
    deadline: std::time::Duration,
    head: tokio::task::JoinHandle<Result<object_store::Result<object_store::ObjectMeta>, ()>>,
}

impl Drop for Check {
    fn drop(&mut self) {
        self.head.abort();
    }
}

/// Ledger entries checked with a HEAD each round, in turn, and the checks running at once at
/// most (counting those tried again): a file the ledger calls uploaded but the bucket lost
/// (emptied, expired by a lifecycle rule) is uploaded again within
/// `ledger size / VERIFY_PER_ROUND` rounds, for a few cheap requests per round.
const VERIFY_PER_ROUND: usize = 8;

/// What the answer to a check of a ledger entry means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The object is there, of the ledger's size (or the answer came too late to say).
    Fine,
    /// The bucket lost the object: the file is uploaded again.
    Lost,
    /// The object's size is not the ledger's (overwritten): the file is uploaded again.
    Overwritten,
    /// The answer would say the object is lost or overwritten, but the ledger's entry is not
    /// the one the check started with, or a send of the key runs: not taken.
    Late,
}

/// The verdict on a check's answer, `Ok(Some(size))` the object's size, `Ok(None)` not
/// found: taken only while the ledger's entry `now` is `started` (the entry when the check
/// began) and no send of the key runs (`sending`), for a 404 and for a size alike (a whole
/// upload of a file that shrank makes the object shorter while it runs, and one that ended
/// changed the entry).
fn verdict(
    now: Option<&LedgerEntry>,
    started: Option<&LedgerEntry>,
    sending: bool,
    found: Option<u64>,
) -> Verdict {
    let Some(entry) = now else {
        // Gone from the ledger already: nothing to take.
        return Verdict::Fine;
    };
    let wrong = match found {
        None => Verdict::Lost,
        Some(size) if size != entry.size => Verdict::Overwritten,
        Some(_) => return Verdict::Fine,
    };
    if started == Some(entry) && !sending {
        wrong
    } else {
        Verdict::Late
    }
}

/// Up to `n` ledger keys to check next, in the ledger's order after `cursor`, wrapping around
/// to the start, none twice and none `busy` (a check of it still runs).
fn next_keys<'a>(
    keys: impl Iterator<Item = &'a String> + Clone,
    cursor: Option<&str>,
    busy: impl Fn(&str) -> bool,
    n: usize,
) -> Vec<String> {
    let after = |k: &&String| cursor.is_none_or(|c| k.as_str() > c);
    let mut out: Vec<String> = keys
        .clone()
        .filter(after)
        .filter(|k| !busy(k))
        .take(n)
        .cloned()
        .collect();
    if out.len() < n {
        let more: Vec<String> = keys
            .filter(|k| !after(k))
            .filter(|k| !busy(k))
            .take(n - out.len())
            .cloned()
            .collect();
        out.extend(more);
    }
    out
}

impl LogShipper {
    /// True when the file still has every byte the ledger recorded before `p.size`: same
    /// inode and the same hash of all of them ([`LedgerEntry::full`]; one read of `p.size`
    /// bytes). For a file whose size and mtime no longer say it is unchanged while its size
    /// is the object's (touched, or rewritten with as many bytes). Without that hash (a
    /// ledger before version 5), [`Self::file_still_matches`].
    pub(super) async fn file_still_whole(&self, f: &LogFile, p: &LedgerEntry) -> bool {
        let Some(want) = p.full else {
            return self.file_still_matches(f, p).await;
        };
        if p.ino != 0 && p.ino != f.ino {
            return false;
        }
        let file = f.file.clone();
        let size = p.size;
        let read = tokio::task::spawn_blocking(move || read_marks(&file, size, size)).await;
        m::log_bytes_read(size);
        matches!(read, Ok(Ok(Some(marks))) if marks.all.full == want)
    }

    /// True when the file still looks like the bytes the ledger recorded before `p.size`
    /// (same inode, same hash of the window before that point, and the same head where the
    /// ledger has its hash: a file truncated and rewritten with another head is another
    /// file, however alike their later bytes). A cheap look (128 KiB read), not a proof:
    /// an append it lets through is checked byte for byte after it ran (`lane`).
    async fn file_still_matches(&self, f: &LogFile, p: &LedgerEntry) -> bool {
        if p.ino != 0 && p.ino != f.ino {
            return false;
        }
        if !self.head_matches(f, p).await {
            return false;
        }
        let file = f.file.clone();
        let size = p.size;
        match tokio::task::spawn_blocking(move || window_hash(&file, size)).await {
            Ok(Ok((hash, whole))) => {
                m::log_bytes_read(size.min(crate::storage::put::WINDOW));
                whole && hash == p.hash
            }
            _ => false,
        }
    }

    /// False when the ledger has the hash of the file's head at its upload and the file's
    /// first bytes are no longer those (see [`LedgerEntry::head`]); true without a hash (a
    /// ledger written before version 4).
    pub(super) async fn head_matches(&self, f: &LogFile, p: &LedgerEntry) -> bool {
        let Some(want) = p.head else {
            return true;
        };
        let file = f.file.clone();
        let size = p.size;
        match tokio::task::spawn_blocking(move || head_hash(&file, size)).await {
            Ok(Ok((hash, whole))) => {
                m::log_bytes_read(size.min(crate::storage::put::HEAD));
                whole && hash == want
            }
            _ => false,
        }
    }

    /// The key a rotated backup was uploaded under before, when the file still begins with
    /// what that object holds (see [`crate::logs::placement`]); `None` for a live file or a backup
    /// never uploaded.
    pub(super) async fn backup_key(
        &self,
        placed: &SessionObjects,
        node: &str,
        f: &LogFile,
    ) -> Option<String> {
        let live = f.rotated_from.as_deref()?;
        let keys = placed.backup_keys(node, live, f.ino);
        // Unchanged since its upload: no need to read it.
        for k in keys.iter().rev() {
            if let Some(p) = self.ledger.data.objects.get(k) {
                if p.size == f.size && p.mtime_ns == f.mtime_ns {
                    return Some(k.clone());
                }
            }
        }
        for k in keys.iter().rev() {
            if let Some(p) = self.ledger.data.objects.get(k) {
                if p.size <= f.size && self.file_still_matches(f, p).await {
                    return Some(k.clone());
                }
            }
        }
        None
    }

    /// Once per node id: what appends cost in this bucket (a versioned bucket turns them
    /// off) and the cleanup of incomplete uploads an earlier run left under the node.
    pub(super) async fn prepare_appends(&mut self, node: &str) {
        let Some(app) = &self.cfg.appender else {
            return;
        };
        // The cleanup runs whatever the log settings; the versioning matters to appends.
        if !self.prepared_nodes.insert(node.to_string()) {
            return;
        }
        let first = self.prepared_nodes.len() == 1;
        let p = app.prepare(&self.prefix, node).await;
        if p.aborted > 0 || p.abort_failed > 0 {
            tracing::info!(
                aborted = p.aborted,
                failed = p.abort_failed,
                node,
                "incomplete multipart uploads of an earlier run cleaned up"
            );
        }
        // `Suspended` replaces the `null` version instead of keeping it: appends cost
        // nothing extra there (see `storage::append`).
        if let Some(status) = p
            .versioned
            .filter(|s| first && self.cfg.appends && s.as_str() == "Enabled")
        {
            self.gate().set_versioned();
            tracing::warn!(
                versioning = %status,
                "the bucket keeps object versions: every append would keep the whole previous \
                 object as a noncurrent version (a log appended N times stores about N times its \
                 size), so appends are off and growing logs go whole on the schedule; a \
                 lifecycle rule expiring noncurrent versions bounds what the schedule's uploads keep"
            );
        }
        let on = self.cfg.appends && self.gate().on(Instant::now());
        m::log_appends_enabled(on);
    }

    fn gate(&self) -> std::sync::MutexGuard<'_, AppendGate> {
        self.sender.gate()
    }

    /// Starts checks of the next ledger entries with a HEAD, beside the round (see
    /// [`VERIFY_PER_ROUND`]), after taking the outcomes of those that ended since: an entry
    /// whose object is gone, or whose size is not the ledger's, is dropped, so the file is
    /// uploaded again. The round never waits for a HEAD (review r42t D3: it waited up to
    /// 15 s for one that hung, holding every log of the node).
    ///
    /// No more than [`VERIFY_PER_ROUND`] checks run at once, counting the ones tried again:
    /// a check whose deadline runs out is started again at the next round with twice that
    /// deadline, up to [`LEDGER_RETRY_CAP`] (a store whose HEADs all take a little longer
    /// still gets its entries checked), while the cursor moves on past its key, so a key
    /// whose HEAD hangs holds back no other (review r42t D2).
    pub(super) fn verify_some(&mut self) {
        self.take_checks();
        let free = VERIFY_PER_ROUND.saturating_sub(self.verify_checks.len());
        if free == 0 {
            return;
        }
        let busy = |k: &str| self.verify_checks.iter().any(|c| c.key == k);
        let keys = next_keys(
            self.ledger.data.objects.keys(),
            self.verify_cursor.as_deref(),
            busy,
            free,
        );
        for key in keys {
            // The cursor moves on whatever the outcome.
            self.verify_cursor = Some(key.clone());
            let Ok(location) = object_store::path::Path::parse(&key) else {
                continue;
            };
            let check = self.spawn_check(key, location, LEDGER_CHECK_TIMEOUT);
            self.verify_checks.push(check);
        }
    }

    /// The outcomes of the checks that ended since the last round (see [`verdict`]); one
    /// that took too long is started again with twice its deadline (at most
    /// [`LEDGER_RETRY_CAP`]).
    fn take_checks(&mut self) {
        let (done, running): (Vec<Check>, Vec<Check>) = std::mem::take(&mut self.verify_checks)
            .into_iter()
            .partition(|c| c.head.is_finished());
        self.verify_checks = running;
        for mut c in done {
            let Some(outcome) = (&mut c.head).now_or_never() else {
                continue;
            };
            let key = std::mem::take(&mut c.key);
            let found = match outcome {
                Ok(Ok(Ok(meta))) => Some(meta.size),
                Ok(Ok(Err(object_store::Error::NotFound { .. }))) => None,
                Ok(Ok(Err(e))) => {
                    tracing::debug!(%key, error = %e, "checking a ledger entry failed");
                    continue;
                }
                Ok(Err(())) => {
                    if !self.ledger.data.objects.contains_key(&key) {
                        continue;
                    }
                    let Ok(location) = object_store::path::Path::parse(&key) else {
                        continue;
                    };
                    let deadline = (c.deadline * 2).min(LEDGER_RETRY_CAP);
                    tracing::debug!(%key, timeout_secs = c.deadline.as_secs(), retry_secs = deadline.as_secs(), "checking a ledger entry took too long; tried again beside the rounds with a longer deadline");
                    let retry = self.spawn_check(key, location, deadline);
                    self.verify_checks.push(retry);
                    continue;
                }
                Err(_) => continue,
            };
            let now = self.ledger.data.objects.get(&key);
            match verdict(now, c.entry.as_ref(), self.sending(&key), found) {
                Verdict::Fine => {}
                Verdict::Lost => self.lost(&key),
                Verdict::Overwritten => {
                    let ledger = now.map_or(0, |p| p.size);
                    tracing::warn!(%key, object = found.unwrap_or(0), ledger, "an object's size is not the ledger's (overwritten)");
                    self.lost(&key);
                }
                Verdict::Late => {
                    tracing::debug!(%key, "a late answer to a check of a ledger entry that changed since (uploaded again) or is being sent: not taken");
                }
            }
        }
    }

    /// The HEAD of `key` with `deadline`, running beside the rounds.
    fn spawn_check(
        &self,
        key: String,
        location: object_store::path::Path,
        deadline: std::time::Duration,
    ) -> Check {
        let entry = self.ledger.data.objects.get(&key).cloned();
        let store = self.store.clone();
        let head = tokio::spawn(async move {
            tokio::time::timeout(deadline, store.head(&location))
                .await
                .map_err(|_| ())
        });
        Check {
            key,
            entry,
            deadline,
            head,
        }
    }

    /// True while a send of `key` runs.
    fn sending(&self, key: &str) -> bool {
        self.beside.iter().any(|b| b.key == key)
            || self.current.as_ref().is_some_and(|b| b.key == key)
    }

    /// `key`'s object is not in the bucket any more: its entry goes, so the file is
    /// uploaded again, and its session is not complete in the bucket any more.
    fn lost(&mut self, key: &str) {
        tracing::warn!(%key, "the bucket lost an object the ledger recorded; uploading it again");
        self.ledger.data.objects.remove(key);
        let session = key
            .strip_prefix(&format!("{}/", self.prefix))
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_default()
            .to_string();
        self.ledger.data.finished_sessions.remove(&session);
        self.ledger.dirty = true;
    }

    /// True when `f` only grew since the ledger's upload and the store can append to its
    /// object. At the final flush (`how` is not a live round's), an object whose append was
    /// still running beside the lane at SIGTERM, or whose last append failed, goes whole
    /// without trying one: the flush has no round after it.
    pub(super) async fn can_append(
        &self,
        key: &str,
        f: &LogFile,
        p: &LedgerEntry,
        how: Pass,
    ) -> bool {
        let Some(app) = self.cfg.appender.as_ref().filter(|_| self.cfg.appends) else {
            return false;
        };
        if how != Pass::Scheduled
            && (self.whole_only.contains(key) || self.gate().failing_transiently(key))
        {
            return false;
        }
        let (allowed, change) = self.gate().allows(key, Instant::now());
        if change == Change::TurnedOn {
            tracing::info!("trying appends again after the store's refusals turned them off");
            m::log_appends_enabled(true);
        }
        if !allowed {
            return false;
        }
        f.size > p.size
            && p.size > 0
            && p.size >= app.min_object_bytes()
            && p.ino != 0
            && p.e_tag.is_some()
            && p.full.is_some()
            && self.file_still_matches(f, p).await
    }

    /// True when appends are on and the store could append to an object of `p`'s size
    /// (whatever the file did since).
    pub(super) fn appends_could_take(&self, p: &LedgerEntry) -> bool {
        self.cfg
            .appender
            .as_ref()
            .is_some_and(|app| self.cfg.appends && p.size > 0 && p.size >= app.min_object_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(size: u64, e_tag: &str) -> LedgerEntry {
        LedgerEntry {
            size,
            mtime_ns: 1,
            hash: 2,
            ino: 3,
            uploaded_at: 4,
            e_tag: Some(e_tag.into()),
            head: None,
            full: None,
        }
    }

    #[test]
    fn an_answer_is_taken_only_for_the_entry_the_check_started_with() {
        let a = entry(100, "a");
        // The entry the check started with, no send: a 404 is a loss, another size an
        // overwrite, the same size nothing.
        assert_eq!(verdict(Some(&a), Some(&a), false, None), Verdict::Lost);
        assert_eq!(
            verdict(Some(&a), Some(&a), false, Some(40)),
            Verdict::Overwritten
        );
        assert_eq!(
            verdict(Some(&a), Some(&a), false, Some(400)),
            Verdict::Overwritten
        );
        assert_eq!(verdict(Some(&a), Some(&a), false, Some(100)), Verdict::Fine);
        // The file was sent again meanwhile (even at the same size): the 404 or the size
        // is of the object before, not taken (reviews r42u D1, f42w).
        let b = entry(100, "b");
        assert_eq!(verdict(Some(&b), Some(&a), false, None), Verdict::Late);
        assert_eq!(verdict(Some(&b), Some(&a), false, Some(40)), Verdict::Late);
        // A send of the key runs: not taken either.
        assert_eq!(verdict(Some(&a), Some(&a), true, None), Verdict::Late);
        assert_eq!(verdict(Some(&a), Some(&a), true, Some(40)), Verdict::Late);
        // Gone from the ledger already: nothing to do.
        assert_eq!(verdict(None, Some(&a), false, None), Verdict::Fine);
    }

    #[test]
    fn the_next_keys_wrap_around_skip_running_checks_and_never_repeat() {
        let keys: Vec<String> = ["a", "b", "c", "d", "e"].map(String::from).to_vec();
        let none = |_: &str| false;
        assert_eq!(next_keys(keys.iter(), None, none, 3), ["a", "b", "c"]);
        assert_eq!(next_keys(keys.iter(), Some("c"), none, 3), ["d", "e", "a"]);
        // Fewer keys than room: each once.
        assert_eq!(
            next_keys(keys.iter(), Some("b"), none, 8),
            ["c", "d", "e", "a", "b"]
        );
        // A key whose check still runs is not started again.
        let busy = |k: &str| k == "d" || k == "a";
        assert_eq!(next_keys(keys.iter(), Some("c"), busy, 8), ["e", "b", "c"]);
        // A cursor whose key left the ledger.
        assert_eq!(next_keys(keys.iter(), Some("bb"), none, 2), ["c", "d"]);
        assert!(next_keys(keys.iter(), None, none, 0).is_empty());
    }
}
