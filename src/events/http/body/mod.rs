//! Request bodies: which codings they carry, how much memory reading them may take, and the
//! reading itself.
//!
//! - **Codings.** Every `Content-Encoding` header is read, each a comma-separated list
//!   (RFC 9110 §8.4); `identity` is no coding, `gzip`/`x-gzip` are undone in reverse order (at
//!   most [`MAX_GZIP_LAYERS`](gzip::MAX_GZIP_LAYERS)), anything else is refused with 415 before the body is read.
//! - **Memory.** Bodies in flight share a budget ([`BodyBudget`]) of the largest body plus
//!   [`SMALL_BODIES_ROOM`]. A body is charged for the memory it holds: the buffer of the bytes
//!   received ([`RawBody`]: its capacity while it is on the heap, up to [`MAPPED_FROM`](raw::MAPPED_FROM); the
//!   bytes written once it is in a mapping of its own), its decoded gzip layers, and (see the
//!   caller) its camelCase form and the spool's copy of its events that hold line breaks, each
//!   rounded up to [`RESERVE_STEP`](budget::RESERVE_STEP) and taken before the memory is allocated; what a header
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
//! - **Decoding costs at most a bounded multiple of what was sent.** Past [`INFLATE_FREE`](gzip::INFLATE_FREE),
//!   each gzip layer may decode to at most `--max-gzip-ratio` ([`DEFAULT_MAX_GZIP_RATIO`])
//!   times the bytes received (not the layer before, so two layers do not multiply it); the
//!   first decoding pass stops as soon as a layer passes that, and the body gets 413
//!   ([`BodyProblem::Inflates`]). At most [`DECODERS`] bodies are decoded at once, and beside
//!   them [`SMALL_DECODERS`](budget::SMALL_DECODERS) that only bodies of at most [`SMALL_GZIP_BODY`] as sent may take
//!   (decoding to at most [`SMALL_DECODED`](budget::SMALL_DECODED) in it), so Ray's small batches never queue behind
//!   large decodes, and [`DELIVERED_DECODERS`](budget::DELIVERED_DECODERS) that only bodies on a connection that has had
//!   events stored may take ([`Pace::delivered`]: Ray's kept connection); the others wait their turn without holding a thread, at most
//!   [`BUDGET_WAIT`] (then 503), once for both passes of a layer ([`decode_gzip`]). A body
//!   waiting its turn or room for its decoded form is queued ([`Pace::is_queued`]): its
//!   connection may give way to a new one, and the body is then answered 503 with
//!   `Retry-After` ([`Pace::give_way`]), never dropped unanswered. Which turn decodes a body
//!   changes nothing in its charge: every decoded form is held in the budget.
//! - **No body is held hostage.** Room is taken in steps of [`RESERVE_STEP`](budget::RESERVE_STEP) from a fair
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
//! - **Small bodies always find room.** Beside the budget, [`SMALL_BODIES_RESERVE`](budget::SMALL_BODIES_RESERVE) is kept
//!   for bodies whose room stays within [`SMALL_BODY`](budget::SMALL_BODY); a body that grows past it gives back
//!   what it took of the reserve, so no large body holds any. Large bodies that hold the
//!   whole budget without falling behind or waiting (being parsed, for seconds) leave Ray's
//!   batches of tens of KB room at once.
//! - **Decoding and parsing never hold the runtime.** Gzip layers are undone (by at most
//!   [`DECODERS`] threads), and the body parsed and routed by the caller, off the runtime's
//!   workers ([`off_reactor`]), so bodies
//!   of millions of tiny elements cannot keep Ray's requests and the probes from being
//!   answered; and the time in which the runtime could not poll a body's reader (its
//!   workers busy, the process not scheduled) is not counted against the body's
//!   [`Pace`] ([`runtime_lag_ms`](pace::runtime_lag_ms)).
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

mod budget;
mod gzip;
mod pace;
mod raw;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, CONTENT_LENGTH};
use hyper::Request;
use tokio::time::Instant;

use crate::events::quarantine::MAX_KEPT_BODY_BYTES;
pub(super) use budget::{BodyBudget, BodyProblem, Room, BUDGET_WAIT, DECODERS, SMALL_BODIES_ROOM};
pub(super) use gzip::gzip_layers;
pub use gzip::DEFAULT_MAX_GZIP_RATIO;
pub(super) use pace::{
    off_reactor, start_lag_watch, Pace, BODY_GRACE, BODY_TIMEOUT, MIN_BODY_RATE,
};

use budget::SMALL_GZIP_BODY;
use gzip::{decode_gzip, Inflate};
use raw::RawBody;

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

/// The declared `Content-Length`, if there is exactly one and it is a number.
pub(super) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(CONTENT_LENGTH).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    first.to_str().ok()?.trim().parse().ok()
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
    /// `--max-gzip-ratio`: past [`INFLATE_FREE`](gzip::INFLATE_FREE), each decoded layer is at most this many
    /// times the bytes received; 0 for no bound but `max`.
    pub(super) max_gzip_ratio: u64,
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
