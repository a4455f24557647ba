"""`tidemq admin` and `tidemq dev` serve the console as real processes."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request

from tests.admin.conftest import csrf_of
from tests.processes import TIDEMQ
from tests.servers import free_port, wait_until


def _opener():
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))


def _get(opener, url):
    try:
        with opener.open(url, timeout=5) as resp:
            return resp.status, resp.geturl(), resp.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None


def _sign_in(opener, base, name, password):
    status, url, html = _get(opener, base + "/login")
    body = urllib.parse.urlencode({"csrf_token": csrf_of(html), "name": name, "password": password}).encode()
    with opener.open(base + "/login", data=body, timeout=5) as resp:
        return resp.geturl(), resp.read().decode()


def test_tidemq_admin_serves_the_console(spawn, mysql_url, zk_hosts):
    port = free_port()
    env = {"TIDEMQ_DB_URL": mysql_url, "TIDEMQ_ZK_HOSTS": zk_hosts, "TIDEMQ_ADMIN_USER": "boss",
           "TIDEMQ_ADMIN_PASSWORD": "boss-password"}
    metrics_port = free_port()
    proc = spawn("admin", TIDEMQ + ["admin", "--port", str(port), "--metrics-port", str(metrics_port)], env)
    base = f"http://127.0.0.1:{port}"
    opener = _opener()
    first = wait_until(lambda: _get(opener, base + "/cluster") or (proc.poll() is not None and ("exited",)), 30,
                       interval=0.1, what="console answering")
    assert first[0] == 200 and first[1].startswith(base + "/login"), proc.log_path.read_text()
    url, html = _sign_in(opener, base, "boss", "boss-password")
    assert url == base + "/" and "Dashboard" in html
    # Its Prometheus endpoint, outside the login: requests by view (never by path), process figures.
    _, _, metrics = _get(_opener(), f"http://127.0.0.1:{metrics_port}/metrics")
    assert 'tidemq_console_requests_total{code="200",endpoint="dashboard.index"}' in metrics, metrics
    assert "process_cpu_seconds_total" in metrics


def test_tidemq_dev_serves_the_console_and_prints_how_to_sign_in(spawn, tmp_path):
    port = free_port()
    proc = spawn("dev", TIDEMQ + ["dev", "--db", str(tmp_path / "dev.sqlite3"), "--port", "0",
                                  "--admin-port", str(port)], {"TIDEMQ_ADMIN_USER": "", "TIDEMQ_ZK_HOSTS": ""})

    def printed():
        text = proc.log_path.read_text()
        assert proc.poll() is None, text
        return re.search(r"console user admin, password (\S+)", text) and f"http://127.0.0.1:{port}/" in text and text

    text = wait_until(printed, 60, interval=0.1, what="dev console URL printed")
    password = re.search(r"console user admin, password (\S+)", text).group(1)
    url, html = _sign_in(_opener(), f"http://127.0.0.1:{port}", "admin", password)
    assert "Dashboard" in html
