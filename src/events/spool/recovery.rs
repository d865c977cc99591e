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
//! Which ids: Ray resends what it sent last, so the window is filled from the end of the
//! most recently written segments (by modification time), each read backwards in chunks
//! until the window is full, and the ids are inserted oldest first, so the window's own
//! eviction order keeps the newest ones. Reading backwards also bounds the start's work by
//! the window, not by the spool's size.

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
    EXPORT_ID_SALT, MARKERS_DIR, QUARANTINE_DIR,
};
use crate::contract::quarantine::{parse_key, QuarantineKey};
use crate::contract::{is_safe_segment, Hour, Partition};
use crate::events::dedup::id_hash;
use crate::events::parse::{parse_event, ParsedEvent};
use crate::events::quarantine::{raw_record, QuarantineReason};
use crate::metrics as m;
use crate::util::time::unix_nanos;

impl Writer {
    /// Walks what an earlier run left: every file is sealed and queued; torn tails are cut.
    pub(super) fn recover(&mut self) -> Result<RecoveryReport, SpoolError> {
        let mut report = RecoveryReport::default();
        let mut cuts = self.read_cuts()?;
        let mut found: Vec<(SealedFile, Option<Partition>)> = Vec::new();
        // Last modification of each event segment, to reload the newest ids first.
        let mut modified: Vec<(SystemTime, u64, PathBuf, u64, u64)> = Vec::new();
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
                if let Some(p) = &partition {
                    let salt = match p.stream {
                        crate::contract::Stream::Export(_) => EXPORT_ID_SALT,
                        _ => 0,
                    };
                    let at = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    modified.push((at, created, path.clone(), salt, bytes));
                }
                found.push((
                    SealedFile {
                        path,
                        kind,
                        relative_key: rel,
                        created_unix_nanos: created,
                        bytes,
                        compressible,
                    },
                    partition,
                ));
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
        // keeps the newest.
        modified.sort_by_key(|m| std::cmp::Reverse((m.0, m.1)));
        modified.truncate(MAX_ID_FILES);
        let files: Vec<(PathBuf, u64, u64)> = modified
            .into_iter()
            .map(|(_, _, p, salt, len)| (p, salt, len))
            .collect();

        let newest_first = newest_ids(&files, self.cfg.dedup_window);
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

/// At most this many segments (the most recently written) are read for ids at start: each
/// holds a chunk's ids in memory while they are merged, and what Ray resends is at the end
/// of the segments it wrote to last.
const MAX_ID_FILES: usize = 1024;

/// The deduplication keys of up to `want` event ids of `files` (path, salt, and durable
/// length; most recently written first), newest first: one id from the end of each file in turn, round after round. A
/// batch Ray resends spans a few partitions written together; taking their tails side by
/// side keeps each one's newest ids, where reading one file to the end first would fill the
/// window from it alone. A file that cannot be read is logged and left out.
pub(super) fn newest_ids(files: &[(PathBuf, u64, u64)], want: usize) -> Vec<u64> {
    let mut readers: Vec<TailIds> = files
        .iter()
        .filter_map(|(path, salt, len)| match TailIds::open(path, *salt, *len) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "could not reload the event ids of a segment; a resend of its events may be stored twice");
                None
            }
        })
        .collect();
    let mut out = Vec::new();
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
                    tracing::warn!(path = %r.path.display(), error = %e, "could not reload the event ids of a segment; a resend of its events may be stored twice");
                    false
                }
            }
        });
    }
    out
}

/// Reads one segment's event ids backwards, a chunk at a time; holds one chunk's ids and the
/// piece of a line that started before it (at most [`MAX_ID_LINE`]), and no open file.
pub(super) struct TailIds {
    path: PathBuf,
    salt: u64,
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
    pub(super) fn open(path: &Path, salt: u64, len: u64) -> io::Result<TailIds> {
        Ok(TailIds {
            path: path.to_path_buf(),
            salt,
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
        if let Ok(ParsedEvent::Object(ev)) = parse_event(line) {
            if let Some(id) = ev.event_id.as_str() {
                self.ids.push(dedup_key(id_hash(id.as_bytes()) ^ self.salt));
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

    /// One file: its ids come back last line first, across chunk boundaries and a line longer
    /// than several chunks, and only as many as asked for.
    #[test]
    fn newest_ids_read_one_file_backwards_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let ids = write_ids(&p, "id", 30_000, Some(29_990));
        let files = vec![(p.clone(), 7, u64::MAX)];
        let out = newest_ids(&files, 20_000);
        let want: Vec<u64> = ids.iter().rev().take(20_000).copied().collect();
        assert_eq!(out, want);
        let all = newest_ids(&files, 1_000_000);
        assert_eq!(all.len(), 30_000);
        assert_eq!(all.last(), ids.first());
    }

    /// Several files: their tails side by side, so the last lines of each are in.
    #[test]
    fn newest_ids_take_the_tail_of_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let ids_a = write_ids(&a, "a", 5_000, None);
        let ids_b = write_ids(&b, "b", 50, None);
        let out = newest_ids(
            &[
                (a, 7, u64::MAX),
                (b, 7, u64::MAX),
                (dir.path().join("gone"), 7, u64::MAX),
            ],
            200,
        );
        assert_eq!(out.len(), 200);
        for id in ids_a.iter().rev().take(100).chain(ids_b.iter()) {
            assert!(out.contains(id));
        }
        assert_eq!(&out[..2], &[ids_a[4_999], ids_b[49]]);
    }
}
