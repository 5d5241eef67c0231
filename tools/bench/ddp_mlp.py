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
(Y: seconds until rank 0 first measured TARGET test accuracy, or "never").

  python3 ddp_mlp.py WORKERS EPOCHS SLOW SLOWDOWN [EVAL_EVERY] [TARGET]
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


def run(rank, world, port, epochs, slow, slowdown, eval_every, target, out):
    torch.set_num_threads(1)
    torch.manual_seed(7)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
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
        out.put((samples / seconds, seconds, reach, final))
    dist.destroy_process_group()


def main():
    world, epochs, slow = (int(a) for a in sys.argv[1:4])
    slowdown = float(sys.argv[4])
    eval_every = int(sys.argv[5]) if len(sys.argv) > 5 else 100
    target = float(sys.argv[6]) if len(sys.argv) > 6 else 0.85
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(run, args=(world, port, epochs, slow, slowdown,
                                  eval_every, target, out),
                       nprocs=world, start_method="spawn")
    rate, seconds, reach, final = out.get()
    print(f"ddp samples/s {rate:.0f} seconds {seconds:.1f} "
          f"reach {'never' if reach is None else f'{reach:.1f}'} "
          f"final {100 * final:.2f}")


if __name__ == "__main__":
    main()
