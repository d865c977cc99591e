//! Prometheus metrics: names in one place, so dashboards and docs have one source, and the
//! one module every path calls to emit them (this module calls none of them).
//!
//! Counters and histograms go through the `metrics` facade; the spool's gauges are handed to
//! [`render`] when `/metrics` is scraped, so they cost nothing on the hot path.

use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Always 1; its labels say what this binary is: `version` (the crate's) and `compressor`
/// (what compresses uploads at `--gzip-level` 1 and 2: `igzip` or `libdeflate`, by build).
pub const BUILD_INFO: &str = "rhc_build_info";
/// Requests answered, by path and status code.
pub const HTTP_REQUESTS: &str = "rhc_http_requests_total";
/// Events stored.
pub const EVENTS_ACCEPTED: &str = "rhc_events_accepted_total";
/// Events dropped as recently seen duplicates.
pub const EVENTS_DUPLICATE: &str = "rhc_events_duplicate_total";
/// Events kept in quarantine, by reason.
pub const EVENTS_QUARANTINED: &str = "rhc_events_quarantined_total";
/// Unusable events beyond the per-body quarantine cap: counted, not kept, by reason.
pub const EVENTS_QUARANTINE_DROPPED: &str = "rhc_events_quarantine_dropped_total";
/// Events Ray sent with snake_case keys, stored as protobuf's camelCase JSON (`--event-keys camel`).
pub const EVENTS_RENAMED: &str = "rhc_events_renamed_total";
/// Fields of renamed events that the field table (generated from Ray's descriptors) does not
/// know: a Ray newer than the table. Their values are kept as sent, their names converted by rule.
pub const EVENT_FIELDS_UNKNOWN: &str = "rhc_event_fields_unknown_total";
/// Request body bytes received (after decompression).
pub const INGEST_BYTES: &str = "rhc_ingest_bytes_total";
/// Bodies that were not JSON.
pub const INVALID_BODIES: &str = "rhc_invalid_bodies_total";
/// Of those, bodies answered 400 but not kept in quarantine (over the keeping rate).
pub const INVALID_BODIES_NOT_KEPT: &str = "rhc_invalid_bodies_not_kept_total";
/// Gzip bodies refused with 413 because they decode to more than `--max-gzip-ratio` times
/// their size as sent (past the first MiB).
pub const GZIP_BOMBS: &str = "rhc_gzip_bodies_refused_total";
/// Connections closed at the connection cap because they had sent no request head.
pub const CONNECTIONS_CLOSED_STALLED: &str = "rhc_connections_closed_stalled_total";
/// Connections closed at the connection cap to make room, by reason (the stalled ones
/// are also counted in [`CONNECTIONS_CLOSED_STALLED`]).
pub const CONNECTIONS_EVICTED: &str = "rhc_connections_evicted_total";
/// New connections closed without being served: every place, reserved, leaving and waiting
/// one was taken, or none could be had within their wait.
pub const CONNECTIONS_REFUSED: &str = "rhc_connections_refused_total";
/// New connections that found no place at once and waited for one.
pub const CONNECTIONS_WAITED: &str = "rhc_connections_waited_total";
/// Request bodies cut (`408`) because they fell behind their pace while another body waited
/// for the memory they held.
pub const STALLED_BODIES_CUT: &str = "rhc_stalled_bodies_cut_total";
/// Bytes in the spool not yet uploaded.
pub const SPOOL_BYTES: &str = "rhc_spool_bytes";
/// Spool files not yet uploaded: segments, quarantine files, kept bodies (not the growth
/// copies and records of open segments).
pub const SPOOL_FILES: &str = "rhc_spool_segments";
/// Files an earlier run of this node left in the spool that are not uploaded yet (counted
/// at start; they go up before the new run's events are published).
pub const SPOOL_EARLIER_RUN_FILES: &str = "rhc_spool_earlier_run_files";
/// 1 while the new run's events wait to be published for the files an earlier run left
/// (until none is left, or none was uploaded for an `--upload-window`), else 0.
pub const PUBLISH_HELD: &str = "rhc_publish_held_for_earlier_run";
/// The spool's disk budget (`--max-spool-bytes`): alerts compare [`SPOOL_BYTES`] with it.
pub const SPOOL_BUDGET: &str = "rhc_spool_budget_bytes";
/// Spool accounting errors, by counter (`stored`, `files`, `claimed`, `uncopied`): a
/// subtraction larger than the count (clamped at zero) or an addition past 2^64. Always 0
/// unless there is a bug; the budget may be off until the spool is empty.
pub const SPOOL_ACCOUNTING_ERRORS: &str = "rhc_spool_accounting_errors_total";
/// Age of the oldest acknowledged event not yet in the bucket: sealed files not yet uploaded
/// and the bytes of open segments not yet published (the alert: above twice
/// `--upload-window`).
pub const OLDEST_AGE: &str = "rhc_spool_oldest_unuploaded_age_seconds";
/// Time from the first write of a group to the end of its sync (including the wait for the
/// sync in flight before it).
pub const COMMIT_SECONDS: &str = "rhc_spool_commit_seconds";
/// Bytes made durable.
pub const SPOOL_WRITTEN: &str = "rhc_spool_written_bytes_total";
/// The ids journal beside the spool (the deduplication window across restarts) could not be
/// used, by `what`: `damaged` (a file or its tail unreadable at start: discarded) or `write`
/// (an append, sync or snapshot failed: behind until a later snapshot succeeds).
pub const DEDUP_JOURNAL_FAILURES: &str = "rhc_dedup_journal_failures_total";
/// Upload attempts, by object kind.
pub const UPLOAD_ATTEMPTS: &str = "rhc_upload_attempts_total";
/// Failed upload attempts, by object kind.
pub const UPLOAD_FAILURES: &str = "rhc_upload_failures_total";
/// Duration of successful uploads.
pub const UPLOAD_SECONDS: &str = "rhc_upload_duration_seconds";
/// Bytes uploaded (after compression).
pub const UPLOAD_BYTES: &str = "rhc_upload_bytes_total";
/// Unix time of the last successful upload.
pub const LAST_UPLOAD: &str = "rhc_last_successful_upload_timestamp_seconds";
/// Requests refused with 503 because the spool is over its high watermark.
pub const BACKPRESSURE: &str = "rhc_backpressure_rejections_total";
/// Log files uploaded (snapshots and rotated backups).
pub const LOG_FILES_UPLOADED: &str = "rhc_log_files_uploaded_total";
/// Log bytes uploaded (whole files, or the new bytes of an append).
pub const LOG_BYTES_UPLOADED: &str = "rhc_log_bytes_uploaded_total";
/// Log uploads by kind: `whole` (the file's bytes so far) or `append` (only its new bytes).
pub const LOG_UPLOADS: &str = "rhc_log_uploads_total";
/// Bytes read from log files (uploads, appends, and the hashes that recognise a file).
pub const LOG_BYTES_READ: &str = "rhc_log_bytes_read_total";
/// Bytes Ray wrote to the live log files, as seen by the rounds.
pub const LOG_BYTES_WRITTEN: &str = "rhc_log_bytes_written_total";
/// Log bytes uploaded ÷ log bytes Ray wrote, since the start.
pub const LOG_AMPLIFICATION: &str = "rhc_log_upload_amplification";
/// Changed log files the schedule held back in the last round.
pub const LOG_FILES_WAITING: &str = "rhc_log_files_waiting";
/// Failed log uploads (retried on the next round).
pub const LOG_UPLOAD_FAILURES: &str = "rhc_log_upload_failures_total";
/// Log files not shipped, by reason (symlink, unsafe name, vanished, unreadable, ...).
pub const LOG_FILES_SKIPPED: &str = "rhc_log_files_skipped_total";
/// Duration of one snapshot pass over the sessions.
pub const LOG_SNAPSHOT_SECONDS: &str = "rhc_log_snapshot_seconds";
/// Unix time of the last finished snapshot pass.
pub const LOG_LAST_SNAPSHOT: &str = "rhc_log_last_snapshot_timestamp_seconds";
/// Appends that did not happen, by what the store's answer meant: `unsupported` and
/// `refused` (count toward switching appends off), `transient` (retried next round),
/// `changed` (the object or file was not as recorded: uploaded whole).
pub const LOG_APPEND_FAILURES: &str = "rhc_log_append_failures_total";
/// 1 while appends are on, 0 while they are off (store refusals, or a versioned bucket).
pub const LOG_APPENDS_ENABLED: &str = "rhc_log_appends_enabled";
/// Incomplete multipart uploads of appends (or left by an earlier run) aborted, by result
/// (`ok`, `failed`).
pub const LOG_UPLOADS_ABORTED: &str = "rhc_log_multipart_aborts_total";

/// Publications of open segments' objects (growth in place), by how: `append` (file://
/// in place, or S3's copy of the object plus the new part), `whole` (a PUT of the object so
/// far), `failed` (retried next round).
pub const PUBLICATIONS: &str = "rhc_event_publications_total";
/// Bytes sent by publications (object bytes, after compression).
pub const PUBLICATION_BYTES: &str = "rhc_event_publication_bytes_total";
/// 1 while every write of event objects that can carry a condition carries it (`If-Match`
/// / `If-None-Match`; read at each scrape), 0 for `file://` (which needs none) and once the
/// store refused any kind of condition (a PUT's or a completion's, either header: which, in
/// [`CONDITIONS_REFUSED`]): answered it with 501 / `NotImplemented`, or with 400 / 403 for
/// 30 s while the same write without it then landed (`storage::versioned`).
pub const CONDITIONAL_WRITES: &str = "rhc_event_conditional_writes";
/// Per kind of conditional write (`kind`: `put_if_none_match`, `put_if_match`,
/// `complete_if_none_match`, `complete_if_match`), 1 once the store refused it and writes
/// of that kind go without their condition (`storage::conditions`), 0 otherwise.
pub const CONDITIONS_REFUSED: &str = "rhc_conditional_writes_refused";

/// Installs the global recorder; the handle renders `/metrics`. `compressor` names what
/// compresses uploads at `--gzip-level` 1 and 2 in this build (`storage::gzip::FAST_COMPRESSOR`,
/// passed in so that this room imports no other).
pub fn install(compressor: &'static str) -> anyhow::Result<PrometheusHandle> {
    let buckets = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)?
        .install_recorder()?;
    gauge!(
        BUILD_INFO,
        "version" => env!("CARGO_PKG_VERSION"),
        "compressor" => compressor
    )
    .set(1.0);
    counter!(EVENTS_ACCEPTED).absolute(0);
    counter!(EVENTS_DUPLICATE).absolute(0);
    counter!(EVENTS_RENAMED).absolute(0);
    counter!(EVENT_FIELDS_UNKNOWN).absolute(0);
    counter!(INVALID_BODIES).absolute(0);
    counter!(INVALID_BODIES_NOT_KEPT).absolute(0);
    counter!(GZIP_BOMBS).absolute(0);
    counter!(CONNECTIONS_CLOSED_STALLED).absolute(0);
    counter!(CONNECTIONS_REFUSED).absolute(0);
    counter!(CONNECTIONS_WAITED).absolute(0);
    for c in ["stored", "files", "claimed", "uncopied"] {
        counter!(SPOOL_ACCOUNTING_ERRORS, "counter" => c).absolute(0);
    }
    counter!(STALLED_BODIES_CUT).absolute(0);
    for what in ["damaged", "write"] {
        counter!(DEDUP_JOURNAL_FAILURES, "what" => what).absolute(0);
    }
    Ok(handle)
}

/// The spool's state at a scrape.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpoolGauges {
    /// Bytes not yet uploaded.
    pub bytes: u64,
    /// Files not yet uploaded.
    pub files: u64,
    /// Age of the oldest file not yet uploaded, in seconds.
    pub oldest_age_seconds: f64,
    /// Event objects are written conditionally now ([`CONDITIONAL_WRITES`]).
    pub conditional_writes: bool,
    /// Each kind of conditional write with whether the store refused it
    /// ([`CONDITIONS_REFUSED`]).
    pub conditions_refused: [(&'static str, bool); 4],
    /// Files an earlier run left, not uploaded yet ([`SPOOL_EARLIER_RUN_FILES`]).
    pub earlier_run_files: u64,
    /// The new run's publications wait for them ([`PUBLISH_HELD`]).
    pub held_for_earlier_run: bool,
}

/// Renders the text exposition, refreshing the spool gauges first.
pub fn render(handle: &PrometheusHandle, spool: SpoolGauges) -> String {
    gauge!(SPOOL_BYTES).set(spool.bytes as f64);
    gauge!(SPOOL_FILES).set(spool.files as f64);
    gauge!(OLDEST_AGE).set(spool.oldest_age_seconds);
    gauge!(SPOOL_EARLIER_RUN_FILES).set(spool.earlier_run_files as f64);
    gauge!(PUBLISH_HELD).set(if spool.held_for_earlier_run { 1.0 } else { 0.0 });
    conditional_writes(spool.conditional_writes);
    for (kind, refused) in spool.conditions_refused {
        gauge!(CONDITIONS_REFUSED, "kind" => kind).set(if refused { 1.0 } else { 0.0 });
    }
    handle.run_upkeep();
    handle.render()
}

/// Sets [`SPOOL_BUDGET`], once at start.
pub fn spool_budget(bytes: u64) {
    gauge!(SPOOL_BUDGET).set(bytes as f64);
}

pub(crate) fn events_accepted(accepted: u64, duplicates: u64) {
    counter!(EVENTS_ACCEPTED).increment(accepted);
    if duplicates > 0 {
        counter!(EVENTS_DUPLICATE).increment(duplicates);
    }
}

pub(crate) fn events_renamed(events: u64, unknown_fields: u64) {
    counter!(EVENTS_RENAMED).increment(events);
    if unknown_fields > 0 {
        counter!(EVENT_FIELDS_UNKNOWN).increment(unknown_fields);
    }
}

/// Shows every quarantine reason at 0 from the start, so alerts need no `absent()`.
pub fn register_quarantine_reasons(codes: impl IntoIterator<Item = &'static str>) {
    for code in codes {
        counter!(EVENTS_QUARANTINED, "reason" => code).absolute(0);
    }
}

pub(crate) fn quarantine_dropped(reason_code: &'static str, n: u64) {
    counter!(EVENTS_QUARANTINE_DROPPED, "reason" => reason_code).increment(n);
}

pub(crate) fn events_quarantined(reason_code: &'static str, n: u64) {
    counter!(EVENTS_QUARANTINED, "reason" => reason_code).increment(n);
}

pub(crate) fn dedup_journal_failure(what: &'static str) {
    counter!(DEDUP_JOURNAL_FAILURES, "what" => what).increment(1);
}

pub(crate) fn spool_commit(bytes: u64, took: Duration) {
    counter!(SPOOL_WRITTEN).increment(bytes);
    histogram!(COMMIT_SECONDS).record(took.as_secs_f64());
}

pub(crate) fn spool_accounting_error(counter: &'static str) {
    counter!(SPOOL_ACCOUNTING_ERRORS, "counter" => counter).increment(1);
}

pub(crate) fn http_request(path: &'static str, status: u16) {
    counter!(HTTP_REQUESTS, "path" => path, "status" => status.to_string()).increment(1);
}

pub(crate) fn ingest_bytes(n: u64) {
    counter!(INGEST_BYTES).increment(n);
}

pub(crate) fn invalid_body() {
    counter!(INVALID_BODIES).increment(1);
}

pub(crate) fn gzip_bomb() {
    counter!(GZIP_BOMBS).increment(1);
}

pub(crate) fn invalid_body_not_kept() {
    counter!(INVALID_BODIES_NOT_KEPT).increment(1);
}

/// A connection was chosen to make room at the cap; `reason` is its metric label.
pub(crate) fn connection_evicted(reason: &'static str) {
    counter!(CONNECTIONS_EVICTED, "reason" => reason).increment(1);
    if reason == "no_request" {
        counter!(CONNECTIONS_CLOSED_STALLED).increment(1);
    }
}

pub(crate) fn connection_refused() {
    counter!(CONNECTIONS_REFUSED).increment(1);
}

pub(crate) fn connection_waited() {
    counter!(CONNECTIONS_WAITED).increment(1);
}

/// `n` bodies that fell behind their pace were cut to give their room to one that waited.
pub(crate) fn stalled_bodies_cut(n: u64) {
    counter!(STALLED_BODIES_CUT).increment(n);
}

pub(crate) fn backpressure() {
    counter!(BACKPRESSURE).increment(1);
}

pub(crate) fn upload_attempt(kind: &'static str) {
    counter!(UPLOAD_ATTEMPTS, "kind" => kind).increment(1);
}

pub(crate) fn publication(how: &'static str, bytes: u64) {
    counter!(PUBLICATIONS, "how" => how).increment(1);
    counter!(PUBLICATION_BYTES).increment(bytes);
}

/// Whether event objects are still written conditionally (see [`CONDITIONAL_WRITES`]).
pub(crate) fn conditional_writes(on: bool) {
    gauge!(CONDITIONAL_WRITES).set(if on { 1.0 } else { 0.0 });
}

pub(crate) fn upload_failure(kind: &'static str) {
    counter!(UPLOAD_FAILURES, "kind" => kind).increment(1);
}

pub(crate) fn upload_success(kind: &'static str, bytes: u64, took: Duration) {
    histogram!(UPLOAD_SECONDS, "kind" => kind).record(took.as_secs_f64());
    counter!(UPLOAD_BYTES, "kind" => kind).increment(bytes);
    gauge!(LAST_UPLOAD).set(unix_now());
}

pub(crate) fn log_file_skipped(reason: &'static str) {
    counter!(LOG_FILES_SKIPPED, "reason" => reason).increment(1);
}

pub(crate) fn log_file_uploaded(bytes: u64, appended: bool) {
    counter!(LOG_FILES_UPLOADED).increment(1);
    counter!(LOG_BYTES_UPLOADED).increment(bytes);
    let kind = if appended { "append" } else { "whole" };
    counter!(LOG_UPLOADS, "kind" => kind).increment(1);
}

pub(crate) fn log_append_failure(kind: &'static str) {
    counter!(LOG_APPEND_FAILURES, "kind" => kind).increment(1);
}

pub(crate) fn log_appends_enabled(on: bool) {
    gauge!(LOG_APPENDS_ENABLED).set(if on { 1.0 } else { 0.0 });
}

pub(crate) fn append_upload_aborted(ok: bool) {
    let result = if ok { "ok" } else { "failed" };
    counter!(LOG_UPLOADS_ABORTED, "result" => result).increment(1);
}

pub(crate) fn log_bytes_read(bytes: u64) {
    counter!(LOG_BYTES_READ).increment(bytes);
}

pub(crate) fn log_bytes_written(bytes: u64) {
    counter!(LOG_BYTES_WRITTEN).increment(bytes);
}

pub(crate) fn log_amplification(uploaded: u64, written: u64) {
    if written > 0 {
        gauge!(LOG_AMPLIFICATION).set(uploaded as f64 / written as f64);
    }
}

pub(crate) fn log_files_waiting(files: usize) {
    gauge!(LOG_FILES_WAITING).set(files as f64);
}

pub(crate) fn log_upload_failure() {
    counter!(LOG_UPLOAD_FAILURES).increment(1);
}

pub(crate) fn log_snapshot_done(took: Duration) {
    histogram!(LOG_SNAPSHOT_SECONDS).record(took.as_secs_f64());
    gauge!(LOG_LAST_SNAPSHOT).set(unix_now());
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Dashboard requests of the head's snapshot poller, by `endpoint_kind` (one_shot, periodic,
/// datasets, additional, job_list) and `outcome` (ok, unchanged, empty, refused, unauthorized,
/// unreachable, http_error, timeout, too_large, invalid, upload_failed).
pub const DASHBOARD_REQUESTS: &str = "rhc_dashboard_requests_total";
/// Dashboard answers not stored, by `endpoint_kind` and `reason` (not_json, wrong_shape,
/// result_false, smaller_list, stored_unknown): the last snapshot stays.
pub const DASHBOARD_REFUSED: &str = "rhc_dashboard_answers_refused_total";
/// Unix time of the last 2xx answer from the Ray dashboard: stale means snapshots are stale.
pub const DASHBOARD_LAST_SUCCESS: &str = "rhc_dashboard_last_success_timestamp_seconds";

pub(crate) fn dashboard_request(endpoint_kind: &'static str, outcome: &'static str) {
    counter!(DASHBOARD_REQUESTS, "endpoint_kind" => endpoint_kind, "outcome" => outcome)
        .increment(1);
}

pub(crate) fn dashboard_refused(endpoint_kind: &'static str, reason: &'static str) {
    counter!(DASHBOARD_REFUSED, "endpoint_kind" => endpoint_kind, "reason" => reason).increment(1);
}

pub(crate) fn dashboard_success() {
    gauge!(DASHBOARD_LAST_SUCCESS).set(unix_now());
}
