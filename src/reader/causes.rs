//! Why a job failed or hung: each failed task attempt joined to its worker (id, pid, exit
//! type and detail, from `WORKER_*` events) and to its node (death reason and message, or
//! alive), then grouped by cause; what ended the session (nodes that died, jobs that never
//! finished, tasks left RUNNING or PENDING when the events stop); and what hung (placement
//! groups never placed, tasks pending past `--pending-after`, with what they asked for
//! against what the nodes offered).
//!
//! Ray 2.60 sends no placement-group event, so placement groups come from the head's snapshot
//! of the dashboard's `/api/v0/placement_groups?detail=1` endpoint (`fetched_endpoints/`),
//! read once: its `state`, `bundles[].unit_resources`, `stats.scheduling_state` and, where
//! Ray gives it, `strategy`.
//!
//! Everything here is bounded: the cause groups by [`MAX_CAUSES`] (the rest counted apart,
//! [`OtherCauses`]), the examples per group by [`MAX_EXAMPLES`], the unfinished groups by
//! [`MAX_CAUSES`], the pending list by `--failed-limit`. Nothing is kept per attempt: the
//! join runs as the attempts are drained.
//!
//! Every bounded pick keeps the same members whatever order the attempts come in (the
//! drain's order follows a hash map with a per-process seed and the spill files, and the
//! objects are read concurrently): each is the least of a total order, ties included, and
//! says which. Counts stay exact.

use std::collections::{BTreeMap, BinaryHeap, HashMap};

use serde::Serialize;
use serde_json::Value;

use super::extract::{bounded, get, get_i64, get_str};
use super::limits::MAX_ERROR_MESSAGE_BYTES;
use super::model::{NodeModel, WorkerModel};
use super::scan::format_amount;
use super::task::{AttemptKey, Sym, Symbols, TaskState, NO_TIME};
use super::values::format_time_json;

/// Distinct causes kept; a session with more is a pile of different failures: the groups
/// first by (cause, exit type, node) are kept, the others counted in [`OtherCauses`].
pub(super) const MAX_CAUSES: usize = 100;
/// Attempts named in each cause group (the count stays exact).
pub(super) const MAX_EXAMPLES: usize = 10;
/// Placement groups read from the snapshot.
const MAX_PLACEMENT_GROUPS: usize = 10_000;

/// A worker as the report shows it beside a failure.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WorkerLink {
    pub(crate) worker_id: String,
    pub(crate) pid: Option<i64>,
    pub(super) node_id: Option<String>,
    /// `ALIVE`, `DEAD` or null (no worker event was seen).
    pub(super) state: Option<String>,
    pub(super) died_at: Option<String>,
    pub(crate) exit_type: Option<String>,
    pub(crate) exit_detail: Option<String>,
}

/// A node as the report shows it beside a failure.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NodeLink {
    pub(crate) node_id: String,
    pub(crate) state: Option<String>,
    pub(crate) died_at: Option<String>,
    pub(crate) death_reason: Option<String>,
    pub(crate) death_message: Option<String>,
}

/// The chain of one failure: what failed → its worker → its node → the log to read.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Chain {
    /// The cause in words ("worker killed by the memory monitor").
    pub(super) cause: String,
    pub(super) worker: Option<WorkerLink>,
    pub(super) node: Option<NodeLink>,
}

/// Failed attempts and actors that share one cause (its words, its worker's exit type, its
/// node): an actor and the attempts that failed with it are one cause.
#[derive(Debug, Serialize)]
pub(crate) struct CauseGroup {
    pub(crate) cause: String,
    pub(super) error_type: Option<String>,
    pub(super) exit_type: Option<String>,
    pub(crate) node_id: Option<String>,
    pub(super) node_death_reason: Option<String>,
    /// Task attempts and actors with this cause.
    pub(crate) attempts: u64,
    pub(crate) actors: u64,
    pub(crate) first_at: Option<String>,
    pub(super) last_at: Option<String>,
    /// What says most about it, from its first failure ([`CauseExample::rank`]): the
    /// worker's exit detail, else the node's death message, else the error's last line.
    pub(crate) detail: Option<String>,
    /// Up to [`MAX_EXAMPLES`] of them, the first by [`CauseExample::rank`] (earliest, then
    /// task or actor id, then attempt): task id and attempt (or actor id), name, job, when.
    pub(crate) examples: Vec<CauseExample>,
    /// The command that prints the log of the first one (by [`CauseExample::rank`]) that
    /// has one.
    pub(crate) log_command: Option<String>,
    #[serde(skip)]
    first_ns: i64,
    #[serde(skip)]
    last_ns: i64,
    /// The rank of the failure `error_type` and `detail` come from.
    #[serde(skip)]
    shown: Option<Rank>,
    /// The rank of the failure `log_command` comes from.
    #[serde(skip)]
    logged: Option<Rank>,
}

/// Failed attempts and actors of the causes past [`MAX_CAUSES`], not in any group.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct OtherCauses {
    pub(crate) attempts: u64,
    pub(crate) actors: u64,
}

impl OtherCauses {
    /// One more failure of `kind` (`task` or `actor`).
    fn add(&mut self, kind: &str) {
        match kind {
            "actor" => self.actors += 1,
            _ => self.attempts += 1,
        }
    }
}

/// A failure's place in the total order the bounded picks use ([`CauseExample::rank`]).
type Rank = (bool, i64, &'static str, String, Option<i64>);

/// A cause group's key: cause in words, worker exit type, node.
type CauseKey = (String, Option<String>, Option<String>);

#[derive(Debug, Serialize)]
pub(crate) struct CauseExample {
    /// `task` or `actor`.
    pub(super) kind: &'static str,
    pub(crate) id: String,
    pub(super) attempt: Option<i64>,
    pub(crate) name: Option<String>,
    pub(super) job_id: Option<String>,
    pub(super) failed_at: Option<String>,
    #[serde(skip)]
    pub(super) at_ns: i64,
}

impl CauseExample {
    /// The order failures are picked in: by time (none last), then kind (`actor` before
    /// `task`), then id, then attempt. Total: no two failures rank alike.
    fn rank(&self) -> (bool, i64, &'static str, &str, Option<i64>) {
        (
            self.at_ns == NO_TIME,
            self.at_ns,
            if self.kind == "actor" {
                "actor"
            } else {
                "task"
            },
            &self.id,
            self.attempt,
        )
    }

    fn owned_rank(&self) -> Rank {
        let (no_time, at, kind, id, attempt) = self.rank();
        (no_time, at, kind, id.to_string(), attempt)
    }
}

/// `a` ranks before the held rank `b` (none held: true).
fn before(a: &(bool, i64, &'static str, &str, Option<i64>), b: Option<&Rank>) -> bool {
    b.is_none_or(|(no_time, at, kind, id, attempt)| {
        *a < (*no_time, *at, *kind, id.as_str(), *attempt)
    })
}

/// A worker that died other than by its own intent (exit type not `INTENDED_*`).
#[derive(Debug, Serialize)]
pub(crate) struct WorkerDeath {
    pub(crate) worker_id: String,
    pub(super) worker_type: Option<String>,
    pub(crate) pid: Option<i64>,
    pub(crate) node_id: Option<String>,
    pub(crate) job_id: Option<String>,
    pub(crate) died_at: Option<String>,
    pub(crate) exit_type: Option<String>,
    pub(crate) exit_detail: Option<String>,
    pub(crate) log_command: String,
    #[serde(skip)]
    pub(super) died_ns: i64,
}

/// Attempts that were still going when the session's events stop, grouped.
#[derive(Debug, Serialize)]
pub(crate) struct Unfinished {
    /// Their last state (`RUNNING`, `PENDING_NODE_ASSIGNMENT`, ..).
    pub(crate) state: String,
    pub(crate) job_id: Option<String>,
    pub(crate) node_id: Option<String>,
    pub(crate) count: u64,
    /// Why they never ended: their node died, or their job never finished and the session's
    /// events stop.
    pub(crate) reason: String,
}

/// A job that never finished.
#[derive(Debug, Serialize)]
pub(crate) struct UnfinishedJob {
    pub(crate) job_id: String,
    pub(super) started: Option<String>,
    pub(crate) reason: String,
}

/// How the session ended.
#[derive(Debug, Default, Serialize)]
pub(crate) struct SessionEnd {
    /// The last event of the session: where what follows was cut off.
    pub(crate) last_event: Option<String>,
    /// Nodes that died unexpectedly (not a clean shutdown): id, reason, message, when.
    pub(crate) nodes_died: Vec<NodeLink>,
    pub(crate) jobs_unfinished: Vec<UnfinishedJob>,
    pub(crate) tasks_unfinished: Vec<Unfinished>,
    /// Every unfinished attempt: those in `tasks_unfinished` and those of the groups past
    /// [`MAX_CAUSES`] (the least by state, job and node are kept).
    pub(crate) tasks_unfinished_total: u64,
}

/// A placement group that was never placed.
#[derive(Debug, Serialize)]
pub(crate) struct HungPlacementGroup {
    pub(crate) placement_group_id: String,
    pub(crate) name: Option<String>,
    pub(super) creator_job_id: Option<String>,
    pub(crate) state: Option<String>,
    pub(crate) scheduling_state: Option<String>,
    /// `PACK`, `STRICT_PACK`, ..; null when the snapshot does not say (Ray 2.60's does not).
    pub(crate) strategy: Option<String>,
    pub(crate) bundles: Vec<BTreeMap<String, f64>>,
    pub(crate) requested_at: Option<String>,
    /// Why no node could hold it, from the nodes' resources ("CPU: 64 asked by bundle 0,
    /// at most 2 on a node"); null when some node could.
    pub(crate) unsatisfiable: Option<String>,
}

/// A task attempt pending longer than `--pending-after` when the events stop.
#[derive(Debug, Serialize)]
pub(crate) struct PendingTask {
    pub(crate) task_id: String,
    pub(super) attempt: i64,
    pub(crate) name: Option<String>,
    pub(super) job_id: Option<String>,
    pub(crate) state: String,
    pub(super) since: Option<String>,
    pub(crate) pending_seconds: Option<f64>,
    pub(crate) resources: Option<String>,
    /// What no alive node offered ("GPU: 1 asked, at most 0 on a node"); null when some
    /// node could hold it (then it waited for resources in use, or for its dependencies).
    pub(crate) unsatisfiable: Option<String>,
    /// (pending since, attempt): the list keeps the least.
    #[serde(skip)]
    rank: (i64, AttemptKey),
}

impl PartialEq for PendingTask {
    fn eq(&self, other: &PendingTask) -> bool {
        self.rank == other.rank
    }
}

impl Eq for PendingTask {}

impl PartialOrd for PendingTask {
    fn partial_cmp(&self, other: &PendingTask) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PendingTask {
    fn cmp(&self, other: &PendingTask) -> std::cmp::Ordering {
        self.rank.cmp(&other.rank)
    }
}

/// What hung.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Hangs {
    pub(crate) pending_after_seconds: f64,
    /// Where placement groups were read from (`fetched_endpoints/…`); null when the bucket
    /// has no snapshot.
    pub(crate) placement_groups_source: Option<String>,
    pub(crate) placement_groups: Vec<HungPlacementGroup>,
    pub(crate) pending_tasks: Vec<PendingTask>,
    pub(crate) pending_tasks_total: u64,
}

/// Terminal task states: an attempt in one of them is over.
fn is_terminal(state: &str) -> bool {
    matches!(state, "FINISHED" | "FAILED")
}

fn is_pending(state: &str) -> bool {
    state.starts_with("PENDING") || state == "SUBMITTED_TO_WORKER"
}

/// A node death that is not a clean shutdown.
pub(super) fn unexpected_node_death(reason: Option<&str>) -> bool {
    !matches!(
        reason,
        None | Some("EXPECTED_TERMINATION") | Some("AUTOSCALER_DRAIN_IDLE")
    )
}

/// The cause in words, from the task's error type, its worker's exit type and its node.
pub(super) fn cause_text(
    error_type: Option<&str>,
    exit_type: Option<&str>,
    node: Option<&NodeLink>,
) -> String {
    let node_dead = node.is_some_and(|n| n.state.as_deref() == Some("DEAD"));
    if exit_type == Some("NODE_OUT_OF_MEMORY") || error_type == Some("OUT_OF_MEMORY") {
        return "worker killed by the memory monitor".into();
    }
    if error_type == Some("NODE_DIED") || (node_dead && error_type == Some("WORKER_DIED")) {
        let reason = node
            .and_then(|n| n.death_reason.as_deref())
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        return format!("node died{reason}");
    }
    match (error_type, exit_type) {
        (Some("ACTOR_DIED"), Some(exit)) => format!("actor's worker died ({exit})"),
        (Some("ACTOR_DIED"), None) => "actor died".into(),
        (_, Some("SYSTEM_ERROR")) => "worker process died (SYSTEM_ERROR)".into(),
        (_, Some("USER_ERROR")) => "worker exited on a user error".into(),
        (Some("WORKER_DIED"), None) => "worker died".into(),
        (Some("TASK_EXECUTION_EXCEPTION"), _) => "the task raised an exception".into(),
        (Some("TASK_CANCELLED"), _) => "cancelled".into(),
        (Some(e), _) => e.to_ascii_lowercase().replace('_', " "),
        (None, Some(exit)) => format!("worker exited ({exit})"),
        (None, None) => "no error recorded".into(),
    }
}

/// The worker as a link, from the worker events.
pub(super) fn worker_link(id: &str, w: Option<&WorkerModel>) -> WorkerLink {
    let death = w.and_then(|w| w.death.as_ref());
    WorkerLink {
        worker_id: id.to_string(),
        pid: w.and_then(|w| w.pid),
        node_id: w.and_then(|w| w.node_id.clone()),
        state: w.and_then(|w| w.latest.as_ref().map(|(t, _)| t.state.to_string())),
        died_at: death.and_then(|d| d.0).map(format_time_json),
        exit_type: death.and_then(|d| d.1.clone()),
        exit_detail: death.and_then(|d| d.2.clone()),
    }
}

pub(super) fn node_link(id: &str, n: Option<&NodeModel>) -> NodeLink {
    let latest = n.and_then(|n| n.latest.as_ref().map(|(_, t)| t));
    NodeLink {
        node_id: id.to_string(),
        state: latest.map(|t| t.state.state.to_string()),
        died_at: n.and_then(|n| n.ended_ns).map(format_time_json),
        death_reason: latest.and_then(|t| t.death_reason.clone()),
        death_message: latest.and_then(|t| t.death_message.clone()),
    }
}

/// The first non-empty line of a detail, bounded.
pub(crate) fn first_line(s: &str) -> String {
    bounded(
        s.lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or(""),
        400,
    )
}

/// The last non-empty line (a traceback's `Error: text`), bounded.
fn last_line(s: &str) -> String {
    bounded(
        s.lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .unwrap_or(""),
        400,
    )
}

/// Parses `CPU: 1, GPU: 0.5` back into pairs.
fn parse_resources(text: &str) -> Vec<(&str, f64)> {
    text.split(", ")
        .filter_map(|kv| {
            let (k, v) = kv.rsplit_once(": ")?;
            Some((k, v.parse().ok()?))
        })
        .collect()
}

/// What of `asked` no node offers: "GPU: 1 asked, at most 0 on a node".
fn unsatisfiable<'a>(
    asked: impl Iterator<Item = (&'a str, f64)>,
    offers: &[&BTreeMap<String, f64>],
    what: &str,
) -> Option<String> {
    if offers.is_empty() {
        return None;
    }
    let mut missing = Vec::new();
    for (k, v) in asked {
        if v <= 0.0 {
            continue;
        }
        let most = offers
            .iter()
            .map(|o| o.get(k).copied().unwrap_or(0.0))
            .fold(0.0, f64::max);
        if most < v {
            missing.push(format!(
                "{k}: {} asked{what}, at most {} on a node",
                format_amount(v),
                format_amount(most)
            ));
        }
    }
    (!missing.is_empty()).then(|| missing.join("; "))
}

/// Unfinished attempts are grouped by (state, job, node): the node's symbol or, for an
/// attempt whose task events name no node, its worker's node from the worker events.
type UnfinishedKey<'a> = (Sym, Sym, Sym, Option<&'a str>);

/// An unfinished group's key in words: (state, job, node). Two [`UnfinishedKey`]s can
/// read alike (a node named by its symbol, or by its worker), and are then one group.
type UnfinishedText = (String, Option<String>, Option<String>);

/// What the join gives: the cause groups, earliest first, and the failures past them; the
/// unfinished groups, most attempts first, and all unfinished attempts; the pending tasks,
/// longest pending first, and how many there were.
pub(super) struct Joined {
    pub(super) causes: Vec<CauseGroup>,
    pub(super) other_causes: OtherCauses,
    pub(super) unfinished: Vec<Unfinished>,
    pub(super) unfinished_total: u64,
    pub(super) pending: Vec<PendingTask>,
    pub(super) pending_total: u64,
}

/// Joins each attempt, as it is drained, to its worker and node.
pub(super) struct Join<'a> {
    pub(super) workers: &'a BTreeMap<String, WorkerModel>,
    pub(super) nodes: &'a BTreeMap<String, NodeModel>,
    /// Jobs that finished.
    pub(super) finished_jobs: &'a std::collections::HashSet<String>,
    pub(super) last_event_ns: Option<i64>,
    pub(super) pending_after_ns: i64,
    pub(super) list_limit: usize,
    causes: Vec<CauseGroup>,
    cause_index: HashMap<CauseKey, usize>,
    /// The kept groups by key: the last is the one a lesser new key evicts.
    cause_order: BTreeMap<CauseKey, usize>,
    other_causes: OtherCauses,
    unfinished: Vec<Unfinished>,
    unfinished_index: HashMap<UnfinishedKey<'a>, usize>,
    /// The kept groups by key in words: the last is the one a lesser new key evicts.
    unfinished_order: BTreeMap<UnfinishedText, usize>,
    unfinished_total: u64,
    /// The least `list_limit` pending attempts by [`PendingTask`]'s order (a max-heap: the
    /// top is the one a lesser attempt replaces).
    pending: BinaryHeap<PendingTask>,
    pending_total: u64,
}

/// What says most about a failure: its worker's exit detail, else its node's death
/// message, else its error's last line.
fn detail_of(chain: &Chain, error_message: Option<&str>) -> Option<String> {
    chain
        .worker
        .as_ref()
        .and_then(|w| w.exit_detail.as_deref())
        .map(first_line)
        .or_else(|| {
            chain
                .node
                .as_ref()
                .and_then(|n| n.death_message.as_deref())
                .map(first_line)
        })
        .or_else(|| error_message.map(last_line))
        .filter(|d| !d.is_empty())
        .map(|d| bounded(&d, MAX_ERROR_MESSAGE_BYTES))
}

impl<'a> Join<'a> {
    pub(super) fn new(
        workers: &'a BTreeMap<String, WorkerModel>,
        nodes: &'a BTreeMap<String, NodeModel>,
        finished_jobs: &'a std::collections::HashSet<String>,
        last_event_ns: Option<i64>,
        pending_after_ns: i64,
        list_limit: usize,
    ) -> Join<'a> {
        Join {
            workers,
            nodes,
            finished_jobs,
            last_event_ns,
            pending_after_ns,
            list_limit,
            causes: Vec::new(),
            cause_index: HashMap::new(),
            cause_order: BTreeMap::new(),
            other_causes: OtherCauses::default(),
            unfinished: Vec::new(),
            unfinished_index: HashMap::new(),
            unfinished_order: BTreeMap::new(),
            unfinished_total: 0,
            pending: BinaryHeap::new(),
            pending_total: 0,
        }
    }

    /// The chain of a failure on `worker` (hex) / `node` (hex).
    pub(super) fn chain(
        &self,
        error_type: Option<&str>,
        worker: Option<&str>,
        node: Option<&str>,
    ) -> Chain {
        let worker = worker.map(|w| worker_link(w, self.workers.get(w)));
        let node_id = node
            .map(str::to_string)
            .or_else(|| worker.as_ref().and_then(|w| w.node_id.clone()));
        let node = node_id.map(|n| node_link(&n, self.nodes.get(&n)));
        Chain {
            cause: cause_text(
                error_type,
                worker.as_ref().and_then(|w| w.exit_type.as_deref()),
                node.as_ref(),
            ),
            worker,
            node,
        }
    }

    /// Adds one failure to its cause group. The groups kept are the [`MAX_CAUSES`] least by
    /// key (cause in words, exit type, node): a new key less than the greatest kept evicts
    /// that group into [`OtherCauses`] (an evicted key never comes back: as many lesser keys
    /// stay), any other new key past the bound is counted there.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_failure(
        &mut self,
        chain: &Chain,
        error_type: Option<&str>,
        error_message: Option<&str>,
        at_ns: i64,
        example: CauseExample,
        log_command: Option<String>,
    ) {
        let exit_type = chain.worker.as_ref().and_then(|w| w.exit_type.clone());
        let node_id = chain.node.as_ref().map(|n| n.node_id.clone());
        let key = (chain.cause.clone(), exit_type, node_id);
        let index = match self.cause_index.get(&key) {
            Some(&i) => i,
            None => {
                let full = self.causes.len() >= MAX_CAUSES;
                let lesser = self
                    .cause_order
                    .last_key_value()
                    .is_some_and(|(last, _)| key < *last);
                if full && !lesser {
                    self.other_causes.add(example.kind);
                    return;
                }
                let group = CauseGroup {
                    cause: key.0.clone(),
                    error_type: None,
                    exit_type: key.1.clone(),
                    node_id: key.2.clone(),
                    node_death_reason: chain.node.as_ref().and_then(|n| n.death_reason.clone()),
                    attempts: 0,
                    actors: 0,
                    first_at: None,
                    last_at: None,
                    detail: None,
                    examples: Vec::new(),
                    log_command: None,
                    first_ns: i64::MAX,
                    last_ns: i64::MIN,
                    shown: None,
                    logged: None,
                };
                let i = match full.then(|| self.cause_order.pop_last()).flatten() {
                    Some((evicted, i)) => {
                        self.cause_index.remove(&evicted);
                        let old = std::mem::replace(&mut self.causes[i], group);
                        self.other_causes.attempts += old.attempts;
                        self.other_causes.actors += old.actors;
                        i
                    }
                    None => {
                        self.causes.push(group);
                        self.causes.len() - 1
                    }
                };
                self.cause_index.insert(key.clone(), i);
                self.cause_order.insert(key, i);
                i
            }
        };
        let g = &mut self.causes[index];
        match example.kind {
            "actor" => g.actors += 1,
            _ => g.attempts += 1,
        }
        let rank = example.rank();
        if before(&rank, g.shown.as_ref()) {
            g.shown = Some(example.owned_rank());
            g.error_type = error_type.map(str::to_string);
            g.detail = detail_of(chain, error_message);
            g.node_death_reason = chain.node.as_ref().and_then(|n| n.death_reason.clone());
        }
        if log_command.is_some() && before(&rank, g.logged.as_ref()) {
            g.logged = Some(example.owned_rank());
            g.log_command = log_command;
        }
        if at_ns != NO_TIME {
            if at_ns < g.first_ns {
                g.first_ns = at_ns;
                g.first_at = Some(format_time_json(at_ns));
            }
            if at_ns > g.last_ns {
                g.last_ns = at_ns;
                g.last_at = Some(format_time_json(at_ns));
            }
        }
        // The least by rank are kept, in order.
        let room = g.examples.len() < MAX_EXAMPLES;
        if room || g.examples.last().is_some_and(|l| rank < l.rank()) {
            let at = g.examples.partition_point(|e| e.rank() < rank);
            g.examples.insert(at, example);
            g.examples.truncate(MAX_EXAMPLES);
        }
    }

    /// Sees one attempt that did not end: unfinished, and maybe hung. The groups kept are
    /// the [`MAX_CAUSES`] least by (state, job, node) in words (evicted as in
    /// [`Join::add_failure`]); `unfinished_total` counts every attempt. The pending list
    /// keeps the `list_limit` longest pending: least by (pending since, task id, attempt).
    pub(super) fn add_unfinished(&mut self, key: &AttemptKey, t: &TaskState, symbols: &Symbols) {
        let state = t.state(symbols);
        // A driver's own "task" stays RUNNING while its job lives: the job says it.
        if is_terminal(state)
            || state == "UNKNOWN"
            || symbols.get(t.task_type) == Some("DRIVER_TASK")
        {
            return;
        }
        self.unfinished_total += 1;
        // Grouped by symbols: nothing is allocated for an attempt whose group exists.
        let node_sym = if t.node.is_none() {
            symbols.node_of(t.worker)
        } else {
            t.node
        };
        let workers = self.workers;
        let worker_node = if node_sym.is_none() {
            symbols
                .get(t.worker)
                .and_then(|w| workers.get(w))
                .and_then(|w| w.node_id.as_deref())
        } else {
            None
        };
        let k = (t.latest_state, t.job, node_sym, worker_node);
        match self.unfinished_index.get(&k) {
            Some(&i) => self.unfinished[i].count += 1,
            None => self.new_unfinished(k, state, symbols),
        }
        if is_pending(state) {
            let since = (t.latest_ns != NO_TIME).then_some(t.latest_ns);
            let pending_for = since.zip(self.last_event_ns).map(|(s, e)| e - s);
            if let Some((since, pending_for)) =
                since.zip(pending_for.filter(|p| *p >= self.pending_after_ns))
            {
                self.pending_total += 1;
                let rank = (since, *key);
                let wanted = self.pending.len() < self.list_limit
                    || self.pending.peek().is_some_and(|top| rank < top.rank);
                if wanted {
                    let resources = symbols.owned(t.resources);
                    let offers = self.alive_offers();
                    self.pending.push(PendingTask {
                        task_id: key.id.hex(),
                        attempt: i64::from(key.attempt),
                        name: symbols.owned(t.name),
                        job_id: symbols.owned(t.job),
                        state: state.to_string(),
                        since: Some(format_time_json(since)),
                        pending_seconds: Some(pending_for as f64 / 1e9),
                        unsatisfiable: resources.as_deref().and_then(|r| {
                            unsatisfiable(parse_resources(r).into_iter(), &offers, "")
                        }),
                        resources,
                        rank,
                    });
                    if self.pending.len() > self.list_limit {
                        self.pending.pop();
                    }
                }
            }
        }
    }

    /// The first attempt of an unfinished group's key `k` seen: a new group, another key
    /// of a group that reads alike, an eviction, or counted only in the total.
    fn new_unfinished(&mut self, k: UnfinishedKey<'a>, state: &str, symbols: &Symbols) {
        let job = symbols.get(k.1);
        let node = symbols.get(k.2).or(k.3);
        let text = (state, job, node);
        let full = self.unfinished.len() >= MAX_CAUSES;
        let lesser_or_equal = self
            .unfinished_order
            .last_key_value()
            .is_some_and(|(last, _)| {
                text <= (last.0.as_str(), last.1.as_deref(), last.2.as_deref())
            });
        if full && !lesser_or_equal {
            return;
        }
        let owned: UnfinishedText = (
            state.to_string(),
            job.map(str::to_string),
            node.map(str::to_string),
        );
        if let Some(&i) = self.unfinished_order.get(&owned) {
            self.unfinished[i].count += 1;
            self.unfinished_index.insert(k, i);
            return;
        }
        let group = Unfinished {
            state: state.to_string(),
            job_id: owned.1.clone(),
            node_id: owned.2.clone(),
            count: 1,
            reason: self.unfinished_reason(job, node),
        };
        let i = match full.then(|| self.unfinished_order.pop_last()).flatten() {
            Some((_, i)) => {
                self.unfinished_index.retain(|_, at| *at != i);
                self.unfinished[i] = group;
                i
            }
            None => {
                self.unfinished.push(group);
                self.unfinished.len() - 1
            }
        };
        self.unfinished_index.insert(k, i);
        self.unfinished_order.insert(owned, i);
    }

    /// Why attempts on `node` of `job` never ended.
    fn unfinished_reason(&self, job: Option<&str>, node: Option<&str>) -> String {
        let node_model = node.and_then(|n| self.nodes.get(n));
        let node_dead = node_model
            .and_then(|n| n.latest.as_ref())
            .is_some_and(|(t, _)| t.state == "DEAD");
        if node_dead {
            let link = node_link(node.unwrap_or_default(), node_model);
            format!(
                "its node died{}{}",
                link.died_at
                    .as_deref()
                    .map(|t| format!(" at {t}"))
                    .unwrap_or_default(),
                link.death_reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            )
        } else if job.is_some_and(|j| self.finished_jobs.contains(j)) {
            "its job finished without it".to_string()
        } else {
            format!(
                "its job never finished: the session's events stop at {}",
                self.last_event_ns
                    .map(format_time_json)
                    .unwrap_or_else(|| "-".into())
            )
        }
    }

    fn alive_offers(&self) -> Vec<&'a BTreeMap<String, f64>> {
        self.nodes
            .values()
            .filter(|n| n.latest.as_ref().is_none_or(|(t, _)| t.state != "DEAD"))
            .filter_map(|n| n.resources.as_ref())
            .collect()
    }

    /// The groups, earliest cause first (then by key); the unfinished, most attempts first
    /// (then by state, job, node); the pending tasks, longest pending first (then by task id
    /// and attempt). The examples are kept in order.
    pub(super) fn finish(self) -> Joined {
        let mut causes = self.causes;
        causes.sort_by(|a, b| {
            (a.first_ns, &a.cause, &a.exit_type, &a.node_id).cmp(&(
                b.first_ns,
                &b.cause,
                &b.exit_type,
                &b.node_id,
            ))
        });
        let mut unfinished = self.unfinished;
        unfinished.sort_by(|a, b| {
            (std::cmp::Reverse(a.count), &a.state, &a.job_id, &a.node_id).cmp(&(
                std::cmp::Reverse(b.count),
                &b.state,
                &b.job_id,
                &b.node_id,
            ))
        });
        Joined {
            causes,
            other_causes: self.other_causes,
            unfinished,
            unfinished_total: self.unfinished_total,
            pending: self.pending.into_sorted_vec(),
            pending_total: self.pending_total,
        }
    }
}

/// The placement groups of the dashboard snapshot that were never placed.
pub(super) fn hung_placement_groups(
    snapshot: &Value,
    nodes: &BTreeMap<String, NodeModel>,
) -> Vec<HungPlacementGroup> {
    let Some(list) = get(snapshot, "data", "data")
        .and_then(|d| get(d, "result", "result"))
        .and_then(|r| get(r, "result", "result"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    let offers: Vec<&BTreeMap<String, f64>> = nodes
        .values()
        .filter(|n| n.latest.as_ref().is_none_or(|(t, _)| t.state != "DEAD"))
        .filter_map(|n| n.resources.as_ref())
        .collect();
    list.iter()
        .take(MAX_PLACEMENT_GROUPS)
        .filter_map(|pg| {
            let state = get_str(pg, "state", "state");
            let stats = get(pg, "stats", "stats");
            let scheduling_state =
                stats.and_then(|s| get_str(s, "scheduling_state", "schedulingState"));
            let placed = matches!(state.as_deref(), Some("CREATED") | Some("REMOVED"));
            if placed {
                return None;
            }
            let bundles: Vec<BTreeMap<String, f64>> = get(pg, "bundles", "bundles")
                .and_then(Value::as_array)
                .map(|bs| {
                    bs.iter()
                        .take(1000)
                        .map(|b| {
                            super::extract::resources(get(b, "unit_resources", "unitResources"))
                                .unwrap_or_default()
                        })
                        .collect()
                })
                .unwrap_or_default();
            let strategy = get_str(pg, "strategy", "strategy");
            let unsatisfiable_text = bundles
                .iter()
                .enumerate()
                .filter_map(|(i, b)| {
                    unsatisfiable(
                        b.iter().map(|(k, v)| (k.as_str(), *v)),
                        &offers,
                        &format!(" by bundle {i}"),
                    )
                })
                .collect::<Vec<_>>();
            Some(HungPlacementGroup {
                placement_group_id: get_str(pg, "placement_group_id", "placementGroupId")?,
                name: get_str(pg, "name", "name"),
                creator_job_id: get_str(pg, "creator_job_id", "creatorJobId"),
                state,
                scheduling_state,
                strategy,
                bundles,
                requested_at: stats
                    .and_then(|s| {
                        get_i64(
                            s,
                            "creation_request_received_ns",
                            "creationRequestReceivedNs",
                        )
                    })
                    .filter(|n| *n > 0)
                    .map(format_time_json),
                unsatisfiable: (!unsatisfiable_text.is_empty())
                    .then(|| unsatisfiable_text.join("; ")),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::task::CompactId;
    use super::*;

    #[test]
    fn causes_in_words() {
        assert_eq!(
            cause_text(Some("OUT_OF_MEMORY"), Some("NODE_OUT_OF_MEMORY"), None),
            "worker killed by the memory monitor"
        );
        let dead = NodeLink {
            node_id: "n".into(),
            state: Some("DEAD".into()),
            died_at: None,
            death_reason: Some("UNEXPECTED_TERMINATION".into()),
            death_message: None,
        };
        assert_eq!(
            cause_text(Some("NODE_DIED"), None, Some(&dead)),
            "node died (UNEXPECTED_TERMINATION)"
        );
        assert_eq!(
            cause_text(Some("WORKER_DIED"), Some("SYSTEM_ERROR"), None),
            "worker process died (SYSTEM_ERROR)"
        );
    }

    #[test]
    fn placement_groups_from_the_dashboard_snapshot() {
        // As the head's collector stored it in a real Ray 2.60 session (shortened).
        let snapshot: Value = serde_json::from_str(
            r#"{"result": true, "msg": "", "data": {"result": {"total": 2, "result": [
              {"placement_group_id": "106900c7548fa17beadbe785ac4b02000000", "name": "never",
               "creator_job_id": "02000000", "state": "PENDING",
               "bundles": [{"bundle_id": {"bundle_index": 0}, "unit_resources": {"CPU": 64.0}, "node_id": ""},
                           {"bundle_id": {"bundle_index": 1}, "unit_resources": {"CPU": 1.0}, "node_id": ""}],
               "stats": {"creation_request_received_ns": "1795702560944693443", "scheduling_state": "INFEASIBLE"}},
              {"placement_group_id": "aa", "state": "CREATED", "bundles": []}]}}}"#,
        )
        .unwrap();
        let mut nodes = BTreeMap::new();
        nodes.insert(
            "n".to_string(),
            NodeModel {
                resources: Some([("CPU".to_string(), 2.0)].into()),
                ..NodeModel::default()
            },
        );
        let pgs = hung_placement_groups(&snapshot, &nodes);
        assert_eq!(pgs.len(), 1, "a placed group is not hung");
        let pg = &pgs[0];
        assert_eq!(pg.state.as_deref(), Some("PENDING"));
        assert_eq!(pg.scheduling_state.as_deref(), Some("INFEASIBLE"));
        assert_eq!(pg.bundles[0]["CPU"], 64.0);
        assert_eq!(
            pg.requested_at.as_deref(),
            Some("2026-11-26T14:16:00.944693443Z")
        );
        assert_eq!(
            pg.unsatisfiable.as_deref(),
            Some("CPU: 64 asked by bundle 0, at most 2 on a node")
        );
        assert!(hung_placement_groups(&serde_json::json!({"data": 1}), &nodes).is_empty());
    }

    #[test]
    fn failures_of_one_cause_are_one_group_with_the_earliest_examples() {
        let workers = BTreeMap::new();
        let nodes = BTreeMap::new();
        let finished = std::collections::HashSet::new();
        let mut join = Join::new(&workers, &nodes, &finished, None, 0, 10);
        let chain = join.chain(Some("WORKER_DIED"), Some("w"), Some("n"));
        assert_eq!(chain.cause, "worker died");
        for i in (0..(MAX_EXAMPLES as i64 + 5)).rev() {
            join.add_failure(
                &chain,
                Some("WORKER_DIED"),
                Some("Traceback\nError: x"),
                i,
                CauseExample {
                    kind: "task",
                    id: format!("t{i}"),
                    attempt: Some(0),
                    name: None,
                    job_id: None,
                    failed_at: None,
                    at_ns: i,
                },
                None,
            );
        }
        let other = join.chain(Some("OUT_OF_MEMORY"), None, Some("n"));
        join.add_failure(
            &other,
            Some("OUT_OF_MEMORY"),
            None,
            100,
            CauseExample {
                kind: "actor",
                id: "a".into(),
                attempt: None,
                name: None,
                job_id: None,
                failed_at: None,
                at_ns: 100,
            },
            None,
        );
        let groups = join.finish().causes;
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].attempts, MAX_EXAMPLES as u64 + 5);
        assert_eq!(groups[0].detail.as_deref(), Some("Error: x"));
        assert_eq!(groups[0].examples.len(), MAX_EXAMPLES);
        assert_eq!(groups[0].examples[0].id, "t0");
        assert_eq!(groups[1].actors, 1);
        assert_eq!(groups[1].cause, "worker killed by the memory monitor");
    }

    #[test]
    fn what_no_node_offers() {
        let a: BTreeMap<String, f64> = [("CPU".to_string(), 2.0)].into();
        let b: BTreeMap<String, f64> = [("CPU".to_string(), 4.0), ("node2".into(), 4.0)].into();
        let asked = parse_resources("CPU: 1, GPU: 1");
        assert_eq!(
            unsatisfiable(asked.into_iter(), &[&a, &b], "").as_deref(),
            Some("GPU: 1 asked, at most 0 on a node")
        );
        assert_eq!(
            unsatisfiable(parse_resources("CPU: 3").into_iter(), &[&a, &b], ""),
            None
        );
    }

    /// The orders the tests feed the same items in: as given, reversed, and interleaved.
    fn orders<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
        let reversed = items.iter().rev().cloned().collect();
        let mut interleaved: Vec<T> = items.iter().skip(1).step_by(2).cloned().collect();
        interleaved.extend(items.iter().step_by(2).cloned());
        vec![items.to_vec(), reversed, interleaved]
    }

    /// One failure: (cause's error type, node, time, task id, attempt, message, log).
    type Failure = (&'static str, String, i64, String, i64, String, bool);

    fn fold_failures(failures: &[Failure]) -> (String, OtherCauses) {
        let (workers, nodes, finished) = Default::default();
        let mut join = Join::new(&workers, &nodes, &finished, None, 0, 10);
        for (error_type, node, at, id, attempt, message, logged) in failures {
            let chain = join.chain(Some(error_type), None, Some(node));
            join.add_failure(
                &chain,
                Some(error_type),
                Some(message),
                *at,
                CauseExample {
                    kind: if *attempt < 0 { "actor" } else { "task" },
                    id: id.clone(),
                    attempt: (*attempt >= 0).then_some(*attempt),
                    name: Some(format!("f{id}")),
                    job_id: None,
                    failed_at: (*at != NO_TIME).then(|| format_time_json(*at)),
                    at_ns: *at,
                },
                logged.then(|| format!("log of {id}")),
            );
        }
        let joined = join.finish();
        let json = serde_json::to_string_pretty(&joined.causes).unwrap();
        (json, joined.other_causes)
    }

    /// Examples, detail, error type, log command and the groups past [`MAX_CAUSES`] are the
    /// same whatever order the failures come in (review f56d: 3,000 failures at one time
    /// gave other examples on each run).
    #[test]
    fn cause_groups_are_the_same_in_any_order() {
        let mut failures: Vec<Failure> = Vec::new();
        // One cause, many failures at one time, with their own messages, some without a
        // log command, an attempt and an actor of the same id, one without a time.
        for i in 0..(3 * MAX_EXAMPLES as i64) {
            let message = format!("Traceback\nError: number {i}");
            failures.push((
                "NODE_DIED",
                "n0".into(),
                1_000,
                format!("{i:04}"),
                i % 3,
                message,
                i % 4 != 1,
            ));
        }
        failures.push((
            "NODE_DIED",
            "n0".into(),
            1_000,
            "0007".into(),
            -1,
            "actor".into(),
            true,
        ));
        failures.push((
            "NODE_DIED",
            "n0".into(),
            NO_TIME,
            "0000".into(),
            9,
            "late".into(),
            true,
        ));
        // More causes than are kept: a node each, at one time, two failures each.
        for n in 0..(MAX_CAUSES as i64 + 20) {
            for a in 0..2 {
                failures.push((
                    "NODE_DIED",
                    format!("n{n:03}"),
                    5_000,
                    format!("x{n}"),
                    a,
                    "gone".into(),
                    true,
                ));
            }
        }
        let outcomes: Vec<(String, OtherCauses)> =
            orders(&failures).iter().map(|f| fold_failures(f)).collect();
        for o in &outcomes[1..] {
            assert_eq!(o.1, outcomes[0].1);
            assert!(o.0 == outcomes[0].0, "{}\n---\n{}", o.0, outcomes[0].0);
        }
        let groups: Vec<Value> = serde_json::from_str(&outcomes[0].0).unwrap();
        assert_eq!(groups.len(), MAX_CAUSES);
        let first = &groups[0];
        assert_eq!(first["attempts"], 3 * MAX_EXAMPLES as u64 + 1);
        assert_eq!(first["actors"], 1);
        let ids: Vec<(&str, Value)> = first["examples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["id"].as_str().unwrap(), e["attempt"].clone()))
            .collect();
        assert_eq!(ids.len(), MAX_EXAMPLES);
        assert_eq!(
            ids[0],
            ("0007", Value::Null),
            "by time, then an actor before a task"
        );
        assert_eq!(ids[1], ("0000", Value::from(0)), "then by id");
        assert_eq!(ids[9], ("0008", Value::from(2)));
        assert_eq!(first["detail"], "actor");
        assert_eq!(first["log_command"], "log of 0007");
        // The groups kept are the least by (cause, exit type, node): n0, then n000..n098.
        assert_eq!(first["node_id"], "n0");
        assert_eq!(groups.last().unwrap()["node_id"], "n098");
        let other = outcomes[0].1;
        assert_eq!(
            other,
            OtherCauses {
                attempts: 2 * 21,
                actors: 0
            }
        );
    }

    /// One attempt left unfinished: (state, job, node, since, task id).
    type Left = (&'static str, String, &'static str, i64, u8);

    fn fold_unfinished(attempts: &[Left]) -> (String, u64, String, u64) {
        let (workers, nodes, finished) = Default::default();
        let mut join = Join::new(&workers, &nodes, &finished, Some(100_000), 10, 5);
        let mut symbols = Symbols::default();
        for (state, job, node, since, id) in attempts {
            let t = TaskState {
                latest_state: symbols.intern(Some(state)),
                latest_ns: *since,
                job: symbols.intern(Some(job)),
                node: symbols.intern(Some(node)),
                known: true,
                ..TaskState::default()
            };
            let key = AttemptKey {
                id: CompactId::from_hex(&format!("{id:02x}")).unwrap(),
                attempt: 0,
            };
            join.add_unfinished(&key, &t, &symbols);
        }
        let joined = join.finish();
        (
            serde_json::to_string_pretty(&joined.unfinished).unwrap(),
            joined.unfinished_total,
            serde_json::to_string_pretty(&joined.pending).unwrap(),
            joined.pending_total,
        )
    }

    /// The unfinished groups kept past [`MAX_CAUSES`] and the pending list past its limit are
    /// the same whatever order the attempts come in (and their symbols are numbered in).
    #[test]
    fn unfinished_and_pending_are_the_same_in_any_order() {
        let mut attempts: Vec<Left> = Vec::new();
        for j in 0..(MAX_CAUSES + 30) {
            attempts.push(("RUNNING", format!("{j:04x}"), "n1", 50_000, (j % 200) as u8));
        }
        // Pending since one time, more than the list holds; and one pending longer.
        for i in 0..12u8 {
            attempts.push((
                "PENDING_NODE_ASSIGNMENT",
                "ffff".into(),
                "n2",
                60_000,
                200 + i,
            ));
        }
        attempts.push(("PENDING_NODE_ASSIGNMENT", "fffe".into(), "n2", 70_000, 255));
        let outcomes: Vec<_> = orders(&attempts)
            .iter()
            .map(|a| fold_unfinished(a))
            .collect();
        for o in &outcomes[1..] {
            assert!(o == &outcomes[0], "{o:?}\n---\n{:?}", outcomes[0]);
        }
        let (unfinished, total, pending, pending_total) = &outcomes[0];
        assert_eq!(*total, attempts.len() as u64);
        let groups: Vec<Value> = serde_json::from_str(unfinished).unwrap();
        assert_eq!(groups.len(), MAX_CAUSES);
        assert_eq!(groups[0]["count"], 12, "most attempts first");
        // "PENDING…" < "RUNNING": both pending groups are kept, then jobs 0000.. by text.
        assert_eq!(groups[2]["job_id"], "0000");
        assert_eq!(
            groups.last().unwrap()["job_id"],
            format!("{:04x}", MAX_CAUSES - 3)
        );
        let pending: Vec<Value> = serde_json::from_str(pending).unwrap();
        assert_eq!(*pending_total, 13);
        let ids: Vec<&str> = pending
            .iter()
            .map(|p| p["task_id"].as_str().unwrap())
            .collect();
        assert_eq!(
            ids,
            ["c8", "c9", "ca", "cb", "cc"],
            "longest pending, then task id"
        );
    }
}
