"""The package's structure: each layer imports only downwards (no cycles), imports sit at the
top of modules except for optional dependencies, and every module imports on its own."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dgl_maxk"
#: Imported inside functions on purpose: optional, heavy or GPU-only dependencies.
OPTIONAL = {"cupy", "matplotlib", "torch_geometric", "ogb"}
#: The one DGL import point imports DGL inside a function: under its graphbolt fix.
ALLOWED = {("dgl_maxk._dgl", "dgl")}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(importer: str, node) -> list[str]:
    """The dgl_maxk modules an import statement of ``importer`` names."""
    is_package = MODULES[importer].name == "__init__.py"
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("dgl_maxk")]
    base = importer if is_package else importer.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    target = node.module or "" if node.level == 0 else ".".join(
        filter(None, [base, node.module or ""]))
    if not target.startswith("dgl_maxk"):
        return []
    out = []
    for alias in node.names:  # "from . import x" may name a submodule
        sub = f"{target}.{alias.name}"
        out.append(sub if sub in MODULES else target)
    return out


def top_level_imports(name: str) -> set[str]:
    tree = ast.parse(MODULES[name].read_text())
    found = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(resolve(name, node))
    return found


def test_no_import_cycle():
    graph = {name: top_level_imports(name) for name in MODULES}
    state = {}

    def visit(name, path):
        state[name] = "open"
        for dep in sorted(graph.get(name, ())):
            if dep not in MODULES or dep == name:
                continue
            if name.startswith(dep + ".") and MODULES[dep].name == "__init__.py":
                continue  # a module importing a sibling through its own package
            if state.get(dep) == "open":
                pytest.fail("import cycle: " + " -> ".join(path + [name, dep]))
            if dep not in state:
                visit(dep, path + [name])
        state[name] = "done"

    for name in MODULES:
        if name not in state:
            visit(name, [])


#: The layers from the bottom up (docs/architecture.md): a module may import its own layer and the
#: layers below it, never one above.
LAYERS = [("dgl_maxk._dgl", "dgl_maxk._custom_ops"), ("dgl_maxk.envinfo", "dgl_maxk.sparse"),
          ("dgl_maxk.backends",), ("dgl_maxk.library", "dgl_maxk.ops"), ("dgl_maxk.patch",),
          ("dgl_maxk.nn",), ("dgl_maxk.models",), ("dgl_maxk.data", "dgl_maxk.sampling"),
          ("dgl_maxk.training",), ("dgl_maxk.cli", "dgl_maxk.cli_start", "dgl_maxk.__main__")]


def layer_of(name: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{name} is in no layer of LAYERS: add it there and to "
                         "docs/architecture.md")


def test_each_layer_imports_only_downwards():
    upward = [f"{name} (layer {layer_of(name)}) imports {dep} (layer {layer_of(dep)})"
              for name in MODULES if name != "dgl_maxk"
              for dep in top_level_imports(name)
              if dep in MODULES and dep != "dgl_maxk" and layer_of(dep) > layer_of(name)]
    assert not upward, "\n".join(upward)


def test_imports_inside_functions_are_optional_dependencies_only():
    offenders = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Import):
                    roots = {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    roots = {(node.module or "").split(".")[0]}
                elif isinstance(node, ast.ImportFrom):
                    roots = {"dgl_maxk"}
                else:
                    continue
                if not roots <= OPTIONAL | {r for m, r in ALLOWED if m == name}:
                    offenders.append(f"{name}.{func.name} (line {node.lineno}): "
                                     f"{ast.unparse(node)}")
    assert not offenders, "imports inside functions:\n" + "\n".join(offenders)


FORK_IMPORTS = """
import importlib.util, json, os, sys, traceback
# Heavy third-party imports once (DGL through dgl_maxk's own fix, loaded as a plain file so
# that the dgl_maxk package itself stays unimported); each child imports dgl_maxk afresh.
spec = importlib.util.spec_from_file_location("dgl_preload", "dgl_maxk/_dgl.py")
spec.loader.exec_module(importlib.util.module_from_spec(spec))
failed = {}
for name in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            __import__(name)
            os._exit(0)
        except BaseException:
            os.write(write, traceback.format_exc()[-1500:].encode())
            os._exit(1)
    os.close(write)
    message = os.read(read, 4096).decode()
    os.close(read)
    if os.waitpid(pid, 0)[1]:
        failed[name] = message
print(json.dumps(failed))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_every_module_imports_alone():
    """Each module imported first, in a fresh child process (forked after torch's import)."""
    names = sorted(n for n in MODULES if n != "dgl_maxk.__main__")
    proc = subprocess.run([sys.executable, "-c", FORK_IMPORTS, json.dumps(names)],
                          capture_output=True, text=True, cwd=PACKAGE.parent, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(f"{name}:\n{msg}" for name, msg in failed.items())
