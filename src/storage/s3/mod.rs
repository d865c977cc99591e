//! The S3 requests `object_store` has no call for, made from the very configuration of its
//! client, so that they honour every setting its own requests honour.
//!
//! An append is a multipart upload whose first parts are server-side copies of the current
//! object (`UploadPartCopy`). Everything of it but the copies goes through `object_store`'s
//! `MultipartStore` (create, parts, completion, abort), which sends the encryption settings
//! (SSE-S3, SSE-KMS with its key id, DSSE-KMS, bucket key, SSE-C), the checksum algorithm and
//! requester-pays exactly as a whole upload does. What is left here is sent as follows:
//!
//! - **HTTP client**: the one `object_store` builds from its `ClientOptions` (proxy and its CA,
//!   extra root certificates, invalid-certificate and HTTP/2 settings, timeouts, default
//!   headers, user agent): a [`CapturingConnector`] given to the builder keeps it.
//! - **Endpoint**: as `object_store` chooses it: `AWS_ENDPOINT_URL_S3` before `AWS_ENDPOINT`
//!   / `AWS_ENDPOINT_URL`, then an S3 Express zonal endpoint, then AWS's; path or virtual
//!   hosted style.
//! - **Signature**: `object_store`'s SigV4 signer and credential chain (refreshed by it), its
//!   unsigned-payload and skip-signature settings, and the requester-pays header.
//! - **SSE-C**: the customer key for the new part and for the copy source (the only
//!   encryption headers a part takes; the others are settings of the upload).
//! - **Checksums**: the copied part's checksum, as S3 answers it, is handed to the completion
//!   in `object_store`'s own part format, so an upload created with a checksum algorithm
//!   completes.
//!
//! Failures are classified ([`Failure`], [`classify_store_error`] for object_store's own
//! requests of an append): a deterministic answer (501, another 4xx than 401, 408 and 429,
//! an error document in a 200) counts against appends (a 400 or 403 to a write carrying a
//! condition may be the condition refused: [`may_refuse_conditions`]); 5xx, throttling,
//! timeouts, connection errors and credentials being refreshed are transient, retried here with
//! exponential backoff and jitter ([`RETRY_ATTEMPTS`]) and then left to the next round; an
//! attempt left unanswered for the wire's answer timeout is not retried (a hang repeats).
//! Only the log lane's wire has one ([`ANSWER_TIMEOUT`], [`S3Wire::with_answer_timeout`]):
//! a log append that fails has the whole upload to fall back on. The event publisher's
//! wire has none, so its copies wait as long as object_store's own client lets a request
//! run (its 120 s request timeout): a store that copies slowly still takes event growth.
//! Answer bodies are read up to `MAX_ANSWER_BODY`. S3 Express zonal endpoints are
//! addressed as object_store addresses them, but appends have not been run against one.
//!
//! Layout: this file is the face ([`S3Wire`], its requests and retries); `failure` says
//! what a failed S3 request or answer means (the codes behind a [`Failure`]); `xml` holds
//! the documents S3 answers with and the bodies we send. The HTTP exchange, the client it
//! shares with Azure's and GCS's wires and the retry loop are `storage::wire`'s.

mod failure;
mod xml;

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, AwsAuthorizer, AwsCredentialProvider};
use object_store::multipart::PartId;

pub(crate) use failure::answer_err;
use xml::{
    xml_escape, CompleteResult, CopyPartResult, ErrorDocument, ListBucketResult,
    ListMultipartUploadsResult, PartMetadata, PartMetadataIn, VersioningConfiguration,
};

pub use failure::{
    classify, classify_embedded, classify_part_error, classify_store_error, may_refuse_conditions,
    store_error_answer,
};

use super::wire::{
    request, retrying, wire_err, CapturingConnector, Connection, Failure, WireError, RETRY_ATTEMPTS,
};
pub use xml::{url_decode, ListedObject, ListedPage, OpenUpload};

/// How long one attempt of the log lane's wire waits for the answer's head, and then for
/// each piece of its body (the event publisher's wire has no such cut, see the module doc):
/// a request the store (or the network towards it) leaves unanswered that long is a
/// transient failure, not retried within the request (a hang repeats; the next round
/// tries again). S3 answers a long copy's head at once and keeps its body alive with
/// whitespace, so only a silent server meets it. With [`RETRY_ATTEMPTS`] and the backoff,
/// one request takes at most about 123 s, which `logs::lane`'s deadlines hold.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Pages of ListMultipartUploads read at start (1,000 uploads each): our own orphans are
/// a handful; a prefix with more is cleaned over several starts rather than stall one.
const MAX_LIST_PAGES: usize = 20;
/// Bytes of an error answer kept in a message.
const MAX_ERROR_BODY: usize = 2048;
/// What the object must be for a write to land (see [`S3Wire::complete_multipart`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Precondition {
    /// No object under the key (`If-None-Match: *`).
    Absent,
    /// The object with this ETag (`If-Match`).
    ETag(String),
}

/// How our own S3 requests are made (see the module doc).
#[derive(Debug, Clone)]
pub struct S3Wire {
    /// How long an attempt waits for each piece of its answer; `None`: as long as the HTTP
    /// client's own timeouts let it.
    answer_timeout: Option<Duration>,
    /// A client of its own, built with the store's options ([`Connection`]).
    conn: Connection,
    default_headers: HeaderMap,
    credentials: AwsCredentialProvider,
    bucket: String,
    /// `https://host/bucket` (path style) or `https://bucket.host` (virtual hosted).
    bucket_url: String,
    region: String,
    sign_payload: bool,
    skip_signature: bool,
    request_payer: bool,
    /// SSE-C: the key's headers for the destination part and for the copy source.
    sse_c: Vec<(HeaderName, HeaderValue)>,
    /// A checksum algorithm is configured: parts carry their checksums to the completion.
    checksum: bool,
}

/// Reads a boolean the way `object_store` parses its own (`true`, `1`, `yes`, `on`).
fn truthy(v: Option<String>) -> bool {
    v.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "true" | "1" | "yes" | "on" | "requester"
        )
    })
}

impl S3Wire {
    /// The wire for the store `builder` built (with `connector` as its HTTP connector), whose
    /// credentials are `credentials`.
    pub fn new(
        builder: &AmazonS3Builder,
        connector: &CapturingConnector,
        credentials: AwsCredentialProvider,
    ) -> Result<S3Wire, String> {
        let get = |k: AmazonS3ConfigKey| builder.get_config_value(&k).filter(|v| !v.is_empty());
        // The encryption keys' type is not exported: named by their configuration names.
        let get_named = |name: &str| {
            name.parse::<AmazonS3ConfigKey>()
                .ok()
                .and_then(|k| builder.get_config_value(&k))
                .filter(|v| !v.is_empty())
        };
        let conn = Connection::new(connector, "S3")?;
        let bucket = get(AmazonS3ConfigKey::Bucket).ok_or("no bucket name")?;
        let region = get(AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".into());
        let virtual_hosted = truthy(get(AmazonS3ConfigKey::VirtualHostedStyleRequest));
        let express = truthy(get(AmazonS3ConfigKey::S3Express));
        // The S3-specific endpoint before the generic one, as object_store's build does.
        let endpoint = get(AmazonS3ConfigKey::S3Endpoint).or(get(AmazonS3ConfigKey::Endpoint));
        let zonal = if express {
            let zone = bucket
                .strip_suffix("--x-s3")
                .or_else(|| bucket.strip_suffix("--xa-s3"))
                .and_then(|b| b.rsplit_once("--"))
                .map(|(_, zone)| zone.to_string())
                .ok_or_else(|| format!("S3 Express bucket {bucket:?} has no zone suffix"))?;
            Some(format!(
                "https://{bucket}.s3express-{zone}.{region}.amazonaws.com"
            ))
        } else {
            None
        };
        let bucket_url = match (endpoint, zonal, virtual_hosted) {
            (Some(e), _, true) => e.trim_end_matches('/').to_string(),
            (Some(e), _, false) => format!("{}/{bucket}", e.trim_end_matches('/')),
            (None, Some(z), _) => z,
            (None, None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
            (None, None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
        };
        let sse = get_named("aws_server_side_encryption");
        let mut sse_c = Vec::new();
        if sse.as_deref() == Some("sse-c") {
            let key =
                get_named("aws_sse_customer_key_base64").ok_or("sse-c without a customer key")?;
            let raw = base64::engine::general_purpose::STANDARD
                .decode(key.trim())
                .map_err(|e| format!("the SSE-C customer key is not base64: {e}"))?;
            let md5 = {
                use md5::Digest as _;
                base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(&raw))
            };
            for prefix in ["x-amz-", "x-amz-copy-source-"] {
                for (name, value) in [
                    ("server-side-encryption-customer-algorithm", "AES256"),
                    ("server-side-encryption-customer-key", key.trim()),
                    ("server-side-encryption-customer-key-MD5", md5.as_str()),
                ] {
                    let name = HeaderName::try_from(format!("{prefix}{name}"))
                        .map_err(|e| format!("SSE-C header: {e}"))?;
                    let mut value = HeaderValue::try_from(value)
                        .map_err(|e| format!("SSE-C header {name}: {e}"))?;
                    value.set_sensitive(true);
                    sse_c.push((name, value));
                }
            }
        }
        Ok(S3Wire {
            answer_timeout: None,
            default_headers: conn
                .options()
                .get_default_headers()
                .cloned()
                .unwrap_or_default(),
            conn,
            credentials,
            bucket,
            bucket_url,
            region,
            sign_payload: !truthy(get(AmazonS3ConfigKey::UnsignedPayload)),
            skip_signature: truthy(get(AmazonS3ConfigKey::SkipSignature)),
            request_payer: truthy(get(AmazonS3ConfigKey::RequestPayer)),
            sse_c,
            checksum: get(AmazonS3ConfigKey::Checksum).is_some(),
        })
    }

    /// The same wire, an attempt left unanswered for `timeout` failing without retry.
    pub fn with_answer_timeout(mut self, timeout: Duration) -> S3Wire {
        self.answer_timeout = Some(timeout);
        self
    }

    /// The bucket's URL (for the log).
    pub fn bucket_url(&self) -> &str {
        &self.bucket_url
    }

    /// Copies `range` (first and last byte) of the object `key`, which must still have the
    /// ETag `if_match`, as part `part_number` of the upload `upload_id`; the part as the
    /// completion takes it. Transient failures are retried.
    pub async fn upload_part_copy(
        &self,
        key: &str,
        upload_id: &str,
        part_number: usize,
        range: (u64, u64),
        if_match: &str,
    ) -> Result<PartId, WireError> {
        let what = format!("UploadPartCopy of {key} (bytes {}-{})", range.0, range.1);
        let url = format!(
            "{}/{}?partNumber={part_number}&uploadId={}",
            self.bucket_url,
            encode(key, true),
            encode(upload_id, false)
        );
        let source = format!("{}/{}", self.bucket, encode(key, true));
        let range = format!("bytes={}-{}", range.0, range.1);
        let mut headers = vec![
            (
                HeaderName::from_static("x-amz-copy-source"),
                source.as_str(),
            ),
            (
                HeaderName::from_static("x-amz-copy-source-if-match"),
                if_match,
            ),
            (
                HeaderName::from_static("x-amz-copy-source-range"),
                range.as_str(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| {
            HeaderValue::try_from(v)
                .map(|v| (k, v))
                .map_err(|e| wire_err(Failure::Refused, &what, e))
        })
        .collect::<Result<Vec<_>, _>>()?;
        headers.extend(self.sse_c.iter().cloned());
        let body = self
            .send(Method::PUT, &url, &headers, Bytes::new(), &what)
            .await?;
        // S3 may answer 200 and put the error in the body.
        let text = String::from_utf8_lossy(&body);
        if text.contains("<Error>") {
            let doc: ErrorDocument = quick_xml::de::from_str(&text).unwrap_or_default();
            let failure = classify_embedded(doc.code.as_deref());
            return Err(wire_err(
                failure,
                &what,
                format!("answered 200 with {text}"),
            ));
        }
        let result: CopyPartResult = quick_xml::de::from_str(&text)
            .map_err(|e| wire_err(Failure::Transient, &what, format!("{e} in {text:?}")))?;
        let e_tag = result
            .e_tag
            .ok_or_else(|| wire_err(Failure::Transient, &what, format!("no ETag in {text:?}")))?;
        let content_id = if self.checksum {
            quick_xml::se::to_string(&PartMetadata {
                e_tag,
                checksum_sha256: result.checksum_sha256,
                checksum_crc64nvme: result.checksum_crc64nvme,
            })
            .map_err(|e| wire_err(Failure::Transient, &what, e))?
        } else {
            e_tag
        };
        Ok(PartId { content_id })
    }

    /// Completes the multipart upload `upload_id` of `key` with `parts` (as
    /// `object_store`'s part calls and [`S3Wire::upload_part_copy`] give them, in order),
    /// as `object_store`'s own completion does (the same body, default headers and
    /// signature), but conditional on what the object is now: `If-Match: <ETag>`, or
    /// `If-None-Match: *` for an object that must not exist yet ([`Precondition`]; `None`:
    /// unconditional). So a completion delivered late (a killed run's, or one whose client
    /// gave up) cannot replace a newer version: the store answers 412. The new object's
    /// ETag. Transient failures are retried; a retry whose first attempt did land meets 412
    /// too (the caller reads the object to tell).
    pub async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[PartId],
        condition: Option<&Precondition>,
    ) -> Result<Option<String>, WireError> {
        let what = format!("CompleteMultipartUpload of {key}");
        let url = format!(
            "{}/{}?uploadId={}",
            self.bucket_url,
            encode(key, true),
            encode(upload_id, false)
        );
        let mut body = String::from("<CompleteMultipartUpload>");
        for (i, part) in parts.iter().enumerate() {
            let meta = quick_xml::de::from_str::<PartMetadataIn>(&part.content_id).ok();
            let e_tag = meta
                .as_ref()
                .map_or(part.content_id.as_str(), |m| m.e_tag.as_str());
            body.push_str("<Part><ETag>");
            body.push_str(&xml_escape(e_tag));
            body.push_str(&format!("</ETag><PartNumber>{}</PartNumber>", i + 1));
            if let Some(m) = &meta {
                if let Some(c) = &m.checksum_sha256 {
                    body.push_str(&format!(
                        "<ChecksumSHA256>{}</ChecksumSHA256>",
                        xml_escape(c)
                    ));
                }
                if let Some(c) = &m.checksum_crc64nvme {
                    body.push_str(&format!(
                        "<ChecksumCRC64NVME>{}</ChecksumCRC64NVME>",
                        xml_escape(c)
                    ));
                }
            }
            body.push_str("</Part>");
        }
        body.push_str("</CompleteMultipartUpload>");
        let mut headers = Vec::new();
        match condition {
            Some(Precondition::Absent) => {
                headers.push((http::header::IF_NONE_MATCH, HeaderValue::from_static("*")))
            }
            Some(Precondition::ETag(e)) => headers.push((
                http::header::IF_MATCH,
                HeaderValue::try_from(e.as_str())
                    .map_err(|e| wire_err(Failure::Refused, &what, e))?,
            )),
            None => {}
        }
        let answer = self
            .send(Method::POST, &url, &headers, Bytes::from(body), &what)
            .await?;
        // S3 may answer 200 and put the error in the body.
        let text = String::from_utf8_lossy(&answer);
        if text.contains("<Error>") {
            let doc: ErrorDocument = quick_xml::de::from_str(&text).unwrap_or_default();
            let failure = classify_embedded(doc.code.as_deref());
            return Err(wire_err(
                failure,
                &what,
                format!("answered 200 with {text}"),
            ));
        }
        let result: CompleteResult = quick_xml::de::from_str(&text)
            .map_err(|e| wire_err(Failure::Transient, &what, format!("{e} in {text:?}")))?;
        Ok(result.e_tag)
    }

    /// The incomplete multipart uploads under `prefix` (at most [`MAX_LIST_PAGES`] pages).
    pub async fn list_uploads(&self, prefix: &str) -> Result<Vec<OpenUpload>, WireError> {
        let what = format!("ListMultipartUploads under {prefix}");
        let mut out = Vec::new();
        let mut markers: Option<(String, String)> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut url = format!(
                "{}?prefix={}&uploads=",
                self.bucket_url,
                encode(prefix, false)
            );
            if let Some((k, u)) = &markers {
                url = format!(
                    "{}?key-marker={}&prefix={}&upload-id-marker={}&uploads=",
                    self.bucket_url,
                    encode(k, false),
                    encode(prefix, false),
                    encode(u, false)
                );
            }
            let body = self
                .send(Method::GET, &url, &[], Bytes::new(), &what)
                .await?;
            let page: ListMultipartUploadsResult = quick_xml::de::from_reader(&body[..])
                .map_err(|e| wire_err(Failure::Transient, &what, e))?;
            out.extend(page.upload.into_iter().map(|u| OpenUpload {
                key: u.key,
                upload_id: u.upload_id,
                initiated: u.initiated,
            }));
            match (
                page.is_truncated,
                page.next_key_marker,
                page.next_upload_id_marker,
            ) {
                (Some(true), Some(k), Some(u)) => markers = Some((k, u)),
                _ => break,
            }
        }
        Ok(out)
    }

    /// One page of ListObjectsV2 under `prefix` (with `/` as delimiter when `delimiter`),
    /// after `token`, asked with `encoding-type=url` so that a key holding a character XML
    /// 1.0 cannot carry (ESC, BEL, ...) arrives percent-encoded instead of failing the page.
    /// Keys and prefixes are handed back decoded, as bytes: what they are is the caller's
    /// to judge. A server that ignores `encoding-type` (it does not echo it) is read as
    /// sending raw keys. The continuation token is opaque (S3 encodes only `Delimiter`,
    /// `Prefix`, `Key` and `StartAfter`): passed back as given. Transient failures are
    /// retried; the answer is read up to `MAX_ANSWER_BODY`.
    pub async fn list_objects_page(
        &self,
        prefix: &str,
        delimiter: bool,
        token: Option<&str>,
    ) -> Result<ListedPage, WireError> {
        let what = format!("ListObjectsV2 under {prefix:?}");
        // Parameters in the order SigV4 canonicalises them.
        let mut url = format!("{}?", self.bucket_url);
        if let Some(t) = token {
            url.push_str(&format!("continuation-token={}&", encode(t, false)));
        }
        if delimiter {
            url.push_str("delimiter=%2F&");
        }
        url.push_str("encoding-type=url&list-type=2");
        if !prefix.is_empty() {
            url.push_str(&format!("&prefix={}", encode(prefix, false)));
        }
        let body = self
            .send(Method::GET, &url, &[], Bytes::new(), &what)
            .await?;
        let page: ListBucketResult = quick_xml::de::from_reader(&body[..])
            .map_err(|e| wire_err(Failure::Transient, &what, e))?;
        let encoded = page
            .encoding_type
            .as_deref()
            .is_some_and(|e| e.eq_ignore_ascii_case("url"));
        let key = |k: String| {
            if encoded {
                url_decode(&k).ok_or(k)
            } else {
                Ok(k.into_bytes())
            }
        };
        let next = match (page.is_truncated, page.next_continuation_token) {
            (Some(true), Some(t)) if !t.is_empty() => Some(t),
            (Some(true), _) => {
                return Err(wire_err(
                    Failure::Transient,
                    &what,
                    "a truncated page without a continuation token",
                ))
            }
            _ => None,
        };
        Ok(ListedPage {
            objects: page
                .contents
                .into_iter()
                .map(|c| ListedObject {
                    key: key(c.key),
                    size: c.size.unwrap_or(0),
                    last_modified: c.last_modified,
                    e_tag: c.e_tag,
                })
                .collect(),
            prefixes: page
                .common_prefixes
                .into_iter()
                .map(|p| key(p.prefix))
                .collect(),
            next,
        })
    }

    /// The bucket's versioning status (`Enabled`, `Suspended`), `None` when never enabled.
    pub async fn versioning(&self) -> Result<Option<String>, WireError> {
        let what = "GetBucketVersioning".to_string();
        let url = format!("{}?versioning=", self.bucket_url);
        let body = self
            .send(Method::GET, &url, &[], Bytes::new(), &what)
            .await?;
        let doc: VersioningConfiguration = quick_xml::de::from_reader(&body[..])
            .map_err(|e| wire_err(Failure::Transient, &what, e))?;
        Ok(doc.status.filter(|s| !s.is_empty()))
    }

    /// Sends one request, retrying transient failures with backoff and jitter; the body of
    /// a 2xx answer.
    async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Bytes,
        what: &str,
    ) -> Result<Bytes, WireError> {
        retrying(
            "S3",
            RETRY_ATTEMPTS,
            |e| !e.unanswered,
            || self.send_once(method.clone(), url, headers, body.clone(), what),
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
        let all = self
            .default_headers
            .iter()
            .chain(headers.iter().map(|(k, v)| (k, v)));
        let mut req = request(method, url, all, body, what)?;
        if !self.skip_signature {
            let credential = self
                .credentials
                .get_credential()
                .await
                .map_err(|e| wire_err(Failure::Transient, what, format!("credentials: {e}")))?;
            AwsAuthorizer::new(&credential, "s3", &self.region)
                .with_sign_payload(self.sign_payload)
                .with_request_payer(self.request_payer)
                .try_authorize(&mut req, None)
                .map_err(|e| wire_err(Failure::Transient, what, format!("signing: {e}")))?;
        }
        let answer = self.conn.exchange(req, self.answer_timeout, what).await?;
        if answer.status.is_success() {
            return Ok(answer.body);
        }
        Err(answer_err(answer.status, &answer.body, what))
    }
}

/// Percent-encodes for a URL path (`/` kept when `keep_slash`) or a query value: every byte
/// but S3's unreserved ones, as SigV4 expects.
pub fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    #[test]
    fn the_captured_client_is_the_stores_own() {
        use object_store::ClientConfigKey;
        // Web identity: object_store connects a client for STS first (with plain HTTP
        // forbidden), then the store's own (which allows it here): the last one is kept.
        let connector = CapturingConnector::default();
        let builder = AmazonS3Builder::new()
            .with_bucket_name("b")
            .with_region("eu-west-3")
            .with_allow_http(true)
            .with_proxy_url("http://127.0.0.1:3128")
            .with_config(
                AmazonS3ConfigKey::WebIdentityTokenFile,
                "/nonexistent/token",
            )
            .with_config(AmazonS3ConfigKey::RoleArn, "arn:aws:iam::1:role/r")
            .with_config(AmazonS3ConfigKey::S3Endpoint, "http://s3.example:9000")
            .with_config(AmazonS3ConfigKey::Endpoint, "http://other.example:9000")
            .with_http_connector(connector.clone());
        let s3 = builder.clone().build().unwrap();
        let (_, options) = connector.taken().unwrap();
        assert_eq!(
            options
                .get_config_value(&ClientConfigKey::AllowHttp)
                .as_deref(),
            Some("true")
        );
        assert_eq!(
            options
                .get_config_value(&ClientConfigKey::ProxyUrl)
                .as_deref(),
            Some("http://127.0.0.1:3128")
        );
        let wire = S3Wire::new(&builder, &connector, s3.credentials().clone()).unwrap();
        // The S3-specific endpoint wins, as in object_store.
        assert_eq!(wire.bucket_url(), "http://s3.example:9000/b");
        assert_eq!(wire.region, "eu-west-3");
    }

    #[test]
    fn answers_are_read() {
        let copied: CopyPartResult = quick_xml::de::from_str(
            "<CopyPartResult><ETag>&quot;9b2c&quot;</ETag><ChecksumSHA256>abc=</ChecksumSHA256>\
             </CopyPartResult>",
        )
        .unwrap();
        assert_eq!(copied.e_tag.as_deref(), Some("\"9b2c\""));
        assert_eq!(copied.checksum_sha256.as_deref(), Some("abc="));
        let list: ListMultipartUploadsResult = quick_xml::de::from_str(
            "<ListMultipartUploadsResult><Bucket>b</Bucket><IsTruncated>true</IsTruncated>\
             <NextKeyMarker>k2</NextKeyMarker><NextUploadIdMarker>u2</NextUploadIdMarker>\
             <Upload><Key>a/b</Key><UploadId>u1</UploadId><Initiated>2026-11-22T02:00:00.000Z</Initiated></Upload>\
             <Upload><Key>a/c</Key><UploadId>u2</UploadId></Upload></ListMultipartUploadsResult>",
        )
        .unwrap();
        assert_eq!(list.upload.len(), 2);
        assert_eq!(list.upload[0].key, "a/b");
        assert_eq!(list.is_truncated, Some(true));
        let empty: ListMultipartUploadsResult =
            quick_xml::de::from_str("<ListMultipartUploadsResult></ListMultipartUploadsResult>")
                .unwrap();
        assert!(empty.upload.is_empty());
        let listed: ListBucketResult = quick_xml::de::from_str(
            "<ListBucketResult><IsTruncated>true</IsTruncated>\
             <Contents><Key>p/a%20b%2Bc</Key><LastModified>2026-11-26T12:12:43.000Z</LastModified>\
             <ETag>&quot;9d&quot;</ETag><Size>1</Size></Contents>\
             <Contents><Key>p/bad%1Bx</Key><Size>2</Size></Contents><Name>b</Name>\
             <CommonPrefixes><Prefix>p/ok/</Prefix></CommonPrefixes>\
             <CommonPrefixes><Prefix>p/e%1B/</Prefix></CommonPrefixes>\
             <EncodingType>url</EncodingType><NextContinuationToken>t1</NextContinuationToken>\
             </ListBucketResult>",
        )
        .unwrap();
        assert_eq!(listed.contents.len(), 2);
        assert_eq!(url_decode(&listed.contents[1].key).unwrap(), b"p/bad\x1bx");
        assert_eq!(listed.contents[0].size, Some(1));
        assert_eq!(listed.common_prefixes[1].prefix, "p/e%1B/");
        assert_eq!(listed.encoding_type.as_deref(), Some("url"));
        assert_eq!(listed.next_continuation_token.as_deref(), Some("t1"));
        let v: VersioningConfiguration = quick_xml::de::from_str(
            "<VersioningConfiguration><Status>Enabled</Status></VersioningConfiguration>",
        )
        .unwrap();
        assert_eq!(v.status.as_deref(), Some("Enabled"));
        let err = answer_err(
            StatusCode::NOT_IMPLEMENTED,
            b"<Error><Code>NotImplemented</Code><Message>no</Message></Error>",
            "x",
        );
        assert_eq!(err.failure, Failure::Unsupported);
        assert_eq!(encode("a b/c+d/é", true), "a%20b/c%2Bd/%C3%A9");
        assert_eq!(encode("a+b/c=", false), "a%2Bb%2Fc%3D");
    }
}
