//! The ledger against the file and the bucket: whether a file still holds the bytes the
//! ledger recorded (so only its new bytes need to go), whether an append can go (appends on,
//! the object's size within what the store appends to), what appends cost in this bucket, and
//! a few entries each round checked with a HEAD ([`VERIFY_PER_ROUND`]) so an object the
//! bucket lost, or one that is not what the ledger recorded (another size, or another ETag:
//! overwritten, or an upload of ours that landed after the ledger was last saved), is
//! uploaded again. The checks run beside the rounds (at
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

/// Checks tried again (after a timeout) that may run at once: half the places, so new keys
/// are always checked (review r42w D1).
const MAX_RETRIES_RUNNING: usize = VERIFY_PER_ROUND / 2;

/// What the answer to a check of a ledger entry means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The object is there, of the ledger's size and ETag (or the answer came too late to
    /// say).
    Fine,
    /// The bucket lost the object: the file is uploaded again.
    Lost,
    /// The object's size is not the ledger's: the file is uploaded again.
    OtherSize,
    /// The object has the ledger's size but not its ETag (overwritten with as many bytes):
    /// the file is uploaded again.
    OtherETag,
    /// The answer would say the object is lost or not the ledger's, but the ledger's entry
    /// is not the one the check started with, or a send of the key runs: not taken.
    Late,
}

/// What a check's HEAD found of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Found {
    size: u64,
    e_tag: Option<String>,
}

use crate::storage::append::etag_key;

/// True only when both ETags are known and differ ([`etag_key`]): a ledger entry without
/// one (a ledger before version 3, a store that gave none) is judged by its size alone.
fn etags_differ(ledger: Option<&str>, found: Option<&str>) -> bool {
    match (ledger.and_then(etag_key), found.and_then(etag_key)) {
        (Some(a), Some(b)) => a != b,
        _ => false,
    }
}

/// Whether the ledger checks compare ETags (review r42v D2), and the keys whose object was
/// found with the ledger's size but another ETag in this run.
#[derive(Debug, Default)]
pub(super) struct EtagTrust {
    mismatched: std::collections::BTreeSet<String>,
    /// A key's ETag differed twice: sizes only from then on.
    off: bool,
}

impl EtagTrust {
    /// Whether checks compare ETags.
    fn on(&self) -> bool {
        !self.off
    }

    /// `key`'s object has the ledger's size but another ETag: true to upload its file again.
    /// The second time for the same key in this run (its entry then recorded by the upload
    /// the first one caused), false, and ETags are compared no more: the store's answers
    /// to uploads do not give the ETag its HEADs do (an S3-compatible store), or someone
    /// keeps overwriting that object. Without this, such a store would have every checked
    /// file sent again each time it is checked, for good.
    fn mismatch(&mut self, key: &str) -> bool {
        if self.mismatched.insert(key.to_string()) {
            return true;
        }
        self.off = true;
        false
    }
}

/// The verdict on a check's answer (`found`: the object's size and ETag, `None` not
/// found), `etags` whether ETags are compared ([`EtagTrust`]): taken
/// only while the ledger's entry `now` is `started` (the entry when the check began) and no
/// send of the key runs (`sending`), for a 404, a size and an ETag alike (a whole upload of
/// a file that shrank makes the object shorter while it runs, and one that ended changed the
/// entry).
fn verdict(
    now: Option<&LedgerEntry>,
    started: Option<&LedgerEntry>,
    sending: bool,
    found: Option<&Found>,
    etags: bool,
) -> Verdict {
    let Some(entry) = now else {
        // Gone from the ledger already: nothing to take.
        return Verdict::Fine;
    };
    let wrong = match found {
        None => Verdict::Lost,
        Some(f) if f.size != entry.size => Verdict::OtherSize,
        Some(f) if etags && etags_differ(entry.e_tag.as_deref(), f.e_tag.as_deref()) => {
            Verdict::OtherETag
        }
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
    /// whose object is gone, or whose size or ETag is not the ledger's, is dropped, so the
    /// file is uploaded again. The round never waits for a HEAD (review r42t D3: it waited up to
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
    /// [`LEDGER_RETRY_CAP`]). The final flush takes them too before its first pass (it
    /// starts no check and waits for none).
    pub(super) fn take_checks(&mut self) {
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
                Ok(Ok(Ok(meta))) => Some(Found {
                    size: meta.size,
                    e_tag: meta.e_tag,
                }),
                Ok(Ok(Err(object_store::Error::NotFound { .. }))) => None,
                Ok(Ok(Err(e))) => {
                    tracing::debug!(%key, error = %e, "checking a ledger entry failed");
                    continue;
                }
                Ok(Err(())) => {
                    if !self.ledger.data.objects.contains_key(&key) {
                        continue;
                    }
                    // Retries take at most half the checks' places, and a key is given up
                    // once it timed out at the longest deadline (the cursor meets it again
                    // on its next pass): keys whose HEADs never answer must not hold every
                    // place for good, or no other entry is ever checked again (review r42w
                    // D1: 8 such keys starved the checks of every other key).
                    let retries = self
                        .verify_checks
                        .iter()
                        .filter(|r| r.deadline > LEDGER_CHECK_TIMEOUT)
                        .count();
                    if c.deadline >= LEDGER_RETRY_CAP || retries >= MAX_RETRIES_RUNNING {
                        tracing::debug!(%key, timeout_secs = c.deadline.as_secs(), "checking a ledger entry took too long again; left to the checks' next pass over the ledger");
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
            let etags = self.etag_trust.on();
            let sending = self.sending(&key);
            match verdict(now, c.entry.as_ref(), sending, found.as_ref(), etags) {
                Verdict::Fine => {}
                Verdict::Lost => {
                    tracing::warn!(%key, "the bucket lost an object the ledger recorded; uploading it again");
                    self.forget(&key);
                }
                Verdict::OtherSize => {
                    let ledger = now.map_or(0, |p| p.size);
                    let object = found.as_ref().map_or(0, |f| f.size);
                    tracing::warn!(%key, object, ledger, "the object in the bucket has another size than the one the ledger recorded (written by another writer, or by an upload of ours that landed after the ledger was last saved, as before a kill); uploading the file again");
                    self.forget(&key);
                }
                Verdict::OtherETag => {
                    let ledger = now.and_then(|p| p.e_tag.clone()).unwrap_or_default();
                    let object = found.and_then(|f| f.e_tag).unwrap_or_default();
                    if !self.etag_trust.mismatch(&key) {
                        tracing::warn!(%key, %object, %ledger, "an object's ETag differs from the ledger's again after it was uploaded again: the store's ETags are taken as not matching what its uploads answered, and the ledger checks compare sizes only from now on (an overwrite with as many bytes is no longer found)");
                        continue;
                    }
                    tracing::warn!(%key, %object, %ledger, "the object in the bucket has the ledger's size but another ETag (overwritten with as many bytes); uploading the file again");
                    self.forget(&key);
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

    /// `key`'s object is not the one the ledger recorded (or is gone): its entry goes, so
    /// the file is uploaded again, and its session is not complete in the bucket any more.
    fn forget(&mut self, key: &str) {
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

    fn found(size: u64, e_tag: Option<&str>) -> Found {
        Found {
            size,
            e_tag: e_tag.map(String::from),
        }
    }

    #[test]
    fn an_answer_is_taken_only_for_the_entry_the_check_started_with() {
        let a = entry(100, "\"a\"");
        let v = |now, started, sending, f: Option<Found>| {
            verdict(now, started, sending, f.as_ref(), true)
        };
        // The entry the check started with, no send: a 404 is a loss, another size or
        // another ETag not the ledger's object, the same size and ETag nothing.
        assert_eq!(v(Some(&a), Some(&a), false, None), Verdict::Lost);
        let small = found(40, Some("\"a\""));
        assert_eq!(
            v(Some(&a), Some(&a), false, Some(small)),
            Verdict::OtherSize
        );
        let big = found(400, Some("\"z\""));
        assert_eq!(v(Some(&a), Some(&a), false, Some(big)), Verdict::OtherSize);
        let same = found(100, Some("\"a\""));
        assert_eq!(v(Some(&a), Some(&a), false, Some(same)), Verdict::Fine);
        let other = found(100, Some("\"z\""));
        assert_eq!(
            v(Some(&a), Some(&a), false, Some(other.clone())),
            Verdict::OtherETag
        );
        // The file was sent again meanwhile (even at the same size): the 404, the size or
        // the ETag is of the object before, not taken (reviews r42u D1, f42w).
        let b = entry(100, "\"b\"");
        assert_eq!(v(Some(&b), Some(&a), false, None), Verdict::Late);
        assert_eq!(
            v(Some(&b), Some(&a), false, Some(found(40, None))),
            Verdict::Late
        );
        assert_eq!(
            v(Some(&b), Some(&a), false, Some(found(100, Some("\"a\"")))),
            Verdict::Late
        );
        // A send of the key runs: not taken either.
        assert_eq!(v(Some(&a), Some(&a), true, None), Verdict::Late);
        assert_eq!(
            v(Some(&a), Some(&a), true, Some(found(40, None))),
            Verdict::Late
        );
        assert_eq!(
            v(Some(&a), Some(&a), true, Some(other.clone())),
            Verdict::Late
        );
        // Gone from the ledger already: nothing to do.
        assert_eq!(v(None, Some(&a), false, None), Verdict::Fine);
        // ETags not compared (the store's were found unreliable): the size alone.
        assert_eq!(
            verdict(Some(&a), Some(&a), false, Some(&other), false),
            Verdict::Fine
        );
    }

    #[test]
    fn a_key_whose_etag_differs_twice_turns_etag_checks_off() {
        let mut t = EtagTrust::default();
        assert!(t.on());
        // Each key once: uploaded again, ETags still compared.
        assert!(t.mismatch("a"));
        assert!(t.mismatch("b"));
        assert!(t.on());
        // The same key again: not uploaded again, and sizes only from now on.
        assert!(!t.mismatch("a"));
        assert!(!t.on());
    }

    #[test]
    fn etags_are_compared_only_when_both_are_known_whatever_their_quoting() {
        let a = entry(100, "\"9b2c-2\"");
        let v = |f: Found| verdict(Some(&a), Some(&a), false, Some(&f), true);
        // The same ETag quoted or not, weak, in another case: the same object.
        for tag in [
            "\"9b2c-2\"",
            "9b2c-2",
            "W/\"9b2c-2\"",
            "\"9B2C-2\"",
            " \"9b2c-2\" ",
        ] {
            assert_eq!(v(found(100, Some(tag))), Verdict::Fine, "{tag}");
        }
        // No ETag in the answer, or an empty one: judged by the size.
        assert_eq!(v(found(100, None)), Verdict::Fine);
        assert_eq!(v(found(100, Some("\"\""))), Verdict::Fine);
        // A ledger entry without an ETag (or with an empty one a store answered): the same.
        for e_tag in [None, Some("".to_string()), Some("\"\"".to_string())] {
            let old = LedgerEntry {
                e_tag,
                ..entry(100, "x")
            };
            let f = found(100, Some("\"z\""));
            assert_eq!(
                verdict(Some(&old), Some(&old), false, Some(&f), true),
                Verdict::Fine
            );
        }
        assert!(etags_differ(Some("\"a\""), Some("\"b\"")));
        assert!(!etags_differ(Some("\"a\""), Some("a")));
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
