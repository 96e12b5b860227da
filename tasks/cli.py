"""``cd4ml``: the project's command line. The same step functions the DAGs call."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from tasks.settings import ENVIRONMENTS, SettingsError, load_settings


def _cmd_status(args: argparse.Namespace) -> int:
    from tasks.status import status

    envs = tuple(args.env) if args.env else ENVIRONMENTS
    print(json.dumps(status(envs), indent=2, sort_keys=True, default=str))
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from tasks.status import summary

    print(summary(load_settings()))
    return 0


def _cmd_sample_data(args: argparse.Namespace) -> int:
    from tasks.sample_data import write_digits

    landing = args.landing or load_settings().storage.landing_uri
    n = write_digits(landing, limit=args.limit, with_bad_files=args.with_bad_files)
    print(f"wrote {n} digit images to {landing}" + (" (+2 files that must be rejected)" if args.with_bad_files else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cd4ml", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("status", help="JSON: Delta tables (version, rows) and registered models per environment")
    p.add_argument("--env", action="append", choices=ENVIRONMENTS, help="only this environment (repeatable)")
    p.set_defaults(func=_cmd_status)
    p = sub.add_parser("summary", help="where to look after a run (current CD4ML_ENV)")
    p.set_defaults(func=_cmd_summary)
    p = sub.add_parser("sample-data", help="write scikit-learn's real handwritten digits as PNGs into the landing folder")
    p.add_argument("--landing", help="target folder (default: the environment's landing_uri)")
    p.add_argument("--limit", type=int, help="write only the first N images")
    p.add_argument("--with-bad-files", action="store_true", help="also plant two files the ingest must reject")
    p.set_defaults(func=_cmd_sample_data)
    return parser


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
