"""CUDA kernels of dgl_maxk: the one module that compiles and launches them.

The functions below have the signatures and semantics of :mod:`dgl_maxk.reference`;
:mod:`dgl_maxk.ops` dispatches CUDA tensors here when :func:`available` is true. The kernels are
CUDA C++ in ``kernels/<name>.cu``, compiled at run time with CuPy's ``RawModule`` (NVRTC; nvcc if
NVRTC cannot be loaded) for the compute capability of the running GPU (CuPy passes
``-arch=sm_XY`` of the device), cached per (source, device, dtype and specialisation constants),
and launched on torch's current stream with raw device pointers (no copies).

Precision and determinism:

* ``maxk_cbsr``: exact (values copied bit for bit), deterministic; fp32, fp16, bf16 inputs.
* ``cbsr_spgemm``: fp32 accumulation. Rows of A with at most :data:`GROUP_SIZE` entries are
  summed in a fixed order and stored: bit-deterministic. Longer rows are split over several
  warps whose partial sums meet through global atomic adds: NOT bit-deterministic there (the
  rounding depends on the order of the adds).
* ``cbsr_sspmm``: global atomic adds into dX: NOT bit-deterministic.
* ``cbsr_sddmm``: no atomics, bit-deterministic.
* float64 inputs are not run by the kernels: these functions fall back to
  :mod:`dgl_maxk.reference` for them (same results, pure torch on the GPU).

Each launcher is also registered as a ``torch.library`` custom op (``dgl_maxk::maxk_cbsr``,
``dgl_maxk::cbsr_spgemm``, ``dgl_maxk::cbsr_sspmm``, ``dgl_maxk::cbsr_sddmm``) with a fake
implementation, so ``torch.compile`` treats the kernels as opaque calls of known output shape.

Per-graph data the kernels need (int32 column indices, edge groups) is derived once with
vectorised torch on the plan's device and kept in ``plan.kernel_cache``.

Set ``DGL_MAXK_CUDA_SYNC=1`` to synchronise after every launch, so that an asynchronous kernel
fault is raised at the launch that caused it.
"""
from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import torch

from . import reference
from .cbsr import index_dtype

#: Edge-group size: the most CSR entries one warp aggregates before it flushes its partial row.
GROUP_SIZE = 256

_SMEM_DEFAULT = 48 * 1024
_available = None
_sources: dict = {}
_modules: dict = {}


# --------------------------------------------------------------------------------------------
# runtime: availability, compilation, launch
# --------------------------------------------------------------------------------------------

def available() -> bool:
    """True when CuPy is importable and a CUDA GPU is present (answer cached; never raises)."""
    global _available
    if _available is None:
        try:
            ok = bool(torch.cuda.is_available())
            if ok:
                import cupy
                ok = cupy.cuda.runtime.getDeviceCount() > 0
            _available = ok
        except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean "no"
            _available = False
    return _available


def kernel_dir() -> Path:
    """The folder of the .cu files: beside this module (wheel) or in the source checkout."""
    here = Path(__file__).resolve().parent
    for cand in (here / "kernels", here.parent / "kernels"):
        if (cand / "maxk_cbsr.cu").is_file():
            return cand
    raise FileNotFoundError(f"dgl_maxk kernels not found in {here / 'kernels'} or "
                            f"{here.parent / 'kernels'}")


def _source(name: str) -> str:
    """A kernel's source with its ``#include "<file>.cuh"`` lines replaced by those files
    (so the compile needs no include path, and the cache key covers the headers)."""
    if name not in _sources:
        folder = kernel_dir()
        _sources[name] = re.sub(r'^#include "([\w.]+\.cuh)"\n',
                                lambda m: (folder / m.group(1)).read_text(),
                                (folder / f"{name}.cu").read_text(), flags=re.MULTILINE)
    return _sources[name]


def _arch(device_index: int) -> str:
    major, minor = torch.cuda.get_device_capability(device_index)
    return f"{major}{minor}"


def _kernel(name: str, func: str, defines: dict, device_index: int):
    """The compiled kernel ``func`` of ``kernels/<name>.cu`` with the given -D constants."""
    import cupy
    src = _source(name)
    key = (name, func, tuple(sorted(defines.items())), device_index, _arch(device_index),
           hash(src))
    kern = _modules.get(key)
    if kern is None:
        options = ("-std=c++17",) + tuple(f"-D{k}={v}" for k, v in sorted(defines.items()))
        with cupy.cuda.Device(device_index):
            try:
                kern = cupy.RawModule(code=src, options=options).get_function(func)
            except cupy.cuda.compiler.CompileException:
                raise
            except Exception as nvrtc_error:  # NVRTC missing: try nvcc
                try:
                    kern = cupy.RawModule(code=src, options=options,
                                          backend="nvcc").get_function(func)
                except Exception:
                    raise nvrtc_error from None
        _modules[key] = kern
    return kern


_streams: dict = {}


def _cupy_stream(index: int):
    """CuPy's handle on torch's current stream of device ``index`` (made once per stream)."""
    import cupy
    ptr = torch.cuda.current_stream(index).cuda_stream
    if (index, ptr) not in _streams:
        with warnings.catch_warnings():
            # CuPy 14 deprecates ExternalStream for protocol-based wrapping; it still works
            # and is what CuPy 13 (the cuda12 extra) has.
            warnings.simplefilter("ignore", DeprecationWarning)
            _streams[(index, ptr)] = cupy.cuda.ExternalStream(ptr, index)
    return _streams[(index, ptr)]


def _launch(kern, grid: int, block: int, args, smem: int, device: torch.device):
    import cupy
    index = device.index if device.index is not None else torch.cuda.current_device()
    with cupy.cuda.Device(index), _cupy_stream(index):
        if smem > _SMEM_DEFAULT and kern.max_dynamic_shared_size_bytes < smem:
            kern.max_dynamic_shared_size_bytes = smem
        kern((int(grid),), (int(block),), args, shared_mem=int(smem))
    if os.environ.get("DGL_MAXK_CUDA_SYNC", "0") == "1":
        torch.cuda.synchronize(index)


def _ptr(t: torch.Tensor):
    import numpy as np
    return np.uint64(t.data_ptr())


def _i64(v):
    import numpy as np
    return np.int64(v)


def _i32(v):
    import numpy as np
    return np.int32(v)


def _pow2ceil(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _value_kind(dtype) -> int:
    return {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[dtype]


_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------------------------
# per-graph data
# --------------------------------------------------------------------------------------------

def edge_groups(plan, group_size: int | None = None):
    """(group_row int32, group_start int64, indices int32) of ``plan``, built once and cached.

    Destination row r is cut into max(1, ceil(deg(r) / group_size)) groups of consecutive CSR
    entries; ``group_start`` has one more element (num_edges) so group g covers
    ``[group_start[g], group_start[g + 1])``; bit 31 of ``group_row`` marks rows of several
    groups. Vectorised torch on the plan's device (one host sync for the group count).
    """
    g = int(group_size or GROUP_SIZE)
    key = ("edge_groups", g)
    cache = plan.kernel_cache
    if key not in cache:
        if "indices_i32" not in cache:
            if plan.num_src >= 2 ** 31 or plan.num_dst >= 2 ** 31:
                raise ValueError("the CUDA kernels index nodes with int32 (< 2^31 nodes)")
            cache["indices_i32"] = plan.indices.to(torch.int32)
        dev = plan.indptr.device
        deg = plan.in_degrees
        per_row = torch.clamp((deg + (g - 1)) // g, min=1)
        total = int(per_row.sum())
        rows = torch.repeat_interleave(torch.arange(plan.num_dst, device=dev), per_row,
                                       output_size=total)
        first = torch.cumsum(per_row, 0) - per_row
        local = torch.arange(total, device=dev) - first[rows]
        start = torch.empty(total + 1, dtype=torch.int64, device=dev)
        start[:total] = plan.indptr[rows] + local * g
        start[total] = plan.num_edges
        multi = (per_row > 1)[rows]
        group_row = torch.where(multi, rows - 2 ** 31, rows).to(torch.int32)
        cache[key] = (group_row, start, cache["indices_i32"], bool((per_row > 1).any()))
    return cache[key]


# --------------------------------------------------------------------------------------------
# launch configurations
# --------------------------------------------------------------------------------------------

def _maxk_config(h: torch.Tensor, d: int):
    eb = h.element_size()
    vec = 16 // eb
    while vec > 1 and (d % vec or h.data_ptr() % (vec * eb)):
        vec //= 2
    ch = -(-d // (32 * vec))
    defines = {"ELEM_BYTES": eb, "IS_BF16": int(h.dtype == torch.bfloat16),
               "IDX_BYTES": 1 if d <= 256 else 2}
    if ch * vec <= 32:
        defines.update(VEC=vec, CH=ch, WARPS=4)
        return "maxk_reg", defines, 4, 0
    warps = max(1, min(8, _SMEM_DEFAULT // (4 * d)))
    defines.update(WARPS=warps)
    return "maxk_smem", defines, warps, warps * 4 * d


#: Variant switches of the graph kernels (see the -D constants of each .cu file). The defaults
#: are the fastest measured on an H200 (BENCHMARKS.md); scripts/bench_kernels.py --tune
#: overrides them to compare variants.
TUNE: dict = {"cbsr_spgemm": {}, "cbsr_sspmm": {}, "cbsr_sddmm": {}}
SPGEMM_DEFAULTS = {"qv": 1, "atom": 0, "shared_buf": 0, "persist": 1, "minb": 4}
SSPMM_DEFAULTS = {"persist": 1, "minb": 5, "u": 2, "slice_bytes": 32 << 20}
SDDMM_DEFAULTS = {"persist": 1, "minb": 5}


def _opt(name, key, defaults):
    return TUNE.get(name, {}).get(key, defaults.get(key))


def _aligned(t: torch.Tensor, nbytes: int) -> bool:
    return t.data_ptr() % nbytes == 0


def _spgemm_config(k: int, d: int, x_values, x_indices):
    def opt(key):
        return _opt("cbsr_spgemm", key, SPGEMM_DEFAULTS)
    qv = 4 if (opt("qv") and k % 4 == 0 and _aligned(x_values, 4 * x_values.element_size())
               and _aligned(x_indices, 4 * x_indices.element_size())) else 1
    atom = int(bool(opt("atom")))
    shared = int(bool(opt("shared_buf")) and atom)
    if qv == 4 and not shared and k < 32:  # private buffers need >= 8 busy lanes per edge
        qv = 1
    lanes = _pow2ceil(min(-(-k // qv), 32))
    if not shared:
        lanes = max(lanes, 8)
        while lanes < 32 and (32 // lanes) * d > 1024:  # <= 4 KiB of buffers per warp
            lanes *= 2
    subs = 32 // lanes
    nbuf = 1 if shared else subs
    t = _pow2ceil(-(-k // (qv * lanes)))  # powers of 2 only: fewer variants to compile
    if qv == 4:
        u = max(1, 4 // t)
    else:  # measured (H200, Reddit-sized): 8 edges in flight for k <= 8 or T >= 2, else 4
        u = 8 // t if (subs >= 4 or t >= 2) else 4
    u = opt("u") or max(1, min(u, 32 // subs))
    warps = max(1, min(8, _SMEM_DEFAULT // (nbuf * d * 4)))
    defines = {"P_L": lanes, "P_T": t, "P_U": u, "P_QV": qv, "P_ATOM": atom, "P_NB": nbuf,
               "P_D4": int(d % 4 == 0), "P_NOACC": int(bool(opt("noacc"))),
               "P_MINB": int(opt("minb")), "WARPS": warps,
               "VAL_KIND": _value_kind(x_values.dtype), "IDX_BYTES": x_indices.element_size()}
    return defines, warps, warps * nbuf * d * 4, bool(opt("persist"))


def _sspmm_config(k: int, d: int, grad_y, x_indices):
    def opt(key):
        return _opt("cbsr_sspmm", key, SSPMM_DEFAULTS)
    qv = 4 if k % 4 == 0 and _aligned(x_indices, 4 * x_indices.element_size()) else 1
    lanes = _pow2ceil(min(k // qv, 32))
    subs = 32 // lanes
    t = _pow2ceil(-(-k // (qv * lanes)))
    u = opt("u") or max(1, min(8 // t, 32 // subs))
    warps = max(1, min(8, _SMEM_DEFAULT // (d * 4)))
    defines = {"P_QV": qv, "P_L": lanes, "P_T": t, "P_U": u,
               "P_D4": int(d % 4 == 0 and _aligned(grad_y, 16)), "P_MINB": int(opt("minb")),
               "WARPS": warps, "IDX_BYTES": x_indices.element_size()}
    return defines, warps, warps * d * 4, bool(opt("persist"))


def _sddmm_config(k: int, d: int, grad_y, x_values, x_indices):
    def opt(key):
        return _opt("cbsr_sddmm", key, SDDMM_DEFAULTS)
    lanes = _pow2ceil(min(k, 32))
    subs = 32 // lanes
    t = _pow2ceil(-(-k // lanes))
    u = opt("u") or max(1, min(8 // t, 32 // subs))
    warps = max(1, min(8, _SMEM_DEFAULT // (d * 4)))
    defines = {"P_L": lanes, "P_T": t, "P_U": u,
               "P_D4": int(d % 4 == 0 and _aligned(grad_y, 16)), "P_MINB": int(opt("minb")),
               "WARPS": warps, "VAL_KIND": _value_kind(x_values.dtype),
               "IDX_BYTES": x_indices.element_size()}
    return defines, warps, warps * d * 4, bool(opt("persist"))


_grid_cache: dict = {}


def _grid(kern, warps: int, smem: int, work: int, persist: bool, device_index: int) -> int:
    """Blocks for ``work`` warp tasks: all of them, or (persistent) as many as fit at once."""
    blocks = -(-work // warps)
    if not persist:
        return blocks
    key = (id(kern), warps, smem, device_index)
    resident = _grid_cache.get(key)
    if resident is None:
        import cupy
        try:
            per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                kern.kernel.ptr, warps * 32, smem)
        except Exception:  # noqa: BLE001 - fall back to a generous guess
            per_sm = max(1, 64 // warps)
        sms = torch.cuda.get_device_properties(device_index).multi_processor_count
        resident = max(1, int(per_sm)) * sms
        _grid_cache[key] = resident
    return max(1, min(blocks, resident))


# --------------------------------------------------------------------------------------------
# kernel bodies (run by the custom ops below)
# --------------------------------------------------------------------------------------------

def _maxk_impl(h: torch.Tensor, k: int):
    n, d = h.shape
    values = torch.empty((n, k), dtype=h.dtype, device=h.device)
    indices = torch.empty((n, k), dtype=index_dtype(d), device=h.device)
    if n == 0:
        return values, indices
    func, defines, warps, smem = _maxk_config(h, d)
    kern = _kernel("maxk_cbsr", func, defines, h.device.index)
    _launch(kern, -(-n // warps), warps * 32,
            (_ptr(h), _ptr(values), _ptr(indices), _i64(n), _i32(d), _i32(k)), smem, h.device)
    return values, indices


def _spgemm_impl(group_row, group_start, col, edge_values, x_values, x_indices, num_dst: int,
                 d: int, zero: bool):
    k = x_values.shape[1]
    num_groups = group_row.numel()
    alloc = torch.zeros if zero else torch.empty
    y = alloc((num_dst, d), dtype=torch.float32, device=x_values.device)
    if num_groups == 0:
        return y
    defines, warps, smem, persist = _spgemm_config(k, d, x_values, x_indices)
    dev = x_values.device.index
    kern = _kernel("cbsr_spgemm", "cbsr_spgemm", defines, dev)
    _launch(kern, _grid(kern, warps, smem, num_groups, persist, dev), warps * 32,
            (_ptr(group_row), _ptr(group_start), _ptr(col), _ptr(edge_values), _ptr(x_values),
             _ptr(x_indices), _ptr(y), _i64(num_groups), _i32(k), _i32(d)), smem,
            x_values.device)
    return y


def _sspmm_impl(group_row, group_start, col, edge_values, grad_y, x_indices):
    n_src, k = x_indices.shape
    d = grad_y.shape[1]
    dx = torch.zeros((n_src, k), dtype=torch.float32, device=grad_y.device)
    num_groups = group_row.numel()
    if num_groups == 0 or n_src == 0 or col.numel() == 0:
        return dx
    defines, warps, smem, persist = _sspmm_config(k, d, grad_y, x_indices)
    dev = grad_y.device.index
    kern = _kernel("cbsr_sspmm", "cbsr_sspmm", defines, dev)
    grid = _grid(kern, warps, smem, num_groups, persist, dev)
    # Sources in slices whose part of dX fits in L2 (the atomics then stay there).
    # Measured (H200): 2 slices pay when dX is just over L2 (Reddit-sized, k = 64); more
    # slices re-stream the edges too often (products-sized: 10 slices were 2-3x slower).
    passes = _opt("cbsr_sspmm", "passes", SSPMM_DEFAULTS)
    if not passes:
        passes = -(-(n_src * k * 4) // _opt("cbsr_sspmm", "slice_bytes", SSPMM_DEFAULTS))
        passes = passes if passes <= 2 else 1
    step = -(-n_src // passes)
    for lo in range(0, n_src, step):
        _launch(kern, grid, warps * 32,
                (_ptr(group_row), _ptr(group_start), _ptr(col), _ptr(edge_values),
                 _ptr(grad_y), _ptr(x_indices), _ptr(dx), _i64(num_groups), _i32(k), _i32(d),
                 _i32(lo), _i32(min(n_src, lo + step))), smem, grad_y.device)
    return dx


def _sddmm_impl(group_row, group_start, col, grad_y, x_values, x_indices):
    k = x_values.shape[1]
    d = grad_y.shape[1]
    out = torch.empty(col.numel(), dtype=torch.float32, device=grad_y.device)
    num_groups = group_row.numel()
    if num_groups == 0 or col.numel() == 0:
        return out
    defines, warps, smem, persist = _sddmm_config(k, d, grad_y, x_values, x_indices)
    dev = grad_y.device.index
    kern = _kernel("cbsr_sddmm", "cbsr_sddmm", defines, dev)
    _launch(kern, _grid(kern, warps, smem, num_groups, persist, dev), warps * 32,
            (_ptr(group_row), _ptr(group_start), _ptr(col), _ptr(grad_y), _ptr(x_values),
             _ptr(x_indices), _ptr(out), _i64(num_groups), _i32(k), _i32(d)), smem,
            grad_y.device)
    return out


# --------------------------------------------------------------------------------------------
# torch.library registration
# --------------------------------------------------------------------------------------------

def _register_ops():
    """Register the kernels as torch.library custom ops; returns {name: callable}."""
    direct = {"maxk_cbsr": _maxk_impl, "cbsr_spgemm": _spgemm_impl,
              "cbsr_sspmm": _sspmm_impl, "cbsr_sddmm": _sddmm_impl}
    if not hasattr(torch.library, "custom_op"):
        return direct
    ns = getattr(torch.ops, "dgl_maxk", None)
    try:
        if ns is not None and hasattr(ns, "maxk_cbsr"):  # already registered (module reload)
            return {name: getattr(ns, name) for name in direct}
    except Exception:  # noqa: BLE001
        pass
    @torch.library.custom_op("dgl_maxk::maxk_cbsr", mutates_args=(), device_types="cuda")
    def maxk_op(h: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _maxk_impl(h, k)

    @maxk_op.register_fake
    def _(h, k):
        return (h.new_empty((h.shape[0], k)),
                h.new_empty((h.shape[0], k), dtype=index_dtype(h.shape[1])))

    @torch.library.custom_op("dgl_maxk::cbsr_spgemm", mutates_args=(), device_types="cuda")
    def spgemm_op(group_row: torch.Tensor, group_start: torch.Tensor, col: torch.Tensor,
                  edge_values: torch.Tensor, x_values: torch.Tensor, x_indices: torch.Tensor,
                  num_dst: int, d: int, zero: bool) -> torch.Tensor:
        return _spgemm_impl(group_row, group_start, col, edge_values, x_values, x_indices,
                            num_dst, d, zero)

    @spgemm_op.register_fake
    def _(group_row, group_start, col, edge_values, x_values, x_indices, num_dst, d, zero):
        return x_values.new_empty((num_dst, d), dtype=torch.float32)

    @torch.library.custom_op("dgl_maxk::cbsr_sspmm", mutates_args=(), device_types="cuda")
    def sspmm_op(group_row: torch.Tensor, group_start: torch.Tensor, col: torch.Tensor,
                 edge_values: torch.Tensor, grad_y: torch.Tensor,
                 x_indices: torch.Tensor) -> torch.Tensor:
        return _sspmm_impl(group_row, group_start, col, edge_values, grad_y, x_indices)

    @sspmm_op.register_fake
    def _(group_row, group_start, col, edge_values, grad_y, x_indices):
        return grad_y.new_empty((x_indices.shape[0], x_indices.shape[1]), dtype=torch.float32)

    @torch.library.custom_op("dgl_maxk::cbsr_sddmm", mutates_args=(), device_types="cuda")
    def sddmm_op(group_row: torch.Tensor, group_start: torch.Tensor, col: torch.Tensor,
                 grad_y: torch.Tensor, x_values: torch.Tensor,
                 x_indices: torch.Tensor) -> torch.Tensor:
        return _sddmm_impl(group_row, group_start, col, grad_y, x_values, x_indices)

    @sddmm_op.register_fake
    def _(group_row, group_start, col, grad_y, x_values, x_indices):
        return grad_y.new_empty((col.shape[0],), dtype=torch.float32)

    return {"maxk_cbsr": maxk_op, "cbsr_spgemm": spgemm_op, "cbsr_sspmm": sspmm_op,
            "cbsr_sddmm": sddmm_op}


try:
    _OPS = _register_ops()
except Exception:  # noqa: BLE001 - an old torch without custom ops: call the bodies directly
    _OPS = {"maxk_cbsr": _maxk_impl, "cbsr_spgemm": _spgemm_impl,
            "cbsr_sspmm": _sspmm_impl, "cbsr_sddmm": _sddmm_impl}


# --------------------------------------------------------------------------------------------
# the public functions (signatures of dgl_maxk.reference)
# --------------------------------------------------------------------------------------------

def maxk_cbsr(h: torch.Tensor, k: int):
    """The k largest entries of each row of ``h`` as CBSR (values, indices).

    Ties go to the lower column; each row's indices are ascending; values are copied bit for
    bit (bit-identical to :func:`dgl_maxk.reference.maxk_cbsr`). fp32 / fp16 / bf16 run the
    kernel (one warp per row, threshold search over order-preserving keys), float64 the
    reference. Deterministic.
    """
    if h.dtype not in _KERNEL_DTYPES or h.dim() != 2:
        return reference.maxk_cbsr(h, k)
    return _OPS["maxk_cbsr"](h.contiguous(), int(k))


def cbsr_spgemm(plan, edge_values, x_values, x_indices, d):
    """Y = A . X (num_dst x d, dense) for X = CBSR(x_values, x_indices) of width d.

    dtype = promote(x_values.dtype, edge_values.dtype); fp32 accumulation. Not bit-
    deterministic on rows of more than :data:`GROUP_SIZE` entries (global atomics); float64
    falls back to the reference.
    """
    dtype = torch.promote_types(x_values.dtype, edge_values.dtype)
    if dtype == torch.float64 or x_values.dtype not in _KERNEL_DTYPES or \
            dtype not in _KERNEL_DTYPES:
        return reference.cbsr_spgemm(plan, edge_values, x_values, x_indices, d)
    group_row, group_start, col, multi = edge_groups(plan)
    y = _OPS["cbsr_spgemm"](group_row, group_start, col,
                            edge_values.to(torch.float32).contiguous(), x_values.contiguous(),
                            x_indices.contiguous(), plan.num_dst, int(d), multi)
    return y if dtype == torch.float32 else y.to(dtype)


def cbsr_sspmm(plan, edge_values, grad_y, x_indices):
    """dX_cbsr[c, j] = sum_r A[r, c] * dY[r, x_indices[c, j]] (num_src x k, grad_y's dtype).

    fp32 accumulation with global atomic adds: NOT bit-deterministic. float64 falls back to
    the reference.
    """
    if grad_y.dtype not in _KERNEL_DTYPES or edge_values.dtype == torch.float64:
        return reference.cbsr_sspmm(plan, edge_values, grad_y, x_indices)
    group_row, group_start, col, _ = edge_groups(plan)
    dx = _OPS["cbsr_sspmm"](group_row, group_start, col,
                            edge_values.to(torch.float32).contiguous(),
                            grad_y.to(torch.float32).contiguous(), x_indices.contiguous())
    return dx if grad_y.dtype == torch.float32 else dx.to(grad_y.dtype)


def cbsr_sddmm(plan, grad_y, x_values, x_indices):
    """dA[e] = sum_j dY[r_e, x_indices[c_e, j]] * x_values[c_e, j] for each CSR entry e.

    The gradient of ``cbsr_spgemm`` with respect to ``edge_values`` (CSR order, grad_y's
    dtype). fp32, bit-deterministic (no atomics); float64 falls back to the reference.
    """
    if grad_y.dtype not in _KERNEL_DTYPES or x_values.dtype not in _KERNEL_DTYPES:
        return reference.cbsr_sddmm(plan, grad_y, x_values, x_indices)
    group_row, group_start, col, _ = edge_groups(plan)
    out = _OPS["cbsr_sddmm"](group_row, group_start, col, grad_y.to(torch.float32).contiguous(),
                             x_values.contiguous(), x_indices.contiguous())
    return out if grad_y.dtype == torch.float32 else out.to(grad_y.dtype)
