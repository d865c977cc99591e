//! Where a log file's object goes when its name alone does not settle it, so that one file
//! is one object for the whole session, whatever raylets come later and however often the
//! collector restarts:
//!
//! - **The session's owner.** Files no writer can be told for (`gcs_server.out`,
//!   `monitor.log`, `dashboard.log`, `events/`, …: [`LogNode::Session`]) go under one node
//!   for the whole session: `--node-id` when given; else the node recorded in the ledger for
//!   the session; else the node of the session's first raylet (the lowest-numbered
//!   `raylet[.N].out` that names itself: on the head, the GCS, the monitor and the dashboard
//!   start with it), else the node the round resolved. It is recorded in the ledger the
//!   first time (not the `unknown-node` fallback), so a raylet restarted into the session
//!   (`raylet.1.out`, another node) or a collector restart never moves them.
//! - **A worker's file whose node could not be told** ([`LogNode::Unnamed`], or held at the
//!   final flush): under the node its object already has in this session, if it has one;
//!   else under the node the round resolved (the newest raylet's, which after a container
//!   restart is the live one, the likeliest writer of a file still growing).
//! - **A file already uploaded in this session** stays under the node its object has, even
//!   when its writer names another node later (a worker's output filed as unnamed before its
//!   core worker log appeared). The keys a restart could not find again from the files (a
//!   backup's, a file filed by a guess) and the owner are saved to the ledger as soon as they
//!   exist, not at the end of the round, so this holds after a kill -9 too.
//! - **A rotated backup** keeps the key of its first upload: looked up by its live name and
//!   inode among the session's objects in the ledger, and kept when the file still begins
//!   with what that object holds (a backup written once more after its rename grows that
//!   one object); a new key, named by its mtime as [`crate::contract::logs`] says, only for a
//!   backup never uploaded (or a reused inode whose content is another file's).
//!
//! [`LogNode::Session`]: crate::node::node_id::LogNode::Session
//! [`LogNode::Unnamed`]: crate::node::node_id::LogNode::Unnamed

use std::collections::HashMap;
use std::path::Path;

use super::ledger::Ledger;
use crate::contract::logs::{node_logs_prefix, parse_rotated_log_rel};
use crate::node::node_id::NodeIdResolver;
use crate::storage::append::UNKNOWN_NODE;

/// What the ledger holds of one session, indexed for a round.
#[derive(Debug, Default)]
pub(super) struct SessionObjects {
    /// Live path below `logs/` → the node its object is under.
    live: HashMap<String, String>,
    /// (node, live path, inode) → the keys of that inode's backups.
    backups: HashMap<(String, String, u64), Vec<String>>,
}

impl SessionObjects {
    /// Reads the ledger's keys of `session` (one ordered range of the ledger).
    pub(super) fn of(ledger: &Ledger, history_prefix: &str, session: &str) -> SessionObjects {
        let mut out = SessionObjects::default();
        let start = format!("{history_prefix}/{session}/");
        for key in ledger
            .data
            .objects
            .range::<String, _>(start.clone()..)
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(&start))
        {
            let Some((node, _)) = key[start.len()..].split_once('/') else {
                continue;
            };
            let Some(rel) = key.strip_prefix(&node_logs_prefix(history_prefix, session, node))
            else {
                continue;
            };
            match parse_rotated_log_rel(rel) {
                Some((live, ino)) => out
                    .backups
                    .entry((node.to_string(), live.to_string(), ino))
                    .or_default()
                    .push(key.clone()),
                None => {
                    out.live.insert(rel.to_string(), node.to_string());
                }
            }
        }
        out
    }

    /// The node the object of the live file `rel` is under, if it was uploaded.
    pub(super) fn node_of(&self, rel: &str) -> Option<&str> {
        self.live.get(rel).map(String::as_str)
    }

    /// The keys under which backups of `live` with inode `ino` were uploaded under `node`,
    /// newest name last.
    pub(super) fn backup_keys(&self, node: &str, live: &str, ino: u64) -> &[String] {
        self.backups
            .get(&(node.to_string(), live.to_string(), ino))
            .map_or(&[], Vec::as_slice)
    }
}

/// The session's owner (see the module doc); `resolved` is the node the round resolved.
pub(super) fn session_owner(
    ledger: &mut Ledger,
    nodes: &mut NodeIdResolver,
    session: &str,
    session_dir: &Path,
    resolved: &str,
) -> String {
    if let Some(id) = nodes.configured() {
        return id.to_string();
    }
    if let Some(id) = ledger.data.session_nodes.get(session) {
        return id.clone();
    }
    let owner = nodes
        .first_raylet(session_dir)
        .unwrap_or_else(|| resolved.to_string());
    if owner != UNKNOWN_NODE {
        tracing::info!(
            session,
            node = %owner,
            "files of the session no writer can be told for go under this node for the whole session"
        );
        ledger
            .data
            .session_nodes
            .insert(session.to_string(), owner.clone());
        ledger.dirty = true;
        // Durable at once, not at the end of the round: a kill -9 before it ends must not
        // let a restart pick another owner.
        ledger.save();
    }
    owner
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::ledger::LedgerEntry;

    #[test]
    fn the_ledger_tells_where_each_file_of_a_session_went() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::load(dir.path().join("l.json"), "b").unwrap();
        let entry = LedgerEntry {
            size: 1,
            mtime_ns: 1,
            hash: 1,
            ino: 7,
            uploaded_at: 1,
            e_tag: None,
            head: None,
            full: None,
        };
        for key in [
            "P/s1/A/logs/gcs_server.out",
            "P/s1/B/logs/worker-ab-01000000-3.out",
            "P/s1/A/logs/dashboard.log.rotated.20261122T023140.123456789Z.ino7",
            "P/s1/A/logs/dashboard.log.rotated.20261122T023150.000000000Z.ino7",
            "P/s1/A/logs/events/event_GCS.log",
            // Another session, and a session whose name starts like this one's.
            "P/s2/C/logs/gcs_server.out",
            "P/s1x/C/logs/app.log",
        ] {
            ledger.data.objects.insert(key.into(), entry.clone());
        }
        let placed = SessionObjects::of(&ledger, "P", "s1");
        assert_eq!(placed.node_of("gcs_server.out"), Some("A"));
        assert_eq!(placed.node_of("worker-ab-01000000-3.out"), Some("B"));
        assert_eq!(placed.node_of("events/event_GCS.log"), Some("A"));
        assert_eq!(placed.node_of("app.log"), None);
        assert_eq!(
            placed.backup_keys("A", "dashboard.log", 7),
            [
                "P/s1/A/logs/dashboard.log.rotated.20261122T023140.123456789Z.ino7",
                "P/s1/A/logs/dashboard.log.rotated.20261122T023150.000000000Z.ino7"
            ]
        );
        assert!(placed.backup_keys("B", "dashboard.log", 7).is_empty());
        assert!(placed.backup_keys("A", "dashboard.log", 8).is_empty());
    }

    #[test]
    fn the_owner_is_pinned_once_known_and_never_the_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let session = dir.path().join("s1");
        std::fs::create_dir_all(session.join("logs")).unwrap();
        let mut ledger = Ledger::load(dir.path().join("l.json"), "b").unwrap();
        let mut nodes = NodeIdResolver::new(None, dir.path().into(), Default::default());
        // Nothing names a raylet yet; the round's node is the unknown-node fallback.
        let owner = session_owner(&mut ledger, &mut nodes, "s1", &session, UNKNOWN_NODE);
        assert_eq!(owner, UNKNOWN_NODE);
        assert!(ledger.data.session_nodes.is_empty());
        let owner = session_owner(&mut ledger, &mut nodes, "s1", &session, "A");
        assert_eq!(owner, "A");
        // Later rounds resolve another node: the owner stays.
        let owner = session_owner(&mut ledger, &mut nodes, "s1", &session, "B");
        assert_eq!(owner, "A");
        let mut configured =
            NodeIdResolver::new(Some("C".into()), dir.path().into(), Default::default());
        let owner = session_owner(&mut ledger, &mut configured, "s1", &session, "B");
        assert_eq!(owner, "C");
    }
}
