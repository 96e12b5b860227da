variable "name_prefix" {
  description = "Prefix of every name, e.g. cd4ml-uat."
  type        = string
}

variable "namespace" {
  description = "Kubernetes namespace of Airflow and the trainer pods."
  type        = string
}

variable "oidc_provider_arn" {
  description = "The cluster's OIDC provider (IRSA)."
  type        = string
}

variable "oidc_issuer" {
  description = "The cluster's OIDC issuer without https://."
  type        = string
}

variable "bucket_arns" {
  description = "Buckets the pods read and write."
  type        = list(string)
}

variable "kms_key_arn" {
  description = "Key the buckets are encrypted with."
  type        = string
}

variable "extra_secret_arns" {
  description = "Other secrets the pods may read (database and broker credentials)."
  type        = list(string)
  default     = []
}

variable "queue_receive_arns" {
  description = "Queues the pods may receive from: the upstream's hop queue (the release hand-off), none in sit."
  type        = list(string)
  default     = []
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
