"""What every loader returns (:class:`Dataset`) and how a load fails (:class:`DatasetError`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .._dgl import dgl
from ..sampling import DeviceGraph


class DatasetError(ValueError):
    """A dataset cannot be loaded (missing or unreadable files, bad parameters); the message
    names the dataset, the file and what to do."""


class DatasetNotFound(DatasetError, FileNotFoundError):
    """A real dataset is not on disk; the message says which files to put where."""


@dataclass
class Dataset:
    """A node-classification dataset, ready for full-graph training.

    Attributes
    ----------
    name : str
    graph : DGLGraph or DeviceGraph
        A DGLGraph on the CPU, self-loops as requested; for graphs too large for that
        (papers100m-sized, ogbn-papers100M), a DeviceGraph on the training device
    features : Tensor (N, F) float32
    labels : Tensor (N,) int64, or (N, C) float32 when ``multilabel``
    train_mask, val_mask, test_mask : Tensor (N,) bool
    num_classes : int
        Classes, or tasks (labels per node) when ``multilabel``
    multilabel : bool
    metric : str
        'accuracy', 'micro_f1' or 'rocauc'
    evaluator : str or None
        The OGB dataset name whose ``Evaluator`` scores it
    notes : str
        Anything a reader of the results must know (e.g. random labels)
    """

    name: str
    graph: object
    features: torch.Tensor
    labels: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    num_classes: int
    multilabel: bool = False
    metric: str = "accuracy"
    evaluator: str | None = None
    notes: str = ""
    info: dict = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return self.features.shape[0]

    @property
    def num_features(self) -> int:
        return self.features.shape[1]

    @property
    def num_edges(self) -> int:
        if isinstance(self.graph, DeviceGraph):
            return self.graph.num_edges
        return int(self.graph.num_edges())

    def summary(self) -> dict:
        return {"name": self.name, "num_nodes": self.num_nodes,
                "num_edges": self.num_edges, "num_features": self.num_features,
                "num_classes": self.num_classes, "multilabel": self.multilabel,
                "metric": self.metric, "train": int(self.train_mask.sum()),
                "val": int(self.val_mask.sum()), "test": int(self.test_mask.sum()),
                "notes": self.notes, **self.info}

    def describe(self) -> str:
        """The dataset in one line, for run logs."""
        labels = "labels" if self.multilabel else "classes"
        return (f"{self.num_nodes:,} nodes, {self.num_edges:,} edges, "
                f"{self.num_features} features, {self.num_classes} {labels} ({self.metric}); "
                f"{int(self.train_mask.sum()):,} / {int(self.val_mask.sum()):,} / "
                f"{int(self.test_mask.sum()):,} train / val / test nodes")


def index_to_mask(index, num_nodes: int) -> torch.Tensor:
    """A boolean node mask with ``True`` at ``index``."""
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    mask[torch.as_tensor(index).long()] = True
    return mask


def build_dataset(name, g, feat, labels, train, val, test, num_classes, multilabel, metric,
                  evaluator, self_loops, notes="", info=None) -> Dataset:
    """A :class:`Dataset` from a loader's parts: the graph keeps only its structure, with
    one self-loop per node when ``self_loops``; features become float32."""
    g = dgl.graph(g.edges(), num_nodes=g.num_nodes())  # structure only, data kept below
    if self_loops:
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
    return Dataset(name=name, graph=g, features=feat.to(torch.float32).contiguous(),
                   labels=labels, train_mask=train.bool(), val_mask=val.bool(),
                   test_mask=test.bool(), num_classes=int(num_classes),
                   multilabel=multilabel, metric=metric, evaluator=evaluator, notes=notes,
                   info=dict(info or {}, self_loops=bool(self_loops)))
