"""docs/configuration.md is generated from the settings models, and the conf files hold only overrides."""

import json
from typing import Any

import pytest
from pydantic import BaseModel

import tasks.settings as settings_module
from tasks import settings_reference
from tasks.settings import ENVIRONMENTS, REPO_ROOT, code_defaults, read_yaml


def _models() -> list[type[BaseModel]]:
    return [m for m in vars(settings_module).values()
            if isinstance(m, type) and issubclass(m, BaseModel) and m.__module__ == settings_module.__name__]


def test_the_committed_reference_is_what_the_code_generates():
    assert settings_reference.REFERENCE.read_text() == settings_reference.render(), (
        "docs/configuration.md is stale: run python -m tasks.settings_reference")


def test_every_field_says_what_it_governs():
    missing = [f"{m.__name__}.{name}" for m in _models() for name, f in m.model_fields.items()
               if len((f.description or "").strip()) < 10]
    assert not missing, f"fields without a description: {missing}"


def test_every_field_has_a_row_in_the_reference():
    text = settings_reference.render()
    keys = [row.key for row in settings_reference.rows()]
    assert len(keys) == len(set(keys)) > 150
    assert all(f"| `{key}` |" in text for key in keys)
    assert "| `training_data.sample_fraction` | float (> 0.0, <= 1.0) | `1.0` | `0.5` |" in text  # sit's override


def test_check_fails_on_a_stale_file_and_passes_once_regenerated(tmp_path, monkeypatch, capsys):
    target = tmp_path / "configuration.md"
    target.write_text("# an old reference\n")
    monkeypatch.setattr(settings_reference, "REFERENCE", target)
    assert settings_reference.main(["--check"]) == 1
    assert settings_reference.main([]) == 0 and settings_reference.main(["--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def _leaves(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _at(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return json.loads(json.dumps(data, default=list))  # tuples as lists, like YAML


def _merged(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize("name", ["base", *ENVIRONMENTS])
def test_an_environment_file_never_repeats_what_it_would_get_anyway(name):
    conf = REPO_ROOT / "conf"
    under = code_defaults() if name == "base" else _merged(code_defaults(), read_yaml(conf / "base.yaml"))
    copies = [key for key, value in _leaves(read_yaml(conf / f"{name}.yaml")) if _at(under, key) == value]
    assert not copies, f"conf/{name}.yaml repeats a default: {copies}"


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "conf" / "datasets").glob("*.yaml")), ids=lambda p: p.stem)
def test_a_dataset_file_changes_something_in_some_environment_with_every_key(path):
    conf = REPO_ROOT / "conf"
    envs = [_merged(_merged(code_defaults(), read_yaml(conf / "base.yaml")), read_yaml(conf / f"{e}.yaml"))
            for e in ENVIRONMENTS]
    no_ops = [key for key, value in _leaves(read_yaml(path)) if all(_at(env, key) == value for env in envs)]
    assert not no_ops, f"{path.name} sets what every environment has anyway: {no_ops}"
