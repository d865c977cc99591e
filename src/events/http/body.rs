//! Request bodies: which codings they carry, how much memory reading them may take, and the
//! reading itself.
//!
//! - **Codings.** Every `Content-Encoding` header is read, each a comma-separated list
//!   (RFC 9110 §8.4); `identity` is no coding, `gzip`/`x-gzip` are undone in reverse order (at
//!   most [`MAX_GZIP_LAYERS`]), anything else is refused with 415 before the body is read.
//! - **Memory.** Bodies in flight share a budget ([`BodyBudget`]) of the largest body plus
//!   [`SMALL_BODIES_ROOM`]: a request reserves its declared length (the largest body when the
//!   length is unknown or the body is compressed) before reading, and waits at most
//!   [`BUDGET_WAIT`] for room, else gets 503. So however many clients send large or hostile
//!   bodies at once, the bodies held in memory stay within the budget, while Ray's usual
//!   batches of about 1 MB pass side by side.
//! - **Bounds.** The raw body and every decoded layer are bounded by `--max-body-bytes`, and
//!   the whole read by [`BODY_TIMEOUT`].

use std::io::Read;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, CONTENT_ENCODING, CONTENT_LENGTH};
use hyper::Request;
use tokio::sync::{Semaphore, SemaphorePermit};

/// How long a client may take to send a whole body.
pub(super) const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Most gzip layers undone (`Content-Encoding: gzip, gzip`): more is no client we know.
pub(super) const MAX_GZIP_LAYERS: usize = 2;
/// Room for ordinary bodies beside one body of the largest size.
pub(super) const SMALL_BODIES_ROOM: u64 = 32 << 20;
/// How long a request waits for room in the body budget before it gets 503.
pub(super) const BUDGET_WAIT: Duration = Duration::from_secs(10);

/// Why a request body could not be read.
pub(super) enum BodyProblem {
    TooLarge,
    TimedOut,
    Read(String),
    BadGzip(Bytes, String),
}

/// The gzip layers of a request, from all its `Content-Encoding` headers; the coding that is
/// not supported, or why the headers cannot be used, as the error.
pub(super) fn gzip_layers(headers: &HeaderMap) -> Result<usize, String> {
    let mut layers = 0;
    for value in headers.get_all(CONTENT_ENCODING) {
        let text = value
            .to_str()
            .map_err(|_| "a Content-Encoding header that is not ASCII text".to_string())?;
        for coding in text.split(',') {
            match coding.trim().to_ascii_lowercase().as_str() {
                "" | "identity" => {}
                "gzip" | "x-gzip" => layers += 1,
                other => {
                    return Err(format!(
                        "Content-Encoding {other:?} is not supported (use gzip or identity)"
                    ))
                }
            }
        }
    }
    if layers > MAX_GZIP_LAYERS {
        return Err(format!(
            "{layers} gzip layers in Content-Encoding; at most {MAX_GZIP_LAYERS} are undone"
        ));
    }
    Ok(layers)
}

/// The declared `Content-Length`, if there is exactly one and it is a number.
pub(super) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(CONTENT_LENGTH).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    first.to_str().ok()?.trim().parse().ok()
}

/// The memory budget of bodies in flight, in KiB permits.
pub(super) struct BodyBudget {
    permits: Semaphore,
    max_body_bytes: u64,
}

impl BodyBudget {
    /// Room for one body of `max_body_bytes` plus [`SMALL_BODIES_ROOM`].
    pub(super) fn new(max_body_bytes: u64) -> BodyBudget {
        let total = kib(max_body_bytes + SMALL_BODIES_ROOM);
        BodyBudget {
            permits: Semaphore::new(total as usize),
            max_body_bytes,
        }
    }

    /// Reserves room for a body: its declared length when it is sent as is, else the largest
    /// body (a compressed or chunked body can decode to that much). `None` when no room was
    /// free within [`BUDGET_WAIT`].
    pub(super) async fn reserve(
        &self,
        declared: Option<u64>,
        gzip_layers: usize,
    ) -> Option<SemaphorePermit<'_>> {
        let bytes = match declared {
            Some(n) if gzip_layers == 0 => n.min(self.max_body_bytes),
            _ => self.max_body_bytes,
        };
        let want = kib(bytes).max(1) as u32;
        tokio::time::timeout(BUDGET_WAIT, self.permits.acquire_many(want))
            .await
            .ok()?
            .ok()
    }
}

fn kib(bytes: u64) -> u64 {
    bytes.div_ceil(1024).min(u64::from(u32::MAX))
}

/// Reads the body (at most `max` bytes) and undoes its `gzip_layers`, each decoded layer also
/// at most `max` bytes.
pub(super) async fn read_body(
    req: Request<Incoming>,
    max: u64,
    gzip_layers: usize,
) -> Result<Bytes, BodyProblem> {
    let limited = Limited::new(req.into_body(), max as usize);
    let mut body = match tokio::time::timeout(BODY_TIMEOUT, limited.collect()).await {
        Err(_) => return Err(BodyProblem::TimedOut),
        Ok(Err(e)) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return Err(BodyProblem::TooLarge);
            }
            return Err(BodyProblem::Read(e.to_string()));
        }
        Ok(Ok(c)) => c.to_bytes(),
    };
    for _ in 0..gzip_layers {
        let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(max as usize));
        let mut dec = flate2::read::MultiGzDecoder::new(&body[..]).take(max + 1);
        match dec.read_to_end(&mut out) {
            Ok(_) if out.len() as u64 > max => return Err(BodyProblem::TooLarge),
            Ok(_) => body = Bytes::from(out),
            Err(e) => return Err(BodyProblem::BadGzip(body, e.to_string())),
        }
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(CONTENT_ENCODING, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn every_content_encoding_header_and_list_is_read() {
        assert_eq!(gzip_layers(&headers(&[])), Ok(0));
        assert_eq!(gzip_layers(&headers(&["identity"])), Ok(0));
        assert_eq!(gzip_layers(&headers(&["GZIP"])), Ok(1));
        assert_eq!(gzip_layers(&headers(&["identity, gzip"])), Ok(1));
        assert_eq!(gzip_layers(&headers(&["gzip", "x-gzip"])), Ok(2));
        assert!(gzip_layers(&headers(&["gzip", "br"]))
            .unwrap_err()
            .contains("\"br\""));
        assert!(gzip_layers(&headers(&["identity, deflate"]))
            .unwrap_err()
            .contains("\"deflate\""));
        assert!(gzip_layers(&headers(&["gzip, gzip, gzip"])).is_err());
    }

    #[tokio::test]
    async fn the_budget_holds_one_largest_body_and_room_for_small_ones() {
        let b = BodyBudget::new(64 << 20);
        let big = b
            .reserve(Some(64 << 20), 0)
            .await
            .expect("room for one big body");
        // Ordinary batches still pass beside it.
        let small: Vec<_> =
            futures::future::join_all((0..20).map(|_| b.reserve(Some(1 << 20), 0))).await;
        assert!(small.iter().all(Option::is_some));
        drop(small);
        // A second big (or compressed, whose size is unknown) body waits for the first.
        tokio::time::pause();
        assert!(b.reserve(None, 1).await.is_none());
        drop(big);
        assert!(b.reserve(None, 1).await.is_some());
    }
}
