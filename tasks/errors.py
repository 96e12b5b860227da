"""Errors that describe the data, not the infrastructure: retrying cannot fix them.

The DAGs fail such a task at once (no retries) and page on-call; anything else (a lost
connection, a full disk) is retried with back-off.
"""


class DataError(Exception):
    """Base for deterministic, data-caused failures."""
