#!/usr/bin/env bash
# Runs once, on an empty PostgreSQL volume: one database and one user per consumer. Passwords come
# from the container's environment (docker/.env), never from this file.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username postgres <<SQL
CREATE USER airflow WITH PASSWORD '${AIRFLOW_DB_PASSWORD}';
CREATE DATABASE airflow OWNER airflow;
CREATE USER mlflow WITH PASSWORD '${MLFLOW_DB_PASSWORD}';
CREATE DATABASE mlflow OWNER mlflow;
CREATE DATABASE mlflow_auth OWNER mlflow;
CREATE USER optuna WITH PASSWORD '${OPTUNA_DB_PASSWORD}';
CREATE DATABASE optuna OWNER optuna;
SQL
