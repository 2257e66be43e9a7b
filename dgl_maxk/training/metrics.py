"""Scores of a model's outputs (accuracy, micro-F1, ROC-AUC) and summary statistics."""
from __future__ import annotations

import math

import numpy as np
import torch


def evaluate(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, metric: str,
             evaluator: str | None = None) -> float:
    """The dataset's metric on the masked nodes: 'accuracy' (argmax; through the OGB
    Evaluator for OGB datasets), 'micro_f1' (multi-label, logit > 0) or 'rocauc' (OGB)."""
    logits, labels = logits[mask], labels[mask]
    if labels.shape[0] == 0:
        return float("nan")
    if metric == "accuracy":
        pred = logits.argmax(dim=1)
        if evaluator is not None:
            from ogb.nodeproppred import Evaluator
            return float(Evaluator(evaluator).eval({
                "y_true": labels.reshape(-1, 1).cpu(),
                "y_pred": pred.reshape(-1, 1).cpu()})["acc"])
        return float((pred == labels).float().mean())
    if metric == "micro_f1":
        pred = logits > 0
        truth = labels > 0.5
        tp = (pred & truth).sum().item()
        fp = (pred & ~truth).sum().item()
        fn = (~pred & truth).sum().item()
        return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0
    if metric == "rocauc":
        from ogb.nodeproppred import Evaluator
        return float(Evaluator(evaluator or "ogbn-proteins").eval({
            "y_true": labels.cpu(), "y_pred": logits.detach().cpu()})["rocauc"])
    raise ValueError(f"unknown metric {metric!r}")


def stats(values) -> dict:
    """Mean, sample standard deviation (ddof 1; None for fewer than two numbers, where it is
    undefined) and count of the numbers in ``values`` (None and NaN left out)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    arr = np.asarray(vals, dtype=np.float64)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else None,
            "n": len(vals)}


def mean_std_text(s: dict, scale: float = 100.0) -> str:
    """``mean ± std`` of a :func:`stats` result, scaled (percent by default); the mean alone
    for one number."""
    mean = f"{scale * s['mean']:.2f}"
    return mean if s["std"] is None else f"{mean} ± {scale * s['std']:.2f}"
