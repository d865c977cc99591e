//! Names and text from the bucket made safe to print: every character a terminal could act
//! on is shown as an escape instead.
//!
//! A key name, a file name or an error that quotes one comes from the bucket, which anyone
//! with write access shaped. Printed raw, an `ESC ] 0 ; … BEL` retitles the terminal, a
//! `U+202E` reverses the rest of the line so that `txt.exe` reads `exe.txt`, and a C1 control
//! (`U+009B` is a one-character CSI) starts an escape sequence on terminals that honour them.
//! [`escape_name`] turns each such character into a visible `\u{…}` (and `\` into `\\`, so
//! that an escape cannot be forged), keeping every other character, so the name stays
//! recognisable and two different names never print the same.

/// True for the characters no message may print raw: C0 and C1 controls, DEL, and the
/// invisible format characters that reorder or hide text (bidirectional embeddings,
/// overrides and isolates, marks, zero-width characters, the byte-order mark, the line and
/// paragraph separators, interlinear annotation).
pub(crate) fn is_unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
        )
}

/// `s` with every [`is_unsafe_char`] written as `\u{hex}` and `\` as `\\`.
pub(crate) fn escape_name(s: &str) -> String {
    if !s.chars().any(|c| c == '\\' || is_unsafe_char(c)) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if is_unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` with every [`is_unsafe_char`] written as `\u{hex}`, backslashes kept: for a whole
/// message, whose own text has no such character, that may quote names from the bucket.
pub(crate) fn escape_text(s: &str) -> String {
    if !s.chars().any(is_unsafe_char) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// A file name from a local bucket, which need not be UTF-8: escaped as [`escape_name`],
/// with each byte that is not UTF-8 shown as `\x{hex}`.
pub(crate) fn escape_os_name(name: &std::ffi::OsStr) -> String {
    use std::os::unix::ffi::OsStrExt as _;
    let mut out = String::new();
    for chunk in name.as_bytes().utf8_chunks() {
        out.push_str(&escape_name(chunk.valid()));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{{{b:02x}}}"));
        }
    }
    out
}

/// `s` with every character a terminal could act on escaped, as in every message of `inspect` and `serve`.
pub fn escape_untrusted(s: &str) -> String {
    escape_name(s)
}

/// A file name or path that need not be UTF-8, escaped as [`escape_untrusted`], with each
/// byte that is not UTF-8 shown as `\x{hex}`.
pub fn escape_untrusted_os(name: &std::ffi::OsStr) -> String {
    escape_os_name(name)
}

/// A whole message that may quote names from the bucket, escaped as `inspect` escapes its
/// errors (backslashes kept).
pub fn escape_message(s: &str) -> String {
    escape_text(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_a_terminal_would_act_on() {
        assert_eq!(escape_name("node-1/raylet.out"), "node-1/raylet.out");
        assert_eq!(
            escape_name("\u{1b}]0;TITLE\u{7}x"),
            "\\u{1b}]0;TITLE\\u{7}x"
        );
        assert_eq!(escape_name("a\u{202e}txt.exe"), "a\\u{202e}txt.exe");
        assert_eq!(escape_name("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(escape_name("a\nb\u{7f}"), "a\\u{a}b\\u{7f}");
        // A literal backslash cannot pose as an escape.
        assert_eq!(escape_name("\\u{1b}"), "\\\\u{1b}");
        assert_eq!(escape_name("日本語 ok"), "日本語 ok");
        let raw = std::ffi::OsStr::from_bytes(b"a\xffb\x1b");
        use std::os::unix::ffi::OsStrExt as _;
        assert_eq!(escape_os_name(raw), "a\\x{ff}b\\u{1b}");
    }
}
