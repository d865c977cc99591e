//! One JSON event → the facts the report needs (task attempts, transitions, errors, actors,
//! nodes, jobs, Train runs), from Ray's pushed events and from its file-based export events,
//! camelCase or snake_case alike. Strings from the bucket are bounded here.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::contract::{self};

use super::filter::{parse_time_ns, NANOS_PER_SECOND};
use super::limits::{MAX_ERROR_MESSAGE_BYTES, MAX_FIELD_BYTES, MAX_TRAIN_TEXT_BYTES};
use super::task::TaskDelta;
pub(super) use super::values::{bounded, bounded_middle, Transition};

/// The useful part of one event, kept compact (events themselves are dropped at once).
#[derive(Debug, Clone)]
pub(super) struct Fact {
    /// Hash of the event id ([`event_id_hash`]), for deduplication.
    pub(super) event_id: Option<u64>,
    /// Ray's known event types are static strings: no allocation per event.
    pub(super) event_type: std::borrow::Cow<'static, str>,
    pub(super) time_ns: Option<i64>,
    /// Position in its object, for ordering events of the same (whole) second.
    pub(super) seq: u64,
    pub(super) body: Body,
}

#[derive(Debug, Clone)]
pub(super) enum Body {
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
        config: JobConfig,
    },
    DriverJobLifecycle {
        job_id: String,
        transitions: Vec<Transition>,
    },
    /// Any task event: definition, lifecycle, profile or `EXPORT_TASK`.
    Task(Box<TaskDelta>),
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
        /// `driver_ip_address`: the driver's node IP as the job table has it.
        driver_ip: Option<String>,
        config: JobConfig,
    },
    /// `EXPORT_SUBMISSION_JOB`: the Job Submission API's record of a job (the job table of
    /// submitted jobs), whole at each change.
    ExportSubmissionJob(Box<SubmissionJob>),
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
    /// `WORKER_DEFINITION_EVENT`: where a worker process lives.
    WorkerDefinition {
        worker_id: String,
        node_id: Option<String>,
        pid: Option<i64>,
        worker_type: Option<String>,
    },
    /// `WORKER_LIFECYCLE_EVENT`: its transitions, the DEAD one with `deathInfo`.
    WorkerLifecycle {
        worker_id: String,
        job_id: Option<String>,
        transitions: Vec<WorkerTransition>,
    },
    /// Counted only.
    Other,
}

/// A driver job's config as its events give it (Ray's `JobConfig`): its metadata (a job
/// submitted through the Job Submission API carries its submission id there, under
/// [`SUBMISSION_ID_KEY`]) and its serialized runtime env.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct JobConfig {
    /// `None` when the event had no `metadata` map.
    pub(super) metadata: Option<BTreeMap<String, String>>,
    /// The runtime env as Ray serialized it (JSON text), at most [`MAX_RUNTIME_ENV_BYTES`].
    pub(super) runtime_env: Option<String>,
}

/// The key of a submitted job's submission id in its driver's metadata (Ray's
/// `JOB_ID_METADATA_KEY`).
pub(super) const SUBMISSION_ID_KEY: &str = "job_submission_id";

/// Most metadata entries kept per job (each key and value at most `MAX_FIELD_BYTES`): Ray's
/// are a few user-given labels.
const MAX_METADATA_ENTRIES: usize = 64;

/// Longest message of a submitted job's record kept (cut in the middle): Ray's
/// `JobInfo.message` of a failed job carries the entrypoint's last output, ~20 KB.
pub(super) const MAX_SUBMISSION_MESSAGE_BYTES: usize = 32 << 10;

/// Longest serialized runtime env kept: a longer one is replaced by a note saying so (cut
/// JSON would not read back).
pub(super) const MAX_RUNTIME_ENV_BYTES: usize = 64 << 10;

/// `EXPORT_SUBMISSION_JOB`'s `event_data` (Ray's `JobInfo` of a submitted job).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct SubmissionJob {
    pub(super) submission_id: String,
    /// `PENDING`, `RUNNING`, `STOPPED`, `SUCCEEDED` or `FAILED`.
    pub(super) status: Option<String>,
    pub(super) entrypoint: Option<String>,
    pub(super) message: Option<String>,
    pub(super) error_type: Option<String>,
    /// Unix milliseconds.
    pub(super) started_ms: Option<i64>,
    pub(super) ended_ms: Option<i64>,
    pub(super) config: JobConfig,
    pub(super) driver_node_id: Option<String>,
    pub(super) driver_agent_http_address: Option<String>,
    pub(super) driver_exit_code: Option<i64>,
}

/// A map of strings (Ray's `map<string, string>`), bounded ([`MAX_METADATA_ENTRIES`], the
/// first in key order) but always with its [`SUBMISSION_ID_KEY`] when it has one (what
/// makes a job a submitted one); `None` when the member is missing or not an object. A
/// value that is not a string is kept as its JSON text.
fn get_string_map(v: &Value, camel: &str, snake: &str) -> Option<BTreeMap<String, String>> {
    let o = get(v, camel, snake)?.as_object()?;
    let entry = |k: &str, v: &Value| {
        let v = match v {
            Value::String(s) => bounded(s, MAX_FIELD_BYTES),
            other => bounded(&other.to_string(), MAX_FIELD_BYTES),
        };
        (bounded(k, MAX_FIELD_BYTES), v)
    };
    let mut map: BTreeMap<String, String> = o
        .get(SUBMISSION_ID_KEY)
        .map(|v| entry(SUBMISSION_ID_KEY, v))
        .into_iter()
        .collect();
    // The submission id comes on top of the bound (review r36p D2: it took one of its 64).
    let bound = MAX_METADATA_ENTRIES + map.len();
    for (k, v) in o.iter().filter(|(k, _)| k.as_str() != SUBMISSION_ID_KEY) {
        if map.len() >= bound {
            break;
        }
        let (k, v) = entry(k, v);
        map.insert(k, v);
    }
    Some(map)
}

/// A serialized runtime env, kept whole up to [`MAX_RUNTIME_ENV_BYTES`]; a longer one is
/// replaced by a JSON object saying how long it was.
fn runtime_env_text(v: &Value, camel: &str, snake: &str) -> Option<String> {
    let s = get(v, camel, snake)?.as_str()?;
    Some(if s.len() <= MAX_RUNTIME_ENV_BYTES {
        s.to_string()
    } else {
        serde_json::json!({
            "rhc_not_kept": format!("a runtime env of {} bytes, over {MAX_RUNTIME_ENV_BYTES}", s.len())
        })
        .to_string()
    })
}

/// A job config as a driver job event carries it: `config.metadata` and the serialized
/// runtime env (`config.serializedRuntimeEnv` pushed, `config.runtime_env_info.
/// serialized_runtime_env` exported).
fn job_config(p: &Value) -> JobConfig {
    let Some(config) = get(p, "config", "config").filter(|c| c.is_object()) else {
        return JobConfig::default();
    };
    let runtime_env = runtime_env_text(config, "serializedRuntimeEnv", "serialized_runtime_env")
        .or_else(|| {
            get(config, "runtimeEnvInfo", "runtime_env_info").and_then(|info| {
                runtime_env_text(info, "serializedRuntimeEnv", "serialized_runtime_env")
            })
        });
    JobConfig {
        metadata: get_string_map(config, "metadata", "metadata"),
        runtime_env,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct WorkerTransition {
    pub(super) state: Transition,
    /// `deathInfo.exitType` (`SYSTEM_ERROR`, `NODE_OUT_OF_MEMORY`, `INTENDED_USER_EXIT`, ..).
    pub(super) exit_type: Option<String>,
    pub(super) exit_detail: Option<String>,
}

impl Body {
    /// The job an event belongs to, when it names one.
    pub(super) fn job_id(&self) -> Option<&str> {
        match self {
            Body::DriverJobDefinition { job_id, .. }
            | Body::DriverJobLifecycle { job_id, .. }
            | Body::ExportDriverJob { job_id, .. } => Some(job_id),
            Body::ActorDefinition { job_id, .. } | Body::ExportActor { job_id, .. } => {
                job_id.as_deref()
            }
            Body::TrainRun(r) => r.job_id.as_deref(),
            Body::WorkerLifecycle { job_id, .. } => job_id.as_deref(),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct NodeTransition {
    pub(super) state: Transition,
    pub(super) resources: Option<BTreeMap<String, f64>>,
    pub(super) death_reason: Option<String>,
    pub(super) death_message: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct ActorTransition {
    pub(super) state: Transition,
    pub(super) node_id: Option<String>,
    pub(super) pid: Option<i64>,
    pub(super) death_reason: Option<String>,
    pub(super) death_message: Option<String>,
}

#[derive(Debug, Clone)]
pub(super) struct TrainRunEvent {
    pub(super) run_id: String,
    pub(super) name: Option<String>,
    pub(super) job_id: Option<String>,
    pub(super) status: Option<String>,
    pub(super) status_detail: Option<String>,
    pub(super) started_ns: Option<i64>,
    pub(super) ended_ns: Option<i64>,
    /// As Ray sent it, whole (`{}` when absent): a value is not cut, nor dropped for not
    /// being a string (nor the whole for not being a map), so two runs whose versions differ
    /// anywhere compare different.
    pub(super) framework_versions: Value,
    /// The event's whole `event_data`, as Ray sent it: `inspect --train-run` shows every
    /// field of it, those this version does not know included.
    pub(super) data: Value,
}

#[derive(Debug, Clone)]
pub(super) struct TrainAttemptEvent {
    pub(super) run_id: String,
    pub(super) attempt_id: String,
    pub(super) status: Option<String>,
    pub(super) status_detail: Option<String>,
    pub(super) started_ns: Option<i64>,
    pub(super) ended_ns: Option<i64>,
    pub(super) workers: Vec<TrainWorker>,
    /// The event's whole `event_data`, as Ray sent it.
    pub(super) data: Value,
}

/// One Ray Train worker of an attempt.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TrainWorker {
    pub(crate) world_rank: Option<i64>,
    pub(crate) local_rank: Option<i64>,
    pub(crate) node_rank: Option<i64>,
    pub(crate) actor_id: Option<String>,
    pub(crate) node_id: Option<String>,
    pub(crate) node_ip: Option<String>,
    pub(crate) pid: Option<i64>,
    pub(crate) status: Option<String>,
    pub(crate) gpu_ids: Vec<i64>,
    /// Where Ray Train wrote the worker's own log on its node (`logs/train/...`).
    pub(crate) log_file_path: Option<String>,
    /// The worker's resources as Ray sent them (`{"resources": {"CPU": 1.0}}`).
    pub(crate) resources: Value,
    /// The inspect command that prints the log of the worker's actor (set by the report).
    pub(crate) log_command: Option<String>,
    /// Members of the worker this version does not name above, under their own names.
    pub(crate) other_fields: serde_json::Map<String, Value>,
}

/// The members of a Train worker that [`TrainWorker`] names.
const TRAIN_WORKER_FIELDS: [&str; 11] = [
    "world_rank",
    "local_rank",
    "node_rank",
    "actor_id",
    "node_id",
    "node_ip",
    "pid",
    "status",
    "gpu_ids",
    "log_file_path",
    "resources",
];

/// A member under its camelCase or snake_case name.
pub(super) fn get<'a>(v: &'a Value, camel: &str, snake: &str) -> Option<&'a Value> {
    let o = v.as_object()?;
    o.get(camel).or_else(|| o.get(snake))
}

/// A non-empty string member, bounded.
pub(super) fn get_str(v: &Value, camel: &str, snake: &str) -> Option<String> {
    get(v, camel, snake)?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(|s| bounded(s, MAX_FIELD_BYTES))
}

/// Longest worker exit detail kept: Ray's are a paragraph (the memory monitor's, with its
/// list of the biggest processes, 3.6 KiB in the end-to-end test); a session can have many
/// dead workers.
pub(super) const MAX_EXIT_DETAIL_BYTES: usize = 8 << 10;

/// A non-empty string member that may be long (a message), bounded.
pub(super) fn get_str_long(v: &Value, camel: &str, snake: &str) -> Option<String> {
    get(v, camel, snake)?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(|s| bounded(s, MAX_EXIT_DETAIL_BYTES))
}

/// A non-empty string member of a Ray Train event (a status detail, a run's name, a log
/// path), kept whole up to [`MAX_TRAIN_TEXT_BYTES`] (Ray bounds none), a longer one cut in
/// the middle with a marker ([`bounded_middle`]).
pub(super) fn get_train_text(v: &Value, camel: &str, snake: &str) -> Option<String> {
    get(v, camel, snake)?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(|s| bounded_middle(s, MAX_TRAIN_TEXT_BYTES))
}

/// An integer member; Ray writes 64-bit integers as strings.
pub(super) fn get_i64(v: &Value, camel: &str, snake: &str) -> Option<i64> {
    match get(v, camel, snake)? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// An id member as lower-case hex (Ray sends base64); kept as sent if it is neither.
pub(super) fn get_id(v: &Value, camel: &str, snake: &str) -> Option<String> {
    let raw = get(v, camel, snake)?.as_str().filter(|s| !s.is_empty())?;
    Some(match contract::id_to_hex(raw) {
        Ok(hex) => hex.as_str().to_string(),
        Err(_) => bounded(raw, MAX_FIELD_BYTES),
    })
}

pub(super) fn get_time(v: &Value, camel: &str, snake: &str) -> Option<i64> {
    get(v, camel, snake)?.as_str().and_then(parse_time_ns)
}

/// A nanosecond count written as a string or number; 0 means unset.
pub(super) fn get_ns(v: &Value, key: &str) -> Option<i64> {
    get_i64(v, key, key).filter(|n| *n > 0)
}

/// A millisecond count (Ray's export events), as nanoseconds; 0 means unset.
pub(super) fn get_ms_as_ns(v: &Value, key: &str) -> Option<i64> {
    get_i64(v, key, key)
        .filter(|n| *n > 0)
        .and_then(|ms| ms.checked_mul(1_000_000))
}

pub(super) fn transitions(v: &Value) -> Vec<(&Value, Transition)> {
    get(v, "stateTransitions", "state_transitions")
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .filter_map(|t| {
                    let state = get_str(t, "state", "state")?;
                    Some((
                        t,
                        Transition {
                            state: state.into(),
                            time_ns: get_time(t, "timestamp", "timestamp"),
                        },
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Reason and message of an actor's death cause, whichever context Ray filled in.
pub(super) fn death_cause(cause: Option<&Value>) -> (Option<String>, Option<String>) {
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

pub(super) fn resources(v: Option<&Value>) -> Option<BTreeMap<String, f64>> {
    let o = v?.as_object()?;
    Some(
        o.iter()
            .filter_map(|(k, v)| Some((bounded(k, MAX_FIELD_BYTES), v.as_f64()?)))
            .collect(),
    )
}

/// One RayEvent (the HTTP export's JSON), camelCase or snake_case.
/// The Ray event types [`extract_ray_event`] reads a body of (each of its `match` arms): any
/// other type is [`Body::Other`], which the scanner makes without a JSON tree of the line.
pub(super) const RAY_EVENT_TYPES_READ: &[&str] = &[
    "DRIVER_JOB_DEFINITION_EVENT",
    "DRIVER_JOB_LIFECYCLE_EVENT",
    "NODE_DEFINITION_EVENT",
    "NODE_LIFECYCLE_EVENT",
    "ACTOR_DEFINITION_EVENT",
    "ACTOR_LIFECYCLE_EVENT",
    "WORKER_DEFINITION_EVENT",
    "WORKER_LIFECYCLE_EVENT",
];

/// The member holding the body of a Ray event of type `event_type` (camelCase, snake_case),
/// for each type of [`RAY_EVENT_TYPES_READ`].
pub(super) fn payload_keys(event_type: &str) -> Option<(&'static str, &'static str)> {
    Some(match event_type {
        "DRIVER_JOB_DEFINITION_EVENT" => {
            ("driverJobDefinitionEvent", "driver_job_definition_event")
        }
        "DRIVER_JOB_LIFECYCLE_EVENT" => ("driverJobLifecycleEvent", "driver_job_lifecycle_event"),
        "NODE_DEFINITION_EVENT" => ("nodeDefinitionEvent", "node_definition_event"),
        "NODE_LIFECYCLE_EVENT" => ("nodeLifecycleEvent", "node_lifecycle_event"),
        "ACTOR_DEFINITION_EVENT" => ("actorDefinitionEvent", "actor_definition_event"),
        "ACTOR_LIFECYCLE_EVENT" => ("actorLifecycleEvent", "actor_lifecycle_event"),
        "WORKER_DEFINITION_EVENT" => ("workerDefinitionEvent", "worker_definition_event"),
        "WORKER_LIFECYCLE_EVENT" => ("workerLifecycleEvent", "worker_lifecycle_event"),
        _ => return None,
    })
}

/// One RayEvent: of the line's members, it reads only `eventType`, `eventId`, `timestamp`
/// and the body of the type's [`payload_keys`] (each camelCase first, then snake_case).
pub(super) fn extract_ray_event(v: &Value, seq: u64) -> Option<Fact> {
    let event_type = get_str(v, "eventType", "event_type")?;
    let payload = payload_keys(&event_type)
        .and_then(|(camel, snake)| get(v, camel, snake))
        .filter(|p| p.is_object());
    let body = match event_type.as_str() {
        "DRIVER_JOB_DEFINITION_EVENT" => payload.and_then(|p| {
            Some(Body::DriverJobDefinition {
                job_id: get_id(p, "jobId", "job_id")?,
                entrypoint: get_str(p, "entrypoint", "entrypoint"),
                driver_pid: get_i64(p, "driverPid", "driver_pid"),
                driver_node_id: get_id(p, "driverNodeId", "driver_node_id"),
                config: job_config(p),
            })
        }),
        "DRIVER_JOB_LIFECYCLE_EVENT" => payload.and_then(|p| {
            Some(Body::DriverJobLifecycle {
                job_id: get_id(p, "jobId", "job_id")?,
                transitions: transitions(p).into_iter().map(|(_, t)| t).collect(),
            })
        }),
        "NODE_DEFINITION_EVENT" => payload.and_then(|p| {
            Some(Body::NodeDefinition {
                node_id: get_id(p, "nodeId", "node_id")?,
                ip: get_str(p, "nodeIpAddress", "node_ip_address"),
                hostname: get_str(p, "hostname", "hostname"),
                started_ns: get_time(p, "startTimestamp", "start_timestamp"),
            })
        }),
        "NODE_LIFECYCLE_EVENT" => payload.and_then(|p| {
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
        }),
        "ACTOR_DEFINITION_EVENT" => payload.and_then(|p| {
            Some(Body::ActorDefinition {
                actor_id: get_id(p, "actorId", "actor_id")?,
                job_id: get_id(p, "jobId", "job_id"),
                class_name: get_str(p, "className", "class_name"),
                name: get_str(p, "name", "name"),
            })
        }),
        "ACTOR_LIFECYCLE_EVENT" => payload.and_then(|p| {
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
        "WORKER_DEFINITION_EVENT" => payload.and_then(|p| {
            Some(Body::WorkerDefinition {
                worker_id: get_id(p, "workerId", "worker_id")?,
                node_id: get_id(p, "nodeId", "node_id"),
                pid: get_i64(p, "pid", "pid").filter(|p| *p > 0),
                worker_type: get_str(p, "workerType", "worker_type"),
            })
        }),
        "WORKER_LIFECYCLE_EVENT" => payload.and_then(|p| {
            Some(Body::WorkerLifecycle {
                worker_id: get_id(p, "workerId", "worker_id")?,
                job_id: get_id(p, "jobId", "job_id"),
                transitions: transitions(p)
                    .into_iter()
                    .map(|(raw, state)| {
                        let death = get(raw, "deathInfo", "death_info");
                        WorkerTransition {
                            state,
                            exit_type: death.and_then(|d| get_str(d, "exitType", "exit_type")),
                            exit_detail: death
                                .and_then(|d| get_str_long(d, "exitDetail", "exit_detail")),
                        }
                    })
                    .collect(),
            })
        }),
        _ => None,
    }
    .unwrap_or(Body::Other);
    Some(Fact {
        event_id: get_str(v, "eventId", "event_id").map(|id| event_id_hash("e:", &id)),
        event_type: event_type.into(),
        time_ns: get_time(v, "timestamp", "timestamp"),
        seq,
        body,
    })
}

/// One line of Ray's file-based export events (`event_EXPORT_*.log`), always snake_case.
pub(super) fn extract_export_event(v: &Value, seq: u64) -> Option<Fact> {
    let source_type = get_str(v, "source_type", "sourceType")?;
    let data = get(v, "event_data", "eventData").filter(|d| d.is_object())?;
    let time_ns =
        get_i64(v, "timestamp", "timestamp").and_then(|s| s.checked_mul(NANOS_PER_SECOND));
    let body = match source_type.as_str() {
        "EXPORT_TRAIN_RUN" => get_str(data, "id", "id").map(|run_id| {
            Body::TrainRun(Box::new(TrainRunEvent {
                run_id,
                name: get_train_text(data, "name", "name"),
                job_id: get_id(data, "job_id", "jobId"),
                status: get_str(data, "status", "status"),
                status_detail: get_train_text(data, "status_detail", "statusDetail"),
                started_ns: get_ns(data, "start_time_ns"),
                ended_ns: get_ns(data, "end_time_ns"),
                framework_versions: get(data, "framework_versions", "frameworkVersions")
                    .filter(|v| !v.is_null())
                    .cloned()
                    .unwrap_or_else(|| Value::Object(Default::default())),
                data: data.clone(),
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
                        status_detail: get_train_text(data, "status_detail", "statusDetail"),
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
                        data: data.clone(),
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
                driver_ip: get_str(data, "driver_ip_address", "driverIpAddress"),
                config: job_config(data),
            })
        }
        "EXPORT_SUBMISSION_JOB" => {
            get_str(data, "submission_job_id", "submissionJobId").map(|submission_id| {
                Body::ExportSubmissionJob(Box::new(SubmissionJob {
                    submission_id,
                    status: get_str(data, "status", "status"),
                    entrypoint: get_str_long(data, "entrypoint", "entrypoint"),
                    message: get(data, "message", "message")
                        .and_then(Value::as_str)
                        .filter(|m| !m.is_empty())
                        .map(|m| bounded_middle(m, MAX_SUBMISSION_MESSAGE_BYTES)),
                    error_type: get_str(data, "error_type", "errorType"),
                    started_ms: get_i64(data, "start_time", "startTime").filter(|t| *t > 0),
                    ended_ms: get_i64(data, "end_time", "endTime").filter(|t| *t > 0),
                    config: JobConfig {
                        metadata: get_string_map(data, "metadata", "metadata"),
                        runtime_env: runtime_env_text(data, "runtime_env_json", "runtimeEnvJson"),
                    },
                    driver_node_id: get_id(data, "driver_node_id", "driverNodeId"),
                    driver_agent_http_address: get_str(
                        data,
                        "driver_agent_http_address",
                        "driverAgentHttpAddress",
                    ),
                    driver_exit_code: get_i64(data, "driver_exit_code", "driverExitCode"),
                }))
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
                        state: get_str(data, "state", "state")
                            .unwrap_or_else(|| "UNKNOWN".into())
                            .into(),
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
                        state: get_str(data, "state", "state")
                            .unwrap_or_else(|| "UNKNOWN".into())
                            .into(),
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
        event_id: get_str(v, "event_id", "eventId").map(|id| event_id_hash("x:", &id)),
        event_type: source_type.into(),
        time_ns,
        seq,
        body,
    })
}

pub(super) fn train_worker(w: &Value) -> TrainWorker {
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
        log_file_path: get_train_text(w, "log_file_path", "logFilePath"),
        resources: get(w, "resources", "resources")
            .cloned()
            .unwrap_or(Value::Null),
        log_command: None,
        other_fields: w
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(k, _)| {
                        !TRAIN_WORKER_FIELDS
                            .iter()
                            .any(|f| *f == k.as_str() || camel(f) == k.as_str())
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// `snake_case` as `camelCase` (protobuf's JSON names; `serve` names Ray's fields with it too).
pub(crate) fn camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The hash under which an event id is deduplicated; pushed and export events have ids of
/// their own kinds, kept apart by `kind`.
pub(super) fn event_id_hash(kind: &str, id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(id.as_bytes(), kind.as_bytes()[0] as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_detail(detail: &str) -> Option<String> {
        let line = serde_json::json!({
            "event_id": "e1", "timestamp": 1795313306, "source_type": "EXPORT_TRAIN_RUN",
            "event_data": {"id": "r1", "status": "ERRORED", "status_detail": detail},
        });
        match extract_export_event(&line, 0)?.body {
            Body::TrainRun(r) => r.status_detail,
            _ => None,
        }
    }

    #[test]
    fn train_details_are_kept_whole_up_to_the_safety_bound_then_cut_in_the_middle() {
        // What Ray 2.60 builds for 64 workers lost with their nodes (76,000 characters), and
        // two bytes a character up to the bound: whole.
        let ray = "[Rank 0 Error Snippet]:\nWorkerHealthCheckFailedError\n".repeat(1_500);
        assert!(ray.chars().count() > 75_000);
        assert_eq!(run_detail(&ray).as_deref(), Some(ray.as_str()));
        let whole = "é".repeat(MAX_TRAIN_TEXT_BYTES / 2);
        assert_eq!(run_detail(&whole).as_deref(), Some(whole.as_str()));
        // Past it: the start and the end kept, the cut marked with how much went.
        let long = format!(
            "first line\n{}\nRuntimeError: the last line",
            "é".repeat(MAX_TRAIN_TEXT_BYTES / 2)
        );
        let kept = run_detail(&long).unwrap();
        assert!(kept.len() < MAX_TRAIN_TEXT_BYTES + 200, "{}", kept.len());
        assert!(kept.starts_with("first line\né"));
        assert!(kept.ends_with("é\nRuntimeError: the last line"));
        let (head, rest) = kept.split_once("\n[… ").unwrap();
        let (marker, tail) = rest.split_once(" …]\n").unwrap();
        let cut = long.chars().count() - head.chars().count() - tail.chars().count();
        assert_eq!(
            marker,
            format!(
                "{cut} of {} characters cut here by ray-history-collector",
                long.chars().count()
            )
        );
        assert!(long.starts_with(head) && long.ends_with(tail));
    }

    /// The config of the driver job events of a capture's file (`posts` or export log).
    fn configs_of(path: &str, export: bool) -> Vec<JobConfig> {
        let text =
            std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let events: Vec<Value> = text
            .lines()
            .flat_map(|l| match serde_json::from_str::<Value>(l).unwrap() {
                Value::Array(a) => a,
                one => vec![one],
            })
            .collect();
        events
            .iter()
            .filter_map(|e| {
                let fact = if export {
                    extract_export_event(e, 0)
                } else {
                    extract_ray_event(e, 0)
                };
                match fact?.body {
                    Body::DriverJobDefinition { config, .. } => Some(config),
                    Body::ExportDriverJob { config, .. } => Some(config),
                    _ => None,
                }
            })
            .collect()
    }

    #[test]
    fn a_driver_jobs_config_is_read_from_rays_captures_in_both_key_styles() {
        // Ray 2.60's pushed driver definition: the serialized runtime env and an empty
        // metadata map, camelCase and snake_case alike.
        for path in [
            "tests/data/posts-camel.jsonl",
            "tests/data/posts-snake.jsonl",
        ] {
            let configs = configs_of(path, false);
            assert_eq!(configs.len(), 1, "{path}");
            assert_eq!(configs[0].metadata, Some(BTreeMap::new()), "{path}");
            let env: Value =
                serde_json::from_str(configs[0].runtime_env.as_deref().unwrap()).unwrap();
            assert_eq!(
                env,
                serde_json::json!({"env_vars": {"FOO": "bar"}}),
                "{path}"
            );
        }
        // The export file's: the runtime env under `runtime_env_info`.
        let configs = configs_of("tests/data/export_events/event_EXPORT_DRIVER_JOB.log", true);
        assert!(!configs.is_empty());
        for c in configs {
            assert_eq!(c.metadata, Some(BTreeMap::new()));
            assert_eq!(c.runtime_env.as_deref(), Some("{}"));
        }
    }

    fn submitted(data: Value) -> Option<SubmissionJob> {
        let line = serde_json::json!({"event_id": "s1", "timestamp": 1795313330,
            "source_type": "EXPORT_SUBMISSION_JOB", "event_data": data});
        match extract_export_event(&line, 0)?.body {
            Body::ExportSubmissionJob(job) => Some(*job),
            _ => None,
        }
    }

    #[test]
    fn a_submission_record_is_read_with_its_metadata_runtime_env_and_driver() {
        // Ray's `ExportSubmissionJobEventData` as its Python writer sends it (snake_case,
        // int64 as strings, the driver's node id in hex).
        let node = "3ae6595c248ad7bef1c7206bfd50b18e860d5eb167e4e068c64823a5";
        let job = submitted(serde_json::json!({
            "submission_job_id": "raysubmit_1", "status": "FAILED",
            "entrypoint": "python job.py", "message": "Job entrypoint command failed",
            "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR",
            "start_time": "1795313302000", "end_time": "1795313326000",
            "metadata": {"job_submission_id": "raysubmit_1", "owner": "ana", "n": 3},
            "runtime_env_json": "{\"pip\": [\"emoji\"]}",
            "driver_agent_http_address": "http://192.0.2.2:52365",
            "driver_node_id": node, "driver_exit_code": 1,
        }))
        .unwrap();
        assert_eq!(job.submission_id, "raysubmit_1");
        assert_eq!(job.status.as_deref(), Some("FAILED"));
        assert_eq!(job.entrypoint.as_deref(), Some("python job.py"));
        assert_eq!(
            job.message.as_deref(),
            Some("Job entrypoint command failed")
        );
        assert_eq!(
            job.error_type.as_deref(),
            Some("JOB_ENTRYPOINT_COMMAND_ERROR")
        );
        assert_eq!(
            (job.started_ms, job.ended_ms),
            (Some(1795313302000), Some(1795313326000))
        );
        let metadata = job.config.metadata.unwrap();
        assert_eq!(metadata[SUBMISSION_ID_KEY], "raysubmit_1");
        assert_eq!(metadata["owner"], "ana");
        // A value that is not a string is kept as its JSON text.
        assert_eq!(metadata["n"], "3");
        assert_eq!(
            job.config.runtime_env.as_deref(),
            Some("{\"pip\": [\"emoji\"]}")
        );
        assert_eq!(job.driver_node_id.as_deref(), Some(node));
        assert_eq!(
            job.driver_agent_http_address.as_deref(),
            Some("http://192.0.2.2:52365")
        );
        assert_eq!(job.driver_exit_code, Some(1));

        // A job not started yet: times of 0 and an empty message are not kept.
        let pending = submitted(serde_json::json!({"submission_job_id": "raysubmit_2",
            "status": "PENDING", "start_time": "0", "end_time": "0", "message": ""}))
        .unwrap();
        assert_eq!((pending.started_ms, pending.ended_ms), (None, None));
        assert_eq!((pending.message, pending.driver_node_id), (None, None));
        assert_eq!(pending.config, JobConfig::default());
        // No submission id: not a fact.
        assert!(submitted(serde_json::json!({"status": "RUNNING"})).is_none());
    }

    #[test]
    fn a_runtime_env_over_the_bound_is_replaced_by_a_note_and_metadata_is_bounded() {
        let big = format!(
            "{{\"env_vars\": {{\"A\": \"{}\"}}}}",
            "x".repeat(MAX_RUNTIME_ENV_BYTES)
        );
        let many: serde_json::Map<String, Value> = (0..1000)
            .map(|i| (format!("k{i:04}"), Value::String("v".into())))
            .collect();
        let job = submitted(serde_json::json!({"submission_job_id": "s",
            "runtime_env_json": big, "metadata": many}))
        .unwrap();
        let note: Value = serde_json::from_str(job.config.runtime_env.as_deref().unwrap()).unwrap();
        assert_eq!(
            note["rhc_not_kept"],
            format!(
                "a runtime env of {} bytes, over {MAX_RUNTIME_ENV_BYTES}",
                big.len()
            )
        );
        assert_eq!(job.config.metadata.unwrap().len(), MAX_METADATA_ENTRIES);
    }

    #[test]
    fn a_submission_id_past_the_metadata_bound_is_kept() {
        // 100 entries whose keys sort before `job_submission_id`: the id is still kept.
        let mut many: serde_json::Map<String, Value> = (0..100)
            .map(|i| (format!("a{i:03}"), Value::String("v".into())))
            .collect();
        many.insert(
            SUBMISSION_ID_KEY.into(),
            Value::String("raysubmit_1".into()),
        );
        let job = submitted(serde_json::json!({"submission_job_id": "raysubmit_1",
            "metadata": many}))
        .unwrap();
        let metadata = job.config.metadata.unwrap();
        assert_eq!(
            metadata.len(),
            MAX_METADATA_ENTRIES + 1,
            "64 labels and the id"
        );
        assert_eq!(metadata[SUBMISSION_ID_KEY], "raysubmit_1");
        assert!(metadata.contains_key("a000") && !metadata.contains_key("a099"));
        // The same in a driver's config.
        let fact = extract_export_event(
            &serde_json::json!({"event_id": "d", "timestamp": 1795313330,
                "source_type": "EXPORT_DRIVER_JOB", "event_data": {"job_id": "AQAAAA==",
                    "is_dead": false, "config": {"metadata": many}}}),
            0,
        )
        .unwrap();
        let Body::ExportDriverJob { config, .. } = fact.body else {
            panic!("not a driver job");
        };
        assert_eq!(config.metadata.unwrap()[SUBMISSION_ID_KEY], "raysubmit_1");
    }

    #[test]
    fn a_submitted_jobs_message_is_kept_up_to_32_kib() {
        // Ray's message of a failed entrypoint: its last output, ~20 KB, kept whole.
        let ray = format!(
            "Job entrypoint command failed with exit code 1, last available logs:\n{}",
            "x".repeat(20_000)
        );
        let job = submitted(serde_json::json!({"submission_job_id": "s", "message": ray})).unwrap();
        assert_eq!(job.message.as_deref(), Some(ray.as_str()));
        // A longer one is cut in the middle to the bound, both ends kept.
        let long = format!("head{}tail", "y".repeat(40_000));
        let job =
            submitted(serde_json::json!({"submission_job_id": "s", "message": long})).unwrap();
        let kept = job.message.unwrap();
        // The bound's bytes of the message, and the note saying what was cut.
        assert!(
            kept.len() <= MAX_SUBMISSION_MESSAGE_BYTES + 100,
            "{}",
            kept.len()
        );
        assert!(kept.contains("cut here by ray-history-collector"));
        assert!(
            kept.len() > MAX_SUBMISSION_MESSAGE_BYTES - 200,
            "{}",
            kept.len()
        );
        assert!(kept.starts_with("head") && kept.ends_with("tail"));
    }
}
