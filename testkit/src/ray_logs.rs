//! A Ray temp root as the log shipper sees it: session dirs whose `raylet.out` names the
//! node, `session_latest` pointing at the active one, log files written, grown, rotated and
//! rewritten the way Ray does it; and a `file://` bucket's objects read back by key.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// A Ray temp root (`--ray-tmp-dir`).
pub struct RayRoot {
    /// The root.
    pub root: PathBuf,
}

impl RayRoot {
    /// Creates the root.
    pub fn new(root: &Path) -> RayRoot {
        std::fs::create_dir_all(root).expect("create the ray root");
        RayRoot {
            root: root.to_path_buf(),
        }
    }

    /// The logs dir of `session`.
    pub fn logs(&self, session: &str) -> PathBuf {
        self.root.join(session).join("logs")
    }

    /// Creates `session` with a `raylet.out` naming `node`; `active` points session_latest
    /// at it.
    pub fn session(&self, session: &str, node: &str, active: bool) -> PathBuf {
        let logs = self.logs(session);
        std::fs::create_dir_all(&logs).expect("create the session's logs");
        std::fs::write(
            logs.join("raylet.out"),
            format!(
                "[2026-11-22 02:56:15,477 I 1 1] (raylet) main.cc:711: Setting node ID node_id={node}\n"
            ),
        )
        .expect("write raylet.out");
        if active {
            let link = self.root.join("session_latest");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(self.root.join(session), &link).expect("session_latest");
        }
        logs
    }
}

/// `n` numbered lines of 60 bytes, `tag` first (`OLD line 0000001 aaaa…`), from line `from`.
pub fn tagged_lines(tag: &str, from: usize, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 61);
    for i in from..from + n {
        let line = format!("{tag} line {i:07} ");
        out.extend_from_slice(line.as_bytes());
        out.extend(std::iter::repeat_n(
            b'x',
            59usize.saturating_sub(line.len()),
        ));
        out.push(b'\n');
    }
    out
}

/// Truncates `path` in place (same inode) and writes `bytes` from offset 0: a log rewritten
/// with another head.
pub fn rewrite_in_place(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open for the rewrite");
    f.set_len(0).expect("truncate");
    f.seek(SeekFrom::Start(0)).expect("seek");
    f.write_all(bytes).expect("rewrite");
}

/// The object `key` of a `file://` bucket at `bucket`; `None` when it is not there.
pub fn local_object(bucket: &Path, key: &str) -> Option<Vec<u8>> {
    std::fs::read(bucket.join(key)).ok()
}
