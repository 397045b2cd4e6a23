"""Fuzzing every reader of untrusted input, and replaying the committed corpus.

The normal suite runs a few hundred cases per target and replays tests/fuzz/corpus/. ``make fuzz``
runs FUZZ_EXAMPLES (10,000) cases per target with a per-case deadline (a hang fails), under a
memory limit (an allocation bomb fails), and saves any crashing input into the corpus, where
the normal suite replays it from then on.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import strategies
from tests.fuzz.targets import TARGETS

# Mutated seeds of hundreds of kilobytes make hypothesis warn that their repr is large.
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")

FUZZING = "FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))

fuzz_settings = settings(
    max_examples=EXAMPLES,
    # A case that takes this long is a hang; only enforced in `make fuzz`, where the machine is
    # not shared with the rest of the suite.
    deadline=timedelta(seconds=5) if FUZZING else None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
    derandomize=not FUZZING,  # the normal suite is repeatable; fuzzing explores
)


def _run(target: str, data: bytes) -> None:
    try:
        TARGETS[target](data)
    except BaseException:
        if FUZZING:  # keep the input: the normal suite replays the corpus from then on
            crash = strategies.CORPUS / target / f"crash-{hashlib.sha256(data).hexdigest()[:12]}"
            crash.parent.mkdir(parents=True, exist_ok=True)
            crash.write_bytes(data)
        raise


def _fuzz(
    target: str, inputs: st.SearchStrategy[bytes], examples: int = EXAMPLES
) -> Callable[[], None]:
    @settings(fuzz_settings, max_examples=examples)
    @given(inputs)
    def run(data: bytes) -> None:
        _run(target, data)

    return run


test_fuzz_dcp_metadata = _fuzz("dcp_metadata", strategies.pickles())
test_fuzz_dcp_metadata_isolated = _fuzz(
    "dcp_metadata_isolated",
    st.one_of(strategies.amplifying_pickles(), strategies.pickles()),
    examples=max(1, EXAMPLES // 5),  # each bomb costs its worker a restart
)
test_fuzz_layouts = _fuzz("layouts", strategies.trees())
test_fuzz_spool = _fuzz("spool", strategies.spool_files())
test_fuzz_config = _fuzz("config", strategies.configs("config"))
test_fuzz_web_config = _fuzz("web_config", strategies.configs("web_config"))


def _corpus() -> list[tuple[str, Path]]:
    return [
        (directory.name, path)
        for directory in sorted(strategies.CORPUS.iterdir())
        for path in sorted(directory.iterdir())
    ]


@pytest.mark.parametrize(("target", "path"), _corpus(), ids=lambda v: getattr(v, "name", v))
def test_corpus_replays(target: str, path: Path) -> None:
    TARGETS[target](path.read_bytes())


def test_every_target_has_a_corpus() -> None:
    assert {target for target, _ in _corpus()} == set(TARGETS)
