"""No function grows into several jobs: at most 80 lines in the product (tasks/, plugins/, dags/,
cd4ml_runtime/), 150 in benchmarks and tests, which may keep longer scripts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIMITS = {"tasks": 80, "plugins": 80, "dags": 80, "cd4ml_runtime": 80, "bench": 150, "tests": 150}


def long_functions(folder: Path, limit: int) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(folder.parent)}:{node.lineno} {node.name}: {lines} lines (limit {limit})")
    return found


@pytest.mark.parametrize("folder", sorted(LIMITS))
def test_no_function_over_the_limit(folder):
    too_long = long_functions(REPO / folder, LIMITS[folder])
    assert not too_long, "split these into named phases:\n" + "\n".join(too_long)


def test_the_check_finds_a_long_function(tmp_path):
    (tmp_path / "long.py").write_text("def f():\n" + "    x = 1\n" * 90)
    assert long_functions(tmp_path, 80)[0].endswith("f: 91 lines (limit 80)")
