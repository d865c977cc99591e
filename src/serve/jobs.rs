//! `/api/jobs/` and `/api/jobs/{job_id}`: the session's jobs in the shapes of KubeRay's
//! history server, as Ray's own dashboard gives them, answered from the session's index
//! through [`super::session`]'s door (so with its `503` while the session loads and its
//! headers for what could not be read).
//!
//! `/api/jobs/`: KubeRay's job shape. `status` is what Ray's own dashboard says of a driver
//! job: `RUNNING` until its end was recorded (`CREATED`, or only its definition read),
//! `SUCCEEDED` once it finished (KubeRay answers an empty status for a finished driver);
//! always one of Ray's five ([`job_status`]), since Ray's client rejects the whole list for
//! one entry with another status. `metadata`
//! and `runtime_env` (an object) are the driver's config as its job events gave it (`null`
//! when they did not). As Ray's own `/api/jobs/` does, a job whose driver's metadata names a
//! submission (`job_submission_id`, set by the Job Submission API) is `type: SUBMISSION`
//! with that `submission_id`, and its submission record (`EXPORT_SUBMISSION_JOB`), when the
//! session has one, gives its `status` (when Ray knows it), `message`, `error_type`, times,
//! `driver_exit_code`, `driver_agent_http_address`, `metadata` and `runtime_env`; a
//! submission record no driver
//! names (a job that failed before its driver started) is listed too, with `job_id` and
//! `driver_info` null. A submission whose entrypoint ran several drivers
//! is one entry, its last driver (the highest job id), as Ray's `get_driver_jobs` keeps
//! it: the earlier drivers are neither listed nor found. Any other job is `type: DRIVER` with
//! `submission_id` `""`, and `end_time` `0` until an end was recorded (Ray's job table's
//! value for a driver not yet dead). `driver_info.node_ip_address` is the IP of the driver's node (its
//! definition event names the node, the node's definition event its IP), else
//! `EXPORT_DRIVER_JOB`'s `driver_ip_address`. What the session does not say is KubeRay's
//! empty value (`""`), but `driver_exit_code`, `null` unless a submission record gave it (as
//! Ray's `JobInfo`). The list is in Ray's order ([`listed_in_rays_order`]): the submitted
//! jobs first, then the driver jobs by job id. `/api/jobs/{id}` finds a job by its hex job
//! id, else by submission id.
//!
//! The list costs a bounded memory, whatever the session holds and however many clients ask:
//! its length is bounded first from its texts ([`jobs_text_bound`]), and a list large enough
//! to be counted ([`inflight::COUNTED_FROM`]) takes that room in the answers' budget
//! ([`inflight`]) before anything is built (a `503` with `Retry-After` without it); it is
//! built off the async workers, once for every request that wants it, sent from one buffer
//! to all of them, and kept while the session's index is unchanged, small and large lists
//! apart so a small one never waits behind large builds ([`JobLists`], at most
//! [`KEPT_JOB_LIST_BYTES`] in all); a list too large to keep is built only while someone
//! waits for it.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::cookies::Entered;
use super::inflight::{self, SharedAnswer};
use super::session::{answer, headers_for, index, unix_ms};
use super::Shared;
use crate::reader::{JobFacts, SubmissionFacts};
use crate::util::escape::{escape_message, escape_untrusted};

/// A runtime env's JSON text when it is an object, as Ray's `JobDetails` gives it (`None`,
/// answered `null`, when it is not one). Checked without building a tree: the text is
/// written into the answer as it is (up to 64 KiB a job, [`crate::reader`] bounds it), so
/// an answer of many jobs costs about its own size.
fn runtime_env_object(text: Option<&str>) -> Option<&RawValue> {
    let raw: &RawValue = serde_json::from_str(text?).ok()?;
    (raw.get().starts_with('{') && nesting(raw.get()) <= MAX_RUNTIME_ENV_NESTING).then_some(raw)
}

/// The deepest nesting a runtime env is answered with (serde_json's own limit when it parses
/// a value): a deeper one is answered `null`, as when it was parsed, since it would make the
/// whole list unreadable to clients that parse it (review r36p D1: a 2,000-level env, checked
/// only by `RawValue`'s scan, made Python's json fail on the whole `/api/jobs/` answer).
const MAX_RUNTIME_ENV_NESTING: usize = 128;

/// How deeply arrays and objects nest in `json` (valid JSON text).
fn nesting(json: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in json.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The runtime env a job's answer gives: its submission record's when that carried one,
/// else its driver's config's.
fn job_runtime_env(j: &JobFacts) -> Option<&RawValue> {
    match j.submission.as_ref().and_then(|s| s.runtime_env.as_deref()) {
        Some(text) => runtime_env_object(Some(text)),
        None => runtime_env_object(j.runtime_env.as_deref()),
    }
}

/// Appends `v` (a JSON object without a `runtime_env` member) to `out` with that member set
/// to `runtime_env`'s text as it is (`null` when `None`).
fn push_with_runtime_env(out: &mut String, v: &Value, runtime_env: Option<&RawValue>) {
    let text = v.to_string();
    match text.strip_suffix('}') {
        Some(head) => {
            out.push_str(head);
            if head.len() > 1 {
                out.push(',');
            }
            out.push_str("\"runtime_env\":");
            out.push_str(runtime_env.map_or("null", RawValue::get));
            out.push('}');
        }
        None => out.push_str(&text),
    }
}

/// A metadata map as JSON (`null` when no event carried one).
fn metadata_json(m: Option<&std::collections::BTreeMap<String, String>>) -> Value {
    m.map_or(Value::Null, |m| json!(m))
}

/// Sets in `v` what a submitted job's record (`EXPORT_SUBMISSION_JOB`) says of it, as Ray's
/// `JobDetails` of a `SUBMISSION` job takes it from its `JobInfo`, but its `status`, which
/// is not set here ([`job_status`] takes the record and the driver together).
fn with_submission(v: &mut Value, s: &SubmissionFacts) {
    v["type"] = json!("SUBMISSION");
    v["submission_id"] = json!(s.submission_id);
    for (key, value) in [
        ("entrypoint", &s.entrypoint),
        ("message", &s.message),
        ("error_type", &s.error_type),
        ("driver_node_id", &s.driver_node_id),
        ("driver_agent_http_address", &s.driver_agent_http_address),
    ] {
        if let Some(value) = value {
            v[key] = json!(value);
        }
    }
    if let Some(code) = s.driver_exit_code {
        v["driver_exit_code"] = json!(code);
    }
    if s.metadata.is_some() {
        v["metadata"] = metadata_json(s.metadata.as_ref());
    }
    if let Some(ms) = s.started_ms {
        v["start_time"] = json!(ms);
    }
    if let Some(ms) = s.ended_ms {
        v["end_time"] = json!(ms);
    }
}

/// The session's node IPs by node id (`NODE_DEFINITION_EVENT`'s `node_ip_address`, or
/// `EXPORT_NODE`'s): where a driver's IP is found from its node.
pub(super) type NodeIps<'a> = std::collections::HashMap<&'a str, &'a str>;

/// [`NodeIps`] of the session's nodes.
pub(super) fn node_ips(facts: &crate::reader::SessionFacts) -> NodeIps<'_> {
    facts
        .nodes
        .iter()
        .filter_map(|n| Some((n.node_id.as_str(), n.ip.as_deref()?)))
        .collect()
}

/// The driver's node IP as Ray's `driver_info.node_ip_address` gives it (the job table's
/// driver address): the IP of the node its `DRIVER_JOB_DEFINITION_EVENT` names
/// (`driver_node_id`; the event has no IP of its own), else `EXPORT_DRIVER_JOB`'s
/// `driver_ip_address`; `None` when the session says neither.
fn driver_ip<'a>(j: &'a JobFacts, ips: &NodeIps<'a>) -> Option<&'a str> {
    j.driver_node_id
        .as_deref()
        .and_then(|id| ips.get(id).copied())
        .or(j.driver_ip.as_deref())
}

/// A job in KubeRay's shape, with what Ray's `/api/jobs/` adds from the job's config: a
/// driver whose metadata names a submission id is a `SUBMISSION` job with that
/// `submission_id`, its status, message, error type, times, exit code and config from its
/// submission record when the session has one; any other is a `DRIVER` job. Its
/// `runtime_env` as a tree: for one job (a Train run's); lists write it as text
/// ([`push_job`]).
pub(super) fn job_json(j: &JobFacts, ips: &NodeIps<'_>) -> Value {
    let mut v = job_fields(j, ips);
    v["runtime_env"] = job_runtime_env(j)
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
        .unwrap_or(Value::Null);
    v
}

/// Appends a job's answer ([`job_json`]) to `out`, its runtime env as the stored text.
fn push_job(out: &mut String, j: &JobFacts, ips: &NodeIps<'_>) {
    push_with_runtime_env(out, &job_fields(j, ips), job_runtime_env(j));
}

/// Appends a submitted job's answer without a driver ([`submission_fields`]) to `out`.
fn push_submission(out: &mut String, s: &SubmissionFacts) {
    push_with_runtime_env(
        out,
        &submission_fields(s),
        runtime_env_object(s.runtime_env.as_deref()),
    );
}

/// Ray's job statuses (its `JobStatus`): Ray's `JobDetails` takes no other, and Ray's
/// `JobSubmissionClient.list_jobs` rejects the whole list for one entry with another
/// (review r36q D2).
const RAY_JOB_STATUSES: [&str; 5] = ["PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"];

/// A job's `status`, always one of [`RAY_JOB_STATUSES`]: its submission record's, when it
/// has a record whose status Ray knows; else by Ray's head's rule for a driver job (its job
/// table: `RUNNING` until the driver is marked dead, then `SUCCEEDED`), read as "until an end
/// was recorded": the driver's `FINISHED`, its end time, or the record's end time. So a job
/// known only from its definition event, or from a lifecycle event that was not read, is
/// `RUNNING` (without an end) where it was `""`; a record whose status is missing, not a
/// string or not Ray's (`BOGUS`) is answered by the same rule, its raw value dropped (Ray's
/// `JobDetails` has no field for it), except that an ended job whose record shows it failed
/// (a non-zero `driver_exit_code`, or an `error_type`) is `FAILED`, not `SUCCEEDED` (review
/// r36r D2).
fn job_status(driver: Option<&JobFacts>, record: Option<&SubmissionFacts>) -> &'static str {
    if let Some(known) = record
        .and_then(|s| s.status.as_deref())
        .and_then(|s| RAY_JOB_STATUSES.into_iter().find(|k| *k == s))
    {
        return known;
    }
    let ended = driver.is_some_and(|j| j.state == "FINISHED" || j.ended.is_some())
        || record.is_some_and(|s| s.ended_ms.is_some());
    let failed = record.is_some_and(|s| {
        s.driver_exit_code.is_some_and(|c| c != 0)
            || s.error_type.as_deref().is_some_and(|e| !e.is_empty())
    });
    if ended && failed {
        "FAILED"
    } else if ended {
        "SUCCEEDED"
    } else {
        "RUNNING"
    }
}

/// [`job_json`] without `runtime_env`.
fn job_fields(j: &JobFacts, ips: &NodeIps<'_>) -> Value {
    let status = job_status(Some(j), j.submission.as_ref());
    // The exit code only when a submission record gave it: Ray's `JobInfo` has it optional
    // (`null` until the driver exits), and a driver job has none (review r36q D3: `0` was
    // claimed for a job still running, or failed without one).
    let mut v = json!({
        "driver_exit_code": null,
        "driver_node_id": j.driver_node_id.clone().unwrap_or_default(),
        "driver_agent_http_address": "",
        "metadata": metadata_json(j.metadata.as_ref()),
        "error_type": "",
        "message": "",
        "entrypoint": j.entrypoint.clone().unwrap_or_default(),
        "status": status,
        "driver_info": {
            "id": j.job_id,
            "node_ip_address": driver_ip(j, ips).unwrap_or_default(),
            "pid": j.driver_pid.map(|p| p.to_string()).unwrap_or_default(),
        },
        "job_id": j.job_id,
        "submission_id": j.submission_id.clone().unwrap_or_default(),
        "type": if j.submission_id.is_some() { "SUBMISSION" } else { "DRIVER" },
        // Ray's `JobDetails` always has both: a driver job's `end_time` is its job table's,
        // `0` until the driver is marked dead; a submitted job's, its record's (`null`
        // without one).
        "start_time": null,
        "end_time": if j.submission_id.is_some() { Value::Null } else { json!(0) },
    });
    if let Some(ms) = j.started.as_deref().and_then(unix_ms) {
        v["start_time"] = json!(ms);
    }
    if let Some(ms) = j.ended.as_deref().and_then(unix_ms) {
        v["end_time"] = json!(ms);
    }
    if let Some(s) = &j.submission {
        with_submission(&mut v, s);
    }
    v
}

/// A submitted job no driver job of the session names, as Ray lists it: `job_id` and
/// `driver_info` null; without `runtime_env` ([`push_submission`] adds it).
fn submission_fields(s: &SubmissionFacts) -> Value {
    let mut v = json!({
        "driver_exit_code": null,
        "driver_node_id": "",
        "driver_agent_http_address": "",
        "metadata": null,
        "error_type": "",
        "message": "",
        "entrypoint": "",
        "status": job_status(None, Some(s)),
        "driver_info": null,
        "job_id": null,
        "submission_id": "",
        "type": "SUBMISSION",
        "start_time": null,
        "end_time": null,
    });
    with_submission(&mut v, s);
    v
}

/// Bytes of a job's entry in the list besides its texts: the member names and punctuation
/// (about 330 bytes), a status, two times, a pid and an exit code (20 digits at most each).
const JOB_ENTRY_BYTES: usize = 512;

/// The length of `s` written as a JSON string at most, quotes included (serde_json escapes
/// a quote, a backslash and a control character, in at most 6 bytes).
fn json_len(s: &str) -> usize {
    2 + s.len()
        + 5 * s
            .bytes()
            .filter(|b| *b < 0x20 || *b == b'"' || *b == b'\\')
            .count()
}

/// [`json_len`] of the longer of two optional texts (a record's field replaces its
/// driver's).
fn either_len(a: Option<&String>, b: Option<&String>) -> usize {
    a.map_or(0, |a| json_len(a))
        .max(b.map_or(0, |b| json_len(b)))
}

/// The length of a metadata map as JSON at most.
fn metadata_len(m: Option<&std::collections::BTreeMap<String, String>>) -> usize {
    m.map_or(4, |m| {
        2 + m
            .iter()
            .map(|(k, v)| json_len(k) + json_len(v) + 2)
            .sum::<usize>()
    })
}

/// What a submission record adds to its entry at most, besides its metadata and runtime
/// env.
fn record_len(s: &SubmissionFacts) -> usize {
    json_len(&s.submission_id)
        + [
            &s.entrypoint,
            &s.message,
            &s.error_type,
            &s.driver_node_id,
            &s.driver_agent_http_address,
        ]
        .into_iter()
        .map(|f| f.as_deref().map_or(0, json_len))
        .sum::<usize>()
}

/// The length of the `/api/jobs/` answer ([`jobs_text_until`]) at most, from the sizes of the
/// texts it will write: the room its build takes before it starts (review r36q D1), and the
/// capacity it is written into (so it is never copied to grow).
fn jobs_text_bound(facts: &crate::reader::SessionFacts) -> usize {
    let env_len = |text: Option<&String>| text.map_or(4, String::len);
    let ips = node_ips(facts);
    let jobs: usize = facts
        .jobs
        .iter()
        .filter(|j| !j.superseded)
        .map(|j| {
            let s = j.submission.as_ref();
            JOB_ENTRY_BYTES
                + 2 * json_len(&j.job_id)
                + driver_ip(j, &ips).map_or(0, json_len)
                + either_len(j.entrypoint.as_ref(), s.and_then(|s| s.entrypoint.as_ref()))
                + either_len(
                    j.driver_node_id.as_ref(),
                    s.and_then(|s| s.driver_node_id.as_ref()),
                )
                + j.submission_id.as_deref().map_or(0, json_len)
                + s.map_or(0, record_len)
                + match s.and_then(|s| s.metadata.as_ref()) {
                    Some(m) => metadata_len(Some(m)),
                    None => metadata_len(j.metadata.as_ref()),
                }
                + match s.and_then(|s| s.runtime_env.as_ref()) {
                    Some(text) => env_len(Some(text)),
                    None => env_len(j.runtime_env.as_ref()),
                }
        })
        .sum();
    let submissions: usize = facts
        .unmatched_submissions
        .iter()
        .map(|s| {
            JOB_ENTRY_BYTES
                + record_len(s)
                + metadata_len(s.metadata.as_ref())
                + env_len(s.runtime_env.as_ref())
        })
        .sum();
    2 + jobs + submissions
}

/// [`jobs_text_until`] to its end (the tests' way in).
#[cfg(test)]
fn jobs_text(facts: &crate::reader::SessionFacts, capacity: usize) -> String {
    jobs_text_until(facts, capacity, &|| false).unwrap_or_default()
}

/// How many entries [`jobs_text_until`] writes between two looks at whether to stop.
const STOP_LOOK_EVERY: usize = 256;

/// How many bytes [`jobs_text_until`] writes at most between two looks at whether to stop.
const STOP_LOOK_BYTES: usize = 4 << 20;

/// An entry of the `/api/jobs/` list: a job with its driver, or a submitted job without one.
#[derive(Clone, Copy)]
enum Listed<'a> {
    Job(&'a JobFacts),
    Submission(&'a SubmissionFacts),
}

/// Where a submitted job goes among the submitted jobs: by start time (its record's, else its
/// driver's; none last), then submission id, then job id. Ray lists them in the order its
/// GCS's key-value store gives their keys (`JobInfoStorageClient.get_all_jobs`: a hash
/// map's iteration order, which changes from run to run and is in no event), so no order
/// from the bucket can be Ray's; this one is stable and reads as the submissions came.
fn submission_order<'a>(e: &Listed<'a>) -> (bool, i64, &'a str, &'a str) {
    let (started, submission_id, job_id) = match *e {
        Listed::Job(j) => (
            j.submission
                .as_ref()
                .and_then(|s| s.started_ms)
                .or_else(|| j.started.as_deref().and_then(unix_ms)),
            j.submission_id.as_deref().unwrap_or_default(),
            j.job_id.as_str(),
        ),
        Listed::Submission(s) => (s.started_ms, s.submission_id.as_str(), ""),
    };
    (
        started.is_none(),
        started.unwrap_or(0),
        submission_id,
        job_id,
    )
}

/// The `/api/jobs/` list's entries in Ray's order (its job head's `list_jobs`): the
/// submitted jobs first, with a driver or not ([`submission_order`]), then the driver jobs
/// by job id (Ray's `get_driver_jobs` sorts the job table by hex job id). Costs a reference
/// and a key per submitted job, none per driver job.
fn listed_in_rays_order(
    facts: &crate::reader::SessionFacts,
) -> impl Iterator<Item = Listed<'_>> + '_ {
    let listed = || facts.jobs.iter().filter(|j| !j.superseded);
    let mut submitted: Vec<Listed<'_>> = listed()
        .filter(|j| j.submission_id.is_some())
        .map(Listed::Job)
        .chain(facts.unmatched_submissions.iter().map(Listed::Submission))
        .collect();
    // Each key once (a driver's start time is parsed from its text), not per comparison:
    // review r36x D1, 3.4 M parses for 100,000 submitted jobs, seconds of a build that could
    // not be given up.
    submitted.sort_by_cached_key(submission_order);
    let drivers = listed()
        .filter(|j| j.submission_id.is_none())
        .map(Listed::Job);
    submitted.into_iter().chain(drivers)
}

/// The `/api/jobs/` answer: the session's jobs in Ray's order ([`listed_in_rays_order`]),
/// written one job at a time into the text (no tree of the whole answer), in a
/// string of `capacity` bytes ([`jobs_text_bound`]); given up (`None`) as soon as `stop`
/// says so (looked at every [`STOP_LOOK_EVERY`] entries and [`STOP_LOOK_BYTES`] bytes): a
/// list that will not be kept is not built on for nobody (review r36s E2: the build of a
/// 264 MiB list whose clients had all left ran to its end, holding the whole answers'
/// budget, and was thrown away).
fn jobs_text_until(
    facts: &crate::reader::SessionFacts,
    capacity: usize,
    stop: &dyn Fn() -> bool,
) -> Option<String> {
    let mut out = String::with_capacity(capacity);
    out.push('[');
    let mut first = true;
    let mut sep = |out: &mut String| {
        if !std::mem::take(&mut first) {
            out.push(',');
        }
    };
    // Looked at every STOP_LOOK_EVERY entries and every STOP_LOOK_BYTES written, whichever
    // comes first (review r36t F1: 250 entries of 645 KB each, 154 MiB, were never looked at).
    let (mut written, mut next_bytes) = (0usize, STOP_LOOK_BYTES);
    let mut look = |len: usize| {
        written += 1;
        if written.is_multiple_of(STOP_LOOK_EVERY) || len >= next_bytes {
            next_bytes = len + STOP_LOOK_BYTES;
            return stop();
        }
        false
    };
    let ips = node_ips(facts);
    for entry in listed_in_rays_order(facts) {
        if look(out.len()) {
            return None;
        }
        sep(&mut out);
        match entry {
            Listed::Job(j) => push_job(&mut out, j, &ips),
            Listed::Submission(s) => push_submission(&mut out, s),
        }
    }
    out.push(']');
    out.shrink_to_fit();
    Some(out)
}

/// The error of a job list build every request left (answered to nobody).
const LEFT: &str = "every request for this job list left";

/// Large job lists built at once (of different sessions: requests for the same session's
/// list share one build). Each also takes its size from the answers' budget before it starts.
pub const CONCURRENT_JOB_LIST_BUILDS: usize = 2;

/// A list whose bound ([`jobs_text_bound`]) is under this is small: small lists are built
/// under permits of their own ([`CONCURRENT_SMALL_JOB_LIST_BUILDS`]) and kept apart, so a
/// session of a few jobs never waits behind other sessions' large builds (review r36r D3).
pub const SMALL_JOB_LIST: usize = 1 << 20;

/// Small job lists built at once.
pub const CONCURRENT_SMALL_JOB_LIST_BUILDS: usize = 2;

/// Small job lists kept (one per session, the oldest dropped first): under 16 MiB in all.
pub const KEPT_SMALL_JOB_LISTS: usize = 16;

/// Large job lists kept (one per session, the oldest dropped first).
pub const KEPT_JOB_LISTS: usize = 2;

/// The largest job list kept: a larger one is answered to the requests that waited for its
/// build, then dropped (the next request builds it again). So kept lists hold at most
/// [`KEPT_JOB_LIST_BYTES`] (review r36r D1: two kept lists of 514 MiB beside a 205 MB cache).
pub const MAX_KEPT_JOB_LIST: usize = 24 << 20;

/// What kept job lists hold at most: [`KEPT_SMALL_JOB_LISTS`] under [`SMALL_JOB_LIST`] and
/// [`KEPT_JOB_LISTS`] of at most [`MAX_KEPT_JOB_LIST`].
pub const KEPT_JOB_LIST_BYTES: usize =
    KEPT_SMALL_JOB_LISTS * SMALL_JOB_LIST + KEPT_JOB_LISTS * MAX_KEPT_JOB_LIST;
const _: () = assert!(
    KEPT_JOB_LIST_BYTES == 64 << 20,
    "docs/inspect.md says 64 MiB"
);

/// The sessions' job lists: built once for the requests that want one, kept while the
/// session's index is unchanged, small and large ones apart ([`SMALL_JOB_LIST`]).
pub(crate) struct JobLists {
    small: Arc<super::kept::Kept<SharedAnswer, JobListError>>,
    large: Arc<super::kept::Kept<SharedAnswer, JobListError>>,
}

impl JobLists {
    /// Builds started so far, small and large.
    pub(crate) fn builds_started(&self) -> u64 {
        self.small.builds_started() + self.large.builds_started()
    }
}

/// A new [`JobLists`].
pub(crate) fn job_lists() -> Arc<JobLists> {
    Arc::new(JobLists {
        small: Arc::new(super::kept::Kept::new(
            CONCURRENT_SMALL_JOB_LIST_BUILDS,
            KEPT_SMALL_JOB_LISTS,
            None,
        )),
        large: Arc::new(super::kept::Kept::new(
            CONCURRENT_JOB_LIST_BUILDS,
            KEPT_JOB_LISTS,
            None,
        )),
    })
}

/// Why a job list is not kept: the answers' budget had no room for it (a `503` with
/// `Retry-After`, before anything was built; `bound` is the list's), the build failed (a
/// `500`), or it was built but is larger than [`MAX_KEPT_JOB_LIST`] (the answer of the
/// requests that waited for the build, not kept).
#[derive(Clone)]
pub(crate) enum JobListError {
    Busy { bound: usize },
    Failed(String),
    NotKept(Arc<SharedAnswer>),
}

impl From<String> for JobListError {
    fn from(e: String) -> Self {
        JobListError::Failed(e)
    }
}

/// The `503` of a job list that found no room in the answers' budget: one larger than the
/// whole budget says so (it is built only when no other counted answer is in flight).
fn job_list_busy(bound: usize) -> Response {
    let mut busy = inflight::busy();
    if bound > inflight::MAX_ANSWER_BYTES_IN_FLIGHT {
        *busy.body_mut() = Body::from(format!(
            "this session's job list may take {} MiB, more than the {} MiB of answers in \
             flight: it is built only when no other large answer is in flight; try again",
            bound.div_ceil(1 << 20),
            inflight::MAX_ANSWER_BYTES_IN_FLIGHT >> 20
        ));
    }
    busy
}

/// `GET /api/jobs/`: [`jobs_text_until`], built once for every request that wants it while it is
/// built, and kept while the session's index is unchanged ([`JobLists`]; one larger than
/// [`MAX_KEPT_JOB_LIST`] is not kept); made off the async workers (a session of many jobs
/// with large runtime envs makes a large answer) after its bound ([`jobs_text_bound`]) took
/// room in the answers' budget (the whole budget for a list whose bound is larger, so it is
/// built alone), and sent from one buffer to every request ([`SharedAnswer`]). Without room,
/// a `503` with `Retry-After` before anything is built (review r36q D1: twelve concurrent
/// requests each built their own 70 MB copy, and took serve to 1 GiB).
pub async fn jobs(State(state): State<Shared>, entered: Entered) -> Response {
    let index = match index(&state, &entered).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let key = entered.session.marker_key(&state.bucket.spec.root);
    let (budget, built) = (state.answers.clone(), Arc::clone(&index));
    let session = entered.session.session.clone();
    // Found once per index, off the async workers (review r36u G1: every request scanned every
    // job's texts on a worker first, so eight requests for a 161 MB list held both workers and
    // `/livez` and a 505-byte list of another session waited up to 5 s).
    let bound = match index.jobs_bound.get() {
        Some(&b) => b,
        None => {
            let scanned = Arc::clone(&index);
            match tokio::task::spawn_blocking(move || {
                *scanned
                    .jobs_bound
                    .get_or_init(|| jobs_text_bound(&scanned.facts))
            })
            .await
            {
                Ok(b) => b,
                Err(e) => {
                    return entered.refresh((
                        StatusCode::INTERNAL_SERVER_ERROR,
                        escape_message(&format!("making the job list: {e}")),
                    ))
                }
            }
        }
    };
    let lists = match bound < SMALL_JOB_LIST {
        true => &state.job_lists.small,
        false => &state.job_lists.large,
    };
    let list = lists
        .get_or_build(key, 0, &index, move |wanted| async move {
            // An answer too small to be counted while sent takes no room to be built either
            // (review r36s E1: a 505-byte list was refused while a list the size of the whole
            // budget was in flight).
            let room = match bound < inflight::COUNTED_FROM {
                true => None,
                false => {
                    Some(inflight::reserve(&budget, bound).ok_or(JobListError::Busy { bound })?)
                }
            };
            // A list that will not be kept is built only while someone waits for it.
            let keepable = bound <= MAX_KEPT_JOB_LIST;
            let wanted = Arc::new(wanted);
            if !keepable && wanted.abandoned() {
                return Err(JobListError::Failed(LEFT.to_string()));
            }
            let started = std::time::Instant::now();
            let (text, room) = tokio::task::spawn_blocking(move || {
                let stop = || !keepable && wanted.abandoned();
                (jobs_text_until(&built.facts, bound, &stop), room)
            })
            .await
            .map_err(|e| JobListError::Failed(e.to_string()))?;
            let Some(text) = text else {
                return Err(JobListError::Failed(LEFT.to_string()));
            };
            let kept = text.len() <= MAX_KEPT_JOB_LIST;
            tracing::info!(
                session = %escape_untrusted(&session),
                bytes = text.len(),
                bound,
                kept,
                seconds = started.elapsed().as_secs_f64(),
                "job list built"
            );
            match kept {
                true => Ok(SharedAnswer::new(Bytes::from(text))),
                // Its requests wait for it: the room of the build is the first's to send it.
                false => Err(JobListError::NotKept(Arc::new(SharedAnswer::holding(
                    Bytes::from(text),
                    room,
                )))),
            }
        })
        .await;
    match list {
        Ok(list) | Err(JobListError::NotKept(list)) => {
            entered.refresh(list.response(&state.answers, headers_for(&index)))
        }
        Err(JobListError::Busy { bound }) => entered.refresh(job_list_busy(bound)),
        Err(JobListError::Failed(e)) => entered.refresh((
            StatusCode::INTERNAL_SERVER_ERROR,
            escape_message(&format!("making the job list: {e}")),
        )),
    }
}

/// `GET /api/jobs/{id}`: one job by its hex job id or its submission id, as Ray finds it;
/// an unknown one is a `404` (KubeRay answers `200` with the text "Job … does not exist").
pub async fn job(
    State(state): State<Shared>,
    entered: Entered,
    Path(job_id): Path<String>,
) -> Response {
    let index = match index(&state, &entered).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let facts = &index.facts;
    let listed = || facts.jobs.iter().filter(|j| !j.superseded);
    let mut out = String::new();
    if let Some(j) = listed()
        .find(|j| j.job_id == job_id)
        .or_else(|| listed().find(|j| j.submission_id.as_deref() == Some(&*job_id)))
    {
        push_job(&mut out, j, &node_ips(facts));
    } else if let Some(s) = facts
        .unmatched_submissions
        .iter()
        .find(|s| s.submission_id == job_id)
    {
        push_submission(&mut out, s);
    }
    match out.is_empty() {
        false => answer(&entered, &index, out),
        true => entered.refresh((
            StatusCode::NOT_FOUND,
            format!("Job {} does not exist", escape_untrusted(&job_id)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_list_embeds_each_runtime_env_text_unchanged() {
        use crate::reader::SessionFacts;
        // Spacing and key order as Ray serialized them, which a tree would not keep.
        let env = "{\"pip\": [\"emoji\"],  \"env_vars\": {\"B\": \"2\", \"A\": \"1\"}}";
        let big = format!("{{\"env_vars\": {{\"X\": \"{}\"}}}}", "y".repeat(60 << 10));
        let job = |id: &str, runtime_env: &str| JobFacts {
            job_id: id.into(),
            state: "CREATED".into(),
            entrypoint: None,
            driver_pid: None,
            driver_node_id: None,
            driver_ip: None,
            started: None,
            ended: None,
            recorded: true,
            metadata: None,
            runtime_env: Some(runtime_env.into()),
            submission_id: None,
            submission: None,
            superseded: false,
        };
        let facts = SessionFacts {
            jobs: vec![
                job("01000000", env),
                job("02000000", &big),
                job("03000000", "[1]"),
            ],
            unmatched_submissions: vec![SubmissionFacts {
                submission_id: "raysubmit_2".into(),
                runtime_env: Some(env.into()),
                ..SubmissionFacts::default()
            }],
            ..SessionFacts::default()
        };
        let text = jobs_text(&facts, jobs_text_bound(&facts));
        assert_eq!(text.matches(env).count(), 2, "{text}");
        assert!(text.contains(&big));
        let jobs: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(jobs.as_array().unwrap().len(), 4);
        // The submitted job first, as Ray lists them.
        assert_eq!(jobs[0]["submission_id"], "raysubmit_2");
        assert_eq!(jobs[0]["runtime_env"], jobs[1]["runtime_env"]);
        assert_eq!(jobs[1]["runtime_env"]["env_vars"]["A"], "1");
        assert_eq!(jobs[1]["job_id"], "01000000");
        assert_eq!(jobs[3]["runtime_env"], Value::Null, "not an object");
        // A job's answer is its list entry.
        let mut one = String::new();
        let ips = node_ips(&facts);
        push_job(&mut one, &facts.jobs[0], &ips);
        assert_eq!(serde_json::from_str::<Value>(&one).unwrap(), jobs[1]);
        assert_eq!(job_json(&facts.jobs[0], &ips), jobs[1]);
    }

    /// A driver job as the fold leaves it: `state`, an end time or none, no record.
    fn driver(id: &str, state: &str, ended: Option<&str>) -> JobFacts {
        JobFacts {
            job_id: id.into(),
            state: state.into(),
            entrypoint: None,
            driver_pid: None,
            driver_node_id: None,
            driver_ip: None,
            started: None,
            ended: ended.map(Into::into),
            recorded: true,
            metadata: None,
            runtime_env: None,
            submission_id: None,
            submission: None,
            superseded: false,
        }
    }

    /// Review r36q D2, D3: every entry's `status` is one of Ray's five, by the record when
    /// Ray knows its status, else by Ray's head's rule (`RUNNING` until an end was
    /// recorded); `driver_exit_code` is the record's, `null` without one.
    #[test]
    fn statuses_are_rays_and_an_unknown_exit_code_is_null() {
        use crate::reader::SessionFacts;
        let end = "1970-01-01T00:00:09Z";
        let record = |id: &str, status: Option<&str>, ended_ms: Option<i64>, code: Option<i64>| {
            SubmissionFacts {
                submission_id: id.into(),
                status: status.map(Into::into),
                ended_ms,
                driver_exit_code: code,
                ..SubmissionFacts::default()
            }
        };
        let submitted = |mut j: JobFacts, s: Option<SubmissionFacts>| {
            j.submission_id = Some(format!("raysubmit_{}", j.job_id));
            j.submission = s;
            j
        };
        // (entry, expected status, expected exit code)
        let cases: Vec<(JobFacts, &str, Value)> = vec![
            (driver("01000000", "CREATED", None), "RUNNING", Value::Null),
            (
                driver("02000000", "FINISHED", Some(end)),
                "SUCCEEDED",
                Value::Null,
            ),
            // Only its definition read: no state, no end.
            (driver("03000000", "UNKNOWN", None), "RUNNING", Value::Null),
            // Only its lifecycle's end read.
            (
                driver("04000000", "UNKNOWN", Some(end)),
                "SUCCEEDED",
                Value::Null,
            ),
            (driver("05000000", "", None), "RUNNING", Value::Null),
            // Submitted, no record.
            (
                submitted(driver("06000000", "UNKNOWN", None), None),
                "RUNNING",
                Value::Null,
            ),
            // The record's status, when Ray knows it, over the driver's.
            (
                submitted(
                    driver("07000000", "FINISHED", Some(end)),
                    Some(record("s7", Some("FAILED"), Some(9), None)),
                ),
                "FAILED",
                Value::Null,
            ),
            (
                submitted(
                    driver("08000000", "CREATED", None),
                    Some(record("s8", Some("RUNNING"), None, None)),
                ),
                "RUNNING",
                Value::Null,
            ),
            (
                submitted(
                    driver("09000000", "FINISHED", Some(end)),
                    Some(record("s9", Some("SUCCEEDED"), Some(9), Some(0))),
                ),
                "SUCCEEDED",
                json!(0),
            ),
            (
                submitted(
                    driver("0a000000", "FINISHED", None),
                    Some(record("s10", Some("FAILED"), Some(9), Some(3))),
                ),
                "FAILED",
                json!(3),
            ),
            // A status Ray does not know, or none: the driver's rule.
            (
                submitted(
                    driver("0b000000", "CREATED", None),
                    Some(record("s11", Some("BOGUS"), None, None)),
                ),
                "RUNNING",
                Value::Null,
            ),
            (
                submitted(
                    driver("0c000000", "UNKNOWN", None),
                    Some(record("s12", None, Some(9), None)),
                ),
                "SUCCEEDED",
                Value::Null,
            ),
            (
                submitted(
                    driver("0d000000", "FINISHED", None),
                    Some(record("s13", Some("succeeded"), None, None)),
                ),
                "SUCCEEDED",
                Value::Null,
            ),
            // Review r36r D2: ended, and the record shows it failed: FAILED.
            (
                submitted(
                    driver("0e000000", "FINISHED", Some(end)),
                    Some(record("s14", Some("BOGUS"), None, Some(1))),
                ),
                "FAILED",
                json!(1),
            ),
            (
                submitted(
                    driver("0f000000", "UNKNOWN", None),
                    Some(SubmissionFacts {
                        error_type: Some("JOB_ENTRYPOINT_COMMAND_ERROR".into()),
                        ..record("s15", None, Some(9), None)
                    }),
                ),
                "FAILED",
                Value::Null,
            ),
            // A zero exit code, or an empty error type, is no failure.
            (
                submitted(
                    driver("10000000", "FINISHED", None),
                    Some(SubmissionFacts {
                        error_type: Some(String::new()),
                        ..record("s16", Some("done"), None, Some(0))
                    }),
                ),
                "SUCCEEDED",
                json!(0),
            ),
            // Not ended: RUNNING whatever the record says of failure.
            (
                submitted(
                    driver("11000000", "CREATED", None),
                    Some(record("s17", Some("BOGUS"), None, Some(1))),
                ),
                "RUNNING",
                json!(1),
            ),
        ];
        let facts = SessionFacts {
            jobs: cases.iter().map(|c| c.0.clone()).collect(),
            unmatched_submissions: vec![
                record("raysubmit_a", Some("PENDING"), None, None),
                record("raysubmit_b", None, None, None),
                record("raysubmit_c", Some(""), Some(5), None),
                record("raysubmit_d", Some("BOGUS"), None, Some(1)),
                record("raysubmit_e", Some("BOGUS"), Some(5), Some(1)),
            ],
            ..SessionFacts::default()
        };
        let jobs: Value = serde_json::from_str(&jobs_text(&facts, 0)).unwrap();
        let jobs = jobs.as_array().unwrap();
        assert_eq!(jobs.len(), cases.len() + facts.unmatched_submissions.len());
        for (j, status, code) in &cases {
            let entry = jobs.iter().find(|e| e["job_id"] == j.job_id).unwrap();
            assert_eq!(entry["status"], *status, "{entry}");
            assert_eq!(entry["driver_exit_code"], *code, "{entry}");
            assert_eq!(job_json(j, &NodeIps::new())["status"], *status);
        }
        let mut unmatched: Vec<(&str, &str, Value)> = jobs
            .iter()
            .filter(|e| e["job_id"].is_null())
            .map(|e| {
                (
                    e["submission_id"].as_str().unwrap(),
                    e["status"].as_str().unwrap(),
                    e["driver_exit_code"].clone(),
                )
            })
            .collect();
        unmatched.sort_by_key(|u| u.0);
        let unmatched: Vec<(&str, Value)> = unmatched.into_iter().map(|u| (u.1, u.2)).collect();
        assert_eq!(
            unmatched,
            [
                ("PENDING", Value::Null),
                ("RUNNING", Value::Null),
                ("SUCCEEDED", Value::Null),
                ("RUNNING", json!(1)),
                ("FAILED", json!(1)),
            ]
        );
        assert!(jobs
            .iter()
            .all(|e| RAY_JOB_STATUSES.contains(&e["status"].as_str().unwrap())));
    }

    /// Review r36q D1: the room a job list's build takes is at least the list's length,
    /// whatever its texts (escapes take up to 6 bytes a character), and not far above it.
    #[test]
    fn the_job_list_bound_covers_its_text() {
        use crate::reader::SessionFacts;
        let nasty = "\u{1}\"\\\n".repeat(200);
        let metadata: std::collections::BTreeMap<String, String> = (0..64)
            .map(|i| (format!("{nasty}{i}"), nasty.clone()))
            .collect();
        let env = format!("{{\"env_vars\": {{\"X\": \"{}\"}}}}", "y".repeat(6500));
        let full = SubmissionFacts {
            submission_id: nasty.clone(),
            status: Some(nasty.clone()),
            entrypoint: Some(nasty.clone()),
            message: Some(nasty.clone()),
            error_type: Some(nasty.clone()),
            started_ms: Some(i64::MIN),
            ended_ms: Some(i64::MIN),
            metadata: Some(metadata.clone()),
            runtime_env: Some(env.clone()),
            driver_node_id: Some(nasty.clone()),
            driver_agent_http_address: Some(nasty.clone()),
            driver_exit_code: Some(i64::MIN),
        };
        let mut j = driver(&nasty, &nasty, Some("1970-01-01T00:00:09.999Z"));
        j.entrypoint = Some(nasty.clone());
        j.driver_pid = Some(i64::MIN);
        j.driver_node_id = Some(nasty.clone());
        j.started = Some("1970-01-01T00:00:01.5Z".into());
        j.metadata = Some(metadata);
        j.runtime_env = Some(env.clone());
        j.submission_id = Some(nasty.clone());
        let mut with_record = j.clone();
        with_record.submission = Some(full.clone());
        let plain = {
            let mut p = driver("01000000", "CREATED", None);
            p.runtime_env = Some(env.clone());
            p
        };
        for facts in [
            SessionFacts::default(),
            SessionFacts {
                jobs: vec![j, with_record, plain.clone()],
                unmatched_submissions: vec![full, SubmissionFacts::default()],
                ..SessionFacts::default()
            },
            SessionFacts {
                jobs: vec![plain; 100],
                ..SessionFacts::default()
            },
        ] {
            let bound = jobs_text_bound(&facts);
            let text = jobs_text(&facts, bound);
            assert!(bound >= text.len(), "{bound} < {}", text.len());
            let entries = facts.jobs.len() + facts.unmatched_submissions.len();
            assert!(bound <= text.len() * 6 + JOB_ENTRY_BYTES * entries + 2);
            if facts.unmatched_submissions.is_empty() && !facts.jobs.is_empty() {
                // Plain jobs: within the fixed part of each entry.
                assert!(
                    bound - text.len() <= JOB_ENTRY_BYTES * entries,
                    "{bound} {}",
                    text.len()
                );
            }
        }
    }

    /// Issue 36 (f36q): the list is in Ray's order, the submitted jobs first (by start time
    /// here: Ray's is its key-value store's hash order), then the driver jobs by job id; each
    /// driver's `node_ip_address` is its node's IP, else `EXPORT_DRIVER_JOB`'s, else `""`.
    #[test]
    fn the_list_is_in_rays_order_and_names_each_drivers_node_ip() {
        use crate::reader::{NodeFacts, SessionFacts};
        let node = |id: &str, ip: Option<&str>| NodeFacts {
            node_id: id.into(),
            ip: ip.map(Into::into),
            hostname: None,
            is_head: None,
            state: None,
            started: None,
            ended: None,
            death_reason: None,
            death_message: None,
            resources: Default::default(),
        };
        let on = |mut j: JobFacts, node: Option<&str>, ip: Option<&str>| {
            j.driver_node_id = node.map(Into::into);
            j.driver_ip = ip.map(Into::into);
            j
        };
        let submitted = |mut j: JobFacts, id: &str, started_ms: Option<i64>| {
            j.submission_id = Some(id.into());
            j.submission = started_ms.map(|ms| SubmissionFacts {
                submission_id: id.into(),
                started_ms: Some(ms),
                ..SubmissionFacts::default()
            });
            j
        };
        let mut started_at_100ms = driver("04000000", "CREATED", None);
        started_at_100ms.started = Some("1970-01-01T00:00:00.100Z".into());
        let mut superseded = submitted(driver("00ffffff", "FINISHED", None), "raysubmit_b", None);
        superseded.superseded = true;
        let record = |id: &str, started_ms: Option<i64>| SubmissionFacts {
            submission_id: id.into(),
            started_ms,
            ..SubmissionFacts::default()
        };
        let facts = SessionFacts {
            jobs: vec![
                superseded,
                on(
                    driver("01000000", "CREATED", None),
                    Some("aa"),
                    Some("10.0.0.9"),
                ),
                submitted(
                    on(driver("02000000", "CREATED", None), Some("bb"), None),
                    "raysubmit_b",
                    Some(200),
                ),
                on(
                    driver("03000000", "CREATED", None),
                    Some("cc"),
                    Some("10.0.0.3"),
                ),
                submitted(started_at_100ms, "raysubmit_a", None),
                on(driver("05000000", "CREATED", None), Some("dd"), None),
            ],
            unmatched_submissions: vec![
                record("raysubmit_y", None),
                record("raysubmit_z", Some(50)),
            ],
            nodes: vec![
                node("aa", Some("192.0.2.1")),
                node("bb", Some("192.0.2.2")),
                node("dd", None),
            ],
            ..SessionFacts::default()
        };
        let text = jobs_text(&facts, jobs_text_bound(&facts));
        assert!(jobs_text_bound(&facts) >= text.len());
        let jobs: Vec<Value> = serde_json::from_str(&text).unwrap();
        let order: Vec<(&str, &str, &str)> = jobs
            .iter()
            .map(|e| {
                (
                    e["submission_id"].as_str().unwrap(),
                    e["job_id"].as_str().unwrap_or("null"),
                    e["driver_info"]["node_ip_address"].as_str().unwrap_or("-"),
                )
            })
            .collect();
        assert_eq!(
            order,
            [
                ("raysubmit_z", "null", "-"),
                ("raysubmit_a", "04000000", ""),
                ("raysubmit_b", "02000000", "192.0.2.2"),
                ("raysubmit_y", "null", "-"),
                // The node's IP over the export event's; the export's without the node's.
                ("", "01000000", "192.0.2.1"),
                ("", "03000000", "10.0.0.3"),
                ("", "05000000", ""),
            ]
        );
        // Both times always there, as in Ray: a driver job's end `0` until one was recorded
        // (its job table's), a submitted job's `null` without its record's.
        assert_eq!(
            (&jobs[4]["start_time"], &jobs[4]["end_time"]),
            (&Value::Null, &json!(0))
        );
        assert_eq!(
            (&jobs[1]["start_time"], &jobs[1]["end_time"]),
            (&json!(100), &Value::Null)
        );
        assert_eq!(
            (&jobs[0]["start_time"], &jobs[0]["end_time"]),
            (&json!(50), &Value::Null)
        );
        // A job's answer names the same IP.
        let ips = node_ips(&facts);
        assert_eq!(job_json(&facts.jobs[1], &ips), jobs[4]);
    }

    /// Review r36p D1: a runtime env nested deeper than serde_json parses (valid JSON, under
    /// the size bound) is answered `null`, so the list stays readable; strings with brackets
    /// and escaped quotes do not count as nesting.
    #[test]
    fn a_runtime_env_nested_too_deep_is_answered_null() {
        let deep = format!("{{\"a\": {}1{}}}", "[".repeat(2000), "]".repeat(2000));
        assert_eq!(runtime_env_object(Some(&deep)).map(RawValue::get), None);
        let fine = format!("{{\"a\": {}1{}}}", "[".repeat(127), "]".repeat(127));
        assert!(runtime_env_object(Some(&fine)).is_some());
        let quoted = r#"{"a": "[[[[\"{{{{", "b": {"c": 1}}"#;
        assert_eq!(nesting(quoted), 2);
    }
}
