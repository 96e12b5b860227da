"""Power and false alarms of the drift check (tasks/monitoring/drift.py) on real images, and its cost.

Data: scikit-learn's 1,797 real 8x8 digits (``tasks.data.sample_data.digits_arrays``), shuffled once
with ``numpy.random.default_rng(0)`` (the raw order is by writer).

* Champion, exactly as in a real run: the first ``--reference`` (1,000) shuffled digits are
  written as PNGs, ``ingest_landing`` -> ``curate`` -> ``tasks.training.train.train`` (settings' epochs
  unless ``--epochs``) -> ``register_candidate`` -> alias ``champion``. Settings: ``sit`` with
  ``training_data.sample_fraction: 1.0`` (as /tmp/dx/scenario.py). The detectors are fitted once with
  ``load_or_fit(settings, DriftReference(curated table, version, model version),
  Featurizer(settings, "models:/<name>/<version>"))``: the champion's held-out val+test images.
* New data: the remaining ~797 shuffled digits (the pool). Each scenario draws ``R`` samples of
  ``N`` pool images (without replacement inside a sample, independently across repeats, seed
  1000 + r, the same indices in every scenario), transforms them, encodes PNG bytes and calls
  ``run_tests(detectors, featurizer, Sample(...), alpha=familywise_alpha / 3)`` directly. Decision:
  drift if any test says drift. Reported: detection rate (with a 95% Clopper-Pearson interval),
  each test's rate, the champion's mean accuracy and its drop against the untransformed pool.
* Targets (the issue): no change -> false alarms <= 5%; every shift that costs the champion more
  than 5 accuracy points is detected in >= 90% of repeats at N = 500.
* Timing: a 10,000-image reference (the 1,797 digits plus 1-pixel shifts and brightness jitter,
  10,000 distinct PNGs), detectors fitted with the same pieces load_or_fit uses (Featurizer,
  ``_pca``, MMDDrift on ``drift.mmd_reference`` rows chosen by ``sample_rows``, KSDrift) and saved
  with ``save_detector`` into the folder ``detector_folder`` names; then a fresh process times the
  imports (torch, alibi-detect), ``load_or_fit`` (which finds them and loads), and the features and
  three tests of 1,000 new images (cold, then the median of warm repeats).

Usage: python bench/drift_eval.py [--repeats 25] [--null-repeats 100] [--small-n 100 200] [--small-repeats 20]
       [--epochs N] [--home DIR] [--out bench/results/drift_eval.json] [--skip-timing]
Env: FASTDUP_PRODUCTION=1 PYTHONPATH=.:plugins CD4ML_HOME=<temp dir> (or --home)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LOGICAL_DATE = "2026-11-21"
SHUFFLE_SEED = 0
COSTLY = 0.05  # accuracy drop (absolute) that makes a shift "costly"
TARGET_FALSE_ALARM = 0.05
TARGET_POWER = 0.90
TESTS = ("softmax_ks", "embedding_mmd", "label_chi2")


def _progress(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _png(a: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(a, dtype=np.uint8), mode="L").save(buf, format="PNG")
    return buf.getvalue()


def _settings(epochs: int | None):
    from tasks.settings import load_settings

    s = load_settings("sit")
    s = s.model_copy(update={"training_data": s.training_data.model_copy(update={"sample_fraction": 1.0})})
    if epochs:
        s = s.model_copy(update={"training": s.training.model_copy(update={"epochs": epochs})})
    return s


# --------------------------------------------------------------------------- transformations (uint8 8x8 -> uint8 8x8)


def _rotate(deg: float) -> Callable:
    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        from PIL import Image

        out = np.empty_like(x)
        for i, a in enumerate(x):
            # nearest up to 32x32 (exact), rotate there, box down: 0 degrees is the identity, so
            # the shift is the rotation and not interpolation blur at 8x8.
            big = Image.fromarray(a, "L").resize((32, 32), Image.NEAREST)
            big = big.rotate(deg, resample=Image.BILINEAR, fillcolor=0)
            out[i] = np.asarray(big.resize((8, 8), Image.BOX))
        return out
    return f


def _invert(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return 255 - x


def _noise(sigma: float) -> Callable:
    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.clip(np.rint(x + rng.normal(0.0, sigma, x.shape)), 0, 255).astype(np.uint8)
    return f


def _blur(radius: float) -> Callable:
    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        from PIL import Image, ImageFilter

        return np.stack([np.asarray(Image.fromarray(a, "L").filter(ImageFilter.GaussianBlur(radius))) for a in x])
    return f


def _scale(factor: float) -> Callable:
    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.clip(np.rint(x.astype(np.float64) * factor), 0, 255).astype(np.uint8)
    return f


def _offset(delta: int) -> Callable:
    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.clip(x.astype(np.int32) + delta, 0, 255).astype(np.uint8)
    return f


_FONTS: dict[int, Any] = {}


def font_digits(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` digits rendered with PIL's ``ImageFont.load_default(size)`` (Aileron, FreeType), made the
    way the UCI digits were: a 32x32 bitmap (glyph scaled to the box height, centred), 4x4 blocks of
    on-pixels counted (0..16) and scaled to 0..255. Varied: size, stroke width, slant, height, offset."""
    from PIL import Image, ImageDraw, ImageFont

    labels = rng.integers(0, 10, n)
    out = np.empty((n, 8, 8), dtype=np.uint8)
    for i, d in enumerate(labels):
        size = int(rng.integers(28, 44))
        font = _FONTS.setdefault(size, ImageFont.load_default(size=size))
        canvas = Image.new("L", (96, 96), 0)
        ImageDraw.Draw(canvas).text((48, 48), str(int(d)), fill=255, font=font, anchor="mm",
                                    stroke_width=int(rng.integers(0, 4)), stroke_fill=255)
        canvas = canvas.rotate(float(rng.uniform(-12, 12)), resample=Image.BILINEAR, fillcolor=0)
        glyph = canvas.crop(canvas.getbbox())
        h = int(rng.integers(26, 33))
        w = max(4, min(32, round(glyph.width * h / glyph.height)))
        glyph = glyph.resize((w, h), Image.BILINEAR)
        bitmap = np.zeros((32, 32), dtype=np.uint8)
        top = int(rng.integers(0, 32 - h + 1))
        left = max(0, min(32 - w, (32 - w) // 2 + int(rng.integers(-2, 3))))
        bitmap[top:top + h, left:left + w] = np.asarray(glyph) > 127
        counts = bitmap.reshape(8, 4, 8, 4).sum(axis=(1, 3))
        out[i] = np.rint(counts * (255.0 / 16.0)).astype(np.uint8)
    return out, labels


# --------------------------------------------------------------------------- scenarios


def scenarios(small_n: list[int]) -> list[dict[str, Any]]:
    """name, kind, transform (images, rng) -> images, n; kind 'pool' | 'imbalance3' | 'imbalance_skew' | 'font'."""
    base = [
        ("no change", "pool", None),
        ("rotate 5 deg", "pool", _rotate(5)),
        ("rotate 10 deg", "pool", _rotate(10)),
        ("rotate 25 deg", "pool", _rotate(25)),
        ("invert", "pool", _invert),
        ("gaussian noise sd 16", "pool", _noise(16)),
        ("gaussian noise sd 48", "pool", _noise(48)),
        ("blur r 0.4", "pool", _blur(0.4)),
        ("blur r 1.0", "pool", _blur(1.0)),
        ("darker x0.8", "pool", _scale(0.8)),
        ("darker x0.5", "pool", _scale(0.5)),
        ("brighter x1.5", "pool", _scale(1.5)),
        ("grey background +48", "pool", _offset(48)),
        ("3 classes only", "imbalance3", None),
        ("5 classes 80% / 5 classes 20%", "imbalance_skew", None),
        ("font digits (PIL load_default)", "font", None),
    ]
    out = [{"name": n, "kind": k, "transform": t, "n": 500} for n, k, t in base]
    mild = ("no change", "rotate 5 deg", "gaussian noise sd 16", "blur r 0.4", "darker x0.8", "brighter x1.5")
    for size in small_n:
        out += [{"name": n, "kind": k, "transform": t, "n": size} for n, k, t in base if n in mild]
    return out


def draw(sc: dict[str, Any], r: int, X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Images (uint8 N x 8 x 8) and integer labels of repeat ``r`` of scenario ``sc``."""
    pick = np.random.default_rng(1000 + r)  # the same pool indices in every scenario (paired comparison)
    noise = np.random.default_rng([2000 + r, int(hashlib.sha256(sc["name"].encode()).hexdigest()[:8], 16)])
    n = sc["n"]
    if sc["kind"] == "pool":
        idx = pick.choice(len(X), size=min(n, len(X)), replace=False)
        images = X[idx]
        if sc["transform"] is not None:
            images = sc["transform"](images, noise)
        return images, y[idx]
    if sc["kind"] == "imbalance3":  # every pool image of 3 random classes (about 240: fewer than N)
        classes = pick.choice(10, size=3, replace=False)
        idx = np.flatnonzero(np.isin(y, classes))
        return X[idx], y[idx]
    if sc["kind"] == "imbalance_skew":  # 400 images: 320 from 5 random classes, 80 from the other 5
        major = pick.choice(10, size=5, replace=False)
        a, b = np.flatnonzero(np.isin(y, major)), np.flatnonzero(~np.isin(y, major))
        idx = np.concatenate([pick.choice(a, size=min(320, len(a)), replace=False), pick.choice(b, size=80, replace=False)])
        return X[idx], y[idx]
    if sc["kind"] == "font":
        return font_digits(n, noise)
    raise ValueError(sc["kind"])


def wilson_free_ci(k: int, n: int) -> list[float]:
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return [round(ci.low, 3), round(ci.high, 3)]


# --------------------------------------------------------------------------- champion


def build_champion(settings: Any, home: Path, X: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    from tasks.curation.curate import curate
    from tasks.data.ingest import ingest_landing
    from tasks.models.registry import mlflow_client, register_candidate
    from tasks.training.train import train

    landing = home / "landing-reference"
    for i in range(len(X)):
        d = landing / str(int(y[i]))
        d.mkdir(parents=True, exist_ok=True)
        (d / f"ref_{i:04d}.png").write_bytes(_png(X[i]))
    t0 = time.perf_counter()
    ing = ingest_landing(settings, run_id="drift-eval-ingest", logical_date=LOGICAL_DATE, landing=landing)
    cur = curate(settings, ing.raw_version, run_id="drift-eval-curate", logical_date=LOGICAL_DATE)
    t1 = time.perf_counter()
    tr = train(settings, cur.curated_table, cur.curated_version, run_id="drift-eval-train", logical_date=LOGICAL_DATE)
    t2 = time.perf_counter()
    version = register_candidate(settings, tr.mlflow_run_id)
    mlflow_client(settings).set_registered_model_alias(settings.registry.model_name, settings.registry.champion_alias,
                                                       str(version))
    return {"curated_table": cur.curated_table, "curated_version": cur.curated_version, "model_version": version,
            "inserted": ing.inserted, "kept": cur.kept, "counts_by_split": cur.counts_by_split,
            "dropped_by_reason": cur.dropped_by_reason, "metrics": tr.metrics, "epochs_run": tr.epochs_run,
            "best_epoch": tr.best_epoch, "ingest_curate_s": round(t1 - t0, 1), "train_s": round(t2 - t1, 1)}


# --------------------------------------------------------------------------- timing


def timing_reference(n: int, seed: int = 5) -> tuple[list[bytes], list[str], list[str]]:
    """``n`` distinct PNGs from the 1,797 real digits: the originals, then copies shifted by up to
    1 pixel (zero fill) with brightness x[0.8, 1.2]. (images, labels, sha256)."""
    from tasks.data.sample_data import digits_arrays

    X, y = digits_arrays()
    rng = np.random.default_rng(seed)
    images, labels, shas, seen = [], [], [], set()

    def add(a: np.ndarray, label: int) -> None:
        data = _png(a)
        sha = hashlib.sha256(data).hexdigest()
        if sha not in seen and len(images) < n:
            seen.add(sha)
            images.append(data)
            labels.append(str(int(label)))
            shas.append(sha)

    for a, label in zip(X, y):
        add(a, label)
    while len(images) < n:
        i = int(rng.integers(len(X)))
        dx, dy = (int(v) for v in rng.integers(-1, 2, 2))
        a = np.zeros((10, 10), dtype=np.float64)
        a[1 + dy:9 + dy, 1 + dx:9 + dx] = X[i]
        add(np.clip(np.rint(a[1:9, 1:9] * rng.uniform(0.8, 1.2)), 0, 255).astype(np.uint8), y[i])
    return images, labels, shas


def fit_timing_detectors(settings: Any, model_version: int, n_ref: int) -> dict[str, Any]:
    """Fit the detectors on ``n_ref`` images with load_or_fit's own pieces, save them where load_or_fit looks."""
    from collections import Counter

    import torch  # noqa: F401
    from alibi_detect.cd import MMDDrift
    from alibi_detect.saving import save_detector

    from tasks.files import write_json
    from tasks.monitoring import drift

    t0 = time.perf_counter()
    images, labels, shas = timing_reference(n_ref)
    t_build = time.perf_counter() - t0
    reference = drift.DriftReference("bench-timing-reference", 0, model_version)
    uri = f"models:/{settings.registry.model_name}/{model_version}"
    featurizer = drift.Featurizer(settings, uri)
    folder = drift.detector_folder(settings, reference, featurizer.method)
    cfg = settings.drift
    alpha = cfg.familywise_alpha / len(drift.TESTS)
    times: dict[str, float] = {}
    t = time.perf_counter()
    probs, embedding = featurizer(images)
    times["features"] = time.perf_counter() - t
    t = time.perf_counter()
    mean, basis = drift._pca(embedding, drift.PCA_COMPONENTS)
    projected = ((embedding.astype(np.float64) - mean) @ basis).astype(np.float32)
    times["pca"] = time.perf_counter() - t
    t = time.perf_counter()
    mmd_rows = drift.sample_rows(shas, cfg.mmd_reference, "mmd-reference")
    with drift._seeded():
        mmd = MMDDrift(projected[mmd_rows], backend="pytorch", p_val=alpha, n_permutations=cfg.n_permutations,
                       device="cpu")
    times["mmd_init"] = time.perf_counter() - t
    t = time.perf_counter()
    counts = Counter(labels)
    meta = {"has_softmax": True, "method": featurizer.method, "classes": featurizer.classes,
            "n_permutations": cfg.n_permutations,
            "class_counts": dict(sorted(counts.items())),
            "class_proportions": {c: k / len(labels) for c, k in sorted(counts.items())},
            "n_reference": len(shas), "n_mmd_reference": len(mmd_rows), "n_test": 0, "test_accuracy": None,
            "reference_projection": projected[:, :2][drift.sample_rows(shas, 1000, "plot")].tolist()}
    folder.mkdir(parents=True, exist_ok=True)
    save_detector(mmd, folder / "mmd")
    np.savez(folder / "reference.npz", mean=mean, basis=basis, probs=probs)
    write_json(folder / "meta.json", meta)
    times["save"] = time.perf_counter() - t
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    return {"n_reference": len(shas), "n_mmd_reference": len(mmd_rows), "build_images_s": round(t_build, 2),
            "fit_s": {k: round(v, 3) for k, v in times.items()}, "fit_total_s": round(sum(times.values()), 2),
            "folder": str(folder), "folder_mb": round(size / 2**20, 2), "reference_table": reference.table}


def timing_child(model_version: int, n_new: int, warm: int) -> None:
    """Runs in a fresh process: cold imports, load, features + tests; prints one JSON line."""
    out: dict[str, Any] = {}
    t = time.perf_counter()
    import torch
    out["import_torch_s"] = time.perf_counter() - t
    t = time.perf_counter()
    import alibi_detect.cd  # noqa: F401
    import alibi_detect.saving  # noqa: F401
    out["import_alibi_detect_s"] = time.perf_counter() - t
    t = time.perf_counter()
    from tasks.monitoring import drift
    settings = _settings(None)
    out["import_tasks_s"] = time.perf_counter() - t

    images, labels, _ = timing_reference(10_000 + n_new)  # the first 10,000 are the reference's own
    images, labels = images[10_000:], labels[10_000:]
    shas = [hashlib.sha256(b).hexdigest() for b in images]
    sample = drift.Sample(shas, images, labels)

    t = time.perf_counter()
    featurizer = drift.Featurizer(settings, f"models:/{settings.registry.model_name}/{model_version}")
    out["featurizer_init_s"] = time.perf_counter() - t  # the champion from the registry (MLflow)
    t = time.perf_counter()
    detectors = drift.load_or_fit(settings, drift.DriftReference("bench-timing-reference", 0, model_version), featurizer)
    out["load_detectors_s"] = time.perf_counter() - t
    assert detectors.meta["n_reference"] == 10_000, detectors.meta["n_reference"]

    class Timed:
        """Times a featurizer's calls (``__call__``) or a detector's ``predict``; delegates the rest."""

        def __init__(self, inner):
            self.inner, self.seconds = inner, 0.0

        def _timed(self, fn, *a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t0

        def __call__(self, *a, **k):
            return self._timed(self.inner, *a, **k)

        def predict(self, *a, **k):
            return self._timed(self.inner.predict, *a, **k)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    import dataclasses

    alpha = settings.drift.familywise_alpha / len(drift.TESTS)

    def once() -> dict[str, float]:
        timed, mmd = Timed(featurizer), Timed(detectors.mmd)
        t0 = time.perf_counter()
        tests, _extra = drift.run_tests(dataclasses.replace(detectors, mmd=mmd), timed, sample, alpha)
        total = time.perf_counter() - t0
        once.tests = tests
        return {"features_s": timed.seconds, "tests_s": total - timed.seconds, "mmd_s": mmd.seconds,
                "features_and_tests_s": total}

    out["torch_threads"] = torch.get_num_threads()
    out["load_avg_before"] = os.getloadavg()
    runs = [once() for _ in range(1 + warm)]
    out["cold"] = runs[0]
    out["warm_median"] = {k: statistics.median(r[k] for r in runs[1:]) for k in runs[0]} if warm else None
    tests = once.tests
    if warm:  # the same with one torch thread (conf: training.num_threads: 1; the drift code does not set it)
        torch.set_num_threads(1)
        one = [once() for _ in range(warm)]
        out["warm_median_1_thread"] = {k: statistics.median(r[k] for r in one) for k in one[0]}
    out["load_avg_after"] = os.getloadavg()
    out["n_new"] = len(images)
    out["tests"] = [{k: t[k] for k in ("name", "p_value", "drift")} for t in tests]
    print("TIMING_JSON " + json.dumps(out))


def run_timing(settings: Any, model_version: int, n_ref: int, n_new: int, warm: int) -> dict[str, Any]:
    fit = fit_timing_detectors(settings, model_version, n_ref)
    _progress(f"timing: fitted on {fit['n_reference']} images in {fit['fit_total_s']} s; timing in a fresh process")
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--timing-child", str(model_version), "--timing-new", str(n_new),
                           "--timing-warm", str(warm)], capture_output=True, text=True, env=os.environ.copy())
    wall = time.perf_counter() - t
    line = next((x for x in proc.stdout.splitlines() if x.startswith("TIMING_JSON ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"timing child failed ({proc.returncode}): {proc.stderr[-3000:]}")
    child = json.loads(line[len("TIMING_JSON "):])
    child = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in child.items()}
    for key in ("cold", "warm_median", "warm_median_1_thread"):
        if child.get(key):
            child[key] = {k: round(v, 3) for k, v in child[key].items()}
    child["check_total_cold_s"] = round(child["load_detectors_s"] + child["cold"]["features_and_tests_s"], 3)
    child["child_wall_s"] = round(wall, 2)
    return {"fit": fit, "check": child}


# --------------------------------------------------------------------------- main


def main() -> None:
    parser, args = _parse_args()
    os.environ.setdefault("FASTDUP_PRODUCTION", "1")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    logging.basicConfig(level=logging.WARNING)
    if args.timing_child is not None:
        timing_child(args.timing_child, args.timing_new, args.timing_warm)
        return
    if min(args.repeats, args.null_repeats, args.small_repeats) < 20:
        parser.error("--repeats, --null-repeats and --small-repeats must be >= 20")

    home = Path(args.home or os.environ.get("CD4ML_HOME") or tempfile.mkdtemp(prefix="cd4ml-drift-eval-")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    if any(home.iterdir()):
        parser.error(f"{home} is not empty: give a new CD4ML_HOME (the champion must be trained from scratch)")
    os.environ["CD4ML_HOME"] = str(home)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    started = time.perf_counter()

    from tasks.data.sample_data import digits_arrays
    from tasks.monitoring import drift

    settings = _settings(args.epochs)
    X_all, y_all = digits_arrays()
    perm = np.random.default_rng(SHUFFLE_SEED).permutation(len(X_all))
    X_all, y_all = X_all[perm], y_all[perm]
    X_ref, y_ref = X_all[:args.reference], y_all[:args.reference]
    X_pool, y_pool = X_all[args.reference:], y_all[args.reference:]

    # ------------------------------------------------------------------ champion and its detectors
    champ = build_champion(settings, home, X_ref, y_ref)
    _progress(f"champion v{champ['model_version']}: {champ['metrics']} ({champ['epochs_run']} epochs, "
              f"{champ['train_s']} s); curated {champ['counts_by_split']} dropped {champ['dropped_by_reason']}")
    featurizer = drift.Featurizer(settings, f"models:/{settings.registry.model_name}/{champ['model_version']}")
    t = time.perf_counter()
    detectors = drift.load_or_fit(settings, drift.DriftReference(champ["curated_table"], champ["curated_version"],
                                                                  champ["model_version"]), featurizer)
    fit_s = time.perf_counter() - t
    meta = detectors.meta
    _progress(f"detectors: {meta['n_reference']} reference images (MMD {meta['n_mmd_reference']}), "
              f"test accuracy {meta['test_accuracy']}, fitted in {fit_s:.1f} s")
    alpha = settings.drift.familywise_alpha / len(drift.TESTS)

    pool_probs, _ = featurizer([_png(a) for a in X_pool])
    pool_accuracy = featurizer.accuracy(pool_probs, [str(int(v)) for v in y_pool])

    # ------------------------------------------------------------------ scenarios
    rows: list[dict[str, Any]] = []
    for sc in scenarios(args.small_n):
        repeats = (args.null_repeats if sc["name"] == "no change" else args.repeats) if sc["n"] == args.n else args.small_repeats
        rows.append(run_scenario(sc, repeats, X_pool, y_pool, detectors, featurizer, settings, alpha, pool_accuracy))

    # ------------------------------------------------------------------ targets
    targets = _targets(rows, args.n)

    # ------------------------------------------------------------------ timing
    timing = None
    if not args.skip_timing:
        timing = run_timing(settings, champ["model_version"], args.timing_ref, args.timing_new, args.timing_warm)
        targets["timing_check_s"] = timing["check"]["check_total_cold_s"]
        targets["timing_met"] = timing["check"]["check_total_cold_s"] <= 10.0

    total_s = time.perf_counter() - started
    result = {
        "generated": datetime.now(UTC).isoformat(timespec="seconds"), "python": platform.python_version(),
        "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "total_s": round(total_s, 1),
        "drift_py_sha256": hashlib.sha256(Path(drift.__file__).read_bytes()).hexdigest()[:16],  # the module measured
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": {"env": "sit (training_data.sample_fraction 1.0)", "drift": settings.drift.model_dump(mode="json"),
                     "epochs": settings.training.epochs, "alpha_per_test": alpha},
        "data": {"source": "sklearn load_digits, shuffled with default_rng(0)", "reference_digits": args.reference,
                 "pool_digits": len(X_pool)},
        "champion": champ, "detectors": {k: meta[k] for k in ("n_reference", "n_mmd_reference", "n_test", "test_accuracy")},
        "detector_fit_s": round(fit_s, 2), "pool_accuracy": round(pool_accuracy, 4), "scenarios": rows,
        "targets": targets, "timing": timing, "home": str(home),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print_tables(result)
    print(f"\nJSON: {out}\nCD4ML_HOME: {home}\nTotal {total_s / 60:.1f} min")


def _parse_args() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=25, help="repeats per shift scenario (>= 20)")
    parser.add_argument("--null-repeats", type=int, default=100, help="repeats of 'no change' at N = 500")
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--small-n", type=int, nargs="*", default=[100, 200], help="smaller samples for the mildest shifts")
    parser.add_argument("--small-repeats", type=int, default=20, help="repeats per scenario at the smaller sizes")
    parser.add_argument("--reference", type=int, default=1000, help="shuffled digits the champion is trained on")
    parser.add_argument("--epochs", type=int, help="training.epochs (default: conf)")
    parser.add_argument("--timing-ref", type=int, default=10_000)
    parser.add_argument("--timing-new", type=int, default=1000)
    parser.add_argument("--timing-warm", type=int, default=3)
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--home", help="CD4ML_HOME (default: $CD4ML_HOME, else a new temporary folder)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "drift_eval.json"))
    parser.add_argument("--timing-child", type=int, help=argparse.SUPPRESS)
    return parser, parser.parse_args()


def run_scenario(sc: dict[str, Any], repeats: int, X_pool: np.ndarray, y_pool: np.ndarray, detectors: Any,
                 featurizer: Any, settings: Any, alpha: float, pool_accuracy: float) -> dict[str, Any]:
    """One scenario's row: ``repeats`` samples drawn and transformed, the three tests and the previous rules on each."""
    from tasks.data import drift

    meta = detectors.meta
    t0 = time.perf_counter()
    per: list[dict[str, Any]] = []
    for r in range(repeats):
        images, labels = draw(sc, r, X_pool, y_pool)
        data = [_png(a) for a in images]
        sample = drift.Sample([hashlib.sha256(b).hexdigest() for b in data], data, [str(int(v)) for v in labels])
        tests, extra = drift.run_tests(detectors, featurizer, sample, alpha)
        t = {x["name"]: x for x in tests}
        per_class = t["softmax_ks"]["per_class_p_bonferroni"]
        # The rules tasks/monitoring/drift.py used before this benchmark, on the same samples: (1) per-class
        # two-sided KS with Bonferroni as the softmax decision, (2) alibi-detect's raw MMD p-value,
        # #{permuted >= observed} / n, instead of the exact (1 + #) / (1 + n).
        n_perm = settings.drift.n_permutations
        p_mmd_raw = (t["embedding_mmd"]["p_value"] * (1 + n_perm) - 1) / n_perm
        old_ks = min(per_class.values()) <= alpha
        chi = t["label_chi2"]["drift"]
        detected = any(x["drift"] for x in tests)
        drop = (meta["test_accuracy"] - extra["accuracy"]
                if meta["test_accuracy"] is not None and extra["accuracy"] is not None else None)
        per.append({"n": len(data), "distinct": len(set(sample.shas)), "accuracy": extra["accuracy"],
                    "drift": detected,
                    # what policy block does with this check (tasks/monitoring/drift.py blocks: detected and harmful)
                    "blocked": detected and drift.is_harmful(drop, settings.drift.harmful_accuracy_drop),
                    **{x["name"]: {"drift": x["drift"], "p": round(x["p_value"], 5)} for x in tests},
                    "ks_min_class": min(per_class, key=per_class.get),
                    "cf_mmd_plus1": old_ks or t["embedding_mmd"]["drift"] or chi,
                    "cf_onesided_conf_ks": t["softmax_ks"]["drift"] or p_mmd_raw <= alpha or chi,
                    "cf_both": old_ks or p_mmd_raw <= alpha or chi})
    k = sum(p["drift"] for p in per)
    acc = float(np.mean([p["accuracy"] for p in per]))
    row = {"scenario": sc["name"], "n": sc["n"], "n_mean": round(float(np.mean([p["n"] for p in per])), 1),
           "repeats": repeats, "detected": k, "detection_rate": round(k / repeats, 3),
           "block_rate": round(sum(p["blocked"] for p in per) / repeats, 3),
           "detection_ci95": wilson_free_ci(k, repeats),
           "by_test": {name: round(sum(p[name]["drift"] for p in per) / repeats, 3) for name in TESTS},
           "median_p": {name: float(np.median([p[name]["p"] for p in per])) for name in TESTS},
           "counterfactual_rates": {cf: round(sum(p[cf] for p in per) / repeats, 3)
                                    for cf in ("cf_mmd_plus1", "cf_onesided_conf_ks", "cf_both")},
           "ks_alarm_classes": dict(Counter(p["ks_min_class"] for p in per if p["softmax_ks"]["drift"])),
           "accuracy": round(acc, 4), "accuracy_drop": round(pool_accuracy - acc, 4),
           "seconds": round(time.perf_counter() - t0, 1), "repeats_detail": per}
    _progress(f"{sc['name']:32s} N={row['n_mean']:>5} det {row['detection_rate']:.2f} {row['by_test']} "
              f"acc {acc:.3f} drop {row['accuracy_drop']:+.3f} ({row['seconds']} s)")
    return row


def _targets(rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """The issue's targets at N = ``n``: false alarms of "no change", power on the costly shifts, blocking."""
    null = next(r for r in rows if r["scenario"] == "no change" and r["n"] == n)
    costly = [r for r in rows if r["n"] == n and r["accuracy_drop"] > COSTLY]
    missed = [r["scenario"] for r in costly if r["detection_rate"] < TARGET_POWER]
    return {
        "false_alarm_rate": null["detection_rate"], "false_alarm_ci95": null["detection_ci95"],
        "false_alarm_met": null["detection_rate"] <= TARGET_FALSE_ALARM,
        "false_alarms_small_n": {r["n"]: r["detection_rate"] for r in rows if r["scenario"] == "no change" and r["n"] != n},
        "costly_shifts": [r["scenario"] for r in costly], "costly_missed": missed, "power_met": not missed,
        "costly_blocked_min": min((r["block_rate"] for r in costly), default=None),
        "uncostly_blocked_max": max((r["block_rate"] for r in rows if r["n"] == n
                                     and r["accuracy_drop"] <= COSTLY), default=None),
        "uncostly_detected": [r["scenario"] for r in rows if r["n"] == n and r["accuracy_drop"] <= COSTLY
                              and r["detection_rate"] >= TARGET_POWER and r["scenario"] != "no change"],
        "uncostly_not_detected": [r["scenario"] for r in rows if r["n"] == n and r["accuracy_drop"] <= COSTLY
                                  and r["detection_rate"] < TARGET_POWER and r["scenario"] != "no change"],
    }


def print_tables(res: dict[str, Any]) -> None:
    c, d = res["champion"], res["detectors"]
    print(f"\nChampion v{c['model_version']}: trained on {c['counts_by_split']} curated images "
          f"({c['epochs_run']} epochs), test accuracy {d['test_accuracy']:.3f}; accuracy on the untransformed "
          f"pool of {res['data']['pool_digits']}: {res['pool_accuracy']:.3f}. Detectors: {d['n_reference']} held-out "
          f"reference images (MMD {d['n_mmd_reference']}), alpha per test {res['settings']['alpha_per_test']:.4f}.\n")
    print("| scenario | N | repeats | detected (95% CI) | blocked (policy block) | softmax_ks | embedding_mmd | label_chi2 "
          "| champion acc | drop |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in res["scenarios"]:
        lo, hi = r["detection_ci95"]
        b = r["by_test"]
        print(f"| {r['scenario']} | {r['n_mean']:g} | {r['repeats']} | **{r['detection_rate']:.2f}** ({lo:.2f}-{hi:.2f}) "
              f"| **{r.get('block_rate', float('nan')):.2f}** | {b['softmax_ks']:.2f} | {b['embedding_mmd']:.2f} | {b['label_chi2']:.2f} | {r['accuracy']:.3f} "
              f"| {r['accuracy_drop'] * 100:+.1f} |")
    print("\nThe previous rules on the same samples: per-class KS (Bonferroni) as the softmax decision; "
          "alibi-detect's raw MMD p-value; both (the check before this benchmark)\n")
    print("| scenario | N | as is | per-class KS | raw MMD p | both (previous) | KS alarms by class |\n"
          "|---|---:|---:|---:|---:|---:|---|")
    for r in res["scenarios"]:
        cf = r["counterfactual_rates"]
        print(f"| {r['scenario']} | {r['n_mean']:g} | {r['detection_rate']:.2f} | {cf['cf_mmd_plus1']:.2f} | "
              f"{cf['cf_onesided_conf_ks']:.2f} | {cf['cf_both']:.2f} | {r['ks_alarm_classes'] if r['scenario'] == 'no change' else ''} |")
    t = res["targets"]
    print(f"\nTargets: false alarms {t['false_alarm_rate']:.2f} (CI {t['false_alarm_ci95']}) <= 0.05: "
          f"{'MET' if t['false_alarm_met'] else 'NOT MET'}; costly shifts (drop > 5 pts) {t['costly_shifts']} "
          f"detected >= 90%: {'MET' if t['power_met'] else 'NOT MET, missed ' + str(t['costly_missed'])}; "
          f"policy block stops >= {t.get('costly_blocked_min')} of costly and <= {t.get('uncostly_blocked_max')} of "
          f"other samples")
    if res["timing"]:
        f, k = res["timing"]["fit"], res["timing"]["check"]
        print(f"\nTiming ({f['n_reference']} reference images, MMD reference {f['n_mmd_reference']}, "
              f"{k['n_new']} new images, fresh process)\n")
        print("| step | seconds |\n|---|---:|")
        for name, v in [("import torch", k["import_torch_s"]), ("import alibi_detect (after torch)", k["import_alibi_detect_s"]),
                        ("Featurizer (champion from the registry)", k["featurizer_init_s"]),
                        ("(a) load saved detectors (load_or_fit)", k["load_detectors_s"]),
                        ("(b) features, 1,000 images (cold)", k["cold"]["features_s"]),
                        ("(b) three tests (cold)", k["cold"]["tests_s"]),
                        ("(a)+(b) check total (cold)", k["check_total_cold_s"]),
                        ("(b) of which MMD permutation test (cold)", k["cold"]["mmd_s"]),
                        ("(b) features + tests, warm median", k["warm_median"]["features_and_tests_s"] if k["warm_median"] else None),
                        ("(b) features + tests, warm median, 1 torch thread",
                         k["warm_median_1_thread"]["features_and_tests_s"] if k.get("warm_median_1_thread") else None),
                        ("one-off fit total (features, PCA, MMD, KS, save)", f["fit_total_s"])]:
            print(f"| {name} | {v} |")
        print(f"\nfit detail: {f['fit_s']}; detectors on disk {f['folder_mb']} MB; torch threads {k['torch_threads']}; "
              f"load average {k['load_avg_before'][0]:.1f} -> {k['load_avg_after'][0]:.1f}. Timing target (<= 10 s): "
              f"{'MET' if res['targets']['timing_met'] else 'NOT MET'}")


if __name__ == "__main__":
    main()
