"""The errors a training run reports to its caller (the CLI turns each into an exit code)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A config, an override or a command-line value is invalid; the message names it."""


class CheckpointError(RuntimeError):
    """A checkpoint or run file cannot be read; the message names the file and the way on."""


class TrainingDiverged(RuntimeError):
    """NaN reached the model during training (diverged weights, or NaN in the data); the
    message names the variant, seed and epoch. Checkpoints saved before it are kept."""


class RunInterrupted(Exception):
    """A run stopped on SIGINT/SIGTERM after saving resumable checkpoints.

    Attributes: ``run_dir`` (the run directory to ``--resume``) and ``signal_name``.
    """

    def __init__(self, run_dir, signal_name: str):
        super().__init__(f"interrupted by {signal_name}; continue with --resume {run_dir}")
        self.run_dir, self.signal_name = run_dir, signal_name
