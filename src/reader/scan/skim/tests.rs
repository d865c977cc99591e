//! The skimming reader's tests: its reading equals serde's on captures, edge cases and
//! perturbed lines.

use super::super::CompactId;
use super::*;

/// What the fold gets from a typed line: its task fact (with and without log offsets) and
/// its fact of an unread type.
fn facts(text: &str, read: impl Fn(&str) -> Option<Line<'_>>) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for logs_of in [None, Some(CompactId::parse("AQID")), Some(task_id(text)?)] {
        let mut l = read(text)?;
        out.push(format!("{:?}", l.task_fact(7, logs_of)));
        out.push(format!("{:?}", l.unread_fact(7)));
    }
    Some(out)
}

/// The task id serde reads from the line (or a dummy one), for its log offsets.
fn task_id(text: &str) -> Option<CompactId> {
    let l = serde_json::from_str::<Line>(text).ok()?;
    let id = [
        l.task_definition
            .as_ref()
            .and_then(|d| d.task_id.as_deref()),
        l.actor_task_definition
            .as_ref()
            .and_then(|d| d.task_id.as_deref()),
        l.task_lifecycle.as_ref().and_then(|d| d.task_id.as_deref()),
        l.task_profile.as_ref().and_then(|d| d.task_id.as_deref()),
    ]
    .into_iter()
    .flatten()
    .next()
    .unwrap_or("AAAA");
    Some(CompactId::parse(id))
}

/// Asserts that `text`, if the hand-written reader reads it, reads as serde reads it;
/// whether it did.
fn same(text: &str) -> bool {
    if line(text).is_none() {
        return false;
    }
    let slow = facts(text, |t| serde_json::from_str::<Line>(t).ok());
    assert!(slow.is_some(), "read a line serde refuses: {text}");
    assert_eq!(facts(text, line), slow, "{text}");
    true
}

/// Ray's captures: every event of the POST bodies and export files.
fn captured() -> Vec<String> {
    let mut lines = Vec::new();
    for path in [
        "tests/data/posts-camel.jsonl",
        "tests/data/posts-snake.jsonl",
        "tests/data/posts-snake.camel-expected.jsonl",
        "tests/data/export_events/event_EXPORT_ACTOR.log",
        "tests/data/export_events/event_EXPORT_DRIVER_JOB.log",
        "tests/data/export_events/event_EXPORT_NODE.log",
        "tests/data/export_events/event_EXPORT_TRAIN_STATE.log",
    ] {
        let text = std::fs::read_to_string(path).unwrap();
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str::<serde_json::Value>(l).unwrap() {
                serde_json::Value::Array(items) => {
                    lines.extend(items.iter().map(|v| v.to_string()));
                }
                _ => lines.push(l.to_string()),
            }
        }
    }
    lines.extend(LOADGEN.iter().map(|l| l.to_string()));
    lines
}

/// The load generator's shapes (`rhc-loadgen`, as in the 1M-event bench bucket).
const LOADGEN: [&str; 4] = [
    r#"{"eventId":"uc3KUwAAAAAJAAAAAAAAAA==","eventType":"TASK_DEFINITION_EVENT","message":"","nodeId":"OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ==","sessionName":"session_2026-11-22_00-00-00_000000_1","severity":"INFO","sourceType":"CORE_WORKER","taskDefinitionEvent":{"isDetachedActor":false,"jobId":"AgAAAA==","labelSelector":{},"language":"PYTHON","parentTaskId":"//////////////////////////8BAAAA","placementGroupId":"////////////////////////","refIds":{},"requiredResources":{"CPU":1.0},"serializedRuntimeEnv":"{\"env_vars\": {\"FOO\": \"bar\"}}","taskAttempt":0,"taskFunc":{"pythonFunctionDescriptor":{"className":"","functionHash":"13dec5df9f304bbd9e6d332f5f28ca8b","functionName":"parent","moduleName":"job3"}},"taskId":"uc3KUwAAAAAJAAAAAAAAAA==","taskName":"parent","taskType":"NORMAL_TASK"},"timestamp":"2026-12-04T22:10:18.814683483Z"}"#,
    r#"{"eventId":"uc3KUwAAAAARAAAAAAAAAA==","eventType":"TASK_PROFILE_EVENT","message":"","nodeId":"OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ==","sessionName":"session_2026-11-22_00-00-00_000000_1","severity":"INFO","sourceType":"CORE_WORKER","taskProfileEvents":{"attemptNumber":0,"jobId":"AgAAAA==","taskId":"AQID","profileEvents":{"componentId":"AQAAAP///////////////////////////////w==","componentType":"worker","events":[{"endTime":"1795313202342875635","eventName":"submit_task","extraData":"{}","startTime":"1795313202231709784"},{"endTime":"1795313202343349269","eventName":"task::f","extraData":"{}","startTime":"1795313202343148202"}]}},"timestamp":"2026-12-04T22:10:18.814683483Z"}"#,
    r#"{"eventId":"uc3KUwAAAAAVAAAAAAAAAA==","eventType":"TASK_LIFECYCLE_EVENT","message":"","nodeId":"OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ==","sessionName":"session_2026-11-22_00-00-00_000000_1","severity":"INFO","sourceType":"CORE_WORKER","taskLifecycleEvent":{"jobId":"AgAAAA==","nodeId":"","stateTransitions":[{"state":"PENDING_ARGS_AVAIL","timestamp":"2026-11-22T02:06:42.343338432Z"},{"state":"PENDING_NODE_ASSIGNMENT","timestamp":"2026-11-22T02:06:42.344500587Z"}],"taskAttempt":0,"taskId":"uc3KUwAAAAAVAAAAAAAAAA==","workerId":"","workerPid":0,"taskLogInfo":{"stdoutFile":"/tmp/ray/logs/worker-ab-01000000-7.out","stdoutStart":"12","stdoutEnd":40},"rayErrorInfo":{"errorType":"TASK_EXECUTION_EXCEPTION","errorMessage":"Traceback:\n  boom \u00e9"}},"timestamp":"2026-12-04T22:10:18.814683483Z"}"#,
    r#"{"actorTaskDefinitionEvent":{"actorFunc":{"pythonFunctionDescriptor":{"className":"Counter","functionHash":"","functionName":"add","moduleName":"job3"}},"actorId":"7YtY6SVWBVhbQdSQAQAAAA==","actorTaskName":"Counter.add","isDetachedActor":false,"jobId":"AgAAAA==","labelSelector":{},"language":"PYTHON","parentTaskId":"//////////////////////////8BAAAA","placementGroupId":"////////////////////////","refIds":{},"requiredResources":{"CPU":1.0},"serializedRuntimeEnv":"{\"env_vars\": {\"FOO\": \"bar\"}}","taskAttempt":0,"taskId":"uc3KUwAAAACZAAAAAAAAAA=="},"eventId":"uc3KUwAAAACZAAAAAAAAAA==","eventType":"ACTOR_TASK_DEFINITION_EVENT","message":"","nodeId":"OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ==","sessionName":"session_2026-11-22_00-00-00_000000_1","severity":"INFO","sourceType":"CORE_WORKER","timestamp":"2026-12-04T22:10:18.814683483Z"}"#,
];

#[test]
fn captured_lines_read_as_serde_reads_them_and_task_events_are_skimmed() {
    let lines = captured();
    let mut skimmed = 0;
    for l in &lines {
        if same(l) {
            skimmed += 1;
        }
    }
    // Every pushed line is skimmed (export events, with `event_data`, are serde's).
    let pushed = lines
        .iter()
        .filter(|l| !l.contains("\"event_data\""))
        .count();
    assert_eq!(skimmed, pushed, "of {}", lines.len());
    assert!(pushed > 300);
}

/// Hand-made edge cases: each either read as serde reads it or left to serde.
#[test]
fn plain_numbers_are_serdes_f64_to_the_bit() {
    for text in [
        "-0",
        "0",
        "-0.0",
        "1",
        "-17",
        "123456789012345",
        "0.1",
        "-2.5e0",
    ] {
        let ours = plain_float(text).map(f64::to_bits);
        let serde = serde_json::from_str::<f64>(text).ok().map(f64::to_bits);
        // What we do not read (an exponent) is serde's: `None` here.
        assert!(
            ours.is_none() || ours == serde,
            "{text}: {ours:?} against {serde:?}"
        );
    }
    assert_eq!(
        plain_float("-0").map(f64::to_bits),
        Some((-0.0f64).to_bits())
    );
}

#[test]
fn edge_cases_read_as_serde_reads_them() {
    let def = |body: &str| {
        format!(
            r#"{{"eventId":"d","eventType":"TASK_DEFINITION_EVENT","timestamp":"2026-11-22T05:00:01Z","taskDefinitionEvent":{{{body}}}}}"#
        )
    };
    let life = |body: &str| {
        format!(
            r#"{{"eventId":"l","eventType":"TASK_LIFECYCLE_EVENT","timestamp":"2026-11-22T05:00:01Z","taskLifecycleEvent":{{{body}}}}}"#
        )
    };
    let prof = |events: &str| {
        format!(
            r#"{{"eventId":"p","eventType":"TASK_PROFILE_EVENT","taskProfileEvents":{{"taskId":"AQID","profileEvents":{{"componentType":"worker","componentId":"AQID","events":{events}}}}}}}"#
        )
    };
    let cases = [
        def(r#""taskId":"AQID","taskAttempt":2,"taskName":"f""#),
        def(r#""taskId":"A\u0051ID","taskName":"f\nx""#),
        def(r#""taskId":"AQID","taskAttempt":"3","taskName":null"#),
        def(r#""taskId":"AQID","taskAttempt":" 3 ""#),
        def(r#""taskId":"AQID","taskAttempt":3.7"#),
        def(r#""taskId":"AQID","taskAttempt":-4"#),
        def(r#""taskId":"AQID","taskAttempt":-0"#),
        def(r#""taskId":"AQID","taskAttempt":012"#),
        def(r#""taskId":"AQID","taskAttempt":1e2"#),
        def(r#""taskId":"AQID","taskAttempt":99999999999999999999"#),
        def(r#""taskId":"AQID","taskAttempt":123456789012345678"#),
        def(r#""taskId":"AQID","taskAttempt":null"#),
        def(r#""taskId":"AQID","taskAttempt":true"#),
        def(r#""taskId":"AQID","taskId":"AQID""#),
        def(r#""taskId":"AQID","task_id":"AQIE""#),
        def(r#""taskId":"AQID","taskName":"a","actorTaskName":"b""#),
        def(r#""taskId":"AQID","taskName":5"#),
        def(r#""taskId":"AQID","requiredResources":{"GPU":0.1,"CPU":1,"CPU":2,"m":1e9}"#),
        def(r#""taskId":"AQID","requiredResources":null"#),
        def(
            r#""taskId":"AQID","requiredResources":{"CPU":1.5,"GPU":-0,"z":-0.0,"a":0.1234567890123}"#,
        ),
        def(r#""taskId":"AQID","requiredResources":{"a":0.12345678901234567,"b":1}"#),
        def(r#""taskId":"AQID","requiredResources":{"a":"1"}"#),
        def(r#""taskId":"AQID","requiredResources":{"a\u0062":1}"#),
        def(
            r#""taskId":"AQID","taskFunc":{"pythonFunctionDescriptor":{"functionName":"p","moduleName":"m"},"javaFunctionDescriptor":{"functionName":"j"}}"#,
        ),
        def(
            r#""taskId":"AQID","taskFunc":{"pythonFunctionDescriptor":null,"cppFunctionDescriptor":{"functionName":"c","function_name":"d"}}"#,
        ),
        def(
            r#""taskId":"AQID","actorFunc":{"python_function_descriptor":{"function_name":"p"}},"taskFunc":{}"#,
        ),
        def(r#""taskId":"AQID","requiredResources":[]"#),
        def(r#""taskId":"AQID","taskFunc":{"javaFunctionDescriptor":{"functionName":"j"}}"#),
        def(r#""task\u0049d":"AQID""#),
        def(
            r#" "taskId" : "AQID" , "x" : [ 1 , { } , [ ] , "\"" , -1.5e+3 , true , false , null ] "#,
        ),
        def(r#""taskId":"AQID","x":[1,]"#),
        def(r#""taskId":"AQID","x":{"a":1,}"#),
        def(r#""taskId":"AQID","x":"\x""#),
        def(r#""taskId":"AQID","x":"\u12G4""#),
        def(r#""taskId":"AQID","x":"a	tab""#),
        def(r#""taskId":"AQID","x":01"#),
        def(r#""taskId":"AQID","x":1."#),
        def(r#""taskId":"AQID","x":-"#),
        def(r#""taskId":"AQID","x":nul"#),
        def(r#""taskId":"AQID","x":"\ud800""#),
        def(r#""taskId":"é🎉","taskName":"héllo""#),
        life(
            r#""taskId":"AQID","stateTransitions":[{"state":"RUNNING","timestamp":"2026-11-22T05:00:01.5Z"},{"state":"","timestamp":"x"},{"timestamp":"2026-11-22T05:00:02Z"},{"state":"WEIRD","x":1}]"#,
        ),
        life(r#""taskId":"AQID","stateTransitions":null"#),
        life(r#""taskId":"AQID","stateTransitions":{}"#),
        life(r#""taskId":"AQID","stateTransitions":[["RUNNING","2026-11-22T05:00:01Z"]]"#),
        life(r#""taskId":"AQID","stateTransitions":[{"state":"RUNNING","state":"FAILED"}]"#),
        life(r#""taskId":"AQID","workerPid":"77","nodeId":"","workerId":null"#),
        life(
            r#""taskId":"AQID","rayErrorInfo":{"errorType":"X","errorMessage":"a\"b"},"taskLogInfo":{"stderrFile":"/a/worker-x.err","stderrStart":3}"#,
        ),
        life(r#""taskId":"AQID","taskLogInfo":{"stderrStart":true}"#),
        life(
            r#""taskId":"AQID","taskLogInfo":{"stdoutStart":" 12 ","stdoutEnd":"x","stderrStart":"1\u0032","stderrEnd":-5,"stdoutFile":"/a/worker-1.out","stderr_file":null}"#,
        ),
        life(r#""taskId":"AQID","taskLogInfo":{"stdoutStart":"1","stdout_start":"2"}"#),
        life(
            r#""taskId":"AQID","task_log_info":{"stdout_end":"99999999999999999999","stderr_end":1.5}"#,
        ),
        life(r#""taskId":"AQID","ray_error_info":{"error_type":"X","error_message":null,"x":[]}"#),
        life(r#""taskId":"AQID","rayErrorInfo":{"errorType":"X","errorType":"Y"}"#),
        life(r#""taskId":"AQID","workerPid":[1]"#),
        prof(r#"[{"eventName":"task::f","startTime":"10","endTime":20}]"#),
        prof(
            r#"[{"eventName":"x","startTime":[1]},{"eventName":"task::f","startTime":"10","endTime":"20"}]"#,
        ),
        prof(r#"[{"eventName":"task::f","startTime":"1\u0030","endTime":20.5}]"#),
        prof(r#"[{"eventName":"task::f","startTime":null,"endTime":"20"}]"#),
        prof(r#"null"#),
        prof(r#"[]"#),
        prof(r#"[1]"#),
        prof(r#"{}"#),
        r#"{"eventType":"TASK_DEFINITION_EVENT","taskDefinitionEvent":null}"#.to_string(),
        r#"{"eventType":"TASK_DEFINITION_EVENT","taskDefinitionEvent":["AQID",1]}"#.to_string(),
        r#"{"eventType":"TASK_DEFINITION_EVENT","eventType":"X"}"#.to_string(),
        r#"{"eventType":"SOME_FUTURE_EVENT","eventId":"x","timestamp":"2026-11-22T05:00:01Z"}"#
            .to_string(),
        r#"{"eventType":"SOME_FUTURE_EVENT","timestamp":1795625217}"#.to_string(),
        r#"{"eventType":"SOME_FUTURE_EVENT","timestamp":1.5}"#.to_string(),
        r#"{"eventType":"SOME_FUTURE_EVENT","timestamp":null}"#.to_string(),
        r#"{"eventType":"SOME_FUTURE_EVENT"} x"#.to_string(),
        r#"{"eventType":"SOME_FUTURE_EVENT"}  "#.to_string(),
        r#"{}"#.to_string(),
        r#"{"#.to_string(),
        format!(
            r#"{{"eventType":"X","deep":{}1{}}}"#,
            "[".repeat(100),
            "]".repeat(100)
        ),
        format!(
            r#"{{"eventType":"X","deep":{}1{}}}"#,
            "[".repeat(30),
            "]".repeat(30)
        ),
    ];
    let mut skimmed = 0;
    for c in &cases {
        if same(c) {
            skimmed += 1;
        }
    }
    assert!(skimmed > cases.len() / 2, "{skimmed} of {}", cases.len());
}

/// Real lines perturbed (bytes replaced, inserted, deleted; whitespace added; cut):
/// each either read as serde reads it or left to serde.
#[test]
fn perturbed_lines_read_as_serde_reads_them() {
    let lines = captured();
    let mut skimmed = 0;
    for l in super::perturbed(&lines, 0x9e37_79b9_7f4a_7c15, 4000) {
        if let Ok(text) = std::str::from_utf8(&l) {
            if same(text) {
                skimmed += 1;
            }
        }
    }
    assert!(skimmed > 500, "{skimmed}");
}
