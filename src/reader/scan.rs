//! One JSON line → one [`Fact`], fast: task events (most of any session) are read with typed,
//! borrowing serde structs that skip what the report does not need, camelCase or snake_case
//! alike; pushed task definitions, lifecycles and profiles and file-based `EXPORT_TASK`
//! events all become one [`TaskDelta`]. The other events that are read (nodes, jobs, actors,
//! workers, Train: [`super::extract::RAY_EVENT_TYPES_READ`] and the export events) are rare:
//! a pushed worker, node or actor event the skimmer read has its body read by typed structs too
//! ([`rare`]), and the others go through the generic [`serde_json::Value`] reader of
//! [`super::extract`] (for a pushed Ray event the skimmer read, a `Value` of its id, type,
//! time and body alone, which is what that reader reads of it); an event of any other type is counted from the typed line alone (id, type, time), its members skipped
//! without being kept, so a huge line of an unknown type costs no tree.
//!
//! A line the typed structs refuse (a field given twice, an odd type, a lone surrogate
//! escape) is read again as a `Value`, and the same structs are read from it, so the fast
//! path never loses an event the generic reader would keep; a task event they still refuse
//! has a field of a type Ray does not write, and is a bad line.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use serde_json::Value;

use super::extract::{
    bounded, event_id_hash, extract_export_event, extract_ray_event, Body, Fact, Transition,
    RAY_EVENT_TYPES_READ,
};
use super::filter::{parse_time_ns, NANOS_PER_SECOND};
use super::limits::{MAX_ERROR_MESSAGE_BYTES, MAX_FIELD_BYTES};
use super::task::{AttemptKey, CompactId, LogInfo, SmallText, SpentDeltas, TaskDelta, Transitions};

mod rare;
mod skim;

/// Ray's `TaskStatus` enum by number, as `EXPORT_TASK`'s `state_ts_ns` keys name states.
const TASK_STATUS: [&str; 13] = [
    "NIL",
    "PENDING_ARGS_AVAIL",
    "PENDING_NODE_ASSIGNMENT",
    "PENDING_OBJ_STORE_MEM_AVAIL",
    "PENDING_ARGS_FETCH",
    "SUBMITTED_TO_WORKER",
    "PENDING_ACTOR_TASK_ARGS_FETCH",
    "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY",
    "RUNNING",
    "RUNNING_IN_RAY_GET",
    "RUNNING_IN_RAY_WAIT",
    "FINISHED",
    "FAILED",
];

/// The profile event that spans a task's whole execution on its worker: `task::<name>`.
const EXECUTION_EVENT_PREFIX: &str = "task::";

/// An integer Ray writes as a JSON number or (64-bit) as a string.
#[derive(Debug, Clone, Copy, Default)]
struct Int(Option<i64>);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Int, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Int;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an integer or a string holding one")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> {
                Ok(Int(Some(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
                Ok(Int(i64::try_from(v).ok()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Int, E> {
                Ok(Int(v.is_finite().then_some(v as i64)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Int, E> {
                Ok(Int(v.trim().parse().ok()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Int, E> {
                Ok(Int(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// A string that borrows from the line unless it holds escapes (then it is owned).
struct Str<'a>(Cow<'a, str>);

impl std::ops::Deref for Str<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Str<'a>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

type Text<'a> = Option<Str<'a>>;

/// One line, typed. The bodies are boxed: a line has one, and the unboxed struct (about
/// 1.7 KB) was copied several times per line on its way out of the parser.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow, default, rename = "eventType", alias = "event_type")]
    event_type: Text<'a>,
    #[serde(borrow, default, rename = "eventId", alias = "event_id")]
    event_id: Text<'a>,
    #[serde(borrow, default)]
    timestamp: Option<Stamp<'a>>,
    #[serde(borrow, default, rename = "source_type", alias = "sourceType")]
    source_type: Text<'a>,
    #[serde(borrow, default, rename = "event_data", alias = "eventData")]
    event_data: Option<Box<ExportTask<'a>>>,
    #[serde(
        borrow,
        default,
        rename = "taskDefinitionEvent",
        alias = "task_definition_event"
    )]
    task_definition: Option<Box<TaskDefinition<'a>>>,
    #[serde(
        borrow,
        default,
        rename = "actorTaskDefinitionEvent",
        alias = "actor_task_definition_event"
    )]
    actor_task_definition: Option<Box<TaskDefinition<'a>>>,
    #[serde(
        borrow,
        default,
        rename = "taskLifecycleEvent",
        alias = "task_lifecycle_event"
    )]
    task_lifecycle: Option<Box<TaskLifecycle<'a>>>,
    #[serde(
        borrow,
        default,
        rename = "taskProfileEvents",
        alias = "task_profile_events"
    )]
    task_profile: Option<Box<TaskProfile<'a>>>,
}

/// A pushed event's RFC 3339 string, or an export event's whole seconds.
enum Stamp<'a> {
    Seconds(i64),
    Text(Cow<'a, str>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Stamp<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Stamp<'a>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Stamp<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a timestamp")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Stamp<'de>, E> {
                Ok(Stamp::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Stamp<'de>, E> {
                Ok(Stamp::Text(Cow::Owned(v.to_string())))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Stamp<'de>, E> {
                Ok(Stamp::Seconds(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Stamp<'de>, E> {
                Ok(Stamp::Seconds(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Stamp<'de>, E> {
                Ok(Stamp::Seconds(v as i64))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct TaskDefinition<'a> {
    #[serde(borrow, default, rename = "taskId", alias = "task_id")]
    task_id: Text<'a>,
    #[serde(default, rename = "taskAttempt", alias = "task_attempt")]
    attempt: Int,
    #[serde(borrow, default, rename = "jobId", alias = "job_id")]
    job_id: Text<'a>,
    #[serde(
        borrow,
        default,
        rename = "taskName",
        alias = "task_name",
        alias = "actorTaskName",
        alias = "actor_task_name"
    )]
    name: Text<'a>,
    #[serde(borrow, default, rename = "taskType", alias = "task_type")]
    task_type: Text<'a>,
    #[serde(
        borrow,
        default,
        rename = "taskFunc",
        alias = "task_func",
        alias = "actorFunc",
        alias = "actor_func"
    )]
    func: Option<Functions<'a>>,
    #[serde(
        borrow,
        default,
        rename = "requiredResources",
        alias = "required_resources"
    )]
    resources: Option<BTreeMap<Cow<'a, str>, f64>>,
}

/// The longest resource text kept; what follows is not written.
const RESOURCES_TEXT_BYTES: usize = 512;

/// A resource request as text, keys sorted: `CPU: 1, GPU: 0.5` (written in a buffer kept by
/// the thread: no allocation per event). Written only until it has
/// [`RESOURCES_TEXT_BYTES`] (the text is cut there), so the buffer holds at most that plus
/// one entry: review r36za D1, a million keys in one event grew it to 317 MB, kept by the
/// thread to the end of the read.
fn resources_text<'k>(r: impl Iterator<Item = (&'k str, f64)>) -> Option<SmallText> {
    thread_local! {
        static TEXT: RefCell<String> = const { RefCell::new(String::new()) };
    }
    TEXT.with_borrow_mut(|out| {
        out.clear();
        for (k, v) in r {
            if out.len() >= RESOURCES_TEXT_BYTES {
                break;
            }
            if !out.is_empty() {
                out.push_str(", ");
            }
            out.push_str(cut(k, 64));
            out.push_str(": ");
            write_amount(out, v);
        }
        (!out.is_empty()).then(|| SmallText::new(cut(out, RESOURCES_TEXT_BYTES)))
    })
}

/// `s` cut at a character boundary to at most `max` bytes (what [`bounded`] copies).
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    &s[..at]
}

/// `1` for 1.0, `0.5` for 0.5.
pub(crate) fn format_amount(v: f64) -> String {
    let mut out = String::new();
    write_amount(&mut out, v);
    out
}

/// [`format_amount`], written at the end of `out`.
fn write_amount(out: &mut String, v: f64) {
    // Writing to a String does not fail.
    let _ = if v.fract() == 0.0 && v.abs() < 1e15 {
        write!(out, "{}", v as i64)
    } else {
        write!(out, "{v}")
    };
}

/// `FunctionDescriptor`: one of its language variants is set.
#[derive(Deserialize)]
struct Functions<'a> {
    #[serde(
        borrow,
        default,
        rename = "pythonFunctionDescriptor",
        alias = "python_function_descriptor"
    )]
    python: Option<FunctionDescriptor<'a>>,
    #[serde(
        borrow,
        default,
        rename = "javaFunctionDescriptor",
        alias = "java_function_descriptor"
    )]
    java: Option<FunctionDescriptor<'a>>,
    #[serde(
        borrow,
        default,
        rename = "cppFunctionDescriptor",
        alias = "cpp_function_descriptor"
    )]
    cpp: Option<FunctionDescriptor<'a>>,
}

#[derive(Deserialize)]
struct FunctionDescriptor<'a> {
    #[serde(borrow, default, rename = "functionName", alias = "function_name")]
    function_name: Text<'a>,
}

#[derive(Deserialize)]
struct StateTransition<'a> {
    #[serde(borrow, default)]
    state: Text<'a>,
    #[serde(borrow, default)]
    timestamp: Text<'a>,
}

#[derive(Deserialize)]
struct ErrorInfo<'a> {
    #[serde(borrow, default, rename = "errorType", alias = "error_type")]
    error_type: Text<'a>,
    #[serde(borrow, default, rename = "errorMessage", alias = "error_message")]
    error_message: Text<'a>,
}

#[derive(Deserialize)]
struct TaskLogInfo<'a> {
    #[serde(borrow, default, rename = "stdoutFile", alias = "stdout_file")]
    stdout_file: Text<'a>,
    #[serde(borrow, default, rename = "stderrFile", alias = "stderr_file")]
    stderr_file: Text<'a>,
    #[serde(default, rename = "stdoutStart", alias = "stdout_start")]
    stdout_start: Int,
    #[serde(default, rename = "stdoutEnd", alias = "stdout_end")]
    stdout_end: Int,
    #[serde(default, rename = "stderrStart", alias = "stderr_start")]
    stderr_start: Int,
    #[serde(default, rename = "stderrEnd", alias = "stderr_end")]
    stderr_end: Int,
}

#[derive(Deserialize)]
struct TaskLifecycle<'a> {
    #[serde(borrow, default, rename = "taskId", alias = "task_id")]
    task_id: Text<'a>,
    #[serde(default, rename = "taskAttempt", alias = "task_attempt")]
    attempt: Int,
    #[serde(borrow, default, rename = "jobId", alias = "job_id")]
    job_id: Text<'a>,
    #[serde(default, rename = "stateTransitions", alias = "state_transitions")]
    transitions: ScanTransitions,
    #[serde(borrow, default, rename = "rayErrorInfo", alias = "ray_error_info")]
    error: Option<ErrorInfo<'a>>,
    #[serde(borrow, default, rename = "nodeId", alias = "node_id")]
    node_id: Text<'a>,
    #[serde(borrow, default, rename = "workerId", alias = "worker_id")]
    worker_id: Text<'a>,
    #[serde(default, rename = "workerPid", alias = "worker_pid")]
    worker_pid: Int,
    #[serde(borrow, default, rename = "taskLogInfo", alias = "task_log_info")]
    log: Option<TaskLogInfo<'a>>,
}

#[derive(Deserialize)]
struct ProfileEvent<'a> {
    #[serde(borrow, default, rename = "eventName", alias = "event_name")]
    name: Text<'a>,
    #[serde(borrow, default, rename = "startTime", alias = "start_time")]
    start: LazyInt<'a>,
    #[serde(borrow, default, rename = "endTime", alias = "end_time")]
    end: LazyInt<'a>,
}

/// An [`Int`] whose text is read only when it is used: a profile has many events and one
/// is used (its types are checked as [`Int`]'s are).
#[derive(Default)]
enum LazyInt<'a> {
    #[default]
    Unset,
    Read(Int),
    Text(Cow<'a, str>),
}

impl LazyInt<'_> {
    fn get(&self) -> Option<i64> {
        match self {
            LazyInt::Unset => None,
            LazyInt::Read(i) => i.0,
            LazyInt::Text(t) => t.trim().parse().ok(),
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for LazyInt<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<LazyInt<'a>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LazyInt<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an integer or a string holding one")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<LazyInt<'de>, E> {
                Ok(LazyInt::Read(Int(Some(v))))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<LazyInt<'de>, E> {
                Ok(LazyInt::Read(Int(i64::try_from(v).ok())))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<LazyInt<'de>, E> {
                Ok(LazyInt::Read(Int(v.is_finite().then_some(v as i64))))
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<LazyInt<'de>, E> {
                Ok(LazyInt::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<LazyInt<'de>, E> {
                Ok(LazyInt::Text(Cow::Owned(v.to_string())))
            }
            fn visit_unit<E: de::Error>(self) -> Result<LazyInt<'de>, E> {
                Ok(LazyInt::Read(Int(None)))
            }
        }
        d.deserialize_any(V)
    }
}

/// A profile's events, of which only the first `task::<name>` one is kept (no list is
/// built; every event is still read, and checked, as a list's would be).
struct FirstExecution<'a>(Option<ProfileEvent<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for FirstExecution<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<FirstExecution<'a>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FirstExecution<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a sequence")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<FirstExecution<'de>, A::Error> {
                let mut first = None;
                while let Some(e) = seq.next_element::<ProfileEvent<'de>>()? {
                    let execution = e
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(EXECUTION_EVENT_PREFIX));
                    if first.is_none() && execution {
                        first = Some(e);
                    }
                }
                Ok(FirstExecution(first))
            }
        }
        d.deserialize_seq(V)
    }
}

#[derive(Deserialize)]
struct ProfileEvents<'a> {
    #[serde(borrow, default, rename = "componentType", alias = "component_type")]
    component_type: Text<'a>,
    #[serde(borrow, default, rename = "componentId", alias = "component_id")]
    component_id: Text<'a>,
    #[serde(borrow, default)]
    events: Option<FirstExecution<'a>>,
}

#[derive(Deserialize)]
struct TaskProfile<'a> {
    #[serde(borrow, default, rename = "taskId", alias = "task_id")]
    task_id: Text<'a>,
    #[serde(default, rename = "attemptNumber", alias = "attempt_number")]
    attempt: Int,
    #[serde(borrow, default, rename = "jobId", alias = "job_id")]
    job_id: Text<'a>,
    #[serde(borrow, default, rename = "profileEvents", alias = "profile_events")]
    profile: Option<ProfileEvents<'a>>,
}

/// `EXPORT_TASK`'s `event_data` (other export types read as this too, harmlessly: they
/// are then read again by the generic reader).
#[derive(Deserialize)]
struct ExportTask<'a> {
    #[serde(borrow, default, alias = "taskId")]
    task_id: Text<'a>,
    #[serde(default, alias = "attemptNumber")]
    attempt_number: Int,
    #[serde(borrow, default, alias = "jobId")]
    job_id: Text<'a>,
    #[serde(borrow, default, alias = "taskInfo")]
    task_info: Option<ExportTaskInfo<'a>>,
    #[serde(borrow, default, alias = "stateUpdates")]
    state_updates: Option<ExportStateUpdates<'a>>,
    #[serde(borrow, default, alias = "profileEvents")]
    profile_events: Option<ProfileEvents<'a>>,
}

#[derive(Deserialize)]
struct ExportTaskInfo<'a> {
    #[serde(borrow, default, alias = "funcOrClassName")]
    func_or_class_name: Text<'a>,
    #[serde(borrow, default)]
    name: Text<'a>,
    #[serde(borrow, default, rename = "type")]
    task_type: Text<'a>,
}

#[derive(Deserialize)]
struct ExportStateUpdates<'a> {
    #[serde(default, alias = "stateTsNs")]
    state_ts_ns: Option<BTreeMap<String, Int>>,
    #[serde(borrow, default, alias = "nodeId")]
    node_id: Text<'a>,
    #[serde(borrow, default, alias = "workerId")]
    worker_id: Text<'a>,
    #[serde(default, alias = "workerPid")]
    worker_pid: Int,
    #[serde(borrow, default, alias = "errorInfo")]
    error_info: Option<ErrorInfo<'a>>,
    #[serde(borrow, default, alias = "taskLogInfo")]
    task_log_info: Option<TaskLogInfo<'a>>,
}

fn text(t: &Text<'_>) -> Option<SmallText> {
    t.as_deref()
        .filter(|s| !s.is_empty())
        .map(|s| SmallText::new(cut(s, MAX_FIELD_BYTES)))
}

/// Deltas the fold is done with, given back to this decoder thread ([`restock`]): a task
/// fact's box is reused rather than allocated here and freed on the fold's thread.
const MAX_SPARE_DELTAS: usize = 4096;

thread_local! {
    static SPARE_DELTAS: RefCell<SpentDeltas> = const { RefCell::new(Vec::new()) };
}

/// Moves boxes of deltas from the end of `deltas` to this thread, to reuse (at most
/// [`MAX_SPARE_DELTAS`] are kept).
pub(super) fn restock(deltas: &mut SpentDeltas) {
    SPARE_DELTAS.with_borrow_mut(|spare| {
        let room = MAX_SPARE_DELTAS
            .saturating_sub(spare.len())
            .min(deltas.len());
        spare.extend(deltas.drain(deltas.len() - room..));
    });
}

fn boxed(d: TaskDelta) -> Box<TaskDelta> {
    match SPARE_DELTAS.with_borrow_mut(Vec::pop) {
        Some(mut b) => {
            *b = d;
            b
        }
        None => Box::new(d),
    }
}

/// Whether `task_id` is the task whose logs are wanted.
fn wanted(logs_of: Option<CompactId>, task_id: &Text<'_>) -> bool {
    logs_of.is_some() && cid(task_id) == logs_of
}

/// An id, kept as bytes (no text is made per event).
fn cid(t: &Text<'_>) -> Option<CompactId> {
    t.as_deref().filter(|s| !s.is_empty()).map(CompactId::parse)
}

fn key(task_id: &Text<'_>, attempt: Int) -> Option<AttemptKey> {
    let raw = task_id.as_deref().filter(|s| !s.is_empty())?;
    Some(AttemptKey {
        id: CompactId::parse(raw),
        attempt: attempt.0.and_then(|a| i32::try_from(a).ok()).unwrap_or(0),
    })
}

fn error(e: &Option<ErrorInfo<'_>>) -> Option<(Option<String>, Option<String>)> {
    e.as_ref().map(|e| {
        (
            e.error_type
                .as_deref()
                .filter(|s| !s.is_empty())
                .map(|s| bounded(s, MAX_FIELD_BYTES)),
            e.error_message
                .as_deref()
                .map(|m| bounded(m, MAX_ERROR_MESSAGE_BYTES)),
        )
    })
}

/// A log file's name without its directory, if the collector ships a file so named
/// ([`crate::contract::is_log_file_name`]).
fn file_name(t: &Text<'_>) -> Option<String> {
    let path = t.as_deref()?;
    let name = path.rsplit('/').next()?;
    crate::contract::is_log_file_name(name).then(|| name.to_string())
}

fn log_info(l: &Option<TaskLogInfo<'_>>) -> Option<Box<LogInfo>> {
    let l = l.as_ref()?;
    let off = |i: Int| i.0.and_then(|v| u64::try_from(v).ok());
    Some(Box::new(LogInfo {
        stdout_file: file_name(&l.stdout_file),
        stderr_file: file_name(&l.stderr_file),
        stdout: (off(l.stdout_start), off(l.stdout_end)),
        stderr: (off(l.stderr_start), off(l.stderr_end)),
    }))
}

/// The worker's `task::<name>` slice of a profile: (start, end, worker id).
fn execution(p: &Option<ProfileEvents<'_>>) -> Option<(i64, i64, Option<CompactId>)> {
    let p = p.as_ref()?;
    if p.component_type.as_deref().is_some_and(|t| t != "worker") {
        return None;
    }
    let e = p.events.as_ref()?.0.as_ref()?;
    let (start, end) = (e.start.get()?, e.end.get()?);
    (start > 0 && end >= start).then(|| (start, end, cid(&p.component_id)))
}

/// `stateTransitions`, read element by element into [`Transitions`] (no list is built).
#[derive(Default)]
struct ScanTransitions(Transitions);

impl<'de> Deserialize<'de> for ScanTransitions {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ScanTransitions, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ScanTransitions;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of state transitions")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ScanTransitions, A::Error> {
                let mut out = Transitions::default();
                while let Some(t) = seq.next_element::<StateTransition<'de>>()? {
                    if let Some(state) = t.state.as_deref().filter(|s| !s.is_empty()) {
                        out.push(Transition {
                            state: task_state(state),
                            time_ns: t.timestamp.as_deref().and_then(parse_time_ns),
                        });
                    }
                }
                Ok(ScanTransitions(out))
            }
            fn visit_unit<E: de::Error>(self) -> Result<ScanTransitions, E> {
                Ok(ScanTransitions::default())
            }
        }
        d.deserialize_any(V)
    }
}

impl Line<'_> {
    /// What [`extract_ray_event`] reads of a Ray event of a type it reads the body of, as a
    /// `Value` of those members alone: the line's id, type and time as the skimmer read
    /// them (`text` is the line it read this from), and the type's body read by `value_of`
    /// from its text (each of its two names, the last of each, as a map of the whole line
    /// keeps). The rest of the line (Ray's envelope: node, session, severity, message) makes
    /// no tree. `None` (the caller reads the whole line as a `Value`) for any other line, a
    /// body `value_of` refuses, a time given as a number, or a line whose whole tree serde
    /// might refuse where the skimmer did not ([`skim::members`]).
    fn ray_event_value(
        &self,
        text: &str,
        value_of: impl Fn(&[u8]) -> Result<Value, String>,
    ) -> Option<Value> {
        if self.event_data.is_some() {
            return None;
        }
        let event_type = self.event_type.as_deref()?;
        let (camel, snake) = super::extract::payload_keys(event_type)?;
        let mut map = serde_json::Map::new();
        map.insert("eventType".into(), Value::String(event_type.to_string()));
        if let Some(id) = self.event_id.as_deref() {
            map.insert("eventId".into(), Value::String(id.to_string()));
        }
        match &self.timestamp {
            Some(Stamp::Text(t)) => {
                map.insert("timestamp".into(), Value::String(t.to_string()));
            }
            Some(Stamp::Seconds(_)) => return None,
            None => {}
        }
        let mut refused = false;
        skim::members(text, |key, value| {
            if key == camel.as_bytes() || key == snake.as_bytes() {
                match value_of(value.as_bytes()) {
                    // A key the skimmer read is plain text: no escapes.
                    Ok(v) => {
                        let key = if key == camel.as_bytes() {
                            camel
                        } else {
                            snake
                        };
                        map.insert(key.to_string(), v);
                    }
                    Err(_) => refused = true,
                }
            }
        })?;
        (!refused).then_some(Value::Object(map))
    }

    /// The fact of a worker, node or actor event ([`rare::body`]) read from its body's text
    /// (`text` is the line the skimmer read this from) without a `Value`: what
    /// [`Self::ray_event_value`] and [`scan_value`] make of it. `None` (the caller reads it
    /// as a `Value`) for any other type, a body given under both its names or not an
    /// object, a time given as a number, or a body serde refuses here.
    fn rare_fact(&self, text: &str, seq: u64) -> Option<Fact> {
        if self.event_data.is_some() {
            return None;
        }
        let event_type = self.event_type.as_deref()?;
        let (camel, snake) = super::extract::payload_keys(event_type)?;
        let time_ns = match &self.timestamp {
            Some(Stamp::Text(t)) => parse_time_ns(t),
            Some(Stamp::Seconds(_)) => return None,
            None => None,
        };
        let (mut under_camel, mut under_snake) = (None, None);
        skim::members(text, |key, value| {
            if key == camel.as_bytes() {
                under_camel = Some(value);
            } else if key == snake.as_bytes() {
                under_snake = Some(value);
            }
        })?;
        let body = match (under_camel, under_snake) {
            (Some(b), None) | (None, Some(b)) if b.trim_start().starts_with('{') => {
                rare::body(event_type, b)?
            }
            _ => return None,
        };
        Some(Fact {
            event_id: self
                .event_id
                .as_deref()
                .filter(|i| !i.is_empty())
                .map(|i| event_id_hash("e:", &bounded(i, MAX_FIELD_BYTES))),
            event_type: Cow::Owned(bounded(event_type, MAX_FIELD_BYTES)),
            time_ns,
            seq,
            body,
        })
    }

    /// The fact of a Ray event of a type nothing reads the body of ([`Body::Other`]: its id,
    /// type and time, as [`extract_ray_event`] makes them), from the typed line alone: the
    /// typed reader skipped its members without keeping them, so an unknown event costs no
    /// JSON tree (review r36e: a 57 MiB line of a future event type took 1 GiB as one).
    /// `None` for any other line (export events, a type read elsewhere, no type).
    fn unread_fact(&self, seq: u64) -> Option<Fact> {
        if self.event_data.is_some() || self.source_type.is_some() {
            return None;
        }
        let event_type = self.event_type.as_deref().filter(|t| !t.is_empty())?;
        if RAY_EVENT_TYPES_READ.contains(&event_type) || task_type_name(event_type) {
            return None;
        }
        Some(Fact {
            event_id: self
                .event_id
                .as_deref()
                .filter(|i| !i.is_empty())
                .map(|i| event_id_hash("e:", &bounded(i, MAX_FIELD_BYTES))),
            event_type: Cow::Owned(bounded(event_type, MAX_FIELD_BYTES)),
            time_ns: match &self.timestamp {
                Some(Stamp::Text(t)) => parse_time_ns(t),
                _ => None,
            },
            seq,
            body: Body::Other,
        })
    }

    /// The fact of a task event, `None` for any other event. Log offsets are read only for
    /// the attempts of `logs_of` (`--logs`).
    fn task_fact(&mut self, seq: u64, logs_of: Option<CompactId>) -> Option<Fact> {
        if let Some(data) = &self.event_data {
            if self.source_type.as_deref() != Some("EXPORT_TASK") {
                return None;
            }
            return Some(self.export_task_fact(data, seq, logs_of));
        }
        let event_type = self.event_type.as_deref()?;
        let time_ns = match &self.timestamp {
            Some(Stamp::Text(t)) => parse_time_ns(t),
            _ => None,
        };
        let delta = match event_type {
            "TASK_DEFINITION_EVENT" | "ACTOR_TASK_DEFINITION_EVENT" => {
                let actor = event_type == "ACTOR_TASK_DEFINITION_EVENT";
                let d = if actor {
                    self.actor_task_definition.as_ref()
                } else {
                    self.task_definition.as_ref()
                };
                d.map(|d| TaskDelta {
                    key: key(&d.task_id, d.attempt),
                    job: cid(&d.job_id),
                    name: text(&d.name).or_else(|| {
                        let f = d.func.as_ref()?;
                        [&f.python, &f.java, &f.cpp]
                            .into_iter()
                            .flatten()
                            .find_map(|f| text(&f.function_name))
                    }),
                    task_type: if actor {
                        Some(SmallText::new("ACTOR_TASK"))
                    } else {
                        text(&d.task_type)
                    },
                    resources: d
                        .resources
                        .as_ref()
                        .and_then(|r| resources_text(r.iter().map(|(k, v)| (&**k, *v)))),
                    ..TaskDelta::default()
                })
            }
            "TASK_LIFECYCLE_EVENT" => self.task_lifecycle.as_mut().map(|l| TaskDelta {
                log: if wanted(logs_of, &l.task_id) {
                    log_info(&l.log)
                } else {
                    None
                },
                key: key(&l.task_id, l.attempt),
                job: cid(&l.job_id),
                transitions: std::mem::take(&mut l.transitions.0),
                error: error(&l.error),
                node: cid(&l.node_id),
                worker: cid(&l.worker_id),
                pid: l.worker_pid.0,
                ..TaskDelta::default()
            }),
            "TASK_PROFILE_EVENT" => self.task_profile.as_ref().map(|p| TaskDelta {
                key: key(&p.task_id, p.attempt),
                job: cid(&p.job_id),
                exec: execution(&p.profile),
                from_profile: true,
                ..TaskDelta::default()
            }),
            _ => return None,
        };
        Some(Fact {
            event_id: self.event_id.as_deref().map(|i| event_id_hash("e:", i)),
            event_type: static_event_type(event_type),
            time_ns,
            seq,
            body: match delta {
                Some(d) if d.key.is_some() => Body::Task(boxed(d)),
                _ => Body::Other,
            },
        })
    }

    fn export_task_fact(&self, d: &ExportTask<'_>, seq: u64, logs_of: Option<CompactId>) -> Fact {
        let time_ns = match &self.timestamp {
            Some(Stamp::Seconds(s)) => s.checked_mul(NANOS_PER_SECOND),
            _ => None,
        };
        let info = d.task_info.as_ref();
        let updates = d.state_updates.as_ref();
        let mut transitions: Vec<Transition> = updates
            .and_then(|u| u.state_ts_ns.as_ref())
            .map(|m| {
                m.iter()
                    .filter_map(|(state, ns)| {
                        let state = state.parse::<usize>().ok()?;
                        Some(Transition {
                            state: Cow::Borrowed(*TASK_STATUS.get(state)?),
                            time_ns: ns.0.filter(|n| *n > 0),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        transitions.sort_by_key(|t| t.time_ns);
        let delta = TaskDelta {
            key: key(&d.task_id, d.attempt_number),
            job: cid(&d.job_id),
            name: info.and_then(|i| text(&i.name).or_else(|| text(&i.func_or_class_name))),
            task_type: info.and_then(|i| text(&i.task_type)),
            transitions: transitions.into_iter().collect(),
            error: updates.and_then(|u| error(&u.error_info)),
            node: updates.and_then(|u| cid(&u.node_id)),
            worker: updates.and_then(|u| cid(&u.worker_id)),
            pid: updates.and_then(|u| u.worker_pid.0),
            resources: None,
            exec: execution(&d.profile_events),
            log: updates
                .filter(|_| wanted(logs_of, &d.task_id))
                .and_then(|u| log_info(&u.task_log_info)),
            from_profile: false,
        };
        Fact {
            event_id: self.event_id.as_deref().map(|i| event_id_hash("x:", i)),
            event_type: Cow::Borrowed("EXPORT_TASK"),
            time_ns,
            seq,
            body: if delta.key.is_some() {
                Body::Task(boxed(delta))
            } else {
                Body::Other
            },
        }
    }
}

/// The task event types, as static strings.
fn static_event_type(t: &str) -> Cow<'static, str> {
    match t {
        "TASK_DEFINITION_EVENT" => Cow::Borrowed("TASK_DEFINITION_EVENT"),
        "ACTOR_TASK_DEFINITION_EVENT" => Cow::Borrowed("ACTOR_TASK_DEFINITION_EVENT"),
        "TASK_LIFECYCLE_EVENT" => Cow::Borrowed("TASK_LIFECYCLE_EVENT"),
        "TASK_PROFILE_EVENT" => Cow::Borrowed("TASK_PROFILE_EVENT"),
        other => Cow::Owned(other.to_string()),
    }
}

/// A task state's name: Ray's own as static strings (no allocation per transition).
fn task_state(s: &str) -> Cow<'static, str> {
    match TASK_STATUS.iter().find(|known| **known == s) {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(bounded(s, MAX_FIELD_BYTES)),
    }
}

/// What one line holds: a fact, or why it is not a Ray event.
pub(super) type Scanned = Result<Fact, String>;

/// Reads one line (already trimmed, not empty). `value_of` parses the line the generic way
/// (with Go's reading of lone surrogates), for the events the typed path leaves.
pub(super) fn scan_line(
    line: &[u8],
    seq: u64,
    logs_of: Option<CompactId>,
    value_of: impl Fn(&[u8]) -> Result<Value, String>,
) -> Scanned {
    // A line valid as UTF-8 as a whole (every line Ray writes) is checked once, here, and
    // read as a `str`: serde_json then does not check each key and value again (a tenth of
    // the instructions of a read). It reads the same: only the check of the bytes differs,
    // and any other line is read from its bytes as before.
    // The hand-written reader first ([`skim`]); serde reads what it is not sure of.
    let mut skimmed = None;
    let typed = match utf8(line) {
        Ok(text) => match skim::line(text) {
            Some(l) => {
                skimmed = Some(text);
                Ok(l)
            }
            None => serde_json::from_str::<Line>(text),
        },
        Err(_) => serde_json::from_slice::<Line>(line),
    };
    if let Ok(mut typed) = typed {
        if let Some(fact) = typed.task_fact(seq, logs_of) {
            return Ok(fact);
        }
        if let Some(fact) = typed.unread_fact(seq) {
            return Ok(fact);
        }
        if let Some(fact) = skimmed.and_then(|text| typed.rare_fact(text, seq)) {
            return Ok(fact);
        }
        if let Some(v) = skimmed.and_then(|text| typed.ray_event_value(text, &value_of)) {
            return scan_value(&v, seq, logs_of);
        }
    }
    match value_of(line) {
        Ok(v) => scan_value(&v, seq, logs_of),
        Err(e) => Err(e),
    }
}

/// `line` as a `str` if it is valid UTF-8, as [`std::str::from_utf8`] says. A line of ASCII
/// only (every line Ray writes but those with non-ASCII text) is recognised sixty-four bytes
/// at a time, several times faster than the general check, which reads any other line.
fn utf8(line: &[u8]) -> Result<&str, std::str::Utf8Error> {
    if is_ascii(line) {
        // SAFETY: ASCII is valid UTF-8.
        return Ok(unsafe { std::str::from_utf8_unchecked(line) });
    }
    std::str::from_utf8(line)
}

/// Whether every byte of `b` is below 0x80: the high bits of 64 bytes at a time ORed
/// together with SSE2 (x86-64's baseline), then of 8 at a time.
fn is_ascii(b: &[u8]) -> bool {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128};
        while i + 64 <= b.len() {
            // SAFETY: SSE2 is always present on x86-64; the four unaligned loads read
            // b[i..i + 64], which the loop's condition keeps inside `b`.
            let high = unsafe {
                let p = b.as_ptr().add(i);
                let x = _mm_or_si128(
                    _mm_or_si128(_mm_loadu_si128(p.cast()), _mm_loadu_si128(p.add(16).cast())),
                    _mm_or_si128(
                        _mm_loadu_si128(p.add(32).cast()),
                        _mm_loadu_si128(p.add(48).cast()),
                    ),
                );
                _mm_movemask_epi8(x)
            };
            if high != 0 {
                return false;
            }
            i += 64;
        }
    }
    let mut acc = 0u64;
    let mut chunks = b[i..].chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        acc |= u64::from_le_bytes(w);
    }
    for &c in chunks.remainder() {
        acc |= u64::from(c);
    }
    acc & 0x8080_8080_8080_8080 == 0
}

/// The type of `v` if it is a task event, the events the typed reader ([`Line`]) reads.
fn task_event_kind(v: &Value) -> Option<&str> {
    let field = |camel: &str, snake: &str| {
        v.get(camel)
            .or_else(|| v.get(snake))
            .and_then(Value::as_str)
    };
    if v.get("event_data").is_some() || v.get("eventData").is_some() {
        return field("source_type", "sourceType").filter(|t| *t == "EXPORT_TASK");
    }
    field("eventType", "event_type").filter(|t| task_type_name(t))
}

/// Whether `t` is a type of the task events the typed reader ([`Line`]) reads.
fn task_type_name(t: &str) -> bool {
    matches!(
        t,
        "TASK_DEFINITION_EVENT"
            | "ACTOR_TASK_DEFINITION_EVENT"
            | "TASK_LIFECYCLE_EVENT"
            | "TASK_PROFILE_EVENT"
    )
}

/// Reads one JSON value that is an event (an element of a legacy array, or a line the typed
/// reader refused). A task event that the typed reader refuses is an error (a bad line).
pub(super) fn scan_value(v: &Value, seq: u64, logs_of: Option<CompactId>) -> Scanned {
    if !v.is_object() {
        return Err("not a JSON object".into());
    }
    match Line::deserialize(v) {
        Ok(mut typed) => {
            if let Some(fact) = typed.task_fact(seq, logs_of) {
                return Ok(fact);
            }
        }
        // A task event the typed reader refuses has a field of the wrong type: it is a bad
        // line, counted as one, never an event of no kind that is silently passed over.
        Err(e) => {
            if let Some(kind) = task_event_kind(v) {
                return Err(format!(
                    "a {kind} whose fields do not have Ray's types: {e}"
                ));
            }
        }
    }
    let fact = if v.get("event_data").is_some() {
        extract_export_event(v, seq)
    } else {
        extract_ray_event(v, seq)
    };
    match fact {
        Some(f) => Ok(f),
        None => Err("not a Ray event (no eventType or source_type)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(line: &str) -> Fact {
        match scan_line(line.as_bytes(), 0, Some(CompactId::parse("AQID")), |l| {
            serde_json::from_slice(l).map_err(|e| e.to_string())
        }) {
            Ok(f) => f,
            Err(e) => panic!("{e}: {line}"),
        }
    }

    /// The ASCII test agrees with std's at every length and every offset of a high byte,
    /// and `utf8` with `from_utf8` on valid and invalid text alike.
    #[test]
    fn the_ascii_check_is_std_s() {
        let base: Vec<u8> = (0..200u32).map(|i| b' ' + (i % 90) as u8).collect();
        for len in 0..base.len() {
            assert!(is_ascii(&base[..len]));
            for at in 0..len {
                for high in [0x80, 0xc3, 0xff] {
                    let mut b = base[..len].to_vec();
                    b[at] = high;
                    assert_eq!(is_ascii(&b), b.is_ascii(), "{len} {at}");
                    assert_eq!(utf8(&b).ok(), std::str::from_utf8(&b).ok(), "{len} {at}");
                }
            }
        }
        let text = format!("{}héllo 🎉{}", "a".repeat(70), "b".repeat(70));
        assert_eq!(utf8(text.as_bytes()), Ok(text.as_str()));
    }

    /// Every non-task event of Ray's captures (and each perturbed a few thousand ways, and
    /// hand-made edge cases) reads as the whole line's `Value` reads: the same fact, or the
    /// same error; the captures' own lines are read without that tree.
    #[test]
    fn ray_events_read_from_their_body_as_from_the_whole_line() {
        use super::super::decode::value_of;
        let whole =
            |line: &[u8]| format!("{:?}", value_of(line).and_then(|v| scan_value(&v, 7, None)));
        let ours = |line: &[u8]| format!("{:?}", scan_line(line, 7, None, value_of));
        let mut lines = Vec::new();
        for path in [
            "tests/data/posts-camel.jsonl",
            "tests/data/posts-snake.jsonl",
        ] {
            let text = std::fs::read_to_string(path).unwrap();
            for l in text.lines().filter(|l| !l.trim().is_empty()) {
                let v: Value = serde_json::from_str(l).unwrap();
                for item in v.as_array().unwrap() {
                    let t = item
                        .get("eventType")
                        .or_else(|| item.get("event_type"))
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    if RAY_EVENT_TYPES_READ.contains(&t) {
                        lines.push(item.to_string());
                    }
                }
            }
        }
        assert!(lines.len() > 40, "{}", lines.len());
        let mut typed_read = 0;
        for l in &lines {
            let typed = skim::line(l).unwrap();
            assert!(typed.ray_event_value(l, value_of).is_some(), "{l}");
            let t = typed.event_type.as_deref().unwrap_or("");
            if t.starts_with("WORKER_") || t.starts_with("NODE_") || t.starts_with("ACTOR_") {
                assert!(typed.rare_fact(l, 7).is_some(), "{l}");
                typed_read += 1;
            }
            assert_eq!(ours(l.as_bytes()), whole(l.as_bytes()), "{l}");
        }
        let worker = r#"{"eventId":"w","eventType":"WORKER_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:06:44Z","workerLifecycleEvent":{"workerId":"AQID","jobId":"AgAAAA==","stateTransitions":[{"state":"DEAD","timestamp":"2026-11-22T02:06:45Z","deathInfo":{"exitType":"SYSTEM_ERROR","exitDetail":"x"}}]}"#;
        let edge = [
            // Both names of the body, twice each: camelCase first, the last of each.
            format!(
                r#"{worker},"worker_lifecycle_event":{{"workerId":"AQIE"}},"workerLifecycleEvent":{{"workerId":"AQIF"}}}}"#
            ),
            format!(r#"{worker},"worker_lifecycle_event":{{"workerId":"AQIE"}}}}"#),
            r#"{"eventType":"WORKER_LIFECYCLE_EVENT","worker_lifecycle_event":{"workerId":"AQIE"},"worker_lifecycle_event":5}"#.to_string(),
            // Numbers the whole tree may refuse, in the envelope or the body.
            format!(r#"{worker},"x":1e999}}"#),
            format!(r#"{worker},"x":1.5e99,"y":-0.25E-07}}"#),
            format!(r#"{worker},"x":{}}}"#, "9".repeat(400)),
            format!(r#"{worker},"x":{}}}"#, "9".repeat(150)),
            // Lone surrogates, in the envelope or the body.
            format!(r#"{worker},"message":"\ud800"}}"#),
            worker.replace(r#""x"}"#, r#""\udc00 \ud83d\ude00"}"#) + "}",
            // A time as a number, no time, a null id, a body not an object, no body.
            worker.replace(r#""2026-11-22T02:06:44Z""#, "1795313204") + "}",
            worker.replace(r#""timestamp":"2026-11-22T02:06:44Z","#, "") + "}",
            worker.replace(r#""w""#, "null") + "}",
            r#"{"eventType":"NODE_DEFINITION_EVENT","nodeDefinitionEvent":[1]}"#.to_string(),
            r#"{"eventType":"NODE_DEFINITION_EVENT","eventId":"n"}"#.to_string(),
            r#"{"event_type":"ACTOR_DEFINITION_EVENT","actor_definition_event":{"actor_id":"AQID","class_name":"C"},"eventData":{}}"#.to_string(),
            // Escapes, whitespace.
            r#" { "eventType" : "ACTOR_DEFINITION_EVENT" , "actorDefinitionEvent" : { "actorId" : "AQID" , "className" : "C\"\u00e9" } , "eventId" : "a\nb" } "#.to_string(),
            worker.to_string() + "}",
            // The typed bodies: wrong types, both names of a member, members twice, nulls,
            // odd numbers, escapes, elements not objects, a body that is an array.
            worker.replace(r#""workerId":"AQID""#, r#""workerId":null,"worker_id":"AQID""#) + "}",
            worker.replace(r#""workerId":"AQID""#, r#""worker_id":"AQID","workerId":"AQIE""#) + "}",
            worker.replace(r#""workerId":"AQID""#, r#""workerId":"AQID","workerId":"AQIE""#) + "}",
            worker.replace(r#""workerId":"AQID""#, r#""workerId":5"#) + "}",
            worker.replace(r#""workerId":"AQID""#, r#""workerId":"""#) + "}",
            worker.replace(r#""workerId":"AQID""#, r#""workerId":"not base64!""#) + "}",
            worker.replace(r#""workerId":"AQID""#, r#""work\u0065rId":"AQ\u0049D""#) + "}",
            worker.replace(r#""stateTransitions":["#, r#""stateTransitions":[5,null,[],{"state":7},{"state":""},"#) + "}",
            worker.replace(r#""stateTransitions":["#, r#""state_transitions":[{"state":"X"}],"stateTransitions":["#) + "}",
            worker.replace(r#""stateTransitions":[{"#, r#""stateTransitions":{"a":[{"#).replace("}]}", "}]}}") + "}",
            worker.replace(r#""deathInfo":{"#, r#""death_info":{"exitType":"Y"},"deathInfo":{"exit_type":"Z","#) + "}",
            worker.replace(r#""deathInfo":{"#, r#""deathInfo":[],"death_info":{"exitType":"Y"},"x":{"#) + "}",
            worker.replace(r#""exitDetail":"x""#, &format!(r#""exitDetail":"{}""#, "é".repeat(9000))) + "}",
            worker.replace(r#""exitDetail":"x""#, r#""exitDetail":"\ud800""#) + "}",
            worker.replace(r#""jobId":"AgAAAA==","#, r#""jobId":"AgAAAA==","zz":"\udc00","#) + "}",
            worker.replace(r#""workerLifecycleEvent":{"#, r#""workerLifecycleEvent":["#).replace("}]}", "}]]") + "}",
            worker.replace(r#""workerLifecycleEvent":{"#, r#""workerLifecycleEvent": {"#) + "}",
            r#"{"eventType":"WORKER_DEFINITION_EVENT","eventId":"","workerDefinitionEvent":{"workerId":"AQID","pid":"  42 ","workerType":5,"worker_type":"W"}}"#.to_string(),
            r#"{"eventType":"WORKER_DEFINITION_EVENT","workerDefinitionEvent":{"workerId":"AQID","pid":18446744073709551615,"node_id":"AQID","nodeId":null}}"#.to_string(),
            r#"{"eventType":"WORKER_DEFINITION_EVENT","workerDefinitionEvent":{"workerId":"AQID","pid":-3.9e3}}"#.to_string(),
            r#"{"eventType":"WORKER_DEFINITION_EVENT","workerDefinitionEvent":{"workerId":"AQID","pid":4.2}}"#.to_string(),
            r#"{"eventType":"WORKER_DEFINITION_EVENT","workerDefinitionEvent":{"pid":42}}"#.to_string(),
            r#"{"eventType":"WORKER_DEFINITION_EVENT","workerDefinitionEvent":["AQID"]}"#.to_string(),
            r#"{"eventType":"NODE_DEFINITION_EVENT","nodeDefinitionEvent":{"nodeId":"AQID","hostname":"h","node_ip_address":"1.2.3.4","startTimestamp":"2026-11-22T02:06:45.5Z","start_timestamp":"2026-11-22T02:06:46Z"}}"#.to_string(),
            r#"{"eventType":"ACTOR_DEFINITION_EVENT","actorDefinitionEvent":{"actor_id":"AQID","actorId":null,"jobId":"AgAAAA==","className":"","class_name":"C","name":"n"}}"#.to_string(),
            r#"{"eventType":"ACTOR_DEFINITION_EVENT","actorDefinitionEvent":{"actorId":"AQID","name":7,"className":"C"}}"#.to_string(),
            format!(r#"{{"eventType":"ACTOR_LIFECYCLE_EVENT","actorLifecycleEvent":{{"actorId":"AQID","stateTransitions":[{{"state":"DEAD","nodeId":"AQID","pid":"7","deathCause":{{"b":{{"reason":"B"}},"a":5,"c":{{"reason":"C"}}}}}},{{"state":"DEAD","pid":-1,"death_cause":{{"x":{{"errorMessage":"{}"}}}}}},{{"state":"DEAD","deathCause":{{"z":{{"reason":"Z","error_message":"m"}},"z":[]}}}},{{"state":"ALIVE","node_id":"AQIE","deathCause":[],"death_cause":{{"a":{{"reason":"A"}}}}}}]}}}}"#, "m".repeat(20000)),
            r#"{"eventType":"ACTOR_LIFECYCLE_EVENT","actorLifecycleEvent":{"actorId":"AQID","stateTransitions":[{"state":"DEAD","deathCause":{"a":{"reason":"A","reason":"B"}}}]}}"#.to_string(),
            r#"{"eventType":"NODE_LIFECYCLE_EVENT","nodeLifecycleEvent":{"node_id":"AQID","stateTransitions":[{"state":"ALIVE","resources":{"CPU":2.0,"b":"1","a":-1,"CPU":3,"z":18446744073709551615}},{"state":"DEAD","resources":[],"death_info":{"reason":"R","reason_message":"M","reasonMessage":null}},{"state":"DEAD","deathInfo":{"reasonMessage":"N"},"resources":null}]}}"#.to_string(),
        ];
        assert!(typed_read > 10, "{typed_read}");
        for l in &edge {
            assert_eq!(ours(l.as_bytes()), whole(l.as_bytes()), "{l}");
        }
        for l in super::skim::perturbed(&lines, 0x2545_f491_4f6c_dd1d, 3000) {
            assert_eq!(ours(&l), whole(&l), "{}", String::from_utf8_lossy(&l));
        }
    }

    fn task(f: Fact) -> TaskDelta {
        match f.body {
            Body::Task(d) => *d,
            other => panic!("not a task: {other:?}"),
        }
    }

    /// Review r36za D1: the text is written only up to its cut, and is the cut of the whole
    /// text: many keys, amounts of hundreds of digits, a key cut inside a multi-byte char.
    #[test]
    fn resources_text_stops_at_its_cut_and_is_the_cut_of_the_whole() {
        let keys: Vec<String> = (0..2000).map(|i| format!("k{i:05}é")).collect();
        for amount in [1.0, 0.5, 1e308] {
            let pairs = || keys.iter().map(|k| (k.as_str(), amount));
            let mut whole = String::new();
            for (k, v) in pairs() {
                if !whole.is_empty() {
                    whole.push_str(", ");
                }
                whole.push_str(cut(k, 64));
                whole.push_str(": ");
                write_amount(&mut whole, v);
            }
            let got = resources_text(pairs()).unwrap();
            assert_eq!(&*got, cut(&whole, RESOURCES_TEXT_BYTES));
        }
    }

    /// Review r36e: a line of an event type nothing reads was parsed into a JSON tree (a
    /// 57 MiB line: 1 GiB). Now its fact (id, type, time) comes from the typed reader, which
    /// keeps none of its members, and is the fact the tree would have made.
    #[test]
    fn unknown_event_types_are_read_without_a_tree() {
        let pad = "0,".repeat(10_000);
        for line in [
            format!(
                r#"{{"eventId":"AAAA","eventType":"SOME_FUTURE_EVENT","timestamp":"2026-11-22T02:06:44.945Z","pad":[{pad}0]}}"#
            ),
            format!(
                r#"{{"event_id":"AAAA","event_type":"SOME_FUTURE_EVENT","timestamp":"2026-11-22T02:06:44.945Z","pad":{{"a":[{pad}0]}}}}"#
            ),
            r#"{"eventType":"SOME_FUTURE_EVENT"}"#.to_string(),
        ] {
            let got = scan_line(line.as_bytes(), 3, None, |_| {
                panic!("a JSON tree was built for {line}")
            })
            .unwrap();
            let v: Value = serde_json::from_str(&line).unwrap();
            let want = extract_ray_event(&v, 3).unwrap();
            assert!(matches!(got.body, Body::Other));
            assert_eq!(
                (got.event_id, &got.event_type, got.time_ns, got.seq),
                (want.event_id, &want.event_type, want.time_ns, want.seq)
            );
        }
        // A type whose body is read as a `Value` still gets that tree; a worker, node or
        // actor event's body is read typed, without one.
        let trees = std::cell::Cell::new(0);
        let read = |line: &str| {
            scan_line(line.as_bytes(), 0, None, |l| {
                trees.set(trees.get() + 1);
                serde_json::from_slice(l).map_err(|e| e.to_string())
            })
            .unwrap()
        };
        let job = read(
            r#"{"eventId":"j","eventType":"DRIVER_JOB_DEFINITION_EVENT","driverJobDefinitionEvent":{"jobId":"AQAAAA=="}}"#,
        );
        assert_eq!(trees.get(), 1);
        assert!(matches!(job.body, Body::DriverJobDefinition { .. }));
        let node = read(
            r#"{"eventId":"n","eventType":"NODE_DEFINITION_EVENT","nodeDefinitionEvent":{"nodeId":"AQID"}}"#,
        );
        assert_eq!(trees.get(), 1);
        assert!(matches!(node.body, Body::NodeDefinition { .. }));
    }

    /// Review r36e: a task event with one field of the wrong type was read as an event of no
    /// kind and passed over; now it is a bad line, whichever field and key style.
    #[test]
    fn task_events_with_a_field_of_the_wrong_type_are_bad_lines() {
        let def = |over: &str| {
            format!(
                r#"{{"eventId":"d","eventType":"TASK_DEFINITION_EVENT","timestamp":"2026-11-22T05:00:01Z",
                "taskDefinitionEvent":{{"taskId":"AQID","taskAttempt":0,"jobId":"AQAAAA==","taskType":"NORMAL_TASK","taskName":"t"{over}}}}}"#
            )
        };
        let life = |over: &str| {
            format!(
                r#"{{"eventId":"l","eventType":"TASK_LIFECYCLE_EVENT","timestamp":"2026-11-22T05:00:02Z",
                "taskLifecycleEvent":{{"taskId":"AQID","taskAttempt":0,"jobId":"AQAAAA==","workerPid":7,
                "stateTransitions":[{{"state":"FINISHED","timestamp":"2026-11-22T05:00:02Z"}}]{over}}}}}"#
            )
        };
        // The control reads as a task.
        task(fact(&def("")));
        task(fact(&life("")));
        for bad in [
            life(r#","workerPid":true"#),
            def(r#","taskName":5"#),
            life(r#","nodeId":["x"]"#),
            def(r#","taskAttempt":[0]"#),
            life(r#","stateTransitions":{"state":"FINISHED"}"#),
            r#"{"event_data":{"task_id":"AQID","attempt_number":[0]},"event_id":"e","source_type":"EXPORT_TASK","timestamp":1795625217}"#.to_string(),
        ] {
            let got = scan_line(bad.as_bytes(), 0, None, |l| {
                serde_json::from_slice(l).map_err(|e| e.to_string())
            });
            let err = got.map(|f| f.body).expect_err(&bad);
            assert!(err.contains("do not have Ray's types"), "{err}: {bad}");
        }
        // Another event type's surprises stay its reader's business.
        let node = r#"{"eventId":"n","eventType":"NODE_DEFINITION_EVENT","timestamp":"2026-11-22T05:00:02Z","nodeDefinitionEvent":{"nodeId":"AQID","hostname":5}}"#;
        assert!(
            scan_line(node.as_bytes(), 0, None, |l| serde_json::from_slice(l)
                .map_err(|e| e.to_string()))
            .is_ok()
        );
    }

    #[test]
    fn snake_and_camel_lifecycles_read_alike() {
        let camel = r#"{"eventId":"x","eventType":"TASK_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:06:44.945Z",
            "taskLifecycleEvent":{"taskId":"AQID","taskAttempt":1,"jobId":"AQAAAA==","workerPid":7,
            "stateTransitions":[{"state":"FAILED","timestamp":"2026-11-22T02:06:44.945Z"}],
            "taskLogInfo":{"stderrFile":"/tmp/ray/s/logs/worker-ab-01000000-7.err","stderrStart":"35"},
            "rayErrorInfo":{"errorType":"TASK_EXECUTION_EXCEPTION","errorMessage":"boom"}}}"#;
        let snake = r#"{"event_id":"x","event_type":"TASK_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:06:44.945Z",
            "task_lifecycle_event":{"task_id":"AQID","task_attempt":1,"job_id":"AQAAAA==","worker_pid":7,
            "state_transitions":[{"state":"FAILED","timestamp":"2026-11-22T02:06:44.945Z"}],
            "task_log_info":{"stderr_file":"/tmp/ray/s/logs/worker-ab-01000000-7.err","stderr_start":"35"},
            "ray_error_info":{"error_type":"TASK_EXECUTION_EXCEPTION","error_message":"boom"}}}"#;
        for line in [camel, snake] {
            let f = fact(line);
            assert!(f.event_id.is_some());
            let t = task(f);
            let k = t.key.unwrap();
            assert_eq!((k.id.hex().as_str(), k.attempt), ("010203", 1));
            assert_eq!(t.job.map(|j| j.hex()).as_deref(), Some("01000000"));
            assert_eq!(t.transitions.iter().next().unwrap().state, "FAILED");
            assert_eq!(t.pid, Some(7));
            let (ty, msg) = t.error.unwrap();
            assert_eq!(ty.as_deref(), Some("TASK_EXECUTION_EXCEPTION"));
            assert_eq!(msg.as_deref(), Some("boom"));
            let log = t.log.unwrap();
            assert_eq!(log.stderr_file.as_deref(), Some("worker-ab-01000000-7.err"));
            assert_eq!(log.stderr, (Some(35), None));
        }
    }

    /// A profile's first `task::` event is its execution, its times read only then; the
    /// other events are still checked (a wrong type in any is a bad line, as with a list).
    #[test]
    fn profiles_use_their_first_execution_event_and_check_the_others() {
        let profile = |events: &str| {
            format!(
                r#"{{"eventId":"p","eventType":"TASK_PROFILE_EVENT","timestamp":"2026-11-22T05:00:01Z",
                "taskProfileEvents":{{"taskId":"AQID","attemptNumber":0,"jobId":"AQAAAA==",
                "profileEvents":{{"componentType":"worker","componentId":"AQID","events":[{events}]}}}}}}"#
            )
        };
        let exec = |f: &str| task(fact(&profile(f))).exec.map(|(s, e, _)| (s, e));
        let submit = r#"{"eventName":"submit_task","startTime":"x","endTime":1}"#;
        let first = r#"{"eventName":"task::f","startTime":" 10 ","endTime":"20"}"#;
        let second = r#"{"eventName":"task::g","startTime":30,"endTime":40}"#;
        assert_eq!(exec(&format!("{submit},{first},{second}")), Some((10, 20)));
        assert_eq!(exec(&format!("{second},{first}")), Some((30, 40)));
        // The first execution event decides, even when its times are not usable.
        let unusable = r#"{"eventName":"task::f","startTime":"soon","endTime":"20"}"#;
        assert_eq!(exec(&format!("{unusable},{second}")), None);
        assert_eq!(exec(submit), None);
        assert_eq!(exec(""), None);
        for bad in [
            profile(&format!(r#"{second},{{"eventName":"x","startTime":[1]}}"#)),
            profile(&format!(r#"{{"eventName":5}},{first}"#)),
            profile(r#"{"eventName":"task::f","endTime":{}}"#),
        ] {
            let got = scan_line(bad.as_bytes(), 0, None, |l| {
                serde_json::from_slice(l).map_err(|e| e.to_string())
            });
            let err = got.map(|f| f.body).expect_err(&bad);
            assert!(err.contains("do not have Ray's types"), "{err}: {bad}");
        }
    }

    /// Invalid UTF-8 in a member that is skipped does not make a bad line; in a member that
    /// is read, it does (as when serde_json checked each string of the bytes itself).
    #[test]
    fn invalid_utf8_where_it_is_read_and_where_it_is_not() {
        let line = |message: &[u8], name: &[u8]| {
            let mut l =
                br#"{"eventId":"d","eventType":"TASK_DEFINITION_EVENT","message":""#.to_vec();
            l.extend_from_slice(message);
            l.extend_from_slice(br#"","taskDefinitionEvent":{"taskId":"AQID","taskName":""#);
            l.extend_from_slice(name);
            l.extend_from_slice(br#""}}"#);
            l
        };
        let read = |l: &[u8]| {
            scan_line(l, 0, None, |l| {
                serde_json::from_slice(l).map_err(|e| e.to_string())
            })
            .map(|f| task(f).name.map(|n| n.to_string()))
        };
        assert_eq!(read(&line(b"ok", b"f")), Ok(Some("f".into())));
        assert_eq!(read(&line(b"\xff", b"f")), Ok(Some("f".into())));
        assert_eq!(
            read(&line(b"caf\xc3\xa9", b"caf\xc3\xa9")),
            Ok(Some("caf\u{e9}".into()))
        );
        assert!(read(&line(b"ok", b"\xff")).is_err());
    }

    /// A definition's texts: short ones inline, long ones whole up to their bounds, the
    /// resource request with its keys sorted and cut as before.
    #[test]
    fn definition_texts() {
        let def = |name: &str, resources: &str| {
            task(fact(&format!(
                r#"{{"eventId":"d","eventType":"TASK_DEFINITION_EVENT","timestamp":"2026-11-22T05:00:01Z",
                "taskDefinitionEvent":{{"taskId":"AQID","taskName":"{name}","taskType":"NORMAL_TASK",
                "requiredResources":{resources}}}}}"#
            )))
        };
        let t = def("f", r#"{"GPU":0.5,"CPU":1.0,"memory":1e9}"#);
        assert_eq!(t.name.as_deref(), Some("f"));
        assert_eq!(t.task_type.as_deref(), Some("NORMAL_TASK"));
        assert_eq!(
            t.resources.as_deref(),
            Some("CPU: 1, GPU: 0.5, memory: 1000000000")
        );
        let long = "é".repeat(300);
        let key = "k".repeat(100);
        let many: Vec<String> = (0..60).map(|i| format!(r#""r{i:02}":{i}.25"#)).collect();
        let t = def(&long, &format!(r#"{{"{key}":1}}"#));
        assert_eq!(t.name.as_deref(), Some(&long[..MAX_FIELD_BYTES]));
        assert_eq!(def(&long[..100], "{}").name.as_deref(), Some(&long[..100]));
        assert_eq!(
            t.resources.as_deref(),
            Some(format!("{}: 1", &key[..64]).as_str())
        );
        let t = def("f", &format!("{{{}}}", many.join(",")));
        let want: Vec<String> = (0..60).map(|i| format!("r{i:02}: {i}.25")).collect();
        assert_eq!(t.resources.as_deref(), Some(&want.join(", ")[..512]));
        assert_eq!(def("f", "{}").resources.as_deref(), None);
    }

    #[test]
    fn export_tasks_and_profiles() {
        // From a Ray 2.60 run with RAY_enable_export_api_write=1.
        let line = r#"{"event_data": {"attempt_number": 0, "job_id": "AQAAAA==", "state_updates": {"error_info": {"error_message": "RuntimeError: x", "error_type": "TASK_EXECUTION_EXCEPTION"}, "node_id": "EMTEIoT2JmOrj6YRpDqHZoT7esnMZhxYatijbA==", "state_ts_ns": {"1": "1795625216406224479", "12": "1795625216415864429", "8": "1795625216409894056"}, "worker_id": "hOtmsjbBfbXISIyEHByWn6yrpUaWB0ZuZVw+Hw=="}, "task_id": "MtlQ7AzPnSr///////////////8BAAAA", "task_info": {"func_or_class_name": "fails", "type": "NORMAL_TASK"}, "profile_events": {"component_id": "hOtmsjbBfbXISIyEHByWn6yrpUaWB0ZuZVw+Hw==", "component_type": "worker", "events": [{"end_time": "1795625216411721381", "event_name": "task:execute", "start_time": "1795625216411264421"}, {"end_time": "1795625216412064926", "event_name": "task::fails", "start_time": "1795625216411211295"}]}}, "event_id": "9f7c", "source_type": "EXPORT_TASK", "timestamp": 1795625217}"#;
        let f = fact(line);
        assert_eq!(f.event_type, "EXPORT_TASK");
        assert_eq!(f.time_ns, Some(1_795_625_217 * NANOS_PER_SECOND));
        let t = task(f);
        assert_eq!(t.name.as_deref(), Some("fails"));
        let states: Vec<&str> = t.transitions.iter().map(|t| &*t.state).collect();
        assert_eq!(states, ["PENDING_ARGS_AVAIL", "RUNNING", "FAILED"]);
        let (start, end, worker) = t.exec.unwrap();
        assert_eq!(
            (start, end),
            (1_795_625_216_411_211_295, 1_795_625_216_412_064_926)
        );
        assert_eq!(
            worker.map(|w| w.hex()).as_deref(),
            Some("84eb66b236c17db5c8488c841c1c969facaba5469607466e655c3e1f")
        );
        // Other export events go to the generic reader.
        let actor = r#"{"event_data":{"actor_id":"GrvJiCM83lGdzNZ4AQAAAA==","class_name":"C","job_id":"AQAAAA==","state":"ALIVE"},"event_id":"a","source_type":"EXPORT_ACTOR","timestamp":1795313302}"#;
        assert!(matches!(fact(actor).body, Body::ExportActor { .. }));
        // A field given twice is read the generic way (first value), not lost.
        let twice = r#"{"eventType":"TASK_DEFINITION_EVENT","eventType":"TASK_DEFINITION_EVENT","taskDefinitionEvent":{"taskId":"AQID","taskName":"f"}}"#;
        assert_eq!(task(fact(twice)).name.as_deref(), Some("f"));
    }
}
