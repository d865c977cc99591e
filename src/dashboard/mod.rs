//! Head node only: snapshots of the Ray dashboard's REST answers, stored where KubeRay's
//! History Server replays them (`P/<session>/fetched_endpoints/restful__...`).
//!
//! The history server cannot ask a dead cluster anything, so whatever its frontend will request
//! (`/timezone`, cluster metadata, Serve applications, placement groups, Ray Data datasets) has
//! to be captured while the cluster lives. The object key is derived from the request URI with
//! KubeRay's rule ([`contract::endpoints`]) because the history server looks objects up by the
//! URI its own frontend sends, query string included.
//!
//! What this module adds over KubeRay's poller:
//! - one loop that follows the active session (a raylet restart starts a new session, whose
//!   snapshots go under the new session's prefix, one-shot endpoints included);
//! - change detection: a body identical to the last one uploaded for the same URI in the same
//!   session is not uploaded again (an xxh3 hash per URI, in memory);
//! - requests run a few at a time with a per-request timeout, so one slow endpoint never
//!   holds up the others for longer than that timeout;
//! - a dashboard that is down, slow or refuses our token is reported (logs on change of state,
//!   `rhc_dashboard_requests_total{endpoint_kind,outcome}`), retried on the next tick, and
//!   never stops the collector. Unlike KubeRay we keep retrying after 401/403: a token can be
//!   fixed without restarting the head pod's sidecar only if someone keeps asking.
//!
//! Kept from KubeRay because the history server depends on it: a Ray Data answer with no
//! datasets is never stored (a later eviction of the stats actor must not erase the snapshot),
//! terminal jobs stop being polled once captured, and the final poll at SIGTERM does not
//! replace a Serve snapshot with the empty answer of a Serve controller that is shutting down.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use tokio::sync::watch;

use crate::contract::{self, is_safe_segment, ClusterLayout, MAX_SEGMENT_LEN};
use crate::metrics as m;
use crate::node::session::ActiveSession;

/// Where the Ray dashboard listens when nothing else is configured (KubeRay's default too).
pub const DEFAULT_ADDRESS: &str = "http://localhost:8265";
/// Time between two polls of the periodic endpoints, as in KubeRay.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(30);
/// Longest wait for one dashboard answer, body included.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest body we keep; a bigger answer is reported as failed rather than held in memory.
pub const MAX_BODY_BYTES: usize = 64 << 20;
/// Dashboard requests in flight at once: enough that a slow endpoint does not delay the
/// others, few enough not to trip the dashboard's rate limit on state API calls.
pub const MAX_CONCURRENT_REQUESTS: usize = 4;
/// Most jobs whose datasets are fetched in one poll; the job list comes from the dashboard
/// and is bounded so that a huge or hostile answer cannot make a poll unbounded.
pub const MAX_JOBS_PER_POLL: usize = 10_000;
/// Longest URI accepted in `RAY_COLLECTOR_ADDITIONAL_ENDPOINTS`, so keys stay well under the
/// 1024-byte key limit of S3 and GCS.
pub const MAX_ENDPOINT_LEN: usize = 512;

/// Fetched once per session: these do not change while a session lives.
pub const ONE_SHOT_ENDPOINTS: [&str; 2] = ["/api/v0/cluster_metadata", "/timezone"];
/// Fetched every poll interval, in this order, before the additional endpoints.
pub const PERIODIC_ENDPOINTS: [&str; 2] = [
    "/api/serve/applications/",
    "/api/v0/placement_groups?detail=1&limit=10000",
];
/// The job list whose `job_id`s decide which Ray Data snapshots to take; not stored itself.
pub const JOBS_ENDPOINT: &str = "/api/jobs/";
/// Ray Data snapshots, one per job: `DATASETS_PREFIX` + hex job id.
pub const DATASETS_PREFIX: &str = "/api/data/datasets/";
/// The state API's node list, used only by [`node_id_by_ip`].
pub const NODES_ENDPOINT: &str = "/api/v0/nodes?limit=10000";

/// Job states after which Ray Data statistics no longer change (Ray's `JobStatus`).
const TERMINAL_JOB_STATES: [&str; 3] = ["SUCCEEDED", "FAILED", "STOPPED"];
/// Empty Ray Data answers after which a finished job stops being asked (KubeRay's rule: the
/// statistics of a finished job rarely appear later, and asking forever costs one request
/// per finished job per tick).
const TERMINAL_EMPTY_POLLS_BEFORE_GIVING_UP: u32 = 2;

/// Why the dashboard poller could not be configured, or one dashboard request failed.
///
/// The `Display` of the request variants is the short reason reported in
/// [`PollReport::failed`] and in logs; the URI is reported beside it.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The dashboard address is not an `http(s)://host[:port][/path]` URL.
    #[error("dashboard address {address:?}: {why}")]
    BadAddress {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        why: String,
    },
    /// A poll interval or request timeout of zero.
    #[error("{what} must be greater than zero")]
    ZeroDuration {
        /// Which setting.
        what: &'static str,
    },
    /// An entry of `RAY_COLLECTOR_ADDITIONAL_ENDPOINTS` cannot be requested and stored safely.
    #[error("RAY_COLLECTOR_ADDITIONAL_ENDPOINTS entry {entry:?}: {why}")]
    BadEndpoint {
        /// The entry, trimmed.
        entry: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// `RAY_AUTH_TOKEN_PATH` names a file we cannot read.
    #[error("reading the dashboard token from RAY_AUTH_TOKEN_PATH={path}: {source}")]
    TokenFile {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `RAY_AUTH_TOKEN_PATH` names an empty file.
    #[error("RAY_AUTH_TOKEN_PATH={path} is empty")]
    EmptyTokenFile {
        /// The path.
        path: PathBuf,
    },
    /// The token has characters an HTTP header cannot carry (the token itself is not shown).
    #[error(
        "the dashboard token from {source_var} contains characters not allowed in an HTTP header"
    )]
    TokenNotHeaderSafe {
        /// `RAY_AUTH_TOKEN` or `RAY_AUTH_TOKEN_PATH`.
        source_var: &'static str,
    },
    /// The HTTP client could not be built (TLS setup).
    #[error("building the dashboard HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// The dashboard answered 401 or 403.
    #[error("unauthorized ({})", unauthorized_hint(*had_token))]
    Unauthorized {
        /// 401 or 403.
        status: u16,
        /// Whether we sent a token (then the dashboard rejected it).
        had_token: bool,
    },
    /// Nothing listens at the dashboard address (connection refused, no route, DNS).
    #[error("dashboard unreachable")]
    Unreachable {
        /// The connection error.
        #[source]
        source: reqwest::Error,
    },
    /// No complete answer within the request timeout.
    #[error("timed out after {}", humanize(*after))]
    Timeout {
        /// The timeout.
        after: Duration,
    },
    /// An answer other than 2xx, 401 and 403.
    #[error("HTTP {status}")]
    Http {
        /// The status code.
        status: u16,
    },
    /// The HTTP exchange failed after connecting (reset, malformed answer).
    #[error("request failed: {source}")]
    Transport {
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// The body is larger than [`MAX_BODY_BYTES`].
    #[error("body larger than {} MiB", MAX_BODY_BYTES >> 20)]
    TooLarge,
    /// A JSON answer we need to read (job list, node list) has an unexpected shape.
    #[error("unexpected answer: {why}")]
    Invalid {
        /// What was expected.
        why: String,
    },
    /// The computed object key is not a valid object path (should not happen: URIs are checked).
    #[error("invalid object key {key:?}: {source}")]
    BadKey {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: object_store::path::Error,
    },
    /// Writing the snapshot to the bucket failed; it is retried on the next tick.
    #[error("upload of {key} failed: {source}")]
    Upload {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: object_store::Error,
    },
}

fn unauthorized_hint(had_token: bool) -> &'static str {
    if had_token {
        "the dashboard rejected the token from RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
    } else {
        "RAY_AUTH_MODE=token needs RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
    }
}

fn humanize(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

impl DashboardError {
    /// The `outcome` label of `rhc_dashboard_requests_total` for a failed request.
    pub fn outcome(&self) -> &'static str {
        match self {
            DashboardError::Unauthorized { .. } => "unauthorized",
            DashboardError::Unreachable { .. } => "unreachable",
            DashboardError::Timeout { .. } => "timeout",
            DashboardError::TooLarge => "too_large",
            DashboardError::Upload { .. } | DashboardError::BadKey { .. } => "upload_failed",
            DashboardError::Invalid { .. } => "invalid",
            _ => "http_error",
        }
    }
}

/// Settings of the dashboard poller (head role only).
#[derive(Clone)]
pub struct DashboardConfig {
    /// Base URL of the dashboard, e.g. `http://localhost:8265`; request URIs are appended.
    pub address: String,
    /// Time between two polls of the periodic endpoints.
    pub poll_interval: Duration,
    /// `RAY_COLLECTOR_ADDITIONAL_ENDPOINTS`: more URIs polled like the periodic ones.
    pub additional_endpoints: Vec<String>,
    /// Bearer token for a dashboard started with `RAY_AUTH_MODE=token`.
    pub auth_token: Option<String>,
    /// Longest wait for one answer, body included.
    pub request_timeout: Duration,
}

/// Never prints the token: configurations end up in logs.
impl fmt::Debug for DashboardConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DashboardConfig")
            .field("address", &self.address)
            .field("poll_interval", &self.poll_interval)
            .field("additional_endpoints", &self.additional_endpoints)
            .field(
                "auth_token",
                &self.auth_token.as_ref().map(|_| "<redacted>"),
            )
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl DashboardConfig {
    /// Completes the configuration from the environment, as Ray and KubeRay name things:
    ///
    /// - `RAY_AUTH_TOKEN` (trimmed), else the trimmed content of the file named by
    ///   `RAY_AUTH_TOKEN_PATH`, becomes the bearer token. A token is sent whenever one is
    ///   configured, like KubeRay does; `RAY_AUTH_MODE=token` without any token is allowed
    ///   but logged, since every request will then be refused with 401.
    /// - `RAY_COLLECTOR_ADDITIONAL_ENDPOINTS`: comma-separated URIs, trimmed, empty entries
    ///   dropped, each starting with `/`; duplicates (also of the built-in endpoints) dropped
    ///   with the first occurrence kept.
    ///
    /// The request timeout is [`DEFAULT_REQUEST_TIMEOUT`]. `env` is the variable lookup, so
    /// tests need not touch the process environment. Returns the configuration and the
    /// warnings to log once logging is set up.
    pub fn from_env(
        address: String,
        poll_interval: Duration,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(DashboardConfig, Vec<String>), DashboardError> {
        let additional_endpoints =
            parse_additional_endpoints(env("RAY_COLLECTOR_ADDITIONAL_ENDPOINTS").as_deref())?;
        let non_empty =
            |v: Option<String>| v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
        let auth_token = match non_empty(env("RAY_AUTH_TOKEN")) {
            Some(t) => {
                check_token(&t, "RAY_AUTH_TOKEN")?;
                Some(t)
            }
            None => match non_empty(env("RAY_AUTH_TOKEN_PATH")) {
                Some(path) => {
                    let path = PathBuf::from(path);
                    let text = std::fs::read_to_string(&path).map_err(|source| {
                        DashboardError::TokenFile {
                            path: path.clone(),
                            source,
                        }
                    })?;
                    let t = text.trim();
                    if t.is_empty() {
                        return Err(DashboardError::EmptyTokenFile { path });
                    }
                    check_token(t, "RAY_AUTH_TOKEN_PATH")?;
                    Some(t.to_string())
                }
                None => None,
            },
        };
        let token_mode = env("RAY_AUTH_MODE")
            .map(|m| m.trim().eq_ignore_ascii_case("token"))
            .unwrap_or(false);
        let mut warnings = Vec::new();
        if token_mode && auth_token.is_none() {
            warnings.push(
                "RAY_AUTH_MODE=token but neither RAY_AUTH_TOKEN nor RAY_AUTH_TOKEN_PATH is set: \
                 the dashboard will refuse our requests"
                    .to_string(),
            );
        }
        let cfg = DashboardConfig {
            address,
            poll_interval,
            additional_endpoints,
            auth_token,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        };
        cfg.base_url()?;
        Ok((cfg, warnings))
    }

    /// The address without trailing `/`, checked: request URIs are appended to it.
    fn base_url(&self) -> Result<String, DashboardError> {
        let bad = |why: &str| DashboardError::BadAddress {
            address: self.address.clone(),
            why: why.to_string(),
        };
        let url = url::Url::parse(self.address.trim()).map_err(|e| bad(&e.to_string()))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(bad("the scheme must be http or https"));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("no host"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad("no query or fragment allowed"));
        }
        Ok(self.address.trim().trim_end_matches('/').to_string())
    }

    fn validate(&self) -> Result<String, DashboardError> {
        if self.poll_interval.is_zero() {
            return Err(DashboardError::ZeroDuration {
                what: "the dashboard poll interval",
            });
        }
        if self.request_timeout.is_zero() {
            return Err(DashboardError::ZeroDuration {
                what: "the dashboard request timeout",
            });
        }
        for e in &self.additional_endpoints {
            check_endpoint(e)?;
        }
        if let Some(t) = &self.auth_token {
            check_token(t, "RAY_AUTH_TOKEN")?;
        }
        self.base_url()
    }
}

fn check_token(t: &str, source_var: &'static str) -> Result<(), DashboardError> {
    if HeaderValue::from_str(&format!("Bearer {t}")).is_err() {
        return Err(DashboardError::TokenNotHeaderSafe { source_var });
    }
    Ok(())
}

/// Splits `RAY_COLLECTOR_ADDITIONAL_ENDPOINTS`; see [`DashboardConfig::from_env`].
fn parse_additional_endpoints(v: Option<&str>) -> Result<Vec<String>, DashboardError> {
    let mut out: Vec<String> = Vec::new();
    for entry in v.unwrap_or("").split(',').map(str::trim) {
        if entry.is_empty() {
            continue;
        }
        check_endpoint(entry)?;
        let builtin = ONE_SHOT_ENDPOINTS.contains(&entry) || PERIODIC_ENDPOINTS.contains(&entry);
        if !builtin && !out.iter().any(|e| e == entry) {
            out.push(entry.to_string());
        }
    }
    Ok(out)
}

/// An extra endpoint must be a request URI whose bytes go unchanged into the request line
/// and into the object key, so the history server finds it under the URI its frontend sends.
fn check_endpoint(entry: &str) -> Result<(), DashboardError> {
    let bad = |why| {
        Err(DashboardError::BadEndpoint {
            entry: entry.to_string(),
            why,
        })
    };
    if !entry.starts_with('/') {
        return bad("must start with '/'");
    }
    if entry.len() > MAX_ENDPOINT_LEN {
        return bad("longer than 512 bytes");
    }
    if entry.trim_matches('/').is_empty() {
        return bad("names no endpoint");
    }
    // Printable ASCII that URL parsers leave as is: anything they would percent-encode or
    // strip would make the request URI differ from the stored key.
    let ok = |b: u8| b.is_ascii_graphic() && !b"\"#<>\\^`{|}".contains(&b);
    if !entry.bytes().all(ok) {
        return bad(
            "only printable ASCII without spaces, quotes, '#', '<>', '\\', '^', '`', '{|}'",
        );
    }
    let path = entry.split('?').next().unwrap_or(entry);
    if path.split('/').any(|s| s == "." || s == "..") {
        return bad("'.' and '..' segments are not allowed");
    }
    Ok(())
}

/// A Ray id (job, node) as the dashboard lists it: hex digits only, since it goes into a URL
/// and an object key and comes from a process we do not control.
fn is_hex_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SEGMENT_LEN && s.bytes().all(|b| b.is_ascii_hexdigit())
}

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

fn build_client(cfg: &DashboardConfig) -> Result<reqwest::Client, DashboardError> {
    let mut headers = HeaderMap::new();
    if let Some(t) = &cfg.auth_token {
        let mut v = HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
            DashboardError::TokenNotHeaderSafe {
                source_var: "RAY_AUTH_TOKEN",
            }
        })?;
        v.set_sensitive(true);
        // Ray's dashboard reads `Authorization`; recent versions also accept
        // `X-Ray-Authorization`, which KubeRay sends and proxies leave alone.
        headers.insert(AUTHORIZATION, v.clone());
        headers.insert("x-ray-authorization", v);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .timeout(cfg.request_timeout)
        .connect_timeout(cfg.request_timeout)
        // An API answer is never a redirect; following one could send the token elsewhere.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("ray-history-collector/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(DashboardError::Client)
}

fn classify(e: reqwest::Error, timeout: Duration) -> DashboardError {
    if e.is_timeout() {
        DashboardError::Timeout { after: timeout }
    } else if e.is_connect() {
        DashboardError::Unreachable { source: e }
    } else {
        DashboardError::Transport { source: e }
    }
}

/// GETs `base + uri` and returns the whole body of a 2xx answer (possibly empty).
async fn fetch(
    client: &reqwest::Client,
    base: &str,
    uri: &str,
    timeout: Duration,
    had_token: bool,
) -> Result<Bytes, DashboardError> {
    let url = format!("{base}{uri}");
    let exchange = async {
        let mut resp = client
            .get(&url)
            .send()
            .await
            .map_err(|e| classify(e, timeout))?;
        let status = resp.status().as_u16();
        if status == 401 || status == 403 {
            return Err(DashboardError::Unauthorized { status, had_token });
        }
        if !resp.status().is_success() {
            return Err(DashboardError::Http { status });
        }
        let announced = resp.content_length().unwrap_or(0);
        if announced > MAX_BODY_BYTES as u64 {
            return Err(DashboardError::TooLarge);
        }
        let mut body = BytesMut::with_capacity(announced as usize);
        while let Some(chunk) = resp.chunk().await.map_err(|e| classify(e, timeout))? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(DashboardError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    };
    // The client's own timeout covers the body too; this is the backstop.
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| DashboardError::Timeout { after: timeout })?
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
            self.cfg.auth_token.is_some(),
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
            self.cfg.auth_token.is_some(),
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

/// Reads the state API's node list (`{"result": true, "data": {"result": {"result": [...]}}}`)
/// and picks the node at `pod_ip`: an ALIVE one if any (after a raylet restart the dead node
/// keeps the same IP), else the most recently started one (the collector outlives Ray at
/// shutdown and still needs the id its logs belong to).
fn pick_node(body: &[u8], pod_ip: &str) -> Result<Option<String>, DashboardError> {
    let invalid = |why: &str| DashboardError::Invalid {
        why: format!("{NODES_ENDPOINT}: {why}"),
    };
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| invalid(&format!("not JSON: {e}")))?;
    if v.get("result").and_then(|r| r.as_bool()) == Some(false) {
        let msg = v.get("msg").and_then(|m| m.as_str()).unwrap_or("");
        return Err(invalid(&format!(
            "the dashboard reports a failure: {}",
            msg.chars().take(200).collect::<String>()
        )));
    }
    let nodes = v
        .pointer("/data/result/result")
        .and_then(|n| n.as_array())
        .ok_or_else(|| invalid("no data.result.result array"))?;
    let mut best: Option<(bool, i64, String)> = None;
    for n in nodes {
        if n.get("node_ip").and_then(|x| x.as_str()) != Some(pod_ip) {
            continue;
        }
        let Some(id) = n.get("node_id").and_then(|x| x.as_str()) else {
            continue;
        };
        if !is_hex_id(id) {
            continue;
        }
        let alive = n.get("state").and_then(|x| x.as_str()) == Some("ALIVE");
        let started = n.get("start_time_ms").and_then(|x| x.as_i64()).unwrap_or(0);
        let candidate = (alive, started, id.to_ascii_lowercase());
        if best
            .as_ref()
            .is_none_or(|b| (candidate.0, candidate.1) > (b.0, b.1))
        {
            best = Some(candidate);
        }
    }
    Ok(best.map(|(_, _, id)| id))
}

/// Last-resort node-id discovery for the log side: asks the dashboard's state API for its
/// nodes (`GET <address>/api/v0/nodes?limit=10000`, with the token if any) and returns the
/// lower-case hex id of the node whose `node_ip` is `pod_ip`, preferring an ALIVE one.
/// `Ok(None)` means the dashboard answered but lists no node at that IP (yet).
pub async fn node_id_by_ip(
    cfg: &DashboardConfig,
    pod_ip: &str,
) -> Result<Option<String>, DashboardError> {
    let base = cfg.base_url()?;
    if cfg.request_timeout.is_zero() {
        return Err(DashboardError::ZeroDuration {
            what: "the dashboard request timeout",
        });
    }
    let client = build_client(cfg)?;
    let body = fetch(
        &client,
        &base,
        NODES_ENDPOINT,
        cfg.request_timeout,
        cfg.auth_token.is_some(),
    )
    .await?;
    pick_node(&body, pod_ip.trim())
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

    fn env_of<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn cfg(pairs: &[(&str, &str)]) -> Result<DashboardConfig, DashboardError> {
        DashboardConfig::from_env(
            DEFAULT_ADDRESS.to_string(),
            DEFAULT_POLL_INTERVAL,
            &env_of(pairs),
        )
        .map(|(c, _warnings)| c)
    }

    #[test]
    fn additional_endpoints() {
        let c = cfg(&[(
            "RAY_COLLECTOR_ADDITIONAL_ENDPOINTS",
            " /api/train/v2/runs/v1 ,, /api/serve/applications/, /api/x?a=1&b=%20 ,/api/train/v2/runs/v1,",
        )])
        .unwrap();
        assert_eq!(
            c.additional_endpoints,
            ["/api/train/v2/runs/v1", "/api/x?a=1&b=%20"]
        );
        assert_eq!(c.request_timeout, DEFAULT_REQUEST_TIMEOUT);
        assert!(c.auth_token.is_none());
        for bad in ["api/x", "/", "/a b", "/a#b", "/a/../b", "/a\u{7f}", "/é"] {
            let e = cfg(&[("RAY_COLLECTOR_ADDITIONAL_ENDPOINTS", bad)]).unwrap_err();
            assert!(
                matches!(e, DashboardError::BadEndpoint { .. }),
                "{bad}: {e}"
            );
        }
        let long = format!("/{}", "a".repeat(MAX_ENDPOINT_LEN));
        assert!(cfg(&[("RAY_COLLECTOR_ADDITIONAL_ENDPOINTS", &long)]).is_err());
    }

    #[test]
    fn tokens() {
        let c = cfg(&[("RAY_AUTH_MODE", "token"), ("RAY_AUTH_TOKEN", " abc\n")]).unwrap();
        assert_eq!(c.auth_token.as_deref(), Some("abc"));
        assert!(
            !format!("{c:?}").contains("abc"),
            "Debug must not show the token"
        );

        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "from-file\n").unwrap();
        let ps = p.to_str().unwrap();
        let c = cfg(&[("RAY_AUTH_MODE", "token"), ("RAY_AUTH_TOKEN_PATH", ps)]).unwrap();
        assert_eq!(c.auth_token.as_deref(), Some("from-file"));
        // RAY_AUTH_TOKEN wins over the file.
        let c = cfg(&[("RAY_AUTH_TOKEN", "env"), ("RAY_AUTH_TOKEN_PATH", ps)]).unwrap();
        assert_eq!(c.auth_token.as_deref(), Some("env"));

        std::fs::write(&p, " \n").unwrap();
        assert!(matches!(
            cfg(&[("RAY_AUTH_TOKEN_PATH", ps)]),
            Err(DashboardError::EmptyTokenFile { .. })
        ));
        let missing = dir.path().join("nope");
        assert!(matches!(
            cfg(&[("RAY_AUTH_TOKEN_PATH", missing.to_str().unwrap())]),
            Err(DashboardError::TokenFile { .. })
        ));
        assert!(matches!(
            cfg(&[("RAY_AUTH_TOKEN", "a\u{1}b")]),
            Err(DashboardError::TokenNotHeaderSafe { .. })
        ));
        // Token mode without a token is allowed: requests will be refused and reported.
        assert!(cfg(&[("RAY_AUTH_MODE", "token")])
            .unwrap()
            .auth_token
            .is_none());
    }

    #[test]
    fn addresses() {
        let ok = |a: &str| {
            DashboardConfig::from_env(a.to_string(), DEFAULT_POLL_INTERVAL, &|_| None)
                .and_then(|(c, _)| c.base_url())
        };
        assert_eq!(
            ok("http://localhost:8265/").unwrap(),
            "http://localhost:8265"
        );
        assert_eq!(ok("https://h/ray/").unwrap(), "https://h/ray");
        for bad in ["localhost:8265", "ftp://h", "http://h/?a=1", "http://"] {
            assert!(ok(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn zero_durations_are_refused() {
        let mut c = cfg(&[]).unwrap();
        c.poll_interval = Duration::ZERO;
        assert!(matches!(
            c.validate(),
            Err(DashboardError::ZeroDuration { .. })
        ));
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

    #[test]
    fn node_choice() {
        let body = br#"{"result": true, "msg": "", "data": {"result": {"total": 4, "result": [
            {"node_id": "AA11", "node_ip": "10.0.0.1", "state": "DEAD", "start_time_ms": 5},
            {"node_id": "bb22", "node_ip": "10.0.0.1", "state": "ALIVE", "start_time_ms": 1},
            {"node_id": "cc33", "node_ip": "10.0.0.2", "state": "ALIVE"},
            {"node_id": "zz", "node_ip": "10.0.0.3", "state": "ALIVE"}
        ]}}}"#;
        assert_eq!(
            pick_node(body, "10.0.0.1").unwrap().as_deref(),
            Some("bb22")
        );
        assert_eq!(
            pick_node(body, "10.0.0.2").unwrap().as_deref(),
            Some("cc33")
        );
        assert_eq!(pick_node(body, "10.0.0.3").unwrap(), None, "not hex");
        assert_eq!(pick_node(body, "10.0.0.9").unwrap(), None);
        let dead_only = br#"{"result": true, "data": {"result": {"result": [
            {"node_id": "AA11", "node_ip": "10.0.0.1", "state": "DEAD", "start_time_ms": 5},
            {"node_id": "dd44", "node_ip": "10.0.0.1", "state": "DEAD", "start_time_ms": 9}
        ]}}}"#;
        assert_eq!(
            pick_node(dead_only, "10.0.0.1").unwrap().as_deref(),
            Some("dd44")
        );
        assert!(pick_node(br#"{"result": false, "msg": "boom", "data": {}}"#, "x").is_err());
        assert!(pick_node(br#"{"result": true, "data": {}}"#, "x").is_err());
    }

    #[test]
    fn reasons() {
        let e = DashboardError::Unauthorized {
            status: 401,
            had_token: false,
        };
        assert_eq!(
            e.to_string(),
            "unauthorized (RAY_AUTH_MODE=token needs RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)"
        );
        assert_eq!(e.outcome(), "unauthorized");
        let e = DashboardError::Timeout {
            after: Duration::from_millis(500),
        };
        assert_eq!(e.to_string(), "timed out after 500ms");
        assert_eq!(
            DashboardError::TooLarge.to_string(),
            "body larger than 64 MiB"
        );
    }
}
