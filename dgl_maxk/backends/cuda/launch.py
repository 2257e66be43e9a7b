"""Launch configurations of the CUDA kernels: one table of defaults and the heuristics.

Each kernel's variant switches are the ``-D`` constants of its ``.cu`` file (``P_L`` lanes per
edge, ``P_T`` values per lane, ``P_U`` edges in flight, ``P_QV`` vector width, ``P_MINB``
minimum resident blocks, ``WARPS`` per block, ...). :data:`DEFAULTS` holds the host-side
choices, the fastest measured on an H200 (docs/performance.md); :func:`overrides` replaces
some of them inside a ``with`` block (``scripts/bench_kernels.py --tune`` compares variants
that way, the GPU tests vary the edge-group size).
"""
from __future__ import annotations

import contextlib

import torch

from .runtime import SMEM_DEFAULT

#: Host-side defaults per kernel; ``group_size`` is the most CSR entries one warp aggregates
#: before it flushes its partial row (the edge-group size of every graph kernel).
DEFAULTS = {
    "group_size": 256,
    "cbsr_spgemm": {"qv": 1, "persist": 1, "minb": 4, "banked": 1,
                    "banked_max_bytes": 96 << 20, "packed": 1, "pairs_max_k": 16},
    "cbsr_sspmm": {"persist": 1, "minb": 5, "u": 2, "unsliced_bytes": 32 << 20,
                   "slice_bytes": 16 << 20, "max_slices": 4, "reread_bytes": 8 << 30,
                   "min_source_entries": 8, "prefetch": 1},
    "cbsr_sddmm": {"persist": 1, "minb": 5, "prefetch": 1},
    "sample_neighbors": {"max_fanout": 64, "threads": 256},
    "dense_rows": {"warps": 8},
    "gather_rows": {"warps": 8},
    "nan_counters": {"warps": 8, "unroll": 4},
    "relu_dropout": {"warps": 8},
}
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Every option a kernel's configuration reads (the defaults and the variants of --tune).
_OPTIONS = {"cbsr_spgemm": {"qv", "persist", "minb", "u", "banked", "banked_max_bytes",
                            "packed", "pairs_max_k"},
            "cbsr_sspmm": {"persist", "minb", "u", "unsliced_bytes", "slice_bytes",
                           "max_slices", "slices", "reread_bytes", "min_source_entries",
                           "prefetch"},
            "cbsr_sddmm": {"persist", "minb", "u", "prefetch"},
            "sample_neighbors": {"max_fanout", "threads"},
            "dense_rows": {"warps"}, "gather_rows": {"warps"},
            "nan_counters": {"warps", "unroll"}, "relu_dropout": {"warps"}}

#: The overrides in effect (the stack's top), seen by every thread: autograd runs a CUDA
#: backward on its own thread, which a context variable's value would not reach.
_OVERRIDES = [{}]


@contextlib.contextmanager
def overrides(group_size: int | None = None, **per_kernel: dict):
    """Replace launch defaults inside a ``with`` block, e.g.
    ``overrides(group_size=32, cbsr_spgemm={"qv": 4})``. They hold in every thread while the
    block runs (a backward included; a device loader's sampler thread reads them as it
    samples), so blocks in two threads must not overlap: one that ends out of turn raises."""
    merged = dict(_OVERRIDES[-1])
    if group_size is not None:
        merged["group_size"] = int(group_size)
    kernels = sorted(k for k in DEFAULTS if k != "group_size")
    for name, values in per_kernel.items():
        if name not in kernels:
            raise ValueError(f"no kernel {name!r}; kernels: {kernels}")
        unknown = set(values) - _OPTIONS[name]
        if unknown:
            raise ValueError(f"no launch option {sorted(unknown)} for {name}; options: "
                             f"{sorted(_OPTIONS[name])}")
        merged[name] = {**merged.get(name, {}), **values}
    _OVERRIDES.append(merged)
    try:
        yield
    finally:
        if _OVERRIDES[-1] is not merged:
            raise RuntimeError("launch overrides ended out of turn (blocks overlapping in two "
                               "threads?)")
        _OVERRIDES.pop()


def group_size() -> int:
    return _OVERRIDES[-1].get("group_size", DEFAULTS["group_size"])


def option(kernel: str, key: str):
    """A kernel's launch option: the override in effect, else the default (None if unset)."""
    return _OVERRIDES[-1].get(kernel, {}).get(key, DEFAULTS[kernel].get(key))


def _pow2ceil(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _aligned(t: torch.Tensor, nbytes: int) -> bool:
    return t.data_ptr() % nbytes == 0


def _four_entry_loads(*tensors) -> bool:
    """Whether 4 consecutive entries of each of these CBSR tensors (values, indices) load
    as one vector (the tensor starts at a multiple of 4 entries' bytes)."""
    return all(_aligned(t, 4 * t.element_size()) for t in tensors)


def float4_rows(*tensors) -> bool:
    """Whether the rows of these 2-D fp32 tensors can be read as float4 vectors (contiguous,
    width a multiple of 4, 16-byte aligned)."""
    return all(t.dtype == torch.float32 and t.is_contiguous() and t.shape[-1] % 4 == 0
               and _aligned(t, 16) for t in tensors)


def value_kind(dtype) -> int:
    """VAL_KIND of a value dtype: 0 fp32, 1 fp16, 2 bf16."""
    return {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[dtype]


def maxk_config(h: torch.Tensor, d: int, k: int):
    """(function, defines, warps, shared bytes) of the top-k kernel for rows of width d."""
    eb = h.element_size()
    vec = 16 // eb
    while vec > 1 and (d % vec or h.data_ptr() % (vec * eb)):
        vec //= 2
    ch = -(-d // (32 * vec))
    defines = {"ELEM_BYTES": eb, "IS_BF16": int(h.dtype == torch.bfloat16),
               "IDX_BYTES": 1 if d <= 256 else 2}
    if ch * vec <= 32:
        cbsr_bytes = h.shape[0] * k * (eb + defines["IDX_BYTES"])
        defines.update(VEC=vec, CH=ch, WARPS=4, FULL_ROWS=int(d == ch * 32 * vec),
                       **bank_order(k, d, cbsr_bytes, vec))
        return "maxk_reg", defines, 4, 0
    warps = max(1, min(8, SMEM_DEFAULT // (4 * d)))
    defines.update(WARPS=warps)
    return "maxk_smem", defines, warps, warps * 4 * d


def bank_order(k: int, d: int, cbsr_bytes: int, vec: int = 1) -> dict:
    """``ORDER_L`` / ``ORDER_QV`` / ``ORDER_STEPS`` of the top-k kernel's ``maxk_reg`` (rows
    in registers; ``maxk_smem``, for wider rows, writes ascending columns) for a CBSR matrix
    of ``cbsr_bytes``: the order of each row's entries in which the forward's lanes of one
    step hit distinct shared-memory banks (maxk_cbsr.cu), where it pays
    (:func:`_bank_ordered`); else ascending columns (ORDER_L 0)."""
    lanes, qv = spgemm_lanes(k, d, True)
    if _bank_ordered(k, lanes, qv, cbsr_bytes) and lanes >= vec:
        return {"ORDER_L": lanes, "ORDER_QV": qv, "ORDER_STEPS": k // lanes}
    return {"ORDER_L": 0}


def _bank_ordered(k: int, lanes: int, qv: int, cbsr_bytes: int) -> bool:
    """Whether the forward's rows are in the top-k kernel's bank order (the ``banked`` option
    of ``cbsr_spgemm`` switches it with the bank windows): k / L >= 2 whole steps per edge,
    and a CBSR matrix of at most ``banked_max_bytes``. Measured (H200,
    docs/performance.md): a forward whose gathers hit L2 is bound by its shared-memory
    accumulation, and the order takes 8% off it (Reddit-sized, k = 32: 37 MB of CBSR); a
    larger one is bound by its gathers from DRAM, gains nothing, and the order costs the
    top-k kernel up to 20% (products-sized, k = 32: 392 MB)."""
    return (bool(option("cbsr_spgemm", "banked")) and k % (lanes * qv) == 0
            and k >= 2 * lanes and cbsr_bytes <= option("cbsr_spgemm", "banked_max_bytes"))


#: The widest rows the dense-row kernels hold in registers (32 fp32 values per lane; the
#: LayerNorm backward holds five rows' worth, so at most 16 values per lane).
DENSE_ROWS_MAX_WIDTH = 1024
LAYER_NORM_BACKWARD_MAX_WIDTH = 512


def to_dense_config(values, indices, d: int):
    """(defines, warps, shared bytes) of ``cbsr_to_dense`` (one warp per row): rows of whole
    16-byte vectors are built in shared memory (STAGED) where they fit."""
    warps = option("dense_rows", "warps")
    eb = values.element_size()
    defines = {"ELEM_BYTES": eb, "IDX_BYTES": indices.element_size(), "WARPS": warps}
    smem = warps * d * eb
    staged = (d * eb) % 16 == 0 and smem <= SMEM_DEFAULT
    return dict(defines, STAGED=int(staged)), warps, smem if staged else 0


def gather_config(dense, indices):
    """(defines, threads per block) of ``cbsr_gather`` (one thread per entry)."""
    warps = option("dense_rows", "warps")
    return ({"ELEM_BYTES": dense.element_size(), "IDX_BYTES": indices.element_size(),
             "WARPS": warps}, warps * 32)


def layer_norm_config(d: int):
    """(defines, warps) of ``layer_norm`` and ``layer_norm_backward``: 4 * ceil(d / 128)
    values per lane."""
    warps = option("dense_rows", "warps")
    return {"RV": 4 * -(-d // 128), "WARPS": warps}, warps


def spgemm_lanes(k: int, d: int, aligned: bool):
    """(lanes per edge L, entries per lane-load QV) of the forward for rows of k CBSR entries
    and width d (``aligned``: 4 entries can be loaded as one vector)."""
    qv = 4 if option("cbsr_spgemm", "qv") and k % 4 == 0 and aligned else 1
    if qv == 4 and k < 32:  # the private buffers need >= 8 busy lanes per edge, so 2-wide
        # loads from k = 16: fewer, wider gathers (H200, Reddit-sized, d = 256: k = 16
        # 3.14 -> 2.95 ms, k = 24 5.33 -> 4.43 ms)
        qv = 2 if k >= 16 else 1
    lanes = wanted = max(_pow2ceil(min(-(-k // qv), 32)), 8)
    while lanes < 32 and (32 // lanes) * d > 1024:  # about 4 KiB of buffers per warp
        lanes *= 2
    if lanes > wanted and lanes * qv > k:  # wide loads would leave lanes idle
        qv = 1
    return lanes, qv


def spgemm_buffer_stride(d: int, lanes: int, banked: bool) -> int:
    """Floats of the forward's shared-memory buffer per sub-group of ``lanes`` lanes, handed
    to cbsr_spgemm.cu as ``P_PAD`` = stride - d (which it checks against its layout). With
    bank windows ceil(d / L) * L (the sub-groups' windows interleave: ceil(d / L) rows of 32
    banks in all); else the buffers lie one after the other, the least stride >= d that is
    L more than a multiple of 32 apart (each sub-group's column c in its own bank; one
    sub-group of 32 lanes: d)."""
    if banked:
        return -(-d // lanes) * lanes
    return d + ((lanes - d) & 31) if lanes < 32 else d


#: ``P_PACKED``: how the forward's launch hands it X's entries (kernels.py writes them).
ENTRIES_APART, ENTRIES_PACKED, ENTRIES_PAIRED = 0, 1, 2


def spgemm_entries(x_values) -> int:
    """How the forward gathers X's entries (``P_PACKED``): half-precision values packed with
    their indices, each entry one 32-bit word (value bits low, index high); fp32 values of
    rows of at most ``pairs_max_k`` entries paired with their indices as int32 (8 bytes an
    entry); else values and indices apart. Packed or paired, the launch writes the entries
    afresh (aligned, whatever the input's storage), a transient of N x k x 4 or 8 bytes
    (products-sized fp32 rows of k = 16: 313 MB), and an entry comes in one load, one L1
    wavefront an edge where apart took two. ``overrides(cbsr_spgemm={"pairs_max_k": 0})``
    keeps fp32 rows apart; ``{"packed": 0}`` keeps every dtype apart.
    Measured (H200, d = 256, the writing pass included; docs/performance.md), against apart:
    packed bf16 Reddit-sized k = 8 / 32 / 64 -10% / -11% / -22% (k = 16 level),
    products-sized -16% to -31%, d = 512 -11% (k = 16) and -25% (k = 64); paired fp32
    Reddit-sized k = 4 / 8 / 12 / 16 -8% / +1% / -7% / -3%, products-sized k = 8 / 16
    -23% / -15%, but k = 24 / 32 / 64 +7% / +12% / +28% (8 bytes an entry against 5)."""
    if not option("cbsr_spgemm", "packed"):
        return ENTRIES_APART
    if x_values.element_size() == 2:
        return ENTRIES_PACKED
    if (x_values.dtype == torch.float32
            and x_values.shape[1] <= option("cbsr_spgemm", "pairs_max_k")):
        return ENTRIES_PAIRED
    return ENTRIES_APART


def spgemm_config(k: int, d: int, x_values, x_indices, edge_values=None):
    """(defines, warps, shared bytes, persistent) of the forward SpGEMM (``edge_values``:
    whether the edges carry values, or count 1 each; ``P_PACKED``: how the entries are to
    be handed, :func:`spgemm_entries`; ``P_PAD``: :func:`spgemm_buffer_stride` - d)."""
    def opt(key):
        return option("cbsr_spgemm", key)
    form = spgemm_entries(x_values)
    aligned = form != ENTRIES_APART or _four_entry_loads(x_values, x_indices)
    lanes, qv = spgemm_lanes(k, d, aligned)
    subs = 32 // lanes
    t = _pow2ceil(-(-k // (qv * lanes)))  # powers of 2 only: fewer variants to compile
    if qv > 1:  # measured (H200, Reddit-sized, QV 2 at k = 16): 4 edges, 3.10 -> 2.95 ms
        u = max(1, 4 // t)
    else:  # measured (H200, Reddit-sized): 8 edges in flight for k <= 8 or T >= 2, else 4
        u = 8 // t if (subs >= 4 or t >= 2) else 4
    u = opt("u") or max(1, min(u, 32 // subs))
    # bank windows per sub-group pay where the top-k kernel's bank order applies
    cbsr_bytes = x_values.shape[0] * k * (x_values.element_size() + x_indices.element_size())
    banked = int(lanes < 32 and _bank_ordered(k, lanes, qv, cbsr_bytes))
    stride = spgemm_buffer_stride(d, lanes, banked)
    warps = max(1, min(8, SMEM_DEFAULT // (subs * stride * 4)))
    defines = {"P_L": lanes, "P_T": t, "P_U": u, "P_QV": qv, "P_D4": int(d % 4 == 0),
               "P_BANKED": banked, "P_PAD": stride - d, "P_MINB": int(opt("minb")),
               "WARPS": warps, "VAL_KIND": value_kind(x_values.dtype),
               "IDX_BYTES": x_indices.element_size(),
               "P_EDGE_VALUES": int(edge_values is not None), "P_PACKED": form}
    return defines, warps, warps * subs * stride * 4, bool(opt("persist"))


def _row_kernel_config(kernel: str, k: int, d: int, grad_y, qv: int):
    """What SSpMM and SDDMM share: lanes per edge, values per lane, edges in flight, warps
    (each warp stages d-wide dY rows in shared memory: two with ``prefetch``, the next
    group's row copied in while a group is walked, where both fit the default 48 KiB;
    wider rows stage one, which is all the opt-in shared memory they ever needed: two rows
    of d = 32768 would pass every GPU's limit, 227 KiB on sm_90)."""
    lanes = _pow2ceil(min(-(-k // qv), 32))
    subs = 32 // lanes
    t = _pow2ceil(-(-k // (qv * lanes)))
    # entries a lane has in flight (the SDDMM's; the SSpMM sets its own u): 8 with 4-entry
    # loads, 4 with 1-entry ones, which spill past 4 under the 48-register cap of 8 warps
    # at 5 blocks (H200, Reddit-sized, k = 15 / 30 / 31 / 62 and rows misaligned at k = 32:
    # 3-9% faster than with 8; docs/performance.md)
    in_flight = 8 if qv == 4 else 4
    u = option(kernel, "u") or max(1, min(in_flight // (t * qv), 32 // subs))
    d4 = int(d % 4 == 0 and _aligned(grad_y, 16))
    prefetch = int(bool(option(kernel, "prefetch")) and d4 and 2 * d * 4 <= SMEM_DEFAULT)
    row_bytes = (1 + prefetch) * d * 4
    warps = max(1, min(8, SMEM_DEFAULT // row_bytes))
    defines = {"P_L": lanes, "P_T": t, "P_U": u, "P_D4": d4, "P_PREFETCH": prefetch,
               "P_MINB": int(option(kernel, "minb")), "WARPS": warps}
    return defines, warps, warps * row_bytes, bool(option(kernel, "persist"))


def sspmm_config(k: int, d: int, grad_y, x_indices, edge_values=None):
    """(defines, warps, shared bytes, persistent) of the backward SSpMM (``edge_values`` as
    in :func:`spgemm_config`)."""
    qv = 4 if k % 4 == 0 and _four_entry_loads(x_indices) else 1
    defines, warps, smem, persist = _row_kernel_config("cbsr_sspmm", k, d, grad_y, qv)
    defines.update(P_QV=qv, IDX_BYTES=x_indices.element_size(),
                   P_EDGE_VALUES=int(edge_values is not None))
    return defines, warps, smem, persist


def sddmm_config(k: int, d: int, grad_y, x_values, x_indices):
    """(defines, warps, shared bytes, persistent) of the edge-gradient SDDMM."""
    qv = 4 if k % 4 == 0 and _four_entry_loads(x_values, x_indices) else 1
    defines, warps, smem, persist = _row_kernel_config("cbsr_sddmm", k, d, grad_y, qv)
    defines.update(P_QV=qv, VAL_KIND=value_kind(x_values.dtype),
                   IDX_BYTES=x_indices.element_size())
    return defines, warps, smem, persist


def sspmm_slices(n_src: int, n_entries: int, k: int, dy_bytes: int) -> int:
    """Source slices of the SSpMM's walk (``GraphPlan.source_slices``), so that the part of
    dX that takes the atomic adds stays in L2. One slice while dX fits in ``unsliced_bytes``,
    or where the sources take fewer than ``min_source_entries`` entries each on average
    (DGL's sampled blocks: about one, so L2 has no second add to a row to keep it for, and a
    block's slices cost two host syncs to build). Otherwise slices of at most
    ``slice_bytes`` of dX, at most ``max_slices``, and no more than keep the dY rows
    (``dy_bytes``, which each slice reads again) under ``reread_bytes`` in all.

    Measured on an H200 (d = 256; docs/performance.md): the fastest measured count, or one
    tied with it, in every case: Reddit-sized k = 64 kernel 9.84 -> 8.88 ms (epoch 81.6 ->
    78.5), products-sized k = 8 6.03 -> 5.89; medium k = 32 (dX 24 MiB) 1 slice 0.47 ms,
    2 slices 0.53; a block of 599k sources and 662k entries 1 slice best or tied at k = 32
    and 64, and 1.6 ms to build its slices."""
    slices = option("cbsr_sspmm", "slices")
    if slices:
        return slices
    dx_bytes = n_src * k * 4
    if (dx_bytes <= option("cbsr_sspmm", "unsliced_bytes")
            or n_entries < option("cbsr_sspmm", "min_source_entries") * n_src):
        return 1
    slices = min(-(-dx_bytes // option("cbsr_sspmm", "slice_bytes")),
                 option("cbsr_sspmm", "max_slices"),
                 option("cbsr_sspmm", "reread_bytes") // max(1, dy_bytes))
    return max(1, slices)


def sample_config():
    """(defines, threads per block) of the neighbour sampler: ``MAX_FANOUT`` is the longest
    pick list a thread holds (larger fan-outs go to the reference)."""
    return ({"MAX_FANOUT": option("sample_neighbors", "max_fanout")},
            option("sample_neighbors", "threads"))


def nan_counters_config(x: torch.Tensor):
    """(defines, warps per block) of the NaN scan: each thread loads the widest word (16
    bytes down to one element) that divides the tensor's address and size."""
    size = x.numel() * x.element_size()
    word = next(w for w in (16, 8, 4, 2) if size % w == 0 and _aligned(x, w))
    warps = option("nan_counters", "warps")
    return ({"WORD_BYTES": word, "ELEM_BYTES": x.element_size(),
             "IS_BF16": int(x.dtype == torch.bfloat16), "WARPS": warps,
             "UNROLL": option("nan_counters", "unroll")}, warps)


def gather_rows_config(row_bytes: int, *tensors):
    """(defines, warps per block) of the row gather: each lane moves the widest word (16 bytes
    down to 1) that divides the row and the addresses of ``tensors``."""
    word = next(w for w in (16, 8, 4, 2, 1)
                if row_bytes % w == 0 and all(t.data_ptr() % w == 0 for t in tensors))
    warps = option("gather_rows", "warps")
    return {"WORD_BYTES": word, "WARPS": warps}, warps
