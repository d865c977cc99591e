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
//! Everything here is bounded: the cause groups by [`MAX_CAUSES`] (the rest counted in the
//! last group), the examples per group by [`MAX_EXAMPLES`], the lists by `--failed-limit`.
//! Nothing is kept per attempt: the join runs as the attempts are drained.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use serde_json::Value;

use super::extract::{bounded, get, get_i64, get_str};
use super::limits::MAX_ERROR_MESSAGE_BYTES;
use super::model::{NodeModel, WorkerModel};
use super::scan::format_amount;
use super::task::{AttemptKey, Sym, Symbols, TaskState, NO_TIME};
use super::values::format_time_json;

/// Distinct causes kept; a session with more is a pile of different failures, and the
/// later ones are counted in the last group kept.
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
    /// What says most about it: the worker's exit detail, else the node's death message,
    /// else the error's last line.
    pub(crate) detail: Option<String>,
    /// Up to [`MAX_EXAMPLES`] of them, earliest first: task id and attempt (or actor id),
    /// name, job, when.
    pub(crate) examples: Vec<CauseExample>,
    /// The command that prints the first one's log.
    pub(crate) log_command: Option<String>,
    #[serde(skip)]
    first_ns: i64,
}

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
    /// Attempts in `tasks_unfinished`.
    pub(super) tasks_unfinished_total: u64,
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

/// Unfinished attempts are grouped by (state, job, node).
type UnfinishedKey = (Sym, Sym, Sym);

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
    cause_index: HashMap<(String, Option<String>, Option<String>), usize>,
    unfinished: HashMap<UnfinishedKey, Unfinished>,
    unfinished_total: u64,
    pending: Vec<PendingTask>,
    pending_total: u64,
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
            unfinished: HashMap::new(),
            unfinished_total: 0,
            pending: Vec::new(),
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

    /// Adds one failure to its cause group.
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
        let key = (chain.cause.clone(), exit_type.clone(), node_id.clone());
        let index = match self.cause_index.get(&key) {
            Some(&i) => i,
            None if self.causes.len() < MAX_CAUSES => {
                let detail = chain
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
                    .filter(|d| !d.is_empty());
                self.causes.push(CauseGroup {
                    cause: chain.cause.clone(),
                    error_type: error_type.map(str::to_string),
                    exit_type,
                    node_id,
                    node_death_reason: chain.node.as_ref().and_then(|n| n.death_reason.clone()),
                    attempts: 0,
                    actors: 0,
                    first_at: None,
                    last_at: None,
                    detail: detail.map(|d| bounded(&d, MAX_ERROR_MESSAGE_BYTES)),
                    examples: Vec::new(),
                    log_command: None,
                    first_ns: i64::MAX,
                });
                self.cause_index.insert(key, self.causes.len() - 1);
                self.causes.len() - 1
            }
            None => self.causes.len() - 1,
        };
        let g = &mut self.causes[index];
        match example.kind {
            "actor" => g.actors += 1,
            _ => g.attempts += 1,
        }
        if at_ns != NO_TIME {
            if at_ns < g.first_ns {
                g.first_ns = at_ns;
                g.first_at = Some(format_time_json(at_ns));
                if log_command.is_some() {
                    g.log_command = log_command.clone();
                }
            }
            let last = g.last_at.as_deref().and_then(super::filter::parse_time_ns);
            if last.is_none_or(|l| at_ns > l) {
                g.last_at = Some(format_time_json(at_ns));
            }
        }
        if g.log_command.is_none() {
            g.log_command = log_command;
        }
        // The earliest are kept.
        g.examples.push(example);
        if g.examples.len() > MAX_EXAMPLES {
            g.examples.sort_by_key(|e| (e.at_ns == NO_TIME, e.at_ns));
            g.examples.truncate(MAX_EXAMPLES);
        }
    }

    /// Sees one attempt that did not end: unfinished, and maybe hung.
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
        let k = (t.latest_state, t.job, node_sym);
        let room = self.unfinished.len() < MAX_CAUSES;
        match self.unfinished.get_mut(&k) {
            Some(v) => v.count += 1,
            None if room => {
                let job = symbols.owned(t.job);
                let node = symbols.owned(node_sym).or_else(|| {
                    let w = symbols.get(t.worker)?;
                    self.workers.get(w)?.node_id.clone()
                });
                let reason = self.unfinished_reason(job.as_deref(), node.as_deref());
                self.unfinished.insert(
                    k,
                    Unfinished {
                        state: state.to_string(),
                        job_id: job,
                        node_id: node,
                        count: 1,
                        reason,
                    },
                );
            }
            None => {}
        }
        if is_pending(state) {
            let since = (t.latest_ns != NO_TIME).then_some(t.latest_ns);
            let pending_for = since.zip(self.last_event_ns).map(|(s, e)| e - s);
            if pending_for.is_some_and(|p| p >= self.pending_after_ns) {
                self.pending_total += 1;
                if self.pending.len() < self.list_limit {
                    let resources = symbols.owned(t.resources);
                    let offers = self.alive_offers();
                    self.pending.push(PendingTask {
                        task_id: key.id.hex(),
                        attempt: i64::from(key.attempt),
                        name: symbols.owned(t.name),
                        job_id: symbols.owned(t.job),
                        state: state.to_string(),
                        since: since.map(format_time_json),
                        pending_seconds: pending_for.map(|p| p as f64 / 1e9),
                        unsatisfiable: resources.as_deref().and_then(|r| {
                            unsatisfiable(parse_resources(r).into_iter(), &offers, "")
                        }),
                        resources,
                    });
                }
            }
        }
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

    /// The groups, earliest cause first; the unfinished; the pending tasks.
    pub(super) fn finish(self) -> (Vec<CauseGroup>, Vec<Unfinished>, u64, Vec<PendingTask>, u64) {
        let mut causes = self.causes;
        causes.sort_by_key(|g| g.first_ns);
        for g in &mut causes {
            g.examples.sort_by(|a, b| {
                (a.at_ns == NO_TIME, a.at_ns, &a.id).cmp(&(b.at_ns == NO_TIME, b.at_ns, &b.id))
            });
        }
        let mut unfinished: Vec<Unfinished> = self.unfinished.into_values().collect();
        unfinished.sort_by(|a, b| {
            (std::cmp::Reverse(a.count), &a.state, &a.job_id, &a.node_id).cmp(&(
                std::cmp::Reverse(b.count),
                &b.state,
                &b.job_id,
                &b.node_id,
            ))
        });
        let mut pending = self.pending;
        pending.sort_by(|a, b| a.since.cmp(&b.since));
        (
            causes,
            unfinished,
            self.unfinished_total,
            pending,
            self.pending_total,
        )
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
        let (groups, ..) = join.finish();
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
}
