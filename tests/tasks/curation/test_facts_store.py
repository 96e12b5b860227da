"""The features' facts kept beside a stored raw version (tasks.curation.facts_store): gathered from another version's
by sha256 and the rest from the table, they are the facts read whole."""

import hashlib

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from tasks.curation import facts_store
from tasks.curation.curation_features import fill_stored_facts
from tasks.curation.facts_store import open_facts
from tasks.curation.feature_facts import FeatureFacts
from tasks.curation.raw_store import stored_raw

CONFIG = "pixels;test"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _raw(names: list[str]) -> pa.Table:
    return pa.table({"sha256": [_sha(n) for n in names], "label": ["a"] * len(names),
                     "width": pa.array([8] * len(names), pa.int32()), "height": pa.array([8] * len(names), pa.int32())})


def _features(names: list[str], config: str = CONFIG) -> pa.Table:
    def fact(i: int, name: str) -> dict:
        error = "undecodable: test" if name.endswith("7") else None
        digest = None if error else ("odd-" + name if name.endswith("3") else _sha("px" + name))
        return {"sha256": _sha(name), "config": config, "pixel_digest": digest, "blur": None if error else float(i),
                "mean": None if error else 100.0 + i, "contrast": None if error else 5.0 + i % 4,
                "error": error, "family": None if error else ("grey", "colour")[i % 2]}
    return pa.Table.from_pylist([fact(i, n) for i, n in enumerate(names)])


def _whole_scan_fails(*_args, **_kwargs):
    raise AssertionError("every block of the features table read for a batch's images")


def _whole(rows, uri: str) -> FeatureFacts:
    facts = FeatureFacts.blank(rows.shas, rows.at)
    assert fill_stored_facts(uri, CONFIG, rows.shas.keys, facts).all()
    return facts


def _same(got: FeatureFacts, whole: FeatureFacts) -> None:
    assert dict(got) == dict(whole)  # each image's ImageFeatures: numbers, digest, error, family by name
    assert np.array_equal(got.digests.packed, whole.digests.packed) and got.digests.odd == whole.digests.odd


def test_facts_gathered_from_a_stored_version_are_the_facts_read_whole(tmp_path, monkeypatch):
    raw, emb, root = str(tmp_path / "raw"), str(tmp_path / "emb"), tmp_path / "index"
    first = [f"img{i}" for i in range(30)]
    write_deltalake(raw, _raw(first))
    write_deltalake(emb, _features(first))
    write_deltalake(emb, _features(first[:5], config="other"), mode="append")  # another config: not read
    rows, folder = stored_raw(raw, 0, root)
    kept = open_facts(rows, folder, emb, CONFIG)
    assert kept.stored.all()
    kept.publish(emb)
    _same(kept.facts, _whole(rows, emb))

    added = [f"new{i}" for i in range(12)]
    write_deltalake(raw, _raw(added), mode="append")
    write_deltalake(emb, _features(added[:3], config="other"), mode="append")  # under another config first
    write_deltalake(emb, _features(added), mode="append")
    later = _features(added[:2]).set_column(3, "blur", pa.array([99.0, 98.0]))
    write_deltalake(emb, later, mode="append")  # stored twice: the first row stands, as in a whole read
    rows, folder = stored_raw(raw, 1, root)
    asked = []
    real = facts_store.fill_keyed_facts
    monkeypatch.setattr(facts_store, "fill_keyed_facts", lambda *a, **k: asked.append(len(a[2])) or real(*a, **k))
    monkeypatch.setattr(facts_store, "fill_stored_facts", _whole_scan_fails)
    kept = open_facts(rows, folder, emb, CONFIG)
    assert asked == [12] and kept.stored.all()  # only the added images were read from the table, by key
    kept.publish(emb)
    _same(kept.facts, _whole(rows, emb))
    again = open_facts(rows, folder, emb, CONFIG)  # stored: mapped as they are
    assert again.work is None and asked == [12]
    _same(again.facts, _whole(rows, emb))


def test_facts_are_read_again_when_the_features_table_was_rewritten(tmp_path):
    raw, emb, root = str(tmp_path / "raw"), str(tmp_path / "emb"), tmp_path / "index"
    names = [f"img{i}" for i in range(20)]
    write_deltalake(raw, _raw(names))
    write_deltalake(emb, _features(names))
    rows, folder = stored_raw(raw, 0, root)
    open_facts(rows, folder, emb, CONFIG).publish(emb)
    write_deltalake(raw, _raw(["late"]), mode="append")
    changed = _features([*names, "late"]).set_column(3, "blur", pa.array([50.0] * 21))
    write_deltalake(emb, changed, mode="overwrite")  # the stored facts no longer say what the table holds
    rows, folder = stored_raw(raw, 1, root)
    kept = open_facts(rows, folder, emb, CONFIG)
    assert kept.stored.all()
    _same(kept.facts, _whole(rows, emb))
    kept.discard()
    assert not list(folder.glob(".tmp-*"))
