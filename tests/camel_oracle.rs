//! The camelCase converter against protobuf itself, on POST bodies captured from Ray 2.60.
//!
//! `tests/data/posts-snake.camel-expected.jsonl` is protobuf's own camelCase printing of every
//! event in `tests/data/posts-snake.jsonl` (made by `scripts/gen-camel-expected.py` with Ray
//! 2.60's protobuf: `Parse`, then `MessageToDict(always_print_fields_with_no_presence=True)`,
//! the flag Ray prints with). The converter must give the same JSON value for every event,
//! must leave a camelCase capture exactly as it is, and must make the snake_case capture read
//! like the camelCase capture of the same workload.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ray_history_collector::events::camel::{to_camel, Conversion};
use serde_json::value::RawValue;
use serde_json::Value;

fn data(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every event of a capture (one POST body per line), as the exact bytes Ray sent.
fn events(capture: &str) -> Vec<&str> {
    capture
        .lines()
        .filter(|line| !line.trim().is_empty())
        .flat_map(|body| {
            serde_json::from_str::<Vec<&RawValue>>(body)
                .expect("a body is a JSON array")
                .into_iter()
                .map(RawValue::get)
        })
        .collect()
}

fn convert(event: &str) -> (Vec<u8>, Conversion) {
    let mut out = Vec::new();
    let conversion = to_camel(event.as_bytes(), &mut out)
        .unwrap_or_else(|e| panic!("{e}: {}", &event[..event.len().min(200)]));
    (out, conversion)
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("valid JSON")
}

/// Where two JSON values first differ, for a readable failure.
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<_> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(p), Some(q)) => first_difference(p, q, &format!("{path}.{k}")),
                (p, q) => Some(format!("{path}.{k}: {p:?} vs {q:?}")),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, &format!("{path}[{i}]"))),
        _ => (a != b).then(|| format!("{path}: {a} vs {b}")),
    }
}

/// Every key path in a value (`.taskLifecycleEvent.stateTransitions[].state`), map keys included.
fn key_paths(value: &Value, prefix: &str, into: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                let path = format!("{prefix}.{key}");
                key_paths(inner, &path, into);
                into.insert(path);
            }
        }
        Value::Array(items) => {
            for item in items {
                key_paths(item, &format!("{prefix}[]"), into);
            }
        }
        _ => {}
    }
}

#[test]
fn snake_capture_converts_to_protobufs_camel_printing() {
    let snake = data("posts-snake.jsonl");
    let expected = data("posts-snake.camel-expected.jsonl");
    let snake = events(&snake);
    let expected: Vec<&str> = expected.lines().collect();
    assert_eq!(snake.len(), 368);
    assert_eq!(snake.len(), expected.len(), "one expected line per event");
    for (i, (event, want)) in snake.iter().zip(&expected).enumerate() {
        let (out, conversion) = convert(event);
        let (ours, want) = (json(&out), json(want.as_bytes()));
        if let Some(diff) = first_difference(&ours, &want, "") {
            panic!("event {i}: ours vs protobuf differ at {diff}");
        }
        assert_eq!(
            conversion.unknown_fields, 0,
            "event {i}: Ray 2.60 sent no unknown field"
        );
        assert!(conversion.renamed_fields > 0, "event {i}");
        assert!(!out.contains(&b'\n'));
    }
}

#[test]
fn camel_capture_passes_through_byte_for_byte() {
    let camel = data("posts-camel.jsonl");
    let camel = events(&camel);
    assert_eq!(camel.len(), 341);
    for (i, event) in camel.iter().enumerate() {
        let (out, conversion) = convert(event);
        // Ray's bodies have no whitespace between tokens, so nothing at all changes.
        assert_eq!(String::from_utf8_lossy(&out), *event, "event {i} changed");
        assert_eq!(conversion, Conversion::default(), "event {i}");
    }
}

#[test]
fn converting_is_idempotent() {
    let snake = data("posts-snake.jsonl");
    for event in events(&snake) {
        let (once, _) = convert(event);
        let mut twice = Vec::new();
        let conversion = to_camel(&once, &mut twice).expect("converts");
        assert_eq!(once, twice);
        assert_eq!(conversion, Conversion::default());
    }
}

#[test]
fn snake_capture_has_the_camel_captures_key_paths_per_event_type() {
    // The two captures are two runs of the same workload: per event type, the history server
    // must find the same names at the same places (map keys such as resource names included).
    fn by_type(events: impl Iterator<Item = Value>) -> BTreeMap<String, BTreeSet<String>> {
        let mut paths: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for event in events {
            let kind = event["eventType"].as_str().expect("eventType").to_owned();
            key_paths(&event, "", paths.entry(kind).or_default());
        }
        paths
    }
    let snake = data("posts-snake.jsonl");
    let camel = data("posts-camel.jsonl");
    let converted = by_type(events(&snake).into_iter().map(|e| json(&convert(e).0)));
    let captured = by_type(events(&camel).into_iter().map(|e| json(e.as_bytes())));
    assert_eq!(converted.len(), 12, "event types in the capture");
    assert_eq!(
        converted.keys().collect::<Vec<_>>(),
        captured.keys().collect::<Vec<_>>()
    );
    for (kind, paths) in &converted {
        let other = &captured[kind];
        assert_eq!(
            paths.symmetric_difference(other).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "{kind}: key paths only in one capture"
        );
    }
}

#[test]
fn same_task_definition_in_both_captures_converts_to_the_same_json() {
    // Task ids are deterministic, so the 62 tasks of the workload have the same id in both
    // runs, and their definition events the same content, except the function hash (random
    // per run). With the hash masked, the converted snake event's payload must equal the
    // camelCase capture's, as JSON and byte for byte (both are compact, in protobuf's field
    // order).
    fn definitions(events: &[Vec<u8>]) -> BTreeMap<String, (Value, String)> {
        let mut found = BTreeMap::new();
        for event in events {
            let fields: BTreeMap<&str, &RawValue> =
                serde_json::from_slice(event).expect("an object");
            let Some(raw) = fields.get("taskDefinitionEvent") else {
                continue;
            };
            let mut value: Value = serde_json::from_str(raw.get()).expect("payload");
            let hash = value["taskFunc"]["pythonFunctionDescriptor"]["functionHash"].take();
            let mut raw = raw.get().to_owned();
            if let Some(hash) = hash.as_str().filter(|h| !h.is_empty()) {
                raw = raw.replace(hash, "HASH");
            }
            let id = value["taskId"].as_str().expect("taskId").to_owned();
            assert!(
                found.insert(id, (value, raw)).is_none(),
                "one definition per task"
            );
        }
        found
    }
    let snake = data("posts-snake.jsonl");
    let camel = data("posts-camel.jsonl");
    let converted: Vec<Vec<u8>> = events(&snake).into_iter().map(|e| convert(e).0).collect();
    let captured: Vec<Vec<u8>> = events(&camel).into_iter().map(|e| e.into()).collect();
    let converted = definitions(&converted);
    let captured = definitions(&captured);
    let mut compared = 0;
    for (id, (value, raw)) in &converted {
        let Some((other_value, other_raw)) = captured.get(id) else {
            continue;
        };
        if let Some(diff) = first_difference(value, other_value, "") {
            panic!("task {id}: converted vs captured differ at {diff}");
        }
        assert_eq!(raw, other_raw, "task {id}: bytes");
        compared += 1;
    }
    assert_eq!(compared, 62, "tasks found in both captures");
}
