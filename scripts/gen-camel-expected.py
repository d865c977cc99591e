#!/usr/bin/env python3
"""Write the camelCase oracle for a snake_case fixture: protobuf's own printing of each event.

Usage (from the repository root, with the test venv that has Ray installed):

    .test-deps/venv/bin/python scripts/gen-camel-expected.py \\
        tests/data/posts-snake.jsonl tests/data/posts-snake.camel-expected.jsonl

Input: one POST body per line (a JSON array of RayEvent objects, snake_case keys, as Ray sends
them with RAY_DASHBOARD_AGGREGATOR_AGENT_PRESERVE_PROTO_FIELD_NAME=1). Output: one JSON object
per line, the events of the input in order, each being

    MessageToDict(Parse(event, RayEvent()), always_print_fields_with_no_presence=True)

i.e. what Ray itself would have sent for the same message without PRESERVE_PROTO_FIELD_NAME.

Why always_print_fields_with_no_presence=True: Ray's publisher
(dashboard/modules/aggregator/publisher/async_publisher_client.py) prints with exactly that flag,
only adding preserving_proto_field_name when asked for snake_case. So the fields present in
Ray's snake output are the ones protobuf prints with that flag (scalars and enums at their
default, empty maps and lists; unset messages and unset `optional` fields omitted), and the
camelCase oracle must use the same flag to print the same set of fields. Without it, every
`"message": ""`, `taskAttempt: 0`, `refIds: {}` ... would be missing from the oracle though it
is present in Ray's output (and so in a faithful conversion). This script checks that claim for
every event: re-printing the parsed message with preserving_proto_field_name=True must give back
exactly the event Ray sent, or it stops with an error.

Deterministic: the same input and Ray give byte-identical output (keys are sorted, since
protobuf's map order is not stable from one run to the next).
"""

import json
import sys


def main(argv):
    if len(argv) not in (2, 3):
        sys.stderr.write("usage: %s INPUT.jsonl [OUTPUT.jsonl]\n" % argv[0])
        return 2
    from google.protobuf import json_format
    from ray.core.generated.events_base_event_pb2 import RayEvent

    lines = []
    with open(argv[1], encoding="utf-8") as f:
        for body_no, body in enumerate(f, 1):
            if not body.strip():
                continue
            for event_no, event in enumerate(json.loads(body)):
                msg = json_format.Parse(json.dumps(event), RayEvent())
                camel = json_format.MessageToDict(msg, always_print_fields_with_no_presence=True)
                snake = json_format.MessageToDict(
                    msg,
                    always_print_fields_with_no_presence=True,
                    preserving_proto_field_name=True,
                )
                # (A camelCase input, e.g. the camel fixture, is checked against camel.)
                if event not in (snake, camel):
                    sys.stderr.write(
                        "gen-camel-expected: body %d event %d: protobuf does not print back what "
                        "Ray sent; the oracle's flags do not match Ray's\n" % (body_no, event_no))
                    return 1
                # sort_keys: protobuf's map order is not stable between runs; the test compares
                # JSON values, so key order does not matter, and sorting makes the file stable.
                lines.append(json.dumps(camel, separators=(",", ":"), sort_keys=True) + "\n")

    text = "".join(lines)
    if len(argv) == 3:
        with open(argv[2], "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
