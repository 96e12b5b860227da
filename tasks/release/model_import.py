"""deploy_model: the upstream environment's champion, imported from its registry into this environment's.

One code path whether the upstream lives in another deployment (``release.upstream_registry.tracking_uri``:
its own MLflow server, read as a read-only account) or in the registry this one shares (unset: the
upstream environment's tracking store as the settings name it). Checked, in this order, before
anything is written here:

1. the endpoint: the scheme is allow-listed and the URI carries no credentials (they come from the
   Connection ``conn_id`` names, never from settings); every request is bounded (``timeout_s``,
   ``attempts``); a refused account (HTTP 401/403) and an unreachable registry are typed errors;
2. the source: the upstream's champion (or the version asked for) under the upstream's model name
   from the settings; it must carry lineage tags (which data it saw), the upstream's own gate pass
   (``cd4ml.gate.decision: pass``: a version the upstream never gated is never imported, whoever
   names it) and an integrity manifest (else ``UnverifiableSourceError`` and one
   ``source_unverifiable`` alert per upstream version), and must not have been rolled back;
3. every downloaded file against that manifest: a changed, missing or extra file is a
   ``ModelIntegrityError`` naming it, with one ``model_tampered`` alert.

Then the checked folder (never a second download) is logged to a run of this environment's
experiment and registered under this environment's model name. Its own manifest is written by
``record_manifest``, registration's code path, and must equal the source's. The version keeps the
source's lineage tags and gains provenance tags (``cd4ml.import.*``: registry without credentials,
environment, model, version, run, gate, last ledger row, manifest digest); importing the same source
again finds that version by them, so one upstream version is one version here. Two imports of the
same source at once (two workers, an event and the reconcile) converge without a lock: after
registering, each looks for the same provenance tags again and the higher number is deleted, so
both return the lowest version.

While the upstream is read, MLflow's process-wide credentials are the upstream account's (or none):
this environment's writing account is never sent upstream, and nothing is written meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import requests
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from tasks.models import integrity
from tasks.models.champion import NoChampionError
from tasks.models.identity import PASSWORD_VARIABLE, TOKEN_VARIABLE, USERNAME_VARIABLE
from tasks.models.registry import (
    EXTRA_LINEAGE_TAGS,
    LINEAGE_RUN_TAGS,
    TAG_COPIED_FROM,
    TAG_ENV,
    TAG_IMPORT_ENV,
    TAG_IMPORT_GATE,
    TAG_IMPORT_MANIFEST,
    TAG_IMPORT_MODEL,
    TAG_IMPORT_REGISTRY,
    TAG_IMPORT_RELEASE,
    TAG_IMPORT_RUN,
    TAG_IMPORT_VERSION,
    TAG_ROLLED_BACK,
    TAG_SOURCE,
    LineageError,
    alias_version,
    ensure_experiment,
    get_model_version,
    mlflow_client,
    set_version_tags,
    trained_on,
)
from tasks.release.evaluate import PASS
from tasks.release.release import TAG_GATE_DECISION, TAG_LAST_RELEASE, ReleaseError, RolledBackError
from tasks.settings import Settings, check_registry_uri, load_settings

log = logging.getLogger(__name__)

_BOUNDS = ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")
_SAME_SOURCE = (TAG_IMPORT_REGISTRY, TAG_IMPORT_MODEL, TAG_IMPORT_VERSION)
UNVERIFIABLE_KIND = "source_unverifiable"
_MAX_TAG_CHARS = 5000  # a provenance value copied from upstream, at most (the upstream is not trusted to bound it)


class ModelImportError(ReleaseError):
    """The upstream version cannot be imported as asked; nothing was imported."""


class UpstreamRegistryError(ModelImportError):
    """The upstream registry endpoint in the settings is not allowed (scheme, credentials in the URI)."""


class UpstreamUnreachableError(ModelImportError):
    """The upstream registry did not answer within the bounded tries."""


class UpstreamCredentialsError(ModelImportError):
    """The upstream registry refused the account (HTTP 401/403), or the Connection holds no usable account."""


class UpstreamNoChampionError(ModelImportError, NoChampionError):
    """The upstream environment has no champion: nothing to import."""


class UnverifiableSourceError(ModelImportError):
    """The upstream version has no integrity manifest or no lineage tags: nobody can check what it is."""


@dataclass(frozen=True)
class Upstream:
    """Where the source is read: the upstream environment's names and its registry endpoint."""

    env: str
    model_name: str
    champion_alias: str
    tracking_uri: str
    shared: bool  # the registry this environment uses too: read with the process's own account
    conn_id: str
    timeout_s: int
    attempts: int
    credentials: tuple[str, str] | None = field(default=None, repr=False)

    @property
    def public_uri(self) -> str:
        return public_uri(self.tracking_uri)


@dataclass(frozen=True)
class ImportResult:
    version: int
    source: str  # models:/<upstream name>/<version>
    source_registry: str
    source_env: str
    source_version: int
    reused: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def public_uri(uri: str) -> str:
    """``uri`` without user, password, query or fragment: what may be written in a tag or a log."""
    parts = urlsplit(uri)
    if not parts.netloc:  # sqlite:////abs/path: urlunsplit would drop the empty authority
        return f"{parts.scheme}://{parts.path}"
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


# --------------------------------------------------------------------------- the endpoint


def connection_credentials(conn_id: str, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(login, password) of the Connection as Airflow reads it from ``AIRFLOW_CONN_<CONN_ID>`` (URI or JSON form).

    None where the variable is not set (a registry without accounts). Inside Airflow the step
    resolves the Connection through Airflow (secrets backends included) and passes it instead.
    """
    value = (os.environ if environ is None else environ).get(f"AIRFLOW_CONN_{conn_id.upper()}", "").strip()
    if not value:
        return None
    try:
        if value.startswith("{"):
            data = json.loads(value)
            login, password = data.get("login"), data.get("password")
        else:
            parts = urlsplit(value)
            login, password = unquote(parts.username or ""), unquote(parts.password or "")
    except (ValueError, AttributeError):  # never echo the value: it holds a password
        raise UpstreamCredentialsError(f"Connection {conn_id!r} is neither Airflow's URI nor its JSON form") from None
    if not isinstance(login, str) or not isinstance(password, str) or not login or not password:
        raise UpstreamCredentialsError(f"Connection {conn_id!r} needs a login and a password (the upstream's read-only account)")
    return login, password


def upstream_of(settings: Settings, credentials: tuple[str, str] | None = None) -> Upstream:
    """The upstream of this environment: its model name and alias from the settings, its registry endpoint."""
    release = settings.release
    if release.pattern != "deploy_model" or not release.upstream or release.upstream == settings.env:
        raise ReleaseError(f"{settings.env} uses release pattern {release.pattern!r}: nothing is imported into it "
                           "(deploy_model with an upstream environment imports)")
    up = load_settings(release.upstream, home=settings.home)
    registry = release.upstream_registry
    common = {"env": up.env, "model_name": up.registry.model_name, "champion_alias": up.registry.champion_alias,
              "conn_id": registry.conn_id, "timeout_s": registry.timeout_s, "attempts": registry.attempts}
    if registry.tracking_uri is None:
        return Upstream(tracking_uri=up.tracking_uri, shared=True, **common)
    try:
        uri = check_registry_uri(registry.tracking_uri, registry.allowed_schemes)
    except ValueError as exc:
        raise UpstreamRegistryError(f"release.upstream_registry.tracking_uri: {exc}") from None
    if credentials is None:
        credentials = connection_credentials(registry.conn_id)
    return Upstream(tracking_uri=uri, shared=False, credentials=credentials, **common)


def _network_failure(exc: BaseException) -> bool:
    """Whether an MLflow error was caused by the network (MLflow wraps requests' errors without a code of their own)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _translated(upstream: Upstream, exc: Exception) -> Exception:
    where = f"upstream registry {upstream.public_uri} ({upstream.env})"
    if isinstance(exc, MlflowException) and exc.get_http_status_code() in (401, 403):
        account = f"the account of Connection {upstream.conn_id!r}" if upstream.credentials else "no account"
        return UpstreamCredentialsError(f"{where} refused {account} (HTTP {exc.get_http_status_code()}): nothing imported")
    if isinstance(exc, requests.exceptions.RequestException) or _network_failure(exc):
        return UpstreamUnreachableError(f"{where} did not answer in {upstream.attempts} tries of {upstream.timeout_s} s "
                                        f"({type(exc).__name__}): nothing imported")
    return exc


@contextlib.contextmanager
def reading(upstream: Upstream) -> Iterator[MlflowClient]:
    """A client of the upstream registry, MLflow's requests bounded and signed as the upstream's account.

    The process's own credentials and bounds are put back afterwards, so what follows writes here
    as this environment's account.
    """
    names = (USERNAME_VARIABLE, PASSWORD_VARIABLE, TOKEN_VARIABLE, *_BOUNDS)
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(dict(zip(_BOUNDS, (str(upstream.timeout_s), str(upstream.attempts - 1), "1"))))
    if not upstream.shared:
        for name in (USERNAME_VARIABLE, PASSWORD_VARIABLE, TOKEN_VARIABLE):
            os.environ.pop(name, None)
        if upstream.credentials:
            os.environ[USERNAME_VARIABLE], os.environ[PASSWORD_VARIABLE] = upstream.credentials
    try:
        if urlsplit(upstream.tracking_uri).scheme == "sqlite" and not _sqlite_exists(upstream.tracking_uri):
            raise UpstreamUnreachableError(f"upstream registry {upstream.public_uri} ({upstream.env}) has no store "
                                           "there: nothing imported")
        yield MlflowClient(tracking_uri=upstream.tracking_uri, registry_uri=upstream.tracking_uri)
    except (MlflowException, requests.exceptions.RequestException) as exc:
        translated = _translated(upstream, exc)
        if translated is exc:
            raise
        log.warning("%s", translated)
        raise translated from None  # MLflow's message may carry the server's response body
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _sqlite_exists(uri: str) -> bool:
    """Asking MLflow about a missing SQLite file creates an empty store: a wrong path must not look like 'no champion'."""
    return Path(uri[len("sqlite:///"):].split("?", 1)[0]).exists() if uri.startswith("sqlite:///") else True


# --------------------------------------------------------------------------- the source


def _source(client: MlflowClient, upstream: Upstream, source_version: int | None) -> ModelVersion:
    if source_version is None:
        source_version = alias_version(client, upstream.model_name, upstream.champion_alias)
        if source_version is None:
            raise UpstreamNoChampionError(
                f"upstream {upstream.env} has no champion ({upstream.model_name}@{upstream.champion_alias} in "
                f"{upstream.public_uri}): nothing to import")
    return get_model_version(client, upstream.model_name, source_version)


def _checked_source(source: ModelVersion) -> dict[str, str]:
    """The source's manifest, once its lineage, gate pass, manifest and release history allow an import."""
    where = f"upstream {source.name} v{source.version}"
    try:
        trained_on(source)
    except LineageError:
        raise UnverifiableSourceError(f"{where} has no lineage tags (which data it was trained on): "
                                      "nothing imported") from None
    tags = source.tags or {}
    if tags.get(TAG_ROLLED_BACK):
        raise RolledBackError(f"{where} was rolled back: it is not imported")
    if tags.get(TAG_GATE_DECISION) != PASS:
        raise UnverifiableSourceError(f"{where} has not passed its own environment's gate ({TAG_GATE_DECISION} is not "
                                      f"{PASS!r}): nothing imported")
    try:
        return integrity.recorded_manifest(source)
    except integrity.ModelIntegrityError:
        raise UnverifiableSourceError(f"{where} has no valid integrity manifest ({integrity.TAG_MANIFEST}): its files "
                                      "cannot be checked, nothing imported") from None


def alert_unverifiable(settings: Settings, upstream: Upstream, source: ModelVersion, error: Exception) -> None:
    """One ``source_unverifiable`` alert per upstream version, however often the event or the reconcile retries it."""
    from tasks.alerting.alert import Alert
    from tasks.alerting.delivery import send

    log.error("%s", error)
    send(Alert(summary=f"upstream {upstream.env} {source.name} v{source.version} cannot be verified (no integrity "
                       "manifest, lineage tags or gate pass of its own): not imported", severity="critical", source="model-import", env=settings.env,
               dedup_key=f"{settings.env}:{UNVERIFIABLE_KIND}:{upstream.env}:{source.name}:v{source.version}",
               kind=UNVERIFIABLE_KIND, details={"source_registry": upstream.public_uri, "source_env": upstream.env},
               error=str(error)[:300], versions={"model_name": source.name, "version": int(source.version)}), settings)


def _bounded(value: str | None) -> str:
    return (value or "")[:_MAX_TAG_CHARS]


def _tags(settings: Settings, upstream: Upstream, source: ModelVersion) -> dict[str, str]:
    """What the imported version carries: the source's lineage, where it came from, this environment."""
    tags = dict(source.tags or {})
    gate = {k[len("cd4ml.gate."):]: _bounded(v) for k, v in tags.items() if k.startswith("cd4ml.gate.")}
    source_uri = f"models:/{source.name}/{source.version}"
    lineage = {k: _bounded(v) for k, v in tags.items() if k in (*LINEAGE_RUN_TAGS, *EXTRA_LINEAGE_TAGS)}
    return {
        **lineage,
        "cd4ml.trained_in": _bounded(tags.get("cd4ml.trained_in") or tags.get(TAG_ENV) or upstream.env),
        TAG_ENV: settings.env,
        TAG_COPIED_FROM: source_uri,
        TAG_SOURCE: source_uri,
        TAG_IMPORT_REGISTRY: upstream.public_uri,
        TAG_IMPORT_ENV: upstream.env,
        TAG_IMPORT_MODEL: source.name,
        TAG_IMPORT_VERSION: str(source.version),
        TAG_IMPORT_RUN: _bounded(source.run_id),
        TAG_IMPORT_GATE: _bounded(json.dumps(gate, sort_keys=True)),
        TAG_IMPORT_RELEASE: _bounded(tags.get(TAG_LAST_RELEASE)),
        TAG_IMPORT_MANIFEST: _bounded(tags.get(integrity.TAG_MANIFEST_SHA256)),
    }


# --------------------------------------------------------------------------- this environment


def _same_source(have: Mapping[str, str], tags: Mapping[str, str]) -> bool:
    """Whether a version's tags name the same upstream registry, model and version as ``tags``."""
    return all(have.get(k) == tags.get(k) for k in _SAME_SOURCE)


def _existing(client: MlflowClient, name: str, tags: Mapping[str, str], shared: bool) -> ModelVersion | None:
    """The version an earlier import of the same source made (a copy made before provenance tags, too)."""
    for version in client.search_model_versions(f"name = '{name}'"):
        have = version.tags or {}
        if _same_source(have, tags):
            return version
        if shared and not have.get(TAG_IMPORT_REGISTRY) and have.get(TAG_COPIED_FROM) == tags[TAG_COPIED_FROM]:
            return version
    return None


def _register(settings: Settings, client: MlflowClient, folder: Path, tags: Mapping[str, str]) -> ModelVersion:
    """Log the checked files to a run of this environment's experiment and register them as a new version."""
    (folder / integrity.CLIENT_WRITTEN).unlink(missing_ok=True)  # the client's note of the source name, not a model file
    name = settings.registry.model_name
    run_tags = {k: v for k, v in tags.items() if k.startswith("cd4ml.import.") or k == TAG_ENV}
    run = client.create_run(ensure_experiment(settings, client), tags=run_tags,
                            run_name=f"import-{tags[TAG_IMPORT_ENV]}-v{tags[TAG_IMPORT_VERSION]}")
    client.log_artifacts(run.info.run_id, str(folder), "model")
    client.set_terminated(run.info.run_id)
    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    created = _create_version(client, name, f"runs:/{run.info.run_id}/model", run.info.run_id, tags)
    return client.get_model_version(name, str(created.version))


def _create_version(client: MlflowClient, name: str, source: str, run_id: str, tags: Mapping[str, str],
                    attempts: int = 4) -> ModelVersion:
    """Register a version; registered again when a concurrent registration took the number it was given.

    MLflow numbers a version as the highest plus one. On PostgreSQL two registrations at once can
    both be given the same number, and the later commit is refused (MLflow's own retries cover a
    refused insert, not a refused commit). A refusal counts as that race only when the registry's
    highest number moved meanwhile (another registration committed); any other refusal is raised.
    """
    for _ in range(attempts - 1):
        before = _highest_version(client, name)
        try:
            return client.create_model_version(name, source, run_id=run_id, tags=dict(tags))
        except MlflowException:
            if _highest_version(client, name) == before:
                raise
            log.info("a concurrent registration took %s v%s's number: registering again", name, before + 1)
            time.sleep(random.uniform(0.05, 0.5))  # noqa: S311 - spreads the racers, no secret
    return client.create_model_version(name, source, run_id=run_id, tags=dict(tags))


def _highest_version(client: MlflowClient, name: str) -> int:
    return max((int(v.version) for v in client.search_model_versions(f"name = '{name}'")), default=0)


def _converged(client: MlflowClient, made: ModelVersion) -> tuple[ModelVersion, bool]:
    """(the lowest version imported from the same source, whether it is another's): a racing import's copy wins.

    Two imports of one upstream version at once both find nothing and both register. Each then
    looks again: the one holding a higher number deletes its version (and run) and returns the
    lowest, so both racers answer with the same version and one remains, without a lock.
    """
    twins = [v for v in client.search_model_versions(f"name = '{made.name}'") if _same_source(v.tags or {}, made.tags or {})]
    first = min(twins, key=lambda v: int(v.version), default=made)
    if int(first.version) >= int(made.version):
        return made, False
    client.delete_model_version(made.name, str(made.version))  # never aliased: nothing points at it
    client.delete_run(made.run_id)
    log.info("a concurrent import registered %s v%s from the same source first: v%s removed, v%s kept",
             made.name, first.version, made.version, first.version)
    return client.get_model_version(first.name, str(first.version)), True


def import_model(settings: Settings, source_version: int | None = None, *,
                 credentials: tuple[str, str] | None = None) -> ImportResult:
    """Import the upstream's champion (or ``source_version``) into this environment's registered model.

    ``credentials``: the upstream's read-only account when the caller resolved the Connection
    (Airflow); else ``AIRFLOW_CONN_<CONN_ID>``. Every error leaves this registry as it was.
    """
    upstream = upstream_of(settings, credentials)
    with reading(upstream) as up:
        source = _source(up, upstream, source_version)
    try:
        manifest = _checked_source(source)
    except UnverifiableSourceError as exc:
        alert_unverifiable(settings, upstream, source, exc)
        raise
    tags = _tags(settings, upstream, source)
    client = mlflow_client(settings)
    version = _existing(client, settings.registry.model_name, tags, upstream.shared)
    reused = version is not None
    if version is None:
        with tempfile.TemporaryDirectory(prefix="cd4ml-import-") as tmp:
            with reading(upstream) as up:
                folder = integrity.download_version(up, upstream.tracking_uri, source, tmp)
            integrity.check_folder(settings, source, folder)  # before anything is written here
            version, reused = _converged(client, _register(settings, client, folder, tags))
    set_version_tags(client, version, tags)  # completes a version an interrupted import left
    integrity.record_manifest(settings, client, version, expected=manifest)
    log.info("%s %s v%s from %s as %s v%s", "reused import of" if reused else "imported", source.name, source.version,
             upstream.public_uri, settings.registry.model_name, version.version)
    return ImportResult(int(version.version), tags[TAG_COPIED_FROM], upstream.public_uri, upstream.env,
                        int(source.version), reused)


def pending_import(settings: Settings, credentials: tuple[str, str] | None = None) -> int | None:
    """The upstream champion's version while no version here imported from it has a recorded gate; else None.

    The reconcile's question: a lost or never-delivered event leaves the upstream's champion
    without a gated import here, and the reconcile then starts cd4ml_promote for it (the import
    itself finds an earlier, ungated import of the same source and reuses it).
    """
    upstream = upstream_of(settings, credentials)
    with reading(upstream) as up:
        champion = alias_version(up, upstream.model_name, upstream.champion_alias)
    if champion is None:
        return None
    wanted = {TAG_IMPORT_REGISTRY: upstream.public_uri, TAG_IMPORT_MODEL: upstream.model_name,
              TAG_IMPORT_VERSION: str(champion)}
    for version in mlflow_client(settings).search_model_versions(f"name = '{settings.registry.model_name}'"):
        tags = version.tags or {}
        if all(tags.get(k) == v for k, v in wanted.items()) and tags.get(TAG_GATE_DECISION):
            return None
    return champion


__all__ = [
    "ImportResult", "ModelImportError", "UnverifiableSourceError", "Upstream", "UpstreamCredentialsError",
    "UpstreamNoChampionError", "UpstreamRegistryError", "UpstreamUnreachableError", "connection_credentials",
    "import_model", "pending_import", "public_uri", "reading", "upstream_of",
]
