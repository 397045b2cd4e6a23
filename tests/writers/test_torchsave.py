"""Plain ``torch.save`` (torch 2.13, CPU) of ``ckpt_step_N.pt`` under a live exporter.

A training loop of one's own saves a model and its optimizer every few steps and keeps the
newest two (``os.remove`` of the oldest); ``layout: auto`` must say ``torchsave``. Written in
place, the file grows under its final name and a killed save leaves half a zip there; written
via ``ckpt_step_N.pt.tmp`` and ``os.replace``, a killed save leaves half a temporary file. Either
way: exactly one aborted save, the two whole files still committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoint_exporter.sources.layouts.base import ZIP, Check
from checkpoint_exporter.sources.validate import BAD_ZIP, validate
from tests.writers.harness import NIGHTLY, Scenario, watching

pytestmark = pytest.mark.writers


@pytest.mark.parametrize(
    ("watch", "mode"),
    [
        ("inotify", "in-place"),
        pytest.param("inotify", "replace", marks=NIGHTLY),
        pytest.param("poll", "in-place", marks=NIGHTLY),
        ("poll", "replace"),
    ],
)
def test_torch_save_step_files_keep_last_two(tmp_path: Path, watch: str, mode: str) -> None:
    with watching(tmp_path, "torchsave", "torch", mode, watch=watch) as (root, driver, watched):
        reported = Scenario(driver, watched, layout="torchsave").run()
    hung = Path(reported[-1]["path"])
    final = root / f"ckpt_step_{reported[-1]['step']}.pt"
    # The kill left half a zip: under the final name, or under the temporary one (never renamed).
    assert hung == (final if mode == "in-place" else final.with_name(final.name + ".tmp"))
    assert hung.stat().st_size > 0
    assert validate(str(root), [Check(ZIP, hung.name)]).reason == BAD_ZIP
    assert sorted(p.name for p in root.iterdir() if p.name != hung.name) == sorted(
        Path(line["path"]).name for line in reported[2:4]
    )  # keep-last-2: the third and fourth saves
