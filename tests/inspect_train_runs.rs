//! `inspect --train-run` and `inspect --compare-runs` (issue 37) on real Ray 2.60 Train
//! export events (`tests/data/export_events/`, a `DataParallelTrainer` run of two workers,
//! `train_loop_config={"lr": 0.01}`), put through the real collector. Beside it, runs derived
//! from it: one with another learning rate (in another cluster), one with the same settings
//! under another id, one with fields Ray does not send today (nested in the settings, on the
//! run, the attempt and a worker). Expected values are computed here from the fixture.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use ray_history_collector::contract::endpoints::{endpoint_object_name, FETCHED_ENDPOINTS_DIR};
use rhc_testkit::collector::{collector_bin, merge_bucket, ship_session_logs};
use rhc_testkit::fault_proxy::{Fault, Rule};
use rhc_testkit::http::{try_http_request_within, HttpResponse};
use rhc_testkit::serve::{set_cookies, Serve};
use rhc_testkit::serve_rig::ServeRig;
use rhc_testkit::services::{run_with_timeout, CommandOutput};

const INSPECT_TIMEOUT: Duration = Duration::from_secs(60);

const TRAIN: &str = include_str!("data/export_events/event_EXPORT_TRAIN_STATE.log");
const ACTOR: &str = include_str!("data/export_events/event_EXPORT_ACTOR.log");
const DRIVER_JOB: &str = include_str!("data/export_events/event_EXPORT_DRIVER_JOB.log");
const NODE: &str = include_str!("data/export_events/event_EXPORT_NODE.log");

/// The fixture's node (its `EXPORT_NODE` events).
const NODE_ID: &str = "f6d276f4e8fdee60cf3f62b8e0130b040f0c5788f5138674dc27719e";
/// Rank 0's pid (the fixture's), a worker id for its log file, and what the log says.
const RANK0_PID: i64 = 24920;
const RANK0_WORKER: &str = "5eed000000000000000000000000000000000000000000000000beef";
const RANK0_LOG: &str = "rank 0: epoch 0 loss 0.25\n";
/// The fixture's session and run, as recorded.
const SESSION_A: &str = "session_2026-11-22_02-08-16_569038_24326";
const RUN_A: &str = "ae4afcdffed845d89575cec07359e11c";
/// The same run with `lr` 0.001, in another cluster.
const SESSION_B: &str = "session_2026-11-23_02-08-16_569038_24326";
const RUN_B: &str = "bb4afcdffed845d89575cec07359e11c";
/// The same settings under another run id.
const SESSION_E: &str = "session_2026-11-24_02-08-16_569038_24326";
const RUN_E: &str = "ee4afcdffed845d89575cec07359e11c";
/// The run with fields this version does not know.
const SESSION_U: &str = "session_2026-11-25_02-08-16_569038_24326";

/// `inspect <args>` of the binary under test (`RHC_COLLECTOR_BIN`, else this build's).
fn inspect(args: &[&str]) -> CommandOutput {
    let mut cmd = Command::new(collector_bin());
    cmd.arg("inspect").args(args).env_remove("STORAGE_ROOT_DIR");
    run_with_timeout(&mut cmd, INSPECT_TIMEOUT)
}

fn b64_to_hex(s: &str) -> String {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_else(|e| panic!("{s}: {e}"));
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The fixture's Train events, each changed by `edit`, as lines.
fn train_lines(edit: &dyn Fn(&mut Value)) -> String {
    let mut out = String::new();
    for line in TRAIN.lines() {
        let mut e: Value = serde_json::from_str(line).unwrap();
        edit(&mut e);
        out.push_str(&e.to_string());
        out.push('\n');
    }
    out
}

/// Gives the run (and its attempts) another id.
fn renamed(e: &mut Value, id: &str) {
    let is_run = e["source_type"] == "EXPORT_TRAIN_RUN";
    let d = &mut e["event_data"];
    if is_run {
        d["id"] = json!(id);
    } else {
        d["run_id"] = json!(id);
    }
}

/// The fixture's export events besides the Train ones, by file name.
const OTHER_EXPORTS: [(&str, &str); 3] = [
    ("event_EXPORT_ACTOR.log", ACTOR),
    ("event_EXPORT_DRIVER_JOB.log", DRIVER_JOB),
    ("event_EXPORT_NODE.log", NODE),
];

/// A session's `logs/` with the Train events given and the fixture's other export events,
/// through the real collector (cluster `cluster`); returns its bucket.
fn collect(work: &Path, session: &str, cluster: &str, train: &str) -> PathBuf {
    collect_with(work, session, cluster, train, &OTHER_EXPORTS)
}

/// [`collect`] with `others` (file name, lines) as the other export event files.
fn collect_with(
    work: &Path,
    session: &str,
    cluster: &str,
    train: &str,
    others: &[(&str, &str)],
) -> PathBuf {
    let logs = work.join("fixture/logs/export_events");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join("event_EXPORT_TRAIN_STATE.log"), train).unwrap();
    for (name, lines) in others {
        std::fs::write(logs.join(name), lines).unwrap();
    }
    // The node's id, where the collector learns it (as a real raylet writes it).
    std::fs::write(
        work.join("fixture/logs/raylet.out"),
        format!(
            "[2026-11-22 02:08:17,000 I 24400 24400] (raylet) main.cc:711: Setting node ID \
             node_id={NODE_ID}\n"
        ),
    )
    .unwrap();
    // Rank 0's worker log, named as Ray names it (worker id invented: the Train events do
    // not carry it; job and pid are the fixture's).
    std::fs::write(
        work.join(format!(
            "fixture/logs/worker-{RANK0_WORKER}-01000000-{RANK0_PID}.out"
        )),
        RANK0_LOG,
    )
    .unwrap();
    ship_session_logs(work, &work.join("fixture/logs"), session, cluster)
}

/// One bucket with the four sessions, each written by its own collector; and the four
/// buckets those collectors wrote (A, B, E, U).
fn bucket(work: &Path) -> (PathBuf, Vec<PathBuf>) {
    let b = train_lines(&|e| {
        renamed(e, RUN_B);
        if e["source_type"] == "EXPORT_TRAIN_RUN" {
            e["event_data"]["run_settings"]["train_loop_config"]["lr"] = json!(0.001);
        }
    });
    let equal = train_lines(&|e| renamed(e, RUN_E));
    let unknown = train_lines(&|e| {
        let is_run = e["source_type"] == "EXPORT_TRAIN_RUN";
        let d = &mut e["event_data"];
        if is_run {
            d["run_settings"]["scaling_config"]["future_option"] =
                json!({"nested": {"knob": 7, "mode": "elastic"}});
            d["future_run_field"] = json!({"a": [1, {"b": "c"}]});
        } else {
            d["future_attempt_field"] = json!(5);
            if let Some(ws) = d["workers"].as_array_mut() {
                for w in ws {
                    w["future_worker_field"] = json!({"x": "y"});
                }
            }
        }
    });
    let sessions = [
        (SESSION_A, "train", TRAIN.to_string()),
        (SESSION_B, "train-b", b),
        (SESSION_E, "train", equal),
        (SESSION_U, "train", unknown),
    ];
    let stores: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(i, (session, cluster, train))| {
                let dir = work.join(format!("c{i}"));
                s.spawn(move || collect(&dir, session, cluster, train))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let merged = work.join("bucket");
    for store in &stores {
        merge_bucket(store, &merged);
    }
    (merged, stores)
}

/// The fixture's events of `source_type`, in file order.
fn fixture(source_type: &str) -> Vec<Value> {
    TRAIN
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["source_type"] == source_type)
        .map(|e| e["event_data"].clone())
        .collect()
}

/// Every scalar or empty member of `v` as `key: value` (strings bare, the rest as JSON).
fn leaf_lines(v: &Value, key: Option<&str>, out: &mut Vec<String>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            m.iter().for_each(|(k, c)| leaf_lines(c, Some(k), out))
        }
        Value::Array(a) if !a.is_empty() => a.iter().for_each(|c| leaf_lines(c, None, out)),
        leaf => {
            let text = match leaf {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            out.push(match key {
                Some(k) => format!("{k}: {text}\n"),
                None => format!("- {text}\n"),
            });
        }
    }
}

#[test]
fn train_run_in_full_compare_runs_and_unknown_fields() {
    let work = tempfile::tempdir().unwrap();
    let (store, single) = bucket(work.path());
    let dir = store.to_str().unwrap();

    // Expected, from the fixture: the run's latest event, its attempt's latest event.
    let runs = fixture("EXPORT_TRAIN_RUN");
    let attempts = fixture("EXPORT_TRAIN_RUN_ATTEMPT");
    let run = runs.last().unwrap();
    let attempt = attempts.last().unwrap();
    let mut statuses: Vec<(String, Option<String>)> = Vec::new();
    for r in &runs {
        let s = r["status"].as_str().unwrap().to_string();
        if statuses.last().map(|(l, _)| l) != Some(&s) {
            statuses.push((s, r["status_detail"].as_str().map(str::to_string)));
        }
    }
    let ns = |v: &Value| v.as_str().unwrap().parse::<i64>().unwrap();
    let duration_s = (ns(&run["end_time_ns"]) - ns(&run["start_time_ns"])) as f64 / 1e9;

    // 1. One run in full, as JSON: every field Ray sent, same values.
    let out = inspect(&[dir, "--session", SESSION_A, "--train-run", RUN_A, "--json"]);
    assert!(out.status.success(), "{}", out.stderr);
    let doc: Value = serde_json::from_str(&out.stdout).unwrap();
    let got = &doc["train_run"];
    assert_eq!(got["run_id"], RUN_A);
    assert_eq!(got["name"], run["name"]);
    assert_eq!(got["job_id"], b64_to_hex(run["job_id"].as_str().unwrap()));
    assert_eq!(got["status"], run["status"]);
    assert_eq!(got["run_settings"], run["run_settings"]);
    assert_eq!(got["framework_versions"], run["framework_versions"]);
    assert_eq!(got["ray_train_version"], run["ray_train_version"]);
    assert_eq!(
        got["controller_log_file_path"],
        run["controller_log_file_path"]
    );
    assert_eq!(
        got["controller_actor_id"],
        b64_to_hex(run["controller_actor_id"].as_str().unwrap())
    );
    for field in ["schema_version", "train_run_panels", "train_worker_panels"] {
        assert_eq!(got["other_fields"][field], run[field], "{field}");
    }
    assert_eq!(got["workers"], 2);
    let history: Vec<(String, Option<String>)> = got["status_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["status"].as_str().unwrap().to_string(),
                h["detail"].as_str().map(str::to_string),
            )
        })
        .collect();
    assert_eq!(history, statuses);
    let a = &got["attempts"][0];
    assert_eq!(got["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(a["attempt_id"], attempt["attempt_id"]);
    assert_eq!(a["status"], attempt["status"]);
    assert_eq!(a["resources"], attempt["resources"]);
    assert_eq!(
        a["other_fields"]["schema_version"],
        attempt["schema_version"]
    );
    let workers = attempt["workers"].as_array().unwrap();
    assert_eq!(a["workers"].as_array().unwrap().len(), workers.len());
    for w in workers {
        let rank = w["world_rank"].as_i64().unwrap();
        let g = &a["workers"][rank as usize];
        assert_eq!(g["world_rank"], rank);
        for k in [
            "local_rank",
            "node_rank",
            "node_ip",
            "pid",
            "status",
            "gpu_ids",
            "log_file_path",
            "resources",
        ] {
            assert_eq!(g[k], w[k], "worker {rank} {k}");
        }
        let actor = b64_to_hex(w["actor_id"].as_str().unwrap());
        assert_eq!(g["actor_id"], actor.as_str());
        assert_eq!(
            g["log_command"],
            format!("ray-history-collector inspect {dir} --session {SESSION_A} --logs {actor}")
        );
    }
    // Rank 0's log command prints rank 0's worker log from the bucket.
    assert_eq!(a["workers"][0]["pid"], RANK0_PID);
    let log_cmd = a["workers"][0]["log_command"].as_str().unwrap();
    let words: Vec<&str> = log_cmd.split(' ').skip(2).collect();
    let out = inspect(&words);
    assert!(out.status.success(), "{log_cmd}: {}", out.stderr);
    assert_eq!(out.stdout, RANK0_LOG);

    // 2. The same as text, by name: the settings as an indented tree, every leaf shown.
    let out = inspect(&[dir, "--session", SESSION_A, "--train-run", "probe-run"]);
    assert!(out.status.success(), "{}", out.stderr);
    let text = out.stdout;
    assert!(
        text.contains("  train_loop_config:\n    lr: 0.01\n"),
        "{text}"
    );
    assert!(
        text.contains("  scaling_config:\n    num_workers_fixed: 2\n"),
        "{text}"
    );
    let mut leaves = Vec::new();
    leaf_lines(&run["run_settings"], None, &mut leaves);
    leaf_lines(&run["framework_versions"], None, &mut leaves);
    assert!(leaves.len() > 20, "{leaves:?}");
    for leaf in &leaves {
        assert!(text.contains(leaf.as_str()), "{leaf:?} not in\n{text}");
    }
    for (status, detail) in &statuses {
        let line = match detail {
            Some(d) => format!("  {status}  {d}\n"),
            None => format!("  {status}\n"),
        };
        assert!(text.contains(&line), "{line:?} not in\n{text}");
    }
    for needle in [
        run["controller_log_file_path"].as_str().unwrap(),
        "ray_train_version:  2\n",
        "train_run_panels:\n",
        "workers:            2\n",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
    for w in workers {
        assert!(
            text.contains(w["log_file_path"].as_str().unwrap()),
            "{text}"
        );
        assert!(text.contains(&format!("  {}  ", w["pid"])), "{text}");
        assert!(
            text.contains(&format!(
                "--logs {}\n",
                b64_to_hex(w["actor_id"].as_str().unwrap())
            )),
            "{text}"
        );
    }
    let out = inspect(&[dir, "--session", SESSION_A, "--train-run", "no-such-run"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.contains("no Ray Train run \"no-such-run\"")
            && out.stderr.contains(&format!("{RUN_A} (probe-run)")),
        "{}",
        out.stderr
    );

    // 3. Fields this version does not know, nested or not, in the run, attempt and workers.
    let out = inspect(&[dir, "--session", SESSION_U, "--train-run", RUN_A, "--json"]);
    assert!(out.status.success(), "{}", out.stderr);
    let doc: Value = serde_json::from_str(&out.stdout).unwrap();
    let u = &doc["train_run"];
    assert_eq!(
        u["run_settings"]["scaling_config"]["future_option"],
        json!({"nested": {"knob": 7, "mode": "elastic"}})
    );
    assert_eq!(
        u["other_fields"]["future_run_field"],
        json!({"a": [1, {"b": "c"}]})
    );
    assert_eq!(u["attempts"][0]["other_fields"]["future_attempt_field"], 5);
    assert_eq!(
        u["attempts"][0]["workers"][1]["other_fields"]["future_worker_field"],
        json!({"x": "y"})
    );
    let text = inspect(&[dir, "--session", SESSION_U, "--train-run", "probe-run"]).stdout;
    for needle in [
        "    future_option:\n      nested:\n        knob: 7\n        mode: elastic\n",
        "  future_run_field:\n    a:\n      - 1\n      -\n        b: c\n",
        "    future_attempt_field: 5\n",
        "future_worker_field:\n",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }

    // 4. Two runs, other sessions and clusters: exactly the learning rate differs, exit 1.
    let a_ref = format!("{SESSION_A}:probe-run");
    let b_ref = format!("{SESSION_B}:{RUN_B}");
    let out = inspect(&[dir, "--compare-runs", &a_ref, &b_ref, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let c: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        c["differences"],
        json!([{"path": "train_loop_config.lr", "a": 0.01, "b": 0.001}])
    );
    assert_eq!(c["settings_equal"], false);
    assert_eq!(c["a"]["run_id"], RUN_A);
    assert_eq!(c["b"]["run_id"], RUN_B);
    assert_eq!(
        c["b"]["cluster"],
        "cluster-history/raycluster/default/train-b"
    );
    for side in ["a", "b"] {
        assert_eq!(c[side]["status"], run["status"]);
        assert_eq!(c[side]["attempts"], 1);
        assert_eq!(c[side]["failed_attempts"], 0);
        let d = c[side]["duration_seconds"].as_f64().unwrap();
        assert!((d - duration_s).abs() < 1e-6, "{d} vs {duration_s}");
    }
    let out = inspect(&[dir, "--compare-runs", &a_ref, &b_ref]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stdout.contains(
            "SETTINGS THAT DIFFER (1)\n  train_loop_config.lr\n    A: 0.01\n    B: 0.001\n"
        ),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("OUTCOME"), "{}", out.stdout);

    // The same with B in a bucket of its own; without it, B's session is not found (2).
    let (only_a, only_b) = (single[0].to_str().unwrap(), single[1].to_str().unwrap());
    let out = inspect(&[
        only_a,
        "--compare-runs",
        &a_ref,
        &b_ref,
        "--compare-storage",
        only_b,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let c: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        c["differences"],
        json!([{"path": "train_loop_config.lr", "a": 0.01, "b": 0.001}])
    );
    assert_eq!(c["a"]["storage"], format!("file://{only_a}"));
    assert_eq!(c["b"]["storage"], format!("file://{only_b}"));
    assert_eq!(
        c["b"]["train_run_command"],
        format!("ray-history-collector inspect {only_b} --session {SESSION_B} --train-run {RUN_B}")
    );
    let out = inspect(&[only_a, "--compare-runs", &a_ref, &b_ref]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("no session matches"), "{}", out.stderr);

    // Equal settings under another id: exit 0 (the operand's session from --session).
    let out = inspect(&[
        dir,
        "--session",
        SESSION_A,
        "--compare-runs",
        RUN_A,
        &format!("{SESSION_E}:{RUN_E}"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("SETTINGS: equal"), "{}", out.stdout);

    // Unknown fields are compared too: present on one side only (no `a`: absent on A).
    let out = inspect(&[
        dir,
        "--compare-runs",
        &a_ref,
        &format!("{SESSION_U}:probe-run"),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let c: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        c["differences"],
        json!([{"path": "scaling_config.future_option",
                "b": {"nested": {"knob": 7, "mode": "elastic"}}}])
    );

    // Runs that cannot be compared: exit 2, not 0 or 1.
    let out = inspect(&[dir, "--compare-runs", &a_ref, &format!("{SESSION_B}:nope")]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("no Ray Train run \"nope\""),
        "{}",
        out.stderr
    );
    let out = inspect(&[dir, "--compare-runs", "probe-run", &b_ref]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("which session?"), "{}", out.stderr);
    let missing = work.path().join("missing");
    let out = inspect(&[missing.to_str().unwrap(), "--compare-runs", &a_ref, &b_ref]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);

    // 5. The session report lists the run in one line and says how to see it in full.
    let html = work.path().join("page.html");
    let out = inspect(&[
        dir,
        "--session",
        SESSION_A,
        "--html",
        html.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let command =
        format!("ray-history-collector inspect {dir} --session {SESSION_A} --train-run {RUN_A}");
    assert!(out.stdout.contains(&command), "{}", out.stdout);
    let row = out
        .stdout
        .lines()
        .find(|l| l.starts_with(RUN_A))
        .unwrap_or_else(|| panic!("no row for the run in\n{}", out.stdout));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1], "probe-run", "{row}");
    assert_eq!(cells[cells.len() - 2], "2", "workers: {row}");
    assert_eq!(cells[cells.len() - 1], "UNSPECIFIED", "framework: {row}");
    assert!(row.contains(" FINISHED "), "{row}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains(&format!("<code>{command}</code>")), "{page}");
    assert!(page.contains("<th>workers</th><th>framework</th>"));
}

/// The URI of Ray 2.60's Train V2 runs (`TrainHead.get_train_v2_runs`).
const RUNS_URI: &str = "/api/train/v2/runs/v1";

/// `serve` on a bucket, entered into one session.
struct Served {
    serve: Serve,
    cookies: Vec<(String, String)>,
}

impl Served {
    fn start(work: &Path, store: &Path, cluster: &str, session: &str) -> Served {
        let serve = Serve::start(store.to_str().unwrap(), &work.join("serve.log"), &[], &[]);
        let entered = serve
            .get(
                &format!("/enter_cluster/default/raycluster/{cluster}/{session}"),
                &[],
            )
            .unwrap();
        assert_eq!(entered.status, 200, "{}", serve.log_text());
        let cookies = set_cookies(&entered);
        Served { serve, cookies }
    }

    fn runs(&self) -> HttpResponse {
        let got = self.serve.get(RUNS_URI, &self.cookies).unwrap();
        assert_eq!(got.status, 200, "{}", self.serve.log_text());
        got
    }

    /// The session's cookies, as one `Cookie` header's value.
    fn cookie(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Waits until the session is loaded (`/api/jobs/` answers `200`, not the `503` of a
    /// load still under way), at most five minutes.
    fn load_session(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        loop {
            let got = try_http_request_within(
                "GET",
                &format!("http://127.0.0.1:{}/api/jobs/", self.serve.port),
                &[("Cookie", self.cookie().as_str())],
                b"",
                Duration::from_secs(60),
            )
            .unwrap();
            if got.status == 200 {
                return;
            }
            assert_eq!(got.status, 503, "{}", self.serve.log_text());
            assert!(
                std::time::Instant::now() < deadline,
                "the session never loaded"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A counter of serve's `/metrics`.
    fn metric(&self, name: &str) -> u64 {
        let got = self.serve.get("/metrics", &[]).unwrap();
        assert_eq!(got.status, 200);
        let text = String::from_utf8_lossy(&got.body).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
    }

    fn runs_json(&self) -> Value {
        let got = self.runs();
        serde_json::from_slice(&got.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&got.body)))
    }
}

/// The fixture's latest event of `source_type`, as a new event (`event_id` `n`, so the
/// collector's deduplication keeps it) edited by `edit` (given its `event_data`), as a line.
fn event_line(source_type: &str, n: u64, edit: &dyn Fn(&mut Value)) -> String {
    let mut e: Value = TRAIN
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .rfind(|e| e["source_type"] == source_type)
        .unwrap();
    e["event_id"] = json!(format!("{n:036x}"));
    edit(&mut e["event_data"]);
    format!("{e}\n")
}

/// Issue 37 (r37d, r37e): a Train status detail, a run's name and a worker's log path are
/// kept whole, as Ray's Train head answers them, not cut at inspect's 512 bytes for names and
/// ids, nor at 50,000 characters: Ray Train V2 bounds no status detail, and a failure of 64
/// workers builds one of about 76,000 characters, whose last lines say what failed.
#[test]
fn train_texts_are_kept_whole() {
    let work = tempfile::tempdir().unwrap();
    let mut detail = String::from("Training failed due to worker errors:\n");
    for rank in 0..64 {
        detail.push_str(&format!("[Rank {rank} Error Snippet]:\n"));
        for i in 0..18 {
            detail.push_str(&format!(
                "  File \"/home/ray/app/train_{i}.py\", line {i}, in step_{i}\n    loss = model(b)\n"
            ));
        }
    }
    detail.push_str("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n");
    assert!(detail.chars().count() > 75_000, "{}", detail.len());
    let name = format!("probe-{}", "é".repeat(400));
    let log = format!(
        "/tmp/ray/session_latest/logs/train/{}/worker-0.log",
        "d".repeat(700)
    );
    let train = train_lines(&|e| {
        let is_run = e["source_type"] == "EXPORT_TRAIN_RUN";
        let d = &mut e["event_data"];
        if is_run {
            d["name"] = json!(name);
        }
        if d["status"] == "FINISHED" {
            d["status"] = json!("ERRORED");
            d["status_detail"] = json!(detail);
        }
        if let Some(ws) = d["workers"].as_array_mut() {
            for w in ws {
                w["log_file_path"] = json!(log);
            }
        }
    });
    let store = collect(work.path(), SESSION_A, "train", &train);
    let dir = store.to_str().unwrap();

    let out = inspect(&[dir, "--session", SESSION_A, "--train-run", RUN_A, "--json"]);
    assert!(out.status.success(), "{}", out.stderr);
    let run = &serde_json::from_str::<Value>(&out.stdout).unwrap()["train_run"];
    assert_eq!(run["name"], name.as_str());
    assert_eq!(run["status"], "ERRORED");
    assert_eq!(run["status_detail"], detail.as_str());
    let history = run["status_history"].as_array().unwrap();
    assert_eq!(history.last().unwrap()["detail"], detail.as_str());
    let attempt = &run["attempts"][0];
    assert_eq!(attempt["status_detail"], detail.as_str());
    for w in attempt["workers"].as_array().unwrap() {
        assert_eq!(w["log_file_path"], log.as_str());
    }
    let text = inspect(&[dir, "--session", SESSION_A, "--train-run", RUN_A]).stdout;
    assert!(
        text.contains("[Rank 63 Error Snippet]:"),
        "the last rank's error"
    );
    assert!(text.contains("torch.OutOfMemoryError: CUDA out of memory."));

    let served = Served::start(work.path(), &store, "train", SESSION_A).runs_json();
    let run = &served["train_runs"][0];
    assert_eq!(run["name"], name.as_str());
    assert_eq!(run["status_detail"], detail.as_str());
    assert_eq!(run["attempts"][0]["status_detail"], detail.as_str());
    for w in run["attempts"][0]["workers"].as_array().unwrap() {
        assert_eq!(w["log_file_path"], log.as_str());
    }
}

/// Issue 37 (r37d): the driver died mid-training, so the run's and its attempt's last
/// events say RUNNING while the TrainController actor is DEAD. Ray's Train head answers such
/// a run ABORTED, "Terminated due to system errors or killed by the user." (its
/// `_get_run_status`), leaving the end time and the attempt as recorded, and a worker's
/// status is its actor's state; a run in another state is answered as recorded.
#[test]
fn a_running_run_whose_controller_died_is_aborted() {
    let work = tempfile::tempdir().unwrap();
    const RUN_S: &str = "5c4afcdffed845d89575cec07359e11c";
    // The fixture up to RUNNING; and a second run that got to SCHEDULING only.
    let mut train = String::new();
    let mut scheduling = String::new();
    for line in TRAIN.lines() {
        let mut e: Value = serde_json::from_str(line).unwrap();
        if e["event_data"]["status"] == "FINISHED" {
            continue;
        }
        train.push_str(line);
        train.push('\n');
        if e["source_type"] == "EXPORT_TRAIN_RUN"
            && ["INITIALIZING", "SCHEDULING"].contains(&e["event_data"]["status"].as_str().unwrap())
        {
            renamed(&mut e, RUN_S);
            e["event_id"] = json!(format!("{}-s", e["event_id"].as_str().unwrap()));
            scheduling.push_str(&format!("{e}\n"));
        }
    }
    train.push_str(&scheduling);
    // Expected, from the fixture: the controller's and the workers' actors ended DEAD.
    let runs = fixture("EXPORT_TRAIN_RUN");
    let controller = runs[0]["controller_actor_id"].as_str().unwrap();
    let actor_states = |id: &str| -> Vec<String> {
        ACTOR
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|a| a["event_data"]["actor_id"] == id)
            .map(|a| a["event_data"]["state"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(actor_states(controller).last().unwrap(), "DEAD");
    let store = collect(work.path(), SESSION_A, "train", &train);
    let dir = store.to_str().unwrap();
    const DETAIL: &str = "Terminated due to system errors or killed by the user.";

    let out = inspect(&[dir, "--session", SESSION_A, "--train-run", RUN_A, "--json"]);
    assert!(out.status.success(), "{}", out.stderr);
    let run = &serde_json::from_str::<Value>(&out.stdout).unwrap()["train_run"];
    assert_eq!(run["status"], "ABORTED");
    assert_eq!(run["status_detail"], DETAIL);
    assert_eq!(run["ended"], Value::Null);
    let last = run["status_history"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        (&last["status"], &last["detail"]),
        (&json!("ABORTED"), &json!(DETAIL))
    );
    assert!(last["time"].is_string(), "{last}");
    assert_eq!(run["attempts"][0]["status"], "RUNNING");
    let text = inspect(&[dir, "--session", SESSION_A, "--train-run", RUN_A]).stdout;
    assert!(text.contains("  status:             ABORTED\n"), "{text}");
    let out = inspect(&[dir, "--session", SESSION_A, "--train-run", RUN_S, "--json"]);
    let other = &serde_json::from_str::<Value>(&out.stdout).unwrap()["train_run"];
    assert_eq!(other["status"], "SCHEDULING");

    let served = Served::start(work.path(), &store, "train", SESSION_A).runs_json();
    let by_id = |id: &str| {
        served["train_runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .unwrap()
            .clone()
    };
    let run = by_id(RUN_A);
    assert_eq!(run["status"], "ABORTED");
    assert_eq!(run["status_detail"], DETAIL);
    assert_eq!(run["end_time_ns"], Value::Null);
    let attempt = &run["attempts"][0];
    assert_eq!(attempt["status"], "RUNNING");
    assert_eq!(attempt["end_time_ns"], Value::Null);
    let workers = attempt["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2);
    for w in workers {
        let actor = base64::engine::general_purpose::STANDARD
            .encode(hex_bytes(w["actor_id"].as_str().unwrap()));
        assert_eq!(w["status"], actor_states(&actor).last().unwrap().as_str());
        assert_eq!(w["status"], "DEAD");
    }
    let other = by_id(RUN_S);
    assert_eq!(other["status"], "SCHEDULING");
    let scheduling = runs.iter().rfind(|r| r["status"] == "SCHEDULING");
    assert_eq!(other["status_detail"], scheduling.unwrap()["status_detail"]);
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// Issue 37 (r37d): a snapshot of the Train runs stored at the last live poll, while the run
/// was still going, gives way per run to the export events that went further (its end, its
/// attempt's end); a snapshot as far as the events is replayed byte for byte; a run the
/// snapshot does not list is added.
#[test]
fn a_snapshot_gives_way_to_events_that_went_further() {
    let work = tempfile::tempdir().unwrap();
    let store = collect(work.path(), SESSION_A, "train", TRAIN);
    let served = Served::start(work.path(), &store, "train", SESSION_A);
    let events = served.runs_json();
    let run = &events["train_runs"][0];
    assert_eq!(run["status"], "FINISHED");
    let session_dir = store
        .join("cluster-history/raycluster/default/train")
        .join(SESSION_A)
        .join(FETCHED_ENDPOINTS_DIR);
    std::fs::create_dir_all(&session_dir).unwrap();
    let snapshot = session_dir.join(endpoint_object_name(RUNS_URI));

    // The last live poll: the run RUNNING, its attempt RUNNING.
    let mut lagging = json!({"train_runs": [run.clone()], "rhc_test": "stored"});
    let r = &mut lagging["train_runs"][0];
    r["status"] = json!("RUNNING");
    r["end_time_ns"] = Value::Null;
    r["attempts"][0]["status"] = json!("RUNNING");
    r["attempts"][0]["end_time_ns"] = Value::Null;
    std::fs::write(&snapshot, lagging.to_string()).unwrap();
    let got = served.runs_json();
    assert_eq!(got["train_runs"], events["train_runs"]);
    assert_eq!(got["rhc_test"], "stored");

    // As far as the events (and a run they do not have): replayed as stored.
    let mut old = run.clone();
    old["id"] = json!("0000000000000000000000000000beef");
    old["start_time_ns"] = json!(1);
    let as_far = json!({"train_runs": [run.clone(), old], "rhc_test": "stored"}).to_string();
    std::fs::write(&snapshot, &as_far).unwrap();
    assert_eq!(String::from_utf8_lossy(&served.runs().body), as_far);

    // A snapshot without the run: the run is added.
    std::fs::write(&snapshot, r#"{"train_runs": [], "rhc_test": "stored"}"#).unwrap();
    let got = served.runs_json();
    assert_eq!(got["train_runs"], events["train_runs"]);
    assert_eq!(got["rhc_test"], "stored");
}

/// Issue 37 (r37e): the last live poll saw the run `SCHEDULING`, its attempt `PENDING` with
/// no workers; the export events go on to the attempt `RUNNING` with its two workers and the
/// run `RUNNING` (then the head died): the same attempts, none ended, so only the statuses
/// and workers say the events went further. `serve` answers the events' run, as
/// `inspect` shows it (and as Ray's head would have answered after its last poll).
#[test]
fn a_snapshot_with_the_same_attempts_but_earlier_statuses_gives_way() {
    let work = tempfile::tempdir().unwrap();
    let lines: Vec<&str> = TRAIN.lines().collect();
    let upto = |n: usize| {
        lines[..n]
            .iter()
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    };
    // Run INITIALIZING, SCHEDULING, attempt PENDING: what the last poll saw.
    let early = collect_with(
        &work.path().join("early"),
        SESSION_A,
        "train",
        &upto(3),
        &[],
    );
    let snapshot =
        Served::start(&work.path().join("early"), &early, "train", SESSION_A).runs_json();
    let polled = &snapshot["train_runs"][0];
    assert_eq!(polled["status"], "SCHEDULING");
    assert_eq!(polled["attempts"][0]["status"], "PENDING");
    assert_eq!(polled["attempts"][0]["workers"], json!([]));
    // ... then attempt RUNNING (2 workers), run SCHEDULING again, run RUNNING.
    let store = collect_with(&work.path().join("late"), SESSION_A, "train", &upto(6), &[]);
    let served = Served::start(&work.path().join("late"), &store, "train", SESSION_A);
    let events = served.runs_json();
    assert_eq!(events["train_runs"][0]["status"], "RUNNING");
    let dir = store
        .join("cluster-history/raycluster/default/train")
        .join(SESSION_A)
        .join(FETCHED_ENDPOINTS_DIR);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(endpoint_object_name(RUNS_URI)),
        snapshot.to_string(),
    )
    .unwrap();

    let got = served.runs_json();
    let run = &got["train_runs"][0];
    assert_eq!(got["train_runs"], events["train_runs"]);
    assert_eq!(run["status"], "RUNNING");
    assert_eq!(run["attempts"][0]["status"], "RUNNING");
    assert_eq!(run["attempts"][0]["workers"].as_array().unwrap().len(), 2);
    let out = inspect(&[
        store.to_str().unwrap(),
        "--session",
        SESSION_A,
        "--train-run",
        RUN_A,
        "--json",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let inspected = &serde_json::from_str::<Value>(&out.stdout).unwrap()["train_run"];
    assert_eq!(inspected["status"], run["status"]);
    assert_eq!(
        inspected["attempts"][0]["status"],
        run["attempts"][0]["status"]
    );
    assert_eq!(
        inspected["attempts"][0]["workers"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

/// Issue 37 (r37d): `checkpoint_config.num_to_keep`, a uint64 in the export event (so a
/// string in its JSON), is a number in Ray's answer.
#[test]
fn checkpoint_num_to_keep_is_a_number() {
    let work = tempfile::tempdir().unwrap();
    let train = train_lines(&|e| {
        if e["source_type"] == "EXPORT_TRAIN_RUN" {
            e["event_data"]["run_settings"]["run_config"]["checkpoint_config"]["num_to_keep"] =
                json!("3");
        }
    });
    let store = collect(work.path(), SESSION_A, "train", &train);
    let served = Served::start(work.path(), &store, "train", SESSION_A).runs_json();
    assert_eq!(
        served["train_runs"][0]["run_settings"]["run_config"]["checkpoint_config"]["num_to_keep"],
        json!(3)
    );
}

/// Issue 37 (r37d): `job_details` is null for a job no driver job event recorded (known
/// only from the Train events), and the driver's IP is the one `EXPORT_DRIVER_JOB` gives.
#[test]
fn job_details_are_what_the_driver_job_events_say() {
    let work = tempfile::tempdir().unwrap();
    let alone = collect_with(&work.path().join("a"), SESSION_A, "train", TRAIN, &[]);
    let served = Served::start(work.path(), &alone, "train", SESSION_A).runs_json();
    assert_eq!(served["train_runs"][0]["job_details"], Value::Null);

    let driver: Value = serde_json::from_str(DRIVER_JOB.lines().last().unwrap()).unwrap();
    let ip = driver["event_data"]["driver_ip_address"].as_str().unwrap();
    let store = collect(&work.path().join("b"), SESSION_A, "train", TRAIN);
    let served = Served::start(work.path(), &store, "train", SESSION_A).runs_json();
    let job = &served["train_runs"][0]["job_details"];
    assert_eq!(job["driver_info"]["node_ip_address"], ip);
    assert_eq!(
        job["driver_info"]["pid"],
        driver["event_data"]["driver_pid"]
    );
    assert_eq!(job["entrypoint"], driver["event_data"]["entrypoint"]);
}

/// Issue 37 (r37d): attempts, and inspect's runs, in the order of their start times, not of
/// their RFC 3339 text (where a whole second, `…25Z`, sorts after `…25.000000001Z`).
#[test]
fn attempts_and_runs_are_in_time_order() {
    let work = tempfile::tempdir().unwrap();
    const T0: i64 = 1_795_313_305_000_000_000;
    const RUN_LATER: &str = "1a4afcdffed845d89575cec07359e11c";
    // (attempt id, start offset in ns): id order and text order both differ from time order.
    let attempts = [
        ("cc000000000000000000000000000000", 99),
        ("bb000000000000000000000000000000", 0),
        ("aa000000000000000000000000000000", 1),
    ];
    let mut train = String::new();
    let mut n = 0;
    for (run, start) in [(RUN_A, T0), (RUN_LATER, T0 + 1)] {
        n += 1;
        train.push_str(&event_line("EXPORT_TRAIN_RUN", n, &|d| {
            d["id"] = json!(run);
            d["start_time_ns"] = json!(start.to_string());
            d["end_time_ns"] = json!((start + 1_000).to_string());
        }));
    }
    for (id, offset) in attempts {
        n += 1;
        train.push_str(&event_line("EXPORT_TRAIN_RUN_ATTEMPT", n, &|d| {
            d["attempt_id"] = json!(id);
            d["start_time_ns"] = json!((T0 + offset).to_string());
            d["end_time_ns"] = json!((T0 + offset + 1).to_string());
        }));
    }
    let mut by_time = attempts.to_vec();
    by_time.sort_by_key(|(_, offset)| *offset);
    let expected: Vec<&str> = by_time.iter().map(|(id, _)| *id).collect();
    let store = collect(work.path(), SESSION_A, "train", &train);
    let dir = store.to_str().unwrap();

    let out = inspect(&[dir, "--session", SESSION_A, "--json"]);
    assert!(out.status.success(), "{}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    let ids = |v: &Value, key: &str| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x[key].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&report["train_runs"], "run_id"), [RUN_A, RUN_LATER]);
    let run = &report["train_runs"][0];
    assert_eq!(ids(&run["attempts"], "attempt_id"), expected);

    let served = Served::start(work.path(), &store, "train", SESSION_A).runs_json();
    assert_eq!(ids(&served["train_runs"], "id"), [RUN_LATER, RUN_A]);
    assert_eq!(
        ids(&served["train_runs"][1]["attempts"], "attempt_id"),
        expected
    );
}

/// Issue 37 (r37e): while the session's index is still loading (its export events slow to
/// read, past serve's 25 s wait), the Train runs are the `503` every route of the index
/// answers while loading, not the stored snapshot alone, which may be older than the events;
/// once loaded, the events' runs.
#[test]
fn a_session_still_loading_is_a_503_not_the_snapshot() {
    /// How long the first read of an export events object is held: past serve's wait.
    const LOAD_DELAY: Duration = Duration::from_secs(32);
    let Some(mut rig) = serve_rig() else { return };
    // The last live poll: the run RUNNING (the events end FINISHED).
    let snapshot = json!({"train_runs": [{"id": RUN_A, "status": "RUNNING", "start_time_ns": 1,
                                          "attempts": [{"status": "RUNNING"}]}]});
    rig.add_session(
        SESSION_A,
        &[(&snapshot_rel(RUNS_URI), snapshot.to_string().as_bytes())],
    );
    rig.proxy.add(
        Rule::new(Fault::Delay(LOAD_DELAY))
            .method("GET")
            .target_contains("export_events")
            .times(1),
    );
    rig.serve();
    let cookie = rig.cookie(SESSION_A);

    // Serve waits 25 s for the load before it answers.
    let got = try_http_request_within(
        "GET",
        &format!("http://127.0.0.1:{}{RUNS_URI}", rig.served().port),
        &[("Cookie", cookie.as_str())],
        b"",
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(
        got.status,
        503,
        "{}: {}",
        got.status,
        String::from_utf8_lossy(&got.body)
    );
    assert_eq!(got.header("x-rhc-session-loading"), Some("true"));
    assert!(got.header("retry-after").is_some());

    // Once loaded: the events went further than the snapshot.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let answer = loop {
        let got = try_http_request_within(
            "GET",
            &format!("http://127.0.0.1:{}{RUNS_URI}", rig.served().port),
            &[("Cookie", cookie.as_str())],
            b"",
            Duration::from_secs(60),
        )
        .unwrap();
        if got.status == 200 {
            break serde_json::from_slice::<Value>(&got.body).unwrap();
        }
        assert_eq!(got.status, 503, "{}", String::from_utf8_lossy(&got.body));
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            rig.served().log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(answer["train_runs"][0]["id"], RUN_A);
    assert_eq!(answer["train_runs"][0]["status"], "FINISHED");
}

/// The fixture's Train events as run `id` (event ids prefixed with `tag`, so the collector
/// keeps them all), each changed by `edit`; with `run_event: false` only the attempts.
fn variant(id: &str, tag: &str, run_event: bool, edit: &dyn Fn(&mut Value)) -> String {
    let mut out = String::new();
    for line in TRAIN.lines() {
        let mut e: Value = serde_json::from_str(line).unwrap();
        if !run_event && e["source_type"] == "EXPORT_TRAIN_RUN" {
            continue;
        }
        e["event_id"] = json!(format!("{tag}{}", e["event_id"].as_str().unwrap()));
        renamed(&mut e, id);
        if e["source_type"] == "EXPORT_TRAIN_RUN_ATTEMPT" {
            let a = e["event_data"]["attempt_id"].as_str().unwrap().to_string();
            e["event_data"]["attempt_id"] = json!(format!("{}{}", &id[..8], &a[8..]));
        }
        edit(&mut e);
        out.push_str(&e.to_string());
        out.push('\n');
    }
    out
}

/// Issue 37 (r37i D2, D3, D4): runs whose settings were never recorded are not "equal"
/// (exit 2, could not be compared); a long value that differs past its first 300
/// characters shows where A and B differ; a run known only by its attempts is left out of
/// serve's `TrainRunsResponse` (Ray's head lists no run without its record, and its model
/// rejects the nulls), counted in a header, while inspect still shows it.
#[test]
fn unrecorded_settings_long_values_and_runs_without_their_event() {
    let work = tempfile::tempdir().unwrap();
    const N1: &str = "a1000000000000000000000000000001";
    const N2: &str = "a2000000000000000000000000000002";
    const L1: &str = "b1000000000000000000000000000001";
    const L2: &str = "b2000000000000000000000000000002";
    const ONLY: &str = "c1000000000000000000000000000001";
    let unrecorded = |e: &mut Value| {
        if e["source_type"] == "EXPORT_TRAIN_RUN" {
            let d = e["event_data"].as_object_mut().unwrap();
            for k in ["run_settings", "framework_versions", "ray_train_version"] {
                d.remove(k);
            }
        }
    };
    let model = |last: &'static str| {
        move |e: &mut Value| {
            if e["source_type"] == "EXPORT_TRAIN_RUN" {
                let layers =
                    "  (n): Linear(in_features=512, out_features=512, bias=True)\n".repeat(20);
                e["event_data"]["run_settings"]["train_loop_config"]["model"] = json!(format!(
                    "Sequential(\n{layers}  (out): Linear(in_features=512, out_features={last}, bias=True)\n)"
                ));
            }
        }
    };
    let train = [
        variant(N1, "1", true, &unrecorded),
        variant(N2, "2", true, &unrecorded),
        variant(L1, "3", true, &model("10")),
        variant(L2, "4", true, &model("100")),
        variant(ONLY, "5", false, &|_| {}),
    ]
    .concat();
    let store = collect(work.path(), SESSION_A, "train", &train);
    let dir = store.to_str().unwrap();

    // D3: unknown settings on both sides are not equal.
    let out = inspect(&[dir, "--session", SESSION_A, "--compare-runs", N1, N2]);
    assert_eq!(out.status.code(), Some(2), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("could not be compared"),
        "{}",
        out.stdout
    );
    let out = inspect(&[
        dir,
        "--session",
        SESSION_A,
        "--compare-runs",
        N1,
        L1,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}{}", out.stdout, out.stderr);
    let j: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(j["settings_equal"], false);
    assert!(j["not_compared"].is_string(), "{j}");

    // D4: the two lines of a long value show where they differ.
    let out = inspect(&[dir, "--session", SESSION_A, "--compare-runs", L1, L2]);
    assert_eq!(out.status.code(), Some(1), "{}{}", out.stdout, out.stderr);
    let value = |side: &str| {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("    {side}")))
            .unwrap_or_else(|| panic!("no {side} line in\n{}", out.stdout))
            .to_string()
    };
    let (a, b) = (value("A: "), value("B: "));
    assert_ne!(a, b, "A and B print alike:\n{}", out.stdout);
    assert!(a.contains("out_features=10,"), "{a}");
    assert!(b.contains("out_features=100,"), "{b}");

    // D2: inspect shows the run known by its attempts; serve's Ray answer leaves it out.
    let out = inspect(&[dir, "--session", SESSION_A, "--json"]);
    assert!(out.status.success(), "{}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(report["train_runs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["run_id"] == ONLY));
    let served = Served::start(work.path(), &store, "train", SESSION_A);
    let got = served.runs();
    assert_eq!(
        got.header("x-rhc-train-runs-without-run-event"),
        Some("1"),
        "{:?}",
        got.headers
    );
    let runs: Value = serde_json::from_slice(&got.body).unwrap();
    let runs = runs["train_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{runs:?}");
    for r in runs {
        assert_ne!(r["id"], ONLY);
        for k in ["name", "job_id", "controller_actor_id", "status"] {
            assert!(r[k].is_string(), "{k} of {}", r["id"]);
        }
        assert!(r["start_time_ns"].is_i64(), "start of {}", r["id"]);
    }
}

/// A big Train session as Ray writes it: `runs` runs of `attempts` attempts of `workers`
/// workers each (every attempt `PENDING`, `RUNNING`, then `ERRORED` or, the last,
/// `FINISHED`; each run through its status cycle), as export lines.
fn big_session(runs: usize, attempts: usize, workers: usize) -> String {
    let events: Vec<Value> = TRAIN
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let run_t = events
        .iter()
        .rfind(|e| e["source_type"] == "EXPORT_TRAIN_RUN")
        .unwrap();
    let att_t = events
        .iter()
        .rfind(|e| e["source_type"] == "EXPORT_TRAIN_RUN_ATTEMPT")
        .unwrap();
    let worker_t = att_t["event_data"]["workers"][0].clone();
    let mut out = String::new();
    let mut n = 0u64;
    let mut push = |t: &Value, data: Value, ts: u64| {
        n += 1;
        let mut e = t.clone();
        e["event_id"] = json!(format!("{n:036x}"));
        e["timestamp"] = json!(ts);
        e["event_data"] = data;
        out.push_str(&e.to_string());
        out.push('\n');
    };
    const BASE: u64 = 1_795_313_305;
    for r in 0..runs {
        let id = format!("{r:032x}");
        let t0 = BASE + r as u64 * 100;
        let mut rd = run_t["event_data"].clone();
        rd["id"] = json!(id);
        rd["name"] = json!(format!("run-{r}"));
        rd["start_time_ns"] = json!((t0 * 1_000_000_000).to_string());
        rd.as_object_mut().unwrap().remove("end_time_ns");
        let run = |status: &str, ts: u64, end: bool| {
            let mut d = rd.clone();
            d["status"] = json!(status);
            if end {
                d["end_time_ns"] = json!((ts * 1_000_000_000).to_string());
            }
            d
        };
        push(run_t, run("INITIALIZING", t0, false), t0);
        for a in 0..attempts {
            let ta = t0 + 1 + a as u64 * 20;
            push(run_t, run("SCHEDULING", ta, false), ta);
            let mut ad = json!({
                "schema_version": 4, "run_id": id, "attempt_id": format!("{r:016x}{a:016x}"),
                "status": "PENDING", "start_time_ns": (ta * 1_000_000_000).to_string(),
                "resources": vec![json!({"resources": {"CPU": 1.0}}); workers],
                "workers": [], "ray_train_version": 2,
            });
            push(att_t, ad.clone(), ta);
            let ws: Vec<Value> = (0..workers)
                .map(|k| {
                    let mut w = worker_t.clone();
                    w["world_rank"] = json!(k);
                    w["local_rank"] = json!(k % 8);
                    w["node_rank"] = json!(k / 8);
                    w["pid"] = json!(10_000 + k);
                    w["status"] = json!("ALIVE");
                    w["log_file_path"] = json!(format!(
                        "/tmp/ray/session/logs/train/worker-{r}-{a}-{k}.log"
                    ));
                    w
                })
                .collect();
            ad["status"] = json!("RUNNING");
            ad["workers"] = json!(ws);
            push(att_t, ad.clone(), ta + 2);
            push(run_t, run("RUNNING", ta + 3, false), ta + 3);
            let last = a + 1 == attempts;
            ad["status"] = json!(if last { "FINISHED" } else { "ERRORED" });
            if !last {
                ad["status_detail"] = json!(format!(
                    "Worker rank {a} failed: {}",
                    "trace line\n".repeat(50)
                ));
                push(run_t, run("RESTARTING", ta + 14, false), ta + 14);
            }
            ad["end_time_ns"] = json!(((ta + 15) * 1_000_000_000).to_string());
            for w in ad["workers"].as_array_mut().unwrap() {
                w["status"] = json!("DEAD");
            }
            push(att_t, ad, ta + 15);
        }
        let end = t0 + 1 + attempts as u64 * 20;
        push(run_t, run("FINISHED", end, true), end);
    }
    out
}

/// Issue 37 (r37i D5): building the Train answer of a big session (100 runs of 4 attempts
/// of 64 workers) takes seconds; it runs off serve's async workers, so `/livez` answers
/// promptly while four requests wait for such an answer being built (built on the async
/// workers, it waited 16 s in the debug build). The bound is generous: it tells a blocked runtime, not a
/// slow machine.
#[test]
fn livez_answers_while_big_train_answers_are_built() {
    let work = tempfile::tempdir().unwrap();
    let store = collect(work.path(), SESSION_A, "train", &big_session(100, 4, 64));
    let served = Served::start(work.path(), &store, "train", SESSION_A);
    let url = format!("http://127.0.0.1:{}{RUNS_URI}", served.serve.port);
    let cookie = served.cookie();
    // The session loaded first (another route), so that the requests below wait for the
    // Train answer's build, not for the load.
    served.load_session();
    let worst = std::thread::scope(|s| {
        let builds: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let got = try_http_request_within(
                        "GET",
                        &url,
                        &[("Cookie", cookie.as_str())],
                        b"",
                        Duration::from_secs(300),
                    )
                    .unwrap();
                    assert_eq!(got.status, 200);
                    let runs: Value = serde_json::from_slice(&got.body).unwrap();
                    assert_eq!(runs["train_runs"].as_array().map(Vec::len), Some(100));
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let mut worst = Duration::ZERO;
        for _ in 0..5 {
            if builds.iter().all(|b| b.is_finished()) {
                break;
            }
            let started = std::time::Instant::now();
            let livez = try_http_request_within(
                "GET",
                &format!("http://127.0.0.1:{}/livez", served.serve.port),
                &[],
                b"",
                Duration::from_secs(120),
            )
            .unwrap();
            assert_eq!(livez.status, 200);
            eprintln!("/livez in {:?}", started.elapsed());
            worst = worst.max(started.elapsed());
            std::thread::sleep(Duration::from_millis(200));
        }
        for b in builds {
            b.join().unwrap();
        }
        worst
    });
    assert!(
        worst < Duration::from_secs(3),
        "/livez took {worst:?} while Train answers were built"
    );
}

/// Issue 37 (review of r37j D1's fix): requests for a session's Train answer that come while
/// it is built share that one build, and the clients that leave do not stop it. Eight
/// requests for a big session's answer at once, six of whose clients leave after 300 ms (the
/// build takes seconds in the debug build): the two that stay get the same answer, a request
/// after them gets it again, and one answer was built (`rhc_serve_train_answer_builds_total`
/// and the log's lines; each request built its own, one after another, before). Once the
/// session is loaded again (a new index), the answer is built again.
#[test]
fn concurrent_train_requests_share_one_build() {
    use std::io::Write as _;
    let work = tempfile::tempdir().unwrap();
    let store = collect(work.path(), SESSION_A, "train", &big_session(100, 4, 64));
    let served = Served::start(work.path(), &store, "train", SESSION_A);
    let port = served.serve.port;
    let url = format!("http://127.0.0.1:{port}{RUNS_URI}");
    let cookie = served.cookie();
    served.load_session();
    const BUILDS: &str = "rhc_serve_train_answer_builds_total";
    assert_eq!(served.metric(BUILDS), 0);
    let started = std::time::Instant::now();
    let bodies: Vec<Vec<u8>> = std::thread::scope(|s| {
        let requests: Vec<_> = (0..8)
            .map(|i| {
                let (url, cookie) = (&url, &cookie);
                s.spawn(move || {
                    if i % 4 == 0 {
                        // Stays for the answer.
                        let got = try_http_request_within(
                            "GET",
                            url,
                            &[("Cookie", cookie.as_str())],
                            b"",
                            Duration::from_secs(300),
                        )
                        .unwrap();
                        assert_eq!(got.status, 200);
                        Some(got.body)
                    } else {
                        // Asks, then leaves before the answer is built.
                        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                        write!(
                            c,
                            "GET {RUNS_URI} HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: {cookie}\r\n\r\n"
                        )
                        .unwrap();
                        std::thread::sleep(Duration::from_millis(300));
                        None
                    }
                })
            })
            .collect();
        requests
            .into_iter()
            .filter_map(|r| r.join().unwrap())
            .collect()
    });
    assert_eq!(bodies.len(), 2);
    eprintln!(
        "eight requests answered in {:?}; the answer has {} bytes",
        started.elapsed(),
        bodies[0].len()
    );
    let runs: Value = serde_json::from_slice(&bodies[0]).unwrap();
    assert_eq!(runs["train_runs"].as_array().map(Vec::len), Some(100));
    assert!(bodies[0] == bodies[1], "the two answers differ");
    // The session unchanged: the answer kept answers the next request.
    let after = served.runs();
    assert!(after.body == bodies[0], "the answer after differs");
    let log = served.serve.log_text();
    assert_eq!(served.metric(BUILDS), 1, "{log}");
    assert_eq!(log.matches("Train runs answer built").count(), 1, "{log}");
    // The session loaded again (a new index, as when its objects change): built again.
    let reloaded = try_http_request_within(
        "GET",
        &format!("http://127.0.0.1:{port}/enter_cluster/default/raycluster/train/{SESSION_A}?reload=true"),
        &[("Cookie", cookie.as_str())],
        b"",
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(reloaded.status, 200);
    assert!(
        served.runs().body == bodies[0],
        "the answer after the reload differs"
    );
    assert_eq!(served.metric(BUILDS), 2, "{}", served.serve.log_text());
}

/// Issue 37 (r37j D2, D3). A run from Ray before 2.60 (no `run_settings`,
/// `framework_versions` nor `ray_train_version`; workers without `resources`) is in serve's
/// answer in the shape Ray 2.60's model requires, with protobuf's defaults where the event
/// has nothing, counted in a header (and, with `RHC_PYTHON`, the answer passes Ray's own
/// `TrainRunsResponse`). Two settings that differ only by invisible characters (a
/// bidirectional override, a zero-width space) show differently in `--compare-runs`.
#[test]
fn old_ray_runs_fit_rays_model_and_invisible_differences_show() {
    let work = tempfile::tempdir().unwrap();
    const OLD: &str = "d1000000000000000000000000000001";
    const RLO: &str = "d2000000000000000000000000000002";
    const LRO: &str = "d3000000000000000000000000000003";
    let old_ray = |e: &mut Value| {
        let d = e["event_data"].as_object_mut().unwrap();
        for k in ["run_settings", "framework_versions", "ray_train_version"] {
            d.remove(k);
        }
        for w in d
            .get_mut("workers")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            w.as_object_mut().unwrap().remove("resources");
        }
    };
    let tagged = |text: &'static str| {
        move |e: &mut Value| {
            if e["source_type"] == "EXPORT_TRAIN_RUN" {
                e["event_data"]["run_settings"]["train_loop_config"]["tag"] = json!(text);
            }
        }
    };
    let train = [
        variant(OLD, "1", true, &old_ray),
        variant(RLO, "2", true, &tagged("v\u{202e}1\u{200b}")),
        variant(LRO, "3", true, &tagged("v\u{202d}1\u{200c}")),
    ]
    .concat();
    let store = collect(work.path(), SESSION_A, "train", &train);
    let dir = store.to_str().unwrap();

    // D3: the two values print differently, each invisible character as an escape.
    let out = inspect(&[dir, "--session", SESSION_A, "--compare-runs", RLO, LRO]);
    assert_eq!(out.status.code(), Some(1), "{}{}", out.stdout, out.stderr);
    let value = |side: &str| {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("    {side}: ")))
            .unwrap_or_else(|| panic!("no {side} line in\n{}", out.stdout))
            .to_string()
    };
    let (a, b) = (value("A"), value("B"));
    assert_ne!(a, b, "A and B print alike:\n{}", out.stdout);
    assert!(a.contains("\\u202e") && a.contains("\\u200b"), "{a}");
    assert!(!out.stdout.contains('\u{202e}'), "{}", out.stdout);

    // D2: Ray's model requires settings and worker resources; protobuf's defaults are there.
    let served = Served::start(work.path(), &store, "train", SESSION_A);
    let got = served.runs();
    assert_eq!(
        got.header("x-rhc-train-runs-without-settings"),
        Some("1"),
        "{:?}",
        got.headers
    );
    let answer: Value = serde_json::from_slice(&got.body).unwrap();
    let run = answer["train_runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == OLD)
        .unwrap();
    let settings = &run["run_settings"];
    assert_eq!(settings["scaling_config"]["num_workers"], 0, "{settings}");
    assert_eq!(settings["run_config"]["storage_path"], "", "{settings}");
    assert_eq!(run["framework_versions"], json!({}));
    for w in run["attempts"][0]["workers"].as_array().unwrap() {
        assert_eq!(w["resources"], json!({"resources": {}}), "{w}");
    }
    if let Some(python) = rhc_testkit::services::tool("RHC_PYTHON") {
        let file = work.path().join("answer.json");
        std::fs::write(&file, &got.body).unwrap();
        let check = "import json, sys\n\
            from ray.train.v2._internal.state.schema import TrainRunsResponse\n\
            TrainRunsResponse.model_validate(json.load(open(sys.argv[1])))\n";
        let mut cmd = Command::new(python);
        cmd.args(["-c", check]).arg(&file);
        let out = run_with_timeout(&mut cmd, Duration::from_secs(120));
        assert!(out.status.success(), "Ray's model: {}", out.stderr);
    }
}

/// Ray's `TrainRunsResponse` model takes `body` (a `/api/train/v2/runs/v1` answer), where the
/// test setup installed Ray (`RHC_PYTHON`); `Err` with pydantic's words otherwise.
fn rays_model_takes(work: &Path, body: &[u8]) -> Result<(), String> {
    let Some(python) = rhc_testkit::services::tool("RHC_PYTHON") else {
        return Ok(());
    };
    let file = work.join("model-check.json");
    std::fs::write(&file, body).unwrap();
    let check = "import json, sys\n\
        from ray.train.v2._internal.state.schema import TrainRunsResponse\n\
        TrainRunsResponse.model_validate(json.load(open(sys.argv[1])))\n";
    let mut cmd = Command::new(python);
    cmd.args(["-c", check]).arg(&file);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(120));
    if out.status.success() {
        Ok(())
    } else {
        Err(out.stderr)
    }
}

/// The Train fixture and the other export files put through a collector that is also sent
/// `posts` (bodies of Ray's pushed events) while it runs.
fn collect_with_posts(work: &Path, session: &str, posts: &[Value]) -> PathBuf {
    let logs = work.join("ray").join(session).join("logs");
    let exports = logs.join("export_events");
    std::fs::create_dir_all(&exports).unwrap();
    std::fs::write(exports.join("event_EXPORT_TRAIN_STATE.log"), TRAIN).unwrap();
    for (name, lines) in [
        ("event_EXPORT_ACTOR.log", ACTOR),
        ("event_EXPORT_NODE.log", NODE),
    ] {
        std::fs::write(exports.join(name), lines).unwrap();
    }
    let store = work.join("store");
    let dashboard = format!("http://127.0.0.1:{}", rhc_testkit::services::free_port());
    let mut c = rhc_testkit::collector::Collector::start(
        &work.join("spool"),
        &[
            "--storage",
            store.to_str().unwrap(),
            "--cluster-name",
            "train",
            "--enable-export-events",
            "true",
            "--ray-tmp-dir",
            work.join("ray").to_str().unwrap(),
            "--dashboard-address",
            &dashboard,
        ],
        &[],
    );
    for body in posts {
        let r = c.post(body.to_string().as_bytes());
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "collector: {status}\n{}", c.log_text());
    store
}

/// A pushed driver job event of job 01000000 (the fixture's), camelCase as Ray sends it.
fn driver_event(id: &str, kind: &str, data: Value) -> Value {
    let field = if kind == "DRIVER_JOB_DEFINITION_EVENT" {
        "driverJobDefinitionEvent"
    } else {
        "driverJobLifecycleEvent"
    };
    json!({"eventId": id, "sourceType": "GCS", "eventType": kind,
        "timestamp": "2026-11-22T02:08:22.138000000Z", "severity": "INFO",
        "sessionName": SESSION_A, "nodeId": "9tJ29Oj97mDPP2K44BMLBA8MV4j1E4Z03Cdxng==",
        "message": "", field: data})
}

/// Issue 37 (r37k D4): a run's job known only from Ray's pushed lifecycle events (its
/// definition, with the entrypoint, not received), or only from its definition (no
/// lifecycle): Ray's `JobDetails` requires `entrypoint` and `status`, and a null in either
/// made its model reject serve's whole answer. The entrypoint is then `""` (the job table's
/// empty value) and the status follows Ray's head's rule (`SUCCEEDED` once the end is
/// recorded, else `RUNNING`).
#[test]
fn job_details_fit_rays_model_when_the_driver_events_say_little() {
    let work = tempfile::tempdir().unwrap();
    let life = |id: &str, state: &str, ts: &str| {
        driver_event(
            id,
            "DRIVER_JOB_LIFECYCLE_EVENT",
            json!({"jobId": "AQAAAA==", "stateTransitions": [{"state": state, "timestamp": ts}]}),
        )
    };
    let lifecycle_only = json!([
        life(
            "xqv0rnASnMtWaDLLBD0BTZYPEFHGtmG7xLKn7g==",
            "CREATED",
            "2026-11-22T02:08:22.138Z"
        ),
        life(
            "AnhWADdxAH4vqmjER1OPGt68NW0P6FFadY39kQ==",
            "FINISHED",
            "2026-11-22T02:08:46.067Z"
        ),
    ]);
    let definition_only = json!([driver_event(
        "+RXlONDI3funqaYJHjQddnkWNuwp+4PCxPE5IQ==",
        "DRIVER_JOB_DEFINITION_EVENT",
        json!({"jobId": "AQAAAA==", "driverPid": "24326",
            "driverNodeId": "9tJ29Oj97mDPP2K44BMLBA8MV4j1E4Z03Cdxng==",
            "entrypoint": "python job4.py",
            "config": {"serializedRuntimeEnv": "{}", "metadata": {}}}),
    )]);
    for (name, posts, entrypoint, status) in [
        ("lifecycle", lifecycle_only, "", "SUCCEEDED"),
        ("definition", definition_only, "python job4.py", "RUNNING"),
    ] {
        let dir = work.path().join(name);
        let store = collect_with_posts(&dir, SESSION_A, &[posts]);
        let served = Served::start(&dir, &store, "train", SESSION_A);
        let got = served.runs();
        assert_eq!(got.status, 200, "{name}");
        let answer: Value = serde_json::from_slice(&got.body).unwrap();
        let job = &answer["train_runs"][0]["job_details"];
        assert_eq!(job["entrypoint"], entrypoint, "{name}: {job}");
        assert_eq!(job["status"], status, "{name}: {job}");
        if let Err(e) = rays_model_takes(&dir, &got.body) {
            panic!("{name}: Ray's model rejects the answer: {e}\n{job}");
        }
    }
}

/// Issue 37 (r37k D1-D3, r37l D3-D4): `framework_versions` is kept whole (a value that is
/// not a map too) (a value past 512 bytes is not
/// cut, so two runs that differ there compare different; a value that is not a string is
/// not dropped, and serve gives it as its JSON text, as Ray's model takes only strings);
/// `--compare-runs --json` tells a member Ray sent as `null` from one it did not send; an
/// unknown member beside a worker's `resources.resources` shows in the `--train-run` text.
#[test]
fn framework_versions_whole_null_apart_from_absent_and_resource_members_shown() {
    let work = tempfile::tempdir().unwrap();
    const LONG_A: &str = "e1000000000000000000000000000001";
    const LONG_B: &str = "e2000000000000000000000000000002";
    let long = |last: &'static str| {
        move |e: &mut Value| {
            let is_run = e["source_type"] == "EXPORT_TRAIN_RUN";
            let d = &mut e["event_data"];
            if is_run {
                d["framework_versions"]["mylib"] = json!(format!("{}{last}", "9".repeat(604)));
                d["framework_versions"]["cuda"] = json!({"runtime": "12.4", "driver": 550});
                if last == "a" {
                    d["run_settings"]["train_loop_config"]["seed"] = Value::Null;
                }
            } else {
                for w in d["workers"].as_array_mut().unwrap() {
                    w["resources"]["pinned_by"] = json!("WRESVAL5");
                }
            }
        }
    };
    // r37l D3, D4: versions that are not a map; a worker's resources past a table cell.
    const ODD: &str = "e3000000000000000000000000000003";
    let odd = |e: &mut Value| {
        if e["source_type"] == "EXPORT_TRAIN_RUN" {
            e["event_data"]["framework_versions"] = json!("torch==2.1.0");
        } else {
            for w in e["event_data"]["workers"].as_array_mut().unwrap() {
                for n in 0..12 {
                    w["resources"]["resources"][format!("custom_resource_{n}")] = json!(1.0);
                }
                w["resources"]["resources"]["node:10.0.0.12"] = json!(0.001);
            }
        }
    };
    let train = [
        variant(LONG_A, "1", true, &long("a")),
        variant(LONG_B, "2", true, &long("b")),
        variant(ODD, "3", true, &odd),
    ]
    .concat();
    let store = collect(work.path(), SESSION_A, "train", &train);
    let dir = store.to_str().unwrap();

    let out = inspect(&[
        dir,
        "--session",
        SESSION_A,
        "--compare-runs",
        LONG_A,
        LONG_B,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}{}", out.stdout, out.stderr);
    let cmp: Value = serde_json::from_str(&out.stdout).unwrap();
    let diffs = cmp["differences"].as_array().unwrap();
    let at = |path: &str| {
        diffs
            .iter()
            .find(|d| d["path"] == path)
            .unwrap_or_else(|| panic!("no difference at {path}: {diffs:?}"))
    };
    assert_eq!(
        at("framework_versions.mylib")["a"].as_str().unwrap().len(),
        605
    );
    let seed = at("train_loop_config.seed").as_object().unwrap();
    assert_eq!(seed.get("a"), Some(&Value::Null), "{seed:?}");
    assert!(!seed.contains_key("b"), "b was not sent: {seed:?}");

    let out = inspect(&[dir, "--session", SESSION_A, "--train-run", LONG_A]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.contains("WRESVAL5"), "{}", out.stdout);
    assert!(out.stdout.contains("12.4"), "{}", out.stdout);
    let out = inspect(&[dir, "--session", SESSION_A, "--train-run", LONG_A, "--json"]);
    let run: Value = serde_json::from_str(&out.stdout).unwrap();
    let versions = &run["train_run"]["framework_versions"];
    assert_eq!(versions["mylib"].as_str().unwrap().len(), 605, "{versions}");
    assert_eq!(versions["cuda"]["driver"], 550, "{versions}");

    let out = inspect(&[dir, "--session", SESSION_A, "--compare-runs", ODD, LONG_A]);
    assert_eq!(out.status.code(), Some(1), "{}{}", out.stdout, out.stderr);
    let out = inspect(&[dir, "--session", SESSION_A, "--train-run", ODD]);
    assert!(out.stdout.contains("torch==2.1.0"), "{}", out.stdout);
    assert!(out.stdout.contains("node:10.0.0.12"), "{}", out.stdout);

    let served = Served::start(work.path(), &store, "train", SESSION_A);
    let got = served.runs();
    let answer: Value = serde_json::from_slice(&got.body).unwrap();
    let run = answer["train_runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == LONG_A)
        .unwrap();
    assert_eq!(
        run["framework_versions"]["mylib"].as_str().unwrap().len(),
        605
    );
    let cuda: Value =
        serde_json::from_str(run["framework_versions"]["cuda"].as_str().unwrap()).unwrap();
    assert_eq!(cuda, json!({"runtime": "12.4", "driver": 550}));
    if let Err(e) = rays_model_takes(work.path(), &got.body) {
        panic!("Ray's model rejects the answer: {e}");
    }
}

/// Where a session's stored snapshot of `uri` is, under the session's directory.
fn snapshot_rel(uri: &str) -> String {
    format!("{FETCHED_ENDPOINTS_DIR}/{}", endpoint_object_name(uri))
}

/// A [`ServeRig`] whose sessions are copies of [`SESSION_A`] (cluster `train`, the fixture's
/// events); `None` when moto is not installed (the test is skipped).
fn serve_rig() -> Option<ServeRig> {
    let mut rig = ServeRig::new("train")?;
    let store = collect_with(rig.tmp.path(), SESSION_A, "train", TRAIN, &[]);
    rig.template(&store, SESSION_A);
    Some(rig)
}

/// The `n`th of many sessions (none is one of the named ones).
fn session_n(n: usize) -> String {
    format!(
        "session_2026-{:02}-{:02}_02-08-16_569038_24326",
        6 + n / 28,
        1 + n % 28
    )
}

/// A Train snapshot with no runs.
const NO_RUNS: &[u8] = br#"{"train_runs": []}"#;

/// Review r37n D1: Train snapshot reads held by a slow store (here eight sessions', each GET
/// held 30 s) hold no other session's answers: a session without a snapshot gets its Train
/// runs, a session with a small snapshot its Train runs and its replayed
/// `/api/v0/cluster_metadata`, each within seconds. Before, the eight reads held the Train
/// builds' permits (the session without a snapshot waited 28 s) and serve's snapshot-read
/// permits (every session's replayed snapshots waited 28 s behind four).
#[test]
fn slow_train_snapshot_reads_hold_no_other_sessions_answers() {
    const STALL: Duration = Duration::from_secs(30);
    let Some(mut rig) = serve_rig() else { return };
    let stalled: Vec<String> = (0..8).map(session_n).collect();
    let stalled: Vec<&str> = stalled.iter().map(String::as_str).collect();
    let (without, with) = (SESSION_B, SESSION_E);
    let runs = snapshot_rel(RUNS_URI);
    for session in &stalled {
        rig.add_session(session, &[(&runs, NO_RUNS)]);
    }
    rig.add_session(without, &[]);
    rig.add_session(
        with,
        &[
            (&runs, NO_RUNS),
            (
                &snapshot_rel("/api/v0/cluster_metadata"),
                br#"{"result":true,"msg":"","data":{"rayVersion":"2.60.0"}}"#,
            ),
        ],
    );
    rig.serve();
    let cookies = rig.enter(&stalled);
    let (cookie_without, cookie_with) = {
        let c = rig.enter(&[without, with]);
        (c[0].clone(), c[1].clone())
    };
    // From now on, every object of the stalled sessions is held at every GET.
    for session in &stalled {
        rig.stall(session, "", STALL);
    }
    let rig = &rig;
    std::thread::scope(|s| {
        let stalled_requests: Vec<_> = cookies
            .iter()
            .map(|c| s.spawn(move || rig.ask(c, RUNS_URI, STALL * 4).0))
            .collect();
        // The stalled reads under way (main's binary let four through at a time).
        rig.wait_gets(&stalled, "", 4, Duration::from_secs(20));
        std::thread::sleep(Duration::from_secs(1));
        for (what, cookie, uri) in [
            ("Train runs without a snapshot", &cookie_without, RUNS_URI),
            ("Train runs with a small snapshot", &cookie_with, RUNS_URI),
            (
                "a replayed snapshot",
                &cookie_with,
                "/api/v0/cluster_metadata",
            ),
        ] {
            let (got, took) = rig.ask(cookie, uri, Duration::from_secs(60));
            let got = got.unwrap_or_else(|e| {
                panic!("{what}: no answer after {took:?} while eight Train snapshot reads were held: {e}")
            });
            assert_eq!(got, 200, "{what}");
            assert!(
                took < Duration::from_secs(10),
                "{what} took {took:?} while eight Train snapshot reads were held"
            );
        }
        for r in stalled_requests {
            assert_eq!(r.join().unwrap().unwrap(), 200);
        }
    });
}

/// Review r37q D1: a big Train snapshot waiting for room in the snapshot budget holds back
/// no small one the room left covers. Four sessions' 60 MiB snapshots are read through a
/// store that holds each GET 15 s (240 MiB of the 256 MiB budget, 16 MiB left); a session's
/// 20 MiB snapshot then waits for room, and 5.5 s later a session's small snapshot is
/// answered within 2 s. Before, the big read, queued after 5 s in tokio's semaphore, was given the
/// 16 MiB free and held it while it waited for the rest, and the small one waited until the
/// stalled reads ended. The stalled sessions' clients left after 3 s, and the big one is
/// answered once their reads have had nobody for the grace (`ABANDONED_READ_GRACE`, 5 s),
/// well before the stalled reads end (review r37q D2: before, an abandoned build held its
/// room for its whole stalled read).
#[test]
fn a_big_train_snapshot_waiting_for_room_holds_back_no_small_one() {
    const STALL: Duration = Duration::from_secs(15);
    // The stalled sessions' clients leave then (with the 5 s grace, their reads give their
    // room up at 8 s, after the small session's ask at 5.5 s; they left at 7 s before the
    // grace applied to room, review r37v D1).
    const LEAVE_AFTER: Duration = Duration::from_secs(3);
    let Some(mut rig) = serve_rig() else { return };
    let stalled: Vec<String> = (0..4).map(session_n).collect();
    let stalled: Vec<&str> = stalled.iter().map(String::as_str).collect();
    let (big, small) = (SESSION_B, SESSION_E);
    let runs = snapshot_rel(RUNS_URI);
    // A Train answer with no runs, padded with blanks to `mib` MiB (still JSON).
    let padded = |mib: usize| {
        let mut body = NO_RUNS.to_vec();
        body.resize(mib << 20, b' ');
        body
    };
    let sixty = padded(60);
    for session in &stalled {
        rig.add_session(session, &[(&runs, &sixty)]);
    }
    drop(sixty);
    rig.add_session(big, &[(&runs, &padded(20))]);
    rig.add_session(small, &[(&runs, NO_RUNS)]);
    rig.serve();
    let stalled_cookies = rig.enter(&stalled);
    let (big_cookie, small_cookie) = {
        let c = rig.enter(&[big, small]);
        (c[0].clone(), c[1].clone())
    };
    // From now on, the stalled sessions' snapshot GETs are held (only those).
    for session in &stalled {
        rig.stall(session, &runs, STALL);
    }
    let rig = &rig;
    std::thread::scope(|s| {
        let stalled_requests: Vec<_> = stalled_cookies
            .iter()
            .map(|c| s.spawn(|| rig.ask(c, RUNS_URI, LEAVE_AFTER)))
            .collect();
        rig.wait_gets(&stalled, &runs, 4, Duration::from_secs(10));
        let big_request = s.spawn(|| rig.ask(&big_cookie, RUNS_URI, STALL * 2));
        // Past the 5 s after which main's binary queued the big read in its semaphore.
        std::thread::sleep(Duration::from_millis(5500));
        let (status, took) = rig.ask(&small_cookie, RUNS_URI, STALL * 2);
        assert_eq!(status.ok(), Some(200), "the small snapshot's session");
        assert!(
            took < Duration::from_secs(2),
            "a small snapshot took {took:?} while a 20 MiB one waited for room behind stalled reads"
        );
        for r in stalled_requests {
            assert!(
                r.join().unwrap().0.is_err(),
                "the stalled sessions' clients left"
            );
        }
        // Their builds let go of the room after the grace (review r37q D2), not when the
        // stalled reads end.
        let (status, took) = big_request.join().unwrap();
        assert_eq!(
            status.ok(),
            Some(200),
            "the big snapshot's session, after {took:?}"
        );
        assert!(
            took < STALL - Duration::from_secs(3),
            "the big snapshot took {took:?}: the abandoned builds kept their room"
        );
    });
    // A client that leaves while the read is under way, and nobody else waits for room: the
    // read goes on, and the same client asking again joins it (review r37r D1: the read was
    // given up when its client left, and a client whose timeout is shorter than the read was
    // never answered however often it asked).
    let before = rig.gets(stalled[0], &runs);
    let started = std::time::Instant::now();
    let (first, _) = rig.ask(&stalled_cookies[0], RUNS_URI, Duration::from_secs(2));
    assert!(
        first.is_err(),
        "the first ask left before the stalled read ended"
    );
    let (status, _) = rig.ask(&stalled_cookies[0], RUNS_URI, STALL * 2);
    assert_eq!(status.ok(), Some(200), "{}", rig.served().log_text());
    // One read (or none: the second ask may join a read of the first part still under way).
    assert!(
        rig.gets(stalled[0], &runs) - before <= 1,
        "the snapshot was read again for the second ask"
    );
    assert!(
        started.elapsed() < STALL + Duration::from_millis(1500),
        "answered after {:?}",
        started.elapsed()
    );
}

/// Review r37s D1: reads nobody waits for give up their slot of the builds under way to a
/// session that waits for one, after a grace. 32 sessions' Train snapshot GETs are held 30 s;
/// each session's client asks once, leaves after 2 s, and does not come back: their 32 reads
/// hold every slot. A session with no snapshot (built from its events alone) is then answered
/// within a few seconds: once the abandoned reads have had nobody for
/// `ABANDONED_READ_GRACE` (5 s), they give their slots up. Before, it waited for the stalled
/// reads to end (36 s in the review).
#[test]
fn abandoned_stalled_reads_give_their_slots_to_a_waiting_session() {
    const STALL: Duration = Duration::from_secs(30);
    let Some(mut rig) = serve_rig() else { return };
    let stalled: Vec<String> = (0..32).map(session_n).collect();
    let stalled: Vec<&str> = stalled.iter().map(String::as_str).collect();
    let runs = snapshot_rel(RUNS_URI);
    for session in &stalled {
        rig.add_session(session, &[(&runs, NO_RUNS)]);
    }
    rig.add_session(SESSION_B, &[]);
    rig.serve();
    let mut cookies = rig.enter(&[&stalled[..], &[SESSION_B]].concat());
    let without = cookies.pop().unwrap();
    for session in &stalled {
        rig.stall(session, &runs, STALL);
    }
    let rig = &rig;
    std::thread::scope(|s| {
        for c in &cookies {
            s.spawn(move || {
                let (got, _) = rig.ask(c, RUNS_URI, Duration::from_secs(2));
                assert!(got.is_err(), "answered while its snapshot's GET was held");
            });
        }
    });
    assert_eq!(
        stalled.iter().map(|s| rig.gets(s, &runs)).sum::<usize>(),
        32,
        "the 32 reads under way"
    );
    let (got, took) = rig.ask(&without, RUNS_URI, Duration::from_secs(15));
    let got = got.unwrap_or_else(|e| {
        panic!("the session without a snapshot: no answer after {took:?} behind 32 abandoned reads: {e}")
    });
    assert_eq!(got, 200);
    eprintln!("the session without a snapshot answered after {took:?}");
    assert!(
        took < Duration::from_secs(8),
        "the session without a snapshot took {took:?} behind 32 abandoned reads"
    );
}

/// Review r37s D2: a client whose timeout (2 s) is shorter than the snapshot's read (held
/// 7 s), asking again after a 2 s pause each time, is answered at the first ask after the
/// read ended, and the snapshot was read once: the read that ended while the client was
/// away is built and kept. Before, it was thrown away and read again at the next ask, which
/// ended in the client's next pause, and so on: the client was never answered.
#[test]
fn a_client_asking_again_after_a_pause_is_answered_from_the_read_that_ended() {
    const STALL: Duration = Duration::from_secs(7);
    let Some(mut rig) = serve_rig() else { return };
    let runs = snapshot_rel(RUNS_URI);
    rig.add_session(SESSION_E, &[(&runs, NO_RUNS)]);
    rig.serve();
    let cookie = rig.enter(&[SESSION_E]).remove(0);
    rig.stall(SESSION_E, &runs, STALL);
    let started = std::time::Instant::now();
    let two = Duration::from_secs(2);
    let (status, asked) = rig.ask_until_answered(&cookie, RUNS_URI, two, two, started + STALL * 2);
    let took = started.elapsed();
    let gets = rig.gets(SESSION_E, &runs);
    assert_eq!(
        status,
        Some(200),
        "not answered in {took:?}: asked {asked} times, {gets} GETs of the snapshot"
    );
    assert_eq!(gets, 1, "the snapshot read again ({asked} asks, {took:?})");
    assert!(
        took < STALL + Duration::from_secs(3),
        "answered after {took:?} ({asked} asks)"
    );
}

/// Review r37t: 40 sessions (more than the 32 builds under way), each client asking with a
/// 2 s timeout and again after a pause of 0.25 to 0.95 s until answered, while every
/// snapshot GET is held 8 s: every client is answered within about two reads' time (the
/// eight sessions past the 32 slots wait for the first reads), and each snapshot is read at
/// most twice. Reads whose clients are between two asks keep their slot
/// (they are within `ABANDONED_READ_GRACE`) and a read that ends then is kept for the next
/// ask. A fix of r37s D1 that gave those reads up whenever every slot was taken started them
/// over in a loop (5 of 40 answered in 90 s, 1,085 GETs); main's binary throws away each
/// read that ends between two asks (r37s D2) and reads it again.
#[test]
fn forty_sessions_asking_again_within_their_reads_are_all_answered() {
    const STALL: Duration = Duration::from_secs(8);
    let Some(mut rig) = serve_rig() else { return };
    let sessions: Vec<String> = (0..40).map(session_n).collect();
    let sessions: Vec<&str> = sessions.iter().map(String::as_str).collect();
    let runs = snapshot_rel(RUNS_URI);
    for session in &sessions {
        rig.add_session(session, &[(&runs, NO_RUNS)]);
    }
    rig.serve();
    let cookies = rig.enter(&sessions);
    for session in &sessions {
        rig.stall(session, &runs, STALL);
    }
    let started = std::time::Instant::now();
    let deadline = started + STALL * 3;
    let rig = &rig;
    let outcomes: Vec<(Option<u16>, usize, Duration)> = std::thread::scope(|s| {
        let clients: Vec<_> = cookies
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let pause = Duration::from_millis(250 + 100 * (i as u64 % 8));
                s.spawn(move || {
                    let (status, asked) = rig.ask_until_answered(
                        c,
                        RUNS_URI,
                        Duration::from_secs(2),
                        pause,
                        deadline,
                    );
                    (status, asked, started.elapsed())
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let gets: Vec<usize> = sessions.iter().map(|s| rig.gets(s, &runs)).collect();
    let answered = outcomes.iter().filter(|o| o.0 == Some(200)).count();
    let last = outcomes.iter().map(|o| o.2).max().unwrap_or_default();
    eprintln!(
        "{answered} of 40 answered, the last after {last:?}; {} GETs (at most {} a session)",
        gets.iter().sum::<usize>(),
        gets.iter().max().unwrap_or(&0)
    );
    assert_eq!(answered, 40, "{outcomes:?}");
    assert!(
        gets.iter().all(|&n| n <= 2),
        "a snapshot read more than twice: {gets:?}"
    );
    assert!(
        last < STALL * 2 + Duration::from_secs(6),
        "the last answered after {last:?}"
    );
}

/// Review r37v D1: more sessions than the Train snapshot room holds (here the room is shrunk
/// to 2.5 MiB with `RHC_TEST_TRAIN_SNAPSHOTS_KIB`, and eight sessions' 1 MiB snapshots are
/// read, two at a time), every snapshot GET held 3 s, each client asking with a 2 s timeout
/// and again 1 s later until answered: all eight are answered in about four reads' time,
/// each snapshot read once. A read whose client is between two asks keeps its room for the grace
/// (`ABANDONED_READ_GRACE`, 5 s), and a read that ended then is built and kept for its
/// client's next ask. Before, a read nobody waited for gave its room up at once whenever
/// another read waited for room, also once its bytes were in hand, so each client's return
/// restarted another's read, in a loop (r37v, at full size: 3 of 10 answered in 60 s, 122
/// GETs).
#[test]
fn clients_asking_again_keep_their_snapshot_room_between_asks() {
    const STALL: Duration = Duration::from_secs(3);
    const SESSIONS: usize = 8;
    let Some(mut rig) = serve_rig() else { return };
    let sessions: Vec<String> = (0..SESSIONS).map(session_n).collect();
    let sessions: Vec<&str> = sessions.iter().map(String::as_str).collect();
    let runs = snapshot_rel(RUNS_URI);
    let mut one_mib = NO_RUNS.to_vec();
    one_mib.resize(1 << 20, b' ');
    for session in &sessions {
        rig.add_session(session, &[(&runs, &one_mib)]);
    }
    rig.serve_with(&[("RHC_TEST_TRAIN_SNAPSHOTS_KIB", "2560")]);
    let cookies = rig.enter(&sessions);
    for session in &sessions {
        rig.stall(session, &runs, STALL);
    }
    let started = std::time::Instant::now();
    let deadline = started + STALL * 8;
    let rig = &rig;
    let outcomes: Vec<(Option<u16>, usize, Duration)> = std::thread::scope(|s| {
        let clients: Vec<_> = cookies
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let (status, asked) = rig.ask_until_answered(
                        c,
                        RUNS_URI,
                        Duration::from_secs(2),
                        Duration::from_secs(1),
                        deadline,
                    );
                    (status, asked, started.elapsed())
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let gets: Vec<usize> = sessions.iter().map(|s| rig.gets(s, &runs)).collect();
    let answered = outcomes.iter().filter(|o| o.0 == Some(200)).count();
    let last = outcomes.iter().map(|o| o.2).max().unwrap_or_default();
    eprintln!("{answered} of {SESSIONS} answered, the last after {last:?}; GETs {gets:?}");
    assert_eq!(answered, SESSIONS, "{outcomes:?}, GETs {gets:?}");
    assert!(
        gets.iter().all(|&n| n == 1),
        "a snapshot read again: {gets:?}"
    );
}
