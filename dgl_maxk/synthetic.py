"""Synthetic power-law graphs, generated vectorised with torch on any device.

:func:`power_law_csr` draws log-normal in-degrees scaled to an exact edge count and uniform
random source nodes, which reproduces the load-balance problem of real social and product
graphs (Reddit: 232,965 nodes, 114.6M edges, mean in-degree 492, max ~51k). It builds a
Reddit-sized graph on a GPU in seconds.
"""
from __future__ import annotations

import torch

#: Log-normal sigma: with Reddit's size it gives a max in-degree of about 100x the mean.
DEFAULT_SIGMA = 1.25


def _distribute(weights: torch.Tensor, total: int, cap: int, gen) -> torch.Tensor:
    """Non-negative int64 counts <= cap summing to ``total``, proportional to ``weights``."""
    deg = torch.zeros_like(weights, dtype=torch.int64)
    left = total
    for _ in range(8):
        room = cap - deg
        w = torch.where(room > 0, weights, torch.zeros_like(weights))
        s = float(w.sum())
        if left == 0 or s == 0:
            break
        add = torch.floor(w * (left / s)).to(torch.int64)
        add = torch.minimum(add, room)
        deg += add
        added = int(add.sum())
        left -= added
        if added == 0:
            break
    if left > 0:  # the rest one by one, to random rows with room left
        eligible = (deg < cap).nonzero().flatten()
        if eligible.numel() < left:
            raise ValueError(f"cannot place {total} edges with at most {cap} per node")
        pick = eligible[torch.randperm(eligible.numel(), generator=gen,
                                       device=weights.device)[:left]]
        deg[pick] += 1
    return deg


def power_law_csr(num_nodes: int, num_edges: int, seed: int = 0, device="cpu",
                  max_degree: int | None = None, num_src: int | None = None,
                  sigma: float = DEFAULT_SIGMA):
    """A random graph as CSR over destination rows: ``(indptr int64, indices int64)``.

    ``num_nodes`` destination rows get log-normal in-degrees (``exp(sigma * N(0, 1))``,
    scaled so that they sum to exactly ``num_edges``; at most ``max_degree`` each when given);
    each edge's source is uniform in ``[0, num_src)`` (``num_src`` defaults to ``num_nodes``;
    give another value for a rectangular block). Duplicate edges may occur (a multigraph), as
    with uniform sampling. Deterministic for a given seed and device.

    Parameters
    ----------
    num_nodes : int -- destination nodes (rows)
    num_edges : int
    seed : int
    device : torch device to build on (a GPU builds 100M+ edges in seconds)
    max_degree : int, optional -- cap on the in-degree of a node
    num_src : int, optional -- source nodes (columns)
    sigma : float -- log-normal spread of the degrees
    """
    num_src = num_nodes if num_src is None else int(num_src)
    num_nodes, num_edges = int(num_nodes), int(num_edges)
    if num_nodes < 0 or num_edges < 0 or num_src < 0:
        raise ValueError("sizes must be non-negative")
    if num_edges > 0 and (num_nodes == 0 or num_src == 0):
        raise ValueError("edges need at least one source and one destination node")
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    cap = num_edges if max_degree is None else int(max_degree)
    weights = torch.randn(num_nodes, generator=gen, device=device, dtype=torch.float64)
    weights = weights.mul_(sigma).exp_()
    deg = _distribute(weights, num_edges, cap, gen) if num_nodes else \
        torch.zeros(0, dtype=torch.int64, device=device)
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(deg, 0, out=indptr[1:])
    indices = torch.randint(0, max(num_src, 1), (num_edges,), generator=gen, device=device,
                            dtype=torch.int64)
    return indptr, indices
