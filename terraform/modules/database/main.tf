# One PostgreSQL instance for Airflow's metadata DB, MLflow's tracking/registry and user stores,
# and the Optuna study (separate databases: cd4ml_airflow, cd4ml_mlflow, cd4ml_mlflow_auth,
# cd4ml_optuna, created by the Airflow chart's migration job and `cd4ml up`'s bootstrap).
# The master password is generated here and kept in Secrets Manager, never in a file.
resource "random_password" "master" {
  length  = 32
  special = false
}

resource "aws_secretsmanager_secret" "master" {
  name                    = "${var.name_prefix}/postgres/master"
  recovery_window_in_days = var.deletion_protection ? 30 : 0
  tags                    = var.tags
}

resource "aws_secretsmanager_secret_version" "master" {
  secret_id = aws_secretsmanager_secret.master.id
  secret_string = jsonencode({
    username = var.master_username
    password = random_password.master.result
    host     = aws_db_instance.this.address
    port     = aws_db_instance.this.port
  })
}

resource "aws_db_subnet_group" "this" {
  name       = "${var.name_prefix}-postgres"
  subnet_ids = var.subnet_ids
  tags       = var.tags
}

resource "aws_security_group" "this" {
  name        = "${var.name_prefix}-postgres"
  description = "PostgreSQL from the cluster only"
  vpc_id      = var.vpc_id
  ingress {
    from_port       = 5432
    to_port         = 5432
    protocol        = "tcp"
    security_groups = var.client_security_group_ids
  }
  tags = var.tags
}

resource "aws_db_instance" "this" {
  identifier                   = "${var.name_prefix}-postgres"
  engine                       = "postgres"
  engine_version               = "16"
  instance_class               = var.instance_class
  allocated_storage            = var.allocated_storage_gb
  max_allocated_storage        = var.allocated_storage_gb * 4
  storage_encrypted            = true
  username                     = var.master_username
  password                     = random_password.master.result
  db_subnet_group_name         = aws_db_subnet_group.this.name
  vpc_security_group_ids       = [aws_security_group.this.id]
  multi_az                     = var.multi_az
  deletion_protection          = var.deletion_protection
  backup_retention_period      = var.backup_retention_days
  skip_final_snapshot          = !var.deletion_protection
  final_snapshot_identifier    = var.deletion_protection ? "${var.name_prefix}-postgres-final" : null
  performance_insights_enabled = true
  auto_minor_version_upgrade   = true
  tags                         = var.tags
}
