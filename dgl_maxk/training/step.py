"""The one training step of full-graph and mini-batch training (and of the benchmarks).

``train_step`` takes the graph the model runs on (a DGLGraph, or the list of sampled blocks),
the input features of its source nodes, and the labels of the rows the loss is taken over.
"""
from __future__ import annotations

import contextlib
import threading
import warnings

import torch
from torch.nn import functional as F

from ..sampling.loader import SAMPLER_THREAD
from ..sparse import deferred_checks, raise_recorded_flags, recorded_checks, recorded_flags
from .precision import autocast


def make_optimizer(parameters, lr, weight_decay=0.0):
    """The trainer's optimizer: Adam, fused into one kernel per step on GPUs (the same update;
    the per-tensor launches of the default implementation cost more host time than a
    mini-batch step's kernels)."""
    parameters = list(parameters)
    fused = bool(parameters) and all(p.is_cuda for p in parameters)
    return torch.optim.Adam(parameters, lr=lr, weight_decay=weight_decay, fused=fused or None)


def loss_fn(logits, labels, multilabel):
    """Binary cross-entropy for multi-label data, cross-entropy otherwise (the mean over
    rows of -log softmax at the label: ``F.cross_entropy``'s value, through a gather, since
    its CUDA reduction runs in one thread block, 1.4 ms each way on 200k rows)."""
    if multilabel:
        return F.binary_cross_entropy_with_logits(logits, labels)
    if labels.dim() != 1 or labels.dtype not in (torch.int64, torch.int32):
        return F.cross_entropy(logits, labels)  # probabilities, or a shape to reject
    return -F.log_softmax(logits, 1).gather(1, labels.long().unsqueeze(1)).mean()


def drop_input(x, p):
    """Dropout on input features (training only); on the stored values of a sparse input."""
    if not p:
        return x
    if x.is_sparse:
        with warnings.catch_warnings():  # torch 2.11 warns even when told not to check
            warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly")
            return torch.sparse_coo_tensor(x.indices(), F.dropout(x.values(), p), x.shape,
                                           is_coalesced=True, check_invariants=False)
    return F.dropout(x, p)


def train_step(model, graph, features, labels, optimizer, *, rows=None, multilabel=False,
               input_dropout=0.0, precision="tf32"):
    """One optimisation step: input dropout, the forward pass under ``precision``'s autocast,
    the loss over ``rows`` of the output (all rows when None; ``labels`` holds those rows'
    labels), backward, and the optimizer's step.

    The layers' NaN scans are deferred (:func:`dgl_maxk.deferred_checks`): the step waits for
    the GPU once, at its end, and raises the first NaN of any layer's input, with its
    position, with the weights untouched (:func:`optimizer_step_checked`). Returns the loss
    as a detached 0-d tensor on the device. The matmul precision is the caller's (see
    :func:`dgl_maxk.training.precision.precision_scope`). :class:`FullGraphStep` repeats this
    step on one graph, replayed from a CUDA graph on GPUs.
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    with recorded_checks() as pending:
        loss = _forward_backward(model, graph, features, labels, rows, multilabel,
                                 input_dropout, precision)
    optimizer_step_checked(optimizer, pending)
    return loss


def skips_on_the_gpu(optimizer) -> bool:
    """Whether ``optimizer`` takes AMP's ``found_inf`` (a fused one) and skips its step on
    the GPU where it is set."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def optimizer_step_checked(optimizer, pending: list, flags=None):
    """The optimizer's step after a forward and backward whose NaN scans ``pending`` recorded
    (:func:`dgl_maxk.sparse.recorded_checks`): a NaN is raised, with its position, and the
    weights and the optimizer's state stay as they were. A fused optimizer (one that takes
    AMP's ``found_inf``) is queued first, told to skip on the GPU where a scan found a NaN,
    and the scans are read after it, so the host's one wait covers its kernels too (reading
    first left the GPU idle while the host launched them: 0.4 ms of each Reddit-sized epoch
    on an H200). Other optimizers step after the read. ``flags``: the scans' flags where a
    replay stacked them already (:func:`capture`)."""
    flags = recorded_flags(pending) if flags is None else flags
    if flags is None or not skips_on_the_gpu(optimizer):
        raise_recorded_flags(pending, flags)
        optimizer.step()
        return
    step_skipping(optimizer, found_nan(flags))
    raise_recorded_flags(pending, flags)


def found_nan(flags) -> torch.Tensor:
    """Whether a scan of ``flags`` (:func:`~dgl_maxk.sparse.recorded_flags`) found a NaN: a
    0-d bool tensor on their device (no synchronisation)."""
    return flags[:, 0].gt(0).any()


def step_skipping(optimizer, skip: torch.Tensor):
    """``optimizer.step()`` of a fused optimizer (:func:`skips_on_the_gpu`), skipped on the
    GPU where ``skip`` (0-d, on the parameters' device) is true."""
    optimizer.found_inf = skip.float()
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf


def _forward_backward(model, graph, features, labels, rows, multilabel, input_dropout,
                      precision, autocast_cache=True):
    x = drop_input(features, input_dropout)
    with autocast(precision, features.device.type, autocast_cache):
        logits = model(graph, x)
        if rows is not None:
            logits = logits[rows]
        loss = loss_fn(logits.float(), labels, multilabel)
    loss.backward()
    return loss.detach()


class FullGraphStep:
    """:func:`train_step` on one graph and one set of tensors, as full-graph training repeats
    it every epoch; call it for each step.

    On a GPU the forward and backward (input dropout and loss included) are captured in a
    CUDA graph and replayed: one launch for the step's few hundred kernels, without the
    host's gaps between them. The first call is :func:`train_step` (plans, kernels and lazy
    state are made); the second runs its step on a side stream, as capture needs, watching
    for torch's synchronising calls (:func:`probe`), then captures; later calls replay. Each
    call then runs the optimizer's step and reads the NaN scans the replay refreshed (one
    synchronisation), as :func:`train_step` does, so bad input still raises with the weights
    unchanged.

    A replay keeps what was in effect at the capture: the matmul precision and the model's
    structure (parameters are updated in place, so replays see every step's weights). A
    change of which parameters require gradients or of the optimizer's parameter groups
    makes the step capture again. ``rows`` given as a mask becomes indices once, here (one
    synchronisation, not one per step). The step stays :func:`train_step` where capture does
    not apply: off the GPU, a distributed model, sparse features, ``cuda_graph=False``, or a
    step that reads tensors on the host (found by the second call, which runs its step to
    the end, then warns once, with the reason; that step and the next ones are eager). A
    capture that fails past that check (an extension synchronising outside torch) raises: it
    leaves torch's CUDA state unusable in this process.
    """

    def __init__(self, model, graph, features, labels, optimizer, *, rows=None,
                 multilabel=False, input_dropout=0.0, precision="tf32", cuda_graph=True):
        if rows is not None and rows.dtype == torch.bool:
            num_rows = graph.num_dst_nodes() if hasattr(graph, "num_dst_nodes") else None
            if num_rows is not None and rows.shape != (num_rows,):
                raise IndexError(f"the rows mask has shape {tuple(rows.shape)} but the "
                                 f"graph's output has {num_rows} rows")
            rows = rows.nonzero().squeeze(1)
        self.model, self.graph, self.features, self.labels = model, graph, features, labels
        self.optimizer, self.rows = optimizer, rows
        self.options = dict(multilabel=multilabel, input_dropout=input_dropout,
                            precision=precision)
        self.graphed = cuda_graph and _capturable(model, features)
        self._calls = 0
        # (CUDA graph, loss, recorded NaN scans, their flags, static gradients)
        self._replay = None
        self._captured_for = None  # what the capture assumed: _trained_parameters()

    def __call__(self) -> torch.Tensor:
        self._calls += 1
        if not self.graphed or self._calls == 1:
            return self._eager()
        if self._replay is not None and self._trained_parameters() != self._captured_for:
            self._replay = None  # other parameters to train: capture again at the next call
            return self._eager()
        if self._replay is None:
            return self._probe_and_capture()
        cuda_graph, loss, pending, flags, grads = self._replay
        cuda_graph.replay()
        self.model.train()  # the host's part of the step, while the GPU replays
        for p, g in grads:  # replays write these; put back any the caller set to None
            p.grad = g
        loss = loss.clone()  # the graph's loss is overwritten by the next replay
        optimizer_step_checked(self.optimizer, pending, flags)
        return loss

    def _eager(self):
        return train_step(self.model, self.graph, self.features, self.labels, self.optimizer,
                          rows=self.rows, **self.options)

    def _trained_parameters(self):
        return trained_parameters(self.model, self.optimizer)

    def _forward_backward(self, autocast_cache=True):
        return _forward_backward(self.model, self.graph, self.features, self.labels,
                                 self.rows, autocast_cache=autocast_cache, **self.options)

    def _probe_and_capture(self):
        self.model.train()
        loss, capturable = probe(self.features.device, self._probed_step)
        self.optimizer.step()
        if capturable:
            self._capture()
        elif capturable is False:  # this step ran eagerly, as the next ones will
            self.graphed = False
        return loss

    def _probed_step(self):
        self.optimizer.zero_grad(set_to_none=True)
        return self._forward_backward()

    def _capture(self):
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        stepped = [p.grad for p in params]  # this step's, kept where the graph's will be
        self.optimizer.zero_grad(set_to_none=True)  # the backward makes them in the graph
        replay = capture(lambda: self._forward_backward(autocast_cache=False))
        for p, g in zip(params, stepped):
            if p.grad is not None and g is not None:
                p.grad.copy_(g)
        self._replay = (*replay, [(p, p.grad) for p in params])
        self._captured_for = self._trained_parameters()


def trained_parameters(model, optimizer):
    """What a capture assumes of the training: which parameters require gradients, and the
    optimizer's parameter groups."""
    return ([(id(p), p.requires_grad) for p in model.parameters()],
            [[id(p) for p in group["params"]] for group in optimizer.param_groups])


def probe(device, step):
    """Run ``step()`` (a forward and backward) once on a side stream, as capture would,
    watching for torch's calls that wait for the GPU; its deferred NaN checks are read after.
    Returns (its loss, whether it can be captured). A step that synchronised ran eagerly to
    its end: False, and a warning says why. None: the watch was disturbed (another thread
    reset the warning filters meanwhile), so probe again at another step."""
    current, side = torch.cuda.current_stream(device), torch.cuda.Stream(device)
    side.wait_stream(current)
    found = []
    with torch.cuda.stream(side):
        with deferred_checks(), _synchronisations_recorded(found):
            loss = step()
    current.wait_stream(side)
    reads = [message for message in found if message is not None]
    if reads:
        warnings.warn(f"the training step reads a tensor on the host, so it cannot be "
                      f"captured in a CUDA graph; it runs eagerly ({reads[0]})", RuntimeWarning)
        return loss, False
    return loss, None if found else True


def capture(step):
    """(CUDA graph, loss, recorded NaN scans, their flags) of ``step()`` captured on a side
    stream; a failure raises (past :func:`probe`'s check it is not recoverable in this
    process). The flags (:func:`~dgl_maxk.sparse.recorded_flags`) are stacked by each replay
    (no host work per step), or None without scans or where a scan is on the host."""
    cuda_graph = torch.cuda.CUDAGraph()
    try:
        # thread-local: the device sampler's thread goes on synchronising meanwhile
        with recorded_checks() as pending, torch.cuda.graph(
                cuda_graph, capture_error_mode="thread_local"):
            loss = step()
            on_device = all(t.is_cuda for _, _, count, first, *_ in pending
                            for t in (count, first))
            flags = recorded_flags(pending) if on_device else None
    except Exception as err:  # torch's CUDA generator and allocator stay in capture state
        raise RuntimeError(
            "the training step could not be captured in a CUDA graph; train without capture "
            "(train.cuda_graph / sampling.cuda_graph: false, or cuda_graph=False)") from err
    return cuda_graph, loss, pending, flags


@contextlib.contextmanager
def _synchronisations_recorded(found: list):
    """The messages of torch's CUDA calls that wait for the GPU inside the block, appended to
    ``found``. The device sampler's thread, which samples ahead meanwhile, is not watched:
    torch's check is process-wide, so it is set to warn, and the warnings of that thread are
    dropped (capture itself watches only its own thread)."""
    shown = warnings.showwarning

    def record(message, category, *args, **kwargs):
        if "synchronizing CUDA operation" not in str(message):
            shown(message, category, *args, **kwargs)
        elif threading.current_thread().name != SAMPLER_THREAD:
            found.append(str(message))

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():  # torch calls the mode a prototype each time it is set
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        warnings.filterwarnings("always", message=".*synchronizing CUDA operation")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)
            # another thread's catch_warnings may have put the hook back meanwhile
            if warnings.showwarning is not record or not any(
                    f[0] == "always" and f[1] is not None and "synchronizing" in f[1].pattern
                    for f in warnings.filters):
                found.append(None)


def _capturable(model, features) -> bool:
    return (features.is_cuda and not features.is_sparse
            and not isinstance(model, torch.nn.parallel.DistributedDataParallel))
