"""One seed of one variant: build the model, train it epoch by epoch with checkpoints,
evaluate, and write the seed's result."""
from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..models import aligned_features, build_model
from ..sampling import DeviceGraph, pinned
from ..sparse import NaNError
from .checkpoint import (comparable, inspect_seed, move_aside, own_rng_state, rng_state,
                         save_checkpoint, seed_everything, set_rng_state, write_json)
from .distributed import (all_gather_object, all_reduce_mean, any_process, data_parallel, rank,
                          synchronize, world_size)
from .errors import CheckpointError, TrainingDiverged
from .inference import layerwise_logits
from .metrics import evaluate
from .precision import autocast, precision_scope
from .sampling import epoch_loader, train_epoch
from .sampled_step import SampledStep, resolve_cuda_graph
from .sparse_input import SparseInputLinear
from .step import FullGraphStep, make_optimizer

LOG = logging.getLogger(__name__)


class Budget:
    """When to stop early (leaving a resumable checkpoint): after ``epochs`` more epochs in
    this process, or once ``seconds`` of wall time have passed."""

    def __init__(self, epochs=None, seconds=None):
        self.epochs_left = epochs
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def tick(self) -> bool:
        """Count one epoch; True when the run must stop now."""
        if self.epochs_left is not None:
            self.epochs_left -= 1
        return self.exhausted()

    def exhausted(self) -> bool:
        return (self.epochs_left is not None and self.epochs_left <= 0) or (
            self.deadline is not None and time.monotonic() >= self.deadline)


def graphed_minibatch(cfg: dict, device, world: int) -> bool:
    """Whether a run of ``cfg`` replays its mini-batch steps from a CUDA graph (where the
    batches fit): mini-batch mode, fan-outs that bound every block (no -1), and
    ``sampling.cuda_graph`` resolved for this model, device and process count."""
    sampling = cfg["sampling"]
    return cfg["mode"] == "minibatch" and resolve_cuda_graph(
        sampling["cuda_graph"], device=device, sampler=sampling["sampler"], world=world,
        fanouts=sampling["fanouts"])


class _SeedRun:
    """The model, optimizer and data of one seed's training, on its device."""

    def __init__(self, cfg: dict, dataset, seed: int, device: torch.device):
        self.cfg, self.dataset, self.seed, self.device = cfg, dataset, seed, device
        m, t = cfg["model"], cfg["train"]
        seed_everything(seed)
        dense = not t["sparse_features"]
        self.model = build_model(m["name"], dataset.num_features, m["hidden"],
                                 dataset.num_classes, m["layers"], k=m["k"],
                                 dropout=m["dropout"], nonlinearity=m["nonlinearity"],
                                 padded_input=dense).to(device)
        self.optimizer = make_optimizer(self.model.parameters(), t["lr"], t["weight_decay"])
        self.scheduler = (torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer,
                                                                     T_max=t["epochs"])
                          if t["schedule"] == "cosine" else None)
        self.graphed_batches = graphed_minibatch(cfg, device, world_size())
        # a graphed mini-batch step averages the gradients itself: DDP's hooks cannot be
        # captured
        self.train_model = (self.model if self.graphed_batches
                            else data_parallel(self.model, device))
        # a DGL graph stays on the CPU (dgl_maxk's layers move its structure); a DeviceGraph
        # is on the device already
        self.graph = dataset.graph
        sampling, minibatch = cfg["sampling"], cfg["mode"] == "minibatch"
        self.layerwise = minibatch and (sampling["inference"] == "layerwise" or (
            sampling["inference"] == "auto" and isinstance(self.graph, DeviceGraph)))
        self.device_graph = (DeviceGraph.of(self.graph, device)
                             if self.layerwise or (minibatch and sampling["sampler"] == "device")
                             else None)
        self.features = _placed_features(dataset.features, device,
                                         minibatch and sampling["features"] == "host")
        if dense:  # padded once, for lin_in's aligned GEMMs (the same model; input dropout
            # draws its mask over the padding too)
            self.features = aligned_features(self.features)
        else:
            self.model.lin_in = SparseInputLinear(self.model.lin_in)  # same state dict
            self.features = self.features.to_sparse().coalesce()
        self.labels = dataset.labels.to(device)
        self.masks = {s: getattr(dataset, f"{s}_mask").to(device)
                      for s in ("train", "val", "test")}
        self.train_idx = self.masks["train"].nonzero().squeeze(1)
        self.train_labels = self.labels[self.train_idx]
        self.full_step = self.sampled_step = None  # made at the first epoch

    def restore(self, ckpt: dict) -> dict:
        """Load a checkpoint's model, optimizer, scheduler and RNG states; its run state."""
        self.model.load_state_dict(ckpt["model"])
        # load_state_dict takes the saved groups' options: keep this device's choice of
        # fused Adam (a GPU run's checkpoint resumed on a CPU, or the other way round)
        state = ckpt["optimizer"]
        for saved, group in zip(state["param_groups"], self.optimizer.param_groups):
            saved["fused"] = group["fused"]
        self.optimizer.load_state_dict(state)
        if self.scheduler is not None:
            self.scheduler.load_state_dict(ckpt["scheduler"])
        set_rng_state(own_rng_state(ckpt["rng"], rank(), world_size()), self.device)
        return ckpt["state"]

    def save(self, path: Path, state: dict):
        # every process's random state: each drew its own dropout masks (its blocks differ)
        rng = all_gather_object(rng_state(self.device))
        if rank() != 0:  # one writer; every process resumes from the same file
            return
        save_checkpoint(path, {
            "config": comparable(self.cfg), "seed": self.seed,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "state": state, "rng": rng})

    def train_epoch(self, epoch: int) -> float:
        """One epoch of training; the mean training loss (over processes)."""
        m, t = self.cfg["model"], self.cfg["train"]
        common = dict(multilabel=self.dataset.multilabel, input_dropout=m["input_dropout"],
                      precision=t["precision"])
        if self.cfg["mode"] == "full":
            if self.full_step is None:
                self.full_step = FullGraphStep(
                    self.train_model, self.graph, self.features, self.train_labels,
                    self.optimizer, rows=self.train_idx, cuda_graph=t["cuda_graph"], **common)
            loss = float(self.full_step())
        else:
            sampling = self.cfg["sampling"]
            if self.sampled_step is None:
                if sampling["cuda_graph"] is True and not self.graphed_batches:
                    LOG.warning("sampling.cuda_graph applies to the device sampler on a GPU, "
                                "with fan-outs above 0; this run's steps are eager")
                self.sampled_step = SampledStep(
                    self.train_model, self.optimizer, sampling["fanouts"],
                    sampling["batch_size"], self.dataset.num_nodes,
                    cuda_graph=self.graphed_batches, **common)
            loader = epoch_loader(self.graph, self.train_idx.cpu(), sampling, self.seed, epoch,
                                  self.device_graph, self.features)
            stats = train_epoch(self.sampled_step, loader, self.features, self.labels,
                                self.device)
            loss = all_reduce_mean({"loss": stats["loss"]}, self.device)["loss"]
        if self.scheduler is not None:
            self.scheduler.step()
        return loss

    def evaluate(self) -> dict:
        """The metric on the train, val and test nodes, from one whole-graph forward, or
        layer by layer for those nodes (``sampling.inference``)."""
        self.model.eval()
        nodes, labels, masks = None, self.labels, self.masks
        with torch.no_grad(), autocast(self.cfg["train"]["precision"], self.device.type):
            if self.layerwise:
                nodes = (masks["train"] | masks["val"] | masks["test"]).nonzero().squeeze(1)
                logits = layerwise_logits(self.model, self.device_graph, self.features, nodes)
                labels, masks = labels[nodes], {s: m[nodes] for s, m in masks.items()}
            else:
                logits = self.model(self.graph, self.features)
        return {split: evaluate(logits.float(), labels, masks[split], self.dataset.metric,
                                self.dataset.evaluator) for split in ("train", "val", "test")}


def _placed_features(features, device, host: bool):
    """The features on ``device``, or with ``host`` in host memory (pinned for a GPU: the
    device sampler's loader copies each batch's rows from there, DGL's sampler's batches and
    the layer-wise evaluation have the GPU read them), padded there already
    (aligned_features), so that the trainer's padding keeps the pinned rows."""
    if not host:
        return features.to(device)
    rows = aligned_features(features.cpu())
    return pinned(rows) if device.type == "cuda" else rows


def _new_state() -> dict:
    return {"epoch": 0, "best": {"val": -math.inf, "epoch": None, "test": None,
                                 "train": None},
            "history": [], "train_seconds": 0.0, "eval_seconds": 0.0, "finished": False}


def _timed_epoch(run: _SeedRun, epoch: int, state: dict) -> dict:
    """Train one epoch, evaluate when due, and record both in ``state``; the epoch's row."""
    t = run.cfg["train"]
    synchronize(run.device)
    start = time.perf_counter()
    loss = run.train_epoch(epoch)
    synchronize(run.device)
    row = {"epoch": epoch, "loss": loss, "time": time.perf_counter() - start}
    if epoch % t["eval_every"] == 0 or epoch == t["epochs"]:
        start = time.perf_counter()
        row.update(run.evaluate())
        synchronize(run.device)
        row["eval_time"] = time.perf_counter() - start
        state["eval_seconds"] += row["eval_time"]
        if row["val"] > state["best"]["val"]:
            state["best"] = {"val": row["val"], "epoch": epoch, "test": row["test"],
                             "train": row["train"]}
    state["train_seconds"] += row["time"]
    state["history"].append(row)
    state["epoch"] = epoch
    return row


def _epoch_line(tag: str, row: dict, epochs: int) -> str:
    line = f"{tag}epoch {row['epoch']:4d}/{epochs} loss {row['loss']:.4f}"
    if "val" in row:
        line += f" train {row['train']:.4f} val {row['val']:.4f} test {row['test']:.4f}"
    return line + f" time {row['time'] * 1e3:.1f} ms"


def _nan_cause(features: torch.Tensor) -> str:
    """What a NaN raised in training points to: the dataset's features, or the weights
    (read only once a run has failed)."""
    values = features.values() if features.is_sparse else features
    if torch.isnan(values).any():
        return "The dataset's features hold NaN: clean them"
    return ("It arose in training (the dataset's features hold none): the weights diverged; "
            "lower train.lr")


def _run_epochs(run: _SeedRun, state: dict, ckpt_path: Path, budget, signals, progress,
                tag) -> bool:
    """Train from ``state``'s epoch to the last one, checkpointing as configured; True when
    the budget or a signal stopped it first (its checkpoint is then saved)."""
    t = run.cfg["train"]
    # on a terminal only (disable=None); the seed's score line takes its place when it ends
    bar = tqdm(total=t["epochs"], initial=state["epoch"], desc=tag.strip(" []") or "train",
               unit="epoch", disable=None if progress else True, leave=False,
               file=sys.stderr, dynamic_ncols=True)
    try:
        for epoch in range(state["epoch"] + 1, t["epochs"] + 1):
            try:
                row = _timed_epoch(run, epoch, state)
            except NaNError as err:
                raise TrainingDiverged(f"{tag}epoch {epoch}/{t['epochs']}: {err}. "
                                       f"{_nan_cause(run.features)}; checkpoints saved before "
                                       "this epoch are kept") from None
            if epoch % t["log_every"] == 0 or epoch == t["epochs"]:
                LOG.debug(_epoch_line(tag, row, t["epochs"]))  # log.txt; stdout if verbose
            if "val" in row:
                bar.set_postfix_str(f"val {row['val']:.4f}", refresh=False)
            bar.update(1)
            out_of_budget = budget is not None and budget.tick()
            stop = any_process(out_of_budget or (signals is not None and
                                                 signals.signal_name is not None), run.device)
            state["finished"] = epoch == t["epochs"]
            if state["finished"] or stop or (t["checkpoint_every"] and
                                             epoch % t["checkpoint_every"] == 0):
                run.save(ckpt_path, state)
            if stop and not state["finished"]:
                return True
    finally:
        bar.close()
    return False


def _seed_result(run: _SeedRun, state: dict) -> dict:
    history, best = state["history"], state["best"]
    return {
        "seed": run.seed, "epochs": state["epoch"], "metric": run.dataset.metric,
        "config": comparable(run.cfg),  # what a resume checks the result against
        "best_epoch": best["epoch"], "best_val": best["val"],
        "test_at_best_val": best["test"], "train_at_best_val": best["train"],
        "final": {s: history[-1].get(s) for s in ("loss", "train", "val", "test")},
        "train_seconds": state["train_seconds"], "eval_seconds": state["eval_seconds"],
        "mean_epoch_seconds": state["train_seconds"] / max(1, len(history)),
        "median_epoch_seconds": float(np.median([r["time"] for r in history])),
        "num_parameters": sum(p.numel() for p in run.model.parameters()),
        "history": history,
    }


def _seed_files(seed_dir: Path, cfg: dict, seed: int, restart_corrupt: bool):
    """The seed's files; an unreadable checkpoint is a CheckpointError, or with
    ``restart_corrupt`` moved aside (the seed then starts from scratch)."""
    files = inspect_seed(seed_dir, cfg, seed)
    if files.unreadable is not None:
        if not restart_corrupt:
            raise CheckpointError(files.unreadable)
        if rank() == 0:
            move_aside(seed_dir / "checkpoint.pt")
    return files


def run_seed(cfg: dict, dataset, seed: int, device, seed_dir: Path, budget: Budget | None
             = None, progress: bool = True, tag: str = "", signals=None,
             restart_corrupt: bool = False) -> dict | None:
    """Train one model for one seed: on the whole graph (mode 'full') or on sampled blocks
    (mode 'minibatch', data-parallel under torchrun); evaluation is on the whole graph, or
    layer by layer (``sampling.inference``).

    Runs under the config's ``train.precision`` (the caller's matmul precision comes back
    afterwards). Resumes from ``seed_dir/checkpoint.pt`` when it exists; a seed whose
    result.json is complete is not trained again. Returns the seed's result (scores, best
    epoch, history, timings), or None when ``budget`` or a signal recorded by ``signals``
    (a :class:`~dgl_maxk.training.runner.StopSignals`) stopped it early, after saving its
    checkpoint.
    """
    device, seed_dir = torch.device(device), Path(seed_dir)
    seed_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = seed_dir / "checkpoint.pt"
    files = _seed_files(seed_dir, cfg, seed, restart_corrupt)
    if files.result is not None:
        return files.result
    with precision_scope(cfg["train"]["precision"]):
        run = _SeedRun(cfg, dataset, seed, device)
        state = _new_state()
        if files.checkpoint is not None:
            state = run.restore(files.checkpoint)
            LOG.info(f"{tag}resuming from epoch {state['epoch']} ({ckpt_path})")
        stopped = _run_epochs(run, state, ckpt_path, budget, signals, progress, tag)
    if stopped:
        LOG.info(f"{tag}stopped after epoch {state['epoch']}; checkpoint saved to {ckpt_path}")
        return None
    result = _seed_result(run, state)
    if rank() == 0:
        write_json(seed_dir / "result.json", result)
    return result
