#!/usr/bin/env bash
# Installs what only the benchmark needs, when missing: redis-server from Debian (the peers'
# broker) and the project's `bench` extra (Celery, RQ, redis-py, py-spy).
set -euo pipefail
PY=${PY:-.venv/bin/python}
if ! command -v redis-server >/dev/null 2>&1; then
  echo "installing redis-server"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-server >/dev/null
fi
"$PY" -c "import celery, redis, rq" 2>/dev/null || "$PY" -m pip install --quiet -e '.[all,test,bench]'
echo "bench: $(redis-server --version | awk '{print $1, $2, $3}'), celery $("$PY" -c 'import celery; print(celery.__version__)'), rq $("$PY" -c 'import rq; print(rq.__version__)')"
