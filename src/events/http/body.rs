//! Request bodies: which codings they carry, how much memory reading them may take, and the
//! reading itself.
//!
//! - **Codings.** Every `Content-Encoding` header is read, each a comma-separated list
//!   (RFC 9110 §8.4); `identity` is no coding, `gzip`/`x-gzip` are undone in reverse order (at
//!   most [`MAX_GZIP_LAYERS`]), anything else is refused with 415 before the body is read.
//! - **Memory.** Bodies in flight share a budget ([`BodyBudget`]) of the largest body plus
//!   [`SMALL_BODIES_ROOM`]. A body is charged for the memory it holds: the buffer of the bytes
//!   received ([`RawBody`]: its capacity while it is on the heap, up to [`MAPPED_FROM`]; the
//!   bytes written once it is in a mapping of its own), its decoded gzip layers, and (see the
//!   caller) its camelCase form and the spool's copy of its events that hold line breaks, each
//!   rounded up to [`RESERVE_STEP`] and taken before the memory is allocated; what a header
//!   declares reserves nothing. A decoded gzip layer is measured first and then decoded into
//!   one buffer of exactly its length ([`decode_gzip`]): it is never copied as it grows, and
//!   leaves no earlier forms of itself in the allocator. A heap buffer's spare capacity is
//!   charged because it is memory, not only address space, once the allocator hands out again
//!   what earlier bodies wrote (charged by their length, 272 bodies of 1 MiB took VmHWM to
//!   232 MiB beside a 96 MiB budget: review r39k D2); a mapping's pages are resident only once
//!   written and go back to the system when the body is dropped. So a client that declares
//!   32 MiB, or starts a chunked body, and then sends nothing holds no room, and small
//!   requests pass beside it; to hold room a client must really send the bytes, which it can
//!   keep for at most [`BODY_TIMEOUT`]. However many clients send large or hostile bodies at
//!   once, the bodies held in memory stay within the budget.
//! - **Decoding costs at most a bounded multiple of what was sent.** Past [`INFLATE_FREE`],
//!   each gzip layer may decode to at most `--max-gzip-ratio` ([`DEFAULT_MAX_GZIP_RATIO`])
//!   times the bytes received (not the layer before, so two layers do not multiply it); the
//!   first decoding pass stops as soon as a layer passes that, and the body gets 413
//!   ([`BodyProblem::Inflates`]). At most [`DECODERS`] bodies are decoded at once, and beside
//!   them [`SMALL_DECODERS`] that only bodies of at most [`SMALL_GZIP_BODY`] as sent may take
//!   (decoding to at most [`SMALL_DECODED`] in it), so Ray's small batches never queue behind
//!   large decodes; the others wait their turn without holding a thread, at most
//!   [`BUDGET_WAIT`] (then 503), once for both passes of a layer ([`decode_gzip`]). A body
//!   waiting its turn or room for its decoded form is queued ([`Pace::is_queued`]): its
//!   connection may give way to a new one, and the body is then answered 503 with
//!   `Retry-After` ([`Pace::give_way`]), never dropped unanswered. Which turn decodes a body
//!   changes nothing in its charge: every decoded form is held in the budget.
//! - **No body is held hostage.** Room is taken in steps of [`RESERVE_STEP`] from a fair
//!   queue, so a body waiting for megabytes never stands in front of a small request; and no
//!   body holds a right that others must wait for: a stalled large body holds the bytes it
//!   sent and nothing more, so a valid body that fits beside it passes at once. Bodies that
//!   together need more than the budget wait for each other at most [`BUDGET_WAIT`], then the
//!   ones still short get 503 and their room goes back (Ray sends one batch at a time, so
//!   only clients that are not Ray can be in that position). A body that waits never waits
//!   behind larger ones that wait too: when it must wait, the waiting body holding the most
//!   room, if that is more than this one wants in all, gives it back at once with 503 and
//!   `Retry-After` (so gzip bombs that each decode to 64 MiB and fill the budget while they
//!   wait for more cannot hold Ray's 20 KB batch for the 10 s [`BUDGET_WAIT`]).
//! - **Small bodies always find room.** Beside the budget, [`SMALL_BODIES_RESERVE`] is kept
//!   for bodies whose room stays within [`SMALL_BODY`]; a body that grows past it gives back
//!   what it took of the reserve, so no large body holds any. Large bodies that hold the
//!   whole budget without falling behind or waiting (being parsed, for seconds) leave Ray's
//!   batches of tens of KB room at once.
//! - **Decoding and parsing never hold the runtime.** Gzip layers are undone (by at most
//!   [`DECODERS`] threads), and the body parsed and routed by the caller, off the runtime's
//!   workers ([`off_reactor`]), so bodies
//!   of millions of tiny elements cannot keep Ray's requests and the probes from being
//!   answered; and the time in which the runtime could not poll a body's reader (its
//!   workers busy, the process not scheduled) is not counted against the body's
//!   [`Pace`] ([`runtime_lag_ms`]).
//! - **A body that stopped arriving gives its room to one that waits.** Each body keeps a
//!   [`Pace`]: it counts as arriving while its bytes keep up with [`MIN_BODY_RATE`], with at
//!   most [`BODY_GRACE`] of credit (so megabytes sent fast and then nothing buy a quarter
//!   second, not a minute), and while the collector, not the client, is the one not reading
//!   (waiting for room, decoding, storing). When a body has to wait for room, every other
//!   body that holds room and has fallen behind its pace is cut at once (`408`, the
//!   connection closed) and its room goes back: two clients that send 96 MiB fast and then
//!   stop lock Ray out for a quarter second, not for the 30 s [`BODY_TIMEOUT`]. With room to
//!   spare nothing is cut: a slow body is only a problem when others wait for what it holds.
//! - **413 only for real sizes.** A body gets 413 only when the bytes it really holds (raw and
//!   decoded together) need more than the whole budget, which no resend can change; never for
//!   a buffer's capacity or a header's claim.
//! - **Bounds.** The raw body and every decoded layer are bounded by `--max-body-bytes`, and
//!   the whole read by [`BODY_TIMEOUT`]. The bytes as received are handed back beside the
//!   decoded body only when they are at most [`MAX_KEPT_BODY_BYTES`] (what quarantine keeps
//!   of an invalid body, see [`crate::events::quarantine::KeptBody`]), and charged with it.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, CONTENT_ENCODING, CONTENT_LENGTH};
use hyper::Request;
use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::events::quarantine::MAX_KEPT_BODY_BYTES;

/// How long a client may take to send a whole body.
pub(super) const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Most gzip layers undone (`Content-Encoding: gzip, gzip`): more is no client we know.
pub(super) const MAX_GZIP_LAYERS: usize = 2;
/// Room for ordinary bodies beside one body of the largest size.
pub(super) const SMALL_BODIES_ROOM: u64 = 32 << 20;
/// Room beside the budget that only small bodies ([`SMALL_BODY`] at most, Ray's batches of
/// tens of KB) may take, once the shared budget is full: whatever large bodies hold, and
/// for however long (two 49 KB gzip bodies of 48 MiB of `[0,0,…]` hold the whole budget
/// while they are parsed, neither behind their pace nor waiting; review r39h D2: Ray got
/// 503 after 10 s), Ray's batch finds room at once. A body that grows past [`SMALL_BODY`]
/// gives back what it took of it, so no large body ever holds any.
pub(super) const SMALL_BODIES_RESERVE: u64 = 4 << 20;
/// The largest room a body may take from [`SMALL_BODIES_RESERVE`]: four times Ray's
/// batches of about a quarter MB (a 1 MB batch takes the shared budget like any other).
pub(super) const SMALL_BODY: u64 = 1 << 20;
/// How long a body waits, in all, for room in the budget before it gets 503.
pub(super) const BUDGET_WAIT: Duration = Duration::from_secs(10);
/// The unit of room: a body's charge is its bytes rounded up to this, and a body waiting
/// for room queues for this much at a time, so it never stands in front of a small request
/// for megabytes. Small enough that rounding costs little (a small body holds one step),
/// large enough that a 64 MiB body takes room a thousand times, not once per frame.
pub(super) const RESERVE_STEP: u64 = 64 << 10;
/// What gzip decoding reads at a time before taking room for it.
const DECODE_CHUNK: usize = 64 << 10;
/// What any gzip body may decode to, whatever its ratio: a small batch of Ray's may
/// compress better than its large ones do.
pub(super) const INFLATE_FREE: u64 = 1 << 20;
/// The default of `--max-gzip-ratio`: past [`INFLATE_FREE`], a gzip body may decode to at
/// most this many times the bytes received. Ray's batches are JSON, which gzip shrinks 4 to
/// 10 times (the captured posts of Ray 2.60 in tests/data: 3.8 times the median, 10.2 at
/// most, at level 9): a hundred leaves them ten times that, while a body that a client sends
/// cheaply and the collector decodes dearly (50 KB of gzip decoding to 49 MiB of zeros,
/// review r39k D1) is refused with 413 after a hundred times its size.
pub const DEFAULT_MAX_GZIP_RATIO: u64 = 100;
/// Gzip bodies being decoded at once, each on a thread of its own: the others wait their
/// turn without holding a thread ([`BodyBudget::decode_turn`]), so however many clients send
/// gzip bodies at once, decoding takes at most this many CPUs and the runtime's workers
/// (every connection's reads and answers, the probes) still get theirs (review r39k D1:
/// about 300 bombs decoding at once on as many threads left `/healthz` unanswered for 3 s
/// on both listeners).
pub(super) const DECODERS: usize = 2;
/// A gzip body of at most this many bytes as received is small: Ray's batches (a few KiB to
/// tens of KiB compressed) are. Beside the [`DECODERS`] turns any body may take, small bodies
/// have [`SMALL_DECODERS`] of their own, so a small batch is never queued behind large
/// decodes (review r39m D1: ten to fifteen clients looping gzip bodies of about 1 MiB that
/// stay under the ratio but decode to tens of MiB each held Ray's batches of a few KiB for
/// their turn for 3 to 14 s, past Ray's 3 s).
pub(super) const SMALL_GZIP_BODY: u64 = 64 << 10;
/// Decoding turns only small bodies ([`SMALL_GZIP_BODY`]) may take, beside [`DECODERS`]:
/// decoding takes at most `DECODERS + SMALL_DECODERS` CPUs, and a turn of this lane at most
/// the time of [`SMALL_DECODED`] decoded twice (a few milliseconds).
pub(super) const SMALL_DECODERS: usize = 1;
/// What a layer may decode to in a small body's own turn: with its received bytes
/// ([`SMALL_GZIP_BODY`] at most) it stays within [`SMALL_BODY`], so it fits the small bodies'
/// reserve. A small body that decodes to more (only a ratio above 15, which Ray's JSON never
/// reaches) gives that turn back and takes one of the [`DECODERS`], as a large body does.
pub(super) const SMALL_DECODED: u64 = SMALL_BODY - SMALL_GZIP_BODY;
/// How far ahead of now a body's bytes can put its pace ([`Pace`]), and how long a body has
/// for its first bytes: Ray's batches (about 1 MB) cross loopback in milliseconds; a quarter
/// second leaves room for a collector slowed by a busy node. It is also what a client buys
/// by sending megabytes fast and then nothing: a quarter second, not the 30 s
/// [`BODY_TIMEOUT`].
pub(super) const BODY_GRACE: Duration = Duration::from_millis(250);
/// Bytes per second a body must keep up to count as arriving: a body streamed over loopback
/// is hundreds of times faster.
pub(super) const MIN_BODY_RATE: u64 = 1 << 20;
/// How often a body waiting for room looks again for bodies that fell behind their pace.
const RECLAIM_EVERY: Duration = Duration::from_millis(50);
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
pub(super) struct Pace {
    epoch: Instant,
    /// [`runtime_lag_ms`] at `epoch`.
    lag_at_epoch: u64,
    /// Milliseconds after `epoch`; [`NOT_READING`] when the collector is not reading.
    due_ms: AtomicU64,
    /// Told to give its room back.
    cut: AtomicBool,
    cut_signal: Notify,
    /// The body is complete and waits for the collector: for its turn to be decoded, or for
    /// room for its decoded form. It costs nothing but its room then, and its connection may
    /// give way to a new one (see [`super::connections`]).
    queued: AtomicBool,
    /// Bytes of the current body received so far: which queued body gives way first.
    bytes: AtomicU64,
}

impl Pace {
    /// A pace not being read: it never falls behind until [`Pace::reading`].
    pub(super) fn new() -> Pace {
        let epoch = Instant::now();
        Pace {
            epoch,
            lag_at_epoch: runtime_lag_ms(epoch),
            due_ms: AtomicU64::new(NOT_READING),
            cut: AtomicBool::new(false),
            cut_signal: Notify::new(),
            queued: AtomicBool::new(false),
            bytes: AtomicU64::new(0),
        }
    }

    /// Whether the body waits for its turn to be decoded or for room for its decoded form.
    pub(super) fn is_queued(&self) -> bool {
        self.queued.load(Ordering::Acquire)
    }

    fn set_queued(&self, queued: bool) {
        self.queued.store(queued, Ordering::Release);
    }

    /// Tells a queued body to stop waiting and be answered `503` with `Retry-After` (its
    /// connection was chosen to give way to a new one): a body that waits for the collector
    /// is never dropped without an answer.
    pub(super) fn give_way(&self) {
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
    fn start(&self) {
        self.cut.store(false, Ordering::Release);
        self.set_queued(false);
        self.bytes.store(0, Ordering::Relaxed);
        self.reading();
    }

    /// The collector reads the body now (a head arrived, or the collector's own wait ended):
    /// it has [`BODY_GRACE`] for its next bytes.
    pub(super) fn reading(&self) {
        let now = self.ms(Instant::now());
        self.due_ms
            .store(now + BODY_GRACE.as_millis() as u64, Ordering::Relaxed);
    }

    /// `n` more bytes arrived.
    pub(super) fn received(&self, n: usize) {
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
    pub(super) fn paused(&self) {
        self.due_ms.store(NOT_READING, Ordering::Relaxed);
    }

    /// Whether the body is being read and has fallen behind its pace.
    pub(super) fn behind(&self, now: Instant) -> bool {
        let due = self.due_ms.load(Ordering::Relaxed);
        due != NOT_READING && self.ms(now) >= due
    }

    /// Tells the body's reader to give its room back; `false` if it was told already.
    fn cut(&self) -> bool {
        if self.cut.swap(true, Ordering::AcqRel) {
            return false;
        }
        // notify_one keeps the wake-up if the reader is not waiting yet.
        self.cut_signal.notify_one();
        true
    }

    /// Resolves once the body was cut.
    async fn was_cut(&self) {
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
pub(super) fn start_lag_watch() {
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
pub(super) fn off_reactor<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// A body holding room, as the budget sees it.
struct Holder {
    pace: Arc<Pace>,
    /// KiB of room it holds.
    held_kib: AtomicU64,
    /// It waits for more room.
    waiting: AtomicBool,
}

/// Why a request body could not be read.
pub(super) enum BodyProblem<'a> {
    TooLarge,
    /// The bytes it really holds (raw and decoded, or with its camelCase form) together need
    /// more than the whole budget, this many bytes: no resend can change that.
    NeverFits(u64),
    NoRoom,
    TimedOut,
    /// The body fell behind its [`Pace`] while another body waited for the room it held.
    Stalled,
    /// A gzip layer decodes to more than `--max-gzip-ratio` times the bytes received (this
    /// many), past [`INFLATE_FREE`]: the bound it passed.
    Inflates {
        received: u64,
        bound: u64,
    },
    /// No turn to decode it came within [`BUDGET_WAIT`]: other gzip bodies are decoded.
    Busy,
    /// The body waited for the collector (a turn to be decoded, or room) and its connection
    /// was chosen to give way to a new one ([`Pace::give_way`]): it is answered 503.
    GaveWay,
    Read(String),
    /// Not valid gzip: the bytes the failing layer was given, the decoder's error, the room
    /// they hold (boxed: it is the largest part), and the bytes received.
    BadGzip(Bytes, String, Box<Room<'a>>, u64),
}

/// A body as read: decoded, and what quarantine needs should it be invalid.
pub(super) struct Received {
    /// The body, its gzip layers undone.
    pub(super) body: Bytes,
    /// The bytes as received, when the body had gzip layers and they are at most
    /// [`MAX_KEPT_BODY_BYTES`] (charged with the body).
    pub(super) compressed: Option<Bytes>,
    /// Bytes received (before the gzip layers).
    pub(super) received_bytes: u64,
}

/// The gzip layers of a request, from all its `Content-Encoding` headers; the coding that is
/// not supported, or why the headers cannot be used, as the error.
pub(super) fn gzip_layers(headers: &HeaderMap) -> Result<usize, String> {
    let mut layers = 0;
    for value in headers.get_all(CONTENT_ENCODING) {
        let text = value
            .to_str()
            .map_err(|_| "a Content-Encoding header that is not ASCII text".to_string())?;
        for coding in text.split(',') {
            match coding.trim().to_ascii_lowercase().as_str() {
                "" | "identity" => {}
                "gzip" | "x-gzip" => layers += 1,
                other => {
                    return Err(format!(
                        "Content-Encoding {other:?} is not supported (use gzip or identity)"
                    ))
                }
            }
        }
    }
    if layers > MAX_GZIP_LAYERS {
        return Err(format!(
            "{layers} gzip layers in Content-Encoding; at most {MAX_GZIP_LAYERS} are undone"
        ));
    }
    Ok(layers)
}

/// The declared `Content-Length`, if there is exactly one and it is a number.
pub(super) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(CONTENT_LENGTH).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    first.to_str().ok()?.trim().parse().ok()
}

/// The memory budget of bodies in flight, in KiB permits: the shared budget, and the
/// reserve of small bodies ([`SMALL_BODIES_RESERVE`]).
pub(super) struct BodyBudget {
    permits: Semaphore,
    /// KiB of the shared budget: the most one body may hold.
    total_kib: u64,
    /// Only for rooms that stay within [`SMALL_BODY`].
    reserve: Semaphore,
    /// The bodies that hold room, by room id.
    holders: Mutex<BTreeMap<u64, Arc<Holder>>>,
    next_id: AtomicU64,
    /// Turns to decode a gzip layer ([`DECODERS`]).
    decoders: Semaphore,
    /// Turns only small bodies may take ([`SMALL_DECODERS`]).
    small_decoders: Semaphore,
}

impl BodyBudget {
    /// Room for one body of `max_body_bytes` plus [`SMALL_BODIES_ROOM`], and beside it
    /// [`SMALL_BODIES_RESERVE`] for small bodies.
    pub(super) fn new(max_body_bytes: u64) -> BodyBudget {
        let total_kib = kib(max_body_bytes.saturating_add(SMALL_BODIES_ROOM));
        BodyBudget {
            permits: Semaphore::new(total_kib as usize),
            total_kib,
            reserve: Semaphore::new(kib(SMALL_BODIES_RESERVE) as usize),
            holders: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            decoders: Semaphore::new(DECODERS),
            small_decoders: Semaphore::new(SMALL_DECODERS),
        }
    }

    /// A turn to decode a gzip layer: one of [`DECODERS`], or for a `small` body one of
    /// [`SMALL_DECODERS`] first (whichever comes first once it must wait). While it waits
    /// the body counts as queued ([`Pace::is_queued`]); it waits at most [`BUDGET_WAIT`] and
    /// never past `deadline` ([`BodyProblem::Busy`]), and stops waiting when its connection
    /// gives way ([`BodyProblem::GaveWay`]).
    async fn decode_turn<'a>(
        &'a self,
        pace: &Pace,
        small: bool,
        deadline: Instant,
    ) -> Result<Turn<'a>, BodyProblem<'a>> {
        if small {
            if let Ok(permit) = self.small_decoders.try_acquire() {
                return Ok(Turn {
                    _permit: permit,
                    small: true,
                });
            }
        }
        if let Ok(permit) = self.decoders.try_acquire() {
            return Ok(Turn {
                _permit: permit,
                small: false,
            });
        }
        pace.set_queued(true);
        let until = deadline.min(Instant::now() + BUDGET_WAIT);
        let own = async {
            if small {
                self.small_decoders.acquire().await
            } else {
                std::future::pending().await
            }
        };
        let got = tokio::select! {
            biased;
            _ = pace.was_cut() => Err(BodyProblem::GaveWay),
            got = own => got.map(|permit| Turn { _permit: permit, small: true }).map_err(|_| BodyProblem::Busy),
            got = self.decoders.acquire() => got.map(|permit| Turn { _permit: permit, small: false }).map_err(|_| BodyProblem::Busy),
            _ = tokio::time::sleep_until(until) => Err(BodyProblem::Busy),
        };
        pace.set_queued(false);
        got
    }

    /// A body's share of the budget, empty until it grows; `pace` is the body's, which says
    /// whether it may be cut when another body waits for room.
    pub(super) fn room(&self, pace: Arc<Pace>) -> Room<'_> {
        Room {
            budget: self,
            held: None,
            reserved: None,
            waited: Duration::ZERO,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            registered: false,
            holder: Arc::new(Holder {
                pace,
                held_kib: AtomicU64::new(0),
                waiting: AtomicBool::new(false),
            }),
        }
    }

    /// Cuts every body but `except` that holds room and has fallen behind its pace; how many.
    fn cut_behind(&self, except: u64) -> usize {
        let now = Instant::now();
        let holders = lock(&self.holders);
        let mut cut = 0;
        for (_, h) in holders.iter().filter(|(id, _)| **id != except) {
            if h.pace.behind(now) && h.pace.cut() {
                cut += 1;
            }
        }
        cut
    }

    /// Tells the body that waits for room and holds the most of it, if it holds more than
    /// `want_kib` (all that the body `except`, which waits too, would hold), to give its
    /// room back (it is answered 503): a small body never waits behind large ones that wait
    /// for room, such as gzip bombs decoding to 64 MiB each. Only a body holding more than
    /// another wants in all gives way to it, so two bodies never push each other out.
    fn give_way_to(&self, except: u64, want_kib: u64) -> bool {
        let holders = lock(&self.holders);
        let largest = holders
            .iter()
            .filter(|(id, h)| **id != except && h.waiting.load(Ordering::Acquire))
            .max_by_key(|(_, h)| h.held_kib.load(Ordering::Relaxed));
        match largest {
            Some((_, h)) if h.held_kib.load(Ordering::Relaxed) > want_kib => h.pace.cut(),
            _ => false,
        }
    }

    /// KiB not held by any body.
    #[cfg(test)]
    fn free_kib(&self) -> usize {
        self.permits.available_permits()
    }
}

/// A turn to decode ([`BodyBudget::decode_turn`]); given back when dropped.
struct Turn<'a> {
    _permit: SemaphorePermit<'a>,
    /// One of [`SMALL_DECODERS`]: the layer may decode to [`SMALL_DECODED`] in it.
    small: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The map stays consistent whatever panicked while holding it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The room one body holds; given back when dropped.
pub(super) struct Room<'a> {
    budget: &'a BodyBudget,
    /// Of the shared budget.
    held: Option<SemaphorePermit<'a>>,
    /// Of the small bodies' reserve: only while the room wants [`SMALL_BODY`] at most.
    reserved: Option<SemaphorePermit<'a>>,
    /// Time spent waiting for room so far, against [`BUDGET_WAIT`].
    waited: Duration,
    id: u64,
    /// Listed among the budget's holders (once it holds room).
    registered: bool,
    holder: Arc<Holder>,
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        if self.registered {
            lock(&self.budget.holders).remove(&self.id);
        }
    }
}

impl<'a> Room<'a> {
    fn hold(&mut self, permit: SemaphorePermit<'a>, from_reserve: bool) {
        let held = if from_reserve {
            &mut self.reserved
        } else {
            &mut self.held
        };
        match held {
            Some(h) => h.merge(permit),
            None => *held = Some(permit),
        }
        self.holder
            .held_kib
            .store(self.held_kib(), Ordering::Relaxed);
        if !self.registered {
            lock(&self.budget.holders).insert(self.id, self.holder.clone());
            self.registered = true;
        }
    }

    fn held_kib(&self) -> u64 {
        self.shared_kib() + self.reserved.as_ref().map_or(0, |p| p.num_permits() as u64)
    }

    /// KiB held of the shared budget.
    fn shared_kib(&self) -> u64 {
        self.held.as_ref().map_or(0, |p| p.num_permits() as u64)
    }

    /// A room growing past [`SMALL_BODY`] holds none of the reserve: what it holds of the
    /// reserve goes back once the shared budget holds all of `want_kib` (before that it is
    /// part of what it holds, so the sum never goes above what the body needs plus a step).
    fn leave_reserve(&mut self, want_kib: u64) {
        if self.reserved.is_some() && self.shared_kib() >= want_kib {
            self.reserved = None;
            self.holder
                .held_kib
                .store(self.held_kib(), Ordering::Relaxed);
        }
    }

    /// The bytes of room held.
    pub(super) fn held_bytes(&self) -> u64 {
        self.held_kib() * 1024
    }

    /// Grows the room to hold `bytes` (rounded up to [`RESERVE_STEP`]), waiting (in all, over
    /// the body's life) at most [`BUDGET_WAIT`] and never past `deadline`. More than the
    /// whole budget is refused at once with [`BodyProblem::NeverFits`].
    pub(super) async fn grow_to(
        &mut self,
        bytes: u64,
        deadline: Instant,
    ) -> Result<(), BodyProblem<'a>> {
        if kib(bytes) > self.budget.total_kib {
            return Err(BodyProblem::NeverFits(self.budget.total_kib * 1024));
        }
        let want = kib(stepped(bytes)).min(self.budget.total_kib);
        let small = want <= kib(SMALL_BODY);
        let step = kib(RESERVE_STEP);
        // A large room counts only the shared budget (what it took of the reserve goes
        // back once that holds it all).
        let held = |r: &Self| if small { r.held_kib() } else { r.shared_kib() };
        while held(self) < want {
            let n = (want - held(self)).min(step) as u32;
            let (permit, from_reserve) = self.wait_for(n, want, small, deadline).await?;
            self.hold(permit, from_reserve);
        }
        if !small {
            self.leave_reserve(want);
        }
        Ok(())
    }

    /// Grows the room to hold `bytes` if the budget has that room free now, without waiting:
    /// `Ok(false)` when it has not (what could be taken is kept; [`Room::grow_to`] waits
    /// for the rest).
    pub(super) fn try_grow_to(&mut self, bytes: u64) -> Result<bool, BodyProblem<'a>> {
        if kib(bytes) > self.budget.total_kib {
            return Err(BodyProblem::NeverFits(self.budget.total_kib * 1024));
        }
        let want = kib(stepped(bytes)).min(self.budget.total_kib);
        let small = want <= kib(SMALL_BODY);
        let held = |r: &Self| if small { r.held_kib() } else { r.shared_kib() };
        while held(self) < want {
            let n = (want - held(self)).min(kib(RESERVE_STEP)) as u32;
            let (permit, from_reserve) = match self.budget.permits.try_acquire_many(n) {
                Ok(p) => (p, false),
                Err(_) if small => match self.budget.reserve.try_acquire_many(n) {
                    Ok(p) => (p, true),
                    Err(_) => return Ok(false),
                },
                Err(_) => return Ok(false),
            };
            self.hold(permit, from_reserve);
        }
        if !small {
            self.leave_reserve(want);
        }
        Ok(true)
    }

    /// Gives back what is held beyond `bytes`.
    fn shrink_to(&mut self, bytes: u64) {
        let keep = kib(bytes);
        let mut extra = self.held_kib().saturating_sub(keep);
        // The reserve goes back first.
        for h in [&mut self.reserved, &mut self.held].into_iter().flatten() {
            let n = extra.min(h.num_permits() as u64);
            drop(h.split(n as usize));
            extra -= n;
        }
        self.holder
            .held_kib
            .store(self.held_kib(), Ordering::Relaxed);
    }

    /// Takes `n` KiB of the shared budget, or of the reserve when `small`, for a room
    /// growing to `want_kib` in all, waiting as the module docs say: bodies that fell behind
    /// their pace are cut, and the waiting body holding the most gives way when it holds
    /// more than `want_kib`; this body gives way in turn ([`BodyProblem::NoRoom`]) when
    /// told to. Whether the permit is of the reserve comes with it.
    async fn wait_for(
        &mut self,
        n: u32,
        want_kib: u64,
        small: bool,
        deadline: Instant,
    ) -> Result<(SemaphorePermit<'a>, bool), BodyProblem<'a>> {
        let budget: &'a BodyBudget = self.budget;
        if let Ok(p) = budget.permits.try_acquire_many(n) {
            return Ok((p, false));
        }
        if small {
            if let Ok(p) = budget.reserve.try_acquire_many(n) {
                return Ok((p, true));
            }
        }
        let left = BUDGET_WAIT.saturating_sub(self.waited);
        let until = deadline.min(Instant::now() + left);
        let started = Instant::now();
        // While it waits, bodies that hold room and fell behind their pace give it back; one
        // that falls behind later is cut at the next look.
        let acquire = budget.permits.acquire_many(n);
        tokio::pin!(acquire);
        // A large room never waits on the reserve: this one never resolves for it.
        let from_reserve = async {
            if small {
                budget.reserve.acquire_many(n).await
            } else {
                std::future::pending().await
            }
        };
        tokio::pin!(from_reserve);
        self.holder.waiting.store(true, Ordering::Release);
        let pace = self.holder.pace.clone();
        let got = loop {
            let cut = self.budget.cut_behind(self.id);
            if cut > 0 {
                crate::metrics::stalled_bodies_cut(cut as u64);
                tracing::debug!(
                    bodies = cut,
                    "cut bodies that fell behind their pace: a body waits for the room they held"
                );
            }
            if self.budget.give_way_to(self.id, want_kib) {
                tracing::debug!(
                    want_kib,
                    "told the waiting body holding the most room to give it back: a smaller body waits"
                );
            }
            let look_again = (Instant::now() + RECLAIM_EVERY).min(until);
            tokio::select! {
                biased;
                _ = pace.was_cut() => break Err(true),
                got = &mut acquire => break Ok(got.map(|p| (p, false))),
                got = &mut from_reserve => break Ok(got.map(|p| (p, true))),
                _ = tokio::time::sleep_until(look_again) => {
                    if Instant::now() >= until {
                        break Err(false);
                    }
                }
            }
        };
        self.holder.waiting.store(false, Ordering::Release);
        self.waited += started.elapsed();
        match got {
            Ok(Ok(p)) => Ok(p),
            // The semaphores are never closed; treat it as no room.
            Ok(Err(_)) => Err(BodyProblem::NoRoom),
            // Told to give way to a smaller body.
            Err(true) => Err(BodyProblem::NoRoom),
            Err(false) if Instant::now() >= deadline => Err(BodyProblem::TimedOut),
            Err(false) => Err(BodyProblem::NoRoom),
        }
    }
}

fn kib(bytes: u64) -> u64 {
    bytes.div_ceil(1024).min(u64::from(u32::MAX))
}

/// `bytes` rounded up to a whole [`RESERVE_STEP`].
fn stepped(bytes: u64) -> u64 {
    bytes.div_ceil(RESERVE_STEP).saturating_mul(RESERVE_STEP)
}

/// The capacity to give a buffer of `cap` bytes that must hold `need`: doubling from
/// [`RESERVE_STEP`] (so copies stay linear in the size), never beyond `limit` unless `need`
/// is. The capacity is what is charged (see the module docs).
fn grown(cap: usize, need: usize, limit: usize) -> usize {
    cap.saturating_mul(2)
        .max(RESERVE_STEP as usize)
        .min(limit)
        .max(need)
}

/// A body past this size moves from the heap to a mapping of its own ([`Mapped`]).
const MAPPED_FROM: usize = 256 << 10;

/// The bytes of a body as they arrive: on the heap while small (Ray's batches of tens of
/// KB), then in a mapping of its own ([`Mapped`]); at once when its `Content-Length` is past
/// [`MAPPED_FROM`]. A heap buffer grown by doubling is
/// charged for its capacity: memory the allocator hands out again was written before, so
/// its spare capacity is resident too, and the chunks it leaves behind as it grows stay in
/// the heap (review r39k D2: 272 bodies of 1 MiB, each charged for its bytes, took VmHWM to
/// 232 MiB beside a 96 MiB budget). A mapping is never copied nor grown, holds fresh pages
/// that become resident only as they are written, and goes back to the system whole when
/// the body is dropped, so it is charged for the bytes written.
enum RawBody {
    Heap(Vec<u8>),
    Mapped(Mapped),
}

impl RawBody {
    /// A buffer for a body that declared `declared` bytes: mapped at once when that is past
    /// [`MAPPED_FROM`], so a large body never leaves heap buffers behind as it grows.
    fn new(declared: Option<usize>) -> RawBody {
        match declared {
            Some(d) if d > MAPPED_FROM => match Mapped::new(d) {
                Ok(m) => RawBody::Mapped(m),
                Err(_) => RawBody::Heap(Vec::new()),
            },
            _ => RawBody::Heap(Vec::new()),
        }
    }

    fn len(&self) -> usize {
        match self {
            RawBody::Heap(v) => v.len(),
            RawBody::Mapped(m) => m.len,
        }
    }

    /// What the buffer holds, as charged, once it holds `need` bytes of a body of at most
    /// `limit`.
    fn charge_for(&self, need: usize, limit: usize) -> u64 {
        match self {
            RawBody::Heap(v) if need <= MAPPED_FROM || limit <= MAPPED_FROM => {
                let cap = if need > v.capacity() {
                    grown(v.capacity(), need, limit)
                } else {
                    v.capacity()
                };
                cap as u64
            }
            _ => need as u64,
        }
    }

    /// Appends `data` (`need` bytes in all, of a body of at most `limit`).
    fn extend(&mut self, data: &[u8], need: usize, limit: usize) {
        if let RawBody::Heap(v) = self {
            if need > MAPPED_FROM && limit > MAPPED_FROM {
                if let Ok(mut m) = Mapped::new(limit.max(need)) {
                    m.extend(v);
                    *self = RawBody::Mapped(m);
                }
            }
        }
        match self {
            RawBody::Heap(v) => {
                if need > v.capacity() {
                    v.reserve_exact(grown(v.capacity(), need, limit) - v.len());
                }
                v.extend_from_slice(data);
            }
            RawBody::Mapped(m) => m.extend(data),
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            RawBody::Heap(v) => Bytes::from(v),
            RawBody::Mapped(m) => Bytes::from_owner(m),
        }
    }
}

/// A private anonymous mapping of a fixed capacity (address space, reserving no swap) that
/// is filled from its start; unmapped when dropped.
struct Mapped {
    ptr: std::ptr::NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone; its bytes are written only through
// `&mut self` and read through `&self`.
unsafe impl Send for Mapped {}
// SAFETY: as above: `&self` only reads.
unsafe impl Sync for Mapped {}

impl Mapped {
    #[cfg(unix)]
    fn new(cap: usize) -> std::io::Result<Mapped> {
        // SAFETY: a new private anonymous mapping, which nothing else refers to.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Mapped { ptr, cap, len: 0 })
    }

    #[cfg(not(unix))]
    fn new(_cap: usize) -> std::io::Result<Mapped> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }

    /// Appends `data`; the caller never passes the capacity (the body's limit), and what
    /// would is cut off.
    fn extend(&mut self, data: &[u8]) {
        let n = data.len().min(self.cap - self.len);
        // SAFETY: `len + n <= cap`, inside the mapping; `data` is not in it (only `&mut
        // self` writes there).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(self.len), n);
        }
        self.len += n;
    }
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of the mapping were written by `extend`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        #[cfg(unix)]
        // SAFETY: the mapping made in `new`, of that length, unmapped once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.cap.max(1));
        }
    }
}

/// What one body may be.
pub(super) struct Limits {
    /// Most bytes of the body, and of each decoded layer.
    pub(super) max: u64,
    /// Its `Content-Length`, if any.
    pub(super) declared: Option<u64>,
    /// Gzip layers to undo.
    pub(super) gzip_layers: usize,
    /// How long the whole read may take ([`BODY_TIMEOUT`], or less).
    pub(super) timeout: Duration,
    /// `--max-gzip-ratio`: past [`INFLATE_FREE`], each decoded layer is at most this many
    /// times the bytes received; 0 for no bound but `max`.
    pub(super) max_gzip_ratio: u64,
}

/// How far a body's gzip layers may decode: to `most` bytes each, set by the ratio bound
/// (`by_ratio`) or by `--max-body-bytes`.
#[derive(Clone, Copy)]
struct Inflate {
    most: usize,
    by_ratio: bool,
    received: u64,
}

impl Inflate {
    fn new(max: usize, ratio: u64, received: u64) -> Inflate {
        let by_ratio = match ratio {
            0 => usize::MAX,
            r => {
                usize::try_from(received.saturating_mul(r).max(INFLATE_FREE)).unwrap_or(usize::MAX)
            }
        };
        Inflate {
            most: max.min(by_ratio),
            by_ratio: by_ratio < max,
            received,
        }
    }

    /// Why a layer that decodes past `most` is refused.
    fn problem<'a>(self) -> BodyProblem<'a> {
        if self.by_ratio {
            BodyProblem::Inflates {
                received: self.received,
                bound: self.most as u64,
            }
        } else {
            BodyProblem::TooLarge
        }
    }
}

/// Reads the body within `limits` and undoes its gzip layers, keeping `pace` (the
/// connection's) as the bytes arrive. The room its bytes take from `budget` is returned with
/// it and must be held while the body is used.
pub(super) async fn read_body<'a>(
    req: Request<Incoming>,
    budget: &'a BodyBudget,
    limits: Limits,
    pace: Arc<Pace>,
) -> Result<(Received, Room<'a>), BodyProblem<'a>> {
    let Limits {
        max,
        declared,
        gzip_layers,
        timeout,
        max_gzip_ratio,
    } = limits;
    let deadline = Instant::now() + timeout;
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let limit = declared
        .and_then(|d| usize::try_from(d).ok())
        .unwrap_or(max)
        .min(max);
    let mut room = budget.room(pace.clone());
    let mut incoming = req.into_body();
    let mut raw = RawBody::new(declared.map(|_| limit));
    pace.start();
    loop {
        let frame = tokio::select! {
            biased;
            _ = pace.was_cut() => return Err(BodyProblem::Stalled),
            frame = tokio::time::timeout_at(deadline, incoming.frame()) => frame,
        };
        let frame = match frame {
            Err(_) => return Err(BodyProblem::TimedOut),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyProblem::Read(e.to_string())),
            Ok(Some(Ok(f))) => f,
        };
        // Trailers carry nothing we use.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        pace.received(data.len());
        let need = raw.len().saturating_add(data.len());
        if need > max {
            return Err(BodyProblem::TooLarge);
        }
        // The buffer is charged for what it makes resident: its capacity while it is on the
        // heap, the bytes written once it is mapped (see [`RawBody`]).
        let charge = raw.charge_for(need, limit);
        if charge > room.held_bytes() {
            // Waiting for room is the collector's time, not the client's.
            pace.paused();
            room.grow_to(charge, deadline).await?;
            pace.reading();
        }
        raw.extend(&data, need, limit);
    }
    pace.paused();
    let received_bytes = raw.len() as u64;
    // What the received bytes' buffer holds, as charged.
    let raw_charge = raw.charge_for(raw.len(), raw.len());
    let mut body = raw.into_bytes();
    let mut compressed = None;
    // Every layer is bounded by the bytes received, not by the layer before it: two layers
    // must not multiply the ratio.
    let inflate = Inflate::new(max, max_gzip_ratio, received_bytes);
    for layer in 0..gzip_layers {
        let small = received_bytes <= SMALL_GZIP_BODY;
        let decoded = match decode_gzip(&body, &mut room, inflate, small, deadline).await? {
            Ok(decoded) => decoded,
            Err(why) => {
                return Err(BodyProblem::BadGzip(
                    body,
                    why,
                    Box::new(room),
                    received_bytes,
                ))
            }
        };
        // The bytes as received are kept (and stay charged) only when small enough for
        // quarantine to keep them whole.
        if layer == 0 && body.len() <= MAX_KEPT_BODY_BYTES {
            compressed = Some(body);
        }
        body = Bytes::from(decoded);
        let kept = compressed.as_ref().map_or(0, |_| raw_charge);
        room.shrink_to((body.len() as u64).saturating_add(kept));
    }
    Ok((
        Received {
            body,
            compressed,
            received_bytes,
        },
        room,
    ))
}

/// One gzip layer of `raw` (charged to `room` already), decoded twice: once to learn its
/// length, keeping nothing, then, its room taken, into one buffer of exactly that length.
/// So the room holds the raw and decoded bytes together, and the decoded body is one
/// allocation made once: a buffer grown by doubling, as it was, was copied at each step and
/// left its earlier forms in the allocator (glibc keeps freed chunks resident), and 16
/// clients looping gzip bombs of 24 MiB took VmHWM to 302–343 MiB with a 96 MiB budget
/// (review r39h D3). The second pass costs CPU only (gzip decodes at hundreds of MB/s).
///
/// Both passes are made in one turn ([`BodyBudget::decode_turn`]), kept while the body waits
/// for room for its decoded form: a body waits for a turn once, not once per pass behind
/// every body that came meanwhile (review r39m D1). A `small` body ([`SMALL_GZIP_BODY`])
/// may take a turn of its own lane, in which the layer may decode to [`SMALL_DECODED`]; one
/// that decodes to more gives it back and takes a turn any body may take (a second wait,
/// only for a body that is not small once decoded). The first pass stops as soon as the
/// layer passes `inflate`'s bound, so a bomb costs at most that much decoding.
/// The decoder's error when `raw` is not valid gzip.
async fn decode_gzip<'a>(
    raw: &[u8],
    room: &mut Room<'a>,
    inflate: Inflate,
    small: bool,
    deadline: Instant,
) -> Result<Result<Vec<u8>, String>, BodyProblem<'a>> {
    let budget: &'a BodyBudget = room.budget;
    let pace = room.holder.pace.clone();
    let mut chunk = vec![0u8; DECODE_CHUNK];
    let most = |turn: &Turn| {
        if turn.small {
            inflate.most.min(SMALL_DECODED as usize)
        } else {
            inflate.most
        }
    };
    let mut turn = budget.decode_turn(&pace, small, deadline).await?;
    let mut len = off_reactor(|| decoded_len(raw, &mut chunk, most(&turn)));
    if turn.small && matches!(len, Ok(None)) && inflate.most > SMALL_DECODED as usize {
        // Not small once decoded: a turn any body may take, the small one given back first.
        drop(turn);
        turn = budget.decode_turn(&pace, false, deadline).await?;
        len = off_reactor(|| decoded_len(raw, &mut chunk, inflate.most));
    }
    let len = match len {
        Ok(Some(len)) => len,
        Ok(None) => return Err(inflate.problem()),
        Err(e) => return Ok(Err(e.to_string())),
    };
    // Waiting for room is waiting for the collector, as waiting for a turn is; the turn is
    // kept meanwhile (a body waiting for room gives way as [`Room::grow_to`] says).
    pace.set_queued(true);
    // Beside what its input holds (the received buffer's capacity, or the layer before).
    let grown = room
        .grow_to(room.held_bytes().saturating_add(len as u64), deadline)
        .await;
    pace.set_queued(false);
    grown?;
    let mut out: Vec<u8> = Vec::new();
    out.reserve_exact(len);
    let decoded = off_reactor(|| -> std::io::Result<()> {
        let mut dec = flate2::read::MultiGzDecoder::new(raw);
        loop {
            let n = dec.read(&mut chunk)?;
            if n == 0 {
                return Ok(());
            }
            if out.len() + n > len {
                return Err(std::io::Error::other(
                    "the body decoded to more bytes the second time",
                ));
            }
            out.extend_from_slice(&chunk[..n]);
        }
    });
    drop(turn);
    match decoded {
        Ok(()) => Ok(Ok(out)),
        Err(e) => Ok(Err(e.to_string())),
    }
}

/// The length `raw` decodes to, read through `chunk` and kept nowhere; `None` once it is
/// over `max`.
fn decoded_len(raw: &[u8], chunk: &mut [u8], max: usize) -> std::io::Result<Option<usize>> {
    let mut dec = flate2::read::MultiGzDecoder::new(raw);
    let mut len = 0usize;
    loop {
        match dec.read(chunk)? {
            0 => return Ok(Some(len)),
            n => len = len.saturating_add(n),
        }
        if len > max {
            return Ok(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(CONTENT_ENCODING, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn every_content_encoding_header_and_list_is_read() {
        assert_eq!(gzip_layers(&headers(&[])), Ok(0));
        assert_eq!(gzip_layers(&headers(&["identity"])), Ok(0));
        assert_eq!(gzip_layers(&headers(&["GZIP"])), Ok(1));
        assert_eq!(gzip_layers(&headers(&["identity, gzip"])), Ok(1));
        assert_eq!(gzip_layers(&headers(&["gzip", "x-gzip"])), Ok(2));
        assert!(gzip_layers(&headers(&["gzip", "br"]))
            .unwrap_err()
            .contains("\"br\""));
        assert!(gzip_layers(&headers(&["identity, deflate"]))
            .unwrap_err()
            .contains("\"deflate\""));
        assert!(gzip_layers(&headers(&["gzip, gzip, gzip"])).is_err());
    }

    /// A room whose body is not being read: never cut.
    fn room(b: &BodyBudget) -> Room<'_> {
        b.room(Arc::new(Pace::new()))
    }

    /// The small bodies' reserve, all taken (by other small bodies): a small body then waits
    /// for the shared budget like any other.
    fn take_the_reserve(b: &BodyBudget) -> SemaphorePermit<'_> {
        b.reserve
            .try_acquire_many(kib(SMALL_BODIES_RESERVE) as u32)
            .unwrap()
    }

    fn later() -> Instant {
        Instant::now() + BODY_TIMEOUT
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_holds_one_largest_body_and_room_for_small_ones() {
        let b = BodyBudget::new(64 << 20);
        let mut big = room(&b);
        assert!(big.grow_to(64 << 20, later()).await.is_ok());
        // Ordinary batches still pass beside it.
        let mut small: Vec<Room> = (0..20).map(|_| room(&b)).collect();
        for r in &mut small {
            assert!(r.grow_to(1 << 20, later()).await.is_ok());
        }
        drop(small);
        // A body that does not fit beside it waits, then gives up.
        let mut second = room(&b);
        let t = Instant::now();
        assert!(matches!(
            second.grow_to(33 << 20, later()).await,
            Err(BodyProblem::NoRoom)
        ));
        assert!(t.elapsed() >= BUDGET_WAIT);
        drop((big, second));
        let mut third = room(&b);
        assert!(third.grow_to(64 << 20, later()).await.is_ok());
        // A body that could never fit is told so at once.
        drop(third);
        assert!(matches!(
            room(&b).grow_to(97 << 20, later()).await,
            Err(BodyProblem::NeverFits(_))
        ));
        // Exactly the whole budget fits: sizes are compared, not rounded capacities.
        assert!(room(&b).grow_to(96 << 20, later()).await.is_ok());
    }

    /// Large bodies holding the whole budget leave small ones the reserve, and never take it.
    #[tokio::test(start_paused = true)]
    async fn small_bodies_find_room_in_their_reserve_and_large_ones_never_hold_it() {
        let b = BodyBudget::new(64 << 20);
        let reserve = || b.reserve.available_permits() as u64;
        let all = reserve();
        // A small body that took the reserve and then grows past SMALL_BODY gives it back.
        let mut full = room(&b);
        assert!(full.grow_to(96 << 20, later()).await.is_ok());
        let mut growing = room(&b);
        assert!(growing.grow_to(RESERVE_STEP, later()).await.is_ok());
        assert_eq!(reserve(), all - kib(RESERVE_STEP));
        full.shrink_to(64 << 20);
        assert!(growing.grow_to(SMALL_BODY + 1, later()).await.is_ok());
        assert_eq!(reserve(), all);
        assert_eq!(growing.shared_kib(), kib(SMALL_BODY + RESERVE_STEP));
        drop(growing);
        // The budget full: a large body does not touch the reserve, small ones use it at once.
        assert!(full.grow_to(96 << 20, later()).await.is_ok());
        let t = Instant::now();
        let mut small: Vec<Room> = (0..4).map(|_| room(&b)).collect();
        for r in &mut small {
            assert!(r.grow_to(SMALL_BODY, later()).await.is_ok());
        }
        assert_eq!(t.elapsed(), Duration::ZERO);
        assert_eq!(reserve(), 0);
        drop(small);
        assert_eq!(reserve(), all);
        let mut large = room(&b);
        assert!(matches!(large.try_grow_to(SMALL_BODY + 1), Ok(false)));
        assert_eq!(reserve(), all);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_large_body_holds_only_its_bytes() {
        let b = BodyBudget::new(64 << 20);
        // One body just over 8 MiB that stops sending holds its bytes, nothing more: a
        // 9 MB body and twelve of 4 MiB pass beside it at once.
        let mut stalled = room(&b);
        assert!(stalled.grow_to((8 << 20) + 1, later()).await.is_ok());
        assert_eq!(stalled.held_bytes(), (8 << 20) + RESERVE_STEP);
        let t = Instant::now();
        let mut other = room(&b);
        assert!(other.grow_to(9_000_000, later()).await.is_ok());
        let mut many: Vec<Room> = (0..12).map(|_| room(&b)).collect();
        for r in &mut many {
            assert!(r.grow_to((4 << 20) + 1, later()).await.is_ok());
        }
        assert_eq!(t.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn room_is_only_what_is_held_and_goes_back_when_dropped() {
        let b = BodyBudget::new(64 << 20);
        let all = b.free_kib();
        // A room that has not grown, whatever its header declared, holds nothing.
        let idle: Vec<Room> = (0..100).map(|_| room(&b)).collect();
        assert_eq!(b.free_kib(), all);
        let mut r = room(&b);
        assert!(r.grow_to(10 << 20, later()).await.is_ok());
        assert_eq!(b.free_kib(), all - 10 * 1024);
        r.shrink_to(1 << 20);
        assert_eq!(b.free_kib(), all - 1024);
        drop((r, idle));
        assert_eq!(b.free_kib(), all);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_waiting_for_room_does_not_stand_in_front_of_small_ones() {
        // 'static: the large body waits in a task of its own.
        let b: &'static BodyBudget = Box::leak(Box::new(BodyBudget::new(64 << 20)));
        let _reserve_taken = take_the_reserve(b);
        // A large body and small ones fill the budget to the last KiB.
        let mut big = room(b);
        assert!(big.grow_to(40 << 20, later()).await.is_ok());
        let mut small: Vec<Room> = (0..56).map(|_| room(b)).collect();
        for r in &mut small {
            assert!(r.grow_to(1 << 20, later()).await.is_ok());
        }
        assert_eq!(b.free_kib(), 0);
        // The large body wants 24 MiB more and queues; then a small request queues.
        let big = tokio::spawn(async move {
            let r = big.grow_to(64 << 20, later()).await.is_ok();
            (r, big.held_kib())
        });
        tokio::task::yield_now().await;
        // One small body ends: the request behind the large one gets its room at once,
        // though the large one is still far from what it wants.
        let mut newcomer = room(b);
        let waiting = newcomer.grow_to(16 << 10, later());
        tokio::pin!(waiting);
        assert!(futures::poll!(&mut waiting).is_pending());
        small.pop();
        let got = tokio::time::timeout(Duration::from_millis(1), &mut waiting).await;
        assert!(
            matches!(got, Ok(Ok(()))),
            "the small request waited for the large one"
        );
        drop(small);
        // And the large body, which waited while a smaller one did, was told to give its
        // room back (its client gets 503 and resends): it is not left holding 40 MiB
        // while small requests queue behind it.
        let (ok, _) = big.await.unwrap();
        assert!(
            !ok,
            "the large waiting body kept its room while a small one waited"
        );
        assert_eq!(b.free_kib() as u64, b.total_kib - kib(RESERVE_STEP));
    }

    /// Review r39m D1: the turns any body may take all held, a small body still gets one of
    /// its own at once, a large one waits; a waiting body told to give way stops waiting.
    #[tokio::test(start_paused = true)]
    async fn a_small_body_has_a_decoding_turn_of_its_own() {
        let b: &'static BodyBudget = Box::leak(Box::new(BodyBudget::new(64 << 20)));
        let p: &'static Pace = Box::leak(Box::new(Pace::new()));
        let mut held = Vec::new();
        for _ in 0..DECODERS {
            held.push(b.decode_turn(p, false, later()).await.ok().unwrap());
        }
        assert!(held.iter().all(|t| !t.small));
        let small = b.decode_turn(p, true, later()).await.ok().unwrap();
        assert!(small.small);
        // A large body waits, queued, until told to give way.
        let large = tokio::spawn(async move {
            matches!(
                b.decode_turn(p, false, later()).await,
                Err(BodyProblem::GaveWay)
            )
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(p.is_queued());
        p.give_way();
        assert!(large.await.unwrap());
        assert!(!p.is_queued());
        // Its own turn held too, a small body takes one any body may take once it is free.
        drop(held.pop());
        assert!(!b.decode_turn(p, true, later()).await.ok().unwrap().small);
        drop(small);
    }

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

    #[tokio::test(start_paused = true)]
    async fn a_body_that_fell_behind_gives_its_room_to_one_that_waits() {
        let b: &'static BodyBudget = Box::leak(Box::new(BodyBudget::new(64 << 20)));
        let _reserve_taken = take_the_reserve(b);
        // One body sent 64 MiB and stopped; one sends on; one waits for room of its own.
        let stopped = Arc::new(Pace::new());
        let arriving = Arc::new(Pace::new());
        let mut a = b.room(stopped.clone());
        let mut c = b.room(arriving.clone());
        stopped.start();
        arriving.start();
        assert!(a.grow_to(64 << 20, later()).await.is_ok());
        stopped.received(64 << 20);
        assert!(c.grow_to(32 << 20, later()).await.is_ok());
        assert_eq!(b.free_kib(), 0);
        let t = Instant::now();
        // Each reader gives its room back once told (as read_body does).
        let reader = |pace: Arc<Pace>, room: Room<'static>| {
            tokio::spawn(async move {
                pace.was_cut().await;
                drop(room);
            })
        };
        let a_cut = reader(stopped.clone(), a);
        let c_cut = reader(arriving.clone(), c);
        let feeding = {
            let arriving = arriving.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    arriving.received((MIN_BODY_RATE / 50) as usize);
                }
            })
        };
        let mut ray = room(b);
        assert!(ray.grow_to(64 << 10, later()).await.is_ok());
        // The stopped body gave way once it fell behind, within a look of it; the one still
        // arriving kept its room.
        assert!(t.elapsed() >= BODY_GRACE);
        assert!(t.elapsed() <= BODY_GRACE + RECLAIM_EVERY);
        assert!(a_cut.await.is_ok());
        assert!(!arriving.cut.load(Ordering::Acquire));
        feeding.abort();
        c_cut.abort();
    }
}
