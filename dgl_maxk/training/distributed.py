"""The device and the process group: one process, or data-parallel under torchrun.

Under ``torchrun`` (``WORLD_SIZE`` > 1) each process trains on its share of the seed nodes,
gradients are averaged (NCCL on GPUs, gloo on CPUs) by DistributedDataParallel, or, for
mini-batch steps replayed from a CUDA graph (``sampling.cuda_graph``), by
:class:`~dgl_maxk.training.sampled_step.SampledStep` itself, and
:func:`all_reduce_mean` averages the numbers each process measures. On one process every
helper here is the identity.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .errors import ConfigError


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' (a GPU when there is one), 'cpu', 'cuda' or 'cuda:N' as a torch.device."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available here")
    return dev


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


def data_parallel(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` wrapped for data-parallel training (the identity on one process).

    Gradients live in DDP's buckets (no copy per step) and the graph is declared static
    (the paper's models use every parameter in every step): less host work per step, which
    is what a sampled step is bound by.
    """
    if not is_distributed():
        return model
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True, static_graph=True)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def all_reduce_mean(values: dict, device) -> dict:
    """The mean over processes of each number in ``values`` (identity on one process)."""
    if not is_distributed():
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    return dict(zip(keys, t.tolist()))


def any_process(flag: bool, device) -> bool:
    """Whether ``flag`` is true on any process: processes that stop must stop together (a
    clock or a signal may reach them at different epochs)."""
    if not is_distributed():
        return flag
    t = torch.tensor([float(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def broadcast_object(obj, src: int = 0):
    """``obj`` of process ``src`` on every process (identity on one process)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj) -> list:
    """``obj`` of every process, in rank order, on every process ([obj] on one process)."""
    if not is_distributed():
        return [obj]
    objects = [None] * dist.get_world_size()
    dist.all_gather_object(objects, obj)
    return objects


def synchronize(device):
    """Wait for the device's queued work (no-op on the CPU), before reading a host clock."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
