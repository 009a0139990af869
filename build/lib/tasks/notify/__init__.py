"""Notifications through an outbox: who is told that a task waits for a person, and how.

- `states.py`: the values (events a target can want, row statuses, channels).
- `models.py`: `NotificationTarget` (where to send) and `Notification` (one outbox row per event
  and target, written in the transaction of the event).
- `outbox.py`: `enqueue_for_event()`, called where the timeline event is written; composes the
  message (what waits, for whom, the console link).
- `delivery.py`: `deliver_due()`, called by worker maintenance and `acthelm_notify deliver`;
  claims due rows with SKIP LOCKED, sends outside any transaction, retries with back-off and
  marks a row failed after ACTHELM_NOTIFY_MAX_ATTEMPTS.
- `channels.py`: email (Django's mail framework) and signed webhooks.
- `targets.py`: adding, listing, testing and removing targets (admin, command).
"""
