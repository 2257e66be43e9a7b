"""What the scripts here share that dgl_maxk has no place for. Importing it puts this
checkout's dgl_maxk first on the path.

- :func:`pyplot`: matplotlib for a plot, or None (and a line saying so) where it is not
  installed: it is optional (``pip install 'dgl_maxk[plot]'``).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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
