"""The features' facts of a raw version kept beside its stored rows (``tasks.curation.raw_store``), memory-mapped: a
batch copies the facts of a stored version by sha256 and reads from the features' table only the images it lacks.

Every curation reads the facts of every image of its raw version (``feature_facts.FeatureFacts``: the screen's
statistics, the pixel digests, the mode families). Read from ``curation_embeddings`` each time, a batch at a million
images scanned every stored row (+152 MB above what it was given) and held 58 bytes an image of columns. Here a raw
version's facts under one feature config are files in its stored folder (``facts-<config>``: each statistic, the packed
digests, whether each has one and the family codes a ``.npy`` file; the few errors, odd digests and the family names in
``meta.json``), written through their mappings as they are gathered: the columns are the files' pages, not the
process's memory. A later version starts from a stored one's facts (an image's facts under a config never change: the
table is a content-addressed cache that only appends) and reads the rest by sha256. A stored version's facts are used
only while the features' table is the one they were read from with files appended since (``lake.appended_files``);
else every image is read again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.curation.curation_features import fill_keyed_facts, fill_stored_facts
from tasks.curation.feature_facts import NUMBERS, FeatureFacts
from tasks.curation.pixel_keys import DIGEST_BYTES, Digests
from tasks.curation.raw_store import mapped_keys, other_versions
from tasks.curation.sha_list import ShaList
from tasks.curation.stored_folder import complete, prune_stale, publish, work_folder
from tasks.curation.tables import RawRows
from tasks.data import lake

FACTS_PREFIX = "facts-"
COPY_ROWS = 1 << 16  # a stored version's facts copied this many at a time


@dataclass
class StoredFacts:
    """A raw version's facts: mapped as stored (``work`` None), or being gathered in ``work`` and kept once every image
    has them (``publish``)."""

    facts: FeatureFacts
    stored: np.ndarray  # bool by position: the image's facts are there (copied, or read from the table)
    own: Path
    work: Path | None

    def publish(self, embeddings_uri: str) -> None:
        """Keep the gathered facts (every image's) as this version's, naming the features' table they came from."""
        if self.work is None:
            return
        table = lake.open_table(embeddings_uri)
        for values in (*self.facts.numbers.values(), self.facts.digests.packed, self.facts.digests.present,
                       self.facts.family):
            values.flush()
        meta = {"errors": {str(k): v for k, v in self.facts.errors.items()},
                "odd": {str(k): v for k, v in self.facts.digests.odd.items()}, "families": self.facts.families,
                "embeddings_id": table.metadata().id, "embeddings_version": table.version()}
        (self.work / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        if publish(self.work, self.own):  # else another curation's, renamed first, stands (``discard`` removes this)
            self.work = None

    def discard(self) -> None:
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)
            self.work = None


def open_facts(rows: RawRows, folder: Path, embeddings_uri: str, config: str) -> StoredFacts:
    """The facts of ``rows`` (a raw version stored in ``folder``) under ``config``: as stored, else gathered (from a
    stored version's facts by sha256, the rest from ``embeddings_uri``) into files to keep once complete.

    Phases: the stored facts if complete, else blank files, a stored version's facts copied, the rest read."""
    own = folder / (FACTS_PREFIX + hashlib.sha256(config.encode("utf-8")).hexdigest()[:16])
    if complete(own):
        return StoredFacts(_mapped(own, rows), np.ones(len(rows), dtype=bool), own, None)
    prune_stale(folder)
    work = work_folder(folder)
    facts = _blank(work, rows)
    base = _base(folder, own.name, embeddings_uri)
    if base is None:  # every image: every block of the table
        return StoredFacts(facts, fill_stored_facts(embeddings_uri, config, rows.shas.keys, facts), own, work)
    stored = np.zeros(len(rows), dtype=bool)
    _copy(base, rows, facts, stored)
    rest = np.flatnonzero(~stored)  # the images no stored version has: a batch's few, by key
    if len(rest):
        stored[rest] = fill_keyed_facts(embeddings_uri, config, rows.shas.take(rest).keys, facts, into=rest)
    return StoredFacts(facts, stored, own, work)


_COLUMNS = {**{c: np.dtype(np.float64) for c in NUMBERS}, "packed": np.dtype(np.uint8), "present": np.dtype(bool),
            "family": np.dtype(np.int8)}


def _blank(work: Path, rows: RawRows) -> FeatureFacts:
    """Facts without values yet (``FeatureFacts.blank``), each column a file written through its mapping."""
    n = len(rows)
    columns = {name: np.lib.format.open_memmap(work / f"{name}.npy", mode="w+", dtype=kind,
                                               shape=(n, DIGEST_BYTES) if name == "packed" else (n,))
               for name, kind in _COLUMNS.items()}
    for name in NUMBERS:
        columns[name][:] = np.nan
    columns["family"][:] = -1
    return FeatureFacts(rows.shas, Digests(columns["packed"], columns["present"], {}), {}, columns["family"], [],
                        {c: columns[c] for c in NUMBERS}, rows.at)


def _mapped(folder: Path, rows: RawRows | None) -> FeatureFacts:
    """Stored facts, each column its file's read-only mapping (``rows``: the version's own, whose map they share)."""
    columns = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in _COLUMNS}
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    odd = {int(k): v for k, v in meta["odd"].items()}
    return FeatureFacts(rows.shas if rows is not None else [], Digests(columns["packed"], columns["present"], odd),
                        {int(k): v for k, v in meta["errors"].items()}, columns["family"], list(meta["families"]),
                        {c: columns[c] for c in NUMBERS}, rows.at if rows is not None else {})


def _base(folder: Path, name: str, embeddings_uri: str) -> Path | None:
    """The facts under this config (``name``) of the newest other stored version that read them from the features'
    table as it is now but for files appended since."""
    current = lake.current_version(embeddings_uri)
    if current is None:
        return None
    table_id = lake.open_table(embeddings_uri, current).metadata().id
    for version in other_versions(folder):
        facts = version / name
        if not complete(facts):
            continue
        meta = json.loads((facts / "meta.json").read_text(encoding="utf-8"))
        if meta["embeddings_id"] == table_id and \
                lake.appended_files(embeddings_uri, meta["embeddings_version"], current) is not None:
            return facts
    return None


def _copy(base: Path, rows: RawRows, facts: FeatureFacts, stored: np.ndarray) -> None:
    """The stored facts in ``base`` (another version's) of the images that are ``rows``' too, copied into their
    places, ``COPY_ROWS`` at a time."""
    keys, old = mapped_keys(base.parent), _mapped(base, None)
    for start in range(0, len(keys), COPY_ROWS):
        at = ShaList(np.asarray(keys[start:start + COPY_ROWS])).located(rows.shas.keys)
        hit = np.flatnonzero(at >= 0)
        source, dest = start + hit, at[hit]
        for c in NUMBERS:
            facts.numbers[c][dest] = old.numbers[c][source]
        facts.digests.packed[dest] = old.digests.packed[source]
        facts.digests.present[dest] = old.digests.present[source]
        facts.family[dest] = old.family[source]
        stored[dest] = True
    facts.families.extend(old.families)  # the codes copied are into these names
    for position, value in old.errors.items():
        if (here := rows.shas.index_of(keys[position].decode("ascii"))) is not None:
            facts.errors[here] = value
    for position, value in old.digests.odd.items():
        if (here := rows.shas.index_of(keys[position].decode("ascii"))) is not None:
            facts.digests.odd[here] = value

