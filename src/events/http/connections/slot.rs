//! One connection's place ([`Slot`]), shared by the accept loop and the connection's task:
//! what the connection is doing (no head yet, a body being read, a request being answered,
//! idle), whether its answers are read, and how it ranks as the one to give way at the cap
//! ([`Eviction`], in the order the parent module's docs give). It decides nothing itself:
//! the cap ([`super::Connections`]) chooses, and the connection's task acts on the choice.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::super::body::Pace;

/// A connection that has not sent a whole request head after this long may be closed to
/// make room.
pub(in crate::events::http) const STALLED_AFTER: Duration = Duration::from_secs(2);
/// A connection that has sent no whole head gives way to a newcomer only once it is this old
/// ([`Eviction::NoRequestYet`]): long enough for any real client on the node to send its head,
/// short enough that places free at 2,720 a second against a flood of silent connections.
pub(super) const HEAD_GRACE: Duration = Duration::from_millis(100);
/// A connection whose answer has waited this long for the client to read it (the kernel's
/// socket buffers full, the rest in ours) is not reading: a client on loopback or on the pod
/// network reads a probe's or a scrape's answer (tens of KB) within milliseconds.
pub(super) const UNREAD_AFTER: Duration = Duration::from_millis(500);
/// A request in flight for longer than Ray's own 3 s timeout is one Ray has given up on.
pub(super) const STALE_REQUEST_AFTER: Duration = Duration::from_secs(3);

pub(super) const NEW: u8 = 0;
/// A head arrived; its body is being read.
pub(super) const BODY: u8 = 1;
/// The request is complete and being answered.
pub(super) const BUSY: u8 = 2;
pub(super) const IDLE: u8 = 3;

/// Why a connection was chosen to give way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::events::http) enum Eviction {
    /// Its answer has waited [`UNREAD_AFTER`] for the client to read it.
    NotReading,
    /// No whole request head within [`STALLED_AFTER`].
    NoRequest,
    /// A body that fell behind its pace ([`Pace`]).
    StalledBody,
    /// Idle, and it never posted events.
    IdleNoEvents,
    /// Idle.
    Idle,
    /// No whole request head yet, connected for less than [`STALLED_AFTER`]: the oldest
    /// such first (review r39h D1: a flood of connections that send nothing, 500 a second,
    /// otherwise filled every place faster than they passed [`STALLED_AFTER`], and Ray's
    /// and the probe's connections were closed at once).
    NoRequestYet,
    /// Its body is complete and waits for the collector: for a turn to be decoded (one of
    /// [`DECODERS`](super::super::body::DECODERS)) or for room for its decoded form ([`Pace::is_queued`]).
    /// It has cost nothing but its bytes yet; the one queued longest first (review r39k D1: about 300 gzip bombs waiting to be decoded held every place,
    /// and Ray's POST and `/healthz` got none within 3 s). It is answered 503 with
    /// `Retry-After` before its connection closes (review r39m D1: Ray's queued batch was
    /// closed unanswered).
    Queued,
    /// Idle, and an earlier body on it was stored with events accepted ([`Pace::delivered`]:
    /// Ray's publisher keeps its connection between batches): after every cheap client's
    /// queued body, so a flood of them does not close it (review r39q D1).
    IdleDelivered,
    /// Its body is queued as for [`Eviction::Queued`], on a connection that delivered events
    /// before: Ray's next batch, which gives way only after every other queued body (review
    /// r39q D1: with queued bodies given way the oldest first and decoded in the order they
    /// came, 300 clients looping tiny gzip bodies set the pace at which each queued body
    /// reached the head, and Ray's batch was thrown out like theirs: 1 of 32 answered 200).
    QueuedDelivered,
    /// Its request has been in flight for over [`STALE_REQUEST_AFTER`].
    StaleRequest,
}

impl Eviction {
    /// Metric label.
    pub(in crate::events::http) fn code(self) -> &'static str {
        match self {
            Eviction::NotReading => "not_reading",
            Eviction::NoRequest | Eviction::NoRequestYet => "no_request",
            Eviction::StalledBody => "stalled_body",
            Eviction::IdleNoEvents => "idle_no_events",
            Eviction::Queued | Eviction::QueuedDelivered => "queued_body",
            Eviction::Idle | Eviction::IdleDelivered => "idle",
            Eviction::StaleRequest => "stale_request",
        }
    }

    /// Whether the connection is cut at once, rather than closed once its answer is out.
    pub(in crate::events::http) fn cuts(self) -> bool {
        matches!(
            self,
            Eviction::NotReading
                | Eviction::NoRequest
                | Eviction::NoRequestYet
                | Eviction::StalledBody
                | Eviction::StaleRequest
        )
    }
}

/// What the accept loop and the connection's task share about one connection.
pub(in crate::events::http) struct Slot {
    /// A place from the reserve: one request, probe or events only.
    pub(in crate::events::http) reserved: bool,
    pub(super) opened: Instant,
    /// [`NEW`], [`BODY`], [`BUSY`] or [`IDLE`].
    pub(super) state: AtomicU8,
    /// The pace of the current request's body, shared with its reader and the body budget.
    pub(in crate::events::http) pace: Arc<Pace>,
    /// When `state` last changed, in ms after `epoch`.
    pub(super) since_ms: AtomicU64,
    /// Since when an answer has been waiting to be written out (a write found the socket's
    /// buffer full), in ms after `epoch`, plus one; 0 when everything is out.
    pub(super) unflushed_ms: AtomicU64,
    pub(super) epoch: Instant,
    /// It has posted events at least once.
    pub(super) posted: AtomicBool,
    /// Chosen to give way (never chosen twice), and why.
    pub(super) chosen: Mutex<Option<Eviction>>,
    pub(super) close: Notify,
    /// Told when a pipelined request's earlier answers went unread for [`UNREAD_AFTER`]:
    /// the connection is cut ([`Slot::cut`]).
    pub(super) cut: Notify,
    /// Told when this connection may have become able to give way.
    pub(super) usher: Arc<Usher>,
}

/// What the places tell the connections waiting for one: that one may have been freed, or
/// may give way now.
#[derive(Default)]
pub(super) struct Usher {
    /// Connections waiting (as of the last change of the queue): nobody is told anything
    /// while it is 0.
    pub(super) waiting: AtomicUsize,
    pub(super) changed: Notify,
}

impl Usher {
    pub(super) fn poke(&self) {
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.changed.notify_one();
        }
    }
}

impl Slot {
    fn now_ms(&self) -> u64 {
        Instant::now().duration_since(self.epoch).as_millis() as u64
    }

    /// A request head arrived; `events` when it posts events (whose body is read next:
    /// as its [`Slot::pace`] says, then [`Slot::body_complete`]).
    pub(in crate::events::http) fn request_started(&self, events: bool) {
        if events {
            self.posted.store(true, Ordering::Relaxed);
            self.pace.reading();
        } else {
            self.pace.paused();
        }
        self.since_ms.store(self.now_ms(), Ordering::Relaxed);
        self.state
            .store(if events { BODY } else { BUSY }, Ordering::Release);
    }

    /// The request's head carried the ingest token: the connection is Ray's from now on
    /// ([`Pace::trusted`]), and [`Slot::rank`] puts it after every other.
    pub(in crate::events::http) fn trust(&self) {
        self.pace.set_trusted();
    }

    /// The body has been read (or given up on): the request is being answered.
    pub(in crate::events::http) fn body_complete(&self) {
        self.pace.paused();
        if self.state.load(Ordering::Acquire) == BODY {
            self.since_ms.store(self.now_ms(), Ordering::Relaxed);
            self.state.store(BUSY, Ordering::Release);
        }
    }

    /// The request's answer is ready.
    pub(in crate::events::http) fn request_ended(&self) {
        self.pace.paused();
        self.since_ms.store(self.now_ms(), Ordering::Relaxed);
        self.state.store(IDLE, Ordering::Release);
        self.usher.poke();
    }

    /// A write found the socket's buffer full: an answer waits for the client to read.
    pub(super) fn write_blocked(&self) {
        if self.unflushed_ms.load(Ordering::Relaxed) == 0 {
            self.unflushed_ms
                .store(self.now_ms() + 1, Ordering::Relaxed);
        }
    }

    /// Resolves when the connection must be cut at once: a pipelined request whose earlier
    /// answers its client has not read within [`UNREAD_AFTER`] ([`earlier_answers_read`](super::earlier_answers_read)).
    pub(in crate::events::http) async fn cut(&self) {
        self.cut.notified().await
    }

    /// Every answer so far is out (in the kernel's buffer).
    pub(super) fn flushed(&self) {
        if self.unflushed_ms.load(Ordering::Relaxed) != 0 {
            self.unflushed_ms.store(0, Ordering::Relaxed);
            self.usher.poke();
        }
    }

    /// Since when an answer has been waiting for the client to read it.
    pub(super) fn unflushed_since(&self) -> Option<Instant> {
        match self.unflushed_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(self.epoch + Duration::from_millis(ms - 1)),
        }
    }

    /// Whether an answer has waited [`UNREAD_AFTER`] or more for the client to read it.
    pub(in crate::events::http) fn not_reading(&self, now: Instant) -> bool {
        self.unflushed_since()
            .is_some_and(|since| now.duration_since(since) >= UNREAD_AFTER)
    }

    /// Whether the reason it was chosen for still holds: a head that arrived, or a body
    /// that completed, since it was chosen is answered rather than cut.
    pub(in crate::events::http) fn still(&self, why: Eviction) -> bool {
        match why {
            Eviction::NotReading => self.unflushed_since().is_some(),
            Eviction::NoRequest | Eviction::NoRequestYet => {
                self.state.load(Ordering::Acquire) == NEW
            }
            Eviction::StalledBody => self.state.load(Ordering::Acquire) == BODY,
            Eviction::Queued | Eviction::QueuedDelivered => {
                self.state.load(Ordering::Acquire) == BODY && self.pace.is_queued()
            }
            Eviction::IdleNoEvents
            | Eviction::Idle
            | Eviction::IdleDelivered
            | Eviction::StaleRequest => true,
        }
    }

    /// Resolves when the connection was chosen to give way, with the reason.
    pub(in crate::events::http) async fn chosen(&self) -> Eviction {
        loop {
            self.close.notified().await;
            if let Some(why) = *lock(&self.chosen) {
                return why;
            }
        }
    }

    /// How this connection ranks as one to give way, lower first: whether it carried the
    /// ingest token ([`Pace::trusted`]: Ray's connections go after every other, review r39r
    /// D1: any local client could earn "delivered" with one valid event), then why, then
    /// since when (the oldest first, queued bodies included: ranking them by size let cheap
    /// clients with smaller bodies than Ray's batch make it the one thrown out, review r39p
    /// D1; a connection that delivered events goes after every cheap client's queued body,
    /// review r39q D1); `None` if it must not. A trusted connection's queued body never
    /// gives way: a newcomer is nobody yet, and Ray's batch waits at most its budget wait.
    pub(super) fn rank(&self, now: Instant) -> Option<(bool, Eviction, Instant)> {
        let trusted = self.pace.trusted();
        let (why, since) = self.reason(now)?;
        if trusted && matches!(why, Eviction::QueuedDelivered | Eviction::Queued) {
            return None;
        }
        Some((trusted, why, since))
    }

    /// Why this connection could give way, and since when, leaving the ingest token aside.
    fn reason(&self, now: Instant) -> Option<(Eviction, Instant)> {
        if lock(&self.chosen).is_some() {
            return None;
        }
        let since = self.epoch + Duration::from_millis(self.since_ms.load(Ordering::Relaxed));
        let unflushed = self.unflushed_since();
        if let Some(at) = unflushed.filter(|at| now.duration_since(*at) >= UNREAD_AFTER) {
            return Some((Eviction::NotReading, at));
        }
        match self.state.load(Ordering::Acquire) {
            NEW if now.duration_since(self.opened) >= STALLED_AFTER => {
                Some((Eviction::NoRequest, self.opened))
            }
            BODY if self.pace.behind(now) => Some((Eviction::StalledBody, since)),
            // No head yet past [`HEAD_GRACE`]: it has nothing in flight, and a real client
            // sends its head within milliseconds. Not younger: a burst of reconnecting clients
            // otherwise evicted Ray's own connection in the milliseconds before its head was
            // read (tests/hostile_input.rs, the stalling-bodies lockout: reset after 16 ms).
            NEW if now.duration_since(self.opened) >= HEAD_GRACE => {
                Some((Eviction::NoRequestYet, self.opened))
            }
            BODY if self.pace.is_queued() && self.pace.delivered() => {
                Some((Eviction::QueuedDelivered, since))
            }
            BODY if self.pace.is_queued() => Some((Eviction::Queued, since)),
            // A reserved place serves one request and is never kept idle.
            _ if self.reserved => None,
            // An answer on its way out: the connection is not idle yet.
            _ if unflushed.is_some() => None,
            IDLE if !self.posted.load(Ordering::Relaxed) => Some((Eviction::IdleNoEvents, since)),
            IDLE if self.pace.delivered() => Some((Eviction::IdleDelivered, since)),
            IDLE => Some((Eviction::Idle, since)),
            BUSY if now.duration_since(since) > STALE_REQUEST_AFTER => {
                Some((Eviction::StaleRequest, since))
            }
            _ => None,
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The values stay consistent whatever panicked while holding them.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
