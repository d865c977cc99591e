//! Starts the collector from its [`Settings`] and shuts it down in one documented order.
//!
//! Everything here happens after the settings were checked: opening the store and the spool,
//! starting the uploader, binding the listeners (events, and the read-only one of
//! `--metrics-listen`), and spawning the session watcher, the export
//! tailer, the log shipper and (head only) the dashboard poller.
//!
//! # Shutdown order (SIGTERM or SIGINT)
//!
//! All within `--shutdown-timeout`, most valuable first:
//!
//! 1. New event requests get 503; requests already being stored finish, and bodies still
//!    arriving get a grace (a fifth of the deadline, at most 5 s), after which a body that
//!    completes is answered 503 and not stored.
//! 2. The export tailer makes its last pass, so lines Ray wrote just before the end are kept;
//!    its reading ends 5 s after it is told (with step 1), whatever pass is running.
//! 3. Publication rounds stop; the spool seals every open segment and the uploader drains its
//!    queue (a sealed segment's object gets its last bytes): events first. From the signal
//!    on, a write the store refuses with its condition (400 / 403) is tried again with it
//!    after 1 s and sent without it when refused a third time, not after 30 s of refusals,
//!    for a kind of condition not landed in this run (`storage::conditions::shutting_down`).
//! 4. The log shipper's final flush (every file, byte for byte) and the head's last dashboard
//!    poll run together in the time left.
//! 5. The HTTP server and the spool's writer stop. What could not be uploaded stays in the
//!    spool and is named in the log; the next start uploads it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusHandle;
use object_store::ObjectStore;
use tokio::sync::mpsc;

use crate::cli::Role;
use crate::events::spool::{Spool, SpoolConfig};
use crate::events::upload::{Compression, Uploader, UploaderConfig};
use crate::settings::Settings;
use crate::{dashboard, events, logs, node};

/// How the collector ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Everything accepted was uploaded.
    Clean,
    /// The shutdown deadline passed with files left in the spool for the next start, files
    /// were left that the spool could not place, or log files were not uploaded at the
    /// final flush (each named in the log), or export event lines kept for a file Ray may
    /// have deleted were not stored (counted in the log).
    LeftOnDisk,
}

/// Runs the collector until SIGTERM or SIGINT, then seals and uploads within the deadline.
pub async fn run(settings: Settings, metrics: PrometheusHandle) -> anyhow::Result<Exit> {
    // Installed first: a SIGTERM that arrives while we start must still mean "flush and exit".
    let signals = Signals::install()?;
    crate::metrics::spool_budget(settings.max_spool_bytes);
    crate::metrics::register_quarantine_reasons(
        events::quarantine::QuarantineReason::ALL.map(|r| r.code()),
    );
    let store: Arc<dyn ObjectStore> = settings
        .store
        .clone()
        .open()
        .with_context(|| format!("opening storage {}", settings.storage))?;
    // Storage records no metric itself: the appender (one per store, shared by the event
    // and log paths) reports the incomplete uploads it aborts to the metrics here.
    if let Some(appender) = settings
        .store
        .appender()
        .with_context(|| format!("opening storage {}", settings.storage))?
    {
        appender.report_aborts_to(crate::metrics::append_upload_aborted);
        // GCS: whether its JSON API is usable, asked as early as can be (nothing waits for
        // it: `storage::append::compose`).
        appender.start_probe(&settings.layout.history_prefix());
        if std::env::var(crate::storage::TEST_GCS_PROBE_FIRST).as_deref() == Ok("1") {
            appender
                .probe_ended(std::time::Duration::from_secs(10))
                .await;
        }
    }
    if let Some(why) = settings.store.appends_off_reason() {
        tracing::info!(
            why,
            "event objects are written whole at each publication on this store, not grown by appends"
        );
    }
    let (sealed_tx, sealed_rx) = mpsc::unbounded_channel();
    let spool_cfg = SpoolConfig {
        dir: settings.spool_dir.clone(),
        rotation_interval: settings.rotation_interval,
        max_segment_bytes: settings.max_segment_bytes,
        max_open_files: settings.max_open_segments,
        dedup_window: settings.dedup_window,
        max_bytes: settings.max_spool_bytes,
        copies: settings.compression == Compression::Gzip,
        write_session_markers: settings.role == Role::Head,
        quarantine_node: settings.quarantine_node.clone(),
    };
    let (spool, recovered) = Spool::open(spool_cfg, sealed_tx)
        .with_context(|| format!("opening the spool in {}", settings.spool_dir.display()))?;
    if recovered.files > 0 || recovered.torn > 0 {
        tracing::info!(
            files = recovered.files,
            bytes = recovered.bytes,
            torn_lines = recovered.torn,
            dedup_ids = recovered.dedup_ids,
            journal_ids = recovered.journal_ids,
            spool_newer_ids = recovered.spool_newer_ids,
            "found files of an earlier run in the spool; uploading them"
        );
    } else if recovered.dedup_ids > 0 {
        tracing::info!(
            dedup_ids = recovered.dedup_ids,
            "reloaded the deduplication window from the ids journal"
        );
    }
    for p in &recovered.unknown {
        tracing::error!(path = %p.display(), "unrecognised file in the spool: not uploaded, left alone for an operator");
    }
    let upload_cfg = Arc::new(UploaderConfig {
        concurrency: settings.upload_concurrency,
        compression: settings.compression,
        gzip_level: settings.gzip_level,
        part_size: settings.upload_part_bytes,
        layout: settings.layout.clone(),
    });
    // The open segments' objects grow in place within the upload window (issue 23).
    let publisher = Arc::new(events::publish::Publisher::new(
        upload_cfg.clone(),
        settings.spool_dir.clone(),
        store.clone(),
        settings
            .store
            .appender()
            .with_context(|| format!("opening storage {}", settings.storage))?,
        spool.stats().clone(),
    ));
    // GCS: the part objects a killed run of this host left (`storage::append::compose`).
    if let Some(app) = settings
        .store
        .appender()
        .with_context(|| format!("opening storage {}", settings.storage))?
    {
        let prefixes = [
            settings.layout.history_prefix(),
            settings.layout.quarantine_prefix(),
        ];
        tokio::spawn(async move { app.remove_parts(&prefixes).await });
    }
    let (stop_publish, stop_publish_rx) = tokio::sync::watch::channel(false);
    let publish_task = tokio::spawn(
        publisher
            .clone()
            .run(settings.upload_window, stop_publish_rx),
    );
    let uploader = Uploader::start(
        upload_cfg,
        store.clone(),
        spool.stats().clone(),
        sealed_rx,
        Some(publisher.clone()),
    );
    let listener = events::http::bind(settings.listen).await?;
    let read_only_listener = match settings.metrics_listen {
        Some(addr) => Some(events::http::bind_read_only(addr).await?),
        None => None,
    };
    let high_watermark = events::spool::high_watermark(settings.max_spool_bytes);
    let event_node: node::node_id::EventNodeHint = Default::default();
    let state = events::http::IngestState::new(
        events::http::IngestConfig {
            max_body_bytes: settings.max_body_bytes,
            high_watermark,
            configured_node: settings.node_id.clone(),
            events_enabled: settings.enable_event_collector,
            event_keys: settings.event_keys,
            max_gzip_ratio: settings.max_gzip_ratio,
            ingest_token: settings.ingest_token.clone(),
        },
        spool.clone(),
        event_node.clone(),
        metrics,
    );
    let server = tokio::spawn(events::http::serve(
        listener,
        state.clone(),
        events::http::Routes::All,
    ));
    let read_only_server = read_only_listener.map(|l| {
        tokio::spawn(events::http::serve(
            l,
            state.clone(),
            events::http::Routes::ReadOnly,
        ))
    });

    let (stop_logs, stop_logs_rx) = tokio::sync::watch::channel(false);
    let sessions =
        node::session::watch_sessions(settings.ray_tmp_dir.clone(), Duration::from_secs(1));
    let (stop_export, stop_export_rx) = tokio::sync::watch::channel(false);
    let node_ids = node::node_id::NodeIdResolver::new(
        settings.node_id.clone(),
        settings.ray_tmp_dir.clone(),
        event_node.clone(),
    );
    let export_task = if settings.enable_export_events {
        let tailer = events::export_tailer::ExportTailer::new(
            events::export_tailer::ExportConfig {
                ray_tmp: settings.ray_tmp_dir.clone(),
                state_dir: settings.spool_dir.clone(),
                poll_interval: Duration::from_secs(1),
                max_spool_bytes: settings.max_spool_bytes,
                final_pass: events::export_tailer::FINAL_PASS_LIMIT
                    .min(settings.shutdown_timeout / 2),
            },
            spool.clone(),
            node_ids.clone(),
        );
        Some(tokio::spawn(tailer.run(sessions.clone(), stop_export_rx)))
    } else {
        None
    };
    let log_task = if settings.enable_log_collector {
        // Log appends fall back on the whole upload: a copy left unanswered is cut early
        // (the event publisher's copies are not, see `storage::s3`).
        let appender = settings
            .store
            .appender()
            .with_context(|| format!("opening storage {}", settings.storage))?
            .filter(|a| a.appends_logs())
            .map(|a| a.with_answer_timeout(crate::storage::s3::ANSWER_TIMEOUT));
        // File bytes go on a client whose request timeout lets the largest part the lane
        // sends go at the floor rate of a slow uplink (`storage::log_request_timeout`).
        let largest_body = settings
            .upload_part_bytes
            .max(crate::storage::append::TAIL_PART) as u64;
        let (body_store, appender) = match settings
            .store
            .for_log_bodies(largest_body, appender.clone())
            .with_context(|| format!("opening storage {} for logs", settings.storage))?
        {
            Some((s, a)) => (Some(s), a),
            None => (None, appender),
        };
        let shipper = logs::LogShipper::new(
            logs::LogConfig {
                ray_tmp: settings.ray_tmp_dir.clone(),
                state_dir: settings.spool_dir.clone(),
                upload_interval: settings.log_upload_interval,
                part_size: settings.upload_part_bytes,
                layout: settings.layout.clone(),
                max_bytes_per_second: settings.log_upload_max_bytes_per_second,
                appender,
                body_store,
                appends: settings.log_appends,
                bucket: settings.store.identity().to_string(),
                max_key_bytes: settings.store.max_key_bytes(),
                max_name_bytes: settings.store.max_name_bytes(),
            },
            store.clone(),
            spool.clone(),
            node_ids,
        )?;
        let shipper = match &settings.pod_ip {
            Some(ip) => shipper.with_remote_lookup(dashboard_node_lookup(&settings.dashboard, ip)),
            None => shipper,
        };
        Some(tokio::spawn(
            shipper.run(sessions.clone(), stop_logs_rx.clone()),
        ))
    } else {
        // No log lane: the start-up cleanup of incomplete uploads (S3) still runs, once the
        // node is known.
        if let Some(app) = settings
            .store
            .appender()
            .with_context(|| format!("opening storage {}", settings.storage))?
        {
            tokio::spawn(clean_up_stale_uploads(
                app,
                settings.layout.history_prefix(),
                node_ids,
                sessions.clone(),
            ));
        }
        None
    };
    // Head only: snapshots of the dashboard's endpoints, like KubeRay. Independent of the log
    // shipper: `--enable-log-collector false` does not turn it off.
    let poller_task = if settings.role == Role::Head {
        let mut poller = dashboard::DashboardPoller::new(
            settings.dashboard.clone(),
            store.clone(),
            settings.layout.clone(),
        )
        .context("starting the dashboard poller")?
        .with_record_in(&settings.spool_dir, &settings.storage.to_string());
        let (sessions, stop) = (sessions.clone(), stop_logs_rx.clone());
        Some(tokio::spawn(async move {
            poller.run(sessions, stop).await;
            poller
        }))
    } else {
        None
    };
    tracing::info!(
        listen = %settings.listen,
        metrics_listen = %settings.metrics_listen.map_or_else(|| "none (on --listen)".to_string(), |a| a.to_string()),
        storage = %settings.storage,
        prefix = %settings.layout.history_prefix(),
        spool = %settings.spool_dir.display(),
        role = ?settings.role,
        compression = %match settings.compression {
            Compression::Gzip => format!(
                "gzip level {} by {}",
                settings.gzip_level,
                crate::storage::gzip::compressor(settings.gzip_level)
            ),
            Compression::None => "none".to_string(),
        },
        "collector ready"
    );

    let signal = signals.wait().await;
    let started = Instant::now();
    let deadline = started + settings.shutdown_timeout;
    tracing::info!(
        signal,
        timeout_s = settings.shutdown_timeout.as_secs_f64(),
        "shutting down: sealing and uploading everything"
    );
    state.begin_shutdown();
    // A store refusing conditional writes (400 / 403) would have the seal's writes wait
    // `REFUSAL_SPAN` (30 s) past the deadline: from now on such a refusal has the write tried
    // again with its condition at once (after 1 s) and sent without it when refused a third
    // time, for a kind of condition not landed in this run.
    crate::storage::conditions::shutting_down();
    // The export tailer makes a last pass so lines written just before the end are kept; its
    // reading ends a fixed time after it is told, so it is told now.
    let _ = stop_export.send(true);
    // Requests in flight (bodies arriving, or being decoded and parsed) get a grace (a fifth
    // of the deadline, at most BODY_GRACE); then a batch built after it is answered 503 and
    // only the batches already being written to the spool are waited for, so neither a slow
    // client nor a costly body can spend the deadline the seal needs.
    let grace = (settings.shutdown_timeout / 5).min(BODY_GRACE);
    if tokio::time::timeout(grace, state.wait_idle())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_ms = grace.as_millis() as u64,
            "requests still in flight after the grace (bodies arriving or being built) are not stored: answered 503, or their connection closed at the exit (review r41v); Ray sends them again"
        );
    }
    let _ = tokio::time::timeout_at(deadline.into(), state.stop_storing()).await;
    // Lines of a file that may be gone, unstored when reading ended (logged by the tailer).
    let mut export_unstored = 0;
    if let Some(task) = export_task {
        if let Ok(Ok(end)) = tokio::time::timeout_at(deadline.into(), task).await {
            export_unstored = end.kept_unstored;
        }
    }
    // No new round: sealing publishes what is left of each open segment (a round in flight
    // finishes; a seal waits for its segment's publication).
    let _ = stop_publish.send(true);
    let sealed = tokio::time::timeout_at(deadline.into(), spool.seal_all()).await;
    let drained = match sealed {
        Ok(Ok(())) => tokio::time::timeout_at(deadline.into(), uploader.drain())
            .await
            .is_ok(),
        _ => false,
    };
    // The seals' layout switches may have left keys to watch unsaved (saved once a second).
    publisher.flush_late_deletes();
    // Events first; then the logs, in the time that is left.
    let _ = stop_logs.send(true);
    let active = sessions.borrow().clone();
    let final_logs = async {
        let Some(task) = log_task else {
            return Vec::new();
        };
        // The lane stops at once (every wait of a round or a capture is cut by shutdown);
        // should it not come back, its files are not known to be in the bucket: named, so
        // the exit is not "everything uploaded" (review r42e E4).
        match tokio::time::timeout_at(deadline.into(), task).await {
            Ok(Ok(mut shipper)) => shipper.final_flush(active.clone(), deadline).await,
            Ok(Err(e)) => vec![(
                settings.ray_tmp_dir.clone(),
                format!("the log lane ended without its final flush: {e}"),
            )],
            Err(_) => vec![(
                settings.ray_tmp_dir.clone(),
                "the log lane did not stop by the shutdown deadline; no final flush".to_string(),
            )],
        }
    };
    let final_poll = async {
        if let (Some(task), Some(s)) = (poller_task, active.clone()) {
            if let Ok(Ok(mut poller)) = tokio::time::timeout_at(deadline.into(), task).await {
                if let Ok(r) = tokio::time::timeout_at(
                    deadline.into(),
                    poller.poll_final(&s.name, deadline.into()),
                )
                .await
                {
                    tracing::info!(
                        uploaded = r.uploaded,
                        failed = r.failed.len(),
                        "final dashboard poll done"
                    );
                }
            }
        }
    };
    let (logs_left, ()) = tokio::join!(final_logs, final_poll);
    for (path, why) in &logs_left {
        tracing::error!(path = %path.display(), %why, "log file not uploaded at the final flush");
    }
    server.abort();
    if let Some(s) = read_only_server {
        s.abort();
    }
    // Past the deadline every step below shares one bounded grace, whatever the spool holds
    // (issue 35: with 50,000 partitions the writer's stop and the report of every leftover
    // took 17 s more, past a kubelet's grace period). What a step leaves undone the next
    // start redoes: it seals and queues whatever it finds in the spool.
    let grace_end = tokio::time::Instant::from(Instant::now().max(deadline) + STOP_GRACE);
    // Nothing may delete spool files while what is left is listed: the uploads still in
    // flight at the deadline are cancelled and joined (one that finished has deleted its
    // file), and so is the publication round (issue 23: 161 files uploaded during the
    // listing were named "left on disk").
    publish_task.abort();
    let _ = tokio::time::timeout_at(grace_end, publish_task).await;
    if tokio::time::timeout_at(grace_end, uploader.stop())
        .await
        .is_err()
    {
        tracing::warn!("uploads did not stop in time; the list of files left may name some that are being uploaded");
    }
    // The writer stops at its next segment: seals it has not done yet are left to the next
    // start (a crash-safe state, as after kill -9).
    let spool2 = spool.clone();
    let stopped = tokio::time::timeout_at(
        grace_end,
        tokio::task::spawn_blocking(move || spool2.stop()),
    )
    .await;
    if stopped.is_err() {
        tracing::warn!("the spool's writer did not stop in time; what it had not sealed is sealed by the next start");
    }
    // Whatever is still in the spool is named, even after a drain: a file the spool could
    // not place (an unrecognised name) was never queued, and "everything uploaded" would be
    // false. The listing has its own bound; the bytes are the spool's own count.
    let dir = settings.spool_dir.clone();
    let until = Instant::now() + LIST_GRACE;
    let left = tokio::task::spawn_blocking(move || {
        events::spool::leftover_summary(&dir, LEFT_NAMED, until)
    })
    .await
    .unwrap_or_default();
    let (spool_files, spool_bytes) = (spool.stats().files(), spool.stats().stored_bytes());
    if drained && left.complete && left.files == 0 {
        if logs_left.is_empty() && export_unstored == 0 {
            tracing::info!(
                took_ms = started.elapsed().as_millis() as u64,
                "everything uploaded; exiting"
            );
            return Ok(Exit::Clean);
        }
        if !logs_left.is_empty() {
            tracing::error!(
                files = logs_left.len(),
                "every event was uploaded, but these log files were not (named above); the next \
                 start uploads them if their session is still there"
            );
        }
        if export_unstored > 0 {
            tracing::error!(
                lines = export_unstored,
                "every event in the spool was uploaded, but export event lines kept for a \
                 rotated file were never stored (logged above): lost if Ray deleted that file"
            );
        }
        return Ok(Exit::LeftOnDisk);
    }
    // One line, however many files: counts, bytes and the first names (issue 35: 45,601
    // lines took 4 s a kubelet does not give).
    let first = left
        .first
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" ");
    let what = if drained {
        "everything queued was uploaded, but files the spool could not place are left on disk \
         (the first named)"
    } else {
        "shutdown deadline reached; files left on disk in the spool (the first named), \
         uploaded by the next start"
    };
    tracing::error!(
        files = left.files,
        listed_whole = left.complete,
        spool_files,
        spool_bytes,
        first = %first,
        took_ms = started.elapsed().as_millis() as u64,
        "{what}"
    );
    Ok(Exit::LeftOnDisk)
}

/// The longest a shutdown waits for request bodies still arriving before it seals (a fifth
/// of `--shutdown-timeout` when that is shorter): Ray's batches arrive on loopback in
/// milliseconds, and a body slower than this was never acknowledged, so Ray resends it.
const BODY_GRACE: Duration = Duration::from_secs(5);

/// How long, after the shutdown deadline, the cancelled uploads, the publication round and
/// the spool's writer may take to stop, together: a kubelet's grace period is usually a few
/// seconds longer than `--shutdown-timeout` (30 s against the default 25 s).
const STOP_GRACE: Duration = Duration::from_secs(2);

/// How long listing what is left in the spool may take (a walk of the partition directories:
/// with 50,000 of them it took 13 s); past it the report counts what it found so far.
const LIST_GRACE: Duration = Duration::from_secs(2);

/// Files named in the shutdown's report of what is left; the rest are counted.
const LEFT_NAMED: usize = 20;

/// How often the cleanup without a log lane looks for the node id.
const CLEANUP_NODE_POLL: Duration = Duration::from_secs(5);

/// Without the log lane: once the node id is known, aborts the incomplete uploads an
/// earlier run left under this node (`storage::append`), as the log lane's first round does.
async fn clean_up_stale_uploads(
    app: crate::storage::append::Appender,
    prefix: String,
    mut nodes: node::node_id::NodeIdResolver,
    sessions: tokio::sync::watch::Receiver<Option<node::session::ActiveSession>>,
) {
    loop {
        let active = sessions.borrow().clone();
        if let Some(node) = active.and_then(|s| nodes.resolve_local(&s.dir)) {
            let p = app.prepare(&prefix, &node).await;
            if p.aborted > 0 || p.abort_failed > 0 {
                tracing::info!(
                    aborted = p.aborted,
                    failed = p.abort_failed,
                    node,
                    "incomplete multipart uploads of an earlier run cleaned up"
                );
            }
            return;
        }
        tokio::time::sleep(CLEANUP_NODE_POLL).await;
    }
}

/// The dashboard's node list, matched by this pod's IP: the last resort for the node id.
fn dashboard_node_lookup(
    cfg: &dashboard::DashboardConfig,
    pod_ip: &str,
) -> node::node_id::RemoteNodeLookup {
    let (cfg, ip) = (cfg.clone(), pod_ip.to_string());
    node::node_id::RemoteNodeLookup::new(
        format!("the dashboard's node list, pod IP {pod_ip}"),
        move || {
            let (cfg, ip) = (cfg.clone(), ip.clone());
            Box::pin(async move {
                dashboard::node_id_by_ip(&cfg, &ip)
                    .await
                    .map_err(|e| e.to_string())
            })
        },
    )
}

/// SIGTERM and SIGINT handlers.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    async fn wait(mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
