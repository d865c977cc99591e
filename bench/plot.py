#!/usr/bin/env python3
"""Throughput and p99 ack latency against offered load, collector vs null sink, from the
sweep of bench/run.sh (medians over the sweep rounds).

    .bench-deps/venv/bin/python bench/plot.py <results.jsonl> <out.png>
"""

import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src, dst = sys.argv[1], sys.argv[2]
    pts = {"sweep_collector": {}, "sweep_null": {}}
    for line in open(src):
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        kind, _, rest = r["label"].partition("/")
        if kind not in pts:
            continue
        rate = int(rest.split("/")[0])
        pts[kind].setdefault(rate, []).append(r)

    def series(kind, key):
        xs, ys = [], []
        for rate, rs in sorted(pts[kind].items()):
            if rate == 0:
                continue
            xs.append(rate / 1000)
            ys.append(statistics.median(x[key] for x in rs))
        return xs, ys

    def unpaced(kind, key):
        rs = pts[kind].get(0)
        return statistics.median(x[key] for x in rs) if rs else None

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    styles = {
        "sweep_collector": ("ray-history-collector (acks fdatasync'd)", "tab:blue", "o"),
        "sweep_null": ("null sink (reads and discards the body)", "tab:gray", "s"),
    }
    xmax = 0
    for kind, (name, color, marker) in styles.items():
        xs, ys = series(kind, "events_per_s")
        if not xs:
            continue
        xmax = max(xmax, max(xs))
        ax1.plot(xs, [y / 1000 for y in ys], marker=marker, color=color, label=name)
        top = unpaced(kind, "events_per_s")
        if top is not None and kind == "sweep_collector":
            ax1.axhline(top / 1000, color=color, linestyle=":", linewidth=1)
            ax1.annotate(f"collector unpaced (as fast as acks come): {top / 1000:.0f}k events/s", (0.02, top / 1000),
                         xycoords=("axes fraction", "data"), textcoords="offset points", xytext=(0, -11),
                         color=color, fontsize=8)
        if top is not None and kind == "sweep_null":
            ax1.annotate(f"null sink unpaced: {top / 1000:,.0f}k events/s (off the chart)", (0.02, 0.80),
                         xycoords="axes fraction", color=color, fontsize=8)
        xs, p99 = series(kind, "p99_ms")
        ax2.plot(xs, p99, marker=marker, color=color, label=name)
    ax1.plot([0, xmax], [0, xmax], color="black", linewidth=0.6, linestyle="--", label="offered = achieved")
    ax1.set_ylabel("achieved (thousand events/s)")
    ax1.set_ylim(0, None)
    ax1.set_title("Throughput and p99 ack latency vs offered load\n4 clients × 1,000-event batches (~0.9 KB events), 2-core VM, loopback")
    ax1.legend(loc="lower right", fontsize=8)
    ax1.grid(alpha=0.3)
    ax2.axhline(50, color="tab:red", linestyle="--", linewidth=0.8)
    ax2.annotate("target: p99 ≤ 50 ms at half the maximum rate", (0.98, 50), xycoords=("axes fraction", "data"),
                 textcoords="offset points", xytext=(0, -11), ha="right", color="tab:red", fontsize=8)
    ax2.set_yscale("log")
    ax2.set_ylabel("p99 ack latency (ms, log)")
    ax2.set_xlabel("offered load (thousand events/s); medians over the sweep rounds")
    ax2.set_ylim(0.5, 200)
    ax2.legend(loc="center right", bbox_to_anchor=(1.0, 0.3), fontsize=8)
    ax2.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main()
