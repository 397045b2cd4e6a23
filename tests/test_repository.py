"""Properties of the repository itself: generated files current, lint clean, light imports."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_generated_files_are_current() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "checkpoint_exporter.generate", "--check", "--root", str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_generate_check_detects_a_stale_file(tmp_path: Path) -> None:
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    doc = tmp_path / "docs" / "metrics.md"
    doc.write_text(doc.read_text().replace("checkpoint_deadline_seconds", "checkpoint_renamed"))
    command = [sys.executable, "-m", "checkpoint_exporter.generate", "--root", str(tmp_path)]
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
