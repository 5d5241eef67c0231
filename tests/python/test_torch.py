"""tether.torch.ParameterServer against real shards: every worker starts
from rank 0's module, a step pushes only the embedding rows it touched,
a second provider does not overwrite the shards' values, BatchNorm's
running statistics reach the shards, and Ctrl-C ends a held pull of every
parameter at once."""

import re
import signal
import time

import numpy as np
import torch

import tether
import tether.torch
from tether_cluster import run_concurrently, wait_for_held_pulls

ROWS, DIM, CLASSES = 10, 3, 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(ROWS, DIM, sparse=True)
        self.fc = torch.nn.Linear(DIM, CLASSES)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


def seeded(seed):
    torch.manual_seed(seed)
    return Net()


def values(model):
    return {n: p.detach().clone().numpy() for n, p in
            model.named_parameters()}


def assert_values(model, expected):
    got = values(model)
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def shard_values(coordinator):
    """What the shards hold, as an observer sees it."""
    with tether.Client(coordinator, observer=True) as o:
        o.define_tensor("fc.weight", (CLASSES, DIM), "provided")
        o.define_tensor("fc.bias", (CLASSES,), "provided")
        o.define_table("emb.weight", DIM, "provided")
        return {"emb.weight": o.pull_rows("emb.weight", np.arange(ROWS)),
                "fc.weight": o.pull("fc.weight"),
                "fc.bias": o.pull("fc.bias")}


def test_torch_parameter_server(cluster):
    torch.set_num_threads(1)
    run = cluster(shards=2, workers=2, flags=[
        "--block-size", "4", "--optimizer", "sgd", "--lr", "0.5"])
    models = [seeded(0), seeded(1)]
    initial = values(models[0])
    assert not np.array_equal(values(models[1])["fc.weight"],
                              initial["fc.weight"])
    clients = []

    def worker(rank):
        def connect():
            c = tether.Client(run.coordinator, staleness=1, rank=rank)
            clients.append(c)
            return c, tether.torch.ParameterServer(models[rank], c,
                                                   timeout=30)
        return connect

    try:
        (c0, ps0), (c1, ps1) = run_concurrently(worker(0), worker(1))
        # Both start from rank 0's module, which the shards now hold.
        assert_values(models[0], initial)
        # Rank 1's dense parameters are pulled at once, its embedding rows
        # when a batch uses them.
        for name in ("fc.weight", "fc.bias"):
            np.testing.assert_array_equal(
                dict(models[1].named_parameters())[name].detach().numpy(),
                initial[name])
        models[1](torch.tensor([list(range(ROWS))]))
        assert_values(models[1], initial)
        assert_values_dict(shard_values(run.coordinator), initial)

        # One step of rank 0 touching rows 1 and 3 (3 twice).
        ids = torch.tensor([[1, 3], [3, 3]])
        loss = (models[0](ids) ** 2).sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in models[0].named_parameters()}
        sparse = grads["emb.weight"].coalesce()
        touched = sparse.indices()[0].tolist()
        assert touched == [1, 3]
        ps0.step()
        assert all(p.grad is None for p in models[0].parameters())

        half = np.float32(0.5)  # the lr: exact products
        expected = {
            "fc.weight": initial["fc.weight"] - half * grads["fc.weight"]
            .numpy(),
            "fc.bias": initial["fc.bias"] - half * grads["fc.bias"].numpy(),
            "emb.weight": initial["emb.weight"].copy(),
        }
        for row, g in zip(touched, sparse.values().numpy()):
            expected["emb.weight"][row] -= half * g
        on_shards = shard_values(run.coordinator)
        assert_values_dict(on_shards, expected)
        untouched = [r for r in range(ROWS) if r not in touched]
        np.testing.assert_array_equal(on_shards["emb.weight"][untouched],
                                      initial["emb.weight"][untouched])
        # Rank 0 pulled the dense result in step(); rank 1 pulls it now.
        for name in ("fc.weight", "fc.bias"):
            np.testing.assert_array_equal(
                dict(models[0].named_parameters())[name].detach().numpy(),
                expected[name])
        ps1.pull()
        np.testing.assert_array_equal(models[1].fc.weight.detach().numpy(),
                                      expected["fc.weight"])

        # A second ParameterServer over the initialized tensors (a resumed
        # worker): its module's values are provided but the shards keep
        # theirs, and it starts from those.
        fresh = seeded(2)
        assert not np.array_equal(values(fresh)["fc.bias"],
                                  expected["fc.bias"])
        tether.torch.ParameterServer(fresh, c0, timeout=30)
        np.testing.assert_array_equal(fresh.fc.weight.detach().numpy(),
                                      expected["fc.weight"])
        np.testing.assert_array_equal(fresh.fc.bias.detach().numpy(),
                                      expected["fc.bias"])
        fresh(torch.tensor([[1, 5]]))
        np.testing.assert_array_equal(
            fresh.emb.weight.detach().numpy()[[1, 5]],
            expected["emb.weight"][[1, 5]])
        assert_values_dict(shard_values(run.coordinator), expected)
    finally:
        for c in clients:
            c.close()


def assert_values_dict(got, expected):
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


class BatchNormNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)
        self.register_buffer("mask", torch.ones(3), persistent=False)

    def forward(self, x):
        return self.bn(self.fc(x)) * self.mask


def test_batchnorm_statistics_reach_the_shards_and_an_observer(cluster):
    """A worker's running statistics are on the shards after every step, so
    a fresh module on an observer (an evaluation, a resumed worker) takes
    them and evaluates exactly as the worker does; buffers outside the
    state_dict and integer ones stay each module's own."""
    torch.set_num_threads(1)
    run = cluster(shards=2, workers=1, flags=[
        "--block-size", "2", "--optimizer", "sgd", "--lr", "0.5"])
    torch.manual_seed(0)
    model = BatchNormNet()
    with tether.Client(run.coordinator, staleness=0) as c:
        ps = tether.torch.ParameterServer(model, c, timeout=30)
        for i in range(3):
            model(torch.randn(8, 4) + i).sum().backward()
            ps.step()
        stats = {n: b.detach().clone() for n, b in model.named_buffers()}
        assert stats["bn.num_batches_tracked"].item() == 3
        assert not torch.equal(stats["bn.running_mean"], torch.zeros(3))
        with tether.Client(run.coordinator, observer=True) as o:
            torch.manual_seed(1)
            fresh = BatchNormNet()
            fresh.mask.fill_(2.0)
            tether.torch.ParameterServer(fresh, o, timeout=30)
            for name in ("bn.running_mean", "bn.running_var"):
                torch.testing.assert_close(dict(fresh.named_buffers())[name],
                                           stats[name], rtol=0, atol=0)
            assert fresh.bn.num_batches_tracked.item() == 0
            assert torch.equal(fresh.mask, torch.full((3,), 2.0))
            fresh.mask.fill_(1.0)
            x = torch.randn(5, 4)
            model.eval()
            fresh.eval()
            with torch.no_grad():
                torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


HELD_STEP = r"""
import signal, sys, time
import torch
import tether, tether.torch

signal.signal(signal.SIGINT, signal.default_int_handler)
c = tether.Client(sys.argv[1], staleness=0, rank=0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
ps = tether.torch.ParameterServer(model, c, timeout=30)
c.clock()
print("PULLING", flush=True)
try:
    ps.pull()  # 4 tensors, held: rank 1 never clocks
    print("RETURNED", flush=True)
except KeyboardInterrupt:
    print(f"INTERRUPTED at {time.monotonic():.6f}", flush=True)
"""


def test_ctrl_c_in_held_parameter_server_pull(cluster, spawn):
    run = cluster(shards=1, workers=2)
    held = spawn.python(HELD_STEP, "held", run.coordinator)
    with tether.Client(run.coordinator, staleness=0, rank=1) as other:
        held.wait_for_line("PULLING", 30)
        wait_for_held_pulls(other, 4)
        sent = time.monotonic()
        held.signal(signal.SIGINT)
        # One Ctrl-C ends the wait for every tensor's pull.
        line = held.wait_for_line("INTERRUPTED at", 5)
        interrupted = float(re.search(r"at (\S+)", line).group(1))
        assert interrupted - sent < 1.0, interrupted - sent
        assert held.wait(10) == 0
        assert "RETURNED" not in held.log()


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(5, 4)
        self.fc2 = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_push_in_backward_sends_each_gradient_as_backward_has_it(cluster):
    """push_in_backward=True: every dense gradient leaves from backward
    itself (last layer first), step() sends only the clock and pulls behind
    it, and the shards end with exactly what a plain step gives; a second
    backward before step() is refused naming the way out."""
    torch.set_num_threads(1)
    run = cluster(shards=2, workers=1, flags=[
        "--block-size", "4", "--optimizer", "sgd", "--lr", "0.5"])
    with tether.Client(run.coordinator, staleness=0, rank=0) as c:
        torch.manual_seed(3)
        model = Mlp()
        initial = values(model)
        ps = tether.torch.ParameterServer(model, c, timeout=30,
                                          push_in_backward=True)
        x = torch.randn(8, 5)
        y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads = {n: p.grad.clone().numpy()
                 for n, p in model.named_parameters()}
        # Sent during backward, last layer first.
        sent = list(ps._sent)
        assert set(sent[:2]) == {"fc2.weight", "fc2.bias"}, sent
        assert set(sent) == set(initial), sent
        ps.step()
        assert c.clocks == 1
        half = np.float32(0.5)
        expected = {n: initial[n] - half * grads[n] for n in initial}
        # step() pulled the result behind its clock.
        assert_values(model, expected)
        with tether.Client(run.coordinator, observer=True) as o:
            for name, v in expected.items():
                o.define_tensor(name, v.shape, "provided")
                np.testing.assert_array_equal(o.pull(name), v, err_msg=name)

        # Gradient accumulation is refused before anything is sent twice.
        torch.nn.functional.cross_entropy(model(x), y).backward()
        try:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        except RuntimeError as e:
            assert "push_in_backward=False" in str(e), e
        else:
            raise AssertionError("a second backward() was not refused")
        ps.close()


def test_overlap_steps_compute_on_prefetched_weights_within_the_bound(
        cluster):
    """overlap_steps=True: prefetch() reads the next step's values before
    this step's pushes, so step() returns without waiting for them and the
    next step computes without its update (a push at most s + 1 stale),
    keeping the same Parameter objects; the shards still apply every
    gradient exactly; a refused push is raised by the step() after it, and
    under bound 0 or in a recorded run prefetch() does nothing and step()
    pulls behind the clock as without overlap."""
    torch.set_num_threads(1)
    run = cluster(shards=2, workers=1, flags=[
        "--block-size", "4", "--optimizer", "sgd", "--lr", "0.5",
        "--max-staleness", "1"])
    x = torch.randn(8, 5)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    half = np.float32(0.5)

    def backward(model, ps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        ps.prefetch()
        loss.backward()
        return {n: p.grad.clone().numpy() for n, p in model.named_parameters()}

    with tether.Client(run.coordinator, staleness=1, rank=0) as c:
        torch.manual_seed(4)
        model = Mlp()
        params = dict(model.named_parameters())
        initial = values(model)
        ps = tether.torch.ParameterServer(model, c, timeout=30,
                                          overlap_steps=True)
        g0 = backward(model, ps)
        assert ps.prefetching
        ps.step()
        assert not ps.prefetching and c.clocks == 1
        # Read before the push: the module holds the values it started with.
        assert_values(model, initial)
        assert ps.pull_start() is None  # this clock's values are in
        g1 = backward(model, ps)  # on the initial values, one update behind
        ps.step()
        after0 = {n: initial[n] - half * g0[n] for n in initial}
        assert_values(model, after0)
        ps.flush()
        held = shard_values_of(run.coordinator, model)
        for n in initial:
            np.testing.assert_array_equal(held[n], after0[n] - half * g1[n],
                                          err_msg=n)
        assert dict(model.named_parameters()) == params  # same objects
        assert c.max_push_staleness <= 2, c.max_push_staleness

        # A refused push (not finite) is raised by the next step(), which
        # still sends its own pushes and clock and puts its values in.
        backward(model, ps)
        model.fc1.bias.grad[0] = float("nan")
        ps.step()
        clocks = c.clocks
        backward(model, ps)
        expect_non_finite_refused(ps.step, "fc1.bias")
        assert c.clocks == clocks + 1
        assert not ps.prefetching
        ps.pull()  # flushes the last step's pushes first
        assert_values(model, shard_values_of(run.coordinator, model))

    # Bound 0 or a recorded run: nothing is prefetched; step() waits as
    # without overlap.
    check_prefetch_off(cluster, x, y, overlap_steps=True)


def expect_non_finite_refused(step, name):
    """step() raises the refusal of `name`'s non-finite push."""
    try:
        step()
    except tether.NonFiniteError as e:
        assert name in e.message, e.message
    else:
        raise AssertionError("the refused push was not raised")


def check_prefetch_off(cluster, x, y, **mode):
    """Under bound 0, and at bound 1 in a recorded run (whose order of
    requests must not depend on timing), ParameterServer(..., **mode)
    prefetches nothing: step() pulls behind the clock as without `mode`,
    so the module holds the step's update."""
    for staleness, extra in ((0, []), (1, ["--record"])):
        run = cluster(shards=1, workers=1, flags=[
            "--optimizer", "sgd", "--lr", "0.5", "--max-staleness", "1",
            *extra], data_dir=bool(extra))
        with tether.Client(run.coordinator, staleness=staleness,
                           rank=0) as c:
            assert c.records == bool(extra)
            torch.manual_seed(4)
            model = Mlp()
            initial = values(model)
            ps = tether.torch.ParameterServer(model, c, timeout=30, **mode)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            ps.prefetch()
            loss.backward()
            g = {n: p.grad.clone().numpy()
                 for n, p in model.named_parameters()}
            assert not ps.prefetching, extra
            assert not ps.overlap_steps and not ps.prefetch_with_push, extra
            ps.step()
            assert_values(model, {n: initial[n] - np.float32(0.5) * g[n]
                                  for n in initial})


def test_prefetch_with_push_takes_its_own_writes_without_a_pull(cluster):
    """prefetch_with_push=True: each parameter's next values are asked for
    right behind its gradient (from backward with push_in_backward, or by
    step()), so step() puts them in without a pull, and they hold this
    worker's own update; a parameter without a gradient, or a refused
    push, makes the next pull ask again, and the module still holds what
    the shards hold, as it does after pushes with no pull between them;
    under bound 0 or in a recorded run it is off and step() pulls as
    usual."""
    torch.set_num_threads(1)
    x = torch.randn(8, 5)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    half = np.float32(0.5)

    def backward(model):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        return {n: p.grad.clone().numpy() for n, p in model.named_parameters()}

    for in_backward in (True, False):
        run = cluster(shards=2, workers=1, flags=[
            "--block-size", "4", "--optimizer", "sgd", "--lr", "0.5",
            "--max-staleness", "1"])
        with tether.Client(run.coordinator, staleness=1, rank=0) as c:
            torch.manual_seed(4)
            model = Mlp()
            params = dict(model.named_parameters())
            ps = tether.torch.ParameterServer(
                model, c, timeout=30, push_in_backward=in_backward,
                prefetch_with_push=True)
            assert ps.prefetch_with_push
            before = values(model)
            g = backward(model)
            ps.step()
            # Its own update, put in by step() with no pull after it.
            assert ps.pull_start() is None
            assert_values(model, {n: before[n] - half * g[n] for n in g})
            assert_values(model, shard_values_of(run.coordinator, model))
            assert dict(model.named_parameters()) == params  # same objects

            # A parameter without a gradient: the next pull asks again.
            ps.close()  # with push_in_backward, backward would send them
            before = values(model)
            g = backward(model)
            model.fc2.bias.grad = None
            ps.step()
            g["fc2.bias"] = np.zeros_like(g["fc2.bias"])
            assert_values(model, {n: before[n] - half * g[n] for n in g})

            # A refused push is raised; the module still gets the values.
            backward(model)
            model.fc1.bias.grad[0] = float("nan")
            expect_non_finite_refused(ps.step, "fc1.bias")
            ps.pull()
            assert_values(model, shard_values_of(run.coordinator, model))

            # Pushes with no pull between them: each prefetch ends before
            # the next one reuses its buffer, and the pull takes the last.
            for _ in range(2):
                backward(model)
                ps.push(clock=True)
            assert ps.pull_start() is None
            assert_values(model, shard_values_of(run.coordinator, model))
            assert c.max_push_staleness <= 1, c.max_push_staleness

    # Bound 0 or a recorded run: off; step() pulls behind the clock as
    # without it.
    check_prefetch_off(cluster, x, y, prefetch_with_push=True)


def shard_values_of(coordinator, model):
    """The shards' values of every parameter of `model`, by name."""
    with tether.Client(coordinator, observer=True) as o:
        got = {}
        for name, p in model.named_parameters():
            o.define_tensor(name, tuple(p.shape), "provided")
            got[name] = o.pull(name)
        return got
