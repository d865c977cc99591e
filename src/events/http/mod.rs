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
//!
//! Layout, in the order a request meets it: the accept loop and a connection's service here;
//! [`connections`] (the cap, which connection gives way); [`routes`] (which answer a request
//! gets, per listener); [`ingest`] (`POST /v1/events` to its answer) with [`body`] (reading
//! a body within the body budget) and [`batch`] (its events as a batch for the spool);
//! [`state`] (what every request shares) and [`answers`] (the answers' forms).

mod answers;
mod batch;
mod body;
mod connections;
mod ingest;
mod routes;
mod state;
mod token;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::metrics as m;
use answers::{closing, retry_later};
pub use batch::{MAX_QUARANTINED_BYTES_PER_BODY, MAX_QUARANTINED_PER_BODY};
pub use body::DEFAULT_MAX_GZIP_RATIO;
use connections::Connections;
use routes::{events_post, handle, is_probe, read_only, Poster};
pub use state::{EventKeys, IngestConfig, IngestState};
pub use token::{IngestToken, MAX_TOKEN_LEN, MIN_TOKEN_LEN};

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
            let poster = events_post(&req, state.ingest_token.as_ref());
            // A refused post is answered from its head: its body is never read.
            let events = matches!(poster, Some(Poster::Anyone | Poster::Ray));
            slot.request_started(events);
            if poster == Some(Poster::Ray) {
                // From its first head with the token on, the connection is Ray's: it
                // outranks every other at the cap and its bodies take Ray's decoding turn.
                slot.trust();
            }
            // The body reader reports its progress to the connection's slot.
            req.extensions_mut().insert(slot.clone());
            let resp = if slot.reserved && poster.is_none() && !is_probe(&req) {
                m::http_request("other", 503);
                closing(retry_later(
                    "the collector is at its connection limit; only /healthz, /readyz and POST /v1/events are served on a new connection now",
                    1,
                ))
            } else {
                handle(req, &state, poster).await
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
