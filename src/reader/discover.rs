//! Which clusters and sessions a bucket holds: the session markers under
//! `[<root>/]cluster-metadata/`, parsed back by the contract, filtered by `--cluster` and
//! `--namespace`, and the session `--session` names (`latest`: newest by the time in its name).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use futures::StreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use serde::Serialize;

use crate::contract::{self, ClusterLayout, Hour, Owner};
use crate::storage::StorageSpec;

use super::error::ReadError;
use super::limits::READ_CONCURRENCY;
use super::report::Problems;
use super::values::store_error;
use crate::cli::InspectArgs;

/// A cluster as named by its metadata directory.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub(crate) struct ClusterId {
    pub(super) kind: String,
    pub(super) namespace: String,
    pub(super) owner: Option<String>,
    pub(super) cluster: String,
}

impl ClusterId {
    /// The cluster of the marker directory `<kind>/<dir>` ([`ClusterLayout::from_marker_dir`]).
    pub(super) fn parse(kind: &str, dir: &str) -> Option<ClusterId> {
        let layout = ClusterLayout::from_marker_dir("", kind, dir)?;
        Some(ClusterId {
            kind: layout.owner.kind_dir().to_string(),
            owner: layout.owner.name().map(str::to_string),
            namespace: layout.namespace,
            cluster: layout.cluster,
        })
    }

    /// The layout of this cluster's keys below `root`.
    pub(crate) fn layout(&self, root: &str) -> ClusterLayout {
        let owner = match (self.kind.as_str(), &self.owner) {
            ("rayjob", Some(o)) => Owner::RayJob(o.clone()),
            ("rayservice", Some(o)) => Owner::RayService(o.clone()),
            _ => Owner::RayCluster,
        };
        ClusterLayout {
            root: root.to_string(),
            namespace: self.namespace.clone(),
            cluster: self.cluster.clone(),
            owner,
        }
    }

    /// `ns/cluster` or `ns/owner/cluster`, for people.
    pub(super) fn display(&self) -> String {
        match &self.owner {
            Some(o) => format!("{}/{o}/{}", self.namespace, self.cluster),
            None => format!("{}/{}", self.namespace, self.cluster),
        }
    }
}

/// What the metadata prefix holds: clusters and their sessions, plus anything unrecognised.
pub(crate) struct Discovered {
    pub(super) clusters: BTreeMap<ClusterId, Vec<String>>,
    pub(super) problems: Problems,
}

/// Lists the session markers, filtered by `--cluster`/`--namespace`.
pub(crate) async fn discover(
    store: &Arc<dyn ObjectStore>,
    spec: &StorageSpec,
    args: &InspectArgs,
) -> anyhow::Result<Discovered> {
    let prefix = contract::cluster::metadata_prefix(&spec.root);
    let kinds = store
        .list_with_delimiter(Some(&ObjectPath::from(prefix.as_str())))
        .await
        .map_err(|e| anyhow::anyhow!("listing {prefix}/ in {spec}: {}", store_error(&e)))?;
    let mut problems = Problems::default();
    let mut cluster_dirs = Vec::new();
    for kind_path in &kinds.common_prefixes {
        let kind = kind_path.filename().unwrap_or_default().to_string();
        if !contract::cluster::OWNER_KINDS.contains(&kind.as_str()) {
            problems.note(kind_path.as_ref(), "unknown owner kind directory; skipped");
            continue;
        }
        // One listing that fails (a key the client cannot parse) costs only itself.
        let listed = match store.list_with_delimiter(Some(kind_path)).await {
            Ok(l) => l,
            Err(e) => {
                problems.unreadable(
                    &format!("{kind_path}/"),
                    &format!("listing failed: {}", store_error(&e)),
                );
                continue;
            }
        };
        for dir in listed.common_prefixes {
            let name = dir.filename().unwrap_or_default().to_string();
            match ClusterId::parse(&kind, &name) {
                Some(id) => cluster_dirs.push((id, dir)),
                None => problems.note(dir.as_ref(), "not <namespace>_[<owner>_]<cluster>; skipped"),
            }
        }
    }
    let total_clusters = cluster_dirs.len();
    let wanted = |id: &ClusterId| {
        args.cluster.as_deref().is_none_or(|c| c == id.cluster)
            && args.namespace.as_deref().is_none_or(|n| n == id.namespace)
    };
    cluster_dirs.retain(|(id, _)| wanted(id));
    let listings: Vec<_> = futures::stream::iter(cluster_dirs)
        .map(|(id, dir)| async move {
            let listed = store.list_with_delimiter(Some(&dir)).await;
            (id, dir, listed)
        })
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    let mut clusters: BTreeMap<ClusterId, Vec<String>> = BTreeMap::new();
    for (id, dir, listed) in listings {
        let listed = match listed {
            Ok(l) => l,
            Err(e) => {
                problems.unreadable(
                    &format!("{dir}/"),
                    &format!("listing failed: {}", store_error(&e)),
                );
                continue;
            }
        };
        let sessions = clusters.entry(id).or_default();
        for marker in listed.objects {
            let name = marker.location.filename().unwrap_or_default();
            if is_session_name(name) {
                sessions.push(name.to_string());
            } else {
                problems.note(
                    marker.location.as_ref(),
                    "not a session name (session_…); skipped",
                );
            }
        }
        sessions.sort_by_key(|s| session_sort_key(s));
    }
    clusters.retain(|_, sessions| !sessions.is_empty());
    if clusters.is_empty() {
        if total_clusters == 0 || (args.cluster.is_none() && args.namespace.is_none()) {
            return Err(ReadError::NoMarkers {
                storage: spec.to_string(),
                prefix,
            }
            .into());
        }
        return Err(ReadError::NoSuchSession {
            wanted: describe_cluster_filter(args),
            known: format!("{total_clusters} other cluster(s); run without --cluster/--namespace"),
        }
        .into());
    }
    Ok(Discovered { clusters, problems })
}

pub(super) fn describe_cluster_filter(args: &InspectArgs) -> String {
    let mut parts = Vec::new();
    if let Some(c) = &args.cluster {
        parts.push(format!("--cluster {c}"));
    }
    if let Some(n) = &args.namespace {
        parts.push(format!("--namespace {n}"));
    }
    parts.join(" ")
}

/// A marker's name is a session's: Ray names them `session_<start>_<pid>`, and the
/// collector takes `sessionName` from the events, a single safe path segment.
fn is_session_name(name: &str) -> bool {
    name.starts_with("session_") && contract::is_safe_segment(name)
}

/// Sessions `latest` looks into, newest first, for one that holds an object.
const MAX_LATEST_PROBES: usize = 32;
/// Why a newer marker was not taken as `latest`.
const EMPTY_MARKER: &str = "a session marker with no object under its session: not taken as latest";

/// Picks the session asked for with `--session`; with `latest`, also the newer markers
/// passed over (with why). `latest` is the newest by the time in its name that holds at
/// least one object: a marker alone (written early, or with a wrong clock) is not a
/// session to report.
pub(crate) async fn choose_session(
    store: &Arc<dyn ObjectStore>,
    spec: &StorageSpec,
    found: &Discovered,
    wanted: &str,
) -> Result<((ClusterId, String), Vec<(String, &'static str)>), ReadError> {
    let all = found
        .clusters
        .iter()
        .flat_map(|(id, sessions)| sessions.iter().map(move |s| (id, s)));
    if wanted == "latest" {
        let mut newest_first: Vec<(&ClusterId, &String)> = all.collect();
        newest_first.sort_by_key(|(_, s)| std::cmp::Reverse(session_sort_key(s)));
        let mut passed_over = Vec::new();
        for (id, session) in newest_first.iter().take(MAX_LATEST_PROBES) {
            let prefix = ObjectPath::from(format!(
                "{}/{session}",
                id.layout(&spec.root).history_prefix()
            ));
            // A failed listing is not evidence of emptiness: take it, and let the report
            // say what failed.
            let empty = store.list(Some(&prefix)).next().await.is_none();
            if !empty {
                return Ok((((*id).clone(), (*session).clone()), passed_over));
            }
            passed_over.push((
                id.layout(&spec.root).session_marker_key(session),
                EMPTY_MARKER,
            ));
        }
        // Nothing holds an object: the newest marker, as before.
        return newest_first
            .first()
            .map(|(id, s)| (((*id).clone(), (*s).clone()), Vec::new()))
            .ok_or_else(|| ReadError::NoSuchSession {
                wanted: "latest".into(),
                known: "none".into(),
            });
    }
    let matches: Vec<&ClusterId> = all
        .filter(|(_, s)| *s == wanted)
        .map(|(id, _)| id)
        .collect();
    match matches.as_slice() {
        [one] => Ok((((*one).clone(), wanted.to_string()), Vec::new())),
        [] => {
            let known: Vec<String> = found
                .clusters
                .iter()
                .flat_map(|(id, ss)| ss.iter().map(move |s| format!("{}:{s}", id.display())))
                .collect();
            let shown = known.len().min(10);
            let mut known_text = known[..shown].join(", ");
            if known.len() > shown {
                let _ = write!(known_text, " and {} more", known.len() - shown);
            }
            Err(ReadError::NoSuchSession {
                wanted: format!("--session {wanted}"),
                known: known_text,
            })
        }
        many => Err(ReadError::AmbiguousSession {
            session: wanted.to_string(),
            clusters: many
                .iter()
                .map(|id| format!("{} {}", id.kind, id.display()))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The wall-clock start in a session name `session_YYYY-MM-DD_HH-MM-SS_ffffff_pid`, as
/// `YYYY-MM-DDTHH:MM:SS.ffffff`. Ray formats it with the head's local clock (UTC in most
/// containers), so no zone is claimed.
pub(super) fn session_started(name: &str) -> Option<String> {
    let rest = name.strip_prefix("session_")?;
    let mut parts = rest.split('_');
    let (date, time, micros) = (parts.next()?, parts.next()?, parts.next()?);
    Hour::parse_label(&format!("{date}-00"))?;
    let t = time.as_bytes();
    let ok = t.len() == 8
        && t[2] == b'-'
        && t[5] == b'-'
        && t.iter()
            .enumerate()
            .all(|(i, c)| i == 2 || i == 5 || c.is_ascii_digit());
    if !ok || micros.is_empty() || !micros.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(format!(
        "{date}T{}:{}:{}.{micros}",
        &time[0..2],
        &time[3..5],
        &time[6..8]
    ))
}

/// Sessions sort by their start time, names without one first.
pub(super) fn session_sort_key(name: &str) -> (Option<String>, String) {
    (session_started(name), name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_names_and_clusters() {
        assert_eq!(
            session_started("session_2026-11-22_02-06-36_260774_21819").as_deref(),
            Some("2026-11-22T02:06:36.260774")
        );
        assert_eq!(session_started("session_latest"), None);
        assert_eq!(
            ClusterId::parse("raycluster", "default_c1")
                .unwrap()
                .display(),
            "default/c1"
        );
        assert_eq!(
            ClusterId::parse("rayjob", "ns_job_cluster-x")
                .unwrap()
                .owner
                .as_deref(),
            Some("job")
        );
        assert!(ClusterId::parse("raycluster", "a_b_c").is_none());
        assert!(ClusterId::parse("rayjob", "a_b").is_none());
        assert!(ClusterId::parse("raycluster", "A_b").is_none());
    }
}
