//! Directory watching as a wake-up signal: inotify (through `notify`) tells a path that
//! something changed, and the path rescans. Nothing depends on the watch alone: where
//! inotify is unavailable or its limits are reached, the periodic rescans carry on.

use std::path::Path;

use tokio::sync::mpsc;

/// Watches `dir` recursively; a create or rename (or, with `any_change`, any change) sends
/// a wake-up. Failures (no inotify, watch limits) are logged and the periodic rescan
/// carries on alone.
pub fn watch_dir(
    dir: &Path,
    tx: mpsc::Sender<()>,
    any_change: bool,
) -> Option<notify::RecommendedWatcher> {
    use notify::{EventKind, RecursiveMode, Watcher};
    let handler = move |res: notify::Result<notify::Event>| {
        if let Ok(ev) = res {
            let wanted = any_change
                || matches!(
                    ev.kind,
                    EventKind::Create(_) | EventKind::Modify(notify::event::ModifyKind::Name(_))
                );
            if wanted {
                let _ = tx.try_send(());
            }
        }
    };
    match notify::recommended_watcher(handler) {
        Ok(mut w) => match w.watch(dir, RecursiveMode::Recursive) {
            Ok(()) => Some(w),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the logs directory; relying on periodic rescans");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "file watching unavailable; relying on periodic rescans");
            None
        }
    }
}
