variable "name_prefix" {
  description = "Prefix of every name, e.g. cd4ml-uat."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the cluster."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets for the cache."
  type        = list(string)
}

variable "client_security_group_ids" {
  description = "Security groups allowed to connect (the cluster's nodes)."
  type        = list(string)
}

variable "node_type" {
  description = "ElastiCache node type."
  type        = string
}

variable "replicas" {
  description = "Read replicas (0 = a single node; above 0 enables automatic failover)."
  type        = number
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
