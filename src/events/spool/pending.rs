//! The lines a group stages for one segment, until the writer appends them with `writev`.
//!
//! An event is not copied when it is staged: its line is a reference into the request body
//! it came in (kept alive, shared, until the write), and its newline is added at the write.
//! Only lines that must differ from what Ray sent are copied: an event whose bytes hold a
//! line break (between tokens, where it becomes a space so the segment keeps one event per
//! line) and the quarantine records. So a byte of an event is copied once on its way from
//! the request body to the page cache, by the kernel, instead of twice.
//!
//! The write gives the same bytes, in the same order, as one buffer would: a segment never
//! sees a line of one request inside another's, and a short write is continued where it
//! stopped, so what reaches the file is whole lines or an error (which the writer rolls back).

use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::ops::Range;

use bytes::Bytes;

/// Most slices handed to one `writev` (Linux's `IOV_MAX`).
const MAX_SLICES: usize = 1024;

/// Marks a piece of [`Pending::owned`] rather than of a request body.
const OWNED: usize = usize::MAX;

/// Lines staged for one segment, in order.
#[derive(Default)]
pub(super) struct Pending {
    /// The request bodies the event pieces point into, each once.
    bodies: Vec<Bytes>,
    /// Copied lines, each with its newline.
    owned: Vec<u8>,
    pieces: Vec<Piece>,
    /// Bytes the write will append.
    len: u64,
    /// Some line holds an event id (an event, or a `too_many_partitions` record): the ids
    /// journal records the segment's length after the group ([`super::journal`]).
    pub(super) ids: bool,
}

/// An event of `bodies[source]` (its newline comes at the write), or copied lines of
/// `owned` (newlines included) when `source` is [`OWNED`].
#[derive(Clone, Copy)]
struct Piece {
    source: usize,
    start: usize,
    end: usize,
}

impl Pending {
    /// Nothing is staged.
    pub(super) fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Bytes the write will append.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Room for `events` more event lines.
    pub(super) fn reserve(&mut self, events: usize) {
        self.pieces.reserve(events);
    }

    /// Stages the event at `range` of `body` (which must lie in it, as an
    /// [`super::EventSpan`]'s range does) as one line. Its bytes are referenced, not copied,
    /// unless they hold line breaks: then a copy gets spaces in their place.
    pub(super) fn push_event(&mut self, body: &Bytes, range: Range<usize>, has_newline: bool) {
        if has_newline {
            let start = self.owned.len();
            self.owned.extend_from_slice(&body[range]);
            for c in &mut self.owned[start..] {
                if *c == b'\n' || *c == b'\r' {
                    *c = b' ';
                }
            }
            self.owned.push(b'\n');
            self.push_owned_piece(start);
            return;
        }
        let same_body = self
            .bodies
            .last()
            .is_some_and(|b| b.as_ptr() == body.as_ptr() && b.len() == body.len());
        if !same_body {
            self.bodies.push(body.clone());
        }
        self.len += range.len() as u64 + 1;
        self.pieces.push(Piece {
            source: self.bodies.len() - 1,
            start: range.start,
            end: range.end,
        });
    }

    /// Stages complete lines (each ending in a newline), copied.
    pub(super) fn push_lines(&mut self, lines: &[u8]) {
        let start = self.owned.len();
        self.owned.extend_from_slice(lines);
        self.push_owned_piece(start);
    }

    fn push_owned_piece(&mut self, start: usize) {
        let end = self.owned.len();
        self.len += (end - start) as u64;
        // Copied lines that follow each other are written as one slice.
        if let Some(last) = self.pieces.last_mut() {
            if last.source == OWNED && last.end == start {
                last.end = end;
                return;
            }
        }
        self.pieces.push(Piece {
            source: OWNED,
            start,
            end,
        });
    }

    /// Appends every staged line to `file`, in order; all of them, or an error.
    pub(super) fn write_to(&self, mut file: &File) -> io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> =
            Vec::with_capacity(MAX_SLICES.min(2 * self.pieces.len()));
        for piece in &self.pieces {
            if slices.len() + 2 > MAX_SLICES {
                write_all_slices(&mut file, &mut slices)?;
            }
            let range = piece.start..piece.end;
            if piece.source == OWNED {
                slices.push(IoSlice::new(&self.owned[range]));
            } else {
                slices.push(IoSlice::new(&self.bodies[piece.source][range]));
                slices.push(IoSlice::new(b"\n"));
            }
        }
        write_all_slices(&mut file, &mut slices)
    }
}

/// Writes every slice with as few `writev` calls as the kernel allows, continuing a short
/// write where it stopped; leaves `slices` empty.
fn write_all_slices(out: &mut impl Write, slices: &mut Vec<IoSlice<'_>>) -> io::Result<()> {
    let mut rest: &mut [IoSlice<'_>] = slices;
    IoSlice::advance_slices(&mut rest, 0);
    while !rest.is_empty() {
        match out.write_vectored(rest) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the file took no more bytes",
                ))
            }
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    slices.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// What the old single buffer would have held: the reference the pieces must match.
    fn expected(lines: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for l in lines {
            out.extend_from_slice(l);
        }
        out
    }

    #[test]
    fn lines_are_written_in_order_with_breaks_turned_to_spaces() {
        let a = Bytes::from_static(b"[{\"a\":1},{\"b\":\n2},{\"c\":3}]");
        let b = Bytes::from_static(b"[{\"d\":4}]");
        let mut p = Pending::default();
        p.push_event(&a, 1..8, false);
        p.push_event(&a, 9..17, true);
        p.push_lines(b"{\"record\":1}\n");
        p.push_event(&a, 18..25, false);
        p.push_event(&b, 1..8, false);
        p.push_event(&a, 1..8, false);
        let want = expected(&[
            b"{\"a\":1}\n",
            b"{\"b\": 2}\n",
            b"{\"record\":1}\n",
            b"{\"c\":3}\n",
            b"{\"d\":4}\n",
            b"{\"a\":1}\n",
        ]);
        assert_eq!(p.len(), want.len() as u64);
        // The break-less event bodies are referenced, each run of one body once.
        assert_eq!(p.bodies.len(), 3);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        let f = File::create(&path).unwrap();
        p.write_to(&f).unwrap();
        let mut got = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut got).unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn more_lines_than_one_writev_takes_are_all_written() {
        let body = Bytes::from(
            (0..3000)
                .map(|i| format!("{{\"i\":{i}}}"))
                .collect::<String>(),
        );
        let mut p = Pending::default();
        let mut want = Vec::new();
        let mut at = 0;
        for i in 0..3000 {
            let n = format!("{{\"i\":{i}}}").len();
            p.push_event(&body, at..at + n, false);
            if i % 700 == 0 {
                p.push_lines(b"{\"q\":0}\n");
            }
            want.extend_from_slice(&body[at..at + n]);
            want.push(b'\n');
            if i % 700 == 0 {
                want.extend_from_slice(b"{\"q\":0}\n");
            }
            at += n;
        }
        assert_eq!(p.len(), want.len() as u64);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        p.write_to(&File::create(&path).unwrap()).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), want);
    }

    /// A writer that takes at most `n` bytes per call, as a nearly full disk may.
    struct Short {
        got: Vec<u8>,
        n: usize,
        calls: usize,
    }

    impl Write for Short {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(3) {
                return Err(io::ErrorKind::Interrupted.into());
            }
            let k = buf.len().min(self.n);
            self.got.extend_from_slice(&buf[..k]);
            Ok(k)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn short_and_interrupted_writes_are_continued_where_they_stopped() {
        let parts: Vec<&[u8]> = vec![b"abc", b"\n", b"defgh", b"\n", b"", b"ij\n"];
        let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
        let mut w = Short {
            got: Vec::new(),
            n: 2,
            calls: 0,
        };
        write_all_slices(&mut w, &mut slices).unwrap();
        assert_eq!(w.got, b"abc\ndefgh\nij\n");
        assert!(slices.is_empty());

        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Ok(0)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut slices = vec![IoSlice::new(b"x\n")];
        let err = write_all_slices(&mut Full, &mut slices).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WriteZero);
    }
}
