//! Which Ray node this is, so logs land under `P/<session>/<node-hex>/logs/`.
//!
//! In order: `--node-id`; the raylet's own "Setting node ID node_id=<hex>" line in the
//! session's `raylet.out` (the last one wins, so a raylet restart with a new id files later
//! logs under the new id); `<ray tmp>/raylet_node_id` (KubeRay's old postStart hook); the
//! node id carried by this node's events; and, as a last resort like KubeRay, the
//! dashboard's node list matched by pod IP (wired in by the caller).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use crate::contract::id_to_hex;

/// The node id seen in this node's events, shared with the ingest side.
pub type EventNodeHint = Arc<Mutex<Option<String>>>;

/// The answer of a remote lookup: `Ok(None)` when the source answered but knows no id yet.
pub type RemoteAnswer = Result<Option<String>, String>;

/// The last resort for the node id, wired in by the app: a source outside this node (the
/// head's dashboard, asked for the node at this pod's IP). Kept as a function so this module
/// needs nothing of the dashboard.
#[derive(Clone)]
pub struct RemoteNodeLookup {
    source: String,
    lookup: Arc<dyn Fn() -> BoxFuture<'static, RemoteAnswer> + Send + Sync>,
}

impl RemoteNodeLookup {
    /// `source` names it in logs (e.g. "the dashboard's node list, pod IP 10.0.0.7").
    pub fn new(
        source: impl Into<String>,
        lookup: impl Fn() -> BoxFuture<'static, RemoteAnswer> + Send + Sync + 'static,
    ) -> RemoteNodeLookup {
        RemoteNodeLookup {
            source: source.into(),
            lookup: Arc::new(lookup),
        }
    }

    /// Asks once.
    pub fn lookup(&self) -> BoxFuture<'static, RemoteAnswer> {
        (self.lookup)()
    }

    /// What it asks.
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// Marker of the raylet line that names its own node id (Ray 2.60 `main.cc`).
const SETTING_NODE_ID: &[u8] = b"Setting node ID node_id=";
/// Older raylets: "Raylet of id, <hex> started."
const RAYLET_OF_ID: &[u8] = b"Raylet of id, ";

/// Per-session scan state of `raylet.out`, so each round reads only what was appended.
#[derive(Debug, Default, Clone)]
struct RayletScan {
    offset: u64,
    found: Option<String>,
}

/// Resolves and remembers node ids per session.
///
/// Clones share what they have read of each `raylet.out`, so the log shipper and the export
/// tailer read it once between them.
#[derive(Debug, Clone)]
pub struct NodeIdResolver {
    configured: Option<String>,
    ray_tmp: PathBuf,
    events: EventNodeHint,
    scans: Arc<Mutex<HashMap<PathBuf, RayletScan>>>,
}

impl NodeIdResolver {
    /// A resolver; `configured` is `--node-id` in hex.
    pub fn new(configured: Option<String>, ray_tmp: PathBuf, events: EventNodeHint) -> Self {
        NodeIdResolver {
            configured,
            ray_tmp,
            events,
            scans: Arc::default(),
        }
    }

    /// The node id for logs of the session in `session_dir`, from local sources only.
    pub fn resolve_local(&mut self, session_dir: &Path) -> Option<String> {
        if let Some(id) = &self.configured {
            return Some(id.clone());
        }
        if let Some(id) = self.scan_raylet_out(session_dir) {
            return Some(id);
        }
        if let Ok(text) = std::fs::read_to_string(self.ray_tmp.join("raylet_node_id")) {
            if let Some(id) = valid_hex_id(text.trim()) {
                return Some(id);
            }
        }
        self.events.lock().ok().and_then(|g| g.clone())
    }

    /// The id named by the last "Setting node ID" line of `<session>/logs/raylet.out`.
    fn scan_raylet_out(&mut self, session_dir: &Path) -> Option<String> {
        let path = session_dir.join("logs").join("raylet.out");
        // Held while reading, so two clones never read the same bytes twice.
        let mut scans = self.scans.lock().unwrap_or_else(|p| p.into_inner());
        let scan = scans.entry(session_dir.to_path_buf()).or_default();
        let Ok(mut f) = File::open(&path) else {
            return scan.found.clone();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < scan.offset {
            // Truncated or replaced (rotation): start over.
            scan.offset = 0;
        }
        if f.seek(SeekFrom::Start(scan.offset)).is_err() {
            return scan.found.clone();
        }
        let mut buf = vec![0u8; 256 * 1024];
        let mut carry: Vec<u8> = Vec::new();
        let mut pos = scan.offset;
        loop {
            let n = match f.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            carry.extend_from_slice(&buf[..n]);
            // Only complete lines are examined; the rest waits for the next round.
            let Some(last_nl) = carry.iter().rposition(|&c| c == b'\n') else {
                continue;
            };
            for line in carry[..last_nl].split(|&c| c == b'\n') {
                if let Some(id) = node_id_in_line(line) {
                    scan.found = Some(id);
                }
            }
            pos += last_nl as u64 + 1;
            carry.drain(..=last_nl);
        }
        scan.offset = pos;
        scan.found.clone()
    }
}

fn node_id_in_line(line: &[u8]) -> Option<String> {
    let find = |needle: &[u8]| {
        line.windows(needle.len())
            .position(|w| w == needle)
            .map(|i| i + needle.len())
    };
    let start = find(SETTING_NODE_ID).or_else(|| find(RAYLET_OF_ID))?;
    let rest = &line[start..];
    let end = rest
        .iter()
        .position(|c| !c.is_ascii_hexdigit())
        .unwrap_or(rest.len());
    valid_hex_id(std::str::from_utf8(&rest[..end]).ok()?)
}

/// A 56-hex-digit (28-byte) Ray node id, lower-cased.
fn valid_hex_id(s: &str) -> Option<String> {
    if s.len() == 56 && s.bytes().all(|c| c.is_ascii_hexdigit()) {
        id_to_hex(s).ok().map(|h| h.as_str().to_string())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const A: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
    const B: &str = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";

    #[test]
    fn raylet_out_last_setting_line_wins_and_is_read_incrementally() {
        let tmp = tempfile::tempdir().unwrap();
        let session = tmp.path().join("session_x");
        std::fs::create_dir_all(session.join("logs")).unwrap();
        let hint: EventNodeHint = Arc::new(Mutex::new(Some(B.to_string())));
        let mut r = NodeIdResolver::new(None, tmp.path().to_path_buf(), hint);
        // Nothing local yet: the events' node id.
        assert_eq!(r.resolve_local(&session).as_deref(), Some(B));
        let mut f = std::fs::File::create(session.join("logs/raylet.out")).unwrap();
        writeln!(
            f,
            "[2026-11-22 02:56:15,477 I 1 1] (raylet) main.cc:711: Setting node ID node_id={}",
            A.to_uppercase()
        )
        .unwrap();
        writeln!(
            f,
            "[..] (raylet) accessor.cc:475: Received address for node, IsAlive = 1 node_id={B}"
        )
        .unwrap();
        write!(f, "[..] (raylet) main.cc:711: Setting node ID node_id={B}").unwrap(); // incomplete line
        assert_eq!(r.resolve_local(&session).as_deref(), Some(A));
        writeln!(f).unwrap();
        // A clone (the other reader of the same node) shares what was read.
        let mut other = r.clone();
        assert_eq!(other.resolve_local(&session).as_deref(), Some(B));
        let offset = |r: &NodeIdResolver| r.scans.lock().unwrap()[&session].offset;
        assert_eq!(
            offset(&r),
            std::fs::metadata(session.join("logs/raylet.out"))
                .unwrap()
                .len()
        );
        writeln!(f, "[..] (raylet) main.cc:711: Setting node ID node_id={A}").unwrap();
        assert_eq!(other.resolve_local(&session).as_deref(), Some(A));
        assert_eq!(r.resolve_local(&session).as_deref(), Some(A));
        assert_eq!(offset(&r), offset(&other));
        let mut cfg =
            NodeIdResolver::new(Some("ab".into()), tmp.path().to_path_buf(), Arc::default());
        assert_eq!(cfg.resolve_local(&session).as_deref(), Some("ab"));
    }

    #[test]
    fn old_raylet_line_and_node_id_file() {
        assert_eq!(
            node_id_in_line(
                format!("(raylet) node_manager.cc:355: Raylet of id, {A} started.").as_bytes()
            )
            .as_deref(),
            Some(A)
        );
        assert_eq!(node_id_in_line(b"Setting node ID node_id=../../etc"), None);
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("raylet_node_id"), format!("{A}\n")).unwrap();
        let mut r = NodeIdResolver::new(None, tmp.path().to_path_buf(), Arc::default());
        assert_eq!(
            r.resolve_local(&tmp.path().join("session_y")).as_deref(),
            Some(A)
        );
    }
}
