"""`python3 -m tether.worker` and tether.torch in whole runs: a stop request
(POST /api/stop) ends Python workers cleanly, a resumed run skips the
batches its checkpoint round covered, ChunkSampler uses every row once per
epoch, Python workers' progress reaches stats(), and refusals raise
tether.Error subclasses carrying their code and the server's message;
workers overlapping their steps push no staler than the bound allows."""

import hashlib
import json
import math
import re
import shlex
import signal
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

import tether
import tether.torch
from tether_cluster import TESTS, address_from_line, run_concurrently, \
    shard_stats, tail

MODEL = f"{TESTS / 'linear_model.py'}:Net"
TRAIN_ROWS = 60000  # Fashion-MNIST's training split
ADAM = ["--optimizer", "adam", "--lr", "0.001", "--block-size", "4096"]


def python_worker(spawn, coordinator, rank, *flags, name=None):
    """`python3 -m tether.worker` on linear_model.Net as worker `rank`."""
    return spawn.module(
        ["-m", "tether.worker", "--coordinator", coordinator,
         "--model", MODEL, "--input-shape", "784", "--rank", str(rank),
         "--threads", "1", *[str(f) for f in flags]],
        name or f"worker{rank}")


def final_clock(log):
    """The clock of a worker's final progress line ("... clock C ...
    (done in ...)")."""
    m = re.search(r"worker \d+: epoch \d+/\d+ clock (\d+) .*\(done in", log)
    assert m, tail(log)
    return int(m.group(1))


def http(method, url, token=None):
    """(status, parsed JSON body) of a dashboard request."""
    request = urllib.request.Request(url, method=method,
                                     data=b"" if method == "POST" else None)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body or b"null")
        except ValueError:
            return e.code, body.decode(errors="replace")


# --- 1. POST /api/stop ------------------------------------------------------

def test_stop_request_ends_python_workers_cleanly(cluster, spawn, tmp_path):
    token_file = tmp_path / "dashboard.token"
    run = cluster(shards=1, workers=2, flags=[
        "--http", "127.0.0.1:0", "--http-token-file", str(token_file),
        "--dashboard-interval-ms", "100"] + ADAM)
    line = run.shards[0].wait_for_line("dashboard at http://", 10)
    dashboard = re.search(r"dashboard at (http://[^/\s]+)/", line).group(1)
    token = token_file.read_text().strip()
    assert token

    epochs, batch = 20, 100
    planned = epochs * -(-TRAIN_ROWS // 2 // batch)  # 6000 clocks each
    workers = [python_worker(spawn, run.coordinator, r, "--epochs", epochs,
                             "--batch", batch, "--staleness", "2",
                             "--eval-every", "0", "--quiet")
               for r in range(2)]

    # A few clocks into the run (the dashboard's status has them).
    deadline = time.monotonic() + 60
    while True:
        status, body = http("GET", f"{dashboard}/api/status")
        assert status == 200, body
        if body["state"] == "running" and (body["min_clock"] or 0) >= 20:
            break
        for w in workers:
            assert w.running(), tail(w.log())
        assert time.monotonic() < deadline, body
        time.sleep(0.05)
    clock_at_stop = body["min_clock"]  # every worker's clock is past it

    assert http("POST", f"{dashboard}/api/stop")[0] == 401  # no token
    sent = time.monotonic()
    status, answer = http("POST", f"{dashboard}/api/stop", token)
    assert status == 202, answer
    assert answer["workers"] == 2, answer
    assert answer["round"] is None, answer  # no --data-dir: no round

    stopped_at = []
    for r, w in enumerate(workers):
        assert w.wait(30) == 0, tail(w.log())
        log = w.log()
        m = re.search(rf"worker {r}: stopping at clock (\d+)", log)
        assert m, tail(log)
        stopped_at.append(int(m.group(1)))
        # It reported once more, its own final progress line, at that clock.
        assert final_clock(log) == stopped_at[-1], tail(log)
        assert "Traceback" not in log, tail(log)
    took = time.monotonic() - sent
    assert took < 20, took
    # Stopped after the request, well before 20 epochs.
    for c in stopped_at:
        assert clock_at_stop <= c < planned // 4, (clock_at_stop, stopped_at)

    status, body = http("GET", f"{dashboard}/api/status")
    assert body["state"] == "stopped", body
    assert run.shards[0].running()
    # Rank 0 evaluated the weights it stopped with.
    m = re.search(r"test accuracy ([\d.]+)%", workers[0].log())
    assert m and 0 < float(m.group(1)) <= 100, tail(workers[0].log())
    # A second stop changes nothing.
    assert http("POST", f"{dashboard}/api/stop", token)[0] == 409


# --- 2. --resume latest -----------------------------------------------------

def test_resumed_run_skips_covered_batches(cluster, spawn):
    epochs, batch, every = 4, 100, 100
    run_flags = ADAM + ["--max-staleness", "2", "--checkpoint-every", every]
    run = cluster(shards=2, workers=2, data_dir=True, flags=run_flags)
    share = -(-TRAIN_ROWS // 2)  # worker_share: row i belongs to rank i % 2
    planned = epochs * -(-share // batch)  # 1200 clocks each

    def start_workers(suffix):
        return [python_worker(spawn, run.coordinator, r, "--epochs", epochs,
                              "--batch", batch, "--staleness", "2",
                              "--eval-every", "0", "--quiet",
                              name=f"worker{r}{suffix}")
                for r in range(2)]

    workers = start_workers("")
    line = run.shards[0].wait_for_line(
        re.compile(r"checkpoint round \d+ complete"), 60)
    round_done = int(re.search(r"round (\d+)", line).group(1))
    assert 0 < round_done < planned, line
    # Everything dies at once, the workers mid-run.
    for w in workers:
        assert w.running(), tail(w.log())
    for p in workers + run.shards:
        p.signal(signal.SIGKILL)
    for p in workers + run.shards:
        assert p.wait(10) == -signal.SIGKILL
    clocks_before = [final_clock_or_none(w.log()) for w in workers]
    assert clocks_before == [None, None], clocks_before  # not finished

    # Every shard comes back on its address; shard 0 resumes the latest
    # complete round and the other shard follows it.
    time.sleep(0.3)
    shard0 = run._start(0, run.addresses[0],
                        ["--workers", 2] + run_flags + ["--resume", "latest"],
                        "shard0-again.log")
    assert address_from_line(shard0.wait_for_line("listening on", 15)) == \
        run.addresses[0]
    run.shards[0] = shard0
    shard1 = run.restart(1)
    loaded = {}
    for i, shard in enumerate((shard0, shard1)):
        line = shard.wait_for_line(
            re.compile(rf"shard {i} loaded checkpoint round \d+ \(clock"), 20)
        loaded[i] = int(re.search(r"round (\d+)", line).group(1))
    assert loaded[0] == loaded[1] >= round_done, loaded
    resumed = loaded[0]
    shard0.wait_for_line(f"resumed from checkpoint round {resumed}", 20)
    for shard in (shard0, shard1):
        shard.wait_for_line(f"resuming from round {resumed} (clock {resumed})",
                            5)

    workers = start_workers("-again")
    for r, w in enumerate(workers):
        assert w.wait(60) == 0, tail(w.log())
        assert f"resuming from round {resumed} (clock {resumed})" in w.log(), \
            tail(w.log())
        # Its last batch was the plan's last: the round's batches were
        # skipped, not trained again (that would end at resumed + planned).
        assert final_clock(w.log()) == planned, (resumed, tail(w.log()))
    stats = shard_stats(run.coordinator)
    for s in stats:
        assert sorted((w["rank"], w["clock"]) for w in s["workers"]) == [
            (0, planned), (1, planned)], s["workers"]
    # Progress goes to shard 0: each resumed worker trained the batches
    # after the round, and finished.
    for w in stats[0]["workers"]:
        assert w["done"] is True, w
        assert w["samples"] == (planned - resumed) * batch, (resumed, w)


def final_clock_or_none(log):
    m = re.search(r"clock (\d+) .*\(done in", log)
    return int(m.group(1)) if m else None


# --- 3. ChunkSampler ----------------------------------------------------------

def test_chunk_sampler_uses_every_row_once(cluster, spawn):
    rows, chunk_rows, epochs, batch = 1000, 100, 2, 50
    run = cluster(shards=1, workers=2)
    data = torch.utils.data.TensorDataset(torch.arange(rows),
                                          torch.arange(rows) * 2)
    seen = [[[] for _ in range(epochs)] for _ in range(2)]  # [rank][epoch]
    batches = [0, 0]  # by rank
    cut = []  # (epoch, the batch's indices), from both workers
    seeds = set()
    stats = []

    def worker(rank):
        def body():
            with tether.Client(run.coordinator, rank=rank) as c:
                sampler = tether.torch.ChunkSampler(c, rows, chunk_rows,
                                                    epochs)
                loader = torch.utils.data.DataLoader(data, batch_size=batch,
                                                     sampler=sampler)
                for index, doubled in loader:
                    assert torch.equal(doubled, index * 2)
                    # Batches do not straddle chunks: the sampler's epoch
                    # is this batch's.
                    seen[rank][sampler.epoch].extend(index.tolist())
                    batches[rank] += 1
                    cut.append((sampler.epoch, tuple(index.tolist())))
                    c.clock()
                seeds.add(c.seed)
                if rank == 0:
                    stats.extend(c.stats())
                return c.clocks
        return body

    clocks = run_concurrently(worker(0), worker(1), timeout=60)
    for e in range(epochs):
        used = seen[0][e] + seen[1][e]
        assert sorted(used) == list(range(rows)), (
            e, len(used), len(set(used)))
        assert set(seen[0][e]).isdisjoint(seen[1][e])
    # Each chunk is a slice of the epoch's order, worker_share of rank 0 of
    # 1 with the run's seed (what tether-worker --chunk-rows trains on).
    (seed,) = seeds
    orders = [tether.worker_share(rows, 0, 1, seed, e).tolist()
              for e in range(epochs)]
    assert orders[0] != orders[1]
    slices = {(e, tuple(orders[e][i:i + batch]))
              for e in range(epochs) for i in range(0, rows, batch)}
    assert all(b in slices for b in cut), cut[:3]
    # Both workers trained (chunks go to whoever asks), a clock per batch
    # at least (a worker waiting for the last chunks clocks too).
    assert all(n > 0 for n in batches), batches
    assert sum(batches) == epochs * rows // batch, batches
    for r in range(2):
        assert clocks[r] >= batches[r], (clocks, batches)
    # Shard 0 counted each epoch's chunks done once.
    assert stats, "no stats"
    data_epochs = {e["epoch"]: e for e in stats[0]["data_epochs"]}
    assert sorted(data_epochs) == list(range(epochs)), stats[0]["data_epochs"]
    for e in data_epochs.values():
        assert (e["rows_done"], e["duplicates"], e["chunks_done"],
                e["chunks_total"]) == (rows, 0, rows // chunk_rows,
                                       rows // chunk_rows), e

    # python3 -m tether.worker --chunk-rows on a run of its own.
    chunked = cluster(shards=1, workers=2, flags=ADAM)
    workers = [python_worker(spawn, chunked.coordinator, r, "--epochs", 1,
                             "--batch", 100, "--chunk-rows", 6000,
                             "--eval-every", "0", "--quiet",
                             name=f"chunked{r}")
               for r in range(2)]
    for w in workers:
        assert w.wait(60) == 0, tail(w.log())
    (s,) = shard_stats(chunked.coordinator)
    assert [(e["epoch"], e["rows_done"], e["duplicates"])
            for e in s["data_epochs"]] == [(0, TRAIN_ROWS, 0)], s
    assert sum(w["samples"] for w in s["workers"]) == TRAIN_ROWS, s


# --- 4. progress ------------------------------------------------------------

def test_python_workers_report_progress_evaluating_in_the_background(
        cluster, spawn):
    run = cluster(shards=1, workers=2, flags=ADAM)
    batch = 100
    # Rank 0 evaluates every 50 clocks, on a copy of the model, and prints
    # every report; rank 1 only its last.
    workers = [python_worker(spawn, run.coordinator, r, "--epochs", 1,
                             "--batch", batch, "--report-every", 10,
                             *(("--eval-every", "50") if r == 0 else
                               ("--eval-every", "0", "--quiet")))
               for r in range(2)]
    for w in workers:
        assert w.wait(60) == 0, tail(w.log())
    (s,) = shard_stats(run.coordinator)
    by_rank = {w["rank"]: w for w in s["workers"]}
    assert sorted(by_rank) == [0, 1], s["workers"]
    share = TRAIN_ROWS // 2
    for r, w in by_rank.items():
        assert w["samples"] == share, w
        assert w["clock"] == share // batch, w
        assert w["epoch"] == 0, w
        assert math.isfinite(w["loss"]) and w["loss"] > 0, w
        assert w["device"] == "cpu", w
        assert isinstance(w["host"], str) and w["host"], w
        assert w["done"] is True, w
        assert w["nonfinite_pushes"] == 0, w
    assert 0 < by_rank[0]["test_accuracy"] <= 1, by_rank[0]
    log = workers[0].log()
    # The line of clock 50 has no accuracy yet (in the foreground it would);
    # a later one has clock 50's, naming it.
    line50 = re.search(r"^worker 0: epoch 1/1 clock 50 .*$", log, re.M)
    assert line50 and "test accuracy" not in line50.group(0), tail(log)
    assert re.search(r"test accuracy [\d.]+% \(of clock 50\)",
                     log[line50.end():]), tail(log)
    # The final line says the final accuracy, in percent.
    final = re.findall(r"test accuracy ([\d.]+)%", log)
    assert final, tail(log)
    assert abs(float(final[-1]) - 100 * by_rank[0]["test_accuracy"]) < 0.06


# --- 5. errors --------------------------------------------------------------

def test_errors_carry_code_and_message(cluster):
    run = cluster(shards=1, workers=2, flags=[
        "--reject-staleness", "0", "--optimizer", "sgd", "--lr", "0.5"])
    ones = np.ones(4, np.float32)

    def connect(rank):
        return lambda: tether.Client(run.coordinator, staleness=-1,
                                     rank=rank)

    a, b = run_concurrently(connect(0), connect(1))
    try:
        for c in (a, b):
            assert c.staleness == -1
            c.define_tensor("w", (4,), init=("constant", 1.0))
        np.testing.assert_array_equal(a.pull("w"), ones)  # read at clock 0
        for _ in range(3):
            b.clock()
        assert b.clocks == 3

        # A gradient read 3 clocks ago: refused, nothing applied.
        with pytest.raises(tether.StalePushError) as e:
            a.push("w", ones)
        err = e.value
        assert isinstance(err, tether.Error)
        assert not isinstance(err, tether.UnavailableError)
        assert err.code == "stale push"
        assert "read at clock 0 is 3 clocks stale" in err.message, err.message
        assert "rejects more than 0" in err.message, err.message
        assert str(err) == f"stale push: {err.message}"
        assert not a.closed
        np.testing.assert_array_equal(b.pull("w"), ones)
        assert sum(s["rejected_pushes"] for s in a.stats()) == 1

        # A tensor this client never defined: refused before anything is
        # sent, as a ValueError naming it (like a bad buffer).
        before = a.stats()[0]
        with pytest.raises(ValueError, match="tensor 'nope' is not defined"):
            a.pull("nope", np.empty(4, np.float32))
        with pytest.raises(ValueError, match="tensor 'nope' is not defined"):
            a.push("nope", ones)
        with pytest.raises(ValueError, match="table 'w' is not defined"):
            a.pull_rows("w", [1])  # a dense tensor is no table
        after = a.stats()[0]
        assert (after["pushes"], after["pulls"]) == (before["pushes"],
                                                     before["pulls"])
        # Defined again with another shape: the shard refuses it.
        with pytest.raises(tether.ShapeMismatchError) as e:
            a.define_tensor("w", (5,))
        assert isinstance(e.value, tether.Error)
        assert isinstance(e.value, ValueError)
        assert e.value.code == "shape mismatch"
        assert "'w'" in e.value.message and "[4]" in e.value.message, e.value

        # A non-finite gradient, not stale (read at b's clock): refused,
        # naming the tensor and the element.
        for _ in range(3):
            a.clock()
        np.testing.assert_array_equal(a.pull("w"), ones)  # read at clock 3
        bad = np.array([1.0, np.nan, 1.0, 1.0], np.float32)
        with pytest.raises(tether.NonFiniteError) as e:
            a.push("w", bad)
        err = e.value
        assert isinstance(err, tether.Error)
        assert isinstance(err, ArithmeticError)
        assert err.code == "non-finite"
        assert "tensor 'w'" in err.message, err.message
        assert "NaN at element 1" in err.message, err.message
        with pytest.raises(tether.NonFiniteError, match="Inf"):
            b.push("w", np.array([np.inf, 0, 0, 0], np.float32))

        # The shard keeps serving: nothing refused was applied, a good push
        # is (SGD, lr 0.5), and the refusals are counted.
        np.testing.assert_array_equal(b.pull("w"), ones)
        a.push("w", ones)
        np.testing.assert_array_equal(b.pull("w"), ones - np.float32(0.5))
        a.clock()
        b.clock()
        (s,) = a.stats()
        assert s["rejected_pushes"] == 1, s
        assert {w["rank"]: w["nonfinite_pushes"] for w in s["workers"]} == {
            0: 1, 1: 1}, s["workers"]
        assert not a.closed and not b.closed
    finally:
        a.close()
        b.close()


# --- 6. the command that reproduces the run ---------------------------------

def test_python_workers_say_how_they_were_started(cluster, spawn):
    """The dashboard's config lists each worker's command line: a
    `python3 -m tether.worker` process's own (with its --slowdown), and
    tether.Client's default, this process's command_line()."""
    run = cluster(shards=1, workers=2, flags=[
        "--http", "127.0.0.1:0", "--dashboard-interval-ms", "100"] + ADAM)
    line = run.shards[0].wait_for_line("dashboard at http://", 10)
    dashboard = re.search(r"dashboard at (http://[^/\s]+)/", line).group(1)
    worker = python_worker(spawn, run.coordinator, 0, "--epochs", 1,
                           "--slowdown", 3, "--eval-every", 0, "--quiet")
    with tether.Client(run.coordinator, rank=1, join_timeout=60) as me:
        assert me.rank == 1
        deadline = time.monotonic() + 30
        while True:
            status, config = http("GET", f"{dashboard}/api/config")
            assert status == 200, config
            commands = {p["process"]: p["command"] for p in config["commands"]}
            manifest = config.get("manifest") or {}
            known = [w for w in manifest.get("workers", []) if w]
            if (commands.get("worker 0") and commands.get("worker 1") and
                    len(known) == 2) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert list(commands) == ["shard 0", "worker 0", "worker 1"], config
    # Exactly the argv the worker was started with, shell-quoted.
    started = shlex.split(commands["worker 0"])
    assert started == worker.argv, commands["worker 0"]
    assert started[1:3] == ["-m", "tether.worker"]
    assert "--slowdown 3" in commands["worker 0"]
    assert commands["worker 1"] == tether.command_line(), commands["worker 1"]
    assert "--slowdown" not in commands["worker 1"]
    lines = config["command"].splitlines()
    assert lines == [commands["shard 0"] + " &", commands["worker 0"] + " &",
                     commands["worker 1"] + " &", "wait"], config["command"]
    # Arguments given instead of sys.argv's, quoted for a shell.
    assert tether.command_line(["--a", "b c"]).endswith(" --a 'b c'")
    # The run manifest: the module worker says what decides its results,
    # its model file and data files by SHA-256; a bare Client says nothing
    # but its command.
    w0, w1 = manifest["workers"]
    assert w0["program"] == "python -m tether.worker", w0
    assert w0["argv"] == worker.argv and w0["command"] == commands["worker 0"]
    assert w0["settings"]["slowdown"] == 3.0 and w0["settings"]["epochs"] == 1
    model_file = worker.argv[worker.argv.index("--model") + 1].rpartition(
        ":")[0]
    with open(model_file, "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    assert w0["settings"]["model_file"]["sha256"] == want, w0["settings"]
    assert [f["path"].rsplit("/", 1)[-1] for f in w0["data_files"]] == [
        "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    assert all(len(f["sha256"]) == 64 for f in w0["data_files"])
    version, commit = tether._tether.build_info()
    assert w0["version"] == version and w0["commit"] == commit
    assert manifest["tether"] == {"version": version, "commit": commit}
    assert w1 == {"rank": 1, "command": commands["worker 1"]}, w1


def test_overlapping_python_workers_push_no_staler_than_the_bound(cluster,
                                                                   spawn):
    """python3 -m tether.worker --overlap-steps: three workers at s = 1,
    one slowed 4x: every push of the run is at most s + 1 clocks stale (a
    prefetch is read at the next clock), the fast workers did run ahead,
    and the run still learns."""
    s = 1
    run = cluster(shards=2, workers=3, flags=ADAM + ["--max-staleness", s])
    workers = [python_worker(spawn, run.coordinator, r, "--epochs", 1,
                             "--batch", 100, "--staleness", s,
                             "--overlap-steps", "--eval-every", "0",
                             *(["--slowdown", 4] if r == 2 else []))
               for r in range(3)]
    for w in workers:
        assert w.wait(120) == 0, tail(w.log())
    pushes = stale = beyond = 0
    for shard in shard_stats(run.coordinator):
        for age, count in enumerate(shard["staleness_histogram"]):
            pushes += count
            stale += count if age >= 1 else 0
            beyond += count if age > s + 1 else 0
    # 600 batches of 2 tensors, each on 1 or 2 shards.
    assert pushes >= 600 * 2, pushes
    assert beyond == 0, f"{beyond} pushes staler than {s + 1}"
    assert stale > 0, "the fast workers never ran ahead"
    m = re.search(r"test accuracy ([\d.]+)%", workers[0].log())
    assert m, tail(workers[0].log())
    assert float(m.group(1)) > 70, tail(workers[0].log())
