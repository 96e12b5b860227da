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


def test_release_commands_answer_bad_requests_with_one_line_and_change_nothing(cd4ml_home, capsys):
    assert main(["rollback", "--env", "staging", "--reason", "x"]) == 1
    assert "not a known environment" in capsys.readouterr().err
    assert main(["rollback", "--env", "sit", "--reason", "canary errors"]) == 1
    assert "sit has no champion" in capsys.readouterr().err
    assert main(["audit", "--env", "prod"]) == 0
    assert "no release audit rows yet" in capsys.readouterr().out
    assert main(["lineage", "models:/digits-classifier-prod/7"]) == 1
    assert "has no version 7" in capsys.readouterr().err
    assert main(["lineage", "runs:/abc/model"]) == 1
    assert "is not models:/<name>/<version>" in capsys.readouterr().err
    assert main(["lineage", "models:/someone-elses-model/1"]) == 1
    assert "not the registered model of any environment" in capsys.readouterr().err
