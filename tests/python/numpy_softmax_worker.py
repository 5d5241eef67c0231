"""A tether worker in NumPy through the raw client API: the softmax
regression of tether-worker --model softmax (worker/model.cc), trained on
a fixed share of Fashion-MNIST, one clock per batch, as the C++ trainer
does (worker/training_loop.cc).

    python3 numpy_softmax_worker.py COORDINATOR RANK STALENESS EPOCHS BATCH
"""

import sys

import numpy as np

import tether

CLASSES, FEATURES = 10, 784


def gradients(w, b, x, y):
    """Softmax cross-entropy averaged over the batch: (loss, dW, db)."""
    logits = x @ w.T + b
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    n = len(y)
    loss = -np.log(p[np.arange(n), y] + 1e-12).mean()
    p[np.arange(n), y] -= 1.0
    p /= n
    return loss, (p.T @ x).astype(np.float32), p.sum(axis=0).astype(
        np.float32)


def main(coordinator, rank, staleness, epochs, batch):
    x, y, classes = tether.load_fashion_mnist(True)
    assert classes == CLASSES and x.shape[1] == FEATURES
    with tether.Client(coordinator, staleness=staleness, rank=rank,
                       name="numpy softmax") as c:
        c.define_tensor("softmax.weight", (CLASSES, FEATURES), "zeros")
        c.define_tensor("softmax.bias", (CLASSES,), "zeros")
        w = np.empty((CLASSES, FEATURES), np.float32)
        b = np.empty(CLASSES, np.float32)
        loss = float("nan")
        for epoch in range(epochs):
            order = tether.worker_share(len(y), c.rank, c.num_workers, c.seed,
                                        epoch)
            for first in range(0, len(order), batch):
                rows = order[first:first + batch]
                c.pull("softmax.weight", w)
                c.pull("softmax.bias", b)
                loss, gw, gb = gradients(w, b, x[rows], y[rows])
                c.push("softmax.weight", gw)
                c.push("softmax.bias", gb)
                c.clock()
            c.report(epoch=epoch, samples=len(order) * (epoch + 1),
                     loss=loss, done=epoch == epochs - 1)
        print(f"numpy worker {c.rank}: {c.clocks} clocks, last loss "
              f"{loss:.4f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:6]))
