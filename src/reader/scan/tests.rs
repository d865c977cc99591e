//! The scan's tests: lines read as serde reads them, facts, the event shortcut.

use super::*;

fn fact(line: &str) -> Fact {
    match scan_line(line.as_bytes(), 0, Some(CompactId::parse("AQID")), |l| {
        serde_json::from_slice(l).map_err(|e| e.to_string())
    }) {
        Ok(f) => f,
        Err(e) => panic!("{e}: {line}"),
    }
}

/// The ASCII test agrees with std's at every length and every offset of a high byte,
/// and `utf8` with `from_utf8` on valid and invalid text alike.
#[test]
fn the_ascii_check_is_std_s() {
    let base: Vec<u8> = (0..200u32).map(|i| b' ' + (i % 90) as u8).collect();
    for len in 0..base.len() {
        assert!(is_ascii(&base[..len]));
        for at in 0..len {
            for high in [0x80, 0xc3, 0xff] {
                let mut b = base[..len].to_vec();
                b[at] = high;
                assert_eq!(is_ascii(&b), b.is_ascii(), "{len} {at}");
                assert_eq!(utf8(&b).ok(), std::str::from_utf8(&b).ok(), "{len} {at}");
            }
        }
    }
    let text = format!("{}héllo 🎉{}", "a".repeat(70), "b".repeat(70));
    assert_eq!(utf8(text.as_bytes()), Ok(text.as_str()));
}

/// Every non-task event of Ray's captures (and each perturbed a few thousand ways, and
/// hand-made edge cases) reads as the whole line's `Value` reads: the same fact, or the
/// same error; the captures' own lines are read without that tree.
#[test]
fn ray_events_read_from_their_body_as_from_the_whole_line() {
    use super::super::decode::value_of;
    let whole = |line: &[u8]| format!("{:?}", value_of(line).and_then(|v| scan_value(&v, 7, None)));
    let ours = |line: &[u8]| format!("{:?}", scan_line(line, 7, None, value_of));
    let mut lines = Vec::new();
    for path in [
        "tests/data/posts-camel.jsonl",
        "tests/data/posts-snake.jsonl",
    ] {
        let text = std::fs::read_to_string(path).unwrap();
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(l).unwrap();
            for item in v.as_array().unwrap() {
                let t = item
                    .get("eventType")
                    .or_else(|| item.get("event_type"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if RAY_EVENT_TYPES_READ.contains(&t) {
                    lines.push(item.to_string());
                }
            }
        }
    }
    assert!(lines.len() > 40, "{}", lines.len());
    let mut typed_read = 0;
    for l in &lines {
        let typed = skim::line(l).unwrap();
        assert!(typed.ray_event_value(l, value_of).is_some(), "{l}");
        let t = typed.event_type.as_deref().unwrap_or("");
        if t.starts_with("WORKER_") || t.starts_with("NODE_") || t.starts_with("ACTOR_") {
            assert!(typed.rare_fact(l, 7).is_some(), "{l}");
            typed_read += 1;
        }
        assert_eq!(ours(l.as_bytes()), whole(l.as_bytes()), "{l}");
    }
    let worker = r#"{"eventId":"w","eventType":"WORKER_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:06:44Z","workerLifecycleEvent":{"workerId":"AQID","jobId":"AgAAAA==","stateTransitions":[{"state":"DEAD","timestamp":"2026-11-22T02:06:45Z","deathInfo":{"exitType":"SYSTEM_ERROR","exitDetail":"x"}}]}"#;
    let edge = [
        // Both names of the body, twice each: camelCase first, the last of each.
        format!(
            r#"{worker},"worker_lifecycle_event":{{"workerId":"AQIE"}},"workerLifecycleEvent":{{"workerId":"AQIF"}}}}"#
        ),
        format!(r#"{worker},"worker_lifecycle_event":{{"workerId":"AQIE"}}}}"#),
        r#"{"eventType":"WORKER_LIFECYCLE_EVENT","worker_lifecycle_event":{"workerId":"AQIE"},"worker_lifecycle_event":5}"#.to_string(),
        // Numbers the whole tree may refuse, in the envelope or the body.
        format!(r#"{worker},"x":1e999}}"#),
        format!(r#"{worker},"x":1.5e99,"y":-0.25E-07}}"#),
        format!(r#"{worker},"x":{}}}"#, "9".repeat(400)),
        format!(r#"{worker},"x":{}}}"#, "9".repeat(150)),
        // Lone surrogates, in the envelope or the body.
        format!(r#"{worker},"message":"\ud800"}}"#),
        worker.replace(r#""x"}"#, r#""\udc00 \ud83d\ude00"}"#) + "}",
        // A time as a number, no time, a null id, a body not an object, no body.
        worker.replace(r#""2026-11-22T02:06:44Z""#, "1795313204") + "}",
        worker.replace(r#""timestamp":"2026-11-22T02:06:44Z","#, "") + "}",
        worker.replace(r#""w""#, "null") + "}",
        r#"{"eventType":"NODE_DEFINITION_EVENT","nodeDefinitionEvent":[1]}"#.to_string(),
        r#"{"eventType":"NODE_DEFINITION_EVENT","eventId":"n"}"#.to_string(),
        r#"{"event_type":"ACTOR_DEFINITION_EVENT","actor_definition_event":{"actor_id":"AQID","class_name":"C"},"eventData":{}}"#.to_string(),
        // Escapes, whitespace.
        r#" { "eventType" : "ACTOR_DEFINITION_EVENT" , "actorDefinitionEvent" : { "actorId" : "AQID" , "className" : "C\"\u00e9" } , "eventId" : "a\nb" } "#.to_string(),
        worker.to_string() + "}",
        // The typed bodies: wrong types, both names of a member, members twice, nulls,
        // odd numbers, escapes, elements not objects, a body that is an array.
        worker.replace(r#""workerId":"AQID""#, r#""workerId":null,"worker_id":"AQID""#) + "}",
        worker.replace(r#""workerId":"AQID""#, r#""worker_id":"AQID","workerId":"AQIE""#) + "}",
        worker.replace(r#""workerId":"AQID""#, r#""workerId":"AQID","workerId":"AQIE""#) + "}",
        worker.replace(r#""workerId":"AQID""#, r#""workerId":5"#) + "}",
        worker.replace(r#""workerId":"AQID""#, r#""workerId":"""#) + "}",
        worker.replace(r#""workerId":"AQID""#, r#""workerId":"not base64!""#) + "}",
        worker.replace(r#""workerId":"AQID""#, r#""work\u0065rId":"AQ\u0049D""#) + "}",
        worker.replace(r#""stateTransitions":["#, r#""stateTransitions":[5,null,[],{"state":7},{"state":""},"#) + "}",
        worker.replace(r#""stateTransitions":["#, r#""state_transitions":[{"state":"X"}],"stateTransitions":["#) + "}",
        worker.replace(r#""stateTransitions":[{"#, r#""stateTransitions":{"a":[{"#).replace("}]}", "}]}}") + "}",
        worker.replace(r#""deathInfo":{"#, r#""death_info":{"exitType":"Y"},"deathInfo":{"exit_type":"Z","#) + "}",
        worker.replace(r#""deathInfo":{"#, r#""deathInfo":[],"death_info":{"exitType":"Y"},"x":{"#) + "}",
        worker.replace(r#""exitDetail":"x""#, &format!(r#""exitDetail":"{}""#, "é".repeat(9000))) + "}",
        worker.replace(r#""exitDetail":"x""#, r#""exitDetail":"\ud800""#) + "}",
        worker.replace(r#""jobId":"AgAAAA==","#, r#""jobId":"AgAAAA==","zz":"\udc00","#) + "}",
        worker.replace(r#""workerLifecycleEvent":{"#, r#""workerLifecycleEvent":["#).replace("}]}", "}]]") + "}",
        worker.replace(r#""workerLifecycleEvent":{"#, r#""workerLifecycleEvent": {"#) + "}",
        r#"{"eventType":"WORKER_DEFINITION_EVENT","eventId":"","workerDefinitionEvent":{"workerId":"AQID","pid":"  42 ","workerType":5,"worker_type":"W"}}"#.to_string(),
        r#"{"eventType":"WORKER_DEFINITION_EVENT","workerDefinitionEvent":{"workerId":"AQID","pid":18446744073709551615,"node_id":"AQID","nodeId":null}}"#.to_string(),
        r#"{"eventType":"WORKER_DEFINITION_EVENT","workerDefinitionEvent":{"workerId":"AQID","pid":-3.9e3}}"#.to_string(),
        r#"{"eventType":"WORKER_DEFINITION_EVENT","workerDefinitionEvent":{"workerId":"AQID","pid":4.2}}"#.to_string(),
        r#"{"eventType":"WORKER_DEFINITION_EVENT","workerDefinitionEvent":{"pid":42}}"#.to_string(),
        r#"{"eventType":"WORKER_DEFINITION_EVENT","workerDefinitionEvent":["AQID"]}"#.to_string(),
        r#"{"eventType":"NODE_DEFINITION_EVENT","nodeDefinitionEvent":{"nodeId":"AQID","hostname":"h","node_ip_address":"1.2.3.4","startTimestamp":"2026-11-22T02:06:45.5Z","start_timestamp":"2026-11-22T02:06:46Z"}}"#.to_string(),
        r#"{"eventType":"ACTOR_DEFINITION_EVENT","actorDefinitionEvent":{"actor_id":"AQID","actorId":null,"jobId":"AgAAAA==","className":"","class_name":"C","name":"n"}}"#.to_string(),
        r#"{"eventType":"ACTOR_DEFINITION_EVENT","actorDefinitionEvent":{"actorId":"AQID","name":7,"className":"C"}}"#.to_string(),
        format!(r#"{{"eventType":"ACTOR_LIFECYCLE_EVENT","actorLifecycleEvent":{{"actorId":"AQID","stateTransitions":[{{"state":"DEAD","nodeId":"AQID","pid":"7","deathCause":{{"b":{{"reason":"B"}},"a":5,"c":{{"reason":"C"}}}}}},{{"state":"DEAD","pid":-1,"death_cause":{{"x":{{"errorMessage":"{}"}}}}}},{{"state":"DEAD","deathCause":{{"z":{{"reason":"Z","error_message":"m"}},"z":[]}}}},{{"state":"ALIVE","node_id":"AQIE","deathCause":[],"death_cause":{{"a":{{"reason":"A"}}}}}}]}}}}"#, "m".repeat(20000)),
        r#"{"eventType":"ACTOR_LIFECYCLE_EVENT","actorLifecycleEvent":{"actorId":"AQID","stateTransitions":[{"state":"DEAD","deathCause":{"a":{"reason":"A","reason":"B"}}}]}}"#.to_string(),
        r#"{"eventType":"NODE_LIFECYCLE_EVENT","nodeLifecycleEvent":{"node_id":"AQID","stateTransitions":[{"state":"ALIVE","resources":{"CPU":2.0,"b":"1","a":-1,"CPU":3,"z":18446744073709551615}},{"state":"DEAD","resources":[],"death_info":{"reason":"R","reason_message":"M","reasonMessage":null}},{"state":"DEAD","deathInfo":{"reasonMessage":"N"},"resources":null}]}}"#.to_string(),
    ];
    assert!(typed_read > 10, "{typed_read}");
    for l in &edge {
        assert_eq!(ours(l.as_bytes()), whole(l.as_bytes()), "{l}");
    }
    for l in super::skim::perturbed(&lines, 0x2545_f491_4f6c_dd1d, 3000) {
        assert_eq!(ours(&l), whole(&l), "{}", String::from_utf8_lossy(&l));
    }
}

fn task(f: Fact) -> TaskDelta {
    match f.body {
        Body::Task(d) => *d,
        other => panic!("not a task: {other:?}"),
    }
}

/// Review r36za D1: the text is written only up to its cut, and is the cut of the whole
/// text: many keys, amounts of hundreds of digits, a key cut inside a multi-byte char.
#[test]
fn resources_text_stops_at_its_cut_and_is_the_cut_of_the_whole() {
    let keys: Vec<String> = (0..2000).map(|i| format!("k{i:05}é")).collect();
    for amount in [1.0, 0.5, 1e308] {
        let pairs = || keys.iter().map(|k| (k.as_str(), amount));
        let mut whole = String::new();
        for (k, v) in pairs() {
            if !whole.is_empty() {
                whole.push_str(", ");
            }
            whole.push_str(cut(k, 64));
            whole.push_str(": ");
            write_amount(&mut whole, v);
        }
        let got = resources_text(pairs()).unwrap();
        assert_eq!(&*got, cut(&whole, RESOURCES_TEXT_BYTES));
    }
}

/// Review r36e: a line of an event type nothing reads was parsed into a JSON tree (a
/// 57 MiB line: 1 GiB). Now its fact (id, type, time) comes from the typed reader, which
/// keeps none of its members, and is the fact the tree would have made.
#[test]
fn unknown_event_types_are_read_without_a_tree() {
    let pad = "0,".repeat(10_000);
    for line in [
        format!(
            r#"{{"eventId":"AAAA","eventType":"SOME_FUTURE_EVENT","timestamp":"2026-11-22T02:06:44.945Z","pad":[{pad}0]}}"#
        ),
        format!(
            r#"{{"event_id":"AAAA","event_type":"SOME_FUTURE_EVENT","timestamp":"2026-11-22T02:06:44.945Z","pad":{{"a":[{pad}0]}}}}"#
        ),
        r#"{"eventType":"SOME_FUTURE_EVENT"}"#.to_string(),
    ] {
        let got = scan_line(line.as_bytes(), 3, None, |_| {
            panic!("a JSON tree was built for {line}")
        })
        .unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        let want = extract_ray_event(&v, 3).unwrap();
        assert!(matches!(got.body, Body::Other));
        assert_eq!(
            (got.event_id, &got.event_type, got.time_ns, got.seq),
            (want.event_id, &want.event_type, want.time_ns, want.seq)
        );
    }
    // A type whose body is read as a `Value` still gets that tree; a worker, node or
    // actor event's body is read typed, without one.
    let trees = std::cell::Cell::new(0);
    let read = |line: &str| {
        scan_line(line.as_bytes(), 0, None, |l| {
            trees.set(trees.get() + 1);
            serde_json::from_slice(l).map_err(|e| e.to_string())
        })
        .unwrap()
    };
    let job = read(
        r#"{"eventId":"j","eventType":"DRIVER_JOB_DEFINITION_EVENT","driverJobDefinitionEvent":{"jobId":"AQAAAA=="}}"#,
    );
    assert_eq!(trees.get(), 1);
    assert!(matches!(job.body, Body::DriverJobDefinition { .. }));
    let node = read(
        r#"{"eventId":"n","eventType":"NODE_DEFINITION_EVENT","nodeDefinitionEvent":{"nodeId":"AQID"}}"#,
    );
    assert_eq!(trees.get(), 1);
    assert!(matches!(node.body, Body::NodeDefinition { .. }));
}

/// Review r36e: a task event with one field of the wrong type was read as an event of no
/// kind and passed over; now it is a bad line, whichever field and key style.
#[test]
fn task_events_with_a_field_of_the_wrong_type_are_bad_lines() {
    let def = |over: &str| {
        format!(
            r#"{{"eventId":"d","eventType":"TASK_DEFINITION_EVENT","timestamp":"2026-11-22T05:00:01Z",
            "taskDefinitionEvent":{{"taskId":"AQID","taskAttempt":0,"jobId":"AQAAAA==","taskType":"NORMAL_TASK","taskName":"t"{over}}}}}"#
        )
    };
    let life = |over: &str| {
        format!(
            r#"{{"eventId":"l","eventType":"TASK_LIFECYCLE_EVENT","timestamp":"2026-11-22T05:00:02Z",
            "taskLifecycleEvent":{{"taskId":"AQID","taskAttempt":0,"jobId":"AQAAAA==","workerPid":7,
            "stateTransitions":[{{"state":"FINISHED","timestamp":"2026-11-22T05:00:02Z"}}]{over}}}}}"#
        )
    };
    // The control reads as a task.
    task(fact(&def("")));
    task(fact(&life("")));
    for bad in [
        life(r#","workerPid":true"#),
        def(r#","taskName":5"#),
        life(r#","nodeId":["x"]"#),
        def(r#","taskAttempt":[0]"#),
        life(r#","stateTransitions":{"state":"FINISHED"}"#),
        r#"{"event_data":{"task_id":"AQID","attempt_number":[0]},"event_id":"e","source_type":"EXPORT_TASK","timestamp":1795625217}"#.to_string(),
    ] {
        let got = scan_line(bad.as_bytes(), 0, None, |l| {
            serde_json::from_slice(l).map_err(|e| e.to_string())
        });
        let err = got.map(|f| f.body).expect_err(&bad);
        assert!(err.contains("do not have Ray's types"), "{err}: {bad}");
    }
    // Another event type's surprises stay its reader's business.
    let node = r#"{"eventId":"n","eventType":"NODE_DEFINITION_EVENT","timestamp":"2026-11-22T05:00:02Z","nodeDefinitionEvent":{"nodeId":"AQID","hostname":5}}"#;
    assert!(
        scan_line(node.as_bytes(), 0, None, |l| serde_json::from_slice(l)
            .map_err(|e| e.to_string()))
        .is_ok()
    );
}

#[test]
fn snake_and_camel_lifecycles_read_alike() {
    let camel = r#"{"eventId":"x","eventType":"TASK_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:06:44.945Z",
        "taskLifecycleEvent":{"taskId":"AQID","taskAttempt":1,"jobId":"AQAAAA==","workerPid":7,
        "stateTransitions":[{"state":"FAILED","timestamp":"2026-11-22T02:06:44.945Z"}],
        "taskLogInfo":{"stderrFile":"/tmp/ray/s/logs/worker-ab-01000000-7.err","stderrStart":"35"},
        "rayErrorInfo":{"errorType":"TASK_EXECUTION_EXCEPTION","errorMessage":"boom"}}}"#;
    let snake = r#"{"event_id":"x","event_type":"TASK_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:06:44.945Z",
        "task_lifecycle_event":{"task_id":"AQID","task_attempt":1,"job_id":"AQAAAA==","worker_pid":7,
        "state_transitions":[{"state":"FAILED","timestamp":"2026-11-22T02:06:44.945Z"}],
        "task_log_info":{"stderr_file":"/tmp/ray/s/logs/worker-ab-01000000-7.err","stderr_start":"35"},
        "ray_error_info":{"error_type":"TASK_EXECUTION_EXCEPTION","error_message":"boom"}}}"#;
    for line in [camel, snake] {
        let f = fact(line);
        assert!(f.event_id.is_some());
        let t = task(f);
        let k = t.key.unwrap();
        assert_eq!((k.id.hex().as_str(), k.attempt), ("010203", 1));
        assert_eq!(t.job.map(|j| j.hex()).as_deref(), Some("01000000"));
        assert_eq!(t.transitions.iter().next().unwrap().state, "FAILED");
        assert_eq!(t.pid, Some(7));
        let (ty, msg) = t.error.unwrap();
        assert_eq!(ty.as_deref(), Some("TASK_EXECUTION_EXCEPTION"));
        assert_eq!(msg.as_deref(), Some("boom"));
        let log = t.log.unwrap();
        assert_eq!(log.stderr_file.as_deref(), Some("worker-ab-01000000-7.err"));
        assert_eq!(log.stderr, (Some(35), None));
    }
}

/// A profile's first `task::` event is its execution, its times read only then; the
/// other events are still checked (a wrong type in any is a bad line, as with a list).
#[test]
fn profiles_use_their_first_execution_event_and_check_the_others() {
    let profile = |events: &str| {
        format!(
            r#"{{"eventId":"p","eventType":"TASK_PROFILE_EVENT","timestamp":"2026-11-22T05:00:01Z",
            "taskProfileEvents":{{"taskId":"AQID","attemptNumber":0,"jobId":"AQAAAA==",
            "profileEvents":{{"componentType":"worker","componentId":"AQID","events":[{events}]}}}}}}"#
        )
    };
    let exec = |f: &str| task(fact(&profile(f))).exec.map(|(s, e, _)| (s, e));
    let submit = r#"{"eventName":"submit_task","startTime":"x","endTime":1}"#;
    let first = r#"{"eventName":"task::f","startTime":" 10 ","endTime":"20"}"#;
    let second = r#"{"eventName":"task::g","startTime":30,"endTime":40}"#;
    assert_eq!(exec(&format!("{submit},{first},{second}")), Some((10, 20)));
    assert_eq!(exec(&format!("{second},{first}")), Some((30, 40)));
    // The first execution event decides, even when its times are not usable.
    let unusable = r#"{"eventName":"task::f","startTime":"soon","endTime":"20"}"#;
    assert_eq!(exec(&format!("{unusable},{second}")), None);
    assert_eq!(exec(submit), None);
    assert_eq!(exec(""), None);
    for bad in [
        profile(&format!(r#"{second},{{"eventName":"x","startTime":[1]}}"#)),
        profile(&format!(r#"{{"eventName":5}},{first}"#)),
        profile(r#"{"eventName":"task::f","endTime":{}}"#),
    ] {
        let got = scan_line(bad.as_bytes(), 0, None, |l| {
            serde_json::from_slice(l).map_err(|e| e.to_string())
        });
        let err = got.map(|f| f.body).expect_err(&bad);
        assert!(err.contains("do not have Ray's types"), "{err}: {bad}");
    }
}

/// Invalid UTF-8 in a member that is skipped does not make a bad line; in a member that
/// is read, it does (as when serde_json checked each string of the bytes itself).
#[test]
fn invalid_utf8_where_it_is_read_and_where_it_is_not() {
    let line = |message: &[u8], name: &[u8]| {
        let mut l = br#"{"eventId":"d","eventType":"TASK_DEFINITION_EVENT","message":""#.to_vec();
        l.extend_from_slice(message);
        l.extend_from_slice(br#"","taskDefinitionEvent":{"taskId":"AQID","taskName":""#);
        l.extend_from_slice(name);
        l.extend_from_slice(br#""}}"#);
        l
    };
    let read = |l: &[u8]| {
        scan_line(l, 0, None, |l| {
            serde_json::from_slice(l).map_err(|e| e.to_string())
        })
        .map(|f| task(f).name.map(|n| n.to_string()))
    };
    assert_eq!(read(&line(b"ok", b"f")), Ok(Some("f".into())));
    assert_eq!(read(&line(b"\xff", b"f")), Ok(Some("f".into())));
    assert_eq!(
        read(&line(b"caf\xc3\xa9", b"caf\xc3\xa9")),
        Ok(Some("caf\u{e9}".into()))
    );
    assert!(read(&line(b"ok", b"\xff")).is_err());
}

/// A definition's texts: short ones inline, long ones whole up to their bounds, the
/// resource request with its keys sorted and cut as before.
#[test]
fn definition_texts() {
    let def = |name: &str, resources: &str| {
        task(fact(&format!(
            r#"{{"eventId":"d","eventType":"TASK_DEFINITION_EVENT","timestamp":"2026-11-22T05:00:01Z",
            "taskDefinitionEvent":{{"taskId":"AQID","taskName":"{name}","taskType":"NORMAL_TASK",
            "requiredResources":{resources}}}}}"#
        )))
    };
    let t = def("f", r#"{"GPU":0.5,"CPU":1.0,"memory":1e9}"#);
    assert_eq!(t.name.as_deref(), Some("f"));
    assert_eq!(t.task_type.as_deref(), Some("NORMAL_TASK"));
    assert_eq!(
        t.resources.as_deref(),
        Some("CPU: 1, GPU: 0.5, memory: 1000000000")
    );
    let long = "é".repeat(300);
    let key = "k".repeat(100);
    let many: Vec<String> = (0..60).map(|i| format!(r#""r{i:02}":{i}.25"#)).collect();
    let t = def(&long, &format!(r#"{{"{key}":1}}"#));
    assert_eq!(t.name.as_deref(), Some(&long[..MAX_FIELD_BYTES]));
    assert_eq!(def(&long[..100], "{}").name.as_deref(), Some(&long[..100]));
    assert_eq!(
        t.resources.as_deref(),
        Some(format!("{}: 1", &key[..64]).as_str())
    );
    let t = def("f", &format!("{{{}}}", many.join(",")));
    let want: Vec<String> = (0..60).map(|i| format!("r{i:02}: {i}.25")).collect();
    assert_eq!(t.resources.as_deref(), Some(&want.join(", ")[..512]));
    assert_eq!(def("f", "{}").resources.as_deref(), None);
}

#[test]
fn export_tasks_and_profiles() {
    // From a Ray 2.60 run with RAY_enable_export_api_write=1.
    let line = r#"{"event_data": {"attempt_number": 0, "job_id": "AQAAAA==", "state_updates": {"error_info": {"error_message": "RuntimeError: x", "error_type": "TASK_EXECUTION_EXCEPTION"}, "node_id": "EMTEIoT2JmOrj6YRpDqHZoT7esnMZhxYatijbA==", "state_ts_ns": {"1": "1795625216406224479", "12": "1795625216415864429", "8": "1795625216409894056"}, "worker_id": "hOtmsjbBfbXISIyEHByWn6yrpUaWB0ZuZVw+Hw=="}, "task_id": "MtlQ7AzPnSr///////////////8BAAAA", "task_info": {"func_or_class_name": "fails", "type": "NORMAL_TASK"}, "profile_events": {"component_id": "hOtmsjbBfbXISIyEHByWn6yrpUaWB0ZuZVw+Hw==", "component_type": "worker", "events": [{"end_time": "1795625216411721381", "event_name": "task:execute", "start_time": "1795625216411264421"}, {"end_time": "1795625216412064926", "event_name": "task::fails", "start_time": "1795625216411211295"}]}}, "event_id": "9f7c", "source_type": "EXPORT_TASK", "timestamp": 1795625217}"#;
    let f = fact(line);
    assert_eq!(f.event_type, "EXPORT_TASK");
    assert_eq!(f.time_ns, Some(1_795_625_217 * NANOS_PER_SECOND));
    let t = task(f);
    assert_eq!(t.name.as_deref(), Some("fails"));
    let states: Vec<&str> = t.transitions.iter().map(|t| &*t.state).collect();
    assert_eq!(states, ["PENDING_ARGS_AVAIL", "RUNNING", "FAILED"]);
    let (start, end, worker) = t.exec.unwrap();
    assert_eq!(
        (start, end),
        (1_795_625_216_411_211_295, 1_795_625_216_412_064_926)
    );
    assert_eq!(
        worker.map(|w| w.hex()).as_deref(),
        Some("84eb66b236c17db5c8488c841c1c969facaba5469607466e655c3e1f")
    );
    // Other export events go to the generic reader.
    let actor = r#"{"event_data":{"actor_id":"GrvJiCM83lGdzNZ4AQAAAA==","class_name":"C","job_id":"AQAAAA==","state":"ALIVE"},"event_id":"a","source_type":"EXPORT_ACTOR","timestamp":1795313302}"#;
    assert!(matches!(fact(actor).body, Body::ExportActor { .. }));
    // A field given twice is read the generic way (first value), not lost.
    let twice = r#"{"eventType":"TASK_DEFINITION_EVENT","eventType":"TASK_DEFINITION_EVENT","taskDefinitionEvent":{"taskId":"AQID","taskName":"f"}}"#;
    assert_eq!(task(fact(twice)).name.as_deref(), Some("f"));
}
