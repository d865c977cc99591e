#!/usr/bin/env python3
"""Bytes sent to the store while event objects grow (issue 35, item 5), several binaries.

    bench/growth_bytes.py --store azure --loadgen target/release/rhc-loadgen OLD NEW
    bench/growth_bytes.py --store s3 --rate 2000 --duration 60 --loadgen ... OLD NEW
    bench/growth_bytes.py --store gcs --loadgen ... NEW

Each binary, in turn and in rounds, gets a fresh container (Azurite) or bucket (moto) and a
fresh spool, and is loaded by ``rhc-loadgen`` at ``--rate`` events/s (Ray 2.60 shapes, 1 job,
100-event batches, one client) for ``--duration`` s with ``--upload-window`` (default 2 s), so
each open segment's object is published many times while it grows; then SIGTERM, which
uploads the rest. A relay between the collector and the store counts every byte the
collector sends to the store (request heads and bodies: what crosses the network), and the
event objects in the store are summed after the exit. GCS is one host made of two servers
(as in the tests): its JSON API (``/storage/v1/``, ``/upload/storage/v1/``) is FullStory's
gcsemulator (``RHC_GCSEMU``), where event objects grow by compose, and its XML API is moto
(the session marker, segments uploaded whole by ``object_store``); the relay routes each
request by its path and the event objects of both are summed. With whole uploads each publication
sends the object so far, about S*(n+1)/2 for n publications of an object of S bytes; with
growth (S3 UploadPartCopy, Azure block lists) about S plus the requests' heads.

Prints one line per run and one JSON line per binary: medians of sent bytes, stored bytes,
their ratio and the publications (``rhc_event_publications_total`` by ``how``).

A failed run keeps its logs (the temporary folder it names). Needs ``RHC_AZURITE_BLOB`` (azure), ``RHC_MOTO_SERVER`` (s3; gcs with ``RHC_GCSEMU``) and ``RHC_PYTHON``'s packages
(azure-storage-blob, boto3; run it with that Python). Loopback only; every run is bounded in
time; every process started is stopped.
"""
import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

AZ_ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, documented by Microsoft).
AZ_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
          "KBHBeksoGMGw==")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, deadline_s=30, proc=None):
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited with {proc.returncode} before {url} answered")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return  # any HTTP answer: it is up
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer in {deadline_s} s")


class Relay:
    """127.0.0.1:port -> 127.0.0.1:upstream, counting the bytes sent upstream."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.sent = 0
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self):
        with self.lock:
            n, self.sent = self.sent, 0
        return n

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream), timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src, dst, count):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if count:
                    with self.lock:
                        self.sent += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.closed = True
        self.sock.close()


class SplitRelay:
    """An HTTP/1.1 relay that sends GCS's JSON API paths to ``json_port`` and every other
    request to ``xml_port``, one upstream connection per request, counting the bytes sent
    upstream (heads and bodies)."""

    JSON_PATHS = (b"/storage/v1/", b"/upload/storage/v1/")

    def __init__(self, xml_port, json_port):
        self.ports = (xml_port, json_port)
        self.sent = 0
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self):
        with self.lock:
            n, self.sent = self.sent, 0
        return n

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    @staticmethod
    def _read_message(f, head_only_body=False):
        """One HTTP message from file ``f``: (head lines, body bytes), or None at EOF."""
        start = f.readline()
        if not start:
            return None
        lines = [start]
        while True:
            line = f.readline()
            if not line:
                return None
            lines.append(line)
            if line in (b"\r\n", b"\n"):
                break
        length, chunked = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if head_only_body:
            return lines, b""
        if chunked:
            body = b""
            while True:
                size_line = f.readline()
                body += size_line
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                chunk = f.read(size + 2)
                body += chunk
                if size == 0:
                    break
            return lines, body
        return lines, f.read(length) if length else b""

    def _serve(self, client):
        cf = client.makefile("rb")
        try:
            while True:
                msg = self._read_message(cf)
                if msg is None:
                    return
                lines, body = msg
                target = lines[0].split(b" ")[1] if len(lines[0].split(b" ")) > 1 else b"/"
                port = self.ports[1] if target.startswith(self.JSON_PATHS) else self.ports[0]
                raw = b"".join(lines) + body
                with self.lock:
                    self.sent += len(raw)
                with socket.create_connection(("127.0.0.1", port), timeout=120) as up:
                    up.sendall(raw)
                    uf = up.makefile("rb")
                    head_req = lines[0].startswith(b"HEAD ")
                    answer = self._read_message(uf, head_only_body=head_req)
                    if answer is None:
                        return
                    alines, abody = answer
                    client.sendall(b"".join(alines) + abody)
        except (OSError, ValueError):
            pass
        finally:
            try:
                client.close()
            except OSError:
                pass

    def close(self):
        self.closed = True
        self.sock.close()


class Azure:
    def __init__(self, tmp):
        program = os.environ.get("RHC_AZURITE_BLOB") or sys.exit("RHC_AZURITE_BLOB is not set")
        self.port = free_port()
        self.log = open(os.path.join(tmp, "azurite.log"), "w")
        self.proc = subprocess.Popen(
            [program, "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
             "--inMemoryPersistence", "--skipApiVersionCheck", "--loose", "--disableTelemetry"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{self.port}/")
        from azure.storage.blob import BlobServiceClient
        self.svc = BlobServiceClient.from_connection_string(self._cs(self.port))

    @staticmethod
    def _cs(port):
        return (f"DefaultEndpointsProtocol=http;AccountName={AZ_ACCOUNT};AccountKey={AZ_KEY};"
                f"BlobEndpoint=http://127.0.0.1:{port}/{AZ_ACCOUNT};")

    def fresh(self, name):
        self.svc.create_container(name)
        return name

    def collector(self, name, relay_port):
        return ["--storage", f"az://{name}"], {
            "AZURE_STORAGE_CONNECTION_STRING": self._cs(relay_port)}

    def event_bytes(self, name):
        c = self.svc.get_container_client(name)
        return sum(b.size for b in c.list_blobs() if "_events/" in b.name)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


class S3:
    def __init__(self, tmp):
        program = os.environ.get("RHC_MOTO_SERVER") or sys.exit("RHC_MOTO_SERVER is not set")
        self.port = free_port()
        self.log = open(os.path.join(tmp, "moto.log"), "w")
        self.proc = subprocess.Popen([program, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{self.port}/")
        import boto3
        self.s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.port}",
                               aws_access_key_id="test", aws_secret_access_key="test",
                               region_name="us-east-1")

    def fresh(self, name):
        self.s3.create_bucket(Bucket=name)
        return name

    def collector(self, name, relay_port):
        return ["--storage", f"s3://{name}"], {
            "AWS_ENDPOINT": f"http://127.0.0.1:{relay_port}",
            "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}

    def event_bytes(self, name):
        total = 0
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            total += sum(o["Size"] for o in page.get("Contents", []) if "_events/" in o["Key"])
        return total

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


class Gcs:
    """gcsemulator (JSON API) and moto (XML API) as one GCS host behind a SplitRelay."""

    def __init__(self, tmp):
        emu = os.environ.get("RHC_GCSEMU") or sys.exit("RHC_GCSEMU is not set")
        self.s3 = S3(tmp)
        self.port = free_port()
        self.log = open(os.path.join(tmp, "gcsemulator.log"), "w")
        self.proc = subprocess.Popen(
            [emu, "-host", "127.0.0.1", "-port", str(self.port), "-verbose=false"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{self.port}/storage/v1/b")

    def relay(self):
        return SplitRelay(self.s3.port, self.port)

    def fresh(self, name):
        self.s3.fresh(name)
        body = json.dumps({"name": name}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/storage/v1/b", data=body,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()
        return name

    def collector(self, name, relay_port):
        return ["--storage", f"gs://{name}"], {
            "GOOGLE_BASE_URL": f"http://127.0.0.1:{relay_port}",
            "GOOGLE_BEARER_TOKEN": "bench-token"}

    def event_bytes(self, name):
        total, token = 0, ""
        while True:
            url = f"http://127.0.0.1:{self.port}/storage/v1/b/{name}/o?maxResults=1000"
            if token:
                url += "&pageToken=" + urllib.parse.quote(token)
            page = json.loads(urllib.request.urlopen(url, timeout=30).read())
            total += sum(int(o["size"]) for o in page.get("items", [])
                         if "_events/" in o["name"] and not o["name"].endswith(".rhc-part"))
            token = page.get("nextPageToken", "")
            if not token:
                break
        return total + self.s3.event_bytes(name)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.s3.stop()


def publications(port):
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("rhc_event_publications_total{"):
            how = line.split('how="', 1)[1].split('"', 1)[0]
            out[how] = out.get(how, 0) + float(line.rsplit(" ", 1)[1])
    return out


def run_one(args, store, relay, binary, run_name, tmp):
    bucket = store.fresh(run_name)
    port = free_port()
    spool = os.path.join(tmp, run_name)
    flags, env = store.collector(bucket, relay.port)
    cmd = shlex.split(binary) + [
        "--listen", f"127.0.0.1:{port}", "--spool-dir", spool, "--cluster-name", "growth",
        "--upload-window", args.upload_window, "--enable-log-collector", "false",
        "--enable-export-events", "false", "--dashboard-address", "http://127.0.0.1:1",
    ] + flags
    full_env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
                    **env)
    log = open(os.path.join(tmp, run_name + ".log"), "w")
    relay.reset()
    proc = subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", proc=proc)
        subprocess.run([args.loadgen, "--url", f"http://127.0.0.1:{port}/v1/events",
                        "--rate", str(args.rate), "--duration", str(args.duration),
                        "--jobs", "1", "--batch", "100", "--concurrency", "1"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=args.duration + 60)
        pubs = publications(port)
        proc.terminate()
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if code != 0:
        raise SystemExit(f"{binary}: exit {code}; see {log.name} (kept)")
    time.sleep(0.2)
    sent = relay.reset()
    stored = store.event_bytes(bucket)
    return {"sent": sent, "stored": stored, "ratio": round(sent / max(stored, 1), 2),
            "publications": pubs}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--store", choices=["azure", "s3", "gcs"], required=True)
    p.add_argument("--loadgen", required=True)
    p.add_argument("--rate", type=int, default=2000)
    p.add_argument("--duration", type=int, default=60)
    p.add_argument("--upload-window", default="2s")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("binaries", nargs="+")
    args = p.parse_args()
    # Kept when a run fails, so the logs it names can be read.
    tmp = tempfile.mkdtemp(prefix="growth-bytes-")
    store = {"azure": Azure, "s3": S3, "gcs": Gcs}[args.store](tmp)
    relay = store.relay() if hasattr(store, "relay") else Relay(store.port)
    results = {b: [] for b in args.binaries}
    try:
        for rnd in range(args.rounds):
            order = args.binaries if rnd % 2 == 0 else list(reversed(args.binaries))
            for i, b in enumerate(order):
                r = run_one(args, store, relay, b, f"r{rnd}b{args.binaries.index(b)}", tmp)
                results[b].append(r)
                print(f"round {rnd + 1} {b}: {json.dumps(r)}", file=sys.stderr, flush=True)
    finally:
        relay.close()
        store.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    for b, rs in results.items():
        print(json.dumps({
            "binary": b, "store": args.store, "rate": args.rate,
            "duration_s": args.duration, "upload_window": args.upload_window,
            "runs": len(rs),
            "median_sent_bytes": statistics.median(r["sent"] for r in rs),
            "median_stored_bytes": statistics.median(r["stored"] for r in rs),
            "median_sent_per_stored": statistics.median(r["ratio"] for r in rs),
            "publications": [r["publications"] for r in rs],
        }))


if __name__ == "__main__":
    main()
