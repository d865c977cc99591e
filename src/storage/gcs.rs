//! The Google Cloud Storage requests `object_store` has no call for, through GCS's JSON API,
//! made from the very configuration of its client: a media upload conditional on a
//! generation (`ifGenerationMatch`, 0 for "no object"), a compose of objects each pinned to
//! its generation onto a destination conditional on its own, a conditional delete, an
//! object's metadata and bytes, and a listing (`append::GcsAppender` grows event objects
//! with them). `object_store` speaks GCS's XML API, which has no compose.
//!
//! - **HTTP client**: built from the `ClientOptions` `object_store` built its own from
//!   (proxy, root certificates, timeouts, default headers, user agent, allow-HTTP), captured
//!   by `wire::CapturingConnector` as for S3 and Azure; a client of its own, replaced after an
//!   error answer to a request with a body.
//! - **Address**: `object_store`'s base URL (`GOOGLE_BASE_URL`, else the service account
//!   key's `gcs_base_url`, else `https://storage.googleapis.com`, which serves the JSON API
//!   on the same host), then `/storage/v1/b/<bucket>/o/...` and `/upload/storage/v1/...`.
//! - **Credentials**: `object_store`'s own credential provider (the one the store holds,
//!   refreshed by it: service account, application default credentials, instance metadata,
//!   `GOOGLE_BEARER_TOKEN`...), sent as the bearer token it gives (none when it is empty,
//!   as `object_store` does, or with `GOOGLE_SKIP_SIGNATURE`). No signing code of ours.
//!
//! Failures are classified as S3's are (`wire::Failure`): 412 (and 304) is a failed
//! precondition, 404 for an object a missing object, 5xx, 408, 429 and 401 transient
//! (retried here with backoff, `wire::RETRY_ATTEMPTS`), other 4xx refusals. An answer that
//! shows no JSON API at all ([`WireError::code`] [`NO_JSON_API`]: a 400, 404, 405 or 501
//! whose body is not a GCS JSON error, or a 2xx whose body is not JSON; an S3-compatible
//! server behind `gs://`, such as moto) is told apart, for the appender to turn itself off.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use object_store::gcp::{GoogleCloudStorage, GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::path::Path as ObjectPath;
use serde::Deserialize;

use super::s3::classify;
use super::wire::{
    request, retrying, wire_err, CapturingConnector, Connection, Failure, WireError, RETRY_ATTEMPTS,
};

/// GCS's most components in one composite object.
pub const MAX_COMPONENTS: u64 = 1024;
/// `object_store`'s base URL when none is configured.
const DEFAULT_BASE_URL: &str = "https://storage.googleapis.com";
/// The content type `object_store` gives an object without one.
const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";
/// The [`WireError::code`] of an answer that shows no JSON API behind the base URL.
pub const NO_JSON_API: &str = "NoJsonApi";
/// The custom metadata key holding the components a composite of ours was made of (GCS
/// reports `componentCount` itself; emulators do not all count an uploaded object as one).
pub const COMPONENTS_KEY: &str = "rhc-components";

/// An object as the JSON API describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcsObject {
    /// Its name.
    pub name: String,
    /// Its generation.
    pub generation: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Its ETag.
    pub e_tag: Option<String>,
    /// Its components: GCS's `componentCount`, or ours in its metadata, whichever is more;
    /// 1 for an object that is not a composite.
    pub components: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectDoc {
    name: String,
    generation: String,
    #[serde(default)]
    size: Option<String>,
    #[serde(default)]
    etag: Option<String>,
    #[serde(default)]
    component_count: Option<u64>,
    #[serde(default)]
    metadata: Option<std::collections::HashMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListDoc {
    #[serde(default)]
    items: Vec<ObjectDoc>,
    #[serde(default)]
    next_page_token: Option<String>,
}

impl ObjectDoc {
    fn into_object(self, what: &str) -> Result<GcsObject, WireError> {
        let bad = |f: &str| wire_err(Failure::Transient, what, format!("unreadable {f}"));
        let ours = self
            .metadata
            .as_ref()
            .and_then(|m| m.get(COMPONENTS_KEY))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1);
        Ok(GcsObject {
            generation: self.generation.parse().map_err(|_| bad("generation"))?,
            size: match self.size {
                Some(s) => s.parse().map_err(|_| bad("size"))?,
                None => 0,
            },
            e_tag: self.etag.filter(|e| !e.is_empty()),
            components: self.component_count.unwrap_or(1).max(ours).max(1),
            name: self.name,
        })
    }
}

/// How our own GCS JSON requests are made (see the module doc).
#[derive(Debug, Clone)]
pub struct GcsWire {
    /// A client of its own, built with the store's options ([`Connection`]).
    conn: Connection,
    /// The store's credential provider; `None`: requests carry no token.
    store: Option<Arc<GoogleCloudStorage>>,
    base: url::Url,
    bucket: String,
    /// Attempts of a request whose failure is transient ([`RETRY_ATTEMPTS`]; 1 on a
    /// [`GcsWire::quick`] wire).
    attempts: u32,
    /// Each attempt is cut after this (`None`: the client's own timeouts only).
    deadline: Option<std::time::Duration>,
}

fn truthy(v: Option<String>) -> bool {
    v.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
}

/// The `gcs_base_url` of a service account key (JSON text).
fn key_base_url(json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    v.get("gcs_base_url")?.as_str().map(str::to_string)
}

impl GcsWire {
    /// A wire for the store `store` built from `builder` with `connector` as its HTTP
    /// connector.
    pub fn new(
        builder: &GoogleCloudStorageBuilder,
        connector: &CapturingConnector,
        store: Arc<GoogleCloudStorage>,
    ) -> Result<GcsWire, String> {
        let get = |k: GoogleConfigKey| builder.get_config_value(&k).filter(|v| !v.is_empty());
        let conn = Connection::new(connector, "GCS")?;
        let bucket = get(GoogleConfigKey::Bucket).ok_or("no bucket name")?;
        // As object_store: the base URL set, else the service account key's.
        let base = get(GoogleConfigKey::BaseUrl)
            .or_else(|| get(GoogleConfigKey::ServiceAccountKey).and_then(|k| key_base_url(&k)))
            .or_else(|| {
                get(GoogleConfigKey::ServiceAccount)
                    .and_then(|p| std::fs::read_to_string(p).ok())
                    .and_then(|k| key_base_url(&k))
            })
            .unwrap_or_else(|| DEFAULT_BASE_URL.into());
        let base = url::Url::parse(base.trim_end_matches('/'))
            .map_err(|e| format!("GCS base URL {base:?}: {e}"))?;
        if base.cannot_be_a_base() {
            return Err(format!("GCS base URL {base} cannot be a base"));
        }
        let signed = !truthy(get(GoogleConfigKey::SkipSignature));
        Ok(GcsWire {
            conn,
            store: signed.then_some(store),
            base,
            bucket,
            attempts: RETRY_ATTEMPTS,
            deadline: None,
        })
    }

    /// The same wire making each request once, cut after `deadline` (a transient failure):
    /// for the requests nothing waits for (the probe of `append::GcsAppender`, the start's
    /// cleanup of parts), which must not run on for minutes against a hung API.
    pub fn quick(&self, deadline: std::time::Duration) -> GcsWire {
        GcsWire {
            attempts: 1,
            deadline: Some(deadline),
            ..self.clone()
        }
    }

    /// `<base>/<path...>` with `query`.
    fn url(&self, path: &[&str], query: &[(&str, &str)]) -> String {
        let mut url = self.base.clone();
        if let Ok(mut segs) = url.path_segments_mut() {
            segs.pop_if_empty().extend(path);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url.to_string()
    }

    /// The content type `object_store` gives an object written under `key` (its
    /// `ClientOptions`' map by extension, its default, or `application/octet-stream`).
    pub fn content_type(&self, key: &str) -> String {
        ObjectPath::parse(key)
            .ok()
            .and_then(|l| self.conn.options().get_content_type(&l).map(str::to_string))
            .unwrap_or_else(|| DEFAULT_CONTENT_TYPE.into())
    }

    /// Uploads `body` as the object `key` (a media upload), only if its generation is
    /// `if_generation` (0: only if there is none; `None`: unconditionally).
    pub async fn upload(
        &self,
        key: &str,
        body: Bytes,
        if_generation: Option<u64>,
    ) -> Result<GcsObject, WireError> {
        let what = format!("upload of {key}");
        let generation = if_generation.map(|g| g.to_string());
        let mut query = vec![("uploadType", "media"), ("name", key)];
        if let Some(g) = &generation {
            query.push(("ifGenerationMatch", g));
        }
        let url = self.url(&["upload", "storage", "v1", "b", &self.bucket, "o"], &query);
        let ct = HeaderValue::from_str(&self.content_type(key))
            .unwrap_or(HeaderValue::from_static(DEFAULT_CONTENT_TYPE));
        let answer = self
            .send(
                Method::POST,
                &url,
                &[(http::header::CONTENT_TYPE, ct)],
                body,
                &what,
            )
            .await?;
        object_answer(&answer, &what)
    }

    /// Composes `sources` (each name with the generation it must have) into `key`, only if
    /// its generation is `if_generation` (0: only if there is none); the destination gets
    /// `key`'s content type, no content encoding (no transcoding on reads), and `components`
    /// in its metadata.
    pub async fn compose(
        &self,
        key: &str,
        sources: &[(&str, u64)],
        if_generation: u64,
        components: u64,
    ) -> Result<GcsObject, WireError> {
        let what = format!("compose of {key}");
        let generation = if_generation.to_string();
        let url = self.url(
            &["storage", "v1", "b", &self.bucket, "o", key, "compose"],
            &[("ifGenerationMatch", &generation)],
        );
        let body = serde_json::json!({
            "kind": "storage#composeRequest",
            "sourceObjects": sources.iter().map(|(name, g)| serde_json::json!({
                "name": name,
                "generation": g.to_string(),
                "objectPreconditions": { "ifGenerationMatch": g.to_string() },
            })).collect::<Vec<_>>(),
            "destination": {
                "contentType": self.content_type(key),
                "metadata": { COMPONENTS_KEY: components.to_string() },
            },
        });
        let answer = self
            .send(
                Method::POST,
                &url,
                &[(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                Bytes::from(body.to_string()),
                &what,
            )
            .await?;
        object_answer(&answer, &what)
    }

    /// Deletes the object `key` if its generation is `generation`.
    pub async fn delete(&self, key: &str, generation: u64) -> Result<(), WireError> {
        let what = format!("delete of {key}");
        let g = generation.to_string();
        let url = self.url(
            &["storage", "v1", "b", &self.bucket, "o", key],
            &[("ifGenerationMatch", &g)],
        );
        self.send(Method::DELETE, &url, &[], Bytes::new(), &what)
            .await?;
        Ok(())
    }

    /// The object `key` as it is now; `None` when there is none.
    pub async fn stat(&self, key: &str) -> Result<Option<GcsObject>, WireError> {
        let what = format!("metadata of {key}");
        let url = self.url(&["storage", "v1", "b", &self.bucket, "o", key], &[]);
        match self.send(Method::GET, &url, &[], Bytes::new(), &what).await {
            Ok(answer) => object_answer(&answer, &what).map(Some),
            Err(e) if e.failure == Failure::Missing => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The bytes of the object `key` at `generation` (an answer over `MAX_ANSWER_BODY` is
    /// an error: at most a segment's object is read).
    pub async fn read(&self, key: &str, generation: u64) -> Result<Bytes, WireError> {
        let what = format!("read of {key}");
        let g = generation.to_string();
        let url = self.url(
            &["storage", "v1", "b", &self.bucket, "o", key],
            &[("alt", "media"), ("generation", &g)],
        );
        self.send(Method::GET, &url, &[], Bytes::new(), &what).await
    }

    /// The objects whose names start with `prefix` and match `glob` (GCS's `matchGlob`;
    /// the caller filters again, for a server that ignores it).
    pub async fn list(&self, prefix: &str, glob: &str) -> Result<Vec<GcsObject>, WireError> {
        let what = format!("listing of {prefix}");
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![("prefix", prefix), ("matchGlob", glob)];
            if let Some(t) = &token {
                query.push(("pageToken", t));
            }
            let url = self.url(&["storage", "v1", "b", &self.bucket, "o"], &query);
            let answer = self
                .send(Method::GET, &url, &[], Bytes::new(), &what)
                .await?;
            let doc: ListDoc = serde_json::from_slice(&answer).map_err(|e| no_json(&what, e))?;
            for item in doc.items {
                out.push(item.into_object(&what)?);
            }
            match doc.next_page_token.filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t),
                None => return Ok(out),
            }
        }
    }

    /// One request, retried while its failure is transient (`attempts`), each attempt cut
    /// at the wire's deadline when it has one.
    async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Bytes,
        what: &str,
    ) -> Result<Bytes, WireError> {
        retrying(
            "GCS",
            self.attempts,
            |_| true,
            || async {
                let once = self.send_once(method.clone(), url, headers, body.clone(), what);
                match self.deadline {
                    Some(d) => tokio::time::timeout(d, once).await.unwrap_or_else(|_| {
                        Err(wire_err(
                            Failure::Transient,
                            what,
                            format!("no answer within {} ms", d.as_millis()),
                        ))
                    }),
                    None => once.await,
                }
            },
        )
        .await
    }

    async fn send_once(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Bytes,
        what: &str,
    ) -> Result<Bytes, WireError> {
        let length = (http::header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        let all =
            std::iter::once((&length.0, &length.1)).chain(headers.iter().map(|(k, v)| (k, v)));
        let mut req = request(method, url, all, body, what)?;
        if let Some(store) = &self.store {
            let credential = store
                .credentials()
                .get_credential()
                .await
                .map_err(|e| wire_err(Failure::Transient, what, format!("credentials: {e}")))?;
            // As object_store: an empty token (`disable_oauth`) is not sent.
            if !credential.bearer.is_empty() {
                let token = HeaderValue::try_from(format!("Bearer {}", credential.bearer))
                    .map_err(|e| wire_err(Failure::Refused, what, e))?;
                req.headers_mut().insert(http::header::AUTHORIZATION, token);
            }
        }
        let answer = self.conn.exchange(req, None, what).await?;
        if answer.status.is_success() {
            return Ok(answer.body);
        }
        Err(answer_error(answer.status.as_u16(), &answer.body, what))
    }
}

/// The object of a 2xx answer; a body that is not one shows no JSON API.
fn object_answer(body: &[u8], what: &str) -> Result<GcsObject, WireError> {
    let doc: ObjectDoc = serde_json::from_slice(body).map_err(|e| no_json(what, e))?;
    doc.into_object(what)
}

fn no_json(what: &str, e: impl std::fmt::Display) -> WireError {
    WireError {
        failure: Failure::Unsupported,
        unanswered: false,
        what: what.to_string(),
        message: format!("the answer is not GCS's JSON ({e}): no JSON API there"),
        status: None,
        code: Some(NO_JSON_API.into()),
    }
}

/// What a non-2xx answer means (see the module doc).
pub fn answer_error(status: u16, body: &[u8], what: &str) -> WireError {
    let text = String::from_utf8_lossy(&body[..body.len().min(2048)]).into_owned();
    let json_error = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let e = v.get("error")?;
            Some(
                e.get("message")
                    .and_then(|m| m.as_str())
                    .map(str::to_string)
                    .unwrap_or_else(|| e.to_string()),
            )
        });
    let (failure, code) = match (&json_error, status) {
        (None, 400 | 404 | 405 | 501) => (Failure::Unsupported, Some(NO_JSON_API.to_string())),
        (_, 412 | 304) => (Failure::Precondition, None),
        (_, 404) => (Failure::Missing, None),
        _ => (classify(status, None), None),
    };
    WireError {
        failure,
        unanswered: false,
        what: what.to_string(),
        message: format!(
            "answered {status}: {}",
            json_error.unwrap_or_else(|| text.trim().to_string())
        ),
        status: Some(status),
        code,
    }
}

/// Whether `e` shows no JSON API behind the base URL.
pub fn no_json_api(e: &WireError) -> bool {
    e.code.as_deref() == Some(NO_JSON_API)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified() {
        let json = br#"{"error":{"code":412,"message":"precondition failed"}}"#;
        let e = answer_error(412, json, "x");
        assert_eq!(e.failure, Failure::Precondition);
        assert!(!no_json_api(&e));
        let e = answer_error(
            404,
            br#"{"error":{"code":404,"message":"No such object"}}"#,
            "x",
        );
        assert_eq!(e.failure, Failure::Missing);
        assert!(!no_json_api(&e));
        // moto, an S3 gateway: XML (or nothing) where GCS answers JSON.
        let e = answer_error(404, b"<Error><Code>NoSuchBucket</Code></Error>", "x");
        assert!(no_json_api(&e));
        assert!(no_json_api(&answer_error(405, b"", "x")));
        assert_eq!(answer_error(503, b"busy", "x").failure, Failure::Transient);
        assert_eq!(
            answer_error(403, br#"{"error":{"message":"denied"}}"#, "x").failure,
            Failure::Refused
        );
        assert!(no_json_api(&object_answer(b"<xml/>", "x").unwrap_err()));
    }

    #[test]
    fn objects_are_read() {
        let doc = br#"{"name":"a/b","generation":"17","size":"42","etag":"CAE=","componentCount":3,"metadata":{"rhc-components":"5"}}"#;
        let o = object_answer(doc, "x").unwrap();
        assert_eq!((o.generation, o.size, o.components), (17, 42, 5));
        let plain = object_answer(br#"{"name":"a","generation":"1","size":"0"}"#, "x").unwrap();
        assert_eq!(plain.components, 1);
    }
}
