#!/usr/bin/python3
"""Kubernetes.PodCommandsAccepted: every pod's command passes --check.

For every pod that tools/deploy/kubernetes makes (pods.py: each StatefulSet
ordinal, each Indexed Job completion index) and every container in it: its
command + args, its environment (values, and the downward-API fields the
kubelet fills: pod name, the pod-index label, the completion-index
annotation) with $(VAR) expanded the way Kubernetes does, are run with
`--check` appended, in an environment holding only those variables (and
PATH), by the real binaries: /usr/bin/tether-NAME is the build's
tether-NAME (TETHER_SERVER_BIN, TETHER_WORKER_BIN, or --bin-dir). A
`/bin/sh -c SCRIPT` command runs its script with /bin/sh, so the script's
choice of flags is checked too. Each must exit 0. The shards are checked
again with TETHER_RESUME=latest (how an operator resumes).

Then commands that must be refused (exit 2), so that this test can fail:
an unknown flag appended, a third shard pod (pod-index 2) of a 2-shard run,
a worker whose completion index is not a number, a shard listening on all
addresses without the run's key, shard 0's dashboard on all addresses
without its token file, shard 0 given a --coordinator.

Usage: check_commands.py [--bin-dir DIR] [--manifests DIR]
Exit 0 when every check passes, 1 otherwise.
"""
import argparse
import copy
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pods  # noqa: E402

failures = []
passed = 0


def run_check(argv, env, bins, extra=()):
    """(exit status, output) of the container command with --check."""
    run_env = dict(env)
    run_env["PATH"] = "/usr/bin:/bin"
    if pods.is_shell(argv):
        cmd = [argv[0], "-c", pods.map_binaries(argv[2], bins)] + \
            list(argv[3:]) + list(extra) + ["--check"]
    else:
        cmd = [pods.map_binaries(argv[0], bins)] + list(argv[1:]) + \
            list(extra) + ["--check"]
    missing = [b for b in bins.values() if not os.access(b, os.X_OK)]
    if missing:
        return 127, "not executable: %s" % missing
    r = subprocess.run(cmd, env=run_env, capture_output=True, text=True,
                       timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()


def expect(what, status, output, want_ok, must_say=None):
    """want_ok: exit 0; else exit 2 with `must_say` in the output (the
    refusal names what is wrong, not some other flag)."""
    global passed
    ok = (status == 0) if want_ok else (
        status == 2 and (must_say is None or must_say in output))
    head = output.splitlines()[-1] if output else "(no output)"
    if ok:
        passed += 1
        print("ok   %s: exit %d: %s" % (what, status, head))
    else:
        failures.append(what)
        print("FAIL %s: exit %d (want %s):\n     %s" %
              (what, status,
               "0" if want_ok else "2, saying %r" % (must_say or ""),
               output.replace("\n", "\n     ")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default=os.environ.get(
        "TETHER_BIN_DIR", os.path.join(pods.REPO, "build", "release")))
    ap.add_argument("--manifests", default=pods.DEFAULT_DIR)
    a = ap.parse_args()
    bins = {
        "tether-server": os.environ.get(
            "TETHER_SERVER_BIN", os.path.join(a.bin_dir, "tether-server")),
        "tether-worker": os.environ.get(
            "TETHER_WORKER_BIN", os.path.join(a.bin_dir, "tether-worker")),
    }
    docs = pods.load(a.manifests)
    all_pods = pods.pods(docs)

    # --- every pod, as the manifests make it ----------------------------------
    for p in all_pods:
        for c, env, argv in pods.containers(p):
            who = "%s/%s" % (p["name"], c["name"])
            st, out = run_check(argv, env, bins)
            expect(who, st, out, True)
            if "TETHER_RESUME" in env:
                env2 = dict(env, TETHER_RESUME="latest")
                st, out = run_check(argv, env2, bins)
                expect(who + " with TETHER_RESUME=latest", st, out, True)

    # --- broken on purpose: each must be refused ---------------------------------
    shards = [p for p in all_pods if p["kind"] == "StatefulSet"]
    workers = [p for p in all_pods if p["kind"] == "Job"]
    for p in (shards[0], shards[-1], workers[0]):
        c, env, argv = pods.containers(p)[0]
        st, out = run_check(argv, env, bins, extra=["--no-such-flag", "1"])
        expect("%s with an unknown flag appended (refused)" % p["name"],
               st, out, False, "--no-such-flag")

    # A third shard pod of a 2-shard run (kubectl scale --replicas 3).
    sts = next(d for _, _, d in docs if d["kind"] == "StatefulSet")
    scaled = copy.deepcopy(sts)
    scaled["spec"]["replicas"] = int(sts["spec"]["replicas"]) + 1
    extra_pod = pods.pods([(None, 0, scaled)])[-1]
    c, env, argv = pods.containers(extra_pod)[0]
    st, out = run_check(argv, env, bins)
    expect("%s, one more shard than --shards (refused)" % extra_pod["name"],
           st, out, False, "--shard-id")

    # A worker whose completion index is not a number.
    w = copy.deepcopy(workers[0])
    w["annotations"]["batch.kubernetes.io/job-completion-index"] = "x"
    c, env, argv = pods.containers(w)[0]
    st, out = run_check(argv, env, bins)
    expect("%s with completion index 'x' (refused)" % w["name"], st, out,
           False, "TETHER_RANK")

    # The shards listen on 0.0.0.0: without the key they must be refused.
    # (A rule tether-server applies at start, server.cc; --check must apply
    # it too, or a pod that passes --check still exits at start.)
    for p in (shards[0], shards[-1]):
        c, env, argv = pods.containers(p)[0]
        args = list(argv)
        for i, word in enumerate(args):
            if word == "--auth-key-file" and i + 1 < len(args):
                del args[i:i + 2]
                break
        else:
            args = None
        if args is None:
            expect("%s: has an --auth-key-file to take away" % p["name"],
                   1, "no --auth-key-file in its args", True)
            continue
        st, out = run_check(args, env, bins)
        expect("%s without --auth-key-file, listening on 0.0.0.0 (refused)" %
               p["name"], st, out, False, "--auth-key-file")

    # Shard 0's dashboard on all addresses without its token file (the same
    # kind of start-time rule, dashboard.cc).
    c, env, argv = pods.containers(shards[0])[0]
    script = argv[2] if pods.is_shell(argv) else ""
    if "--http-token-file" in script:
        no_token = list(argv)
        no_token[2] = re.sub(r"--http-token-file\s+\S+", "", script)
        st, out = run_check(no_token, env, bins)
        expect("%s without --http-token-file, dashboard on 0.0.0.0 (refused)"
               % shards[0]["name"], st, out, False, "--http-token-file")

    # Shard 0 given shard 1's role flags.
    c, env, argv = pods.containers(shards[0])[0]
    st, out = run_check(argv, env, bins,
                        extra=["--coordinator", "tether-shard-1.tether-shard:7070"])
    expect("%s with a --coordinator (refused)" % shards[0]["name"], st, out,
           False, "--coordinator")


if __name__ == "__main__":
    try:
        main()
    except (pods.ManifestError, KeyError, OSError,
            subprocess.TimeoutExpired) as err:
        failures.append(repr(err))
        print("FAIL error: %r" % (err,))
    print("%d passed, %d failed" % (passed, len(failures)))
    sys.exit(1 if failures else 0)
