"""Which images a model version trained or validated on, carried inside the model's own files.

* Training logs ``seen_images.npy`` as one of the pyfunc's artifacts: the sorted, unique raw
  sha256 digests of every train and val image, a uint8 array of shape (N, 32) saved without
  pickle (32 bytes an image plus a 128-byte header: 60,000 images are 1.9 MB; the same images
  always give the same bytes). A fine-tuned model's array also holds its source's seen images.
* Being a file of the model, it is covered by the integrity manifest recorded at registration
  and carried and checked by a cross-registry import like every other file: the gate of a
  downstream deployment learns what a candidate saw without reading the upstream's lake.
* ``seen_by(version, folder)`` reads it from a verified copy. A version logged before this file
  existed falls back to the train and val splits of the table its lineage names, when that table
  is reachable from here; otherwise ``SeenImagesUnavailableError``: the gate cannot remove what
  the model saw from the test set, so it does not decide (it never skips the removal silently).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import mlflow
import numpy as np
from deltalake.exceptions import DeltaError
from mlflow.entities.model_registry import ModelVersion

from tasks.data import lake
from tasks.models.integrity import is_registry_uri, registry_client, verified_model, version_of
from tasks.models.registry import TAG_CURATED_TABLE, TAG_CURATED_VERSION, LineageError, trained_on
from tasks.settings import Settings

SEEN_ARTIFACT = "seen_images"  # the key in the pyfunc's artifacts
FILE_NAME = "seen_images.npy"
DIGEST_BYTES = 32


class SeenImagesUnavailableError(LineageError):
    """A model version carries no seen-images file and the table its lineage names cannot be read here."""


def to_array(hex_digests: Iterable[str]) -> np.ndarray:
    """Hex sha256 digests as a sorted, duplicate-free uint8 array of shape (N, 32)."""
    raw = sorted({bytes.fromhex(digest) for digest in hex_digests})
    if any(len(digest) != DIGEST_BYTES for digest in raw):
        raise ValueError("a seen image's sha256 is not 32 bytes")
    flat = np.frombuffer(b"".join(raw), dtype=np.uint8)
    return flat.reshape(len(raw), DIGEST_BYTES)


def write(path: Path, hex_digests: Iterable[str]) -> Path:
    np.save(path, to_array(hex_digests), allow_pickle=False)
    return path


def read(path: Path) -> set[str]:
    """The hex digests in a seen-images file; ``ValueError`` when it is not a (N, 32) uint8 array."""
    array = np.load(path, allow_pickle=False)
    if array.dtype != np.uint8 or array.ndim != 2 or array.shape[1] != DIGEST_BYTES:
        raise ValueError(f"{FILE_NAME} is not a uint8 array of shape (N, {DIGEST_BYTES})")
    return {row.tobytes().hex() for row in array}


def file_in(folder: Path) -> Path | None:
    """The seen-images file of a downloaded model (``artifacts/seen_images.npy``), if it has one."""
    found = sorted(folder.rglob(FILE_NAME))
    return found[0] if found else None


def from_table(table: str, version: int, who: str) -> set[str]:
    """Train and val digests of a curated table version; ``SeenImagesUnavailableError`` when it cannot be read."""
    try:
        rows = lake.read(table, int(version), columns=["sha256"], filter=[("split", "in", ["train", "val"])])
    except (lake.VersionNotFoundError, DeltaError, OSError) as exc:
        raise SeenImagesUnavailableError(
            f"{who} carries no {FILE_NAME} (logged before models recorded what they saw) and its training table "
            f"{lake.table_name(table)}@v{int(version)} cannot be read from this deployment ({type(exc).__name__}): "
            "the test set cannot be cleared of the images it saw, so it cannot be gated"
        ) from exc
    return set(rows["sha256"].to_pylist())


def seen_by(version: ModelVersion, folder: Path) -> set[str]:
    """What a registered version trained or validated on, from its verified copy in ``folder`` (module doc)."""
    path = file_in(folder)
    if path is not None:
        return read(path)
    table, number = trained_on(version)
    return from_table(table, number, f"{version.name} version {version.version}")


def _run_lineage(client: mlflow.MlflowClient, model_uri: str) -> tuple[str, int]:
    """(curated table, version) from the tags of the run a ``runs:/<id>/...`` URI names."""
    run_id = model_uri[len("runs:/"):].split("/", 1)[0] if model_uri.startswith("runs:/") else ""
    tags = client.get_run(run_id).data.tags if run_id else {}
    table, number = tags.get(TAG_CURATED_TABLE), tags.get(TAG_CURATED_VERSION)
    if not table or number in (None, "", "None"):
        raise SeenImagesUnavailableError(f"{model_uri} carries no {FILE_NAME} and no lineage tags: "
                                         "nobody can tell which images it saw")
    return table, int(number)


@contextlib.contextmanager
def _unverified(settings: Settings, model_uri: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="cd4ml-model-") as tmp:
        yield Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp,
                                                       tracking_uri=settings.tracking_uri))


def seen_by_model(settings: Settings, model_uri: str) -> set[str]:
    """What the model at ``model_uri`` saw (a fine-tuning source): a registered version is verified first."""
    if is_registry_uri(model_uri):
        version = version_of(registry_client(settings), model_uri)
        with verified_model(settings, model_uri) as (folder, _):
            return seen_by(version, folder)
    with _unverified(settings, model_uri) as folder:  # a run's model has no manifest (as for its weights)
        path = file_in(folder)
        if path is not None:
            return read(path)
    table, number = _run_lineage(registry_client(settings), model_uri)
    return from_table(table, number, model_uri)


__all__ = ["DIGEST_BYTES", "FILE_NAME", "SEEN_ARTIFACT", "SeenImagesUnavailableError", "file_in", "from_table", "read",
           "seen_by", "seen_by_model", "to_array", "write"]
