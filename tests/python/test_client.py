"""tether.Client against real shards: exact values, the staleness bound,
bad buffers refused before anything is sent, Ctrl-C in a held pull,
assigned values."""

import contextlib
import pathlib
import re
import signal
import subprocess
import time

import numpy as np
import pytest
import torch

import tether
from tether_cluster import run_concurrently, wait_for_held_pulls

LR = np.float32(0.5)  # a power of two: lr * g is exact, FMA or not
SGD = ["--optimizer", "sgd", "--lr", "0.5"]


def sgd(w, g):
    """The shards' SGD step in float32."""
    return (w - LR * g).astype(np.float32)


def test_values_exact(cluster):
    # Blocks of 4 floats: a (3, 5) tensor is 4 blocks over both shards.
    run = cluster(shards=2, workers=1, flags=["--block-size", "4"] + SGD)
    rng = np.random.default_rng(7)
    with tether.Client(run.coordinator) as c:
        assert (c.rank, c.num_workers, c.num_shards) == (0, 1, 2)
        initial = rng.standard_normal((3, 5)).astype(np.float32)
        c.define_tensor("w", (3, 5), init=initial)
        blocks = [s["dense_blocks"] for s in c.stats()]
        assert sum(blocks) == 4 and min(blocks) > 0, blocks

        np.testing.assert_array_equal(c.pull("w"), initial)
        grad = rng.standard_normal((3, 5)).astype(np.float32)
        c.push("w", grad)
        c.clock()
        expected = sgd(initial, grad)
        got = c.pull("w")
        assert got.dtype == np.float32 and got.shape == (3, 5)
        np.testing.assert_array_equal(got, expected)

        # A preallocated array is filled and returned, not copied.
        buf = np.full((3, 5), -1.0, np.float32)
        assert c.pull("w", buf) is buf
        np.testing.assert_array_equal(buf, expected)
        f = c.pull_async("w", np.empty(15, np.float32))
        assert f.result(timeout=10) is None

        # Torch CPU tensors as `out` and `grad`: their own memory is used.
        out = torch.full((3, 5), -1.0)
        pointer = out.data_ptr()
        assert c.pull("w", out) is out
        assert out.data_ptr() == pointer
        np.testing.assert_array_equal(out.numpy(), expected)
        tgrad = torch.from_numpy(
            rng.standard_normal((3, 5)).astype(np.float32))
        c.push("w", tgrad)
        c.clock()
        expected = sgd(expected, tgrad.numpy())
        c.pull("w", out)
        np.testing.assert_array_equal(out.numpy(), expected)

        # Initializers the shards run themselves.
        c.define_tensor("k", 6, init=("constant", 0.25))
        np.testing.assert_array_equal(c.pull("k"), np.full(6, 0.25,
                                                            np.float32))

        # A table: rows created on first touch; a repeated key is applied
        # once per occurrence, in order.
        c.define_table("emb", 3)
        big = 2**63 + 5  # keys are uint64
        keys = np.array([7, 2, 7, big], np.uint64)
        grads = rng.standard_normal((4, 3)).astype(np.float32)
        zero = np.zeros(3, np.float32)
        c.push_rows("emb", keys, grads)
        c.clock()  # BSP: pushes apply once every worker ended the clock
        rows = {7: sgd(sgd(zero, grads[0]), grads[2]),
                2: sgd(zero, grads[1]), big: sgd(zero, grads[3]), 5: zero}
        ask = [2, 7, big, 5, 7]
        got = c.pull_rows("emb", np.array(ask, np.uint64))
        assert got.shape == (5, 3) and got.dtype == np.float32
        np.testing.assert_array_equal(got, np.stack([rows[k] for k in ask]))
        # int64 keys and a torch output work alike.
        out_rows = torch.empty(2, 3)
        assert c.pull_rows("emb", np.array([2, 7]), out_rows) is out_rows
        np.testing.assert_array_equal(out_rows.numpy(),
                                      np.stack([rows[2], rows[7]]))
        assert sum(s["sparse_rows"] for s in c.stats()) == 4


def worker_clock(stats, rank):
    """`rank`'s clock as every shard has it (the smallest)."""
    return min(w["clock"] for s in stats for w in s["workers"]
               if w["rank"] == rank)


def test_bound_holds(cluster):
    run = cluster(shards=2, workers=2, flags=["--block-size", "4"])
    slow_period = 0.8  # the slow worker clocks this often
    slow_clocks = 6
    records = []  # (fast clock, slow clock before, seconds, slow clock after)

    def fast():
        with tether.Client(run.coordinator, staleness=1, rank=0) as c:
            c.define_tensor("w", (2, 4))
            out = np.empty((2, 4), np.float32)

            def timed_pull():
                before = worker_clock(c.stats(), 1)
                start = time.monotonic()
                c.pull("w", out)
                took = time.monotonic() - start
                records.append((c.clocks, before, took,
                                worker_clock(c.stats(), 1)))

            for _ in range(6):
                timed_pull()
                c.clock()
            # Once the slow one is one clock behind, the pull is not held.
            deadline = time.monotonic() + 10
            while worker_clock(c.stats(), 1) < c.clocks - 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            timed_pull()

    def slow():
        with tether.Client(run.coordinator, staleness=1, rank=1) as c:
            for _ in range(slow_clocks):
                time.sleep(slow_period)
                c.clock()

    run_concurrently(fast, slow, timeout=60)
    print("(fast clock, slow clock before, seconds, slow clock after):",
          *records, sep="\n")
    held = [r for r in records if r[0] - r[1] > 1]
    free = [r for r in records if r[0] - r[1] <= 1]
    # Ahead by 0 and 1 at clocks 0 and 1, by 2 from clock 2 to 5 (each held
    # pull releases when the slow one clocks), by 1 again at clock 6.
    assert [r[0] for r in held] == [2, 3, 4, 5], records
    assert [r[0] for r in free] == [0, 1, 6], records
    for clock, before, took, after in held:
        # Waited for the slow worker's next clock, and no further.
        assert took > slow_period / 2, records
        assert after == clock - 1, records
    for clock, before, took, after in free:
        assert took < slow_period / 2, records
        assert after == before, records


def test_bad_input_value_error(cluster):
    run = cluster(shards=2, workers=1, flags=["--block-size", "4"] + SGD)
    values = np.arange(15, dtype=np.float32).reshape(3, 5)
    with tether.Client(run.coordinator) as c:
        c.define_tensor("w", (3, 5), init=values)
        c.define_table("emb", 2)
        c.pull_rows("emb", [1, 2])
        before = c.stats()

        bad = {
            "float64": np.zeros((3, 5)),
            "size": np.zeros((4, 4), np.float32),
            "transposed": np.zeros((5, 3), np.float32).T,
            "not a buffer": [0.0] * 15,
            "torch float64": torch.zeros(3, 5, dtype=torch.float64),
            "torch transposed": torch.zeros(5, 3).t(),
        }
        for what, grad in bad.items():
            for call in (c.push, c.pull, c.provide):
                with pytest.raises(ValueError) as e:
                    call("w", grad)
                message = str(e.value)
                assert "'w'" in message, (what, message)
                assert "(3, 5)" in message, (what, message)
                assert "float32" in message, (what, message)
            with pytest.raises(ValueError, match="'w'"):
                c.push_async("w", grad)
        with pytest.raises(ValueError, match="dtype is 'd'"):
            c.push("w", bad["float64"])
        with pytest.raises(ValueError, match="not C-contiguous"):
            c.push("w", bad["transposed"])
        with pytest.raises(ValueError, match="16 floats"):
            c.push("w", bad["size"])
        with pytest.raises(ValueError, match="got list"):
            c.push("w", bad["not a buffer"])
        read_only = np.zeros((3, 5), np.float32)
        read_only.flags.writeable = False
        with pytest.raises(ValueError, match="pull 'w'.*not writable"):
            c.pull("w", read_only)
        with pytest.raises(ValueError, match="'nope' is not defined"):
            c.push("nope", np.zeros(1, np.float32))

        # Rows: keys must be integers, rows (keys, dim) float32.
        with pytest.raises(ValueError, match="integers.*float64"):
            c.push_rows("emb", np.array([1.0, 2.0]),
                        np.zeros((2, 2), np.float32))
        with pytest.raises(ValueError, match="'emb'.*1-D"):
            c.push_rows("emb", np.array([[1, 2]]),
                        np.zeros((2, 2), np.float32))
        with pytest.raises(ValueError,
                           match=r"push_rows 'emb'.*float32.*\(2, 2\)"):
            c.push_rows("emb", [1, 2], np.zeros((2, 3), np.float32))
        with pytest.raises(ValueError,
                           match=r"pull_rows 'emb'.*float32.*\(2, 2\)"):
            c.pull_rows("emb", [1, 2], np.zeros((2, 2), np.float64))

        # Nothing was sent: no push or pull counted, the values unchanged.
        after = c.stats()
        for b, a in zip(before, after):
            assert (a["pushes"], a["pulls"], a["sparse_rows"]) == (
                b["pushes"], b["pulls"], b["sparse_rows"])
        assert not c.closed
        np.testing.assert_array_equal(c.pull("w"), values)
        np.testing.assert_array_equal(c.pull_rows("emb", [1, 2]),
                                      np.zeros((2, 2), np.float32))

        # The run goes on, for this client and for another one.
        c.push("w", np.ones((3, 5), np.float32))
        c.clock()
        with tether.Client(run.coordinator, observer=True) as o:
            assert o.rank == -1
            o.define_tensor("w", (3, 5), init="provided")
            np.testing.assert_array_equal(o.pull("w"), values - LR)
            assert [s["pushes"] for s in o.stats()] == [
                b["pushes"] + 1 for b in before]


HELD_PULL = r"""
import signal, sys, time
import numpy as np
import tether

signal.signal(signal.SIGINT, signal.default_int_handler)
c = tether.Client(sys.argv[1], staleness=0, rank=0)
c.define_tensor("w", (4,))
out = np.empty(4, np.float32)
c.pull("w", out)
c.clock()
print("PULLING", flush=True)
try:
    c.pull("w", out)  # held: rank 1 never clocks
    print("RETURNED", flush=True)
except KeyboardInterrupt:
    print(f"INTERRUPTED at {time.monotonic():.6f}", flush=True)
print(f"CLOSED {c.closed}", flush=True)
try:
    c.pull("w", out)
    print("PULLED AFTER CLOSE", flush=True)
except tether.UnavailableError as e:
    print(f"UNAVAILABLE {e}", flush=True)
"""

def test_ctrl_c_in_held_pull(cluster, spawn):
    run = cluster(shards=1, workers=2)
    held = spawn.python(HELD_PULL, "held", run.coordinator)
    # This process is the other worker: it joins and does not clock until
    # the held one was interrupted.
    with tether.Client(run.coordinator, staleness=0, rank=1) as other:
        held.wait_for_line("PULLING", 30)
        wait_for_held_pulls(other, 1)
        time.sleep(0.3)
        assert "RETURNED" not in held.log()

        sent = time.monotonic()
        held.signal(signal.SIGINT)
        line = held.wait_for_line("INTERRUPTED at", 5)
        interrupted = float(re.search(r"at (\S+)", line).group(1))
        assert interrupted - sent < 1.0, interrupted - sent
        assert held.wait(10) == 0
        log = held.log()
        assert "CLOSED True" in log, log
        assert "UNAVAILABLE unavailable: the client is closed" in log, log
        # Closed without leave(): shard 0 counts it gone, maybe back later.
        run.shards[0].wait_for_line("worker 0 disconnected", 10)

        # The shard still serves: this worker's clock releases the pull
        # the interrupted one left behind, and it goes on.
        other.define_tensor("w", (4,))
        np.testing.assert_array_equal(other.pull("w"), np.zeros(4,
                                                                 np.float32))
        other.push("w", np.ones(4, np.float32))
        other.clock()
        assert other.stats()[0]["waiting_pulls"] == 0
        with tether.Client(run.coordinator, observer=True) as o:
            o.define_tensor("w", (4,))
            np.testing.assert_array_equal(o.pull("w"),
                                          np.full(4, -0.01, np.float32))


def test_checkpoint_now_names_its_round(cluster):
    # With --data-dir: a round is written now and its number returned.
    run = cluster(shards=2, workers=1, data_dir=True)
    with tether.Client(run.coordinator) as c:
        c.define_tensor("w", (8,), init=("constant", 1.5))
        c.push("w", np.ones(8, np.float32))
        c.clock()
        round_ = c.checkpoint_now()
        assert isinstance(round_, int) and round_ >= 0, round_
        run.shards[0].wait_for_line(f"checkpoint round {round_} complete", 20)


def test_checkpoint_now_without_data_dir_says_why(cluster):
    # UnavailableError naming the missing flag; the client still works.
    bare = cluster(shards=1, workers=1)
    with tether.Client(bare.coordinator) as c:
        c.define_tensor("w", (4,))
        with pytest.raises(tether.UnavailableError) as e:
            c.checkpoint_now()
        assert isinstance(e.value, tether.Error)
        assert "data-dir" in e.value.message, e.value.message
        np.testing.assert_array_equal(c.pull("w"), np.zeros(4, np.float32))


def test_tls_client_pushes_and_pulls_exactly(cluster, tmp_path):
    # Every shard speaks TLS (tests/support/make_certs.sh): the Python
    # client with the run's certificate works as over plain TCP, and one
    # without it is refused with the reason.
    make_certs = pathlib.Path(__file__).parents[1] / "support" / "make_certs.sh"
    certs = tmp_path / "certs"
    subprocess.run(["bash", str(make_certs), str(certs)], check=True)
    tls = {"tls_cert": str(certs / "node.pem"),
           "tls_key": str(certs / "node.key"), "tls_ca": str(certs / "ca.pem")}
    flags = ["--tls-cert", tls["tls_cert"], "--tls-key", tls["tls_key"],
             "--tls-ca", tls["tls_ca"]]
    run = cluster(shards=2, workers=1, flags=["--block-size", "4"] + SGD,
                  shard_flags=flags)
    with tether.Client(run.coordinator, **tls) as c:
        w = np.arange(12, dtype=np.float32).reshape(3, 4)
        c.define_tensor("w", (3, 4), init=w)
        g = np.ones((3, 4), dtype=np.float32)
        c.push("w", g)
        c.clock()
        np.testing.assert_array_equal(c.pull("w"), sgd(w, g))
    with pytest.raises(tether.Error, match="TLS handshake"):
        tether.Client(run.coordinator, observer=True,
                      tls_cert=str(certs / "other.pem"),
                      tls_key=str(certs / "other.key"),
                      tls_ca=str(certs / "other-ca.pem"))


def bf16(x):
    """float32 -> bfloat16 -> float32, rounded to nearest even (torch's)."""
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(
        torch.bfloat16).to(torch.float32).numpy()


@contextlib.contextmanager
def narrow_and_exact(run, wire_dtype):
    """Two observers of `run`: one with `wire_dtype` on the wire, one f32."""
    with tether.Client(run.coordinator, observer=True,
                       wire_dtype=wire_dtype) as narrow, \
            tether.Client(run.coordinator, observer=True) as exact:
        yield narrow, exact


def test_assign_replaces_values_exactly_without_the_optimizer(cluster):
    """Assigned values replace the shards' exactly on every shard (f32
    whatever the client's wire dtype), before or after a provider; the
    optimizer's next step starts from them; NaN is refused, changing
    nothing."""
    run = cluster(shards=2, workers=0, flags=["--block-size", "4"] + SGD)
    rng = np.random.default_rng(5)
    with narrow_and_exact(run, "int8") as (narrow, exact):
        for c in (narrow, exact):
            c.define_tensor("s", (3, 5), "provided")
        first = rng.standard_normal((3, 5)).astype(np.float32)
        narrow.assign("s", first)  # before any provider
        np.testing.assert_array_equal(exact.pull("s"), first)
        exact.provide("s", np.zeros((3, 5), np.float32))  # values kept
        np.testing.assert_array_equal(exact.pull("s"), first)
        grad = rng.standard_normal((3, 5)).astype(np.float32)
        exact.push("s", grad)
        np.testing.assert_array_equal(exact.pull("s"), sgd(first, grad))
        second = rng.standard_normal((3, 5)).astype(np.float32)
        exact.assign("s", second)
        np.testing.assert_array_equal(exact.pull("s"), second)
        bad = second.copy()
        bad[2, 1] = np.nan
        with pytest.raises(tether.NonFiniteError, match="assign to tensor 's'"):
            exact.assign("s", bad)
        np.testing.assert_array_equal(exact.pull("s"), second)
        with pytest.raises(ValueError, match="assign 's'"):
            exact.assign("s", np.zeros(4, np.float32))


def test_wire_dtype_bf16_rounds_once_and_shards_keep_f32(cluster):
    """A bf16 client's gradients are applied in f32 after one rounding (as
    torch rounds to bfloat16), and its pulls are the f32 weights rounded."""
    run = cluster(shards=2, workers=0, flags=["--block-size", "4"] + SGD)
    rng = np.random.default_rng(3)
    with narrow_and_exact(run, "bf16") as (half, exact):
        for c in (half, exact):
            c.define_tensor("w", (3, 5))
            c.define_table("emb", 2)
        grad = rng.standard_normal((3, 5)).astype(np.float32)
        half.push("w", grad)
        weights = exact.pull("w")
        np.testing.assert_array_equal(weights, sgd(np.zeros((3, 5)), bf16(grad)))
        assert not np.array_equal(weights, sgd(np.zeros((3, 5)), grad))
        np.testing.assert_array_equal(half.pull("w"), bf16(weights))
        keys = np.array([4, 9], np.uint64)
        rows = rng.standard_normal((2, 2)).astype(np.float32)
        half.push_rows("emb", keys, rows)
        got = exact.pull_rows("emb", keys)
        np.testing.assert_array_equal(got, sgd(np.zeros((2, 2)), bf16(rows)))
        np.testing.assert_array_equal(half.pull_rows("emb", keys), bf16(got))
    with pytest.raises(ValueError,
                       match="wire_dtype: f32, bf16 or int8, not 'fp8'"):
        tether.Client(run.coordinator, observer=True, wire_dtype="fp8")


def test_wire_dtype_int8_is_within_a_step_and_shards_keep_f32(cluster):
    """An int8 client's gradients land within one step of themselves (its
    largest magnitude / 127), and its pulls are the f32 weights rounded to
    the nearest step of their own grid (one group: 64 values)."""
    run = cluster(shards=1, workers=0, flags=["--block-size", "64"] + SGD)
    rng = np.random.default_rng(4)
    with narrow_and_exact(run, "int8") as (narrow, exact):
        for c in (narrow, exact):
            c.define_tensor("w", (4, 16))
        grad = rng.standard_normal((4, 16)).astype(np.float32)
        narrow.push("w", grad)
        weights = exact.pull("w")
        step = np.abs(grad).max() / 127
        want = sgd(np.zeros((4, 16)), grad)
        assert np.abs(weights - want).max() <= 0.5 * step * 1.001
        assert not np.array_equal(weights, want)
        # Pulled: on the weights' own grid, the nearest step.
        pulled = narrow.pull("w")
        w_step = np.abs(weights).max() / 127
        assert np.abs(pulled - weights).max() <= 0.5 * w_step * 1.001
        steps = pulled / w_step
        np.testing.assert_allclose(steps, np.round(steps), rtol=0, atol=1e-3)
        assert np.abs(steps).max() == pytest.approx(127, abs=1e-3)
