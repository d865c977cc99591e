//! Appends and versions on `file://`: the object is a file under the bucket directory. A log's
//! new bytes are appended in place (a failure halfway is cut back, or seen by the next round's
//! ETag check and repaired by a whole upload); an event object's version is written whole
//! under a temporary name beside it and renamed over it, so a reader never sees a part of a
//! gzip member and a kill leaves the previous version whole (and at most a temporary, removed
//! at the next start).

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::local::LocalFileSystem;
use object_store::ObjectStoreExt;

use super::{check_object, read_err, unavailable, AppendError, Appended, Appender, Checked};
use crate::storage::put::parse_key;
use crate::util::fs::Beneath;
use crate::util::pace::Flow;

pub(super) async fn append_local(
    fs: &Arc<LocalFileSystem>,
    key: &str,
    file: &Beneath,
    from: u64,
    to: u64,
    e_tag: Option<&str>,
    pace: Flow<'_>,
) -> Result<Appended, AppendError> {
    let location = parse_key(key).map_err(|e| unavailable(key, &e))?;
    if let Checked::NoETag { why } = check_object(fs.as_ref(), key, &location, from, e_tag).await? {
        // A local directory always gives one; nothing to compare otherwise.
        return Err(AppendError::Changed {
            key: key.into(),
            why,
        });
    }
    let target = fs
        .path_to_filesystem(&location)
        .map_err(|e| unavailable(key, &e))?;
    pace.take(to - from).await;
    let source = file.clone();
    let key_owned = key.to_string();
    let (written, tail) =
        tokio::task::spawn_blocking(move || copy_range(&source, &target, from, to, &key_owned))
            .await
            .map_err(|e| unavailable(key, &e))??;
    let after = fs.head(&location).await.map_err(|e| unavailable(key, &e))?;
    Ok(Appended {
        bytes: written,
        e_tag: after.e_tag,
        tail: Some(tail),
        version: None,
    })
}

pub(super) async fn replace_local(
    fs: &Arc<LocalFileSystem>,
    key: &str,
    source: &Beneath,
    len: u64,
) -> Result<Appended, AppendError> {
    let location = parse_key(key).map_err(|e| unavailable(key, &e))?;
    let target = fs
        .path_to_filesystem(&location)
        .map_err(|e| unavailable(key, &e))?;
    let (source, key_owned) = (source.clone(), key.to_string());
    tokio::task::spawn_blocking(move || {
        write_version(&source, &target, len, local_temp_tag(), &key_owned)
    })
    .await
    .map_err(|e| unavailable(key, &e))??;
    let after = fs.head(&location).await.map_err(|e| unavailable(key, &e))?;
    Ok(Appended {
        bytes: len,
        e_tag: after.e_tag,
        tail: None,
        version: None,
    })
}

/// The end of the name of a temporary a new version of an event object is written to on
/// `file://`: `.<object name>.<node tag>.rhc-tmp`, beside the object. The history server
/// (which wants `-YYYY-MM-DD-HH[-<n>][.jsonl][.gz]` at the end) and `inspect` never take it
/// for an object.
pub const LOCAL_TEMP_SUFFIX: &str = ".rhc-tmp";

/// This node's tag in the names of its temporaries: the host name (the pod's name on
/// Kubernetes, kept across restarts of the container), reduced to `[A-Za-z0-9-]`.
pub fn local_temp_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is valid for its length; gethostname writes at most that.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let tag: String = if rc == 0 { &buf[..end] } else { &[][..] }
            .iter()
            .map(|&b| b as char)
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(64)
            .collect();
        if tag.is_empty() {
            "node".to_string()
        } else {
            tag
        }
    })
}

/// The temporary beside `target` that its next version is written to.
fn temp_path(target: &Path, tag: &str) -> Option<PathBuf> {
    let name = target.file_name()?.to_str()?;
    Some(target.with_file_name(format!(".{name}.{tag}{LOCAL_TEMP_SUFFIX}")))
}

/// Writes the first `len` bytes of `source` beside `target` under a temporary name, fsyncs
/// it and renames it over `target` (the directory is fsync'd at the seal only, see
/// [`sync_local_object_dir`]): a reader opens the previous
/// version or this one, never a part of one, and a kill at any point leaves the previous
/// version whole (and at most this temporary, which [`Appender::prepare`] removes at the
/// next start). The copy is the kernel's (`copy_file_range` on Linux).
fn write_version(
    source: &Beneath,
    target: &Path,
    len: u64,
    tag: &str,
    key: &str,
) -> Result<(), AppendError> {
    let path = source.path();
    let store_err = |e: io::Error| unavailable(key, &e);
    let dir = target
        .parent()
        .ok_or_else(|| unavailable(key, &"no parent directory"))?;
    std::fs::create_dir_all(dir).map_err(store_err)?;
    let tmp = temp_path(target, tag).ok_or_else(|| unavailable(key, &"not a plain file name"))?;
    let result = (|| {
        let src = source.open().map_err(|e| read_err(&path, e))?;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(store_err)?;
        let copied = io::copy(&mut src.take(len), &mut out).map_err(|e| read_err(&path, e))?;
        if copied != len {
            return Err(read_err(
                &path,
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{copied} bytes where {len} were expected"),
                ),
            ));
        }
        out.sync_all().map_err(store_err)?;
        std::fs::rename(&tmp, target).map_err(store_err)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `file://`: makes the last rename of the object `key` durable (its directory fsync'd):
/// called once a segment's last version is written, before the segment is deleted. Every
/// version is fsync'd before its rename, so after a power loss the object is one whole
/// version; without this the last rename could be lost with the segment already gone. Not
/// done for each round's version: at 50,000 partitions a second fsync per publication
/// halved the rounds' pace and made the drain at SIGTERM miss its deadline.
pub async fn sync_local_object_dir(app: &Appender, key: &str) {
    let Appender::Local(fs) = app else { return };
    let Ok(location) = parse_key(key) else { return };
    let Ok(target) = fs.path_to_filesystem(&location) else {
        return;
    };
    let Some(dir) = target.parent().map(Path::to_path_buf) else {
        return;
    };
    let synced =
        tokio::task::spawn_blocking(move || std::fs::File::open(&dir).and_then(|d| d.sync_all()))
            .await;
    if let Ok(Err(e)) = synced {
        tracing::warn!(%key, error = %e, "could not fsync the object's directory");
    }
}

/// `file://`: removes the temporary this node may have left beside the object `key` (a run
/// killed while writing one of its versions). Called at the seal, under the segment's lock,
/// so no version of `key` is being written: the restart that finishes a segment whose first
/// version was cut short uploads it whole by another path, and without this the temporary
/// would stay beside the object.
pub async fn remove_local_temp(app: &Appender, key: &str) {
    let Appender::Local(fs) = app else { return };
    let Ok(location) = parse_key(key) else { return };
    let Ok(target) = fs.path_to_filesystem(&location) else {
        return;
    };
    let Some(tmp) = temp_path(&target, local_temp_tag()) else {
        return;
    };
    let removed = tokio::task::spawn_blocking(move || std::fs::remove_file(&tmp)).await;
    match removed {
        Ok(Ok(())) => {
            tracing::info!(%key, "removed a temporary an earlier run left beside the object")
        }
        Ok(Err(e)) if e.kind() == io::ErrorKind::NotFound => {}
        Ok(Err(e)) => {
            tracing::warn!(%key, error = %e, "could not remove the temporary beside the object")
        }
        Err(_) => {}
    }
}

/// The folders below a node's that hold event objects, the only objects written through a
/// temporary ([`temp_path`]).
const EVENT_FOLDERS: [&str; 3] = [
    crate::contract::events::NODE_EVENTS_DIR,
    crate::contract::events::JOB_EVENTS_DIR,
    crate::contract::events::EXPORT_EVENTS_DIR,
];

/// A directory still to walk: opened from its parent's descriptor when its turn comes (so
/// the walk holds one descriptor per level, not one per directory waiting), and its path for
/// the log.
struct Pending {
    parent: std::rc::Rc<std::os::fd::OwnedFd>,
    name: std::ffi::OsString,
    path: PathBuf,
    /// 0 for an event folder, 1 for a folder in it (a job's, an export group's), ...
    depth: usize,
}

/// A folder the cleanup could not open or list: warned, unless it is gone, not a folder or a
/// symlink (not followed), none of which can hold anything of ours (review r39y D1: a full
/// descriptor table or an unreadable folder skipped folders without a word); `skipped` is
/// returned.
fn unlooked<T>(path: &Path, e: &io::Error, skipped: T) -> T {
    if !matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
    ) {
        tracing::warn!(path = %path.display(), error = %e, "could not look for temporaries an earlier run left in this folder");
    }
    skipped
}

/// How deep below an event folder the cleanup looks: event objects are at most one folder
/// below one (`job_events/<job>/`, `export_events/<group>/`), so their temporaries too; a
/// deeper tree (no writer of ours makes one) is not walked, which also bounds the
/// descriptors the walk holds open (review r39x D1: a tree 200 folders deep ran out of
/// descriptors and the rest was skipped silently).
const MAX_TEMPORARY_DEPTH: usize = 2;

/// Removes this node's temporaries (tag `tag`) below the event folders of
/// `<history root>/<any session>/<node>/`: what a run killed while writing a version left.
/// Only there: the node's `logs/` holds Ray's files under their own names, and a log file
/// named like a temporary is a log, not ours to remove (review r39u D1). The walk never
/// leaves the bucket: every directory below the history root (sessions, the node's, the
/// event folders and what they hold) is opened from its parent's descriptor without
/// following a symlink, and a temporary is removed with `unlinkat` on the descriptor it was
/// listed from, never looked up again by path, so a symlink put in place of a directory
/// before or during the walk is never followed (reviews r39v D1, r39w D1). The number
/// removed.
pub(super) fn remove_temporaries(history_root: &Path, node: &str, tag: &str) -> usize {
    use crate::util::fs::{list_dir, open_dir, stat_at};
    use std::ffi::OsStr;
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    use std::rc::Rc;

    let end = format!(".{tag}{LOCAL_TEMP_SUFFIX}");
    let mut removed = 0;
    // The history root may be reached through a symlink of the user's (the bucket's path).
    let root = match std::fs::File::open(history_root).map(std::os::fd::OwnedFd::from) {
        Ok(fd) => fd,
        Err(e) => return unlooked(history_root, &e, 0),
    };
    let sessions = match list_dir(&root) {
        Ok(names) => names,
        Err(e) => return unlooked(history_root, &e, 0),
    };
    for s in sessions {
        let session = match open_dir(Some(&root), &s) {
            Ok(fd) => fd,
            Err(e) => {
                unlooked(&history_root.join(&s), &e, ());
                continue;
            }
        };
        let node_dir = match open_dir(Some(&session), OsStr::new(node)) {
            Ok(fd) => fd,
            Err(e) => {
                unlooked(&history_root.join(&s).join(node), &e, ());
                continue;
            }
        };
        let node_dir = Rc::new(node_dir);
        let node_path = history_root.join(&s).join(node);
        let mut stack: Vec<Pending> = EVENT_FOLDERS
            .iter()
            .map(|f| Pending {
                parent: node_dir.clone(),
                name: f.into(),
                path: node_path.join(f),
                depth: 0,
            })
            .collect();
        while let Some(p) = stack.pop() {
            let dir = match open_dir(Some(&p.parent), &p.name) {
                Ok(dir) => dir,
                Err(e) => {
                    unlooked(&p.path, &e, ());
                    continue;
                }
            };
            let dir = Rc::new(dir);
            let names = match list_dir(&dir) {
                Ok(names) => names,
                Err(e) => {
                    unlooked(&p.path, &e, ());
                    continue;
                }
            };
            let mut unreadable = false;
            for name in names {
                let st = match stat_at(&dir, &name) {
                    Ok(st) => st,
                    Err(e) => {
                        // Once a folder (a listable one that cannot be entered, review r39z
                        // D1), not once per entry.
                        if !unreadable && e.raw_os_error() != Some(libc::ENOENT) {
                            unreadable = true;
                            unlooked(&p.path, &e, ());
                        }
                        continue;
                    }
                };
                let path = p.path.join(&name);
                if st.is_dir() {
                    if p.depth < MAX_TEMPORARY_DEPTH {
                        stack.push(Pending {
                            parent: dir.clone(),
                            name,
                            path,
                            depth: p.depth + 1,
                        });
                    }
                    continue;
                }
                let text = name.to_string_lossy();
                if !(st.is_file() && text.starts_with('.') && text.ends_with(&end)) {
                    continue;
                }
                let Ok(c) = std::ffi::CString::new(name.as_bytes()) else {
                    continue;
                };
                // SAFETY: `dir` is an open directory descriptor for the call and `c` is a
                // NUL-terminated name in it.
                let r = unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
                if r == 0 {
                    removed += 1;
                } else {
                    let err = io::Error::last_os_error();
                    tracing::warn!(path = %path.display(), error = %err, "could not remove a temporary an earlier run left");
                }
            }
        }
    }
    removed
}

/// Appends `source[from..to)` to `target`, which must have exactly `from` bytes.
fn copy_range(
    source: &Beneath,
    target: &Path,
    from: u64,
    to: u64,
    key: &str,
) -> Result<(u64, u64), AppendError> {
    let path = source.path();
    let read_err = |e| read_err(&path, e);
    let store_err = |e: io::Error| unavailable(key, &e);
    let mut src = source.open().map_err(read_err)?;
    src.seek(SeekFrom::Start(from)).map_err(read_err)?;
    let mut out = std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(target)
        .map_err(store_err)?;
    if out.metadata().map_err(store_err)?.len() != from {
        return Err(AppendError::Changed {
            key: key.to_string(),
            why: "the object changed size during the append".into(),
        });
    }
    let mut src = src.take(to - from);
    let mut buf = vec![0u8; 256 * 1024];
    let mut written = 0u64;
    let mut tail = xxhash_rust::xxh3::Xxh3Default::new();
    let result = loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) => break Err(read_err(e)),
        };
        if let Err(e) = out.write_all(&buf[..n]) {
            break Err(store_err(e));
        }
        tail.update(&buf[..n]);
        written += n as u64;
    };
    let result = result.and_then(|()| {
        if written != to - from {
            return Err(read_err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the file shrank to {} bytes during the append",
                    from + written
                ),
            )));
        }
        Ok((written, tail.digest()))
    });
    if result.is_err() && written > 0 {
        // Cut back: the object stays the previous version, whole (an event object's
        // readers must never see half a member).
        let _ = out.set_len(from);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_replaces_the_object_whole_and_leftovers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let shadow = dir.path().join("shadow");
        std::fs::write(&shadow, b"0123456789").unwrap();
        let src = Beneath {
            root: dir.path().to_path_buf(),
            rel: "shadow".into(),
            dev: 0,
            ino: 0,
        };
        let root = dir.path().join("bucket/P");
        let node_dir = root.join("s1/n1/job_events/AQAAAA==");
        let target = node_dir.join("e-2026-11-22-02-1.jsonl.gz");
        write_version(&src, &target, 4, "host-a", "k").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"0123");
        write_version(&src, &target, 10, "host-a", "k").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"0123456789");
        // Asked for more than the source has: the object stays as it was, no temporary.
        let err = write_version(&src, &target, 11, "host-a", "k").unwrap_err();
        assert!(matches!(err, AppendError::Read { .. }), "{err}");
        assert_eq!(std::fs::read(&target).unwrap(), b"0123456789");
        assert_eq!(std::fs::read_dir(&node_dir).unwrap().count(), 1);
        // A kill between the write and the rename leaves a temporary; the history server's
        // pattern does not take it for an event object, and only this host's are removed.
        let ours = temp_path(&target, "host-a").unwrap();
        let theirs = temp_path(&target, "host-b").unwrap();
        std::fs::write(&ours, b"x").unwrap();
        std::fs::write(&theirs, b"x").unwrap();
        let name = ours.file_name().unwrap().to_str().unwrap();
        assert!(
            crate::contract::events::parse_event_object_name(name).is_none(),
            "{name}"
        );
        // Another node's directory is not looked at.
        let other = root.join("s1/n2/job_events/x");
        std::fs::create_dir_all(&other).unwrap();
        let other_tmp = other.join(".o-2026-11-22-02.jsonl.gz.host-a.rhc-tmp");
        std::fs::write(&other_tmp, b"x").unwrap();
        // A log file of the node named like a temporary is Ray's, not ours (review r39u D1).
        let logs = root.join("s1/n1/logs");
        std::fs::create_dir_all(&logs).unwrap();
        let log = logs.join(".app.log.host-a.rhc-tmp");
        std::fs::write(&log, b"a log").unwrap();
        // Nothing is deleted through a symlink, whether it is an event folder, a node's or a
        // session's (review r39v D1).
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        let victims = [
            outside.join(".v.jsonl.host-a.rhc-tmp"),
            outside.join("sub/.w.jsonl.host-a.rhc-tmp"),
        ];
        for v in &victims {
            std::fs::write(v, b"not ours").unwrap();
        }
        std::fs::create_dir_all(root.join("s2/n1")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("s2/n1/node_events")).unwrap();
        std::fs::create_dir_all(root.join("s3")).unwrap();
        std::fs::create_dir_all(outside.join("node_events")).unwrap();
        let deep = outside.join("node_events/.x.jsonl.host-a.rhc-tmp");
        std::fs::write(&deep, b"not ours").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("s3/n1")).unwrap();
        std::os::unix::fs::symlink(root.join("s3"), root.join("s4")).unwrap();
        assert_eq!(remove_temporaries(&root, "n1", "host-a"), 1);
        assert!(!ours.exists() && theirs.exists() && other_tmp.exists() && target.exists());
        assert!(log.exists());
        assert!(victims.iter().all(|v| v.exists()) && deep.exists());
    }

    #[tokio::test]
    async fn appends_only_to_the_object_it_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let bucket = dir.path().join("bucket");
        std::fs::create_dir(&bucket).unwrap();
        let app = Appender::local(&bucket).unwrap();
        let Appender::Local(fs) = &app else {
            unreachable!()
        };
        let file = dir.path().join("raylet.out");
        std::fs::write(&file, b"line 1\nline 2\n").unwrap();
        let src = Beneath {
            root: dir.path().to_path_buf(),
            rel: "raylet.out".into(),
            dev: 0,
            ino: 0,
        };
        let key = "P/s/n/logs/raylet.out";
        let loc = parse_key(key).unwrap();
        let put = fs
            .put(&loc, object_store::PutPayload::from_static(b"line 1\n"))
            .await
            .unwrap();
        let done = app
            .append(key, &src, 7, 14, put.e_tag.as_deref(), Flow::default())
            .await
            .unwrap();
        assert_eq!(done.bytes, 7);
        let got = fs.get(&loc).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"line 1\nline 2\n");
        // The old ETag no longer matches: someone (here, we) changed the object.
        let err = app
            .append(key, &src, 14, 14, put.e_tag.as_deref(), Flow::default())
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::Changed { .. }), "{err}");
        // A wrong size is refused before anything is written.
        let err = app
            .append(key, &src, 7, 14, done.e_tag.as_deref(), Flow::default())
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::Changed { .. }), "{err}");
        let got = fs.get(&loc).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"line 1\nline 2\n");
        // A file shorter than asked: an error, and the ledger is not advanced by the caller.
        let err = app
            .append(key, &src, 14, 20, done.e_tag.as_deref(), Flow::default())
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::Read { .. }), "{err}");
        // A missing object.
        let err = app
            .append("P/s/n/logs/none", &src, 0, 1, None, Flow::default())
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::Changed { .. }), "{err}");
    }
}
