"""What the scripts here share that dgl_maxk has no place for; the standard library alone.
Importing it puts this checkout's dgl_maxk first on the path.

- :func:`run_script`: a script parses its arguments before torch and DGL load, as
  ``python -m dgl_maxk`` does (dgl_maxk/cli_start.py): ``--help`` and a bad argument answer
  at once, and a Ctrl-C or SIGTERM while they load ends it in one line, not a traceback. A
  script defines ``build_parser()`` with the standard library and this module, then, before
  its other imports::

      if __name__ == "__main__":
          sys.exit(run_script(__file__, build_parser))

  and after loading, ``parse_args(argv)`` adds the checks that need dgl_maxk
  (:func:`checked`, with :func:`one_of` for options whose choices dgl_maxk names).
- :func:`pyplot`: matplotlib for a plot, or None (and a line saying so) where it is not
  installed: it is optional (``pip install 'dgl_maxk[plot]'``).
- the flags of the mini-batch benchmarks (bench_minibatch.py and profile_minibatch.py).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

INTERRUPTED_BEFORE_RUNNING = "interrupted before the run started; nothing was measured or written"


def _load_cli_start():
    """dgl_maxk.cli_start, which needs the standard library only, without dgl_maxk's
    ``__init__`` (which loads torch and DGL); registered under its name, so that dgl_maxk,
    loaded later, takes this same module."""
    name = "dgl_maxk.cli_start"
    if name in sys.modules or "dgl_maxk" in sys.modules:
        return importlib.import_module(name)
    package = importlib.util.find_spec("dgl_maxk")
    spec = importlib.util.spec_from_file_location(
        name, Path(package.submodule_search_locations[0]) / "cli_start.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


cli_start = _load_cli_start()
Parser, positive_int, device_name, seeds_argument = (
    cli_start.Parser, cli_start.positive_int, cli_start.device_name, cli_start.seeds_argument)


def run_script(path, build_parser) -> int:
    """The exit status of ``main()`` of the script at ``path``, imported as a module (torch
    and DGL load then) once ``build_parser()`` has parsed the command line. Until the script's
    run takes the signals over (dgl_maxk.cli.run_command), SIGINT and SIGTERM end the process
    at once, in one line."""
    build_parser().parse_args()
    with cli_start.signals_end_at_once(INTERRUPTED_BEFORE_RUNNING):
        name = Path(path).stem
        spec = importlib.util.spec_from_file_location(name, path)
        script = importlib.util.module_from_spec(spec)
        sys.modules[name] = script  # where dataclasses and pickle look its names up
        spec.loader.exec_module(script)
        return script.main()


def checked(parser, option: str, check, value):
    """``check(value)`` (of each value, for a list), an argparse type function that needs
    dgl_maxk, applied once it is loaded; its error ends the script as argparse's do."""
    try:
        return [check(v) for v in value] if isinstance(value, list) else check(value)
    except argparse.ArgumentTypeError as err:
        parser.error(f"argument {option}: {err}")


def one_of(choices):
    """The type function of argparse's ``choices``, for :func:`checked`: for the choices
    that dgl_maxk names."""
    def check(value):
        if value not in choices:
            raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from "
                                             f"{', '.join(map(str, choices))})")
        return value
    return check


def add_precision_argument(parser, scope: str):
    """``--precision`` of a script (checked with ``one_of(PRECISIONS)`` once dgl_maxk is
    loaded), applied to ``scope`` ("every arm", ...)."""
    parser.add_argument("--precision", default="tf32",
                        help=f"for {scope}: fp32, tf32 (TF32 matmuls; the paper's, default) "
                             "or bf16 (TF32 plus bfloat16 autocast)")


def pyplot():
    """``matplotlib.pyplot`` drawing to files, or None after a line saying that no plot is
    drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install 'dgl_maxk[plot]')")
        return None
    return plt


# --------------------------------------------------------------------------- mini-batch

#: --cuda-graph's modes as sampling.cuda_graph settings
GRAPH_SETTINGS = {"off": False, "auto": "auto", "on": True}
VARIANT_RULE = "relu, or maxk-k<K> for MaxK keeping K of the hidden entries (e.g. maxk-k32)"


def variant_name(text: str) -> str:
    """``--variants``: a name :func:`variant_k` reads, for argparse."""
    if text != "relu" and not re.fullmatch(r"maxk-k[1-9][0-9]*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a variant: {VARIANT_RULE}")
    return text


def variant_k(name: str) -> int | None:
    """The k of a variant's MaxK (None: ReLU)."""
    return None if name == "relu" else int(name.removeprefix("maxk-k"))


#: Each --graph's sizes (nodes, mean in-degree, feature width, classes and the training
#: seeds' share) and samplers: the flags' defaults; and its dataset.
GRAPHS = {
    "products-sized": dict(nodes=2_449_029, degree=123_718_280 / 2_449_029, features=100,
                           classes=47, train_fraction=0.08, samplers=["device", "dgl"],
                           dataset="powerlaw"),
    "papers100m-sized": dict(nodes=111_059_956, degree=1_615_685_872 / 111_059_956,
                             features=128, classes=172, train_fraction=1_207_179 / 111_059_956,
                             samplers=["device"], dataset="papers100m-sized"),
}


def add_graph_and_model_arguments(parser):
    """--graph, its sizes and the SAGE model's flags; sizes left out take --graph's
    (:func:`graph_defaults`)."""
    parser.add_argument("--graph", choices=tuple(GRAPHS), default="products-sized",
                        help="products-sized: the powerlaw dataset at ogbn-products' size "
                             "(default); papers100m-sized: the papers100m-sized dataset, built "
                             "on the GPU (device sampler only)")
    sizes = "(default: --graph's)"
    parser.add_argument("--nodes", type=positive_int, help=sizes)
    parser.add_argument("--degree", type=float, help=f"mean in-degree {sizes}")
    parser.add_argument("--features", type=positive_int, help=f"feature width {sizes}")
    parser.add_argument("--classes", type=int, help=sizes)
    parser.add_argument("--train-fraction", type=float, help=sizes)
    parser.add_argument("--hidden", type=positive_int, default=256)
    parser.add_argument("--layers", type=positive_int, default=3)


def graph_defaults(args):
    """``args`` with the sizes and samplers left out set to --graph's."""
    for key, value in GRAPHS[args.graph].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args
