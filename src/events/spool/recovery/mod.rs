//! What an earlier run left in the spool, found at start: every segment and quarantine file
//! is sealed and queued for upload; an incomplete last line (a crash mid-write) is cut into
//! quarantine before its segment shrinks (on a full disk the segment is cut all the same and
//! the record written once there is room: a start must always get to uploading, which frees
//! the disk); the newest event ids are reloaded into the deduplication window, from the ids
//! journal ([`super::journal`]: the answered groups, including those whose segments were
//! uploaded and deleted) and from the files in the spool, so a batch Ray resends across our
//! restart is still recognised; sessions with events get their markers.
//!
//! A segment whose rolled-back lines could not be truncated before the restart has its
//! durable length recorded in the cuts folder: it is truncated to it now (or, if that fails
//! again, uploaded and read for ids only up to it).
//!
//! Which ids from the files: the journal's record says where its knowledge of the spool
//! ends ([`super::journal::Lengths`]). The lines of a file past the length it gives, and
//! every line of a file numbered after the newest it knows of, were stored after its last
//! record read: a group in flight at a kill -9 (never answered; Ray resends it, and its
//! events are in the spool and will be uploaded), or groups answered just before a power
//! loss took the journal's last records. Their ids are the newest: they go after the
//! journal's, as they were in the window before the crash ([`unrecorded_ids`]). Any other
//! line is covered by the journal (its id is there, or left the window long ago) and adds
//! nothing: a quiet partition's open segment never pushes an answered id out, whatever its
//! time or the clock's (reviews r40d D1, r40f D1-D3). Their order across files is recorded
//! nowhere, so all of them are reloaded, even beyond a window made smaller since the run that
//! answered them (review r40m D1), and all stay until a window of new ids was accepted
//! ([`crate::util::dedup::DedupWindow::insert_unordered`]). Bounded: a journal fsync'd every
//! quarter window leaves at most a quarter of the previous run's window (or one request) to
//! reload, and reading stops at the window or `ids::MAX_UNRECORDED_IDS` (262,144 ids, the default
//! window), whichever is larger, or at the window when the journal is damaged; so a start's
//! work and memory are bounded by that, not by the spool's size.
//!
//! A journal written by the binaries before (ids only, no lengths) is read once, at the
//! upgrade's first start, and the spool's ids are placed beside it as those binaries did
//! ([`newest_ids`]): by the files' modification times (theirs gave every file of a group
//! commit that group's time), the files written last read side by side from their ends, an
//! id counting as newer than the journal's only when written after them. That start writes
//! the journal in the new format.
//!
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

mod ids;

use super::journal::Loaded;
use super::segments::Target;
use super::writer::{journal_head, Writer};
use super::{
    FileKind, RecoveryReport, SealedFile, SpoolError, CUTS_DIR, EVENTS_DIR, EXPORT_ID_SALT,
    GROWTH_DIR, MARKERS_DIR, QUARANTINE_DIR,
};
use crate::contract::quarantine::{parse_key, QuarantineKey};
use crate::contract::{is_safe_segment, Hour, Partition};
use crate::events::quarantine::{raw_record, QuarantineReason};
use crate::metrics as m;
use crate::util::dedup::PassThrough;
use crate::util::time::unix_nanos;
use ids::{
    newest_by_time, newest_ids, unrecorded_ids, unrecorded_limit, IdFile, IdLines,
    MAX_NO_JOURNAL_IDS,
};
pub(super) use ids::{refill_window, SpoolIds};

impl Writer {
    /// Walks what an earlier run left: every file is sealed and queued; torn tails are cut.
    pub(super) fn recover(&mut self, loaded: Loaded) -> Result<RecoveryReport, SpoolError> {
        let mut report = RecoveryReport::default();
        // New files are numbered after every file the journal knows of, so a file numbered
        // above its last one was created after its last record (whatever the clock did).
        if let Some(lengths) = &loaded.lengths {
            self.segs.last_n = self.segs.last_n.max(lengths.last_n);
        }
        let mut cuts = self.read_cuts()?;
        let mut found: Vec<(SealedFile, Option<Partition>)> = Vec::new();
        // The files that hold event ids, to reload the newest first.
        let mut id_files: Vec<IdFile> = Vec::new();
        for kind in [FileKind::Events, FileKind::Quarantine] {
            let base = self.cfg.dir.join(match kind {
                FileKind::Events => EVENTS_DIR,
                _ => QUARANTINE_DIR,
            });
            let mut files = Vec::new();
            walk_files(&base, &mut files).map_err(|e| SpoolError::io("listing", &base, e))?;
            for path in files {
                let rel = match path.strip_prefix(&base).ok().and_then(|p| p.to_str()) {
                    Some(r) => r.to_string(),
                    None => {
                        report.unknown.push(path);
                        continue;
                    }
                };
                let meta =
                    fs::symlink_metadata(&path).map_err(|e| SpoolError::io("reading", &path, e))?;
                if !meta.file_type().is_file() {
                    report.unknown.push(path);
                    continue;
                }
                let (partition, created, compressible) = match kind {
                    FileKind::Events => match Partition::parse_relative_key(&rel) {
                        Some((p, n)) => (Some(p), n, true),
                        None => {
                            report.unknown.push(path);
                            continue;
                        }
                    },
                    _ => match parse_key(&rel) {
                        Some(QuarantineKey::Records { created_unix_nanos }) => {
                            (None, created_unix_nanos, true)
                        }
                        Some(QuarantineKey::Body) => (None, 0, false),
                        None => {
                            report.unknown.push(path);
                            continue;
                        }
                    },
                };
                self.segs.last_n = self.segs.last_n.max(created);
                let mut bytes = meta.len();
                if let Some((cut, len)) = path.file_name().and_then(|n| cuts.remove(n)) {
                    bytes = bytes.min(len);
                    apply_cut(&path, &cut, bytes);
                }
                let ids = match (&partition, kind) {
                    (Some(p), _) => Some(match p.stream {
                        crate::contract::Stream::Export(_) => IdLines::Events(EXPORT_ID_SALT),
                        _ => IdLines::Events(0),
                    }),
                    // Records files (a kept body is not one): valid events kept as
                    // `too_many_partitions` count as stored.
                    (None, FileKind::Quarantine) if compressible => Some(IdLines::Overflow),
                    _ => None,
                };
                if let Some(lines) = ids {
                    id_files.push(IdFile {
                        path: path.clone(),
                        lines,
                        len: bytes,
                        modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        created,
                        floor: 0,
                    });
                }
                found.push((
                    SealedFile {
                        path,
                        kind,
                        relative_key: rel,
                        created_unix_nanos: created,
                        bytes,
                        compressible,
                        pending_since: Some(created),
                        earlier_run: true,
                    },
                    partition,
                ));
            }
        }
        // The publisher's shadows and records of the segments found are kept (the upload
        // continues their objects) and counted in the budget; any other is left over from a
        // segment already uploaded.
        let mut growth: HashSet<String> = HashSet::new();
        for (f, _) in &found {
            if let Some(name) = f.path.file_name().and_then(|n| n.to_str()) {
                let (shadow, record) = super::growth_names(f.kind, name);
                growth.insert(shadow);
                growth.insert(record);
            }
        }
        let growth_dir = self.cfg.dir.join(GROWTH_DIR);
        if let Ok(entries) = fs::read_dir(&growth_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if growth.contains(&name) {
                    // Each file counts as a spool file (the publisher's count of its
                    // segment's growth files starts from the ones that exist).
                    self.stats.budget().add_growth_file();
                    if name.ends_with(".gz") {
                        let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
                        self.stats.budget().add_stored(len);
                    }
                } else {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
        // A length recorded for a segment that is gone (uploaded) is no longer needed.
        for (cut, _) in cuts.into_values() {
            let _ = fs::remove_file(&cut);
        }
        // Torn tails: what a crash mid-write left after a segment's last whole line.
        let mut torn = Vec::new();
        for (f, _) in found.iter_mut() {
            if f.kind != FileKind::Events && !f.relative_key.ends_with(".jsonl") {
                continue;
            }
            // Longer than its durable length (a cut that could not be applied): what follows
            // that length is never read, torn or not.
            if fs::metadata(&f.path).is_ok_and(|m| m.len() != f.bytes) {
                continue;
            }
            if let Some((keep, tail)) = torn_tail(&f.path)? {
                torn.push((f.path.clone(), keep, tail));
                f.bytes = keep;
                // A torn line may be a whole event short of its newline: its batch was never
                // answered, so its id must not be reloaded (Ray's resend is stored).
                for idf in id_files.iter_mut().filter(|i| i.path == f.path) {
                    idf.len = keep;
                }
            }
        }
        // Reload the newest event ids: the journal's (answered groups, oldest first), then
        // the ids of the lines stored after its last record read (groups in flight at a
        // crash, or answered just before a power loss took the journal's last records),
        // which are the newest. Inserted oldest first, so that the window evicts the newest
        // last; an id already there keeps its place.
        let spool = match &loaded.lengths {
            // No journal at all: every line is newer than it (review r40v), and the newest
            // are guessed from the files' times (review r40w D1).
            Some(_) if loaded.no_journal => SpoolIds {
                newer: newest_by_time(id_files, self.cfg.dedup_window.max(MAX_NO_JOURNAL_IDS)),
                older: Vec::new(),
            },
            Some(lengths) => SpoolIds {
                newer: unrecorded_ids(id_files, unrecorded_limit(&self.cfg, &loaded), lengths),
                older: Vec::new(),
            },
            // A journal of format 1 (the binaries before) says nothing of the files: where
            // their ids go beside the journal's is guessed, as those binaries did.
            None => {
                let journal: HashSet<u64, PassThrough> = loaded.ids.iter().copied().collect();
                newest_ids(id_files, self.cfg.dedup_window, &journal, loaded.modified)
            }
        };
        refill_window(&mut self.dedup, &loaded, &spool);
        report.dedup_ids = self.dedup.len();
        report.spool_newer_ids = spool.newer.len();
        report.journal_ids = loaded.ids.len();
        report.journal_damaged = loaded.damaged;
        if !torn.is_empty() {
            // The torn bytes go to quarantine before their segment shrinks. A full disk must
            // not keep the collector from starting (only uploads free it): the records are
            // then held in memory and written once there is room, and the segments are cut
            // all the same (cutting needs no room).
            let records: Vec<Vec<u8>> = torn
                .iter()
                .map(|(path, keep, tail)| {
                    let name = path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    raw_record(QuarantineReason::TornLine, &name, *keep, tail, None)
                })
                .collect();
            if let Err(e) = self.write_torn_records(&records) {
                tracing::warn!(error = %e, lines = records.len(), "could not keep the torn lines in quarantine now; they are held in memory and written once there is room (a crash before then loses them; they were never acknowledged, so Ray resends their batch)");
                self.torn_later = records;
            }
            for (path, keep, _) in &torn {
                let cut = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .and_then(|f| f.set_len(*keep).and_then(|_| f.sync_all()));
                match cut {
                    Ok(()) => {
                        tracing::warn!(path = %path.display(), kept_bytes = keep, "cut an incomplete last line off a segment left by the last run");
                    }
                    Err(e) => {
                        tracing::error!(path = %path.display(), kept_bytes = keep, error = %e, "could not cut an incomplete last line off a segment; uploading it up to that line only");
                    }
                }
            }
            report.torn = torn.len();
        }
        // Before any file found here is queued for upload (the uploader deletes it): the ids
        // reloaded from it are kept in the journal. Never fails the start (a full disk):
        // tried again at the next seal.
        if self.journal.wants_snapshot() {
            let ids = self.dedup.ids();
            self.journal
                .snapshot(&ids, &journal_head(&self.segs), self.dedup.hold());
        }
        found.sort_by_key(|f| f.0.created_unix_nanos);
        // Sessions seen in the spool still need their markers (head role).
        if self.cfg.write_session_markers {
            let sessions: HashSet<String> = found
                .iter()
                .filter_map(|(_, p)| p.as_ref().map(|p| p.session.clone()))
                .collect();
            for s in sessions {
                self.segs.ensure_marker(&s)?;
            }
        }
        let marker_dir = self.cfg.dir.join(MARKERS_DIR);
        let entries =
            fs::read_dir(&marker_dir).map_err(|e| SpoolError::io("listing", &marker_dir, e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !is_safe_segment(&name) {
                report.unknown.push(entry.path());
                continue;
            }
            if self.segs.marked_sessions.insert(name.clone()) {
                self.segs.queue_marker(&name, entry.path());
            }
        }
        for (f, _) in found {
            report.files += 1;
            report.bytes += f.bytes;
            self.stats.budget().add_stored(f.bytes);
            self.stats.add_file(f.created_unix_nanos);
            self.stats.earlier_queued();
            let _ = self.sealed.send(f);
        }
        Ok(report)
    }
}

impl Writer {
    /// Writes the quarantine records of torn lines (one group, synced now; nothing else may
    /// be in flight). On failure nothing of them is left behind.
    pub(super) fn write_torn_records(&mut self, records: &[Vec<u8>]) -> Result<(), SpoolError> {
        let hour = Hour::from_unix_seconds((unix_nanos() / 1_000_000_000) as i64);
        let target = Target::Quarantine(hour);
        let staged = self.segs.segment(&target).map(|seg| {
            for r in records {
                seg.pending.push_lines(r);
            }
        });
        match staged.and_then(|()| self.flush_group()) {
            Ok(()) => {
                m::events_quarantined(QuarantineReason::TornLine.code(), records.len() as u64);
                Ok(())
            }
            Err(e) => {
                self.rollback_to_durable();
                Err(e)
            }
        }
    }

    /// The durable lengths recorded for segments whose rollback could not truncate them
    /// ([`CUTS_DIR`]), by segment file name. An unreadable record is reported and left.
    fn read_cuts(&self) -> Result<HashMap<OsString, (PathBuf, u64)>, SpoolError> {
        let dir = self.cfg.dir.join(CUTS_DIR);
        let mut out = HashMap::new();
        let entries = fs::read_dir(&dir).map_err(|e| SpoolError::io("listing", &dir, e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            match fs::read_to_string(&path)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
            {
                Some(len) => {
                    out.insert(entry.file_name(), (path, len));
                }
                None => {
                    tracing::error!(path = %path.display(), "unreadable record of a segment's durable length; left alone");
                }
            }
        }
        Ok(out)
    }
}

/// Truncates the segment at `path` to `len`, its durable length, and then drops the record
/// `cut`; if the truncate fails again the record stays, and the segment is uploaded (and its
/// ids reloaded) only up to `len` anyway.
fn apply_cut(path: &Path, cut: &Path, len: u64) {
    let truncated = OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(len).and_then(|_| f.sync_all()));
    match truncated {
        Ok(()) => {
            tracing::warn!(path = %path.display(), durable_bytes = len, "cut the rolled-back lines off a segment left by the last run");
            let _ = fs::remove_file(cut);
        }
        Err(e) => {
            tracing::error!(path = %path.display(), durable_bytes = len, error = %e, "could not cut the rolled-back lines off a segment; uploading its durable length only");
        }
    }
}

/// If `path` does not end with a newline, returns (length to keep, the torn bytes).
pub(super) fn torn_tail(path: &Path) -> Result<Option<(u64, Vec<u8>)>, SpoolError> {
    let mut f = File::open(path).map_err(|e| SpoolError::io("opening", path, e))?;
    let len = f
        .metadata()
        .map_err(|e| SpoolError::io("reading", path, e))?
        .len();
    if len == 0 {
        return Ok(None);
    }
    let mut last = [0u8; 1];
    f.seek(SeekFrom::Start(len - 1))
        .and_then(|_| f.read_exact(&mut last))
        .map_err(|e| SpoolError::io("reading", path, e))?;
    if last[0] == b'\n' {
        return Ok(None);
    }
    // Scan back in chunks for the last newline.
    let mut end = len;
    let chunk = 64 * 1024u64;
    loop {
        let start = end.saturating_sub(chunk);
        let mut buf = vec![0u8; (end - start) as usize];
        f.seek(SeekFrom::Start(start))
            .and_then(|_| f.read_exact(&mut buf))
            .map_err(|e| SpoolError::io("reading", path, e))?;
        if let Some(i) = buf.iter().rposition(|&c| c == b'\n') {
            let keep = start + i as u64 + 1;
            let mut tail = vec![0u8; (len - keep) as usize];
            f.seek(SeekFrom::Start(keep))
                .and_then(|_| f.read_exact(&mut tail))
                .map_err(|e| SpoolError::io("reading", path, e))?;
            return Ok(Some((keep, tail)));
        }
        if start == 0 {
            let mut tail = vec![0u8; len as usize];
            f.seek(SeekFrom::Start(0))
                .and_then(|_| f.read_exact(&mut tail))
                .map_err(|e| SpoolError::io("reading", path, e))?;
            return Ok(Some((0, tail)));
        }
        end = start;
    }
}

/// Lists regular files below `dir`, without following symlinks.
pub(super) fn walk_files(dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let ft = entry.file_type()?;
        if ft.is_dir() {
            walk_files(&entry.path(), out)?;
        } else {
            out.push(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_tail_found() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        fs::write(&p, b"{\"a\":1}\n{\"b\":").unwrap();
        assert_eq!(torn_tail(&p).unwrap(), Some((8, b"{\"b\":".to_vec())));
        fs::write(&p, b"{\"a\":1}\n").unwrap();
        assert_eq!(torn_tail(&p).unwrap(), None);
        fs::write(&p, b"partial").unwrap();
        assert_eq!(torn_tail(&p).unwrap(), Some((0, b"partial".to_vec())));
    }
}
