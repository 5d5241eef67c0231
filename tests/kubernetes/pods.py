#!/usr/bin/python3
"""The pods that tools/deploy/kubernetes would make, without a cluster.

Reads the manifests (the files kustomization.yaml lists) and turns each pod
template into the pods its controller would run: a StatefulSet's
tether-shard-0..N-1, an Indexed Job's one pod per completion index. For each
pod and container it computes what the kubelet would exec:

  - the environment, in order, with the downward-API fields Kubernetes fills
    (metadata.name, metadata.namespace, metadata.labels['...'] including the
    StatefulSet's apps.kubernetes.io/pod-index and pod-name labels,
    metadata.annotations['...'] including the Job's completion index) and
    $(VAR) references expanded against the variables defined before;
  - command + args with $(VAR) expanded the way Kubernetes does
    (k8s.io/kubernetes third_party/forked/golang/expansion: $$ is a literal $,
    $(NAME) of an undefined NAME stays as it is).

When the command is `/bin/sh -c SCRIPT NAME ARGS...` the script is run with
/usr/bin/tether-* replaced by a recorder, which gives the argv the tether
program itself would get (program_argv()).

Used by check_manifests.py (Kubernetes.ManifestsParse), check_commands.py
(Kubernetes.PodCommandsAccepted) and, through `pods.py emit`,
pods_netns_test.sh (Kubernetes.PodsInNetworkNamespaces).

Needs Debian's python3-yaml.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_DIR = os.path.join(REPO, "tools", "deploy", "kubernetes")
NAMESPACE = "default"
SHELLS = ("/bin/sh", "sh", "/bin/bash", "bash", "/bin/dash")


class ManifestError(Exception):
    pass


# --- loading ------------------------------------------------------------------

def manifest_files(directory=DEFAULT_DIR):
    """The files kustomization.yaml lists under resources, in order."""
    kfile = os.path.join(directory, "kustomization.yaml")
    with open(kfile) as f:
        k = yaml.safe_load(f)
    files = []
    for r in k.get("resources") or []:
        path = os.path.join(directory, r)
        if not os.path.isfile(path):
            raise ManifestError("%s lists %s, which is not a file" % (kfile, r))
        files.append(path)
    return files


def load(directory=DEFAULT_DIR):
    """[(file, index, document)] of every non-empty document."""
    docs = []
    for path in manifest_files(directory):
        with open(path) as f:
            for i, d in enumerate(yaml.safe_load_all(f)):
                if d is not None:
                    docs.append((path, i, d))
    return docs


# --- Kubernetes' $(VAR) expansion ------------------------------------------------

def expand(text, mapping):
    """k8s.io/kubernetes/third_party/forked/golang/expansion.Expand."""
    out = []
    checkpoint = 0
    cursor = 0
    n = len(text)
    while cursor < n:
        if text[cursor] == "$" and cursor + 1 < n:
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1:]
            if rest[0] == "$":
                read, is_var, advance = "$", False, 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close == -1:
                    read, is_var, advance = "$(", False, 1
                else:
                    read, is_var, advance = rest[1:close], True, close + 1
            else:
                read, is_var, advance = "$" + rest[0], False, 1
            if is_var:
                out.append(mapping[read] if read in mapping else "$(" + read + ")")
            else:
                out.append(read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(path, pod):
    if path == "metadata.name":
        return pod["name"]
    if path == "metadata.namespace":
        return pod["namespace"]
    if path == "status.podIP" and pod.get("ip"):
        return pod["ip"]
    m = _FIELD.match(path)
    if m:
        table = pod[m.group(1)]
        if m.group(2) not in table:
            raise ManifestError("%s: %s is not set on pod %s" %
                                (pod["name"], path, pod["name"]))
        return table[m.group(2)]
    raise ManifestError("fieldRef %s: not one this helper fills" % path)


def container_env(container, pod):
    """The container's environment as the kubelet builds it (ordered)."""
    env = {}
    for e in container.get("env") or []:
        name = e["name"]
        if "value" in e:
            env[name] = expand(str(e["value"]), env)
        elif "valueFrom" in e and "fieldRef" in e["valueFrom"]:
            env[name] = field_value(e["valueFrom"]["fieldRef"]["fieldPath"], pod)
        elif "valueFrom" in e:
            raise ManifestError("%s: env %s: only value and fieldRef are handled"
                                % (pod["name"], name))
        else:
            env[name] = ""
    if container.get("envFrom"):
        raise ManifestError("%s: envFrom is not handled" % pod["name"])
    return env


def container_argv(container, env):
    command = container.get("command")
    if not command:
        raise ManifestError("container %s has no command (the image's "
                            "entrypoint is not read here)" % container["name"])
    return [expand(str(a), env) for a in list(command) +
            list(container.get("args") or [])]


# --- pods -----------------------------------------------------------------------

def pods(docs):
    """Every pod the workloads would run: dicts with kind, owner, name,
    ordinal, labels, annotations, spec, hostname, subdomain."""
    out = []
    for _, _, d in docs:
        kind = d.get("kind")
        meta = d["metadata"]
        if kind == "StatefulSet":
            spec = d["spec"]
            for i in range(int(spec.get("replicas", 1))):
                name = "%s-%d" % (meta["name"], i)
                labels = dict(spec["template"]["metadata"].get("labels") or {})
                labels["apps.kubernetes.io/pod-index"] = str(i)
                labels["statefulset.kubernetes.io/pod-name"] = name
                out.append(dict(
                    kind=kind, owner=meta["name"], name=name, ordinal=i,
                    namespace=NAMESPACE, labels=labels,
                    annotations=dict(spec["template"]["metadata"].get(
                        "annotations") or {}),
                    spec=spec["template"]["spec"], hostname=name,
                    subdomain=spec.get("serviceName"), doc=d))
        elif kind == "Job":
            spec = d["spec"]
            n = int(spec.get("completions", 1))
            for i in range(n):
                name = "%s-%d-x%04d" % (meta["name"], i, i)
                labels = dict(spec["template"]["metadata"].get("labels") or {})
                annotations = dict(spec["template"]["metadata"].get(
                    "annotations") or {})
                labels["job-name"] = meta["name"]
                labels["batch.kubernetes.io/job-name"] = meta["name"]
                if spec.get("completionMode") == "Indexed":
                    labels["batch.kubernetes.io/job-completion-index"] = str(i)
                    annotations["batch.kubernetes.io/job-completion-index"] = str(i)
                out.append(dict(
                    kind=kind, owner=meta["name"], name=name, ordinal=i,
                    namespace=NAMESPACE, labels=labels, annotations=annotations,
                    spec=spec["template"]["spec"], hostname=name,
                    subdomain=spec["template"]["spec"].get("subdomain"), doc=d))
        elif kind in ("Deployment", "DaemonSet", "Pod", "ReplicaSet"):
            raise ManifestError("%s %s: this helper knows StatefulSets and "
                                "Jobs only" % (kind, meta["name"]))
    return out


def containers(pod):
    """[(container, env, argv)] of the pod's containers (init ones first)."""
    out = []
    for c in list(pod["spec"].get("initContainers") or []) + list(
            pod["spec"]["containers"]):
        env = container_env(c, pod)
        out.append((c, env, container_argv(c, env)))
    return out


# --- what the tether program gets ------------------------------------------------

_RECORDER = """#!/usr/bin/python3
import json, os, sys
with open(os.environ["PODS_PY_RECORD"], "w") as f:
    json.dump({"program": os.path.basename(sys.argv[0]),
               "argv": sys.argv[1:]}, f)
"""


def is_shell(argv):
    return len(argv) >= 3 and argv[0] in SHELLS and argv[1] == "-c"


def map_binaries(text, bins):
    """/usr/bin/tether-NAME -> bins[NAME] (a path), in a word or a script."""
    return re.sub(r"/usr/bin/(tether-[a-z-]+)",
                  lambda m: bins.get(m.group(1), m.group(0)), text)


def program_argv(argv, env):
    """(program, argv after it) that the container's command execs.

    A plain command is itself. A `sh -c SCRIPT ...` one is run with every
    /usr/bin/tether-* replaced by a recorder of its arguments."""
    if not is_shell(argv):
        return os.path.basename(argv[0]), list(argv[1:])
    tmp = tempfile.mkdtemp(prefix="pods-py-")
    try:
        names = set(re.findall(r"/usr/bin/(tether-[a-z-]+)", argv[2]))
        bins = {}
        for n in names:
            p = os.path.join(tmp, n)
            with open(p, "w") as f:
                f.write(_RECORDER)
            os.chmod(p, 0o755)
            bins[n] = p
        record = os.path.join(tmp, "record.json")
        run_env = dict(env)
        run_env["PATH"] = "/usr/bin:/bin"
        run_env["PODS_PY_RECORD"] = record
        shell_argv = [argv[0], "-c", map_binaries(argv[2], bins)] + argv[3:]
        r = subprocess.run(shell_argv, env=run_env, capture_output=True,
                           text=True, timeout=30)
        if r.returncode != 0 or not os.path.exists(record):
            raise ManifestError("the shell command exited %d without exec'ing "
                                "a tether program: %s" %
                                (r.returncode, r.stderr.strip()))
        with open(record) as f:
            rec = json.load(f)
        return rec["program"], rec["argv"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def flag_values(args, env, bool_flags=()):
    """{flag: value} from argv (--f v, --f=v; a flag followed by another
    flag or nothing is a boolean) and TETHER_<FLAG> variables, the command
    line winning, as the tether programs read them."""
    values = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            name = a[2:]
            if "=" in name:
                name, v = name.split("=", 1)
            elif name in bool_flags or i + 1 >= len(args) or \
                    args[i + 1].startswith("--"):
                v = "true"
            else:
                i += 1
                v = args[i]
            values[name] = v
        i += 1
    for k, v in env.items():
        if k.startswith("TETHER_"):
            flag = k[len("TETHER_"):].lower().replace("_", "-")
            values.setdefault(flag, v)
    return values


def host_port(text):
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def opened_ports(program, flags):
    """{port: (flag, host)} of the TCP ports the tether program listens on."""
    ports = {}
    if program == "tether-server":
        listen = flags.get("listen", "127.0.0.1:7070")
        h, p = host_port(listen)
        ports[p] = ("listen", h)
        shard = int(flags.get("shard-id", "0") or 0)
        http = flags.get("http", "127.0.0.1:8080")
        if shard == 0 and http != "off":
            h, p = host_port(http)
            ports[p] = ("http", h)
        health = flags.get("health", "off")
        if health != "off":
            h, p = host_port(health)
            ports[p] = ("health", h)
    return ports


def container_ports(container):
    """{name or str(number): number} of the container's declared ports."""
    out = {}
    for p in container.get("ports") or []:
        out[str(p["containerPort"])] = int(p["containerPort"])
        if p.get("name"):
            out[p["name"]] = int(p["containerPort"])
    return out


# --- emit: files for the network-namespace test ---------------------------------

def emit(args):
    docs = load(args.manifests)
    bins = {}
    for b in args.bin:
        name, _, path = b.partition("=")
        bins[name] = path
    os.makedirs(args.out, exist_ok=True)
    index = []
    secret_files = set()
    for pod in pods(docs):
        pod_dir = os.path.join(args.root, pod["name"])
        for c, env, argv in containers(pod):
            # Each volume mount becomes a directory of the pod's own (a
            # volumeClaimTemplate's or an emptyDir's) or a shared one (a
            # Secret's: SECRETS/<secretName>).
            volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
            claims = {t["metadata"]["name"] for t in
                      pod["doc"]["spec"].get("volumeClaimTemplates") or []}
            mounts = []
            for m in c.get("volumeMounts") or []:
                v = volumes.get(m["name"])
                if v is not None and "secret" in v:
                    host = os.path.join(args.secrets, v["secret"]["secretName"])
                elif m["name"] in claims:
                    host = os.path.join(pod_dir, "pvc-" + m["name"])
                    os.makedirs(host, exist_ok=True)  # a new, empty volume
                else:
                    host = os.path.join(pod_dir, "vol-" + m["name"])
                    os.makedirs(host, exist_ok=True)
                mounts.append((m["mountPath"].rstrip("/"), host))
            mounts.sort(key=lambda mh: -len(mh[0]))

            # One pass, so that a host path is never mapped again (an
            # emptyDir on /tmp, host dirs under /tmp).
            table = dict(mounts)
            table.update({"/usr/bin/" + n: p for n, p in bins.items()})
            pattern = re.compile(
                r"(?<![\w./-])(" + "|".join(re.escape(k) for k in sorted(
                    table, key=len, reverse=True)) + r")(?=/|\s|$|[\"';])")

            def mapped(text):
                return pattern.sub(lambda m: table[m.group(1)], text)

            base = "%s.%s" % (pod["name"], c["name"])
            with open(os.path.join(args.out, base + ".argv"), "wb") as f:
                for a in argv:
                    f.write(mapped(a).encode() + b"\0")
            with open(os.path.join(args.out, base + ".env"), "wb") as f:
                for k, v in env.items():
                    f.write(("%s=%s" % (k, mapped(v))).encode() + b"\0")
            program, pargs = program_argv(argv, env)
            flags = flag_values(pargs, env)
            for mp, host in mounts:
                if host.startswith(args.secrets + os.sep):
                    for flag in ("auth-key-file", "http-token-file"):
                        path = flags.get(flag, "")
                        if path.startswith(mp + "/"):
                            secret_files.add(os.path.relpath(
                                mapped(path), args.secrets))
            probes = {}
            for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
                pr = c.get(kind)
                if pr and "httpGet" in pr:
                    port = pr["httpGet"]["port"]
                    probes[kind] = {"path": pr["httpGet"]["path"],
                                    "port": container_ports(c).get(str(port))}
            index.append({
                "pod": pod["name"], "container": c["name"], "kind": pod["kind"],
                "owner": pod["owner"], "ordinal": pod["ordinal"],
                "hostname": pod["hostname"], "subdomain": pod["subdomain"],
                "namespace": pod["namespace"], "program": program,
                "flags": flags, "probes": probes, "files": base,
                "dirs": sorted({h for _, h in mounts if h.startswith(pod_dir)}),
            })
    with open(os.path.join(args.out, "pods.json"), "w") as f:
        json.dump(index, f, indent=1)
    # One line per pod container, for a shell: FILES KIND ORDINAL HOSTNAME
    # SUBDOMAIN NAMESPACE READINESS_PORT LIVENESS_PORT ("-": none).
    with open(os.path.join(args.out, "pods.tsv"), "w") as f:
        for e in index:
            f.write("\t".join(str(x) if x not in (None, "") else "-" for x in (
                e["files"], e["kind"], e["ordinal"], e["hostname"],
                e["subdomain"], e["namespace"],
                e["probes"].get("readinessProbe", {}).get("port"),
                e["probes"].get("livenessProbe", {}).get("port"))) + "\n")
    # The Secret files the commands read: SECRET/KEY, one a line.
    with open(os.path.join(args.out, "secret-files"), "w") as f:
        for path in sorted(secret_files):
            f.write(path + "\n")
    for e in index:
        print("%s: %s %s" % (e["files"], e["program"], " ".join(
            "--%s %s" % kv for kv in sorted(e["flags"].items()))))


def probe(args):
    """Polls NAME=URL targets like a kubelet's httpGet probes (from outside
    the pods) and logs each change of answer: EPOCH NAME CODE BODY, CODE the
    HTTP status or "down" (no connection). Runs until killed."""
    targets = [t.split("=", 1) for t in args.target]
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    last = {}
    with open(args.log, "a", buffering=1) as log:
        while True:
            for name, url in targets:
                try:
                    with opener.open(url, timeout=1) as r:
                        code, body = r.status, r.read(200)
                except urllib.error.HTTPError as e:
                    code, body = e.code, e.read(200)
                except Exception as e:  # refused, reset, timed out
                    code, body = "down", type(e).__name__.encode()
                if last.get(name) != code:
                    last[name] = code
                    text = body.decode(errors="replace").strip().replace("\n", " ")
                    log.write("%.3f %s %s %s\n" % (time.time(), name, code, text))
            time.sleep(args.interval)


def http(args):
    """One request, as `kubectl port-forward svc/...` + a browser would send
    it; prints STATUS CONTENT-TYPE FIRST-LINE-OF-BODY."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    headers = {}
    if args.token_file:
        with open(args.token_file) as f:
            headers["Authorization"] = "Bearer " + f.read().strip()
    elif args.token:
        headers["Authorization"] = "Bearer " + args.token
    req = urllib.request.Request(args.url, method=args.method, headers=headers,
                                 data=b"" if args.method == "POST" else None)
    try:
        with opener.open(req, timeout=5) as r:
            status, ctype, body = r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        status, ctype, body = e.code, e.headers.get("Content-Type"), e.read()
    line = body.decode(errors="replace").strip().split("\n")[0][:200]
    print("%s %s %s" % (status, (ctype or "-").split(";")[0], line))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("emit", help="write POD.CONTAINER.argv/.env (NUL-"
                       "separated) and pods.json for every pod")
    e.add_argument("--manifests", default=DEFAULT_DIR)
    e.add_argument("--out", required=True)
    e.add_argument("--root", required=True,
                   help="each pod's volumes go in ROOT/POD/")
    e.add_argument("--secrets", required=True,
                   help="Secret NAME's files are in SECRETS/NAME/")
    e.add_argument("--bin", action="append", default=[],
                   help="tether-NAME=PATH: what /usr/bin/tether-NAME is")
    pr = sub.add_parser("probe", help="poll NAME=URL targets, log changes")
    pr.add_argument("--log", required=True)
    pr.add_argument("--interval", type=float, default=0.1)
    pr.add_argument("target", nargs="+")
    h = sub.add_parser("http", help="one HTTP request; prints the status")
    h.add_argument("method", choices=["GET", "POST"])
    h.add_argument("url")
    h.add_argument("--token-file")
    h.add_argument("--token")
    a = ap.parse_args()
    try:
        if a.cmd == "emit":
            emit(a)
        elif a.cmd == "probe":
            probe(a)
        elif a.cmd == "http":
            http(a)
    except ManifestError as err:
        print("pods.py: %s" % err, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
