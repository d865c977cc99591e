//! Streamed uploads of local files: a file is read part by part (gzip-compressed on the way
//! if asked), so a 64 MiB segment or a 10 GB log never sits whole in memory, and anything
//! above one part goes up as a multipart upload that is aborted if a part fails.
//!
//! Used by the event uploader (sealed spool segments) and the log shipper (snapshots of
//! files that may still be growing: only the prefix seen at the start is sent).
//!
//! No multipart upload is left behind by us: one whose part or completion fails is aborted
//! at once; one whose upload is dropped half way (a log round cut short by shutdown, the
//! final flush's deadline) is aborted in the background from the drop, and the shutdown
//! waits for those aborts within its budget ([`wait_dropped_aborts`]). A failed abort is a
//! warning (the next start's cleanup, or the bucket's lifecycle rule, removes the upload).

use std::fs::File;
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::gzip::{GzipLevel, MemberEncoder};
use crate::util::fs::{open_scanned, Beneath};
use crate::util::pace::Flow;
use object_store::path::Path as ObjectPath;
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt, PutPayload};

/// Why one upload failed.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// Reading the local file failed.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The object store refused or failed.
    #[error("writing {key}: {source}")]
    Store {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: object_store::Error,
    },
    /// Deleting an object failed (one published under an earlier key, see
    /// `events::publish`): tried again.
    #[error("deleting {key}: {source}")]
    Delete {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: object_store::Error,
    },
    /// An append failed in a way that may pass (see `append::AppendError::Unavailable`).
    #[error("appending to {key}: {message}")]
    Append {
        /// The key.
        key: String,
        /// Why.
        message: String,
    },
    /// The computed key is not a valid object path (should not happen for our own keys).
    #[error("invalid object key {key:?}: {message}")]
    Key {
        /// The key.
        key: String,
        /// Why.
        message: String,
    },
}

/// Uploads the first `limit` bytes of a file as `path` (a spool segment's durable length:
/// bytes past it are a rolled-back write that could not be cut off), gzip-compressed at the
/// level given, if one is; returns the bytes sent.
pub async fn put_file(
    store: &Arc<dyn ObjectStore>,
    path: &ObjectPath,
    key: &str,
    file: &std::path::Path,
    gzip: Option<GzipLevel>,
    part_size: usize,
    limit: u64,
) -> Result<u64, UploadError> {
    // A spool file (ours, not Ray's), opened without following a symlink all the same.
    let opened = open_scanned(file, None).map_err(|source| UploadError::Read {
        path: file.to_path_buf(),
        source,
    })?;
    let len = opened.metadata().map(|m| m.len()).unwrap_or(0);
    let reader = PartReader::from_file(file.to_path_buf(), opened, gzip, limit);
    let part_size = part_size_for(len.min(limit), part_size, MAX_PARTS);
    let put = put_parts(store, path, key, reader, part_size, Flow::default()).await?;
    Ok(put.sent)
}

/// What a log snapshot upload sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotUpload {
    /// Bytes of the file uploaded (the object's size).
    pub bytes: u64,
    /// The object's ETag, when the store gave one.
    pub e_tag: Option<String>,
    /// The hashes of the bytes as they were read for the upload (not of the file after it:
    /// a file rewritten in place meanwhile is told by the next round).
    pub marks: FileMarks,
}

/// What the ledger keeps of the bytes of a log object to recognise its file later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMarks {
    /// [`window_hash`]: the last [`WINDOW`] bytes.
    pub window: u64,
    /// [`head_hash`]: the first [`HEAD`] bytes.
    pub head: u64,
    /// xxh3 of every byte (see [`read_marks`]).
    pub full: u64,
}

/// Uploads the first `limit` bytes of a file that may still be growing, as is (no
/// compression: the history server serves logs byte for byte), streaming in parts, each
/// part after `pace` lets it pass. The file is the one a scan saw, reopened without
/// following a symlink anywhere under its root and checked (see
/// [`crate::util::fs::Beneath`]).
pub async fn put_file_prefix(
    store: &Arc<dyn ObjectStore>,
    key: &str,
    file: &Beneath,
    limit: u64,
    part_size: usize,
    pace: Flow<'_>,
) -> Result<SnapshotUpload, UploadError> {
    let location = parse_key(key)?;
    let path = file.path();
    let opened = file.open().map_err(|source| UploadError::Read {
        path: path.clone(),
        source,
    })?;
    let reader = PartReader::from_file(path, opened, None, limit);
    let part_size = part_size_for(limit, part_size, MAX_PARTS);
    let put = put_parts(store, &location, key, reader, part_size, pace).await?;
    Ok(SnapshotUpload {
        bytes: put.read,
        e_tag: put.e_tag,
        marks: put.marks.hashes(),
    })
}

/// S3's most parts in one multipart upload.
pub const MAX_PARTS: u64 = 10_000;
/// S3's largest part.
pub const MAX_PART: u64 = 5 << 30;

/// The part size for `len` bytes in at most `max_parts` parts: `min` (the configured size)
/// unless that would take more parts, then the smallest whole MiB that fits (so S3's 5 TiB
/// object goes in 10,000 parts of 525 MiB), at most [`MAX_PART`]. One part is in memory at a
/// time, so only a file that big costs that much memory.
pub fn part_size_for(len: u64, min: usize, max_parts: u64) -> usize {
    let need = len.div_ceil(max_parts.max(1)).div_ceil(1 << 20) << 20;
    let size = need.max(min as u64).min(MAX_PART);
    usize::try_from(size).unwrap_or(usize::MAX)
}

/// An object path from one of our keys.
pub(crate) fn parse_key(key: &str) -> Result<ObjectPath, UploadError> {
    ObjectPath::parse(key).map_err(|e| UploadError::Key {
        key: key.to_string(),
        message: e.to_string(),
    })
}

/// Bytes hashed before a point of a log file to recognise it later: enough to tell a file
/// that was replaced or rewritten from one that only grew, small enough to read every round.
pub const WINDOW: u64 = 64 * 1024;

/// xxh3 of the [`WINDOW`] bytes of a file before offset `end` (all of them when `end` is
/// smaller), and whether the file had them all. The file is the one a scan saw, reopened
/// without following a symlink (see [`crate::util::fs::Beneath`]).
pub fn window_hash(file: &Beneath, end: u64) -> io::Result<(u64, bool)> {
    use std::io::{Seek, SeekFrom};
    let start = end.saturating_sub(WINDOW);
    let mut f = file.open()?;
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity((end - start) as usize);
    f.take(end - start).read_to_end(&mut buf)?;
    Ok((
        xxhash_rust::xxh3::xxh3_64(&buf),
        buf.len() as u64 == end - start,
    ))
}

/// Bytes at the start of a log file hashed to recognise it later ([`head_hash`]): a file
/// truncated and rewritten with another head, whose bytes before the end of what was uploaded
/// happen to be the same (a repeated line), is another file, not one that grew.
pub const HEAD: u64 = 64 * 1024;

/// xxh3 of the first [`HEAD`] bytes of a file, at most `end` of them, and whether the file
/// had them all. The file is the one a scan saw, reopened without following a symlink.
pub fn head_hash(file: &Beneath, end: u64) -> io::Result<(u64, bool)> {
    let len = end.min(HEAD);
    let f = file.open()?;
    let mut buf = Vec::with_capacity(len as usize);
    f.take(len).read_to_end(&mut buf)?;
    Ok((xxhash_rust::xxh3::xxh3_64(&buf), buf.len() as u64 == len))
}

/// Sends what `reader` yields as one PUT, or as a multipart upload when it is more than
/// one part, each part after `pace` lets it through.
async fn put_parts(
    store: &Arc<dyn ObjectStore>,
    path: &ObjectPath,
    key: &str,
    mut reader: PartReader,
    part_size: usize,
    pace: Flow<'_>,
) -> Result<Sent, UploadError> {
    let store_err = |source| UploadError::Store {
        key: key.to_string(),
        source,
    };
    let (first, r) = read_part(reader, part_size).await?;
    reader = r;
    let mut marks = Marks::default();
    marks.saw(&first);
    pace.take(first.len() as u64).await;
    if reader.done {
        let sent = first.len() as u64;
        pace.sending(sent);
        let put = store
            .put(path, PutPayload::from(first))
            .await
            .map_err(store_err)?;
        return Ok(Sent {
            read: reader.read,
            sent,
            e_tag: put.e_tag,
            marks,
        });
    }
    let upload = store.put_multipart(path).await.map_err(store_err)?;
    pace.moved();
    // Aborted in the background if this future is dropped before the end (see the module doc).
    let mut guard = AbortOnDrop {
        upload: None,
        key: key.to_string(),
    };
    let upload = guard.upload.insert(upload);
    let mut sent = 0u64;
    let mut part = first;
    let result: Result<(Option<String>, u64), UploadError> = async {
        loop {
            sent += part.len() as u64;
            pace.sending(part.len() as u64);
            upload
                .put_part(PutPayload::from(part))
                .await
                .map_err(store_err)?;
            pace.moved();
            if reader.done {
                break;
            }
            let (next, r) = read_part(reader, part_size).await?;
            reader = r;
            if next.is_empty() {
                break;
            }
            marks.saw(&next);
            pace.take(next.len() as u64).await;
            part = next;
        }
        let done = upload.complete().await.map_err(store_err)?;
        Ok((done.e_tag, reader.read))
    }
    .await;
    match result {
        Ok((e_tag, read)) => {
            guard.upload = None;
            Ok(Sent {
                read,
                sent,
                e_tag,
                marks,
            })
        }
        Err(e) => {
            // Still guarded while aborting: cancelled now, the abort goes on in the background.
            if let Some(upload) = guard.upload.as_mut() {
                if let Err(a) = upload.abort().await {
                    tracing::warn!(%key, error = %a, "could not abort a failed multipart upload: it keeps its parts until the bucket's lifecycle rule (or, for logs, the next start) removes them");
                }
            }
            guard.upload = None;
            Err(e)
        }
    }
}

/// Aborts of multipart uploads dropped half way, spawned by [`AbortOnDrop`]; awaited by
/// [`wait_dropped_aborts`]. Process-wide, since any upload (event or log) may be dropped.
static DROPPED_ABORTS: Mutex<Vec<tokio::task::JoinHandle<()>>> = Mutex::new(Vec::new());

/// A multipart upload in progress: when dropped before it completed or was aborted by its
/// owner (the future that drove it was cancelled), it is aborted in the background.
struct AbortOnDrop {
    upload: Option<Box<dyn MultipartUpload>>,
    key: String,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        let Some(mut upload) = self.upload.take() else {
            return;
        };
        let key = std::mem::take(&mut self.key);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(%key, "a cancelled multipart upload could not be aborted (no runtime); the next start's cleanup or the bucket's lifecycle rule removes it");
            return;
        };
        let task = rt.spawn(async move {
            match upload.abort().await {
                Ok(()) => tracing::info!(%key, "aborted the multipart upload of a cancelled upload"),
                Err(e) => tracing::warn!(%key, error = %e, "could not abort the multipart upload of a cancelled upload: it keeps its parts until the next start's cleanup or the bucket's lifecycle rule removes it"),
            }
        });
        let mut list = DROPPED_ABORTS.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|t| !t.is_finished());
        list.push(task);
    }
}

/// Waits until `deadline` for the aborts of uploads that were dropped half way (a cancelled
/// round, a deadline); the number still running then (each is warned about).
pub async fn wait_dropped_aborts(deadline: Instant) -> usize {
    let tasks: Vec<_> =
        std::mem::take(&mut *DROPPED_ABORTS.lock().unwrap_or_else(|p| p.into_inner()));
    let mut left = 0;
    for t in tasks {
        if tokio::time::timeout_at(deadline.into(), t).await.is_err() {
            left += 1;
        }
    }
    if left > 0 {
        tracing::warn!(
            left,
            "no time left to abort cancelled multipart uploads; the next start (logs) or the bucket's lifecycle rule removes them"
        );
    }
    left
}

/// What one upload did.
struct Sent {
    /// Bytes read from the file.
    read: u64,
    /// Bytes sent (compressed, when compressing).
    sent: u64,
    /// The object's ETag, when the store gave one.
    e_tag: Option<String>,
    /// The head and the last window of what was sent.
    marks: Marks,
}

/// The first [`HEAD`] and the last [`WINDOW`] bytes of what an upload sent, and a hash of
/// all of them, kept as the parts are read, so the ledger describes the bytes in the object.
#[derive(Default)]
struct Marks {
    head: Vec<u8>,
    window: Vec<u8>,
    all: xxhash_rust::xxh3::Xxh3Default,
}

impl Marks {
    fn saw(&mut self, part: &[u8]) {
        let head_left = (HEAD as usize).saturating_sub(self.head.len());
        self.head
            .extend_from_slice(&part[..head_left.min(part.len())]);
        let w = WINDOW as usize;
        self.window
            .extend_from_slice(&part[part.len().saturating_sub(w)..]);
        if self.window.len() > w {
            self.window.drain(..self.window.len() - w);
        }
        self.all.update(part);
    }

    /// The hashes, as [`window_hash`], [`head_hash`] and [`read_marks`] compute them.
    fn hashes(&self) -> FileMarks {
        FileMarks {
            window: xxhash_rust::xxh3::xxh3_64(&self.window),
            head: xxhash_rust::xxh3::xxh3_64(&self.head),
            full: self.all.digest(),
        }
    }
}

/// What [`read_marks`] found: the hashes of a file's bytes before and after a point, read
/// in one pass from one descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitMarks {
    /// xxh3 of the bytes before the point.
    pub before: u64,
    /// xxh3 of the bytes from the point to the end.
    pub after: u64,
    /// The marks of all of them.
    pub all: FileMarks,
}

/// Bytes read at once by [`read_marks`].
const MARKS_READ: usize = 256 << 10;

/// Reads the first `end` bytes of a file once, from one descriptor, and hashes them: those
/// before `split`, those after, and all of them ([`FileMarks`]); `None` when the file has
/// fewer than `end` bytes. The file is the one a scan saw, reopened without following a
/// symlink (another inode at its name is `NotFound`). Costs one sequential read of `end`
/// bytes (xxh3 hashes them far faster than a disk or the page cache gives them) and
/// [`MARKS_READ`] of memory.
pub fn read_marks(file: &Beneath, split: u64, end: u64) -> io::Result<Option<SplitMarks>> {
    read_marks_watched(file, split, end, &|| true)
}

/// [`read_marks`], calling `go` after every [`MARKS_READ`] bytes read: the read goes on
/// while it answers true, and stops with an `Interrupted` error once it answers false (a
/// check nobody waits for any more leaves the disk alone). The log lane counts each call
/// as progress of its send, so a long read-back is not taken for a stuck one.
pub fn read_marks_watched(
    file: &Beneath,
    split: u64,
    end: u64,
    go: &dyn Fn() -> bool,
) -> io::Result<Option<SplitMarks>> {
    let split = split.min(end);
    let mut f = file.open()?.take(end);
    let mut marks = Marks::default();
    let mut before = xxhash_rust::xxh3::Xxh3Default::new();
    let mut after = xxhash_rust::xxh3::Xxh3Default::new();
    let mut buf = vec![0u8; MARKS_READ];
    let mut at = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        let cut = usize::try_from(split.saturating_sub(at)).map_or(n, |c| c.min(n));
        before.update(&chunk[..cut]);
        after.update(&chunk[cut..]);
        marks.saw(chunk);
        at += n as u64;
        if !go() {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "the read-back was stopped",
            ));
        }
    }
    Ok((at == end).then(|| SplitMarks {
        before: before.digest(),
        after: after.digest(),
        all: marks.hashes(),
    }))
}

async fn read_part(
    mut reader: PartReader,
    size: usize,
) -> Result<(Vec<u8>, PartReader), UploadError> {
    let path = reader.path.clone();
    tokio::task::spawn_blocking(move || {
        let part = reader.next_part(size)?;
        Ok((part, reader))
    })
    .await
    .map_err(|e| UploadError::Read {
        path,
        source: io::Error::other(e.to_string()),
    })?
}

/// Reads a file as a sequence of object parts, gzip-compressing on the way if asked.
struct PartReader {
    path: PathBuf,
    file: std::io::Take<File>,
    encoder: Option<Box<MemberEncoder>>,
    /// Bytes read from the file so far.
    read: u64,
    done: bool,
}

impl PartReader {
    /// A spool file (ours, not Ray's), opened without following a symlink all the same.
    #[cfg(test)]
    fn open(path: &std::path::Path, gzip: Option<GzipLevel>) -> Result<PartReader, UploadError> {
        let file = open_scanned(path, None).map_err(|source| UploadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self::from_file(path.to_path_buf(), file, gzip, u64::MAX))
    }

    /// Reads at most `limit` bytes of the already opened `file` (at `path`).
    fn from_file(path: PathBuf, file: File, gzip: Option<GzipLevel>, limit: u64) -> PartReader {
        PartReader {
            path,
            file: file.take(limit),
            encoder: gzip.map(|level| Box::new(MemberEncoder::new(level))),
            read: 0,
            done: false,
        }
    }

    /// Returns the next part of at least `size` bytes, or the rest; sets `done` at the end.
    fn next_part(&mut self, size: usize) -> Result<Vec<u8>, UploadError> {
        let err = |source| UploadError::Read {
            path: self.path.clone(),
            source,
        };
        let mut buf = vec![0u8; 256 * 1024];
        match &mut self.encoder {
            None => {
                let mut out = Vec::with_capacity(size.min(8 << 20));
                while out.len() < size {
                    let want = (size - out.len()).min(buf.len());
                    let n = self.file.read(&mut buf[..want]).map_err(err)?;
                    if n == 0 {
                        self.done = true;
                        break;
                    }
                    self.read += n as u64;
                    out.extend_from_slice(&buf[..n]);
                }
                if !self.done {
                    // Peek whether anything is left, so a file of exactly `size` is one PUT.
                    let mut one = [0u8; 1];
                    let n = self.file.read(&mut one).map_err(err)?;
                    if n == 0 {
                        self.done = true;
                    } else {
                        self.read += 1;
                        out.push(one[0]);
                    }
                }
                Ok(out)
            }
            Some(enc) => {
                let mut out = Vec::with_capacity(size.min(8 << 20));
                while out.len() < size {
                    let read = &mut self.read;
                    let more = enc
                        .next_member(&mut self.file, &mut out, |b| *read += b.len() as u64)
                        .map_err(err)?;
                    if !more {
                        self.done = true;
                        break;
                    }
                }
                Ok(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..100_000u32)
            .flat_map(|i| format!("{{\"i\":{i}}}\n").into_bytes())
            .collect();
        std::fs::write(&p, &data).unwrap();
        let mut r = PartReader::open(&p, None).unwrap();
        let mut out = Vec::new();
        while !r.done {
            out.extend(r.next_part(4096).unwrap());
        }
        assert_eq!(out, data);
        let mut r = PartReader::open(&p, Some(GzipLevel::FASTEST)).unwrap();
        let mut gz = Vec::new();
        let mut parts = 0;
        while !r.done {
            gz.extend(r.next_part(4096).unwrap());
            parts += 1;
        }
        assert!(parts > 1);
        // One gzip member per block of input, read back whole as one gzip file.
        let mut plain = Vec::new();
        flate2::read::MultiGzDecoder::new(&gz[..])
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(plain, data);
        // Exactly one part's worth: a single PUT.
        std::fs::write(&p, vec![b'x'; 4096]).unwrap();
        let mut r = PartReader::open(&p, None).unwrap();
        assert_eq!(r.next_part(4096).unwrap().len(), 4096);
        assert!(r.done);
    }

    #[test]
    fn part_size_fits_any_object_in_ten_thousand_parts() {
        let mib = 1u64 << 20;
        assert_eq!(part_size_for(10 * mib, 8 << 20, MAX_PARTS), 8 << 20);
        // 8 MiB parts cover 78.1 GiB; beyond, the part grows.
        assert_eq!(part_size_for(80 << 30, 8 << 20, MAX_PARTS) as u64, 9 * mib);
        for len in [1u64 << 40, 5u64 << 40, (5u64 << 40) - 1, 4_398_046_511_111] {
            let p = part_size_for(len, 8 << 20, MAX_PARTS) as u64;
            assert!(len.div_ceil(p) <= MAX_PARTS, "{len}: {p}");
            assert!(p <= MAX_PART && p.is_multiple_of(mib));
        }
        assert_eq!(part_size_for(5 << 40, 8 << 20, MAX_PARTS) as u64, 525 * mib);
    }

    #[test]
    fn marks_hash_each_side_of_the_split_and_the_whole() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let meta = std::fs::metadata(dir.path().join("f")).unwrap();
        let file = Beneath {
            root: dir.path().to_path_buf(),
            rel: "f".into(),
            dev: meta.dev(),
            ino: meta.ino(),
        };
        let h = xxhash_rust::xxh3::xxh3_64;
        for (split, end) in [(0, 10), (1_000_000, 1_500_000), (300_000, 300_000), (5, 0)] {
            let end = end as u64;
            let split = (split as u64).min(end);
            let m = read_marks(&file, split, end).unwrap().unwrap();
            let (s, e) = (split as usize, end as usize);
            assert_eq!(m.before, h(&data[..s]));
            assert_eq!(m.after, h(&data[s..e]));
            assert_eq!(m.all.full, h(&data[..e]));
            assert_eq!(m.all.head, head_hash(&file, end).unwrap().0);
            assert_eq!(m.all.window, window_hash(&file, end).unwrap().0);
        }
        // Fewer bytes than asked: nothing to compare.
        assert_eq!(read_marks(&file, 0, data.len() as u64 + 1).unwrap(), None);
    }
}
