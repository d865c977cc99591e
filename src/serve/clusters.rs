//! `/clusters` and `/enter_cluster/{namespace}/{kind}/{name}[/{session}]`, from the session
//! markers as `inspect` discovers them.
//!
//! `/clusters` answers KubeRay's `ClusterInfo` list: one entry per session marker whose name
//! carries a start time, `{name, namespace, sessionName, createTime, createTimeStamp,
//! ownerKind?, ownerName?}`, newest first, at most [`MAX_CLUSTERS`]. `createTime` and
//! `createTimeStamp` are the time in the session name read as UTC, as KubeRay reads it (Ray
//! writes it in the head's local time, so on a head not on UTC both are off by its offset).
//!
//! `/enter_cluster` resolves like KubeRay: kind `raycluster` matches the cluster name, kind
//! `rayjob` or `rayservice` the owner's; no session or `latest` is the newest session that
//! holds an object (`inspect --session latest`; KubeRay takes the newest marker even when
//! nothing was uploaded under it). It answers `{"name","namespace","result":"success",
//! "session"}` and sets the cookies; `400` for an unknown kind, `404` for no such session.
//! With `reload=true` it waits for the session's reload at most the cache's `LOAD_WAIT`;
//! when the reload still runs past it, the answer (still `200`: the session is entered) has
//! `x-rhc-session-loading: true`, `Retry-After` and a `message` that says so; when it failed
//! or read less of the session than the index held (which then goes on answering), a
//! `message` that says why.
//!
//! Both read one shared listing of the markers ([`MarkerListing`]): one runs at a time and
//! answers for [`MARKERS_FRESH_FOR`], and `/clusters`' answer is made once per listing.

use axum::extract::{Path, RawQuery, State};
use axum::http::header::{CONTENT_TYPE, LOCATION, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::cache::{Reloaded, Unavailable, LOADING_HEADER, LOAD_WAIT};
use super::cookies::Entered;
use super::{Shared, UNREADABLE_HEADER};
use crate::reader::SessionMarker;
use crate::reader::{latest_session, session_markers, session_start};
use crate::util::escape::{escape_message, escape_untrusted};
use crate::util::time::{format_rfc3339, parse_rfc3339_seconds};

/// Sessions `/clusters` lists, newest first: KubeRay's `maxClusters` (100). Older sessions can
/// still be entered by name.
pub const MAX_CLUSTERS: usize = 100;

/// One entry of `/clusters`, in KubeRay's field order and names.
#[derive(Debug, Serialize)]
struct ClusterInfo {
    name: String,
    namespace: String,
    #[serde(rename = "sessionName")]
    session_name: String,
    #[serde(rename = "createTime")]
    create_time: String,
    #[serde(rename = "createTimeStamp")]
    create_time_stamp: i64,
    #[serde(rename = "ownerKind", skip_serializing_if = "String::is_empty")]
    owner_kind: String,
    #[serde(rename = "ownerName", skip_serializing_if = "String::is_empty")]
    owner_name: String,
}

/// `value` as a JSON answer.
fn json_response(value: &impl Serialize) -> Response {
    match serde_json::to_string(value) {
        Ok(text) => ([(CONTENT_TYPE, "application/json")], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The Unix seconds of the time in a session name, read as UTC; `None` for a name without one.
fn session_seconds(session: &str) -> Option<i64> {
    parse_rfc3339_seconds(&format!("{}Z", session_start(session)?))
}

/// How long one listing of the session markers answers `/clusters` and `/enter_cluster`: a
/// session uploaded meanwhile shows up at most this late.
pub const MARKERS_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// The session markers, listed at most once at a time and kept for [`MARKERS_FRESH_FOR`].
///
/// A bucket of 100,000 markers takes seconds and tens of MiB to list; every request listing
/// its own (review r36e: 50 at once took 1.2 GiB and delayed `/readz` 36 s) would cost that
/// as many times as there are requests. Requests that come while a listing runs wait for it
/// and take its result (a failure too, for the same while), so one listing runs at a time,
/// whatever the number of clients.
#[derive(Default)]
pub(crate) struct MarkerListing {
    last: tokio::sync::Mutex<Option<(tokio::time::Instant, Listed)>>,
    /// Listings made (`rhc_serve_marker_listings_total`).
    pub(crate) listings: std::sync::atomic::AtomicU64,
}

/// One listing, and the `/clusters` answer made from it once (off the runtime's threads: for
/// 100,000 markers it takes a second in a debug build).
pub(crate) struct Markers {
    all: Vec<SessionMarker>,
    clusters: tokio::sync::OnceCell<Result<String, String>>,
}

type Listed = Result<std::sync::Arc<Markers>, std::sync::Arc<String>>;

impl MarkerListing {
    /// The markers of `state`'s bucket, listed now or less than [`MARKERS_FRESH_FOR`] ago.
    async fn get(&self, state: &Shared) -> Listed {
        let mut last = self.last.lock().await;
        if let Some((at, listed)) = &*last {
            if at.elapsed() < MARKERS_FRESH_FOR {
                return listed.clone();
            }
        }
        self.listings
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let listed = session_markers(&state.bucket)
            .await
            .map(|all| {
                std::sync::Arc::new(Markers {
                    all,
                    clusters: tokio::sync::OnceCell::new(),
                })
            })
            .map_err(|e| std::sync::Arc::new(format!("{e:#}")));
        *last = Some((tokio::time::Instant::now(), listed.clone()));
        listed
    }
}

/// The markers, or the `502` that says the bucket could not be listed.
async fn markers(state: &Shared) -> Result<std::sync::Arc<Markers>, Response> {
    state.markers.get(state).await.map_err(|e| {
        (
            StatusCode::BAD_GATEWAY,
            [(UNREADABLE_HEADER, "1")],
            escape_message(&format!("listing the session markers: {e}")),
        )
            .into_response()
    })
}

/// `GET /clusters`.
pub async fn list(State(state): State<Shared>) -> Response {
    let markers = match markers(&state).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let listed = markers.clone();
    let answer = markers
        .clusters
        .get_or_init(|| async move {
            tokio::task::spawn_blocking(move || clusters_json(&listed.all))
                .await
                .unwrap_or_else(|e| Err(format!("making the cluster list: {e}")))
        })
        .await;
    match answer {
        Ok(text) => ([(CONTENT_TYPE, "application/json")], text.clone()).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.clone()).into_response(),
    }
}

/// The `/clusters` answer of `markers`.
fn clusters_json(markers: &[SessionMarker]) -> Result<String, String> {
    let mut infos: Vec<ClusterInfo> = markers
        .iter()
        .filter_map(|m| {
            let secs = session_seconds(&m.session)?;
            Some(ClusterInfo {
                name: m.cluster.clone(),
                namespace: m.namespace.clone(),
                session_name: m.session.clone(),
                create_time: format_rfc3339(secs),
                create_time_stamp: secs,
                owner_kind: m.owner.as_ref().map(|_| m.kind.clone()).unwrap_or_default(),
                owner_name: m.owner.clone().unwrap_or_default(),
            })
        })
        .collect();
    // Newest first; equal seconds in a stable order (KubeRay's sort leaves them unordered).
    infos.sort_by(|a, b| {
        (b.create_time_stamp, &b.session_name, &b.namespace, &b.name).cmp(&(
            a.create_time_stamp,
            &a.session_name,
            &a.namespace,
            &a.name,
        ))
    });
    infos.truncate(MAX_CLUSTERS);
    serde_json::to_string(&infos).map_err(|e| e.to_string())
}

/// The longest `to` of `/enter_cluster?to=PATH`.
pub const MAX_REDIRECT_BYTES: usize = 1024;

/// `?to=PATH` of `/enter_cluster`: where to send a browser once the cookies are set (our
/// addition: a person opens a session in the dashboard with one link). Only a path of this
/// server: it starts with one `/` (not `//` or `/\`, which a browser reads as another host),
/// printable ASCII, at most [`MAX_REDIRECT_BYTES`]. `Ok(None)`: no `to`.
fn redirect_target(query: Option<&str>) -> Result<Option<String>, String> {
    let Some(to) = query.and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "to")
            .map(|(_, v)| v.into_owned())
    }) else {
        return Ok(None);
    };
    let local = to.starts_with('/')
        && !to.starts_with("//")
        && !to.starts_with("/\\")
        && to.len() <= MAX_REDIRECT_BYTES
        && to.bytes().all(|b| b.is_ascii_graphic());
    if local {
        Ok(Some(to))
    } else {
        Err(format!(
            "to={}: not a path of this server (one leading /, printable ASCII, at most {MAX_REDIRECT_BYTES} bytes)",
            escape_untrusted(&to)
        ))
    }
}

/// `reload=true` (or `1`) in the query: load the session again now (see `cache`).
fn reload_asked(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .any(|(k, v)| k == "reload" && (v == "true" || v == "1"))
    })
}

/// `GET /enter_cluster/{namespace}/{kind}/{name}[?to=PATH]`: the latest session.
pub async fn enter_latest(
    State(state): State<Shared>,
    Path((namespace, kind, name)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let to = match redirect_target(query.as_deref()) {
        Ok(t) => t,
        Err(m) => return (StatusCode::BAD_REQUEST, m).into_response(),
    };
    let reload = reload_asked(query.as_deref());
    enter(&state, &namespace, &kind, &name, "latest", to, reload).await
}

/// `GET /enter_cluster/{namespace}/{kind}/{name}/{session}[?to=PATH]`.
pub async fn enter_session(
    State(state): State<Shared>,
    Path((namespace, kind, name, session)): Path<(String, String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let to = match redirect_target(query.as_deref()) {
        Ok(t) => t,
        Err(m) => return (StatusCode::BAD_REQUEST, m).into_response(),
    };
    let reload = reload_asked(query.as_deref());
    enter(&state, &namespace, &kind, &name, &session, to, reload).await
}

async fn enter(
    state: &Shared,
    namespace: &str,
    kind: &str,
    name: &str,
    session: &str,
    to: Option<String>,
    reload: bool,
) -> Response {
    let kind_lower = kind.to_ascii_lowercase();
    if !["raycluster", "rayjob", "rayservice"].contains(&kind_lower.as_str()) {
        return (
            StatusCode::BAD_REQUEST,
            format!(
                "unsupported resource kind: {:?} (must be raycluster, rayjob, or rayservice)",
                escape_untrusted(kind)
            ),
        )
            .into_response();
    }
    let markers = match markers(state).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let candidates: Vec<SessionMarker> = markers
        .all
        .iter()
        .filter(|m| m.namespace == namespace)
        .filter(|m| match kind_lower.as_str() {
            "raycluster" => m.cluster == name,
            k => m.kind == k && m.owner.as_deref() == Some(name),
        })
        .cloned()
        .collect();
    let chosen = if session == "latest" || session.is_empty() {
        if candidates.is_empty() {
            None
        } else {
            latest_session(&state.bucket, &candidates).await
        }
    } else {
        candidates.into_iter().find(|m| m.session == session)
    };
    let Some(chosen) = chosen else {
        return (
            StatusCode::NOT_FOUND,
            format!(
                "cluster {}/{}/{} with session {} not found",
                escape_untrusted(namespace),
                escape_untrusted(kind),
                escape_untrusted(name),
                escape_untrusted(session)
            ),
        )
            .into_response();
    };
    if session_start(&chosen.session).is_none() {
        return (
            StatusCode::BAD_REQUEST,
            format!("invalid session name: {:?}", chosen.session),
        )
            .into_response();
    }
    let mut body = serde_json::json!({
        "result": "success",
        "name": chosen.cluster,
        "namespace": chosen.namespace,
        "session": chosen.session,
    });
    // The session's load starts now, so the page's first questions find it loading or
    // loaded (KubeRay's server loads here too, but inside the request, past its timeout).
    // With reload=true it is loaded again, and the answer waits for that (at most the
    // cache's LOAD_WAIT; past it the reload goes on, the index held answers meanwhile, and
    // the answer says so: LOADING_HEADER and a `message`).
    let mut still_loading = false;
    if reload {
        match state.cache.reload(&state.bucket, &chosen).await {
            // A reload cut by the stop: of a session held, it hands back the index held (review
            // r54v D2: the answer then read as a completed reload); of one not held, Stopping.
            Ok(_) | Err(Unavailable::Stopping) if state.cache.stopping() => {
                body["message"] = serde_json::json!(
                    "the server is stopping: the reload was given up; the index held, if any, answers"
                );
            }
            Ok(Reloaded::Done) => {}
            Ok(Reloaded::KeptHeld(why)) => {
                body["message"] = serde_json::json!(escape_message(&format!(
                    "the reload failed: {why}; the index held answers"
                )));
            }
            Err(Unavailable::Loading) => {
                still_loading = true;
                body["message"] = serde_json::json!(format!(
                    "the session is still loading after {}s: the reload goes on, and until \
                     it is done the session's routes answer from the index held (503 with \
                     {LOADING_HEADER} if there is none yet)",
                    LOAD_WAIT.as_secs()
                ));
            }
            Err(Unavailable::Failed(e)) => {
                body["message"] = serde_json::json!(escape_message(&format!(
                    "the reload failed: {e}; the index held, if any, answers"
                )));
            }
            // Only given while stopping (the first arm).
            Err(Unavailable::Stopping) => {}
        }
    } else {
        state.cache.prefetch(&state.bucket, &chosen);
    }
    let entered = Entered { session: chosen };
    let mut response = match to {
        // 303: the browser follows with a GET, carrying the cookies just set.
        Some(to) => entered.refresh((StatusCode::SEE_OTHER, [(LOCATION, to)])),
        None => entered.refresh(json_response(&body)),
    };
    if still_loading {
        let headers = response.headers_mut();
        headers.insert(LOADING_HEADER, HeaderValue::from_static("true"));
        headers.insert(RETRY_AFTER, HeaderValue::from(RELOAD_RETRY_AFTER_SECS));
    }
    response
}

/// Seconds a client is told to wait before asking about a session whose reload still runs.
const RELOAD_RETRY_AFTER_SECS: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_times_are_read_as_kuberay_reads_them() {
        let s = session_seconds("session_2026-11-22_02-06-36_260774_21819").unwrap();
        assert_eq!(format_rfc3339(s), "2026-11-22T02:06:36Z");
        // `date -u -d 2026-11-22T02:06:36Z +%s`
        assert_eq!(s, 1_795_313_196);
        assert_eq!(session_seconds("session_latest"), None);
    }

    #[test]
    fn redirects_stay_on_this_server() {
        assert_eq!(
            redirect_target(Some("to=/%23/jobs"))
                .ok()
                .flatten()
                .as_deref(),
            Some("/#/jobs")
        );
        assert!(redirect_target(Some("a=b")).is_ok_and(|t| t.is_none()));
        for bad in [
            "to=//evil.example/",
            "to=/%5C%5Cevil",
            "to=https://x/",
            "to=/a%0d%0aSet-Cookie:x",
            "to=",
        ] {
            assert!(redirect_target(Some(bad)).is_err(), "{bad}");
        }
    }
}
