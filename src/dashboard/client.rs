//! Requests to the dashboard: one client with the token (never following redirects, which
//! could carry it elsewhere), bounded bodies, and every failure sorted into the outcome that
//! the metrics and logs report.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};

use super::config::DashboardConfig;
use super::{DashboardError, MAX_BODY_BYTES, NODES_ENDPOINT};
use crate::contract::ids::is_hex_id;

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

/// GETs `base + uri` and returns the whole body of a 2xx answer (possibly empty).
pub(super) async fn fetch(
    client: &reqwest::Client,
    base: &str,
    uri: &str,
    timeout: Duration,
    cfg: &DashboardConfig,
) -> Result<Bytes, DashboardError> {
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

/// Reads the state API's node list (`{"result": true, "data": {"result": {"result": [...]}}}`)
/// and picks the node at `pod_ip`: an ALIVE one if any (after a raylet restart the dead node
/// keeps the same IP), else the most recently started one (the collector outlives Ray at
/// shutdown and still needs the id its logs belong to).
pub(super) fn pick_node(body: &[u8], pod_ip: &str) -> Result<Option<String>, DashboardError> {
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
    let body = fetch(&client, &base, NODES_ENDPOINT, cfg.request_timeout, cfg).await?;
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
