"""Mini-batches of sampled blocks, produced ahead of the training step.

:class:`NeighborLoader` is the device sampler's counterpart of DGL's ``DataLoader``: one
pass over the seed nodes per iteration, shuffled from its ``seed``, this process's share of
them under data parallelism, and each batch sampled ahead on its own CUDA stream while the
steps before it compute, with its input nodes' feature rows when given a feature table
(gathered there too; rows in host memory cross the bus on a copy engine, so that the bus's
time overlaps the step's and the step keeps the SMs). On a GPU the caller's thread queues
each batch's kernels a batch ahead, then reads its sizes once when it is due, by which time
the GPU has made it; ``prefetch`` producer threads instead sample at the same time, each a
batch ahead (for host rows, whose gather is the CPU's work). The batches and their order
depend only on ``seed``, the pass number, the rank and the number of processes, not on
``prefetch`` or timing.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import numbers
import queue
import threading
from typing import NamedTuple

import torch

from ..sparse import input_checks
from .rows import check_table, gather_rows, staged_rows
from .sampler import (DeviceGraph, NeighborSampler, captured_sampler, check_device_graph,
                      check_seeds)

#: The name of the thread that samples ahead (a step watching its own synchronisations
#: leaves this thread's out).
SAMPLER_THREAD = "dgl_maxk-sampler"
#: torch.Generator.manual_seed takes seeds below 2^64; the derived seeds of large run seeds
#: (run seed x 100003 x 100003 x 1009) go past it. Reducing modulo 2^64 keeps every seed
#: that fitted, so their batches do not change.
_SEED_RANGE = 1 << 64


def _mixed_seed(*values) -> int:
    """A 64-bit seed from integers (splitmix64's finaliser over each in turn): seeds of
    distinct tuples (pass, rank, batch) collide only by chance, at 2^-64."""
    x = 0
    for value in values:
        x = (x + value + 0x9E3779B97F4A7C15) % _SEED_RANGE
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % _SEED_RANGE
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % _SEED_RANGE
        x ^= x >> 31
    return x


class NeighborLoader:
    """Iterate over (input_nodes, output_nodes, blocks) for batches of ``seeds``; with
    ``features``, (input_nodes, output_nodes, blocks, input_features).

    Parameters
    ----------
    graph : DeviceGraph
    seeds : Tensor (num_seeds,)
        Global node ids, no repeats
    sampler : NeighborSampler
        Its ``start`` queues each batch (a NeighborSampler itself: on a GPU, full batches
        replayed by a :class:`~dgl_maxk.sampling.CapturedSampler`); a subclass's own
        ``sample``, where it has one, makes each batch instead
    batch_size : int
    shuffle : bool
        A new order each pass, from ``seed`` and the pass number
    drop_last : bool
    seed : int
        The shuffle's and the sampler's random streams
    rank : int
        This process's part of the seeds
    world_size : int
        The processes: the shuffled seeds are cut into ``world_size`` equal parts (wrapping
        around to fill the last), so every process runs the same number of steps
    prefetch : int, optional
        Producer threads, each sampling a batch ahead (batch i on thread i % prefetch), at
        the same time, so that up to twice as many batches are held (one queued, one in the
        making, per thread) and ``sampler.start`` runs on several threads at once; 0
        samples in the caller's thread, on a GPU a batch ahead on a side stream (its kernels
        queued when the batch before is due, its sizes read when it is). Default: 2 for
        features in host memory on a GPU (the CPU gathers their rows, which threads overlap
        with the step), else 0 (threads share the interpreter with the step: docs'
        performance notes)
    features : Tensor, optional
        Every node's input rows, on the graph's device or in host memory: each batch then
        carries its input nodes' rows, gathered where and when it is sampled
        (:func:`~dgl_maxk.sampling.gather_rows`; from host memory to a GPU
        :func:`~dgl_maxk.sampling.staged_rows`: the CPU gathers, a copy engine carries)
    """

    def __init__(self, graph: DeviceGraph, seeds, sampler: NeighborSampler, batch_size, *,
                 shuffle=True, drop_last=False, seed=0, rank=0, world_size=1,
                 prefetch=None, features=None):
        check_device_graph(graph)
        if not isinstance(sampler, NeighborSampler):
            raise TypeError(f"sampler must be a dgl_maxk.sampling.NeighborSampler, got "
                            f"{type(sampler).__name__}")
        if prefetch is None:
            prefetch = 2 if (graph.device.type == "cuda" and features is not None
                             and features.device.type == "cpu") else 0
        counts = dict(batch_size=batch_size, prefetch=prefetch, rank=rank,
                      world_size=world_size)
        wrong = [f"{k}={v!r}" for k, v in counts.items()
                 if not isinstance(v, numbers.Integral) or isinstance(v, bool)]
        if wrong:
            raise TypeError(f"{', '.join(wrong)}: must be "
                            + ("an integer" if len(wrong) == 1 else "integers"))
        seeds = check_seeds(seeds, graph.num_nodes).cpu()
        if features is not None:  # its rows are then read without a check of the ids
            check_table("features", features, graph.num_nodes, graph.device)
        if batch_size < 1 or prefetch < 0 or not 0 <= rank < world_size:
            raise ValueError(f"need batch_size >= 1, prefetch >= 0 and 0 <= rank < "
                             f"world_size; got {batch_size}, {prefetch}, {rank}, {world_size}")
        self.graph, self.seeds, self.sampler = graph, seeds, sampler
        self.batch_size, self.shuffle, self.drop_last = int(batch_size), shuffle, drop_last
        self.seed, self.rank, self.world_size = int(seed), rank, world_size
        self.prefetch = int(prefetch)
        self.features = features
        self._gather = (staged_rows if features is not None and features.device.type == "cpu"
                        and graph.device.type == "cuda" else gather_rows)
        self.passes = 0

    def _share(self, pass_seed: int) -> torch.Tensor:
        """This process's seeds for the pass of ``pass_seed``, in order."""
        order = self.seeds
        if self.shuffle:
            gen = torch.Generator().manual_seed(pass_seed % _SEED_RANGE)
            order = order[torch.randperm(order.numel(), generator=gen)]
        per_rank = -(-order.numel() // self.world_size)
        if per_rank * self.world_size > order.numel() > 0:
            order = order.repeat(-(-per_rank * self.world_size // order.numel()))
        return order[self.rank * per_rank:(self.rank + 1) * per_rank]

    def __len__(self):
        per_rank = -(-self.seeds.numel() // self.world_size)
        full, rest = divmod(per_rank, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _start(self, share, pass_seed: int, i: int, captured=None):
        """Batch ``i`` of the pass, its kernels queued (:meth:`NeighborSampler.start`, or
        for a full batch the replay of the sampler ``captured()`` gives, if any; a
        subclass's own ``sample`` runs as it is written): its own random stream (from the
        pass, the rank and ``i``), so that batches sampled at the same time on several
        threads, or ahead, are those sampled one after another."""
        generator = torch.Generator(device=self.graph.device).manual_seed(
            _mixed_seed(pass_seed, self.rank, i))
        seeds = share[i * self.batch_size:(i + 1) * self.batch_size]
        replayed = (captured() if captured is not None and seeds.numel() == self.batch_size
                    else None)
        if replayed is not None:
            return replayed.start(seeds, generator)
        with input_checks(False):  # the seeds were checked at construction
            if type(self.sampler).sample is not NeighborSampler.sample:
                return _Sampled(self.sampler.sample(self.graph, seeds, generator))
            return self.sampler.start(self.graph, seeds, generator)

    def _captured(self):
        """A :func:`captured_sampler` for this loader's full batches: for a
        NeighborSampler itself (a subclass's ``start`` or ``sample`` runs as written)."""
        if type(self.sampler) is not NeighborSampler:
            return contextlib.nullcontext()
        return captured_sampler(self.graph, self.sampler.fanouts, self.batch_size)

    def _finish(self, pending):
        """The batch of a :meth:`_start`, with its input nodes' feature rows."""
        batch = pending.result()
        if self.features is not None:
            with input_checks(False):  # the features were checked at construction
                batch = (*batch, self._gather(self.features, batch[0]))
        return batch

    def _batch(self, share, pass_seed: int, i: int):
        return self._finish(self._start(share, pass_seed, i))

    def __iter__(self):
        # one seed per (loader seed, pass): a prime step, so that nearby loader seeds (the
        # trainer's run seeds) do not share passes; read now, the batches come lazily
        pass_seed = self.seed * 100_003 + self.passes
        self.passes += 1
        share = self._share(pass_seed).to(self.graph.device)
        if self.prefetch:
            return _prefetched(functools.partial(self._batch, share, pass_seed), len(self),
                               self.prefetch, self.graph.device)
        start = functools.partial(self._start, share, pass_seed)
        if self.graph.device.type == "cuda":
            return _ahead(start, self._finish, len(self), self.graph.device, self._captured)
        return (self._finish(start(i)) for i in range(len(self)))


class _Sampled(NamedTuple):
    """A batch that a sampler's own ``sample`` made, as a PendingBatch gives it."""
    batch: tuple

    def result(self):
        return self.batch


def _tensors(batch):
    """Every tensor a batch holds (to mark them used by the consumer's stream); what a plan
    derives later is made on the consumer's stream."""
    input_nodes, output_nodes, blocks, *features = batch
    yield from (input_nodes, output_nodes, *features)
    for block in blocks:
        plan = block.plan
        yield from (block.src_nodes, plan.indptr, plan.indices, plan.in_degrees)
        if block.edge_ids is not None:
            yield block.edge_ids


def _ahead(start, finish, count, device, captured):
    """Batches ``finish(start(0))`` to ``finish(start(count - 1))`` in order, in the caller's
    thread: each batch's kernels queued on a side stream (high priority, as the producers')
    when the batch before is due, so that its sizes are on the host when it is; full
    batches replayed by the sampler that the pass's ``captured()`` gives, if any (each
    batch is finished, its blocks copied out, before the next replay). The stream current
    at each batch's hand-over waits for it."""
    stream = torch.cuda.Stream(device, priority=-1)
    stream.wait_stream(torch.cuda.current_stream(device))  # the pass's seeds are made there
    try:
        with captured() as take:
            with torch.cuda.stream(stream):
                pending = start(0, take) if count else None
            for i in range(count):
                with torch.cuda.stream(stream):
                    batch = finish(pending)
                    ready = stream.record_event()
                    pending = start(i + 1, take) if i + 1 < count else None
                _hand_over(batch, ready, torch.cuda.current_stream(device))
                yield batch
    finally:
        # a batch left queued (the loop broken off) reads the pass's seeds, which the
        # caller's stream frees
        torch.cuda.current_stream(device).wait_stream(stream)


def _hand_over(batch, ready, consumer):
    """The consumer's stream waits for the batch's kernels (``ready``), and keeps its
    memory alive until its own work on it is done."""
    consumer.wait_event(ready)
    for t in _tensors(batch):
        t.record_stream(consumer)


def _prefetched(sample, count, producers, device):
    """Batches ``sample(0)`` to ``sample(count - 1)`` in order, each made ahead by one of
    ``producers`` threads (batch i by thread i % producers, on its own side stream on
    GPUs), which sample at the same time."""
    queues = [queue.Queue(maxsize=1) for _ in range(producers)]
    stop = threading.Event()
    cuda = device.type == "cuda"
    # The side streams start after the work queued so far on the caller's stream (the
    # graph's CSR and the seeds may still be in the making there: PyTorch's side streams
    # do not wait for the default stream).
    ready_event = torch.cuda.current_stream(device).record_event() if cuda else None
    # the caller's context (input checks) holds on the producers' threads
    threads = [threading.Thread(
        target=contextvars.copy_context().run,
        args=(_produce, sample, range(t, count, producers), queues[t], stop, device,
              ready_event), daemon=True, name=SAMPLER_THREAD) for t in range(producers)]
    try:
        for thread in threads:
            thread.start()
        for i in range(count):
            item = queues[i % producers].get()
            if isinstance(item, BaseException):
                raise item
            batch, event = item
            if cuda:
                _hand_over(batch, event, torch.cuda.current_stream(device))
            yield batch
    finally:
        stop.set()
        # The garbage collector may finalize this generator on a producer thread itself
        # (when an exception kept in a reference cycle holds it), even inside a put that
        # holds its queue's lock: there it only sets ``stop``, which every producer sees
        # within a put's timeout; elsewhere it drains the queues so that they end at once.
        if threading.current_thread() not in threads:
            for thread in threads:
                while thread.is_alive():  # unblock a producer waiting on a full queue
                    for ready in queues:
                        with contextlib.suppress(queue.Empty):
                            ready.get(timeout=0.01)
                if thread.ident is not None:  # started
                    thread.join()


def _produce(sample, indices, ready, stop, device, start_after=None):
    def put(item):
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                ready.put(item, timeout=0.05)
                return True
        return False

    stream = None
    try:
        # high priority: the sampler's small kernels (and the reads of its sizes that wait
        # for them) go ahead of the step's, which would otherwise hold the GPU
        stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None
        if start_after is not None:
            stream.wait_event(start_after)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for i in indices:
                batch = sample(i)
                event = stream.record_event() if stream is not None else None
                if not put((batch, event)):
                    return
    except BaseException as err:  # re-raised in the consumer's thread
        put(err)
    finally:
        # nothing this thread queued outlives it: it reads the pass's seeds, which the
        # caller's stream made and frees once the producers are joined
        if stream is not None:
            stream.synchronize()
