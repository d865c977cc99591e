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
use serde_json::Value;

use super::cookies::Entered;
use super::index::SessionIndex;
use super::replay::{find_snapshot, read_counted, read_found, Missing};
use super::session::{headers_for, index};
use super::Shared;

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
    let built = built_once(&state, &entered, tag, &index, move |wanted| async move {
        let body = match &snapshot {
            Some(meta) => match read_held(&reader, meta, &wanted).await {
                Ok(Some(body)) => Some(body),
                Ok(None) => return Err(TrainBuildError::Failed(ABANDONED.to_string())),
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

impl TrainAnswer {
    /// What the answer holds: its body (headers are a few hundred bytes).
    fn bytes(&self) -> usize {
        match self {
            TrainAnswer::Built(_, body) | TrainAnswer::Snapshot(body) => body.len(),
        }
    }
}

/// A Train snapshot read under room of [`TRAIN_SNAPSHOT_KIB`] for the size it was listed
/// with (it is read no further), returned with the bytes: the build holds the room until it
/// is done with the bytes. `None` when the build was given up: the wait for room is raced
/// against every request's leaving ([`super::kept::Wanted::left`]: it leaves the line at
/// once), and the read against [`left_while_wanted_elsewhere`], so an abandoned read gives
/// its room back after [`ABANDONED_READ_GRACE`] when another read wants it, not after a
/// stalled read (review r37q D2: 40 s).
async fn read_held(
    state: &Shared,
    meta: &ObjectMeta,
    wanted: &TrainWanted,
) -> Result<Option<(Bytes, budget::Held<'static>)>, Missing> {
    // Too large to replay: refused before it waits for any budget (review r37o D1: a 68 MiB
    // snapshot waited for the whole budget behind slow reads, then was a 502).
    if meta.size > super::replay::MAX_SNAPSHOT_BYTES {
        read_counted(state, meta, meta.size).await?;
        return Err(Missing::Unreadable(
            (
                StatusCode::BAD_GATEWAY,
                "the snapshot is larger than replayed",
            )
                .into_response(),
        ));
    }
    let kib = meta.size.div_ceil(1024);
    // The room free goes to any read it covers, the room given back to those waiting in
    // turn ([`budget`]): a big snapshot waiting holds back no small one the room left
    // covers (review r37q D1), and is not starved by them (review r37p).
    let held = tokio::select! {
        biased;
        () = wanted.left() => return Ok(None),
        held = TRAIN_SNAPSHOT_KIB.take(kib) => held,
    };
    // A read under way is given up only when nobody has waited for it for the grace AND what
    // it holds is wanted ([`left_while_wanted_elsewhere`]); until then the build stays joinable, so a client
    // that asks again (a reload, a proxy's shorter timeout) joins the read under way instead
    // of starting it over (review r37r D1: with the read given up as soon as its client left,
    // a client with a 6 s timeout against a 15 s read was never answered, however often it
    // asked).
    let body = tokio::select! {
        biased;
        () = left_while_wanted_elsewhere(wanted) => return Ok(None),
        body = read_counted(state, meta, meta.size) => body?,
    };
    Ok(Some((body, held)))
}

/// How often a read nobody waits for looks whether what it holds is wanted.
const ROOM_WANTED_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a read nobody waits for keeps what it holds, its room in [`TRAIN_SNAPSHOT_KIB`]
/// and its slot of the builds under way ([`CONCURRENT_TRAIN_BUILDS_UNDER_WAY`]), while
/// another read waits for room or a request of another session for a slot: a client that
/// asks again within it (one whose timeout is shorter than the read, asking again after a
/// pause) rejoins the read under way. Longer than such a client's pause (review r37t: reads
/// given up as soon as every slot was taken were started over, again and again, by clients
/// asking every 2 to 3 s; review r37v D1: the same with the room, reads given up at once
/// whenever another waited for room, 3 of 10 sessions answered in 60 s), short enough that a
/// read or a session waiting behind abandoned reads is answered in seconds, not after them
/// (review r37s D1: 36 s; review r37q D2: 40 s).
pub const ABANDONED_READ_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Completes when every request for the read has left, nobody has waited for it for
/// [`ABANDONED_READ_GRACE`] on end, and what it holds is wanted elsewhere: another read
/// waits for room in [`TRAIN_SNAPSHOT_KIB`] (a read waiting in line always has a request
/// waiting for it: it leaves the line when its last request leaves), or a request of another
/// session waits for a slot of the builds under way ([`super::kept::Wanted::slot_wanted`];
/// review r37s D1: 32 abandoned stalled reads held every slot, and a session with no
/// snapshot waited 36 s). The build is then out of the builds under way. A request that
/// joins meanwhile starts the grace over.
async fn left_while_wanted_elsewhere(wanted: &TrainWanted) {
    loop {
        wanted.nobody_waits().await;
        let left = tokio::time::Instant::now();
        while !wanted.somebody_waits() {
            if left.elapsed() >= ABANDONED_READ_GRACE {
                let room = TRAIN_SNAPSHOT_KIB.someone_waits();
                let slot = !room && wanted.slot_wanted();
                if (room || slot) && wanted.abandoned() {
                    tracing::debug!(
                        for_room = room,
                        for_slot = slot,
                        "a Train snapshot read nobody waited for during the grace gives way"
                    );
                    return;
                }
            }
            tokio::time::sleep(ROOM_WANTED_EVERY).await;
        }
    }
}

/// The error of a build every request left before it read or built (answered to nobody).
const ABANDONED: &str = "every request for this answer left";

/// What a Train build is given to tell whether a request still waits for it.
type TrainWanted = super::kept::Wanted<TrainAnswer, TrainBuildError>;

/// KiB of Train snapshots held at once, being read or waiting for their build
/// ([`TRAIN_COMPUTE`]): 4 × [`super::replay::MAX_SNAPSHOT_BYTES`] (256 MiB), apart from the
/// replays' [`super::MAX_CONCURRENT_READS`]. Charged by the size each was listed with, so a
/// stalled read of a small snapshot holds only that (review r37n: a snapshot read let go of
/// its permit while it waited for the build, and 12 sessions held 731 MiB; and Train reads
/// took the replays' permits, so four slow ones held every session's
/// `/api/v0/cluster_metadata`).
pub const TRAIN_SNAPSHOTS_KIB: usize = 4 * 64 * 1024;

/// Test only: [`TRAIN_SNAPSHOTS_KIB`] in KiB, so a test fills the room with a few small
/// snapshots instead of 60 MiB ones. Not a setting.
pub const TEST_TRAIN_SNAPSHOTS_KIB: &str = "RHC_TEST_TRAIN_SNAPSHOTS_KIB";

/// The room of [`TRAIN_SNAPSHOTS_KIB`] (or the test's, [`TEST_TRAIN_SNAPSHOTS_KIB`]), in KiB,
/// in the order [`budget`] keeps.
static TRAIN_SNAPSHOT_KIB: std::sync::LazyLock<budget::Budget> = std::sync::LazyLock::new(|| {
    let kib = std::env::var(TEST_TRAIN_SNAPSHOTS_KIB)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(TRAIN_SNAPSHOTS_KIB as u64);
    budget::Budget::new(kib)
});

/// Train answers built at once: a big session's answer takes hundreds of MiB while it is
/// built, and a blocking task cannot be stopped when its client leaves (review r37j D1: every
/// concurrent request built its own copy, 230 MiB each, and 12 abandoned requests took serve
/// to 3.3 GiB). Requests about the same session share one build ([`super::kept`]). Only the
/// building is one at a time ([`TRAIN_COMPUTE`]): reading a session's snapshot first is not,
/// so a slow read of one session's snapshot does not hold every other session's Train answer
/// (review r37m D1: a snapshot GET held 100 s held another session's answer 99 s); the reads
/// are bounded by [`TRAIN_SNAPSHOTS_KIB`], and a session without a snapshot takes none
/// of those (review r37n D1: eight slow reads held a session with no snapshot 28 s).
pub const CONCURRENT_TRAIN_BUILDS: usize = 1;

/// The permits of [`CONCURRENT_TRAIN_BUILDS`]: taken after the snapshot is read, held by the
/// blocking build.
static TRAIN_COMPUTE: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(CONCURRENT_TRAIN_BUILDS);

/// Builds under way at once in [`TrainAnswers`] (each a different session's, or another
/// snapshot's): each holds no more than its index (held anyway) until it takes
/// room in [`TRAIN_SNAPSHOT_KIB`] or the build's permit ([`TRAIN_COMPUTE`]), so they are many, and
/// sessions without a snapshot do not wait behind slow reads of others'.
const CONCURRENT_TRAIN_BUILDS_UNDER_WAY: usize = 32;

/// Train answers kept at most (one per session, the oldest dropped first, each only while the
/// session's index is held): twice the builds under way, so the answers of every build that
/// ends while its clients are away (a timeout shorter than the read, a pause, then the same
/// ask again) are still kept when they ask again (review r37s D2: a finished read thrown
/// away, or its answer dropped, is read again at the next ask). Within
/// [`KEPT_TRAIN_ANSWER_BYTES`].
pub const KEPT_TRAIN_ANSWERS: usize = 2 * CONCURRENT_TRAIN_BUILDS_UNDER_WAY;

/// Bytes of Train answers kept at most (the newest is kept even alone over it): one of the
/// largest snapshots replayed ([`super::replay::MAX_SNAPSHOT_BYTES`]); before, two answers of
/// any size were kept. An answer is much smaller than its build's peak: 10 MB for 100 runs of
/// 4 attempts of 64 workers (tests/inspect_train_runs.rs), a few KiB for a few runs.
pub const KEPT_TRAIN_ANSWER_BYTES: usize = super::replay::MAX_SNAPSHOT_BYTES as usize;

/// The Train answers built, and the permits to build one.
pub(crate) type TrainAnswers = super::kept::Kept<TrainAnswer, TrainBuildError>;

/// A new [`TrainAnswers`].
pub(crate) fn train_answers() -> Arc<TrainAnswers> {
    Arc::new(
        super::kept::Kept::new(CONCURRENT_TRAIN_BUILDS_UNDER_WAY, KEPT_TRAIN_ANSWERS, None)
            .weighed(KEPT_TRAIN_ANSWER_BYTES, TrainAnswer::bytes),
    )
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
    read: impl FnOnce(Arc<TrainWanted>) -> R + Send + 'static,
) -> Result<Arc<TrainAnswer>, TrainBuildError>
where
    R: std::future::Future<
            Output = Result<Option<(Bytes, budget::Held<'static>)>, TrainBuildError>,
        > + Send
        + 'static,
{
    let key = entered.session.marker_key(&state.bucket.spec.root);
    let session = entered.session.session.clone();
    let for_build = index.clone();
    state
        .train_answers
        .get_or_build(key, tag, index, move |wanted| async move {
            let wanted = Arc::new(wanted);
            // The snapshot's permit is held until the build is done with its bytes.
            let (snapshot, held) = read(wanted.clone()).await?.unzip();
            let abandoned = || Err(TrainBuildError::Failed(ABANDONED.to_string()));
            // Closed never (the semaphore is static); held by the blocking build.
            let permit = if snapshot.is_some() {
                // A snapshot read: built and kept even if every request left meanwhile (a
                // client whose timeout is shorter than the read, pausing before it asks
                // again, is answered from the kept answer; review r37s D2: the read thrown
                // away was started over at each ask, and such a client never answered). With
                // its bytes in hand it needs only the build's permit, so it keeps its room
                // until built, wanted elsewhere or not (review r37v D1: a read that had
                // ended was thrown away when another waited for room, and read again).
                TRAIN_COMPUTE.acquire().await.ok()
            } else {
                // Nothing read: raced against the requests' leaving, and nothing built when
                // every request left while it waited (review r37o D2).
                let permit = tokio::select! {
                    permit = TRAIN_COMPUTE.acquire() => permit.ok(),
                    () = wanted.left() => return abandoned(),
                };
                if wanted.abandoned() {
                    return abandoned();
                }
                permit
            };
            let started = std::time::Instant::now();
            let built = tokio::task::spawn_blocking(move || {
                let _permits = (permit, held);
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
                session = %crate::util::escape::escape_untrusted(&session),
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
mod budget;
mod shape;
#[cfg(test)]
mod tests;

use shape::{runs_response, Counts};
