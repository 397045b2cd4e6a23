"""One tenant's number cannot blank every tenant's metrics.

Every number read from a tenant's file is range-checked where it is read: a step is an integer
a float holds exactly (0 to 2**53) or unknown, sizes and offsets fit a file (below 2**63), a
timestamp fits int64 nanoseconds. And, should one slip through, the renderer drops the one
series no encoder can write (logged once) and serves the rest: a ``global_step`` of 10**400 in a
Lightning ``last.ckpt`` once made ``float()`` overflow and failed the whole ``checkpoints``
collector, for every job, on every scrape.
"""

from __future__ import annotations

import json
import logging
import pickle
import struct
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from checkpoint_exporter.config import Config, Policy
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.exposition.collectors import enabled_collectors
from checkpoint_exporter.exposition.collectors.base import SnapshotCollector
from checkpoint_exporter.exposition.renderer import Renderer
from checkpoint_exporter.model import DURABLE, Snapshot, WatchedPath
from checkpoint_exporter.sources import ckpt_step, dcp_metadata, untrusted
from checkpoint_exporter.sources.layouts import ALL_CONTENT_FILES
from checkpoint_exporter.sources.layouts.base import DCP, SAFETENSORS, Check, trailing_step
from checkpoint_exporter.sources.layouts.megatron import tracked_iteration
from checkpoint_exporter.sources.listing import OpsBudget, TreeReader
from checkpoint_exporter.sources.validate import BAD_METADATA, Limits, validate
from tests.conftest import parse_samples, sample, wait_for, write_config
from tests.faults.test_names_beneath import metadata_naming
from tests.helpers.synthetic import generations, synthetic_job
from tests.helpers.trees import build, dcp_generation, scan
from tests.sources.test_layout_lightning import torch_like_zip

HUGE = 10**400  # what the tenant wrote: float(HUGE) raises OverflowError
EXACT = 2**53  # the largest step a float sample holds together with every step below it
BEYOND = EXACT + 1


# --- where each number is read ------------------------------------------------------------------


def test_a_step_is_an_integer_a_float_holds_exactly_or_unknown() -> None:
    assert [untrusted.step(n) for n in (0, 7, EXACT)] == [0, 7, EXACT]
    assert [untrusted.step(n) for n in (BEYOND, HUGE, -1, True, 7.0, "7", None)] == [None] * 7
    assert untrusted.step_digits("0000010") == 10  # Megatron's iter_0000010
    assert untrusted.step_digits("0" * 300 + str(EXACT)) == EXACT
    for text in (str(BEYOND), "9" * 200, "", "1_000", "\u0663", "+5", "-5"):
        assert untrusted.step_digits(text) is None, text


def test_the_global_step_inside_a_ckpt_is_range_checked() -> None:
    for step, expected in ((EXACT, EXACT), (BEYOND, None), (HUGE, None)):
        data = pickle.dumps({"state_dict": {}, "global_step": step}, protocol=2)
        assert ckpt_step.pickle_step(data) == expected, step


# The step in a generation's name: no file name holds 10**400, but 200 digits pass 2**53 as
# surely, and the rule is the same wherever a step is read.
STEPS = {str(EXACT): EXACT, str(BEYOND): None, "9" * 200: None}


def _named(digits: str) -> list[tuple[str, dict[str, object], str]]:
    """(layout, files, generation id) of one generation per layout whose name holds ``digits``."""
    d = digits
    dcp = {".metadata": 8, "__0_0.distcp": 8}
    return [
        ("dcp", {f"step-{d}/{name}": size for name, size in dcp.items()}, f"step-{d}"),
        ("deepspeed", {f"global_step{d}/mp_rank_00_model_states.pt": 8}, f"global_step{d}"),
        ("accelerate", {f"step_{d}/random_states_0.pkl": 8}, f"step_{d}"),
        ("hf", {f"checkpoint-{d}/trainer_state.json": b"{}"}, f"checkpoint-{d}"),
        ("hf", {f"tmp-checkpoint-{d}/optimizer.pt": 8}, f"tmp-checkpoint-{d}"),
        ("lightning", {f"epoch=0-step={d}.ckpt": 8}, f"epoch=0-step={d}.ckpt"),
        ("megatron", {f"iter_{d}/{name}": size for name, size in dcp.items()}, f"iter_{d}"),
        ("nemo", {f"m-step={d}/weights/{n}": size for n, size in dcp.items()}, f"m-step={d}"),
        ("orbax", {f"{d}/commit_success.txt": b"", f"{d}/default/x": 8}, d),
        ("orbax", {f"{d}.orbax-checkpoint-tmp/default/x": 8}, f"{d}.orbax-checkpoint-tmp"),
        ("torchtitan", {f"checkpoint/step-{d}/{n}": s for n, s in dcp.items()},
         f"checkpoint/step-{d}"),
        ("torchsave", {f"ckpt_step_{d}.pt": 8}, f"ckpt_step_{d}.pt"),
        ("torchsave", {f"ckpt_step_{d}.pt.tmp": 8}, f"ckpt_step_{d}.pt"),
    ]  # fmt: skip


@pytest.mark.parametrize("digits", STEPS, ids=["2**53", "2**53+1", "200 digits"])
def test_a_step_in_a_generations_name_is_range_checked(tmp_path: Path, digits: str) -> None:
    assert trailing_step(f"step-{digits}") == STEPS[digits]
    for index, (layout, files, generation) in enumerate(_named(digits)):
        root = tmp_path / f"{index}-{layout}"
        build(root, files)
        _, found = scan(root, layout)
        assert found[generation].step == STEPS[digits], (layout, generation)


def test_megatrons_tracker_is_range_checked(tmp_path: Path) -> None:
    for text, expected in ((str(EXACT), EXACT), (str(BEYOND), None), ("release", "release")):
        (tmp_path / "latest_checkpointed_iteration.txt").write_text(text)
        tree, _ = TreeReader(tmp_path, OpsBudget(), ALL_CONTENT_FILES).read()
        assert tracked_iteration(tree) == expected, text


def test_orbax_timestamps_fit_int64_nanoseconds(tmp_path: Path) -> None:
    """Orbax writes time.time_ns(): a number past int64 (or below 0) is no timestamp, and the
    generation's times come from its files instead."""
    for name, value in (("1", 1e300), ("2", -(10**18)), ("3", HUGE)):
        metadata = {"init_timestamp_nsecs": value, "commit_timestamp_nsecs": value}
        build(tmp_path, {f"{name}/_CHECKPOINT_METADATA": json.dumps(metadata), f"{name}/x": 8})
    _, found = scan(tmp_path, "orbax")
    now = time.time()
    for item in found.values():
        assert 0 < item.start_time <= now + 60 and 0 < (item.commit_time or 0) <= now + 60, item


def test_safetensors_offsets_must_fit_a_file(tmp_path: Path) -> None:
    for end in (2**63, HUGE):
        header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, end]}})
        data = struct.pack("<Q", len(header)) + header.encode() + b"\0" * 4
        (tmp_path / "model.safetensors").write_bytes(data)
        verdict = validate(str(tmp_path), [Check(SAFETENSORS, "model.safetensors")])
        assert (verdict.valid, verdict.reason) == (False, BAD_METADATA), verdict
        assert len(verdict.detail) < 200, verdict  # no 400-digit number in the log


@pytest.mark.torch
def test_dcp_offsets_and_lengths_must_fit_a_file(tmp_path: Path) -> None:
    """A shard length of 2**20000: judged bad_metadata once, in the daemon's worker as here
    (it made the validator raise, and the worker's JSON reply fail, tried again forever)."""
    generation = tmp_path / "step-1"
    dcp_generation(generation)
    (generation / ".metadata").write_bytes(metadata_naming(("__0_0.distcp", 2**20000)))
    listing, _ = TreeReader(generation, OpsBudget()).read()
    check = [Check(DCP, ".")]
    parser = dcp_metadata.IsolatedParser()
    try:
        for limits in (Limits(), Limits(metadata_parser=parser)):
            verdict = validate(str(generation), check, limits, listing)
            assert (verdict.valid, verdict.reason) == (False, BAD_METADATA), verdict
            assert "out of range" in verdict.detail and len(verdict.detail) < 200, verdict
    finally:
        parser.close()


# --- the renderer's second line ---------------------------------------------------------------


def two_jobs(hostile_step: int) -> Tracker:
    """A healthy job, and one whose generations claim steps from ``hostile_step`` on (10**400:
    as if a reader had let it through)."""
    tracker = Tracker(Config())
    now = time.time()
    tracker.add(synthetic_job("healthy", 3, now))
    hostile = JobTracker("hostile", (WatchedPath(DURABLE, "/ckpt/hostile"),), Policy())
    hostile.observe(DURABLE, generations(3, now, first_step=hostile_step), now - 5)
    hostile.tick(now)
    tracker.add(hostile)
    tracker.publish()
    return tracker


def series_of(text: str, job: str) -> set[str]:
    return {key.partition("{")[0] for key in parse_samples(text) if f'training_job="{job}"' in key}


@pytest.mark.parametrize(
    "encoder", [generate_latest, openmetrics_latest], ids=["text", "openmetrics"]
)
def test_one_unwritable_sample_drops_its_series_alone(
    encoder, caplog: pytest.LogCaptureFixture
) -> None:
    in_range = two_jobs(hostile_step=100).snapshot
    reference = Renderer(lambda: in_range, enabled_collectors({})).render(encoder).decode()
    snapshot = two_jobs(hostile_step=HUGE).snapshot
    renderer = Renderer(lambda: snapshot, enabled_collectors({}))
    other = openmetrics_latest if encoder is generate_latest else generate_latest
    with caplog.at_level(logging.WARNING):
        text = renderer.render(encoder).decode()
        renderer.render(other)  # every job rendered afresh for another format
        families = renderer.collect()  # and every collector asked again
    assert sample(text, "checkpoint_exporter_scrape_collector_success", collector="checkpoints")
    assert series_of(text, "healthy") == series_of(reference, "healthy")
    assert series_of(reference, "hostile") - series_of(text, "hostile") == {
        "checkpoint_last_committed_step"
    }
    assert sample(text, "checkpoint_last_committed_size_bytes", training_job="hostile") == 10**9
    [step_family] = [f for f in families if f.name == "checkpoint_last_committed_step"]
    assert [s.labels["training_job"] for s in step_family.samples] == ["healthy"]
    dropped = [r.getMessage() for r in caplog.records if "series dropped" in r.getMessage()]
    assert len(dropped) == 1, dropped  # once, however often it is met
    assert "checkpoint_last_committed_step" in dropped[0] and "hostile" in dropped[0]
    assert "1329 bits" in dropped[0] and len(dropped[0]) < 400  # described, not printed


class _Histograms(SnapshotCollector):
    """Two histogram series, one with a sum no float holds; the same family every time."""

    name = "histograms"

    def __init__(self) -> None:
        self.family = HistogramMetricFamily("h", "test", labels=["training_job"])
        self.family.add_metric(["good"], [("1", 1), ("+Inf", 2)], 3.0)
        self.family.add_metric(["bad"], [("1", 1), ("+Inf", 2)], HUGE)

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        return [self.family]


def test_a_histogram_series_is_dropped_whole() -> None:
    collector = _Histograms()
    snapshot = two_jobs(hostile_step=100).snapshot
    text = Renderer(lambda: snapshot, [collector]).render(generate_latest).decode()
    kept = [key for key in parse_samples(text) if key.startswith("h_")]
    assert kept and all('training_job="good"' in key for key in kept), kept
    assert {key.partition("{")[0] for key in kept} == {"h_bucket", "h_count", "h_sum"}
    assert len(collector.family.samples) == 8  # the collector's own family left as it was


# --- end to end ---------------------------------------------------------------------------------


CHECKPOINT_SERIES = (
    "checkpoint_last_committed_timestamp_seconds", "checkpoint_last_committed_step",
    "checkpoint_last_committed_size_bytes", "checkpoint_last_committed_files",
    "checkpoint_last_committed_valid", "checkpoint_saves_in_progress",
    "checkpoint_saves_committed_total", "checkpoint_saves_aborted_total",
    "checkpoint_retained_generations", "checkpoint_retained_bytes",
    "checkpoint_retained_valid_generations",
)  # fmt: skip


@pytest.mark.torch
def test_a_step_of_10_400_beside_a_healthy_job_end_to_end(tmp_path: Path, exporter) -> None:
    hostile, healthy = tmp_path / "hostile", tmp_path / "healthy"
    hostile.mkdir()
    (hostile / "last.ckpt").write_bytes(torch_like_zip({"epoch": 0, "global_step": HUGE}))
    dcp_generation(healthy / "step-5")
    config = write_config(
        tmp_path,
        "defaults: {watch: poll, poll_interval: 1s, settle: 1s}\n"
        f"jobs:\n  - {{name: hostile, path: {hostile}, layout: lightning}}\n"
        f"  - {{name: healthy, path: {healthy}, layout: dcp}}\n",
    )
    served = exporter("--config.file", str(config))

    def judged() -> str | None:
        text = served.metrics()
        valid = [sample(text, "checkpoint_last_committed_valid", training_job=job)
                 for job in ("hostile", "healthy")]  # fmt: skip
        return text if None not in valid else None

    text = wait_for(judged, timeout=60)
    assert sample(text, "checkpoint_exporter_scrape_collector_success", collector="checkpoints")
    assert set(CHECKPOINT_SERIES) <= series_of(text, "healthy")
    assert sample(text, "checkpoint_last_committed_step", training_job="healthy") == 5
    # The hostile job: judged (its zip is whole), its step unknown, every other series there.
    assert sample(text, "checkpoint_last_committed_valid", training_job="hostile") == 1
    assert set(CHECKPOINT_SERIES) - series_of(text, "hostile") == {"checkpoint_last_committed_step"}
