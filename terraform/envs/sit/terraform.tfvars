# sit: small, disposable, no GPU unless a test asks for one.
environment             = "sit"
namespace               = "cd4ml-sit"
region                  = "eu-west-1"
vpc_id                  = "vpc-REPLACE-ME"
private_subnet_ids      = ["subnet-REPLACE-ME-a", "subnet-REPLACE-ME-b"]
kubernetes_version      = "1.33"
oidc_thumbprints        = ["9e99a48a9960b14926bb7f3b02e22da2b0ab7280"]
airflow_chart_version   = "1.18.0"
image_repository        = "REPLACE-ME.dkr.ecr.eu-west-1.amazonaws.com/cd4ml-airflow"
mlflow_image            = "REPLACE-ME.dkr.ecr.eu-west-1.amazonaws.com/cd4ml-mlflow:3.17.2"
image_tag               = "main"
cpu_instance_type       = "m6i.large"
cpu_nodes_min           = 1
cpu_nodes_max           = 2
gpu_instance_type       = "g5.xlarge"
gpu_nodes_min           = 0
gpu_nodes_max           = 1
db_instance_class       = "db.t4g.small"
db_storage_gb           = 20
multi_az                = false
deletion_protection     = false
backup_retention_days   = 1
noncurrent_version_days = 7
redis_node_type         = "cache.t4g.micro"
redis_replicas          = 0
celery_workers          = 2
api_replicas            = 1

# The release hand-off (modules/queue): sit sends to uat.
downstream_environment       = "uat"
downstream_consumer_role_arn = "arn:aws:iam::REPLACE-ME:role/cd4ml-uat-pods" # uat's pod_role_arn
