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
//!   `rhc_dashboard_requests_total{endpoint_kind,outcome}`), retried on the next tick (a
//!   one-shot endpoint sooner: after 1, 2, 4, … s while shorter than the poll interval, since
//!   on a fresh pod Ray's dashboard comes up after the collector), and never stops the
//!   collector. Unlike KubeRay we keep retrying after 401/403: a token can be
//!   fixed without restarting the head pod's sidecar only if someone keeps asking;
//! - only answers that are JSON of the endpoint's shape, without `"result": false`, are
//!   stored, and the final poll at SIGTERM never replaces a snapshot with a shorter list (not
//!   only this process's last upload: after a restart, what the spool's [`record`] says an
//!   earlier run stored, else the object read back, a failed read meaning nothing known): a
//!   dashboard going down answers 200 with error pages, truncated bodies and empty lists, which
//!   the history server would replay as the cluster's state ([`answer`]); each upload runs as
//!   a task of its own and settles the record when the store answers (a refused upload puts
//!   the entry back), and the final poll waits for an upload of the same URI still in flight
//!   ([`FINAL_POLL_UPLOAD_WAIT`]) so that it cannot land after the final answer;
//!   (an entry really removed in the last poll interval then stays as last seen: the two
//!   cannot be told apart);
//! - bounded memory: bodies are checked without being built as values, and the poller holds
//!   one body larger than 1 MiB at a time, until its upload is done ([`client`]);
//!   [`node_id_by_ip`] has a permit of its own;
//! - each answer is recorded as it completes, and the jobs' datasets are asked as soon as the
//!   job list arrives, so a hanging endpoint costs only itself.
//!
//! Kept from KubeRay because the history server depends on it: a Ray Data answer with no
//! datasets is never stored (a later eviction of the stats actor must not erase the snapshot),
//! terminal jobs stop being polled once captured, and the final poll at SIGTERM does not
//! replace a Serve snapshot with the empty answer of a Serve controller that is shutting down.
//!
//! The poller runs on the head whether or not the log shipper does: they are independent.
//!
//! The files: [`config`] (address, token, extra endpoints, all checked at start), [`client`]
//! (requests and their failure modes), [`answer`] (what an answer must be to be stored, and
//! the job list), [`poller`] (what is asked when, and what is stored), [`record`] (what was
//! stored, kept in the spool for the final poll after a restart).

mod answer;
mod client;
mod config;
mod poller;
mod record;

use std::path::PathBuf;
use std::time::Duration;

pub use client::node_id_by_ip;
pub use config::DashboardConfig;
pub use poller::{DashboardPoller, PollReport};

/// Where the Ray dashboard listens when nothing else is configured (KubeRay's default too).
pub const DEFAULT_ADDRESS: &str = "http://localhost:8265";

/// Time between two polls of the periodic endpoints, as in KubeRay.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(30);

/// Longest wait for one dashboard answer, body included.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest body we keep; a bigger answer is reported as failed rather than held in memory.
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// Longest the final poll at SIGTERM waits for an upload of the same snapshot still in
/// flight (a live poll's, abandoned at SIGTERM) before comparing and uploading its own
/// answer; also at most a quarter of the time left before the shutdown deadline
/// (`--shutdown-timeout`, 25 s by default: about 6 s), so the final poll's own requests and
/// uploads keep the rest. An upload that takes longer is a bucket in trouble; the final
/// answer of that URI is then not stored.
pub const FINAL_POLL_UPLOAD_WAIT: Duration = Duration::from_secs(6);

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

/// First wait before a failed one-shot endpoint is asked again, doubled at each failure while
/// shorter than the poll interval: on a fresh pod the collector starts before Ray's dashboard,
/// and a job shorter than the interval would otherwise leave no cluster metadata.
pub const ONE_SHOT_FIRST_RETRY: Duration = Duration::from_secs(1);

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
    /// The token file (`RAY_AUTH_TOKEN_PATH`, or the projected ServiceAccount token of
    /// `RAY_ENABLE_K8S_TOKEN_AUTH`) cannot be read.
    #[error("reading the dashboard token from {var}={path}: {source}")]
    TokenFile {
        /// The variable that asked for the file.
        var: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The token file is empty.
    #[error("the dashboard token of {var}={path} is empty")]
    EmptyTokenFile {
        /// The variable that asked for the file.
        var: &'static str,
        /// The path.
        path: PathBuf,
    },
    /// The token has characters an HTTP header cannot carry (the token itself is not shown).
    #[error(
        "the dashboard token from {source_var} contains characters not allowed in an HTTP header"
    )]
    TokenNotHeaderSafe {
        /// `RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH` or `RAY_ENABLE_K8S_TOKEN_AUTH`.
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
    /// Reading the snapshot already stored failed (the final poll compares a list with it
    /// after a restart when the spool's record does not know it); logged, and the answer is
    /// stored.
    #[error("reading the stored snapshot {key} failed: {source}")]
    ReadStored {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: object_store::Error,
    },
    /// The spool's record of stored snapshots could not be written ahead of an upload, so
    /// the snapshot is not uploaded: a restart would trust a record shorter than the bucket.
    #[error("the record of stored dashboard snapshots could not be written before uploading {key}: {why}")]
    Record {
        /// The key not uploaded.
        key: String,
        /// Why.
        why: String,
    },
    /// The final poll waited for an upload of the same snapshot still in flight (a live
    /// poll's, abandoned at SIGTERM) until its wait ended: its answer is not stored, since it
    /// could land before the earlier upload and be replaced by it.
    #[error("an earlier upload of {key} was still in flight when the final poll stopped waiting; this answer is not stored")]
    UploadInFlight {
        /// The key.
        key: String,
    },
    /// An upload task ended without settling (a panic, or the runtime shutting down).
    #[error("the upload of {key} ended without an answer: {why}")]
    UploadLost {
        /// The key.
        key: String,
        /// Why.
        why: String,
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
            DashboardError::Upload { .. }
            | DashboardError::UploadInFlight { .. }
            | DashboardError::UploadLost { .. }
            | DashboardError::BadKey { .. }
            | DashboardError::Record { .. } => "upload_failed",
            DashboardError::ReadStored { .. } => "bucket_read_failed",
            DashboardError::Invalid { .. } => "invalid",
            _ => "http_error",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
