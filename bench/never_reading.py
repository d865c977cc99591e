#!/usr/bin/env python3
"""Clients that never read their answers against Ray and the liveness probe (issue 39,
item 6), for release binaries side by side in the same run.

Each round starts every given collector binary in turn on loopback (file:// storage, log
collector off, `--metrics-listen` on a second port). Attackers open --rate connections a
second to the listener under test (`--target events` for `--listen`, `metrics` for
`--metrics-listen`), each with a tiny receive window (SO_RCVBUF 1024, TCP_MAXSEG 536), send
--pipelined `GET /metrics` at once and never read; the newest 2000 stay open. After 3 s,
40 tries of Ray's batch (`POST /v1/events`, events listener only) and 40 of `/healthz` run
side by side, 300 ms apart, each on a fresh connection that must get 200 within Ray's 3 s
(as tests/hostile_input.rs and tests/metrics_listener.rs do). Prints one JSON line per run
(tries that got 200, the collector's CPU seconds during the run, connections opened and
evicted), then a summary per binary: the median of each figure over the rounds.

    bench/never_reading.py OLD_BIN NEW_BIN --rounds 5
    bench/never_reading.py OLD_BIN NEW_BIN --target metrics --rate 150
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

TRIES = 40
EVERY = 0.3
RAY_TIMEOUT = 3.0
KEEP_OPEN = 2000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ray_body():
    with open(os.path.join(ROOT, "tests/data/posts-camel.jsonl"), "rb") as f:
        return f.read().splitlines()[2]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request(port, method, path, body=b"", headers=()):
    """One request on a fresh connection; the status, or None past Ray's 3 s."""
    deadline = time.monotonic() + RAY_TIMEOUT
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=RAY_TIMEOUT)
    except OSError:
        return None
    try:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
        for k, v in headers:
            head += f"{k}: {v}\r\n"
        s.sendall(head.encode() + b"\r\n" + body)
        got = b""
        while b"\r\n" not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            s.settimeout(left)
            chunk = s.recv(4096)
            if not chunk:
                return None
            got += chunk
        if time.monotonic() > deadline:
            return None
        return int(got.split(b" ", 2)[1])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        s.close()


def tries(port, method, path, body=b"", headers=()):
    ok = 0
    for _ in range(TRIES):
        started = time.monotonic()
        if request(port, method, path, body, headers) == 200:
            ok += 1
        rest = EVERY - (time.monotonic() - started)
        if rest > 0:
            time.sleep(rest)
    return ok


def attack(port, rate, pipelined, stop, opened):
    burst = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * pipelined
    every = 1.0 / rate
    open_ = []
    nxt = time.monotonic()
    while not stop.is_set():
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
            s.connect(("127.0.0.1", port))
            s.setblocking(False)
            try:
                s.send(burst)
            except OSError:
                pass
            opened[0] += 1
            open_.append(s)
            if len(open_) > KEEP_OPEN:
                open_.pop(0).close()
        except OSError:
            pass
        nxt += every
        rest = nxt - time.monotonic()
        if rest > 0:
            time.sleep(rest)
        else:
            nxt = time.monotonic()
    for s in open_:
        s.close()


def metrics_text(port):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        s.close()
    except OSError:
        return b""
    return got


def metric(text, name, label=""):
    total = 0.0
    for m in re.finditer(rf"^{name}(?:{{([^}}]*)}})? (\S+)$".encode(), text, re.M):
        if label.encode() in (m.group(1) or b""):
            total += float(m.group(2))
    return total


def run(binary, args, body):
    events, ro = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [binary, "--listen", f"127.0.0.1:{events}", "--metrics-listen", f"127.0.0.1:{ro}",
             "--spool-dir", f"{tmp}/spool", "--storage", f"file://{tmp}/bucket",
             "--enable-log-collector", "false", "--role", "worker"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                if request(events, "GET", "/healthz") == 200:
                    break
                time.sleep(0.1)
            target = events if args.target == "events" else ro
            stop, opened = threading.Event(), [0]
            attacker = threading.Thread(target=attack, args=(target, args.rate, args.pipelined, stop, opened))
            cpu0 = cpu_seconds(proc.pid)
            attacker.start()
            time.sleep(3)
            result = {}
            workers = []

            def count(key, *a):
                result[key] = tries(*a)

            if args.target == "events":
                workers.append(threading.Thread(target=count, args=(
                    "ray_ok", events, "POST", "/v1/events", body, [("Content-Type", "application/json")])))
                workers.append(threading.Thread(target=count, args=("healthz_ok", events, "GET", "/healthz")))
            else:
                workers.append(threading.Thread(target=count, args=("healthz_ok", ro, "GET", "/healthz")))
                workers.append(threading.Thread(target=count, args=("readyz_ok", ro, "GET", "/readyz")))
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            stop.set()
            attacker.join()
            cpu = cpu_seconds(proc.pid) - cpu0
            time.sleep(1)
            text = metrics_text(ro)
            result.update({
                "cpu_s": round(cpu, 2), "opened": opened[0],
                "evicted": metric(text, "rhc_connections_evicted_total"),
                "evicted_not_reading": metric(text, "rhc_connections_evicted_total", 'reason="not_reading"'),
                "refused": metric(text, "rhc_connections_refused_total"),
            })
            return result
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bins", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=int, default=150, help="attacking connections a second")
    ap.add_argument("--pipelined", type=int, default=20)
    ap.add_argument("--target", choices=["events", "metrics"], default="events")
    args = ap.parse_args()
    body = ray_body()
    runs = {b: [] for b in args.bins}
    for r in range(args.rounds):
        # Alternate the order each round, so neither binary always runs first.
        order = args.bins if r % 2 == 0 else list(reversed(args.bins))
        for b in order:
            res = run(b, args, body)
            runs[b].append(res)
            print(json.dumps({"round": r, "bin": b, "target": args.target, "rate": args.rate, **res}), flush=True)
    for b, rs in runs.items():
        summary = {k: statistics.median(x[k] for x in rs if x.get(k) is not None)
                   for k in rs[0] if all(isinstance(x.get(k), (int, float)) for x in rs)}
        print(json.dumps({"summary": b, "rounds": len(rs), "target": args.target, "rate": args.rate,
                          "load1": os.getloadavg()[0], **summary}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
