"""Mini-batch training on sampled blocks, on one device or data-parallel over several.

Two samplers (``sampling.sampler``): ``device``, dgl_maxk's own (:mod:`dgl_maxk.sampling`),
samples on the training device from a CSR kept there, ahead of the step on producer threads,
and hands over blocks whose plans are built; ``dgl``, DGL's ``NeighborSampler`` and
``DataLoader``, samples on the CPU (the DGL wheels of the package index have no CUDA), and
dgl_maxk's layers then plan each block on the device. The labels and model live on the
training device, the features there too or (``sampling.features: host``) in pinned host
memory, whence the device sampler's loader carries each batch's rows over
(:func:`~dgl_maxk.sampling.staged_rows`). Under ``torchrun`` each process samples its share
of the seed nodes.
"""
from __future__ import annotations

import time
import warnings

import numpy as np
import torch

from .._dgl import dgl
from ..sampling import NeighborLoader, NeighborSampler, gather_rows
from ..sparse import input_checks
from .distributed import rank, synchronize, world_size

SAMPLERS = ("device", "dgl")


def make_loader(graph, seeds, fanouts, batch_size, seed, use_ddp=False):
    """A DGL DataLoader of (input_nodes, output_nodes, blocks) over ``seeds``, sampling the
    given fan-out per layer (-1 takes all neighbours). Shuffled by DGL with NumPy's global
    generator (under DDP every process must draw the same order), which the caller seeds."""
    sampler = dgl.dataloading.NeighborSampler(list(fanouts))
    return dgl.dataloading.DataLoader(graph, seeds, sampler, batch_size=batch_size,
                                      shuffle=True, drop_last=False, use_ddp=use_ddp,
                                      ddp_seed=seed, num_workers=0)


def device_loader(device_graph, seeds, fanouts, batch_size, seed, prefetch=None,
                  features=None):
    """A :class:`~dgl_maxk.sampling.NeighborLoader` over ``seeds`` on ``device_graph``'s
    device, this process's share of them under ``torchrun``, with each batch's rows of
    ``features`` if given; ``prefetch`` None: the loader's default (two producer threads for
    features in host memory on a GPU, else none)."""
    return NeighborLoader(device_graph, seeds, NeighborSampler(fanouts), batch_size,
                          seed=seed, rank=rank(), world_size=world_size(), prefetch=prefetch,
                          features=features)


def epoch_loader(graph, seeds, sampling, run_seed, epoch, device_graph=None, features=None):
    """A fresh loader for one epoch of a run, with the ``sampling`` config section's sampler
    (``device_graph``: the graph's :class:`~dgl_maxk.sampling.DeviceGraph`, for 'device',
    whose batches then carry their rows of ``features`` when given, gathered ahead of the
    step).

    Both samplers are seeded from (run seed, epoch), so a resumed run samples what an
    uninterrupted one does, and every process of a data-parallel run shuffles alike: DGL's
    loader shuffles its seed order in place with NumPy's global generator, so a long-lived
    one would make each epoch's order depend on all earlier ones (and on whatever else drew
    from NumPy), and DGL's sampler has its own generator, which checkpoints cannot hold.
    """
    epoch_seed = run_seed * 100_003 + epoch
    fanouts, batch_size = sampling["fanouts"], sampling["batch_size"]
    if sampling["sampler"] == "device":
        return device_loader(device_graph, seeds, fanouts, batch_size, epoch_seed,
                             sampling["prefetch"], features)
    dgl.seed(epoch_seed % 2 ** 31)  # DGL's seed is an int32; seeds that fit are unchanged
    np.random.seed(epoch_seed % 2 ** 32)
    return make_loader(graph, seeds, fanouts, batch_size, epoch_seed,
                       use_ddp=world_size() > 1)


def _iterate(loader):
    """``iter(loader)`` without DGL's advice to pin CPU affinity (meant for worker processes;
    the loader here samples in the training process)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Dataloader CPU affinity opt is not enabled")
        return iter(loader)


def train_epoch(step, loader, features, labels, device, max_steps=None, timed=False):
    """One pass over ``loader`` (DGL's or dgl_maxk's), one call of ``step`` (a
    :class:`~dgl_maxk.training.sampled_step.SampledStep`, whose last NaN scans are read at
    the end) per batch.

    ``features``/``labels`` are indexed by node id (on any device; features in pinned host
    memory are read by the GPU directly: :func:`~dgl_maxk.sampling.gather_rows`), unless
    the loader's batches carry their feature rows already. Returns the mean loss, the
    seed count and the step count; with ``timed``, also the seconds spent waiting for the
    sampler, in feature/label gathering and copying, and in compute (which then
    synchronises with the GPU at each phase boundary).
    """
    stats = {"loss": 0.0, "seeds": 0, "steps": 0, "sample_s": 0.0, "copy_s": 0.0,
             "compute_s": 0.0}
    loss_sum = torch.zeros((), device=device)
    iterator = _iterate(loader)
    try:
        while max_steps is None or stats["steps"] < max_steps:
            t0 = time.perf_counter()
            try:
                input_nodes, output_nodes, blocks, *gathered = next(iterator)
            except StopIteration:
                break
            t1 = time.perf_counter()
            with input_checks(False):  # a sampler's ids, and a row per node
                x = gathered[0] if gathered else gather_rows(features, input_nodes.to(device))
            y = labels[output_nodes.to(labels.device)].to(device, non_blocking=True)
            if timed:
                synchronize(device)
            t2 = time.perf_counter()
            loss = step(blocks, x, y)
            loss_sum += loss * len(output_nodes)
            if timed:
                synchronize(device)
            t3 = time.perf_counter()
            stats["sample_s"] += t1 - t0
            stats["copy_s"] += t2 - t1
            stats["compute_s"] += t3 - t2
            stats["seeds"] += len(output_nodes)
            stats["steps"] += 1
        if hasattr(step, "read_checks"):  # a replay's NaN scans are read a call later
            step.read_checks()
    finally:  # a failed step must not leave the sampler thread holding batches
        if hasattr(iterator, "close"):
            iterator.close()
    stats["loss"] = float(loss_sum) / max(1, stats["seeds"])
    return stats
