//! The reader's face for callers other than the CLI (`serve` today): open a bucket the way
//! `inspect` reads it, list its session markers, choose the latest session, and fold one
//! session into its facts, handing every task attempt once to the caller. Everything here
//! reads exactly as `inspect --session` does (the same listings, bounded parallel reads,
//! decoders and fold), so both faces show the same session.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context as _;
use object_store::ObjectStore;

use super::coverage::Coverage;
use super::discover::{self, choose_session, discover, ClusterId};
use super::error::ReadError;
use super::extract::SUBMISSION_ID_KEY;
use super::filter::Filter;
use super::load::session_report;
use super::report::Problems;
use super::task::{self, TaskStore};
use super::walk::{self, EventsSignature};
use super::{local, s3};
use crate::cli::InspectArgs;
use crate::storage::{Backend, StorageSpec};

/// A bucket opened for reading, the way `inspect` reads it: a `file://` bucket by
/// `local.rs` (no links, regular files only, never created), S3 listed by `s3.rs` with
/// encoded keys, GCS and Azure by `object_store`. `serve` opens its bucket here too, so
/// both faces read the same bucket the same way.
pub struct OpenBucket {
    /// The objects.
    pub store: Arc<dyn ObjectStore>,
    /// Where they are, root included.
    pub spec: StorageSpec,
    /// Entries the listings skipped (names no key can hold, links, FIFOs, ...).
    pub(crate) skips: Arc<local::SkipLog>,
}

impl OpenBucket {
    /// How many entries the listings skipped since the last call (their names are escaped
    /// in `inspect`'s report; here only counted).
    pub fn take_skipped(&self) -> u64 {
        let (skipped, more) = self.skips.take();
        skipped.len() as u64 + more
    }
}

/// Opens `spec` for reading with the credentials `env` gives ([`OpenBucket`]).
pub fn open_bucket(
    spec: &StorageSpec,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<OpenBucket> {
    let skips = Arc::new(local::SkipLog::default());
    let store: Arc<dyn ObjectStore> = match &spec.backend {
        Backend::File(dir) => {
            // storage::open creates a missing directory; a read must not.
            if !dir.is_dir() {
                return Err(ReadError::NoSuchDirectory(dir.display().to_string()).into());
            }
            // Not object_store's LocalFileSystem: see local.rs.
            Arc::new(
                local::LocalBucket::open(dir, Arc::clone(&skips))
                    .with_context(|| format!("opening {}", dir.display()))?,
            )
        }
        Backend::S3 { .. } => {
            let configured = crate::storage::configure(spec, env)
                .with_context(|| format!("opening storage {spec}"))?;
            let appender = configured
                .appender()
                .with_context(|| format!("opening storage {spec}"))?;
            let store = configured
                .open()
                .with_context(|| format!("opening storage {spec}"))?;
            match appender {
                // Listed by s3.rs, with encoded keys; read by object_store.
                Some(crate::storage::append::Appender::S3(wire)) => {
                    Arc::new(s3::S3Bucket::new(store, wire, Arc::clone(&skips)))
                }
                _ => store,
            }
        }
        _ => crate::storage::open(spec, env).with_context(|| format!("opening storage {spec}"))?,
    };
    Ok(OpenBucket {
        store,
        spec: spec.clone(),
        skips,
    })
}

/// One session marker: a session of a cluster, as the reader's discovery found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionMarker {
    /// `raycluster`, `rayjob` or `rayservice`.
    pub kind: String,
    /// The Kubernetes namespace.
    pub namespace: String,
    /// The RayJob or RayService, if any.
    pub owner: Option<String>,
    /// The RayCluster.
    pub cluster: String,
    /// `session_...`.
    pub session: String,
}

impl SessionMarker {
    /// `[<root>/]cluster-history/<kind>/<ns>/[<owner>/]<cluster>`: where its sessions are.
    pub fn history_prefix(&self, root: &str) -> String {
        self.cluster_id().layout(root).history_prefix()
    }

    /// `[<root>/]cluster-metadata/<kind>/<ns>_[<owner>_]<cluster>/<session>`: its marker.
    pub fn marker_key(&self, root: &str) -> String {
        self.cluster_id()
            .layout(root)
            .session_marker_key(&self.session)
    }

    fn cluster_id(&self) -> ClusterId {
        ClusterId {
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            owner: self.owner.clone(),
            cluster: self.cluster.clone(),
        }
    }
}

/// `inspect`'s arguments with no filter: what [`discover`] and [`Filter`] read for a whole
/// bucket.
fn unfiltered_args(storage: &str) -> InspectArgs {
    InspectArgs {
        storage: storage.to_string(),
        storage_root_dir: String::new(),
        cluster: None,
        namespace: None,
        session: None,
        job: None,
        since: None,
        until: None,
        json: false,
        failed_limit: 0,
        pending_after: std::time::Duration::from_secs(60),
        logs: None,
        tail: None,
        err: false,
        timeline: None,
        html: None,
        train_run: None,
        compare_runs: None,
        compare_storage: None,
    }
}

/// Every session marker under `[<root>/]cluster-metadata/`, found as `inspect` finds them
/// (names that are not a cluster's or a session's are skipped). A bucket without any marker
/// is an empty list, not an error; a bucket that cannot be listed is.
pub async fn session_markers(bucket: &OpenBucket) -> anyhow::Result<Vec<SessionMarker>> {
    let args = unfiltered_args(&bucket.spec.to_string());
    let found = match discover(&bucket.store, &bucket.spec, &args).await {
        Ok(f) => f,
        Err(e) => match e.downcast_ref::<ReadError>() {
            Some(ReadError::NoMarkers { .. }) => return Ok(Vec::new()),
            _ => return Err(e),
        },
    };
    Ok(found
        .clusters
        .into_iter()
        .flat_map(|(id, sessions)| {
            sessions.into_iter().map(move |session| SessionMarker {
                kind: id.kind.clone(),
                namespace: id.namespace.clone(),
                owner: id.owner.clone(),
                cluster: id.cluster.clone(),
                session,
            })
        })
        .collect())
}

/// Of `candidates`, the session `inspect --session latest` takes: the newest by the time in
/// its name that holds at least one object (a marker alone is passed over), else the newest.
pub async fn latest_session(
    bucket: &OpenBucket,
    candidates: &[SessionMarker],
) -> Option<SessionMarker> {
    let mut clusters: std::collections::BTreeMap<ClusterId, Vec<String>> = Default::default();
    for m in candidates {
        clusters
            .entry(m.cluster_id())
            .or_default()
            .push(m.session.clone());
    }
    let found = discover::Discovered {
        clusters,
        problems: Problems::default(),
    };
    let ((id, session), _) = choose_session(&bucket.store, &bucket.spec, &found, "latest")
        .await
        .ok()?;
    Some(SessionMarker {
        kind: id.kind,
        namespace: id.namespace,
        owner: id.owner,
        cluster: id.cluster,
        session,
    })
}

/// One task attempt as the fold left it, lent to `serve`'s index builder: ids and names as
/// the fold holds them (interned), times in Unix nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct TaskView<'a> {
    /// The task id's stored form: its length in bytes, the high bit set when the text was not
    /// an id and is held as a 16-byte hash (shown `invalid-<hash>`).
    pub id_len: u8,
    pub id_bytes: &'a [u8],
    pub attempt_number: i32,
    pub name: Option<&'a str>,
    /// The latest transition's state (`UNKNOWN` when only a definition was seen).
    pub state: &'a str,
    /// Lower-case hex.
    pub job_id: Option<&'a str>,
    /// `NORMAL_TASK`, `ACTOR_TASK`, `DRIVER_TASK`, ... as Ray names it.
    pub task_type: Option<&'a str>,
    pub node_id: Option<&'a str>,
    /// The worker of its events, else the one its profile names.
    pub worker_id: Option<&'a str>,
    /// 0: unknown.
    pub worker_pid: u32,
    pub error_type: Option<&'a str>,
    /// First RUNNING, first FAILED, the latest transition, the profiled execution.
    pub running_ns: Option<i64>,
    pub failed_ns: Option<i64>,
    pub latest_ns: Option<i64>,
    pub exec_ns: Option<(i64, i64)>,
}

/// A job as the fold left it (the fields of `inspect`'s report).
#[derive(Debug, Clone)]
pub struct JobFacts {
    pub job_id: String,
    /// `CREATED`, `FINISHED` or `UNKNOWN`: the driver job's state, not the job's outcome.
    pub state: String,
    pub entrypoint: Option<String>,
    pub driver_pid: Option<i64>,
    pub driver_node_id: Option<String>,
    /// The driver's IP (`EXPORT_DRIVER_JOB`'s `driver_ip_address`).
    pub driver_ip: Option<String>,
    /// RFC 3339 UTC.
    pub started: Option<String>,
    pub ended: Option<String>,
    /// A driver job event (pushed or export) spoke of it; false for a job known only from
    /// its tasks, actors or Train runs.
    pub recorded: bool,
    /// Its config's metadata (`None` when no driver job event carried the map).
    pub metadata: Option<BTreeMap<String, String>>,
    /// Its serialized runtime env (JSON text), as its driver job events gave it.
    pub runtime_env: Option<String>,
    /// The Job Submission API's id of it: its metadata's `job_submission_id`.
    pub submission_id: Option<String>,
    /// The newest `EXPORT_SUBMISSION_JOB` record of that submission id, when the session
    /// has one and this is the submission's last driver.
    pub submission: Option<SubmissionFacts>,
    /// A later driver (higher job id) names the same submission id: an entrypoint that ran
    /// several drivers. Ray answers only a submission's last driver (its
    /// `get_driver_jobs`), so `serve` neither lists nor finds this one.
    pub superseded: bool,
}

/// A job submitted through Ray's Job Submission API, as its newest `EXPORT_SUBMISSION_JOB`
/// record gave it (Ray's `JobInfo`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubmissionFacts {
    pub submission_id: String,
    /// `PENDING`, `RUNNING`, `STOPPED`, `SUCCEEDED` or `FAILED`.
    pub status: Option<String>,
    pub entrypoint: Option<String>,
    pub message: Option<String>,
    pub error_type: Option<String>,
    /// Unix milliseconds.
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    pub metadata: Option<BTreeMap<String, String>>,
    /// The runtime env as JSON text.
    pub runtime_env: Option<String>,
    /// Lower-case hex.
    pub driver_node_id: Option<String>,
    pub driver_agent_http_address: Option<String>,
    pub driver_exit_code: Option<i64>,
}

impl From<super::extract::SubmissionJob> for SubmissionFacts {
    fn from(s: super::extract::SubmissionJob) -> Self {
        SubmissionFacts {
            submission_id: s.submission_id,
            status: s.status,
            entrypoint: s.entrypoint,
            message: s.message,
            error_type: s.error_type,
            started_ms: s.started_ms,
            ended_ms: s.ended_ms,
            metadata: s.config.metadata,
            runtime_env: s.config.runtime_env,
            driver_node_id: s.driver_node_id,
            driver_agent_http_address: s.driver_agent_http_address,
            driver_exit_code: s.driver_exit_code,
        }
    }
}

/// An actor as the fold left it (the fields of `inspect`'s report). Ids are lower-case hex.
#[derive(Debug, Clone)]
pub struct ActorFacts {
    pub actor_id: String,
    pub class_name: Option<String>,
    pub name: Option<String>,
    pub job_id: Option<String>,
    /// Ray's actor state of the latest transition (`ALIVE`, `DEAD`, ...).
    pub state: Option<String>,
    pub node_id: Option<String>,
    pub pid: Option<i64>,
    /// The worker process it lived in (found by its node and pid).
    pub worker_id: Option<String>,
    pub death_reason: Option<String>,
    pub death_message: Option<String>,
    /// First ALIVE and last DEAD transition, Unix nanoseconds.
    pub alive_ns: Option<i64>,
    pub dead_ns: Option<i64>,
}

/// A node as the fold left it (the fields of `inspect`'s report).
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub node_id: String,
    pub ip: Option<String>,
    pub hostname: Option<String>,
    pub is_head: Option<bool>,
    /// `ALIVE` or `DEAD`, the latest transition's.
    pub state: Option<String>,
    /// RFC 3339 UTC.
    pub started: Option<String>,
    pub ended: Option<String>,
    pub death_reason: Option<String>,
    pub death_message: Option<String>,
    pub resources: std::collections::BTreeMap<String, f64>,
}

/// What `serve` holds about a session besides its tasks: the reader's fold of the session,
/// and what of it could not be read. Actors and nodes are a few per worker process, not per
/// task, so they are kept as the fold gives them.
#[derive(Debug, Default)]
pub struct SessionFacts {
    pub jobs: Vec<JobFacts>,
    /// Submitted jobs no driver job of the session names (by its metadata's
    /// `job_submission_id`): one that failed or was stopped before its driver started, or
    /// whose driver's events were not read. By submission id.
    pub unmatched_submissions: Vec<SubmissionFacts>,
    /// The session's Ray Train runs, each as `inspect --train-run <id> --json` shows it (its
    /// `train_run` member: times in RFC 3339 with every digit, ids in hex, the export event's
    /// `run_settings` and other members as Ray sent them), in `inspect`'s order (by start).
    pub train_runs: Vec<serde_json::Value>,
    /// By actor id.
    pub actors: Vec<ActorFacts>,
    /// By node id.
    pub nodes: Vec<NodeFacts>,
    /// Every task attempt the fold counted.
    pub tasks_total: u64,
    /// Objects not read to their end (listing failures included).
    pub unreadable_objects: u64,
    /// Lines that were not events.
    pub bad_lines: u64,
    /// Entries of the bucket skipped (links, special files, names no key can hold).
    pub skipped_entries: u64,
    /// What of the session the read covered and missed, by key (see [`Coverage`]).
    pub coverage: Coverage,
}

/// What `marker`'s session's event objects and snapshots are now (see [`EventsSignature`]):
/// `serve` compares it with the one taken before a load to tell whether the session changed
/// since, without reading an object.
pub async fn events_signature(
    bucket: &OpenBucket,
    marker: &SessionMarker,
) -> anyhow::Result<EventsSignature> {
    let prefix = object_store::path::Path::from(format!(
        "{}/{}",
        marker.history_prefix(&bucket.spec.root),
        marker.session
    ));
    walk::events_signature(&bucket.store, &prefix)
        .await
        .map_err(|e| anyhow::anyhow!(e))
}

/// Reads and folds `marker`'s session as `inspect --session` does (every object of it,
/// bounded parallel reads, big sessions spilled to `TMPDIR`); `visit` sees every task
/// attempt once, lent (what it keeps is its own memory). Fails only when the local spill
/// files fail.
pub async fn session_facts(
    bucket: &OpenBucket,
    marker: &SessionMarker,
    visit: &mut dyn FnMut(&TaskView<'_>),
) -> anyhow::Result<SessionFacts> {
    let mut args = unfiltered_args(&bucket.spec.to_string());
    args.session = Some(marker.session.clone());
    let filter = Filter::from_args(&args)?;
    let mut total = 0u64;
    let time = |t: i64| (t != task::NO_TIME).then_some(t);
    let mut report = session_report(
        &bucket.store,
        &bucket.spec,
        (marker.cluster_id(), marker.session.clone()),
        &filter,
        0,
        TaskStore::new(None),
        &mut |key, t, symbols| {
            total += 1;
            let worker = if t.worker.is_none() {
                t.exec_worker
            } else {
                t.worker
            };
            let (id_len, id_bytes) = key.id.raw();
            visit(&TaskView {
                id_len,
                id_bytes,
                attempt_number: key.attempt,
                name: symbols.get(t.name),
                state: t.state(symbols),
                job_id: symbols.get(t.job),
                task_type: symbols.get(t.task_type),
                node_id: symbols.get(t.node),
                worker_id: symbols.get(worker),
                worker_pid: t.pid,
                error_type: t.extra.as_ref().and_then(|e| e.error_type.as_deref()),
                running_ns: time(t.running_ns),
                failed_ns: time(t.failed_ns),
                latest_ns: time(t.latest_ns),
                exec_ns: time(t.exec_start).zip(time(t.exec_end)),
            });
        },
    )
    .await?;
    report.problems.add_skips(&bucket.skips);
    let mut submissions: BTreeMap<String, SubmissionFacts> =
        std::mem::take(&mut report.submissions)
            .into_iter()
            .map(|s| (s.submission_id.clone(), SubmissionFacts::from(s)))
            .collect();
    let submission_of = |j: &super::report::JobEntry| {
        j.config
            .metadata
            .as_ref()
            .and_then(|m| m.get(SUBMISSION_ID_KEY))
            .filter(|s| !s.is_empty())
            .cloned()
    };
    // Each submission's last driver (the highest job id, as Ray's `get_driver_jobs` sorts
    // them by hex id and keeps the last): the one its record goes to.
    let mut last_driver: BTreeMap<String, &str> = BTreeMap::new();
    for j in &report.jobs {
        if let Some(s) = submission_of(j) {
            let last = last_driver.entry(s).or_insert(&j.job_id);
            if j.job_id.as_str() > *last {
                *last = &j.job_id;
            }
        }
    }
    let jobs: Vec<JobFacts> = report
        .jobs
        .iter()
        .map(|j| {
            let submission_id = submission_of(j);
            let superseded = submission_id
                .as_ref()
                .is_some_and(|s| last_driver.get(s).is_some_and(|l| *l != j.job_id));
            JobFacts {
                submission: submission_id
                    .as_ref()
                    .filter(|_| !superseded)
                    .and_then(|s| submissions.remove(s)),
                superseded,
                submission_id,
                metadata: j.config.metadata.clone(),
                runtime_env: j.config.runtime_env.clone(),
                job_id: j.job_id.clone(),
                state: j.status.clone(),
                entrypoint: j.entrypoint.clone(),
                driver_pid: j.driver_pid,
                driver_node_id: j.driver_node_id.clone(),
                driver_ip: j.driver_ip.clone(),
                started: j.started.clone(),
                ended: j.ended.clone(),
                recorded: j.recorded,
            }
        })
        .collect();
    Ok(SessionFacts {
        jobs,
        unmatched_submissions: submissions.into_values().collect(),
        train_runs: report
            .train_runs
            .iter()
            .filter_map(|r| serde_json::to_value(r).ok())
            .collect(),
        actors: report
            .actors
            .iter()
            .map(|a| ActorFacts {
                actor_id: a.actor_id.clone(),
                class_name: a.class_name.clone(),
                name: a.name.clone(),
                job_id: a.job_id.clone(),
                state: a.state.clone(),
                node_id: a.node_id.clone(),
                pid: a.pid,
                worker_id: a.worker.as_ref().map(|w| w.worker_id.clone()),
                death_reason: a.death_reason.clone(),
                death_message: a.death_message.clone(),
                alive_ns: a.alive_ns,
                dead_ns: a.dead_ns,
            })
            .collect(),
        nodes: report
            .nodes
            .iter()
            .map(|n| NodeFacts {
                node_id: n.node_id.clone(),
                ip: n.ip.clone(),
                hostname: n.hostname.clone(),
                is_head: n.is_head,
                state: n.state.clone(),
                started: n.started.clone(),
                ended: n.ended.clone(),
                death_reason: n.death_reason.clone(),
                death_message: n.death_message.clone(),
                resources: n.resources.clone(),
            })
            .collect(),
        tasks_total: total,
        unreadable_objects: report.problems.unreadable_objects,
        bad_lines: report.problems.bad_lines,
        skipped_entries: report.problems.skipped_entries,
        coverage: std::mem::take(&mut report.problems.coverage),
    })
}

/// The node directories of `marker`'s session (lower-case hex, as listed; not
/// `fetched_endpoints`).
pub async fn session_nodes(
    bucket: &OpenBucket,
    marker: &SessionMarker,
) -> anyhow::Result<Vec<String>> {
    super::logs::list_nodes(
        &bucket.store,
        &marker.history_prefix(&bucket.spec.root),
        &marker.session,
    )
    .await
}

/// The log of task `task_id` (hex) attempt `attempt` in `marker`'s session, as `inspect
/// --logs <task id>` finds it: the session's events are read again, keeping the log offsets
/// of this task only (what Ray named in `taskLogInfo`, with the attempt's byte range), else
/// the log of its worker found by id or pid on its node. Errors are [`ReadError`]s
/// (`NoSuchLogTarget`, `NoLogFor`, `LogNotUploaded`, `SeveralLogs`) or a listing's.
pub(crate) async fn task_log_target(
    bucket: &OpenBucket,
    marker: &SessionMarker,
    task_id: &str,
    attempt: i32,
    stream: crate::contract::logs::LogStream,
) -> anyhow::Result<super::logs::LogTarget> {
    let mut args = unfiltered_args(&bucket.spec.to_string());
    args.session = Some(marker.session.clone());
    let filter = Filter::from_args(&args)?;
    let nodes = session_nodes(bucket, marker).await?;
    super::logs::resolve_from_events(
        &bucket.store,
        &bucket.spec,
        (marker.cluster_id(), marker.session.clone()),
        &filter,
        task_id,
        Some(attempt),
        &nodes,
        stream,
    )
    .await
}
