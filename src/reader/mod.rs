//! The read side: a bucket turned into a session model. `inspect` (the command line,
//! `src/inspect/`) and `serve` (the history server, `src/serve/`) are two faces over this one
//! reader, so both show a session the same way: it opens a bucket, finds its clusters and
//! sessions (`discover.rs`), lists a session's partitions (`walk.rs`), reads its objects with
//! bounded parallel reads (`read.rs`), decodes them (`decode.rs`, `scan.rs`, `extract.rs`),
//! folds the events into one model of the session (`model.rs`, `task/`), explains its
//! failures (`causes.rs`), shapes the session's report (`report.rs`) and finds its logs
//! (`logs.rs`). `session.rs` is the door for `serve`; the faces print, this module does not.
//!
//! It reads what this collector writes and what KubeRay's Go collector writes (plain
//! `.jsonl` or gzip, legacy JSON-array files, names with or without the `-<n>.jsonl[.gz]`
//! tail), in camelCase or snake_case (`PRESERVE_PROTO_FIELD_NAME=1`). The sections below name
//! `inspect`'s flags; `serve` reads a session as `inspect --session` does, with no filter.
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
//! is escaped in every message, the report's problems and errors included ([`crate::util::escape`]):
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

use std::sync::Arc;

use anyhow::Context as _;
use futures::StreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};

use crate::storage::StorageSpec;

pub(crate) mod causes;
mod decode;
pub(crate) mod discover;
mod extract;
pub(crate) use extract::camel;
pub(crate) mod filter;
pub(crate) mod local;
pub(crate) mod logs;
mod model;
mod read;
pub(crate) mod report;
mod s3;
pub(crate) mod scan;
mod session;
pub(crate) mod task;
pub(crate) mod values;
pub(crate) mod walk;

use discover::{session_started, ClusterId};
use extract::bounded;
use filter::Filter;
pub(crate) use logs::{find_worker_log, raw_key, tail_start, LogTarget};
use model::SessionModel;
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
use walk::{list_partition, walk_node, NodeListing, PartitionListing, Stream};

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

/// Why the reader could not read what was asked for: a bucket, a session, a log, a filter.
/// Its messages may quote names from the bucket: each face escapes them where it shows them.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
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

/// The wall-clock start in a session name, `YYYY-MM-DDTHH:MM:SS.ffffff` (the head's local
/// time, no zone), as `inspect` reports it.
pub fn session_start(name: &str) -> Option<String> {
    session_started(name)
}

/// One line about a storage error. `object_store` errors repeat their sources and carry
/// the server's whole XML answer; people need the gist.
pub(crate) fn store_error(e: &object_store::Error) -> String {
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
pub(crate) async fn session_report(
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
