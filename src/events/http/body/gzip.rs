//! Gzip layers: which a request carries ([`gzip_layers`]: every `Content-Encoding` header,
//! at most [`MAX_GZIP_LAYERS`], anything but gzip and identity refused), and undoing one
//! within its bounds ([`decode_gzip`]): measured first, then decoded into one buffer of
//! exactly its length, at most `--max-gzip-ratio` ([`DEFAULT_MAX_GZIP_RATIO`]) times the
//! bytes received past [`INFLATE_FREE`], in a decoding turn of the budget and off the
//! runtime's workers.

use std::io::Read;

use hyper::header::{HeaderMap, CONTENT_ENCODING};
use tokio::time::Instant;

use super::budget::{BodyBudget, BodyProblem, Room, Turn, SMALL_DECODED};
use super::pace::off_reactor;

/// Most gzip layers undone (`Content-Encoding: gzip, gzip`): more is no client we know.
pub(super) const MAX_GZIP_LAYERS: usize = 2;
/// What gzip decoding reads at a time before taking room for it.
const DECODE_CHUNK: usize = 64 << 10;
/// What any gzip body may decode to, whatever its ratio: a small batch of Ray's may
/// compress better than its large ones do.
pub(super) const INFLATE_FREE: u64 = 1 << 20;
/// The default of `--max-gzip-ratio`: past [`INFLATE_FREE`], a gzip body may decode to at
/// most this many times the bytes received. Ray's batches are JSON, which gzip shrinks 4 to
/// 10 times (the captured posts of Ray 2.60 in tests/data: 3.8 times the median, 10.2 at
/// most, at level 9): a hundred leaves them ten times that, while a body that a client sends
/// cheaply and the collector decodes dearly (50 KB of gzip decoding to 49 MiB of zeros,
/// review r39k D1) is refused with 413 after a hundred times its size.
pub const DEFAULT_MAX_GZIP_RATIO: u64 = 100;

/// The gzip layers of a request, from all its `Content-Encoding` headers; the coding that is
/// not supported, or why the headers cannot be used, as the error.
pub(in crate::events::http) fn gzip_layers(headers: &HeaderMap) -> Result<usize, String> {
    let mut layers = 0;
    for value in headers.get_all(CONTENT_ENCODING) {
        let text = value
            .to_str()
            .map_err(|_| "a Content-Encoding header that is not ASCII text".to_string())?;
        for coding in text.split(',') {
            match coding.trim().to_ascii_lowercase().as_str() {
                "" | "identity" => {}
                "gzip" | "x-gzip" => layers += 1,
                other => {
                    return Err(format!(
                        "Content-Encoding {other:?} is not supported (use gzip or identity)"
                    ))
                }
            }
        }
    }
    if layers > MAX_GZIP_LAYERS {
        return Err(format!(
            "{layers} gzip layers in Content-Encoding; at most {MAX_GZIP_LAYERS} are undone"
        ));
    }
    Ok(layers)
}

/// How far a body's gzip layers may decode: to `most` bytes each, set by the ratio bound
/// (`by_ratio`) or by `--max-body-bytes`.
#[derive(Clone, Copy)]
pub(super) struct Inflate {
    most: usize,
    by_ratio: bool,
    received: u64,
}

impl Inflate {
    pub(super) fn new(max: usize, ratio: u64, received: u64) -> Inflate {
        let by_ratio = match ratio {
            0 => usize::MAX,
            r => {
                usize::try_from(received.saturating_mul(r).max(INFLATE_FREE)).unwrap_or(usize::MAX)
            }
        };
        Inflate {
            most: max.min(by_ratio),
            by_ratio: by_ratio < max,
            received,
        }
    }

    /// Why a layer that decodes past `most` is refused.
    fn problem<'a>(self) -> BodyProblem<'a> {
        if self.by_ratio {
            BodyProblem::Inflates {
                received: self.received,
                bound: self.most as u64,
            }
        } else {
            BodyProblem::TooLarge
        }
    }
}

/// One gzip layer of `raw` (charged to `room` already), decoded twice: once to learn its
/// length, keeping nothing, then, its room taken, into one buffer of exactly that length.
/// So the room holds the raw and decoded bytes together, and the decoded body is one
/// allocation made once: a buffer grown by doubling, as it was, was copied at each step and
/// left its earlier forms in the allocator (glibc keeps freed chunks resident), and 16
/// clients looping gzip bombs of 24 MiB took VmHWM to 302–343 MiB with a 96 MiB budget
/// (review r39h D3). The second pass costs CPU only (gzip decodes at hundreds of MB/s).
///
/// Both passes are made in one turn ([`BodyBudget::decode_turn`]), kept while the body waits
/// for room for its decoded form: a body waits for a turn once, not once per pass behind
/// every body that came meanwhile (review r39m D1). A `small` body ([`SMALL_GZIP_BODY`](super::budget::SMALL_GZIP_BODY))
/// may take a turn of its own lane, in which the layer may decode to [`SMALL_DECODED`]; one
/// that decodes to more gives it back and takes a turn any body may take (a second wait,
/// only for a body that is not small once decoded). The first pass stops as soon as the
/// layer passes `inflate`'s bound, so a bomb costs at most that much decoding.
/// The decoder's error when `raw` is not valid gzip.
pub(super) async fn decode_gzip<'a>(
    raw: &[u8],
    room: &mut Room<'a>,
    inflate: Inflate,
    small: bool,
    deadline: Instant,
) -> Result<Result<Vec<u8>, String>, BodyProblem<'a>> {
    let budget: &'a BodyBudget = room.budget;
    let pace = room.holder.pace.clone();
    let mut chunk = vec![0u8; DECODE_CHUNK];
    let most = |turn: &Turn| {
        if turn.small {
            inflate.most.min(SMALL_DECODED as usize)
        } else {
            inflate.most
        }
    };
    let mut turn = budget.decode_turn(&pace, small, deadline).await?;
    let mut len = off_reactor(|| decoded_len(raw, &mut chunk, most(&turn)));
    if turn.small && matches!(len, Ok(None)) && inflate.most > SMALL_DECODED as usize {
        // Not small once decoded: a turn any body may take, the small one given back first.
        drop(turn);
        turn = budget.decode_turn(&pace, false, deadline).await?;
        len = off_reactor(|| decoded_len(raw, &mut chunk, inflate.most));
    }
    let len = match len {
        Ok(Some(len)) => len,
        Ok(None) => return Err(inflate.problem()),
        Err(e) => return Ok(Err(e.to_string())),
    };
    // Waiting for room is waiting for the collector, as waiting for a turn is; the turn is
    // kept meanwhile (a body waiting for room gives way as [`Room::grow_to`] says).
    pace.set_queued(true);
    // Beside what its input holds (the received buffer's capacity, or the layer before).
    let grown = room
        .grow_to(room.held_bytes().saturating_add(len as u64), deadline)
        .await;
    pace.set_queued(false);
    grown?;
    let mut out: Vec<u8> = Vec::new();
    out.reserve_exact(len);
    let decoded = off_reactor(|| -> std::io::Result<()> {
        let mut dec = flate2::read::MultiGzDecoder::new(raw);
        loop {
            let n = dec.read(&mut chunk)?;
            if n == 0 {
                return Ok(());
            }
            if out.len() + n > len {
                return Err(std::io::Error::other(
                    "the body decoded to more bytes the second time",
                ));
            }
            out.extend_from_slice(&chunk[..n]);
        }
    });
    drop(turn);
    match decoded {
        Ok(()) => Ok(Ok(out)),
        Err(e) => Ok(Err(e.to_string())),
    }
}

/// The length `raw` decodes to, read through `chunk` and kept nowhere; `None` once it is
/// over `max`.
fn decoded_len(raw: &[u8], chunk: &mut [u8], max: usize) -> std::io::Result<Option<usize>> {
    let mut dec = flate2::read::MultiGzDecoder::new(raw);
    let mut len = 0usize;
    loop {
        match dec.read(chunk)? {
            0 => return Ok(Some(len)),
            n => len = len.saturating_add(n),
        }
        if len > max {
            return Ok(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(CONTENT_ENCODING, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn every_content_encoding_header_and_list_is_read() {
        assert_eq!(gzip_layers(&headers(&[])), Ok(0));
        assert_eq!(gzip_layers(&headers(&["identity"])), Ok(0));
        assert_eq!(gzip_layers(&headers(&["GZIP"])), Ok(1));
        assert_eq!(gzip_layers(&headers(&["identity, gzip"])), Ok(1));
        assert_eq!(gzip_layers(&headers(&["gzip", "x-gzip"])), Ok(2));
        assert!(gzip_layers(&headers(&["gzip", "br"]))
            .unwrap_err()
            .contains("\"br\""));
        assert!(gzip_layers(&headers(&["identity, deflate"]))
            .unwrap_err()
            .contains("\"deflate\""));
        assert!(gzip_layers(&headers(&["gzip, gzip, gzip"])).is_err());
    }
}
