//! Log objects: `P/<session>/<node>/logs/<path below the session's logs/ dir>`, under Ray's
//! own file names, because the history server finds a worker's log by its name
//! (`worker-<id>-<job>-<pid>.out|err`, `…-<pid>.out`) and lists the directory like Ray does.
//!
//! A backup Ray made by rotation (`raylet.out.1`, renamed again at every rotation) is kept
//! once under a stable name, `<live name>.rotated.<UTC mtime>`: it sorts by time, never
//! collides with the live file, and no worker-log lookup mistakes it for a live log.

use crate::util::time::compact_utc;

/// The directory of a node's logs below `P/<session>/<node>/`.
pub const LOGS_DIR: &str = "logs";

/// The key of a live log file; `rel` is its path below the session's `logs/` directory.
pub fn log_key(history_prefix: &str, session: &str, node: &str, rel: &str) -> String {
    format!("{history_prefix}/{session}/{node}/{LOGS_DIR}/{rel}")
}

/// The key of a rotated backup of `live_rel` whose last change was at `mtime_ns`.
pub fn rotated_log_key(
    history_prefix: &str,
    session: &str,
    node: &str,
    live_rel: &str,
    mtime_ns: i64,
) -> String {
    format!(
        "{history_prefix}/{session}/{node}/{LOGS_DIR}/{live_rel}.rotated.{}",
        compact_utc(mtime_ns)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keys_keep_rays_names_and_rotated_names_sort_by_time() {
        assert_eq!(
            log_key("P", "s", "n", "events/event_GCS.log"),
            "P/s/n/logs/events/event_GCS.log"
        );
        assert_eq!(
            rotated_log_key("P", "s", "n", "raylet.out", 1_795_314_700_123_456_789),
            "P/s/n/logs/raylet.out.rotated.20261122T023140.123456789Z"
        );
        let earlier = rotated_log_key("P", "s", "n", "raylet.out", 1_795_314_699_999_999_999);
        let later = rotated_log_key("P", "s", "n", "raylet.out", 1_795_314_700_000_000_000);
        assert!(earlier < later);
    }
}
