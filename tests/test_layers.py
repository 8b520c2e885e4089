"""The package's layers: imports only go down, no circles, private JAX in one module.

Every ``import`` of every module is read from its source (at any depth: an
import inside a function counts as much as one at the top), so the checks
hold for the code as written, whatever runs.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The layers, bottom first: a module may import its own layer's and the ones below.
LAYERS = (
    ("evorl_pop.jax_private",),
    ("evorl_pop.base",),
    # plug-ins by name: any layer above registers into it (its checks: conformance)
    ("evorl_pop.registry", "evorl_pop.conformance"),
    ("evorl_pop.distributed",),
    ("evorl_pop.core",),
    ("evorl_pop.tasks",),
    ("evorl_pop.rl",),
    ("evorl_pop.algorithms",),
    ("evorl_pop.run",),
    ("evorl_pop.cli",),
    ("evorl_pop",),  # the package itself: it gathers the layers for its users
)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] == "algorithms":  # installed as evorl_pop.algorithms
        parts.insert(0, "evorl_pop")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_imports(root: Path) -> dict[str, set[str]]:
    """Module name -> the project modules it imports, anywhere in its source."""
    files = [*root.glob("evorl_pop/**/*.py"), *root.glob("algorithms/*.py")]
    modules = {_module_name(p, root): p for p in files}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:  # `from pkg import sub`: the submodule, if it is one
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in modules else node.module)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of the most specific layer holding ``module``."""
    best = None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[1]):
                    best = (i, prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[0]


def upward_imports(graph) -> list[str]:
    return sorted(
        f"{a} ({LAYERS[layer(a)][0]}) imports {b} ({LAYERS[layer(b)][0]})"
        for a, targets in graph.items()
        for b in targets
        if layer(b) > layer(a)
    )


def circles(graph) -> list[list[str]]:
    """Every import circle (each once, from its smallest module)."""
    found = []

    def visit(node, path):
        for nxt in sorted(graph.get(node, ())):
            if nxt == path[0]:
                found.append([*path, nxt])
            elif nxt not in path and nxt > path[0]:
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    return found


@pytest.fixture(scope="module")
def graph():
    return project_imports(ROOT)


def test_imports_only_go_down(graph):
    assert upward_imports(graph) == []


def test_no_import_circle(graph):
    assert circles(graph) == []


def test_the_checks_catch_a_circle_and_an_upward_import(tmp_path):
    """The two checks above, on a package made to break both rules."""
    (tmp_path / "evorl_pop" / "core").mkdir(parents=True)
    (tmp_path / "evorl_pop" / "run").mkdir()
    (tmp_path / "algorithms").mkdir()
    (tmp_path / "evorl_pop" / "core" / "engine.py").write_text(
        "def f():\n    from evorl_pop.run import shell  # inside a function: still counted\n"
    )
    (tmp_path / "evorl_pop" / "run" / "shell.py").write_text("import evorl_pop.core.engine\n")
    graph = project_imports(tmp_path)
    assert upward_imports(graph) == [
        "evorl_pop.core.engine (evorl_pop.core) imports evorl_pop.run.shell (evorl_pop.run)"
    ]
    assert circles(graph) == [
        ["evorl_pop.core.engine", "evorl_pop.run.shell", "evorl_pop.core.engine"]
    ]


def test_private_jax_only_in_jax_private():
    files = [*ROOT.glob("evorl_pop/**/*.py"), *ROOT.glob("algorithms/*.py")]
    users = [p.relative_to(ROOT).as_posix() for p in files if "jax._src" in p.read_text()]
    assert users == ["evorl_pop/jax_private.py"]


def test_no_source_file_over_600_lines():
    files = [*ROOT.glob("evorl_pop/**/*.py"), *ROOT.glob("algorithms/*.py")]
    long = {
        p.relative_to(ROOT).as_posix(): n
        for p in files
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert long == {}
