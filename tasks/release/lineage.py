"""``cd4ml lineage MODEL_URI``: the whole chain behind one model version, from raw data to approvals.

For ``models:/<name>/<version>`` or ``models:/<name>@<alias>``: the registered version and its
aliases; where it came from (trained in this environment, or imported from an upstream one, then
followed there: in the shared registry, or in the upstream's own registry when it can be reached,
else the hop that cannot be reached and why); the MLflow run (parameters, git commit, requirements hash, config hash); the
training data (the sample or curated Delta table and version, the curated version a sample was
cut from, the raw version, each with its commit metadata); the validation, curation, drift and
gate reports; and every release-ledger row that names the version (promotions, approvals,
rollbacks) in each environment.
"""

from __future__ import annotations

import json
import re
from typing import Any

from deltalake.exceptions import DeltaError
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from tasks.data import lake
from tasks.errors import DataError
from tasks.models.registry import (
    TAG_COPIED_FROM,
    TAG_CURATED_TABLE,
    TAG_CURATED_VERSION,
    TAG_IMPORT_ENV,
    TAG_IMPORT_MODEL,
    TAG_IMPORT_REGISTRY,
    TAG_IMPORT_VERSION,
    TAG_RAW_VERSION,
    TAG_SAMPLE,
    UnknownModelVersionError,
    alias_version,
    get_model_version,
    mlflow_client,
)
from tasks.release import audit
from tasks.release.model_import import ModelImportError, Upstream, connection_credentials, public_uri, reading
from tasks.settings import ENVIRONMENTS, Settings, check_registry_uri, load_settings

MAX_HOPS = 5  # imports followed across registries at most (sit -> uat -> prod is two)
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
    """Everything known about one model version, following imports and copies to where it was trained."""
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
    releases = [r.to_dict() for r in audit.read(settings)
                if r.model_name == name and int(number) in (r.from_version, r.to_version)]
    out = _described(client, version, settings.env, releases)
    tags = dict(version.tags or {})
    if tags.get(TAG_IMPORT_REGISTRY) and tags[TAG_IMPORT_REGISTRY] != public_uri(settings.tracking_uri):
        out["copied_from"] = _source_hop(settings, tags)
        out["recorded_data"] = _recorded_data(tags)
        return out
    if tags.get(TAG_COPIED_FROM):
        out["copied_from"] = lineage(tags[TAG_COPIED_FROM], home)
        return out
    return _trained(out, client, version, settings)


def _described(client: MlflowClient, version: ModelVersion, env: str, releases: list[dict[str, Any]]) -> dict[str, Any]:
    tags = dict(version.tags or {})
    aliases = sorted(a for a, v in (client.get_registered_model(version.name).aliases or {}).items()
                     if int(v) == int(version.version))
    return {
        "model_uri": f"models:/{version.name}/{version.version}",
        "env": env,
        "aliases": aliases,
        "gate": {k[len("cd4ml.gate."):]: v for k, v in tags.items() if k.startswith("cd4ml.gate.")},
        "rolled_back": tags.get("cd4ml.rolled_back"),
        "releases": releases,
    }


def _trained(out: dict[str, Any], client: MlflowClient, version: ModelVersion, settings: Settings | None) -> dict[str, Any]:
    """The run and the data a version was trained on (reports only where this environment's folders are here)."""
    tags = dict(version.tags or {})
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
        try:
            out["data"] = _data_chain(table, int(data_version))
        except (OSError, ValueError, DataError, DeltaError) as exc:  # another deployment's lake: often not readable here
            out["data"] = {"table": table, "version": int(data_version), "commit": {"missing": type(exc).__name__}}
        if settings is not None:
            out["reports"] = _reports(settings, _raw_version(out["data"]), tags)
    else:
        out["data"] = None
    return out


def _source_hop(settings: Settings, tags: dict[str, str], depth: int = 0) -> dict[str, Any]:
    """An imported version's source, read in its own registry; a hop that cannot be read says so and why.

    The account: this environment's upstream Connection for its upstream's registry; no account for
    any registry further up (prod holds no credentials of sit's: that hop is reported, not forced).
    """
    registry, name, number = tags[TAG_IMPORT_REGISTRY], tags.get(TAG_IMPORT_MODEL, ""), tags.get(TAG_IMPORT_VERSION, "")
    hop = {"model_uri": f"models:/{name}/{number}", "env": tags.get(TAG_IMPORT_ENV, ""), "registry": registry}
    configured = settings.release.upstream_registry
    ours = configured.tracking_uri is not None and public_uri(configured.tracking_uri) == registry
    try:
        upstream = Upstream(env=hop["env"], model_name=name, champion_alias=settings.registry.champion_alias,
                            tracking_uri=check_registry_uri(registry, configured.allowed_schemes), shared=False,
                            conn_id=configured.conn_id, timeout_s=configured.timeout_s, attempts=configured.attempts,
                            credentials=connection_credentials(configured.conn_id) if ours else None)
        with reading(upstream) as client:
            version = get_model_version(client, name, number)
            source_tags = dict(version.tags or {})
            out = _described(client, version, source_tags.get("cd4ml.env", hop["env"]), _tagged_releases(source_tags))
            out["registry"] = registry
            if source_tags.get(TAG_IMPORT_REGISTRY) and depth < MAX_HOPS:
                out["copied_from"] = _source_hop(settings, source_tags, depth + 1)
                out["recorded_data"] = _recorded_data(source_tags)
                return out
            return _trained(out, client, version, None)
    except (DataError, ValueError, MlflowException) as exc:  # the hop's own error types; never a server's body
        reason = str(exc) if isinstance(exc, (ModelImportError, UnknownModelVersionError)) else type(exc).__name__
        return {**hop, "unreachable": reason}


def _recorded_data(tags: dict[str, str]) -> dict[str, Any] | None:
    """The data an imported version was trained on as its own lineage tags record it (copied at each import).

    What a reader still learns where the hop that trained it cannot be reached (prod holds no account of sit's)."""
    if not tags.get(TAG_CURATED_TABLE):
        return None
    return {"table": tags[TAG_CURATED_TABLE], "version": tags.get(TAG_CURATED_VERSION),
            "raw_version": tags.get(TAG_RAW_VERSION), "sample": tags.get(TAG_SAMPLE)}


def _tagged_releases(tags: dict[str, str]) -> list[dict[str, Any]]:
    """The ledger rows a version carries as tags (``cd4ml.release.<seq>``): another deployment's ledger is not read."""
    rows = []
    for key, value in tags.items():
        if key.startswith("cd4ml.release.") and key.rsplit(".", 1)[-1].isdigit():
            try:
                row = json.loads(value)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append({"seq": int(key.rsplit(".", 1)[-1]), "at": "", "action": "", "alias": "", "from_version": None,
                             "to_version": None, "actor": "", "reason": "", "approval": {}, **row})
    return sorted(rows, key=lambda r: r["seq"])


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
        source = info["copied_from"]
        lines.append(f"{indent}  copied from" + (f" registry {source['registry']}:" if source.get("registry") else ":"))
        if "unreachable" in source:
            lines.append(f"{indent}    {source['model_uri']} ({source['env']}): CANNOT REACH this hop: {source['unreachable']}")
            data = info.get("recorded_data")
            if data:
                sample = f", sample {data['sample']}" if data.get("sample") else ""
                lines.append(f"{indent}    trained on (as this version's tags record it): {data['table']} v{data['version']}"
                             f" (raw v{data['raw_version']}{sample})")
        else:
            lines.append(format_lineage(source, indent + "    "))
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

