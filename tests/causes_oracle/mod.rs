//! Ray's own live answers as the oracle of `inspect --json`'s causes: shared by the real-Ray
//! test (`inspect_causes_e2e.rs`) and the test of the committed capture of its session
//! (`inspect_causes.rs`, `tests/data/causes-session`).
//!
//! The answers are what `tests/e2e/causes_workload.py` recorded from the live cluster with
//! `ray.util.state` (`list_tasks`, `list_workers`, `list_nodes`, `list_placement_groups`,
//! `list_actors`, all `detail=True`), a few seconds before the cluster was SIGKILLed.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

fn s(v: &Value) -> Option<&str> {
    v.as_str().filter(|s| !s.is_empty())
}

/// Every disagreement between Ray's answers and the report of `inspect --json
/// --pending-after 1s --failed-limit 1000`.
pub fn compare(ray: &Value, report: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let empty = Vec::new();
    let arr = |v: &Value| v.as_array().unwrap_or(&empty).clone();

    let ray_workers: BTreeMap<&str, &Value> = ray["workers"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(|w| Some((s(&w["worker_id"])?, w)))
        .collect();
    let ray_nodes: BTreeMap<&str, &Value> = ray["nodes"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(|n| Some((s(&n["node_id"])?, n)))
        .collect();

    // 1. Every failed attempt: its error, its worker (and the worker's exit), its node (and
    // the node's death).
    let failed = arr(&report["failed_tasks"]);
    let by_attempt: BTreeMap<(String, i64), &Value> = failed
        .iter()
        .filter_map(|t| Some(((s(&t["task_id"])?.to_string(), t["attempt"].as_i64()?), t)))
        .collect();
    let ray_failed: Vec<&Value> = ray["tasks"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter(|t| t["state"] == "FAILED")
        .collect();
    if ray_failed.is_empty() {
        bad.push("Ray reports no failed task: the workload did not fail".into());
    }
    if report["failed_tasks_total"].as_u64() != Some(ray_failed.len() as u64) {
        bad.push(format!(
            "failed attempts: Ray {}, inspect {}",
            ray_failed.len(),
            report["failed_tasks_total"]
        ));
    }
    for t in &ray_failed {
        let id = s(&t["task_id"]).unwrap_or_default().to_string();
        let attempt = t["attempt_number"].as_i64().unwrap_or(-1);
        let name = s(&t["name"]).unwrap_or("?");
        let Some(ours) = by_attempt.get(&(id.clone(), attempt)) else {
            bad.push(format!(
                "{name} {id} attempt {attempt}: FAILED for Ray, not in inspect's failed_tasks"
            ));
            continue;
        };
        let what = format!("{name} {id}/{attempt}");
        if ours["error_type"] != t["error_type"] {
            bad.push(format!(
                "{what}: error type {} (Ray {})",
                ours["error_type"], t["error_type"]
            ));
        }
        let worker = s(&t["worker_id"]);
        if s(&ours["worker"]["worker_id"]) != worker {
            bad.push(format!(
                "{what}: worker {} (Ray {:?})",
                ours["worker"]["worker_id"], worker
            ));
        }
        if let Some(rw) = worker.and_then(|w| ray_workers.get(w)) {
            if s(&ours["worker"]["exit_type"]) != s(&rw["exit_type"]) {
                bad.push(format!(
                    "{what}: worker exit type {} (Ray {})",
                    ours["worker"]["exit_type"], rw["exit_type"]
                ));
            }
            if s(&ours["worker"]["exit_detail"]) != s(&rw["exit_detail"]) {
                bad.push(format!(
                    "{what}: worker exit detail {} (Ray {})",
                    ours["worker"]["exit_detail"], rw["exit_detail"]
                ));
            }
            if ours["worker"]["pid"] != rw["pid"] {
                bad.push(format!(
                    "{what}: worker pid {} (Ray {})",
                    ours["worker"]["pid"], rw["pid"]
                ));
            }
        }
        let node = s(&t["node_id"]);
        if s(&ours["node"]["node_id"]) != node {
            bad.push(format!(
                "{what}: node {} (Ray {:?})",
                ours["node"]["node_id"], node
            ));
        }
        if let Some(rn) = node.and_then(|n| ray_nodes.get(n)) {
            if s(&ours["node"]["state"]) != s(&rn["state"]) {
                bad.push(format!(
                    "{what}: node state {} (Ray {})",
                    ours["node"]["state"], rn["state"]
                ));
            }
        }
        // The cause in words, as a person would say it of each of these tasks.
        let expected = match name {
            "hog" => Some("worker killed by the memory monitor"),
            "sigkill_self" | "exit_self" | "flaky" => Some("worker process died (SYSTEM_ERROR)"),
            "on_node2" => Some("node died (UNEXPECTED_TERMINATION)"),
            "Doomed.crash" => Some("actor's worker died (SYSTEM_ERROR)"),
            _ => None,
        };
        if let Some(cause) = expected {
            if s(&ours["cause"]) != Some(cause) {
                bad.push(format!(
                    "{what}: cause {} (expected {cause:?})",
                    ours["cause"]
                ));
            }
        }
    }
    // The causes are grouped: one group per distinct cause, the counts adding up.
    let groups = arr(&report["failure_causes"]);
    let task_groups: u64 = groups.iter().filter_map(|g| g["attempts"].as_u64()).sum();
    if task_groups != ray_failed.len() as u64 {
        bad.push(format!(
            "cause groups count {task_groups} attempts, Ray {}",
            ray_failed.len()
        ));
    }
    let keys: BTreeSet<(String, String, String)> = groups
        .iter()
        .map(|g| {
            (
                g["cause"].to_string(),
                g["node_id"].to_string(),
                g["exit_type"].to_string(),
            )
        })
        .collect();
    if keys.len() != groups.len() {
        bad.push(format!("a cause is listed twice: {groups:?}"));
    }

    // 2. Every worker Ray knows to have died other than by intent is a worker death, with
    // Ray's exit type, detail, pid and node; no other worker is.
    let deaths: BTreeMap<&str, &Value> = report["worker_deaths"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(|d| Some((s(&d["worker_id"])?, d)))
        .collect();
    let mut ray_deaths = 0;
    for (id, w) in &ray_workers {
        let exit = s(&w["exit_type"]);
        if exit.is_none_or(|e| e.starts_with("INTENDED")) {
            if deaths.contains_key(id) {
                bad.push(format!(
                    "worker {id}: a death for inspect, {exit:?} for Ray"
                ));
            }
            continue;
        }
        ray_deaths += 1;
        let Some(d) = deaths.get(id) else {
            bad.push(format!(
                "worker {id}: died ({exit:?}) for Ray, not in worker_deaths"
            ));
            continue;
        };
        for (ours, theirs) in [
            ("exit_type", "exit_type"),
            ("exit_detail", "exit_detail"),
            ("node_id", "node_id"),
            ("pid", "pid"),
        ] {
            if d[ours] != w[theirs] {
                bad.push(format!(
                    "worker {id}: {ours} {} (Ray {})",
                    d[ours], w[theirs]
                ));
            }
        }
    }
    if ray_deaths == 0 {
        bad.push("Ray reports no worker death: the workload did not kill any".into());
    }
    if report["worker_deaths_total"].as_u64() != Some(ray_deaths) {
        bad.push(format!(
            "worker deaths: Ray {ray_deaths}, inspect {}",
            report["worker_deaths_total"]
        ));
    }

    // 3. Every node: its state; a dead one's reason and message, and it is among the nodes
    // that ended the session.
    let nodes: BTreeMap<&str, &Value> = report["nodes"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(|n| Some((s(&n["node_id"])?, n)))
        .collect();
    let died: BTreeSet<&str> = report["session_end"]["nodes_died"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(|n| s(&n["node_id"]))
        .collect();
    let mut dead = 0;
    for (id, n) in &ray_nodes {
        let Some(ours) = nodes.get(id) else {
            bad.push(format!("node {id}: not in inspect's nodes"));
            continue;
        };
        if ours["state"] != n["state"] {
            bad.push(format!(
                "node {id}: state {} (Ray {})",
                ours["state"], n["state"]
            ));
        }
        if n["state"] == "DEAD" {
            dead += 1;
            let message = s(&n["state_message"]).unwrap_or_default();
            let reason_words = s(&ours["death_reason"])
                .unwrap_or_default()
                .replace('_', " ")
                .to_lowercase();
            if !message.to_lowercase().starts_with(&reason_words)
                || !s(&ours["death_message"]).is_some_and(|m| message.ends_with(m))
            {
                bad.push(format!(
                    "node {id}: death {} / {} (Ray: {message:?})",
                    ours["death_reason"], ours["death_message"]
                ));
            }
            if !died.contains(id) {
                bad.push(format!(
                    "node {id}: dead for Ray, not in session_end.nodes_died"
                ));
            }
        }
    }
    if dead == 0 {
        bad.push("Ray reports no dead node: the second raylet was not killed".into());
    }

    // 4. What was still going: each task of the workload's job (the job of its failed tasks)
    // Ray had RUNNING or PENDING is unfinished, in its state, and there are as many as Ray had.
    // Only that job: the workload holds its own tasks still until the kill, while tasks of
    // Ray's own jobs (Ray Data's stats actor, ...) go on running and finishing in the seconds
    // between Ray's answers and the kill, so their last state cannot be Ray's answer's.
    let workload_jobs: BTreeSet<&str> = ray_failed.iter().filter_map(|t| s(&t["job_id"])).collect();
    let unfinished: Vec<Value> = arr(&report["session_end"]["tasks_unfinished"])
        .into_iter()
        .filter(|u| s(&u["job_id"]).is_some_and(|j| workload_jobs.contains(j)))
        .collect();
    let mut ray_open: BTreeMap<(String, String), u64> = BTreeMap::new();
    for t in ray["tasks"].as_array().unwrap_or(&empty) {
        let state = s(&t["state"]).unwrap_or_default();
        if state == "FINISHED" || state == "FAILED" {
            continue;
        }
        if !s(&t["job_id"]).is_some_and(|j| workload_jobs.contains(j)) {
            continue;
        }
        *ray_open
            .entry((
                state.to_string(),
                s(&t["job_id"]).unwrap_or_default().to_string(),
            ))
            .or_default() += 1;
    }
    let mut ours_open: BTreeMap<(String, String), u64> = BTreeMap::new();
    for u in &unfinished {
        *ours_open
            .entry((
                s(&u["state"]).unwrap_or_default().to_string(),
                s(&u["job_id"]).unwrap_or_default().to_string(),
            ))
            .or_default() += u["count"].as_u64().unwrap_or(0);
    }
    if ray_open != ours_open {
        bad.push(format!(
            "unfinished tasks by (state, job): Ray {ray_open:?}, inspect {ours_open:?}"
        ));
    }
    if !arr(&report["session_end"]["jobs_unfinished"])
        .iter()
        .any(|j| s(&j["job_id"]).is_some())
    {
        bad.push("no job reported unfinished, but the driver was SIGKILLed".into());
    }

    // 5. What hung: each placement group Ray had pending, with its bundles; the task that
    // asked for a GPU, and why it never fits.
    let pgs: BTreeMap<&str, &Value> = report["hangs"]["placement_groups"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(|p| Some((s(&p["placement_group_id"])?, p)))
        .collect();
    let mut pending_pgs = 0;
    for pg in ray["placement_groups"].as_array().unwrap_or(&empty) {
        if pg["state"] == "CREATED" || pg["state"] == "REMOVED" {
            continue;
        }
        pending_pgs += 1;
        let id = s(&pg["placement_group_id"]).unwrap_or_default();
        let Some(ours) = pgs.get(id) else {
            bad.push(format!(
                "placement group {id}: {} for Ray, not in hangs",
                pg["state"]
            ));
            continue;
        };
        let bundles: Vec<Value> = pg["bundles"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .map(|b| b["unit_resources"].clone())
            .collect();
        if ours["bundles"] != Value::Array(bundles.clone()) || ours["state"] != pg["state"] {
            bad.push(format!(
                "placement group {id}: {} {} (Ray {} {bundles:?})",
                ours["state"], ours["bundles"], pg["state"]
            ));
        }
        if s(&ours["unsatisfiable"]).is_none() {
            bad.push(format!("placement group {id}: no reason it never fits"));
        }
    }
    if pending_pgs == 0 {
        bad.push("Ray reports no pending placement group".into());
    }
    let pending = arr(&report["hangs"]["pending_tasks"]);
    for t in ray["tasks"].as_array().unwrap_or(&empty) {
        if !s(&t["state"]).is_some_and(|st| st.starts_with("PENDING")) {
            continue;
        }
        let id = s(&t["task_id"]).unwrap_or_default();
        match pending.iter().find(|p| s(&p["task_id"]) == Some(id)) {
            None => bad.push(format!(
                "task {id} {}: pending for Ray, not in hangs",
                t["name"]
            )),
            Some(p) => {
                if t["name"] == "needs_gpu"
                    && !s(&p["unsatisfiable"]).is_some_and(|u| u.starts_with("GPU: 1 asked"))
                {
                    bad.push(format!(
                        "needs_gpu: why it never fits: {}",
                        p["unsatisfiable"]
                    ));
                }
            }
        }
    }
    bad
}
