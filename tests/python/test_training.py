"""Whole runs: a C++ and a NumPy worker training one model together, and
`python3 -m tether.worker` surviving a shard killed and restarted."""

import re
import signal
import time

from tether_cluster import TESTS, WORKER_BIN, shard_stats, tail

ADAM = ["--optimizer", "adam", "--lr", "0.001", "--block-size", "4096"]


def test_python_and_cpp_worker_same_run(cluster, spawn):
    run = cluster(shards=2, workers=2, flags=ADAM)
    common = ["--coordinator", run.coordinator]
    cpp = spawn([WORKER_BIN, *common, "--rank", "0", "--model", "softmax",
                 "--data", "fashion-mnist", "--epochs", "1", "--batch", "64",
                 "--staleness", "2", "--eval-every", "0", "--quiet"],
                "cpp-worker")
    numpy_worker = spawn.module(
        [str(TESTS / "numpy_softmax_worker.py"), run.coordinator, "1", "2",
         "1", "64"], "numpy-worker")
    assert cpp.wait(120) == 0, tail(cpp.log())
    assert numpy_worker.wait(120) == 0, tail(numpy_worker.log())

    # Each trained its half of the epoch, one clock per batch of 64.
    clocks = -(-30000 // 64)
    assert f"numpy worker 1: {clocks} clocks" in numpy_worker.log()
    for s in shard_stats(run.coordinator):
        assert sorted((w["rank"], w["clock"]) for w in s["workers"]) == [
            (0, clocks), (1, clocks)], s["workers"]

    evaluate = spawn([WORKER_BIN, *common, "--model", "softmax",
                      "--evaluate-only", "--test-data", "fashion-mnist"],
                     "evaluate")
    assert evaluate.wait(60) == 0, tail(evaluate.log())
    m = re.search(r"test accuracy (0\.\d+)", evaluate.log())
    assert m, evaluate.log()
    assert float(m.group(1)) > 0.75, evaluate.log()


def test_shard_killed_and_restarted(cluster, spawn):
    run = cluster(shards=2, workers=2, data_dir=True,
                  flags=ADAM + ["--max-staleness", "2",
                                "--checkpoint-every", "40"])
    workers = [
        spawn.module(["-m", "tether.worker", "--coordinator", run.coordinator,
                      "--model", f"{TESTS / 'linear_model.py'}:Net",
                      "--input-shape", "784", "--staleness", "2",
                      "--epochs", "4", "--batch", "100", "--rank", str(r),
                      "--threads", "1", "--quiet"], f"worker{r}")
        for r in range(2)]
    # A round may be skipped while the one before is written: any will do.
    line = run.shards[0].wait_for_line(
        re.compile(r"checkpoint round \d+ complete"), 90)
    round_done = int(re.search(r"round (\d+)", line).group(1))
    for w in workers:
        assert w.running(), tail(w.log())

    # Shard 1 dies; it comes back on the same address with --resume.
    run.shards[1].signal(signal.SIGKILL)
    assert run.shards[1].wait(5) == -signal.SIGKILL
    time.sleep(0.5)
    again = run.restart(1, ["--resume", "latest"])
    line = again.wait_for_line("loaded checkpoint round", 15)
    assert int(re.search(r"round (\d+)", line).group(1)) >= round_done, line

    for r, w in enumerate(workers):
        assert w.wait(150) == 0, tail(w.log())
        log = w.log()
        repeated = re.search(rf"worker {r}: .*; the step is repeated once "
                             "the shard is back", log)
        assert repeated, tail(log)
        # (The client reconnects on its I/O threads: its line may come first.)
        assert "reconnected to shard 1" in log, tail(log)
    # Rank 0's final line: "... test accuracy 81.2% ... (done in ...)".
    m = re.search(r"test accuracy ([\d.]+)%.*done in", workers[0].log())
    assert m, tail(workers[0].log())
    assert float(m.group(1)) > 70, tail(workers[0].log())
    # The restarted shard served the rest of the run: 4 epochs of 300
    # batches, one clock each, and both shards agree on every clock. (A
    # clock() that failed when the shard died still counts, so a worker whose
    # repeated step included one ends a clock ahead: worker/client.cc.)
    stats = shard_stats(run.coordinator)
    clocks = [{w["rank"]: w["clock"] for w in s["workers"]} for s in stats]
    assert clocks[0] == clocks[1], clocks
    assert all(1200 <= c <= 1201 for c in clocks[1].values()), clocks
