//! Answers built from a loaded session that cost too much to build per request (the cluster
//! status, the Train runs): built once for every request that wants them, and kept while
//! what they were built from is unchanged.
//!
//! - **One build for concurrent requests.** A request that finds no answer kept takes a
//!   build permit (a kind of answer has a few, [`Kept::new`]), looks again (a build that ended
//!   while it waited answers it) and only then builds. So requests for the same session
//!   that come while its answer is built wait for that build and take its answer; they do
//!   not build their own copy (review of issue 37: twelve Train requests built twelve copies).
//! - **A build is not its client's.** The build runs as a task of its own, holding its
//!   permit until it ends, and keeps its answer itself: a client that leaves does not stop a
//!   build others wait on, and the answer of a build whose clients all left answers the next
//!   request. A request that leaves while it waits for a permit takes itself out of the line
//!   (nothing is built for it).
//! - **Never older than the session.** An answer is kept for a session together with the
//!   index it was built from (the very [`SessionIndex`], held weakly so a kept answer never
//!   keeps an index the cache dropped) and a tag of whatever else it was built from (a
//!   stored snapshot's hash): a request whose index or tag differ (the session was reloaded
//!   because its objects changed, or the snapshot is another) builds again. A kind whose
//!   answer also reads files the index does not follow keeps it at most a given time.
//! - **Bounded.** At most `max` answers of a kind are kept, one per session (the oldest
//!   dropped first); an answer whose index the cache dropped is dropped at the next look.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::index::SessionIndex;

/// Answers of one kind, built from sessions' indexes.
pub(crate) struct Kept<T> {
    builds: Arc<Semaphore>,
    kept: Mutex<Vec<Entry<T>>>,
    max: usize,
    fresh_for: Option<Duration>,
    /// Builds started (`/metrics`).
    built: AtomicU64,
}

struct Entry<T> {
    session: String,
    tag: u64,
    index: Weak<SessionIndex>,
    answer: Arc<T>,
    built: Instant,
}

impl<T: Send + Sync + 'static> Kept<T> {
    /// `builds` built at once, at most `max` kept, each at most `fresh_for` (`None`: while
    /// its index and tag are the session's).
    pub(crate) fn new(builds: usize, max: usize, fresh_for: Option<Duration>) -> Self {
        Kept {
            builds: Arc::new(Semaphore::new(builds)),
            kept: Mutex::new(Vec::new()),
            max,
            fresh_for,
            built: AtomicU64::new(0),
        }
    }

    /// Builds started so far.
    pub(crate) fn builds_started(&self) -> u64 {
        self.built.load(Ordering::Relaxed)
    }

    /// The answer for `session` built from `index` with `tag`, if one is kept (and fresh).
    fn lookup(&self, session: &str, tag: u64, index: &Arc<SessionIndex>) -> Option<Arc<T>> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|k| k.index.strong_count() > 0);
        kept.iter()
            .find(|k| {
                k.session == session
                    && k.tag == tag
                    // Sound: the weak reference keeps the allocation, so no other index
                    // can be at this address while the entry is held.
                    && std::ptr::eq(k.index.as_ptr(), Arc::as_ptr(index))
                    && self.fresh_for.is_none_or(|f| k.built.elapsed() < f)
            })
            .map(|k| k.answer.clone())
    }

    /// Keeps `answer` as `session`'s, in place of the one kept before.
    fn keep(&self, session: String, tag: u64, index: &Arc<SessionIndex>, answer: Arc<T>) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|k| k.session != session && k.index.strong_count() > 0);
        while kept.len() >= self.max.max(1) {
            kept.remove(0);
        }
        kept.push(Entry {
            session,
            tag,
            index: Arc::downgrade(index),
            answer,
            built: Instant::now(),
        });
    }

    /// The answer for `session` built from `index` with `tag`: kept, the one a build under
    /// way gives, or built now by `build` (in a task of its own, which keeps its answer
    /// whether or not this request still waits). A build that fails (`Err`, or a panic) is
    /// not kept: its error is the answer of this request only.
    pub(crate) async fn get_or_build<F, Fut>(
        self: &Arc<Self>,
        session: String,
        tag: u64,
        index: &Arc<SessionIndex>,
        build: F,
    ) -> Result<Arc<T>, String>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, String>> + Send + 'static,
    {
        if let Some(answer) = self.lookup(&session, tag, index) {
            return Ok(answer);
        }
        // Closed never (the semaphore is not closed). The request leaves the line if its
        // client leaves.
        let permit = self.builds.clone().acquire_owned().await.ok();
        if let Some(answer) = self.lookup(&session, tag, index) {
            return Ok(answer);
        }
        let (kept, index) = (self.clone(), index.clone());
        let task = tokio::spawn(async move {
            let _permit = permit;
            kept.built.fetch_add(1, Ordering::Relaxed);
            let answer = Arc::new(build().await?);
            kept.keep(session, tag, &index, answer.clone());
            Ok(answer)
        });
        task.await
            .map_err(|e| format!("the build stopped: {e}"))
            .and_then(|built| built)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> Arc<SessionIndex> {
        Arc::new(super::super::index::IndexBuilder::default().finish(Default::default()))
    }

    #[tokio::test]
    async fn kept_for_its_index_and_tag_only() {
        let kept: Arc<Kept<u32>> = Arc::new(Kept::new(1, 2, None));
        let (a, b) = (index(), index());
        let got = kept
            .get_or_build("s".into(), 1, &a, || async { Ok(7) })
            .await;
        assert_eq!(got.as_deref(), Ok(&7));
        let again = kept
            .get_or_build("s".into(), 1, &a, || async { Ok(8) })
            .await;
        assert_eq!(again.as_deref(), Ok(&7), "kept");
        let tag = kept
            .get_or_build("s".into(), 2, &a, || async { Ok(9) })
            .await;
        assert_eq!(tag.as_deref(), Ok(&9), "another tag");
        let other = kept
            .get_or_build("s".into(), 2, &b, || async { Ok(10) })
            .await;
        assert_eq!(other.as_deref(), Ok(&10), "another index");
        let failed = kept
            .get_or_build("t".into(), 0, &a, || async { Err("no".to_string()) })
            .await;
        assert_eq!(failed, Err("no".to_string()));
        let retried = kept
            .get_or_build("t".into(), 0, &a, || async { Ok(11) })
            .await;
        assert_eq!(retried.as_deref(), Ok(&11), "a failure is not kept");
        assert_eq!(kept.builds_started(), 5);
        drop(b);
        assert!(kept.lookup("s", 2, &index()).is_none());
        assert_eq!(
            kept.kept.lock().unwrap().len(),
            1,
            "the dropped index's answer"
        );
    }
}
