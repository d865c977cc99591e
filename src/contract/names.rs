//! Which names may become one segment of an object key (and of a spool path).
//!
//! Sessions, node and job ids come from events and file names we do not control; every one
//! is checked here before it is joined into a key, so nothing can climb out of its prefix.
//! Two rules: [`is_safe_segment`] (KubeRay's, for the names the layout is made of: sessions,
//! nodes, jobs, clusters) and [`is_log_file_name`] (for the names under a session's `logs/`,
//! which Ray and its users choose, and which are copied into the key as they are).

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

/// Longest name of a file or directory under a session's `logs/` that is shipped, in bytes:
/// Linux's `NAME_MAX`, so the length alone never refuses a file Ray could create. What the
/// whole key may be is the store's to say (`logs::shipper`'s `key_too_long`, which also
/// holds a `file://` bucket's names to what its staging files leave room for).
pub const MAX_LOG_NAME_BYTES: usize = 255;

/// True if `s`, the name of a file or directory under a session's `logs/`, is shipped under
/// its own name: it becomes one segment of the object key as it is, and `inspect --logs` and
/// `serve`'s `/api/v0/logs/file?filename=` find the object by that name.
///
/// Ray's names are mostly `[A-Za-z0-9._-]`, but not all of them: a submitted job's driver
/// log is `job-driver-<submission id>.log` with the id the user chose (spaces, unicode), and
/// a Serve replica's log carries its deployment's name, which can be long. So the rule is
/// not KubeRay's session-name rule ([`is_safe_segment`]) but what every store takes as one
/// segment and gives back unchanged:
///
/// - valid UTF-8 (the caller checks: an `OsStr` that is not UTF-8 never gets here), 1 to
///   [`MAX_LOG_NAME_BYTES`] bytes;
/// - no `/` (it would be two segments) and no `\` (URL parsers, WHATWG's among them, and Windows
///   tools take it for `/`);
/// - no control character: C0 (the ASCII controls), DEL, C1 (`U+0080`–`U+009F`). object_store
///   refuses ASCII controls in a key, and `serve` refuses a `filename` holding any control
///   character, so such an object could neither be written nor asked for;
/// - not ending with `.` (so not `.` or `..` either): Azure drops a blob name's trailing dots
///   ("avoid blob names that end with a dot"), so the object would be another name;
/// - not ending with `#` and digits only (`name#1`): object_store's `file://` store names
///   its staging files so, refuses to write such a key and leaves it out of listings.
///
/// Every other character is kept, as it is: a space, `%`, `+`, `#`, `?`, `*`, `&`, quotes,
/// brackets, unicode. object_store percent-encodes them in the request (S3, GCS, Azure) and
/// in the path of a `file://` bucket's file it decodes them again, so the key in the bucket,
/// and the file of a `file://` bucket, is the file's name byte for byte. Characters that
/// reorder or hide text (`U+202E`, zero-width) are kept too (a store keeps them); every
/// message that shows a name escapes them.
pub fn is_log_file_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LOG_NAME_BYTES
        && !s.ends_with('.')
        && !s.chars().any(|c| c.is_control() || c == '/' || c == '\\')
        && !s
            .rsplit_once('#')
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
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
        // A log's name: what Ray and its users write.
        for good in [
            "raylet.out",
            "job-driver-nightly eval 2026-12-04.log",
            "job-driver-é 夜间 🚀.log",
            "a%20b+c#d?e*f&g=h'i\"j[k]{l}|m~n^o`p<q>r!s$t@u(v)w,x;y:z.log",
            "a#1b",
            "a#",
            ".hidden",
            "-",
            "x\u{202e}gol.exe",
            &"x".repeat(255),
        ] {
            assert!(is_log_file_name(good), "{good:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a.",
            "a/b",
            "a\\b",
            "a\0b",
            "a\tb",
            "a\nb",
            "a\u{1b}[31m",
            "a\u{7f}",
            "a\u{85}",
            "a\u{9b}",
            "a#1",
            "a#b#12",
            &"x".repeat(256),
            &"é".repeat(128),
        ] {
            assert!(!is_log_file_name(bad), "{bad:?}");
        }
        assert!(is_dns1123_subdomain("raycluster-historyserver"));
        assert!(is_dns1123_subdomain("a.b-c"));
        assert!(!is_dns1123_subdomain("Upper"));
        assert!(!is_dns1123_subdomain("-a"));
        assert!(!is_dns1123_subdomain("a_b"));
    }
}
