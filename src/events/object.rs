//! What an event object is, for both paths that write one: its key in the bucket layout, its
//! compression, and the upload of a sealed spool file whole. The uploader
//! ([`crate::events::upload`]) queues sealed files and the publisher
//! ([`crate::events::publish`]) grows open ones; both name and compress an object by these
//! rules, so an object grown by the publisher and one uploaded whole by the uploader are the
//! same object.

use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::contract::ClusterLayout;
use crate::events::spool::{FileKind, SealedFile};
use crate::metrics as m;
use crate::storage::gzip::GzipLevel;
use crate::storage::put::{put_file, UploadError};

/// Compression applied to event and quarantine objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// gzip, objects named `*.jsonl.gz` (the history server gunzips `.gz`).
    Gzip,
    /// Plain JSON lines.
    None,
}

/// Settings of the uploader.
#[derive(Debug, Clone)]
pub struct UploaderConfig {
    /// Uploads in flight at once.
    pub concurrency: usize,
    /// Compression of event objects.
    pub compression: Compression,
    /// Its level, when it is gzip.
    pub gzip_level: GzipLevel,
    /// Size of one multipart part (and the largest single PUT), in bytes of the object.
    pub part_size: usize,
    /// The bucket layout keys are built from.
    pub layout: ClusterLayout,
}

pub(crate) fn kind_label(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Marker => "session_marker",
        FileKind::Events => "events",
        FileKind::Quarantine => "quarantine",
    }
}

/// The gzip level a sealed file is uploaded at, or `None` if it is uploaded as it is: its
/// object key ends in `.gz` exactly when this is `Some`.
pub(crate) fn gzip_level(cfg: &UploaderConfig, f: &SealedFile) -> Option<GzipLevel> {
    (f.compressible && cfg.compression == Compression::Gzip).then_some(cfg.gzip_level)
}

/// The object key of a sealed file.
pub fn object_key(cfg: &UploaderConfig, f: &SealedFile) -> String {
    let gzip = gzip_level(cfg, f).is_some();
    match f.kind {
        FileKind::Marker => cfg.layout.session_marker_key(&f.relative_key),
        FileKind::Events => cfg.layout.event_object_key(&f.relative_key, gzip),
        FileKind::Quarantine => cfg.layout.quarantine_object_key(&f.relative_key, gzip),
    }
}

/// Uploads one file; returns the bytes sent.
pub(crate) async fn upload_file(
    cfg: &UploaderConfig,
    store: &Arc<dyn ObjectStore>,
    f: &SealedFile,
) -> Result<u64, UploadError> {
    let key = object_key(cfg, f);
    let path = ObjectPath::parse(&key).map_err(|e| UploadError::Key {
        key: key.clone(),
        message: e.to_string(),
    })?;
    m::upload_attempt(kind_label(f.kind));
    let store_err = |source| UploadError::Store {
        key: key.clone(),
        source,
    };
    if f.kind == FileKind::Marker {
        store
            .put(&path, PutPayload::new())
            .await
            .map_err(store_err)?;
        return Ok(0);
    }
    put_file(
        store,
        &path,
        &key,
        &f.path,
        gzip_level(cfg, f),
        cfg.part_size,
        // Exactly what the writer recorded as durable; a tail it failed to truncate stays out.
        f.bytes,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Owner;

    fn cfg(compression: Compression) -> UploaderConfig {
        UploaderConfig {
            concurrency: 2,
            compression,
            gzip_level: GzipLevel::default(),
            part_size: 1024,
            layout: ClusterLayout {
                root: "r".into(),
                namespace: "ns".into(),
                cluster: "c".into(),
                owner: Owner::RayCluster,
            },
        }
    }

    #[test]
    fn keys_by_kind() {
        let f = SealedFile {
            path: "/x".into(),
            kind: FileKind::Events,
            relative_key: "s/n/node_events/n-2026-11-22-02-1.jsonl".into(),
            created_unix_nanos: 1,
            bytes: 1,
            compressible: true,
            pending_since: Some(1),
            earlier_run: false,
        };
        assert_eq!(
            object_key(&cfg(Compression::Gzip), &f),
            "r/cluster-history/raycluster/ns/c/s/n/node_events/n-2026-11-22-02-1.jsonl.gz"
        );
        assert_eq!(
            object_key(&cfg(Compression::None), &f),
            "r/cluster-history/raycluster/ns/c/s/n/node_events/n-2026-11-22-02-1.jsonl"
        );
        let m = SealedFile {
            kind: FileKind::Marker,
            relative_key: "s".into(),
            ..f.clone()
        };
        assert_eq!(
            object_key(&cfg(Compression::Gzip), &m),
            "r/cluster-metadata/raycluster/ns_c/s"
        );
        let q = SealedFile {
            kind: FileKind::Quarantine,
            relative_key: "n/bodies/body-1.bin".into(),
            compressible: false,
            ..f
        };
        assert_eq!(
            object_key(&cfg(Compression::Gzip), &q),
            "r/collector-quarantine/raycluster/ns/c/n/bodies/body-1.bin"
        );
    }
}
