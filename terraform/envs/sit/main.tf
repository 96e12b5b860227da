# One environment of cd4ml. The three envs (sit, uat, prod) share this file word for word;
# what differs is in terraform.tfvars (sizes, protection, GPU pool) and the backend key.
provider "aws" {
  region = var.region
  default_tags {
    tags = local.tags
  }
}

provider "kubernetes" {
  host                   = module.cluster.endpoint
  cluster_ca_certificate = base64decode(module.cluster.ca_data)
  exec {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", module.cluster.name, "--region", var.region]
  }
}

provider "helm" {
  kubernetes {
    host                   = module.cluster.endpoint
    cluster_ca_certificate = base64decode(module.cluster.ca_data)
    exec {
      api_version = "client.authentication.k8s.io/v1beta1"
      command     = "aws"
      args        = ["eks", "get-token", "--cluster-name", module.cluster.name, "--region", var.region]
    }
  }
}

locals {
  name_prefix = "cd4ml-${var.environment}"
  tags        = { project = "cd4ml", environment = var.environment, managed-by = "terraform" }
}

module "storage" {
  source                  = "../../modules/storage"
  name_prefix             = local.name_prefix
  noncurrent_version_days = var.noncurrent_version_days
  force_destroy           = !var.deletion_protection
  tags                    = local.tags
}

module "cluster" {
  source             = "../../modules/cluster"
  name_prefix        = local.name_prefix
  subnet_ids         = var.private_subnet_ids
  kubernetes_version = var.kubernetes_version
  cpu_instance_type  = var.cpu_instance_type
  cpu_nodes_min      = var.cpu_nodes_min
  cpu_nodes_max      = var.cpu_nodes_max
  gpu_instance_type  = var.gpu_instance_type
  gpu_nodes_min      = var.gpu_nodes_min
  gpu_nodes_max      = var.gpu_nodes_max
  oidc_thumbprints   = var.oidc_thumbprints
  tags               = local.tags
}

module "database" {
  source                    = "../../modules/database"
  name_prefix               = local.name_prefix
  vpc_id                    = var.vpc_id
  subnet_ids                = var.private_subnet_ids
  client_security_group_ids = [module.cluster.node_security_group_id]
  instance_class            = var.db_instance_class
  allocated_storage_gb      = var.db_storage_gb
  multi_az                  = var.multi_az
  deletion_protection       = var.deletion_protection
  backup_retention_days     = var.backup_retention_days
  tags                      = local.tags
}

module "broker" {
  source                    = "../../modules/broker"
  name_prefix               = local.name_prefix
  vpc_id                    = var.vpc_id
  subnet_ids                = var.private_subnet_ids
  client_security_group_ids = [module.cluster.node_security_group_id]
  node_type                 = var.redis_node_type
  replicas                  = var.redis_replicas
  tags                      = local.tags
}

module "secrets" {
  source            = "../../modules/secrets"
  name_prefix       = local.name_prefix
  namespace         = var.namespace
  oidc_provider_arn = module.cluster.oidc_provider_arn
  oidc_issuer       = module.cluster.oidc_issuer
  bucket_arns       = module.storage.bucket_arns
  kms_key_arn       = module.storage.kms_key_arn
  extra_secret_arns = concat(
    [module.database.master_secret_arn, module.broker.auth_secret_arn],
    var.upstream_registry_secret_arn == null ? [] : [var.upstream_registry_secret_arn],
  )
  queue_receive_arns = var.upstream_queue_arn == null ? [] : [var.upstream_queue_arn]
  tags               = local.tags
}

module "airflow" {
  source                = "../../modules/airflow"
  environment           = var.environment
  namespace             = var.namespace
  chart_version         = var.airflow_chart_version
  image_repository      = var.image_repository
  image_tag             = var.image_tag
  mlflow_image          = var.mlflow_image
  celery_workers        = var.celery_workers
  api_replicas          = var.api_replicas
  database_uris         = module.database.connection_uris
  broker_url            = module.broker.broker_url
  lake_uri              = module.storage.lake_uri
  artifacts_uri         = module.storage.artifacts_uri
  pod_role_arn          = module.secrets.pod_role_arn
  connections_prefix    = module.secrets.connections_prefix
  upstream_registry_uri = var.upstream_registry_uri
  publish_queue_url     = one(module.hop_queue[*].url)
  upstream_queue_url    = var.upstream_queue_url
}

# The release hand-off to the downstream environment (sit -> uat, uat -> prod): this environment
# sends, the downstream's pod role receives. prod has no downstream: no queue.
module "hop_queue" {
  source             = "../../modules/queue"
  count              = var.downstream_consumer_role_arn == null ? 0 : 1
  name_prefix        = local.name_prefix
  downstream         = var.downstream_environment
  publisher_role_arn = module.secrets.pod_role_arn
  consumer_role_arn  = var.downstream_consumer_role_arn
  tags               = local.tags
}

# This environment's read-only registry account, handed to the downstream as its Connection for the
# upstream registry (readable by the downstream's pod role only). prod has no downstream: none.
module "registry_reader" {
  source            = "../../modules/registry_reader"
  count             = var.downstream_consumer_role_arn == null ? 0 : 1
  name_prefix       = local.name_prefix
  downstream        = var.downstream_environment
  consumer_role_arn = var.downstream_consumer_role_arn
  reader_username   = module.airflow.reader_username
  reader_password   = module.airflow.reader_password
  tags              = local.tags
}
