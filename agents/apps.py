from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Agents"

    def ready(self) -> None:
        # Settings that contradict each other stop `check` and the worker (agents/checks.py).
        from agents import checks  # noqa: F401 - registers the checks

        # SERVER__TOOL names resolve to the tools recorded for registered MCP servers.
        from agents.catalogue.toolservers import install_resolver

        install_resolver()

        # Traces, only when OTEL_EXPORTER_OTLP_ENDPOINT (or the like) is set.
        from core import telemetry

        telemetry.setup()
