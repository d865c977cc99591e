//! Unit tests of the converter: names, maps, nesting, escapes, malformed input.

use super::*;
use serde_json::Value;

fn convert(input: &str) -> Result<(String, Conversion), Error> {
    let mut out = Vec::new();
    let conversion = to_camel(input.as_bytes(), &mut out)?;
    let text = String::from_utf8(out).expect("output is UTF-8");
    serde_json::from_str::<Value>(&text).expect("output is valid JSON");
    assert!(!text.contains('\n') && !text.contains('\r'), "{text}");
    Ok((text, conversion))
}

fn camel(input: &str) -> String {
    convert(input).expect("converts").0
}

fn error_kind(input: &[u8]) -> ErrorKind {
    let mut out = b"kept".to_vec();
    let error = to_camel(input, &mut out).expect_err("should fail");
    assert_eq!(out, b"kept", "out untouched on error");
    error.kind
}

#[test]
fn renames_top_level_fields_and_keeps_values() {
    let (out, conv) = convert(
        r#"{"event_id":"AQI=","source_type":"GCS","event_type":"NODE_DEFINITION_EVENT","session_name":"s","message":"","timestamp":"2026-11-22T02:06:58.296946637Z"}"#,
    )
    .unwrap();
    assert_eq!(
        out,
        r#"{"eventId":"AQI=","sourceType":"GCS","eventType":"NODE_DEFINITION_EVENT","sessionName":"s","message":"","timestamp":"2026-11-22T02:06:58.296946637Z"}"#
    );
    assert_eq!(
        conv,
        Conversion {
            unknown_fields: 0,
            renamed_fields: 4
        }
    );
}

#[test]
fn map_keys_are_never_renamed() {
    let out = camel(
        r#"{"task_definition_event":{"required_resources":{"CPU":1.0,"my_custom_res":2,"node:10.0.0.1":0.001},"label_selector":{"ray.io/node_type":"worker_group","zone_id":"!in(a_b)"},"ref_ids":{"arg_0":"AAE="}},
            "node_definition_event":{"labels":{"ray.io/node-id":"ab","team_name":"x_y"}},
            "node_lifecycle_event":{"state_transitions":[{"resources":{"object_store_memory":7.0,"node:__internal_head__":1.0},"alive_sub_state":"UNSPECIFIED"}]},
            "driver_job_definition_event":{"config":{"metadata":{"job_submission_id":"raysubmit_1"}}}}"#,
    );
    assert_eq!(
        out,
        concat!(
            r#"{"taskDefinitionEvent":{"requiredResources":{"CPU":1.0,"my_custom_res":2,"node:10.0.0.1":0.001},"labelSelector":{"ray.io/node_type":"worker_group","zone_id":"!in(a_b)"},"refIds":{"arg_0":"AAE="}},"#,
            r#""nodeDefinitionEvent":{"labels":{"ray.io/node-id":"ab","team_name":"x_y"}},"#,
            r#""nodeLifecycleEvent":{"stateTransitions":[{"resources":{"object_store_memory":7.0,"node:__internal_head__":1.0},"aliveSubState":"UNSPECIFIED"}]},"#,
            r#""driverJobDefinitionEvent":{"config":{"metadata":{"job_submission_id":"raysubmit_1"}}}}"#
        )
    );
}

#[test]
fn map_keys_with_escapes_are_copied_as_sent() {
    let out = camel(r#"{"node_definition_event":{"labels":{"a\u005fb":"c\"d","e\\f":""}}}"#);
    assert_eq!(
        out,
        r#"{"nodeDefinitionEvent":{"labels":{"a\u005fb":"c\"d","e\\f":""}}}"#
    );
}

#[test]
fn nested_messages_are_walked() {
    let out = camel(
        r#"{"task_lifecycle_event":{"ray_error_info":{"error_type":"ACTOR_DIED","actor_died_error":{"actor_died_error_context":{"never_started":true,"node_death_info":{"reason_message":"oom","reason":"UNEXPECTED_TERMINATION"}}}},"task_log_info":{"stdout_start":"512"}}}"#,
    );
    assert_eq!(
        out,
        r#"{"taskLifecycleEvent":{"rayErrorInfo":{"errorType":"ACTOR_DIED","actorDiedError":{"actorDiedErrorContext":{"neverStarted":true,"nodeDeathInfo":{"reasonMessage":"oom","reason":"UNEXPECTED_TERMINATION"}}}},"taskLogInfo":{"stdoutStart":"512"}}}"#
    );
}

#[test]
fn repeated_messages_are_walked_element_by_element() {
    let out = camel(
        r#"{"worker_lifecycle_event":{"state_transitions":[{"state":"ALIVE","worker_launch_time_ms":"1"},{"state":"DEAD","death_info":{"exit_type":"USER_ERROR","exit_detail":"a_b"}},null,{}]},
            "task_profile_events":{"profile_events":{"component_id":"AQ==","events":[{"event_name":"task::f","start_time":"1","extra_data":"{\"k_v\": 1}"}]}}}"#,
    );
    assert_eq!(
        out,
        concat!(
            r#"{"workerLifecycleEvent":{"stateTransitions":[{"state":"ALIVE","workerLaunchTimeMs":"1"},{"state":"DEAD","deathInfo":{"exitType":"USER_ERROR","exitDetail":"a_b"}},null,{}]},"#,
            r#""taskProfileEvents":{"profileEvents":{"componentId":"AQ==","events":[{"eventName":"task::f","startTime":"1","extraData":"{\"k_v\": 1}"}]}}}"#
        )
    );
}

#[test]
fn repeated_scalars_are_copied() {
    let out = camel(
        r#"{"task_definition_event":{"fallback_strategy":{"options":[{"label_selector":{"label_constraints":[{"label_key":"k_1","operator":"LABEL_OPERATOR_IN","label_values":["a_b", "c"]}]}}]}}}"#,
    );
    assert_eq!(
        out,
        r#"{"taskDefinitionEvent":{"fallbackStrategy":{"options":[{"labelSelector":{"labelConstraints":[{"labelKey":"k_1","operator":"LABEL_OPERATOR_IN","labelValues":["a_b", "c"]}]}}]}}}"#
    );
}

#[test]
fn unknown_fields_keep_their_values_and_get_a_camel_name() {
    let (out, conv) = convert(
        r#"{"event_id":"AQ==","new_top_field":{"inner_key":[1,{"deep_key":null}]},"task_lifecycle_event":{"task_id":"AQ==","future_field_2":"x_y","alreadyCamel":1}}"#,
    )
    .unwrap();
    assert_eq!(
        out,
        r#"{"eventId":"AQ==","newTopField":{"inner_key":[1,{"deep_key":null}]},"taskLifecycleEvent":{"taskId":"AQ==","futureField2":"x_y","alreadyCamel":1}}"#
    );
    assert_eq!(
        conv,
        Conversion {
            unknown_fields: 3,
            renamed_fields: 5
        }
    );
}

#[test]
fn names_longer_than_any_key_are_unknown() {
    let long = "a_very_long_unknown_field_name_of_a_future_ray";
    assert!(long.len() > fields::MAX_KEY_LEN);
    let escaped = long.replace('_', "\\u005f");
    let (out, conv) = convert(&format!(r#"{{"{long}":1,"x":{{"{escaped}":2}}}}"#)).unwrap();
    assert_eq!(
        out,
        r#"{"aVeryLongUnknownFieldNameOfAFutureRay":1,"x":{"a\u005fvery\u005flong\u005funknown\u005ffield\u005fname\u005fof\u005fa\u005ffuture\u005fray":2}}"#
    );
    assert_eq!(conv.unknown_fields, 2);
    // At the top level the escaped spelling is renamed too (the inner one was a value).
    let out = camel(&format!(r#"{{"{escaped}":2}}"#));
    assert_eq!(out, r#"{"aVeryLongUnknownFieldNameOfAFutureRay":2}"#);
}

#[test]
fn unknown_payload_of_a_newer_ray_is_copied_whole() {
    // A payload message the table does not know: its name follows the rule, its inner
    // keys stay as sent (its type is unknown, so they could be map keys).
    let out = camel(r#"{"autoscaler_scaling_event":{"node_type":"cpu_worker","count":2}}"#);
    assert_eq!(
        out,
        r#"{"autoscalerScalingEvent":{"node_type":"cpu_worker","count":2}}"#
    );
}

#[test]
fn json_name_rule_matches_protoc() {
    // Pairs checked against protobuf's own descriptor json_name (upb, protobuf 7.36.2).
    for (snake, expected) in [
        ("foo__bar", "fooBar"),
        ("_foo", "Foo"),
        ("foo_", "foo"),
        ("foo_1bar", "foo1bar"),
        ("Foo_bar", "FooBar"),
        ("foo_bar_baz", "fooBarBaz"),
        ("a_b_c", "aBC"),
        ("x__", "x"),
        ("foo_Bar", "fooBar"),
        ("_", ""),
        ("__a", "A"),
        ("a9_z", "a9Z"),
        ("fooBar", "fooBar"),
    ] {
        let out = camel(&format!(r#"{{"{snake}":0}}"#));
        assert_eq!(out, format!(r#"{{"{expected}":0}}"#), "{snake}");
    }
}

#[test]
fn the_rule_gives_every_json_name_in_the_table() {
    // The unknown-field rule and the table agree on every field Ray 2.60 has, so a field
    // is named the same whether or not the table knows it.
    for msg in &fields::MESSAGES {
        for field in msg.fields {
            let out = camel(&format!(r#"{{"x_{}":0}}"#, field.proto_name));
            let mut expected = String::from("x");
            let mut first = field.json_name.chars();
            expected.extend(first.next().map(|c| c.to_ascii_uppercase()));
            expected.extend(first);
            assert_eq!(
                out,
                format!(r#"{{"{expected}":0}}"#),
                "{}: a custom json_name? The table is right for it; an unknown field of a \
                 newer Ray with such a name would be named by the rule",
                msg.name
            );
        }
    }
}

#[test]
fn escapes_in_values_are_copied_and_escaped_keys_recognised() {
    let (out, conv) = convert(
        r#"{"\u0065vent_id":"a\"b\\c\/\u00e9\ud83d\ude00\n","message":"tab\there","ev\u0065ntType":"X","odd_\u006eame\u005fx":1,"k\"_q":2,"\u00e9_a":3}"#,
    )
    .unwrap();
    assert_eq!(
        out,
        r#"{"eventId":"a\"b\\c\/\u00e9\ud83d\ude00\n","message":"tab\there","eventType":"X","oddNameX":1,"k\"Q":2,"\u00e9A":3}"#
    );
    assert_eq!(conv.unknown_fields, 3);
    assert_eq!(conv.renamed_fields, 5);
}

#[test]
fn camel_and_mixed_input_come_out_with_the_same_names() {
    let camel_in = r#"{"eventId":"AQ==","taskLifecycleEvent":{"stateTransitions":[{"state":"RUNNING"}],"workerPid":7},"message":""}"#;
    let (out, conv) = convert(camel_in).unwrap();
    assert_eq!(out, camel_in);
    assert_eq!(conv, Conversion::default());
    let mixed = r#"{"event_id":"AQ==","taskLifecycleEvent":{"state_transitions":[{"state":"RUNNING"}],"workerPid":7},"message":""}"#;
    assert_eq!(camel(mixed), camel_in);
    assert_eq!(camel(&camel(mixed)), camel_in);
}

#[test]
fn whitespace_is_dropped_between_walked_tokens_and_line_breaks_never_survive() {
    let input = "\r\n { \"event_id\" :\t\"AQ==\" ,\n \"new_field\" : [ 1 ,\r\n 2 ] ,\"node_definition_event\":{ \"labels\" : { \"a b\" : \"c d\" } } }\n";
    assert_eq!(
        camel(input),
        r#"{"eventId":"AQ==","newField":[ 1 ,   2 ],"nodeDefinitionEvent":{"labels":{"a b":"c d"}}}"#
    );
}

#[test]
fn null_and_mistyped_values_are_copied() {
    let out = camel(
        r#"{"task_lifecycle_event":null,"node_lifecycle_event":{"state_transitions":{"a_b":1}},"task_definition_event":{"required_resources":[1,2]}}"#,
    );
    assert_eq!(
        out,
        r#"{"taskLifecycleEvent":null,"nodeLifecycleEvent":{"stateTransitions":{"a_b":1}},"taskDefinitionEvent":{"requiredResources":[1,2]}}"#
    );
}

#[test]
fn numbers_and_literals_are_copied_as_sent() {
    let out = camel(
        r#"{"node_lifecycle_event":{"state_transitions":[{"resources":{"memory":17385201255.0,"x":-0.5e-3,"y":1E+2,"z":0}}]},"actor_definition_event":{"is_detached":false},"new":[true,null]}"#,
    );
    assert_eq!(
        out,
        r#"{"nodeLifecycleEvent":{"stateTransitions":[{"resources":{"memory":17385201255.0,"x":-0.5e-3,"y":1E+2,"z":0}}]},"actorDefinitionEvent":{"isDetached":false},"new":[true,null]}"#
    );
}

#[test]
fn appends_to_out() {
    let mut out = b"[".to_vec();
    to_camel(br#"{"event_id":"AQ=="}"#, &mut out).unwrap();
    out.push(b',');
    to_camel(br#"{"eventId":"Ag=="}"#, &mut out).unwrap();
    assert_eq!(out, br#"[{"eventId":"AQ=="},{"eventId":"Ag=="}"#);
}

#[test]
fn depth_is_bounded() {
    let nested = |n: usize| format!(r#"{{"x_y":{}0{}}}"#, "[".repeat(n), "]".repeat(n));
    // The event object itself is one level. (Not `convert`: serde_json's own limit,
    // which the output check would hit, is slightly lower than ours.)
    let deepest = nested(MAX_DEPTH - 1);
    let mut out = Vec::new();
    to_camel(deepest.as_bytes(), &mut out).unwrap();
    assert_eq!(out, deepest.replace("x_y", "xY").as_bytes());
    assert_eq!(error_kind(nested(MAX_DEPTH).as_bytes()), ErrorKind::TooDeep);
    assert_eq!(error_kind(nested(100_000).as_bytes()), ErrorKind::TooDeep);
    // Objects inside a copied value count the same.
    let deep_objects = format!(r#"{{"a":{}1{}}}"#, r#"{"a":"#.repeat(500), "}".repeat(500));
    assert_eq!(error_kind(deep_objects.as_bytes()), ErrorKind::TooDeep);
}

#[test]
fn duplicate_known_fields_are_an_error() {
    assert_eq!(
        error_kind(br#"{"event_id":"AQ==","eventId":"AQ=="}"#),
        ErrorKind::DuplicateField {
            json_name: "eventId"
        }
    );
    assert_eq!(
        error_kind(
            br#"{"node_lifecycle_event":{"state_transitions":[{"state":"A","state":"B"}]}}"#
        ),
        ErrorKind::DuplicateField { json_name: "state" }
    );
    // Map keys and unknown keys are not checked: they are copied.
    assert!(
        convert(r#"{"x":1,"x":2,"node_definition_event":{"labels":{"a":"1","a":"2"}}}"#).is_ok()
    );
}

#[test]
fn malformed_input_is_an_error() {
    let cases: &[(&[u8], ErrorKind)] = &[
        (b"", ErrorKind::UnexpectedEnd),
        (b"  ", ErrorKind::UnexpectedEnd),
        (b"[]", ErrorKind::NotAnObject),
        (b"\"event_id\"", ErrorKind::NotAnObject),
        (b"{} x", ErrorKind::TrailingBytes),
        (b"{}{}", ErrorKind::TrailingBytes),
        (
            b"{\"a\":1,}",
            ErrorKind::UnexpectedByte {
                found: b'}',
                expected: "a string (object key)",
            },
        ),
        (
            b"{\"a\" 1}",
            ErrorKind::UnexpectedByte {
                found: b'1',
                expected: "':' after a key",
            },
        ),
        (
            b"{\"a\":1 \"b\":2}",
            ErrorKind::UnexpectedByte {
                found: b'"',
                expected: "',' or '}' after a field",
            },
        ),
        (
            b"{a:1}",
            ErrorKind::UnexpectedByte {
                found: b'a',
                expected: "a string (object key)",
            },
        ),
        (
            b"{\"a\":[1,]}",
            ErrorKind::UnexpectedByte {
                found: b']',
                expected: "a JSON value",
            },
        ),
        (
            b"{\"a\":[1 2]}",
            ErrorKind::UnexpectedByte {
                found: b'2',
                expected: "',' or ']' after an element",
            },
        ),
        (
            b"{\"a\":tru}",
            ErrorKind::UnexpectedByte {
                found: b't',
                expected: "true, false or null",
            },
        ),
        (b"{\"a\":nul", ErrorKind::UnexpectedEnd),
        (
            b"{\"a\":01}",
            ErrorKind::UnexpectedByte {
                found: b'1',
                expected: "',' or '}' after a field",
            },
        ),
        (b"{\"a\":1.}", ErrorKind::InvalidNumber),
        (b"{\"a\":-}", ErrorKind::InvalidNumber),
        (b"{\"a\":1e}", ErrorKind::InvalidNumber),
        (
            b"{\"a\":+1}",
            ErrorKind::UnexpectedByte {
                found: b'+',
                expected: "a JSON value",
            },
        ),
        (b"{\"a\":\"x\\q\"}", ErrorKind::InvalidEscape),
        (b"{\"a\":\"\\u12g4\"}", ErrorKind::InvalidEscape),
        (b"{\"a\":\"\\u12", ErrorKind::UnexpectedEnd),
        (b"{\"a\":\"x\ny\"}", ErrorKind::ControlCharacter),
        (b"{\"a\":\"x\x00\"}", ErrorKind::ControlCharacter),
        (b"{\"a\":\"x", ErrorKind::UnexpectedEnd),
        (b"{\"a\\", ErrorKind::UnexpectedEnd),
        (
            b"{\"node_definition_event\":{\"labels\":{\"a\":1,}}}",
            ErrorKind::UnexpectedByte {
                found: b'}',
                expected: "a string (object key)",
            },
        ),
        (
            b"{\"task_lifecycle_event\":{\"state_transitions\":[{},]}}",
            ErrorKind::UnexpectedByte {
                found: b']',
                expected: "a JSON value",
            },
        ),
        (
            b"{\"a\":'x'}",
            ErrorKind::UnexpectedByte {
                found: b'\'',
                expected: "a JSON value",
            },
        ),
    ];
    for (input, kind) in cases {
        assert_eq!(
            error_kind(input),
            *kind,
            "{}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn every_truncation_of_an_event_is_an_error() {
    let event = br#"{"event_id":"AQ==","task_definition_event":{"required_resources":{"CPU":1.0},"task_func":{"python_function_descriptor":{"module_name":"m\"x"}},"new_x":[1,{"a":"\u00e9"}]},"node_lifecycle_event":{"state_transitions":[{"state":"ALIVE"}]}}"#;
    assert!(to_camel(event, &mut Vec::new()).is_ok());
    for len in 0..event.len() {
        let mut out = Vec::new();
        assert!(to_camel(&event[..len], &mut out).is_err(), "prefix {len}");
        assert!(out.is_empty());
    }
}

#[test]
fn agrees_with_serde_on_mutated_input() {
    // Byte mutations of a realistic event: never a panic; what serde_json accepts as an
    // object we accept, and our output is then valid JSON with the same values.
    let event = br#"{"event_id":"AQ==","task_definition_event":{"required_resources":{"CPU":1.0},"task_func":{"python_function_descriptor":{"module_name":"m\"x"}},"new_x":[1,{"a":"\u00e9"}],"task_attempt":0},"node_lifecycle_event":{"state_transitions":[{"state":"ALIVE","resources":{"m_x":-1.5e3}}]}}"#;
    let alphabet = b"{}[],:\"\\ u0123456789.eE+-tfnlx_aA\n\x01";
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut accepted = 0;
    for _ in 0..20_000 {
        let mut input = event.to_vec();
        for _ in 0..1 + next() % 3 {
            let at = (next() % input.len() as u64) as usize;
            let byte = alphabet[(next() % alphabet.len() as u64) as usize];
            match next() % 3 {
                0 => input[at] = byte,
                1 => input.insert(at, byte),
                _ => {
                    input.remove(at);
                }
            }
        }
        let mut out = Vec::new();
        let ours = to_camel(&input, &mut out);
        let theirs = serde_json::from_slice::<Value>(&input);
        match (&ours, &theirs) {
            (Ok(_), Ok(_)) => {
                accepted += 1;
                let out: Value = serde_json::from_slice(&out).expect("valid output");
                assert!(out.is_object());
            }
            (Err(e), Ok(Value::Object(_))) => {
                assert!(
                    matches!(e.kind, ErrorKind::DuplicateField { .. }),
                    "rejected valid {:?}: {e}",
                    String::from_utf8_lossy(&input)
                );
            }
            (Ok(_), Err(error)) => {
                // Only what we do not check: UTF-8 (we copy it) and surrogate escapes.
                assert!(
                    std::str::from_utf8(&input).is_err() || error.to_string().contains("surrogate"),
                    "accepted invalid {:?}: {error}",
                    String::from_utf8_lossy(&input)
                );
            }
            _ => {}
        }
    }
    assert!(accepted > 100, "only {accepted} mutations stayed valid");
}

#[test]
fn string_stop_search_finds_the_first_stop_byte() {
    let naive = |bytes: &[u8]| bytes.iter().position(|&b| STRING_STOP[usize::from(b)]);
    // Every byte value at every position of a 0..24-byte run of plain bytes, with plain
    // bytes that sit next to the stop bytes in value, and a second stop after the first.
    for len in 0..24 {
        for at in 0..=len {
            for byte in 0..=255u8 {
                for plain in [b'a', b'!', b'#', b'[', b']', 0x20, 0x7f, 0x80, 0xff] {
                    let mut bytes = vec![plain; len];
                    if at < len {
                        bytes[at] = byte;
                    }
                    assert_eq!(find_string_stop(&bytes, 0), naive(&bytes), "{bytes:?}");
                    bytes.extend_from_slice(b"\\x\"\x01");
                    assert_eq!(find_string_stop(&bytes, 0), naive(&bytes), "{bytes:?}");
                    let from = len.min(3);
                    assert_eq!(
                        find_string_stop(&bytes, from),
                        naive(&bytes[from..]).map(|n| n + from)
                    );
                }
            }
        }
    }
}

#[test]
fn table_is_consistent() {
    assert_eq!(
        fields::MESSAGES[usize::from(fields::RAY_EVENT)].name,
        "ray.rpc.events.RayEvent"
    );
    let id_ok = |id: MessageId| usize::from(id) < fields::MESSAGES.len();
    let mut longest = 0;
    for msg in &fields::MESSAGES {
        assert!(msg.fields.len() <= 64, "{}: seen-set is a u64", msg.name);
        assert!(
            msg.keys
                .windows(2)
                .all(|w| (w[0].name.len(), w[0].name) < (w[1].name.len(), w[1].name)),
            "{}: keys sorted and unique",
            msg.name
        );
        for (len, range) in msg.by_len.windows(2).enumerate() {
            let keys = &msg.keys[usize::from(range[0])..usize::from(range[1])];
            assert!(keys.iter().all(|key| key.name.len() == len), "{}", msg.name);
        }
        assert_eq!(usize::from(*msg.by_len.last().unwrap()), msg.keys.len());
        for key in msg.keys {
            let field = &msg.fields[usize::from(key.field)];
            if key.is_json_name {
                assert_eq!(key.name, field.json_name);
            } else {
                assert_eq!(key.name, field.proto_name);
                assert_ne!(key.name, field.json_name);
            }
            longest = longest.max(key.name.len());
        }
        for field in msg.fields {
            for name in [field.proto_name, field.json_name] {
                assert!(msg.keys.iter().any(|key| key.name == name), "{name}");
            }
            match field.kind {
                Kind::Message(id) | Kind::RepeatedMessage(id) => assert!(id_ok(id)),
                Kind::Map(MapValue::Message(id)) => assert!(id_ok(id)),
                Kind::Copy | Kind::Opaque | Kind::Map(_) => {}
            }
        }
    }
    assert_eq!(longest, fields::MAX_KEY_LEN);
}
