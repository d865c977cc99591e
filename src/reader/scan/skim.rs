//! A hand-written reader of the typed [`Line`] for the common case, in front of serde's: one
//! pass over the line's bytes that reads the members the typed structs name (by key, camelCase
//! and snake_case alike) and skips every other member by quote and bracket matching (strings
//! are not unescaped, nothing is allocated), checking the skipped JSON as serde_json's
//! `ignore_value` does.
//!
//! It gives up (`None`) on anything it is not sure of: an escape in a key, a field given twice
//! (under any of its names), a member whose value is not of the plain form it reads (an escaped
//! string, a float, a number it does not parse, a struct given as an array, an export event),
//! nesting deeper than [`MAX_DEPTH`], invalid JSON, bytes after the object. The caller then
//! reads the line with serde as before, so a line is never read differently: when this returns
//! a [`Line`], it is the one `serde_json::from_str::<Line>` makes. Values of an odd but
//! well-delimited form are handed to serde themselves (`serde_json::from_str` on the value's
//! text), so their reading is serde's by construction.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Deserialize;

use super::{
    parse_time_ns, task_state, ErrorInfo, FirstExecution, FunctionDescriptor, Functions, Int,
    LazyInt, Line, ProfileEvent, ProfileEvents, ScanTransitions, Stamp, Str, TaskDefinition,
    TaskLifecycle, TaskLogInfo, TaskProfile, Text, Transition, EXECUTION_EVENT_PREFIX,
};

/// Nesting deeper than this is left to serde (whose own limit is 128).
const MAX_DEPTH: u32 = 64;

/// `text` read as a [`Line`], or `None` when serde must read it.
pub(super) fn line(text: &str) -> Option<Line<'_>> {
    let mut c = Cur::new(text);
    c.ws();
    let line = c.line()?;
    c.ws();
    (c.i == c.b.len()).then_some(line)
}

/// The top-level members of the JSON object `text`, each key (it has no escapes) with its
/// value's text, checked as [`line`] checks what it skips; `None` if `text` is not such an
/// object, or if a value of it holds a number that serde_json might not read as a
/// `serde_json::Value` (see `Cur::big_number`): then every value of `text` reads as a
/// `Value` when its text does alone.
pub(super) fn members<'a>(text: &'a str, mut each: impl FnMut(&'a [u8], &'a str)) -> Option<()> {
    let mut c = Cur::new(text);
    c.ws();
    c.object(|c, key| {
        let start = c.i;
        c.skip()?;
        each(key, &c.s[start..c.i]);
        Some(())
    })?;
    c.ws();
    (c.i == c.b.len() && !c.big_number).then_some(())
}

struct Cur<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
    depth: u32,
    /// A number was skipped that serde_json might refuse to read as a value (not to skip):
    /// more than [`MAX_PLAIN_DIGITS`] digits before its point, or an exponent of more than
    /// two digits, either of which may be out of an `f64`'s range.
    big_number: bool,
}

/// Digits before the point of a number that cannot be out of an `f64`'s range, even with an
/// exponent of two digits.
const MAX_PLAIN_DIGITS: usize = 200;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The first byte at or after `i` that ends a plain run of string contents: a quote, a
/// backslash or a control character (`b.len()` if none). Sixteen bytes at a time with SSE2
/// (x86-64's baseline), then eight with [`next_special_swar`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn next_special(b: &[u8], mut i: usize) -> usize {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    while i + 16 <= b.len() {
        // SAFETY: SSE2 is always present on x86-64; the unaligned load reads b[i..i + 16],
        // which the loop's condition keeps inside `b`.
        let found = unsafe {
            let x = _mm_loadu_si128(b.as_ptr().add(i).cast());
            let quote = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'"' as i8));
            let backslash = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\\' as i8));
            // max(x, 0x1f) == 0x1f exactly when x <= 0x1f (unsigned).
            let control = _mm_cmpeq_epi8(_mm_max_epu8(x, _mm_set1_epi8(0x1f)), _mm_set1_epi8(0x1f));
            _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, backslash), control)) as u32
        };
        if found != 0 {
            return i + found.trailing_zeros() as usize;
        }
        i += 16;
    }
    next_special_swar(b, i)
}

#[cfg(not(target_arch = "x86_64"))]
fn next_special(b: &[u8], i: usize) -> usize {
    next_special_swar(b, i)
}

/// [`next_special`] eight bytes at a time: in each mask below, the lowest flagged byte is
/// exact (a borrow only flags bytes above a true one).
fn next_special_swar(b: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) {
        let x = u64::from_le_bytes(*chunk);
        let quote = x ^ (ONES * u64::from(b'"'));
        let backslash = x ^ (ONES * u64::from(b'\\'));
        let found = ((quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (x.wrapping_sub(ONES * 0x20) & !x))
            & HIGHS;
        if found != 0 {
            return i + (found.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            return i;
        }
        i += 1;
    }
    i
}

/// A JSON number of at most 15 digits and no exponent, as serde_json reads it as an `f64`:
/// its significand and power of ten are then exact, so serde's one multiplication or
/// division (or its correctly rounded parse) is the correctly rounded value `parse` gives.
fn plain_float(text: &str) -> Option<f64> {
    let digits = text.bytes().filter(u8::is_ascii_digit).count();
    if digits > 15 || text.bytes().any(|c| matches!(c, b'e' | b'E')) {
        return None;
    }
    // An integer of at most 15 digits is exact as an `f64`, and `-0` is -0.0 as serde reads it.
    text.parse().ok()
}

/// Marks field `bit` as seen; `None` if it was already (serde refuses a field given twice).
fn once(seen: &mut u32, bit: u32) -> Option<()> {
    let mask = 1 << bit;
    if *seen & mask != 0 {
        return None;
    }
    *seen |= mask;
    Some(())
}

impl<'a> Cur<'a> {
    fn new(text: &'a str) -> Cur<'a> {
        Cur {
            s: text,
            b: text.as_bytes(),
            i: 0,
            depth: 0,
            big_number: false,
        }
    }

    #[inline(always)]
    fn ws(&mut self) {
        // Ray writes no whitespace between tokens: one test in the common case.
        if self.b.get(self.i).is_some_and(|&c| c > b' ') {
            return;
        }
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline(always)]
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// A string at the cursor: the range of its contents and whether it has escapes. Checks
    /// what serde_json checks of a string it skips (escapes, no control characters).
    #[inline(always)]
    fn string(&mut self) -> Option<(usize, usize, bool)> {
        self.eat(b'"')?;
        let b = self.b;
        let start = self.i;
        let mut i = start;
        let mut escaped = false;
        loop {
            i = next_special(b, i);
            match *b.get(i)? {
                b'"' => {
                    self.i = i + 1;
                    return Some((start, i, escaped));
                }
                b'\\' => {
                    escaped = true;
                    match *b.get(i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                        b'u' => {
                            let hex = b.get(i + 2..i + 6)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            i += 6;
                        }
                        _ => return None,
                    }
                }
                // A control character.
                _ => return None,
            }
        }
    }

    /// An object at the cursor, each member's key given to `member`, which must read (or
    /// skip) its value.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            self.depth -= 1;
            return Some(());
        }
        let b = self.b;
        loop {
            self.ws();
            let (start, end, escaped) = self.string()?;
            if escaped {
                return None;
            }
            self.ws();
            self.eat(b':')?;
            self.ws();
            member(self, &b[start..end])?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    self.depth -= 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array at the cursor, each element read (or skipped) by `element`.
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        if self.peek()? == b']' {
            self.i += 1;
            self.depth -= 1;
            return Some(());
        }
        loop {
            self.ws();
            element(self)?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    self.depth -= 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Skips a value, checking it as serde_json's `ignore_value` does.
    fn skip(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' => self.object(|c, _| c.skip()),
            b'[' => self.array(Cur::skip),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.b.get(self.i) {
            self.i += 1;
        }
        self.i - start
    }

    /// A JSON number: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        if self.peek()? == b'-' {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => {
                self.i += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return None;
                }
            }
            b'1'..=b'9' => {
                if self.digits() > MAX_PLAIN_DIGITS {
                    self.big_number = true;
                }
            }
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return None;
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            match self.digits() {
                0 => return None,
                1 | 2 => {}
                _ => self.big_number = true,
            }
        }
        Some(())
    }

    /// The value at the cursor read by serde itself, from its own text.
    fn serde<T: Deserialize<'a>>(&mut self, start: usize) -> Option<T> {
        self.i = start;
        self.skip()?;
        serde_json::from_str(&self.s[start..self.i]).ok()
    }

    /// A string without escapes, borrowed; `Err(start)` for any other value.
    fn plain_str(&mut self) -> Result<&'a str, usize> {
        let start = self.i;
        if self.peek() == Some(b'"') {
            if let Some((a, z, false)) = self.string() {
                return Ok(&self.s[a..z]);
            }
        }
        Err(start)
    }

    fn text(&mut self) -> Option<Text<'a>> {
        match self.plain_str() {
            Ok(s) => Some(Some(Str(Cow::Borrowed(s)))),
            Err(start) => self.serde(start),
        }
    }

    fn stamp(&mut self) -> Option<Option<Stamp<'a>>> {
        match self.plain_str() {
            Ok(s) => Some(Some(Stamp::Text(Cow::Borrowed(s)))),
            Err(start) => self.serde(start),
        }
    }

    fn lazy_int(&mut self) -> Option<LazyInt<'a>> {
        match self.plain_str() {
            Ok(s) => Some(LazyInt::Text(Cow::Borrowed(s))),
            Err(start) => self.serde(start),
        }
    }

    /// A plain integer of at most 18 digits, or a string without escapes, read here (as
    /// [`Int`]'s visitor reads them); any other value by serde.
    fn int(&mut self) -> Option<Int> {
        let start = self.i;
        if self.peek() == Some(b'"') {
            return match self.plain_str() {
                Ok(s) => Some(Int(s.trim().parse().ok())),
                Err(start) => self.serde(start),
            };
        }
        let negative = self.peek() == Some(b'-');
        if negative {
            self.i += 1;
        }
        let digits_at = self.i;
        let n = self.digits();
        let plain = (1..=18).contains(&n)
            && (n == 1 || self.b[digits_at] != b'0')
            && !matches!(self.peek(), Some(b'.' | b'e' | b'E'));
        if !plain {
            return self.serde(start);
        }
        let mut v: i64 = 0;
        for d in &self.b[digits_at..self.i] {
            v = v * 10 + i64::from(d - b'0');
        }
        Some(Int(Some(if negative { -v } else { v })))
    }

    /// A struct member given as an object is read by `read`; any other value (`null`, or an
    /// array serde would read as the struct's fields in order) by serde.
    fn boxed<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<Box<T>>>
    where
        Option<Box<T>>: Deserialize<'a>,
    {
        if self.peek()? == b'{' {
            return read(self).map(|t| Some(Box::new(t)));
        }
        let start = self.i;
        self.serde(start)
    }

    /// [`Cur::boxed`] for a member that is not boxed.
    fn member<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>>
    where
        Option<T>: Deserialize<'a>,
    {
        if self.peek()? == b'{' {
            return read(self).map(Some);
        }
        let start = self.i;
        self.serde(start)
    }

    fn line(&mut self) -> Option<Line<'a>> {
        let mut l = Line {
            event_type: None,
            event_id: None,
            timestamp: None,
            source_type: None,
            event_data: None,
            task_definition: None,
            actor_task_definition: None,
            task_lifecycle: None,
            task_profile: None,
        };
        let mut seen = 0;
        self.object(|c, key| {
            match key {
                b"eventType" | b"event_type" => {
                    once(&mut seen, 0)?;
                    l.event_type = c.text()?;
                }
                b"eventId" | b"event_id" => {
                    once(&mut seen, 1)?;
                    l.event_id = c.text()?;
                }
                b"timestamp" => {
                    once(&mut seen, 2)?;
                    l.timestamp = c.stamp()?;
                }
                b"source_type" | b"sourceType" => {
                    once(&mut seen, 3)?;
                    l.source_type = c.text()?;
                }
                // Export events are rare (files, not pushes): serde reads them.
                b"event_data" | b"eventData" => return None,
                b"taskDefinitionEvent" | b"task_definition_event" => {
                    once(&mut seen, 5)?;
                    l.task_definition = c.boxed(Cur::definition)?;
                }
                b"actorTaskDefinitionEvent" | b"actor_task_definition_event" => {
                    once(&mut seen, 6)?;
                    l.actor_task_definition = c.boxed(Cur::definition)?;
                }
                b"taskLifecycleEvent" | b"task_lifecycle_event" => {
                    once(&mut seen, 7)?;
                    l.task_lifecycle = c.boxed(Cur::lifecycle)?;
                }
                b"taskProfileEvents" | b"task_profile_events" => {
                    once(&mut seen, 8)?;
                    l.task_profile = c.boxed(Cur::profile)?;
                }
                _ => c.skip()?,
            }
            Some(())
        })?;
        Some(l)
    }

    fn definition(&mut self) -> Option<TaskDefinition<'a>> {
        let mut d = TaskDefinition {
            task_id: None,
            attempt: Int::default(),
            job_id: None,
            name: None,
            task_type: None,
            func: None,
            resources: None,
        };
        let mut seen = 0;
        self.object(|c, key| {
            match key {
                b"taskId" | b"task_id" => {
                    once(&mut seen, 0)?;
                    d.task_id = c.text()?;
                }
                b"taskAttempt" | b"task_attempt" => {
                    once(&mut seen, 1)?;
                    d.attempt = c.int()?;
                }
                b"jobId" | b"job_id" => {
                    once(&mut seen, 2)?;
                    d.job_id = c.text()?;
                }
                b"taskName" | b"task_name" | b"actorTaskName" | b"actor_task_name" => {
                    once(&mut seen, 3)?;
                    d.name = c.text()?;
                }
                b"taskType" | b"task_type" => {
                    once(&mut seen, 4)?;
                    d.task_type = c.text()?;
                }
                b"taskFunc" | b"task_func" | b"actorFunc" | b"actor_func" => {
                    once(&mut seen, 5)?;
                    d.func = c.member(Cur::functions)?;
                }
                b"requiredResources" | b"required_resources" => {
                    once(&mut seen, 6)?;
                    d.resources = c.resources()?;
                }
                _ => c.skip()?,
            }
            Some(())
        })?;
        Some(d)
    }

    fn functions(&mut self) -> Option<Functions<'a>> {
        let mut f = Functions {
            python: None,
            java: None,
            cpp: None,
        };
        let mut seen = 0;
        self.object(|c, key| {
            match key {
                b"pythonFunctionDescriptor" | b"python_function_descriptor" => {
                    once(&mut seen, 0)?;
                    f.python = c.member(Cur::function)?;
                }
                b"javaFunctionDescriptor" | b"java_function_descriptor" => {
                    once(&mut seen, 1)?;
                    f.java = c.member(Cur::function)?;
                }
                b"cppFunctionDescriptor" | b"cpp_function_descriptor" => {
                    once(&mut seen, 2)?;
                    f.cpp = c.member(Cur::function)?;
                }
                _ => c.skip()?,
            }
            Some(())
        })?;
        Some(f)
    }

    fn function(&mut self) -> Option<FunctionDescriptor<'a>> {
        let mut f = FunctionDescriptor {
            function_name: None,
        };
        let mut seen = 0;
        self.object(|c, key| {
            match key {
                b"functionName" | b"function_name" => {
                    once(&mut seen, 0)?;
                    f.function_name = c.text()?;
                }
                _ => c.skip()?,
            }
            Some(())
        })?;
        Some(f)
    }

    /// `requiredResources`: an object of plain numbers read here (later keys replace earlier
    /// ones, as in serde's map); anything else by serde.
    fn resources(&mut self) -> Option<Option<BTreeMap<Cow<'a, str>, f64>>> {
        let start = self.i;
        if self.peek()? != b'{' {
            return self.serde(start);
        }
        let mut map = BTreeMap::new();
        let s = self.s;
        let depth = self.depth;
        let plain = self.object(|c, key| {
            let at = c.i;
            c.number()?;
            let v = plain_float(&s[at..c.i])?;
            // The key has no escapes (`object` checked): as serde reads it.
            map.insert(Cow::Borrowed(std::str::from_utf8(key).ok()?), v);
            Some(())
        });
        match plain {
            Some(()) => Some(Some(map)),
            None => {
                // Not held while serde reads the value again (review r54s D1: a map of 2M
                // keys with one value serde must read held both maps at once, 650 MB against
                // 440 MB).
                drop(map);
                self.depth = depth;
                self.serde(start)
            }
        }
    }

    fn lifecycle(&mut self) -> Option<TaskLifecycle<'a>> {
        let mut l = TaskLifecycle {
            task_id: None,
            attempt: Int::default(),
            job_id: None,
            transitions: ScanTransitions::default(),
            error: None,
            node_id: None,
            worker_id: None,
            worker_pid: Int::default(),
            log: None,
        };
        let mut seen = 0;
        self.object(|c, key| {
            match key {
                b"taskId" | b"task_id" => {
                    once(&mut seen, 0)?;
                    l.task_id = c.text()?;
                }
                b"taskAttempt" | b"task_attempt" => {
                    once(&mut seen, 1)?;
                    l.attempt = c.int()?;
                }
                b"jobId" | b"job_id" => {
                    once(&mut seen, 2)?;
                    l.job_id = c.text()?;
                }
                b"stateTransitions" | b"state_transitions" => {
                    once(&mut seen, 3)?;
                    l.transitions = c.transitions()?;
                }
                b"rayErrorInfo" | b"ray_error_info" => {
                    once(&mut seen, 4)?;
                    l.error = c.member(Cur::error_info)?;
                }
                b"nodeId" | b"node_id" => {
                    once(&mut seen, 5)?;
                    l.node_id = c.text()?;
                }
                b"workerId" | b"worker_id" => {
                    once(&mut seen, 6)?;
                    l.worker_id = c.text()?;
                }
                b"workerPid" | b"worker_pid" => {
                    once(&mut seen, 7)?;
                    l.worker_pid = c.int()?;
                }
                b"taskLogInfo" | b"task_log_info" => {
                    once(&mut seen, 8)?;
                    l.log = c.member(Cur::log_info)?;
                }
                _ => c.skip()?,
            }
            Some(())
        })?;
        Some(l)
    }

    fn error_info(&mut self) -> Option<ErrorInfo<'a>> {
        let mut e = ErrorInfo {
            error_type: None,
            error_message: None,
        };
        let mut seen = 0;
        self.object(|c, key| {
            match key {
                b"errorType" | b"error_type" => {
                    once(&mut seen, 0)?;
                    e.error_type = c.text()?;
                }
                b"errorMessage" | b"error_message" => {
                    once(&mut seen, 1)?;
                    e.error_message = c.text()?;
                }
                _ => c.skip()?,
            }
            Some(())
        })?;
        Some(e)
    }

    fn log_info(&mut self) -> Option<TaskLogInfo<'a>> {
        let mut l = TaskLogInfo {
            stdout_file: None,
            stderr_file: None,
            stdout_start: Int::default(),
            stdout_end: Int::default(),
            stderr_start: Int::default(),
            stderr_end: Int::default(),
        };
        let mut seen = 0;
        self.object(|c, key| {
            match key {
                b"stdoutFile" | b"stdout_file" => {
                    once(&mut seen, 0)?;
                    l.stdout_file = c.text()?;
                }
                b"stderrFile" | b"stderr_file" => {
                    once(&mut seen, 1)?;
                    l.stderr_file = c.text()?;
                }
                b"stdoutStart" | b"stdout_start" => {
                    once(&mut seen, 2)?;
                    l.stdout_start = c.int()?;
                }
                b"stdoutEnd" | b"stdout_end" => {
                    once(&mut seen, 3)?;
                    l.stdout_end = c.int()?;
                }
                b"stderrStart" | b"stderr_start" => {
                    once(&mut seen, 4)?;
                    l.stderr_start = c.int()?;
                }
                b"stderrEnd" | b"stderr_end" => {
                    once(&mut seen, 5)?;
                    l.stderr_end = c.int()?;
                }
                _ => c.skip()?,
            }
            Some(())
        })?;
        Some(l)
    }

    /// `stateTransitions` as [`ScanTransitions`] reads it: a list of objects here, any other
    /// value by serde.
    fn transitions(&mut self) -> Option<ScanTransitions> {
        if self.peek()? != b'[' {
            let start = self.i;
            return self.serde(start);
        }
        let mut out = ScanTransitions::default();
        self.array(|c| {
            let mut state: Text<'a> = None;
            let mut timestamp: Text<'a> = None;
            let mut seen = 0;
            c.object(|c, key| {
                match key {
                    b"state" => {
                        once(&mut seen, 0)?;
                        state = c.text()?;
                    }
                    b"timestamp" => {
                        once(&mut seen, 1)?;
                        timestamp = c.text()?;
                    }
                    _ => c.skip()?,
                }
                Some(())
            })?;
            if let Some(state) = state.as_deref().filter(|s| !s.is_empty()) {
                out.0.push(Transition {
                    state: task_state(state),
                    time_ns: timestamp.as_deref().and_then(parse_time_ns),
                });
            }
            Some(())
        })?;
        Some(out)
    }

    fn profile(&mut self) -> Option<TaskProfile<'a>> {
        let mut p = TaskProfile {
            task_id: None,
            attempt: Int::default(),
            job_id: None,
            profile: None,
        };
        let mut seen = 0;
        self.object(|c, key| {
            match key {
                b"taskId" | b"task_id" => {
                    once(&mut seen, 0)?;
                    p.task_id = c.text()?;
                }
                b"attemptNumber" | b"attempt_number" => {
                    once(&mut seen, 1)?;
                    p.attempt = c.int()?;
                }
                b"jobId" | b"job_id" => {
                    once(&mut seen, 2)?;
                    p.job_id = c.text()?;
                }
                b"profileEvents" | b"profile_events" => {
                    once(&mut seen, 3)?;
                    p.profile = c.member(Cur::profile_events)?;
                }
                _ => c.skip()?,
            }
            Some(())
        })?;
        Some(p)
    }

    fn profile_events(&mut self) -> Option<ProfileEvents<'a>> {
        let mut p = ProfileEvents {
            component_type: None,
            component_id: None,
            events: None,
        };
        let mut seen = 0;
        self.object(|c, key| {
            match key {
                b"componentType" | b"component_type" => {
                    once(&mut seen, 0)?;
                    p.component_type = c.text()?;
                }
                b"componentId" | b"component_id" => {
                    once(&mut seen, 1)?;
                    p.component_id = c.text()?;
                }
                b"events" => {
                    once(&mut seen, 2)?;
                    p.events = c.events()?;
                }
                _ => c.skip()?,
            }
            Some(())
        })?;
        Some(p)
    }

    /// A profile's events as [`FirstExecution`] reads them: every event read (and checked),
    /// the first `task::` one kept.
    fn events(&mut self) -> Option<Option<FirstExecution<'a>>> {
        if self.peek()? != b'[' {
            let start = self.i;
            return self.serde(start);
        }
        let mut first: Option<ProfileEvent<'a>> = None;
        self.array(|c| {
            if c.peek()? != b'{' {
                return None;
            }
            let mut e = ProfileEvent {
                name: None,
                start: LazyInt::Unset,
                end: LazyInt::Unset,
            };
            let mut seen = 0;
            c.object(|c, key| {
                match key {
                    b"eventName" | b"event_name" => {
                        once(&mut seen, 0)?;
                        e.name = c.text()?;
                    }
                    b"startTime" | b"start_time" => {
                        once(&mut seen, 1)?;
                        e.start = c.lazy_int()?;
                    }
                    b"endTime" | b"end_time" => {
                        once(&mut seen, 2)?;
                        e.end = c.lazy_int()?;
                    }
                    _ => c.skip()?,
                }
                Some(())
            })?;
            let execution = e
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(EXECUTION_EVENT_PREFIX));
            if first.is_none() && execution {
                first = Some(e);
            }
            Some(())
        })?;
        Some(Some(FirstExecution(first)))
    }
}

/// Test only: `rounds` lines taken in turn from `lines`, each with one to three random
/// perturbations (a byte replaced, inserted or deleted, a space added, the line cut), from a
/// fixed `seed` so a failure reproduces.
#[cfg(test)]
pub(super) fn perturbed(lines: &[String], seed: u64, rounds: usize) -> Vec<Vec<u8>> {
    let mut seed = seed;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    const BYTES: &[u8] = b"\"\\{}[],: 0123-.eEtrunlfasx\t\n\x01u";
    (0..rounds)
        .map(|round| {
            let mut l = lines[round % lines.len()].clone().into_bytes();
            for _ in 0..1 + next() % 3 {
                let at = (next() as usize) % l.len();
                let b = BYTES[(next() as usize) % BYTES.len()];
                match next() % 5 {
                    0 => l[at] = b,
                    1 => l.insert(at, b),
                    2 => {
                        l.remove(at);
                    }
                    3 => l.insert(at, b' '),
                    _ => l.truncate(at.max(1)),
                }
            }
            l
        })
        .collect()
}

#[cfg(test)]
mod tests;
