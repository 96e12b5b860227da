"""The nearest summary's rewrite, block by block: every row back, in sha256 order, whatever the block size."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.curation import nearest
from tasks.curation.nearest import NearestMap, store_nearest
from tasks.curation.pixel_keys import PixelKeys
from tasks.curation.tables import RawFacts, RawRows
from tasks.data import lake


@pytest.mark.parametrize("write_rows", [3, 7, 65_536])  # several blocks, a partial last block, one block
def test_a_full_rewrite_stores_every_row_in_sha_order_block_by_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_rows: int) -> None:
    monkeypatch.setattr(nearest, "WRITE_ROWS", write_rows)
    shas = [f"{i:064x}" for i in reversed(range(21))]  # given out of order; the last is not eligible
    rows = RawRows.of(RawFacts(s, f"c{int(s, 16) % 3}", 32, 32) for s in shas)
    m = NearestMap.over(rows, PixelKeys.of(rows.at, [f"p{i}" for i in range(21)]), shas[1:], 5)
    for i in range(20):
        if i % 4:
            m.score[i], m.partner[i] = i / 10, i + 1
    uri = str(tmp_path / "curation_nearest")
    store_nearest(uri, m, 5, {"run_id": "r1"})
    version = lake.current_version(uri)
    got = lake.read(uri, version).to_pylist()
    assert [r["sha256"] for r in got] == sorted(shas[1:])
    assert [(r["label"], r["pixel_key"], r["nearest"], r["partner"]) for r in got] == [
        (f"c{i % 3}", f"p{i}", None if i % 4 == 0 else i / 10, None if i % 4 == 0 else f"{i + 1:064x}") for i in range(20)]
    assert lake.commit_at(uri, version).metadata["pairs_version"] == "5"  # one commit, stamped
    assert version == 0
