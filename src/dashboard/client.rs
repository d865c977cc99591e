//! Requests to the dashboard: one client with the token (never following redirects, which
//! could carry it elsewhere), bounded bodies, and every failure sorted into the outcome that
//! the metrics and logs report.
//!
//! Memory: a body may be up to [`MAX_BODY_BYTES`], and several requests run at once. Each
//! request reads its first [`SMALL_BODY_BYTES`] freely; a body longer than that (announced or
//! found while reading) first takes the one [`BodyBudget`] permit, held until the body is
//! dropped, which for a stored answer is after its upload: the upload sends the same bytes, so
//! letting the permit go earlier would let a second large body into memory beside it. So the
//! poller's bodies in memory at once cost at most one large body plus one small one per
//! request in flight, whatever the dashboard sends. [`node_id_by_ip`] (one request, at start)
//! uses a budget of its own.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::answer;
use super::config::DashboardConfig;
use super::{DashboardError, MAX_BODY_BYTES, NODES_ENDPOINT};
use crate::contract::ids::is_hex_id;

/// Bytes of a body read without the large-body permit: every answer the history server
/// replays is far smaller on a normal cluster (Ray's own lists are a few KiB to a few hundred).
pub(super) const SMALL_BODY_BYTES: usize = 1 << 20;

/// Lets one body larger than [`SMALL_BODY_BYTES`] be in memory at a time.
#[derive(Clone)]
pub(super) struct BodyBudget(Arc<Semaphore>);

impl BodyBudget {
    pub(super) fn new() -> BodyBudget {
        BodyBudget(Arc::new(Semaphore::new(1)))
    }

    async fn large(&self) -> Result<OwnedSemaphorePermit, DashboardError> {
        // The semaphore is never closed; a closed one would only mean no more large bodies.
        self.0
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| DashboardError::TooLarge)
    }
}

/// A whole answer body, with the permit that lets a large one stay in memory.
pub(super) struct Body {
    pub(super) bytes: Bytes,
    _permit: Option<OwnedSemaphorePermit>,
}

impl std::ops::Deref for Body {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

pub(super) fn build_client(cfg: &DashboardConfig) -> Result<reqwest::Client, DashboardError> {
    // A token read again for every request goes with each request (see `fetch`).
    let headers = match (&cfg.auth_token, &cfg.auth_token_file) {
        (Some(t), None) => auth_headers(t)?,
        _ => HeaderMap::new(),
    };
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

/// The token's headers. Ray's dashboard reads `Authorization`; recent versions also accept
/// `X-Ray-Authorization`, which KubeRay sends and proxies leave alone.
fn auth_headers(token: &str) -> Result<HeaderMap, DashboardError> {
    let mut v = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
        DashboardError::TokenNotHeaderSafe {
            source_var: "RAY_AUTH_TOKEN",
        }
    })?;
    v.set_sensitive(true);
    let mut headers = HeaderMap::new();
    headers.insert(AUTHORIZATION, v.clone());
    headers.insert("x-ray-authorization", v);
    Ok(headers)
}

pub(super) fn classify(e: reqwest::Error, timeout: Duration) -> DashboardError {
    if e.is_timeout() {
        DashboardError::Timeout { after: timeout }
    } else if e.is_connect() {
        DashboardError::Unreachable { source: e }
    } else {
        DashboardError::Transport { source: e }
    }
}

/// GETs `base + uri` and returns the whole body of a 2xx answer (possibly empty); a body over
/// [`SMALL_BODY_BYTES`] waits for `budget`'s permit, within the same `timeout`.
pub(super) async fn fetch(
    client: &reqwest::Client,
    base: &str,
    uri: &str,
    timeout: Duration,
    cfg: &DashboardConfig,
    budget: &BodyBudget,
) -> Result<Body, DashboardError> {
    let url = format!("{base}{uri}");
    let had_token = cfg.has_token();
    let mut request = client.get(&url);
    if cfg.auth_token_file.is_some() {
        if let Some(t) = cfg.current_token()? {
            request = request.headers(auth_headers(&t)?);
        }
    }
    let exchange = async {
        let mut resp = request.send().await.map_err(|e| classify(e, timeout))?;
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
        let mut permit = None;
        if announced > SMALL_BODY_BYTES as u64 {
            permit = Some(budget.large().await?);
        }
        let mut body = BytesMut::with_capacity(announced as usize);
        while let Some(chunk) = resp.chunk().await.map_err(|e| classify(e, timeout))? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(DashboardError::TooLarge);
            }
            if permit.is_none() && body.len() + chunk.len() > SMALL_BODY_BYTES {
                permit = Some(budget.large().await?);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Body {
            bytes: body.freeze(),
            _permit: permit,
        })
    };
    // The client's own timeout covers the body too; this is the backstop.
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| DashboardError::Timeout { after: timeout })?
}

/// Reads the state API's node list (`{"result": true, "data": {"result": {"result": [...]}}}`)
/// and picks the node at `pod_ip`: an ALIVE one if any (after a raylet restart the dead node
/// keeps the same IP), else the most recently started one (the collector outlives Ray at
/// shutdown and still needs the id its logs belong to).
pub(super) fn pick_node(body: &[u8], pod_ip: &str) -> Result<Option<String>, DashboardError> {
    let invalid = |why: &str| DashboardError::Invalid {
        why: format!("{NODES_ENDPOINT}: {why}"),
    };
    if let Some(msg) = answer::reported_failure(body) {
        return Err(invalid(&format!("the dashboard reports a failure: {msg}")));
    }
    /// One node of the list, borrowed from the body; only the node at `pod_ip` is kept.
    #[derive(serde::Deserialize)]
    struct Node<'a> {
        #[serde(borrow, default)]
        node_id: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow, default)]
        node_ip: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow, default)]
        state: Option<std::borrow::Cow<'a, str>>,
        #[serde(default)]
        start_time_ms: Option<serde_json::Number>,
    }
    let mut best: Option<(bool, i64, String)> = None;
    let mut each = |n: Node| {
        if n.node_ip.as_deref() != Some(pod_ip) {
            return;
        }
        let Some(id) = n.node_id.as_deref().filter(|id| is_hex_id(id)) else {
            return;
        };
        let alive = n.state.as_deref() == Some("ALIVE");
        let started = n.start_time_ms.and_then(|t| t.as_i64()).unwrap_or(0);
        if best.as_ref().is_none_or(|b| (alive, started) > (b.0, b.1)) {
            best = Some((alive, started, id.to_ascii_lowercase()));
        }
    };
    let found = answer::for_each_at(body, &["data", "result", "result"], &mut each)
        .map_err(|e| invalid(&format!("not a JSON node list: {e}")))?;
    if !found {
        return Err(invalid("no data.result.result array"));
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
        cfg,
        &BodyBudget::new(),
    )
    .await?;
    pick_node(&body, pod_ip.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
