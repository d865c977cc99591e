//! The poller: which endpoints are asked when (one-shot per session, periodic, the jobs'
//! datasets, the extra ones), what is stored under which key, and what is left alone
//! (unchanged bodies, empty answers the history server must not see, answers that are not of
//! the endpoint's shape, see [`super::answer`]).
//!
//! Each answer is applied (recorded as uploaded, one-shot done, dataset captured) as soon as
//! it completes, not when its whole poll ends: a poll abandoned at shutdown because one
//! endpoint hangs keeps what the others did, so the final poll does not ask them again.
//!
//! Each upload runs as a task of its own that holds its URI's [`Lane`] until the store has
//! answered and the upload has settled what is known of the bucket (the lane's last
//! snapshot, the spool's [`SnapshotRecord`]): a poll abandoned at SIGTERM does not abandon
//! its uploads half-way, and the final poll's answer for a URI is compared, and uploaded,
//! only once the earlier upload of that URI has landed or failed (waiting at most
//! [`FINAL_POLL_UPLOAD_WAIT`], or a quarter of the time left before the shutdown deadline),
//! so no earlier, worse list lands after it (review r41e D3).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::sync::watch;

use super::answer::{self, Expect, ListedJob, Refusal};
use super::client::{build_client, fetch, Body, BodyBudget, SMALL_BODY_BYTES};
use super::config::DashboardConfig;
use super::record::{Recorded, SnapshotRecord};
use super::{
    DashboardError, DATASETS_PREFIX, FINAL_POLL_UPLOAD_WAIT, JOBS_ENDPOINT,
    MAX_CONCURRENT_REQUESTS, ONE_SHOT_ENDPOINTS, ONE_SHOT_FIRST_RETRY, PERIODIC_ENDPOINTS,
    TERMINAL_EMPTY_POLLS_BEFORE_GIVING_UP,
};
use crate::contract::{self, is_safe_segment, ClusterLayout};
use crate::metrics as m;
use crate::node::session::ActiveSession;

/// What one poll did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PollReport {
    /// Answers received in full (2xx, within the size cap), the job list included.
    pub fetched: usize,
    /// Snapshots written to the bucket.
    pub uploaded: usize,
    /// Snapshots identical to the last upload of the same URI in this session, not rewritten.
    pub unchanged: usize,
    /// Answers not stored because they hold nothing (a Ray Data answer without datasets, a
    /// Serve answer without applications on the final poll).
    pub empty: usize,
    /// Request URI and reason of every answer not stored because it is not JSON of the
    /// endpoint's shape, says `"result": false`, or (final poll) lists less than the snapshot
    /// already stored.
    pub refused: Vec<(String, String)>,
    /// Request URI and reason of every request or upload that failed.
    pub failed: Vec<(String, String)>,
}

/// Why an endpoint is polled: the `endpoint_kind` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    OneShot,
    Periodic,
    Datasets,
    Additional,
    JobList,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::OneShot => "one_shot",
            Kind::Periodic => "periodic",
            Kind::Datasets => "datasets",
            Kind::Additional => "additional",
            Kind::JobList => "job_list",
        }
    }
}

/// What a poll asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// A live poll: every endpoint.
    Live,
    /// The final poll at SIGTERM: every endpoint, and no list replaced by a shorter one.
    Final,
    /// A quick retry of the one-shot endpoints not stored yet.
    OneShots,
}

/// The quick retries of the one-shot endpoints of a session.
#[derive(Debug, Default, Clone, Copy)]
struct Retry {
    /// The next one, if any.
    at: Option<tokio::time::Instant>,
    /// The last wait: the next is twice as long.
    last: Option<Duration>,
}

/// Resolves at `at`; never when there is none.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The shape an endpoint's answer must have to be stored.
fn expected(kind: Kind, uri: &str) -> Expect {
    match kind {
        Kind::Datasets => Expect::ObjectList("datasets"),
        Kind::Additional | Kind::JobList => Expect::Any,
        Kind::OneShot => Expect::Object,
        Kind::Periodic if uri == PERIODIC_ENDPOINTS[0] => Expect::ObjectList("applications"),
        Kind::Periodic => Expect::StateList,
    }
}

/// One endpoint to fetch and store in this poll.
struct Target {
    uri: String,
    kind: Kind,
    /// For datasets: the job was finished when listed.
    terminal: bool,
}

/// What is remembered of an uploaded snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Snapshot {
    /// xxh3-128 of the body.
    hash: u128,
    /// Length of its list, when the endpoint has one.
    list_len: Option<usize>,
}

/// The uploads of one URI in one session, one at a time: an upload task holds its lane
/// (`tokio::sync::Mutex`) from before its write-ahead until the store has answered and the
/// upload has settled this and the spool's record, so whoever takes the lane next knows
/// what the bucket holds, and its own upload lands after the earlier one.
#[derive(Debug, Default)]
struct Lane {
    /// The last snapshot this process stored; `None` when none, or when the outcome of the
    /// last upload is unknown (it may land yet).
    last: Option<Snapshot>,
}

/// The lanes of a session, by request URI; shared with the upload tasks.
type Lanes = std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Lane>>>>;

fn lane_of(lanes: &Lanes, uri: &str) -> Arc<tokio::sync::Mutex<Lane>> {
    // A panic while holding the lock leaves a consistent map (every change is one insert).
    let mut map = lanes.lock().unwrap_or_else(|p| p.into_inner());
    map.entry(uri.to_string()).or_default().clone()
}

/// What this process knows of an earlier snapshot of a URI in the bucket.
enum Known {
    /// Its last upload was stored.
    Stored,
    /// An upload is in flight.
    InFlight,
    /// It stored none, or the outcome of its last upload is unknown.
    Nothing,
}

fn known(lanes: &Lanes, uri: &str) -> Known {
    let map = lanes.lock().unwrap_or_else(|p| p.into_inner());
    let Some(lane) = map.get(uri) else {
        return Known::Nothing;
    };
    let known = match lane.try_lock() {
        Ok(lane) if lane.last.is_some() => Known::Stored,
        Ok(_) => Known::Nothing,
        Err(_) => Known::InFlight,
    };
    known
}

/// Resolves when no upload of `lanes` is in flight, or at `until`.
async fn settled(lanes: &Lanes, until: tokio::time::Instant) {
    let all: Vec<_> = {
        let map = lanes.lock().unwrap_or_else(|p| p.into_inner());
        map.values().cloned().collect()
    };
    for lane in all {
        if tokio::time::timeout_at(until, lane.lock()).await.is_err() {
            return;
        }
    }
}

/// What happened to one endpoint.
enum Stored {
    Uploaded,
    Unchanged,
    Empty,
    Refused(Refusal),
}

/// A target after its poll: the body size and what was done with it, or why it failed.
type Done = (Target, Result<(usize, Stored), DashboardError>);

/// Per-session memory; replaced as a whole when the session changes.
#[derive(Default)]
struct SessionState {
    session: String,
    one_shot_done: HashSet<String>,
    /// The uploads, by request URI: the last snapshot stored, and the upload in flight.
    lanes: Arc<Lanes>,
    /// Finished jobs whose datasets snapshot is stored: not asked again.
    datasets_final: HashSet<String>,
    /// Finished jobs answering without datasets, and how many times.
    terminal_empty: HashMap<String, u32>,
}

/// What the requests of a poll need, shared by the requests in flight (which must not borrow
/// the poller: it records each answer as it completes).
struct Fetcher {
    base: String,
    client: reqwest::Client,
    timeout: std::time::Duration,
    /// The token (or the file it is read from for every request) goes with each request.
    cfg: DashboardConfig,
    store: Arc<dyn ObjectStore>,
    prefix: String,
    budget: BodyBudget,
}

/// Polls the head's dashboard and stores its answers; owned by one task.
pub struct DashboardPoller {
    cfg: DashboardConfig,
    fetcher: Arc<Fetcher>,
    state: SessionState,
    /// Last failure or refusal reason by URI, so a dashboard that stays down is logged once,
    /// not per tick.
    failing: HashMap<String, String>,
    /// What the bucket holds for the session, kept in the spool across restarts; shared with
    /// the uploads in flight, which write their entries ahead and settle them.
    record: Arc<SnapshotRecord>,
    /// How long the final poll waits for the uploads still in flight (see [`Self::poll_final`]).
    final_wait: Duration,
}

impl DashboardPoller {
    /// Checks the configuration and builds the HTTP client; no request is made yet.
    pub fn new(
        cfg: DashboardConfig,
        store: Arc<dyn ObjectStore>,
        layout: ClusterLayout,
    ) -> Result<Self, DashboardError> {
        let base = cfg.validate()?;
        let client = build_client(&cfg)?;
        let fetcher = Arc::new(Fetcher {
            base,
            client,
            timeout: cfg.request_timeout,
            cfg: cfg.clone(),
            store,
            prefix: layout.history_prefix(),
            budget: BodyBudget::new(),
        });
        Ok(DashboardPoller {
            cfg,
            fetcher,
            state: SessionState::default(),
            failing: HashMap::new(),
            record: Arc::new(SnapshotRecord::in_memory()),
            final_wait: FINAL_POLL_UPLOAD_WAIT,
        })
    }

    /// Keeps the record of the snapshots stored (list length and size per URI) in
    /// `spool_dir`, and reads the one an earlier run left there: the final poll after a
    /// restart compares with it without reading the bucket (see [`super::record`]).
    /// `storage` is the storage URL: with the history prefix it names where the snapshots go,
    /// and a record of another place is not used.
    pub fn with_record_in(mut self, spool_dir: &std::path::Path, storage: &str) -> Self {
        let place = format!("{storage} {}", self.fetcher.prefix);
        self.record = Arc::new(SnapshotRecord::load(spool_dir, &place));
        self
    }

    /// The object key of the snapshot of `uri` in `session`.
    pub fn object_key(&self, session: &str, uri: &str) -> String {
        self.fetcher.object_key(session, uri)
    }

    /// Polls until `shutdown` becomes true (or its sender is dropped): one-shot endpoints once
    /// per session, periodic ones every interval. A one-shot endpoint that failed (Ray's
    /// dashboard starts after the collector on a fresh pod) is asked again alone after
    /// [`ONE_SHOT_FIRST_RETRY`], then twice as long each time while that stays shorter than
    /// the poll interval, then on the ticks (KubeRay gives up on 401/403, we keep trying).
    /// Follows `sessions`: a new session resets the one-shot state, its retries and the
    /// change-detection cache and is polled at once. A poll in flight when shutdown comes is
    /// abandoned (what it had done is kept); the caller then runs [`Self::poll_once`].
    pub async fn run(
        &mut self,
        mut sessions: watch::Receiver<Option<ActiveSession>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(self.cfg.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sessions_open = true;
        let mut retry = Retry::default();
        loop {
            if *shutdown.borrow() {
                return;
            }
            let scope = tokio::select! {
                biased;
                _ = wait_for_shutdown(&mut shutdown) => return,
                changed = sessions.changed(), if sessions_open => {
                    match changed {
                        Ok(()) => {
                            tick.reset_immediately();
                            retry = Retry::default();
                        }
                        // The watcher is gone: keep polling the last session known.
                        Err(_) => sessions_open = false,
                    }
                    continue;
                }
                _ = tick.tick() => Scope::Live,
                _ = sleep_until(retry.at) => {
                    retry.at = None;
                    Scope::OneShots
                }
            };
            let Some(session) = sessions.borrow_and_update().clone() else {
                continue;
            };
            tokio::select! {
                biased;
                _ = wait_for_shutdown(&mut shutdown) => return,
                report = self.poll(&session.name, scope) => {
                    self.next_retry(&mut retry);
                    tracing::debug!(
                        session = %session.name,
                        fetched = report.fetched,
                        uploaded = report.uploaded,
                        unchanged = report.unchanged,
                        refused = report.refused.len(),
                        failed = report.failed.len(),
                        "dashboard poll done"
                    );
                }
            }
        }
    }

    /// One full poll of every endpoint for `session`, meant for the final poll at SIGTERM
    /// under the caller's deadline (dropping the future abandons it safely; uploads already
    /// started run on). One-shot endpoints already stored for this session are not fetched
    /// again; an answer whose list is shorter than the snapshot already stored (a dashboard
    /// shutting down), or a Serve answer without applications, does not replace the last
    /// snapshot. An upload of the same URI still in flight (a live poll's, abandoned at
    /// SIGTERM) is waited for first, at most [`FINAL_POLL_UPLOAD_WAIT`] from the start of
    /// this poll: then what it did is known, and it cannot land after this poll's upload;
    /// if it is still in flight then, this answer is not stored (reported as failed).
    /// "Already stored" is what the bucket holds: the last upload of this process, or, when
    /// it has made none for that URI (after a restart, or after an upload whose answer never
    /// came), what the spool's record says is stored, or, when the record has nothing for
    /// it or only the figures of an upload of unknown outcome, the object read back from the
    /// bucket (a read answering 403, as a GET of a missing key without `s3:ListBucket` does,
    /// means nothing known: the answer is stored, unless the record's uncertain figures
    /// are longer). The price: a shorter list from a cluster that really removed an
    /// application or placement group since the last live poll looks the same and is not
    /// stored either, so the history server shows the removed entry as that poll saw it
    /// (see the trade-off in docs/dashboard-snapshots.md).
    pub async fn poll_once(&mut self, session: &str) -> PollReport {
        self.poll(session, Scope::Final).await
    }

    /// [`Self::poll_once`] for a shutdown that must end by `deadline`: the uploads still in
    /// flight are waited for at most a quarter of the time left (and at most
    /// [`FINAL_POLL_UPLOAD_WAIT`]), leaving the rest to this poll's own requests and uploads.
    pub async fn poll_final(
        &mut self,
        session: &str,
        deadline: tokio::time::Instant,
    ) -> PollReport {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.final_wait = (left / 4).min(FINAL_POLL_UPLOAD_WAIT);
        let report = self.poll(session, Scope::Final).await;
        self.final_wait = FINAL_POLL_UPLOAD_WAIT;
        report
    }

    /// When to ask the one-shot endpoints again after a poll: not at all once they are all
    /// stored; else after [`ONE_SHOT_FIRST_RETRY`], then twice the last wait, as long as that
    /// is shorter than the poll interval (from then on only the ticks ask them).
    fn next_retry(&self, retry: &mut Retry) {
        let pending = ONE_SHOT_ENDPOINTS
            .iter()
            .any(|u| !self.state.one_shot_done.contains(*u));
        if !pending {
            *retry = Retry::default();
            return;
        }
        let wait = retry
            .last
            .map_or(ONE_SHOT_FIRST_RETRY, |w| w.saturating_mul(2));
        retry.last = Some(wait);
        retry.at = (wait < self.cfg.poll_interval).then(|| tokio::time::Instant::now() + wait);
    }

    fn enter_session(&mut self, session: &str) {
        if self.state.session != session {
            if !self.state.session.is_empty() {
                tracing::info!(
                    from = %self.state.session,
                    to = %session,
                    "new Ray session: dashboard snapshots start over under the new session"
                );
            }
            self.state = SessionState {
                session: session.to_string(),
                ..SessionState::default()
            };
            self.failing.clear();
        }
        self.record.enter_session(session);
    }

    async fn poll(&mut self, session: &str, scope: Scope) -> PollReport {
        let final_poll = scope == Scope::Final;
        let mut report = PollReport::default();
        if !is_safe_segment(session) {
            report.failed.push((
                String::new(),
                format!("session name {session:?} is not a safe path segment"),
            ));
            return report;
        }
        self.enter_session(session);
        // What the uploads settled since the last poll is written before this one.
        self.record.save().await;

        let mut targets = Vec::new();
        for uri in ONE_SHOT_ENDPOINTS {
            if !self.state.one_shot_done.contains(uri) {
                targets.push(self.target(uri.to_string(), Kind::OneShot, false));
            }
        }
        if scope != Scope::OneShots {
            for uri in PERIODIC_ENDPOINTS {
                targets.push(self.target(uri.to_string(), Kind::Periodic, false));
            }
            for uri in &self.cfg.additional_endpoints {
                targets.push(self.target(uri.clone(), Kind::Additional, false));
            }
        }

        // The static endpoints and the job list at once; the jobs' datasets join as soon as the
        // list arrives (a hanging endpoint does not hold them back); each answer is recorded
        // as it comes.
        enum Step {
            One(Done),
            Jobs(Result<Vec<ListedJob>, DashboardError>),
        }
        type Steps<'a> = std::pin::Pin<Box<dyn futures::Stream<Item = Step> + Send + 'a>>;
        // The final poll waits for the uploads still in flight until the same moment, for
        // every URI.
        let waits_until = final_poll.then(|| tokio::time::Instant::now() + self.final_wait);
        let ctx = Arc::new(StoreCtx {
            fetcher: self.fetcher.clone(),
            record: self.record.clone(),
            lanes: self.state.lanes.clone(),
            session: session.to_string(),
            final_poll,
            waits_until,
        });
        let mut steps: futures::stream::SelectAll<Steps<'_>> = futures::stream::SelectAll::new();
        steps.push(Box::pin(store_all(ctx.clone(), targets).map(Step::One)));
        if scope != Scope::OneShots {
            let fetcher = self.fetcher.clone();
            steps.push(Box::pin(
                futures::stream::once(async move { fetcher.list_jobs().await }).map(Step::Jobs),
            ));
        }
        while let Some(step) = steps.next().await {
            match step {
                Step::One(done) => self.apply(done, &mut report),
                Step::Jobs(Ok(jobs)) => {
                    report.fetched += 1;
                    self.succeeded(JOBS_ENDPOINT, Kind::JobList, "ok");
                    let datasets = self.datasets_targets(jobs, final_poll);
                    steps.push(Box::pin(store_all(ctx.clone(), datasets).map(Step::One)));
                }
                Step::Jobs(Err(e)) => self.failed(JOBS_ENDPOINT, Kind::JobList, &e, &mut report),
            }
        }
        drop(steps);
        if let Some(until) = waits_until {
            // Uploads of URIs this poll did not ask (an abandoned live poll's) settle too,
            // within the same wait, so the record written next says what they did.
            settled(&self.state.lanes, until).await;
        }
        self.record.save().await;
        report
    }

    /// The datasets endpoints worth asking for the listed jobs.
    fn datasets_targets(&self, listed: Vec<ListedJob>, final_poll: bool) -> Vec<Target> {
        let mut targets = Vec::new();
        for job in listed {
            if job.terminal && self.state.datasets_final.contains(&job.job_id) {
                continue;
            }
            let empties = self
                .state
                .terminal_empty
                .get(&job.job_id)
                .copied()
                .unwrap_or(0);
            if job.terminal && !final_poll && empties >= TERMINAL_EMPTY_POLLS_BEFORE_GIVING_UP {
                continue;
            }
            let uri = format!("{DATASETS_PREFIX}{}", job.job_id);
            targets.push(self.target(uri, Kind::Datasets, job.terminal));
        }
        targets
    }

    fn target(&self, uri: String, kind: Kind, terminal: bool) -> Target {
        Target {
            uri,
            kind,
            terminal,
        }
    }

    /// Records what was done with one endpoint: in the session's state, the report, the
    /// metrics and (on a change of state) the log.
    fn apply(&mut self, (t, r): Done, report: &mut PollReport) {
        let (bytes, stored) = match r {
            Ok(done) => done,
            Err(e) => return self.failed(&t.uri, t.kind, &e, report),
        };
        report.fetched += 1;
        let outcome = match stored {
            Stored::Uploaded => {
                // The upload settled the lane and the record itself.
                report.uploaded += 1;
                tracing::debug!(uri = %t.uri, bytes, "dashboard snapshot uploaded");
                "ok"
            }
            Stored::Unchanged => {
                report.unchanged += 1;
                "unchanged"
            }
            Stored::Empty => {
                report.empty += 1;
                "empty"
            }
            Stored::Refused(why) => return self.refused(&t, why, bytes, report),
        };
        let captured = outcome != "empty";
        if t.kind == Kind::OneShot && captured {
            self.state.one_shot_done.insert(t.uri.clone());
        }
        if t.kind == Kind::Datasets && t.terminal {
            if captured {
                self.state.datasets_final.insert(job_of(&t.uri));
            } else {
                *self.state.terminal_empty.entry(job_of(&t.uri)).or_default() += 1;
            }
        }
        self.succeeded(&t.uri, t.kind, outcome);
    }

    fn succeeded(&mut self, uri: &str, kind: Kind, outcome: &'static str) {
        m::dashboard_request(kind.label(), outcome);
        m::dashboard_success();
        if let Some(reason) = self.failing.remove(uri) {
            tracing::info!(uri, previously = %reason, "dashboard endpoint answers again");
        }
    }

    /// An answer that came but is not stored: counted, logged on a change of reason, and the
    /// endpoint is asked again next time (a one-shot endpoint is not marked done).
    fn refused(&mut self, t: &Target, why: Refusal, bytes: usize, report: &mut PollReport) {
        m::dashboard_request(t.kind.label(), "refused");
        m::dashboard_refused(t.kind.label(), why.code());
        let reason = refusal_text(why);
        if self.failing.get(&t.uri).map(String::as_str) != Some(reason) {
            // What the bucket holds for it, as far as this process knows: a longer list
            // (the reason of a shorter one), something this process or the record knows
            // stored, maybe something (an upload of unknown outcome, a read that failed),
            // or nothing (review r41g D1: "kept=true" was logged with nothing stored).
            let recorded = self.record.get(&t.uri);
            let stored = match known(&self.state.lanes, &t.uri) {
                _ if why == Refusal::SmallerList => "yes",
                _ if why == Refusal::StoredUnknown => "unknown",
                Known::Stored => "yes",
                Known::InFlight => "unknown",
                Known::Nothing => match recorded {
                    Some(r) if r.uncertain => "unknown",
                    Some(_) => "yes",
                    None => "no",
                },
            };
            tracing::warn!(
                uri = %t.uri,
                reason,
                bytes,
                stored,
                "dashboard answer not stored; what the bucket holds for it (if anything) stays"
            );
            self.failing.insert(t.uri.clone(), reason.to_string());
        }
        report.refused.push((t.uri.clone(), reason.to_string()));
    }

    fn failed(&mut self, uri: &str, kind: Kind, e: &DashboardError, report: &mut PollReport) {
        m::dashboard_request(kind.label(), e.outcome());
        let reason = e.to_string();
        if self.failing.get(uri) != Some(&reason) {
            // Logged when an endpoint starts failing or fails differently, not every tick.
            let detail = std::error::Error::source(e).map(|s| s.to_string());
            let retry = if kind == Kind::OneShot {
                "within seconds, then on the ticks"
            } else {
                "on the next tick"
            };
            tracing::warn!(
                uri,
                address = %self.fetcher.base,
                reason = %reason,
                detail = detail.as_deref().unwrap_or(""),
                retry,
                "dashboard snapshot failed; retrying"
            );
            self.failing.insert(uri.to_string(), reason.clone());
        }
        report.failed.push((uri.to_string(), reason));
    }
}

/// The reason of a refusal, as reported and logged.
fn refusal_text(why: Refusal) -> &'static str {
    match why {
        Refusal::NotJson => "not JSON",
        Refusal::WrongShape => "JSON of an unexpected shape",
        Refusal::ResultFalse => "the dashboard reports a failure (\"result\": false)",
        Refusal::SmallerList => "final poll: a shorter list than the stored snapshot",
        Refusal::StoredUnknown => "final poll: the stored snapshot could not be read back",
    }
}

/// What the requests and uploads of one poll share.
struct StoreCtx {
    fetcher: Arc<Fetcher>,
    record: Arc<SnapshotRecord>,
    lanes: Arc<Lanes>,
    session: String,
    final_poll: bool,
    /// The final poll: until when it waits for an upload of the same URI still in flight.
    waits_until: Option<tokio::time::Instant>,
}

/// Fetches and stores `targets`, a few at a time, yielding each target with its result as
/// soon as it completes.
fn store_all(ctx: Arc<StoreCtx>, targets: Vec<Target>) -> impl futures::Stream<Item = Done> {
    futures::stream::iter(targets)
        .map(move |t| {
            let ctx = ctx.clone();
            async move {
                let r = ctx.store_one(&t).await;
                (t, r)
            }
        })
        .buffer_unordered(MAX_CONCURRENT_REQUESTS)
}

/// What the bucket holds under a snapshot's key, as far as the final poll's rule needs it.
enum InBucket {
    Nothing,
    /// A small object, read: its hash, and its list's length if it has the endpoint's shape.
    Read(Snapshot),
    /// An object larger than [`SMALL_BODY_BYTES`], not read (the answer may hold the one
    /// large-body permit): its size in bytes.
    Large(u64),
}

impl Fetcher {
    fn object_key(&self, session: &str, uri: &str) -> String {
        contract::endpoints::endpoint_key(&self.prefix, session, uri)
    }

    async fn get(&self, uri: &str) -> Result<Body, DashboardError> {
        fetch(
            &self.client,
            &self.base,
            uri,
            self.timeout,
            &self.cfg,
            &self.budget,
        )
        .await
    }

    /// Fetches the job list and keeps the jobs whose datasets are worth asking for.
    async fn list_jobs(&self) -> Result<Vec<ListedJob>, DashboardError> {
        let body = self.get(JOBS_ENDPOINT).await?;
        let list = answer::parse_jobs(&body)?;
        if let Some(first) = &list.first_rejected {
            tracing::warn!(
                count = list.rejected,
                first = ?first,
                "the dashboard listed job ids that are not hex; their datasets are not fetched"
            );
        }
        Ok(list.jobs)
    }

    /// Reads what the bucket holds at `path` (the snapshot of `t`), when it is at most
    /// [`SMALL_BODY_BYTES`]: the final poll compares its answer with it when neither this
    /// process nor the spool's record knows what is stored there. A failed read (a 403 for a
    /// missing key on S3 without `s3:ListBucket`) is the caller's to judge.
    async fn in_bucket(
        &self,
        key: &str,
        path: &ObjectPath,
        t: &Target,
    ) -> Result<InBucket, DashboardError> {
        let failed = |source| DashboardError::ReadStored {
            key: key.to_string(),
            source,
        };
        let got = match self.store.get(path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(InBucket::Nothing),
            Err(e) => return Err(failed(e)),
        };
        let size = got.meta.size;
        if size > SMALL_BODY_BYTES as u64 {
            // Dropping the answer abandons its body unread.
            return Ok(InBucket::Large(size));
        }
        let bytes = got.bytes().await.map_err(failed)?;
        let list_len = answer::check(&bytes, expected(t.kind, &t.uri))
            .ok()
            .and_then(|c| c.list_len);
        Ok(InBucket::Read(Snapshot {
            hash: xxhash_rust::xxh3::xxh3_128(&bytes),
            list_len,
        }))
    }
}

impl StoreCtx {
    /// Fetches one endpoint and uploads its body if it is of the endpoint's shape, holds
    /// something, and differs from the last snapshot; returns the body size and what was done.
    async fn store_one(&self, t: &Target) -> Result<(usize, Stored), DashboardError> {
        let final_poll = self.final_poll;
        let body = self.fetcher.get(&t.uri).await?;
        let n = body.len();
        let checked = match answer::check(&body, expected(t.kind, &t.uri)) {
            Ok(c) => c,
            Err(why) => return Ok((n, Stored::Refused(why))),
        };
        let empty = checked.list_len == Some(0)
            && (t.kind == Kind::Datasets || (final_poll && t.uri == PERIODIC_ENDPOINTS[0]));
        if empty {
            return Ok((n, Stored::Empty));
        }
        let key = self.fetcher.object_key(&self.session, &t.uri);
        let path = ObjectPath::parse(&key).map_err(|source| DashboardError::BadKey {
            key: key.clone(),
            source,
        })?;
        // An upload of this URI still in flight (a live poll's, abandoned at SIGTERM) settles
        // first: then what the bucket holds is known, and it cannot land after this one.
        let lane = lane_of(&self.lanes, &t.uri);
        let lane = match self.waits_until {
            None => lane.lock_owned().await,
            Some(until) => tokio::time::timeout_at(until, lane.lock_owned())
                .await
                .map_err(|_| DashboardError::UploadInFlight { key: key.clone() })?,
        };
        // What the spool's record says may be stored for this URI in this session (by an
        // earlier run too, or by an upload of this one whose answer never came). An entry
        // left by an upload whose outcome is unknown is no proof: the bucket may hold less
        // (review r41g D1), so the final poll reads the bucket for it.
        let recorded = self.record.get(&t.uri);
        let trusted = recorded.filter(|r| !r.uncertain);
        let mut previous = lane.last;
        if final_poll && previous.is_none() && checked.list_len.is_some() {
            // Nothing known stored by this process (a restart, or an upload whose outcome
            // is unknown): the rule holds against what the spool's record says, when it
            // knows, else against the bucket.
            if let Some(recorded) = trusted {
                if let (Some(now), Some(before)) = (checked.list_len, recorded.list_len) {
                    if now < before {
                        return Ok((n, Stored::Refused(Refusal::SmallerList)));
                    }
                }
            } else {
                match self.fetcher.in_bucket(&key, &path, t).await {
                    Ok(InBucket::Nothing) => {}
                    Ok(InBucket::Read(stored)) => previous = Some(stored),
                    Ok(InBucket::Large(bytes)) if (n as u64) < bytes => {
                        return Ok((n, Stored::Refused(Refusal::SmallerList)))
                    }
                    Ok(InBucket::Large(_)) => {}
                    // Without s3:ListBucket a missing key answers 403, and without
                    // s3:GetObject every key does: nothing is known, so the answer is stored
                    // as it would be on a first start, unless the record says an upload of
                    // unknown outcome may have stored a longer list: then that may stay.
                    Err(
                        e @ DashboardError::ReadStored {
                            source: object_store::Error::PermissionDenied { .. },
                            ..
                        },
                    ) => {
                        let longer = matches!(
                            (checked.list_len, recorded.and_then(|r| r.list_len)),
                            (Some(now), Some(maybe)) if now < maybe
                        );
                        if longer {
                            tracing::warn!(
                                uri = %t.uri,
                                error = %e,
                                "final poll: not allowed to read the stored snapshot back, and an earlier upload of unknown outcome may have stored a longer list; the answer is not stored"
                            );
                            return Ok((n, Stored::Refused(Refusal::StoredUnknown)));
                        }
                        tracing::info!(
                            uri = %t.uri,
                            error = %e,
                            "final poll: not allowed to read the stored snapshot back; storing the answer"
                        );
                    }
                    // Any other failure (a 5xx, a timeout, a broken connection) says nothing
                    // about what is stored: what is there stays.
                    Err(e) => {
                        tracing::warn!(
                            uri = %t.uri,
                            error = %e,
                            "final poll: the stored snapshot could not be read back; it stays, the answer is not stored"
                        );
                        return Ok((n, Stored::Refused(Refusal::StoredUnknown)));
                    }
                }
            }
        }
        if final_poll {
            // Against the longer of what this process last stored and what the record knows
            // the bucket holds (one the store refused was put back by its task; one of
            // unknown outcome was read back above).
            let before = [
                previous.and_then(|p| p.list_len),
                trusted.and_then(|r| r.list_len),
            ]
            .into_iter()
            .flatten()
            .max();
            if let (Some(now), Some(before)) = (checked.list_len, before) {
                if now < before {
                    return Ok((n, Stored::Refused(Refusal::SmallerList)));
                }
            }
        }
        let hash = xxhash_rust::xxh3::xxh3_128(&body);
        if previous.map(|p| p.hash) == Some(hash) {
            return Ok((n, Stored::Unchanged));
        }
        let upload = Upload {
            fetcher: self.fetcher.clone(),
            record: self.record.clone(),
            session: self.session.clone(),
            uri: t.uri.clone(),
            key: key.clone(),
            path,
            snapshot: Snapshot {
                hash,
                list_len: checked.list_len,
            },
            recorded: Recorded {
                list_len: checked.list_len,
                bytes: n,
                uncertain: false,
            },
        };
        // A task of its own: a poll abandoned at SIGTERM leaves it running to its answer, and
        // it holds the lane until it has settled.
        match tokio::spawn(upload.run(lane, body)).await {
            Ok(Ok(())) => Ok((n, Stored::Uploaded)),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(DashboardError::UploadLost {
                key,
                why: e.to_string(),
            }),
        }
    }
}

/// One snapshot's upload, run as a task of its own.
struct Upload {
    fetcher: Arc<Fetcher>,
    record: Arc<SnapshotRecord>,
    session: String,
    uri: String,
    key: String,
    path: ObjectPath,
    snapshot: Snapshot,
    recorded: Recorded,
}

impl Upload {
    /// Writes the record ahead, uploads `body` and settles what is known of the bucket, all
    /// while holding the URI's lane: stored, the lane and the record say so; refused by the
    /// store (a 4xx not retried, see [`may_have_landed`]), the record's entry goes back to what it was
    /// (the bucket holds what it held); with no answer that proves either (a timeout, a
    /// connection cut after the request left, a 5xx), the upload may have landed or land yet:
    /// the record keeps the longer of the two lists, marked uncertain (the final poll reads
    /// the bucket for it), and the lane knows nothing.
    async fn run(
        self,
        mut lane: tokio::sync::OwnedMutexGuard<Lane>,
        body: Body,
    ) -> Result<(), DashboardError> {
        // Write-ahead: the spool's record covers this snapshot before the bucket may hold it,
        // so no kill, cut or crash between the two leaves a record shorter than the bucket.
        let before = self
            .record
            .before_upload(&self.session, &self.uri, self.recorded)
            .await
            .map_err(|why| DashboardError::Record {
                key: self.key.clone(),
                why,
            })?;
        // The upload shares the body's bytes; the large-body permit lasts until it is done.
        let put = self
            .fetcher
            .store
            .put(&self.path, PutPayload::from(body.bytes.clone()))
            .await;
        drop(body);
        match put {
            Ok(_) => {
                lane.last = Some(self.snapshot);
                self.record.stored(&self.session, &self.uri, self.recorded);
                Ok(())
            }
            Err(source) => {
                if may_have_landed(&source) {
                    lane.last = None;
                    self.record
                        .unknown(&self.session, &self.uri, before, self.recorded);
                } else {
                    self.record.not_stored(&self.session, &self.uri, before);
                }
                Err(DashboardError::Upload {
                    key: self.key,
                    source,
                })
            }
        }
    }
}

/// Whether a failed upload may be stored, or land later: its request may have reached the
/// store and no answer proving a refusal came back. No answer at all (a timeout, a connection
/// cut after connecting, an answer that could not be read) proves nothing; neither does a
/// 5xx: a gateway in front of the store (a load balancer, nginx, envoy before MinIO or Ceph)
/// answers 502, 503 or 504 after the store may have taken the PUT, and a store may fail
/// after writing (review r41g D2). A 4xx (the request refused as it stands: 403, 400, 412,
/// 429...), a failure to connect and a local I/O error (`file://`) mean nothing was stored.
/// object_store reports only the last attempt of its retries, and retries a PUT after a
/// 5xx, a timeout or a cut connection as after a refused connection: an upload it retried
/// may have landed on an earlier attempt (a 502 from a gateway after the store took it,
/// then "connection refused"), whatever the last attempt's error (review r41i D3).
fn may_have_landed(e: &object_store::Error) -> bool {
    use object_store::client::{HttpError, HttpErrorKind};
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if retried(&s.to_string()) {
            return true;
        }
        if let Some(http) = s.downcast_ref::<HttpError>() {
            return http.kind() != HttpErrorKind::Connect;
        }
        if let Some(status) = answered_status(&s.to_string()) {
            return !(400..500).contains(&status);
        }
        source = s.source();
    }
    false
}

/// The status of an error answer, as object_store words its request error (it does not
/// expose the type: "Server returned non-2xx status code: 504 Gateway Timeout: ..."); an
/// error answer whose status it does not word ("Server returned error response: ...") is
/// `Some(0)`, which [`may_have_landed`] counts as proving nothing.
fn answered_status(text: &str) -> Option<u16> {
    if let Some(rest) = text.strip_prefix("Server returned non-2xx status code: ") {
        return Some(
            rest.get(..3)
                .and_then(|code| code.parse().ok())
                .unwrap_or(0),
        );
    }
    text.starts_with("Server returned error response")
        .then_some(0)
}

/// Whether object_store's error says the request was retried (it does not expose the type:
/// "Error performing PUT ... in 1.2s, after 3 retries, max_retries: 10, ...").
fn retried(text: &str) -> bool {
    text.split(", after ").skip(1).any(|rest| {
        rest.split_once(" retries, max_retries:")
            .and_then(|(n, _)| n.parse::<u64>().ok())
            .is_some_and(|n| n > 0)
    })
}

fn job_of(datasets_uri: &str) -> String {
    datasets_uri
        .strip_prefix(DATASETS_PREFIX)
        .unwrap_or(datasets_uri)
        .to_string()
}

/// Resolves when `rx` holds `true` or its sender is gone.
async fn wait_for_shutdown(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_upload_left_without_an_answer_may_have_landed() {
        use object_store::client::{HttpError, HttpErrorKind};
        let transport = |kind| object_store::Error::Generic {
            store: "S3",
            source: Box::new(HttpError::new(kind, std::io::Error::other("no answer"))),
        };
        assert!(may_have_landed(&transport(HttpErrorKind::Timeout)));
        assert!(may_have_landed(&transport(HttpErrorKind::Interrupted)));
        assert!(may_have_landed(&transport(HttpErrorKind::Request)));
        assert!(!may_have_landed(&transport(HttpErrorKind::Connect)));
        // object_store's request error for an answer with an error status, by its wording.
        #[derive(Debug)]
        struct Answered(&'static str);
        impl std::fmt::Display for Answered {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Answered {}
        let answered = |text| object_store::Error::Generic {
            store: "S3",
            source: Box::new(Answered(text)),
        };
        for gateway in [502, 503, 504, 500] {
            let text = format!("Server returned non-2xx status code: {gateway} Bad: <Error/>");
            assert!(
                may_have_landed(&answered(Box::leak(text.into_boxed_str()))),
                "{gateway} does not prove the store refused it (review r41g D2)"
            );
        }
        assert!(!may_have_landed(&answered(
            "Server returned non-2xx status code: 400 Bad Request: <Error/>"
        )));
        assert!(!may_have_landed(&answered(
            "Server returned non-2xx status code: 429 Too Many Requests: "
        )));
        assert!(may_have_landed(&answered(
            "Server returned error response: <Error><Code>InternalError</Code></Error>"
        )));
        let refused = object_store::Error::PermissionDenied {
            path: "k".to_string(),
            source: "AccessDenied".into(),
        };
        assert!(!may_have_landed(&refused));
        let local = object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(std::io::Error::other("disk full")),
        };
        assert!(!may_have_landed(&local));
        // Retried, the last attempt refused: an earlier one may have landed (r41i D3).
        assert!(may_have_landed(&answered(
            "Error performing PUT http://b/k in 1.5s, after 3 retries, max_retries: 10, \
             retry_timeout: 180s  - HTTP error: error sending request"
        )));
        assert!(!may_have_landed(&answered(
            "Error performing PUT http://b/k in 1ms - Server returned non-2xx status code: \
             403 Forbidden: "
        )));
    }

    #[test]
    fn keys_are_single_valid_segments() {
        for uri in PERIODIC_ENDPOINTS.iter().chain(&ONE_SHOT_ENDPOINTS) {
            let key = contract::endpoints::endpoint_key("p", "s", uri);
            let parsed = ObjectPath::parse(&key).unwrap();
            assert_eq!(
                parsed.as_ref(),
                key,
                "object_store keeps the key byte for byte"
            );
            assert_eq!(parsed.parts().count(), 4);
        }
    }
}
