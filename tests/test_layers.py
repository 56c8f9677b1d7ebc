"""The import layers of the package: framework code only in the backends, imports one way.

Every import counts, also one placed inside a function. Each folder is one layer; the
package's top-level modules are the leaves, the entry points and the public re-exports.
Lowest first:

    agcheck.report, and the leaves errors, options, stencil, warn, progress   the vocabulary
    agcheck.diagnosis                                  hypotheses on report data
    agcheck.backends (backends/)                       the contract (base) and one module
                                                       per framework, drop-ins' framework side
    agcheck.core                                       the framework-free algorithm
    agcheck.engine                                     faster paths to the same verdicts
    agcheck.checks                                     the checks, each (run, piece)
    agcheck.gradcheck, agcheck.gradgradcheck           the orchestration and public entry
    agcheck.crosscheck                                 several backends compared
    agcheck.frontends, agcheck.backend, agcheck        CLI, main job, pytest plugin, drop-ins;
                                                       the public re-exports
"""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "agcheck"
#: the repository's top-level backends/, installed as agcheck.backends
BACKENDS = PACKAGE.parent / "backends"
FRAMEWORKS = {"torch", "jax", "jaxlib", "tensorflow", "tf_keras", "keras", "cupy", "mlx"}
#: modules whose framework imports are user code, not agcheck's: the main job's catalog
#: holds hand-written ports of some functions (a torch.autograd.Function, a jax.custom_vjp)
#: as examples of what users check
USER_CODE = {"agcheck.frontends.catalog_ports"}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[0] == "backends":
        parts.insert(0, "agcheck")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports (absolute names), wherever the import stands."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


MODULES = {_module_name(p): p for p in sorted([*PACKAGE.rglob("*.py"), *BACKENDS.rglob("*.py")])}
GRAPH = {name: {m for m in _imports(p) if m in MODULES and m != name} for name, p in MODULES.items()}


#: each folder of the package is one layer (backends/ is installed as agcheck.backends)
FOLDER_LAYERS = {"report": 0, "diagnosis": 1, "backends": 2, "core": 3, "engine": 4, "checks": 5,
                 "crosscheck": 7, "frontends": 8}
#: the package's own top-level modules: the leaves every layer may use, the two entry
#: points, and the public re-exports above everything
TOP_LEVEL_LAYERS = {"errors": 0, "options": 0, "stencil": 0, "warn": 0, "progress": 0,
                    "gradcheck": 6, "gradgradcheck": 6, "backend": 8, "__main__": 8}


def _rank(module: str) -> int:
    parts = module.split(".")
    if parts == ["agcheck"]:
        return max(FOLDER_LAYERS.values())
    if len(parts) == 2 and parts[1] in TOP_LEVEL_LAYERS:
        return TOP_LEVEL_LAYERS[parts[1]]
    if parts[1] in FOLDER_LAYERS:
        return FOLDER_LAYERS[parts[1]]
    raise AssertionError(f"{module} is in no layer: add its folder or top-level module above")


def test_no_framework_import_outside_the_backends():
    offenders = sorted(
        f"{name} imports {m}"
        for name, path in MODULES.items()
        if not name.startswith("agcheck.backends.") and name not in USER_CODE
        for m in _imports(path)
        if m.split(".")[0] in FRAMEWORKS
    )
    assert not offenders, offenders


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_down_the_layers(name):
    upward = sorted(m for m in GRAPH[name] if _rank(m) > _rank(name) and not (
        # a package's __init__ re-exports its own modules
        m.startswith(name + ".")
    ))
    assert not upward, f"{name} (layer {_rank(name)}) imports higher layers: {upward}"


def test_no_import_cycles():
    seen, on_path, cycles = set(), [], []

    def visit(node):
        if node in on_path:
            cycles.append(on_path[on_path.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        on_path.append(node)
        for nxt in sorted(GRAPH[node]):
            if not nxt.startswith(node + "."):  # a package importing its own modules
                visit(nxt)
        on_path.pop()

    for module in sorted(GRAPH):
        visit(module)
    assert not cycles, [" -> ".join(c) for c in cycles]


def test_the_checker_catches_a_violation(tmp_path):
    """The rules above can fail: an upward import written into a file is seen."""
    fake = tmp_path / "agcheck" / "core" / "bad.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def f():\n    from agcheck.frontends import cli\n    import torch\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "agcheck"
    try:
        found = _imports(fake)
    finally:
        PACKAGE = saved
    assert "agcheck.frontends.cli" in found and "torch" in found
    assert _rank("agcheck.frontends.cli") > _rank("agcheck.core.bad")
