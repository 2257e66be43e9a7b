"""The operators as ``torch.library`` custom ops: ``torch.ops.dgl_maxk.<name>``.

Each is declared once (:func:`dgl_maxk._custom_ops.operator`): an implementation that hands
its tensors to the backend serving their device (:func:`dgl_maxk.backends.for_tensor`: the
CUDA kernels or the pure-torch reference), a fake implementation (shapes and dtypes only,
for ``torch.compile``) and, where it is differentiable, a backward made of the other
operators. :mod:`dgl_maxk.ops` checks the inputs and calls them.

A graph enters as the CSR tensors of its plan (``indptr``, ``indices``) and its source count;
A's values as ``edge_weight`` (one per CSR entry, None: 1) times the node scales of ``norm``.
The implementations find the plan again (:meth:`dgl_maxk.GraphPlan.of`) for what it derived
and cached (node scales, edge groups, the transpose). Aggregations return the features' dtype
and accumulate in fp32 (fp64 for fp64 features).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import backends
from ._custom_ops import operator
from .sparse import GraphPlan, index_dtype


def _scale_dtype(x: Tensor) -> torch.dtype:
    """The dtype of A's values for features ``x``: float64 for float64, else fp32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _masked(grads, needs):
    return tuple(g if need else None for g, need in zip(grads, needs))


# --------------------------------------------------------------------------- MaxK

def _maxk_fake(h, k, count_nan):
    n, d = h.shape
    return (h.new_empty((n, k)), h.new_empty((n, k), dtype=index_dtype(d)),
            h.new_empty(2 if count_nan else 0, dtype=torch.int64))


def _maxk_setup(ctx, inputs, output):
    ctx.width = inputs[0].shape[1]
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1], output[2])


def _maxk_backward(ctx, grad_values, _grad_indices, _grad_counters):
    (indices,) = ctx.saved_tensors
    return cbsr_to_dense(grad_values, indices, ctx.width), None, None


@operator("maxk_cbsr", _maxk_fake, _maxk_setup, _maxk_backward)
def maxk_cbsr(h: Tensor, k: int, count_nan: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(values, indices, counters): the k largest entries of each row of ``h`` as CBSR, and
    with ``count_nan`` the NaN counters of ``backends.reference.maxk_cbsr`` (else none)."""
    return _top_k(h, k, count_nan)


def _top_k(h: Tensor, k: int, count_nan: bool) -> tuple[Tensor, Tensor, Tensor]:
    counters = _counters(h, count_nan)
    values, indices = backends.for_tensor(h).maxk_cbsr(h, k, counters if count_nan else None)
    return values, indices, counters


def _linear_maxk_fake(x, weight, bias, k, count_nan):
    return _maxk_fake(x.new_empty((x.shape[0], weight.shape[0])), k, count_nan)


def _linear_maxk_setup(ctx, inputs, output):
    x, weight, bias = inputs[:3]
    ctx.bias_dtype = bias.dtype
    ctx.save_for_backward(x, weight, output[1])
    ctx.mark_non_differentiable(output[1], output[2])


def _linear_maxk_backward(ctx, grad_values, *_):
    x, weight, indices = ctx.saved_tensors
    need = ctx.needs_input_grad
    # the dense gradient is made once, for the GEMMs; the bias's comes with it
    grad_y, grad_bias = cbsr_to_dense_sums(grad_values, indices, weight.shape[0])
    return (grad_y.mm(weight) if need[0] else None, grad_y.t().mm(x) if need[1] else None,
            grad_bias.to(ctx.bias_dtype) if need[2] else None, None, None)


@operator("linear_maxk", _linear_maxk_fake, _linear_maxk_setup, _linear_maxk_backward)
def linear_maxk(x: Tensor, weight: Tensor, bias: Tensor, k: int,
                count_nan: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(values, indices, counters): :func:`maxk_cbsr` of ``x @ weight.T + bias``, whose
    backward takes the bias gradient from MaxK's k-sparse gradient as it makes it dense
    (:func:`cbsr_to_dense_sums`), not from another pass over the dense rows."""
    return _top_k(torch.addmm(bias, x, weight.t()), k, count_nan)


def _counters(x: Tensor, count_nan: bool) -> Tensor:
    """The NaN counters of an operator that reads ``x``: two zeros to count into, or (not
    counting) none, which costs no launch."""
    if count_nan:
        return torch.zeros(2, dtype=torch.int64, device=x.device)
    return torch.empty(0, dtype=torch.int64, device=x.device)


def _layer_norm_maxk_fake(x, weight, bias, eps, k, count_nan):
    _, mean, rstd = torch.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)
    values, indices, counters = _maxk_fake(x, k, count_nan)
    return values, indices, mean, rstd, counters


def _layer_norm_maxk_setup(ctx, inputs, output):
    x, weight, bias = inputs[:3]
    _, indices, mean, rstd, counters = output
    ctx.save_for_backward(x, weight, bias, mean, rstd, indices)
    ctx.mark_non_differentiable(indices, mean, rstd, counters)


def _layer_norm_maxk_backward(ctx, grad_values, *_):
    x, weight, bias, mean, rstd, indices = ctx.saved_tensors
    grads = layer_norm_backward_cbsr(grad_values, indices, x, mean, rstd, weight, bias)
    return (*_masked(grads, ctx.needs_input_grad), None, None, None)


@operator("layer_norm_maxk", _layer_norm_maxk_fake, _layer_norm_maxk_setup,
          _layer_norm_maxk_backward)
def layer_norm_maxk(x: Tensor, weight: Tensor, bias: Tensor, eps: float, k: int,
                    count_nan: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(values, indices, mean, rstd, counters): :func:`maxk_cbsr` of the LayerNorm of the
    rows of ``x`` (one kernel on a GPU), with the LayerNorm's mean and rstd."""
    counters = _counters(x, count_nan)
    values, indices, mean, rstd = backends.for_tensor(x).layer_norm_maxk(
        x, weight, bias, eps, k, counters if count_nan else None)
    return values, indices, mean, rstd, counters


def _layer_norm_backward_fake(grad_y, x, mean, rstd, weight, bias):
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)


def _layer_norm_backward_cbsr_fake(grad_values, grad_indices, x, mean, rstd, weight, bias):
    return _layer_norm_backward_fake(None, x, mean, rstd, weight, bias)


@operator("layer_norm_backward_cbsr", _layer_norm_backward_cbsr_fake)
def layer_norm_backward_cbsr(grad_values: Tensor, grad_indices: Tensor, x: Tensor, mean: Tensor,
                             rstd: Tensor, weight: Tensor,
                             bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias) of the LayerNorm for dy given as CBSR (MaxK's gradient), never
    made dense where the kernel applies."""
    grads = backends.for_tensor(x).layer_norm_backward_cbsr(
        grad_values, grad_indices, x, mean, rstd, weight, bias, (True, True, True))
    return _unshared(grads)


def _unshared(grads):
    """The LayerNorm gradients with dweight and dbias in memory of their own: the CUDA
    backend returns them as rows of one tensor, and an op's outputs may not share memory."""
    dx, dweight, dbias = grads
    return dx, dweight.clone(), dbias.clone()


# --------------------------------------------------------------------------- dense rows

def _to_dense_fake(values, indices, d):
    return values.new_empty((values.shape[0], d))


def _to_dense_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _to_dense_backward(ctx, grad):
    (indices,) = ctx.saved_tensors
    return cbsr_gather(grad, indices), None, None


@operator("cbsr_to_dense", _to_dense_fake, _to_dense_setup, _to_dense_backward)
def cbsr_to_dense(values: Tensor, indices: Tensor, d: int) -> Tensor:
    """The dense rows (N x d, values' dtype) of CBSR (values, indices)."""
    return backends.for_tensor(values).cbsr_to_dense(values, indices, d)


def _to_dense_sums_fake(values, indices, d):
    acc = torch.float64 if values.dtype == torch.float64 else torch.float32
    return values.new_empty((values.shape[0], d)), values.new_empty(d, dtype=acc)


def _to_dense_sums_backward(ctx, grad_dense, grad_sums):
    (indices,) = ctx.saved_tensors
    grad = cbsr_gather(grad_dense, indices)  # each entry reaches its row and its column sum
    return grad + grad_sums.to(grad.dtype)[indices.long()], None, None


@operator("cbsr_to_dense_sums", _to_dense_sums_fake, _to_dense_setup, _to_dense_sums_backward)
def cbsr_to_dense_sums(values: Tensor, indices: Tensor, d: int) -> tuple[Tensor, Tensor]:
    """(dense rows, column sums): :func:`cbsr_to_dense` and the sum of its rows (fp32;
    float64 for float64 values) in the same pass."""
    return backends.for_tensor(values).cbsr_to_dense_sums(values, indices, d)


def _gather_fake(dense, indices):
    return dense.new_empty(indices.shape)


def _gather_setup(ctx, inputs, output):
    ctx.width = inputs[0].shape[1]
    ctx.save_for_backward(inputs[1])


def _gather_backward(ctx, grad):
    (indices,) = ctx.saved_tensors
    return cbsr_to_dense(grad, indices, ctx.width), None


@operator("cbsr_gather", _gather_fake, _gather_setup, _gather_backward)
def cbsr_gather(dense: Tensor, indices: Tensor) -> Tensor:
    """The entries of ``dense`` (N x d) at the CBSR pattern ``indices`` (N x k)."""
    return backends.for_tensor(dense).cbsr_gather(dense, indices)


def _addmm_fake(c, values, indices, d, weight):
    return c.new_empty((values.shape[0], weight.shape[0]))


def _addmm_setup(ctx, inputs, output):
    _, values, indices, d, weight = inputs
    ctx.d = d
    ctx.save_for_backward(values, indices, weight)  # X as CBSR, not N x d


def _addmm_backward(ctx, grad):
    values, indices, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    grad_values = cbsr_gather(grad @ weight, indices) if need[1] else None
    # the dense rows again, for this one GEMM
    grad_weight = grad.t() @ cbsr_to_dense(values, indices, ctx.d) if need[4] else None
    return (grad if need[0] else None), grad_values, None, None, grad_weight


@operator("cbsr_addmm", _addmm_fake, _addmm_setup, _addmm_backward)
def cbsr_addmm(c: Tensor, values: Tensor, indices: Tensor, d: int, weight: Tensor) -> Tensor:
    """``c + dense @ weight.T`` for the dense rows of CBSR (values, indices), which the
    backward makes again instead of keeping them."""
    return torch.addmm(c, backends.for_tensor(values).cbsr_to_dense(values, indices, d),
                       weight.t())


class CBSRAddmmInPlace(torch.autograd.Function):
    """:func:`cbsr_addmm` adding into ``c`` (out-of-place, addmm copies ``c`` first: one
    N x d pass). Eager mode only: a compiled graph's ops do not write their inputs."""

    @staticmethod
    def forward(ctx, c, values, indices, d, weight):
        output = c.addmm_(backends.for_tensor(values).cbsr_to_dense(values, indices, d),
                          weight.t())
        ctx.mark_dirty(c)
        _addmm_setup(ctx, (c, values, indices, d, weight), output)
        return output

    backward = staticmethod(_addmm_backward)


def _layer_norm_fake(x, weight, bias, eps):
    return torch.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)


def _layer_norm_setup(ctx, inputs, output):
    x, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, bias, mean, rstd)
    ctx.mark_non_differentiable(mean, rstd)


def _layer_norm_backward(ctx, grad_y, *_):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    grads = layer_norm_backward(grad_y, x, mean, rstd, weight, bias)
    return (*_masked(grads, ctx.needs_input_grad), None)


@operator("layer_norm", _layer_norm_fake, _layer_norm_setup, _layer_norm_backward)
def layer_norm(x: Tensor, weight: Tensor, bias: Tensor,
               eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(y, mean, rstd) of a LayerNorm over the rows of ``x`` (N x d)."""
    return backends.for_tensor(x).layer_norm(x, weight, bias, eps)


@operator("layer_norm_backward", _layer_norm_backward_fake)
def layer_norm_backward(grad_y: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor,
                        bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias) of :func:`layer_norm`."""
    return _unshared(backends.for_tensor(x).layer_norm_backward(
        grad_y.contiguous(), x, mean, rstd, weight, bias, (True, True, True)))


# --------------------------------------------------------------------------- aggregation

def _edge_values(plan, edge_weight, norm, dtype):
    """A's value at each CSR entry: ``edge_weight`` (None: 1) times the scales of ``norm``."""
    if edge_weight is None:
        return plan.edge_values(norm, None, dtype)
    return plan.scaled(edge_weight.to(dtype), norm, dtype)


def _weight_gradient(plan, grad, norm, dtype):
    """The gradient of A's edge weights from that of its values (``grad``, per CSR entry)."""
    grad = grad.to(dtype)
    return grad if norm == "none" else grad * plan.edge_values(norm, None, dtype)


def _spgemm_fake(indptr, indices, num_src, edge_weight, norm, x_values, x_indices, d):
    return x_values.new_empty((indptr.shape[0] - 1, d))


def _spgemm_setup(ctx, inputs, output):
    indptr, indices, num_src, edge_weight, norm, x_values, x_indices, _ = inputs
    ctx.num_src, ctx.norm = num_src, norm
    ctx.save_for_backward(indptr, indices, edge_weight, x_values, x_indices)


def _spgemm_backward(ctx, grad_y):
    indptr, indices, edge_weight, x_values, x_indices = ctx.saved_tensors
    grad_weight = grad_x = None
    if ctx.needs_input_grad[3]:
        grad_weight = cbsr_sddmm(indptr, indices, ctx.num_src, ctx.norm, grad_y, x_values,
                                 x_indices).to(edge_weight.dtype)
    if ctx.needs_input_grad[5]:
        grad_x = cbsr_sspmm(indptr, indices, ctx.num_src, edge_weight, ctx.norm, grad_y,
                            x_indices)
    return None, None, None, grad_weight, None, grad_x, None, None


@operator("cbsr_spgemm", _spgemm_fake, _spgemm_setup, _spgemm_backward)
def cbsr_spgemm(indptr: Tensor, indices: Tensor, num_src: int, edge_weight: Optional[Tensor],
                norm: str, x_values: Tensor, x_indices: Tensor, d: int) -> Tensor:
    """Y = A X (num_dst x d, x_values' dtype) for X = CBSR(x_values, x_indices) of width d.
    Without edge weights A's values are node scales: X's values take the source scales, the
    kernels each row's scale (``row_scale``), and no per-edge values are read."""
    plan, dtype = GraphPlan.of(indptr, indices, num_src), _scale_dtype(x_values)
    backend = backends.for_tensor(x_values)
    if edge_weight is not None:
        y = backend.cbsr_spgemm(plan, _edge_values(plan, edge_weight, norm, dtype), x_values,
                                x_indices, d, None)
    else:
        src, dst = plan.node_scale(norm, "src", dtype), plan.node_scale(norm, "dst", dtype)
        values = x_values if src is None else x_values * src[:, None]
        y = backend.cbsr_spgemm(plan, None, values, x_indices, d, dst)
    return y.to(x_values.dtype)


def _sspmm_fake(indptr, indices, num_src, edge_weight, norm, grad_y, x_indices):
    return grad_y.new_empty(x_indices.shape)


@operator("cbsr_sspmm", _sspmm_fake)
def cbsr_sspmm(indptr: Tensor, indices: Tensor, num_src: int, edge_weight: Optional[Tensor],
               norm: str, grad_y: Tensor, x_indices: Tensor) -> Tensor:
    """The gradient of :func:`cbsr_spgemm`'s ``x_values`` (num_src x k, grad_y's dtype):
    A^T dY sampled at X's pattern."""
    plan, dtype = GraphPlan.of(indptr, indices, num_src), _scale_dtype(grad_y)
    backend, dy = backends.for_tensor(grad_y), grad_y.contiguous()
    if edge_weight is not None:
        grad_x = backend.cbsr_sspmm(plan, _edge_values(plan, edge_weight, norm, dtype), dy,
                                    x_indices, None)
        return grad_x.to(grad_y.dtype)
    src, dst = plan.node_scale(norm, "src", dtype), plan.node_scale(norm, "dst", dtype)
    if src is not None:  # scaled before the cast: unscaled half sums overflow
        dy = dy.to(torch.promote_types(dy.dtype, torch.float32))
    grad_x = backend.cbsr_sspmm(plan, None, dy, x_indices, dst)
    if src is not None:
        grad_x = grad_x * src[:, None]
    return grad_x.to(grad_y.dtype)


def _sddmm_fake(indptr, indices, num_src, norm, grad_y, x):
    return grad_y.new_empty(indices.shape, dtype=_scale_dtype(x))


def _cbsr_sddmm_fake(indptr, indices, num_src, norm, grad_y, x_values, x_indices):
    return _sddmm_fake(indptr, indices, num_src, norm, grad_y, x_values)


@operator("cbsr_sddmm", _cbsr_sddmm_fake)
def cbsr_sddmm(indptr: Tensor, indices: Tensor, num_src: int, norm: str, grad_y: Tensor,
               x_values: Tensor, x_indices: Tensor) -> Tensor:
    """The gradient of :func:`cbsr_spgemm`'s ``edge_weight`` (per CSR entry, in A's dtype)."""
    plan = GraphPlan.of(indptr, indices, num_src)
    grad = backends.for_tensor(grad_y).cbsr_sddmm(plan, grad_y.contiguous(), x_values, x_indices)
    return _weight_gradient(plan, grad, norm, _scale_dtype(x_values))


def _spmm_fake(indptr, indices, num_src, edge_weight, norm, x):
    return x.new_empty((indptr.shape[0] - 1, x.shape[1]))


def _spmm_setup(ctx, inputs, output):
    indptr, indices, num_src, edge_weight, norm, x = inputs
    ctx.num_src, ctx.norm = num_src, norm
    ctx.save_for_backward(indptr, indices, edge_weight, x)


def _spmm_backward(ctx, grad_y):
    indptr, indices, edge_weight, x = ctx.saved_tensors
    grad_weight = grad_x = None
    if ctx.needs_input_grad[3]:
        grad_weight = sddmm(indptr, indices, ctx.num_src, ctx.norm, grad_y,
                            x).to(edge_weight.dtype)
    if ctx.needs_input_grad[5]:
        grad_x = spmm_transposed(indptr, indices, ctx.num_src, edge_weight, ctx.norm, grad_y)
    return None, None, None, grad_weight, None, grad_x


@operator("spmm", _spmm_fake, _spmm_setup, _spmm_backward)
def spmm(indptr: Tensor, indices: Tensor, num_src: int, edge_weight: Optional[Tensor], norm: str,
         x: Tensor) -> Tensor:
    """Y = A X (num_dst x F, x's dtype) for dense X: torch's sparse product (cuSPARSE on
    GPUs) on every device."""
    plan = GraphPlan.of(indptr, indices, num_src)
    values = _edge_values(plan, edge_weight, norm, _scale_dtype(x))
    return backends.reference.spmm(plan, values, x).to(x.dtype)


def _spmm_transposed_fake(indptr, indices, num_src, edge_weight, norm, grad_y):
    return grad_y.new_empty((num_src, grad_y.shape[1]))


@operator("spmm_transposed", _spmm_transposed_fake)
def spmm_transposed(indptr: Tensor, indices: Tensor, num_src: int,
                    edge_weight: Optional[Tensor], norm: str, grad_y: Tensor) -> Tensor:
    """A^T dY (num_src x F, grad_y's dtype): the gradient of :func:`spmm`'s ``x``."""
    plan = GraphPlan.of(indptr, indices, num_src)
    values = _edge_values(plan, edge_weight, norm, _scale_dtype(grad_y))
    return backends.reference.spmm_transposed(plan, values, grad_y).to(grad_y.dtype)


@operator("sddmm", _sddmm_fake)
def sddmm(indptr: Tensor, indices: Tensor, num_src: int, norm: str, grad_y: Tensor,
          x: Tensor) -> Tensor:
    """The gradient of :func:`spmm`'s ``edge_weight`` (per CSR entry, in A's dtype)."""
    plan = GraphPlan.of(indptr, indices, num_src)
    return _weight_gradient(plan, backends.reference.sddmm(plan, grad_y, x), norm,
                            _scale_dtype(x))


# --------------------------------------------------------------------------- ReLU, dropout

def _relu_dropout_fake(x, seed, p, num_head, count_nan):
    return (torch.empty_like(x), x.new_empty((num_head,) + x.shape[1:]),
            x.new_empty(2 if count_nan else 0, dtype=torch.int64))


def _relu_dropout_setup(ctx, inputs, output):
    ctx.p = inputs[2]
    ctx.save_for_backward(output[0])
    ctx.mark_non_differentiable(output[2])


def _relu_dropout_backward(ctx, grad, grad_head, _grad_counters):
    (out,) = ctx.saved_tensors
    return relu_dropout_backward(out, grad, grad_head, ctx.p), None, None, None, None


@operator("relu_dropout", _relu_dropout_fake, _relu_dropout_setup, _relu_dropout_backward)
def relu_dropout(x: Tensor, seed: Optional[Tensor], p: float, num_head: int,
                 count_nan: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(out, head, counters): dropout at probability ``p`` of ``relu(x)``, with its mask
    from ``seed`` on GPUs (an int64 drawn by torch's generator); a copy of out's first
    ``num_head`` rows, whose gradient reaches the backward apart from out's; and with
    ``count_nan`` the NaN counters of x (else none). The backward keeps ``out`` only."""
    counters = _counters(x, count_nan)
    out, head = backends.for_tensor(x).relu_dropout(x, seed, p, num_head,
                                                    counters if count_nan else None)
    return out, head, counters


def _relu_dropout_backward_fake(out, grad, grad_head, p):
    return torch.empty_like(out)


def _relu_dropout_backward_setup(ctx, inputs, output):
    out, _, grad_head, ctx.p = inputs
    ctx.num_head = grad_head.shape[0]
    ctx.save_for_backward(out)


def _relu_dropout_backward_backward(ctx, grad_grad_x):
    # linear in (grad, grad_head), under the same mask and scale
    (out,) = ctx.saved_tensors
    grad_grad = relu_dropout_backward(out, grad_grad_x,
                                      grad_grad_x.new_zeros((0,) + out.shape[1:]), ctx.p)
    return None, grad_grad, grad_grad[:ctx.num_head], None


@operator("relu_dropout_backward", _relu_dropout_backward_fake, _relu_dropout_backward_setup,
          _relu_dropout_backward_backward)
def relu_dropout_backward(out: Tensor, grad: Tensor, grad_head: Tensor, p: float) -> Tensor:
    """The gradient of :func:`relu_dropout`'s ``x``: (grad, plus grad_head on the first
    rows) times the dropout's scale where out != 0, else 0 (differentiable in turn)."""
    if (grad.shape != out.shape or grad_head.shape[1:] != out.shape[1:]
            or grad_head.shape[0] > out.shape[0]):
        raise ValueError(f"relu_dropout_backward takes gradients of out's shape "
                         f"{tuple(out.shape)} and of its first rows, got "
                         f"{tuple(grad.shape)} and {tuple(grad_head.shape)}")
    return backends.for_tensor(out).relu_dropout_backward(out, grad.contiguous(),
                                                          grad_head.contiguous(), p)


# --------------------------------------------------------------------------- rows

def _nan_counters_fake(x):
    return x.new_empty(2, dtype=torch.int64)


@operator("nan_counters", _nan_counters_fake)
def nan_counters(x: Tensor) -> Tensor:
    """[NaN count, numel - flat position of the first NaN] of ``x`` (both 0 without NaN),
    int64 on its device, read by :func:`dgl_maxk.sparse.check_nan_counters`: one pass of a
    kernel on GPUs."""
    return backends.for_tensor(x).nan_counters(x)


def _gather_rows_fake(table, index):
    return table.new_empty((index.shape[0], *table.shape[1:]), device=index.device)


@operator("gather_rows", _gather_rows_fake)
def gather_rows(table: Tensor, index: Tensor) -> Tensor:
    """Rows ``index`` (int64) of ``table`` on the index's device; a table in pinned host
    memory is read there by the index's GPU directly. Not differentiable (it feeds models
    their input rows)."""
    return backends.for_tensor(index).gather_rows(table, index)
