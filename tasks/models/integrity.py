"""Every model version's files, fingerprinted at registration and checked before anything loads them.

* ``record_manifest`` (called by ``register_candidate`` and the deploy-model copy) downloads the
  version's artifacts (weights, meta, the bundled ``cd4ml_runtime`` copy, MLmodel,
  python_model.pkl, requirements, ...), hashes every file (sha256) and stores the manifest on
  the model version as two tags: ``cd4ml.manifest`` (the JSON ``{relative path: sha256}``) and
  ``cd4ml.manifest.sha256`` (the digest of that JSON, a short fingerprint to compare and show).
* ``verified_model`` downloads a version into a temporary folder, compares every file with the
  manifest and yields the folder only when they agree; the caller loads THAT folder, so what
  runs is exactly what was checked (no second download between check and load). A changed,
  missing or extra file is a ``ModelIntegrityError`` naming the files (never their content),
  and one ``model_tampered`` alert per model version (the alert ledger dedups its key).

Why tags in the registry and not a file next to the model: the artifact store (a folder, a
bucket) is exactly what the attack of issue 22 writes to. A manifest kept there could be
rewritten together with the files it describes. Model-version tags live in the registry's own
database (the tracking server's backend store), which the artifact store's credentials cannot
reach; rewriting them takes registry write access, which the scoring and serving identities
do not have. The two tags are written once: a retried registration keeps the first manifest
instead of fingerprinting files that may have changed since.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from tasks.errors import DataError
from tasks.settings import Settings

log = logging.getLogger(__name__)

TAG_MANIFEST = "cd4ml.manifest"
TAG_MANIFEST_SHA256 = "cd4ml.manifest.sha256"
ALERT_KIND = "model_tampered"
CLIENT_WRITTEN = "registered_model_meta"  # mlflow.store.artifact.models_artifact_repo.REGISTERED_MODEL_META_FILE_NAME
_NAMED_AT_MOST = 20  # files named in one message; the rest are counted
_REGISTRY_URI = re.compile(r"models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[^/]+))/?")


class ModelIntegrityError(DataError):
    """A model version's files differ from the manifest recorded at registration (or it has none): not loaded.

    ``problems`` lists ``(kind, file)`` with kind ``changed``, ``missing``, ``extra`` or
    ``manifest`` (no or an inconsistent manifest). Deliberately not a ValueError: callers that
    fall back on a ValueError (drift's "not a cd4ml model") must not fall back on this.
    """

    def __init__(self, name: str, version: int, problems: list[tuple[str, str]]) -> None:
        self.name, self.version, self.problems = name, int(version), list(problems)
        shown = "; ".join(f"{kind} {file!r}" for kind, file in self.problems[:_NAMED_AT_MOST])
        more = len(self.problems) - _NAMED_AT_MOST
        super().__init__(
            f"models:/{name}/{version} does not match the manifest recorded at registration: {shown}"
            + (f" (and {more} more)" if more > 0 else "") + ". Not loaded; see docs/runbooks/model_tampered.md"
        )

    @property
    def files(self) -> list[str]:
        return [file for _, file in self.problems]


class UnverifiableModelError(DataError, ValueError):
    """A URI that names no registered model version: there is no manifest to check its files against."""


@dataclass(frozen=True)
class Verified:
    name: str
    version: int
    files: int
    manifest_sha256: str

    def line(self) -> str:
        return f"models:/{self.name}/{self.version}: {self.files} files match manifest {self.manifest_sha256}"


# --------------------------------------------------------------------------- the manifest itself


def _sha256(path: Path) -> str:
    if path.is_symlink():  # its target, not what it points at (which may lie outside the model)
        return hashlib.sha256(b"symlink\0" + os.fsencode(os.readlink(path))).hexdigest()
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_manifest(folder: Path) -> dict[str, str]:
    """``{path relative to folder (posix): sha256}`` of every file below ``folder``; links count as files.

    Except ``registered_model_meta`` at the top: MLflow's client writes it into every download of
    ``models:/<name>/<version>`` (overwriting any such file from the store) with the name and
    version asked for, so a copy's differs from its source's and it never comes from the store.
    """
    return {path.relative_to(folder).as_posix(): _sha256(path)
            for path in sorted(folder.rglob("*")) if (path.is_file() or path.is_symlink())
            and path.relative_to(folder).as_posix() != CLIENT_WRITTEN}


def manifest_digest(manifest: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def manifest_tags(manifest: dict[str, str]) -> dict[str, str]:
    return {TAG_MANIFEST: json.dumps(manifest, sort_keys=True, separators=(",", ":")),
            TAG_MANIFEST_SHA256: manifest_digest(manifest)}


def recorded_manifest(version: ModelVersion) -> dict[str, str]:
    """The manifest on the version's tags; ``ModelIntegrityError`` when absent or not matching its digest."""
    tags = dict(version.tags or {})
    text, digest = tags.get(TAG_MANIFEST), tags.get(TAG_MANIFEST_SHA256)
    problem = None
    try:
        manifest = json.loads(text) if text else None
    except ValueError:
        manifest = None
    if manifest is None or not digest:
        problem = f"no {TAG_MANIFEST} / {TAG_MANIFEST_SHA256} tags (registered outside register_candidate?)"
    elif not isinstance(manifest, dict) or manifest_digest(manifest) != digest:
        problem = f"{TAG_MANIFEST} does not match {TAG_MANIFEST_SHA256}"
    if problem:
        raise ModelIntegrityError(version.name, int(version.version), [("manifest", problem)])
    return manifest


def differences(recorded: dict[str, str], actual: dict[str, str]) -> list[tuple[str, str]]:
    """``(kind, file)`` for every file changed, missing or extra, in path order."""
    problems = [("changed" if path in actual else "missing", path)
                for path in sorted(recorded) if actual.get(path) != recorded[path]]
    return sorted(problems + [("extra", path) for path in actual if path not in recorded], key=lambda p: p[1])


# --------------------------------------------------------------------------- the registry


def is_registry_uri(model_uri: str) -> bool:
    return _REGISTRY_URI.fullmatch(model_uri) is not None


def version_of(client: MlflowClient, model_uri: str) -> ModelVersion:
    """The ModelVersion behind ``models:/<name>/<version>`` or ``models:/<name>@<alias>``."""
    match = _REGISTRY_URI.fullmatch(model_uri)
    if match is None:
        raise UnverifiableModelError(
            f"{model_uri} is not a registered model version (models:/<name>/<version> or models:/<name>@<alias>): "
            "only registered versions carry a manifest to check before loading"
        )
    try:
        if match["alias"]:
            return client.get_model_version_by_alias(match["name"], match["alias"])
        return client.get_model_version(match["name"], match["version"])
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise UnverifiableModelError(f"{model_uri}: no such model version in this registry") from exc


def registry_client(settings: Settings) -> MlflowClient:
    """A client of this environment's registry that leaves MLflow's process-wide URIs alone."""
    return MlflowClient(tracking_uri=settings.tracking_uri, registry_uri=settings.tracking_uri)


def download_uri(client: MlflowClient, name: str, version: int | str) -> str:
    """Where a version's files are, as ``client``'s own registry says.

    Never ``models:/<name>/<version>`` handed to MLflow's download: MLflow resolves that through
    its PROCESS-WIDE registry URI whatever registry URI it is given, so a process that last
    pointed MLflow at another environment (or another deployment) would read that one's files.
    """
    uri = client.get_model_version_download_uri(name, str(version))
    if uri.startswith("models:/"):  # a logged model (MLflow 3): its own artifact location, from the same store
        uri = client.get_logged_model(uri.removeprefix("models:/").split("/")[0]).artifact_location
    return uri


def download_version(client: MlflowClient, tracking_uri: str, version: ModelVersion, dst: str) -> Path:
    """The version's files below ``dst``, resolved and downloaded through ``client``'s store and ``tracking_uri``."""
    import mlflow

    uri = download_uri(client, version.name, version.version)
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=dst, tracking_uri=tracking_uri))


@contextlib.contextmanager
def _download(settings: Settings, version: ModelVersion) -> Iterator[Path]:
    """The version's files in a fresh temporary folder (never a cached or shared copy), from this environment's store."""
    with tempfile.TemporaryDirectory(prefix="cd4ml-model-") as tmp:
        yield download_version(registry_client(settings), settings.tracking_uri, version, tmp)


def set_version_tag(client: MlflowClient, name: str, version: str, key: str, value: str) -> None:
    """Set one tag of a model version. Two writers of the same new tag at once (two imports of one source, which
    converge on one version) race in MLflow's store, which reads and then inserts: the later insert is refused.
    A refused write is done when the tag now holds this value (the other writer's, the same); otherwise it is raised.
    """
    try:
        client.set_model_version_tag(name, version, key, value)
    except MlflowException:
        if (client.get_model_version(name, version).tags or {}).get(key) != value:
            raise
        log.info("tag %s of %s v%s was set to the same value by a concurrent writer", key, name, version)


def record_manifest(settings: Settings, client: MlflowClient, version: ModelVersion,
                    expected: dict[str, str] | None = None) -> dict[str, str]:
    """Fingerprint the version's files and store the manifest on it; an existing manifest is kept as it is.

    ``expected`` (a copy: its source's manifest): the files are always hashed, even when MLflow
    copied the source's tags onto the copy; files that differ from it are a
    ``ModelIntegrityError`` (and an alert), and nothing is recorded.
    """
    tags = dict(version.tags or {})
    if expected is None and tags.get(TAG_MANIFEST):
        return recorded_manifest(version)
    with _download(settings, version) as folder:
        manifest = file_manifest(folder)
    problems = differences(expected, manifest) if expected is not None else []
    if problems:
        error = ModelIntegrityError(version.name, int(version.version), problems)
        alert_tampered(settings, error)
        raise error
    for key, value in manifest_tags(manifest).items():
        if tags.get(key) != value:
            set_version_tag(client, version.name, str(version.version), key, value)
    log.info("recorded the manifest of %s v%s: %d files, %s", version.name, version.version, len(manifest),
             manifest_digest(manifest))
    return manifest


def check_folder(settings: Settings, version: ModelVersion, folder: Path) -> Verified:
    """Compare a downloaded copy of ``version`` with its manifest; on a mismatch alert once and raise."""
    try:
        recorded = recorded_manifest(version)
        problems = differences(recorded, file_manifest(folder))
        if problems:
            raise ModelIntegrityError(version.name, int(version.version), problems)
    except ModelIntegrityError as exc:
        alert_tampered(settings, exc)
        raise
    return Verified(version.name, int(version.version), len(recorded), manifest_digest(recorded))


@contextlib.contextmanager
def verified_model(settings: Settings, model_uri: str) -> Iterator[tuple[Path, Verified]]:
    """(local folder, what was verified) of a registered model version whose files match its manifest.

    Load from the folder yielded here, never from the URI again: a second download could fetch
    files changed after this check.
    """
    version = version_of(registry_client(settings), model_uri)
    with _download(settings, version) as folder:
        yield folder, check_folder(settings, version, folder)


def verify(settings: Settings, model_uri: str) -> Verified:
    """Download and check one model version (``cd4ml verify``); ``ModelIntegrityError`` on any difference."""
    with verified_model(settings, model_uri) as (_, verified):
        return verified


def alert_tampered(settings: Settings, error: ModelIntegrityError) -> None:
    """One ``model_tampered`` alert per model version, whoever notices first (the ledger dedups the key)."""
    from tasks.alerting.alert import Alert
    from tasks.alerting.delivery import send

    log.error("%s", error)
    send(Alert(summary=f"{error.name} v{error.version}: files differ from the manifest recorded at registration; "
                       "refused to load", severity="critical", source="model-integrity", env=settings.env,
               dedup_key=f"{settings.env}:{ALERT_KIND}:{error.name}:v{error.version}", kind="model_tampered",
               details={"problems": [list(p) for p in error.problems[:_NAMED_AT_MOST]]},
               error=str(error).splitlines()[0][:300],
               versions={"model_name": error.name, "version": error.version}), settings)


__all__ = ["ModelIntegrityError", "TAG_MANIFEST", "TAG_MANIFEST_SHA256", "UnverifiableModelError", "Verified",
           "check_folder", "differences", "download_uri", "download_version", "file_manifest", "is_registry_uri",
           "manifest_digest", "record_manifest", "recorded_manifest", "registry_client", "verified_model", "verify",
           "version_of"]
