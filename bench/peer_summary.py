#!/usr/bin/env python3
"""Summarizes a bench/peer.sh result directory: ours and KubeRay's collector side by side,
medians over rounds and ratios taken within each round (then their median). Writes
summary.json and table.md beside results.jsonl.

    python3 bench/peer_summary.py .bench-deps/results/peer-<timestamp> \
        [--publish bench/results/peer] [--docs <repo>]

--publish copies summary.json, table.md and machine.txt to a directory; --docs rewrites the
generated parts of <repo>/BENCHMARKS.md (between <!-- peer-bench:begin --> and
<!-- peer-bench:end -->) and <repo>/docs/sizing-and-cost.md (<!-- peer-sizing:begin/end -->).

Standard library only.
"""

import argparse
import json
import re
import shutil
import textwrap
from pathlib import Path

from summarize import fmt, load, med
from summarize import spread as rng

SUBJECTS = ["ours", "peer-gzip", "peer-plain"]
MAX_SUBJECTS = ["ours", "ours-ingest", "peer-gzip", "peer-plain"]
NAMES = {
    "ours": "ours (gzip)",
    "ours-ingest": "ours, ingest only",
    "peer-gzip": "KubeRay's, gzip",
    "peer-plain": "KubeRay's, no gzip",
}
MAX_NAMES = {
    "ours": "ours: gzip, 5 s rotation (compression and uploads inside the window)",
    "ours-ingest": "ours: ingest only (`--rotation-interval 1h`: nothing sealed in the window)",
    "peer-gzip": "KubeRay's, compression on (nothing rotated in the window: it checks every 30 s)",
    "peer-plain": "KubeRay's, compression off",
}
CHAOS_NAMES = {
    "side-kill9": "kill -9 under load, restart, resend",
    "side-sigterm": "SIGTERM under load",
    "side-outage": "storage outage",
}


def fmt_rng(values, digits):
    lo, hi = rng(values)
    if lo is None:
        return "–"
    if len([v for v in values if v is not None]) < 2:
        return fmt(med(values), digits)
    return f"{fmt(med(values), digits)} ({fmt(lo, digits)}–{fmt(hi, digits)})"


def round_of(label):
    m = re.search(r"/r(\d+)$", label or "")
    return int(m.group(1)) if m else None


# Per run: the figures a table row reads.
METRICS = {
    "cpu_per_m": lambda r: r.get("cpu_s_per_million"),
    "window_cpu_per_m": lambda r: r.get("window_cpu_s_per_million"),
    "max_rss": lambda r: r.get("max_rss_mib"),
    "window_rss": lambda r: r["load"].get("rss_peak_mib"),
    "idle_rss": lambda r: r.get("idle_rss_mib"),
    "p50": lambda r: r["load"].get("p50_ms"),
    "p99": lambda r: r["load"].get("p99_ms"),
    "eps": lambda r: r["load"].get("events_per_s"),
    "non_2xx": lambda r: r["load"].get("non_2xx"),
    "acked": lambda r: r["load"].get("acked_total"),
    "in_bucket": lambda r: r.get("bucket", {}).get("distinct_events"),
    "dup_lines": lambda r: r.get("bucket", {}).get("duplicate_lines"),
    "bytes_per_event": lambda r: (
        r["bucket"]["stored_bytes"] / r["bucket"]["distinct_events"]
        if r.get("bucket", {}).get("distinct_events")
        else None
    ),
    "shutdown": lambda r: r.get("shutdown_s"),
}


def summarize(rows):
    ok = [r for r in rows if not r.get("failed")]
    failed = [r for r in rows if r.get("failed")]
    by = {}
    for r in ok:
        kind = "max" if r.get("max") else str(r.get("rate"))
        by.setdefault(kind, {}).setdefault(r["subject"], {})[round_of(r["label"])] = r
    out = {"failed_runs": [f"{r['subject']} {r['label']}" for r in failed], "loads": {}}
    for kind, subjects in by.items():
        k = out["loads"].setdefault(kind, {"subjects": {}, "ratios": {}})
        for s, runs in subjects.items():
            k["subjects"][s] = {
                m: {"median": med([f(r) for r in runs.values()]), "values": [f(r) for r in runs.values()]}
                for m, f in METRICS.items()
            }
            k["subjects"][s]["rounds"] = len(runs)
            k["subjects"][s]["exit_codes"] = sorted({r.get("exit_code") for r in runs.values() if "exit_code" in r})
        base = "peer-gzip" if kind == "max" else "ours"
        for s in subjects:
            if s == base or base not in subjects:
                continue
            ratios = {}
            for m, f in METRICS.items():
                per_round = []
                for rnd, r in subjects[s].items():
                    b = subjects[base].get(rnd)
                    if b is None:
                        continue
                    x, y = f(r), f(b)
                    if x is not None and y:
                        per_round.append(x / y)
                ratios[m] = {"median": med(per_round), "values": per_round}
            k["ratios"][f"{s}/{base}"] = ratios
    return out


def chaos_rows(chaos):
    rows = []
    for c in chaos:
        f = c.get("figures", {})
        for who in ("ours", "peer"):
            x = f.get(who)
            if not x:
                continue
            rows.append((c["scenario"], who, x, c.get("verdict")))
    return rows


def chaos_notes(scenario, x):
    broken = x.get("check", {}).get("broken_lines") or 0
    torn = f"; **{fmt(broken)} broken JSON lines** in the bucket (torn last lines)" if broken else ""
    return _chaos_notes(scenario, x) + torn


def _chaos_notes(scenario, x):
    if scenario == "side-kill9":
        return (
            f"{fmt(x.get('resent'))} unanswered events resent after a restart; "
            f"ready {fmt(x.get('ready_after_restart_s'), 2)} s after it"
        )
    if scenario == "side-sigterm":
        return (
            f"exit {x.get('exit_code')} after {fmt(x.get('shutdown_s'), 1)} s; "
            f"{fmt(x.get('spool_mb_at_term'))} MB in the spool at the signal; "
            f"{fmt(x.get('refused_503'))} × 503 meanwhile"
        )
    if scenario == "side-outage":
        rec = x.get("recovered_s")
        dr = x.get("drained_s")
        return (
            f"{fmt(x.get('acked_during_outage'))} acked during the {fmt(x.get('outage_s'))} s outage, "
            f"first 503 after {fmt(x.get('first_503_after_cut_s'), 1)} s; "
            f"200 again {fmt(rec, 1) + ' s' if rec is not None else 'never'} and spool empty "
            f"{fmt(dr, 1) + ' s' if dr is not None else 'never'} after the restore; "
            f"exit {x.get('exit_code')} after {fmt(x.get('shutdown_s'), 1)} s"
        )
    return ""


def rate_table(summary, kind):
    k = summary["loads"].get(kind)
    if not k:
        return []
    subs = [s for s in SUBJECTS if s in k["subjects"]]
    ratio_cols = [s for s in subs if s != "ours" and f"{s}/ours" in k["ratios"]]
    rate = int(kind)
    head = f"| at {rate:,} events/s | " + " | ".join(NAMES[s] for s in subs)
    head += "".join(f" | {NAMES[s]} ÷ ours, same round" for s in ratio_cols) + " |"
    lines = [head, "|" + "---|" * (1 + len(subs) + len(ratio_cols))]

    def row(title, metric, digits, ratio=True, ratio_digits=2):
        cells = [fmt_rng(k["subjects"][s][metric]["values"], digits) for s in subs]
        for s in ratio_cols:
            cells.append(fmt(k["ratios"][f"{s}/ours"][metric]["median"], ratio_digits) if ratio else "")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")

    row("**CPU-seconds per million events**, first event to exit (ingest, spool, compression, upload, SIGTERM drain)", "cpu_per_m", 2)
    row("CPU-seconds per million events inside the measured window only", "window_cpu_per_m", 2)
    row("**peak RSS, MiB** (whole life: `wait4` `ru_maxrss` = VmHWM)", "max_rss", 1)
    row("peak RSS inside the measured window, MiB (sampled every 100 ms)", "window_rss", 1)
    row("RSS idle before the load, MiB", "idle_rss", 1)
    row("**ack latency p50, ms**", "p50", 1)
    row("**ack latency p99, ms**", "p99", 1)
    row("achieved events/s", "eps", 0)
    row("answers other than 2xx", "non_2xx", 0, ratio=False)
    row("bytes stored in the bucket per event", "bytes_per_event", 0)
    row("SIGTERM to exit, s", "shutdown", 2)
    # Every acknowledged event in the bucket, once.
    cells = []
    for s in subs:
        runs = k["subjects"][s]
        acked = sum(v for v in runs["acked"]["values"] if v)
        inb = sum(v for v in runs["in_bucket"]["values"] if v)
        dup = sum(v for v in runs["dup_lines"]["values"] if v)
        cells.append(f"{inb:,} of {acked:,} acked, {dup:,} duplicate lines")
    lines.append("| events in the bucket (all rounds) | " + " | ".join(cells) + " |" + " |" * len(ratio_cols))
    return lines


def max_table(summary):
    k = summary["loads"].get("max")
    if not k:
        return []
    subs = [s for s in MAX_SUBJECTS if s in k["subjects"]]
    lines = [
        "| unpaced: 4 clients, one 1,000-event batch at a time each | events/s with 2xx, median (range) | answers other than 2xx | ÷ KubeRay's gzip, same round |",
        "|---|---|---|---|",
    ]
    for s in subs:
        x = k["subjects"][s]
        ratio = k["ratios"].get(f"{s}/peer-gzip", {}).get("eps", {}).get("median")
        lines.append(
            f"| {MAX_NAMES[s]} | {fmt_rng(x['eps']['values'], 0)} | {fmt(sum(v for v in x['non_2xx']['values'] if v is not None))} | {fmt(ratio, 2) if s != 'peer-gzip' else '1'} |"
        )
    return lines


def chaos_table(chaos):
    rows = chaos_rows(chaos)
    if not rows:
        return []
    lines = [
        "| scenario | collector | acknowledged events | in the bucket once | lost | duplicated | what else |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario, who, x, _ in rows:
        name = "ours" if who == "ours" else "KubeRay's, gzip"
        lines.append(
            f"| {CHAOS_NAMES.get(scenario, scenario)} | {name} | {fmt(x.get('acked'))} | {fmt(x.get('once'))} | "
            f"**{fmt(x.get('lost'))}** | **{fmt(x.get('duplicated'))}** | {chaos_notes(scenario, x)} |"
        )
    return lines


def machine(out):
    m = {}
    p = out / "machine.txt"
    if p.exists():
        for line in p.read_text().splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                m[k.strip()] = v.strip()
    return m


def run_line(m, rounds):
    date = m.get("date", "?").replace("T", " ").replace("Z", " UTC")
    date = re.sub(r":\d\d UTC$", " UTC", date)
    return textwrap.fill(
        f"Run of {date} (`RHC_PEER_COLLECTOR=<KubeRay's collector> bench/peer.sh`, {rounds} "
        f"round{'s' if rounds != 1 else ''}, commit {m.get('commit', '?')}; KubeRay's collector "
        f"{peer_desc(m)}; load average {m.get('loadavg at start', '?').split()[0]} at the start, "
        f"{m.get('loadavg at end', '?').split()[0] if m.get('loadavg at end') else '?'} at the end). "
        "The machine (2 cores) was shared with other engineers' builds: absolute figures move with "
        "them, the ratios are taken within each round.",
        width=95,
        break_on_hyphens=False,
        break_long_words=False,
    )


def peer_desc(m):
    words = m.get("peer", "").split()
    go = next((w for w in words if w.startswith("go1")), None)
    path = next((w for w in words if "/" in w), None)
    if not path:
        return "(version unknown)"
    return f"`{path}`" + (f" built with {go}" if go else "")


def markdown(summary, chaos, m):
    rounds = max(
        [x.get("rounds", 0) for k in summary["loads"].values() for x in k["subjects"].values()] or [0]
    )
    parts = [run_line(m, rounds), ""]
    for kind in sorted((k for k in summary["loads"] if k != "max"), key=int, reverse=True):
        parts += rate_table(summary, kind) + [""]
    parts += max_table(summary) + [""]
    ct = chaos_table(chaos)
    if ct:
        parts += ct + [""]
    if summary["failed_runs"]:
        parts += [f"Runs that failed and are left out: {', '.join(summary['failed_runs'])}.", ""]
    return "\n".join(parts).rstrip() + "\n", rounds


def sizing(summary, m, rounds):
    loads = summary["loads"]
    subs = [s for s in SUBJECTS if all(s in loads.get(k, {}).get("subjects", {}) for k in ("2000", "25000"))]
    if not subs:
        return None
    names = {
        "ours": "ray-history-collector",
        "peer-gzip": "KubeRay's collector, gzip",
        "peer-plain": "KubeRay's collector, no gzip",
    }

    def two(metric, digits):
        out = []
        for s in subs:
            a = loads["2000"]["subjects"][s][metric]["median"]
            b = loads["25000"]["subjects"][s][metric]["median"]
            out.append(f"{fmt(a, digits)} / {fmt(b, digits)}")
        return out

    date = m.get("date", "?")[:10]
    lines = [
        f"| side by side ({date}) | " + " | ".join(names[s] for s in subs) + " |",
        "|---" * (1 + len(subs)) + "|",
        "| CPU per million events, at 2k / 25k events/s (CPU-seconds) | " + " | ".join(two("cpu_per_m", 1)) + " |",
        "| RSS at 2k / 25k events/s (peak, MiB) | " + " | ".join(two("max_rss", 0)) + " |",
    ]
    note = textwrap.fill(
        f"Medians of {rounds} round{'s' if rounds != 1 else ''} of `RHC_PEER_COLLECTOR=<KubeRay's collector> "
        "bench/peer.sh` on 2 shared cores: 1,000-event batches of Ray 2.60 events, uploads to a local S3 "
        "server; CPU from the first event to the exit (ingest, spool, compression, upload and the "
        "SIGTERM drain) per event acknowledged (CPU-seconds per million events = µs per event); "
        "RSS the peak of the whole life. KubeRay's collector "
        "acknowledges before any fsync, so the columns do not buy the same guarantee. Settings and "
        "the other figures: [BENCHMARKS.md](BENCHMARKS.md#side-by-side-with-kuberays-collector).",
        width=95,
        break_on_hyphens=False,
    )
    return "\n".join(lines) + "\n\n" + note + "\n"


def replace_between(path, tag, text):
    s = path.read_text()
    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    i, j = s.find(begin), s.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"peer_summary: {path} has no {begin} … {end} block")
    s = s[: i + len(begin)] + "\n" + text + s[j:]
    path.write_text(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--publish")
    ap.add_argument("--docs")
    a = ap.parse_args()
    out = Path(a.out)
    rows = load(out / "results.jsonl")
    chaos = load(out / "chaos.jsonl")
    m = machine(out)
    summary = summarize(rows)
    summary["chaos"] = [
        {"scenario": c["scenario"], "verdict": c.get("verdict"), "figures": c.get("figures")} for c in chaos
    ]
    summary["machine"] = m
    table, rounds = markdown(summary, chaos, m)
    size = sizing(summary, m, rounds)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "table.md").write_text(table + ("\n" + size if size else ""))
    print(table)
    if size:
        print(size)
    if a.publish:
        dest = Path(a.publish)
        dest.mkdir(parents=True, exist_ok=True)
        for f in ("summary.json", "table.md", "machine.txt"):
            if (out / f).exists():
                shutil.copy(out / f, dest / f)
    if a.docs:
        repo = Path(a.docs)
        replace_between(repo / "BENCHMARKS.md", "peer-bench", table)
        if size:
            replace_between(repo / "docs" / "sizing-and-cost.md", "peer-sizing", size)


if __name__ == "__main__":
    main()
