//! `/api/cluster_status` and `?format=1` of `ray-history-collector serve` through the real
//! binary, on `file://` buckets made by hand: a dead session whose nodes left their
//! `logs/debug_state.txt` (one captured from a real Ray 2.60 head, others in its format, two
//! hostile, one missing) and events (a node that failed, pending tasks and an actor). The
//! expected text is literal, its numbers computed with Ray 2.60's own `parse_usage` from the
//! same files; the answers for the real head alone are checked against what Ray 2.60's live
//! dashboard answered for it (tests/data/cluster_status/, captured from `ray start --head`).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use rhc_testkit::http::HttpResponse;
use rhc_testkit::serve::Serve;

const SESSION: &str = "session_2026-12-02_17-22-09_535466_21400";
const HEAD: &str = "04226509752c2e1bd07ed9719e74e0bf3d1e0855158394d92c98c263";
const BUSY: &str = include_str!("data/cluster_status/ray-2.60-busy-debug_state.txt");
const IDLE: &str = include_str!("data/cluster_status/ray-2.60-idle-debug_state.txt");
const BUSY_LIVE: &str =
    include_str!("data/cluster_status/ray-2.60-busy-cluster_status-format1.json");
const BUSY_LIVE_PLAIN: &str = include_str!("data/cluster_status/ray-2.60-busy-cluster_status.json");
const IDLE_LIVE: &str =
    include_str!("data/cluster_status/ray-2.60-idle-cluster_status-format1.json");
const UNREADABLE: &str = "x-rhc-unreadable-objects";

fn node(c: char) -> String {
    std::iter::repeat_n(c, 56).collect()
}

fn b64_of_hex(hex: &str) -> String {
    use base64::Engine as _;
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn body(r: &HttpResponse) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

fn json_of(r: &HttpResponse) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", body(r)))
}

fn cookies_for(session: &str) -> Vec<(String, String)> {
    [
        ("cluster_name", "c1"),
        ("cluster_namespace", "default"),
        ("session_name", session),
        ("owner_kind", ""),
        ("owner_name", ""),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// `GET path` until the session has loaded (at most 60 s of `503`s); it must answer 200.
fn get_loaded(s: &Serve, path: &str, session: &str) -> HttpResponse {
    let started = std::time::Instant::now();
    loop {
        let r = s
            .get(path, &cookies_for(session))
            .unwrap_or_else(|e| panic!("GET {path}: {e}\n{}", s.log_text()));
        if r.status != 503 || started.elapsed() > Duration::from_secs(60) {
            assert_eq!(r.status, 200, "GET {path}: {}\n{}", body(&r), s.log_text());
            return r;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Cluster `c1`'s session `session` in the `file://` bucket at `dir`: its marker, `events`
/// (one object under the head's `node_events/`) and each node's `debug_state.txt`.
fn session(dir: &Path, session: &str, events: &[Value], debug_states: &[(&str, &[u8])]) {
    let marker = dir.join("cluster-metadata/raycluster/default_c1");
    std::fs::create_dir_all(&marker).unwrap();
    std::fs::write(marker.join(session), b"").unwrap();
    let history = dir
        .join("cluster-history/raycluster/default/c1")
        .join(session);
    let ev = history.join(HEAD).join("node_events");
    std::fs::create_dir_all(&ev).unwrap();
    let text: String = events.iter().map(|e| format!("{e}\n")).collect();
    std::fs::write(ev.join(format!("{HEAD}-2026-12-02-17-1.jsonl")), text).unwrap();
    for (node, bytes) in debug_states {
        let logs = history.join(node).join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        std::fs::write(logs.join("debug_state.txt"), bytes).unwrap();
    }
}

fn event(session: &str, kind: &str, member: &str, payload: Value) -> Value {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    json!({"eventId": format!("e{n}"), "eventType": kind, "timestamp": "2026-12-02T17:22:10Z",
        "sessionName": session, member: payload})
}

fn node_events(session: &str, id: &str, ip: &str, transitions: Value) -> [Value; 2] {
    [
        event(
            session,
            "NODE_DEFINITION_EVENT",
            "nodeDefinitionEvent",
            json!({"nodeId": b64_of_hex(id), "nodeIpAddress": ip, "hostname": "h",
                "startTimestamp": "2026-12-02T17:22:10Z"}),
        ),
        event(
            session,
            "NODE_LIFECYCLE_EVENT",
            "nodeLifecycleEvent",
            json!({"nodeId": b64_of_hex(id), "stateTransitions": transitions}),
        ),
    ]
}

fn task_events(session: &str, i: u8, state: &str, at: &str) -> [Value; 2] {
    use base64::Engine as _;
    let mut id = vec![0, 0, 0, i, 0, 0, 0, 0];
    id.extend([0xff; 12]);
    id.extend([1, 0, 0, 0]);
    let id = base64::engine::general_purpose::STANDARD.encode(id);
    [
        event(
            session,
            "TASK_DEFINITION_EVENT",
            "taskDefinitionEvent",
            json!({"taskId": id, "taskAttempt": 0, "jobId": "AQAAAA==",
                "taskType": "NORMAL_TASK", "taskName": format!("t{i}"),
                "requiredResources": {"CPU": 1.0, "GPU": 1.0}}),
        ),
        event(
            session,
            "TASK_LIFECYCLE_EVENT",
            "taskLifecycleEvent",
            json!({"taskId": id, "taskAttempt": 0, "jobId": "AQAAAA==",
                "stateTransitions": [{"state": state, "timestamp": at}]}),
        ),
    ]
}

/// A worker's `debug_state.txt` in Ray 2.60's format (as the captured head's, with a
/// KubeRay node-group label): `total` and `available` are its own line's.
fn worker_state(id: &str, ip: &str, total: &str, available: &str, idle: bool) -> Vec<u8> {
    format!(
        "NodeManager:\nNode ID: {id}\nNode name: {ip}\nClusterLeaseManager:\n\
         ========== Node: {id} =================\nInfeasible queue length: 0\n\
         cluster_resource_scheduler state: \n\
         Local id: 77 Local resources: {{\"total\":{{{total}}}, \"available\": {{{available}}}, \
         \"labels\":{{\"ray.io/node-group\":\"worker-group\",\"ray.io/node-id\":\"{id}\"}}}} \
         is_draining: 0 is_idle: {} Cluster resources (at most 20 nodes are shown): node id: \
         77{{\"total\":{{CPU: 990000}}, \"available\": {{CPU: 990000}}}}\nWaiting leases size: 0\n",
        u8::from(idle)
    )
    .into_bytes()
}

/// The lines of section `title` of `text`: those after it that start with a space.
fn section<'a>(text: &'a str, title: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| *l != title)
        .skip(1)
        .take_while(|l| l.starts_with(' '))
        .collect()
}

#[test]
fn rebuilds_a_dead_clusters_status_from_its_nodes_debug_states() {
    let (w1, w2, w3, w4, w5) = (node('a'), node('b'), node('c'), node('d'), node('e'));
    let mut events = Vec::new();
    events.extend(node_events(
        SESSION,
        HEAD,
        "192.0.2.2",
        json!([{"state": "ALIVE", "timestamp": "2026-12-02T17:22:10Z"}]),
    ));
    events.extend(node_events(
        SESSION,
        &w1,
        "10.0.0.5",
        json!([{"state": "ALIVE", "timestamp": "2026-12-02T17:22:20Z"}]),
    ));
    // w2 failed: a recent failure, not counted among the nodes or their resources.
    events.extend(node_events(
        SESSION,
        &w2,
        "10.0.0.6",
        json!([{"state": "ALIVE", "timestamp": "2026-12-02T17:22:20Z"},
            {"state": "DEAD", "timestamp": "2026-12-02T17:23:00Z",
             "deathInfo": {"reason": "UNEXPECTED_TERMINATION", "reasonMessage": "OOM"}}]),
    ));
    // w4 was scaled down (no failure) and left no debug state.
    events.extend(node_events(
        SESSION,
        &w4,
        "10.0.0.8",
        json!([{"state": "ALIVE", "timestamp": "2026-12-02T17:22:20Z"},
            {"state": "DEAD", "timestamp": "2026-12-02T17:23:30Z",
             "deathInfo": {"reason": "AUTOSCALER_DRAIN_IDLE"}}]),
    ));
    events.extend(task_events(
        SESSION,
        1,
        "FINISHED",
        "2026-12-02T17:24:35.514754Z",
    ));
    events.extend(task_events(
        SESSION,
        2,
        "PENDING_NODE_ASSIGNMENT",
        "2026-12-02T17:24:00Z",
    ));
    events.extend(task_events(
        SESSION,
        3,
        "PENDING_NODE_ASSIGNMENT",
        "2026-12-02T17:24:00Z",
    ));
    events.push(event(
        SESSION,
        "ACTOR_DEFINITION_EVENT",
        "actorDefinitionEvent",
        json!({"actorId": "7YtY6SVWBVhbQdSQAQAAAA==", "jobId": "AQAAAA==", "className": "A"}),
    ));
    events.push(event(
        SESSION,
        "ACTOR_LIFECYCLE_EVENT",
        "actorLifecycleEvent",
        json!({"actorId": "7YtY6SVWBVhbQdSQAQAAAA==", "stateTransitions":
            [{"state": "PENDING_CREATION", "timestamp": "2026-12-02T17:24:01Z"}]}),
    ));
    let worker = worker_state(
        &w1,
        "10.0.0.5",
        "CPU: [10000, 10000, 10000, 10000], GPU: [10000, 10000], memory: [85899345920000], \
         node:10.0.0.5: [10000], accelerator_type:A100: [10000]",
        "CPU: [10000, 10000, 10000, 10000], GPU: [10000, 10000], memory: [85899345920000], \
         node:10.0.0.5: [10000], accelerator_type:A100: [10000]",
        true,
    );
    let failed = worker_state(
        &w2,
        "10.0.0.6",
        "CPU: [80000], TPU: [40000]",
        "CPU: [0]",
        false,
    );
    // Hostile: a line that never ends, three times what is read; and no debug state at all.
    let mut endless = b"cluster_resource_scheduler state:\nLocal resources: {\"total\":{".to_vec();
    while endless.len() < 3 << 20 {
        endless.extend_from_slice(b"x: [1], ");
    }
    let garbage: Vec<u8> = (0..70_000u32).map(|i| (i * 7919 % 251) as u8).collect();
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    session(
        &bucket,
        SESSION,
        &events,
        &[
            (HEAD, BUSY.as_bytes()),
            (&w1, &worker),
            (&w2, &failed),
            (&w3, &endless),
            (&w5, &garbage),
        ],
    );
    let s = Serve::start(
        &format!("file://{}", bucket.display()),
        &work.path().join("serve.log"),
        &[],
        &[],
    );

    let r = get_loaded(&s, "/api/cluster_status?format=1", SESSION);
    assert_eq!(r.header(UNREADABLE), Some("2"), "{:?}", r.headers);
    let v = json_of(&r);
    assert_eq!(v["result"], true);
    assert_eq!(v["msg"], "Got formatted cluster status.");
    let header = "======== Autoscaler status: 2026-12-02 17:24:35.514754 ========";
    let separator = "-".repeat(header.len());
    let expected = format!(
        "{header}\nNode status\n{separator}\nActive:\n 1 node_{HEAD}\nIdle:\n 1 worker-group\n\
         Pending:\n (unavailable in history server)\nRecent failures:\n \
         worker-group: NodeTerminated (ip: 10.0.0.6)\n\nResources\n{separator}\nTotal Usage:\n \
         1.25/6.0 CPU (0.25 used of 0.5 reserved in placement groups)\n 0.0/2.0 GPU\n \
         2.0/3.0 custom_a\n 1.00GiB/24.16GiB memory\n 0B/6.93GiB object_store_memory\n\n\
         From request_resources:\n (unavailable in history server)\nPending Demands:\n \
         3+ pending tasks/actors (their resource shapes are unavailable in history server)"
    );
    assert_eq!(v["data"]["clusterStatus"], expected.as_str());
    let reads = &v["data"]["debugStates"];
    assert_eq!(reads["read"], 3, "{reads}");
    assert_eq!(reads["missing"], json!([w4]), "{reads}");
    assert_eq!(reads["unreadableTotal"], 2, "{reads}");
    let unreadable: Vec<&str> = reads["unreadable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["nodeId"].as_str().unwrap())
        .collect();
    assert_eq!(unreadable, [w3.as_str(), w5.as_str()], "{reads}");
    assert_eq!(reads["notRead"], 0);

    // The plain form: Ray's live shape, with what the bucket tells.
    let r = get_loaded(&s, "/api/cluster_status", SESSION);
    assert_eq!(r.header(UNREADABLE), Some("2"));
    let v = json_of(&r);
    assert_eq!(v["msg"], "Got cluster status.");
    let data = &v["data"];
    assert_eq!(data["autoscalingStatus"], Value::Null);
    assert_eq!(data["autoscalingError"], Value::Null);
    let status = &data["clusterStatus"];
    let report = &status["autoscalerReport"];
    // Ray's dashboard camel-cases every key: `node_04226509752c…` → `node04226509752C…`.
    assert_eq!(
        report["activeNodes"],
        json!({"node04226509752C2E1Bd07Ed9719E74E0Bf3D1E0855158394D92C98C263": 1})
    );
    assert_eq!(report["idleNodes"], json!({"worker-group": 1}));
    assert_eq!(report["failedNodes"], json!([["10.0.0.6", "worker-group"]]));
    let usage = &status["loadMetricsReport"]["usage"];
    assert_eq!(usage["CPU"], json!([1.5, 6.0]));
    assert_eq!(usage["GPU"], json!([0.0, 2.0]));
    assert_eq!(usage["customA"], json!([2.0, 3.0]));
    assert_eq!(usage["memory"], json!([1073741824.0, 25944832410.0]));
    assert_eq!(
        usage.get("TPU"),
        None,
        "the failed node's resources are not counted"
    );
    let by_node = status["loadMetricsReport"]["usageByNode"]
        .as_object()
        .unwrap();
    assert_eq!(
        by_node.keys().collect::<Vec<_>>(),
        [HEAD, w1.as_str()],
        "{by_node:?}"
    );
    assert_eq!(status["time"], json!(1_796_232_275.514_754));
}

/// Ray 2.60's live `/api/cluster_status?format=1` for the `clusterStatus` of a
/// `tests/data/cluster_status/` capture.
fn live_text(capture: &str) -> String {
    let v: Value = serde_json::from_str(capture).unwrap();
    v["data"]["clusterStatus"].as_str().unwrap().to_string()
}

#[test]
fn answers_for_a_real_ray_head_as_its_live_dashboard_did() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    let (busy, idle, bare) = (
        "session_2026-12-02_17-22-09_535466_1",
        "session_2026-12-02_17-22-09_535466_2",
        "session_2026-12-02_17-22-09_535466_3",
    );
    let head = |s: &str| {
        node_events(
            s,
            HEAD,
            "192.0.2.2",
            json!([{"state": "ALIVE", "timestamp": "2026-12-02T17:22:10Z"}]),
        )
        .to_vec()
    };
    session(&bucket, busy, &head(busy), &[(HEAD, BUSY.as_bytes())]);
    session(&bucket, idle, &head(idle), &[(HEAD, IDLE.as_bytes())]);
    // No event and no debug state: the session name's time, and nothing to count.
    session(&bucket, bare, &[], &[]);
    let s = Serve::start(
        &format!("file://{}", bucket.display()),
        &work.path().join("serve.log"),
        &[],
        &[],
    );

    // The same node's resources as Ray's live dashboard showed them, line for line.
    for (name, live) in [(busy, BUSY_LIVE), (idle, IDLE_LIVE)] {
        let r = get_loaded(&s, "/api/cluster_status?format=1", name);
        assert_eq!(r.header(UNREADABLE), None);
        let ours = json_of(&r)["data"]["clusterStatus"]
            .as_str()
            .unwrap()
            .to_string();
        let live = live_text(live);
        assert!(ours.starts_with("======== Autoscaler status: 2026-12-02 17:22:10 ========\n"));
        assert!(!section(&live, "Total Usage:").is_empty());
        assert_eq!(
            section(&ours, "Total Usage:"),
            section(&live, "Total Usage:"),
            "{name}:\n{ours}\n--- Ray's:\n{live}"
        );
        // Ray's local autoscaler (v1) lists an idle node as active; ours says it is idle,
        // as Ray's autoscaler v2 (and KubeRay's server) do.
        let (mine, other) = if name == busy {
            ("Active:", "Idle:")
        } else {
            ("Idle:", "Active:")
        };
        assert_eq!(
            section(&ours, mine),
            section(&live, "Active:"),
            "{name}:\n{ours}"
        );
        assert_eq!(section(&ours, other).len(), 1, "{ours}");
        assert!(section(&ours, other)[0].starts_with(" (no "), "{ours}");
        assert_eq!(
            section(&ours, "Recent failures:"),
            section(&live, "Recent failures:")
        );
    }

    // The plain form: the usage Ray's live answer had for the same node, key for key.
    let r = get_loaded(&s, "/api/cluster_status", busy);
    let ours = json_of(&r)["data"]["clusterStatus"]["loadMetricsReport"]["usage"].clone();
    let live: Value = serde_json::from_str(BUSY_LIVE_PLAIN).unwrap();
    let live = &live["data"]["clusterStatus"]["loadMetricsReport"]["usage"];
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let mut ours_keys = keys(&ours);
    let mut live_keys = keys(live);
    ours_keys.sort();
    live_keys.sort();
    assert_eq!(ours_keys, live_keys);
    for k in &live_keys {
        for i in 0..2 {
            let (a, b) = (ours[k][i].as_f64().unwrap(), live[k][i].as_f64().unwrap());
            // Ray subtracts in floating point (0.0009999999999763531 where we say 0.001).
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{k}: {a} vs {b}");
        }
    }

    let r = get_loaded(&s, "/api/cluster_status?format=1", bare);
    let text = json_of(&r)["data"]["clusterStatus"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.starts_with("======== Autoscaler status: 2026-12-02 17:22:09.535466 ========\n"),
        "{text}"
    );
    assert!(text.contains("Active:\n (no active nodes)\nIdle:\n (no idle nodes)\n"));
    assert!(
        text.contains("Total Usage:\n\nFrom request_resources:"),
        "{text}"
    );
    assert!(
        text.ends_with("Pending Demands:\n (no resource demands)"),
        "{text}"
    );
}

/// Review r36k: a node whose debug state gives a total below zero is an unreadable node, not
/// counted; and 5,001 node directories with nothing in them, sorted before the real nodes,
/// do not push the nodes the events name past the 5,000 nodes read.
#[test]
fn negative_totals_and_stray_directories_do_not_count() {
    let bad = node('b');
    let alive = json!([{"state": "ALIVE", "timestamp": "2026-12-02T17:22:10Z"}]);
    let mut events = node_events(SESSION, HEAD, "192.0.2.2", alive.clone()).to_vec();
    events.extend(node_events(SESSION, &bad, "10.0.0.6", alive));
    let negative = worker_state(&bad, "10.0.0.6", "CPU: [-50000]", "CPU: [90000]", false);
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    session(
        &bucket,
        SESSION,
        &events,
        &[(HEAD, IDLE.as_bytes()), (&bad, &negative)],
    );
    let history = bucket
        .join("cluster-history/raycluster/default/c1")
        .join(SESSION);
    for i in 0..5_001u32 {
        std::fs::create_dir_all(history.join(format!("{i:056x}/logs"))).unwrap();
    }
    let s = Serve::start(
        &format!("file://{}", bucket.display()),
        &work.path().join("serve.log"),
        &[],
        &[],
    );
    let r = get_loaded(&s, "/api/cluster_status", SESSION);
    let v = json_of(&r);
    let reads = &v["data"]["debugStates"];
    assert_eq!(reads["read"], 1, "the head's file is read: {reads}");
    assert_eq!(reads["notRead"], 3, "{reads}");
    assert_eq!(reads["unreadableTotal"], 1, "{reads}");
    assert_eq!(reads["unreadable"][0]["nodeId"], bad.as_str(), "{reads}");
    let why = reads["unreadable"][0]["reason"].as_str().unwrap();
    assert!(why.contains("below zero"), "{why}");
    let by_node = &v["data"]["clusterStatus"]["loadMetricsReport"]["usageByNode"];
    assert_eq!(by_node.as_object().unwrap().len(), 1, "{by_node}");
    assert!(by_node.get(HEAD).is_some(), "{by_node}");
}
