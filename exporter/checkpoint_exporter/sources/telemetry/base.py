"""What every telemetry source provides to the sampler."""

from __future__ import annotations

from pathlib import Path

Sample = dict[tuple[str, str], float]  # (device, field) -> value; counters are cumulative


def read_text(path: Path) -> str | None:
    """A small sysfs/procfs file's text, or None when it is absent or unreadable."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def read_int(path: Path) -> int | None:
    text = read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
