"""Sphinx configuration of dgl_maxk's documentation (``sphinx-build -W -b html docs <out>``)."""
import os
import sys

# Document the checkout this file lives in, not whichever dgl_maxk is installed.
sys.path.insert(0, os.path.abspath(".."))

import dgl_maxk  # noqa: E402

project = "dgl_maxk"
author = "dgl_maxk contributors"
copyright = "dgl_maxk contributors"
release = dgl_maxk.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]

# numpy-style docstrings only
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

autodoc_member_order = "bysource"
# torch.nn.Module's docstrings say nothing about these modules' forward or extra_repr
autodoc_inherit_docstrings = False
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}

myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"dgl_maxk {release}"
