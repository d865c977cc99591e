//! Whether an S3-compatible store honours `x-amz-copy-source-if-match` on `UploadPartCopy`,
//! asked at most once per run of each store, and only of a store whose HEAD answers carry no
//! ETag (issue 42, reviews r42x and r42y).
//!
//! An append checks that the object is still the one we wrote: its size and ETag as the
//! ledger recorded them (`check_object`). A store whose HEAD gives no ETag leaves only the
//! size to compare; an object overwritten behind our back with other bytes of the same size
//! passes that. The copy of the append is conditional on the ledger's ETag too, so on a
//! store that honours the condition such an object fails the copy (412: uploaded whole);
//! on one that ignores it (moto does), the append would keep the other bytes for good. So
//! without a HEAD ETag an append goes on only once this run has seen the store honour the
//! condition: [`CopyConditions::verdict`] holds what a probe found, and the probe
//! (`S3Appender::probe_copy_conditions`) can change no object: in a multipart upload of the
//! key being appended (invisible until completed, and never completed), an `UploadPartCopy`
//! of that key conditional on an ETag no object has; 412 means honoured, a part copied means
//! ignored; the upload is aborted either way (the appender's abort paths: at once, in the
//! background when cancelled, at the end of the final flush).
//!
//! Guarantees: one verdict per store and run, shared by every appender of the store (the log
//! lane's and the event publisher's), one probe at a time, and nobody but the append that
//! started it waits for it (review r42aa: that one waits for its answer, on the log lane at
//! most its 30 s answer timeout): an
//! append that needs the verdict while a probe is in flight goes whole this round (review
//! r42z: with the probe's copy hung, three growing logs waited 30 s behind it, and the
//! event publisher's requests have no such cut); until a verdict, and when the store ignores
//! the condition, the object is uploaded whole ([`AppendError::Changed`]), as before any of
//! this. A probe that fails transiently (or is refused) gives no verdict: the
//! object goes whole this round and the store is asked again after [`PROBE_RETRY_AFTER`],
//! at most [`MAX_UNSETTLED_PROBES`] times, after which the store is taken as ignoring the
//! condition. The store that ignores it is named once per run (a WARN).

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use super::AppendError;

/// What a store does with `x-amz-copy-source-if-match` on `UploadPartCopy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It refuses a copy whose source has another ETag (412): the copy protects an append.
    Honoured,
    /// It copies whatever the condition says: without a HEAD ETag, appends are unsafe.
    Ignored,
}

/// A probe that found nothing (transient failure, a refusal) is not tried again before this.
pub(super) const PROBE_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Probes that found nothing, after which the store is taken as ignoring the condition
/// (whole uploads, as before the probe existed) for the rest of the run.
pub(super) const MAX_UNSETTLED_PROBES: u32 = 5;

/// The probe's condition: an ETag no object has (S3's ETags are MD5 digests or
/// `<digest>-<parts>`; that of all zeros is nobody's).
pub(super) const NEVER_MATCHES: &str = "\"00000000000000000000000000000000\"";

/// The verdict of one store for this run, shared by its appenders.
#[derive(Debug, Default)]
pub(super) struct CopyConditions {
    /// Held for the whole probe: one probe at a time; the others do not wait for it.
    state: tokio::sync::Mutex<State>,
    /// The verdict once there is one ([`Verdict::code`]), read without the lock; 0 before.
    settled: AtomicU8,
}

impl Verdict {
    fn code(self) -> u8 {
        match self {
            Verdict::Honoured => 1,
            Verdict::Ignored => 2,
        }
    }

    fn from_code(code: u8) -> Option<Verdict> {
        match code {
            1 => Some(Verdict::Honoured),
            2 => Some(Verdict::Ignored),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// Probes that found nothing.
    unsettled: u32,
    /// No probe before this (after one that found nothing).
    next_probe: Option<Instant>,
}

impl CopyConditions {
    /// The verdict, once there is one.
    fn settled(&self) -> Option<Verdict> {
        Verdict::from_code(self.settled.load(Ordering::Acquire))
    }

    /// The store's verdict, asked of `probe` when there is none yet and one may be asked now;
    /// `key` and `why` (why the ETags could not be compared) name the object in the error
    /// that sends it whole.
    pub(super) async fn verdict<F, Fut>(
        &self,
        key: &str,
        why: &str,
        probe: F,
    ) -> Result<Verdict, AppendError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Verdict, AppendError>>,
    {
        if let Some(v) = self.settled() {
            return Ok(v);
        }
        let Ok(mut state) = self.state.try_lock() else {
            return Err(AppendError::Changed {
                key: key.into(),
                why: format!(
                    "{why}, and a probe of whether the store honours x-amz-copy-source-if-match \
                     is in flight (this object goes whole this round rather than wait for it)"
                ),
            });
        };
        // A probe may have ended between the look above and the lock.
        if let Some(v) = self.settled() {
            return Ok(v);
        }
        if state.next_probe.is_some_and(|t| Instant::now() < t) {
            return Err(AppendError::Changed {
                key: key.into(),
                why: format!(
                    "{why}, and whether the store honours x-amz-copy-source-if-match is not \
                     known yet (its last probe found nothing; asked again later)"
                ),
            });
        }
        match probe().await {
            Ok(v) => {
                self.settled.store(v.code(), Ordering::Release);
                match v {
                    Verdict::Honoured => tracing::info!(%key,
                        "the store's HEAD answers carry no ETag, and it honours \
                         x-amz-copy-source-if-match on UploadPartCopy (a probe's copy with a \
                         wrong ETag was refused): appends go on, each copy conditional on the \
                         ledger's ETag"),
                    Verdict::Ignored => warn_ignored(key),
                }
                Ok(v)
            }
            Err(e) => {
                // The object gone is no fault of the store's: not counted.
                if !matches!(e, AppendError::Changed { .. }) {
                    state.unsettled += 1;
                }
                if state.unsettled >= MAX_UNSETTLED_PROBES {
                    self.settled
                        .store(Verdict::Ignored.code(), Ordering::Release);
                    tracing::warn!(%key, error = %e, probes = state.unsettled,
                        "whether the store honours x-amz-copy-source-if-match could not be \
                         told after {MAX_UNSETTLED_PROBES} probes: taken as ignored");
                    warn_ignored(key);
                } else {
                    state.next_probe = Some(Instant::now() + PROBE_RETRY_AFTER);
                    tracing::info!(%key, error = %e,
                        "probing whether the store honours x-amz-copy-source-if-match failed; \
                         this object goes whole, and the store is asked again later");
                }
                Err(match e {
                    // No verdict: whole this round (a refusal stays one: it counts toward
                    // turning appends off, as a real copy's would).
                    AppendError::Unavailable { key, message } => AppendError::Changed {
                        key,
                        why: format!(
                            "{why}, and probing whether the store honours \
                             x-amz-copy-source-if-match failed: {message}"
                        ),
                    },
                    e => e,
                })
            }
        }
    }
}

/// The WARN of a store whose HEAD gives no ETag and that ignores copy conditions: once per
/// store and run (a verdict is set once).
fn warn_ignored(key: &str) {
    tracing::warn!(%key,
        "the store's HEAD answers carry no ETag and it ignores x-amz-copy-source-if-match on \
         UploadPartCopy (a probe's copy with a wrong ETag was done): an append could not tell \
         an object overwritten with as many other bytes from ours and would keep those bytes \
         for good, so on this store growing logs are uploaded whole every round");
}

/// The error that sends an object whole on a store that ignores copy conditions.
pub(super) fn ignored(key: &str, why: &str) -> AppendError {
    AppendError::Changed {
        key: key.into(),
        why: format!(
            "{why}, and the store ignores x-amz-copy-source-if-match: an append is unsafe"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changed() -> AppendError {
        AppendError::Changed {
            key: "k".into(),
            why: "gone".into(),
        }
    }

    fn transient() -> AppendError {
        AppendError::Unavailable {
            key: "k".into(),
            message: "503".into(),
        }
    }

    /// Review r42z: an append that needs the verdict while a probe hangs goes whole at once
    /// instead of waiting for it; once the probe answers, its verdict is everyone's.
    #[tokio::test]
    async fn nobody_waits_for_a_probe_in_flight() {
        let c = std::sync::Arc::new(CopyConditions::default());
        let (answer, answered) = tokio::sync::oneshot::channel::<()>();
        let first = {
            let c = std::sync::Arc::clone(&c);
            tokio::spawn(async move {
                c.verdict("a", "w", || async move {
                    let _ = answered.await;
                    Ok(Verdict::Honoured)
                })
                .await
            })
        };
        // Let the first probe start and hang.
        while c.state.try_lock().is_ok() {
            tokio::task::yield_now().await;
        }
        // Bounded only so that a wait fails the test instead of hanging it.
        let other = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            c.verdict("b", "w", || async { Ok(Verdict::Ignored) }),
        )
        .await
        .expect("an append waited for the probe in flight");
        match other {
            Err(AppendError::Changed { why, .. }) => assert!(why.contains("in flight"), "{why}"),
            r => panic!("{r:?}"),
        }
        answer.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), Verdict::Honoured);
        assert_eq!(
            c.verdict("b", "w", || async { Ok(Verdict::Ignored) })
                .await
                .unwrap(),
            Verdict::Honoured
        );
    }

    #[tokio::test]
    async fn one_probe_per_verdict_and_a_bounded_number_without_one() {
        let c = CopyConditions::default();
        let probes = std::sync::atomic::AtomicU32::new(0);
        let probe = |r: Result<Verdict, AppendError>| {
            probes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move { r }
        };
        // The object gone: no verdict, not counted, asked again later.
        assert!(c.verdict("k", "w", || probe(Err(changed()))).await.is_err());
        // Before the retry time: not asked.
        assert!(c
            .verdict("k", "w", || probe(Ok(Verdict::Honoured)))
            .await
            .is_err());
        assert_eq!(probes.load(std::sync::atomic::Ordering::SeqCst), 1);
        for n in 1..MAX_UNSETTLED_PROBES {
            c.state.lock().await.next_probe = None;
            assert!(c
                .verdict("k", "w", || probe(Err(transient())))
                .await
                .is_err());
            assert_eq!(c.state.lock().await.unsettled, n);
        }
        c.state.lock().await.next_probe = None;
        assert!(c
            .verdict("k", "w", || probe(Err(transient())))
            .await
            .is_err());
        // Bounded: taken as ignored, and never asked again.
        let before = probes.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            c.verdict("k", "w", || probe(Ok(Verdict::Honoured)))
                .await
                .unwrap(),
            Verdict::Ignored
        );
        assert_eq!(probes.load(std::sync::atomic::Ordering::SeqCst), before);
    }

    #[tokio::test]
    async fn a_verdict_is_kept() {
        let c = CopyConditions::default();
        let v = c
            .verdict("k", "w", || async { Ok(Verdict::Honoured) })
            .await
            .unwrap();
        assert_eq!(v, Verdict::Honoured);
        let again = c
            .verdict("k", "w", || async { Ok(Verdict::Ignored) })
            .await
            .unwrap();
        assert_eq!(again, Verdict::Honoured);
    }
}
