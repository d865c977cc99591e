//! The object store the collectors upload to: local files, moto or s3s-fs (started through
//! the test kit), its buckets, and reading every object back.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::http;
use object_store::{ObjectStore, ObjectStoreExt};
use rhc_testkit::services::{try_launch, ServerProcess};

// ------------------------------------------------------------------ storage

#[derive(Clone, Debug)]
pub(crate) enum StoreKind {
    File,
    Moto(PathBuf),
    S3sFs(PathBuf),
}

pub(crate) const S3_KEY: &str = "test";
pub(crate) const S3_SECRET: &str = "testsecret";
pub(crate) const S3_REGION: &str = "us-east-1";
pub(crate) const MOTO_AUTH: &str = "AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0000000000000000000000000000000000000000000000000000000000000000";

/// The object store the collectors upload to.
pub(crate) struct Storage {
    pub(crate) kind: StoreKind,
    /// The S3 server, started through the test kit (none for local files); stopped on drop.
    _server: Option<ServerProcess>,
    pub(crate) port: u16,
    pub(crate) root: PathBuf,
}

impl Storage {
    pub(crate) fn start(kind: StoreKind, dir: &Path) -> Result<Storage, String> {
        let root = dir.join("storage");
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let server = match &kind {
            StoreKind::File => None,
            StoreKind::Moto(program) => {
                let args = |port: u16| {
                    ["-H", "127.0.0.1", "-p", &port.to_string()]
                        .map(String::from)
                        .to_vec()
                };
                Some(try_launch("moto", program.clone(), args, "/")?)
            }
            StoreKind::S3sFs(program) => {
                let data = root.display().to_string();
                let args = move |port: u16| {
                    [
                        "--host",
                        "127.0.0.1",
                        "--port",
                        &port.to_string(),
                        "--access-key",
                        S3_KEY,
                        "--secret-key",
                        S3_SECRET,
                        &data,
                    ]
                    .map(String::from)
                    .to_vec()
                };
                Some(try_launch("s3s-fs", program.clone(), args, "/")?)
            }
        };
        Ok(Storage {
            kind,
            port: server.as_ref().map(ServerProcess::port).unwrap_or(0),
            _server: server,
            root,
        })
    }

    pub(crate) fn can_cut(&self) -> bool {
        !matches!(self.kind, StoreKind::File)
    }

    pub(crate) fn describe(&self) -> String {
        match &self.kind {
            StoreKind::File => "file".into(),
            StoreKind::Moto(_) => "moto (S3)".into(),
            StoreKind::S3sFs(_) => "s3s-fs (S3)".into(),
        }
    }

    pub(crate) fn create_bucket(&self, name: &str) -> Result<(), String> {
        match &self.kind {
            StoreKind::Moto(_) => {
                let r = http(
                    self.port,
                    "PUT",
                    &format!("/{name}"),
                    &[("Authorization", MOTO_AUTH)],
                    b"",
                )
                .map_err(|e| format!("creating bucket {name}: {e}"))?;
                if r.status != 200 {
                    return Err(format!("creating bucket {name}: HTTP {}", r.status));
                }
                Ok(())
            }
            _ => std::fs::create_dir_all(self.root.join(name)).map_err(|e| e.to_string()),
        }
    }

    /// `--storage` value and environment for a collector reaching the store on `port`.
    pub(crate) fn collector_config(
        &self,
        bucket: &str,
        port: u16,
    ) -> (String, Vec<(String, String)>) {
        match &self.kind {
            StoreKind::File => (
                format!("file://{}", self.root.join(bucket).display()),
                vec![],
            ),
            _ => (
                format!("s3://{bucket}"),
                vec![
                    ("AWS_ENDPOINT".into(), format!("http://127.0.0.1:{port}")),
                    ("AWS_ALLOW_HTTP".into(), "true".into()),
                    ("AWS_ACCESS_KEY_ID".into(), S3_KEY.into()),
                    ("AWS_SECRET_ACCESS_KEY".into(), S3_SECRET.into()),
                    ("AWS_REGION".into(), S3_REGION.into()),
                ],
            ),
        }
    }

    pub(crate) fn store(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>, String> {
        match &self.kind {
            StoreKind::File => {
                object_store::local::LocalFileSystem::new_with_prefix(self.root.join(bucket))
                    .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
                    .map_err(|e| e.to_string())
            }
            _ => rhc_testkit::services::moto_client(
                &format!("http://127.0.0.1:{}", self.port),
                bucket,
            ),
        }
    }
}

/// Calls `f` with every object of the bucket (key, bytes as stored; empty objects are not
/// fetched).
pub(crate) fn for_each_object(
    store: &Arc<dyn ObjectStore>,
    mut f: impl FnMut(&str, &[u8]),
) -> Result<usize, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        use futures::TryStreamExt;
        let metas: Vec<_> = store
            .list(None)
            .try_collect()
            .await
            .map_err(|e| format!("listing the bucket: {e}"))?;
        for m in &metas {
            // Empty objects are not fetched: KubeRay's collector writes `<dir>/` markers,
            // which object_store lists without their trailing '/' and cannot GET back.
            if m.size == 0 {
                f(m.location.as_ref(), &[]);
                continue;
            }
            let bytes = store
                .get(&m.location)
                .await
                .map_err(|e| format!("GET {}: {e}", m.location))?
                .bytes()
                .await
                .map_err(|e| format!("GET {}: {e}", m.location))?;
            f(m.location.as_ref(), &bytes);
        }
        Ok(metas.len())
    })
}

pub(crate) fn gunzip_if(key: &str, bytes: &[u8]) -> Result<Vec<u8>, String> {
    if key.ends_with(".gz") {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|e| format!("{key}: not gzip: {e}"))?;
        Ok(out)
    } else {
        Ok(bytes.to_vec())
    }
}
