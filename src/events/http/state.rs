//! What every request of a listener shares ([`IngestState`]): the settings of the HTTP side
//! ([`IngestConfig`], [`EventKeys`]), the spool, the body budget, the gates the shutdown
//! closes ([`Gate`]: a request is counted before it looks whether the gate is closed, so
//! none stores its events after the final seal), and the token buckets that bound what
//! invalid bodies and unusable elements keep in quarantine ([`KeptBodies`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::Notify;

use super::body::{self, BodyBudget};
use super::token::IngestToken;
use crate::events::spool::{Spool, FILE_BUDGET_BYTES};
use crate::node::node_id::EventNodeHint;

/// Invalid bodies kept in quarantine: a burst of this many, then [`KEPT_BODIES_PER_SECOND`].
/// Each kept body costs a file, its syncs and an upload; a storm of distinct bad bodies
/// would otherwise slow the spool for the good ones and outlast the shutdown deadline.
const KEPT_BODIES_BURST: f64 = 100.0;
/// Sustained rate of invalid bodies kept in quarantine; the rest are answered 400 and counted.
pub(super) const KEPT_BODIES_PER_SECOND: f64 = 10.0;
/// Bytes of the spool's budget that quarantine may take for what the HTTP side keeps
/// (invalid bodies, each at most [`MAX_KEPT_BODY_BYTES`](crate::events::quarantine::MAX_KEPT_BODY_BYTES) plus its file's
/// [`FILE_BUDGET_BYTES`] and its record; and the records of unusable elements): a burst of
/// this many, then [`KEPT_BODY_BYTES_PER_SECOND`]. The spool is the outage buffer of real
/// events: garbage may take 4 MiB of it at once and then about 56 MiB an hour, whatever is
/// sent and however it is cut (tiny bodies, large bad elements).
const KEPT_BODY_BYTES_BURST: f64 = (4 << 20) as f64;
/// Sustained rate of quarantine bytes kept: one body of the largest kept size every four
/// seconds, or many small ones.
pub(super) const KEPT_BODY_BYTES_PER_SECOND: f64 = (16 << 10) as f64;
/// Most bytes of an invalid body's record (its reason, the parser's message, sizes).
const KEPT_BODY_RECORD_BYTES: usize = 1024;

/// Token buckets, one of bodies and one of bytes, deciding which invalid bodies and which
/// unusable elements are kept.
pub(super) struct KeptBodies {
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
    pub(super) fn take(&mut self, bytes: usize) -> bool {
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
    pub(super) fn take_record(&mut self, bytes: usize) -> bool {
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
    /// `--ingest-token-file` / `RHC_INGEST_TOKEN`: with one, only `POST /v1/events/<token>`
    /// is Ray's, and every other events post is refused ([`super::token`]).
    pub ingest_token: Option<IngestToken>,
}

/// State shared by all requests.
pub struct IngestState {
    pub(super) spool: Spool,
    pub(super) max_body_bytes: u64,
    pub(super) high_watermark: u64,
    pub(super) configured_node: Option<String>,
    pub(super) learned_node: EventNodeHint,
    pub(super) events_enabled: bool,
    pub(super) event_keys: EventKeys,
    pub(super) max_gzip_ratio: u64,
    pub(super) ingest_token: Option<IngestToken>,
    /// Event requests in flight (bodies still arriving included); closed at shutdown, when
    /// new requests get 503.
    pub(super) requests: Gate,
    /// Requests whose batch is built and is being written to the spool (events, or an
    /// invalid body's quarantine record); closed by the shutdown once the requests in flight
    /// have had their grace: a batch built after this is answered 503, not stored, so the
    /// seal that follows is final and waits for no decoding or parsing.
    pub(super) storing: Gate,
    pub(super) metrics: PrometheusHandle,
    pub(super) kept_bodies: Mutex<KeptBodies>,
    pub(super) body_budget: BodyBudget,
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
            ingest_token: cfg.ingest_token,
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
pub(super) struct Gate {
    closed: AtomicBool,
    inside: AtomicUsize,
    empty: Notify,
}

impl Gate {
    /// `None` when the gate is closed (nothing is counted then).
    pub(super) fn enter(&self) -> Option<GateGuard<'_>> {
        self.inside.fetch_add(1, Ordering::SeqCst);
        let guard = GateGuard(self);
        (!self.is_closed()).then_some(guard)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    pub(super) fn is_closed(&self) -> bool {
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
pub(super) struct GateGuard<'a>(&'a Gate);

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        if self.0.inside.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.empty.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
        // Ten seconds of refill, and whatever the clock moved on since `last` was set (a
        // loaded machine took one body more: CI of stop 49).
        let ten_seconds = (10.0 * KEPT_BODY_BYTES_PER_SECOND) as usize / per_body;
        assert!(
            (ten_seconds..=ten_seconds + 1).contains(&tiny),
            "{tiny} tiny bodies after 10 s of refill, {ten_seconds} expected"
        );
        // Element records draw on the same bytes.
        k.bytes = 1000.0;
        assert!(k.take_record(600));
        assert!(!k.take_record(600));
    }
}
