import re
from pathlib import Path

import pytest

from tasks.settings import ENVIRONMENTS, REMOVED_KEYS, RENAMED_KEYS, SettingsError, load_settings, resolve_env


def test_default_env_is_sit(cd4ml_home, monkeypatch):
    monkeypatch.delenv("CD4ML_ENV")
    assert load_settings().env == "sit"


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_each_env_loads_with_its_own_names(cd4ml_home, env):
    s = load_settings(env)
    assert s.env == env
    assert f"/{env}/lake/raw_images" in s.raw_table
    assert s.registry.model_name.endswith(f"-{env}")
    assert s.tracking.experiment == f"cd4ml-{env}"
    assert s.raw_table.startswith(str(cd4ml_home))


def test_env_files_override_thresholds(cd4ml_home):
    assert load_settings("prod").gate.min_value > load_settings("sit").gate.min_value
    assert load_settings("prod").validation.max_rejected_share < load_settings("sit").validation.max_rejected_share


@pytest.mark.parametrize("bad", ["dev", "production", ""])
def test_bad_env_is_a_clear_error(monkeypatch, bad):
    monkeypatch.setenv("CD4ML_ENV", bad)
    with pytest.raises(SettingsError, match="not a known environment; use one of sit, uat, prod"):
        load_settings()


def test_env_name_is_case_insensitive():
    assert resolve_env(" UAT ") == "uat"


def _conf_with(tmp_path: Path, extra: str) -> Path:
    from tasks.settings import REPO_ROOT

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "base.yaml").write_text((REPO_ROOT / "conf" / "base.yaml").read_text())
    (conf / "sit.yaml").write_text(extra)
    return conf


def test_bad_value_names_the_key(tmp_path, cd4ml_home):
    conf = _conf_with(tmp_path, "curation:\n  split_ratios: {train: 0.9, val: 0.2, test: 0.1}\n")
    with pytest.raises(SettingsError, match="curation.split_ratios"):
        load_settings("sit", conf_dir=conf)


def test_unknown_key_is_rejected(tmp_path, cd4ml_home):
    conf = _conf_with(tmp_path, "gate:\n  min_acuracy: 0.9\n")
    with pytest.raises(SettingsError, match="gate.min_acuracy"):
        load_settings("sit", conf_dir=conf)


def test_tracking_uri_comes_from_environment_when_set(cd4ml_home, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://mlflow@127.0.0.1/mlflow")
    assert load_settings().tracking_uri == "postgresql://mlflow@127.0.0.1/mlflow"


def test_section_hash_changes_with_the_section(settings):
    other = settings.model_copy(update={"curation": settings.curation.model_copy(update={"split_salt": "x"})})
    assert settings.section_hash("curation") != other.section_hash("curation")
    assert settings.section_hash("training") == other.section_hash("training")


def test_an_mlflow_client_for_one_environment_does_not_capture_the_next(tmp_path, monkeypatch):
    """MLflow's set_tracking_uri exports MLFLOW_TRACKING_URI; settings read it as an override, so it must not leak."""
    from tasks.models.registry import mlflow_client
    from tasks.settings import load_settings

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first, second = load_settings("sit", home=tmp_path / "a"), load_settings("prod", home=tmp_path / "b")
    mlflow_client(first)
    assert second.tracking_uri == second.tracking.uri != first.tracking.uri
    operator = f"sqlite:///{tmp_path / 'operator.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", operator)  # an operator's override still wins
    mlflow_client(first)
    assert second.tracking_uri == operator


def test_a_deployment_points_the_lake_at_its_bucket(monkeypatch, tmp_path):
    from tasks.settings import load_settings

    monkeypatch.setenv("CD4ML_HOME", str(tmp_path))
    assert load_settings("uat").storage.lake_uri == f"{tmp_path}/uat/lake"
    monkeypatch.setenv("CD4ML_LAKE_URI", "s3://cd4ml-uat-lake/lake")
    settings = load_settings("uat")
    assert settings.storage.lake_uri == "s3://cd4ml-uat-lake/lake"
    assert settings.raw_table == "s3://cd4ml-uat-lake/lake/raw_images"


def test_a_deployment_names_its_upstream_registry_in_the_environment_and_it_is_checked(monkeypatch, tmp_path):
    from tasks.settings import SettingsError, load_settings

    monkeypatch.setenv("CD4ML_HOME", str(tmp_path))
    monkeypatch.delenv("CD4ML_UPSTREAM_REGISTRY_URI", raising=False)
    assert load_settings("uat").release.upstream_registry.tracking_uri is None
    monkeypatch.setenv("CD4ML_UPSTREAM_REGISTRY_URI", "https://mlflow.cd4ml-sit.example")
    registry = load_settings("uat").release.upstream_registry
    assert (registry.tracking_uri, registry.conn_id) == ("https://mlflow.cd4ml-sit.example", "cd4ml_upstream_registry")
    monkeypatch.setenv("CD4ML_UPSTREAM_REGISTRY_URI", "https://reader:hunter2@mlflow.cd4ml-sit.example")
    with pytest.raises(SettingsError) as refused:  # the account comes from the Connection, never from the URI
        load_settings("uat")
    assert "hunter2" not in str(refused.value)



def test_a_deployment_names_its_hop_queues_in_the_environment_and_they_are_checked(monkeypatch, tmp_path):
    """terraform/modules/airflow hands the pods the hop queues' URLs: each sets its whole queue section to SQS."""
    from tasks.settings import SettingsError, load_settings

    monkeypatch.setenv("CD4ML_HOME", str(tmp_path))
    for name in ("CD4ML_PUBLISH_QUEUE_URL", "CD4ML_UPSTREAM_QUEUE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert (load_settings("uat").release.publish, load_settings("uat").release.upstream_event) == (None, None)
    monkeypatch.setenv("CD4ML_PUBLISH_QUEUE_URL", "https://sqs.eu-west-1.amazonaws.com/123456789012/cd4ml-uat-to-prod")
    monkeypatch.setenv("CD4ML_UPSTREAM_QUEUE_URL", "https://sqs.eu-west-1.amazonaws.com/123456789012/cd4ml-sit-to-uat")
    release = load_settings("uat").release
    assert (release.publish.scheme, release.publish.channel, release.publish.conn_id) == (
        "sqs", "cd4ml-uat-to-prod", "aws_default")
    assert release.upstream_event.queue_url.endswith("/cd4ml-sit-to-uat") and release.upstream_event.channel == (
        "cd4ml-sit-to-uat")
    conf = tmp_path / "conf"  # a file's own sqs Connection is kept; a file's redis queue is replaced whole
    conf.mkdir()
    (conf / "base.yaml").write_text("")
    (conf / "uat.yaml").write_text("release:\n  publish: {scheme: sqs, channel: x, conn_id: aws_hop,\n"
                                   "    queue_url: 'https://sqs.eu-west-1.amazonaws.com/1/x'}\n"
                                   "  upstream_event: {channel: cd4ml-sit-to-uat, conn_id: redis_hop}\n")
    release = load_settings("uat", conf_dir=conf).release
    assert (release.publish.conn_id, release.publish.channel) == ("aws_hop", "cd4ml-uat-to-prod")
    assert (release.upstream_event.scheme, release.upstream_event.conn_id) == ("sqs", "aws_default")
    monkeypatch.setenv("CD4ML_UPSTREAM_QUEUE_URL", "https://key:hunter2@sqs.example/1/q")
    with pytest.raises(SettingsError) as refused:
        load_settings("uat")
    assert "hunter2" not in str(refused.value)

def _nested(dotted: str, value) -> str:
    """YAML text setting one dotted key."""
    import yaml

    node = value
    for part in reversed(dotted.split(".")):
        node = {part: node}
    return yaml.safe_dump(node)


@pytest.mark.parametrize("old", sorted(RENAMED_KEYS))
def test_a_key_under_its_old_name_is_refused_with_the_new_name(tmp_path, cd4ml_home, old):
    conf = _conf_with(tmp_path, _nested(old, 0.5))
    with pytest.raises(SettingsError, match=rf"{re.escape(old)} was renamed to {re.escape(RENAMED_KEYS[old])}"):
        load_settings("sit", conf_dir=conf)


@pytest.mark.parametrize("old", sorted(REMOVED_KEYS))
def test_a_removed_key_is_refused_with_the_reason(tmp_path, cd4ml_home, old):
    conf = _conf_with(tmp_path, _nested(old, "cd4ml"))
    with pytest.raises(SettingsError, match=rf"{re.escape(old)} was removed \("):
        load_settings("sit", conf_dir=conf)


def test_a_dataset_file_with_an_old_key_is_refused_too(tmp_path, cd4ml_home, monkeypatch):
    conf = _conf_with(tmp_path, "")
    (conf / "datasets").mkdir()
    (conf / "datasets" / "old.yaml").write_text("release:\n  sample_fraction: 1.0\n")
    monkeypatch.setenv("CD4ML_DATASET", "old")
    with pytest.raises(SettingsError, match=r"old\.yaml: release\.sample_fraction was renamed to training_data\.sample_fraction"):
        load_settings("sit", conf_dir=conf)


def test_the_renamed_keys_are_the_new_home_of_their_values(cd4ml_home):
    sit, prod = load_settings("sit"), load_settings("prod")
    assert sit.training_data.sample_fraction == 0.5 and prod.training_data.sample_fraction == 1.0
    assert prod.monitoring.max_live_accuracy_drop == 0.03 and sit.monitoring.max_live_accuracy_drop == 0.05
    assert sit.drift.familywise_alpha == 0.05 and sit.monitoring.rule_alpha == 0.01
    assert sit.ingest.stored_modes == ("L", "RGB")


def test_an_empty_conf_gives_the_code_defaults_with_home_and_env_filled(tmp_path, cd4ml_home):
    from tasks.settings import Settings

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "base.yaml").write_text("")
    (conf / "uat.yaml").write_text("")
    s = load_settings("uat", conf_dir=conf)
    assert s.storage.lake_uri == f"{cd4ml_home}/uat/lake" and s.registry.model_name == "digits-classifier-uat"
    assert s.tuning.storage == f"sqlite:///{cd4ml_home}/uat/optuna.db"
    assert s.gate == Settings.model_fields["gate"].default_factory()


def test_a_file_changes_one_key_of_a_mapping_and_keeps_the_others(tmp_path, cd4ml_home):
    conf = _conf_with(tmp_path, "alerts:\n  routes:\n    critical: [log, slack]\n  deadlines:\n    cd4ml_train: {minutes: 5}\n")
    alerts = load_settings("sit", conf_dir=conf).alerts
    assert alerts.routes == {"info": ("log",), "warning": ("log",), "critical": ("log", "slack")}
    assert alerts.deadlines["cd4ml_train"].reference == "queued_at" and alerts.deadlines["cd4ml_train"].minutes == 5
    assert alerts.deadlines["cd4ml_ingest"].minutes == 120


@pytest.mark.parametrize("key", ["env", "home"])
def test_env_and_home_come_from_the_loader_only(tmp_path, cd4ml_home, key):
    conf = _conf_with(tmp_path, f"{key}: prod\n")
    with pytest.raises(SettingsError, match=f"{key} is set by the loader"):
        load_settings("sit", conf_dir=conf)
