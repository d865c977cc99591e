//! The poller: which endpoints are asked when (one-shot per session, periodic, the jobs'
//! datasets, the extra ones), what is stored under which key, and what is left alone
//! (unchanged bodies, empty answers the history server must not see, answers that are not of
//! the endpoint's shape, see [`super::answer`]).
//!
//! Each answer is applied (recorded as uploaded, one-shot done, dataset captured) as soon as
//! it completes, not when its whole poll ends: a poll abandoned at shutdown because one
//! endpoint hangs keeps what the others did, so the final poll does not ask them again.

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
    DashboardError, DATASETS_PREFIX, JOBS_ENDPOINT, MAX_CONCURRENT_REQUESTS, ONE_SHOT_ENDPOINTS,
    ONE_SHOT_FIRST_RETRY, PERIODIC_ENDPOINTS, TERMINAL_EMPTY_POLLS_BEFORE_GIVING_UP,
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
    /// The last snapshot uploaded for this URI in this session.
    previous: Option<Snapshot>,
    /// What the spool's record says may be stored for this URI in this session (by an
    /// earlier run too, or by an upload of this one cut before its answer).
    recorded: Option<Recorded>,
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

/// What happened to one endpoint.
enum Stored {
    Uploaded(Snapshot, Recorded),
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
    /// The last snapshot uploaded, by request URI.
    uploaded: HashMap<String, Snapshot>,
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
    /// the uploads in flight, which write their entries ahead.
    record: Arc<SnapshotRecord>,
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
    /// under the caller's deadline (dropping the future abandons it safely). One-shot
    /// endpoints already stored for this session are not fetched again; an answer whose list
    /// is shorter than the snapshot already stored (a dashboard shutting down), or a Serve
    /// answer without applications, does not replace the last snapshot. "Already stored" is
    /// what the bucket holds: the last upload of this process, or, when it has made none for
    /// that URI (after a restart), what the spool's record says an earlier run stored, or,
    /// when the record has nothing for it, the object read back from the bucket (a read that
    /// fails, as a GET of a missing key without `s3:ListBucket` does with 403, means nothing
    /// known: the answer is stored). The price: a
    /// shorter list from a cluster that really removed an application or placement group
    /// since the last live poll looks the same and is not stored either, so the history
    /// server shows the removed entry as that poll saw it (see the trade-off in docs/dashboard-snapshots.md).
    pub async fn poll_once(&mut self, session: &str) -> PollReport {
        self.poll(session, Scope::Final).await
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
        // Uploads of a poll abandoned at shutdown are recorded before this one.
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
        let fetcher = self.fetcher.clone();
        let record = self.record.clone();
        let mut steps: futures::stream::SelectAll<Steps<'_>> = futures::stream::SelectAll::new();
        steps.push(Box::pin(
            store_all(&fetcher, &record, session, targets, final_poll).map(Step::One),
        ));
        if scope != Scope::OneShots {
            steps.push(Box::pin(
                futures::stream::once(fetcher.list_jobs()).map(Step::Jobs),
            ));
        }
        while let Some(step) = steps.next().await {
            match step {
                Step::One(done) => self.apply(done, &mut report),
                Step::Jobs(Ok(jobs)) => {
                    report.fetched += 1;
                    self.succeeded(JOBS_ENDPOINT, Kind::JobList, "ok");
                    let datasets = self.datasets_targets(jobs, final_poll);
                    steps.push(Box::pin(
                        store_all(&fetcher, &record, session, datasets, final_poll).map(Step::One),
                    ));
                }
                Step::Jobs(Err(e)) => self.failed(JOBS_ENDPOINT, Kind::JobList, &e, &mut report),
            }
        }
        drop(steps);
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
        let previous = self.state.uploaded.get(&uri).copied();
        // Read even when this process uploaded something: a live poll's upload abandoned at
        // shutdown may have landed, and only the record (written ahead) knows it.
        let recorded = self.record.get(&uri);
        Target {
            uri,
            kind,
            previous,
            recorded,
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
            Stored::Uploaded(snapshot, recorded) => {
                report.uploaded += 1;
                self.state.uploaded.insert(t.uri.clone(), snapshot);
                self.record.stored(&t.uri, recorded);
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
            tracing::warn!(
                uri = %t.uri,
                reason,
                bytes,
                kept = t.previous.is_some()
                    || matches!(why, Refusal::SmallerList | Refusal::StoredUnknown),
                "dashboard answer not stored; the last snapshot stays"
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

/// Fetches and stores `targets`, a few at a time, yielding each target with its result as
/// soon as it completes.
fn store_all<'a>(
    fetcher: &'a Fetcher,
    record: &'a SnapshotRecord,
    session: &'a str,
    targets: Vec<Target>,
    final_poll: bool,
) -> impl futures::Stream<Item = Done> + 'a {
    futures::stream::iter(targets)
        .map(move |t| async move {
            let r = fetcher.store_one(record, session, &t, final_poll).await;
            (t, r)
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

    /// Fetches one endpoint and uploads its body if it is of the endpoint's shape, holds
    /// something, and differs from the last snapshot; returns the body size and what was done.
    async fn store_one(
        &self,
        record: &SnapshotRecord,
        session: &str,
        t: &Target,
        final_poll: bool,
    ) -> Result<(usize, Stored), DashboardError> {
        let body = self.get(&t.uri).await?;
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
        let key = self.object_key(session, &t.uri);
        let path = ObjectPath::parse(&key).map_err(|source| DashboardError::BadKey {
            key: key.clone(),
            source,
        })?;
        let mut previous = t.previous;
        if final_poll && previous.is_none() && checked.list_len.is_some() {
            // Nothing stored by this process (a restart): the rule holds against what an
            // earlier run recorded in the spool, else against the bucket.
            if let Some(recorded) = t.recorded {
                if let (Some(now), Some(before)) = (checked.list_len, recorded.list_len) {
                    if now < before {
                        return Ok((n, Stored::Refused(Refusal::SmallerList)));
                    }
                }
            } else {
                match self.in_bucket(&key, &path, t).await {
                    Ok(InBucket::Nothing) => {}
                    Ok(InBucket::Read(stored)) => previous = Some(stored),
                    Ok(InBucket::Large(bytes)) if (n as u64) < bytes => {
                        return Ok((n, Stored::Refused(Refusal::SmallerList)))
                    }
                    Ok(InBucket::Large(_)) => {}
                    // Without s3:ListBucket a missing key answers 403, and without
                    // s3:GetObject every key does: nothing is known, so the answer is stored
                    // as it would be on a first start.
                    Err(
                        e @ DashboardError::ReadStored {
                            source: object_store::Error::PermissionDenied { .. },
                            ..
                        },
                    ) => tracing::info!(
                        uri = %t.uri,
                        error = %e,
                        "final poll: not allowed to read the stored snapshot back; storing the answer"
                    ),
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
            // Against the longer of what this process last stored and what the record says
            // the bucket may hold (written ahead of every upload): a live poll's upload
            // abandoned at SIGTERM may land (review r41d D1: 3 stored, then 5 landed, then
            // the final poll's 4 replaced it).
            let before = [
                previous.and_then(|p| p.list_len),
                t.recorded.and_then(|r| r.list_len),
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
        let recorded = Recorded {
            list_len: checked.list_len,
            bytes: n,
        };
        // Write-ahead: the spool's record covers this snapshot before the bucket may hold it,
        // so no kill, cut or crash between the two leaves a record shorter than the bucket.
        record
            .before_upload(&t.uri, recorded)
            .await
            .map_err(|why| DashboardError::Record {
                key: key.clone(),
                why,
            })?;
        // The upload shares the body's bytes; the large-body permit lasts until it is done.
        self.store
            .put(&path, PutPayload::from(body.bytes.clone()))
            .await
            .map_err(|source| DashboardError::Upload { key, source })?;
        drop(body);
        Ok((
            n,
            Stored::Uploaded(
                Snapshot {
                    hash,
                    list_len: checked.list_len,
                },
                recorded,
            ),
        ))
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
