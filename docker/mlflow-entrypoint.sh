#!/usr/bin/env bash
# Start the MLflow server with its basic-auth app. The auth app reads its user store's URI only
# from an ini file, so the file is written here, at start, from the environment; the admin's
# password never lands in it (MLflow reads MLFLOW_AUTH_ADMIN_PASSWORD itself).
#   MLFLOW_BACKEND_STORE_URI        runs and registry, e.g. postgresql+psycopg2://mlflow:...@postgres/mlflow
#   MLFLOW_AUTH_DATABASE_URI        users and permissions, e.g. postgresql+psycopg2://.../mlflow_auth
#   MLFLOW_ARTIFACTS_DESTINATION    s3://bucket or a mounted path (default /mlartifacts)
#   MLFLOW_AUTH_ADMIN_USERNAME / MLFLOW_AUTH_ADMIN_PASSWORD   the first admin (created once)
#   MLFLOW_FLASK_SERVER_SECRET_KEY  CSRF key, the same on every replica
#   MLFLOW_AUTH_CACHE_TTL_SECONDS   how long a worker remembers a verified password (default 30; 0: a scrypt check
#                                   on every request). A password changed through the API is forgotten at once by
#                                   the worker that changed it, by the other workers after at most this long.
# CD4ML_MLFLOW_WRITE_CONFIG_ONLY=1 writes the ini, prints it and exits (used by the tests).
set -euo pipefail
: "${MLFLOW_BACKEND_STORE_URI:?set MLFLOW_BACKEND_STORE_URI}"
: "${MLFLOW_AUTH_DATABASE_URI:?set MLFLOW_AUTH_DATABASE_URI}"
config="${MLFLOW_AUTH_CONFIG_PATH:-/tmp/mlflow/basic_auth.ini}"
cache_ttl="${MLFLOW_AUTH_CACHE_TTL_SECONDS:-30}"
[[ "$cache_ttl" =~ ^[0-9]{1,5}$ ]] || { echo "MLFLOW_AUTH_CACHE_TTL_SECONDS must be 0-99999 seconds" >&2; exit 2; }
mkdir -p "$(dirname "$config")"
umask 077
cat > "$config" <<INI
[mlflow]
default_permission = READ
database_uri = ${MLFLOW_AUTH_DATABASE_URI}
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME:-admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = ${cache_ttl}
INI
if [[ "${CD4ML_MLFLOW_WRITE_CONFIG_ONLY:-0}" == "1" ]]; then
  cat "$config"
  exit 0
fi
: "${MLFLOW_FLASK_SERVER_SECRET_KEY:?set MLFLOW_FLASK_SERVER_SECRET_KEY}"
exec mlflow server --app-name basic-auth \
  --backend-store-uri "$MLFLOW_BACKEND_STORE_URI" \
  --artifacts-destination "${MLFLOW_ARTIFACTS_DESTINATION:-/mlartifacts}" \
  --host 0.0.0.0 --port 5000 --workers "${MLFLOW_WORKERS:-2}" \
  --allowed-hosts "${MLFLOW_ALLOWED_HOSTS:-mlflow,mlflow:5000,localhost,localhost:5000}"
