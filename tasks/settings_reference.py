"""The settings reference, docs/configuration.md, generated from the models in tasks/settings.py.

``python -m tasks.settings_reference`` rewrites the file; ``--check`` only compares it and exits 1
when it is stale (a test does the same). One table per section: every key with its type and
allowed range, the code's default, what each environment file (and each dataset file) sets
instead, and the field's description. Nothing here is written by hand, so it cannot drift.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tasks.settings import (
    ABSENT,
    AWS_CONN_ID,
    DEPLOYMENT_VARIABLES,
    ENVIRONMENTS,
    REPO_ROOT,
    Settings,
    deep_merge,
    dotted_value,
    read_yaml,
)

REFERENCE = REPO_ROOT / "docs" / "configuration.md"
_NO_DEFAULT = "(required)"
_BOUNDS = ((annotated_types.Gt, ">"), (annotated_types.Ge, ">="), (annotated_types.Lt, "<"), (annotated_types.Le, "<="))


@dataclass(frozen=True)
class Row:
    key: str  # dotted, e.g. curation.outliers.min_blur; <name> stands for a mapping's own keys
    kind: str  # type and allowed range
    default: Any  # the code's default; _NO_DEFAULT when the field has none
    description: str


def _type_name(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " \\| ".join(str(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is tuple:
        item = _type_name(args[0])
        return f"list of ({item})" if " or " in item else f"list of {item}"
    if origin is dict:
        return f"mapping {_type_name(args[0])} -> {_type_name(args[1])}"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object (keys below)"
    return getattr(annotation, "__name__", str(annotation))


def _kind(field: FieldInfo) -> str:
    bounds = [f"{sign} {getattr(m, type(m).__name__.lower())}" for m in field.metadata for cls, sign in _BOUNDS
              if isinstance(m, cls)]
    return _type_name(field.annotation) + (f" ({', '.join(bounds)})" if bounds else "")


def _default(field: FieldInfo) -> Any:
    if field.is_required():
        return _NO_DEFAULT
    value = field.get_default(call_default_factory=True)
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def _value_model(annotation: Any) -> type[BaseModel] | None:
    """The model of a mapping's values (alerts.deadlines, tuning.search_space), else None."""
    args = get_args(annotation)
    if get_origin(annotation) is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1]
    return None


def _optional_model(annotation: Any) -> type[BaseModel] | None:
    """The model of an optional sub-section (release.publish: null or its keys), else None."""
    args = get_args(annotation)
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if type(None) in args and len(args) == 2 and models else None


def rows(model: type[BaseModel] = Settings, prefix: str = "") -> Iterator[Row]:
    """Every field of ``model`` and of the models inside it, in declaration order."""
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        nested = field.annotation if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) else None
        if nested is not None:  # a section or sub-section (curation.outliers): its keys, not one row
            yield from rows(nested, f"{key}.")
            continue
        if nested is None:
            yield Row(key, _kind(field), _default(field), field.description or "")
        values = _value_model(field.annotation)
        if values is not None:
            yield from rows(values, f"{key}.<{'dag_id' if name == 'deadlines' else 'name'}>.")
        optional = _optional_model(field.annotation)
        if optional is not None:
            yield from rows(optional, f"{key}.")


def _cell(value: Any) -> str:
    if value is ABSENT:
        return ""
    if value is None:
        return "`null`"
    if value == _NO_DEFAULT:
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, dict):
        value = {k: v.model_dump(mode="json", exclude_defaults=True) if isinstance(v, BaseModel) else v
                 for k, v in value.items()}
    text = value if isinstance(value, str) else json.dumps(value, default=list)
    return _escaped(f"`{text}`")


def _escaped(text: str) -> str:
    return text.replace("|", "\\|")  # a pipe would end the table cell


def _override_files(conf: Path) -> dict[str, dict[str, Any]]:
    """Column name -> the keys that file sets: each environment (over base.yaml), then each dataset."""
    base = read_yaml(conf / "base.yaml")
    columns = {env: deep_merge(base, read_yaml(conf / f"{env}.yaml")) for env in ENVIRONMENTS}
    for path in sorted((conf / "datasets").glob("*.yaml")):
        columns[f"dataset {path.stem}"] = read_yaml(path)
    return columns



def _section_table(section: str, model: type[BaseModel], columns: dict[str, dict[str, Any]]) -> list[str]:
    head = ["key", "type", "default", *columns, "description"]
    lines = [f"## `{section}`", "", model.__doc__.strip().splitlines()[0] if model.__doc__ else "", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows(model, f"{section}."):
        sets = [_cell(dotted_value(data, row.key)) for data in columns.values()]
        cells = [f"`{row.key}`", row.kind, _cell(row.default), *sets, _escaped(row.description)]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def render(conf: Path = REPO_ROOT / "conf") -> str:
    """The whole reference as Markdown, from the models and the YAML files in ``conf``."""
    columns = _override_files(conf)
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m tasks.settings_reference` from tasks/settings.py and conf/: do not edit. -->",
        "",
        "Every default lives in code (`tasks/settings.py`). `conf/base.yaml` (every environment),",
        "`conf/<env>.yaml` (`CD4ML_ENV`: sit, uat, prod) and `conf/datasets/<name>.yaml` (`CD4ML_DATASET`)",
        "hold only deliberate overrides, merged in that order key by key; the sit, uat and prod columns show",
        "what an environment sets (with base.yaml), a dataset column what that dataset sets over any",
        "environment; empty = the default. `{home}` is `CD4ML_HOME`, `{env}` the environment. Environment",
        "variables over all of it: `MLFLOW_TRACKING_URI` (tracking.uri), `CD4ML_OPTUNA_STORAGE` (tuning.storage),",
        "and what a deployment hands its pods: "
        + ", ".join(f"`{var}` ({key})" for var, key in DEPLOYMENT_VARIABLES.items()) + "; a queue URL sets",
        "the whole section to `scheme: sqs` with that `queue_url`, the queue's name as `channel` and `conn_id`",
        f"`{AWS_CONN_ID}` unless the file names an sqs queue's own. A key under an old name is refused with its new name.",
        "",
    ]
    lines += ["## Set by the loader, never in a file", "", "| key | type | description |", "|---|---|---|"]
    lines += [f"| `{r.key}` | {r.kind} | {_escaped(r.description)} |" for r in rows() if "." not in r.key]
    lines.append("")
    for name, field in Settings.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            lines += _section_table(name, field.annotation, columns)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.settings_reference", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        stale = not REFERENCE.exists() or REFERENCE.read_text() != text
        print(f"{REFERENCE} is {'stale: run python -m tasks.settings_reference' if stale else 'up to date'}")
        return 1 if stale else 0
    REFERENCE.write_text(text)
    print(f"wrote {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
