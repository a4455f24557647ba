"""``tidemq pipeline archive|report|alarm|restore [--master URL] ...``.

The same jobs run under spark-submit, whose --master then applies::

    spark-submit --master spark://host:7077 --jars /usr/share/java/mariadb-java-client.jar \
        "$(python -c 'import tidemq_pipeline.cli as c; print(c.__file__)')" archive --archive hdfs:///tidemq
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional, Sequence

from tidemq.config import Settings
from tidemq.errors import TidemqError
from tidemq.lifecycle import ARCHIVABLE_STATUSES, MessageStatus

from .database import Database
from .progress import JobSummary
from .session import DEFAULT_JDBC_JAR, DEFAULT_MASTER

__all__ = ["register", "main"]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", help=f"Spark master URL (default {DEFAULT_MASTER}; e.g. spark://host:7077, yarn)")
    parser.add_argument("--jdbc-jar", default=DEFAULT_JDBC_JAR,
                        help="MariaDB Connector/J jar (Debian: libmariadb-java)")


def _archive_path(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--archive", required=required, metavar="PATH",
                        help="archive root on any Hadoop-compatible file system (file:///..., hdfs://..., s3a://...)")


def register(subparsers) -> None:
    """Add ``pipeline`` and its jobs to the ``tidemq`` command."""
    pipeline = subparsers.add_parser("pipeline", help="Spark jobs: archive, report, alarm, restore")
    jobs = pipeline.add_subparsers(dest="job", required=True)

    archive = jobs.add_parser("archive", help="move finished messages past their retention to Parquet")
    _common(archive)
    _archive_path(archive, True)
    archive.add_argument("--batch-rows", type=int, default=500_000, help="ids per batch (one manifest row each)")
    archive.add_argument("--partitions", type=int, help="parallel JDBC reads per batch (default: Spark's parallelism)")
    archive.add_argument("--min-age", type=float, default=60.0,
                         help="seconds a message stays after finishing, at least")

    report = jobs.add_parser("report", help="hourly per-topic statistics into tidemq_topic_stats")
    _common(report)
    _archive_path(report, False)
    report.add_argument("--since", help="only write hours from this UTC time on (default: all)")

    alarm = jobs.add_parser("alarm", help="raise alarms for topics over their thresholds")
    _common(alarm)
    alarm.add_argument("--window", type=float, default=3600.0, help="seconds of history for the failure rate")
    alarm.add_argument("--lease-grace", type=float, default=60.0,
                       help="seconds past a lease before it counts as overrun")
    alarm.add_argument("--webhook", help="POST raised alarms as JSON to this URL")
    alarm.add_argument("--smtp", metavar="HOST[:PORT]", help="mail raised alarms through this SMTP server")
    alarm.add_argument("--mail-from", help="sender address for --smtp")
    alarm.add_argument("--mail-to", action="append", default=[], help="recipient for --smtp (repeatable)")

    restore = jobs.add_parser("restore", help="put archived messages back as NEW (requeue dead letters)")
    _common(restore)
    _archive_path(restore, True)
    restore.add_argument("--topic", required=True)
    restore.add_argument("--status", default=MessageStatus.FAIL.value,
                         help=f"{' or '.join(s.value for s in ARCHIVABLE_STATUSES)} "
                              f"(default {MessageStatus.FAIL.value})")
    restore.add_argument("--since", help="finished at or after this UTC time, e.g. 2024-03-01T12:00:00")
    restore.add_argument("--until", help="finished before this UTC time")
    restore.add_argument("--retry", type=int, default=0, help="retries the restored messages get")

    pipeline.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run the job named by ``args.job``; print its summary line; 0 on success."""
    from .restore import parse_time
    from .session import spark_session

    db = Database.from_url(settings.db_url)
    since = parse_time(getattr(args, "since", None), "--since")
    until = parse_time(getattr(args, "until", None), "--until")
    spark = spark_session(args.master, args.jdbc_jar, app=f"tidemq-pipeline-{args.job}")
    summary = JobSummary(args.job)
    summary.progress(f"spark master {spark.sparkContext.master}, database {db.describe()}")
    try:
        if args.job == "archive":
            from .archive import run_archive

            run_archive(spark, db, args.archive, args.batch_rows, args.partitions, args.min_age, summary)
        elif args.job == "report":
            from .report import run_report

            run_report(spark, db, args.archive, since, summary)
        elif args.job == "alarm":
            from .alarm import run_alarm
            from .notifiers import build_notifiers

            notifiers = build_notifiers(args.webhook, args.smtp, args.mail_from, args.mail_to)
            run_alarm(spark, db, notifiers, args.window, args.lease_grace, summary)
        else:
            from .restore import run_restore

            run_restore(spark, db, args.archive, args.topic, args.status.upper(), since, until, args.retry, summary)
    finally:
        spark.stop()
    print(summary.line(), flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m tidemq_pipeline.cli JOB ...`` (what spark-submit runs)."""
    parser = argparse.ArgumentParser(prog="tidemq-pipeline")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pipeline", *(argv if argv is not None else sys.argv[1:])])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args, Settings.from_env())
    except TidemqError as exc:
        print(f"tidemq pipeline: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
