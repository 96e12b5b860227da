# The same declarations in sit, uat and prod (tests/infra/test_terraform.py checks it).
variable "environment" {
  description = "sit, uat or prod."
  type        = string
  validation {
    condition     = contains(["sit", "uat", "prod"], var.environment)
    error_message = "environment must be sit, uat or prod."
  }
}

variable "region" {
  description = "AWS region."
  type        = string
}

variable "vpc_id" {
  description = "The VPC this environment lives in."
  type        = string
}

variable "private_subnet_ids" {
  description = "Private subnets (at least two availability zones)."
  type        = list(string)
}

variable "namespace" {
  description = "Kubernetes namespace for Airflow, MLflow and trainer pods."
  type        = string
}

variable "kubernetes_version" {
  description = "EKS version."
  type        = string
}

variable "oidc_thumbprints" {
  description = "Thumbprints of the EKS OIDC issuer's certificate chain."
  type        = list(string)
}

variable "cpu_instance_type" {
  description = "Airflow node type."
  type        = string
}

variable "cpu_nodes_min" {
  description = "Minimum CPU nodes."
  type        = number
}

variable "cpu_nodes_max" {
  description = "Maximum CPU nodes."
  type        = number
}

variable "gpu_instance_type" {
  description = "Training node type."
  type        = string
}

variable "gpu_nodes_min" {
  description = "Minimum GPU nodes (0 = scale to zero)."
  type        = number
}

variable "gpu_nodes_max" {
  description = "Maximum GPU nodes."
  type        = number
}

variable "db_instance_class" {
  description = "PostgreSQL instance class."
  type        = string
}

variable "db_storage_gb" {
  description = "PostgreSQL initial storage."
  type        = number
}

variable "multi_az" {
  description = "PostgreSQL standby in a second zone."
  type        = bool
}

variable "deletion_protection" {
  description = "Protect the database and the buckets from deletion."
  type        = bool
}

variable "backup_retention_days" {
  description = "Days of PostgreSQL backups."
  type        = number
}

variable "noncurrent_version_days" {
  description = "Days old object versions stay in the buckets."
  type        = number
}

variable "redis_node_type" {
  description = "Celery broker node type."
  type        = string
}

variable "redis_replicas" {
  description = "Broker replicas (0 = single node)."
  type        = number
}

variable "airflow_chart_version" {
  description = "Official Airflow Helm chart version."
  type        = string
}

variable "image_repository" {
  description = "The project's Airflow image repository."
  type        = string
}

variable "image_tag" {
  description = "Image tag (the commit deployed)."
  type        = string
}

variable "mlflow_image" {
  description = "MLflow server image, repository:tag."
  type        = string
}

variable "celery_workers" {
  description = "Celery worker replicas."
  type        = number
}

variable "api_replicas" {
  description = "Airflow API server replicas."
  type        = number
}

variable "downstream_environment" {
  description = "The environment this one hands its champion to (uat for sit, prod for uat); null for prod."
  type        = string
  default     = null
}

variable "downstream_consumer_role_arn" {
  description = "The downstream's Airflow pod role, the only one allowed to receive from this environment's hop queue; null = no downstream, no queue."
  type        = string
  default     = null
}

variable "upstream_queue_url" {
  description = "The upstream's hop queue (its hop_queue_url output) this environment's Airflow receives champion announcements from; null for sit."
  type        = string
  default     = null
}

variable "upstream_queue_arn" {
  description = "The ARN of upstream_queue_url (its hop_queue_arn output): this environment's pod role may receive from it, nothing more."
  type        = string
  default     = null
}

variable "upstream_registry_uri" {
  description = "The upstream's MLflow server as this environment's Airflow reaches it (uat: sit's, prod: uat's); CD4ML_UPSTREAM_REGISTRY_URI of the pods. null for sit."
  type        = string
  default     = null
}

variable "upstream_registry_secret_arn" {
  description = "The upstream's registry_reader_secret_arn output: its read-only registry account as this environment's Connection cd4ml_upstream_registry, which only this environment's pod role may read. null for sit."
  type        = string
  default     = null
}
