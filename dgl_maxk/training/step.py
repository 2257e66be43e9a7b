"""The one training step of full-graph and mini-batch training (and of the benchmarks).

``train_step`` takes the graph the model runs on (a DGLGraph, or the list of sampled blocks),
the input features of its source nodes, and the labels of the rows the loss is taken over.
"""
from __future__ import annotations

import warnings

import torch
from torch.nn import functional as F

from ..sparse import deferred_checks
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
    the GPU once, after the backward, and raises the first NaN of any layer's input, with its
    position, before the optimizer touches the weights. Returns the loss as a detached 0-d
    tensor on the device. The matmul precision is the caller's (see
    :func:`dgl_maxk.training.precision.precision_scope`).
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    x = drop_input(features, input_dropout)
    with deferred_checks():
        with autocast(precision, features.device.type):
            logits = model(graph, x)
            if rows is not None:
                logits = logits[rows]
            loss = loss_fn(logits.float(), labels, multilabel)
        loss.backward()
    optimizer.step()
    return loss.detach()
