"""The deterministic training sample of an environment that trains on part of the data (sit).

``training_data.sample_fraction < 1``: an image is in the sample when ``sha256(salt + ":" + key)``,
read as a number in [0, 1), is below the fraction. It depends only on the image key, so the
same curated version always gives the same sample, on any machine, and a newer curated version
keeps every image it shares with an older sample. Splits are the curated ones, untouched.

The sample is written once per curated version as a version of the ``training_sample`` Delta
table (its commit names the curated table and version, the raw version, fraction and salt) and
gets a dataset-version name, ``sample-<pct>pct-<salt hash>-of-curated-v<N>``: training,
lineage and retention see an ordinary, named dataset version.
"""

from __future__ import annotations

import hashlib
import logging

import pyarrow as pa

from tasks.data import lake
from tasks.settings import Settings

log = logging.getLogger(__name__)


def in_sample(key: str, fraction: float, salt: str) -> bool:
    digest = hashlib.sha256(f"{salt}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def sample_name(settings: Settings, curated_version: int) -> str:
    cfg = settings.training_data
    salt = hashlib.sha256(cfg.sample_salt.encode()).hexdigest()[:8]
    return f"sample-{round(cfg.sample_fraction * 100, 2):g}pct-{salt}-of-curated-v{int(curated_version)}"


def training_data(settings: Settings, curated_table: str, curated_version: int, run_id: str) -> dict:
    """The (table, version, sample name) this environment trains on for one curated version."""
    cfg = settings.training_data
    if cfg.sample_fraction >= 1.0:
        return {"table": curated_table, "version": int(curated_version), "sample": None}
    uri = settings.sample_table
    name = sample_name(settings, curated_version)
    for tag in lake.tags(uri) if lake.exists(uri) else []:
        if tag.name == name:
            return {"table": uri, "version": tag.version, "sample": name}

    rows = lake.read(curated_table, int(curated_version))
    keep = pa.array([in_sample(k, cfg.sample_fraction, cfg.sample_salt) for k in rows["sha256"].to_pylist()])
    sample = rows.filter(keep)
    source = lake.commit_at(curated_table, curated_version)
    metadata = {
        "step": "sample",
        "curated_table": curated_table,
        "curated_version": int(curated_version),
        "raw_version": source.metadata.get("raw_version", "") if source is not None else "",
        "fraction": cfg.sample_fraction,
        "salt": cfg.sample_salt,
        "run_id": run_id,
        "name": name,
    }
    version = lake.overwrite(uri, sample, metadata, configuration=lake.stats_columns_config(sample.schema))
    try:
        tag = lake.tag_version(uri, version, name, run_id=run_id, note=f"{sample.num_rows} of {rows.num_rows} rows")
    except lake.TagConflictError:  # a concurrent run wrote the same sample first: use the named one
        tag = next(t for t in lake.tags(uri) if t.name == name)
    log.info("%s: %d of %d images of %s@v%s -> %s@v%s", name, sample.num_rows, rows.num_rows, curated_table,
             curated_version, uri, tag.version)
    return {"table": uri, "version": tag.version, "sample": name}

