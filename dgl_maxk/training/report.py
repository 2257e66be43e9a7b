"""What a run reports: the environment it ran in, per-variant summaries and the printed
summary lines."""
from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import torch

from .. import envinfo
from .metrics import mean_std_text, stats
from .precision import MATMUL_PRECISION


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment(device, precision: str | dict) -> dict:
    """:func:`dgl_maxk.envinfo.collect` for the run's device, plus what a results file also
    needs: the host, the git commit and the precision policy of the run (``precision``: one
    name, or {variant: name} when the variants differ)."""
    env = envinfo.collect(device)
    matmul = (MATMUL_PRECISION[precision] if isinstance(precision, str)
              else {name: MATMUL_PRECISION[p] for name, p in precision.items()})
    env.update(device=str(device), host=socket.gethostname(), git_commit=_git_commit(),
               precision=precision, float32_matmul_precision=matmul,
               tf32_tensor_cores=tf32_tensor_cores(device))
    return env


def tf32_tensor_cores(device) -> bool:
    """Whether ``device`` has TF32 tensor cores (a GPU of compute capability 8.0 or later);
    where it has none, 'tf32' computes what 'fp32' does."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def variant_summary(vcfg: dict, dataset, per_seed: list) -> dict:
    """One variant's entry of results.json: its model, its dataset's sizes and split, scores
    over seeds, and the seeds."""
    m = vcfg["model"]
    return {
        "model": m["name"], "nonlinearity": m["nonlinearity"],
        "k": m["k"] if m["nonlinearity"] == "maxk" else None, "hidden": m["hidden"],
        "layers": m["layers"], "dataset": vcfg["dataset"]["name"],
        "dataset_summary": dataset.summary(), "metric": dataset.metric,
        "precision": vcfg["train"]["precision"],
        "test": stats([r["test_at_best_val"] for r in per_seed]),
        "val": stats([r["best_val"] for r in per_seed]),
        "epoch_seconds": stats([r["median_epoch_seconds"] for r in per_seed]),
        "seeds": per_seed,
    }


def summary_lines(results: dict) -> list[str]:
    """A short human summary: one line per variant with mean +- std of test at best val."""
    lines = [f"== {results['name']}: test at best validation epoch (mean ± std over seeds)"]
    for vname, v in results["variants"].items():
        t, ep = v["test"], v["epoch_seconds"]
        if t["n"] == 0:
            lines.append(f"  {vname:>10}: no finished seed")
            continue
        what = f"k={v['k']}" if v["k"] is not None else "ReLU"
        lines.append(f"  {vname:>10} ({v['model']}, {what}, hidden {v['hidden']}): "
                     f"{v['metric']} {mean_std_text(t)} "
                     f"(n={t['n']}; val {100 * v['val']['mean']:.2f}; "
                     f"{1e3 * ep['mean']:.1f} ms/epoch)")
    if not results["complete"]:
        lines.append(f"  (incomplete: continue with --resume {results['run_dir']})")
    lines.append(f"  results: {results['run_dir']}/results.json")
    return lines
