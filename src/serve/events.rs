//! `GET /events[?job_id=]`: Ray's legacy events of a dead session, as Ray's dashboard answers
//! them live (`event_head.py` of Ray 2.60, which the Overview page's event list reads) and
//! KubeRay's history server replays them: from every node's `logs/events/event_*.log`
//! (JSON lines, snake_case, written by Ray's event logger), shipped with the node's logs.
//!
//! - Each line is one event; a line that is not a JSON object with an `event_id`, or is
//!   longer than [`MAX_LINE_BYTES`] (Ray's `EVENT_READ_LINE_LENGTH_LIMIT`), is skipped and
//!   counted in [`SKIPPED_HEADER`]. `\n` and `\r` written escaped in `message` are restored
//!   to newlines, as Ray does.
//! - Events are grouped by `custom_fields.job_id` (`global` without one) and kept once per
//!   `event_id` (a later line with the same id replaces it in place), at most
//!   [`MAX_EVENTS_PER_JOB`] per job, the oldest read dropped first, as Ray's cache keeps them.
//!   Nodes and files are read in name order, lines in file order.
//! - Keys are written in Ray's "google style" (`event_id` → `eventId`, at every depth, by
//!   Python's `title()` of each part), so the answer is Ray's:
//!   `{"result": true, "msg": "All events fetched.", "data": {"events": {job: [event, ...]}}}`,
//!   or with `job_id`, `{"result": true, "msg": "Job events fetched.", "data": {"jobId": ...,
//!   "events": [...]}}` (an unknown job: no events).
//! - Bounded: the events kept for one answer are held as their raw lines, at most
//!   [`MAX_HELD_BYTES`] with their ids and entries (replaced and dropped events no longer
//!   count); past it reading stops and the answer carries [`TRUNCATED_HEADER`]. The body is
//!   streamed from them as the connection takes it, one event at a time (parsed,
//!   camelCased, written, dropped), so an answer holds its events and a 64 KiB chunk, not a
//!   tree of every event nor its whole body. Every answer shares one [`EVENTS_BUDGET`]: it
//!   reserves what its listed files can make it hold (at most [`MAX_HELD_BYTES`] and one
//!   event) before it reads, and gives it back when its body is sent or its connection cut,
//!   so all `/events` answers at once hold at most [`EVENTS_BUDGET`] (one answer at the
//!   bound, or many small ones); one that waits [`BUDGET_WAIT`] for its share is a `503`
//!   with `Retry-After` and [`BUDGET_BUSY_HEADER`]. A file that cannot be read is counted in
//!   [`super::UNREADABLE_HEADER`].

use std::collections::{BTreeMap, HashMap};

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures::StreamExt as _;
use object_store::ObjectStoreExt as _;
use serde_json::{Map, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::cookies::Entered;
use super::{Shared, UNREADABLE_HEADER};
use crate::contract::logs::node_logs_prefix;
use crate::reader::{raw_key, session_nodes};
use crate::util::escape::escape_message;

/// Ray's `EVENT_READ_LINE_LENGTH_LIMIT` default: longer lines are skipped.
pub const MAX_LINE_BYTES: usize = 2 << 20;
/// Ray's `MAX_EVENTS_TO_CACHE` default: events kept per job.
pub const MAX_EVENTS_PER_JOB: usize = 10_000;
/// Bytes one answer holds for the events it keeps (their lines, ids and entries); past it,
/// reading stops.
pub const MAX_HELD_BYTES: usize = 64 << 20;
/// What one held event costs besides its line and id (map entries, allocations).
const EVENT_OVERHEAD_BYTES: usize = 128;
/// Set when reading stopped at [`MAX_HELD_BYTES`].
pub const TRUNCATED_HEADER: &str = "x-rhc-events-truncated";
/// Set when lines were skipped (not an event, or too long): how many.
pub const SKIPPED_HEADER: &str = "x-rhc-skipped-lines";

/// One job's events: each id's raw line, in arrival order.
#[derive(Default)]
struct JobEvents {
    /// Event id → (arrival, the event's line as read).
    by_id: HashMap<String, (u64, Box<[u8]>)>,
    /// Arrival → event id, the oldest first.
    order: BTreeMap<u64, String>,
}

/// Events by job, each job's in the order Ray's cache keeps them. Lines are held raw (their
/// bytes are what [`MAX_HELD_BYTES`] bounds) and turned into Ray's form only when written.
#[derive(Default)]
struct Events {
    jobs: BTreeMap<String, JobEvents>,
    arrivals: u64,
    /// Bytes of the lines held now (replaced and dropped lines no longer count).
    held: usize,
    skipped: u64,
}

impl Events {
    fn add(&mut self, line: &[u8]) {
        let Ok(Value::Object(event)) = serde_json::from_slice::<Value>(line) else {
            self.skipped += 1;
            return;
        };
        let Some(id) = event
            .get("event_id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
        else {
            self.skipped += 1;
            return;
        };
        let job = event
            .get("custom_fields")
            .and_then(|c| c.get("job_id"))
            .and_then(Value::as_str)
            .filter(|j| !j.is_empty())
            .unwrap_or("global")
            .to_string();
        drop(event);
        self.arrivals += 1;
        let arrival = self.arrivals;
        let events = self.jobs.entry(job).or_default();
        match events.by_id.get_mut(&id) {
            // Python's dict update: the value changes, the place does not.
            Some(slot) => {
                self.held = self.held + line.len() - slot.1.len();
                slot.1 = line.into();
            }
            None => {
                self.held += cost(&id, line);
                events.order.insert(arrival, id.clone());
                events.by_id.insert(id, (arrival, line.into()));
            }
        }
        while events.by_id.len() > MAX_EVENTS_PER_JOB {
            let Some((_, oldest)) = events.order.pop_first() else {
                break;
            };
            if let Some((_, old)) = events.by_id.remove(&oldest) {
                self.held -= cost(&oldest, &old);
            }
        }
    }

    /// Every job's held lines in arrival order, by job id; the maps are freed job by job.
    fn take_jobs(&mut self) -> impl Iterator<Item = (String, Vec<Box<[u8]>>)> {
        std::mem::take(&mut self.jobs)
            .into_iter()
            .map(|(job, mut events)| {
                let lines = std::mem::take(&mut events.order)
                    .into_values()
                    .filter_map(|id| events.by_id.remove(&id).map(|(_, line)| line))
                    .collect();
                (job, lines)
            })
    }

    /// A job's events in arrival order, in Ray's key style (for tests).
    #[cfg(test)]
    fn list(events: JobEvents) -> Vec<Value> {
        let mut e = Events::default();
        e.jobs.insert(String::new(), events);
        let mut out = b"[".to_vec();
        let mut first = true;
        for (_, lines) in e.take_jobs() {
            for line in lines {
                write_event(&line, &mut out, &mut first);
            }
        }
        out.push(b']');
        serde_json::from_slice(&out).unwrap_or_default()
    }
}

/// What holding one event costs: its line, its id twice (map and order) and the entries.
fn cost(id: &str, line: &[u8]) -> usize {
    line.len() + 2 * id.len() + EVENT_OVERHEAD_BYTES
}

/// Python's `str.title()` of one key part: a letter after a letter is lower-cased, any other
/// letter upper-cased.
fn title(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    let mut after_letter = false;
    for c in part.chars() {
        if after_letter {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        after_letter = c.is_alphabetic();
    }
    out
}

/// Ray's `to_camel_case`: the first part as is, the others by `title()`.
fn camel(key: &str) -> String {
    let mut parts = key.split('_');
    let mut out = parts.next().unwrap_or("").to_string();
    for p in parts {
        out.push_str(&title(p));
    }
    out
}

/// Ray's `to_google_style`: keys camelCased at every depth (objects in lists too).
fn google_style(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| (camel(&k), google_style(v)))
                .collect::<Map<String, Value>>(),
        ),
        Value::Array(a) => Value::Array(
            a.into_iter()
                .map(|x| match x {
                    Value::Object(_) => google_style(x),
                    other => other,
                })
                .collect(),
        ),
        other => other,
    }
}

/// Bytes of [`EVENTS_BUDGET`] an answer reserves before it reads, from the size of the event
/// files it listed (`listed`): what its held events can cost at most. An event costs its
/// line, its id twice and [`EVENT_OVERHEAD_BYTES`]; its id is shorter than its line and its
/// line at least [`MIN_EVENT_LINE`] bytes, so at most [`COST_PER_LISTED_BYTE`] times its
/// line. Reading stops past [`MAX_HELD_BYTES`], one event late at most.
fn reservation(listed: u64) -> usize {
    let most = MAX_HELD_BYTES + MAX_EVENT_COST;
    usize::try_from(listed)
        .unwrap_or(usize::MAX)
        .saturating_mul(COST_PER_LISTED_BYTE)
        .clamp(UNIT, most)
}

/// The shortest line that is an event (`{"event_id":"x"}`).
const MIN_EVENT_LINE: usize = 16;
/// What one held event costs at most per byte of its line (see [`reservation`]).
const COST_PER_LISTED_BYTE: usize = 3 + EVENT_OVERHEAD_BYTES.div_ceil(MIN_EVENT_LINE);
/// What the longest event kept can cost: its line, its id (shorter) twice, the overhead.
const MAX_EVENT_COST: usize = 3 * MAX_LINE_BYTES + EVENT_OVERHEAD_BYTES;
/// Bytes held by every `/events` answer at once, from its first read to its last byte sent:
/// one answer at [`MAX_HELD_BYTES`], or many smaller ones. An answer reserves its share
/// ([`reservation`]) before it reads and keeps it until its body is sent (or the connection
/// is cut), so answers about big event logs wait their turn instead of adding up (review
/// r36n: six at once held 431-555 MB).
pub const EVENTS_BUDGET: usize = MAX_HELD_BYTES + MAX_EVENT_COST;
/// The budget counts KiB, so that it fits a semaphore's permits.
const UNIT: usize = 1024;
/// How long an answer waits for its share of [`EVENTS_BUDGET`]; past it, `503` with
/// `Retry-After` and [`BUDGET_BUSY_HEADER`].
pub const BUDGET_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// Set (`true`) on the `503` of an answer that waited [`BUDGET_WAIT`] for its share.
pub const BUDGET_BUSY_HEADER: &str = "x-rhc-events-busy";
/// Bytes of the body handed to the connection at a time.
const BODY_CHUNK: usize = 64 << 10;

/// A new [`EVENTS_BUDGET`].
pub(super) fn budget() -> std::sync::Arc<Semaphore> {
    std::sync::Arc::new(Semaphore::new(units(EVENTS_BUDGET)))
}

/// Bytes in the budget's units, rounded up (so the largest reservation is the whole budget).
fn units(bytes: usize) -> usize {
    bytes.div_ceil(UNIT)
}

/// `GET /events`.
pub async fn events(
    State(state): State<Shared>,
    entered: Entered,
    RawQuery(query): RawQuery,
) -> Response {
    let job_id = url::form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "job_id")
        .map(|(_, v)| v.into_owned());
    let mut nodes = match session_nodes(&state.bucket, &entered.session).await {
        Ok(n) => n,
        Err(e) => {
            return entered.refresh((
                StatusCode::BAD_GATEWAY,
                escape_message(&format!("listing the session's nodes: {e:#}")),
            ))
        }
    };
    nodes.sort();
    let history = entered.session.history_prefix(&state.bucket.spec.root);
    let store = &state.bucket.store;
    let mut unreadable = 0u64;
    // Every node's event files, listed first: their sizes size the answer's reservation.
    let mut files = Vec::new();
    for node in &nodes {
        let dir = format!(
            "{}events",
            node_logs_prefix(&history, &entered.session.session, node)
        );
        let listed = match store.list_with_delimiter(Some(&raw_key(&dir))).await {
            Ok(l) => l,
            Err(_) => {
                unreadable += 1;
                continue;
            }
        };
        let mut mine: Vec<_> = listed
            .objects
            .into_iter()
            .filter(|m| {
                m.location
                    .filename()
                    .is_some_and(|n| n.starts_with("event_") && n.ends_with(".log"))
            })
            .collect();
        mine.sort_by(|a, b| a.location.cmp(&b.location));
        files.extend(mine);
    }
    let listed: u64 = files.iter().map(|m| m.size).sum();
    let reserved = reservation(listed);
    let units = u32::try_from(units(reserved)).unwrap_or(u32::MAX);
    let budget = match tokio::time::timeout(
        BUDGET_WAIT,
        state.events_budget.clone().acquire_many_owned(units),
    )
    .await
    {
        Ok(Ok(permit)) => permit,
        Ok(Err(_)) => return entered.refresh((StatusCode::SERVICE_UNAVAILABLE, "shutting down")),
        Err(_) => {
            let mut headers = HeaderMap::new();
            headers.insert(BUDGET_BUSY_HEADER, HeaderValue::from_static("true"));
            headers.insert(RETRY_AFTER, HeaderValue::from(5u32));
            return entered.refresh((
                StatusCode::SERVICE_UNAVAILABLE,
                headers,
                format!(
                    "other /events answers hold the memory this one needs after {}s: ask again",
                    BUDGET_WAIT.as_secs()
                ),
            ));
        }
    };
    // The reservation bounds what is held even if a file grew since it was listed.
    let cap = reserved.min(MAX_HELD_BYTES);
    let mut events = Events::default();
    let mut truncated = false;
    for meta in files {
        match read_lines(store, &meta.location, &mut events, cap).await {
            Ok(()) => {}
            Err(()) => unreadable += 1,
        }
        if events.held > cap {
            truncated = true;
            break;
        }
    }
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if unreadable > 0 {
        headers.insert(UNREADABLE_HEADER, HeaderValue::from(unreadable));
    }
    if events.skipped > 0 {
        headers.insert(SKIPPED_HEADER, HeaderValue::from(events.skipped));
    }
    if truncated {
        headers.insert(TRUNCATED_HEADER, HeaderValue::from(cap));
    }
    let body = match job_id {
        None => {
            let jobs = events
                .take_jobs()
                .map(|(job, lines)| {
                    let mut prefix = Vec::new();
                    let _ = serde_json::to_writer(&mut prefix, &job);
                    prefix.push(b':');
                    (prefix, lines)
                })
                .collect();
            BodyWriter::new(
                br#"{"result":true,"msg":"All events fetched.","data":{"events":{"#.to_vec(),
                jobs,
                b"}}}".to_vec(),
                budget,
            )
        }
        Some(job) => {
            let mut head =
                br#"{"result":true,"msg":"Job events fetched.","data":{"jobId":"#.to_vec();
            let _ = serde_json::to_writer(&mut head, &job);
            head.extend_from_slice(br#","events":"#);
            let lines = events
                .take_jobs()
                .find(|(j, _)| *j == job)
                .map(|(_, lines)| lines)
                .unwrap_or_default();
            BodyWriter::new(head, vec![(Vec::new(), lines)], b"}}".to_vec(), budget)
        }
    };
    let chunks = futures::stream::unfold(body, |mut body| async move {
        body.next_chunk()
            .map(|c| (Ok::<_, std::convert::Infallible>(c), body))
    });
    entered.refresh((headers, Body::from_stream(chunks)))
}

/// A job of an answer's body: its prefix (its key, or nothing) and its held lines in order.
type JobLines = (Vec<u8>, Vec<Box<[u8]>>);

/// An answer's body, written from its held events as the connection takes it: each event is
/// parsed again, camelCased, written and dropped, so what the answer holds shrinks as it is
/// sent; the answer's share of [`EVENTS_BUDGET`] is given back when the body is dropped.
struct BodyWriter {
    /// Written, not yet handed on.
    pending: Vec<u8>,
    /// The jobs still to write: each one's prefix (its key, or nothing) and its lines.
    jobs: std::vec::IntoIter<JobLines>,
    /// The lines of the job being written, `None` between jobs.
    lines: Option<std::vec::IntoIter<Box<[u8]>>>,
    first_job: bool,
    first_event: bool,
    tail: Option<Vec<u8>>,
    _budget: OwnedSemaphorePermit,
}

impl BodyWriter {
    fn new(
        head: Vec<u8>,
        jobs: Vec<JobLines>,
        tail: Vec<u8>,
        budget: OwnedSemaphorePermit,
    ) -> BodyWriter {
        BodyWriter {
            pending: head,
            jobs: jobs.into_iter(),
            lines: None,
            first_job: true,
            first_event: true,
            tail: Some(tail),
            _budget: budget,
        }
    }

    /// The next [`BODY_CHUNK`] or so of the body; `None` at its end.
    fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if self.pending.len() >= BODY_CHUNK {
                return Some(Bytes::from(std::mem::take(&mut self.pending)));
            }
            if let Some(lines) = self.lines.as_mut() {
                match lines.next() {
                    Some(line) => write_event(&line, &mut self.pending, &mut self.first_event),
                    None => {
                        self.pending.push(b']');
                        self.lines = None;
                    }
                }
                continue;
            }
            match self.jobs.next() {
                Some((prefix, lines)) => {
                    if !self.first_job {
                        self.pending.push(b',');
                    }
                    self.first_job = false;
                    self.pending.extend_from_slice(&prefix);
                    self.pending.push(b'[');
                    self.first_event = true;
                    self.lines = Some(lines.into_iter());
                }
                None => {
                    if let Some(tail) = self.tail.take() {
                        self.pending.extend_from_slice(&tail);
                    }
                    if self.pending.is_empty() {
                        return None;
                    }
                    return Some(Bytes::from(std::mem::take(&mut self.pending)));
                }
            }
        }
    }
}

/// Writes one held event in Ray's form (`message`'s escaped newlines restored, keys
/// camelCased), after a comma unless it is the list's first.
fn write_event(line: &[u8], out: &mut Vec<u8>, first: &mut bool) {
    let Ok(mut event) = serde_json::from_slice::<Value>(line) else {
        return;
    };
    if let Some(Value::String(m)) = event.get_mut("message") {
        *m = m.replace("\\n", "\n").replace("\\r", "\n");
    }
    if !*first {
        out.push(b',');
    }
    *first = false;
    // Writing a Value to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &google_style(event));
}

/// Feeds every line of `key` to `events`, streaming the object; a line longer than
/// [`MAX_LINE_BYTES`] is skipped without being held. Stops past `cap` bytes held.
async fn read_lines(
    store: &std::sync::Arc<dyn object_store::ObjectStore>,
    key: &object_store::path::Path,
    events: &mut Events,
    cap: usize,
) -> Result<(), ()> {
    let mut stream = store.get(key).await.map_err(|_| ())?.into_stream();
    let mut line: Vec<u8> = Vec::new();
    let mut too_long = false;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| ())?;
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            let (piece, ended) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            rest = if ended { &rest[piece.len() + 1..] } else { &[] };
            if !too_long {
                if line.len() + piece.len() > MAX_LINE_BYTES {
                    too_long = true;
                    line.clear();
                } else {
                    line.extend_from_slice(piece);
                }
            }
            if ended {
                finish_line(&mut line, &mut too_long, events);
                if events.held > cap {
                    return Ok(());
                }
            }
        }
    }
    finish_line(&mut line, &mut too_long, events);
    Ok(())
}

fn finish_line(line: &mut Vec<u8>, too_long: &mut bool, events: &mut Events) {
    if *too_long {
        events.skipped += 1;
    } else if !line.iter().all(u8::is_ascii_whitespace) {
        events.add(line);
    }
    line.clear();
    *too_long = false;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Review r36n: six answers about a 140 MiB event log held 431-555 MB at once. Each now
    /// reserves what its files can make it hold, the largest the whole budget and no more.
    #[test]
    fn reservations_fit_the_shared_budget() {
        assert_eq!(units(reservation(u64::MAX)), units(EVENTS_BUDGET));
        assert_eq!(reservation(140 << 20), EVENTS_BUDGET);
        assert_eq!(reservation(0), UNIT);
        assert_eq!(reservation(1000), 1000 * COST_PER_LISTED_BYTE);
        // The cost bound: the shortest event, with its id twice and the overhead.
        let line = br#"{"event_id":"x"}"#;
        assert_eq!(line.len(), MIN_EVENT_LINE);
        assert!(cost("x", line) <= COST_PER_LISTED_BYTE * line.len());
        let mut e = Events::default();
        for i in 0..1000 {
            e.add(format!(r#"{{"event_id":"{i:x}"}}"#).as_bytes());
        }
        assert!(e.held <= reservation(1000 * 20));
    }

    #[test]
    fn keys_are_rays_google_style() {
        assert_eq!(camel("event_id"), "eventId");
        assert_eq!(camel("source_hostname"), "sourceHostname");
        assert_eq!(camel("custom_fields"), "customFields");
        assert_eq!(camel("node_ID"), "nodeId");
        assert_eq!(camel("a_b1c"), "aB1C");
        assert_eq!(camel("plain"), "plain");
        let v = google_style(json!({"custom_fields": {"job_id": "01", "x_y": [{"a_b": 1}, 2]}}));
        assert_eq!(
            v,
            json!({"customFields": {"jobId": "01", "xY": [{"aB": 1}, 2]}})
        );
    }

    #[test]
    fn events_group_by_job_once_per_id() {
        let mut e = Events::default();
        e.add(br#"{"event_id":"a","message":"x\\ny","custom_fields":{"job_id":"01000000"}}"#);
        e.add(br#"{"event_id":"b","message":"m"}"#);
        e.add(br#"{"event_id":"a","message":"again","custom_fields":{"job_id":"01000000"}}"#);
        e.add(br#"{"message":"no id"}"#);
        e.add(b"not json");
        assert_eq!(e.skipped, 2);
        let job = e.jobs.remove("01000000").unwrap();
        let list = Events::list(job);
        assert_eq!(list.len(), 1);
        assert_eq!(list[0]["message"], "again");
        assert_eq!(
            Events::list(e.jobs.remove("global").unwrap())[0]["eventId"],
            "b"
        );
        let mut e = Events::default();
        e.add(br#"{"event_id":"n","message":"x\\ny\\rz"}"#);
        assert_eq!(
            Events::list(e.jobs.remove("global").unwrap())[0]["message"],
            "x\ny\nz"
        );
    }

    #[test]
    fn a_job_keeps_its_newest_events_and_held_counts_only_them() {
        let mut e = Events::default();
        let line = |i: usize| format!(r#"{{"event_id":"e{i:07}","message":"m"}}"#);
        for i in 0..25_000 {
            e.add(line(i).as_bytes());
        }
        let job = e.jobs.remove("global").unwrap();
        assert_eq!(job.by_id.len(), MAX_EVENTS_PER_JOB);
        assert_eq!(
            e.held,
            MAX_EVENTS_PER_JOB * cost("e0000000", line(0).as_bytes())
        );
        let list = Events::list(job);
        assert_eq!(list[0]["eventId"], "e0015000");
        assert_eq!(list[MAX_EVENTS_PER_JOB - 1]["eventId"], "e0024999");
    }
}
