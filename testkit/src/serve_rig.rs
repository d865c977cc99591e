//! `serve` reading moto through the recording, fault-injecting proxy, with many sessions
//! copied from one the real collector wrote: the set-up of the tests of slow snapshot reads
//! (a store that holds chosen GETs), built once here so that each of those tests reads as
//! its scenario and its assertions.
//!
//! A [`ServeRig`] holds moto (bucket [`BUCKET`]), the [`FaultProxy`] in front of it and a
//! temporary directory; [`ServeRig::add_session`] copies a template session (a `file://`
//! bucket written by the collector, [`ServeRig::template`]) under another session's name,
//! with the stored snapshots given; [`ServeRig::serve`] starts `serve` on the bucket through the proxy, and
//! [`ServeRig::enter`] enters sessions and waits until they are loaded. The rig's clients
//! ask with a timeout and leave when it fires ([`ServeRig::ask`]), or ask again after a
//! pause until answered ([`ServeRig::ask_until_answered`]); the proxy counts the GETs of an
//! object ([`ServeRig::gets`]). Everything goes when the rig is dropped. [`ServeRig::new`]
//! is `None` when moto is not installed (and `RHC_REQUIRE_SERVICES` does not require it):
//! the test is skipped.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::fault_proxy::{Fault, FaultProxy, Rule};
use crate::http::try_http_request_within;
use crate::serve::{set_cookies, Serve};
use crate::services::MotoS3;

/// The rig's bucket.
pub const BUCKET: &str = "ray-history";

/// How long [`ServeRig::enter`] waits for the sessions to load.
const LOAD_LIMIT: Duration = Duration::from_secs(120);

/// moto behind the proxy, the sessions put there, and `serve` once started.
pub struct ServeRig {
    pub s3: MotoS3,
    pub proxy: FaultProxy,
    pub tmp: tempfile::TempDir,
    /// The cluster the sessions belong to (`raycluster/default/<cluster>`).
    pub cluster: String,
    /// The template's files (path under the bucket, bytes) and its session's name.
    template: Vec<(String, Vec<u8>)>,
    template_session: String,
    serve: Option<Serve>,
}

impl ServeRig {
    /// moto with [`BUCKET`] and the proxy in front of it, for sessions of cluster `cluster`;
    /// `None` when moto is not installed (the test is skipped).
    pub fn new(cluster: &str) -> Option<ServeRig> {
        let s3 = MotoS3::start()?;
        s3.create_bucket(BUCKET);
        let proxy = FaultProxy::start(&format!("127.0.0.1:{}", s3.port))
            .unwrap_or_else(|e| panic!("starting the fault proxy: {e}"));
        Some(ServeRig {
            s3,
            proxy,
            tmp: tempfile::tempdir().expect("a temporary directory"),
            cluster: cluster.to_string(),
            template: Vec::new(),
            template_session: String::new(),
            serve: None,
        })
    }

    /// The session [`ServeRig::add_session`] copies: `session` in the bucket `dir` (a
    /// `file://` bucket's directory, written by the collector for the rig's cluster).
    pub fn template(&mut self, dir: &Path, session: &str) {
        self.template = files_under(dir);
        self.template_session = session.to_string();
    }

    /// The key of `rel` (a path under the session's directory) in `session`.
    pub fn key(&self, session: &str, rel: &str) -> String {
        format!(
            "cluster-history/raycluster/default/{}/{session}/{rel}",
            self.cluster
        )
    }

    /// Puts the template session ([`ServeRig::template`]) as `session`, and each of
    /// `objects` (a path under the session's directory, such as a stored snapshot's, and its
    /// bytes).
    pub fn add_session(&self, session: &str, objects: &[(&str, &[u8])]) {
        assert!(
            !self.template.is_empty(),
            "no template (ServeRig::template)"
        );
        for (key, bytes) in &self.template {
            let key = key.replace(&self.template_session, session);
            self.s3.put_object(BUCKET, &key, bytes);
        }
        for (rel, bytes) in objects {
            self.s3.put_object(BUCKET, &self.key(session, rel), bytes);
        }
    }

    /// Starts `serve` on the bucket, reading it through the proxy.
    pub fn serve(&mut self) -> &Serve {
        self.serve_with(&[])
    }

    /// [`ServeRig::serve`] with `extra` in its environment (a test-only `RHC_TEST_*` knob).
    pub fn serve_with(&mut self, extra: &[(&str, &str)]) -> &Serve {
        let url = self.proxy.url();
        let mut env: Vec<(&str, &str)> = self.s3.collector_env().to_vec();
        env[0] = ("AWS_ENDPOINT", url.as_str());
        env.extend_from_slice(extra);
        let log = self.tmp.path().join("serve.log");
        self.serve = Some(Serve::start(&format!("s3://{BUCKET}"), &log, &[], &env));
        self.served()
    }

    /// The `serve` started by [`ServeRig::serve`].
    pub fn served(&self) -> &Serve {
        self.serve
            .as_ref()
            .expect("serve started (ServeRig::serve)")
    }

    /// Enters `session` (`/enter_cluster`, which starts its load): its cookies, as one
    /// `Cookie` header's value.
    pub fn cookie(&self, session: &str) -> String {
        let serve = self.served();
        let path = format!(
            "/enter_cluster/default/raycluster/{}/{session}",
            self.cluster
        );
        let entered = serve
            .get(&path, &[])
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(entered.status, 200, "{}", serve.log_text());
        cookie_line(&set_cookies(&entered))
    }

    /// Enters each of `sessions` and waits until all are loaded (`/api/jobs/` answers `200`;
    /// their loads run while the others are entered); their cookies ([`ServeRig::cookie`]).
    pub fn enter(&self, sessions: &[&str]) -> Vec<String> {
        let cookies: Vec<String> = sessions.iter().map(|s| self.cookie(s)).collect();
        let deadline = Instant::now() + LOAD_LIMIT;
        for (session, cookie) in sessions.iter().zip(&cookies) {
            while self.ask(cookie, "/api/jobs/", LOAD_LIMIT).0.ok() != Some(200) {
                assert!(
                    Instant::now() < deadline,
                    "{session} never loaded:\n{}",
                    self.served().log_text()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        cookies
    }

    /// Holds every GET of `session`'s `rel` (a path under its directory) `delay` before
    /// passing it on, from now on (only GETs of the object: a listing's prefix, in its
    /// query, has its slashes encoded).
    pub fn stall(&self, session: &str, rel: &str, delay: Duration) {
        self.proxy.add(
            Rule::new(Fault::Delay(delay))
                .method("GET")
                .target_contains(&self.key(session, rel)),
        );
    }

    /// The GETs of `session`'s `rel` that have arrived at the proxy so far (answered or not).
    pub fn gets(&self, session: &str, rel: &str) -> usize {
        let key = self.key(session, rel);
        self.proxy
            .arrived()
            .iter()
            .filter(|(m, t)| m == "GET" && t.contains(&key))
            .count()
    }

    /// Waits (up to `limit`) until `n` GETs of the sessions' `rel` have arrived.
    pub fn wait_gets(&self, sessions: &[&str], rel: &str, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while sessions.iter().map(|s| self.gets(s, rel)).sum::<usize>() < n {
            assert!(
                Instant::now() < deadline,
                "fewer than {n} GETs of {rel} within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET uri` with `cookie`, leaving after `within` without an answer: its status (an
    /// error when it left), and how long it took.
    pub fn ask(
        &self,
        cookie: &str,
        uri: &str,
        within: Duration,
    ) -> (std::io::Result<u16>, Duration) {
        let started = Instant::now();
        let got = try_http_request_within(
            "GET",
            &format!("http://127.0.0.1:{}{uri}", self.served().port),
            &[("Cookie", cookie)],
            b"",
            within,
        );
        (got.map(|r| r.status), started.elapsed())
    }

    /// A client whose timeout is `within`: asks, and while it gets no answer pauses
    /// `pause` and asks again, until `deadline`. When it was answered (its status), and
    /// how often it asked.
    pub fn ask_until_answered(
        &self,
        cookie: &str,
        uri: &str,
        within: Duration,
        pause: Duration,
        deadline: Instant,
    ) -> (Option<u16>, usize) {
        let mut asked = 0;
        while Instant::now() < deadline {
            asked += 1;
            if let (Ok(status), _) = self.ask(cookie, uri, within) {
                return (Some(status), asked);
            }
            std::thread::sleep(pause);
        }
        (None, asked)
    }
}

/// Cookies as one `Cookie` header's value.
fn cookie_line(cookies: &[(String, String)]) -> String {
    cookies
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Every file under `dir`, as (path relative to `dir` with `/`, bytes).
fn files_under(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries =
            std::fs::read_dir(&d).unwrap_or_else(|e| panic!("reading {}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                todo.push(path);
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .expect("under dir")
                    .to_str()
                    .expect("a UTF-8 path")
                    .to_string();
                let bytes = std::fs::read(&path)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                out.push((rel, bytes));
            }
        }
    }
    out
}
