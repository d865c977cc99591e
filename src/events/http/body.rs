//! Request bodies: which codings they carry, how much memory reading them may take, and the
//! reading itself.
//!
//! - **Codings.** Every `Content-Encoding` header is read, each a comma-separated list
//!   (RFC 9110 §8.4); `identity` is no coding, `gzip`/`x-gzip` are undone in reverse order (at
//!   most [`MAX_GZIP_LAYERS`]), anything else is refused with 415 before the body is read.
//! - **Memory.** Bodies in flight share a budget ([`BodyBudget`]) of the largest body plus
//!   [`SMALL_BODIES_ROOM`]. A body is charged for the bytes it holds: those received, those
//!   of its decoded gzip layers, and (see the caller) its camelCase form, each rounded up to
//!   [`RESERVE_STEP`] and taken before the bytes are stored; what a header declares reserves
//!   nothing. The spare capacity a growing buffer keeps beyond its length is not charged: it
//!   is address space that the kernel backs with memory only once it is written, so the
//!   charge is what the body really makes resident, and twelve 4 MiB bodies cost 48 MiB of
//!   the budget, not the 96 MiB their doubled buffers could span. So a client that declares
//!   32 MiB, or starts a chunked body, and then sends nothing holds no room, and small
//!   requests pass beside it; to hold room a client must really send the bytes, which it can
//!   keep for at most [`BODY_TIMEOUT`]. However many clients send large or hostile bodies at
//!   once, the bodies held in memory stay within the budget.
//! - **No body is held hostage.** Room is taken in steps of [`RESERVE_STEP`] from a fair
//!   queue, so a body waiting for megabytes never stands in front of a small request; and no
//!   body holds a right that others must wait for: a stalled large body holds the bytes it
//!   sent and nothing more, so a valid body that fits beside it passes at once. Bodies that
//!   together need more than the budget wait for each other at most [`BUDGET_WAIT`], then the
//!   ones still short get 503 and their room goes back (Ray sends one batch at a time, so
//!   only clients that are not Ray can be in that position).
//! - **413 only for real sizes.** A body gets 413 only when the bytes it really holds (raw and
//!   decoded together) need more than the whole budget, which no resend can change; never for
//!   a buffer's capacity or a header's claim.
//! - **Bounds.** The raw body and every decoded layer are bounded by `--max-body-bytes`, and
//!   the whole read by [`BODY_TIMEOUT`].

use std::io::Read;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, CONTENT_ENCODING, CONTENT_LENGTH};
use hyper::Request;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// How long a client may take to send a whole body.
pub(super) const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Most gzip layers undone (`Content-Encoding: gzip, gzip`): more is no client we know.
pub(super) const MAX_GZIP_LAYERS: usize = 2;
/// Room for ordinary bodies beside one body of the largest size.
pub(super) const SMALL_BODIES_ROOM: u64 = 32 << 20;
/// How long a body waits, in all, for room in the budget before it gets 503.
pub(super) const BUDGET_WAIT: Duration = Duration::from_secs(10);
/// The unit of room: a body's charge is its bytes rounded up to this, and a body waiting
/// for room queues for this much at a time, so it never stands in front of a small request
/// for megabytes. Small enough that rounding costs little (a small body holds one step),
/// large enough that a 64 MiB body takes room a thousand times, not once per frame.
pub(super) const RESERVE_STEP: u64 = 64 << 10;
/// What gzip decoding reads at a time before taking room for it.
const DECODE_CHUNK: usize = 64 << 10;

/// Why a request body could not be read.
pub(super) enum BodyProblem<'a> {
    TooLarge,
    /// The bytes it really holds (raw and decoded, or with its camelCase form) together need
    /// more than the whole budget, this many bytes: no resend can change that.
    NeverFits(u64),
    NoRoom,
    TimedOut,
    Read(String),
    /// Not valid gzip: the bytes as received, the decoder's error, and the room they hold.
    BadGzip(Bytes, String, Room<'a>),
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

/// The memory budget of bodies in flight, in KiB permits.
pub(super) struct BodyBudget {
    permits: Semaphore,
    total_kib: u64,
}

impl BodyBudget {
    /// Room for one body of `max_body_bytes` plus [`SMALL_BODIES_ROOM`].
    pub(super) fn new(max_body_bytes: u64) -> BodyBudget {
        let total_kib = kib(max_body_bytes.saturating_add(SMALL_BODIES_ROOM));
        BodyBudget {
            permits: Semaphore::new(total_kib as usize),
            total_kib,
        }
    }

    /// A body's share of the budget, empty until it grows.
    pub(super) fn room(&self) -> Room<'_> {
        Room {
            budget: self,
            held: None,
            waited: Duration::ZERO,
        }
    }

    /// KiB not held by any body.
    #[cfg(test)]
    fn free_kib(&self) -> usize {
        self.permits.available_permits()
    }
}

/// The room one body holds; given back when dropped.
pub(super) struct Room<'a> {
    budget: &'a BodyBudget,
    held: Option<SemaphorePermit<'a>>,
    /// Time spent waiting for room so far, against [`BUDGET_WAIT`].
    waited: Duration,
}

impl<'a> Room<'a> {
    fn held_kib(&self) -> u64 {
        self.held.as_ref().map_or(0, |p| p.num_permits() as u64)
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
        let budget = self.budget;
        let step = kib(RESERVE_STEP);
        while self.held_kib() < want {
            let n = (want - self.held_kib()).min(step) as u32;
            let permit = self.wait_for(&budget.permits, n, deadline).await?;
            match &mut self.held {
                Some(h) => h.merge(permit),
                None => self.held = Some(permit),
            }
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
        while self.held_kib() < want {
            let n = (want - self.held_kib()).min(kib(RESERVE_STEP)) as u32;
            let Ok(permit) = self.budget.permits.try_acquire_many(n) else {
                return Ok(false);
            };
            match &mut self.held {
                Some(h) => h.merge(permit),
                None => self.held = Some(permit),
            }
        }
        Ok(true)
    }

    /// Gives back what is held beyond `bytes`.
    fn shrink_to(&mut self, bytes: u64) {
        let keep = kib(bytes);
        let extra = self.held_kib().saturating_sub(keep);
        if let Some(h) = &mut self.held {
            drop(h.split(extra as usize));
        }
    }

    async fn wait_for(
        &mut self,
        sem: &'a Semaphore,
        n: u32,
        deadline: Instant,
    ) -> Result<SemaphorePermit<'a>, BodyProblem<'a>> {
        if let Ok(p) = sem.try_acquire_many(n) {
            return Ok(p);
        }
        let left = BUDGET_WAIT.saturating_sub(self.waited);
        let until = deadline.min(Instant::now() + left);
        let started = Instant::now();
        let got = tokio::time::timeout_at(until, sem.acquire_many(n)).await;
        self.waited += started.elapsed();
        match got {
            Ok(Ok(p)) => Ok(p),
            // The semaphores are never closed; treat it as no room.
            Ok(Err(_)) => Err(BodyProblem::NoRoom),
            Err(_) if Instant::now() >= deadline => Err(BodyProblem::TimedOut),
            Err(_) => Err(BodyProblem::NoRoom),
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
/// is. Only the length is charged (see the module docs).
fn grown(cap: usize, need: usize, limit: usize) -> usize {
    cap.saturating_mul(2)
        .max(RESERVE_STEP as usize)
        .min(limit)
        .max(need)
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
}

/// Reads the body within `limits` and undoes its gzip layers, telling `progress` how many
/// bytes arrive as they arrive. The room its bytes take from `budget` is returned with it
/// and must be held while the body is used.
pub(super) async fn read_body<'a>(
    req: Request<Incoming>,
    budget: &'a BodyBudget,
    limits: Limits,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<(Bytes, Room<'a>), BodyProblem<'a>> {
    let Limits {
        max,
        declared,
        gzip_layers,
        timeout,
    } = limits;
    let deadline = Instant::now() + timeout;
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let limit = declared
        .and_then(|d| usize::try_from(d).ok())
        .unwrap_or(max)
        .min(max);
    let mut room = budget.room();
    let mut incoming = req.into_body();
    let mut raw: Vec<u8> = Vec::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, incoming.frame()).await {
            Err(_) => return Err(BodyProblem::TimedOut),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyProblem::Read(e.to_string())),
            Ok(Some(Ok(f))) => f,
        };
        // Trailers carry nothing we use.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        progress(data.len());
        let need = raw.len().saturating_add(data.len());
        if need > max {
            return Err(BodyProblem::TooLarge);
        }
        if need as u64 > room.held_bytes() {
            room.grow_to(need as u64, deadline).await?;
        }
        if need > raw.capacity() {
            raw.reserve_exact(grown(raw.capacity(), need, limit) - raw.len());
        }
        raw.extend_from_slice(&data);
    }
    for _ in 0..gzip_layers {
        match decode_gzip(&raw, &mut room, max, deadline).await? {
            Ok(decoded) => raw = decoded,
            Err(why) => return Err(BodyProblem::BadGzip(Bytes::from(raw), why, room)),
        }
        room.shrink_to(raw.len() as u64);
    }
    Ok((Bytes::from(raw), room))
}

/// One gzip layer of `raw` (charged to `room` already), decoded in chunks, each taking its
/// room first, so the room holds the raw and decoded bytes together; the decoder's error
/// when `raw` is not valid gzip.
async fn decode_gzip<'a>(
    raw: &[u8],
    room: &mut Room<'a>,
    max: usize,
    deadline: Instant,
) -> Result<Result<Vec<u8>, String>, BodyProblem<'a>> {
    let mut out: Vec<u8> = Vec::new();
    let mut dec = flate2::read::MultiGzDecoder::new(raw);
    let mut chunk = vec![0u8; DECODE_CHUNK];
    loop {
        let n = match dec.read(&mut chunk) {
            Ok(0) => return Ok(Ok(out)),
            Ok(n) => n,
            Err(e) => return Ok(Err(e.to_string())),
        };
        let need = out.len().saturating_add(n);
        if need > max {
            return Err(BodyProblem::TooLarge);
        }
        let held = raw.len().saturating_add(need) as u64;
        if held > room.held_bytes() {
            room.grow_to(held, deadline).await?;
        }
        if need > out.capacity() {
            out.reserve_exact(grown(out.capacity(), need, max) - out.len());
        }
        out.extend_from_slice(&chunk[..n]);
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

    fn later() -> Instant {
        Instant::now() + BODY_TIMEOUT
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_holds_one_largest_body_and_room_for_small_ones() {
        let b = BodyBudget::new(64 << 20);
        let mut big = b.room();
        assert!(big.grow_to(64 << 20, later()).await.is_ok());
        // Ordinary batches still pass beside it.
        let mut small: Vec<Room> = (0..20).map(|_| b.room()).collect();
        for r in &mut small {
            assert!(r.grow_to(1 << 20, later()).await.is_ok());
        }
        drop(small);
        // A body that does not fit beside it waits, then gives up.
        let mut second = b.room();
        let t = Instant::now();
        assert!(matches!(
            second.grow_to(33 << 20, later()).await,
            Err(BodyProblem::NoRoom)
        ));
        assert!(t.elapsed() >= BUDGET_WAIT);
        drop((big, second));
        let mut third = b.room();
        assert!(third.grow_to(64 << 20, later()).await.is_ok());
        // A body that could never fit is told so at once.
        drop(third);
        assert!(matches!(
            b.room().grow_to(97 << 20, later()).await,
            Err(BodyProblem::NeverFits(_))
        ));
        // Exactly the whole budget fits: sizes are compared, not rounded capacities.
        assert!(b.room().grow_to(96 << 20, later()).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_large_body_holds_only_its_bytes() {
        let b = BodyBudget::new(64 << 20);
        // One body just over 8 MiB that stops sending holds its bytes, nothing more: a
        // 9 MB body and twelve of 4 MiB pass beside it at once.
        let mut stalled = b.room();
        assert!(stalled.grow_to((8 << 20) + 1, later()).await.is_ok());
        assert_eq!(stalled.held_bytes(), (8 << 20) + RESERVE_STEP);
        let t = Instant::now();
        let mut other = b.room();
        assert!(other.grow_to(9_000_000, later()).await.is_ok());
        let mut many: Vec<Room> = (0..12).map(|_| b.room()).collect();
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
        let idle: Vec<Room> = (0..100).map(|_| b.room()).collect();
        assert_eq!(b.free_kib(), all);
        let mut r = b.room();
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
        // A large body and small ones fill the budget to the last KiB.
        let mut big = b.room();
        assert!(big.grow_to(40 << 20, later()).await.is_ok());
        let mut small: Vec<Room> = (0..56).map(|_| b.room()).collect();
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
        let mut newcomer = b.room();
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
        let (ok, held) = big.await.unwrap();
        assert!(ok);
        assert_eq!(held, 64 * 1024);
    }
}
