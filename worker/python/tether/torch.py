"""tether.torch: any torch.nn.Module on tether's parameter server.

    torch.manual_seed(client.seed)      # every worker builds the same module
    model = Net()
    ps = tether.torch.ParameterServer(model, client)
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        ps.step()                       # push every .grad, clock, pull

One tensor per entry of model.named_parameters(), same names and shapes,
and one per floating-point buffer of its state_dict() (the state a module
updates apart from its gradients: BatchNorm's running mean and variance).
A worker trains with its own buffers and writes them to the shards after
every step (replacing what they hold: the last writer wins), so that an
evaluation from the shards (python -m tether.worker --evaluate-only,
tether-up's), a checkpoint and an export (tether-ckpt) hold them; it
takes the shards' at the start and at every pull() it calls itself (not
the one inside step()). Integer buffers (num_batches_tracked) stay each
worker's own.
Rank 0 provides its module's values (PyTorch's own initialization) once,
atomically with the definition: a tensor that already has values keeps them
(a resumed run keeps its checkpoint), and every worker starts from the
shards' values. nn.Embedding(..., sparse=True) weights become sparse tables:
only the rows a batch touches are pulled (in a forward pre-hook) and pushed.
Parameters on a GPU go through pinned host buffers; CPU parameters are
pulled into and pushed from their own memory.

With ParameterServer(..., push_in_backward=True) each dense parameter's
gradient is sent as soon as backward has accumulated it (last layer first),
so the wire works while backward goes on; step() then sends only the clock
(and the sparse rows) behind them. One backward() per step: gradients
accumulated over several backward() calls need the default (False).

With ParameterServer(..., prefetch_with_push=True), a bound s other than
0, without overlap_steps and not in a recorded run, each dense parameter's
next values are asked for right behind its gradient, part by part on each
shard's connection (tether-worker --prefetch-with-push): with
push_in_backward they come down the link while backward goes on and the
gradients below still go up. A shard answers a connection in order, so
they hold this worker's own push (each step still reads its own writes),
and they are read at the next clock, so the bound stays exact. The next
pull() (step()'s) takes them instead of asking again; it pulls when one
was not asked for (a parameter without a gradient) or failed.

With ParameterServer(..., overlap_steps=True), a bound s other than 0 and
not in a recorded run, a step overlaps the next one, as tether-worker
--overlap-steps does:

    loss = F.cross_entropy(model(x), y)
    ps.prefetch()                       # the next step's weights travel
    loss.backward()                     # ... while backward runs
    ps.step()                           # push, clock: not awaited

prefetch() asks for the values the next step computes with (read by the
shards at the next clock, so the bound stays exact), and step() sends the
pushes and the clock, puts the prefetched values in the module and returns
without waiting for the pushes' answers (collected by the next step()).
The next step then computes without this one's update: under bound s no
push is staler than s + 1. A refused push is raised by the step() after
the one that sent it; flush() collects the last ones.

ps.overlap_steps and ps.prefetch_with_push say whether each setting took
effect: False under bound 0 or in a recorded run, and prefetch_with_push
False next to overlap_steps.
"""

import sys
import time

import numpy as np
import torch

from . import NotReadyError, UnavailableError, worker_share

__all__ = ["ParameterServer", "ChunkSampler"]


def _host_view(t):
    """A NumPy view of CPU tensor `t`'s memory (no copy)."""
    return t.detach().numpy()


class _Dense:
    """A dense parameter. CPU parameters are pulled into their own memory;
    GPU ones (and non-contiguous ones) go through host buffers, pinned for
    a GPU so the copies are DMA transfers."""

    def __init__(self, name, param):
        self.name = name
        self.param = param
        self.shape = tuple(param.shape) or (1,)
        self.cuda = (param.device.type != "cpu" or
                     not param.data.is_contiguous())
        # overlap_steps: the memory a CPU parameter's prefetch fills, which
        # then becomes the parameter's (its old memory the next spare).
        self.spare = None
        if self.cuda:
            pin = param.device.type == "cuda" and torch.cuda.is_available()
            self.host = torch.empty(param.shape, dtype=torch.float32,
                                    pin_memory=pin)
            self.host_grad = torch.empty(param.shape, dtype=torch.float32,
                                         pin_memory=pin)

    @property
    def pull_buffer(self):
        """Where a pull of this parameter goes (the parameter's memory is
        swapped by a prefetch, so asked each time)."""
        return _host_view(self.host if self.cuda else self.param.data)

    def prefetch_buffer(self):
        if self.cuda:
            return _host_view(self.host)
        if self.spare is None:
            self.spare = torch.empty_like(self.param.data)
        return _host_view(self.spare)

    def take_prefetched(self):
        """The prefetched values become the parameter's."""
        if self.cuda:
            self.param.data.copy_(self.host, non_blocking=True)
        else:
            old = self.param.data
            self.param.data = self.spare
            self.spare = old


class _Sparse:
    def __init__(self, name, module):
        self.name = name
        self.module = module
        self.param = module.weight
        self.rows, self.dim = module.weight.shape


class ParameterServer:
    """Puts `model`'s parameters on the shards `client` is connected to.

    Constructing it defines the tensors and tables, provides rank 0's
    values and pulls them (waiting up to `timeout` seconds for rank 0).
    """

    def __init__(self, model, client, *, timeout=600.0,
                 push_in_backward=False, overlap_steps=False,
                 prefetch_with_push=False):
        self.model = model
        self.client = client
        # Values may be read ahead of the step that needs them: not under
        # bound 0, where the next clock's values cannot be read before
        # every worker clocked; not in a recorded run, whose replay expects
        # each request where the recording has it.
        may_read_ahead = client.staleness != 0 and not client.records
        # Both settings as they take effect.
        self.overlap_steps = overlap_steps and may_read_ahead
        # prefetch_with_push (not with overlap_steps): the prefetches sent
        # behind this clock's pushes, by name, and the clock they are for.
        self.prefetch_with_push = (prefetch_with_push and may_read_ahead
                                   and not self.overlap_steps)
        self._early = {}
        self._early_for = -1
        self.wait_seconds = 0.0  # time spent in pull(): waiting for others
        # overlap_steps: the prefetch in flight (its future), the clock
        # whose values the module holds (-1: pull them), and the last
        # step()'s pushes, not awaited: (futures, what they read, clock).
        self._prefetching = None
        self._weights_for = -1
        self._in_flight = None
        self._dense = []
        self._sparse = []
        self._state = []  # the state_dict's floating-point buffers
        # Dense pushes sent during backward (push_in_backward), collected by
        # the next push(): (future, gradient kept alive) by name.
        self._sent = {}
        self._hooks = []
        sparse_modules = {}
        for mod_name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Embedding) and mod.sparse:
                sparse_modules[f"{mod_name}.weight" if mod_name else
                               "weight"] = mod
        for name, p in model.named_parameters():
            if p.dtype != torch.float32:
                raise ValueError(
                    f"parameter '{name}' is {p.dtype}; tether holds float32 "
                    "parameters (call model.float())")
            if name in sparse_modules:
                entry = _Sparse(name, sparse_modules[name])
                client.define_table(name, entry.dim, "provided")
                entry.module.register_forward_pre_hook(self._pull_rows_hook(
                    entry))
                self._sparse.append(entry)
            else:
                entry = _Dense(name, p)
                client.define_tensor(name, entry.shape, "provided")
                self._dense.append(entry)
        persistent = set(model.state_dict().keys())
        for name, b in model.named_buffers():
            if name not in persistent or not b.dtype.is_floating_point:
                continue
            if b.dtype != torch.float32:
                raise ValueError(
                    f"buffer '{name}' is {b.dtype}; tether holds float32 "
                    "state (call model.float())")
            entry = _Dense(name, b)
            client.define_tensor(name, entry.shape, "provided")
            self._state.append(entry)
        self._state_names = [d.name for d in self._state]
        self._on_gpu = any(d.param.device.type == "cuda"
                           for d in self._dense + self._state)
        if push_in_backward:
            for d in self._dense:
                self._hooks.append(self._push_hook(d))
        self._names = [d.name for d in self._dense]
        if client.rank == 0:
            self._provide()
        deadline = time.monotonic() + timeout
        for d in self._dense + self._state:
            client.pull_when_ready(d.name, d.pull_buffer,
                                   timeout=max(0.0, deadline -
                                               time.monotonic()))
            if d.cuda:
                d.param.data.copy_(d.host)

    def _push_hook(self, d):
        """Sends d's gradient as soon as backward has accumulated it."""
        def hook(*_):
            self._push_now(d)
        p = d.param
        if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
            return p.register_post_accumulate_grad_hook(hook)
        # Older torch: a hook on the node that accumulates p's gradient, as
        # DistributedDataParallel does; the node is kept with the hook.
        node = p.expand_as(p).grad_fn.next_functions[0][0]
        node.register_hook(hook)
        return node

    def _host_grad(self, d):
        """d's gradient in host memory, contiguous (a copy for a GPU)."""
        g = d.param.grad
        if d.cuda:
            d.host_grad.copy_(g)
            return d.host_grad
        return g.contiguous()

    def _push_now(self, d):
        if d.param.grad is None:
            return
        if d.name in self._sent:
            raise RuntimeError(
                f"tether: the gradient of '{d.name}' came twice before "
                "step()/push(): with push_in_backward=True every backward() "
                "sends its gradients, so accumulating gradients over several "
                "backward() calls needs ParameterServer(..., "
                "push_in_backward=False)")
        g = self._host_grad(d)
        self._sent[d.name] = (self._push_one(d, g), g)

    def _push_one(self, d, g):
        """Pushes gradient `g` of d (host memory); with prefetch_with_push,
        d's next values are asked for right behind it. Its future."""
        if not self.prefetch_with_push:
            return self.client._c.push_many([d.name], [_host_view(g)], False)
        if d.cuda:
            self._await_gpu_copies()  # the last copies read d.host
        untaken = self._early.pop(d.name, None)  # no pull took it
        if untaken is not None:  # it ends before its buffer is reused
            try:
                untaken.result()
            except Exception:  # noqa: BLE001 -- its values are not used
                pass
        pushed, fetched = self.client._c.push_and_prefetch(
            d.name, _host_view(g), d.prefetch_buffer())
        self._early[d.name] = fetched
        self._early_for = self.client.clocks + 1
        return pushed

    def _provide(self):
        """Rank 0: the module's own values, where the shards have none."""
        futures = []
        for d in self._dense + self._state:
            values = d.param.detach().to("cpu", torch.float32).contiguous()
            futures.append((values, self.client._c.provide_async(
                d.name, _host_view(values))))
        for s in self._sparse:
            values = s.param.detach().to("cpu", torch.float32).contiguous()
            keys = np.arange(s.rows, dtype=np.uint64)
            futures.append((values, self.client._c.rows_async(
                2, s.name, keys, _host_view(values))))
        for _, f in futures:
            f.result()

    def _pull_rows_hook(self, entry):
        def hook(module, inputs):
            keys = torch.unique(inputs[0].detach()).cpu().to(torch.int64)
            rows = np.empty((len(keys), entry.dim), np.float32)
            start = time.monotonic()
            while True:
                try:
                    self.client.pull_rows(entry.name, keys.numpy(), rows)
                    break
                except NotReadyError:  # rank 0 is still providing them
                    time.sleep(0.05)
            self.wait_seconds += time.monotonic() - start
            with torch.no_grad():
                module.weight[keys.to(module.weight.device)] = torch.from_numpy(
                    rows).to(module.weight.device)
        return hook

    def pull(self):
        """Copies the current values of every dense parameter into the
        module (all at once), then the shards' floating-point buffers;
        sparse rows are pulled as batches use them.
        Waits while the slowest worker is more than the bound behind.
        With overlap_steps, first collects the pushes step() left in flight
        (flush())."""
        self.flush()
        self._weights_for = -1
        self.pull_finish(self.pull_start())
        self._pull_state()

    def _pull_state(self):
        """The shards' floating-point buffers into the module."""
        if not self._state:
            return
        self._await_gpu_copies()
        self._finish(self.client._c.pull_many(
            self._state_names, [d.pull_buffer for d in self._state]),
            self._state)

    def pull_start(self):
        """Starts pull(); pull_finish(the returned handle) completes it, so
        that work which does not touch the parameters (the next batch's
        data) overlaps the transfer. Returns None when the module already
        holds the values of this clock (an overlapped step() put them in)."""
        if self._weights_for == self.client.clocks:
            return None
        if self._take_early():
            self._weights_for = self.client.clocks
            return None
        self._await_gpu_copies()
        # One call and one future for every tensor (see push()).
        return self.client._c.pull_many(
            self._names, [d.pull_buffer for d in self._dense])

    def _take_early(self):
        """prefetch_with_push: waits for the values asked for behind the
        last pushes and puts them in the module; False (and nothing put in)
        when they are not for this clock, not for every dense parameter, or
        one failed: then they are pulled."""
        early, self._early = self._early, {}
        if not early:
            return False
        start = time.monotonic()
        usable = (self._early_for == self.client.clocks and
                  len(early) == len(self._dense))
        for f in early.values():  # each ends before its buffer is reused
            try:
                f.result()
            except Exception:  # noqa: BLE001 -- pulled again instead
                usable = False
        self.wait_seconds += time.monotonic() - start
        if not usable:
            return False
        for d in self._dense:
            d.take_prefetched()
        return True

    def _await_gpu_copies(self):
        if self._on_gpu:
            # The last pull's copies to the GPU read the host buffers this
            # one writes: they must be done.
            torch.cuda.current_stream().synchronize()

    def pull_finish(self, started):
        if started is not None:
            self._finish(started, self._dense)

    def _finish(self, pulling, entries):
        """Waits for the pull of `entries` and puts their values in the
        module (a GPU one's through its host buffer)."""
        start = time.monotonic()
        pulling.result()
        for d in entries:
            if d.cuda:
                d.param.data.copy_(d.host, non_blocking=True)
        self.wait_seconds += time.monotonic() - start

    def prefetch(self):
        """overlap_steps: starts pulling the values the next step computes
        with; call it once forward is done (before backward, so that they
        travel while it runs). step() puts them in the module. Does nothing
        without overlap_steps, under bound 0 (they could not be read
        before every worker clocked), in a recorded run (whose order of
        requests must not depend on timing, as tether-worker's), or when
        one is in flight."""
        if (not self.overlap_steps or self._prefetching is not None or
                not self._dense):
            return
        self._await_gpu_copies()
        self._prefetching = self.client._c.prefetch_many(
            self._names, [d.prefetch_buffer() for d in self._dense])

    @property
    def prefetching(self):
        """Whether a prefetch() is in flight (step() then overlaps)."""
        return self._prefetching is not None

    def flush(self):
        """Waits for the pushes an overlapped step() left in flight; raises
        the first error (a refused push: StalePushError, NonFiniteError).
        Pushes of an earlier clock lost with their shard are not: that step
        is not repeated, as with tether-worker --overlap-steps."""
        in_flight, self._in_flight = self._in_flight, None
        self._collect(in_flight)

    def _collect(self, in_flight):
        """Waits for one overlapped step's pushes (futures, what they read,
        their clock), as flush() says; None: nothing to wait for."""
        if in_flight is None:
            return
        futures, _, at = in_flight
        try:
            _results(futures)
        except UnavailableError as e:
            if at >= self.client.clocks:
                raise
            print(f"tether: a push of clock {at} was lost with its shard "
                  f"({e.message}); training goes on", file=sys.stderr,
                  flush=True)

    def _step_overlapped(self):
        """step() after prefetch(): sends the pushes and the clock, puts the
        prefetched values in, and collects the last step's pushes."""
        older, self._in_flight = self._in_flight, None
        at = self.client.clocks
        prefetching, self._prefetching = self._prefetching, None
        try:
            futures, keep = self._send(clock=True)
        except BaseException:
            # Nothing sent: the prefetch's values are for a clock this
            # worker did not reach (its buffers are free once it ends).
            self._in_flight = older
            try:
                prefetching.result()
            except Exception:  # noqa: BLE001 -- the send's error wins
                pass
            raise
        self._in_flight = (futures, keep, at)
        start = time.monotonic()
        try:
            prefetching.result()
        except UnavailableError:
            # A shard lost since: the values are asked again (the step that
            # uses them is repeated if that fails too).
            self.wait_seconds += time.monotonic() - start
            self.pull_finish(self.pull_start())
        else:
            self.wait_seconds += time.monotonic() - start
            for d in self._dense:
                d.take_prefetched()
            self._weights_for = at + 1
        # The last step's pushes: long answered (the clock after them was).
        self._collect(older)

    def _send(self, clock):
        """Sends every .grad not yet sent (and the clock behind them), and
        clears them. Returns the futures, the dense one (whose error is the
        clock's if it failed) first, and what they read."""
        names, grads = [], []
        futures = [f for f, _ in self._sent.values()]
        keep = [g for _, g in self._sent.values()]
        for d in self._dense:
            if d.param.grad is None or d.name in self._sent:
                continue
            if self.prefetch_with_push:
                g = self._host_grad(d)
                futures.append(self._push_one(d, g))
                keep.append(g)
                continue
            names.append(d.name)
            grads.append(_host_view(self._host_grad(d)))
        for s in self._sparse:
            g = s.param.grad
            if g is None:
                continue
            g = g.coalesce() if g.is_sparse else g.to_sparse().coalesce()
            keys = g.indices()[0].cpu().numpy().astype(np.uint64)
            values = g.values().to("cpu", torch.float32).contiguous()
            keep.append(values)
            futures.append(self.client._c.rows_async(1, s.name, keys,
                                                     _host_view(values)))
        if self._state:
            # This worker's buffers as they are after its step, copied: the
            # next forward updates them while these are on their way.
            state = [d.param.detach().to("cpu", torch.float32, copy=True)
                     for d in self._state]
            keep += state
            futures.append(self.client._c.assign_many(
                self._state_names, [_host_view(s) for s in state]))
        # The dense pushes and the clock behind every push: one call, one
        # future, whose error is the clock's if it failed.
        dense = self.client._c.push_many(names, grads, clock)
        self._sent.clear()
        for d in self._dense:
            d.param.grad = None
        for s in self._sparse:
            s.param.grad = None
        return [dense] + futures, keep + grads

    def push(self, clock=False, pull=False):
        """Sends every parameter's .grad (all at once), then clears them.
        A parameter without a gradient is not pushed, nor one already sent
        during backward (push_in_backward). With `clock`, the clock that
        ends the iteration goes right behind the pushes (the shards apply
        it after them) instead of after their answers; it happens even
        when a push is refused, and its own error, if any, is the one
        raised. With `pull` too, the next pull() goes right behind the
        clock, so it is read at the new clock and travels while the
        pushes are answered."""
        futures, _ = self._send(clock)
        pulling = self.pull_start() if clock and pull else None
        try:
            _results(futures)  # the dense push's error (the clock's) wins
        except BaseException:
            if pulling is not None:  # its buffers are in use until it ends
                try:
                    self.pull_finish(pulling)
                except Exception:  # noqa: BLE001 -- the push's error wins
                    pass
            raise
        if pulling is not None:
            self.pull_finish(pulling)

    def close(self):
        """Removes the hooks push_in_backward registered."""
        for h in self._hooks:
            if hasattr(h, "remove"):
                h.remove()
        self._hooks = []

    def clock(self):
        """Ends this worker's iteration."""
        self.client.clock()

    def step(self):
        """push(clock=True) and the next pull(), sent right behind it; after
        prefetch() (overlap_steps), the pushes and the clock, not awaited,
        and the prefetched values put in the module."""
        if self._prefetching is not None:
            return self._step_overlapped()
        self.push(clock=True, pull=True)


def _results(futures):
    """Waits for every future; raises the first error after all ended."""
    first = None
    for f in futures:
        try:
            f.result()
        except Exception as e:  # re-raised below; Ctrl-C ends the wait now
            if first is None:
                first = e
    if first is not None:
        raise first


class ChunkSampler(torch.utils.data.Sampler):
    """Dataset indices from the coordinator's chunked handout: a worker
    asks for the next chunk when it has used the last, so faster workers
    take more rows, and every row is used once per epoch (a dead worker's
    chunk goes to another). Every worker of the run must use the same
    dataset_len, chunk_rows and epochs.

    `epoch` is the epoch of the chunk being handed out.
    """

    def __init__(self, client, dataset_len, chunk_rows, epochs):
        self.client = client
        self.dataset_len = int(dataset_len)
        self.chunk_rows = int(chunk_rows)
        self.epochs = int(epochs)
        self.epoch = 0

    def __iter__(self):
        order, order_epoch = None, -1
        while True:
            chunk = self.client.next_chunk(self.dataset_len, self.chunk_rows,
                                           self.epochs)
            if chunk.count == 0:
                if chunk.finished:
                    return
                # Others hold the last chunks and one may come back. Keep
                # the clock moving meanwhile, so no one waits for this one.
                self.client.clock()
                time.sleep(0.1)
                continue
            if chunk.epoch != order_epoch:
                order = worker_share(self.dataset_len, 0, 1, self.client.seed,
                                     chunk.epoch)
                order_epoch = chunk.epoch
            self.epoch = chunk.epoch
            yield from order[chunk.first:chunk.first + chunk.count].tolist()
