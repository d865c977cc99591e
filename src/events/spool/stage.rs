//! Staging one request for its group: its lines referenced per segment, within the disk
//! budget (the bytes, and the files it creates), all or nothing; the partition bound of one
//! request; and what the spool keeps in quarantine (bad events and unparseable bodies, each
//! once, with the reason). A request that cannot be staged fails alone, never its group.

use std::io::Write;

use super::segments::Target;
use super::writer::{Held, Writer};
use super::{
    AppendBatch, AppendOutcome, EventSpan, FileKind, LineSource, PartitionBatch, SealedFile,
    SpoolError, FILE_BUDGET_BYTES, MAX_PARTITIONS_PER_REQUEST, QUARANTINE_DIR,
};
use crate::contract::quarantine::body_key;
use crate::contract::{Hour, Partition, Stream};
use crate::events::dedup::id_hash;
use crate::events::quarantine::{
    event_record, invalid_body_record, overflow_record, raw_record, KeptBody, QuarantineReason,
};
use crate::metrics as m;
use crate::util::time::unix_nanos;

/// How many events ahead the writer prefetches the dedup window's slot: about as many as
/// cover a cache miss to memory while the events in between are handled.
const DEDUP_PREFETCH_AHEAD: usize = 8;

/// Distinct invalid bodies remembered, so one Ray resends is kept once.
const RECENT_BODIES: usize = 1024;

/// Bytes a quarantine record adds to the element it keeps, at most (reason, sentence, time).
const QUARANTINE_RECORD_OVERHEAD: u64 = 512;

/// Of a request's partitions, this many (the first ones it names) keep their own hour; the
/// others' events go under the arrival hour of their stream (see [`bound_partitions`]).
const PARTITIONS_KEPT_AS_ROUTED: usize = MAX_PARTITIONS_PER_REQUEST / 2;

/// An event of a request over the partition bound that found no room: kept in quarantine
/// (`too_many_partitions`) as sent, and deduplicated by its event id like a stored event.
#[derive(Debug, Clone, Copy)]
struct Overflow {
    span: EventSpan,
    /// From an export event file: its id lives in the export id space.
    export: bool,
}

/// Bounds the partitions of one request at [`MAX_PARTITIONS_PER_REQUEST`]: the first
/// [`PARTITIONS_KEPT_AS_ROUTED`] stay as routed; the events of every further partition go,
/// unchanged, to the same session, node and stream under the `arrival` hour (one partition
/// per stream, however many hours it named), while there is room; an event left over is
/// returned in `overflow`, for quarantine.
fn bound_partitions(
    parts: &[PartitionBatch],
    arrival: Hour,
    overflow: &mut Vec<Overflow>,
) -> Vec<PartitionBatch> {
    let split = parts.len().min(PARTITIONS_KEPT_AS_ROUTED);
    let mut out: Vec<PartitionBatch> = parts[..split]
        .iter()
        .map(|p| PartitionBatch {
            partition: p.partition.clone(),
            events: p.events.clone(),
        })
        .collect();
    let mut index: std::collections::HashMap<Partition, usize> = out
        .iter()
        .enumerate()
        .map(|(i, p)| (p.partition.clone(), i))
        .collect();
    for pb in &parts[split..] {
        let moved = Partition {
            hour: arrival,
            ..pb.partition.clone()
        };
        match index.get(&moved) {
            Some(&i) => out[i].events.extend_from_slice(&pb.events),
            None if out.len() < MAX_PARTITIONS_PER_REQUEST => {
                index.insert(moved.clone(), out.len());
                out.push(PartitionBatch {
                    partition: moved,
                    events: pb.events.clone(),
                });
            }
            None => {
                let export = matches!(pb.partition.stream, Stream::Export(_));
                overflow.extend(pb.events.iter().map(|&span| Overflow { span, export }));
            }
        }
    }
    out
}

impl Writer {
    /// Stages one request's lines for their segments (referenced in its body, see
    /// [`Pending`]), after checking that at most that many bytes, and the files it creates
    /// (segments, a quarantine file, session markers), fit the disk budget.
    ///
    /// All or nothing: every segment the request needs is created before any line is staged,
    /// so an error (a full disk creating a segment) leaves nothing of this request behind, its
    /// ids forgotten, and fails this request alone, not the others of its group.
    pub(super) fn stage(
        &mut self,
        batch: &AppendBatch,
        held: &mut Held,
        new_sessions: &mut Vec<String>,
    ) -> Result<AppendOutcome, SpoolError> {
        let mut overflow: Vec<Overflow> = Vec::new();
        let bounded;
        let parts: &[PartitionBatch] = if batch.partitions.len() > MAX_PARTITIONS_PER_REQUEST {
            let arrival = Hour::from_unix_seconds((unix_nanos() / 1_000_000_000) as i64);
            bounded = bound_partitions(&batch.partitions, arrival, &mut overflow);
            &bounded
        } else {
            &batch.partitions
        };
        let targets: Vec<Target> = parts
            .iter()
            .map(|p| Target::Events(p.partition.clone()))
            .collect();
        // The clock is read only for a request that has something to quarantine.
        let quarantine_target =
            (!batch.quarantined.is_empty() || !overflow.is_empty()).then(|| {
                Target::Quarantine(Hour::from_unix_seconds(
                    (unix_nanos() / 1_000_000_000) as i64,
                ))
            });
        // Markers are made once the group is durable: until then the request holds their
        // share of the budget.
        let markers = self.new_markers(parts, new_sessions) as u64 * FILE_BUDGET_BYTES;
        let new_files = targets
            .iter()
            .chain(quarantine_target.iter())
            .filter(|t| !self.segs.open.contains_key(t))
            .count();
        let wanted: u64 = parts
            .iter()
            .flat_map(|p| &p.events)
            .map(|e| e.len() as u64 + 1)
            .chain(
                batch
                    .quarantined
                    .iter()
                    .map(|q| (q.end - q.start) as u64 + QUARANTINE_RECORD_OVERHEAD),
            )
            .chain(
                overflow
                    .iter()
                    .map(|o| o.span.len() as u64 + QUARANTINE_RECORD_OVERHEAD),
            )
            .sum();
        let files_claimed = new_files as u64 * FILE_BUDGET_BYTES;
        let claimed = self.claim_budget(wanted + files_claimed + markers, wanted)?;
        let mut out = AppendOutcome {
            quarantine_dropped: batch.quarantine_dropped,
            ..AppendOutcome::default()
        };
        let (events_before, quarantine_before) = (held.events.len(), held.quarantine.len());
        // Every id of the request (its partitions' events, then the overflow's) is checked
        // against the window before any goes in: an insertion evicts the oldest ids, which
        // may be this request's own, still to be checked (Ray's resend of a batch partly out
        // of the window: its first ids, new again, pushed out the rest, which then passed as
        // new too, review r40j D1). An id repeated within the request is new once.
        let hashes: Vec<Option<u64>> = parts
            .iter()
            .flat_map(|p| &p.events)
            .chain(overflow.iter().map(|o| &o.span))
            .map(EventSpan::id_hash)
            .collect();
        let mut in_window: Vec<bool> = Vec::with_capacity(hashes.len());
        for (i, h) in hashes.iter().enumerate() {
            // The window's table is larger than the caches: start loading the slot of an
            // event a few ahead, so its lookup does not wait for memory.
            if let Some(Some(ahead)) = hashes.get(i + DEDUP_PREFETCH_AHEAD) {
                self.dedup.prefetch(*ahead);
            }
            in_window.push(h.is_some_and(|h| self.dedup.contains(h)));
        }
        // True when the `k`th id of the request is new, which the window then holds.
        let mut admit = |k: usize, held: &mut Held| -> bool {
            let Some(h) = hashes[k] else {
                return true;
            };
            if let Some(Some(ahead)) = hashes.get(k + DEDUP_PREFETCH_AHEAD) {
                self.dedup.prefetch(*ahead);
            }
            if in_window[k] || !self.dedup.insert(h) {
                return false;
            }
            held.events.push(h);
            true
        };
        // Dedup first so a partition whose events are all duplicates opens no file; then
        // every segment is made to exist before anything is staged.
        let mut kept: Vec<Vec<&EventSpan>> = Vec::with_capacity(parts.len());
        let mut k = 0;
        for pb in parts {
            let mut keep: Vec<&EventSpan> = Vec::with_capacity(pb.events.len());
            for ev in &pb.events {
                let new = admit(k, held);
                k += 1;
                if !new {
                    out.duplicates += 1;
                    continue;
                }
                keep.push(ev);
            }
            kept.push(keep);
        }
        // The overflow's ids, in the same order.
        let overflow_new: Vec<bool> = overflow
            .iter()
            .map(|_| {
                let new = admit(k, held);
                k += 1;
                new
            })
            .collect();
        let mut made = Ok(());
        for (keep, target) in kept.iter().zip(&targets) {
            if !keep.is_empty() && made.is_ok() {
                made = self.segs.segment(target).map(|_| ());
            }
        }
        let mut records: Vec<Vec<u8>> = Vec::new();
        let mut reasons = Vec::new();
        // A record holding an id is among them: of a valid event with an id, or of a line
        // read from a file (its key).
        let mut records_with_ids = false;
        // A valid event with no room is deduplicated by its id like any stored event (the
        // window holds stored and quarantined ids alike, and a restart reloads both), so its
        // resend, or an event stored before, is not kept again.
        for (o, new_id) in overflow.iter().zip(overflow_new) {
            let raw = &batch.body[o.span.range()];
            let new = match o.span.id_hash() {
                Some(_) => {
                    records_with_ids |= new_id;
                    new_id
                }
                None => self.remember_quarantined(id_hash(raw), held),
            };
            if !new {
                out.duplicates += 1;
                continue;
            }
            records.push(overflow_record(raw, o.export));
            reasons.push(QuarantineReason::TooManyPartitions);
        }
        // Repeats of a bad element already kept (resent by Ray, or repeated in one body):
        // answered and counted as quarantined, each one, but kept once; they are not
        // duplicates of an accepted event.
        let mut repeated = Vec::new();
        // A line read from a file is remembered by where it was read, not by its bytes (see
        // [`LineSource`]).
        for q in &batch.quarantined {
            let raw = &batch.body[q.start..q.end];
            let key = q
                .source
                .as_ref()
                .map_or_else(|| id_hash(raw), LineSource::dedup_key);
            if !self.remember_quarantined(key, held) {
                repeated.push(q.reason);
                continue;
            }
            // A line read from a file is also remembered in the deduplication window, whose
            // ids the journal keeps across a restart: read again after a crash or an unsaved
            // checkpoint, it is a duplicate, not a second record (review r41n D2).
            if q.source.is_some() && !self.remember_line(key, held) {
                out.duplicates += 1;
                continue;
            }
            // Its key is written in the record too: a restart reads it back from the spool
            // when the journal did not get it (a kill -9 between the group's sync and the
            // journal's append: review r41q D1).
            records.push(match &q.source {
                Some(s) => {
                    records_with_ids = true;
                    raw_record(q.reason, &s.file, s.offset, raw, Some(key))
                }
                None => event_record(q.reason, raw),
            });
            reasons.push(q.reason);
        }
        let quarantine_target = quarantine_target.filter(|_| !records.is_empty());
        if let (Some(t), true) = (&quarantine_target, made.is_ok()) {
            made = self.segs.segment(t).map(|_| ());
        }
        if let Err(e) = made {
            for h in held.events.drain(events_before..) {
                self.dedup.forget(h);
            }
            for h in held.quarantine.drain(quarantine_before..) {
                self.quarantine_dedup.forget(h);
            }
            self.stats.budget().release(claimed);
            return Err(e);
        }
        // The new segments count as files now; the rest stays claimed until the group is
        // durable (or rolled back).
        self.stats.budget().release(files_claimed);
        held.bytes += claimed - files_claimed;
        for ((pb, target), keep) in parts.iter().zip(&targets).zip(kept) {
            if keep.is_empty() {
                continue;
            }
            if self.cfg.write_session_markers
                && !self.segs.marked_sessions.contains(&pb.partition.session)
                && !new_sessions.contains(&pb.partition.session)
            {
                new_sessions.push(pb.partition.session.clone());
            }
            let seg = self.segs.segment(target)?;
            seg.pending.reserve(keep.len());
            seg.pending.ids |= keep.iter().any(|e| e.id_hash().is_some());
            for ev in keep {
                seg.pending
                    .push_event(&batch.body, ev.range(), ev.has_newline());
                out.accepted += 1;
            }
        }
        if let Some(t) = &quarantine_target {
            let seg = self.segs.segment(t)?;
            seg.pending.ids |= records_with_ids;
            for line in &records {
                seg.pending.push_lines(line);
            }
        }
        for r in reasons.into_iter().chain(repeated) {
            m::events_quarantined(r.code(), 1);
            out.quarantined += 1;
        }
        Ok(out)
    }

    /// Remembers a quarantined element without an event id by `h` (the hash of its bytes, or
    /// for a line read from a file its [`LineSource::dedup_key`]), so that the same bad event
    /// resent by Ray, or the same line stored again, is kept once; false when it was kept
    /// recently.
    fn remember_quarantined(&mut self, h: u64, held: &mut Held) -> bool {
        if !self.quarantine_dedup.insert(h) {
            return false;
        }
        held.quarantine.push(h);
        true
    }

    /// Remembers a quarantined line read from a file by its [`LineSource::dedup_key`] in the
    /// deduplication window too (held with the group's ids, so the ids journal keeps it and a
    /// restart reloads it); false when the window holds it (stored before, in this run or
    /// the last).
    fn remember_line(&mut self, key: u64, held: &mut Held) -> bool {
        let h = super::dedup_key(key);
        if !self.dedup.insert(h) {
            return false;
        }
        held.events.push(h);
        true
    }

    /// How many session markers (one file each, then one object) storing `parts` would
    /// create: on the head, one per session not yet marked nor about to be by the group.
    fn new_markers(&self, parts: &[PartitionBatch], new_sessions: &[String]) -> usize {
        if !self.cfg.write_session_markers {
            return 0;
        }
        let mut seen: Vec<&str> = Vec::new();
        for p in parts {
            let s = p.partition.session.as_str();
            if !self.segs.marked_sessions.contains(s)
                && !new_sessions.iter().any(|n| n == s)
                && !seen.contains(&s)
            {
                seen.push(s);
            }
        }
        seen.len()
    }

    /// Keeps (what is kept of) an unparseable body, once per distinct body, and a record
    /// saying why and what was kept.
    pub(super) fn store_body(&mut self, kept: &KeptBody, detail: &str) -> Result<(), SpoolError> {
        let h = kept.hash;
        let body = &kept.bytes;
        if self.recent_bodies.contains(&h) {
            return Ok(());
        }
        // Its record is synced here and now, which needs nothing else in flight.
        self.drain();
        let claimed = self.claim_budget(
            body.len() as u64 + QUARANTINE_RECORD_OVERHEAD + FILE_BUDGET_BYTES,
            QUARANTINE_RECORD_OVERHEAD,
        )?;
        let stored = self.store_claimed_body(kept, detail);
        // Counted as stored by now, or not written.
        self.stats.budget().release(claimed);
        stored?;
        if self.recent_bodies.len() == RECENT_BODIES {
            self.recent_bodies.pop_front();
        }
        self.recent_bodies.push_back(h);
        Ok(())
    }

    /// [`Writer::store_body`] once its room is claimed.
    fn store_claimed_body(&mut self, kept: &KeptBody, detail: &str) -> Result<(), SpoolError> {
        let (h, body) = (kept.hash, &kept.bytes);
        let rel = body_key(&self.cfg.quarantine_node, h);
        let path = self.cfg.dir.join(QUARANTINE_DIR).join(&rel);
        if path.exists() {
            return Ok(());
        }
        let n = self.segs.next_n();
        let mut f = self.segs.create_file(&path)?;
        f.write_all(body)
            .and_then(|_| f.sync_data())
            .map_err(|e| SpoolError::io("writing quarantined body", &path, e))?;
        self.stats.budget().add_stored(body.len() as u64);
        self.stats.add_file(n);
        let line = invalid_body_record(detail, n, kept);
        let hour = Hour::from_unix_seconds((n / 1_000_000_000) as i64);
        self.segs
            .segment(&Target::Quarantine(hour))?
            .pending
            .push_lines(&line);
        if let Err(e) = self.flush_group() {
            self.rollback_to_durable();
            return Err(e);
        }
        let _ = self.sealed.send(SealedFile {
            path,
            kind: FileKind::Quarantine,
            relative_key: rel,
            created_unix_nanos: n,
            bytes: body.len() as u64,
            compressible: false,
            pending_since: Some(n),
            earlier_run: false,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More partitions than one request may open: the first half stay, the rest move to the
    /// arrival hour of their stream while there is room, and what is left over (more
    /// streams than room) is quarantined; every event is placed exactly once.
    #[test]
    fn a_request_over_the_partition_bound_is_folded_then_quarantined() {
        let partition = |stream: Stream, hour: i64| Partition {
            session: "s".into(),
            node: "n".into(),
            stream,
            hour: Hour(hour),
        };
        let mut parts = Vec::new();
        let mut next = 0usize;
        let mut add = |parts: &mut Vec<PartitionBatch>, p: Partition| {
            let events = (0..2)
                .map(|_| {
                    next += 1;
                    EventSpan::new(next * 10..next * 10 + 5, None, false).unwrap()
                })
                .collect();
            parts.push(PartitionBatch {
                partition: p,
                events,
            });
        };
        // 400 hours of the node stream, then 700 jobs in one hour.
        for h in 0..400 {
            add(&mut parts, partition(Stream::Node, 1_000 + h));
        }
        for j in 0..700 {
            add(
                &mut parts,
                partition(Stream::Job(format!("{j:08x}")), 5_000),
            );
        }
        let arrival = Hour(9_999);
        let mut quarantine: Vec<Overflow> = Vec::new();
        let out = bound_partitions(&parts, arrival, &mut quarantine);
        assert_eq!(out.len(), MAX_PARTITIONS_PER_REQUEST);
        // The first half as routed.
        for (o, p) in out.iter().zip(&parts).take(PARTITIONS_KEPT_AS_ROUTED) {
            assert_eq!(o.partition, p.partition);
        }
        // The node stream's other 144 hours are one partition at the arrival hour.
        let node_arrival = out
            .iter()
            .find(|o| o.partition == partition(Stream::Node, arrival.0))
            .unwrap();
        assert_eq!(
            node_arrival.events.len(),
            2 * (400 - PARTITIONS_KEPT_AS_ROUTED)
        );
        // Every event once: in a partition or in quarantine.
        let mut starts: Vec<usize> = out
            .iter()
            .flat_map(|o| o.events.iter().map(|e| e.range().start))
            .chain(quarantine.iter().map(|q| q.span.range().start))
            .collect();
        starts.sort_unstable();
        assert_eq!(starts, (1..=next).map(|k| k * 10).collect::<Vec<_>>());
        assert!(quarantine.iter().all(|q| !q.export));
        assert_eq!(
            quarantine.len(),
            2 * (400 + 700 - PARTITIONS_KEPT_AS_ROUTED - 144)
                - 2 * (MAX_PARTITIONS_PER_REQUEST - PARTITIONS_KEPT_AS_ROUTED - 1)
        );
    }
}
