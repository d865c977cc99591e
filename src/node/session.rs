//! Which Ray session is active on this node: `<ray tmp>/session_latest` is a symlink to
//! `session_<date>_<pid>`, replaced when Ray restarts.
//!
//! Polling `readlink` once a second is cheap and catches a new session within seconds even
//! where inotify is unavailable or exhausted; the result is published on a `watch` channel
//! that the log shipper and the dashboard poller follow.
//!
//! Ray replaces the link by removing it and creating it again, so for a moment it is missing
//! or points at a folder that is not there yet. A link that does not resolve never ends the
//! active session: the last session seen stays active until the link names another one. An
//! earlier session is finished (uploaded once more and never looked at again) only when a
//! newer session is active, its own files have been quiet for [`SESSION_QUIET`]
//! ([`settled_earlier_sessions`]) and no raylet answers on its socket ([`raylet_answers`]:
//! two raylets can share one tmp dir, and the older one's session is then alive, however
//! quiet).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::contract::is_safe_segment;

/// The active session: its name (a safe path segment) and directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveSession {
    /// `session_2026-11-22_02-06-54_202993_22498`.
    pub name: String,
    /// `<ray tmp>/session_2026-11-22_02-06-54_202993_22498`.
    pub dir: PathBuf,
}

/// Resolves `<ray_tmp>/session_latest`, if it points to a usable session directory.
pub fn resolve_latest(ray_tmp: &Path) -> Option<ActiveSession> {
    let link = ray_tmp.join("session_latest");
    let target = std::fs::read_link(&link).ok()?;
    let dir = if target.is_absolute() {
        target
    } else {
        ray_tmp.join(target)
    };
    let name = dir.file_name()?.to_str()?.to_string();
    if !name.starts_with("session_") || !is_safe_segment(&name) || !dir.is_dir() {
        return None;
    }
    Some(ActiveSession { name, dir })
}

/// Lists session directories under `ray_tmp` (not the `session_latest` link), oldest first.
pub fn list_sessions(ray_tmp: &Path) -> Vec<ActiveSession> {
    let Ok(rd) = std::fs::read_dir(ray_tmp) else {
        return Vec::new();
    };
    let mut out: Vec<ActiveSession> = rd
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            (name.starts_with("session_") && name != "session_latest" && is_safe_segment(&name))
                .then(|| ActiveSession {
                    name,
                    dir: e.path(),
                })
        })
        .collect();
    // Session names embed their start time, so they sort chronologically.
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// How long an earlier session's log files must be unchanged before it is finished: Ray's
/// processes of a replaced session are gone within seconds, and a file still growing means
/// one is not.
pub const SESSION_QUIET: Duration = Duration::from_secs(10);

/// Most entries looked at under an earlier session's `logs/` when checking that it is quiet;
/// past this it is taken as quiet (the final flush still sends what changed later).
const MAX_QUIET_ENTRIES: usize = 100_000;

/// The sessions older than `active` (by the start time in their names) whose log files have
/// not changed for `quiet`: the ones that may be finished. None while no session is active.
pub fn settled_earlier_sessions(
    ray_tmp: &Path,
    active: Option<&ActiveSession>,
    quiet: Duration,
) -> Vec<ActiveSession> {
    let Some(active) = active else {
        return Vec::new();
    };
    list_sessions(ray_tmp)
        .into_iter()
        .filter(|s| s.name < active.name && is_quiet(&s.dir.join("logs"), quiet))
        .collect()
}

/// True when no file or directory under `dir` was modified within `quiet`.
fn is_quiet(dir: &Path, quiet: Duration) -> bool {
    let Some(since) = SystemTime::now().checked_sub(quiet) else {
        return true;
    };
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            seen += 1;
            if seen > MAX_QUIET_ENTRIES {
                return true;
            }
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            if meta.modified().is_ok_and(|t| t > since) {
                return false;
            }
            if meta.is_dir() {
                stack.push(e.path());
            }
        }
    }
    true
}

/// How long a connection to a session's raylet socket may take before the raylet is taken
/// as alive (a busy raylet is slow to accept; finishing its session would lose its output).
const RAYLET_SOCKET_TIMEOUT: Duration = Duration::from_secs(1);

/// Most entries of a session's `sockets/` looked at for raylet sockets.
const MAX_SOCKET_ENTRIES: usize = 64;

/// True when a raylet of the session in `dir` still accepts connections on its socket
/// (`sockets/raylet`, `sockets/raylet.N`), which is KubeRay's own liveness test of a session
/// (`GetSessionDir`): such a session is not finished, however quiet its files.
pub async fn raylet_answers(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir.join("sockets")) else {
        return false;
    };
    for e in rd.flatten().take(MAX_SOCKET_ENTRIES) {
        let name = e.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if name != "raylet" && !name.starts_with("raylet.") {
            continue;
        }
        match tokio::time::timeout(
            RAYLET_SOCKET_TIMEOUT,
            tokio::net::UnixStream::connect(e.path()),
        )
        .await
        {
            Ok(Ok(_)) | Err(_) => return true,
            Ok(Err(_)) => {}
        }
    }
    false
}

/// Publishes the active session every `interval` until every receiver is gone. A link that
/// does not resolve keeps the last session seen (see the module doc).
pub fn watch_sessions(
    ray_tmp: PathBuf,
    interval: Duration,
) -> watch::Receiver<Option<ActiveSession>> {
    let (tx, rx) = watch::channel(resolve_latest(&ray_tmp));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if tx.is_closed() {
                return;
            }
            let Some(now) = resolve_latest(&ray_tmp) else {
                continue; // missing or broken for a moment: the session goes on
            };
            if tx.borrow().as_ref() != Some(&now) {
                tracing::info!(session = %now.name, dir = %now.dir.display(), "active Ray session");
                if tx.send(Some(now)).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(resolve_latest(tmp.path()), None);
        let s1 = tmp.path().join("session_2026-11-22_02-06-54_202993_1");
        std::fs::create_dir(&s1).unwrap();
        std::os::unix::fs::symlink(
            "session_2026-11-22_02-06-54_202993_1",
            tmp.path().join("session_latest"),
        )
        .unwrap();
        let got = resolve_latest(tmp.path()).unwrap();
        assert_eq!(got.name, "session_2026-11-22_02-06-54_202993_1");
        let s0 = tmp.path().join("session_2026-11-21_00-00-00_000000_9");
        std::fs::create_dir(&s0).unwrap();
        std::fs::create_dir(tmp.path().join("not_a_session")).unwrap();
        let all: Vec<String> = list_sessions(tmp.path())
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(
            all,
            [
                "session_2026-11-21_00-00-00_000000_9",
                "session_2026-11-22_02-06-54_202993_1"
            ]
        );
        std::fs::remove_file(tmp.path().join("session_latest")).unwrap();
        std::os::unix::fs::symlink("/etc", tmp.path().join("session_latest")).unwrap();
        assert_eq!(resolve_latest(tmp.path()), None);
    }

    #[test]
    fn only_older_quiet_sessions_are_settled() {
        let tmp = tempfile::tempdir().unwrap();
        let mk = |name: &str| {
            let d = tmp.path().join(name);
            std::fs::create_dir_all(d.join("logs")).unwrap();
            std::fs::write(d.join("logs/raylet.out"), "x").unwrap();
            ActiveSession {
                name: name.into(),
                dir: d,
            }
        };
        let old = mk("session_2026-11-22_01-00-00_000000_1");
        let active = mk("session_2026-11-22_02-00-00_000000_2");
        let newer = mk("session_2026-11-22_03-00-00_000000_3");
        let _ = newer;
        let names = |q| -> Vec<String> {
            settled_earlier_sessions(tmp.path(), Some(&active), q)
                .into_iter()
                .map(|s| s.name)
                .collect()
        };
        // Just written: not quiet yet.
        assert!(names(Duration::from_secs(3600)).is_empty());
        assert_eq!(names(Duration::ZERO), std::slice::from_ref(&old.name));
        assert!(settled_earlier_sessions(tmp.path(), None, Duration::ZERO).is_empty());
    }
}
