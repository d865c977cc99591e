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

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::sync::watch;

use super::answer::{self, Expect, ListedJob, Refusal};
use super::client::{build_client, fetch, Body, BodyBudget};
use super::config::DashboardConfig;
use super::{
    DashboardError, DATASETS_PREFIX, JOBS_ENDPOINT, MAX_CONCURRENT_REQUESTS, ONE_SHOT_ENDPOINTS,
    PERIODIC_ENDPOINTS, TERMINAL_EMPTY_POLLS_BEFORE_GIVING_UP,
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
    Uploaded(Snapshot),
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
        })
    }

    /// The object key of the snapshot of `uri` in `session`.
    pub fn object_key(&self, session: &str, uri: &str) -> String {
        self.fetcher.object_key(session, uri)
    }

    /// Polls until `shutdown` becomes true (or its sender is dropped): one-shot endpoints once
    /// per session (retried on the next tick until they succeed — KubeRay gives up on 401/403,
    /// we keep trying), periodic ones every interval. Follows `sessions`: a new session resets
    /// the one-shot state and the change-detection cache and is polled at once. A poll in
    /// flight when shutdown comes is abandoned (what it had done is kept); the caller then
    /// runs [`Self::poll_once`].
    pub async fn run(
        &mut self,
        mut sessions: watch::Receiver<Option<ActiveSession>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(self.cfg.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sessions_open = true;
        loop {
            if *shutdown.borrow() {
                return;
            }
            tokio::select! {
                biased;
                _ = wait_for_shutdown(&mut shutdown) => return,
                changed = sessions.changed(), if sessions_open => {
                    match changed {
                        Ok(()) => tick.reset_immediately(),
                        // The watcher is gone: keep polling the last session known.
                        Err(_) => sessions_open = false,
                    }
                    continue;
                }
                _ = tick.tick() => {}
            }
            let Some(session) = sessions.borrow_and_update().clone() else {
                continue;
            };
            tokio::select! {
                biased;
                _ = wait_for_shutdown(&mut shutdown) => return,
                report = self.poll(&session.name, false) => {
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
    /// answer without applications, does not replace the last snapshot. The price: a shorter
    /// list from a cluster that really removed an application or placement group since the
    /// last live poll looks the same and is not stored either, so the history server shows
    /// the removed entry as that poll saw it (see the README's trade-off).
    pub async fn poll_once(&mut self, session: &str) -> PollReport {
        self.poll(session, true).await
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
    }

    async fn poll(&mut self, session: &str, final_poll: bool) -> PollReport {
        let mut report = PollReport::default();
        if !is_safe_segment(session) {
            report.failed.push((
                String::new(),
                format!("session name {session:?} is not a safe path segment"),
            ));
            return report;
        }
        self.enter_session(session);

        let mut targets = Vec::new();
        for uri in ONE_SHOT_ENDPOINTS {
            if !self.state.one_shot_done.contains(uri) {
                targets.push(self.target(uri.to_string(), Kind::OneShot, false));
            }
        }
        for uri in PERIODIC_ENDPOINTS {
            targets.push(self.target(uri.to_string(), Kind::Periodic, false));
        }
        for uri in &self.cfg.additional_endpoints {
            targets.push(self.target(uri.clone(), Kind::Additional, false));
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
        let mut steps: futures::stream::SelectAll<Steps<'_>> = futures::stream::SelectAll::new();
        steps.push(Box::pin(
            store_all(&fetcher, session, targets, final_poll).map(Step::One),
        ));
        steps.push(Box::pin(
            futures::stream::once(fetcher.list_jobs()).map(Step::Jobs),
        ));
        while let Some(step) = steps.next().await {
            match step {
                Step::One(done) => self.apply(done, &mut report),
                Step::Jobs(Ok(jobs)) => {
                    report.fetched += 1;
                    self.succeeded(JOBS_ENDPOINT, Kind::JobList, "ok");
                    let datasets = self.datasets_targets(jobs, final_poll);
                    steps.push(Box::pin(
                        store_all(&fetcher, session, datasets, final_poll).map(Step::One),
                    ));
                }
                Step::Jobs(Err(e)) => self.failed(JOBS_ENDPOINT, Kind::JobList, &e, &mut report),
            }
        }
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
        Target {
            uri,
            kind,
            previous,
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
            Stored::Uploaded(snapshot) => {
                report.uploaded += 1;
                self.state.uploaded.insert(t.uri.clone(), snapshot);
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
                kept = t.previous.is_some(),
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
            tracing::warn!(
                uri,
                address = %self.fetcher.base,
                reason = %reason,
                detail = detail.as_deref().unwrap_or(""),
                "dashboard snapshot failed; retrying on the next tick"
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
    }
}

/// Fetches and stores `targets`, a few at a time, yielding each target with its result as
/// soon as it completes.
fn store_all<'a>(
    fetcher: &'a Fetcher,
    session: &'a str,
    targets: Vec<Target>,
    final_poll: bool,
) -> impl futures::Stream<Item = Done> + 'a {
    futures::stream::iter(targets)
        .map(move |t| async move {
            let r = fetcher.store_one(session, &t, final_poll).await;
            (t, r)
        })
        .buffer_unordered(MAX_CONCURRENT_REQUESTS)
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
        if final_poll {
            if let (
                Some(now),
                Some(Snapshot {
                    list_len: Some(before),
                    ..
                }),
            ) = (checked.list_len, t.previous)
            {
                if now < before {
                    return Ok((n, Stored::Refused(Refusal::SmallerList)));
                }
            }
        }
        let hash = xxhash_rust::xxh3::xxh3_128(&body);
        if t.previous.map(|p| p.hash) == Some(hash) {
            return Ok((n, Stored::Unchanged));
        }
        let key = self.object_key(session, &t.uri);
        let path = ObjectPath::parse(&key).map_err(|source| DashboardError::BadKey {
            key: key.clone(),
            source,
        })?;
        // The upload shares the body's bytes; the large-body permit lasts until it is done.
        self.store
            .put(&path, PutPayload::from(body.bytes.clone()))
            .await
            .map_err(|source| DashboardError::Upload { key, source })?;
        drop(body);
        Ok((
            n,
            Stored::Uploaded(Snapshot {
                hash,
                list_len: checked.list_len,
            }),
        ))
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
