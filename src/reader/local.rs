//! A `file://` bucket read as an untrusted directory: a read-only [`ObjectStore`] that never
//! leaves the bucket's directory, never blocks on a special file and never fails a listing
//! because of one bad name.
//!
//! `object_store`'s `LocalFileSystem` is made for a directory we own: it follows symbolic
//! links (so `logs/raylet.err -> /etc/passwd` would print `/etc/passwd`), opens whatever a
//! name points at (a FIFO named like an event object blocks the read forever), and fails a
//! whole listing when one name cannot be an object key (a folder named with ESC would hide
//! every session). This store guarantees instead:
//!
//! - **No link is followed.** Every key is opened one component at a time from the bucket
//!   directory with `openat(O_NOFOLLOW)`, so neither a linked file nor a linked directory on
//!   the way is entered, and a directory is listed through the descriptor so opened. A link
//!   met while listing is skipped; one met on the way to a key is refused with its reason.
//! - **Only regular files are read.** A FIFO, socket or device is skipped in listings and
//!   refused by a read; it is checked before it is opened (`fstatat`, no side effect on a
//!   device), opened non-blocking, and checked again on the open descriptor.
//! - **A bad name costs only itself.** A name that no object key can hold (a control
//!   character, not UTF-8) is skipped and the rest of the directory is listed.
//! - **Everything skipped is told.** Each skipped entry is recorded once in the [`SkipLog`]
//!   shared with the caller, by its escaped key and reason, and ends up in the report's
//!   problems.
//!
//! The bucket directory itself, given on the command line, is trusted (it may be a link).
//! Writes are not supported: inspect only reads.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd as _};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use futures::StreamExt as _;
use object_store::path::{Path, PathPart};
use object_store::{
    Attributes, CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload,
    ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use crate::util::escape::{escape_name, escape_os_name};

/// Directory levels a recursive listing descends below its prefix: the deepest key of the
/// layout is 7 levels below a session; a deeper tree is someone else's, and each level
/// would cost a descriptor-opening walk from the root.
const MAX_LIST_DEPTH: usize = 32;
/// Objects a recursive listing reads ahead of its consumer.
const LIST_AHEAD: usize = 1024;
/// Operations (a listing of one directory, the opening of one key) that hold descriptors
/// at once; each holds at most three (the directory it is in, the next one, a listing of
/// it). Files handed out by a read are bounded by the reader (`read.rs`), not here.
const OPS_AT_ONCE: usize = 2;
/// Tries of an operation that ran out of descriptors (`EMFILE`, `ENFILE`): another part
/// of the process (or system) frees them soon. The first wait, doubled each time up to
/// [`MAX_RETRY_WAIT`]: about 2 s in all.
const OUT_OF_FILES_TRIES: u32 = 12;
const FIRST_RETRY_WAIT: std::time::Duration = std::time::Duration::from_millis(5);
const MAX_RETRY_WAIT: std::time::Duration = std::time::Duration::from_millis(250);
/// Skipped entries remembered by key (each is counted once and the first are shown); past
/// this many, skips are only counted (a bucket of millions of links must not fill memory).
const MAX_SKIPS_REMEMBERED: usize = 100_000;

/// Why an entry of the bucket directory was not read.
pub(super) const SKIP_SYMLINK: &str =
    "a symbolic link: not followed (links in a file:// bucket are never followed)";
/// A FIFO, socket or device.
const SKIP_SPECIAL: &str = "not a regular file or directory (a FIFO, socket or device): not read";
/// A name that cannot be an object key.
const SKIP_BAD_NAME: &str =
    "a name with a control character, or not UTF-8, that no object key can hold: skipped";
/// Too deep for [`MAX_LIST_DEPTH`].
const SKIP_TOO_DEEP: &str = "a directory nested deeper than inspect lists: not listed";

/// Why a key could not be read.
#[derive(Debug, thiserror::Error)]
pub(super) enum LocalError {
    /// The key or a directory on its way is a symbolic link.
    #[error("{0} is a symbolic link: not followed (links in a file:// bucket are never followed)")]
    Symlink(String),
    /// The key is a FIFO, socket or device.
    #[error("not a regular file ({0}): not read")]
    NotRegular(&'static str),
    /// The operating system refused.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error, whole.
        #[source]
        source: io::Error,
    },
    /// inspect does not write.
    #[error("inspect reads a bucket, it does not write one")]
    ReadOnly,
}

impl LocalError {
    /// The OS error, if this is one.
    pub(super) fn io(&self) -> Option<&io::Error> {
        match self {
            LocalError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The entries skipped while reading a local bucket, each once.
#[derive(Debug, Default)]
pub(crate) struct SkipLog {
    inner: Mutex<SkipInner>,
}

#[derive(Debug, Default)]
struct SkipInner {
    /// Escaped key → reason.
    remembered: BTreeMap<String, &'static str>,
    /// Skips past [`MAX_SKIPS_REMEMBERED`] (possibly the same entry twice).
    uncounted: u64,
}

impl SkipLog {
    /// Records `key` (escaped) as skipped for `reason`, once.
    pub(super) fn record(&self, key: String, reason: &'static str) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if inner.remembered.contains_key(&key) {
            return;
        }
        if inner.remembered.len() < MAX_SKIPS_REMEMBERED {
            inner.remembered.insert(key, reason);
        } else {
            inner.uncounted += 1;
        }
    }

    /// Takes what was recorded: (escaped key, reason) in key order, and how many more.
    pub(crate) fn take(&self) -> (Vec<(String, &'static str)>, u64) {
        match self.inner.lock() {
            Ok(mut inner) => {
                let all = std::mem::take(&mut *inner);
                (all.remembered.into_iter().collect(), all.uncounted)
            }
            Err(_) => (Vec::new(), 0),
        }
    }
}

/// The read-only store over a bucket directory.
#[derive(Debug, Clone)]
pub(super) struct LocalBucket {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The bucket directory, for messages and the payload's path.
    dir: PathBuf,
    /// The bucket directory, opened once: every key is resolved from it.
    root: File,
    skips: Arc<SkipLog>,
    /// Operations in progress, at most [`OPS_AT_ONCE`].
    ops: Mutex<usize>,
    op_done: std::sync::Condvar,
}

/// An operation's place among the [`OPS_AT_ONCE`].
struct OpPermit<'a>(&'a Inner);

impl Drop for OpPermit<'_> {
    fn drop(&mut self) {
        if let Ok(mut n) = self.0.ops.lock() {
            *n = n.saturating_sub(1);
        }
        self.0.op_done.notify_one();
    }
}

/// True for the errors of a process or system out of descriptors.
fn out_of_files(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

impl std::fmt::Display for LocalBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalBucket({})", self.inner.dir.display())
    }
}

impl LocalBucket {
    /// Opens the bucket directory `dir`; skipped entries go to `skips`.
    pub(super) fn open(dir: &std::path::Path, skips: Arc<SkipLog>) -> io::Result<LocalBucket> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let root = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(dir)?;
        Ok(LocalBucket {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                root,
                skips,
                ops: Mutex::new(0),
                op_done: std::sync::Condvar::new(),
            }),
        })
    }
}

/// What stopped the resolution of a key.
enum Refused {
    NotFound(io::Error),
    Local(LocalError),
}

impl Refused {
    fn into_store_error(self, key: &str) -> object_store::Error {
        match self {
            Refused::NotFound(source) => object_store::Error::NotFound {
                path: escape_name(key),
                source: Box::new(source),
            },
            Refused::Local(e) => object_store::Error::Generic {
                store: "file",
                source: Box::new(e),
            },
        }
    }
}

fn io_refusal(what: &'static str, source: io::Error) -> Refused {
    if source.kind() == io::ErrorKind::NotFound {
        Refused::NotFound(source)
    } else {
        Refused::Local(LocalError::Io { what, source })
    }
}

/// The kind of a directory entry, from its `st_mode`, without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    Special,
}

fn kind_of_mode(mode: libc::mode_t) -> Kind {
    match mode & libc::S_IFMT {
        libc::S_IFREG => Kind::File,
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
        _ => Kind::Special,
    }
}

fn kind_of(ft: std::fs::FileType) -> Kind {
    if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_file() {
        Kind::File
    } else {
        // FIFO, socket, block or character device.
        Kind::Special
    }
}

/// `name` in `dir` as a C string (a key part never holds NUL; checked anyway).
fn c_name(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: what `name` is, without opening it.
fn kind_at(dir: &File, name: &str) -> io::Result<Kind> {
    let c = c_name(name)?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `c` is NUL-terminated and outlives the call, `dir` is an open descriptor, and
    // `st` points to writable memory of the size of `struct stat`.
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
    // SAFETY: fstatat returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Ok(kind_of_mode(st.st_mode))
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC)`.
fn open_at(dir: &File, name: &str, flags: libc::c_int) -> io::Result<File> {
    let c = c_name(name)?;
    // SAFETY: `c` is NUL-terminated and outlives the call; `dir` is an open descriptor.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat: open, and owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

impl Inner {
    /// Waits for a place among the [`OPS_AT_ONCE`] operations.
    fn enter(&self) -> OpPermit<'_> {
        let Ok(mut n) = self.ops.lock() else {
            return OpPermit(self);
        };
        while *n >= OPS_AT_ONCE {
            n = match self.op_done.wait(n) {
                Ok(n) => n,
                Err(_) => return OpPermit(self),
            };
        }
        *n += 1;
        OpPermit(self)
    }

    /// Runs `op` as one of the [`OPS_AT_ONCE`], again while it fails for want of
    /// descriptors (at most [`OUT_OF_FILES_TRIES`] times).
    fn run<T>(&self, op: impl Fn() -> Result<T, Refused>) -> Result<T, Refused> {
        let mut wait = FIRST_RETRY_WAIT;
        let mut tries = 1;
        loop {
            let result = {
                let _permit = self.enter();
                op()
            };
            match result {
                Err(Refused::Local(LocalError::Io { source, .. }))
                    if out_of_files(&source) && tries < OUT_OF_FILES_TRIES => {}
                other => return other,
            }
            std::thread::sleep(wait);
            wait = (wait * 2).min(MAX_RETRY_WAIT);
            tries += 1;
        }
    }

    /// Opens the directory `parts` below the root, one component at a time, following no
    /// link.
    fn open_dir(&self, parts: &[String]) -> Result<File, Refused> {
        let mut dir: Option<File> = None;
        for (i, part) in parts.iter().enumerate() {
            let parent = dir.as_ref().unwrap_or(&self.root);
            match open_at(parent, part, libc::O_RDONLY | libc::O_DIRECTORY) {
                Ok(d) => dir = Some(d),
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                    return Err(match kind_at(parent, part) {
                        Ok(Kind::Symlink) => {
                            Refused::Local(LocalError::Symlink(escape_name(&parts[..=i].join("/"))))
                        }
                        // A file where a directory would be: no such prefix.
                        _ => Refused::NotFound(e),
                    });
                }
                Err(e) => return Err(io_refusal("opening a directory", e)),
            }
        }
        match dir {
            Some(d) => Ok(d),
            None => self
                .root
                .try_clone()
                .map_err(|e| io_refusal("opening the bucket directory", e)),
        }
    }

    /// Opens the regular file `parts` below the root, following no link.
    fn open_file(&self, parts: &[String]) -> Result<(File, std::fs::Metadata), Refused> {
        let Some((name, dirs)) = parts.split_last() else {
            return Err(Refused::NotFound(io::Error::from(io::ErrorKind::NotFound)));
        };
        let dir = self.open_dir(dirs)?;
        match kind_at(&dir, name) {
            Ok(Kind::File) => {}
            Ok(Kind::Symlink) => {
                return Err(Refused::Local(LocalError::Symlink(escape_name(
                    &parts.join("/"),
                ))))
            }
            Ok(Kind::Dir) => {
                return Err(Refused::NotFound(io::Error::from(io::ErrorKind::NotFound)))
            }
            Ok(Kind::Special) => {
                return Err(Refused::Local(LocalError::NotRegular(
                    "a FIFO, socket or device",
                )))
            }
            Err(e) => return Err(io_refusal("reading the file's type", e)),
        }
        // Non-blocking: were it swapped for a FIFO since, the open must not wait for a
        // writer.
        let file = open_at(
            &dir,
            name,
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => Refused::Local(LocalError::Symlink(escape_name(&parts.join("/")))),
            _ => io_refusal("opening", e),
        })?;
        let meta = file
            .metadata()
            .map_err(|e| io_refusal("reading the file's size", e))?;
        if !meta.is_file() {
            return Err(Refused::Local(LocalError::NotRegular(
                "a FIFO, socket or device",
            )));
        }
        Ok((file, meta))
    }

    /// The entries of the directory `parts`, sorted by name, each a valid key part with its
    /// kind; the others are recorded as skipped.
    fn read_dir(
        &self,
        parts: &[String],
    ) -> Result<Vec<(String, Kind, Option<std::fs::Metadata>)>, Refused> {
        let dir = self.open_dir(parts)?;
        // The directory as opened (no link on the way), not as its path names it now.
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        let listed = match std::fs::read_dir(&by_fd) {
            Ok(l) => l,
            // No /proc: the path, whose components were just checked.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::read_dir(parts.iter().fold(self.dir.clone(), |p, c| p.join(c)))
                    .map_err(|e| io_refusal("listing a directory", e))?
            }
            Err(e) => return Err(io_refusal("listing a directory", e)),
        };
        let prefix = parts.join("/");
        let key_of = |name: &str| {
            if prefix.is_empty() {
                name.to_string()
            } else {
                format!("{prefix}/{name}")
            }
        };
        let mut entries = Vec::new();
        for entry in listed {
            let entry = entry.map_err(|e| io_refusal("listing a directory", e))?;
            let os_name = entry.file_name();
            let name = match os_name.to_str() {
                Some(n) if PathPart::parse(n).is_ok() => n.to_string(),
                _ => {
                    let shown = if prefix.is_empty() {
                        escape_os_name(&os_name)
                    } else {
                        format!("{}/{}", escape_name(&prefix), escape_os_name(&os_name))
                    };
                    self.skips.record(shown, SKIP_BAD_NAME);
                    continue;
                }
            };
            let kind = match entry.file_type() {
                Ok(ft) => kind_of(ft),
                // Removed since it was listed: as if it had not been there.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_refusal("reading a file's type", e)),
            };
            match kind {
                Kind::Symlink => self.skips.record(escape_name(&key_of(&name)), SKIP_SYMLINK),
                Kind::Special => self.skips.record(escape_name(&key_of(&name)), SKIP_SPECIAL),
                Kind::Dir => entries.push((name, Kind::Dir, None)),
                Kind::File => {
                    // Not followed: the entry's own metadata.
                    let meta = match entry.metadata() {
                        Ok(m) => m,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(io_refusal("reading a file's size", e)),
                    };
                    entries.push((name, Kind::File, Some(meta)));
                }
            }
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(entries)
    }
}

fn object_meta(location: Path, meta: &std::fs::Metadata) -> ObjectMeta {
    ObjectMeta {
        location,
        last_modified: meta.modified().map(Into::into).unwrap_or_default(),
        size: meta.len(),
        e_tag: None,
        version: None,
    }
}

/// The key of `parts`, each already a valid key part, as the raw text (not percent-encoded
/// as `Path::from` would: the names on disk are the keys).
fn key_path(parts: &[String]) -> Option<Path> {
    Path::parse(parts.join("/")).ok()
}

/// The raw parts of a key: the names on disk.
fn parts_of(path: &Path) -> Vec<String> {
    path.parts().map(|p| p.as_ref().to_string()).collect()
}

fn join_error(e: tokio::task::JoinError) -> object_store::Error {
    object_store::Error::JoinError { source: e }
}

fn read_only() -> object_store::Error {
    object_store::Error::Generic {
        store: "file",
        source: Box::new(LocalError::ReadOnly),
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Lists `prefix` recursively into `tx`, depth first, one directory open at a time.
fn walk(
    inner: &Inner,
    prefix: Vec<String>,
    tx: &tokio::sync::mpsc::Sender<object_store::Result<ObjectMeta>>,
) {
    let mut stack = vec![prefix];
    while let Some(parts) = stack.pop() {
        let entries = match inner.run(|| inner.read_dir(&parts)) {
            Ok(e) => e,
            Err(Refused::NotFound(_)) => continue,
            Err(r) => {
                let _ = tx.blocking_send(Err(r.into_store_error(&parts.join("/"))));
                return;
            }
        };
        let mut dirs = Vec::new();
        for (name, kind, meta) in entries {
            let mut child = parts.clone();
            child.push(name);
            match (kind, meta) {
                (Kind::File, Some(meta)) => {
                    let Some(location) = key_path(&child) else {
                        continue;
                    };
                    if tx.blocking_send(Ok(object_meta(location, &meta))).is_err() {
                        return;
                    }
                }
                (Kind::Dir, _) if child.len() > MAX_LIST_DEPTH => inner
                    .skips
                    .record(escape_name(&child.join("/")), SKIP_TOO_DEEP),
                (Kind::Dir, _) => dirs.push(child),
                _ => {}
            }
        }
        // Popped in name order.
        stack.extend(dirs.into_iter().rev());
    }
}

impl ObjectStore for LocalBucket {
    fn put_opts<'a, 'b, 'async_trait>(
        &'a self,
        _location: &'b Path,
        _payload: PutPayload,
        _opts: PutOptions,
    ) -> BoxFuture<'async_trait, object_store::Result<PutResult>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async { Err(read_only()) })
    }

    fn put_multipart_opts<'a, 'b, 'async_trait>(
        &'a self,
        _location: &'b Path,
        _opts: PutMultipartOptions,
    ) -> BoxFuture<'async_trait, object_store::Result<Box<dyn MultipartUpload>>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async { Err(read_only()) })
    }

    fn get_opts<'a, 'b, 'async_trait>(
        &'a self,
        location: &'b Path,
        options: GetOptions,
    ) -> BoxFuture<'async_trait, object_store::Result<GetResult>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        Self: 'async_trait,
    {
        let inner = Arc::clone(&self.inner);
        let location = location.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let parts = parts_of(&location);
                let (file, meta) = inner
                    .run(|| inner.open_file(&parts))
                    .map_err(|r| r.into_store_error(location.as_ref()))?;
                let range = match &options.range {
                    Some(r) => {
                        r.as_range(meta.len())
                            .map_err(|e| object_store::Error::Generic {
                                store: "file",
                                source: Box::new(e),
                            })?
                    }
                    None => 0..meta.len(),
                };
                let path = parts.iter().fold(inner.dir.clone(), |p, c| p.join(c));
                Ok(GetResult {
                    meta: object_meta(location, &meta),
                    payload: GetResultPayload::File(file, path),
                    range,
                    attributes: Attributes::default(),
                    extensions: Default::default(),
                })
            })
            .await
            .map_err(join_error)?
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        locations.map(|_| Err(read_only())).boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = Arc::clone(&self.inner);
        let prefix = prefix.map(parts_of).unwrap_or_default();
        let (tx, rx) = tokio::sync::mpsc::channel(LIST_AHEAD);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn_blocking(move || walk(&inner, prefix, &tx));
            }
            Err(e) => {
                return futures::stream::once(async move {
                    Err(object_store::Error::Generic {
                        store: "file",
                        source: Box::new(e),
                    })
                })
                .boxed()
            }
        }
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
            .boxed()
    }

    fn list_with_delimiter<'a, 'b, 'async_trait>(
        &'a self,
        prefix: Option<&'b Path>,
    ) -> BoxFuture<'async_trait, object_store::Result<ListResult>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        Self: 'async_trait,
    {
        let inner = Arc::clone(&self.inner);
        let parts = prefix.map(parts_of).unwrap_or_default();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut result = ListResult {
                    common_prefixes: Vec::new(),
                    objects: Vec::new(),
                    extensions: Default::default(),
                };
                let entries = match inner.run(|| inner.read_dir(&parts)) {
                    Ok(e) => e,
                    Err(Refused::NotFound(_)) => return Ok(result),
                    Err(r) => return Err(r.into_store_error(&parts.join("/"))),
                };
                for (name, kind, meta) in entries {
                    let mut child = parts.clone();
                    child.push(name);
                    let Some(location) = key_path(&child) else {
                        continue;
                    };
                    match (kind, meta) {
                        (Kind::Dir, _) => result.common_prefixes.push(location),
                        (Kind::File, Some(meta)) => {
                            result.objects.push(object_meta(location, &meta))
                        }
                        _ => {}
                    }
                }
                Ok(result)
            })
            .await
            .map_err(join_error)?
        })
    }

    fn copy_opts<'a, 'b, 'c, 'async_trait>(
        &'a self,
        _from: &'b Path,
        _to: &'c Path,
        _options: CopyOptions,
    ) -> BoxFuture<'async_trait, object_store::Result<()>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        'c: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async { Err(read_only()) })
    }
}
