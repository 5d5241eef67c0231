"""PyTorch DDP (gloo) baseline for tools/bench/straggler: WORKERS processes
on this machine train the same MLP as tether's workers (784-256-128-10,
ReLU, Adam lr 1e-3, batch 64 per process, 1 thread each) on Fashion-MNIST
from the Debian package, each on a fixed share of every epoch (as
DistributedSampler gives), gradients averaged by DDP's allreduce.

The last SLOW ranks are stragglers slowed as tether-worker --slowdown F
slows a worker: after each step they sleep (F - 1) times their compute
time, measured alone (forward and backward without the allreduce) before
training starts -- not their whole step, which includes waiting for the
others. Rank 0 evaluates on the test set every EVAL_EVERY steps.

Prints one line:
  ddp samples/s X seconds S reach Y final A
(Y: seconds from the start of training, after every rank has joined and
calibrated, until rank 0 first measured TARGET test accuracy, or "never").

  python3 ddp_mlp.py WORKERS EPOCHS SLOW SLOWDOWN [EVAL_EVERY] [TARGET]

With --rank R --master HOST:PORT first, this process is rank R alone (the
others started the same way elsewhere, e.g. in other network namespaces as
tools/bench/netns does; rank 0 listens on HOST:PORT and prints the line).
"""
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from mlp_pytorch import load  # the same data, read the same way

BATCH = 64


def mlp():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def calibrate(model, loss_fn, x, y):
    """Median seconds of one local forward+backward (no allreduce)."""
    times = []
    with model.no_sync():
        for i in range(20):
            xb, yb = x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]
            t = time.perf_counter()
            loss_fn(model(xb), yb).backward()
            times.append(time.perf_counter() - t)
    model.zero_grad()
    return statistics.median(times)


def run(rank, world, master, epochs, slow, slowdown, eval_every, target, out):
    """Trains as rank `rank`; rank 0 puts its result line on `out`."""
    torch.set_num_threads(1)
    torch.manual_seed(7)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = master
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x, y = load("train")
    tx, ty = load("t10k")
    model = nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    pause = 0.0
    if rank >= world - slow:
        pause = (slowdown - 1) * calibrate(model, loss_fn, x, y)
    steps_per_epoch = len(x) // world // BATCH
    dist.barrier()
    start = time.perf_counter()
    reach = None
    step = 0
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(1000 + epoch)
        order = torch.randperm(len(x), generator=g)[rank::world]
        for b in range(steps_per_epoch):
            idx = order[b * BATCH:(b + 1) * BATCH]
            opt.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
            step += 1
            if pause > 0:
                time.sleep(pause)
            if (rank == 0 and reach is None and eval_every > 0
                    and step % eval_every == 0):
                if accuracy(model.module, tx, ty) >= target:
                    reach = time.perf_counter() - start
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        final = accuracy(model.module, tx, ty)
        samples = steps_per_epoch * BATCH * world * epochs
        out.put(f"ddp samples/s {samples / seconds:.0f} seconds {seconds:.1f} "
                f"reach {'never' if reach is None else f'{reach:.1f}'} "
                f"final {100 * final:.2f}")
    dist.destroy_process_group()


class Printer:
    """`out` for a rank run alone: prints its result line."""

    @staticmethod
    def put(line):
        print(line, flush=True)


def main():
    args = sys.argv[1:]
    rank = None
    if args[:1] == ["--rank"]:
        if len(args) < 4 or args[2] != "--master" or ":" not in args[3]:
            sys.exit("ddp_mlp.py: --rank R needs --master HOST:PORT after it")
        rank, master = int(args[1]), tuple(args[3].rsplit(":", 1))
        args = args[4:]
    world, epochs, slow = (int(a) for a in args[0:3])
    slowdown = float(args[3])
    eval_every = int(args[4]) if len(args) > 4 else 100
    target = float(args[5]) if len(args) > 5 else 0.85
    if rank is not None:
        run(rank, world, master, epochs, slow, slowdown, eval_every, target,
            Printer)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        master = ("127.0.0.1", str(s.getsockname()[1]))
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(run, args=(world, master, epochs, slow, slowdown,
                                  eval_every, target, out),
                       nprocs=world, start_method="spawn")
    print(out.get())


if __name__ == "__main__":
    main()
