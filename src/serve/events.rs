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
//!   count); past it reading stops and the answer carries [`TRUNCATED_HEADER`]. The answer
//!   is written from them one event at a time (parsed, camelCased, written, dropped), so an
//!   answer costs about twice that bound at most, not a tree of every event. At most
//!   [`super::MAX_CONCURRENT_READS`] such answers are built at once. A file that cannot be
//!   read is counted in [`super::UNREADABLE_HEADER`].

use std::collections::{BTreeMap, HashMap};

use axum::extract::{RawQuery, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures::StreamExt as _;
use object_store::ObjectStoreExt as _;
use serde_json::{Map, Value};

use super::cookies::Entered;
use super::{Shared, UNREADABLE_HEADER};
use crate::contract::logs::node_logs_prefix;
use crate::inspect::{escape_message, raw_key, session_nodes};

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

    /// Writes a job's events as a JSON array, in arrival order and Ray's form; each is
    /// parsed again and dropped as soon as it is written.
    fn write_list(events: &JobEvents, out: &mut Vec<u8>) {
        out.push(b'[');
        let mut first = true;
        for id in events.order.values() {
            let Some((_, line)) = events.by_id.get(id) else {
                continue;
            };
            let Ok(mut event) = serde_json::from_slice::<Value>(line) else {
                continue;
            };
            if let Some(Value::String(m)) = event.get_mut("message") {
                *m = m.replace("\\n", "\n").replace("\\r", "\n");
            }
            if !first {
                out.push(b',');
            }
            first = false;
            // Writing a Value to a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, &google_style(event));
        }
        out.push(b']');
    }

    /// A job's events in arrival order, in Ray's key style (for tests).
    #[cfg(test)]
    fn list(events: &JobEvents) -> Vec<Value> {
        let mut out = Vec::new();
        Self::write_list(events, &mut out);
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

/// `GET /events`.
pub async fn events(
    State(state): State<Shared>,
    entered: Entered,
    RawQuery(query): RawQuery,
) -> Response {
    let job_id = url::form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "job_id")
        .map(|(_, v)| v.into_owned());
    let Ok(_permit) = state.reads.acquire().await else {
        return entered.refresh((StatusCode::SERVICE_UNAVAILABLE, "shutting down"));
    };
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
    let mut events = Events::default();
    let mut unreadable = 0u64;
    let mut truncated = false;
    'nodes: for node in &nodes {
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
        let mut files: Vec<_> = listed
            .objects
            .into_iter()
            .filter(|m| {
                m.location
                    .filename()
                    .is_some_and(|n| n.starts_with("event_") && n.ends_with(".log"))
            })
            .collect();
        files.sort_by(|a, b| a.location.cmp(&b.location));
        for meta in files {
            match read_lines(store, &meta.location, &mut events).await {
                Ok(()) => {}
                Err(()) => unreadable += 1,
            }
            if events.held > MAX_HELD_BYTES {
                truncated = true;
                break 'nodes;
            }
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
        headers.insert(TRUNCATED_HEADER, HeaderValue::from(MAX_HELD_BYTES));
    }
    let mut body: Vec<u8> = Vec::new();
    match job_id {
        None => {
            body.extend_from_slice(
                br#"{"result":true,"msg":"All events fetched.","data":{"events":{"#,
            );
            for (i, (job, evs)) in events.jobs.iter().enumerate() {
                if i > 0 {
                    body.push(b',');
                }
                let _ = serde_json::to_writer(&mut body, job);
                body.push(b':');
                Events::write_list(evs, &mut body);
            }
            body.extend_from_slice(b"}}}");
        }
        Some(job) => {
            body.extend_from_slice(
                br#"{"result":true,"msg":"Job events fetched.","data":{"jobId":"#,
            );
            let _ = serde_json::to_writer(&mut body, &job);
            body.extend_from_slice(br#","events":"#);
            match events.jobs.get(&job) {
                Some(evs) => Events::write_list(evs, &mut body),
                None => body.extend_from_slice(b"[]"),
            }
            body.extend_from_slice(b"}}");
        }
    }
    drop(events);
    entered.refresh((headers, body))
}

/// Feeds every line of `key` to `events`, streaming the object; a line longer than
/// [`MAX_LINE_BYTES`] is skipped without being held. Stops at [`MAX_HELD_BYTES`].
async fn read_lines(
    store: &std::sync::Arc<dyn object_store::ObjectStore>,
    key: &object_store::path::Path,
    events: &mut Events,
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
                if events.held > MAX_HELD_BYTES {
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
        let list = Events::list(&job);
        assert_eq!(list.len(), 1);
        assert_eq!(list[0]["message"], "again");
        assert_eq!(
            Events::list(&e.jobs.remove("global").unwrap())[0]["eventId"],
            "b"
        );
        let mut e = Events::default();
        e.add(br#"{"event_id":"n","message":"x\\ny\\rz"}"#);
        assert_eq!(
            Events::list(&e.jobs.remove("global").unwrap())[0]["message"],
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
        let list = Events::list(&job);
        assert_eq!(list[0]["eventId"], "e0015000");
        assert_eq!(list[MAX_EVENTS_PER_JOB - 1]["eventId"], "e0024999");
    }
}
