"""tether: a client for tether's sharded, staleness-bounded parameter server.

    import numpy as np, tether
    with tether.Client("127.0.0.1:7070", staleness=2) as c:   # waits for the run
        c.define_tensor("w", (784, 10), init=("uniform", 0.05))
        w = c.pull("w")                        # a float32 array, (784, 10)
        c.push("w", np.ones((784, 10), np.float32))
        c.clock()                              # end of this worker's iteration

Buffers go straight to and from the wire: `out`, `grad` and `values` may be
C-contiguous float32 NumPy arrays or CPU torch tensors; anything else raises
ValueError naming the tensor and the expected shape and dtype, and nothing
is sent (only the number of elements must match the tensor's, not the
shape). Blocking calls release the GIL; Ctrl-C interrupts one, or a wait
for a future (a pull held by the staleness bound included): the client is
then closed and KeyboardInterrupt raised. Failures raise tether.Error subclasses
(tether.errors) carrying `code` and the server's `message`.

tether.torch puts any torch.nn.Module on the parameter server.
"""

import collections
import json
import shlex
import sys
import time

import numpy as np

from . import _tether
from .errors import (AuthFailedError, CancelledError, Error,  # noqa: F401
                     InvalidArgumentError, NonFiniteError, NotFoundError,
                     NotReadyError, ShapeMismatchError, StalePushError,
                     TimeoutError, UnavailableError)

__all__ = ["Client", "Chunk", "Share", "Error", "AuthFailedError", "CancelledError",
           "InvalidArgumentError", "NonFiniteError", "NotFoundError",
           "NotReadyError", "ShapeMismatchError", "StalePushError",
           "TimeoutError", "UnavailableError", "worker_share",
           "load_fashion_mnist", "load_idx", "wait_seconds", "command_line"]

worker_share = _tether.worker_share
wait_seconds = _tether.wait_seconds
load_fashion_mnist = _tether.load_fashion_mnist
load_idx = _tether.load_idx

# A chunk of the training set handed out by the coordinator: positions
# [first, first + count) of the epoch's order (worker_share(rows, 0, 1, seed,
# epoch)). count 0: none now; `finished` says whether every chunk is done.
Chunk = collections.namedtuple("Chunk", "epoch index first count finished")
# A worker's fixed share of an epoch (Client.share): member `index` of
# `members` trains rows i with i % members == index; index -1 sits the epoch
# out; decided False: not fixed yet, ask again.
Share = collections.namedtuple("Share", "decided index members start_clock")
# The rest of a share a member left untrained (Client.take_leftover): rows
# from `first_row` on of worker_share(rows, index, members, seed, epoch);
# epoch -1: none.
SharePart = collections.namedtuple("SharePart", "epoch index members first_row")

_INIT_KINDS = ("zeros", "uniform", "normal", "constant", "provided")


def _buffer(x, what):
    """`x` as an object exporting its own memory: NumPy arrays as they are,
    a CPU torch tensor as a NumPy view of its storage (no copy)."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch") and hasattr(x, "is_contiguous"):
        if x.device.type != "cpu":
            raise ValueError(
                f"{what}: the tensor is on {x.device}; pass a CPU tensor "
                "(tether.torch copies GPU parameters through pinned buffers)")
        if x.layout != _torch_strided():
            raise ValueError(f"{what}: a {x.layout} tensor; expected a dense "
                             "(strided) float32 tensor")
        try:
            return x.detach().numpy()
        except (TypeError, RuntimeError) as e:
            raise ValueError(f"{what}: {e}; expected a C-contiguous float32 "
                             "tensor") from None
    return x


def _torch_strided():
    import torch
    return torch.strided


def _parse_init(init):
    """(kind, scale, values) from "zeros", ("uniform", 0.05) or an array."""
    if isinstance(init, str):
        if init not in _INIT_KINDS:
            raise ValueError(f"init: unknown kind {init!r} (expected one of "
                             f"{', '.join(_INIT_KINDS)})")
        return init, 0.0, None
    if isinstance(init, tuple) and len(init) == 2 and isinstance(init[0], str):
        return _parse_init(init[0])[0], float(init[1]), None
    if init is None:
        return "zeros", 0.0, None
    return "provided", 0.0, init


def command_line(args=None):
    """This process's command line, shell-quoted: `python3 -m MODULE ARGS`
    when it runs a module, `python3 SCRIPT ARGS` when a script, with `args`
    instead of sys.argv[1:] when given; "" when neither (python3 -c, a
    console)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    args = sys.argv[1:] if args is None else [str(a) for a in args]
    if spec is not None and spec.name and spec.name != "__main__":
        name = spec.name
        if name.endswith(".__main__"):
            name = name[:-len(".__main__")]
        head = [sys.executable, "-m", name]
    elif sys.argv and sys.argv[0] not in ("", "-c"):
        head = [sys.executable, sys.argv[0]]
    else:
        return ""
    return shlex.join(head + args)


class Client:
    """A worker's (or an observer's) connection to a tether run.

    Connecting waits until every worker has joined. `staleness` is this
    worker's SSP bound (0 BSP, -1 fully asynchronous); `rank` -1 lets the
    coordinator pick; observers hold no rank and their pulls never wait.
    A worker tells the coordinator `command`, how to start it again, which
    the dashboard lists with the run's other processes (its "Copy command
    + seeds"); by default this process's command_line(); "" tells nothing.
    It is shown to whoever reads the dashboard: no secrets in it.
    In a run with TLS, `tls_cert`, `tls_key` and `tls_ca` are this
    process's certificate, its key and the run's CA (PEM files), as
    tether-server's --tls-cert, --tls-key and --tls-ca.
    `manifest` (a dict, or JSON text) is this worker's part of the run
    manifest -- what decides what it computes: model file and its SHA-256,
    settings, data files and their SHA-256 -- which the coordinator keeps in
    every checkpoint round and shows on the dashboard; `tether.worker`
    fills it in. Never a secret.
    `wire_dtype` "bf16" pushes gradients and pulls weights as bfloat16 (half
    the bytes, rounded to nearest even), "int8" as one byte a value and a
    float scale per 256 values (about a quarter; gradients rounded
    stochastically, weights to nearest); the shards keep f32 weights and
    optimizer state, and initial values a worker provides travel as f32.
    """

    def __init__(self, coordinator, staleness=0, rank=-1, observer=False,
                 auth_key_file=None, name=None, *, join_timeout=600.0,
                 reconnect_timeout=120.0, command=None, tls_cert=None,
                 tls_key=None, tls_ca=None, manifest=None, wire_dtype="f32"):
        if command is None:
            command = "" if observer else command_line()
        if isinstance(manifest, dict):
            manifest = json.dumps(manifest)
        self._c = _tether.Client(coordinator, int(staleness), int(rank),
                                 bool(observer), auth_key_file, name,
                                 int(join_timeout * 1000),
                                 int(reconnect_timeout * 1000), str(command),
                                 tls_cert, tls_key, tls_ca, manifest,
                                 str(wire_dtype))
        self._shapes = {}
        self._dims = {}

    # --- lifetime ---------------------------------------------------------
    def close(self):
        """Closes every connection; requests still running fail."""
        self._c.close()

    @property
    def closed(self):
        return self._c.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # --- the run ----------------------------------------------------------
    rank = property(lambda self: self._c.rank, doc="-1 for observers")
    num_workers = property(lambda self: self._c.num_workers)
    num_shards = property(lambda self: self._c.num_shards)
    seed = property(lambda self: self._c.seed, doc="the run seed")
    staleness = property(lambda self: self._c.staleness,
                         doc="the bound the shards enforce")
    clocks = property(lambda self: self._c.clocks,
                      doc="clock() calls completed (a resumed run starts "
                          "at the round's clock)")
    records = property(lambda self: self._c.records,
                       doc="the shards record the order of requests "
                           "(--record): a replay expects each where the "
                           "recording has it")
    resume_round = property(lambda self: self._c.resume_round,
                            doc="the checkpoint round the run resumed "
                                "from; -1: none")
    stop_requested = property(lambda self: self._c.stop_requested,
                              doc="the run was stopped: stop after this step")
    stop_reason = property(lambda self: self._c.stop_reason)
    shard_losses = property(lambda self: self._c.shard_losses,
                            doc="shard connections lost so far")
    max_push_staleness = property(lambda self: self._c.max_push_staleness)

    # --- definitions ------------------------------------------------------
    def define_tensor(self, name, shape, init="zeros"):
        """Defines dense tensor `name` on every shard (idempotent).

        init: "zeros", (kind, scale) with kind uniform, normal or constant,
        "provided" (values come from another worker), or an array of the
        tensor's values: defined as provided with these values, written
        only where the shards hold none yet (the first provider wins; a
        resumed run keeps its checkpoint).
        """
        shape = (int(shape),) if np.isscalar(shape) else tuple(
            int(d) for d in shape)
        kind, scale, values = _parse_init(init)
        self._c.define_tensor(name, list(shape), kind, scale)
        self._shapes[name] = shape
        if values is not None:
            self.provide(name, values)

    def define_table(self, name, dim, init="zeros"):
        """Defines a sparse table of rows of `dim` floats, created on first
        touch with `init` ("zeros", (kind, scale) or "provided")."""
        kind, scale, values = _parse_init(init)
        if values is not None:
            raise ValueError(f"define_table '{name}': init must be a kind; "
                             "provide rows with provide_rows")
        self._c.define_table(name, int(dim), kind, scale)
        self._dims[name] = int(dim)

    def provide(self, name, values):
        """Initial values of a provided tensor (kept if it has some)."""
        self._c.provide(name, _buffer(values, f"provide '{name}'"))

    def assign(self, name, values):
        """Replaces the tensor's values on the shards with `values` (its
        number of elements, float32): not a gradient, so no optimizer, no
        staleness, not held for the bound; the last writer wins. For state
        kept apart from gradients (BatchNorm's running statistics)."""
        self._c.assign(name, _buffer(values, f"assign '{name}'"))

    def provide_rows(self, table, keys, values):
        self._c.rows(2, table, _keys(keys, f"provide_rows '{table}'"),
                     _buffer(values, f"provide_rows '{table}'"))

    # --- dense ------------------------------------------------------------
    def _out(self, name, out):
        if out is not None:
            return out
        if name not in self._shapes:
            raise ValueError(f"tensor '{name}' is not defined by this client "
                             "(call define_tensor first)")
        return np.empty(self._shapes[name], np.float32)

    def pull(self, name, out=None):
        """Fills `out` (a new array when None) with the tensor's values and
        returns it; waits while the slowest live worker is more than the
        bound behind this one."""
        out = self._out(name, out)
        self._c.pull(name, _buffer(out, f"pull '{name}'"))
        return out

    def pull_async(self, name, out):
        """Starts a pull into `out`; .result() of the returned future waits."""
        return self._c.pull_async(name, _buffer(out, f"pull '{name}'"))

    def pull_when_ready(self, name, out=None, timeout=600.0):
        """pull(), asking again while a provided tensor has no values yet."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.pull(name, out)
            except NotReadyError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def push(self, name, grad):
        """Sends a gradient (the tensor's number of elements, float32) to
        the shards' optimizer; StalePushError if a shard rejects it as too
        stale. With staleness 0 (BSP) the shards apply it when every live
        worker has ended this clock: a pull before clock() does not see it."""
        self._c.push(name, _buffer(grad, f"push '{name}'"))

    def push_async(self, name, grad):
        return self._c.push_async(name, _buffer(grad, f"push '{name}'"))

    # --- sparse -----------------------------------------------------------
    def _rows_out(self, table, keys, out):
        if out is not None:
            return out
        if table not in self._dims:
            raise ValueError(f"table '{table}' is not defined by this client "
                             "(call define_table first)")
        return np.empty((len(keys), self._dims[table]), np.float32)

    def pull_rows(self, table, keys, out=None):
        """The rows of `keys` (1-D integers), as a (len(keys), dim) array."""
        keys = _keys(keys, f"pull_rows '{table}'")
        out = self._rows_out(table, keys, out)
        self._c.rows(0, table, keys, _buffer(out, f"pull_rows '{table}'"))
        return out

    def pull_rows_async(self, table, keys, out):
        return self._c.rows_async(0, table, _keys(keys, f"pull_rows '{table}'"),
                                  _buffer(out, f"pull_rows '{table}'"))

    def push_rows(self, table, keys, grads):
        self._c.rows(1, table, _keys(keys, f"push_rows '{table}'"),
                     _buffer(grads, f"push_rows '{table}'"))

    def push_rows_async(self, table, keys, grads):
        return self._c.rows_async(1, table, _keys(keys, f"push_rows '{table}'"),
                                  _buffer(grads, f"push_rows '{table}'"))

    # --- iterations and progress -----------------------------------------
    def clock(self):
        """Ends this worker's iteration on every shard (after its pushes)."""
        self._c.clock()

    def clock_async(self):
        return self._c.clock_async()

    def report(self, epoch=0, samples=0, loss=0.0, samples_per_s=0.0,
               test_accuracy=-1.0, test_loss=-1.0, device="cpu", host=None,
               wait_fraction=0.0, done=False):
        """Sends this worker's progress to the coordinator (the dashboard
        and stats() show it like a native worker's)."""
        import socket
        self._c.report(int(epoch), int(samples), float(loss),
                       float(samples_per_s), float(test_accuracy),
                       float(test_loss), str(device),
                       host if host is not None else socket.gethostname(),
                       float(wait_fraction), bool(done))

    def next_chunk(self, rows, chunk_rows, epochs, batch=0):
        """The next chunk of the training set for this worker (the one it
        had is done), as a Chunk. `batch`: rows trained per clock, so that
        a checkpoint round records how much of the chunk it holds (a
        resumed run then trains only the rest); 0 if not known."""
        return Chunk(*self._c.next_chunk(int(rows), int(chunk_rows),
                                         int(epochs), int(batch)))

    def share(self, epoch, batch=0):
        """This worker's fixed share of `epoch`, as a Share. The epoch's
        members are fixed by shard 0 when it starts, so workers may join
        and leave between epochs. batch: the rows it trains a clock, so
        that a run resumed without it hands its share on from where it
        stands; 0 if not known."""
        return Share(*self._c.share(int(epoch), int(batch)))

    def take_leftover(self, epoch):
        """A part of a share that a member which left the run did not
        train, of `epoch` or earlier, for this worker to train (a
        SharePart; epoch -1 when there is none now)."""
        return SharePart(*self._c.take_leftover(int(epoch)))

    def set_share_position(self, epoch=-1, index=-1, members=0, first_row=0):
        """Where this worker is in a fixed share: rows from `first_row` on
        of member `index` of `members`' share of `epoch` are not trained
        yet. leave() hands them to another member; epoch -1: none."""
        self._c.set_share_position(int(epoch), int(index), int(members),
                                   int(first_row))

    def leave(self, reason="finished", finished=True):
        """Leaves the run for good: shard 0 stops counting this worker at
        once and frees its rank. Call it once training is over, before
        close(); a worker that only disconnects counts as lost. finished:
        the data chunk it holds, if any, is done (else it is handed out
        again)."""
        self._c.leave(str(reason), bool(finished))

    def request_stop(self, reason):
        """Asks the training loop to end after its current step (from a
        signal handler, say): stop_requested becomes True."""
        self._c.request_stop(str(reason))

    def stats(self):
        """Every shard's counters (a list of dicts, by shard id)."""
        return self._c.stats()

    def checkpoint_now(self):
        """Asks for a checkpoint round now; returns its number."""
        return self._c.checkpoint_now()

    def await_shards(self, timeout=180.0):
        """After an UnavailableError: waits until every lost shard is back
        (CancelledError once the run was stopped: request_stop, the
        dashboard)."""
        self._c.await_shards(int(timeout * 1000))


def _keys(keys, what):
    """`keys` as a 1-D uint64 array; ValueError naming `what` otherwise."""
    if type(keys).__module__.startswith("torch"):
        keys = keys.detach().cpu().numpy()
    keys = np.asarray(keys)
    if keys.dtype.kind not in "iu" or keys.ndim != 1:
        raise ValueError(f"{what}: keys must be a 1-D array of non-negative "
                         f"integers, got dtype {keys.dtype} and shape "
                         f"{keys.shape}")
    if keys.dtype.kind == "i" and keys.size and keys.min() < 0:
        raise ValueError(f"{what}: keys must be non-negative, got "
                         f"{keys.min()}")
    return keys.astype(np.uint64, copy=False)
