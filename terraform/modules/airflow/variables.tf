variable "environment" {
  description = "sit, uat or prod (CD4ML_ENV: picks conf/<env>.yaml)."
  type        = string
}

variable "namespace" {
  description = "Kubernetes namespace for Airflow, MLflow and the trainer pods."
  type        = string
}

variable "chart_version" {
  description = "Version of the official Apache Airflow Helm chart."
  type        = string
}

variable "image_repository" {
  description = "The project's Airflow image (docker/Dockerfile)."
  type        = string
}

variable "image_tag" {
  description = "Tag of that image (the git commit it was built from)."
  type        = string
}

variable "mlflow_image" {
  description = "The MLflow server image (docker/mlflow.Dockerfile), repository:tag."
  type        = string
}

variable "celery_workers" {
  description = "Celery worker replicas (one task each: solo pool)."
  type        = number
}

variable "api_replicas" {
  description = "Airflow API server replicas."
  type        = number
}

variable "database_uris" {
  description = "SQLAlchemy URIs of the airflow, mlflow, mlflow_auth and optuna databases."
  type        = map(string)
  sensitive   = true
}

variable "broker_url" {
  description = "Celery broker URL."
  type        = string
  sensitive   = true
}

variable "lake_uri" {
  description = "The Delta lake's URI (storage.lake_uri)."
  type        = string
}

variable "artifacts_uri" {
  description = "The MLflow server's artifact destination."
  type        = string
}

variable "pod_role_arn" {
  description = "IAM role the pods assume (IRSA)."
  type        = string
}

variable "connections_prefix" {
  description = "Secrets Manager prefix of Airflow Connections."
  type        = string
}

variable "upstream_registry_uri" {
  description = "The upstream deployment's MLflow server this one imports from (CD4ML_UPSTREAM_REGISTRY_URI); null = none (sit)."
  type        = string
  default     = null
}

variable "publish_queue_url" {
  description = "This environment's hop queue (CD4ML_PUBLISH_QUEUE_URL: release.publish over SQS); null = no downstream (prod)."
  type        = string
  default     = null
}

variable "upstream_queue_url" {
  description = "The upstream's hop queue (CD4ML_UPSTREAM_QUEUE_URL: release.upstream_event over SQS); null = no upstream (sit)."
  type        = string
  default     = null
}
