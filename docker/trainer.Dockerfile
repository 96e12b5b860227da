# The cd4ml trainer image: what a `training.launcher: kubernetes` pod runs (`cd4ml train ...`,
# torchrun over the pod's GPUs when it has more than one). No Airflow, no curation or validation
# libraries: only what tasks.training.train imports.
# CUDA: the PyTorch cu128 wheels carry the CUDA runtime, cuDNN and NCCL, so the base needs only
# Python; the node needs an NVIDIA driver >= 570 (the GPU node group's AL2023_x86_64_NVIDIA AMI
# has it) and the pod a `nvidia.com/gpu` limit. A python base instead of nvidia/cuda keeps one
# copy of the CUDA libraries (the wheels') and the image 3 GB smaller.
# Build from the repository root:
#   docker build -f docker/trainer.Dockerfile --build-arg GIT_COMMIT=$(git rev-parse HEAD) -t cd4ml-trainer .
FROM python:3.11.11-slim-bookworm

ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG GIT_COMMIT=""

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CD4ML_HOME=/data/cd4ml \
    CD4ML_GIT_COMMIT=${GIT_COMMIT} \
    OMP_NUM_THREADS=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

WORKDIR /opt/cd4ml
COPY requirements.txt constraints.txt ./
# The pinned training stack, not the orchestration, curation and drift one (fastdup and alibi-detect
# have their own files, alibi-detect's requirements are requirements.txt's last block); torch 2.13.0
# from the CUDA index.
RUN sed -e '/^# alibi-detect 0.13.0.s requirements/,$d' \
        -e '/^\(apache-airflow\|great-expectations\|asyncpg\|celery\)/d' requirements.txt \
      > requirements-trainer.txt \
 && pip install --no-cache-dir --extra-index-url "${TORCH_INDEX}" -r requirements-trainer.txt

COPY pyproject.toml ./
COPY tasks ./tasks
COPY cd4ml_runtime ./cd4ml_runtime
COPY conf ./conf
COPY plugins/cd4ml_airflow/__init__.py ./plugins/cd4ml_airflow/__init__.py
RUN pip install --no-cache-dir --no-deps . \
 && useradd --create-home --uid 50000 cd4ml \
 && mkdir -p /data/cd4ml \
 && chown -R cd4ml /data/cd4ml
USER 50000

# CD4ML_ENV and the arguments come from the pod spec (tasks.training.train.trainer_pod_spec);
# MLFLOW_TRACKING_URI and its credentials (and CD4ML_OPTUNA_STORAGE for tuning) from a Secret.
# /data/cd4ml is the state volume: the decode cache and the checkpoints a retried pod resumes from.
ENTRYPOINT ["cd4ml"]
CMD ["train", "--help"]
