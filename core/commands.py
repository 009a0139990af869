"""What the project's `manage.py acthelm_*` commands check before they run."""

from django.core.checks import Tags

#: Django's system checks an `acthelm_*` command runs before its work: all but the URLconf's.
#: That one imports every view and builds the API's schemas (about a third of the CPU a command
#: takes to start) for commands that serve no page; a command that needs a URL imports the
#: URLconf when it does. `manage.py check`, `migrate` and `runserver` still run every check.
CHECKS = [
    tag
    for name, tag in vars(Tags).items()
    if not name.startswith("_") and isinstance(tag, str) and tag != Tags.urls
]
