//! Which names may become one segment of an object key (and of a spool path).
//!
//! Sessions, node and job ids come from events and file names we do not control; every one
//! is checked here before it is joined into a key, so nothing can climb out of its prefix.

/// Longest id or session name we accept as a single path segment.
pub const MAX_SEGMENT_LEN: usize = 128;

/// True if `s` can be used verbatim as one path segment in a key and in the spool.
///
/// Same rule as KubeRay's session-name check: `^[A-Za-z0-9._-]+$`, not `.` or `..`, bounded length.
pub fn is_safe_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_SEGMENT_LEN
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// DNS-1123 subdomain, what Kubernetes allows for cluster, namespace and owner names.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    if s.is_empty() || s.len() > 253 {
        return false;
    }
    s.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_segments() {
        assert!(is_safe_segment("session_2026-11-22_02-06-54_202993_22498"));
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a\\b",
            "a b",
            "é",
            "a\0",
            &"x".repeat(129),
        ] {
            assert!(!is_safe_segment(bad), "{bad:?}");
        }
        assert!(is_dns1123_subdomain("raycluster-historyserver"));
        assert!(is_dns1123_subdomain("a.b-c"));
        assert!(!is_dns1123_subdomain("Upper"));
        assert!(!is_dns1123_subdomain("-a"));
        assert!(!is_dns1123_subdomain("a_b"));
    }
}
