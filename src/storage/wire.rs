//! Our own HTTP requests to a store: what S3's, Azure's and GCS's wires (the requests
//! `object_store` has no call for) share, so that each wire keeps only what is its own:
//! its URLs, how a request is signed, and what an error answer means.
//!
//! - **Client**: one built from the options `object_store`'s builder used for the store's
//!   own client ([`CapturingConnector`]), so our requests honour the same proxy, CA,
//!   certificates, timeouts and default headers. It is a client of its own, not the
//!   store's: after an error answer to a request with a body it is replaced
//!   ([`Connection::exchange`]), since the store may have answered before it read the body
//!   and keep the connection without ever reading it (its kernel may have taken a small
//!   body whole); handed back to a pool, that connection would make the next request
//!   written onto it wait for its timeout (review r42r D1: a 403 to one log's completion
//!   held every log 120 s).
//! - **Answers**: read up to [`MAX_ANSWER_BODY`], each piece within the wire's answer
//!   timeout when it has one (a silent store is then an unanswered, transient failure).
//! - **Failures**: [`Failure`] says what a failed request means for appends, [`WireError`]
//!   carries it with the request's name, status and the store's code.
//! - **Retries**: [`retrying`] tries a request again while its failure is transient, with
//!   exponential [`backoff`] and jitter, up to the wire's number of attempts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector,
};

use crate::util::error_chain;

/// Attempts of one request of ours before a transient failure is given up for this round.
pub const RETRY_ATTEMPTS: u32 = 4;
/// First backoff between attempts; doubled each time, up to [`RETRY_MAX_BACKOFF`].
const RETRY_BASE: Duration = Duration::from_millis(200);
/// Longest backoff between attempts: an outage longer than a few seconds is the next round's.
const RETRY_MAX_BACKOFF: Duration = Duration::from_secs(4);
/// Largest answer body read for one of our requests (S3's are the largest): a page of
/// ListMultipartUploads (1,000 uploads of keys up to 1 KiB) is under 2 MiB; a page of
/// ListObjectsV2 with `encoding-type=url` (1,000 keys of up to 1 KiB, each byte at most
/// three once encoded, and a few hundred bytes of metadata each) under 3.5 MiB; the other
/// answers are a few hundred bytes. A server (or proxy) that sends more is not read further.
const MAX_ANSWER_BODY: usize = 4 << 20;

/// Keeps the HTTP client `object_store` builds for a store, so our own requests go through
/// a client of the same options (proxy, CA, certificates, timeouts, default headers).
///
/// A builder connects once per client it needs: credential providers first (with options
/// of their own), the store's client itself last; so the last client is the one.
#[derive(Debug, Clone, Default)]
pub struct CapturingConnector {
    last: Arc<Mutex<Option<(HttpClient, ClientOptions)>>>,
}

impl HttpConnector for CapturingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let client = ReqwestConnector::default().connect(options)?;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        *last = Some((client.clone(), options.clone()));
        Ok(client)
    }
}

impl CapturingConnector {
    pub(crate) fn taken(&self) -> Option<(HttpClient, ClientOptions)> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The HTTP client of one wire: built from the store's options, replaced after an error
/// answer to a request with a body (see the module doc).
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    http: Arc<Mutex<HttpClient>>,
    /// What the client is built from.
    options: ClientOptions,
    /// The store, as log lines name it (`S3`, `Azure`, `GCS`).
    store: &'static str,
}

/// A store's answer to one request, its body read whole (up to [`MAX_ANSWER_BODY`]).
pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Connection {
    /// A client of the options `connector` captured from the store's builder; `store` names
    /// the store in errors and log lines.
    pub(crate) fn new(
        connector: &CapturingConnector,
        store: &'static str,
    ) -> Result<Connection, String> {
        let (_, options) = connector
            .taken()
            .ok_or("object_store built no HTTP client for the store")?;
        let http = ReqwestConnector::default()
            .connect(&options)
            .map_err(|e| format!("building the HTTP client of the {store} appends: {e}"))?;
        Ok(Connection {
            http: Arc::new(Mutex::new(http)),
            options,
            store,
        })
    }

    /// The options the client is built from.
    pub(crate) fn options(&self) -> &ClientOptions {
        &self.options
    }

    /// Sends `req` (signed) and reads its answer, each within `timeout` when there is one
    /// (else as long as the client's own timeouts let it): any status is an answer; a
    /// transport error or an unreadable body is a transient [`WireError`]. After an error
    /// answer to a request with a body, the client is replaced (see the module doc).
    pub(crate) async fn exchange(
        &self,
        req: HttpRequest,
        timeout: Option<Duration>,
        what: &str,
    ) -> Result<Answer, WireError> {
        let has_body = !req.body().is_empty();
        let http = self.http.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let resp = within(timeout, http.execute(req), what)
            .await?
            .map_err(|e| wire_err(Failure::Transient, what, error_chain(&e, ": ")))?;
        let status = resp.status();
        let (parts, body) = resp.into_parts();
        let body = read_bounded(body, timeout, what).await?;
        if !status.is_success() && has_body {
            match ReqwestConnector::default().connect(&self.options) {
                Ok(fresh) => *self.http.lock().unwrap_or_else(|p| p.into_inner()) = fresh,
                Err(e) => {
                    tracing::warn!(error = %e, store = self.store, "could not build a new HTTP client for our own requests; the old one is used again")
                }
            }
        }
        Ok(Answer {
            status,
            headers: parts.headers,
            body,
        })
    }
}

/// A request of ours before it is signed: `headers` in their order, then `body` (no body
/// at all when it is empty). A URL or header the request cannot carry is refused.
pub(crate) fn request<'a>(
    method: Method,
    url: &str,
    headers: impl IntoIterator<Item = (&'a HeaderName, &'a HeaderValue)>,
    body: Bytes,
    what: &str,
) -> Result<HttpRequest, WireError> {
    let mut req = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    req.body(if body.is_empty() {
        HttpRequestBody::empty()
    } else {
        HttpRequestBody::from(body)
    })
    .map_err(|e| wire_err(Failure::Refused, what, e))
}

/// What a failed request means for appends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The store does not do this request at all (501, 405, `NotImplemented`): counts
    /// toward switching appends off.
    Unsupported,
    /// The store refused the copy of this object explicitly (another 4xx: `AccessDenied`,
    /// `InvalidRequest`, ...): this object goes whole for a while; counts toward switching
    /// appends off.
    Refused,
    /// The copy source is not the object we recorded (412): upload the file whole.
    Precondition,
    /// The object or the bucket is not there (404 `NoSuchKey`): upload the file whole.
    Missing,
    /// Anything that may pass: 5xx, 429, 408, timeouts, connection errors, expired or
    /// refreshed credentials, an upload aborted under us. Retried; never counts.
    Transient,
}

/// A request of ours that failed, with what it means.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what}: {message}")]
pub struct WireError {
    /// What it means for appends.
    pub failure: Failure,
    /// Nothing was answered within the wire's answer timeout: not retried within the request.
    pub unanswered: bool,
    /// The request (`UploadPartCopy of <key>`).
    pub what: String,
    /// The answer or the transport error.
    pub message: String,
    /// The HTTP status of a non-2xx answer (`None`: no answer, or an error in a 200).
    pub status: Option<u16>,
    /// The store's error code in the answer, when it had one.
    pub code: Option<String>,
}

/// The error of a request that failed before (or without) an answer.
pub(crate) fn wire_err(failure: Failure, what: &str, e: impl std::fmt::Display) -> WireError {
    WireError {
        failure,
        unanswered: false,
        what: what.to_string(),
        message: e.to_string(),
        status: None,
        code: None,
    }
}

/// The error of an attempt that got no answer within `timeout`.
pub(crate) fn unanswered(what: &str, timeout: Duration) -> WireError {
    WireError {
        failure: Failure::Transient,
        unanswered: true,
        what: what.to_string(),
        message: format!("no answer within {timeout:?}"),
        status: None,
        code: None,
    }
}

/// `fut`'s output, or the unanswered error when `timeout` (if any) passes first.
pub(crate) async fn within<T>(
    timeout: Option<Duration>,
    fut: impl std::future::Future<Output = T>,
    what: &str,
) -> Result<T, WireError> {
    match timeout {
        Some(t) => tokio::time::timeout(t, fut)
            .await
            .map_err(|_| unanswered(what, t)),
        None => Ok(fut.await),
    }
}

/// An answer's body, at most [`MAX_ANSWER_BODY`] bytes (more is an error, not read on).
pub(crate) async fn read_bounded(
    body: object_store::client::HttpResponseBody,
    timeout: Option<Duration>,
    what: &str,
) -> Result<Bytes, WireError> {
    use futures::StreamExt as _;
    let mut stream = body.bytes_stream();
    let mut out = Vec::new();
    while let Some(chunk) = within(timeout, stream.next(), what).await? {
        let chunk = chunk.map_err(|e| wire_err(Failure::Transient, what, e))?;
        if out.len() + chunk.len() > MAX_ANSWER_BODY {
            return Err(wire_err(
                Failure::Transient,
                what,
                format!("the answer is over {MAX_ANSWER_BODY} bytes; not read further"),
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(out))
}

/// `once` tried up to `attempts` times while its failure is transient and `again` allows
/// it, waiting [`backoff`] between tries: the retry loop of our own wires (S3's, Azure's,
/// GCS's); `store` names the store in the debug line of each retry.
pub async fn retrying<T, F, Fut>(
    store: &str,
    attempts: u32,
    again: impl Fn(&WireError) -> bool,
    mut once: F,
) -> Result<T, WireError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, WireError>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match once().await {
            Err(e) if e.failure == Failure::Transient && again(&e) && attempt < attempts => {
                let wait = backoff(attempt);
                tracing::debug!(error = %e, attempt, wait_ms = wait.as_millis() as u64, "{store} request failed; retrying");
                tokio::time::sleep(wait).await;
            }
            r => return r,
        }
    }
}

/// The wait before attempt `attempt + 1`: exponential, capped, with full jitter over its
/// upper half (so many collectors do not retry in step).
pub fn backoff(attempt: u32) -> Duration {
    let exp = RETRY_BASE.saturating_mul(1 << attempt.min(16));
    let cap = exp.min(RETRY_MAX_BACKOFF);
    let half = cap / 2;
    half + half.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_a_cap() {
        for attempt in 1..10 {
            let b = backoff(attempt);
            let full = RETRY_BASE
                .saturating_mul(1 << attempt)
                .min(RETRY_MAX_BACKOFF);
            assert!(b >= full / 2 && b <= full, "{attempt}: {b:?}");
        }
        assert!(backoff(30) <= RETRY_MAX_BACKOFF);
    }
}
