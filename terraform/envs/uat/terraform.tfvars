# uat: production-shaped, smaller; kept data for acceptance runs.
environment             = "uat"
namespace               = "cd4ml-uat"
region                  = "eu-west-1"
vpc_id                  = "vpc-REPLACE-ME"
private_subnet_ids      = ["subnet-REPLACE-ME-a", "subnet-REPLACE-ME-b"]
kubernetes_version      = "1.33"
oidc_thumbprints        = ["9e99a48a9960b14926bb7f3b02e22da2b0ab7280"]
airflow_chart_version   = "1.18.0"
image_repository        = "REPLACE-ME.dkr.ecr.eu-west-1.amazonaws.com/cd4ml-airflow"
mlflow_image            = "REPLACE-ME.dkr.ecr.eu-west-1.amazonaws.com/cd4ml-mlflow:3.17.2"
image_tag               = "release-candidate"
cpu_instance_type       = "m6i.xlarge"
cpu_nodes_min           = 2
cpu_nodes_max           = 4
gpu_instance_type       = "g5.xlarge"
gpu_nodes_min           = 0
gpu_nodes_max           = 2
db_instance_class       = "db.m6g.large"
db_storage_gb           = 50
multi_az                = false
deletion_protection     = true
backup_retention_days   = 7
noncurrent_version_days = 30
redis_node_type         = "cache.t4g.small"
redis_replicas          = 1
celery_workers          = 4
api_replicas            = 2

# The release hand-off (modules/queue): uat receives from sit and sends to prod.
downstream_environment       = "prod"
downstream_consumer_role_arn = "arn:aws:iam::REPLACE-ME:role/cd4ml-prod-pods"
upstream_queue_url           = "https://sqs.eu-west-1.amazonaws.com/REPLACE-ME/cd4ml-sit-to-uat-champion"
upstream_queue_arn           = "arn:aws:sqs:eu-west-1:REPLACE-ME:cd4ml-sit-to-uat-champion"

# The import across registries: sit's MLflow server (reached over its ingress) and sit's read-only
# account, handed over by sit (its registry_reader_secret_arn output) as Connection cd4ml_upstream_registry.
upstream_registry_uri        = "https://mlflow.cd4ml-sit.REPLACE-ME.example"
upstream_registry_secret_arn = "arn:aws:secretsmanager:eu-west-1:REPLACE-ME:secret:cd4ml-uat/connections/cd4ml_upstream_registry-REPLACE-ME"
