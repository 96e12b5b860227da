variable "name_prefix" {
  description = "Prefix of every name, e.g. cd4ml-uat (also the cluster's name)."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets for the control plane and the nodes."
  type        = list(string)
}

variable "kubernetes_version" {
  description = "EKS Kubernetes version."
  type        = string
}

variable "public_api" {
  description = "Expose the Kubernetes API endpoint publicly (otherwise VPC only)."
  type        = bool
  default     = false
}

variable "cpu_instance_type" {
  description = "Instance type of the Airflow node group."
  type        = string
}

variable "cpu_nodes_min" {
  description = "Minimum (and initial) CPU nodes."
  type        = number
}

variable "cpu_nodes_max" {
  description = "Maximum CPU nodes."
  type        = number
}

variable "gpu_instance_type" {
  description = "Instance type of the training node group (e.g. g5.xlarge)."
  type        = string
}

variable "gpu_nodes_min" {
  description = "Minimum GPU nodes (0 = scale to zero between trainings)."
  type        = number
}

variable "gpu_nodes_max" {
  description = "Maximum GPU nodes."
  type        = number
}

variable "oidc_thumbprints" {
  description = "Thumbprints of the cluster's OIDC issuer certificate chain (IRSA)."
  type        = list(string)
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
