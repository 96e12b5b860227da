"""``cd4ml lineage MODEL_URI``: the whole chain behind one model version, from raw data to approvals.

For ``models:/<name>/<version>`` or ``models:/<name>@<alias>``: the registered version and its
aliases; where it came from (trained in this environment, or copied from an upstream one, then
followed there); the MLflow run (parameters, git commit, requirements hash, config hash); the
training data (the sample or curated Delta table and version, the curated version a sample was
cut from, the raw version, each with its commit metadata); the validation, curation, drift and
gate reports; and every release-ledger row that names the version (promotions, approvals,
rollbacks) in each environment.
"""

from __future__ import annotations

import re
from typing import Any

from tasks.data import lake
from tasks.models.registry import (
    TAG_COPIED_FROM,
    TAG_CURATED_TABLE,
    TAG_CURATED_VERSION,
    UnknownModelVersionError,
    alias_version,
    get_model_version,
    mlflow_client,
)
from tasks.release import audit
from tasks.settings import ENVIRONMENTS, Settings, load_settings

URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w-]+))$")


class LineageUriError(UnknownModelVersionError):
    """Not a models:/ URI this project can resolve."""


def _settings_for_model(name: str, home: str | None) -> Settings:
    for env in ENVIRONMENTS:
        settings = load_settings(env, home=home)
        if settings.registry.model_name == name:
            return settings
    raise LineageUriError(f"{name!r} is not the registered model of any environment ({', '.join(ENVIRONMENTS)})")


def _commit(uri: str, version: int) -> dict[str, Any]:
    if not lake.exists(uri):
        return {"version": version, "missing": f"no Delta table at {uri}"}
    commit = lake.commit_at(uri, version)
    if commit is None:
        return {"version": version, "missing": "no such commit (vacuumed or never written)"}
    return {"version": version, **commit.metadata}


def _data_chain(table: str, version: int) -> dict[str, Any]:
    """The training table version, back through a sample to the curated and raw versions."""
    chain: dict[str, Any] = {"table": table, "version": version, "commit": _commit(table, version)}
    meta = chain["commit"]
    if meta.get("step") == "sample" and meta.get("curated_table"):
        chain["sampled_from"] = _data_chain(meta["curated_table"], int(meta["curated_version"]))
        return chain
    raw = meta.get("raw_version")
    if raw not in (None, "", "None"):
        raw_table = f"{table.rsplit('/', 1)[0]}/raw_images"
        chain["raw"] = {"table": raw_table, "version": int(raw), "commit": _commit(raw_table, int(raw))}
    return chain


def _raw_version(chain: dict[str, Any]) -> int | None:
    while "sampled_from" in chain:
        chain = chain["sampled_from"]
    return chain.get("raw", {}).get("version")


def _reports(settings: Settings, raw: int | None, tags: dict[str, str]) -> dict[str, Any]:
    root = settings.reports_path
    found: dict[str, Any] = {}
    if raw is not None:
        validation = root / "validation" / f"raw_v{raw}.json"
        found["validation"] = str(validation) if validation.exists() else None
        found["curation"] = sorted(str(p) for p in (root / "curation").glob(f"curation_raw{raw}_*.json"))
    found["drift"] = tags.get("cd4ml.drift.report")
    found["drift_status"] = tags.get("cd4ml.drift.status")
    return found


def lineage(model_uri: str, home: str | None = None) -> dict[str, Any]:
    """Everything known about one model version, following copies to where it was trained."""
    match = URI.match(model_uri.strip())
    if not match:
        raise LineageUriError(f"{model_uri!r} is not models:/<name>/<version> or models:/<name>@<alias>")
    name = match["name"]
    settings = _settings_for_model(name, home)
    client = mlflow_client(settings)
    number = match["version"]
    if number is None:
        number = alias_version(client, name, match["alias"])
        if number is None:
            raise UnknownModelVersionError(f"{name} has no alias {match['alias']!r}")
    version = get_model_version(client, name, number)
    tags = dict(version.tags or {})
    aliases = sorted(a for a, v in (client.get_registered_model(name).aliases or {}).items() if int(v) == int(number))
    out: dict[str, Any] = {
        "model_uri": f"models:/{name}/{version.version}",
        "env": settings.env,
        "aliases": aliases,
        "gate": {k[len("cd4ml.gate."):]: v for k, v in tags.items() if k.startswith("cd4ml.gate.")},
        "rolled_back": tags.get("cd4ml.rolled_back"),
        "releases": [r.to_dict() for r in audit.read(settings)
                     if r.model_name == name and int(number) in (r.from_version, r.to_version)],
    }
    if tags.get(TAG_COPIED_FROM):
        out["copied_from"] = lineage(tags[TAG_COPIED_FROM], home)
        return out
    run = client.get_run(version.run_id) if version.run_id else None
    if run is not None:
        run_tags = run.data.tags
        out["run"] = {
            "run_id": run.info.run_id,
            "experiment_id": run.info.experiment_id,
            "status": run.info.status,
            "git_commit": run_tags.get("git_commit"),
            "requirements_hash": run_tags.get("cd4ml.requirements_hash"),
            "config_hash": run_tags.get("cd4ml.config_hash"),
            "airflow_run_id": run_tags.get("cd4ml.airflow_run_id"),
            "params": dict(run.data.params),
            "metrics": dict(run.data.metrics),
        }
        tags = {**run_tags, **tags}
    table, data_version = tags.get(TAG_CURATED_TABLE), tags.get(TAG_CURATED_VERSION)
    if table and data_version not in (None, ""):
        out["data"] = _data_chain(table, int(data_version))
        out["reports"] = _reports(settings, _raw_version(out["data"]), tags)
    else:
        out["data"] = None
    return out


def format_lineage(info: dict[str, Any], indent: str = "") -> str:
    """Lineage for people: one fact per line, copies indented under the version that holds them."""
    lines = [f"{indent}{info['model_uri']} ({info['env']})  aliases: {', '.join(info['aliases']) or '-'}"]
    if info.get("rolled_back"):
        lines.append(f"{indent}  ROLLED BACK: {info['rolled_back']}")
    gate = info.get("gate") or {}
    if gate:
        against = gate.get("champion_version")
        against = f"champion v{against}" if against not in (None, "None") else "no champion"
        lines.append(f"{indent}  gate: {gate.get('decision', gate.get('passed'))} vs {against} "
                     f"on {gate.get('test')}  report {gate.get('report')}")
    for r in info.get("releases", []):
        approval = f" approval {r['approval'].get('decision')} by {r['approval'].get('by')}" if r["approval"] else ""
        before = "-" if r["from_version"] is None else f"v{r['from_version']}"
        lines.append(f"{indent}  release #{r['seq']} {r['at']} {r['action']} {r['alias'] or ''} {before} -> "
                     f"v{r['to_version']} by {r['actor']}{approval}: {r['reason']}")
    if "copied_from" in info:
        lines.append(f"{indent}  copied from:")
        lines.append(format_lineage(info["copied_from"], indent + "    "))
        return "\n".join(lines)
    run = info.get("run")
    if run:
        lines.append(f"{indent}  MLflow run {run['run_id']} ({run['status']}), Airflow run {run['airflow_run_id']}")
        lines.append(f"{indent}  git {run['git_commit']}  requirements {run['requirements_hash']}  config {run['config_hash']}")
        params = ", ".join(f"{k}={v}" for k, v in sorted(run["params"].items()) if k not in ("classes",))
        lines.append(f"{indent}  params: {params}")
    chain = info.get("data")
    while chain:
        lines.append(f"{indent}  data: {chain['table']} v{chain['version']} ({chain['commit'].get('step', '')} "
                     f"run {chain['commit'].get('run_id', '-')})")
        if "raw" in chain:
            raw = chain["raw"]
            lines.append(f"{indent}  raw:  {raw['table']} v{raw['version']} (run {raw['commit'].get('run_id', '-')})")
        chain = chain.get("sampled_from")
    for kind, value in (info.get("reports") or {}).items():
        lines.append(f"{indent}  {kind}: {value}")
    return "\n".join(lines)

