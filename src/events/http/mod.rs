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
use crate::events::quarantine::QuarantineReason;
use crate::events::route::{route_with, IdCache, NodeName};
use crate::events::spool::{
    AppendBatch, EventSpan, PartitionBatch, QuarantinedEvent, Spool, MAX_SPAN_BODY,
};
use crate::metrics as m;
use crate::node::node_id::EventNodeHint;
use body::{BodyBudget, BodyProblem};
use connections::Connections;

/// How long a client may take to send request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Unusable elements of one body kept in quarantine; beyond it they are counted, not kept:
/// a body of millions of bad elements (`[0,0,0,…]`) must cost neither memory nor disk in
/// proportion to its element count, and a thousand records say what is wrong with it.
pub const MAX_QUARANTINED_PER_BODY: usize = 1000;
/// Invalid bodies kept in quarantine: a burst of this many, then [`KEPT_BODIES_PER_SECOND`].
/// Each kept body costs a file, its syncs and an upload; a storm of distinct bad bodies
/// would otherwise slow the spool for the good ones and outlast the shutdown deadline.
const KEPT_BODIES_BURST: f64 = 100.0;
/// Sustained rate of invalid bodies kept in quarantine; the rest are answered 400 and counted.
const KEPT_BODIES_PER_SECOND: f64 = 10.0;

/// A token bucket deciding which invalid bodies are kept.
struct KeptBodies {
    tokens: f64,
    last: Instant,
}

impl KeptBodies {
    fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * KEPT_BODIES_PER_SECOND;
        self.tokens = (self.tokens + refill).min(KEPT_BODIES_BURST);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
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
    shutting_down: AtomicBool,
    inflight: AtomicUsize,
    idle: Notify,
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
        Arc::new(IngestState {
            spool,
            max_body_bytes: cfg.max_body_bytes,
            high_watermark: cfg.high_watermark,
            configured_node: cfg.configured_node,
            learned_node,
            events_enabled: cfg.events_enabled,
            event_keys: cfg.event_keys,
            shutting_down: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
            idle: Notify::new(),
            metrics,
            kept_bodies: Mutex::new(KeptBodies {
                tokens: KEPT_BODIES_BURST,
                last: Instant::now(),
            }),
            body_budget: BodyBudget::new(cfg.max_body_bytes),
        })
    }

    /// From now on, event requests get 503 "shutting down".
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Waits until no event request is being stored.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.inflight.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

struct InflightGuard<'a>(&'a IngestState);

impl<'a> InflightGuard<'a> {
    fn new(st: &'a IngestState) -> Self {
        st.inflight.fetch_add(1, Ordering::SeqCst);
        InflightGuard(st)
    }
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        if self.0.inflight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
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
/// least useful open one, or one of the reserved places, or is closed at once (see
/// [`connections`]). Each listener has its own places: scrapers on the read-only listener
/// never take one from Ray.
pub async fn serve(listener: TcpListener, state: Arc<IngestState>, routes: Routes) {
    let connections = Connections::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: wait a little instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(admitted) = connections.admit() else {
            m::connection_refused();
            tracing::debug!(%peer, "closed a new connection at once: every place, reserved one and leaving one is taken");
            continue;
        };
        if let Some(why) = admitted.evicted {
            m::connection_evicted(why.code());
        }
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(
            stream,
            peer,
            admitted,
            state.clone(),
            routes,
        ));
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
    let slot = admitted.slot.clone();
    let reserved = slot.reserved;
    let svc = service_fn(move |mut req: Request<Incoming>| {
        let slot = slot.clone();
        let state = state.clone();
        async move {
            if routes == Routes::ReadOnly {
                slot.request_started(false);
                let resp = read_only(&req, &state);
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
        .serve_connection(TokioIo::new(stream), svc);
    let mut conn = std::pin::pin!(conn);
    let leave_by = tokio::select! {
        result = &mut conn => {
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
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
    if let Ok(Err(e)) = tokio::time::timeout_at(leave_by, conn).await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
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
    resp
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
    resp
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
        bytes: stats.bytes.load(Ordering::Relaxed),
        files: stats.files.load(Ordering::Relaxed),
        oldest_age_seconds: stats.oldest_pending_age_seconds(),
    }
}

fn readiness(st: &IngestState) -> Resp {
    if st.shutting_down.load(Ordering::SeqCst) {
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
                "spool over its high watermark: {used} of {} bytes\n",
                st.high_watermark
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
    if st.shutting_down.load(Ordering::SeqCst) {
        return Err(retry_later("shutting down", 5));
    }
    let used = st.spool.stats().budget_used();
    if used >= st.high_watermark {
        m::backpressure();
        return Err(retry_later(
            format!(
                "spool is over its high watermark ({used} of {} bytes used): uploads are behind; retry later",
                st.high_watermark
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
    Ok(read_and_store(req, st, declared, layers).await)
}

/// Reads the body and stores its events.
async fn read_and_store(
    req: Request<Incoming>,
    st: &IngestState,
    declared: Option<u64>,
    layers: usize,
) -> Resp {
    let _guard = InflightGuard::new(st);
    let slot = req.extensions().get::<Arc<connections::Slot>>().cloned();
    // A reserved place serves whoever could not get a regular one: its body must be as
    // quick as a real client's, or the place is held for nothing.
    let timeout = match &slot {
        Some(s) if s.reserved => connections::RESERVED_BODY_TIMEOUT,
        _ => body::BODY_TIMEOUT,
    };
    let progress = |n: usize| {
        if let Some(s) = &slot {
            s.body_received(n);
        }
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
        },
        &progress,
    )
    .await;
    if let Some(s) = &slot {
        s.body_complete();
    }
    let (body, mut room) = match read {
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
        Err(BodyProblem::TimedOut) => {
            return closing(error_response(
                StatusCode::REQUEST_TIMEOUT,
                format!("request body not received within {} s", timeout.as_secs()),
            ))
        }
        Err(BodyProblem::Read(e)) => {
            return error_response(StatusCode::BAD_REQUEST, format!("reading the body: {e}"))
        }
        Err(BodyProblem::BadGzip(raw, e, _room)) => {
            let msg = format!("body is not valid gzip: {e}");
            return invalid_body(st, raw, msg).await;
        }
    };
    m::ingest_bytes(body.len() as u64);
    let batch = loop {
        let short = match build_batch(st, &body, &mut room) {
            Ok(Ok(b)) => break b,
            Ok(Err(short)) => short,
            Err(e) => return invalid_body(st, body, e.to_string()).await,
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

async fn invalid_body(st: &IngestState, body: Bytes, message: String) -> Resp {
    m::invalid_body();
    let keep = st.kept_bodies.lock().map(|mut k| k.take()).unwrap_or(false);
    if keep {
        tracing::warn!(error = %message, bytes = body.len(), "rejected a body that is not a JSON array of events; keeping it in quarantine");
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
        tracing::debug!(error = %message, bytes = body.len(), "rejected a body that is not a JSON array of events; not kept (more than {KEPT_BODIES_PER_SECOND}/s)");
    }
    error_response(StatusCode::BAD_REQUEST, message)
}

/// Unusable events of one body kept in quarantine: at most [`MAX_QUARANTINED_PER_BODY`], the
/// rest counted (`quarantine_dropped` in the answer, `rhc_events_quarantine_dropped_total`).
#[derive(Default)]
struct Quarantine {
    list: Vec<QuarantinedEvent>,
    dropped: u64,
    /// Of those, by reason (counted into the metric once per body, not per element).
    dropped_by_reason: Vec<(QuarantineReason, u64)>,
}

impl Quarantine {
    fn push(&mut self, reason: QuarantineReason, range: &std::ops::Range<usize>) {
        if self.list.len() < MAX_QUARANTINED_PER_BODY {
            self.list.push(QuarantinedEvent {
                reason,
                start: range.start,
                end: range.end,
                source: None,
            });
            return;
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
/// spans pointing there. That buffer ([`conversion_room`]) is charged to the body's `room`
/// before it is allocated, so the body and its camelCase form stay within the body budget
/// (`Ok(Err(_))` when the room is not free now, or never can be). One that cannot be
/// converted is quarantined.
fn build_batch(
    st: &IngestState,
    body: &Bytes,
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
    let mut kept = Quarantine::default();
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
                let need = (body.len() as u64).saturating_add(extra as u64);
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
            dropped = kept.dropped,
            "more unusable events in one body than are kept; the rest are counted"
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
        let mut k = KeptBodies {
            tokens: KEPT_BODIES_BURST,
            last: Instant::now(),
        };
        let burst = (0..1000).filter(|_| k.take()).count();
        assert_eq!(burst, KEPT_BODIES_BURST as usize);
        k.last -= Duration::from_secs(2);
        let refilled = (0..1000).filter(|_| k.take()).count();
        assert_eq!(refilled, (2.0 * KEPT_BODIES_PER_SECOND) as usize);
        k.last -= Duration::from_secs(3600);
        assert_eq!(
            (0..1000).filter(|_| k.take()).count(),
            KEPT_BODIES_BURST as usize
        );
    }
}
