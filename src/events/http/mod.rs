//! The HTTP side: Ray's dashboard agent POSTs event batches here.
//!
//! The contract with Ray shapes every answer: Ray resends a batch forever after any non-2xx,
//! and resends it after 3 s without an answer. So a batch with bad events still gets 200
//! (the bad events go to quarantine), 4xx is only for bodies that can never succeed, and
//! 503 is only for real backpressure or shutdown, when a resend is what we want.
//!
//! Two kinds of listener share this code ([`Routes`]): the events listener (`--listen`),
//! which serves everything, and the optional read-only one (`--metrics-listen`), which
//! serves `GET`/`HEAD` of `/healthz`, `/readyz` and `/metrics` and nothing else. In a pod the
//! events listener stays on 127.0.0.1, where only the pod's own containers reach it, and the
//! read-only one takes the pod IP for kubelet's probes and Prometheus: nobody outside the
//! pod can write history or fill the spool.

mod body;
mod connections;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE, RETRY_AFTER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::contract::{Partition, Stream};
use crate::events::camel;
use crate::events::dedup::id_hash;
use crate::events::parse::{self, for_each_event, ParsedEvent};
use crate::events::quarantine::{
    event_record_len, KeptBody, QuarantineReason, MAX_KEPT_BODY_BYTES,
};
use crate::events::route::{route_with, IdCache, NodeName};
use crate::events::spool::{
    AppendBatch, EventSpan, PartitionBatch, QuarantinedEvent, Spool, FILE_BUDGET_BYTES,
    MAX_SPAN_BODY,
};
use crate::metrics as m;
use crate::node::node_id::EventNodeHint;
pub use body::DEFAULT_MAX_GZIP_RATIO;
use body::{BodyBudget, BodyProblem};
use connections::Connections;

/// How long a client may take to send request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest request head (`max_header_size`), and the most hyper buffers of one
/// connection's input before it looks whether a head is too long (`max_buf_size`): a longer
/// head is answered `431` and the connection closed. Ray's heads are a few hundred bytes and
/// probes' and scrapers' less; 32 KiB is what nginx allows a head by default (four 8 KiB
/// buffers) and twice Node's limit. hyper's default, about 408 KiB, let 250 connections with
/// unfinished heads hold 100 MB outside the body budget. hyper's buffer may grow to twice
/// this before its check, so a socket costs at most 64 KiB for an unfinished head (see the
/// docs/sizing-and-cost.md, Sizing). Bodies are read through the same buffer, in reads of at most this size.
pub(super) const MAX_HEAD_BYTES: usize = 32 << 10;
/// Unusable elements of one body kept in quarantine; beyond it they are counted, not kept:
/// a body of millions of bad elements (`[0,0,0,…]`) must cost neither memory nor disk in
/// proportion to its element count, and a thousand records say what is wrong with it.
pub const MAX_QUARANTINED_PER_BODY: usize = 1000;
/// Bytes of quarantine records one body may keep (their events and the records around
/// them): what an invalid body keeps ([`MAX_KEPT_BODY_BYTES`]). Without it a thousand
/// large bad elements (1,000 strings of 60 KB in a 66 KB gzip body) kept 57 MiB of
/// quarantine per request, and built their records in memory beside the body.
pub const MAX_QUARANTINED_BYTES_PER_BODY: usize = MAX_KEPT_BODY_BYTES;
/// Invalid bodies kept in quarantine: a burst of this many, then [`KEPT_BODIES_PER_SECOND`].
/// Each kept body costs a file, its syncs and an upload; a storm of distinct bad bodies
/// would otherwise slow the spool for the good ones and outlast the shutdown deadline.
const KEPT_BODIES_BURST: f64 = 100.0;
/// Sustained rate of invalid bodies kept in quarantine; the rest are answered 400 and counted.
const KEPT_BODIES_PER_SECOND: f64 = 10.0;
/// Bytes of the spool's budget that quarantine may take for what the HTTP side keeps
/// (invalid bodies, each at most [`MAX_KEPT_BODY_BYTES`] plus its file's
/// [`FILE_BUDGET_BYTES`] and its record; and the records of unusable elements): a burst of
/// this many, then [`KEPT_BODY_BYTES_PER_SECOND`]. The spool is the outage buffer of real
/// events: garbage may take 4 MiB of it at once and then about 56 MiB an hour, whatever is
/// sent and however it is cut (tiny bodies, large bad elements).
const KEPT_BODY_BYTES_BURST: f64 = (4 << 20) as f64;
/// Sustained rate of quarantine bytes kept: one body of the largest kept size every four
/// seconds, or many small ones.
const KEPT_BODY_BYTES_PER_SECOND: f64 = (16 << 10) as f64;
/// Most bytes of an invalid body's record (its reason, the parser's message, sizes).
const KEPT_BODY_RECORD_BYTES: usize = 1024;

/// Token buckets, one of bodies and one of bytes, deciding which invalid bodies and which
/// unusable elements are kept.
struct KeptBodies {
    bodies: f64,
    bytes: f64,
    last: Instant,
}

impl KeptBodies {
    fn new() -> KeptBodies {
        KeptBodies {
            bodies: KEPT_BODIES_BURST,
            bytes: KEPT_BODY_BYTES_BURST,
            last: Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let secs = now.duration_since(self.last).as_secs_f64();
        self.bodies = (self.bodies + secs * KEPT_BODIES_PER_SECOND).min(KEPT_BODIES_BURST);
        self.bytes = (self.bytes + secs * KEPT_BODY_BYTES_PER_SECOND).min(KEPT_BODY_BYTES_BURST);
        self.last = now;
    }

    /// Whether a body of which `bytes` would be kept is kept. It is charged what it costs
    /// the spool's budget: its bytes, its own file, and its record.
    fn take(&mut self, bytes: usize) -> bool {
        self.refill();
        let cost = (bytes + KEPT_BODY_RECORD_BYTES) as f64 + FILE_BUDGET_BYTES as f64;
        if self.bodies >= 1.0 && self.bytes >= cost {
            self.bodies -= 1.0;
            self.bytes -= cost;
            true
        } else {
            false
        }
    }

    /// Whether a quarantine record of `bytes` (an unusable element's) is kept.
    fn take_record(&mut self, bytes: usize) -> bool {
        self.refill();
        if self.bytes >= bytes as f64 {
            self.bytes -= bytes as f64;
            true
        } else {
            false
        }
    }
}

/// How events that Ray sent with snake_case keys are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKeys {
    /// As protobuf's camelCase JSON of the same message ([`crate::events::camel`]): the only
    /// form KubeRay's history server reads.
    Camel,
    /// Byte for byte as sent.
    Preserve,
}

/// The settings of the HTTP side.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// Largest body accepted, after decompression.
    pub max_body_bytes: u64,
    /// Spool size above which requests get 503.
    pub high_watermark: u64,
    /// `--node-id`: the node of events that carry none.
    pub configured_node: Option<String>,
    /// Accept events at all (`--enable-event-collector`).
    pub events_enabled: bool,
    /// How snake_case events are stored.
    pub event_keys: EventKeys,
    /// `--max-gzip-ratio`: past the first MiB, a gzip body decodes to at most this many
    /// times its bytes as received (0: no bound but `max_body_bytes`).
    pub max_gzip_ratio: u64,
}

/// State shared by all requests.
pub struct IngestState {
    spool: Spool,
    max_body_bytes: u64,
    high_watermark: u64,
    configured_node: Option<String>,
    learned_node: EventNodeHint,
    events_enabled: bool,
    event_keys: EventKeys,
    max_gzip_ratio: u64,
    /// Event requests in flight (bodies still arriving included); closed at shutdown, when
    /// new requests get 503.
    requests: Gate,
    /// Requests whose batch is built and is being written to the spool (events, or an
    /// invalid body's quarantine record); closed by the shutdown once the requests in flight
    /// have had their grace: a batch built after this is answered 503, not stored, so the
    /// seal that follows is final and waits for no decoding or parsing.
    storing: Gate,
    metrics: PrometheusHandle,
    kept_bodies: Mutex<KeptBodies>,
    body_budget: BodyBudget,
}

impl IngestState {
    /// New state; `learned_node` receives the node id seen in events (shared with the log
    /// side).
    pub fn new(
        cfg: IngestConfig,
        spool: Spool,
        learned_node: EventNodeHint,
        metrics: PrometheusHandle,
    ) -> Arc<IngestState> {
        body::start_lag_watch();
        Arc::new(IngestState {
            spool,
            max_body_bytes: cfg.max_body_bytes,
            high_watermark: cfg.high_watermark,
            configured_node: cfg.configured_node,
            learned_node,
            events_enabled: cfg.events_enabled,
            event_keys: cfg.event_keys,
            max_gzip_ratio: cfg.max_gzip_ratio,
            requests: Gate::default(),
            storing: Gate::default(),
            metrics,
            kept_bodies: Mutex::new(KeptBodies::new()),
            body_budget: BodyBudget::new(cfg.max_body_bytes),
        })
    }

    /// From now on, event requests get 503 "shutting down".
    pub fn begin_shutdown(&self) {
        self.requests.close();
    }

    /// Waits until no event request is in flight (bodies still arriving included).
    pub async fn wait_idle(&self) {
        self.requests.wait_empty().await;
    }

    /// From now on a body that finishes arriving is answered 503 and not stored; waits until
    /// the requests already storing have answered. The shutdown calls it after the bodies
    /// still arriving had their grace, so that one slow client (never answered, so never
    /// acknowledged) cannot hold the seal of every acknowledged event past the deadline.
    pub async fn stop_storing(&self) {
        self.storing.close();
        self.storing.wait_empty().await;
    }
}

/// A count of the requests inside a stage of ingest, and whether the stage still admits
/// new ones. A request is counted before it reads whether the gate is closed, both
/// sequentially consistent: either it sees the gate closed and goes no further, or the
/// shutdown's [`Gate::wait_empty`] sees it counted and waits for it. Checked the other way
/// round, a request could pass the check, the shutdown find nothing inside and seal the
/// spool, and the request then store its events after the seal and answer 200 for events
/// left on disk (the CI's chaos `sigterm`: 200 acknowledged events not uploaded, exit 3).
#[derive(Default)]
struct Gate {
    closed: AtomicBool,
    inside: AtomicUsize,
    empty: Notify,
}

impl Gate {
    /// `None` when the gate is closed (nothing is counted then).
    fn enter(&self) -> Option<GateGuard<'_>> {
        self.inside.fetch_add(1, Ordering::SeqCst);
        let guard = GateGuard(self);
        (!self.is_closed()).then_some(guard)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    async fn wait_empty(&self) {
        loop {
            let notified = self.empty.notified();
            if self.inside.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// A request counted inside a [`Gate`] until dropped.
struct GateGuard<'a>(&'a Gate);

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        if self.0.inside.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.empty.notify_waiters();
        }
    }
}

/// What a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routes {
    /// Events, probes and metrics (`--listen`).
    All,
    /// Probes and metrics only, `GET`/`HEAD` (`--metrics-listen`); events are refused with
    /// 404 before their body is read.
    ReadOnly,
}

/// Accepts connections until the task is dropped.
///
/// The loop never waits for a place: at the cap a new connection takes the place of the
/// least useful open one, or one of the reserved places, or waits for one in a bounded
/// waiting room, at most [`connections::MAX_WAIT`] (on a task of its own), or is closed at
/// once when that is full (see [`connections`]). Between connections the loop hands the
/// places that became free, or able to give way, to the connections waiting, the first come
/// first. Each listener has its own places: scrapers on the read-only listener never take
/// one from Ray.
pub async fn serve(listener: TcpListener, state: Arc<IngestState>, routes: Routes) {
    let connections = Connections::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = connections.seat_due() => {
                connections.seat_waiting();
                continue;
            }
        };
        let (stream, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: wait a little instead of spinning, still seating the
                // connections that wait.
                tracing::warn!(error = %e, "accept failed");
                let pause = tokio::time::sleep(Duration::from_millis(100));
                tokio::pin!(pause);
                loop {
                    tokio::select! {
                        () = &mut pause => break,
                        () = connections.seat_due() => connections.seat_waiting(),
                    }
                }
                continue;
            }
        };
        match connections.arrive() {
            connections::Arrival::Seated(admitted) => {
                tokio::spawn(serve_connection(
                    stream,
                    peer,
                    admitted,
                    state.clone(),
                    routes,
                ));
            }
            connections::Arrival::Waiting(mut waiting) => {
                m::connection_waited();
                let state = state.clone();
                tokio::spawn(async move {
                    match waiting.seated().await {
                        Some(admitted) => {
                            drop(waiting);
                            serve_connection(stream, peer, admitted, state, routes).await;
                        }
                        None => {
                            m::connection_refused();
                            tracing::debug!(%peer, "closed a new connection: no place could be had within its wait");
                        }
                    }
                });
            }
            connections::Arrival::Refused => {
                m::connection_refused();
                tracing::debug!(%peer, "closed a new connection at once: every place, reserved one, leaving one and waiting one is taken");
            }
        }
    }
}

/// Serves one connection until it ends, or until it is chosen to give way.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    admitted: connections::Admitted,
    state: Arc<IngestState>,
    routes: Routes,
) {
    if let Some(why) = admitted.evicted {
        m::connection_evicted(why.code());
    }
    let _ = stream.set_nodelay(true);
    let slot = admitted.slot.clone();
    let reserved = slot.reserved;
    // Valid while the connection is served: `conn` below owns the stream and the service.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let svc = service_fn(move |mut req: Request<Incoming>| {
        let slot = slot.clone();
        let state = state.clone();
        async move {
            // A pipelined request waits until the answers before it are read (one answer
            // for a client that never reads; the connection is cut after UNREAD_AFTER).
            connections::earlier_answers_read(fd, &slot).await;
            if routes == Routes::ReadOnly {
                slot.request_started(false);
                let resp = if slot.reserved && !is_probe(&req) {
                    m::http_request("other", 503);
                    closing(retry_later(
                        "the collector is at its connection limit; only /healthz and /readyz are served on a new connection now",
                        1,
                    ))
                } else {
                    read_only(&req, &state)
                };
                slot.request_ended();
                return Ok::<_, Infallible>(resp);
            }
            let events = is_events_post(&req);
            slot.request_started(events);
            // The body reader reports its progress to the connection's slot.
            req.extensions_mut().insert(slot.clone());
            let resp = if slot.reserved && !events && !is_probe(&req) {
                m::http_request("other", 503);
                closing(retry_later(
                    "the collector is at its connection limit; only /healthz, /readyz and POST /v1/events are served on a new connection now",
                    1,
                ))
            } else {
                handle(req, &state).await
            };
            slot.request_ended();
            Ok::<_, Infallible>(resp)
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(if reserved {
            connections::STALLED_AFTER
        } else {
            HEADER_TIMEOUT
        })
        .keep_alive(!reserved)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_header_size(MAX_HEAD_BYTES)
        .serve_connection(
            TokioIo::new(connections::Watched::new(stream, admitted.slot.clone())),
            svc,
        );
    let mut conn = std::pin::pin!(conn);
    let leave_by = tokio::select! {
        result = &mut conn => {
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            return;
        }
        () = admitted.slot.cut() => {
            m::connection_evicted(connections::Eviction::NotReading.code());
            tracing::debug!(%peer, "cut a connection: it pipelined a request and did not read the answers before it");
            return;
        }
        why = admitted.slot.chosen() => {
            // Checked here, between polls of the connection: a head that arrived since it
            // was chosen is answered, not cut off.
            if why.cuts() && admitted.slot.still(why) {
                tracing::debug!(%peer, reason = why.code(), "cut a connection to make room for a new one");
                return;
            }
            tracing::debug!(%peer, reason = why.code(), "closing a connection to make room for a new one");
            conn.as_mut().graceful_shutdown();
            tokio::time::Instant::now() + connections::LEAVE_GRACE
        }
    };
    // An answer the client does not read ends the grace: the socket is not held for it.
    tokio::select! {
        result = tokio::time::timeout_at(leave_by, conn) => {
            if let Ok(Err(e)) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        }
        _ = connections::stuck_answer(&admitted.slot) => {
            tracing::debug!(%peer, "cut a leaving connection: its client does not read its answer");
        }
    }
    drop(admitted);
}

fn is_events_post(req: &Request<Incoming>) -> bool {
    req.method() == Method::POST && matches!(req.uri().path(), "/v1/events" | "/events")
}

fn is_probe(req: &Request<Incoming>) -> bool {
    matches!(*req.method(), Method::GET | Method::HEAD)
        && matches!(req.uri().path(), "/healthz" | "/readyz")
}

type Resp = Response<Full<Bytes>>;

fn json_response(status: StatusCode, body: serde_json::Value) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error_response(status: StatusCode, message: impl Into<String>) -> Resp {
    json_response(status, serde_json::json!({ "error": message.into() }))
}

fn retry_later(message: impl Into<String>, retry_after_secs: u32) -> Resp {
    let mut r = error_response(StatusCode::SERVICE_UNAVAILABLE, message);
    r.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
    r
}

fn text_response(status: StatusCode, body: String, content_type: &'static str) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn method_not_allowed(allow: &'static str) -> Resp {
    let mut r = error_response(StatusCode::METHOD_NOT_ALLOWED, format!("use {allow}"));
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    r
}

async fn handle(req: Request<Incoming>, st: &IngestState) -> Resp {
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
fn read_only(req: &Request<Incoming>, st: &IngestState) -> Resp {
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
    }
}

/// Why the spool is over its high watermark, as far as it is known: events not yet in the
/// bucket (the store is slow or failing), or none, the room being held by open segments
/// that are already uploaded and that the writer is sealing to free it (the review r35e
/// found "uploads are behind" said for minutes with every event in the bucket).
fn why_full(st: &IngestState) -> &'static str {
    if st.spool.stats().oldest_pending_age_seconds() > 0.0 {
        "uploads are behind"
    } else {
        "every event in it is in the bucket; the open segments holding it are being sealed to free it"
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

/// Marks an answer given without reading the request body: the connection cannot carry
/// another request, and saying so keeps the client from sending one into it.
fn closing(mut r: Resp) -> Resp {
    r.headers_mut()
        .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    r
}

async fn ingest(req: Request<Incoming>, st: &IngestState) -> Resp {
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
        Ok(o) => json_response(StatusCode::OK, serde_json::to_value(o).unwrap_or_default()),
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
/// in quarantine within the keeping rates ([`KeptBodies`]).
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

/// Unusable events of one body kept in quarantine: at most [`MAX_QUARANTINED_PER_BODY`] and
/// [`MAX_QUARANTINED_BYTES_PER_BODY`] of records, within the keeping rate ([`KeptBodies`]),
/// the rest counted by reason (`quarantine_dropped` in the answer,
/// `rhc_events_quarantine_dropped_total{reason}`).
struct Quarantine<'a> {
    list: Vec<QuarantinedEvent>,
    /// Bytes of the records of `list`.
    bytes: usize,
    dropped: u64,
    /// Of those, the ones the keeping rate refused.
    over_rate: u64,
    /// Of those, by reason (counted into the metric once per body, not per element).
    dropped_by_reason: Vec<(QuarantineReason, u64)>,
    rate: &'a Mutex<KeptBodies>,
}

impl<'a> Quarantine<'a> {
    fn new(rate: &'a Mutex<KeptBodies>) -> Quarantine<'a> {
        Quarantine {
            list: Vec::new(),
            bytes: 0,
            dropped: 0,
            over_rate: 0,
            dropped_by_reason: Vec::new(),
            rate,
        }
    }

    fn push(&mut self, reason: QuarantineReason, range: &std::ops::Range<usize>) {
        let record = event_record_len(reason, range.len());
        if self.list.len() < MAX_QUARANTINED_PER_BODY
            && self.bytes + record <= MAX_QUARANTINED_BYTES_PER_BODY
        {
            let within_rate = self
                .rate
                .lock()
                .map(|mut k| k.take_record(record))
                .unwrap_or(false);
            if within_rate {
                self.bytes += record;
                self.list.push(QuarantinedEvent {
                    reason,
                    start: range.start,
                    end: range.end,
                    source: None,
                });
                return;
            }
            self.over_rate += 1;
        }
        self.dropped += 1;
        match self
            .dropped_by_reason
            .iter_mut()
            .find(|(r, _)| *r == reason)
        {
            Some((_, n)) => *n += 1,
            None => self.dropped_by_reason.push((reason, 1)),
        }
    }
}

/// Room a body's camelCase form takes beside it: the form is never longer than the
/// snake_case one (names only lose underscores, whitespace between tokens is dropped), and
/// the other events and quarantined elements are copied beside it, so the body's length
/// bounds it; an eighth more keeps a converter change from ever growing the buffer beyond
/// what it was charged.
fn conversion_room(body_len: usize) -> usize {
    body_len.saturating_add(body_len / 8)
}

/// Why a batch was not built: its camelCase form needs more room in the body budget.
enum ConversionRoom {
    /// The budget has not this many bytes free for the body now.
    Wait(u64),
    /// More than the whole budget, this many bytes, would be needed.
    NeverFits(u64),
}

/// Routes every event of `body`, grouping them by partition.
///
/// With `--event-keys camel`, an event Ray sent with snake_case keys is stored as its
/// camelCase form ([`camel::to_camel`]). The stored body is then one new buffer: the
/// converted events, then copies of the other events and of the quarantined elements, all
/// spans pointing there. That buffer ([`conversion_room`]) is charged to the body's `room`,
/// beside the `holds` bytes the body holds already, before it is allocated, so the body and its camelCase form stay within the body budget
/// (`Ok(Err(_))` when the room is not free now, or never can be). One that cannot be
/// converted is quarantined.
fn build_batch(
    st: &IngestState,
    body: &Bytes,
    holds: u64,
    room: &mut body::Room<'_>,
) -> Result<Result<AppendBatch, ConversionRoom>, parse::BodyError> {
    let learned = if st.configured_node.is_none() {
        st.learned_node.lock().ok().and_then(|g| g.clone())
    } else {
        None
    };
    let fallback: &str = st
        .configured_node
        .as_deref()
        .or(learned.as_deref())
        .unwrap_or("unknown-node");
    let mut partitions: Vec<PartitionBatch> = Vec::new();
    let mut kept = Quarantine::new(&st.kept_bodies);
    let mut last: usize = usize::MAX;
    let mut seen_node: Option<String> = None;
    let mut ids = IdCache::default();
    let convert = st.event_keys == EventKeys::Camel;
    // Converted events, and where their spans are: (partition, index in it).
    let mut converted: Vec<u8> = Vec::new();
    let mut moved: Vec<(u32, u32)> = Vec::new();
    let mut too_large = false;
    let mut unknown_fields = 0u64;
    let mut short: Option<ConversionRoom> = None;
    for_each_event(body, |ev| {
        if short.is_some() {
            return;
        }
        let ParsedEvent::Object(fields) = &ev.parsed else {
            kept.push(QuarantineReason::NotAnObject, &ev.range);
            return;
        };
        if ev.unreadable.is_some() {
            kept.push(QuarantineReason::NumberOutOfRange, &ev.range);
            return;
        }
        let r = match route_with(fields, fallback, &mut ids) {
            Ok(r) => r,
            Err(reason) => {
                kept.push(reason, &ev.range);
                return;
            }
        };
        if st.configured_node.is_none() && seen_node.is_none() {
            if let NodeName::Hex(h) = r.node {
                seen_node = Some(h.as_str().to_string());
            }
        }
        let id_hash = fields.event_id.as_str().map(|id| id_hash(id.as_bytes()));
        let span = if convert && fields.snake_case {
            if converted.capacity() == 0 {
                let extra = conversion_room(body.len());
                let need = holds.saturating_add(extra as u64);
                match room.try_grow_to(need) {
                    Ok(true) => converted.reserve_exact(extra),
                    Ok(false) => {
                        short = Some(ConversionRoom::Wait(need));
                        return;
                    }
                    Err(BodyProblem::NeverFits(budget)) => {
                        short = Some(ConversionRoom::NeverFits(budget));
                        return;
                    }
                    Err(_) => {
                        short = Some(ConversionRoom::Wait(need));
                        return;
                    }
                }
            }
            let start = converted.len();
            match camel::to_camel(&body[ev.range.clone()], &mut converted) {
                Ok(c) => unknown_fields += c.unknown_fields as u64,
                Err(e) => {
                    tracing::debug!(error = %e, "a snake_case event could not be converted; quarantined");
                    kept.push(QuarantineReason::UnconvertibleFieldNames, &ev.range);
                    return;
                }
            }
            EventSpan::new(start..converted.len(), id_hash, false)
        } else {
            EventSpan::new(ev.range.clone(), id_hash, ev.has_newline)
        };
        // Only a body beyond what --max-body-bytes allows could overflow a span.
        let Some(span) = span else {
            too_large = true;
            return;
        };
        let is_converted = convert && fields.snake_case;
        let job = r.job.as_ref().map(|j| j.as_str());
        let matches = |p: &Partition| {
            p.hour == r.hour
                && p.session == r.session
                && p.node == r.node.as_str()
                && match (&p.stream, job) {
                    (Stream::Node, None) => true,
                    (Stream::Job(a), Some(b)) => a == b,
                    _ => false,
                }
        };
        let idx = if last < partitions.len() && matches(&partitions[last].partition) {
            last
        } else if let Some(i) = partitions.iter().position(|pb| matches(&pb.partition)) {
            i
        } else {
            partitions.push(PartitionBatch {
                partition: Partition {
                    session: r.session.to_string(),
                    node: r.node.as_str().to_string(),
                    stream: match job {
                        Some(j) => Stream::Job(j.to_string()),
                        None => Stream::Node,
                    },
                    hour: r.hour,
                },
                events: Vec::new(),
            });
            partitions.len() - 1
        };
        last = idx;
        if is_converted {
            moved.push((idx as u32, partitions[idx].events.len() as u32));
        }
        partitions[idx].events.push(span);
    })?;
    if let Some(short) = short {
        return Ok(Err(short));
    }
    if too_large {
        return Err(parse::BodyError {
            message: format!("body larger than {MAX_SPAN_BODY} bytes"),
            offset: 0,
        });
    }
    let body = if moved.is_empty() {
        body.clone()
    } else {
        m::events_renamed(moved.len() as u64, unknown_fields);
        // The events not converted, and the quarantined elements, are copied after the
        // converted ones: the stored body is `converted` alone, within its charged room.
        let mut is_moved: Vec<Vec<bool>> = partitions
            .iter()
            .map(|p| vec![false; p.events.len()])
            .collect();
        for (p, i) in moved {
            is_moved[p as usize][i as usize] = true;
        }
        let overflow = || parse::BodyError {
            message: format!("body larger than {MAX_SPAN_BODY} bytes once converted"),
            offset: 0,
        };
        for (pb, moved) in partitions.iter_mut().zip(&is_moved) {
            for (span, _) in pb.events.iter_mut().zip(moved).filter(|(_, m)| !**m) {
                let start = converted.len();
                converted.extend_from_slice(&body[span.range()]);
                *span = span.moved_to(start).ok_or_else(overflow)?;
            }
        }
        for q in &mut kept.list {
            let start = converted.len();
            converted.extend_from_slice(&body[q.start..q.end]);
            q.end = start + (q.end - q.start);
            q.start = start;
        }
        Bytes::from(converted)
    };
    if let Some(node) = seen_node {
        if let Ok(mut g) = st.learned_node.lock() {
            if g.as_deref() != Some(node.as_str()) {
                *g = Some(node);
            }
        }
    }
    for (reason, n) in &kept.dropped_by_reason {
        m::quarantine_dropped(reason.code(), *n);
    }
    if kept.dropped > 0 {
        tracing::debug!(
            kept = kept.list.len(),
            kept_bytes = kept.bytes,
            dropped = kept.dropped,
            over_rate = kept.over_rate,
            "more unusable events in one body than are kept (at most {MAX_QUARANTINED_PER_BODY} and {MAX_QUARANTINED_BYTES_PER_BODY} bytes of records a body, {KEPT_BODY_BYTES_PER_SECOND} bytes a second in all); the rest are counted"
        );
    }
    Ok(Ok(AppendBatch {
        body,
        partitions,
        quarantined: kept.list,
        quarantine_dropped: kept.dropped,
        checkpoint: None,
    }))
}

/// Binds the listener, with the address in the error.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    use anyhow::Context;
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr} (--listen / EVENTS_PORT)"))
}

/// Binds the read-only listener, with the address in the error.
pub async fn bind_read_only(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    use anyhow::Context;
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr} (--metrics-listen)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_bodies_are_kept_in_a_burst_then_at_a_bounded_rate() {
        let mut k = KeptBodies::new();
        let burst = (0..1000).filter(|_| k.take(100)).count();
        assert_eq!(burst, KEPT_BODIES_BURST as usize);
        // Bodies are counted apart from bytes: with bytes to spare, 10 a second.
        k.bytes = KEPT_BODY_BYTES_BURST;
        k.last -= Duration::from_secs(2);
        let refilled = (0..1000).filter(|_| k.take(100)).count();
        assert_eq!(refilled, (2.0 * KEPT_BODIES_PER_SECOND) as usize);
        k.last -= Duration::from_secs(3600);
        assert_eq!(
            (0..1000).filter(|_| k.take(100)).count(),
            KEPT_BODIES_BURST as usize
        );
    }

    /// Large kept bodies are bounded in bytes too: 4 MiB at once, then 16 KiB a second,
    /// each charged its file and record besides its bytes.
    #[test]
    fn invalid_bodies_are_kept_within_a_byte_rate() {
        let mut k = KeptBodies::new();
        let largest = crate::events::quarantine::MAX_KEPT_BODY_BYTES;
        let cost = largest + KEPT_BODY_RECORD_BYTES + FILE_BUDGET_BYTES as usize;
        let burst = (0..1000).filter(|_| k.take(largest)).count();
        assert_eq!(burst, (KEPT_BODY_BYTES_BURST as usize) / cost);
        // Small bodies still pass once large ones have used the bytes up, each charged its
        // file: a tiny body costs the spool 4 KiB, not its length.
        k.bytes = 6000.0;
        assert!(k.take(500));
        assert!(!k.take(1));
        k.bytes = 0.0;
        k.last = Instant::now() - Duration::from_secs(10);
        let tiny = (0..10_000).filter(|_| k.take(1)).count();
        let per_body = 1 + KEPT_BODY_RECORD_BYTES + FILE_BUDGET_BYTES as usize;
        assert_eq!(
            tiny,
            (10.0 * KEPT_BODY_BYTES_PER_SECOND) as usize / per_body
        );
        // Element records draw on the same bytes.
        k.bytes = 1000.0;
        assert!(k.take_record(600));
        assert!(!k.take_record(600));
    }
}
