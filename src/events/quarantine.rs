//! The quarantine: what we keep of input we cannot use, and why.
//!
//! Ray resends a rejected batch forever, so an event that cannot be routed (no session, a
//! timestamp that is not RFC 3339, an id that is neither base64 nor hex) does not fail its
//! batch: it is kept aside as a record with its reason, counted in
//! `rhc_events_quarantined_total{reason}`, uploaded below `collector-quarantine/` where the
//! history server never looks, and the batch is answered 200. A record is one JSON line:
//! the reason's code and sentence, when it was received, and the input itself (the event's
//! JSON as sent, or bytes that are not JSON as a lossless string).
//!
//! A request body that is not JSON at all is kept beside its record as a file of its own,
//! at most [`MAX_KEPT_BODY_BYTES`] of it ([`KeptBody`]): whole when it is that small, else the
//! bytes as received when they were gzip and that small (lossless), else its first
//! [`MAX_KEPT_BODY_BYTES`]; the record says which, and the sizes of the whole. So a 65 KB
//! gzip of 64 MiB of garbage keeps at most 64 KiB, not 64 MiB of the spool.

use bytes::Bytes;

use crate::contract::quarantine::body_name;
use crate::util::time::{format_rfc3339, unix_nanos};

/// Most bytes kept of one invalid request body: enough to see what it is (Ray's batches are
/// JSON from their first byte; a parse error says at which byte it went wrong), and small
/// enough that the bodies kept within the keeping rate (see `events::http`) take little of
/// the spool that rides out a bucket outage.
pub const MAX_KEPT_BODY_BYTES: usize = 64 << 10;

/// What is kept of an invalid body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptForm {
    /// The body whole (it is at most [`MAX_KEPT_BODY_BYTES`]).
    Whole,
    /// The bytes as received, before this many gzip layers were undone: the whole body,
    /// compressed.
    AsReceived(usize),
    /// The body's first [`MAX_KEPT_BODY_BYTES`]; the rest was cut.
    Prefix,
}

impl KeptForm {
    /// The record's `kept` field.
    pub fn code(&self) -> &'static str {
        match self {
            KeptForm::Whole => "whole",
            KeptForm::AsReceived(_) => "as_received",
            KeptForm::Prefix => "prefix",
        }
    }
}

/// An invalid request body as kept in quarantine: at most [`MAX_KEPT_BODY_BYTES`] of it, and
/// what it was.
#[derive(Debug, Clone)]
pub struct KeptBody {
    /// The bytes kept.
    pub bytes: Bytes,
    /// What they are.
    pub form: KeptForm,
    /// Size of the body the error is about (its gzip layers undone; for a body that is not
    /// valid gzip, the bytes the failing layer was given).
    pub body_bytes: u64,
    /// Bytes received, before any gzip layer was undone.
    pub received_bytes: u64,
    /// xxh3 of the whole body: names the kept file, so the same body again is kept once.
    pub hash: u64,
}

impl KeptBody {
    /// What to keep of `body`: whole if it is small enough, else `compressed` (the bytes as
    /// received, before `gzip_layers` layers) if given and small enough, else a prefix.
    pub fn of(
        body: &Bytes,
        compressed: Option<Bytes>,
        gzip_layers: usize,
        received_bytes: u64,
    ) -> KeptBody {
        let hash = xxhash_rust::xxh3::xxh3_64(body);
        let (bytes, form) = if body.len() <= MAX_KEPT_BODY_BYTES {
            (body.clone(), KeptForm::Whole)
        } else {
            match compressed.filter(|c| c.len() <= MAX_KEPT_BODY_BYTES) {
                Some(c) => (c, KeptForm::AsReceived(gzip_layers)),
                // A copy: the whole body's buffer is not held while its prefix is stored.
                None => (
                    Bytes::copy_from_slice(&body[..MAX_KEPT_BODY_BYTES]),
                    KeptForm::Prefix,
                ),
            }
        };
        KeptBody {
            bytes,
            form,
            body_bytes: body.len() as u64,
            received_bytes,
            hash,
        }
    }
}

/// Why an event was quarantined; the code is a metric label and part of the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuarantineReason {
    /// The array element is not a JSON object.
    NotAnObject,
    /// No `sessionName`, or not a string.
    MissingSession,
    /// `sessionName` is not a safe single path segment.
    UnsafeSession,
    /// No `timestamp`, or not a string.
    MissingTimestamp,
    /// `timestamp` is not RFC 3339.
    BadTimestamp,
    /// `nodeId` is neither base64 nor hex, or too long.
    BadNodeId,
    /// `jobId` is neither base64 nor hex, too long, or not a string.
    BadJobId,
    /// A line of a spool segment left incomplete by a crash.
    TornLine,
    /// A line of an export event file that is not JSON.
    ExportNotJson,
    /// An export event without a usable `timestamp`, or with fields of the wrong type.
    ExportBadEvent,
    /// An event sent with snake_case keys whose names cannot be converted to camelCase.
    UnconvertibleFieldNames,
    /// An event holding a number outside the range of a double, which JSON readers refuse.
    NumberOutOfRange,
    /// An event of a request that spans more partitions than one request may open
    /// (`MAX_PARTITIONS_PER_REQUEST`), beyond what the arrival hour could take.
    TooManyPartitions,
}

impl QuarantineReason {
    /// Stable short code, used as metric label and in quarantine records.
    pub fn code(&self) -> &'static str {
        match self {
            QuarantineReason::NotAnObject => "not_an_object",
            QuarantineReason::MissingSession => "missing_session_name",
            QuarantineReason::UnsafeSession => "unsafe_session_name",
            QuarantineReason::MissingTimestamp => "missing_timestamp",
            QuarantineReason::BadTimestamp => "bad_timestamp",
            QuarantineReason::BadNodeId => "bad_node_id",
            QuarantineReason::BadJobId => "bad_job_id",
            QuarantineReason::TornLine => "torn_line",
            QuarantineReason::ExportNotJson => "export_not_json",
            QuarantineReason::ExportBadEvent => "export_bad_event",
            QuarantineReason::UnconvertibleFieldNames => "unconvertible_field_names",
            QuarantineReason::NumberOutOfRange => "number_out_of_range",
            QuarantineReason::TooManyPartitions => "too_many_partitions",
        }
    }

    /// A sentence for people reading the quarantine.
    pub fn describe(&self) -> &'static str {
        match self {
            QuarantineReason::NotAnObject => "the array element is not a JSON object",
            QuarantineReason::MissingSession => "sessionName is missing or not a string",
            QuarantineReason::UnsafeSession => {
                "sessionName is not a single safe path segment ([A-Za-z0-9._-], at most 128)"
            }
            QuarantineReason::MissingTimestamp => "timestamp is missing or not a string",
            QuarantineReason::BadTimestamp => "timestamp is not an RFC 3339 date-time",
            QuarantineReason::BadNodeId => "nodeId is neither base64 nor hex, or too long",
            QuarantineReason::BadJobId => {
                "jobId is not a string, neither base64 nor hex, or too long"
            }
            QuarantineReason::TornLine => {
                "incomplete last line of a spool segment, left by a crash"
            }
            QuarantineReason::ExportNotJson => "a line of an export event file is not JSON",
            QuarantineReason::ExportBadEvent => {
                "an export event has no integer timestamp, or event_data fields of the wrong type"
            }
            QuarantineReason::UnconvertibleFieldNames => {
                "an event sent with snake_case keys whose field names cannot be converted to \
                 camelCase (a field given twice, or nesting deeper than 128)"
            }
            QuarantineReason::NumberOutOfRange => {
                "the event holds a number outside the range of a double (about 1.8e308), which \
                 Go's and serde's JSON readers refuse, the whole event with it"
            }
            QuarantineReason::TooManyPartitions => {
                "the request's events span more partitions (session, node, stream, hour) than \
                 one request may open, and this one's stream had no room left at the arrival hour"
            }
        }
    }

    /// Every reason, for pre-registering metrics.
    pub const ALL: [QuarantineReason; 13] = [
        QuarantineReason::NotAnObject,
        QuarantineReason::MissingSession,
        QuarantineReason::UnsafeSession,
        QuarantineReason::MissingTimestamp,
        QuarantineReason::BadTimestamp,
        QuarantineReason::BadNodeId,
        QuarantineReason::BadJobId,
        QuarantineReason::TornLine,
        QuarantineReason::ExportNotJson,
        QuarantineReason::ExportBadEvent,
        QuarantineReason::UnconvertibleFieldNames,
        QuarantineReason::NumberOutOfRange,
        QuarantineReason::TooManyPartitions,
    ];
}

/// Bytes of the [`event_record`] of an element of `raw_len` bytes: what keeping it costs the
/// spool.
pub fn event_record_len(reason: QuarantineReason, raw_len: usize) -> usize {
    // `{"reason":"` `","detail":"` `","received_at":"` 20-byte time `"` `,"event":` `}\n`.
    const FRAME: usize = 11 + 12 + 17 + 20 + 1 + 9 + 2;
    FRAME + reason.code().len() + reason.describe().len() + raw_len
}

/// A quarantine record for a JSON element: `{"reason":..,"detail":..,"received_at":..,"event":<raw>}`.
pub fn event_record(reason: QuarantineReason, raw: &[u8]) -> Vec<u8> {
    record_of_element(reason, false, raw)
}

/// Marks an [`overflow_record`] of an export event: its id belongs to the export id space.
const EXPORT_ID_SPACE: &[u8] = b",\"id_space\":\"export\"";

/// The record of a valid event kept in quarantine because its request opened more
/// partitions than one may (`too_many_partitions`): an [`event_record`], with
/// `"id_space":"export"` before the event when it came from an export event file. Its event
/// id counts like a stored one (Ray's resend of it is a duplicate), so a restart reads it back
/// ([`overflow_record_event`]) into the deduplication window, in the right id space.
pub fn overflow_record(raw: &[u8], export: bool) -> Vec<u8> {
    record_of_element(QuarantineReason::TooManyPartitions, export, raw)
}

/// The event of an [`overflow_record`] line (newline included or not), and whether it is an
/// export event; `None` for a line that is not such a record.
pub fn overflow_record_event(line: &[u8]) -> Option<(&[u8], bool)> {
    let reason = QuarantineReason::TooManyPartitions;
    let rest = line
        .strip_prefix(b"{\"reason\":\"")?
        .strip_prefix(reason.code().as_bytes())?
        .strip_prefix(b"\",\"detail\":\"")?
        .strip_prefix(reason.describe().as_bytes())?
        .strip_prefix(b"\",\"received_at\":\"")?;
    // The time has no quote in it.
    let rest = &rest[rest.iter().position(|&c| c == b'"')? + 1..];
    let (export, rest) = match rest.strip_prefix(EXPORT_ID_SPACE) {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let rest = rest.strip_prefix(b",\"event\":")?;
    let rest = rest.strip_suffix(b"\n").unwrap_or(rest);
    Some((rest.strip_suffix(b"}")?, export))
}

fn record_of_element(reason: QuarantineReason, export: bool, raw: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(raw.len() + 180);
    line.extend_from_slice(b"{\"reason\":\"");
    line.extend_from_slice(reason.code().as_bytes());
    line.extend_from_slice(b"\",\"detail\":\"");
    line.extend_from_slice(reason.describe().as_bytes());
    line.extend_from_slice(b"\",\"received_at\":\"");
    line.extend_from_slice(format_rfc3339((unix_nanos() / 1_000_000_000) as i64).as_bytes());
    line.push(b'"');
    if export {
        line.extend_from_slice(EXPORT_ID_SPACE);
    }
    line.extend_from_slice(b",\"event\":");
    // Line breaks (only possible as whitespace between tokens) become spaces: one record
    // per line.
    line.extend(
        raw.iter()
            .map(|&c| if c == b'\n' || c == b'\r' { b' ' } else { c }),
    );
    line.extend_from_slice(b"}\n");
    line
}

/// The last field of a [`raw_record`] of a line read from a file: the key the line is
/// remembered by (its file's identity and its offset, `LineSource::dedup_key`), 16 hex digits.
const SOURCE_KEY_FIELD: &[u8] = b",\"source_key\":\"";

/// A quarantine record for bytes that are not JSON: kept as a string, lossless for UTF-8.
/// `key`: for a line read from a file, the key it is remembered by, written as the record's
/// last field (`"source_key":"<16 hex digits>"`), so that a restart reads it back from the
/// spool ([`record_source_key`]) into the deduplication window: a line whose record is
/// durable but whose key the ids journal did not get (a kill -9 between the two) is not
/// recorded again when read again (review r41q D1).
pub fn raw_record(
    reason: QuarantineReason,
    source: &str,
    offset: u64,
    raw: &[u8],
    key: Option<u64>,
) -> Vec<u8> {
    let record = serde_json::json!({
        "reason": reason.code(),
        "detail": reason.describe(),
        "received_at": format_rfc3339((unix_nanos() / 1_000_000_000) as i64),
        "source_file": source,
        "source_offset": offset,
        "raw": String::from_utf8_lossy(raw),
        "raw_is_utf8": std::str::from_utf8(raw).is_ok(),
    });
    let mut line = serde_json::to_vec(&record).unwrap_or_default();
    if let (Some(key), Some(b'}')) = (key, line.last()) {
        line.pop();
        line.extend_from_slice(SOURCE_KEY_FIELD);
        line.extend_from_slice(format!("{key:016x}\"}}").as_bytes());
    }
    line.push(b'\n');
    line
}

/// The `source_key` of a [`raw_record`] line (newline included or not), read from its end
/// alone (so a record too long to be read whole still gives it); `None` for any other line.
/// Only the record's own last field can end a line so: the bytes kept are inside its `raw`
/// string, whose quotes are escaped, and an event record ends with the event's `}` and its
/// own.
pub fn record_source_key(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let rest = line.strip_suffix(b"\"}")?;
    let hex = rest.get(rest.len().checked_sub(16)?..)?;
    rest[..rest.len() - 16].strip_suffix(SOURCE_KEY_FIELD)?;
    if !hex.iter().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

/// Bytes of a line's end (without its newline) that hold a [`raw_record`]'s `source_key`
/// field whole.
pub const SOURCE_KEY_TAIL_BYTES: usize = SOURCE_KEY_FIELD.len() + 16 + 2;

/// The record of a request body that is not a JSON array of events, kept beside it as the
/// object [`body_name`]`(hash)`; `received_unix_nanos` is when it was stored. It says what
/// was kept (`kept`: `whole`, `as_received` with its `content_encoding`, or `prefix`, and
/// `kept_bytes`) and how large the body was (`body_bytes`, and `received_bytes` on the wire).
pub fn invalid_body_record(detail: &str, received_unix_nanos: u64, body: &KeptBody) -> Vec<u8> {
    let mut record = serde_json::json!({
        "reason": "invalid_body",
        "detail": detail,
        "received_at": format_rfc3339((received_unix_nanos / 1_000_000_000) as i64),
        "body_object": body_name(body.hash),
        "body_bytes": body.body_bytes,
        "received_bytes": body.received_bytes,
        "kept": body.form.code(),
        "kept_bytes": body.bytes.len(),
    });
    if let KeptForm::AsReceived(layers) = body.form {
        record["content_encoding"] = vec!["gzip"; layers].join(", ").into();
    }
    let mut line = serde_json::to_vec(&record).unwrap_or_default();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantine_lines_are_json() {
        let l = event_record(QuarantineReason::MissingSession, b"{\"a\":\n1}");
        assert_eq!(
            l.len(),
            event_record_len(QuarantineReason::MissingSession, 8)
        );
        let v: serde_json::Value = serde_json::from_slice(&l).unwrap();
        assert_eq!(v["reason"], "missing_session_name");
        assert_eq!(v["event"]["a"], 1);
        assert_eq!(l.iter().filter(|&&c| c == b'\n').count(), 1);
        let r = raw_record(
            QuarantineReason::TornLine,
            "y.jsonl",
            10,
            b"{\"a\":\xff",
            None,
        );
        let v: serde_json::Value = serde_json::from_slice(&r).unwrap();
        assert_eq!(v["source_file"], "y.jsonl");
        assert_eq!(v["raw_is_utf8"], false);
        assert_eq!(record_source_key(&r), None);
    }

    /// A line's key reads back from its record's end, whatever the bytes kept; no other
    /// record gives one.
    #[test]
    fn a_records_source_key_reads_back_from_its_end() {
        for raw in [
            &b"not json"[..],
            b"ends like one\",\"source_key\":\"0123456789abcdef\"}",
            b"\"}",
            b"",
        ] {
            for key in [0u64, 1, u64::MAX, 0x0123_4567_89ab_cdef] {
                let r = raw_record(QuarantineReason::ExportNotJson, "f.log", 7, raw, Some(key));
                let v: serde_json::Value = serde_json::from_slice(&r).unwrap();
                assert_eq!(v["raw"], String::from_utf8_lossy(raw).as_ref());
                assert_eq!(v["source_key"], format!("{key:016x}"));
                assert_eq!(record_source_key(&r), Some(key));
                assert_eq!(record_source_key(&r[..r.len() - 1]), Some(key));
                let end = r.len() - 1;
                assert_eq!(
                    record_source_key(&r[end - SOURCE_KEY_TAIL_BYTES..end]),
                    Some(key)
                );
                let same_len =
                    raw_record(QuarantineReason::ExportNotJson, "f.log", 7, raw, Some(0));
                assert_eq!(
                    same_len.len(),
                    r.len(),
                    "the cost estimate's record is as long"
                );
            }
        }
        let ev = event_record(
            QuarantineReason::MissingSession,
            b"{\"x\":\",\"source_key\":\"0123456789abcdef\"}",
        );
        assert_eq!(record_source_key(&ev), None);
        assert_eq!(
            record_source_key(&overflow_record(b"{\"eventId\":\"x\"}", true)),
            None
        );
    }

    /// An overflow record reads back to its event and id space; other records do not.
    #[test]
    fn overflow_records_read_back() {
        let ev = b"{\"eventId\":\"x\", \"a\":[1]}";
        for export in [false, true] {
            let l = overflow_record(ev, export);
            let v: serde_json::Value = serde_json::from_slice(&l).unwrap();
            assert_eq!(v["reason"], "too_many_partitions");
            assert_eq!(v["event"]["eventId"], "x");
            assert_eq!(overflow_record_event(&l), Some((&ev[..], export)));
            assert_eq!(
                overflow_record_event(&l[..l.len() - 1]),
                Some((&ev[..], export))
            );
        }
        let other = event_record(QuarantineReason::MissingSession, ev);
        assert_eq!(overflow_record_event(&other), None);
        assert_eq!(overflow_record_event(b"{}"), None);
    }

    #[test]
    fn body_records_name_their_body() {
        let body = KeptBody::of(&Bytes::from_static(b"abc"), None, 0, 3);
        let l = invalid_body_record("expected `[`", 1_795_314_700_000_000_000, &body);
        let v: serde_json::Value = serde_json::from_slice(&l).unwrap();
        assert_eq!(v["reason"], "invalid_body");
        assert_eq!(
            v["body_object"],
            format!(
                "bodies/body-{:016x}.bin",
                xxhash_rust::xxh3::xxh3_64(b"abc")
            )
        );
        assert_eq!(v["received_at"], "2026-11-22T02:31:40Z");
        assert_eq!(
            (v["kept"].as_str(), v["kept_bytes"].as_u64()),
            (Some("whole"), Some(3))
        );
        assert!(l.ends_with(b"}\n"));
    }

    /// A large body keeps at most MAX_KEPT_BODY_BYTES: its compressed form when that is
    /// small enough, else its first bytes; the record says which and how large it was.
    #[test]
    fn large_bodies_keep_a_bounded_form() {
        let big = Bytes::from(vec![b'x'; 3 * MAX_KEPT_BODY_BYTES]);
        let small_gzip = Bytes::from_static(b"\x1f\x8b...");
        let k = KeptBody::of(&big, Some(small_gzip.clone()), 2, 11);
        assert_eq!(
            (k.form, k.bytes.clone()),
            (KeptForm::AsReceived(2), small_gzip)
        );
        let v: serde_json::Value =
            serde_json::from_slice(&invalid_body_record("x", 0, &k)).unwrap();
        assert_eq!(v["content_encoding"], "gzip, gzip");
        assert_eq!(
            v["body_bytes"].as_u64(),
            Some(3 * MAX_KEPT_BODY_BYTES as u64)
        );
        assert_eq!(v["received_bytes"].as_u64(), Some(11));
        let large_gzip = Bytes::from(vec![0u8; MAX_KEPT_BODY_BYTES + 1]);
        let k = KeptBody::of(&big, Some(large_gzip), 1, MAX_KEPT_BODY_BYTES as u64 + 1);
        assert_eq!(k.form, KeptForm::Prefix);
        assert_eq!(&k.bytes[..], &big[..MAX_KEPT_BODY_BYTES]);
        let v: serde_json::Value =
            serde_json::from_slice(&invalid_body_record("x", 0, &k)).unwrap();
        assert_eq!(v["kept"], "prefix");
        assert_eq!(v["kept_bytes"].as_u64(), Some(MAX_KEPT_BODY_BYTES as u64));
        assert!(v.get("content_encoding").is_none());
        // The same body keeps the same name, whatever form is kept.
        assert_eq!(k.hash, KeptBody::of(&big, None, 0, 0).hash);
    }
}
