"""terraform/: every file parses (python-hcl2), `terraform fmt` is clean, and the wiring is consistent.

Provider downloads are unreachable here, so `terraform init/validate/plan` never ran; these
checks catch what validate would have caught in the wiring (a module called without a required
variable or with one it does not declare, environments that drift apart, tfvars that set
undeclared variables) plus policy (prod protected, no secret literal, buckets private and
encrypted, the GPU pool tainted). Each check is shown to fail on a planted mistake.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import hcl2
import pytest

ROOT = Path(__file__).resolve().parents[2] / "terraform"
ENVS = ("sit", "uat", "prod")
META_ARGUMENTS = {"source", "version", "count", "for_each", "providers", "depends_on"}


def unquote(value: Any) -> Any:
    """python-hcl2 8 keeps string quotes and wraps expressions in ${...}: strip quotes, keep expressions."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def load(path: Path) -> dict[str, Any]:
    with open(path) as f:
        return hcl2.load(f)


def blocks(doc: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """{label: body} of every ``kind`` block (variable, module, output) of a parsed file."""
    found: dict[str, dict[str, Any]] = {}
    for item in doc.get(kind, []):
        for label, body in item.items():
            found[unquote(label)] = body
    return found


def read_dir(directory: Path, kind: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.tf")):
        found.update(blocks(load(path), kind))
    return found


def resources(directory: Path) -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for path in sorted(directory.glob("*.tf")):
        for item in load(path).get("resource", []):
            for kind, named in item.items():
                for name, body in named.items():
                    found.append((unquote(kind), unquote(name), body))
    return found


def module_call_problems(caller: Path) -> list[str]:
    """Arguments a module call misses (required variables) or passes without the module declaring them."""
    problems = []
    for name, call in read_dir(caller, "module").items():
        target = (caller / unquote(call["source"])).resolve()
        declared = read_dir(target, "variable")
        passed = {k for k in call if k not in META_ARGUMENTS and not k.startswith("__")}
        required = {v for v, body in declared.items() if "default" not in body}
        problems += [f"{caller.name}: module {name} misses {v}" for v in sorted(required - passed)]
        problems += [f"{caller.name}: module {name} passes undeclared {a}" for a in sorted(passed - set(declared))]
    return problems


def tfvars_problems(env_dir: Path) -> list[str]:
    declared = read_dir(env_dir, "variable")
    values = {k for k in load(env_dir / "terraform.tfvars") if not k.startswith("__")}
    required = {v for v, body in declared.items() if "default" not in body}
    return ([f"{env_dir.name}: tfvars sets undeclared {v}" for v in sorted(values - set(declared))]
            + [f"{env_dir.name}: tfvars misses {v}" for v in sorted(required - values)])


def variable_signature(env_dir: Path) -> dict[str, str]:
    return {name: str(body.get("type")) for name, body in read_dir(env_dir, "variable").items()}


def test_every_file_parses_and_fmt_is_clean():
    files = sorted(ROOT.rglob("*.tf")) + sorted(ROOT.rglob("*.tfvars"))
    assert len(files) >= 30
    for path in files:
        load(path)
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform CLI not installed: fmt not checked (files parsed)")
    proc = subprocess.run([terraform, "fmt", "-check", "-recursive", str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, f"not formatted (terraform fmt -recursive terraform/): {proc.stdout}"


def test_the_three_environments_declare_the_same_variables():
    signatures = {env: variable_signature(ROOT / "envs" / env) for env in ENVS}
    assert signatures["sit"] == signatures["uat"] == signatures["prod"]
    assert len(signatures["sit"]) >= 20


def test_module_calls_and_tfvars_match_the_declarations():
    callers = [ROOT / "envs" / env for env in ENVS] + sorted(p for p in (ROOT / "modules").iterdir() if p.is_dir())
    assert [p for c in callers for p in module_call_problems(c)] == []
    assert [p for env in ENVS for p in tfvars_problems(ROOT / "envs" / env)] == []


def test_the_checks_catch_planted_mistakes(tmp_path):
    copy = tmp_path / "terraform"
    shutil.copytree(ROOT, copy)
    uat = copy / "envs" / "uat"
    main = uat / "main.tf"
    main.write_text(main.read_text().replace("  multi_az                  = var.multi_az\n", "")
                    .replace("  tags                    = local.tags\n}\n\nmodule \"cluster\"",
                             "  tags                    = local.tags\n  colour = \"blue\"\n}\n\nmodule \"cluster\"", 1))
    assert sorted(module_call_problems(uat)) == ["uat: module database misses multi_az",
                                                 "uat: module storage passes undeclared colour"]
    variables = uat / "variables.tf"
    variables.write_text(variables.read_text().replace('variable "api_replicas" {\n  description = "Airflow API '
                                                       'server replicas."\n  type        = number',
                                                       'variable "api_replicas" {\n  description = "x"\n'
                                                       '  type        = string'))
    assert variable_signature(uat) != variable_signature(copy / "envs" / "sit")
    tfvars = uat / "terraform.tfvars"
    tfvars.write_text(tfvars.read_text().replace("celery_workers", "celery_worker"))
    assert sorted(tfvars_problems(uat)) == ["uat: tfvars misses celery_workers", "uat: tfvars sets undeclared celery_worker"]


def test_prod_is_protected_and_sit_is_disposable():
    prod = load(ROOT / "envs" / "prod" / "terraform.tfvars")
    sit = load(ROOT / "envs" / "sit" / "terraform.tfvars")
    assert prod["deletion_protection"] is True and prod["multi_az"] is True
    assert prod["backup_retention_days"] >= 14 and prod["redis_replicas"] >= 1
    assert sit["deletion_protection"] is False and sit["gpu_nodes_min"] == 0
    for env in ENVS:
        values = load(ROOT / "envs" / env / "terraform.tfvars")
        assert unquote(values["environment"]) == env and unquote(values["namespace"]) == f"cd4ml-{env}"
        assert values["gpu_nodes_min"] <= values["gpu_nodes_max"] and values["cpu_nodes_min"] <= values["cpu_nodes_max"]
    assert [load(ROOT / "envs" / e / "terraform.tfvars")["gpu_nodes_max"] for e in ENVS] == [1, 2, 4]


@functools.cache
def secret_key_names() -> frozenset[str]:
    """Keys of the Kubernetes Secrets Terraform fills: naming one of them refers to a secret, it is not one."""
    names: set[str] = set()
    for path in ROOT.rglob("*.tf"):
        for kind, _, body in resources(path.parent):
            if kind == "kubernetes_secret":
                names |= {unquote(k) for k in body.get("data", {}) if not k.startswith("__")}
    return frozenset(names)


def secret_literals(path: Path) -> list[str]:
    """Attributes named like secrets that hold a plain string instead of an expression or a secret's key name."""
    found = []
    references = {f'"{name}"' for name in secret_key_names()}

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                name = unquote(key).lower() if isinstance(key, str) else ""
                if (any(w in name for w in ("password", "secret", "token", "auth_token"))
                        and isinstance(value, str) and value.startswith('"') and value not in references
                        and not name.endswith(("_name", "_arn"))):
                    found.append(f"{path.name}: {where}.{unquote(key)} = {value}")
                walk(value, f"{where}.{unquote(key)}")
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    walk(load(path), path.stem)
    return found


def test_no_secret_is_a_literal(tmp_path):
    files = sorted(ROOT.rglob("*.tf")) + sorted(ROOT.rglob("*.tfvars"))
    assert [problem for path in files for problem in secret_literals(path)] == []
    planted = tmp_path / "bad.tf"
    planted.write_text('resource "aws_db_instance" "x" {\n  password = "hunter2"\n}\n')
    assert secret_literals(planted) == ['bad.tf: bad.resource.aws_db_instance.x.password = "hunter2"']


def test_buckets_are_private_and_encrypted_and_the_gpu_pool_is_tainted():
    storage = resources(ROOT / "modules" / "storage")
    kinds = {kind for kind, _, _ in storage}
    assert {"aws_s3_bucket", "aws_s3_bucket_public_access_block",
            "aws_s3_bucket_server_side_encryption_configuration", "aws_s3_bucket_versioning"} <= kinds
    block = next(body for kind, _, body in storage if kind == "aws_s3_bucket_public_access_block")
    assert all(block[k] is True for k in ("block_public_acls", "block_public_policy", "ignore_public_acls",
                                          "restrict_public_buckets"))
    for kind, _, body in storage:  # every bucket-scoped resource covers every bucket
        if kind.startswith("aws_s3_bucket_"):
            assert body.get("for_each") == "${aws_s3_bucket.this}", kind
    gpu = next(body for kind, name, body in resources(ROOT / "modules" / "cluster")
               if kind == "aws_eks_node_group" and name == "gpu")
    taint = gpu["taint"][0]
    assert (unquote(taint["key"]), unquote(taint["effect"])) == ("nvidia.com/gpu", "NO_SCHEDULE")
    database = next(body for kind, _, body in resources(ROOT / "modules" / "database") if kind == "aws_db_instance")
    assert database["storage_encrypted"] is True and database["password"] == "${random_password.master.result}"


def test_each_hop_has_its_queue_where_only_the_upstream_sends_and_only_the_downstream_receives():
    """sit and uat own the queue to their downstream (prod none); uat and prod receive from their upstream's."""
    doc = load(ROOT / "modules" / "queue" / "main.tf")
    (policy,) = [body for item in doc["data"] for named in item.values() for body in named.values()]
    statements = {unquote(s["sid"]): s for s in policy["statement"]}
    allowed = {sid: ({unquote(a) for a in s["actions"]}, [unquote(i) for p in s["principals"] for i in p["identifiers"]])
               for sid, s in statements.items() if unquote(s.get("effect", '"Allow"')) == "Allow"}
    assert allowed == {"UpstreamSends": ({"sqs:SendMessage", "sqs:GetQueueUrl"}, ["${var.publisher_role_arn}"]),
                       "DownstreamReceives": ({"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility",
                                               "sqs:GetQueueAttributes", "sqs:GetQueueUrl"}, ["${var.consumer_role_arn}"])}
    assert unquote(statements["TlsOnly"]["effect"]) == "Deny"
    hop = [b for b in load(ROOT / "envs" / "uat" / "main.tf")["module"] if '"hop_queue"' in b][0]['"hop_queue"']
    assert hop["publisher_role_arn"] == "${module.secrets.pod_role_arn}"
    values = {env: load(ROOT / "envs" / env / "terraform.tfvars") for env in ENVS}
    downstream = {env: unquote(v.get("downstream_environment")) for env, v in values.items()}
    assert downstream == {"sit": "uat", "uat": "prod", "prod": None}
    assert {env: "downstream_consumer_role_arn" in v for env, v in values.items()} == {"sit": True, "uat": True, "prod": False}
    upstream = {env: unquote(v.get("upstream_queue_url", '""')).rsplit("/", 1)[-1] for env, v in values.items()}
    assert upstream == {"sit": "", "uat": "cd4ml-sit-to-uat-champion", "prod": "cd4ml-uat-to-prod-champion"}


def _statements(path: Path) -> dict[str, dict[str, Any]]:
    """{sid: statement} of the one policy document a module file holds."""
    (policy,) = [body for item in load(path)["data"] for named in item.values() for body in named.values()]
    return {unquote(s["sid"]): s for s in policy["statement"]}


def test_each_upstream_hands_its_read_only_registry_account_to_the_downstream_alone():
    """sit's and uat's reader account as the downstream's Connection, readable by the downstream's pod role only;
    uat and prod read the upstream's MLflow at the URI their settings take from CD4ML_UPSTREAM_REGISTRY_URI."""
    from tasks.settings import UpstreamRegistrySettings

    module = ROOT / "modules" / "registry_reader"
    statements = _statements(module / "main.tf")
    allow, deny = statements["DownstreamReads"], statements["NobodyElseReads"]
    assert [unquote(i) for p in allow["principals"] for i in p["identifiers"]] == ["${var.consumer_role_arn}"]
    assert {unquote(a) for a in allow["actions"]} == {"secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"}
    assert unquote(deny["effect"]) == "Deny" and [unquote(a) for a in deny["actions"]] == ["secretsmanager:GetSecretValue"]
    (condition,) = deny["condition"]
    assert (unquote(condition["test"]), unquote(condition["variable"])) == ("StringNotEquals", "aws:PrincipalArn")
    assert condition["values"] == ["${var.consumer_role_arn}"]
    secret = next(body for kind, _, body in resources(module) if kind == "aws_secretsmanager_secret")
    assert unquote(secret["name"]) == "cd4ml-${var.downstream}/connections/${var.conn_id}"  # the downstream's prefix
    conn_id = read_dir(module, "variable")["conn_id"]["default"]
    assert unquote(conn_id) == UpstreamRegistrySettings().conn_id  # the Connection the import resolves

    uat_main = load(ROOT / "envs" / "uat" / "main.tf")["module"]
    call = {unquote(k): v for block in uat_main for k, v in block.items()}
    reader = call["registry_reader"]
    assert (reader["reader_username"], reader["reader_password"]) == ("${module.airflow.reader_username}",
                                                                       "${module.airflow.reader_password}")
    assert reader["consumer_role_arn"] == "${var.downstream_consumer_role_arn}"
    assert "var.upstream_registry_secret_arn" in call["secrets"]["extra_secret_arns"]  # the downstream's pod role
    assert call["airflow"]["upstream_registry_uri"] == "${var.upstream_registry_uri}"
    airflow = (ROOT / "modules" / "airflow" / "main.tf").read_text()
    assert '{ name = "CD4ML_UPSTREAM_REGISTRY_URI", value = var.upstream_registry_uri }' in airflow
    # the hop queues reach the settings too (tasks/settings.py DEPLOYMENT_VARIABLES): this one's and the upstream's
    assert '{ name = "CD4ML_PUBLISH_QUEUE_URL", value = var.publish_queue_url }' in airflow
    assert '{ name = "CD4ML_UPSTREAM_QUEUE_URL", value = var.upstream_queue_url }' in airflow
    for env in ENVS:
        wired = {unquote(k): v for block in load(ROOT / "envs" / env / "main.tf")["module"] for k, v in block.items()}
        assert wired["airflow"]["publish_queue_url"] == "${one(module.hop_queue[*].url)}", env
        assert wired["airflow"]["upstream_queue_url"] == "${var.upstream_queue_url}", env

    values = {env: load(ROOT / "envs" / env / "terraform.tfvars") for env in ENVS}
    endpoints = {env: unquote(v.get("upstream_registry_uri", '""')) for env, v in values.items()}
    assert endpoints["sit"] == "" and all(endpoints[e].startswith("https://mlflow.cd4ml-") for e in ("uat", "prod"))
    assert "cd4ml-sit" in endpoints["uat"] and "cd4ml-uat" in endpoints["prod"]  # each reads its own upstream
    for env in ("uat", "prod"):
        UpstreamRegistrySettings(tracking_uri=endpoints[env])  # allowed scheme, no credentials
        arn = unquote(values[env]["upstream_registry_secret_arn"])
        assert f":secret:cd4ml-{env}/connections/{UpstreamRegistrySettings().conn_id}-" in arn
    assert "upstream_registry_secret_arn" not in values["sit"]
