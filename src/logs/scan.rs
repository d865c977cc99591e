//! What is under a session's `logs/`: regular files with safe names (symlinks, odd entries
//! and names that cannot be a key segment are skipped and counted), which of them are Ray's
//! rotated backups (`name.N` beside a live `name`), their object keys, and the order in which
//! a round uploads them (what explains a failure first).

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::contract::{self, is_safe_segment};
use crate::metrics as m;

/// One regular file found under a session's `logs/`.
#[derive(Debug, Clone)]
pub(super) struct LogFile {
    pub(super) abs: PathBuf,
    /// Relative to `logs/`, '/'-separated, every segment safe.
    pub(super) rel: String,
    pub(super) size: u64,
    pub(super) mtime_ns: i64,
    /// The inode, to tell a file replaced under the same name from one that only grew.
    pub(super) ino: u64,
    /// `Some(base)` when this is a rotated backup `base.N` of a live `base`.
    pub(super) rotated_from: Option<String>,
}

/// Why a file was not shipped.
pub(super) fn skip(reason: &'static str, path: &Path) {
    m::log_file_skipped(reason);
    tracing::debug!(path = %path.display(), reason, "log file skipped");
}

/// Lists the regular files under `logs`, never following symlinks, skipping names that
/// cannot be a key segment.
pub(super) fn scan_logs(logs: &Path) -> Vec<LogFile> {
    let mut out = Vec::new();
    let mut stack = vec![(logs.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in rd.flatten() {
            let path = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                skip("name_not_utf8", &path);
                continue;
            };
            if !is_safe_segment(&name) {
                skip("unsafe_name", &path);
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let rel = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let ft = meta.file_type();
            if ft.is_dir() {
                stack.push((path, rel));
            } else if ft.is_file() {
                out.push(LogFile {
                    abs: path,
                    rel,
                    size: meta.len(),
                    mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
                    ino: meta.ino(),
                    rotated_from: None,
                });
            } else if ft.is_symlink() {
                skip("symlink", &path);
            } else {
                skip("not_a_regular_file", &path);
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

/// The object key of a log file (rotated backups get their stable name).
pub(super) fn object_key(prefix: &str, session: &str, node: &str, f: &LogFile) -> String {
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
            abs: "/x".into(),
            rel: "raylet.out.1".into(),
            size: 1,
            mtime_ns: 1_795_314_700_123_456_789,
            ino: 1,
            rotated_from: Some("raylet.out".into()),
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
        let logs = tmp.path();
        std::fs::write(logs.join("raylet.out"), "a").unwrap();
        std::fs::write(logs.join("raylet.out.1"), "b").unwrap();
        std::fs::write(logs.join("orphan.log.2"), "c").unwrap();
        std::fs::write(logs.join("bad name.log"), "d").unwrap();
        std::fs::create_dir(logs.join("events")).unwrap();
        std::fs::write(logs.join("events/event_GCS.log"), "e").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", logs.join("link.log")).unwrap();
        std::os::unix::fs::symlink("/etc", logs.join("linkdir")).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(logs.join("sock")).unwrap();
        let mut files = scan_logs(logs);
        files.sort_by(|a, b| a.rel.cmp(&b.rel));
        let rels: Vec<(&str, Option<&str>)> = files
            .iter()
            .map(|f| (f.rel.as_str(), f.rotated_from.as_deref()))
            .collect();
        assert_eq!(
            rels,
            [
                ("events/event_GCS.log", None),
                ("orphan.log.2", None),
                ("raylet.out", None),
                ("raylet.out.1", Some("raylet.out")),
            ]
        );
    }

    #[test]
    fn priorities() {
        let mk = |rel: &str, rot: bool| LogFile {
            abs: "/x".into(),
            rel: rel.into(),
            size: 0,
            mtime_ns: 0,
            ino: 0,
            rotated_from: rot.then(|| "b".to_string()),
        };
        assert_eq!(priority(&mk("raylet.out", false)), 0);
        assert_eq!(priority(&mk("debug_state.txt", false)), 0);
        assert_eq!(priority(&mk("raylet.out.1", true)), 1);
        assert_eq!(priority(&mk("worker-ab-01000000-1.err", false)), 2);
        assert_eq!(priority(&mk("worker-ab-01000000-1.out", false)), 3);
        assert_eq!(priority(&mk("dashboard.log", false)), 4);
    }
}
