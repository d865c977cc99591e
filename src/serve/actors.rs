//! `/logical/actors` and `/logical/actors/{actor_id}`: the session's actors in the shape of
//! Ray's dashboard (`actor_head.py` of Ray 2.60: `{result, msg, data: {actors: {id: actor}}}`
//! and `{result, msg, data: {detail: actor}}`), which its Actors page and a job's Actor Table
//! read, from the actors the reader's fold kept ([`crate::reader::ActorFacts`]).
//!
//! What the events do not say is Ray's empty value: `numRestarts` `"0"`, `reprName` `""`,
//! `requiredResources` `{}`, `labelSelector` `{}`, no placement group, and no process stats
//! (`processStats`, `mem`, `gpus` are what a live dashboard samples from the node; a dead
//! session has none, so the page shows `-` there, as for a dead actor on a live cluster).
//! `address.ipAddress` is the node's IP when its events gave one, `address.port` `0`.
//! `exitDetail` is the death message of the actor's last transition, `-` without one.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::cookies::Entered;
use super::session::{answer, index};
use super::Shared;
use crate::reader::{ActorFacts, SessionFacts};
use crate::util::escape::escape_untrusted;

fn ms(ns: Option<i64>) -> i64 {
    ns.map_or(0, |n| n.div_euclid(1_000_000))
}

/// One actor, as Ray's dashboard answers it.
fn actor_json(a: &ActorFacts, ips: &HashMap<&str, &str>) -> Value {
    let node = a.node_id.as_deref().unwrap_or("");
    let class = a.class_name.as_deref().unwrap_or("");
    let updated = a.dead_ns.or(a.alive_ns);
    json!({
        "actorId": a.actor_id,
        "jobId": a.job_id.as_deref().unwrap_or(""),
        "address": {
            "nodeId": node,
            "ipAddress": ips.get(node).copied().unwrap_or(""),
            "port": 0,
            "workerId": a.worker_id.as_deref().unwrap_or(""),
        },
        "name": a.name.as_deref().unwrap_or(""),
        "className": class,
        "actorClass": class,
        "state": a.state.as_deref().unwrap_or(""),
        "numRestarts": "0",
        "timestamp": ms(updated) as f64,
        "pid": a.pid.unwrap_or(0),
        "startTime": ms(a.alive_ns),
        "endTime": ms(a.dead_ns),
        "reprName": "",
        "labelSelector": {},
        "exitDetail": a.death_message.as_deref().unwrap_or("-"),
        "requiredResources": {},
        "placementGroupId": null,
        "gpus": [],
        "tpus": [],
        "processStats": null,
        "mem": null,
    })
}

/// Node id → IP, of the nodes whose events gave one.
fn node_ips(facts: &SessionFacts) -> HashMap<&str, &str> {
    facts
        .nodes
        .iter()
        .filter_map(|n| Some((n.node_id.as_str(), n.ip.as_deref()?)))
        .collect()
}

/// The actors of `facts` on `node` (all with `None`), by id, as Ray's dashboard keys them.
pub(super) fn actors_map(facts: &SessionFacts, node: Option<&str>) -> Map<String, Value> {
    let ips = node_ips(facts);
    facts
        .actors
        .iter()
        .filter(|a| node.is_none_or(|n| a.node_id.as_deref() == Some(n)))
        .map(|a| (a.actor_id.clone(), actor_json(a, &ips)))
        .collect()
}

/// `GET /logical/actors`.
pub async fn list(State(state): State<Shared>, entered: Entered) -> Response {
    let index = match index(&state, &entered).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let body = json!({
        "result": true,
        "msg": "All actors fetched.",
        "data": {"actors": actors_map(&index.facts, None)},
    });
    answer(&entered, &index, body.to_string())
}

/// `GET /logical/actors/{actor_id}`: an unknown id is a `404` in Ray's error shape.
pub async fn one(
    State(state): State<Shared>,
    entered: Entered,
    Path(actor_id): Path<String>,
) -> Response {
    let index = match index(&state, &entered).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let wanted = actor_id.to_ascii_lowercase();
    match index.facts.actors.iter().find(|a| a.actor_id == wanted) {
        Some(a) => {
            let body = json!({
                "result": true,
                "msg": "Actor details fetched.",
                "data": {"detail": actor_json(a, &node_ips(&index.facts))},
            });
            answer(&entered, &index, body.to_string())
        }
        None => {
            let body = json!({
                "result": false,
                "msg": format!("Actor {} not found in this session.", escape_untrusted(&actor_id)),
                "data": {},
            });
            let mut r = answer(&entered, &index, body.to_string());
            *r.status_mut() = StatusCode::NOT_FOUND;
            r
        }
    }
}
