//! Decides where an event goes: its session, node, stream (node or job) and hour.
//!
//! An event that cannot be routed is not an error for the batch: it gets a
//! [`QuarantineReason`] and is kept aside, because Ray resends a rejected batch forever.

use crate::contract::{id_to_hex, is_safe_segment, HexId, Hour};
use crate::events::parse::{EventFields, Field};
use crate::events::quarantine::QuarantineReason;
use crate::util::time::parse_rfc3339_seconds;

/// Where one event goes, borrowing from the body so routing allocates nothing.
#[derive(Debug, Clone, Copy)]
pub struct Route<'a> {
    /// Ray session name.
    pub session: &'a str,
    /// Node id hex, or the fallback node name.
    pub node: NodeName<'a>,
    /// Job id hex, if the event belongs to a job.
    pub job: Option<HexId>,
    /// UTC hour of the event's timestamp.
    pub hour: Hour,
}

/// The node part of a route.
#[derive(Debug, Clone, Copy)]
pub enum NodeName<'a> {
    /// Converted from the event's own `nodeId`.
    Hex(HexId),
    /// The collector's fallback node name.
    Fallback(&'a str),
}

impl NodeName<'_> {
    /// The node directory name.
    pub fn as_str(&self) -> &str {
        match self {
            NodeName::Hex(h) => h.as_str(),
            NodeName::Fallback(s) => s,
        }
    }
}

/// Event types that always go to `node_events`, whatever their payload says.
fn is_node_event(event_type: &Field<'_>) -> bool {
    matches!(
        event_type.as_str(),
        Some("NODE_DEFINITION_EVENT" | "NODE_LIFECYCLE_EVENT")
    )
}

/// The last node id and job id converted to hex, with their text: the events of a batch
/// share one node id and a few job ids, and decoding base64 for each was 3-4 % of the
/// collector's CPU under load.
#[derive(Default)]
pub struct IdCache {
    node: Option<(String, HexId)>,
    job: Option<(String, HexId)>,
}

impl IdCache {
    fn convert(slot: &mut Option<(String, HexId)>, id: &str) -> Option<HexId> {
        if let Some((text, hex)) = slot {
            if text == id {
                return Some(*hex);
            }
        }
        let hex = id_to_hex(id).ok()?;
        match slot {
            Some((text, cached)) => {
                text.clear();
                text.push_str(id);
                *cached = hex;
            }
            None => *slot = Some((id.to_string(), hex)),
        }
        Some(hex)
    }
}

/// Routes one event. `fallback_node` is used when the event carries no node id.
pub fn route<'a>(
    f: &'a EventFields<'a>,
    fallback_node: &'a str,
) -> Result<Route<'a>, QuarantineReason> {
    route_with(f, fallback_node, &mut IdCache::default())
}

/// [`route`], reusing the id conversions of the previous events in `ids`.
pub fn route_with<'a>(
    f: &'a EventFields<'a>,
    fallback_node: &'a str,
    ids: &mut IdCache,
) -> Result<Route<'a>, QuarantineReason> {
    let session = f
        .session_name
        .as_str()
        .ok_or(QuarantineReason::MissingSession)?;
    if !is_safe_segment(session) {
        return Err(QuarantineReason::UnsafeSession);
    }
    let ts = f
        .timestamp
        .as_str()
        .ok_or(QuarantineReason::MissingTimestamp)?;
    let secs = parse_rfc3339_seconds(ts).ok_or(QuarantineReason::BadTimestamp)?;
    let node = match f.node_id.as_str() {
        Some(id) if !id.is_empty() => {
            NodeName::Hex(IdCache::convert(&mut ids.node, id).ok_or(QuarantineReason::BadNodeId)?)
        }
        _ => NodeName::Fallback(fallback_node),
    };
    let job = if is_node_event(&f.event_type) {
        None
    } else {
        match &f.job_id {
            Field::Missing => None,
            Field::WrongType => return Err(QuarantineReason::BadJobId),
            Field::Str(s) if s.is_empty() => None,
            Field::Str(s) => {
                Some(IdCache::convert(&mut ids.job, s).ok_or(QuarantineReason::BadJobId)?)
            }
        }
    };
    Ok(Route {
        session,
        node,
        job,
        hour: Hour::from_unix_seconds(secs),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::parse::{parse_body, ParsedEvent};

    fn routed(json: &str) -> Result<(String, String, Option<String>, String), QuarantineReason> {
        let evs = parse_body(json.as_bytes()).unwrap();
        let ParsedEvent::Object(f) = &evs[0].parsed else {
            return Err(QuarantineReason::NotAnObject);
        };
        let r = route(f, "fallbacknode")?;
        Ok((
            r.session.to_string(),
            r.node.as_str().to_string(),
            r.job.map(|j| j.as_str().to_string()),
            r.hour.label(),
        ))
    }

    #[test]
    fn job_events_by_payload_job_id() {
        let r = routed(r#"{"eventType":"TASK_LIFECYCLE_EVENT","sessionName":"session_a","timestamp":"2026-11-22T02:59:59.999Z","nodeId":"OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ==","taskLifecycleEvent":{"jobId":"AQAAAA=="}}"#).unwrap();
        assert_eq!(
            r,
            (
                "session_a".into(),
                "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5".into(),
                Some("01000000".into()),
                "2026-11-22-02".into()
            )
        );
        let snake = routed(r#"{"event_type":"TASK_DEFINITION_EVENT","session_name":"s","timestamp":"2026-11-22T03:00:00Z","task_definition_event":{"job_id":"AgAAAA=="}}"#).unwrap();
        assert_eq!(snake.1, "fallbacknode");
        assert_eq!(snake.2.as_deref(), Some("02000000"));
        assert_eq!(snake.3, "2026-11-22-03");
    }

    #[test]
    fn node_events_and_events_without_job() {
        let r = routed(r#"{"eventType":"NODE_LIFECYCLE_EVENT","sessionName":"s","timestamp":"2026-11-22T02:00:00Z","nodeLifecycleEvent":{"jobId":"AQAAAA=="}}"#).unwrap();
        assert_eq!(r.2, None);
        let r = routed(r#"{"eventType":"WORKER_LIFECYCLE_EVENT","sessionName":"s","timestamp":"2026-11-22T02:00:00Z","workerLifecycleEvent":{"jobId":""}}"#).unwrap();
        assert_eq!(r.2, None);
        let r = routed(r#"{"eventType":"ACTOR_LIFECYCLE_EVENT","sessionName":"s","timestamp":"2026-11-22T02:00:00Z","nodeId":""}"#).unwrap();
        assert_eq!((r.1.as_str(), r.2), ("fallbacknode", None));
    }

    #[test]
    fn id_cache_follows_changing_ids() {
        let mut ids = IdCache::default();
        let cases = [
            ("AQ==", Ok("01")),
            ("AQ==", Ok("01")),
            ("Ag==", Ok("02")),
            ("../x", Err(QuarantineReason::BadNodeId)),
            ("AQ==", Ok("01")),
        ];
        for (node, want) in cases {
            let json = format!(
                r#"{{"sessionName":"s","timestamp":"2026-11-22T02:00:00Z","nodeId":"{node}","p":{{"jobId":"{node}"}}}}"#
            );
            let evs = parse_body(json.as_bytes()).unwrap();
            let ParsedEvent::Object(f) = &evs[0].parsed else {
                panic!()
            };
            let got = route_with(f, "fallback", &mut ids).map(|r| {
                (
                    r.node.as_str().to_string(),
                    r.job.map(|j| j.as_str().to_string()),
                )
            });
            match want {
                Ok(hex) => assert_eq!(
                    got.unwrap(),
                    (hex.to_string(), Some(hex.to_string())),
                    "{node}"
                ),
                Err(reason) => assert_eq!(got.unwrap_err(), reason, "{node}"),
            }
        }
    }

    #[test]
    fn quarantine_reasons() {
        use QuarantineReason::*;
        let cases = [
            ("[1]", NotAnObject),
            (r#"{"timestamp":"2026-11-22T02:00:00Z"}"#, MissingSession),
            (
                r#"{"sessionName":7,"timestamp":"2026-11-22T02:00:00Z"}"#,
                MissingSession,
            ),
            (
                r#"{"sessionName":"../../etc","timestamp":"2026-11-22T02:00:00Z"}"#,
                UnsafeSession,
            ),
            (r#"{"sessionName":"s"}"#, MissingTimestamp),
            (
                r#"{"sessionName":"s","timestamp":1700000000}"#,
                MissingTimestamp,
            ),
            (
                r#"{"sessionName":"s","timestamp":"yesterday"}"#,
                BadTimestamp,
            ),
            (
                r#"{"sessionName":"s","timestamp":"2026-11-22T02:00:00Z","nodeId":"../x"}"#,
                BadNodeId,
            ),
            (
                r#"{"sessionName":"s","timestamp":"2026-11-22T02:00:00Z","p":{"jobId":"../b"}}"#,
                BadJobId,
            ),
            (
                r#"{"sessionName":"s","timestamp":"2026-11-22T02:00:00Z","p":{"jobId":7}}"#,
                BadJobId,
            ),
        ];
        for (json, want) in cases {
            assert_eq!(routed(json).unwrap_err(), want, "{json}");
        }
        for r in QuarantineReason::ALL {
            assert!(!r.describe().is_empty());
            assert!(r
                .code()
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c == b'_'));
        }
    }
}
