#!/usr/bin/env bash
# Installs what the integration tests run against, from Debian's packages, when missing:
# MariaDB (MySQL-compatible) with Galera and rsync (the 3-node cluster tests and their state
# transfers), ZooKeeper, the MariaDB JDBC driver (Spark), Java and Prometheus (with promtool).
set -euo pipefail
need=()
command -v mariadbd >/dev/null 2>&1 || need+=(mariadb-server)
[ -f /usr/lib/galera/libgalera_smm.so ] || need+=(galera-4)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
[ -f /usr/share/java/mariadb-java-client.jar ] || need+=(libmariadb-java)
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "servers: mariadbd $(mariadbd --version | awk '{print $3}'), galera $(ls /usr/lib/galera/libgalera_smm.so), zookeeper $(ls /usr/share/java/zookeeper.jar), $(prometheus --version 2>&1 | head -1)"
