"""Properties of the repository itself: generated files current, lint clean, light imports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def test_generated_files_are_current() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpoint_exporter.mixin.generate",
            "--check",
            "--root",
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_generate_check_detects_a_stale_file(tmp_path: Path) -> None:
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    doc = tmp_path / "docs" / "metrics.md"
    doc.write_text(doc.read_text().replace("checkpoint_deadline_seconds", "checkpoint_renamed"))
    command = [sys.executable, "-m", "checkpoint_exporter.mixin.generate", "--root", str(tmp_path)]
    stale = subprocess.run([*command, "--check"], capture_output=True, text=True, timeout=120)
    assert stale.returncode == 1 and "docs/metrics.md" in stale.stdout
    assert subprocess.run(command, capture_output=True, timeout=120).returncode == 0
    assert subprocess.run([*command, "--check"], capture_output=True, timeout=120).returncode == 0


def test_package_import_is_standard_library_only() -> None:
    """`import checkpoint_exporter` must work in a training image without our dependencies."""
    code = (
        "import sys; before = set(sys.modules); import checkpoint_exporter; "
        "new = set(sys.modules) - before; "
        "bad = [m for m in new if m.split('.')[0] not in sys.stdlib_module_names "
        "and m.split('.')[0] != 'checkpoint_exporter']; print(bad); sys.exit(bool(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout


def test_ruff_is_clean() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    paths = [str(REPO / p) for p in ("exporter", "tests", "bench")]
    check = subprocess.run([ruff, "check", *paths], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout
    fmt = subprocess.run(
        [ruff, "format", "--check", *paths], capture_output=True, text=True, timeout=120
    )
    assert fmt.returncode == 0, fmt.stdout


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's contracts (pyproject.toml) over the package under ``root``."""
    return subprocess.run(
        [Path(sys.executable).parent / "lint-imports", "--no-cache"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root / "exporter")},
    )


def test_the_layers_hold() -> None:
    """sources -> core -> exposition -> daemon: no module imports a layer above its own."""
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr


# (module, the import appended to it, the contract it breaks): DESIGN.md's rules, one each.
FORBIDDEN_IMPORTS = [
    ("sources/listing.py", "from checkpoint_exporter.daemon import scanner", "Layers"),
    ("core/drain.py", "from checkpoint_exporter.sources import spool", "The core reasons"),
    ("core/drain.py", "import subprocess", "The core reasons"),
    ("exposition/landing.py", "from checkpoint_exporter.core import tracker", "The exposition"),
    ("model.py", "from checkpoint_exporter.config import Config", "The vocabulary stands"),
    ("plan/measured.py", "from checkpoint_exporter.sources import validate", "Only the daemon"),
]


@pytest.mark.parametrize(("module", "statement", "contract"), FORBIDDEN_IMPORTS)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, statement: str, contract: str
) -> None:
    """Each contract bites: one import DESIGN.md forbids fails the build, naming the contract."""
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    package = tmp_path / "exporter" / "checkpoint_exporter"
    shutil.copytree(
        REPO / "exporter" / "checkpoint_exporter",
        package,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    path = package / module
    path.write_text(path.read_text() + f"\n{statement}  # noqa\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout
