//! Local storage emulators for integration tests and tools.
//!
//! * [`MotoS3`]: `moto_server` (S3, state in memory).
//! * [`Azurite`]: `azurite-blob` (Azure Blob, `--inMemoryPersistence`).
//! * [`FakeGcs`]: `fake-gcs-server` (GCS, `-backend memory`).
//! * [`GcsEmu`]: FullStory's `gcsemulator` (GCS's JSON API only, in memory; it honours
//!   `ifGenerationMatch` on uploads, deletes and compose).
//!
//! `./scripts/install-test-deps.sh` installs them under `.test-deps/`, and
//! `./scripts/test.sh` exports their paths (`RHC_MOTO_SERVER`, `RHC_AZURITE_BLOB`,
//! `RHC_FAKE_GCS`, `RHC_GCSEMU`, `RHC_PYTHON`) plus `RHC_REQUIRE_SERVICES=1`, under which a
//! missing tool is an error. Under a plain `cargo test` the `start()` functions
//! print `skipping: ...` and return `None`, and the test returns early:
//!
//! ```ignore
//! let Some(s3) = MotoS3::start() else { return };
//! ```
//!
//! Every server binds 127.0.0.1 on a free port, writes its stdout and stderr to
//! a log file in its own temp dir (shown in the panic message when it fails to
//! start), and is killed and reaped on `stop()` and on `Drop`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3Builder;
use object_store::ObjectStore;

use crate::http::{http_request, try_http_request, HttpResponse};

/// How long a server may take to answer its first HTTP request.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a helper command (e.g. the Python that creates Azurite containers) may run.
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(60);

/// Azurite's well-known development account.
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known development account key (public, documented by Microsoft).
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A port that was free a moment ago on 127.0.0.1 (the OS picks it), never
/// one this process handed out before (servers started in parallel tests
/// cannot be given the same port).
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind 127.0.0.1:0")
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
    panic!("no new free port on 127.0.0.1 after 100 tries");
}

/// True when `RHC_REQUIRE_SERVICES=1`: a missing tool then fails the test
/// instead of skipping it (`./scripts/test.sh` sets this).
pub fn services_required() -> bool {
    std::env::var("RHC_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// The path in environment variable `var` (e.g. `RHC_MOTO_SERVER`).
///
/// Missing or empty: panics when `RHC_REQUIRE_SERVICES=1`, otherwise returns
/// `None` so the caller can print `skipping: ...` and return. Set but not an
/// existing file: always panics (a broken setup should not look like a skip).
pub fn tool(var: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => {
            let path = PathBuf::from(v);
            assert!(
                path.exists(),
                "{var}={} does not exist; run ./scripts/test.sh (it installs the test tools)",
                path.display()
            );
            Some(path)
        }
        _ => {
            assert!(
                !services_required(),
                "{var} is not set but RHC_REQUIRE_SERVICES=1; run ./scripts/test.sh, \
                 which installs the test tools and sets {var}"
            );
            None
        }
    }
}

/// [`tool`], printing `skipping: ...` when it returns `None`.
fn tool_or_skip(var: &str, what: &str) -> Option<PathBuf> {
    let found = tool(var);
    if found.is_none() {
        eprintln!("skipping: {var} is not set, so {what} is not available (run ./scripts/test.sh)");
    }
    found
}

// ------------------------------------------------------------------ processes

/// A server child process with its log file; killed and reaped on drop.
pub struct ServerProcess {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
    port: u16,
    /// Working directory and log file location.
    dir: tempfile::TempDir,
    log: PathBuf,
    child: Option<Child>,
}

impl ServerProcess {
    fn new(name: &'static str, program: PathBuf, args: Vec<String>, port: u16) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("rhc-{name}-"))
            .tempdir()
            .expect("create temp dir for server");
        let log = dir.path().join(format!("{name}.log"));
        ServerProcess {
            name,
            program,
            args,
            port,
            dir,
            log,
            child: None,
        }
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Spawns the process (appending to the log) and waits until an HTTP GET of
    /// `probe_path` gets any response. Panics with the log on failure.
    fn start(&mut self, probe_path: &str) {
        if let Err(e) = self.try_start(probe_path) {
            panic!("{}", e.message());
        }
    }

    fn try_start(&mut self, probe_path: &str) -> Result<(), StartError> {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open server log");
        let log_err = log.try_clone().expect("clone log handle");
        let child = Command::new(&self.program)
            .args(&self.args)
            .current_dir(self.dir.path())
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({}): {e}",
                    self.name,
                    self.program.display()
                )
            });
        self.child = Some(child);
        self.wait_ready(probe_path)
    }

    fn wait_ready(&mut self, probe_path: &str) -> Result<(), StartError> {
        let url = format!("http://127.0.0.1:{}{}", self.port, probe_path);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.try_wait() {
                self.child = None;
                return Err(StartError::Exited(format!(
                    "{} exited ({status}) before it became ready on port {}; command: {} {}\n--- log ---\n{}",
                    self.name,
                    self.port,
                    self.program.display(),
                    self.args.join(" "),
                    self.log_text()
                )));
            }
            if TcpStream::connect_timeout(&self.addr(), Duration::from_millis(500)).is_ok()
                && try_http_request("GET", &url, &[], b"").is_ok()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(StartError::Timeout(format!(
                    "{} did not answer on port {} within {:?}; command: {} {}\n--- log ---\n{}",
                    self.name,
                    self.port,
                    READY_TIMEOUT,
                    self.program.display(),
                    self.args.join(" "),
                    self.log_text()
                )));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Kills (SIGKILL) and reaps the process; no-op when not running.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The server's log so far (the last 16 KiB).
    fn log_text(&self) -> String {
        let text = std::fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log.display()));
        let max = 16 * 1024;
        if text.len() > max {
            let mut cut = text.len() - max;
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
            format!("...{}", &text[cut..])
        } else {
            text
        }
    }
}

enum StartError {
    /// The process exited (e.g. its port was taken meanwhile): worth a retry.
    Exited(String),
    Timeout(String),
}

impl StartError {
    fn message(&self) -> &str {
        match self {
            StartError::Exited(m) | StartError::Timeout(m) => m,
        }
    }
}

/// Starts `program` with `args(port)` on a fresh free port, trying up to three
/// ports when the process exits during startup. Panics with the log otherwise.
fn launch(
    name: &'static str,
    program: PathBuf,
    args: impl Fn(u16) -> Vec<String>,
    probe_path: &str,
) -> ServerProcess {
    match try_launch(name, program, args, probe_path) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// [`launch`], returning the failure (with the server's log) instead of panicking.
pub fn try_launch(
    name: &'static str,
    program: PathBuf,
    args: impl Fn(u16) -> Vec<String>,
    probe_path: &str,
) -> Result<ServerProcess, String> {
    const ATTEMPTS: usize = 3;
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        let port = free_port();
        let mut process = ServerProcess::new(name, program.clone(), args(port), port);
        match process.try_start(probe_path) {
            Ok(()) => return Ok(process),
            Err(StartError::Exited(m)) => last = m,
            Err(StartError::Timeout(m)) => return Err(m),
        }
    }
    Err(last)
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Output of [`run_with_timeout`].
pub struct CommandOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Makes `cmd` run under an open-file limit of `n` (soft and hard), set between fork and exec.
pub fn limit_open_files(cmd: &mut Command, n: u64) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: n as libc::rlim_t,
                rlim_max: n as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Runs `cmd` to completion with stdout/stderr captured in temp files (no pipe
/// can fill up), killing it after `timeout`. Panics on spawn failure or timeout.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> CommandOutput {
    let mut out = tempfile::tempfile().expect("temp file");
    let mut err = tempfile::tempfile().expect("temp file");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("clone"))
        .stderr(err.try_clone().expect("clone"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for helper command") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} did not finish within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                read_all(&mut out),
                read_all(&mut err)
            );
        }
        thread::sleep(Duration::from_millis(20));
    };
    CommandOutput {
        status,
        stdout: read_all(&mut out),
        stderr: read_all(&mut err),
    }
}

fn read_all(f: &mut File) -> String {
    let mut buf = Vec::new();
    let _ = f.rewind();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

// ------------------------------------------------------------------ S3 (moto)

/// `moto_server` on 127.0.0.1: an in-memory S3. Any credentials are accepted
/// (use access key `test`, secret `test`, region `us-east-1`, path-style URLs).
pub struct MotoS3 {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    pub port: u16,
    process: ServerProcess,
    /// Buckets made through [`MotoS3::create_bucket`], re-created by [`MotoS3::restart`].
    buckets: Mutex<Vec<String>>,
}

/// A syntactically valid SigV4 header with a dummy signature (see [`MotoS3::request`]).
const MOTO_DUMMY_AUTH: &str = "AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0000000000000000000000000000000000000000000000000000000000000000";

/// An object_store client for `bucket` on the moto server at `endpoint`
/// (`http://127.0.0.1:PORT`); moto takes any credentials.
pub fn moto_client(endpoint: &str, bucket: &str) -> Result<Arc<dyn ObjectStore>, String> {
    let store = AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_bucket_name(bucket)
        .with_allow_http(true)
        .with_region(MotoS3::REGION)
        .with_access_key_id(MotoS3::ACCESS_KEY_ID)
        .with_secret_access_key(MotoS3::SECRET_ACCESS_KEY)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(store))
}

impl MotoS3 {
    pub const REGION: &'static str = "us-east-1";
    pub const ACCESS_KEY_ID: &'static str = "test";
    pub const SECRET_ACCESS_KEY: &'static str = "test";

    /// Starts moto, or returns `None` (after printing `skipping: ...`) when
    /// `RHC_MOTO_SERVER` is unset and services are not required.
    pub fn start() -> Option<Self> {
        let program = tool_or_skip("RHC_MOTO_SERVER", "the S3 emulator (moto)")?;
        match Self::try_start_program(program) {
            Ok(m) => Some(m),
            Err(e) => panic!("{e}"),
        }
    }

    /// Starts the `moto_server` at `program`; the error carries its log.
    pub fn try_start_program(program: PathBuf) -> Result<Self, String> {
        let args = |port: u16| strings(&["-H", "127.0.0.1", "-p", &port.to_string()]);
        let process = try_launch("moto", program, args, "/")?;
        let port = process.port;
        Ok(MotoS3 {
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            process,
            buckets: Mutex::new(Vec::new()),
        })
    }

    /// Starts moto with bucket `bucket` already holding every file under `dir` (key: the
    /// path below `dir`), put into moto's memory before it serves (`testkit/moto_seeded.py`):
    /// tens of thousands of objects in about a second, where PUTs over HTTP take minutes.
    /// `None` as [`MotoS3::start`].
    pub fn start_seeded(bucket: &str, dir: &Path) -> Option<Self> {
        let program = tool_or_skip("RHC_MOTO_SERVER", "the S3 emulator (moto)")?;
        // The venv's interpreter, beside its moto_server script.
        let python = program.with_file_name("python");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("moto_seeded.py");
        let fixed = strings(&[
            &script.to_string_lossy(),
            "--seed-dir",
            &dir.to_string_lossy(),
            "--bucket",
            bucket,
        ]);
        let args = |port: u16| {
            let mut args = fixed.clone();
            args.extend(strings(&["-H", "127.0.0.1", "-p", &port.to_string()]));
            args
        };
        let process = try_launch("moto", python, args, "/").unwrap_or_else(|e| panic!("{e}"));
        let port = process.port;
        Some(MotoS3 {
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            process,
            buckets: Mutex::new(Vec::new()),
        })
    }

    /// The environment that points the collector (object_store's S3 client) at this server.
    pub fn collector_env(&self) -> [(&'static str, &str); 5] {
        [
            ("AWS_ENDPOINT", self.endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", Self::ACCESS_KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", Self::SECRET_ACCESS_KEY),
            ("AWS_REGION", Self::REGION),
        ]
    }

    /// An object_store client for `bucket` on this server, to read back what the collector
    /// wrote.
    pub fn store(&self, bucket: &str) -> Arc<dyn ObjectStore> {
        moto_client(&self.endpoint, bucket).expect("S3 client for moto")
    }

    /// Kills the server (an outage). All S3 state is lost.
    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Starts the server again on the same port (stopping it first if it is
    /// still running) and re-creates the buckets made with `create_bucket`
    /// (empty: moto keeps objects only in memory).
    pub fn restart(&mut self) {
        self.process.stop();
        self.process.start("/");
        let buckets = self.buckets.lock().unwrap().clone();
        for bucket in &buckets {
            self.put_bucket(bucket);
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.process.child.is_some() && self.process.try_wait().is_none()
    }

    /// A request to moto with a dummy SigV4 `Authorization` header: moto does
    /// not check signatures, but treats requests without one as anonymous and
    /// refuses e.g. object GETs (403). `path_and_query` starts with `/`.
    pub fn request(&self, method: &str, path_and_query: &str, body: &[u8]) -> (u16, Vec<u8>) {
        http_request(
            method,
            &format!("{}{path_and_query}", self.endpoint),
            &[("Authorization", MOTO_DUMMY_AUTH)],
            body,
        )
    }

    /// Creates bucket `name` (`PUT /<name>`) and remembers it for [`MotoS3::restart`].
    pub fn create_bucket(&self, name: &str) {
        self.put_bucket(name);
        let mut buckets = self.buckets.lock().unwrap();
        if !buckets.iter().any(|b| b == name) {
            buckets.push(name.to_string());
        }
    }

    fn put_bucket(&self, name: &str) {
        let (status, body) = self.request("PUT", &format!("/{name}"), b"");
        assert_eq!(
            status,
            200,
            "moto: PUT /{name} answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// Stores an object (path-style `PUT /<bucket>/<key>`).
    pub fn put_object(&self, bucket: &str, key: &str, bytes: &[u8]) {
        let path = format!("/{bucket}/{}", percent_encode(key, true));
        let (status, body) = self.request("PUT", &path, bytes);
        assert_eq!(
            status,
            200,
            "moto: PUT {path} answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// The object's bytes, or `None` on 404.
    pub fn get_object(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let path = format!("/{bucket}/{}", percent_encode(key, true));
        let (status, body) = self.request("GET", &path, b"");
        match status {
            200 => Some(body),
            404 => None,
            _ => panic!(
                "moto: GET {path} answered {status}: {}",
                String::from_utf8_lossy(&body)
            ),
        }
    }

    /// The object's metadata answer (`HEAD`): status and headers.
    pub fn head_object(&self, bucket: &str, key: &str) -> HttpResponse {
        let path = format!("/{bucket}/{}", percent_encode(key, true));
        try_http_request(
            "HEAD",
            &format!("{}{path}", self.endpoint),
            &[("Authorization", MOTO_DUMMY_AUTH)],
            b"",
        )
        .unwrap_or_else(|e| panic!("moto: HEAD {path}: {e}"))
    }

    /// Keys under `prefix` in `bucket` (ListObjectsV2, first 1000 keys).
    pub fn list_keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let path = format!(
            "/{bucket}?list-type=2&prefix={}",
            percent_encode(prefix, false)
        );
        let (status, body) = self.request("GET", &path, b"");
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, 200, "moto: GET {path} answered {status}: {body}");
        body.split("<Key>")
            .skip(1)
            .filter_map(|s| s.split_once("</Key>").map(|(k, _)| xml_unescape(k)))
            .collect()
    }

    /// Drops all moto state (`POST /moto-api/reset`) and forgets the buckets.
    pub fn reset(&self) {
        let (status, body) = self.request("POST", "/moto-api/reset", b"");
        assert_eq!(
            status,
            200,
            "moto reset: {}",
            String::from_utf8_lossy(&body)
        );
        self.buckets.lock().unwrap().clear();
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.process.log_text()
    }
}

// ------------------------------------------------------------------ Azure (Azurite)

/// `azurite-blob` on 127.0.0.1 with in-memory storage, account
/// [`AZURITE_ACCOUNT`] / key [`AZURITE_KEY`], path-style URLs
/// (`http://127.0.0.1:PORT/devstoreaccount1/<container>/<blob>`).
pub struct Azurite {
    /// `http://127.0.0.1:PORT/devstoreaccount1`
    pub blob_endpoint: String,
    pub port: u16,
    pub account: &'static str,
    pub key: &'static str,
    python: PathBuf,
    process: ServerProcess,
    /// Containers made through [`Azurite::create_container`], re-created by [`Azurite::restart`].
    containers: Mutex<Vec<String>>,
}

impl Azurite {
    /// Starts Azurite, or returns `None` (after printing `skipping: ...`) when
    /// `RHC_AZURITE_BLOB` or `RHC_PYTHON` is unset and services are not required.
    pub fn start() -> Option<Self> {
        let program = tool_or_skip("RHC_AZURITE_BLOB", "the Azure Blob emulator (Azurite)")?;
        let python = tool_or_skip("RHC_PYTHON", "the Python used to create Azurite containers")?;
        let args = |port: u16| {
            strings(&[
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &port.to_string(),
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--loose",
                // Azurite sends usage telemetry unless told not to; tests stay on loopback.
                "--disableTelemetry",
            ])
        };
        // Any HTTP answer means it is up (`GET /` is a 400).
        let process = launch("azurite", program, args, "/");
        let port = process.port;
        Some(Azurite {
            blob_endpoint: format!("http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"),
            port,
            account: AZURITE_ACCOUNT,
            key: AZURITE_KEY,
            python,
            process,
            containers: Mutex::new(Vec::new()),
        })
    }

    /// Kills the server (an outage). All state is lost.
    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Starts the server again on the same port (stopping it first if needed)
    /// and re-creates the containers made with `create_container` (empty).
    pub fn restart(&mut self) {
        self.process.stop();
        self.process.start("/");
        let containers = self.containers.lock().unwrap().clone();
        for container in &containers {
            self.make_container(container);
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.process.child.is_some() && self.process.try_wait().is_none()
    }

    /// Connection string for Azure SDKs.
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={};AccountKey={};BlobEndpoint={};",
            self.account, self.key, self.blob_endpoint
        )
    }

    /// Creates `name` (ok if it exists) with the Python Azure SDK (`$RHC_PYTHON`)
    /// and remembers it for [`Azurite::restart`].
    pub fn create_container(&self, name: &str) {
        self.make_container(name);
        let mut containers = self.containers.lock().unwrap();
        if !containers.iter().any(|c| c == name) {
            containers.push(name.to_string());
        }
    }

    fn make_container(&self, name: &str) {
        const SCRIPT: &str = r#"
import sys
from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient
svc = BlobServiceClient.from_connection_string(
    sys.argv[1], retry_total=0, connection_timeout=5, read_timeout=20)
try:
    svc.create_container(sys.argv[2])
except ResourceExistsError:
    pass
"#;
        let out = run_with_timeout(
            Command::new(&self.python)
                .arg("-c")
                .arg(SCRIPT)
                .arg(self.connection_string())
                .arg(name)
                .env("NO_PROXY", "127.0.0.1,localhost")
                .env("no_proxy", "127.0.0.1,localhost"),
            HELPER_TIMEOUT,
        );
        assert!(
            out.status.success(),
            "creating Azurite container {name:?} failed ({}):\n{}{}\n--- azurite log ---\n{}",
            out.status,
            out.stdout,
            out.stderr,
            self.process.log_text()
        );
    }

    /// Puts `body` as an uncommitted block of `blob` in `container` under the block id
    /// `raw_id` (before base64: the SDK encodes it), with the Python Azure SDK: a block
    /// another writer left uncommitted (a killed upload).
    pub fn stage_block(&self, container: &str, blob: &str, raw_id: &str, body: &[u8]) {
        const SCRIPT: &str = r#"
import sys
from azure.storage.blob import BlobServiceClient
svc = BlobServiceClient.from_connection_string(
    sys.argv[1], retry_total=0, connection_timeout=5, read_timeout=20)
b = svc.get_blob_client(sys.argv[2], sys.argv[3])
b.stage_block(sys.argv[4], bytes.fromhex(sys.argv[5]))
"#;
        let hex: String = body.iter().map(|x| format!("{x:02x}")).collect();
        let out = run_with_timeout(
            Command::new(&self.python)
                .arg("-c")
                .arg(SCRIPT)
                .arg(self.connection_string())
                .arg(container)
                .arg(blob)
                .arg(raw_id)
                .arg(hex)
                .env("NO_PROXY", "127.0.0.1,localhost")
                .env("no_proxy", "127.0.0.1,localhost"),
            HELPER_TIMEOUT,
        );
        assert!(
            out.status.success(),
            "staging a block on {container}/{blob} failed ({}):\n{}{}",
            out.status,
            out.stdout,
            out.stderr
        );
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.process.log_text()
    }

    /// An object_store client of `container`, straight to the server (not through a proxy).
    pub fn store(&self, container: &str) -> std::sync::Arc<dyn ObjectStore> {
        std::sync::Arc::new(
            object_store::azure::MicrosoftAzureBuilder::new()
                .with_endpoint(self.blob_endpoint.clone())
                .with_account(self.account)
                .with_access_key(self.key)
                .with_container_name(container)
                .with_allow_http(true)
                .build()
                .expect("an Azurite client"),
        )
    }

    /// A connection string whose blob endpoint is `base` (e.g. a proxy in front of this
    /// server: `http://127.0.0.1:PORT`) with this account's path.
    pub fn connection_string_via(&self, base: &str) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={};AccountKey={};BlobEndpoint={}/{};",
            self.account, self.key, base, self.account
        )
    }
}

// ------------------------------------------------------------------ GCS (fake-gcs-server)

/// `fake-gcs-server` on 127.0.0.1 with the in-memory backend, no auth.
///
/// Its JSON API is under `/storage/v1` and `/upload/storage/v1`; its XML API
/// (`GET`/`HEAD`/`DELETE /<bucket>/<object>`, `GET /<bucket>?list-type=2`)
/// answers path-style requests because `-public-host` is `127.0.0.1:PORT`.
///
/// fake-gcs-server 1.54 has no XML upload: `PUT /<bucket>/<object>`, which is
/// what `object_store`'s GCS `put` sends, answers 400 "invalid uploadType". So
/// object_store can read, list and delete here (objects made with
/// [`FakeGcs::put_object`], which uses the JSON upload API) but cannot write;
/// the GCS upload path is not testable against this server.
pub struct FakeGcs {
    /// The server itself: `http://127.0.0.1:PORT` (object_store's `gcs_base_url`).
    pub endpoint: String,
    pub port: u16,
    process: ServerProcess,
    /// Buckets made through [`FakeGcs::create_bucket`], re-created by [`FakeGcs::restart`].
    buckets: Mutex<Vec<String>>,
}

impl FakeGcs {
    /// Starts fake-gcs-server, or returns `None` (after printing `skipping: ...`)
    /// when `RHC_FAKE_GCS` is unset and services are not required.
    pub fn start() -> Option<Self> {
        let program = tool_or_skip("RHC_FAKE_GCS", "the GCS emulator (fake-gcs-server)")?;
        let args = |port: u16| {
            strings(&[
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                &port.to_string(),
                "-backend",
                "memory",
                // Path-style XML API requests are routed only when Host == public-host.
                "-public-host",
                &format!("127.0.0.1:{port}"),
                "-external-url",
                &format!("http://127.0.0.1:{port}"),
            ])
        };
        let process = launch("fake-gcs-server", program, args, "/storage/v1/b");
        let port = process.port;
        Some(FakeGcs {
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            process,
            buckets: Mutex::new(Vec::new()),
        })
    }

    /// Kills the server (an outage). All state is lost.
    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Starts the server again on the same port (stopping it first if needed)
    /// and re-creates the buckets made with `create_bucket` (empty).
    pub fn restart(&mut self) {
        self.process.stop();
        self.process.start("/storage/v1/b");
        let buckets = self.buckets.lock().unwrap().clone();
        for bucket in &buckets {
            self.post_bucket(bucket);
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.process.child.is_some() && self.process.try_wait().is_none()
    }

    /// Creates a bucket via the JSON API (`POST /storage/v1/b`) and remembers
    /// it for [`FakeGcs::restart`].
    pub fn create_bucket(&self, name: &str) {
        self.post_bucket(name);
        let mut buckets = self.buckets.lock().unwrap();
        if !buckets.iter().any(|b| b == name) {
            buckets.push(name.to_string());
        }
    }

    fn post_bucket(&self, name: &str) {
        let body = format!("{{\"name\":{}}}", json_string(name));
        let (status, resp) = http_request(
            "POST",
            &format!("{}/storage/v1/b", self.endpoint),
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        );
        assert_eq!(
            status,
            200,
            "fake-gcs-server: create bucket {name:?} answered {status}: {}",
            String::from_utf8_lossy(&resp)
        );
    }

    /// Uploads an object via the JSON media upload API.
    pub fn put_object(&self, bucket: &str, name: &str, bytes: &[u8]) {
        let url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=media&name={}",
            self.endpoint,
            percent_encode(bucket, false),
            percent_encode(name, false)
        );
        let (status, resp) = http_request(
            "POST",
            &url,
            &[("Content-Type", "application/octet-stream")],
            bytes,
        );
        assert_eq!(
            status,
            200,
            "fake-gcs-server: upload {bucket}/{name} answered {status}: {}",
            String::from_utf8_lossy(&resp)
        );
    }

    /// The object's bytes via the JSON API (`?alt=media`), or `None` on 404.
    pub fn get_object(&self, bucket: &str, name: &str) -> Option<Vec<u8>> {
        let url = format!(
            "{}/storage/v1/b/{}/o/{}?alt=media",
            self.endpoint,
            percent_encode(bucket, false),
            percent_encode(name, false)
        );
        let (status, body) = http_request("GET", &url, &[], b"");
        match status {
            200 => Some(body),
            404 => None,
            _ => panic!(
                "fake-gcs-server: GET {url} answered {status}: {}",
                String::from_utf8_lossy(&body)
            ),
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.process.log_text()
    }
}

/// FullStory's GCS emulator (`gcsemulator`, Go module `github.com/fullstorydev/emulators/storage`):
/// GCS's JSON API only (XML requests, which `object_store` sends, are refused), in memory.
/// Unlike fake-gcs-server it checks `ifGenerationMatch` on uploads, deletes and compose (the
/// destination's and each source's `objectPreconditions`), and gives every write a new
/// generation, so a compose onto a changed object is refused (412) here as on GCS.
/// Buckets are made by the first upload into them.
pub struct GcsEmu {
    /// `http://127.0.0.1:PORT` (`GOOGLE_BASE_URL`).
    pub endpoint: String,
    pub port: u16,
    process: ServerProcess,
    /// Its JSON API as a client (also through `Deref`).
    pub json: GcsJson,
}

/// A client of a GCS JSON API at `endpoint` (a [`GcsEmu`]'s), for tests to read and write
/// objects as another writer would; cheap to clone and send to a thread.
#[derive(Debug, Clone)]
pub struct GcsJson {
    pub endpoint: String,
}

impl std::ops::Deref for GcsEmu {
    type Target = GcsJson;
    fn deref(&self) -> &GcsJson {
        &self.json
    }
}

/// An object as [`GcsEmu::list`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcsListed {
    pub name: String,
    pub generation: u64,
    pub size: u64,
}

impl GcsEmu {
    /// Starts gcsemulator, or returns `None` (after printing `skipping: ...`) when
    /// `RHC_GCSEMU` is unset and services are not required.
    pub fn start() -> Option<Self> {
        let program = tool_or_skip("RHC_GCSEMU", "the GCS emulator (gcsemulator)")?;
        let args = |port: u16| {
            strings(&[
                "-host",
                "127.0.0.1",
                "-port",
                &port.to_string(),
                "-verbose=false",
            ])
        };
        let process = launch("gcsemulator", program, args, "/storage/v1/b");
        let port = process.port;
        let endpoint = format!("http://127.0.0.1:{port}");
        Some(GcsEmu {
            json: GcsJson {
                endpoint: endpoint.clone(),
            },
            endpoint,
            port,
            process,
        })
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.process.log_text()
    }
}

impl GcsJson {
    /// The objects of `bucket` whose names start with `prefix`.
    pub fn list(&self, bucket: &str, prefix: &str) -> Vec<GcsListed> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let mut url = format!(
                "{}/storage/v1/b/{}/o?prefix={}",
                self.endpoint,
                percent_encode(bucket, false),
                percent_encode(prefix, false)
            );
            if !token.is_empty() {
                url.push_str(&format!("&pageToken={}", percent_encode(&token, false)));
            }
            let (status, body) = http_request("GET", &url, &[], b"");
            if status == 404 {
                return out;
            }
            assert_eq!(status, 200, "GET {url}: {}", String::from_utf8_lossy(&body));
            let v: serde_json::Value = serde_json::from_slice(&body).expect("a listing");
            for item in v["items"].as_array().into_iter().flatten() {
                let num = |k: &str| {
                    item[k]
                        .as_str()
                        .and_then(|s| s.parse().ok())
                        .or_else(|| item[k].as_u64())
                        .unwrap_or(0)
                };
                out.push(GcsListed {
                    name: item["name"].as_str().unwrap_or_default().to_string(),
                    generation: num("generation"),
                    size: num("size"),
                });
            }
            match v["nextPageToken"].as_str() {
                Some(t) if !t.is_empty() => token = t.to_string(),
                _ => return out,
            }
        }
    }

    /// The object's bytes, or `None` when there is none.
    pub fn get(&self, bucket: &str, name: &str) -> Option<Vec<u8>> {
        let url = format!(
            "{}/storage/v1/b/{}/o/{}?alt=media",
            self.endpoint,
            percent_encode(bucket, false),
            percent_encode(name, false)
        );
        let (status, body) = http_request("GET", &url, &[], b"");
        match status {
            200 => Some(body),
            404 => None,
            _ => panic!(
                "GET {url} answered {status}: {}",
                String::from_utf8_lossy(&body)
            ),
        }
    }

    /// Every object of `bucket` under `prefix`, with its bytes.
    pub fn objects(
        &self,
        bucket: &str,
        prefix: &str,
    ) -> std::collections::BTreeMap<String, Vec<u8>> {
        self.list(bucket, prefix)
            .into_iter()
            .filter_map(|o| Some((o.name.clone(), self.get(bucket, &o.name)?)))
            .collect()
    }

    /// Uploads `bytes` as the object (a media upload, unconditional), as another writer.
    pub fn put(&self, bucket: &str, name: &str, bytes: &[u8]) {
        let url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=media&name={}",
            self.endpoint,
            percent_encode(bucket, false),
            percent_encode(name, false)
        );
        let (status, resp) = http_request(
            "POST",
            &url,
            &[("Content-Type", "application/octet-stream")],
            bytes,
        );
        assert_eq!(
            status,
            200,
            "gcsemulator: upload {bucket}/{name} answered {status}: {}",
            String::from_utf8_lossy(&resp)
        );
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters (and `/`
/// when `keep_slash`), for URL paths and query values.
pub fn percent_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Undoes the five predefined XML entities.
fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// A JSON string literal for `s`.
fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
