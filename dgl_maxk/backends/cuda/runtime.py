"""The CUDA runtime of dgl_maxk: is a GPU usable, compile a kernel, launch it on torch's stream.

Kernels are CUDA C++ in ``kernels/<name>.cu``, compiled at run time with CuPy's ``RawModule``
(NVRTC; nvcc if NVRTC cannot be loaded) for the compute capability of the running GPU (CuPy
passes ``-arch=sm_XY`` of the device), cached per (source, device, specialisation constants),
and launched on torch's current stream with raw device pointers (no copies).

CuPy is optional: it is imported inside the functions that need it, never at module import.
Set ``DGL_MAXK_CUDA_SYNC=1`` (read once, at import) to synchronise after every launch, so
that an asynchronous kernel fault is raised at the launch that caused it.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import warnings
from pathlib import Path

import numpy as np
import torch

#: Whether CuPy is installed (probed once, without importing it).
HAS_CUPY = importlib.util.find_spec("cupy") is not None
#: Synchronise after every launch (debugging asynchronous faults).
SYNC_AFTER_LAUNCH = os.environ.get("DGL_MAXK_CUDA_SYNC", "0") == "1"
#: Dynamic shared memory a kernel gets without opting in.
SMEM_DEFAULT = 48 * 1024

_sources: dict = {}
_modules: dict = {}
_streams: dict = {}


@functools.cache
def available() -> bool:
    """True when CuPy is importable and a CUDA GPU is present (probed once; never raises)."""
    if not HAS_CUPY or not torch.cuda.is_available():
        return False
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - a CuPy for another CUDA, no driver: all mean "no"
        return False


def kernel_dir() -> Path:
    """The folder of the .cu files: inside the installed package, or the source checkout's."""
    package = Path(__file__).resolve().parents[2]
    for cand in (package / "kernels", package.parent / "kernels"):
        if (cand / "maxk_cbsr.cu").is_file():
            return cand
    raise FileNotFoundError(f"dgl_maxk kernels not found in {package / 'kernels'} or "
                            f"{package.parent / 'kernels'}")


def source(name: str) -> str:
    """A kernel's source with its ``#include "<file>.cuh"`` lines replaced by those files,
    theirs too (so the compile needs no include path, and the cache key covers the
    headers; their include guards keep one copy of each)."""
    if name not in _sources:
        _sources[name] = _expanded((kernel_dir() / f"{name}.cu").read_text())
    return _sources[name]


def _expanded(text: str) -> str:
    return re.sub(r'^#include "([\w.]+\.cuh)"\n',
                  lambda m: _expanded((kernel_dir() / m.group(1)).read_text()), text,
                  flags=re.MULTILINE)


def kernel(name: str, func: str, defines: dict, device_index: int):
    """The compiled kernel ``func`` of ``kernels/<name>.cu`` with the given -D constants.
    Looked up at every launch: the key holds only what varies between calls (the source and
    the device's compute capability are fixed for a process)."""
    key = (name, func, tuple(sorted(defines.items())), device_index)
    kern = _modules.get(key)
    if kern is None:
        kern = _modules[key] = _compiled(name, func, defines, device_index)
    return kern


def _compiled(name: str, func: str, defines: dict, device_index: int):
    import cupy
    src = source(name)
    options = ("-std=c++17",) + tuple(f"-D{k}={v}" for k, v in sorted(defines.items()))
    with cupy.cuda.Device(device_index):
        try:
            return cupy.RawModule(code=src, options=options).get_function(func)
        except cupy.cuda.compiler.CompileException:
            raise
        except Exception as nvrtc_error:  # NVRTC missing: try nvcc
            try:
                return cupy.RawModule(code=src, options=options,
                                      backend="nvcc").get_function(func)
            except Exception:
                raise nvrtc_error from None


#: torch's current stream of a device as a raw handle, without making a torch Stream object
#: (a sixth of a launch's host time): the private binding where torch has it.
_current_stream_handle = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)


def _cupy_stream(index: int):
    """CuPy's handle on torch's current stream of device ``index`` (made once per stream)."""
    import cupy
    ptr = _current_stream_handle(index)
    stream = _streams.get((index, ptr))
    if stream is None:
        with warnings.catch_warnings():
            # CuPy 14 deprecates ExternalStream for protocol-based wrapping; it still works
            # and is what CuPy 13 (the cuda12 extra) has.
            warnings.simplefilter("ignore", DeprecationWarning)
            stream = _streams[(index, ptr)] = cupy.cuda.ExternalStream(ptr, index)
    return stream


def launch(kern, grid: int, block: int, args, smem: int, device: torch.device):
    """Launch ``kern`` on torch's current stream of ``device``."""
    import cupy
    index = device.index if device.index is not None else torch.cuda.current_device()
    with cupy.cuda.Device(index):
        if smem > SMEM_DEFAULT and kern.max_dynamic_shared_size_bytes < smem:
            kern.max_dynamic_shared_size_bytes = smem
        kern((int(grid),), (int(block),), args, shared_mem=int(smem),
             stream=_cupy_stream(index))
    if SYNC_AFTER_LAUNCH:
        torch.cuda.synchronize(index)


_grid_cache: dict = {}


def grid(kern, warps: int, smem: int, work: int, persist: bool, device_index: int) -> int:
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


def ptr(t: torch.Tensor):
    """A tensor's device pointer as a kernel argument."""
    return np.uint64(t.data_ptr())


def i64(v):
    return np.int64(v)


def i32(v):
    return np.int32(v)
