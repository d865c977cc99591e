//! Moves sealed spool files to the bucket, and deletes each only after its upload succeeded.
//!
//! A dispatcher owns the queue: session markers first, then event segments oldest first,
//! then quarantine. A few uploads run at once; a failed one goes back with exponential
//! backoff and jitter, without limit while the process runs, and without holding up the
//! others. Files are streamed: gzip is applied part by part, so a 64 MiB segment never sits
//! whole in memory, and anything above one part goes up as a multipart upload.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flate2::write::GzEncoder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rand::Rng;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use xxhash_rust::xxh3::Xxh3;

use crate::contract::ClusterLayout;
use crate::events::spool::{FileKind, SealedFile, SpoolStats};
use crate::metrics as m;

/// Compression applied to event and quarantine objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// gzip, objects named `*.jsonl.gz` (the history server gunzips `.gz`).
    Gzip,
    /// Plain JSON lines.
    None,
}

/// Settings of the uploader.
#[derive(Debug, Clone)]
pub struct UploaderConfig {
    /// Uploads in flight at once.
    pub concurrency: usize,
    /// Compression of event objects.
    pub compression: Compression,
    /// Size of one multipart part (and the largest single PUT), in bytes of the object.
    pub part_size: usize,
    /// The bucket layout keys are built from.
    pub layout: ClusterLayout,
}

/// Why one upload attempt failed.
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
    /// The computed key is not a valid object path (should not happen for our own keys).
    #[error("invalid object key {key:?}: {message}")]
    Key {
        /// The key.
        key: String,
        /// Why.
        message: String,
    },
}

enum Control {
    Drain(oneshot::Sender<()>),
}

/// Handle to the upload dispatcher.
#[derive(Clone)]
pub struct Uploader {
    control: mpsc::UnboundedSender<Control>,
}

struct Pending {
    file: SealedFile,
    attempt: u32,
}

fn rank(kind: FileKind) -> u8 {
    match kind {
        FileKind::Marker => 0,
        FileKind::Events => 1,
        FileKind::Quarantine => 2,
    }
}

/// gzip level of uploaded segments: level 3 of zlib-rs compresses Ray's JSON lines about
/// 10x at several times the speed of the default level 6, which matters when the sidecar
/// shares two cores with ingest (the profile showed level 6 taking over half the CPU).
const GZIP_LEVEL: u32 = 3;

/// Heap key: smallest (kind rank, creation time) first.
type QueueKey = Reverse<(u8, u64, u64)>;

impl Uploader {
    /// Starts the dispatcher; it takes sealed files from `files`.
    pub fn start(
        cfg: UploaderConfig,
        store: Arc<dyn ObjectStore>,
        stats: Arc<SpoolStats>,
        files: mpsc::UnboundedReceiver<SealedFile>,
    ) -> Uploader {
        let (control, control_rx) = mpsc::unbounded_channel();
        let d = Dispatcher {
            cfg: Arc::new(cfg),
            store,
            stats,
        };
        tokio::spawn(d.run(files, control_rx));
        Uploader { control }
    }

    /// Resolves once every file handed over so far is uploaded.
    pub async fn drain(&self) {
        let (tx, rx) = oneshot::channel();
        if self.control.send(Control::Drain(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

struct Dispatcher {
    cfg: Arc<UploaderConfig>,
    store: Arc<dyn ObjectStore>,
    stats: Arc<SpoolStats>,
}

fn backoff(attempt: u32) -> Duration {
    let base = Duration::from_millis(200).saturating_mul(1u32 << attempt.min(8));
    let capped = base.min(Duration::from_secs(30));
    // Full jitter between half and all of the step, so many nodes do not retry in lockstep.
    let f = rand::rng().random_range(0.5..=1.0);
    capped.mul_f64(f)
}

impl Dispatcher {
    async fn run(
        self,
        mut files: mpsc::UnboundedReceiver<SealedFile>,
        mut control: mpsc::UnboundedReceiver<Control>,
    ) {
        let mut seq = 0u64;
        let mut queue: BinaryHeap<(QueueKey, u64)> = BinaryHeap::new();
        let mut slots: Vec<Option<Pending>> = Vec::new();
        let mut delayed: Vec<(Instant, Pending)> = Vec::new();
        let mut inflight: JoinSet<(Pending, Result<u64, UploadError>, Duration)> = JoinSet::new();
        let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
        let mut files_open = true;
        let mut control_open = true;

        let mut enqueue = |queue: &mut BinaryHeap<(QueueKey, u64)>,
                           slots: &mut Vec<Option<Pending>>,
                           p: Pending| {
            seq += 1;
            let key = Reverse((rank(p.file.kind), p.file.created_unix_nanos, seq));
            let idx = match slots.iter().position(Option::is_none) {
                Some(i) => {
                    slots[i] = Some(p);
                    i
                }
                None => {
                    slots.push(Some(p));
                    slots.len() - 1
                }
            };
            queue.push((key, idx as u64));
        };

        loop {
            while inflight.len() < self.cfg.concurrency.max(1) {
                let Some((_, idx)) = queue.pop() else { break };
                let Some(p) = slots.get_mut(idx as usize).and_then(Option::take) else {
                    continue;
                };
                let cfg = self.cfg.clone();
                let store = self.store.clone();
                inflight.spawn(async move {
                    let started = Instant::now();
                    let r = upload_file(&cfg, &store, &p.file).await;
                    (p, r, started.elapsed())
                });
            }
            if queue.is_empty() && delayed.is_empty() && inflight.is_empty() {
                for w in waiters.drain(..) {
                    let _ = w.send(());
                }
                if !files_open && !control_open {
                    return;
                }
            }
            let next_due = delayed.iter().map(|(t, _)| *t).min();
            tokio::select! {
                f = files.recv(), if files_open => match f {
                    Some(file) => enqueue(&mut queue, &mut slots, Pending { file, attempt: 0 }),
                    None => files_open = false,
                },
                c = control.recv(), if control_open => match c {
                    Some(Control::Drain(w)) => {
                        // Everything sealed before the drain request is already in the channel.
                        while let Ok(file) = files.try_recv() {
                            enqueue(&mut queue, &mut slots, Pending { file, attempt: 0 });
                        }
                        waiters.push(w);
                    }
                    None => control_open = false,
                },
                Some(joined) = inflight.join_next(), if !inflight.is_empty() => {
                    let Ok((p, result, took)) = joined else {
                        tracing::error!("an upload task panicked");
                        continue;
                    };
                    let kind = kind_label(p.file.kind);
                    match result {
                        Ok(uploaded) => {
                            m::upload_success(kind, uploaded, took);
                            if !p.file.path.as_os_str().is_empty() {
                                if let Err(e) = std::fs::remove_file(&p.file.path) {
                                    if e.kind() != io::ErrorKind::NotFound {
                                        tracing::error!(path = %p.file.path.display(), error = %e, "uploaded but could not delete the local file");
                                    }
                                }
                            }
                            self.stats.file_done(&p.file);
                            tracing::debug!(path = %p.file.path.display(), bytes = uploaded, "uploaded");
                            // The store answers again: what waits in backoff goes now, so a
                            // drain after an outage does not lag it by a whole backoff step.
                            for (_, waiting) in delayed.drain(..) {
                                enqueue(&mut queue, &mut slots, waiting);
                            }
                        }
                        Err(UploadError::Read { path, source }) if source.kind() == io::ErrorKind::NotFound => {
                            tracing::error!(path = %path.display(), "spool file vanished before upload; someone else removed it");
                            self.stats.file_done(&p.file);
                        }
                        Err(e) => {
                            m::upload_failure(kind);
                            let delay = backoff(p.attempt);
                            if p.attempt == 0 || p.attempt % 10 == 9 {
                                tracing::warn!(error = %e, attempt = p.attempt + 1, retry_in_ms = delay.as_millis() as u64, "upload failed; will retry");
                            }
                            delayed.push((Instant::now() + delay, Pending { file: p.file, attempt: p.attempt + 1 }));
                        }
                    }
                },
                _ = tokio::time::sleep_until(next_due.unwrap_or_else(Instant::now).into()), if next_due.is_some() => {
                    let now = Instant::now();
                    let (due, later): (Vec<_>, Vec<_>) = delayed.drain(..).partition(|(t, _)| *t <= now);
                    delayed = later;
                    for (_, p) in due {
                        enqueue(&mut queue, &mut slots, p);
                    }
                },
            }
        }
    }
}

fn kind_label(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Marker => "session_marker",
        FileKind::Events => "events",
        FileKind::Quarantine => "quarantine",
    }
}

/// The object key of a sealed file.
pub fn object_key(cfg: &UploaderConfig, f: &SealedFile) -> String {
    let gz = if f.compressible && cfg.compression == Compression::Gzip {
        ".gz"
    } else {
        ""
    };
    match f.kind {
        FileKind::Marker => cfg.layout.session_marker_key(&f.relative_key),
        FileKind::Events => format!("{}/{}{}", cfg.layout.history_prefix(), f.relative_key, gz),
        FileKind::Quarantine => format!(
            "{}/{}{}",
            cfg.layout.quarantine_prefix(),
            f.relative_key,
            gz
        ),
    }
}

/// Uploads one file; returns the bytes sent.
async fn upload_file(
    cfg: &UploaderConfig,
    store: &Arc<dyn ObjectStore>,
    f: &SealedFile,
) -> Result<u64, UploadError> {
    let key = object_key(cfg, f);
    let path = ObjectPath::parse(&key).map_err(|e| UploadError::Key {
        key: key.clone(),
        message: e.to_string(),
    })?;
    m::upload_attempt(kind_label(f.kind));
    let store_err = |source| UploadError::Store {
        key: key.clone(),
        source,
    };
    if f.kind == FileKind::Marker {
        store
            .put(&path, PutPayload::new())
            .await
            .map_err(store_err)?;
        return Ok(0);
    }
    let gzip = f.compressible && cfg.compression == Compression::Gzip;
    let reader = PartReader::open(&f.path, gzip)?;
    let (sent, _) = put_parts(store, &path, &key, reader, cfg.part_size).await?;
    Ok(sent)
}

/// What a log snapshot upload sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotUpload {
    /// Bytes of the file uploaded (the object's size).
    pub bytes: u64,
    /// xxh3 of those bytes, for the change ledger.
    pub hash: u64,
}

/// Uploads the first `limit` bytes of a file that may still be growing, as is (no
/// compression: the history server serves logs byte for byte), streaming in parts.
pub async fn put_file_prefix(
    store: &Arc<dyn ObjectStore>,
    key: &str,
    path: &std::path::Path,
    limit: u64,
    part_size: usize,
) -> Result<SnapshotUpload, UploadError> {
    let location = ObjectPath::parse(key).map_err(|e| UploadError::Key {
        key: key.to_string(),
        message: e.to_string(),
    })?;
    let reader = PartReader::open_prefix(path, false, limit, true)?;
    let (bytes, hash) = put_parts(store, &location, key, reader, part_size).await?;
    Ok(SnapshotUpload {
        bytes,
        hash: hash.unwrap_or(0),
    })
}

/// xxh3 of the first `limit` bytes of a file, read in chunks.
pub fn hash_file_prefix(path: &std::path::Path, limit: u64) -> std::io::Result<(u64, u64)> {
    let mut f = File::open(path)?.take(limit);
    let mut h = Xxh3::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut n_total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok((h.digest(), n_total));
        }
        n_total += n as u64;
        h.update(&buf[..n]);
    }
}

/// Sends what `reader` yields as one PUT, or as a multipart upload when it is more than
/// one part; returns the bytes sent and the hash of the input if the reader computed one.
async fn put_parts(
    store: &Arc<dyn ObjectStore>,
    path: &ObjectPath,
    key: &str,
    mut reader: PartReader,
    part_size: usize,
) -> Result<(u64, Option<u64>), UploadError> {
    let store_err = |source| UploadError::Store {
        key: key.to_string(),
        source,
    };
    let (first, r) = read_part(reader, part_size).await?;
    reader = r;
    if reader.done {
        let n = first.len() as u64;
        store
            .put(path, PutPayload::from(first))
            .await
            .map_err(store_err)?;
        return Ok((n, reader.hasher.as_ref().map(|h| h.digest())));
    }
    let mut upload = store.put_multipart(path).await.map_err(store_err)?;
    let mut sent = 0u64;
    let mut part = first;
    let result: Result<Option<u64>, UploadError> = async {
        loop {
            sent += part.len() as u64;
            upload
                .put_part(PutPayload::from(part))
                .await
                .map_err(store_err)?;
            if reader.done {
                break;
            }
            let (next, r) = read_part(reader, part_size).await?;
            reader = r;
            if next.is_empty() {
                break;
            }
            part = next;
        }
        upload.complete().await.map_err(store_err)?;
        Ok(reader.hasher.as_ref().map(|h| h.digest()))
    }
    .await;
    match result {
        Ok(hash) => Ok((sent, hash)),
        Err(e) => {
            let _ = upload.abort().await;
            Err(e)
        }
    }
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
    encoder: Option<GzEncoder<Vec<u8>>>,
    hasher: Option<Xxh3>,
    done: bool,
}

impl PartReader {
    fn open(path: &std::path::Path, gzip: bool) -> Result<PartReader, UploadError> {
        Self::open_prefix(path, gzip, u64::MAX, false)
    }

    /// Reads at most `limit` bytes (a snapshot of a file that is still growing), optionally
    /// hashing what it reads.
    fn open_prefix(
        path: &std::path::Path,
        gzip: bool,
        limit: u64,
        hash: bool,
    ) -> Result<PartReader, UploadError> {
        let file = File::open(path).map_err(|source| UploadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(PartReader {
            path: path.to_path_buf(),
            file: file.take(limit),
            encoder: gzip.then(|| GzEncoder::new(Vec::new(), flate2::Compression::new(GZIP_LEVEL))),
            hasher: hash.then(Xxh3::new),
            done: false,
        })
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
                    if let Some(h) = &mut self.hasher {
                        h.update(&buf[..n]);
                    }
                    out.extend_from_slice(&buf[..n]);
                }
                if !self.done {
                    // Peek whether anything is left, so a file of exactly `size` is one PUT.
                    let mut one = [0u8; 1];
                    let n = self.file.read(&mut one).map_err(err)?;
                    if n == 0 {
                        self.done = true;
                    } else {
                        if let Some(h) = &mut self.hasher {
                            h.update(&one);
                        }
                        out.push(one[0]);
                    }
                }
                Ok(out)
            }
            Some(enc) => loop {
                if enc.get_ref().len() >= size {
                    return Ok(std::mem::take(enc.get_mut()));
                }
                let n = self.file.read(&mut buf).map_err(err)?;
                if n == 0 {
                    enc.try_finish().map_err(err)?;
                    self.done = true;
                    return Ok(std::mem::take(enc.get_mut()));
                }
                enc.write_all(&buf[..n]).map_err(err)?;
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Owner;

    fn cfg(compression: Compression) -> UploaderConfig {
        UploaderConfig {
            concurrency: 2,
            compression,
            part_size: 1024,
            layout: ClusterLayout {
                root: "r".into(),
                namespace: "ns".into(),
                cluster: "c".into(),
                owner: Owner::RayCluster,
            },
        }
    }

    #[test]
    fn keys_by_kind() {
        let f = SealedFile {
            path: "/x".into(),
            kind: FileKind::Events,
            relative_key: "s/n/node_events/n-2026-11-22-02-1.jsonl".into(),
            created_unix_nanos: 1,
            bytes: 1,
            compressible: true,
        };
        assert_eq!(
            object_key(&cfg(Compression::Gzip), &f),
            "r/cluster-history/raycluster/ns/c/s/n/node_events/n-2026-11-22-02-1.jsonl.gz"
        );
        assert_eq!(
            object_key(&cfg(Compression::None), &f),
            "r/cluster-history/raycluster/ns/c/s/n/node_events/n-2026-11-22-02-1.jsonl"
        );
        let m = SealedFile {
            kind: FileKind::Marker,
            relative_key: "s".into(),
            ..f.clone()
        };
        assert_eq!(
            object_key(&cfg(Compression::Gzip), &m),
            "r/cluster-metadata/raycluster/ns_c/s"
        );
        let q = SealedFile {
            kind: FileKind::Quarantine,
            relative_key: "n/bodies/body-1.bin".into(),
            compressible: false,
            ..f
        };
        assert_eq!(
            object_key(&cfg(Compression::Gzip), &q),
            "r/collector-quarantine/raycluster/ns/c/n/bodies/body-1.bin"
        );
    }

    #[test]
    fn parts_cover_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..100_000u32)
            .flat_map(|i| format!("{{\"i\":{i}}}\n").into_bytes())
            .collect();
        std::fs::write(&p, &data).unwrap();
        let mut r = PartReader::open(&p, false).unwrap();
        let mut out = Vec::new();
        while !r.done {
            out.extend(r.next_part(4096).unwrap());
        }
        assert_eq!(out, data);
        let mut r = PartReader::open(&p, true).unwrap();
        let mut gz = Vec::new();
        let mut parts = 0;
        while !r.done {
            gz.extend(r.next_part(4096).unwrap());
            parts += 1;
        }
        assert!(parts > 1);
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(plain, data);
        // Exactly one part's worth: a single PUT.
        std::fs::write(&p, vec![b'x'; 4096]).unwrap();
        let mut r = PartReader::open(&p, false).unwrap();
        assert_eq!(r.next_part(4096).unwrap().len(), 4096);
        assert!(r.done);
    }
}
