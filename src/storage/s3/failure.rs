//! What a failed S3 request means, for every caller of the store (the appender, the conditional
//! writes, the log lane's client): [`Failure`] sorts an answer into transient (tried again
//! later, never a reason to turn a feature off), unsupported, refused, a failed precondition
//! or a missing object, from its status and S3's error code (in an error document, or in a
//! 200's body), whether it came through object_store or our own wire ([`WireError`]; both
//! types are `storage::wire`'s, shared with Azure's and GCS's wires).

use http::StatusCode;

use super::xml::ErrorDocument;
use super::MAX_ERROR_BODY;
use crate::storage::wire::{Failure, WireError};

/// S3's error codes that mean "not now" whatever their status.
const TRANSIENT_CODES: &[&str] = &[
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "RequestTimeTooSkewed",
    "RequestTimeout",
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "InternalError",
    "ServiceUnavailable",
    "NoSuchUpload",
    "OperationAborted",
];

/// S3's error codes that mean the store does not do the request.
const UNSUPPORTED_CODES: &[&str] = &["NotImplemented", "NotSupported", "MethodNotAllowed"];

/// Classifies an S3 answer by its status and error code.
pub fn classify(status: u16, code: Option<&str>) -> Failure {
    if code.is_some_and(|c| TRANSIENT_CODES.contains(&c)) {
        return Failure::Transient;
    }
    if code.is_some_and(|c| UNSUPPORTED_CODES.contains(&c)) || matches!(status, 501 | 405) {
        return Failure::Unsupported;
    }
    match status {
        412 => Failure::Precondition,
        404 if code.is_none_or(|c| c == "NoSuchKey") => Failure::Missing,
        // A missing bucket, or a 404 from a proxy: not the object's fault.
        404 => Failure::Transient,
        // 401: the credentials did not verify (expired, being refreshed): the chain's to fix.
        401 | 408 | 429 => Failure::Transient,
        // Credentials that do not verify now (a key being rotated) are the chain's to fix.
        403 if matches!(code, Some("InvalidAccessKeyId" | "SignatureDoesNotMatch")) => {
            Failure::Transient
        }
        400..=499 => Failure::Refused,
        _ => Failure::Transient,
    }
}

/// Classifies an error document S3 put in a 200 answer (a copy or a completion that failed
/// after the answer began): by its code as a 4xx would be (`AccessDenied` is a refusal,
/// `InternalError` or `SlowDown` transient); without a code, transient.
pub fn classify_embedded(code: Option<&str>) -> Failure {
    match code {
        None => Failure::Transient,
        Some("NoSuchKey") => Failure::Missing,
        Some("PreconditionFailed") => Failure::Precondition,
        Some(c) => classify(400, Some(c)),
    }
}

/// object_store's message when the body of a 200 to CreateMultipartUpload or
/// CompleteMultipartUpload is not the result it expects (it does not keep the body).
const UNREADABLE_MULTIPART_ANSWER: &str = "Got invalid multipart response";

/// Classifies an error of `object_store`'s own S3 requests (the appender's HEAD, the
/// upload's creation, its parts and completion) as [`classify`] does ours: from the error
/// kind, the HTTP status and S3's error code in the answer it carries. Without a status (a
/// connection error, a timeout), transient.
pub fn classify_store_error(e: &object_store::Error) -> Failure {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => return Failure::Missing,
        E::Precondition { .. } => return Failure::Precondition,
        E::NotImplemented { .. } | E::NotSupported { .. } => return Failure::Unsupported,
        _ => {}
    }
    let text = store_error_text(e);
    let code = store_error_code(&text);
    if text.contains("Server returned error response") {
        // A 2xx whose body is an error document.
        return classify_embedded(code.as_deref());
    }
    if text.contains(UNREADABLE_MULTIPART_ANSWER) && text.contains("missing field") {
        // A 200 to a creation or completion whose body is well-formed XML but not its
        // result: S3 puts only an error document there, and object_store reads the
        // transient ones itself (`InternalError`, `SlowDown`: "Server returned error
        // response" above), so this is one of the others (`InvalidPart`, ...): a refusal,
        // as the same code in a 4xx is. A body that is not XML stays transient.
        return Failure::Refused;
    }
    match store_error_status(e, &text) {
        Some(status) => classify(status, code.as_deref()),
        None => Failure::Transient,
    }
}

/// object_store's message when a 2xx answer lacks the ETag header it reads the result from.
const ANSWER_WITHOUT_ETAG: &str = "ETag Header missing from response";

/// Classifies an error of `object_store`'s `UploadPart` (a part of new bytes) as
/// [`classify_store_error`] does, but a 2xx answer without an ETag header is a refusal
/// (review r42v D1): object_store does not read the body of such an answer (an error
/// document, as some S3-compatible stores send in a 200), and a part without its ETag can
/// never be completed, so the same answer next round would fail the same way. For other
/// requests a missing ETag keeps its classification.
pub fn classify_part_error(e: &object_store::Error) -> Failure {
    if store_error_text(e).contains(ANSWER_WITHOUT_ETAG) {
        return Failure::Refused;
    }
    classify_store_error(e)
}

/// The text of an error of `object_store` and of its sources (its retry error, which holds
/// the status and the answer's body, is not public).
fn store_error_text(e: &object_store::Error) -> String {
    crate::util::error_chain(e, " | ")
}

/// S3's error code in an answer's text (`<Code>...</Code>`).
fn store_error_code(text: &str) -> Option<String> {
    text.split_once("<Code>")
        .and_then(|(_, rest)| rest.split_once("</Code>"))
        .map(|(c, _)| c.trim().to_string())
}

/// The HTTP status of the non-2xx answer an error of `object_store` carries (`text`: its
/// [`store_error_text`]), if it had one.
fn store_error_status(e: &object_store::Error, text: &str) -> Option<u16> {
    use object_store::Error as E;
    match e {
        E::PermissionDenied { .. } => Some(403),
        E::Unauthenticated { .. } => Some(401),
        _ => text
            .split_once("status code: ")
            .and_then(|(_, rest)| rest.get(..3))
            .and_then(|n| n.parse::<u16>().ok()),
    }
}

/// The status and S3's error code of the answer an error of `object_store` carries (both
/// `None` for an error without an answer).
pub fn store_error_answer(e: &object_store::Error) -> (Option<u16>, Option<String>) {
    let text = store_error_text(e);
    (store_error_status(e, &text), store_error_code(&text))
}

/// Whether the refusal of a write that carried a condition (`If-Match`, `If-None-Match`)
/// may be the store refusing the condition itself rather than the write: some
/// S3-compatible stores and gateways answer a header they do not take with 400
/// (`InvalidArgument`, `InvalidRequest`) or 403 instead of 501. Such a write is sent again
/// once without the condition (`storage::versioned`): only when that lands are conditions
/// turned off; a refusal of it too is the write's own (credentials, a bad request). A
/// transient answer (`ExpiredToken`, `SlowDown`, ... under 400 or 403) is not one.
pub fn may_refuse_conditions(failure: Failure, status: Option<u16>) -> bool {
    failure == Failure::Refused && matches!(status, Some(400 | 403))
}

/// The error for a non-2xx answer.
pub(crate) fn answer_err(status: StatusCode, body: &[u8], what: &str) -> WireError {
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_ERROR_BODY)]);
    let doc: ErrorDocument = quick_xml::de::from_str(&text).unwrap_or_default();
    let failure = classify(status.as_u16(), doc.code.as_deref());
    let message = match (&doc.code, &doc.message) {
        (Some(c), Some(m)) => format!("answered {status}: {c}: {m}"),
        (Some(c), None) => format!("answered {status}: {c}"),
        _ => format!("answered {status}: {text}"),
    };
    WireError {
        failure,
        unanswered: false,
        what: what.to_string(),
        message,
        status: Some(status.as_u16()),
        code: doc.code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_400_or_403_refusal_of_a_condition_may_be_the_condition() {
        let generic = |msg: &str| object_store::Error::Generic {
            store: "S3",
            source: msg.to_string().into(),
        };
        let invalid = generic(
            "Server returned non-2xx status code: 400 Bad Request: <Error><Code>InvalidArgument</Code></Error>",
        );
        let (status, code) = store_error_answer(&invalid);
        assert_eq!(
            (status, code.as_deref()),
            (Some(400), Some("InvalidArgument"))
        );
        assert!(may_refuse_conditions(
            classify_store_error(&invalid),
            status
        ));
        let denied = object_store::Error::PermissionDenied {
            path: "k".into(),
            source: "<Error><Code>AccessDenied</Code></Error>".into(),
        };
        let (status, code) = store_error_answer(&denied);
        assert_eq!((status, code.as_deref()), (Some(403), Some("AccessDenied")));
        assert!(may_refuse_conditions(classify_store_error(&denied), status));
        // Not the condition: a 412, a 409, transient codes under 400 / 403, no answer.
        assert!(!may_refuse_conditions(classify(412, None), Some(412)));
        assert!(!may_refuse_conditions(classify(409, None), Some(409)));
        assert!(!may_refuse_conditions(
            classify(400, Some("ExpiredToken")),
            Some(400)
        ));
        assert!(!may_refuse_conditions(
            classify(403, Some("SignatureDoesNotMatch")),
            Some(403)
        ));
        assert!(!may_refuse_conditions(Failure::Refused, None));
        let answered = answer_err(
            StatusCode::BAD_REQUEST,
            b"<Error><Code>InvalidRequest</Code><Message>no</Message></Error>",
            "CompleteMultipartUpload of k",
        );
        assert_eq!(answered.status, Some(400));
        assert_eq!(answered.code.as_deref(), Some("InvalidRequest"));
        assert!(may_refuse_conditions(answered.failure, answered.status));
    }

    #[test]
    fn failures_are_classified() {
        assert_eq!(classify(501, None), Failure::Unsupported);
        assert_eq!(classify(400, Some("NotImplemented")), Failure::Unsupported);
        assert_eq!(classify(405, None), Failure::Unsupported);
        assert_eq!(classify(401, None), Failure::Transient);
        assert_eq!(classify_embedded(Some("AccessDenied")), Failure::Refused);
        assert_eq!(classify_embedded(Some("InternalError")), Failure::Transient);
        assert_eq!(classify_embedded(Some("SlowDown")), Failure::Transient);
        assert_eq!(classify_embedded(None), Failure::Transient);
        let denied = object_store::Error::PermissionDenied {
            path: "k".into(),
            source: "HEAD 403".into(),
        };
        assert_eq!(classify_store_error(&denied), Failure::Refused);
        let generic = |msg: &str| object_store::Error::Generic {
            store: "S3",
            source: msg.to_string().into(),
        };
        assert_eq!(
            classify_store_error(&generic(
                "Server returned non-2xx status code: 400 Bad Request: <Error><Code>InvalidPart</Code></Error>"
            )),
            Failure::Refused
        );
        assert_eq!(
            classify_store_error(&generic(
                "Server returned non-2xx status code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>"
            )),
            Failure::Transient
        );
        assert_eq!(
            classify_store_error(&generic(
                "Server returned error response: <Error><Code>AccessDenied</Code></Error>"
            )),
            Failure::Refused
        );
        assert_eq!(
            classify_store_error(&generic("error sending request: connection refused")),
            Failure::Transient
        );
        // A 200 completion whose body is an error document object_store does not read as
        // one (`InvalidPart`): its parser misses the result's fields. A refusal.
        assert_eq!(
            classify_store_error(&generic(
                "Got invalid multipart response: missing field `ETag`"
            )),
            Failure::Refused
        );
        // An UploadPart answered 2xx without an ETag (an error document in a 200): a
        // refusal for a part only; other requests keep the general rule.
        let no_etag = object_store::Error::Generic {
            store: "S3",
            source: "Unable to extract metadata from headers: ETag Header missing from response"
                .into(),
        };
        assert_eq!(classify_part_error(&no_etag), Failure::Refused);
        assert_eq!(classify_store_error(&no_etag), Failure::Transient);
        assert_eq!(
            classify_part_error(&generic("error sending request: connection reset")),
            Failure::Transient
        );
        assert_eq!(
            classify_part_error(&generic(
                "Server returned non-2xx status code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>"
            )),
            Failure::Transient
        );
        // A body that is not XML at all (cut short, a proxy's page): transient.
        assert_eq!(
            classify_store_error(&generic(
                "Got invalid multipart response: unexpected end of stream"
            )),
            Failure::Transient
        );
        assert_eq!(classify(403, Some("AccessDenied")), Failure::Refused);
        assert_eq!(classify(400, Some("InvalidRequest")), Failure::Refused);
        assert_eq!(
            classify(412, Some("PreconditionFailed")),
            Failure::Precondition
        );
        assert_eq!(classify(404, Some("NoSuchKey")), Failure::Missing);
        assert_eq!(classify(404, Some("NoSuchUpload")), Failure::Transient);
        assert_eq!(classify(404, Some("NoSuchBucket")), Failure::Transient);
        for (status, code) in [
            (500, None),
            (503, Some("SlowDown")),
            (502, None),
            (429, None),
            (408, None),
            (400, Some("RequestTimeout")),
            (400, Some("ExpiredToken")),
            (403, Some("ExpiredToken")),
            (403, Some("InvalidAccessKeyId")),
            (403, Some("RequestTimeTooSkewed")),
        ] {
            assert_eq!(
                classify(status, code),
                Failure::Transient,
                "{status} {code:?}"
            );
        }
    }
}
