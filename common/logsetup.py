"""Logging for every gpushare process: one text format, or one JSON object per line (GPUSHARE_LOG_FORMAT=json).

Logged values come from outside (a review's uid, a pod's name, an error's text), so neither format writes a control
character raw: a value cannot end its record's line and forge the next one, nor drive the terminal that shows it.
That is why the formatters are written here rather than taken from a JSON-logging library: such a library escapes
in its JSON output only, and the text format needs the same escaping (common/escape.py); both formats together are
about fifty lines.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any, TextIO

from common.escape import json_printable, printable

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
# The attribute of a LogRecord whose dict a JSON line carries as top-level keys (the access log's request).
FIELDS = "fields"
# Lines of a traceback or a stack follow their record's line with this indent, so only a record starts at column 0.
CONTINUATION = "    "
# Libraries whose own retry chatter would repeat, in long lines, what our one line per retry already says:
# urllib3 warns "Retrying (Retry(total=...)) after connection broken by ..." before each of its retries.
QUIET = ("urllib3.connectionpool", "urllib3.util.retry")


def _utc(record: logging.LogRecord) -> str:
    stamp = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """`2026-01-02T03:04:05.678Z INFO [pid] logger: message`, the same for the app and gunicorn: one line per record,
    its non-printable characters escaped (a newline as \\n, ESC as \\x1b); a traceback follows on indented lines."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _utc(record)

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        lines = [printable(self.formatMessage(record))]
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        for text in (record.exc_text, record.stack_info and self.formatStack(record.stack_info)):
            if text:
                lines += (CONTINUATION + printable(line) for line in text.split("\n"))
        return "\n".join(lines)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, pid, message, and the exception's text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _utc(record), "level": record.levelname, "logger": record.name, "pid": record.process,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if k not in out})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json_printable(json.dumps(out, default=str, ensure_ascii=False))


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else TextFormatter()


def configure(level: str, log_format: str, stream: TextIO | None = None) -> None:
    """Route every logger to one handler on stderr (or `stream`) in the chosen format, replacing earlier ones."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(log_format))
    root.addHandler(handler)
    root.setLevel(level)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.ERROR)
