"""``python -m dgl_maxk train --config configs/<name>.yaml ...`` (see dgl_maxk.cli)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
