"""PyTorch baseline for tools/bench/mlp_vs_pytorch: the same MLP
(784-256-128-10, ReLU), batch, optimizer (Adam, lr 1e-3) and thread count as
one tether worker, on Fashion-MNIST from the Debian package. Prints
"pytorch samples/s X blas PATH" for one epoch of training steps (data in
memory), PATH the libblas.so.3 this process multiplied through (Debian's
torch calls whichever the libblas.so.3 alternative, or LD_LIBRARY_PATH,
names: OpenBLAS or the reference BLAS of libblas3)."""
import ctypes
import gzip
import struct
import sys
import time

import numpy as np
import torch

DIR = "/usr/share/datasets/fashion-mnist"


def load(kind):
    with gzip.open(f"{DIR}/{kind}-images-idx3-ubyte.gz") as f:
        _, n, rows, cols = struct.unpack(">IIII", f.read(16))
        x = np.frombuffer(f.read(), np.uint8).reshape(n, rows * cols)
    with gzip.open(f"{DIR}/{kind}-labels-idx1-ubyte.gz") as f:
        f.read(8)
        y = np.frombuffer(f.read(), np.uint8)
    return torch.tensor(x, dtype=torch.float32) / 255.0, torch.tensor(y, dtype=torch.int64)


def blas_loaded():
    """The file of the libblas.so.3 mapped into this process."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libblas.so" in line:
                return line.split()[-1]
    return "none"


def main():
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    torch.set_num_threads(threads)
    try:  # Debian's torch calls OpenBLAS (when installed) through libblas
        ctypes.CDLL("libblas.so.3").openblas_set_num_threads(threads)
    except (OSError, AttributeError):
        pass
    torch.manual_seed(7)
    x, y = load("train")
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    order = torch.randperm(x.shape[0])
    start = time.perf_counter()
    for first in range(0, x.shape[0], batch):
        idx = order[first:first + batch]
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
    secs = time.perf_counter() - start
    print(f"pytorch samples/s {x.shape[0] / secs:.0f} blas {blas_loaded()}")


if __name__ == "__main__":
    main()
