"""The permissions of the decisions, named once: the console, the API, the CLI and the services
check these names. `Approval.Meta` declares `decide_approval`; `view_approval` is Django's
default."""

# Approve or deny an operation; run again or skip one of unknown outcome.
DECIDE_APPROVAL = "approvals.decide_approval"
VIEW_APPROVAL = "approvals.view_approval"

# Who may see what waits for a decision (the inbox, the nav's counts, GET /api/approvals): who
# decides, and who only looks.
INBOX_PERMS = (DECIDE_APPROVAL, VIEW_APPROVAL)
