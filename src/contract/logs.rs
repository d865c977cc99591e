//! Log objects: `P/<session>/<node>/logs/<path below the session's logs/ dir>`, under Ray's
//! own file names, because the history server finds a worker's log by its name
//! (`worker-<id>-<job>-<pid>.out|err`, `…-<pid>.out`) and lists the directory like Ray does.
//!
//! A backup Ray made by rotation (`raylet.out.1`, renamed again at every rotation) is kept
//! once under a stable name, `<live name>.rotated.<UTC mtime>.ino<inode>`: it sorts by time,
//! never collides with the live file, and no worker-log lookup mistakes it for a live log
//! (it does not end in `.out`/`.err`/`.log`). The mtime alone is not unique: backups made
//! within one clock tick, or copied with one mtime, would overwrite each other. A rename
//! keeps the inode, so the name stays the same through Ray's later renames (`.1` → `.2`)
//! and across retries and collector restarts. The mtime is the one of the backup's first
//! upload: a backup written again after its rename keeps that name (the log shipper finds it
//! again by [`parse_rotated_log_rel`]'s live name and inode) and its object grows.
//!
//! The read side (`inspect --logs`) finds a worker's log by parsing these names back
//! ([`WorkerLogName::parse`]); a node's own log is [`RAYLET_OUT`].

use crate::util::time::compact_utc;

use super::ids::is_hex_id;

/// The directory of a node's logs below `P/<session>/<node>/`.
pub const LOGS_DIR: &str = "logs";

/// The key of a live log file; `rel` is its path below the session's `logs/` directory.
pub fn log_key(history_prefix: &str, session: &str, node: &str, rel: &str) -> String {
    format!("{history_prefix}/{session}/{node}/{LOGS_DIR}/{rel}")
}

/// The key of a rotated backup of `live_rel` whose last change was at `mtime_ns`, in the
/// file with inode `ino`.
pub fn rotated_log_key(
    history_prefix: &str,
    session: &str,
    node: &str,
    live_rel: &str,
    mtime_ns: i64,
    ino: u64,
) -> String {
    format!(
        "{history_prefix}/{session}/{node}/{LOGS_DIR}/{live_rel}.rotated.{}.ino{ino}",
        compact_utc(mtime_ns)
    )
}

/// The live name and inode of a rotated backup's object, from its path below `logs/`
/// (`<live_rel>.rotated.<time>.ino<ino>`, as [`rotated_log_key`] builds it); `None` for a
/// live file's path.
pub fn parse_rotated_log_rel(rel: &str) -> Option<(&str, u64)> {
    let (live, rest) = rel.rsplit_once(".rotated.")?;
    let (_time, ino) = rest.rsplit_once(".ino")?;
    if live.is_empty() || ino.is_empty() || !ino.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some((live, ino.parse().ok()?))
}

/// The raylet's stdout log of a node, directly in its `logs/`.
pub const RAYLET_OUT: &str = "raylet.out";

/// The prefix of a node's log objects, `P/<session>/<node>/logs/` (with the slash).
pub fn node_logs_prefix(history_prefix: &str, session: &str, node: &str) -> String {
    format!("{history_prefix}/{session}/{node}/{LOGS_DIR}/")
}

/// Which of a worker's two logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogStream {
    /// `.out`: the worker's stdout.
    Out,
    /// `.err`: the worker's stderr.
    Err,
}

impl LogStream {
    /// `out` or `err`, the file suffix without its dot.
    pub fn suffix(self) -> &'static str {
        match self {
            LogStream::Out => "out",
            LogStream::Err => "err",
        }
    }
}

/// The name of a worker's log as Ray writes it: `worker-<worker-hex>-<job-hex>-<pid>.out|err`.
/// The job is `ffffffff` for a worker started before it was given a job (Ray starts workers
/// ahead of time), so a worker is found by its id and pid, not by its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLogName {
    /// Worker id, lower-case hex.
    pub worker: String,
    /// Job id, lower-case hex (`ffffffff`: none yet when the worker started).
    pub job: String,
    /// The worker's process id.
    pub pid: u32,
    /// stdout or stderr.
    pub stream: LogStream,
}

impl WorkerLogName {
    /// The file name: `worker-<worker>-<job>-<pid>.<out|err>`.
    pub fn file_name(&self) -> String {
        format!(
            "worker-{}-{}-{}.{}",
            self.worker,
            self.job,
            self.pid,
            self.stream.suffix()
        )
    }

    /// Parses a live worker log's file name (no directory). Rotated backups
    /// (`….err.1`, `….err.rotated.<time>`) and other files are `None`.
    pub fn parse(name: &str) -> Option<WorkerLogName> {
        let rest = name.strip_prefix("worker-")?;
        let (stem, stream) = if let Some(s) = rest.strip_suffix(".out") {
            (s, LogStream::Out)
        } else {
            (rest.strip_suffix(".err")?, LogStream::Err)
        };
        let mut parts = stem.split('-');
        let (worker, job, pid) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || !is_hex_id(worker) || !is_hex_id(job) {
            return None;
        }
        if pid.is_empty() || !pid.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        Some(WorkerLogName {
            worker: worker.to_ascii_lowercase(),
            job: job.to_ascii_lowercase(),
            pid: pid.parse().ok()?,
            stream,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_log_names_parse_back() {
        let name =
            "worker-84eb66b236c17db5c8488c841c1c969facaba5469607466e655c3e1f-ffffffff-19425.err";
        let parsed = WorkerLogName::parse(name).unwrap();
        assert_eq!(
            parsed.worker,
            "84eb66b236c17db5c8488c841c1c969facaba5469607466e655c3e1f"
        );
        assert_eq!(parsed.job, "ffffffff");
        assert_eq!(parsed.pid, 19425);
        assert_eq!(parsed.stream, LogStream::Err);
        assert_eq!(parsed.file_name(), name);
        let out = WorkerLogName {
            stream: LogStream::Out,
            job: "01000000".into(),
            ..parsed
        };
        assert_eq!(
            out.file_name(),
            "worker-84eb66b236c17db5c8488c841c1c969facaba5469607466e655c3e1f-01000000-19425.out"
        );
        for bad in [
            "worker-ab-01000000-12.err.1",
            "worker-ab-01000000-12.err.rotated.20261122T023140.123456789Z",
            "worker-ab-01000000.err",
            "worker-xy-01000000-12.out",
            "worker-ab-01000000-1a.out",
            "worker-ab-01000000-12-3.out",
            "python-core-worker-ab_12.log",
            "raylet.out",
        ] {
            assert_eq!(WorkerLogName::parse(bad), None, "{bad}");
        }
        assert_eq!(node_logs_prefix("P", "s", "n"), "P/s/n/logs/");
        assert_eq!(log_key("P", "s", "n", RAYLET_OUT), "P/s/n/logs/raylet.out");
    }

    #[test]
    fn log_keys_keep_rays_names_and_rotated_names_sort_by_time() {
        assert_eq!(
            log_key("P", "s", "n", "events/event_GCS.log"),
            "P/s/n/logs/events/event_GCS.log"
        );
        assert_eq!(
            rotated_log_key("P", "s", "n", "raylet.out", 1_795_314_700_123_456_789, 42),
            "P/s/n/logs/raylet.out.rotated.20261122T023140.123456789Z.ino42"
        );
        let earlier = rotated_log_key("P", "s", "n", "raylet.out", 1_795_314_699_999_999_999, 9);
        let later = rotated_log_key("P", "s", "n", "raylet.out", 1_795_314_700_000_000_000, 1);
        assert!(earlier < later);
        // Same mtime, other backup: another object.
        assert_ne!(
            rotated_log_key("P", "s", "n", "raylet.out", 1, 1),
            rotated_log_key("P", "s", "n", "raylet.out", 1, 2)
        );
        // Parsed back to the live name and inode (what keeps a backup under one key).
        assert_eq!(
            parse_rotated_log_rel("dir/raylet.out.rotated.20261122T023140.123456789Z.ino42"),
            Some(("dir/raylet.out", 42))
        );
        for live in [
            "raylet.out",
            "a.rotated.x.inoy",
            ".rotated.x.ino1",
            "x.rotated.t.ino",
        ] {
            assert_eq!(parse_rotated_log_rel(live), None, "{live}");
        }
        let worker = "worker-ab-01000000-12.err";
        let name = rotated_log_key("P", "s", "n", worker, 1, 7);
        assert_eq!(WorkerLogName::parse(name.rsplit('/').next().unwrap()), None);
    }
}
