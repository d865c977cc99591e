//! gzip for uploads: each block of the input becomes one gzip member, compressed whole in
//! memory, and the members are concatenated.
//!
//! A file of several members is one valid gzip file (RFC 1952 §2.2): Go's `gzip.Reader` (the
//! history server's), Python's `gzip` and flate2's `MultiGzDecoder` (ours) read it whole.
//! Compressing whole blocks instead of one stream costs a little ratio (each member starts a
//! new 32 KiB window) and buys speed.
//!
//! The compressor is chosen by [`GzipLevel`] (`--gzip-level`, 1 fastest to 9 smallest, as
//! gzip(1) counts) and by the build. Levels mean the same in every build: the same trade of
//! CPU for size, the same objects for every reader; only the CPU spent at 1 and 2 differs.
//!
//! | level | default build | with the `igzip` feature (the container image) |
//! |---|---|---|
//! | 1 (default) | libdeflate level 1 | ISA-L's igzip level 1 |
//! | 2 | libdeflate level 2 | igzip level 2 |
//! | 3 to 9 | libdeflate at that level | libdeflate at that level |
//!
//! Why (BENCHMARKS.md, "Compressor of the default build", measured on a real Ray session's
//! events from `bench/ray_segment.py` and on the load generator's): at level 1 igzip and
//! libdeflate store the same on Ray's events (ratios 9.93 and 9.86), and igzip takes 15–26 %
//! less of the collector's CPU per event at 25,000 events/s. But igzip is C and
//! assembly that `isal-sys` builds from source with nasm and the autotools, which a plain
//! `cargo build` must not need; libdeflate is C built by `libdeflate-sys` with the C
//! compiler alone. zlib-rs (pure Rust, flate2's backend, which reads our tests' objects) was
//! measured too: at its level 1 it stores a quarter more, at its level 2 it stores what
//! igzip does for more CPU than libdeflate level 1. [`FAST_COMPRESSOR`] names the build's.
//!
//! Memory: one input block, one output bound and the compressor's scratch (igzip's level
//! buffer, [`LEVEL_BUF_BYTES`], or libdeflate's match finder) per upload in flight
//! ([`MEMBER_INPUT`]).

use std::fmt;
use std::io::{self, Read};

#[cfg(feature = "igzip")]
use isal_sys::igzip_lib as igzip;

/// The compressor of `--gzip-level` 1 and 2 in this build: `"igzip"` with the `igzip`
/// cargo feature (the container image), else `"libdeflate"`. Levels 3 to 9 are libdeflate
/// in every build. Logged at startup and exported as `rhc_build_info{compressor}`.
pub const FAST_COMPRESSOR: &str = if cfg!(feature = "igzip") {
    "igzip"
} else {
    "libdeflate"
};

/// The compressor uploads use at `level` in this build: [`FAST_COMPRESSOR`] at 1 and 2,
/// libdeflate above.
pub fn compressor(level: GzipLevel) -> &'static str {
    if level.get() <= 2 {
        FAST_COMPRESSOR
    } else {
        "libdeflate"
    }
}

/// Input bytes per gzip member. 1 MiB keeps the ratio within 1 % of one member per 4 MiB on
/// Ray's events at a quarter of the memory per upload.
pub const MEMBER_INPUT: usize = 1 << 20;

/// Scratch memory igzip level 1 hashes into: its default ("large") size. Larger buffers
/// change the ratio by under 0.1 % on Ray's events (level 2 uses its own default, 324 KiB).
/// (igzip's `ISAL_DEF_LVL1_DEFAULT`, checked against it in builds with igzip.)
pub const LEVEL_BUF_BYTES: usize = 282_624;

#[cfg(feature = "igzip")]
const _: () = assert!(LEVEL_BUF_BYTES == igzip::ISAL_DEF_LVL1_DEFAULT as usize);

/// How hard uploads compress, 1 (fastest, the default) to 9 (smallest), as gzip(1) counts:
/// libdeflate at that level, or igzip at 1 and 2 with the `igzip` feature (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GzipLevel(u8);

impl GzipLevel {
    /// Level 1, the default.
    pub const FASTEST: GzipLevel = GzipLevel(1);
    /// The largest level.
    pub const MAX: u8 = 9;

    /// The level `level`, if it is 1 to 9.
    pub fn new(level: u8) -> Option<GzipLevel> {
        (1..=Self::MAX).contains(&level).then_some(GzipLevel(level))
    }

    /// The level as a number.
    pub fn get(self) -> u8 {
        self.0
    }
}

impl Default for GzipLevel {
    fn default() -> Self {
        GzipLevel::FASTEST
    }
}

impl fmt::Display for GzipLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The largest member igzip can write for `input` bytes: when the deflated data would not be
/// smaller, it stores the input as raw blocks of at most 65,535 bytes, each with a 5-byte
/// header, inside the gzip header and trailer. Given this much room it never overflows.
pub const fn member_bound(input: usize) -> usize {
    const STORED_BLOCK: usize = 65_535;
    const STORED_HEADER: usize = 5;
    const GZIP_WRAPPER: usize = 10 + 8;
    let blocks = if input == 0 {
        1
    } else {
        input.div_ceil(STORED_BLOCK)
    };
    input + blocks * STORED_HEADER + GZIP_WRAPPER
}

/// The scratch memory igzip's level `level` hashes into (its default size), or `None` for a
/// level igzip does not have.
#[cfg(feature = "igzip")]
fn igzip_level_buf(level: u32) -> Option<usize> {
    match level {
        0 => Some(0),
        1 => Some(LEVEL_BUF_BYTES),
        2 => Some(igzip::ISAL_DEF_LVL2_DEFAULT as usize),
        3 => Some(igzip::ISAL_DEF_LVL3_DEFAULT as usize),
        _ => None,
    }
}

/// igzip's stream state, about 80 KiB: boxed, and set up afresh for every member.
#[cfg(feature = "igzip")]
struct Stream(Box<igzip::isal_zstream>);

// SAFETY: between calls the state holds no pointer into our buffers (`compress` clears
// them after each call, and `stateless_init` sets them afresh before the next); the one
// pointer left, `hufftables`, points at igzip's read-only static default table. So the state
// may move to another thread; it is only used through `&mut`, never shared.
#[cfg(feature = "igzip")]
unsafe impl Send for Stream {}

/// The compressor behind an encoder.
enum Engine {
    #[cfg(feature = "igzip")]
    Igzip {
        stream: Stream,
        level: u32,
        /// igzip's scratch for the level (empty for level 0, which needs none).
        level_buf: Vec<u8>,
    },
    Libdeflate(Box<libdeflater::Compressor>),
}

/// Reads an input stream and yields gzip members of [`MEMBER_INPUT`] bytes of it.
pub struct MemberEncoder {
    engine: Engine,
    input: Vec<u8>,
    output: Vec<u8>,
    /// At least one member was produced (an empty input still needs one, empty, member).
    wrote_member: bool,
}

impl MemberEncoder {
    /// A new encoder at `level` (the module doc's table): with the `igzip` feature, igzip
    /// at levels 1 and 2; libdeflate at that level otherwise.
    pub fn new(level: GzipLevel) -> MemberEncoder {
        match level.get() {
            #[cfg(feature = "igzip")]
            n @ (1 | 2) => Self::igzip(u32::from(n)).unwrap_or_else(|| Self::libdeflate(n)),
            n => Self::libdeflate(n),
        }
    }

    /// An igzip encoder at igzip's level `level` (0 to 3) with that level's default scratch
    /// size, for `benches/gzip.rs`; `None` for a level igzip does not have, and in a build
    /// without the `igzip` feature.
    pub fn igzip(level: u32) -> Option<MemberEncoder> {
        #[cfg(feature = "igzip")]
        {
            igzip_level_buf(level).map(|level_buf| Self::igzip_with(level, level_buf))
        }
        #[cfg(not(feature = "igzip"))]
        {
            let _ = level;
            None
        }
    }

    fn libdeflate(level: u8) -> MemberEncoder {
        let lvl = libdeflater::CompressionLvl::new(i32::from(level))
            // 1 to 9 are libdeflate levels (it has 0 to 12).
            .unwrap_or_else(|_| libdeflater::CompressionLvl::default());
        let mut c = Box::new(libdeflater::Compressor::new(lvl));
        let bound = c.gzip_compress_bound(MEMBER_INPUT);
        Self::with_engine(Engine::Libdeflate(c), bound)
    }

    #[cfg(feature = "igzip")]
    fn igzip_with(level: u32, level_buf_bytes: usize) -> MemberEncoder {
        // SAFETY: `isal_zstream` is a C struct of integers, raw pointers and arrays of them,
        // for which all-zero bytes are a valid value; `compress` initializes it with
        // `isal_deflate_stateless_init` before every use.
        let stream = Stream(unsafe { Box::new(std::mem::zeroed()) });
        let engine = Engine::Igzip {
            stream,
            level,
            level_buf: vec![0u8; level_buf_bytes],
        };
        Self::with_engine(engine, member_bound(MEMBER_INPUT))
    }

    fn with_engine(engine: Engine, output_bytes: usize) -> MemberEncoder {
        MemberEncoder {
            engine,
            input: vec![0u8; MEMBER_INPUT],
            output: vec![0u8; output_bytes],
            wrote_member: false,
        }
    }

    /// Reads up to one block from `reader`, passing what was read to `seen`, and appends its
    /// gzip member to `out`. Returns false, having appended nothing, at the end of the input
    /// (unless no member was written yet: an empty input gives one empty member).
    pub fn next_member(
        &mut self,
        reader: &mut impl Read,
        out: &mut Vec<u8>,
        mut seen: impl FnMut(&[u8]),
    ) -> io::Result<bool> {
        // Fill the block: short reads (a pipe, a file still being written) must not make
        // small members. The buffer keeps its length between blocks (no zeroing per block).
        let mut filled = 0;
        while filled < MEMBER_INPUT {
            let n = reader.read(&mut self.input[filled..])?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 && self.wrote_member {
            return Ok(false);
        }
        seen(&self.input[..filled]);
        let n = self.compress(filled)?;
        out.extend_from_slice(&self.output[..n]);
        self.wrote_member = true;
        Ok(filled == MEMBER_INPUT)
    }

    /// Compresses `self.input[..len]` into one gzip member at the start of `self.output`;
    /// returns the member's length.
    fn compress(&mut self, len: usize) -> io::Result<usize> {
        let input = &mut self.input[..len];
        match &mut self.engine {
            Engine::Libdeflate(c) => {
                // The output holds `gzip_compress_bound(MEMBER_INPUT)` bytes: it fits.
                c.gzip_compress(input, &mut self.output).map_err(|e| {
                    io::Error::other(format!("gzip compression failed: libdeflate: {e}"))
                })
            }
            #[cfg(feature = "igzip")]
            Engine::Igzip {
                stream,
                level,
                level_buf,
            } => igzip_member(&mut stream.0, *level, level_buf, input, &mut self.output),
        }
    }
}

/// One gzip member of `input` at the start of `output` by igzip at `level`, in `stream`
/// (set up afresh) with `level_buf` as its scratch; returns the member's length.
#[cfg(feature = "igzip")]
fn igzip_member(
    stream: &mut igzip::isal_zstream,
    level: u32,
    level_buf: &mut [u8],
    input: &mut [u8],
    output: &mut [u8],
) -> io::Result<usize> {
    let (Ok(avail_in), Ok(avail_out), Ok(level_buf_size)) = (
        u32::try_from(input.len()),
        u32::try_from(output.len()),
        u32::try_from(level_buf.len()),
    ) else {
        return Err(io::Error::other("gzip member larger than 4 GiB"));
    };
    // SAFETY: `stream` is a valid, exclusively borrowed `isal_zstream`; init only writes
    // its fields.
    unsafe { igzip::isal_deflate_stateless_init(stream) };
    stream.level = level;
    if !level_buf.is_empty() {
        stream.level_buf = level_buf.as_mut_ptr();
        stream.level_buf_size = level_buf_size;
    }
    stream.gzip_flag = igzip::IGZIP_GZIP as u16;
    stream.end_of_stream = 1;
    stream.flush = igzip::NO_FLUSH as u16;
    stream.next_in = input.as_mut_ptr();
    stream.avail_in = avail_in;
    stream.next_out = output.as_mut_ptr();
    stream.avail_out = avail_out;
    // SAFETY: the pointers set above are valid for the lengths given, for the duration
    // of the call, and do not overlap: `input`, `output` and `level_buf` are distinct
    // buffers borrowed mutably here. igzip reads `next_in` only (the pointer is `*mut` in
    // its C signature), writes within `avail_out` and `level_buf_size`, and keeps no
    // pointer past the call (every call starts with `stateless_init`).
    let code = unsafe { igzip::isal_deflate_stateless(stream) };
    if code != igzip::COMP_OK as i32 {
        // Not expected: the level and its buffer are valid, and `output` holds
        // `member_bound` bytes, which the stored-block fallback never exceeds.
        return Err(io::Error::other(format!(
            "gzip compression failed: igzip returned {code}"
        )));
    }
    let written = stream.total_out as usize;
    // Clear the borrowed pointers: nothing may use them after this call.
    stream.next_in = std::ptr::null_mut();
    stream.next_out = std::ptr::null_mut();
    stream.level_buf = std::ptr::null_mut();
    Ok(written.min(output.len()))
}

impl Default for MemberEncoder {
    fn default() -> Self {
        MemberEncoder::new(GzipLevel::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gunzip(gz: &[u8]) -> Vec<u8> {
        let mut plain = Vec::new();
        flate2::read::MultiGzDecoder::new(gz)
            .read_to_end(&mut plain)
            .unwrap();
        plain
    }

    fn members(data: &[u8]) -> (Vec<u8>, usize) {
        let mut enc = MemberEncoder::default();
        let mut out = Vec::new();
        let mut reader = data;
        let mut seen = 0usize;
        loop {
            let more = enc
                .next_member(&mut reader, &mut out, |b| seen += b.len())
                .unwrap();
            if !more {
                break;
            }
        }
        assert_eq!(seen, data.len());
        (out, seen)
    }

    #[test]
    fn blocks_become_members_that_read_back_whole() {
        let data: Vec<u8> = (0..300_000u32)
            .flat_map(|i| format!("{{\"eventId\":\"{i:08}\",\"n\":{}}}\n", i % 7).into_bytes())
            .collect();
        assert!(data.len() > 3 * MEMBER_INPUT);
        let (gz, _) = members(&data);
        assert_eq!(gunzip(&gz), data);
        // It compresses: these lines are highly repetitive.
        assert!(gz.len() * 4 < data.len(), "{} of {}", gz.len(), data.len());
        // One gzip header per block (magic, deflate, no flags), each readable alone.
        let headers = gz.windows(4).filter(|w| *w == [0x1f, 0x8b, 8, 0]).count();
        assert!(headers >= data.len().div_ceil(MEMBER_INPUT), "{headers}");
        let mut first = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut first)
            .unwrap();
        assert_eq!(first, data[..MEMBER_INPUT]);
    }

    /// Every level writes members that read back whole, across several members of the same
    /// encoder; the libdeflate levels search deeper than igzip's level 1 and store less.
    #[test]
    fn every_level_reads_back_and_libdeflate_levels_store_less() {
        let data: Vec<u8> = (0..120_000u32)
            .flat_map(|i| {
                format!(
                    "{{\"eventId\":\"{:016x}\",\"sourceType\":\"CORE_WORKER\",\"n\":{}}}\n",
                    u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    i % 13
                )
                .into_bytes()
            })
            .collect();
        assert!(data.len() > 2 * MEMBER_INPUT);
        let mut sizes = Vec::new();
        for n in 1..=GzipLevel::MAX {
            let level = GzipLevel::new(n).unwrap();
            let mut enc = MemberEncoder::new(level);
            let mut gz = Vec::new();
            let mut reader = &data[..];
            while enc.next_member(&mut reader, &mut gz, |_| {}).unwrap() {}
            assert_eq!(gunzip(&gz), data, "level {n}");
            let headers = gz.windows(4).filter(|w| *w == [0x1f, 0x8b, 8, 0]).count();
            assert!(headers >= data.len().div_ceil(MEMBER_INPUT), "level {n}");
            sizes.push(gz.len());
        }
        // The level reaches the compressor: libdeflate's 3 and 6 store less than igzip's 1.
        assert!(sizes[2] < sizes[0], "level 3 against 1: {sizes:?}");
        assert!(sizes[5] < sizes[2], "level 6 against 3: {sizes:?}");
    }

    /// Levels 1 and 2 reach the build's compressor, and 3 to 9 libdeflate in every build:
    /// the members are byte for byte what that compressor writes.
    #[test]
    fn each_level_is_the_builds_compressor_at_that_level() {
        let data: Vec<u8> = (0..20_000u32)
            .flat_map(|i| format!("{{\"eventId\":\"{i:08}\",\"n\":{}}}\n", i % 11).into_bytes())
            .collect();
        let libdeflate = |n: i32| {
            let mut c = libdeflater::Compressor::new(libdeflater::CompressionLvl::new(n).unwrap());
            let mut out = vec![0u8; c.gzip_compress_bound(data.len())];
            let len = c.gzip_compress(&data, &mut out).unwrap();
            out.truncate(len);
            out
        };
        assert!(data.len() < MEMBER_INPUT);
        let ours = |mut enc: MemberEncoder| {
            let mut gz = Vec::new();
            let mut reader = &data[..];
            assert!(!enc.next_member(&mut reader, &mut gz, |_| {}).unwrap());
            gz
        };
        for n in 1..=GzipLevel::MAX {
            let level = GzipLevel::new(n).unwrap();
            let expected = match (n, MemberEncoder::igzip(u32::from(n))) {
                (1 | 2, Some(igzip)) => {
                    assert_eq!(FAST_COMPRESSOR, "igzip");
                    ours(igzip)
                }
                _ => libdeflate(i32::from(n)),
            };
            assert_eq!(ours(MemberEncoder::new(level)), expected, "level {n}");
            let name = if n <= 2 {
                FAST_COMPRESSOR
            } else {
                "libdeflate"
            };
            assert_eq!(compressor(level), name, "level {n}");
        }
        assert_eq!(
            FAST_COMPRESSOR == "igzip",
            cfg!(feature = "igzip"),
            "{FAST_COMPRESSOR}"
        );
    }

    #[test]
    fn levels_are_one_to_nine() {
        assert_eq!(GzipLevel::default(), GzipLevel::FASTEST);
        assert_eq!(GzipLevel::FASTEST.get(), 1);
        assert!(GzipLevel::new(0).is_none());
        assert!(GzipLevel::new(10).is_none());
        assert_eq!(GzipLevel::new(9).map(GzipLevel::get), Some(9));
    }

    #[test]
    fn empty_and_exact_block_inputs() {
        let (gz, _) = members(b"");
        assert!(!gz.is_empty());
        assert_eq!(gunzip(&gz), b"");
        let block = vec![b'x'; MEMBER_INPUT];
        let (gz, _) = members(&block);
        assert_eq!(gunzip(&gz), block);
    }

    /// Input that does not compress (random bytes) is stored, within `member_bound`, and
    /// reads back; the encoder is reused across members, as uploads do.
    #[test]
    fn incompressible_input_fits_the_bound_and_reads_back() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let data: Vec<u8> = (0..MEMBER_INPUT * 2 + 12_345)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let (gz, _) = members(&data);
        assert_eq!(gunzip(&gz), data);
        assert!(gz.len() <= 3 * member_bound(MEMBER_INPUT), "{}", gz.len());
        // libdeflate stores it too, within its own bound.
        let mut enc = MemberEncoder::new(GzipLevel::new(6).unwrap());
        let mut gz = Vec::new();
        let mut reader = &data[..];
        while enc.next_member(&mut reader, &mut gz, |_| {}).unwrap() {}
        assert_eq!(gunzip(&gz), data);
        assert_eq!(member_bound(0), 5 + 18);
        assert_eq!(member_bound(65_535), 65_535 + 5 + 18);
        assert_eq!(member_bound(65_536), 65_536 + 10 + 18);
    }
}
