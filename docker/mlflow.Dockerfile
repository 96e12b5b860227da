# The MLflow tracking server: tracking and registry on PostgreSQL, users in the basic-auth app's
# store (PostgreSQL), artifacts proxied to S3 (or a volume). Build from the repository root:
#   docker build -f docker/mlflow.Dockerfile -t cd4ml-mlflow:3.17.2 .
FROM python:3.11.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
    MLFLOW_AUTH_CONFIG_PATH=/tmp/mlflow/basic_auth.ini

# mlflow and psycopg2 at the project's pins (requirements.txt); Flask-WTF is the auth app's extra.
RUN pip install --no-cache-dir "mlflow[auth]==3.17.2" "psycopg2-binary==2.9.13" "boto3==1.44.8" \
 && useradd --create-home --uid 50001 mlflow \
 && mkdir -p /tmp/mlflow /mlartifacts \
 && chown mlflow /tmp/mlflow /mlartifacts
COPY --chmod=755 docker/mlflow-entrypoint.sh /usr/local/bin/mlflow-entrypoint.sh
USER 50001
EXPOSE 5000
HEALTHCHECK --interval=15s --timeout=5s --retries=5 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:5000/health', timeout=4)"]

# Everything secret comes from the environment at start (the entrypoint says which).
ENTRYPOINT ["/usr/local/bin/mlflow-entrypoint.sh"]
