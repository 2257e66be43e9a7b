"""The mini-batch training step, replayed from a CUDA graph over blocks of fixed sizes.

A sampled step launches a few hundred kernels for blocks of a few thousand to a few hundred
thousand nodes, so on a GPU the host's launches bound it, not the kernels (measured:
docs/performance.md). Capture needs the same shapes at every replay, and every batch's
blocks differ: each batch's blocks are copied into blocks of fixed sizes and one captured
forward and backward is replayed over them. The sizes are the first full batch's with some
headroom (batches of one graph differ by a few percent); a batch that does not fit grows
them (a new capture). Sizing for the most nodes and edges the fan-outs allow instead
doubled every kernel's work on a products-sized graph, where sampled neighbourhoods overlap.

Padding keeps each block a valid CSR within the sampler's degree bound, both ways. The
real destination rows come first with their edges; padding rows after them take the
remaining edge slots, at most a fan-out each, from the source rows right after the real
ones, each the source of at most a fan-out of them (the transposed CSR has no long row
either). Those padding sources sit right after the real ones so that the transposed CSR's
empty rows all come last: cuSPARSE's SpMM (ReLU's backward) took 80x as long with a run of
empty rows between the real source rows and padding ones (H200, docs/performance.md). Real rows
read only real rows, and the loss is taken over the real seeds, so the real rows compute
what they would unpadded, and the padding rows add nothing to the gradients.
"""
from __future__ import annotations

import math

import torch

from ..sparse import SampledBlock, raise_recorded_flags, recorded_checks, recorded_flags
from .distributed import is_distributed
from .step import (_forward_backward, capture, found_nan, optimizer_step_checked, probe,
                   skips_on_the_gpu, step_skipping, train_step, trained_parameters)


def graph_applies(device, sampler: str) -> bool:
    """Whether a graphed step can apply: a GPU and the device sampler's blocks."""
    return torch.device(device).type == "cuda" and sampler == "device"


def _paddable(fanouts) -> bool:
    """Whether every block of these fan-outs has a degree bound to pad to (no -1)."""
    return all(f > 0 for f in fanouts)


def resolve_cuda_graph(setting, *, device, sampler: str, world: int, fanouts) -> bool:
    """Whether mini-batch steps are to replay a CUDA graph, by ``sampling.cuda_graph``:
    True where a graphed step applies, False never; ``"auto"`` for models trained by one
    process where a graphed step applies. Fan-outs of -1 leave nothing to pad to.
    Measured on an H200 (docs/performance.md): graphed steps 1.3-1.9x the eager ones' seeds
    per second, MaxK and ReLU; under torchrun the graphed step's own all-reduce was not
    measured through the trainer, which keeps DDP there."""
    if not _paddable(fanouts):
        return False
    if setting != "auto":
        return bool(setting) and graph_applies(device, sampler)
    return world == 1 and graph_applies(device, sampler)


def _bounds(fanouts, batch_size, num_nodes):
    """(destination, source) node bounds per layer, input layer first."""
    bounds, dst = [], batch_size
    for fanout in reversed(fanouts):
        src = max(dst, min(num_nodes, dst * (1 + fanout)))
        bounds.insert(0, (dst, src))
        dst = src
    return bounds


#: Headroom of a :class:`PaddedBatch` sized by real batches over the largest (and below the
#: smallest edge count) seen. Every replay computes the padding, so it is kept small: a
#: products-sized graph's batches of 1,024 vary by 2% over an epoch. A batch outside it
#: grows the sizes to 5% past it, so batches that vary by a factor v grow them about
#: log(v) / log(1.05) times at most (4 for 20%), each at the cost of an eager step and a
#: capture.
_MARGIN = 1.05


def batch_sizes(blocks) -> list:
    """Per layer of a batch: (destination rows, source rows, edges), input layer first."""
    return [(b.num_dst_nodes(), b.num_src_nodes(), b.num_edges()) for b in blocks]


def seen_sizes(blocks) -> list:
    """What :class:`PaddedBatch` is sized by (``seen``), for one batch: per layer the most
    destination and source rows, and the fewest and most edges."""
    return [(d, s, e, e) for d, s, e in batch_sizes(blocks)]


def _layout(fanouts, bounds, seen):
    """Per layer (real rows, padding rows, edge slots) and the source rows of the input
    layer, for batches like the ``seen`` ones (per layer: most destination rows, most source
    rows, fewest and most edges), with :data:`_MARGIN` headroom and never above the most the
    fan-outs allow (``bounds``).

    The padding rows take the edge slots the real rows leave, at most a fan-out each, and
    are the sources of the padding edges, so they hold the most slots a fitting batch can
    leave: (slots - fewest edges) / fan-out."""
    real, window, slots = [], [], []
    for (dst_bound, _), f, (most_dst, _, fewest, most) in zip(bounds, fanouts, seen):
        cap = min(dst_bound * f, math.ceil(most * _MARGIN))
        slots.append(cap)
        real.append(min(dst_bound, math.ceil(most_dst * _MARGIN)))
        # at least one: a layer seen without edges still has its padding source
        window.append(min(dst_bound, max(1, math.ceil((cap - int(fewest / _MARGIN)) / f))))
    for layer in range(len(window) - 2, -1, -1):  # a layer's padding rows are the next's
        window[layer] = max(window[layer], window[layer + 1])  # padding sources
    input_rows = min(bounds[0][1], math.ceil(seen[0][1] * _MARGIN))
    return real, window, slots, input_rows


class PaddedBatch:
    """Fixed-size copies of a device sampler's batch: blocks, input features and labels.

    Layer l holds ``dst_cap[l]`` destination rows: up to ``dst_real[l]`` real ones, then
    ``pad_rows[l]`` padding rows that hold the edge slots the real rows leave; ``edge_cap[l]``
    edges; and ``src_cap[l]`` source rows (the padding edges come from the ``pad_rows[l]``
    rows right after the real ones); the features have ``src_cap[0]`` rows and the labels
    ``batch_size``. The sizes are those of the ``seen`` batches (:func:`seen_sizes` of real
    batches, merged by :meth:`grown`) with headroom (:data:`_MARGIN`), never above the most
    the fan-outs and the batch size allow, and far below it where the fan-outs overlap in
    the graph. :meth:`fits` says whether a batch can be copied in,
    :meth:`load` copies it (two copies per layer, no host synchronisation),
    :meth:`blocks` writes the padding and makes the blocks over the fixed tensors (inside a
    capture, so that every replay pads the batch loaded before it, from its sizes on the
    device, and rebuilds the plans).
    """

    def __init__(self, fanouts, batch_size, num_nodes, features, labels, seen):
        self.fanouts, self.batch_size = list(fanouts), int(batch_size)
        self.num_nodes, self.seen = int(num_nodes), seen
        bounds = _bounds(self.fanouts, self.batch_size, self.num_nodes)
        self.dst_real, self.pad_rows, self.edge_cap, input_rows = _layout(
            self.fanouts, bounds, seen)
        self.dst_cap = [r + w for r, w in zip(self.dst_real, self.pad_rows)]
        self.src_cap = ([max(input_rows + self.pad_rows[0], self.dst_cap[0])]
                        + self.dst_cap[:-1])
        device = features.device
        self.indptr = [torch.zeros(c + 1, dtype=torch.int64, device=device)
                       for c in self.dst_cap]
        self.indices = [torch.empty(e, dtype=torch.int64, device=device)
                        for e in self.edge_cap]
        self._row_ids = [torch.arange(c + 1, device=device) for c in self.dst_cap]
        self._edge_ids = [torch.arange(e, device=device) for e in self.edge_cap]
        # per layer: the loaded batch's destination rows, edges and source rows (none: all
        # padding until a batch is loaded)
        self._sizes = torch.zeros((len(self.fanouts), 3), dtype=torch.int64, device=device)
        self.features = torch.zeros((self.src_cap[0],) + features.shape[1:],
                                    dtype=features.dtype, device=device)
        self.labels = torch.zeros((self.batch_size,) + labels.shape[1:], dtype=labels.dtype,
                                  device=device)

    def grown(self, blocks) -> "PaddedBatch":
        """A batch sized for the batches this one was sized for and ``blocks``."""
        seen = [(max(d, a), max(s, b), min(e, c), max(e, x))
                for (d, s, e, _), (a, b, c, x) in zip(seen_sizes(blocks), self.seen)]
        return PaddedBatch(self.fanouts, self.batch_size, self.num_nodes, self.features,
                           self.labels, seen)

    def fits(self, blocks, features, labels) -> bool:
        """Whether this batch can be copied in: a full batch of the device sampler's blocks
        with these fan-outs, and features and labels like the first batch's."""
        if len(blocks) != len(self.fanouts) or not all(
                isinstance(b, SampledBlock) and b.device == self.features.device
                and b.plan.max_in_degree == f and b.num_dst_nodes() <= real
                and b.num_src_nodes() <= src - window
                and slots - window * f <= b.num_edges() <= slots
                for b, f, real, window, src, slots in zip(
                    blocks, self.fanouts, self.dst_real, self.pad_rows, self.src_cap,
                    self.edge_cap)):
            return False
        return (blocks[-1].num_dst_nodes() == self.batch_size
                and _like(features, self.features, blocks[0].num_src_nodes())
                and _like(labels, self.labels, self.batch_size))

    def load(self, blocks, features, labels):
        """Copy a batch that :meth:`fits` into the fixed tensors: its real rows and edges
        (two copies a layer), its sizes (one upload: :meth:`blocks` writes the padding from
        them), its features and labels; no host synchronisation."""
        sizes = []
        for layer, block in enumerate(blocks):
            plan = block.plan
            self.indptr[layer][:plan.num_dst + 1].copy_(plan.indptr)
            self.indices[layer][:plan.num_edges].copy_(plan.indices)
            sizes.append((plan.num_dst, plan.num_edges, plan.num_src))
        # through pinned memory: a copy from pageable memory would wait for the GPU
        self._sizes.copy_(torch.tensor(sizes, pin_memory=self._sizes.is_cuda),
                          non_blocking=True)
        self.features[:features.shape[0]].copy_(features)
        self.features[features.shape[0]:].zero_()  # no earlier batch's rows (nor their NaN)
        self.labels.copy_(labels)

    def _pad(self):
        """Write each layer's padding after the loaded batch's rows and edges: padding row
        i ends f * (i + 1) edge slots after the real ones, and padding edge j comes from
        source row (real source rows) + j % pad_rows: at most f edges a source (distinct
        sources within a row where f <= pad_rows)."""
        for layer, f in enumerate(self.fanouts):
            rows, edges, sources = self._sizes[layer]
            row, edge = self._row_ids[layer], self._edge_ids[layer]
            indptr, indices = self.indptr[layer], self.indices[layer]
            torch.where(row <= rows, indptr,
                        (edges + (row - rows) * f).clamp_(max=self.edge_cap[layer]),
                        out=indptr)
            torch.where(edge < edges, indices,
                        (edge - edges).remainder_(self.pad_rows[layer]).add_(sources),
                        out=indices)

    def blocks(self):
        """The loaded batch's blocks, fixed sizes, their padding written (call it where the
        step is replayed: the padding and the plans are made there)."""
        self._pad()
        return [SampledBlock(indptr, indices, _nodes(src, indptr.device), dst,
                             max_in_degree=fanout)
                for indptr, indices, src, dst, fanout in zip(
                    self.indptr, self.indices, self.src_cap, self.dst_cap, self.fanouts)]


def _like(x, fixed, rows) -> bool:
    return (isinstance(x, torch.Tensor) and not x.is_sparse and x.device == fixed.device
            and x.dtype == fixed.dtype and x.shape == (rows,) + fixed.shape[1:])


def _nodes(count, device):
    """A stand-in for a padded block's source node ids: only their number is read."""
    return torch.zeros(1, dtype=torch.int64, device=device).expand(count)


class SampledStep:
    """:func:`train_step` on a sampler's blocks, as mini-batch training runs it every batch;
    call it with each batch's ``(blocks, features, labels)``.

    On a GPU, batches of dgl_maxk's device sampler with its full batch size run over a
    :class:`PaddedBatch`, captured in a CUDA graph and replayed: the first such call runs
    eagerly (kernels and lazy state are made), the second is probed and captured as in
    :class:`~dgl_maxk.training.step.FullGraphStep`, later calls replay. Each call reads the
    NaN scans once and raises a NaN with the weights unchanged
    (:func:`~dgl_maxk.training.step.optimizer_step_checked`); a replay with a fused
    optimizer (the trainer's Adam) reads them one call later, so that the host queues the
    next step while the GPU runs this one: the call after a replay that met a NaN (or
    :meth:`read_checks`, which ends each of the trainer's epochs) raises it, and the
    weights are those from before that replay (the optimizer skips on the GPU in both
    steps). DGL's blocks, fan-outs of
    -1, models with a layer that refuses rows without in-edges
    (``allow_zero_in_degree=False``: padding rows have none), steps off the GPU, with
    ``cuda_graph=False``, or that read a tensor on the host (warned once, then every step)
    run :func:`train_step`. Padded steps draw their dropout
    masks over the padded rows: they give other random numbers than unpadded ones, the same
    ones replayed or not. ``padded_steps``, ``captures`` and ``replays`` count the full
    batches that ran eagerly over the padding (one after each sizing of it), were captured,
    and were replayed (a step whose capture was refused counts in none).

    Data parallel (under torchrun): with ``cuda_graph``, pass the model itself, not a
    DistributedDataParallel (whose hooks cannot be captured). The step then does what DDP
    does: the processes start from rank 0's parameters, and each step averages the
    gradients over them, here in one flat buffer per dtype, one all-reduce, before the
    optimizer. While the step is graphed or data-parallel, the parameters' gradients live in
    those buffers (also for the batches that do not fit). Without ``cuda_graph``, a DDP
    model runs :func:`train_step` as it is.
    """

    def __init__(self, model, optimizer, fanouts, batch_size, num_nodes, *, multilabel=False,
                 input_dropout=0.0, precision="tf32", cuda_graph=True):
        ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        if ddp and cuda_graph:
            raise TypeError("a graphed SampledStep averages the gradients over the processes "
                            "itself: pass the module, not a DistributedDataParallel")
        self.model, self.optimizer = model, optimizer
        self.options = dict(multilabel=multilabel, input_dropout=input_dropout,
                            precision=precision)
        self.data_parallel = is_distributed() and not ddp
        if self.data_parallel:  # DDP's start: every process from rank 0's weights
            for tensor in model.state_dict().values():
                torch.distributed.broadcast(tensor, 0)
        self.sizes = (list(fanouts), int(batch_size), int(num_nodes))
        # padding rows have no in-edges: a layer that refuses those would refuse every padded
        # block (and its check reads the graph on the host)
        self.graphed = (cuda_graph and _paddable(fanouts) and not any(
            getattr(m, "_allow_zero_in_degree", True) is False for m in model.modules()))
        self.batch = None  # the PaddedBatch, made at the first batch that can use it
        # full batches by how they ran: eagerly over the padding (the first after each
        # sizing), captured, replayed
        self.padded_steps = self.captures = self.replays = 0
        self._warm = False  # whether a padded step ran eagerly since the last capture
        self._replay = None  # (CUDA graph, loss, recorded NaN scans, their flags)
        self._grads = None  # (parameter, its gradient's view of a flat buffer), flat buffers
        self._grads_for = None  # the trained parameters the buffers were made for
        # the last replay's NaN scans, not read yet: (scans, their flags on the host, the
        # device's "found one" flag, the event after which the host flags hold them)
        self._unread = None

    def __call__(self, blocks, features, labels) -> torch.Tensor:
        if self.graphed and features.is_cuda and self._fits(blocks, features, labels):
            self.batch.load(blocks, features, labels)
            return self._graphed_step()
        self.read_checks()  # before a step that reads its own
        if self.data_parallel or (self.graphed and self.batch is not None):
            return self._step(lambda: self._forward_backward(blocks, features, labels, None))
        return train_step(self.model, blocks, features, labels, self.optimizer, **self.options)

    def _graphed_step(self):
        self._bind_grads()  # new buffers (other trained parameters) drop the capture
        if self._replay is not None:
            # a replay runs no module's code (its graph holds the training forward): the
            # walk that sets every module's mode, a third of a millisecond of the host's
            # time a step, is left to the steps that run the modules
            if not self.model.training:
                self.model.train()
            return self._replayed()
        self.model.train()
        self.read_checks()
        if not self._warm:
            self._warm = True
            self.padded_steps += 1
            return self._step(self._padded)
        return self._probe_and_capture()

    def _fits(self, blocks, features, labels) -> bool:
        """Whether this batch runs over :attr:`batch`, made at the first full batch and
        sized for it, and grown (the capture dropped) for a full batch that does not fit."""
        fanouts, batch_size, _ = self.sizes
        full = (len(blocks) == len(fanouts) and all(isinstance(b, SampledBlock)
                                                    for b in blocks)
                and blocks[-1].num_dst_nodes() == batch_size)
        if self.batch is None:
            if not full:
                return False  # not a full batch of the device sampler: nothing to allocate
            batch = PaddedBatch(*self.sizes, features, labels, seen_sizes(blocks))
            if not batch.fits(blocks, features, labels):
                self.graphed = False  # blocks of other fan-outs: no batch will fit
                return False
            self.batch = batch
        if self.batch.fits(blocks, features, labels):
            return True
        if not full:
            return False
        grown = self.batch.grown(blocks)
        if not grown.fits(blocks, features, labels):
            return False  # other features or fan-outs: this batch runs eagerly
        self.batch, self._replay, self._warm = grown, None, False
        return True

    def _bind_grads(self):
        """Point each trained parameter's gradient at its slice of a flat buffer, which the
        backward adds into in place. The buffers are made again when the trained parameters
        change (and a capture writing the old ones is dropped); the others' gradients are
        then None, as after ``zero_grad``."""
        trained = trained_parameters(self.model, self.optimizer)
        if self._grads is None or self._grads_for != trained:
            self._replay, self._warm = None, False
            for p in self.model.parameters():
                p.grad = None
            self._grads_for = trained
            params = [p for p in self.model.parameters() if p.requires_grad]
            flats = {}
            for p in params:
                flats.setdefault((p.dtype, p.device), []).append(p)
            views, buffers = [], []
            for group in flats.values():
                flat = torch.zeros(sum(p.numel() for p in group), dtype=group[0].dtype,
                                   device=group[0].device)
                views += zip(group, torch.split(flat, [p.numel() for p in group]))
                buffers.append(flat)
            self._grads = ([(p, g.view_as(p)) for p, g in views], buffers)
        for p, g in self._grads[0]:
            p.grad = g

    def _forward_backward(self, blocks, features, labels, rows, autocast_cache=True):
        """The model's forward and backward, adding into the zeroed flat gradients."""
        for flat in self._grads[1]:
            flat.zero_()
        return _forward_backward(self.model, blocks, features, labels, rows,
                                 autocast_cache=autocast_cache, **self.options)

    def _padded(self, autocast_cache=True):
        batch = self.batch
        return self._forward_backward(batch.blocks(), batch.features, batch.labels,
                                      slice(0, batch.batch_size), autocast_cache)

    def _finish(self, pending: list, flags=None):
        """The NaN scans ``pending`` recorded (``flags``: stacked by a replay), read; the
        gradients averaged over the processes (data parallel); the optimizer's step
        (:func:`optimizer_step_checked`)."""
        if not self.data_parallel:
            optimizer_step_checked(self.optimizer, pending, flags)
            return
        # before this process's gradients reach the others'
        raise_recorded_flags(pending, recorded_flags(pending) if flags is None else flags)
        for flat in self._grads[1]:  # a sum, then the mean (gloo has no average)
            torch.distributed.all_reduce(flat)
            flat.div_(torch.distributed.get_world_size())
        self.optimizer.step()

    def _step(self, forward_backward):
        """An eager step: ``forward_backward()``, then :meth:`_finish`."""
        self.model.train()
        self._bind_grads()
        with recorded_checks() as pending:
            loss = forward_backward()
        self._finish(pending)
        return loss

    def _probe_and_capture(self):
        loss, capturable = probe(self.batch.features.device, self._padded)
        self._finish([])  # the probe read its checks
        if not capturable:  # False: this step ran eagerly, as the next ones will
            self.graphed = capturable is None
            return loss
        # capture records the kernels without running them: the gradients stay this step's
        self._replay = capture(lambda: self._padded(autocast_cache=False))
        self.captures += 1
        return loss

    def _replayed(self):
        cuda_graph, loss, pending, flags = self._replay
        cuda_graph.replay()
        loss = loss.clone()  # the graph's loss is overwritten by the next replay
        self.replays += 1  # also where the read below raises: this batch was replayed
        if self.data_parallel or not pending or not skips_on_the_gpu(self.optimizer):
            self._finish(pending, flags)
        else:  # flags None: a scan on the host, stacked here
            self._step_and_read_the_last(pending, recorded_flags(pending)
                                         if flags is None else flags)
        return loss

    def _step_and_read_the_last(self, pending: list, flags):
        """The optimizer's step, skipped on the GPU where this replay's scans or the unread
        ones of the last replay found a NaN; this replay's flags copied to the host behind
        it; then the last replay's read (the GPU runs this one meanwhile)."""
        found = found_nan(flags)  # a new tensor: the next replay does not overwrite it
        last = self._unread
        step_skipping(self.optimizer, found if last is None else found | last[2])
        host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
        host.copy_(flags, non_blocking=True)
        copied = torch.cuda.current_stream(flags.device).record_event()
        self._unread = (pending, host, found, copied)
        if last is not None:
            _raise_read(last)

    def read_checks(self):
        """Read the NaN scans of the last replay if they are not read yet (they are read one
        call later: see the class), and raise the NaN they found; the weights are then
        those from before that replay."""
        unread, self._unread = self._unread, None
        if unread is not None:
            _raise_read(unread)


def _raise_read(unread):
    """Wait for the copy of a replay's flags to the host, then raise the first NaN."""
    pending, host, _, copied = unread
    copied.synchronize()
    raise_recorded_flags(pending, host)
