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
           "TIDEMQ_ADMIN_PASSWORD": "quiet-river-stone-7"}
    metrics_port = free_port()
    proc = spawn("admin", TIDEMQ + ["admin", "--port", str(port), "--metrics-port", str(metrics_port)], env)
    base = f"http://127.0.0.1:{port}"
    opener = _opener()
    first = wait_until(lambda: _get(opener, base + "/cluster") or (proc.poll() is not None and ("exited",)), 30,
                       interval=0.1, what="console answering")
    assert first[0] == 200 and first[1].startswith(base + "/login"), proc.log_path.read_text()
    url, html = _sign_in(opener, base, "boss", "quiet-river-stone-7")
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
    # A new dev database holds password hashes: only its owner may read it.
    assert (tmp_path / "dev.sqlite3").stat().st_mode & 0o777 == 0o600


def _console(spawn, mysql_url, zk_hosts, *flags, before=(), name="admin"):
    port = free_port()
    env = {"TIDEMQ_DB_URL": mysql_url, "TIDEMQ_ZK_HOSTS": zk_hosts, "TIDEMQ_ADMIN_USER": "boss",
           "TIDEMQ_ADMIN_PASSWORD": "quiet-river-stone-7"}
    return port, spawn(name, TIDEMQ + [*before, "admin", "--port", str(port), *flags], env)


def test_tidemq_admin_serves_https_with_secure_host_only_cookies(spawn, mysql_url, zk_hosts, tmp_path):
    import ssl

    from tests.pki import Authority

    ca = Authority(tmp_path / "pki")
    pair = ca.server("console")
    port, proc = _console(spawn, mysql_url, zk_hosts, before=["--tls-cert", pair.cert, "--tls-key", pair.key])
    context = ssl.create_default_context(cafile=ca.ca)
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context),
                                         urllib.request.HTTPCookieProcessor(jar))
    base = f"https://127.0.0.1:{port}"
    first = wait_until(lambda: _get(opener, base + "/login") or (proc.poll() is not None and ("exited",)), 30,
                       interval=0.1, what="console answering over HTTPS")
    assert first[0] == 200, proc.log_path.read_text()
    fresh = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
    with fresh.open(base + "/login", timeout=5) as resp:
        # not Werkzeug's development server
        assert resp.headers.get("Server", "").startswith("tidemq-admin"), dict(resp.headers)
        cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith("__Host-tidemq_session=") and "Secure" in cookie and "HttpOnly" in cookie
    url, html = _sign_in(opener, base, "boss", "quiet-river-stone-7")
    assert url == base + "/" and "Dashboard" in html
    # Plain HTTP to the HTTPS port gets no page.
    assert _get(_opener(), f"http://127.0.0.1:{port}/login") is None or \
        _get(_opener(), f"http://127.0.0.1:{port}/login")[0] != 200


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return None


def test_tidemq_admin_refuses_plain_http_on_a_network_address(spawn, mysql_url, zk_hosts):
    port, proc = _console(spawn, mysql_url, zk_hosts, "--host", "0.0.0.0")
    assert proc.wait(60) == 2
    text = proc.log_path.read_text()
    assert "refusing to serve the console over plain HTTP" in text and "--tls-cert" in text and "--proxy" in text
    _, unreadable = _console(spawn, mysql_url, zk_hosts, before=["--tls-cert", "/nonexistent.pem", "--tls-key",
                                                                 "/nonexistent.key"], name="unreadable")
    assert unreadable.wait(60) == 2
    assert "TIDEMQ_TLS_CERT" in unreadable.log_path.read_text()


def test_behind_a_proxy_the_brake_keys_on_the_forwarded_client_address(spawn, mysql_url, zk_hosts):
    port, proc = _console(spawn, mysql_url, zk_hosts, "--proxy")
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: _get(_opener(), base + "/login") or proc.poll() is not None, 30, interval=0.1,
               what="console answering")
    assert proc.poll() is None, proc.log_path.read_text()

    def attempt(client_address, password):
        # The proxy speaks HTTPS to browsers: the Secure cookie comes back, as a browser sends it.
        headers = {"X-Forwarded-For": client_address, "X-Forwarded-Proto": "https"}
        with urllib.request.urlopen(urllib.request.Request(base + "/login", headers=headers), timeout=5) as resp:
            html, cookie = resp.read().decode(), resp.headers["Set-Cookie"]
        body = urllib.parse.urlencode({"csrf_token": csrf_of(html), "name": "boss", "password": password}).encode()
        request = urllib.request.Request(base + "/login", data=body,
                                         headers={**headers, "Cookie": cookie.split(";")[0]})
        no_redirect = urllib.request.build_opener(_NoRedirect)
        try:
            with no_redirect.open(request, timeout=5) as resp:
                return resp.status, cookie
        except urllib.error.HTTPError as exc:
            return exc.code, cookie

    codes = [attempt("203.0.113.1", f"wrong-guess-{i}")[0] for i in range(4)]
    assert codes == [401, 401, 401, 429]
    # The same proxy, another client: not locked out by the first one's guesses.
    status, cookie = attempt("203.0.113.2", "quiet-river-stone-7")
    assert status == 302  # signed in: redirected to the dashboard
    assert "Secure" in cookie and cookie.startswith("__Host-")
