"""The console: every page, form, admin action on the ledger and person-facing command.

It sits above the apps (agents, approvals, tasks, memory) and calls their services; nothing below
imports it. The project shell (acthelm_site: settings, urls, the API) sits above it.
"""
