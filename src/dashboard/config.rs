//! The dashboard settings, read from the environment as Ray and KubeRay name them and checked
//! before the collector starts: a token that cannot be sent, an extra endpoint that could not
//! be stored under its own URI, or an address that is not a URL is a configuration error.
//!
//! With `RAY_ENABLE_K8S_TOKEN_AUTH=true` the token is the pod's projected ServiceAccount token
//! that KubeRay's operator mounts at [`K8S_TOKEN_PATH`], read like KubeRay's collector reads
//! it: again for every request, since kubelet replaces it before it expires. A missing or
//! empty file at start is a warning, not a refusal: the dashboard is not worth stopping the
//! pod for, and each request reads the file again.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::header::HeaderValue;

use super::{
    DashboardError, DEFAULT_REQUEST_TIMEOUT, MAX_ENDPOINT_LEN, ONE_SHOT_ENDPOINTS,
    PERIODIC_ENDPOINTS,
};

/// Settings of the dashboard poller (head role only).
#[derive(Clone)]
pub struct DashboardConfig {
    /// Base URL of the dashboard, e.g. `http://localhost:8265`; request URIs are appended.
    pub address: String,
    /// Time between two polls of the periodic endpoints.
    pub poll_interval: Duration,
    /// `RAY_COLLECTOR_ADDITIONAL_ENDPOINTS`: more URIs polled like the periodic ones.
    pub additional_endpoints: Vec<String>,
    /// Bearer token for a dashboard started with `RAY_AUTH_MODE=token` (with
    /// `auth_token_file`, the token read at start).
    pub auth_token: Option<String>,
    /// A token file read again for every request (`RAY_ENABLE_K8S_TOKEN_AUTH`).
    pub auth_token_file: Option<PathBuf>,
    /// Longest wait for one answer, body included.
    pub request_timeout: Duration,
}

/// Never prints the token: configurations end up in logs.
impl fmt::Debug for DashboardConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DashboardConfig")
            .field("address", &self.address)
            .field("poll_interval", &self.poll_interval)
            .field("additional_endpoints", &self.additional_endpoints)
            .field(
                "auth_token",
                &self.auth_token.as_ref().map(|_| "<redacted>"),
            )
            .field("auth_token_file", &self.auth_token_file)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// Where KubeRay's operator mounts the projected ServiceAccount token for Ray's Kubernetes
/// token auth (`RAY_ENABLE_K8S_TOKEN_AUTH=true`); `RHC_K8S_TOKEN_PATH` names another file.
pub const K8S_TOKEN_PATH: &str = "/var/run/secrets/ray.io/serviceaccount/token";

/// What the token file variable is called in messages.
const K8S_TOKEN_VAR: &str = "RAY_ENABLE_K8S_TOKEN_AUTH=true, token file";

/// Go's `strconv.ParseBool`, which KubeRay's collector applies to `RAY_ENABLE_K8S_TOKEN_AUTH`:
/// anything else is false.
fn go_parse_bool_true(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "TRUE" | "true" | "True")
}

/// Reads a token file: trimmed, non-empty, sendable in a header.
fn read_token_file(path: &PathBuf, var: &'static str) -> Result<String, DashboardError> {
    let text = std::fs::read_to_string(path).map_err(|source| DashboardError::TokenFile {
        var,
        path: path.clone(),
        source,
    })?;
    let t = text.trim();
    if t.is_empty() {
        return Err(DashboardError::EmptyTokenFile {
            var,
            path: path.clone(),
        });
    }
    check_token(t, var)?;
    Ok(t.to_string())
}

impl DashboardConfig {
    /// Completes the configuration from the environment, as Ray and KubeRay name things:
    ///
    /// - `RAY_ENABLE_K8S_TOKEN_AUTH` true (Go's `ParseBool`, as KubeRay): the token is the
    ///   trimmed content of [`K8S_TOKEN_PATH`] (or `RHC_K8S_TOKEN_PATH`), read again for every
    ///   request; this wins over the variables below, as in KubeRay.
    /// - `RAY_AUTH_TOKEN` (trimmed), else the trimmed content of the file named by
    ///   `RAY_AUTH_TOKEN_PATH`, becomes the bearer token. A token is sent whenever one is
    ///   configured, like KubeRay does; `RAY_AUTH_MODE=token` without any token is allowed
    ///   but logged, since every request will then be refused with 401.
    /// - `RAY_COLLECTOR_ADDITIONAL_ENDPOINTS`: comma-separated URIs, trimmed, empty entries
    ///   dropped, each starting with `/`; duplicates (also of the built-in endpoints) dropped
    ///   with the first occurrence kept.
    ///
    /// The request timeout is [`DEFAULT_REQUEST_TIMEOUT`]. `env` is the variable lookup, so
    /// tests need not touch the process environment. Returns the configuration and the
    /// warnings to log once logging is set up.
    pub fn from_env(
        address: String,
        poll_interval: Duration,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(DashboardConfig, Vec<String>), DashboardError> {
        let additional_endpoints =
            parse_additional_endpoints(env("RAY_COLLECTOR_ADDITIONAL_ENDPOINTS").as_deref())?;
        let non_empty =
            |v: Option<String>| v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
        let mut warnings = Vec::new();
        let k8s = env("RAY_ENABLE_K8S_TOKEN_AUTH").is_some_and(|v| go_parse_bool_true(v.trim()));
        let auth_token_file = k8s.then(|| {
            PathBuf::from(
                non_empty(env("RHC_K8S_TOKEN_PATH")).unwrap_or_else(|| K8S_TOKEN_PATH.into()),
            )
        });
        let auth_token = match (&auth_token_file, non_empty(env("RAY_AUTH_TOKEN"))) {
            (Some(path), _) => match read_token_file(path, K8S_TOKEN_VAR) {
                Ok(t) => Some(t),
                Err(e) => {
                    warnings.push(format!(
                        "{e}: dashboard requests fail until the file is readable (it is read again for each)"
                    ));
                    None
                }
            },
            (None, Some(t)) => {
                check_token(&t, "RAY_AUTH_TOKEN")?;
                Some(t)
            }
            (None, None) => match non_empty(env("RAY_AUTH_TOKEN_PATH")) {
                Some(path) => Some(read_token_file(
                    &PathBuf::from(path),
                    "RAY_AUTH_TOKEN_PATH",
                )?),
                None => None,
            },
        };
        let token_mode = env("RAY_AUTH_MODE")
            .map(|m| m.trim().eq_ignore_ascii_case("token"))
            .unwrap_or(false);
        if token_mode && auth_token.is_none() && auth_token_file.is_none() {
            warnings.push(
                "RAY_AUTH_MODE=token but none of RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or \
                 RAY_ENABLE_K8S_TOKEN_AUTH=true is set: the dashboard will refuse our requests"
                    .to_string(),
            );
        }
        let cfg = DashboardConfig {
            address,
            poll_interval,
            additional_endpoints,
            auth_token,
            auth_token_file,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        };
        cfg.base_url()?;
        Ok((cfg, warnings))
    }

    /// True when requests carry a token (or try to: a token file read for each).
    pub(super) fn has_token(&self) -> bool {
        self.auth_token.is_some() || self.auth_token_file.is_some()
    }

    /// The token to send now: the file's current content when it is read for every request,
    /// else the token read at start.
    pub(super) fn current_token(&self) -> Result<Option<String>, DashboardError> {
        match &self.auth_token_file {
            Some(path) => read_token_file(path, K8S_TOKEN_VAR).map(Some),
            None => Ok(self.auth_token.clone()),
        }
    }

    /// The address without trailing `/`, checked: request URIs are appended to it.
    pub(super) fn base_url(&self) -> Result<String, DashboardError> {
        let bad = |why: &str| DashboardError::BadAddress {
            address: self.address.clone(),
            why: why.to_string(),
        };
        let url = url::Url::parse(self.address.trim()).map_err(|e| bad(&e.to_string()))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(bad("the scheme must be http or https"));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("no host"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad("no query or fragment allowed"));
        }
        Ok(self.address.trim().trim_end_matches('/').to_string())
    }

    pub(super) fn validate(&self) -> Result<String, DashboardError> {
        if self.poll_interval.is_zero() {
            return Err(DashboardError::ZeroDuration {
                what: "the dashboard poll interval",
            });
        }
        if self.request_timeout.is_zero() {
            return Err(DashboardError::ZeroDuration {
                what: "the dashboard request timeout",
            });
        }
        for e in &self.additional_endpoints {
            check_endpoint(e)?;
        }
        if let Some(t) = &self.auth_token {
            check_token(t, "RAY_AUTH_TOKEN")?;
        }
        self.base_url()
    }
}

pub(super) fn check_token(t: &str, source_var: &'static str) -> Result<(), DashboardError> {
    if HeaderValue::from_str(&format!("Bearer {t}")).is_err() {
        return Err(DashboardError::TokenNotHeaderSafe { source_var });
    }
    Ok(())
}

/// Splits `RAY_COLLECTOR_ADDITIONAL_ENDPOINTS`; see [`DashboardConfig::from_env`].
fn parse_additional_endpoints(v: Option<&str>) -> Result<Vec<String>, DashboardError> {
    let mut out: Vec<String> = Vec::new();
    for entry in v.unwrap_or("").split(',').map(str::trim) {
        if entry.is_empty() {
            continue;
        }
        check_endpoint(entry)?;
        let builtin = ONE_SHOT_ENDPOINTS.contains(&entry) || PERIODIC_ENDPOINTS.contains(&entry);
        if !builtin && !out.iter().any(|e| e == entry) {
            out.push(entry.to_string());
        }
    }
    Ok(out)
}

/// An extra endpoint must be a request URI whose bytes go unchanged into the request line
/// and into the object key, so the history server finds it under the URI its frontend sends.
pub(super) fn check_endpoint(entry: &str) -> Result<(), DashboardError> {
    let bad = |why| {
        Err(DashboardError::BadEndpoint {
            entry: entry.to_string(),
            why,
        })
    };
    if !entry.starts_with('/') {
        return bad("must start with '/'");
    }
    if entry.len() > MAX_ENDPOINT_LEN {
        return bad("longer than 512 bytes");
    }
    if entry.trim_matches('/').is_empty() {
        return bad("names no endpoint");
    }
    // Printable ASCII that URL parsers leave as is: anything they would percent-encode or
    // strip would make the request URI differ from the stored key.
    let ok = |b: u8| b.is_ascii_graphic() && !b"\"#<>\\^`{|}".contains(&b);
    if !entry.bytes().all(ok) {
        return bad(
            "only printable ASCII without spaces, quotes, '#', '<>', '\\', '^', '`', '{|}'",
        );
    }
    let path = entry.split('?').next().unwrap_or(entry);
    if path.split('/').any(|s| s == "." || s == "..") {
        return bad("'.' and '..' segments are not allowed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dashboard::{DEFAULT_ADDRESS, DEFAULT_POLL_INTERVAL};

    fn env_of<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn cfg(pairs: &[(&str, &str)]) -> Result<DashboardConfig, DashboardError> {
        DashboardConfig::from_env(
            DEFAULT_ADDRESS.to_string(),
            DEFAULT_POLL_INTERVAL,
            &env_of(pairs),
        )
        .map(|(c, _warnings)| c)
    }

    #[test]
    fn additional_endpoints() {
        let c = cfg(&[(
            "RAY_COLLECTOR_ADDITIONAL_ENDPOINTS",
            " /api/train/v2/runs/v1 ,, /api/serve/applications/, /api/x?a=1&b=%20 ,/api/train/v2/runs/v1,",
        )])
        .unwrap();
        assert_eq!(
            c.additional_endpoints,
            ["/api/train/v2/runs/v1", "/api/x?a=1&b=%20"]
        );
        assert_eq!(c.request_timeout, DEFAULT_REQUEST_TIMEOUT);
        assert!(c.auth_token.is_none());
        for bad in ["api/x", "/", "/a b", "/a#b", "/a/../b", "/a\u{7f}", "/é"] {
            let e = cfg(&[("RAY_COLLECTOR_ADDITIONAL_ENDPOINTS", bad)]).unwrap_err();
            assert!(
                matches!(e, DashboardError::BadEndpoint { .. }),
                "{bad}: {e}"
            );
        }
        let long = format!("/{}", "a".repeat(MAX_ENDPOINT_LEN));
        assert!(cfg(&[("RAY_COLLECTOR_ADDITIONAL_ENDPOINTS", &long)]).is_err());
    }

    #[test]
    fn tokens() {
        let c = cfg(&[("RAY_AUTH_MODE", "token"), ("RAY_AUTH_TOKEN", " abc\n")]).unwrap();
        assert_eq!(c.auth_token.as_deref(), Some("abc"));
        assert!(
            !format!("{c:?}").contains("abc"),
            "Debug must not show the token"
        );

        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "from-file\n").unwrap();
        let ps = p.to_str().unwrap();
        let c = cfg(&[("RAY_AUTH_MODE", "token"), ("RAY_AUTH_TOKEN_PATH", ps)]).unwrap();
        assert_eq!(c.auth_token.as_deref(), Some("from-file"));
        // RAY_AUTH_TOKEN wins over the file.
        let c = cfg(&[("RAY_AUTH_TOKEN", "env"), ("RAY_AUTH_TOKEN_PATH", ps)]).unwrap();
        assert_eq!(c.auth_token.as_deref(), Some("env"));

        std::fs::write(&p, " \n").unwrap();
        assert!(matches!(
            cfg(&[("RAY_AUTH_TOKEN_PATH", ps)]),
            Err(DashboardError::EmptyTokenFile { .. })
        ));
        let missing = dir.path().join("nope");
        assert!(matches!(
            cfg(&[("RAY_AUTH_TOKEN_PATH", missing.to_str().unwrap())]),
            Err(DashboardError::TokenFile { .. })
        ));
        assert!(matches!(
            cfg(&[("RAY_AUTH_TOKEN", "a\u{1}b")]),
            Err(DashboardError::TokenNotHeaderSafe { .. })
        ));
        // Token mode without a token is allowed: requests will be refused and reported.
        assert!(cfg(&[("RAY_AUTH_MODE", "token")])
            .unwrap()
            .auth_token
            .is_none());
    }

    #[test]
    fn addresses() {
        let ok = |a: &str| {
            DashboardConfig::from_env(a.to_string(), DEFAULT_POLL_INTERVAL, &|_| None)
                .and_then(|(c, _)| c.base_url())
        };
        assert_eq!(
            ok("http://localhost:8265/").unwrap(),
            "http://localhost:8265"
        );
        assert_eq!(ok("https://h/ray/").unwrap(), "https://h/ray");
        for bad in ["localhost:8265", "ftp://h", "http://h/?a=1", "http://"] {
            assert!(ok(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn zero_durations_are_refused() {
        let mut c = cfg(&[]).unwrap();
        c.poll_interval = Duration::ZERO;
        assert!(matches!(
            c.validate(),
            Err(DashboardError::ZeroDuration { .. })
        ));
    }
}
