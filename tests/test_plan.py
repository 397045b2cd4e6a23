"""The sizing worksheet against the seed article's worked example, bad inputs and properties."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from checkpoint_exporter.config import parse_config
from checkpoint_exporter.plan.worksheet import (
    INPUT_FIELDS,
    LIMITS,
    OUTPUT_KEYS,
    WORKED_EXAMPLE,
    PlanInputError,
    PlanInputs,
    PlanResult,
    compute,
    daly_interval,
    format_table,
    objectives_yaml,
    parse_inputs,
    validate,
    young_interval,
)
from tests.conftest import run_cli, write_config

EXAMPLE = parse_inputs(WORKED_EXAMPLE)


def test_worked_example_table_and_sections_3_to_5() -> None:
    """Every number the article prints, at the precision it prints it."""
    result = compute(EXAMPLE)
    assert round(result.checkpoint_gb) == 1078
    assert round(result.per_server_gb, 2) == 134.75
    assert round(result.payload_per_job_gbps, 2) == 17.97
    assert round(result.payload_per_server_gbps, 2) == 2.25
    assert round(result.burst_gbps, 2) == 71.87
    assert round(result.average_gbps, 2) == 4.79
    assert round(result.service_gbps, 2) == 102.67
    assert result.link_units == 3
    assert round(result.degraded_capacity_gbps) == 100
    assert round(result.retained_usable_tb, 3) == 12.936
    assert round(result.peak_footprint_tb, 3) == 17.248
    assert round(result.provisioned_usable_tb, 2) == 21.56
    assert round(result.staging_per_server_gb, 1) == 269.5
    assert result.effective_transfer_seconds == 60


def test_worked_example_with_ten_seconds_of_overhead() -> None:
    result = compute(replace(EXAMPLE, overhead_seconds=10))
    assert result.effective_transfer_seconds == 50
    assert round(result.burst_gbps, 2) == 86.24
    assert round(result.service_gbps, 2) == 123.20
    # The window shrinks for every rate, not only the burst.
    assert round(result.payload_per_job_gbps, 2) == round(1078 / 50, 2)
    assert round(result.payload_per_server_gbps, 3) == round(134.75 / 50, 3)


def test_degraded_path_warning_matches_the_article() -> None:
    (warning,) = compute(EXAMPLE).warnings
    assert "100.00 GB/s remains" in warning and "still meets the 71.87 GB/s burst" in warning


def test_one_staged_image_by_default() -> None:
    inputs = parse_inputs(
        {k: v for k, v in WORKED_EXAMPLE.items() if k != "staged_generations_in_memory"}
    )
    assert round(compute(inputs).staging_per_server_gb, 2) == 134.75


def test_cli_json_reproduces_the_example() -> None:
    result = run_cli("plan", "--example", "--format", "json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert list(out)[: len(OUTPUT_KEYS)] == list(OUTPUT_KEYS)
    assert round(out["service_gbps"], 2) == 102.67 and out["link_units"] == 3
    assert out["young_interval_seconds"] is None and out["inference_load_seconds"] is None


def test_cli_table_shows_the_printed_numbers() -> None:
    result = run_cli("plan", "--example", "--overhead-seconds", "10")
    assert result.returncode == 0, result.stderr
    for printed in (
        "1,078.00 GB",
        "134.75 GB",
        "21.56 GB/s",
        "86.24 GB/s",
        "123.20 GB/s",
        "12.936 TB",
        "17.248 TB",
        "21.560 TB",
        "269.50 GB",
    ):
        assert printed in result.stdout, printed


def test_cli_yaml_file_with_flag_override(tmp_path: Path) -> None:
    plan = write_config(
        tmp_path,
        "parameters: 70B\njobs: 4\nservers_per_job: 8\ntransfer_seconds: 1m\n"
        "interval_seconds: 15m\nmtbf_seconds: 3h\n",
        "plan.yaml",
    )
    result = run_cli("plan", "--config", str(plan), "--jobs", "2", "--format", "yaml")
    assert result.returncode == 0, result.stderr
    out = yaml.safe_load(result.stdout)
    assert out["inputs"]["jobs"] == 2 and out["inputs"]["transfer_seconds"] == 60
    assert round(out["burst_gbps"], 2) == round(2 * 1078 / 60, 2)
    assert out["young_interval_seconds"] == pytest.approx((2 * 60 * 10800) ** 0.5)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--transfer-seconds", "0"], "transfer_seconds"),
        (["--transfer-seconds", "-5"], "transfer_seconds"),
        (["--overhead-seconds", "60"], "overhead_seconds"),
        (["--overhead-seconds", "75"], "overhead_seconds"),
        (["--utilization-ceiling", "0"], "utilization_ceiling"),
        (["--utilization-ceiling", "1.2"], "utilization_ceiling"),
        (["--parameters", "-1"], "parameters"),
        (["--bytes-per-parameter", "-2"], "bytes_per_parameter"),
        (["--jobs", "0"], "jobs"),
        (["--servers-per-job", "0"], "servers_per_job"),
        (["--jobs", "2.5"], "jobs"),
        (["--free-space-reserve", "1"], "free_space_reserve"),
        (["--mtbf-seconds", "0"], "mtbf_seconds"),
        (["--link-gbps", "nan"], "link_gbps"),
        (["--interval-seconds", "soon"], "interval_seconds"),
    ],
)
def test_invalid_inputs_exit_2_naming_the_input(flags: list[str], named: str) -> None:
    result = run_cli("plan", "--example", *flags)
    assert result.returncode == 2
    assert f"plan: {named} (--{named.replace('_', '-')})" in result.stderr
    assert result.stdout == ""


# Values no cluster has, for every input: too large for all of them, and too small for those a
# rate or a time is divided by. They made `plan` print inf or fail in math.ceil with a traceback.
ABSURD = [
    *((name, "1e308") for name in INPUT_FIELDS),
    *((name, 10**400) for name in INPUT_FIELDS),  # a YAML integer float() cannot hold
    *(
        (name, "1e-320")
        for name in (
            "parameters",
            "bytes_per_parameter",
            "transfer_seconds",
            "interval_seconds",
            "utilization_ceiling",
            "link_gbps",
            "mtbf_seconds",
            "save_seconds",
            "inference_bytes_per_parameter",
            "node_read_gbps",
        )
    ),
]


@pytest.mark.parametrize(("name", "value"), ABSURD, ids=lambda v: str(v)[:8])
def test_an_absurd_value_is_refused_naming_its_input(name: str, value: object) -> None:
    with pytest.raises(PlanInputError) as caught:
        parse_inputs({**WORKED_EXAMPLE, "mtbf_seconds": 3600, name: value})
    assert [named for named, _ in caught.value.problems] == [name]


@pytest.mark.parametrize("flags", [["--parameters", "1e308"], ["--link-gbps", "1e-320"]])
def test_cli_refuses_absurd_values_without_a_traceback(flags: list[str]) -> None:
    result = run_cli("plan", "--example", *flags)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"plan: {flags[0][2:].replace('-', '_')} ({flags[0]}): ")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_missing_and_unknown_inputs_are_all_reported(tmp_path: Path) -> None:
    plan = write_config(tmp_path, "parametres: 70e9\njobs: 0\n", "plan.yaml")
    result = run_cli("plan", "--config", str(plan))
    assert result.returncode == 2
    assert "did you mean 'parameters'?" in result.stderr
    for named in ("jobs", "parameters", "transfer_seconds", "interval_seconds"):
        assert f"plan: {named} " in result.stderr


def test_emit_objectives_is_a_valid_exporter_config(tmp_path: Path) -> None:
    result = run_cli("plan", "--example", "--emit-objectives", "--mtbf-seconds", "3h")
    assert result.returncode == 0, result.stderr
    assert "Daly's optimum" in result.stdout
    config = parse_config(result.stdout, "objectives", tmp_path)
    assert (config.defaults.interval, config.defaults.deadline) == (900, 60)
    assert config.defaults.retained_generations == 3


def test_daly_reproduces_his_validation_points() -> None:
    """Daly (2006), dump time 5 min: MTBF 24 h -> ~117 min, 6 h -> ~57 min, 15 min -> ~9.1 min."""
    for mtbf_hours, daly_minutes, young_minutes in ((24, 117, 120), (6, 57, 60), (0.25, 9.1, 12.2)):
        mtbf = mtbf_hours * 3600
        assert daly_interval(300, mtbf) / 60 == pytest.approx(daly_minutes, abs=0.5)
        assert young_interval(300, mtbf) / 60 == pytest.approx(young_minutes, abs=0.1)
    assert daly_interval(1000, 400) == 400  # a save longer than 2 x MTBF: checkpoint every MTBF


def test_waste_is_lowest_near_the_optimum() -> None:
    inputs = replace(EXAMPLE, mtbf_seconds=3 * 3600, save_seconds=20, restart_seconds=600)
    result = compute(inputs)
    assert result.optimal_waste_fraction < result.waste_fraction
    expected = 20 / 900 + (450 + 600) / 10800
    assert result.waste_fraction == pytest.approx(expected)
    far = compute(replace(inputs, interval_seconds=6 * 3600))
    assert any("Daly's optimum" in warning for warning in far.warnings)


def test_inference_load_time() -> None:
    result = compute(replace(EXAMPLE, node_read_gbps=5))
    assert result.inference_load_seconds == pytest.approx(140 / 5)  # 70B x 2 B = 140 GB


# --- properties ----------------------------------------------------------------------------------

positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)
inputs_strategy = st.builds(
    PlanInputs,
    parameters=st.floats(min_value=1e6, max_value=1e13),
    bytes_per_parameter=st.floats(min_value=0.5, max_value=32),
    extra_fraction=st.floats(min_value=0, max_value=1),
    jobs=st.integers(min_value=1, max_value=512),
    servers_per_job=st.integers(min_value=1, max_value=4096),
    transfer_seconds=st.floats(min_value=1, max_value=3600),
    interval_seconds=st.floats(min_value=1, max_value=86400),
    utilization_ceiling=st.floats(min_value=0.01, max_value=1),
    retained_generations=st.integers(min_value=1, max_value=50),
    overhead_seconds=st.just(0.0),
    link_gbps=st.floats(min_value=1, max_value=3200),
    mtbf_seconds=st.floats(min_value=60, max_value=1e7),
)


@settings(max_examples=300, deadline=None)
@given(inputs_strategy)
def test_service_covers_the_burst_and_links_cover_the_service(inputs: PlanInputs) -> None:
    result = compute(inputs)
    assert result.service_gbps >= result.burst_gbps
    if inputs.interval_seconds >= inputs.transfer_seconds:
        assert result.burst_gbps >= result.average_gbps
    capacity = result.link_units * inputs.link_gbps / 8
    assert capacity >= result.service_gbps * (1 - 1e-9)
    assert result.degraded_capacity_gbps < result.service_gbps * (1 + 1e-9)  # no spare unit bought
    assert result.peak_footprint_tb > result.retained_usable_tb
    assert result.provisioned_usable_tb >= result.peak_footprint_tb
    assert result.daly_interval_seconds <= result.young_interval_seconds
    assert result.optimal_waste_fraction <= result.waste_fraction + 1e-12


@settings(max_examples=200, deadline=None)
@given(
    inputs_strategy, st.integers(min_value=1, max_value=64), st.floats(min_value=1.01, max_value=10)
)
def test_requirements_grow_with_jobs_and_size(
    inputs: PlanInputs, more_jobs: int, factor: float
) -> None:
    base = compute(inputs)
    bigger = compute(replace(inputs, jobs=inputs.jobs + more_jobs))
    larger = compute(replace(inputs, parameters=inputs.parameters * factor))
    for grown in (bigger, larger):
        assert grown.burst_gbps > base.burst_gbps
        assert grown.service_gbps > base.service_gbps
        assert grown.link_units >= base.link_units
        assert grown.peak_footprint_tb > base.peak_footprint_tb
    assert larger.per_server_gb > base.per_server_gb


@settings(max_examples=200, deadline=None)
@given(inputs_strategy, st.floats(min_value=0.01, max_value=0.99))
def test_overhead_only_raises_the_rates(inputs: PlanInputs, share: float) -> None:
    base = compute(inputs)
    squeezed = compute(replace(inputs, overhead_seconds=inputs.transfer_seconds * share))
    assert squeezed.burst_gbps > base.burst_gbps
    assert squeezed.payload_per_server_gbps > base.payload_per_server_gbps
    assert squeezed.average_gbps == base.average_gbps


def test_compute_refuses_invalid_inputs_directly() -> None:
    with pytest.raises(PlanInputError) as caught:
        compute(replace(EXAMPLE, transfer_seconds=10, overhead_seconds=10))
    assert caught.value.problems[0][0] == "overhead_seconds"


# Every input given, so that every output is computed (no overhead: any deadline leaves a window).
FULL_EXAMPLE = {
    **WORKED_EXAMPLE,
    "overhead_seconds": 0,
    "mtbf_seconds": 3 * 3600,
    "save_seconds": 20,
    "restart_seconds": 600,
    "node_read_gbps": 5,
}


def assert_finite_and_printable(result: PlanResult) -> None:
    """No output is inf or nan, and each format prints without error."""
    for key in OUTPUT_KEYS:
        value = getattr(result, key)
        assert value is None or math.isfinite(value), (key, value)
    json.dumps(result.to_dict(), allow_nan=False)
    format_table(result)
    objectives_yaml(result)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(INPUT_FIELDS)),
    st.one_of(st.floats(), st.integers(), st.floats().map(str), st.integers().map(str)),
)
def test_any_value_of_one_input_is_refused_by_name_or_gives_finite_outputs(
    name: str, value: object
) -> None:
    try:
        inputs = parse_inputs({**FULL_EXAMPLE, name: value})
    except PlanInputError as error:
        assert [named for named, _ in error.problems] == [name]
        return
    assert_finite_and_printable(compute(inputs))


def within_limits(name: str) -> st.SearchStrategy[float]:
    least, most = LIMITS[name]
    if INPUT_FIELDS[name].metadata["kind"] == "count":
        return st.integers(int(least), int(most))
    return st.floats(least, most)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries({name: within_limits(name) for name in LIMITS}),
    st.floats(0, 1, exclude_max=True),
    st.floats(0, 1, exclude_max=True),
)
def test_inputs_anywhere_within_the_limits_give_finite_outputs(
    values: dict[str, float], overhead_share: float, free_space_reserve: float
) -> None:
    """The limits are what keeps the arithmetic finite: at their corners at once too."""
    values["overhead_seconds"] = values["transfer_seconds"] * overhead_share
    values["free_space_reserve"] = free_space_reserve
    assume(not validate(values))  # the overhead may round up to the whole deadline
    assert_finite_and_printable(compute(PlanInputs(**values)))
