"""A batch's incremental paths decide as a full recomputation does, and a retried batch writes the same tables.

* the nearest-score summary (``tasks.curation.nearest``) updated by new images, new pairs and images
  that left equals the full scan over the same scores;
* a batch curated with the stored summary decides exactly as one whose summary is gone (full scan);
* a batch retried after a crash behind its caches and its record writes the same snapshot, record and
  summary as one that ran once; its snapshot is the first one with the batch's rows appended;
* a snapshot written before the component left it is written whole once, then batches append;
* the memory-mapped vector files (``tasks.curation.vectors``) are extended by the batch, the same after a
  retry, and rebuilt from the features table when missing, with the same decisions.
"""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from PIL import Image, ImageEnhance

from tasks.curation import nearest as nearest_module
from tasks.curation.assignments import read_record
from tasks.curation.copy_pairs import PAIRS_TABLE, CopyScores
from tasks.curation.curate import _appended, _record_assignments, curate
from tasks.curation.curation_features import feature_config
from tasks.curation.kept_facts import KEPT_FACTS_SCHEMA, KeptFacts
from tasks.curation.nearest import NEAREST_TABLE, NearestMap, full_nearest, read_summary, update_nearest
from tasks.curation.neighbours import index_dir
from tasks.curation.pixel_keys import PixelKeys
from tasks.curation.plan import gallery_shas, plan_in_workdir, store_caches
from tasks.curation.tables import COMPONENTS_TABLE, RawFacts, RawRows
from tasks.data import lake
from tasks.data.ingest import ingest_landing
from tasks.settings import load_settings
from tests.factories.curation import IMAGES, LABELS, encode, files_removed, outcome, plant


def _scores(pairs: dict[tuple[str, str], float], fresh: dict[tuple[str, str], float]) -> CopyScores:
    scores = CopyScores(lambda sha: b"", stored=pairs)
    keys = sorted(CopyScores.key(*pair) for pair in fresh)
    scores.fresh.add(keys, [fresh.get(k, fresh.get(k[::-1])) for k in keys])
    return scores


@pytest.mark.parametrize("mapped", [False, True])  # the arrays by position in memory, and mapped from files
def test_updated_nearest_equals_the_full_scan(tmp_path, monkeypatch, mapped: bool) -> None:
    rng = random.Random(3)
    shas = [f"{i:04d}" for i in range(80)]
    label = {s: str(rng.randrange(3)) for s in shas}
    pixels = {s: (f"p{int(s) // 2}" if int(s) < 10 else s) for s in shas}  # a few exact duplicates
    pairs = {CopyScores.key(a, b): rng.random() for a in shas for b in shas if a < b and rng.random() < 0.08}
    before = [s for s in shas[:60] if s not in ("0007", "0031")]
    now = [s for s in shas if s not in ("0012", "0044")]  # two images left, 20 + 2 joined
    stored = {p: v for p, v in pairs.items() if rng.random() < 0.7}
    fresh = {p: v for p, v in pairs.items() if p not in stored}

    def over(eligible: list[str], labels: dict[str, str] = label) -> NearestMap:
        rows = RawRows.of(RawFacts(s, labels[s], 32, 32) for s in shas)
        return NearestMap.over(rows, PixelKeys.of(rows.at, [pixels[s] for s in rows.shas]), rows.positions(eligible), 1,
                               tmp_path / "scratch" if mapped else None)

    prior = full_nearest(over(before),
                         _scores({p: v for p, v in stored.items() if p[0] in before and p[1] in before}, {}))
    table = nearest_module._table(prior, prior.positions().tolist(), 1)  # the summary the previous curation stored
    # beside older rows (written at 0, as an earlier curation left them), which a newer row of the image supersedes
    table = pa.concat_tables([nearest_module._table(full_nearest(over(before), _scores({}, {})),
                                                    prior.positions().tolist()[::3], 0), table])
    scores_now = _scores({p: v for p, v in stored.items() if p[0] in now and p[1] in now},
                         {p: v for p, v in fresh.items() if p[0] in now and p[1] in now})
    m = over(now)
    added, gone = update_nearest(m, table, scores_now)
    full = full_nearest(over(now), scores_now)
    assert gone == {"0012", "0044"} and added == set(now) - set(before)
    rows, full_rows = ({m.rows.shas[i]: x.row(i) for i in x.positions().tolist()} for x in (m, full))
    assert rows == full_rows and list(rows) == now
    was = {m.rows.shas[i]: prior.row(i) for i in prior.positions().tolist()}
    assert {m.rows.shas[i] for i in m.changed} == {s for s in now if was.get(s) != rows[s]}
    assert {k: v.tolist() for k, v in m.by_label().items()} == {k: v.tolist() for k, v in full.by_label().items()}
    assert sum(map(len, m.by_label().values())) > 40
    relabelled = over(now, {**label, before[0]: "other"})
    assert update_nearest(relabelled, table, scores_now) is None
    assert all(math.isnan(v) for v in relabelled.score)  # untouched when the caller must compute in full
    # The stored summary as a curation reads it: from its Delta table, a block of rows at a time, each pass its columns.
    uri = str(tmp_path / "nearest")
    lake.overwrite(uri, table, {"step": "test"})
    monkeypatch.setattr(nearest_module, "SLICE_ROWS", 7)
    streamed = over(now)
    assert update_nearest(streamed, nearest_module.StoredRows(uri, lake.current_version(uri)), scores_now) == (added,
                                                                                                             gone)
    assert {m.rows.shas[i]: streamed.row(i) for i in streamed.positions().tolist()} == rows
    assert streamed.changed == m.changed


@pytest.fixture
def batch_home(tmp_path: Path, settings) -> tuple[Path, int]:
    """A home with 400 digits curated (raw 0) and a batch ingested (raw 1): 60 more digits and 2 brighter copies."""
    first = tmp_path / "first"
    for i in range(400):
        plant(first, f"d{i:04d}.png", LABELS[i], encode(Image.fromarray(IMAGES[i], mode="L"), "PNG", optimize=False))
    raw1 = ingest_landing(settings, run_id="i1", logical_date="2026-11-21", landing=first).raw_version
    curate(settings, raw1, run_id="c1", logical_date="2026-11-21")
    batch = tmp_path / "batch"
    for i in range(400, 460):
        plant(batch, f"d{i:04d}.png", LABELS[i], encode(Image.fromarray(IMAGES[i], mode="L"), "PNG", optimize=False))
    for i in (3, 17):
        brighter = ImageEnhance.Brightness(Image.fromarray(IMAGES[i], mode="L")).enhance(1.05)
        plant(batch, f"copy{i:04d}.png", LABELS[i], encode(brighter, "PNG"))
    raw2 = ingest_landing(settings, run_id="i2", logical_date="2026-11-22", landing=batch).raw_version
    return settings.home, raw2


def _copy(home: Path, to: Path):
    shutil.copytree(home, to, symlinks=True)
    return load_settings("sit", home=to)


def _record(settings) -> list:
    uri = settings.table_uri(COMPONENTS_TABLE)
    t = read_record(uri, lake.current_version(uri))
    return list(zip(*(t.column(c).to_pylist() for c in ["sha256", "component", "split", "first_raw_version"])))


def _tables(settings, result) -> dict[str, list]:
    """What a curation leaves behind: decisions, the record, the summary (without run ids)."""
    def rows(uri: str, cols: list[str]) -> list:
        t = lake.read(uri, lake.current_version(uri), columns=cols)
        return sorted(zip(*(t.column(c).to_pylist() for c in cols)))
    return {"outcome": sorted(outcome(settings, result).items()),
            "record": _record(settings),
            "nearest": sorted(zip(*(read_summary(settings.table_uri(NEAREST_TABLE)).column(c).to_pylist()
                                    for c in ["sha256", "label", "pixel_key", "nearest"]))),
            "pairs": rows(settings.table_uri(PAIRS_TABLE), ["sha256_a", "sha256_b", "score"])}


def _vector_files(settings) -> dict[str, bytes]:
    folder = index_dir(settings.storage.lake_uri, settings.reports_path)
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.vectors.*")) if p.suffix in (".npy", ".shas")}


def _rows(vector_files: dict[str, bytes]) -> list[int]:
    return sorted(len(v.split()) for name, v in vector_files.items() if name.endswith(".shas"))


def _report_decisions(result) -> dict:
    import json

    decisions = json.loads(Path(result.report_path).read_text())["decisions"]
    return {k: decisions[k] for k in ("abstained", "possible_copies", "separation")}


def test_a_batch_decides_as_a_full_recomputation(batch_home, tmp_path, monkeypatch) -> None:
    home, raw2 = batch_home
    full_settings = _copy(home, tmp_path / "full")
    shutil.rmtree(Path(full_settings.table_uri(NEAREST_TABLE)))  # no summary: the full scan
    full = curate(full_settings, raw2, run_id="c2", logical_date="2026-11-22")
    batch_settings = _copy(home, tmp_path / "batch_run")

    def no_full_scan(*args, **kwargs):
        raise AssertionError("the batch rescanned every image's pairs")

    monkeypatch.setattr(nearest_module, "full_nearest", no_full_scan)
    batch = curate(batch_settings, raw2, run_id="c2", logical_date="2026-11-22")
    assert _tables(batch_settings, batch) == _tables(full_settings, full)
    assert _report_decisions(batch) == _report_decisions(full)
    pairs_uri = load_settings("sit", home=home).table_uri(PAIRS_TABLE)
    before = lake.read(pairs_uri, lake.current_version(pairs_uri)).num_rows
    # Read by image, a phase at a time (here the candidates' images, then the walk's: the classes that abstain now
    # walk every component of theirs again), never one scan an image (test_pair_store: only the images asked for).
    assert 0 < _copies(batch)["stored_pairs_read"] <= before and 1 <= _copies(batch)["stored_pair_scans"] <= 3
    assert _copies(full)["stored_pairs_read"] == before  # the full scan of the nearest map reads them all


def _copies(result) -> dict:
    import json

    return json.loads(Path(result.report_path).read_text())["copies"]


def test_a_retried_batch_writes_the_same_tables(batch_home, tmp_path) -> None:
    home, raw2 = batch_home
    once_settings = _copy(home, tmp_path / "once")
    before = lake.current_version(once_settings.curated_table)
    once = curate(once_settings, raw2, run_id="c2", logical_date="2026-11-22")
    old, new = (lake.open_table(once_settings.curated_table, v) for v in (before, once.curated_version))
    assert set(old.file_uris()) < set(new.file_uris())  # no recorded row changed: the batch's rows appended

    first = _vector_files(load_settings("sit", home=home))
    assert len(first) == 4 and _rows(first) == [400, 400]  # two views (embedding, blurred): .npy and .shas each
    assert _rows(_vector_files(once_settings)) == [462, 462]  # extended by the batch: 60 digits and 2 copies

    retried_settings = _copy(home, tmp_path / "retried")
    meta = {"run_id": "c2", "logical_date": "2026-11-22", "raw_version": str(raw2),
            "config_hash": retried_settings.section_hash("curation")}
    crashed = plan_in_workdir(retried_settings, raw2, "c2", meta)  # an attempt that died after caches and record
    raw = lake.read(retried_settings.raw_table, raw2, columns=["sha256", "label"])
    label = dict(zip(raw.column("sha256").to_pylist(), raw.column("label").to_pylist()))
    assert crashed.gallery_labels and crashed.gallery_labels == {s: label[s] for s in gallery_shas(crashed)}
    store_caches(retried_settings, crashed, {**meta, "feature_config": feature_config(retried_settings.curation)})
    _record_assignments(retried_settings, crashed, meta)
    retried = curate(retried_settings, raw2, run_id="c2", logical_date="2026-11-22")
    assert _tables(retried_settings, retried) == _tables(once_settings, once)
    assert _vector_files(retried_settings) == _vector_files(once_settings)  # the crashed attempt's rows not again
    assert _report_decisions(retried) == _report_decisions(once)
    again = curate(retried_settings, raw2, run_id="c2", logical_date="2026-11-22")
    assert again.curated_version == retried.curated_version  # reused: nothing written


def test_a_batch_rebuilds_missing_vector_files_and_decides_the_same(batch_home, tmp_path) -> None:
    home, raw2 = batch_home
    with_files = _copy(home, tmp_path / "with_files")
    kept = curate(with_files, raw2, run_id="c2", logical_date="2026-11-22")
    rebuilt_settings = _copy(home, tmp_path / "rebuilt")
    for path in index_dir(rebuilt_settings.storage.lake_uri, rebuilt_settings.reports_path).glob("*.vectors.*"):
        path.unlink()
    rebuilt = curate(rebuilt_settings, raw2, run_id="c2", logical_date="2026-11-22")
    assert _tables(rebuilt_settings, rebuilt) == _tables(with_files, kept)
    assert _report_decisions(rebuilt) == _report_decisions(kept)
    assert _rows(_vector_files(rebuilt_settings)) == _rows(_vector_files(with_files))  # every eligible image


def test_a_snapshot_that_holds_the_component_is_written_whole_once_then_batches_append(batch_home, tmp_path) -> None:
    """A home curated before the component left the snapshot: its next batch writes the snapshot whole without the
    column (the same rows a batch appends on a home without it); the table is then one a batch appends to."""
    home, raw2 = batch_home
    plain_settings, old_settings = _copy(home, tmp_path / "plain"), _copy(home, tmp_path / "old")
    uri = old_settings.curated_table
    head = lake.commit_at(uri, lake.current_version(uri))
    snapshot = lake.read(uri, head.version)
    record = read_record(old_settings.table_uri(COMPONENTS_TABLE), int(head.metadata["components_version"]))
    component = dict(zip(record.column("sha256").to_pylist(), record.column("component").to_pylist()))
    lake.overwrite(uri, snapshot.add_column(4, "component", pa.array(
        [component[s] for s in snapshot.column("sha256").to_pylist()], pa.string())), head.metadata)

    plain = curate(plain_settings, raw2, run_id="c2", logical_date="2026-11-22")
    migrated = curate(old_settings, raw2, run_id="c2", logical_date="2026-11-22")
    assert files_removed(plain.curated_table, plain.curated_version) == 0  # appended
    assert files_removed(uri, migrated.curated_version) > 0  # written whole, once
    assert lake.read(uri, migrated.curated_version).schema == lake.read(plain.curated_table, plain.curated_version).schema
    assert "component" not in lake.read(uri, migrated.curated_version).schema.names
    assert _tables(old_settings, migrated) == _tables(plain_settings, plain)

    # From now on a batch that keeps every stored row as it is appends: nothing in the table asks for a rewrite.
    facts = lake.read(uri, migrated.curated_version, columns=KEPT_FACTS_SCHEMA.names).sort_by("sha256")
    assert _appended(lake.open_table(uri), KeptFacts.of_table(facts)).num_rows == 0


def test_a_second_batch_over_an_appended_summary_decides_as_a_full_recomputation(batch_home, tmp_path) -> None:
    """The first batch appends to the nearest summary (an image's newer row beside its older one); the next batch
    reads each image's newest row and decides as a curation that rescans every image's pairs."""
    home, raw2 = batch_home
    settings = _copy(home, tmp_path / "twice")
    uri = settings.table_uri(NEAREST_TABLE)
    files = set(lake.open_table(uri).file_uris())
    curate(settings, raw2, run_id="c2", logical_date="2026-11-22")
    head = lake.commit_at(uri, lake.current_version(uri))
    assert files < set(lake.open_table(uri).file_uris())  # appended
    assert int(head.metadata["rows_stored"]) > len(read_summary(uri)) == 462  # older rows of changed images too
    third = tmp_path / "third"
    for i in range(460, 500):
        plant(third, f"e{i:04d}.png", LABELS[i], encode(Image.fromarray(IMAGES[i], mode="L"), "PNG", optimize=False))
    raw3 = ingest_landing(settings, run_id="i3", logical_date="2026-11-23", landing=third).raw_version
    full_settings = _copy(settings.home, tmp_path / "third_full")
    shutil.rmtree(Path(full_settings.table_uri(NEAREST_TABLE)))  # no summary: the full scan
    full = curate(full_settings, raw3, run_id="c3", logical_date="2026-11-23")
    batch = curate(settings, raw3, run_id="c3", logical_date="2026-11-23")
    assert _tables(settings, batch) == _tables(full_settings, full)
    ours, theirs = _report_decisions(batch), _report_decisions(full)  # the batch reuses components the rescan walks:
    assert [(a["rule"], a["label"]) for a in ours.pop("abstained")] == \
        [(a["rule"], a["label"]) for a in theirs.pop("abstained")]  # the same classes abstain, worded for each
    assert ours == theirs
