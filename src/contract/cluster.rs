//! The two key families of one Ray cluster: `cluster-metadata/` (session markers, which make a
//! session visible) and `cluster-history/` (the prefix `P` of everything else), plus our own
//! `collector-quarantine/`, all under the optional root.

use super::names::is_dns1123_subdomain;

/// The key family of the session markers.
pub const METADATA_DIR: &str = "cluster-metadata";
/// The key family of everything else the history server reads.
pub const HISTORY_DIR: &str = "cluster-history";
/// The owner kinds, as directory names of both families.
pub const OWNER_KINDS: [&str; 3] = ["raycluster", "rayjob", "rayservice"];

/// `rest` below the optional `root`.
pub fn rooted(root: &str, rest: &str) -> String {
    if root.is_empty() {
        rest.to_string()
    } else {
        format!("{root}/{rest}")
    }
}

/// `[<root>/]cluster-metadata`: where the readers find clusters and sessions.
pub fn metadata_prefix(root: &str) -> String {
    rooted(root, METADATA_DIR)
}

/// Which Kubernetes object owns the Ray cluster; decides the `cluster-history/<kind>/...` prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A bare RayCluster.
    RayCluster,
    /// A RayCluster created by the named RayJob.
    RayJob(String),
    /// A RayCluster created by the named RayService.
    RayService(String),
}

impl Owner {
    /// Directory name of the owner kind in both key families.
    pub fn kind_dir(&self) -> &'static str {
        match self {
            Owner::RayCluster => "raycluster",
            Owner::RayJob(_) => "rayjob",
            Owner::RayService(_) => "rayservice",
        }
    }

    /// The owning RayJob or RayService, if any.
    pub fn name(&self) -> Option<&str> {
        match self {
            Owner::RayCluster => None,
            Owner::RayJob(n) | Owner::RayService(n) => Some(n),
        }
    }
}

/// Identity of the cluster whose history we write, and the optional root inside the bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterLayout {
    /// Prefix inside the bucket, without leading or trailing '/'; empty for none.
    pub root: String,
    /// Kubernetes namespace of the RayCluster.
    pub namespace: String,
    /// Name of the RayCluster.
    pub cluster: String,
    /// Owner of the RayCluster.
    pub owner: Owner,
}

impl ClusterLayout {
    fn with_root(&self, rest: &str) -> String {
        rooted(&self.root, rest)
    }

    /// Inverse of the cluster part of [`ClusterLayout::session_marker_key`]: the cluster
    /// named by the marker directory `<kind>/<dir>`, where `dir` is `<ns>_<cluster>`
    /// (raycluster) or `<ns>_<owner>_<cluster>` (rayjob, rayservice). The names are DNS-1123,
    /// so they hold no `_`; anything else is `None`.
    pub fn from_marker_dir(root: &str, kind: &str, dir: &str) -> Option<ClusterLayout> {
        let parts: Vec<&str> = dir.split('_').collect();
        if !parts.iter().all(|p| is_dns1123_subdomain(p)) {
            return None;
        }
        let (namespace, owner, cluster) = match (kind, parts.as_slice()) {
            ("raycluster", [ns, c]) => (ns, Owner::RayCluster, c),
            ("rayjob", [ns, o, c]) => (ns, Owner::RayJob(o.to_string()), c),
            ("rayservice", [ns, o, c]) => (ns, Owner::RayService(o.to_string()), c),
            _ => return None,
        };
        Some(ClusterLayout {
            root: root.to_string(),
            namespace: namespace.to_string(),
            cluster: cluster.to_string(),
            owner,
        })
    }

    /// `P/<session>`: everything of one session.
    pub fn session_prefix(&self, session: &str) -> String {
        format!("{}/{session}", self.history_prefix())
    }

    /// `<family>/<kind>/<ns>/[<owner>/]<cluster>` under the root: the shape shared by the
    /// history prefix and the quarantine prefix.
    fn cluster_path(&self, family: &str) -> String {
        let owner = self
            .owner
            .name()
            .map(|o| format!("{o}/"))
            .unwrap_or_default();
        self.with_root(&format!(
            "{family}/{}/{}/{owner}{}",
            self.owner.kind_dir(),
            self.namespace,
            self.cluster
        ))
    }

    /// `P` of the design notes: `[<root>/]cluster-history/<kind>/<ns>/[<owner>/]<cluster>`.
    pub fn history_prefix(&self) -> String {
        self.cluster_path(HISTORY_DIR)
    }

    /// The empty object that makes a session visible in the history server.
    pub fn session_marker_key(&self, session: &str) -> String {
        let joined = match self.owner.name() {
            Some(owner) => format!("{}_{}_{}", self.namespace, owner, self.cluster),
            None => format!("{}_{}", self.namespace, self.cluster),
        };
        self.with_root(&format!(
            "{METADATA_DIR}/{}/{}/{}",
            self.owner.kind_dir(),
            joined,
            session
        ))
    }

    /// Where input we could not use is kept, per cluster: not read by the history server.
    pub fn quarantine_prefix(&self) -> String {
        self.cluster_path("collector-quarantine")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(root: &str, owner: Owner) -> ClusterLayout {
        ClusterLayout {
            root: root.into(),
            namespace: "default".into(),
            cluster: "raycluster-historyserver".into(),
            owner,
        }
    }

    #[test]
    fn owned_cluster_keys_and_root() {
        let l = ClusterLayout {
            root: "history".into(),
            namespace: "default".into(),
            cluster: "rayjob-historyserver-abcde".into(),
            owner: Owner::RayJob("rayjob-historyserver".into()),
        };
        assert_eq!(
            l.history_prefix(),
            "history/cluster-history/rayjob/default/rayjob-historyserver/rayjob-historyserver-abcde"
        );
        assert_eq!(
            l.session_marker_key("session_x"),
            "history/cluster-metadata/rayjob/default_rayjob-historyserver_rayjob-historyserver-abcde/session_x"
        );
        let s = ClusterLayout {
            owner: Owner::RayService("svc".into()),
            root: String::new(),
            ..l
        };
        assert_eq!(
            s.history_prefix(),
            "cluster-history/rayservice/default/svc/rayjob-historyserver-abcde"
        );
        assert_eq!(
            s.session_marker_key("session_y"),
            "cluster-metadata/rayservice/default_svc_rayjob-historyserver-abcde/session_y"
        );
        assert_eq!(
            s.quarantine_prefix(),
            "collector-quarantine/rayservice/default/svc/rayjob-historyserver-abcde"
        );
    }

    #[test]
    fn marker_directories_parse_back() {
        for l in [
            layout("", Owner::RayCluster),
            layout("r", Owner::RayJob("job".into())),
            layout("", Owner::RayService("svc".into())),
        ] {
            let key = l.session_marker_key("session_1");
            let rest = key
                .strip_prefix(&metadata_prefix(&l.root))
                .and_then(|r| r.strip_prefix('/'))
                .unwrap();
            let parts: Vec<&str> = rest.split('/').collect();
            assert_eq!(
                ClusterLayout::from_marker_dir(&l.root, parts[0], parts[1]),
                Some(l.clone()),
                "{key}"
            );
        }
        assert_eq!(metadata_prefix(""), "cluster-metadata");
        assert_eq!(metadata_prefix("h"), "h/cluster-metadata");
        assert_eq!(
            layout("", Owner::RayCluster).session_prefix("s"),
            "cluster-history/raycluster/default/raycluster-historyserver/s"
        );
        for (kind, dir) in [
            ("raycluster", "a_b_c"),
            ("rayjob", "a_b"),
            ("raycluster", "A_b"),
            ("deployment", "a_b"),
        ] {
            assert_eq!(
                ClusterLayout::from_marker_dir("", kind, dir),
                None,
                "{kind}/{dir}"
            );
        }
    }
}
