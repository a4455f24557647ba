"""The Spark session every job runs in, and the prerequisites it needs (Java, the JDBC jar)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Optional

from tidemq.errors import ConfigurationError

__all__ = ["DEFAULT_MASTER", "DEFAULT_JDBC_JAR", "JDBC_DRIVER", "check_prerequisites", "spark_session"]

DEFAULT_MASTER = "local[*]"
#: MariaDB Connector/J as Debian's libmariadb-java installs it.
DEFAULT_JDBC_JAR = "/usr/share/java/mariadb-java-client.jar"
JDBC_DRIVER = "org.mariadb.jdbc.Driver"


def check_prerequisites(jdbc_jar: str = DEFAULT_JDBC_JAR) -> str:
    """Return the ``java`` executable, or raise ConfigurationError naming the package to install."""
    java_home = os.environ.get("JAVA_HOME", "")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        raise ConfigurationError(
            "Java was not found (no java on PATH"
            + (f", and {java_home}/bin/java is not executable" if java_home else "")
            + "): Spark needs Java 17 or newer; install it with `apt-get install openjdk-17-jre-headless`"
            " or set JAVA_HOME"
        )
    try:
        subprocess.run([java, "-version"], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigurationError(f"{java} -version failed ({exc}): reinstall Java 17 "
                                 "(openjdk-17-jre-headless)") from None
    if not os.path.isfile(jdbc_jar):
        raise ConfigurationError(
            f"the MariaDB JDBC driver {jdbc_jar} is missing: install it with `apt-get install libmariadb-java`"
            " or pass --jdbc-jar PATH to a mariadb-java-client jar"
        )
    return java


def spark_session(master: Optional[str] = None, jdbc_jar: str = DEFAULT_JDBC_JAR, app: str = "tidemq-pipeline",
                  shuffle_partitions: int = 8):
    """Start (or join) the Spark session: ``master`` as given (default ``local[*]``), the JDBC jar
    on the class path, UTC everywhere (the message table stores naive UTC times), no web UI."""
    check_prerequisites(jdbc_jar)
    # Loopback unless told otherwise: a laptop's public interface may not route to itself.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # PySpark turns timestamps into Python datetimes in the process's local zone; the message
    # table holds naive UTC, so the job process runs in UTC like the JVM and the SQL session.
    os.environ["TZ"] = "UTC"
    time.tzset()
    from pyspark.sql import SparkSession

    utc = "-Duser.timezone=UTC"
    builder = SparkSession.builder.appName(app)
    # Under spark-submit (which starts the JVM and sets PYSPARK_GATEWAY_PORT) the master comes
    # from its --master unless one is given here too.
    if master or "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master(master or DEFAULT_MASTER)
    builder = (
        builder.config("spark.jars", jdbc_jar)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", utc)
        .config("spark.executor.extraJavaOptions", utc)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "true")
        # Partitioned writes keep one open file per (topic, day) instead of sorting each task.
        .config("spark.sql.maxConcurrentOutputFileWriters", "64")
    )
    if (master or DEFAULT_MASTER).startswith("local") and "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
