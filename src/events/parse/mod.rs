//! Splits a POST body into events and reads the few fields routing needs.
//!
//! One pass over the body: a validating scanner checks every element, borrows the routing
//! fields (event id, type, session, timestamp, node id, the payload's job id) and skips
//! everything else, and the element's exact byte range is kept so the spool stores what Ray
//! sent, not a re-serialization.

use std::borrow::Cow;
use std::ops::Range;

#[cfg(test)]
mod reference;

/// The body is not JSON we can split into events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} at byte {offset}")]
pub struct BodyError {
    /// What is wrong, in serde_json's words or ours.
    pub message: String,
    /// Zero-based byte offset in the (decompressed) body.
    pub offset: usize,
}

/// A string field as found: absent, a string, or some other JSON type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Field<'a> {
    /// Key not present.
    #[default]
    Missing,
    /// A JSON string (borrowed when it had no escapes).
    Str(Cow<'a, str>),
    /// Present with a non-string type (number, object, ...).
    WrongType,
}

impl<'a> Field<'a> {
    /// The string, if the field is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Field::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// The routing view of one event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFields<'a> {
    /// `eventId` / `event_id`.
    pub event_id: Field<'a>,
    /// `eventType` / `event_type`.
    pub event_type: Field<'a>,
    /// `sessionName` / `session_name`.
    pub session_name: Field<'a>,
    /// `timestamp`.
    pub timestamp: Field<'a>,
    /// Top-level `nodeId` / `node_id`: the node that emitted the event.
    pub node_id: Field<'a>,
    /// `jobId` / `job_id` of the first payload object that carries a non-empty one.
    pub job_id: Field<'a>,
    /// A top-level key has a `_`: Ray sent protobuf field names (`event_id`), as it does with
    /// `RAY_DASHBOARD_AGGREGATOR_AGENT_PRESERVE_PROTO_FIELD_NAME=1`. Ray's camelCase keys
    /// never have one.
    pub snake_case: bool,
}

/// One array element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedEvent<'a> {
    /// A JSON object, with its routing fields.
    Object(EventFields<'a>),
    /// Valid JSON, but not an object.
    NotObject,
}

/// One element of the body and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEvent<'a> {
    /// Byte range of the element in the body, exactly as sent.
    pub range: Range<usize>,
    /// Whether the element's bytes contain a line break (only possible as whitespace
    /// between tokens), which must become a space to keep one event per line.
    pub has_newline: bool,
    /// What the element is.
    pub parsed: ParsedEvent<'a>,
    /// Valid JSON that common readers refuse, if any: a number outside the range of a
    /// double, which Go's `encoding/json` (KubeRay's history server) and serde_json both
    /// reject, the whole event with it. The caller quarantines such an element.
    pub unreadable: Option<&'static str>,
}

/// Why an element is [`RawEvent::unreadable`].
pub const NUMBER_OUT_OF_RANGE: &str = "a number outside the range of a double";

/// Splits `body` (a JSON array of events, or a single event object) into events.
pub fn parse_body(body: &[u8]) -> Result<Vec<RawEvent<'_>>, BodyError> {
    let mut events = Vec::new();
    for_each_event(body, |e| events.push(e))?;
    Ok(events)
}

/// Calls `f` for every element of `body`; stops at the first syntax error.
pub fn for_each_event<'a>(body: &'a [u8], f: impl FnMut(RawEvent<'a>)) -> Result<(), BodyError> {
    let text = utf8(body)?;
    split_body(text, parse_element, f)
}

/// The array around the elements; `element` parses one element at an offset.
fn split_body<'a>(
    text: &'a str,
    element: impl Fn(&'a str, usize) -> Result<(RawEvent<'a>, usize), BodyError>,
    mut f: impl FnMut(RawEvent<'a>),
) -> Result<(), BodyError> {
    let body = text.as_bytes();
    let mut pos = skip_ws(body, 0);
    match body.get(pos) {
        None => {
            return Err(BodyError {
                message: "empty body, expected a JSON array of events".into(),
                offset: pos,
            })
        }
        Some(b'{') => {
            let (ev, end) = element(text, pos)?;
            f(ev);
            let tail = skip_ws(body, end);
            if tail != body.len() {
                return Err(trailing(tail));
            }
            return Ok(());
        }
        Some(b'[') => pos += 1,
        Some(_) => {
            return Err(BodyError {
                message: "expected a JSON array of events or one event object".into(),
                offset: pos,
            })
        }
    }
    pos = skip_ws(body, pos);
    if body.get(pos) == Some(&b']') {
        let tail = skip_ws(body, pos + 1);
        if tail != body.len() {
            return Err(trailing(tail));
        }
        return Ok(());
    }
    loop {
        let (ev, end) = element(text, pos)?;
        f(ev);
        pos = skip_ws(body, end);
        match body.get(pos) {
            Some(b',') => pos = skip_ws(body, pos + 1),
            Some(b']') => {
                let tail = skip_ws(body, pos + 1);
                if tail != body.len() {
                    return Err(trailing(tail));
                }
                return Ok(());
            }
            None => {
                return Err(BodyError {
                    message: "unexpected end of body inside the event array".into(),
                    offset: pos,
                })
            }
            Some(_) => {
                return Err(BodyError {
                    message: "expected ',' or ']' after an event".into(),
                    offset: pos,
                })
            }
        }
    }
}

fn trailing(offset: usize) -> BodyError {
    BodyError {
        message: "unexpected data after the JSON value".into(),
        offset,
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i
}

/// Parses the element starting at `start`; returns it and the offset just past it.
fn parse_element(text: &str, start: usize) -> Result<(RawEvent<'_>, usize), BodyError> {
    let mut s = Scanner {
        text,
        b: text.as_bytes(),
        i: start,
        newline: false,
        unreadable: None,
    };
    if s.i >= s.b.len() {
        return Err(BodyError {
            message: "unexpected end of body, expected an event".into(),
            offset: s.b.len(),
        });
    }
    let parsed = if s.b[s.i] == b'{' {
        s.event_object().map(ParsedEvent::Object)
    } else {
        s.value(0).map(|()| ParsedEvent::NotObject)
    };
    let parsed = parsed.map_err(|message| BodyError {
        message: format!("invalid JSON: {message}"),
        offset: s.i.min(s.b.len()),
    })?;
    Ok((
        RawEvent {
            range: start..s.i,
            has_newline: s.newline,
            parsed,
            unreadable: s.unreadable,
        },
        s.i,
    ))
}

/// Parses `line` as exactly one event (a spool line, an export event line).
pub fn parse_event(line: &[u8]) -> Result<ParsedEvent<'_>, BodyError> {
    let text = utf8(line)?;
    let pos = skip_ws(line, 0);
    let (ev, end) = parse_element(text, pos)?;
    let tail = skip_ws(line, end);
    if tail != line.len() {
        return Err(trailing(tail));
    }
    Ok(ev.parsed)
}

fn utf8(body: &[u8]) -> Result<&str, BodyError> {
    if u32::try_from(body.len()).is_err() {
        return Err(BodyError {
            message: "body of 4 GiB or more; send smaller batches".into(),
            offset: 0,
        });
    }
    std::str::from_utf8(body).map_err(|e| BodyError {
        message: "invalid JSON: the body is not valid UTF-8".into(),
        offset: e.valid_up_to(),
    })
}

/// Nesting deeper than this is refused, as serde_json and most JSON readers do, so that no
/// consumer of the stored events has to follow an attacker's depth.
const MAX_DEPTH: usize = 127;

/// A validating JSON scanner over one element.
///
/// Hand-written because this is the ingest hot path: serde_json's visitor API spent most
/// of the collector's CPU here (benches/parse.rs: 3.5 ms for a body of 1,000 Ray events,
/// against 0.9 ms for serde_json merely skipping it). The scanner checks the whole grammar
/// of RFC 8259 (the body's UTF-8 is checked once before), keeps no tree, borrows the few
/// routing fields and only unescapes those that contain escapes.
struct Scanner<'a> {
    text: &'a str,
    b: &'a [u8],
    /// Where the scanner is; on an error, where the error is.
    i: usize,
    /// A line break was seen between tokens (strings cannot hold a raw one).
    newline: bool,
    /// The first value common JSON readers refuse (see [`RawEvent::unreadable`]).
    unreadable: Option<&'static str>,
}

/// What is wrong, at the scanner's position. Small enough to return in registers, which
/// the hot path notices (a `BodyError` is built once, at the end).
type Scan<T> = Result<T, &'static str>;

/// A string token: its contents' byte range and whether they contain escapes.
#[derive(Clone, Copy)]
struct StrToken {
    start: u32,
    end: u32,
    escaped: bool,
}

impl StrToken {
    fn range(&self) -> Range<usize> {
        self.start as usize..self.end as usize
    }
}

impl<'a> Scanner<'a> {
    fn eof_or(&self, message: &'static str) -> &'static str {
        if self.i >= self.b.len() {
            "unexpected end of body"
        } else {
            message
        }
    }

    #[inline]
    fn ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            match c {
                b' ' | b'\t' => {}
                b'\n' | b'\r' => self.newline = true,
                _ => return,
            }
            self.i += 1;
        }
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn expect(&mut self, c: u8, message: &'static str) -> Scan<()> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(self.eof_or(message))
        }
    }

    /// Reads the string token at `self.i` (which must be `"`).
    #[inline]
    fn string(&mut self) -> Scan<StrToken> {
        let start = self.i + 1;
        let mut j = start;
        let mut escaped = false;
        loop {
            j = find_string_special(self.b, j);
            match self.b.get(j) {
                Some(b'"') => {
                    self.i = j + 1;
                    // Offsets fit: `utf8` refuses bodies of 4 GiB or more.
                    return Ok(StrToken {
                        start: start as u32,
                        end: j as u32,
                        escaped,
                    });
                }
                Some(b'\\') => {
                    escaped = true;
                    j = self.escape(j)?;
                }
                Some(_) => {
                    self.i = j;
                    return Err("control character in a string (must be escaped)");
                }
                None => {
                    self.i = j;
                    return Err("unexpected end of body inside a string");
                }
            }
        }
    }

    /// Checks the escape at `j` (a backslash); returns the offset after it.
    fn escape(&mut self, j: usize) -> Scan<usize> {
        match self.b.get(j + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(j + 2),
            Some(b'u') => {
                let hex = self.b.get(j + 2..j + 6);
                if hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                    Ok(j + 6)
                } else {
                    self.i = j;
                    Err(self.eof_or("\\u must be followed by 4 hex digits"))
                }
            }
            _ => {
                self.i = j;
                Err("invalid escape in a string")
            }
        }
    }

    /// The token's contents as a string: borrowed, or unescaped when it has escapes.
    /// `None` if the escapes do not make valid Unicode (a lone surrogate).
    fn token_str(&self, t: &StrToken) -> Option<Cow<'a, str>> {
        if !t.escaped {
            return self.text.get(t.range()).map(Cow::Borrowed);
        }
        // Rare: let serde_json unescape the whole token, quotes included.
        let raw = self.text.get(t.start as usize - 1..t.end as usize + 1)?;
        serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
    }

    /// The key's raw bytes when it has no escapes, else its unescaped text.
    fn key_bytes(&self, t: &StrToken) -> Cow<'a, [u8]> {
        if !t.escaped {
            return Cow::Borrowed(&self.b[t.range()]);
        }
        match self.token_str(t) {
            Some(s) => Cow::Owned(s.into_owned().into_bytes()),
            None => Cow::Borrowed(&[]),
        }
    }

    /// Reads `"key" :` of an object member (at its opening quote) and the spaces after it.
    fn member_key(&mut self) -> Scan<StrToken> {
        if self.peek() != Some(b'"') {
            return Err(self.eof_or("expected a string key"));
        }
        let key = self.string()?;
        self.ws();
        self.expect(b':', "expected ':' after an object key")?;
        self.ws();
        Ok(key)
    }

    /// After a member's value: true if another member follows (`,` read), false at `}`.
    fn next_member(&mut self) -> Scan<bool> {
        self.ws();
        match self.peek() {
            Some(b',') => {
                self.i += 1;
                self.ws();
                Ok(true)
            }
            Some(b'}') => {
                self.i += 1;
                Ok(false)
            }
            _ => Err(self.eof_or("expected ',' or '}' in an object")),
        }
    }

    /// Steps into the object at `{`; true if it is empty (its `}` read too).
    fn enter_object(&mut self) -> bool {
        self.i += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// The event object (at its `{`): every member checked, routing fields read.
    fn event_object(&mut self) -> Scan<EventFields<'a>> {
        let mut fields = EventFields::default();
        if self.enter_object() {
            return Ok(fields);
        }
        loop {
            let key = self.member_key()?;
            let name = self.key_bytes(&key);
            fields.snake_case |= name.contains(&b'_');
            let slot = match &name[..] {
                b"eventId" | b"event_id" => Some(&mut fields.event_id),
                b"eventType" | b"event_type" => Some(&mut fields.event_type),
                b"sessionName" | b"session_name" => Some(&mut fields.session_name),
                b"timestamp" => Some(&mut fields.timestamp),
                b"nodeId" | b"node_id" => Some(&mut fields.node_id),
                _ => None,
            };
            match slot {
                Some(slot) => *slot = self.str_field(1)?,
                None if self.peek() == Some(b'{') => {
                    // A payload object may carry the job id; the first non-empty one wins.
                    if let Some(job) = self.payload_object()? {
                        if !matches!(&fields.job_id, Field::Str(s) if !s.is_empty()) {
                            fields.job_id = job;
                        }
                    }
                }
                None => self.value(1)?,
            }
            if !self.next_member()? {
                return Ok(fields);
            }
        }
    }

    /// A member of the event (at depth 1, its value at depth 2): returns its `jobId`, if any.
    fn payload_object(&mut self) -> Scan<Option<Field<'a>>> {
        let mut job = None;
        if self.enter_object() {
            return Ok(None);
        }
        loop {
            let key = self.member_key()?;
            if matches!(&self.key_bytes(&key)[..], b"jobId" | b"job_id") {
                job = Some(self.str_field(2)?);
            } else {
                self.value(2)?;
            }
            if !self.next_member()? {
                return Ok(job);
            }
        }
    }

    /// A value that should be a string; `null` counts as absent (proto3 JSON).
    fn str_field(&mut self, depth: usize) -> Scan<Field<'a>> {
        match self.peek() {
            Some(b'"') => {
                let t = self.string()?;
                Ok(match self.token_str(&t) {
                    Some(s) => Field::Str(s),
                    None => Field::WrongType,
                })
            }
            Some(b'n') => {
                self.literal(b"null")?;
                Ok(Field::Missing)
            }
            _ => {
                self.value(depth)?;
                Ok(Field::WrongType)
            }
        }
    }

    fn literal(&mut self, word: &'static [u8]) -> Scan<()> {
        if self.b.get(self.i..self.i + word.len()) == Some(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(self.eof_or("expected a JSON value"))
        }
    }

    fn number(&mut self) -> Scan<()> {
        let digits = |s: &mut Self| {
            let from = s.i;
            while s.peek().is_some_and(|c| c.is_ascii_digit()) {
                s.i += 1;
            }
            s.i > from
        };
        let from = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let int_from = self.i;
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(self.eof_or("invalid number")),
        }
        // Without an exponent, only an integer part of more than 308 digits can overflow.
        let mut check = self.i - int_from > 300;
        if self.peek() == Some(b'.') {
            self.i += 1;
            if !digits(self) {
                return Err(self.eof_or("invalid number: digits expected after '.'"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if !digits(self) {
                return Err(self.eof_or("invalid number: digits expected in the exponent"));
            }
            check = true;
        }
        // Rare in Ray's events (its doubles print without exponents); the parse is cheap.
        if check
            && self.unreadable.is_none()
            && !self
                .text
                .get(from..self.i)
                .and_then(|t| t.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        {
            self.unreadable = Some(NUMBER_OUT_OF_RANGE);
        }
        Ok(())
    }

    /// Checks one value of any type at `self.i`, found inside `depth` containers.
    ///
    /// Iterative, with the open containers as a bit stack (1 = array), so a deeply nested
    /// body costs no stack.
    fn value(&mut self, depth: usize) -> Scan<()> {
        let mut stack: u128 = 0;
        let mut open = 0usize;
        loop {
            // A value is expected here.
            match self.peek() {
                Some(b'"') => {
                    self.string()?;
                }
                Some(c @ (b'{' | b'[')) => {
                    if depth + open + 1 > MAX_DEPTH {
                        return Err("nested too deeply");
                    }
                    let is_array = c == b'[';
                    self.i += 1;
                    self.ws();
                    if self.peek() == Some(if is_array { b']' } else { b'}' }) {
                        self.i += 1;
                    } else {
                        stack = (stack << 1) | u128::from(is_array);
                        open += 1;
                        if !is_array {
                            self.member_key()?;
                        }
                        continue;
                    }
                }
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(b'n') => self.literal(b"null")?,
                Some(b'-' | b'0'..=b'9') => self.number()?,
                _ => return Err(self.eof_or("expected a JSON value")),
            }
            // After a value: close containers until one continues with ','.
            loop {
                if open == 0 {
                    return Ok(());
                }
                self.ws();
                let in_array = stack & 1 == 1;
                match (self.peek(), in_array) {
                    (Some(b','), _) => {
                        self.i += 1;
                        self.ws();
                        if !in_array {
                            self.member_key()?;
                        }
                        break;
                    }
                    (Some(b']'), true) | (Some(b'}'), false) => {
                        self.i += 1;
                        stack >>= 1;
                        open -= 1;
                    }
                    (_, true) => return Err(self.eof_or("expected ',' or ']' in an array")),
                    (_, false) => return Err(self.eof_or("expected ',' or '}' in an object")),
                }
            }
        }
    }
}

/// Offset of the first `"`, `\` or control character at or after `j` (or `b.len()`).
///
/// Strings are most of an event's bytes, and this loop is most of the scanner's time: on
/// x86_64 sixteen bytes at a time with SSE2 (part of the architecture's baseline), which
/// took the scanner from 11.9k to 10.7k instructions per Ray event (callgrind, a body of
/// 1,000 events of the capture); the rest of the string, and other architectures, eight at
/// a time.
#[inline]
fn find_string_special(b: &[u8], j: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8,
            _mm_or_si128, _mm_set1_epi8,
        };
        let mut j = j;
        // SAFETY: SSE2 is always present on x86_64; every load reads 16 bytes that lie
        // within `b` (`j + 16 <= b.len()`), unaligned loads are allowed.
        unsafe {
            let quote = _mm_set1_epi8(b'"' as i8);
            let slash = _mm_set1_epi8(b'\\' as i8);
            let below_space = _mm_set1_epi8(0x1f);
            while j + 16 <= b.len() {
                let v = _mm_loadu_si128(b.as_ptr().add(j).cast::<__m128i>());
                // A byte is a control character when min(byte, 0x1f) == byte (unsigned).
                let control = _mm_cmpeq_epi8(_mm_min_epu8(v, below_space), v);
                let special = _mm_or_si128(
                    _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, slash)),
                    control,
                );
                let mask = _mm_movemask_epi8(special) as u32;
                if mask != 0 {
                    return j + mask.trailing_zeros() as usize;
                }
                j += 16;
            }
        }
        find_string_special_swar(b, j)
    }
    #[cfg(not(target_arch = "x86_64"))]
    find_string_special_swar(b, j)
}

/// [`find_string_special`] eight bytes at a time, in portable code.
#[inline]
fn find_string_special_swar(b: &[u8], mut j: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = b.get(j..j + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let v = u64::from_le_bytes(word);
        let quote = v ^ (ONES * u64::from(b'"'));
        let slash = v ^ (ONES * u64::from(b'\\'));
        // A byte is flagged if it is zero (after the xor) or below 0x20; bytes >= 0x80 never
        // are. Only the lowest flag is exact, which is the one used.
        let hits = ((quote.wrapping_sub(ONES) & !quote)
            | (slash.wrapping_sub(ONES) & !slash)
            | (v.wrapping_sub(ONES * 0x20) & !v))
            & HIGHS;
        if hits != 0 {
            return j + (hits.trailing_zeros() / 8) as usize;
        }
        j += 8;
    }
    while let Some(&c) = b.get(j) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            return j;
        }
        j += 1;
    }
    j
}

#[cfg(test)]
mod tests;
