//! Which answer a request gets, by listener: [`handle`] for the events listener (events,
//! probes, metrics) and [`read_only`] for `--metrics-listen` (`GET`/`HEAD` of the probes and
//! `/metrics` only, events refused before their body is read); `/readyz` says `503` while the
//! spool is over its high watermark or the collector shuts down.

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use super::answers::{closing, error_response, method_not_allowed, text_response, Resp};
use super::ingest::{ingest, why_full};
use super::state::IngestState;
use crate::metrics as m;

pub(super) fn is_events_post(req: &Request<Incoming>) -> bool {
    req.method() == Method::POST && matches!(req.uri().path(), "/v1/events" | "/events")
}

pub(super) fn is_probe(req: &Request<Incoming>) -> bool {
    matches!(*req.method(), Method::GET | Method::HEAD)
        && matches!(req.uri().path(), "/healthz" | "/readyz")
}

pub(super) async fn handle(req: Request<Incoming>, st: &IngestState) -> Resp {
    let (label, resp) = match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/events" | "/events") if !st.events_enabled => (
            "/v1/events",
            error_response(
                StatusCode::NOT_FOUND,
                "the event collector is disabled (--enable-event-collector=false)",
            ),
        ),
        (&Method::POST, "/v1/events" | "/events") => ("/v1/events", ingest(req, st).await),
        (_, "/v1/events" | "/events") => ("/v1/events", method_not_allowed("POST")),
        (&Method::GET | &Method::HEAD, "/healthz") => (
            "/healthz",
            text_response(StatusCode::OK, "ok\n".into(), "text/plain"),
        ),
        (&Method::GET | &Method::HEAD, "/readyz") => ("/readyz", readiness(st)),
        (&Method::GET, "/metrics") => ("/metrics", metrics(st)),
        (_, "/healthz" | "/readyz" | "/metrics") => ("other", method_not_allowed("GET")),
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
