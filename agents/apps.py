from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Agents"

    def ready(self) -> None:
        # SERVER__TOOL names resolve to the tools recorded for registered MCP servers.
        from agents.toolservers import install_resolver

        install_resolver()

        # Traces, only when OTEL_EXPORTER_OTLP_ENDPOINT (or the like) is set.
        from acthelm_site import telemetry

        telemetry.setup()
