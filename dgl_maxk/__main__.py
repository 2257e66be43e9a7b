"""``python -m dgl_maxk train --config configs/<name>.yaml ...`` (see dgl_maxk.cli).

The arguments are parsed before torch and DGL load (``--help`` needs neither), and until the
command runs a SIGINT or SIGTERM ends it at once, in one line (see dgl_maxk.cli_start).
"""
import sys

from .cli_start import build_parser, signals_end_at_once

if __name__ == "__main__":
    with signals_end_at_once():
        parser = build_parser()
        parsed = parser.parse_known_args()
        from .cli import run  # torch and DGL
        sys.exit(run(parser, *parsed))
