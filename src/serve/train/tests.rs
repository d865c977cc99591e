//! The unit tests of the Train route: the snapshot against the events, and the shape of
//! Ray's answer.

use serde_json::{json, Value};

use super::shape::*;
use super::*;

#[test]
fn a_snapshot_keeps_each_run_it_has_as_far_as_the_events() {
    let run = |status: &str, attempts: &[&str]| {
        json!({"id": "r1", "status": status, "start_time_ns": 1,
               "attempts": attempts.iter().map(|s| json!({"status": s})).collect::<Vec<_>>()})
    };
    let events = |r: Value| json!({"train_runs": [r]});
    let snapshot = |r: Value| json!({"train_runs": [r], "x": 1}).to_string();
    // Ray's head aborted it; the events stop at RUNNING: the snapshot is further.
    let stored = snapshot(run("ABORTED", &["RUNNING"]));
    assert_eq!(
        further_than_snapshot(
            stored.as_bytes(),
            &events(run("RUNNING", &["RUNNING"])),
            &[]
        ),
        None
    );
    // An attempt more, an attempt ended, the run ended: the events are further.
    for (older, newer) in [
        (
            run("RUNNING", &["RUNNING"]),
            run("RESTARTING", &["ERRORED", "RUNNING"]),
        ),
        (run("RUNNING", &["RUNNING"]), run("RUNNING", &["FINISHED"])),
        (
            run("RUNNING", &["FINISHED"]),
            run("FINISHED", &["FINISHED"]),
        ),
    ] {
        let merged = further_than_snapshot(snapshot(older).as_bytes(), &events(newer.clone()), &[]);
        let merged = merged.unwrap();
        assert_eq!(merged["train_runs"][0]["status"], newer["status"]);
        assert_eq!(merged["x"], 1);
    }
    // Not Ray's shape (an error text): the events' runs, when there are some.
    let e = events(run("FINISHED", &[]));
    assert_eq!(
        further_than_snapshot(b"Train state data is not available", &e, &[]),
        Some(e)
    );
    assert_eq!(
        further_than_snapshot(b"error", &json!({"train_runs": []}), &[]),
        None
    );
}

/// A run in Ray's shape: its status, and its attempts' statuses and worker counts.
fn shaped(status: &str, attempts: &[(&str, usize)]) -> Value {
    let attempts: Vec<Value> = attempts
        .iter()
        .enumerate()
        .map(|(i, (s, workers))| {
            json!({"status": s, "start_time_ns": 10 * i as i64 + 1,
                   "end_time_ns": TERMINAL.contains(s).then_some(10 * i as i64 + 5),
                   "workers": vec![json!({}); *workers]})
        })
        .collect();
    json!({"id": "r1", "status": status, "start_time_ns": 0, "attempts": attempts,
           "job_details": null})
}

#[test]
fn a_run_goes_further_through_rays_cycle_of_attempts() {
    // Ray 2.60's controller, with a worker failing once: each state after the one before.
    let steps = [
        (shaped("INITIALIZING", &[]), false),
        (shaped("SCHEDULING", &[]), false),
        (shaped("SCHEDULING", &[("PENDING", 0)]), false),
        (shaped("SCHEDULING", &[("RUNNING", 2)]), false),
        (shaped("RUNNING", &[("RUNNING", 2)]), false),
        (shaped("RESTARTING", &[("RUNNING", 2)]), false),
        (shaped("SCHEDULING", &[("RUNNING", 2)]), true),
        (shaped("SCHEDULING", &[("ERRORED", 2)]), false),
        (
            shaped("SCHEDULING", &[("ERRORED", 2), ("PENDING", 0)]),
            false,
        ),
        (
            shaped("SCHEDULING", &[("ERRORED", 2), ("RUNNING", 2)]),
            false,
        ),
        (shaped("RUNNING", &[("ERRORED", 2), ("RUNNING", 2)]), false),
        (shaped("RUNNING", &[("ERRORED", 2), ("FINISHED", 2)]), false),
        (
            shaped("FINISHED", &[("ERRORED", 2), ("FINISHED", 2)]),
            false,
        ),
    ];
    for pair in steps.windows(2) {
        let ((before, _), (after, again)) = (&pair[0], &pair[1]);
        assert!(
            progress(after, *again) > progress(before, false),
            "{after} after {before}"
        );
        // The events further: theirs; as far: the snapshot, replayed.
        let snapshot = json!({"train_runs": [before]}).to_string();
        let events = json!({"train_runs": [after]});
        let again: Vec<String> = if *again { vec!["r1".into()] } else { vec![] };
        let merged = further_than_snapshot(snapshot.as_bytes(), &events, &again);
        assert_eq!(merged.unwrap()["train_runs"][0], *after);
        let same = json!({"train_runs": [after]}).to_string();
        assert_eq!(
            further_than_snapshot(same.as_bytes(), &events, &again),
            None
        );
        // The snapshot further (the events lost their end): the snapshot. Not told
        // apart: a snapshot `SCHEDULING` again after a restart, its attempt still
        // running, is taken for the `SCHEDULING` before `RUNNING` (the events win).
        if again.is_empty() {
            let ahead = json!({"train_runs": [after]}).to_string();
            let behind = json!({"train_runs": [before]});
            assert_eq!(further_than_snapshot(ahead.as_bytes(), &behind, &[]), None);
        }
    }
    // Same statuses, a later end time: further.
    let mut later = shaped("RUNNING", &[("ERRORED", 2)]);
    later["attempts"][0]["end_time_ns"] = json!(99);
    assert!(progress(&later, false) > progress(&shaped("RUNNING", &[("ERRORED", 2)]), false));
}

#[test]
fn the_events_history_tells_a_rescheduled_run() {
    use crate::reader::SessionFacts;
    let history = |statuses: &[&str]| {
        json!({"run_id": statuses.join("-"), "status_history":
               statuses.iter().map(|s| json!({"status": s})).collect::<Vec<_>>()})
    };
    let facts = SessionFacts {
        train_runs: vec![
            history(&["SCHEDULING", "RUNNING", "RESTARTING", "SCHEDULING"]),
            history(&["RUNNING", "RESIZING", "SCHEDULING"]),
            history(&["INITIALIZING", "SCHEDULING"]),
            history(&["SCHEDULING"]),
        ],
        ..SessionFacts::default()
    };
    let index = super::super::index::IndexBuilder::default().finish(facts);
    assert_eq!(
        rescheduled_runs(&index),
        [
            "SCHEDULING-RUNNING-RESTARTING-SCHEDULING",
            "RUNNING-RESIZING-SCHEDULING"
        ]
    );
}

#[test]
fn a_snapshot_answers_for_unreadable_events_not_for_a_load_under_way() {
    let snapshot = Bytes::from_static(b"{\"train_runs\": []}");
    let loading = (StatusCode::SERVICE_UNAVAILABLE, "still loading").into_response();
    let r = without_events(loading, snapshot.clone());
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().get(EVENTS_UNREADABLE_HEADER).is_none());
    let failed = (StatusCode::INTERNAL_SERVER_ERROR, "loading the session").into_response();
    let r = without_events(failed, snapshot);
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[EVENTS_UNREADABLE_HEADER], "true");
    assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
}

#[test]
fn times_come_back_to_the_nanosecond() {
    assert_eq!(
        unix_ns(&json!("2026-11-22T02:08:25.597485314Z")),
        Some(1_795_313_305_597_485_314)
    );
    assert_eq!(
        unix_ns(&json!("2026-11-22T02:08:25.5Z")),
        Some(1_795_313_305_500_000_000)
    );
    assert_eq!(
        unix_ns(&json!("2026-11-22T02:08:25Z")),
        Some(1_795_313_305_000_000_000)
    );
    assert_eq!(unix_ns(&json!("2026-11-22T02:08:25.1234567890Z")), None);
    assert_eq!(unix_ns(&Value::Null), None);
}

#[test]
fn settings_take_rays_names_and_keep_unknown_members() {
    let event = json!({
        "train_loop_config": {"lr": 0.01},
        "backend_config": {"config": {}, "framework": "TRAINING_FRAMEWORK_UNSPECIFIED"},
        "scaling_config": {"num_workers_fixed": 2, "placement_strategy": "PACK",
                           "use_gpu": false, "use_tpu": false,
                           "resources_per_worker": {"values": {"CPU": 1.0}},
                           "invented": {"deep": [1, 2]}},
        "data_config": {"all": {}, "enable_shard_locality": true},
        "run_config": {"name": "r", "checkpoint_config": {"checkpoint_score_order": "MAX",
                                                          "num_to_keep": "3"},
                       "storage_path": "/s"},
        "datasets": ["train"],
    });
    let ray = ray_settings(&event);
    assert_eq!(ray["backend_config"]["framework"], Value::Null);
    assert_eq!(ray["scaling_config"]["num_workers"], 2);
    assert!(ray["scaling_config"].get("num_workers_fixed").is_none());
    assert_eq!(
        ray["scaling_config"]["resources_per_worker"],
        json!({"CPU": 1.0})
    );
    assert_eq!(ray["scaling_config"]["accelerator_type"], Value::Null);
    assert_eq!(ray["scaling_config"]["bundle_label_selector"], Value::Null);
    assert_eq!(ray["scaling_config"]["invented"], json!({"deep": [1, 2]}));
    assert_eq!(ray["data_config"]["datasets_to_split"], "all");
    assert!(ray["data_config"].get("all").is_none());
    assert_eq!(
        ray["run_config"]["checkpoint_config"]["checkpoint_score_order"],
        "max"
    );
    assert_eq!(ray["run_config"]["checkpoint_config"]["num_to_keep"], 3);
    assert_eq!(ray["run_config"]["storage_filesystem"], Value::Null);
    assert_eq!(ray["datasets"], json!(["train"]));

    let event = json!({
        "backend_config": {"framework": "TORCH"},
        "scaling_config": {"num_workers_range": {"min": 1, "max": 4},
                           "label_selector_list": {"values": [{"values": {"a": "b"}}]}},
        "data_config": {"datasets": {"values": ["x", "y"]}},
    });
    let ray = ray_settings(&event);
    assert_eq!(ray["backend_config"]["framework"], "torch");
    assert_eq!(ray["scaling_config"]["num_workers"], json!([1, 4]));
    assert_eq!(
        ray["scaling_config"]["bundle_label_selector"],
        json!([{"a": "b"}])
    );
    assert_eq!(ray["data_config"]["datasets_to_split"], json!(["x", "y"]));
    assert_eq!(ray["train_loop_config"], Value::Null);
}

#[test]
fn job_details_name_the_driver_ip_and_leave_the_unknown_null() {
    use crate::reader::{JobFacts, NodeFacts, SessionFacts};
    let facts = SessionFacts {
        jobs: vec![JobFacts {
            job_id: "01000000".into(),
            state: "CREATED".into(),
            entrypoint: Some("python train.py".into()),
            driver_pid: Some(42),
            driver_node_id: Some("aa".into()),
            driver_ip: None,
            started: Some("2026-11-22T02:08:25.597485314Z".into()),
            ended: None,
            recorded: true,
            metadata: None,
            runtime_env: None,
            submission_id: None,
            submission: None,
            superseded: false,
        }],
        nodes: vec![NodeFacts {
            node_id: "aa".into(),
            ip: Some("10.0.0.7".into()),
            hostname: None,
            is_head: Some(true),
            state: None,
            started: None,
            ended: None,
            death_reason: None,
            death_message: None,
            resources: Default::default(),
        }],
        train_runs: vec![
            json!({"run_id": "old", "name": "o", "status": "FINISHED", "job_id": "01000000", "started": "2026-11-22T02:08:25Z"}),
            json!({"run_id": "new", "name": "n", "status": "RUNNING", "job_id": "02000000", "started": "2026-11-22T02:09:25Z"}),
            // Known only by its attempts: not in Ray's answer.
            json!({"run_id": "attempts-only", "name": null, "status": null, "attempts": []}),
        ],
        ..SessionFacts::default()
    };
    let index = super::super::index::IndexBuilder::default().finish(facts);
    let (answer, counts) = runs_response(&index);
    assert_eq!(counts.left_out, 1);
    assert_eq!(counts.unrecorded_settings, 2);
    let runs = answer["train_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["id"], "new", "newest first");
    assert_eq!(
        runs[0]["job_details"],
        Value::Null,
        "a job the session does not know"
    );
    let job = &runs[1]["job_details"];
    assert_eq!(job["driver_info"]["node_ip_address"], "10.0.0.7");
    assert_eq!(job["driver_info"]["pid"], "42");
    assert_eq!(job["status"], "RUNNING");
    assert_eq!(job["start_time"], 1_795_313_305_597_i64);
    assert_eq!(job["driver_exit_code"], Value::Null);
    assert_eq!(job["submission_id"], Value::Null);
    assert_eq!(job["entrypoint"], "python train.py");
}

#[test]
fn a_submitted_jobs_details_take_its_record() {
    use crate::reader::{JobFacts, SessionFacts, SubmissionFacts};
    let metadata: std::collections::BTreeMap<String, String> =
        [("job_submission_id".to_string(), "raysubmit_1".to_string())].into();
    let facts = SessionFacts {
        jobs: vec![JobFacts {
            job_id: "01000000".into(),
            state: "FINISHED".into(),
            entrypoint: Some("python train.py".into()),
            driver_pid: Some(42),
            driver_node_id: Some("aa".into()),
            driver_ip: None,
            started: None,
            ended: Some("2026-11-22T02:08:25Z".into()),
            recorded: true,
            metadata: Some(metadata.clone()),
            runtime_env: Some("not json".into()),
            submission_id: Some("raysubmit_1".into()),
            submission: Some(SubmissionFacts {
                submission_id: "raysubmit_1".into(),
                status: Some("FAILED".into()),
                message: Some("exit 1".into()),
                driver_exit_code: Some(1),
                ..SubmissionFacts::default()
            }),
            superseded: false,
        }],
        train_runs: vec![json!({"run_id": "r", "name": "r", "status": "ERRORED",
            "job_id": "01000000", "started": "2026-11-22T02:08:25Z"})],
        ..SessionFacts::default()
    };
    let index = super::super::index::IndexBuilder::default().finish(facts);
    let (answer, _) = runs_response(&index);
    let job = &answer["train_runs"][0]["job_details"];
    assert_eq!(job["type"], "SUBMISSION");
    assert_eq!(job["submission_id"], "raysubmit_1");
    assert_eq!(job["status"], "FAILED", "the record's, not the driver's");
    assert_eq!(job["message"], "exit 1");
    assert_eq!(job["driver_exit_code"], 1);
    assert_eq!(job["metadata"], json!(metadata));
    assert_eq!(
        job["runtime_env"],
        Value::Null,
        "a runtime env that is not an object"
    );
    assert_eq!(job["error_type"], Value::Null);
}

#[test]
fn runs_take_rays_shape() {
    let run = json!({
        "run_id": "r1", "name": "n", "job_id": "01000000", "status": "FINISHED",
        "status_detail": null, "started": "2026-11-22T02:08:25.597485314Z",
        "ended": null, "framework_versions": {"ray": "2.60.0"},
        "run_settings": {}, "ray_train_version": 2, "controller_log_file_path": "/l",
        "controller_actor_id": "aa", "other_fields": {"schema_version": 4, "new": "x"},
        "attempts": [{
            "attempt_id": "a1", "status": "FINISHED", "status_detail": null,
            "started": "2026-11-22T02:08:26Z", "ended": "2026-11-22T02:08:27Z",
            "resources": [{"resources": {"CPU": 1.0}}], "other_fields": {"x": 1},
            "workers": [{"world_rank": 0, "actor_id": "bb", "gpu_ids": [],
                         "log_command": "inspect ...", "other_fields": {"y": 2}}],
        }],
    });
    let ray = ray_run(&run, None);
    assert_eq!(ray["id"], "r1");
    assert_eq!(ray["start_time_ns"], 1_795_313_305_597_485_314_i64);
    assert_eq!(ray["end_time_ns"], Value::Null);
    assert_eq!(ray["job_details"], Value::Null);
    assert_eq!(ray["schema_version"], 4);
    assert_eq!(ray["new"], "x");
    assert_eq!(ray["ray_train_version"], 2);
    assert!(ray.get("other_fields").is_none() && ray.get("run_id").is_none());
    let a = &ray["attempts"][0];
    assert_eq!(a["run_id"], "r1");
    assert_eq!(a["end_time_ns"], 1_795_313_307_000_000_000_i64);
    assert_eq!(a["x"], 1);
    let w = &a["workers"][0];
    assert_eq!(w["gpus"], json!([]));
    assert_eq!(w["processStats"], Value::Null);
    assert_eq!(w["y"], 2);
    assert!(w.get("log_command").is_none());
}
