"""What exists right now: Delta tables with versions and row counts, registered models.

Used by ``cd4ml status`` (JSON) and ``cd4ml summary`` (where to look after a demo).
"""

from __future__ import annotations

from tasks.data import lake
from tasks.settings import ENVIRONMENTS, Settings, load_settings

TABLES = (
    "raw_images",
    "rejects",
    "classes",
    "curated_images",
    "curation_report",
    "curation_components",
    "curation_embeddings",
    "curation_pairs",
    "curation_nearest",
    "ingest_manifest",
    "ingest_zones",
    "dataset_tags",
    "training_sample",
    "release_audit",
)


def table_status(uri: str) -> dict:
    version = lake.current_version(uri)
    if version is None:
        return {"uri": uri, "version": None, "rows": 0, "last_commit": None, "names": {}}
    table = lake.open_table(uri, version)
    last = lake.history(uri)[0]
    names = {t.name: t.version for t in lake.tags(uri)}
    return {"uri": uri, "version": version, "rows": table.count(), "last_commit": last.metadata, "names": names}


def _champion(settings: Settings, models: list[dict]) -> dict | None:
    """The champion with its lineage and the ledger row that made it champion."""
    from tasks.release import audit

    holders = [m for m in models if settings.registry.champion_alias in m["aliases"]]
    if not holders:
        return None
    champion = dict(holders[0])
    rows = [r for r in audit.read(settings) if r.model_name == settings.registry.model_name
            and r.alias == settings.registry.champion_alias and r.to_version == champion["version"]]
    if rows:
        last = rows[-1]
        champion["since"] = {"seq": last.seq, "at": last.at, "action": last.action, "by": last.actor,
                             "from_version": last.from_version, "approval": last.approval, "reason": last.reason}
    champion["lineage_command"] = f"cd4ml lineage models:/{settings.registry.model_name}/{champion['version']}"
    return champion


def environment_status(settings: Settings) -> dict:
    models: list[dict] = []
    if settings.missing_tracking_store() is None:
        from tasks.models.registry import model_versions

        models = model_versions(settings)
    return {
        "tables": {name: table_status(settings.table_uri(name)) for name in TABLES},
        "registered_model": settings.registry.model_name,
        "release": {"pattern": settings.release.pattern, "upstream": settings.release.upstream,
                    "approval": settings.release.approval, "sample_fraction": settings.training_data.sample_fraction},
        "champion": _champion(settings, models),
        "challenger": next((m["version"] for m in models if settings.release.challenger_alias in m["aliases"]), None),
        "model_versions": models,
        "reports_dir": str(settings.reports_path),
    }


def status(envs: tuple[str, ...] = ENVIRONMENTS, home: str | None = None) -> dict:
    """Every environment's tables and model versions; environments with nothing yet included."""
    result: dict = {"environments": {}}
    for env in envs:
        settings = load_settings(env, home=home)
        result["home"] = settings.home
        result["environments"][env] = environment_status(settings)
    return result


def newest_reports(settings: Settings) -> dict[str, str]:
    """The newest report file of each kind (validation, curation, drift, gate)."""
    found = {}
    root = settings.reports_path
    for kind in ("validation", "curation", "drift", "gate"):
        files = sorted((root / kind).glob("*.json"), key=lambda p: p.stat().st_mtime) if (root / kind).exists() else []
        if files:
            found[kind] = str(files[-1])
    return found


def summary(settings: Settings) -> str:
    """A few lines telling a new user where to look after a run."""
    env = environment_status(settings)
    lines = [f"cd4ml ({settings.env}) state under {settings.home}", "", "Delta tables (latest version, rows):"]
    for name, t in env["tables"].items():
        named = "  names: " + ", ".join(f"{k}=v{v}" for k, v in t["names"].items()) if t["names"] else ""
        version = "-" if t["version"] is None else f"v{t['version']}"
        lines.append(f"  {name:<20} {version:>4} {t['rows']:>7} rows  {t['uri']}{named}")
    lines.append("")
    m = env["champion"]
    if m:
        since = m.get("since") or {}
        lines += [
            f"Model: {settings.registry.model_name} v{m['version']} holds alias '{settings.registry.champion_alias}'",
            f"  trained on {m.get('curated_table')} v{m.get('curated_version')} (raw v{m.get('raw_version')})",
            f"  MLflow run {m.get('run_id')} in {settings.tracking_uri}",
        ]
        if since:
            lines.append(f"  {since['action']} by {since['by']} at {since['at']} (release audit #{since['seq']}; "
                         f"cd4ml audit --env {settings.env})")
        lines.append(f"  lineage: {m['lineage_command']}")
    else:
        lines.append(f"Model: no version of {settings.registry.model_name} holds '{settings.registry.champion_alias}' yet")
    lines += ["", "Reports:"] + [f"  {k:<11}{v}" for k, v in newest_reports(settings).items()]
    lines += ["", "Full status as JSON: cd4ml status     UIs: make up (Airflow :8080, MLflow :5000)"]
    return "\n".join(lines)
