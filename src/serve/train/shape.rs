//! The session's Train runs in the shape of Ray's `TrainRunsResponse`, from the export events
//! as `inspect` folds them: each difference between Ray's pydantic model and the protobuf
//! export event undone ([`ray_run`]), the job as Ray's head decorates it ([`job_details`]),
//! protobuf's defaults where Ray before 2.60 sent no settings ([`unrecorded_settings`]), and
//! every member this version does not map kept under its own name.

use serde_json::{json, Map, Value};

use super::super::index::SessionIndex;
use super::super::jobs::{job_json, node_ips, NodeIps};
use super::FRAMEWORK_UNSPECIFIED;
use crate::reader::camel;
use crate::util::time::parse_rfc3339_seconds;

pub(super) fn has_run_event(run: &Value) -> bool {
    !(run["name"].is_null() && run["status"].is_null())
}

/// What an answer from the events could not say as Ray would.
#[derive(Clone, Copy, Default)]
pub(super) struct Counts {
    /// Runs left out ([`RUNS_LEFT_OUT_HEADER`]).
    pub(super) left_out: usize,
    /// Runs answered with [`unrecorded_settings`] ([`UNRECORDED_SETTINGS_HEADER`]).
    pub(super) unrecorded_settings: usize,
}

/// Ray's `TrainRunsResponse` for the session's runs, newest first, and what it could not
/// say: the runs left out of it, those known only by their attempts ([`has_run_event`]),
/// which Ray's head never lists and its model rejects ([`RUNS_LEFT_OUT_HEADER`]), and the
/// runs whose settings were not recorded ([`UNRECORDED_SETTINGS_HEADER`]).
pub(super) fn runs_response(index: &SessionIndex) -> (Value, Counts) {
    let all = &index.facts.train_runs;
    let ips = node_ips(&index.facts);
    let mut runs: Vec<Value> = all
        .iter()
        .filter(|run| has_run_event(run))
        .map(|run| {
            let job = run["job_id"]
                .as_str()
                .and_then(|id| index.facts.jobs.iter().find(|j| j.job_id == id))
                .filter(|j| j.recorded)
                .map(|j| job_details(j, &ips));
            ray_run(run, job)
        })
        .collect();
    let counts = Counts {
        left_out: all.len() - runs.len(),
        unrecorded_settings: all
            .iter()
            .filter(|run| has_run_event(run) && !run["run_settings"].is_object())
            .count(),
    };
    // Ray sorts by start time, newest first; a run without one last.
    runs.sort_by_key(|r| std::cmp::Reverse(r["start_time_ns"].as_i64()));
    (json!({ "train_runs": runs }), counts)
}

/// The job as Ray's `JobDetails`: `/api/jobs/{id}`'s shape (with the driver's node IP from
/// the session's nodes, [`job_json`]), and what the events do not say (KubeRay's empty
/// strings, and the exit code unless a submission record gave it) as Ray's `null`.
pub(super) fn job_details(j: &crate::reader::JobFacts, ips: &NodeIps<'_>) -> Value {
    let mut v = job_json(j, ips);
    if let Some(o) = v.as_object_mut() {
        for k in [
            "submission_id",
            "message",
            "error_type",
            "driver_agent_http_address",
            "driver_node_id",
        ] {
            if o.get(k).is_some_and(|x| x == "") {
                o.insert(k.into(), Value::Null);
            }
        }
        // Ray's `JobDetails` requires both (a null voids the whole answer). Ray's head reads
        // them from the job table: the entrypoint is `""` when the table has none, and a
        // driver job is `SUCCEEDED` once the table marks it dead, else `RUNNING`; a job whose
        // driver events did not say (only its definition, or only its lifecycle, was read)
        // is answered by the same rule, its end recorded or not.
        if o.get("status").is_some_and(|x| x == "") {
            let status = if j.ended.is_some() {
                "SUCCEEDED"
            } else {
                "RUNNING"
            };
            o.insert("status".into(), Value::String(status.into()));
        }
        let exit_code = j.submission.as_ref().and_then(|s| s.driver_exit_code);
        o.insert("driver_exit_code".into(), json!(exit_code));
    }
    v
}

/// The run's `framework_versions` in Ray's shape, a map of strings: a value Ray's model would
/// not take (a number, an object) is its JSON text, so it is still shown, not dropped.
pub(super) fn framework_versions(versions: &Value) -> Value {
    let Some(m) = versions.as_object() else {
        return json!({});
    };
    Value::Object(
        m.iter()
            .map(|(k, v)| {
                let text = match v {
                    Value::String(_) => v.clone(),
                    other => Value::String(other.to_string()),
                };
                (k.clone(), text)
            })
            .collect(),
    )
}

/// Unix nanoseconds of an RFC 3339 UTC time with its fraction (as `inspect` writes them, with
/// every digit the event had).
pub(super) fn unix_ns(t: &Value) -> Option<i64> {
    let t = t.as_str()?;
    let secs = parse_rfc3339_seconds(t)?;
    let frac = t
        .split_once('.')
        .map(|(_, f)| f.trim_end_matches('Z'))
        .unwrap_or("");
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ns: i64 = format!("{frac:0<9}").parse().ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(ns)
}

/// One run of `inspect`'s `train_runs` (`run`) in Ray's `DecoratedTrainRun` shape, with its
/// job (`job`, `/api/jobs/{id}`'s shape) as `job_details`.
///
/// What differs between Ray's model and `inspect`'s facts of the export event, undone here
/// (the reverse of tests/ray_train_e2e.rs's `inspect_place`):
/// - `id` is `run_id`; `start_time_ns`/`end_time_ns` are `started`/`ended` (RFC 3339 with
///   every digit) as integer nanoseconds; an attempt's `run_id` is its run's;
/// - `run_settings` ([`ray_settings`]): `scaling_config.num_workers` is the event's
///   `num_workers_fixed` (or `num_workers_range` as `[min, max]`), `data_config.datasets_to_split`
///   its `all: {}` (`"all"`) or `datasets.values`, `backend_config.framework`'s
///   `TRAINING_FRAMEWORK_UNSPECIFIED` is `null` and another value lower-case, as is
///   `checkpoint_score_order`; `checkpoint_config.num_to_keep` (the settings' one 64-bit
///   integer, which protobuf's JSON writes as a string) is a number; a map the event wraps
///   in `values` is the map; an optional member protobuf left out is `null`;
/// - a worker's `processStats` and `gpus` are Ray's live decorations: `null` and `[]`.
pub(super) fn ray_run(run: &Value, job: Option<Value>) -> Value {
    let mut out = Map::new();
    out.insert("id".into(), run["run_id"].clone());
    out.insert("name".into(), run["name"].clone());
    out.insert("job_id".into(), run["job_id"].clone());
    out.insert(
        "controller_actor_id".into(),
        run["controller_actor_id"].clone(),
    );
    out.insert("status".into(), run["status"].clone());
    out.insert("status_detail".into(), run["status_detail"].clone());
    out.insert("start_time_ns".into(), json!(unix_ns(&run["started"])));
    out.insert("end_time_ns".into(), json!(unix_ns(&run["ended"])));
    out.insert(
        "controller_log_file_path".into(),
        run["controller_log_file_path"].clone(),
    );
    out.insert(
        "framework_versions".into(),
        framework_versions(&run["framework_versions"]),
    );
    let settings = match &run["run_settings"] {
        s @ Value::Object(_) => ray_settings(s),
        _ => unrecorded_settings(),
    };
    out.insert("run_settings".into(), settings);
    let attempts: Vec<Value> = run["attempts"]
        .as_array()
        .map(|a| a.iter().map(|a| ray_attempt(&run["run_id"], a)).collect())
        .unwrap_or_default();
    out.insert("attempts".into(), Value::Array(attempts));
    out.insert("job_details".into(), job.unwrap_or(Value::Null));
    // Members of the event this version does not map, under their own names.
    if !run["ray_train_version"].is_null() {
        out.insert("ray_train_version".into(), run["ray_train_version"].clone());
    }
    keep_others(&mut out, &run["other_fields"]);
    Value::Object(out)
}

/// `others`' members that `out` does not already have.
pub(super) fn keep_others(out: &mut Map<String, Value>, others: &Value) {
    if let Some(o) = others.as_object() {
        for (k, v) in o {
            out.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
}

/// An attempt in Ray's `DecoratedTrainRunAttempt` shape.
pub(super) fn ray_attempt(run_id: &Value, a: &Value) -> Value {
    let mut out = Map::new();
    out.insert("run_id".into(), run_id.clone());
    out.insert("attempt_id".into(), a["attempt_id"].clone());
    out.insert("status".into(), a["status"].clone());
    out.insert("status_detail".into(), a["status_detail"].clone());
    out.insert("start_time_ns".into(), json!(unix_ns(&a["started"])));
    out.insert("end_time_ns".into(), json!(unix_ns(&a["ended"])));
    out.insert(
        "resources".into(),
        match &a["resources"] {
            Value::Null => json!([]),
            r => r.clone(),
        },
    );
    let workers: Vec<Value> = a["workers"]
        .as_array()
        .map(|w| w.iter().map(ray_worker).collect())
        .unwrap_or_default();
    out.insert("workers".into(), Value::Array(workers));
    keep_others(&mut out, &a["other_fields"]);
    Value::Object(out)
}

/// A worker in Ray's `DecoratedTrainWorker` shape (`inspect`'s worker less its
/// `log_command`, with Ray's live-only decorations empty).
pub(super) fn ray_worker(w: &Value) -> Value {
    let mut out = Map::new();
    for k in [
        "world_rank",
        "local_rank",
        "node_rank",
        "actor_id",
        "node_id",
        "node_ip",
        "pid",
        "gpu_ids",
        "status",
        "resources",
        "log_file_path",
    ] {
        out.insert(k.into(), w[k].clone());
    }
    // What Ray's model requires and an older Ray did not write: protobuf's default (a
    // worker's `resources` came with Ray 2.60).
    for (k, zero) in [
        ("world_rank", json!(0)),
        ("local_rank", json!(0)),
        ("node_rank", json!(0)),
        ("actor_id", json!("")),
        ("node_id", json!("")),
        ("node_ip", json!("")),
        ("pid", json!(0)),
        ("gpu_ids", json!([])),
        ("resources", json!({"resources": {}})),
    ] {
        if out.get(k).is_none_or(Value::is_null) {
            out.insert(k.into(), zero);
        }
    }
    out.insert("processStats".into(), Value::Null);
    out.insert("gpus".into(), json!([]));
    keep_others(&mut out, &w["other_fields"]);
    Value::Object(out)
}

/// Removes `snake` (or its camelCase spelling) from `o`.
pub(super) fn take(o: &mut Map<String, Value>, snake: &str) -> Option<Value> {
    o.remove(snake).or_else(|| o.remove(&camel(snake)))
}

/// `o[snake]` moved to Ray's name, `null` when protobuf left it out.
pub(super) fn optional(o: &mut Map<String, Value>, snake: &str) {
    let v = take(o, snake).unwrap_or(Value::Null);
    o.insert(snake.into(), v);
}

/// A protobuf enum member written as Ray's lower-case literal (`None`: left out).
pub(super) fn lower(o: &mut Map<String, Value>, snake: &str) {
    let v = match take(o, snake) {
        Some(Value::String(s)) => Value::String(s.to_ascii_lowercase()),
        Some(other) => other,
        None => Value::Null,
    };
    o.insert(snake.into(), v);
}

/// A 64-bit integer as Ray's model has it (a number), where protobuf's JSON wrote it as a
/// string (`"3"`); anything else as it is.
pub(super) fn int64(v: Value) -> Value {
    match &v {
        Value::String(s) => match (s.parse::<i64>(), s.parse::<u64>()) {
            (Ok(n), _) => Value::from(n),
            (_, Ok(n)) => Value::from(n),
            _ => v,
        },
        _ => v,
    }
}

/// A map the export event wraps as `{"values": {...}}` (a protobuf message around a map),
/// unwrapped.
pub(super) fn unwrap_values(v: Value) -> Value {
    match v {
        Value::Object(mut m) if m.len() == 1 && m.contains_key("values") => {
            m.remove("values").unwrap_or(Value::Null)
        }
        other => other,
    }
}

/// The `run_settings` of a run whose export event has none (Ray before 2.60 wrote none; Ray
/// 2.60's model requires them): each member as protobuf reads a message the event does not
/// hold, as [`ray_settings`] writes it (`""`, `0`, `false`, `[]`, `{}`; an optional member
/// `null`), except `checkpoint_score_order`, whose protobuf default Ray's model does not
/// accept: `"max"`, Ray's default. Such a run is counted in [`UNRECORDED_SETTINGS_HEADER`].
pub(super) fn unrecorded_settings() -> Value {
    let options = json!({"resource_limits": {}, "exclude_resources": {},
        "preserve_order": false, "actor_locality_enabled": false, "verbose_progress": false});
    json!({
        "train_loop_config": null,
        "backend_config": {"framework": null, "config": {}},
        "scaling_config": {"num_workers": 0, "use_gpu": false, "resources_per_worker": null,
            "placement_strategy": "", "accelerator_type": null, "use_tpu": false,
            "topology": null, "bundle_label_selector": null},
        "datasets": [],
        "data_config": {"datasets_to_split": [], "execution_options": null,
            "data_execution_options": {"default": options, "per_dataset_execution_options": {}},
            "enable_shard_locality": false},
        "run_config": {"name": "", "failure_config": {"max_failures": 0,
            "controller_failure_limit": 0}, "worker_runtime_env": {},
            "checkpoint_config": {"num_to_keep": null, "checkpoint_score_attribute": null,
                "checkpoint_score_order": "max"},
            "storage_path": "", "storage_filesystem": null},
    })
}

/// The export event's `run_settings` in Ray's `RunSettings` shape (see [`ray_run`]); members
/// not named here are kept as they are.
pub(super) fn ray_settings(settings: &Value) -> Value {
    let Value::Object(mut s) = settings.clone() else {
        return settings.clone();
    };
    optional(&mut s, "train_loop_config");
    if let Some(Value::Object(b)) = s.get_mut("backend_config") {
        let framework = match take(b, "framework") {
            Some(Value::String(f)) if f == FRAMEWORK_UNSPECIFIED => Value::Null,
            Some(Value::String(f)) => Value::String(f.to_ascii_lowercase()),
            Some(other) => other,
            None => Value::Null,
        };
        b.insert("framework".into(), framework);
    }
    if let Some(Value::Object(c)) = s.get_mut("scaling_config") {
        let fixed = take(c, "num_workers_fixed");
        let range = take(c, "num_workers_range");
        let workers = match (fixed, range) {
            (Some(n), _) => n,
            (None, Some(r)) => json!([r["min"], r["max"]]),
            (None, None) => Value::Null,
        };
        c.insert("num_workers".into(), workers);
        let per_worker = take(c, "resources_per_worker").map(unwrap_values);
        c.insert(
            "resources_per_worker".into(),
            per_worker.unwrap_or(Value::Null),
        );
        optional(c, "accelerator_type");
        optional(c, "topology");
        let single = take(c, "label_selector_single").map(unwrap_values);
        let list = take(c, "label_selector_list").map(unwrap_values);
        let selector = match (single, list) {
            (Some(one), _) => one,
            (None, Some(Value::Array(l))) => {
                Value::Array(l.into_iter().map(unwrap_values).collect())
            }
            (None, Some(other)) => other,
            (None, None) => Value::Null,
        };
        c.insert("bundle_label_selector".into(), selector);
    }
    if let Some(Value::Object(d)) = s.get_mut("data_config") {
        let all = take(d, "all");
        let named = take(d, "datasets").map(unwrap_values);
        let split = match (all, named) {
            (Some(_), _) => Value::from("all"),
            (None, Some(names)) => names,
            (None, None) => Value::Null,
        };
        d.insert("datasets_to_split".into(), split);
        optional(d, "execution_options");
    }
    if let Some(Value::Object(r)) = s.get_mut("run_config") {
        optional(r, "storage_filesystem");
        if let Some(Value::Object(c)) = r.get_mut("checkpoint_config") {
            lower(c, "checkpoint_score_order");
            optional(c, "num_to_keep");
            if let Some(n) = c.get_mut("num_to_keep") {
                *n = int64(n.take());
            }
            optional(c, "checkpoint_score_attribute");
        }
    }
    Value::Object(s)
}
