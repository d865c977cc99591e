//! The open segments: one append-only file per partition (and one per hour for quarantine
//! records), created with durable directory entries, kept under the open-file limit, sealed
//! (closed and handed to the uploader) when old, large, or at shutdown; and the session
//! markers, recorded on disk before their upload is queued.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::sync::sync_dir;
use super::writer::Writer;
use super::{FileKind, SealedFile, SpoolError, EVENTS_DIR, MARKERS_DIR, QUARANTINE_DIR};
use crate::contract::quarantine::records_key;
use crate::contract::{Hour, Partition};
use crate::util::time::unix_nanos;

/// Where open segments are kept: events by partition, quarantine by hour.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Target {
    Events(Partition),
    Quarantine(Hour),
}

pub(super) struct OpenSegment {
    pub(super) path: PathBuf,
    pub(super) relative_key: String,
    pub(super) kind: FileKind,
    pub(super) created_unix_nanos: u64,
    pub(super) opened_at: Instant,
    /// Bytes durably in the file.
    pub(super) len: u64,
    /// Bytes written to the file: `len` plus groups not yet synced (rolled back on failure).
    pub(super) written: u64,
    /// Shared with the sync thread, which may still be syncing it after it is closed here.
    pub(super) file: Option<Arc<File>>,
    pub(super) last_use: u64,
    /// Lines of the group being staged, not yet written.
    pub(super) pending: Vec<u8>,
}

impl Writer {
    /// Returns the open segment of `target`, creating its file if needed.
    pub(super) fn segment(&mut self, target: &Target) -> Result<&mut OpenSegment, SpoolError> {
        self.clock += 1;
        let clock = self.clock;
        if !self.open.contains_key(target) {
            let n = self.next_n();
            let (base, rel, kind) = match target {
                Target::Events(p) => (EVENTS_DIR, p.segment_relative_key(n), FileKind::Events),
                Target::Quarantine(h) => (
                    QUARANTINE_DIR,
                    records_key(&self.cfg.quarantine_node, *h, n),
                    FileKind::Quarantine,
                ),
            };
            let path = self.cfg.dir.join(base).join(&rel);
            self.make_room_for_fd();
            let created = self.create_file(&path)?;
            // At the limit with every fd busy in this group: reopen it when flushing.
            let file = if self.open_fds < self.cfg.max_open_files.max(1) {
                self.open_fds += 1;
                Some(Arc::new(created))
            } else {
                None
            };
            self.stats.add_file(n);
            self.open.insert(
                target.clone(),
                OpenSegment {
                    path,
                    relative_key: rel,
                    kind,
                    created_unix_nanos: n,
                    opened_at: Instant::now(),
                    len: 0,
                    written: 0,
                    file,
                    last_use: clock,
                    pending: Vec::new(),
                },
            );
        }
        let seg = self.open.get_mut(target).ok_or_else(|| {
            SpoolError::io(
                "finding open segment",
                Path::new(""),
                io::ErrorKind::NotFound.into(),
            )
        })?;
        seg.last_use = clock;
        Ok(seg)
    }

    /// Creates a new segment file and makes its directory entry durable.
    pub(super) fn create_file(&mut self, path: &Path) -> Result<File, SpoolError> {
        let parent = path.parent().unwrap_or(Path::new("."));
        self.ensure_dir(parent)?;
        let f = OpenOptions::new()
            .create_new(true)
            .append(true)
            .mode(0o644)
            .open(path)
            .map_err(|e| SpoolError::io("creating segment", path, e))?;
        // The new entry is made durable with the group's data, before any answer.
        self.dirty_dirs.insert(parent.to_path_buf());
        Ok(f)
    }

    /// Creates `dir` and its missing parents, syncing each new entry once.
    pub(super) fn ensure_dir(&mut self, dir: &Path) -> Result<(), SpoolError> {
        if self.synced_dirs.contains(dir) {
            return Ok(());
        }
        if !dir.exists() {
            if let Some(parent) = dir.parent() {
                if parent.starts_with(&self.cfg.dir) && parent != self.cfg.dir {
                    self.ensure_dir(parent)?;
                }
            }
            match fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(SpoolError::io("creating directory", dir, e)),
            }
            if let Some(parent) = dir.parent() {
                self.dirty_dirs.insert(parent.to_path_buf());
            }
        }
        self.synced_dirs.insert(dir.to_path_buf());
        Ok(())
    }

    /// Closes the least recently used idle fds when at the limit.
    pub(super) fn make_room_for_fd(&mut self) {
        if self.open_fds < self.cfg.max_open_files.max(1) {
            return;
        }
        let mut idle: Vec<(u64, Target)> = self
            .open
            .iter()
            .filter(|(_, s)| s.file.is_some() && s.pending.is_empty())
            .map(|(t, s)| (s.last_use, t.clone()))
            .collect();
        idle.sort_by_key(|(u, _)| *u);
        // Close an eighth at a time so the scan is amortised.
        let n = (self.cfg.max_open_files / 8).max(1);
        for (_, t) in idle.into_iter().take(n) {
            if let Some(s) = self.open.get_mut(&t) {
                s.file = None;
                self.open_fds -= 1;
            }
        }
    }

    pub(super) fn seal_where(&mut self, pred: impl Fn(&OpenSegment) -> bool) {
        let due: Vec<Target> = self
            .open
            .iter()
            .filter(|(_, s)| pred(s))
            .map(|(t, _)| t.clone())
            .collect();
        for t in due {
            self.seal(&t);
        }
    }

    pub(super) fn seal(&mut self, t: &Target) {
        if self.open.get(t).is_some_and(|s| s.written > s.len) {
            // Its last group is still being synced: wait for that answer first.
            self.drain();
        }
        let Some(seg) = self.open.remove(t) else {
            return;
        };
        if seg.file.is_some() {
            self.open_fds -= 1;
        }
        drop(seg.file);
        let f = SealedFile {
            path: seg.path,
            kind: seg.kind,
            relative_key: seg.relative_key,
            created_unix_nanos: seg.created_unix_nanos,
            bytes: seg.len,
            compressible: true,
        };
        if seg.len == 0 {
            // Every write of it was rolled back: nothing to upload.
            let _ = fs::remove_file(&f.path);
            self.stats.file_done(&f);
            return;
        }
        let _ = self.sealed.send(f);
    }

    /// Records (durably) that a session needs its marker, and queues the upload.
    pub(super) fn ensure_marker(&mut self, session: &str) -> Result<(), SpoolError> {
        if !self.marked_sessions.insert(session.to_string()) {
            return Ok(());
        }
        let dir = self.cfg.dir.join(MARKERS_DIR);
        let path = dir.join(session);
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| SpoolError::io("creating marker", &path, e))?;
        sync_dir(&dir)?;
        self.queue_marker(session, path);
        Ok(())
    }

    pub(super) fn queue_marker(&mut self, session: &str, path: PathBuf) {
        let n = unix_nanos();
        self.stats.add_file(n);
        let _ = self.sealed.send(SealedFile {
            path,
            kind: FileKind::Marker,
            relative_key: session.to_string(),
            created_unix_nanos: n,
            bytes: 0,
            compressible: false,
        });
    }
}
