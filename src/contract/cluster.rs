//! The two key families of one Ray cluster: `cluster-metadata/` (session markers, which make a
//! session visible) and `cluster-history/` (the prefix `P` of everything else), plus our own
//! `collector-quarantine/`, all under the optional root.

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

    fn name(&self) -> Option<&str> {
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
        if self.root.is_empty() {
            rest.to_string()
        } else {
            format!("{}/{}", self.root, rest)
        }
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
        self.cluster_path("cluster-history")
    }

    /// The empty object that makes a session visible in the history server.
    pub fn session_marker_key(&self, session: &str) -> String {
        let joined = match self.owner.name() {
            Some(owner) => format!("{}_{}_{}", self.namespace, owner, self.cluster),
            None => format!("{}_{}", self.namespace, self.cluster),
        };
        self.with_root(&format!(
            "cluster-metadata/{}/{}/{}",
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
}
