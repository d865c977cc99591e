//! Appending the new bytes of a growing log to its object, where the store can do that, so a
//! live log costs what Ray wrote and not its whole size every round.
//!
//! Before anything is appended, the object must still be the one we wrote: its ETag (and
//! size) as the ledger recorded them; otherwise the caller uploads the file whole. What is
//! appended is the file's bytes `[from, to)`, read as they are now; the caller has checked
//! the file only grew (same inode, same bytes before `from`).
//!
//! - `file://`: the object is a file under the bucket directory; the bytes are appended to
//!   it in place. If that fails halfway the object is longer than the ledger says, which the
//!   next round sees (its ETag changed) and repairs with a whole upload.
//! - S3 and S3-compatible stores: a multipart upload to the same key whose first part is a
//!   server-side copy of the current object (`UploadPartCopy`, conditional on its ETag) and
//!   whose next parts are the new bytes; only those cross the network. Nothing else is
//!   written: the parts are invisible until the upload completes, when the object is
//!   replaced at once, so a reader (the history server) sees the old or the new object,
//!   never a tail, and an append that fails leaves the old object whole (the upload is
//!   aborted, or expires with the bucket's lifecycle rule for incomplete uploads if the
//!   collector was killed). A copied part must be at least 5 MiB (S3's minimum for every part
//!   but the last), so smaller objects are uploaded whole. object_store has no call for
//!   these requests; they are signed with its own SigV4 signer and credentials (the same
//!   chain as every other request) and sent with reqwest, which it already uses: no new
//!   dependency.
//! - GCS and Azure: no appends (uploaded whole on the schedule). GCS's compose needs the tail
//!   as an object of its own first, and Azure's block lists need block blobs written by
//!   block id, which object_store's uploads do not leave.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, AwsAuthorizer};
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt};

use super::put::parse_key;
use crate::util::pace::Pacer;

/// Why an append did not happen.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The object is not what the ledger says (missing, changed by someone else, or left
    /// longer by an append that failed halfway): upload the file whole.
    #[error("{key}: {why}")]
    Changed {
        /// The key.
        key: String,
        /// What differed.
        why: String,
    },
    /// Reading the local file failed.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The store refused or failed.
    #[error("appending to {key}: {message}")]
    Store {
        /// The key.
        key: String,
        /// Why.
        message: String,
    },
}

/// What an append did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// Bytes of the file appended (read and sent).
    pub bytes: u64,
    /// The object's ETag after it.
    pub e_tag: Option<String>,
}

/// A store that can append to an object.
#[derive(Debug, Clone)]
pub enum Appender {
    /// A local bucket directory.
    Local(Arc<LocalFileSystem>),
    /// S3 or an S3-compatible server.
    S3(Arc<S3Appender>),
}

/// S3's smallest part but the last: an object must have this much to be copied as a part.
pub const S3_MIN_PART: u64 = 5 << 20;

/// The new bytes go up in parts of this size (one in memory at a time).
const TAIL_PART: usize = 8 << 20;

impl Appender {
    /// An appender for the local bucket directory `dir`.
    pub fn local(dir: &Path) -> Result<Appender, object_store::Error> {
        Ok(Appender::Local(Arc::new(LocalFileSystem::new_with_prefix(
            dir,
        )?)))
    }

    /// The smallest object this store can append to (below it, upload whole).
    pub fn min_object_bytes(&self) -> u64 {
        match self {
            Appender::Local(_) => 0,
            Appender::S3(_) => S3_MIN_PART,
        }
    }

    /// Appends the bytes `[from, to)` of `file` to the object `key`, which must have `from`
    /// bytes and the ETag `e_tag`.
    pub async fn append(
        &self,
        key: &str,
        file: &Path,
        from: u64,
        to: u64,
        e_tag: Option<&str>,
        pace: Option<&Pacer>,
    ) -> Result<Appended, AppendError> {
        match self {
            Appender::Local(fs) => append_local(fs, key, file, from, to, e_tag, pace).await,
            Appender::S3(s3) => s3.append(key, file, from, to, e_tag, pace).await,
        }
    }
}

async fn append_local(
    fs: &Arc<LocalFileSystem>,
    key: &str,
    file: &Path,
    from: u64,
    to: u64,
    e_tag: Option<&str>,
    pace: Option<&Pacer>,
) -> Result<Appended, AppendError> {
    let location = parse_key(key).map_err(|e| store_err(key, &e))?;
    check_object(fs.as_ref(), key, &location, from, e_tag).await?;
    let target = fs
        .path_to_filesystem(&location)
        .map_err(|e| store_err(key, &e))?;
    if let Some(p) = pace {
        p.take(to - from).await;
    }
    let source = file.to_path_buf();
    let key_owned = key.to_string();
    let written =
        tokio::task::spawn_blocking(move || copy_range(&source, &target, from, to, &key_owned))
            .await
            .map_err(|e| store_err(key, &e))??;
    let after = fs.head(&location).await.map_err(|e| store_err(key, &e))?;
    Ok(Appended {
        bytes: written,
        e_tag: after.e_tag,
    })
}

/// The object must exist with `size` bytes and, when known, the ETag `e_tag`.
async fn check_object(
    store: &dyn ObjectStore,
    key: &str,
    location: &object_store::path::Path,
    size: u64,
    e_tag: Option<&str>,
) -> Result<(), AppendError> {
    let changed = |why: String| AppendError::Changed {
        key: key.to_string(),
        why,
    };
    let meta = match store.head(location).await {
        Ok(m) => m,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(changed("the object is gone".into()))
        }
        Err(e) => return Err(store_err(key, &e)),
    };
    if meta.size != size {
        return Err(changed(format!(
            "the object has {} bytes, the ledger says {size}",
            meta.size
        )));
    }
    if let Some(want) = e_tag {
        if meta.e_tag.as_deref() != Some(want) {
            return Err(changed(format!(
                "the object's ETag is {:?}, the ledger says {want:?}",
                meta.e_tag
            )));
        }
    }
    Ok(())
}

/// Appends `source[from..to)` to `target`, which must have exactly `from` bytes.
fn copy_range(
    source: &Path,
    target: &Path,
    from: u64,
    to: u64,
    key: &str,
) -> Result<u64, AppendError> {
    let read_err = |e| read_err(source, e);
    let store_err = |e: io::Error| store_err(key, &e);
    let mut src = std::fs::File::open(source).map_err(read_err)?;
    src.seek(SeekFrom::Start(from)).map_err(read_err)?;
    let mut out = std::fs::OpenOptions::new()
        .append(true)
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
    loop {
        let n = src.read(&mut buf).map_err(read_err)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).map_err(store_err)?;
        written += n as u64;
    }
    if written != to - from {
        return Err(read_err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "the file shrank to {} bytes during the append",
                from + written
            ),
        )));
    }
    Ok(written)
}

/// Appends to S3 objects with requests object_store does not make (see the module doc).
#[derive(Debug)]
pub struct S3Appender {
    s3: Arc<AmazonS3>,
    /// `https://host/bucket` (path style) or `https://bucket.host` (virtual hosted).
    bucket_url: String,
    bucket: String,
    region: String,
    part_size: usize,
    http: reqwest::Client,
}

impl S3Appender {
    /// The appender for the store `builder` builds (read before it is built), as `s3`.
    pub fn new(builder: &AmazonS3Builder, s3: Arc<AmazonS3>) -> Result<S3Appender, String> {
        let get = |k| builder.get_config_value(&k).filter(|v| !v.is_empty());
        let bucket = get(AmazonS3ConfigKey::Bucket).ok_or("no bucket name")?;
        let region = get(AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".into());
        let virtual_hosted = get(AmazonS3ConfigKey::VirtualHostedStyleRequest)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let endpoint = get(AmazonS3ConfigKey::Endpoint);
        let bucket_url = match (endpoint, virtual_hosted) {
            (Some(e), true) => e.trim_end_matches('/').to_string(),
            (Some(e), false) => format!("{}/{bucket}", e.trim_end_matches('/')),
            (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
            (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
        };
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .timeout(std::time::Duration::from_secs(120))
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        Ok(S3Appender {
            s3,
            bucket_url,
            bucket,
            region,
            part_size: TAIL_PART,
            http,
        })
    }

    async fn append(
        &self,
        key: &str,
        file: &Path,
        from: u64,
        to: u64,
        e_tag: Option<&str>,
        pace: Option<&Pacer>,
    ) -> Result<Appended, AppendError> {
        let location = parse_key(key).map_err(|e| store_err(key, &e))?;
        if from < S3_MIN_PART {
            return Err(AppendError::Changed {
                key: key.into(),
                why: format!("{from} bytes are too few to copy as a part"),
            });
        }
        let Some(e_tag) = e_tag else {
            return Err(AppendError::Changed {
                key: key.into(),
                why: "no ETag recorded".into(),
            });
        };
        check_object(self.s3.as_ref(), key, &location, from, Some(e_tag)).await?;
        let url = format!("{}/{}", self.bucket_url, encode_path(key));
        let created = self
            .send(
                reqwest::Method::POST,
                &format!("{url}?uploads"),
                &[],
                Vec::new(),
            )
            .await
            .map_err(|e| store_err(key, &e))?;
        let body = created.text().await.map_err(|e| store_err(key, &e))?;
        let upload_id = xml_value(&body, "UploadId")
            .ok_or_else(|| store_err(key, &format!("no UploadId in {body:?}")))?;
        let upload_q = encode_query(&upload_id);
        let result = self
            .parts(key, &url, &upload_q, file, from, to, e_tag, pace)
            .await;
        match result {
            Ok(bytes) => {
                let after = self
                    .s3
                    .head(&location)
                    .await
                    .map_err(|e| store_err(key, &e))?;
                Ok(Appended {
                    bytes,
                    e_tag: after.e_tag,
                })
            }
            Err(e) => {
                let abort = format!("{url}?uploadId={upload_q}");
                if let Err(a) = self
                    .send(reqwest::Method::DELETE, &abort, &[], Vec::new())
                    .await
                {
                    tracing::debug!(%key, error = %a, "aborting the append's upload failed");
                }
                Err(e)
            }
        }
    }

    /// The copied part, the new bytes, the completion; the bytes of the file sent.
    #[allow(clippy::too_many_arguments)]
    async fn parts(
        &self,
        key: &str,
        url: &str,
        upload_q: &str,
        file: &Path,
        from: u64,
        to: u64,
        e_tag: &str,
        pace: Option<&Pacer>,
    ) -> Result<u64, AppendError> {
        let source = format!("/{}/{}", self.bucket, encode_path(key));
        let copy = self
            .send(
                reqwest::Method::PUT,
                &format!("{url}?partNumber=1&uploadId={upload_q}"),
                &[
                    ("x-amz-copy-source", source.as_str()),
                    ("x-amz-copy-source-if-match", e_tag),
                ],
                Vec::new(),
            )
            .await;
        let copy = match copy {
            Ok(r) => r,
            Err(SendError::Status(412, body)) => {
                return Err(AppendError::Changed {
                    key: key.into(),
                    why: format!("the object changed before it was copied: {body}"),
                })
            }
            Err(e) => return Err(store_err(key, &e)),
        };
        let body = copy.text().await.map_err(|e| store_err(key, &e))?;
        let copied = xml_value(&body, "ETag")
            .ok_or_else(|| store_err(key, &format!("no ETag in {body:?}")))?;
        let mut etags = vec![copied];
        let mut offset = from;
        let mut src = std::fs::File::open(file).map_err(|e| read_err(file, e))?;
        src.seek(SeekFrom::Start(from))
            .map_err(|e| read_err(file, e))?;
        while offset < to {
            let n = (to - offset).min(self.part_size as u64);
            let (part, back) = read_exact_blocking(src, n, file).await?;
            src = back;
            if let Some(p) = pace {
                p.take(n).await;
            }
            let number = etags.len() + 1;
            let put = self
                .send(
                    reqwest::Method::PUT,
                    &format!("{url}?partNumber={number}&uploadId={upload_q}"),
                    &[],
                    part,
                )
                .await
                .map_err(|e| store_err(key, &e))?;
            let etag = put
                .headers()
                .get("etag")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                .ok_or_else(|| store_err(key, &"a part's answer has no ETag"))?;
            etags.push(etag);
            offset += n;
        }
        let mut xml = String::from("<CompleteMultipartUpload>");
        for (i, etag) in etags.iter().enumerate() {
            xml.push_str(&format!(
                "<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>",
                i + 1,
                xml_escape(etag)
            ));
        }
        xml.push_str("</CompleteMultipartUpload>");
        let done = self
            .send(
                reqwest::Method::POST,
                &format!("{url}?uploadId={upload_q}"),
                &[],
                xml.into_bytes(),
            )
            .await
            .map_err(|e| store_err(key, &e))?;
        // S3 may answer 200 and put the error in the body.
        let body = done.text().await.map_err(|e| store_err(key, &e))?;
        if body.contains("<Error>") {
            return Err(store_err(key, &format!("completing the upload: {body}")));
        }
        Ok(to - from)
    }

    /// Signs and sends one request; an answer other than 2xx is an error with its body.
    async fn send(
        &self,
        method: reqwest::Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<reqwest::Response, SendError> {
        let credential = self
            .s3
            .credentials()
            .get_credential()
            .await
            .map_err(|e| SendError::Other(format!("credentials: {e}")))?;
        let mut req = http::Request::builder().method(method.clone()).uri(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut req = req
            .body(object_store::client::HttpRequestBody::from(body.clone()))
            .map_err(|e| SendError::Other(format!("request {url}: {e}")))?;
        AwsAuthorizer::new(&credential, "s3", &self.region)
            .try_authorize(&mut req, None)
            .map_err(|e| SendError::Other(format!("signing {url}: {e}")))?;
        let mut out = self.http.request(method, url).body(body);
        for (k, v) in req.headers() {
            out = out.header(k.as_str(), v.as_bytes());
        }
        let resp = out
            .send()
            .await
            .map_err(|e| SendError::Other(format!("{url}: {e}")))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let text = resp.text().await.unwrap_or_default();
        Err(SendError::Status(status.as_u16(), text))
    }
}

/// Why one request of an append failed.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error("answered {0}: {1}")]
    Status(u16, String),
    #[error("{0}")]
    Other(String),
}

fn store_err(key: &str, e: &dyn std::fmt::Display) -> AppendError {
    AppendError::Store {
        key: key.to_string(),
        message: e.to_string(),
    }
}

fn read_err(path: &Path, source: io::Error) -> AppendError {
    AppendError::Read {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads exactly `n` bytes from `src` on the blocking pool; the file back with them.
async fn read_exact_blocking(
    src: std::fs::File,
    n: u64,
    path: &Path,
) -> Result<(Vec<u8>, std::fs::File), AppendError> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut buf = Vec::with_capacity(n as usize);
        let mut src = src;
        (&mut src)
            .take(n)
            .read_to_end(&mut buf)
            .map_err(|e| read_err(&p, e))?;
        if (buf.len() as u64) < n {
            return Err(read_err(
                &p,
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file shrank during the append",
                ),
            ));
        }
        Ok((buf, src))
    })
    .await
    .map_err(|e| read_err(path, io::Error::other(e.to_string())))?
}

/// The text of the first `<tag>…</tag>` in an S3 answer, entities decoded.
fn xml_value(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&close)?;
    Some(
        xml[start..end]
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An object key as a URL path: every byte but S3's unreserved ones and `/` percent-encoded
/// (our own keys need none; a root prefix from the configuration may).
fn encode_path(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An upload id as a query value (S3's ids are URL-safe in practice; encode anyway).
fn encode_query(v: &str) -> String {
    url::form_urlencoded::byte_serialize(v.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_s3_answers() {
        let created = "<?xml version=\"1.0\"?><InitiateMultipartUploadResult><Bucket>b</Bucket>\
            <Key>k</Key><UploadId>a+b/c=</UploadId></InitiateMultipartUploadResult>";
        assert_eq!(xml_value(created, "UploadId").as_deref(), Some("a+b/c="));
        assert_eq!(encode_query("a+b/c="), "a%2Bb%2Fc%3D");
        let copied = "<CopyPartResult><ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag>\
            </CopyPartResult>";
        assert_eq!(
            xml_value(copied, "ETag").as_deref(),
            Some("\"9b2cf535f27731c974343645a3985328\"")
        );
        assert_eq!(xml_escape("\"x\""), "&quot;x&quot;");
        assert_eq!(encode_path("a b/c+d/é"), "a%20b/c%2Bd/%C3%A9");
        assert_eq!(xml_value("<a>1</a>", "b"), None);
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
        let key = "P/s/n/logs/raylet.out";
        let loc = parse_key(key).unwrap();
        let put = fs
            .put(&loc, object_store::PutPayload::from_static(b"line 1\n"))
            .await
            .unwrap();
        let done = app
            .append(key, &file, 7, 14, put.e_tag.as_deref(), None)
            .await
            .unwrap();
        assert_eq!(done.bytes, 7);
        let got = fs.get(&loc).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"line 1\nline 2\n");
        // The old ETag no longer matches: someone (here, we) changed the object.
        let err = app
            .append(key, &file, 14, 14, put.e_tag.as_deref(), None)
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::Changed { .. }), "{err}");
        // A wrong size is refused before anything is written.
        let err = app
            .append(key, &file, 7, 14, done.e_tag.as_deref(), None)
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::Changed { .. }), "{err}");
        let got = fs.get(&loc).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"line 1\nline 2\n");
        // A file shorter than asked: an error, and the ledger is not advanced by the caller.
        let err = app
            .append(key, &file, 14, 20, done.e_tag.as_deref(), None)
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::Read { .. }), "{err}");
        // A missing object.
        let err = app
            .append("P/s/n/logs/none", &file, 0, 1, None, None)
            .await
            .unwrap_err();
        assert!(matches!(err, AppendError::Changed { .. }), "{err}");
    }
}
