"""What the project's `manage.py acthelm_*` commands check before they run."""

from django.core.checks import Tags

#: The project's own tag (agents/checks.py: the worker's settings, credential destinations).
PROJECT_TAG = "acthelm"

#: The system checks an `acthelm_*` command runs before its work: every tag but the URLconf's.
#: That one imports every view and builds the API's schemas (about a quarter of the CPU a command
#: took to start) for commands that serve no page; a command that needs a URL imports the URLconf
#: when it does. `manage.py check`, `migrate` and `runserver` still run every check, the untagged
#: ones too (Django runs a check with no tag only when no tag is asked for).
CHECKS = [
    *(
        tag
        for name, tag in vars(Tags).items()
        if not name.startswith("_") and isinstance(tag, str) and tag != Tags.urls
    ),
    PROJECT_TAG,
]
