//! Merging facts into one session model: events deduplicated by id, state transitions merged
//! across events (the latest timestamp wins; ties go to the later state in Ray's enum, so a
//! terminal state wins), task attempts keyed by task id and attempt.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::extract::{
    bounded, ActorTransition, Body, Fact, NodeTransition, TaskKey, TrainAttemptEvent,
    TrainRunEvent, TrainWorker, Transition,
};

/// Rank of a state within its entity's enum, to break timestamp ties toward the later state.
pub(super) fn state_rank(state: &str) -> u8 {
    match state {
        // TaskStatus
        "NIL" => 0,
        "PENDING_ARGS_AVAIL" => 1,
        "PENDING_NODE_ASSIGNMENT" => 2,
        "PENDING_OBJ_STORE_MEM_AVAIL" => 3,
        "PENDING_ARGS_FETCH" => 4,
        "SUBMITTED_TO_WORKER" => 5,
        "PENDING_ACTOR_TASK_ARGS_FETCH" => 6,
        "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY" => 7,
        "RUNNING" => 8,
        "RUNNING_IN_RAY_GET" => 9,
        "RUNNING_IN_RAY_WAIT" => 10,
        "FINISHED" => 11,
        "FAILED" => 12,
        // Actor, node and driver-job states
        "DEPENDENCIES_UNREADY" | "CREATED" => 1,
        "PENDING_CREATION" => 2,
        "ALIVE" => 3,
        "RESTARTING" => 4,
        "DEAD" => 5,
        _ => 0,
    }
}

/// Orders transitions: by time (unknown first), then by state rank.
pub(super) fn transition_order(t: &Transition) -> (i64, u8) {
    (t.time_ns.unwrap_or(i64::MIN), state_rank(&t.state))
}

/// Keeps `slot` at the later of itself and `t`.
pub(super) fn keep_latest<T: Clone>(slot: &mut Option<(Transition, T)>, t: &Transition, extra: &T) {
    if slot
        .as_ref()
        .is_none_or(|(cur, _)| transition_order(t) > transition_order(cur))
    {
        *slot = Some((t.clone(), extra.clone()));
    }
}

/// Sets `slot` if it is empty.
pub(super) fn fill<T>(slot: &mut Option<T>, value: Option<T>) {
    if slot.is_none() {
        *slot = value;
    }
}

#[derive(Debug, Default)]
pub(super) struct NodeModel {
    pub(super) ip: Option<String>,
    pub(super) hostname: Option<String>,
    pub(super) is_head: Option<bool>,
    /// The node's own start time (definition event, export event).
    pub(super) started_ns: Option<i64>,
    /// The first ALIVE transition, when no start time was given.
    pub(super) alive_ns: Option<i64>,
    pub(super) latest: Option<(Transition, NodeTransition)>,
    pub(super) resources: Option<BTreeMap<String, f64>>,
    pub(super) ended_ns: Option<i64>,
    pub(super) objects: u64,
    pub(super) bytes: u64,
    pub(super) log_objects: u64,
    pub(super) log_bytes: u64,
}

#[derive(Debug, Default)]
pub(super) struct JobModel {
    pub(super) entrypoint: Option<String>,
    pub(super) driver_pid: Option<i64>,
    pub(super) driver_node_id: Option<String>,
    pub(super) transitions: HashSet<Transition>,
    pub(super) export: Option<(bool, Option<i64>, Option<i64>)>,
}

#[derive(Debug, Default)]
pub(super) struct TaskModel {
    pub(super) job_id: Option<String>,
    pub(super) name: Option<String>,
    pub(super) task_type: Option<String>,
    pub(super) latest: Option<(Transition, ())>,
    pub(super) failed_at: Option<i64>,
    pub(super) error_type: Option<String>,
    pub(super) error_message: Option<String>,
    pub(super) node_id: Option<String>,
    pub(super) worker_id: Option<String>,
}

#[derive(Debug, Default)]
pub(super) struct ActorModel {
    pub(super) job_id: Option<String>,
    pub(super) class_name: Option<String>,
    pub(super) name: Option<String>,
    pub(super) latest: Option<(Transition, ActorTransition)>,
    pub(super) node_id: Option<String>,
    pub(super) pid: Option<i64>,
}

/// A status report of a Train run or attempt, ordered by (time, object, position).
#[derive(Debug, Clone)]
pub(super) struct StatusPoint {
    pub(super) order: (i64, usize, u64),
    pub(super) status: String,
    pub(super) detail: Option<String>,
}

#[derive(Debug, Default)]
pub(super) struct TrainRunModel {
    pub(super) latest: Option<((i64, usize, u64), TrainRunEvent)>,
    pub(super) started_ns: Option<i64>,
    pub(super) ended_ns: Option<i64>,
    pub(super) history: Vec<StatusPoint>,
}

#[derive(Debug, Default)]
pub(super) struct TrainAttemptModel {
    pub(super) latest: Option<((i64, usize, u64), TrainAttemptEvent)>,
    pub(super) started_ns: Option<i64>,
    pub(super) ended_ns: Option<i64>,
    pub(super) history: Vec<StatusPoint>,
    pub(super) workers: Option<((i64, usize, u64), Vec<TrainWorker>)>,
}

/// Everything learned about a session, merged from all objects read.
#[derive(Debug, Default)]
pub(super) struct SessionModel {
    pub(super) job_filter: Option<String>,
    pub(super) seen_event_ids: HashSet<String>,
    pub(super) total: u64,
    pub(super) duplicates: u64,
    pub(super) other_job: u64,
    pub(super) by_type: BTreeMap<String, u64>,
    pub(super) nodes: BTreeMap<String, NodeModel>,
    pub(super) jobs: BTreeMap<String, JobModel>,
    pub(super) tasks: HashMap<TaskKey, TaskModel>,
    pub(super) actors: BTreeMap<String, ActorModel>,
    pub(super) runs: BTreeMap<String, TrainRunModel>,
    pub(super) attempts: BTreeMap<(String, String), TrainAttemptModel>,
}

impl SessionModel {
    /// Takes one fact of object number `object` (objects are numbered in hour order).
    pub(super) fn absorb(&mut self, object: usize, fact: Fact) {
        if let Some(id) = &fact.event_id {
            if !self.seen_event_ids.insert(id.clone()) {
                self.duplicates += 1;
                return;
            }
        }
        if let (Some(want), Some(job)) = (&self.job_filter, fact.body.job_id()) {
            if want != job {
                self.other_job += 1;
                return;
            }
        }
        self.total += 1;
        *self
            .by_type
            .entry(bounded(&fact.event_type, 64))
            .or_default() += 1;
        let order = (fact.time_ns.unwrap_or(i64::MIN), object, fact.seq);
        match fact.body {
            Body::Other => {}
            Body::NodeDefinition {
                node_id,
                ip,
                hostname,
                started_ns,
            } => {
                let n = self.nodes.entry(node_id).or_default();
                fill(&mut n.ip, ip);
                fill(&mut n.hostname, hostname);
                fill(&mut n.started_ns, started_ns);
            }
            Body::NodeLifecycle {
                node_id,
                transitions,
            } => {
                let n = self.nodes.entry(node_id).or_default();
                for t in transitions {
                    absorb_node_transition(n, t);
                }
            }
            Body::ExportNode {
                node_id,
                ip,
                is_head,
                started_ns,
                transition,
            } => {
                let n = self.nodes.entry(node_id).or_default();
                fill(&mut n.ip, ip);
                fill(&mut n.is_head, is_head);
                fill(&mut n.started_ns, started_ns);
                absorb_node_transition(n, transition);
            }
            Body::DriverJobDefinition {
                job_id,
                entrypoint,
                driver_pid,
                driver_node_id,
            } => {
                let j = self.jobs.entry(job_id).or_default();
                fill(&mut j.entrypoint, entrypoint);
                fill(&mut j.driver_pid, driver_pid);
                fill(&mut j.driver_node_id, driver_node_id);
            }
            Body::DriverJobLifecycle {
                job_id,
                transitions,
            } => {
                self.jobs
                    .entry(job_id)
                    .or_default()
                    .transitions
                    .extend(transitions);
            }
            Body::ExportDriverJob {
                job_id,
                entrypoint,
                is_dead,
                started_ns,
                ended_ns,
                driver_pid,
            } => {
                let j = self.jobs.entry(job_id).or_default();
                fill(&mut j.entrypoint, entrypoint);
                fill(&mut j.driver_pid, driver_pid);
                let dead_before = j.export.is_some_and(|(dead, _, _)| dead);
                if !dead_before {
                    j.export = Some((is_dead, started_ns, ended_ns));
                }
            }
            Body::TaskDefinition {
                task,
                job_id,
                name,
                task_type,
            } => {
                let t = self.tasks.entry(task).or_default();
                fill(&mut t.job_id, job_id);
                fill(&mut t.name, name);
                fill(&mut t.task_type, task_type);
            }
            Body::TaskLifecycle(life) => {
                let life = *life;
                if let Some(job) = &life.job_id {
                    self.jobs.entry(job.clone()).or_default();
                }
                let t = self.tasks.entry(life.task).or_default();
                fill(&mut t.job_id, life.job_id);
                fill(&mut t.node_id, life.node_id);
                fill(&mut t.worker_id, life.worker_id);
                let mut failed_here = false;
                for tr in &life.transitions {
                    keep_latest(&mut t.latest, tr, &());
                    if tr.state == "FAILED" {
                        failed_here = true;
                        if let Some(at) = tr.time_ns {
                            t.failed_at = Some(t.failed_at.map_or(at, |cur| cur.min(at)));
                        }
                    }
                }
                if let Some((error_type, error_message)) = life.error {
                    // The FAILED event's error wins over one seen elsewhere.
                    if failed_here || t.error_type.is_none() {
                        t.error_type = error_type.or(t.error_type.take());
                        t.error_message = error_message.or(t.error_message.take());
                    }
                }
            }
            Body::ActorDefinition {
                actor_id,
                job_id,
                class_name,
                name,
            } => {
                let a = self.actors.entry(actor_id).or_default();
                fill(&mut a.job_id, job_id);
                fill(&mut a.class_name, class_name);
                fill(&mut a.name, name);
            }
            Body::ActorLifecycle {
                actor_id,
                transitions,
            } => {
                let a = self.actors.entry(actor_id).or_default();
                for t in transitions {
                    absorb_actor_transition(a, t);
                }
            }
            Body::ExportActor {
                actor_id,
                job_id,
                class_name,
                name,
                transition,
            } => {
                let a = self.actors.entry(actor_id).or_default();
                fill(&mut a.job_id, job_id);
                fill(&mut a.class_name, class_name);
                fill(&mut a.name, name);
                absorb_actor_transition(a, transition);
            }
            Body::TrainRun(run) => {
                let run = *run;
                if let Some(job) = &run.job_id {
                    self.jobs.entry(job.clone()).or_default();
                }
                let r = self.runs.entry(run.run_id.clone()).or_default();
                fill(&mut r.started_ns, run.started_ns);
                if run.ended_ns.is_some() {
                    r.ended_ns = run.ended_ns;
                }
                if let Some(status) = &run.status {
                    r.history.push(StatusPoint {
                        order,
                        status: status.clone(),
                        detail: run.status_detail.clone(),
                    });
                }
                if r.latest.as_ref().is_none_or(|(o, _)| order > *o) {
                    r.latest = Some((order, run));
                }
            }
            Body::TrainRunAttempt(attempt) => {
                let attempt = *attempt;
                let key = (attempt.run_id.clone(), attempt.attempt_id.clone());
                let a = self.attempts.entry(key).or_default();
                fill(&mut a.started_ns, attempt.started_ns);
                if attempt.ended_ns.is_some() {
                    a.ended_ns = attempt.ended_ns;
                }
                if let Some(status) = &attempt.status {
                    a.history.push(StatusPoint {
                        order,
                        status: status.clone(),
                        detail: attempt.status_detail.clone(),
                    });
                }
                if !attempt.workers.is_empty() && a.workers.as_ref().is_none_or(|(o, _)| order > *o)
                {
                    a.workers = Some((order, attempt.workers.clone()));
                }
                if a.latest.as_ref().is_none_or(|(o, _)| order > *o) {
                    a.latest = Some((order, attempt));
                }
            }
        }
    }
}

pub(super) fn absorb_node_transition(n: &mut NodeModel, t: NodeTransition) {
    if t.state.state == "DEAD" {
        if let Some(at) = t.state.time_ns {
            n.ended_ns = Some(n.ended_ns.map_or(at, |cur| cur.max(at)));
        }
    }
    if t.state.state == "ALIVE" {
        if let Some(at) = t.state.time_ns {
            n.alive_ns = Some(n.alive_ns.map_or(at, |cur| cur.min(at)));
        }
    }
    if let Some(r) = &t.resources {
        if !r.is_empty() {
            if r.contains_key("node:__internal_head__") {
                n.is_head = Some(true);
            }
            n.resources = Some(r.clone());
        }
    }
    let state = t.state.clone();
    keep_latest(&mut n.latest, &state, &t);
}

pub(super) fn absorb_actor_transition(a: &mut ActorModel, t: ActorTransition) {
    if t.state.state == "ALIVE" || t.node_id.is_some() {
        if t.node_id.is_some() {
            a.node_id = t.node_id.clone();
        }
        if t.pid.is_some() {
            a.pid = t.pid;
        }
    }
    let state = t.state.clone();
    keep_latest(&mut a.latest, &state, &t);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_transition_wins_and_ties_go_to_terminal_states() {
        let mut slot = None;
        let t = |state: &str, ns: i64| Transition {
            state: state.into(),
            time_ns: Some(ns),
        };
        keep_latest(&mut slot, &t("FAILED", 5), &());
        keep_latest(&mut slot, &t("RUNNING", 3), &());
        keep_latest(&mut slot, &t("SUBMITTED_TO_WORKER", 5), &());
        assert_eq!(slot.unwrap().0.state, "FAILED");
    }
}
