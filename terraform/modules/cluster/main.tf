# EKS: a CPU node group for Airflow (API server, scheduler, DAG processor, triggerer, Celery
# workers, MLflow) and a GPU node group for training pods (training.launcher: kubernetes).
# The GPU group is tainted, so only pods that tolerate nvidia.com/gpu (the trainer pod spec
# does) land there; it may scale to zero between trainings.
data "aws_iam_policy_document" "assume_eks" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["eks.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "assume_ec2" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "cluster" {
  name               = "${var.name_prefix}-eks"
  assume_role_policy = data.aws_iam_policy_document.assume_eks.json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "cluster" {
  role       = aws_iam_role.cluster.name
  policy_arn = "arn:aws:iam::aws:policy/AmazonEKSClusterPolicy"
}

resource "aws_iam_role" "nodes" {
  name               = "${var.name_prefix}-nodes"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "nodes" {
  for_each = toset([
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
  ])
  role       = aws_iam_role.nodes.name
  policy_arn = each.value
}

resource "aws_eks_cluster" "this" {
  name     = var.name_prefix
  version  = var.kubernetes_version
  role_arn = aws_iam_role.cluster.arn
  vpc_config {
    subnet_ids              = var.subnet_ids
    endpoint_private_access = true
    endpoint_public_access  = var.public_api
  }
  tags       = var.tags
  depends_on = [aws_iam_role_policy_attachment.cluster]
}

resource "aws_eks_node_group" "cpu" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "cpu"
  node_role_arn   = aws_iam_role.nodes.arn
  subnet_ids      = var.subnet_ids
  instance_types  = [var.cpu_instance_type]
  scaling_config {
    min_size     = var.cpu_nodes_min
    max_size     = var.cpu_nodes_max
    desired_size = var.cpu_nodes_min
  }
  labels     = { "cd4ml/pool" = "cpu" }
  tags       = var.tags
  depends_on = [aws_iam_role_policy_attachment.nodes]
}

resource "aws_eks_node_group" "gpu" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "gpu"
  node_role_arn   = aws_iam_role.nodes.arn
  subnet_ids      = var.subnet_ids
  instance_types  = [var.gpu_instance_type]
  ami_type        = "AL2023_x86_64_NVIDIA"
  scaling_config {
    min_size     = var.gpu_nodes_min
    max_size     = var.gpu_nodes_max
    desired_size = var.gpu_nodes_min
  }
  taint {
    key    = "nvidia.com/gpu"
    value  = "true"
    effect = "NO_SCHEDULE"
  }
  labels     = { "cd4ml/pool" = "gpu" }
  tags       = var.tags
  depends_on = [aws_iam_role_policy_attachment.nodes]
}

resource "aws_iam_openid_connect_provider" "this" {
  url             = aws_eks_cluster.this.identity[0].oidc[0].issuer
  client_id_list  = ["sts.amazonaws.com"]
  thumbprint_list = var.oidc_thumbprints
}
