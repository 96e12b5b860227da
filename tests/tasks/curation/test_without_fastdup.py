"""Curation without fastdup (its licence: README "Licences"): the default path never imports it.

``embedding: fastdup`` is refused before any work, galleries are skipped with one log line, and
one curation run in a process where ``import fastdup`` fails decides exactly what the same
curation decides in-process. ``make test-nofastdup`` runs this folder in an install without it.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.curation import curation_features
from tasks.curation.curate import curate
from tasks.curation.curation_features import write_galleries
from tasks.curation.fastdup_optional import FastdupUnavailableError, fastdup_installed
from tasks.data import lake
from tasks.data.ingest import ingest_landing
from tasks.data.sample_data import write_digits
from tasks.ops.params import ParamsError, check_params
from tests.factories.curation import LABELS, digit, encode, outcome, plant

REPO = Path(__file__).resolve().parents[3]
# Where ``import fastdup`` may appear (always inside a function): the one lazy import for its galleries, and
# the run of its model (``embedding: fastdup``, refused before any work where fastdup is missing).
ALLOWED_IMPORTS = {("tasks/curation/fastdup_optional.py", "import_fastdup"),
                   ("tasks/curation/curation_features.py", "_run_fastdup")}


def _ingested(settings, tmp_path: Path, limit: int) -> int:
    landing = tmp_path / "landing"
    write_digits(landing, limit=limit)
    plant(landing, "eleven_resaved.png", LABELS[11], encode(digit(11), "PNG", compress_level=1))  # exact copy
    return ingest_landing(settings, run_id="ing", logical_date="2026-11-21", landing=landing).raw_version


def test_fastdup_is_imported_only_lazily_and_only_where_listed():
    found = set()
    for folder in ("tasks", "plugins", "dags", "cd4ml_runtime"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for func in [None, *[n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]]:
                nodes = ast.iter_child_nodes(tree) if func is None else ast.walk(func)
                for node in nodes:
                    names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                             else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    if any(n.split(".")[0] == "fastdup" for n in names):
                        found.add((str(path.relative_to(REPO)), func.name if func else "<module>"))
    assert found == ALLOWED_IMPORTS


def _no_fastdup_metadata(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    if name == "fastdup":
        raise PackageNotFoundError(name)
    return version(name)


def test_fastdup_embedding_is_refused_before_any_work_without_fastdup(settings, tmp_path, monkeypatch):
    raw_version = _ingested(settings, tmp_path, 12)
    monkeypatch.setitem(sys.modules, "fastdup", None)  # what an install without fastdup looks like to Python
    monkeypatch.setattr(curation_features, "package_version", _no_fastdup_metadata)  # and to importlib.metadata
    assert not fastdup_installed()
    wants = settings.model_copy(update={"curation": settings.curation.model_copy(update={"embedding": "fastdup"})})
    with pytest.raises(FastdupUnavailableError, match=r"requirements-fastdup\.txt") as refused:
        curate(wants, raw_version, run_id="fd", logical_date="2026-11-21")
    assert "curation.embedding: pixels" in str(refused.value)
    assert not lake.exists(settings.curated_table)  # nothing was written
    assert not (settings.reports_path / "curation").exists() or not any((settings.reports_path / "curation").iterdir())
    with pytest.raises(ParamsError, match=r"curation\.embedding: fastdup needs the fastdup package"):
        check_params("cd4ml_curate", wants, {"raw_version": raw_version})
    check_params("cd4ml_curate", settings, {"raw_version": raw_version})  # the default needs no fastdup


def test_galleries_are_skipped_with_one_log_line_without_fastdup(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "fastdup", None)
    data = encode(digit(0), "PNG")
    with caplog.at_level(logging.INFO, logger="tasks.curation.curation_features"):
        made = write_galleries(tmp_path / "galleries", [("a" * 64, "b" * 64, 0.99)], [],
                               {"a" * 64: data, "b" * 64: data}, {"a" * 64: "0", "b" * 64: "0"})
    assert made == {} and not (tmp_path / "galleries").exists()
    assert [r.getMessage() for r in caplog.records if "galler" in r.getMessage()] == [
        "curate: fastdup galleries skipped: fastdup is not installed (the curation page index.html lists every drop)"]


_CHILD = """
import json, sys
sys.modules["fastdup"] = None  # import fastdup now fails, as in an install without it
from tasks.curation import curation_features
from tasks.curation.curate import curate
from tasks.settings import load_settings
from tests.factories.curation import outcome
settings = load_settings()
result = curate(settings, int(sys.argv[1]), run_id="cur", logical_date="2026-11-21")
print(json.dumps({"outcome": outcome(settings, result), "galleries": result.galleries, "page": result.report_html}))
"""


def test_one_curation_without_fastdup_decides_as_with_it(settings, tmp_path):
    raw_version = _ingested(settings, tmp_path, 60)
    home = Path(os.environ["CD4ML_HOME"])
    twin = tmp_path / "twin-home"
    shutil.copytree(home, twin)  # the same raw version, curated by each process from scratch
    env = {**os.environ, "CD4ML_HOME": str(twin), "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'plugins'}"}
    child = subprocess.run([sys.executable, "-c", _CHILD, str(raw_version)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=600)
    here = curate(settings, raw_version, run_id="cur", logical_date="2026-11-21")
    assert child.returncode == 0, child.stderr[-3000:]
    answer = json.loads(child.stdout.strip().splitlines()[-1])
    assert answer["outcome"] == outcome(settings, here)
    assert answer["galleries"] == {} and Path(answer["page"]).is_file()
    assert any(not o["kept"] for o in answer["outcome"].values())  # the planted copy was dropped, in both
