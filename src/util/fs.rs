//! Small file helpers shared by more than one path: durable writes (the spool, the log ledger,
//! the export offsets) and opening a scanned file without following a swapped-in symlink (the
//! log uploads, the appender, the export tailer).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Replaces `path` with `value` as JSON, atomically and durably (temp file, fsync, rename,
/// fsync of the directory): the small state files beside the spool (log ledger, export
/// offsets) are never seen half written.
pub fn write_json_atomically(path: &Path, value: &impl serde::Serialize) -> io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
    let mut f = File::create(&tmp)?;
    f.write_all(&bytes)?;
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

/// Opens `path` to read it as the regular file a scan saw, never through a symlink.
///
/// Ray's user code shares the session directory with the collector and can replace a log
/// between the scan (`symlink_metadata`) and the upload with a symlink to a file only the
/// collector can read (a service-account token, mounted credentials). So the file is opened
/// with `O_NOFOLLOW` (a symlink as the last component fails with `ELOOP`) and `O_NONBLOCK`
/// (a FIFO swapped in cannot block the open), and the opened descriptor is checked with
/// `fstat`: a regular file, and the inode `expect_ino` when one is given (the scan's).
/// Everything read afterwards must come from the returned descriptor, never the path again.
///
/// Errors: a symlink or a non-regular file is `InvalidInput`; another inode than the scan's
/// (the file was replaced, e.g. rotated, since) is `NotFound`, like a file that vanished.
pub fn open_scanned(path: &Path, expect_ino: Option<u64>) -> io::Result<File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is a symlink now; not followed", path.display()),
                )
            } else {
                e
            }
        })?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file now", path.display()),
        ));
    }
    if let Some(want) = expect_ino.filter(|&i| i != 0) {
        if meta.ino() != want {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} was replaced since the scan (inode {want}, now {})",
                    path.display(),
                    meta.ino()
                ),
            ));
        }
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn open_scanned_refuses_what_the_scan_did_not_see() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("raylet.out");
        let secret = dir.path().join("token");
        fs::write(&log, b"log line\n").unwrap();
        fs::write(&secret, b"secret").unwrap();
        let ino = fs::symlink_metadata(&log).unwrap().ino();
        assert!(open_scanned(&log, Some(ino)).is_ok());
        assert!(open_scanned(&log, None).is_ok());
        // Replaced by another file under the same name: not the one scanned.
        let other = fs::symlink_metadata(&secret).unwrap().ino();
        let e = open_scanned(&log, Some(other)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        // Swapped for a symlink: never followed, whatever the inode asked.
        fs::remove_file(&log).unwrap();
        std::os::unix::fs::symlink(&secret, &log).unwrap();
        let e = open_scanned(&log, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let e = open_scanned(&log, Some(other)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        // A FIFO does not block the open, and is refused.
        fs::remove_file(&log).unwrap();
        let c = std::ffi::CString::new(log.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_scanned(&log, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        // A directory.
        let e = open_scanned(dir.path(), None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }
}
