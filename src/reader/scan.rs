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
            event_id: self.bounded_event_id(),
            event_type: Cow::Owned(bounded(event_type, MAX_FIELD_BYTES)),
            time_ns,
            seq,
            body,
        })
    }

    /// The hash of the line's event id, bounded as [`extract_ray_event`] bounds it; `None`
    /// for none or an empty one.
    fn bounded_event_id(&self) -> Option<u64> {
        self.event_id
            .as_deref()
            .filter(|i| !i.is_empty())
            .map(|i| event_id_hash("e:", &bounded(i, MAX_FIELD_BYTES)))
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
            event_id: self.bounded_event_id(),
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
mod tests;
