variable "name_prefix" {
  description = "Prefix of this (the upstream) environment's names, e.g. cd4ml-sit."
  type        = string
}

variable "downstream" {
  description = "The environment that imports from this one (uat for sit, prod for uat)."
  type        = string
}

variable "consumer_role_arn" {
  description = "The downstream's Airflow pod role: the only principal that may read the secret."
  type        = string
}

variable "conn_id" {
  description = "The downstream's Connection id for the upstream registry (release.upstream_registry.conn_id)."
  type        = string
  default     = "cd4ml_upstream_registry"
}

variable "reader_username" {
  description = "The read-only account of this environment's MLflow server."
  type        = string
}

variable "reader_password" {
  description = "Its password (the airflow module's generated one)."
  type        = string
  sensitive   = true
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
