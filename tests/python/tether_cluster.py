"""Real tether clusters for the Python package's tests.

`cluster(shards, workers, flags)` starts tether-server processes on
loopback: shard 0 on a free port (its address read from its "listening on"
log line), the others pointed at it with --coordinator; it returns once
every shard listens and has registered. `spawn(argv, name)` runs any other
process (a tether-worker, a Python worker) with its output in a log file.
Everything they started is killed (SIGKILL) at teardown, and the tail of
every log is printed (pytest shows it when a test fails).

Binaries: $TETHER_SERVER_BIN, $TETHER_WORKER_BIN, $TETHER_UP_BIN, else
build/release/.... Python subprocesses run this interpreter with the
`tether` package this process imported on their PYTHONPATH.
"""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

import tether

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent


def _bin(env, name):
    return os.environ.get(env) or str(REPO / "build" / "release" / name)


SERVER_BIN = _bin("TETHER_SERVER_BIN", "tether-server")
WORKER_BIN = _bin("TETHER_WORKER_BIN", "tether-worker")
UP_BIN = _bin("TETHER_UP_BIN", "tether-up")
PACKAGE_DIR = str(Path(tether.__file__).resolve().parent.parent)


def python_env():
    """The environment for Python subprocesses: this `tether` first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [PACKAGE_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                         if p])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")  # 2 cores, several processes
    return env


def tail(text, lines=30):
    return "\n".join(text.splitlines()[-lines:])


class Process:
    """A child process whose stdout and stderr go to `log_path`."""

    def __init__(self, argv, log_path, env=None, cwd=None):
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.argv, stdout=self._log,
                                      stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env,
                                      cwd=cwd or str(REPO))

    @property
    def pid(self):
        return self.popen.pid

    def log(self):
        return self.log_path.read_text(errors="replace")

    def running(self):
        return self.popen.poll() is None

    def wait_for_line(self, text, timeout):
        """The first log line containing `text` (or matching it, a compiled
        regex); fails the test on timeout or when the process exits first."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log().splitlines():
                if (text.search(line) if isinstance(text, re.Pattern)
                        else text in line):
                    return line
            if not self.running():
                pytest.fail(f"{self.log_path.name} exited "
                            f"({self.popen.returncode}) before logging "
                            f"{text!r}:\n{tail(self.log())}")
            if time.monotonic() > deadline:
                pytest.fail(f"{self.log_path.name}: no {text!r} within "
                            f"{timeout} s:\n{tail(self.log())}")
            time.sleep(0.05)

    def wait(self, timeout):
        """The exit code; fails the test if it still runs after `timeout`."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.log_path.name} still runs after {timeout} s:"
                        f"\n{tail(self.log())}")

    def signal(self, sig):
        if self.running():
            self.popen.send_signal(sig)

    def kill(self):
        if self.running():
            self.popen.kill()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


def address_from_line(line):
    m = re.search(r"listening on (\S+)", line)
    assert m, line
    return m.group(1)


class Cluster:
    """shards[i] is shard i's Process; `coordinator` is shard 0's address,
    `addresses[i]` shard i's."""

    def __init__(self, registry, directory, shards, workers, flags,
                 shard_flags, data_dir):
        self._registry = registry
        self.dir = Path(directory)
        self.num_shards = shards
        self.shard_flags = list(shard_flags)
        self.data_dir = data_dir
        self.shards = []
        self.addresses = []
        self.coordinator = None
        run = ["--workers", workers] + list(flags)
        for i in range(shards):
            self.shards.append(self._start(i, "127.0.0.1:0",
                                           run if i == 0 else []))
            line = self.shards[i].wait_for_line("listening on", 15)
            self.addresses.append(address_from_line(line))
            if i == 0:
                self.coordinator = self.addresses[0]
        for i in range(1, shards):
            self.shards[0].wait_for_line(f"shard {i} registered", 15)

    def _start(self, i, listen, flags, log_name=None):
        argv = [SERVER_BIN, "--shard-id", i, "--shards", self.num_shards,
                "--listen", listen, "--http", "off"]
        if i > 0:
            argv += ["--coordinator", self.coordinator]
        if self.data_dir:
            argv += ["--data-dir", self.dir / f"shard{i}"]
        argv += list(flags) + self.shard_flags
        return self._registry.start(argv, self.dir /
                                    (log_name or f"shard{i}.log"))

    def restart(self, i, extra_flags=(), log_name=None):
        """Starts shard `i` (killed before) again on its address."""
        assert i > 0 and not self.shards[i].running()
        p = self._start(i, self.addresses[i], list(extra_flags),
                        log_name or f"shard{i}-again.log")
        self.shards[i] = p
        return p


class Registry:
    """Every process a test started, killed at teardown."""

    def __init__(self, directory):
        self.dir = Path(directory)
        self.processes = []

    def start(self, argv, log_path, env=None):
        p = Process(argv, log_path, env=env)
        self.processes.append(p)
        return p

    def teardown(self):
        for p in self.processes:
            p.kill()
        for p in self.processes:
            text = p.log()
            if text:
                print(f"--- {p.log_path.name} ({p.log_path}) ---\n"
                      f"{tail(text)}")


def run_concurrently(*fns, timeout=60):
    """Runs each fn on its own thread (tether.Client() blocks until every
    worker joined, so workers of one run connect concurrently); returns
    their results in order and re-raises the first exception."""
    import threading

    results = [None] * len(fns)
    errors = [None] * len(fns)

    def body(i, fn):
        try:
            results[i] = fn()
        except BaseException as e:  # noqa: B902 -- re-raised below
            errors[i] = e

    threads = [threading.Thread(target=body, args=(i, fn), daemon=True)
               for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            pytest.fail(f"a worker thread still runs after {timeout} s")
    for e in errors:
        if e is not None:
            raise e
    return results


def shard_stats(coordinator):
    """Every shard's stats(), from a fresh observer."""
    with tether.Client(coordinator, observer=True, join_timeout=10) as o:
        return o.stats()



def wait_for_held_pulls(client, count, timeout=10):
    """Until shard 0 holds at least `count` pulls for the staleness bound."""
    deadline = time.monotonic() + timeout
    while client.stats()[0]["waiting_pulls"] < count:
        assert time.monotonic() < deadline, f"{count} pull(s) are not held"
        time.sleep(0.05)
