"""Log formatting: one JSON object per line, for log shippers (selected by ACTHELM_LOG_FORMAT=json).

The codebase logs dotted event names with structured fields:
`log.info("task.claimed", extra={"task_id": 7, "run_id": 12, "worker": "host:41:0"})`
becomes
`{"time": "...", "level": "INFO", "logger": "acthelm.tasks", "event": "task.claimed",
"task_id": 7, "run_id": 12, "worker": "host:41:0"}`.
"""

import json
import logging
from datetime import UTC, datetime

# What json.dumps writes as it is.
type Jsonable = bool | int | float | str | list[Jsonable] | dict[str, Jsonable] | None

# Attributes every LogRecord has; anything else on a record came from `extra`.
_RECORD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()
) | {"message", "asctime", "taskName"}

# The fixed fields; an `extra` field of the same name cannot overwrite them.
_FIXED = ("time", "level", "logger", "event")


def _jsonable(value: object) -> Jsonable:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    # Django's request logs carry the HttpRequest itself: keep it to method and path.
    method, path = getattr(value, "method", None), getattr(value, "path", None)
    if isinstance(method, str) and isinstance(path, str):
        return f"{method} {path}"
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, event, then every `extra` field."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Jsonable] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key in _RECORD_ATTRIBUTES or key in _FIXED or key.startswith("_"):
                continue
            entry[key] = _jsonable(value)
        if record.exc_info:
            entry["exc_type"] = record.exc_info[0].__name__ if record.exc_info[0] else None
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # json.dumps escapes newlines, so a traceback stays on its line.
        return json.dumps(entry, ensure_ascii=False, default=str)
