"""Graphs of ogbn-papers100M's size on one GPU, tested on the CPU at small sizes: 64-bit edge
positions in the sampler, feature rows from host memory."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from dgl_maxk._dgl import dgl
from dgl_maxk.backends import reference
from dgl_maxk.sampling import DeviceGraph, NeighborSampler, gather_rows
from dgl_maxk.sampling import sampler as sampler_module
from dgl_maxk.sampling.sampler import block_indptr

REPO = Path(__file__).resolve().parents[1]


def csr_of(degrees):
    degrees = torch.as_tensor(degrees, dtype=torch.int64)
    indptr = torch.zeros(degrees.numel() + 1, dtype=torch.int64)
    torch.cumsum(degrees, 0, out=indptr[1:])
    return indptr


# --------------------------------------------------------------------------- 2^31 edges


def test_sampler_picks_edge_positions_past_2_to_31_in_int64():
    """Rows whose in-edges start past 2^31 (node 0 holds the first 2^31 + 12345; the sources
    are a stride-0 view, so nothing that size is allocated): the picks are the positions of
    the same rows without node 0's edges, shifted by its in-degree, in int64, and the full
    sampler reads the sources at them, as on a 3.2B-edge graph."""
    big = 2 ** 31 + 12345
    rest = [0, 7, 20, 3, 40]
    indptr, small = csr_of([big] + rest), csr_of([0] + rest)
    indices = torch.full((1,), 4, dtype=torch.int32).expand(int(indptr[-1]))
    graph = DeviceGraph(indptr, indices, len(rest) + 1)
    dst = torch.tensor([2, 3, 5, 1, 4])
    b_indptr, num_edges = block_indptr(indptr, dst, 5)
    draws = torch.rand(dst.numel(), 5, dtype=torch.float64)
    got = reference.sample_neighbors(indptr, dst, b_indptr, num_edges, 5, draws)
    want = reference.sample_neighbors(small, dst, b_indptr, num_edges, 5, draws)
    assert got.dtype == torch.int64 and torch.equal(got, want + big)
    assert int(got.min()) > 2 ** 31
    _, _, (block,) = NeighborSampler([5]).sample(graph, dst)
    assert block.num_edges() == num_edges
    assert torch.equal(block.src_nodes[block.plan.indices].unique(), torch.tensor([4]))


def test_the_cuda_kernels_hold_edge_positions_and_row_offsets_in_64_bits():
    """The GPU side of the above, read from the kernels' source (no GPU here): every pointer
    and variable that holds an edge position, a row offset or a count is a long long."""
    kernels = REPO / "kernels"
    sample = (kernels / "sample_neighbors.cu").read_text()
    for declared in ("const long long* __restrict__ graph_indptr",
                     "const long long* __restrict__ block_indptr",
                     "long long* __restrict__ out, long long n", "long long r = ",
                     "long long start = ", "long long degree = ", "long long* row_out = ",
                     "long long picked[MAX_FANOUT]", "long long top = ", "long long t = ",
                     "for (long long i = 0; i < degree; ++i)"):
        assert declared in sample, declared
    gather = (kernels / "gather_rows.cu").read_text()
    for declared in ("const long long* __restrict__ index", "long long n, long long row_words",
                     "const long long i = (long long)blockIdx.x",
                     "for (long long c = threadIdx.x & 31; c < row_words; c += 32)"):
        assert declared in gather, declared
    assert not re.search(r"\bint\s+\w+\s*=\s*\w*(indptr|index)\[", sample + gather)


def test_device_graph_out_degrees_count_every_source_a_chunk_at_a_time(monkeypatch):
    monkeypatch.setattr(sampler_module, "_OUT_DEGREE_CHUNK", 64)
    g = dgl.rand_graph(100, 1000)
    assert torch.equal(DeviceGraph.from_dgl(g, "cpu").out_degrees, g.out_degrees())


# --------------------------------------------------------------------------- features


def test_gather_rows_is_index_select_on_the_index_device():
    table = torch.randn(500, 7)
    index = torch.randint(0, 500, (300,))
    assert torch.equal(gather_rows(table, index), table[index])
    assert torch.equal(gather_rows(table[:, 0].contiguous(), index), table[index, 0])
