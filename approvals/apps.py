from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self) -> None:
        from approvals.notify import pending_approvals, pending_reviews
        from approvals.services import settle_for_cancelled_task
        from tasks.notify.outbox import describe_open_decisions
        from tasks.notify.states import NotifyEvent
        from tasks.services import settle_on_cancel

        describe_open_decisions(NotifyEvent.AWAITING_APPROVAL, pending_approvals)
        describe_open_decisions(NotifyEvent.NEEDS_REVIEW, pending_reviews)
        # A person's cancel settles the task's open decisions in its transaction.
        settle_on_cancel(settle_for_cancelled_task)
