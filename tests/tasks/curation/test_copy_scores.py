"""Copy scores kept as arrays (issue 25): the pairs scored in a curation answer as the dicts they replaced."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tasks.curation.copy_pairs import PAIRS_SCHEMA, CopyScores, FreshPairs


def _reference(stored: dict[tuple[str, str], float], fresh: list[tuple[tuple[str, str], float]]
               ) -> dict[str, dict[str, float]]:
    """Partners as the former dicts built them: stored rows in order, then the fresh rows in order."""
    out: dict[str, dict[str, float]] = {}
    for (a, b), v in [*stored.items(), *fresh]:
        out.setdefault(a, {})[b] = v
        out.setdefault(b, {})[a] = v
    return out


def test_partners_and_rows_match_the_dicts_they_replace() -> None:
    rng = random.Random(7)
    shas = [f"{rng.getrandbits(64):016x}" for _ in range(60)]
    pairs = sorted({CopyScores.key(*rng.sample(shas, 2)) for _ in range(400)})
    stored = {p: rng.random() for p in pairs[::3]}
    fresh = [(p, rng.random()) for p in pairs if p not in stored]
    scores = CopyScores(lambda sha: b"", stored=stored)
    for start in range(0, len(fresh), 50):  # added a block at a time, as score_many does
        block = fresh[start:start + 50]
        scores.fresh.add([p for p, _ in block], [v for _, v in block])
    want = _reference(stored, fresh)
    for sha in shas:
        got = scores.partners(sha)
        assert list(got.items()) == list(want.get(sha, {}).items())  # same partners, same order
    rows = scores.fresh_rows("run-1")
    assert rows.schema == PAIRS_SCHEMA
    assert list(zip(rows.column("sha256_a").to_pylist(), rows.column("sha256_b").to_pylist())) == \
        sorted(p for p, _ in fresh)
    assert rows.column("score").to_pylist() == [dict(fresh)[p] for p in sorted(dict(fresh))]
    assert set(rows.column("run_id").to_pylist()) == {"run-1"}
    assert [(a, b, v) for a, b, v in scores.fresh.items()] == [(a, b, v) for (a, b), v in fresh]
    scores.fresh.seal()  # the plan is done: the index and the code map go, the rows to store stay the same
    assert scores.fresh_rows("run-1").equals(rows)
    with pytest.raises(RuntimeError, match="sealed"):
        scores.fresh.partners(shas[0])
    with pytest.raises(RuntimeError, match="sealed"):
        scores.fresh.add([("x", "y")], [0.5])


def _scored_noise(count: int, pairs: int, seed: int) -> tuple[dict[str, bytes], list[str], Any, CopyScores]:
    """Noise images by sha256, the sha256s sorted, random position pairs (both orders, repeats, a few (i, i)) and
    their scores computed image by image in this process: the reference a way of scoring is checked against."""
    import numpy as np

    from tests.factories.curation import noise_pngs

    rng = np.random.default_rng(seed)
    images = {f"{rng.integers(1 << 62):016x}": data for data in noise_pngs(count, 12, seed=seed)}
    shas = sorted(images)
    positions = rng.integers(0, len(shas), (pairs, 2))
    reference = CopyScores(images.__getitem__, workers=1)
    reference.score_positions(positions, shas)
    return images, shas, positions, reference


def test_nothing_scored_gives_no_rows_and_no_partners() -> None:
    fresh = FreshPairs()
    assert fresh.count == 0 and fresh.partners("a") == {} and fresh.rows("r").num_rows == 0


def test_pairs_given_as_positions_score_as_pairs_of_shas() -> None:
    import numpy as np

    from tests.factories.curation import noise_pngs

    rng = np.random.default_rng(1)
    images = {f"{rng.integers(1 << 62):016x}": data for data in noise_pngs(24, 12, seed=1)}
    shas = sorted(images)
    positions = rng.integers(0, len(shas), (80, 2))  # both orders, repeats and a few (i, i)
    by_shas, by_positions = CopyScores(images.__getitem__, workers=1), CopyScores(images.__getitem__, workers=1)
    by_shas.score_many((shas[i], shas[j]) for i, j in positions.tolist())
    by_positions.score_positions(positions, shas)
    assert by_positions.fresh_rows("r").equals(by_shas.fresh_rows("r"))
    assert list(by_positions.fresh.items()) == list(by_shas.fresh.items())
    by_positions.score_positions(positions, shas)  # all known now: nothing scored twice
    assert by_positions.fresh.count == by_shas.fresh.count


def test_scoring_in_blocks_computes_each_signature_once_and_holds_only_those_still_ahead(monkeypatch) -> None:
    import tasks.curation.copy_pairs as copy_pairs

    images, shas, positions, whole = _scored_noise(40, 300, seed=2)

    calls: list[str] = []
    held: list[int] = []
    monkeypatch.setattr(copy_pairs, "SCORE_BLOCK", 9)  # about 30 blocks

    def image_of(sha: str) -> bytes:
        calls.append(sha)
        held.append(len(blocked._sigs))
        return images[sha]

    blocked = CopyScores(image_of, workers=1)
    blocked.score_positions(positions, shas)
    assert list(blocked.fresh.items()) == list(whole.fresh.items())  # same pairs, same scores
    assert sorted(calls) == sorted(set(calls))  # no signature computed twice: none dropped while still needed
    assert max(held) < len(set(calls)) - 5  # and fewer held at once than were computed


def test_signatures_are_held_packed_and_given_back_equal() -> None:
    """What scoring holds (packed) unpacks to the signature itself, for every kind of image, and scores the same."""
    import io

    import numpy as np
    from PIL import Image

    from tasks.curation.copy_score import HEADER, copy_score, copy_signature, packed, unpacked

    rng = np.random.default_rng(3)

    def encoded(mode: str, size: tuple[int, int], fmt: str) -> bytes:
        out = io.BytesIO()
        pixels = rng.integers(0, 256, (size[1], size[0], len(mode)), dtype=np.uint8)
        Image.fromarray(pixels.squeeze(-1) if mode == "L" else pixels, mode).save(out, fmt)
        return out.getvalue()

    images = [encoded("L", (32, 32), "PNG"), encoded("RGB", (640, 480), "JPEG"), encoded("RGBA", (7, 300), "PNG"),
              encoded("L", (3000, 2), "PNG")]
    sigs = [copy_signature(data) for data in images]
    assert len(packed(sigs[0])) < sigs[0].nbytes / 3  # 16 x 16 pixels: 277 bytes, not 1,044
    for sig in sigs:
        held = packed(sig)
        assert held[0] == 1 and len(held) == 1 + 4 * HEADER + len(sig) - HEADER  # whole grey levels: a byte a pixel
        back = unpacked(held)
        assert back.dtype == np.float32 and np.array_equal(back, sig)
    assert copy_score(unpacked(packed(sigs[0])), unpacked(packed(sigs[1]))) == copy_score(sigs[0], sigs[1])
    odd = sigs[0].copy()
    odd[10] = 0.5  # not a whole grey level: kept as float32, still equal
    assert packed(odd)[0] == 0 and np.array_equal(unpacked(packed(odd)), odd)


def test_signatures_from_one_scan_score_as_those_computed_image_by_image() -> None:
    import pyarrow as pa

    images, shas, positions, lazy = _scored_noise(30, 120, seed=3)
    scans: list[list[str]] = []

    def scan(wanted: list[str]):
        scans.append(list(wanted))
        for start in range(0, len(wanted), 7):  # blocks, as a table scan yields them
            part = wanted[start:start + 7]
            yield pa.table({"sha256": part, "image": pa.array([images[s] for s in part], pa.binary())})

    def never(sha: str) -> bytes:
        raise AssertionError(f"{sha} read one by one")

    scanned = CopyScores(never, workers=1, scan=scan)
    scanned.score_positions(positions, shas)
    assert list(scanned.fresh.items()) == list(lazy.fresh.items())  # same pairs, same scores
    paired = {s for i, j in positions.tolist() if i != j for s in (shas[i], shas[j])}
    assert len(scans) == 1 and sorted(scans[0]) == sorted(paired)  # one scan, of the pairs' images only
    scanned.score_positions(positions, shas)  # all known now: no scan
    assert len(scans) == 1


def test_an_images_partners_are_found_without_copying_the_codes() -> None:
    """A lookup must not convert the int32 codes to int64: at 15 million codes that copy made each lookup 15 ms."""
    import tracemalloc

    import numpy as np

    from tasks.curation.pair_store import StoredPairs

    rng = np.random.default_rng(4)
    shas = [f"{i:064x}" for i in range(1000)]
    a, b = rng.integers(0, 500, 500_000), rng.integers(500, 1000, 500_000)
    stored = StoredPairs(shas, a, b, rng.random(500_000))  # a million codes: 4 MB as int32, 8 MB converted
    stored.partners(shas[0])  # the sha256 -> code map is built on the first lookup
    tracemalloc.start()
    try:
        got = stored.partners(shas[1])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got) > 0 and peak < 1 << 20
