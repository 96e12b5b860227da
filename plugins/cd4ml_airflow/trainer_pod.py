"""The KubernetesPodOperator that runs training in the trainer image (``training.launcher: kubernetes``).

The static parts of the pod (image, resources, the state volume, the secret) come from the
settings at parse time; the per-run parts (pod name, ``cd4ml train`` arguments with the
curated version and tuned parameters) come from the ``trainer_pod`` task's XCom at run time.
The pod writes its ``TrainResult`` to /airflow/xcom/return.json, so the gate reads it as if
training had run in the task process.
"""

from __future__ import annotations

from tasks.settings import Settings

POD_SPEC = "ti.xcom_pull(task_ids='trainer_pod')"


def trainer_operator(settings: Settings, task_id: str = "train"):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from airflow.providers.cncf.kubernetes.secret import Secret
    from kubernetes.client import models as k8s

    from tasks.training.train import trainer_pod_spec

    static = trainer_pod_spec(settings, curated_table=settings.curated_table, curated_version=0,
                              run_id="parse", logical_date="")
    k = settings.training.kubernetes
    return KubernetesPodOperator(
        task_id=task_id,
        name="{{ " + POD_SPEC + "['name'] }}",
        namespace=static.namespace,
        image=static.image,
        cmds=static.cmds,
        arguments="{{ " + POD_SPEC + "['arguments'] }}",
        env_vars=static.env_vars,
        secrets=[Secret("env", name, k.secret_name, name) for name in static.secret_env],
        labels=static.labels,
        container_resources=k8s.V1ResourceRequirements(**static.resources),
        volumes=[k8s.V1Volume(name="cd4ml-state", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
            claim_name=static.state_pvc))],
        volume_mounts=[k8s.V1VolumeMount(name="cd4ml-state", mount_path=static.mount_path)],
        service_account_name=static.service_account,
        do_xcom_push=True,
        get_logs=True,
        on_finish_action="delete_pod",
    )
