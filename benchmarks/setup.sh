#!/usr/bin/env bash
# Installs what only the benchmark needs, when missing: redis-server (the Redis peers' broker) and
# postgresql (the durable peers' database) from Debian, and the project's `bench` extra (Celery,
# RQ, redis-py, PGQueuer, procrastinate, their PostgreSQL drivers, py-spy).
set -euo pipefail
PY=${PY:-.venv/bin/python}
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
"$PY" -c "import celery, redis, rq, pgqueuer, procrastinate, asyncpg, psycopg, psycopg_pool" 2>/dev/null \
  || "$PY" -m pip install --quiet -e '.[all,test,bench]'
PG=$(ls -d /usr/lib/postgresql/*/bin/postgres | sort -V | tail -1)
echo "bench: $(redis-server --version | awk '{print $1, $2, $3}'), $("$PG" --version), celery $("$PY" -c 'import celery; print(celery.__version__)'), rq $("$PY" -c 'import rq; print(rq.__version__)'), pgqueuer $("$PY" -c 'import pgqueuer; print(pgqueuer.__version__)'), procrastinate $("$PY" -c 'import procrastinate; print(procrastinate.__version__)')"
