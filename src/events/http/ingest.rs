//! `POST /v1/events`, from the request to the answer: backpressure (the spool over its high
//! watermark, the shutdown) answered `503` before the body is read, the codings and declared
//! length checked, the body read within the body budget, its batch built off the runtime's
//! workers and stored in the spool, and every [`BodyProblem`] turned into the answer Ray's
//! contract wants (`4xx` only for a body that can never succeed).

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};

use super::answers::{closing, error_response, json_response, retry_later, Resp};
use super::batch::{build_batch, ConversionRoom};
use super::body::{self, BodyProblem};
use super::connections;
use super::state::{GateGuard, IngestState, KEPT_BODIES_PER_SECOND, KEPT_BODY_BYTES_PER_SECOND};
use crate::events::quarantine::KeptBody;
use crate::metrics as m;

/// Why the spool is over its high watermark, as far as it is known: events not yet in the
/// bucket (the store is slow or failing), or none, the room being held by open segments
/// that are already uploaded and that the writer is sealing to free it (the review r35e
/// found "uploads are behind" said for minutes with every event in the bucket).
pub(super) fn why_full(st: &IngestState) -> &'static str {
    if st.spool.stats().oldest_pending_age_seconds() > 0.0 {
        "uploads are behind"
    } else {
        "every event in it is in the bucket; the open segments holding it are being sealed to free it"
    }
}

pub(super) async fn ingest(req: Request<Incoming>, st: &IngestState) -> Resp {
    let resp = ingest_inner(req, st).await;
    match resp {
        Ok(r) => r,
        Err(early) => closing(early),
    }
}

/// `Err` for answers given before the body was read.
async fn ingest_inner(req: Request<Incoming>, st: &IngestState) -> Result<Resp, Resp> {
    // Counted in flight until answered (see [`Gate`]).
    let Some(guard) = st.requests.enter() else {
        return Err(retry_later("shutting down", 5));
    };
    let used = st.spool.stats().budget_used();
    if used >= st.high_watermark {
        m::backpressure();
        return Err(retry_later(
            format!(
                "spool is over its high watermark ({used} of {} bytes used): {}; retry later",
                st.high_watermark,
                why_full(st)
            ),
            10,
        ));
    }
    let layers = body::gzip_layers(req.headers())
        .map_err(|why| error_response(StatusCode::UNSUPPORTED_MEDIA_TYPE, why))?;
    let declared = body::declared_length(req.headers());
    if declared.is_some_and(|n| n > st.max_body_bytes) {
        return Err(too_large(st.max_body_bytes));
    }
    Ok(read_and_store(req, st, declared, layers, guard).await)
}

/// Reads the body and stores its events.
async fn read_and_store(
    req: Request<Incoming>,
    st: &IngestState,
    declared: Option<u64>,
    layers: usize,
    _guard: GateGuard<'_>,
) -> Resp {
    let slot = req.extensions().get::<Arc<connections::Slot>>().cloned();
    // A reserved place serves whoever could not get a regular one: its body must be as
    // quick as a real client's, or the place is held for nothing.
    let timeout = match &slot {
        Some(s) if s.reserved => connections::RESERVED_BODY_TIMEOUT,
        _ => body::BODY_TIMEOUT,
    };
    let pace = match &slot {
        Some(s) => s.pace.clone(),
        None => Arc::new(body::Pace::new()),
    };
    // The room is held until the answer: the body and what is built from it stay within
    // the budget.
    let read = body::read_body(
        req,
        &st.body_budget,
        body::Limits {
            max: st.max_body_bytes,
            declared,
            gzip_layers: layers,
            timeout,
            max_gzip_ratio: st.max_gzip_ratio,
        },
        pace,
    )
    .await;
    if let Some(s) = &slot {
        s.body_complete();
    }
    let (received, mut room) = match read {
        Ok(b) => b,
        Err(BodyProblem::TooLarge) => return closing(too_large(st.max_body_bytes)),
        Err(BodyProblem::NeverFits(budget)) => {
            return closing(error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the compressed body and its decoded form together need more than the {budget} bytes all bodies in flight may hold (--max-body-bytes + 32 MiB); send it uncompressed or smaller"),
            ))
        }
        Err(BodyProblem::NoRoom) => {
            m::backpressure();
            return closing(no_room(st));
        }
        Err(BodyProblem::Inflates { received, bound }) => {
            m::gzip_bomb();
            return closing(error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the gzip body decodes to more than {bound} bytes from the {received} bytes sent: past the first MiB, a body may decode to at most {} times its size as sent (--max-gzip-ratio; Ray's JSON batches compress about 4 to 10 times); send it uncompressed or less compressed", st.max_gzip_ratio),
            ));
        }
        Err(BodyProblem::Busy) => {
            m::backpressure();
            return closing(retry_later(
                format!(
                    "other gzip bodies are being decoded ({} at a time) and this one found no turn within {} s; retry later",
                    body::DECODERS,
                    body::BUDGET_WAIT.as_secs()
                ),
                1,
            ));
        }
        Err(BodyProblem::GaveWay) => {
            m::backpressure();
            return closing(retry_later(
                "the collector is at its connection limit and this body waited for its turn to be decoded or for room: its connection gives way to a new one; retry",
                1,
            ));
        }
        Err(BodyProblem::TimedOut) => {
            return closing(error_response(
                StatusCode::REQUEST_TIMEOUT,
                format!("request body not received within {} s", timeout.as_secs()),
            ))
        }
        Err(BodyProblem::Stalled) => {
            return closing(error_response(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request body stalled (nothing for {} ms, or slower than {} bytes/s) while other requests waited for the memory it held; resend it",
                    body::BODY_GRACE.as_millis(),
                    body::MIN_BODY_RATE
                ),
            ))
        }
        Err(BodyProblem::Read(e)) => {
            return error_response(StatusCode::BAD_REQUEST, format!("reading the body: {e}"))
        }
        Err(BodyProblem::BadGzip(raw, e, _room, received_bytes)) => {
            let msg = format!("body is not valid gzip: {e}");
            let kept = KeptBody::of(&raw, None, 0, received_bytes);
            drop(raw);
            return invalid_body(st, kept, msg).await;
        }
    };
    let body::Received {
        body,
        compressed,
        received_bytes,
    } = received;
    m::ingest_bytes(body.len() as u64);
    // What the body holds as charged (its buffer's capacity, with what is kept of it): its
    // camelCase form is charged beside that.
    let holds = room.held_bytes();
    let batch = loop {
        let short = match body::off_reactor(|| build_batch(st, &body, holds, &mut room)) {
            Ok(Ok(b)) => break b,
            Ok(Err(short)) => short,
            Err(e) => {
                let kept = KeptBody::of(&body, compressed, layers, received_bytes);
                drop(body);
                return invalid_body(st, kept, e.to_string()).await;
            }
        };
        // The camelCase form needs room the budget did not have free: wait for it (within
        // the body's budget wait), then build again.
        let problem = match short {
            ConversionRoom::Wait(bytes) => {
                let deadline = tokio::time::Instant::now() + body::BUDGET_WAIT;
                match room.grow_to(bytes, deadline).await {
                    Ok(()) => continue,
                    Err(p) => p,
                }
            }
            ConversionRoom::NeverFits(budget) => BodyProblem::NeverFits(budget),
        };
        return match problem {
            BodyProblem::NeverFits(budget) => error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body and the camelCase form of its snake_case events together need more than the {budget} bytes all bodies in flight may hold (--max-body-bytes + 32 MiB); send smaller batches, or store them as sent with --event-keys preserve"),
            ),
            _ => {
                m::backpressure();
                no_room(st)
            }
        };
    };
    // The spool stages an event by reference into the body, except one whose bytes hold a
    // line break: that one is copied (spaces in their place) until it is written. The copy
    // is charged beside the body, as its camelCase form is.
    let copied: u64 = batch
        .partitions
        .iter()
        .flat_map(|p| &p.events)
        .filter(|e| e.has_newline())
        .map(|e| e.range().len() as u64 + 1)
        .sum();
    if copied > 0 {
        let want = room.held_bytes().saturating_add(copied);
        let deadline = tokio::time::Instant::now() + body::BUDGET_WAIT;
        match room.grow_to(want, deadline).await {
            Ok(()) => {}
            Err(BodyProblem::NeverFits(budget)) => {
                return error_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the body and the copy of its events that hold line breaks (written with spaces in their place) together need more than the {budget} bytes all bodies in flight may hold (--max-body-bytes + 32 MiB); send smaller batches, or events without line breaks"),
                )
            }
            Err(_) => {
                m::backpressure();
                return no_room(st);
            }
        }
    }
    // Only now, with its batch built, does the request write to the spool: the shutdown's
    // seal waits for the requests past this point, not for a body still being decoded or
    // parsed (review r39f: a 40 KB gzip body of 40 MiB of zeros took 6.7 s to build in a
    // debug build and held the seal past a 3 s deadline).
    let Some(_storing) = st.storing.enter() else {
        return closing(sealing());
    };
    match st.spool.append(batch).await {
        Ok(o) => {
            // Without an ingest token, a connection that delivered events outranks cheap
            // clients from now on (though any local client can deliver one valid event,
            // review r39r D1). With one, only the token makes a connection Ray's
            // (`Slot::trust`, from its head on), and nothing is earned here.
            if o.accepted > 0 && st.ingest_token.is_none() {
                if let Some(s) = &slot {
                    s.pace.set_delivered();
                }
            }
            json_response(StatusCode::OK, serde_json::to_value(o).unwrap_or_default())
        }
        Err(e) if e.is_over_budget() => retry_later(format!("{e}; retry later"), 10),
        Err(e) if e.is_no_space() => retry_later(format!("spool disk is full: {e}"), 10),
        Err(e) if e.is_stopped() => retry_later(format!("{e}; shutting down"), 1),
        Err(e) => error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("could not store the events: {e}"),
        ),
    }
}

/// 503 for a body whose events (or quarantine record) would reach the spool after the
/// shutdown began its final seal: not stored, so the answer must not acknowledge it.
fn sealing() -> Resp {
    retry_later(
        "shutting down: the body arrived after the spool's final seal began; resend it",
        5,
    )
}

/// 503 for a body that found no room in the body budget within its wait.
fn no_room(st: &IngestState) -> Resp {
    retry_later(
        format!(
            "the request bodies in flight fill their memory budget ({} bytes, --max-body-bytes + 32 MiB); retry later",
            st.max_body_bytes.saturating_add(body::SMALL_BODIES_ROOM)
        ),
        1,
    )
}

fn too_large(max: u64) -> Resp {
    error_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("body larger than the limit of {max} bytes (--max-body-bytes)"),
    )
}

/// Answers 400 for a body that is not a JSON array of events, keeping (a bounded form of) it
/// in quarantine within the keeping rates ([`KeptBodies`](super::state::KeptBodies)).
async fn invalid_body(st: &IngestState, body: KeptBody, message: String) -> Resp {
    m::invalid_body();
    let keep = st
        .kept_bodies
        .lock()
        .map(|mut k| k.take(body.bytes.len()))
        .unwrap_or(false);
    if keep {
        // Kept in the spool: not once its final seal began (a resend reaches the next run).
        let Some(_storing) = st.storing.enter() else {
            return closing(sealing());
        };
        tracing::warn!(error = %message, bytes = body.body_bytes, kept = body.form.code(), kept_bytes = body.bytes.len(), "rejected a body that is not a JSON array of events; keeping it in quarantine");
        match st.spool.quarantine_body(body, message.clone()).await {
            Ok(()) => {}
            Err(e) if e.is_over_budget() => {
                m::invalid_body_not_kept();
                tracing::warn!(error = %e, "the invalid body is not kept: the spool is at its budget");
            }
            Err(e) => tracing::error!(error = %e, "could not keep the invalid body"),
        }
    } else {
        m::invalid_body_not_kept();
        tracing::debug!(error = %message, bytes = body.body_bytes, "rejected a body that is not a JSON array of events; not kept (more than {KEPT_BODIES_PER_SECOND} bodies or {KEPT_BODY_BYTES_PER_SECOND} bytes a second)");
    }
    error_response(StatusCode::BAD_REQUEST, message)
}
