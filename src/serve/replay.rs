//! The dashboard's answers as the head's collector snapshotted them under
//! `P/<session>/fetched_endpoints/`, replayed as KubeRay's history server replays them.
//!
//! - `/timezone`: `restful__timezone`; missing: `{"offset":"","value":""}`.
//! - `/api/v0/cluster_metadata`: `restful__api__v0__cluster_metadata`; missing: `404`.
//! - `/api/{*path}`: the object [`endpoint_object_name`] names for the request URI as sent,
//!   path and raw query (so `/api/v0/placement_groups?detail=1&limit=10000` finds what the
//!   poller stored for that URI); missing: KubeRay's empty answer for the endpoints Ray's
//!   frontend cannot do without ([`missing_fallback`]), else `404`. A placement-group list
//!   whose groups lack `bundles` gets `"bundles": []` (Ray 2.56's frontend maps over it
//!   unguarded), as KubeRay does, into the snapshot's own bytes (no tree of it is built) and
//!   only while the answer stays within [`MAX_BACKFILLED_BYTES`]; past it the snapshot is
//!   answered as stored.
//!
//! A snapshot is read holding one of [`MAX_CONCURRENT_READS`](super::MAX_CONCURRENT_READS)
//! permits; once read, the answer holds its size of the answers in flight until hyper has
//! taken its last byte ([`super::inflight`]), so the snapshots held at once are bounded while
//! they are read and while they are sent, whatever the clients read.
//!
//! Where KubeRay turns any read error into "missing" (and so into an empty `200`), a snapshot
//! that is listed but cannot be read, or is larger than [`MAX_SNAPSHOT_BYTES`], is a `502`
//! with [`UNREADABLE_HEADER`]; so is a listing that fails.
//!
//! Snapshots are found by listing the session's `fetched_endpoints/` and comparing names,
//! not by building a key: each backend spells a `?` or `&` in a key its own way, and the
//! listing gives the key as the backend has it (as `inspect` reads the placement groups).
//! The listing streams and stops at the name, or after [`MAX_SNAPSHOTS_LISTED`] entries.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::ObjectMeta;
use object_store::ObjectStoreExt as _;

use super::cookies::Entered;
use super::{Shared, UNREADABLE_HEADER};
use crate::contract::endpoints::{endpoint_object_name, FETCHED_ENDPOINTS_DIR};
use crate::util::escape::escape_message;

/// Largest snapshot replayed. Ray's list endpoints answer at most 10,000 entries (the poller
/// asks placement groups with `limit=10000`); 64 MiB holds that with room, and is what
/// `inspect` allows for the same snapshot.
pub const MAX_SNAPSHOT_BYTES: u64 = 64 << 20;

/// Entries of `fetched_endpoints/` looked through for one name. The collector writes a
/// handful plus one per job with datasets; a bucket with more is hostile or broken, and the
/// search stops with a `502` instead of listing forever.
pub const MAX_SNAPSHOTS_LISTED: usize = 100_000;

const TIMEZONE_URI: &str = "/timezone";
const CLUSTER_METADATA_URI: &str = "/api/v0/cluster_metadata";
const EMPTY_TIMEZONE: &str = r#"{"offset":"","value":""}"#;

/// Why a snapshot is not answered.
pub(super) enum Missing {
    /// Not in the bucket.
    NotFound,
    /// There, or maybe there, but not readable: the `502` to answer.
    Unreadable(Response),
}

fn unreadable(what: String) -> Missing {
    Missing::Unreadable(
        (
            StatusCode::BAD_GATEWAY,
            [(UNREADABLE_HEADER, "1")],
            escape_message(&what),
        )
            .into_response(),
    )
}

/// Where the snapshot of `request_uri` in the entered session is (listed, not read).
pub(super) async fn find_snapshot(
    state: &Shared,
    entered: &Entered,
    request_uri: &str,
) -> Result<ObjectMeta, Missing> {
    let session = &entered.session;
    let prefix = session.history_prefix(&state.bucket.spec.root);
    let dir = ObjectPath::from(format!(
        "{prefix}/{}/{FETCHED_ENDPOINTS_DIR}",
        session.session
    ));
    let name = endpoint_object_name(request_uri);
    let store = &state.bucket.store;
    let mut listing = store.list(Some(&dir));
    let mut seen = 0usize;
    let meta = loop {
        match listing.next().await {
            None => return Err(Missing::NotFound),
            Some(Err(e)) => return Err(unreadable(format!("listing {dir}/: {e}"))),
            Some(Ok(m)) => {
                if m.location.filename() == Some(name.as_str()) {
                    break m;
                }
                seen += 1;
                if seen >= MAX_SNAPSHOTS_LISTED {
                    return Err(unreadable(format!(
                        "{dir}/ holds more than {MAX_SNAPSHOTS_LISTED} objects; not searched further"
                    )));
                }
            }
        }
    };
    drop(listing);
    Ok(meta)
}

/// The snapshot of `request_uri` in the entered session.
pub(super) async fn read_snapshot(
    state: &Shared,
    entered: &Entered,
    request_uri: &str,
) -> Result<Bytes, Missing> {
    let meta = find_snapshot(state, entered, request_uri).await?;
    read_found(state, &meta).await
}

/// The snapshot `meta` names (as [`find_snapshot`] found it), read holding one of the
/// reads' permits and counted against [`MAX_SNAPSHOT_BYTES`] as it is read.
pub(super) async fn read_found(state: &Shared, meta: &ObjectMeta) -> Result<Bytes, Missing> {
    if meta.size > MAX_SNAPSHOT_BYTES {
        return Err(too_large(meta));
    }
    let Ok(_permit) = state.reads.acquire().await else {
        return Err(unreadable("the server is stopping".to_string()));
    };
    read_counted(state, meta, MAX_SNAPSHOT_BYTES).await
}

/// The `502` of a snapshot listed larger than [`MAX_SNAPSHOT_BYTES`].
fn too_large(meta: &ObjectMeta) -> Missing {
    unreadable(format!(
        "{}: {} bytes, more than the {MAX_SNAPSHOT_BYTES} replayed",
        meta.location, meta.size
    ))
}

/// [`read_found`] under a permit the caller holds (and keeps while it holds the bytes), not
/// one of the replays' ([`super::ServeState::reads`]): the Train answers have their own
/// (review r37n D1: their slow reads held the replays' permits). Reads at most `limit`
/// bytes (at most [`MAX_SNAPSHOT_BYTES`]): an object longer than that is a `502`.
pub(super) async fn read_counted(
    state: &Shared,
    meta: &ObjectMeta,
    limit: u64,
) -> Result<Bytes, Missing> {
    let limit = limit.min(MAX_SNAPSHOT_BYTES);
    let store = &state.bucket.store;
    let key = meta.location.to_string();
    if meta.size > MAX_SNAPSHOT_BYTES {
        return Err(too_large(meta));
    }
    let got = match store.get(&meta.location).await {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => return Err(Missing::NotFound),
        Err(e) => return Err(unreadable(format!("{key}: {e}"))),
    };
    // The size listed is a promise of the bucket's, not a bound: count while reading.
    let mut body = BytesMut::new();
    let mut stream = got.into_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Err(e) => return Err(unreadable(format!("{key}: {e}"))),
            Ok(c) => {
                if body.len() as u64 + c.len() as u64 > limit {
                    return Err(unreadable(if limit < MAX_SNAPSHOT_BYTES {
                        format!("{key}: more than the {limit} bytes it was listed with (replaced while it was read? asking again reads the new one)")
                    } else {
                        format!("{key}: more than the {MAX_SNAPSHOT_BYTES} bytes replayed")
                    }));
                }
                body.extend_from_slice(&c);
            }
        }
    }
    Ok(body.freeze())
}

fn json(entered: &Entered, body: impl Into<axum::body::Body>) -> Response {
    entered.refresh(([(CONTENT_TYPE, "application/json")], body.into()))
}

/// `GET /timezone`.
pub async fn timezone(State(state): State<Shared>, entered: Entered) -> Response {
    match read_snapshot(&state, &entered, TIMEZONE_URI).await {
        Ok(b) => json(&entered, b),
        Err(Missing::NotFound) => json(&entered, EMPTY_TIMEZONE),
        Err(Missing::Unreadable(r)) => entered.refresh(r),
    }
}

/// `GET /api/v0/cluster_metadata`.
pub async fn cluster_metadata(State(state): State<Shared>, entered: Entered) -> Response {
    match read_snapshot(&state, &entered, CLUSTER_METADATA_URI).await {
        Ok(b) => json(&entered, b),
        Err(Missing::NotFound) => {
            entered.refresh((StatusCode::NOT_FOUND, "Cluster metadata not found"))
        }
        Err(Missing::Unreadable(r)) => entered.refresh(r),
    }
}

/// `GET /api/{*path}`: any other snapshot, by the request URI.
pub async fn fetched_endpoint(State(state): State<Shared>, entered: Entered, uri: Uri) -> Response {
    let request_uri = uri.path_and_query().map_or(uri.path(), |pq| pq.as_str());
    let path = uri.path().trim_end_matches('/');
    match read_snapshot(&state, &entered, request_uri).await {
        Ok(b) if path == "/api/v0/placement_groups" => json(&entered, with_bundles(b)),
        Ok(b) => json(&entered, b),
        Err(Missing::NotFound) => match missing_fallback(path) {
            Some(body) => json(&entered, body),
            None => entered.refresh((StatusCode::NOT_FOUND, "Endpoint data not found in storage")),
        },
        Err(Missing::Unreadable(r)) => entered.refresh(r),
    }
}

/// KubeRay's answer for a known endpoint of Ray's frontend with no snapshot (`path` without
/// its trailing `/`): the shape of Ray's own empty answer, so the page shows "nothing" rather
/// than an error. `None`: no such endpoint, a `404`.
fn missing_fallback(path: &str) -> Option<String> {
    match path {
        // `applications` must be there (the frontend calls Object.values on it); no
        // `http_options` makes it show "Serve not started", as on a live cluster.
        "/api/serve/applications" => Some(r#"{"applications":{}}"#.to_string()),
        "/api/v0/placement_groups" => Some(
            serde_json::json!({
                "result": true,
                "msg": "",
                "data": {"result": {
                    "total": 0,
                    "num_after_truncation": 0,
                    "num_filtered": 0,
                    "result": [],
                    "partial_failure_warning": "",
                    "warnings": null,
                }},
            })
            .to_string(),
        ),
        _ => {
            let job = path.strip_prefix("/api/data/datasets/")?;
            (!job.is_empty() && !job.contains('/')).then(|| r#"{"datasets":[]}"#.to_string())
        }
    }
}

/// Largest answer the `bundles` back-fill makes; past it the snapshot is answered as
/// stored. The back-fill adds 14 bytes a group (`,"bundles":[]`): a 3-byte `{}` group grows
/// five times, so a 64 MiB snapshot of them would make a 320 MiB answer.
pub const MAX_BACKFILLED_BYTES: usize = MAX_SNAPSHOT_BYTES as usize;

/// `body` with `"bundles": []` in each placement group that has none; unchanged if it is not
/// the State API's `{data: {result: {result: [..]}}}`, if nothing lacks them, or if the
/// answer would pass [`MAX_BACKFILLED_BYTES`].
///
/// The document is not built as a tree (serde_json's `Value` holds a `{}` group of 3 bytes
/// in about 700: review r36e, a 3 MB snapshot took 720 MiB): the groups are walked as raw
/// slices of the snapshot, each read only for whether it has `bundles`, and the answer is
/// the snapshot's own bytes with the member inserted where it lacks. So the back-fill holds
/// the snapshot and the answer, at most [`MAX_SNAPSHOT_BYTES`] + [`MAX_BACKFILLED_BYTES`].
fn with_bundles(body: Bytes) -> Bytes {
    backfill(&body).map_or(body, Bytes::from)
}

#[derive(serde::Deserialize)]
struct Top<'a> {
    #[serde(borrow)]
    data: &'a serde_json::value::RawValue,
}

#[derive(serde::Deserialize)]
struct Members<'a> {
    #[serde(borrow)]
    result: &'a serde_json::value::RawValue,
}

/// Whether a group has `bundles` (of any value, `null` too, as KubeRay looks).
#[derive(serde::Deserialize)]
struct Group {
    #[serde(default)]
    bundles: Present,
}

#[derive(Default)]
struct Present(bool);

impl<'de> serde::Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Present(true))
    }
}

/// The back-filled answer, `None` to answer `text` as stored.
fn backfill(text: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(text).ok()?;
    let data: Top = serde_json::from_str(text).ok()?;
    let outer: Members = serde_json::from_str(data.data.get()).ok()?;
    let groups: Members = serde_json::from_str(outer.result.get()).ok()?;
    let list = groups.result.get();
    let offset = |s: &str| s.as_ptr() as usize - text.as_ptr() as usize;
    let mut out: Vec<u8> = Vec::new();
    let mut cursor = 0usize;
    let mut seed = Groups {
        text,
        offset: &offset,
        out: &mut out,
        cursor: &mut cursor,
    };
    let mut de = serde_json::Deserializer::from_str(list);
    serde::de::DeserializeSeed::deserialize(&mut seed, &mut de).ok()??;
    if cursor == 0 {
        return None;
    }
    if out.len() + (text.len() - cursor) > MAX_BACKFILLED_BYTES {
        return None;
    }
    out.extend_from_slice(&text.as_bytes()[cursor..]);
    Some(out)
}

/// Walks the group list, writing `text` up to each group that lacks `bundles` and the member
/// into `out`; `Some(())` when done, `None` when the answer would be too large.
struct Groups<'t, 'o> {
    text: &'t str,
    offset: &'o dyn Fn(&str) -> usize,
    out: &'o mut Vec<u8>,
    cursor: &'o mut usize,
}

impl<'de, 't: 'de, 'o> serde::de::DeserializeSeed<'de> for &mut Groups<'t, 'o> {
    type Value = Option<()>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, 't: 'de, 'o> serde::de::Visitor<'de> for &mut Groups<'t, 'o> {
    type Value = Option<()>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of placement groups")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while let Some(g) = seq.next_element::<&'de serde_json::value::RawValue>()? {
            let raw = g.get();
            if !raw.starts_with('{') {
                continue;
            }
            let Ok(group) = serde_json::from_str::<Group>(raw) else {
                continue;
            };
            if group.bundles.0 {
                continue;
            }
            // The group's closing brace, and whether it has members before it.
            let close = (self.offset)(raw) + raw.len() - 1;
            let empty = raw[1..raw.len() - 1].trim().is_empty();
            if self.out.len() + (close - *self.cursor) + 14 > MAX_BACKFILLED_BYTES {
                // Drain the rest unread: the answer is the snapshot as stored.
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                return Ok(None);
            }
            self.out
                .extend_from_slice(&self.text.as_bytes()[*self.cursor..close]);
            self.out.extend_from_slice(if empty {
                br#""bundles":[]"#.as_slice()
            } else {
                br#","bundles":[]"#.as_slice()
            });
            *self.cursor = close;
        }
        Ok(Some(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallbacks_follow_kuberay() {
        assert_eq!(
            missing_fallback("/api/serve/applications").as_deref(),
            Some(r#"{"applications":{}}"#)
        );
        assert_eq!(
            missing_fallback("/api/data/datasets/03000000").as_deref(),
            Some(r#"{"datasets":[]}"#)
        );
        assert_eq!(missing_fallback("/api/data/datasets/"), None);
        assert_eq!(missing_fallback("/api/data/datasets/a/b"), None);
        assert_eq!(missing_fallback("/api/train/v2/runs"), None);
        let pg: serde_json::Value =
            serde_json::from_str(&missing_fallback("/api/v0/placement_groups").unwrap()).unwrap();
        assert_eq!(pg["data"]["result"]["total"], 0);
        assert!(pg["data"]["result"]["warnings"].is_null());
    }

    /// Review r36e: the back-fill parsed the whole snapshot into a tree (a 3 MB snapshot of
    /// `{}` groups: 720 MiB). Now it inserts the member into the snapshot's own bytes, and a
    /// snapshot whose answer would pass [`MAX_BACKFILLED_BYTES`] is answered as stored.
    #[test]
    fn backfill_keeps_the_snapshots_bytes_within_its_bound() {
        let b = with_bundles(Bytes::from_static(
            br#"{"result":true,"data":{"result":{"total":4,"result":[{"b":1,"a":"}"}, { }, {"bundles":null}, 5]}},"msg":""}"#,
        ));
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            r#"{"result":true,"data":{"result":{"total":4,"result":[{"b":1,"a":"}","bundles":[]}, { "bundles":[]}, {"bundles":null}, 5]}},"msg":""}"#
        );
        let groups = MAX_BACKFILLED_BYTES / 14 + 1;
        let mut text = String::from(r#"{"data":{"result":{"result":["#);
        text.push_str(&"{},".repeat(groups - 1));
        text.push_str("{}]}}}");
        let stored = Bytes::from(text);
        let answered = with_bundles(stored.clone());
        assert_eq!(answered.as_ptr(), stored.as_ptr(), "answered as stored");
        // Below the bound, every group gets its member.
        let small = Bytes::from(format!(
            r#"{{"data":{{"result":{{"result":[{}{{}}]}}}}}}"#,
            "{},".repeat(99_999)
        ));
        let v: serde_json::Value = serde_json::from_slice(&with_bundles(small)).unwrap();
        let list = v["data"]["result"]["result"].as_array().unwrap();
        assert_eq!(list.len(), 100_000);
        assert!(list
            .iter()
            .all(|g| g == &serde_json::json!({"bundles": []})));
    }

    #[test]
    fn bundles_are_backfilled_only_where_missing() {
        let b = with_bundles(Bytes::from_static(
            br#"{"data":{"result":{"result":[{"placement_group_id":"aa"},{"placement_group_id":"bb","bundles":[{"x":1}]}]}}}"#,
        ));
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            v["data"]["result"]["result"][0]["bundles"],
            serde_json::json!([])
        );
        assert_eq!(
            v["data"]["result"]["result"][1]["bundles"],
            serde_json::json!([{"x": 1}])
        );
        let same = Bytes::from_static(b"not json");
        assert_eq!(with_bundles(same.clone()), same);
    }
}
