"""Errors that retrying cannot fix: the data or the configuration is wrong, not the infrastructure.

The DAGs fail such a task at once (no retries) and page on-call; anything else (a lost
connection, a full disk) is retried with back-off.
"""


class DataError(Exception):
    """Base for deterministic failures caused by the data or by the configuration."""
