//! The connection cap, and which connection gives way when it is reached.
//!
//! At most [`MAX_CONNECTIONS`] connections are served at once, and the accept loop never
//! waits for a place: what becomes of a new connection is decided at once ([`Arrival`]), so
//! one more client can never stall the listener (Ray's publisher and the kubelet's probe
//! included). At the cap, a new connection takes the place of the least useful open one,
//! chosen in this order:
//!
//! 1. one whose answer has waited [`UNREAD_AFTER`](slot::UNREAD_AFTER) for the client to read it (the socket's
//!    buffers are full: a client that pipelines requests and never reads its answers); it
//!    is not idle, and its answers cost memory until they are out;
//! 2. one that has not sent a whole request head within [`STALLED_AFTER`] (a real client
//!    sends its head within milliseconds of connecting); it has nothing in flight;
//! 3. one whose request body has fallen behind its pace ([`Pace`]: silent for
//!    [`BODY_GRACE`](super::body::BODY_GRACE), or slower than [`MIN_BODY_RATE`](super::body::MIN_BODY_RATE), whatever it sent before): on loopback
//!    a real client's body follows its head within milliseconds, so this one is stalling,
//!    whatever it pipelines behind it; the one whose head came first goes first;
//! 4. one idle between requests, its answers all out, that has never posted events
//!    (probes, scrapers, anything else), the one idle longest first;
//! 5. one idle between requests that has posted events but never had any stored, the one
//!    idle longest first;
//! 6. one that has not sent a whole request head yet and is at least [`HEAD_GRACE`](slot::HEAD_GRACE) (100 ms)
//!    old, the oldest first: a real client sends its head within milliseconds of connecting,
//!    so it keeps its place, while connections that send nothing (a flood of them, 500 a
//!    second on each listener: review r39h D1) take each other's places instead of
//!    refusing Ray's and the probe's;
//! 7. one whose body is complete and waits for the collector, for its turn to be decoded
//!    (at most [`DECODERS`](super::body::DECODERS) gzip bodies are decoded at once) or for room
//!    for its decoded form: it has cost nothing but its bytes yet, and gzip bombs thrown at
//!    every place (review r39k D1) would otherwise hold them all while they wait; the one
//!    queued longest first (not the largest: a client can always send a smaller body than
//!    Ray's batch, which then went first every time: review r39p D1). The body is
//!    told to stop waiting ([`Pace::give_way`]) and answered 503 with `Retry-After`, then the
//!    connection closes: a body that waits for the collector is never dropped unanswered;
//! 8. one idle between requests whose earlier body was stored with events accepted
//!    ([`Pace::delivered`]), the one idle longest first;
//! 9. such a connection's queued body (as in 7): Ray's publisher keeps one connection for its
//!    batches, so once its first batch is in, clients whose bodies are refused or hold no
//!    event cannot close it or throw its next batch out, however many come (review r39q
//!    D1: 300 clients looping tiny gzip bodies left Ray 1 of 32 batches when every queued
//!    body had the same odds); its bodies have a decoding turn of their own too
//!    (the body budget's `DELIVERED_DECODERS`);
//! 10. one whose request has been waiting for its answer (its body complete: Ray's batch
//!     waiting for the spool) for over [`STALE_REQUEST_AFTER`](slot::STALE_REQUEST_AFTER), the oldest first: Ray gives
//!     up on a request after 3 s and resends it, so nobody waits for it.
//!
//! With an ingest token configured (`--ingest-token-file`), "delivered" is earned only with it
//! (review r39r D1: without one, any local client earned it by posting one valid event, and
//! 300 such clients locked Ray's kept connection out again): a connection whose head carried
//! the token ([`Pace::trusted`]) ranks after every connection without it, whatever either is
//! doing, in the order above among themselves, and its queued body never gives way (a
//! newcomer is nobody yet; the body waits at most its budget wait). Posts without the token
//! are refused from their head and never read, so they earn nothing.
//!
//! So a request whose body is complete is never chosen before Ray has given up on it
//! (unless it is a gzip body waiting for its turn to be decoded or for room, which is
//! answered 503 first), and
//! keeping a place costs a client a whole request every [`BODY_GRACE`](super::body::BODY_GRACE) (or a body streamed
//! at [`MIN_BODY_RATE`](super::body::MIN_BODY_RATE)): pipelining restarts nothing, since a head whose body stalls is the
//! least useful thing open, and a client reconnecting after being cut takes the place of
//! another stalled one, not of a complete request. The grace is short so that clients that
//! stall in step (all heads at once, every body late) leave only a short window in which
//! nothing can give way (measured with 256 such connections and 16 holding the reserved
//! places, a one-second grace refused Ray's connection in 2 of 20 tries, and this one still
//! in about 1 of 6 runs of eight tries each): a newcomer in that window waits for a place
//! (below). An idle connection is closed gracefully (a request that arrives
//! meanwhile is answered, within [`LEAVE_GRACE`], and cut as soon as that answer has waited
//! [`UNREAD_AFTER`](slot::UNREAD_AFTER) to be read), and so is one whose body was queued (once its 503 is
//! out); the others are cut. A connection that has been chosen keeps
//! its socket until it has gone, so up to [`MAX_LEAVING`] more may be open; since none of
//! them waits on a client that does not read, they leave within [`LEAVE_GRACE`] at most and
//! within milliseconds in the usual case, and keep no newcomer out for long.
//!
//! When none can give way (every place busy with complete requests for less than 3 s, or
//! with bodies arriving), the new connection gets one of
//! [`RESERVED`] places kept for the liveness probe and Ray: it is served one request, only
//! `GET /healthz`, `/readyz` or `POST /v1/events`, then closed; its body must arrive within
//! [`RESERVED_BODY_TIMEOUT`] (the caller's deadline), and a reserved place that has sent no head
//! or whose body stalls gives way like a regular one (to a new
//! connection that then takes the reserved place).
//!
//! Past that too, the new connection waits for a place, in a waiting room of
//! [`MAX_WAITING`], rather than being closed: cheap clients that all stall in step (256
//! connections each sending a head whose body is due a little later, 16 more holding the
//! reserved places with heads, all at the same instant) leave a moment in which every place
//! holds a head whose body is not late yet, and a connection closed then (Ray's, the
//! probe's) is a refusal its client counts as a failure; a moment later those places can
//! give way. The waiting ones are seated the first come first, ahead of any newer
//! connection, as soon as a place is freed or can be made: looked at on every change that can
//! make one (a connection gone, gone idle, its answers out) and every [`SEAT_CHECK`] for what
//! time makes (a body falling behind its pace, a head past its grace). None holds a socket
//! for longer than [`MAX_WAIT`], which is longer than every grace after which a place held by
//! a cheap client gives way and short enough that Ray still gets its answer within its 3 s:
//! one that got no place by then is closed, as is a new connection that finds the waiting
//! room full. So a new connection is closed only when no place was freed or could give way for
//! [`MAX_WAIT`] (every place busy with bodies that kept arriving or with complete requests
//! younger than 3 s, or [`MAX_LEAVING`] connections still leaving), or when [`MAX_WAITING`]
//! others wait already; and sockets held by the HTTP side are bounded by
//! [`MAX_CONNECTIONS`] + [`RESERVED`] + [`MAX_LEAVING`] + [`MAX_WAITING`] (400) whatever the
//! clients do, the waiting ones holding nothing but their socket (their heads stay in the
//! kernel's buffer until they are seated).

mod slot;
mod unread;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use super::body::Pace;
use slot::{lock, Usher, NEW};
pub(super) use slot::{Eviction, Slot, STALLED_AFTER};
pub(super) use unread::{earlier_answers_read, stuck_answer, Watched};

/// Connections served at once: the places a node's Ray agent, probes and scrapers share.
pub(super) const MAX_CONNECTIONS: usize = 256;
/// Places beyond the cap for one request each (the probe, a POST) when no open connection
/// can give way.
pub(super) const RESERVED: usize = 16;
/// Connections chosen to give way that may still be open while they finish: with an
/// accepted connection each, they are what one burst of new clients costs.
pub(super) const MAX_LEAVING: usize = 64;
/// How long a reserved place's body may take in all: the place is for a client that could
/// not get a regular one, so it must not be held; a third of Ray's own 3 s timeout.
pub(super) const RESERVED_BODY_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an idle connection chosen to give way may take to answer a request that
/// arrived just as it was chosen.
pub(super) const LEAVE_GRACE: Duration = Duration::from_secs(3);
/// New connections that may wait for a place at once ([`Arrival::Waiting`]), beyond the
/// cap: each holds a socket and nothing else (its head stays in the kernel's buffer).
pub(super) const MAX_WAITING: usize = 64;
/// How long a new connection waits for a place before it is closed: what the clients that
/// matter can spare (Ray's agent gives a request 3 s, the chart's liveness probe 5 s), and
/// longer than every grace after which a place held by a cheap client gives way
/// ([`HEAD_GRACE`](slot::HEAD_GRACE), [`BODY_GRACE`](super::body::BODY_GRACE), [`UNREAD_AFTER`](slot::UNREAD_AFTER),
/// [`RESERVED_BODY_TIMEOUT`]).
pub(super) const MAX_WAIT: Duration = Duration::from_millis(1500);
/// How often the waiting connections look for a place that time has made able to give way
/// (a body fallen behind its pace, a head past its grace); a place freed or a connection
/// gone idle is looked at as it happens.
pub(super) const SEAT_CHECK: Duration = Duration::from_millis(50);

/// The open connections and their counts.
#[derive(Default)]
struct Live {
    slots: BTreeMap<u64, Arc<Slot>>,
    /// Regular places in use: not reserved, not chosen to give way.
    regular: usize,
    reserved: usize,
    /// Chosen to give way, still open.
    leaving: usize,
    /// New connections waiting for a place, the first come first.
    waiting: VecDeque<Waiter>,
}

/// A new connection waiting for a place: its place is sent to it.
struct Waiter {
    ticket: u64,
    seat: oneshot::Sender<Admitted>,
}

/// The open connections.
pub(super) struct Connections {
    live: Mutex<Live>,
    next_id: AtomicU64,
    epoch: Instant,
    usher: Arc<Usher>,
}

/// A connection's place; dropping it frees the place.
pub(super) struct Admitted {
    pub(super) slot: Arc<Slot>,
    /// The connection that was chosen to make room for this one, and why.
    pub(super) evicted: Option<Eviction>,
    id: u64,
    connections: Arc<Connections>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut live = lock(&self.connections.live);
        if live.slots.remove(&self.id).is_none() {
            return;
        }
        if lock(&self.slot.chosen).is_some() {
            live.leaving -= 1;
        } else if self.slot.reserved {
            live.reserved -= 1;
        } else {
            live.regular -= 1;
        }
        drop(live);
        self.connections.usher.poke();
    }
}

/// What becomes of a just-accepted connection.
pub(super) enum Arrival {
    /// It has a place.
    Seated(Admitted),
    /// No place could be had at once: it waits for one, at most [`MAX_WAIT`].
    Waiting(Waiting),
    /// No place, and [`MAX_WAITING`] connections wait already: it is closed at once.
    Refused,
}

/// A new connection waiting for a place; dropping it gives up its turn.
pub(super) struct Waiting {
    ticket: u64,
    seat: oneshot::Receiver<Admitted>,
    until: Instant,
    connections: Arc<Connections>,
}

impl Waiting {
    /// Its place, once one is free or can be made (the first come, the first seated), or
    /// `None` after [`MAX_WAIT`]: the connection is then closed.
    pub(super) async fn seated(&mut self) -> Option<Admitted> {
        match tokio::time::timeout_at(self.until, &mut self.seat).await {
            Ok(seat) => seat.ok(),
            // Out of the queue under its lock, or already handed a place (sent under it).
            Err(_) if self.connections.leave_queue(self.ticket) => None,
            Err(_) => self.seat.try_recv().ok(),
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.connections.leave_queue(self.ticket);
    }
}

impl Connections {
    pub(super) fn new() -> Arc<Connections> {
        Arc::new(Connections {
            live: Mutex::new(Live::default()),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
            usher: Arc::new(Usher::default()),
        })
    }

    /// What becomes of a just-accepted connection, decided at once: a place (free, made by
    /// choosing a connection to give way, or reserved) if one can be had and nobody waits
    /// for one before it; else a turn in the waiting room if it has room; else refused.
    pub(super) fn arrive(self: &Arc<Self>) -> Arrival {
        let mut unsent = Vec::new();
        let mut live = lock(&self.live);
        self.seat_waiting_locked(&mut live, &mut unsent);
        let arrival = if live.waiting.is_empty() {
            self.place(&mut live).map(Arrival::Seated)
        } else {
            None
        };
        let arrival = arrival.unwrap_or_else(|| {
            if live.waiting.len() >= MAX_WAITING {
                return Arrival::Refused;
            }
            let ticket = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            live.waiting.push_back(Waiter { ticket, seat: tx });
            self.usher
                .waiting
                .store(live.waiting.len(), Ordering::Relaxed);
            Arrival::Waiting(Waiting {
                ticket,
                seat: rx,
                until: Instant::now() + MAX_WAIT,
                connections: self.clone(),
            })
        });
        drop(live);
        // Places whose connection gave up waiting as they were handed over: freed here,
        // outside the lock.
        drop(unsent);
        arrival
    }

    /// Gives the waiting connections, the first come first, the places that can be had now.
    pub(super) fn seat_waiting(self: &Arc<Self>) {
        let mut unsent = Vec::new();
        let mut live = lock(&self.live);
        self.seat_waiting_locked(&mut live, &mut unsent);
        drop(live);
        drop(unsent);
    }

    /// Resolves when the waiting connections should look for a place again: something
    /// changed (a place freed, a connection gone idle), or [`SEAT_CHECK`] passed while one
    /// waits; never while nobody waits and nothing changed.
    pub(super) async fn seat_due(&self) {
        if self.usher.waiting.load(Ordering::Relaxed) == 0 {
            self.usher.changed.notified().await;
        } else {
            let _ = tokio::time::timeout(SEAT_CHECK, self.usher.changed.notified()).await;
        }
    }

    /// Hands places to waiting connections while there are some to be had; the places
    /// whose connection gave up meanwhile go to `unsent`, to be dropped once the lock is
    /// released.
    fn seat_waiting_locked(self: &Arc<Self>, live: &mut Live, unsent: &mut Vec<Admitted>) {
        while let Some(first) = live.waiting.front() {
            if first.seat.is_closed() {
                live.waiting.pop_front();
                continue;
            }
            let Some(admitted) = self.place(live) else {
                break;
            };
            if let Some(first) = live.waiting.pop_front() {
                if let Err(admitted) = first.seat.send(admitted) {
                    unsent.push(admitted);
                }
            }
        }
        self.usher
            .waiting
            .store(live.waiting.len(), Ordering::Relaxed);
    }

    /// Takes a connection out of the waiting room; whether it was still in it.
    fn leave_queue(&self, ticket: u64) -> bool {
        let mut live = lock(&self.live);
        let before = live.waiting.len();
        live.waiting.retain(|w| w.ticket != ticket);
        self.usher
            .waiting
            .store(live.waiting.len(), Ordering::Relaxed);
        live.waiting.len() < before
    }

    /// A place for a just-accepted connection, at once, ahead of any that wait: a free one,
    /// one made by choosing a connection to give way, or one from the reserve; `None` if
    /// there is none.
    #[cfg(test)]
    fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut live = lock(&self.live);
        self.place(&mut live)
    }

    fn place(self: &Arc<Self>, live: &mut Live) -> Option<Admitted> {
        if live.slots.len() >= MAX_CONNECTIONS + RESERVED + MAX_LEAVING {
            return None;
        }
        if live.regular < MAX_CONNECTIONS {
            return Some(self.register(live, false, None));
        }
        if live.leaving < MAX_LEAVING {
            if let Some((why, reserved)) = Self::choose(live) {
                // The newcomer takes the place, regular or reserved, that was given up.
                return Some(self.register(live, reserved, Some(why)));
            }
        }
        if live.reserved < RESERVED {
            return Some(self.register(live, true, None));
        }
        None
    }

    fn register(
        self: &Arc<Self>,
        live: &mut Live,
        reserved: bool,
        evicted: Option<Eviction>,
    ) -> Admitted {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let slot = Arc::new(Slot {
            reserved,
            opened: now,
            state: AtomicU8::new(NEW),
            pace: Arc::new(Pace::new()),
            since_ms: AtomicU64::new(now.duration_since(self.epoch).as_millis() as u64),
            unflushed_ms: AtomicU64::new(0),
            epoch: self.epoch,
            posted: AtomicBool::new(false),
            chosen: Mutex::new(None),
            close: Notify::new(),
            cut: Notify::new(),
            usher: self.usher.clone(),
        });
        live.slots.insert(id, slot.clone());
        if reserved {
            live.reserved += 1;
        } else {
            live.regular += 1;
        }
        Admitted {
            slot,
            evicted,
            id,
            connections: self.clone(),
        }
    }

    /// Chooses the connection that gives way, tells it, and moves it from its place to the
    /// leaving ones; why, and whether its place was a reserved one.
    fn choose(live: &mut Live) -> Option<(Eviction, bool)> {
        let now = Instant::now();
        let (rank, slot) = live
            .slots
            .values()
            .filter_map(|s| s.rank(now).map(|rank| (rank, s)))
            .min_by_key(|(rank, _)| *rank)?;
        let why = rank.1;
        *lock(&slot.chosen) = Some(why);
        if matches!(why, Eviction::Queued | Eviction::QueuedDelivered) {
            // Answered 503 with Retry-After, then closed: never dropped without an answer.
            slot.pace.give_way();
        }
        // notify_one keeps the wake-up if the task is not waiting yet.
        slot.close.notify_one();
        if slot.reserved {
            live.reserved -= 1;
        } else {
            live.regular -= 1;
        }
        live.leaving += 1;
        Some((why, slot.reserved))
    }
}

#[cfg(test)]
mod tests {
    use super::super::body;
    use super::slot::{HEAD_GRACE, STALE_REQUEST_AFTER, UNREAD_AFTER};
    use super::*;

    fn chosen(a: &Admitted) -> Option<Eviction> {
        *lock(&a.slot.chosen)
    }

    fn fill(conns: &Arc<Connections>, n: usize) -> Vec<Admitted> {
        (0..n).map(|_| conns.admit().expect("a place")).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_least_useful_connection_gives_way_in_order() {
        let conns = Connections::new();
        let mut open = fill(&conns, MAX_CONNECTIONS);
        // Every place busy with a fresh request: nothing gives way, the reserve is used.
        for a in &open {
            a.slot.request_started(true);
            a.slot.body_complete();
        }
        let reserved = conns.admit().expect("a reserved place");
        assert!(reserved.slot.reserved && reserved.evicted.is_none());
        drop(reserved);

        // Shape the 256: a poster that went idle first, probes idle at different times,
        // one with no request head, one request in flight for long.
        tokio::time::advance(Duration::from_secs(1)).await;
        open[0].slot.request_ended(); // idle poster, idle longest
                                      // Probes: new connections that only ever asked for /healthz.
        drop(open.drain(1..4));
        let probes = fill(&conns, 3);
        for p in &probes {
            p.slot.request_started(false);
        }
        tokio::time::advance(Duration::from_millis(10)).await;
        probes[1].slot.request_ended(); // idle longest of the probes
        tokio::time::advance(Duration::from_millis(10)).await;
        probes[2].slot.request_ended();
        tokio::time::advance(Duration::from_millis(10)).await;
        probes[0].slot.request_ended();
        drop(open.pop());
        let silent = conns.admit().expect("a place");
        // Newcomers post at once, as Ray does.
        let admit = || {
            let a = conns.admit().expect("admitted by eviction");
            a.slot.request_started(true);
            a.slot.body_complete();
            a
        };

        // Under STALLED_AFTER the silent one is spared: the probe idle longest goes first.
        let a = admit();
        assert_eq!(a.evicted, Some(Eviction::IdleNoEvents));
        assert_eq!(chosen(&probes[1]), Some(Eviction::IdleNoEvents));
        let b = admit();
        assert_eq!(chosen(&probes[2]), Some(Eviction::IdleNoEvents));
        // Past STALLED_AFTER the silent one goes before the last probe.
        tokio::time::advance(STALLED_AFTER).await;
        let c = admit();
        assert_eq!(chosen(&silent), Some(Eviction::NoRequest));
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(1), silent.slot.chosen()).await,
            Ok(Eviction::NoRequest)
        );
        let d = admit();
        assert_eq!(chosen(&probes[0]), Some(Eviction::IdleNoEvents));
        // Then the idle poster; then requests in flight for over 3 s, oldest first.
        let e = admit();
        assert_eq!(e.evicted, Some(Eviction::Idle));
        assert_eq!(chosen(&open[0]), Some(Eviction::Idle));
        let f = admit();
        assert_eq!(f.evicted, Some(Eviction::StaleRequest));
        assert!(Eviction::StaleRequest.cuts() && !Eviction::Idle.cuts());
        // The newcomers themselves are fresh: they are not chosen.
        for n in [&a, &b, &c, &d, &e, &f] {
            assert_eq!(chosen(n), None);
        }
        drop((a, b, c, d, e, f, silent, probes, open));
        let live = lock(&conns.live);
        assert_eq!(
            (live.slots.len(), live.regular, live.leaving, live.reserved),
            (0, 0, 0, 0)
        );
    }

    /// Review r39q D1: a connection that had events stored gives way after every other
    /// queued body, idle or queued itself, however long it has been idle or queued.
    #[tokio::test(start_paused = true)]
    async fn a_connection_that_delivered_events_gives_way_after_cheap_queued_bodies() {
        let conns = Connections::new();
        let open = fill(&conns, MAX_CONNECTIONS);
        let queue = |a: &Admitted| {
            a.slot.request_started(true);
            a.slot.pace.paused();
            a.slot.pace.set_queued(true);
        };
        // Ray's kept connection, idle longest, and another whose next body queued first.
        open[0].slot.pace.set_delivered();
        open[0].slot.request_started(true);
        open[0].slot.request_ended();
        open[1].slot.pace.set_delivered();
        queue(&open[1]);
        tokio::time::advance(Duration::from_millis(10)).await;
        // Cheap clients' bodies queued later (the other places hold fresh connections).
        for a in &open[2..6] {
            queue(a);
        }
        let mut newcomers = Vec::new();
        for _ in 2..6 {
            let a = conns.admit().expect("admitted by eviction");
            assert_eq!(a.evicted, Some(Eviction::Queued));
            newcomers.push(a);
        }
        assert!(open[2..6]
            .iter()
            .all(|a| chosen(a) == Some(Eviction::Queued)));
        assert_eq!(chosen(&open[0]), None);
        assert_eq!(chosen(&open[1]), None);
        // Then the delivered ones: idle first, then queued.
        let a = conns.admit().expect("admitted by eviction");
        assert_eq!(a.evicted, Some(Eviction::IdleDelivered));
        let b = conns.admit().expect("admitted by eviction");
        assert_eq!(b.evicted, Some(Eviction::QueuedDelivered));
        assert_eq!(chosen(&open[0]), Some(Eviction::IdleDelivered));
        assert_eq!(chosen(&open[1]), Some(Eviction::QueuedDelivered));
        drop((a, b, newcomers, open));
    }

    /// Review r39r D1: with an ingest token, a connection that presented it gives way only
    /// after every other, whatever either is doing (its stalled body after every cheap
    /// client's request Ray has given up on), and its queued body never does.
    #[tokio::test(start_paused = true)]
    async fn connections_with_the_ingest_token_give_way_after_every_other() {
        let conns = Connections::new();
        let mut open = fill(&conns, MAX_CONNECTIONS);
        let ray_queued = open.pop().expect("a place");
        let ray_stalled = open.pop().expect("a place");
        let ray_idle = open.pop().expect("a place");
        for r in [&ray_idle, &ray_stalled, &ray_queued] {
            r.slot.request_started(true);
            r.slot.trust();
            assert!(r.slot.pace.delivered());
        }
        ray_idle.slot.request_ended();
        ray_queued.slot.pace.paused();
        ray_queued.slot.pace.set_queued(true);
        // Every other place: a request Ray would have given up on by now.
        for a in &open {
            a.slot.request_started(true);
            a.slot.body_complete();
        }
        tokio::time::advance(STALE_REQUEST_AFTER + Duration::from_secs(1)).await;
        assert!(ray_stalled.slot.pace.behind(Instant::now()));
        let mut newcomers = Vec::new();
        while !open.is_empty() {
            let a = conns.admit().expect("admitted by eviction");
            assert_eq!(a.evicted, Some(Eviction::StaleRequest));
            newcomers.push(a);
            open.retain(|o| chosen(o).is_none());
        }
        for r in [&ray_idle, &ray_stalled, &ray_queued] {
            assert_eq!(chosen(r), None);
        }
        // Then Ray's, in the usual order among themselves; never its queued body.
        let a = conns.admit().expect("admitted by eviction");
        assert_eq!(chosen(&ray_stalled), Some(Eviction::StalledBody));
        let b = conns.admit().expect("admitted by eviction");
        assert_eq!(chosen(&ray_idle), Some(Eviction::IdleDelivered));
        let c = conns.admit().expect("a reserved place");
        assert!(c.slot.reserved && c.evicted.is_none());
        assert_eq!(chosen(&ray_queued), None);
        drop((a, b, c, newcomers, ray_idle, ray_stalled, ray_queued));
    }

    /// Connections that send nothing take each other's places once [`HEAD_GRACE`] old, the
    /// oldest first, well before [`STALLED_AFTER`]; one that sent its head keeps its place,
    /// and idle ones go before them.
    #[tokio::test(start_paused = true)]
    async fn connections_with_no_head_give_way_oldest_first_after_their_grace() {
        let conns = Connections::new();
        let mut open = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            open.push(conns.admit().expect("a place"));
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        // The last one is a real client: its head arrived.
        open[MAX_CONNECTIONS - 1].slot.request_started(true);
        open[MAX_CONNECTIONS - 1].slot.body_complete();
        open[1].slot.request_started(false);
        open[1].slot.request_ended();
        // Well under STALLED_AFTER: the idle one goes first, then the silent ones, oldest first.
        let a = conns.admit().expect("admitted by eviction");
        assert_eq!(a.evicted, Some(Eviction::IdleNoEvents));
        let b = conns.admit().expect("admitted by eviction");
        assert_eq!(b.evicted, Some(Eviction::NoRequestYet));
        assert_eq!(chosen(&open[0]), Some(Eviction::NoRequestYet));
        assert!(Eviction::NoRequestYet.cuts() && open[0].slot.still(Eviction::NoRequestYet));
        let c = conns.admit().expect("admitted by eviction");
        assert_eq!(chosen(&open[2]), Some(Eviction::NoRequestYet));
        // A flood of them: each newcomer takes the oldest silent place, never the request's.
        let mut flood = vec![a, b, c];
        for _ in 0..2 * MAX_CONNECTIONS {
            // Each silent newcomer gives way once it is HEAD_GRACE old.
            tokio::time::advance(HEAD_GRACE).await;
            flood.push(conns.admit().expect("admitted by eviction"));
            flood.retain(|f| chosen(f).is_none());
            open.retain(|o| chosen(o).is_none());
        }
        assert_eq!(chosen(&open[open.len() - 1]), None);
        assert!(open[open.len() - 1].slot.state.load(Ordering::Acquire) != NEW);
        assert_eq!(lock(&conns.live).reserved, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalling_body_gives_way_and_a_complete_request_does_not() {
        let conns = Connections::new();
        let open = fill(&conns, MAX_CONNECTIONS);
        // Every place posts; the first 255 bodies stall, the last one is complete (Ray's
        // batch waiting for the spool).
        for a in &open {
            a.slot.request_started(true);
        }
        open[MAX_CONNECTIONS - 1].slot.pace.received(641);
        open[MAX_CONNECTIONS - 1].slot.body_complete();
        // Under BODY_GRACE nobody gives way: a reserved place.
        let r = conns.admit().expect("a reserved place");
        assert!(r.slot.reserved && r.evicted.is_none());
        r.slot.request_started(true);
        // Past it the stalled ones give way, oldest head first, before anything else.
        tokio::time::advance(body::BODY_GRACE).await;
        open[0].slot.pace.received(256 << 10); // arriving at 1 MiB/s: not stalling
        let a = conns.admit().expect("admitted by eviction");
        assert_eq!(a.evicted, Some(Eviction::StalledBody));
        assert!(!a.slot.reserved);
        assert_eq!(chosen(&open[1]), Some(Eviction::StalledBody));
        assert!(open[1].slot.still(Eviction::StalledBody));
        assert!(Eviction::StalledBody.cuts());
        // The other bodies complete; the reserved place's stalls: it gives way, and its
        // newcomer takes the reserved place.
        for o in &open[2..] {
            o.slot.body_complete();
        }
        let b = conns.admit().expect("admitted by eviction");
        assert_eq!(chosen(&r), Some(Eviction::StalledBody));
        assert!(b.slot.reserved);
        // Complete requests and a body still arriving are spared.
        assert_eq!(chosen(&open[0]), None);
        assert_eq!(chosen(&open[MAX_CONNECTIONS - 1]), None);
        drop((a, b, r, open));
        let live = lock(&conns.live);
        assert_eq!(
            (live.slots.len(), live.regular, live.leaving, live.reserved),
            (0, 0, 0, 0)
        );
    }

    fn waiting(a: Arrival) -> Waiting {
        match a {
            Arrival::Waiting(w) => w,
            Arrival::Seated(_) => panic!("seated at once"),
            Arrival::Refused => panic!("refused"),
        }
    }

    /// Every place, reserved ones too, holds a head whose body is not late yet: nothing can
    /// give way at this instant, but something will within [`BODY_GRACE`](body::BODY_GRACE).
    /// The newcomers wait rather than being closed, and are seated the first come first:
    /// one as soon as a place is freed, the next once a body falls behind.
    #[tokio::test(start_paused = true)]
    async fn a_newcomer_with_no_place_waits_for_one_first_come_first() {
        let conns = Connections::new();
        let mut open = fill(&conns, MAX_CONNECTIONS);
        let reserve = fill(&conns, RESERVED);
        assert!(reserve.iter().all(|a| a.slot.reserved));
        for a in open.iter().chain(&reserve) {
            a.slot.request_started(true);
        }
        assert!(conns.admit().is_none(), "nothing can give way");
        let mut first = waiting(conns.arrive());
        let mut second = waiting(conns.arrive());
        assert_eq!(conns.usher.waiting.load(Ordering::Relaxed), 2);
        // A place freed: the first one gets it, and a newcomer does not jump the queue even
        // before the waiting ones were told.
        drop(open.pop());
        let mut third = waiting(conns.arrive());
        let a = tokio::time::timeout(Duration::ZERO, first.seated())
            .await
            .expect("seated at once")
            .expect("a place");
        assert!(!a.slot.reserved && a.evicted.is_none());
        a.slot.request_started(true);
        // Time makes a body late: the next one gets its place, by eviction.
        conns.seat_waiting();
        assert!(
            tokio::time::timeout(Duration::from_millis(1), second.seated())
                .await
                .is_err(),
            "nothing can give way yet"
        );
        tokio::time::advance(body::BODY_GRACE).await;
        conns.seat_waiting();
        let b = second.seated().await.expect("a place");
        assert_eq!(b.evicted, Some(Eviction::StalledBody));
        let c = third.seated().await.expect("a place");
        assert_eq!(c.evicted, Some(Eviction::StalledBody));
        assert_eq!(conns.usher.waiting.load(Ordering::Relaxed), 0);
        drop((a, b, c, first, second, third, open, reserve));
        let live = lock(&conns.live);
        assert_eq!(
            (
                live.slots.len(),
                live.waiting.len(),
                live.regular,
                live.leaving,
                live.reserved
            ),
            (0, 0, 0, 0, 0)
        );
    }

    /// At most [`MAX_WAITING`] wait, each at most [`MAX_WAIT`]: past those a newcomer is
    /// closed, and the wait of one that gave up leaves nothing behind.
    #[tokio::test(start_paused = true)]
    async fn the_waiting_room_is_bounded_in_count_and_time() {
        let conns = Connections::new();
        let open = fill(&conns, MAX_CONNECTIONS + RESERVED);
        for a in &open {
            a.slot.request_started(true);
            a.slot.body_complete();
        }
        let mut waits: Vec<Waiting> = (0..MAX_WAITING).map(|_| waiting(conns.arrive())).collect();
        assert!(matches!(conns.arrive(), Arrival::Refused));
        // Complete requests younger than 3 s never give way: the waits end empty-handed.
        let t = Instant::now();
        assert!(waits[0].seated().await.is_none());
        assert!(t.elapsed() >= MAX_WAIT && t.elapsed() < MAX_WAIT + SEAT_CHECK);
        assert_eq!(conns.usher.waiting.load(Ordering::Relaxed), MAX_WAITING - 1);
        // A wait given up (its task dropped) frees its turn.
        waits.truncate(MAX_WAITING / 2);
        assert_eq!(lock(&conns.live).waiting.len(), MAX_WAITING / 2 - 1);
        // Sockets held: the places, the reserve, the leaving ones and the waiting room.
        let held = {
            let live = lock(&conns.live);
            live.slots.len() + live.waiting.len()
        };
        assert!(held <= MAX_CONNECTIONS + RESERVED + MAX_LEAVING + MAX_WAITING);
        drop(waits);
        assert_eq!(conns.usher.waiting.load(Ordering::Relaxed), 0);
        drop(open);
    }

    /// A connection that goes idle, or flushes its last answer, tells the waiting ones at
    /// once: the accept loop's [`Connections::seat_due`] resolves before [`SEAT_CHECK`].
    #[tokio::test(start_paused = true)]
    async fn a_connection_going_idle_wakes_the_waiting_ones() {
        let conns = Connections::new();
        let open = fill(&conns, MAX_CONNECTIONS + RESERVED);
        for a in &open {
            a.slot.request_started(false);
        }
        // Nobody waits: nothing to do, however long.
        assert!(tokio::time::timeout(SEAT_CHECK * 10, conns.seat_due())
            .await
            .is_err());
        let mut w = waiting(conns.arrive());
        open[7].slot.request_ended();
        let t = Instant::now();
        conns.seat_due().await;
        assert!(t.elapsed() < SEAT_CHECK);
        conns.seat_waiting();
        let a = w.seated().await.expect("a place");
        assert_eq!(a.evicted, Some(Eviction::IdleNoEvents));
        assert_eq!(chosen(&open[7]), Some(Eviction::IdleNoEvents));
        drop((a, w, open));
    }

    #[tokio::test(start_paused = true)]
    async fn sockets_stay_bounded_whatever_the_clients_do() {
        let conns = Connections::new();
        let mut open = fill(&conns, MAX_CONNECTIONS);
        for a in &open {
            a.slot.request_started(false);
            a.slot.request_ended();
        }
        // Idle connections give way, but a leaving one keeps its socket until it has gone.
        for _ in 0..MAX_LEAVING {
            open.push(conns.admit().expect("admitted by eviction"));
        }
        // Then the reserve; then refusals.
        let reserve: Vec<Admitted> = (0..RESERVED)
            .map(|_| conns.admit().expect("a reserved place"))
            .collect();
        assert!(reserve.iter().all(|a| a.slot.reserved));
        assert!(conns.admit().is_none());
        assert_eq!(
            lock(&conns.live).slots.len(),
            MAX_CONNECTIONS + RESERVED + MAX_LEAVING
        );
        // Once the leaving ones are gone, eviction makes room again.
        open.retain(|a| chosen(a).is_none());
        assert!(conns.admit().is_some_and(|a| a.evicted.is_some()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_does_not_read_its_answers_gives_way_first() {
        let conns = Connections::new();
        let open = fill(&conns, MAX_CONNECTIONS);
        // 255 probes idle with their answers out; one connection with a head never sent;
        // one whose answer could not be written out.
        for a in &open[..MAX_CONNECTIONS - 2] {
            a.slot.request_started(false);
            a.slot.request_ended();
        }
        let silent = &open[MAX_CONNECTIONS - 2];
        let unread = &open[MAX_CONNECTIONS - 1];
        unread.slot.request_started(false);
        unread.slot.request_ended();
        unread.slot.write_blocked();
        // An answer on its way out is not idle: the idle probes give way first.
        let a = conns.admit().expect("admitted by eviction");
        assert_eq!(a.evicted, Some(Eviction::IdleNoEvents));
        assert_eq!(chosen(unread), None);
        // Past UNREAD_AFTER (and STALLED_AFTER), it goes before the silent one and the probes.
        tokio::time::advance(STALLED_AFTER).await;
        let b = conns.admit().expect("admitted by eviction");
        assert_eq!(b.evicted, Some(Eviction::NotReading));
        assert_eq!(chosen(unread), Some(Eviction::NotReading));
        assert!(Eviction::NotReading.cuts() && unread.slot.still(Eviction::NotReading));
        let c = conns.admit().expect("admitted by eviction");
        assert_eq!(chosen(silent), Some(Eviction::NoRequest));
        // Once everything is out, the connection is idle again.
        let d = &open[0];
        d.slot.write_blocked();
        d.slot.flushed();
        assert!(!d.slot.not_reading(Instant::now() + UNREAD_AFTER));
        drop((a, b, c, open));
    }

    /// A request behind an answer its client has not read waits for it; read, it goes on at
    /// once; never read, the connection is told to cut after UNREAD_AFTER and ranks
    /// NotReading meanwhile.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_pipelined_request_waits_for_the_answers_before_it() {
        use std::os::fd::AsRawFd;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const ANSWER: usize = 1 << 20;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        // A client with a tiny receive window: the answer stays in the server's send queue.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(1024).unwrap();
        let mut client = socket
            .connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let conns = Connections::new();
        let a = conns.admit().unwrap();
        let fd = server.as_raw_fd();
        // Nothing sent yet: no wait.
        tokio::time::timeout(
            Duration::from_millis(100),
            earlier_answers_read(fd, &a.slot),
        )
        .await
        .unwrap();
        let writer = tokio::spawn(async move {
            let _ = server.write_all(&vec![b'x'; ANSWER]).await;
            server
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let wait = tokio::time::timeout(UNREAD_AFTER / 2, earlier_answers_read(fd, &a.slot)).await;
        assert!(wait.is_err(), "it waits while the answer is unread");
        assert!(a.slot.unflushed_since().is_some());
        // Read: the wait ends, and nothing is left marked.
        let mut buf = vec![0u8; 64 << 10];
        let mut n = 0;
        while n < ANSWER {
            n += client.read(&mut buf).await.unwrap();
        }
        let mut server = writer.await.unwrap();
        tokio::time::timeout(Duration::from_secs(2), earlier_answers_read(fd, &a.slot))
            .await
            .unwrap();
        assert!(a.slot.unflushed_since().is_none());
        // Never read: cut after UNREAD_AFTER, ranked NotReading by then.
        let stuck = tokio::spawn(async move {
            let _ = server.write_all(&vec![b'x'; ANSWER]).await;
            server
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let slot = a.slot.clone();
        let waiting = tokio::spawn(async move { earlier_answers_read(fd, &slot).await });
        tokio::time::timeout(UNREAD_AFTER * 4, a.slot.cut())
            .await
            .unwrap();
        assert!(a.slot.not_reading(Instant::now()));
        waiting.abort();
        drop(client);
        let _ = stuck.await;
    }
}
