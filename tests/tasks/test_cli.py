import json

from tasks.cli import main


def test_status_on_an_empty_home_lists_every_environment(cd4ml_home, capsys):
    assert main(["status"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["environments"]) == {"sit", "uat", "prod"}
    assert out["environments"]["sit"]["tables"]["raw_images"]["version"] is None
    assert out["environments"]["prod"]["registered_model"] == "digits-classifier-prod"


def test_status_shows_table_versions_and_rows(settings, raw_digits, capsys):
    assert main(["status", "--env", "sit"]) == 0
    sit = json.loads(capsys.readouterr().out)["environments"]["sit"]
    raw = sit["tables"]["raw_images"]
    assert raw["version"] == raw_digits.raw_version and raw["rows"] == 1797
    assert raw["last_commit"]["run_id"] == "fixture-ingest"


def test_bad_environment_exits_2_with_the_reason(cd4ml_home, monkeypatch, capsys):
    monkeypatch.setenv("CD4ML_ENV", "qa")
    assert main(["summary"]) == 2
    assert "not a known environment" in capsys.readouterr().err


def test_sample_data(cd4ml_home, tmp_path, capsys):
    assert main(["sample-data", "--landing", str(tmp_path / "l"), "--limit", "12"]) == 0
    assert len(list((tmp_path / "l").rglob("*.png"))) == 12
