"""
### cd4ml_ingest: landing folder -> versioned `raw_images` Delta table -> validation

1. **ingest**: every file below the landing folder (`<label>/<file>`) is hashed (sha256 of
   the bytes), fully decoded and checked; new images are MERGEd into `raw_images` (one Delta
   version per run that adds something), bad files go to the `rejects` table with a reason.
   An empty landing folder skips the run with a message and writes no version.
2. **validate**: a great-expectations suite over that raw version; thresholds come from the
   environment's settings. Only a passing version is published on the `raw_images` Asset,
   which triggers `cd4ml_curate`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from cd4ml_airflow.assets import RAW_IMAGES
from cd4ml_airflow.context import fail_fast_on_data_errors, logical_date_of
from cd4ml_airflow.defaults import dag_kwargs


@dag(
    schedule="@daily",
    params={
        "landing_uri": Param(
            None, type=["null", "string"], description="Folder to ingest; empty = the environment's landing_uri."
        ),
    },
    **dag_kwargs(["ingest", "validation"], __doc__),
)
def cd4ml_ingest():
    @task
    def ingest(**context) -> dict:
        """Hash, decode and MERGE new images; quarantine bad files."""
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from tasks.ingest import EmptyLandingError, ingest_landing
        from tasks.settings import load_settings

        try:
            result = ingest_landing(
                load_settings(),
                run_id=context["run_id"],
                logical_date=logical_date_of(context),
                landing=context["params"]["landing_uri"],
            )
        except EmptyLandingError as exc:
            raise AirflowSkipException(str(exc)) from exc
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise AirflowFailException(str(exc)) from exc  # a wrong path will not fix itself on retry
        return result.to_dict()

    @task(outlets=[RAW_IMAGES])
    def validate(batch: dict, *, outlet_events=None, **context) -> dict:
        """great-expectations suite on the raw version; publishes it only when it passes."""
        from tasks.settings import load_settings
        from tasks.validate import validate_batch

        with fail_fast_on_data_errors():
            result = validate_batch(
                load_settings(),
                raw_version=batch["raw_version"],
                files_seen=batch["files_seen"],
                rejected=batch["rejected"],
                run_id=context["run_id"],
            )
        print(f"validation report: {result.report_path}  data docs: {result.docs_path}")
        outlet_events[RAW_IMAGES].extra = {"raw_table": batch["raw_table"], "raw_version": batch["raw_version"]}
        return result.to_dict()

    validate(ingest())


cd4ml_ingest()
