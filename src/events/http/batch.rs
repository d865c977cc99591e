//! A body's events as a batch for the spool ([`build_batch`]): every element parsed, routed
//! to its partition and, with `--event-keys camel`, converted to its camelCase form, whose
//! room is charged to the body's room in the body budget before it is allocated; the
//! unusable elements kept in quarantine within [`MAX_QUARANTINED_PER_BODY`],
//! [`MAX_QUARANTINED_BYTES_PER_BODY`] and the keeping rate ([`Quarantine`]), the rest counted.

use std::sync::Mutex;

use bytes::Bytes;

use super::body::{self, BodyProblem};
use super::state::{EventKeys, IngestState, KeptBodies, KEPT_BODY_BYTES_PER_SECOND};
use crate::contract::{Partition, Stream};
use crate::events::camel;
use crate::events::dedup::id_hash;
use crate::events::parse::{self, for_each_event, ParsedEvent};
use crate::events::quarantine::{event_record_len, QuarantineReason, MAX_KEPT_BODY_BYTES};
use crate::events::route::{route_with, IdCache, NodeName};
use crate::events::spool::{
    AppendBatch, EventSpan, PartitionBatch, QuarantinedEvent, MAX_SPAN_BODY,
};
use crate::metrics as m;

/// Unusable elements of one body kept in quarantine; beyond it they are counted, not kept:
/// a body of millions of bad elements (`[0,0,0,…]`) must cost neither memory nor disk in
/// proportion to its element count, and a thousand records say what is wrong with it.
pub const MAX_QUARANTINED_PER_BODY: usize = 1000;
/// Bytes of quarantine records one body may keep (their events and the records around
/// them): what an invalid body keeps ([`MAX_KEPT_BODY_BYTES`]). Without it a thousand
/// large bad elements (1,000 strings of 60 KB in a 66 KB gzip body) kept 57 MiB of
/// quarantine per request, and built their records in memory beside the body.
pub const MAX_QUARANTINED_BYTES_PER_BODY: usize = MAX_KEPT_BODY_BYTES;

/// Unusable events of one body kept in quarantine: at most [`MAX_QUARANTINED_PER_BODY`] and
/// [`MAX_QUARANTINED_BYTES_PER_BODY`] of records, within the keeping rate ([`KeptBodies`]),
/// the rest counted by reason (`quarantine_dropped` in the answer,
/// `rhc_events_quarantine_dropped_total{reason}`).
struct Quarantine<'a> {
    list: Vec<QuarantinedEvent>,
    /// Bytes of the records of `list`.
    bytes: usize,
    dropped: u64,
    /// Of those, the ones the keeping rate refused.
    over_rate: u64,
    /// Of those, by reason (counted into the metric once per body, not per element).
    dropped_by_reason: Vec<(QuarantineReason, u64)>,
    rate: &'a Mutex<KeptBodies>,
}

impl<'a> Quarantine<'a> {
    fn new(rate: &'a Mutex<KeptBodies>) -> Quarantine<'a> {
        Quarantine {
            list: Vec::new(),
            bytes: 0,
            dropped: 0,
            over_rate: 0,
            dropped_by_reason: Vec::new(),
            rate,
        }
    }

    fn push(&mut self, reason: QuarantineReason, range: &std::ops::Range<usize>) {
        let record = event_record_len(reason, range.len());
        if self.list.len() < MAX_QUARANTINED_PER_BODY
            && self.bytes + record <= MAX_QUARANTINED_BYTES_PER_BODY
        {
            let within_rate = self
                .rate
                .lock()
                .map(|mut k| k.take_record(record))
                .unwrap_or(false);
            if within_rate {
                self.bytes += record;
                self.list.push(QuarantinedEvent {
                    reason,
                    start: range.start,
                    end: range.end,
                    source: None,
                });
                return;
            }
            self.over_rate += 1;
        }
        self.dropped += 1;
        match self
            .dropped_by_reason
            .iter_mut()
            .find(|(r, _)| *r == reason)
        {
            Some((_, n)) => *n += 1,
            None => self.dropped_by_reason.push((reason, 1)),
        }
    }
}

/// Room a body's camelCase form takes beside it: the form is never longer than the
/// snake_case one (names only lose underscores, whitespace between tokens is dropped), and
/// the other events and quarantined elements are copied beside it, so the body's length
/// bounds it; an eighth more keeps a converter change from ever growing the buffer beyond
/// what it was charged.
fn conversion_room(body_len: usize) -> usize {
    body_len.saturating_add(body_len / 8)
}

/// Why a batch was not built: its camelCase form needs more room in the body budget.
pub(super) enum ConversionRoom {
    /// The budget has not this many bytes free for the body now.
    Wait(u64),
    /// More than the whole budget, this many bytes, would be needed.
    NeverFits(u64),
}

/// Routes every event of `body`, grouping them by partition.
///
/// With `--event-keys camel`, an event Ray sent with snake_case keys is stored as its
/// camelCase form ([`camel::to_camel`]). The stored body is then one new buffer: the
/// converted events, then copies of the other events and of the quarantined elements, all
/// spans pointing there. That buffer ([`conversion_room`]) is charged to the body's `room`,
/// beside the `holds` bytes the body holds already, before it is allocated, so the body and its camelCase form stay within the body budget
/// (`Ok(Err(_))` when the room is not free now, or never can be). One that cannot be
/// converted is quarantined.
pub(super) fn build_batch(
    st: &IngestState,
    body: &Bytes,
    holds: u64,
    room: &mut body::Room<'_>,
) -> Result<Result<AppendBatch, ConversionRoom>, parse::BodyError> {
    let learned = if st.configured_node.is_none() {
        st.learned_node.lock().ok().and_then(|g| g.clone())
    } else {
        None
    };
    let fallback: &str = st
        .configured_node
        .as_deref()
        .or(learned.as_deref())
        .unwrap_or("unknown-node");
    let mut partitions: Vec<PartitionBatch> = Vec::new();
    let mut kept = Quarantine::new(&st.kept_bodies);
    let mut last: usize = usize::MAX;
    let mut seen_node: Option<String> = None;
    let mut ids = IdCache::default();
    let convert = st.event_keys == EventKeys::Camel;
    // Converted events, and where their spans are: (partition, index in it).
    let mut converted: Vec<u8> = Vec::new();
    let mut moved: Vec<(u32, u32)> = Vec::new();
    let mut too_large = false;
    let mut unknown_fields = 0u64;
    let mut short: Option<ConversionRoom> = None;
    for_each_event(body, |ev| {
        if short.is_some() {
            return;
        }
        let ParsedEvent::Object(fields) = &ev.parsed else {
            kept.push(QuarantineReason::NotAnObject, &ev.range);
            return;
        };
        if ev.unreadable.is_some() {
            kept.push(QuarantineReason::NumberOutOfRange, &ev.range);
            return;
        }
        let r = match route_with(fields, fallback, &mut ids) {
            Ok(r) => r,
            Err(reason) => {
                kept.push(reason, &ev.range);
                return;
            }
        };
        if st.configured_node.is_none() && seen_node.is_none() {
            if let NodeName::Hex(h) = r.node {
                seen_node = Some(h.as_str().to_string());
            }
        }
        let id_hash = fields.event_id.as_str().map(|id| id_hash(id.as_bytes()));
        let span = if convert && fields.snake_case {
            if converted.capacity() == 0 {
                let extra = conversion_room(body.len());
                let need = holds.saturating_add(extra as u64);
                match room.try_grow_to(need) {
                    Ok(true) => converted.reserve_exact(extra),
                    Ok(false) => {
                        short = Some(ConversionRoom::Wait(need));
                        return;
                    }
                    Err(BodyProblem::NeverFits(budget)) => {
                        short = Some(ConversionRoom::NeverFits(budget));
                        return;
                    }
                    Err(_) => {
                        short = Some(ConversionRoom::Wait(need));
                        return;
                    }
                }
            }
            let start = converted.len();
            match camel::to_camel(&body[ev.range.clone()], &mut converted) {
                Ok(c) => unknown_fields += c.unknown_fields as u64,
                Err(e) => {
                    tracing::debug!(error = %e, "a snake_case event could not be converted; quarantined");
                    kept.push(QuarantineReason::UnconvertibleFieldNames, &ev.range);
                    return;
                }
            }
            EventSpan::new(start..converted.len(), id_hash, false)
        } else {
            EventSpan::new(ev.range.clone(), id_hash, ev.has_newline)
        };
        // Only a body beyond what --max-body-bytes allows could overflow a span.
        let Some(span) = span else {
            too_large = true;
            return;
        };
        let is_converted = convert && fields.snake_case;
        let job = r.job.as_ref().map(|j| j.as_str());
        let matches = |p: &Partition| {
            p.hour == r.hour
                && p.session == r.session
                && p.node == r.node.as_str()
                && match (&p.stream, job) {
                    (Stream::Node, None) => true,
                    (Stream::Job(a), Some(b)) => a == b,
                    _ => false,
                }
        };
        let idx = if last < partitions.len() && matches(&partitions[last].partition) {
            last
        } else if let Some(i) = partitions.iter().position(|pb| matches(&pb.partition)) {
            i
        } else {
            partitions.push(PartitionBatch {
                partition: Partition {
                    session: r.session.to_string(),
                    node: r.node.as_str().to_string(),
                    stream: match job {
                        Some(j) => Stream::Job(j.to_string()),
                        None => Stream::Node,
                    },
                    hour: r.hour,
                },
                events: Vec::new(),
            });
            partitions.len() - 1
        };
        last = idx;
        if is_converted {
            moved.push((idx as u32, partitions[idx].events.len() as u32));
        }
        partitions[idx].events.push(span);
    })?;
    if let Some(short) = short {
        return Ok(Err(short));
    }
    if too_large {
        return Err(parse::BodyError {
            message: format!("body larger than {MAX_SPAN_BODY} bytes"),
            offset: 0,
        });
    }
    let body = if moved.is_empty() {
        body.clone()
    } else {
        m::events_renamed(moved.len() as u64, unknown_fields);
        // The events not converted, and the quarantined elements, are copied after the
        // converted ones: the stored body is `converted` alone, within its charged room.
        let mut is_moved: Vec<Vec<bool>> = partitions
            .iter()
            .map(|p| vec![false; p.events.len()])
            .collect();
        for (p, i) in moved {
            is_moved[p as usize][i as usize] = true;
        }
        let overflow = || parse::BodyError {
            message: format!("body larger than {MAX_SPAN_BODY} bytes once converted"),
            offset: 0,
        };
        for (pb, moved) in partitions.iter_mut().zip(&is_moved) {
            for (span, _) in pb.events.iter_mut().zip(moved).filter(|(_, m)| !**m) {
                let start = converted.len();
                converted.extend_from_slice(&body[span.range()]);
                *span = span.moved_to(start).ok_or_else(overflow)?;
            }
        }
        for q in &mut kept.list {
            let start = converted.len();
            converted.extend_from_slice(&body[q.start..q.end]);
            q.end = start + (q.end - q.start);
            q.start = start;
        }
        Bytes::from(converted)
    };
    if let Some(node) = seen_node {
        if let Ok(mut g) = st.learned_node.lock() {
            if g.as_deref() != Some(node.as_str()) {
                *g = Some(node);
            }
        }
    }
    for (reason, n) in &kept.dropped_by_reason {
        m::quarantine_dropped(reason.code(), *n);
    }
    if kept.dropped > 0 {
        tracing::debug!(
            kept = kept.list.len(),
            kept_bytes = kept.bytes,
            dropped = kept.dropped,
            over_rate = kept.over_rate,
            "more unusable events in one body than are kept (at most {MAX_QUARANTINED_PER_BODY} and {MAX_QUARANTINED_BYTES_PER_BODY} bytes of records a body, {KEPT_BODY_BYTES_PER_SECOND} bytes a second in all); the rest are counted"
        );
    }
    Ok(Ok(AppendBatch {
        body,
        partitions,
        quarantined: kept.list,
        quarantine_dropped: kept.dropped,
        checkpoint: None,
    }))
}
