"""Log lines: whatever a message or a traceback carries (a tenant's 48 MB path repeated in an
error), every line the exporter writes is bounded, and says how much was cut."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from checkpoint_exporter import logs

HUGE = 10_000_000


def _record(message: str, exc_info: object = None) -> logging.LogRecord:
    return logging.LogRecord(
        "checkpoint_exporter.daemon.validator", logging.WARNING, __file__, 1, "invalid: %s",
        (message,), exc_info,  # type: ignore[arg-type]
    )  # fmt: skip


def _failure() -> object:
    try:
        raise ValueError("\0" * HUGE)
    except ValueError:
        return sys.exc_info()


@pytest.mark.parametrize("style", logs.FORMATS)
def test_a_huge_message_and_traceback_make_a_bounded_line_that_says_what_was_cut(
    style: str,
) -> None:
    line = logs._Formatter(style).format(_record("\0" * HUGE, _failure()))
    assert len(line) < 200_000
    assert f"{HUGE + len('invalid: ') - logs.FIELD_CHARS:,} characters cut" in line
    if style == "json":
        fields = json.loads(line)  # still one valid JSON object
        assert fields["msg"].startswith("invalid: \0")
        assert "characters cut" in fields["err"]


def test_a_short_line_is_untouched() -> None:
    line = logs._Formatter("logfmt").format(_record("step-1"))
    assert line.endswith('msg="invalid: step-1"')


def test_the_object_stores_http_libraries_never_print_requests_even_at_debug() -> None:
    """botocore prints signed headers at DEBUG, urllib3 each URL (a SAS token is its query),
    azure-core every request's headers: held at WARNING whatever --log.level says."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    quieted = {name: logging.getLogger(name).level for name in logs.THIRD_PARTY_HTTP}
    try:
        logs.setup("debug")
        for name in ("urllib3.connectionpool", "botocore.endpoint", "azure.core", "google.auth"):
            assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger("checkpoint_exporter.sources.s3").isEnabledFor(logging.DEBUG)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, was in quieted.items():
            logging.getLogger(name).setLevel(was)
