# Airflow (the official chart) and the MLflow tracking server on the cluster. Credentials reach
# the pods as Kubernetes Secrets filled from the other modules' outputs (Terraform state and
# Secrets Manager), never from a file in the repository.
resource "kubernetes_namespace" "this" {
  metadata {
    name = var.namespace
  }
}

resource "random_password" "webserver_secret" {
  length  = 48
  special = false
}

resource "random_password" "mlflow_admin" {
  length  = 32
  special = false
}

# The account scoring and serving sign in as: MLflow lets it read only (tasks/models/identity.py).
resource "random_password" "mlflow_reader" {
  length  = 32
  special = false
}

resource "kubernetes_secret" "airflow" {
  metadata {
    name      = "cd4ml-airflow"
    namespace = kubernetes_namespace.this.metadata[0].name
  }
  data = {
    connection               = var.database_uris["airflow"]
    broker-url               = var.broker_url
    api-secret-key           = random_password.webserver_secret.result
    mlflow-tracking-password = random_password.mlflow_admin.result
    mlflow-reader-password   = random_password.mlflow_reader.result
    optuna-storage           = var.database_uris["optuna"]
    mlflow-backend-store-uri = var.database_uris["mlflow"]
    mlflow-auth-database-uri = var.database_uris["mlflow_auth"]
    mlflow-flask-secret-key  = random_password.webserver_secret.result
  }
}

locals {
  reader_username = "cd4ml-reader"
  cd4ml_env = concat([
    { name = "CD4ML_ENV", value = var.environment },
    { name = "CD4ML_HOME", value = "/data/cd4ml" },
    { name = "MLFLOW_TRACKING_URI", value = "http://mlflow.${var.namespace}.svc:5000" },
    { name = "MLFLOW_TRACKING_USERNAME", value = "admin" },
    { name = "CD4ML_MLFLOW_READER_USERNAME", value = local.reader_username },
    { name = "AIRFLOW__CORE__AUTH_MANAGER", value = "cd4ml_airflow.auth.Cd4mlFabAuthManager" },
    { name = "AIRFLOW__CORE__HOSTNAME_CALLABLE", value = "cd4ml_airflow.hosts.worker_hostname" },
    { name = "AIRFLOW__CELERY__POOL", value = "solo" },
    { name = "AIRFLOW__SECRETS__BACKEND", value = "airflow.providers.amazon.aws.secrets.secrets_manager.SecretsManagerBackend" },
    { name = "AIRFLOW__SECRETS__BACKEND_KWARGS", value = jsonencode({ connections_prefix = var.connections_prefix }) },
    { name = "CD4ML_LAKE_URI", value = var.lake_uri },
    ], var.upstream_registry_uri == null ? [] : [
    # deploy_model: the upstream deployment's MLflow server (release.upstream_registry.tracking_uri)
    { name = "CD4ML_UPSTREAM_REGISTRY_URI", value = var.upstream_registry_uri },
    ], var.publish_queue_url == null ? [] : [
    # the hop queue this environment announces its champion on (release.publish, scheme sqs)
    { name = "CD4ML_PUBLISH_QUEUE_URL", value = var.publish_queue_url },
    ], var.upstream_queue_url == null ? [] : [
    # the upstream's hop queue cd4ml_promote's AssetWatcher receives from (release.upstream_event, scheme sqs)
    { name = "CD4ML_UPSTREAM_QUEUE_URL", value = var.upstream_queue_url },
  ])
  cd4ml_secret_env = [
    { name = "MLFLOW_TRACKING_PASSWORD", secretName = kubernetes_secret.airflow.metadata[0].name, secretKey = "mlflow-tracking-password" },
    { name = "CD4ML_MLFLOW_READER_PASSWORD", secretName = kubernetes_secret.airflow.metadata[0].name, secretKey = "mlflow-reader-password" },
    { name = "CD4ML_OPTUNA_STORAGE", secretName = kubernetes_secret.airflow.metadata[0].name, secretKey = "optuna-storage" },
  ]
}

resource "helm_release" "airflow" {
  name       = "airflow"
  namespace  = kubernetes_namespace.this.metadata[0].name
  repository = "https://airflow.apache.org"
  chart      = "airflow"
  version    = var.chart_version
  timeout    = 900
  values = [yamlencode({
    airflowVersion           = "3.3.2"
    defaultAirflowRepository = var.image_repository
    defaultAirflowTag        = var.image_tag
    executor                 = "CeleryExecutor"
    env                      = local.cd4ml_env
    secret                   = local.cd4ml_secret_env
    data = {
      metadataSecretName  = kubernetes_secret.airflow.metadata[0].name
      brokerUrlSecretName = kubernetes_secret.airflow.metadata[0].name
    }
    apiSecretKeySecretName = kubernetes_secret.airflow.metadata[0].name
    postgresql             = { enabled = false }
    redis                  = { enabled = false }
    workers = {
      replicas       = var.celery_workers
      serviceAccount = { annotations = { "eks.amazonaws.com/role-arn" = var.pod_role_arn } }
      nodeSelector   = { "cd4ml/pool" = "cpu" }
    }
    scheduler    = { serviceAccount = { annotations = { "eks.amazonaws.com/role-arn" = var.pod_role_arn } } }
    triggerer    = { serviceAccount = { annotations = { "eks.amazonaws.com/role-arn" = var.pod_role_arn } } }
    dagProcessor = { enabled = true }
    apiServer    = { replicas = var.api_replicas }
  })]
}

# MLflow tracking server with its basic-auth app: runs and registry on PostgreSQL, artifacts on S3.
resource "kubernetes_deployment" "mlflow" {
  metadata {
    name      = "mlflow"
    namespace = kubernetes_namespace.this.metadata[0].name
    labels    = { app = "mlflow" }
  }
  spec {
    replicas = 1
    selector {
      match_labels = { app = "mlflow" }
    }
    template {
      metadata {
        labels      = { app = "mlflow" }
        annotations = { "eks.amazonaws.com/role-arn" = var.pod_role_arn }
      }
      spec {
        container {
          name  = "mlflow"
          image = var.mlflow_image
          port {
            container_port = 5000
          }
          env {
            name  = "MLFLOW_ARTIFACTS_DESTINATION"
            value = var.artifacts_uri
          }
          env {
            name  = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
            value = "false"
          }
          dynamic "env" {
            for_each = {
              MLFLOW_BACKEND_STORE_URI       = "mlflow-backend-store-uri"
              MLFLOW_AUTH_DATABASE_URI       = "mlflow-auth-database-uri"
              MLFLOW_AUTH_ADMIN_PASSWORD     = "mlflow-tracking-password"
              MLFLOW_FLASK_SERVER_SECRET_KEY = "mlflow-flask-secret-key"
            }
            content {
              name = env.key
              value_from {
                secret_key_ref {
                  name = kubernetes_secret.airflow.metadata[0].name
                  key  = env.value
                }
              }
            }
          }
          readiness_probe {
            http_get {
              path = "/health"
              port = 5000
            }
          }
        }
      }
    }
  }
}

resource "kubernetes_service" "mlflow" {
  metadata {
    name      = "mlflow"
    namespace = kubernetes_namespace.this.metadata[0].name
  }
  spec {
    selector = { app = "mlflow" }
    port {
      port        = 5000
      target_port = 5000
    }
  }
}

# The read-only account scoring and serving sign in as, created (or its password set) by the MLflow
# admin once the server answers: python -m tasks.ops.registry_accounts, credentials from the Secret.
resource "kubernetes_job" "mlflow_reader" {
  metadata {
    name      = "cd4ml-mlflow-reader"
    namespace = kubernetes_namespace.this.metadata[0].name
  }
  spec {
    backoff_limit = 6
    template {
      metadata {}
      spec {
        restart_policy = "OnFailure"
        container {
          name    = "registry-accounts"
          image   = "${var.image_repository}:${var.image_tag}"
          command = ["python", "-m", "tasks.ops.registry_accounts"]
          dynamic "env" {
            for_each = { for e in local.cd4ml_env : e.name => e.value if can(regex("^(MLFLOW_|CD4ML_MLFLOW_)", e.name)) }
            content {
              name  = env.key
              value = env.value
            }
          }
          dynamic "env" {
            for_each = {
              MLFLOW_TRACKING_PASSWORD     = "mlflow-tracking-password"
              CD4ML_MLFLOW_READER_PASSWORD = "mlflow-reader-password"
            }
            content {
              name = env.key
              value_from {
                secret_key_ref {
                  name = kubernetes_secret.airflow.metadata[0].name
                  key  = env.value
                }
              }
            }
          }
        }
      }
    }
  }
  wait_for_completion = true
  depends_on          = [kubernetes_deployment.mlflow, kubernetes_service.mlflow]
}
