"""Schedules: a stored task or goal template created on a cron expression in a named time zone,
exactly once per slot (`schedules.services`, the one writer)."""
