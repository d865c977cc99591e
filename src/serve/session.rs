//! The routes answered from a session's index ([`super::index`], loaded once through the
//! cache, [`super::cache`]): `/api/v0/tasks`, `/api/v0/tasks/summarize` and
//! `/api/v0/tasks/timeline`, in the shapes of KubeRay's history server; and the door every
//! route that answers from that index goes through (these, the job routes of [`super::jobs`],
//! and others): [`index`] finds the entered session's index, [`answer`] and [`headers_for`]
//! give an answer about it its JSON headers. When the load could not read every object, or met lines that
//! are not events, every answer carries [`UNREADABLE_HEADER`] (objects) and
//! [`BAD_LINES_HEADER`] (lines); a session still loading after [`LOAD_WAIT`] is a `503` with
//! [`LOADING_HEADER`].
//!
//! `/api/v0/tasks`: KubeRay's list shape, one row per task attempt, ordered by task id then
//! attempt. `limit` defaults to 100 and may not exceed 10,000 (`400`, like KubeRay);
//! `exclude_driver` defaults to true; `detail=true` adds the detail fields (those the index
//! does not hold are KubeRay's empty values, see [`super::index`]); `filter_keys`,
//! `filter_predicates` and `filter_values` are Ray's state API filters: `=` and `!=`, keys
//! lower-cased and string values compared ASCII case-insensitively as Ray does, ids given in
//! hex or in Ray's base64, on the keys of [`super::index::FILTER_KEYS`] (another key is a
//! `400`, as Ray answers; KubeRay matches nothing). `total` and `num_after_truncation` count
//! every attempt, `num_filtered` those the filters kept. Rows are valid for Ray 2.60's
//! `TaskState` (Ray's state client rejects a whole list for one row that is not): Ray's
//! default state and type where no event said them (see [`super::index`]), and
//! `runtime_env_info` an object. When objects could not be read, `partial_failure_warning`
//! says how many (Ray's client warns with it), as [`UNREADABLE_HEADER`] does.
//!
//! `/api/v0/tasks/summarize`: KubeRay's `summary_by=func_name` shape, counted over every
//! attempt the filters keep, those without a name under `""` as Ray keys them (KubeRay
//! counts only the first 10,000, in task id order, and skips those without a name).
//! `summary_by=lineage` is not served (`501`).
//!
//! `/api/v0/tasks/timeline[?job_id=&download=1]`: Chrome's trace format, as KubeRay's: one
//! `X` event per attempt whose execution the worker profiled (`task::<name>`), a process per
//! node (`Node <node id>`: the index holds no node IP) and a thread per worker. It is
//! streamed, so a session of a million attempts costs no more memory than a small one.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt as _;

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde::Serialize;
use serde_json::{json, Value};

use super::cache::{Unavailable, LOADING_HEADER, LOAD_WAIT};
use super::cookies::Entered;
use super::index::{SessionIndex, TaskFilter, TaskRecord, NO_TIME};
use super::{Shared, UNREADABLE_HEADER};
use crate::util::escape::escape_message;
use crate::util::time::parse_rfc3339_seconds;

/// Set when the load met lines that are not events: how many.
pub const BAD_LINES_HEADER: &str = "x-rhc-bad-lines";
/// KubeRay's (and Ray's State API's) default `limit`.
pub const DEFAULT_TASK_LIMIT: usize = 100;
/// KubeRay's `RayMaxLimitFromAPIServer`: a larger `limit` is a `400`.
pub const MAX_TASK_LIMIT: usize = 10_000;
/// Filters one request may carry: Ray's frontend sends one or two.
pub const MAX_FILTERS: usize = 16;
/// Timeline events formatted per chunk of the streamed answer.
const TIMELINE_CHUNK: usize = 4096;
/// Seconds a client is told to wait before asking again about a session still loading.
const RETRY_AFTER_SECS: u32 = 2;

/// The entered session's index, or the answer that says why not.
pub(super) async fn index(
    state: &Shared,
    entered: &Entered,
) -> Result<Arc<SessionIndex>, Response> {
    match state.cache.get(&state.bucket, &entered.session).await {
        Ok(index) => Ok(index),
        Err(Unavailable::Loading) => {
            let mut headers = HeaderMap::new();
            headers.insert(LOADING_HEADER, HeaderValue::from_static("true"));
            headers.insert(RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            Err(entered.refresh((
                StatusCode::SERVICE_UNAVAILABLE,
                headers,
                format!(
                    "the session is still loading after {}s; the load goes on: ask again",
                    LOAD_WAIT.as_secs()
                ),
            )))
        }
        Err(Unavailable::Failed(e)) => Err(entered.refresh((
            StatusCode::INTERNAL_SERVER_ERROR,
            escape_message(&format!("loading the session: {e}")),
        ))),
        // Review r54u D1: a 500 told a client the request failed, not to ask again.
        Err(Unavailable::Stopping) => {
            let mut headers = HeaderMap::new();
            headers.insert(RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            Err(entered.refresh((
                StatusCode::SERVICE_UNAVAILABLE,
                headers,
                "the server is stopping: ask again".to_string(),
            )))
        }
    }
}

/// The headers of an answer about `index`'s session: JSON, and what could not be read.
pub(super) fn headers_for(index: &SessionIndex) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let facts = &index.facts;
    let unreadable = facts.unreadable_objects + facts.skipped_entries;
    if unreadable > 0 {
        headers.insert(UNREADABLE_HEADER, HeaderValue::from(unreadable));
    }
    if facts.bad_lines > 0 {
        headers.insert(BAD_LINES_HEADER, HeaderValue::from(facts.bad_lines));
    }
    headers
}

/// A JSON answer about `index`'s session.
pub(super) fn answer(entered: &Entered, index: &SessionIndex, body: impl Into<Body>) -> Response {
    entered.refresh((headers_for(index), body.into()))
}

/// Unix milliseconds of an RFC 3339 UTC time with a fraction.
pub(super) fn unix_ms(t: &str) -> Option<i64> {
    let secs = parse_rfc3339_seconds(t)?;
    let frac = t
        .split_once('.')
        .map(|(_, f)| f.trim_end_matches('Z'))
        .unwrap_or("");
    let ms: i64 = format!("{frac:0<3}")
        .get(..3)
        .and_then(|d| d.parse().ok())
        .unwrap_or(0);
    Some(secs * 1000 + ms)
}

/// The list options of a request, as KubeRay's `ParseOptionsFromReq` reads them (Go's
/// `strconv` rules), with the filters still as text (they are resolved against an index).
struct ListOptions {
    limit: usize,
    detail: bool,
    exclude_driver: bool,
    filters: Vec<(String, String, String)>,
}

impl ListOptions {
    fn parse(query: Option<&str>) -> Result<ListOptions, String> {
        let mut one: HashMap<String, String> = HashMap::new();
        let (mut keys, mut predicates, mut values) = (Vec::new(), Vec::new(), Vec::new());
        for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match &*k {
                "filter_keys" => keys.push(v.into_owned()),
                "filter_predicates" => predicates.push(v.into_owned()),
                "filter_values" => values.push(v.into_owned()),
                // Go's `QueryParameter` takes the first value.
                _ => {
                    one.entry(k.into_owned()).or_insert_with(|| v.into_owned());
                }
            }
        }
        let flag = |name: &str, default: bool| match one.get(name).map(String::as_str) {
            None | Some("") => Ok(default),
            Some(v) => parse_go_bool(v).ok_or_else(|| format!("invalid {name}: {v:?}")),
        };
        let limit = match one.get("limit").map(String::as_str) {
            None | Some("") => DEFAULT_TASK_LIMIT,
            Some(l) => match l.parse::<i64>() {
                Ok(n) if n < 0 => return Err("invalid limit: cannot be negative".into()),
                Ok(n) if n as u64 > MAX_TASK_LIMIT as u64 => {
                    return Err(format!(
                        "limit cannot be greater than {MAX_TASK_LIMIT}, please use a lower limit"
                    ))
                }
                Ok(n) => n as usize,
                Err(e) => return Err(format!("invalid limit: {e}")),
            },
        };
        if keys.len() != predicates.len() || keys.len() != values.len() {
            return Err(
                "invalid filters parameter: filter_keys, filter_predicates, and \
                        filter_values must have the same length"
                    .into(),
            );
        }
        if keys.len() > MAX_FILTERS {
            return Err(format!("at most {MAX_FILTERS} filters are taken"));
        }
        let filters = keys
            .into_iter()
            .zip(predicates)
            .zip(values)
            .map(|((k, p), v)| (k, p, v))
            .collect();
        Ok(ListOptions {
            limit,
            detail: flag("detail", false)?,
            exclude_driver: flag("exclude_driver", true)?,
            filters,
        })
    }

    /// The filters against `index`: `exclude_driver` first, then each given one.
    fn resolve(&self, index: &SessionIndex) -> Result<Vec<TaskFilter>, String> {
        let mut out = Vec::new();
        if self.exclude_driver {
            out.push(TaskFilter::parse(index, "type", "!=", "DRIVER_TASK")?);
        }
        for (k, p, v) in &self.filters {
            out.push(TaskFilter::parse(index, k, p, v)?);
        }
        Ok(out)
    }
}

/// Options and the index of a task route, or its answer (a `400`, a `503`, ...).
async fn task_request(
    state: &Shared,
    entered: &Entered,
    query: Option<&str>,
) -> Result<(ListOptions, Vec<TaskFilter>, Arc<SessionIndex>), Response> {
    let bad = |m: String| entered.refresh((StatusCode::BAD_REQUEST, escape_message(&m)));
    let options = ListOptions::parse(query).map_err(bad)?;
    let index = index(state, entered).await?;
    let filters = options.resolve(&index).map_err(bad)?;
    Ok((options, filters, index))
}

fn ms(ns: i64) -> Option<i64> {
    (ns != NO_TIME).then(|| ns.div_euclid(1_000_000))
}

/// One row of the task list, in KubeRay's field names.
#[derive(Serialize)]
struct TaskJson<'a> {
    task_id: String,
    attempt_number: i32,
    name: &'a str,
    state: &'a str,
    job_id: &'a str,
    actor_id: String,
    #[serde(rename = "type")]
    task_type: &'a str,
    func_or_class_name: &'a str,
    parent_task_id: &'a str,
    node_id: &'a str,
    worker_id: &'a str,
    worker_pid: u32,
    error_type: Option<&'a str>,
    #[serde(flatten)]
    detail: Option<TaskDetailJson<'a>>,
}

/// The fields `detail=true` adds. The index holds none of language, resources, runtime
/// env, placement group, log offsets, error message or creation time: KubeRay's empty
/// values. `events` are the transitions the index keeps (first RUNNING, first FAILED, the
/// latest), in time order.
#[derive(Serialize)]
struct TaskDetailJson<'a> {
    language: &'a str,
    required_resources: Value,
    runtime_env_info: &'static serde_json::value::RawValue,
    placement_group_id: Option<&'a str>,
    events: Vec<Value>,
    task_log_info: Option<Value>,
    error_message: Option<&'a str>,
    is_debugger_paused: Option<bool>,
    call_site: Option<&'a str>,
    label_selector: Value,
    creation_time_ms: Option<i64>,
    start_time_ms: Option<i64>,
    end_time_ms: Option<i64>,
}

/// What KubeRay puts in `runtime_env_info` when the task's runtime env is empty, as the
/// object Ray's `TaskState` takes (`Optional[dict]`: KubeRay's JSON string makes Ray's state
/// client reject the whole list).
const EMPTY_RUNTIME_ENV_INFO: &str = r#"{"runtime_env_config":{"eager_install":true,"log_files":[],"setup_timeout_seconds":600},"serialized_runtime_env":""}"#;

/// [`EMPTY_RUNTIME_ENV_INFO`] as raw JSON, checked once.
fn empty_runtime_env_info() -> &'static serde_json::value::RawValue {
    static RAW: std::sync::OnceLock<Box<serde_json::value::RawValue>> = std::sync::OnceLock::new();
    RAW.get_or_init(|| {
        serde_json::value::RawValue::from_string(EMPTY_RUNTIME_ENV_INFO.to_string())
            .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned())
    })
}

fn task_json<'a>(index: &'a SessionIndex, r: &TaskRecord, detail: bool) -> TaskJson<'a> {
    let text = |s: u32| index.text(s).unwrap_or("");
    let state = text(r.state);
    let detail = detail.then(|| {
        let mut events: Vec<(i64, &str)> = Vec::new();
        for (ns, s) in [
            (r.running_ns, "RUNNING"),
            (r.failed_ns, "FAILED"),
            (r.latest_ns, state),
        ] {
            if ns != NO_TIME && !events.iter().any(|(_, e)| *e == s) {
                events.push((ns, s));
            }
        }
        events.sort();
        let terminal = matches!(state, "FINISHED" | "FAILED");
        TaskDetailJson {
            language: "",
            required_resources: json!({}),
            runtime_env_info: empty_runtime_env_info(),
            placement_group_id: None,
            events: events
                .iter()
                .map(|(ns, s)| json!({"state": s, "created_ms": ms(*ns)}))
                .collect(),
            task_log_info: None,
            error_message: None,
            is_debugger_paused: None,
            call_site: None,
            label_selector: json!({}),
            creation_time_ms: None,
            start_time_ms: ms(r.running_ns),
            end_time_ms: if terminal { ms(r.latest_ns) } else { None },
        }
    });
    TaskJson {
        task_id: r.task_id(),
        attempt_number: r.attempt,
        name: text(r.name),
        state,
        job_id: text(r.job),
        actor_id: r.actor_id(index).unwrap_or_default(),
        task_type: text(r.task_type),
        func_or_class_name: text(r.name),
        parent_task_id: "",
        node_id: text(r.node),
        worker_id: text(r.worker),
        worker_pid: r.pid,
        error_type: index.text(r.error_type),
        detail,
    }
}

/// What Ray's `partial_failure_warning` says of `index`'s session: empty when every object
/// was read, else how many could not be (the count of [`UNREADABLE_HEADER`]). Ray's state
/// client warns with it, and raises with `raise_on_missing_output=True`.
fn partial_failure_warning(index: &SessionIndex) -> String {
    let facts = &index.facts;
    let unreadable = facts.unreadable_objects + facts.skipped_entries;
    if unreadable == 0 {
        return String::new();
    }
    format!(
        "{unreadable} of the session's objects could not be read ({} unreadable, {} bucket \
         entries skipped): the tasks whose events they held are missing from this answer",
        facts.unreadable_objects, facts.skipped_entries
    )
}

/// KubeRay's list envelope around `result`, written straight to text (a 10,000-row answer
/// never becomes a tree of JSON values); `warning` is Ray's `partial_failure_warning`.
fn list_envelope<T: Serialize>(
    total: usize,
    filtered: usize,
    result: T,
    warning: &str,
) -> Result<String, serde_json::Error> {
    #[derive(Serialize)]
    struct Envelope<'w, T> {
        result: bool,
        msg: &'static str,
        data: Data<'w, T>,
    }
    #[derive(Serialize)]
    struct Data<'w, T> {
        result: Inner<'w, T>,
    }
    #[derive(Serialize)]
    struct Inner<'w, T> {
        total: usize,
        result: T,
        num_after_truncation: usize,
        num_filtered: usize,
        partial_failure_warning: &'w str,
        warnings: Option<()>,
    }
    let envelope = Envelope {
        result: true,
        msg: "",
        data: Data {
            result: Inner {
                total,
                result,
                num_after_truncation: total,
                num_filtered: filtered,
                partial_failure_warning: warning,
                warnings: None,
            },
        },
    };
    serde_json::to_string(&envelope)
}

/// The answer of a list route: its text, or a `500` that says why there is none.
fn list_answer(
    entered: &Entered,
    index: &SessionIndex,
    body: serde_json::Result<String>,
) -> Response {
    match body {
        Ok(text) => answer(entered, index, text),
        Err(e) => entered.refresh((
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("serialising the answer: {e}"),
        )),
    }
}

/// `GET /api/v0/tasks`.
pub async fn tasks(
    State(state): State<Shared>,
    entered: Entered,
    RawQuery(query): RawQuery,
) -> Response {
    let (options, filters, index) = match task_request(&state, &entered, query.as_deref()).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let mut rows = Vec::with_capacity(options.limit.min(index.tasks.len()));
    let mut filtered = 0usize;
    for r in &index.tasks {
        if filters.iter().all(|f| f.keeps(&index, r)) {
            filtered += 1;
            if rows.len() < options.limit {
                rows.push(task_json(&index, r, options.detail));
            }
        }
    }
    list_answer(
        &entered,
        &index,
        list_envelope(
            index.tasks.len(),
            filtered,
            rows,
            &partial_failure_warning(&index),
        ),
    )
}

/// The summary's key of the attempts without a name: no text has this symbol, so it reads
/// as the empty name.
const UNNAMED: u32 = u32::MAX;

/// `GET /api/v0/tasks/summarize`.
pub async fn summarize(
    State(state): State<Shared>,
    entered: Entered,
    RawQuery(query): RawQuery,
) -> Response {
    let summary_by = query
        .as_deref()
        .and_then(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .find(|(k, _)| k == "summary_by")
                .map(|(_, v)| v.into_owned())
        })
        .unwrap_or_default();
    if summary_by == "lineage" {
        return entered.refresh((
            StatusCode::NOT_IMPLEMENTED,
            "summary_by=lineage is not served yet by this server",
        ));
    }
    let (_, filters, index) = match task_request(&state, &entered, query.as_deref()).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    // name symbol → (type symbol, state symbol → count)
    let mut by_name: HashMap<u32, (u32, HashMap<u32, u64>)> = HashMap::new();
    let (mut tasks, mut actor_tasks, mut actor_scheduled, mut filtered) = (0u64, 0u64, 0u64, 0);
    for r in &index.tasks {
        if !filters.iter().all(|f| f.keeps(&index, r)) {
            continue;
        }
        filtered += 1;
        // An attempt without a name (its definition was not seen) is counted under the
        // empty name, as Ray's `to_summary_by_func_name` keys it (`name or
        // func_or_class_name`); KubeRay skips it.
        let name = if index.text(r.name).is_none_or(str::is_empty) {
            UNNAMED
        } else {
            r.name
        };
        let entry = by_name
            .entry(name)
            .or_insert_with(|| (r.task_type, HashMap::new()));
        *entry.1.entry(r.state).or_default() += 1;
        match index.text(r.task_type) {
            Some("NORMAL_TASK") => tasks += 1,
            Some("ACTOR_CREATION_TASK") => actor_scheduled += 1,
            Some("ACTOR_TASK") => actor_tasks += 1,
            _ => {}
        }
    }
    let text = |s: u32| index.text(s).unwrap_or("");
    let summary: serde_json::Map<String, Value> = by_name
        .iter()
        .map(|(name, (task_type, states))| {
            let counts: serde_json::Map<String, Value> = states
                .iter()
                .map(|(s, n)| {
                    let s = match text(*s) {
                        "" => "NIL",
                        s => s,
                    };
                    (s.to_string(), json!(n))
                })
                .collect();
            (
                text(*name).to_string(),
                json!({
                    "func_or_class_name": text(*name),
                    "type": text(*task_type),
                    "state_counts": counts,
                }),
            )
        })
        .collect();
    let result = json!({
        "node_id_to_summary": {"cluster": {
            "summary": summary,
            "total_tasks": tasks,
            "total_actor_tasks": actor_tasks,
            "total_actor_scheduled": actor_scheduled,
            "summary_by": "func_name",
        }},
    });
    list_answer(
        &entered,
        &index,
        list_envelope(
            index.tasks.len(),
            filtered,
            result,
            &partial_failure_warning(&index),
        ),
    )
}

/// `GET /api/v0/tasks/timeline[?job_id=ID&download=1]`.
pub async fn timeline(
    State(state): State<Shared>,
    entered: Entered,
    RawQuery(query): RawQuery,
) -> Response {
    let mut job_id = String::new();
    let mut download = false;
    for (k, v) in url::form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
        match &*k {
            "job_id" if job_id.is_empty() => job_id = v.into_owned(),
            "download" => download = v == "1",
            _ => {}
        }
    }
    let index = match index(&state, &entered).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let job = if job_id.is_empty() {
        None
    } else {
        match TaskFilter::parse(&index, "job_id", "=", &job_id) {
            Ok(f) => Some(f),
            Err(m) => return entered.refresh((StatusCode::BAD_REQUEST, escape_message(&m))),
        }
    };
    let keep = move |index: &SessionIndex, r: &TaskRecord| {
        r.exec_start_ns != NO_TIME
            && index.text(r.node).is_some()
            && job.as_ref().is_none_or(|f| f.keeps(index, r))
    };
    // Processes (nodes) and threads (workers), numbered in the order first met.
    let mut pids: HashMap<u32, usize> = HashMap::new();
    let mut tids: HashMap<(u32, u32), usize> = HashMap::new();
    let mut head: Vec<Value> = Vec::new();
    for r in index.tasks.iter().filter(|r| keep(&index, r)) {
        let next = pids.len();
        let pid = *pids.entry(r.node).or_insert_with(|| {
            head.push(
                json!({"name": "process_name", "pid": next, "tid": null, "ph": "M",
                "args": {"name": format!("Node {}", index.text(r.node).unwrap_or(""))}}),
            );
            next
        });
        let next = tids.len();
        tids.entry((r.node, r.worker)).or_insert_with(|| {
            head.push(
                json!({"name": "thread_name", "pid": pid, "tid": next, "ph": "M",
                "args": {"name": format!("worker:{}", index.text(r.worker).unwrap_or(""))}}),
            );
            next
        });
    }
    let mut headers = headers_for(&index);
    if download {
        let name = if job_id.is_empty() {
            "timeline.json".to_string()
        } else {
            format!(
                "timeline-{}.json",
                crate::util::escape::escape_untrusted(&job_id)
            )
        };
        let value = format!(
            "attachment; filename=\"{}\"",
            name.replace(['"', '\\'], "_")
        );
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(CONTENT_DISPOSITION, v);
        }
    }
    let first = {
        let mut s = String::from("[");
        for (i, e) in head.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&e.to_string());
        }
        s
    };
    let mut wrote_any = !head.is_empty();
    let chunks = index.tasks.len().div_ceil(TIMELINE_CHUNK);
    let body_index = index.clone();
    let events = futures::stream::iter(0..chunks).map(move |c| {
        let index = &body_index;
        let mut s = String::new();
        let end = ((c + 1) * TIMELINE_CHUNK).min(index.tasks.len());
        for r in index.tasks[c * TIMELINE_CHUNK..end]
            .iter()
            .filter(|r| keep(index, r))
        {
            let (Some(&pid), Some(&tid)) = (pids.get(&r.node), tids.get(&(r.node, r.worker)))
            else {
                continue;
            };
            let name = index.text(r.name).unwrap_or("");
            let event = json!({
                "cat": format!("task::{name}"),
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": r.exec_start_ns as f64 / 1000.0,
                "dur": (r.exec_end_ns - r.exec_start_ns) as f64 / 1000.0,
                "cname": "generic_work",
                "args": {
                    "task_id": r.task_id(),
                    "job_id": index.text(r.job).unwrap_or(""),
                    "attempt_number": r.attempt,
                    "func_or_class_name": name,
                    "actor_id": r.actor_id(index),
                    "name": name,
                },
                "ph": "X",
            });
            if wrote_any {
                s.push(',');
            }
            wrote_any = true;
            s.push_str(&event.to_string());
        }
        Ok::<_, std::convert::Infallible>(Bytes::from(s))
    });
    let body = futures::stream::once(async move { Ok(Bytes::from(first)) })
        .chain(events)
        .chain(futures::stream::once(async {
            Ok(Bytes::from_static(b"]"))
        }));
    entered.refresh((headers, Body::from_stream(body)))
}

/// Go's `strconv.ParseBool`, which KubeRay's server reads its flags with.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_flags() {
        assert_eq!(unix_ms("1970-01-01T00:00:01.5Z"), Some(1500));
        assert_eq!(unix_ms("1970-01-01T00:00:01.123456789Z"), Some(1123));
        assert_eq!(unix_ms("1970-01-01T00:00:02Z"), Some(2000));
        assert_eq!(parse_go_bool("T"), Some(true));
        assert_eq!(parse_go_bool("yes"), None);
    }
}
