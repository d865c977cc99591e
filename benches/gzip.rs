//! What compressing a sealed segment costs at each `--gzip-level` (`storage::gzip`), and the
//! candidates for the fast levels side by side, each in 1 MiB members: zlib-rs (flate2's
//! backend) at levels 1 and 2, libdeflate at level 1, and igzip at its levels 0 to 3 (with
//! `--features igzip`); plus zlib-rs' single stream at level 3 (what uploads used before
//! all of them). Run with `cargo bench --bench gzip` (and `--features igzip`); it prints
//! each variant's compression ratio once, beside criterion's throughput (`cargo bench
//! --bench gzip -- none` prints the ratios only; `-- candidates` times the fast-level
//! candidates only).
//!
//! The input is 8 MiB of JSON lines made of the real Ray 2.60 events in
//! `tests/data/posts-camel.jsonl`, each with a fresh event id and timestamp, as a segment
//! holds them; or, with `RHC_GZIP_INPUT=<file>[:<file>...]`, those files one after the
//! other (a segment of real Ray events from `bench/ray_segment.py`, say).

use std::io::{Read, Write};

use base64::Engine as _;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ray_history_collector::storage::gzip::{GzipLevel, MemberEncoder, MEMBER_INPUT};

const SEGMENT_BYTES: usize = 8 << 20;

fn segment() -> Vec<u8> {
    if let Some(paths) = std::env::var_os("RHC_GZIP_INPUT").filter(|p| !p.is_empty()) {
        let mut out = Vec::new();
        for path in std::env::split_paths(&paths) {
            out.extend(std::fs::read(&path).expect("RHC_GZIP_INPUT names readable files"));
        }
        return out;
    }
    let path = format!(
        "{}/tests/data/posts-camel.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read(path).expect("fixture");
    let mut events: Vec<serde_json::Value> = Vec::new();
    for line in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
        let batch: Vec<serde_json::Value> = serde_json::from_slice(line).expect("fixture line");
        events.extend(batch);
    }
    let mut out = Vec::with_capacity(SEGMENT_BYTES + 4096);
    let mut i: u64 = 0;
    while out.len() < SEGMENT_BYTES {
        let mut e = events[i as usize % events.len()].clone();
        // A pseudo-random 16-byte id, as Ray's are.
        let mut id = [0u8; 16];
        let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xdead_beef;
        for b in id.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        e["eventId"] = base64::engine::general_purpose::STANDARD.encode(id).into();
        e["timestamp"] = format!(
            "2026-11-22T02:{:02}:{:02}.{:09}Z",
            (i / 60_000) % 60,
            (i / 1000) % 60,
            (i * 997_001) % 1_000_000_000
        )
        .into();
        serde_json::to_writer(&mut out, &e).expect("serialize");
        out.push(b'\n');
        i += 1;
    }
    out
}

fn zlib_stream(data: &[u8], level: u32) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
    for chunk in data.chunks(256 * 1024) {
        enc.write_all(chunk).expect("in memory");
    }
    enc.finish().expect("in memory")
}

/// zlib-rs (flate2's backend) at `level`, one gzip member per 1 MiB of input, as
/// `storage::gzip` cuts them: one raw deflate state, reset for each member, with the gzip
/// header and trailer around it.
fn zlib_members(data: &[u8], level: u32) -> Vec<u8> {
    const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];
    let mut c = flate2::Compress::new(flate2::Compression::new(level), false);
    let mut out = Vec::new();
    for block in data.chunks(MEMBER_INPUT) {
        c.reset();
        out.extend_from_slice(&HEADER);
        let mut consumed = 0;
        loop {
            out.reserve(block.len() - consumed + 1024);
            let before = c.total_in();
            let status = c
                .compress_vec(&block[consumed..], &mut out, flate2::FlushCompress::Finish)
                .expect("in memory");
            consumed += (c.total_in() - before) as usize;
            if status == flate2::Status::StreamEnd {
                break;
            }
        }
        let mut crc = flate2::Crc::new();
        crc.update(block);
        out.extend_from_slice(&crc.sum().to_le_bytes());
        out.extend_from_slice(&(block.len() as u32).to_le_bytes());
    }
    out
}

/// libdeflate at `level`, one gzip member per 1 MiB of input.
fn libdeflate_members(data: &[u8], level: i32) -> Vec<u8> {
    let lvl = libdeflater::CompressionLvl::new(level).expect("libdeflate level");
    let mut c = libdeflater::Compressor::new(lvl);
    let mut buf = vec![0u8; c.gzip_compress_bound(MEMBER_INPUT)];
    let mut out = Vec::new();
    for block in data.chunks(MEMBER_INPUT) {
        let n = c.gzip_compress(block, &mut buf).expect("fits its bound");
        out.extend_from_slice(&buf[..n]);
    }
    out
}

fn members(data: &[u8], mut enc: MemberEncoder) -> Vec<u8> {
    let mut out = Vec::new();
    let mut reader = data;
    while enc
        .next_member(&mut reader, &mut out, |_| {})
        .expect("in memory")
    {}
    out
}

fn level(n: u8) -> MemberEncoder {
    MemberEncoder::new(GzipLevel::new(n).expect("1 to 9"))
}

/// igzip at its level `n`, or `None` in a build without the `igzip` feature.
fn igzip(n: u32) -> Option<MemberEncoder> {
    MemberEncoder::igzip(n)
}

fn check(name: &str, data: &[u8], gz: &[u8]) {
    let mut plain = Vec::new();
    flate2::read::MultiGzDecoder::new(gz)
        .read_to_end(&mut plain)
        .expect("gunzip");
    assert_eq!(plain, data, "{name}");
    eprintln!(
        "{name}: {} -> {} bytes, ratio {:.2}",
        data.len(),
        gz.len(),
        data.len() as f64 / gz.len() as f64
    );
}

fn bench_gzip(c: &mut Criterion) {
    let data = segment();
    check("zlib-rs level 3 stream", &data, &zlib_stream(&data, 3));
    for n in [1, 2] {
        check(
            &format!("candidate zlib-rs level {n}, 1 MiB members"),
            &data,
            &zlib_members(&data, n),
        );
    }
    check(
        "candidate libdeflate level 1, 1 MiB members",
        &data,
        &libdeflate_members(&data, 1),
    );
    for n in [0, 1, 2, 3] {
        if let Some(enc) = igzip(n) {
            check(
                &format!("candidate igzip level {n}, 1 MiB members"),
                &data,
                &members(&data, enc),
            );
        }
    }
    for n in [1, 2, 3, 4, 6, 9] {
        check(
            &format!("--gzip-level {n} (1 MiB members)"),
            &data,
            &members(&data, level(n)),
        );
    }
    let mut g = c.benchmark_group("candidates");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.sample_size(10);
    for n in [1, 2] {
        g.bench_with_input(BenchmarkId::new("zlib_rs_members", n), &data, |b, d| {
            b.iter(|| zlib_members(d, n).len())
        });
    }
    g.bench_with_input(BenchmarkId::new("libdeflate_members", 1), &data, |b, d| {
        b.iter(|| libdeflate_members(d, 1).len())
    });
    for n in [1, 2] {
        if igzip(n).is_some() {
            g.bench_with_input(BenchmarkId::new("igzip_members", n), &data, |b, d| {
                b.iter(|| igzip(n).map(|e| members(d, e).len()))
            });
        }
    }
    g.finish();
    let mut g = c.benchmark_group("gzip_8MiB_of_ray_events");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.sample_size(10);
    g.bench_with_input(BenchmarkId::new("zlib_rs_stream", 3), &data, |b, d| {
        b.iter(|| zlib_stream(d, 3).len())
    });
    for n in [1, 2, 3, 6, 9] {
        g.bench_with_input(BenchmarkId::new("gzip_level", n), &data, |b, d| {
            b.iter(|| members(d, level(n)).len())
        });
    }
    g.finish();
}

criterion_group!(benches, bench_gzip);
criterion_main!(benches);
