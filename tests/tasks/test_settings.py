from pathlib import Path

import pytest

from tasks.settings import ENVIRONMENTS, SettingsError, load_settings, resolve_env


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
