from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self) -> None:
        from approvals.notify import pending_approvals, pending_reviews
        from tasks.notify.outbox import describe_open_decisions
        from tasks.notify.states import NotifyEvent

        describe_open_decisions(NotifyEvent.AWAITING_APPROVAL, pending_approvals)
        describe_open_decisions(NotifyEvent.NEEDS_REVIEW, pending_reviews)
