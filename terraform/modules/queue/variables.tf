variable "name_prefix" {
  description = "Prefix of every name: the upstream environment's, e.g. cd4ml-sit."
  type        = string
}

variable "downstream" {
  description = "The environment that receives (uat or prod)."
  type        = string
}

variable "publisher_role_arn" {
  description = "The upstream's Airflow pod role: the only principal that may send."
  type        = string
}

variable "consumer_role_arn" {
  description = "The downstream's Airflow pod role: the only principal that may receive."
  type        = string
}

variable "retention_seconds" {
  description = "How long an unreceived announcement is kept (the reconcile covers what expires)."
  type        = number
  default     = 345600
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
