"""Every graph generator of the package, vectorised with torch and reproducible from a seed.

- :func:`power_law_csr` -- log-normal in-degrees scaled to an exact edge count and uniform
  random sources, which reproduces the load-balance problem of real social and product graphs
  (Reddit: 232,965 nodes, 114.6M edges, mean in-degree 492, max ~51k); it builds a
  Reddit-sized graph on a GPU in seconds. For kernel work.
- :func:`planted_partition` -- a contextual stochastic block model (the ``planted`` dataset).
- :func:`power_law_graph` -- a power-law graph with RANDOM features and labels (the
  ``powerlaw`` dataset), for speed work.

:data:`PLANTED_PARAMS` and :data:`POWER_LAW_PARAMS` declare the two datasets' parameters and
their ranges; :func:`check_planted` and :func:`check_power_law` check the parameters together.
"""
from __future__ import annotations

import torch

from ..sampling.sampler import row_ranges
from .dataset import index_to_mask
from .params import Param, check_values, with_defaults

#: Log-normal sigma: with Reddit's size it gives a max in-degree of about 100x the mean.
DEFAULT_SIGMA = 1.25

_SEED = Param(int, 0, 0, 2**63 - 1)  # what fits a signed 64-bit integer, everywhere
_FRACTION = dict(low=0.0, high=1.0, open_low=True, open_high=True)

PLANTED_PARAMS = {
    "num_nodes": Param(int, 2000, 2), "num_classes": Param(int, 5, 2),
    "mean_degree": Param(float, 10.0, 0.0), "homophily": Param(float, 0.8, 0.0, 1.0),
    "p_in": Param(float, None, 0.0, 1.0), "p_out": Param(float, None, 0.0, 1.0),
    "num_features": Param(int, 32, 1), "feature_snr": Param(float, 1.0, 0.0),
    "train_fraction": Param(float, 0.1, **_FRACTION),
    "val_fraction": Param(float, 0.2, **_FRACTION), "seed": _SEED}

POWER_LAW_PARAMS = {
    "num_nodes": Param(int, 100_000, 1), "mean_degree": Param(float, 50.0, 0.0),
    "num_features": Param(int, 128, 1), "num_classes": Param(int, 41, 2),
    "max_degree": Param(int, None, 1), "seed": _SEED}


# --------------------------------------------------------------------------- power-law CSR


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
                  sigma: float = DEFAULT_SIGMA, index_dtype=torch.int64,
                  chunk_edges: int | None = None):
    """A random graph as CSR over destination rows: ``(indptr int64, indices)``.

    ``num_nodes`` destination rows get log-normal in-degrees (``exp(sigma * N(0, 1))``,
    scaled so that they sum to exactly ``num_edges``; at most ``max_degree`` each when given);
    each edge's source is uniform in ``[0, num_src)`` (``num_src`` defaults to ``num_nodes``;
    give another value for a rectangular block), and each row lists its sources in ascending
    order. Duplicate edges may occur (a multigraph), as
    with uniform sampling. Deterministic for a given seed, device and ``chunk_edges``.

    Parameters
    ----------
    num_nodes : int
        Destination nodes (rows)
    num_edges : int
    seed : int
    device : torch.device or str
        Where to build it (a GPU builds 100M+ edges in seconds)
    max_degree : int, optional
        Cap on the in-degree of a node
    num_src : int, optional
        Source nodes (columns)
    sigma : float
        Log-normal spread of the degrees
    index_dtype : torch.dtype
        torch.int64, or torch.int32 (half the memory, for up to 2^31 sources)
    chunk_edges : int, optional
        Draw and sort the sources of whole rows this many edges at a time (a longer row
        alone), so that the temporaries stay that size beside the CSR (a papers100M-sized
        graph on a GPU); None: all at once
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
    del weights
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(deg, 0, out=indptr[1:])
    if chunk_edges is None:
        return indptr, _sorted_sources(deg, num_edges, num_src, gen).to(index_dtype)
    indices = torch.empty(num_edges, dtype=index_dtype, device=device)
    for r0, r1, e0, e1 in row_ranges(indptr, chunk_edges):
        indices[e0:e1] = _sorted_sources(deg[r0:r1], e1 - e0, num_src, gen)
    return indptr, indices


def _sorted_sources(deg, num_edges: int, num_src: int, gen) -> torch.Tensor:
    """Uniform sources (int64) of the rows of in-degrees ``deg``, ascending within each row."""
    device = deg.device
    indices = torch.randint(0, max(num_src, 1), (num_edges,), generator=gen, device=device,
                            dtype=torch.int64)
    # each row's sources ascending, as GraphPlan.from_graph orders them
    offset = torch.repeat_interleave(torch.arange(deg.numel(), device=device) * max(num_src, 1),
                                     deg, output_size=num_edges)
    return torch.sort(indices + offset).values - offset


# --------------------------------------------------------------------------- datasets


def check_planted(params: dict, where: str = "planted") -> None:
    """ValueError naming ``<where>.<key>`` when :func:`planted_partition`'s parameters
    (``params``: all of them) are out of range or do not fit together."""
    p = check_values(PLANTED_PARAMS, params, where, "planted")
    if p["num_nodes"] < 2 * p["num_classes"]:
        raise ValueError(f"'{where}.num_nodes' must be >= 2 * num_classes = "
                         f"{2 * p['num_classes']}, got {p['num_nodes']}")
    if (p["p_in"] is None) != (p["p_out"] is None):
        raise ValueError(f"'{where}.p_in' and '{where}.p_out': give both, or neither")
    if p["p_in"] is not None and p["p_in"] == p["p_out"] == 0:
        raise ValueError(f"'{where}.p_in' and '{where}.p_out' are both 0: no edges")
    if p["train_fraction"] + p["val_fraction"] >= 1:
        raise ValueError(f"'{where}.train_fraction' + '{where}.val_fraction' must be < 1 "
                         f"(the rest is the test set), got {p['train_fraction']} + "
                         f"{p['val_fraction']}")


def check_power_law(params: dict, where: str = "powerlaw") -> None:
    """ValueError naming ``<where>.<key>`` when :func:`power_law_graph`'s parameters
    (``params``: all of them) are out of range or do not fit together."""
    p = check_values(POWER_LAW_PARAMS, params, where, "powerlaw")
    if p["max_degree"] is not None and p["max_degree"] < p["mean_degree"]:
        raise ValueError(f"'{where}.max_degree' must be >= mean_degree = "
                         f"{p['mean_degree']:g}, got {p['max_degree']}")


def planted_partition(num_nodes=2000, num_classes=5, mean_degree=10.0, homophily=0.8,
                      p_in=None, p_out=None, num_features=32, feature_snr=1.0,
                      train_fraction=0.1, val_fraction=0.2, seed=0):
    """A contextual stochastic block model (undirected, no self-loops, no multi-edges).

    Nodes get one of ``num_classes`` labels uniformly. About ``num_nodes * mean_degree / 2``
    undirected edges are drawn; each joins two nodes of the same class with probability
    ``homophily`` and of different classes otherwise. Giving ``p_in`` and ``p_out`` (edge
    probabilities within / across classes) sets ``mean_degree`` and ``homophily`` to the
    values they imply for equal class sizes. Features: ``feature_snr * mu[label] + noise``,
    where the ``mu`` are random unit vectors and the noise is N(0, I) in ``num_features``
    dimensions, so ``feature_snr`` sets how separable the classes are from features alone
    and ``homophily`` how much the graph helps. Splits are random with the given fractions.
    Everything is a function of ``seed``. Ranges: :data:`PLANTED_PARAMS`.

    Returns (src, dst, features, labels, train_mask, val_mask, test_mask).
    """
    check_planted(dict(locals()))  # every argument, by name
    if p_in is not None:
        size = num_nodes / num_classes
        expected_in, expected_out = p_in * (size - 1), p_out * (num_nodes - size)
        mean_degree = expected_in + expected_out
        homophily = expected_in / mean_degree
    gen = torch.Generator().manual_seed(int(seed))
    labels = torch.randint(num_classes, (num_nodes,), generator=gen)
    # make every class non-empty
    labels[torch.randperm(num_nodes, generator=gen)[:num_classes]] = torch.arange(num_classes)
    src, dst = _planted_edges(labels, num_classes, mean_degree, homophily, gen)

    mu = torch.randn(num_classes, num_features, generator=gen)
    mu = mu / mu.norm(dim=1, keepdim=True)
    features = feature_snr * mu[labels] + torch.randn(num_nodes, num_features, generator=gen)

    perm = torch.randperm(num_nodes, generator=gen)
    n_train = max(num_classes, int(round(train_fraction * num_nodes)))
    n_val = max(1, int(round(val_fraction * num_nodes)))
    masks = [index_to_mask(part, num_nodes)
             for part in (perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:])]
    return (src, dst, features.to(torch.float32), labels, *masks)


def _planted_edges(labels, num_classes, mean_degree, homophily, gen):
    """Both directions of about ``N * mean_degree / 2`` distinct undirected edges, a share
    ``homophily`` of them inside a class."""
    num_nodes = labels.numel()
    order = torch.argsort(labels, stable=True)
    counts = torch.bincount(labels, minlength=num_classes)
    starts = torch.cumsum(counts, 0) - counts
    num_edges = int(round(num_nodes * mean_degree / 2))
    u = torch.randint(num_nodes, (num_edges,), generator=gen)
    same = torch.rand(num_edges, generator=gen) < homophily
    cu = labels[u]
    # the class of the other end: its own, or a uniformly chosen other class
    shift = torch.randint(1, num_classes, (num_edges,), generator=gen)
    cv = torch.where(same, cu, (cu + shift) % num_classes)
    pick = (torch.rand(num_edges, generator=gen) * counts[cv]).long().clamp(
        max=(counts[cv] - 1))
    v = order[starts[cv] + pick]
    keep = u != v
    u, v = u[keep], v[keep]
    key = torch.unique(torch.minimum(u, v) * num_nodes + torch.maximum(u, v))
    a, b = key // num_nodes, key % num_nodes
    return torch.cat([a, b]), torch.cat([b, a])


def power_law_graph(num_nodes=100_000, mean_degree=50.0, num_features=128, num_classes=41,
                    max_degree=None, seed=0):
    """A graph with log-normal in-degrees of the given mean and uniform random sources
    (:func:`power_law_csr`), with RANDOM features (N(0, 1)) and RANDOM labels: for speed
    measurements only. Splits: random 60/20/20. Ranges: :data:`POWER_LAW_PARAMS`.

    Returns (src, dst, features, labels, train_mask, val_mask, test_mask).
    """
    check_power_law(dict(locals()))  # every argument, by name
    num_edges = int(round(num_nodes * mean_degree))
    indptr, indices = power_law_csr(num_nodes, num_edges, seed=int(seed), device="cpu",
                                    max_degree=max_degree)
    dst = torch.repeat_interleave(torch.arange(num_nodes), indptr[1:] - indptr[:-1])
    gen = torch.Generator().manual_seed(int(seed) + 1)
    features = torch.randn(num_nodes, num_features, generator=gen)
    labels = torch.randint(num_classes, (num_nodes,), generator=gen)
    perm = torch.randperm(num_nodes, generator=gen)
    a, b = int(0.6 * num_nodes), int(0.8 * num_nodes)
    masks = [index_to_mask(p, num_nodes) for p in (perm[:a], perm[a:b], perm[b:])]
    return (indices.long(), dst, features, labels, *masks)
