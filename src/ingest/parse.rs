//! Splits a POST body into events and reads the few fields routing needs.
//!
//! One pass over the body: each array element is read by serde_json with a visitor that
//! borrows the routing fields (event id, type, session, timestamp, node id, the payload's
//! job id) and skips everything else, and the element's exact byte range is kept so the
//! spool stores what Ray sent, not a re-serialization.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The body is not JSON we can split into events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} at byte {offset}")]
pub struct BodyError {
    /// What is wrong, in serde_json's words or ours.
    pub message: String,
    /// Zero-based byte offset in the (decompressed) body.
    pub offset: usize,
}

/// A string field as found: absent, a string, or some other JSON type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Field<'a> {
    /// Key not present.
    #[default]
    Missing,
    /// A JSON string (borrowed when it had no escapes).
    Str(Cow<'a, str>),
    /// Present with a non-string type (number, object, ...).
    WrongType,
}

impl<'a> Field<'a> {
    /// The string, if the field is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Field::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// The routing view of one event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFields<'a> {
    /// `eventId` / `event_id`.
    pub event_id: Field<'a>,
    /// `eventType` / `event_type`.
    pub event_type: Field<'a>,
    /// `sessionName` / `session_name`.
    pub session_name: Field<'a>,
    /// `timestamp`.
    pub timestamp: Field<'a>,
    /// Top-level `nodeId` / `node_id`: the node that emitted the event.
    pub node_id: Field<'a>,
    /// `jobId` / `job_id` of the first payload object that carries a non-empty one.
    pub job_id: Field<'a>,
}

/// One array element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedEvent<'a> {
    /// A JSON object, with its routing fields.
    Object(EventFields<'a>),
    /// Valid JSON, but not an object.
    NotObject,
}

/// One element of the body and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEvent<'a> {
    /// Byte range of the element in the body, exactly as sent.
    pub range: Range<usize>,
    /// Whether the element's bytes contain a line break (only possible as whitespace
    /// between tokens), which must become a space to keep one event per line.
    pub has_newline: bool,
    /// What the element is.
    pub parsed: ParsedEvent<'a>,
}

/// Splits `body` (a JSON array of events, or a single event object) into events.
pub fn parse_body(body: &[u8]) -> Result<Vec<RawEvent<'_>>, BodyError> {
    let mut events = Vec::new();
    for_each_event(body, |e| events.push(e))?;
    Ok(events)
}

/// Calls `f` for every element of `body`; stops at the first syntax error.
pub fn for_each_event<'a>(
    body: &'a [u8],
    mut f: impl FnMut(RawEvent<'a>),
) -> Result<(), BodyError> {
    let mut pos = skip_ws(body, 0);
    match body.get(pos) {
        None => {
            return Err(BodyError {
                message: "empty body, expected a JSON array of events".into(),
                offset: pos,
            })
        }
        Some(b'{') => {
            let (ev, end) = parse_element(body, pos)?;
            f(ev);
            let tail = skip_ws(body, end);
            if tail != body.len() {
                return Err(trailing(tail));
            }
            return Ok(());
        }
        Some(b'[') => pos += 1,
        Some(_) => {
            return Err(BodyError {
                message: "expected a JSON array of events or one event object".into(),
                offset: pos,
            })
        }
    }
    pos = skip_ws(body, pos);
    if body.get(pos) == Some(&b']') {
        let tail = skip_ws(body, pos + 1);
        if tail != body.len() {
            return Err(trailing(tail));
        }
        return Ok(());
    }
    loop {
        let (ev, end) = parse_element(body, pos)?;
        f(ev);
        pos = skip_ws(body, end);
        match body.get(pos) {
            Some(b',') => pos = skip_ws(body, pos + 1),
            Some(b']') => {
                let tail = skip_ws(body, pos + 1);
                if tail != body.len() {
                    return Err(trailing(tail));
                }
                return Ok(());
            }
            None => {
                return Err(BodyError {
                    message: "unexpected end of body inside the event array".into(),
                    offset: pos,
                })
            }
            Some(_) => {
                return Err(BodyError {
                    message: "expected ',' or ']' after an event".into(),
                    offset: pos,
                })
            }
        }
    }
}

fn trailing(offset: usize) -> BodyError {
    BodyError {
        message: "unexpected data after the JSON value".into(),
        offset,
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i
}

/// Parses the element starting at `start`; returns it and the offset just past it.
fn parse_element(body: &[u8], start: usize) -> Result<(RawEvent<'_>, usize), BodyError> {
    let slice = &body[start..];
    // A stream deserializer reads exactly one value and reports where it ended, so each
    // element is visited once: fields extracted, everything else skipped, end found.
    let mut stream = serde_json::Deserializer::from_slice(slice).into_iter::<ParsedEvent>();
    let parsed = match stream.next() {
        Some(Ok(p)) => p,
        Some(Err(e)) => return Err(json_error(body, start, &e)),
        None => {
            return Err(BodyError {
                message: "unexpected end of body, expected an event".into(),
                offset: body.len(),
            })
        }
    };
    let len = stream.byte_offset();
    let raw = &slice[..len];
    let has_newline = memchr_newline(raw);
    Ok((
        RawEvent {
            range: start..start + len,
            has_newline,
            parsed,
        },
        start + len,
    ))
}

fn memchr_newline(b: &[u8]) -> bool {
    b.iter().any(|&c| c == b'\n' || c == b'\r')
}

/// Converts serde_json's line/column into an absolute byte offset in `body`.
fn json_error(body: &[u8], start: usize, e: &serde_json::Error) -> BodyError {
    let slice = &body[start..];
    let mut offset = 0usize;
    let mut line = 1usize;
    if e.line() > 1 {
        for (i, &c) in slice.iter().enumerate() {
            if c == b'\n' {
                line += 1;
                if line == e.line() {
                    offset = i + 1;
                    break;
                }
            }
        }
    }
    offset += e.column().saturating_sub(1);
    let mut message = e.to_string();
    // serde_json appends " at line L column C", which is relative to the element.
    if let Some(i) = message.rfind(" at line ") {
        message.truncate(i);
    }
    BodyError {
        message: format!("invalid JSON: {message}"),
        offset: (start + offset).min(body.len()),
    }
}

impl<'de> serde::Deserialize<'de> for ParsedEvent<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ElementVisitor)
    }
}

struct ElementVisitor;

impl<'de> Visitor<'de> for ElementVisitor {
    type Value = ParsedEvent<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = EventFields::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let slot = match key.as_ref() {
                "eventId" | "event_id" => &mut fields.event_id,
                "eventType" | "event_type" => &mut fields.event_type,
                "sessionName" | "session_name" => &mut fields.session_name,
                "timestamp" => &mut fields.timestamp,
                "nodeId" | "node_id" => &mut fields.node_id,
                _ => {
                    // Any other member: if it is an object, it may be the payload carrying jobId.
                    let job = map.next_value_seed(PayloadSeed)?;
                    if let Some(job) = job {
                        if !matches!(&fields.job_id, Field::Str(s) if !s.is_empty()) {
                            fields.job_id = job;
                        }
                    }
                    continue;
                }
            };
            *slot = map.next_value_seed(StrFieldSeed)?;
        }
        Ok(ParsedEvent::Object(fields))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(ParsedEvent::NotObject)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(ParsedEvent::NotObject)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(ParsedEvent::NotObject)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(ParsedEvent::NotObject)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(ParsedEvent::NotObject)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(ParsedEvent::NotObject)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(ParsedEvent::NotObject)
    }
}

/// Reads a value that should be a string without failing on other types.
struct StrFieldSeed;

impl<'de> DeserializeSeed<'de> for StrFieldSeed {
    type Value = Field<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(StrFieldVisitor)
    }
}

struct StrFieldVisitor;

impl<'de> Visitor<'de> for StrFieldVisitor {
    type Value = Field<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Field::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Field::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Field::Str(Cow::Owned(v)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Field::WrongType)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Field::WrongType)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Field::WrongType)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Field::WrongType)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Field::WrongType)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Field::WrongType)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        // `null` means "not set" in proto3 JSON.
        Ok(Field::Missing)
    }
}

/// Reads a top-level member; if it is an object, returns its `jobId`/`job_id` if present.
struct PayloadSeed;

impl<'de> DeserializeSeed<'de> for PayloadSeed {
    type Value = Option<Field<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(PayloadVisitor)
    }
}

struct PayloadVisitor;

impl<'de> Visitor<'de> for PayloadVisitor {
    type Value = Option<Field<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut job = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "jobId" || key == "job_id" {
                job = Some(map.next_value_seed(StrFieldSeed)?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(job)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Field<'_> {
        Field::Str(Cow::Borrowed(v))
    }

    #[test]
    fn camel_and_snake_fields() {
        let body = br#"[{"eventId":"AA==","eventType":"TASK_DEFINITION_EVENT","timestamp":"2026-11-22T02:06:40Z","sessionName":"session_1","taskDefinitionEvent":{"taskId":"x","jobId":"AQAAAA==","nested":{"jobId":"no"}},"nodeId":"Tg=="},
 {"event_id":"BB==","event_type":"NODE_DEFINITION_EVENT","timestamp":"t","session_name":"s2","node_definition_event":{"node_id":"x"},"node_id":"Tg=="}]"#;
        let evs = parse_body(body).unwrap();
        assert_eq!(evs.len(), 2);
        let ParsedEvent::Object(f) = &evs[0].parsed else {
            panic!()
        };
        assert_eq!(f.event_id, s("AA=="));
        assert_eq!(f.session_name, s("session_1"));
        assert_eq!(f.job_id, s("AQAAAA=="));
        assert_eq!(f.node_id, s("Tg=="));
        assert!(!evs[0].has_newline);
        assert_eq!(&body[evs[0].range.clone()][..12], br#"{"eventId":""#);
        assert_eq!(body[evs[0].range.end - 1], b'}');
        let ParsedEvent::Object(g) = &evs[1].parsed else {
            panic!()
        };
        assert_eq!(g.event_type, s("NODE_DEFINITION_EVENT"));
        assert_eq!(g.session_name, s("s2"));
        assert_eq!(g.job_id, Field::Missing);
    }

    #[test]
    fn odd_elements_and_types_do_not_fail_the_batch() {
        let body =
            br#"[1, "x", null, [1,2], {"sessionName": 5, "timestamp": {"a":1}, "p": {"jobId": 7}},
        {"a": "b\nc",
          "sessionName": "s\u0031"}]"#;
        let evs = parse_body(body).unwrap();
        assert_eq!(evs.len(), 6);
        assert!(evs[..4].iter().all(|e| e.parsed == ParsedEvent::NotObject));
        let ParsedEvent::Object(f) = &evs[4].parsed else {
            panic!()
        };
        assert_eq!(f.session_name, Field::WrongType);
        assert_eq!(f.timestamp, Field::WrongType);
        assert_eq!(f.job_id, Field::WrongType);
        assert!(evs[5].has_newline);
        let ParsedEvent::Object(g) = &evs[5].parsed else {
            panic!()
        };
        assert_eq!(g.session_name.as_str(), Some("s1"));
    }

    #[test]
    fn single_object_and_empty_array() {
        assert_eq!(parse_body(b" {\"a\":1} ").unwrap().len(), 1);
        assert_eq!(parse_body(b"[ ]").unwrap().len(), 0);
        assert_eq!(parse_body(b"[]\n").unwrap().len(), 0);
    }

    #[test]
    fn syntax_errors_name_the_byte() {
        let e = parse_body(b"[{\"a\":1},{\"b\":}]").unwrap_err();
        assert_eq!(e.offset, 14, "{e}");
        assert!(e.message.starts_with("invalid JSON"), "{e}");
        let e = parse_body(b"[{\"a\":1}\n,\n{\"b\" 2}]").unwrap_err();
        assert_eq!(e.offset, 16, "{e}");
        assert_eq!(parse_body(b"").unwrap_err().offset, 0);
        assert_eq!(parse_body(b"hello").unwrap_err().offset, 0);
        assert_eq!(parse_body(b"[{}").unwrap_err().offset, 3);
        assert_eq!(parse_body(b"[{} {}]").unwrap_err().offset, 4);
        assert_eq!(parse_body(b"[{}] x").unwrap_err().offset, 5);
        assert_eq!(parse_body(b"{} {}").unwrap_err().offset, 3);
        assert!(parse_body(b"[{\"a\":\"\xff\"}]").is_err());
    }

    #[test]
    fn fixtures_parse() {
        for name in ["posts-camel.jsonl", "posts-snake.jsonl"] {
            let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read(&path).unwrap();
            let mut n = 0;
            for line in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
                for ev in parse_body(line).unwrap() {
                    let ParsedEvent::Object(f) = ev.parsed else {
                        panic!()
                    };
                    assert!(f.event_id.as_str().is_some());
                    assert!(f.session_name.as_str().is_some());
                    n += 1;
                }
            }
            assert!(n > 300, "{name}: {n}");
        }
    }
}
