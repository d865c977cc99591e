//! An S3 bucket read as an untrusted one: an [`ObjectStore`] whose listings never fail a
//! page because of one bad key; everything else is `object_store`'s `AmazonS3`.
//!
//! S3 answers a listing in XML 1.0, which cannot carry most control characters: a key
//! holding ESC or BEL fails `object_store`'s parse of the whole page (up to 1,000 keys), so
//! one marker named with ESC would hide the other sessions of its page. This store
//! guarantees instead:
//!
//! - **Listings ask for encoded keys.** Both listings (flat, and with `/` as delimiter) are
//!   ListObjectsV2 with `encoding-type=url`, paged through continuation tokens, each answer
//!   read up to a bounded size; they are sent by the storage layer's `S3Wire`, which signs
//!   them with `object_store`'s signer and credentials and sends them through its HTTP
//!   client (same endpoint, proxy, certificates, timeouts, retries on transient failures).
//! - **A bad key costs only itself.** A key or common prefix that decodes to something no
//!   object path can hold (a control character, bytes that are not UTF-8, an empty, `.` or
//!   `..` segment), or that is not validly encoded, is skipped and the rest of the page is
//!   listed, as `local.rs` does for a `file://` bucket.
//! - **Everything skipped is told.** Each skipped key is recorded once in the [`SkipLog`]
//!   shared with the caller, escaped, with its reason, and ends up in the report's problems.
//! - **Nothing else changes.** Reads (and, were inspect to write, writes) go to `AmazonS3`
//!   unchanged, so only listings are ours.
//!
//! A server that does not echo `encoding-type` is read as sending raw keys; if it then puts
//! a control character in its XML, that page fails as before (and is reported as a
//! problem). GCS and Azure are listed by `object_store` itself.

use std::os::unix::ffi::OsStrExt as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::stream::BoxStream;
use futures::StreamExt as _;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use super::local::SkipLog;
use crate::storage::append::S3Appender;
use crate::storage::s3::ListedObject;
use crate::storage::wire::WireError;
use crate::util::escape::{escape_name, escape_os_name};

/// A key that no object path can hold.
const SKIP_BAD_KEY: &str =
    "a key with a control character, not UTF-8, or an empty, . or .. segment, that inspect \
     cannot name: skipped";
/// A key the server did not percent-encode validly.
const SKIP_UNDECODABLE: &str = "a key the server sent badly percent-encoded: skipped";

/// The read-only view of an S3 bucket for inspect.
#[derive(Debug, Clone)]
pub(super) struct S3Bucket {
    /// The store, for everything but listings.
    store: Arc<dyn ObjectStore>,
    /// Its appender, whose wire (`S3Wire`) sends the listings.
    appender: Arc<S3Appender>,
    skips: Arc<SkipLog>,
}

impl std::fmt::Display for S3Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InspectS3({})", self.appender.bucket_url())
    }
}

impl S3Bucket {
    /// The view of `store`, whose appender is `appender`; skipped keys go to `skips`.
    pub(super) fn new(
        store: Arc<dyn ObjectStore>,
        appender: Arc<S3Appender>,
        skips: Arc<SkipLog>,
    ) -> S3Bucket {
        S3Bucket {
            store,
            appender,
            skips,
        }
    }

    /// The path of a decoded key (or prefix, its trailing `/` dropped), or `None` after
    /// recording it as skipped.
    fn path_of(&self, key: Result<Vec<u8>, String>) -> Option<Path> {
        let bytes = match key {
            Ok(b) => b,
            Err(sent) => {
                self.skips.record(escape_name(&sent), SKIP_UNDECODABLE);
                return None;
            }
        };
        let trimmed = bytes.strip_suffix(b"/").unwrap_or(&bytes);
        let parsed = std::str::from_utf8(trimmed)
            .ok()
            .filter(|k| !k.is_empty() && !k.starts_with('/'))
            .and_then(|k| Path::parse(k).ok());
        if parsed.is_none() {
            self.skips.record(
                escape_os_name(std::ffi::OsStr::from_bytes(trimmed)),
                SKIP_BAD_KEY,
            );
        }
        parsed
    }

    fn meta_of(&self, o: ListedObject) -> Option<ObjectMeta> {
        let location = self.path_of(o.key)?;
        let last_modified = o
            .last_modified
            .as_deref()
            .and_then(crate::util::time::parse_rfc3339_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s))
            .unwrap_or(SystemTime::UNIX_EPOCH)
            .into();
        Some(ObjectMeta {
            location,
            last_modified,
            size: o.size,
            e_tag: o.e_tag,
            version: None,
        })
    }
}

/// The listing prefix of `prefix`, as `object_store` sends it: with a trailing `/`.
fn list_prefix(prefix: Option<&Path>) -> String {
    match prefix {
        Some(p) if !p.as_ref().is_empty() => format!("{}/", p.as_ref()),
        _ => String::new(),
    }
}

fn store_error(e: WireError) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: Box::new(e),
    }
}

/// A server that hands back the token it was given would be listed forever.
fn looping(prefix: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: format!(
            "ListObjectsV2 under {prefix:?}: the server repeated its continuation token"
        )
        .into(),
    }
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Where a flat listing is: before its first page, before the page of a token, done.
enum Cursor {
    First,
    After(String),
    Done,
}

impl ObjectStore for S3Bucket {
    fn put_opts<'a, 'b, 'async_trait>(
        &'a self,
        location: &'b Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> BoxFuture<'async_trait, object_store::Result<PutResult>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        Self: 'async_trait,
    {
        self.store.put_opts(location, payload, opts)
    }

    fn put_multipart_opts<'a, 'b, 'async_trait>(
        &'a self,
        location: &'b Path,
        opts: PutMultipartOptions,
    ) -> BoxFuture<'async_trait, object_store::Result<Box<dyn MultipartUpload>>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        Self: 'async_trait,
    {
        self.store.put_multipart_opts(location, opts)
    }

    fn get_opts<'a, 'b, 'async_trait>(
        &'a self,
        location: &'b Path,
        options: GetOptions,
    ) -> BoxFuture<'async_trait, object_store::Result<GetResult>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        Self: 'async_trait,
    {
        self.store.get_opts(location, options)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.store.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let this = self.clone();
        let prefix = list_prefix(prefix);
        futures::stream::unfold(Cursor::First, move |cursor| {
            let this = this.clone();
            let prefix = prefix.clone();
            async move {
                let token = match cursor {
                    Cursor::Done => return None,
                    Cursor::First => None,
                    Cursor::After(t) => Some(t),
                };
                let page = match this
                    .appender
                    .wire()
                    .list_objects_page(&prefix, false, token.as_deref())
                    .await
                {
                    Ok(p) => p,
                    Err(e) => return Some((vec![Err(store_error(e))], Cursor::Done)),
                };
                let mut items: Vec<_> = page
                    .objects
                    .into_iter()
                    .filter_map(|o| this.meta_of(o))
                    .map(Ok)
                    .collect();
                let next = match page.next {
                    Some(t) if token.as_deref() == Some(t.as_str()) => {
                        items.push(Err(looping(&prefix)));
                        Cursor::Done
                    }
                    Some(t) => Cursor::After(t),
                    None => Cursor::Done,
                };
                Some((items, next))
            }
        })
        .flat_map(futures::stream::iter)
        .boxed()
    }

    fn list_with_delimiter<'a, 'b, 'async_trait>(
        &'a self,
        prefix: Option<&'b Path>,
    ) -> BoxFuture<'async_trait, object_store::Result<ListResult>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        Self: 'async_trait,
    {
        let prefix = list_prefix(prefix);
        Box::pin(async move {
            let mut result = ListResult {
                common_prefixes: Vec::new(),
                objects: Vec::new(),
                extensions: Default::default(),
            };
            let mut token: Option<String> = None;
            loop {
                let page = self
                    .appender
                    .wire()
                    .list_objects_page(&prefix, true, token.as_deref())
                    .await
                    .map_err(store_error)?;
                result
                    .objects
                    .extend(page.objects.into_iter().filter_map(|o| self.meta_of(o)));
                result
                    .common_prefixes
                    .extend(page.prefixes.into_iter().filter_map(|p| self.path_of(p)));
                match page.next {
                    Some(t) if token.as_deref() == Some(t.as_str()) => {
                        return Err(looping(&prefix))
                    }
                    Some(t) => token = Some(t),
                    None => return Ok(result),
                }
            }
        })
    }

    fn copy_opts<'a, 'b, 'c, 'async_trait>(
        &'a self,
        from: &'b Path,
        to: &'c Path,
        options: CopyOptions,
    ) -> BoxFuture<'async_trait, object_store::Result<()>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        'c: 'async_trait,
        Self: 'async_trait,
    {
        self.store.copy_opts(from, to, options)
    }
}

#[cfg(test)]
mod tests {
    use crate::storage::s3::url_decode;

    #[test]
    fn keys_are_url_decoded() {
        assert_eq!(url_decode("a%20b%2Bc+d").unwrap(), b"a b+c d");
        assert_eq!(url_decode("x%1B%5B31m").unwrap(), b"x\x1b[31m");
        assert_eq!(url_decode("%FF").unwrap(), b"\xff");
        assert_eq!(url_decode("%4"), None);
        assert_eq!(url_decode("%zz"), None);
    }
}
