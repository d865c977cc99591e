//! `--dashboard-dir DIR`: Ray's own built dashboard frontend (the `ray` wheel ships it under
//! `ray/dashboard/client/build`), served from `DIR` beside the API routes, so a person opens a
//! dead session in the dashboard they know.
//!
//! # What it guarantees
//!
//! - **A dashboard or a clear error at start.** `DIR` must hold `index.html` as a regular
//!   file ([`Frontend::open`]); a wrong directory stops the server before it listens.
//! - **Confined to `DIR`.** A request path is percent-decoded and split into segments; a
//!   segment that is empty, `.`/`..`, hidden (starts with `.`), or holds `\` or a control
//!   character is refused, and the file found is canonicalised and must still be under the
//!   canonical `DIR` (a symlink that leads out is refused). Only regular files are served, at
//!   most [`MAX_FILE_BYTES`] each, streamed in chunks of [`CHUNK_BYTES`] (an answer holds
//!   one chunk, not the file); a directory is never listed.
//! - **Correct types, sane caching.** The content type follows the extension
//!   ([`content_type`]) with `X-Content-Type-Options: nosniff`. Files under `static/` carry a
//!   content hash in their names (Create React App's build), so they are cached for a year as
//!   `immutable`; everything else (`index.html`, the favicon, ...) is `no-cache`, so a new
//!   build is picked up at once.
//! - **The SPA's routes.** A browser's navigation (`Accept: text/html`) to a path that names
//!   no file, does not start with `/api/` and whose last segment has no `.` is answered with
//!   `index.html` (the client routes it). Anything else that names no file is left to the
//!   caller's `404` ([`Frontend::answer`] is `None`): the frontend's own API calls (`Accept:
//!   application/json`) to a route we do not serve must fail as such, never get a page.
//!   Only `GET` and `HEAD`.

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::header::{ALLOW, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

/// The largest file served: Ray 2.60's build holds at most 6.6 MB (a source map); ten times
/// that leaves room for later builds. Anything larger in `DIR` is not a dashboard file.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// A file is sent in chunks of this size, read as the client takes them: an answer holds one
/// chunk in memory, whatever the file's size and the number of clients.
const CHUNK_BYTES: u64 = 64 * 1024;

/// Segments a path may have: the build nests three deep.
const MAX_SEGMENTS: usize = 32;

/// The entry page of the build.
const INDEX: &str = "index.html";

/// Files whose names carry their content's hash (the build's `static/`).
const IMMUTABLE_DIR: &str = "static";

const CACHE_IMMUTABLE: &str = "public, max-age=31536000, immutable";
const CACHE_REVALIDATE: &str = "no-cache";

/// Why `--dashboard-dir` cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("--dashboard-dir {dir}: {source}")]
    Unreadable { dir: String, source: std::io::Error },
    #[error(
        "--dashboard-dir {dir} has no index.html: give Ray's built dashboard, the directory \
         ray/dashboard/client/build of the ray wheel"
    )]
    NoIndex { dir: String },
}

/// The frontend's directory, checked.
#[derive(Debug)]
pub struct Frontend {
    /// Canonical.
    root: PathBuf,
}

/// What a request path asks for.
enum Wanted {
    File(PathBuf),
    /// Not a path we serve (traversal, hidden, control characters, ...).
    Refused,
}

impl Frontend {
    /// `dir`, which must hold `index.html`.
    pub fn open(dir: &Path) -> Result<Frontend, FrontendError> {
        let shown = crate::util::escape::escape_untrusted(&dir.display().to_string());
        let root = std::fs::canonicalize(dir).map_err(|source| FrontendError::Unreadable {
            dir: shown.clone(),
            source,
        })?;
        match std::fs::metadata(root.join(INDEX)) {
            Ok(m) if m.is_file() => Ok(Frontend { root }),
            _ => Err(FrontendError::NoIndex { dir: shown }),
        }
    }

    /// The file `path` (the request's, still percent-encoded) names under the root.
    fn resolve(&self, path: &str) -> Wanted {
        let Some(decoded) = percent_decode(path) else {
            return Wanted::Refused;
        };
        let mut file = self.root.clone();
        let mut segments = 0;
        for segment in decoded.split('/').filter(|s| !s.is_empty()) {
            segments += 1;
            if segments > MAX_SEGMENTS
                || segment.starts_with('.')
                || segment.contains('\\')
                || segment.chars().any(char::is_control)
            {
                return Wanted::Refused;
            }
            file.push(segment);
        }
        if segments == 0 {
            file.push(INDEX);
        }
        Wanted::File(file)
    }

    /// Opens `file` if it is a regular file under the root: its length, canonical path and
    /// handle; `Ok(None)` when there is none.
    async fn open_file(
        &self,
        file: &Path,
    ) -> std::io::Result<Option<(u64, PathBuf, tokio::fs::File)>> {
        let real = match tokio::fs::canonicalize(file).await {
            Ok(p) => p,
            Err(e) if is_absent(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !real.starts_with(&self.root) {
            return Ok(None);
        }
        // Asked before opening: opening a FIFO would wait for a writer.
        if !tokio::fs::metadata(&real).await?.is_file() {
            return Ok(None);
        }
        let handle = tokio::fs::File::open(&real).await?;
        let meta = handle.metadata().await?;
        if !meta.is_file() {
            return Ok(None);
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(std::io::Error::other(format!(
                "{} bytes, more than the {MAX_FILE_BYTES} served",
                meta.len()
            )));
        }
        Ok(Some((meta.len(), real, handle)))
    }

    /// The answer to `method path` (`navigation`: the request accepts `text/html`), or
    /// `None` when no file answers it.
    pub async fn answer(&self, method: &Method, path: &str, navigation: bool) -> Option<Response> {
        if method != Method::GET && method != Method::HEAD {
            return Some(
                (
                    StatusCode::METHOD_NOT_ALLOWED,
                    [(ALLOW, "GET, HEAD")],
                    "only GET and HEAD",
                )
                    .into_response(),
            );
        }
        let Wanted::File(file) = self.resolve(path) else {
            return None;
        };
        let found = match self.open_file(&file).await {
            Ok(Some(f)) => Some(f),
            Ok(None) => None,
            Err(e) => return Some(unreadable(path, &e)),
        };
        let found = match found {
            Some(f) => f,
            None if navigation && is_client_route(path) => {
                match self.open_file(&self.root.join(INDEX)).await {
                    Ok(Some(f)) => f,
                    Ok(None) => return None,
                    Err(e) => return Some(unreadable(path, &e)),
                }
            }
            None => return None,
        };
        let (length, real, handle) = found;
        let immutable = real
            .strip_prefix(&self.root)
            .is_ok_and(|rel| rel.starts_with(IMMUTABLE_DIR));
        let body = if method == Method::HEAD {
            Body::empty()
        } else {
            Body::from_stream(chunks(handle, length))
        };
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type(&real)));
        headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
        headers.insert(
            CACHE_CONTROL,
            HeaderValue::from_static(if immutable {
                CACHE_IMMUTABLE
            } else {
                CACHE_REVALIDATE
            }),
        );
        headers.insert(
            axum::http::header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        Some(response)
    }
}

/// The first `length` bytes of `file`, a chunk at a time (a file that shrank ends early,
/// and the client sees a short answer rather than other bytes).
fn chunks(
    file: tokio::fs::File,
    length: u64,
) -> impl futures::Stream<Item = std::io::Result<axum::body::Bytes>> {
    use tokio::io::AsyncReadExt as _;
    futures::stream::unfold((file, 0u64), move |(mut file, sent)| async move {
        if sent >= length {
            return None;
        }
        let mut buf = vec![0u8; (length - sent).min(CHUNK_BYTES) as usize];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(buf.into()), (file, sent + n as u64)))
            }
            Err(e) => Some((Err(e), (file, length))),
        }
    })
}

fn is_absent(e: &std::io::Error) -> bool {
    // A name too long for the filesystem names no file either (review r36d: a 300-byte
    // name answered 500 and logged a WARN per request).
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound
            | std::io::ErrorKind::NotADirectory
            | std::io::ErrorKind::InvalidFilename
    ) || e.raw_os_error() == Some(libc::ENAMETOOLONG)
}

fn unreadable(path: &str, e: &std::io::Error) -> Response {
    tracing::warn!(
        "dashboard file {}: {}",
        crate::util::escape::escape_untrusted(path),
        crate::util::escape::escape_message(&e.to_string())
    );
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "the dashboard file could not be read",
    )
        .into_response()
}

/// A path the SPA routes itself: not the API, and no file extension in its last segment.
fn is_client_route(path: &str) -> bool {
    if path == "/api" || path.starts_with("/api/") {
        return false;
    }
    let last = path.rsplit('/').next().unwrap_or("");
    !last.contains('.')
}

/// `%XX` decoded; `None` when an escape is malformed or the result is not UTF-8.
fn percent_decode(path: &str) -> Option<String> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The content type of a file of the build, by its extension.
pub fn content_type(file: &Path) -> &'static str {
    let ext = file
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    match ext.as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "ico" => "image/x-icon",
        "woff" => "font/woff",
        "woff2" => "font/woff2",
        "ttf" => "font/ttf",
        "wasm" => "application/wasm",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_confined_and_typed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.html"), "<html>").unwrap();
        let f = Frontend::open(dir.path()).unwrap();
        for bad in [
            "/../etc/passwd",
            "/%2e%2e/etc/passwd",
            "/a/..%2f..%2fetc",
            "/.git/config",
            "/a%5cb",
            "/a%00b",
            "/%zz",
            "/%ff",
        ] {
            assert!(matches!(f.resolve(bad), Wanted::Refused), "{bad}");
        }
        match f.resolve("/") {
            Wanted::File(p) => assert!(p.ends_with("index.html")),
            Wanted::Refused => panic!("/ refused"),
        }
        assert!(is_client_route("/jobs/01000000"));
        assert!(!is_client_route("/static/js/gone.js"));
        assert!(!is_client_route("/api/v0/whatever"));
        assert_eq!(
            content_type(Path::new("a/main.1.JS")),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(content_type(Path::new("x.woff2")), "font/woff2");
        assert_eq!(content_type(Path::new("noext")), "application/octet-stream");
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            Frontend::open(empty.path()),
            Err(FrontendError::NoIndex { .. })
        ));
    }
}
