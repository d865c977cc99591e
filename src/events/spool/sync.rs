//! Making a group durable: the sync thread that `fdatasync`s the files and `fsync`s the
//! directories a group touched, with a pool of threads so those syncs overlap, or one
//! `syncfs` when a group touches more than [`SYNCFS_ABOVE`] files.
//!
//! The writer hands a [`SyncJob`] to the sync thread and keeps writing the next group into
//! the page cache; the answer comes back on the writer's own channel (`Command::Synced`).

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};

use super::{Command, SpoolError};
use crate::util::fs::fsync_dir;

/// Above this many files in one group, one `syncfs` replaces per-file `fdatasync`.
pub(super) const SYNCFS_ABOVE: usize = 32;

/// A sync for the sync thread.
pub(super) struct SyncJob {
    pub(super) files: Vec<(Arc<File>, PathBuf)>,
    pub(super) dirs: Vec<PathBuf>,
    /// `syncfs` on this fd instead of syncing `files`.
    pub(super) whole_fs: Option<Arc<File>>,
}

/// The sync thread: makes each job durable and tells the writer.
pub(super) fn run_syncer(
    jobs: mpsc::Receiver<SyncJob>,
    done: mpsc::Sender<Command>,
    pool: Arc<SyncPool>,
) {
    while let Ok(job) = jobs.recv() {
        if done.send(Command::Synced(run_sync(job, &pool))).is_err() {
            return;
        }
    }
}

pub(super) fn run_sync(job: SyncJob, pool: &SyncPool) -> Result<(), SpoolError> {
    #[cfg(test)]
    failpoint::injected_sync_failure(&job)?;
    if let Some(fs_handle) = &job.whole_fs {
        // SAFETY: syncfs on an fd we hold open (the spool's lock file).
        if unsafe { libc::syncfs(fs_handle.as_raw_fd()) } != 0 {
            return Err(SpoolError::io(
                "syncing the filesystem of the spool",
                Path::new(""),
                io::Error::last_os_error(),
            ));
        }
        return Ok(());
    }
    let targets = job
        .files
        .into_iter()
        .map(|(f, p)| SyncTarget::File(f, p))
        .chain(job.dirs.into_iter().map(SyncTarget::Dir))
        .collect();
    pool.sync_all(targets)
}

/// One file to `fdatasync` or directory to `fsync`.
pub(super) enum SyncTarget {
    File(Arc<File>, PathBuf),
    Dir(PathBuf),
}

impl SyncTarget {
    pub(super) fn sync(&self) -> Result<(), SpoolError> {
        match self {
            SyncTarget::File(f, path) => f
                .sync_data()
                .map_err(|e| SpoolError::io("syncing segment", path, e)),
            SyncTarget::Dir(dir) => sync_dir(dir),
        }
    }
}

struct SyncTask {
    target: SyncTarget,
    done: mpsc::Sender<Result<(), SpoolError>>,
}

/// Threads that sync the files and directories of one group at the same time.
///
/// The syncs of a group overlap: the disk queues their writes together instead of one
/// file's data, inode and cache flush after the other (measured on this project's 2-core
/// VM: 5 files of a 1 MB group, 3.4 ms one after the other, 2.5-2.9 ms at once). The
/// threads are kept between groups: spawning one per file and group cost about 2.2 % of
/// the machine's CPU at full load (`clone3`, and `munmap` of its stack).
pub(super) struct SyncPool {
    workers: Mutex<Vec<mpsc::Sender<SyncTask>>>,
}

/// At most one sync thread per file or directory of a group (a larger group is synced
/// with `syncfs`).
const MAX_SYNC_THREADS: usize = SYNCFS_ABOVE;

impl SyncPool {
    pub(super) fn new() -> SyncPool {
        SyncPool {
            workers: Mutex::new(Vec::new()),
        }
    }

    /// Syncs every target, the first on the calling thread and the others at the same
    /// time on the pool's threads; returns the first error after all have finished.
    pub(super) fn sync_all(&self, targets: Vec<SyncTarget>) -> Result<(), SpoolError> {
        let mut targets = targets.into_iter();
        let Some(mine) = targets.next() else {
            return Ok(());
        };
        let (done_tx, done_rx) = mpsc::channel();
        let mut first_error = None;
        let mut sent = 0usize;
        {
            let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
            for (i, target) in targets.enumerate() {
                if i >= workers.len() && workers.len() < MAX_SYNC_THREADS {
                    if let Some(w) = spawn_sync_worker() {
                        workers.push(w);
                    }
                }
                let task = SyncTask {
                    target,
                    done: done_tx.clone(),
                };
                let task = match workers.get(i % workers.len().max(1)) {
                    Some(w) => match w.send(task) {
                        Ok(()) => {
                            sent += 1;
                            continue;
                        }
                        Err(mpsc::SendError(task)) => task,
                    },
                    None => task,
                };
                // No thread to take it: sync it here, in turn.
                if let Err(e) = task.target.sync() {
                    first_error.get_or_insert(e);
                }
            }
        }
        drop(done_tx);
        if let Err(e) = mine.sync() {
            first_error.get_or_insert(e);
        }
        for _ in 0..sent {
            let result = done_rx.recv().unwrap_or_else(|_| {
                Err(SpoolError::io(
                    "syncing (a sync thread ended without answering)",
                    Path::new(""),
                    io::Error::other("sync thread ended"),
                ))
            });
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Starts one pool thread, or `None` if the system refuses (its work is then done inline).
fn spawn_sync_worker() -> Option<mpsc::Sender<SyncTask>> {
    let (tx, rx) = mpsc::channel::<SyncTask>();
    let spawned = std::thread::Builder::new()
        .name("spool-sync-file".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            while let Ok(task) = rx.recv() {
                let _ = task.done.send(task.target.sync());
            }
        });
    match spawned {
        Ok(_) => Some(tx),
        Err(e) => {
            tracing::warn!(error = %e, "could not start a sync thread; syncing in turn");
            None
        }
    }
}

/// `fsync` of a directory, so the entries created in it are durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), SpoolError> {
    fsync_dir(dir).map_err(|e| SpoolError::io("syncing directory", dir, e))
}

/// Test hook: make the next sync of a spool directory fail, after a delay.
#[cfg(test)]
pub(super) mod failpoint {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;
    use std::time::Duration;

    use super::{io, SpoolError, SyncJob};

    /// Spool directories whose next sync fails, after a delay.
    pub(in crate::events::spool) static FAIL_NEXT_SYNC: Mutex<Vec<(PathBuf, Duration)>> =
        Mutex::new(Vec::new());

    pub(super) fn injected_sync_failure(job: &SyncJob) -> Result<(), SpoolError> {
        let mut armed = FAIL_NEXT_SYNC.lock().unwrap();
        let hit = armed.iter().position(|(dir, _)| {
            job.files.iter().any(|(_, p)| p.starts_with(dir))
                || job.dirs.iter().any(|p| p.starts_with(dir))
        });
        let Some(i) = hit else { return Ok(()) };
        let (_, delay) = armed.remove(i);
        drop(armed);
        std::thread::sleep(delay);
        Err(SpoolError::io(
            "syncing segment",
            Path::new("(test)"),
            io::Error::other("injected failure"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn sync_pool_syncs_every_target_reuses_its_threads_and_reports_the_first_error() {
        let dir = tempfile::tempdir().unwrap();
        let targets = || -> Vec<SyncTarget> {
            let mut t: Vec<SyncTarget> = (0..6)
                .map(|i| {
                    let path = dir.path().join(format!("f{i}"));
                    let mut f = File::create(&path).unwrap();
                    f.write_all(b"{}\n").unwrap();
                    SyncTarget::File(Arc::new(f), path)
                })
                .collect();
            t.push(SyncTarget::Dir(dir.path().to_path_buf()));
            t
        };
        let pool = SyncPool::new();
        for _ in 0..3 {
            pool.sync_all(targets()).unwrap();
        }
        // The caller syncs one target itself; the other six each had a thread, kept.
        assert_eq!(pool.workers.lock().unwrap().len(), 6);
        let mut failing = targets();
        failing.insert(3, SyncTarget::Dir(dir.path().join("missing")));
        let err = pool.sync_all(failing).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        assert_eq!(pool.workers.lock().unwrap().len(), 7);
        // Still usable after an error.
        pool.sync_all(targets()).unwrap();
        pool.sync_all(Vec::new()).unwrap();
    }
}
