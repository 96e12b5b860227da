"""Batch scoring with a real champion on real digit files: rows, idempotence, quarantine, no champion."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.factories.digits import split_rows


def _landing(folder: Path, n: int = 120) -> dict[str, str]:
    """``n`` test-split digits as PNG and JPEG files (no label folders: unlabelled), plus bad files."""
    folder.mkdir(parents=True, exist_ok=True)
    truth = {}
    for i, row in enumerate(split_rows("test")[:n]):
        if i % 3 == 0:
            img = Image.open(io.BytesIO(row["image"])).convert("L").resize((32, 32), Image.BILINEAR)
            path = folder / f"img_{i:04d}.jpg"
            img.save(path, format="JPEG", quality=95)
        else:
            path = folder / f"img_{i:04d}.png"
            path.write_bytes(row["image"])
        truth[path.name] = row["label"]
    (folder / "notes.png").write_text("this is not an image")
    (folder / "empty.png").write_bytes(b"")
    good = (folder / "img_0001.png").read_bytes()
    (folder / "truncated.png").write_bytes(good[: len(good) // 2])  # a PNG header with a cut body
    Image.new("L", (4, 4), 128).save(folder / "tiny.png")
    return truth


def test_score_writes_one_row_per_image_with_every_probability_and_quarantines_bad_files(champion, tmp_path: Path) -> None:
    from tasks.data import lake
    from tasks.serving.score import PREDICTIONS_SCHEMA, score

    settings, model = champion
    settings = settings.model_copy(update={"storage": settings.storage.model_copy(
        update={"lake_uri": str(tmp_path / "lake")})})
    truth = _landing(tmp_path / "batch")
    result = score(settings, str(tmp_path / "batch"), run_id="manual__score1", logical_date="2026-11-22")

    assert result.model_version == model.version and result.files_seen == len(truth) + 4
    assert result.scored == len(truth)
    assert result.rejected_by_reason == {"corrupt_image": 1, "empty_file": 1, "not_an_image": 1, "too_small": 1}
    rows = lake.scan(lake.open_table(result.predictions_table))
    assert rows.schema.equals(PREDICTIONS_SCHEMA, check_metadata=False)
    assert rows.num_rows == len(truth)
    probs = np.array(rows.column("probabilities").to_pylist())
    assert probs.shape == (len(truth), 10) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    assert rows.column("classes").to_pylist()[0] == [str(d) for d in range(10)]
    names = [u.rsplit("/", 1)[1] for u in rows.column("source_uri").to_pylist()]
    labels = rows.column("label").to_pylist()
    accuracy = np.mean([truth[n] == label for n, label in zip(names, labels)])
    assert accuracy > 0.8, accuracy  # real predictions: the champion's test accuracy is ~0.9 on these
    assert set(rows.column("model_version").to_pylist()) == {model.version}
    assert {str(t) for t in rows.column("logical_date").to_pylist()} == {"2026-11-22 00:00:00+00:00"}

    rejects = lake.scan(lake.open_table(result.rejects_table)).to_pylist()
    by_name = {r["source_uri"].rsplit("/", 1)[1]: r for r in rejects}
    assert by_name["truncated.png"]["reason_code"] == "corrupt_image"
    assert "below min_side" in by_name["tiny.png"]["reason"]

    again = score(settings, str(tmp_path / "batch"), run_id="manual__score2", logical_date="2026-11-22")
    assert again.scored == 0 and again.already_scored == len(truth) and again.versions == []
    assert lake.scan(lake.open_table(result.predictions_table)).num_rows == len(truth)
    assert lake.scan(lake.open_table(result.rejects_table)).num_rows == 4  # quarantine rows are not repeated


def test_small_commits_and_a_new_file_score_only_what_is_new(champion, tmp_path: Path) -> None:
    from tasks.data import lake
    from tasks.serving.score import score

    settings, _ = champion
    settings = settings.model_copy(update={
        "storage": settings.storage.model_copy(update={"lake_uri": str(tmp_path / "lake")}),
        "serving": settings.serving.model_copy(update={"batch_size": 7, "commit_every": 20}),
    })
    _landing(tmp_path / "batch", n=45)
    first = score(settings, str(tmp_path / "batch"), run_id="r1", logical_date="2026-11-22")
    assert first.scored == 45 and len(first.versions) == 3  # 49 files in chunks of 20: three commits with rows
    row = split_rows("test")[200]
    (tmp_path / "batch" / "late.png").write_bytes(row["image"])
    second = score(settings, str(tmp_path / "batch"), run_id="r2", logical_date="2026-11-23")
    assert second.scored == 1 and second.already_scored == 45
    rows = lake.scan(lake.open_table(settings.predictions_table))
    assert rows.num_rows == 46 and len(set(zip(rows.column("source_uri").to_pylist(),
                                               rows.column("image_key").to_pylist()))) == 46


def test_no_champion_is_a_clear_error_before_any_work(settings, tmp_path: Path) -> None:
    from tasks.data import lake
    from tasks.models.champion import NoChampionError
    from tasks.serving.score import NothingToScoreError, score

    with pytest.raises(NothingToScoreError, match="does not exist"):  # checked first: a scheduled run skips
        score(settings, str(tmp_path / "batch"), run_id="r", logical_date="2026-11-22")
    (tmp_path / "batch").mkdir()
    with pytest.raises(NothingToScoreError, match="holds no files"):
        score(settings, str(tmp_path / "batch"), run_id="r", logical_date="2026-11-22")
    (tmp_path / "batch" / "a.png").write_bytes(split_rows("test")[0]["image"])
    with pytest.raises(NoChampionError, match="has no champion"):
        score(settings, str(tmp_path / "batch"), run_id="r", logical_date="2026-11-22")
    assert not lake.exists(settings.predictions_table)


def test_an_fsspec_url_is_scored_like_a_folder(champion, tmp_path: Path) -> None:
    import fsspec

    from tasks.serving.score import score

    settings, _ = champion
    settings = settings.model_copy(update={"storage": settings.storage.model_copy(
        update={"lake_uri": str(tmp_path / "lake")}), "serving": settings.serving.model_copy(
        update={"allowed_schemes": ("file", "memory")})})  # object stores only where settings allow them
    fs = fsspec.filesystem("memory")
    for i, row in enumerate(split_rows("test")[:20]):
        fs.pipe(f"/inbox-{tmp_path.name}/scan_{i:02d}.png", row["image"])
    fs.pipe(f"/inbox-{tmp_path.name}/notes.png", b"not an image")
    result = score(settings, f"memory://inbox-{tmp_path.name}", run_id="mem", logical_date="2026-11-22")
    assert result.scored == 20 and result.rejected_by_reason == {"not_an_image": 1}
    assert result.source_uri.startswith("memory://")


def test_a_decode_worker_gives_the_same_rows_as_decoding_in_process(champion, tmp_path: Path) -> None:
    import numpy as np

    from tasks.data import lake
    from tasks.serving.score import score

    settings, _ = champion
    _landing(tmp_path / "batch", n=60)  # PNG, JPEG and the four bad files (a truncated PNG fails in the decoder)
    results, tables = [], []
    for workers in (0, 1):
        s = settings.model_copy(update={
            "storage": settings.storage.model_copy(update={"lake_uri": str(tmp_path / f"lake{workers}")}),
            "serving": settings.serving.model_copy(update={"decode_workers": workers, "decode_min_files": 0,
                                                           "batch_size": 16}),
        })
        results.append(score(s, str(tmp_path / "batch"), run_id="r", logical_date="2026-11-22"))
        tables.append(lake.scan(lake.open_table(s.predictions_table)).sort_by("source_uri"))
    serial, pooled = results
    assert serial.scored == pooled.scored == 60
    assert serial.rejected_by_reason == pooled.rejected_by_reason == {
        "corrupt_image": 1, "empty_file": 1, "not_an_image": 1, "too_small": 1}
    assert tables[0].column("label").to_pylist() == tables[1].column("label").to_pylist()
    a, b = (np.array(t.column("probabilities").to_pylist()) for t in tables)
    assert np.allclose(a, b, atol=1e-6)


def test_a_dead_decode_worker_falls_back_to_decoding_in_process(champion, tmp_path: Path, monkeypatch) -> None:
    from tasks.serving import score as scoring

    settings, _ = champion
    _landing(tmp_path / "batch", n=30)
    original = scoring._LazyPool.__init__

    def broken(self, workers, runtime_dir):  # the worker's initializer cannot import a runtime: the pool breaks
        original(self, workers, tmp_path / "no-runtime-here")

    monkeypatch.setattr(scoring._LazyPool, "__init__", broken)
    s = settings.model_copy(update={
        "storage": settings.storage.model_copy(update={"lake_uri": str(tmp_path / "lake")}),
        "serving": settings.serving.model_copy(update={"decode_min_files": 0, "batch_size": 8}),
    })
    result = scoring.score(s, str(tmp_path / "batch"), run_id="r", logical_date="2026-11-22")
    assert result.scored == 30 and result.quarantined == 4


def test_an_undecodable_name_and_a_png_with_200_mb_of_junk_are_quarantined_and_the_rest_scored(
        champion, tmp_path: Path) -> None:
    import tracemalloc

    from tasks.serving.score import score
    from tests.factories.hostile import png_with_junk, undecodable

    settings, _ = champion
    settings = settings.model_copy(update={"storage": settings.storage.model_copy(
        update={"lake_uri": str(tmp_path / "lake")})})
    batch = tmp_path / "batch"
    batch.mkdir()
    rows = split_rows("test")[:10]
    for i, row in enumerate(rows):
        (batch / f"scan_{i}.png").write_bytes(row["image"])
    with open(undecodable(batch), "wb") as fh:
        fh.write(rows[0]["image"])
    png_with_junk(batch / "junk.png")
    tracemalloc.start()
    try:  # before: UnicodeEncodeError ended the run, and the 200 MB file was read whole
        result = score(settings, str(batch), run_id="hostile", logical_date="2026-11-22")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.scored == 10 and result.rejected_by_reason == {"file_too_large": 1, "undecodable_name": 1}
    assert peak < 64 << 20


def test_an_http_scoring_source_is_refused_unfetched(champion, tmp_path: Path) -> None:
    from tasks.data.inputs import SchemeNotAllowedError
    from tasks.serving.score import score
    from tests.factories.hostile import watched_http_server

    settings, _ = champion
    settings = settings.model_copy(update={"storage": settings.storage.model_copy(
        update={"lake_uri": str(tmp_path / "lake")})})
    with watched_http_server() as (base, requests):
        with pytest.raises(SchemeNotAllowedError) as caught:
            score(settings, f"{base}/inbox", run_id="r", logical_date="2026-11-22")
    assert caught.value.key == "serving.allowed_schemes" and requests == []
