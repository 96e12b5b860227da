"""False rejects and false passes of the promotion gate (tasks/release/evaluate.py) on real models.

Everything runs through the product's own steps in a private ``CD4ML_HOME`` (temporary unless
``--home``): ``write_digits`` (1,797 real digits as PNGs) -> ``ingest_landing`` -> ``curate``
(train/val/test splits) -> ``train`` -> ``register_candidate`` -> ``evaluate`` -> ``promote``.

* Champion: trained with the configured settings (``training.seed`` from conf/base.yaml) on the
  curated version, registered in the sit, uat and prod registered models, gated there (no
  champion yet: floor, smoke, latency, size) and promoted in each (prod with an approval dict,
  as its ``release.approval: required`` demands).
* Equal retrains: the same data and settings, another ``training.seed``. Any reject of one of
  them is a false reject.
* Worse on purpose: trained on copies of the curated version (other Delta tables in the same
  lake, commit metadata ``raw_version`` kept) whose train+val labels are partly permuted with a
  fixed numpy RNG (test rows untouched), and models trained for 1 epoch at a tiny learning
  rate. Any pass of one of them is a false pass, but read its true accuracy difference: a
  variant can be only marginally worse.
* Every candidate is trained once (with the uat settings: the full curated data), registered in
  each environment's registered model and gated there by ``evaluate`` with that environment's
  own settings against that environment's champion, on the test split of the uat curated
  version. So the gate settings are the real ones of conf/<env>.yaml (sit = base but
  ``min_test_images: 60``; uat = base but ``min_value: 0.90``; prod: ``min_value 0.92``,
  ``max_regression 0.02``, tighter latency and size).
* One champion is one draw (a weak one makes every retrain look good), so the gate's own rules
  (``score`` for the floor and ``comparison_checks``) are also applied to every ordered pair of
  the equal-quality models, and to every worse model against each of them (``all_pairs``).

Usage: python bench/gate.py [--retrains 20] [--shuffle 0.2 0.4 0.6 0.8] [--one-epoch-lr 2e-3 2e-4 2e-5]
       [--envs sit uat prod]
       [--epochs N] [--home DIR] [--out results.json]   (prints Markdown tables; JSON to --out)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LOGICAL_DATE = "2026-11-21"
REGISTRY_ENVS = ("sit", "uat", "prod")
TRAIN_ENV = "uat"  # trains on the full curated data (sit would train on its 50% sample)


def _progress(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def write_shuffled(settings: Any, curated_table: str, curated_version: int, share: float, seed: int) -> dict[str, Any]:
    """A copy of the curated version with ``share`` of its train+val labels permuted among themselves.

    Rows are put in sha256 order first so the choice does not depend on the Delta file layout.
    Test rows are unchanged. Returns the table, its version and how many labels really changed
    (a permutation leaves some labels where they were).
    """
    import numpy as np
    import pyarrow as pa

    from tasks.data import lake
    from tasks.training.train import raw_version_of

    rows = lake.read(curated_table, curated_version).sort_by([("sha256", "ascending")])
    labels = rows["label"].to_pylist()
    splits = rows["split"].to_pylist()
    fit = [i for i, s in enumerate(splits) if s in ("train", "val")]
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(fit), size=int(round(share * len(fit))), replace=False)
    picked = [fit[i] for i in chosen]
    permuted = [labels[i] for i in picked]
    rng.shuffle(permuted)
    new = list(labels)
    for i, label in zip(picked, permuted):
        new[i] = label
    changed = sum(a != b for a, b in zip(labels, new))
    assert all(labels[i] == new[i] for i, s in enumerate(splits) if s == "test")
    table = rows.set_column(rows.schema.get_field_index("label"), rows.schema.field("label"), pa.array(new, pa.string()))
    uri = settings.table_uri(f"curated_shuffled_{round(share * 100)}pct")
    metadata = {"step": "bench_shuffle", "run_id": "bench-gate", "raw_version": str(raw_version_of(curated_table, curated_version)),
                "source_table": curated_table, "source_version": str(curated_version), "share": str(share), "seed": str(seed),
                "labels_changed": str(changed)}
    version = lake.overwrite(uri, table, metadata, configuration=lake.stats_columns_config(table.schema))
    return {"table": uri, "version": version, "train_val_rows": len(fit), "permuted_rows": len(picked),
            "labels_changed": changed, "labels_changed_share": changed / len(fit)}


def gate_row(settings: Any, gate: Any, wall_s: float) -> dict[str, Any]:
    """What the gate decided and why, with the paired numbers from its report."""
    report = json.loads(Path(gate.report_path).read_text())
    details = report.get("details", {})
    paired = details.get("paired", {})
    per_class = details.get("per_class", {})
    drops = [v.get("delta") for v in per_class.values() if v.get("judged") and v.get("delta") is not None]
    smoke = details.get("smoke", {})
    return {
        "env": settings.env,
        "decision": gate.decision,
        "failed_checks": [c.name for c in gate.checks if not c.passed],
        "reasons": gate.reasons,
        "candidate_version": gate.candidate_version,
        "champion_version": gate.champion_version,
        "candidate_accuracy": gate.candidate_value,
        "champion_accuracy": gate.champion_value,
        "test_images": gate.test_images,
        "accuracy_difference": paired.get("accuracy_difference"),
        "only_champion_right": paired.get("only_champion_right"),
        "only_candidate_right": paired.get("only_candidate_right"),
        "mcnemar_p": paired.get("p_value_candidate_worse"),
        "bootstrap_95": paired.get("bootstrap_95"),
        "largest_class_recall_drop": min(drops) if drops else None,
        "latency_p95_ms": smoke.get("latency_p95_ms"),
        "model_mb": smoke.get("model_mb"),
        "gate_wall_s": wall_s,
        "report_path": gate.report_path,
    }


def main() -> None:
    parser, args = _parse_args()
    if args.retrains < 1:
        parser.error("--retrains must be >= 1")

    home = Path(args.home or tempfile.mkdtemp(prefix="cd4ml-bench-gate-")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["CD4ML_HOME"] = str(home)
    os.environ["CD4ML_ENV"] = TRAIN_ENV
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.setdefault("FASTDUP_PRODUCTION", "1")
    os.environ.setdefault("SENTRY_OPT_OUT", "1")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    logging.basicConfig(level=logging.WARNING)
    out_path = Path(args.out or home / "bench-gate.json").resolve()

    import torch

    from tasks.curation.curate import curate
    from tasks.data.ingest import ingest_landing
    from tasks.data.sample_data import write_digits
    from tasks.settings import load_settings

    started = time.perf_counter()
    envs = {name: load_settings(name) for name in args.envs}
    train_settings = load_settings(TRAIN_ENV)
    base_overrides: dict[str, Any] = {"num_threads": 1}
    if args.epochs:
        base_overrides["epochs"] = args.epochs
    cfg = train_settings.training

    # ------------------------------------------------------------------ data (the product's own steps)
    landing = home / "landing"
    n_written = write_digits(landing)
    ingested = ingest_landing(train_settings, run_id="bench-gate-ingest", logical_date=LOGICAL_DATE, landing=landing)
    curated = curate(train_settings, ingested.raw_version, "bench-gate-curate", LOGICAL_DATE)
    table, version = curated.curated_table, curated.curated_version
    _progress(f"data: {n_written} PNGs -> raw v{ingested.raw_version} -> {table} v{version} {curated.counts_by_split} "
              f"(dropped {curated.dropped_by_reason})")

    plans = plan_candidates(args, train_settings, table, version, base_overrides)
    champion = champion_in_every_env(envs, train_settings, table, version, {**base_overrides, "seed": cfg.seed},
                                     args.envs[0])

    # ------------------------------------------------------------------ candidates, each gated in every env
    rows = [gate_candidate(envs, train_settings, plan, table, version, args.envs[0], f"{n}/{len(plans)}")
            for n, plan in enumerate(plans, 1)]
    pairwise = all_pairs(envs, champion, rows, table, version, first_env=args.envs[0])
    _progress(f"all ordered pairs of the {pairwise['models']} equal-quality models: "
              + ", ".join(f"{e} {v['rejected']}/{v['pairs']}" for e, v in pairwise["by_env"].items()))

    total_s = time.perf_counter() - started
    result = {
        "measured": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "load_average": os.getloadavg()},
        "home": str(home),
        "data": {"pngs": n_written, "raw_version": ingested.raw_version, "curated_table": table,
                 "curated_version": version, "counts_by_split": curated.counts_by_split,
                 "dropped_by_reason": curated.dropped_by_reason},
        "training": {**cfg.model_dump(mode="json", include={"model", "image_size", "epochs", "batch_size", "learning_rate",
                                                             "patience", "seed", "scheduler", "augment_shift"}),
                     **{k: v for k, v in base_overrides.items()}},
        "champion": champion,
        "candidates": rows,
        "summary": summarise(envs, rows),
        "all_pairs_of_equal_models": pairwise,
        "total_s": total_s,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2, default=str))
    print(markdown(result, list(envs)))
    print(f"\nJSON: {out_path}\nCD4ML_HOME: {home}\nTotal {total_s / 60:.1f} min")


def _parse_args() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--retrains", type=int, default=20, help="equal retrains (seeds 101, 102, ...)")
    parser.add_argument("--shuffle", type=float, nargs="*", default=[0.2, 0.4, 0.6, 0.8],
                        help="shares of train+val labels permuted, one worse candidate each")
    parser.add_argument("--one-epoch-lr", type=float, nargs="*", default=[2e-3, 2e-4, 2e-5],
                        help="learning rates of the worse candidates trained for 1 epoch (conf: 0.002)")
    parser.add_argument("--envs", nargs="+", default=list(REGISTRY_ENVS), choices=REGISTRY_ENVS)
    parser.add_argument("--epochs", type=int, help="training.epochs for every normal training (default: conf)")
    parser.add_argument("--home", help="CD4ML_HOME to use (default: a new temporary folder, kept)")
    parser.add_argument("--out", help="JSON of every result (default: <home>/bench-gate.json)")
    return parser, parser.parse_args()


def plan_candidates(args: argparse.Namespace, train_settings: Any, table: str, version: int,
                    base_overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """The candidates to build: equal retrains (other seeds), label-shuffled copies, 1-epoch models."""
    cfg = train_settings.training
    plans: list[dict[str, Any]] = []
    for i in range(args.retrains):
        seed = 101 + i
        plans.append({"name": f"equal-seed{seed}", "kind": "equal", "seed": seed, "table": table, "version": version,
                      "overrides": {**base_overrides, "seed": seed}, "data": "curated"})
    for share in args.shuffle:
        shuffled = write_shuffled(train_settings, table, version, share, seed=1000 + round(share * 100))
        plans.append({"name": f"shuffle{round(share * 100)}", "kind": "worse", "seed": cfg.seed, "table": shuffled["table"],
                      "version": shuffled["version"], "overrides": dict(base_overrides), "shuffle": shuffled,
                      "data": f"{share:.0%} of train+val labels permuted ({shuffled['labels_changed_share']:.0%} changed)"})
    for lr in args.one_epoch_lr:
        plans.append({"name": f"1epoch-lr{lr:g}", "kind": "worse", "seed": cfg.seed, "table": table, "version": version,
                      "overrides": {**base_overrides, "epochs": 1, "learning_rate": lr},
                      "data": f"curated; 1 epoch at learning_rate {lr:g}"})
    return plans


def train_and_register(envs: dict[str, Any], train_settings: Any, name: str, tbl: str, ver: int,
                       overrides: dict[str, Any]) -> dict[str, Any]:
    """Train one candidate on ``tbl`` v``ver`` and register it in every environment's registered model."""
    from tasks.models.registry import register_candidate
    from tasks.training.train import train

    t0 = time.perf_counter()
    result = train(train_settings, tbl, ver, f"bench__{name}", LOGICAL_DATE, force=True, overrides=overrides)
    train_s = time.perf_counter() - t0
    versions = {env: register_candidate(s, result.mlflow_run_id) for env, s in envs.items()}
    return {"run_id": result.mlflow_run_id, "train_s": train_s, "epochs_run": result.epochs_run,
            "best_epoch": result.best_epoch, "best_val_accuracy": result.metrics.get("best_val_accuracy"),
            "model_versions": versions}


def champion_in_every_env(envs: dict[str, Any], train_settings: Any, table: str, version: int,
                          overrides: dict[str, Any], first_env: str) -> dict[str, Any]:
    """The champion: trained once, registered, gated (no champion yet) and promoted in every environment."""
    from tasks.release.evaluate import evaluate
    from tasks.release.release import promote, record_decision

    seed = overrides["seed"]
    champ = train_and_register(envs, train_settings, "champion", table, version, overrides)
    champion: dict[str, Any] = {"name": "champion", "seed": seed, **champ, "gates": {}, "promotions": {}}
    for env, s in envs.items():
        t0 = time.perf_counter()
        g = evaluate(s, champ["model_versions"][env], table, version)
        champion["gates"][env] = gate_row(s, g, time.perf_counter() - t0)
        if not g.passed:
            raise SystemExit(f"the champion did not pass its own first gate in {env}: {g.reasons}")
        if s.release.approval == "required":  # promote reads the approval from the ledger
            record_decision(s, g.candidate_version, "approved", actor="bench", reason="bench/gate.py champion",
                            gate_report=g.report_path, run_id="bench-gate",
                            extra={"assigned": list(s.release.approvers)})  # as if Airflow had checked the answer
        promoted = promote(s, g.candidate_version, g, run_id="bench-gate", actor="bench")
        champion["promotions"][env] = promoted.to_dict()
    _progress(f"champion seed {seed}: test accuracy {champion['gates'][first_env]['candidate_accuracy']:.4f}, "
              f"trained in {champ['train_s']:.1f} s ({champ['epochs_run']} epochs, best {champ['best_epoch']}), "
              f"promoted in {', '.join(envs)}")
    return champion


def gate_candidate(envs: dict[str, Any], train_settings: Any, plan: dict[str, Any], table: str, version: int,
                   first_env: str, progress: str) -> dict[str, Any]:
    """One candidate: trained, registered and gated by ``evaluate`` in every environment against its champion."""
    from tasks.release.evaluate import evaluate

    trained = train_and_register(envs, train_settings, plan["name"], plan["table"], plan["version"], plan["overrides"])
    gates = {}
    for env, s in envs.items():
        t0 = time.perf_counter()
        g = evaluate(s, trained["model_versions"][env], table, version)
        gates[env] = gate_row(s, g, time.perf_counter() - t0)
    first = gates[first_env]
    same = all(gates[e]["accuracy_difference"] == first["accuracy_difference"]
               and gates[e]["mcnemar_p"] == first["mcnemar_p"] for e in gates)
    row = {k: v for k, v in plan.items() if k != "overrides"}
    row.update({"overrides": plan["overrides"], **trained, "gates": gates, "same_comparison_in_every_env": same})
    _progress(f"{progress} {plan['name']}: acc {first['candidate_accuracy']} vs "
              f"{first['champion_accuracy']}, p={first['mcnemar_p']}; "
              + ", ".join(f"{e} {v['decision']}{' ' + '+'.join(v['failed_checks']) if v['failed_checks'] else ''}"
                          for e, v in gates.items()))
    return row


def summarise(envs: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per environment: false rejects of the equal retrains, false passes of the worse candidates."""
    summary = {}
    for env in envs:
        equal = [r for r in rows if r["kind"] == "equal"]
        worse = [r for r in rows if r["kind"] == "worse"]
        summary[env] = {
            "gate_settings": envs[env].gate.model_dump(mode="json"),
            "equal_retrains": len(equal),
            "false_rejects": sum(r["gates"][env]["decision"] != "pass" for r in equal),
            "false_rejects_by": [r["name"] for r in equal if r["gates"][env]["decision"] != "pass"],
            "worse_candidates": len(worse),
            "worse_passed": sum(r["gates"][env]["decision"] == "pass" for r in worse),
            "worse_passed_by": [r["name"] for r in worse if r["gates"][env]["decision"] == "pass"],
            "worse_passed_comparison_checks": [  # passed McNemar, margin and class recall (whatever the floor said)
                r["name"] for r in worse
                if not {"mcnemar", "non_inferiority", "class_recall"} & set(r["gates"][env]["failed_checks"])],
            "median_gate_wall_s": sorted(r["gates"][env]["gate_wall_s"] for r in rows)[len(rows) // 2],
        }
    return summary


def all_pairs(envs: dict[str, Any], champion: dict[str, Any], rows: list[dict[str, Any]], table: str, version: int,
              first_env: str) -> dict[str, Any]:
    """The gate's own decision rules over every ordered pair of the equal-quality models (champion + retrains).

    One champion is one draw: a lucky or unlucky champion moves the false-reject count of the
    retrains gated against it. Here every equal model plays champion to every other, with the
    gate's floor and paired checks (``tasks.release.evaluate``: ``score`` and the checks ``evaluate``
    builds with ``comparison_checks``) on the same frozen test set; smoke, latency and size do
    not depend on the pair and are left out. The pairs with the real champion must reproduce
    the gate's verdicts (``matches_gate``).
    """
    from tasks.data import lake
    from tasks.models.integrity import verified_model
    from tasks.release.evaluate import _predict, comparison_checks, frozen_test_set, score

    settings = envs[first_env]
    name = settings.registry.model_name
    equal = [("champion", champion["model_versions"][first_env])]
    equal += [(r["name"], r["model_versions"][first_env]) for r in rows if r["kind"] == "equal"]
    worse = [(r["name"], r["model_versions"][first_env]) for r in rows if r["kind"] == "worse"]
    seen = set(lake.read(table, version, columns=["sha256"], filter=[("split", "in", ["train", "val"])])
               ["sha256"].to_pylist())  # every model here trained on this one version
    test, _ = frozen_test_set(table, version, seen)
    images = test["image"].to_pylist()
    truth = [str(x) for x in test["label"].to_pylist()]
    preds = {}
    for label, v in equal + worse:  # each from its checked copy, as the gate predicts
        with verified_model(settings, f"models:/{name}/{v}") as (local, _):
            preds[label] = _predict(local, images)
    accuracy = {label: score(truth, p)["accuracy"] for label, p in preds.items()}

    def judged(s: Any, cand: str, champ: str) -> tuple[list[str], dict[str, Any]]:
        checks, compared = comparison_checks(s, truth, preds[cand], preds[champ], 0)
        failed = [c.name for c in checks if not c.passed]
        if score(truth, preds[cand])[s.gate.metric] < s.gate.min_value:
            failed.insert(0, "floor")
        return failed, compared

    def failed_checks(s: Any, cand: str, champ: str) -> list[str]:
        return judged(s, cand, champ)[0]

    def only_at_limit(s: Any, failed: list[str], compared: dict[str, Any]) -> bool:
        """Rejected by class_recall alone, and every offending drop equals the limit (k/n rounding, module doc)."""
        limit = s.gate.max_class_recall_drop
        drops = [v["delta"] for v in compared["per_class"].values() if v["judged"] and v["delta"] < -limit]
        return failed == ["class_recall"] and all(abs(d + limit) < 1e-9 for d in drops)

    by_env: dict[str, Any] = {}
    mismatches = []
    for env, s in envs.items():
        rejected, reasons, pairs, rejected_pairs = 0, {}, 0, []
        for champ_label, _ in equal:
            for cand_label, _ in equal:
                if cand_label == champ_label:
                    continue
                pairs += 1
                failed, compared = judged(s, cand_label, champ_label)
                if failed:
                    rejected += 1
                    for f in failed:
                        reasons[f] = reasons.get(f, 0) + 1
                    paired = compared["paired"]
                    rejected_pairs.append({
                        "champion": champ_label, "candidate": cand_label, "failed_checks": failed,
                        "accuracy_difference": paired["accuracy_difference"],
                        "only_champion_right": paired["only_champion_right"],
                        "only_candidate_right": paired["only_candidate_right"],
                        "mcnemar_p": paired["p_value_candidate_worse"],
                        "class_drops": {k: v["delta"] for k, v in compared["per_class"].items()
                                        if v["judged"] and v["delta"] < -s.gate.max_class_recall_drop},
                        "only_a_class_drop_equal_to_the_limit": only_at_limit(s, failed, compared),
                    })
        for row in rows:  # the pairs with the real champion: the gate's own verdicts
            here = failed_checks(s, row["name"], "champion")
            gate_failed = [c for c in row["gates"][env]["failed_checks"]
                           if c in ("floor", "non_inferiority", "mcnemar", "class_recall")]
            if gate_failed != here:
                mismatches.append({"env": env, "candidate": row["name"], "gate": gate_failed, "here": here})
        worse_passed = {}
        for cand_label, _ in worse:  # every worse model against every equal model as champion
            verdicts = {c: judged(s, cand_label, c) for c, _ in equal}
            worse_passed[cand_label] = {
                "passed_against": [c for c, _ in equal if not failed_checks(s, cand_label, c)],
                "passed_against_if_a_drop_equal_to_the_limit_passed": [
                    c for c, (f, comp) in verdicts.items() if not f or only_at_limit(s, f, comp)],
                "champions": len(equal),
                "passed_paired_checks_against": [
                    c for c, _ in equal
                    if not {"mcnemar", "non_inferiority", "class_recall"} & set(failed_checks(s, cand_label, c))],
            }
        diffs = [r["accuracy_difference"] for r in rejected_pairs]
        by_env[env] = {"pairs": pairs, "rejected": rejected, "rate": rejected / pairs if pairs else None,
                       "failed_checks": reasons,
                       "rejected_only_by_class_recall": sum(r["failed_checks"] == ["class_recall"] for r in rejected_pairs),
                       "rejected_only_by_a_class_drop_equal_to_the_limit": sum(
                           r["only_a_class_drop_equal_to_the_limit"] for r in rejected_pairs),
                       "rejected_within_margin": sum(d >= -s.gate.max_regression for d in diffs),
                       "rejected_accuracy_difference_range": [min(diffs), max(diffs)] if diffs else None,
                       "rejected_by_candidate": {c: sum(r["candidate"] == c for r in rejected_pairs)
                                                 for c in dict.fromkeys(r["candidate"] for r in rejected_pairs)},
                       "rejected_pairs": rejected_pairs,
                       "worse_vs_every_equal_champion": worse_passed}
    ordered = sorted(accuracy[label] for label, _ in equal)
    return {"models": len(equal), "test_images": len(truth), "accuracy": accuracy,
            "accuracy_min": ordered[0], "accuracy_median": ordered[len(ordered) // 2], "accuracy_max": ordered[-1],
            "by_env": by_env, "matches_gate": not mismatches, "mismatches": mismatches}


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.1f}" if signed else f"{x * 100:.1f}"


def markdown(result: dict[str, Any], envs: list[str]) -> str:
    champion = result["champion"]
    first = envs[0]
    lines = [
        f"Champion: seed {champion['seed']}, test accuracy {_pct(champion['gates'][first]['candidate_accuracy'])}% on "
        f"{champion['gates'][first]['test_images']} test images; trained {champion['epochs_run']} epochs "
        f"(best {champion['best_epoch']}) in {champion['train_s']:.1f} s.",
        "",
        "Accuracies and differences in percentage points; b / c = test images only the champion / only the candidate "
        "got right; p = McNemar exact one-sided (candidate worse); failed checks per gate setting.",
        "",
        "| candidate | training data | seed | epochs run (best) | cand. acc % | champ. acc % | diff pp | b / c | McNemar p | bootstrap 95% pp | "
        + " | ".join(f"{e} gate" for e in envs) + " | gate s (" + "/".join(envs) + ") |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|" + "---|" * len(envs) + "---:|",
    ]
    for r in result["candidates"]:
        g = r["gates"][first]
        low, high = g["bootstrap_95"] or (None, None)
        verdicts = []
        for e in envs:
            v = r["gates"][e]
            verdicts.append("pass" if v["decision"] == "pass" else f"**{v['decision'].upper()}** ({', '.join(v['failed_checks'])})")
        lines.append(
            f"| {r['name']} | {r['data']} | {r['seed']} | {r['epochs_run']} ({r['best_epoch']}) | {_pct(g['candidate_accuracy'])} | {_pct(g['champion_accuracy'])} | "
            f"{_pct(g['accuracy_difference'], True)} | {g['only_champion_right']} / {g['only_candidate_right']} | "
            f"{'-' if g['mcnemar_p'] is None else format(g['mcnemar_p'], '.3g')} | [{_pct(low, True)}, {_pct(high, True)}] | " + " | ".join(verdicts) + " | "
            + "/".join(f"{r['gates'][e]['gate_wall_s']:.1f}" for e in envs) + " |"
        )
    lines += ["", "| gate setting | min_value | max_regression | alpha | max_class_recall_drop | false rejects (equal retrains) "
              "| worse candidates passed | worse ones passing the paired checks (floor aside) |", "|---|---:|---:|---:|---:|---|---|---|"]
    for e in envs:
        s = result["summary"][e]
        gs = s["gate_settings"]
        lines.append(
            f"| {e} | {gs['min_value']} | {gs['max_regression']} | {gs['alpha']} | {gs['max_class_recall_drop']} | "
            f"{s['false_rejects']} / {s['equal_retrains']}{' (' + ', '.join(s['false_rejects_by']) + ')' if s['false_rejects_by'] else ''} | "
            f"{s['worse_passed']} / {s['worse_candidates']}{' (' + ', '.join(s['worse_passed_by']) + ')' if s['worse_passed_by'] else ''} | "
            f"{', '.join(s['worse_passed_comparison_checks']) or 'none'} |"
        )
    pw = result["all_pairs_of_equal_models"]
    lines += ["", f"Every ordered pair of the {pw['models']} equal-quality models (champion + retrains; test accuracy "
              f"{_pct(pw['accuracy_min'])}..{_pct(pw['accuracy_max'])}%, median {_pct(pw['accuracy_median'])}%) as "
              f"champion/candidate, gate floor and paired checks only (pairs with the real champion match the gate: "
              f"{'yes' if pw['matches_gate'] else 'NO'}):", "",
              "| gate setting | rejected pairs | share | failed check (a pair can fail several) | only class_recall failed "
              "| ... by a drop of exactly the limit | difference within the margin | difference of rejected pairs pp "
              "| rejected pairs by candidate |",
              "|---|---:|---:|---|---:|---:|---:|---|---|"]
    for e in envs:
        v = pw["by_env"][e]
        span = v["rejected_accuracy_difference_range"]
        by_cand = sorted(v["rejected_by_candidate"].items(), key=lambda kv: -kv[1])
        who = ", ".join(f"{c} ({_pct(pw['accuracy'][c])}%) {n}" for c, n in by_cand)
        lines.append(f"| {e} | {v['rejected']} / {v['pairs']} | {_pct(v['rate'])}% | "
                     f"{', '.join(f'{k} {n}' for k, n in sorted(v['failed_checks'].items())) or '-'} | "
                     f"{v['rejected_only_by_class_recall']} | {v['rejected_only_by_a_class_drop_equal_to_the_limit']} | "
                     f"{v['rejected_within_margin']} | "
                     f"{f'{_pct(span[0], True)}..{_pct(span[1], True)}' if span else '-'} | "
                     f"{who or '-'} |")
    worse = [r for r in result["candidates"] if r["kind"] == "worse"]
    if worse:
        lines += ["", f"Each worse candidate against each of the {pw['models']} equal-quality models as champion "
                  "(gate floor and paired checks; in brackets: passed the paired checks, floor aside; then: passed "
                  "if a class drop of exactly the limit were allowed):", "",
                  "| candidate | test acc % | " + " | ".join(f"{e}: passed against" for e in envs) + " |",
                  "|---|---:|" + "---|" * len(envs)]
        for r in worse:
            cells = []
            for e in envs:
                w = pw["by_env"][e]["worse_vs_every_equal_champion"][r["name"]]
                cells.append(f"{len(w['passed_against'])} / {w['champions']} ({len(w['passed_paired_checks_against'])}); "
                             f"{len(w['passed_against_if_a_drop_equal_to_the_limit_passed'])}")
            lines.append(f"| {r['name']} | {_pct(pw['accuracy'][r['name']])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
