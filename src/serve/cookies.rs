//! The session a request is about, from the cookies `/enter_cluster` set, as KubeRay's
//! `CookieHandle` reads them: `cluster_name`, `session_name` and `cluster_namespace` are
//! required (`400` naming the missing one), `owner_kind` and `owner_name` may be absent.
//!
//! Every value must be one safe path segment ([`contract::is_safe_segment`]: ASCII letters,
//! digits, `.`, `_`, `-`), because it becomes part of an object key: no value can lead a read
//! outside the cluster's prefix. `owner_kind` is empty, `raycluster`, `rayjob` or
//! `rayservice`. `session_name=live` (KubeRay's marker for a proxied live cluster) is
//! refused: this server proxies nothing. The session must have its marker in the bucket
//! (one `HEAD` per request), else `404`.

use axum::extract::FromRequestParts;
use axum::http::header::{COOKIE, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use object_store::path::Path as ObjectPath;
use object_store::ObjectStoreExt as _;

use super::{Shared, UNREADABLE_HEADER};
use crate::contract;
use crate::reader::SessionMarker;
use crate::util::escape::{escape_message, escape_untrusted};

pub const CLUSTER_NAME: &str = "cluster_name";
pub const CLUSTER_NAMESPACE: &str = "cluster_namespace";
pub const SESSION_NAME: &str = "session_name";
pub const OWNER_KIND: &str = "owner_kind";
pub const OWNER_NAME: &str = "owner_name";
/// KubeRay's `MaxAge: 600`: the cookies last ten minutes after the last answer that set them.
pub const COOKIE_MAX_AGE_SECS: u32 = 600;

/// The session a request is about, checked.
#[derive(Debug, Clone)]
pub struct Entered {
    pub session: SessionMarker,
}

impl Entered {
    /// KubeRay's five cookies for `session`.
    pub fn set_cookies(session: &SessionMarker, headers: &mut HeaderMap) {
        let (kind, owner) = match &session.owner {
            Some(o) => (session.kind.as_str(), o.as_str()),
            // A RayCluster without an owner: KubeRay's owner cookies are empty.
            None => ("", ""),
        };
        for (name, value) in [
            (CLUSTER_NAME, session.cluster.as_str()),
            (CLUSTER_NAMESPACE, session.namespace.as_str()),
            (SESSION_NAME, session.session.as_str()),
            (OWNER_KIND, kind),
            (OWNER_NAME, owner),
        ] {
            let line = format!("{name}={value}; Path=/; Max-Age={COOKIE_MAX_AGE_SECS}");
            // Values are safe segments (checked where they come from), so always valid.
            if let Ok(v) = HeaderValue::from_str(&line) {
                headers.append(SET_COOKIE, v);
            }
        }
    }

    /// `response` with the cookies set again, as KubeRay does on every answer.
    pub fn refresh(&self, response: impl IntoResponse) -> Response {
        let mut r = response.into_response();
        Self::set_cookies(&self.session, r.headers_mut());
        r
    }
}

/// The value of cookie `name` in the request's `Cookie` headers (the first one).
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim_matches('"'))
}

/// The cookies' session, which must have its marker in the bucket: a session that cannot be
/// entered is not answered about (`404`), where KubeRay replays empty answers for it.
impl FromRequestParts<Shared> for Entered {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Shared,
    ) -> Result<Self, Self::Rejection> {
        let entered = from_headers(&parts.headers)
            .map_err(|message| (StatusCode::BAD_REQUEST, message).into_response())?;
        let key = entered.session.marker_key(&state.bucket.spec.root);
        let missing = |why: String| {
            (
                StatusCode::NOT_FOUND,
                escape_message(&format!(
                    "{why}: no such session in the bucket; enter one with /enter_cluster"
                )),
            )
                .into_response()
        };
        let path = ObjectPath::parse(&key).map_err(|e| missing(format!("{key}: {e}")))?;
        match state.bucket.store.head(&path).await {
            Ok(_) => Ok(entered),
            Err(object_store::Error::NotFound { .. }) => Err(missing(key)),
            Err(e) => Err((
                StatusCode::BAD_GATEWAY,
                [(UNREADABLE_HEADER, "1")],
                escape_message(&format!("reading the session marker {key}: {e}")),
            )
                .into_response()),
        }
    }
}

/// The checked session of `headers`' cookies, or why not (the message of the `400`).
pub fn from_headers(headers: &HeaderMap) -> Result<Entered, String> {
    let required =
        |name: &str, missing: &str| cookie(headers, name).ok_or_else(|| missing.to_string());
    let cluster = required(CLUSTER_NAME, "Cluster Cookie not found")?;
    let session = required(SESSION_NAME, "RayCluster Session Name Cookie not found")?;
    let namespace = required(CLUSTER_NAMESPACE, "Cluster Namespace Cookie not found")?;
    let kind = cookie(headers, OWNER_KIND).unwrap_or("");
    let owner = cookie(headers, OWNER_NAME).unwrap_or("");
    for (name, value) in [
        (CLUSTER_NAME, cluster),
        (CLUSTER_NAMESPACE, namespace),
        (SESSION_NAME, session),
    ] {
        if !contract::is_safe_segment(value) {
            return Err(format!(
                "invalid cookie value: {name}={} is not one path segment of letters, digits, '.', '_', '-'",
                escape_untrusted(value)
            ));
        }
    }
    if session == "live" {
        return Err(
            "session_name=live: this server reads the bucket only and proxies no live cluster; \
             enter a session by name"
                .to_string(),
        );
    }
    let kind = kind.to_ascii_lowercase();
    let owner = match kind.as_str() {
        "" | "raycluster" => None,
        "rayjob" | "rayservice" if owner.is_empty() => None,
        "rayjob" | "rayservice" => {
            if !contract::is_safe_segment(owner) {
                return Err(format!(
                    "invalid cookie value: {OWNER_NAME}={} is not one path segment",
                    escape_untrusted(owner)
                ));
            }
            Some(owner.to_string())
        }
        other => {
            return Err(format!(
                "invalid cookie values: unsupported owner_kind={} (must be raycluster, rayjob, or rayservice)",
                escape_untrusted(other)
            ))
        }
    };
    Ok(Entered {
        session: SessionMarker {
            kind: if owner.is_some() {
                kind
            } else {
                "raycluster".to_string()
            },
            namespace: namespace.to_string(),
            owner,
            cluster: cluster.to_string(),
            session: session.to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(cookie_line: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(COOKIE, HeaderValue::from_str(cookie_line).unwrap());
        h
    }

    #[test]
    fn cookies_are_read_and_checked() {
        let e = from_headers(&headers(
            "cluster_name=c1; cluster_namespace=default; session_name=session_2026-11-22_02-06-36_260774_1; owner_kind=; owner_name=",
        ))
        .unwrap();
        assert_eq!(e.session.kind, "raycluster");
        assert_eq!(e.session.owner, None);
        let e = from_headers(&headers(
            "cluster_name=c1; cluster_namespace=ns; session_name=s; owner_kind=RayJob; owner_name=j",
        ))
        .unwrap();
        assert_eq!(e.session.kind, "rayjob");
        assert_eq!(e.session.owner.as_deref(), Some("j"));
        for bad in [
            "cluster_namespace=default; session_name=s",
            "cluster_name=c1; cluster_namespace=default",
            "cluster_name=../x; cluster_namespace=default; session_name=s",
            "cluster_name=a/b; cluster_namespace=default; session_name=s",
            "cluster_name=c; cluster_namespace=default; session_name=live",
            "cluster_name=c; cluster_namespace=default; session_name=s; owner_kind=pod",
            "cluster_name=c; cluster_namespace=default; session_name=s; owner_kind=rayjob; owner_name=..",
        ] {
            let why = from_headers(&headers(bad)).unwrap_err();
            assert!(!why.is_empty(), "{bad}");
        }
    }
}
