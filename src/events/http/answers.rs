//! The answers of the HTTP side: JSON errors, `503` with `Retry-After`, plain text, `405`
//! with `Allow`, and [`closing`], which marks an answer after which the connection closes.
//! Nothing here decides which answer a request gets.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};

pub(super) type Resp = Response<Full<Bytes>>;

pub(super) fn json_response(status: StatusCode, body: serde_json::Value) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub(super) fn error_response(status: StatusCode, message: impl Into<String>) -> Resp {
    json_response(status, serde_json::json!({ "error": message.into() }))
}

pub(super) fn retry_later(message: impl Into<String>, retry_after_secs: u32) -> Resp {
    let mut r = error_response(StatusCode::SERVICE_UNAVAILABLE, message);
    r.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
    r
}

pub(super) fn text_response(status: StatusCode, body: String, content_type: &'static str) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub(super) fn method_not_allowed(allow: &'static str) -> Resp {
    let mut r = error_response(StatusCode::METHOD_NOT_ALLOWED, format!("use {allow}"));
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    r
}

/// Marks an answer given without reading the request body: the connection cannot carry
/// another request, and saying so keeps the client from sending one into it.
pub(super) fn closing(mut r: Resp) -> Resp {
    r.headers_mut()
        .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    r
}
