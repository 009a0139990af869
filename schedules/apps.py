from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    name = "schedules"
    verbose_name = "Schedules"

    def ready(self) -> None:
        # The worker's maintenance loop runs what is registered with it (the engine does not
        # import this app, which sits above it): one pass over the due schedules.
        from agents.engine.runtime.maintenance import register_maintenance
        from schedules.services import tick_now

        register_maintenance("schedules", tick_now)
