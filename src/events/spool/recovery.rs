//! What an earlier run left in the spool, found at start: every segment and quarantine file
//! is sealed and queued for upload; an incomplete last line (a crash mid-write) is cut into
//! quarantine before its segment shrinks; recent event ids are reloaded into the
//! deduplication window, newest first, so a batch Ray resends across our restart is still
//! recognised; sessions with events get their markers.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::segments::Target;
use super::writer::Writer;
use super::{
    dedup_key, FileKind, RecoveryReport, SealedFile, SpoolError, EVENTS_DIR, EXPORT_ID_SALT,
    MARKERS_DIR, QUARANTINE_DIR,
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
        let mut found: Vec<(SealedFile, Option<Partition>)> = Vec::new();
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
                found.push((
                    SealedFile {
                        path,
                        kind,
                        relative_key: rel,
                        created_unix_nanos: created,
                        bytes: meta.len(),
                        compressible,
                    },
                    partition,
                ));
            }
        }
        // Cut torn tails first: the torn bytes go to quarantine before the segment shrinks.
        let mut torn = Vec::new();
        for (f, _) in found.iter_mut() {
            if f.kind != FileKind::Events && !f.relative_key.ends_with(".jsonl") {
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
        // Reload recent event ids, newest segments first, so a batch resent across our
        // restart is still recognised.
        found.sort_by_key(|f| std::cmp::Reverse(f.0.created_unix_nanos));
        let mut budget = self.cfg.dedup_window;
        for (f, p) in found.iter().filter(|(f, _)| f.kind == FileKind::Events) {
            if budget == 0 {
                break;
            }
            let salt = match p.as_ref().map(|p| &p.stream) {
                Some(crate::contract::Stream::Export(_)) => EXPORT_ID_SALT,
                _ => 0,
            };
            report.dedup_ids += self.load_ids(&f.path, salt, &mut budget);
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
            self.stats.bytes.fetch_add(f.bytes, Ordering::Relaxed);
            self.stats.add_file(f.created_unix_nanos);
            let _ = self.sealed.send(f);
        }
        Ok(report)
    }

    /// Streams one segment's lines (never the whole file in memory) into the window.
    pub(super) fn load_ids(&mut self, path: &Path, salt: u64, budget: &mut usize) -> usize {
        use std::io::BufRead;
        let Ok(f) = File::open(path) else { return 0 };
        let mut reader = io::BufReader::with_capacity(256 * 1024, f);
        let mut line = Vec::new();
        let mut n = 0;
        while *budget > 0 {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if let Ok(ParsedEvent::Object(f)) = parse_event(&line) {
                if let Some(id) = f.event_id.as_str() {
                    self.dedup.insert(dedup_key(id_hash(id.as_bytes()) ^ salt));
                    *budget -= 1;
                    n += 1;
                }
            }
        }
        n
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
