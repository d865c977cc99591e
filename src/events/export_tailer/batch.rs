//! A batch of export lines on its way to the spool: the lines routed into partitions (or
//! quarantined), stored with the offsets they reach in one spool append, so a crash repeats at
//! most one batch and never skips a line; a batch whose store fails is kept and stored again
//! before anything new is read when it holds lines of a file gone from Ray's files.

use std::borrow::Cow;
use std::collections::BTreeMap;

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
    /// from `start`, is consumed up to `offset` once the batch is stored.
    pub(super) fn record(
        &mut self,
        key: String,
        ino: u64,
        start: u64,
        offset: u64,
        head: &[u8],
        id: Identity,
    ) {
        self.bytes += offset.saturating_sub(start);
        let n = (offset.min(identity::LEGACY_FINGERPRINT_BYTES) as usize).min(head.len());
        self.offsets.insert(
            key,
            FileOffset {
                inode: ino,
                offset,
                fingerprint: xxhash_rust::xxh3::xxh3_64(&head[..n]),
                first_line: Some(id.first_line),
                born_ns: id.born_ns,
                saved_before_ns: None,
            },
        );
    }
}

/// A batch whose store failed (the spool could not write it, or refused it as over its
/// budget) and that holds lines of a file gone from Ray's files (a backup deleted by Ray's
/// rotation, `Piece::StoreFirst`): kept whole, with the offsets it reaches, and stored again
/// at the start of each pass before anything new is read. Any other failed batch is dropped
/// and its lines read again next pass from its files, in a batch sized to the room then
/// (review r41s D1: a kept batch sized to a room measured earlier never fitted again while
/// pushed events held a few KiB, and the tailer read nothing more). At most one exists (nothing is read while it does), so it
/// holds at most one batch of lines (`MAX_READ` bytes, or one cut line of at most
/// `line_limit` bytes) and their spans.
pub(super) struct Unstored {
    /// The lines, shared with the append that retries them.
    pub(super) body: Bytes,
    pub(super) partitions: Vec<PartitionBatch>,
    pub(super) quarantined: Vec<QuarantinedEvent>,
    /// Where each file's reading ends once the batch is stored.
    pub(super) offsets: BTreeMap<String, FileOffset>,
    /// Bytes of the files it consumes.
    pub(super) bytes: u64,
    /// Failed stores so far (the first is logged as a warning, the rest at debug level).
    pub(super) failures: u32,
    /// Kept when its store fails: it holds lines of a file that is gone.
    pub(super) keep: bool,
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
    /// it holds lines of a file that is gone, kept if its store fails ([`Unstored`]).
    pub(super) async fn flush(
        &mut self,
        batch: &mut Batch,
        keep: bool,
    ) -> Result<PassReport, StoreError> {
        let b = std::mem::take(batch);
        if b.is_empty() {
            return Ok(PassReport::default());
        }
        self.store(Unstored {
            body: Bytes::from(b.body),
            partitions: b.partitions,
            quarantined: b.quarantined,
            offsets: b.offsets,
            bytes: b.bytes,
            failures: 0,
            keep,
        })
        .await
    }

    /// Stores a batch and, with it, the offsets it reaches (a [`Checkpoint`] the spool
    /// writes once the lines are durable and before any segment holding them can be
    /// uploaded). Refused or failed (the spool rolls the whole batch back), its offsets are
    /// not advanced and the batch is kept in [`Self::unstored`], stored again next pass
    /// before anything new is read: never dropped, as its lines may be gone from Ray's
    /// files (review r41q: a backup deleted by Ray's rotation). Errors are logged here.
    pub(super) async fn store(&mut self, u: Unstored) -> Result<PassReport, StoreError> {
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
            Err(e @ StoreError::Spool(SpoolError::Checkpoint { .. })) => {
                // The lines are stored, but their offsets are not saved: the spool seals
                // nothing until a later checkpoint (holding these offsets) is, so reading
                // stops until [`Self::save`] succeeds.
                tracing::warn!(error = %e, "export events stored but their offsets not saved; saved again next pass");
                self.dirty = true;
                Err(e)
            }
            Err(e) => {
                for (k, before) in previous {
                    match before {
                        Some(o) => self.state.files.insert(k, o),
                        None => self.state.files.remove(&k),
                    };
                }
                if !u.keep {
                    tracing::warn!(error = %e, "storing export events failed; read again next pass");
                    return Err(e);
                }
                let failures = u.failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(error = %e, "storing export events failed; the batch is kept and stored again next pass, before anything new is read");
                } else {
                    tracing::debug!(error = %e, failures, "storing kept export events failed again");
                }
                self.unstored = Some(Unstored { failures, ..u });
                Err(e)
            }
        }
    }
}
