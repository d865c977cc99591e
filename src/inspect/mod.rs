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
//!   timestamps are in the window. Objects are read concurrently (8 at a time), streamed and
//!   decoded chunk by chunk, so memory does not grow with object size.
//!
//! Bucket contents are untrusted: a bad gzip stream, a line that is not JSON or an object
//! that cannot be fetched is counted and reported under `problems`, never fatal; lines and
//! legacy array documents are size-capped; text output strips control characters (terminal
//! escapes included) from every value. A bucket or directory that does not exist, or one with
//! no session markers, is an error (exit code 1).
//!
//! # How events are merged
//!
//! Events are deduplicated by event id. Lifecycle events carry lists of state transitions that
//! are neither complete nor time-ordered, so transitions are merged across events: an entity's
//! state is the transition with the latest timestamp (ties go to the later state in Ray's
//! enum, so a terminal state wins). Task attempts are keyed by task id and attempt number, and
//! task counts are counts of attempts by their final state (`UNKNOWN` when only a definition
//! was seen). A failed attempt's error is the `rayErrorInfo` of its lifecycle events. Jobs
//! come from the driver job events (`DRIVER_JOB_*`, state `CREATED` or `FINISHED`), completed
//! by Ray's file-based `EXPORT_DRIVER_JOB` events. Ray Train runs and attempts come only from
//! the export events (`EXPORT_TRAIN_RUN`, `EXPORT_TRAIN_RUN_ATTEMPT`); their timestamps are
//! whole seconds, so events of the same second keep the order in which they were written. An
//! actor's lifecycle events carry no job id and are filed in `node_events`, which `--job` does
//! not read: with `--job` an actor's state is known only from export events. Likewise a Train
//! attempt that the collector filed under `export_events/node/` (its run's job was not known
//! yet) is not read with `--job`.
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
//!   "problems": { "unreadable_objects", "bad_lines", "details": [ { "key", "error" } ] } }
//! ```
//!
//! With `--session`:
//!
//! ```text
//! { "storage", "cluster": { "kind", "namespace", "owner", "cluster", "history_prefix" },
//!   "session", "started",
//!   "filter": { "job", "since", "until" (the instant given, or the end of the day or hour
//!               given) },
//!   "objects": { "event_objects_listed", "read", "skipped_by_time", "bytes_read",
//!                "not_event_objects" },
//!   "events": { "total", "duplicates", "outside_time_window", "other_job", "by_type": {..} },
//!   "nodes": [ { "node_id", "ip", "hostname", "is_head", "state", "started", "ended",
//!                "death_reason", "death_message", "resources": {..}, "objects", "bytes",
//!                "log_objects", "log_bytes" } ],
//!   "jobs": [ { "job_id", "status" ("CREATED"|"FINISHED"|"UNKNOWN"), "entrypoint",
//!               "driver_pid", "driver_node_id", "started", "ended",
//!               "tasks": { "total", "by_state": {..} } } ],
//!   "tasks": { "total", "by_state": { "FINISHED": n, "FAILED": n, .. } },
//!   "failed_tasks_total",
//!   "failed_tasks": [ { "task_id", "attempt", "name", "job_id", "task_type", "failed_at",
//!                       "error_type", "error_message", "node_id", "worker_id" } ],
//!   "actors": [ { "actor_id", "class_name", "name", "job_id", "state", "node_id", "pid",
//!                 "death_reason", "death_message" } ],
//!   "train_runs": [ { "run_id", "name", "job_id", "status", "status_detail", "started",
//!                     "ended", "framework_versions": {..},
//!                     "status_history": [ { "status", "time", "detail" } ],
//!                     "attempts": [ { "attempt_id", "status", "status_detail", "started",
//!                                     "ended", "status_history": [..],
//!                                     "workers": [ { "world_rank", "local_rank", "node_rank",
//!                                                    "actor_id", "node_id", "node_ip", "pid",
//!                                                    "status", "gpu_ids" } ] } ] } ],
//!   "problems": { "unreadable_objects", "bad_lines", "details": [ { "key", "error" } ] } }
//! ```
//!
//! `failed_tasks` holds at most `--failed-limit` attempts, earliest failure first;
//! `failed_tasks_total` counts them all. A status history lists each change of status once.
//! `problems.unreadable_objects` counts objects that could not be fetched or decoded and
//! listings that failed; `problems.bad_lines` counts lines (or array elements) that are not
//! JSON objects or not Ray events; `details` says which and why (at most 200 entries).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::Arc;

use anyhow::Context as _;
use futures::StreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};
use serde::Serialize;
use serde_json::Value;

use crate::contract::{self, ClusterLayout, Hour, Owner};
use crate::storage::{Backend, StorageSpec};

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
/// Widest text-table cell.
const MAX_CELL_CHARS: usize = 100;
/// Name of the per-session directory that holds the head's dashboard snapshots, not a node.
const FETCHED_ENDPOINTS_DIR: &str = "fetched_endpoints";
/// Export-events partition of events that belong to no job.
const EXPORT_NODE_PARTITION: &str = "node";

/// Arguments of `inspect`.
#[derive(Debug, Clone, clap::Args)]
pub struct InspectArgs {
    /// The bucket to read: a path, file:///dir, s3://bucket[/root], gs://bucket[/root] or
    /// az://container[/root] (credentials as for --storage).
    #[arg(value_name = "STORAGE")]
    pub storage: String,

    /// Extra key prefix inside the bucket, below the URL's path (KubeRay's STORAGE_ROOT_DIR).
    #[arg(
        long,
        env = "STORAGE_ROOT_DIR",
        value_name = "PREFIX",
        default_value = ""
    )]
    pub storage_root_dir: String,

    /// Only this RayCluster name.
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,

    /// Only this Kubernetes namespace.
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,

    /// Report on this session (`latest`: the newest by the time in its name).
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,

    /// Only this job (hex like 01000000, or Ray's base64 like AQAAAA==); needs --session.
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,

    /// Only events at or after this time (RFC 3339, or YYYY-MM-DD[THH] in UTC).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,

    /// Only events before the end of this time (RFC 3339, or YYYY-MM-DD[THH] in UTC: the
    /// whole day or hour is included).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,

    /// One JSON document for scripts instead of tables.
    #[arg(long)]
    pub json: bool,

    /// Failed task attempts listed in the session report.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub failed_limit: usize,
}

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

/// Runs `inspect`: prints the report on stdout.
pub async fn run(args: InspectArgs, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<()> {
    let spec = StorageSpec::parse(&args.storage)
        .and_then(|s| s.with_extra_root(&args.storage_root_dir))
        .with_context(|| format!("reading the storage location {:?}", args.storage))?;
    if let Backend::File(dir) = &spec.backend {
        // storage::open creates a missing directory; a read must not.
        if !dir.is_dir() {
            return Err(InspectError::NoSuchDirectory(dir.display().to_string()).into());
        }
    }
    let filter = Filter::from_args(&args)?;
    let store =
        crate::storage::open(&spec, env).with_context(|| format!("opening storage {spec}"))?;
    let found = discover(&store, &spec, &args).await?;

    let mut out = String::new();
    match &args.session {
        None => {
            let report = list_report(&store, &spec, found, &filter).await;
            if args.json {
                out = to_json(&report)?;
            } else {
                render_list(&report, &mut out);
            }
        }
        Some(wanted) => {
            let chosen = choose_session(&found, wanted)?;
            let report = session_report(&store, &spec, chosen, &filter, args.failed_limit).await;
            if args.json {
                out = to_json(&report)?;
            } else {
                render_session(&report, &mut out);
            }
        }
    }
    print_out(&out)
}

fn to_json<T: Serialize>(report: &T) -> anyhow::Result<String> {
    let mut s = serde_json::to_string_pretty(report).context("serialising the report")?;
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

// ------------------------------------------------------------------------------ filters

/// `--job`, `--since` and `--until`, checked once.
#[derive(Debug, Clone, Default)]
struct Filter {
    job: Option<String>,
    window: TimeWindow,
    /// `--until` for people: the instant given, or the end of the day or hour given.
    until_shown: Option<i64>,
}

impl Filter {
    fn from_args(args: &InspectArgs) -> Result<Filter, InspectError> {
        let job = match &args.job {
            None => None,
            Some(j) => {
                if args.session.is_none() {
                    return Err(InspectError::BadArgument {
                        flag: "--job",
                        value: j.clone(),
                        reason: "needs --session (a session name, or latest)",
                    });
                }
                Some(
                    contract::id_to_hex(j.trim())
                        .map_err(|_| InspectError::BadArgument {
                            flag: "--job",
                            value: j.clone(),
                            reason: "not a job id in hex or base64",
                        })?
                        .as_str()
                        .to_string(),
                )
            }
        };
        let since = args
            .since
            .as_deref()
            .map(|s| parse_time_arg("--since", s).map(|(start, _)| start))
            .transpose()?;
        let until = args
            .until
            .as_deref()
            .map(|s| parse_time_arg("--until", s))
            .transpose()?;
        let until_shown = until.map(|(start, end)| if end - start == 1 { start } else { end });
        let until = until.map(|(_, end)| end);
        if let (Some(s), Some(u)) = (since, until) {
            if s >= u {
                return Err(InspectError::BadArgument {
                    flag: "--until",
                    value: args.until.clone().unwrap_or_default(),
                    reason: "is not after --since",
                });
            }
        }
        Ok(Filter {
            job,
            window: TimeWindow {
                since_ns: since,
                until_ns: until,
            },
            until_shown,
        })
    }
}

/// `[since, until)` in Unix nanoseconds; either end open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct TimeWindow {
    since_ns: Option<i64>,
    until_ns: Option<i64>,
}

const NANOS_PER_SECOND: i64 = 1_000_000_000;
const NANOS_PER_HOUR: i64 = 3600 * NANOS_PER_SECOND;

impl TimeWindow {
    fn is_open(&self) -> bool {
        self.since_ns.is_none() && self.until_ns.is_none()
    }

    fn contains(&self, time_ns: Option<i64>) -> bool {
        if self.is_open() {
            return true;
        }
        let Some(t) = time_ns else {
            return false;
        };
        self.since_ns.is_none_or(|s| t >= s) && self.until_ns.is_none_or(|u| t < u)
    }

    /// Whether an object of hour partition `hour` may hold events of the window. The hour in
    /// a name is the events' hour (this collector) or the file's creation hour (KubeRay: its
    /// events may be a few minutes later), so one hour of slack is allowed on each side.
    fn selects_hour(&self, hour: Hour) -> bool {
        let first = self
            .since_ns
            .map(|s| s.div_euclid(NANOS_PER_HOUR) - 1)
            .unwrap_or(i64::MIN);
        let last = self
            .until_ns
            .map(|u| u.saturating_sub(1).div_euclid(NANOS_PER_HOUR) + 1)
            .unwrap_or(i64::MAX);
        (first..=last).contains(&hour.0)
    }

    /// Whether the hour span `[from, until)` (nanoseconds) overlaps the window.
    fn overlaps(&self, from_ns: i64, until_ns: i64) -> bool {
        self.since_ns.is_none_or(|s| until_ns > s) && self.until_ns.is_none_or(|u| from_ns < u)
    }
}

/// Parses `--since`/`--until`: RFC 3339, `YYYY-MM-DD` or `YYYY-MM-DDTHH` (UTC). Returns the
/// start and the (exclusive) end of the period named: a day, an hour, or one nanosecond.
fn parse_time_arg(flag: &'static str, s: &str) -> Result<(i64, i64), InspectError> {
    let bad = || InspectError::BadArgument {
        flag,
        value: s.to_string(),
        reason: "expected RFC 3339 (2026-11-22T02:06:00Z), YYYY-MM-DD or YYYY-MM-DDTHH",
    };
    let t = s.trim();
    let b = t.as_bytes();
    let period = match b.len() {
        10 => Hour::parse_label(&format!("{t}-00")).map(|h| (h, 24)),
        13 if matches!(b[10], b'T' | b't' | b' ') => {
            Hour::parse_label(&format!("{}-{}", &t[..10], &t[11..])).map(|h| (h, 1))
        }
        _ => None,
    };
    if let Some((hour, hours)) = period {
        let start = hour.0.saturating_mul(NANOS_PER_HOUR);
        return Ok((start, start.saturating_add(hours * NANOS_PER_HOUR)));
    }
    let ns = parse_time_ns(t).ok_or_else(bad)?;
    Ok((ns, ns.saturating_add(1)))
}

/// An RFC 3339 timestamp as Unix nanoseconds (fractional digits beyond 9 are dropped).
fn parse_time_ns(s: &str) -> Option<i64> {
    let seconds = crate::util::time::parse_rfc3339_seconds(s)?;
    let b = s.as_bytes();
    let mut fraction: i64 = 0;
    if b.get(19) == Some(&b'.') {
        let digits: Vec<u8> = b[20..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .take(9)
            .copied()
            .collect();
        for (i, d) in digits.iter().enumerate() {
            fraction += i64::from(d - b'0') * 10i64.pow(8 - i as u32);
        }
    }
    seconds.checked_mul(NANOS_PER_SECOND)?.checked_add(fraction)
}

// ------------------------------------------------------------------------------ discovery

/// A cluster as named by its metadata directory.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
struct ClusterId {
    kind: String,
    namespace: String,
    owner: Option<String>,
    cluster: String,
}

impl ClusterId {
    /// Parses `<ns>_<cluster>` (raycluster) or `<ns>_<owner>_<cluster>` (rayjob, rayservice);
    /// the names are DNS-1123, so they hold no `_`.
    fn parse(kind: &str, dir: &str) -> Option<ClusterId> {
        let parts: Vec<&str> = dir.split('_').collect();
        if !parts.iter().all(|p| contract::is_dns1123_subdomain(p)) {
            return None;
        }
        let (namespace, owner, cluster) = match (kind, parts.as_slice()) {
            ("raycluster", [ns, c]) => (ns, None, c),
            ("rayjob" | "rayservice", [ns, o, c]) => (ns, Some(o.to_string()), c),
            _ => return None,
        };
        Some(ClusterId {
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            owner,
            cluster: cluster.to_string(),
        })
    }

    fn layout(&self, root: &str) -> ClusterLayout {
        let owner = match (self.kind.as_str(), &self.owner) {
            ("rayjob", Some(o)) => Owner::RayJob(o.clone()),
            ("rayservice", Some(o)) => Owner::RayService(o.clone()),
            _ => Owner::RayCluster,
        };
        ClusterLayout {
            root: root.to_string(),
            namespace: self.namespace.clone(),
            cluster: self.cluster.clone(),
            owner,
        }
    }

    /// `ns/cluster` or `ns/owner/cluster`, for people.
    fn display(&self) -> String {
        match &self.owner {
            Some(o) => format!("{}/{o}/{}", self.namespace, self.cluster),
            None => format!("{}/{}", self.namespace, self.cluster),
        }
    }
}

/// What the metadata prefix holds: clusters and their sessions, plus anything unrecognised.
struct Discovered {
    clusters: BTreeMap<ClusterId, Vec<String>>,
    problems: Problems,
}

/// Lists the session markers, filtered by `--cluster`/`--namespace`.
async fn discover(
    store: &Arc<dyn ObjectStore>,
    spec: &StorageSpec,
    args: &InspectArgs,
) -> anyhow::Result<Discovered> {
    let prefix = join_key(&spec.root, "cluster-metadata");
    let kinds = store
        .list_with_delimiter(Some(&ObjectPath::from(prefix.as_str())))
        .await
        .map_err(|e| anyhow::anyhow!("listing {prefix}/ in {spec}: {}", store_error(&e)))?;
    let mut problems = Problems::default();
    let mut cluster_dirs = Vec::new();
    for kind_path in &kinds.common_prefixes {
        let kind = kind_path.filename().unwrap_or_default().to_string();
        if !matches!(kind.as_str(), "raycluster" | "rayjob" | "rayservice") {
            problems.note(kind_path.as_ref(), "unknown owner kind directory; skipped");
            continue;
        }
        let listed = store
            .list_with_delimiter(Some(kind_path))
            .await
            .map_err(|e| anyhow::anyhow!("listing {kind_path}/ in {spec}: {}", store_error(&e)))?;
        for dir in listed.common_prefixes {
            let name = dir.filename().unwrap_or_default().to_string();
            match ClusterId::parse(&kind, &name) {
                Some(id) => cluster_dirs.push((id, dir)),
                None => problems.note(dir.as_ref(), "not <namespace>_[<owner>_]<cluster>; skipped"),
            }
        }
    }
    let total_clusters = cluster_dirs.len();
    let wanted = |id: &ClusterId| {
        args.cluster.as_deref().is_none_or(|c| c == id.cluster)
            && args.namespace.as_deref().is_none_or(|n| n == id.namespace)
    };
    cluster_dirs.retain(|(id, _)| wanted(id));
    let listings: Vec<_> = futures::stream::iter(cluster_dirs)
        .map(|(id, dir)| async move {
            let listed = store.list_with_delimiter(Some(&dir)).await;
            (id, dir, listed)
        })
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    let mut clusters: BTreeMap<ClusterId, Vec<String>> = BTreeMap::new();
    for (id, dir, listed) in listings {
        let listed =
            listed.map_err(|e| anyhow::anyhow!("listing {dir}/ in {spec}: {}", store_error(&e)))?;
        let sessions = clusters.entry(id).or_default();
        for marker in listed.objects {
            let name = marker.location.filename().unwrap_or_default();
            if contract::is_safe_segment(name) {
                sessions.push(name.to_string());
            } else {
                problems.note(marker.location.as_ref(), "not a session name; skipped");
            }
        }
        sessions.sort_by_key(|s| session_sort_key(s));
    }
    clusters.retain(|_, sessions| !sessions.is_empty());
    if clusters.is_empty() {
        if total_clusters == 0 || (args.cluster.is_none() && args.namespace.is_none()) {
            return Err(InspectError::NoMarkers {
                storage: spec.to_string(),
                prefix,
            }
            .into());
        }
        return Err(InspectError::NoSuchSession {
            wanted: describe_cluster_filter(args),
            known: format!("{total_clusters} other cluster(s); run without --cluster/--namespace"),
        }
        .into());
    }
    Ok(Discovered { clusters, problems })
}

fn describe_cluster_filter(args: &InspectArgs) -> String {
    let mut parts = Vec::new();
    if let Some(c) = &args.cluster {
        parts.push(format!("--cluster {c}"));
    }
    if let Some(n) = &args.namespace {
        parts.push(format!("--namespace {n}"));
    }
    parts.join(" ")
}

/// Picks the session asked for with `--session`.
fn choose_session(found: &Discovered, wanted: &str) -> Result<(ClusterId, String), InspectError> {
    let all = found
        .clusters
        .iter()
        .flat_map(|(id, sessions)| sessions.iter().map(move |s| (id, s)));
    if wanted == "latest" {
        return all
            .max_by_key(|(_, s)| session_sort_key(s))
            .map(|(id, s)| (id.clone(), s.clone()))
            .ok_or_else(|| InspectError::NoSuchSession {
                wanted: "latest".into(),
                known: "none".into(),
            });
    }
    let matches: Vec<&ClusterId> = all
        .filter(|(_, s)| *s == wanted)
        .map(|(id, _)| id)
        .collect();
    match matches.as_slice() {
        [one] => Ok(((*one).clone(), wanted.to_string())),
        [] => {
            let known: Vec<String> = found
                .clusters
                .iter()
                .flat_map(|(id, ss)| ss.iter().map(move |s| format!("{}:{s}", id.display())))
                .collect();
            let shown = known.len().min(10);
            let mut known_text = known[..shown].join(", ");
            if known.len() > shown {
                let _ = write!(known_text, " and {} more", known.len() - shown);
            }
            Err(InspectError::NoSuchSession {
                wanted: format!("--session {wanted}"),
                known: known_text,
            })
        }
        many => Err(InspectError::AmbiguousSession {
            session: wanted.to_string(),
            clusters: many
                .iter()
                .map(|id| format!("{} {}", id.kind, id.display()))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The wall-clock start in a session name `session_YYYY-MM-DD_HH-MM-SS_ffffff_pid`, as
/// `YYYY-MM-DDTHH:MM:SS.ffffff`. Ray formats it with the head's local clock (UTC in most
/// containers), so no zone is claimed.
fn session_started(name: &str) -> Option<String> {
    let rest = name.strip_prefix("session_")?;
    let mut parts = rest.split('_');
    let (date, time, micros) = (parts.next()?, parts.next()?, parts.next()?);
    Hour::parse_label(&format!("{date}-00"))?;
    let t = time.as_bytes();
    let ok = t.len() == 8
        && t[2] == b'-'
        && t[5] == b'-'
        && t.iter()
            .enumerate()
            .all(|(i, c)| i == 2 || i == 5 || c.is_ascii_digit());
    if !ok || micros.is_empty() || !micros.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(format!(
        "{date}T{}:{}:{}.{micros}",
        &time[0..2],
        &time[3..5],
        &time[6..8]
    ))
}

/// Sessions sort by their start time, names without one first.
fn session_sort_key(name: &str) -> (Option<String>, String) {
    (session_started(name), name.to_string())
}

/// One line about a storage error. `object_store` errors repeat their sources and carry
/// the server's whole XML answer; people need the gist.
fn store_error(e: &object_store::Error) -> String {
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

fn join_key(root: &str, rest: &str) -> String {
    if root.is_empty() {
        rest.to_string()
    } else {
        format!("{root}/{rest}")
    }
}

// ------------------------------------------------------------------------------ listing mode

/// Output of `inspect` without `--session`.
#[derive(Debug, Serialize)]
struct ListReport {
    storage: String,
    clusters: Vec<ClusterEntry>,
    problems: Problems,
}

#[derive(Debug, Serialize)]
struct ClusterEntry {
    kind: String,
    namespace: String,
    owner: Option<String>,
    cluster: String,
    history_prefix: String,
    sessions: Vec<SessionEntry>,
}

#[derive(Debug, Serialize)]
struct SessionEntry {
    session: String,
    started: Option<String>,
    nodes: usize,
    objects: u64,
    bytes: u64,
    event_objects: u64,
    events_from: Option<String>,
    events_until: Option<String>,
}

/// What one listing of `P/<session>/` tells without reading anything.
#[derive(Debug, Default)]
struct SessionFootprint {
    nodes: usize,
    objects: u64,
    bytes: u64,
    event_objects: u64,
    hours: Option<(Hour, Hour)>,
}

async fn list_report(
    store: &Arc<dyn ObjectStore>,
    spec: &StorageSpec,
    found: Discovered,
    filter: &Filter,
) -> ListReport {
    let mut problems = found.problems;
    let sessions: Vec<(ClusterId, String)> = found
        .clusters
        .iter()
        .flat_map(|(id, ss)| ss.iter().map(move |s| (id.clone(), s.clone())))
        .collect();
    let footprints: Vec<_> = futures::stream::iter(sessions)
        .map(|(id, session)| async move {
            let prefix = format!("{}/{session}", id.layout(&spec.root).history_prefix());
            let fp = session_footprint(store, &prefix).await;
            (id, session, fp)
        })
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    let mut clusters: BTreeMap<ClusterId, ClusterEntry> = BTreeMap::new();
    for (id, session, footprint) in footprints {
        let footprint = match footprint {
            Ok(f) => f,
            Err((key, e)) => {
                problems.unreadable(&key, &e);
                SessionFootprint::default()
            }
        };
        let (events_from, events_until) = match footprint.hours {
            Some((first, last)) => (
                // Names are untrusted: a year 9999 must not overflow.
                Some(first.0.saturating_mul(NANOS_PER_HOUR)),
                Some((last.0 + 1).saturating_mul(NANOS_PER_HOUR)),
            ),
            None => (None, None),
        };
        if !filter.window.is_open() {
            let keep = match (events_from, events_until) {
                (Some(f), Some(u)) => filter.window.overlaps(f, u),
                _ => false,
            };
            if !keep {
                continue;
            }
        }
        let entry = clusters.entry(id.clone()).or_insert_with(|| ClusterEntry {
            kind: id.kind.clone(),
            namespace: id.namespace.clone(),
            owner: id.owner.clone(),
            cluster: id.cluster.clone(),
            history_prefix: id.layout(&spec.root).history_prefix(),
            sessions: Vec::new(),
        });
        entry.sessions.push(SessionEntry {
            started: session_started(&session),
            session,
            nodes: footprint.nodes,
            objects: footprint.objects,
            bytes: footprint.bytes,
            event_objects: footprint.event_objects,
            events_from: events_from.map(format_time_json),
            events_until: events_until.map(format_time_json),
        });
    }
    ListReport {
        storage: spec.to_string(),
        clusters: clusters.into_values().collect(),
        problems,
    }
}

/// Lists everything under `P/<session>/` once (objects are not read).
async fn session_footprint(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
) -> Result<SessionFootprint, (String, String)> {
    let mut listing = store.list(Some(&ObjectPath::from(prefix)));
    let mut fp = SessionFootprint::default();
    let mut nodes = HashSet::new();
    while let Some(meta) = listing.next().await {
        let meta = meta.map_err(|e| {
            (
                format!("{prefix}/"),
                format!("listing failed: {}", store_error(&e)),
            )
        })?;
        fp.objects += 1;
        fp.bytes += meta.size;
        let key = meta.location.as_ref();
        let Some(rel) = key.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')) else {
            continue;
        };
        let parts: Vec<&str> = rel.split('/').collect();
        if parts.len() < 2 || parts[0] == FETCHED_ENDPOINTS_DIR {
            continue;
        }
        nodes.insert(parts[0].to_string());
        let is_event_dir = matches!(
            (parts[1], parts.len()),
            ("node_events", 3) | ("job_events", 4) | ("export_events", 4)
        );
        if !is_event_dir {
            continue;
        }
        if let Some((hour, _)) = parse_event_object_name(parts[parts.len() - 1]) {
            fp.event_objects += 1;
            fp.hours = Some(match fp.hours {
                None => (hour, hour),
                Some((a, b)) => (a.min(hour), b.max(hour)),
            });
        }
    }
    fp.nodes = nodes.len();
    Ok(fp)
}

/// The hour partition (and sequence number, if any) in an event object's name, if the name
/// is one the History Server reads: `-YYYY-MM-DD-HH[-<n>][.jsonl][.gz]` at the end.
fn parse_event_object_name(name: &str) -> Option<(Hour, Option<u64>)> {
    let stem = name.strip_suffix(".gz").unwrap_or(name);
    let stem = stem.strip_suffix(".jsonl").unwrap_or(stem);
    if let Some((head, n)) = stem.rsplit_once('-') {
        if !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) {
            if let Some(hour) = hour_at_end(head) {
                return Some((hour, n.parse().ok()));
            }
        }
    }
    hour_at_end(stem).map(|h| (h, None))
}

/// `...-YYYY-MM-DD-HH` → the hour.
fn hour_at_end(s: &str) -> Option<Hour> {
    let cut = s.len().checked_sub(13)?;
    if !s.is_char_boundary(cut) || !s[..cut].ends_with('-') {
        return None;
    }
    Hour::parse_label(&s[cut..])
}

// ------------------------------------------------------------------------------ session walk

/// Which stream of a node an event object belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stream {
    /// `node_events/`
    Node,
    /// `job_events/<job>/`
    Job(String),
    /// `export_events/<job or "node">/`
    Export(String),
}

/// An event object chosen for reading.
#[derive(Debug, Clone)]
struct EventObject {
    path: ObjectPath,
    node: String,
    stream: Stream,
    hour: Hour,
    n: Option<u64>,
    size: u64,
}

/// What the walk of one node directory found: the event partitions to list, and the size
/// of its logs.
#[derive(Debug, Default)]
struct NodeListing {
    node: String,
    partitions: Vec<(ObjectPath, Stream)>,
    log_objects: u64,
    log_bytes: u64,
    problems: Vec<(String, String)>,
}

/// Walks `P/<session>/<node>/` with delimiter listings down to its event partitions; with a
/// job filter only the job's two partitions are named, nothing is listed.
async fn walk_node(
    store: &Arc<dyn ObjectStore>,
    node_prefix: ObjectPath,
    node: String,
    job: Option<String>,
) -> NodeListing {
    let mut listing = NodeListing {
        node,
        ..Default::default()
    };
    if let Some(job) = job {
        listing.partitions.push((
            node_prefix.clone().join("job_events").join(job.as_str()),
            Stream::Job(job.clone()),
        ));
        listing.partitions.push((
            node_prefix.clone().join("export_events").join(job.as_str()),
            Stream::Export(job),
        ));
        return listing;
    }
    let top = match store.list_with_delimiter(Some(&node_prefix)).await {
        Ok(t) => t,
        Err(e) => {
            listing.problems.push((
                format!("{node_prefix}/"),
                format!("listing failed: {}", store_error(&e)),
            ));
            return listing;
        }
    };
    for sub in top.common_prefixes {
        match sub.filename().unwrap_or_default() {
            "node_events" => listing.partitions.push((sub.clone(), Stream::Node)),
            name @ ("job_events" | "export_events") => {
                let export = name == "export_events";
                match store.list_with_delimiter(Some(&sub)).await {
                    Ok(parts) => {
                        for part in parts.common_prefixes {
                            let id = part.filename().unwrap_or_default().to_string();
                            let stream = if export {
                                Stream::Export(id)
                            } else {
                                Stream::Job(id)
                            };
                            listing.partitions.push((part, stream));
                        }
                    }
                    Err(e) => listing.problems.push((
                        format!("{sub}/"),
                        format!("listing failed: {}", store_error(&e)),
                    )),
                }
            }
            "logs" => {
                let mut logs = store.list(Some(&sub));
                while let Some(meta) = logs.next().await {
                    match meta {
                        Ok(m) => {
                            listing.log_objects += 1;
                            listing.log_bytes += m.size;
                        }
                        Err(e) => {
                            listing.problems.push((
                                format!("{sub}/"),
                                format!("listing failed: {}", store_error(&e)),
                            ));
                            break;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    listing
}

/// The event objects of one partition.
#[derive(Debug, Default)]
struct PartitionListing {
    objects: Vec<EventObject>,
    /// Objects whose names the History Server would not read.
    not_event_objects: u64,
    problem: Option<(String, String)>,
}

/// Lists one partition directory (one level: its objects).
async fn list_partition(
    store: &Arc<dyn ObjectStore>,
    dir: ObjectPath,
    stream: Stream,
    node: String,
) -> PartitionListing {
    let mut listing = PartitionListing::default();
    let listed = match store.list_with_delimiter(Some(&dir)).await {
        Ok(l) => l,
        Err(e) => {
            listing.problem = Some((
                format!("{dir}/"),
                format!("listing failed: {}", store_error(&e)),
            ));
            return listing;
        }
    };
    for meta in listed.objects {
        let name = meta.location.filename().unwrap_or_default();
        match parse_event_object_name(name) {
            Some((hour, n)) => listing.objects.push(EventObject {
                path: meta.location.clone(),
                node: node.clone(),
                stream: stream.clone(),
                hour,
                n,
                size: meta.size,
            }),
            None => listing.not_event_objects += 1,
        }
    }
    listing
}

// ------------------------------------------------------------------------------ decoding

/// Facts taken from one object, in the order they were written.
#[derive(Debug, Default)]
struct Extraction {
    facts: Vec<Fact>,
    bad_lines: u64,
    first_bad_line: Option<String>,
    outside_window: u64,
}

/// How an object's content is laid out, decided by its first non-space byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Undecided,
    /// JSON lines, one event per line.
    Lines,
    /// A legacy JSON array (or several JSON values in a row): parsed whole.
    Document,
}

/// Receives an object's decoded bytes chunk by chunk and turns them into facts, so an object
/// is never held whole in memory (except a legacy array document, which is capped).
struct ContentSink {
    window: TimeWindow,
    limits: ContentLimits,
    layout: Layout,
    buf: Vec<u8>,
    /// Inside a line longer than the limit: dropping bytes until its end.
    skipping_long_line: bool,
    decoded: u64,
    out: Extraction,
}

impl ContentSink {
    fn new(window: TimeWindow, limits: ContentLimits) -> ContentSink {
        ContentSink {
            window,
            limits,
            layout: Layout::Undecided,
            buf: Vec::new(),
            skipping_long_line: false,
            decoded: 0,
            out: Extraction::default(),
        }
    }

    fn push(&mut self, mut data: &[u8]) -> Result<(), String> {
        self.decoded += data.len() as u64;
        if self.decoded > self.limits.decoded {
            return Err(format!(
                "more than {} of content; the rest was not read",
                human_bytes(self.limits.decoded)
            ));
        }
        if self.layout == Layout::Undecided {
            match data.iter().position(|c| !c.is_ascii_whitespace()) {
                None => return Ok(()),
                Some(i) => {
                    self.layout = if data[i] == b'[' {
                        Layout::Document
                    } else {
                        Layout::Lines
                    };
                    data = &data[i..];
                }
            }
        }
        if self.layout == Layout::Document {
            if self.buf.len() + data.len() > self.limits.document {
                return Err(format!(
                    "JSON array document larger than {}; not read",
                    human_bytes(self.limits.document as u64)
                ));
            }
            self.buf.extend_from_slice(data);
            return Ok(());
        }
        while !data.is_empty() {
            let newline = data.iter().position(|&c| c == b'\n');
            let (part, rest) = match newline {
                Some(i) => (&data[..i], Some(&data[i + 1..])),
                None => (data, None),
            };
            if !self.skipping_long_line {
                if self.buf.len() + part.len() > self.limits.line {
                    self.bad_line(format!(
                        "line longer than {}",
                        human_bytes(self.limits.line as u64)
                    ));
                    self.buf = Vec::new();
                    self.skipping_long_line = true;
                } else {
                    self.buf.extend_from_slice(part);
                }
            }
            match rest {
                Some(r) => {
                    if !self.skipping_long_line {
                        let line = std::mem::take(&mut self.buf);
                        self.line(&line);
                    }
                    self.skipping_long_line = false;
                    data = r;
                }
                None => break,
            }
        }
        Ok(())
    }

    /// Ends the content; `complete` is false when it was cut short (the last partial line
    /// is then dropped, not parsed).
    fn finish(&mut self, complete: bool) {
        let buf = std::mem::take(&mut self.buf);
        match self.layout {
            Layout::Undecided => {}
            Layout::Lines => {
                if complete && !self.skipping_long_line {
                    self.line(&buf);
                }
            }
            Layout::Document => {
                let values = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
                for value in values {
                    match value {
                        Ok(v) => self.value(v),
                        Err(e) => {
                            self.bad_line(format!("not valid JSON: {e}"));
                            break;
                        }
                    }
                }
            }
        }
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.trim_ascii();
        if line.is_empty() {
            return;
        }
        match serde_json::from_slice::<Value>(line) {
            Ok(v) => self.value(v),
            Err(e) => self.bad_line(format!("not valid JSON: {e}")),
        }
    }

    /// A JSON value: an event, or an array of events (a POST body or a legacy file).
    fn value(&mut self, v: Value) {
        match v {
            Value::Array(items) => {
                for item in items {
                    if item.is_object() {
                        self.record(&item);
                    } else {
                        self.bad_line("array element is not a JSON object".into());
                    }
                }
            }
            Value::Object(_) => self.record(&v),
            _ => self.bad_line("not a JSON object".into()),
        }
    }

    fn record(&mut self, v: &Value) {
        let seq = self.out.facts.len() as u64 + self.out.outside_window;
        let fact = if v.get("event_data").is_some() {
            extract_export_event(v, seq)
        } else {
            extract_ray_event(v, seq)
        };
        match fact {
            None => self.bad_line("not a Ray event (no eventType or source_type)".into()),
            Some(f) if !self.window.contains(f.time_ns) => self.out.outside_window += 1,
            Some(f) => self.out.facts.push(f),
        }
    }

    fn bad_line(&mut self, why: String) {
        self.out.bad_lines += 1;
        if self.out.first_bad_line.is_none() {
            self.out.first_bad_line = Some(why);
        }
    }
}

/// A limit of [`ContentSink`] was reached; carried through the gzip decoder's `io::Error`
/// so it is not reported as bad gzip.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ContentLimit(String);

impl std::io::Write for ContentSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.push(buf)
            .map_err(|e| std::io::Error::other(ContentLimit(e)))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The result of reading one object.
#[derive(Debug)]
struct Readout {
    extraction: Extraction,
    bytes: u64,
    /// Why the object could not be read (completely).
    failure: Option<String>,
}

/// Fetches one object and decodes it as it streams in.
async fn read_object(
    store: &Arc<dyn ObjectStore>,
    object: &EventObject,
    window: TimeWindow,
) -> Readout {
    let gzip = object.path.as_ref().ends_with(".gz");
    let sink = ContentSink::new(window, CONTENT_LIMITS);
    let mut decoder = if gzip {
        Decoder::Gzip(Box::new(flate2::write::MultiGzDecoder::new(sink)))
    } else {
        Decoder::Plain(sink)
    };
    let mut bytes = 0u64;
    let mut failure = None;
    match store.get(&object.path).await {
        Err(e) => failure = Some(format!("could not be fetched: {}", store_error(&e))),
        Ok(got) => {
            let mut body = got.into_stream();
            while let Some(chunk) = body.next().await {
                let written = match chunk {
                    Ok(chunk) => {
                        bytes += chunk.len() as u64;
                        decoder.write(&chunk)
                    }
                    Err(e) => Err(format!("reading failed: {}", store_error(&e))),
                };
                if let Err(e) = written {
                    failure = Some(e);
                    break;
                }
            }
            if failure.is_none() {
                failure = decoder.end().err();
            }
        }
    }
    let mut sink = decoder.into_sink();
    sink.finish(failure.is_none());
    Readout {
        extraction: std::mem::take(&mut sink.out),
        bytes,
        failure,
    }
}

/// Plain or gzip content in front of a [`ContentSink`].
enum Decoder {
    Plain(ContentSink),
    Gzip(Box<flate2::write::MultiGzDecoder<ContentSink>>),
}

impl Decoder {
    fn write(&mut self, data: &[u8]) -> Result<(), String> {
        match self {
            Decoder::Plain(sink) => sink.push(data),
            Decoder::Gzip(gz) => gz.write_all(data).map_err(gzip_error),
        }
    }

    /// Checks that the gzip stream ended properly.
    fn end(&mut self) -> Result<(), String> {
        match self {
            Decoder::Plain(_) => Ok(()),
            Decoder::Gzip(gz) => gz.try_finish().map_err(gzip_error),
        }
    }

    fn into_sink(self) -> ContentSink {
        match self {
            Decoder::Plain(sink) => sink,
            Decoder::Gzip(mut gz) => {
                let sink = gz.get_mut();
                let mut taken = ContentSink::new(sink.window, sink.limits);
                std::mem::swap(sink, &mut taken);
                taken
            }
        }
    }
}

fn gzip_error(e: std::io::Error) -> String {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<ContentLimit>())
    {
        Some(limit) => limit.0.clone(),
        None => format!("not a valid gzip stream: {e}"),
    }
}

// ------------------------------------------------------------------------------ extraction

/// The useful part of one event, kept compact (events themselves are dropped at once).
#[derive(Debug, Clone)]
struct Fact {
    event_id: Option<String>,
    event_type: String,
    time_ns: Option<i64>,
    /// Position in its object, for ordering events of the same (whole) second.
    seq: u64,
    body: Body,
}

/// A state transition: state name and time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Transition {
    state: String,
    time_ns: Option<i64>,
}

#[derive(Debug, Clone)]
enum Body {
    NodeDefinition {
        node_id: String,
        ip: Option<String>,
        hostname: Option<String>,
        started_ns: Option<i64>,
    },
    NodeLifecycle {
        node_id: String,
        transitions: Vec<NodeTransition>,
    },
    DriverJobDefinition {
        job_id: String,
        entrypoint: Option<String>,
        driver_pid: Option<i64>,
        driver_node_id: Option<String>,
    },
    DriverJobLifecycle {
        job_id: String,
        transitions: Vec<Transition>,
    },
    TaskDefinition {
        task: TaskKey,
        job_id: Option<String>,
        name: Option<String>,
        task_type: Option<String>,
    },
    TaskLifecycle(Box<TaskLifecycle>),
    ActorDefinition {
        actor_id: String,
        job_id: Option<String>,
        class_name: Option<String>,
        name: Option<String>,
    },
    ActorLifecycle {
        actor_id: String,
        transitions: Vec<ActorTransition>,
    },
    TrainRun(Box<TrainRunEvent>),
    TrainRunAttempt(Box<TrainAttemptEvent>),
    ExportDriverJob {
        job_id: String,
        entrypoint: Option<String>,
        is_dead: bool,
        started_ns: Option<i64>,
        ended_ns: Option<i64>,
        driver_pid: Option<i64>,
    },
    ExportActor {
        actor_id: String,
        job_id: Option<String>,
        class_name: Option<String>,
        name: Option<String>,
        transition: ActorTransition,
    },
    ExportNode {
        node_id: String,
        ip: Option<String>,
        is_head: Option<bool>,
        started_ns: Option<i64>,
        transition: NodeTransition,
    },
    /// Counted only.
    Other,
}

impl Body {
    /// The job an event belongs to, when it names one.
    fn job_id(&self) -> Option<&str> {
        match self {
            Body::DriverJobDefinition { job_id, .. }
            | Body::DriverJobLifecycle { job_id, .. }
            | Body::ExportDriverJob { job_id, .. } => Some(job_id),
            Body::TaskDefinition { job_id, .. }
            | Body::ActorDefinition { job_id, .. }
            | Body::ExportActor { job_id, .. } => job_id.as_deref(),
            Body::TaskLifecycle(t) => t.job_id.as_deref(),
            Body::TrainRun(r) => r.job_id.as_deref(),
            _ => None,
        }
    }
}

/// Task attempts are the unit of Ray's task events.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct TaskKey {
    task_id: String,
    attempt: i64,
}

#[derive(Debug, Clone)]
struct TaskLifecycle {
    task: TaskKey,
    job_id: Option<String>,
    transitions: Vec<Transition>,
    error: Option<(Option<String>, Option<String>)>,
    node_id: Option<String>,
    worker_id: Option<String>,
}

#[derive(Debug, Clone)]
struct NodeTransition {
    state: Transition,
    resources: Option<BTreeMap<String, f64>>,
    death_reason: Option<String>,
    death_message: Option<String>,
}

#[derive(Debug, Clone)]
struct ActorTransition {
    state: Transition,
    node_id: Option<String>,
    pid: Option<i64>,
    death_reason: Option<String>,
    death_message: Option<String>,
}

#[derive(Debug, Clone)]
struct TrainRunEvent {
    run_id: String,
    name: Option<String>,
    job_id: Option<String>,
    status: Option<String>,
    status_detail: Option<String>,
    started_ns: Option<i64>,
    ended_ns: Option<i64>,
    framework_versions: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
struct TrainAttemptEvent {
    run_id: String,
    attempt_id: String,
    status: Option<String>,
    status_detail: Option<String>,
    started_ns: Option<i64>,
    ended_ns: Option<i64>,
    workers: Vec<TrainWorker>,
}

/// One Ray Train worker of an attempt.
#[derive(Debug, Clone, Serialize)]
struct TrainWorker {
    world_rank: Option<i64>,
    local_rank: Option<i64>,
    node_rank: Option<i64>,
    actor_id: Option<String>,
    node_id: Option<String>,
    node_ip: Option<String>,
    pid: Option<i64>,
    status: Option<String>,
    gpu_ids: Vec<i64>,
}

/// A member under its camelCase or snake_case name.
fn get<'a>(v: &'a Value, camel: &str, snake: &str) -> Option<&'a Value> {
    let o = v.as_object()?;
    o.get(camel).or_else(|| o.get(snake))
}

/// A non-empty string member, bounded.
fn get_str(v: &Value, camel: &str, snake: &str) -> Option<String> {
    get(v, camel, snake)?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(|s| bounded(s, MAX_FIELD_BYTES))
}

/// An integer member; Ray writes 64-bit integers as strings.
fn get_i64(v: &Value, camel: &str, snake: &str) -> Option<i64> {
    match get(v, camel, snake)? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// An id member as lower-case hex (Ray sends base64); kept as sent if it is neither.
fn get_id(v: &Value, camel: &str, snake: &str) -> Option<String> {
    let raw = get(v, camel, snake)?.as_str().filter(|s| !s.is_empty())?;
    Some(match contract::id_to_hex(raw) {
        Ok(hex) => hex.as_str().to_string(),
        Err(_) => bounded(raw, MAX_FIELD_BYTES),
    })
}

fn get_time(v: &Value, camel: &str, snake: &str) -> Option<i64> {
    get(v, camel, snake)?.as_str().and_then(parse_time_ns)
}

/// A nanosecond count written as a string or number; 0 means unset.
fn get_ns(v: &Value, key: &str) -> Option<i64> {
    get_i64(v, key, key).filter(|n| *n > 0)
}

/// A millisecond count (Ray's export events), as nanoseconds; 0 means unset.
fn get_ms_as_ns(v: &Value, key: &str) -> Option<i64> {
    get_i64(v, key, key)
        .filter(|n| *n > 0)
        .and_then(|ms| ms.checked_mul(1_000_000))
}

fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s[..cut].to_string()
}

fn transitions(v: &Value) -> Vec<(&Value, Transition)> {
    get(v, "stateTransitions", "state_transitions")
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .filter_map(|t| {
                    let state = get_str(t, "state", "state")?;
                    Some((
                        t,
                        Transition {
                            state,
                            time_ns: get_time(t, "timestamp", "timestamp"),
                        },
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Reason and message of an actor's death cause, whichever context Ray filled in.
fn death_cause(cause: Option<&Value>) -> (Option<String>, Option<String>) {
    let Some(context) = cause
        .and_then(Value::as_object)
        .and_then(|o| o.values().find(|v| v.is_object()))
    else {
        return (None, None);
    };
    (
        get_str(context, "reason", "reason"),
        get_str(context, "errorMessage", "error_message")
            .map(|m| bounded(&m, MAX_ERROR_MESSAGE_BYTES)),
    )
}

/// A function name from a `FunctionDescriptor`, whichever language.
fn function_name(descriptor: Option<&Value>) -> Option<String> {
    let d = descriptor?.as_object()?.values().find(|v| v.is_object())?;
    get_str(d, "functionName", "function_name")
}

fn resources(v: Option<&Value>) -> Option<BTreeMap<String, f64>> {
    let o = v?.as_object()?;
    Some(
        o.iter()
            .filter_map(|(k, v)| Some((bounded(k, MAX_FIELD_BYTES), v.as_f64()?)))
            .collect(),
    )
}

/// One RayEvent (the HTTP export's JSON), camelCase or snake_case.
fn extract_ray_event(v: &Value, seq: u64) -> Option<Fact> {
    let event_type = get_str(v, "eventType", "event_type")?;
    let payload = |camel: &str, snake: &str| get(v, camel, snake).filter(|p| p.is_object());
    let body = match event_type.as_str() {
        "TASK_DEFINITION_EVENT" => payload("taskDefinitionEvent", "task_definition_event")
            .and_then(|p| {
                Some(Body::TaskDefinition {
                    task: task_key(p)?,
                    job_id: get_id(p, "jobId", "job_id"),
                    name: get_str(p, "taskName", "task_name")
                        .or_else(|| function_name(get(p, "taskFunc", "task_func"))),
                    task_type: get_str(p, "taskType", "task_type"),
                })
            }),
        "ACTOR_TASK_DEFINITION_EVENT" => {
            payload("actorTaskDefinitionEvent", "actor_task_definition_event").and_then(|p| {
                Some(Body::TaskDefinition {
                    task: task_key(p)?,
                    job_id: get_id(p, "jobId", "job_id"),
                    name: get_str(p, "actorTaskName", "actor_task_name")
                        .or_else(|| function_name(get(p, "actorFunc", "actor_func"))),
                    task_type: Some("ACTOR_TASK".into()),
                })
            })
        }
        "TASK_LIFECYCLE_EVENT" => {
            payload("taskLifecycleEvent", "task_lifecycle_event").and_then(|p| {
                let error = get(p, "rayErrorInfo", "ray_error_info")
                    .filter(|e| e.is_object())
                    .map(|e| {
                        (
                            get_str(e, "errorType", "error_type"),
                            get(e, "errorMessage", "error_message")
                                .and_then(Value::as_str)
                                .map(|m| bounded(m, MAX_ERROR_MESSAGE_BYTES)),
                        )
                    });
                Some(Body::TaskLifecycle(Box::new(TaskLifecycle {
                    task: task_key(p)?,
                    job_id: get_id(p, "jobId", "job_id"),
                    transitions: transitions(p).into_iter().map(|(_, t)| t).collect(),
                    error,
                    node_id: get_id(p, "nodeId", "node_id"),
                    worker_id: get_id(p, "workerId", "worker_id"),
                })))
            })
        }
        "DRIVER_JOB_DEFINITION_EVENT" => {
            payload("driverJobDefinitionEvent", "driver_job_definition_event").and_then(|p| {
                Some(Body::DriverJobDefinition {
                    job_id: get_id(p, "jobId", "job_id")?,
                    entrypoint: get_str(p, "entrypoint", "entrypoint"),
                    driver_pid: get_i64(p, "driverPid", "driver_pid"),
                    driver_node_id: get_id(p, "driverNodeId", "driver_node_id"),
                })
            })
        }
        "DRIVER_JOB_LIFECYCLE_EVENT" => {
            payload("driverJobLifecycleEvent", "driver_job_lifecycle_event").and_then(|p| {
                Some(Body::DriverJobLifecycle {
                    job_id: get_id(p, "jobId", "job_id")?,
                    transitions: transitions(p).into_iter().map(|(_, t)| t).collect(),
                })
            })
        }
        "NODE_DEFINITION_EVENT" => payload("nodeDefinitionEvent", "node_definition_event")
            .and_then(|p| {
                Some(Body::NodeDefinition {
                    node_id: get_id(p, "nodeId", "node_id")?,
                    ip: get_str(p, "nodeIpAddress", "node_ip_address"),
                    hostname: get_str(p, "hostname", "hostname"),
                    started_ns: get_time(p, "startTimestamp", "start_timestamp"),
                })
            }),
        "NODE_LIFECYCLE_EVENT" => {
            payload("nodeLifecycleEvent", "node_lifecycle_event").and_then(|p| {
                Some(Body::NodeLifecycle {
                    node_id: get_id(p, "nodeId", "node_id")?,
                    transitions: transitions(p)
                        .into_iter()
                        .map(|(raw, state)| {
                            let death = get(raw, "deathInfo", "death_info");
                            NodeTransition {
                                state,
                                resources: resources(get(raw, "resources", "resources")),
                                death_reason: death.and_then(|d| get_str(d, "reason", "reason")),
                                death_message: death
                                    .and_then(|d| get_str(d, "reasonMessage", "reason_message")),
                            }
                        })
                        .collect(),
                })
            })
        }
        "ACTOR_DEFINITION_EVENT" => payload("actorDefinitionEvent", "actor_definition_event")
            .and_then(|p| {
                Some(Body::ActorDefinition {
                    actor_id: get_id(p, "actorId", "actor_id")?,
                    job_id: get_id(p, "jobId", "job_id"),
                    class_name: get_str(p, "className", "class_name"),
                    name: get_str(p, "name", "name"),
                })
            }),
        "ACTOR_LIFECYCLE_EVENT" => payload("actorLifecycleEvent", "actor_lifecycle_event")
            .and_then(|p| {
                Some(Body::ActorLifecycle {
                    actor_id: get_id(p, "actorId", "actor_id")?,
                    transitions: transitions(p)
                        .into_iter()
                        .map(|(raw, state)| {
                            let (death_reason, death_message) =
                                death_cause(get(raw, "deathCause", "death_cause"));
                            ActorTransition {
                                state,
                                node_id: get_id(raw, "nodeId", "node_id"),
                                pid: get_i64(raw, "pid", "pid").filter(|p| *p > 0),
                                death_reason,
                                death_message,
                            }
                        })
                        .collect(),
                })
            }),
        _ => None,
    }
    .unwrap_or(Body::Other);
    Some(Fact {
        event_id: get_str(v, "eventId", "event_id").map(|id| format!("e:{id}")),
        event_type,
        time_ns: get_time(v, "timestamp", "timestamp"),
        seq,
        body,
    })
}

fn task_key(p: &Value) -> Option<TaskKey> {
    Some(TaskKey {
        task_id: get_id(p, "taskId", "task_id")?,
        attempt: get_i64(p, "taskAttempt", "task_attempt").unwrap_or(0),
    })
}

/// One line of Ray's file-based export events (`event_EXPORT_*.log`), always snake_case.
fn extract_export_event(v: &Value, seq: u64) -> Option<Fact> {
    let source_type = get_str(v, "source_type", "sourceType")?;
    let data = get(v, "event_data", "eventData").filter(|d| d.is_object())?;
    let time_ns =
        get_i64(v, "timestamp", "timestamp").and_then(|s| s.checked_mul(NANOS_PER_SECOND));
    let body = match source_type.as_str() {
        "EXPORT_TRAIN_RUN" => get_str(data, "id", "id").map(|run_id| {
            Body::TrainRun(Box::new(TrainRunEvent {
                run_id,
                name: get_str(data, "name", "name"),
                job_id: get_id(data, "job_id", "jobId"),
                status: get_str(data, "status", "status"),
                status_detail: get_str(data, "status_detail", "statusDetail"),
                started_ns: get_ns(data, "start_time_ns"),
                ended_ns: get_ns(data, "end_time_ns"),
                framework_versions: get(data, "framework_versions", "frameworkVersions")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .filter_map(|(k, v)| {
                                Some((
                                    bounded(k, MAX_FIELD_BYTES),
                                    bounded(v.as_str()?, MAX_FIELD_BYTES),
                                ))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }))
        }),
        "EXPORT_TRAIN_RUN_ATTEMPT" => {
            match (
                get_str(data, "run_id", "runId"),
                get_str(data, "attempt_id", "attemptId"),
            ) {
                (Some(run_id), Some(attempt_id)) => {
                    Some(Body::TrainRunAttempt(Box::new(TrainAttemptEvent {
                        run_id,
                        attempt_id,
                        status: get_str(data, "status", "status"),
                        status_detail: get_str(data, "status_detail", "statusDetail"),
                        started_ns: get_ns(data, "start_time_ns"),
                        ended_ns: get_ns(data, "end_time_ns"),
                        workers: get(data, "workers", "workers")
                            .and_then(Value::as_array)
                            .map(|ws| {
                                ws.iter()
                                    .filter(|w| w.is_object())
                                    .map(train_worker)
                                    .collect()
                            })
                            .unwrap_or_default(),
                    })))
                }
                _ => None,
            }
        }
        "EXPORT_DRIVER_JOB" => {
            get_id(data, "job_id", "jobId").map(|job_id| Body::ExportDriverJob {
                job_id,
                entrypoint: get_str(data, "entrypoint", "entrypoint"),
                is_dead: get(data, "is_dead", "isDead")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                started_ns: get_ms_as_ns(data, "start_time"),
                ended_ns: get_ms_as_ns(data, "end_time"),
                driver_pid: get_i64(data, "driver_pid", "driverPid"),
            })
        }
        "EXPORT_ACTOR" => get_id(data, "actor_id", "actorId").map(|actor_id| {
            let (death_reason, death_message) = death_cause(get(data, "death_cause", "deathCause"));
            Body::ExportActor {
                actor_id,
                job_id: get_id(data, "job_id", "jobId"),
                class_name: get_str(data, "class_name", "className"),
                name: get_str(data, "name", "name"),
                transition: ActorTransition {
                    state: Transition {
                        state: get_str(data, "state", "state").unwrap_or_else(|| "UNKNOWN".into()),
                        time_ns,
                    },
                    node_id: get_id(data, "node_id", "nodeId"),
                    pid: get_i64(data, "pid", "pid").filter(|p| *p > 0),
                    death_reason,
                    death_message,
                },
            }
        }),
        "EXPORT_NODE" => get_id(data, "node_id", "nodeId").map(|node_id| {
            let death = get(data, "death_info", "deathInfo");
            Body::ExportNode {
                node_id,
                ip: get_str(data, "node_manager_address", "nodeManagerAddress"),
                is_head: get(data, "is_head_node", "isHeadNode").and_then(Value::as_bool),
                started_ns: get_ms_as_ns(data, "start_time_ms"),
                transition: NodeTransition {
                    state: Transition {
                        state: get_str(data, "state", "state").unwrap_or_else(|| "UNKNOWN".into()),
                        time_ns: get_ms_as_ns(data, "end_time_ms")
                            .filter(|_| get_str(data, "state", "state").as_deref() == Some("DEAD"))
                            .or(time_ns),
                    },
                    resources: resources(get(data, "resources_total", "resourcesTotal")),
                    death_reason: death.and_then(|d| get_str(d, "reason", "reason")),
                    death_message: death
                        .and_then(|d| get_str(d, "reason_message", "reasonMessage")),
                },
            }
        }),
        _ => None,
    }
    .unwrap_or(Body::Other);
    Some(Fact {
        event_id: get_str(v, "event_id", "eventId").map(|id| format!("x:{id}")),
        event_type: source_type,
        time_ns,
        seq,
        body,
    })
}

fn train_worker(w: &Value) -> TrainWorker {
    TrainWorker {
        world_rank: get_i64(w, "world_rank", "worldRank"),
        local_rank: get_i64(w, "local_rank", "localRank"),
        node_rank: get_i64(w, "node_rank", "nodeRank"),
        actor_id: get_id(w, "actor_id", "actorId"),
        node_id: get_id(w, "node_id", "nodeId"),
        node_ip: get_str(w, "node_ip", "nodeIp"),
        pid: get_i64(w, "pid", "pid"),
        status: get_str(w, "status", "status"),
        gpu_ids: get(w, "gpu_ids", "gpuIds")
            .and_then(Value::as_array)
            .map(|ids| ids.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default(),
    }
}

// ------------------------------------------------------------------------------ merging

/// Rank of a state within its entity's enum, to break timestamp ties toward the later state.
fn state_rank(state: &str) -> u8 {
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
fn transition_order(t: &Transition) -> (i64, u8) {
    (t.time_ns.unwrap_or(i64::MIN), state_rank(&t.state))
}

/// Keeps `slot` at the later of itself and `t`.
fn keep_latest<T: Clone>(slot: &mut Option<(Transition, T)>, t: &Transition, extra: &T) {
    if slot
        .as_ref()
        .is_none_or(|(cur, _)| transition_order(t) > transition_order(cur))
    {
        *slot = Some((t.clone(), extra.clone()));
    }
}

/// Sets `slot` if it is empty.
fn fill<T>(slot: &mut Option<T>, value: Option<T>) {
    if slot.is_none() {
        *slot = value;
    }
}

#[derive(Debug, Default)]
struct NodeModel {
    ip: Option<String>,
    hostname: Option<String>,
    is_head: Option<bool>,
    /// The node's own start time (definition event, export event).
    started_ns: Option<i64>,
    /// The first ALIVE transition, when no start time was given.
    alive_ns: Option<i64>,
    latest: Option<(Transition, NodeTransition)>,
    resources: Option<BTreeMap<String, f64>>,
    ended_ns: Option<i64>,
    objects: u64,
    bytes: u64,
    log_objects: u64,
    log_bytes: u64,
}

#[derive(Debug, Default)]
struct JobModel {
    entrypoint: Option<String>,
    driver_pid: Option<i64>,
    driver_node_id: Option<String>,
    transitions: HashSet<Transition>,
    export: Option<(bool, Option<i64>, Option<i64>)>,
}

#[derive(Debug, Default)]
struct TaskModel {
    job_id: Option<String>,
    name: Option<String>,
    task_type: Option<String>,
    latest: Option<(Transition, ())>,
    failed_at: Option<i64>,
    error_type: Option<String>,
    error_message: Option<String>,
    node_id: Option<String>,
    worker_id: Option<String>,
}

#[derive(Debug, Default)]
struct ActorModel {
    job_id: Option<String>,
    class_name: Option<String>,
    name: Option<String>,
    latest: Option<(Transition, ActorTransition)>,
    node_id: Option<String>,
    pid: Option<i64>,
}

/// A status report of a Train run or attempt, ordered by (time, object, position).
#[derive(Debug, Clone)]
struct StatusPoint {
    order: (i64, usize, u64),
    status: String,
    detail: Option<String>,
}

#[derive(Debug, Default)]
struct TrainRunModel {
    latest: Option<((i64, usize, u64), TrainRunEvent)>,
    started_ns: Option<i64>,
    ended_ns: Option<i64>,
    history: Vec<StatusPoint>,
}

#[derive(Debug, Default)]
struct TrainAttemptModel {
    latest: Option<((i64, usize, u64), TrainAttemptEvent)>,
    started_ns: Option<i64>,
    ended_ns: Option<i64>,
    history: Vec<StatusPoint>,
    workers: Option<((i64, usize, u64), Vec<TrainWorker>)>,
}

/// Everything learned about a session, merged from all objects read.
#[derive(Debug, Default)]
struct SessionModel {
    job_filter: Option<String>,
    seen_event_ids: HashSet<String>,
    total: u64,
    duplicates: u64,
    other_job: u64,
    by_type: BTreeMap<String, u64>,
    nodes: BTreeMap<String, NodeModel>,
    jobs: BTreeMap<String, JobModel>,
    tasks: HashMap<TaskKey, TaskModel>,
    actors: BTreeMap<String, ActorModel>,
    runs: BTreeMap<String, TrainRunModel>,
    attempts: BTreeMap<(String, String), TrainAttemptModel>,
}

impl SessionModel {
    /// Takes one fact of object number `object` (objects are numbered in hour order).
    fn absorb(&mut self, object: usize, fact: Fact) {
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

fn absorb_node_transition(n: &mut NodeModel, t: NodeTransition) {
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

fn absorb_actor_transition(a: &mut ActorModel, t: ActorTransition) {
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

/// Sorts status reports and keeps each change of status once.
fn status_history(mut points: Vec<StatusPoint>) -> Vec<StatusEntry> {
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

// ------------------------------------------------------------------------------ session report

/// Output of `inspect --session`.
#[derive(Debug, Serialize)]
struct SessionReport {
    storage: String,
    cluster: ClusterIdentity,
    session: String,
    started: Option<String>,
    filter: FilterEcho,
    objects: ObjectStats,
    events: EventStats,
    nodes: Vec<NodeEntry>,
    jobs: Vec<JobEntry>,
    tasks: TaskCounts,
    failed_tasks_total: u64,
    failed_tasks: Vec<FailedTaskEntry>,
    actors: Vec<ActorEntry>,
    train_runs: Vec<TrainRunEntry>,
    problems: Problems,
}

#[derive(Debug, Serialize)]
struct ClusterIdentity {
    kind: String,
    namespace: String,
    owner: Option<String>,
    cluster: String,
    history_prefix: String,
}

#[derive(Debug, Serialize)]
struct FilterEcho {
    job: Option<String>,
    since: Option<String>,
    until: Option<String>,
}

#[derive(Debug, Default, Serialize)]
struct ObjectStats {
    event_objects_listed: u64,
    read: u64,
    skipped_by_time: u64,
    bytes_read: u64,
    not_event_objects: u64,
}

#[derive(Debug, Default, Serialize)]
struct EventStats {
    total: u64,
    duplicates: u64,
    outside_time_window: u64,
    other_job: u64,
    by_type: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
struct NodeEntry {
    node_id: String,
    ip: Option<String>,
    hostname: Option<String>,
    is_head: Option<bool>,
    state: Option<String>,
    started: Option<String>,
    ended: Option<String>,
    death_reason: Option<String>,
    death_message: Option<String>,
    resources: BTreeMap<String, f64>,
    objects: u64,
    bytes: u64,
    log_objects: u64,
    log_bytes: u64,
}

#[derive(Debug, Serialize)]
struct JobEntry {
    job_id: String,
    status: String,
    entrypoint: Option<String>,
    driver_pid: Option<i64>,
    driver_node_id: Option<String>,
    started: Option<String>,
    ended: Option<String>,
    tasks: TaskCounts,
    #[serde(skip)]
    duration_ns: Option<i64>,
    #[serde(skip)]
    failed: u64,
}

#[derive(Debug, Default, Serialize)]
struct TaskCounts {
    total: u64,
    by_state: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
struct FailedTaskEntry {
    task_id: String,
    attempt: i64,
    name: Option<String>,
    job_id: Option<String>,
    task_type: Option<String>,
    failed_at: Option<String>,
    error_type: Option<String>,
    error_message: Option<String>,
    node_id: Option<String>,
    worker_id: Option<String>,
}

#[derive(Debug, Serialize)]
struct ActorEntry {
    actor_id: String,
    class_name: Option<String>,
    name: Option<String>,
    job_id: Option<String>,
    state: Option<String>,
    node_id: Option<String>,
    pid: Option<i64>,
    death_reason: Option<String>,
    death_message: Option<String>,
}

#[derive(Debug, Serialize)]
struct StatusEntry {
    status: String,
    time: Option<String>,
    detail: Option<String>,
}

#[derive(Debug, Serialize)]
struct TrainRunEntry {
    run_id: String,
    name: Option<String>,
    job_id: Option<String>,
    status: Option<String>,
    status_detail: Option<String>,
    started: Option<String>,
    ended: Option<String>,
    framework_versions: BTreeMap<String, String>,
    status_history: Vec<StatusEntry>,
    attempts: Vec<TrainAttemptEntry>,
    #[serde(skip)]
    duration_ns: Option<i64>,
}

#[derive(Debug, Serialize)]
struct TrainAttemptEntry {
    attempt_id: String,
    status: Option<String>,
    status_detail: Option<String>,
    started: Option<String>,
    ended: Option<String>,
    status_history: Vec<StatusEntry>,
    workers: Vec<TrainWorker>,
}

/// Objects and lines that could not be used, with a sample of why.
#[derive(Debug, Default, Serialize)]
struct Problems {
    unreadable_objects: u64,
    bad_lines: u64,
    details: Vec<ProblemDetail>,
}

#[derive(Debug, Serialize)]
struct ProblemDetail {
    key: String,
    error: String,
}

impl Problems {
    fn unreadable(&mut self, key: &str, error: &str) {
        self.unreadable_objects += 1;
        self.note(key, error);
    }

    fn note(&mut self, key: &str, error: &str) {
        if self.details.len() < MAX_PROBLEM_DETAILS {
            self.details.push(ProblemDetail {
                key: key.to_string(),
                error: error.to_string(),
            });
        }
    }

    fn is_empty(&self) -> bool {
        self.unreadable_objects == 0 && self.bad_lines == 0 && self.details.is_empty()
    }
}

/// Walks, reads and merges one session, then shapes the report.
async fn session_report(
    store: &Arc<dyn ObjectStore>,
    spec: &StorageSpec,
    (cluster, session): (ClusterId, String),
    filter: &Filter,
    failed_limit: usize,
) -> SessionReport {
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
                    (name != FETCHED_ENDPOINTS_DIR).then_some((p, name))
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
    let mut model = SessionModel {
        job_filter: filter.job.clone(),
        ..Default::default()
    };
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
                if job != EXPORT_NODE_PARTITION && filter.job.as_ref().is_none_or(|j| j == job) {
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
    let window = filter.window;
    let mut readouts = futures::stream::iter(objects.iter().enumerate())
        .map(|(i, object)| async move { (i, read_object(store, object, window).await) })
        .buffered(READ_CONCURRENCY);
    let mut outside_window = 0;
    while let Some((i, readout)) = readouts.next().await {
        let object = &objects[i];
        stats.read += 1;
        stats.bytes_read += readout.bytes;
        let node = model.nodes.entry(object.node.clone()).or_default();
        node.objects += 1;
        node.bytes += object.size;
        if let Some(failure) = &readout.failure {
            problems.unreadable(object.path.as_ref(), failure);
        }
        let extraction = readout.extraction;
        if extraction.bad_lines > 0 {
            problems.bad_lines += extraction.bad_lines;
            problems.note(
                object.path.as_ref(),
                &format!(
                    "{} bad line(s); first: {}",
                    extraction.bad_lines,
                    extraction.first_bad_line.as_deref().unwrap_or("?")
                ),
            );
        }
        outside_window += extraction.outside_window;
        for fact in extraction.facts {
            model.absorb(i, fact);
        }
    }

    let mut report = SessionReport {
        storage: spec.to_string(),
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
        actors: Vec::new(),
        train_runs: Vec::new(),
        problems,
    };
    shape_report(&mut report, model, failed_limit);
    report
}

/// Turns the merged model into report entries.
fn shape_report(report: &mut SessionReport, model: SessionModel, failed_limit: usize) {
    let SessionModel {
        job_filter,
        nodes,
        mut jobs,
        tasks,
        actors,
        runs,
        attempts,
        ..
    } = model;

    report.nodes = nodes
        .into_iter()
        .map(|(node_id, n)| {
            let latest = n.latest.as_ref().map(|(_, t)| t);
            NodeEntry {
                node_id,
                ip: n.ip,
                hostname: n.hostname,
                is_head: n.is_head,
                state: latest.map(|t| t.state.state.clone()),
                started: n.started_ns.or(n.alive_ns).map(format_time_json),
                ended: n.ended_ns.map(format_time_json),
                death_reason: latest.and_then(|t| t.death_reason.clone()),
                death_message: latest.and_then(|t| t.death_message.clone()),
                resources: n.resources.unwrap_or_default(),
                objects: n.objects,
                bytes: n.bytes,
                log_objects: n.log_objects,
                log_bytes: n.log_bytes,
            }
        })
        .collect();

    // Tasks: counts overall and per job; failed attempts.
    let mut per_job: BTreeMap<String, TaskCounts> = BTreeMap::new();
    let mut failed = Vec::new();
    for (key, t) in tasks {
        if let (Some(want), Some(job)) = (&job_filter, &t.job_id) {
            if want != job {
                continue;
            }
        }
        let state = t
            .latest
            .as_ref()
            .map(|(tr, _)| tr.state.clone())
            .unwrap_or_else(|| "UNKNOWN".into());
        report.tasks.total += 1;
        *report.tasks.by_state.entry(state.clone()).or_default() += 1;
        if let Some(job) = &t.job_id {
            if job_filter.as_ref().is_none_or(|j| j == job) {
                jobs.entry(job.clone()).or_default();
            }
            let counts = per_job.entry(job.clone()).or_default();
            counts.total += 1;
            *counts.by_state.entry(state.clone()).or_default() += 1;
        }
        if state == "FAILED" {
            failed.push((t.failed_at, key, t));
        }
    }
    failed.sort_by(|a, b| (a.0.unwrap_or(i64::MAX), &a.1).cmp(&(b.0.unwrap_or(i64::MAX), &b.1)));
    report.failed_tasks_total = failed.len() as u64;
    report.failed_tasks = failed
        .into_iter()
        .take(failed_limit)
        .map(|(at, key, t)| FailedTaskEntry {
            task_id: key.task_id,
            attempt: key.attempt,
            name: t.name,
            job_id: t.job_id,
            task_type: t.task_type,
            failed_at: at.map(format_time_json),
            error_type: t.error_type,
            error_message: t.error_message,
            node_id: t.node_id,
            worker_id: t.worker_id,
        })
        .collect();

    report.jobs = jobs
        .into_iter()
        .filter(|(id, _)| job_filter.as_ref().is_none_or(|j| j == id))
        .map(|(job_id, j)| {
            let latest = j.transitions.iter().max_by_key(|t| transition_order(t));
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
            let (export_dead, export_start, export_end) = j.export.unwrap_or((false, None, None));
            let status = match (latest, &j.export) {
                (Some(t), _) => t.state.clone(),
                (None, Some(_)) if export_dead => "FINISHED".into(),
                (None, Some(_)) => "CREATED".into(),
                (None, None) => "UNKNOWN".into(),
            };
            let started = created.or(export_start);
            let ended = finished.or(export_end);
            let tasks = per_job.remove(&job_id).unwrap_or_default();
            JobEntry {
                failed: tasks.by_state.get("FAILED").copied().unwrap_or(0),
                duration_ns: started.zip(ended).and_then(|(s, e)| e.checked_sub(s)),
                job_id,
                status,
                entrypoint: j.entrypoint,
                driver_pid: j.driver_pid,
                driver_node_id: j.driver_node_id,
                started: started.map(format_time_json),
                ended: ended.map(format_time_json),
                tasks,
            }
        })
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
                state: latest.map(|t| t.state.state.clone()),
                node_id: a.node_id,
                pid: a.pid,
                death_reason: latest.and_then(|t| t.death_reason.clone()),
                death_message: latest.and_then(|t| t.death_message.clone()),
                actor_id,
            }
        })
        .filter(|a| {
            job_filter
                .as_ref()
                .is_none_or(|j| a.job_id.as_deref().is_none_or(|aj| aj == j))
        })
        .collect();

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
                    TrainAttemptEntry {
                        attempt_id,
                        status: latest.as_ref().and_then(|e| e.status.clone()),
                        status_detail: latest.as_ref().and_then(|e| e.status_detail.clone()),
                        started: a.started_ns.map(format_time_json),
                        ended: a.ended_ns.map(format_time_json),
                        status_history: status_history(a.history),
                        workers: {
                            let mut w = a.workers.map(|(_, w)| w).unwrap_or_default();
                            w.sort_by_key(|w| w.world_rank);
                            w
                        },
                    }
                })
                .collect();
            run_attempts
                .sort_by(|a, b| (&a.started, &a.attempt_id).cmp(&(&b.started, &b.attempt_id)));
            TrainRunEntry {
                name: latest.as_ref().and_then(|e| e.name.clone()),
                job_id: latest.as_ref().and_then(|e| e.job_id.clone()),
                status: latest.as_ref().and_then(|e| e.status.clone()),
                status_detail: latest.as_ref().and_then(|e| e.status_detail.clone()),
                started: r.started_ns.map(format_time_json),
                ended: r.ended_ns.map(format_time_json),
                duration_ns: r
                    .started_ns
                    .zip(r.ended_ns)
                    .and_then(|(s, e)| e.checked_sub(s)),
                framework_versions: latest.map(|e| e.framework_versions).unwrap_or_default(),
                status_history: status_history(r.history),
                attempts: run_attempts,
                run_id,
            }
        })
        .collect();
    entries.sort_by(|a, b| (&a.started, &a.run_id).cmp(&(&b.started, &b.run_id)));
    report.train_runs = entries;
}

// ------------------------------------------------------------------------------ formatting

/// RFC 3339 UTC with as many fractional digits as needed (0, 3, 6 or 9), like protobuf.
fn format_time_json(ns: i64) -> String {
    let seconds = ns.div_euclid(NANOS_PER_SECOND);
    let fraction = ns.rem_euclid(NANOS_PER_SECOND);
    let base = crate::util::time::format_rfc3339(seconds);
    let base = base.trim_end_matches('Z');
    if fraction == 0 {
        format!("{base}Z")
    } else if fraction % 1_000_000 == 0 {
        format!("{base}.{:03}Z", fraction / 1_000_000)
    } else if fraction % 1_000 == 0 {
        format!("{base}.{:06}Z", fraction / 1_000)
    } else {
        format!("{base}.{fraction:09}Z")
    }
}

/// `YYYY-MM-DD HH:MM:SS.mmm` (UTC), for tables.
fn format_time_text(rfc3339: &str) -> String {
    let Some(ns) = parse_time_ns(rfc3339) else {
        return clean(rfc3339);
    };
    let seconds = ns.div_euclid(NANOS_PER_SECOND);
    let millis = ns.rem_euclid(NANOS_PER_SECOND) / 1_000_000;
    let base = crate::util::time::format_rfc3339(seconds).replace('T', " ");
    format!("{}.{millis:03}", base.trim_end_matches('Z'))
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn human_duration(ns: i64) -> String {
    if ns < 0 {
        return "-".into();
    }
    let ms = ns / 1_000_000;
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let s = ms as f64 / 1000.0;
    if s < 60.0 {
        return format!("{s:.1}s");
    }
    let total = ms / 1000;
    let (h, m, sec) = (total / 3600, total % 3600 / 60, total % 60);
    if h > 0 {
        format!("{h}h{m:02}m")
    } else {
        format!("{m}m{sec:02}s")
    }
}

/// Makes untrusted text safe for a terminal: drops ANSI escape sequences, turns other
/// control characters (line breaks included) into spaces, bounds the length.
fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_CELL_CHARS * 4));
    let mut chars = s.chars().peekable();
    let mut count = 0;
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte; other escapes: ESC + one char.
            if chars.peek() == Some(&'[') {
                chars.next();
                for n in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&n) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
            continue;
        }
        let c = if c.is_control() { ' ' } else { c };
        if count == MAX_CELL_CHARS {
            out.push('…');
            break;
        }
        out.push(c);
        count += 1;
    }
    out
}

/// The line of an error message that says what happened: its last non-empty line
/// (`RuntimeError: boom` at the end of a Python traceback).
fn error_summary(message: &str) -> String {
    let stripped = clean_multiline(message);
    stripped
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(clean)
        .unwrap_or_default()
}

/// Like [`clean`] but keeps line breaks and the whole length.
fn clean_multiline(s: &str) -> String {
    s.split('\n')
        .map(|line| {
            let mut out = String::new();
            let mut chars = line.chars().peekable();
            while let Some(c) = chars.next() {
                if c == '\u{1b}' {
                    if chars.peek() == Some(&'[') {
                        chars.next();
                        for n in chars.by_ref() {
                            if ('\u{40}'..='\u{7e}').contains(&n) {
                                break;
                            }
                        }
                    } else {
                        chars.next();
                    }
                    continue;
                }
                out.push(if c.is_control() { ' ' } else { c });
            }
            out
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn opt(s: &Option<String>) -> String {
    s.as_deref().map(clean).unwrap_or_else(|| "-".into())
}

fn opt_time(s: &Option<String>) -> String {
    s.as_deref()
        .map(format_time_text)
        .unwrap_or_else(|| "-".into())
}

/// A text table: columns as wide as their widest cell, two spaces apart; numbers right-aligned.
struct Table {
    headers: Vec<&'static str>,
    right_aligned: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns named `headers`; a header starting with '>' is right-aligned (the '>' is not
    /// printed).
    fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.trim_start_matches('>')).collect(),
            right_aligned: headers.iter().map(|h| h.starts_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; cells are cleaned of control characters here.
    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells.iter().map(|c| clean(c)).collect());
    }

    fn render(&self, indent: &str, out: &mut String) {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let headers: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&headers).chain(&self.rows) {
            let mut line = String::from(indent);
            for (i, width) in widths.iter().enumerate() {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                let pad = width.saturating_sub(cell.chars().count());
                if i > 0 {
                    line.push_str("  ");
                }
                if self.right_aligned[i] {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if i + 1 < columns {
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

fn render_list(report: &ListReport, out: &mut String) {
    let _ = writeln!(out, "storage: {}", clean(&report.storage));
    let mut table = Table::new(&[
        "KIND",
        "NAMESPACE",
        "OWNER",
        "CLUSTER",
        "SESSION",
        "STARTED (HEAD CLOCK)",
        "EVENTS FROM (UTC)",
        "EVENTS UNTIL (UTC)",
        ">NODES",
        ">OBJECTS",
        ">SIZE",
    ]);
    for c in &report.clusters {
        for s in &c.sessions {
            table.row(vec![
                c.kind.clone(),
                c.namespace.clone(),
                opt(&c.owner),
                c.cluster.clone(),
                s.session.clone(),
                s.started
                    .as_deref()
                    .map(|t| t.replace('T', " ").chars().take(19).collect())
                    .unwrap_or_else(|| "-".into()),
                opt_hour(&s.events_from),
                opt_hour(&s.events_until),
                s.nodes.to_string(),
                s.objects.to_string(),
                human_bytes(s.bytes),
            ]);
        }
    }
    let sessions: usize = report.clusters.iter().map(|c| c.sessions.len()).sum();
    let _ = writeln!(
        out,
        "{} cluster(s), {sessions} session(s)\n",
        report.clusters.len()
    );
    table.render("", out);
    render_problems(&report.problems, out);
}

fn opt_hour(s: &Option<String>) -> String {
    s.as_deref()
        .map(|t| format_time_text(t).chars().take(16).collect())
        .unwrap_or_else(|| "-".into())
}

fn render_session(r: &SessionReport, out: &mut String) {
    let c = &r.cluster;
    let _ = writeln!(out, "session   {}", clean(&r.session));
    let _ = writeln!(
        out,
        "cluster   {} {}/{}{} ({})",
        clean(&c.kind),
        clean(&c.namespace),
        c.owner
            .as_deref()
            .map(|o| format!("{}/", clean(o)))
            .unwrap_or_default(),
        clean(&c.cluster),
        clean(&r.storage)
    );
    if let Some(started) = &r.started {
        let _ = writeln!(
            out,
            "started   {} (head's clock)",
            clean(&started.replace('T', " "))
        );
    }
    let mut filters = Vec::new();
    if let Some(j) = &r.filter.job {
        filters.push(format!("job {}", clean(j)));
    }
    if let Some(s) = &r.filter.since {
        filters.push(format!("since {}", format_time_text(s)));
    }
    if let Some(u) = &r.filter.until {
        filters.push(format!("until {}", format_time_text(u)));
    }
    if !filters.is_empty() {
        let _ = writeln!(out, "filter    {}", filters.join(", "));
    }
    let o = &r.objects;
    let _ = writeln!(
        out,
        "read      {} of {} event objects ({}), {} skipped by time; {} events, {} duplicates{}",
        o.read,
        o.event_objects_listed,
        human_bytes(o.bytes_read),
        o.skipped_by_time,
        r.events.total,
        r.events.duplicates,
        if r.events.outside_time_window > 0 {
            format!(", {} outside the time window", r.events.outside_time_window)
        } else {
            String::new()
        }
    );
    let _ = writeln!(out, "times are UTC");

    let _ = writeln!(out, "\nNODES");
    let mut nodes = Table::new(&[
        "NODE ID", "IP", "HOSTNAME", "HEAD", "STATE", "STARTED", "ENDED", ">CPU", ">OBJECTS",
        ">SIZE", ">LOGS",
    ]);
    for n in &r.nodes {
        nodes.row(vec![
            n.node_id.clone(),
            opt(&n.ip),
            opt(&n.hostname),
            match n.is_head {
                Some(true) => "yes".into(),
                Some(false) => "no".into(),
                None => "-".into(),
            },
            opt(&n.state),
            opt_time(&n.started),
            opt_time(&n.ended),
            n.resources
                .get("CPU")
                .map(|c| format!("{c}"))
                .unwrap_or_else(|| "-".into()),
            n.objects.to_string(),
            human_bytes(n.bytes),
            if n.log_objects > 0 {
                format!("{} ({})", n.log_objects, human_bytes(n.log_bytes))
            } else {
                "-".into()
            },
        ]);
    }
    render_or_none(&nodes, out);

    let _ = writeln!(out, "\nJOBS");
    let mut jobs = Table::new(&[
        "JOB ID",
        "STATUS",
        "STARTED",
        "ENDED",
        ">DURATION",
        ">TASKS",
        ">FAILED",
        "ENTRYPOINT",
    ]);
    for j in &r.jobs {
        jobs.row(vec![
            j.job_id.clone(),
            j.status.clone(),
            opt_time(&j.started),
            opt_time(&j.ended),
            j.duration_ns
                .map(human_duration)
                .unwrap_or_else(|| "-".into()),
            j.tasks.total.to_string(),
            j.failed.to_string(),
            opt(&j.entrypoint),
        ]);
    }
    render_or_none(&jobs, out);

    let _ = writeln!(
        out,
        "\nTASKS BY FINAL STATE ({} task attempts)",
        r.tasks.total
    );
    let mut states = Table::new(&["STATE", ">COUNT"]);
    for (state, n) in &r.tasks.by_state {
        states.row(vec![state.clone(), n.to_string()]);
    }
    render_or_none(&states, out);

    let _ = writeln!(
        out,
        "\nFAILED TASKS ({} of {})",
        r.failed_tasks.len(),
        r.failed_tasks_total
    );
    let mut failed = Table::new(&[
        "FAILED AT",
        "TASK ID",
        ">ATTEMPT",
        "NAME",
        "JOB ID",
        "ERROR TYPE",
        "ERROR",
    ]);
    for t in &r.failed_tasks {
        failed.row(vec![
            opt_time(&t.failed_at),
            t.task_id.clone(),
            t.attempt.to_string(),
            opt(&t.name),
            opt(&t.job_id),
            opt(&t.error_type),
            t.error_message
                .as_deref()
                .map(error_summary)
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    render_or_none(&failed, out);
    if r.failed_tasks_total > r.failed_tasks.len() as u64 {
        let _ = writeln!(
            out,
            "  ({} more; raise --failed-limit to list them)",
            r.failed_tasks_total - r.failed_tasks.len() as u64
        );
    }

    let _ = writeln!(out, "\nACTORS");
    let mut actors = Table::new(&[
        "ACTOR ID", "CLASS", "NAME", "JOB ID", "STATE", ">PID", "DEATH",
    ]);
    for a in &r.actors {
        let death = match (&a.death_reason, &a.death_message) {
            (None, None) => "-".to_string(),
            (reason, message) => {
                let mut s = reason.clone().unwrap_or_default();
                if let Some(m) = message {
                    if !s.is_empty() {
                        s.push_str(": ");
                    }
                    s.push_str(&error_summary(m));
                }
                s
            }
        };
        actors.row(vec![
            a.actor_id.clone(),
            opt(&a.class_name),
            opt(&a.name),
            opt(&a.job_id),
            opt(&a.state),
            a.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            death,
        ]);
    }
    render_or_none(&actors, out);

    let _ = writeln!(out, "\nRAY TRAIN RUNS");
    let mut runs = Table::new(&[
        "RUN ID",
        "NAME",
        "JOB ID",
        "STATUS",
        "STARTED",
        "ENDED",
        ">DURATION",
        ">ATTEMPTS",
    ]);
    for run in &r.train_runs {
        runs.row(vec![
            run.run_id.clone(),
            opt(&run.name),
            opt(&run.job_id),
            opt(&run.status),
            opt_time(&run.started),
            opt_time(&run.ended),
            run.duration_ns
                .map(human_duration)
                .unwrap_or_else(|| "-".into()),
            run.attempts.len().to_string(),
        ]);
    }
    render_or_none(&runs, out);
    for run in &r.train_runs {
        let _ = writeln!(out, "\n  run {} ({})", clean(&run.run_id), opt(&run.name));
        let _ = writeln!(
            out,
            "    status history: {}",
            history_text(&run.status_history)
        );
        if let Some(detail) = &run.status_detail {
            let _ = writeln!(out, "    status detail:  {}", clean(detail));
        }
        for a in &run.attempts {
            let _ = writeln!(
                out,
                "    attempt {}: {}, {} worker(s); history: {}",
                clean(&a.attempt_id),
                opt(&a.status),
                a.workers.len(),
                history_text(&a.status_history)
            );
            if a.workers.is_empty() {
                continue;
            }
            let mut workers = Table::new(&[
                ">RANK",
                ">LOCAL RANK",
                ">NODE RANK",
                "NODE IP",
                ">PID",
                "STATUS",
                "ACTOR ID",
                "NODE ID",
            ]);
            let num = |n: Option<i64>| n.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
            for w in &a.workers {
                workers.row(vec![
                    num(w.world_rank),
                    num(w.local_rank),
                    num(w.node_rank),
                    opt(&w.node_ip),
                    num(w.pid),
                    opt(&w.status),
                    opt(&w.actor_id),
                    opt(&w.node_id),
                ]);
            }
            workers.render("      ", out);
        }
    }

    render_problems(&r.problems, out);
}

fn history_text(history: &[StatusEntry]) -> String {
    if history.is_empty() {
        return "-".into();
    }
    history
        .iter()
        .map(|s| clean(&s.status))
        .collect::<Vec<_>>()
        .join(" → ")
}

fn render_or_none(table: &Table, out: &mut String) {
    if table.rows.is_empty() {
        out.push_str("(none)\n");
    } else {
        table.render("", out);
    }
}

fn render_problems(p: &Problems, out: &mut String) {
    if p.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nPROBLEMS: {} unreadable object(s), {} bad line(s)",
        p.unreadable_objects, p.bad_lines
    );
    for d in &p.details {
        let _ = writeln!(out, "  {}: {}", clean(&d.key), clean(&d.error));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_object_names() {
        let h = Hour::parse_label("2026-11-22-02").unwrap();
        let node = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";
        for (name, n) in [
            (
                format!("{node}-2026-11-22-02-1795313302138000000.jsonl.gz"),
                Some(1795313302138000000),
            ),
            (
                format!("{node}-2026-11-22-02-1795313302138000000.jsonl"),
                Some(1795313302138000000),
            ),
            (format!("{node}-2026-11-22-02-7.gz"), Some(7)),
            (format!("{node}-2026-11-22-02"), None),
            (format!("{node}-2026-11-22-02.jsonl"), None),
            ("node-abcd-2026-11-22-02".to_string(), None),
        ] {
            assert_eq!(parse_event_object_name(&name), Some((h, n)), "{name}");
        }
        for bad in [
            "foo.txt",
            "node-abcd-2026-11-22-2",
            "2026-11-22-02",
            "x-2026-13-22-02.jsonl",
            "x-2026-11-22-02-.jsonl",
        ] {
            assert_eq!(parse_event_object_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn time_arguments() {
        let hour = |l: &str| Hour::parse_label(l).unwrap().0 * NANOS_PER_HOUR;
        assert_eq!(
            parse_time_arg("--since", "2026-11-22").unwrap(),
            (hour("2026-11-22-00"), hour("2026-11-23-00"))
        );
        assert_eq!(
            parse_time_arg("--since", "2026-11-22T02").unwrap(),
            (hour("2026-11-22-02"), hour("2026-11-22-03"))
        );
        let t = parse_time_arg("--until", "2026-11-22T02:06:40.5Z").unwrap();
        assert_eq!(
            t.0,
            hour("2026-11-22-02") + 400 * NANOS_PER_SECOND + 500_000_000
        );
        assert_eq!(t.1, t.0 + 1);
        assert!(parse_time_arg("--since", "yesterday").is_err());
        assert!(parse_time_arg("--since", "2026-11-22T2").is_err());
    }

    #[test]
    fn window_selects_hours_with_slack() {
        let h = |l: &str| Hour::parse_label(l).unwrap();
        let (since, _) = parse_time_arg("--since", "2026-11-22T05").unwrap();
        let (_, until) = parse_time_arg("--until", "2026-11-22T06").unwrap();
        let w = TimeWindow {
            since_ns: Some(since),
            until_ns: Some(until),
        };
        assert!(!w.selects_hour(h("2026-11-22-03")));
        assert!(w.selects_hour(h("2026-11-22-04")));
        assert!(w.selects_hour(h("2026-11-22-07")));
        assert!(!w.selects_hour(h("2026-11-22-08")));
        assert!(TimeWindow::default().selects_hour(h("1970-01-01-00")));
        assert!(w.contains(Some(since)));
        assert!(!w.contains(Some(until)));
        assert!(!w.contains(None));
        assert!(TimeWindow::default().contains(None));
    }

    #[test]
    fn timestamps_keep_nanoseconds() {
        let ns = parse_time_ns("2026-11-22T02:06:44.945501408Z").unwrap();
        assert_eq!(ns % NANOS_PER_SECOND, 945_501_408);
        assert_eq!(format_time_json(ns), "2026-11-22T02:06:44.945501408Z");
        let ms = parse_time_ns("2026-11-22T02:06:40.942Z").unwrap();
        assert_eq!(format_time_json(ms), "2026-11-22T02:06:40.942Z");
        assert_eq!(
            format_time_text("2026-11-22T02:06:40.942Z"),
            "2026-11-22 02:06:40.942"
        );
        assert_eq!(format_time_json(ms - 942_000_000), "2026-11-22T02:06:40Z");
    }

    #[test]
    fn session_names_and_clusters() {
        assert_eq!(
            session_started("session_2026-11-22_02-06-36_260774_21819").as_deref(),
            Some("2026-11-22T02:06:36.260774")
        );
        assert_eq!(session_started("session_latest"), None);
        assert_eq!(
            ClusterId::parse("raycluster", "default_c1")
                .unwrap()
                .display(),
            "default/c1"
        );
        assert_eq!(
            ClusterId::parse("rayjob", "ns_job_cluster-x")
                .unwrap()
                .owner
                .as_deref(),
            Some("job")
        );
        assert!(ClusterId::parse("raycluster", "a_b_c").is_none());
        assert!(ClusterId::parse("rayjob", "a_b").is_none());
        assert!(ClusterId::parse("raycluster", "A_b").is_none());
    }

    #[test]
    fn terminal_text_is_cleaned() {
        assert_eq!(clean("a\u{1b}[31mred\u{1b}[0m\nb\tc"), "ared b c");
        assert_eq!(
            error_summary(
                "User exception:\n\u{1b}[36mray::fails()\u{1b}[39m\n  File x\nRuntimeError: boom\n"
            ),
            "RuntimeError: boom"
        );
        assert_eq!(clean(&"x".repeat(500)).chars().count(), MAX_CELL_CHARS + 1);
    }

    #[test]
    fn tables_align() {
        let mut t = Table::new(&["A", ">N", "LAST"]);
        t.row(vec!["long value".into(), "7".into(), "x".into()]);
        t.row(vec!["b".into(), "1234".into(), "yy".into()]);
        let mut out = String::new();
        t.render("", &mut out);
        assert_eq!(
            out,
            "A              N  LAST\nlong value     7  x\nb           1234  yy\n"
        );
    }

    fn sink_facts(content: &[u8], chunk: usize) -> Extraction {
        let mut sink = ContentSink::new(TimeWindow::default(), CONTENT_LIMITS);
        for part in content.chunks(chunk.max(1)) {
            sink.push(part).unwrap();
        }
        sink.finish(true);
        std::mem::take(&mut sink.out)
    }

    #[test]
    fn content_layouts() {
        let line = r#"{"eventId":"a","eventType":"X","timestamp":"2026-11-22T02:00:00Z"}"#;
        let lines = format!("{line}\n\nnot json\n{}\n", line.replace("\"a\"", "\"b\""));
        for chunk in [1, 7, 4096] {
            let e = sink_facts(lines.as_bytes(), chunk);
            assert_eq!(e.facts.len(), 2, "chunk {chunk}");
            assert_eq!(e.bad_lines, 1);
        }
        let array = format!("  [{line}, {}]", line.replace("\"a\"", "\"c\""));
        let e = sink_facts(array.as_bytes(), 3);
        assert_eq!(e.facts.len(), 2);
        assert_eq!(e.bad_lines, 0);
        // A last line without a newline still counts.
        assert_eq!(sink_facts(line.as_bytes(), 5).facts.len(), 1);
    }

    #[test]
    fn snake_and_camel_read_alike() {
        let camel: Value = serde_json::from_str(
            r#"{"eventId":"x","eventType":"TASK_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:06:44.945Z",
                "taskLifecycleEvent":{"taskId":"AQID","taskAttempt":1,"jobId":"AQAAAA==",
                "stateTransitions":[{"state":"FAILED","timestamp":"2026-11-22T02:06:44.945Z"}],
                "rayErrorInfo":{"errorType":"TASK_EXECUTION_EXCEPTION","errorMessage":"boom"}}}"#,
        )
        .unwrap();
        let snake: Value = serde_json::from_str(
            r#"{"event_id":"x","event_type":"TASK_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:06:44.945Z",
                "task_lifecycle_event":{"task_id":"AQID","task_attempt":1,"job_id":"AQAAAA==",
                "state_transitions":[{"state":"FAILED","timestamp":"2026-11-22T02:06:44.945Z"}],
                "ray_error_info":{"error_type":"TASK_EXECUTION_EXCEPTION","error_message":"boom"}}}"#,
        )
        .unwrap();
        for v in [camel, snake] {
            let f = extract_ray_event(&v, 0).unwrap();
            let Body::TaskLifecycle(t) = f.body else {
                panic!("not a lifecycle: {f:?}");
            };
            assert_eq!(t.task.task_id, "010203");
            assert_eq!(t.task.attempt, 1);
            assert_eq!(t.job_id.as_deref(), Some("01000000"));
            assert_eq!(t.transitions[0].state, "FAILED");
            let (ty, msg) = t.error.unwrap();
            assert_eq!(ty.as_deref(), Some("TASK_EXECUTION_EXCEPTION"));
            assert_eq!(msg.as_deref(), Some("boom"));
        }
    }

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

    #[test]
    fn gzip_errors_are_reported() {
        let mut d = Decoder::Gzip(Box::new(flate2::write::MultiGzDecoder::new(
            ContentSink::new(TimeWindow::default(), CONTENT_LIMITS),
        )));
        assert!(d.write(b"this is not gzip at all").is_err() || d.end().is_err());
        // A truncated stream.
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(b"{\"eventType\":\"X\"}\n".repeat(100).as_slice())
            .unwrap();
        let full = enc.finish().unwrap();
        let mut d = Decoder::Gzip(Box::new(flate2::write::MultiGzDecoder::new(
            ContentSink::new(TimeWindow::default(), CONTENT_LIMITS),
        )));
        let cut = &full[..full.len() - 6];
        assert!(d.write(cut).is_err() || d.end().is_err());
    }

    #[test]
    fn limits_are_reported_as_such() {
        let small = ContentLimits {
            line: 64,
            document: 128,
            decoded: 4096,
        };
        // An over-long line is one bad line; the lines around it still count.
        let line = r#"{"eventType":"X","eventId":"a"}"#;
        let content = format!("{line}\n{}\n{}\n", "x".repeat(200), line.replace('a', "b"));
        let mut sink = ContentSink::new(TimeWindow::default(), small);
        for part in content.as_bytes().chunks(10) {
            sink.push(part).unwrap();
        }
        sink.finish(true);
        assert_eq!(sink.out.facts.len(), 2);
        assert_eq!(sink.out.bad_lines, 1);
        // Too much content behind gzip is not "bad gzip".
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&b"\n".repeat(10_000)).unwrap();
        let gz = enc.finish().unwrap();
        let mut d = Decoder::Gzip(Box::new(flate2::write::MultiGzDecoder::new(
            ContentSink::new(TimeWindow::default(), small),
        )));
        let err = d.write(&gz).and_then(|()| d.end()).unwrap_err();
        assert!(err.starts_with("more than 4.0 KiB"), "{err}");
        // A legacy array over its limit.
        let mut sink = ContentSink::new(TimeWindow::default(), small);
        assert!(sink
            .push(format!("[{}]", " ".repeat(200)).as_bytes())
            .is_err());
    }
}
