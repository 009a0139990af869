"""The production settings: `check --deploy` passes, required secrets are required, and the console
runs under gunicorn with whitenoise serving the collected static files."""

import json
import secrets
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import ROOT

PRODUCTION = "acthelm_site.settings_production"

# Settings that would weaken the production profile; a test sets the ones it wants.
_TUNABLES = (
    "DJANGO_DEBUG",
    "DJANGO_ALLOWED_HOSTS",
    "DJANGO_CSRF_TRUSTED_ORIGINS",
    "DJANGO_SECURE_SSL_REDIRECT",
    "DJANGO_SECURE_HSTS_SECONDS",
    "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "DJANGO_SECURE_HSTS_PRELOAD",
    "DJANGO_STATIC_ROOT",
    "ACTHELM_BEHIND_PROXY",
)


@pytest.fixture
def production_env(worker_env):
    env = {k: v for k, v in worker_env.items() if k not in _TUNABLES}
    env["DJANGO_SETTINGS_MODULE"] = PRODUCTION
    env["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)
    env["DJANGO_ALLOWED_HOSTS"] = "acthelm.example.com,127.0.0.1"
    return env


def _manage(env, *args, timeout=120):
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


_PRINT_SETTINGS = """
import json, django
from django.conf import settings
django.setup()
print(json.dumps({
    "DEBUG": settings.DEBUG,
    "ALLOWED_HOSTS": settings.ALLOWED_HOSTS,
    "CSRF_TRUSTED_ORIGINS": settings.CSRF_TRUSTED_ORIGINS,
    "SECURE_PROXY_SSL_HEADER": settings.SECURE_PROXY_SSL_HEADER,
    "SECURE_SSL_REDIRECT": settings.SECURE_SSL_REDIRECT,
    "SECURE_HSTS_SECONDS": settings.SECURE_HSTS_SECONDS,
    "SESSION_COOKIE_SECURE": settings.SESSION_COOKIE_SECURE,
    "CSRF_COOKIE_SECURE": settings.CSRF_COOKIE_SECURE,
    "MIDDLEWARE": settings.MIDDLEWARE,
    "STATICFILES": settings.STORAGES["staticfiles"]["BACKEND"],
}))
"""


def _settings_of(env) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _PRINT_SETTINGS],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_check_deploy_passes_without_warnings(production_env):
    result = _manage(production_env, "check", "--deploy")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNINGS" not in output
    assert "no issues" in output


def test_check_deploy_reports_a_weakened_profile(production_env):
    """The check above can fail: turning the https redirect off is reported."""
    result = _manage({**production_env, "DJANGO_SECURE_SSL_REDIRECT": "0"}, "check", "--deploy")
    assert "WARNINGS" in result.stderr
    assert "security.W008" in result.stderr


@pytest.mark.parametrize("missing", ["DJANGO_SECRET_KEY", "DATABASE_URL"])
def test_production_refuses_to_start_without_a_required_setting(production_env, missing):
    env = {k: v for k, v in production_env.items() if k != missing}
    result = _manage(env, "check")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert f"{missing} is not set" in result.stderr


def test_an_empty_secret_key_is_refused_too(production_env):
    result = _manage({**production_env, "DJANGO_SECRET_KEY": "  "}, "check")
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY is not set" in result.stderr


def test_hardened_values_and_environment(production_env):
    values = _settings_of(
        {
            **production_env,
            "DJANGO_DEBUG": "1",  # ignored: production never runs with DEBUG
            "DJANGO_CSRF_TRUSTED_ORIGINS": "https://acthelm.example.com, https://ops.example.com",
        }
    )
    assert values["DEBUG"] is False
    assert values["ALLOWED_HOSTS"] == ["acthelm.example.com", "127.0.0.1"]
    assert values["CSRF_TRUSTED_ORIGINS"] == [
        "https://acthelm.example.com",
        "https://ops.example.com",
    ]
    assert values["SESSION_COOKIE_SECURE"] and values["CSRF_COOKIE_SECURE"]
    assert values["SECURE_SSL_REDIRECT"] is True
    assert values["SECURE_HSTS_SECONDS"] >= 31_536_000
    assert values["SECURE_PROXY_SSL_HEADER"] is None  # trusted only behind a proxy
    middleware = values["MIDDLEWARE"]
    assert middleware.index("whitenoise.middleware.WhiteNoiseMiddleware") == (
        middleware.index("django.middleware.security.SecurityMiddleware") + 1
    )
    assert values["STATICFILES"] == "whitenoise.storage.CompressedManifestStaticFilesStorage"


def test_the_proxy_header_is_trusted_only_behind_a_proxy(production_env):
    values = _settings_of({**production_env, "ACTHELM_BEHIND_PROXY": "1"})
    assert values["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gunicorn exited: {proc.stderr.read()}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError(f"gunicorn did not answer on {url}")


@pytest.mark.slow
def test_gunicorn_serves_the_console_with_whitenoise_behind_a_proxy(production_env, tmp_path):
    """What `make serve` runs: collectstatic, then gunicorn with the production settings."""
    env = {**production_env, "DJANGO_STATIC_ROOT": str(tmp_path / "static")}
    env["ACTHELM_BEHIND_PROXY"] = "1"
    collected = _manage(env, "collectstatic", "--noinput")
    assert collected.returncode == 0, collected.stderr
    manifest = json.loads((tmp_path / "static" / "staticfiles.json").read_text())
    hashed_css = manifest["paths"]["admin/css/base.css"]
    assert hashed_css != "admin/css/base.css"

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "acthelm_site.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(f"{base}/healthz", proc)
        # The health check answers over plain HTTP (probes do not speak TLS).
        health = httpx.get(f"{base}/healthz")
        assert health.status_code == 200
        assert health.json() == {"status": "ok", "database": "ok"}
        # Everything else is redirected to https unless the proxy says the request was https.
        plain = httpx.get(f"{base}/admin/login/")
        assert plain.status_code == 301
        assert plain.headers["location"].startswith("https://")
        proxied = {"X-Forwarded-Proto": "https"}
        login = httpx.get(f"{base}/admin/login/", headers=proxied)
        assert login.status_code == 200
        assert "max-age=31536000" in login.headers["strict-transport-security"]
        assert f"/static/{hashed_css}" in login.text
        css = httpx.get(f"{base}/static/{hashed_css}", headers=proxied)
        assert css.status_code == 200
        assert "immutable" in css.headers["cache-control"]  # whitenoise, not Django
        unknown_host = httpx.get(f"{base}/admin/login/", headers={**proxied, "Host": "evil.test"})
        assert unknown_host.status_code == 400
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -- issue 13, item 17: no public key with DEBUG off -----------------------------------------------

_SHOW_DEBUG = (
    "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)"
)


def _plain_env(**extra) -> dict:
    """This machine's environment without Django's settings, and a database URL that is never
    dialled (setting up Django does not connect)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env.update(
        PYTHONPATH=str(ROOT),
        DATABASE_URL="postgresql://acthelm:x@127.0.0.1:1/acthelm",
        DJANGO_SETTINGS_MODULE="acthelm_site.settings",
    )
    env.update(extra)
    return env


def _python(env, code):
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_the_base_settings_refuse_the_development_key_with_debug_off():
    result = _python(_plain_env(DJANGO_DEBUG="0"), _SHOW_DEBUG)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "DJANGO_SECRET_KEY" in result.stderr


def test_a_real_key_turns_debug_off_unless_asked():
    key = secrets.token_urlsafe(50)
    assert _python(_plain_env(DJANGO_SECRET_KEY=key), _SHOW_DEBUG).stdout.strip() == "False"
    on = _python(_plain_env(DJANGO_SECRET_KEY=key, DJANGO_DEBUG="1"), _SHOW_DEBUG)
    assert on.stdout.strip() == "True"


@pytest.mark.parametrize("prefix", ["hooks.slack.com/", "ftp://hooks.slack.com/", "https://"])
def test_a_slack_response_url_prefix_must_be_a_url(prefix):
    """A prefix is matched by scheme and host: one without them would match nothing, silently."""
    result = _python(_plain_env(ACTHELM_SLACK_RESPONSE_URL_PREFIXES=prefix), _SHOW_DEBUG)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "ACTHELM_SLACK_RESPONSE_URL_PREFIXES" in result.stderr
    ok = _python(
        _plain_env(ACTHELM_SLACK_RESPONSE_URL_PREFIXES="https://hooks.slack.com"), _SHOW_DEBUG
    )
    assert ok.returncode == 0, ok.stderr


def test_a_developer_machine_without_a_key_still_runs_with_debug_on():
    """`make run` and the test settings: no key, no DJANGO_DEBUG."""
    assert _python(_plain_env(), _SHOW_DEBUG).stdout.strip() == "True"


def test_wsgi_uses_the_production_settings_and_refuses_to_start_without_a_key():
    env = _plain_env()
    del env["DJANGO_SETTINGS_MODULE"]
    result = _python(env, "import acthelm_site.wsgi")
    assert result.returncode != 0
    assert (
        "ImproperlyConfigured" in result.stderr and "DJANGO_SECRET_KEY is not set" in result.stderr
    )


def test_production_refuses_the_public_development_key():
    env = _plain_env(
        DJANGO_SETTINGS_MODULE=PRODUCTION,
        DJANGO_SECRET_KEY="acthelm-development-key-not-for-production",
    )
    result = _python(env, _SHOW_DEBUG)
    assert result.returncode != 0 and "public development key" in result.stderr
