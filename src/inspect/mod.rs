//! `ray-history-collector inspect <storage>`: reads back what collectors wrote to a bucket.
//!
//! A cluster that is gone leaves only its bucket behind. This command answers the first
//! questions about it without a History Server: which clusters and sessions are there, which
//! jobs ran, how their tasks ended and why the failed ones failed, which actors lived, and how
//! Ray Train runs went. It reads what this collector writes and what KubeRay's Go collector
//! writes (plain `.jsonl` or gzip, legacy JSON-array files, names with or without the
//! `-<n>.jsonl[.gz]` tail), in camelCase or snake_case (`PRESERVE_PROTO_FIELD_NAME=1`).
//!
//! # What it reads
//!
//! - Without `--session`: the session markers under `[<root>/]cluster-metadata/`, then one
//!   listing of each session's `P/<session>/` for its object count, size, nodes and the span of
//!   its hour partitions. No object is read.
//! - With `--session <name|latest>`: the event objects of that session, found by walking the
//!   partitions with delimiter listings: `P/<session>/<node>/node_events/`,
//!   `.../job_events/<job>/`, `.../export_events/<job|node>/` (logs are only listed, for their
//!   size). `--job` lists and reads only `job_events/<job>/` and `export_events/<job>/` of each
//!   node; `--since`/`--until` read only objects whose hour partition (the `YYYY-MM-DD-HH` in the
//!   name: the events' own UTC hour for this collector, the file's creation hour for KubeRay's)
//!   lies in the window widened by one hour on each side, then keep only the events whose own
//!   timestamps are in the window.
//! - `--logs <id>` (`logs.rs`): one log object under `P/<session>/<node>/logs/`, found by
//!   listing the nodes' `logs/` directories (and, for a task or actor, by reading the
//!   session's events as for the report); `--tail` reads it with ranged reads from the end.
//!
//! # Reading big sessions in bounded memory
//!
//! Objects are fetched `READ_CONCURRENCY` at a time and decoded on one thread per core
//! (`read.rs`): gunzipped and split into lines as they stream in, task events read by typed
//! structs (`scan.rs`), the rest as JSON values (`extract.rs`). Facts go in bounded batches to
//! one fold (`model.rs`, `task/`) that keeps nothing per event: task attempts are compact
//! states (and past `task::MAX_ATTEMPTS_IN_MEMORY` attempts they are spilled to temporary
//! files by hash, `task/spill.rs`, and folded one file at a time; the values all stages share
//! are in `values.rs`, so no stage imports one that imports it back), event ids are
//! remembered only within a
//! window (`model::DEDUP_WINDOW`). A read that takes over a second shows a progress line on
//! stderr when stderr is a terminal.
//!
//! Bucket contents are untrusted: a bad gzip stream, a line that is not JSON or an object
//! that cannot be fetched is counted and reported under `problems`, never fatal; lines and
//! legacy array documents are size-capped; text output strips control characters (terminal
//! escapes included) from every value. A bucket or directory that does not exist, or one with
//! no session markers, is an error (exit code 1).
//!
//! The bucket's shape is untrusted too. Objects are open at most a few at a time whatever
//! their number (`read.rs`), a fetch that fails for a passing reason is retried, and an
//! object is counted as read only when it was read to its end. Every name from the bucket
//! is escaped in every message, the report's problems and errors included (`escape.rs`):
//! control characters (C1 included) and the characters that reorder text (`U+202E`) are
//! shown as `\u{…}`. A `file://` bucket is read by `local.rs`, which follows no symbolic
//! link, reads regular files only (a FIFO never blocks it), and skips a name that no object
//! key can hold (a control character, not UTF-8) instead of failing the listing; each entry
//! skipped is counted under `problems.skipped_entries` and named in its details. An S3
//! bucket is listed by `s3.rs` with `encoding-type=url`, so a key with a control character
//! (which S3's XML cannot carry) is skipped and counted the same way instead of failing its
//! page; GCS and Azure are listed by `object_store`. A listing that fails (below the top of
//! `cluster-metadata/`) is counted, not fatal.
//!
//! # How events are merged
//!
//! Events are deduplicated by event id within a window of the last 524,288 ids read (a
//! duplicate further apart is counted twice in `events` but changes no state: every merge is
//! idempotent). Lifecycle events carry lists of state transitions that
//! are neither complete nor time-ordered, so transitions are merged across events: an entity's
//! state is the transition with the latest timestamp (ties go to the later state in Ray's
//! enum, so a terminal state wins). Task attempts are keyed by task id and attempt number, and
//! task counts are counts of attempts by their final state (`UNKNOWN` when only a definition
//! was seen; an attempt seen only in profile events is not counted). Pushed task events and
//! Ray's file-based `EXPORT_TASK` events (`state_updates.state_ts_ns`, `task_info`, errors,
//! profiles) are merged into the same attempts, so a task is counted once whichever way it
//! was recorded. A failed attempt's error is the `rayErrorInfo` (`error_info`) of its
//! events. An attempt's execution on the timeline is its worker's `task::<name>` profile
//! event when exported, else its first RUNNING to its final state. Jobs
//! come from the driver job events (`DRIVER_JOB_*`, state `CREATED` or `FINISHED`), completed
//! by Ray's file-based `EXPORT_DRIVER_JOB` events. Ray Train runs and attempts come only from
//! the export events (`EXPORT_TRAIN_RUN`, `EXPORT_TRAIN_RUN_ATTEMPT`); their timestamps are
//! whole seconds, so events of the same second keep the order in which they were written. An
//! actor's lifecycle events carry no job id and are filed in `node_events`, which `--job` does
//! not read: with `--job` an actor's state is known only from export events. Likewise a Train
//! attempt that the collector filed under `export_events/node/` (its run's job was not known
//! yet) is not read with `--job`.
//!
//! Workers come from `WORKER_DEFINITION_EVENT` (node and pid; no job id, so filed in
//! `node_events`) and `WORKER_LIFECYCLE_EVENT` (the DEAD transition's `deathInfo`: exit type
//! and detail); with `--job` a worker's node and pid are known only from the task events.
//! `causes.rs` joins each failed attempt to its worker and node and groups them by cause.
//!
//! Without `--session`, `--since`/`--until` keep the sessions whose hour partitions overlap
//! the window; `--job` needs `--session`.
//!
//! # JSON output (`--json`)
//!
//! One document. Times are RFC 3339 UTC strings; ids are lower-case hex; absent values are
//! `null`. Field names are stable.
//!
//! Without `--session`:
//!
//! ```text
//! { "storage": "file:///bucket",
//!   "clusters": [ { "kind": "raycluster"|"rayjob"|"rayservice", "namespace", "owner" (null for
//!       raycluster), "cluster", "history_prefix",
//!       "sessions": [ { "session", "started" (wall clock from the session name, the head's
//!           local time, no zone: "2026-11-22T02:06:36.260774"), "nodes", "objects", "bytes",
//!           "event_objects", "events_from", "events_until" (start and end of the first and
//!           last hour partition) } ] } ],
//!   "problems": { "unreadable_objects", "bad_lines", "skipped_entries",
//!                 "details": [ { "key", "error" } ] } }
//! ```
//!
//! With `--session`:
//!
//! ```text
//! { "storage", "cluster": { "kind", "namespace", "owner", "cluster", "history_prefix" },
//!   "session", "started",
//!   "filter": { "job", "since", "until" (the instant given, or the end of the day or hour
//!               given) },
//!   "objects": { "event_objects_listed", "read" (read to their end), "unreadable",
//!                "skipped_by_time", "bytes_read", "not_event_objects" },
//!   "events": { "total", "duplicates", "outside_time_window", "other_job", "by_type": {..} },
//!   "nodes": [ { "node_id", "ip", "hostname", "is_head", "state", "started", "ended",
//!                "death_reason", "death_message", "last_heard" (the latest event that
//!                speaks of it), "resources": {..}, "objects", "bytes",
//!                "log_objects", "log_bytes" } ],
//!   "jobs": [ { "job_id", "status" ("CREATED"|"FINISHED"|"UNKNOWN"), "entrypoint",
//!               "driver_pid", "driver_node_id", "driver_ip", "started", "ended",
//!               "tasks": { "total", "by_state": {..} } } ],
//!   "tasks": { "total", "by_state": { "FINISHED": n, "FAILED": n, .. } },
//!   "failed_tasks_total",
//!   "failed_tasks": [ { "task_id", "attempt", "name", "job_id", "task_type", "failed_at",
//!                       "error_type", "error_message", "node_id", "worker_id",
//!                       "log_command" (the inspect command that prints its stderr; null
//!                       when the task id in the events is not an id),
//!                       "cause" (in words: "worker killed by the memory monitor"),
//!                       "worker": { "worker_id", "pid", "node_id", "state", "died_at",
//!                                   "exit_type", "exit_detail" } | null,
//!                       "node": { "node_id", "state", "died_at", "death_reason",
//!                                 "death_message" } | null } ],
//!   "failure_causes": [ { "cause", "error_type", "exit_type", "node_id",
//!                         "node_death_reason", "attempts", "actors", "first_at", "last_at",
//!                         "detail", "log_command",
//!                         "examples": [ { "kind" ("task"|"actor"), "id", "attempt", "name",
//!                                         "job_id", "failed_at" } ] } ],
//!   "worker_deaths_total",
//!   "worker_deaths": [ { "worker_id", "worker_type", "pid", "node_id", "job_id", "died_at",
//!                        "exit_type", "exit_detail", "log_command" } ],
//!   "session_end": { "last_event", "nodes_died": [ {node link} ],
//!                    "jobs_unfinished": [ { "job_id", "started", "reason" } ],
//!                    "tasks_unfinished": [ { "state", "job_id", "node_id", "count",
//!                                            "reason" } ],
//!                    "tasks_unfinished_total" },
//!   "hangs": { "pending_after_seconds", "placement_groups_source",
//!              "placement_groups": [ { "placement_group_id", "name", "creator_job_id",
//!                                      "state", "scheduling_state", "strategy",
//!                                      "bundles": [ {resource: amount} ], "requested_at",
//!                                      "unsatisfiable" } ],
//!              "pending_tasks": [ { "task_id", "attempt", "name", "job_id", "state",
//!                                   "since", "pending_seconds", "resources",
//!                                   "unsatisfiable" } ],
//!              "pending_tasks_total" },
//!   "actors": [ { "actor_id", "class_name", "name", "job_id", "state", "node_id", "pid",
//!                 "death_reason", "death_message", "worker" (its worker, by node and pid) } ],
//!   "train_runs" (by start time): [ { "run_id", "name", "job_id",
//!                     "status" (the latest event's; `ABORTED` for a `RUNNING` run whose
//!                               controller actor is `DEAD`, as Ray's Train head answers it),
//!                     "status_detail" (whole up to 4 MiB, else cut in the middle, marked), "started",
//!                     "ended", "framework_versions": {..},
//!                     "workers" (of the latest attempt), "framework",
//!                     "run_settings" (as Ray sent it, every member), "ray_train_version",
//!                     "controller_log_file_path", "controller_actor_id",
//!                     "other_fields": {..} (the run event's other members, by their names),
//!                     "train_run_command" (the inspect command that prints it in full),
//!                     "status_history": [ { "status", "time", "detail" } ] (an
//!                               `ABORTED` run's last entry at its controller's death),
//!                     "attempts" (by start time):
//!                                   [ { "attempt_id", "status", "status_detail", "started",
//!                                     "ended", "status_history": [..], "resources",
//!                                     "other_fields": {..},
//!                                     "workers": [ { "world_rank", "local_rank", "node_rank",
//!                                                    "actor_id", "node_id", "node_ip", "pid",
//!                                                    "status" (the actor's state when
//!                                                    known, as Ray's Train head answers it),
//!                                                    "gpu_ids", "log_file_path",
//!                                                    "resources", "log_command",
//!                                                    "other_fields": {..} } ] } ] } ],
//!   "problems": { "unreadable_objects", "bad_lines", "skipped_entries",
//!                 "details": [ { "key", "error" } ] } }
//! ```
//!
//! `failed_tasks` holds at most `--failed-limit` attempts, earliest failure first;
//! `failed_tasks_total` counts them all. A status history lists each change of status once.
//! `problems.unreadable_objects` counts objects that could not be fetched or decoded and
//! listings that failed; `problems.bad_lines` counts lines (or array elements) that are not
//! JSON objects or not Ray events; `problems.skipped_entries` counts the entries of a
//! `file://` bucket not read (links, special files, bad names); `details` says which and why
//! (at most 200 entries; keys escaped as in the text report).
//!
//! `--timeline FILE` (`timeline.rs`) and `--html FILE` (`html.rs`) write their files besides
//! the report; their formats are described there.
//!
//! `--train-run <run>` prints one of the session's `train_runs` entries instead of the
//! report (`--json`: `{ "storage", "cluster", "session", "train_run", "problems" }`);
//! `--compare-runs A B` compares two of them, B from another bucket with `--compare-storage`
//! (`train.rs`, which describes its document and exit codes).

use std::io::Write as _;
use std::sync::Arc;

use anyhow::Context as _;
use futures::StreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};
use serde::Serialize;

use crate::cli::InspectArgs;
use crate::storage::StorageSpec;

mod causes;
mod decode;
mod discover;
mod escape;
mod extract;
pub(crate) use extract::camel;
mod filter;
mod html;
mod local;
mod logs;
mod model;
mod read;
mod render;
mod report;
mod s3;
mod scan;
mod session;
mod task;
mod timeline;
mod train;
mod values;
mod walk;

use discover::{choose_session, discover, session_started, ClusterId};
use extract::bounded;
use filter::Filter;
pub(crate) use logs::{find_worker_log, raw_key, tail_start, LogTarget};
use model::SessionModel;
use render::{render_list, render_session};
use report::{
    shape_report, ClusterIdentity, EventStats, FilterEcho, ObjectStats, Problems, SessionReport,
    TaskCounts,
};
pub(crate) use session::task_log_target;
pub use session::{
    events_signature, latest_session, open_bucket, session_facts, session_markers, session_nodes,
    ActorFacts, JobFacts, NodeFacts, OpenBucket, SessionFacts, SessionMarker, SubmissionFacts,
    TaskView,
};
use task::{AttemptKey, Symbols, TaskState, TaskStore};
use values::format_time_json;
pub use walk::EventsSignature;
use walk::{list_partition, list_report, walk_node, NodeListing, PartitionListing, Stream};

/// Objects listed or read at once: enough to hide request latency, small enough to be polite
/// to the bucket and to bound memory.
const READ_CONCURRENCY: usize = 8;
/// How much of an object's content is accepted.
#[derive(Debug, Clone, Copy)]
struct ContentLimits {
    /// Longest JSON line kept; longer lines are counted as bad.
    line: usize,
    /// Largest legacy JSON-array document, which has to be parsed whole.
    document: usize,
    /// Decompressed bytes read from one object before giving up on it (a gzip bomb guard).
    decoded: u64,
}

/// KubeRay's reader allows 100 MiB lines; segments are 64 MiB by default.
const CONTENT_LIMITS: ContentLimits = ContentLimits {
    line: 64 << 20,
    document: 256 << 20,
    decoded: 4 << 30,
};
/// Problem details kept in the report; the counts stay exact.
const MAX_PROBLEM_DETAILS: usize = 200;
/// Error messages are tracebacks; this much of each is kept.
const MAX_ERROR_MESSAGE_BYTES: usize = 16 << 10;
/// Longest id, name or state kept from an event.
const MAX_FIELD_BYTES: usize = 512;
/// Longest text of a Ray Train run or attempt kept whole (its status detail, name, log
/// paths), in bytes. Ray Train V2 bounds none of them (its state schema defines
/// `MAX_ERROR_STACK_TRACE_LENGTH`, 50,000 characters, but only Train V1 applies it), and a
/// failed run's detail holds every worker's error: 75,975 characters for 64 workers lost
/// with their nodes. So this is only a safety bound, far above what Ray builds and far under
/// the 64 MiB line limit; a longer text keeps its start and its end (the final exception)
/// around a marker saying how much was cut (`values::bounded_middle`).
const MAX_TRAIN_TEXT_BYTES: usize = 4 << 20;
/// Widest text-table cell.
const MAX_CELL_CHARS: usize = 100;

/// Why `inspect` could not produce a report.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// A local bucket directory that does not exist (it is not created by a read).
    #[error("{0} does not exist or is not a directory")]
    NoSuchDirectory(String),
    /// Nothing that marks a session was found.
    #[error(
        "no session markers under {prefix}/ in {storage}: nothing was uploaded here, or the \
         root prefix is wrong (see --storage-root-dir)"
    )]
    NoMarkers {
        /// The bucket.
        storage: String,
        /// The metadata prefix that was listed.
        prefix: String,
    },
    /// The filters matched no session.
    #[error("no session matches {wanted}; sessions found: {known}")]
    NoSuchSession {
        /// What was asked for.
        wanted: String,
        /// What exists (shortened).
        known: String,
    },
    /// The same session name under several clusters.
    #[error("session {session} exists in several clusters ({clusters}); choose one with --cluster and --namespace")]
    AmbiguousSession {
        /// The session name.
        session: String,
        /// The clusters that have it.
        clusters: String,
    },
    /// `--logs` names nothing the session knows.
    #[error("no task, actor, worker or node {id} in session {session}")]
    NoSuchLogTarget {
        /// The id asked for (hex).
        id: String,
        /// The session.
        session: String,
    },
    /// The log was found in the events but not in the bucket.
    #[error("the log of {what} is not in the bucket ({key}): logs are uploaded only by a collector with the log collector on (--enable-log-collector)")]
    LogNotUploaded {
        /// What it is the log of.
        what: String,
        /// The key looked for.
        key: String,
    },
    /// No worker is known for the task or actor.
    #[error("no worker is known for {what} (it may never have run), so it has no log")]
    NoLogFor {
        /// What it is.
        what: String,
    },
    /// Several log objects match.
    #[error("several logs match {id}: {matches}")]
    SeveralLogs {
        /// The id.
        id: String,
        /// The objects that match.
        matches: String,
    },
    /// `--train-run` or `--compare-runs` names no run of the session.
    #[error("no Ray Train run {wanted:?} in session {session} (by id or name); runs: {known}")]
    NoSuchTrainRun {
        /// What was asked for.
        wanted: String,
        /// The session.
        session: String,
        /// The runs there are (shortened).
        known: String,
    },
    /// Several runs of the session have that name.
    #[error(
        "several Ray Train runs are named {wanted:?} in session {session}: {ids}; give the run id"
    )]
    AmbiguousTrainRun {
        /// The name.
        wanted: String,
        /// The session.
        session: String,
        /// Their ids.
        ids: String,
    },
    /// A `--compare-runs` operand without a session, and no `--session`.
    #[error("--compare-runs {run:?}: which session? write SESSION:RUN (or latest:RUN), or give --session")]
    RunWithoutSession {
        /// The operand.
        run: String,
    },
    /// A flag value that cannot be used.
    #[error("{flag} {value:?}: {reason}")]
    BadArgument {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// What `inspect` found, for its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The report (or log, or run) was printed: exit 0.
    Done,
    /// `--compare-runs`: the two runs' settings are equal (exit 0).
    SameSettings,
    /// `--compare-runs`: the two runs' settings differ (exit 1).
    SettingsDiffer,
    /// `--compare-runs`: the runs were found but a side's settings were never recorded, so
    /// they could not be compared (exit [`COMPARE_ERROR_EXIT`], 2).
    NotCompared,
}

pub use train::COMPARE_ERROR_EXIT;

/// Runs `inspect`: prints the report on stdout.
///
/// Its error, printed by the caller, may quote names from the bucket: every character a
/// terminal could act on is escaped in it ([`escape`]).
pub async fn run(
    args: InspectArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Outcome> {
    run_unescaped(args, env)
        .await
        .map_err(|e| anyhow::anyhow!("{}", escape::escape_text(&format!("{e:#}"))))
}

async fn run_unescaped(
    args: InspectArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Outcome> {
    let bucket = Bucket::open(&args, env).await?;
    if let Some(operands) = &args.compare_runs {
        let other = match &args.compare_storage {
            Some(url) => {
                let mut b_args = args.clone();
                b_args.storage = url.clone();
                Some(Bucket::open(&b_args, env).await?)
            }
            None => None,
        };
        let b = other.as_ref().unwrap_or(&bucket);
        return compare_runs(&args, operands, [&bucket, b]).await;
    }
    let Bucket {
        spec,
        store,
        skips,
        found,
        filter,
    } = bucket;
    let mut out = String::new();
    match &args.session {
        None => {
            let mut report = list_report(&store, &spec, found, &filter).await;
            report.problems.add_skips(&skips);
            if args.json {
                out = to_json(&report)?;
            } else {
                render_list(&report, &mut out);
            }
        }
        Some(wanted) => {
            let (chosen, passed_over) = choose_session(&store, &spec, &found, wanted).await?;
            if let Some(id) = &args.logs {
                let printed = logs::print_logs(&store, &spec, chosen, &filter, &args, id).await;
                logs::tell_skips(&skips);
                return printed.map(|()| Outcome::Done);
            }
            if let Some(wanted) = &args.train_run {
                let mut report = quiet_report(&store, &spec, chosen, &filter, &args).await?;
                for (session, why) in passed_over {
                    report.problems.note(&session, why);
                }
                report.problems.add_skips(&skips);
                let run = train::find_run(&report, wanted)?;
                if args.json {
                    out = to_json(&train::TrainRunDocument {
                        storage: &report.storage,
                        cluster: &report.cluster,
                        session: &report.session,
                        train_run: run,
                        job: train::run_job(&report, run),
                        problems: &report.problems,
                    })?;
                } else {
                    train::render_train_run(&report, run, &mut out);
                    render::render_problems(&report.problems, &mut out);
                }
                print_out(&out)?;
                return Ok(Outcome::Done);
            }
            let mut trace = match &args.timeline {
                Some(path) => Some(
                    timeline::TraceWriter::create(path)
                        .with_context(|| format!("creating {}", path.display()))?,
                ),
                None => None,
            };
            let mut gantt = args.html.as_ref().map(|_| html::Gantt::default());
            let drawing = trace.is_some() || gantt.is_some();
            let mut report = session_report(
                &store,
                &spec,
                chosen,
                &filter,
                args.failed_limit,
                TaskStore::new(None),
                &mut |key, t, symbols| {
                    if !drawing {
                        return;
                    }
                    if let Some(slice) = timeline::slice_of(key, t, symbols) {
                        if let Some(w) = &mut trace {
                            w.slice(&slice);
                        }
                        if let Some(g) = &mut gantt {
                            g.add(slice);
                        }
                    }
                },
            )
            .await?;
            for (session, why) in passed_over {
                report.problems.note(&session, why);
            }
            report.problems.add_skips(&skips);
            if let (Some(w), Some(path)) = (trace, &args.timeline) {
                let n = w
                    .finish(&report)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!(
                    "timeline: {n} task attempt(s) written to {}",
                    path.display()
                );
            }
            if let (Some(g), Some(path)) = (gantt, &args.html) {
                std::fs::write(path, html::render_html(&report, &g))
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("html: written to {}", path.display());
            }
            if args.json {
                out = to_json(&report)?;
            } else {
                render_session(&report, &mut out);
            }
        }
    }
    print_out(&out)?;
    Ok(Outcome::Done)
}

/// One bucket opened for reading: where it is, its sessions, and the filters to read with.
struct Bucket {
    spec: StorageSpec,
    store: Arc<dyn ObjectStore>,
    skips: Arc<local::SkipLog>,
    found: discover::Discovered,
    filter: Filter,
}

impl Bucket {
    /// Opens `args.storage` and finds its clusters and sessions (no object is read).
    async fn open(
        args: &InspectArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Bucket> {
        let spec = StorageSpec::parse(&args.storage)
            .and_then(|s| s.with_extra_root(&args.storage_root_dir))
            .with_context(|| format!("reading the storage location {:?}", args.storage))?;
        let filter = Filter::from_args(args)?;
        let OpenBucket {
            store,
            spec: _,
            skips,
        } = open_bucket(&spec, env)?;
        let found = discover(&store, &spec, args).await?;
        Ok(Bucket {
            spec,
            store,
            skips,
            found,
            filter,
        })
    }
}

/// A session's report with nothing drawn.
async fn quiet_report(
    store: &Arc<dyn ObjectStore>,
    spec: &StorageSpec,
    chosen: (ClusterId, String),
    filter: &Filter,
    args: &InspectArgs,
) -> anyhow::Result<SessionReport> {
    session_report(
        store,
        spec,
        chosen,
        filter,
        args.failed_limit,
        TaskStore::new(None),
        &mut |_, _, _| {},
    )
    .await
}

/// `--compare-runs A B`: reads each operand's session (once when they share it) from its
/// bucket (`buckets[0]` for A, `buckets[1]` for B), finds the runs, prints what differs.
async fn compare_runs(
    args: &InspectArgs,
    operands: &[String],
    buckets: [&Bucket; 2],
) -> anyhow::Result<Outcome> {
    let [a_arg, b_arg] = operands else {
        return Err(InspectError::BadArgument {
            flag: "--compare-runs",
            value: operands.join(" "),
            reason: "needs two runs",
        }
        .into());
    };
    let mut reports: Vec<(usize, SessionReport)> = Vec::new();
    let mut picks: Vec<(usize, &str)> = Vec::new();
    for (side, operand) in [a_arg, b_arg].into_iter().enumerate() {
        let bucket = buckets[side];
        let same_bucket = std::ptr::eq(buckets[0], buckets[1]);
        let bucket_no = if same_bucket { 0 } else { side };
        let (session, run) = train::split_run_ref(operand);
        let session =
            session
                .or(args.session.as_deref())
                .ok_or_else(|| InspectError::RunWithoutSession {
                    run: operand.clone(),
                })?;
        let (chosen, passed_over) =
            choose_session(&bucket.store, &bucket.spec, &bucket.found, session).await?;
        let prefix = chosen.0.layout(&bucket.spec.root).history_prefix();
        let known = reports.iter().position(|(n, r)| {
            *n == bucket_no && r.session == chosen.1 && r.cluster.history_prefix == prefix
        });
        let at = match known {
            Some(at) => at,
            None => {
                let mut report =
                    quiet_report(&bucket.store, &bucket.spec, chosen, &bucket.filter, args).await?;
                for (session, why) in passed_over {
                    report.problems.note(&session, why);
                }
                if !reports.iter().any(|(n, _)| *n == bucket_no) {
                    report.problems.add_skips(&bucket.skips);
                }
                reports.push((bucket_no, report));
                reports.len() - 1
            }
        };
        picks.push((at, run));
    }
    let (report_a, run_a) = (&reports[picks[0].0].1, picks[0].1);
    let (report_b, run_b) = (&reports[picks[1].0].1, picks[1].1);
    let a = train::find_run(report_a, run_a)?;
    let b = train::find_run(report_b, run_b)?;
    let not_compared = train::not_comparable(a, b);
    // Unknown settings are not compared: no differences listed, exit 2.
    let differences = if not_compared.is_some() {
        Vec::new()
    } else {
        train::differences(a, b)
    };
    let comparison = train::Comparison {
        a: train::RunSide::new(a_arg, report_a, a),
        b: train::RunSide::new(b_arg, report_b, b),
        settings_equal: not_compared.is_none() && differences.is_empty(),
        not_compared,
        differences,
        problems: reports
            .iter()
            .map(|(_, r)| {
                serde_json::json!({
                    "session": r.session,
                    "problems": serde_json::to_value(&r.problems).unwrap_or_default(),
                })
            })
            .collect(),
    };
    let mut out = String::new();
    if args.json {
        out = to_json(&comparison)?;
    } else {
        train::render_comparison(&comparison, &mut out);
        for (_, r) in reports.iter().filter(|(_, r)| !r.problems.is_empty()) {
            let _ = std::fmt::Write::write_fmt(
                &mut out,
                format_args!("\nsession {}:", render::clean(&r.session)),
            );
            render::render_problems(&r.problems, &mut out);
        }
    }
    print_out(&out)?;
    Ok(if comparison.not_compared.is_some() {
        Outcome::NotCompared
    } else if comparison.settings_equal {
        Outcome::SameSettings
    } else {
        Outcome::SettingsDiffer
    })
}

// ------------------------------------------------------------------ the door for `serve`

/// The wall-clock start in a session name, `YYYY-MM-DDTHH:MM:SS.ffffff` (the head's local
/// time, no zone), as `inspect` reports it.
pub fn session_start(name: &str) -> Option<String> {
    session_started(name)
}

/// `s` with every character a terminal could act on escaped, as in every `inspect` message.
pub fn escape_untrusted(s: &str) -> String {
    escape::escape_name(s)
}

/// A file name or path that need not be UTF-8, escaped as [`escape_untrusted`], with each
/// byte that is not UTF-8 shown as `\x{hex}`.
pub fn escape_untrusted_os(name: &std::ffi::OsStr) -> String {
    escape::escape_os_name(name)
}

/// A whole message that may quote names from the bucket, escaped as `inspect` escapes its
/// errors (backslashes kept).
pub fn escape_message(s: &str) -> String {
    escape::escape_text(s)
}

/// The report as JSON. `serde_json` escapes C0 controls but writes DEL, C1 controls and
/// `U+202E` raw; they are escaped here too (`\u0085`: the same JSON string), so the
/// document is safe on a terminal.
fn to_json<T: Serialize>(report: &T) -> anyhow::Result<String> {
    let raw = serde_json::to_string_pretty(report).context("serialising the report")?;
    let mut s = String::with_capacity(raw.len() + 1);
    for c in raw.chars() {
        if escape::is_unsafe_char(c) && c != '\n' {
            // Outside strings there is only ASCII whitespace; these are all in the BMP.
            let _ = std::fmt::Write::write_fmt(&mut s, format_args!("\\u{:04x}", c as u32));
        } else {
            s.push(c);
        }
    }
    s.push('\n');
    Ok(s)
}

/// Writes the report; a closed pipe (`| head`) is not an error.
fn print_out(text: &str) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut lock = stdout.lock();
    match lock.write_all(text.as_bytes()).and_then(|()| lock.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing the report to stdout"),
    }
}

/// One line about a storage error. `object_store` errors repeat their sources and carry
/// the server's whole XML answer; people need the gist.
fn store_error(e: &object_store::Error) -> String {
    if let object_store::Error::Generic { source, .. } = e {
        if let Some(local) = source.downcast_ref::<local::LocalError>() {
            // Our own, one line, the OS error whole.
            return local.to_string();
        }
    }
    let text = e.to_string();
    let has = |needle: &str| text.contains(needle);
    if has("NoSuchBucket") || has("ContainerNotFound") || has("bucket does not exist") {
        return "the bucket (or container) does not exist".into();
    }
    if has("AccessDenied") || has("AuthorizationFailure") || has("403 Forbidden") {
        return "access denied; check the credentials".into();
    }
    let first = text.lines().next().unwrap_or_default();
    let first = first.split(": <?xml").next().unwrap_or(first);
    bounded(first, 300)
}

/// The dashboard endpoint of placement groups, as the head's poller fetches it
/// (`dashboard::PERIODIC_ENDPOINTS`; a test checks it is there).
const PLACEMENT_GROUPS_URI: &str = "/api/v0/placement_groups?detail=1&limit=10000";

/// Largest placement-group snapshot read (the dashboard answers with at most 10,000 groups).
const MAX_PLACEMENT_GROUP_SNAPSHOT: u64 = 64 << 20;

/// The snapshot of `/api/v0/placement_groups?detail=1` under `fetched_endpoints/`, if any:
/// (its key, its JSON). One that cannot be read or parsed is a problem, not an error.
async fn read_placement_groups(
    store: &Arc<dyn ObjectStore>,
    history_prefix: &str,
    session: &str,
    problems: &mut Problems,
) -> Option<(String, serde_json::Value)> {
    // Listed, not named: the listing gives the key as this backend spells it ('?' and '&'
    // in a name are escaped differently by each).
    let name = crate::contract::endpoints::endpoint_object_name(PLACEMENT_GROUPS_URI);
    let dir = ObjectPath::from(format!(
        "{history_prefix}/{session}/{}",
        crate::contract::endpoints::FETCHED_ENDPOINTS_DIR
    ));
    let listed = match store.list_with_delimiter(Some(&dir)).await {
        Ok(l) => l,
        Err(e) => {
            problems.unreadable(
                &format!("{dir}/"),
                &format!("listing failed: {}", store_error(&e)),
            );
            return None;
        }
    };
    let meta = listed
        .objects
        .into_iter()
        .find(|o| o.location.filename() == Some(name.as_str()))?;
    let key = meta.location.to_string();
    let result = if meta.size > MAX_PLACEMENT_GROUP_SNAPSHOT {
        Err(format!(
            "{} bytes: larger than the {MAX_PLACEMENT_GROUP_SNAPSHOT} read",
            meta.size
        ))
    } else {
        match store.get(&meta.location).await {
            Err(e) => Err(store_error(&e)),
            Ok(got) => match got.bytes().await {
                Err(e) => Err(store_error(&e)),
                Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}")),
            },
        }
    };
    match result {
        Ok(v) => Some((key, v)),
        Err(e) => {
            problems.unreadable(&key, &e);
            None
        }
    }
}

/// Walks, reads and merges one session, then shapes the report; `visit` sees every task
/// attempt once. Fails only when the local spill files fail (the bucket's problems are in
/// the report).
async fn session_report(
    store: &Arc<dyn ObjectStore>,
    spec: &StorageSpec,
    (cluster, session): (ClusterId, String),
    filter: &Filter,
    failed_limit: usize,
    tasks: TaskStore,
    visit: &mut dyn FnMut(&AttemptKey, &TaskState, &Symbols),
) -> anyhow::Result<SessionReport> {
    let storage_arg = &filter.storage_arg;
    let history_prefix = cluster.layout(&spec.root).history_prefix();
    let session_prefix = ObjectPath::from(format!("{history_prefix}/{session}"));
    let mut problems = Problems::default();
    let mut stats = ObjectStats::default();

    // 1. Node directories.
    let node_dirs: Vec<(ObjectPath, String)> =
        match store.list_with_delimiter(Some(&session_prefix)).await {
            Ok(l) => l
                .common_prefixes
                .into_iter()
                .filter_map(|p| {
                    let name = p.filename().unwrap_or_default().to_string();
                    (name != crate::contract::endpoints::FETCHED_ENDPOINTS_DIR).then_some((p, name))
                })
                .collect(),
            Err(e) => {
                problems.unreadable(
                    &format!("{session_prefix}/"),
                    &format!("listing failed: {}", store_error(&e)),
                );
                Vec::new()
            }
        };

    // 2. Partitions of each node.
    let listings: Vec<NodeListing> = futures::stream::iter(node_dirs)
        .map(|(path, node)| walk_node(store, path, node, filter.job.clone()))
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    let mut model = SessionModel::new(filter.job.clone(), tasks);
    let mut partitions = Vec::new();
    for listing in listings {
        for (key, error) in &listing.problems {
            problems.unreadable(key, error);
        }
        let n = model.nodes.entry(listing.node.clone()).or_default();
        n.log_objects += listing.log_objects;
        n.log_bytes += listing.log_bytes;
        for (dir, stream) in listing.partitions {
            partitions.push((dir, stream, listing.node.clone()));
        }
    }
    let partition_listings: Vec<PartitionListing> = futures::stream::iter(partitions)
        .map(|(dir, stream, node)| list_partition(store, dir, stream, node))
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    let mut objects = Vec::new();
    for listing in partition_listings {
        if let Some((key, error)) = &listing.problem {
            problems.unreadable(key, error);
        }
        stats.not_event_objects += listing.not_event_objects;
        for object in listing.objects {
            stats.event_objects_listed += 1;
            if let Stream::Job(job) | Stream::Export(job) = &object.stream {
                if job != crate::contract::events::EXPORT_NODE_GROUP
                    && filter.job.as_ref().is_none_or(|j| j == job)
                {
                    model.jobs.entry(job.clone()).or_default();
                }
            }
            if filter.window.selects_hour(object.hour) {
                objects.push(object);
            } else {
                stats.skipped_by_time += 1;
            }
        }
    }
    // Oldest first, so that events of the same second keep their written order.
    objects.sort_by(|a, b| (a.hour, a.n, a.path.as_ref()).cmp(&(b.hour, b.n, b.path.as_ref())));

    // 3. Read and merge.
    let outside_window = read::read_objects(
        store,
        &objects,
        filter.window,
        &mut model,
        &mut stats,
        &mut problems,
    )
    .await;
    if let Some(e) = model.spill_error.take() {
        return Err(anyhow::Error::new(e).context(
            "writing the task attempts of a big session to temporary files (set TMPDIR to a \
             directory with space)",
        ));
    }
    // 4. The dashboard's placement groups, as the head's collector snapshotted them.
    let placement_groups =
        read_placement_groups(store, &history_prefix, &session, &mut problems).await;
    let shortened = model.tasks.errors_shortened();
    if shortened > 0 {
        problems.note(
            "(error messages)",
            &format!("{shortened} error message(s) cut to their last line: too many bytes of them"),
        );
    }

    let mut report = SessionReport {
        storage: spec.to_string(),
        storage_arg: storage_arg.to_string(),
        cluster: ClusterIdentity {
            kind: cluster.kind.clone(),
            namespace: cluster.namespace.clone(),
            owner: cluster.owner.clone(),
            cluster: cluster.cluster.clone(),
            history_prefix,
        },
        started: session_started(&session),
        session,
        filter: FilterEcho {
            job: filter.job.clone(),
            since: filter.window.since_ns.map(format_time_json),
            until: filter.until_shown.map(format_time_json),
        },
        objects: stats,
        events: EventStats {
            total: model.total,
            duplicates: model.duplicates,
            outside_time_window: outside_window,
            other_job: model.other_job,
            by_type: std::mem::take(&mut model.by_type),
        },
        nodes: Vec::new(),
        jobs: Vec::new(),
        tasks: TaskCounts::default(),
        failed_tasks_total: 0,
        failed_tasks: Vec::new(),
        failure_causes: Vec::new(),
        worker_deaths_total: 0,
        worker_deaths: Vec::new(),
        session_end: Default::default(),
        hangs: Default::default(),
        actors: Vec::new(),
        train_runs: Vec::new(),
        submissions: Vec::new(),
        problems,
        placement_groups,
        pending_after_ns: filter.pending_after_ns,
    };
    shape_report(&mut report, model, failed_limit, visit)
        .context("reading back the task attempts of a big session from temporary files")?;
    Ok(report)
}
