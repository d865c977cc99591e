//! The bucket layout that KubeRay's history server reads, byte for byte: every object key we
//! write and every key we parse back lives in this module, and nothing else builds a key.
//!
//! `P = [<root>/]cluster-history/<raycluster | rayjob/<owner> | rayservice/<owner>>/<ns>/<cluster>`
//! (owned clusters: `cluster-history/<kind>/<ns>/<owner>/<cluster>`).
//!
//! ```text
//! [<root>/]cluster-metadata/<kind>/<ns>_[<owner>_]<cluster>/<session>   empty: makes the session visible
//! P/<session>/<node>/node_events/<node>-<YYYY-MM-DD-HH>-<n>.jsonl[.gz]
//! P/<session>/<node>/job_events/<job>/<node>-<YYYY-MM-DD-HH>-<n>.jsonl[.gz]
//! P/<session>/<node>/export_events/<job | node>/<node>-<YYYY-MM-DD-HH>-<n>.jsonl[.gz]
//! P/<session>/<node>/logs/<path below the session's logs/ dir>
//! P/<session>/<node>/logs/<name>.rotated.<UTC mtime>.ino<inode>  a rotated backup, kept once
//! P/<session>/fetched_endpoints/restful__<request URI, '/' -> '__'>
//! [<root>/]collector-quarantine/<kind>/<ns>/[<owner>/]<cluster>/...   ours, never read by the server
//! ```
//!
//! Each file holds one family with its literal-key tests: [`names`] (what may be a segment),
//! [`ids`] (base64 → hex), [`hour`] (the time partition), [`cluster`] (markers and prefixes),
//! [`events`] (event objects and their parser), [`logs`] (log objects and rotated names),
//! [`endpoints`] (dashboard snapshots), [`quarantine`] (our own, never read by the server).

pub mod cluster;
pub mod endpoints;
pub mod events;
pub mod hour;
pub mod ids;
pub mod logs;
pub mod names;
pub mod quarantine;

pub use cluster::{ClusterLayout, Owner};
pub use events::{Partition, Stream};
pub use hour::Hour;
pub use ids::{id_to_hex, HexId, IdError};
pub use names::{
    is_dns1123_subdomain, is_log_file_name, is_safe_segment, MAX_LOG_NAME_BYTES, MAX_SEGMENT_LEN,
};
