//! The time a body may take, and the runtime's own time: a body's [`Pace`] (whether its
//! bytes keep arriving, at least [`MIN_BODY_RATE`] with at most [`BODY_GRACE`] of credit, and
//! whether it waits for the collector instead), the whole read's bound [`BODY_TIMEOUT`], the
//! runtime's lag ([`runtime_lag_ms`], never counted against a client), and [`off_reactor`],
//! which keeps long CPU work off the runtime's workers. Shared by the body's reader, the
//! budget (which cuts bodies that fell behind) and the connections (which give way).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How long a client may take to send a whole body.
pub(in crate::events::http) const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// How far ahead of now a body's bytes can put its pace ([`Pace`]), and how long a body has
/// for its first bytes: Ray's batches (about 1 MB) cross loopback in milliseconds; a quarter
/// second leaves room for a collector slowed by a busy node. It is also what a client buys
/// by sending megabytes fast and then nothing: a quarter second, not the 30 s
/// [`BODY_TIMEOUT`].
pub(in crate::events::http) const BODY_GRACE: Duration = Duration::from_millis(250);
/// Bytes per second a body must keep up to count as arriving: a body streamed over loopback
/// is hundreds of times faster.
pub(in crate::events::http) const MIN_BODY_RATE: u64 = 1 << 20;
/// [`Pace`]'s `due_ms` when the collector is not reading the body (no body, or the collector
/// is the one busy: waiting for room, decoding, storing): it cannot fall behind.
const NOT_READING: u64 = u64::MAX;

/// Whether a body's bytes keep arriving, shared by the task reading it, the budget (which
/// cuts a body that fell behind when another waits for its room) and the connection's place
/// (which gives way at the connection cap when its body fell behind).
///
/// The pace is a time, `due`: each byte received moves it `1 / MIN_BODY_RATE` seconds later,
/// from now if it was behind, but never more than [`BODY_GRACE`] ahead of now; the body has
/// fallen behind once `due` has passed. So a body must never go silent for more than
/// [`BODY_GRACE`] and must keep up [`MIN_BODY_RATE`] over any stretch longer than that,
/// whatever it sent before.
pub(in crate::events::http) struct Pace {
    epoch: Instant,
    /// [`runtime_lag_ms`] at `epoch`.
    lag_at_epoch: u64,
    /// Milliseconds after `epoch`; [`NOT_READING`] when the collector is not reading.
    due_ms: AtomicU64,
    /// Told to give its room back.
    pub(super) cut: AtomicBool,
    cut_signal: Notify,
    /// The body is complete and waits for the collector: for its turn to be decoded, or for
    /// room for its decoded form. It costs nothing but its room then, and its connection may
    /// give way to a new one (see [`connections`](super::super::connections)).
    queued: AtomicBool,
    /// Bytes of the current body received so far: which queued body gives way first.
    bytes: AtomicU64,
    /// An earlier body on this connection was stored (answered 200 with events accepted):
    /// Ray's publisher keeps one connection open for its batches, so its connection has
    /// this once its first batch is in, and cheap clients (bodies refused, or holding no
    /// event) never have it. Such a body has a decoding turn of its own
    /// ([`DELIVERED_DECODERS`](super::budget::DELIVERED_DECODERS)) and its connection gives
    /// way after every other queued body (review r39q D1).
    delivered: AtomicBool,
    /// A request on this connection carried the ingest token (`POST /v1/events/<token>`):
    /// the connection is Ray's, whatever cheap clients do. It counts as delivered from its
    /// head on, so its first body already takes Ray's decoding turn, and with a token
    /// configured nothing else is ever delivered.
    trusted: AtomicBool,
}

impl Pace {
    /// A pace not being read: it never falls behind until [`Pace::reading`].
    pub(in crate::events::http) fn new() -> Pace {
        let epoch = Instant::now();
        Pace {
            epoch,
            lag_at_epoch: runtime_lag_ms(epoch),
            due_ms: AtomicU64::new(NOT_READING),
            cut: AtomicBool::new(false),
            cut_signal: Notify::new(),
            queued: AtomicBool::new(false),
            bytes: AtomicU64::new(0),
            delivered: AtomicBool::new(false),
            trusted: AtomicBool::new(false),
        }
    }

    /// Whether an earlier body on this connection was stored with events accepted.
    pub(in crate::events::http) fn delivered(&self) -> bool {
        self.delivered.load(Ordering::Relaxed)
    }

    /// A body on this connection was stored with events accepted.
    pub(in crate::events::http) fn set_delivered(&self) {
        self.delivered.store(true, Ordering::Relaxed);
    }

    /// Whether a request on this connection carried the ingest token.
    pub(in crate::events::http) fn trusted(&self) -> bool {
        self.trusted.load(Ordering::Relaxed)
    }

    /// A request on this connection carried the ingest token: it is Ray's, and delivered.
    pub(in crate::events::http) fn set_trusted(&self) {
        self.trusted.store(true, Ordering::Relaxed);
        self.delivered.store(true, Ordering::Relaxed);
    }

    /// Whether the body waits for its turn to be decoded or for room for its decoded form.
    pub(in crate::events::http) fn is_queued(&self) -> bool {
        self.queued.load(Ordering::Acquire)
    }

    pub(in crate::events::http) fn set_queued(&self, queued: bool) {
        self.queued.store(queued, Ordering::Release);
    }

    /// Tells a queued body to stop waiting and be answered `503` with `Retry-After` (its
    /// connection was chosen to give way to a new one): a body that waits for the collector
    /// is never dropped without an answer.
    pub(in crate::events::http) fn give_way(&self) {
        self.cut();
    }

    /// Milliseconds after `epoch` at `t`, less the time the runtime could not run its
    /// tasks ([`runtime_lag_ms`]): a reader that was not polled is not behind for it.
    fn ms(&self, t: Instant) -> u64 {
        (t.saturating_duration_since(self.epoch).as_millis() as u64)
            .saturating_sub(runtime_lag_ms(t).saturating_sub(self.lag_at_epoch))
    }

    /// A new body starts: a cut meant for an earlier one (which completed as it was cut) is
    /// forgotten, and the body is being read.
    pub(super) fn start(&self) {
        self.cut.store(false, Ordering::Release);
        self.set_queued(false);
        self.bytes.store(0, Ordering::Relaxed);
        self.reading();
    }

    /// The collector reads the body now (a head arrived, or the collector's own wait ended):
    /// it has [`BODY_GRACE`] for its next bytes.
    pub(in crate::events::http) fn reading(&self) {
        let now = self.ms(Instant::now());
        self.due_ms
            .store(now + BODY_GRACE.as_millis() as u64, Ordering::Relaxed);
    }

    /// `n` more bytes arrived.
    pub(in crate::events::http) fn received(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        let due = self.due_ms.load(Ordering::Relaxed);
        if due == NOT_READING {
            return;
        }
        let now = self.ms(Instant::now());
        let earned = (n as u64).saturating_mul(1000) / MIN_BODY_RATE;
        let next = due
            .max(now)
            .saturating_add(earned)
            .min(now + BODY_GRACE.as_millis() as u64);
        self.due_ms.store(next, Ordering::Relaxed);
    }

    /// The collector stops reading the body (it is complete, or the collector waits for room
    /// or decodes): the time that follows is not the client's.
    pub(in crate::events::http) fn paused(&self) {
        self.due_ms.store(NOT_READING, Ordering::Relaxed);
    }

    /// Whether the body is being read and has fallen behind its pace.
    pub(in crate::events::http) fn behind(&self, now: Instant) -> bool {
        let due = self.due_ms.load(Ordering::Relaxed);
        due != NOT_READING && self.ms(now) >= due
    }

    /// Tells the body's reader to give its room back; `false` if it was told already.
    pub(super) fn cut(&self) -> bool {
        if self.cut.swap(true, Ordering::AcqRel) {
            return false;
        }
        // notify_one keeps the wake-up if the reader is not waiting yet.
        self.cut_signal.notify_one();
        true
    }

    /// Resolves once the body was cut.
    pub(super) async fn was_cut(&self) {
        loop {
            if self.cut.load(Ordering::Acquire) {
                return;
            }
            self.cut_signal.notified().await;
        }
    }
}

/// How often [`watch_runtime_lag`] looks whether the runtime runs its tasks on time.
const LAG_TICK: Duration = Duration::from_millis(10);
/// Lateness of a tick not counted as the runtime's lag (timer granularity, a busy node).
const LAG_TOLERANCE: Duration = Duration::from_millis(20);
/// The runtime's lag counted so far, in ms ([`watch_runtime_lag`]).
static RUNTIME_LAG_MS: AtomicU64 = AtomicU64::new(0);
/// When the watcher last ran, in ms after [`lag_epoch`]; 0 while nothing watches.
static LAST_TICK_MS: AtomicU64 = AtomicU64::new(0);
static LAG_WATCHED: AtomicBool = AtomicBool::new(false);
static LAG_EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn lag_epoch() -> Instant {
    *LAG_EPOCH.get_or_init(Instant::now)
}

/// Time in which the runtime could not run its tasks (its workers busy, the process not
/// scheduled), in ms since the watcher started: a body's reader is not polled then, so its
/// bytes wait in the socket and its [`Pace`] must not count that time against the client.
/// Includes the lag going on at `now` (the watcher itself has not run for too long).
fn runtime_lag_ms(now: Instant) -> u64 {
    let counted = RUNTIME_LAG_MS.load(Ordering::Relaxed);
    let last = LAST_TICK_MS.load(Ordering::Relaxed);
    if last == 0 {
        return counted;
    }
    let now_ms = now.saturating_duration_since(lag_epoch()).as_millis() as u64;
    let late = now_ms.saturating_sub(last + LAG_TICK.as_millis() as u64);
    if late > LAG_TOLERANCE.as_millis() as u64 {
        counted + late
    } else {
        counted
    }
}

/// Counts the runtime's lag ([`runtime_lag_ms`]) for as long as the runtime runs; started
/// once ([`start_lag_watch`]).
async fn watch_runtime_lag() {
    loop {
        let before = Instant::now();
        LAST_TICK_MS.store(
            (before.saturating_duration_since(lag_epoch()).as_millis() as u64).max(1),
            Ordering::Relaxed,
        );
        tokio::time::sleep(LAG_TICK).await;
        let late = before.elapsed().saturating_sub(LAG_TICK);
        if late > LAG_TOLERANCE {
            RUNTIME_LAG_MS.fetch_add(late.as_millis() as u64, Ordering::Relaxed);
        }
    }
}

/// Starts counting the runtime's lag, once per process, on the current runtime.
pub(in crate::events::http) fn start_lag_watch() {
    if let Ok(h) = tokio::runtime::Handle::try_current() {
        if !LAG_WATCHED.swap(true, Ordering::AcqRel) {
            lag_epoch();
            h.spawn(watch_runtime_lag());
        }
    }
}

/// Runs `f`, which may keep a CPU busy for long (decoding gzip, parsing and routing a body),
/// where it does not hold one of the runtime's workers: the worker's other tasks (every
/// connection's reads and answers, the probes) move to another thread meanwhile
/// ([`tokio::task::block_in_place`]). Without it two bodies of tiny elements held both
/// workers for tens of seconds: Ray and `/healthz` got no answer. The threads that run such
/// work are tokio's blocking pool; the memory they work on is the bodies' room in the body
/// budget, so it stays bounded however many run.
pub(in crate::events::http) fn off_reactor<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_pace_buys_at_most_a_grace_whatever_was_sent_before() {
        let p = Pace::new();
        assert!(
            !p.behind(Instant::now() + BODY_TIMEOUT),
            "not read: never behind"
        );
        p.start();
        // 64 MiB at once, then nothing: behind a grace later, not a minute later.
        p.received(64 << 20);
        tokio::time::advance(BODY_GRACE - Duration::from_millis(1)).await;
        assert!(!p.behind(Instant::now()));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(p.behind(Instant::now()));
        // Bytes at the minimum rate keep it arriving; at half of it, it falls behind.
        p.reading();
        for _ in 0..40 {
            tokio::time::advance(Duration::from_millis(50)).await;
            p.received((MIN_BODY_RATE / 20) as usize);
            assert!(!p.behind(Instant::now()));
        }
        let mut fell_behind = false;
        for _ in 0..40 {
            tokio::time::advance(Duration::from_millis(50)).await;
            fell_behind |= p.behind(Instant::now());
            p.received((MIN_BODY_RATE / 40) as usize);
        }
        assert!(fell_behind);
        // The collector's own waits are not the client's.
        p.paused();
        tokio::time::advance(BODY_TIMEOUT).await;
        assert!(!p.behind(Instant::now()));
    }
}
