//! `/api/train/v2/runs/v1`: the Ray Train V2 runs of a dead session, as Ray's Train head
//! answers them on a live cluster (Ray 2.60's `TrainHead.get_train_v2_runs`; its
//! `/api/train/v2/runs` is the Train V1 endpoint, whose runs Train V2 does not record, and is
//! left to the snapshot replay).
//!
//! - **A stored snapshot wins where it is as far as the events.** When the head's collector
//!   stored a snapshot of this URI (`RAY_COLLECTOR_ADDITIONAL_ENDPOINTS`), it is what Ray
//!   itself answered, but at the last poll: a run that went on after it (the head died
//!   first, or the poll was up to 30 s old) is further in the export events. So, run by run,
//!   the snapshot's run is kept unless the events' went further ([`further_than_snapshot`],
//!   [`Progress`]): more attempts, more ended attempts, ended where the snapshot's had not,
//!   a later status in the attempt's cycle (`SCHEDULING` < `RUNNING` < `RESTARTING`/`RESIZING`
//!   < `SCHEDULING` again), more attempts past `PENDING`, more workers, a later start or end
//!   time; a run the snapshot does not list is added. The events are what Ray's head would
//!   have answered after its last poll, so where they went further they are its last answer. When the snapshot keeps every run, it is replayed byte
//!   for byte, as `/api/{*path}` replays any other (`replay.rs`); when the events cannot be
//!   read (the session's load failed), too, marked [`EVENTS_UNREADABLE_HEADER`]. While the
//!   session is still loading, the answer is the `503` of every route the index answers:
//!   the snapshot alone could be older than the events.
//! - **Otherwise, from the export events.** The session's `EXPORT_TRAIN_RUN` and
//!   `EXPORT_TRAIN_RUN_ATTEMPT` events, as `inspect` folds them (its `train_runs`, the same
//!   facts `inspect --train-run --json` prints), are written back in the shape of Ray's
//!   `TrainRunsResponse`: `{"train_runs": [DecoratedTrainRun, ...]}`, newest run first (Ray
//!   sorts by `start_time_ns`, descending). A run the session knows only by its attempts
//!   (no `EXPORT_TRAIN_RUN` event read: its name, job, controller, status and start unknown)
//!   is left out, as Ray's head lists no run without its `TrainRun` record and its model
//!   rejects those nulls; their number is the header [`RUNS_LEFT_OUT_HEADER`] (`inspect`
//!   still shows them). A run whose event has no `run_settings` (Ray before 2.60 wrote
//!   none, nor a worker's `resources`) has protobuf's defaults there
//!   ([`unrecorded_settings`], a worker's `{"resources": {}}`), which Ray's model requires;
//!   their number is the header [`UNRECORDED_SETTINGS_HEADER`]. The answer is built on a
//!   blocking thread, not on the async workers, once for every request about the same
//!   session that comes while it is built, and kept while the session's index and snapshot
//!   are unchanged ([`super::kept`], [`TrainAnswers`]).
//!   [`ray_run`] undoes each difference between Ray's
//!   pydantic model and the protobuf export event (the list is in its doc; tests/ray_train_e2e.rs
//!   checks every leaf against Ray 2.60's live answer). What Ray's head decides at query time
//!   from the actor table, `inspect` decides from the session's actors (`report.rs`): a run
//!   still `RUNNING` whose controller actor is `DEAD` is `ABORTED`, "Terminated due to system
//!   errors or killed by the user." (end time and attempts as recorded), and a worker's
//!   status is its actor's state (`ALIVE` or `DEAD`) when the session knows the actor.
//! - **Nothing Ray sent is dropped.** Members of the export event this version does not map
//!   (at any depth of `run_settings`, and the run's, attempts' and workers' own, such as the
//!   event's `schema_version`, `ray_train_version` and dashboard panels) are kept under their
//!   own names.
//! - **What a dead cluster cannot say.** Ray decorates each live worker with its process's
//!   `processStats` and `gpus` from the actor table at query time: here `null` and `[]`.
//!   `job_details` is the session's job as `/api/jobs/{id}` answers it (KubeRay's job shape,
//!   which is Ray's `JobDetails`) with its driver's node IP from the session's nodes (else
//!   `EXPORT_DRIVER_JOB`'s `driver_ip_address`): the job table's metadata, runtime env and
//!   exit code are not in the events read (`null`), and `status` follows the driver's events
//!   (`RUNNING` until its end was recorded, then `SUCCEEDED`), where Ray's job table says what
//!   it said at query time. A run whose job no driver job event recorded (the session knows
//!   it only from the Train events, its tasks or actors) has `job_details: null`, as Ray
//!   answers a job its job table does not have.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse as _, Response};
use object_store::ObjectMeta;
use serde_json::{json, Map, Value};

use super::cookies::Entered;
use super::index::SessionIndex;
use super::replay::{find_snapshot, read_found, Missing};
use super::session::{headers_for, index, job_json};
use super::Shared;
use crate::util::time::parse_rfc3339_seconds;

/// The URI Ray 2.60's Train head answers Train V2 runs at.
pub const TRAIN_V2_RUNS_URI: &str = "/api/train/v2/runs/v1";

/// The protobuf enum value of "no framework", which Ray's model writes as `null`.
const FRAMEWORK_UNSPECIFIED: &str = "TRAINING_FRAMEWORK_UNSPECIFIED";

/// Set on an answer from the export events to the number of runs left out of it because
/// the session knows them only by their attempts (no `EXPORT_TRAIN_RUN` event was read):
/// Ray's head lists no run without its `TrainRun` record, and its model requires the
/// record's name, job, controller, status and start. `inspect` still shows them.
pub const RUNS_LEFT_OUT_HEADER: &str = "x-rhc-train-runs-without-run-event";

/// Set on an answer from the export events to the number of runs whose `run_settings` the
/// session never recorded (Ray before 2.60 wrote none): their `run_settings` is
/// [`unrecorded_settings`], which Ray's model requires but which says nothing of the run.
pub const UNRECORDED_SETTINGS_HEADER: &str = "x-rhc-train-runs-without-settings";

/// `GET /api/train/v2/runs/v1`. The answer is built on a blocking thread
/// ([`tokio::task::spawn_blocking`]): a session of many runs, attempts and workers takes
/// long to fold and write, and the async workers stay free for every other request
/// (`/livez` included) meanwhile. It is built once for all the requests about the same
/// session and snapshot, and kept while they are unchanged ([`super::kept`]).
pub async fn runs_v1(State(state): State<Shared>, entered: Entered) -> Response {
    // The snapshot is found (listed) here and read by the build, once for every request
    // that waits for it: a request holds no copy of it while it waits (review r37l D2:
    // twenty requests waiting on one build held twenty 40 MiB copies).
    let snapshot = match find_snapshot(&state, &entered, TRAIN_V2_RUNS_URI).await {
        Ok(meta) => Some(meta),
        Err(Missing::NotFound) => None,
        Err(Missing::Unreadable(r)) => return entered.refresh(r),
    };
    let index = match index(&state, &entered).await {
        Ok(index) => index,
        Err(r) => {
            return match &snapshot {
                Some(meta) => match read_found(&state, meta).await {
                    Ok(body) => entered.refresh(without_events(r, body)),
                    Err(Missing::NotFound) => r,
                    Err(Missing::Unreadable(r)) => entered.refresh(r),
                },
                None => r,
            }
        }
    };
    let tag = snapshot_tag(snapshot.as_ref());
    let reader = state.clone();
    let built = built_once(&state, &entered, tag, &index, move || async move {
        let body = match &snapshot {
            Some(meta) => match read_found(&reader, meta).await {
                Ok(body) => Some(body),
                // Gone since it was listed: the answer is the events'.
                Err(Missing::NotFound) => None,
                Err(Missing::Unreadable(r)) => {
                    return Err(TrainBuildError::Unreadable(UnreadableAnswer::of(r).await))
                }
            },
            None => None,
        };
        Ok(body)
    })
    .await;
    match built {
        Ok(answer) => match &*answer {
            TrainAnswer::Built(headers, body) => entered.refresh((headers.clone(), body.clone())),
            TrainAnswer::Snapshot(body) => {
                entered.refresh(([(CONTENT_TYPE, "application/json")], body.clone()))
            }
        },
        Err(TrainBuildError::Unreadable(r)) => entered.refresh(r.into_response()),
        Err(TrainBuildError::Failed(e)) => {
            tracing::error!(error = %e, "building the Train runs answer failed");
            entered.refresh(build_failed())
        }
    }
}

/// Why a Train answer was not built: the snapshot could not be read (its `502`, answered
/// to every request that waited), or the build failed (a `500`).
#[derive(Clone)]
pub(crate) enum TrainBuildError {
    Unreadable(Arc<UnreadableAnswer>),
    Failed(String),
}

impl From<String> for TrainBuildError {
    fn from(e: String) -> Self {
        TrainBuildError::Failed(e)
    }
}

/// A snapshot's `502` ([`Missing::Unreadable`]), kept whole to answer each waiting request.
pub(crate) struct UnreadableAnswer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Bytes,
}

impl UnreadableAnswer {
    async fn of(r: Response) -> Arc<Self> {
        let (parts, body) = r.into_parts();
        // A short text this server wrote (escape_message): read whole.
        let body = axum::body::to_bytes(body, 64 << 10)
            .await
            .unwrap_or_default();
        Arc::new(UnreadableAnswer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    fn into_response(self: &Arc<Self>) -> Response {
        (self.status, self.headers.clone(), self.body.clone()).into_response()
    }
}

/// A Train answer as built ([`built_once`]) and kept ([`TrainAnswers`]).
pub(crate) enum TrainAnswer {
    /// Headers and body, from the export events (with the snapshot's runs they did not take
    /// further, when there is a snapshot).
    Built(axum::http::HeaderMap, Bytes),
    /// The snapshot is as far as the events for every run: it is replayed byte for byte.
    Snapshot(Bytes),
}

/// Train answers built at once: a big session's answer takes hundreds of MiB while it is
/// built, and a blocking task cannot be stopped when its client leaves (review r37j D1: every
/// concurrent request built its own copy, 230 MiB each, and 12 abandoned requests took serve
/// to 3.3 GiB). Requests about the same session share one build ([`super::kept`]).
pub const CONCURRENT_TRAIN_BUILDS: usize = 1;

/// Train answers kept (one per session, the oldest dropped first, each only while the
/// session's index is held). An answer is much smaller than its build's peak: 10 MB for 100
/// runs of 4 attempts of 64 workers (tests/inspect_train_runs.rs).
pub const KEPT_TRAIN_ANSWERS: usize = 2;

/// The Train answers built, and the permits to build one.
pub(crate) type TrainAnswers = super::kept::Kept<TrainAnswer, TrainBuildError>;

/// A new [`TrainAnswers`].
pub(crate) fn train_answers() -> Arc<TrainAnswers> {
    Arc::new(super::kept::Kept::new(
        CONCURRENT_TRAIN_BUILDS,
        KEPT_TRAIN_ANSWERS,
        None,
    ))
}

/// What tells two snapshots apart in [`TrainAnswers`]' tags: the listing's facts of the
/// object (key, size, ETag, version, time), none for no snapshot, hashed with keys drawn at
/// random per process. The poller replaces the snapshot as a new object (a new ETag on S3,
/// GCS and Azure; a new inode and time on `file://`), so a replaced snapshot is another tag.
fn snapshot_tag(snapshot: Option<&ObjectMeta>) -> u64 {
    use std::hash::BuildHasher as _;
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    KEYS.get_or_init(Default::default)
        .hash_one(snapshot.map(|m| {
            (
                m.location.as_ref(),
                m.size,
                m.e_tag.as_deref(),
                m.version.as_deref(),
                m.last_modified.timestamp_nanos_opt(),
            )
        }))
}

/// The session's Train answer: kept, or built once for every request that waits for it
/// ([`TrainAnswers`]): `read` reads the snapshot (if any), then the answer is built on
/// tokio's blocking pool.
async fn built_once<R>(
    state: &Shared,
    entered: &Entered,
    tag: u64,
    index: &Arc<SessionIndex>,
    read: impl FnOnce() -> R + Send + 'static,
) -> Result<Arc<TrainAnswer>, TrainBuildError>
where
    R: std::future::Future<Output = Result<Option<Bytes>, TrainBuildError>> + Send + 'static,
{
    let key = entered.session.marker_key(&state.bucket.spec.root);
    let session = entered.session.session.clone();
    let for_build = index.clone();
    state
        .train_answers
        .get_or_build(key, tag, index, move || async move {
            let snapshot = read().await?;
            let started = std::time::Instant::now();
            let built = tokio::task::spawn_blocking(move || {
                let index = &*for_build;
                let (events, counts) = runs_response(index);
                match snapshot {
                    Some(snapshot) => {
                        match further_than_snapshot(&snapshot, &events, &rescheduled_runs(index)) {
                            Some(merged) => TrainAnswer::Built(
                                answer_headers(index, counts),
                                Bytes::from(merged.to_string()),
                            ),
                            None => TrainAnswer::Snapshot(snapshot),
                        }
                    }
                    None => TrainAnswer::Built(
                        answer_headers(index, counts),
                        Bytes::from(events.to_string()),
                    ),
                }
            })
            .await
            .map_err(|e| TrainBuildError::Failed(e.to_string()))?;
            tracing::info!(
                session = %crate::inspect::escape_untrusted(&session),
                bytes = match &built {
                    TrainAnswer::Built(_, body) => body.len(),
                    TrainAnswer::Snapshot(_) => 0,
                },
                seconds = started.elapsed().as_secs_f64(),
                "Train runs answer built"
            );
            Ok(built)
        })
        .await
}

/// The `500` of a build that failed.
fn build_failed() -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "building the Train runs answer failed",
    )
        .into_response()
}

/// The session's headers ([`headers_for`]), with [`RUNS_LEFT_OUT_HEADER`] when runs were
/// left out and [`UNRECORDED_SETTINGS_HEADER`] when settings were not recorded.
fn answer_headers(index: &SessionIndex, counts: Counts) -> axum::http::HeaderMap {
    let mut headers = headers_for(index);
    for (name, n) in [
        (RUNS_LEFT_OUT_HEADER, counts.left_out),
        (UNRECORDED_SETTINGS_HEADER, counts.unrecorded_settings),
    ] {
        if n > 0 {
            headers.insert(
                HeaderName::from_static(name),
                axum::http::HeaderValue::from(n),
            );
        }
    }
    headers
}

/// Set (to `true`) on a stored snapshot answered because the session's events could not be
/// read (its load failed): runs the events took further may be missing from it.
pub const EVENTS_UNREADABLE_HEADER: &str = "x-rhc-events-unreadable";

/// The answer when a snapshot is stored but the session's index is not there (`index`'s
/// answer `r`): a session still loading is its `503` (with `x-rhc-session-loading` and
/// `Retry-After`), as on every route the index answers, since the events may take the runs
/// further than the snapshot; a load that failed (the events cannot be read) is the snapshot,
/// what Ray answered at the last poll and the best there is, marked
/// [`EVENTS_UNREADABLE_HEADER`].
fn without_events(r: Response, snapshot: Bytes) -> Response {
    if r.status() == StatusCode::SERVICE_UNAVAILABLE {
        return r;
    }
    (
        [
            (CONTENT_TYPE, "application/json"),
            (HeaderName::from_static(EVENTS_UNREADABLE_HEADER), "true"),
        ],
        snapshot,
    )
        .into_response()
}

/// Run statuses after which nothing changes (Ray's `RunStatus.is_terminal`), and the same of
/// attempts (`RunAttemptStatus.is_terminal`).
const TERMINAL: [&str; 3] = ["FINISHED", "ERRORED", "ABORTED"];

/// How far a run had got, in the order Ray 2.60's Train controller takes a run (its
/// `StateManagerCallback`): per attempt, the run `SCHEDULING`, the attempt created
/// `PENDING`, the attempt `RUNNING` with its workers, the run `RUNNING`; on a failure or a
/// resize the run `RESTARTING` or `RESIZING`, then `SCHEDULING` again while the attempt is
/// shut down (it ends), then the next attempt. Compared member by member, in this order.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Progress {
    attempts: usize,
    ended_attempts: usize,
    run_ended: bool,
    /// The run's non-terminal status in that cycle ([`run_phase`]).
    run_phase: u8,
    /// Attempts past `PENDING`.
    started_attempts: usize,
    workers: usize,
    /// The latest start or end time of the run and its attempts.
    latest_ns: i64,
}

/// The rank of a run's non-terminal status within an attempt's cycle (Ray's `RunStatus`):
/// `INITIALIZING` < `SCHEDULING` < `RUNNING` < `RESTARTING` = `RESIZING` < `SCHEDULING`
/// again after those (`rescheduling`). Terminal and unknown statuses rank 0: a run's end
/// is compared before.
fn run_phase(status: &str, rescheduling: bool) -> u8 {
    match status {
        "INITIALIZING" => 0,
        "SCHEDULING" if rescheduling => 4,
        "SCHEDULING" => 1,
        "RUNNING" => 2,
        "RESTARTING" | "RESIZING" => 3,
        _ => 0,
    }
}

/// How far a run in Ray's shape had got. `rescheduled`: its `SCHEDULING` is known to follow
/// a `RESTARTING` or `RESIZING` (the events' status history says so); a `SCHEDULING` run
/// whose attempts all ended is taken as rescheduling too. A snapshot carries no history, so
/// its `SCHEDULING` after a restart, the attempt not yet shut down, is taken for the one
/// before `RUNNING`: the events win there, as the fuller record.
fn progress(run: &Value, rescheduled: bool) -> Progress {
    let ended = |v: &Value| v["status"].as_str().is_some_and(|s| TERMINAL.contains(&s));
    let attempts = run["attempts"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let ended_attempts = attempts.iter().filter(|a| ended(a)).count();
    let all_ended = !attempts.is_empty() && ended_attempts == attempts.len();
    let status = run["status"].as_str().unwrap_or("");
    let times = |v: &Value| [v["start_time_ns"].as_i64(), v["end_time_ns"].as_i64()];
    Progress {
        attempts: attempts.len(),
        ended_attempts,
        run_ended: ended(run),
        run_phase: run_phase(status, rescheduled || all_ended),
        started_attempts: attempts
            .iter()
            .filter(|a| a["status"].as_str().is_some_and(|s| s != "PENDING"))
            .count(),
        workers: attempts
            .iter()
            .map(|a| a["workers"].as_array().map_or(0, Vec::len))
            .sum(),
        latest_ns: attempts
            .iter()
            .flat_map(times)
            .chain(times(run))
            .flatten()
            .max()
            .unwrap_or(i64::MIN),
    }
}

/// The ids of the session's runs whose latest status, `SCHEDULING`, follows a `RESTARTING`
/// or `RESIZING` in their status history (`inspect`'s `status_history`).
fn rescheduled_runs(index: &SessionIndex) -> Vec<String> {
    index
        .facts
        .train_runs
        .iter()
        .filter(|run| {
            let history = run["status_history"].as_array().map(Vec::as_slice);
            match history.unwrap_or(&[]) {
                [.., before, last] => {
                    last["status"] == "SCHEDULING"
                        && ["RESTARTING", "RESIZING"]
                            .contains(&before["status"].as_str().unwrap_or(""))
                }
                _ => false,
            }
        })
        .filter_map(|run| run["run_id"].as_str().map(str::to_string))
        .collect()
}

/// The stored snapshot (`snapshot`, what Ray answered at the collector's last poll) with each
/// run the export events took further replaced by theirs (`events`, [`runs_response`]), and
/// the runs it does not list added; `None` when the snapshot is as far for every run (it is
/// then replayed byte for byte). A run is further when its [`Progress`] is greater: more
/// attempts, more ended attempts, ended where the snapshot's had not, a later status in the
/// attempt's cycle, more attempts started, more workers, a later time, in this order
/// (`rescheduled`: the events' runs whose `SCHEDULING` follows a restart or resize,
/// [`rescheduled_runs`]); a run equal to the snapshot's is the snapshot's. So with the same attempts, a run the snapshot saw `SCHEDULING`
/// and the events `RUNNING` is the events'. A run the events take further keeps the
/// snapshot's `job_details` when the events know no job. A snapshot that is not a
/// `TrainRunsResponse` (an error text) gives way to the events when they hold runs.
fn further_than_snapshot(snapshot: &[u8], events: &Value, rescheduled: &[String]) -> Option<Value> {
    let from_events = events["train_runs"].as_array().filter(|r| !r.is_empty())?;
    let mut doc: Value = match serde_json::from_slice(snapshot) {
        Ok(v @ Value::Object(_)) if v["train_runs"].is_array() => v,
        _ => return Some(events.clone()),
    };
    let stored = doc["train_runs"].as_array_mut()?;
    let mut changed = false;
    for run in from_events {
        let again = run["id"]
            .as_str()
            .is_some_and(|id| rescheduled.iter().any(|r| r == id));
        match stored.iter_mut().find(|s| s["id"] == run["id"]) {
            Some(s) if *s != *run && progress(run, again) > progress(s, false) => {
                let mut run = run.clone();
                if run["job_details"].is_null() {
                    run["job_details"] = s["job_details"].take();
                }
                *s = run;
                changed = true;
            }
            Some(_) => {}
            None => {
                stored.push(run.clone());
                changed = true;
            }
        }
    }
    if !changed {
        return None;
    }
    stored.sort_by_key(|r| std::cmp::Reverse(r["start_time_ns"].as_i64()));
    Some(doc)
}

/// Whether the session read the run's own `EXPORT_TRAIN_RUN` event (`inspect` knows a run
/// also from its attempts alone: then its name, status and the rest are null).
fn has_run_event(run: &Value) -> bool {
    !(run["name"].is_null() && run["status"].is_null())
}

/// What an answer from the events could not say as Ray would.
#[derive(Clone, Copy, Default)]
struct Counts {
    /// Runs left out ([`RUNS_LEFT_OUT_HEADER`]).
    left_out: usize,
    /// Runs answered with [`unrecorded_settings`] ([`UNRECORDED_SETTINGS_HEADER`]).
    unrecorded_settings: usize,
}

/// Ray's `TrainRunsResponse` for the session's runs, newest first, and what it could not
/// say: the runs left out of it, those known only by their attempts ([`has_run_event`]),
/// which Ray's head never lists and its model rejects ([`RUNS_LEFT_OUT_HEADER`]), and the
/// runs whose settings were not recorded ([`UNRECORDED_SETTINGS_HEADER`]).
fn runs_response(index: &SessionIndex) -> (Value, Counts) {
    let all = &index.facts.train_runs;
    let mut runs: Vec<Value> = all
        .iter()
        .filter(|run| has_run_event(run))
        .map(|run| {
            let job = run["job_id"]
                .as_str()
                .and_then(|id| index.facts.jobs.iter().find(|j| j.job_id == id))
                .filter(|j| j.recorded)
                .map(|j| job_details(j, index));
            ray_run(run, job)
        })
        .collect();
    let counts = Counts {
        left_out: all.len() - runs.len(),
        unrecorded_settings: all
            .iter()
            .filter(|run| has_run_event(run) && !run["run_settings"].is_object())
            .count(),
    };
    // Ray sorts by start time, newest first; a run without one last.
    runs.sort_by_key(|r| std::cmp::Reverse(r["start_time_ns"].as_i64()));
    (json!({ "train_runs": runs }), counts)
}

/// The job as Ray's `JobDetails`: `/api/jobs/{id}`'s shape, with the driver's node IP from
/// the session's nodes, and what the events do not say (KubeRay's empty strings and exit
/// code 0) as Ray's `null`.
fn job_details(j: &crate::inspect::JobFacts, index: &SessionIndex) -> Value {
    let mut v = job_json(j);
    let ip = j
        .driver_node_id
        .as_deref()
        .and_then(|id| {
            index
                .facts
                .nodes
                .iter()
                .find(|n| n.node_id == id)
                .and_then(|n| n.ip.clone())
        })
        .or_else(|| j.driver_ip.clone());
    if let (Some(ip), Some(driver)) = (ip, v.get_mut("driver_info")) {
        driver["node_ip_address"] = Value::String(ip);
    }
    if let Some(o) = v.as_object_mut() {
        for k in [
            "submission_id",
            "message",
            "error_type",
            "driver_agent_http_address",
            "driver_node_id",
        ] {
            if o.get(k).is_some_and(|x| x == "") {
                o.insert(k.into(), Value::Null);
            }
        }
        // Ray's `JobDetails` requires both (a null voids the whole answer). Ray's head reads
        // them from the job table: the entrypoint is `""` when the table has none, and a
        // driver job is `SUCCEEDED` once the table marks it dead, else `RUNNING`; a job whose
        // driver events did not say (only its definition, or only its lifecycle, was read)
        // is answered by the same rule, its end recorded or not.
        if o.get("status").is_some_and(|x| x == "") {
            let status = if j.ended.is_some() {
                "SUCCEEDED"
            } else {
                "RUNNING"
            };
            o.insert("status".into(), Value::String(status.into()));
        }
        o.insert("driver_exit_code".into(), Value::Null);
    }
    v
}

/// The run's `framework_versions` in Ray's shape, a map of strings: a value Ray's model would
/// not take (a number, an object) is its JSON text, so it is still shown, not dropped.
fn framework_versions(versions: &Value) -> Value {
    let Some(m) = versions.as_object() else {
        return json!({});
    };
    Value::Object(
        m.iter()
            .map(|(k, v)| {
                let text = match v {
                    Value::String(_) => v.clone(),
                    other => Value::String(other.to_string()),
                };
                (k.clone(), text)
            })
            .collect(),
    )
}

/// Unix nanoseconds of an RFC 3339 UTC time with its fraction (as `inspect` writes them, with
/// every digit the event had).
fn unix_ns(t: &Value) -> Option<i64> {
    let t = t.as_str()?;
    let secs = parse_rfc3339_seconds(t)?;
    let frac = t
        .split_once('.')
        .map(|(_, f)| f.trim_end_matches('Z'))
        .unwrap_or("");
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ns: i64 = format!("{frac:0<9}").parse().ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(ns)
}

/// One run of `inspect`'s `train_runs` (`run`) in Ray's `DecoratedTrainRun` shape, with its
/// job (`job`, `/api/jobs/{id}`'s shape) as `job_details`.
///
/// What differs between Ray's model and `inspect`'s facts of the export event, undone here
/// (the reverse of tests/ray_train_e2e.rs's `inspect_place`):
/// - `id` is `run_id`; `start_time_ns`/`end_time_ns` are `started`/`ended` (RFC 3339 with
///   every digit) as integer nanoseconds; an attempt's `run_id` is its run's;
/// - `run_settings` ([`ray_settings`]): `scaling_config.num_workers` is the event's
///   `num_workers_fixed` (or `num_workers_range` as `[min, max]`), `data_config.datasets_to_split`
///   its `all: {}` (`"all"`) or `datasets.values`, `backend_config.framework`'s
///   `TRAINING_FRAMEWORK_UNSPECIFIED` is `null` and another value lower-case, as is
///   `checkpoint_score_order`; `checkpoint_config.num_to_keep` (the settings' one 64-bit
///   integer, which protobuf's JSON writes as a string) is a number; a map the event wraps
///   in `values` is the map; an optional member protobuf left out is `null`;
/// - a worker's `processStats` and `gpus` are Ray's live decorations: `null` and `[]`.
fn ray_run(run: &Value, job: Option<Value>) -> Value {
    let mut out = Map::new();
    out.insert("id".into(), run["run_id"].clone());
    out.insert("name".into(), run["name"].clone());
    out.insert("job_id".into(), run["job_id"].clone());
    out.insert(
        "controller_actor_id".into(),
        run["controller_actor_id"].clone(),
    );
    out.insert("status".into(), run["status"].clone());
    out.insert("status_detail".into(), run["status_detail"].clone());
    out.insert("start_time_ns".into(), json!(unix_ns(&run["started"])));
    out.insert("end_time_ns".into(), json!(unix_ns(&run["ended"])));
    out.insert(
        "controller_log_file_path".into(),
        run["controller_log_file_path"].clone(),
    );
    out.insert(
        "framework_versions".into(),
        framework_versions(&run["framework_versions"]),
    );
    let settings = match &run["run_settings"] {
        s @ Value::Object(_) => ray_settings(s),
        _ => unrecorded_settings(),
    };
    out.insert("run_settings".into(), settings);
    let attempts: Vec<Value> = run["attempts"]
        .as_array()
        .map(|a| a.iter().map(|a| ray_attempt(&run["run_id"], a)).collect())
        .unwrap_or_default();
    out.insert("attempts".into(), Value::Array(attempts));
    out.insert("job_details".into(), job.unwrap_or(Value::Null));
    // Members of the event this version does not map, under their own names.
    if !run["ray_train_version"].is_null() {
        out.insert("ray_train_version".into(), run["ray_train_version"].clone());
    }
    keep_others(&mut out, &run["other_fields"]);
    Value::Object(out)
}

/// `others`' members that `out` does not already have.
fn keep_others(out: &mut Map<String, Value>, others: &Value) {
    if let Some(o) = others.as_object() {
        for (k, v) in o {
            out.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
}

/// An attempt in Ray's `DecoratedTrainRunAttempt` shape.
fn ray_attempt(run_id: &Value, a: &Value) -> Value {
    let mut out = Map::new();
    out.insert("run_id".into(), run_id.clone());
    out.insert("attempt_id".into(), a["attempt_id"].clone());
    out.insert("status".into(), a["status"].clone());
    out.insert("status_detail".into(), a["status_detail"].clone());
    out.insert("start_time_ns".into(), json!(unix_ns(&a["started"])));
    out.insert("end_time_ns".into(), json!(unix_ns(&a["ended"])));
    out.insert(
        "resources".into(),
        match &a["resources"] {
            Value::Null => json!([]),
            r => r.clone(),
        },
    );
    let workers: Vec<Value> = a["workers"]
        .as_array()
        .map(|w| w.iter().map(ray_worker).collect())
        .unwrap_or_default();
    out.insert("workers".into(), Value::Array(workers));
    keep_others(&mut out, &a["other_fields"]);
    Value::Object(out)
}

/// A worker in Ray's `DecoratedTrainWorker` shape (`inspect`'s worker less its
/// `log_command`, with Ray's live-only decorations empty).
fn ray_worker(w: &Value) -> Value {
    let mut out = Map::new();
    for k in [
        "world_rank",
        "local_rank",
        "node_rank",
        "actor_id",
        "node_id",
        "node_ip",
        "pid",
        "gpu_ids",
        "status",
        "resources",
        "log_file_path",
    ] {
        out.insert(k.into(), w[k].clone());
    }
    // What Ray's model requires and an older Ray did not write: protobuf's default (a
    // worker's `resources` came with Ray 2.60).
    for (k, zero) in [
        ("world_rank", json!(0)),
        ("local_rank", json!(0)),
        ("node_rank", json!(0)),
        ("actor_id", json!("")),
        ("node_id", json!("")),
        ("node_ip", json!("")),
        ("pid", json!(0)),
        ("gpu_ids", json!([])),
        ("resources", json!({"resources": {}})),
    ] {
        if out.get(k).is_none_or(Value::is_null) {
            out.insert(k.into(), zero);
        }
    }
    out.insert("processStats".into(), Value::Null);
    out.insert("gpus".into(), json!([]));
    keep_others(&mut out, &w["other_fields"]);
    Value::Object(out)
}

/// Removes `snake` (or its camelCase spelling) from `o`.
fn take(o: &mut Map<String, Value>, snake: &str) -> Option<Value> {
    o.remove(snake).or_else(|| o.remove(&camel(snake)))
}

fn camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// `o[snake]` moved to Ray's name, `null` when protobuf left it out.
fn optional(o: &mut Map<String, Value>, snake: &str) {
    let v = take(o, snake).unwrap_or(Value::Null);
    o.insert(snake.into(), v);
}

/// A protobuf enum member written as Ray's lower-case literal (`None`: left out).
fn lower(o: &mut Map<String, Value>, snake: &str) {
    let v = match take(o, snake) {
        Some(Value::String(s)) => Value::String(s.to_ascii_lowercase()),
        Some(other) => other,
        None => Value::Null,
    };
    o.insert(snake.into(), v);
}

/// A 64-bit integer as Ray's model has it (a number), where protobuf's JSON wrote it as a
/// string (`"3"`); anything else as it is.
fn int64(v: Value) -> Value {
    match &v {
        Value::String(s) => match (s.parse::<i64>(), s.parse::<u64>()) {
            (Ok(n), _) => Value::from(n),
            (_, Ok(n)) => Value::from(n),
            _ => v,
        },
        _ => v,
    }
}

/// A map the export event wraps as `{"values": {...}}` (a protobuf message around a map),
/// unwrapped.
fn unwrap_values(v: Value) -> Value {
    match v {
        Value::Object(mut m) if m.len() == 1 && m.contains_key("values") => {
            m.remove("values").unwrap_or(Value::Null)
        }
        other => other,
    }
}

/// The `run_settings` of a run whose export event has none (Ray before 2.60 wrote none; Ray
/// 2.60's model requires them): each member as protobuf reads a message the event does not
/// hold, as [`ray_settings`] writes it (`""`, `0`, `false`, `[]`, `{}`; an optional member
/// `null`), except `checkpoint_score_order`, whose protobuf default Ray's model does not
/// accept: `"max"`, Ray's default. Such a run is counted in [`UNRECORDED_SETTINGS_HEADER`].
fn unrecorded_settings() -> Value {
    let options = json!({"resource_limits": {}, "exclude_resources": {},
        "preserve_order": false, "actor_locality_enabled": false, "verbose_progress": false});
    json!({
        "train_loop_config": null,
        "backend_config": {"framework": null, "config": {}},
        "scaling_config": {"num_workers": 0, "use_gpu": false, "resources_per_worker": null,
            "placement_strategy": "", "accelerator_type": null, "use_tpu": false,
            "topology": null, "bundle_label_selector": null},
        "datasets": [],
        "data_config": {"datasets_to_split": [], "execution_options": null,
            "data_execution_options": {"default": options, "per_dataset_execution_options": {}},
            "enable_shard_locality": false},
        "run_config": {"name": "", "failure_config": {"max_failures": 0,
            "controller_failure_limit": 0}, "worker_runtime_env": {},
            "checkpoint_config": {"num_to_keep": null, "checkpoint_score_attribute": null,
                "checkpoint_score_order": "max"},
            "storage_path": "", "storage_filesystem": null},
    })
}

/// The export event's `run_settings` in Ray's `RunSettings` shape (see [`ray_run`]); members
/// not named here are kept as they are.
fn ray_settings(settings: &Value) -> Value {
    let Value::Object(mut s) = settings.clone() else {
        return settings.clone();
    };
    optional(&mut s, "train_loop_config");
    if let Some(Value::Object(b)) = s.get_mut("backend_config") {
        let framework = match take(b, "framework") {
            Some(Value::String(f)) if f == FRAMEWORK_UNSPECIFIED => Value::Null,
            Some(Value::String(f)) => Value::String(f.to_ascii_lowercase()),
            Some(other) => other,
            None => Value::Null,
        };
        b.insert("framework".into(), framework);
    }
    if let Some(Value::Object(c)) = s.get_mut("scaling_config") {
        let fixed = take(c, "num_workers_fixed");
        let range = take(c, "num_workers_range");
        let workers = match (fixed, range) {
            (Some(n), _) => n,
            (None, Some(r)) => json!([r["min"], r["max"]]),
            (None, None) => Value::Null,
        };
        c.insert("num_workers".into(), workers);
        let per_worker = take(c, "resources_per_worker").map(unwrap_values);
        c.insert(
            "resources_per_worker".into(),
            per_worker.unwrap_or(Value::Null),
        );
        optional(c, "accelerator_type");
        optional(c, "topology");
        let single = take(c, "label_selector_single").map(unwrap_values);
        let list = take(c, "label_selector_list").map(unwrap_values);
        let selector = match (single, list) {
            (Some(one), _) => one,
            (None, Some(Value::Array(l))) => {
                Value::Array(l.into_iter().map(unwrap_values).collect())
            }
            (None, Some(other)) => other,
            (None, None) => Value::Null,
        };
        c.insert("bundle_label_selector".into(), selector);
    }
    if let Some(Value::Object(d)) = s.get_mut("data_config") {
        let all = take(d, "all");
        let named = take(d, "datasets").map(unwrap_values);
        let split = match (all, named) {
            (Some(_), _) => Value::from("all"),
            (None, Some(names)) => names,
            (None, None) => Value::Null,
        };
        d.insert("datasets_to_split".into(), split);
        optional(d, "execution_options");
    }
    if let Some(Value::Object(r)) = s.get_mut("run_config") {
        optional(r, "storage_filesystem");
        if let Some(Value::Object(c)) = r.get_mut("checkpoint_config") {
            lower(c, "checkpoint_score_order");
            optional(c, "num_to_keep");
            if let Some(n) = c.get_mut("num_to_keep") {
                *n = int64(n.take());
            }
            optional(c, "checkpoint_score_attribute");
        }
    }
    Value::Object(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_keeps_each_run_it_has_as_far_as_the_events() {
        let run = |status: &str, attempts: &[&str]| {
            json!({"id": "r1", "status": status, "start_time_ns": 1,
                   "attempts": attempts.iter().map(|s| json!({"status": s})).collect::<Vec<_>>()})
        };
        let events = |r: Value| json!({"train_runs": [r]});
        let snapshot = |r: Value| json!({"train_runs": [r], "x": 1}).to_string();
        // Ray's head aborted it; the events stop at RUNNING: the snapshot is further.
        let stored = snapshot(run("ABORTED", &["RUNNING"]));
        assert_eq!(
            further_than_snapshot(
                stored.as_bytes(),
                &events(run("RUNNING", &["RUNNING"])),
                &[]
            ),
            None
        );
        // An attempt more, an attempt ended, the run ended: the events are further.
        for (older, newer) in [
            (
                run("RUNNING", &["RUNNING"]),
                run("RESTARTING", &["ERRORED", "RUNNING"]),
            ),
            (run("RUNNING", &["RUNNING"]), run("RUNNING", &["FINISHED"])),
            (
                run("RUNNING", &["FINISHED"]),
                run("FINISHED", &["FINISHED"]),
            ),
        ] {
            let merged =
                further_than_snapshot(snapshot(older).as_bytes(), &events(newer.clone()), &[]);
            let merged = merged.unwrap();
            assert_eq!(merged["train_runs"][0]["status"], newer["status"]);
            assert_eq!(merged["x"], 1);
        }
        // Not Ray's shape (an error text): the events' runs, when there are some.
        let e = events(run("FINISHED", &[]));
        assert_eq!(
            further_than_snapshot(b"Train state data is not available", &e, &[]),
            Some(e)
        );
        assert_eq!(
            further_than_snapshot(b"error", &json!({"train_runs": []}), &[]),
            None
        );
    }

    /// A run in Ray's shape: its status, and its attempts' statuses and worker counts.
    fn shaped(status: &str, attempts: &[(&str, usize)]) -> Value {
        let attempts: Vec<Value> = attempts
            .iter()
            .enumerate()
            .map(|(i, (s, workers))| {
                json!({"status": s, "start_time_ns": 10 * i as i64 + 1,
                       "end_time_ns": TERMINAL.contains(s).then_some(10 * i as i64 + 5),
                       "workers": vec![json!({}); *workers]})
            })
            .collect();
        json!({"id": "r1", "status": status, "start_time_ns": 0, "attempts": attempts,
               "job_details": null})
    }

    #[test]
    fn a_run_goes_further_through_rays_cycle_of_attempts() {
        // Ray 2.60's controller, with a worker failing once: each state after the one before.
        let steps = [
            (shaped("INITIALIZING", &[]), false),
            (shaped("SCHEDULING", &[]), false),
            (shaped("SCHEDULING", &[("PENDING", 0)]), false),
            (shaped("SCHEDULING", &[("RUNNING", 2)]), false),
            (shaped("RUNNING", &[("RUNNING", 2)]), false),
            (shaped("RESTARTING", &[("RUNNING", 2)]), false),
            (shaped("SCHEDULING", &[("RUNNING", 2)]), true),
            (shaped("SCHEDULING", &[("ERRORED", 2)]), false),
            (
                shaped("SCHEDULING", &[("ERRORED", 2), ("PENDING", 0)]),
                false,
            ),
            (
                shaped("SCHEDULING", &[("ERRORED", 2), ("RUNNING", 2)]),
                false,
            ),
            (shaped("RUNNING", &[("ERRORED", 2), ("RUNNING", 2)]), false),
            (shaped("RUNNING", &[("ERRORED", 2), ("FINISHED", 2)]), false),
            (
                shaped("FINISHED", &[("ERRORED", 2), ("FINISHED", 2)]),
                false,
            ),
        ];
        for pair in steps.windows(2) {
            let ((before, _), (after, again)) = (&pair[0], &pair[1]);
            assert!(
                progress(after, *again) > progress(before, false),
                "{after} after {before}"
            );
            // The events further: theirs; as far: the snapshot, replayed.
            let snapshot = json!({"train_runs": [before]}).to_string();
            let events = json!({"train_runs": [after]});
            let again: Vec<String> = if *again { vec!["r1".into()] } else { vec![] };
            let merged = further_than_snapshot(snapshot.as_bytes(), &events, &again);
            assert_eq!(merged.unwrap()["train_runs"][0], *after);
            let same = json!({"train_runs": [after]}).to_string();
            assert_eq!(
                further_than_snapshot(same.as_bytes(), &events, &again),
                None
            );
            // The snapshot further (the events lost their end): the snapshot. Not told
            // apart: a snapshot `SCHEDULING` again after a restart, its attempt still
            // running, is taken for the `SCHEDULING` before `RUNNING` (the events win).
            if again.is_empty() {
                let ahead = json!({"train_runs": [after]}).to_string();
                let behind = json!({"train_runs": [before]});
                assert_eq!(further_than_snapshot(ahead.as_bytes(), &behind, &[]), None);
            }
        }
        // Same statuses, a later end time: further.
        let mut later = shaped("RUNNING", &[("ERRORED", 2)]);
        later["attempts"][0]["end_time_ns"] = json!(99);
        assert!(progress(&later, false) > progress(&shaped("RUNNING", &[("ERRORED", 2)]), false));
    }

    #[test]
    fn the_events_history_tells_a_rescheduled_run() {
        use crate::inspect::SessionFacts;
        let history = |statuses: &[&str]| {
            json!({"run_id": statuses.join("-"), "status_history":
                   statuses.iter().map(|s| json!({"status": s})).collect::<Vec<_>>()})
        };
        let facts = SessionFacts {
            train_runs: vec![
                history(&["SCHEDULING", "RUNNING", "RESTARTING", "SCHEDULING"]),
                history(&["RUNNING", "RESIZING", "SCHEDULING"]),
                history(&["INITIALIZING", "SCHEDULING"]),
                history(&["SCHEDULING"]),
            ],
            ..SessionFacts::default()
        };
        let index = super::super::index::IndexBuilder::default().finish(facts);
        assert_eq!(
            rescheduled_runs(&index),
            [
                "SCHEDULING-RUNNING-RESTARTING-SCHEDULING",
                "RUNNING-RESIZING-SCHEDULING"
            ]
        );
    }

    #[test]
    fn a_snapshot_answers_for_unreadable_events_not_for_a_load_under_way() {
        let snapshot = Bytes::from_static(b"{\"train_runs\": []}");
        let loading = (StatusCode::SERVICE_UNAVAILABLE, "still loading").into_response();
        let r = without_events(loading, snapshot.clone());
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers().get(EVENTS_UNREADABLE_HEADER).is_none());
        let failed = (StatusCode::INTERNAL_SERVER_ERROR, "loading the session").into_response();
        let r = without_events(failed, snapshot);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[EVENTS_UNREADABLE_HEADER], "true");
        assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
    }

    #[test]
    fn times_come_back_to_the_nanosecond() {
        assert_eq!(
            unix_ns(&json!("2026-11-22T02:08:25.597485314Z")),
            Some(1_795_313_305_597_485_314)
        );
        assert_eq!(
            unix_ns(&json!("2026-11-22T02:08:25.5Z")),
            Some(1_795_313_305_500_000_000)
        );
        assert_eq!(
            unix_ns(&json!("2026-11-22T02:08:25Z")),
            Some(1_795_313_305_000_000_000)
        );
        assert_eq!(unix_ns(&json!("2026-11-22T02:08:25.1234567890Z")), None);
        assert_eq!(unix_ns(&Value::Null), None);
    }

    #[test]
    fn settings_take_rays_names_and_keep_unknown_members() {
        let event = json!({
            "train_loop_config": {"lr": 0.01},
            "backend_config": {"config": {}, "framework": "TRAINING_FRAMEWORK_UNSPECIFIED"},
            "scaling_config": {"num_workers_fixed": 2, "placement_strategy": "PACK",
                               "use_gpu": false, "use_tpu": false,
                               "resources_per_worker": {"values": {"CPU": 1.0}},
                               "invented": {"deep": [1, 2]}},
            "data_config": {"all": {}, "enable_shard_locality": true},
            "run_config": {"name": "r", "checkpoint_config": {"checkpoint_score_order": "MAX",
                                                              "num_to_keep": "3"},
                           "storage_path": "/s"},
            "datasets": ["train"],
        });
        let ray = ray_settings(&event);
        assert_eq!(ray["backend_config"]["framework"], Value::Null);
        assert_eq!(ray["scaling_config"]["num_workers"], 2);
        assert!(ray["scaling_config"].get("num_workers_fixed").is_none());
        assert_eq!(
            ray["scaling_config"]["resources_per_worker"],
            json!({"CPU": 1.0})
        );
        assert_eq!(ray["scaling_config"]["accelerator_type"], Value::Null);
        assert_eq!(ray["scaling_config"]["bundle_label_selector"], Value::Null);
        assert_eq!(ray["scaling_config"]["invented"], json!({"deep": [1, 2]}));
        assert_eq!(ray["data_config"]["datasets_to_split"], "all");
        assert!(ray["data_config"].get("all").is_none());
        assert_eq!(
            ray["run_config"]["checkpoint_config"]["checkpoint_score_order"],
            "max"
        );
        assert_eq!(ray["run_config"]["checkpoint_config"]["num_to_keep"], 3);
        assert_eq!(ray["run_config"]["storage_filesystem"], Value::Null);
        assert_eq!(ray["datasets"], json!(["train"]));

        let event = json!({
            "backend_config": {"framework": "TORCH"},
            "scaling_config": {"num_workers_range": {"min": 1, "max": 4},
                               "label_selector_list": {"values": [{"values": {"a": "b"}}]}},
            "data_config": {"datasets": {"values": ["x", "y"]}},
        });
        let ray = ray_settings(&event);
        assert_eq!(ray["backend_config"]["framework"], "torch");
        assert_eq!(ray["scaling_config"]["num_workers"], json!([1, 4]));
        assert_eq!(
            ray["scaling_config"]["bundle_label_selector"],
            json!([{"a": "b"}])
        );
        assert_eq!(ray["data_config"]["datasets_to_split"], json!(["x", "y"]));
        assert_eq!(ray["train_loop_config"], Value::Null);
    }

    #[test]
    fn job_details_name_the_driver_ip_and_leave_the_unknown_null() {
        use crate::inspect::{JobFacts, NodeFacts, SessionFacts};
        let facts = SessionFacts {
            jobs: vec![JobFacts {
                job_id: "01000000".into(),
                state: "CREATED".into(),
                entrypoint: Some("python train.py".into()),
                driver_pid: Some(42),
                driver_node_id: Some("aa".into()),
                driver_ip: None,
                started: Some("2026-11-22T02:08:25.597485314Z".into()),
                ended: None,
                recorded: true,
            }],
            nodes: vec![NodeFacts {
                node_id: "aa".into(),
                ip: Some("10.0.0.7".into()),
                hostname: None,
                is_head: Some(true),
                state: None,
                started: None,
                ended: None,
                death_reason: None,
                death_message: None,
                resources: Default::default(),
            }],
            train_runs: vec![
                json!({"run_id": "old", "name": "o", "status": "FINISHED", "job_id": "01000000", "started": "2026-11-22T02:08:25Z"}),
                json!({"run_id": "new", "name": "n", "status": "RUNNING", "job_id": "02000000", "started": "2026-11-22T02:09:25Z"}),
                // Known only by its attempts: not in Ray's answer.
                json!({"run_id": "attempts-only", "name": null, "status": null, "attempts": []}),
            ],
            ..SessionFacts::default()
        };
        let index = super::super::index::IndexBuilder::default().finish(facts);
        let (answer, counts) = runs_response(&index);
        assert_eq!(counts.left_out, 1);
        assert_eq!(counts.unrecorded_settings, 2);
        let runs = answer["train_runs"].as_array().unwrap();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0]["id"], "new", "newest first");
        assert_eq!(
            runs[0]["job_details"],
            Value::Null,
            "a job the session does not know"
        );
        let job = &runs[1]["job_details"];
        assert_eq!(job["driver_info"]["node_ip_address"], "10.0.0.7");
        assert_eq!(job["driver_info"]["pid"], "42");
        assert_eq!(job["status"], "RUNNING");
        assert_eq!(job["start_time"], 1_795_313_305_597_i64);
        assert_eq!(job["driver_exit_code"], Value::Null);
        assert_eq!(job["submission_id"], Value::Null);
        assert_eq!(job["entrypoint"], "python train.py");
    }

    #[test]
    fn runs_take_rays_shape() {
        let run = json!({
            "run_id": "r1", "name": "n", "job_id": "01000000", "status": "FINISHED",
            "status_detail": null, "started": "2026-11-22T02:08:25.597485314Z",
            "ended": null, "framework_versions": {"ray": "2.60.0"},
            "run_settings": {}, "ray_train_version": 2, "controller_log_file_path": "/l",
            "controller_actor_id": "aa", "other_fields": {"schema_version": 4, "new": "x"},
            "attempts": [{
                "attempt_id": "a1", "status": "FINISHED", "status_detail": null,
                "started": "2026-11-22T02:08:26Z", "ended": "2026-11-22T02:08:27Z",
                "resources": [{"resources": {"CPU": 1.0}}], "other_fields": {"x": 1},
                "workers": [{"world_rank": 0, "actor_id": "bb", "gpu_ids": [],
                             "log_command": "inspect ...", "other_fields": {"y": 2}}],
            }],
        });
        let ray = ray_run(&run, None);
        assert_eq!(ray["id"], "r1");
        assert_eq!(ray["start_time_ns"], 1_795_313_305_597_485_314_i64);
        assert_eq!(ray["end_time_ns"], Value::Null);
        assert_eq!(ray["job_details"], Value::Null);
        assert_eq!(ray["schema_version"], 4);
        assert_eq!(ray["new"], "x");
        assert_eq!(ray["ray_train_version"], 2);
        assert!(ray.get("other_fields").is_none() && ray.get("run_id").is_none());
        let a = &ray["attempts"][0];
        assert_eq!(a["run_id"], "r1");
        assert_eq!(a["end_time_ns"], 1_795_313_307_000_000_000_i64);
        assert_eq!(a["x"], 1);
        let w = &a["workers"][0];
        assert_eq!(w["gpus"], json!([]));
        assert_eq!(w["processStats"], Value::Null);
        assert_eq!(w["y"], 2);
        assert!(w.get("log_command").is_none());
    }
}
