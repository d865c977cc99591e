//! How fast a POST body is split into events and its routing fields read: the CPU half of
//! ingest. Run with `cargo bench --bench parse`; compared with serde_json skipping the
//! same body (`IgnoredAny`, which reads no field) and building a `Value` of it. The
//! `snake_case` group adds what a body Ray sent with snake_case keys costs on top: every
//! event renamed to camelCase (`events::camel`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ray_history_collector::events::camel::to_camel;
use ray_history_collector::events::parse::for_each_event;

/// One body of `events` events, made of the real Ray 2.60 events in `tests/data/<capture>`.
fn ray_body(capture: &str, events: usize) -> Vec<u8> {
    let path = format!("{}/tests/data/{capture}", env!("CARGO_MANIFEST_DIR"));
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
    let body = ray_body("posts-camel.jsonl", 1000);
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

fn bench_snake_case(c: &mut Criterion) {
    let body = ray_body("posts-snake.jsonl", 1000);
    let mut g = c.benchmark_group("body_of_1000_snake_case_ray_events");
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
    let mut out = Vec::with_capacity(body.len() * 2);
    g.bench_with_input(
        BenchmarkId::new("for_each_event_and_to_camel", body.len()),
        &body,
        |b, body| {
            b.iter(|| {
                out.clear();
                for_each_event(body, |e| {
                    to_camel(&body[e.range], &mut out).expect("convertible");
                })
                .expect("valid body");
                out.len()
            })
        },
    );
    g.finish();
}

criterion_group!(benches, bench_parse, bench_snake_case);
criterion_main!(benches);
