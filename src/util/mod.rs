//! Helpers shared by more than one path: time formats, sizes and durations, durable small
//! files, directory watching, giving memory back, a bandwidth cap, a window of recent hashes,
//! an error's text with its sources, names from the bucket escaped for printing.

pub mod dedup;
pub mod escape;
pub mod fs;
pub mod memory;
pub mod pace;
pub mod time;
pub mod units;
pub mod watch;

/// The text of `e` and of each of its sources, joined by `sep` (a transport error's own text
/// says little: "error sending request"; object_store's retry error, which holds the status
/// and the answer's body, is not public but is among the sources).
pub fn error_chain(e: &dyn std::error::Error, sep: &str) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(sep);
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
