"""Exceptions shared across layers, kept apart so a reader of a source need not import the
exposition (and prometheus_client) to say it has nothing to report."""

from __future__ import annotations


class NoDataError(Exception):
    """Raised by a reader or collector with nothing to report (no GPU, no InfiniBand).

    Reported as success 0, logged at debug level; it is not a failed scrape.
    """
