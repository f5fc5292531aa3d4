"""The package's structure: no import circle, and no arrow running back up the layers.

From the bottom (docs/architecture.md, "Layers of the package"): checks and
config (neither imports the other); the runtime; ops and data; layers; losses; model; the loop (optim, trainer,
inference); parallel; then above the engine the workloads, the references,
the benchmark support (the instruments), the gate and the command line. A module may import its own area
and the areas below it. Every import counts, inside functions and under
TYPE_CHECKING too: an arrow drawn only for the type checker is still one a
reader follows.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gpuengine"
LEVEL = {"checks": 0, "config": 0, "runtime": 1, "ops": 2, "data": 2, "layers": 3, "losses": 4, "model": 5, "optim": 6,
         "trainer": 7, "inference": 7, "parallel": 8, "workloads": 9, "reference": 10, "bench": 11, "gate": 12,
         "__main__": 13}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """{module: the gpuengine modules it imports}, every import statement of every module."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    found: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        found[name] = {t for t in targets if t in paths and t != name}
    return found


def area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_area_has_a_level():
    assert {area(m) for m in imports()} - {"__init__"} <= set(LEVEL), "a new area needs its place in LEVEL"


def test_no_arrow_runs_back_up():
    upward = [f"{m} -> {t}" for m, targets in imports().items() for t in targets
              if area(m) in LEVEL and area(t) in LEVEL and area(m) != area(t) and LEVEL[area(t)] >= LEVEL[area(m)]]
    assert upward == []


def test_no_import_circle():
    graph, state, circles = imports(), {}, []

    def visit(module, path):
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []
