//! The Azure Blob requests `object_store` has no call for, made from the very configuration
//! of its client, so that they go where its own requests go, signed as they are signed:
//! Get Block List, Put Block under a block id we choose, and Put Block List naming the
//! blob's committed blocks plus new ones, conditional on the blob's ETag
//! (`append::AzureAppender` grows event objects with them).
//!
//! - **HTTP client**: built from the `ClientOptions` `object_store` built its own from
//!   (proxy and its CA, extra root certificates, timeouts, default headers, user agent,
//!   allow-HTTP), captured by [`CapturingConnector`] as for S3; a client of its own, replaced
//!   after an error answer to a request with a body (`wire::Connection`, as for S3).
//! - **Address**: the container URL as `object_store` forms it: the emulator's
//!   (`AZURITE_BLOB_STORAGE_URL` or `http://127.0.0.1:10000`, then the account), the
//!   endpoint set (a connection string's `BlobEndpoint`, `AZURE_STORAGE_ACCOUNT_URL`,
//!   `AZURE_STORAGE_ENDPOINT`), the Fabric endpoint, or
//!   `https://<account>.blob.core.windows.net`; then the container and the key's parts.
//! - **Signature**: `object_store`'s own credential provider (the one the store holds, so it
//!   is refreshed by it: account key, SAS, bearer token from workload identity, managed
//!   identity, client secret or the CLI) and its `AzureAuthorizer` (Shared Key signing, the
//!   bearer header or the SAS query pairs); none with `AZURE_SKIP_SIGNATURE`.
//! - **Not done**: a customer-provided encryption key (`AZURE_STORAGE_ENCRYPTION_KEY`)
//!   would have to go on every Put Block and Put Block List; with one set, event objects are
//!   written whole each publication as before ([`appends_off_reason`]).
//!
//! Failures are classified as S3's are (`wire::Failure`), with Azure's codes:
//! `ConditionNotMet` (412), `BlobAlreadyExists` (409, a create that met a blob) and
//! `InvalidBlockList` (a committed block that is no longer there: the blob was replaced)
//! mean the blob is not the version the write grows from; `BlobNotFound` a missing blob;
//! `ServerBusy`, `OperationTimedOut`, `InternalError`, 5xx, throttling and credentials
//! being refreshed (`AuthenticationFailed`) are transient, retried here with backoff
//! (`wire::RETRY_ATTEMPTS`) and then left to the next round.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use object_store::azure::{AzureConfigKey, MicrosoftAzure, MicrosoftAzureBuilder};
use object_store::path::Path as ObjectPath;
use serde::Deserialize;

use super::s3::{answer_err, classify};
use super::wire::{
    request, retrying, wire_err, CapturingConnector, Connection, Failure, WireError, RETRY_ATTEMPTS,
};

/// Azure's most committed blocks in one blob.
pub const MAX_BLOCKS: usize = 50_000;
/// Azure's largest block (service versions from 2019-12-12), in bytes.
pub const MAX_BLOCK_BYTES: u64 = 4000 << 20;
/// Azure's emulator account, when the emulator is used without one.
const EMULATOR_ACCOUNT: &str = "devstoreaccount1";

/// Why `object_store`'s Azure configuration `b` leaves event objects written whole, if it
/// does (see the module doc).
pub fn appends_off_reason(b: &MicrosoftAzureBuilder) -> Option<&'static str> {
    b.get_config_value(&AzureConfigKey::EncryptionKey)
        .filter(|k| !k.trim().is_empty())
        .map(|_| "a customer-provided encryption key is set")
}

/// A block of a blob, as Get Block List lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Its id, base64 as Azure lists it.
    pub id: String,
    /// Its bytes.
    pub size: u64,
}

/// The committed blocks of a blob and its ETag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockList {
    /// The blob's ETag (absent: a blob without committed blocks).
    pub e_tag: Option<String>,
    /// Its committed blocks, in order.
    pub blocks: Vec<Block>,
}

/// What a Put Block List must find for its commit to land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// No blob under the name (`If-None-Match: *`).
    Absent,
    /// The blob with this ETag (`If-Match`).
    ETag(String),
}

/// How our own Azure requests are made (see the module doc).
#[derive(Debug, Clone)]
pub struct AzureWire {
    /// A client of its own, built with the store's options ([`Connection`]).
    conn: Connection,
    /// The store's credential provider; `None`: requests are not signed.
    store: Option<Arc<MicrosoftAzure>>,
    account: String,
    /// `<service>/<container>`.
    container_url: url::Url,
}

fn truthy(v: Option<String>) -> bool {
    v.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
}

impl AzureWire {
    /// A wire for the store `store` built from `builder` with `connector` as its HTTP
    /// connector; `env` is the process environment (`AZURITE_BLOB_STORAGE_URL`, which
    /// `object_store` reads from it too).
    pub fn new(
        builder: &MicrosoftAzureBuilder,
        connector: &CapturingConnector,
        store: Arc<MicrosoftAzure>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<AzureWire, String> {
        let get = |k: AzureConfigKey| builder.get_config_value(&k).filter(|v| !v.is_empty());
        let conn = Connection::new(connector, "Azure")?;
        let container = get(AzureConfigKey::ContainerName).ok_or("no container name")?;
        let (service, account) = if truthy(get(AzureConfigKey::UseEmulator)) {
            let account = get(AzureConfigKey::AccountName).unwrap_or(EMULATOR_ACCOUNT.into());
            let base = env("AZURITE_BLOB_STORAGE_URL")
                .filter(|u| !u.trim().is_empty())
                .unwrap_or_else(|| "http://127.0.0.1:10000".into());
            let mut url = url::Url::parse(base.trim())
                .map_err(|e| format!("AZURITE_BLOB_STORAGE_URL {base:?}: {e}"))?;
            url.path_segments_mut()
                .map_err(|_| format!("AZURITE_BLOB_STORAGE_URL {base:?} cannot be a base"))?
                .push(&account);
            (url, account)
        } else {
            let account = get(AzureConfigKey::AccountName).ok_or("no account name")?;
            let base = match get(AzureConfigKey::Endpoint) {
                Some(e) => e,
                None if truthy(get(AzureConfigKey::UseFabricEndpoint)) => {
                    format!("https://{account}.blob.fabric.microsoft.com")
                }
                None => format!("https://{account}.blob.core.windows.net"),
            };
            let url = url::Url::parse(&base).map_err(|e| format!("endpoint {base:?}: {e}"))?;
            (url, account)
        };
        let mut container_url = service;
        container_url
            .path_segments_mut()
            .map_err(|_| "the endpoint cannot be a base URL".to_string())?
            .push(&container);
        let signed = !truthy(get(AzureConfigKey::SkipSignature));
        Ok(AzureWire {
            conn,
            store: signed.then_some(store),
            account,
            container_url,
        })
    }

    /// The URL of the blob `key` with `query`.
    fn blob_url(&self, key: &str, query: &[(&str, &str)]) -> Result<String, WireError> {
        let location = ObjectPath::parse(key)
            .map_err(|e| wire_err(Failure::Refused, key, format!("not a key: {e}")))?;
        let mut url = self.container_url.clone();
        url.path_segments_mut()
            .map_err(|_| wire_err(Failure::Refused, key, "the endpoint cannot be a base URL"))?
            .extend(location.parts());
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url.to_string())
    }

    /// The content type `object_store` gives a blob written under `key` without one (its
    /// `ClientOptions`' map by extension, or default), for Put Block List.
    pub fn content_type(&self, key: &str) -> Option<String> {
        let location = ObjectPath::parse(key).ok()?;
        self.conn
            .options()
            .get_content_type(&location)
            .map(str::to_string)
    }

    /// The committed blocks of the blob `key` (Get Block List).
    pub async fn get_block_list(&self, key: &str) -> Result<BlockList, WireError> {
        let what = format!("Get Block List of {key}");
        let url = self.blob_url(
            key,
            &[("comp", "blocklist"), ("blocklisttype", "committed")],
        )?;
        let (headers, body) = self
            .send(Method::GET, &url, &[], Bytes::new(), &what)
            .await?;
        let doc: BlockListDoc = quick_xml::de::from_reader(body.as_ref())
            .map_err(|e| wire_err(Failure::Transient, &what, format!("unreadable answer: {e}")))?;
        let blocks = doc
            .committed
            .map(|c| c.blocks)
            .unwrap_or_default()
            .into_iter()
            .map(|b| Block {
                id: b.name,
                size: b.size,
            })
            .collect();
        Ok(BlockList {
            e_tag: header(&headers, "etag"),
            blocks,
        })
    }

    /// Uploads `body` as the uncommitted block `id` (base64) of the blob `key` (Put Block).
    pub async fn put_block(&self, key: &str, id: &str, body: Bytes) -> Result<(), WireError> {
        let what = format!("Put Block of {key}");
        let url = self.blob_url(key, &[("comp", "block"), ("blockid", id)])?;
        self.send(Method::PUT, &url, &[], body, &what).await?;
        Ok(())
    }

    /// Commits `committed` (ids of blocks the blob has committed) then `uncommitted` (ids of
    /// blocks just put) as the blob `key`, only if it is as `condition` says (Put Block
    /// List); the blob's ETag and version id after it.
    pub async fn put_block_list(
        &self,
        key: &str,
        committed: &[String],
        uncommitted: &[String],
        condition: Option<&Condition>,
    ) -> Result<(Option<String>, Option<String>), WireError> {
        let what = format!("Put Block List of {key}");
        let url = self.blob_url(key, &[("comp", "blocklist")])?;
        let mut body = String::with_capacity(64 + 48 * (committed.len() + uncommitted.len()));
        body.push_str("<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>");
        for id in committed {
            body.push_str("<Committed>");
            body.push_str(id);
            body.push_str("</Committed>");
        }
        for id in uncommitted {
            body.push_str("<Uncommitted>");
            body.push_str(id);
            body.push_str("</Uncommitted>");
        }
        body.push_str("</BlockList>");
        let mut headers = Vec::new();
        match condition {
            Some(Condition::Absent) => {
                headers.push((http::header::IF_NONE_MATCH, HeaderValue::from_static("*")))
            }
            Some(Condition::ETag(e)) => headers.push((
                http::header::IF_MATCH,
                HeaderValue::from_str(e)
                    .map_err(|e| wire_err(Failure::Refused, &what, format!("ETag: {e}")))?,
            )),
            None => {}
        }
        if let Some(ct) = self.content_type(key) {
            if let Ok(v) = HeaderValue::from_str(&ct) {
                headers.push((HeaderName::from_static("x-ms-blob-content-type"), v));
            }
        }
        let (answer, _) = self
            .send(Method::PUT, &url, &headers, Bytes::from(body), &what)
            .await?;
        Ok((header(&answer, "etag"), header(&answer, "x-ms-version-id")))
    }

    /// One request, retried while its failure is transient ([`RETRY_ATTEMPTS`]).
    async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Bytes,
        what: &str,
    ) -> Result<(HeaderMap, Bytes), WireError> {
        retrying(
            "Azure",
            RETRY_ATTEMPTS,
            |_| true,
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
    ) -> Result<(HeaderMap, Bytes), WireError> {
        // Shared Key signs the length as sent: set before signing.
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
            object_store::azure::AzureAuthorizer::new(&credential, &self.account)
                .try_authorize(&mut req)
                .map_err(|e| wire_err(Failure::Transient, what, format!("signing: {e}")))?;
        }
        let answer = self.conn.exchange(req, None, what).await?;
        if answer.status.is_success() {
            return Ok((answer.headers, answer.body));
        }
        let mut e = answer_err(answer.status, &answer.body, what);
        e.failure = classify_azure(answer.status.as_u16(), e.code.as_deref());
        Err(e)
    }
}

/// What an Azure error answer means for a write (see the module doc).
pub fn classify_azure(status: u16, code: Option<&str>) -> Failure {
    match code {
        Some(
            "ConditionNotMet" | "BlobAlreadyExists" | "InvalidBlockList" | "TargetConditionNotMet",
        ) => Failure::Precondition,
        Some("BlobNotFound") => Failure::Missing,
        Some(
            "ServerBusy"
            | "OperationTimedOut"
            | "InternalError"
            | "AuthenticationFailed"
            | "ContainerNotFound",
        ) => Failure::Transient,
        _ if status == 409 => Failure::Precondition,
        _ => classify(status, code),
    }
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .filter(|v| !v.is_empty())
}

#[derive(Debug, Deserialize)]
struct BlockListDoc {
    #[serde(rename = "CommittedBlocks")]
    committed: Option<BlocksDoc>,
}

#[derive(Debug, Default, Deserialize)]
struct BlocksDoc {
    #[serde(rename = "Block", default)]
    blocks: Vec<BlockDoc>,
}

#[derive(Debug, Deserialize)]
struct BlockDoc {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Size")]
    size: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_lists_are_read() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?><BlockList><CommittedBlocks><Block><Name>YWJj</Name><Size>10</Size></Block><Block><Name>ZGVm</Name><Size>5</Size></Block></CommittedBlocks><UncommittedBlocks /></BlockList>"#;
        let doc: BlockListDoc = quick_xml::de::from_str(xml).unwrap();
        let b = doc.committed.unwrap().blocks;
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].name.as_str(), b[0].size), ("YWJj", 10));
        let empty: BlockListDoc =
            quick_xml::de::from_str("<BlockList><CommittedBlocks /></BlockList>").unwrap();
        assert!(empty.committed.unwrap_or_default().blocks.is_empty());
        let none: BlockListDoc = quick_xml::de::from_str("<BlockList></BlockList>").unwrap();
        assert!(none.committed.is_none());
    }

    #[test]
    fn azure_codes_are_classified() {
        assert_eq!(
            classify_azure(412, Some("ConditionNotMet")),
            Failure::Precondition
        );
        assert_eq!(
            classify_azure(409, Some("BlobAlreadyExists")),
            Failure::Precondition
        );
        assert_eq!(
            classify_azure(400, Some("InvalidBlockList")),
            Failure::Precondition
        );
        assert_eq!(classify_azure(404, Some("BlobNotFound")), Failure::Missing);
        assert_eq!(
            classify_azure(404, Some("ContainerNotFound")),
            Failure::Transient
        );
        assert_eq!(classify_azure(503, Some("ServerBusy")), Failure::Transient);
        assert_eq!(
            classify_azure(403, Some("AuthenticationFailed")),
            Failure::Transient
        );
        assert_eq!(
            classify_azure(403, Some("AuthorizationPermissionMismatch")),
            Failure::Refused
        );
    }
}
