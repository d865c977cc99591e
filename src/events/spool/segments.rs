//! The open segments: one append-only file per partition (and one per hour for quarantine
//! records), created with durable directory entries, kept under the open-file limit, sealed
//! (closed and handed to the uploader) when old, large, or at shutdown; and the session
//! markers, recorded on disk before their upload is queued.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::pending::Pending;
use super::sync::sync_dir;
use tokio::sync::mpsc as tokio_mpsc;

use super::{
    FileKind, SealedFile, SpoolConfig, SpoolError, SpoolStats, EVENTS_DIR, MARKERS_DIR,
    QUARANTINE_DIR,
};
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
    pub(super) pending: Pending,
}

/// The segments open for writing, and what is needed to create and seal them: owned by the
/// writer thread, which alone appends to them.
pub(super) struct Segments {
    dir: PathBuf,
    quarantine_node: String,
    max_open_files: usize,
    stats: Arc<SpoolStats>,
    sealed: tokio_mpsc::UnboundedSender<SealedFile>,
    pub(super) open: HashMap<Target, OpenSegment>,
    pub(super) open_fds: usize,
    clock: u64,
    /// The last creation time handed out: names stay unique and increasing.
    pub(super) last_n: u64,
    /// Sessions whose marker is recorded on disk.
    pub(super) marked_sessions: HashSet<String>,
    synced_dirs: HashSet<PathBuf>,
    /// Directories with new entries not yet synced; synced by the next flush.
    pub(super) dirty_dirs: HashSet<PathBuf>,
}

impl Segments {
    pub(super) fn new(
        cfg: &SpoolConfig,
        stats: Arc<SpoolStats>,
        sealed: tokio_mpsc::UnboundedSender<SealedFile>,
    ) -> Segments {
        Segments {
            dir: cfg.dir.clone(),
            quarantine_node: cfg.quarantine_node.clone(),
            max_open_files: cfg.max_open_files.max(1),
            stats,
            sealed,
            open: HashMap::new(),
            open_fds: 0,
            clock: 0,
            last_n: 0,
            marked_sessions: HashSet::new(),
            synced_dirs: HashSet::new(),
            dirty_dirs: HashSet::new(),
        }
    }

    /// A creation time for a new file: now in Unix ns, and never the same twice.
    pub(super) fn next_n(&mut self) -> u64 {
        self.last_n = unix_nanos().max(self.last_n + 1);
        self.last_n
    }

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
                    records_key(&self.quarantine_node, *h, n),
                    FileKind::Quarantine,
                ),
            };
            let path = self.dir.join(base).join(&rel);
            self.make_room_for_fd();
            let created = self.create_file(&path)?;
            // At the limit with every fd busy in this group: reopen it when flushing.
            let file = if self.open_fds < self.max_open_files {
                self.open_fds += 1;
                Some(Arc::new(created))
            } else {
                None
            };
            self.stats.segment_opened(path.clone(), kind, rel.clone());
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
                    pending: Pending::default(),
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
                if parent.starts_with(&self.dir) && parent != self.dir {
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
        if self.open_fds < self.max_open_files {
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
        let n = (self.max_open_files / 8).max(1);
        for (_, t) in idle.into_iter().take(n) {
            if let Some(s) = self.open.get_mut(&t) {
                s.file = None;
                self.open_fds -= 1;
            }
        }
    }

    /// The open segments for which `pred` holds.
    pub(super) fn due(&self, pred: impl Fn(&OpenSegment) -> bool) -> Vec<Target> {
        self.open
            .iter()
            .filter(|(_, s)| pred(s))
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// True when `t` has bytes written that are not yet known to be durable.
    pub(super) fn awaits_sync(&self, t: &Target) -> bool {
        self.open.get(t).is_some_and(|s| s.written > s.len)
    }

    /// Closes `t` and hands it to the uploader (or deletes it if nothing of it is durable).
    /// The caller waits for its sync first ([`Segments::awaits_sync`]).
    pub(super) fn close(&mut self, t: &Target) {
        let Some(seg) = self.open.remove(t) else {
            return;
        };
        if seg.file.is_some() {
            self.open_fds -= 1;
        }
        drop(seg.file);
        let pending_since = self.stats.segment_sealed(&seg.path);
        let f = SealedFile {
            path: seg.path,
            kind: seg.kind,
            relative_key: seg.relative_key,
            created_unix_nanos: seg.created_unix_nanos,
            bytes: seg.len,
            compressible: true,
            pending_since,
            earlier_run: false,
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
        let dir = self.dir.join(MARKERS_DIR);
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
            pending_since: Some(n),
            earlier_run: false,
        });
    }
}
