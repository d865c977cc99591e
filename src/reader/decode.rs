//! Decoding one object's bytes as they stream in: gunzipped when its name says `.gz` (several
//! gzip members read whole), split into JSON lines (or a legacy JSON array), every line and the
//! decoded size bounded, bad content counted rather than fatal. Facts are taken out in batches
//! while the object is still being read ([`ContentSink::take_facts`]).

use std::io::{BufRead, Read as _};

use serde_json::Value;

use super::extract::Fact;
use super::filter::TimeWindow;
use super::limits::ContentLimits;
#[cfg(test)]
use super::limits::CONTENT_LIMITS;
use super::scan::{scan_line, scan_value, Scanned};
use super::task::CompactId;
use super::values::human_bytes;

/// Facts taken from an object (those not yet taken out), and what could not be used.
#[derive(Debug, Default)]
pub(super) struct Extraction {
    pub(super) facts: Vec<Fact>,
    pub(super) bad_lines: u64,
    pub(super) first_bad_line: Option<String>,
    pub(super) outside_window: u64,
}

/// How an object's content is laid out, decided by its first non-space byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    Undecided,
    /// JSON lines, one event per line.
    Lines,
    /// A legacy JSON array (or several JSON values in a row): parsed whole.
    Document,
}

/// Receives an object's decoded bytes chunk by chunk and turns them into facts, so an object
/// is never held whole in memory (except a legacy array document, which is capped).
pub(super) struct ContentSink {
    pub(super) window: TimeWindow,
    pub(super) limits: ContentLimits,
    pub(super) layout: Layout,
    pub(super) buf: Vec<u8>,
    /// Inside a line longer than the limit: dropping bytes until its end.
    pub(super) skipping_long_line: bool,
    pub(super) decoded: u64,
    pub(super) out: Extraction,
    /// Facts already taken out (they still count in the positions of later ones).
    pub(super) taken: u64,
    /// The task whose log offsets are read (`--logs`); others' are skipped.
    pub(super) logs_of: Option<CompactId>,
}

impl ContentSink {
    pub(super) fn new(window: TimeWindow, limits: ContentLimits) -> ContentSink {
        ContentSink {
            window,
            limits,
            layout: Layout::Undecided,
            buf: Vec::new(),
            skipping_long_line: false,
            decoded: 0,
            out: Extraction::default(),
            taken: 0,
            logs_of: None,
        }
    }

    pub(super) fn push(&mut self, mut data: &[u8]) -> Result<(), String> {
        self.decoded += data.len() as u64;
        if self.decoded > self.limits.decoded {
            return Err(format!(
                "more than {} of content; the rest was not read",
                human_bytes(self.limits.decoded)
            ));
        }
        if self.layout == Layout::Undecided {
            match data.iter().position(|c| !c.is_ascii_whitespace()) {
                None => return Ok(()),
                Some(i) => {
                    self.layout = if data[i] == b'[' {
                        Layout::Document
                    } else {
                        Layout::Lines
                    };
                    data = &data[i..];
                }
            }
        }
        if self.layout == Layout::Document {
            if self.buf.len() + data.len() > self.limits.document {
                return Err(format!(
                    "JSON array document larger than {}; not read",
                    human_bytes(self.limits.document as u64)
                ));
            }
            self.buf.extend_from_slice(data);
            return Ok(());
        }
        while !data.is_empty() {
            let newline = memchr::memchr(b'\n', data);
            let (part, rest) = match newline {
                Some(i) => (&data[..i], Some(&data[i + 1..])),
                None => (data, None),
            };
            if !self.skipping_long_line {
                if self.buf.len() + part.len() > self.limits.line {
                    self.bad_line(format!(
                        "line longer than {}",
                        human_bytes(self.limits.line as u64)
                    ));
                    self.buf = Vec::new();
                    self.skipping_long_line = true;
                } else if rest.is_some() && self.buf.is_empty() {
                    // A whole line in this chunk: read in place.
                    self.line(part);
                } else {
                    self.buf.extend_from_slice(part);
                    if rest.is_some() {
                        let mut line = std::mem::take(&mut self.buf);
                        self.line(&line);
                        line.clear();
                        self.buf = line;
                    }
                }
            }
            match rest {
                Some(r) => {
                    self.skipping_long_line = false;
                    data = r;
                }
                None => break,
            }
        }
        Ok(())
    }

    /// Ends the content; `complete` is false when it was cut short (the last partial line
    /// is then dropped, not parsed).
    pub(super) fn finish(&mut self, complete: bool) {
        let buf = std::mem::take(&mut self.buf);
        match self.layout {
            Layout::Undecided => {}
            Layout::Lines => {
                if complete && !self.skipping_long_line {
                    self.line(&buf);
                }
            }
            Layout::Document => {
                let values = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
                for value in values {
                    match value {
                        Ok(v) => self.value(v),
                        Err(e) => {
                            self.bad_line(format!("not valid JSON: {e}"));
                            break;
                        }
                    }
                }
            }
        }
    }

    pub(super) fn line(&mut self, line: &[u8]) {
        let line = line.trim_ascii();
        if line.is_empty() {
            return;
        }
        if line[0] == b'[' {
            // A whole POST body on one line.
            match value_of(line) {
                Ok(v) => self.value(v),
                Err(e) => self.bad_line(e),
            }
            return;
        }
        let scanned = scan_line(line, self.seq(), self.logs_of, value_of);
        self.take(scanned);
    }

    /// Takes the facts read so far out of the sink; the next ones go to `next` (an emptied
    /// batch, reused).
    pub(super) fn take_facts(&mut self, next: Vec<Fact>) -> Vec<Fact> {
        self.taken += self.out.facts.len() as u64;
        std::mem::replace(&mut self.out.facts, next)
    }

    fn seq(&self) -> u64 {
        self.taken + self.out.facts.len() as u64 + self.out.outside_window
    }

    fn take(&mut self, scanned: Scanned) {
        match scanned {
            Err(why) => self.bad_line(why),
            Ok(f) if !self.window.contains(f.time_ns) => self.out.outside_window += 1,
            Ok(f) => self.out.facts.push(f),
        }
    }

    /// A JSON value: an event, or an array of events (a POST body or a legacy file).
    pub(super) fn value(&mut self, v: Value) {
        match v {
            Value::Array(items) => {
                for item in items {
                    if item.is_object() {
                        self.record(&item);
                    } else {
                        self.bad_line("array element is not a JSON object".into());
                    }
                }
            }
            Value::Object(_) => self.record(&v),
            _ => self.bad_line("not a JSON object".into()),
        }
    }

    pub(super) fn record(&mut self, v: &Value) {
        let scanned = scan_value(v, self.seq(), self.logs_of);
        self.take(scanned);
    }

    pub(super) fn bad_line(&mut self, why: String) {
        self.out.bad_lines += 1;
        if self.out.first_bad_line.is_none() {
            self.out.first_bad_line = Some(why);
        }
    }
}

/// Bytes inflated at a time (a few hundred of Ray's events).
const INFLATE_BLOCK: usize = 256 << 10;

/// Inflates `input` (one gzip member or several in a row, read whole) block by block into
/// `each`. Ends with the first error: what `each` refused, as it said it, or the stream's
/// own ("not a valid gzip stream: ...", a truncated one included). Inflated straight into a
/// block of [`INFLATE_BLOCK`] bytes: zlib copies the last 32 KiB of each call's output into
/// its window, which with flate2's writer (32 KiB a call) was a second copy of every byte.
pub(super) fn gunzip(
    input: impl BufRead,
    mut each: impl FnMut(&[u8]) -> Result<(), String>,
) -> Result<(), String> {
    let mut gz = flate2::bufread::MultiGzDecoder::new(input);
    let mut block = vec![0u8; INFLATE_BLOCK];
    loop {
        match gz.read(&mut block) {
            Ok(0) => return Ok(()),
            Ok(n) => each(&block[..n])?,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("not a valid gzip stream: {e}")),
        }
    }
}

/// `input` as it is, into `each`, with the same ending as [`gunzip`]'s (an error of
/// `input` is told as it is).
pub(super) fn plain(
    mut input: impl BufRead,
    mut each: impl FnMut(&[u8]) -> Result<(), String>,
) -> Result<(), String> {
    loop {
        let data = input.fill_buf().map_err(|e| e.to_string())?;
        if data.is_empty() {
            return Ok(());
        }
        let n = data.len();
        each(data)?;
        input.consume(n);
    }
}

/// Parses a line as JSON the generic way. Valid JSON that serde_json refuses and Go's reader
/// (KubeRay's history server) reads as U+FFFD (lone surrogate escapes) is read the same way.
pub(super) fn value_of(line: &[u8]) -> Result<Value, String> {
    match serde_json::from_slice::<Value>(line) {
        Ok(v) => Ok(v),
        Err(e) if has_lone_surrogate_escape(line) => {
            serde_json::from_slice::<Value>(&replace_lone_surrogates(line))
                .map_err(|_| format!("not valid JSON: {e}"))
        }
        Err(e) => Err(format!("not valid JSON: {e}")),
    }
}

/// Whether `text` may hold a `\uD800`-`\uDFFF` escape (cheap check before the rewrite).
fn has_lone_surrogate_escape(text: &[u8]) -> bool {
    text.windows(3)
        .any(|w| w[0] == b'\\' && w[1] == b'u' && matches!(w[2], b'd' | b'D'))
}

/// `text` with every surrogate escape that is not half of a valid pair replaced by
/// `\uFFFD`, which is what Go's `encoding/json` reads it as. Pairs and other text are kept.
fn replace_lone_surrogates(text: &[u8]) -> Vec<u8> {
    fn unit(t: &[u8], at: usize) -> Option<u16> {
        if t.get(at) != Some(&b'\\') || t.get(at + 1) != Some(&b'u') {
            return None;
        }
        let hex = std::str::from_utf8(t.get(at + 2..at + 6)?).ok()?;
        u16::from_str_radix(hex, 16).ok()
    }
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] == b'\\' {
            match unit(text, i) {
                Some(0xD800..=0xDBFF)
                    if unit(text, i + 6).is_some_and(|low| (0xDC00..=0xDFFF).contains(&low)) =>
                {
                    out.extend_from_slice(&text[i..i + 12]);
                    i += 12;
                }
                Some(0xD800..=0xDFFF) => {
                    out.extend_from_slice(b"\\uFFFD");
                    i += 6;
                }
                // Any other escape (or an escaped backslash) is copied whole, so an escaped
                // backslash followed by `u` is never taken for an escape.
                _ => {
                    let end = (i + 2).min(text.len());
                    out.extend_from_slice(&text[i..end]);
                    i = end;
                }
            }
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn sink_facts(content: &[u8], chunk: usize) -> Extraction {
        let mut sink = ContentSink::new(TimeWindow::default(), CONTENT_LIMITS);
        for part in content.chunks(chunk.max(1)) {
            sink.push(part).unwrap();
        }
        sink.finish(true);
        std::mem::take(&mut sink.out)
    }

    #[test]
    fn content_layouts() {
        let line = r#"{"eventId":"a","eventType":"X","timestamp":"2026-11-22T02:00:00Z"}"#;
        let lines = format!("{line}\n\nnot json\n{}\n", line.replace("\"a\"", "\"b\""));
        for chunk in [1, 7, 4096] {
            let e = sink_facts(lines.as_bytes(), chunk);
            assert_eq!(e.facts.len(), 2, "chunk {chunk}");
            assert_eq!(e.bad_lines, 1);
        }
        let array = format!("  [{line}, {}]", line.replace("\"a\"", "\"c\""));
        let e = sink_facts(array.as_bytes(), 3);
        assert_eq!(e.facts.len(), 2);
        assert_eq!(e.bad_lines, 0);
        // A last line without a newline still counts.
        assert_eq!(sink_facts(line.as_bytes(), 5).facts.len(), 1);
    }

    fn gz(content: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(content).unwrap();
        enc.finish().unwrap()
    }

    /// `gz` through [`gunzip`] into a sink, read `piece` bytes at a time.
    fn gunzipped(
        gz: &[u8],
        piece: usize,
        limits: ContentLimits,
    ) -> (Result<(), String>, Extraction) {
        let mut sink = ContentSink::new(TimeWindow::default(), limits);
        let input = std::io::BufReader::with_capacity(piece, gz);
        let read = gunzip(input, |data| sink.push(data));
        sink.finish(read.is_ok());
        (read, std::mem::take(&mut sink.out))
    }

    #[test]
    fn gzip_errors_are_reported() {
        let (read, _) = gunzipped(b"this is not gzip at all", 4096, CONTENT_LIMITS);
        assert!(read.unwrap_err().starts_with("not a valid gzip stream: "));
        // A truncated stream, cut anywhere (in a member, its trailer, the next header),
        // from one member or two in a row.
        let line = b"{\"eventType\":\"X\"}\n".repeat(100);
        let full = gz(&line);
        let two = [full.clone(), full.clone()].concat();
        for cut in [1, 6, 9, full.len() / 2, full.len() - 6, full.len() - 1] {
            let (read, _) = gunzipped(&full[..cut], 7, CONTENT_LIMITS);
            assert!(read.is_err(), "cut at {cut}");
            let (read, _) = gunzipped(&two[..full.len() + cut], 7, CONTENT_LIMITS);
            assert!(read.is_err(), "second member cut at {cut}");
        }
        // Whole, one member or two, read in any pieces.
        for piece in [1, 7, 4096] {
            let (read, e) = gunzipped(&two, piece, CONTENT_LIMITS);
            assert_eq!((read, e.facts.len()), (Ok(()), 200), "{piece}");
        }
        // Trailing bytes that are not a member are bad gzip.
        let (read, _) = gunzipped(
            &[full.clone(), b"x".to_vec()].concat(),
            4096,
            CONTENT_LIMITS,
        );
        assert!(read.is_err());
    }

    #[test]
    fn limits_are_reported_as_such() {
        let small = ContentLimits {
            line: 64,
            document: 128,
            decoded: 4096,
        };
        // An over-long line is one bad line; the lines around it still count.
        let line = r#"{"eventType":"X","eventId":"a"}"#;
        let content = format!("{line}\n{}\n{}\n", "x".repeat(200), line.replace('a', "b"));
        let mut sink = ContentSink::new(TimeWindow::default(), small);
        for part in content.as_bytes().chunks(10) {
            sink.push(part).unwrap();
        }
        sink.finish(true);
        assert_eq!(sink.out.facts.len(), 2);
        assert_eq!(sink.out.bad_lines, 1);
        // Too much content behind gzip is not "bad gzip".
        let (read, _) = gunzipped(&gz(&b"\n".repeat(10_000)), 4096, small);
        let err = read.unwrap_err();
        assert!(err.starts_with("more than 4.0 KiB"), "{err}");
        // A legacy array over its limit.
        let mut sink = ContentSink::new(TimeWindow::default(), small);
        assert!(sink
            .push(format!("[{}]", " ".repeat(200)).as_bytes())
            .is_err());
    }

    #[test]
    fn lone_surrogates_read_as_go_reads_them() {
        let line = br#"{"eventType":"X","eventId":"a","m":"\ud800 \udc00 \ud83d\ude00 \\ud800"}"#;
        assert!(serde_json::from_slice::<Value>(line).is_err());
        let fixed = replace_lone_surrogates(line);
        let v: Value = serde_json::from_slice(&fixed).unwrap();
        assert_eq!(v["m"], "\u{fffd} \u{fffd} \u{1f600} \\ud800");
        let e = sink_facts(line, 5);
        assert_eq!((e.facts.len(), e.bad_lines), (1, 0));
    }
}
