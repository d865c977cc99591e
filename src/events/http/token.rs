//! The ingest token: what tells Ray's event posts from any other local client's.
//!
//! Every signal a client on the pod's loopback sends can be forged by another one on it (a
//! valid event, a kept connection, gzip, a header): review r39r showed 300 cheap clients
//! that each posted one valid event getting the rank Ray's kept connection had, and locking
//! it out again. A secret both containers of the pod share is a capability cheap clients do
//! not have. Ray's aggregator agent posts to `RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR`
//! verbatim, headers of its own choosing only, so the token travels as the last path segment:
//! `POST /v1/events/<token>`.
//!
//! With a token configured (`--ingest-token-file`, or `RHC_INGEST_TOKEN`), a post with it is
//! Ray's: its connection outranks every other at the connection cap and its bodies take the
//! decoding turn kept for Ray; any other post to the events path (no token, a wrong one) is
//! refused with `403` as soon as its head is read, its body never read, its connection
//! closed. The token is compared in constant time and never logged or printed.

/// Fewest characters a token may have: 16 characters of the 66 allowed carry more than 90
/// bits, beyond any guessing over loopback at the rate a collector answers.
pub const MIN_TOKEN_LEN: usize = 16;
/// Most characters a token may have: it is part of a request head, which is bounded
/// (`MAX_HEAD_BYTES`), and Ray's own URL.
pub const MAX_TOKEN_LEN: usize = 256;

/// A checked ingest token. Its `Debug` form never shows it: settings end up in logs.
#[derive(Clone, PartialEq, Eq)]
pub struct IngestToken(String);

impl std::fmt::Debug for IngestToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IngestToken(<redacted>)")
    }
}

/// Whether `b` may appear in a token: RFC 3986's unreserved characters, which a URL path
/// carries as they are (no percent-encoding that Ray's client or ours could do differently).
fn url_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

impl IngestToken {
    /// Checks a token as read (surrounding whitespace, such as a file's final newline, is
    /// dropped). The error says what is wrong without showing the token.
    pub fn parse(raw: &str) -> Result<IngestToken, String> {
        let t = raw.trim();
        if t.is_empty() {
            return Err("the token is empty".into());
        }
        if t.len() < MIN_TOKEN_LEN || t.len() > MAX_TOKEN_LEN {
            return Err(format!(
                "the token has {} bytes; it needs {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN}",
                t.len()
            ));
        }
        if let Some(i) = t.bytes().position(|b| !url_safe(b)) {
            return Err(format!(
                "byte {} of the token is not one of A-Z a-z 0-9 - . _ ~ (the token is a URL path segment)",
                i + 1
            ));
        }
        Ok(IngestToken(t.to_string()))
    }

    /// Whether `given` is the token, in time that depends on the lengths only, never on
    /// where the first difference is.
    pub(super) fn matches(&self, given: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), given.as_bytes());
        let mut diff = (a.len() != b.len()) as u8;
        for (i, x) in a.iter().enumerate() {
            // Past the end of `given` its bytes count as 0 (the lengths already differ).
            let y = b.get(i).copied().unwrap_or(0);
            diff |= x ^ y;
        }
        std::hint::black_box(diff) == 0
    }

    /// The token itself, for the caller that builds Ray's URL in a test or a manifest.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_without_being_shown() {
        let t = IngestToken::parse("  abcdefghijklmnop-._~0123\n").unwrap();
        assert_eq!(t.expose(), "abcdefghijklmnop-._~0123");
        assert_eq!(format!("{t:?}"), "IngestToken(<redacted>)");
        for (raw, why) in [
            ("", "empty"),
            (" \n", "empty"),
            ("short-secret-15", "has 15 bytes"),
            ("sixteen-chars-ok/x", "byte 17"),
            ("with space inside-0123", "byte 5"),
            ("percent%2Fencoded-xx", "byte 8"),
        ] {
            let e = IngestToken::parse(raw).unwrap_err();
            assert!(e.contains(why), "{raw:?}: {e}");
            assert!(raw.trim().is_empty() || !e.contains(raw.trim()), "{e}");
        }
        assert!(IngestToken::parse(&"a".repeat(MAX_TOKEN_LEN)).is_ok());
        assert!(IngestToken::parse(&"a".repeat(MAX_TOKEN_LEN + 1)).is_err());
    }

    #[test]
    fn only_the_token_itself_matches() {
        let t = IngestToken::parse("0123456789abcdef").unwrap();
        assert!(t.matches("0123456789abcdef"));
        for other in [
            "",
            "0123456789abcde",
            "0123456789abcdef0",
            "0123456789abcdeF",
            "1123456789abcdef",
            "0123456789abcdef\0",
        ] {
            assert!(!t.matches(other), "{other:?}");
        }
    }
}
