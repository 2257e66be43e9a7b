"""Training MaxK-GNN models from configs (see docs/architecture.md for the layers).

- ``config``: the schema, validation, overrides and variants of a config;
- ``precision``: the run's precision policy (fp32, tf32, bf16);
- ``step``: the one training step, and the full-graph step the trainer and benchmarks run;
- ``sampled_step``: the mini-batch step the trainer and benchmarks run;
- ``sampling``: the loader of an epoch (dgl_maxk's device sampler or DGL's) and a mini-batch
  epoch;
- ``sparse_input``: a Linear on sparse input features; ``errors``: the trainer's errors;
- ``distributed``: the device and the torchrun process group;
- ``metrics``: scores and statistics;
- ``checkpoint``: atomic writes, checkpoints, RNG states, what a resume starts from;
- ``seed``: one seed's training; ``runner``: experiments (variants x seeds, run directory,
  log, signals, budget); ``report``: environment and summaries.
"""
from .config import (apply_overrides, expand_variants, load_config, parse_assignment,
                     resolve_key, validate_config)
from .errors import CheckpointError, ConfigError, RunInterrupted, TrainingDiverged
from .metrics import evaluate
from .runner import run_experiment, run_seed
from .step import train_step

__all__ = ["ConfigError", "CheckpointError", "RunInterrupted", "TrainingDiverged", "load_config",
           "validate_config", "apply_overrides", "expand_variants", "resolve_key",
           "parse_assignment", "run_experiment", "run_seed", "evaluate", "train_step"]
