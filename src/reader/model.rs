//! Merging facts into one session model: events deduplicated by id within a bounded window,
//! state transitions merged across events (the latest timestamp wins; ties go to the later
//! state in Ray's enum, so a terminal state wins), task attempts folded by [`TaskStore`].
//!
//! # Deduplication, bounded
//!
//! Remembering every event id would cost memory per event. Duplicates in a bucket come from
//! Ray resending a batch it timed out on (seconds later, to the same node's collector), from
//! a collector that restarted, or from KubeRay's collector, which keeps no ids at all; they
//! land in the same or neighbouring objects. So the last [`DEDUP_WINDOW`] event ids read are
//! remembered (as 64-bit hashes); a duplicate further apart is counted twice in `events`, but
//! cannot change any state: every merge below is idempotent (latest wins, minima, fill once).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::extract::{
    bounded, ActorTransition, Body, Fact, JobConfig, NodeTransition, SubmissionJob,
    TrainAttemptEvent, TrainRunEvent, TrainWorker, Transition, WorkerTransition,
};
use super::task::{CompactId, TaskStore};
pub(super) use super::values::state_rank;
use crate::util::dedup::{DedupWindow, PassThrough};

/// Event ids remembered for deduplication: 4 MiB of ring and about 10 MiB of set; Ray's
/// resends and this collector's own window (262,144 ids) fit in it many times over.
pub(super) const DEDUP_WINDOW: usize = 1 << 19;

/// How many events ahead [`SessionModel::absorb_all`] starts loading a window slot: about
/// as many as cover a miss to memory.
const DEDUP_PREFETCH_AHEAD: usize = 8;

/// Orders transitions: by time (unknown first), then by state rank.
pub(super) fn transition_order(t: &Transition) -> (i64, u8) {
    (t.time_ns.unwrap_or(i64::MIN), state_rank(&t.state))
}

/// Keeps `slot` at the later of itself and `t`. Two different ones of one time and rank
/// (events that disagree) are told apart by their whole text, the least kept, so that the
/// read order does not choose (review r56d D3). Equal ones (Ray repeats a transition in
/// later lifecycle events) are common and cost a comparison; different ones are rare, so
/// the text is built only for them.
pub(super) fn keep_latest<T: Clone + PartialEq + std::fmt::Debug>(
    slot: &mut Option<(Transition, T)>,
    t: &Transition,
    extra: &T,
) {
    let later = match slot.as_ref() {
        None => true,
        Some((cur, cur_extra)) => match transition_order(t).cmp(&transition_order(cur)) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal if t == cur && extra == cur_extra => false,
            std::cmp::Ordering::Equal => {
                format!("{t:?}{extra:?}") < format!("{cur:?}{cur_extra:?}")
            }
        },
    };
    if later {
        *slot = Some((t.clone(), extra.clone()));
    }
}

/// Sets `slot` if it is empty.
pub(super) fn fill<T>(slot: &mut Option<T>, value: Option<T>) {
    if slot.is_none() {
        *slot = value;
    }
}

/// Keeps in `slot` the least of itself and `value`: for what a node's, an actor's or a
/// worker's events should agree on, so that events that do not (an inconsistent or hostile
/// bucket) give the same report in whatever order they are read (review r56d D3).
pub(super) fn fill_least<T: Ord>(slot: &mut Option<T>, value: Option<T>) {
    if let Some(v) = value {
        if slot.as_ref().is_none_or(|cur| v < *cur) {
            *slot = Some(v);
        }
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
    /// The resources of the latest transition that gave any (review r56f E1: the last read).
    pub(super) resources: Option<BTreeMap<String, f64>>,
    pub(super) resources_given: Option<(Transition, BTreeMap<String, f64>)>,
    pub(super) ended_ns: Option<i64>,
    /// The latest time an event speaks of this node (its transitions, its workers', the task
    /// transitions on it): when it was last heard of.
    pub(super) last_heard_ns: Option<i64>,
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
    /// The driver's IP (`EXPORT_DRIVER_JOB`'s `driver_ip_address`).
    pub(super) driver_ip: Option<String>,
    pub(super) transitions: HashSet<Transition>,
    pub(super) export: Option<(bool, Option<i64>, Option<i64>)>,
    /// A driver job event (pushed or export) spoke of it; false for a job known only from
    /// its tasks, actors or Train runs.
    pub(super) recorded: bool,
    /// Its config's metadata and runtime env, from the first driver job event that had them.
    pub(super) config: JobConfig,
}

/// The newest record of a submitted job (`EXPORT_SUBMISSION_JOB`), and where it came.
#[derive(Debug)]
pub(super) struct SubmissionModel {
    pub(super) order: (i64, usize, u64),
    pub(super) job: SubmissionJob,
}

/// Ray's terminal states of a submitted job: a record in one of them is never replaced by a
/// later-read record of a state before it.
const SUBMISSION_TERMINAL: [&str; 3] = ["STOPPED", "SUCCEEDED", "FAILED"];

#[derive(Debug, Default)]
pub(super) struct ActorModel {
    pub(super) job_id: Option<String>,
    pub(super) class_name: Option<String>,
    pub(super) name: Option<String>,
    pub(super) latest: Option<(Transition, ActorTransition)>,
    /// Where it runs: the node and pid of the latest transition that named them (review
    /// r56f E2: an actor restarted on another node showed the last read).
    pub(super) node_id: Option<String>,
    pub(super) pid: Option<i64>,
    pub(super) node_given: Option<(Transition, String)>,
    pub(super) pid_given: Option<(Transition, i64)>,
    /// First ALIVE and last DEAD transition (its lifetime on the timeline).
    pub(super) alive_ns: Option<i64>,
    pub(super) dead_ns: Option<i64>,
}

/// A worker process, from `WORKER_DEFINITION_EVENT` and `WORKER_LIFECYCLE_EVENT`.
#[derive(Debug, Default)]
pub(super) struct WorkerModel {
    pub(super) node_id: Option<String>,
    pub(super) pid: Option<i64>,
    pub(super) worker_type: Option<String>,
    pub(super) job_id: Option<String>,
    pub(super) alive_ns: Option<i64>,
    pub(super) latest: Option<(Transition, WorkerTransition)>,
    /// The DEAD transition: (time, exit type, exit detail).
    pub(super) death: Option<(Option<i64>, Option<String>, Option<String>)>,
    /// The latest time of its events, for its node's "last heard of", given once every
    /// event is read ([`SessionModel::heard_of_workers`]).
    pub(super) last_ns: Option<i64>,
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
#[derive(Debug)]
pub(super) struct SessionModel {
    pub(super) job_filter: Option<String>,
    /// The job filter as bytes, to compare with task events' ids.
    job_filter_id: Option<CompactId>,
    /// Jobs of task events already entered in `jobs`.
    task_jobs: HashSet<CompactId, PassThrough>,
    pub(super) seen_event_ids: DedupWindow,
    /// The event ids of the batch being absorbed (reused).
    ids_ahead: Vec<Option<u64>>,
    pub(super) total: u64,
    pub(super) duplicates: u64,
    pub(super) other_job: u64,
    pub(super) by_type: BTreeMap<String, u64>,
    pub(super) nodes: BTreeMap<String, NodeModel>,
    pub(super) jobs: BTreeMap<String, JobModel>,
    /// Submitted jobs by submission id (`EXPORT_SUBMISSION_JOB`).
    pub(super) submissions: BTreeMap<String, SubmissionModel>,
    pub(super) tasks: TaskStore,
    pub(super) actors: BTreeMap<String, ActorModel>,
    pub(super) workers: BTreeMap<String, WorkerModel>,
    /// The latest event time of the session: when its events stop.
    pub(super) last_event_ns: Option<i64>,
    /// The latest task transition on each node (by the node's id bytes).
    pub(super) task_node_last: HashMap<CompactId, i64, PassThrough>,
    pub(super) runs: BTreeMap<String, TrainRunModel>,
    pub(super) attempts: BTreeMap<(String, String), TrainAttemptModel>,
    /// How many times more input is still to come than was read (sizes a spill).
    pub(super) growth: f64,
    /// A failure of the local spill files: the task counts are then incomplete.
    pub(super) spill_error: Option<std::io::Error>,
}

impl SessionModel {
    pub(super) fn new(job_filter: Option<String>, tasks: TaskStore) -> SessionModel {
        SessionModel {
            job_filter_id: job_filter.as_deref().and_then(CompactId::from_hex),
            task_jobs: HashSet::default(),
            job_filter,
            seen_event_ids: DedupWindow::new(DEDUP_WINDOW),
            ids_ahead: Vec::new(),
            total: 0,
            duplicates: 0,
            other_job: 0,
            by_type: BTreeMap::new(),
            nodes: BTreeMap::new(),
            jobs: BTreeMap::new(),
            submissions: BTreeMap::new(),
            tasks,
            actors: BTreeMap::new(),
            workers: BTreeMap::new(),
            last_event_ns: None,
            task_node_last: HashMap::default(),
            runs: BTreeMap::new(),
            attempts: BTreeMap::new(),
            growth: 0.0,
            spill_error: None,
        }
    }

    /// Takes a batch of facts of object number `object`, in order, leaving `facts` empty.
    /// The deduplication window's slot of each event is asked for [`DEDUP_PREFETCH_AHEAD`]
    /// events before it is needed: the window is far larger than the CPU caches, and
    /// waiting for each lookup was the fold's largest cost on big sessions.
    pub(super) fn absorb_all(&mut self, object: usize, facts: &mut Vec<Fact>) {
        let mut ahead = std::mem::take(&mut self.ids_ahead);
        ahead.clear();
        ahead.extend(facts.iter().map(|f| f.event_id));
        for &id in ahead.iter().take(DEDUP_PREFETCH_AHEAD).flatten() {
            self.seen_event_ids.prefetch(id);
        }
        for (i, fact) in facts.drain(..).enumerate() {
            if let Some(Some(id)) = ahead.get(i + DEDUP_PREFETCH_AHEAD) {
                self.seen_event_ids.prefetch(*id);
            }
            self.absorb(object, fact);
        }
        self.ids_ahead = ahead;
    }

    /// Gives each worker's node the latest time of the worker's events, once every event is
    /// read and the worker's node is settled: applied as events came, it went to whichever
    /// node the worker was named on so far, and lifecycle events read before the definition
    /// were lost (reviews r56f E3, r56g F1: a worker named on two nodes left a node row and
    /// last-heard times that varied between runs).
    pub(super) fn heard_of_workers(&mut self) {
        for w in self.workers.values() {
            if let (Some(node), Some(t)) = (&w.node_id, w.last_ns) {
                heard(self.nodes.entry(node.clone()).or_default(), t);
            }
        }
    }

    /// Takes one fact of object number `object` (objects are numbered in hour order).
    pub(super) fn absorb(&mut self, object: usize, fact: Fact) {
        if let Some(id) = fact.event_id {
            if !self.seen_event_ids.insert(id) {
                self.duplicates += 1;
                return;
            }
        }
        if let Some(want) = &self.job_filter {
            let other = match &fact.body {
                Body::Task(d) => d.job.is_some_and(|j| Some(j) != self.job_filter_id),
                body => body.job_id().is_some_and(|j| j != want),
            };
            if other {
                self.other_job += 1;
                return;
            }
        }
        self.total += 1;
        let ty: &str = &fact.event_type;
        let ty = if ty.len() <= 64 {
            std::borrow::Cow::Borrowed(ty)
        } else {
            std::borrow::Cow::Owned(bounded(ty, 64))
        };
        match self.by_type.get_mut(&*ty) {
            Some(n) => *n += 1,
            None => {
                self.by_type.insert(ty.into_owned(), 1);
            }
        }
        if let Some(t) = fact.time_ns {
            self.last_event_ns = Some(self.last_event_ns.map_or(t, |cur| cur.max(t)));
        }
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
                fill_least(&mut n.ip, ip);
                fill_least(&mut n.hostname, hostname);
                fill_least(&mut n.started_ns, started_ns);
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
                fill_least(&mut n.ip, ip);
                fill_least(&mut n.is_head, is_head);
                fill_least(&mut n.started_ns, started_ns);
                absorb_node_transition(n, transition);
            }
            Body::DriverJobDefinition {
                job_id,
                entrypoint,
                driver_pid,
                driver_node_id,
                config,
            } => {
                let j = self.jobs.entry(job_id).or_default();
                j.recorded = true;
                fill_config(&mut j.config, config);
                fill(&mut j.entrypoint, entrypoint);
                fill(&mut j.driver_pid, driver_pid);
                fill(&mut j.driver_node_id, driver_node_id);
            }
            Body::DriverJobLifecycle {
                job_id,
                transitions,
            } => {
                let j = self.jobs.entry(job_id).or_default();
                j.recorded = true;
                j.transitions.extend(transitions);
            }
            Body::ExportDriverJob {
                job_id,
                entrypoint,
                is_dead,
                started_ns,
                ended_ns,
                driver_pid,
                driver_ip,
                config,
            } => {
                let j = self.jobs.entry(job_id).or_default();
                j.recorded = true;
                fill_config(&mut j.config, config);
                fill(&mut j.entrypoint, entrypoint);
                fill(&mut j.driver_pid, driver_pid);
                fill(&mut j.driver_ip, driver_ip);
                let dead_before = j.export.is_some_and(|(dead, _, _)| dead);
                if !dead_before {
                    j.export = Some((is_dead, started_ns, ended_ns));
                }
            }
            Body::ExportSubmissionJob(job) => {
                let terminal = |j: &SubmissionJob| {
                    j.status
                        .as_deref()
                        .is_some_and(|s| SUBMISSION_TERMINAL.contains(&s))
                };
                match self.submissions.get_mut(&job.submission_id) {
                    Some(kept) => {
                        let newer = order > kept.order;
                        let regress = terminal(&kept.job) && !terminal(&job);
                        if newer && !regress || terminal(&job) && !terminal(&kept.job) {
                            kept.order = kept.order.max(order);
                            kept.job = *job;
                        }
                    }
                    None => {
                        self.submissions.insert(
                            job.submission_id.clone(),
                            SubmissionModel { order, job: *job },
                        );
                    }
                }
            }
            Body::Task(delta) => {
                if let Some(node) = delta.node {
                    if let Some(t) = delta.transitions.iter().filter_map(|t| t.time_ns).max() {
                        let last = self.task_node_last.entry(node).or_insert(t);
                        *last = (*last).max(t);
                    }
                }
                if let Some(job) = delta.job {
                    if self.task_jobs.insert(job) {
                        self.jobs.entry(job.hex()).or_default();
                    }
                }
                if self.spill_error.is_none() {
                    if let Err(e) = self.tasks.add(delta, self.growth) {
                        self.spill_error = Some(e);
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
                fill_least(&mut a.job_id, job_id);
                fill_least(&mut a.class_name, class_name);
                fill_least(&mut a.name, name);
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
                fill_least(&mut a.job_id, job_id);
                fill_least(&mut a.class_name, class_name);
                fill_least(&mut a.name, name);
                absorb_actor_transition(a, transition);
            }
            Body::WorkerDefinition {
                worker_id,
                node_id,
                pid,
                worker_type,
            } => {
                let w = self.workers.entry(worker_id).or_default();
                fill_least(&mut w.node_id, node_id);
                fill_least(&mut w.pid, pid);
                fill_least(&mut w.worker_type, worker_type);
                // Its node hears of it once every event is read (`heard_of_workers`).
                if let Some(t) = fact.time_ns {
                    w.last_ns = Some(w.last_ns.map_or(t, |cur| cur.max(t)));
                }
            }
            Body::WorkerLifecycle {
                worker_id,
                job_id,
                transitions,
            } => {
                let w = self.workers.entry(worker_id).or_default();
                fill_least(&mut w.job_id, job_id);
                for t in transitions {
                    if let Some(at) = t.state.time_ns {
                        w.last_ns = Some(w.last_ns.map_or(at, |cur| cur.max(at)));
                        if t.state.state == "ALIVE" {
                            w.alive_ns = Some(w.alive_ns.map_or(at, |cur| cur.min(at)));
                        }
                    }
                    // The earliest death (then the least exit type and detail), in any
                    // read order.
                    let earlier = |d: &(Option<i64>, Option<String>, Option<String>)| {
                        (
                            t.state.time_ns.is_none(),
                            t.state.time_ns,
                            &t.exit_type,
                            &t.exit_detail,
                        ) < (d.0.is_none(), d.0, &d.1, &d.2)
                    };
                    if t.state.state == "DEAD" && w.death.as_ref().is_none_or(earlier) {
                        w.death =
                            Some((t.state.time_ns, t.exit_type.clone(), t.exit_detail.clone()));
                    }
                    let state = t.state.clone();
                    keep_latest(&mut w.latest, &state, &t);
                }
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

/// Notes that node `n` was spoken of at `at`.
pub(super) fn heard(n: &mut NodeModel, at: i64) {
    n.last_heard_ns = Some(n.last_heard_ns.map_or(at, |cur| cur.max(at)));
}

pub(super) fn absorb_node_transition(n: &mut NodeModel, t: NodeTransition) {
    if let Some(at) = t.state.time_ns {
        heard(n, at);
    }
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
            keep_latest(&mut n.resources_given, &t.state, r);
            n.resources = n.resources_given.as_ref().map(|(_, r)| r.clone());
        }
    }
    let state = t.state.clone();
    keep_latest(&mut n.latest, &state, &t);
}

pub(super) fn absorb_actor_transition(a: &mut ActorModel, t: ActorTransition) {
    if let Some(at) = t.state.time_ns {
        match &*t.state.state {
            "ALIVE" => a.alive_ns = Some(a.alive_ns.map_or(at, |cur| cur.min(at))),
            "DEAD" => a.dead_ns = Some(a.dead_ns.map_or(at, |cur| cur.max(at))),
            _ => {}
        }
    }
    if t.state.state == "ALIVE" || t.node_id.is_some() {
        if let Some(node) = &t.node_id {
            keep_latest(&mut a.node_given, &t.state, node);
            a.node_id = a.node_given.as_ref().map(|(_, n)| n.clone());
        }
        if let Some(pid) = t.pid {
            keep_latest(&mut a.pid_given, &t.state, &pid);
            a.pid = a.pid_given.as_ref().map(|(_, p)| *p);
        }
    }
    let state = t.state.clone();
    keep_latest(&mut a.latest, &state, &t);
}

/// Fills what `into` lacks of a job's config from `from`.
fn fill_config(into: &mut JobConfig, from: JobConfig) {
    fill(&mut into.metadata, from.metadata);
    fill(&mut into.runtime_env, from.runtime_env);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_transition_wins_and_ties_go_to_terminal_states() {
        let mut slot = None;
        let t = |state: &str, ns: i64| Transition {
            state: state.to_string().into(),
            time_ns: Some(ns),
        };
        keep_latest(&mut slot, &t("FAILED", 5), &());
        keep_latest(&mut slot, &t("RUNNING", 3), &());
        keep_latest(&mut slot, &t("SUBMITTED_TO_WORKER", 5), &());
        assert_eq!(slot.unwrap().0.state, "FAILED");
    }

    fn export(
        model: &mut SessionModel,
        object: usize,
        id: &str,
        secs: i64,
        data: serde_json::Value,
    ) {
        let line = serde_json::json!({"event_id": id, "timestamp": secs,
            "source_type": data["source_type"], "event_data": data["event_data"]});
        let fact = super::super::extract::extract_export_event(&line, 0).unwrap();
        model.absorb(object, fact);
    }

    fn submission(status: &str) -> serde_json::Value {
        serde_json::json!({"source_type": "EXPORT_SUBMISSION_JOB",
            "event_data": {"submission_job_id": "raysubmit_1", "status": status}})
    }

    /// What the latest transition says wins in any read order (review r56f): a node's
    /// resources, an actor's node and pid after a restart, and a node last heard of through a
    /// worker whose lifecycle is read before its definition.
    #[test]
    fn the_latest_transition_wins_in_any_read_order() {
        use super::super::extract::{ActorTransition, NodeTransition, WorkerTransition};
        let at = |state: &str, ns: i64| Transition {
            state: state.to_string().into(),
            time_ns: Some(ns),
        };
        let fact = |ns: i64, body: Body| Fact {
            event_id: None,
            event_type: "X".into(),
            time_ns: Some(ns),
            seq: 0,
            body,
        };
        let node = |ns: i64, cpu: f64| {
            fact(
                ns,
                Body::NodeLifecycle {
                    node_id: "n".into(),
                    transitions: vec![NodeTransition {
                        state: at("ALIVE", ns),
                        resources: Some([("CPU".to_string(), cpu)].into()),
                        death_reason: None,
                        death_message: None,
                    }],
                },
            )
        };
        let actor = |ns: i64, state: &str, node: Option<&str>, pid: Option<i64>| {
            fact(
                ns,
                Body::ActorLifecycle {
                    actor_id: "a".into(),
                    transitions: vec![ActorTransition {
                        state: at(state, ns),
                        node_id: node.map(str::to_string),
                        pid,
                        death_reason: None,
                        death_message: None,
                    }],
                },
            )
        };
        let facts = || {
            vec![
                node(1, 2.0),
                node(9, 23.0),
                node(5, 4.0),
                actor(1, "ALIVE", Some("node-a"), Some(100)),
                actor(3, "RESTARTING", None, None),
                actor(5, "ALIVE", Some("node-b"), Some(300)),
                fact(
                    59,
                    Body::WorkerLifecycle {
                        worker_id: "w".into(),
                        job_id: None,
                        transitions: vec![WorkerTransition {
                            state: at("DEAD", 59),
                            exit_type: None,
                            exit_detail: None,
                        }],
                    },
                ),
                fact(
                    40,
                    Body::WorkerDefinition {
                        worker_id: "w".into(),
                        node_id: Some("node-w".into()),
                        pid: None,
                        worker_type: None,
                    },
                ),
            ]
        };
        let seen = |facts: Vec<Fact>| {
            let mut m = SessionModel::new(None, TaskStore::new(None));
            for (i, f) in facts.into_iter().enumerate() {
                m.absorb(i, f);
            }
            m.heard_of_workers();
            (
                m.nodes["n"].resources.clone(),
                m.actors["a"].node_id.clone(),
                m.actors["a"].pid,
                m.nodes["node-w"].last_heard_ns,
            )
        };
        let forward = seen(facts());
        assert_eq!(forward, seen(facts().into_iter().rev().collect()));
        assert_eq!(forward.0, Some([("CPU".to_string(), 23.0)].into()));
        assert_eq!(
            (forward.1.as_deref(), forward.2),
            (Some("node-b"), Some(300))
        );
        assert_eq!(forward.3, Some(59));
    }

    /// A worker's events that disagree (two nodes, two pids, two deaths) give one worker in
    /// any read order (review r56d D3: the first read won).
    #[test]
    fn a_workers_conflicting_events_give_one_worker_in_any_order() {
        use super::super::extract::WorkerTransition;
        let definition = |node: &str, pid: i64| Fact {
            event_id: None,
            event_type: "WORKER_DEFINITION_EVENT".into(),
            time_ns: Some(1),
            seq: 0,
            body: Body::WorkerDefinition {
                worker_id: "w".into(),
                node_id: Some(node.into()),
                pid: Some(pid),
                worker_type: Some("WORKER".into()),
            },
        };
        let death = |exit: &str| Fact {
            event_id: None,
            event_type: "WORKER_LIFECYCLE_EVENT".into(),
            time_ns: Some(5),
            seq: 0,
            body: Body::WorkerLifecycle {
                worker_id: "w".into(),
                job_id: Some("01000000".into()),
                transitions: vec![WorkerTransition {
                    state: Transition {
                        state: "DEAD".into(),
                        time_ns: Some(5),
                    },
                    exit_type: Some(exit.into()),
                    exit_detail: None,
                }],
            },
        };
        let facts = || {
            vec![
                definition("node-b", 502),
                death("SYSTEM_ERROR"),
                definition("node-a", 501),
                death("NODE_OUT_OF_MEMORY"),
            ]
        };
        let worker = |facts: Vec<Fact>| {
            let mut m = SessionModel::new(None, TaskStore::new(None));
            for (i, f) in facts.into_iter().enumerate() {
                m.absorb(i, f);
            }
            m.heard_of_workers();
            // Only the node kept hears of the worker (review r56g F1).
            format!(
                "{:?} {:?}",
                m.workers["w"],
                m.nodes.keys().collect::<Vec<_>>()
            )
        };
        let forward = worker(facts());
        let backward = worker(facts().into_iter().rev().collect());
        assert_eq!(forward, backward);
        assert!(
            forward.contains("node-a") && forward.contains("501"),
            "{forward}"
        );
        assert!(forward.contains("NODE_OUT_OF_MEMORY"), "{forward}");
        assert!(!forward.contains("node-b"), "{forward}");
    }

    #[test]
    fn a_submission_keeps_its_newest_record_and_never_goes_back_from_a_terminal_state() {
        let mut m = SessionModel::new(None, TaskStore::new(None));
        let status = |m: &SessionModel| m.submissions["raysubmit_1"].job.status.clone().unwrap();
        export(&mut m, 0, "a", 10, submission("PENDING"));
        export(&mut m, 0, "b", 11, submission("RUNNING"));
        assert_eq!(status(&m), "RUNNING");
        // An older record read later (another object) does not replace a newer one.
        export(&mut m, 1, "c", 9, submission("PENDING"));
        assert_eq!(status(&m), "RUNNING");
        // A terminal record replaces a running one even when its clock says earlier.
        export(&mut m, 1, "d", 10, submission("FAILED"));
        assert_eq!(status(&m), "FAILED");
        // Nothing after a terminal state takes it back to running.
        export(&mut m, 2, "e", 20, submission("RUNNING"));
        assert_eq!(status(&m), "FAILED");
        assert_eq!(m.submissions.len(), 1);
    }

    #[test]
    fn a_jobs_config_comes_from_the_first_driver_event_that_has_it() {
        let mut m = SessionModel::new(None, TaskStore::new(None));
        let driver = |config: serde_json::Value| {
            serde_json::json!({"source_type": "EXPORT_DRIVER_JOB", "event_data": {
                "job_id": "AQAAAA==", "is_dead": false, "config": config}})
        };
        export(&mut m, 0, "a", 10, driver(serde_json::json!({})));
        export(
            &mut m,
            0,
            "b",
            11,
            driver(serde_json::json!({
            "metadata": {"job_submission_id": "raysubmit_1"},
            "runtime_env_info": {"serialized_runtime_env": "{\"pip\": []}"}})),
        );
        export(
            &mut m,
            0,
            "c",
            12,
            driver(serde_json::json!({"metadata": {}})),
        );
        let config = &m.jobs["01000000"].config;
        assert_eq!(
            config.metadata.as_ref().unwrap()["job_submission_id"],
            "raysubmit_1"
        );
        assert_eq!(config.runtime_env.as_deref(), Some("{\"pip\": []}"));
    }
}
