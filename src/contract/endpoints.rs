//! Dashboard snapshots: `P/<session>/fetched_endpoints/restful__<request URI>`.
//!
//! The history server replays a dead cluster's dashboard by computing the same name from the
//! request URI its own frontend sends (query string included) and reading that object, so the
//! rule below is KubeRay's `EndpointPathToStorageKey`, byte for byte.

/// The directory of a session's snapshots, beside its node directories.
pub const FETCHED_ENDPOINTS_DIR: &str = "fetched_endpoints";

/// The object name KubeRay gives the answer to `request_uri` under `fetched_endpoints/`:
/// `restful__` + the URI with every leading and trailing `/` removed and every other `/`
/// replaced by `__`. The query string is kept as is (a `/` inside it is replaced too, exactly
/// as KubeRay does), because the history server computes the same function over its own
/// request URI to find the object.
///
/// `/api/v0/placement_groups?detail=1&limit=10000` →
/// `restful__api__v0__placement_groups?detail=1&limit=10000`.
pub fn endpoint_object_name(request_uri: &str) -> String {
    format!(
        "restful__{}",
        request_uri.trim_matches('/').replace('/', "__")
    )
}

/// The key of the snapshot of `request_uri` in `session`.
pub fn endpoint_key(history_prefix: &str, session: &str, request_uri: &str) -> String {
    format!(
        "{history_prefix}/{session}/{FETCHED_ENDPOINTS_DIR}/{}",
        endpoint_object_name(request_uri)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_kuberay() {
        // The examples of KubeRay's EndpointPathToStorageKey and of its collector tests.
        let cases = [
            (
                "/api/v0/cluster_metadata",
                "restful__api__v0__cluster_metadata",
            ),
            ("/api/v0/nodes/summary", "restful__api__v0__nodes__summary"),
            (
                "/api/serve/applications/",
                "restful__api__serve__applications",
            ),
            ("/timezone", "restful__timezone"),
            (
                "/api/v0/placement_groups?detail=1&limit=10000",
                "restful__api__v0__placement_groups?detail=1&limit=10000",
            ),
            (
                "/api/data/datasets/03000000",
                "restful__api__data__datasets__03000000",
            ),
            ("/api/train/v2/runs/v1", "restful__api__train__v2__runs__v1"),
            // Go's strings.Trim removes every leading and trailing '/'; inner ones all become
            // "__", also inside the query.
            ("//api//x//", "restful__api____x"),
            ("/api/x/?p=/a/b", "restful__api__x__?p=__a__b"),
        ];
        for (uri, name) in cases {
            assert_eq!(endpoint_object_name(uri), name, "{uri}");
        }
        assert_eq!(
            endpoint_key(
                "cluster-history/raycluster/default/rc",
                "session_2026-08-08_01-45-50_123456_1",
                "/timezone"
            ),
            "cluster-history/raycluster/default/rc/session_2026-08-08_01-45-50_123456_1/fetched_endpoints/restful__timezone"
        );
    }
}
