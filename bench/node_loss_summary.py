#!/usr/bin/env python3
"""The node-loss table of BENCHMARKS.md from `rhc-chaos --only node-loss --json FILE` runs.

    bench/node_loss_summary.py [LABEL=]before.jsonl [LABEL=]after.jsonl

One row per store and rate: for each run, the worst loss window over its kill moments, the
acknowledged events lost (of those acknowledged), the most objects any partition had, and the
versions a reader polled (bad ones in brackets). The last node-loss verdict of each file counts.
"""
import json
import sys


def cases(path):
    last = None
    with open(path) as f:
        for line in f:
            v = json.loads(line)
            if v.get("scenario") == "node-loss":
                last = v
    if last is None:
        sys.exit(f"{path}: no node-loss verdict")
    return last["verdict"], last["figures"]["window_limit_s"], last["figures"]["cases"]


def rows(cs):
    out = {}
    for c in cs:
        key = (c["backend"], c["collector"], c["rate"])
        r = out.setdefault(key, {"window": 0.0, "lost": 0, "acked": 0, "objects": 0,
                                 "versions": 0, "bad": 0, "kills": 0, "invalid": 0})
        r["window"] = max(r["window"], c["loss_window_s"])
        r["lost"] += c["lost"]
        r["acked"] += c["acked"]
        r["objects"] = max(r["objects"], c["max_objects_per_partition"])
        r["versions"] += c["versions_read"]
        r["bad"] += len(c["version_problems"])
        r["invalid"] += len(c["problems"])
        r["kills"] += 1
    return out


def main():
    runs = []
    for arg in sys.argv[1:]:
        label, _, path = arg.rpartition("=")
        runs.append((label or path, *cases(path)))
    tables = [rows(cs) for _, _, _, cs in runs]
    keys = sorted({k for t in tables for k in t}, key=lambda k: (k[0] != "file", k[1], k[2]))
    head = "| store | collector | events/s | kills |"
    rule = "|---|---|---|---|"
    for p, verdict, limit, _ in runs:
        head += f" {p}: worst window (s) | lost of acked | objects per partition (max) | versions polled (bad) |"
        rule += "---|---|---|---|"
    print(head)
    print(rule)
    for k in keys:
        line = f"| {k[0]} | {k[1]} | {k[2]:,.0f} | {max(t.get(k, {}).get('kills', 0) for t in tables)} |"
        for t in tables:
            r = t.get(k)
            if r is None:
                line += " – | – | – | – |"
                continue
            pct = 100.0 * r["lost"] / r["acked"] if r["acked"] else 0.0
            line += (f" {r['window']:.1f} | {r['lost']:,} of {r['acked']:,} ({pct:.1f} %) |"
                     f" {r['objects']}{' (invalid!)' if r['invalid'] else ''} | {r['versions']} ({r['bad']}) |")
        print(line)
    for p, verdict, limit, _ in runs:
        print(f"\n{p}: {verdict} (window limit {limit} s)")


if __name__ == "__main__":
    main()
