//! The read side: a bucket turned into a session model. `inspect` (the command line,
//! `src/inspect/`) and `serve` (the history server, `src/serve/`) are two faces over this one
//! reader, so both show a session the same way: it opens a bucket, finds its clusters and
//! sessions (`discover.rs`), lists a session's partitions (`walk.rs`), reads its objects with
//! bounded parallel reads (`read.rs`), decodes them (`decode.rs`, `scan.rs`, `extract.rs`),
//! folds the events into one model of the session (`model.rs`, `task/`), explains its
//! failures (`causes.rs`), shapes the session's report (`report.rs`) and finds its logs
//! (`logs.rs`). `session.rs` is the door for `serve`. Printing is the faces': the reader
//! writes only a progress line on stderr when it is a terminal (`read.rs`) and a note when a
//! node's log listing fails (`logs.rs`).
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

pub(crate) mod causes;
mod coverage;
mod decode;
pub(crate) mod discover;
mod error;
mod extract;
pub(crate) mod filter;
mod limits;
pub(crate) use limits::set_sessions_read_at_once;
mod load;
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

pub use coverage::{Coverage, Lost};
use discover::session_started;
pub use error::ReadError;
pub(crate) use extract::camel;
pub(crate) use load::session_report;
pub(crate) use logs::{find_worker_log, raw_key, tail_start, LogTarget};
pub(crate) use session::task_log_target;
pub use session::{
    events_signature, latest_session, open_bucket, session_facts, session_markers, session_nodes,
    ActorFacts, JobFacts, NodeFacts, OpenBucket, SessionFacts, SessionMarker, SubmissionFacts,
    TaskView,
};
pub(crate) use values::store_error;
pub use walk::EventsSignature;

/// The wall-clock start in a session name, `YYYY-MM-DDTHH:MM:SS.ffffff` (the head's local
/// time, no zone), as `inspect` reports it.
pub fn session_start(name: &str) -> Option<String> {
    session_started(name)
}
