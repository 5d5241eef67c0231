"""python3 -m tether.worker: trains a user's PyTorch model file on tether.

    python3 -m tether.worker --coordinator HOST:PORT \\
        --model my_model.py:Net --data fashion-mnist --staleness 2

The model class is built (with --model-args as keyword arguments) after
torch.manual_seed(run seed), so every worker's module starts alike; rank 0
provides its values to the shards (tether.torch.ParameterServer). The
training is tether-worker's, with its robustness: a lost shard is waited for
and the step repeated; a resumed run skips the batches its round covered; a
stop request (the dashboard's Stop run) ends the run cleanly; a push refused
as too stale or non-finite costs that gradient only; a NaN loss stops the
worker (exit 1).

The model gets batches of shape (batch, *--input-shape) (default: 1,28,28
for 784-pixel images, else the row's features) and returns class logits;
the loss is cross-entropy.
"""

import argparse
import copy
import ctypes
import hashlib
import importlib.util
import json
import math
import os
import shlex
import signal
import socket
import sys
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F

import tether
import tether.torch


class Stopped(Exception):
    """The run was stopped (POST /api/stop): training ends after a step."""


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python3 -m tether.worker",
        description="Trains a PyTorch model from a file on a tether run.")

    def add_switch(flag, default, help):
        """A true/false flag; given bare, true."""
        p.add_argument(flag, nargs="?", const="true", default=default,
                       choices=("true", "false"), help=help)

    p.add_argument("--coordinator", required=True,
                   help="HOST:PORT of shard 0")
    p.add_argument("--model", required=True, metavar="FILE.py:CLASS",
                   help="the model: a torch.nn.Module subclass in a file")
    p.add_argument("--model-args", default="{}", metavar="JSON",
                   help="keyword arguments for the model class")
    p.add_argument("--data", default="fashion-mnist",
                   help="fashion-mnist, or IMAGES,LABELS (IDX files)")
    p.add_argument("--test-data", default=None,
                   help="like --data (default: Fashion-MNIST's test split "
                        "with --data fashion-mnist)")
    p.add_argument("--input-shape", default=None, metavar="C,H,W",
                   help="the shape of one example as the model takes it")
    p.add_argument("--staleness", type=int, default=0,
                   help="SSP bound: 0 BSP, -1 fully asynchronous")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rank", type=int, default=-1)
    p.add_argument("--chunk-rows", type=int, default=0,
                   help="take chunks of this many rows from the coordinator "
                        "(0: a fixed share per worker)")
    p.add_argument("--slowdown", type=float, default=1.0,
                   help="make each step this many times slower (a straggler)")
    p.add_argument("--push-in-backward", choices=("on", "off"),
                   default="off",
                   help="send each gradient from backward as soon as it is "
                   "computed (not for a worker slowed with --slowdown, whose "
                   "gradients leave after its sleep); off: all of them in "
                   "one call after backward, which measured faster here "
                   "(BENCHMARKS.md, python_client)")
    add_switch("--overlap-steps", "false",
               "with --staleness other than 0, a step computes while "
               "the last one's pushes and clock travel, on weights "
               "prefetched during its backward (pushes are then "
               "at most s + 1 clocks stale), as tether-worker's")
    add_switch("--prefetch-with-push", "false",
               "with --staleness other than 0 and without "
               "--overlap-steps: ask for each parameter's next "
               "values right behind its gradient, so they come "
               "down the link while the gradients below still go "
               "up (with --push-in-backward on), as "
               "tether-worker's; false: pull them after the clock")
    p.add_argument("--wire-dtype", choices=("f32", "bf16", "int8"),
                   default="f32",
                   help="bf16: push gradients and pull weights as bfloat16 "
                        "(half the bytes); int8: as int8 with a scale per "
                        "256 values (about a quarter); the shards keep f32")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0: torch's default)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--report-every", type=int, default=10,
                   help="report progress to the coordinator every N clocks")
    p.add_argument("--eval-every", type=int, default=200,
                   help="rank 0 evaluates every N clocks (0: at the end only)")
    add_switch("--eval-in-background", "true",
               "rank 0 evaluates a copy of the model on a thread of "
               "its own while training goes on (reported at the "
               "first report after it ends), as tether-worker's; "
               "false: training waits for each evaluation")
    p.add_argument("--auth-key-file", default=None)
    p.add_argument("--tls-cert", default=None,
                   help="this process's certificate (PEM), in a TLS run")
    p.add_argument("--tls-key", default=None, help="its private key (PEM)")
    p.add_argument("--tls-ca", default=None,
                   help="the CA that signs the run's certificates (PEM)")
    p.add_argument("--name", default=None)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--profile", action="store_true",
                   help="at the end, print where a step's time went: torch, "
                        "the wire (blocked on tether) and the rest (Python "
                        "and the binding)")
    p.add_argument("--evaluate-only", action="store_true",
                   help="pull the weights as an observer, print the test "
                        "accuracy, exit")
    a = p.parse_args(argv)
    for flag, value, low in (("--epochs", a.epochs, 1), ("--batch", a.batch, 1),
                             ("--chunk-rows", a.chunk_rows, 0),
                             ("--threads", a.threads, 0)):
        if value < low:
            p.error(f"{flag}: must be at least {low}, got {value}")
    if not a.slowdown >= 1.0:
        p.error(f"--slowdown: must be at least 1, got {a.slowdown}")
    try:
        a.model_args = json.loads(a.model_args)
    except ValueError as e:
        p.error(f"--model-args: not JSON: {e}")
    if not isinstance(a.model_args, dict):
        p.error("--model-args: expected a JSON object")
    return a


def load_model_class(spec):
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise SystemExit(f"--model: expected FILE.py:CLASS, got '{spec}'")
    if not os.path.isfile(path):
        raise SystemExit(f"--model: no such file '{path}'")
    module_spec = importlib.util.spec_from_file_location(
        os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    cls = getattr(module, name, None)
    if cls is None:
        raise SystemExit(f"--model: '{path}' has no '{name}'")
    return cls


FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


def data_files(spec, train):
    """The files a --data or --test-data value reads."""
    if not spec:
        return []
    if spec == "fashion-mnist":
        prefix = f"{FASHION_MNIST_DIR}/{'train' if train else 't10k'}"
        return [f"{prefix}-images-idx3-ubyte.gz",
                f"{prefix}-labels-idx1-ubyte.gz"]
    return spec.split(",")


def file_entry(path):
    """{"path", "sha256", "bytes"}, or {"path", "error"}."""
    try:
        digest = hashlib.sha256()
        size = 0
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
                size += len(block)
        return {"path": path, "sha256": digest.hexdigest(), "bytes": size}
    except OSError as e:
        return {"path": path, "error": str(e)}


def worker_manifest(a, argv, test_spec):
    """This worker's part of the run manifest (server/manifest.h): what
    decides what it computes, how it was started, where, with which build."""
    version, commit = tether._tether.build_info()
    model_file = a.model.rpartition(":")[0]
    files = [file_entry(p) for p in data_files(a.data, True)]
    if (test_spec and test_spec != a.data) or a.data == "fashion-mnist":
        files += [file_entry(p) for p in data_files(test_spec, False)]
    return {
        "program": "python -m tether.worker",
        "version": version,
        "commit": commit,
        "host": socket.gethostname(),
        "argv": argv,
        "settings": {
            "model": a.model, "model_args": a.model_args,
            "model_file": file_entry(model_file),
            "batch": a.batch, "epochs": a.epochs, "threads": a.threads,
            "device": a.device, "slowdown": a.slowdown,
            "chunk_rows": a.chunk_rows, "staleness": a.staleness,
            "eval_every": a.eval_every, "data": a.data,
            "test_data": test_spec or "", "wire_dtype": a.wire_dtype,
            "overlap_steps": a.overlap_steps == "true",
            "prefetch_with_push": a.prefetch_with_push == "true",
            "torch": torch.__version__,
        },
        "data_files": files,
    }


def load_data(spec, train, flag):
    if spec == "fashion-mnist":
        return tether.load_fashion_mnist(train)
    images, sep, labels = spec.partition(",")
    if not sep:
        raise SystemExit(f"{flag}: expected fashion-mnist or IMAGES,LABELS "
                         f"(two IDX files), got '{spec}'")
    return tether.load_idx(images, labels)


def input_shape(text, features):
    if text:
        try:
            shape = tuple(int(d) for d in text.split(","))
        except ValueError:
            raise SystemExit(f"--input-shape: expected C,H,W, got '{text}'")
        if math.prod(shape) != features:
            raise SystemExit(f"--input-shape {text}: {math.prod(shape)} "
                             f"values, the data has {features} per row")
        return shape
    side = math.isqrt(features)
    return (1, side, side) if side * side == features else (features,)


def evaluate(model, test, shape, device):
    """(accuracy, mean loss) of `model` on `test` (x, y, classes)."""
    x = torch.from_numpy(test[0])
    y = torch.from_numpy(test[1]).to(torch.int64)
    correct, loss_sum = 0, 0.0
    model.eval()
    with torch.no_grad():
        for first in range(0, len(y), 1000):
            out = model(x[first:first + 1000].reshape((-1,) + shape).to(
                device)).cpu()
            yb = y[first:first + 1000]
            loss_sum += float(F.cross_entropy(out, yb, reduction="sum"))
            correct += int((out.argmax(1) == yb).sum())
    model.train()
    return correct / len(y), loss_sum / len(y)


class BackgroundEvaluator:
    """Rank 0's evaluations on a copy of the model, on a thread of their
    own, while training goes on (worker/background_eval.h's, in Python).
    One at a time; the copy takes the model's state_dict (parameters and
    buffers) at each start."""

    def __init__(self, model, test, shape, device):
        self.twin = copy.deepcopy(model)
        self.test, self.shape, self.device = test, shape, device
        self.thread, self.clock, self.outcome = None, None, None

    def pending(self):
        return self.thread is not None

    def start(self, model, clock):
        assert self.thread is None, "an evaluation is still pending"
        with torch.no_grad():
            self.twin.load_state_dict(model.state_dict())
        self.clock = clock
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name="tether-eval")
        self.thread.start()

    def _run(self):
        try:
            self.outcome = evaluate(self.twin, self.test, self.shape,
                                    self.device)
        except BaseException as e:  # raised by take(), on the trainer's side
            self.outcome = e

    def take(self, wait):
        """(clock, (accuracy, loss)) of the pending evaluation once it is
        done; None while it runs (unless `wait`) or when none is pending."""
        if self.thread is None or (not wait and self.thread.is_alive()):
            return None
        self.thread.join()
        self.thread, outcome = None, self.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return self.clock, outcome


class Trainer:
    def __init__(self, a, client, model, train, test, shape, device):
        self.a, self.client, self.model = a, client, model
        self.x, self.y = torch.from_numpy(train[0]), torch.from_numpy(train[1])
        self.test = test
        self.shape, self.device = shape, device
        # Copied before tether.torch hooks into the model.
        self.evaluator = None
        if (a.eval_in_background == "true" and a.eval_every > 0 and
                test is not None and client.rank == 0):
            try:
                self.evaluator = BackgroundEvaluator(model, test, shape,
                                                     device)
            except Exception as e:  # a model that does not copy
                print(f"worker {client.rank}: evaluating in the foreground "
                      f"(the model does not copy: {e})", file=sys.stderr,
                      flush=True)
        # A slowed worker's (--slowdown) gradients leave after its sleep.
        self.ps = tether.torch.ParameterServer(
            model, client, push_in_backward=(self.a.push_in_backward == "on"
                                             and self.a.slowdown <= 1.0),
            overlap_steps=self.a.overlap_steps == "true",
            prefetch_with_push=self.a.prefetch_with_push == "true")
        self.rejected = 0
        self.samples = 0
        self.loss_sum, self.loss_count, self.last_loss = 0.0, 0, None
        self.accuracy, self.eval_clock = None, None
        self.start = self.last_report = time.monotonic()
        self.host = socket.gethostname()
        self.samples_at_report = 0
        self.wait_at_report = 0.0
        self.rate = 0.0
        self.tty = sys.stdout.isatty()
        self.steps = 0
        self.step_s = self.torch_s = self.wire_s = 0.0  # --profile

    # --- robustness (worker/training_loop.h's, in Python) ----------------
    def surviving_lost_shards(self, step, finish=False):
        c = self.client
        while True:
            if c.stop_requested and not finish:
                raise Stopped(c.stop_reason)
            lost_before = c.shard_losses
            try:
                return step()
            except tether.UnavailableError as e:
                if c.shard_losses == lost_before:
                    try:
                        c.await_shards(0)
                    except tether.UnavailableError:
                        pass  # a shard is lost: wait for it below
                    else:
                        raise  # every shard is connected: not a lost one
                print(f"worker {c.rank}: {e.message}; the step is repeated "
                      "once the shard is back", file=sys.stderr, flush=True)
                try:
                    c.await_shards(180)
                except tether.CancelledError:
                    # Stopped while waiting: a shard that is gone does not
                    # hold a leaving worker up.
                    raise Stopped(c.stop_reason) from None

    def train(self):
        rows = len(self.y)
        try:
            if self.a.chunk_rows > 0:
                self.train_chunks(rows)
            else:
                self.train_share(rows)
        except Stopped as e:
            print(f"worker {self.client.rank}: stopping at clock "
                  f"{self.client.clocks}: {e}", file=sys.stderr, flush=True)
        self.tolerating_refused(self.ps.flush)
        if self.evaluator is not None and self.evaluator.pending():
            self.report(self.a.epochs - 1, evaluate=False, final=False,
                        done=self.evaluator.take(wait=True))
        self.ps.pull()
        self.report(self.a.epochs - 1, evaluate=True, final=True)
        if self.a.profile:
            self.print_profile()

    def idle(self):
        """Nothing to train now: keep the clock moving, holding no one
        back."""
        self.client.clock()
        time.sleep(0.1)

    def train_share(self, rows):
        # Shard 0 fixes each epoch's members when it starts; a worker that
        # comes back skips what its clock covers since it began the epoch.
        c = self.client
        for epoch in range(self.a.epochs):
            while True:
                if c.stop_requested:
                    raise Stopped(c.stop_reason)
                share = self.surviving_lost_shards(
                    lambda: c.share(epoch, self.a.batch))
                if share.decided:
                    break
                self.surviving_lost_shards(self.idle)
            if share.index >= 0:  # else joined mid-epoch: sits it out
                order = tether.worker_share(rows, share.index, share.members,
                                            c.seed, epoch)
                skip = max(0, c.clocks - share.start_clock)
                for first in range(0, len(order), self.a.batch):
                    if skip > 0:
                        skip -= 1
                        continue  # covered by its clock (a resumed run)
                    c.set_share_position(epoch, share.index, share.members,
                                         first)
                    batch = order[first:first + self.a.batch]
                    self.surviving_lost_shards(lambda: self.step(batch, epoch))
                c.set_share_position()
            self.train_leftovers(rows, epoch)

    def train_leftovers(self, rows, epoch):
        # What members that left during this epoch (or before) did not train.
        c = self.client
        while True:
            part = self.surviving_lost_shards(lambda: c.take_leftover(epoch))
            if part.epoch < 0:
                return
            order = tether.worker_share(rows, part.index, part.members,
                                        c.seed, part.epoch)
            for first in range(part.first_row, len(order), self.a.batch):
                c.set_share_position(part.epoch, part.index, part.members,
                                     first)
                batch = order[first:first + self.a.batch]
                self.surviving_lost_shards(
                    lambda: self.step(batch, part.epoch))
            c.set_share_position()

    def train_chunks(self, rows):
        c = self.client
        order, order_epoch = None, -1
        while True:
            if c.stop_requested:
                raise Stopped(c.stop_reason)
            chunk = c.next_chunk(rows, self.a.chunk_rows, self.a.epochs,
                                 self.a.batch)
            if chunk.count == 0:
                if chunk.finished:
                    return
                self.surviving_lost_shards(self.idle)
                continue
            if chunk.epoch != order_epoch:
                order = tether.worker_share(rows, 0, 1, c.seed, chunk.epoch)
                order_epoch = chunk.epoch
            part = order[chunk.first:chunk.first + chunk.count]
            for first in range(0, len(part), self.a.batch):
                batch = part[first:first + self.a.batch]
                # The chunk in hand is finished even when stopping, so
                # that every row is trained once.
                self.surviving_lost_shards(
                    lambda: self.step(batch, chunk.epoch), finish=True)

    # --- one step ----------------------------------------------------------
    def step(self, batch, epoch):
        c = self.client
        step_start, wire_start = time.perf_counter(), tether.wait_seconds()
        pulling = self.ps.pull_start()  # the batch is cut meanwhile
        batch_start = time.perf_counter()
        index = torch.from_numpy(batch.astype(np.int64))
        x = self.x[index].reshape((len(batch),) + self.shape).to(self.device)
        y = self.y[index].to(torch.int64).to(self.device)
        torch_s = time.perf_counter() - batch_start
        self.ps.pull_finish(pulling)
        compute_start = time.monotonic()
        torch_start = time.perf_counter()
        loss = F.cross_entropy(self.model(x), y)
        value = float(loss)
        # Before backward, which may already send gradients.
        if not math.isfinite(value):
            raise SystemExit(
                f"worker {c.rank}: the training loss is {value} at clock "
                f"{c.clocks} (epoch {epoch}): the model diverged, so this "
                "worker stops. Lower --lr, or look for extreme values in "
                "the data")
        # --overlap-steps: the next step's weights travel during backward
        # (a slowed worker's after its sleep: read before it, they would
        # miss what the others pushed meanwhile).
        if self.a.slowdown <= 1.0:
            self.ps.prefetch()
        loss.backward()
        torch_s += time.perf_counter() - torch_start
        if self.a.slowdown > 1.0:
            time.sleep((time.monotonic() - compute_start) *
                       (self.a.slowdown - 1.0))
            self.ps.prefetch()
        # Pushes and clock; overlapped (after a prefetch), not awaited, and
        # a refused push is raised by the next step.
        self.tolerating_refused(
            self.ps.step if self.ps.prefetching else
            lambda: self.ps.push(clock=True))
        self.samples += len(batch)
        self.loss_sum += value
        self.loss_count += 1
        self.last_loss = value
        eval_due = (self.a.eval_every > 0 and c.rank == 0 and
                    c.clocks % self.a.eval_every == 0)
        done = (self.evaluator.take(wait=False)
                if self.evaluator is not None else None)
        if eval_due and self.evaluator is not None:
            # One at a time: the last one, if it still runs, is waited for.
            if self.evaluator.pending():
                done = self.evaluator.take(wait=True)
            self.evaluator.start(self.model, c.clocks)
            eval_due = False
        if (done is not None or eval_due or
                c.clocks % max(1, self.a.report_every) == 0):
            self.report(epoch, evaluate=eval_due, final=False, done=done)
        self.steps += 1
        self.step_s += time.perf_counter() - step_start
        self.torch_s += torch_s
        self.wire_s += tether.wait_seconds() - wire_start

    def tolerating_refused(self, call):
        """call(); a refused push is counted and dropped: its gradient is
        lost, the clock went ahead."""
        c = self.client
        try:
            call()
        except (tether.StalePushError, tether.NonFiniteError) as e:
            if self.rejected % 100 == 0:
                print(f"worker {c.rank}: push at clock {c.clocks} refused: "
                      f"{e.message} (dropped; {self.rejected + 1} so far)",
                      file=sys.stderr, flush=True)
            self.rejected += 1

    def print_profile(self):
        n = max(1, self.steps)
        rest = self.step_s - self.torch_s - self.wire_s
        print(f"profile: {self.steps} steps, per step {1e3 * self.step_s / n:.3f}"
              f" ms: torch {1e3 * self.torch_s / n:.3f} ms, wire "
              f"{1e3 * self.wire_s / n:.3f} ms, python+binding "
              f"{1e3 * rest / n:.3f} ms "
              f"({100 * rest / max(self.step_s, 1e-9):.2f}%)", flush=True)

    def evaluate(self):
        if self.test is None:
            return None
        return evaluate(self.model, self.test, self.shape, self.device)

    def report(self, epoch, evaluate, final, done=None):
        """Reports and prints progress; with `evaluate`, evaluates now;
        `done`: (clock, (accuracy, loss)) of one done in the
        background."""
        c = self.client
        now = time.monotonic()
        dt = now - self.last_report
        if dt > 0 and self.samples > self.samples_at_report:
            self.rate = (self.samples - self.samples_at_report) / dt
            wait = min(1.0, (self.ps.wait_seconds - self.wait_at_report) / dt)
        else:
            wait = 0.0
        self.last_report, self.samples_at_report = now, self.samples
        self.wait_at_report = self.ps.wait_seconds
        accuracy, test_loss = -1.0, -1.0
        if evaluate:
            result = self.evaluate()
            if result is not None:
                done = c.clocks, result
        if done is not None:
            self.eval_clock, (accuracy, test_loss) = done
            self.accuracy = accuracy
        loss = (self.loss_sum / self.loss_count if self.loss_count else
                (self.last_loss or 0.0))
        self.loss_sum, self.loss_count = 0.0, 0
        c.report(epoch=epoch, samples=self.samples, loss=loss,
                 samples_per_s=self.rate, test_accuracy=accuracy,
                 test_loss=test_loss, device=str(self.device),
                 host=self.host, wait_fraction=wait, done=final)
        if self.a.quiet and not final:
            return
        acc = (f" test accuracy {100 * self.accuracy:.1f}%"
               if self.accuracy is not None else "")
        if self.accuracy is not None and self.eval_clock != c.clocks:
            acc += f" (of clock {self.eval_clock})"
        loss_text = (f"{self.last_loss:.4f}" if self.last_loss is not None
                     else "-")
        line = (f"worker {c.rank}: epoch {epoch + 1}/{self.a.epochs} clock "
                f"{c.clocks} loss {loss_text}{acc} {self.rate:.0f} samples/s")
        if final:
            print(f"{chr(13) if self.tty else ''}{line} (done in "
                  f"{time.monotonic() - self.start:.2f} s)", flush=True)
        else:
            print(f"{chr(13) if self.tty else ''}{line}",
                  end="   " if self.tty else "\n", flush=True)


def tls_args(a):
    """The --tls-* flags as tether.Client's keyword arguments."""
    return {"tls_cert": a.tls_cert, "tls_key": a.tls_key, "tls_ca": a.tls_ca}


def evaluate_only(a, cls, test, shape, device):
    """The run's current weights on the test set, as an observer."""
    with tether.Client(a.coordinator, observer=True,
                       auth_key_file=a.auth_key_file, **tls_args(a),
                       name="python -m tether.worker --evaluate-only") as c:
        torch.manual_seed(c.seed)
        model = cls(**a.model_args).to(device)
        tether.torch.ParameterServer(model, c)
        accuracy, loss = evaluate(model, test, shape, device)
    print(f"test accuracy {accuracy:.4f} loss {loss:.4f} over {len(test[1])} "
          "rows", flush=True)
    return 0


def set_threads(n):
    """torch's threads, and those of the BLAS Debian's torch calls through
    libblas.so.3 (OpenBLAS starts one per core unless told)."""
    torch.set_num_threads(n)
    try:
        blas = ctypes.CDLL("libblas.so.3")
        blas.openblas_set_num_threads(ctypes.c_int(n))
    except (OSError, AttributeError):
        pass  # not OpenBLAS: the reference BLAS has no threads


def die_with_launcher():
    """Started by tether-up (or a test) through tools/process.cc: dies with
    it, even when it is killed with SIGKILL, as tether-worker does
    (schema/launcher.h): the kernel sends SIGTERM when the launcher goes."""
    launcher = os.environ.pop("TETHER_LAUNCHER_PID", None)
    if not launcher:
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    # Gone before prctl: this process was reparented, and no signal comes.
    if os.getppid() != int(launcher):
        os._exit(1)


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(args)
    if a.threads > 0:
        set_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {a.device}: torch sees no CUDA device")
    cls = load_model_class(a.model)
    test_spec = a.test_data or (a.data if a.data == "fashion-mnist" else None)
    test = load_data(test_spec, False, "--test-data") if test_spec else None
    if a.evaluate_only and test is None:
        raise SystemExit("--evaluate-only: needs --test-data")
    train = None if a.evaluate_only else load_data(a.data, True, "--data")
    features = (test if a.evaluate_only else train)[0].shape[1]
    shape = input_shape(a.input_shape, features)
    if a.evaluate_only:
        return evaluate_only(a, cls, test, shape, device)
    # The dashboard lists how to start this worker again.
    argv = [sys.executable, "-m", "tether.worker", *[str(x) for x in args]]
    command = shlex.join(argv)
    with tether.Client(a.coordinator, a.staleness, a.rank,
                       auth_key_file=a.auth_key_file, **tls_args(a),
                       name=a.name or f"python {a.model}",
                       command=command, wire_dtype=a.wire_dtype,
                       manifest=worker_manifest(a, argv, test_spec)) as client:
        torch.manual_seed(client.seed)
        model = cls(**a.model_args).to(device)
        if client.resume_round >= 0:
            print(f"worker {client.rank}: resuming from round "
                  f"{client.resume_round} (clock {client.clocks})", flush=True)
        if not a.quiet:
            print(f"worker {client.rank}: {a.model} computes on {device}",
                  flush=True)
        # SIGTERM or SIGINT: leave the run after the current step.
        def leave_on_signal(sig, frame):
            client.request_stop(f"{signal.Signals(sig).name}: leaving the run")
            signal.signal(sig, signal.SIG_DFL)  # a second one ends it
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, leave_on_signal)
        finished = False
        try:
            Trainer(a, client, model, train, test, shape, device).train()
            reason = (client.stop_reason if client.stop_requested
                      else "finished its epochs")
            finished = True
        except BaseException as e:
            reason = f"failed: {e}"
            raise
        finally:
            try:
                client.leave(reason, finished)
            except tether.Error as e:
                print(f"worker {client.rank}: could not tell shard 0 it "
                      f"leaves: {e}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    die_with_launcher()
    try:
        sys.exit(main())
    except tether.Error as e:
        print(f"tether.worker: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
