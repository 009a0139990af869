"""A provider kind declares its rules on its class: what a connection must name, how the
provider is built from the stored settings, how its prices are found. `validate_connection`,
`provider_for` and `table_prices` ask the class, so a kind registered here, in a test, is
validated, built and priced by its own rules with no other file changing."""

from typing import Any, ClassVar

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from agents.catalogue.connection_rules import (
    connection_kind_choices,
    connection_kinds,
    validate_connection,
)
from agents.catalogue.connections import connection_add, provider_for
from agents.catalogue.prices import table_prices
from agents.catalogue.providers import get_provider_class, register, registered_kinds
from agents.catalogue.providers.base import (
    ProbeResult,
    Provider,
    SettingsProblem,
    traced_name,
    unregister,
)
from agents.models import Connection
from agents.states import ConnectionKind
from core.exceptions import InvalidInput


class _Throwaway(Provider):
    """Reaches nothing; needs neither a base URL nor a command; priced as OpenAI's models."""

    kind = "throwaway_test"
    label = "Throwaway"
    supports_tools = False
    needs_base_url = False
    price_provider_id: ClassVar[str | None] = "openai"

    def __init__(self, *, region: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.region = region

    @classmethod
    def check_settings(cls, *, base_url, command, allowed_executables):
        if base_url.startswith("http://"):
            return SettingsProblem("a throwaway connection refuses plain http", code="plain_http")
        return super().check_settings(
            base_url=base_url, command=command, allowed_executables=allowed_executables
        )

    @classmethod
    def connection_arguments(cls, **settings: Any) -> dict[str, Any]:
        return {"region": settings["answer_field"] or "nowhere"}

    def complete(self, **kwargs):
        raise NotImplementedError

    def probe(self, *, model: str, tools: bool) -> ProbeResult:
        return ProbeResult(ok=True, message="throwaway")


class _Runner(_Throwaway):
    """Runs a command *and* names a server: both rules of the base class apply."""

    kind = "runner_test"
    label = ""
    needs_base_url = True
    needs_command = True


@pytest.fixture
def throwaway_kinds():
    register(_Throwaway)
    register(_Runner)
    yield
    unregister(_Throwaway.kind)
    unregister(_Runner.kind)


def test_the_shipped_kinds_are_registered_and_offered_in_their_order():
    assert sorted(ConnectionKind) == registered_kinds()
    assert connection_kinds() == list(ConnectionKind)
    assert connection_kind_choices() == [
        ("openai_compatible", "OpenAI-compatible (OpenAI, Ollama, vLLM, llama.cpp)"),
        ("anthropic", "Anthropic"),
        ("cli", "Model CLI"),
    ]


@pytest.mark.django_db
def test_a_registered_kind_is_a_choice_of_the_model_without_a_migration(throwaway_kinds):
    choices = list(Connection._meta.get_field("kind").choices)
    assert choices[-2:] == [("runner_test", "runner_test"), ("throwaway_test", "Throwaway")]
    Connection(name="spare", kind="throwaway_test").full_clean()
    with pytest.raises(ValidationError) as refused:
        Connection(name="spare", kind="nobody_registered_this").full_clean()
    assert "kind" in refused.value.message_dict
    call_command("makemigrations", "agents", "--check", "--dry-run", verbosity=0)


def test_a_kind_names_itself_on_trace_spans():
    assert [traced_name(kind) for kind in ConnectionKind] == ["openai", "anthropic", "acthelm.cli"]
    assert traced_name("nobody_registered_this") == "nobody_registered_this"


def test_the_shipped_kinds_declare_the_rules_the_validator_applied():
    cli = get_provider_class(ConnectionKind.CLI)
    assert (cli.needs_command, cli.needs_base_url, cli.supports_tools) == (True, False, False)
    for kind in (ConnectionKind.OPENAI_COMPATIBLE, ConnectionKind.ANTHROPIC):
        cls = get_provider_class(kind)
        assert (cls.needs_command, cls.needs_base_url, cls.supports_tools) == (False, True, True)
    assert get_provider_class(ConnectionKind.ANTHROPIC).price_provider_id == "anthropic"
    assert get_provider_class(ConnectionKind.OPENAI_COMPATIBLE).price_provider_id is None


def test_a_registered_kind_is_validated_by_its_own_rules(throwaway_kinds):
    numbers = validate_connection(actor=None, kind="throwaway_test", priority=3, timeout_seconds=5)
    assert numbers == {"priority": 3, "timeout_seconds": 5}
    with pytest.raises(InvalidInput) as refused:
        validate_connection(actor=None, kind="throwaway_test", base_url="http://example.org")
    assert (refused.value.code, refused.value.message) == (
        "plain_http",
        "a throwaway connection refuses plain http",
    )
    with pytest.raises(InvalidInput) as unknown:
        validate_connection(actor=None, kind="nobody_registered_this")
    assert unknown.value.message == (
        "kind must be one of openai_compatible, anthropic, cli, runner_test, throwaway_test"
    )


def test_a_command_kind_gets_the_command_rules_and_the_allow_list(throwaway_kinds, settings):
    settings.ACTHELM_CLI_EXECUTABLES = ["llm"]
    with pytest.raises(InvalidInput, match=r"^a runner_test connection needs a command"):
        validate_connection(actor=None, kind="runner_test", base_url="https://x.example")
    with pytest.raises(InvalidInput, match=r"^a runner_test command is a list of non-empty"):
        validate_connection(
            actor=None, kind="runner_test", base_url="https://x.example", command=["llm", ""]
        )
    with pytest.raises(InvalidInput) as refused:
        validate_connection(
            actor=None, kind="runner_test", base_url="https://x.example", command=["sh"]
        )
    assert refused.value.code == "executable_not_allowed"
    with pytest.raises(InvalidInput, match=r"^a runner_test connection needs a base URL"):
        validate_connection(actor=None, kind="runner_test", command=["llm"])
    validate_connection(
        actor=None, kind="runner_test", base_url="https://x.example", command=["llm"]
    )


def test_a_registered_kind_is_built_and_priced_by_its_class(throwaway_kinds, db, actor):
    conn = connection_add(
        actor=actor,
        name="throwaway",
        kind="throwaway_test",
        answer_field="eu-1",
        models=[{"name": "gpt-4o"}],
    )
    model = conn.models.get()
    assert model.supports_tools is False  # the class's default for a model named without it
    provider = provider_for(conn)
    assert isinstance(provider, _Throwaway) and provider.region == "eu-1"
    assert provider.base_url == ""  # its connection_arguments() did not pass one
    assert table_prices(model)["price_input_per_mtok"] > 0  # found by provider id, no base URL
