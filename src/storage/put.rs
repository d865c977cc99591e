//! Streamed uploads of local files: a file is read part by part (gzip-compressed on the way
//! if asked), so a 64 MiB segment or a 10 GB log never sits whole in memory, and anything
//! above one part goes up as a multipart upload that is aborted if a part fails.
//!
//! Used by the event uploader (sealed spool segments) and the log shipper (snapshots of
//! files that may still be growing: only the prefix seen at the start is sent, and hashed).

use std::fs::File;
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use xxhash_rust::xxh3::Xxh3;

use super::gzip::MemberEncoder;

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
    /// The computed key is not a valid object path (should not happen for our own keys).
    #[error("invalid object key {key:?}: {message}")]
    Key {
        /// The key.
        key: String,
        /// Why.
        message: String,
    },
}

/// Uploads a whole file as `path`, gzip-compressed if `gzip`; returns the bytes sent.
pub async fn put_file(
    store: &Arc<dyn ObjectStore>,
    path: &ObjectPath,
    key: &str,
    file: &std::path::Path,
    gzip: bool,
    part_size: usize,
) -> Result<u64, UploadError> {
    let reader = PartReader::open(file, gzip)?;
    let (sent, _) = put_parts(store, path, key, reader, part_size).await?;
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
    encoder: Option<Box<MemberEncoder>>,
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
            encoder: gzip.then(|| Box::new(MemberEncoder::new())),
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
            Some(enc) => {
                let mut out = Vec::with_capacity(size.min(8 << 20));
                while out.len() < size {
                    let hasher = &mut self.hasher;
                    let more = enc
                        .next_member(&mut self.file, &mut out, |b| {
                            if let Some(h) = hasher {
                                h.update(b);
                            }
                        })
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
        // One gzip member per block of input, read back whole as one gzip file.
        let mut plain = Vec::new();
        flate2::read::MultiGzDecoder::new(&gz[..])
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
