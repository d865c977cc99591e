//! Answers built from a loaded session that cost too much to build per request (the cluster
//! status, the Train runs): built once for every request that wants them, and kept while
//! what they were built from is unchanged.
//!
//! - **One build for concurrent requests.** A request that finds no answer kept looks for a
//!   build under way of the same answer (same session, index and tag), registered when it
//!   started, and waits for it; only when there is none does it register one. So requests
//!   for the same session that come while its answer is built take that build's answer; they
//!   do not build their own copy (review of issue 37: twelve Train requests built twelve
//!   copies; review r37l: with two build permits, two concurrent requests built twice).
//!   Builds of different answers take a permit each (a kind of answer has a few,
//!   [`Kept::new`]).
//! - **A build is not its client's.** The build runs as a task of its own, holding its
//!   permit until it ends, and keeps its answer itself: a client that leaves does not stop a
//!   build others wait on, and the answer of a build whose clients all left answers the next
//!   request. A build whose requests all left while it waited for its permit builds nothing.
//! - **Never older than the session.** An answer is kept for a session together with the
//!   index it was built from (the very [`SessionIndex`], held weakly so a kept answer never
//!   keeps an index the cache dropped) and a tag of whatever else it was built from (a
//!   stored snapshot's hash): a request whose index or tag differ (the session was reloaded
//!   because its objects changed, or the snapshot is another) builds again. A kind whose
//!   answer also reads files the index does not follow keeps it at most a given time.
//! - **Bounded.** At most `max` answers of a kind are kept, one per session (the oldest
//!   dropped first), and, for a kind that weighs its answers ([`Kept::weighed`]), at most
//!   `max_bytes` of them, the newest kept even alone over it; an answer whose index the
//!   cache dropped is dropped at the next look.
//! - **Who waits for a slot is known.** A build waiting for its permit is marked so among
//!   the builds under way, so a build nobody waits for can tell whether a request wants its
//!   permit ([`Wanted::slot_wanted`]): a semaphore tells only that none is free, not whether
//!   anyone still wants one (review r37s D1; review r37t: giving permits up whenever none
//!   was free restarted reads whose clients were about to ask again).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Semaphore};

use super::index::SessionIndex;

/// Answers of one kind, built from sessions' indexes.
pub(crate) struct Kept<T, E = String> {
    builds: Arc<Semaphore>,
    kept: Mutex<Vec<Entry<T>>>,
    /// Builds under way, each with the channel its answer is sent on.
    building: Mutex<Vec<Building<T, E>>>,
    max: usize,
    /// Bytes of answers kept at most ([`Kept::weighed`]; the newest is kept even alone over).
    max_bytes: usize,
    /// What an answer weighs against `max_bytes`.
    weigh: fn(&T) -> usize,
    fresh_for: Option<Duration>,
    /// Builds started (`/metrics`).
    built: AtomicU64,
}

/// What a build sends its waiting requests: nothing yet, then its answer or its error.
type Outcome<T, E> = Option<Result<Arc<T>, E>>;

struct Building<T, E> {
    session: String,
    tag: u64,
    index: Weak<SessionIndex>,
    done: Arc<watch::Sender<Outcome<T, E>>>,
    /// Set while the build waits for its permit.
    waits_for_slot: Arc<AtomicBool>,
}

/// Takes a build out of [`Kept::building`] when its task ends, whether it returned or
/// panicked (its waiting requests then see the channel closed).
struct Registered<T: Send + Sync + 'static, E: Clone + Send + Sync + From<String> + 'static> {
    kept: Arc<Kept<T, E>>,
    done: Arc<watch::Sender<Outcome<T, E>>>,
}

impl<T: Send + Sync + 'static, E: Clone + Send + Sync + From<String> + 'static> Drop
    for Registered<T, E>
{
    fn drop(&mut self) {
        let mut building = self.kept.building.lock().unwrap_or_else(|p| p.into_inner());
        building.retain(|b| !Arc::ptr_eq(&b.done, &self.done));
    }
}

/// Given to a build: whether a request still waits for it ([`Wanted::abandoned`]).
pub(crate) struct Wanted<T: Send + Sync + 'static, E: Clone + Send + Sync + From<String> + 'static>
{
    kept: Arc<Kept<T, E>>,
    done: Arc<watch::Sender<Outcome<T, E>>>,
}

impl<T: Send + Sync + 'static, E: Clone + Send + Sync + From<String> + 'static> Wanted<T, E> {
    /// True when every request that waited for the build has left: the build is then out of
    /// the builds under way (no request can start waiting for it after), and should stop
    /// before its next costly step (review r37o D2: builds abandoned while they waited for
    /// the snapshot budget still read and built, and new sessions waited behind them).
    pub(crate) fn abandoned(&self) -> bool {
        let mut building = self.kept.building.lock().unwrap_or_else(|p| p.into_inner());
        let nobody = self.done.receiver_count() == 0;
        if nobody {
            building.retain(|b| !Arc::ptr_eq(&b.done, &self.done));
        }
        nobody
    }

    /// Whether a request waits for the build now (it may have joined after every earlier
    /// one left).
    pub(crate) fn somebody_waits(&self) -> bool {
        self.done.receiver_count() > 0
    }

    /// Whether a request waits for another build of this kind that waits for its permit
    /// (every permit is taken): a build nobody waits for holds a permit someone wants. A
    /// build waiting for a permit whose requests all left wants none.
    pub(crate) fn slot_wanted(&self) -> bool {
        let building = self.kept.building.lock().unwrap_or_else(|p| p.into_inner());
        building.iter().any(|b| {
            b.waits_for_slot.load(Ordering::Relaxed)
                && b.done.receiver_count() > 0
                && !Arc::ptr_eq(&b.done, &self.done)
        })
    }

    /// Completes once no request waits for the build (at once if none does now); the build
    /// stays among the builds under way, so a request may still join it.
    pub(crate) async fn nobody_waits(&self) {
        self.done.closed().await;
    }

    /// Completes when every request that waited for the build has left (then the build is
    /// out of the builds under way, as [`Wanted::abandoned`] leaves it): a build races its
    /// long waits against it, so an abandoned one lets go of what it holds at once (review
    /// r37q D2: a stalled snapshot read nobody waited for kept its budget 40 s).
    pub(crate) async fn left(&self) {
        loop {
            self.done.closed().await;
            // A request may have joined between the last one leaving and this look.
            if self.abandoned() {
                return;
            }
        }
    }
}

struct Entry<T> {
    session: String,
    tag: u64,
    index: Weak<SessionIndex>,
    answer: Arc<T>,
    /// What `answer` weighs ([`Kept::weigh`]).
    bytes: usize,
    built: Instant,
}

impl<T: Send + Sync + 'static, E: Clone + Send + Sync + From<String> + 'static> Kept<T, E> {
    /// `builds` built at once, at most `max` kept, each at most `fresh_for` (`None`: while
    /// its index and tag are the session's).
    pub(crate) fn new(builds: usize, max: usize, fresh_for: Option<Duration>) -> Self {
        Kept {
            builds: Arc::new(Semaphore::new(builds)),
            kept: Mutex::new(Vec::new()),
            building: Mutex::new(Vec::new()),
            max,
            max_bytes: usize::MAX,
            weigh: |_| 0,
            fresh_for,
            built: AtomicU64::new(0),
        }
    }

    /// Keeps at most `max_bytes` of answers as `weigh` weighs them (besides at most `max`
    /// answers), dropping the oldest first; the newest is kept even alone over it.
    pub(crate) fn weighed(mut self, max_bytes: usize, weigh: fn(&T) -> usize) -> Self {
        self.max_bytes = max_bytes;
        self.weigh = weigh;
        self
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

    /// Keeps `answer` as `session`'s, in place of the one kept before; the oldest go while
    /// more than `max` answers or `max_bytes` are kept (never the newest).
    fn keep(&self, session: String, tag: u64, index: &Arc<SessionIndex>, answer: Arc<T>) {
        let bytes = (self.weigh)(&answer);
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|k| k.session != session && k.index.strong_count() > 0);
        kept.push(Entry {
            session,
            tag,
            index: Arc::downgrade(index),
            answer,
            bytes,
            built: Instant::now(),
        });
        let mut total: usize = kept.iter().map(|k| k.bytes).sum();
        while kept.len() > 1 && (kept.len() > self.max.max(1) || total > self.max_bytes) {
            total -= kept.remove(0).bytes;
        }
    }

    /// The answer for `session` built from `index` with `tag`: kept, the one a build under
    /// way gives, or built now by `build` (in a task of its own, which keeps its answer
    /// whether or not this request still waits). A build that fails (`Err`, or a panic) is
    /// not kept: its error is the answer of the requests that waited for it.
    pub(crate) async fn get_or_build<F, Fut>(
        self: &Arc<Self>,
        session: String,
        tag: u64,
        index: &Arc<SessionIndex>,
        build: F,
    ) -> Result<Arc<T>, E>
    where
        F: FnOnce(Wanted<T, E>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        if let Some(answer) = self.lookup(&session, tag, index) {
            return Ok(answer);
        }
        let mut done = {
            let mut building = self.building.lock().unwrap_or_else(|p| p.into_inner());
            let under_way = building.iter().find(|b| {
                b.session == session
                    && b.tag == tag
                    && std::ptr::eq(b.index.as_ptr(), Arc::as_ptr(index))
            });
            match under_way {
                Some(b) => b.done.subscribe(),
                None => {
                    let (sender, receiver) = watch::channel(None);
                    let sender = Arc::new(sender);
                    let waits_for_slot = Arc::new(AtomicBool::new(true));
                    building.push(Building {
                        session: session.clone(),
                        tag,
                        index: Arc::downgrade(index),
                        done: sender.clone(),
                        waits_for_slot: waits_for_slot.clone(),
                    });
                    let registered = Registered {
                        kept: self.clone(),
                        done: sender,
                    };
                    let index = index.clone();
                    tokio::spawn(async move {
                        let kept = registered.kept.clone();
                        // Closed never (the semaphore is not closed).
                        let _permit = kept.builds.clone().acquire_owned().await.ok();
                        waits_for_slot.store(false, Ordering::Relaxed);
                        // Every request left while the build waited: nothing to build. Out
                        // of the builds under way in the same look, so no request can start
                        // waiting for it after.
                        let wanted = Wanted {
                            kept: kept.clone(),
                            done: registered.done.clone(),
                        };
                        if wanted.abandoned() {
                            return;
                        }
                        let outcome = if let Some(answer) = kept.lookup(&session, tag, &index) {
                            Ok(answer)
                        } else {
                            kept.built.fetch_add(1, Ordering::Relaxed);
                            match build(wanted).await {
                                Ok(answer) => {
                                    let answer = Arc::new(answer);
                                    kept.keep(session, tag, &index, answer.clone());
                                    Ok(answer)
                                }
                                Err(e) => Err(e),
                            }
                        };
                        // Out of the builds under way before the answer is sent: a request
                        // that comes after finds it kept (or, after a failure, builds).
                        let done = registered.done.clone();
                        drop(registered);
                        done.send_replace(Some(outcome));
                    });
                    receiver
                }
            }
        };
        loop {
            if let Some(outcome) = done.borrow_and_update().clone() {
                return outcome;
            }
            if done.changed().await.is_err() {
                return Err(E::from("the build stopped".to_string()));
            }
        }
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
            .get_or_build("s".into(), 1, &a, |_| async { Ok(7) })
            .await;
        assert_eq!(got.as_deref(), Ok(&7));
        let again = kept
            .get_or_build("s".into(), 1, &a, |_| async { Ok(8) })
            .await;
        assert_eq!(again.as_deref(), Ok(&7), "kept");
        let tag = kept
            .get_or_build("s".into(), 2, &a, |_| async { Ok(9) })
            .await;
        assert_eq!(tag.as_deref(), Ok(&9), "another tag");
        let other = kept
            .get_or_build("s".into(), 2, &b, |_| async { Ok(10) })
            .await;
        assert_eq!(other.as_deref(), Ok(&10), "another index");
        let failed = kept
            .get_or_build("t".into(), 0, &a, |_| async { Err("no".to_string()) })
            .await;
        assert_eq!(failed, Err("no".to_string()));
        let retried = kept
            .get_or_build("t".into(), 0, &a, |_| async { Ok(11) })
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

    #[tokio::test]
    async fn concurrent_requests_share_one_build_whatever_the_permits() {
        let kept: Arc<Kept<u32>> = Arc::new(Kept::new(2, 2, None));
        let a = index();
        let (go, wait) = tokio::sync::watch::channel(false);
        let requests: Vec<_> = (0..4u32)
            .map(|n| {
                let (kept, a, mut wait) = (kept.clone(), a.clone(), wait.clone());
                tokio::spawn(async move {
                    kept.get_or_build("s".into(), 1, &a, move |_| async move {
                        let _ = wait.wait_for(|go| *go).await;
                        Ok(n)
                    })
                    .await
                })
            })
            .collect();
        tokio::task::yield_now().await;
        let _ = go.send(true);
        let mut answers = Vec::new();
        for r in requests {
            answers.push(*r.await.unwrap().unwrap());
        }
        assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
        assert_eq!(kept.builds_started(), 1);
        assert!(kept.building.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_build_that_panics_is_the_error_of_its_waiters_and_not_kept() {
        let kept: Arc<Kept<u32>> = Arc::new(Kept::new(1, 2, None));
        let a = index();
        let got = kept
            .get_or_build("s".into(), 1, &a, |_| async { panic!("built wrong") })
            .await;
        assert!(got.is_err());
        assert!(kept.building.lock().unwrap().is_empty());
        let again = kept
            .get_or_build("s".into(), 1, &a, |_| async { Ok(3) })
            .await;
        assert_eq!(again.as_deref(), Ok(&3));
    }

    #[tokio::test]
    async fn kept_within_its_bytes_the_newest_even_alone_over() {
        let kept: Arc<Kept<u32>> =
            Arc::new(Kept::new(1, 10, None).weighed(10, |n: &u32| *n as usize));
        let a = index();
        for (session, n) in [("a", 4), ("b", 4), ("c", 4)] {
            let got = kept
                .get_or_build(session.into(), 0, &a, move |_| async move { Ok(n) })
                .await;
            assert_eq!(got.as_deref(), Ok(&n));
        }
        assert!(
            kept.lookup("a", 0, &a).is_none(),
            "12 bytes: the oldest went"
        );
        assert!(kept.lookup("b", 0, &a).is_some() && kept.lookup("c", 0, &a).is_some());
        let _ = kept
            .get_or_build("d".into(), 0, &a, |_| async { Ok(20) })
            .await;
        assert_eq!(kept.kept.lock().unwrap().len(), 1);
        assert!(kept.lookup("d", 0, &a).is_some(), "the newest, alone over");
    }

    #[tokio::test]
    async fn a_slot_is_wanted_only_while_a_request_waits_for_one() {
        let kept: Arc<Kept<u32>> = Arc::new(Kept::new(1, 2, None));
        let a = index();
        let (give, wanted) = tokio::sync::oneshot::channel();
        let (go, wait) = tokio::sync::watch::channel(false);
        let holder = {
            let (kept, a) = (kept.clone(), a.clone());
            tokio::spawn(async move {
                kept.get_or_build("s".into(), 0, &a, move |w| async move {
                    let _ = give.send(w);
                    let mut wait = wait;
                    let _ = wait.wait_for(|go| *go).await;
                    Ok(1)
                })
                .await
            })
        };
        let wanted = wanted.await.unwrap();
        assert!(!wanted.slot_wanted(), "nobody waits for the one slot");
        let waiting = {
            let (kept, a) = (kept.clone(), a.clone());
            tokio::spawn(async move {
                kept.get_or_build("t".into(), 0, &a, |_| async { Ok(2) })
                    .await
            })
        };
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            wanted.slot_wanted(),
            "another session's request waits for it"
        );
        waiting.abort();
        let _ = waiting.await;
        assert!(
            !wanted.slot_wanted(),
            "a build waiting whose request left wants none"
        );
        let _ = go.send(true);
        assert_eq!(holder.await.unwrap().as_deref(), Ok(&1));
    }
}
