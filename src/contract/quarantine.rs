//! Our quarantine objects, below `[<root>/]collector-quarantine/<kind>/<ns>/[<owner>/]<cluster>/`
//! (see [`super::ClusterLayout::quarantine_prefix`]): never read by the history server, kept
//! per collector (`<node>`: the node id, else the pod name).
//!
//! ```text
//! <node>/quarantine-<YYYY-MM-DD-HH>-<n>.jsonl[.gz]   records: one JSON line per kept input
//! <node>/bodies/body-<xxh3 hex>.bin                   a request body that was not JSON, as received
//! ```
//!
//! The spool keeps these files under the same relative keys, so [`parse_key`] also tells, at
//! start, which files in the spool are quarantine files and when each was created.

use super::hour::Hour;
use super::names::is_safe_segment;

/// The key of a quarantine records file created at `created_unix_nanos`, for the hour `hour`.
pub fn records_key(node: &str, hour: Hour, created_unix_nanos: u64) -> String {
    format!(
        "{node}/quarantine-{}-{created_unix_nanos}.jsonl",
        hour.label()
    )
}

/// The name of a kept body, below the node's directory: also what its record points to.
pub fn body_name(hash: u64) -> String {
    format!("bodies/body-{hash:016x}.bin")
}

/// The key of a kept body.
pub fn body_key(node: &str, hash: u64) -> String {
    format!("{node}/{}", body_name(hash))
}

/// A quarantine key, parsed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuarantineKey {
    /// A records file (JSON lines, compressed on upload), and when it was created.
    Records {
        /// Unix nanoseconds, from its name.
        created_unix_nanos: u64,
    },
    /// A kept body (raw bytes, uploaded as they are).
    Body,
}

/// Parses a key made by [`records_key`] or [`body_key`]; anything else is `None`.
pub fn parse_key(rel: &str) -> Option<QuarantineKey> {
    let parts: Vec<&str> = rel.split('/').collect();
    match parts.as_slice() {
        [node, file] if is_safe_segment(node) => {
            let stem = file.strip_prefix("quarantine-")?.strip_suffix(".jsonl")?;
            let (hour, n) = stem.rsplit_once('-')?;
            Hour::parse_label(hour)?;
            Some(QuarantineKey::Records {
                created_unix_nanos: n.parse().ok()?,
            })
        }
        [node, "bodies", file] if is_safe_segment(node) && is_safe_segment(file) => {
            let hex = file.strip_prefix("body-")?.strip_suffix(".bin")?;
            u64::from_str_radix(hex, 16).ok()?;
            Some(QuarantineKey::Body)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_their_parser() {
        let hour = Hour::parse_label("2026-11-22-02").unwrap();
        assert_eq!(
            records_key("0f69", hour, 5),
            "0f69/quarantine-2026-11-22-02-5.jsonl"
        );
        assert_eq!(
            body_key("0f69", 255),
            "0f69/bodies/body-00000000000000ff.bin"
        );
        assert_eq!(
            parse_key("n/quarantine-2026-11-22-02-5.jsonl"),
            Some(QuarantineKey::Records {
                created_unix_nanos: 5
            })
        );
        assert_eq!(
            parse_key("n/bodies/body-00ff.bin"),
            Some(QuarantineKey::Body)
        );
        assert_eq!(parse_key("../quarantine-2026-11-22-02-5.jsonl"), None);
        assert_eq!(parse_key("n/quarantine-2026-13-22-02-5.jsonl"), None);
        assert_eq!(parse_key("n/bodies/body-xyz.bin"), None);
        assert_eq!(parse_key("n/other"), None);
    }
}
