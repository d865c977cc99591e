//! What is under a session's `logs/`: regular files whose names can be a key segment
//! ([`contract::is_log_file_name`]; symlinks and odd entries are skipped and counted; a file
//! or directory whose name cannot be a segment, or is not UTF-8, is skipped, logged once at
//! WARN and counted once per run, see [`NameSkips`]), which of them are Ray's rotated
//! backups (`name.N` beside a live `name`), their object keys, and the order in which a
//! round uploads them (what explains a failure first).

use std::collections::hash_map::RandomState;
use std::collections::{BTreeSet, HashSet};
use std::ffi::{OsStr, OsString};
use std::hash::BuildHasher as _;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::contract::{self, is_log_file_name};
use crate::metrics as m;
use crate::util::escape::escape_untrusted_os;
use crate::util::fs::{list_dir, open_dir, stat_at, stat_fd, Beneath};

/// One regular file found under a session's `logs/`.
#[derive(Debug, Clone)]
pub(super) struct LogFile {
    /// The file as it is reopened for upload: from the session directory's descriptor,
    /// never through a symlink (see `util::fs::Beneath`).
    pub(super) file: Beneath,
    /// Its path, for messages.
    pub(super) abs: PathBuf,
    /// Relative to `logs/`, '/'-separated, every segment safe.
    pub(super) rel: String,
    pub(super) size: u64,
    pub(super) mtime_ns: i64,
    /// The inode, to tell a file replaced under the same name from one that only grew.
    pub(super) ino: u64,
    /// `Some(base)` when this is a rotated backup `base.N` of a live `base`.
    pub(super) rotated_from: Option<String>,
    /// For a rotated backup uploaded before: the key of that upload, which it keeps (see
    /// `placement`). Set by the shipper, `None` from the scan.
    pub(super) uploaded_as: Option<String>,
}

/// Why a file was not shipped.
pub(super) fn skip(reason: &'static str, path: &Path) {
    m::log_file_skipped(reason);
    tracing::debug!(path = %path.display(), reason, "log file skipped");
}

/// Paths whose name was refused that are remembered, at most: each is logged and counted
/// once; past this many, a refused name is counted every time a scan meets it and no longer
/// logged (a tree of millions of odd names must not fill memory or the log). Remembered as
/// 64-bit keyed hashes (8 bytes each, whatever the path's length).
pub(super) const MAX_NAME_SKIPS_REMEMBERED: usize = 4096;

/// The files and directories under `logs/` whose name cannot be a key segment, met in this
/// run: each is logged once at WARN (its path escaped) and counted once in
/// `rhc_log_files_skipped_total{reason="unsafe_name" | "name_not_utf8"}`, not at every round
/// (review r39t D1: they were logged at debug only and counted again every round).
#[derive(Debug, Default)]
pub(super) struct NameSkips {
    /// Keyed hashes of the paths met (see [`MAX_NAME_SKIPS_REMEMBERED`]).
    seen: HashSet<u64>,
    keys: RandomState,
    /// Whether the warning that the memory is full was logged.
    full_told: bool,
}

impl NameSkips {
    /// `path` was not shipped for its name (`reason`).
    fn refuse(&mut self, reason: &'static str, path: &Path) {
        let h = self.keys.hash_one(path.as_os_str().as_bytes());
        if self.seen.contains(&h) {
            return;
        }
        m::log_file_skipped(reason);
        if self.seen.len() < MAX_NAME_SKIPS_REMEMBERED {
            self.seen.insert(h);
            let why = match reason {
                "name_not_utf8" => "its name is not UTF-8",
                _ => {
                    "its name cannot be an object key's segment (a control character, \\, \
                      a trailing '.', a '#' and digits at its end, or more than 255 bytes)"
                }
            };
            tracing::warn!(path = %escape_untrusted_os(path.as_os_str()), reason,
                "log file or directory not uploaded: {why} \
                 (rhc_log_files_skipped_total{{reason=\"{reason}\"}}); logged once");
        } else if !self.full_told {
            self.full_told = true;
            tracing::warn!(
                remembered = MAX_NAME_SKIPS_REMEMBERED,
                "more log files whose names cannot be uploaded than are remembered: the others \
                 are not named, and counted each time a round meets them"
            );
        }
    }
}

/// Lists the regular files under `<session>/logs`, never following symlinks, skipping names
/// that cannot be a key segment (told to `names`).
///
/// Race-free against a swap (see `util::fs`): the session directory and `logs/` are opened
/// with `O_NOFOLLOW`, each subdirectory with `openat(parent, name, O_NOFOLLOW |
/// O_DIRECTORY)` from its parent's descriptor, and every directory is listed from the
/// descriptor opened, never by path: a directory swapped for a symlink, before or during
/// the scan, is not entered, and nothing of its target is listed.
pub(super) fn scan_logs(session: &Path, names: &mut NameSkips) -> Vec<LogFile> {
    let mut out = Vec::new();
    let logs = session.join("logs");
    let root = match open_dir(None, session.as_os_str()) {
        Ok(fd) => fd,
        Err(e) => {
            if e.raw_os_error() == Some(libc::ELOOP) {
                skip("symlink", session);
            }
            return out;
        }
    };
    let logs_fd = match open_dir(Some(&root), OsStr::new("logs")) {
        Ok(fd) => fd,
        Err(e) => {
            if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) {
                skip("symlink", &logs);
                tracing::warn!(path = %logs.display(), "the session's logs directory is a symlink or not a directory; not followed");
            }
            return out;
        }
    };
    // Directories wait on the stack as (parent's descriptor, name, what stat saw) and are
    // opened only when popped: siblings share their parent's descriptor, so a scan holds one
    // descriptor per nesting level, not one per directory (thousands of sibling directories
    // made by user code must not exhaust the process's descriptors).
    let mut stack: Vec<PendingDir> = Vec::new();
    let mut at = Listing {
        session,
        stack: &mut stack,
        out: &mut out,
        names,
    };
    list_into(&Rc::new(logs_fd), &logs, "", &mut at);
    while let Some(p) = stack.pop() {
        // Opened from its parent's descriptor, not followed if it became a symlink since the
        // stat, and only entered if it is still the directory stat saw.
        let opened = open_dir(Some(&p.parent), &p.name);
        drop(p.parent);
        match opened {
            Ok(sub) if stat_fd(&sub).is_ok_and(|s| s.dev == p.dev && s.ino == p.ino) => {
                let mut at = Listing {
                    session,
                    stack: &mut stack,
                    out: &mut out,
                    names,
                };
                list_into(&Rc::new(sub), &p.path, &p.rel, &mut at);
            }
            Ok(_) => skip("vanished", &p.path),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                skip("symlink", &p.path)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => skip("vanished", &p.path),
            Err(e) => {
                skip("unreadable", &p.path);
                tracing::warn!(path = %p.path.display(), error = %e, "log directory could not be opened; its files are not shipped this round");
            }
        }
    }
    // Mark rotated backups: `name.N` next to a live `name`.
    let names: BTreeSet<String> = out.iter().map(|f| f.rel.clone()).collect();
    for f in &mut out {
        if let Some((base, n)) = f.rel.rsplit_once('.') {
            if !n.is_empty()
                && n.len() <= 4
                && n.bytes().all(|c| c.is_ascii_digit())
                && names.contains(base)
            {
                f.rotated_from = Some(base.to_string());
            }
        }
    }
    out
}

/// A directory found by the scan, opened when its turn comes.
struct PendingDir {
    parent: Rc<OwnedFd>,
    name: OsString,
    path: PathBuf,
    rel: String,
    dev: u64,
    ino: u64,
}

/// Where a listing puts what it finds.
struct Listing<'a> {
    session: &'a Path,
    stack: &'a mut Vec<PendingDir>,
    out: &'a mut Vec<LogFile>,
    names: &'a mut NameSkips,
}

/// Lists the directory `fd` (at `dir`, `prefix` relative to `logs/`): its regular files go to
/// `at.out`, its subdirectories to `at.stack`, the names refused to `at.names`.
fn list_into(fd: &Rc<OwnedFd>, dir: &Path, prefix: &str, at: &mut Listing<'_>) {
    let names = match list_dir(fd) {
        Ok(names) => names,
        Err(e) => {
            skip("unreadable", dir);
            tracing::warn!(path = %dir.display(), error = %e, "log directory could not be listed; its files are not shipped this round");
            return;
        }
    };
    for os_name in names {
        let path = dir.join(&os_name);
        let Some(name) = os_name.to_str().map(str::to_string) else {
            at.names.refuse("name_not_utf8", &path);
            continue;
        };
        if !is_log_file_name(&name) {
            at.names.refuse("unsafe_name", &path);
            continue;
        }
        let Ok(st) = stat_at(fd, &os_name) else {
            continue;
        };
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        if st.is_dir() {
            at.stack.push(PendingDir {
                parent: Rc::clone(fd),
                name: os_name,
                path,
                rel,
                dev: st.dev,
                ino: st.ino,
            });
        } else if st.is_file() {
            at.out.push(LogFile {
                file: Beneath {
                    root: at.session.to_path_buf(),
                    rel: Path::new("logs").join(&rel),
                    dev: st.dev,
                    ino: st.ino,
                },
                abs: path,
                rel,
                size: st.size,
                mtime_ns: st.mtime_ns,
                ino: st.ino,
                rotated_from: None,
                uploaded_as: None,
            });
        } else if st.is_symlink() {
            skip("symlink", &path);
        } else {
            skip("not_a_regular_file", &path);
        }
    }
}

/// The object key of a log file (rotated backups get their stable name, the one of their
/// first upload when they had one).
pub(super) fn object_key(prefix: &str, session: &str, node: &str, f: &LogFile) -> String {
    if let Some(key) = &f.uploaded_as {
        return key.clone();
    }
    match &f.rotated_from {
        Some(base) => {
            contract::logs::rotated_log_key(prefix, session, node, base, f.mtime_ns, f.ino)
        }
        None => contract::logs::log_key(prefix, session, node, &f.rel),
    }
}

/// Upload order: what explains a failure first.
pub(super) fn priority(f: &LogFile) -> u8 {
    let name = f.rel.rsplit('/').next().unwrap_or(&f.rel);
    if matches!(
        name,
        "raylet.out" | "raylet.err" | "gcs_server.out" | "gcs_server.err" | "debug_state.txt"
    ) {
        0
    } else if f.rotated_from.is_some() {
        1
    } else if name.ends_with(".err") {
        2
    } else if name.starts_with("worker-")
        || name.starts_with("python-core-worker-")
        || name.starts_with("job-driver-")
    {
        3
    } else {
        4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotated_names_are_stable_and_sort_by_time() {
        let f = LogFile {
            file: Beneath {
                root: "/".into(),
                rel: "x".into(),
                dev: 0,
                ino: 0,
            },
            abs: "/x".into(),
            rel: "raylet.out.1".into(),
            size: 1,
            mtime_ns: 1_795_314_700_123_456_789,
            ino: 1,
            rotated_from: Some("raylet.out".into()),
            uploaded_as: None,
        };
        assert_eq!(
            object_key("P", "s", "n", &f),
            "P/s/n/logs/raylet.out.rotated.20261122T023140.123456789Z.ino1"
        );
        let g = LogFile {
            rotated_from: None,
            rel: "events/event_GCS.log".into(),
            ..f.clone()
        };
        assert_eq!(
            object_key("P", "s", "n", &g),
            "P/s/n/logs/events/event_GCS.log"
        );
    }

    #[test]
    fn scan_skips_odd_entries_and_marks_backups() {
        let tmp = tempfile::tempdir().unwrap();
        let logs = &tmp.path().join("logs");
        std::fs::create_dir(logs).unwrap();
        std::fs::write(logs.join("raylet.out"), "a").unwrap();
        std::fs::write(logs.join("raylet.out.1"), "b").unwrap();
        std::fs::write(logs.join("orphan.log.2"), "c").unwrap();
        std::fs::write(logs.join("job-driver-nightly eval é.log"), "d").unwrap();
        std::fs::write(logs.join("bad\u{1b}name.log"), "d").unwrap();
        std::fs::write(logs.join("trailing."), "d").unwrap();
        std::fs::create_dir(logs.join("bad\tdir")).unwrap();
        std::fs::write(logs.join("bad\tdir/inner.log"), "d").unwrap();
        std::fs::write(
            logs.join(<OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(
                b"not-utf8-\xff.log",
            )),
            "d",
        )
        .unwrap();
        std::fs::create_dir(logs.join("events")).unwrap();
        std::fs::write(logs.join("events/event_GCS.log"), "e").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", logs.join("link.log")).unwrap();
        std::os::unix::fs::symlink("/etc", logs.join("linkdir")).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(logs.join("sock")).unwrap();
        let mut names = NameSkips::default();
        let mut files = scan_logs(tmp.path(), &mut names);
        files.sort_by(|a, b| a.rel.cmp(&b.rel));
        let rels: Vec<(&str, Option<&str>)> = files
            .iter()
            .map(|f| (f.rel.as_str(), f.rotated_from.as_deref()))
            .collect();
        assert_eq!(
            rels,
            [
                ("events/event_GCS.log", None),
                ("job-driver-nightly eval é.log", None),
                ("orphan.log.2", None),
                ("raylet.out", None),
                ("raylet.out.1", Some("raylet.out")),
            ]
        );
        assert_eq!(files[3].file.rel, Path::new("logs/raylet.out"));
        assert!(files[3].file.open().is_ok());
        // Refused names are remembered once each; a second scan adds none.
        assert_eq!(names.seen.len(), 4);
        scan_logs(tmp.path(), &mut names);
        assert_eq!(names.seen.len(), 4);
        // logs/ itself a symlink: nothing listed.
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(logs, other.path().join("logs")).unwrap();
        assert!(scan_logs(other.path(), &mut names).is_empty());
    }

    #[test]
    fn refused_names_are_remembered_up_to_the_bound() {
        let mut names = NameSkips::default();
        for i in 0..MAX_NAME_SKIPS_REMEMBERED + 10 {
            names.refuse("unsafe_name", Path::new(&format!("/logs/bad\u{1}{i}")));
        }
        assert_eq!(names.seen.len(), MAX_NAME_SKIPS_REMEMBERED);
        assert!(names.full_told);
        // One remembered is not told again.
        names.refuse("unsafe_name", Path::new("/logs/bad\u{1}0"));
        assert_eq!(names.seen.len(), MAX_NAME_SKIPS_REMEMBERED);
    }

    #[test]
    fn priorities() {
        let mk = |rel: &str, rot: bool| LogFile {
            file: Beneath {
                root: "/".into(),
                rel: "x".into(),
                dev: 0,
                ino: 0,
            },
            abs: "/x".into(),
            rel: rel.into(),
            size: 0,
            mtime_ns: 0,
            ino: 0,
            rotated_from: rot.then(|| "b".to_string()),
            uploaded_as: None,
        };
        assert_eq!(priority(&mk("raylet.out", false)), 0);
        assert_eq!(priority(&mk("debug_state.txt", false)), 0);
        assert_eq!(priority(&mk("raylet.out.1", true)), 1);
        assert_eq!(priority(&mk("worker-ab-01000000-1.err", false)), 2);
        assert_eq!(priority(&mk("worker-ab-01000000-1.out", false)), 3);
        assert_eq!(priority(&mk("dashboard.log", false)), 4);
    }
}
