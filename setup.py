"""The metadata is in setup.cfg; here: the package list, and dgl_maxk_hook.pth."""
import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# site runs .pth files in name order: this one comes after setuptools' __editable__.*.pth,
# whose finder makes _dgl_maxk_hook importable in an editable install.
HOOK_PTH = "dgl_maxk_hook.pth"


class build_py_with_hook(build_py):
    """Puts dgl_maxk_hook.pth beside the packages, so that it lands in site-packages (see
    _dgl_maxk_hook.py). An editable install (PEP 660) ships not build_py's output but the
    folder ``install`` points at, so there the file goes into that folder."""

    def run(self):
        super().run()
        target = (self.get_finalized_command("install").install_lib if self.editable_mode
                  else self.build_lib)
        self.copy_file(HOOK_PTH, os.path.join(target, HOOK_PTH), preserve_mode=False)


# Every dgl_maxk package is found; the CUDA sources (kernels/, no __init__.py) are mapped to
# dgl_maxk.kernels in setup.cfg, which find_packages cannot see.
setup(packages=find_packages(include=["dgl_maxk*"]) + ["dgl_maxk.kernels"],
      cmdclass={"build_py": build_py_with_hook})
