"""A lake on an object store (S3, here moto's S3-compatible server): a version that only appended files is read as its
added files, as on local disk, so what curation keeps between batches (tasks.curation.raw_store) is merged there too
instead of read whole every batch."""

from __future__ import annotations

import hashlib
import uuid

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tasks.curation import raw_store
from tasks.curation.raw_store import stored_raw
from tasks.curation.tables import read_raw
from tasks.data import lake
from tests.factories.moto_server import FAKE_KEY_ID, FAKE_SECRET


@pytest.fixture
def bucket(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket, and the environment the lake's S3 client reads (as a deployment's is)."""
    import boto3

    name = f"lake-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id=FAKE_KEY_ID,
                 aws_secret_access_key=FAKE_SECRET).create_bucket(Bucket=name)
    for key, value in {"AWS_ACCESS_KEY_ID": FAKE_KEY_ID, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
                       "AWS_ENDPOINT_URL": moto_endpoint, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                       "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}.items():
        monkeypatch.setenv(key, value)
    return f"s3://{name}"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _rows(names: list[str], label: str = "a") -> pa.Table:
    return pa.table({"sha256": pa.array([_sha(n) for n in names], pa.string()),
                     "label": pa.array([label] * len(names), pa.string()),
                     "width": pa.array([8] * len(names), pa.int32()), "height": pa.array([8] * len(names), pa.int32())})


def test_the_files_a_version_appended_on_s3_are_read_alone(bucket):
    uri = f"{bucket}/raw"
    write_deltalake(uri, _rows([str(i) for i in range(10)]))
    write_deltalake(uri, _rows(["x", "y"], "b"), mode="append")
    write_deltalake(uri, _rows(["z"], "c"), mode="append")
    added = lake.appended_files(uri, 0, 2)
    assert added is not None and len(added) == 2 and all(a.startswith(f"{bucket}/raw/") for a in added)
    blocks = lake.added_blocks(uri, 0, 2, ["sha256", "label"], 1 << 16)
    assert sorted(r["label"] for b in blocks for r in b.to_pylist()) == ["b", "b", "c"]
    write_deltalake(uri, _rows(["w"]), mode="overwrite")
    assert lake.appended_files(uri, 2, 3) is None  # files removed: only a whole read tells


def test_stored_raw_rows_of_an_s3_lake_are_merged_not_read_whole(bucket, tmp_path, monkeypatch):
    uri, root = f"{bucket}/raw", tmp_path / "index"
    write_deltalake(uri, _rows([str(i) for i in range(30)]))
    first = stored_raw(uri, 0, root).rows
    assert len(first) == 30
    write_deltalake(uri, _rows([f"new{i}" for i in range(7)], "b"), mode="append")

    def whole_read_fails(*_args):
        raise AssertionError("read whole: the stored version was not merged")

    monkeypatch.setattr(raw_store, "read_raw", whole_read_fails)
    merged = stored_raw(uri, 1, root).rows
    whole = read_raw(uri, 1)
    assert list(merged.shas) == list(whole.shas) and merged.names == whole.names
    assert merged.codes.tolist() == whole.codes.tolist()
