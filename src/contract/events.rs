//! Event objects: `P/<session>/<node>/node_events/<node>-<YYYY-MM-DD-HH>-<n>.jsonl[.gz]`,
//! `.../job_events/<job>/...` and our `.../export_events/<job | node>/...`.
//!
//! The history server accepts an event object only if its name matches
//! `-\d{4}-\d{2}-\d{2}-\d{2}(-\d+)?(\.jsonl)?(\.gz)?$`, and a `.gz` name means gzip bytes.

use super::cluster::ClusterLayout;
use super::hour::Hour;
use super::names::is_safe_segment;

/// The directory of a node's events without a job (and node events), below `P/<session>/<node>/`.
pub const NODE_EVENTS_DIR: &str = "node_events";
/// The directory of a node's job events, one subdirectory per job (hex id).
pub const JOB_EVENTS_DIR: &str = "job_events";
/// Ours: Ray's file-based export events, one subdirectory per job or [`EXPORT_NODE_GROUP`].
pub const EXPORT_EVENTS_DIR: &str = "export_events";

/// The `export_events/` group of export events that belong to no job (Ray Train attempts
/// whose run was not seen yet, node and actor events); other groups are job ids in hex.
pub const EXPORT_NODE_GROUP: &str = "node";

/// Appended to the name of an object whose bytes are gzip: the history server decides by the
/// name alone (and such an object must carry no `Content-Encoding` header).
pub const GZIP_SUFFIX: &str = ".gz";

impl ClusterLayout {
    /// The key of an event segment: `P/<relative key>` (see
    /// [`Partition::segment_relative_key`]), with [`GZIP_SUFFIX`] when its bytes are gzip.
    pub fn event_object_key(&self, relative_key: &str, gzip: bool) -> String {
        let gz = if gzip { GZIP_SUFFIX } else { "" };
        format!("{}/{relative_key}{gz}", self.history_prefix())
    }

    /// The key of a quarantine file below the quarantine prefix, with [`GZIP_SUFFIX`] when its
    /// bytes are gzip.
    pub fn quarantine_object_key(&self, relative_key: &str, gzip: bool) -> String {
        let gz = if gzip { GZIP_SUFFIX } else { "" };
        format!("{}/{relative_key}{gz}", self.quarantine_prefix())
    }
}

/// Which event stream of a node an event belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stream {
    /// `node_events/`: node events and events without a job.
    Node,
    /// `job_events/<job-hex>/`.
    Job(String),
    /// `export_events/<job-hex or "node">/`: Ray's file-based export events.
    Export(String),
}

/// The unit of spooling and uploading: one session, node, stream and hour.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Partition {
    /// Ray session name, a safe segment.
    pub session: String,
    /// Node id in lower-case hex (or the configured fallback), a safe segment.
    pub node: String,
    /// Node or job stream.
    pub stream: Stream,
    /// UTC hour of the events' own timestamps.
    pub hour: Hour,
}

impl Partition {
    /// Key of one segment of this partition relative to `P`, without compression suffix:
    /// `<session>/<node>/node_events/<node>-<YYYY-MM-DD-HH>-<n>.jsonl` or
    /// `<session>/<node>/job_events/<job>/<node>-<YYYY-MM-DD-HH>-<n>.jsonl`.
    pub fn segment_relative_key(&self, n: u64) -> String {
        let file = format!("{}-{}-{}.jsonl", self.node, self.hour.label(), n);
        match &self.stream {
            Stream::Node => format!("{}/{}/{NODE_EVENTS_DIR}/{file}", self.session, self.node),
            Stream::Job(job) => {
                format!(
                    "{}/{}/{JOB_EVENTS_DIR}/{job}/{file}",
                    self.session, self.node
                )
            }
            Stream::Export(group) => {
                format!(
                    "{}/{}/{EXPORT_EVENTS_DIR}/{group}/{file}",
                    self.session, self.node
                )
            }
        }
    }

    /// Inverse of [`Partition::segment_relative_key`], for segments found in the spool at start.
    pub fn parse_relative_key(rel: &str) -> Option<(Partition, u64)> {
        let parts: Vec<&str> = rel.split('/').collect();
        let (session, node, stream, file) = match parts.as_slice() {
            [s, n, NODE_EVENTS_DIR, f] => (*s, *n, Stream::Node, *f),
            [s, n, JOB_EVENTS_DIR, j, f] if is_safe_segment(j) => {
                (*s, *n, Stream::Job(j.to_string()), *f)
            }
            [s, n, EXPORT_EVENTS_DIR, g, f] if is_safe_segment(g) => {
                (*s, *n, Stream::Export(g.to_string()), *f)
            }
            _ => return None,
        };
        if !is_safe_segment(session) || !is_safe_segment(node) {
            return None;
        }
        let stem = file
            .strip_prefix(node)?
            .strip_prefix('-')?
            .strip_suffix(".jsonl")?;
        let (hour, n) = stem.rsplit_once('-')?;
        let n: u64 = n.parse().ok()?;
        let hour = Hour::parse_label(hour)?;
        Some((
            Partition {
                session: session.to_string(),
                node: node.to_string(),
                stream,
                hour,
            },
            n,
        ))
    }
}

/// The hour partition (and sequence number, if any) in an event object's name, if the name is
/// one the history server reads: `-YYYY-MM-DD-HH[-<n>][.jsonl][.gz]` at the end. This reads
/// KubeRay's collector's objects too (its `<n>` is optional, its hour the file's creation).
pub fn parse_event_object_name(name: &str) -> Option<(Hour, Option<u64>)> {
    let stem = name.strip_suffix(GZIP_SUFFIX).unwrap_or(name);
    let stem = stem.strip_suffix(".jsonl").unwrap_or(stem);
    if let Some((head, n)) = stem.rsplit_once('-') {
        if !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) {
            if let Some(hour) = hour_at_end(head) {
                return Some((hour, n.parse().ok()));
            }
        }
    }
    hour_at_end(stem).map(|h| (h, None))
}

/// `...-YYYY-MM-DD-HH` → the hour.
fn hour_at_end(s: &str) -> Option<Hour> {
    let cut = s.len().checked_sub(13)?;
    if !s.is_char_boundary(cut) || !s[..cut].ends_with('-') {
        return None;
    }
    Hour::parse_label(&s[cut..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{ClusterLayout, Owner};
    use crate::util::time::parse_rfc3339_seconds;

    fn layout(root: &str, owner: Owner) -> ClusterLayout {
        ClusterLayout {
            root: root.into(),
            namespace: "default".into(),
            cluster: "raycluster-historyserver".into(),
            owner,
        }
    }

    #[test]
    fn raycluster_keys_match_the_history_server() {
        let l = layout("", Owner::RayCluster);
        let s = "session_2026-08-08_01-45-50_123456_1";
        assert_eq!(
            l.session_marker_key(s),
            "cluster-metadata/raycluster/default_raycluster-historyserver/session_2026-08-08_01-45-50_123456_1"
        );
        assert_eq!(
            l.history_prefix(),
            "cluster-history/raycluster/default/raycluster-historyserver"
        );
        let node = "0f690c018f332312c5b989cb5e700a26dbae9b206feb5f1f086485ee";
        let p = Partition {
            session: s.into(),
            node: node.into(),
            stream: Stream::Job("03000000".into()),
            hour: Hour::from_unix_seconds(
                parse_rfc3339_seconds("2026-08-08T01:45:58.211147463Z").unwrap(),
            ),
        };
        assert_eq!(
            format!("{}/{}", l.history_prefix(), p.segment_relative_key(1786153558211147463)),
            "cluster-history/raycluster/default/raycluster-historyserver/session_2026-08-08_01-45-50_123456_1/\
             0f690c018f332312c5b989cb5e700a26dbae9b206feb5f1f086485ee/job_events/03000000/\
             0f690c018f332312c5b989cb5e700a26dbae9b206feb5f1f086485ee-2026-08-08-01-1786153558211147463.jsonl"
        );
        let n = Partition {
            stream: Stream::Node,
            ..p
        };
        assert_eq!(
            n.segment_relative_key(7),
            format!("{s}/{node}/node_events/{node}-2026-08-08-01-7.jsonl")
        );
    }

    #[test]
    fn event_object_names_match_the_readers_pattern() {
        // -\d{4}-\d{2}-\d{2}-\d{2}(-\d+)?(\.jsonl)?(\.gz)?$
        let p = Partition {
            session: "s".into(),
            node: "ab".into(),
            stream: Stream::Node,
            hour: Hour::from_unix_seconds(0),
        };
        let k = p.segment_relative_key(123);
        assert!(k.ends_with("ab-1970-01-01-00-123.jsonl"), "{k}");
        assert_eq!(Partition::parse_relative_key(&k), Some((p, 123)));
        assert_eq!(
            Partition::parse_relative_key("s/ab/node_events/zz-1970-01-01-00-1.jsonl"),
            None
        );
        assert_eq!(
            Partition::parse_relative_key("../ab/node_events/ab-1970-01-01-00-1.jsonl"),
            None
        );
        assert_eq!(
            Partition::parse_relative_key("s/ab/job_events/../ab-1970-01-01-00-1.jsonl"),
            None
        );
    }

    #[test]
    fn event_object_names_parse_back() {
        let h = Hour::parse_label("2026-11-22-02").unwrap();
        let node = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";
        for (name, n) in [
            (
                format!("{node}-2026-11-22-02-1795313302138000000.jsonl.gz"),
                Some(1795313302138000000),
            ),
            (
                format!("{node}-2026-11-22-02-1795313302138000000.jsonl"),
                Some(1795313302138000000),
            ),
            (format!("{node}-2026-11-22-02-7.gz"), Some(7)),
            (format!("{node}-2026-11-22-02"), None),
            (format!("{node}-2026-11-22-02.jsonl"), None),
            ("node-abcd-2026-11-22-02".to_string(), None),
        ] {
            assert_eq!(parse_event_object_name(&name), Some((h, n)), "{name}");
        }
        for bad in [
            "foo.txt",
            "node-abcd-2026-11-22-2",
            "2026-11-22-02",
            "x-2026-13-22-02.jsonl",
            "x-2026-11-22-02-.jsonl",
        ] {
            assert_eq!(parse_event_object_name(bad), None, "{bad}");
        }
    }
}
