//! The poller: which endpoints are asked when (one-shot per session, periodic, the jobs'
//! datasets, the extra ones), what is stored under which key, and what is left alone
//! (unchanged bodies, empty answers the history server must not see).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::sync::watch;

use super::client::{build_client, fetch};
use super::config::DashboardConfig;
use super::{
    DashboardError, DATASETS_PREFIX, JOBS_ENDPOINT, MAX_CONCURRENT_REQUESTS, MAX_JOBS_PER_POLL,
    ONE_SHOT_ENDPOINTS, PERIODIC_ENDPOINTS, TERMINAL_EMPTY_POLLS_BEFORE_GIVING_UP,
    TERMINAL_JOB_STATES,
};
use crate::contract::ids::is_hex_id;
use crate::contract::{self, is_safe_segment, ClusterLayout};
use crate::metrics as m;
use crate::node::session::ActiveSession;

/// What one poll did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PollReport {
    /// Answers received in full (2xx, non-empty, within the size cap), the job list included.
    pub fetched: usize,
    /// Snapshots written to the bucket.
    pub uploaded: usize,
    /// Snapshots identical to the last upload of the same URI in this session, not rewritten.
    pub unchanged: usize,
    /// Answers not stored because they hold nothing (empty body, a Ray Data answer without
    /// datasets, a Serve answer without applications on the final poll).
    pub empty: usize,
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

/// One endpoint to fetch and store in this poll.
struct Target {
    uri: String,
    kind: Kind,
    /// Hash of the body last uploaded for this URI in this session.
    previous: Option<u128>,
    /// For datasets: the job was finished when listed.
    terminal: bool,
}

/// What happened to one endpoint.
enum Stored {
    Uploaded(u128),
    Unchanged,
    Empty,
}

/// A target after its poll: the body size and what was done with it, or why it failed.
type Done = (Target, Result<(usize, Stored), DashboardError>);

/// Per-session memory; replaced as a whole when the session changes.
#[derive(Default)]
struct SessionState {
    session: String,
    one_shot_done: HashSet<String>,
    /// xxh3-128 of the last body uploaded, by request URI.
    uploaded: HashMap<String, u128>,
    /// Finished jobs whose datasets snapshot is stored: not asked again.
    datasets_final: HashSet<String>,
    /// Finished jobs answering without datasets, and how many times.
    terminal_empty: HashMap<String, u32>,
}

/// Polls the head's dashboard and stores its answers; owned by one task.
pub struct DashboardPoller {
    cfg: DashboardConfig,
    base: String,
    client: reqwest::Client,
    store: Arc<dyn ObjectStore>,
    prefix: String,
    state: SessionState,
    /// Last failure reason by URI, so a dashboard that stays down is logged once, not per tick.
    failing: HashMap<String, String>,
}

/// True if the JSON object `body` has `field` as an empty array or object, or lacks it.
/// A body that is not a JSON object counts as not empty: storing it is the safe choice.
fn lacks(body: &[u8], field: &str) -> bool {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(o)) => match o.get(field) {
            None | Some(serde_json::Value::Null) => true,
            Some(serde_json::Value::Array(a)) => a.is_empty(),
            Some(serde_json::Value::Object(m)) => m.is_empty(),
            Some(_) => false,
        },
        _ => false,
    }
}

/// One job of `/api/jobs/`, reduced to what decides its datasets snapshot.
#[derive(Debug, PartialEq, Eq)]
struct ListedJob {
    job_id: String,
    terminal: bool,
}

/// Reads the job list: a JSON array of job details. Jobs without a `job_id` (a submission
/// whose driver has not started) are skipped; ids that are not hex are returned in `rejected`.
fn parse_jobs(body: &[u8]) -> Result<(Vec<ListedJob>, Vec<String>), DashboardError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| DashboardError::Invalid {
            why: format!("{JOBS_ENDPOINT} is not JSON: {e}"),
        })?;
    let serde_json::Value::Array(items) = v else {
        return Err(DashboardError::Invalid {
            why: format!("{JOBS_ENDPOINT} is not a JSON array"),
        });
    };
    let mut jobs: Vec<ListedJob> = Vec::new();
    let mut rejected = Vec::new();
    let mut seen = HashSet::new();
    for item in &items {
        let Some(id) = item.get("job_id").and_then(|v| v.as_str()) else {
            continue;
        };
        if !is_hex_id(id) {
            rejected.push(id.chars().take(80).collect());
            continue;
        }
        if !seen.insert(id.to_string()) {
            continue;
        }
        let terminal = item
            .get("status")
            .and_then(|v| v.as_str())
            .is_some_and(|s| TERMINAL_JOB_STATES.contains(&s));
        jobs.push(ListedJob {
            job_id: id.to_string(),
            terminal,
        });
    }
    Ok((jobs, rejected))
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
        Ok(DashboardPoller {
            cfg,
            base,
            client,
            store,
            prefix: layout.history_prefix(),
            state: SessionState::default(),
            failing: HashMap::new(),
        })
    }

    /// The object key of the snapshot of `uri` in `session`.
    pub fn object_key(&self, session: &str, uri: &str) -> String {
        contract::endpoints::endpoint_key(&self.prefix, session, uri)
    }

    /// Polls until `shutdown` becomes true (or its sender is dropped): one-shot endpoints once
    /// per session (retried on the next tick until they succeed — KubeRay gives up on 401/403,
    /// we keep trying), periodic ones every interval. Follows `sessions`: a new session resets
    /// the one-shot state and the change-detection cache and is polled at once. A poll in
    /// flight when shutdown comes is abandoned; the caller then runs [`Self::poll_once`].
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
                        failed = report.failed.len(),
                        "dashboard poll done"
                    );
                }
            }
        }
    }

    /// One full poll of every endpoint for `session`, meant for the final poll at SIGTERM
    /// under the caller's deadline (dropping the future abandons it safely). One-shot
    /// endpoints already stored for this session are not fetched again; a Serve answer
    /// without applications (a controller shutting down) does not replace the last snapshot.
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

        let (first, jobs) = futures::future::join(
            self.store_all(session, targets, final_poll),
            self.list_jobs(),
        )
        .await;
        self.apply(first, &mut report);

        let jobs = match jobs {
            Ok(body_jobs) => {
                report.fetched += 1;
                self.succeeded(JOBS_ENDPOINT, Kind::JobList, "ok");
                body_jobs
            }
            Err(e) => {
                self.failed(JOBS_ENDPOINT, Kind::JobList, &e, &mut report);
                Vec::new()
            }
        };
        let mut targets = Vec::new();
        for job in jobs.into_iter().take(MAX_JOBS_PER_POLL) {
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
        let second = self.store_all(session, targets, final_poll).await;
        self.apply(second, &mut report);
        report
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

    /// Fetches the job list and keeps the jobs whose datasets are worth asking for.
    async fn list_jobs(&self) -> Result<Vec<ListedJob>, DashboardError> {
        let body = fetch(
            &self.client,
            &self.base,
            JOBS_ENDPOINT,
            self.cfg.request_timeout,
            &self.cfg,
        )
        .await?;
        let (jobs, rejected) = parse_jobs(&body)?;
        if !rejected.is_empty() {
            tracing::warn!(
                count = rejected.len(),
                first = ?rejected[0],
                "the dashboard listed job ids that are not hex; their datasets are not fetched"
            );
        }
        Ok(jobs)
    }

    /// Fetches and stores `targets`, a few at a time; returns each target with its result.
    async fn store_all(&self, session: &str, targets: Vec<Target>, final_poll: bool) -> Vec<Done> {
        futures::stream::iter(targets)
            .map(|t| async move {
                let r = self.store_one(session, &t, final_poll).await;
                (t, r)
            })
            .buffer_unordered(MAX_CONCURRENT_REQUESTS)
            .collect()
            .await
    }

    /// Fetches one endpoint and uploads its body unless empty or unchanged; returns the body
    /// size and what was done.
    async fn store_one(
        &self,
        session: &str,
        t: &Target,
        final_poll: bool,
    ) -> Result<(usize, Stored), DashboardError> {
        let body = fetch(
            &self.client,
            &self.base,
            &t.uri,
            self.cfg.request_timeout,
            &self.cfg,
        )
        .await?;
        let n = body.len();
        let empty = body.iter().all(u8::is_ascii_whitespace)
            || (t.kind == Kind::Datasets && lacks(&body, "datasets"))
            || (final_poll && t.uri == PERIODIC_ENDPOINTS[0] && lacks(&body, "applications"));
        if empty {
            return Ok((n, Stored::Empty));
        }
        let hash = xxhash_rust::xxh3::xxh3_128(&body);
        if t.previous == Some(hash) {
            return Ok((n, Stored::Unchanged));
        }
        let key = self.object_key(session, &t.uri);
        let path = ObjectPath::parse(&key).map_err(|source| DashboardError::BadKey {
            key: key.clone(),
            source,
        })?;
        self.store
            .put(&path, PutPayload::from(body))
            .await
            .map_err(|source| DashboardError::Upload { key, source })?;
        Ok((n, Stored::Uploaded(hash)))
    }

    fn apply(&mut self, results: Vec<Done>, report: &mut PollReport) {
        for (t, r) in results {
            match r {
                Ok((bytes, stored)) => {
                    report.fetched += 1;
                    let outcome = match stored {
                        Stored::Uploaded(hash) => {
                            report.uploaded += 1;
                            self.state.uploaded.insert(t.uri.clone(), hash);
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
                Err(e) => self.failed(&t.uri, t.kind, &e, report),
            }
        }
    }

    fn succeeded(&mut self, uri: &str, kind: Kind, outcome: &'static str) {
        m::dashboard_request(kind.label(), outcome);
        m::dashboard_success();
        if let Some(reason) = self.failing.remove(uri) {
            tracing::info!(uri, previously = %reason, "dashboard endpoint answers again");
        }
    }

    fn failed(&mut self, uri: &str, kind: Kind, e: &DashboardError, report: &mut PollReport) {
        m::dashboard_request(kind.label(), e.outcome());
        let reason = e.to_string();
        if self.failing.get(uri) != Some(&reason) {
            // Logged when an endpoint starts failing or fails differently, not every tick.
            let detail = std::error::Error::source(e).map(|s| s.to_string());
            tracing::warn!(
                uri,
                address = %self.base,
                reason = %reason,
                detail = detail.as_deref().unwrap_or(""),
                "dashboard snapshot failed; retrying on the next tick"
            );
            self.failing.insert(uri.to_string(), reason.clone());
        }
        report.failed.push((uri.to_string(), reason));
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

    #[test]
    fn job_list() {
        let body = br#"[
            {"type":"SUBMISSION","job_id":null,"submission_id":"raysubmit_1","status":"PENDING"},
            {"type":"SUBMISSION","job_id":"02000000","submission_id":"raysubmit_2","status":"RUNNING"},
            {"type":"DRIVER","job_id":"01000000","submission_id":null,"status":"SUCCEEDED"},
            {"job_id":"../../x","status":"RUNNING"},
            {"job_id":"01000000","status":"SUCCEEDED"},
            {"submission_id":"raysubmit_3"},
            7
        ]"#;
        let (jobs, rejected) = parse_jobs(body).unwrap();
        assert_eq!(
            jobs,
            [
                ListedJob {
                    job_id: "02000000".into(),
                    terminal: false
                },
                ListedJob {
                    job_id: "01000000".into(),
                    terminal: true
                },
            ]
        );
        assert_eq!(rejected, ["../../x"]);
        assert!(parse_jobs(b"{}").is_err());
        assert!(parse_jobs(b"nope").is_err());
    }

    #[test]
    fn empty_payloads() {
        assert!(lacks(br#"{"datasets": []}"#, "datasets"));
        assert!(lacks(br#"{}"#, "datasets"));
        assert!(!lacks(br#"{"datasets": [{"dataset": "d"}]}"#, "datasets"));
        assert!(!lacks(b"not json", "datasets"));
        assert!(lacks(br#"{"applications": {}}"#, "applications"));
        assert!(!lacks(br#"{"applications": {"app": {}}}"#, "applications"));
    }
}
