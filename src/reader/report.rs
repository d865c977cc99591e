//! The reports and their `--json` form: this file is the JSON contract of `inspect` (field
//! names are stable; times are RFC 3339 UTC strings, ids lower-case hex, absent values null),
//! and the shaping of the merged model into it.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::causes::{
    hung_placement_groups, node_link, unexpected_node_death, CauseExample, CauseGroup, Chain,
    Hangs, Join, OtherCauses, SessionEnd, UnfinishedJob, WorkerDeath, WorkerLink,
};
use super::coverage::Coverage;
use super::extract::{JobConfig, SubmissionJob, TrainWorker};
use super::filter::{shell_word, NANOS_PER_SECOND};
use super::limits::MAX_PROBLEM_DETAILS;
use super::local::SkipLog;
use super::model::{transition_order, SessionModel, StatusPoint, TrainAttemptModel};
use super::task::{AttemptKey, Symbols, TaskState, NO_TIME};
use super::values::format_time_json;
use crate::util::escape::{escape_name, escape_text};

/// Output of `inspect` without `--session`.
#[derive(Debug, Serialize)]
pub(crate) struct ListReport {
    pub(crate) storage: String,
    pub(crate) clusters: Vec<ClusterEntry>,
    pub(crate) problems: Problems,
}

#[derive(Debug, Serialize)]
pub(crate) struct ClusterEntry {
    pub(crate) kind: String,
    pub(crate) namespace: String,
    pub(crate) owner: Option<String>,
    pub(crate) cluster: String,
    pub(super) history_prefix: String,
    pub(crate) sessions: Vec<SessionEntry>,
}

#[derive(Debug, Serialize)]
pub(crate) struct SessionEntry {
    pub(crate) session: String,
    pub(crate) started: Option<String>,
    pub(crate) nodes: usize,
    pub(crate) objects: u64,
    pub(crate) bytes: u64,
    pub(super) event_objects: u64,
    pub(crate) events_from: Option<String>,
    pub(crate) events_until: Option<String>,
}

/// Output of `inspect --session`.
#[derive(Debug, Serialize)]
pub(crate) struct SessionReport {
    pub(crate) storage: String,
    /// The storage as the command line gave it (with `--storage-root-dir`), for the
    /// commands the report suggests.
    #[serde(skip)]
    pub(super) storage_arg: String,
    pub(crate) cluster: ClusterIdentity,
    pub(crate) session: String,
    pub(crate) started: Option<String>,
    pub(crate) filter: FilterEcho,
    pub(crate) objects: ObjectStats,
    pub(crate) events: EventStats,
    pub(crate) nodes: Vec<NodeEntry>,
    pub(crate) jobs: Vec<JobEntry>,
    pub(crate) tasks: TaskCounts,
    pub(crate) failed_tasks_total: u64,
    pub(crate) failed_tasks: Vec<FailedTaskEntry>,
    /// Failed attempts and actors grouped by cause, earliest first (`causes.rs`): the
    /// `MAX_CAUSES` (100) least by (cause, exit type, node).
    pub(crate) failure_causes: Vec<CauseGroup>,
    /// Failed attempts and actors of the causes past those (zero when none).
    pub(crate) failure_causes_other: OtherCauses,
    pub(crate) worker_deaths_total: u64,
    pub(crate) worker_deaths: Vec<WorkerDeath>,
    pub(crate) session_end: SessionEnd,
    pub(crate) hangs: Hangs,
    pub(crate) actors: Vec<ActorEntry>,
    pub(crate) train_runs: Vec<TrainRunEntry>,
    /// The newest record of each submitted job (`EXPORT_SUBMISSION_JOB`), by submission id;
    /// `serve` pairs them with their driver jobs.
    #[serde(skip)]
    pub(super) submissions: Vec<SubmissionJob>,
    pub(crate) problems: Problems,
    /// The dashboard's placement-group snapshot, when the bucket has one: (key, document).
    #[serde(skip)]
    pub(super) placement_groups: Option<(String, serde_json::Value)>,
    #[serde(skip)]
    pub(super) pending_after_ns: i64,
}

#[derive(Debug, Serialize)]
pub(crate) struct ClusterIdentity {
    pub(crate) kind: String,
    pub(crate) namespace: String,
    pub(crate) owner: Option<String>,
    pub(crate) cluster: String,
    pub(crate) history_prefix: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct FilterEcho {
    pub(crate) job: Option<String>,
    pub(crate) since: Option<String>,
    pub(crate) until: Option<String>,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct ObjectStats {
    pub(crate) event_objects_listed: u64,
    /// Read to their end.
    pub(crate) read: u64,
    /// Given up on (not fetched, or not decodable to their end): in `problems` too.
    pub(crate) unreadable: u64,
    pub(crate) skipped_by_time: u64,
    pub(crate) bytes_read: u64,
    pub(super) not_event_objects: u64,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct EventStats {
    pub(crate) total: u64,
    pub(crate) duplicates: u64,
    pub(crate) outside_time_window: u64,
    pub(super) other_job: u64,
    pub(super) by_type: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct NodeEntry {
    pub(crate) node_id: String,
    pub(crate) ip: Option<String>,
    pub(crate) hostname: Option<String>,
    pub(crate) is_head: Option<bool>,
    pub(crate) state: Option<String>,
    pub(crate) started: Option<String>,
    pub(crate) ended: Option<String>,
    pub(super) death_reason: Option<String>,
    pub(super) death_message: Option<String>,
    /// The latest time an event speaks of the node.
    pub(crate) last_heard: Option<String>,
    pub(crate) resources: BTreeMap<String, f64>,
    pub(crate) objects: u64,
    pub(crate) bytes: u64,
    pub(crate) log_objects: u64,
    pub(crate) log_bytes: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct JobEntry {
    pub(crate) job_id: String,
    pub(crate) status: String,
    pub(crate) entrypoint: Option<String>,
    pub(crate) driver_pid: Option<i64>,
    pub(super) driver_node_id: Option<String>,
    /// The driver's IP, as `EXPORT_DRIVER_JOB` gives it.
    pub(super) driver_ip: Option<String>,
    pub(crate) started: Option<String>,
    pub(crate) ended: Option<String>,
    pub(crate) tasks: TaskCounts,
    /// Its config's metadata and serialized runtime env, as its driver job events gave them.
    #[serde(skip)]
    pub(super) config: JobConfig,
    /// A driver job event spoke of it (else it is known only from its tasks, actors or
    /// Train runs, and `status` is `UNKNOWN`).
    #[serde(skip)]
    pub(super) recorded: bool,
    #[serde(skip)]
    pub(crate) duration_ns: Option<i64>,
    #[serde(skip)]
    pub(crate) failed: u64,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct TaskCounts {
    pub(crate) total: u64,
    pub(crate) by_state: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct FailedTaskEntry {
    pub(crate) task_id: String,
    pub(crate) attempt: i64,
    pub(crate) name: Option<String>,
    pub(crate) job_id: Option<String>,
    pub(super) task_type: Option<String>,
    pub(crate) failed_at: Option<String>,
    pub(crate) error_type: Option<String>,
    pub(crate) error_message: Option<String>,
    pub(super) node_id: Option<String>,
    pub(super) worker_id: Option<String>,
    /// The cause in words, and the attempt's worker and node as the events tell them.
    pub(crate) cause: String,
    pub(crate) worker: Option<WorkerLink>,
    pub(crate) node: Option<super::causes::NodeLink>,
    /// The command that prints this attempt's stderr from the bucket; `None` when the
    /// task id in the events was not an id (shown as `invalid-<hash>`, which `--logs`
    /// cannot look up).
    pub(crate) log_command: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ActorEntry {
    pub(crate) actor_id: String,
    pub(crate) class_name: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) job_id: Option<String>,
    pub(crate) state: Option<String>,
    pub(super) node_id: Option<String>,
    pub(crate) pid: Option<i64>,
    pub(crate) death_reason: Option<String>,
    pub(crate) death_message: Option<String>,
    /// The worker process it lived in (found by its node and pid), with its exit.
    pub(super) worker: Option<WorkerLink>,
    #[serde(skip)]
    pub(crate) alive_ns: Option<i64>,
    #[serde(skip)]
    pub(crate) dead_ns: Option<i64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct StatusEntry {
    pub(crate) status: String,
    pub(crate) time: Option<String>,
    pub(crate) detail: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct TrainRunEntry {
    pub(crate) run_id: String,
    pub(crate) name: Option<String>,
    pub(crate) job_id: Option<String>,
    pub(crate) status: Option<String>,
    pub(crate) status_detail: Option<String>,
    pub(crate) started: Option<String>,
    pub(crate) ended: Option<String>,
    /// As Ray sent it, whole.
    pub(crate) framework_versions: serde_json::Value,
    /// Workers of the latest attempt, else `scaling_config.num_workers_fixed`.
    pub(crate) workers: Option<u64>,
    /// `run_settings.backend_config.framework` without Ray's `TRAINING_FRAMEWORK_` prefix.
    pub(crate) framework: Option<String>,
    /// `run_settings` as Ray sent it (null when absent): every field, nested.
    pub(crate) run_settings: serde_json::Value,
    pub(crate) ray_train_version: serde_json::Value,
    pub(crate) controller_log_file_path: Option<String>,
    pub(crate) controller_actor_id: Option<String>,
    /// The other members of the run's latest event, under their own names (fields this
    /// version does not know included).
    pub(crate) other_fields: serde_json::Map<String, serde_json::Value>,
    /// The inspect command that prints this run in full.
    pub(crate) train_run_command: String,
    pub(crate) status_history: Vec<StatusEntry>,
    pub(crate) attempts: Vec<TrainAttemptEntry>,
    #[serde(skip)]
    pub(crate) duration_ns: Option<i64>,
    /// `started` as Unix nanoseconds: runs are ordered by it (RFC 3339 text does not sort
    /// as time: `…25Z` after `…25.000000001Z`).
    #[serde(skip)]
    pub(super) started_ns: Option<i64>,
}

/// The status Ray's Train head answers for a run that was RUNNING when its controller
/// actor died (no final event was written).
const ABORTED: &str = "ABORTED";
/// Ray's Train head's status detail for such a run (`train_head.py`, `_get_run_status`).
const CONTROLLER_DEAD_DETAIL: &str = "Terminated due to system errors or killed by the user.";

/// The members of a Train run's `event_data` that [`TrainRunEntry`] shows by name.
const TRAIN_RUN_FIELDS: [&str; 12] = [
    "id",
    "name",
    "job_id",
    "status",
    "status_detail",
    "start_time_ns",
    "end_time_ns",
    "framework_versions",
    "run_settings",
    "ray_train_version",
    "controller_log_file_path",
    "controller_actor_id",
];

/// The members of a Train attempt's `event_data` that [`TrainAttemptEntry`] shows by name.
const TRAIN_ATTEMPT_FIELDS: [&str; 8] = [
    "run_id",
    "attempt_id",
    "status",
    "status_detail",
    "start_time_ns",
    "end_time_ns",
    "workers",
    "resources",
];

/// The members of `data` not in `known` (by their snake_case or camelCase name).
fn other_fields(
    data: &serde_json::Value,
    known: &[&str],
) -> serde_json::Map<String, serde_json::Value> {
    data.as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| {
                    !known
                        .iter()
                        .any(|f| *f == k.as_str() || super::extract::camel(f) == k.as_str())
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// A member under its snake_case or camelCase name, cloned (null when absent).
fn member(data: &serde_json::Value, snake: &str) -> serde_json::Value {
    super::extract::get(data, &super::extract::camel(snake), snake)
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

#[derive(Debug, Serialize)]
pub(crate) struct TrainAttemptEntry {
    pub(crate) attempt_id: String,
    pub(crate) status: Option<String>,
    pub(crate) status_detail: Option<String>,
    pub(crate) started: Option<String>,
    pub(crate) ended: Option<String>,
    pub(crate) status_history: Vec<StatusEntry>,
    /// `resources` as Ray sent it (one entry per worker bundle).
    pub(crate) resources: serde_json::Value,
    /// The other members of the attempt's latest event, under their own names.
    pub(crate) other_fields: serde_json::Map<String, serde_json::Value>,
    pub(crate) workers: Vec<TrainWorker>,
    /// `started` as Unix nanoseconds: attempts are ordered by it.
    #[serde(skip)]
    pub(super) started_ns: Option<i64>,
}

/// Objects and lines that could not be used, with a sample of why. Keys are escaped
/// ([`escape_name`]): the report, JSON included, never carries a raw name from the bucket.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Problems {
    pub(crate) unreadable_objects: u64,
    pub(crate) bad_lines: u64,
    /// Entries of a `file://` bucket not read: links, FIFOs and other special files, names
    /// no key can hold (`local.rs`).
    pub(crate) skipped_entries: u64,
    /// What of the session this read covered and missed, by key (`serve` compares a
    /// reload's with the index held's).
    #[serde(skip)]
    pub(crate) coverage: Coverage,
    /// The least [`MAX_PROBLEM_DETAILS`] by (key, error), in that order: the same whatever
    /// order the objects are read in.
    pub(crate) details: Vec<ProblemDetail>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ProblemDetail {
    pub(crate) key: String,
    pub(crate) error: String,
}

impl Problems {
    pub(super) fn unreadable(&mut self, key: &str, error: &str) {
        self.partly_read(key, 0, error);
    }

    /// An object not read to its end, of which `decoded` bytes were read (their events are
    /// in the fold).
    pub(super) fn partly_read(&mut self, key: &str, decoded: u64, error: &str) {
        self.unreadable_objects += 1;
        self.coverage.missed_object(key, decoded);
        self.note(key, error);
    }

    /// A prefix whose listing failed (`error` says so): counted as an unreadable object, and
    /// kept as a prefix missed (everything under it).
    pub(super) fn unlisted(&mut self, prefix: &str, error: &str) {
        self.unreadable_objects += 1;
        self.coverage.missed_prefix(prefix);
        self.note(prefix, error);
    }

    /// An object read to its end.
    pub(super) fn read(&mut self, key: &str) {
        self.coverage.read(key);
    }

    pub(crate) fn note(&mut self, key: &str, error: &str) {
        self.keep(ProblemDetail {
            key: escape_name(key),
            error: escape_text(error),
        });
    }

    /// Keeps `d` if it is among the least [`MAX_PROBLEM_DETAILS`] by (key, error).
    fn keep(&mut self, d: ProblemDetail) {
        fn rank(p: &ProblemDetail) -> (&str, &str) {
            (&p.key, &p.error)
        }
        let full = self.details.len() >= MAX_PROBLEM_DETAILS;
        if full && self.details.last().is_none_or(|l| rank(&d) >= rank(l)) {
            return;
        }
        let at = self.details.partition_point(|p| rank(p) <= rank(&d));
        self.details.insert(at, d);
        self.details.truncate(MAX_PROBLEM_DETAILS);
    }

    /// The entries the local bucket skipped (their keys already escaped).
    pub(crate) fn add_skips(&mut self, skips: &SkipLog) {
        let (skipped, more) = skips.take();
        self.skipped_entries += skipped.len() as u64 + more;
        for (key, reason) in skipped {
            self.keep(ProblemDetail {
                key,
                error: reason.to_string(),
            });
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.unreadable_objects == 0
            && self.bad_lines == 0
            && self.skipped_entries == 0
            && self.details.is_empty()
    }
}

/// Adds `n` attempts in `state` (allocating only for a state not seen yet).
fn add_state(by_state: &mut BTreeMap<String, u64>, state: &str, n: u64) {
    match by_state.get_mut(state) {
        Some(c) => *c += n,
        None => {
            by_state.insert(state.to_string(), n);
        }
    }
}

/// A failed attempt's row, ranked by (failure time, none last; task id; attempt), a total
/// order: the least `--failed-limit` are listed, whatever order the attempts come in.
struct Ranked(i64, AttemptKey, FailedTaskEntry);

impl PartialEq for Ranked {
    fn eq(&self, other: &Ranked) -> bool {
        (self.0, self.1) == (other.0, other.1)
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Ranked) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Ranked) -> std::cmp::Ordering {
        (self.0, self.1).cmp(&(other.0, other.1))
    }
}

/// A failed attempt's row.
fn failed_entry(
    key: &AttemptKey,
    t: &TaskState,
    symbols: &Symbols,
    log_command: &dyn Fn(&str) -> String,
    chain: Chain,
) -> FailedTaskEntry {
    let task_id = key.id.hex();
    let extra = t.extra.as_deref();
    FailedTaskEntry {
        cause: chain.cause,
        worker: chain.worker,
        node: chain.node,
        log_command: (!key.id.is_hashed()).then(|| log_command(&task_id)),
        task_id,
        attempt: i64::from(key.attempt),
        name: symbols.owned(t.name),
        job_id: symbols.owned(t.job),
        task_type: symbols.owned(t.task_type),
        failed_at: (t.failed_ns != NO_TIME).then(|| format_time_json(t.failed_ns)),
        error_type: extra.and_then(|e| e.error_type.clone()),
        error_message: extra.and_then(|e| e.error_message.clone()),
        node_id: symbols.owned(t.node),
        worker_id: symbols
            .owned(t.worker)
            .or_else(|| symbols.owned(t.exec_worker)),
    }
}

/// The hash of a (job, state) pair of symbols, for the last pass's counts: the pair as one
/// number through splitmix64's finalizer, a bijection whose every output bit depends on
/// every input bit. Symbols are numbered by the reader in order, so no bucket can choose
/// colliding ones. (The pair times an odd constant left the low bits, which pick a table's
/// bucket, to the state alone: every job of one state probed one run, and 100,000 jobs
/// took 5 s, review r56b.)
fn pair_hash(job: u32, state: u32) -> u64 {
    let mut z = (u64::from(job) << 32 | u64::from(state)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Turns the merged model into report entries; `visit` sees every task attempt once.
pub(super) fn shape_report(
    report: &mut SessionReport,
    mut model: SessionModel,
    failed_limit: usize,
    visit: &mut dyn FnMut(&AttemptKey, &TaskState, &Symbols),
) -> std::io::Result<()> {
    model.heard_of_workers();
    let SessionModel {
        job_filter,
        mut nodes,
        mut jobs,
        submissions,
        tasks,
        actors,
        runs,
        attempts,
        workers,
        last_event_ns,
        task_node_last,
        ..
    } = model;
    for (id, at) in task_node_last {
        if let Some(n) = nodes.get_mut(&id.hex()) {
            super::model::heard(n, at);
        }
    }

    report.nodes = nodes
        .iter()
        .map(|(node_id, n)| {
            let latest = n.latest.as_ref().map(|(_, t)| t);
            NodeEntry {
                node_id: node_id.clone(),
                ip: n.ip.clone(),
                hostname: n.hostname.clone(),
                is_head: n.is_head,
                state: latest.map(|t| t.state.state.to_string()),
                started: n.started_ns.or(n.alive_ns).map(format_time_json),
                ended: n.ended_ns.map(format_time_json),
                death_reason: latest.and_then(|t| t.death_reason.clone()),
                death_message: latest.and_then(|t| t.death_message.clone()),
                last_heard: n.last_heard_ns.map(format_time_json),
                resources: n.resources.clone().unwrap_or_default(),
                objects: n.objects,
                bytes: n.bytes,
                log_objects: n.log_objects,
                log_bytes: n.log_bytes,
            }
        })
        .collect();
    let finished_jobs: std::collections::HashSet<String> = jobs
        .iter()
        .filter(|(_, j)| job_status(j) == "FINISHED")
        .map(|(id, _)| id.clone())
        .collect();
    let mut join = Join::new(
        &workers,
        &nodes,
        &finished_jobs,
        last_event_ns,
        report.pending_after_ns,
        failed_limit,
    );

    // Tasks: counts overall and per job; the earliest failed attempts.
    let mut per_job: BTreeMap<String, TaskCounts> = BTreeMap::new();
    let mut failed: std::collections::BinaryHeap<Ranked> = std::collections::BinaryHeap::new();
    let log_command = |task_id: &str| {
        format!(
            "ray-history-collector inspect {} --session {} --logs {task_id} --err",
            report.storage_arg,
            shell_word(&report.session)
        )
    };
    let mut failed_total = 0u64;
    let mut counts = TaskCounts::default();
    let mut tally_index: HashMap<u64, usize, crate::util::dedup::PassThrough> = HashMap::default();
    let mut tallies: Vec<(Option<String>, String, u64)> = Vec::new();
    tasks.drain(|key, t, symbols| {
        if !t.known {
            return;
        }
        let job = symbols.get(t.job);
        if let (Some(want), Some(job)) = (&job_filter, job) {
            if want != job {
                return;
            }
        }
        let state = t.state(symbols);
        // Counted by (job, state) symbol, their texts kept the first time (a lookup of two
        // numbers rather than of three texts in ordered maps, per attempt); summed below.
        let next = tallies.len();
        let at = *tally_index
            .entry(pair_hash(t.job.0, t.latest_state.0))
            .or_insert(next);
        if at == next {
            tallies.push((job.map(str::to_string), state.to_string(), 0));
        }
        tallies[at].2 += 1;
        if state != "FAILED" {
            join.add_unfinished(key, t, symbols);
        }
        if state == "FAILED" {
            failed_total += 1;
            let at = if t.failed_ns == NO_TIME {
                i64::MAX
            } else {
                t.failed_ns
            };
            let extra = t.extra.as_deref();
            let error_type = extra.and_then(|e| e.error_type.as_deref());
            let worker = symbols.get(t.worker).or_else(|| symbols.get(t.exec_worker));
            let chain = join.chain(error_type, worker, symbols.get(t.node));
            let task_id = key.id.hex();
            join.add_failure(
                &chain,
                error_type,
                extra.and_then(|e| e.error_message.as_deref()),
                t.failed_ns,
                CauseExample {
                    kind: "task",
                    failed_at: (t.failed_ns != NO_TIME).then(|| format_time_json(t.failed_ns)),
                    at_ns: t.failed_ns,
                    attempt: Some(i64::from(key.attempt)),
                    name: symbols.owned(t.name),
                    job_id: symbols.owned(t.job),
                    id: task_id.clone(),
                },
                (!key.id.is_hashed()).then(|| log_command(&task_id)),
            );
            let wanted = failed.len() < failed_limit
                || failed.peek().is_some_and(|r| (at, *key) < (r.0, r.1));
            if wanted {
                failed.push(Ranked(
                    at,
                    *key,
                    failed_entry(key, t, symbols, &log_command, chain),
                ));
                if failed.len() > failed_limit {
                    failed.pop();
                }
            }
        }
        visit(key, t, symbols);
    })?;
    for (job, state, n) in tallies {
        counts.total += n;
        add_state(&mut counts.by_state, &state, n);
        if let Some(job) = job {
            if !jobs.contains_key(&job) && job_filter.as_deref().is_none_or(|j| j == job) {
                jobs.insert(job.clone(), Default::default());
            }
            let c = per_job.entry(job).or_default();
            c.total += n;
            add_state(&mut c.by_state, &state, n);
        }
    }
    report.tasks = counts;
    report.failed_tasks_total = failed_total;
    report.failed_tasks = failed.into_sorted_vec().into_iter().map(|r| r.2).collect();

    report.jobs = jobs
        .into_iter()
        .filter(|(id, _)| job_filter.as_ref().is_none_or(|j| j == id))
        .map(|(job_id, j)| {
            let created = j
                .transitions
                .iter()
                .filter(|t| t.state == "CREATED")
                .filter_map(|t| t.time_ns)
                .min();
            let finished = j
                .transitions
                .iter()
                .filter(|t| t.state == "FINISHED")
                .filter_map(|t| t.time_ns)
                .max();
            let (_, export_start, export_end) = j.export.unwrap_or((false, None, None));
            let status = job_status(&j);
            let started = created.or(export_start);
            let ended = finished.or(export_end);
            let tasks = per_job.remove(&job_id).unwrap_or_default();
            JobEntry {
                failed: tasks.by_state.get("FAILED").copied().unwrap_or(0),
                duration_ns: started.zip(ended).and_then(|(s, e)| e.checked_sub(s)),
                job_id,
                status: status.to_string(),
                entrypoint: j.entrypoint,
                driver_pid: j.driver_pid,
                driver_node_id: j.driver_node_id,
                driver_ip: j.driver_ip,
                recorded: j.recorded,
                config: j.config,
                started: started.map(format_time_json),
                ended: ended.map(format_time_json),
                tasks,
            }
        })
        .collect();
    report.submissions = submissions.into_values().map(|s| s.job).collect();

    let worker_by_process: BTreeMap<(Option<String>, i64), &String> = workers
        .iter()
        .filter_map(|(id, w)| Some(((w.node_id.clone(), w.pid?), id)))
        .collect();
    report.actors = actors
        .into_iter()
        .map(|(actor_id, a)| {
            // Lifecycle events carry no job id; the actor id ends with its job's id.
            let job_id = a.job_id.or_else(|| {
                let is_hex_id =
                    actor_id.len() == 32 && actor_id.bytes().all(|c| c.is_ascii_hexdigit());
                is_hex_id.then(|| actor_id[24..].to_string())
            });
            let latest = a.latest.as_ref().map(|(_, t)| t);
            ActorEntry {
                class_name: a.class_name,
                name: a.name,
                job_id,
                state: latest.map(|t| t.state.state.to_string()),
                pid: a.pid,
                death_reason: latest.and_then(|t| t.death_reason.clone()),
                death_message: latest.and_then(|t| t.death_message.clone()),
                worker: a.pid.and_then(|pid| {
                    let id = worker_by_process.get(&(a.node_id.clone(), pid))?;
                    Some(super::causes::worker_link(id, workers.get(*id)))
                }),
                node_id: a.node_id,
                alive_ns: a.alive_ns,
                dead_ns: a.dead_ns,
                actor_id,
            }
        })
        .filter(|a| {
            job_filter
                .as_ref()
                .is_none_or(|j| a.job_id.as_deref().is_none_or(|aj| aj == j))
        })
        .collect();

    // Actors that died other than by request join the causes.
    for a in &report.actors {
        if a.state.as_deref() != Some("DEAD") || !actor_failed(a.death_reason.as_deref()) {
            continue;
        }
        let worker = a.worker.as_ref().map(|w| w.worker_id.as_str());
        let mut chain = join.chain(Some("ACTOR_DIED"), worker, a.node_id.as_deref());
        if let Some(reason) = &a.death_reason {
            if chain
                .worker
                .as_ref()
                .and_then(|w| w.exit_type.as_ref())
                .is_none()
            {
                chain.cause = format!("actor died ({reason})");
            }
        }
        join.add_failure(
            &chain,
            a.death_reason.as_deref(),
            a.death_message.as_deref(),
            a.dead_ns.unwrap_or(NO_TIME),
            CauseExample {
                kind: "actor",
                failed_at: a.dead_ns.map(format_time_json),
                at_ns: a.dead_ns.unwrap_or(NO_TIME),
                id: a.actor_id.clone(),
                attempt: None,
                name: a.class_name.clone(),
                job_id: a.job_id.clone(),
            },
            Some(format!(
                "ray-history-collector inspect {} --session {} --logs {} --err",
                report.storage_arg,
                shell_word(&report.session),
                a.actor_id
            )),
        );
    }
    let joined = join.finish();
    report.failure_causes = joined.causes;
    report.failure_causes_other = joined.other_causes;

    // Workers that died other than by intent.
    let mut deaths: Vec<WorkerDeath> = workers
        .iter()
        .filter_map(|(id, w)| {
            let (at, exit_type, detail) = w.death.as_ref()?;
            if exit_type
                .as_deref()
                .is_some_and(|e| e.starts_with("INTENDED"))
            {
                return None;
            }
            if let (Some(want), Some(job)) = (&job_filter, &w.job_id) {
                if want != job {
                    return None;
                }
            }
            Some(WorkerDeath {
                worker_id: id.clone(),
                worker_type: w.worker_type.clone(),
                pid: w.pid,
                node_id: w.node_id.clone(),
                job_id: w.job_id.clone(),
                died_at: at.map(format_time_json),
                exit_type: exit_type.clone(),
                exit_detail: detail.clone(),
                log_command: format!(
                    "ray-history-collector inspect {} --session {} --logs {id} --err",
                    report.storage_arg,
                    shell_word(&report.session)
                ),
                died_ns: at.unwrap_or(i64::MAX),
            })
        })
        .collect();
    // The earliest are listed: by (death time, none last; worker id), a total order.
    deaths.sort_by(|a, b| (a.died_ns, &a.worker_id).cmp(&(b.died_ns, &b.worker_id)));
    report.worker_deaths_total = deaths.len() as u64;
    deaths.truncate(failed_limit);
    report.worker_deaths = deaths;

    // What ended the session.
    report.session_end = SessionEnd {
        last_event: last_event_ns.map(format_time_json),
        nodes_died: nodes
            .iter()
            .filter(|(_, n)| {
                n.latest.as_ref().is_some_and(|(t, nt)| {
                    t.state == "DEAD" && unexpected_node_death(nt.death_reason.as_deref())
                })
            })
            .map(|(id, n)| node_link(id, Some(n)))
            .collect(),
        jobs_unfinished: report
            .jobs
            .iter()
            .filter(|j| j.status == "CREATED")
            .map(|j| UnfinishedJob {
                job_id: j.job_id.clone(),
                started: j.started.clone(),
                reason: format!(
                    "never finished: no FINISHED event before the session's events stop at {}",
                    last_event_ns
                        .map(format_time_json)
                        .unwrap_or_else(|| "-".into())
                ),
            })
            .collect(),
        tasks_unfinished: joined.unfinished,
        tasks_unfinished_total: joined.unfinished_total,
    };

    // What hung.
    report.hangs = Hangs {
        pending_after_seconds: report.pending_after_ns as f64 / NANOS_PER_SECOND as f64,
        placement_groups_source: report
            .placement_groups
            .as_ref()
            .map(|(k, _)| escape_name(k)),
        placement_groups: report
            .placement_groups
            .as_ref()
            .map(|(_, v)| hung_placement_groups(v, &nodes))
            .unwrap_or_default(),
        pending_tasks: joined.pending,
        pending_tasks_total: joined.pending_total,
    };

    let mut attempts_by_run: BTreeMap<String, Vec<(String, TrainAttemptModel)>> = BTreeMap::new();
    for ((run_id, attempt_id), a) in attempts {
        attempts_by_run
            .entry(run_id)
            .or_default()
            .push((attempt_id, a));
    }
    let mut run_ids: Vec<String> = runs.keys().cloned().collect();
    for id in attempts_by_run.keys() {
        if !runs.contains_key(id) {
            run_ids.push(id.clone());
        }
    }
    // The session's actors as Ray's actor table would give them to its Train head.
    let actor_state: HashMap<&str, (&str, Option<i64>)> = report
        .actors
        .iter()
        .filter_map(|a| Some((a.actor_id.as_str(), (a.state.as_deref()?, a.dead_ns))))
        .collect();
    let mut runs = runs;
    let mut entries: Vec<TrainRunEntry> = run_ids
        .into_iter()
        .map(|run_id| {
            let r = runs.remove(&run_id).unwrap_or_default();
            let latest = r.latest.map(|(_, e)| e);
            let mut run_attempts: Vec<TrainAttemptEntry> = attempts_by_run
                .remove(&run_id)
                .unwrap_or_default()
                .into_iter()
                .map(|(attempt_id, a)| {
                    let latest = a.latest.map(|(_, e)| e);
                    let data = latest.as_ref().map(|e| e.data.clone()).unwrap_or_default();
                    TrainAttemptEntry {
                        attempt_id,
                        status: latest.as_ref().and_then(|e| e.status.clone()),
                        status_detail: latest.as_ref().and_then(|e| e.status_detail.clone()),
                        started: a.started_ns.map(format_time_json),
                        started_ns: a.started_ns,
                        ended: a.ended_ns.map(format_time_json),
                        status_history: status_history(a.history),
                        resources: member(&data, "resources"),
                        other_fields: other_fields(&data, &TRAIN_ATTEMPT_FIELDS),
                        workers: {
                            let mut w = a.workers.map(|(_, w)| w).unwrap_or_default();
                            w.sort_by_key(|w| w.world_rank);
                            for w in &mut w {
                                // Ray's Train head answers a worker's status from its
                                // actor's state (ALIVE or DEAD) when the actor is known.
                                if let Some((state, _)) = w
                                    .actor_id
                                    .as_deref()
                                    .and_then(|id| actor_state.get(id))
                                    .filter(|(s, _)| *s == "ALIVE" || *s == "DEAD")
                                {
                                    w.status = Some((*state).to_string());
                                }
                                w.log_command = w.actor_id.as_ref().map(|id| {
                                    format!(
                                        "ray-history-collector inspect {} --session {} --logs {}",
                                        report.storage_arg,
                                        shell_word(&report.session),
                                        shell_word(id)
                                    )
                                });
                            }
                            w
                        },
                    }
                })
                .collect();
            run_attempts
                .sort_by(|a, b| (a.started_ns, &a.attempt_id).cmp(&(b.started_ns, &b.attempt_id)));
            let data = latest.as_ref().map(|e| e.data.clone()).unwrap_or_default();
            let run_settings = member(&data, "run_settings");
            let framework = super::extract::get_str(
                &member(&run_settings, "backend_config"),
                "framework",
                "framework",
            )
            .map(|f| {
                f.strip_prefix("TRAINING_FRAMEWORK_")
                    .map(str::to_string)
                    .unwrap_or(f)
            });
            let workers = run_attempts
                .iter()
                .rev()
                .find(|a| !a.workers.is_empty())
                .map(|a| a.workers.len() as u64)
                .or_else(|| {
                    member(
                        &member(&run_settings, "scaling_config"),
                        "num_workers_fixed",
                    )
                    .as_u64()
                });
            let controller_actor_id =
                super::extract::get_id(&data, "controllerActorId", "controller_actor_id");
            let mut status = latest.as_ref().and_then(|e| e.status.clone());
            let mut status_detail = latest.as_ref().and_then(|e| e.status_detail.clone());
            let mut status_history = status_history(r.history);
            // A run whose controller died while it said RUNNING: Ray's Train head answers
            // it ABORTED (its `_get_run_status`), the rest of the run as recorded.
            let controller_dead_ns = controller_actor_id
                .as_deref()
                .and_then(|id| actor_state.get(id))
                .filter(|(state, _)| *state == "DEAD")
                .map(|(_, dead_ns)| *dead_ns);
            if let (Some("RUNNING"), Some(dead_ns)) = (status.as_deref(), controller_dead_ns) {
                status = Some(ABORTED.to_string());
                status_detail = Some(CONTROLLER_DEAD_DETAIL.to_string());
                status_history.push(StatusEntry {
                    status: ABORTED.to_string(),
                    time: dead_ns.map(format_time_json),
                    detail: status_detail.clone(),
                });
            }
            TrainRunEntry {
                workers,
                framework,
                ray_train_version: member(&data, "ray_train_version"),
                controller_log_file_path: super::extract::get_train_text(
                    &data,
                    "controllerLogFilePath",
                    "controller_log_file_path",
                ),
                controller_actor_id,
                other_fields: other_fields(&data, &TRAIN_RUN_FIELDS),
                run_settings,
                train_run_command: format!(
                    "ray-history-collector inspect {} --session {} --train-run {}",
                    report.storage_arg,
                    shell_word(&report.session),
                    shell_word(&run_id)
                ),
                name: latest.as_ref().and_then(|e| e.name.clone()),
                job_id: latest.as_ref().and_then(|e| e.job_id.clone()),
                status,
                status_detail,
                started: r.started_ns.map(format_time_json),
                started_ns: r.started_ns,
                ended: r.ended_ns.map(format_time_json),
                duration_ns: r
                    .started_ns
                    .zip(r.ended_ns)
                    .and_then(|(s, e)| e.checked_sub(s)),
                framework_versions: latest
                    .map(|e| e.framework_versions)
                    .unwrap_or_else(|| serde_json::Value::Object(Default::default())),
                status_history,
                attempts: run_attempts,
                run_id,
            }
        })
        .collect();
    entries.sort_by(|a, b| (a.started_ns, &a.run_id).cmp(&(b.started_ns, &b.run_id)));
    report.train_runs = entries;
    Ok(())
}

/// A job's status: its latest driver transition, else its export event's.
fn job_status(j: &super::model::JobModel) -> String {
    let latest = j.transitions.iter().max_by_key(|t| transition_order(t));
    let export_dead = j.export.is_some_and(|(dead, _, _)| dead);
    match (latest, &j.export) {
        (Some(t), _) => t.state.to_string(),
        (None, Some(_)) if export_dead => "FINISHED".into(),
        (None, Some(_)) => "CREATED".into(),
        (None, None) => "UNKNOWN".into(),
    }
}

/// An actor death that was not asked for (`ray.kill`, going out of scope).
fn actor_failed(reason: Option<&str>) -> bool {
    !matches!(
        reason,
        None | Some("RAY_KILL")
            | Some("OUT_OF_SCOPE")
            | Some("REF_DELETED")
            | Some("INTENDED_USER_EXIT")
    )
}

/// Sorts status reports and keeps each change of status once.
pub(super) fn status_history(mut points: Vec<StatusPoint>) -> Vec<StatusEntry> {
    points.sort_by_key(|p| p.order);
    let mut out: Vec<StatusEntry> = Vec::new();
    for p in points {
        if out.last().is_some_and(|last| last.status == p.status) {
            continue;
        }
        out.push(StatusEntry {
            status: p.status,
            time: (p.order.0 != i64::MIN).then(|| format_time_json(p.order.0)),
            detail: p.detail,
        });
    }
    out
}

#[cfg(test)]
mod tests {

    /// Jobs of one state spread over a table's buckets: the low bits of their hashes differ
    /// (the multiplied pair gave 1 value of 1,024 here, and a quadratic last pass).
    #[test]
    fn pairs_of_one_state_spread_over_the_low_bits() {
        let low: std::collections::HashSet<u64> =
            (0..1024u32).map(|job| pair_hash(job, 3) & 1023).collect();
        assert!(low.len() > 600, "{}", low.len());
        let pairs: std::collections::HashSet<u64> = (0..64u32)
            .flat_map(|job| (0..64u32).map(move |state| pair_hash(job, state)))
            .collect();
        assert_eq!(pairs.len(), 64 * 64);
    }
    use super::*;

    /// The problem details kept past their bound are the same whatever order the objects
    /// are read in: the least by (key, error), in that order.
    #[test]
    fn problem_details_are_the_same_in_any_order() {
        let notes: Vec<(String, String)> = (0..MAX_PROBLEM_DETAILS + 50)
            .map(|i| {
                (
                    format!("s/n/{:04}", (i * 7919) % 1000),
                    format!("bad {}", i % 3),
                )
            })
            .collect();
        let kept = |notes: &mut dyn Iterator<Item = &(String, String)>| {
            let mut p = Problems::default();
            for (key, error) in notes {
                p.note(key, error);
            }
            p.details
                .iter()
                .map(|d| format!("{} {}", d.key, d.error))
                .collect::<Vec<_>>()
        };
        let forward = kept(&mut notes.iter());
        assert_eq!(forward, kept(&mut notes.iter().rev()));
        assert_eq!(forward.len(), MAX_PROBLEM_DETAILS);
        let mut sorted = forward.clone();
        sorted.sort();
        assert_eq!(forward, sorted);
        assert_eq!(forward[0], "s/n/0000 bad 0");
    }
}
