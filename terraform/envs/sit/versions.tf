terraform {
  required_version = ">= 1.6"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.80"
    }
    helm = {
      source  = "hashicorp/helm"
      version = "~> 2.16"
    }
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = "~> 2.35"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.6"
    }
  }
  # State per environment; the bucket and lock table are created once, by hand or a bootstrap stack.
  backend "s3" {
    bucket         = "cd4ml-terraform-state"
    key            = "cd4ml/sit/terraform.tfstate"
    region         = "eu-west-1"
    dynamodb_table = "cd4ml-terraform-locks"
    encrypt        = true
  }
}
