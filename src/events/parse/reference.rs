//! The previous parser, built on serde_json's visitor API, kept as the oracle of the
//! differential tests: the hand-written scanner must accept what it accepts (and valid
//! UTF-8) and read the same fields.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{EventFields, Field, ParsedEvent};

/// Parses one element the old way; `Err` if serde_json rejects it.
pub fn parse_element(bytes: &[u8]) -> Result<(ParsedEvent<'_>, usize), serde_json::Error> {
    let mut stream = serde_json::Deserializer::from_slice(bytes).into_iter::<Reference>();
    match stream.next() {
        Some(Ok(Reference(p))) => Ok((p, stream.byte_offset())),
        Some(Err(e)) => Err(e),
        None => Err(serde::de::Error::custom("empty")),
    }
}

struct Reference<'a>(ParsedEvent<'a>);

impl<'de> serde::Deserialize<'de> for Reference<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ElementVisitor).map(Reference)
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
            fields.snake_case |= key.contains('_');
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
