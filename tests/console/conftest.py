"""A Slack target wired to the scripted Slack on loopback (tests/fakes/slack_server.py)."""

from dataclasses import dataclass

import pytest

from tests.fakes.slack_server import ScriptedSlack

BOT_TOKEN = "xoxb-test-bot-token"
SIGNING_SECRET = "slack-signing-secret-for-tests"


@dataclass
class SlackSetup:
    server: ScriptedSlack
    target: object
    # The environment a worker process needs to post to the scripted Slack.
    env: dict[str, str]


@pytest.fixture
def slack(settings, monkeypatch, db):
    from tasks.notify.targets import target_add

    with ScriptedSlack(token=BOT_TOKEN) as server:
        env = {
            "ACTHELM_SLACK_API_URL": server.api_url,
            "ACTHELM_SLACK_RESPONSE_URL_PREFIXES": server.base + "/respond/",
            "ACTHELM_NOTIFY_ALLOW_ADDRESSES": "127.0.0.1",
            "ACTHELM_NOTIFY_TIMEOUT_SECONDS": "2",
            "ACTHELM_BASE_URL": "https://acthelm.example.org",
            "ACTHELM_KEY_SLACK_BOT": BOT_TOKEN,
            "ACTHELM_KEY_SLACK_SIGNING": SIGNING_SECRET,
        }
        settings.ACTHELM_SLACK_API_URL = server.api_url
        settings.ACTHELM_SLACK_RESPONSE_URL_PREFIXES = [server.base + "/respond/"]
        settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]
        settings.ACTHELM_NOTIFY_TIMEOUT_SECONDS = 2
        settings.ACTHELM_BASE_URL = "https://acthelm.example.org"
        monkeypatch.setenv("ACTHELM_KEY_SLACK_BOT", BOT_TOKEN)
        monkeypatch.setenv("ACTHELM_KEY_SLACK_SIGNING", SIGNING_SECRET)
        target = target_add(
            name="approvals-channel",
            kind="slack",
            address="C0APPROVALS",
            token_env="ACTHELM_KEY_SLACK_BOT",
            secret_env="ACTHELM_KEY_SLACK_SIGNING",
            events=["awaiting_approval"],
        )
        yield SlackSetup(server, target, env)
