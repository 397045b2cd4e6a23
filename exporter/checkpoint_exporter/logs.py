"""logfmt or JSON log lines on stderr, as node_exporter writes them."""

from __future__ import annotations

import json
import logging
import sys
import time

LEVELS = ("debug", "info", "warn", "error")
FORMATS = ("logfmt", "json")
# The most of a message, and of a traceback, that one line carries (before escaping, which makes
# a control character six): every line is bounded, whatever a message repeats of a file.
FIELD_CHARS = 8192


def _capped(text: str) -> str:
    if len(text) <= FIELD_CHARS:
        return text
    return f"{text[:FIELD_CHARS]}... [{len(text) - FIELD_CHARS:,} characters cut]"


def _quote(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\n\t'):
        return text
    return json.dumps(text)


class _Formatter(logging.Formatter):
    def __init__(self, style: str):
        super().__init__()
        self.style = style

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": {"WARNING": "warn"}.get(record.levelname, record.levelname.lower()),
            "logger": record.name.removeprefix("checkpoint_exporter."),
            "msg": _capped(record.getMessage()),
        }
        if record.exc_info:
            fields["err"] = _capped(self.formatException(record.exc_info))
        if self.style == "json":
            return json.dumps(fields)
        return " ".join(f"{key}={_quote(value)}" for key, value in fields.items())


THIRD_PARTY_HTTP = ("urllib3", "botocore", "azure", "google.auth")


def setup(level: str = "info", style: str = "logfmt") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(style))
    numeric = logging.getLevelName({"warn": "WARNING"}.get(level, level.upper()))
    handler.setLevel(numeric)  # loggers tuned lower for their own reasons still print at this
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # The object stores' HTTP libraries print request lines and headers at DEBUG: a SAS token
    # is a URL's query, a signature a header. None of it is ours to print, at any --log.level.
    for name in THIRD_PARTY_HTTP:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
