"""What a user reads says the thing itself: no "see the seed article" or "matrix row 3" pointing
at reference material the user has never seen. The docs, the runbooks the exporter serves, every
verb's --help, metric help strings, the landing page, the acceptance report and the dashboards
are searched; code comments and docstrings may keep a short reference for the maintainers."""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

from checkpoint_exporter.cli import build_parser
from tests.conftest import REPO

PACKAGE = REPO / "exporter" / "checkpoint_exporter"

# What leans on the reference material instead of saying what it means.
REFERENCES = re.compile(
    r"seed article|\bthe seeds?\b|\bseed's\b|\b(the|second) article\b|\barticle's\b"
    r"|\bthe matrix\b|\bmatrix('s|\s+rows?)\b|\bbottleneck[- ]matrix\b|\bisolation matrix\b"
    r"|\b(its |the )?sections? \d\b",
    re.IGNORECASE,
)

DOCUMENTS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    PACKAGE / "runbooks.md",  # what /runbooks serves
    *sorted((REPO / "dashboards").glob("*.json")),
]
# Modules whose strings reach users: --help, metric help, the landing page, the report.
MODULES = [
    *sorted((PACKAGE / "cli").glob("*.py")),
    PACKAGE / "exposition" / "landing.py",
    PACKAGE / "exposition" / "metrics.py",
    PACKAGE / "exposition" / "renderer.py",
    *sorted((PACKAGE / "exposition" / "collectors").glob("*.py")),
    *sorted((PACKAGE / "acceptance").glob("*.py")),
]


def found_in(text: str) -> list[str]:
    """Each line that leans on the reference material."""
    return [line.strip() for line in text.splitlines() if REFERENCES.search(line)]


def test_the_pattern_finds_what_it_is_for() -> None:
    for leaning in (
        "after the bottleneck matrix of the seed article",
        "Matrix rows: if training paused",
        '(matrix row "one server finishes much later")',
        "the seed's 10% allowance",
        "section 7's isolation matrix",
        "judge the seed article's acceptance checklist",
        "The article's worked example",
        "the bottleneck-matrix diagnosis of each job's saves",
    ):
        assert found_in(leaning), leaning
    for plain in (
        "the bottleneck table below: pause before network traffic rises means staging-bound",
        "random seed 42 for the demo's jitter",
        "a range matrix from the query API",
    ):
        assert not found_in(plain), plain


def test_the_documents_say_the_thing_itself() -> None:
    leaning = {str(path.relative_to(REPO)): found_in(path.read_text()) for path in DOCUMENTS}
    assert not {path: lines for path, lines in leaning.items() if lines}


def _user_strings(path: Path) -> Iterator[str]:
    """Every string literal of a module but its docstrings (comments are not in the tree)."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    strings = (
        n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )
    yield from (node.value for node in strings if id(node) not in docstrings)


def test_help_metric_help_landing_page_and_report_say_the_thing_itself() -> None:
    leaning = {
        str(path.relative_to(REPO)): [line for s in _user_strings(path) for line in found_in(s)]
        for path in MODULES
    }
    assert not {path: lines for path, lines in leaning.items() if lines}


def _helps(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, str]]:
    yield name, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, sub in action.choices.items():
                yield from _helps(sub, f"{name} {verb}")


def test_every_verbs_help_says_the_thing_itself() -> None:
    helps = dict(_helps(build_parser(), "checkpoint-exporter"))
    assert {"checkpoint-exporter plan", "checkpoint-exporter acceptance"} <= set(helps)
    leaning = {name: found_in(text) for name, text in helps.items()}
    assert not {name: lines for name, lines in leaning.items() if lines}
