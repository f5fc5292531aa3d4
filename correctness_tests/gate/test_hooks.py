"""The gate is one pytest plugin (gpuengine/gate/hooks.py): each hook defined once, its parts called in order."""
from __future__ import annotations

import ast
from pathlib import Path

import conftest
from gpuengine.gate import hooks

GATE = Path(hooks.__file__).parent


def test_no_part_of_the_gate_defines_a_hook_of_its_own():
    """A pytest_* function in a part would run in an order pluggy picks, not the one hooks.py writes down."""
    found = []
    for path in sorted(GATE.rglob("*.py")):
        if path == Path(hooks.__file__):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("pytest_"):
                found.append(f"{path.relative_to(GATE)}:{node.lineno} {node.name}")
    assert found == []


def test_the_root_conftest_registers_the_gate_as_one_plugin():
    assert [name for name in conftest.pytest_plugins if name.startswith("gpuengine")] == ["gpuengine.gate.hooks"]


def test_the_perf_tests_fixtures_come_with_the_plugin():
    assert {f.__name__ for f in hooks.FIXTURES} == {"engine_for", "kept_plan_choices", "gate_targets", "gate_test"}


def test_perf_tests_holds_the_perf_tests_and_their_conftest_only():
    """The gate's code lives in gpuengine/gate/, its own tests in correctness_tests/gate/ (issue 37)."""
    folder = Path(conftest.__file__).parent / "perf_tests"
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.endswith(".pyc"))
    others = [f for f in files if f != "conftest.py" and not (f.startswith("test_") and f.endswith(".py"))]
    assert files and others == []
