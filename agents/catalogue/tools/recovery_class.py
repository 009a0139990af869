"""The recovery classes: what the worker may do with a call that was running when it crashed.

One definition for the tools (which stay free of Django, so that a tool imports in a bare child
process) and for the tool-call rows (`agents.states`, `agents.models`).
"""

import enum


class RecoveryClass(enum.StrEnum):
    READ_ONLY = "read_only"  # run again freely
    IDEMPOTENT = "idempotent"  # run again; it rewrites the same result
    EXTERNAL = "external"  # has effects outside; never replayed automatically: needs_review
    INTERNAL = "internal"  # the loop's own bookkeeping (update_plan, propose_task)

    @property
    def label(self) -> str:
        return LABELS[self]


LABELS = {
    RecoveryClass.READ_ONLY: "Read-only: run again",
    RecoveryClass.IDEMPOTENT: "Idempotent: run again",
    RecoveryClass.EXTERNAL: "External: never replayed",
    RecoveryClass.INTERNAL: "Internal bookkeeping",
}

#: The choices of a model field holding a recovery class.
CHOICES = [(member.value, member.label) for member in RecoveryClass]
