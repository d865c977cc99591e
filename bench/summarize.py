#!/usr/bin/env python3
"""Summarizes a bench/run.sh result directory: medians over rounds, ratios measured in the
same round, targets vs measured. Writes summary.json and table.md beside results.jsonl.

    python3 bench/summarize.py .bench-deps/results/<timestamp>

Standard library only.
"""

import json
import statistics
import sys
from pathlib import Path


def load(path):
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values):
    values = [v for v in values if v is not None]
    return (min(values), max(values)) if values else (None, None)


def fmt(v, digits=0):
    if v is None:
        return "–"
    if digits == 0:
        return f"{v:,.0f}"
    return f"{v:,.{digits}f}"


def slope(series, t_from):
    """Least-squares slope (units per second) of [(t, v), ...] for t >= t_from."""
    pts = [(t, v) for t, v in series if t >= t_from]
    if len(pts) < 3:
        return None
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    den = sum((t - mt) ** 2 for t, _ in pts)
    if den == 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in pts) / den


def main():
    out = Path(sys.argv[1])
    rows = load(out / "results.jsonl")
    chaos = load(out / "chaos.jsonl")
    by = {}
    for r in rows:
        kind, _, rest = r["label"].partition("/")
        by.setdefault(kind, []).append(r)

    def per_round(kind):
        return {r["label"].rsplit("/", 1)[-1]: r for r in by.get(kind, [])}

    dd, dd_after, null, mx, half, idle, idle_after, jobs, fdl = (
        per_round(k) for k in ("dd", "dd_after", "null_max", "ingest_max", "ingest_half", "idle", "idle_after", "jobs10k", "fd_limit")
    )
    rounds = sorted(mx.keys())
    ratio_disk = []
    ratio_disk_before = []
    ratio_disk_req = []
    ratio_null = []
    dd_base = {}
    for rd in rounds:
        if rd not in dd:
            continue
        # The round's baseline: dd before the collector's run, averaged with dd right after
        # it when the run measured both (older runs measured only before).
        before = dd[rd]["mb_per_s"]
        dd_base[rd] = (before + dd_after[rd]["mb_per_s"]) / 2 if rd in dd_after else before
        if mx[rd].get("spool_written_mb_per_s") is not None:
            ratio_disk.append(mx[rd]["spool_written_mb_per_s"] / dd_base[rd])
            ratio_disk_before.append(mx[rd]["spool_written_mb_per_s"] / before)
        ratio_disk_req.append(mx[rd]["mb_per_s"] / dd_base[rd])
        if rd in null:
            ratio_null.append(mx[rd]["events_per_s"] / null[rd]["events_per_s"])

    s = {"rounds": len(rounds)}
    s["dd_mb_s"] = med(dd_base.values())
    s["dd_mb_s_range"] = spread(dd_base.values())
    s["dd_samples_mb_s_range"] = spread([r["mb_per_s"] for r in dd.values()] + [r["mb_per_s"] for r in dd_after.values()])
    s["null_events_s"] = med(r["events_per_s"] for r in null.values())
    s["null_mb_s"] = med(r["mb_per_s"] for r in null.values())
    s["null_p99_ms"] = med(r["p99_ms"] for r in null.values())
    s["null_cpu_cores"] = med(r.get("cpu_cores") for r in null.values())
    s["max_events_s"] = med(r["events_per_s"] for r in mx.values())
    s["max_events_s_range"] = spread(r["events_per_s"] for r in mx.values())
    s["max_mb_s"] = med(r["mb_per_s"] for r in mx.values())
    s["max_spool_mb_s"] = med(r.get("spool_written_mb_per_s") for r in mx.values())
    s["max_p50_ms"] = med(r["p50_ms"] for r in mx.values())
    s["max_p99_ms"] = med(r["p99_ms"] for r in mx.values())
    s["max_rss_peak_mib"] = med(r.get("rss_peak_mib") for r in mx.values())
    s["max_rss_peak_mib_worst"] = spread(r.get("rss_peak_mib") for r in mx.values())[1]
    s["max_cpu_cores"] = med(r.get("cpu_cores") for r in mx.values())
    s["max_non_2xx"] = sum(r["non_2xx"] + r["errors"] for r in mx.values())
    s["ratio_spool_to_dd"] = med(ratio_disk)
    s["ratio_spool_to_dd_range"] = spread(ratio_disk)
    s["ratio_spool_to_dd_before"] = med(ratio_disk_before)
    s["dd_measured_after"] = bool(dd_after)
    s["ratio_body_to_dd"] = med(ratio_disk_req)
    s["ratio_collector_to_null"] = med(ratio_null)
    s["ratio_collector_to_null_range"] = spread(ratio_null)
    s["half_events_s"] = med(r["events_per_s"] for r in half.values())
    s["half_p50_ms"] = med(r["p50_ms"] for r in half.values())
    s["half_p99_ms"] = med(r["p99_ms"] for r in half.values())
    s["half_p99_ms_range"] = spread(r["p99_ms"] for r in half.values())
    s["half_p99_sched_ms"] = med(r["p99_sched_ms"] for r in half.values())
    s["half_max_ms"] = med(r["max_ms"] for r in half.values())
    s["half_rss_peak_mib"] = med(r.get("rss_peak_mib") for r in half.values())
    s["half_rss_peak_mib_worst"] = spread(r.get("rss_peak_mib") for r in half.values())[1]
    s["half_cpu_cores"] = med(r.get("cpu_cores") for r in half.values())
    s["idle_rss_mib"] = med(r["rss_mib"] for r in idle.values())
    s["idle_rss_mib_worst"] = spread(r["rss_mib"] for r in idle.values())[1]
    s["idle_after_load_rss_mib"] = med(r["rss_mib"] for r in idle_after.values())
    s["jobs10k_events_s"] = med(r["events_per_s"] for r in jobs.values())
    s["jobs10k_rss_peak_mib"] = med(r.get("rss_peak_mib") for r in jobs.values())
    s["jobs10k_rss_peak_mib_worst"] = spread(r.get("rss_peak_mib") for r in jobs.values())[1]
    s["jobs10k_fds_peak"] = spread(r.get("fds_peak") for r in jobs.values())[1]
    s["jobs10k_p99_ms"] = med(r["p99_ms"] for r in jobs.values())
    s["fd_limit"] = med(r["fd_limit"] for r in fdl.values())
    s["loadavg"] = [r["loadavg"] for r in by.get("loadavg", [])]

    sus = by.get("sustained", [])
    sus_term = {r["label"].rsplit("/", 1)[-1]: r for r in by.get("sustained_term", [])}
    slopes = []
    for r in sus:
        series = r.get("spool_bytes_series") or []
        sl = slope(series, 10.0)
        r["_slope_mb_s"] = None if sl is None else sl / 1e6
        slopes.append(r["_slope_mb_s"])
    s["sustained_runs"] = len(sus)
    s["sustained_rate"] = sus[0]["rate"] if sus else None
    s["sustained_seconds"] = med(r["seconds"] for r in sus)
    s["sustained_events_s"] = med(r["events_per_s"] for r in sus)
    s["sustained_p99_ms"] = med(r["p99_ms"] for r in sus)
    s["sustained_rss_peak_mib"] = med(r.get("rss_peak_mib") for r in sus)
    s["sustained_cpu_cores"] = med(r.get("cpu_cores") for r in sus)
    s["sustained_spool_end_mb"] = med((r.get("spool_end_bytes") or 0) / 1e6 for r in sus)
    s["sustained_spool_max_mb"] = med((r.get("spool_max_bytes") or 0) / 1e6 for r in sus)
    s["sustained_spool_slope_mb_s"] = med(slopes)
    s["sustained_ingest_mb_s"] = med(r["mb_per_s"] for r in sus)
    s["sustained_non_2xx"] = sum(r["non_2xx"] + r["errors"] for r in sus)
    s["sustained_shutdown_s"] = med(r["shutdown_s"] for r in sus_term.values())
    # Keeping pace: the spool grows by less than 5 % of what comes in.
    if s["sustained_spool_slope_mb_s"] is not None and s["sustained_ingest_mb_s"]:
        s["sustained_keeps_pace"] = s["sustained_spool_slope_mb_s"] < 0.05 * s["sustained_ingest_mb_s"]
    else:
        s["sustained_keeps_pace"] = None

    def chaos_fig(name, key):
        return [c["figures"].get(key) for c in chaos if c["scenario"] == name and c["figures"]]

    s["backlog_spool_mb"] = med(chaos_fig("sigterm-backlog", "spool_mb"))
    s["backlog_shutdown_s"] = med(chaos_fig("sigterm-backlog", "shutdown_s"))
    s["backlog_shutdown_s_range"] = spread(chaos_fig("sigterm-backlog", "shutdown_s"))
    s["backlog_rss_peak_mib"] = med(chaos_fig("sigterm-backlog", "rss_peak_mib"))
    s["backlog_verdicts"] = [c["verdict"] for c in chaos if c["scenario"] == "sigterm-backlog"]
    s["log_bytes"] = med(chaos_fig("logs-2g", "bytes"))
    s["log_seconds"] = med(chaos_fig("logs-2g", "seconds"))
    s["log_rss_peak_mib"] = med(chaos_fig("logs-2g", "rss_peak_mib"))
    s["log_rss_peak_mib_worst"] = spread(chaos_fig("logs-2g", "rss_peak_mib"))[1]
    s["log_verdicts"] = [c["verdict"] for c in chaos if c["scenario"] == "logs-2g"]

    # Sweep medians for the plot and the table.
    sweep = {}
    for kind in ("sweep_collector", "sweep_null"):
        pts = {}
        for r in by.get(kind, []):
            rate = int(r["label"].split("/")[1])
            pts.setdefault(rate, []).append(r)
        sweep[kind] = {
            str(rate): {
                "events_per_s": med(x["events_per_s"] for x in rs),
                "p50_ms": med(x["p50_ms"] for x in rs),
                "p99_ms": med(x["p99_ms"] for x in rs),
                "p99_sched_ms": med(x["p99_sched_ms"] for x in rs),
                "rss_peak_mib": med(x.get("rss_peak_mib") for x in rs),
                "runs": len(rs),
            }
            for rate, rs in sorted(pts.items())
        }
    s["sweep"] = sweep

    def check(ok):
        return "–" if ok is None else ("✅" if ok else "❌")

    def le(v, limit):
        return None if v is None else v <= limit

    def ge(v, limit):
        return None if v is None else v >= limit

    lo, hi = s["max_events_s_range"]
    rows_md = [
        ("Durable ingest, 4 clients × 1,000-event batches, acks fdatasync'd", "≥ 200,000 events/s",
         f"{fmt(s['max_events_s'])} events/s ({fmt(lo)}–{fmt(hi)}), {fmt(s['max_spool_mb_s'], 1)} MB/s to the spool",
         check(ge(s["max_events_s"], 200_000))),
        ("… as a fraction of dd's fdatasync bandwidth, same round", "≥ 0.5",
         f"{fmt(s['ratio_spool_to_dd'], 2)} ({fmt(s['ratio_spool_to_dd_range'][0], 2)}–{fmt(s['ratio_spool_to_dd_range'][1], 2)}; dd {fmt(s['dd_mb_s'])} MB/s" + (f", mean of before and after the run; against dd before only: {fmt(s['ratio_spool_to_dd_before'], 2)})" if s["dd_measured_after"] else ")"),
         check(ge(s["ratio_spool_to_dd"], 0.5))),
        ("… as a fraction of the null sink, same round", "(bound of the HTTP side)",
         f"{fmt(s['ratio_collector_to_null'], 2)} (null sink {fmt(s['null_events_s'])} events/s)", ""),
        (f"Sustained {fmt(s['sustained_seconds'])} s, gzip + uploads to S3 (moto), spool not growing", "≥ 60,000 events/s",
         f"{fmt(s['sustained_events_s'])} events/s offered {fmt(s['sustained_rate'])}; spool slope {fmt(s['sustained_spool_slope_mb_s'], 2)} MB/s of {fmt(s['sustained_ingest_mb_s'], 1)} MB/s in; p99 {fmt(s['sustained_p99_ms'], 1)} ms; RSS peak {fmt(s['sustained_rss_peak_mib'], 1)} MiB",
         check(None if s["sustained_keeps_pace"] is None else (s["sustained_keeps_pace"] and s["sustained_events_s"] >= 0.97 * 60_000))),
        ("p99 ack latency at half the maximum rate", "≤ 50 ms",
         f"{fmt(s['half_p99_ms'], 1)} ms at {fmt(s['half_events_s'])} events/s (p50 {fmt(s['half_p50_ms'], 1)} ms)",
         check(le(s["half_p99_ms"], 50))),
        ("Peak RSS under that load", "≤ 64 MiB",
         f"{fmt(s['half_rss_peak_mib'], 1)} MiB (worst round {fmt(s['half_rss_peak_mib_worst'], 1)}); at the maximum rate {fmt(s['max_rss_peak_mib'], 1)} MiB",
         check(le(s["half_rss_peak_mib_worst"], 64))),
        ("Idle RSS", "≤ 16 MiB",
         f"{fmt(s['idle_rss_mib'], 1)} MiB at start, {fmt(s['idle_after_load_rss_mib'], 1)} MiB idle after the maximum load",
         check(le(s["idle_rss_mib_worst"], 16))),
        ("10,000 distinct jobs at once", "≤ 128 MiB, within the fd limit",
         f"{fmt(s['jobs10k_events_s'])} events/s, RSS peak {fmt(s['jobs10k_rss_peak_mib'], 1)} MiB, ≤ {fmt(s['jobs10k_fds_peak'])} fds of {fmt(s['fd_limit'])}",
         check(None if s["jobs10k_rss_peak_mib_worst"] is None else s["jobs10k_rss_peak_mib_worst"] <= 128 and s["jobs10k_fds_peak"] < s["fd_limit"])),
        (f"Shipping one {fmt((s['log_bytes'] or 0) / 1e9, 1)} GB log file", "RSS < 64 MiB",
         f"{fmt(s['log_seconds'], 1)} s, RSS peak {fmt(s['log_rss_peak_mib'], 1)} MiB",
         check(None if s["log_rss_peak_mib_worst"] is None else s["log_rss_peak_mib_worst"] < 64)),
        (f"SIGTERM with {fmt(s['backlog_spool_mb'])} MB un-uploaded spool, to S3 (moto)", "done within 15 s",
         f"{fmt(s['backlog_shutdown_s'], 1)} s ({fmt(s['backlog_shutdown_s_range'][0], 1)}–{fmt(s['backlog_shutdown_s_range'][1], 1)}), exit 0, every event uploaded: {', '.join(s['backlog_verdicts']) or '–'}",
         check(le(s["backlog_shutdown_s_range"][1], 15) if s["backlog_verdicts"] else None)),
    ]
    md = ["| target | goal | measured (median of rounds) | |", "|---|---|---|---|"]
    md += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows_md]
    md.append("")
    md.append(f"Rounds: {s['rounds']}; load average during the rounds: {', '.join(str(x) for x in s['loadavg'])}.")
    (out / "summary.json").write_text(json.dumps(s, indent=1, ensure_ascii=False) + "\n")
    (out / "table.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
