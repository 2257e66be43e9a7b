"""What dgl_maxk runs on: versions, CUDA and CuPy, DGL features unavailable and why.

``python -m dgl_maxk env`` prints :func:`format_report` of :func:`collect`; a run records
:func:`collect` in its results. Cheap (no GPU work; CuPy is imported only when torch sees a
GPU) and JSON-serialisable.
"""
import importlib.metadata
import importlib.util
import os
import platform
import site
from pathlib import Path

import torch

import _dgl_maxk_hook

from ._dgl import dgl

_ENV_VARS = ("DGL_MAXK_BACKEND", "DGL_MAXK_DATA", "DGL_MAXK_CACHE", "DGLBACKEND")


def _version(distribution: str):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cuda(device) -> dict:
    available = torch.cuda.is_available()
    gpus = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if available else [])
    info = {"available": available, "torch_cuda": torch.version.cuda, "gpus": gpus}
    if device is not None:
        info["device"] = str(device)
    return info


def _cupy(cuda_available: bool) -> dict:
    """Whether CuPy is installed and can run dgl_maxk's kernels (a GPU it can see)."""
    if importlib.util.find_spec("cupy") is None:
        return {"installed": False, "usable": False, "version": None,
                "problem": "not installed (pip install 'dgl_maxk[cuda12]' or '[cuda13]')"}
    if not cuda_available:
        return {"installed": True, "usable": False, "version": None,
                "problem": "torch sees no CUDA device"}
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # noqa: BLE001 - any failure means "not usable": report it
        return {"installed": True, "usable": False, "version": None,
                "problem": f"{type(err).__name__}: {err}"}
    return {"installed": True, "usable": count > 0, "version": cupy.__version__,
            "problem": None if count > 0 else "CuPy sees no CUDA device"}


def _startup_hook():
    """The dgl_maxk_hook.pth that lets ``import dgl`` come first, or None."""
    folders = site.getsitepackages() + [site.getusersitepackages()]
    found = [Path(f) / "dgl_maxk_hook.pth" for f in folders
             if (Path(f) / "dgl_maxk_hook.pth").is_file()]
    return str(found[0]) if found else None


def _cpu_model():
    """The CPU's model name (Linux's /proc/cpuinfo; platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def collect(device=None) -> dict:
    """The environment as a JSON-serialisable dict (``device``: the one a run uses)."""
    cuda = _cuda(device)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "dgl_maxk": _version("dgl_maxk"),
        "dgl_maxk_path": str(Path(__file__).resolve().parent),
        "torch": torch.__version__,
        "dgl": dgl.__version__,
        "numpy": _version("numpy"),
        "ogb": _version("ogb"),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda": cuda,
        "cupy": _cupy(cuda["available"]),
        "dgl_unavailable": _dgl_maxk_hook.unavailable_features(
            Path(dgl.__file__).parent, torch.__version__),
        "startup_hook": _startup_hook(),
        "environment": {name: os.environ.get(name) for name in _ENV_VARS},
    }


def format_report(info: dict) -> str:
    """``info`` (from :func:`collect`) as lines for a person."""
    cuda, cupy = info["cuda"], info["cupy"]
    backend = info["environment"]["DGL_MAXK_BACKEND"] or "auto"
    lines = [
        f"dgl_maxk {info['dgl_maxk'] or '(not installed)'} from {info['dgl_maxk_path']}",
        f"python {info['python']} on {info['platform']}",
        f"torch {info['torch']}, dgl {info['dgl']}, ogb {info['ogb']}, numpy {info['numpy']}",
        f"CPU: {info['cpu'] or 'unknown'} ({info['cpu_count']} cores); torch CPU threads: "
        f"{info['torch_threads']}; float32 matmul precision: "
        f"{info['float32_matmul_precision']}",
        f"CUDA: " + (f"available ({', '.join(cuda['gpus'])}; torch built for CUDA "
                     f"{cuda['torch_cuda']})" if cuda["available"] else "not available"),
        "CuPy: " + (f"{cupy['version']}, usable" if cupy["usable"]
                    else f"{'installed' if cupy['installed'] else 'missing'}, not usable: "
                         f"{cupy['problem']}"),
        f"kernels: DGL_MAXK_BACKEND={backend} -> CUDA tensors use "
        + ("the CUDA kernels" if cupy["usable"] and backend != "torch"
           else "the pure-torch path"),
    ]
    unavailable = info["dgl_unavailable"]
    lines.append("DGL features unavailable: none" if not unavailable else
                 "DGL features unavailable (DGL's graphs, dgl.nn, sampling and DataLoader "
                 "work without them):")
    lines += [f"  {module}: {reason}" for module, reason in unavailable.items()]
    lines.append("import dgl before dgl_maxk: " + (
        f"works (start-up hook {info['startup_hook']})" if info["startup_hook"] else
        "import dgl_maxk first (no start-up hook installed: pip install dgl_maxk)"))
    lines += [f"{name}={value}" for name, value in info["environment"].items()
              if value is not None]
    return "\n".join(lines)
