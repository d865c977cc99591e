//! Which Ray session is active on this node: `<ray tmp>/session_latest` is a symlink to
//! `session_<date>_<pid>`, replaced when Ray restarts.
//!
//! Polling `readlink` once a second is cheap and catches a new session within seconds even
//! where inotify is unavailable or exhausted; the result is published on a `watch` channel
//! that the log shipper and the dashboard poller follow.

use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// Publishes the active session every `interval` until every receiver is gone.
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
            let now = resolve_latest(&ray_tmp);
            if *tx.borrow() != now {
                if let Some(s) = &now {
                    tracing::info!(session = %s.name, dir = %s.dir.display(), "active Ray session");
                }
                if tx.send(now).is_err() {
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
}
