//! moto behind the recording, fault-injecting proxy, one bucket, a Ray session tree, and the
//! real collector shipping that session's logs to the bucket through the proxy: the set-up of
//! the S3 log-append tests, built once here so that each of those tests reads as its scenario
//! and its assertions.
//!
//! A [`MotoRig`] holds moto, the [`FaultProxy`] in front of it, a bucket created on moto, and a
//! temporary directory with a Ray temp root (`ray/`) holding one active session
//! ([`SESSION`], whose `raylet.out` names [`NODE`]); every collector it starts
//! ([`MotoRig::collector`]) reaches the bucket only through the proxy, so a test can record
//! each request and inject faults. moto, the proxy and the directory go when the rig is
//! dropped; the collectors when theirs are. [`MotoRig::new`] is `None` when moto is not
//! installed (and `RHC_REQUIRE_SERVICES` does not require it): the test is skipped.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::collector::Collector;
use crate::fault_proxy::FaultProxy;
use crate::http::HttpResponse;
use crate::ray_logs::RayRoot;
use crate::services::MotoS3;

/// The node the rig's session belongs to (its `raylet.out` says so).
pub const NODE: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
/// The rig's one session, `session_latest` pointing at it.
pub const SESSION: &str = "session_2026-11-22_02-56-13_816177_24314";
/// The log upload interval of a rig's collector unless the test passes its own.
const LOG_UPLOAD_INTERVAL: &str = "1s";
/// How long [`MotoRig::wait_equal`] waits for an object to equal its file.
const EQUAL_LIMIT: Duration = Duration::from_secs(40);

/// moto, the proxy in front of it, a bucket, and a Ray session tree.
pub struct MotoRig {
    pub s3: MotoS3,
    pub proxy: FaultProxy,
    pub tmp: tempfile::TempDir,
    /// The bucket the collectors write to.
    pub bucket: String,
    /// `--cluster-name` of the collectors.
    pub cluster: String,
    ray: RayRoot,
}

impl MotoRig {
    /// Starts moto and the proxy, creates `bucket`, and the session tree; `None` when moto is
    /// not installed (the test is skipped).
    pub fn new(bucket: &str, cluster: &str) -> Option<MotoRig> {
        let rig = MotoRig::without_session(bucket, cluster)?;
        RayRoot::new(rig.ray_root()).session(SESSION, NODE, true);
        Some(rig)
    }

    /// [`MotoRig::new`] without the Ray session, nor even the Ray temp root's directory: for
    /// tests of the events path, whose collectors must ship no log.
    pub fn without_session(bucket: &str, cluster: &str) -> Option<MotoRig> {
        let s3 = MotoS3::start()?;
        s3.create_bucket(bucket);
        let proxy = FaultProxy::start(&format!("127.0.0.1:{}", s3.port))
            .unwrap_or_else(|e| panic!("starting the fault proxy: {e}"));
        let tmp = tempfile::tempdir().expect("a temporary directory");
        let ray = RayRoot {
            root: tmp.path().join("ray"),
        };
        Some(MotoRig {
            s3,
            proxy,
            tmp,
            bucket: bucket.to_string(),
            cluster: cluster.to_string(),
            ray,
        })
    }

    /// Every object of the bucket (key → bytes), read straight from moto (not through the
    /// proxy); an object listed and gone before it is read is not in the answer.
    pub fn objects(&self) -> std::collections::BTreeMap<String, Vec<u8>> {
        let mut out = std::collections::BTreeMap::new();
        for k in self.s3.list_keys(&self.bucket, "") {
            if let Some(b) = self.s3.get_object(&self.bucket, &k) {
                out.insert(k, b);
            }
        }
        out
    }

    /// The Ray temp root (`--ray-tmp-dir`).
    pub fn ray_root(&self) -> &Path {
        &self.ray.root
    }

    /// The session's `logs/` directory, where the tests write the files to ship.
    pub fn logs(&self) -> PathBuf {
        self.ray.logs(SESSION)
    }

    /// The key of the log `name` (relative to `logs/`) in the bucket.
    pub fn key(&self, name: &str) -> String {
        format!(
            "cluster-history/raycluster/default/{}/{SESSION}/{NODE}/logs/{name}",
            self.cluster
        )
    }

    /// The collector's environment: object_store pointed at the proxy with moto's
    /// credentials, plus `extra` (which wins over these), sorted.
    pub fn env(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let url = self.proxy.url();
        let mut env: Vec<(String, String)> = [
            ("AWS_ENDPOINT", url.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", MotoS3::ACCESS_KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", MotoS3::SECRET_ACCESS_KEY),
            ("AWS_REGION", MotoS3::REGION),
        ]
        .iter()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
        .chain(extra.iter())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        env.sort();
        env
    }

    /// A collector of this rig to configure, then [`RigCollector::start`]: spool `spool/`,
    /// the rig's bucket, the rig's environment, logs shipped every second.
    pub fn collector(&self) -> RigCollector<'_> {
        RigCollector {
            rig: self,
            spool: "spool".into(),
            bucket: self.bucket.clone(),
            defaults: true,
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// The object of the log `name` in the rig's bucket; `None` when missing, or when moto
    /// (loaded by parallel tests) answers anything but 200 or 404 this time (callers poll).
    pub fn object(&self, name: &str) -> Option<Vec<u8>> {
        self.object_in(&self.bucket, name)
    }

    /// [`MotoRig::object`] in another bucket of the same moto.
    pub fn object_in(&self, bucket: &str, name: &str) -> Option<Vec<u8>> {
        let path = format!("/{bucket}/{}", self.key(name));
        match self.s3.request("GET", &path, b"") {
            (200, body) => Some(body),
            (404, _) => None,
            (status, body) => {
                eprintln!(
                    "moto: GET {path} answered {status}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(300)])
                );
                None
            }
        }
    }

    /// Appends `bytes` to the log `name` (relative to `logs/`), creating it, as Ray writes.
    pub fn append(&self, name: &str, bytes: &[u8]) {
        crate::collector::append_to(&self.logs().join(name), bytes);
    }

    /// The file of the log `name`.
    pub fn file(&self, name: &str) -> Vec<u8> {
        let path = self.logs().join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }

    /// Waits (up to 40 s) until the object of `name` equals the file; panics with `what` and
    /// the collector's log otherwise.
    pub fn wait_equal(&self, name: &str, c: &Collector, what: &str) {
        let deadline = Instant::now() + EQUAL_LIMIT;
        loop {
            let want = self.file(name);
            let got = self.object(name);
            if got.as_deref() == Some(&want[..]) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {name} not in the bucket as the file ({:?} bytes vs {})\n{}",
                got.map(|g| g.len()),
                want.len(),
                c.log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The keys of the incomplete multipart uploads in the bucket.
    pub fn open_uploads(&self) -> Vec<String> {
        let (status, body) = self
            .s3
            .request("GET", &format!("/{}?uploads", self.bucket), b"");
        let body = String::from_utf8_lossy(&body).into_owned();
        assert_eq!(status, 200, "{body}");
        body.split("<Key>")
            .skip(1)
            .filter_map(|s| s.split_once("</Key>").map(|(k, _)| k.to_string()))
            .collect()
    }

    /// The headers of a HEAD of the log `name`'s object (names lowercased); panics unless 200.
    pub fn head(&self, name: &str) -> Vec<(String, String)> {
        let r: HttpResponse = self.s3.head_object(&self.bucket, &self.key(name));
        assert_eq!(r.status, 200, "HEAD {name}");
        r.headers
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect()
    }

    /// Sets the bucket's versioning to `status` (`Enabled`, `Suspended`); panics unless 200.
    pub fn set_versioning(&self, status: &str) {
        let body = format!(
            "<VersioningConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <Status>{status}</Status></VersioningConfiguration>"
        );
        let (code, answer) = self.s3.request(
            "PUT",
            &format!("/{}?versioning", self.bucket),
            body.as_bytes(),
        );
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&answer));
    }
}

/// A collector of a [`MotoRig`] being configured.
pub struct RigCollector<'a> {
    rig: &'a MotoRig,
    spool: String,
    bucket: String,
    /// `--cluster-name` and the 1 s log interval (off: only `--storage` and `--ray-tmp-dir`).
    defaults: bool,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl RigCollector<'_> {
    /// Flags after the rig's own (`--log-upload-interval` here replaces the rig's 1 s).
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Only `--storage`, `--ray-tmp-dir` and `args`: no cluster name, no log interval (the
    /// collector's defaults).
    pub fn only(mut self, args: &[&str]) -> Self {
        self.defaults = false;
        self.args = args.iter().map(|a| a.to_string()).collect();
        self
    }

    /// Environment variables over the rig's (`{proxy}` and `{moto}` in a value become the
    /// proxy's and moto's URLs).
    pub fn env(mut self, env: &[(&str, &str)]) -> Self {
        let (proxy, moto) = (self.rig.proxy.url(), self.rig.s3.endpoint.clone());
        self.env.extend(env.iter().map(|(k, v)| {
            (
                k.to_string(),
                v.replace("{proxy}", &proxy).replace("{moto}", &moto),
            )
        }));
        self
    }

    /// Another bucket of the same moto (`s3://<bucket>`).
    pub fn bucket(mut self, bucket: &str) -> Self {
        self.bucket = bucket.to_string();
        self
    }

    /// The spool directory's name in the rig's directory (`spool` unless given).
    pub fn spool(mut self, name: &str) -> Self {
        self.spool = name.to_string();
        self
    }

    /// Starts it and waits until it is ready (panics with its log otherwise).
    pub fn start(self) -> Collector {
        let storage = format!("s3://{}", self.bucket);
        let ray = self
            .rig
            .ray_root()
            .to_str()
            .expect("a UTF-8 path")
            .to_string();
        let mut args: Vec<&str> = vec!["--storage", &storage];
        if self.defaults {
            args.extend_from_slice(&["--cluster-name", &self.rig.cluster]);
        }
        args.extend_from_slice(&["--ray-tmp-dir", &ray]);
        if self.defaults && !self.args.iter().any(|a| a == "--log-upload-interval") {
            args.extend_from_slice(&["--log-upload-interval", LOG_UPLOAD_INTERVAL]);
        }
        args.extend(self.args.iter().map(String::as_str));
        let extra: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let env = self.rig.env(&extra);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Collector::start(&self.rig.tmp.path().join(&self.spool), &args, &env)
    }
}
