//! The XML documents of our own S3 requests: the answers we read (a copied part, a completion,
//! an error document, pages of uploads and of objects, the bucket's versioning), read with
//! quick-xml and bounded by the caller, and the completion body we send (every value escaped).
//! Keys in listings may come URL-encoded ([`url_decode`]).

use serde::{Deserialize, Serialize};

/// The answer to UploadPartCopy (and S3's error document, which may come with a 200).
#[derive(Debug, Deserialize)]
pub(super) struct CopyPartResult {
    #[serde(rename = "ETag")]
    pub(super) e_tag: Option<String>,
    #[serde(rename = "ChecksumSHA256")]
    pub(super) checksum_sha256: Option<String>,
    #[serde(rename = "ChecksumCRC64NVME")]
    pub(super) checksum_crc64nvme: Option<String>,
}

/// S3's error document.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ErrorDocument {
    #[serde(rename = "Code")]
    pub(super) code: Option<String>,
    #[serde(rename = "Message")]
    pub(super) message: Option<String>,
}

/// A part as `object_store` hands it to its completion when a checksum is configured
/// (`PartId::content_id`); without one, the ETag alone.
#[derive(Serialize)]
pub(super) struct PartMetadata {
    pub(super) e_tag: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) checksum_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) checksum_crc64nvme: Option<String>,
}

/// A part as [`PartMetadata`] wrote it (or `object_store`, in the same format).
#[derive(Deserialize)]
pub(super) struct PartMetadataIn {
    pub(super) e_tag: String,
    #[serde(default)]
    pub(super) checksum_sha256: Option<String>,
    #[serde(default)]
    pub(super) checksum_crc64nvme: Option<String>,
}

/// The answer to CompleteMultipartUpload.
#[derive(Debug, Deserialize)]
pub(super) struct CompleteResult {
    #[serde(rename = "ETag")]
    pub(super) e_tag: Option<String>,
}

/// Escapes text for an XML element.
pub(super) fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListMultipartUploadsResult {
    #[serde(default)]
    pub(super) is_truncated: Option<bool>,
    #[serde(default)]
    pub(super) next_key_marker: Option<String>,
    #[serde(default)]
    pub(super) next_upload_id_marker: Option<String>,
    #[serde(default)]
    pub(super) upload: Vec<UploadEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct UploadEntry {
    pub(super) key: String,
    pub(super) upload_id: String,
    #[serde(default)]
    pub(super) initiated: Option<String>,
}

/// An incomplete multipart upload in the bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenUpload {
    /// Its key.
    pub key: String,
    /// Its id.
    pub upload_id: String,
    /// When it was started (RFC 3339, as S3 says it), when it says.
    pub initiated: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct VersioningConfiguration {
    #[serde(default)]
    pub(super) status: Option<String>,
}

/// The answer to ListObjectsV2.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListBucketResult {
    #[serde(default)]
    pub(super) contents: Vec<ListContents>,
    #[serde(default)]
    pub(super) common_prefixes: Vec<ListPrefix>,
    pub(super) is_truncated: Option<bool>,
    pub(super) next_continuation_token: Option<String>,
    pub(super) encoding_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListContents {
    pub(super) key: String,
    pub(super) size: Option<u64>,
    pub(super) last_modified: Option<String>,
    #[serde(rename = "ETag")]
    pub(super) e_tag: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListPrefix {
    pub(super) prefix: String,
}

/// One page of ListObjectsV2, keys decoded (`S3Wire::list_objects_page`).
#[derive(Debug, Default)]
pub struct ListedPage {
    /// The objects, in the server's order.
    pub objects: Vec<ListedObject>,
    /// The common prefixes (with their trailing `/`), decoded; as sent when not validly
    /// encoded.
    pub prefixes: Vec<Result<Vec<u8>, String>>,
    /// The token of the next page, when there is one.
    pub next: Option<String>,
}

/// An object of a listing.
#[derive(Debug)]
pub struct ListedObject {
    /// The key's bytes, decoded; as sent when it is not validly percent-encoded.
    pub key: Result<Vec<u8>, String>,
    /// Its size in bytes.
    pub size: u64,
    /// `LastModified` as S3 wrote it (RFC 3339).
    pub last_modified: Option<String>,
    /// Its ETag, quotes kept.
    pub e_tag: Option<String>,
}

/// Decodes a value S3 sent with `encoding-type=url`: `%XX` is a byte, `+` a space (S3
/// encodes a `+` of a key as `%2B`). `None` for a `%` not followed by two hex digits.
pub fn url_decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(out)
}
