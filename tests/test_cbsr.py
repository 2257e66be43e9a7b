"""CBSR container: index types, dense round trips, invalid constructions."""
import pytest
import torch

from dgl_maxk import CBSR
from dgl_maxk.sparse import index_dtype

WIDTHS = (1, 2, 7, 64, 255, 256, 257, 384, 1024, 4096)


def ks_for(d):
    return sorted(k for k in {1, 2, d // 8, d // 2, d - 1, d} if 1 <= k <= d)


@pytest.mark.parametrize("d", WIDTHS)
def test_index_dtype(d, h):
    assert index_dtype(d) == h.expected_index_dtype(d)


def test_index_dtype_limits():
    assert index_dtype(256) == torch.uint8
    assert index_dtype(257) == torch.int16
    assert index_dtype(32768) == torch.int16  # int16 holds columns up to 32767
    for bad in (0, -1, 32769):
        with pytest.raises(ValueError, match="width"):
            index_dtype(bad)


@pytest.mark.parametrize("d", WIDTHS)
def test_round_trip_k_sparse(d, h):
    """dense (exactly k positive entries per row) -> CBSR -> dense is the identity."""
    n = 3 if d >= 1024 else 6
    for k in ks_for(d):
        pattern = h.random_pattern(n, d, k)
        x = torch.zeros(n, d, dtype=torch.float64)
        x.scatter_(1, pattern, torch.rand(n, k, dtype=torch.float64) + 0.5)
        c = CBSR.from_dense(x, k)
        assert c.k == k and c.d == d and c.shape == (n, d)
        assert c.indices.dtype == h.expected_index_dtype(d)
        assert c.values.dtype == torch.float64
        assert torch.equal(c.to_dense(), x), (d, k)
        # the stored pattern is the input's, ascending per row
        assert torch.equal(c.long_indices(), pattern), (d, k)


@pytest.mark.parametrize("d", (5, 256, 257, 1024))
def test_round_trip_fewer_nonzeros_than_k(d, h):
    """Rows with fewer than k non-zeros (the rest zero) also come back unchanged."""
    n, k = 5, min(d, 4)
    x = torch.zeros(n, d)
    pattern = h.random_pattern(n, d, 2)
    x.scatter_(1, pattern, torch.rand(n, 2) + 0.5)
    x[0] = 0  # an all-zero row
    c = CBSR.from_dense(x, k)
    assert c.k == k
    assert torch.equal(c.to_dense(), x)
    assert ((c.long_indices() >= 0) & (c.long_indices() < d)).all()


@pytest.mark.parametrize("d", (8, 256, 257, 4096))
def test_cbsr_to_dense_places_values(d, h):
    """to_dense puts values[r, j] at column indices[r, j] and zeros elsewhere (checked
    entry by entry), and CBSR -> dense -> CBSR gives back the same values and pattern."""
    n = 4
    for k in (1, min(d, 3), d):
        c, pattern = h.random_cbsr(n, d, k)
        c = c.with_values(c.values.abs() + 0.1)  # positive, so from_dense keeps them
        x = c.to_dense()
        assert x.shape == (n, d)
        expected = torch.zeros(n, d, dtype=torch.float64)
        for r in range(n):
            for j in range(k):
                expected[r, int(pattern[r, j])] = c.values[r, j]
        assert torch.equal(x, expected)
        back = CBSR.from_dense(x, k)
        assert torch.equal(back.long_indices(), pattern)
        assert torch.equal(back.values, c.values)
        assert back.indices.dtype == c.indices.dtype


def test_to_dense_is_differentiable():
    values = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    c = CBSR(values, torch.tensor([[0, 2], [1, 3], [0, 3]], dtype=torch.uint8), 4)
    assert torch.autograd.gradcheck(lambda v: CBSR(v, c.indices, 4).to_dense(), (values,))


def test_properties_with_values_and_to(h):
    c, pattern = h.random_cbsr(5, 300, 7, dtype=torch.float64)
    assert c.k == 7 and c.d == 300 and c.shape == (5, 300)
    assert c.dtype == torch.float64 and c.device == torch.device("cpu")
    assert c.long_indices().dtype == torch.int64
    assert torch.equal(c.long_indices(), pattern)
    new = torch.randn(5, 7, dtype=torch.float64)
    d = c.with_values(new)
    assert d.values is new and d.indices is c.indices and d.d == 300
    f = c.to(torch.float32)
    assert f.dtype == torch.float32 and f.indices.dtype == torch.int16
    assert torch.equal(f.values, c.values.float())


# --------------------------------------------------------------------------- invalid

def _idx(rows, dtype=torch.uint8):
    return torch.tensor(rows, dtype=dtype)


@pytest.mark.parametrize("case, match", [
    ("values_1d", "N x k"),
    ("shape_mismatch", "N x k"),
    ("integer_values", "floating point"),
    ("int64_indices", "must be torch.uint8"),
    ("uint8_for_257", "must be torch.int16"),
    ("int16_for_256", "must be torch.uint8"),
    ("k_above_d", "k must be in"),
    ("k_zero", "k must be in"),
    ("d_zero", "width"),
    ("d_too_large", "width"),
])
def test_invalid_construction(case, match):
    v = torch.randn(2, 2)
    build = {
        "values_1d": lambda: CBSR(torch.randn(4), _idx([0, 1, 2, 3]), 4),
        "shape_mismatch": lambda: CBSR(v, _idx([[0, 1, 2], [0, 1, 2]]), 4),
        "integer_values": lambda: CBSR(torch.ones(2, 2, dtype=torch.int64),
                                       _idx([[0, 1], [0, 1]]), 4),
        "int64_indices": lambda: CBSR(v, _idx([[0, 1], [0, 1]], torch.int64), 4),
        "uint8_for_257": lambda: CBSR(v, _idx([[0, 1], [0, 1]]), 257),
        "int16_for_256": lambda: CBSR(v, _idx([[0, 1], [0, 1]], torch.int16), 256),
        "k_above_d": lambda: CBSR(torch.randn(2, 3), _idx([[0, 1, 0], [0, 1, 0]]), 2),
        "k_zero": lambda: CBSR(torch.randn(2, 0), torch.zeros(2, 0, dtype=torch.uint8), 4),
        "d_zero": lambda: CBSR(v, _idx([[0, 1], [0, 1]]), 0),
        "d_too_large": lambda: CBSR(v, _idx([[0, 1], [0, 1]], torch.int16), 40000),
    }[case]
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize("rows, d, dtype", [
    ([[0, 4], [1, 2]], 4, torch.uint8),        # column 4 of a 4-wide matrix
    ([[0, 1], [1, 300]], 257, torch.int16),    # column 300 of a 257-wide matrix
    ([[0, -1], [1, 2]], 300, torch.int16),     # negative column
])
def test_out_of_range_indices_rejected(rows, d, dtype):
    with pytest.raises(ValueError, match="column"):
        CBSR(torch.randn(2, 2), _idx(rows, dtype), d)


def test_repeated_column_in_a_row_rejected():
    with pytest.raises(ValueError, match="distinct|repeat"):
        CBSR(torch.randn(2, 2), _idx([[1, 1], [0, 2]]), 4)


def test_values_and_indices_on_different_devices():
    # The meta device stands in for a second device.
    with pytest.raises(ValueError, match="device|meta"):
        CBSR(torch.randn(2, 2), torch.zeros(2, 2, dtype=torch.uint8, device="meta"), 4)
