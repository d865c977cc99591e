//! `/nodes?view=summary`, `/nodes?view=hostNameList` and `/nodes/{node_id}`: the session's
//! nodes in the shape of Ray's dashboard (`node_head.py` of Ray 2.60), which its Cluster page,
//! a job's page ("View all nodes", the log viewer's node list) and a node's page read, from
//! the nodes the reader's fold kept ([`crate::reader::NodeFacts`]).
//!
//! A node is what its events said: its id, IP, hostname, head or not, state, start and end,
//! death message and total resources, under `raylet` as Ray puts them. The physical stats a
//! live dashboard samples (`cpu`, `mem`, `disk`, `network`, the processes) are absent, as Ray
//! answers for a node that is gone; so are labels and ports, which the events do not carry.
//! `/nodes/{id}` adds the node's actors (`actors`), no workers, and the empty load average
//! and traffic its page cannot draw without.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::actors::actors_map;
use super::cookies::Entered;
use super::session::{answer, index, unix_ms};
use super::Shared;
use crate::reader::NodeFacts;
use crate::util::escape::escape_untrusted;

/// One node's summary, as Ray's dashboard answers it for a node without physical stats.
fn node_json(n: &NodeFacts) -> Value {
    let ip = n.ip.as_deref().unwrap_or("");
    let hostname = n.hostname.as_deref().unwrap_or("");
    let time = |t: &Option<String>| t.as_deref().and_then(unix_ms).unwrap_or(0).to_string();
    json!({
        "hostname": hostname,
        "ip": ip,
        "raylet": {
            "nodeId": n.node_id,
            "state": n.state.as_deref().unwrap_or(""),
            "isHeadNode": n.is_head.unwrap_or(false),
            "nodeManagerAddress": ip,
            "nodeManagerHostname": hostname,
            "nodeName": ip,
            "resourcesTotal": n.resources,
            "startTimeMs": time(&n.started),
            "endTimeMs": time(&n.ended),
            "labels": {},
            "stateMessage": n.death_message,
            "objectStoreUsedMemory": 0,
            "objectStoreAvailableMemory": 0,
        },
    })
}

fn error(
    entered: &Entered,
    index: &super::index::SessionIndex,
    status: StatusCode,
    msg: String,
) -> Response {
    let body = json!({"result": false, "msg": msg, "data": {}});
    let mut r = answer(entered, index, body.to_string());
    *r.status_mut() = status;
    r
}

/// `GET /nodes?view=summary|hostNameList`.
pub async fn list(
    State(state): State<Shared>,
    entered: Entered,
    RawQuery(query): RawQuery,
) -> Response {
    let index = match index(&state, &entered).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let view = url::form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "view")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let nodes = &index.facts.nodes;
    let body = if view.eq_ignore_ascii_case("summary") {
        json!({
            "result": true,
            "msg": "Node summary fetched.",
            "data": {
                "summary": nodes.iter().map(node_json).collect::<Vec<_>>(),
                "nodeLogicalResources": {},
            },
        })
    } else if view.eq_ignore_ascii_case("hostNameList") {
        let alive: Vec<&str> = nodes
            .iter()
            .filter(|n| n.state.as_deref() == Some("ALIVE"))
            .filter_map(|n| n.hostname.as_deref())
            .collect();
        json!({
            "result": true,
            "msg": "Node hostname list fetched.",
            "data": {"hostNameList": alive},
        })
    } else {
        return error(
            &entered,
            &index,
            StatusCode::BAD_REQUEST,
            format!("Unknown view {}", escape_untrusted(&view)),
        );
    };
    answer(&entered, &index, body.to_string())
}

/// `GET /nodes/{node_id}`: an unknown id is a `404` in Ray's error shape.
pub async fn one(
    State(state): State<Shared>,
    entered: Entered,
    Path(node_id): Path<String>,
) -> Response {
    let index = match index(&state, &entered).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let wanted = node_id.to_ascii_lowercase();
    let Some(n) = index.facts.nodes.iter().find(|n| n.node_id == wanted) else {
        return error(
            &entered,
            &index,
            StatusCode::NOT_FOUND,
            format!(
                "Node {} not found in this session.",
                escape_untrusted(&node_id)
            ),
        );
    };
    let mut detail = node_json(n);
    // The node page reads these without asking whether they are there (Ray 2.60's frontend
    // fails to draw without them): no load average, no traffic, no workers sampled.
    detail["loadAvg"] = json!([null, null]);
    detail["networkSpeed"] = json!([0, 0]);
    detail["workers"] = json!([]);
    detail["actors"] = Value::Object(actors_map(&index.facts, Some(&n.node_id)));
    let body = json!({
        "result": true,
        "msg": "Node details fetched.",
        "data": {"detail": detail},
    });
    answer(&entered, &index, body.to_string())
}
