//! Which answer a request gets, by listener: [`handle`] for the events listener (events,
//! probes, metrics) and [`read_only`] for `--metrics-listen` (`GET`/`HEAD` of the probes and
//! `/metrics` only, events refused before their body is read); `/readyz` says `503` while the
//! spool is over its high watermark or the collector shuts down.

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use super::answers::{closing, error_response, method_not_allowed, text_response, Resp};
use super::ingest::{ingest, why_full};
use super::state::IngestState;
use super::token::IngestToken;
use crate::metrics as m;

/// Who posts events, as far as the head tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Poster {
    /// No ingest token is configured: any client on the events listener may post, and a
    /// local client posting valid events cannot be told from Ray.
    Anyone,
    /// The path carries the configured ingest token: Ray's aggregator agent.
    Ray,
    /// A token is configured and this post does not carry it (none, or another): refused
    /// at once, its body never read.
    Refused,
}

/// Whether the request posts events, and who posts it: with `token`, `/v1/events/<token>`
/// (or the older `/events/<token>`) is Ray's and every other post to those paths is refused;
/// without one, `/v1/events` and `/events` are anyone's (and `/v1/events/<anything>` is no
/// events path, as before tokens existed).
pub(super) fn events_post(req: &Request<Incoming>, token: Option<&IngestToken>) -> Option<Poster> {
    if req.method() != Method::POST {
        return None;
    }
    let path = req.uri().path();
    let bare = matches!(path, "/v1/events" | "/events");
    let Some(token) = token else {
        return bare.then_some(Poster::Anyone);
    };
    let given = path
        .strip_prefix("/v1/events/")
        .or_else(|| path.strip_prefix("/events/"));
    match given {
        Some(given) if token.matches(given) => Some(Poster::Ray),
        Some(_) => Some(Poster::Refused),
        None if bare => Some(Poster::Refused),
        None => None,
    }
}

pub(super) fn is_probe(req: &Request<Incoming>) -> bool {
    matches!(*req.method(), Method::GET | Method::HEAD)
        && matches!(req.uri().path(), "/healthz" | "/readyz")
}

/// The answer of the events listener; `poster` is [`events_post`] of the request.
pub(super) async fn handle(
    req: Request<Incoming>,
    st: &IngestState,
    poster: Option<Poster>,
) -> Resp {
    let (label, resp) = match (poster, req.method(), req.uri().path()) {
        (Some(_), _, _) if !st.events_enabled => (
            "/v1/events",
            error_response(
                StatusCode::NOT_FOUND,
                "the event collector is disabled (--enable-event-collector=false)",
            ),
        ),
        // Answered from the head alone: the body is never read and the connection closes.
        // The path is not echoed: it may hold a token close to the real one.
        (Some(Poster::Refused), _, _) => (
            "/v1/events",
            closing(error_response(
                StatusCode::FORBIDDEN,
                "this collector takes events only with its ingest token: POST /v1/events/<token>, the token of --ingest-token-file or RHC_INGEST_TOKEN, in Ray's RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR",
            )),
        ),
        (Some(_), _, _) => ("/v1/events", ingest(req, st).await),
        (None, _, "/v1/events" | "/events") => ("/v1/events", method_not_allowed("POST")),
        (None, &Method::GET | &Method::HEAD, "/healthz") => (
            "/healthz",
            text_response(StatusCode::OK, "ok\n".into(), "text/plain"),
        ),
        (None, &Method::GET | &Method::HEAD, "/readyz") => ("/readyz", readiness(st)),
        (None, &Method::GET, "/metrics") => ("/metrics", metrics(st)),
        (None, _, "/healthz" | "/readyz" | "/metrics") => ("other", method_not_allowed("GET")),
        _ => (
            "other",
            error_response(
                StatusCode::NOT_FOUND,
                "not found; events go to POST /v1/events",
            ),
        ),
    };
    m::http_request(label, resp.status().as_u16());
    // Only Ray's event posts keep their connection: every other answer (probes, metrics,
    // refusals) closes it, so a client that pipelines requests and never reads the answers
    // gets one answer per connection, whatever its receive window (review r39d: with an
    // ordinary window the send-queue check never saw it, and 72,681 `/metrics` were rendered
    // for connections that read nothing while Ray got 10 of 40 batches through). Kubelet
    // opens a connection per probe anyway; Prometheus reconnects once per scrape.
    if label == "/v1/events" {
        resp
    } else {
        closing(resp)
    }
}

/// The read-only listener: probes and metrics; everything else refused without reading a
/// body (the connection is closed after an answer to a request that has one).
pub(super) fn read_only(req: &Request<Incoming>, st: &IngestState) -> Resp {
    let (label, resp) = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/healthz") => (
            "/healthz",
            text_response(StatusCode::OK, "ok\n".into(), "text/plain"),
        ),
        (&Method::GET | &Method::HEAD, "/readyz") => ("/readyz", readiness(st)),
        (&Method::GET | &Method::HEAD, "/metrics") => ("/metrics", metrics(st)),
        (_, "/healthz" | "/readyz" | "/metrics") => {
            ("other", closing(method_not_allowed("GET, HEAD")))
        }
        (_, "/v1/events" | "/events") => (
            "other",
            closing(error_response(
                StatusCode::NOT_FOUND,
                "no events here: this is the read-only listener (--metrics-listen: /healthz, /readyz, /metrics); Ray posts its events to the events listener (--listen, on the pod's loopback)",
            )),
        ),
        _ => (
            "other",
            closing(error_response(
                StatusCode::NOT_FOUND,
                "not found; this read-only listener (--metrics-listen) serves GET /healthz, /readyz and /metrics",
            )),
        ),
    };
    m::http_request(label, resp.status().as_u16());
    // Every answer here closes its connection: one answer per connection for a client that
    // pipelines and never reads (see `handle`).
    closing(resp)
}

fn metrics(st: &IngestState) -> Resp {
    text_response(
        StatusCode::OK,
        m::render(&st.metrics, spool_gauges(st)),
        "text/plain; version=0.0.4",
    )
}

fn spool_gauges(st: &IngestState) -> m::SpoolGauges {
    let stats = st.spool.stats();
    m::SpoolGauges {
        bytes: stats.stored_bytes(),
        files: stats.files(),
        oldest_age_seconds: stats.oldest_pending_age_seconds(),
        conditional_writes: crate::storage::versioned::conditional_writes_now(),
        conditions_refused: crate::storage::conditions::kinds_refused(),
        earlier_run_files: stats.earlier_left() as u64,
        held_for_earlier_run: stats.earlier_holding(),
    }
}

fn readiness(st: &IngestState) -> Resp {
    if st.requests.is_closed() {
        return text_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting down\n".into(),
            "text/plain",
        );
    }
    let used = st.spool.stats().budget_used();
    if used >= st.high_watermark {
        return text_response(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "spool over its high watermark: {used} of {} bytes: {}\n",
                st.high_watermark,
                why_full(st)
            ),
            "text/plain",
        );
    }
    text_response(StatusCode::OK, "ready\n".into(), "text/plain")
}
