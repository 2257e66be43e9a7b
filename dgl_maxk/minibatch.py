"""Mini-batch training on sampled blocks, on one device or data-parallel over several.

DGL's ``NeighborSampler`` and ``DataLoader`` sample blocks on the CPU (the DGL wheels of the
package index have no CUDA); the features, labels and model live on the training device, and
dgl_maxk's layers build each block's plan on that device (cheap: one sort of the block's
edges). Under ``torchrun`` each process trains on its share of the seed nodes (DGL's
``use_ddp``), gradients are averaged by DistributedDataParallel (NCCL on GPUs, gloo on CPUs),
and :func:`all_reduce_mean` averages the numbers each process measures.
"""
from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F

from ._dgl import dgl


def init_distributed(device: torch.device):
    """(rank, world_size, device) for this process.

    Under torchrun (``WORLD_SIZE`` > 1) this joins the process group: NCCL with one GPU per
    process (``LOCAL_RANK``), gloo on CPUs. Otherwise it returns (0, 1, device).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, device
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world, device


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_mean(values: dict, device) -> dict:
    """The mean over processes of each number in ``values`` (identity on one process)."""
    if not is_distributed():
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    return dict(zip(keys, t.tolist()))


def broadcast_object(obj, src: int = 0):
    """``obj`` of process ``src`` on every process (identity on one process)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def make_loader(graph, seeds, fanouts, batch_size, seed, use_ddp=False):
    """A DGL DataLoader of (input_nodes, output_nodes, blocks) over ``seeds``, sampling the
    given fan-out per layer (-1 takes all neighbours). Shuffled; reproducible from ``seed``
    through torch's global generator, which the caller seeds."""
    sampler = dgl.dataloading.NeighborSampler(list(fanouts))
    return dgl.dataloading.DataLoader(graph, seeds, sampler, batch_size=batch_size,
                                      shuffle=True, drop_last=False, use_ddp=use_ddp,
                                      ddp_seed=seed, num_workers=0)


def synchronize(device):
    """Wait for the device's queued work (no-op on the CPU), before reading a host clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def loss_fn(logits, labels, multilabel):
    """Binary cross-entropy for multi-label data, cross-entropy otherwise."""
    if multilabel:
        return F.binary_cross_entropy_with_logits(logits, labels)
    return F.cross_entropy(logits, labels)


def train_epoch(model, loader, features, labels, optimizer, device, multilabel,
                max_steps=None, timed=False, input_dropout=0.0, autocast=contextlib.nullcontext):
    """One pass over ``loader``. ``features``/``labels`` are indexed by node id (on any
    device); ``input_dropout`` applies to the gathered input features; ``autocast`` makes the
    context the forward pass runs in (mixed precision). Returns the mean loss, the seed count, and with ``timed`` the seconds spent in
    sampling, feature/label gathering and copying, and compute (which then synchronises with
    the GPU at each phase boundary)."""
    model.train()
    stats = {"loss": 0.0, "seeds": 0, "steps": 0, "sample_s": 0.0, "copy_s": 0.0,
             "compute_s": 0.0}
    loss_sum = torch.zeros((), device=device)
    iterator = iter(loader)
    while max_steps is None or stats["steps"] < max_steps:
        t0 = time.perf_counter()
        try:
            input_nodes, output_nodes, blocks = next(iterator)
        except StopIteration:
            break
        t1 = time.perf_counter()
        x = features[input_nodes.to(features.device)].to(device, non_blocking=True)
        y = labels[output_nodes.to(labels.device)].to(device, non_blocking=True)
        if timed:
            synchronize(device)
        t2 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            logits = model(blocks, F.dropout(x, input_dropout) if input_dropout else x).float()
            loss = loss_fn(logits, y, multilabel)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach() * len(output_nodes)
        if timed:
            synchronize(device)
        t3 = time.perf_counter()
        stats["sample_s"] += t1 - t0
        stats["copy_s"] += t2 - t1
        stats["compute_s"] += t3 - t2
        stats["seeds"] += len(output_nodes)
        stats["steps"] += 1
    stats["loss"] = float(loss_sum) / max(1, stats["seeds"])
    return stats
