variable "name_prefix" {
  description = "Prefix of every name, e.g. cd4ml-uat."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the cluster."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets for the database."
  type        = list(string)
}

variable "client_security_group_ids" {
  description = "Security groups allowed to connect (the cluster's nodes)."
  type        = list(string)
}

variable "instance_class" {
  description = "RDS instance class."
  type        = string
}

variable "allocated_storage_gb" {
  description = "Initial storage; autoscaling goes up to four times this."
  type        = number
}

variable "multi_az" {
  description = "A standby in a second availability zone."
  type        = bool
}

variable "deletion_protection" {
  description = "Refuse to delete the instance (and keep a final snapshot)."
  type        = bool
}

variable "backup_retention_days" {
  description = "Days of automated backups."
  type        = number
}

variable "master_username" {
  description = "The administrator's name (its password is generated)."
  type        = string
  default     = "cd4ml_admin"
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
