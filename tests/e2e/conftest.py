"""Playwright against Debian's Chromium (headless), driving pytest-django's live server."""

import os
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in this thread; the ORM calls that tests make
# between browser steps are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = os.environ.get("ACTHELM_CHROMIUM", "/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "docs" / "screenshots"
PASSWORD = "pw"  # tests.factories.UserFactory's password


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server, transactional_db):
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": 1280, "height": 900}, locale="en-US"
    )
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def login(page):
    """Log in through the admin's login page, as a person would."""

    def log_in(username: str, password: str = PASSWORD):
        page.goto("/admin/login/?next=/")
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_url("**/")
        return page

    return log_in


@pytest.fixture
def screenshot(page, tmp_path):
    """Take a full-page screenshot of the current page. With ACTHELM_SCREENSHOTS=1 (`make
    screenshots`) it replaces the one in docs/screenshots/; otherwise it goes to a temporary
    folder, so an ordinary test run leaves the working tree clean."""
    folder = SCREENSHOTS if os.environ.get("ACTHELM_SCREENSHOTS") == "1" else tmp_path

    def save(name: str):
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / name), full_page=True)
        assert (folder / name).stat().st_size > 10_000  # a real page, not a blank one

    return save


# Short leases so a worker notices decisions and hands tasks on quickly.
FAST_WORKER_ENV = {
    "ACTHELM_HEARTBEAT_SECONDS": "0.3",
    "ACTHELM_LEASE_SECONDS": "2",
    "ACTHELM_POLL_SECONDS": "0.5",
    "ACTHELM_RECOVER_INTERVAL_SECONDS": "0.5",
    # The scripted model server and the fetch target listen on 127.0.0.1.
    "ACTHELM_FETCH_ALLOW_PRIVATE": "true",
}


@pytest.fixture
def start_worker(worker_env, settings, tmp_path):
    """Start `manage.py acthelm_worker` against the test database and this test's media root."""
    import signal
    import subprocess
    import sys

    started = []

    def start(worker_id: str = "e2e-worker"):
        log = (tmp_path / f"{worker_id}.log").open("w")
        env = {
            **worker_env,
            **FAST_WORKER_ENV,
            "ACTHELM_MEDIA_ROOT": str(settings.ACTHELM_MEDIA_ROOT),
        }
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "acthelm_worker", "--worker-id", worker_id],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append((proc, log))
        return proc

    yield start
    for proc, log in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        log.close()
