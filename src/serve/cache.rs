//! The sessions' indexes, loaded once and kept within a byte budget.
//!
//! - **One load per session.** The first request about a session (or its `/enter_cluster`)
//!   starts its load; every request about it while it loads waits on the same load, and the
//!   later ones find it done. The counter `rhc_serve_session_loads_total` on `/metrics` says
//!   how many loads ran.
//! - **No timeout cliff.** A load is a task of its own, not of the request that started
//!   it: a client that stops waiting does not stop it. A request waits at most
//!   [`LOAD_WAIT`] (under KubeRay's 35 s write timeout and a browser's patience); past that
//!   it answers `503` with [`LOADING_HEADER`] and `Retry-After`, and the load goes on, so
//!   a request after it gets the session.
//! - **Other sessions are not blocked.** Answers from a loaded index take no lock but the
//!   cache's map for a lookup; at most [`MAX_CONCURRENT_LOADS`] loads run at once, each on
//!   a blocking thread of its own.
//! - **A byte budget.** When a load is done, the least recently used indexes are dropped
//!   until the cache holds at most `--cache-bytes` (the one just loaded is kept, even
//!   alone over the budget: it is being asked for). A failed load is not kept: the next
//!   request tries again. A session loading or reloading is outside the budget until it is
//!   done, and a reload holds the old index (answering) and the new one: the peak is the
//!   budget plus each running load's index and fold state, near twice the budget for a
//!   reload of a session about as big as it (review r36k; docs/inspect.md says so).
//! - **Live sessions are followed.** Before a load folds a session, it lists what the index
//!   is built from ([`events_signature`]: the event objects and snapshots, not the logs,
//!   which are read on each request). A request about a loaded session whose last look is
//!   [`RECHECK_AFTER`] old (or 20 times the last listing's time, if longer) lists them again
//!   in the background; when anything was added, removed or grew, the session is loaded again
//!   in the background and the new index replaces the old one when it is done. Meanwhile,
//!   and when the reload fails, the old index answers. `/enter_cluster?reload=true` reloads
//!   at once. A session that no longer changes (its cluster is gone) costs one listing per
//!   [`RECHECK_AFTER`] while someone reads it, and nothing otherwise: no timer re-reads it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Semaphore};

use super::index::{IndexBuilder, SessionIndex};
use crate::reader::{
    events_signature, session_facts, EventsSignature, Lost, OpenBucket, SessionMarker, TaskView,
};

/// Sessions loaded at once: a load uses a core (the fold) and up to ~128 MiB of fold state
/// besides the index it builds.
pub const MAX_CONCURRENT_LOADS: usize = 2;
/// How long a request waits for its session's load before answering that it is loading.
pub const LOAD_WAIT: Duration = Duration::from_secs(25);
/// Set (to `true`) on the `503` of a request that stopped waiting for its session's load.
pub const LOADING_HEADER: &str = "x-rhc-session-loading";
/// How old the last look at a loaded session's objects may be before a request about it
/// starts another (in the background).
pub const RECHECK_AFTER: Duration = Duration::from_secs(15);
/// A look at a session's objects waits at least this many times as long as the last one
/// took, so a session of many nodes is not listed all the time.
const RECHECK_FACTOR: u32 = 20;
/// Test only: [`RECHECK_AFTER`] in milliseconds, so a test sees a live session followed in
/// a second. Not a setting.
pub const TEST_RECHECK_MS: &str = "RHC_TEST_SERVE_RECHECK_MS";

/// [`RECHECK_AFTER`], or the test's ([`TEST_RECHECK_MS`]).
fn recheck_after() -> Duration {
    static AFTER: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *AFTER.get_or_init(|| {
        std::env::var(TEST_RECHECK_MS)
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(RECHECK_AFTER, Duration::from_millis)
    })
}

type Loaded = Result<Arc<SessionIndex>, Arc<String>>;

/// A load's outcome, with the signature of the objects it read (when their listing worked).
type Built = (Loaded, Option<EventsSignature>);

enum Entry {
    Loading(watch::Receiver<Option<Loaded>>),
    Ready {
        index: Arc<SessionIndex>,
        bytes: u64,
        last_used: u64,
        /// What the index was built from (`None`: unknown, the next look reloads).
        signature: Option<EventsSignature>,
        /// When its objects were last looked at, and how long that took.
        checked: Instant,
        check_took: Duration,
        /// A look or a reload is running; it sends its outcome here (`/enter_cluster?reload=true`
        /// waits on it).
        refreshing: Option<Refreshing>,
    },
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    tick: u64,
}

/// Counters shown on `/metrics`.
#[derive(Default)]
pub struct CacheStats {
    pub loads: AtomicU64,
    pub load_failures: AtomicU64,
    pub joined_loads: AtomicU64,
    pub hits: AtomicU64,
    pub evictions: AtomicU64,
    /// Looks at a loaded session's objects, and reloads they started (or `reload=true` did).
    pub checks: AtomicU64,
    pub reloads: AtomicU64,
}

pub struct SessionCache {
    budget: u64,
    inner: Mutex<Inner>,
    loads: Arc<Semaphore>,
    /// Reloads run one at a time, apart from [`Self::loads`]: a session opened for the first
    /// time never waits behind reloads (review r36k D4: a flood of `reload=true` held both
    /// load permits and a cold open waited past 25 s).
    reloads: Arc<Semaphore>,
    /// Set when the server stops: loads give up at once, so none is still reading when the
    /// runtime shuts down (review r54t D2: a load mid-body at SIGTERM polled its HTTP timer
    /// on a runtime being shut down, and its thread panicked).
    stopping: watch::Sender<bool>,
    pub stats: CacheStats,
}

/// Why a request gets no index.
pub enum Unavailable {
    /// Still loading after [`LOAD_WAIT`].
    Loading,
    /// The load failed: why.
    Failed(Arc<String>),
    /// The server is stopping: loads were given up (answered 503 with `Retry-After`, so a
    /// client asks again, of another replica if there is one).
    Stopping,
}

/// What `/enter_cluster?reload=true` got: the session loaded again, or the index held kept.
pub enum Reloaded {
    /// The new index answers (or the session, not held before, was loaded).
    Done,
    /// The reload failed, or read less of the session than the index held: the index held
    /// answers. Why.
    KeptHeld(Arc<String>),
}

/// What a refresh of a loaded session does.
#[derive(Clone, Copy)]
enum Refresh {
    /// Lists the session's objects, and reloads it if they differ from these (`None`:
    /// unknown, it reloads).
    Look(Option<EventsSignature>),
    /// Reloads it now (`reload=true`).
    Forced,
}

/// A refresh of a loaded session running: its outcome (the index that answers once it is
/// done), and why it kept the index held, if it did (set before the outcome is sent), for
/// every `reload=true` that waits on it (review r55a D2: a client that joined another's
/// reload was told it was done).
#[derive(Clone)]
struct Refreshing {
    outcome: watch::Receiver<Option<Loaded>>,
    kept: Arc<OnceLock<Arc<String>>>,
}

impl Refreshing {
    /// A refresh about to start: the sender of its outcome, and its handle.
    fn new() -> (watch::Sender<Option<Loaded>>, Refreshing) {
        let (tx, outcome) = watch::channel(None);
        let kept = Arc::new(OnceLock::new());
        (tx, Refreshing { outcome, kept })
    }

    /// Why the index held was kept, once the refresh is done (`None`: it was not).
    fn kept(&self) -> Reloaded {
        match self.kept.get() {
            Some(why) => Reloaded::KeptHeld(why.clone()),
            None => Reloaded::Done,
        }
    }
}

/// Objects and entries a load could not read (an index that has some is partial).
fn unread(index: &SessionIndex) -> u64 {
    index.facts.unreadable_objects + index.facts.skipped_entries
}

/// What a reload, `new`, lost of what the index held, `old`, had: an object the held read
/// read that it could not read, or a prefix it could not list under which the held read
/// read an object (see [`crate::reader::Coverage`]). A key the held index never saw, or
/// missed as well, is no loss: a live session with a broken object goes on being followed
/// (review r55c D1). Counts could not tell (r55a D1: a reload whose session listing failed
/// replaced an index of 7 tasks; r55b D1: one whose every GET was refused replaced an index
/// that had only missed a `logs/` listing).
fn read_less(new: &SessionIndex, old: &SessionIndex) -> Option<Lost> {
    new.facts.coverage.lost_against(&old.facts.coverage)
}

/// What [`read_less`] found, in words (the key is the bucket's: escaped).
fn read_less_why(lost: &Lost) -> String {
    use crate::util::escape::escape_untrusted;
    match lost {
        Lost::Listing(prefix) => format!(
            "it read less of the session than the index held: listing {} failed",
            escape_untrusted(prefix)
        ),
        Lost::Object(Some(key)) => format!(
            "it read less of the session than the index held: {} could not be read as far",
            escape_untrusted(key)
        ),
        Lost::Object(None) => {
            "it read less of the session than the index held: an object it had could not be \
             read as far"
                .to_string()
        }
        Lost::More {
            missed,
            held_missed,
        } => format!(
            "it read less of the session than the index held ({missed} objects and prefixes \
             missed, against {held_missed})"
        ),
    }
}

/// The cache's key of a session: where its objects are.
fn key_of(bucket: &OpenBucket, m: &SessionMarker) -> String {
    format!("{}/{}", m.history_prefix(&bucket.spec.root), m.session)
}

impl SessionCache {
    pub fn new(budget: u64) -> SessionCache {
        // Loads and the reload share the process's open files (review r56e F1).
        crate::reader::set_sessions_read_at_once(MAX_CONCURRENT_LOADS as u64 + 1);
        SessionCache {
            budget,
            inner: Mutex::new(Inner::default()),
            loads: Arc::new(Semaphore::new(MAX_CONCURRENT_LOADS)),
            reloads: Arc::new(Semaphore::new(1)),
            stopping: watch::Sender::new(false),
            stats: CacheStats::default(),
        }
    }

    /// Stops every load in progress (each ends as failed, "the server is stopping"), and any
    /// started after: called once the server answers no more.
    pub fn stop_loads(&self) {
        self.stopping.send_replace(true);
    }

    /// True once [`Self::stop_loads`] was called.
    pub fn stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the map leaves it consistent (every change is one insert
        // or remove): go on with it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// (sessions held, bytes held).
    pub fn held(&self) -> (u64, u64) {
        let inner = self.lock();
        inner.entries.values().fold((0, 0), |(n, b), e| match e {
            Entry::Ready { bytes, .. } => (n + 1, b + bytes),
            Entry::Loading(_) => (n, b),
        })
    }

    /// The loaded index, or a receiver of the load in flight (started here if none is).
    fn lookup(
        self: &Arc<Self>,
        bucket: &Arc<OpenBucket>,
        marker: &SessionMarker,
    ) -> Result<Arc<SessionIndex>, watch::Receiver<Option<Loaded>>> {
        let key = key_of(bucket, marker);
        let mut inner = self.lock();
        inner.tick += 1;
        let tick = inner.tick;
        match inner.entries.get_mut(&key) {
            Some(Entry::Ready {
                index,
                last_used,
                signature,
                checked,
                check_took,
                refreshing,
                ..
            }) => {
                *last_used = tick;
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                let index = index.clone();
                let due = (*check_took * RECHECK_FACTOR).max(recheck_after());
                if refreshing.is_none() && checked.elapsed() >= due {
                    let refresh = Refresh::Look(*signature);
                    let (tx, running) = Refreshing::new();
                    let kept = running.kept.clone();
                    *refreshing = Some(running);
                    self.spawn_refresh(key, bucket, marker, refresh, tx, kept);
                }
                return Ok(index);
            }
            Some(Entry::Loading(rx)) => {
                self.stats.joined_loads.fetch_add(1, Ordering::Relaxed);
                return Err(rx.clone());
            }
            None => {}
        }
        let (tx, rx) = watch::channel(None);
        inner
            .entries
            .insert(key.clone(), Entry::Loading(rx.clone()));
        drop(inner);
        self.stats.loads.fetch_add(1, Ordering::Relaxed);
        let (cache, bucket, marker) = (self.clone(), bucket.clone(), marker.clone());
        tokio::spawn(async move {
            let (loaded, signature) = cache.load(bucket, marker, false).await;
            cache.settle(&key, &loaded, signature, Duration::ZERO);
            let _ = tx.send(Some(loaded));
        });
        Err(rx)
    }

    /// Looks at the session's objects (for [`Refresh::Look`]) and reloads it when they changed,
    /// or reloads it at once ([`Refresh::Forced`]); the outcome (the index that answers now)
    /// goes to `tx`.
    fn spawn_refresh(
        self: &Arc<Self>,
        key: String,
        bucket: &Arc<OpenBucket>,
        marker: &SessionMarker,
        refresh: Refresh,
        tx: watch::Sender<Option<Loaded>>,
        kept: Arc<OnceLock<Arc<String>>>,
    ) {
        let (cache, bucket, marker) = (self.clone(), bucket.clone(), marker.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let (force, old) = match refresh {
                Refresh::Look(old) => (false, old),
                Refresh::Forced => (true, None),
            };
            let changed = if force {
                true
            } else {
                cache.stats.checks.fetch_add(1, Ordering::Relaxed);
                match events_signature(&bucket, &marker).await {
                    Ok(now) => old != Some(now),
                    Err(e) => {
                        // Cannot tell: the old index goes on answering, and the next look
                        // comes after the usual wait.
                        tracing::warn!(
                            session = %crate::util::escape::escape_untrusted(&marker.session),
                            "looking whether the session changed failed: {}",
                            crate::util::escape::escape_message(&format!("{e:#}"))
                        );
                        false
                    }
                }
            };
            let took = started.elapsed();
            if !changed {
                let index = cache.checked(&key, took);
                let _ = tx.send(index.map(Ok));
                return;
            }
            cache.stats.reloads.fetch_add(1, Ordering::Relaxed);
            let session = marker.session.clone();
            let (loaded, signature) = cache.load(bucket, marker, true).await;
            // The next look waits 20 times what this look and reload took, so a session that
            // keeps changing, or keeps failing to be read whole, costs at most a twentieth of
            // a core while it is read.
            let took = started.elapsed();
            let held = cache.held_index(&key);
            let lost = match (&loaded, &held) {
                // Review r36k D1: a load that lost some of what the index held had (a listing
                // or the store failing meanwhile) is no newer view of the session.
                (Ok(new), Some(old)) => read_less(new, old),
                _ => None,
            };
            // Why the index held is kept, if it is.
            let kept_because = match (&loaded, &lost) {
                (_, Some(lost)) => {
                    // Counted here; a load that failed was counted by `load` (review r55a:
                    // both were, a failed reload twice).
                    cache.stats.load_failures.fetch_add(1, Ordering::Relaxed);
                    let why = read_less_why(lost);
                    tracing::warn!(
                        session = %crate::util::escape::escape_untrusted(&session),
                        "a reload was not taken: {why}; the index held answers, and the next \
                         look tries again"
                    );
                    Some(Arc::new(why))
                }
                (Err(e), None) => Some(e.clone()),
                (Ok(_), None) => None,
            };
            match (&loaded, kept_because) {
                (Ok(index), None) => {
                    tracing::info!(
                        session = %crate::util::escape::escape_untrusted(&session),
                        forced = force,
                        "session reloaded"
                    );
                    // Review r36k D3: a session dropped from the cache meanwhile is not put
                    // back (it would push out the one asked for last).
                    cache.settle_held(&key, index, signature, took);
                    let _ = tx.send(Some(loaded));
                }
                (_, why) => {
                    // The old index is kept and answers; the next look tries again. A
                    // reload=true waiting on it is told why (review r54v: it read as done).
                    let index = cache.checked(&key, took);
                    if let Some(why) = why {
                        let _ = kept.set(why);
                    }
                    let _ = tx.send(index.map(Ok).or(Some(loaded)));
                }
            }
        });
    }

    /// Marks a look at the session's objects done (`took` long): the entry's index, if it
    /// is still held.
    fn checked(&self, key: &str, took: Duration) -> Option<Arc<SessionIndex>> {
        let mut inner = self.lock();
        match inner.entries.get_mut(key) {
            Some(Entry::Ready {
                index,
                checked,
                check_took,
                refreshing,
                ..
            }) => {
                *checked = Instant::now();
                *check_took = took;
                *refreshing = None;
                Some(index.clone())
            }
            _ => None,
        }
    }

    /// `/enter_cluster?reload=true`: loads the session again now, whether or not its objects
    /// changed (a load is started if it is not loaded), and waits for it as [`Self::get`]
    /// does; until the reload is done, other requests get the index held.
    pub async fn reload(
        self: &Arc<Self>,
        bucket: &Arc<OpenBucket>,
        marker: &SessionMarker,
    ) -> Result<Reloaded, Unavailable> {
        let key = key_of(bucket, marker);
        // A look already running may have listed before the change the caller knows of
        // (review r36k D2): wait for it, then reload.
        let mut waited_for_running = false;
        loop {
            let (running, forced) = {
                let mut inner = self.lock();
                match inner.entries.get_mut(&key) {
                    Some(Entry::Ready { refreshing, .. }) => match refreshing {
                        Some(running) => (Some(running.clone()), false),
                        None => {
                            let (tx, running) = Refreshing::new();
                            let kept = running.kept.clone();
                            *refreshing = Some(running.clone());
                            drop(inner);
                            let refresh = Refresh::Forced;
                            self.spawn_refresh(key.clone(), bucket, marker, refresh, tx, kept);
                            (Some(running), true)
                        }
                    },
                    _ => (None, false),
                }
            };
            let Some(running) = running else {
                return self.get(bucket, marker).await.map(|_| Reloaded::Done);
            };
            self.waited(running.outcome.clone()).await?;
            // This call's reload, or one running already when this call came back from
            // waiting for a look (another client's reload=true, most likely): its outcome,
            // and why it kept the index held, are this call's.
            if forced || waited_for_running {
                return Ok(running.kept());
            }
            waited_for_running = true;
        }
    }

    /// The index held for `key`, if it is loaded.
    fn held_index(&self, key: &str) -> Option<Arc<SessionIndex>> {
        match self.lock().entries.get(key) {
            Some(Entry::Ready { index, .. }) => Some(index.clone()),
            _ => None,
        }
    }

    /// Puts a reloaded index in place of the one held for `key`, if one still is (a session
    /// dropped from the cache meanwhile stays dropped).
    fn settle_held(
        &self,
        key: &str,
        index: &Arc<SessionIndex>,
        signature: Option<EventsSignature>,
        took: Duration,
    ) {
        let held = matches!(self.lock().entries.get(key), Some(Entry::Ready { .. }));
        if held {
            self.settle(key, &Ok(index.clone()), signature, took);
        }
    }

    /// Starts the session's load if it is neither loaded nor loading (`/enter_cluster`).
    pub fn prefetch(self: &Arc<Self>, bucket: &Arc<OpenBucket>, marker: &SessionMarker) {
        let _ = self.lookup(bucket, marker);
    }

    /// The session's index, waiting for its load at most [`LOAD_WAIT`].
    pub async fn get(
        self: &Arc<Self>,
        bucket: &Arc<OpenBucket>,
        marker: &SessionMarker,
    ) -> Result<Arc<SessionIndex>, Unavailable> {
        let rx = match self.lookup(bucket, marker) {
            Ok(index) => return Ok(index),
            Err(rx) => rx,
        };
        self.waited(rx).await
    }

    /// [`Self::wait`], or [`Unavailable::Stopping`] when the server stopped meanwhile.
    async fn waited(
        &self,
        rx: watch::Receiver<Option<Loaded>>,
    ) -> Result<Arc<SessionIndex>, Unavailable> {
        let waited = Self::wait(rx).await;
        match waited {
            Err(_) if self.stopping() => Err(Unavailable::Stopping),
            other => other,
        }
    }

    /// Waits for a load's outcome at most [`LOAD_WAIT`].
    async fn wait(
        mut rx: watch::Receiver<Option<Loaded>>,
    ) -> Result<Arc<SessionIndex>, Unavailable> {
        let waited = tokio::time::timeout(LOAD_WAIT, rx.wait_for(Option::is_some)).await;
        match waited {
            Err(_) => Err(Unavailable::Loading),
            Ok(Err(_)) => Err(Unavailable::Failed(Arc::new(
                "the session's load stopped".to_string(),
            ))),
            Ok(Ok(v)) => match v.as_ref() {
                Some(Ok(index)) => Ok(index.clone()),
                Some(Err(e)) => Err(Unavailable::Failed(e.clone())),
                None => Err(Unavailable::Loading),
            },
        }
    }

    /// Reads and indexes one session.
    async fn load(&self, bucket: Arc<OpenBucket>, marker: SessionMarker, reload: bool) -> Built {
        let permits = if reload { &self.reloads } else { &self.loads };
        let Ok(_permit) = permits.clone().acquire_owned().await else {
            return (Err(Arc::new("the server is stopping".to_string())), None);
        };
        let started = Instant::now();
        // Listed before the fold reads: an object written after this listing is seen by
        // the next look (at worst one reload too many, never a change missed).
        let signature = match events_signature(&bucket, &marker).await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(
                    session = %crate::util::escape::escape_untrusted(&marker.session),
                    "listing the session before its load failed (its next look reloads it): {}",
                    crate::util::escape::escape_message(&format!("{e:#}"))
                );
                None
            }
        };
        let runtime = tokio::runtime::Handle::current();
        let mut stopping = self.stopping.subscribe();
        let session = marker.session.clone();
        // The fold uses a core for seconds on a big session: a blocking thread of its own, so
        // the runtime's workers stay free to answer other requests.
        let built = tokio::task::spawn_blocking(move || {
            let mut builder = IndexBuilder::default();
            let mut add = |t: &TaskView<'_>| builder.add(t);
            // The stop first: a load that gets here after the stop signal (its listing was
            // still running) does not begin reading, whose retry timers would panic on a
            // runtime already shutting down (seen by review r55d: "A Tokio 1.x context was
            // found, but it is being shutdown", a background look's load at SIGTERM).
            let facts = runtime.block_on(async {
                tokio::select! {
                    biased;
                    _ = stopping.wait_for(|s| *s) => Err(anyhow::anyhow!("the server is stopping")),
                    facts = session_facts(&bucket, &marker, &mut add) => facts,
                }
            })?;
            Ok::<_, anyhow::Error>(builder.finish(facts))
        })
        .await;
        let result = match built {
            Ok(Ok(index)) => Ok(Arc::new(index)),
            Ok(Err(e)) => Err(Arc::new(format!("{e:#}"))),
            Err(e) => Err(Arc::new(format!("the load stopped: {e}"))),
        };
        match &result {
            Ok(index) => tracing::info!(
                session = %crate::util::escape::escape_untrusted(&session),
                attempts = index.tasks.len(),
                bytes = index.bytes(),
                seconds = started.elapsed().as_secs_f64(),
                "session loaded"
            ),
            Err(e) => {
                self.stats.load_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    session = %crate::util::escape::escape_untrusted(&session),
                    "session load failed: {}",
                    crate::util::escape::escape_message(e)
                );
            }
        }
        // A partial index (objects that could not be read) keeps no signature, so its next
        // look loads it again (review r36k D2: a listing failure at the first load was never
        // repaired, every look saying "no change").
        let signature = match &result {
            Ok(index) if unread(index) > 0 => None,
            _ => signature,
        };
        (result, signature)
    }

    /// Puts a finished load in the map (a failure: takes its entry out) and keeps the budget.
    fn settle(
        &self,
        key: &str,
        loaded: &Loaded,
        signature: Option<EventsSignature>,
        took: Duration,
    ) {
        let mut inner = self.lock();
        let index = match loaded {
            Ok(index) => index.clone(),
            Err(_) => {
                inner.entries.remove(key);
                return;
            }
        };
        inner.tick += 1;
        let tick = inner.tick;
        let bytes = index.bytes();
        inner.entries.insert(
            key.to_string(),
            Entry::Ready {
                index,
                bytes,
                last_used: tick,
                signature,
                checked: Instant::now(),
                check_took: took,
                refreshing: None,
            },
        );
        loop {
            let held: u64 = inner
                .entries
                .values()
                .map(|e| match e {
                    Entry::Ready { bytes, .. } => *bytes,
                    Entry::Loading(_) => 0,
                })
                .sum();
            if held <= self.budget {
                break;
            }
            let oldest = inner
                .entries
                .iter()
                .filter(|(k, _)| k.as_str() != key)
                .filter_map(|(k, e)| match e {
                    Entry::Ready { last_used, .. } => Some((*last_used, k.clone())),
                    Entry::Loading(_) => None,
                })
                .min();
            let Some((_, victim)) = oldest else { break };
            inner.entries.remove(&victim);
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                session = %crate::util::escape::escape_untrusted(&victim),
                "session dropped from the cache (over --cache-bytes)"
            );
        }
    }
}
