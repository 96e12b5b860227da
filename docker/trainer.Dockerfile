# The cd4ml trainer image: what a `training.launcher: kubernetes` pod runs (`cd4ml train ...`,
# with torchrun over the pod's GPUs when it has more than one). No Airflow, no curation or
# validation libraries: only what tasks.training.train imports. torch comes as a CUDA build (the wheels
# carry the CUDA runtime, cuDNN and NCCL; the node only needs the NVIDIA driver), so the same
# image also trains on CPU nodes. Build from the repository root:
#   docker build -f docker/trainer.Dockerfile --build-arg GIT_COMMIT=$(git rev-parse HEAD) -t cd4ml-trainer:latest .
# Pick TORCH_INDEX for the nodes' driver (cu126, cu128, ...); https://download.pytorch.org/whl/cpu for a CPU-only image.
FROM python:3.11-slim-bookworm

ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG GIT_COMMIT=""

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CD4ML_HOME=/data/cd4ml \
    CD4ML_GIT_COMMIT=${GIT_COMMIT} \
    OMP_NUM_THREADS=1

WORKDIR /opt/cd4ml
COPY requirements.txt constraints.txt ./
# The trainer needs the pinned training stack, not the orchestration and curation one.
RUN grep -v -E '^(apache-airflow|fastdup|great-expectations|alibi-detect)==' requirements.txt > requirements-trainer.txt \
 && pip install --extra-index-url "${TORCH_INDEX}" -r requirements-trainer.txt

COPY pyproject.toml ./
COPY tasks ./tasks
COPY cd4ml_runtime ./cd4ml_runtime
COPY conf ./conf
RUN mkdir -p plugins/cd4ml_airflow && touch plugins/cd4ml_airflow/__init__.py \
 && pip install --no-deps -e . \
 && useradd --create-home --uid 50000 cd4ml \
 && mkdir -p /data/cd4ml && chown -R cd4ml /data/cd4ml
USER cd4ml

# CD4ML_ENV and the args come from the pod spec (tasks.training.train.trainer_pod_spec); MLFLOW_TRACKING_URI
# (and CD4ML_OPTUNA_STORAGE for tuning) from a Secret. /data/cd4ml is the state volume: the decode
# cache and the checkpoints a retried pod resumes from.
ENTRYPOINT ["cd4ml"]
CMD ["train", "--help"]
