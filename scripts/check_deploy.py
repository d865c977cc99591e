#!/usr/bin/env python3
"""Offline checks of the Kubernetes packaging; scripts/check-deploy.sh runs this.

No cluster is needed. In order:

1. kustomize: every kustomization.yaml under deploy/ builds (`kubectl kustomize`).
2. chart: `helm lint --strict` and a render for the chart's defaults and each
   charts/ray-history-collector/ci/*-values.yaml; every file in ci/invalid/ must be
   refused with the message its `# expect:` line names (values.schema.json and the
   templates' own checks). Rendered output goes through yamllint.
3. objects: every object of the plain manifests under deploy/, of the kustomize builds
   and of the rendered chart: built-in kinds with kubernetes-validate (strict, Kubernetes
   K8S_VERSION); RayCluster and RayJob against the openAPIV3Schema of KubeRay's v1 CRDs
   (unknown fields rejected, as kubectl's strict field validation does) and their pod
   templates, as PodTemplates, with kubernetes-validate (strict); PodMonitor and
   PrometheusRule against the Prometheus Operator's CRDs (fetched by install-test-deps.sh).
3b. monitoring: off by default, on with monitoring.enabled; the PrometheusRule is
   files/alerts.yaml (promtool check rules), monitoring.rules overrides reach it, the
   PodMonitor scrapes the rhc-metrics port of every collector of the release.
4. wiring of every Ray pod template: the collector is a native sidecar, shares the
   emptyDir at /tmp/ray with the Ray container, Ray's event variables point at the port
   it listens on, which is on the pod's loopback, its probes reach its read-only listener
   on the pod IP (--metrics-listen, containerPort rhc-metrics), the grace period covers --shutdown-timeout, its
   identity comes from the downward API, and every flag exists (the table of
   docs/configuration.md, which tests/readme_config.rs checks against the CLI). With an
   ingest token (--ingest-token-file on a Secret volume, or RHC_INGEST_TOKEN from a
   secretKeyRef), Ray's RHC_INGEST_TOKEN comes from the same Secret key, before an export
   address ending in /v1/events/$(RHC_INGEST_TOKEN); without one, Ray posts to /v1/events.
4b. ingest token Secrets: each one the Ray pods use and the objects define holds a token
   the collector takes; the chart's defaults turn the token on.
5. charts/kuberay-ray-cluster-values.yaml: the pods KubeRay's ray-cluster chart would
   build from it, through the checks of 3 and 4.
6. examples/docker-compose/compose.yaml: the same wiring between its services.
7. image tags and the chart's appVersion match Cargo.toml's version.
8. the chart's history server (historyServer.enabled): `serve` with flags of its table in
   docs/configuration.md, listening on the port its probes (/livez, /readz) and Service use,
   a writable TMPDIR, and an init container whose Python copies the ray wheel's dashboard
   (run here against the test venv's ray).

Extra arguments are more manifest files to check (e.g. KubeRay's ray-cluster chart
rendered with the snippet). Prints every check; exits 1 if any failed.
"""

import base64
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parent.parent
K8S_VERSION = os.environ.get("RHC_K8S_VERSION", "1.31")
CRD_DIR = Path(os.environ.get("RHC_KUBERAY_CRDS", REPO.parent / "shared" / "schemas"))
CHART = REPO / "charts" / "ray-history-collector"
KUBERAY_SNIPPET = REPO / "charts" / "kuberay-ray-cluster-values.yaml"
KUBECTL = os.environ.get("RHC_KUBECTL", "kubectl")
YAMLLINT = os.environ.get("RHC_YAMLLINT", "yamllint")
COLLECTOR = "ray-history-collector"
# The containerPort name of the read-only listener (probes, /metrics); the PodMonitor
# scrapes it by name.
METRICS_PORT_NAME = "rhc-metrics"
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
# The Prometheus Operator's CRDs the chart's monitoring objects are checked against: fetched
# from the Go module proxy, pinned and checked, by scripts/install-test-deps.sh.
MONITORING_CRDS = Path(
    os.environ.get("RHC_MONITORING_CRDS")
    or REPO / ".test-deps" / "crds" / "prometheus-operator-v0.93.0"
)
ALERTS = CHART / "files" / "alerts.yaml"
PROMTOOL = os.environ.get("RHC_PROMTOOL") or "promtool"
# Kubernetes' default when a pod sets no terminationGracePeriodSeconds.
DEFAULT_GRACE = 30
# What the grace period must leave for Ray's own exit, before the sidecar is stopped.
RAY_EXIT_MARGIN = 10
RAY_EVENT_ENV = {
    "RAY_enable_ray_event": "true",
    "RAY_enable_core_worker_ray_event_to_aggregator": "true",
}
RAY_EVENT_TYPES_ENV = (
    "RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES",
    "RAY_DASHBOARD_AGGREGATOR_AGENT_PUBLISHER_HTTP_ENDPOINT_EXPOSABLE_EVENT_TYPES",
)


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def section(self, title):
        print(f"\n== {title}", flush=True)

    def check(self, what, problems):
        """Records one check: `problems` is a list of strings (empty: passed)."""
        if problems:
            self.failed += 1
            print(f"  FAIL {what}", flush=True)
            for p in problems:
                for line in str(p).splitlines():
                    print(f"       {line}", flush=True)
        else:
            self.passed += 1
            print(f"  ok   {what}", flush=True)


def rel(path):
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def load_docs(text):
    return [d for d in yaml.safe_load_all(text) if d]


def obj_name(doc):
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


# ------------------------------------------------------------------ the collector's CLI

def known_flags():
    """Long flags of the collector, from docs/configuration.md's configuration table."""
    page = (REPO / "docs" / "configuration.md").read_text()
    flags = set(re.findall(r"^\| `--([a-z0-9-]+)` \|", page, re.M))
    if len(flags) < 10:
        raise SystemExit("check_deploy: could not read the flag table from docs/configuration.md")
    return flags


def known_serve_flags():
    """Long flags of `serve`, from docs/configuration.md's `serve` table (rows `| serve `--flag` |`)."""
    page = (REPO / "docs" / "configuration.md").read_text()
    flags = set(re.findall(r"^\| serve `--([a-z0-9-]+)` \|", page, re.M))
    if len(flags) < 3:
        raise SystemExit("check_deploy: could not read serve's flag table from docs/configuration.md")
    return flags


def parse_duration(text):
    """Go duration syntax (what the collector accepts) -> seconds, or None."""
    t = text.strip()
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", t):
        return float(t)
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)", t)
    if not parts or "".join(n + u for n, u in parts) != t:
        return None
    return sum(float(n) * units[u] for n, u in parts)


def parse_args(args):
    """['--a=1', '--b', '2', '--c'] -> ({'a': '1', 'b': '2', 'c': ''}, problems)."""
    out, problems, i = {}, [], 0
    while i < len(args):
        a = str(args[i])
        if not a.startswith("--"):
            problems.append(f"unexpected argument {a!r}")
            i += 1
            continue
        if "=" in a:
            k, v = a[2:].split("=", 1)
        elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
            k, v = a[2:], str(args[i + 1])
            i += 1
        else:
            k, v = a[2:], ""
        out[k] = v
        i += 1
    return out, problems


def env_map(container):
    return {e["name"]: e for e in container.get("env") or []}


def env_value(env, name):
    e = env.get(name)
    return None if e is None else e.get("value")


# ------------------------------------------------------------------ sidecar wiring

def check_ray_pod(template, *, role, flags, owner=None, grace_default=DEFAULT_GRACE):
    """Problems with the collector wiring of one Ray pod template (a PodTemplateSpec)."""
    problems = []
    spec = template.get("spec") or {}
    containers = spec.get("containers") or []
    inits = spec.get("initContainers") or []
    sidecars = [c for c in inits if c.get("name") == COLLECTOR]
    if any(c.get("name") == COLLECTOR for c in containers):
        problems.append(f"{COLLECTOR} is a regular container; make it an init container with "
                        "restartPolicy: Always (a native sidecar) so it outlives Ray")
    if len(sidecars) != 1:
        return problems + [f"expected one init container named {COLLECTOR}, found {len(sidecars)}"]
    c = sidecars[0]
    if not containers:
        return problems + ["no Ray container"]
    ray = containers[0]  # KubeRay: the Ray container comes first
    if c.get("restartPolicy") != "Always":
        problems.append("the collector init container lacks restartPolicy: Always")
    if inits.index(c) != 0:
        problems.append("the collector should be the first init container (started before the others)")
    if COLLECTOR not in str(c.get("image", "")):
        problems.append(f"unexpected collector image {c.get('image')!r}")
    if c.get("command"):
        problems.append("the collector sets `command`; the image's entrypoint is the binary, pass flags as args")

    args, arg_problems = parse_args(c.get("args") or [])
    problems += arg_problems
    for k in args:
        if k not in flags:
            problems.append(f"--{k} is not a flag of the collector (docs/configuration.md's table)")
    env = env_map(c)

    def setting(flag, var, default):
        if flag in args:
            return args[flag]
        v = env_value(env, var)
        return default if v is None else v

    # Listening addresses and probes. Events only on the pod's loopback: anything that
    # reaches the pod IP must not be able to write history. Probes and metrics on the
    # read-only listener (--metrics-listen), on the pod IP.
    listen = setting("listen", "RHC_LISTEN", "127.0.0.1:8084")
    host, _, port_s = listen.rpartition(":")
    port = int(port_s) if port_s.isdigit() else None
    if port is None:
        problems.append(f"cannot read the port of --listen {listen!r}")
    if host not in LOOPBACK:
        problems.append(f"--listen {listen}: events must listen on the pod's loopback (127.0.0.1), where "
                        "only the pod's containers reach them; put the probes and metrics on "
                        "--metrics-listen 0.0.0.0:<port>")
    metrics_listen = setting("metrics-listen", "RHC_METRICS_LISTEN", "")
    probe_host, probe_port = host, port
    if metrics_listen:
        probe_host, _, mport_s = metrics_listen.rpartition(":")
        probe_port = int(mport_s) if mport_s.isdigit() else None
        if probe_port is None:
            problems.append(f"cannot read the port of --metrics-listen {metrics_listen!r}")
        elif probe_port == port:
            problems.append(f"--metrics-listen {metrics_listen} has the port of --listen {listen}")
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    if metrics_listen and probe_port is not None:
        if ports.get(METRICS_PORT_NAME) != probe_port:
            problems.append(f"the read-only port {probe_port} is not declared as containerPort "
                            f"{METRICS_PORT_NAME!r} (what the PodMonitor scrapes)")
    if port is not None and port in ports.values() and host in LOOPBACK:
        problems.append(f"containerPort {port} is declared, but events listen on {host}: "
                        "it is not reachable from outside the pod, and should not look it")
    probes = {k: c.get(k) for k in ("startupProbe", "livenessProbe", "readinessProbe") if c.get(k)}
    for k in ("startupProbe", "livenessProbe"):
        if k not in probes:
            problems.append(f"no {k}")
    for k, probe in probes.items():
        get = probe.get("httpGet")
        if not get:
            problems.append(f"{k} is not an httpGet probe")
            continue
        want = ("/readyz", "/healthz") if k == "readinessProbe" else ("/healthz",)
        if get.get("path") not in want:
            problems.append(f"{k} path {get.get('path')!r}, expected {' or '.join(want)}")
        p = get.get("port")
        p = ports.get(p) if isinstance(p, str) else p
        if p != probe_port:
            problems.append(f"{k} port {get.get('port')!r} is not the read-only port {probe_port} "
                            "(--metrics-listen)")
        if get.get("host"):
            problems.append(f"{k} sets host; kubelet would probe that host, not the pod")
    if probes and probe_host not in ("0.0.0.0", "[::]", "::"):
        problems.append(f"the probes' listener {metrics_listen or listen}: kubelet probes connect to the "
                        "pod IP, so --metrics-listen must be 0.0.0.0:<port> (or use no httpGet probes)")

    # Role, storage, shutdown budget.
    r = setting("role", "RAY_ROLE", "head").strip().lower()
    if r != role:
        problems.append(f"role {r!r}, expected {role!r} for this group")
    if "storage" not in args and env_value(env, "RHC_STORAGE") is None and "STORAGE_BACKEND" not in env:
        problems.append("no storage configured (--storage, RHC_STORAGE or STORAGE_BACKEND)")
    timeout_s = setting("shutdown-timeout", "RHC_SHUTDOWN_TIMEOUT", "25s")
    timeout = parse_duration(timeout_s)
    grace = spec.get("terminationGracePeriodSeconds", grace_default)
    if timeout is None:
        problems.append(f"cannot read --shutdown-timeout {timeout_s!r}")
    elif grace < timeout + RAY_EXIT_MARGIN:
        problems.append(f"terminationGracePeriodSeconds {grace} < --shutdown-timeout {timeout_s} + "
                        f"{RAY_EXIT_MARGIN} s for Ray's exit (the sidecar is stopped after Ray)")

    # The shared /tmp/ray emptyDir, holding the spool.
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    spool = setting("spool-dir", "RAY_COLLECTOR_EVENT_DATA_DIR", "/tmp/ray/event-data")
    mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts") or []}
    ray_mounts = {m.get("mountPath"): m.get("name") for m in ray.get("volumeMounts") or []}
    shared = mounts.get("/tmp/ray")
    if shared is None:
        problems.append("the collector does not mount /tmp/ray")
    else:
        if "emptyDir" not in (volumes.get(shared) or {}):
            problems.append(f"volume {shared!r} at /tmp/ray is not an emptyDir of the pod")
        if ray_mounts.get("/tmp/ray") != shared:
            problems.append(f"the Ray container does not mount volume {shared!r} at /tmp/ray")
    if not (spool == "/tmp/ray" or spool.startswith("/tmp/ray/")):
        problems.append(f"--spool-dir {spool} is not on the shared /tmp/ray volume (lost on restart)")

    # Identity from the downward API (unless given explicitly).
    downward = {
        "RAY_CLUSTER_NAME": ("cluster-name", "metadata.labels['ray.io/cluster']"),
        "RAY_CLUSTER_NAMESPACE": ("cluster-namespace", "metadata.namespace"),
        "POD_IP": (None, "status.podIP"),
    }
    for var, (flag, field) in downward.items():
        if flag and flag in args:
            continue
        got = (((env.get(var) or {}).get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if got != field:
            problems.append(f"{var} should come from the downward API field {field} (got {got!r})")
    if owner:
        kind = setting("owner-kind", "OWNER_KIND", "")
        name = setting("owner-name", "OWNER_NAME", "")
        if (kind or "").lower() != owner[0] or name != owner[1]:
            problems.append(f"owner is {kind!r}/{name!r}, expected {owner[0]!r}/{owner[1]!r}")

    # Ray pushes its events to the collector.
    renv = env_map(ray)
    for name, want in RAY_EVENT_ENV.items():
        if str(env_value(renv, name)).lower() != want:
            problems.append(f"Ray container: {name} should be {want!r}")
    for name in RAY_EVENT_TYPES_ENV:
        if not env_value(renv, name):
            problems.append(f"Ray container: {name} is not set")
    addr = env_value(renv, "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR")
    token_ref, token_problems = collector_token_ref(c, args, env, volumes)
    problems += token_problems
    if token_ref is None:
        wanted = {f"http://127.0.0.1:{port}/v1/events", f"http://localhost:{port}/v1/events"}
        if addr not in wanted:
            problems.append(f"Ray container: RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR is {addr!r}, "
                            f"expected http://127.0.0.1:{port}/v1/events (the collector has no ingest token)")
    else:
        problems += ray_token_problems(ray, renv, addr, port, token_ref)

    # Resources and hardening.
    res = c.get("resources") or {}
    for section, key in (("requests", "cpu"), ("requests", "memory"), ("limits", "memory")):
        if key not in (res.get(section) or {}):
            problems.append(f"the collector has no resources.{section}.{key}")
    sc = c.get("securityContext") or {}
    if sc.get("runAsNonRoot") is not True:
        problems.append("the collector's securityContext should set runAsNonRoot: true")
    return problems


def secret_key_ref(entry):
    """(name, key, optional) of an env entry's secretKeyRef, or None."""
    ref = ((entry or {}).get("valueFrom") or {}).get("secretKeyRef")
    return None if ref is None else (ref.get("name"), ref.get("key"), bool(ref.get("optional")))


def collector_token_ref(c, args, env, volumes):
    """The collector's ingest token as (Secret name, key), or None without one; and problems.

    From --ingest-token-file (or RHC_INGEST_TOKEN_FILE) on a Secret volume of the pod, or from
    RHC_INGEST_TOKEN through a secretKeyRef. Never a literal: the token is a secret."""
    problems = []
    path = args.get("ingest-token-file") or env_value(env, "RHC_INGEST_TOKEN_FILE")
    if path and "RHC_INGEST_TOKEN" in env:
        problems.append("the collector has both --ingest-token-file and RHC_INGEST_TOKEN (it refuses to start)")
    if path:
        for m in c.get("volumeMounts") or []:
            mount = str(m.get("mountPath", "")).rstrip("/")
            if not path.startswith(mount + "/"):
                continue
            rest = path[len(mount) + 1:]
            secret = (volumes.get(m.get("name")) or {}).get("secret")
            if secret is None:
                return None, problems + [f"--ingest-token-file {path} is on volume {m.get('name')!r}, "
                                         "not a Secret volume"]
            if secret.get("optional"):
                problems.append(f"the ingest token's Secret volume {m.get('name')!r} is optional: without the "
                                "Secret the collector cannot start, and should wait for it")
            items = secret.get("items")
            key = next((i.get("key") for i in items if i.get("path") == rest), None) if items else rest
            if key is None:
                return None, problems + [f"--ingest-token-file {path}: no item of Secret volume {m.get('name')!r} "
                                         f"has path {rest!r}"]
            return (secret.get("secretName"), key), problems
        return None, problems + [f"--ingest-token-file {path} is on no volume mount of the collector"]
    if "RHC_INGEST_TOKEN" in env:
        ref = secret_key_ref(env["RHC_INGEST_TOKEN"])
        if ref is None:
            return None, problems + ["the collector's RHC_INGEST_TOKEN is a literal: take it from a Secret "
                                     "(secretKeyRef), as Ray's"]
        if ref[2]:
            problems.append("the collector's RHC_INGEST_TOKEN secretKeyRef is optional")
        return ref[:2], problems
    return None, problems


def ray_token_problems(ray, renv, addr, port, token_ref):
    """Ray's side of the ingest token: RHC_INGEST_TOKEN from the collector's Secret key,
    defined before the export address that ends in $(RHC_INGEST_TOKEN)."""
    problems = []
    wanted = {f"http://{h}:{port}/v1/events/$(RHC_INGEST_TOKEN)" for h in ("127.0.0.1", "localhost")}
    if addr not in wanted:
        problems.append(f"Ray container: RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR is {addr!r}, "
                        f"expected http://127.0.0.1:{port}/v1/events/$(RHC_INGEST_TOKEN): the collector "
                        "refuses posts without its ingest token")
    ref = secret_key_ref(renv.get("RHC_INGEST_TOKEN"))
    if ref is None:
        problems.append("Ray container: RHC_INGEST_TOKEN should come from the collector's Secret "
                        f"{token_ref[0]!r} key {token_ref[1]!r} (secretKeyRef)")
        return problems
    if ref[:2] != tuple(token_ref):
        problems.append(f"Ray container: RHC_INGEST_TOKEN comes from Secret {ref[0]!r} key {ref[1]!r}, the "
                        f"collector's from {token_ref[0]!r} key {token_ref[1]!r}")
    if ref[2]:
        problems.append("Ray container: the RHC_INGEST_TOKEN secretKeyRef is optional: without the Secret "
                        "$(RHC_INGEST_TOKEN) would stay unexpanded in the export address")
    names = [e.get("name") for e in ray.get("env") or []]
    export = "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR"
    if export in names and names.index("RHC_INGEST_TOKEN") > names.index(export):
        problems.append("Ray container: RHC_INGEST_TOKEN is defined after the export address; Kubernetes "
                        "expands $(VAR) only from earlier entries")
    return problems


def valid_ingest_token(token):
    """Why `token` (the decoded Secret value) is not an ingest token the collector takes, or None."""
    t = token.strip()
    if not 16 <= len(t) <= 256:
        return f"{len(t)} characters, not 16 to 256"
    if not re.fullmatch(r"[A-Za-z0-9._~-]+", t):
        return "not only A-Z a-z 0-9 - . _ ~"
    return None


def check_token_secrets(docs, report, where):
    """Each ingest token Secret that the Ray pods of `docs` use and `docs` define holds a
    token the collector takes; one they use but do not define is named (created apart)."""
    secrets = {obj_name(d).split("/", 1)[-1]: d for d in docs if d.get("kind") == "Secret"}
    refs = set()
    for doc in docs:
        if doc.get("kind") not in ("RayCluster", "RayJob"):
            continue
        for _, template, _ in ray_pod_templates(doc):
            spec = template.get("spec") or {}
            inits = [c for c in spec.get("initContainers") or [] if c.get("name") == COLLECTOR]
            if not inits:
                continue
            c = inits[0]
            args, _ = parse_args(c.get("args") or [])
            volumes = {v.get("name"): v for v in spec.get("volumes") or []}
            ref, _ = collector_token_ref(c, args, env_map(c), volumes)
            if ref:
                refs.add(tuple(ref))
    for name, key in sorted(refs):
        secret = secrets.get(name)
        if secret is None:
            report.check(f"{where}: ingest token Secret {name!r} is created apart (not in these objects)", [])
            continue
        data = secret.get("data") or {}
        string_data = secret.get("stringData") or {}
        if key in string_data:
            value = str(string_data[key])
        elif key in data:
            value = base64.b64decode(data[key]).decode("utf-8", "replace")
        else:
            report.check(f"{where}: ingest token Secret {name!r} has key {key!r}", [f"no key {key!r}"])
            continue
        why = valid_ingest_token(value)
        report.check(f"{where}: ingest token Secret {name!r} key {key!r} holds a token the collector takes",
                     [why] if why else [])


def ray_pod_templates(doc):
    """(where, template, role) for each Ray pod template of a RayCluster or RayJob."""
    if doc.get("kind") == "RayCluster":
        cluster = doc.get("spec") or {}
        prefix = "spec"
    else:
        cluster = (doc.get("spec") or {}).get("rayClusterSpec") or {}
        prefix = "spec.rayClusterSpec"
    out = []
    head = (cluster.get("headGroupSpec") or {}).get("template")
    if head is not None:
        out.append((f"{prefix}.headGroupSpec", head, "head"))
    for i, g in enumerate(cluster.get("workerGroupSpecs") or []):
        out.append((f"{prefix}.workerGroupSpecs[{i}] ({g.get('groupName')})", g.get("template") or {}, "worker"))
    return out


# ------------------------------------------------------------------ schema validation

def strict_crd_schema(crd_path):
    """The v1 openAPIV3Schema of a CRD, with unknown fields rejected."""
    crd = yaml.safe_load(crd_path.read_text())
    versions = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    if not versions:
        raise SystemExit(f"check_deploy: {crd_path} has no v1 version")
    schema = copy.deepcopy(versions[0]["schema"]["openAPIV3Schema"])

    def walk(node):
        if isinstance(node, dict):
            # A structural schema prunes (the API server's strict field validation
            # rejects) fields it does not list, unless told to keep them.
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            # Go's RE2 takes inline flags ("^(?i)(abort|warn)?$", the Prometheus
            # Operator's CRDs); JSON Schema's ECMA dialect does not. Such a pattern is
            # rewritten with case classes ([aA]) for (?i), the only flag these CRDs use.
            pattern = node.get("pattern")
            if isinstance(pattern, str) and "(?i)" in pattern:
                node["pattern"] = re.sub(r"[A-Za-z]", lambda m: f"[{m[0].lower()}{m[0].upper()}]",
                                         pattern.replace("(?i)", ""))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return crd["spec"]["names"]["kind"], schema


def format_error(e):
    path = "/".join(str(p) for p in e.absolute_path) or "(top)"
    return f"at {path}: {e.message}"


def validate_object(doc, crd_validators, report, where):
    """Schema checks of one object; returns the pod templates of Ray objects."""
    kind = doc.get("kind")
    label = f"{where}: {obj_name(doc)}"
    if kind in crd_validators:
        errors = sorted(crd_validators[kind].iter_errors(doc), key=lambda e: list(e.absolute_path))
        owner = "the Prometheus Operator's" if kind in ("PodMonitor", "PrometheusRule") else "KubeRay's"
        report.check(f"{label} matches {owner} {kind} CRD", [format_error(e) for e in errors[:10]])
        if kind in ("PodMonitor", "PrometheusRule"):
            if doc.get("apiVersion") != "monitoring.coreos.com/v1":
                report.check(f"{label} apiVersion", [f"apiVersion {doc.get('apiVersion')!r}, expected monitoring.coreos.com/v1"])
            return
        if doc.get("apiVersion") != "ray.io/v1":
            report.check(f"{label} apiVersion", [f"apiVersion {doc.get('apiVersion')!r}, expected ray.io/v1"])
        for path, template, _ in ray_pod_templates(doc):
            pod_template = {"apiVersion": "v1", "kind": "PodTemplate",
                            "metadata": {"name": "check"}, "template": template}
            report.check(f"{label} {path}.template is a valid pod template (kubernetes-validate --strict)",
                         k8s_problems(pod_template))
        return
    report.check(f"{label} (kubernetes-validate --strict, {K8S_VERSION})", k8s_problems(doc))


def k8s_problems(doc):
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [f"no Kubernetes {K8S_VERSION} schema for {doc.get('apiVersion')} {doc.get('kind')}"]
    except kubernetes_validate.ValidationError as e:
        inner = getattr(e, "caused_by", None) or e
        msg = getattr(inner, "message", None) or str(e).split("\n\n")[0]
        path = "/".join(str(p) for p in getattr(inner, "absolute_path", []) or [])
        return [f"at {path or '(top)'}: {msg}"]
    except kubernetes_validate.InvalidSchemaError as e:
        return [f"invalid schema: {e}"]
    return []


def check_wiring(doc, flags, report, where):
    kind = doc.get("kind")
    if kind not in ("RayCluster", "RayJob"):
        return
    owner = ("rayjob", doc["metadata"]["name"]) if kind == "RayJob" else None
    for path, template, role in ray_pod_templates(doc):
        report.check(f"{where}: {obj_name(doc)} {path}: collector sidecar wiring",
                     check_ray_pod(template, role=role, flags=flags, owner=owner))


def check_history_server(doc, serve_flags, dashboard_build):
    """Problems of the chart's history-server Deployment: it runs `serve` with flags that
    exist, listens on all addresses at the port its probes and Service use, has a writable
    TMPDIR on a read-only root, and its dashboard init container's Python copies a real ray
    wheel's built dashboard (run here against the test venv's ray, into a temp dir)."""
    problems = []
    spec = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = spec.get("containers") or []
    if len(containers) != 1:
        return [f"{len(containers)} containers, expected 1"]
    c = containers[0]
    args = c.get("args") or []
    if not args or args[0] != "serve":
        return [f"args {args!r} do not start with serve"]
    values = {}
    for a in args[1:]:
        m = re.match(r"^--([a-z0-9-]+)(?:=(.*))?$", a)
        if not m:
            problems.append(f"argument {a!r} is not --flag=value")
            continue
        if m[1] not in serve_flags:
            problems.append(f"--{m[1]} is not a flag of serve (docs/configuration.md)")
        values[m[1]] = m[2]
    listen = values.get("listen") or ""
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    if not listen.startswith("0.0.0.0:") or str(ports.get("http")) != listen.rsplit(":", 1)[-1]:
        problems.append(f"--listen {listen!r} is not 0.0.0.0 at containerPort http ({ports.get('http')})")
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readz")):
        get = (c.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != path or get.get("port") != "http":
            problems.append(f"{probe} is {get!r}, expected {path} on port http")
    env = env_map(c)
    mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts") or []}
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    tmpdir = env_value(env, "TMPDIR")
    if (c.get("securityContext") or {}).get("readOnlyRootFilesystem"):
        if tmpdir not in mounts or "emptyDir" not in volumes.get(mounts.get(tmpdir), {}):
            problems.append(f"TMPDIR {tmpdir!r} is not an emptyDir on a read-only root (spill files)")
    dash = values.get("dashboard-dir")
    inits = spec.get("initContainers") or []
    if dash is not None:
        copier = [i for i in inits if any(m.get("mountPath") == "/dashboard" for m in i.get("volumeMounts") or [])]
        if not copier or not dash.startswith("/dashboard/"):
            problems.append(f"--dashboard-dir {dash!r} but no init container fills /dashboard")
        else:
            cmd = copier[0].get("command") or []
            if cmd[:2] != ["python", "-c"] or len(cmd) != 3:
                problems.append(f"the dashboard init container runs {cmd!r}, expected python -c <code>")
            elif dashboard_build is not None:
                problems += dashboard_build(cmd[2], dash)
    elif inits:
        problems.append("init containers without --dashboard-dir")
    return problems


def dashboard_copy_check():
    """A function that runs the init container's Python (with /dashboard mapped to a temp
    dir) in the test venv, which has the ray wheel, and checks index.html arrives where
    --dashboard-dir points; None without RHC_PYTHON."""
    python = os.environ.get("RHC_PYTHON")
    if not python:
        return None

    def run(code, dashboard_dir):
        with tempfile.TemporaryDirectory(prefix="rhc-dashboard.") as tmp:
            p = subprocess.run([python, "-c", code.replace("'/dashboard/", f"'{tmp}/")],
                               capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                return [f"the init container's python failed: {p.stderr.strip()[-500:]}"]
            index = Path(tmp) / Path(dashboard_dir).relative_to("/dashboard") / "index.html"
            return [] if index.is_file() else [f"no index.html at {dashboard_dir} after the copy"]
    return run


# ------------------------------------------------------------------ sources of objects

def kustomize_builds(report):
    """(kustomization dir, docs) for each kustomization under deploy/."""
    out = []
    for k in sorted((REPO / "deploy").rglob("kustomization.yaml")):
        d = k.parent
        p = subprocess.run([KUBECTL, "kustomize", str(d)], capture_output=True, text=True, timeout=60)
        docs = load_docs(p.stdout) if p.returncode == 0 else []
        problems = [] if p.returncode == 0 else [p.stderr.strip()]
        if p.returncode == 0 and not docs:
            problems.append("the build is empty")
        report.check(f"kubectl kustomize {rel(d)} ({len(docs)} objects)", problems)
        out.append((d, docs))
    return out


def plain_manifests(report):
    out = []
    for f in sorted((REPO / "deploy").rglob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        try:
            docs = load_docs(f.read_text())
            problems = [] if docs else ["no objects"]
        except yaml.YAMLError as e:
            docs, problems = [], [str(e)]
        report.check(f"{rel(f)} parses ({len(docs)} objects)", problems)
        out.append((f, docs))
    return out


def render_chart(values):
    with helm.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values, name="rhc", namespace="ray-history", is_install=True)
    docs, stream = [], []
    for path, text in sorted(rendered.items()):
        if not path.endswith(".yaml") or not text.strip():
            continue
        docs += load_docs(text)
        stream.append(f"---\n# Source: {path}\n{text.strip()}\n")
    return docs, "".join(stream)


def chart_renders(report, tmp):
    """(label, docs) for each values file; also lints, checks refusals, yamllints."""
    cases = [("defaults + storage.url + image", {"storage": {"url": "s3://ray-historyserver"},
                                                  "image": {"repository": "registry.example.com/ray-history-collector"}})]
    for f in sorted((CHART / "ci").glob("*-values.yaml")):
        cases.append((rel(f), yaml.safe_load(f.read_text()) or {}))
    out = []
    for label, values in cases:
        lint = helm.lint(str(CHART), values, strict=True, kube_version=f"v{K8S_VERSION}.0")
        problems = [f"{m['path']}: {m['error'].strip()}" for m in lint["messages"] if m["severity"] >= 2]
        problems += lint.get("errors") or []
        report.check(f"helm lint --strict ({label})", problems)
        try:
            docs, stream = render_chart(values)
            problems = [] if docs else ["nothing rendered"]
        except helm.HelmError as e:
            docs, stream, problems = [], "", [str(e)]
        report.check(f"helm template ({label}): {', '.join(obj_name(d) for d in docs)}", problems)
        if stream:
            out_file = Path(tmp) / (re.sub(r"[^A-Za-z0-9.-]+", "_", label) + ".rendered.yaml")
            out_file.write_text(stream)
            p = subprocess.run([YAMLLINT, "-s", "-c", str(REPO / ".yamllint.yaml"), str(out_file)],
                               capture_output=True, text=True, timeout=60)
            report.check(f"yamllint of the rendered chart ({label})",
                         [] if p.returncode == 0 else [p.stdout.strip() or p.stderr.strip()])
        out.append((f"chart[{label}]", docs))

    for f in sorted((CHART / "ci" / "invalid").glob("*.yaml")):
        m = re.search(r"^# expect: (.+)$", f.read_text(), re.M)
        if not m:
            report.check(f"{rel(f)} names the expected error", ["no `# expect: <message>` line"])
            continue
        expected = m.group(1).strip()
        values = yaml.safe_load(f.read_text()) or {}
        try:
            render_chart(values)
            problems = ["rendered without error"]
        except helm.HelmError as e:
            problems = [] if expected in str(e) else [f"refused, but without {expected!r}:", str(e)]
        report.check(f"{rel(f)} is refused: {expected}", problems)
    return out


def rule_groups(doc):
    """The groups of a PrometheusRule, as a rule file holds them."""
    return (doc.get("spec") or {}).get("groups") or []


def promtool_check(groups, label):
    """`promtool check rules` of a rule file holding `groups`; problems."""
    with tempfile.NamedTemporaryFile("w", suffix=".rules.yaml", prefix="rhc-alerts.") as f:
        yaml.safe_dump({"groups": groups}, f)
        f.flush()
        try:
            p = subprocess.run([PROMTOOL, "check", "rules", f.name], capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            return [f"{PROMTOOL} is missing: run ./scripts/install-test-deps.sh (Debian's prometheus package)"]
    return [] if p.returncode == 0 else [f"{label}: {(p.stdout + p.stderr).strip()}"]


def check_monitoring(report):
    """The chart's PodMonitor and PrometheusRule: off by default, on with one value; the
    rules are files/alerts.yaml, with monitoring.rules overrides applied; the PodMonitor
    scrapes the port the pods declare."""
    base = {"storage": {"url": "s3://ray-historyserver"},
            "image": {"repository": "registry.example.com/ray-history-collector"}}
    file_groups = yaml.safe_load(ALERTS.read_text())["groups"]
    alerts = [r["alert"] for g in file_groups for r in g["rules"]]
    report.check(f"promtool check rules {rel(ALERTS)} ({len(alerts)} alerts)", promtool_check(file_groups, rel(ALERTS)))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    configured = set((values.get("monitoring") or {}).get("rules") or {})
    report.check("values.yaml's monitoring.rules names every alert of files/alerts.yaml, and no other",
                 [f"missing {a}" for a in alerts if a not in configured]
                 + [f"unknown {a}" for a in sorted(configured - set(alerts))])

    docs, _ = render_chart(base)
    kinds = [d.get("kind") for d in docs]
    report.check("monitoring off by default: no PodMonitor, no PrometheusRule",
                 [k for k in kinds if k in ("PodMonitor", "PrometheusRule")])

    docs, _ = render_chart({**base, "monitoring": {"enabled": True}})
    by_kind = {d.get("kind"): d for d in docs}
    rule = by_kind.get("PrometheusRule")
    report.check("monitoring.enabled=true renders a PodMonitor and a PrometheusRule",
                 [f"no {k}" for k in ("PodMonitor", "PrometheusRule") if k not in by_kind])
    if rule:
        problems = [] if rule_groups(rule) == file_groups else [
            "the default PrometheusRule's groups differ from files/alerts.yaml (a default in "
            "values.yaml's monitoring.rules that is not the file's?)"]
        report.check("the default PrometheusRule is files/alerts.yaml, unchanged", problems)
    pm = by_kind.get("PodMonitor")
    if pm:
        problems = []
        selector = ((pm.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        endpoints = (pm.get("spec") or {}).get("podMetricsEndpoints") or []
        if [e.get("port") for e in endpoints] != [METRICS_PORT_NAME]:
            problems.append(f"podMetricsEndpoints {endpoints!r}: expected port {METRICS_PORT_NAME}")
        pods = [t for d in docs if d.get("kind") in ("RayCluster", "RayJob") for _, t, _ in ray_pod_templates(d)]
        for t in pods:
            labels = (t.get("metadata") or {}).get("labels") or {}
            if any(labels.get(k) != v for k, v in selector.items()):
                problems.append(f"a Ray pod's labels {labels} do not match the selector {selector}")
            sidecar = next((c for c in (t.get("spec") or {}).get("initContainers") or [] if c.get("name") == COLLECTOR), {})
            if METRICS_PORT_NAME not in [p.get("name") for p in sidecar.get("ports") or []]:
                problems.append(f"a collector declares no port {METRICS_PORT_NAME}")
        if not pods:
            problems.append("no Ray pod rendered")
        report.check(f"the PodMonitor scrapes port {METRICS_PORT_NAME} of every collector of the release "
                     f"({len(pods)} pod templates)", problems)

    overrides = {"RayHistoryUploadsFailing": {"for": "3m"},
                 "RayHistorySpoolNearlyFull": {"threshold": 0.65, "for": "1m"},
                 "RayHistoryEventsNotUploaded": {"threshold": 45},
                 "RayHistoryEventsQuarantined": {"enabled": False}}
    docs, _ = render_chart({**base, "monitoring": {"enabled": True, "podMonitor": {"enabled": False},
                                                   "rules": overrides}})
    kinds = [d.get("kind") for d in docs]
    rule = next((d for d in docs if d.get("kind") == "PrometheusRule"), None)
    problems = [] if "PodMonitor" not in kinds else ["podMonitor.enabled=false still renders a PodMonitor"]
    if rule is None:
        problems.append("no PrometheusRule")
    else:
        got = {r["alert"]: r for g in rule_groups(rule) for r in g["rules"]}
        want = {r["alert"]: r for g in file_groups for r in g["rules"]}
        if "RayHistoryEventsQuarantined" in got:
            problems.append("RayHistoryEventsQuarantined.enabled=false did not drop the alert")
        if got.get("RayHistoryUploadsFailing", {}).get("for") != "3m":
            problems.append(f"for of RayHistoryUploadsFailing: {got.get('RayHistoryUploadsFailing', {}).get('for')!r}")
        for name, threshold in (("RayHistorySpoolNearlyFull", "0.65"), ("RayHistoryEventsNotUploaded", "45")):
            expr, default = got.get(name, {}).get("expr", ""), want[name]["expr"]
            expected = re.sub(r"[0-9.]+(\s*)$", threshold + r"\1", default)
            if expr != expected:
                problems.append(f"{name}: expr {expr!r}, expected {expected!r}")
        for name in ("RayHistoryDashboardSnapshotsFailing",):
            if got.get(name) != want[name]:
                problems.append(f"{name} changed without an override")
        problems += promtool_check(rule_groups(rule), "the PrometheusRule with overrides")
    report.check("monitoring.rules: for, threshold and enabled=false reach the PrometheusRule, "
                 "which promtool accepts", problems)


def kuberay_chart_pods(values):
    """The head and worker pod templates KubeRay's ray-cluster chart builds from
    `values` (templates/raycluster-cluster.yaml: initContainers, then one Ray container
    with common.containerEnv + <group>.containerEnv, its volumeMounts, the group's
    volumes and serviceAccountName; no terminationGracePeriodSeconds)."""
    common_env = ((values.get("common") or {}).get("containerEnv")) or []
    out = []
    for group, name, role in (("head", "ray-head", "head"), ("worker", "ray-worker", "worker")):
        g = values.get(group) or {}
        ray = {"name": name, "image": "rayproject/ray:2.60.0",
               "env": common_env + (g.get("containerEnv") or [])}
        if g.get("volumeMounts"):
            ray["volumeMounts"] = g["volumeMounts"]
        spec = {"containers": [ray] + (g.get("sidecarContainers") or [])}
        if g.get("initContainers"):
            spec["initContainers"] = g["initContainers"]
        if g.get("volumes"):
            spec["volumes"] = g["volumes"]
        if g.get("serviceAccountName"):
            spec["serviceAccountName"] = g["serviceAccountName"]
        out.append((group, {"metadata": {"labels": {"app.kubernetes.io/name": "kuberay"}}, "spec": spec}, role))
    return out


def check_compose(path, flags):
    """Wiring of the Docker Compose example: Ray shares the collector's network and
    /tmp/ray, posts to its port, and is given time to upload on stop."""
    problems = []
    services = (yaml.safe_load(path.read_text()) or {}).get("services") or {}
    col, ray = services.get("collector"), services.get("ray")
    if not col or not ray:
        return ["services `collector` and `ray` are both needed"]
    args, arg_problems = parse_args(col.get("command") or [])
    problems += arg_problems
    problems += [f"--{k} is not a flag of the collector" for k in args if k not in flags]
    listen = args.get("listen", "127.0.0.1:8084")
    port = listen.rpartition(":")[2]
    if ray.get("network_mode") != "service:collector":
        problems.append("ray must use network_mode: service:collector (the pod's shared network)")
    env = ray.get("environment") or {}
    addr = env.get("RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR")
    if addr != f"http://127.0.0.1:{port}/v1/events":
        problems.append(f"ray posts to {addr!r}, the collector listens on {listen}")
    for name, want in RAY_EVENT_ENV.items():
        if str(env.get(name)).lower() != want:
            problems.append(f"ray: {name} should be {want!r}")
    for name in RAY_EVENT_TYPES_ENV:
        if not env.get(name):
            problems.append(f"ray: {name} is not set")

    def tmp_volume(svc):
        return next((v.split(":")[0] for v in svc.get("volumes") or [] if v.split(":")[1] == "/tmp/ray"), None)

    if not tmp_volume(col) or tmp_volume(col) != tmp_volume(ray):
        problems.append("collector and ray must share one volume at /tmp/ray")
    spool = args.get("spool-dir", "/tmp/ray/event-data")
    if not spool.startswith("/tmp/ray/"):
        problems.append(f"--spool-dir {spool} is not on the shared volume")
    timeout = parse_duration(args.get("shutdown-timeout", "25s"))
    grace = parse_duration(str(col.get("stop_grace_period", "10s")))
    if timeout is None or grace is None or grace <= timeout:
        problems.append(f"collector stop_grace_period {col.get('stop_grace_period')!r} must exceed "
                        f"--shutdown-timeout {args.get('shutdown-timeout', '25s')}")
    if "storage" not in args:
        problems.append("no --storage")
    return problems


def cargo_version():
    m = re.search(r'^version\s*=\s*"([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M)
    return m.group(1)


# No public image of the collector exists: the KubeRay chart snippet names this placeholder,
# which kubelet refuses at once (InvalidImageName: a repository name must be lower case)
# instead of a pod waiting on a pull of an image no registry has.
IMAGE_PLACEHOLDER = "REPLACE-WITH-YOUR-REGISTRY/ray-history-collector"


def snippet_image_problems(snippet):
    problems = []
    images = image_tags(snippet, [])
    for img in images:
        if not img.startswith(IMAGE_PLACEHOLDER + ":"):
            problems.append(f"image {img!r} is not the placeholder {IMAGE_PLACEHOLDER}:<version>")
    if not images:
        problems.append("no collector image in the snippet")
    page = (REPO / "docs" / "kubernetes.md").read_text()
    m = re.search(r"^## KubeRay's `ray-cluster` chart\n(.*?)\n## ", page, re.S | re.M)
    section = m.group(1) if m else ""
    step = re.search(r"```sh\n(.*?)```", section, re.S)
    step = step.group(1) if step else ""
    if IMAGE_PLACEHOLDER not in step or step.find(IMAGE_PLACEHOLDER) > step.find("helm install"):
        problems.append("docs/kubernetes.md's KubeRay ray-cluster chart commands do not replace "
                        f"{IMAGE_PLACEHOLDER} before `helm install`")
    return problems


def image_tags(node, found):
    if isinstance(node, dict):
        img = node.get("image")
        if isinstance(img, str) and COLLECTOR in img:
            found.append(img)
        for v in node.values():
            image_tags(v, found)
    elif isinstance(node, list):
        for v in node:
            image_tags(v, found)
    return found


def main():
    report = Report()
    flags = known_flags()

    report.section(f"KubeRay CRDs from {CRD_DIR}")
    crd_validators = {}
    for name in ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml",
                 "monitoring.coreos.com_podmonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml"):
        path = (MONITORING_CRDS if name.startswith("monitoring.") else CRD_DIR) / name
        if not path.is_file():
            var = "RHC_MONITORING_CRDS (run scripts/install-test-deps.sh)" if name.startswith("monitoring.") else "RHC_KUBERAY_CRDS"
            report.check(f"{path} exists", [f"missing; set {var} to the directory holding {name}"])
            continue
        kind, schema = strict_crd_schema(path)
        jsonschema.Draft7Validator.check_schema(schema)
        crd_validators[kind] = jsonschema.Draft7Validator(schema)
        report.check(f"{name}: v1 openAPIV3Schema of {kind} loaded", [])

    sources = []  # (where, docs)

    report.section("plain manifests (deploy/)")
    for f, docs in plain_manifests(report):
        sources.append((rel(f), docs))

    report.section("kustomize builds")
    builds = kustomize_builds(report)
    for d, docs in builds:
        sources.append((f"kustomize {rel(d)}", docs))
    top = dict((rel(d), docs) for d, docs in builds).get("deploy", [])
    kinds = {doc.get("kind") for doc in top}
    report.check("deploy/ (the local try) holds MinIO, its bucket Job, the ServiceAccount and a RayCluster",
                 [f"missing {k}" for k in ("Deployment", "Job", "ServiceAccount", "RayCluster") if k not in kinds])

    report.section("Helm chart")
    with tempfile.TemporaryDirectory(prefix="rhc-check-deploy.") as tmp:
        sources += chart_renders(report, tmp)

    report.section("monitoring: PodMonitor, PrometheusRule, files/alerts.yaml")
    check_monitoring(report)

    for extra in sys.argv[1:]:
        sources.append((extra, load_docs(Path(extra).read_text())))

    report.section(f"objects: Kubernetes {K8S_VERSION} schemas (strict) and KubeRay CRDs")
    for where, docs in sources:
        for doc in docs:
            validate_object(doc, crd_validators, report, where)

    report.section("collector sidecar wiring of every Ray pod")
    for where, docs in sources:
        for doc in docs:
            check_wiring(doc, flags, report, where)

    report.section("ingest token Secrets")
    for where, docs in sources:
        check_token_secrets(docs, report, where)
    defaults = dict(sources).get("chart[defaults + storage.url + image]", [])
    report.check("the chart's defaults turn the ingest token on, with a Secret of the release",
                 [] if any(d.get("kind") == "Secret" and obj_name(d).endswith("-ingest-token") for d in defaults)
                 else ["no <fullname>-ingest-token Secret in the default render"])

    report.section("the chart's history server (serve)")
    serve_flags, copier = known_serve_flags(), dashboard_copy_check()
    found = 0
    for where, docs in sources:
        for doc in docs:
            if doc.get("kind") == "Deployment" and where.startswith("chart["):
                found += 1
                report.check(f"{where}: {obj_name(doc)}: serve's flags, port, probes, TMPDIR, dashboard copy",
                             check_history_server(doc, serve_flags, copier))
    report.check(f"the history server is rendered by the ci values that enable it ({found} found)",
                 [] if found >= 2 else ["expected the Deployment of ci/history-server-values.yaml and ci/minio-values.yaml"])

    report.section(f"KubeRay ray-cluster chart snippet ({rel(KUBERAY_SNIPPET)})")
    snippet = yaml.safe_load(KUBERAY_SNIPPET.read_text())
    for group, template, role in kuberay_chart_pods(snippet):
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": group},
                        "template": template}
        report.check(f"{group} pod is a valid pod template (kubernetes-validate --strict)",
                     k8s_problems(pod_template))
        report.check(f"{group} pod: collector sidecar wiring (default 30 s grace period)",
                     check_ray_pod(template, role=role, flags=flags))

    report.check("the snippet's collector image is the placeholder Kubernetes refuses "
                 f"(InvalidImageName), and docs/kubernetes.md's helm step replaces it",
                 snippet_image_problems(snippet))

    compose = REPO / "examples" / "docker-compose" / "compose.yaml"
    report.section(f"Docker Compose example ({rel(compose)})")
    report.check("collector and Ray wired as in a pod", check_compose(compose, flags))

    report.section("versions")
    version = cargo_version()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    report.check(f"chart appVersion is the crate's version {version}",
                 [] if str(chart.get("appVersion")) == version else [f"appVersion {chart.get('appVersion')!r}"])
    tags = image_tags([d for _, docs in sources if not _.startswith("chart[") for d in docs], [])
    tags += image_tags(snippet, [])
    wrong = sorted({t for t in tags if not t.endswith(f":{version}")})
    report.check(f"collector images in deploy/ and the snippet are tagged {version} ({len(tags)} found)",
                 [f"image {t}" for t in wrong] + ([] if tags else ["no collector image found"]))

    print(f"\ncheck_deploy: {report.passed} passed, {report.failed} failed", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
