variable "name_prefix" {
  description = "Prefix of every name, e.g. cd4ml-uat."
  type        = string
}

variable "noncurrent_version_days" {
  description = "Days an overwritten or deleted object version is kept."
  type        = number
}

variable "force_destroy" {
  description = "Allow destroying non-empty buckets (sit only)."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
