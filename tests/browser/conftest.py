"""Real headless Chromium (Debian's package) driven by Playwright against a served console.

`playwright install` cannot download here, so the browser is /usr/bin/chromium given as
``executable_path``. A missing browser fails these tests; they never skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidemq.config import Settings

CHROMIUM = os.environ.get("TIDEMQ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ADMIN, VIEWER, PASSWORD = "ops", "watcher", "correct-horse-9"
ROOT = Path(__file__).resolve().parents[2]


# Package scope, not session: playwright's sync API keeps its event loop running in the main
# thread until it exits, and asyncio tests (pytest-asyncio) after it could then start none.
@pytest.fixture(scope="package")
def chromium():
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing: install Debian's chromium (make servers)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def console(mysql_url, zk_hosts):
    """The console served over HTTP on a free port, on the test's MariaDB and ZooKeeper chroot."""
    from tidemq_admin import create_app
    from tidemq_admin.accounts import add_user
    from tidemq_admin.cli import serve

    settings = Settings.from_env({}, db_url=mysql_url, zk_hosts=zk_hosts, admin_user=ADMIN, admin_password=PASSWORD)
    app = create_app(settings)
    add_user(app.extensions["tidemq"].storage.console, VIEWER, PASSWORD, "viewer")
    server = serve(app, "127.0.0.1", 0)
    app.base_url = f"http://127.0.0.1:{server.port}"
    yield app
    server.shutdown()
    app.extensions["tidemq"].cluster.close()
    app.extensions["tidemq"].storage.close()


@pytest.fixture
def page(chromium):
    context = chromium.new_context(viewport={"width": 1366, "height": 860})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


@pytest.fixture
def shots(tmp_path):
    """Where screenshots go: docs/screenshots/ under `make screenshots`, else the test's tmp dir."""
    target = os.environ.get("TIDEMQ_SCREENSHOT_DIR")
    folder = (ROOT / target) if target and not os.path.isabs(target) else Path(target or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 5000  # a real rendering, not a blank page
        return path

    return take


def sign_in(page, base_url: str, name: str = ADMIN) -> None:
    page.goto(base_url + "/")
    page.fill("input[name=name]", name)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("header.top")
