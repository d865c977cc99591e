//! One file's send on the log lane, with its own deadline, and the sends that outlast
//! their slot on the lane.
//!
//! A send (an append of the new bytes, or the file whole) may take much longer than a round
//! when one request hangs: a network black hole towards one endpoint, a copy the store never
//! answers. So that it cannot hold up the node's other logs:
//!
//! - every send has a deadline on its progress, [`stall_limit`]: a send that has not moved
//!   for [`SEND_DEADLINE_INTERVALS`] intervals, at least [`MIN_SEND_DEADLINE`] (which holds
//!   one request of object_store's or of `storage::s3::S3Wire`'s with all its retries, so
//!   the deadline never cuts a retry sequence that would have succeeded), is dropped (its
//!   multipart upload aborted) and counts as a failure of that file. A send moves when one
//!   of its requests ends (a part, a copied range), while it waits for its share of the
//!   lane's cap, and while a request's body may still be on the wire at
//!   [`crate::util::pace::MIN_BODY_RATE`] ([`crate::util::pace::Progress`]; the lane's
//!   uploads go on a client whose request timeout matches, `storage::log_request_timeout`):
//!   a part streaming over a slow uplink is not cut, and a big file that keeps moving is never
//!   cut for being slow, however many sends share the cap (a deadline counted from the
//!   bytes and an assumed rate dropped and restarted capped sends from zero forever once
//!   the cap was shared more than assumed), and one the store stopped answering is cut;
//! - the lane waits for a send at most [`slot`] (half an interval): then it goes on with the
//!   next files while the send continues beside it, at most [`MAX_BESIDE`] at once, and
//!   [`MAX_BESIDE_SMALL`] more for small sends. With no room beside, a file with more than
//!   `schedule::SMALL` to send waits for room (the next round), and a small one that
//!   outlasts its slot with every place taken is dropped and tried again: the
//!   lane never waits for one send past its slot (review r42e E6: the lane waited for a
//!   fifth big send until it ended, sharing the cap with four, and the node's small logs
//!   went stale for minutes). A file whose send is beside the lane is not sent again until
//!   that send ends; its result is taken at the next file or round;
//! - an append that stops moving for its stall limit is given up for that object: the file is
//!   uploaded whole at once, within a deadline of its own, and goes whole on the schedule for
//!   an hour (as a refused one does, without counting toward turning appends off). At the
//!   final flush an append gets at most half of the file's time, so the whole upload keeps
//!   the other half;
//! - an append that ended is checked against every byte of the object ([`appended_entry`]):
//!   a file rewritten or replaced while it ran is uploaded whole at once, so an object never
//!   keeps two files' bytes.
//!
//! Failures are counted per file ([`Failures`]): a file whose last send failed goes after
//! every other file of the round, the one tried longest ago first, so files that keep
//! failing on their own (a key the store refuses, an object it will not write) never starve
//! the others, and the round's "the bucket is down" rule (three failed uploads in a row)
//! meets the files that did not fail before first.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use tokio::task::JoinHandle;

use super::gate::{
    AppendGate, Change, APPENDS_RETRY_AFTER, MAX_TRANSIENT_APPEND_INTERVALS,
    MAX_TRANSIENT_APPEND_ROUNDS,
};
use super::ledger::LedgerEntry;
use super::scan::LogFile;
use crate::metrics as m;
use crate::storage::append::{AppendError, Appender};
use crate::storage::put::{put_file_prefix, read_marks_watched, FileMarks, UploadError};
use crate::util::pace::{Flow, Pacer, Progress};
use crate::util::time::unix_seconds;

/// A send's deadline, in upload intervals: a send may keep going beside the lane for a few
/// rounds (the other files are not waiting for it), but an append that has not moved for
/// four intervals is given up and the file goes whole, so that its object is about five
/// intervals stale at most, as appends that keep failing leave it (`gate`); below a 40 s
/// interval [`MIN_SEND_DEADLINE`] is the floor of that.
pub(super) const SEND_DEADLINE_INTERVALS: u32 = 4;

/// The shortest deadline of a send, whatever the interval: one request of object_store's
/// with its retries (`storage`: a 120 s request timeout, no retry started after 30 s, 2 s
/// backoffs: at most about 154 s) or of `S3Wire`'s (4 attempts of at most
/// `s3::ANSWER_TIMEOUT`, 30 s each, an unanswered one not retried, and under 3 s of
/// backoff: at most 123 s) fits in it.
pub(super) const MIN_SEND_DEADLINE: Duration = Duration::from_secs(160);

/// Sends that may continue beside the lane at once: a few stuck or huge files cannot fill
/// the lane, and the lane's bandwidth cap still holds (they share its pacer).
pub(super) const MAX_BESIDE: usize = 4;

/// Places beside the lane kept for sends of at most `schedule::SMALL` bytes, past
/// [`MAX_BESIDE`]: a small log waiting for its share of a cap that big sends fill is not
/// dropped and restarted for want of room (at most 4 MiB more in flight), while a big send
/// never takes one (it waits for room among [`MAX_BESIDE`]).
pub(super) const MAX_BESIDE_SMALL: usize = 4;

/// Files whose failures are remembered, at most; past it the oldest streaks are forgotten
/// (those files only lose their place at the end of a round).
const MAX_FAILING_FILES: usize = 4096;

/// Test only: the floor of [`stall_limit`] in seconds instead of [`MIN_SEND_DEADLINE`], so a
/// test can show in a minute that slow sends are not cut while stuck ones are. Not a
/// setting.
pub const TEST_MIN_STALL: &str = "RHC_TEST_LOG_MIN_STALL_SECS";

/// How long a send may go without moving before it is dropped, at `interval` (see the
/// module doc); `floor` is [`MIN_SEND_DEADLINE`] but in tests ([`TEST_MIN_STALL`]).
pub(super) fn stall_limit(interval: Duration, floor: Duration) -> Duration {
    interval.saturating_mul(SEND_DEADLINE_INTERVALS).max(floor)
}

/// Runs `fut` until it ends, it has not moved for `stall` (by `progress`), or `hard`;
/// `None` when cut.
async fn until_stalled<F: std::future::Future>(
    fut: F,
    progress: &Progress,
    stall: Duration,
    hard: Option<Instant>,
) -> Option<F::Output> {
    tokio::pin!(fut);
    loop {
        let cut = progress.last() + stall;
        let cut = hard.map_or(cut, |h| h.min(cut));
        tokio::select! {
            out = &mut fut => return Some(out),
            _ = tokio::time::sleep_until(cut.into()) => {
                let now = Instant::now();
                if hard.is_some_and(|h| now >= h) || now >= progress.last() + stall {
                    return None;
                }
            }
        }
    }
}

/// How long the lane waits for one send before it goes on beside it: half an interval, so
/// a round that meets a stuck file still sends the others within about one and a half
/// intervals of their change (the next tick comes at most that late).
pub(super) fn slot(interval: Duration) -> Duration {
    interval / 2
}

/// Which files a pass over a session uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pass {
    /// A live round: changed files when the schedule says so (appends always).
    Scheduled,
    /// Everything not in the bucket yet (final flush, earlier sessions).
    Everything,
    /// Rotated backups only, right after Ray rotated.
    RotatedOnly,
}

/// Why a send failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum SendError {
    /// The upload failed (see [`UploadError`]).
    #[error(transparent)]
    Upload(#[from] UploadError),
    /// It stopped moving for its stall limit, or did not finish by the final flush's
    /// deadline (dropped, its multipart upload aborted).
    #[error("writing {key}: not finished after {after:?} ({why}); dropped")]
    TimedOut {
        /// The key.
        key: String,
        /// How long it ran.
        after: Duration,
        /// Which limit cut it.
        why: String,
    },
}

/// What a send did: the new ledger entry, the bytes sent, whether it was an append.
pub(super) type Sent = (LedgerEntry, u64, bool);

/// One send: what to send and until when.
pub(super) struct Job {
    pub(super) key: String,
    pub(super) file: LogFile,
    /// Append from this offset (the object's size), when the store can.
    pub(super) append_from: Option<u64>,
    /// The object's ETag, as the ledger has it.
    pub(super) e_tag: Option<String>,
    /// The hash of every byte of the object, as the ledger has it (see
    /// [`LedgerEntry::full`]): after an append the file must still begin with exactly
    /// those bytes, or the append took its bytes from another file written in place of the
    /// one appended to.
    pub(super) full: Option<u64>,
    pub(super) how: Pass,
    /// No send goes past this (the final flush's deadline).
    pub(super) hard_deadline: Option<Instant>,
}

/// What a send needs, shared with the sends beside the lane.
pub(super) struct Sender {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) appender: Option<Appender>,
    pub(super) part_size: usize,
    pub(super) pace: Option<Arc<Pacer>>,
    pub(super) gate: Arc<Mutex<AppendGate>>,
    /// How long a send may go without moving ([`stall_limit`]).
    pub(super) stall: Duration,
    /// `--log-upload-interval`: how long an object's appends may keep failing is counted in
    /// it too ([`super::gate::MAX_TRANSIENT_APPEND_INTERVALS`]).
    pub(super) interval: Duration,
}

impl Sender {
    pub(super) fn gate(&self) -> MutexGuard<'_, AppendGate> {
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How a send's bytes flow: the lane's cap and `progress`.
    fn flow<'a>(&'a self, progress: &'a Progress) -> Flow<'a> {
        Flow {
            pacer: self.pace.as_deref(),
            progress: Some(progress),
        }
    }

    /// Why a send was cut (see [`until_stalled`]).
    fn why_cut(&self, progress: &Progress, hard: Option<Instant>) -> String {
        if Instant::now() < progress.last() + self.stall && hard.is_some() {
            "the shutdown deadline".into()
        } else {
            format!("nothing moved for {:?}", self.stall)
        }
    }

    /// Appends the new bytes of the file (from `append_from`) or uploads it whole, each
    /// within its deadline (see the module doc). An append that cannot be made (the object
    /// changed, the store refused it, it did not finish in time) falls back to a whole
    /// upload at once; a transient failure does too in a pass that sends everything (`how`:
    /// the final flush, earlier sessions) and after [`MAX_TRANSIENT_APPEND_ROUNDS`] in a
    /// row or [`MAX_TRANSIENT_APPEND_INTERVALS`] intervals of them; otherwise it is left to
    /// the next round.
    pub(super) async fn send(
        self: Arc<Self>,
        job: Job,
        progress: Arc<Progress>,
        stored: Arc<AtomicBool>,
    ) -> Result<Sent, SendError> {
        let Job {
            key,
            file: f,
            append_from,
            e_tag,
            full,
            how,
            hard_deadline,
        } = job;
        let ino = f.ino;
        let mut gave_up = false;
        if let (Some(from), Some(app)) = (append_from, &self.appender) {
            // The final flush: half of the time is kept for the whole upload.
            let now = Instant::now();
            let hard = hard_deadline.map(|h| now + h.saturating_duration_since(now) / 2);
            let started = Instant::now();
            progress.moved();
            let appended = until_stalled(
                app.append(
                    &key,
                    &f.file,
                    from,
                    f.size,
                    e_tag.as_deref(),
                    self.flow(&progress),
                ),
                &progress,
                self.stall,
                hard,
            )
            .await
            .ok_or(());
            match appended {
                Ok(Ok(done)) => {
                    // The store's append has completed: what runs now is local (the
                    // read-back below, or the whole upload after it), no append to cancel
                    // at SIGTERM (review r42h D1).
                    stored.store(true, Ordering::SeqCst);
                    self.gate().succeeded(&key);
                    // Counted as it happens, not when the lane takes the result.
                    m::log_file_uploaded(done.bytes, true);
                    m::log_bytes_read(done.bytes);
                    let to = from + done.bytes;
                    let check = Appended {
                        from,
                        size: to,
                        ino,
                        e_tag: done.e_tag,
                        full,
                        tail: done.tail,
                    };
                    match appended_entry(&f, check, &progress).await {
                        Some(entry) => return Ok((entry, done.bytes, true)),
                        None => {
                            // The object may now hold the old file's bytes and the new
                            // file's tail: the whole upload below replaces it (reviews
                            // r42e E1, r42g G4 and G5).
                            m::log_append_failure("changed");
                            tracing::warn!(%key, "log file rewritten or replaced during its \
                                append (its bytes are no longer the object's); uploading it whole");
                        }
                    }
                }
                Err(_) => {
                    // Hung: the store does not answer this object's append.
                    m::log_append_failure("transient");
                    gave_up = true;
                    tracing::warn!(%key, after_s = started.elapsed().as_secs_f64(),
                        "log append did not finish in time; dropped and uploading the file \
                         whole (it goes whole on the schedule for an hour)");
                }
                Ok(Err(AppendError::Changed { key, why })) => {
                    m::log_append_failure("changed");
                    tracing::info!(%key, %why, "log object not as recorded; uploading it whole");
                }
                Ok(Err(AppendError::Read { path, source })) => {
                    return Err(UploadError::Read { path, source }.into())
                }
                Ok(Err(AppendError::Unavailable { key, message })) => {
                    m::log_append_failure("transient");
                    if how != Pass::Scheduled {
                        // Nothing after this pass: the file goes whole, now.
                        tracing::warn!(%key, %message, "log append failed; uploading the file whole");
                    } else if let Some(g) =
                        self.gate()
                            .failed_transiently(&key, started, Instant::now(), self.interval)
                    {
                        gave_up = true;
                        tracing::warn!(%key, %message, rounds = g.failures,
                            for_s = g.lasted.as_secs_f64(),
                            "appending to this object kept failing ({} in a row over {:.0} s; \
                             {MAX_TRANSIENT_APPEND_ROUNDS} rounds or \
                             {MAX_TRANSIENT_APPEND_INTERVALS} intervals at most); uploading the \
                             file whole (it goes whole on the schedule for an hour)",
                            g.failures, g.lasted.as_secs_f64());
                    } else {
                        // The store may be back next round: no whole upload now (it would
                        // meet the same outage), and appends stay on.
                        return Err(UploadError::Append { key, message }.into());
                    }
                }
                Ok(Err(AppendError::Refused {
                    key,
                    unsupported,
                    message,
                })) => {
                    m::log_append_failure(if unsupported {
                        "unsupported"
                    } else {
                        "refused"
                    });
                    let (refused, change) = self.gate().refused(&key, Instant::now());
                    tracing::warn!(%key, %message, unsupported,
                        "the store refused the append; uploading the file whole (this \
                         object goes whole on the schedule for an hour)");
                    if change == Change::TurnedOff {
                        m::log_appends_enabled(false);
                        tracing::warn!(
                            refused,
                            retry_in_s = APPENDS_RETRY_AFTER.as_secs(),
                            "the store refused appends {refused} times in a row: log files go \
                             whole on the schedule, and appends are tried again later \
                             (--log-appends false skips trying)"
                        );
                    }
                }
            }
        }
        let started = Instant::now();
        progress.moved();
        let up = until_stalled(
            put_file_prefix(
                &self.store,
                &key,
                &f.file,
                f.size,
                self.part_size,
                self.flow(&progress),
            ),
            &progress,
            self.stall,
            hard_deadline,
        )
        .await
        .ok_or_else(|| SendError::TimedOut {
            key: key.clone(),
            after: started.elapsed(),
            why: self.why_cut(&progress, hard_deadline),
        })??;
        if gave_up {
            self.gate().gave_up_appending(&key, Instant::now());
        }
        m::log_file_uploaded(up.bytes, false);
        m::log_bytes_read(up.bytes);
        let entry = entry_for(&f, up.bytes, ino, up.e_tag, up.marks);
        Ok((entry, up.bytes, false))
    }
}

/// What an append put in the bucket, to check against the file ([`appended_entry`]).
struct Appended {
    /// The object's size before the append.
    from: u64,
    /// Its size after.
    size: u64,
    ino: u64,
    e_tag: Option<String>,
    /// The ledger's hash of every byte of the object before the append.
    full: Option<u64>,
    /// The hash of the bytes appended, as they were read for it.
    tail: Option<u64>,
}

/// The ledger entry after an append of `f`'s bytes from `a.from` to `a.size`, or `None`
/// when the file no longer holds exactly the object's bytes: the first `from` bytes must
/// hash to `full` (the ledger's hash of every byte of the object before the append) and the
/// next ones to `tail` (the hash of the bytes appended, as they were read for it), or the
/// file was truncated and rewritten in place (or replaced at its name) while the append
/// ran, and the object now mixes two files' bytes.
///
/// The check is sound whatever part of the file the rewrite kept (review r42g G5: a check
/// of the first 64 KiB missed a rewrite that kept them), and costs one sequential read of
/// the file's first `size` bytes per append (local, hashed at memory speed; only the new
/// bytes cross the network). The entry's hashes come from that same read: a rewrite after
/// it is told by the next round. Without `full` or `tail` (not known) it is `None`.
///
/// Every piece read is progress of the send (`progress`): a read-back of a huge log that
/// outlasts a share of the final flush's budget is not taken for a stuck send (review
/// r42h D1). Dropped unfinished (the send cancelled), the read stops at its next piece.
async fn appended_entry(f: &LogFile, a: Appended, progress: &Arc<Progress>) -> Option<LedgerEntry> {
    let (full, tail) = (a.full?, a.tail?);
    let file = f.file.clone();
    let (from, size) = (a.from, a.size);
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let (stopped, watched) = (stop.0.clone(), progress.clone());
    let read = tokio::task::spawn_blocking(move || {
        read_marks_watched(&file, from, size, &|| {
            watched.moved();
            !stopped.load(Ordering::SeqCst)
        })
    })
    .await;
    drop(stop);
    m::log_bytes_read(size);
    match read {
        Ok(Ok(Some(marks))) if marks.before == full && marks.after == tail => {
            Some(entry_for(f, size, a.ino, a.e_tag, marks.all))
        }
        _ => None,
    }
}

/// Sets its flag when dropped: tells a blocking read that nobody waits for it any more.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The ledger entry after `size` bytes of `f` are in the bucket, `marks` being the hashes
/// of those bytes as they were read for it (review r42c D1: hashes taken from the file after
/// the upload describe a file rewritten in place meanwhile, not the object).
pub(super) fn entry_for(
    f: &LogFile,
    size: u64,
    ino: u64,
    e_tag: Option<String>,
    marks: FileMarks,
) -> LedgerEntry {
    LedgerEntry {
        size,
        // What was read: a file that changed size mid-upload is looked at next round.
        mtime_ns: if size == f.size { f.mtime_ns } else { 0 },
        hash: marks.window,
        ino,
        uploaded_at: unix_seconds(),
        e_tag,
        head: Some(marks.head),
        full: Some(marks.full),
    }
}

/// A send in flight, owned by the lane; aborted when dropped unfinished (a round cut short
/// by shutdown), so no send outlives the lane's knowledge of it.
pub(super) struct InFlight {
    pub(super) key: String,
    pub(super) path: PathBuf,
    /// It was an append when it started.
    pub(super) appending: bool,
    /// Its append has completed at the store: what is left is local (the read-back of
    /// the file, [`appended_entry`]) or a whole upload.
    stored: Arc<AtomicBool>,
    /// When it last moved (see [`Progress`]).
    progress: Arc<Progress>,
    task: Option<JoinHandle<Result<Sent, SendError>>>,
}

impl InFlight {
    /// Starts `job` on the runtime.
    pub(super) fn start(sender: &Arc<Sender>, job: Job) -> InFlight {
        let progress = Arc::new(Progress::new());
        let stored = Arc::new(AtomicBool::new(false));
        InFlight {
            key: job.key.clone(),
            path: job.file.abs.clone(),
            appending: job.append_from.is_some(),
            stored: stored.clone(),
            progress: progress.clone(),
            // The bodies of its requests are counted into its progress as the HTTP
            // client takes them (`storage::counted`, review r42h D3).
            task: Some(tokio::spawn(crate::storage::counted::with_progress(
                progress.clone(),
                sender.clone().send(job, progress, stored),
            ))),
        }
    }

    /// An append of it is running at the store (it started as one and the store has not
    /// completed it): at SIGTERM such a send is cancelled and its file sent whole. Once the
    /// store's append has completed, the send is not one any more: the object holds the
    /// new bytes, and what runs is the local read-back of the file (review r42h D1: a
    /// read-back of a huge log cancelled at SIGTERM left the file to a whole upload the
    /// shutdown budget could not hold).
    pub(super) fn append_running(&self) -> bool {
        self.appending && !self.stored.load(Ordering::SeqCst)
    }

    /// When one of its requests last ended, or it last waited for the cap; not counting the
    /// time a request's body may still be on the wire ([`Progress::last_moved`]).
    pub(super) fn last_moved(&self) -> Instant {
        self.progress.last_moved()
    }

    /// Its request in flight, if any, carries a body (a PUT, a part); else it waits for
    /// the answer of one without (a copy, a complete, a HEAD) or between requests.
    pub(super) fn body_in_flight(&self) -> bool {
        self.progress.body_in_flight()
    }

    /// Waits for the send at most `limit`; `None` when it is still running.
    pub(super) async fn wait(
        &mut self,
        limit: Option<Duration>,
    ) -> Option<Result<Sent, SendError>> {
        let task = self.task.as_mut()?;
        let joined = match limit {
            Some(l) => tokio::time::timeout(l, task).await.ok()?,
            None => task.await,
        };
        self.task = None;
        Some(joined.unwrap_or_else(|e| {
            Err(SendError::Upload(UploadError::Append {
                key: self.key.clone(),
                message: format!("the send ended without a result: {e}"),
            }))
        }))
    }

    /// True once the send has ended (its result is ready).
    pub(super) fn finished(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Cancels the send and waits until it has stopped (its drop has run: a multipart
    /// upload it had open is being aborted, see `storage::put::wait_dropped_aborts`).
    pub(super) async fn cancel(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// Per file, its failed sends in a row and when it was last tried (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Failures {
    files: HashMap<PathBuf, (u32, Instant)>,
}

impl Failures {
    /// Where the file goes in a round: `None` (first) for a file whose last send did not
    /// fail, else when it was last tried (longest ago first).
    pub(super) fn place(&self, path: &Path) -> Option<Instant> {
        self.files.get(path).map(|(_, at)| *at)
    }

    /// The file's send succeeded (or it is gone).
    pub(super) fn cleared(&mut self, path: &Path) {
        self.files.remove(path);
    }

    /// The file's send failed; its failures in a row.
    pub(super) fn failed(&mut self, path: &Path) -> u32 {
        if self.files.len() >= MAX_FAILING_FILES && !self.files.contains_key(path) {
            if let Some(oldest) = self
                .files
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(p, _)| p.clone())
            {
                self.files.remove(&oldest);
            }
        }
        let e = self
            .files
            .entry(path.to_path_buf())
            .or_insert((0, Instant::now()));
        e.0 += 1;
        e.1 = Instant::now();
        e.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stall_limits_hold_the_retries() {
        let s = Duration::from_secs;
        // Short intervals: the floor, which holds one request's retries.
        assert_eq!(stall_limit(s(1), MIN_SEND_DEADLINE), MIN_SEND_DEADLINE);
        // The default 60 s: four intervals.
        assert_eq!(stall_limit(s(60), MIN_SEND_DEADLINE), s(240));
        assert_eq!(slot(s(60)), s(30));
    }

    #[tokio::test]
    async fn a_send_that_moves_is_not_cut_one_that_stops_is() {
        let ms = Duration::from_millis;
        let progress = Progress::new();
        // Moves every 20 ms for 300 ms, under a 100 ms stall limit: finishes.
        let moving = async {
            for _ in 0..15 {
                tokio::time::sleep(ms(20)).await;
                progress.moved();
            }
            7
        };
        assert_eq!(
            until_stalled(moving, &progress, ms(100), None).await,
            Some(7)
        );
        // Stops: cut about one stall limit after its last move.
        let progress = Progress::new();
        let t0 = Instant::now();
        let stuck = std::future::pending::<()>();
        assert_eq!(until_stalled(stuck, &progress, ms(100), None).await, None);
        assert!(t0.elapsed() >= ms(100));
        // A hard deadline cuts a moving send too.
        let progress = Progress::new();
        let moving = async {
            loop {
                tokio::time::sleep(ms(10)).await;
                progress.moved();
            }
        };
        let hard = Instant::now() + ms(80);
        assert_eq!(
            until_stalled(moving, &progress, ms(1000), Some(hard)).await,
            None
        );
    }

    #[test]
    fn failing_files_go_last_longest_ago_first() {
        let mut f = Failures::default();
        let (a, b, c) = (PathBuf::from("a"), PathBuf::from("b"), PathBuf::from("c"));
        assert_eq!(f.failed(&a), 1);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(f.failed(&b), 1);
        assert_eq!(f.failed(&a), 2);
        let mut order = vec![a.clone(), b.clone(), c.clone()];
        order.sort_by_key(|p| f.place(p));
        assert_eq!(order, vec![c.clone(), b.clone(), a.clone()]);
        f.cleared(&a);
        assert_eq!(f.place(&a), None);
        for i in 0..MAX_FAILING_FILES + 5 {
            f.failed(&PathBuf::from(format!("f{i}")));
        }
        assert_eq!(f.files.len(), MAX_FAILING_FILES);
    }
}
