//! Small file helpers shared by more than one path: durable writes (the spool, the log ledger,
//! the export offsets) and reading what Ray's session directory holds without following a
//! swapped-in symlink (the log scan, the log uploads, the appender, the export tailer).
//!
//! Ray's user code shares `/tmp/ray` with the collector and can swap any file or directory
//! under a session for a symlink at any moment. So a session's logs are listed and opened
//! only through directory descriptors: the session directory is opened with `O_NOFOLLOW`,
//! every directory below it with `openat(parent, name, O_NOFOLLOW | O_DIRECTORY)` and listed
//! from that descriptor ([`open_dir`], [`list_dir`], [`stat_at`]), and a file is reopened for
//! upload the same way, component by component from the session's descriptor ([`Beneath`]),
//! then checked with `fstat` (regular file, the scan's device and inode). The kernel never
//! resolves a path under the session through a symlink, so there is no window between a
//! check and a use. (`openat2` with `RESOLVE_NO_SYMLINKS` would do the same walk in one
//! call; the components here are checked plain names, so the walk needs no `..` handling,
//! works on every kernel, and is visible to the tests' `LD_PRELOAD` swapper.)

use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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
    use std::os::unix::fs::OpenOptionsExt;
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
    check_regular(&file, path, expect_ino.unwrap_or(0), None)?;
    Ok(file)
}

/// A regular file a scan saw beneath a root directory (a Ray session directory), named by
/// its path relative to that root, with the device and inode the scan saw.
///
/// Everything under the root is untrusted (Ray's user code shares it and can swap any file
/// or directory for a symlink at any moment), so the file is only ever reached from a
/// descriptor of the root, one component at a time, each opened with `O_NOFOLLOW` from its
/// parent's descriptor ([`Beneath::open`]); no path under the root is resolved by the kernel
/// through a symlink, whatever is swapped in between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beneath {
    /// The root directory (trusted up to itself; its last component is not followed either).
    pub root: PathBuf,
    /// Relative to the root: plain names only (no `..`, `.`, or absolute part).
    pub rel: PathBuf,
    /// The device the scan saw (with `ino`, the file's identity).
    pub dev: u64,
    /// The inode the scan saw; 0: any regular file (no identity check).
    pub ino: u64,
}

impl Beneath {
    /// The file's path, for messages (never opened as such).
    pub fn path(&self) -> PathBuf {
        self.root.join(&self.rel)
    }

    /// Opens the file to read it, never through a symlink (see the type's doc), and checks
    /// with `fstat` on the opened descriptor that it is a regular file of the scan's device
    /// and inode. Errors as [`open_scanned`]'s: a symlink or a non-regular file anywhere on
    /// the way is `InvalidInput`; another file than the scan's is `NotFound`.
    pub fn open(&self) -> io::Result<File> {
        let mut parts = Vec::new();
        for c in self.rel.components() {
            match c {
                std::path::Component::Normal(n) => parts.push(n),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{}: not a plain relative path", self.rel.display()),
                    ))
                }
            }
        }
        let Some((last, dirs)) = parts.split_last() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty relative path",
            ));
        };
        let mut dir = open_dir(None, self.root.as_os_str()).map_err(|e| self.err(e))?;
        for d in dirs {
            dir = open_dir(Some(&dir), d).map_err(|e| self.err(e))?;
        }
        let fd = openat(
            Some(&dir),
            last,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
        .map_err(|e| self.err(e))?;
        let file = File::from(fd);
        check_regular(&file, &self.path(), self.ino, Some(self.dev))?;
        Ok(file)
    }

    fn err(&self, e: io::Error) -> io::Error {
        not_followed(e, &self.path())
    }
}

/// `ELOOP` (a symlink met with `O_NOFOLLOW`) and `ENOTDIR` (a non-directory where a
/// directory was expected) become `InvalidInput`: something was swapped in; not followed.
fn not_followed(e: io::Error, path: &Path) -> io::Error {
    match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: a symlink or non-directory on the way; not followed",
                path.display()
            ),
        ),
        _ => e,
    }
}

/// `openat(dir, name, flags)` (`open` when `dir` is `None`), retried on `EINTR`.
fn openat(dir: Option<&OwnedFd>, name: &OsStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a file name"))?;
    let at = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    loop {
        // SAFETY: `c` is a valid NUL-terminated string that outlives the call; `at` is an
        // open descriptor (borrowed for the call) or AT_FDCWD.
        let fd = unsafe { libc::openat(at, c.as_ptr(), flags, 0) };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by openat and is owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Opens the directory `name` (in `dir`, or a path when `dir` is `None`) without following
/// a symlink as its last component.
pub fn open_dir(dir: Option<&OwnedFd>, name: &OsStr) -> io::Result<OwnedFd> {
    openat(
        dir,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
    )
}

/// What `fstatat(.., AT_SYMLINK_NOFOLLOW)` says of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryStat {
    /// `S_IFMT` bits of the mode.
    pub kind: u32,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
}

impl EntryStat {
    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }
    /// A regular file.
    pub fn is_file(&self) -> bool {
        self.kind == libc::S_IFREG
    }
    /// A symlink.
    pub fn is_symlink(&self) -> bool {
        self.kind == libc::S_IFLNK
    }
    fn from_stat(st: &libc::stat) -> EntryStat {
        EntryStat {
            kind: st.st_mode & libc::S_IFMT,
            size: st.st_size as u64,
            mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the entry itself, never a symlink's target.
pub fn stat_at(dir: &OwnedFd, name: &OsStr) -> io::Result<EntryStat> {
    let c = CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a file name"))?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `dir` is open for the call, `c` is NUL-terminated, `st` is writable memory of
    // the right type.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatat succeeded, so it filled `st`.
    Ok(EntryStat::from_stat(unsafe { &st.assume_init() }))
}

/// `fstat` of an open descriptor.
pub fn stat_fd(fd: &OwnedFd) -> io::Result<EntryStat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `fd` is open for the call; `st` is writable memory of the right type.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it filled `st`.
    Ok(EntryStat::from_stat(unsafe { &st.assume_init() }))
}

/// The names in the directory open as `dir` (not `.` and `..`), read from that descriptor
/// (a duplicate of it, so `dir` stays usable), never by path.
pub fn list_dir(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    // SAFETY: `dir` is an open descriptor; dup returns a new one or -1.
    let dup = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is an open directory descriptor we own; fdopendir takes it over (and
    // closedir closes it); on failure we close it.
    let d = unsafe { libc::fdopendir(dup) };
    if d.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `dup` is still ours to close.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    // Start from the beginning even if the descriptor was read before.
    // SAFETY: `d` is a valid DIR stream.
    unsafe { libc::rewinddir(d) };
    let mut out = Vec::new();
    loop {
        // readdir says an error only through errno (NULL is also the end): cleared before
        // each call, so a listing cut by an error is an error, not a shorter folder (review
        // r39z D2: an EIO mid-listing dropped the rest of the folder without a word).
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `d` is a valid DIR stream, used by this thread only.
        let ent = unsafe { libc::readdir(d) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            if e.raw_os_error().is_some_and(|n| n != 0) {
                // SAFETY: `d` is a valid DIR stream, closed once.
                unsafe { libc::closedir(d) };
                return Err(e);
            }
            break;
        }
        // SAFETY: readdir returned a valid entry whose d_name is NUL-terminated and lives
        // until the next readdir on `d`; it is copied at once.
        let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) };
        let name = OsStr::from_bytes(name.to_bytes());
        if name != "." && name != ".." {
            out.push(name.to_os_string());
        }
    }
    // SAFETY: `d` is a valid DIR stream, closed once.
    unsafe { libc::closedir(d) };
    Ok(out)
}

/// The opened `file` must be a regular file, of inode `ino` (0: any) and device `dev`
/// (when given).
fn check_regular(file: &File, path: &Path, ino: u64, dev: Option<u64>) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file now", path.display()),
        ));
    }
    if ino != 0 && (meta.ino() != ino || dev.is_some_and(|d| d != meta.dev())) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} was replaced since the scan (device {dev:?} inode {ino}, now {} {})",
                path.display(),
                meta.dev(),
                meta.ino()
            ),
        ));
    }
    Ok(())
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
