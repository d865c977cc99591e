//! What an earlier run left in the spool, found at start: every segment and quarantine file
//! is sealed and queued for upload; an incomplete last line (a crash mid-write) is cut into
//! quarantine before its segment shrinks; the newest event ids are reloaded into the
//! deduplication window, so a batch Ray resends across our restart is still recognised;
//! sessions with events get their markers.
//!
//! A segment whose rolled-back lines could not be truncated before the restart has its
//! durable length recorded in the cuts folder: it is truncated to it now (or, if that fails
//! again, uploaded and read for ids only up to it).
//!
//! Which ids: what Ray resends after our crash is its batch in flight, whose events are the
//! last lines of the files the last group commit wrote. The writer gives every file of a
//! group the same modification time, later than any earlier group's; so the files (event
//! segments, and quarantine files for the `too_many_partitions` records of valid events) are
//! taken newest first by modification time, one generation at a time: the files with the
//! newest time left, i.e. the files some group wrote last, are read side by side backwards
//! from their ends, one id per file per round (a batch spans a few partitions, each with its
//! newest lines at its end, and a long file must not crowd out a short one); only when a
//! whole generation is read does the next (older) one start. An older file never takes room
//! from a newer generation, whatever its partition's hour. Reading stops as soon as the
//! window is full, so a start's work is bounded by the window, not by the spool's size. The
//! ids are inserted oldest first, so the newest are the last the window evicts.
//!
//! Files whose time the writer could not set (a crash between a group's write and its
//! stamp, a failed stamp, a spool from an older version) keep the kernel's time of their
//! last write: they still come in the order they were written, one generation per distinct
//! time.
//!
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use super::segments::Target;
use super::writer::Writer;
use super::{
    dedup_key, FileKind, RecoveryReport, SealedFile, SpoolError, CUTS_DIR, EVENTS_DIR,
    EXPORT_ID_SALT, GROWTH_DIR, MARKERS_DIR, QUARANTINE_DIR,
};
use crate::contract::quarantine::{parse_key, QuarantineKey};
use crate::contract::{is_safe_segment, Hour, Partition};
use crate::events::dedup::id_hash;
use crate::events::parse::{parse_event, ParsedEvent};
use crate::events::quarantine::{overflow_record_event, raw_record, QuarantineReason};
use crate::metrics as m;
use crate::util::time::unix_nanos;

impl Writer {
    /// Walks what an earlier run left: every file is sealed and queued; torn tails are cut.
    pub(super) fn recover(&mut self) -> Result<RecoveryReport, SpoolError> {
        let mut report = RecoveryReport::default();
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
                let (shadow, record) = crate::events::publish::growth_names(f.kind, name);
                growth.insert(shadow);
                growth.insert(record);
            }
        }
        let growth_dir = self.cfg.dir.join(GROWTH_DIR);
        if let Ok(entries) = fs::read_dir(&growth_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if growth.contains(&name) {
                    if name.ends_with(".gz") {
                        let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
                        self.stats.bytes.fetch_add(len, Ordering::Relaxed);
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
        // Cut torn tails first: the torn bytes go to quarantine before the segment shrinks.
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
            }
        }
        if !torn.is_empty() {
            let hour = Hour::from_unix_seconds((unix_nanos() / 1_000_000_000) as i64);
            let target = Target::Quarantine(hour);
            for (path, keep, tail) in &torn {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let line = raw_record(QuarantineReason::TornLine, &name, *keep, tail);
                self.segs.segment(&target)?.pending.push_lines(&line);
                m::events_quarantined(QuarantineReason::TornLine.code(), 1);
            }
            self.flush_group()?;
            for (path, keep, _) in &torn {
                let f = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|e| SpoolError::io("opening", path, e))?;
                f.set_len(*keep)
                    .and_then(|_| f.sync_all())
                    .map_err(|e| SpoolError::io("truncating torn line of", path, e))?;
                tracing::warn!(path = %path.display(), kept_bytes = keep, "cut an incomplete last line into quarantine");
            }
            report.torn = torn.len();
        }
        // Reload the newest event ids, then insert them oldest first so that the window
        // evicts the newest last.
        let newest_first = newest_ids(id_files, self.cfg.dedup_window);
        for h in newest_first.iter().rev() {
            self.dedup.insert(*h);
        }
        report.dedup_ids = newest_first.len();
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
            self.stats.bytes.fetch_add(f.bytes, Ordering::Relaxed);
            self.stats.add_file(f.created_unix_nanos);
            let _ = self.sealed.send(f);
        }
        Ok(report)
    }
}

impl Writer {
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

/// Bytes read at a time when reading a segment backwards for its ids.
const ID_SCAN_CHUNK: usize = 64 * 1024;

/// A line longer than this is skipped when reloading ids (its id is not reloaded): bounds the
/// memory of reading one line backwards. Ray's events are a few KiB; a larger one is rare.
const MAX_ID_LINE: usize = 8 << 20;

/// At most this many files (the most recently written) are read for ids at start: each
/// holds a chunk's ids in memory while they are merged, and what Ray resends is at the end
/// of the files it wrote to last.
const MAX_ID_FILES: usize = 1024;

/// Which lines of a file carry ids, and how they are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IdLines {
    /// An event segment: every line is an event; ids hashed with this salt.
    Events(u64),
    /// A quarantine records file: only `too_many_partitions` records (valid events) count.
    Overflow,
}

/// A file to reload ids from.
#[derive(Debug, Clone)]
pub(super) struct IdFile {
    pub(super) path: PathBuf,
    pub(super) lines: IdLines,
    /// Its durable length: nothing after it is read.
    pub(super) len: u64,
    /// When it was last written.
    pub(super) modified: SystemTime,
    /// Its creation number, to order files written at the same instant.
    pub(super) created: u64,
}

/// The deduplication keys of up to `want` event ids of `files`, newest first: generation by
/// generation (the files with the same modification time: written last by one group), newest
/// first, and within one generation one id from the end of each file in turn, round after
/// round. A file that cannot be read is logged and left out.
pub(super) fn newest_ids(mut files: Vec<IdFile>, want: usize) -> Vec<u64> {
    files.sort_by_key(|f| std::cmp::Reverse((f.modified, f.created)));
    files.truncate(MAX_ID_FILES);
    let mut out = Vec::new();
    let mut rest = &files[..];
    while !rest.is_empty() && out.len() < want {
        let newest = rest[0].modified;
        let n = rest
            .iter()
            .take_while(|f| f.modified == newest)
            .count()
            .max(1);
        ids_side_by_side(&rest[..n], want, &mut out);
        rest = &rest[n..];
    }
    out
}

/// Adds to `out` ids from the ends of `files`, one from each in turn, until `out` holds
/// `want` or the files are read.
fn ids_side_by_side(files: &[IdFile], want: usize, out: &mut Vec<u64>) {
    let mut readers: Vec<TailIds> = files
        .iter()
        .filter_map(|f| match TailIds::open(&f.path, f.lines, f.len) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(path = %f.path.display(), error = %e, "could not reload the event ids of a spool file; a resend of its events may be stored twice");
                None
            }
        })
        .collect();
    while out.len() < want && !readers.is_empty() {
        readers.retain_mut(|r| {
            if out.len() >= want {
                return true;
            }
            match r.next_id() {
                Ok(Some(id)) => {
                    out.push(id);
                    true
                }
                Ok(None) => false,
                Err(e) => {
                    tracing::warn!(path = %r.path.display(), error = %e, "could not reload the event ids of a spool file; a resend of its events may be stored twice");
                    false
                }
            }
        });
    }
}

/// Reads one segment's event ids backwards, a chunk at a time; holds one chunk's ids and the
/// piece of a line that started before it (at most [`MAX_ID_LINE`]), and no open file.
pub(super) struct TailIds {
    path: PathBuf,
    lines: IdLines,
    /// Where the part not read yet ends.
    pos: u64,
    /// The end of the line whose start is not read yet.
    carry: Vec<u8>,
    /// That line is longer than [`MAX_ID_LINE`]: skipped.
    skipping: bool,
    /// Ids of the chunk read last, oldest first (popped from the end).
    ids: Vec<u64>,
}

impl TailIds {
    /// Reads the file's first `len` bytes (its durable length) at most.
    pub(super) fn open(path: &Path, lines: IdLines, len: u64) -> io::Result<TailIds> {
        Ok(TailIds {
            path: path.to_path_buf(),
            lines,
            pos: fs::metadata(path)?.len().min(len),
            carry: Vec::new(),
            skipping: false,
            ids: Vec::new(),
        })
    }

    /// The id of the next line back, `None` at the start of the file.
    pub(super) fn next_id(&mut self) -> io::Result<Option<u64>> {
        while self.ids.is_empty() {
            if self.pos == 0 {
                if self.carry.is_empty() {
                    return Ok(None);
                }
                let first = std::mem::take(&mut self.carry);
                if !self.skipping {
                    self.push_line(&first);
                }
                self.skipping = false;
                continue;
            }
            self.read_chunk()?;
        }
        Ok(self.ids.pop())
    }

    fn push_line(&mut self, line: &[u8]) {
        if line.is_empty() {
            return;
        }
        let (event, salt) = match self.lines {
            IdLines::Events(salt) => (line, salt),
            IdLines::Overflow => match overflow_record_event(line) {
                Some((event, export)) => (event, if export { EXPORT_ID_SALT } else { 0 }),
                None => return,
            },
        };
        if let Ok(ParsedEvent::Object(ev)) = parse_event(event) {
            if let Some(id) = ev.event_id.as_str() {
                self.ids.push(dedup_key(id_hash(id.as_bytes()) ^ salt));
            }
        }
    }

    /// Reads the chunk before `pos`: its complete lines' ids into `ids`, oldest first.
    fn read_chunk(&mut self) -> io::Result<()> {
        let start = self.pos.saturating_sub(ID_SCAN_CHUNK as u64);
        let mut buf = vec![0u8; (self.pos - start) as usize];
        let mut f = File::open(&self.path)?;
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf)?;
        self.pos = start;
        // Lines found back to front; reversed at the end so `ids` pops newest first.
        let mark = self.ids.len();
        let mut end = buf.len();
        while let Some(i) = buf[..end].iter().rposition(|&c| c == b'\n') {
            if !self.skipping {
                if self.carry.is_empty() {
                    self.push_line(&buf[i + 1..end]);
                } else {
                    let mut line = buf[i + 1..end].to_vec();
                    line.extend_from_slice(&self.carry);
                    self.push_line(&line);
                }
            }
            self.carry.clear();
            self.skipping = false;
            end = i;
        }
        self.ids[mark..].reverse();
        if !self.skipping {
            if self.carry.len() + end > MAX_ID_LINE {
                self.skipping = true;
                self.carry.clear();
            } else {
                self.carry.splice(0..0, buf[..end].iter().copied());
            }
        }
        Ok(())
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

    fn write_ids(path: &Path, tag: &str, n: usize, long_at: Option<usize>) -> Vec<u64> {
        let mut text = String::new();
        let mut ids = Vec::new();
        for i in 0..n {
            let id = format!("{tag}-{i}");
            if Some(i) == long_at {
                let pad = "x".repeat(ID_SCAN_CHUNK * 3 + 10);
                text.push_str(&format!("{{\"eventId\":\"{id}\",\"p\":\"{pad}\"}}\n"));
            } else {
                text.push_str(&format!("{{\"eventId\":\"{id}\"}}\n"));
            }
            ids.push(dedup_key(id_hash(id.as_bytes()) ^ 7));
        }
        fs::write(path, &text).unwrap();
        ids
    }

    fn id_file(path: &Path, age_ms: u64, created: u64) -> IdFile {
        let modified = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000)
            - std::time::Duration::from_millis(age_ms);
        if let Ok(f) = File::options().write(true).open(path) {
            f.set_modified(modified).unwrap();
        }
        IdFile {
            path: path.to_path_buf(),
            lines: IdLines::Events(7),
            len: u64::MAX,
            modified,
            created,
        }
    }

    /// One file: its ids come back last line first, across chunk boundaries and a line longer
    /// than several chunks, and only as many as asked for.
    #[test]
    fn newest_ids_read_one_file_backwards_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let ids = write_ids(&p, "id", 30_000, Some(29_990));
        let out = newest_ids(vec![id_file(&p, 0, 1)], 20_000);
        let want: Vec<u64> = ids.iter().rev().take(20_000).copied().collect();
        assert_eq!(out, want);
        let all = newest_ids(vec![id_file(&p, 0, 1)], 1_000_000);
        assert_eq!(all.len(), 30_000);
        assert_eq!(all.last(), ids.first());
    }

    /// The files written last (by one group: the same modification time) are read side by
    /// side from their ends and wholly before any older file; an older file, however large,
    /// and even a millisecond older, only fills what room is left.
    #[test]
    fn newest_ids_fill_the_window_generation_by_generation() {
        let dir = tempfile::tempdir().unwrap();
        let path = |n: &str| dir.path().join(n);
        // "old" was written a millisecond before the newest; "b" and "c" together, last.
        let ids_old = write_ids(&path("old"), "old", 5_000, None);
        let ids_b = write_ids(&path("b"), "b", 50, None);
        let ids_c = write_ids(&path("c"), "c", 80, None);
        let files = vec![
            id_file(&path("old"), 1, 1),
            id_file(&path("c"), 0, 2),
            id_file(&path("gone"), 0, 4),
            id_file(&path("b"), 0, 3),
        ];
        let out = newest_ids(files.clone(), 200);
        assert_eq!(out.len(), 200);
        // b's newest, then c's newest, side by side.
        assert_eq!(&out[..4], &[ids_b[49], ids_c[79], ids_b[48], ids_c[78]]);
        let newest: Vec<u64> = ids_b.iter().chain(&ids_c).copied().collect();
        for id in &newest {
            assert!(out[..130].contains(id));
        }
        // Then the old file's tail, newest first.
        let old_tail: Vec<u64> = ids_old.iter().rev().take(70).copied().collect();
        assert_eq!(&out[130..], &old_tail[..]);
        // A window smaller than the newest generation holds only ids of it.
        let small = newest_ids(files, 100);
        assert!(small.iter().all(|id| newest.contains(id)), "{small:?}");
    }

    /// A quarantine file gives back the ids of its `too_many_partitions` records only, in
    /// the id space the record names.
    #[test]
    fn newest_ids_read_overflow_records_of_quarantine_files() {
        use crate::events::quarantine::{event_record, overflow_record};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("q");
        let mut text = overflow_record(br#"{"eventId":"pushed"}"#, false);
        text.extend(event_record(
            QuarantineReason::MissingSession,
            br#"{"eventId":"bad"}"#,
        ));
        text.extend(overflow_record(br#"{"event_id":"exported"}"#, true));
        fs::write(&p, &text).unwrap();
        let mut f = id_file(&p, 0, 1);
        f.lines = IdLines::Overflow;
        let out = newest_ids(vec![f], 10);
        assert_eq!(
            out,
            vec![
                dedup_key(id_hash(b"exported") ^ EXPORT_ID_SALT),
                dedup_key(id_hash(b"pushed")),
            ]
        );
    }
}
