//! The small values every stage of the read side shares: a state transition, the rank that
//! orders states of equal time, a string cut to a bound, a time as the `--json` report writes
//! it, a size in bytes for people, and one line of a storage error. A leaf: it imports no stage
//! (only `filter`'s unit of time and `local`'s error), so the stages that list (discover,
//! walk), read (read, decode, extract, scan), fold (task), merge (model), explain (causes) and
//! shape the report (report) can all use it without importing each other back.

use super::filter::NANOS_PER_SECOND;

/// A state transition: state name and time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Transition {
    /// Ray's state names are static strings (no allocation per transition).
    pub(super) state: std::borrow::Cow<'static, str>,
    pub(super) time_ns: Option<i64>,
}

/// `s`, cut at a character boundary to at most `max` bytes.
pub(super) fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s[..cut].to_string()
}

/// `s` whole when it is at most `max` bytes; else its start and its end (a quarter and
/// about three quarters of `max`, at character boundaries) around a line saying how many
/// characters were cut, so a traceback keeps its final exception. The result is at most
/// `max` bytes plus the marker's.
pub(super) fn bounded_middle(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut head = max / 4;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - (max - head);
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    let cut = s[head..tail].chars().count();
    format!(
        "{}\n[… {cut} of {} characters cut here by ray-history-collector …]\n{}",
        &s[..head],
        s.chars().count(),
        &s[tail..]
    )
}

/// Rank of a state within its entity's enum, to break timestamp ties toward the later state.
pub(super) fn state_rank(state: &str) -> u8 {
    match state {
        // TaskStatus
        "NIL" => 0,
        "PENDING_ARGS_AVAIL" => 1,
        "PENDING_NODE_ASSIGNMENT" => 2,
        "PENDING_OBJ_STORE_MEM_AVAIL" => 3,
        "PENDING_ARGS_FETCH" => 4,
        "SUBMITTED_TO_WORKER" => 5,
        "PENDING_ACTOR_TASK_ARGS_FETCH" => 6,
        "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY" => 7,
        "RUNNING" => 8,
        "RUNNING_IN_RAY_GET" => 9,
        "RUNNING_IN_RAY_WAIT" => 10,
        "FINISHED" => 11,
        "FAILED" => 12,
        // Actor, node and driver-job states
        "DEPENDENCIES_UNREADY" | "CREATED" => 1,
        "PENDING_CREATION" => 2,
        "ALIVE" => 3,
        "RESTARTING" => 4,
        "DEAD" => 5,
        _ => 0,
    }
}

/// RFC 3339 UTC with as many fractional digits as needed (0, 3, 6 or 9), like protobuf.
pub(super) fn format_time_json(ns: i64) -> String {
    let seconds = ns.div_euclid(NANOS_PER_SECOND);
    let fraction = ns.rem_euclid(NANOS_PER_SECOND);
    let base = crate::util::time::format_rfc3339(seconds);
    let base = base.trim_end_matches('Z');
    if fraction == 0 {
        format!("{base}Z")
    } else if fraction % 1_000_000 == 0 {
        format!("{base}.{:03}Z", fraction / 1_000_000)
    } else if fraction % 1_000 == 0 {
        format!("{base}.{:06}Z", fraction / 1_000)
    } else {
        format!("{base}.{fraction:09}Z")
    }
}

/// `n` bytes for people: `512 B`, `1.5 KiB`, ... (in the reader's messages and the reports).
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// One line about a storage error. `object_store` errors repeat their sources and carry
/// the server's whole XML answer; people need the gist.
pub(crate) fn store_error(e: &object_store::Error) -> String {
    if let object_store::Error::Generic { source, .. } = e {
        if let Some(local) = source.downcast_ref::<super::local::LocalError>() {
            // Our own, one line, the OS error whole.
            return local.to_string();
        }
    }
    let text = e.to_string();
    let has = |needle: &str| text.contains(needle);
    if has("NoSuchBucket") || has("ContainerNotFound") || has("bucket does not exist") {
        return "the bucket (or container) does not exist".into();
    }
    if has("AccessDenied") || has("AuthorizationFailure") || has("403 Forbidden") {
        return "access denied; check the credentials".into();
    }
    let first = text.lines().next().unwrap_or_default();
    let first = first.split(": <?xml").next().unwrap_or(first);
    bounded(first, 300)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::filter::parse_time_ns;

    #[test]
    fn timestamps_keep_nanoseconds() {
        let ns = parse_time_ns("2026-11-22T02:06:44.945501408Z").unwrap();
        assert_eq!(ns % NANOS_PER_SECOND, 945_501_408);
        assert_eq!(format_time_json(ns), "2026-11-22T02:06:44.945501408Z");
        let ms = parse_time_ns("2026-11-22T02:06:40.942Z").unwrap();
        assert_eq!(format_time_json(ms), "2026-11-22T02:06:40.942Z");
        assert_eq!(format_time_json(ms - 942_000_000), "2026-11-22T02:06:40Z");
    }
}
