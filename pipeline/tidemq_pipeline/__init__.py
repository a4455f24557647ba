"""tidemq's data pipeline on Spark: archive finished messages to Parquet, per-topic hourly
reports, alarms, and requeue of archived dead letters.

Each job is a module (``archive``, ``report``, ``alarm``, ``restore``) with a ``run_*`` function
taking a SparkSession; the pure DataFrame transforms they use live in ``frames``, ``stats`` and
``rules``; every SQL statement the pipeline sends to MySQL is in ``store``.
"""

from __future__ import annotations

__all__ = ["JOBS"]

#: The jobs ``tidemq pipeline`` runs.
JOBS = ("archive", "report", "alarm", "restore")
