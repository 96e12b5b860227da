# prod: highly available, protected, the largest GPU pool.
environment             = "prod"
namespace               = "cd4ml-prod"
region                  = "eu-west-1"
vpc_id                  = "vpc-REPLACE-ME"
private_subnet_ids      = ["subnet-REPLACE-ME-a", "subnet-REPLACE-ME-b"]
kubernetes_version      = "1.33"
oidc_thumbprints        = ["9e99a48a9960b14926bb7f3b02e22da2b0ab7280"]
airflow_chart_version   = "1.18.0"
image_repository        = "REPLACE-ME.dkr.ecr.eu-west-1.amazonaws.com/cd4ml-airflow"
mlflow_image            = "REPLACE-ME.dkr.ecr.eu-west-1.amazonaws.com/cd4ml-mlflow:3.17.2"
image_tag               = "release"
cpu_instance_type       = "m6i.2xlarge"
cpu_nodes_min           = 3
cpu_nodes_max           = 8
gpu_instance_type       = "g5.2xlarge"
gpu_nodes_min           = 0
gpu_nodes_max           = 4
db_instance_class       = "db.m6g.xlarge"
db_storage_gb           = 200
multi_az                = true
deletion_protection     = true
backup_retention_days   = 30
noncurrent_version_days = 90
redis_node_type         = "cache.m6g.large"
redis_replicas          = 2
celery_workers          = 8
api_replicas            = 2

# The release hand-off (modules/queue): prod receives from uat.
upstream_queue_url = "https://sqs.eu-west-1.amazonaws.com/REPLACE-ME/cd4ml-uat-to-prod-champion"
upstream_queue_arn = "arn:aws:sqs:eu-west-1:REPLACE-ME:cd4ml-uat-to-prod-champion"

# The import across registries: uat's MLflow server (reached over its ingress) and uat's read-only
# account, handed over by uat (its registry_reader_secret_arn output) as Connection cd4ml_upstream_registry.
upstream_registry_uri        = "https://mlflow.cd4ml-uat.REPLACE-ME.example"
upstream_registry_secret_arn = "arn:aws:secretsmanager:eu-west-1:REPLACE-ME:secret:cd4ml-prod/connections/cd4ml_upstream_registry-REPLACE-ME"
