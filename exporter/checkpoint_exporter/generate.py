"""``make generate``: rebuild every committed generated file from the code that defines it.

``--check`` rebuilds in memory and exits 1 naming each file that differs, so CI can prove the
committed copies are current.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable
from pathlib import Path

from checkpoint_exporter import metrics

BEGIN = "<!-- BEGIN GENERATED: {name} (make generate) -->"
END = "<!-- END GENERATED: {name} -->"


def _replace_block(text: str, name: str, body: str, file: Path) -> str:
    """Swap the generated block ``name`` inside a hand-written Markdown file."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    if begin not in text or end not in text:
        raise ValueError(f"{file}: markers for the generated block {name!r} are missing")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def _metrics_doc(root: Path) -> str:
    path = root / "docs" / "metrics.md"
    return _replace_block(path.read_text(), "metrics", metrics.reference_table(), path)


# Each generated file, relative to the repository root, and how to build its new content.
TARGETS: dict[str, Callable[[Path], str]] = {
    "docs/metrics.md": _metrics_doc,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checkpoint_exporter.generate")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = 0
    for relative, build in TARGETS.items():
        path = args.root / relative
        new = build(args.root)
        old = path.read_text() if path.exists() else ""
        if new == old:
            continue
        if args.check:
            stale += 1
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(True),
                    new.splitlines(True),
                    f"{relative} (committed)",
                    f"{relative} (generated)",
                )
            )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(new)
            print(f"wrote {relative}")
    if stale:
        print(
            f"{stale} generated file(s) are stale: run `make generate` and commit", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
