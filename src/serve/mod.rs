//! `ray-history-collector serve --storage URL [--listen ADDR]`: a bucket over HTTP, with the
//! routes and answer shapes of KubeRay's history server, so the clients written for it (its
//! cluster list, Ray's dashboard frontend) read a dead cluster from our bucket.
//!
//! # What it guarantees
//!
//! - **Read-only.** The bucket is opened by the reader's door ([`crate::reader::open_bucket`]:
//!   the same storage forms, credentials and `--storage-root-dir`, a `file://` bucket that is
//!   never created and whose links are never followed) and only listed and read. Nothing
//!   here writes an object.
//! - **One reader.** Clusters and sessions are the reader's discovery of the session markers
//!   ([`crate::reader::session_markers`], `latest` as `inspect --session latest` takes it);
//!   snapshot names are the contract's ([`crate::contract::endpoints`]). No second key rule.
//! - **Untrusted bucket, bounded answers.** A snapshot is read only up to
//!   [`replay::MAX_SNAPSHOT_BYTES`], at most [`MAX_CONCURRENT_READS`] at a time (the Train
//!   runs' snapshots apart, within their own [`train::TRAIN_SNAPSHOTS_KIB`], charged by the
//!   size listed, held until their answer is built, the room free to any it covers and the
//!   room given back to those waiting in turn), and held while it is sent within
//!   [`inflight::MAX_ANSWER_BYTES_IN_FLIGHT`], so the memory the bucket can make us hold is
//!   bounded whatever it holds. A snapshot that exists but
//!   cannot be read is a `502` with the header [`UNREADABLE_HEADER`] (never KubeRay's silent
//!   fallback to an empty answer).
//! - **Clients that do not read hold little, briefly.** An answer that makes no write
//!   progress for [`connection::WRITE_STALL_TIMEOUT`] is cut, a connection whose writes have
//!   stalled gives its place to a new one at [`MAX_CONNECTIONS`] ([`connection`]), and large
//!   answers share [`inflight::MAX_ANSWER_BYTES_IN_FLIGHT`] while they are sent ([`inflight`]);
//!   the job list, built once for the requests that want it and kept, takes its room there
//!   before it is built (`jobs.rs`). Names from the bucket or the request that appear in a
//!   message are escaped ([`crate::util::escape::escape_untrusted`]).
//! - **Cookies as KubeRay sets them.** `/enter_cluster/...` sets `cluster_name`,
//!   `cluster_namespace`, `session_name`, `owner_kind` and `owner_name` (`Max-Age=600`,
//!   `Path=/`); every route that reads a session takes them back ([`cookies`]), refuses
//!   values that are not one safe path segment (stricter than KubeRay's `fs.ValidPath`,
//!   which lets `a/b` through), and sets them again on its answer.
//! - **Dead sessions only.** KubeRay's server asks the Kubernetes API whether a cluster is
//!   live and proxies a live one to its dashboard; this server needs no Kubernetes API and
//!   serves every session from the bucket. It never sets `session_name=live` and answers a
//!   request that carries it with `400`.
//! - **Stops cleanly.** SIGTERM or Ctrl-C stops accepting, lets answers in flight finish (for
//!   at most [`SHUTDOWN_GRACE`]) and exits 0.
//!
//! # Routes (this slice)
//!
//! `/readz`, `/livez`, `/clusters`, `/enter_cluster/{namespace}/{kind}/{name}[/{session}]`,
//! `/timezone`, `/api/v0/cluster_metadata`, `/api/cluster_status` (rebuilt from the nodes'
//! `debug_state.txt` and the session's events, `cluster_status.rs`), and the catch-all
//! `/api/{*path}` that replays a `fetched_endpoints` snapshot by KubeRay's key of the
//! request URI (query included), with
//! KubeRay's empty answers when a known snapshot is missing (`replay.rs`); `/api/jobs/`
//! (`jobs.rs`) and `/api/v0/tasks` (`session.rs`) from the reader's fold of the session's
//! events;
//! `/api/grafana_health` and `/api/prometheus_health` answer KubeRay's `501`;
//! `/logical/actors[/{id}]` (`actors.rs`) and `/nodes?view=summary`, `/nodes/{id}`
//! (`nodes.rs`) in Ray's dashboard shapes; `/api/v0/logs` and `/api/v0/logs/{file|stream}`
//! (`logs.rs`), a node's log files and one log as Ray's state API serves them; `/events`
//! (`events.rs`), Ray's legacy events from the nodes' `logs/events/event_*.log`. With `--dashboard-dir`, any other path is a file
//! of Ray's built dashboard frontend (`frontend.rs`); without, or when no file answers, a
//! `404` in Ray's error shape. docs/inspect.md, "serve", says what is not there yet.

mod actors;
mod cache;
mod cluster_status;
mod clusters;
mod connection;
mod cookies;
mod events;
mod frontend;
mod index;
mod inflight;
mod jobs;
mod kept;
mod logs;
mod nodes;
mod replay;
mod session;
mod train;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::response::IntoResponse as _;
use axum::routing::get;
use axum::Router;
use tokio::sync::Semaphore;

use crate::cli::ServeArgs;
use crate::reader::{open_bucket, OpenBucket};
use crate::storage::StorageSpec;

/// Snapshots read at once. With [`replay::MAX_SNAPSHOT_BYTES`] each, this bounds what the
/// bucket's answers can make the server hold (4 × 64 MiB), whatever the number of clients.
pub const MAX_CONCURRENT_READS: usize = 4;

/// Folds of a session run at once to find one task's log (`/api/v0/logs/file?task_id=`): each
/// reads the session's events again and uses a core while it does.
pub const MAX_TASK_LOG_FOLDS: usize = 2;

/// How long answers in flight may take to finish after SIGTERM or Ctrl-C (Kubernetes gives a
/// pod 30 s between SIGTERM and SIGKILL by default).
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Set on an answer about a session when objects it needed could not all be read: how many.
pub const UNREADABLE_HEADER: &str = "x-rhc-unreadable-objects";

/// What every handler shares.
pub(crate) struct ServeState {
    pub(crate) bucket: Arc<OpenBucket>,
    /// Permits to hold a snapshot in memory ([`MAX_CONCURRENT_READS`]).
    pub(crate) reads: Semaphore,
    /// KiB of `/events` answers' held events ([`events::EVENTS_BUDGET`]).
    pub(crate) events_budget: Arc<Semaphore>,
    /// Permits to fold a session again for one task's log offsets
    /// ([`MAX_TASK_LOG_FOLDS`]).
    pub(crate) task_log_folds: Arc<Semaphore>,
    /// The loaded sessions' indexes.
    pub(crate) cache: Arc<cache::SessionCache>,
    /// Ray's dashboard frontend (`--dashboard-dir`), if given.
    pub(crate) frontend: Option<frontend::Frontend>,
    /// KiB of answers being sent ([`inflight::MAX_ANSWER_BYTES_IN_FLIGHT`]).
    pub(crate) answers: Arc<Semaphore>,
    /// The session markers, listed once for concurrent requests.
    pub(crate) markers: clusters::MarkerListing,
    /// The sessions' cluster statuses, rebuilt from their nodes' debug states.
    pub(crate) cluster_status: Arc<cluster_status::StatusCache>,
    /// The sessions' Train runs answers, built once for concurrent requests.
    pub(crate) train_answers: Arc<train::TrainAnswers>,
    /// The sessions' job lists (`/api/jobs/`), built once for concurrent requests.
    pub(crate) job_lists: Arc<jobs::JobLists>,
}

pub(crate) type Shared = Arc<ServeState>;

/// The routes, over `state`.
pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/readz", get(ok))
        .route("/livez", get(ok))
        .route("/clusters", get(clusters::list))
        .route("/clusters/", get(clusters::list))
        .route(
            "/enter_cluster/{namespace}/{kind}/{name}",
            get(clusters::enter_latest),
        )
        .route(
            "/enter_cluster/{namespace}/{kind}/{name}/{session}",
            get(clusters::enter_session),
        )
        .route("/events", get(events::events))
        .route("/timezone", get(replay::timezone))
        .route("/timezone/", get(replay::timezone))
        .route("/api/v0/cluster_metadata", get(replay::cluster_metadata))
        .route("/api/cluster_status", get(cluster_status::cluster_status))
        .route("/api/jobs/", get(jobs::jobs))
        .route("/api/jobs", get(jobs::jobs))
        .route("/api/jobs/{job_id}", get(jobs::job))
        .route("/api/v0/logs", get(logs::list))
        .route("/api/v0/logs/{media_type}", get(logs::file))
        .route("/api/v0/tasks", get(session::tasks))
        .route("/api/v0/tasks/summarize", get(session::summarize))
        .route("/api/v0/tasks/timeline", get(session::timeline))
        .route("/logical/actors", get(actors::list))
        .route("/logical/actors/", get(actors::list))
        .route("/logical/actors/{actor_id}", get(actors::one))
        .route("/nodes", get(nodes::list))
        .route("/nodes/", get(nodes::list))
        .route("/nodes/{node_id}", get(nodes::one))
        .route("/metrics", get(metrics))
        .route("/api/grafana_health", get(grafana_health))
        .route("/api/prometheus_health", get(prometheus_health))
        .route(train::TRAIN_V2_RUNS_URI, get(train::runs_v1))
        .route("/api/{*path}", get(replay::fetched_endpoint))
        .fallback(dashboard_file)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            inflight::bounded,
        ))
        .layer(axum::middleware::from_fn(log_request))
        .with_state(state)
}

/// Any path no route takes: a file of Ray's dashboard frontend with `--dashboard-dir` (its
/// page for a browser's navigation to a client route), else a `404` in Ray's error shape,
/// `{"result": false, "msg": ...}`, which the frontend shows as a failed request.
async fn dashboard_file(
    axum::extract::State(state): axum::extract::State<Shared>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let navigation = headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/html"));
    if let Some(f) = &state.frontend {
        if let Some(r) = f.answer(&method, uri.path(), navigation).await {
            return r;
        }
    }
    let body = serde_json::json!({
        "result": false,
        "msg": format!(
            "{}: not served by this history server",
            crate::util::escape::escape_untrusted(uri.path())
        ),
        "data": {},
    });
    (
        axum::http::StatusCode::NOT_FOUND,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// One debug line per request (`RUST_LOG=ray_history_collector::serve=debug`): which calls a
/// client makes and what they got, e.g. to see what a page of the dashboard asks for.
async fn log_request(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let method = request.method().clone();
    let target = request.uri().path_and_query().map_or_else(
        || request.uri().path().to_string(),
        |pq| pq.as_str().to_string(),
    );
    let response = next.run(request).await;
    tracing::debug!(
        method = %method,
        target = %crate::util::escape::escape_untrusted(&target),
        status = response.status().as_u16(),
        "answered"
    );
    response
}

/// `/readz` and `/livez`: KubeRay answers `ok` as text/plain.
async fn ok() -> ([(axum::http::HeaderName, &'static str); 1], &'static str) {
    ([(axum::http::header::CONTENT_TYPE, "text/plain")], "ok")
}

/// `/metrics`: the session cache's counters and the builds of kept answers, in Prometheus'
/// text format.
async fn metrics(
    axum::extract::State(state): axum::extract::State<Shared>,
) -> axum::response::Response {
    use std::sync::atomic::Ordering::Relaxed;
    let c = &state.cache;
    let (sessions, bytes) = c.held();
    let mut text = String::new();
    for (name, kind, help, value) in [
        (
            "rhc_serve_session_loads_total",
            "counter",
            "Session loads started.",
            c.stats.loads.load(Relaxed),
        ),
        (
            "rhc_serve_session_load_failures_total",
            "counter",
            "Session loads that failed.",
            c.stats.load_failures.load(Relaxed),
        ),
        (
            "rhc_serve_session_load_joins_total",
            "counter",
            "Requests that waited on a load another request started.",
            c.stats.joined_loads.load(Relaxed),
        ),
        (
            "rhc_serve_session_cache_hits_total",
            "counter",
            "Requests answered from a loaded session.",
            c.stats.hits.load(Relaxed),
        ),
        (
            "rhc_serve_session_evictions_total",
            "counter",
            "Sessions dropped to keep --cache-bytes.",
            c.stats.evictions.load(Relaxed),
        ),
        (
            "rhc_serve_session_checks_total",
            "counter",
            "Listings of a loaded session's objects, to tell whether it changed.",
            c.stats.checks.load(Relaxed),
        ),
        (
            "rhc_serve_session_reloads_total",
            "counter",
            "Loads of a session again: its objects changed, or reload=true.",
            c.stats.reloads.load(Relaxed),
        ),
        (
            "rhc_serve_marker_listings_total",
            "counter",
            "Listings of the session markers (one serves the requests of 5 s).",
            state.markers.listings.load(Relaxed),
        ),
        (
            "rhc_serve_cluster_status_builds_total",
            "counter",
            "Cluster statuses built (requests for one being built wait for it).",
            state.cluster_status.builds_started(),
        ),
        (
            "rhc_serve_train_answer_builds_total",
            "counter",
            "Train runs answers built (requests for one being built wait for it).",
            state.train_answers.builds_started(),
        ),
        (
            "rhc_serve_job_list_builds_total",
            "counter",
            "Job list (/api/jobs/) builds started (requests for one being built wait for it; one refused for want of room counts too).",
            state.job_lists.builds_started(),
        ),
        (
            "rhc_serve_sessions_cached",
            "gauge",
            "Sessions loaded and held.",
            sessions,
        ),
        (
            "rhc_serve_cache_bytes",
            "gauge",
            "Bytes the loaded sessions hold.",
            bytes,
        ),
    ] {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        ));
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
        .into_response()
}

/// `/api/grafana_health`: a dead session has no Grafana; KubeRay's `501` and words.
async fn grafana_health(entered: cookies::Entered) -> axum::response::Response {
    entered.refresh((
        axum::http::StatusCode::NOT_IMPLEMENTED,
        "Grafana health is not yet supported for historical sessions.",
    ))
}

/// `/api/prometheus_health`: likewise.
async fn prometheus_health(entered: cookies::Entered) -> axum::response::Response {
    entered.refresh((
        axum::http::StatusCode::NOT_IMPLEMENTED,
        "Prometheus health is not yet supported for historical sessions.",
    ))
}

/// Runs the server until SIGTERM or Ctrl-C.
pub async fn run(args: ServeArgs, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<()> {
    let spec = StorageSpec::parse(&args.storage)
        .and_then(|s| s.with_extra_root(&args.storage_root_dir))
        .with_context(|| format!("reading the storage location {:?}", args.storage))?;
    let frontend = args
        .dashboard_dir
        .as_deref()
        .map(frontend::Frontend::open)
        .transpose()?;
    let bucket = open_bucket(&spec, env)?;
    let state = Arc::new(ServeState {
        bucket: Arc::new(bucket),
        reads: Semaphore::new(MAX_CONCURRENT_READS),
        task_log_folds: Arc::new(Semaphore::new(MAX_TASK_LOG_FOLDS)),
        events_budget: events::budget(),
        cache: Arc::new(cache::SessionCache::new(args.cache_bytes)),
        frontend,
        answers: inflight::budget(),
        markers: clusters::MarkerListing::default(),
        cluster_status: cluster_status::status_cache(),
        train_answers: train::train_answers(),
        job_lists: jobs::job_lists(),
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let local: SocketAddr = listener.local_addr().context("reading the bound address")?;
    tracing::info!(address = %local, storage = %spec, "serving the bucket (read-only)");
    let cache = Arc::clone(&state.cache);
    serve_connections(listener, router(state), move || cache.stop_loads()).await;
    tracing::info!("stopped");
    Ok(())
}

/// Connections open at once; a connection past it is closed as soon as it is accepted, so
/// file descriptors and per-connection memory stay bounded whatever clients do.
pub const MAX_CONNECTIONS: usize = 512;

/// How long a connection may take to send a request's head (and an idle keep-alive
/// connection to start its next one): a client that never finishes its headers is closed
/// (review r36d: 1,100 such clients held every descriptor and answered nobody, for ever).
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a new connection at the cap waits for the place of one that was told to give way
/// ([`connection::Places::give_way`]); it closes at once, so this is a bound, not a delay.
const GIVE_WAY_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Accepts connections until SIGTERM or Ctrl-C, each served by hyper with a head timeout
/// ([`HEADER_READ_TIMEOUT`]) and a write-progress timeout
/// ([`connection::WRITE_STALL_TIMEOUT`]) within [`MAX_CONNECTIONS`] (at the cap, a connection
/// whose writes have stalled gives its place to the new one); then answers in flight may
/// finish for [`SHUTDOWN_GRACE`] (a fold of a huge session or a client that reads slowly must
/// not hold the shutdown past it), idle connections are closed at once. `on_stop` runs when
/// the signal comes (it stops the sessions' loads: a request waiting for one is answered
/// that the server is stopping, rather than held for the grace).
async fn serve_connections(listener: tokio::net::TcpListener, app: Router, on_stop: impl FnOnce()) {
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let places = Arc::new(connection::Places::new());
    let mut connections = tokio::task::JoinSet::new();
    let signal = shutdown_signal();
    tokio::pin!(signal);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut signal => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, say: wait a moment rather than spin.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) if places.give_way() => {
                match tokio::time::timeout(GIVE_WAY_WAIT, slots.clone().acquire_owned()).await {
                    Ok(Ok(slot)) => slot,
                    _ => continue,
                }
            }
            Err(_) => continue,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut stopping = stopping.clone();
        let tracked = places.track();
        let io = connection::Watched::new(stream, places.clone(), tracked.clone());
        connections.spawn(async move {
            let _slot = slot;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(io), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = tracked.cut() => {}
                _ = async { let _ = stopping.wait_for(|s| *s).await; } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    // No connection is taken any more: one made now is refused at once, so its client goes
    // elsewhere, rather than held in the backlog through the grace and then reset (review
    // r54v D1).
    drop(listener);
    let _ = stopping_tx.send(true);
    on_stop();
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "answers still in flight {SHUTDOWN_GRACE:?} after the signal: stopped without them"
        );
        connections.abort_all();
    }
}

/// Resolves on SIGTERM or Ctrl-C. If a handler cannot be installed, that signal is not
/// waited for (the other still is); with neither, the process stops only by being killed.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!("cannot wait for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot wait for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down: answers in flight finish");
}
