#!/usr/bin/env python3
"""What unfinished request heads cost the collector (issue 39, item 8): starts the given
collector binary on loopback, reads its VmHWM, opens N connections that each send B bytes of
a request head that never ends (one long header line), waits, and reads VmHWM again; then
fills the body budget with two bodies that stop (63 MiB and 33 MiB of 64 MiB declared) and
reads it once more. Prints one JSON line.

    bench/unfinished_heads.py target/release/ray-history-collector
    bench/unfinished_heads.py BIN --connections 250 --head-bytes 400000
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def vm_hwm_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--connections", type=int, default=250)
    ap.add_argument("--head-bytes", type=int, default=400_000)
    args = ap.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [args.bin, "--listen", f"127.0.0.1:{port}", "--spool-dir", f"{tmp}/spool",
             "--storage", f"{tmp}/bucket", "--enable-log-collector", "false", "--role", "worker"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                    break
                except OSError:
                    time.sleep(0.1)
            time.sleep(1)
            idle = vm_hwm_mib(proc.pid)
            head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: "
            head += b"a" * max(0, args.head_bytes - len(head))
            socks = []
            for _ in range(args.connections):
                s = socket.create_connection(("127.0.0.1", port))
                s.settimeout(2)
                try:
                    s.sendall(head)
                except OSError:
                    pass
                socks.append(s)
            time.sleep(2)
            heads = vm_hwm_mib(proc.pid)
            hogs = []
            for size in (63 << 20, 33 << 20):
                s = socket.create_connection(("127.0.0.1", port))
                s.settimeout(5)
                s.sendall(b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          b"Content-Type: application/json\r\nContent-Length: 67108864\r\n\r\n")
                try:
                    s.sendall(b"[" + b" " * (size - 1))
                except OSError:
                    pass
                hogs.append(s)
            time.sleep(2)
            budget = vm_hwm_mib(proc.pid)
            print(json.dumps({
                "bin": args.bin, "connections": args.connections, "head_bytes": args.head_bytes,
                "vmhwm_mib_idle": round(idle, 1), "vmhwm_mib_heads": round(heads, 1),
                "vmhwm_mib_heads_and_full_budget": round(budget, 1),
            }))
            for s in socks + hogs:
                s.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
