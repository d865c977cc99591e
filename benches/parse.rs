//! How fast a POST body is split into events and its routing fields read: the CPU half of
//! ingest. Run with `cargo bench --bench parse`; compared with serde_json skipping the
//! same body (`IgnoredAny`, which reads no field) and building a `Value` of it.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ray_history_collector::events::parse::for_each_event;

/// One body of about 1,000 events, made of the real Ray 2.60 events in `tests/data`.
fn ray_body(events: usize) -> Vec<u8> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/posts-camel.jsonl");
    let text = std::fs::read(path).expect("fixture");
    let mut elements: Vec<serde_json::Value> = Vec::new();
    for line in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
        let batch: Vec<serde_json::Value> = serde_json::from_slice(line).expect("fixture line");
        elements.extend(batch);
    }
    let mut body = b"[".to_vec();
    for (i, e) in elements.iter().cycle().take(events).enumerate() {
        if i > 0 {
            body.push(b',');
        }
        serde_json::to_writer(&mut body, e).expect("serialize");
    }
    body.push(b']');
    body
}

fn bench_parse(c: &mut Criterion) {
    let body = ray_body(1000);
    let mut g = c.benchmark_group("body_of_1000_ray_events");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_with_input(
        BenchmarkId::new("for_each_event", body.len()),
        &body,
        |b, body| {
            b.iter(|| {
                let mut n = 0usize;
                for_each_event(body, |e| n += e.range.len()).expect("valid body");
                n
            })
        },
    );
    g.bench_with_input(
        BenchmarkId::new("serde_json_ignored_any", body.len()),
        &body,
        |b, body| {
            b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(body).expect("valid body"))
        },
    );
    g.bench_with_input(
        BenchmarkId::new("serde_json_value", body.len()),
        &body,
        |b, body| b.iter(|| serde_json::from_slice::<serde_json::Value>(body).expect("valid body")),
    );
    g.bench_with_input(
        BenchmarkId::new("utf8_validation", body.len()),
        &body,
        |b, body| b.iter(|| std::str::from_utf8(body).is_ok()),
    );
    g.finish();
}

criterion_group!(benches, bench_parse);
criterion_main!(benches);
