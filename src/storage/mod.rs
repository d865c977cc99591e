//! Which bucket we write to, and the `object_store` client for it.
//!
//! `--storage` takes a URL (`file://`, `s3://`, `gs://`, `az://`) or a plain path. The KubeRay
//! collector's variables (`STORAGE_BACKEND`, `S3_BUCKET`, `S3_ENDPOINT`, `GCS_BUCKET`,
//! `AZURE_STORAGE_*`, ...) are understood too, so existing manifests keep working.
//! Credentials come only from each cloud's standard chain, read by `object_store`'s
//! `from_env` builders (env, web identity / IRSA, instance metadata, workload identity,
//! managed identity).
//!
//! For S3, GCS and Azure the builder is also the appender's configuration (`append`, `s3`,
//! `gcs`, `azure`): its HTTP connector keeps object_store's client options for the
//! appender's own requests, so every setting read here applies to appends too. [`Configured::identity`] names the bucket for the state
//! kept beside the spool.

pub mod append;
pub mod azure;
pub mod conditions;
pub mod counted;
pub mod drain;
pub mod gcs;
pub mod gzip;
pub mod put;
pub mod s3;
pub mod versioned;
pub mod wire;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, RetryConfig};

/// Errors while reading the storage configuration or building the client.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The URL or variables do not describe a supported bucket.
    #[error("{0}")]
    Invalid(String),
    /// The local directory of a `file://` store could not be created.
    #[error("creating local storage directory {path}: {source}")]
    LocalDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `object_store` refused the configuration.
    #[error("configuring {backend} storage: {source}")]
    Client {
        /// Which backend.
        backend: &'static str,
        /// Its error.
        #[source]
        source: object_store::Error,
    },
}

/// The kind of store and its bucket or directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A local directory (tests, quickstarts, or a mounted volume).
    File(PathBuf),
    /// Amazon S3 or an S3-compatible server (MinIO, ...).
    S3 {
        /// Bucket name.
        bucket: String,
    },
    /// Google Cloud Storage.
    Gcs {
        /// Bucket name.
        bucket: String,
    },
    /// Azure Blob Storage.
    Azure {
        /// Container name.
        container: String,
    },
}

/// A parsed storage location: backend plus root prefix inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageSpec {
    /// Where.
    pub backend: Backend,
    /// Key prefix inside the bucket, no leading or trailing '/'; empty for none.
    pub root: String,
}

impl std::fmt::Display for StorageSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (scheme, name) = match &self.backend {
            Backend::File(p) if self.root.is_empty() => return write!(f, "file://{}", p.display()),
            Backend::File(p) => return write!(f, "file://{}", p.join(&self.root).display()),
            Backend::S3 { bucket } => ("s3", bucket),
            Backend::Gcs { bucket } => ("gs", bucket),
            Backend::Azure { container } => ("az", container),
        };
        if self.root.is_empty() {
            write!(f, "{scheme}://{name}")
        } else {
            write!(f, "{scheme}://{name}/{}", self.root)
        }
    }
}

fn clean_root(path: &str) -> Result<String, StorageError> {
    let root = path.trim_matches('/');
    for seg in root.split('/').filter(|s| !s.is_empty()) {
        if seg == "." || seg == ".." || seg.contains(['\\', '\0']) {
            return Err(StorageError::Invalid(format!(
                "root prefix {path:?} has a '{seg}' segment"
            )));
        }
    }
    Ok(root
        .split('/')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("/"))
}

impl StorageSpec {
    /// Parses `--storage`: `file:///dir`, `s3://bucket[/root]`, `gs://bucket[/root]`,
    /// `az://container[/root]` (also `azure://`), or a plain local path.
    pub fn parse(s: &str) -> Result<StorageSpec, StorageError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(StorageError::Invalid("storage location is empty".into()));
        }
        let Some((scheme, rest)) = s.split_once("://") else {
            return Ok(StorageSpec {
                backend: Backend::File(PathBuf::from(s)),
                root: String::new(),
            });
        };
        if scheme == "file" {
            if !rest.starts_with('/') {
                return Err(StorageError::Invalid(format!(
                    "{s:?}: a file URL needs an absolute path (file:///dir); use a plain path for a relative one"
                )));
            }
            return Ok(StorageSpec {
                backend: Backend::File(PathBuf::from(rest)),
                root: String::new(),
            });
        }
        let (name, path) = rest.split_once('/').unwrap_or((rest, ""));
        if name.is_empty()
            || !name
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'))
        {
            return Err(StorageError::Invalid(format!(
                "{s:?}: {name:?} is not a bucket or container name"
            )));
        }
        let name = name.to_string();
        let backend = match scheme.to_ascii_lowercase().as_str() {
            "s3" | "s3a" => Backend::S3 { bucket: name },
            "gs" | "gcs" => Backend::Gcs { bucket: name },
            "az" | "azure" | "abfs" | "abfss" => Backend::Azure { container: name },
            other => {
                return Err(StorageError::Invalid(format!(
                    "{s:?}: unsupported scheme {other:?} (use file://, s3://, gs:// or az://)"
                )))
            }
        };
        Ok(StorageSpec {
            backend,
            root: clean_root(path)?,
        })
    }

    /// The KubeRay collector's way: `STORAGE_BACKEND` = `s3` | `gcs` | `azureblob` with the
    /// bucket from `S3_BUCKET`, `GCS_BUCKET` or `AZURE_STORAGE_CONTAINER` (KubeRay's defaults).
    pub fn from_kuberay_env(
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<StorageSpec>, StorageError> {
        let Some(kind) = env("STORAGE_BACKEND").filter(|v| !v.trim().is_empty()) else {
            return Ok(None);
        };
        let backend = match kind.trim().to_ascii_lowercase().as_str() {
            "s3" => Backend::S3 {
                bucket: env("S3_BUCKET").unwrap_or_else(|| "ray-historyserver".into()),
            },
            "gcs" => Backend::Gcs {
                bucket: env("GCS_BUCKET").ok_or_else(|| {
                    StorageError::Invalid("STORAGE_BACKEND=gcs needs GCS_BUCKET".into())
                })?,
            },
            "azureblob" | "azure" => Backend::Azure {
                container: env("AZURE_STORAGE_CONTAINER")
                    .unwrap_or_else(|| "ray-historyserver".into()),
            },
            other => {
                return Err(StorageError::Invalid(format!(
                "STORAGE_BACKEND={other:?} is not supported (s3, gcs, azureblob; or use --storage)"
            )))
            }
        };
        Ok(Some(StorageSpec {
            backend,
            root: String::new(),
        }))
    }

    /// Joins an extra root (`STORAGE_ROOT_DIR`) under the URL's own root.
    pub fn with_extra_root(mut self, extra: &str) -> Result<StorageSpec, StorageError> {
        let extra = clean_root(extra)?;
        if !extra.is_empty() {
            self.root = if self.root.is_empty() {
                extra
            } else {
                format!("{}/{}", self.root, extra)
            };
        }
        Ok(self)
    }
}

/// A lookup of configuration variables, like `std::env::var` (tests pass a map).
pub type EnvLookup<'a> = Box<dyn Fn(&str) -> Option<String> + 'a>;

/// Largest `STORAGE_BACKEND_CONFIG_PATH` file read: a handful of settings.
const MAX_CONFIG_FILE_BYTES: u64 = 64 * 1024;

/// The name under which the lookup of [`with_kuberay_config_file`] answers which variables
/// the file set (comma-separated): those win over the SDK's own `AWS_REGION` and
/// `AWS_ENDPOINT[_URL]` too, which the EKS IRSA webhook injects into every container and
/// would otherwise sign every request for another region.
pub const SET_BY_CONFIG_FILE: &str = "RHC_INTERNAL_SET_BY_STORAGE_CONFIG_FILE";

/// KubeRay's `STORAGE_BACKEND_CONFIG_PATH`: a JSON object of backend settings, with KubeRay's
/// field names, read as the variables they stand for (`s3Bucket` is `S3_BUCKET`, and so on),
/// which win over the environment. For S3, as in KubeRay, a non-empty file also replaces the
/// environment's `S3_ENDPOINT`, `S3_REGION`, `S3FORCE_PATH_STYLE` and `S3DISABLE_SSL`.
/// `azureAuthMode` is checked but changes nothing (the credential chain decides). Refused with
/// the reason: a file that cannot be read or is not a JSON object, an unknown field (a typo
/// would send uploads to a default bucket), a value that is not a string or boolean (KubeRay's
/// collector panics on those), Aliyun OSS fields (not supported). Returns the lookup to use
/// instead of `env`.
pub fn with_kuberay_config_file<'a>(
    env: &'a dyn Fn(&str) -> Option<String>,
) -> Result<EnvLookup<'a>, StorageError> {
    let Some(path) = env("STORAGE_BACKEND_CONFIG_PATH").filter(|p| !p.trim().is_empty()) else {
        return Ok(Box::new(env));
    };
    let path = path.trim().to_string();
    let bad =
        |why: String| StorageError::Invalid(format!("STORAGE_BACKEND_CONFIG_PATH={path}: {why}"));
    let mut text = String::new();
    std::fs::File::open(&path)
        .and_then(|f| {
            use std::io::Read;
            f.take(MAX_CONFIG_FILE_BYTES + 1).read_to_string(&mut text)
        })
        .map_err(|e| bad(e.to_string()))?;
    if text.len() as u64 > MAX_CONFIG_FILE_BYTES {
        return Err(bad(format!("larger than {MAX_CONFIG_FILE_BYTES} bytes")));
    }
    let fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a JSON object: {e}")))?;
    let mut vars: std::collections::HashMap<&'static str, String> = Default::default();
    for (k, v) in &fields {
        let var = match k.as_str() {
            "s3Bucket" => "S3_BUCKET",
            "s3Endpoint" => "S3_ENDPOINT",
            "s3Region" => "S3_REGION",
            "s3ForcePathStyle" => "S3FORCE_PATH_STYLE",
            "s3DisableSSL" => "S3DISABLE_SSL",
            "gcsBucket" => "GCS_BUCKET",
            "azureContainer" => "AZURE_STORAGE_CONTAINER",
            "azureConnectionString" => "AZURE_STORAGE_CONNECTION_STRING",
            "azureAccountURL" => "AZURE_STORAGE_ACCOUNT_URL",
            "azureAuthMode" => "AZURE_STORAGE_AUTH_MODE",
            k if k.starts_with("oss") => {
                return Err(bad(format!("{k:?}: Aliyun OSS is not supported")))
            }
            k => return Err(bad(format!("unknown field {k:?}"))),
        };
        let value = match v {
            serde_json::Value::String(s) => s.trim().to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            _ => return Err(bad(format!("{k:?} must be a string"))),
        };
        if var == "AZURE_STORAGE_AUTH_MODE"
            && !matches!(
                value.as_str(),
                "connection_string" | "workload_identity" | "default"
            )
        {
            return Err(bad(format!(
                "azureAuthMode {value:?}: expected connection_string, workload_identity or default"
            )));
        }
        vars.insert(var, value);
    }
    let replaces_s3_env = !fields.is_empty();
    let mut from_file: Vec<&str> = vars.keys().copied().collect();
    from_file.sort_unstable();
    let from_file = from_file.join(",");
    Ok(Box::new(move |k: &str| match vars.get(k) {
        Some(v) => Some(v.clone()),
        None if k == SET_BY_CONFIG_FILE => Some(from_file.clone()),
        None if replaces_s3_env
            && matches!(
                k,
                "S3_ENDPOINT" | "S3_REGION" | "S3FORCE_PATH_STYLE" | "S3DISABLE_SSL"
            ) =>
        {
            None
        }
        None => env(k),
    }))
}

/// Timeouts, set as config keys so options read from the environment (such as
/// `AWS_ALLOW_HTTP`) are kept rather than replaced by a fresh `ClientOptions`.
const CONNECT_TIMEOUT: &str = "5s";
const REQUEST_TIMEOUT_SECS: u64 = 120;

/// Test only: the request timeout of every client in seconds instead of 120, so a test
/// shows in seconds that the log lane's uploads are not cut by it (the lane's own timeout
/// is this plus the largest part at the floor rate). Not a setting.
pub const TEST_REQUEST_TIMEOUT: &str = "RHC_TEST_REQUEST_TIMEOUT_SECS";

/// The request timeout of the clients the log lane sends file bytes with
/// ([`Configured::for_log_bodies`]): `base` (the store's request timeout, 120 s) plus the
/// time a body of `largest_body` bytes takes at `pace::MIN_BODY_RATE`. object_store's timeout covers the
/// whole request, body included, so 120 s cut a 6.1 MB PUT over a 30 kB/s uplink every
/// time (review r42c D3); with this one a request whose body keeps the floor rate is never
/// cut by it, and one that stops is cut by the lane's deadline on its progress (the same
/// allowance, then the stall limit) or by this timeout, whichever comes first.
pub fn log_request_timeout(base: Duration, largest_body: u64) -> Duration {
    base + crate::util::pace::body_allowance(largest_body)
}

/// The request timeout a builder was given (`"<seconds>s"`, as [`configure`] writes it).
fn seconds(v: Option<String>) -> Duration {
    let secs = v
        .and_then(|v| {
            v.trim()
                .strip_suffix('s')
                .and_then(|n| n.parse::<u64>().ok())
        })
        .unwrap_or(REQUEST_TIMEOUT_SECS);
    Duration::from_secs(secs)
}

/// The store and the appender the log lane sends file bytes with
/// ([`Configured::for_log_bodies`]).
pub type LogClients = (Arc<dyn ObjectStore>, Option<append::Appender>);

/// How a remote store's client was built, to build it again with another request timeout
/// ([`Configured::for_log_bodies`]). Its `Debug` names the backend only: a builder holds
/// the credentials.
#[derive(Clone)]
pub enum Rebuild {
    /// S3: its builder (with the appender's copy-part setting).
    S3(Box<AmazonS3Builder>),
    /// GCS: its builder.
    Gcs(Box<GoogleCloudStorageBuilder>),
    /// Azure: its builder.
    Azure(Box<MicrosoftAzureBuilder>),
}

/// Our own upload loop retries forever; the client's retries are kept short so a
/// shutdown deadline is never stuck inside one request.
fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: 2,
        retry_timeout: Duration::from_secs(30),
    }
}

/// Test only: the largest range an S3 append copies as one part, in bytes (S3's 5 GiB
/// otherwise), so the ranged copy is tested without 5 GiB objects. Not a setting.
pub const TEST_MAX_COPY_PART: &str = "RHC_TEST_S3_MAX_COPY_PART";

/// Test only: the most committed blocks an Azure event object grows to before it is written
/// whole as fewer blocks (Azure's 50,000 otherwise), so that bound is tested without 50,000
/// publications. Not a setting.
pub const TEST_AZURE_MAX_BLOCKS: &str = "RHC_TEST_AZURE_MAX_BLOCKS";

/// Test only: the most components a GCS event object grows to before it is written whole
/// (GCS's 1,024 otherwise; at least 2), so that bound is tested without 1,024 publications.
/// Not a setting.
pub const TEST_GCS_MAX_COMPONENTS: &str = "RHC_TEST_GCS_MAX_COMPONENTS";

/// Test only: `1` has the start wait (up to 10 s) for GCS's probe of its JSON API before it
/// publishes anything. The test rig's XML and JSON APIs are two servers (moto and
/// gcsemulator) where GCS has one bucket: a version written through `object_store` while the
/// probe runs would land in the other half. Nothing waits for the probe otherwise
/// (`append::compose`). Not a setting.
pub const TEST_GCS_PROBE_FIRST: &str = "RHC_TEST_GCS_PROBE_FIRST";

fn with_root(url: &str, root: &str) -> String {
    if root.is_empty() {
        url.to_string()
    } else {
        format!("{url}/{root}")
    }
}

fn is_true(v: Option<String>) -> bool {
    matches!(v.as_deref().map(str::trim), Some(v) if v.eq_ignore_ascii_case("true") || v == "1")
}

impl std::fmt::Debug for Rebuild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Rebuild::S3(_) => "Rebuild::S3",
            Rebuild::Gcs(_) => "Rebuild::Gcs",
            Rebuild::Azure(_) => "Rebuild::Azure",
        })
    }
}

/// A store whose configuration has been read and checked, not yet opened.
///
/// [`configure`] reads every variable and builds the cloud client (which does no I/O), so a
/// bad setting is refused before the collector binds or writes anything; [`Configured::open`]
/// is the side effect (creating a local directory).
#[derive(Debug, Clone)]
pub enum Configured {
    /// A local directory, created by [`Configured::open`].
    Local(PathBuf),
    /// A cloud client, ready to use, how it appends to an object, where it can, the
    /// bucket's identity (see [`Configured::identity`]) and how the client was built.
    Remote(
        Arc<dyn ObjectStore>,
        Option<append::Appender>,
        String,
        Rebuild,
    ),
}

/// S3's, GCS's and Azure's longest object key (blob name), in bytes of UTF-8.
pub const MAX_CLOUD_KEY_BYTES: usize = 1024;

/// Linux's longest path handed to a system call (`PATH_MAX`, with its NUL), in bytes: a
/// `file://` object's path is the directory, a `/` and the key.
pub const LOCAL_PATH_MAX: usize = 4095;

/// Linux's longest name of one file (`NAME_MAX`), in bytes.
pub const LOCAL_NAME_MAX: usize = 255;

/// Bytes a `file://` object's name leaves to object_store's staging file: a put (and a
/// multipart upload) is written to `<name>#<n>` beside the object and renamed over it, `n`
/// counting up from 1 past the staging files a killed run left. Four bytes: `#` and three
/// digits.
pub const LOCAL_STAGING_SUFFIX_ROOM: usize = 4;

impl Configured {
    /// How this store appends to an object, where it can (a local directory).
    pub fn appender(&self) -> Result<Option<append::Appender>, StorageError> {
        match self {
            Configured::Local(dir) => {
                append::Appender::local(dir)
                    .map(Some)
                    .map_err(|source| StorageError::Client {
                        backend: "file",
                        source,
                    })
            }
            Configured::Remote(_, appender, _, _) => Ok(appender.clone()),
        }
    }

    /// Why event objects on this store are written whole each publication although the
    /// store could take appends (Azure with a customer-provided key: `azure`), if so.
    pub fn appends_off_reason(&self) -> Option<&'static str> {
        match self {
            Configured::Remote(_, _, _, Rebuild::Azure(b)) => azure::appends_off_reason(b),
            _ => None,
        }
    }

    /// The longest object key this store takes, in bytes. S3, GCS and Azure take keys
    /// (blob names) of at most [`MAX_CLOUD_KEY_BYTES`]; a local directory takes what the
    /// kernel takes as one path, [`LOCAL_PATH_MAX`] bytes with the directory's own path and
    /// its `/`. A key over it is refused by the store on every request, so the log shipper
    /// skips such a file instead of failing it every round.
    pub fn max_key_bytes(&self) -> usize {
        match self {
            Configured::Local(dir) => LOCAL_PATH_MAX.saturating_sub(dir.as_os_str().len() + 1),
            Configured::Remote(..) => MAX_CLOUD_KEY_BYTES,
        }
    }

    /// The longest name (one segment of a key) this store takes, in bytes. A local directory
    /// takes [`LOCAL_NAME_MAX`] less [`LOCAL_STAGING_SUFFIX_ROOM`] (object_store writes the
    /// object as `<name>#<n>` first: a 254- or 255-byte name has no room even for `#1`, and
    /// its put failed with `ENAMETOOLONG` on every try); S3, GCS and Azure limit only the
    /// whole key ([`MAX_CLOUD_KEY_BYTES`]).
    pub fn max_name_bytes(&self) -> usize {
        match self {
            Configured::Local(_) => LOCAL_NAME_MAX - LOCAL_STAGING_SUFFIX_ROOM,
            Configured::Remote(..) => MAX_CLOUD_KEY_BYTES,
        }
    }

    /// Which bucket and prefix this is, as state kept beside the spool (the log ledger)
    /// records it: the directory, or the URL the requests go to (for S3 the endpoint chosen
    /// as object_store chooses it, with the bucket) and the root prefix. The same bucket
    /// name on another server is another bucket.
    pub fn identity(&self) -> &str {
        match self {
            Configured::Local(dir) => dir.to_str().unwrap_or_default(),
            Configured::Remote(_, _, id, _) => id,
        }
    }

    /// The client, and the appender, the log lane sends file bytes with, for a remote
    /// store: the same settings, but a request timeout that lets a body of `largest_body`
    /// bytes go at `pace::MIN_BODY_RATE` ([`log_request_timeout`]). The appender is
    /// `appender` (the lane's, as [`Configured::appender`] gave it) with its uploads on the
    /// new client. `None` for a local directory (no requests).
    pub fn for_log_bodies(
        &self,
        largest_body: u64,
        appender: Option<append::Appender>,
    ) -> Result<Option<LogClients>, StorageError> {
        let Configured::Remote(_, _, _, rebuild) = self else {
            return Ok(None);
        };
        let timeout = |base: Option<String>| {
            format!(
                "{}s",
                log_request_timeout(seconds(base), largest_body).as_secs()
            )
        };
        let key = ClientConfigKey::Timeout;
        let client = |backend: &'static str| move |source| StorageError::Client { backend, source };
        Ok(Some(match rebuild {
            Rebuild::S3(b) => {
                let t = timeout(b.get_config_value(&AmazonS3ConfigKey::Client(key)));
                let s3 = Arc::new(
                    b.as_ref()
                        .clone()
                        .with_config(AmazonS3ConfigKey::Client(key), t)
                        .with_http_connector(counted::CountingConnector)
                        .build()
                        .map_err(client("s3"))?,
                );
                let appender = appender.map(|a| a.with_uploads_on(s3.clone()));
                (s3 as Arc<dyn ObjectStore>, appender)
            }
            Rebuild::Gcs(b) => (
                Arc::new(
                    b.as_ref()
                        .clone()
                        .with_http_connector(counted::CountingConnector)
                        .with_config(
                            GoogleConfigKey::Client(key),
                            timeout(b.get_config_value(&GoogleConfigKey::Client(key))),
                        )
                        .build()
                        .map_err(client("gcs"))?,
                ),
                appender,
            ),
            Rebuild::Azure(b) => (
                Arc::new(
                    b.as_ref()
                        .clone()
                        .with_http_connector(counted::CountingConnector)
                        .with_config(
                            AzureConfigKey::Client(key),
                            timeout(b.get_config_value(&AzureConfigKey::Client(key))),
                        )
                        .build()
                        .map_err(client("azure"))?,
                ),
                appender,
            ),
        }))
    }

    /// The store, creating a local directory first if needed.
    pub fn open(self) -> Result<Arc<dyn ObjectStore>, StorageError> {
        match self {
            Configured::Remote(store, _, _, _) => Ok(store),
            Configured::Local(dir) => {
                std::fs::create_dir_all(&dir).map_err(|source| StorageError::LocalDir {
                    path: dir.clone(),
                    source,
                })?;
                let store = LocalFileSystem::new_with_prefix(&dir).map_err(|source| {
                    StorageError::Client {
                        backend: "file",
                        source,
                    }
                })?;
                Ok(Arc::new(store))
            }
        }
    }
}

/// Builds the object store client for `spec`, with KubeRay's extra variables applied.
pub fn open(
    spec: &StorageSpec,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn ObjectStore>, StorageError> {
    configure(spec, env)?.open()
}

/// Reads the backend's variables and builds its client, without any I/O.
pub fn configure(
    spec: &StorageSpec,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Configured, StorageError> {
    let request_timeout = match env(TEST_REQUEST_TIMEOUT) {
        Some(v) => format!(
            "{}s",
            v.trim()
                .parse::<u64>()
                .map_err(|e| StorageError::Invalid(format!("{TEST_REQUEST_TIMEOUT}={v:?}: {e}")))?
        ),
        None => format!("{REQUEST_TIMEOUT_SECS}s"),
    };
    let request_timeout = request_timeout.as_str();
    match &spec.backend {
        Backend::File(dir) => Ok(Configured::Local(dir.clone())),
        Backend::S3 { bucket } => {
            let mut b = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_config(
                    AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                    CONNECT_TIMEOUT,
                )
                .with_config(
                    AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                    request_timeout,
                )
                .with_retry(retry_config());
            // object_store's own HTTP client, kept for the appender's requests.
            let connector = wire::CapturingConnector::default();
            b = b.with_http_connector(connector.clone());
            let disable_ssl = is_true(env("S3DISABLE_SSL"));
            let set_by_file = env(SET_BY_CONFIG_FILE).unwrap_or_default();
            let from_file = |var: &str| set_by_file.split(',').any(|v| v == var);
            if from_file("S3_ENDPOINT")
                || (env("AWS_ENDPOINT").is_none() && env("AWS_ENDPOINT_URL").is_none())
            {
                if let Some(ep) = env("S3_ENDPOINT").filter(|e| !e.trim().is_empty()) {
                    let ep = ep.trim();
                    let ep = if ep.contains("://") {
                        ep.to_string()
                    } else if disable_ssl {
                        format!("http://{ep}")
                    } else {
                        format!("https://{ep}")
                    };
                    b = b.with_endpoint(ep);
                }
            }
            if disable_ssl {
                b = b.with_allow_http(true);
            }
            if from_file("S3_REGION")
                || (env("AWS_REGION").is_none() && env("AWS_DEFAULT_REGION").is_none())
            {
                if let Some(r) = env("S3_REGION").filter(|r| !r.trim().is_empty()) {
                    b = b.with_region(r.trim());
                }
            }
            if let Some(v) = env("S3FORCE_PATH_STYLE") {
                if v.trim().eq_ignore_ascii_case("false") {
                    b = b.with_virtual_hosted_style_request(true);
                }
            }
            let s3 = Arc::new(b.clone().build().map_err(|source| StorageError::Client {
                backend: "s3",
                source,
            })?);
            let max_copy_part = match env(TEST_MAX_COPY_PART) {
                Some(v) => v.trim().parse::<u64>().map_err(|e| {
                    StorageError::Invalid(format!("{TEST_MAX_COPY_PART}={v:?}: {e}"))
                })?,
                None => append::S3_MAX_COPY_PART,
            };
            let appender = append::S3Appender::new(&b, &connector, s3.clone(), max_copy_part)
                .map_err(|e| StorageError::Invalid(format!("S3 appends: {e}")))?;
            let identity = with_root(appender.bucket_url(), &spec.root);
            Ok(Configured::Remote(
                s3,
                Some(append::Appender::S3(Arc::new(appender))),
                identity,
                Rebuild::S3(Box::new(b)),
            ))
        }
        Backend::Gcs { bucket } => {
            let mut b = GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_config(
                    GoogleConfigKey::Client(ClientConfigKey::ConnectTimeout),
                    CONNECT_TIMEOUT,
                )
                .with_config(
                    GoogleConfigKey::Client(ClientConfigKey::Timeout),
                    request_timeout,
                )
                .with_retry(retry_config());
            // object_store's own HTTP client options, kept for the appender's requests.
            let connector = wire::CapturingConnector::default();
            b = b.with_http_connector(connector.clone());
            let store = Arc::new(b.clone().build().map_err(|source| StorageError::Client {
                backend: "gcs",
                source,
            })?);
            let max_components = match env(TEST_GCS_MAX_COMPONENTS) {
                Some(v) => v.trim().parse::<u64>().map_err(|e| {
                    StorageError::Invalid(format!("{TEST_GCS_MAX_COMPONENTS}={v:?}: {e}"))
                })?,
                None => gcs::MAX_COMPONENTS,
            };
            // Without a wire (a base URL that is no URL), event objects go whole through
            // object_store, as before growth by compose.
            let appender = match gcs::GcsWire::new(&b, &connector, store.clone()) {
                Ok(wire) => Some(append::Appender::Gcs(append::GcsAppender::new(
                    wire,
                    max_components,
                ))),
                Err(e) => {
                    tracing::warn!(error = %e, "GCS's JSON API cannot be addressed from this configuration: event objects are written whole at every publication");
                    None
                }
            };
            Ok(Configured::Remote(
                store,
                appender,
                spec.to_string(),
                Rebuild::Gcs(Box::new(b)),
            ))
        }
        Backend::Azure { container } => {
            let mut b = MicrosoftAzureBuilder::from_env()
                .with_container_name(container)
                .with_config(
                    AzureConfigKey::Client(ClientConfigKey::ConnectTimeout),
                    CONNECT_TIMEOUT,
                )
                .with_config(
                    AzureConfigKey::Client(ClientConfigKey::Timeout),
                    request_timeout,
                )
                .with_retry(retry_config());
            if let Some(cs) =
                env("AZURE_STORAGE_CONNECTION_STRING").filter(|c| !c.trim().is_empty())
            {
                b = apply_connection_string(b, &cs)?;
            } else if let Some(url) =
                env("AZURE_STORAGE_ACCOUNT_URL").filter(|u| !u.trim().is_empty())
            {
                let url = url.trim().trim_end_matches('/');
                let host = url.split("://").nth(1).unwrap_or(url);
                let account = host.split(['.', ':', '/']).next().unwrap_or_default();
                if env("AZURE_STORAGE_ACCOUNT_NAME").is_none() && !account.is_empty() {
                    b = b.with_account(account);
                }
                b = b.with_endpoint(url.to_string());
            }
            let identity = match b.get_config_value(&AzureConfigKey::Endpoint) {
                Some(ep) => with_root(
                    &format!("{}/{container}", ep.trim_end_matches('/')),
                    &spec.root,
                ),
                None => spec.to_string(),
            };
            // object_store's own HTTP client options, kept for the appender's requests.
            let connector = wire::CapturingConnector::default();
            b = b.with_http_connector(connector.clone());
            let store = Arc::new(b.clone().build().map_err(|source| StorageError::Client {
                backend: "azure",
                source,
            })?);
            let appender = match azure::appends_off_reason(&b) {
                Some(_) => None,
                None => {
                    let max_blocks = match env(TEST_AZURE_MAX_BLOCKS) {
                        Some(v) => v.trim().parse::<usize>().map_err(|e| {
                            StorageError::Invalid(format!("{TEST_AZURE_MAX_BLOCKS}={v:?}: {e}"))
                        })?,
                        None => azure::MAX_BLOCKS,
                    };
                    Some(append::Appender::Azure(append::AzureAppender::new(
                        azure::AzureWire::new(&b, &connector, store.clone(), env)
                            .map_err(|e| StorageError::Invalid(format!("Azure appends: {e}")))?,
                        max_blocks.clamp(1, azure::MAX_BLOCKS),
                    )))
                }
            };
            Ok(Configured::Remote(
                store,
                appender,
                identity,
                Rebuild::Azure(Box::new(b)),
            ))
        }
    }
}

/// Applies an Azure connection string (`AccountName=..;AccountKey=..;BlobEndpoint=..`).
fn apply_connection_string(
    mut b: MicrosoftAzureBuilder,
    cs: &str,
) -> Result<MicrosoftAzureBuilder, StorageError> {
    let mut blob_endpoint = None;
    for part in cs.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('=') else {
            return Err(StorageError::Invalid(
                "AZURE_STORAGE_CONNECTION_STRING has a part without '='".into(),
            ));
        };
        match k.trim().to_ascii_lowercase().as_str() {
            "accountname" => b = b.with_account(v),
            "accountkey" => b = b.with_access_key(v),
            "blobendpoint" => blob_endpoint = Some(v.trim_end_matches('/').to_string()),
            "sharedaccesssignature" => {
                let pairs: Vec<(String, String)> = v
                    .trim_start_matches('?')
                    .split('&')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                b = b.with_sas_authorization(pairs);
            }
            "usedevelopmentstorage" if v.eq_ignore_ascii_case("true") => {
                b = b.with_use_emulator(true)
            }
            _ => {}
        }
    }
    if let Some(ep) = blob_endpoint {
        if ep.starts_with("http://") {
            b = b.with_allow_http(true);
        }
        b = b.with_endpoint(ep);
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_urls() {
        let s = StorageSpec::parse("s3://bucket/a/b/").unwrap();
        assert_eq!(
            s.backend,
            Backend::S3 {
                bucket: "bucket".into()
            }
        );
        assert_eq!(s.root, "a/b");
        assert_eq!(s.to_string(), "s3://bucket/a/b");
        assert_eq!(StorageSpec::parse("gs://b").unwrap().root, "");
        assert!(matches!(
            StorageSpec::parse("az://c/r").unwrap().backend,
            Backend::Azure { .. }
        ));
        assert_eq!(
            StorageSpec::parse("./ray-history").unwrap().backend,
            Backend::File("./ray-history".into())
        );
        assert_eq!(
            StorageSpec::parse("file:///tmp/x").unwrap().backend,
            Backend::File("/tmp/x".into())
        );
        for bad in [
            "",
            "ftp://x",
            "s3://",
            "s3://a b",
            "s3://b/../x",
            "file://relative",
        ] {
            assert!(StorageSpec::parse(bad).is_err(), "{bad}");
        }
        let s = StorageSpec::parse("s3://b/r")
            .unwrap()
            .with_extra_root("/x/")
            .unwrap();
        assert_eq!(s.root, "r/x");
    }

    #[test]
    fn kuberay_env() {
        let env = |k: &str| match k {
            "STORAGE_BACKEND" => Some("S3".to_string()),
            "S3_BUCKET" => Some("hist".to_string()),
            _ => None,
        };
        let s = StorageSpec::from_kuberay_env(&env).unwrap().unwrap();
        assert_eq!(
            s.backend,
            Backend::S3 {
                bucket: "hist".into()
            }
        );
        let none = |_: &str| None;
        assert_eq!(StorageSpec::from_kuberay_env(&none).unwrap(), None);
        let bad = |k: &str| (k == "STORAGE_BACKEND").then(|| "aliyunoss".to_string());
        assert!(StorageSpec::from_kuberay_env(&bad).is_err());
        let gcs = |k: &str| (k == "STORAGE_BACKEND").then(|| "gcs".to_string());
        assert!(StorageSpec::from_kuberay_env(&gcs).is_err());
    }
}
