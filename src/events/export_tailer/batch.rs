//! A batch of export lines on its way to the spool: the lines routed into partitions (or
//! quarantined), stored with the offsets they reach in one spool append, so a crash repeats at
//! most one batch and never skips a line; a batch whose store fails is kept and stored again
//! before anything new is read when it holds lines of a file gone from Ray's files.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::ops::Range;

use bytes::Bytes;
use serde::Deserialize;

use crate::contract::events::EXPORT_NODE_GROUP;
use crate::contract::{id_to_hex, is_safe_segment, Hour, Partition, Stream};
use crate::events::dedup::id_hash;
use crate::events::quarantine::{raw_record, QuarantineReason};
use crate::events::spool::{
    AppendBatch, Checkpoint, EventSpan, LineSource, PartitionBatch, QuarantinedEvent, SpoolError,
    FILE_BUDGET_BYTES, MAX_PARTITIONS_PER_REQUEST,
};

use super::identity::{self, Identity};
use super::offsets::{offsets_path, FileOffset};
use super::{ExportTailer, FileRef, PassReport, StoreError, PARTITION_FILES_COST};

/// The routing view of one export event line.
#[derive(Deserialize)]
struct ExportLine<'a> {
    #[serde(borrow, default)]
    event_id: Option<Cow<'a, str>>,
    #[serde(default)]
    timestamp: Option<i64>,
    #[serde(borrow, default)]
    source_type: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    event_data: Option<ExportData<'a>>,
}

#[derive(Deserialize)]
struct ExportData<'a> {
    #[serde(borrow, default)]
    job_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    run_id: Option<Cow<'a, str>>,
}

/// Whole lines read in one pass and not yet stored, from one file or many (a pass over
/// thousands of small files makes one append and one save of the offsets per batch, not per
/// file).
#[derive(Default)]
pub(super) struct Batch {
    /// The lines, file after file.
    pub(super) body: Vec<u8>,
    pub(super) partitions: Vec<PartitionBatch>,
    pub(super) quarantined: Vec<QuarantinedEvent>,
    /// Where each file's reading ends once the batch is stored.
    pub(super) offsets: BTreeMap<String, FileOffset>,
    /// Bytes the batch adds to the spool (a quarantined line as its record).
    pub(super) cost: u64,
    /// Most bytes it may add: the spool's room below the yield mark when it was started
    /// ([`ExportTailer::spool_room`]), at most `MAX_READ`.
    pub(super) room: u64,
    /// Room below the yield mark when it was started, not bounded by `MAX_READ`: an
    /// empty batch takes one quarantine record larger than `room` (a cut line's, or a
    /// whole line's that is not JSON, up to six times its bytes) while it fits here, so
    /// such a line never stalls the file ([`Batch::takes`]).
    pub(super) spare: u64,
    /// Bytes of the files it consumes.
    pub(super) bytes: u64,
    /// Where each piece read is, in the body and in its file, in body order.
    pub(super) pieces: Vec<FilePiece>,
}

/// A piece of one file read into a batch: where its bytes are in the batch's body and in the
/// file, so that a part of the batch (its lines up to a point of the body) knows the offset
/// it reaches in each file ([`Unstored::next_part`]).
#[derive(Debug, Clone)]
pub(super) struct FilePiece {
    /// The file's key in the offsets (`<session>/<inode>`).
    key: String,
    /// Its bytes in the body (a torn last line's added newline included).
    body: Range<usize>,
    /// The file's offset the piece was read from, and the one it reaches.
    from: u64,
    to: u64,
    /// The file's first bytes (at most 64): an offset short of them has the fingerprint of
    /// fewer ([`FileOffset::fingerprint`]).
    head: Vec<u8>,
}

impl Batch {
    /// Whether nothing was read into it: judged by its lines, not its offsets, so lines
    /// read are stored whatever became of their file's entry.
    pub(super) fn is_empty(&self) -> bool {
        self.body.is_empty() && self.offsets.is_empty()
    }

    /// Whether the batch takes `cost` more bytes: while they fit its room, and one record
    /// alone in an empty batch while it fits the spool's room below the yield mark (a
    /// quarantine record of a line of up to `MAX_READ` bytes may be larger than the room).
    pub(super) fn takes(&self, cost: u64) -> bool {
        self.cost.saturating_add(cost) <= self.room || (self.cost == 0 && cost <= self.spare)
    }

    /// Records that the file `key` (inode `ino`, first bytes `head`, identity `id`), read
    /// from `start` into `body` of the batch's body, is consumed up to `offset` once the
    /// batch is stored.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record(
        &mut self,
        key: String,
        ino: u64,
        start: u64,
        offset: u64,
        head: &[u8],
        id: Identity,
        body: Range<usize>,
    ) {
        self.bytes += offset.saturating_sub(start);
        self.pieces.push(FilePiece {
            key: key.clone(),
            body,
            from: start,
            to: offset,
            head: head[..head.len().min(identity::LEGACY_FINGERPRINT_BYTES as usize)].to_vec(),
        });
        self.offsets.insert(
            key,
            FileOffset {
                inode: ino,
                offset,
                fingerprint: fingerprint(head, offset),
                first_line: Some(id.first_line),
                born_ns: id.born_ns,
                saved_before_ns: None,
            },
        );
    }
}

/// The fingerprint an older collector keeps of a file read up to `offset`: of its first
/// `min(offset, 64)` bytes (`head` holds at least those).
fn fingerprint(head: &[u8], offset: u64) -> u64 {
    let n = (offset.min(identity::LEGACY_FINGERPRINT_BYTES) as usize).min(head.len());
    xxhash_rust::xxh3::xxh3_64(&head[..n])
}

/// A batch whose store failed (the spool could not write it, or refused it as over its
/// budget) and that holds lines of a file gone from Ray's files (a backup deleted by Ray's
/// rotation, `Piece::StoreFirst`): kept in memory, with the offsets it reaches, and stored at
/// the start of each pass before anything new is read. It is stored in parts sized to the room
/// below the yield mark at that moment ([`Unstored::next_part`]), each with the offsets its
/// lines reach, so it is stored as uploads make room and never takes the spool past the mark
/// (review r41s D1: stored whole, a batch read at a low copy ratio needed more than the whole
/// budget once pushed events raised the ratio, and was refused for as long as they held a few
/// KiB of the spool; nothing new was read meanwhile). Any other failed batch is dropped and
/// its lines read again next pass from its files, in a batch sized to the room then. At most
/// one exists (nothing is read while it does), so it holds at most one batch of lines
/// (`MAX_READ` bytes, or one cut line of at most `line_limit` bytes) and their spans.
pub(super) struct Unstored {
    /// The lines, shared with the appends that store them.
    pub(super) body: Bytes,
    pub(super) partitions: Vec<PartitionBatch>,
    pub(super) quarantined: Vec<QuarantinedEvent>,
    /// Where each file's reading ends once the whole batch is stored.
    pub(super) offsets: BTreeMap<String, FileOffset>,
    /// Where each piece read is, in the body and in its file.
    pub(super) pieces: Vec<FilePiece>,
    /// Bytes of the files it consumes.
    pub(super) bytes: u64,
    /// The lines before this point of the body are stored (by earlier parts).
    pub(super) stored_to: usize,
    /// Failed stores so far (the first is logged as a warning, the rest at debug level).
    pub(super) failures: u32,
}

/// Lines of a batch stored in one append, with the offsets they reach.
pub(super) struct Part {
    pub(super) body: Bytes,
    pub(super) partitions: Vec<PartitionBatch>,
    pub(super) quarantined: Vec<QuarantinedEvent>,
    pub(super) offsets: BTreeMap<String, FileOffset>,
    pub(super) bytes: u64,
    /// Where its lines end in the body: `None` for the rest of the batch.
    pub(super) end: Option<usize>,
}

/// One line of an [`Unstored`] batch, for sizing a part.
enum Unit {
    /// A span of partition `.0`.
    Event(usize),
    /// Quarantined line `.0`.
    Quarantined(usize),
}

impl Unstored {
    /// The next part to store: the lines from [`Self::stored_to`] on, in body order, while
    /// they fit `room` (counted as a batch counts them when it reads: a line's bytes, each
    /// partition's files and each new session's marker, a quarantined line as its record),
    /// with the offsets they reach in each file; all that is left when it fits. `None` when
    /// not even the first line fits: it waits for uploads to make room.
    pub(super) fn next_part(&self, room: u64, stored_sessions: &HashSet<String>) -> Option<Part> {
        let from = self.stored_to;
        let mut units: Vec<(usize, Unit)> = Vec::new();
        for (i, p) in self.partitions.iter().enumerate() {
            for e in p.events.iter().filter(|e| e.range().start >= from) {
                units.push((e.range().start, Unit::Event(i)));
            }
        }
        for (i, q) in self.quarantined.iter().enumerate() {
            if q.start >= from {
                units.push((q.start, Unit::Quarantined(i)));
            }
        }
        units.sort_by_key(|(start, _)| *start);
        let mut cost = 0u64;
        let mut partitions: HashSet<usize> = HashSet::new();
        let mut sessions: HashSet<&str> = HashSet::new();
        let mut quarantine_opened = false;
        let mut end = None;
        for (start, unit) in &units {
            let c = match unit {
                Unit::Event(i) => {
                    let p = &self.partitions[*i];
                    let len = p
                        .events
                        .iter()
                        .find(|e| e.range().start == *start)
                        .map_or(0, |e| e.len() as u64);
                    let new = partitions.insert(*i);
                    let session = p.partition.session.as_str();
                    let new_session =
                        new && !stored_sessions.contains(session) && sessions.insert(session);
                    len + 1
                        + if new { PARTITION_FILES_COST } else { 0 }
                        + if new_session { FILE_BUDGET_BYTES } else { 0 }
                }
                Unit::Quarantined(i) => {
                    let q = &self.quarantined[*i];
                    let first = !quarantine_opened;
                    quarantine_opened = true;
                    let raw = &self.body[q.start..q.end];
                    let record = match &q.source {
                        Some(s) => raw_record(q.reason, &s.file, s.offset, raw, Some(0)).len(),
                        None => raw.len() + 1024,
                    };
                    record as u64 + if first { PARTITION_FILES_COST } else { 0 }
                }
            };
            if cost.saturating_add(c) > room {
                if cost == 0 {
                    return None;
                }
                end = Some(*start);
                break;
            }
            cost += c;
        }
        let before = |r: &Range<usize>| r.start >= from && end.is_none_or(|e| r.start < e);
        let partitions = self
            .partitions
            .iter()
            .filter_map(|p| {
                let events: Vec<EventSpan> = p
                    .events
                    .iter()
                    .filter(|e| before(&e.range()))
                    .copied()
                    .collect();
                (!events.is_empty()).then(|| PartitionBatch {
                    partition: p.partition.clone(),
                    events,
                })
            })
            .collect();
        let quarantined = self
            .quarantined
            .iter()
            .filter(|q| before(&(q.start..q.end)))
            .cloned()
            .collect();
        let (offsets, bytes) = match end {
            None => (
                self.offsets.clone(),
                self.bytes.saturating_sub(self.part_bytes(self.stored_to)),
            ),
            Some(end) => (
                self.offsets_at(end),
                self.part_bytes(end).saturating_sub(self.part_bytes(from)),
            ),
        };
        Some(Part {
            body: self.body.clone(),
            partitions,
            quarantined,
            offsets,
            bytes,
            end,
        })
    }

    /// Where each file's reading ends once the lines before `end` (a line's start in the
    /// body) are stored: the files read before it, to the offset that point is at.
    fn offsets_at(&self, end: usize) -> BTreeMap<String, FileOffset> {
        let mut reach: BTreeMap<&str, (u64, &FilePiece)> = BTreeMap::new();
        for piece in self.pieces.iter().filter(|p| p.body.start < end) {
            let at = piece.reach(end);
            let e = reach.entry(piece.key.as_str()).or_insert((at, piece));
            if at > e.0 {
                *e = (at, piece);
            }
        }
        reach
            .into_iter()
            .filter_map(|(key, (at, piece))| {
                let whole = self.offsets.get(key)?;
                let offset = at.min(whole.offset);
                Some((
                    key.to_string(),
                    FileOffset {
                        offset,
                        fingerprint: fingerprint(&piece.head, offset),
                        ..*whole
                    },
                ))
            })
            .collect()
    }

    /// Bytes of the files the lines before `end` of the body consume.
    fn part_bytes(&self, end: usize) -> u64 {
        self.pieces
            .iter()
            .filter(|p| p.body.start < end)
            .map(|p| p.reach(end) - p.from)
            .sum()
    }
}

impl FilePiece {
    /// The file's offset the lines of this piece before `end` of the body reach (`end` at or
    /// after the piece's start).
    fn reach(&self, end: usize) -> u64 {
        let read = end.min(self.body.end).saturating_sub(self.body.start) as u64;
        (self.from + read).min(self.to)
    }
}

/// Where one line goes.
enum Routed {
    Blank,
    Quarantine(QuarantineReason),
    Event {
        partition: Partition,
        id: Option<u64>,
        /// A Train run and its job, remembered once the line is taken.
        run: Option<(String, String)>,
    },
}

impl ExportTailer {
    /// Routes the whole lines of `batch.body[base..base + end]` (read at `file_offset` of
    /// the file, whose identity is `file_id`) into the batch, while they fit its room and
    /// are shorter than `limit` (a longer one is cut by the next read, whatever the room);
    /// returns the bytes taken.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn route_into(
        &mut self,
        batch: &mut Batch,
        base: usize,
        end: usize,
        file: &FileRef<'_>,
        file_id: u64,
        file_offset: u64,
        limit: u64,
    ) -> usize {
        let source = |offset| {
            Some(LineSource {
                file: file.name.to_string(),
                file_id,
                offset,
            })
        };
        let stop = base + end;
        let mut pos = base;
        while pos < stop {
            let line_end = batch.body[pos..stop]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(stop, |i| pos + i);
            if (line_end - pos) as u64 >= limit {
                break;
            }
            let line = &batch.body[pos..line_end];
            let offset = file_offset + (pos - base) as u64;
            let routed = self.route_line(line, file.session, file.node);
            let cost = match &routed {
                // Not stored, but counted: every byte read into the batch counts against
                // its bound, so no run of blank lines makes one batch hold a whole file.
                Routed::Blank => line.len() as u64 + 1,
                Routed::Event { partition, .. } => {
                    let new = !batch.partitions.iter().any(|p| p.partition == *partition);
                    // One request's partitions are bounded by the spool (past the bound
                    // it files events under the arrival hour, then quarantines them): a
                    // batch ends before it, the rest goes in the next one.
                    if new && batch.partitions.len() >= MAX_PARTITIONS_PER_REQUEST {
                        break;
                    }
                    // A session this tailer never stored a line of may get its marker file
                    // with this batch (on the head), counted like any spool file (review
                    // r41n D4: 300 new sessions' markers took the spool past 90 %).
                    let new_session = new
                        && !self.stored_sessions.contains(&partition.session)
                        && !batch
                            .partitions
                            .iter()
                            .any(|p| p.partition.session == partition.session);
                    line.len() as u64
                        + 1
                        + if new { PARTITION_FILES_COST } else { 0 }
                        + if new_session { FILE_BUDGET_BYTES } else { 0 }
                }
                Routed::Quarantine(reason) => {
                    let first = batch.quarantined.is_empty();
                    // The key's value does not change the record's length.
                    raw_record(*reason, file.name, offset, line, Some(0)).len() as u64
                        + if first { PARTITION_FILES_COST } else { 0 }
                }
            };
            if !batch.takes(cost) {
                break;
            }
            batch.cost += cost;
            match routed {
                Routed::Blank => {}
                Routed::Quarantine(reason) => batch.quarantined.push(QuarantinedEvent {
                    reason,
                    start: pos,
                    end: line_end,
                    source: source(offset),
                }),
                Routed::Event { partition, id, run } => {
                    if let Some((run, job)) = run {
                        if self.state.run_jobs.get(&run) != Some(&job) {
                            self.state.run_jobs.insert(run, job);
                            self.dirty = true;
                        }
                    }
                    // Every byte read into a batch counts against its room (at most
                    // MAX_READ), so its body stays far below what a span can address.
                    let span = EventSpan::new(pos..line_end, id, false);
                    match (
                        span,
                        batch
                            .partitions
                            .iter_mut()
                            .find(|p| p.partition == partition),
                    ) {
                        (Some(span), Some(p)) => p.events.push(span),
                        (Some(span), None) => batch.partitions.push(PartitionBatch {
                            partition,
                            events: vec![span],
                        }),
                        (None, _) => batch.quarantined.push(QuarantinedEvent {
                            reason: QuarantineReason::ExportBadEvent,
                            start: pos,
                            end: line_end,
                            source: source(offset),
                        }),
                    }
                }
            }
            pos = line_end + 1;
        }
        pos.min(stop) - base
    }

    /// Where one line goes.
    fn route_line(&self, line: &[u8], session: &str, node: &str) -> Routed {
        if line.iter().all(|c| c.is_ascii_whitespace()) {
            return Routed::Blank;
        }
        let parsed: ExportLine = match serde_json::from_slice(line) {
            Ok(p) => p,
            Err(e) if e.is_syntax() || e.is_eof() => {
                return Routed::Quarantine(QuarantineReason::ExportNotJson)
            }
            Err(_) => return Routed::Quarantine(QuarantineReason::ExportBadEvent),
        };
        let Some(ts) = parsed.timestamp else {
            return Routed::Quarantine(QuarantineReason::ExportBadEvent);
        };
        let data = parsed.event_data.as_ref();
        let job = match data
            .and_then(|d| d.job_id.as_deref())
            .filter(|j| !j.is_empty())
        {
            Some(j) => match id_to_hex(j) {
                Ok(h) => Some(h.as_str().to_string()),
                Err(_) => return Routed::Quarantine(QuarantineReason::ExportBadEvent),
            },
            None => None,
        };
        let source = parsed.source_type.as_deref().unwrap_or("");
        // Train runs name their job; their attempts only their run.
        let mut run = None;
        let job = match (source, data) {
            ("EXPORT_TRAIN_RUN", Some(d)) => {
                if let (Some(r), Some(j)) = (d.id.as_deref(), job.as_ref()) {
                    if is_safe_segment(r) {
                        run = Some((r.to_string(), j.clone()));
                    }
                }
                job
            }
            ("EXPORT_TRAIN_RUN_ATTEMPT", Some(d)) if job.is_none() => d
                .run_id
                .as_deref()
                .and_then(|r| self.state.run_jobs.get(r).cloned()),
            _ => job,
        };
        let group = job.unwrap_or_else(|| EXPORT_NODE_GROUP.to_string());
        Routed::Event {
            partition: Partition {
                session: session.to_string(),
                node: node.to_string(),
                stream: Stream::Export(group),
                hour: Hour::from_unix_seconds(ts),
            },
            id: parsed
                .event_id
                .as_deref()
                .map(|id| id_hash(id.as_bytes()) ^ crate::events::spool::EXPORT_ID_SALT),
            run,
        }
    }

    /// Stores the batch and, with it, the offsets it reaches (see [`Self::store`]); `keep`:
    /// it holds lines of a file that is gone, so it is kept if not stored whole
    /// ([`Unstored`], [`Self::store_kept`]); any other batch whose store fails is dropped, its
    /// lines read again next pass.
    pub(super) async fn flush(
        &mut self,
        batch: &mut Batch,
        keep: bool,
    ) -> Result<PassReport, StoreError> {
        let b = std::mem::take(batch);
        if b.is_empty() {
            return Ok(PassReport::default());
        }
        let body = Bytes::from(b.body);
        if !keep {
            let part = Part {
                body,
                partitions: b.partitions,
                quarantined: b.quarantined,
                offsets: b.offsets,
                bytes: b.bytes,
                end: None,
            };
            return match self.store(&part).await {
                Err(e) if !e.is_checkpoint() => {
                    tracing::warn!(error = %e, "storing export events failed; read again next pass");
                    Err(e)
                }
                r => r,
            };
        }
        self.unstored = Some(Unstored {
            body,
            partitions: b.partitions,
            quarantined: b.quarantined,
            offsets: b.offsets,
            pieces: b.pieces,
            bytes: b.bytes,
            stored_to: 0,
            failures: 0,
        });
        self.store_kept().await
    }

    /// Stores the kept batch ([`Self::unstored`]) part after part, each sized to the room
    /// below the yield mark at that moment ([`Unstored::next_part`]), until it is all stored
    /// (then it is dropped), a part fails (kept, from that part on, for the next pass: never
    /// dropped, as its lines may be gone from Ray's files), or the next line has no room
    /// ([`StoreError::NoRoom`]: it waits for uploads).
    pub(super) async fn store_kept(&mut self) -> Result<PassReport, StoreError> {
        let mut total = PassReport::default();
        while let Some(u) = self.unstored.as_ref() {
            let Some(part) = u.next_part(self.spool_room(), &self.stored_sessions) else {
                tracing::debug!(
                    stored_bytes = u.stored_to,
                    "kept export events wait for room below the spool's mark"
                );
                return Err(StoreError::NoRoom);
            };
            let result = self.store(&part).await;
            let Some(u) = self.unstored.as_mut() else {
                break;
            };
            match result {
                // Stored (with its offsets saved, or not yet: see `store`).
                Ok(_) | Err(StoreError::Spool(SpoolError::Checkpoint { .. })) => {
                    match part.end {
                        Some(end) => {
                            tracing::debug!(
                                stored_to = end,
                                of = u.body.len(),
                                "part of the kept export events stored"
                            );
                            u.stored_to = end;
                        }
                        None => {
                            if u.failures > 0 || u.stored_to > 0 {
                                tracing::info!(
                                    failures = u.failures,
                                    "export events kept after a failed store are stored"
                                );
                            }
                            self.unstored = None;
                        }
                    }
                    match result {
                        Ok(r) => total.add(r),
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => {
                    u.failures = u.failures.saturating_add(1);
                    if u.failures == 1 {
                        tracing::warn!(error = %e, "storing export events failed; the batch is kept and stored again next pass, before anything new is read");
                    } else {
                        tracing::debug!(error = %e, failures = u.failures, "storing kept export events failed again");
                    }
                    return Err(e);
                }
            }
        }
        Ok(total)
    }

    /// Stores lines and, with them, the offsets they reach (a [`Checkpoint`] the spool
    /// writes once the lines are durable and before any segment holding them can be
    /// uploaded). Refused or failed (the spool rolls the whole append back), the offsets are
    /// not advanced; the caller says what becomes of the lines. Stored with the checkpoint
    /// unsaved, the offsets stay (saved again next pass, see [`Self::save`]).
    pub(super) async fn store(&mut self, u: &Part) -> Result<PassReport, StoreError> {
        let previous: Vec<(String, Option<FileOffset>)> = u
            .offsets
            .iter()
            .map(|(k, o)| (k.clone(), self.state.files.insert(k.clone(), *o)))
            .collect();
        let checkpoint = serde_json::to_vec(&self.state).map(|bytes| Checkpoint {
            path: offsets_path(&self.cfg.state_dir),
            bytes,
        });
        let outcome = match checkpoint {
            Ok(c) => self
                .spool
                .append(AppendBatch {
                    body: u.body.clone(),
                    partitions: u.partitions.clone(),
                    quarantined: u.quarantined.clone(),
                    quarantine_dropped: 0,
                    checkpoint: Some(c),
                })
                .await
                .map_err(StoreError::Spool),
            Err(e) => Err(StoreError::Encode(e)),
        };
        match outcome {
            Ok(o) => {
                // The checkpoint holds the whole state, prunes and runs included.
                self.dirty = false;
                for p in &u.partitions {
                    if !self.stored_sessions.contains(&p.partition.session) {
                        self.stored_sessions.insert(p.partition.session.clone());
                    }
                }
                Ok(PassReport {
                    accepted: o.accepted,
                    duplicates: o.duplicates,
                    quarantined: o.quarantined,
                    bytes: u.bytes,
                })
            }
            Err(e) if e.is_checkpoint() => {
                // The lines are stored, but their offsets are not saved: the spool seals
                // nothing until a later checkpoint (holding these offsets) is, so reading
                // stops until [`Self::save`] succeeds.
                tracing::warn!(error = %e, "export events stored but their offsets not saved; saved again next pass");
                self.dirty = true;
                for p in &u.partitions {
                    if !self.stored_sessions.contains(&p.partition.session) {
                        self.stored_sessions.insert(p.partition.session.clone());
                    }
                }
                Err(e)
            }
            Err(e) => {
                for (k, before) in previous {
                    match before {
                        Some(o) => self.state.files.insert(k, o),
                        None => self.state.files.remove(&k),
                    };
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{Hour, Partition, Stream};

    fn offset(inode: u64, offset: u64) -> FileOffset {
        FileOffset {
            inode,
            offset,
            fingerprint: 0,
            first_line: None,
            born_ns: None,
            saved_before_ns: None,
        }
    }

    /// A kept batch of two files (`a`: three lines read from offset 100 in two pieces, the
    /// last a torn line with its added newline; `b`: one line and a bad one, from 0) is
    /// stored in parts that fit the room, each with the offsets its lines reach.
    #[test]
    fn a_kept_batch_is_stored_in_parts_with_the_offsets_they_reach() {
        let body = b"a-one\na-two\na-torn\nb-one\nb-bad\n".to_vec();
        let lines: Vec<(usize, usize)> = vec![(0, 5), (6, 11), (12, 18), (19, 24), (25, 30)];
        let partition = Partition {
            session: "s".into(),
            node: "n".into(),
            stream: Stream::Export("node".into()),
            hour: Hour::from_unix_seconds(1_795_313_307),
        };
        let spans = lines[..4]
            .iter()
            .map(|&(s, e)| EventSpan::new(s..e, Some(s as u64 + 1), false).unwrap())
            .collect();
        let piece = |key: &str, body: Range<usize>, from: u64, to: u64| FilePiece {
            key: key.into(),
            body,
            from,
            to,
            head: b"head of the file, sixty-four bytes or fewer".to_vec(),
        };
        let u = Unstored {
            body: Bytes::from(body),
            partitions: vec![PartitionBatch {
                partition,
                events: spans,
            }],
            quarantined: vec![QuarantinedEvent {
                reason: QuarantineReason::ExportNotJson,
                start: 25,
                end: 30,
                source: Some(LineSource {
                    file: "b".into(),
                    file_id: 7,
                    offset: 6,
                }),
            }],
            offsets: BTreeMap::from([("a".into(), offset(1, 118)), ("b".into(), offset(2, 12))]),
            pieces: vec![
                piece("a", 0..12, 100, 112),
                // Torn: 6 bytes of the file and the newline added.
                piece("a", 12..19, 112, 118),
                piece("b", 19..31, 0, 12),
            ],
            bytes: 30,
            stored_to: 0,
            failures: 0,
        };
        let none = HashSet::new();
        // The first line and its partition's files, with its session's marker: nothing less.
        let first = 6 + PARTITION_FILES_COST + FILE_BUDGET_BYTES;
        assert!(u.next_part(first - 1, &none).is_none());
        let p = u.next_part(first, &none).unwrap();
        assert_eq!(p.end, Some(6));
        assert_eq!(p.partitions[0].events.len(), 1);
        assert!(p.quarantined.is_empty());
        assert_eq!(p.offsets.len(), 1);
        assert_eq!(p.offsets["a"].offset, 106);
        assert_eq!(
            p.offsets["a"].fingerprint,
            fingerprint(&u.pieces[0].head, 106)
        );
        assert_eq!(p.bytes, 6);
        // A session already stored has its marker: the room of the line and the files.
        let stored = HashSet::from(["s".to_string()]);
        assert_eq!(
            u.next_part(first - FILE_BUDGET_BYTES, &stored).unwrap().end,
            Some(6)
        );
        // From the third line (the torn one) to before the bad line.
        let u = Unstored { stored_to: 12, ..u };
        let p = u
            .next_part(7 + 6 + PARTITION_FILES_COST + FILE_BUDGET_BYTES, &none)
            .unwrap();
        assert_eq!(p.end, Some(25));
        assert_eq!(
            p.offsets["a"].offset, 118,
            "the torn line's added newline is not the file's"
        );
        assert_eq!(p.offsets["b"].offset, 6);
        assert_eq!(p.bytes, 6 + 6);
        assert!(p.quarantined.is_empty());
        // The rest: the bad line alone, with the offsets of the whole batch.
        let u = Unstored { stored_to: 25, ..u };
        let p = u.next_part(u64::MAX, &none).unwrap();
        assert_eq!(p.end, None);
        assert!(p.partitions.is_empty());
        assert_eq!(p.quarantined.len(), 1);
        assert_eq!(p.offsets, u.offsets);
    }
}
