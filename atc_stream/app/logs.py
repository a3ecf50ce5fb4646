"""``--log-format json``: the lines a command writes to stderr and every log record, as one
JSON object a line (time, level, logger, message and the record's extra fields)."""

from __future__ import annotations

import datetime as _dt
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from enum import Enum
from typing import IO, Any

import msgspec

from atc_stream.app.console import PROGRAM, set_line_sink

#: The logger of a command's own lines (status, notes, summary, errors).
LINES = logging.getLogger("atc_stream.command")
#: Attributes every ``LogRecord`` has: the rest are a record's extra fields.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class LogFormat(str, Enum):
    """How stderr lines and log records are written."""

    text = "text"
    json = "json"


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON: ``time`` (UTC, ISO 8601 with ms), ``level``,
    ``logger``, ``message``, its extra fields, and ``exception`` when it carries one."""

    def format(self, record: logging.LogRecord) -> str:
        created = _dt.datetime.fromtimestamp(record.created, _dt.timezone.utc)
        out: dict[str, Any] = {
            "time": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and key not in out and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return msgspec.json.encode(out, enc_hook=str).decode()


def _log_line(line: str, level: str, fields: Mapping[str, Any] | None) -> None:
    # the record has its level: "atc-stream: warning: x" is the message "x"
    text = line.strip().removeprefix(f"{PROGRAM}: ").removeprefix(f"{level}: ")
    extra = {k: v for k, v in (fields or {}).items() if k not in _RECORD_FIELDS}
    LINES.log(_LEVELS.get(level, logging.INFO), text, extra=extra)


@contextmanager
def use_log_format(form: LogFormat | str, stream: IO[str] | None = None) -> Iterator[None]:
    """Within: with ``json``, stderr lines (``console.err``) and log records (warnings and
    up, the command's lines from info) go to ``stream`` (default stderr) as JSON lines;
    with ``text``, nothing changes. The logging setup before is restored after."""
    if LogFormat(form) is LogFormat.text:
        yield
        return
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    saved = root.handlers[:], root.level, LINES.level
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    LINES.setLevel(logging.INFO)
    before = set_line_sink(_log_line)
    try:
        yield
    finally:
        set_line_sink(before)
        handler.flush()
        root.handlers[:], level, lines_level = saved
        root.setLevel(level)
        LINES.setLevel(lines_level)
