//! Small durable-file helpers shared by the spool, the log ledger and the export offsets.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Replaces `path` with `value` as JSON, atomically and durably (temp file, fsync, rename,
/// fsync of the directory): the small state files beside the spool (log ledger, export
/// offsets) are never seen half written.
pub fn write_json_atomically(path: &Path, value: &impl serde::Serialize) -> io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
    write_atomically(path, &bytes)
}

/// Replaces `path` with `bytes`, atomically and durably, as [`write_json_atomically`] does
/// (its temp file is `path` with the extension `json.tmp`).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// `fsync` of a directory: makes the entries created or renamed in it durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
