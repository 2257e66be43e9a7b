#!/usr/bin/env python
"""Run configs with ReLU and with MaxK at several k, over several seeds; write a markdown
table, a JSON file and a PNG plot (score vs k per dataset and model, ReLU as a horizontal
line).

    python scripts/reproduce.py --configs configs/cora_sage.yaml configs/cora_gcn.yaml \\
        --k 8 16 32 64 --hidden 256 64 --seeds 10 --out runs/reproduce

Each (config, hidden size) becomes one run of ``dgl_maxk.training.run_experiment`` whose
variants are ``relu`` and ``maxk<k>`` for every k; its run directory (checkpoints,
histories, results.json) lands under ``--out``. The same command again (after a Ctrl-C, say)
continues: a run whose directory under ``--out`` holds the same config is resumed, its
finished seeds kept. The summary files are ``<out>/results.{md,json}`` and, where
matplotlib is installed, ``<out>/accuracy_vs_k.png``. ``--precision`` (default tf32, the
paper's setting) is set as ``train.precision`` of every run, ReLU and MaxK alike.

Arguments, configs, every run's config (each k must fit each hidden size) and every run's
data are checked (the data loaded) before anything runs. As with ``python -m dgl_maxk
train``, a failure is one line, ``error: ...``, and the exit status says what happened: 2
bad arguments, configs or files, 3 missing or unreadable data, 4 a run stopped by a signal
(resumable with ``python -m dgl_maxk train --resume RUN_DIR``), 5 a run diverged to NaN,
130 Ctrl-C (143 SIGTERM) outside a run.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # where _common is
from _common import (Parser, add_precision_argument, checked, device_name, one_of,  # noqa: E402
                     positive_int, pyplot, run_script, seeds_argument)


def build_parser():
    """The command line, on the standard library alone (:func:`parse_args` checks the rest)."""
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", required=True)
    p.add_argument("--k", nargs="+", type=positive_int, default=[8, 16, 32, 64],
                   help="MaxK's k values; each must be <= every hidden size")
    p.add_argument("--hidden", nargs="+", type=positive_int, default=None,
                   help="hidden sizes (default: each config's own)")
    p.add_argument("--seeds", type=seeds_argument, default=3,
                   help="a count N (seeds 0..N-1) or a list 0,1,2")
    p.add_argument("--no-relu", action="store_true", help="skip the ReLU baseline")
    p.add_argument("--set", nargs="+", default=[], dest="overrides", action="extend",
                   help="overrides applied to every config (key=value)")
    p.add_argument("--device", type=device_name, default="auto",
                   help="cpu, cuda, cuda:N or auto (GPU when there is one; default)")
    p.add_argument("--out", default="runs/reproduce")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--title", default=None, help="heading of the markdown table")
    p.add_argument("--restart-corrupt", action="store_true",
                   help="when continuing runs: restart a seed whose checkpoint cannot be read "
                        "(as python -m dgl_maxk train --resume --restart-corrupt)")
    add_precision_argument(p, "every run (its train.precision)")
    return p


if __name__ == "__main__":  # before torch and DGL load: see _common.py
    sys.exit(run_script(__file__, build_parser))

import torch  # noqa: E402

from dgl_maxk import training as T  # noqa: E402
from dgl_maxk.cli import check_out_dir, device_argument, run_command  # noqa: E402
from dgl_maxk.training.checkpoint import atomic_write_bytes, write_json  # noqa: E402
from dgl_maxk.training.distributed import resolve_device  # noqa: E402
from dgl_maxk.training.metrics import mean_std_text  # noqa: E402
from dgl_maxk.training.precision import PRECISIONS  # noqa: E402
from dgl_maxk.training.runner import load_datasets, run_config  # noqa: E402
from dgl_maxk.training.report import environment  # noqa: E402


def parse_args(argv=None):
    """The arguments, checked before any work."""
    p = build_parser()
    args = p.parse_args(argv)
    checked(p, "--device", device_argument, args.device)
    checked(p, "--precision", one_of(PRECISIONS), args.precision)
    try:
        check_out_dir(Path(args.out))
    except T.ConfigError as err:
        p.error(str(err))
    return args


def main(argv=None):
    """The exit status of ``python -m dgl_maxk train`` for the same failure, after one line."""
    args = parse_args(argv)
    return run_command(lambda: reproduce(args),
                       "interrupted outside a run; no summary written (finished runs are "
                       f"under {Path(args.out) / 'runs'}: the same command continues)")


def plan_runs(args) -> list:
    """(config path, hidden size, validated config) of every run; a ConfigError naming the
    config, the hidden size and the problem (a k above the hidden size among them)."""
    plans = []
    for path in args.configs:
        base = T.load_config(path, args.overrides)
        for hidden in args.hidden or [base["model"]["hidden"]]:
            variants = {} if args.no_relu else {"relu": {"model.nonlinearity": "relu"}}
            for k in args.k:
                variants[f"maxk{k}"] = {"model.nonlinearity": "maxk", "model.k": k}
            cfg = dict(base, variants=variants, name=f"{base['name']}_h{hidden}")
            cfg = T.apply_overrides(cfg, {"model.hidden": hidden,
                                          "model.k": min(base["model"]["k"], hidden),
                                          "train.precision": args.precision,
                                          "train.seeds": args.seeds})
            try:
                plans.append((path, hidden, T.validate_config(cfg)))
            except T.ConfigError as err:
                raise T.ConfigError(f"{path} with hidden {hidden}: {err}") from None
    return plans


def reproduce(args) -> int:
    device = resolve_device(args.device)
    plans = plan_runs(args)  # everything is checked before anything runs, the data too
    if args.threads:
        torch.set_num_threads(args.threads)
    cache, rows, runs = {}, [], []
    for _, _, cfg in plans:
        load_datasets(T.expand_variants(cfg), cache)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for path, hidden, cfg in plans:
        earlier = existing_run(out / "runs", cfg)
        if earlier is not None:  # the same command again: continue, keep finished seeds
            print(f"continuing {earlier}")
            res = T.run_experiment(device=args.device, resume=earlier, progress=False,
                                   quiet=True, dataset_cache=cache,
                                   restart_corrupt=args.restart_corrupt)
        else:
            res = T.run_experiment(cfg, device=args.device, out=out / "runs", progress=False,
                                   quiet=True, dataset_cache=cache)
        runs.append(res["run_dir"])
        for vname, v in res["variants"].items():
            rows.append({"config": Path(path).stem, "dataset": v["dataset"],
                         "model": v["model"], "hidden": v["hidden"], "layers": v["layers"],
                         "variant": vname, "k": v["k"], "metric": v["metric"],
                         "mean": v["test"]["mean"], "std": v["test"]["std"],
                         "n": v["test"]["n"], "val_mean": v["val"]["mean"],
                         "epoch_ms": 1e3 * v["epoch_seconds"]["mean"],
                         "best_epochs": [s["best_epoch"] for s in v["seeds"]],
                         "run_dir": res["run_dir"]})
    elapsed = time.perf_counter() - started
    summary = {"command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
               "args": vars(args), "rows": rows, "runs": runs, "wall_seconds": elapsed,
               "environment": environment(device, args.precision),
               "configs": {str(p): c for p, _, c in plans}}
    write_json(out / "results.json", summary)
    md = markdown_table(rows, args.k, args.title, summary["command"], elapsed, args.precision)
    atomic_write_bytes(out / "results.md", lambda f: f.write(md.encode()))
    print(md)
    files = [out / "results.md", out / "results.json"]
    if plot(rows, out / "accuracy_vs_k.png"):
        files.append(out / "accuracy_vs_k.png")
    print(f"wrote {', '.join(map(str, files))}")
    return 0


def existing_run(runs: Path, cfg: dict):
    """The newest run directory under ``runs`` made for exactly ``cfg`` (its config.yaml),
    or None."""
    for run_dir in sorted(runs.glob(f"{cfg['name']}-*"), reverse=True):
        try:
            if run_config(run_dir) == cfg:
                return run_dir
        except T.ConfigError:
            continue  # not a run directory, or a damaged one
    return None


def _cell(row):
    if row is None or row["mean"] is None:
        return "-"
    return mean_std_text(row)


def markdown_table(rows, ks, title, command, elapsed, precision):
    groups = {}  # one line per run: a config at a hidden size
    for r in rows:
        groups.setdefault((r["run_dir"], r["config"], r["dataset"], r["model"], r["hidden"]),
                          {})[r["variant"]] = r
    head = ["config", "dataset", "model", "hidden", "ReLU"] + [f"MaxK k={k}" for k in ks]
    lines = [f"## {title}" if title else "## Test score at the best validation epoch",
             "", "Mean ± std over seeds (the mean alone for one seed), in percent (metric: "
             + ", ".join(sorted({r["metric"] for r in rows})) + "). In brackets: MaxK minus "
             "ReLU. Precision: " + precision + " for every run.", "",
             "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for (_, config, dataset, model, hidden), vs in groups.items():
        relu = vs.get("relu")
        cells = [config, dataset, model, str(hidden), _cell(relu)]
        for k in ks:
            r = vs.get(f"maxk{k}")
            cell = _cell(r)
            if r is not None and relu is not None and r["mean"] is not None:
                cell += f" ({100 * (r['mean'] - relu['mean']):+.2f})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    n = sorted({r["n"] for r in rows})
    wall = f"{elapsed / 60:.1f} min" if elapsed >= 60 else f"{elapsed:.0f} s"
    lines += ["", f"Seeds per cell: {', '.join(map(str, n))}. Wall time: {wall}.", "", "```",
              command, "```", ""]
    return "\n".join(lines)


def plot(rows, path) -> bool:
    """Whether the plot was drawn into ``path`` (not without matplotlib)."""
    plt = pyplot()
    if plt is None:
        return False
    panels = sorted({(r["dataset"], r["model"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (dataset, model) in zip(axes[0], panels):
        mine = [r for r in rows if r["dataset"] == dataset and r["model"] == model]
        runs = list(dict.fromkeys(r["run_dir"] for r in mine))  # one line per run
        named = len({r["config"] for r in mine}) > 1  # name the configs where several meet
        for i, run in enumerate(runs):
            color = colors[i % len(colors)]
            of_run = [r for r in mine if r["run_dir"] == run]
            label = (f"{of_run[0]['config']}, " if named else "") + f"hidden {of_run[0]['hidden']}"
            maxk = sorted((r for r in of_run if r["k"] is not None and r["mean"] is not None),
                          key=lambda r: r["k"])
            if maxk:
                ax.errorbar([r["k"] for r in maxk], [100 * r["mean"] for r in maxk],
                            yerr=[100 * (r["std"] or 0.0) for r in maxk], marker="o",
                            capsize=3, color=color, label=f"MaxK, {label}")
            relu = [r for r in of_run if r["k"] is None and r["mean"] is not None]
            if relu:
                ax.axhline(100 * relu[0]["mean"], color=color, linestyle="--",
                           label=f"ReLU, {label}")
        ax.set_xscale("log", base=2)
        ks = sorted({r["k"] for r in mine if r["k"] is not None})
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k (entries kept per row)")
        ax.set_ylabel(f"test {mine[0]['metric']} (%)")
        ax.set_title(f"{dataset} / {model}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_write_bytes(path, lambda f: fig.savefig(f, format="png", dpi=130))
    plt.close(fig)
    return True

