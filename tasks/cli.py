"""``cd4ml``: the project's command line. The same step functions the DAGs call."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from tasks.settings import ENVIRONMENTS, SettingsError, load_settings


def _cmd_status(args: argparse.Namespace) -> int:
    from tasks.ops.status import status

    envs = tuple(args.env) if args.env else ENVIRONMENTS
    print(json.dumps(status(envs), indent=2, sort_keys=True, default=str))
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from tasks.ops.status import summary

    print(summary(load_settings()))
    return 0


def _cmd_sample_data(args: argparse.Namespace) -> int:
    from tasks.data.sample_data import SAMPLES, write_scoring_sample

    if args.scoring:
        settings = load_settings()
        n = write_scoring_sample(settings.storage.scoring_uri, settings.storage.feedback_uri, n=args.limit or 300)
        print(f"wrote {n} unlabelled images (+1 damaged) to {settings.storage.scoring_uri} and their later labels "
              f"(60%) to {settings.storage.feedback_uri}/labels.csv")
        return 0
    landing = args.landing or load_settings().storage.landing_uri
    n = SAMPLES[args.dataset](landing, limit=args.limit, with_bad_files=args.with_bad_files)
    print(f"wrote {n} {args.dataset} images to {landing}" + (" (+2 files that must be rejected)" if args.with_bad_files else ""))
    return 0


def _table_uri(table: str) -> str:
    """A table name under the environment's lake (raw_images, curated_images, ...) or a URI as given."""
    return table if "/" in table or "://" in table else load_settings().table_uri(table)


def _data_plane_errors(fn):
    """Data-plane commands: a wrong name, version or tag is one line on stderr and exit 1."""

    def run(args: argparse.Namespace) -> int:
        from tasks.errors import DataError

        try:
            return fn(args)
        except (DataError, ValueError, FileNotFoundError) as exc:
            print(f"cd4ml {args.command}: {exc}", file=sys.stderr)
            return 1

    return run


@_data_plane_errors
def _cmd_tag(args: argparse.Namespace) -> int:
    from tasks.data import lake

    uri = _table_uri(args.table)
    version = lake.resolve_version(uri, args.version)
    tag = lake.tag_version(uri, version, args.name, run_id="cli", note=args.note or "")
    print(json.dumps({"table": uri, "name": tag.name, "version": tag.version}, sort_keys=True))
    return 0


@_data_plane_errors
def _cmd_classes(args: argparse.Namespace) -> int:
    from tasks.data import classes
    from tasks.data.labels import check_labels

    settings = load_settings()
    if args.accept:
        from tasks.release import actors

        actors.refuse_typed_actor(settings, None)  # CD4ML_ACTOR: who accepted is never typed
        if not classes.discovering(settings):
            raise classes.NotDiscoveringError("ingest.allowed_labels is a list in this environment's settings: "
                                              "add the class there")
        labels = check_labels(args.accept)  # before anything is asked of Airflow or written
        if actors.route(settings) == actors.AIRFLOW:  # the DAG run records the signed-in user, whom the row names
            print(json.dumps(actors.trigger(settings, "cd4ml_accept_class", {"labels": labels}), indent=2,
                             sort_keys=True))
            return 0
        classes.accept(settings, labels, "cli", actors.cli_actor())
    print(json.dumps({"env": settings.env, "discover": classes.discovering(settings),
                      "classes": classes.known(settings) if classes.discovering(settings)
                      else list(settings.ingest.allowed_labels)}, sort_keys=True))
    return 0


@_data_plane_errors
def _cmd_versions(args: argparse.Namespace) -> int:
    from tasks.data import lake

    uri = _table_uri(args.table)
    rows = [
        {"version": v.version, "timestamp": v.timestamp.isoformat(), "operation": v.operation,
         "names": list(v.names), "metadata": v.metadata}
        for v in lake.versions(uri)
    ]
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    for r in rows:
        names = ",".join(r["names"]) or "-"
        meta = " ".join(f"{k}={r['metadata'][k]}" for k in ("run_id", "logical_date", "step") if k in r["metadata"])
        print(f"v{r['version']:<5} {r['timestamp']}  {r['operation']:<14} {names:<20} {meta}")
    return 0


@_data_plane_errors
def _cmd_vacuum(args: argparse.Namespace) -> int:
    from tasks.ops import retention

    settings = load_settings()
    if args.table:
        uri = _table_uri(args.table)
        results = [retention.vacuum(settings, uri, retention.protected_versions(settings, uri), dry_run=args.dry_run)]
    else:
        results = retention.vacuum_lake(settings, dry_run=args.dry_run)
    print(json.dumps([{k: v for k, v in r.to_dict().items() if k != "deleted"} for r in results], indent=2))
    return 0


@_data_plane_errors
def _cmd_ingest(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from tasks.data.ingest import ingest_landing

    settings = load_settings()
    result = ingest_landing(
        settings,
        run_id=args.run_id or f"cli-{datetime.now(UTC):%Y%m%dT%H%M%S}",
        logical_date=args.logical_date or datetime.now(UTC).date().isoformat(),
        landing=args.source,
        label_source=args.labels,
        manifest=args.manifest,
        engine=args.engine,
        full=args.full,
    )
    print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from tasks.training.train import train

    settings = load_settings()
    overrides: dict[str, object] = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SettingsError(f"--set expects training_field=value, got {item!r}")
        overrides[key] = value
    if args.launcher:
        overrides["launcher"] = args.launcher
    if args.nproc_per_node:
        overrides["nproc_per_node"] = args.nproc_per_node
    result = train(
        settings,
        args.curated_table or settings.curated_table,
        args.curated_version,
        run_id=args.run_id,
        logical_date=args.logical_date,
        force=args.force,
        overrides=overrides,
    )
    text = json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str)
    if args.result_file:  # e.g. /airflow/xcom/return.json: KubernetesPodOperator pushes it to XCom
        from pathlib import Path

        Path(args.result_file).parent.mkdir(parents=True, exist_ok=True)
        Path(args.result_file).write_text(text)
    print(text)
    return 0


def _release_action(args: argparse.Namespace, dag_id: str, conf: dict, direct) -> int:
    """One path for every release command: ``release.approval`` picks the route (tasks/release/actors.py).

    Approval required: trigger ``dag_id`` through Airflow's REST API as the signed-in user. Otherwise:
    ``direct(settings, actor)`` with the operating-system account as the actor.
    """
    from tasks.release import actors

    settings = load_settings(args.env)
    actors.refuse_typed_actor(settings, getattr(args, "by", None))
    if actors.route(settings) == actors.AIRFLOW:
        out = actors.trigger(settings, dag_id, conf)
    else:
        out = direct(settings, actors.cli_actor()).to_dict()
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


@_data_plane_errors
def _cmd_rollback(args: argparse.Namespace) -> int:
    from tasks.release.release import rollback

    return _release_action(args, "cd4ml_rollback", {"reason": args.reason, "to_version": args.to},
                           lambda settings, actor: rollback(settings, reason=args.reason, to_version=args.to,
                                                            actor=actor, run_id=args.run_id or ""))


@_data_plane_errors
def _cmd_promote(args: argparse.Namespace) -> int:
    from tasks.release.release import promote

    return _release_action(args, "cd4ml_promote", {"version": args.version},
                           lambda settings, actor: promote(settings, args.version, actor=actor, run_id=args.run_id or "",
                                                           reason=args.reason or "promoted by hand"))


@_data_plane_errors
def _cmd_import_model(args: argparse.Namespace) -> int:
    """Import the upstream's champion (or --source-version) into this environment's registry; moves no alias."""
    from tasks.release.model_import import import_model, pending_import

    settings = load_settings(args.env)
    if args.check:
        print(json.dumps({"pending": pending_import(settings)}, sort_keys=True))
        return 0
    print(json.dumps(import_model(settings, args.source_version).to_dict(), indent=2, sort_keys=True))
    return 0


@_data_plane_errors
def _cmd_audit(args: argparse.Namespace) -> int:
    from tasks.release import audit

    rows = audit.read(load_settings(args.env))
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2, sort_keys=True, default=str))
    else:
        print(audit.format_rows(rows))
    return 0


@_data_plane_errors
def _cmd_alerts(args: argparse.Namespace) -> int:
    from tasks.alerting import incidents
    from tasks.alerting.alert import INCIDENT_KINDS
    from tasks.alerting.delivery import resolve_incident

    settings = load_settings(args.env)
    found = incidents.open_incidents(settings, kinds=None if args.all else INCIDENT_KINDS)
    if args.resolve:
        match = [i for i in found if i.dedup_key == args.resolve]
        if not match:
            print(f"cd4ml: no open alert with dedup key {args.resolve!r} in {settings.env}", file=sys.stderr)
            return 1
        by = args.by or os.environ.get("CD4ML_ACTOR") or os.environ.get("USER") or "unknown"
        resolve_incident(settings, match[0], f"cli:{by}", f"resolved by {by}: {args.reason}")
        print(f"resolved {args.resolve}")
        return 0
    if args.json:
        print(json.dumps([{**i.__dict__, "alert": i.alert.__dict__} for i in found], indent=2, default=str))
    else:
        print(incidents.format_incidents(found))
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    from tasks.ops.stack import StackError, plan, up

    try:
        return up(plan(args.mode, port=args.port, mlflow_port=args.mlflow_port, workers=args.workers))
    except StackError as exc:
        print(f"cd4ml up: {exc}", file=sys.stderr)
        return 2


def _cmd_down(args: argparse.Namespace) -> int:
    from tasks.ops.stack import down

    stopped = down(mode=args.mode)
    print(f"stopping {', '.join(stopped)}" if stopped else "no stack is running under this CD4ML_HOME")
    return 0


def _cmd_topology(args: argparse.Namespace) -> int:
    from tasks.ops import topology

    try:
        spec = topology.read_spec(args.file)
        if args.action == "up":
            if args.workers:
                spec = spec.model_copy(update={"workers": args.workers})
            return topology.up(spec, with_sample_data=args.sample_data)
        if args.action == "run":
            return topology.run_in(spec, args.env, args.rest)
        if args.action == "down":
            stopped = topology.down(spec)
            print(f"stopped {', '.join(stopped)}" if stopped else "no topology is running under this CD4ML_HOME")
            return 0
        print(json.dumps(topology.status(spec), indent=2))
        return 0
    except topology.TopologyError as exc:
        print(f"cd4ml topology: {exc}", file=sys.stderr)
        return 2


@_data_plane_errors
def _cmd_lineage(args: argparse.Namespace) -> int:
    from tasks.release.lineage import format_lineage, lineage

    info = lineage(args.model_uri)
    print(json.dumps(info, indent=2, sort_keys=True, default=str) if args.json else format_lineage(info))
    return 0


@_data_plane_errors
def _cmd_serve(args: argparse.Namespace) -> int:
    from tasks.serving.serve import serve

    return serve(load_settings(), host=args.host, port=args.port, workers=args.workers)


def _cmd_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every file matches the version's manifest, 1 on any difference (printed, files named)."""
    from tasks.errors import DataError
    from tasks.models.integrity import verify

    try:
        print(verify(load_settings(), args.model_uri).line())
    except DataError as exc:
        print(f"cd4ml verify: {exc}", file=sys.stderr)
        return 1
    return 0


def _run_stamp(args: argparse.Namespace) -> tuple[str, str]:
    """(run id, logical date) of a CLI run: as given, else cli-<timestamp> and today (UTC)."""
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    return args.run_id or f"cli-{now:%Y%m%dT%H%M%S}", args.logical_date or now.date().isoformat()


@_data_plane_errors
def _cmd_score(args: argparse.Namespace) -> int:
    from tasks.serving.score import score

    settings = load_settings()
    run_id, logical_date = _run_stamp(args)
    result = score(settings, args.source or settings.storage.scoring_uri, run_id=run_id, logical_date=logical_date)
    print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    return 0


@_data_plane_errors
def _cmd_feedback(args: argparse.Namespace) -> int:
    from tasks.serving.feedback import load_feedback

    run_id, logical_date = _run_stamp(args)
    result = load_feedback(load_settings(), args.files or None, run_id=run_id, logical_date=logical_date)
    print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    return 0


@_data_plane_errors
def _cmd_monitor(args: argparse.Namespace) -> int:
    from tasks.monitoring.monitor import monitor

    run_id, logical_date = _run_stamp(args)
    result = monitor(load_settings(), run_id=run_id, logical_date=logical_date)
    for m in result.metrics:
        verdict = "BREACHED" if m["breached"] else ("ok" if m["judged"] else "not judged")
        print(f"{m['name']:>20}  {verdict:<10}  {m['detail']}")
    print(f"dashboard: {result.dashboard}")
    return 1 if result.breached else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cd4ml", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_overview, _add_training, _add_data, _add_release, _add_stack, _add_models, _add_integrity):
        add(sub)
    return parser


def _add_overview(sub: argparse._SubParsersAction) -> None:
    """The project at a glance, its sample data and its classes."""
    p = sub.add_parser("status", help="JSON: Delta tables (version, rows) and registered models per environment")
    p.add_argument("--env", action="append", choices=ENVIRONMENTS, help="only this environment (repeatable)")
    p.set_defaults(func=_cmd_status)
    p = sub.add_parser("summary", help="where to look after a run (current CD4ML_ENV)")
    p.set_defaults(func=_cmd_summary)
    p = sub.add_parser("sample-data", help="write real sample images (digits, or colour photo tiles) into the landing folder")
    p.add_argument("--dataset", choices=("digits", "photos"), default="digits",
                   help="digits: scikit-learn's handwritten digits (8x8 grey); photos: tiles of packaged colour photos")
    p.add_argument("--landing", help="target folder (default: the environment's landing_uri)")
    p.add_argument("--limit", type=int, help="write only the first N images")
    p.add_argument("--with-bad-files", action="store_true", help="also plant two files the ingest must reject")
    p.add_argument("--scoring", action="store_true",
                   help="instead: unlabelled digit scans into storage.scoring_uri and their later labels into "
                   "storage.feedback_uri (the serving demo)")
    p.set_defaults(func=_cmd_sample_data)
    p = sub.add_parser("classes", help="the class names (allowed_labels: discover records them; --accept adds one; "
                       "where approval is required through the cd4ml_accept_class DAG as the signed-in Airflow user)")
    p.add_argument("--accept", action="append", metavar="LABEL", help="accept a new class found by validation (repeatable)")
    p.set_defaults(func=_cmd_classes)


def _add_training(sub: argparse._SubParsersAction) -> None:
    """Training one curated version (the trainer pod's entry point)."""
    p = sub.add_parser("train", help="train on one curated version (what the trainer pod and the DAG run); JSON result")
    p.add_argument("--curated-version", type=int, required=True, help="curated_images version to train on")
    p.add_argument("--curated-table", help="table URI (default: this environment's curated_images)")
    p.add_argument("--run-id", default="cli", help="Airflow run id: names the checkpoint folder a retry resumes from")
    p.add_argument("--logical-date", default="cli", help="logical date recorded on the MLflow run")
    p.add_argument("--force", action="store_true", help="train even if a finished run with the same config exists")
    p.add_argument("--launcher", choices=("in_process", "torchrun"), help="override training.launcher")
    p.add_argument("--nproc-per-node", type=int, help="processes (GPUs) for torchrun")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a training field (repeatable)")
    p.add_argument("--result-file", help="also write the JSON result here (a pod's /airflow/xcom/return.json)")
    p.set_defaults(func=_cmd_train)


def _add_data(sub: argparse._SubParsersAction) -> None:
    """The lake: named versions, history, VACUUM, and ingesting a landing zone."""
    p = sub.add_parser("tag", help="name a table version (immutable): cd4ml tag raw_images 3 release-3")
    p.add_argument("table", help="table name under the lake (raw_images, curated_images, ...) or a URI")
    p.add_argument("version", help="version number, an existing name, or a timestamp like 2026-11-21T18:00:00Z")
    p.add_argument("name", help="the new name: letters, digits, '.', '_', '-'; not all digits")
    p.add_argument("--note", help="free text stored with the name")
    p.set_defaults(func=_cmd_tag)
    p = sub.add_parser("versions", help="every version of a table with its names and run metadata, newest first")
    p.add_argument("table", help="table name under the lake or a URI")
    p.add_argument("--json", action="store_true", help="JSON instead of one line per version")
    p.set_defaults(func=_cmd_versions)
    p = sub.add_parser("vacuum", help="VACUUM the lake (or one table) keeping every version a model was trained on")
    p.add_argument("table", nargs="?", help="only this table (default: every pipeline table)")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    p.set_defaults(func=_cmd_vacuum)
    p = sub.add_parser("ingest", help="ingest a landing zone (local path or fsspec URL) into raw_images")
    p.add_argument("--source", help="landing root: a path or an fsspec URL (default: storage.landing_uri)")
    p.add_argument("--labels", choices=["folders", "csv", "jsonl"], help="where labels come from (default: settings)")
    p.add_argument("--manifest", help="csv/jsonl manifest with path,label (relative = inside the landing root)")
    p.add_argument("--engine", choices=["local", "spark"], help="default: ingest.engine")
    p.add_argument("--full", action="store_true",
                   help="trust no incremental state: open and decide every file again (never duplicates)")
    p.add_argument("--logical-date", help="ISO date the commit is stamped with (default: today, UTC)")
    p.add_argument("--run-id", help="run id stamped on the commit (default: cli-<timestamp>)")
    p.set_defaults(func=_cmd_ingest)


def _add_release(sub: argparse._SubParsersAction) -> None:
    """Release operations: rollback, promotion by hand, the audit ledger, alerts and incidents.

    Who acted is never typed: sit/uat record the account running the command (cli:<user>); where
    approval is required the command triggers the release DAG as the user signed in to Airflow."""
    p = sub.add_parser("rollback", help="move champion back to the previous champion (or --to VERSION); touches no data")
    p.add_argument("--env", required=True, help="sit | uat | prod")
    p.add_argument("--reason", required=True, help="why: recorded in the audit, tagged on the demoted version, sent to on-call")
    p.add_argument("--to", type=int, help="roll back to this version instead of the previous champion")
    p.add_argument("--by", help=argparse.SUPPRESS)  # accepted only to be refused with a clear message
    p.add_argument("--run-id", help="request id: repeating the same id changes nothing")
    p.set_defaults(func=_cmd_rollback)
    p = sub.add_parser("promote", help="move champion to a version whose recorded gate passed against the champion "
                       "(approval required: triggers cd4ml_promote as the signed-in Airflow user)")
    p.add_argument("--env", required=True, help="sit | uat | prod")
    p.add_argument("--version", type=int, required=True, help="the registered version to promote")
    p.add_argument("--reason", help="why (recorded in the audit)")
    p.add_argument("--by", help=argparse.SUPPRESS)  # accepted only to be refused with a clear message
    p.add_argument("--run-id", help="request id: repeating the same id changes nothing")
    p.set_defaults(func=_cmd_promote)
    p = sub.add_parser("import-model", help="deploy_model: import the upstream's champion from its registry (files checked "
                       "against its manifest, provenance tagged); moves no alias: gate and promote with cd4ml_promote")
    p.add_argument("--env", required=True, help="sit | uat | prod (the environment imported into)")
    p.add_argument("--source-version", type=int, help="the upstream version to import; default: the upstream's champion")
    p.add_argument("--check", action="store_true", help="only say which upstream champion has no gated import here")
    p.set_defaults(func=_cmd_import_model)
    p = sub.add_parser("audit", help="the release ledger of an environment: every alias change and approval decision")
    p.add_argument("--env", required=True, help="sit | uat | prod")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_audit)
    p = sub.add_parser("alerts", help="open incidents (failed runs, failed validation, missed deadlines); --resolve KEY")
    p.add_argument("--env", required=True, help="sit | uat | prod")
    p.add_argument("--all", action="store_true", help="also events (drift, gate, approvals, rollbacks) ever sent")
    p.add_argument("--resolve", metavar="DEDUP_KEY", help="close this incident (PagerDuty and Slack are told)")
    p.add_argument("--reason", default="resolved by hand", help="with --resolve: why")
    p.add_argument("--by", help="with --resolve: who (default: CD4ML_ACTOR or USER)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_alerts)


def _add_stack(sub: argparse._SubParsersAction) -> None:
    """Airflow's services on this machine."""
    p = sub.add_parser("up", help="Airflow's real services (and, scale-out, Celery workers and MLflow), sized to "
                       "this machine; Ctrl-C stops them all. Mode: CD4ML_STACK or --mode (conf/stack/<mode>.env)")
    p.add_argument("--mode", choices=["embedded", "scaleout"], default=None)
    p.add_argument("--port", type=int, default=8080, help="Airflow API server and UI")
    p.add_argument("--mlflow-port", type=int, default=5000, help="MLflow tracking server (scale-out)")
    p.add_argument("--workers", type=int, default=None, help="Celery worker processes, one task each (scale-out); "
                   "default: this machine's task slots, at least 2")
    p.set_defaults(func=_cmd_up)
    p = sub.add_parser("down", help="stop a stack that `cd4ml up` started in another shell")
    p.add_argument("--mode", choices=["embedded", "scaleout"], default=None)
    p.set_defaults(func=_cmd_down)
    p = sub.add_parser("topology", help="sit, uat and prod as three scale-out stacks on this machine, linked only by "
                       "the release queue and read-only registry accounts (docs/operations.md)")
    actions = p.add_subparsers(dest="action", required=True)
    helps = {"up": "start the three stacks (sit, uat, prod) and supervise them; Ctrl-C stops all",
             "down": "stop a topology started in another shell", "status": "JSON: each environment's URLs and health",
             "run": "a cd4ml command as one environment's deployment (its MLflow account, Connections, settings), "
                    "e.g. `cd4ml topology run prod lineage models:/digits-classifier-prod@champion`"}
    for name, text in helps.items():
        a = actions.add_parser(name, help=text)
        a.add_argument("--file", help="YAML overriding the topology's defaults (ports, PostgreSQL prefixes, Redis "
                       "databases, channel prefix; tasks/ops/topology.py); default CD4ML_TOPOLOGY")
        if name == "up":
            a.add_argument("--sample-data", action="store_true", help="write the sample digits into each empty landing")
            a.add_argument("--workers", type=int, default=None, help="Celery workers per stack (default 1)")
        if name == "run":
            a.add_argument("env", choices=("sit", "uat", "prod"))
            a.add_argument("rest", nargs=argparse.REMAINDER, help="the cd4ml command and its arguments")
        a.set_defaults(func=_cmd_topology)


def _add_models(sub: argparse._SubParsersAction) -> None:
    """A model's lineage, serving it, scoring, feedback and the live monitor."""
    p = sub.add_parser("lineage", help="the whole chain behind models:/<name>/<version> or models:/<name>@<alias>")
    p.add_argument("model_uri")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_lineage)
    p = sub.add_parser("serve", help="the champion (pinned to its version) behind MLflow's REST scoring server; "
                       "POST /invocations; Ctrl-C stops it")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, help="default: serving.port (5001)")
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes, each with its own copy of the model")
    p.set_defaults(func=_cmd_serve)
    p = sub.add_parser("score", help="score a folder or fsspec URL with the champion into the predictions table")
    p.add_argument("source", nargs="?", help="images to score (default: storage.scoring_uri)")
    p.add_argument("--logical-date", help="ISO date the predictions are stamped with (default: today, UTC)")
    p.add_argument("--run-id", help="run id stamped on the rows (default: cli-<timestamp>)")
    p.set_defaults(func=_cmd_score)
    p = sub.add_parser("feedback", help="load true labels (CSV/JSONL: image or path, label) and join them to predictions")
    p.add_argument("files", nargs="*", help="feedback files (default: every *.csv/*.jsonl under storage.feedback_uri)")
    p.add_argument("--logical-date", help="ISO date stamped on the rows (default: today, UTC)")
    p.add_argument("--run-id", help="run id stamped on the rows (default: cli-<timestamp>)")
    p.set_defaults(func=_cmd_feedback)
    p = sub.add_parser("monitor", help="judge the champion's live window; exit 1 when a rule is breached")
    p.add_argument("--logical-date", help="end of the window (default: today, UTC)")
    p.add_argument("--run-id", help="run id stamped on the rows (default: cli-<timestamp>)")
    p.set_defaults(func=_cmd_monitor)


def _add_integrity(sub: argparse._SubParsersAction) -> None:
    """Checking a registered model's files against the manifest recorded at registration."""
    p = sub.add_parser("verify", help="check models:/<name>/<version> (or @alias) against the sha256 manifest recorded "
                       "at registration; exit 1 on a changed, missing or extra file")
    p.add_argument("model_uri")
    p.set_defaults(func=_cmd_verify)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SettingsError as exc:
        print(f"cd4ml: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
