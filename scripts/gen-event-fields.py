#!/usr/bin/env python3
"""Generate src/events/camel/fields.rs: the RayEvent field table for the camelCase converter.

Usage (from the repository root, with the test venv that has Ray installed):

    .test-deps/venv/bin/python scripts/gen-event-fields.py src/events/camel/fields.rs

Without a path argument the Rust source goes to stdout.

What it does: starting at ray.rpc.events.RayEvent, it walks the protobuf descriptors of the
installed Ray (the `ray.core.generated.events_*_pb2` modules and what they import) and writes,
for every message reachable from RayEvent, each field's proto name (what Ray sends with
RAY_DASHBOARD_AGGREGATOR_AGENT_PRESERVE_PROTO_FIELD_NAME=1), its json_name (what it sends by
default, and what KubeRay's history server reads) and how its JSON value is shaped:

    Kind::Copy                  scalar, enum, string, bytes, a repeated one of those, or a
                                well-known type printed as a JSON scalar (Timestamp, Duration,
                                FieldMask, the wrappers): copied as sent
    Kind::Opaque                Struct, Value, ListValue, Any, Empty: arbitrary JSON, copied
    Kind::Message(i)            an object of message MESSAGES[i], walked
    Kind::RepeatedMessage(i)    an array of such objects, each walked
    Kind::Map(MapValue::...)    an object whose keys are data (never renamed); values are Copy,
                                Opaque or Message(i)

Map entry messages and the well-known types above get no entry of their own.

The output is deterministic: the same Ray (same descriptors) gives byte-identical output, so a
test can regenerate the file and compare. Nothing in it depends on the time, the machine, dict
or set ordering, or the protobuf runtime's version; RayEvent is message 0 and the other
messages follow sorted by full name; fields are listed in field-number order; lookup keys are
sorted by length, then bytewise, and `by_len` gives where each length starts, so a lookup only
compares the one to four keys of the name's own length.
"""

import sys

# Well-known types whose proto3 JSON form is a JSON scalar (string, number, bool): copied.
WKT_SCALAR = {
    "google.protobuf.Timestamp",
    "google.protobuf.Duration",
    "google.protobuf.FieldMask",
    "google.protobuf.DoubleValue",
    "google.protobuf.FloatValue",
    "google.protobuf.Int64Value",
    "google.protobuf.UInt64Value",
    "google.protobuf.Int32Value",
    "google.protobuf.UInt32Value",
    "google.protobuf.BoolValue",
    "google.protobuf.StringValue",
    "google.protobuf.BytesValue",
}
# Well-known types whose JSON form is arbitrary JSON (user data, or for Any a type URL plus a
# message we cannot resolve here): copied verbatim, never walked.
WKT_OPAQUE = {
    "google.protobuf.Struct",
    "google.protobuf.Value",
    "google.protobuf.ListValue",
    "google.protobuf.Any",
    "google.protobuf.Empty",
}

ROOT = "ray.rpc.events.RayEvent"
# The converter keeps a u64 bitset of the fields seen in one object (duplicate detection).
MAX_FIELDS_PER_MESSAGE = 64
# Message ids are u16 in the Rust table.
MAX_MESSAGES = 1 << 16


def die(msg):
    sys.stderr.write("gen-event-fields: error: %s\n" % msg)
    sys.exit(1)


def is_message(field):
    return field.message_type is not None


def is_map(field):
    return is_message(field) and field.message_type.GetOptions().map_entry


def is_repeated(field):
    # protobuf >= 5 has is_repeated; older runtimes only have label.
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def walked(desc):
    """True if values of this message type are objects the converter walks."""
    return desc.full_name not in WKT_SCALAR and desc.full_name not in WKT_OPAQUE


def collect(root):
    """Every walked message reachable from root, map entries excluded (their value type is not)."""
    seen = {}
    stack = [root]
    while stack:
        desc = stack.pop()
        if desc.full_name in seen:
            continue
        seen[desc.full_name] = desc
        for field in desc.fields:
            if not is_message(field):
                continue
            target = field.message_type
            if is_map(field):
                target = target.fields_by_name["value"].message_type
                if target is None:
                    continue
            if walked(target) and target.full_name not in seen:
                stack.append(target)
    rest = sorted(name for name in seen if name != root.full_name)
    return [root] + [seen[name] for name in rest]


def message_kind(desc, ids):
    """The Rust expression for a value of message type desc (singular)."""
    if desc.full_name in WKT_SCALAR:
        return None, "Copy"
    if desc.full_name in WKT_OPAQUE:
        return None, "Opaque"
    return ids[desc.full_name], None


def field_kind(field, ids):
    if is_map(field):
        value = field.message_type.fields_by_name["value"]
        if not is_message(value):
            return "Kind::Map(MapValue::Copy)"
        idx, plain = message_kind(value.message_type, ids)
        if idx is None:
            return "Kind::Map(MapValue::%s)" % plain
        return "Kind::Map(MapValue::Message(%d))" % idx
    if is_message(field):
        idx, plain = message_kind(field.message_type, ids)
        if idx is None:
            return "Kind::%s" % plain
        if is_repeated(field):
            return "Kind::RepeatedMessage(%d)" % idx
        return "Kind::Message(%d)" % idx
    return "Kind::Copy"


def proto_json_name(name):
    """protoc's ToJsonName: drop each '_' and upper-case (ASCII) the character after it."""
    out = []
    upper = False
    for ch in name:
        if ch == "_":
            upper = True
        elif upper:
            out.append(ch.upper() if "a" <= ch <= "z" else ch)
            upper = False
        else:
            out.append(ch)
    return "".join(out)


def rust_str(s):
    for ch in s:
        if not (ch.isascii() and (ch.isalnum() or ch in "_.")):
            die("unexpected character %r in name %r" % (ch, s))
    return '"%s"' % s


def generate(ray_version, root):
    messages = collect(root)
    if len(messages) > MAX_MESSAGES:
        die("%d messages do not fit a u16 id" % len(messages))
    ids = {desc.full_name: i for i, desc in enumerate(messages)}

    max_name = 0
    body = []
    for i, desc in enumerate(messages):
        fields = sorted(desc.fields, key=lambda f: f.number)
        if len(fields) > MAX_FIELDS_PER_MESSAGE:
            die("%s has %d fields; the converter's seen-set holds %d"
                % (desc.full_name, len(fields), MAX_FIELDS_PER_MESSAGE))
        keys = {}  # name -> (field index, is the json_name)
        for index, field in enumerate(fields):
            for name in (field.name, field.json_name):
                entry = (index, name == field.json_name)
                if keys.get(name, entry) != entry:
                    die("%s: key %r names two fields" % (desc.full_name, name))
                keys[name] = entry
                max_name = max(max_name, len(name.encode("utf-8")))
        body.append("    // %d" % i)
        body.append("    Message {")
        body.append("        name: %s," % rust_str(desc.full_name))
        body.append("        fields: &[")
        for field in fields:
            notes = []
            if field.json_name != proto_json_name(field.name):
                notes.append("custom json_name")
            kind = field_kind(field, ids)
            if "Message(" in kind:
                notes.append(messages[int(kind.rsplit("(", 1)[1].rstrip(")"))].full_name)
            note = " // " + "; ".join(notes) if notes else ""
            body.append("            Field { proto_name: %s, json_name: %s, kind: %s },%s" % (
                rust_str(field.name), rust_str(field.json_name), kind, note))
        body.append("        ],")
        ordered = sorted(keys, key=lambda k: (len(k.encode("utf-8")), k.encode("utf-8")))
        if len(ordered) > 255:
            die("%s: %d keys do not fit the u8 offsets of by_len" % (desc.full_name, len(ordered)))
        body.append("        keys: &[")
        # Packed several to a line (the file stays short enough to read); one key per item.
        line = ""
        for name in ordered:
            index, is_json = keys[name]
            item = "Key::%s(%s, %d)," % ("json" if is_json else "proto", rust_str(name), index)
            if line and len(line) + 1 + len(item) > 88:
                body.append("            " + line)
                line = ""
            line = item if not line else line + " " + item
        if line:
            body.append("            " + line)
        body.append("        ],")
        # by_len[n]..by_len[n + 1] are the keys of n bytes; one entry past the longest key.
        lengths = [len(name.encode("utf-8")) for name in ordered]
        longest = max(lengths, default=0)
        by_len = [sum(1 for n in lengths if n < size) for size in range(longest + 2)]
        body.append("        by_len: &[%s]," % ", ".join(str(n) for n in by_len))
        body.append("    },")

    head = [
        "//! The RayEvent field table of ray %s, generated from Ray's protobuf descriptors." % ray_version,
        "//!",
        "//! @generated by `scripts/gen-event-fields.py` from ray %s. DO NOT EDIT BY HAND." % ray_version,
        "//! Regenerate with",
        "//! `.test-deps/venv/bin/python scripts/gen-event-fields.py src/events/camel/fields.rs`;",
        "//! `tests/camel_generated_fresh.rs` checks that this file is what the installed Ray gives.",
        "//!",
        "//! For every message reachable from `ray.rpc.events.RayEvent`: each field's proto name",
        "//! (snake_case, sent with `PRESERVE_PROTO_FIELD_NAME=1`), its `json_name` (camelCase, what",
        "//! KubeRay reads) and the shape of its JSON value ([`Kind`]). `keys` lists both spellings",
        "//! (`Key::json`, `Key::proto`), each with the index of its field in `fields`, sorted by",
        "//! length then bytewise; `keys[by_len[n]..by_len[n + 1]]` are the keys of `n` bytes, so a",
        "//! key is found, whichever way it is spelled, among the few of its own length. Message",
        "//! references are indices into [`MESSAGES`]; [`RAY_EVENT`] is the root.",
        "",
        "use super::{Field, Key, Kind, MapValue, Message, MessageId};",
        "",
        "/// The Ray release these descriptors were read from (`ray.__version__`).",
        "pub(super) const RAY_VERSION: &str = %s;" % ('"%s"' % ray_version),
        "",
        "/// Index of `ray.rpc.events.RayEvent` in [`MESSAGES`].",
        "pub(super) const RAY_EVENT: MessageId = 0;",
        "",
        "/// The longest key (proto name or json_name) in the table, in bytes.",
        "pub(super) const MAX_KEY_LEN: usize = %d;" % max_name,
        "",
        "/// Every message reachable from RayEvent; map entries and well-known types have none.",
        "pub(super) static MESSAGES: [Message; %d] = [" % len(messages),
    ]
    tail = ["];", ""]
    return "\n".join(head + body + tail)


def main(argv):
    if len(argv) > 2 or (len(argv) == 2 and argv[1] in ("-h", "--help")):
        sys.stderr.write("usage: %s [OUTPUT.rs]\n" % argv[0])
        return 2
    import ray
    from ray.core.generated import events_base_event_pb2

    text = generate(ray.__version__, events_base_event_pb2.RayEvent.DESCRIPTOR)
    if len(argv) == 2:
        with open(argv[1], "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
