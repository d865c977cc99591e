//! What compressing a sealed segment costs at each `--gzip-level` (`storage::gzip`: igzip
//! for 1, libdeflate for 2 to 9), at igzip's other levels, and for zlib-rs' single stream
//! at level 3 (what uploads used before both). Run with `cargo bench --bench gzip`; it
//! prints each variant's compression ratio once, beside criterion's throughput
//! (`cargo bench --bench gzip -- none` prints the ratios only).
//!
//! The input is 8 MiB of JSON lines made of the real Ray 2.60 events in
//! `tests/data/posts-camel.jsonl`, each with a fresh event id and timestamp, as a segment
//! holds them; or, with `RHC_GZIP_INPUT=<file>[:<file>...]`, those files one after the
//! other (a segment of real Ray events from `bench/ray_segment.py`, say).

use std::io::{Read, Write};

use base64::Engine as _;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ray_history_collector::storage::gzip::{GzipLevel, MemberEncoder};

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

fn igzip(n: u32) -> MemberEncoder {
    MemberEncoder::igzip(n).expect("igzip level")
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
    for n in [0, 2, 3] {
        check(
            &format!("igzip level {n}, 1 MiB members"),
            &data,
            &members(&data, igzip(n)),
        );
    }
    for n in [1, 2, 3, 4, 6, 9] {
        check(
            &format!("--gzip-level {n} (1 MiB members)"),
            &data,
            &members(&data, level(n)),
        );
    }
    let mut g = c.benchmark_group("gzip_8MiB_of_ray_events");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.sample_size(10);
    g.bench_with_input(BenchmarkId::new("zlib_rs_stream", 3), &data, |b, d| {
        b.iter(|| zlib_stream(d, 3).len())
    });
    g.bench_with_input(BenchmarkId::new("igzip_members", 0), &data, |b, d| {
        b.iter(|| members(d, igzip(0)).len())
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
